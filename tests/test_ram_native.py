"""The native CPU RAM kernels give the eager torch path's bits and counts, and fall back where they do not apply."""

import copy
import math

import pytest
import torch
from torch import nn

import ram_live
import ram_live.methods.ram.native as native
from ram_live.methods import ram as R
from ram_live import merge
from ram_live.errors import NonFiniteError
from tests.conftest import assert_bit_identical, make_agents, snapshot

needs_kernels = pytest.mark.skipif(native.kernels() is None, reason="no C compiler: native kernels unavailable")

CASES = [
    dict(method="ram"),
    dict(method="ram_plus"),
    dict(method="ram_plus_soft", r=0.3),
    dict(method="ram_plus", rho_scope="tensor", alpha=0.2),
    dict(method="ram_plus", activity="changed"),
    dict(method="ram", eps=0.02),
]


def _eager(monkeypatch, **kw):
    with monkeypatch.context() as m:
        m.setattr(native, "_KERNELS", None)
        return merge(**kw)


def _bits(t):
    return t.view(torch.int16 if t.dtype == torch.bfloat16 else torch.int32)


def _builds(module):
    """The kernels of ``module`` (``native`` or ``native_weighted``) at this host's level and portable."""
    return {"native": module.kernels(), "portable": module.build((*native.FLAGS, "-mno-avx512f"))}


def _check_ranges(builds, run, want, label):
    """On ranges with odd starts and tails, ``run(kernels, out, start, end)`` of each build returns 0, writes
    ``want``'s bits there and nothing outside."""
    n = want.numel()
    for name, kernels in builds.items():
        for start, end in [(0, n), (3, 999), (1000, 1031), (5, 6), (17, 49)]:
            out = torch.full((n,), 7.0, dtype=want.dtype)
            assert run(kernels, out, start, end) == 0
            assert torch.equal(_bits(out[start:end]), _bits(want[start:end])), (name, *label, start, end)
            assert (out[:start] == 7).all() and (out[end:] == 7).all(), (name, "wrote outside its range")


def _check_sign_is_plain(builds, run, n, out_dtype, label):
    """``run(kernels, out, sign)`` of each build gives the same bits with ``sign`` on and off (the agents agree)."""
    for name, kernels in builds.items():
        signed, plain = torch.empty(n, dtype=out_dtype), torch.empty(n, dtype=out_dtype)
        assert run(kernels, signed, True) == 0 and run(kernels, plain, False) == 0
        assert torch.equal(_bits(signed), _bits(plain)), (name, out_dtype, *label)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("out_dtype", [None, torch.float32, torch.bfloat16])
@needs_kernels
def test_native_equals_eager_bits_and_counts(monkeypatch, base_sd, dtype, out_dtype):
    monkeypatch.setattr("ram_live.engine.threads.NATIVE_CHUNK", 64)  # several ranges per tensor, shared by two threads
    calls = []  # the start of each range either merge kernel took (RAM+ in memory: merge_unscaled)
    for name, start in (("merge", -2), ("merge_unscaled", 4)):
        kernel = getattr(native.Kernels, name)
        monkeypatch.setattr(
            native.Kernels, name, lambda self, *a, k=kernel, i=start, **kw: calls.append(a[i]) or k(self, *a, **kw)
        )
    base = {k: v.to(dtype) for k, v in base_sd.items()}
    base["layers.0.b"][:3] = -0.0
    agents = make_agents(base, [0.05, 0.5, 0.6], scale=0.05)
    agents[0]["layers.0.b"][0] = 0.0  # +0 against the base's -0
    for case in CASES:
        kw = dict(models=agents, base=base, return_info=True, dtype=out_dtype, workers=2, **case)
        fast, f_info = merge(**kw)
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
    builds = _builds(native)
    assert builds["portable"] is not None and builds["portable"].simd_bits == 0
    from ram_live.kernels import cc

    # the level the native build is made for: the CPU's, or what RAM_LIVE_SIMD asks of it
    assert builds["native"].simd_bits == (512 if cc.build_level() == "avx512" else 0)
    g = torch.Generator().manual_seed(7)
    n = 1237
    base = torch.randn(n, generator=g).to(in_dtype)
    base[:40:3] = -0.0
    agents = []
    for t, density in enumerate([0.05, 0.5, 0.6, 0.3, 0.9]):
        a = base.clone()
        m = torch.rand(n, generator=g) < density
        a[m] = (base[m].float() + torch.randn(int(m.sum()), generator=g) * 0.1).to(in_dtype)
        a[t * 7 : t * 7 + 3] = base[t * 7 : t * 7 + 3].float() + 1e-6  # sub-eps moves (f32) or no move (bf16)
        agents.append(a)
    agents[1][:40:6] = 0.0  # +0 against the base's -0: inactive
    lambdas = torch.tensor([1.7, 0.5, 2.0, 1.25, 3.0]) if plus else None
    want, active, unique = _reference(base, agents, lambdas, 1e-5, out_dtype)
    _check_ranges(
        builds, lambda kernels, out, start, end: kernels.merge(out, base, agents, lambdas, 1e-5, start, end), want, ()
    )
    for name, kernels in builds.items():
        act, uni = torch.zeros(5, dtype=torch.int64), torch.zeros(5, dtype=torch.int64)
        assert not kernels.counts(base, agents, 1e-5, 0, 600, act, uni)
        assert not kernels.counts(base, agents, 1e-5, 600, n, act, uni)
        assert act.tolist() == active and uni.tolist() == unique, name
        for bad in (math.inf, -math.inf, math.nan):
            broken = agents[2].clone()
            broken[1100] = bad
            assert kernels.counts(base, [agents[0], broken], 1e-5, 1090, 1237, act, uni), (name, bad)
            assert (
                kernels.merge(torch.empty(n, dtype=out_dtype), base, [agents[0], broken], lambdas, 1e-5, 1090, 1237)
                == 1
            ), (name, bad)


