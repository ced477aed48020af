import math

import pytest
import torch

from ram_live import functional as F
from ram_live.methods import ram as R


def test_ram_combine_hand_case():
    d = torch.tensor([[0.5, 0.0, 0.2, 0.0, -0.3], [0.0, 0.0, 0.4, 0.0, 0.1], [0.0, 0.0, 0.0, 0.7, 0.2]])
    assert torch.allclose(R.ram_combine(d), torch.tensor([0.5, 0.0, 0.3, 0.7, 0.0]), atol=1e-7)
    lam = torch.tensor([1.1, 1.2, 1.3])
    expected = torch.tensor([0.55, 0.0, 0.3, 0.91, 0.0])
    assert torch.allclose(R.ram_combine(d, lam), expected, atol=1e-6)


def test_apply_activity_is_strict_at_eps():
    eps = 1e-5
    at = torch.tensor(eps, dtype=torch.float32)
    above = torch.nextafter(at, torch.tensor(1.0))
    d = torch.tensor([[at, -at, above, -above, 0.0]])
    F.apply_activity_(d, eps)
    assert d.tolist()[0][:2] == [0.0, 0.0]
    assert d[0, 2] == above and d[0, 3] == -above


def test_statistics_counts():
    d = torch.tensor([[1.0, 1.0, 0.0, 0.0], [0.0, 1.0, 1.0, 0.0]])
    active, unique, hist = F.ram_statistics(d)
    assert active.tolist() == [2, 2] and unique.tolist() == [1, 1] and hist.tolist() == [1, 2, 1]


@pytest.mark.parametrize("unique,active,expected", [(2, 6, 2.0), (0, 5, math.inf), (0, 0, math.inf), (4, 4, 0.0)])
def test_rho(unique, active, expected):
    assert R.rho(unique, active) == expected


def test_lambda_variants():
    assert R.ram_lambda(1.5, "ram", 0.1, 2.0) == 1.0
    assert R.ram_lambda(1.5, "ram_plus", 0.1, 2.0) == pytest.approx(1.15)
    assert R.ram_lambda(5.0, "ram_plus", 0.1, 2.0) == pytest.approx(1.2)  # clipped at alpha
    assert R.ram_lambda(math.inf, "ram_plus", 0.1, 2.0) == pytest.approx(1.2)
    assert R.ram_lambda(5.0, "ram_plus", 0.2, 1.0) == pytest.approx(1.2)  # the authors' script
    assert R.ram_lambda(1.0, "ram_plus_soft", 0.1, 2.0) == pytest.approx(1.05)
    assert R.ram_lambda(math.inf, "ram_plus_soft", 0.1, 2.0) == pytest.approx(1.1)


def test_magnitude_threshold_keeps_top_k():
    d = torch.tensor([0.1, -0.5, 0.3, -0.2, 0.05])
    thr = F.magnitude_threshold(d, 0.4)  # k = int(0.4 * 5) = 2
    rows = F.trim_(d.clone().unsqueeze(0), [thr])
    assert rows[0].tolist() == pytest.approx([0.0, -0.5, 0.3, 0.0, 0.0])
    assert F.magnitude_threshold(d, 1.0) is None
    assert F.trim_(d.clone().unsqueeze(0), [F.magnitude_threshold(d, 0.1)]).count_nonzero() == 0


def test_ties_combine_hand_case():
    d = torch.tensor([[0.4, -0.2, 0.0], [-0.1, -0.3, 0.5], [0.2, 0.1, 0.0]])
    out = F.ties_combine(d, torch.ones(3))
    # column 0: sum 0.5 > 0 -> mean(0.4, 0.2); column 1: sum -0.4 -> mean(-0.2, -0.3); column 2: only 0.5
    assert torch.allclose(out, torch.tensor([0.3, -0.25, 0.5]))


def test_dare_drop_is_seeded_and_rescaled():
    d = torch.ones(2, 1000)
    gens = [torch.Generator().manual_seed(1), torch.Generator().manual_seed(2)]
    out = F.dare_drop_(d.clone(), 0.25, gens, torch.empty(1000))
    assert set(out.unique().tolist()) <= {0.0, 4.0}
    gens = [torch.Generator().manual_seed(1), torch.Generator().manual_seed(2)]
    assert torch.equal(out, F.dare_drop_(d.clone(), 0.25, gens, torch.empty(1000)))
    assert not torch.equal(out[0], out[1])


def test_stable_seed_is_stable():
    assert F.stable_seed("dare", 0, "a", "w") == F.stable_seed("dare", 0, "a", "w")
    assert F.stable_seed("dare", 0, "a", "w") != F.stable_seed("dare", 0, "b", "w")
    assert F.stable_seed(1, 2) == 5051128224166061352  # pinned: masks must not change across releases
    # kept between merges, by type: 1, 1.0 and True are equal keys to a plain cache but other strings to the hash
    assert len({F.stable_seed("dare", 1), F.stable_seed("dare", 1.0), F.stable_seed("dare", True)}) == 3


# ----------------------------------------------------------------------------------------------- the counters' rule

