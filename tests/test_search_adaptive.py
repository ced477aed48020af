"""ram_live.search's adaptive budget (screening, then successive halving over the arms), the shared-weights family
(per-agent weights in RAM's shared mean = constant importances), and the TIES threshold cache."""

from __future__ import annotations

import math

import pytest
import torch

from ram_live import ConfigError, merge, search
from ram_live.selection.budget import arms_of, refine_shares, screen_sizes
from ram_live.selection.space import TA_GRID, parse_space, spread
from ram_live.selection.target import Merger

from conftest import make_agents, snapshot

pytestmark = pytest.mark.filterwarnings("ignore::ram_live.ExtrapolationWarning")

NAMES = ("coder", "tools", "memory")
TA_TARGET = [0.3, 1.1, 1.7]  # not reachable by the ascent's dyadic steps from 1: it never converges in 60


@pytest.fixture
def agents(base_sd):
    return dict(zip(NAMES, make_agents(base_sd, [0.3, 0.3, 0.3], scale=0.05)))


def distance(merged, target) -> float:
    return -math.sqrt(sum(float(((merged[k].double() - target[k].double()) ** 2).sum()) for k in target))


def test_spread_and_the_round_rule_by_hand():
    assert spread(13, 6) == [0, 2, 5, 7, 10, 12] and spread(7, 5) == [0, 2, 3, 5, 6]
    assert spread(9, 5) == [0, 2, 4, 6, 8] and spread(4, 9) == [0, 1, 2, 3] and spread(5, 1) == [0]
    _, arms = arms_of(parse_space(None))
    assert [a.name for a in arms] == ["ram", "task_arithmetic", "ties", "dare_ties"]
    # 35 % of 60 = 21, evenly over 4 arms (the first gets the odd one), each at most its grids' size
    assert screen_sizes(arms, 60) == [6, 5, 5, 5]
    assert screen_sizes(arms, 2) == [1, 1, 0, 0] and screen_sizes(arms, 4) == [1, 1, 1, 1]
    assert refine_shares(4, 2, 39) == [7, 6] and refine_shares(2, 1, 26) == [26]
    # the RAM arm's steps: the ascents last, the joint λ/shared-weight ascent standing in for the λ ascent; local
    # steps follow a default TIES grid, not a given one
    assert [f.kind for f in arms[0].steps] == ["grid", "leave_one_out", "activity", "shared_weights"]
    assert [f.kind for f in arms[2].steps] == ["grid", "local"]
    _, given = arms_of(parse_space({"ties": {"density": [0.5]}}))
    assert [f.kind for f in given[0].steps] == ["grid"]


def test_the_leader_gets_most_of_the_budget(agents, base_sd):
    target = merge(agents, base=base_sd, method="task_arithmetic", weights=TA_TARGET)
    calls = []
    result = search(agents, base=base_sd, evaluate=lambda m: calls.append(1) or distance(m, target), budget=60)
    assert len(calls) == len(result.scored) == 60  # the budget, exactly
    arms = {}
    for t in result.history:
        arm = "ram" if t.side == "ram" else t.method
        arms[arm] = arms.get(arm, 0) + 1
    assert arms == result.budgets
    screen = [t for t in result.history if t.phase == "screen"]
    # screening: RAM's 6 grid picks (2 of them of equal effect: no ρ exceeds 2 here, α = 2 is α = ∞; the last is
    # the sign-elected shared region), TA 5 scales and 3 per-agent probes, TIES 5, DARE 5; refinement: TA leads,
    # TIES second: round one 13 of the 38 left, 7 / 6; then TA the 25 left
    assert len(screen) == 22
    assert [t.family for t in screen if t.method == "task_arithmetic"] == ["task_arithmetic"] * 5 + ["ta_probe"] * 3
    assert result.budgets == {"ram": 4, "task_arithmetic": 8 + 7 + 25, "ties": 5 + 6, "dare_ties": 5}
    assert [t.phase for t in result.history[22:]] == ["refine"] * 38
    # the probed arm refines its weights first, not more uniform scales
    assert [t.family for t in result.history if t.phase == "refine" and t.method == "task_arithmetic"][
        0
    ] == "ta_weights"
    assert result.best["method"] == "task_arithmetic" and result.best_trial.family == "ta_weights"


