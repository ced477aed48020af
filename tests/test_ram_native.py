"""The native CPU RAM kernels give the eager torch path's bits and counts, and fall back where they do not apply."""

import math

import pytest
import torch

import ram_live._ram_native as native
from ram_live import engine, ram_merge
from ram_live.errors import NonFiniteError
from tests.conftest import assert_bit_identical, make_agents, snapshot

needs_kernels = pytest.mark.skipif(native.kernels() is None, reason="no C compiler: native kernels unavailable")

CASES = [dict(variant="ram"), dict(variant="ram_plus"), dict(variant="ram_plus_soft", r=0.3),
         dict(variant="ram_plus", rho_scope="tensor", alpha=0.2), dict(variant="ram_plus", activity="changed"),
         dict(variant="ram", eps=0.02)]


def _eager(monkeypatch, **kw):
    with monkeypatch.context() as m:
        m.setattr(native, "_KERNELS", None)
        return ram_merge(**kw)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("out_dtype", [None, torch.float32, torch.bfloat16])
@needs_kernels
def test_native_equals_eager_bits_and_counts(monkeypatch, base_sd, dtype, out_dtype):
    monkeypatch.setattr(engine, "NATIVE_CHUNK", 64)  # several ranges per tensor, shared by two threads
    calls = []
    merge = native.Kernels.merge
    monkeypatch.setattr(native.Kernels, "merge", lambda self, *a: calls.append(a[-2]) or merge(self, *a))
    base = {k: v.to(dtype) for k, v in base_sd.items()}
    base["layers.0.b"][:3] = -0.0
    agents = make_agents(base, [0.05, 0.5, 0.6], scale=0.05)
    agents[0]["layers.0.b"][0] = 0.0  # +0 against the base's -0
    for case in CASES:
        kw = dict(models=agents, base=base, return_info=True, dtype=out_dtype, workers=2, **case)
        fast, f_info = ram_merge(**kw)
        slow, s_info = _eager(monkeypatch, **kw)
        assert_bit_identical(fast, slow)
        assert 0 in calls and 64 in calls, "the native kernels did not run"
        calls.clear()
        assert f_info.lambdas == s_info.lambdas, case
        if s_info.statistics is not None:
            assert torch.equal(f_info.statistics.active, s_info.statistics.active), case
            assert torch.equal(f_info.statistics.unique, s_info.statistics.unique), case


@needs_kernels
def test_native_kernel_against_a_hand_computation():
    kernels = native.kernels()
    base = torch.tensor([1.0, 2.0, -0.0, 4.0, 5.0])
    agents = [torch.tensor([1.5, 2.0, -0.0, 4.0, 7.0]), torch.tensor([1.0, 3.0, -0.0, 4.000001, 6.0])]
    out = torch.empty(5)
    lambdas = torch.tensor([2.0, 3.0])
    assert kernels.merge(out, base, agents, lambdas, 1e-5, 0, 5) == 0
    # unique to 0: 1 + 2·0.5; unique to 1: 2 + 3·1; untouched (-0 kept); sub-eps; shared: 5 + (2 + 1)/2
    assert out.tolist() == [2.0, 5.0, 0.0, 4.0, 6.5] and math.copysign(1, out[2].item()) == -1
    active, unique = torch.zeros(2, dtype=torch.int64), torch.zeros(2, dtype=torch.int64)
    assert not kernels.counts(base, agents, 1e-5, 0, 5, active, unique)
    assert active.tolist() == [2, 2] and unique.tolist() == [1, 1]


def _reference(base, agents, lambdas, eps, out_dtype):
    """Eq. 7 in float32, agent by agent in the kernels' order: θ₀ − (c = 1 ? λ·Σ−τ : Σ−τ / max(c, 1))."""
    b = base.float()
    ns, cnt, lam = torch.zeros_like(b), torch.zeros_like(b), torch.zeros_like(b)
    active, unique = [], []
    for t, a in enumerate(agents):
        d = a.float() - b
        m = ~(d.abs() <= eps)
        active.append(m)
        ns = ns - torch.where(m, d, 0.0)
        cnt = cnt + m.float()
        lam = torch.where(m, float(lambdas[t]), lam) if lambdas is not None else lam
    mean = ns / torch.clamp(cnt, min=1.0)
    r = b - (torch.where(cnt == 1, ns * lam, mean) if lambdas is not None else mean)
    for m in active:
        unique.append(int((m & (cnt == 1)).sum()))
    return r.to(out_dtype), [int(m.sum()) for m in active], unique


