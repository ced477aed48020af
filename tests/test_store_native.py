"""The native capture kernels give exactly what the numpy path gives: same encoding, count, values, positions, at
every build level this host runs (AVX-512 where it has it, AVX2, the baseline): the portable loops are tested on any
x86-64 host, not only where they are the ones that run."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import ram_live.store.native_select as select_module
import ram_live.store.encoding as store_module
from ram_live.kernels import cc
from ram_live.settings import SIMD_LEVELS
from ram_live.store.encoding import _encode_native, _encode_numpy, Encoded

KERNELS = select_module._load()
pytestmark = pytest.mark.skipif(KERNELS is None, reason="no C compiler (or RAM_LIVE_NATIVE=0): no native kernels")


def _levels() -> list[str]:
    """The build levels this host runs (as tests/test_kernel_digests.py)."""
    host = cc.host_level()
    return [lv for lv in SIMD_LEVELS if lv == host or lv == "scalar" or (lv == "avx2" and host == "avx512")]


@pytest.fixture(params=_levels())
def kernels(request) -> select_module.Kernels:
    """The kernels built at one level; a level the host runs must build (no silent skip)."""
    built = select_module.build(cc.flags(request.param))
    assert built is not None, f"the {request.param} build failed where the host's own build works"
    vbmi2 = "avx512_vbmi2" in cc._cpu_flags().split()
    want = {"avx512": 512 if vbmi2 else 256, "avx2": 256}.get(request.param, 0)
    assert built.simd_bits == want
    return built


def _bits_of(t: torch.Tensor | None) -> np.ndarray | None:
    if t is None:
        return None
    return t.view({1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}[t.element_size()]).numpy()


def _same(a: Encoded, b: Encoded) -> None:
    assert (a.encoding, a.count) == (b.encoding, b.count)
    for x, y in ((a.values, b.values), (a.positions, b.positions)):
        assert (x is None) == (y is None)
        if x is not None:
            assert x.dtype == y.dtype
            np.testing.assert_array_equal(_bits_of(x), _bits_of(y))


def _pair(n: int, dtype: torch.dtype, changed: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(n)
    base = torch.randn(n, generator=g).to(dtype)
    cur = base.clone()
    ints = cur.view({2: torch.int16, 4: torch.int32}[cur.element_size()])
    ints[changed] ^= 1  # flip the lowest bit: a change of one ULP (or a NaN payload), always bits that differ
    return cur, base


def _check(kernels: select_module.Kernels, cur: torch.Tensor, base: torch.Tensor) -> Encoded:
    native = _encode_native(np, kernels, cur, base)
    _same(native, _encode_numpy(np, cur, base))
    return native


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
@pytest.mark.parametrize("n", [1, 7, 8, 15, 16, 17, 31, 32, 33, 255, 256, 257, 1000, 4099, 100_003])
@pytest.mark.parametrize("density", [0.0, 0.002, 0.03, 0.2, 0.5, 0.97, 1.0])
def test_native_matches_numpy(kernels, dtype, n, density):
    g = torch.Generator().manual_seed(n * 7 + int(density * 1000))
    changed = torch.rand(n, generator=g) < density
    cur, base = _pair(n, dtype, changed)
    enc = _check(kernels, cur, base)
    assert enc.count == int(changed.sum())


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("density", [0.001, 0.03, 0.5, 1.0])
def test_native_over_threads_and_range_edges(kernels, monkeypatch, dtype, density):
    """Ranges of a few thousand entries over 3 threads; changes at every range's first and last entries."""
    monkeypatch.setattr(store_module, "_NATIVE_MIN_SPLIT", 1000)
    monkeypatch.setattr(torch, "get_num_threads", lambda: 3)
    n = 10_007
    g = torch.Generator().manual_seed(11)
    changed = torch.rand(n, generator=g) < density
    for start, end in store_module._ranges(n, 3, select_module.ALIGN):
        changed[start] = changed[end - 1] = True
    assert len(store_module._ranges(n, 3, select_module.ALIGN)) == 3
    cur, base = _pair(n, dtype, changed)
    _check(kernels, cur, base)


@pytest.mark.parametrize("extra", [-1, 0, 1])
def test_native_indices_up_to_their_limit(kernels, monkeypatch, extra):
    """Around the count where int32 indices stop being smaller than the bitmask (the kernels stop writing them)."""
    monkeypatch.setattr(store_module, "_NATIVE_MIN_SPLIT", 1000)
    monkeypatch.setattr(torch, "get_num_threads", lambda: 2)
    n = 64_000
    limit = (n + 7) // 8 // 4
    changed = torch.zeros(n, dtype=torch.bool)
    changed[torch.randperm(n, generator=torch.Generator().manual_seed(2))[: limit + extra]] = True
    cur, base = _pair(n, torch.bfloat16, changed)
    enc = _check(kernels, cur, base)
    assert enc.encoding == ("indices" if extra <= 0 else "bitmask")