def test_the_same_seed_and_scores_give_the_same_history_and_the_cap_holds(agents, base_sd):
    target = merge(agents, base=base_sd, method="ram", lambdas={"coder": 2.0, "tools": 0.5, "memory": 3.0})
    runs = []
    for _ in range(2):
        r = search(agents, base=base_sd, evaluate=lambda m: distance(m, target), budget=25, seed=5)
        runs.append([(t.family, t.phase, t.candidate, t.score) for t in r.history])
    assert runs[0] == runs[1]
    for budget in (1, 2, 3, 5, 17):
        calls = []
        r = search(agents, base=base_sd, evaluate=lambda m: calls.append(1) or distance(m, target), budget=budget)
        assert len(calls) == len(r.scored) == budget and sum(r.budgets.values()) == budget


def test_a_narrowed_space_is_that_family_alone(agents, base_sd):
    """One arm: no screening, the whole budget, its families in order — the scale grid as listed, then the
    weight ascent from the best scale (what the demo's ``search TA`` row runs)."""
    target = merge(agents, base=base_sd, method="task_arithmetic", weights=TA_TARGET)
    r = search(
        agents, base=base_sd, evaluate=lambda m: distance(m, target), budget=30, space=["task_arithmetic", "ta_weights"]
    )
    assert r.budgets == {"task_arithmetic": 30} and {t.phase for t in r.history} == {"refine"}
    assert [t.candidate for t in r.history[:7]] == [{"method": "task_arithmetic", **g} for g in TA_GRID]
    assert {t.family for t in r.history[7:]} == {"ta_weights"}
    best_scale = max(r.history[:7], key=lambda t: t.score).options["scale"]
    first = r.history[7].options["weights"]
    assert sorted(first) == pytest.approx(
        sorted([best_scale] * 2 + [first[[w != best_scale for w in first].index(True)]])
    )
    grid = {"density": [0.2, 0.5], "scale": [1.0, 2.0]}
    ties = search(agents, base=base_sd, evaluate=lambda m: distance(m, target), budget=10, space={"ties": grid})
    assert [t.options for t in ties.history] == [{"density": d, "scale": s} for d in (0.2, 0.5) for s in (1.0, 2.0)]


def test_constant_importances_are_per_agent_weights_in_the_shared_mean():
    base = {"w": torch.zeros(3)}
    agents = {"a": {"w": torch.tensor([1.0, 2.0, 0.0])}, "b": {"w": torch.tensor([3.0, 0.0, 0.0])}}
    out = merge(agents, base=base, method="ram", lambdas={"a": 2.0, "b": 1.0}, importance={"a": 1.0, "b": 4.0})
    # entry 0 shared: (1·1 + 4·3) / 5 (float32: 3.25 / 1.25 after the kernels' division by the largest weight,
    # both exact, so the nearest float32 to 2.6); entry 1 a's alone: λ_a · 2; entry 2 nobody's: the base
    assert torch.equal(out["w"], torch.tensor([2.6, 4.0, 0.0]))
    plain = merge(agents, base=base, method="ram")
    assert torch.equal(merge(agents, base=base, method="ram", importance={"a": 0.7, "b": 0.7})["w"], plain["w"])
    with pytest.raises(ConfigError, match="importance of agent 'b': -1.0"):
        merge(agents, base=base, method="ram", importance={"a": 1.0, "b": -1.0})


def test_the_shared_weights_ascent_reproduces_bit_for_bit(agents, base_sd):
    truth = {
        "lambdas": {"coder": 2.0, "tools": 1.0, "memory": 1.0},
        "importance": {"coder": 1.0, "tools": 0.5, "memory": 1.0},
    }
    target = merge(agents, base=base_sd, method="ram", **truth)
    seen = []

    def evaluate(merged):
        seen.append(snapshot(merged))
        return distance(merged, target)

    r = search(agents, base=base_sd, evaluate=evaluate, budget=40, space=["shared_weights"])
    assert r.history[0].candidate == {"method": "ram", "lambdas": dict.fromkeys(NAMES, 1.0)}  # plain RAM first
    # the weights reach what λ alone cannot: the best trial has them, and beats every trial without
    assert "importance" in r.best and r.best["importance"]["tools"] < r.best["importance"]["coder"]
    assert r.best_score > max(t.score for t in r.history if "importance" not in t.options)
    for trial, state in zip(r.history, seen):
        again = merge(agents, base=base_sd, **trial.candidate)
        assert all(torch.equal(again[k], state[k]) for k in state), trial.label()