@needs_kernels
@pytest.mark.parametrize("k", [1, 2, 3, 4, 5, 6, 7, 8, 9, 12])
def test_every_agent_count_the_kernels_are_compiled_for(k):
    """The AVX-512 loops are compiled once per agent count up to 8 and once for any k: each against Eq. 7 (RAM
    and RAM+, same and other output dtype) and the counts."""
    kernels = native.kernels()
    g = torch.Generator().manual_seed(100 + k)
    n = 777
    for dtype in (torch.bfloat16, torch.float32):
        base = torch.randn(n, generator=g).to(dtype)
        agents = []
        for t in range(k):
            a = base.clone()
            m = torch.rand(n, generator=g) < 0.1 + 0.8 * t / k
            a[m] = (base[m].float() + torch.randn(int(m.sum()), generator=g) * 0.1).to(dtype)
            agents.append(a)
        for lambdas in (None, 1.0 + torch.rand(k, generator=g)):
            for out_dtype in (dtype, torch.float32 if dtype == torch.bfloat16 else torch.bfloat16):
                want, active, unique = _reference(base, agents, lambdas, 1e-5, out_dtype)
                out = torch.empty(n, dtype=out_dtype)
                assert kernels.merge(out, base, agents, lambdas, 1e-5, 0, n) == 0
                bits = torch.int16 if out_dtype == torch.bfloat16 else torch.int32
                assert torch.equal(out.view(bits), want.view(bits)), (dtype, out_dtype, lambdas is not None)
        act, uni = torch.zeros(k, dtype=torch.int64), torch.zeros(k, dtype=torch.int64)
        assert not kernels.counts(base, agents, 1e-5, 0, n, act, uni)
        assert act.tolist() == active and uni.tolist() == unique, dtype


@needs_kernels
@pytest.mark.parametrize("bad", [math.nan, math.inf])
@pytest.mark.parametrize("variant", ["ram", "ram_plus"])
def test_native_names_non_finite_inputs(base_sd, bad, variant):
    agents = make_agents(base_sd, [0.3, 0.3])
    agents[1]["layers.1.w"][2, 3] = bad
    before = snapshot(agents[1])
    with pytest.raises(NonFiniteError, match=r"'layers\.1\.w' of agent 'agent_1' holds (nan|inf) at flat index 35"):
        merge(agents, base=base_sd, method=variant)
    assert_bit_identical(agents[1], before)


@needs_kernels
def test_overflowing_task_vectors_are_reported(base_sd):
    base = {k: torch.full_like(v, -3e38) for k, v in base_sd.items()}
    agents = [{k: torch.full_like(v, 3e38) for k, v in base_sd.items()}]
    with pytest.raises(NonFiniteError, match="overflows"):
        merge(agents, base=base, method="ram")


