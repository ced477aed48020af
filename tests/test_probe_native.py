"""The native probe kernel gives the torch probe's counts (and its cosines to 1e-6), in every build, and the same
errors; other inputs keep the torch path."""

import math

import pytest
import torch

import ram_live.kernels.probe as native
from ram_live import probe
from ram_live.errors import NonFiniteError
from tests.conftest import make_agents

needs_kernel = pytest.mark.skipif(native.kernel() is None, reason="no C compiler: native probe kernel unavailable")

BUILDS = {
    "native": native.FLAGS,
    "portable": (*native.FLAGS, "-mno-avx512f"),
    "no-vpopcntdq": (*native.FLAGS, "-mno-avx512vpopcntdq"),
}
CASES = [dict(), dict(eps=0.02), dict(eps=0.0), dict(activity="changed")]


@pytest.fixture(params=list(BUILDS))
def kernel(request, monkeypatch):
    """Each build of the kernel, installed as the one :func:`ram_live.probe` uses."""
    built = native.build(BUILDS[request.param])
    if built is None:
        pytest.skip("no C compiler: native probe kernel unavailable")
    if request.param == "portable":
        assert built.simd_bits == 0
    monkeypatch.setattr(native, "kernel", lambda: built)
    return built


def _odd_model(dtype):
    """Tensors of odd sizes (tails of every length mod 64), -0 in the base, entries exactly eps = 0.02 away."""
    g = torch.Generator().manual_seed(3)
    shapes = {
        "embed.weight": (37, 13),
        "layers.0.w": (129,),
        "layers.0.b": (1,),
        "layers.1.w": (3, 5, 7),
        "head.weight": (1000,),
    }
    base = {k: torch.randn(s, generator=g).to(dtype) for k, s in shapes.items()}
    base["layers.0.w"][:9] = -0.0
    base["head.weight"][:20] = 0.0
    return base


def _agents(base, k):
    agents = make_agents(base, [0.05, 0.5, 0.6, 0.3, 0.9][:k], scale=0.05, seed=k)
    agents[0]["layers.0.w"][:5] = 0.0  # +0 against the base's -0: inactive
    agents[0]["head.weight"][:10] = 0.02  # |τ| = eps (float32): inactive with eps=0.02
    agents[-1]["embed.weight"][2, :6] = base["embed.weight"][2, :6].float() + 1e-6  # sub-eps (bf16: no move)
    return agents


def _torch_probe(monkeypatch, *args, **kw):
    with monkeypatch.context() as m:
        m.setattr(native, "kernel", lambda: None)
        return probe(*args, **kw)


def _counted(report):
    return (
        {n: s.to_dict() for n, s in report.agents.items()},
        {k: {n: (s.total, s.active, s.unique) for n, s in v.items()} for k, v in report.tensors.items()},
        report.histogram,
        report.jaccard,
        report.expected_jaccard,
    )


def assert_same_report(fast, slow):
    """Every count (and what comes from counts) equal; cosine within 1e-6 (it is normalised: |cosine| <= 1)."""
    assert _counted(fast) == _counted(slow)
    for row_f, row_s in zip(fast.cosine, slow.cosine):
        assert row_f == pytest.approx(row_s, rel=1e-6, abs=1e-6)


@needs_kernel
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("k", [1, 2, 5])
def test_native_probe_equals_torch_probe(monkeypatch, kernel, dtype, k):
    monkeypatch.setattr("ram_live.engine.threads.NATIVE_CHUNK", 64)  # several ranges per tensor, shared by two threads
    calls = []
    run = native.Kernel.probe
    monkeypatch.setattr(native.Kernel, "probe", lambda self, *a: calls.append(a[3]) or run(self, *a))
    base = _odd_model(dtype)
    agents = _agents(base, k)
    for case in CASES:
        fast = probe(agents, base=base, workers=2, **case)
        assert 0 in calls and 64 in calls and 960 in calls, "the native kernel did not run on every range"
        calls.clear()
        slow = _torch_probe(monkeypatch, agents, base=base, **case)
        assert not calls
        assert_same_report(fast, slow)
        assert fast.statistics().histogram.sum() == sum(v.numel() for v in base.values())


@needs_kernel
@pytest.mark.parametrize("eps", [1e-5, 0.0])
def test_kernel_against_a_hand_computation(kernel, eps):
    base = torch.tensor([1.0, 2.0, -0.0, 4.0, 5.0, 0.0])
    agents = [
        torch.tensor([1.5, 2.0, -0.0, 4.0, 7.0, 0.0]),
        torch.tensor([1.0, 3.0, 0.0, 4.000001, 6.0, 0.0]),
        torch.tensor([1.0, 2.0, -0.0, 4.0, 9.0, 1.0]),
    ]
    delta = float(agents[1][3] - base[3])  # ≈ 9.5e-7: active only with eps = 0
    counts = native.ProbeCounts.zeros(3)
    assert not kernel.probe(base, agents, eps, 0, 4, counts)
    assert not kernel.probe(base, agents, eps, 4, 6, counts)
    # τ0 = [.5, 0, 0, 0, 2, 0], τ1 = [0, 1, 0, δ, 1, 0], τ2 = [0, 0, 0, 0, 4, 1]: entry 4 is shared by all three
    sub = eps == 0.0
    assert counts.active.tolist() == [2, 2 + sub, 2]
    assert counts.unique.tolist() == [1, 1 + sub, 1]
    assert counts.inter.tolist() == [[2, 1, 1], [1, 2 + sub, 1], [1, 1, 2]]
    assert counts.histogram.tolist() == [2 - sub, 3 + sub, 0, 1]
    want = [[4.25, 2.0, 8.0], [2.0, 2.0 + delta * delta, 4.0], [8.0, 4.0, 17.0]]
    assert counts.gram.tolist() == [pytest.approx(row, rel=1e-12) for row in want]
    broken = agents[2].clone()
    broken[5] = math.nan
    assert kernel.probe(base, [agents[0], broken], eps, 4, 6, native.ProbeCounts.zeros(2))
    with pytest.raises(ValueError, match="1 to 32 agents"):
        kernel.probe(base, [base] * 33, eps, 0, 6, native.ProbeCounts.zeros(33))


