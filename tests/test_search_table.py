"""ram_live.selection.table: a stopped candidate's estimate and slice scores marked, an estimate outside the
per-prompt scores clamped and marked, each score's standard error, and who is within one of the winner."""

from __future__ import annotations

import math
import statistics

import pytest

from ram_live import merge, search
from ram_live.selection.fidelity import Halving, nested_slices, standard_error
from ram_live.selection.table import within_one_se

from conftest import make_agents
from search_evals import TARGET, PromptEval

pytestmark = pytest.mark.filterwarnings("ignore::ram_live.ExtrapolationWarning")


class PassAt:
    """pass@k-like per-prompt scores in [0, 1]: the first candidate passes the race's first slice and one more
    prompt; every later one passes nothing, so its estimate (5/36 + 0 - 1) falls below 0. 36 prompts: the first
    slice holds 4, the fewest the race stops a candidate on (fidelity.MIN_RACE_PROMPTS)."""

    def __init__(self):
        self.tasks = ["all"] * 36
        self.first = nested_slices(self.tasks, Halving().fractions, 0)[0]
        self.calls = 0

    def prompt_tasks(self):
        return list(self.tasks)

    def prompt_scores(self, merged, indices):
        self.calls += 1
        passed = set(self.first) | {next(i for i in range(36) if i not in self.first)} if self.calls == 1 else set()
        return [1.0 if i in passed else 0.0 for i in indices]

    def aggregate(self, values):
        scored = [v for v in values.values() if v is not None]
        return sum(scored) / len(scored), {"all": sum(scored) / len(scored)}

    def __call__(self, merged):
        return self.aggregate(dict(enumerate(self.prompt_scores(merged, range(36)))))[0]


def test_an_estimate_below_the_metric_is_clamped_and_marked(base_sd):
    agents = dict(zip(TARGET, make_agents(base_sd, [0.3, 0.3, 0.3], scale=0.05)))
    result = search(agents, base=base_sd, evaluate=PassAt(), budget="2x", fidelity="halving", space=["ram_plus"])
    first, second = result.history[:2]
    assert first.score == pytest.approx(5 / 36) and not first.clamped
    assert second.stop == "race" and second.fidelity == 4 / 36 and second.clamped
    assert second.score == 0.0  # not 5/36 - 1
    table = result.table()
    row = next(line for line in table.splitlines() if line.startswith("  1 "))
    assert "0~c" in row
    assert "~c: an estimate outside the range of the per-prompt scores seen, clamped to that range" in table
    assert result.to_dict()["history"][1]["clamped"] is True


@pytest.fixture
def problem(base_sd):
    agents = dict(zip(TARGET, make_agents(base_sd, [0.3, 0.3, 0.3], scale=0.05)))
    targets = {
        "math": merge(agents, base=base_sd, method="ram", lambdas=TARGET),
        "code": merge(agents, base=base_sd, method="ram", lambdas={"coder": 2.5, "tools": 0.5, "memory": 2.0}),
    }
    return agents, base_sd, PromptEval(targets)


def test_a_stopped_row_marks_its_estimate_and_its_slice_scores(problem):
    agents, base, ev = problem
    result = search(agents, base=base, evaluate=ev, budget="6x", fidelity="halving")
    stopped = [t for t in result.history if t.fidelity < 1.0]
    assert stopped
    lines = result.table().splitlines()
    for t in stopped:
        row = lines[1 + t.index]
        assert f"{t.score:.6g}~" in row and t.se is None
        assert all(f"{v:.4g}~" in row for v in t.tasks.values())  # the slice's scores, marked
    for t in result.complete:
        assert "~" not in lines[1 + t.index].split("  ram_plus(")[0].split("  task_arith")[0]
    assert "its task columns are its scores on the slice it saw" in result.table()


def test_the_standard_error_by_hand_and_who_is_within_one(problem):
    agents, base, ev = problem
    result = search(agents, base=base, evaluate=ev, budget=8, space=["ram_plus", "task_arithmetic"])
    n = len(ev.tasks)
    for t in result.history:
        values = dict(enumerate(ev.prompt_scores(merge(agents, base=base, **t.candidate), range(n))))
        # 18 prompts, at most 20 groups: the jackknife leaves one prompt out at a time
        loo = [ev.aggregate({i: v for i, v in values.items() if i != j})[0] for j in range(n)]
        mean = sum(loo) / n
        assert t.se == pytest.approx(math.sqrt((n - 1) / n * sum((x - mean) ** 2 for x in loo)), rel=1e-9)
    # for the plain mean over prompts, the jackknife is the textbook stdev / sqrt(n)
    vals = {i: float(i % 3) for i in range(12)}
    mean_of = lambda v: (sum(v.values()) / len(v), {})  # noqa: E731
    assert standard_error(mean_of, vals, ["t"] * 12) == pytest.approx(statistics.stdev(vals.values()) / math.sqrt(12))
    best = result.best_trial
    best.se = abs(best.score - sorted(t.score for t in result.complete)[-2]) * 1.5  # the runner-up within one se
    close = within_one_se(result)
    assert close and all(t.score >= best.score - best.se for t in close)
    assert f"within one standard error of the winner (score >= {best.score - best.se:.6g}): #{close[0].index}" in (
        result.table()
    )
    best.se = 0.0
    assert within_one_se(result) == [] and "within one standard error" not in result.table()
