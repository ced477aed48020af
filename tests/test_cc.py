"""The shared kernel loader (ram_live/kernels/cc.py): each family and each part of ram.c is compiled only when a call
first needs it, once per cache and flags, once per process; RAM_LIVE_NATIVE=0 turns every family off at any
time; a part that does not build is named with the compiler's message. A wrapper around the real compiler
records what it was asked to build."""

from __future__ import annotations

import ctypes
import os
import shutil
import stat
import threading
from pathlib import Path

import pytest
import torch

import ram_live.methods.ram.native_weighted as wnative
import ram_live.kernels.probe as pnative
import ram_live.methods.ram.native as native
import ram_live.store.native_select as select_native
from ram_live.kernels import cc
from ram_live.store import native_crc as crc_native

REAL_CC = shutil.which(os.environ.get("CC", "cc"))
needs_cc = pytest.mark.skipif(REAL_CC is None or not cc.native_enabled(), reason="no C compiler")


@pytest.fixture
def compiler(tmp_path, monkeypatch):
    """A fresh cache and a compiler that logs each run's arguments (one line per run) before running ``cc``."""
    log = tmp_path / "cc.log"
    wrapper = tmp_path / "logging-cc"
    wrapper.write_text(f'#!/bin/sh\necho "$*" >> {log}\nexec {REAL_CC} "$@"\n')
    wrapper.chmod(wrapper.stat().st_mode | stat.S_IXUSR)
    monkeypatch.setenv("CC", str(wrapper))
    monkeypatch.setenv("RAM_LIVE_CACHE", str(tmp_path / "cache"))

    def runs() -> list[str]:
        return log.read_text().splitlines() if log.exists() else []

    return runs


def _wait_for_prefetches() -> None:
    for thread in threading.enumerate():
        if thread.name.startswith("ram_live_cc_"):
            thread.join()


def _parts_built(runs: list[str]) -> list[int]:
    return sorted(int(arg.split("=")[1]) for run in runs for arg in run.split() if arg.startswith("-DRAM_PART="))


def _inputs(dtype: torch.dtype, k: int = 3, n: int = 1000):
    g = torch.Generator().manual_seed(k)
    base = torch.randn(n, generator=g).to(dtype)
    agents = [(base.float() + (torch.rand(n, generator=g) < 0.4) * 0.05).to(dtype) for _ in range(k)]
    return base, agents


@needs_cc
def test_a_call_builds_only_the_part_it_runs(compiler):
    kernels = native.build()
    assert kernels is not None and _parts_built(compiler()) == [0]  # the toolchain check alone
    base, agents = _inputs(torch.bfloat16)
    active, unique = torch.zeros(3, dtype=torch.int64), torch.zeros(3, dtype=torch.int64)
    kernels.counts(base, agents, 1e-5, 0, base.numel(), active, unique)
    assert _parts_built(compiler()) == [0, native.PARTS["counts"][1]]
    tau = torch.stack([a.float() - base.float() for a in agents]).abs() > 1e-5
    assert active.tolist() == tau.sum(1).tolist()
    assert unique.tolist() == (tau & (tau.sum(0) == 1)).sum(1).tolist()
    out, planes = torch.empty_like(base), torch.empty(native.planes_numel(base.numel(), 3), dtype=torch.int32)
    kernels.merge_unscaled(out, base, agents, 1e-5, 0, base.numel(), planes, active, unique)
    _wait_for_prefetches()  # the rescale that RAM+ runs next is built meanwhile
    assert _parts_built(compiler()) == sorted(
        [0, native.PARTS["counts"][1], native.PARTS["merge_unscaled"][1], native.PARTS["rescale"][1]]
    )
    before = len(compiler())
    kernels.counts(base, agents, 1e-5, 0, base.numel(), active, unique)
    native.build().counts(base, agents, 1e-5, 0, base.numel(), active, unique)
    assert len(compiler()) == before and native.build() is kernels  # once per process


@needs_cc
def test_curvature_aware_ram_builds_the_part_of_its_dtypes_alone(compiler):
    kernels = wnative.build()
    assert kernels is not None and _parts_built(compiler()) == [0]
    base, agents = _inputs(torch.bfloat16)
    importances = [torch.ones(base.numel()) for _ in agents]  # weights 1: the plain RAM mean
    out = torch.empty_like(base)
    assert kernels.merge_weighted(out, base, agents, importances, None, 1e-5, 0, base.numel()) == 0
    assert _parts_built(compiler()) == [0, wnative.PARTS[1, 0]]
    want = torch.empty_like(base)
    native.build(kernels.flags).merge(want, base, agents, None, 1e-5, 0, base.numel())
    assert torch.equal(out.view(torch.int16), want.view(torch.int16))