@needs_kernel
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("k", [1, 2, 3, 5, 6, 7, 8, 13, 32])
def test_kernel_counts_against_torch_on_ranges(kernel, dtype, k):
    """Counts of ranges with odd starts and tails equal the masks' counts in torch; the Gram matrix within 1e-6;
    every agent's inf and NaN flagged."""
    g = torch.Generator().manual_seed(k)
    n = 9337  # over 4096 entries: the float32 lanes go into float64 more than once
    base = torch.randn(n, generator=g).to(dtype)
    agents = []
    for _ in range(k):
        a = base.clone()
        m = torch.rand(n, generator=g) < float(torch.rand((), generator=g))
        a[m] = (base[m].float() + torch.randn(int(m.sum()), generator=g) * 0.1).to(dtype)
        agents.append(a)
    tau = torch.stack([a.float() - base.float() for a in agents])
    for start, end in [(0, n), (3, 999), (1000, 1031), (5, 6), (17, 81), (4000, 9337)]:
        counts = native.ProbeCounts.zeros(k)
        assert not kernel.probe(base, agents, 1e-5, start, end, counts)
        t = tau[:, start:end]
        m = ~(t.abs() <= 1e-5)
        c = m.sum(0)
        assert counts.active.tolist() == m.sum(1).tolist(), (start, end)
        assert counts.unique.tolist() == (m & (c == 1)).sum(1).tolist(), (start, end)
        assert counts.inter.tolist() == (m.double() @ m.double().T).long().tolist(), (start, end)
        assert counts.histogram.tolist() == torch.bincount(c, minlength=k + 1).tolist(), (start, end)
        gram = t.double() @ t.double().T
        assert torch.allclose(counts.gram, gram, rtol=0, atol=1e-6 * float(gram.diagonal().max())), (start, end)
    for t in range(k):
        for bad in (math.inf, -math.inf, math.nan):
            broken = list(agents)
            broken[t] = agents[t].clone()
            broken[t][1100] = bad
            assert kernel.probe(base, broken, 1e-5, 1090, 1237, native.ProbeCounts.zeros(k)), (t, bad)


@needs_kernel
@pytest.mark.parametrize("who", ["agent", "base", "both", "overflow"])
@pytest.mark.parametrize("bad", [math.nan, math.inf])
def test_non_finite_inputs_raise_as_the_torch_path(monkeypatch, kernel, base_sd, who, bad):
    """The same NonFiniteError (message, key, agent) as the torch path: in the first chunk (of 64 entries here) with
    a non-finite task vector, the first input that is not finite (the base before the agents), or the tensor that
    overflows."""
    monkeypatch.setattr("ram_live.engine.threads.NATIVE_CHUNK", 64)
    base = {k: v.clone() for k, v in base_sd.items()}
    agents = make_agents(base, [0.3, 0.3])
    if who in ("agent", "both"):
        agents[1]["layers.1.w"][2, 3] = bad
        agents[0]["layers.1.w"][20, 3] = bad
    if who in ("base", "both"):
        base["layers.1.w"][22, 1] = bad
    if who == "overflow":
        base = {k: torch.full_like(v, -3e38) for k, v in base_sd.items()}
        agents = [{k: torch.full_like(v, 3e38) for k, v in base_sd.items()}]
    errors = []
    for run in (probe, lambda *a, **kw: _torch_probe(monkeypatch, *a, **kw)):
        with pytest.raises(NonFiniteError) as info:
            run(agents, base=base, workers=2, chunk_numel=128)
        errors.append((str(info.value), info.value.key, info.value.agent))
    assert errors[0] == errors[1]
    want = {
        "agent": ("layers.1.w", "agent_1", "flat index 35"),
        "base": ("layers.1.w", "base", "flat index 353"),
        "both": ("layers.1.w", "agent_1", "35"),
        "overflow": ("embed.weight", "agent_0", "task vector of agent 'agent_0' overflows"),
    }[who]
    assert errors[0][1:] == want[:2] and want[2] in errors[0][0], errors[0]


@needs_kernel
def test_other_inputs_keep_the_torch_path(monkeypatch, base_sd):
    calls = []
    monkeypatch.setattr(native.Kernel, "probe", lambda self, *a: calls.append(a) or pytest.fail("kernel ran"))
    half = {k: v.half() for k, v in base_sd.items()}
    probe(make_agents(half, [0.3, 0.4]), base=half)  # float16
    probe(make_agents(base_sd, [0.3, 0.4], dtype=torch.bfloat16), base=base_sd)  # mixed dtypes
    probe(make_agents(base_sd, [0.1] * 33), base=base_sd)  # more than 32 agents
    assert not calls
    monkeypatch.setenv("RAM_LIVE_NATIVE", "0")
    assert native.build() is None
