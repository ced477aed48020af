"""ram_live.search: a synthetic problem with a known optimum, bit-exact reproduction, one statistics pass, one
reused output, the budget rule, errors."""

from __future__ import annotations

import json
import math
import sys
import warnings

import pytest
import torch
from safetensors.torch import save_file

import ram_live
from ram_live import ConfigError, ExtrapolationWarning, SearchError, merge, search
from ram_live.selection import from_json
from ram_live.selection.space import parse_space

from conftest import make_agents, module_of, snapshot

pytestmark = pytest.mark.filterwarnings("ignore::ram_live.ExtrapolationWarning")

TARGET = {"coder": 2.0, "tools": 0.5, "memory": 3.0}


@pytest.fixture
def problem(base_sd):
    agents = dict(zip(TARGET, make_agents(base_sd, [0.3, 0.3, 0.3], scale=0.05)))
    target = merge(agents, base=base_sd, method="ram", lambdas=TARGET)
    return agents, base_sd, target


def distance(merged, target) -> float:
    sd = merged.state_dict() if isinstance(merged, torch.nn.Module) else merged
    return -math.sqrt(sum(float(((sd[k].double() - target[k].double()) ** 2).sum()) for k in target))


def test_the_lambda_ascent_finds_the_optimum_exactly(problem):
    agents, base, target = problem
    with pytest.warns(ExtrapolationWarning):
        result = search(agents, base=base, evaluate=lambda m: distance(m, target), budget=40, space=["lambdas"])
    assert result.best == {"method": "ram", "lambdas": TARGET}
    assert result.best_score == 0.0
    assert len(result.history) <= 40 and result.history[0].candidate["lambdas"] == dict.fromkeys(TARGET, 1.0)


def test_the_default_space_finds_it_within_budget_and_beats_the_baselines(problem, monkeypatch):
    import ram_live.engine.run as engine
    import ram_live.methods.ram.method as ram_method

    agents, base, target = problem
    passes = []
    for module, name in ((engine, "statistics_pass"), (ram_method, "single_read_pass")):
        real = getattr(module, name)
        monkeypatch.setattr(module, name, lambda *a, _real=real, _n=name, **k: passes.append(_n) or _real(*a, **k))
    seen = []
    with pytest.warns(ExtrapolationWarning, match=r"scales an agent.s task vector by 2\.9\d* \(> 2\)"):
        # 70: task arithmetic's 3 probes (issue 24) take evaluations the λ ascent had at 60, where it now stops
        # short of TARGET (tools at 0.07); docs/search.md says what the probes cost a RAM-favourable search
        result = search(agents, base=base, evaluate=lambda m: distance(m, target), budget=70, progress=seen.append)
    assert seen == result.history  # progress got every trial, in order
    # one count for every RAM-family candidate of one activity rule: here the first, and each other rule the
    # activity moves try on a RAM+ candidate (they need counts of their own; the shared-rule moves do not)
    other_rules = [
        t
        for t in result.history
        if t.family == "activity"
        and t.method == "ram_plus"
        and (t.options.get("eps", 1e-5) != 1e-5 or t.options.get("activity", "abs") != "abs")
    ]
    rules = {(t.options.get("eps", 1e-5), t.options.get("activity", "abs")) for t in other_rules}
    assert len(passes) == result.statistics_passes == 1 + len(rules)
    # every arm screened; RAM leads after the screen and gets most of the budget (docs/search.md)
    assert set(result.budgets) == {"ram", "task_arithmetic", "ties", "dare_ties"}
    assert sum(result.budgets.values()) == 70 and result.budgets["ram"] > 35
    assert {t.family for t in result.history} >= {"ram_plus", "shared_weights", "task_arithmetic", "ties", "dare_ties"}
    best = result.best
    assert best["method"] == "ram" and best["lambdas"] == pytest.approx(TARGET, abs=0.1)
    assert result.best_score > result.best_baseline.score and result.margin() > 0
    assert result.best_trial.extrapolation == pytest.approx(max(best["lambdas"].values()))
    grid = [t.score for t in result.history if t.family == "ram_plus"]
    # 14 in the grid; no ρ exceeds 2 here, so the capped α = 2 candidates have the uncapped ones' λ: not merged
    # again (the same bits), their evaluations go to the λ ascent; the last, the sign-elected shared region, is
    # merged (its shared entries differ)
    assert len(grid) == 8 and result.best_score > max(grid)
    assert [t.options for t in result.history if t.family == "ram_plus" and t.phase == "screen"][-1] == {
        "r": 0.1,
        "alpha": 2.0,
        "shared": "sign",
    }
    assert {t.phase for t in result.history if t.family == "ram_plus"} == {"screen", "refine"}