def test_cached_ties_thresholds_give_the_bits_of_a_plain_merge(agents, base_sd):
    merger = Merger(agents, base_sd)
    densities, scales = (0.2, 0.5, 1.0), (1.0, 1.5)
    for scale in scales:
        for density in densities:
            candidate = {"method": "ties", "density": density, "scale": scale}
            merged, _, _ = merger.merge(candidate)
            plain = merge(agents, base=base_sd, **candidate)
            assert all(torch.equal(merged[k], plain[k]) for k in plain), candidate
    # one threshold per agent, tensor and density, whatever the scale
    assert len(merger.thresholds) == len(agents) * len(base_sd) * len(densities)
    merged, _, _ = merger.merge({"method": "ties", "densities": [0.2, 0.5, 0.2], "scale": 2.0})
    plain = merge(agents, base=base_sd, method="ties", densities=[0.2, 0.5, 0.2], scale=2.0)
    assert all(torch.equal(merged[k], plain[k]) for k in plain)
    assert len(merger.thresholds) == len(agents) * len(base_sd) * len(densities)  # all were cached already


def test_the_probes_and_what_follows_them(base_sd):
    """Task arithmetic's screen probes each agent at 3 × the best screened scale (the others at that scale); its
    refinement then starts with the weight ascent, from the best probe when one beat every scale. A narrowed
    space (the family alone) neither probes nor reorders."""
    names = ("a", "b", "c")
    agents = dict(zip(names, make_agents(base_sd, [0.6] * 3, scale=0.05)))
    target = merge(agents, base=base_sd, method="task_arithmetic", weights=[5.0, 0.6, 0.6])
    result = search(agents, base=base_sd, evaluate=lambda m: distance(m, target), budget=60)
    probes = [t for t in result.history if t.family == "ta_probe"]
    scales = [t for t in result.history if t.family == "task_arithmetic" and t.phase == "screen"]
    s = max(scales, key=lambda t: t.score).options["scale"]
    assert [t.options["weights"] for t in probes] == [[3 * s, s, s], [s, 3 * s, s], [s, s, 3 * s]]
    assert {t.phase for t in probes} == {"screen"} and len(scales) == 5
    refine = [t for t in result.history if t.phase == "refine" and t.method == "task_arithmetic"]
    start = max(scales + probes, key=lambda t: t.score)
    assert refine[0].family == "ta_weights" and start.family == "ta_probe"
    first = refine[0].options["weights"]  # one coordinate of the best probe's weights moved by one step
    assert sum(abs(x - y) > 1e-9 for x, y in zip(first, start.options["weights"])) == 1
    assert result.best["method"] == "task_arithmetic"
    alone = search(
        agents, base=base_sd, evaluate=lambda m: distance(m, target), budget=20, space=["task_arithmetic", "ta_weights"]
    )
    assert not any(t.family == "ta_probe" for t in alone.history)
    assert [t.family for t in alone.history[:7]] == ["task_arithmetic"] * 7


def test_the_probes_come_after_every_arms_screen():
    """With a small budget and many agents the probes get what the screens leave, never an arm's screen."""
    from ram_live.selection.budget import spend

    class Run:  # the search loop's interface to spend(): each family takes its whole allowance
        def __init__(self, budget, k):
            self.budget, self.used, self.history, self.min_cost = budget, 0, [], 1.0
            self.merger = type("M", (), {"names": [f"a{i}" for i in range(k)]})()

        def run_family(self, family, allowance):
            n = min(allowance, self.budget - self.used, len(family.grid) if family.kind == "grid" else 10**6)
            self.used += n
            self.history += [type("T", (), {"phase": None, "family": family.name})() for _ in range(n)]
            return False

        def best_of(self, arm):
            return None

    for budget, k in ((10, 8), (8, 5), (60, 8)):
        run = Run(budget, k)
        used = spend(run, parse_space(None))
        screened = [t.family for t in run.history if t.phase == "screen"]
        assert {"ram_plus", "task_arithmetic", "ties", "dare_ties"} <= set(screened), (budget, k, used)
        assert screened.index("ta_probe") > max(i for i, f in enumerate(screened) if f == "dare_ties")