@needs_kernels
@pytest.mark.parametrize("in_dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("out_dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("plus", [False, True])
def test_vector_and_portable_builds_give_the_reference_bits(in_dtype, out_dtype, plus):
    """The AVX-512 kernels (where the CPU has it) and the portable loops (built without AVX-512) against Eq. 7
    in torch, on ranges with odd starts and tails, -0, sub-eps, eps-boundary and shared entries."""
    builds = {"native": native.kernels(), "portable": native.build((*native.FLAGS, "-mno-avx512f"))}
    assert builds["portable"] is not None and builds["portable"].simd_bits == 0
    flags = open("/proc/cpuinfo").read()
    assert builds["native"].simd_bits == (512 if all(f" {f} " in flags for f in ("avx512f", "avx512bw", "avx512dq"))
                                          else 0)
    g = torch.Generator().manual_seed(7)
    n = 1237
    base = torch.randn(n, generator=g).to(in_dtype)
    base[:40:3] = -0.0
    agents = []
    for t, density in enumerate([0.05, 0.5, 0.6, 0.3, 0.9]):
        a = base.clone()
        m = torch.rand(n, generator=g) < density
        a[m] = (base[m].float() + torch.randn(int(m.sum()), generator=g) * 0.1).to(in_dtype)
        a[t * 7: t * 7 + 3] = base[t * 7: t * 7 + 3].float() + 1e-6  # sub-eps moves (f32) or no move (bf16)
        agents.append(a)
    agents[1][:40:6] = 0.0  # +0 against the base's -0: inactive
    lambdas = torch.tensor([1.7, 0.5, 2.0, 1.25, 3.0]) if plus else None
    want, active, unique = _reference(base, agents, lambdas, 1e-5, out_dtype)
    for name, kernels in builds.items():
        for start, end in [(0, n), (3, 999), (1000, 1031), (5, 6), (17, 49)]:
            out = torch.full((n,), 7.0, dtype=out_dtype)
            assert kernels.merge(out, base, agents, lambdas, 1e-5, start, end) == 0
            assert torch.equal(out[start:end].view(torch.int16 if out_dtype == torch.bfloat16 else torch.int32),
                               want[start:end].view(torch.int16 if out_dtype == torch.bfloat16 else torch.int32)), \
                (name, start, end)
            assert (out[:start] == 7).all() and (out[end:] == 7).all(), (name, "wrote outside its range")
        act, uni = torch.zeros(5, dtype=torch.int64), torch.zeros(5, dtype=torch.int64)
        assert not kernels.counts(base, agents, 1e-5, 0, 600, act, uni)
        assert not kernels.counts(base, agents, 1e-5, 600, n, act, uni)
        assert act.tolist() == active and uni.tolist() == unique, name
        for bad in (math.inf, -math.inf, math.nan):
            broken = agents[2].clone()
            broken[1100] = bad
            assert kernels.counts(base, [agents[0], broken], 1e-5, 1090, 1237, act, uni), (name, bad)
            assert kernels.merge(torch.empty(n, dtype=out_dtype), base, [agents[0], broken], lambdas, 1e-5,
                                 1090, 1237) == 1, (name, bad)


@needs_kernels
@pytest.mark.parametrize("bad", [math.nan, math.inf])
@pytest.mark.parametrize("variant", ["ram", "ram_plus"])
def test_native_names_non_finite_inputs(base_sd, bad, variant):
    agents = make_agents(base_sd, [0.3, 0.3])
    agents[1]["layers.1.w"][2, 3] = bad
    before = snapshot(agents[1])
    with pytest.raises(NonFiniteError, match=r"'layers\.1\.w' of agent 'agent_1' holds (nan|inf) at flat index 35"):
        ram_merge(agents, base=base_sd, variant=variant)
    assert_bit_identical(agents[1], before)


@needs_kernels
def test_overflowing_task_vectors_are_reported(base_sd):
    base = {k: torch.full_like(v, -3e38) for k, v in base_sd.items()}
    agents = [{k: torch.full_like(v, 3e38) for k, v in base_sd.items()}]
    with pytest.raises(NonFiniteError, match="overflows"):
        ram_merge(agents, base=base, variant="ram")


def test_supports_only_what_it_computes_exactly():
    x = torch.zeros(8)
    assert native.supports(None, x, [x]) and native.supports(x.bfloat16(), x, [x])
    assert not native.supports(None, x.half(), [x.half()])  # float16: the torch paths
    assert not native.supports(None, x, [x.bfloat16()])  # mixed dtypes
    assert not native.supports(None, x, [])
    assert not native.supports(None, x, [torch.zeros(4, 2).T.reshape(-1)[::2]])  # not contiguous
    assert not native.supports(None, x, [x] * (native.MAX_AGENTS + 1))


def test_switched_off_by_the_environment(monkeypatch):
    from ram_live import _cc

    monkeypatch.setenv("RAM_LIVE_NATIVE", "0")
    assert not _cc.native_enabled()
    assert _cc.load_library("int f(void) { return 1; }", "probe", ["-O2"]) is None


def test_the_kernels_build_wherever_a_c_compiler_is_found():
    import os
    import shutil

    from ram_live import _cc

    if _cc.native_enabled() and shutil.which(os.environ.get("CC", "cc")):
        assert native.kernels() is not None  # a source that stopped compiling must not pass as "no compiler"