def test_native_every_change_in_one_range(kernels, monkeypatch):
    """All the indices in the last range (beyond its share of the limit, within the tensor's)."""
    monkeypatch.setattr(store_module, "_NATIVE_MIN_SPLIT", 1000)
    monkeypatch.setattr(torch, "get_num_threads", lambda: 4)
    n = 40_000
    changed = torch.zeros(n, dtype=torch.bool)
    changed[-1200:] = True
    cur, base = _pair(n, torch.float16, changed)
    assert _check(kernels, cur, base).encoding == "indices"


def test_encode_uses_native_and_round_trips(tmp_path):
    from ram_live.store import SnapshotStore

    g = torch.Generator().manual_seed(4)
    base = {
        "w": torch.randn(3000, 77, generator=g).bfloat16(),
        "f": torch.randn(5001, generator=g),
        "d": torch.randn(99, generator=g).double(),
    }  # 8-byte entries: the numpy path
    agent = {k: v.clone() for k, v in base.items()}
    for v in agent.values():
        v[torch.rand(v.shape, generator=g) < 0.1] += 1.0
    snap = SnapshotStore(tmp_path / "s", durable=False).writer("a", base).snapshot(agent, 1)
    for k, v in agent.items():
        assert torch.equal(snap.get(k).view(torch.uint8), v.view(torch.uint8)), k


def test_native_off_by_environment(monkeypatch):
    monkeypatch.setenv("RAM_LIVE_NATIVE", "0")
    assert select_module._load() is None


def test_native_without_compiler(monkeypatch, tmp_path):
    monkeypatch.setenv("RAM_LIVE_CACHE", str(tmp_path))
    monkeypatch.setenv("CC", "no-such-compiler-ram-live")
    assert select_module._load() is None


def test_encode_many_side_by_side_equals_one_by_one(monkeypatch):
    """Pairs spread over threads (largest first), a pair too big for one thread's share, other dtypes and paths."""
    from ram_live.store.encoding import encode, encode_many
    from ram_live.store.writer import activity_rule

    monkeypatch.setattr(torch, "get_num_threads", lambda: 3)
    monkeypatch.setattr(store_module, "_NATIVE_MIN_SPLIT", 1000)
    g = torch.Generator().manual_seed(8)
    pairs = []
    for n, dtype in [
        (30_000, torch.bfloat16),
        (5, torch.float16),
        (7_001, torch.float32),
        (999, torch.float64),
        (12_345, torch.bfloat16),
        (0, torch.bfloat16),
        (4_000, torch.uint8),
        (2_500, torch.float16),
    ]:
        base = torch.randn(n, generator=g).to(dtype)
        cur = base.clone()
        cur[torch.rand(n, generator=g) < 0.1] += 1
        pairs.append((cur, base))
    rule = activity_rule("changed", 0.0)
    for many, one in zip(encode_many(pairs, rule), [encode(c, b, rule) for c, b in pairs], strict=True):
        _same(many, one)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("density", [0.01, 0.5, 1.0])
def test_kernel_writes_values_at_any_alignment(kernels, dtype, density):
    """The values are streamed in whole 64-byte lines after a plainly written head: every start in a line."""
    n = 5_000
    g = torch.Generator().manual_seed(6)
    changed = torch.rand(n, generator=g) < density
    cur, base = _pair(n, dtype, changed)
    ints = torch.int16 if cur.element_size() == 2 else torch.int32
    cn, bn = cur.view(ints).numpy(), base.view(ints).numpy()
    want = cn[changed.numpy()]
    size = cn.itemsize
    for shift in range(64 // size + 1):
        bits = np.zeros((n + 7) // 8, dtype=np.uint8)
        room = np.zeros(n + 64, dtype=cn.dtype)
        vals = room[shift:]
        pos = np.zeros(n // 32 + 64, dtype=np.int32)
        count = kernels.select(
            cn.ctypes.data, bn.ctypes.data, n, bits.ctypes.data, vals.ctypes.data, size, pos.ctypes.data, 0, 0
        )
        assert count == want.size
        np.testing.assert_array_equal(vals[:count], want)
        assert not room[:shift].any() and not vals[count:].any()  # nothing written outside the values
        np.testing.assert_array_equal(bits, np.packbits(changed.numpy(), bitorder="little"))


def test_capture_takes_vector_builds_only(monkeypatch):
    """The capture runs the AVX-512 or AVX2 loops; the generic ones (slower than numpy there) only in these tests."""
    monkeypatch.setenv("RAM_LIVE_SIMD", "scalar")
    assert select_module.kernels() is None
    assert not store_module._native_path(torch.ones(8), torch.zeros(8), _changed_rule())
    if cc.host_level() in ("avx512", "avx2"):
        monkeypatch.setenv("RAM_LIVE_SIMD", "avx2")
        assert select_module.kernels().simd_bits == 256
        assert store_module._native_path(torch.ones(8), torch.zeros(8), _changed_rule())


def _changed_rule():
    from ram_live.store.writer import activity_rule

    return activity_rule("changed", 0.0)
