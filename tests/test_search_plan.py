"""ram_live.selection.plan and the search's progress line: what a budget buys, equal to what the search then
spends (full and raced), and the line on a terminal (log lines elsewhere, nothing with progress=False)."""

from __future__ import annotations

import io
import logging
import math

import pytest

from ram_live import ConfigError, merge, search
from ram_live.progress import SearchProgress
from ram_live.selection.fidelity import MIN_RACE_PROMPTS, Halving, nested_slices
from ram_live.selection.plan import SearchPlan

from conftest import make_agents
from search_evals import TARGET, PromptEval

pytestmark = pytest.mark.filterwarnings("ignore::ram_live.ExtrapolationWarning")


class Sampled(PromptEval):
    """A prompt evaluation that says it draws 4 completions a prompt (as rewards(samples=4) does)."""

    class settings:
        samples = 4


@pytest.fixture
def problem(base_sd):
    agents = dict(zip(TARGET, make_agents(base_sd, [0.3, 0.3, 0.3], scale=0.05)))
    targets = {
        "math": merge(agents, base=base_sd, method="ram", lambdas=TARGET),
        "code": merge(agents, base=base_sd, method="ram", lambdas={"coder": 2.5, "tools": 0.5, "memory": 2.0}),
    }
    return agents, base_sd, Sampled(targets)


class FakeTTY(io.StringIO):
    def isatty(self):
        return True


def test_the_full_plan_is_what_the_search_spends(problem):
    agents, base, ev = problem
    n = len(ev.tasks)
    plan = search(agents, base=base, evaluate=ev, budget="7x", plan=True, seconds_per_candidate=2.5)
    assert isinstance(plan, SearchPlan) and ev.calls == []  # nothing scored
    assert (plan.prompts, plan.samples) == (n, 4)
    assert plan.full.candidates == (7, 7) and plan.full.prompt_evaluations == (7 * n, 7 * n)
    assert plan.full.generations == (7 * n * 4, 7 * n * 4) and plan.full.seconds == (17.5, 17.5)
    result = search(agents, base=base, evaluate=ev, budget="7x", progress=False)
    prompts = sum(len(c) for c in ev.calls)
    assert len(result.history) == 7 and result.spent == 7 and prompts == 7 * n
    assert "full     7 candidates, spent 7, 126 prompt-evaluations, 504 generations, about 18 s" in plan.text()
    # a budget in candidates, a plain callable: candidates only
    plain = search(agents, base=base, evaluate=lambda m: ev(m), budget=5, plan=True)
    assert plain.full.candidates == (5, 5) and plain.full.prompt_evaluations is None and plain.raced is None
    assert "plain callable" in plain.note
    assert len(search(agents, base=base, evaluate=lambda m: ev(m), budget=5, progress=False).history) == 5


@pytest.mark.parametrize("budget", ["6x", "9.5x"])
def test_the_raced_plan_bounds_what_the_search_spends(problem, budget):
    agents, base, ev = problem
    n, units = len(ev.tasks), float(budget[:-1])
    plan = search(agents, base=base, evaluate=ev, budget=budget, fidelity="halving", plan=True)
    slices = nested_slices(ev.tasks, Halving().fractions, 0)
    assert plan.raced.slices == tuple(len(s) for s in slices) == (2, 6, 18)
    # by hand: at least floor(B) candidates (all on every prompt); at most one reference on every prompt and the
    # rest each on the smallest slice the race stops on (6 of 18 prompts: the first, of 2, is below
    # MIN_RACE_PROMPTS), started while 18 prompts are left
    assert MIN_RACE_PROMPTS == 4
    most = 1 + math.floor((units - 2) * n / 6) + 1
    assert plan.raced.candidates == (math.floor(units), most)
    assert plan.raced.prompt_evaluations == (math.floor((units - 1) * n) + 1, math.floor(units * n))
    assert plan.raced.generations == tuple(4 * p for p in plan.raced.prompt_evaluations)
    result = search(agents, base=base, evaluate=ev, budget=budget, fidelity="halving", progress=False)
    prompts = sum(len(c) for c in ev.calls)
    assert prompts == round(result.spent * n)
    lo, hi = plan.raced.prompt_evaluations
    assert lo <= prompts <= hi
    assert plan.raced.candidates[0] <= len(result.history) <= plan.raced.candidates[1]
    assert len(result.history) > math.floor(units)  # the race stopped some early: more candidates than full


