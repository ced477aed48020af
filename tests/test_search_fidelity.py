"""ram_live.selection.fidelity: the prompt protocol, per-task scores, budgets in prompts, and the multi-fidelity race
(stratified nested slices, paired comparison with the side's best, estimates of stopped candidates by hand)."""

from __future__ import annotations

import json
import math

import pytest

from ram_live import ConfigError, SearchError, merge, search
from ram_live.selection.fidelity import Halving, nested_slices, parse_budget

from conftest import make_agents
from search_evals import TARGET, PromptEval

pytestmark = pytest.mark.filterwarnings("ignore::ram_live.ExtrapolationWarning")


@pytest.fixture
def problem(base_sd):
    agents = dict(zip(TARGET, make_agents(base_sd, [0.3, 0.3, 0.3], scale=0.05)))
    targets = {
        "math": merge(agents, base=base_sd, method="ram", lambdas=TARGET),
        "code": merge(agents, base=base_sd, method="ram", lambdas={"coder": 2.5, "tools": 0.5, "memory": 2.0}),
    }
    return agents, base_sd, PromptEval(targets)


def test_nested_slices_hold_every_task_and_each_other():
    tasks = ["a"] * 10 + ["b"] * 3 + ["c"] * 1
    slices = nested_slices(tasks, Halving().fractions, seed=1)
    assert [len(s) for s in slices] == [2 + 1 + 1, 4 + 1 + 1, 14]  # ⌈10/9⌉, ⌈3/9⌉, 1; ⌈10/3⌉, 1, 1
    for small, big in zip(slices, slices[1:]):
        assert set(small) <= set(big)
    for s in slices:
        assert {tasks[i] for i in s} == {"a", "b", "c"}
    assert nested_slices(tasks, [0.5, 1.0], seed=1) == nested_slices(tasks, [0.5, 1.0], seed=1)
    assert nested_slices(tasks, [0.5, 1.0], seed=1) != nested_slices(tasks, [0.5, 1.0], seed=2)


def test_every_trial_records_each_task_and_the_full_score_is_the_aggregate(problem):
    agents, base, ev = problem
    result = search(agents, base=base, evaluate=ev, budget=8, space=["ram_plus", "task_arithmetic"])
    for t in result.history:
        merged = merge(agents, base=base, **t.candidate)
        assert t.fidelity == 1.0 and set(t.tasks) == {"math", "code"}
        assert t.score == pytest.approx(ev(merged), abs=1e-12)
        assert sum(t.tasks.values()) / 2 == pytest.approx(t.score, abs=1e-12)
    table = result.table()
    assert "math" in table and "code" in table and "best per task" in table
    saved = json.loads(json.dumps(result.to_dict()))
    assert saved["best_tasks"] == result.best_trial.tasks and saved["history"][0]["tasks"] == result.history[0].tasks


def test_the_race_stops_clearly_worse_candidates_on_a_slice_and_estimates_them_by_hand(problem):
    agents, base, ev = problem
    n = len(ev.tasks)
    result = search(agents, base=base, evaluate=ev, budget="6x", fidelity="halving", seed=0)
    stopped = [t for t in result.history if t.fidelity < 1.0]
    assert all(t.stop == "race" for t in stopped) and all(t.stop is None for t in result.complete)
    assert any(t.stop == "race" for t in stopped), "some candidate should be stopped by the race"
    assert result.best_trial.fidelity == 1.0 and result.best_baseline.fidelity == 1.0
    # the cost: every prompt seen once per candidate, within the budget
    assert result.spent == pytest.approx(sum(t.fidelity for t in result.history if t.score is not None))
    assert result.spent <= 6.0 + 1e-9
    assert sum(len(c) for c in ev.calls) == pytest.approx(result.spent * n)
    # a stopped candidate: reference score + (its slice score - the reference's), by hand
    for t in stopped:
        side_best = [r for r in result.history[: t.index] if r.side == t.side and r.fidelity == 1.0]
        ref = max(side_best, key=lambda r: (r.score, -r.index))
        seen = nested_slices(ev.tasks, Halving().fractions, 0)[
            [len(s) for s in nested_slices(ev.tasks, Halving().fractions, 0)].index(round(t.fidelity * n))
        ]
        mine = ev.aggregate(dict(zip(seen, ev.prompt_scores(merge(agents, base=base, **t.candidate), seen))))[0]
        theirs = ev.aggregate(dict(zip(seen, ev.prompt_scores(merge(agents, base=base, **ref.candidate), seen))))[0]
        assert t.score == pytest.approx(ref.score + (mine - theirs), abs=1e-9)
        assert t.score < ref.score
    assert "~" in result.table()


def test_with_the_same_prompt_budget_the_race_tries_more_candidates_and_finds_as_good_a_merge(problem):
    agents, base, ev = problem
    full = search(agents, base=base, evaluate=ev, budget="12x")
    raced = search(agents, base=base, evaluate=ev, budget="12x", fidelity="halving")
    assert len(full.history) == 12 and full.spent == 12
    assert len(raced.history) > len(full.history)
    assert raced.best_score >= full.best_score - 1e-12
    again = merge(agents, base=base, **raced.best)
    assert raced.best_score == pytest.approx(ev(again), abs=1e-12)