@needs_cc
def test_a_new_process_loads_from_the_cache_and_other_flags_build_anew(compiler, monkeypatch):
    flags = (*cc.flags("scalar"), "-O1")
    first = cc.load("ram", flags, part=native.PARTS["rescale"][0])
    assert first is not None and len(compiler()) == 1
    monkeypatch.setattr(cc, "_HANDLES", {})  # as a new process would
    again = cc.load("ram", flags, part=native.PARTS["rescale"][0])
    assert again is not None and again is not first and len(compiler()) == 1  # the cached file, not built again
    assert cc.load("ram", (*flags[:-1], "-O2"), part=native.PARTS["rescale"][0]) is not None
    assert len(compiler()) == 2
    cached = sorted(p.name.split("-")[0] for p in Path(os.environ["RAM_LIVE_CACHE"]).glob("*.so"))
    assert cached == [f"ram.{native.PARTS['rescale'][0]}"] * 2


@needs_cc
def test_the_parts_give_the_bits_of_the_whole_source_in_one_library(compiler):
    """ram.c compiled once without RAM_PART holds every part; each part's library computes the same."""
    flags = cc.flags("scalar")
    whole = cc.load_library(cc.source("ram.c"), "ram", flags)
    parts = native.build(flags)
    assert whole is not None and parts is not None and parts.simd_bits == 0
    for dtype, code in native.DTYPES.items():
        base, agents = _inputs(dtype)
        n, k = base.numel(), len(agents)
        ptrs = (ctypes.c_void_p * k)(*(a.data_ptr() for a in agents))
        lambdas = torch.tensor([1.5, 0.5, 2.0])
        fn = getattr(whole, f"ram_merge_{'bf16' if code else 'f32'}")
        fn.argtypes, fn.restype = native._SIGNATURES["merge"], ctypes.c_int64
        for lam in (None, lambdas):
            want, got = torch.empty_like(base), torch.empty_like(base)
            for sign in (False, True):
                fn(
                    code,
                    base.data_ptr(),
                    ptrs,
                    k,
                    None if lam is None else lam.data_ptr(),
                    1e-5,
                    want.data_ptr(),
                    0,
                    n,
                    int(sign),
                )
                parts.merge(got, base, agents, lam, 1e-5, 0, n, sign=sign)
                assert torch.equal(got.view(torch.uint8), want.view(torch.uint8)), (dtype, lam, sign)


@needs_cc
def test_the_environment_switch_turns_every_family_off_at_any_time(monkeypatch):
    loaders = {
        "ram": native.kernels,
        "importance": wnative.kernels,
        "probe": pnative.kernel,
        "select": select_native.kernels,
        "crc32": crc_native.native_crc32,
    }
    on = {name: loader() for name, loader in loaders.items()}
    assert on["ram"] is not None and on["importance"] is not None and on["probe"] is not None
    monkeypatch.setenv("RAM_LIVE_NATIVE", "0")
    assert {name: loader() for name, loader in loaders.items()} == dict.fromkeys(loaders)
    assert cc.load("ram") is None and native.build() is None
    monkeypatch.delenv("RAM_LIVE_NATIVE")
    assert all(loader() is on[name] for name, loader in loaders.items())  # the same objects again


@pytest.fixture
def broken_family(tmp_path, monkeypatch):
    """A family ``broken`` whose part 2 does not compile (parts 0 and 1 do)."""
    csrc = tmp_path / "csrc"
    csrc.mkdir()
    (csrc / "broken.c").write_text(
        "int part_zero(void) { return 7; }\n"
        "#if RAM_PART == 1\nint part_one(int x) { return x + 1; }\n#endif\n"
        "#if RAM_PART == 2\nint part_two(void) { return not C; }\n#endif\n"
    )
    monkeypatch.setattr(cc, "CSRC", csrc)
    monkeypatch.setitem(cc.FAMILIES, "broken", cc.Family("broken.c", "broken", ("-O0",), entry_part=0))
    return "broken"