def test_supports_only_what_it_computes_exactly():
    x = torch.zeros(8)
    assert native.supports(None, x, [x]) and native.supports(x.bfloat16(), x, [x])
    assert not native.supports(None, x.half(), [x.half()])  # float16: the torch paths
    assert not native.supports(None, x, [x.bfloat16()])  # mixed dtypes
    assert not native.supports(None, x, [])
    assert not native.supports(None, x, [torch.zeros(4, 2).T.reshape(-1)[::2]])  # not contiguous
    assert not native.supports(None, x, [x] * (native.MAX_AGENTS + 1))


def test_switched_off_by_the_environment(monkeypatch):
    from ram_live.kernels import cc

    monkeypatch.setenv("RAM_LIVE_NATIVE", "0")
    assert not cc.native_enabled()
    assert cc.load_library("int f(void) { return 1; }", "probe", ["-O2"]) is None


def test_the_kernels_build_wherever_a_c_compiler_is_found():
    import os
    import shutil

    from ram_live.kernels import cc

    if cc.native_enabled() and shutil.which(os.environ.get("CC", "cc")):
        assert native.kernels() is not None  # a source that stopped compiling must not pass as "no compiler"


@needs_kernels
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("k", [1, 2, 3, 4, 5, 6, 7, 8, 9, 31])
def test_single_read_kernels_give_the_two_pass_bits(dtype, k):
    """merge_unscaled then rescale (both builds) equal Eq. 7 with λ, count as ram_counts does, and catch NaN/Inf
    in an agent (first kernel) or in the base (the second kernel where one agent alone then counts as moved)."""
    builds = _builds(native)
    g = torch.Generator().manual_seed(k)
    n = 1000 + k
    base = torch.randn(n, generator=g).to(dtype)
    base[:40:3] = -0.0
    base[100:110] = 3e4  # an agent moves these to ~1e-3: its task vector is not exact in float32
    agents = []
    for t in range(k):
        a = base.clone()
        m = torch.rand(n, generator=g) < [0.05, 0.5, 0.6, 0.3, 0.9][t % 5]
        a[m] = (base[m].float() + torch.randn(int(m.sum()), generator=g) * 0.1).to(dtype)
        agents.append(a)
    agents[0][100:110] = 1.2345e-3 + torch.arange(10) * 1e-4
    for a in agents[1:]:
        a[100:110] = base[100:110]
    lambdas = 1.0 + torch.rand(k, generator=g)
    want, active, unique = _reference(base, agents, lambdas, 1e-5, dtype)
    bits = torch.int16 if dtype == torch.bfloat16 else torch.int32
    assert native.plane_count(k) == k.bit_length()
    for name, kernels in builds.items():
        out = torch.full((n,), 7.0, dtype=dtype)
        planes = torch.empty(native.planes_numel(n, k), dtype=torch.int32)
        act, uni = torch.zeros(k, dtype=torch.int64), torch.zeros(k, dtype=torch.int64)
        for start, end in [(0, 64), (64, 96), (96, 640), (640, n)]:
            assert kernels.merge_unscaled(out, base, agents, 1e-5, start, end, planes, act, uni) == 0
        assert act.tolist() == active and uni.tolist() == unique, name
        assert torch.equal(out[100:110], agents[0][100:110]), "an entry one agent alone moved keeps its value"
        with pytest.raises(ValueError, match="multiple of 32"):
            kernels.rescale(out, base, planes, lambdas, 333, n)
        for start, end in [(0, 352), (352, n)]:
            assert kernels.rescale(out, base, planes, lambdas, start, end) == 0
        assert torch.equal(out.view(bits), want.view(bits)), name
        broken = [a.clone() for a in agents]
        broken[-1][500] = math.nan
        assert kernels.merge_unscaled(torch.empty_like(out), base, broken, 1e-5, 480, 520, planes, act, uni), name
        alone = int(
            ((torch.stack([(a.float() - base.float()).abs() > 1e-5 for a in agents])).sum(0) == 1).nonzero()[0, 0]
        )
        nan_base = base.clone()
        nan_base[alone] = math.nan
        planes.zero_()
        out = torch.empty_like(out)
        s = alone // 32 * 32
        # a NaN base makes every agent active; with one agent the entry is that agent's alone, which the AVX-512
        # merge stores as the agent's (finite) value and the rescale catches
        first = kernels.merge_unscaled(out, nan_base, agents, 1e-5, s, s + 32, planes, act, uni)
        second = kernels.rescale(out, nan_base, planes, lambdas, s, s + 32)
        assert first + second >= 1, (name, first, second)


def _two_pass(monkeypatch, **kw):
    with monkeypatch.context() as m:
        m.setattr("ram_live.methods.ram.method.reads_once", lambda *a: False)
        return merge(**kw)