@pytest.mark.parametrize("kind", ["state_dict", "module", "path"])
def test_every_trial_reproduces_bit_for_bit_and_the_output_is_reused(problem, kind, tmp_path):
    agents, base, target = problem
    if kind == "module":
        base_in = module_of(base)
        agents_in = {n: module_of(a) for n, a in agents.items()}
    elif kind == "path":
        base_in = _save(tmp_path / "base", base)
        agents_in = {n: _save(tmp_path / n, a) for n, a in agents.items()}
    else:
        base_in, agents_in = base, agents
    before = {n: snapshot(m) for n, m in agents_in.items() if not isinstance(m, type(tmp_path))}
    before_base = snapshot(base_in) if kind != "path" else None
    outputs, objects = [], []

    def evaluate(merged):
        objects.append(merged)
        outputs.append(snapshot(merged))
        return distance(merged, target)

    result = search(agents_in, base=base_in, evaluate=evaluate, budget=14, seed=3)
    assert len(outputs) == len(result.history) == 14
    want_type = torch.nn.Module if kind == "module" else dict
    assert all(isinstance(o, want_type) for o in objects)
    if kind == "module":
        assert all(o is objects[0] for o in objects)  # one scratch module, written again by every candidate
    else:  # a new dict per candidate over one set of reused tensors
        assert len({id(o) for o in objects}) == len(objects)
        assert all(o[k] is objects[0][k] for o in objects for k in o)
    assert objects[0] is not base_in
    for trial, out in zip(result.history, outputs):
        again = merge(agents_in, base=base_in, **trial.candidate)
        again = again.state_dict() if isinstance(again, torch.nn.Module) else again
        assert sorted(again) == sorted(out)
        for key in out:
            assert torch.equal(out[key], again[key]), (trial.index, trial.label(), key)
    best = merge(agents_in, base=base_in, **result.best)
    best = best.state_dict() if isinstance(best, torch.nn.Module) else best
    assert all(torch.equal(best[k], outputs[result.best_trial.index][k]) for k in best)
    for name, state in before.items():  # the inputs are untouched
        assert all(torch.equal(state[k], snapshot(agents_in[name])[k]) for k in state)
    if before_base is not None:
        assert all(torch.equal(before_base[k], snapshot(base_in)[k]) for k in before_base)


def _save(folder, sd):
    folder.mkdir()
    save_file({k: v.contiguous() for k, v in sd.items()}, str(folder / "model.safetensors"))
    return folder


def test_the_same_seed_gives_the_same_history(problem):
    agents, base, target = problem

    def run(seed):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", ExtrapolationWarning)
            r = search(agents, base=base, evaluate=lambda m: distance(m, target), budget=30, seed=seed)
        return [(t.family, t.candidate, t.score) for t in r.history]

    first = run(7)
    assert run(7) == first
    other = run(8)
    assert other != first  # the seed orders the ascents and seeds DARE
    assert any(c.get("seed") == 8 for _, c, _ in other if c["method"] == "dare_ties")


def test_confirm_scores_the_top_candidates(problem):
    agents, base, target = problem
    calls = []

    def confirm(merged):
        calls.append(1)
        return 2 * distance(merged, target)

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ExtrapolationWarning)
        result = search(
            agents, base=base, evaluate=lambda m: distance(m, target), budget=10, confirm=confirm, confirm_top=2
        )
    confirmed = [t for t in result.history if t.confirm_score is not None]
    top = sorted(result.history, key=lambda t: -t.score)[:2]
    assert len(calls) == 2 and confirmed == sorted(top, key=lambda t: t.index)
    assert all(t.confirm_score == pytest.approx(2 * t.score) for t in confirmed)
    assert "confirm" in result.table()


