"""Hostile budgets and plans (ram_live/selection/fidelity.py's parse_budget, ram_live/selection/plan.py, the
evaluation's metric and samples): ConfigErrors naming the argument, never a raw OverflowError or ValueError; a
plan whose ranges stay in order at any accepted budget; ``--plan --json`` prints valid JSON or refuses."""

from __future__ import annotations

import json
import math
import os
import sys
from pathlib import Path

import pytest
from safetensors.torch import save_file

from ram_live import search
from ram_live.cli import main
from ram_live.errors import ConfigError
from ram_live.evaluate import rewards
from ram_live.selection.fidelity import MAX_BUDGET, MIN_RACE_PROMPTS

sys.path.insert(0, str(Path(__file__).parents[1]))
import evaluate_helpers as h  # noqa: E402


@pytest.fixture
def inputs(base_sd):
    return {"a": {k: v + 1 for k, v in base_sd.items()}, "b": {k: v * 2 for k, v in base_sd.items()}}, base_sd


def plain(merged):
    return 0.0


@pytest.mark.parametrize(
    "budget, why",
    [
        (10**400, "is beyond what a search can spend"),
        (MAX_BUDGET + 1, "is beyond what a search can spend"),
        ("1e400x", "is beyond what a search can spend"),
        ("9" * 5000 + "x", "is beyond what a search can spend"),
        (-(10**5000), "budget must be an int >= 1"),
        (float("inf"), "budget must be an int >= 1"),
        ("nanx", "budget must be an int >= 1"),
    ],
    ids=["10**400", "max+1", "1e400x", "5000-digits-x", "-10**5000", "inf", "nanx"],
)
@pytest.mark.parametrize("plan", [False, True])
def test_a_budget_beyond_reason_is_a_config_error_naming_it(inputs, budget, why, plan):
    agents, base = inputs
    with pytest.raises(ConfigError, match=why) as caught:
        search(agents, base=base, evaluate=plain, budget=budget, plan=plan)
    assert "budget" in str(caught.value) and len(str(caught.value)) < 300


@pytest.mark.parametrize("budget", [10**16, "10000000000000000x", MAX_BUDGET, 7, "2.5x"])
def test_the_raced_plan_counts_exactly_at_any_budget(inputs, tok, budget):
    agents, base = inputs
    # 21 prompts: the race's first slice holds MIN_RACE_PROMPTS, so the plan has a raced row
    evaluate = rewards(h.PROMPTS * 3, h.count_a, tokenizer=tok, samples=2, model=h.model(0))
    plan = search(agents, base=base, evaluate=evaluate, budget=budget, plan=True)
    n, units = plan.prompts, int(budget) if isinstance(budget, int) else float(budget[:-1])
    raced = plan.raced
    assert raced is not None
    # the smallest slice a candidate can be stopped on
    smallest = min(s for s in raced.slices[:-1] if s >= MIN_RACE_PROMPTS)
    assert n == 21 and smallest < n
    # more than N - 1 and at most N full evaluations' worth of prompts, counted in whole prompts
    full_n = math.floor(units * n)
    least, most = raced.prompt_evaluations
    assert least <= most == full_n
    if units == int(units):
        assert least == (int(units) - 1) * n + 1
        assert raced.candidates == (int(units), 1 + (int(units) - 2) * n // smallest + 1)
    assert raced.generations == (least * 2, most * 2)
    assert raced.candidates[0] <= raced.candidates[1]
    json.loads(json.dumps(plan.to_dict(), allow_nan=False))


def test_a_plan_whose_time_is_beyond_floats_range_is_refused(inputs):
    agents, base = inputs
    with pytest.raises(ConfigError, match="seconds_per_candidate=1e.308 .* beyond float's range"):
        search(agents, base=base, evaluate=plain, budget=60, plan=True, seconds_per_candidate=1e308)
    plan = search(agents, base=base, evaluate=plain, budget=60, plan=True, seconds_per_candidate=1e300)
    assert plan.full.seconds == (6e301, 6e301)


def run_cli(tmp_path, base_sd, *flags):
    paths = []
    for name, sd in (("base", base_sd), ("a", {k: v + 1 for k, v in base_sd.items()})):
        paths.append(tmp_path / f"{name}.safetensors")
        save_file(sd, str(paths[-1]))
    (tmp_path / "score_mod.py").write_text("def score(merged):\n    return 0.0\n")
    argv = ["search", f"a={paths[1]}", f"b={paths[1]}", "--base", str(paths[0]), "--eval", "score_mod:score"]
    cwd = os.getcwd()
    os.chdir(tmp_path)
    try:
        return main([*argv, *flags])
    finally:
        os.chdir(cwd)


def test_the_plan_command_prints_valid_json_or_refuses(tmp_path, base_sd, capsys):
    code = run_cli(tmp_path, base_sd, "--plan", "--json", "--seconds-per-candidate", "1e308")
    out, err = capsys.readouterr()
    assert code == 2 and out == "" and "seconds_per_candidate" in err and "Traceback" not in err
    code = run_cli(tmp_path, base_sd, "--plan", "--json", "--seconds-per-candidate", "1e300")
    out, err = capsys.readouterr()

    def refuse(constant):
        raise AssertionError(f"not JSON: {constant}")

    assert code == 0 and json.loads(out, parse_constant=refuse)["full"]["seconds"] == [6e301, 6e301]
    for budget in ("1" + "0" * 400, "1e400x", "-5"):
        code = run_cli(tmp_path, base_sd, "--plan", "--budget", budget)
        err = capsys.readouterr().err
        assert code == 2 and "budget" in err and "Traceback" not in err


@pytest.mark.parametrize(
    "options, why",
    [
        ({"samples": 2, "metric": "pass@" + "9" * 5000}, "needs 1 <= K <= samples"),
        ({"samples": 2, "metric": "pass@" + "0" * 5000 + "2"}, None),  # K = 2, written long: accepted
        ({"samples": 2, "metric": "mean@" + "9" * 5000}, "mean@k averages every sample"),
        ({"samples": 10**400}, "samples must be an int >= 1 and < 2\\*\\*31"),
        ({"samples": 2**31}, "samples must be an int >= 1 and < 2\\*\\*31"),
    ],
    ids=["pass@5000-digits", "pass@0002", "mean@5000-digits", "samples=10**400", "samples=2**31"],
)
def test_a_metric_or_sample_count_beyond_reason_is_a_config_error(tok, options, why):
    build = lambda: rewards(h.PROMPTS, h.count_a, tokenizer=tok, model=h.model(0), **options)  # noqa: E731
    if why is None:
        assert build().metric.name == "pass@2"
        return
    with pytest.raises(ConfigError, match=why) as caught:
        build()
    assert len(str(caught.value)) < 300