@needs_kernels
@pytest.mark.parametrize("variant", ["ram_plus", "ram_plus_soft"])
def test_in_memory_ram_plus_reads_the_inputs_once_with_the_two_pass_bits(monkeypatch, base_sd, variant):
    monkeypatch.setattr("ram_live.engine.threads.NATIVE_CHUNK", 64)
    base = {k: v.bfloat16() for k, v in base_sd.items()}
    agents = make_agents(base, [0.05, 0.5, 0.6, 0.3], scale=0.05)
    before = [snapshot(a) for a in (*agents, base)]
    one, one_info = merge(agents, base=base, method=variant, r=0.3, return_info=True, workers=2)
    two, two_info = _two_pass(monkeypatch, models=agents, base=base, method=variant, r=0.3, return_info=True)
    assert_bit_identical(one, two)
    assert (one_info.passes, two_info.passes) == (1, 2) and one_info.extra["single_read"] == len(base)
    assert one_info.lambdas == two_info.lambdas and one_info.statistics.fingerprint == two_info.statistics.fingerprint
    assert torch.equal(one_info.statistics.active, two_info.statistics.active)
    assert torch.equal(one_info.statistics.unique, two_info.statistics.unique)
    for obj, snap in zip((*agents, base), before):
        assert_bit_identical(obj, snap)


@needs_kernels
def test_single_read_merges_what_the_kernels_do_not_take_after_the_counts(monkeypatch, base_sd):
    base = dict(base_sd)
    base["layers.0.b"] = base["layers.0.b"].half()  # float16: the torch path, after λ is known
    agents = make_agents(base, [0.05, 0.5, 0.6], scale=0.05)
    from ram_live.io.sinks import StateDictSink

    taken = []
    destination = StateDictSink.destination
    monkeypatch.setattr(
        StateDictSink, "destination", lambda self, key, spec: taken.append(key) or destination(self, key, spec)
    )
    one, info = merge(agents, base=base, return_info=True)
    assert sorted(taken) == sorted(base), "each destination is taken once"
    assert_bit_identical(one, _two_pass(monkeypatch, models=agents, base=base))
    assert info.passes == 2 and info.extra["single_read"] == len(base) - 1
    assert info.extra["kernels"] == {"native": len(base) - 1, "eager": 1}


@needs_kernels
def test_single_read_on_live_modules_and_not_in_place(monkeypatch):
    torch.manual_seed(0)
    base = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 4))
    agents = []
    for density in (0.1, 0.5, 0.7):
        agent = copy.deepcopy(base)
        with torch.no_grad():
            for p in agent.parameters():
                p.add_(torch.randn_like(p) * (torch.rand_like(p) < density))
        agents.append(agent)
    merged, info = merge(agents, base=base, return_info=True)
    assert info.passes == 1 and info.extra["single_read"] == 4
    two = _two_pass(monkeypatch, models=agents, base=base)
    assert_bit_identical(merged.state_dict(), two.state_dict())
    target = copy.deepcopy(base)
    _, in_place = merge(agents, base=target, inplace=True, return_info=True)  # validates, then writes
    assert in_place.passes == 2 and in_place.extra["dry_run"] == 0 and "single_read" not in in_place.extra
    assert_bit_identical(target.state_dict(), two.state_dict())


@needs_kernels
def test_single_read_names_a_non_finite_base_under_an_entry_one_agent_moved(base_sd):
    agents = make_agents(base_sd, [0.5])
    moved = int((agents[0]["layers.1.w"] != base_sd["layers.1.w"]).flatten().nonzero()[0, 0])
    base = {k: v.clone() for k, v in base_sd.items()}
    base["layers.1.w"].view(-1)[moved] = math.nan
    with pytest.raises(NonFiniteError, match=rf"'layers\.1\.w' of the base holds nan at flat index {moved}"):
        merge(agents, base=base)