def test_a_budget_in_candidates_plans_the_race_as_the_same_prompt_budget(problem):
    agents, base, ev = problem
    plan = search(agents, base=base, evaluate=ev, budget=6, plan=True)
    again = search(agents, base=base, evaluate=ev, budget="6x", plan=True)
    assert plan.raced == again.raced and "budget='6x'" in plan.note
    assert plan.to_dict()["full"]["candidates"] == (6, 6)


def test_plan_errors(problem):
    agents, base, ev = problem
    for bad in (0, -1, math.inf, math.nan, "2"):
        with pytest.raises(ConfigError, match="seconds_per_candidate must be a finite number of seconds > 0"):
            search(agents, base=base, evaluate=ev, plan=True, seconds_per_candidate=bad)
    with pytest.raises(ConfigError, match="without plan=True"):
        search(agents, base=base, evaluate=ev, seconds_per_candidate=3)
    with pytest.raises(ConfigError, match="plan must be True or False"):
        search(agents, base=base, evaluate=ev, plan="yes")
    with pytest.raises(ConfigError, match="budget must be"):
        search(agents, base=base, evaluate=ev, budget="x", plan=True)


def test_the_progress_line_on_a_terminal(problem, monkeypatch):
    agents, base, ev = problem
    tty = FakeTTY()
    monkeypatch.setattr("sys.stderr", tty)
    result = search(agents, base=base, evaluate=ev, budget="4x", fidelity="halving", space=["ram_plus", "lambdas"])
    lines = tty.getvalue().split("\r")[1:]
    assert len(lines) == len(result.history) + 1
    for i, (line, t) in enumerate(zip(lines, result.history)):
        spent = sum(u.fidelity for u in result.history[: i + 1])
        complete = [u for u in result.history[: i + 1] if u.complete]
        best = max(complete, key=lambda u: (u.score, -u.index))
        assert line.startswith(
            f"[search] {i + 1} scored  spent {spent:.3g}x/4x ({round(spent * 18)}/72 prompts)  "
            f"best {best.score:.4g} (#{best.index})  "
        )
        assert " s/candidate  " in line and line.endswith(f"#{t.index} {t.label()}\x1b[K"[:200])
    assert lines[-1].startswith(f"[search] {len(result.history)} candidates scored in ") and lines[-1].endswith("\n")


def test_the_progress_line_is_a_log_off_a_terminal_and_silent_with_false(problem, monkeypatch, caplog):
    agents, base, ev = problem
    plain, tty = io.StringIO(), FakeTTY()
    monkeypatch.setattr("sys.stderr", plain)
    caplog.set_level(logging.INFO, logger="ram_live.progress")
    search(agents, base=base, evaluate=ev, budget=3)
    assert plain.getvalue() == ""  # no line drawn: plain log lines instead (tests/test_progress.py)
    # the start, the first, and the end
    assert [r.getMessage().split()[1] for r in caplog.records] == ["started:", "1", "3"]
    monkeypatch.setattr("sys.stderr", tty)
    search(agents, base=base, evaluate=ev, budget=3, progress=False)
    assert tty.getvalue() == ""
    stream = io.StringIO()  # True, or a SearchProgress told to draw: wherever it goes
    result = search(agents, base=base, evaluate=lambda m: ev(m), budget=3, progress=SearchProgress(stream, live=True))
    assert stream.getvalue().count("\r") == 4 and "spent 3/3 candidates" in stream.getvalue()
    assert len(result.history) == 3
    seen = []
    search(agents, base=base, evaluate=ev, budget="3x", fidelity="halving", progress=seen.append)
    assert seen and all(t.tasks is not None for t in seen)  # a callable sees each trial complete
    with pytest.raises(ConfigError, match="progress must be None, True, False"):
        search(agents, base=base, evaluate=ev, budget=3, progress=3)