_AT = float(torch.tensor(1e-3))  # float32(1e-3), slightly above 1e-3
_BELOW = float(torch.nextafter(torch.tensor(_AT), torch.tensor(0.0)))
BOUNDARY = {  # name: (base, agent, eps, active entries by hand for "abs")
    # τ = ±float32(1e-3) is above eps = 1e-3, the float32 just below it is not
    "f32": (torch.zeros(6), torch.tensor([_AT, -_AT, 2e-3, _BELOW, 0.0, 5e-4]), 1e-3, 3),
    # bf16 steps of 2^-7 around 1.0; eps a hair below 2^-7 (float32(eps) rounds up to 2^-7)
    "bf16": (
        torch.ones(6, dtype=torch.bfloat16),
        torch.tensor([1 + 2**-7, 1 - 2**-7, 1 + 2**-6, 1 - 2**-8, 1.0, 1 + 2**-7], dtype=torch.bfloat16),
        2**-7 - 2**-40,
        4,
    ),
}


@pytest.mark.parametrize("case", sorted(BOUNDARY))
@pytest.mark.parametrize("rule", ["abs", "changed"])
def test_count_active_equals_the_merge_at_the_float_boundary(case, rule):
    from ram_live import merge
    from ram_live.methods import Activity

    base, agent, eps, by_hand = BOUNDARY[case]
    _, info = merge(
        [{"w": agent}, {"w": base.clone()}],
        base={"w": base},
        method="ram_plus",
        eps=eps,
        activity=rule,
        return_info=True,
    )
    merge_active = int(info.statistics.active[0])
    assert merge_active == (by_hand if rule == "abs" else int((agent != base).sum()))
    activity = Activity(rule, eps)
    assert F.count_active(agent, base, activity) == merge_active
    assert int(F.active_mask(agent, base, activity).sum()) == merge_active
    tau = agent.float() - base.float()
    assert F.count_delta_active(tau, activity) == merge_active
    # the case is on the boundary: the comparison with the Python float eps counts otherwise
    assert int((tau.abs() > eps).sum()) != merge_active


def test_active_mask_changed_across_dtypes_compares_in_the_narrower():
    from ram_live.methods import Activity

    base = torch.tensor([1.0, 1.0, 1.0], dtype=torch.float32)
    agent = torch.tensor([1.0 + 2**-9, 1.0 + 2**-6, 1.0], dtype=torch.float64)
    rule = Activity("changed", 0.0)
    # float32 is the narrower: 1 + 2^-9 is exact in it, so both changed entries count
    assert F.active_mask(agent, base, rule).tolist() == [True, True, False]
    bf16_base = base.to(torch.bfloat16)
    # against a bf16 base, 1 + 2^-9 rounds to 1.0 in bf16: unchanged there
    assert F.active_mask(agent, bf16_base, rule).tolist() == [False, True, False]
    from ram_live import merge

    _, info = merge(
        [{"w": agent}, {"w": bf16_base.clone()}],
        base={"w": bf16_base},
        method="ram_plus",
        activity="changed",
        return_info=True,
    )
    assert int(info.statistics.active[0]) == F.count_active(agent, bf16_base, rule) == 1
    assert F.narrower_dtype(torch.float32, torch.bfloat16) == torch.bfloat16
    assert F.narrower_dtype(torch.float16, torch.bfloat16) == torch.bfloat16  # same bits, larger machine eps
    assert F.compute_dtype(torch.bfloat16, torch.float32) == torch.float32
    assert F.compute_dtype(torch.bfloat16, torch.float64) == torch.float64


def test_count_active_in_chunks_equals_one_pass(monkeypatch):
    from ram_live.functional import activity as A
    from ram_live.methods import Activity

    g = torch.Generator().manual_seed(0)
    base = torch.randn(10_001, generator=g)
    agent = base + torch.randn(10_001, generator=g) * 1e-3
    rule = Activity("abs", 1e-3)
    whole = int(A.active_mask(agent, base, rule).sum())
    monkeypatch.setattr(A, "_CHUNK", 1000)
    assert F.count_active(agent, base, rule) == whole
    assert F.count_delta_active(agent - base, rule) == int(F.delta_active(agent - base, rule).sum())
    assert 0 < whole < 10_001


def test_rams_names_live_in_its_room_and_the_rest_in_functional():
    """RAM's rule, λ and fast paths moved out of ``ram_live.functional`` into ``ram_live.methods.ram`` (no shims);
    every other name still resolves from the package, and each name lives in one place only."""
    room = [
        "overlap_counts",
        "ram_combine",
        "rho",
        "ram_lambda",
        "RamAccumulator",
        "WeightedRamAccumulator",
        "importance_weights",
        "ram_fused_weighted_",
        "ram_fused_",
    ]
    kept = [
        "task_deltas_",
        "apply_activity_",
        "activity_mask",
        "ram_statistics",
        "task_arithmetic_combine",
        "magnitude_threshold",
        "trim_",
        "ties_combine",
        "dare_drop_",
        "stable_seed",
        "RamCounter",
        "ram_counts_fused",
    ]
    assert set(kept) <= set(F.__all__) and not set(room) & set(F.__all__)
    assert set(room) <= set(R.__all__) and not set(kept) & set(R.__all__)
    for name in F.__all__:
        assert getattr(F, name) is not None
    for name in R.__all__:
        assert getattr(R, name) is not None
    assert R.rho(0, 0) == math.inf and R.ram_lambda(math.inf, "ram_plus", 0.1, math.inf) == 1.0
    assert R.ram_lambda(math.inf, "ram_plus", 0.1, 2.0) == pytest.approx(1.2)