@needs_kernels
def test_single_read_keeps_its_owner_maps_within_the_memory_bound(monkeypatch, base_sd):
    """The owner maps (⌈log2(K+1)⌉ bits per entry) stay within 2 × the largest tensor, the bound the two-pass merge
    keeps: the tensors beyond it are counted first and read again; RAM_LIVE_SINGLE_READ=1 / 0 lifts the bound /
    never reads once. The bits are the same every way."""
    g = torch.Generator().manual_seed(5)
    many = {f"layers.{i}.w": torch.randn(64, generator=g).bfloat16() for i in range(40)}  # 40 small tensors
    agents = make_agents(many, [0.05, 0.3, 0.5, 0.5, 0.6, 0.2, 0.4, 0.7], scale=0.1)
    two = _two_pass(monkeypatch, models=agents, base=many)
    part, info = merge(agents, base=many, return_info=True)
    # 2 × 128 B of budget, 2 groups × 4 planes × 4 B = 32 B of map per tensor: 8 tensors in one read
    assert info.passes == 2 and info.extra["single_read"] == 8
    assert_bit_identical(part, two)
    monkeypatch.setenv("RAM_LIVE_SINGLE_READ", "1")
    one, info = merge(agents, base=many, return_info=True)
    assert info.passes == 1 and info.extra["single_read"] == 40
    assert_bit_identical(one, two)
    monkeypatch.setenv("RAM_LIVE_SINGLE_READ", "0")
    _, info = merge(make_agents(base_sd, [0.1, 0.5]), base=base_sd, return_info=True)
    assert info.passes == 2 and "single_read" not in info.extra


@needs_kernels
def test_a_result_that_rounds_to_inf_in_bfloat16_counts_as_not_finite():
    """θ* finite in float32 but past bfloat16's largest value + half a ULP: stored as Inf, so counted (both builds;
    the float32 output of the same merge is finite)."""
    base = torch.full((40,), 3.3e38).bfloat16()
    agents = [torch.full((40,), torch.finfo(torch.bfloat16).max, dtype=torch.bfloat16)]
    lambdas = torch.tensor([1.1])
    r = base.float() - (0.0 - (agents[0].float() - base.float())) * 1.1
    assert torch.isfinite(r).all() and not torch.isfinite(r.bfloat16()).any()
    builds = _builds(native)
    for name, kernels in builds.items():
        assert kernels.merge(torch.empty(40, dtype=torch.bfloat16), base, agents, lambdas, 1e-5, 0, 40) == 40, name
        assert kernels.merge(torch.empty(40), base, agents, lambdas, 1e-5, 0, 40) == 0, name
        planes = torch.empty(native.planes_numel(40, 1), dtype=torch.int32)
        out = torch.empty(40, dtype=torch.bfloat16)
        act, uni = torch.zeros(1, dtype=torch.int64), torch.zeros(1, dtype=torch.int64)
        assert kernels.merge_unscaled(out, base, agents, 1e-5, 0, 40, planes, act, uni) == 0, name
        assert kernels.rescale(out, base, planes, lambdas, 0, 40) == 40, name


@needs_kernels
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_counts_track_the_largest_task_vector_and_base_magnitudes(dtype):
    """(max |τ|, max |θ₀|) over the ranges counted, both builds: what lets an in-place merge skip its dry run."""
    builds = _builds(native)
    g = torch.Generator().manual_seed(3)
    base = (torch.randn(1000, generator=g) * 0.1).to(dtype)
    base[777] = -40.0
    agents = [base.clone(), base.clone()]
    agents[1][5] = base[5] - 3.0  # the largest |τ|
    want = torch.tensor([float((agents[1][5].float() - base[5].float()).abs()), 40.0])
    for name, kernels in builds.items():
        amax = torch.zeros(2)
        act, uni = torch.zeros(2, dtype=torch.int64), torch.zeros(2, dtype=torch.int64)
        assert not kernels.counts(base, agents, 1e-5, 0, 512, act, uni, amax)
        assert not kernels.counts(base, agents, 1e-5, 512, 1000, act, uni, amax)
        assert torch.equal(amax, want), (name, amax)


def _accumulated(base, agents, lambdas, eps, out_dtype, sign, importances=None):
    """The torch accumulator's θ* (``RamAccumulator``; with ``importances`` ``WeightedRamAccumulator``; ``sign``
    as ``shared="sign"``) in ``out_dtype``."""
    b = base.float()
    cls = R.RamAccumulator if importances is None else R.WeightedRamAccumulator
    acc = cls(
        b.numel(),
        len(agents),
        torch.device("cpu"),
        lambdas=None if lambdas is None else [float(x) for x in lambdas],
        sign=sign,
    )
    acc.begin(b.numel())
    for t, a in enumerate(agents):
        delta = torch.hardshrink(a.float() - b, eps)
        if importances is None:
            acc.add(t, delta)
        else:
            acc.add(t, delta, importance=importances[t].float())
    return acc.merged(b).to(out_dtype)