def test_results_as_json_table_and_plot(problem, tmp_path):
    agents, base, target = problem
    result = search(
        agents,
        base=base,
        evaluate=lambda m: distance(m, target),
        budget=4,
        space={"ram_plus": {"r": [0.5, 1.0], "alpha": [math.inf]}, "ties": {"density": [0.5]}},
    )
    assert [t.candidate for t in result.history] == [  # screening one each, then the leader's rest
        {"method": "ram_plus", "r": 0.5, "alpha": math.inf},
        {"method": "ties", "density": 0.5},
        {"method": "ram_plus", "r": 1.0, "alpha": math.inf},
    ]
    data = json.loads(json.dumps(result.to_dict(), allow_nan=False))
    assert data["history"][0]["options"]["alpha"] == "inf"
    assert from_json(data["best"]) == result.best
    assert len(data["history"]) == 3 and data["best_baseline"] == {"method": "ties", "density": 0.5}
    assert [h["phase"] for h in data["history"]] == ["screen", "screen", "refine"]
    table = result.table()
    assert "best:" in table and "best baseline: ties(density=0.5)" in table
    png = result.plot(tmp_path / "search.png")
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    result.save(tmp_path / "out")
    assert json.loads((tmp_path / "out" / "search.json").read_text())["best_score"] == result.best_score


def test_explicit_candidates_and_a_single_side(problem):
    agents, base, target = problem
    space = [{"method": "ram", "lambdas": TARGET}, {"method": "task_arithmetic", "scale": 0.5}, "ram_plus"]
    result = search(agents, base=base, evaluate=lambda m: distance(m, target), budget=3, space=space)
    assert [t.family for t in result.history] == ["explicit:ram", "explicit:baseline", "ram_plus"]
    assert result.best == space[0] and result.best_score == 0.0
    assert result.budgets == {"explicit": 2, "ram": 1}


def test_errors(problem):
    agents, base, target = problem

    def boom(merged):
        raise ValueError("no GPU")

    with pytest.raises(
        SearchError,
        match=r"evaluate raised ValueError on candidate #0 ram_plus\(r=0.1, "
        r"alpha=2.0\): no GPU",
    ) as info:
        search(agents, base=base, evaluate=boom, budget=3)
    assert isinstance(info.value.__cause__, ValueError)
    assert info.value.candidate == {"method": "ram_plus", "r": 0.1, "alpha": 2.0}
    import numpy as np

    for bad in (
        math.nan,
        math.inf,
        "0.5",
        None,
        torch.tensor([1.0, 2.0]),
        10**400,
        -(10**400),
        True,
        np.array([1.0, 2.0]),
        np.float64("nan"),
        complex(1, 0),
        b"1",
    ):
        with pytest.raises(SearchError, match="must return a finite number"):
            search(agents, base=base, evaluate=lambda m, b=bad: b, budget=2)
    for budget in (0, -1, 1.5, True, "60"):
        with pytest.raises(ConfigError, match="budget must be an int >= 1"):
            search(agents, base=base, evaluate=lambda m: 0.0, budget=budget)
    bad_spaces = [
        (["nope"], "unknown family 'nope'"),
        ({"ties": {"densty": [0.5]}}, r"space entry 'ties'\[0\]: unknown option\(s\) 'densty'"),
        ({"ties": {"density": 0.5}}, r"space\['ties'\]\['density'\] must be a non-empty list"),
        ([{"r": 0.1}], r"space\[0\] = \{'r': 0.1\}: a candidate needs a 'method'"),
        ([{"method": "ram_plus", "r": -1}], r"space entry \[0\]: .*r must be >= 0"),
        ([{"method": "nope"}], r"space entry \[0\]: unknown merge method 'nope'"),
        ({"lambdas": {"stp": 1}}, r"space\['lambdas'\]: unknown setting"),
        ({"activity": [{"r": 1.0}]}, r"only eps, activity, shared change"),
        ("ram_plus", "space must be None, a list"),
    ]
    for space, message in bad_spaces:
        with pytest.raises(ConfigError, match=message):
            search(agents, base=base, evaluate=lambda m: 0.0, budget=3, space=space)
    with pytest.raises(ConfigError, match="evaluate must be a callable"):
        search(agents, base=base, evaluate=None)


def test_a_candidate_whose_merge_overflows_is_recorded_not_fatal():
    base = {"w": torch.zeros(4, dtype=torch.float16)}
    agents = {
        "a": {"w": torch.tensor([30000.0, 0, 0, 0], dtype=torch.float16)},
        "b": {"w": torch.tensor([0, 1.0, 0, 0], dtype=torch.float16)},
    }
    space = [
        {"method": "ram"},
        {"method": "ram", "lambdas": {"a": 4.0, "b": 1.0}},
        {"method": "ram", "lambdas": {"a": 1.0, "b": 2.0}},
    ]
    result = search(agents, base=base, evaluate=lambda m: float(m["w"][1]), budget=3, space=space)
    assert [t.score for t in result.history] == [1.0, None, 2.0]
    assert "overflows" in result.history[1].error and result.best == space[2]


