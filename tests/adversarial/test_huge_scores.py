"""Finite rewards near float's limit through the evaluation and the search (ram_live/evaluate/moments.py, samples.py,
tasks.py, rewards.py; ram_live/selection/fidelity.py): a mean whose true value is finite is that value (two rewards
of -1.7e308 average to -1.7e308, not an overflow error), and the race's statistics never raise an OverflowError."""

from __future__ import annotations

import itertools
import math
import sys
from pathlib import Path

import pytest

from ram_live import search
from ram_live.evaluate import rewards
from ram_live.selection.fidelity import standard_error

sys.path.insert(0, str(Path(__file__).parents[1]))
import evaluate_helpers as h  # noqa: E402

BIG = 1.7e308


def huge(completions, **kwargs):
    return [BIG if c == "a" else -BIG for c in completions]


def test_a_prompt_whose_rewards_are_all_near_the_limit_scores_their_mean(tok):
    def same(merged, prompts, settings, seeds):
        return [["b", "b"] for _ in prompts]  # two rewards of -BIG each: their mean is -BIG

    evaluate = rewards(h.PROMPTS, huge, tokenizer=tok, samples=2, generate=same, model=h.model(0))
    assert evaluate(h.model(0)) == pytest.approx(-BIG, rel=1e-15)  # 7 prompts' mean, rounded once
    assert evaluate.per_prompt == [-BIG] * len(h.PROMPTS)  # the mean of two equal rewards, exact
    assert evaluate.metrics["reward/huge"] == pytest.approx(-BIG, rel=1e-15)


def test_task_means_and_the_weighted_objective_near_the_limit(tok):
    rows = [{"prompt": p, "data_source": s} for p, s in zip(h.PROMPTS, "xxyyyxy")]

    def split(merged, prompts, settings, seeds):
        return [["a", "a"] if i % 2 else ["b", "b"] for i, _ in enumerate(prompts)]

    for options in ({}, {"weights": {"x": 3.0, "y": 1.0}}):
        evaluate = rewards(rows, huge, tokenizer=tok, samples=2, generate=split, model=h.model(0), **options)
        score = evaluate(h.model(0))
        per_task = {t: [BIG if i % 2 else -BIG for i, s in enumerate("xxyyyxy") if s == t] for t in "xy"}
        by_hand = {t: math.fsum(v / 4 for v in vs) / len(vs) * 4 for t, vs in per_task.items()}
        assert evaluate.tasks == pytest.approx(by_hand, rel=1e-12)
        weights = options.get("weights", {"x": 1.0, "y": 1.0})
        expected = sum(weights[t] / sum(weights.values()) * by_hand[t] for t in "xy")
        assert math.isfinite(score) and score == pytest.approx(expected, rel=1e-12)


def test_the_jackknife_of_objectives_near_the_limit_is_a_number_or_none():
    values = {i: (BIG if i % 3 else -BIG) for i in range(30)}

    def mean_of(v):
        scored = [x for x in v.values() if x is not None]
        return math.fsum(x / 2 for x in scored) / len(scored) * 2, {}

    se = standard_error(mean_of, values, "a" * 30)
    assert se is None or (math.isfinite(se) and se > 0)
    # objectives of ±1e300: the squared deviations overflow a float, the jackknife's se does not: scaled by 1e300,
    # thetas are -1 (the group without prompt 0) and 1 (19 others), mean 0.9, se = sqrt(19/20 · 3.8) = 1.9
    spread = standard_error(lambda v: (1e300 if 0 in v else -1e300, {}), {i: 0.0 for i in range(40)}, "a" * 40)
    assert spread == pytest.approx(1.9e300, rel=1e-12)
    assert standard_error(lambda v: (BIG if 0 in v else -BIG, {}), {i: 0.0 for i in range(40)}, "a" * 40) is None


@pytest.mark.filterwarnings("ignore::UserWarning")
@pytest.mark.parametrize("fidelity, budget", [(None, 4), ("halving", "4x")])
def test_a_search_and_a_race_on_rewards_near_the_limit_end(tok, base_sd, fidelity, budget):
    base = h.model(0).state_dict()
    agents = {"a": {k: v + 0.01 for k, v in base.items()}, "b": {k: v * 1.01 for k, v in base.items()}}
    counter = itertools.count()

    def varying(merged, prompts, settings, seeds):  # each candidate's completions differ: scores differ
        c = next(counter)
        return [["a" if (c + i) % 2 else "b", "b"] for i, _ in enumerate(prompts)]

    evaluate = rewards(h.PROMPTS * 3, huge, tokenizer=tok, samples=2, generate=varying, model=h.model(0))
    result = search(agents, base=base, evaluate=evaluate, budget=budget, fidelity=fidelity, progress=False)
    assert result.scored and all(math.isfinite(t.score) for t in result.history if t.score is not None)