def _conflicting(k, n, dtype, seed, agree=False):
    """A base and k agents that disagree in sign on many entries (``agree``: all τ of one entry share its sign),
    with entries 0..63 where the first two agents move by +0.25 and -0.25 exactly (Σ τ = 0 where the others stay
    put, 0..31) and entries where τ is under eps."""
    g = torch.Generator().manual_seed(seed)
    base = torch.randn(n, generator=g).to(dtype)
    base[:64] = torch.round(base[:64].float() * 8) / 8  # ± 0.25 exact in bfloat16 too
    sign = torch.where(torch.rand(n, generator=g) < 0.5, -1.0, 1.0)
    agents = []
    for t in range(k):
        tau = torch.randn(n, generator=g) * 0.1 * (torch.rand(n, generator=g) < 0.7)
        a = (base.float() + (tau.abs() * sign if agree else tau)).to(dtype)
        a[100 + t : 140 + t] = base[100 + t : 140 + t].float() + 1e-6  # sub-eps moves (f32) or no move (bf16)
        if t < 2 and not agree:
            a[:64] = base[:64].float() + (0.25 if t == 0 else -0.25)
        elif not agree:
            a[:32] = base[:32]
        agents.append(a)
    return base, agents


@needs_kernels
@pytest.mark.parametrize("in_dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("k", [1, 2, 3, 5, 8, 11])
def test_sign_gives_the_torch_accumulators_bits(in_dtype, k):
    """``sign=True`` (``shared="sign"``) on both builds: the bits of ``RamAccumulator(sign=True)``, RAM and RAM+,
    either output dtype, on ranges with odd starts and tails."""
    builds = _builds(native)
    base, agents = _conflicting(k, 1237, in_dtype, seed=200 + k)
    changed = 0
    for lambdas in (None, 1.0 + torch.rand(k, generator=torch.Generator().manual_seed(k))):
        for out_dtype in (torch.float32, torch.bfloat16):
            want = _accumulated(base, agents, lambdas, 1e-5, out_dtype, sign=True)
            changed += int((want != _accumulated(base, agents, lambdas, 1e-5, out_dtype, sign=False)).sum())
            if k >= 2:
                assert torch.equal(want[:32], base[:32].to(out_dtype)), "Σ τ = 0: the plain mean, 0"
            _check_ranges(
                builds,
                lambda kernels, out, start, end: kernels.merge(out, base, agents, lambdas, 1e-5, start, end, sign=True),
                want,
                (out_dtype, lambdas is not None),
            )
    assert k == 1 or changed > 100, "the data has conflicts the rule resolves"


@needs_kernels
@pytest.mark.parametrize("in_dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("k", [1, 2, 3, 5, 8, 11])
def test_sign_where_the_agents_agree_is_the_plain_merge_bit_for_bit(in_dtype, k):
    builds = _builds(native)
    n = 1237
    base, agents = _conflicting(k, n, in_dtype, seed=300 + k, agree=True)
    for lambdas in (None, 1.0 + torch.rand(k, generator=torch.Generator().manual_seed(k))):
        for out_dtype in (torch.float32, torch.bfloat16):
            _check_sign_is_plain(
                builds,
                lambda kernels, out, sign: kernels.merge(out, base, agents, lambdas, 1e-5, 0, n, sign=sign),
                n,
                out_dtype,
                (lambdas is not None,),
            )


@needs_kernels
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_sign_through_merge_runs_native_with_the_torch_paths_bits(monkeypatch, base_sd, dtype):
    monkeypatch.setattr("ram_live.engine.threads.NATIVE_CHUNK", 64)  # several ranges per tensor, shared by two threads
    base = {k: v.to(dtype) for k, v in base_sd.items()}
    agents = {f"agent_{i}": a for i, a in enumerate(make_agents(base, [0.5, 0.6, 0.7], scale=0.05))}  # τ ≷ 0
    kw = dict(base=base, method="ram_plus", shared="sign", return_info=True, workers=2)
    fast, info = ram_live.merge(agents, **kw)
    with monkeypatch.context() as m:
        m.setattr(native, "_KERNELS", None)
        slow, slow_info = ram_live.merge(agents, **kw)
    assert info.extra["kernels"] == {"native": len(base)}, info.extra
    assert slow_info.extra["kernels"] == {"eager": len(base)}, slow_info.extra
    assert_bit_identical(fast, slow)
    assert info.lambdas == slow_info.lambdas
    plain = ram_live.merge(agents, base=base, method="ram_plus", workers=2)
    assert any(not torch.equal(fast[k], plain[k]) for k in base), "the rule changed shared entries"