@needs_cc
def test_a_part_that_does_not_build_is_named_with_the_compilers_message(compiler, broken_family):
    assert cc.load(broken_family).part_zero() == 7
    one = cc.function(broken_family, 1, "part_one", ("-O0",), [ctypes.c_int], ctypes.c_int)
    assert one(41) == 42
    with pytest.raises(cc.KernelBuildError, match=r"(?s)part 2 of the native kernels broken.c.*part_two.*error"):
        cc.function(broken_family, 2, "part_two", ("-O0",), [], ctypes.c_int)


@needs_cc
def test_kernels_already_chosen_build_their_parts_after_the_switch_goes_off(compiler, broken_family, monkeypatch):
    assert cc.load(broken_family) is not None
    monkeypatch.setenv("RAM_LIVE_NATIVE", "0")
    assert cc.load(broken_family) is None  # no new choice of the native path
    one = cc.function(broken_family, 1, "part_one", ("-O0",), [ctypes.c_int], ctypes.c_int)
    assert one(1) == 2 and _parts_built(compiler()) == [0, 1]


@needs_cc
def test_threads_asking_at_once_share_one_build(compiler, broken_family):
    got: list[object] = []
    threads = [threading.Thread(target=lambda: got.append(cc.load(broken_family, part=1))) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert len(got) == 4 and got[0] is not None and all(lib is got[0] for lib in got)
    assert _parts_built(compiler()) == [1]


def test_without_a_compiler_there_are_no_kernels(monkeypatch, tmp_path):
    monkeypatch.setenv("RAM_LIVE_CACHE", str(tmp_path))
    monkeypatch.setenv("CC", "no-such-compiler-ram-live")
    assert cc.load("ram") is None and native.build() is None and wnative.build() is None
    assert pnative.build() is None and select_native._load() is None
    assert not list(tmp_path.iterdir())


@needs_cc
@pytest.mark.parametrize("variant", ["ram", "ram_plus"])
@pytest.mark.parametrize("inplace", [False, True])
def test_a_part_that_does_not_build_falls_back_to_the_torch_path(tmp_path, monkeypatch, variant, inplace):
    """The toolchain check (part 0) builds but every bfloat16 part fails (a killed compiler, a full cache disk):
    the float32 tensors merge natively, the bfloat16 ones on the torch path, with the same bits as a merge with
    the native kernels off, and the merge raises nothing (in place: nothing half written)."""
    from torch import nn

    import ram_live

    wrapper = tmp_path / "failing-cc"
    wrapper.write_text(
        f'#!/bin/sh\ncase "$*" in *-DRAM_PART=[1357]\\ *|*-DRAM_PART=[1357]) exit 1;; esac\nexec {REAL_CC} "$@"\n'
    )
    wrapper.chmod(wrapper.stat().st_mode | stat.S_IXUSR)
    monkeypatch.setenv("CC", str(wrapper))
    monkeypatch.setenv("RAM_LIVE_CACHE", str(tmp_path / "cache"))
    failing = native.build()
    assert failing is not None and not failing.ready(torch.bfloat16, "merge") and failing.ready(torch.float32, "merge")

    def model(seed: int) -> nn.Module:
        torch.manual_seed(0)
        m = nn.Sequential(nn.Linear(64, 64), nn.Linear(64, 64).to(torch.bfloat16))
        g = torch.Generator().manual_seed(seed)
        with torch.no_grad():
            for p in m.parameters():
                if seed:
                    p += ((torch.rand(p.shape, generator=g) < 0.4) * 0.05).to(p.dtype)
        return m

    agents = {f"a{i}": model(i) for i in (1, 2, 3)}
    monkeypatch.setenv("RAM_LIVE_NATIVE", "0")
    want = ram_live.merge(agents, base=model(0), method=variant)
    monkeypatch.delenv("RAM_LIVE_NATIVE")
    monkeypatch.setattr(native, "_KERNELS", failing)
    target = model(0)
    got, info = ram_live.merge(agents, base=target, method=variant, inplace=inplace, return_info=True)
    assert info.extra["kernels"].get("native", 0) >= 1 and info.extra["kernels"].get("eager", 0) >= 1
    for (name, a), b in zip(want.state_dict().items(), got.state_dict().values()):
        assert torch.equal(
            a.view(torch.uint8) if a.dtype == torch.bfloat16 else a,
            b.view(torch.uint8) if b.dtype == torch.bfloat16 else b,
        ), name