def test_the_race_needs_a_prompt_budget(problem):
    agents, base, ev = problem
    with pytest.raises(ConfigError, match=r"fidelity='halving' needs a budget in prompt-evaluations \(budget='10x'"):
        search(agents, base=base, evaluate=ev, budget=10, fidelity="halving")


def test_a_plain_callable_with_a_prompt_budget_costs_one_per_candidate(problem):
    agents, base, ev = problem
    result = search(agents, base=base, evaluate=lambda m: ev(m), budget="5x")
    assert len(result.history) == 5 and all(t.tasks is None for t in result.history)


def test_errors(problem):
    agents, base, ev = problem
    for bad in ("x", "0x", "-2x", "nanx", "infx", "20", 0, 2.5, True):
        with pytest.raises(ConfigError, match="budget must be an int >= 1"):
            search(agents, base=base, evaluate=ev, budget=bad)
    for small in ("0.5x", "0.999x"):
        with pytest.raises(ConfigError, match="cannot pay for one candidate on every prompt"):
            search(agents, base=base, evaluate=ev, budget=small)
    with pytest.raises(ConfigError, match="fidelity='halving' needs an evaluation that scores prompts"):
        search(agents, base=base, evaluate=lambda m: 0.0, budget="3x", fidelity="halving")
    for bad in ("fast", 3, Halving):
        with pytest.raises(ConfigError, match="fidelity must be"):
            search(agents, base=base, evaluate=ev, budget="3x", fidelity=bad)
    for kwargs, message in (
        ({"eta": 1}, "eta"),
        ({"min_fraction": 0}, "min_fraction"),
        ({"z": -1}, "z"),
        ({"z": math.inf}, "z"),
        ({"seed": 1.5}, "seed"),
    ):
        with pytest.raises(ConfigError, match=message):
            Halving(**kwargs)

    class Short(PromptEval):
        def prompt_scores(self, merged, indices):
            return super().prompt_scores(merged, indices)[:-1]

    class Nan(PromptEval):
        def prompt_scores(self, merged, indices):
            return [math.nan] * len(indices)

    class Raises(PromptEval):
        def prompt_scores(self, merged, indices):
            raise RuntimeError("worker lost")

    class NoTasks(PromptEval):
        def prompt_tasks(self):
            return 7

    with pytest.raises(ConfigError, match=r"prompt_tasks\(\) failed \(TypeError: .*it must return each prompt's task"):
        search(agents, base=base, evaluate=NoTasks(ev.targets), budget=3)

    for cls, message in (
        (Short, "gave 17 scores for 18 prompts"),
        (Nan, "returned nan"),
        (Raises, "raised RuntimeError on candidate #0 .*worker lost"),
    ):
        with pytest.raises(SearchError, match=message):
            search(agents, base=base, evaluate=cls(ev.targets), budget=3)
    assert parse_budget("20x") == (20.0, True) and parse_budget(" 2.5X ") == (2.5, True)
    assert parse_budget(7) == (7.0, False)


def test_an_ascent_never_builds_on_a_race_estimate():
    """coordinate_ascent takes a step only onto a trial scored on every prompt: a stopped candidate's estimate,
    however high, is not an improvement to start from."""
    from ram_live.selection.refine import coordinate_ascent
    from ram_live.selection.result import Trial
    from ram_live.selection.space import Family

    def trial(candidate):
        x = candidate["x"]
        # x = 1 looks best but was stopped early by the race; the true optimum x = -1 was scored in full
        return Trial(
            0, "f", "m", candidate, {1.0: 9.0, -1.0: 1.0}.get(x, -5.0), 0.0, 0.0, 1.0, fidelity=0.1 if x == 1.0 else 1.0
        )

    values = [0.0]
    coordinate_ascent(
        trial,
        0,
        Family("f", "ram", "lambdas", settings={"step": 1.0, "min_step": 1.0}),
        values,
        [[0]],
        0.0,
        lambda v: {"x": v[0]},
        [1.0],
        [-1.0],
        [1.0],
    )
    assert values == [-1.0]


def test_json_stays_strict_with_nan_task_scores_and_numpy_options(problem):
    import numpy as np

    agents, base, ev = problem

    class NanTask(PromptEval):
        def aggregate(self, values):
            score, tasks = super().aggregate(values)
            return score, {**tasks, "empty": math.nan}

    result = search(
        agents,
        base=base,
        evaluate=NanTask(ev.targets),
        budget=2,
        space=[{"method": "task_arithmetic", "scale": np.float32(0.5)}, {"method": "ram"}],
    )
    history = json.loads(json.dumps(result.to_dict(), allow_nan=False))["history"]
    assert all(h["tasks"]["empty"] == "nan" for h in history)
    assert [h["options"] for h in history if h["method"] == "task_arithmetic"] == [{"scale": 0.5}]