def test_exported_from_the_package():
    assert ram_live.search is search and "search" in ram_live.__all__
    assert issubclass(SearchError, ram_live.RamLiveError) and issubclass(ExtrapolationWarning, UserWarning)
    assert sys.modules["ram_live.selection.run"].search is search


def test_a_progress_hook_and_buffers_an_evaluation_changes(problem):
    """A ProgressHook gets one line per trial; BatchNorm running stats the evaluation updates in the scratch module
    are the base's again for the next candidate (each merge copies the buffers), so every trial is still the
    merge that merge(**candidate) makes."""
    import io

    from ram_live.progress import TerminalProgress

    torch.manual_seed(0)
    base = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.BatchNorm1d(8))
    agents = {}
    for i, name in enumerate(("a", "b")):
        agents[name] = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.BatchNorm1d(8))
        agents[name].load_state_dict(base.state_dict())
        with torch.no_grad():
            agents[name][0].weight[i] += 0.5
    x = torch.randn(16, 8)
    states = []

    def evaluate(module):
        states.append(snapshot(module))
        module.train()
        module(x)  # changes the scratch module's running statistics
        return -float(module[0].weight.detach().sum())

    stream = io.StringIO()
    result = search(
        agents,
        base=base,
        evaluate=evaluate,
        budget=6,
        progress=TerminalProgress(stream),
        space=["ram_plus", "task_arithmetic"],
    )
    lines = stream.getvalue().splitlines()  # one update per trial: plain lines into a stream that is no terminal
    assert lines[0].startswith("[search] 1/6 tensors") and lines[-1].startswith(f"[search] {len(result.history)}/6 ")
    for trial, state in zip(result.history, states):
        again = merge(agents, base=base, **trial.candidate).state_dict()
        assert all(torch.equal(state[k], again[k]) for k in state), trial.label()
    assert torch.equal(states[-1]["1.running_mean"], base.state_dict()["1.running_mean"])


def test_space_settings_are_parsed():
    fams = parse_space({"lambdas": {"step": 0.5, "min_step": 0.1}, "activity": [{"eps": 1e-3}]})
    assert fams[0].settings == {"step": 0.5, "min_step": 0.1} and fams[1].grid == [{"eps": 1e-3}]


def test_candidates_of_equal_effect_are_merged_once(problem):
    agents, base, target = problem
    calls = []
    space = [
        {"method": "ram_plus", "r": 0.0},
        {"method": "ram"},
        {"method": "ram_plus_soft", "r": 0.0},
        {"method": "ram", "lambdas": dict.fromkeys(TARGET, 1.0)},
        {"method": "ram", "eps": 1e-3},
    ]
    result = search(agents, base=base, evaluate=lambda m: calls.append(1) or distance(m, target), budget=5, space=space)
    assert [t.candidate for t in result.history] == [space[0], space[4]]  # λ = 1 four ways: plain RAM once
    assert len(calls) == 2


def test_scores_of_every_real_kind_are_taken_as_their_value(problem):
    import numpy as np
    from fractions import Fraction

    agents, base, _ = problem
    for good, want in (
        (np.float64(0.25), 0.25),
        (np.int64(3), 3.0),
        (np.array(0.5), 0.5),
        (np.array([0.5]), 0.5),
        (torch.tensor(1.5), 1.5),
        (torch.tensor([2.5]), 2.5),
        (Fraction(1, 4), 0.25),
        (10**300, 1e300),
    ):
        result = search(agents, base=base, evaluate=lambda m, g=good: g, budget=1)
        assert result.best_score == want, good


def test_explicit_candidates_with_importance_tensors_are_keyed_by_the_object(problem):
    agents, base, target = problem
    imps = {n: {k: torch.rand_like(v) for k, v in sd.items()} for n, sd in agents.items()}
    space = [{"method": "ram", "importance": imps}, {"method": "ram", "importance": imps}, {"method": "ram"}]
    result = search(agents, base=base, evaluate=lambda m: distance(m, target), budget=3, space=space)
    assert len(result.history) == 2  # the repeat of the same mapping is a repeat
    again = merge(agents, base=base, **result.history[0].candidate)
    assert result.history[0].score == distance(again, target)