def test_an_eta_that_makes_too_many_slices_is_refused_at_once(problem):
    """Halving(eta=1 + 1e-9) used to build about two billion slices (and exhaust memory) when first used."""
    from ram_live.selection.fidelity import MAX_RUNGS

    with pytest.raises(
        ConfigError,
        match=r"^Halving: eta=1.000000001 with min_fraction=0.1111111111111111 gives about 2.2e\+09 slices, "
        rf"more than {MAX_RUNGS}; take eta >= 1.0355 \(or a larger min_fraction\)$",
    ):
        Halving(eta=1 + 1e-9)
    with pytest.raises(
        ConfigError, match=r"eta=3 with min_fraction=1e-300 gives about 630 slices.* eta >= 57796.9289 "
    ):
        Halving(eta=3, min_fraction=1e-300)
    with pytest.raises(ConfigError, match=r"min_fraction=5e-324 gives about 679 slices.* eta >= 135470.4858 "):
        Halving(eta=3, min_fraction=5e-324)  # 1 / 5e-324 overflows a float: the estimate works in logs
    agents, base, ev = problem
    with pytest.raises(ConfigError, match="Halving: eta=1.01 with min_fraction=0.01"):
        search(agents, base=base, evaluate=ev, budget="3x", fidelity=Halving(eta=1.01, min_fraction=0.01))
    for eta, min_fraction in ((1.0355, 1 / 9), (57796.9289, 1e-300), (1.0355, 0.2)):  # the suggested etas are taken
        fractions = Halving(eta=eta, min_fraction=min_fraction).fractions
        assert 2 < len(fractions) <= MAX_RUNGS and fractions[0] == min_fraction and fractions[-1] == 1.0
        assert all(b > a for a, b in zip(fractions, fractions[1:]))
    assert len(Halving(eta=1.0355).fractions) == MAX_RUNGS
    with pytest.raises(ConfigError, match="gives about 65 slices, more than 64; take eta >= 1.0355"):
        Halving(eta=1.0352)
    assert Halving(min_fraction=1.0).fractions == (1.0,) and Halving(eta=1e300).fractions == (1 / 9, 1.0)


class Flip(PromptEval):
    """One task of 9 prompts: each candidate's quality counts with a + sign on 8 prompts and a - sign on the one
    prompt the race's first slice holds (slices of 1/3/9 prompts): behind there, ahead everywhere else."""

    def __init__(self, targets):
        super().__init__(targets, per_task=9)
        self.first = nested_slices(self.tasks, Halving().fractions, 0)[0]

    def prompt_scores(self, merged, indices):
        exact = super().prompt_scores(merged, indices)
        sign = {i: -1.0 if i in self.first else 1.0 for i in indices}
        return [self.offsets[i] + sign[i] * (v - self.offsets[i]) for v, i in zip(exact, indices)]


def test_the_race_stops_no_candidate_on_fewer_than_min_race_prompts(problem):
    """A first slice of one prompt: a candidate behind there (ahead on the 8 others) went on to be the full
    search's winner, and the race stops it on none of its 1- and 3-prompt slices (it stopped it before: the
    standard error of one difference was taken as 0); the plan raises no raced row for a race that stops none."""
    from ram_live.selection.fidelity import MIN_RACE_PROMPTS, Scored, Scorer

    agents, base, _ = problem
    targets = {"t": merge(agents, base=base, method="ram", lambdas={"coder": 0.3, "tools": 0.3, "memory": 0.3})}
    assert [len(s) for s in nested_slices(["t"] * 9, Halving().fractions, 0)] == [1, 3, 9] and MIN_RACE_PROMPTS == 4
    full = search(agents, base=base, evaluate=Flip(targets), budget=8, progress=False)
    raced = search(agents, base=base, evaluate=Flip(targets), budget="8x", fidelity="halving", progress=False)
    assert not any(t.stop for t in raced.history) and raced.race_slices == (1, 3, 9)
    assert "no slice but the last holds 4 prompts, the fewest the race stops a candidate on" in raced.table()
    assert raced.best_trial.candidate == full.best_trial.candidate and raced.best_score == full.best_score
    plan = search(agents, base=base, evaluate=Flip(targets), budget="8x", fidelity="halving", plan=True)
    assert plan.raced is None and "no slice but the last holds 4 prompts" in plan.note
    # the rule itself: equal shortfalls on 1, 2, 3 prompts go on, on 4 they stop (their paired se is 0)
    scorer = Scorer(PromptEval({"t": targets["t"]}, per_task=8), Halving())
    reference = Scored(1.0, 1.0, values={i: 1.0 for i in range(8)})
    for k in range(1, 6):
        behind = scorer._behind({i: 0.0 for i in range(k)}, reference, list(range(k)))
        assert behind is (k >= MIN_RACE_PROMPTS)
    # a None (not scored) prompt does not count: 4 prompts, 3 differences
    assert not scorer._behind({0: 0.0, 1: 0.0, 2: 0.0, 3: None}, reference, [0, 1, 2, 3])
