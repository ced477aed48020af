"""Hostile input to the trainers' metric layouts (integrations/metrics.py): finite rewards however large never make
the metrics raise (a callback's logging would end training), and bad layouts or ``resampled_extreme`` arguments are
ConfigErrors naming them."""

from __future__ import annotations

import math
import statistics
import sys
from fractions import Fraction
from pathlib import Path

import numpy as np
import pytest

from ram_live.errors import ConfigError
from ram_live.evaluate import rewards
from ram_live.evaluate.moments import mean, std, weighted_moments
from ram_live.integrations.metrics import LAYOUTS, evaluation_metrics, logged_as, resampled_extreme

sys.path.insert(0, str(Path(__file__).parents[1]))
import evaluate_helpers as h  # noqa: E402
from evaluate_helpers import PROMPTS  # noqa: E402


def two_samples(merged, prompts, settings, seeds):
    return [["a", "b"] for _ in prompts]


@pytest.mark.parametrize("big", [1e200, 1.7e308])
@pytest.mark.parametrize("metric", ["mean@2", "pass@2"])
def test_huge_finite_rewards_never_raise_in_any_layout(tok, big, metric):
    def huge(completions, **kwargs):
        return [big if c == "a" else -big for c in completions]

    evaluate = rewards(PROMPTS, huge, tokenizer=tok, samples=2, metric=metric, generate=two_samples, model=h.model(0))
    evaluate(h.model(0))
    # every prompt's two rewards are +big and -big; 7 prompts: 14 rewards, mean 0
    spread = big * math.sqrt(14 / 13)  # their sample std, as TRL's eval_rewards/{f}/std and reward_std
    for layout in LAYOUTS:
        out = evaluation_metrics(evaluate, layout)
        assert out and all(isinstance(v, float) and not math.isnan(v) for v in out.values())
        prefix = {"verl": "ram/val-aux/rewards", "trl": "ram/eval_rewards", "lightning": "ram/val/rewards"}[layout]
        assert out[f"{prefix}/huge/mean"] == 0.0
        assert out[f"{prefix}/huge/std"] == pytest.approx(spread, rel=1e-12)
    trl = evaluation_metrics(evaluate, "trl")
    assert trl["ram/eval_reward_std"] == pytest.approx(spread, rel=1e-12)
    verl = evaluation_metrics(evaluate, "verl")
    # best of 2 draws from {-big, +big}: +big with probability 3/4; std sqrt(3/16) * 2 big; std@2 = np.std = big
    assert verl["ram/val-core/all/reward/best@2/mean"] == pytest.approx(big / 2, rel=1e-12)
    assert verl["ram/val-core/all/reward/best@2/std"] == pytest.approx(math.sqrt(3 / 16) * big * 2, rel=1e-12)
    assert verl["ram/val-aux/all/reward/std@2"] == pytest.approx(big, rel=1e-12)


def test_robust_moments_are_exact_and_overflow_to_inf_not_an_error():
    assert mean([1.7e308, 1.7e308, 1.7e308]) == pytest.approx(1.7e308, rel=1e-15)  # the plain sum is inf
    assert std([1.7e308, -1.7e308], ddof=0) == 1.7e308
    assert std([1.7e308, -1.7e308], ddof=1) == math.inf  # 1.7e308 * sqrt(2): beyond float's range
    assert std([1e-300, 3e-300], ddof=1) == pytest.approx(statistics.stdev([1e-300, 3e-300]), rel=1e-12)
    values = [0.1, 2.5, -3.0, 7.25]
    assert mean(values) == pytest.approx(statistics.fmean(values), rel=1e-15)
    assert std(values, ddof=1) == pytest.approx(statistics.stdev(values), rel=1e-15)
    assert math.isnan(mean([])) and math.isnan(std([1.0], ddof=1))
    assert math.isnan(mean([math.inf, -math.inf]))  # non-finite in: float arithmetic's answer, no error
    assert weighted_moments([0.25, 0.75], [-1e308, 1e308]) == (5e307, pytest.approx(math.sqrt(3 / 16) * 1e308 * 2))


@pytest.mark.parametrize("layout", [["trl"], ("verl",), None, 3, b"trl", "TRL"])
def test_a_layout_that_is_not_a_name_is_a_config_error(tok, layout):
    evaluate = rewards(PROMPTS, h.count_a, tokenizer=tok, samples=2, generate=two_samples, model=h.model(0))
    with pytest.raises(ConfigError, match="layout must be one of"):
        evaluation_metrics(evaluate, layout)
    with pytest.raises(ConfigError, match="layout must be one of"):
        logged_as(evaluate, layout)


def test_resampled_extreme_takes_any_sequence_of_numbers_and_any_draw_count():
    assert resampled_extreme(np.array([0.0, 1.0]), 2, largest=True) == resampled_extreme([0.0, 1.0], 2, True)
    assert resampled_extreme((Fraction(1, 2), np.float32(2.0)), np.int64(2), largest=False)[0] == 0.5 * 3 / 4 + 0.5
    assert resampled_extreme([1.0, -2.0, 3.0], 10**400, largest=True) == (3.0, 0.0)  # the maximum, surely
    assert resampled_extreme([1.0, -2.0, 3.0], 10**400, largest=False) == (-2.0, 0.0)
    mean_, std_ = resampled_extreme([1e308, -1e308], 2, largest=True)  # P(best = 1e308) = 3/4
    assert mean_ == pytest.approx(5e307, rel=1e-12) and std_ == pytest.approx(math.sqrt(3 / 16) * 1e308 * 2, rel=1e-12)


@pytest.mark.parametrize(
    "values, n, why",
    [
        ([None, 1.0], 2, "values must be finite numbers"),
        ([1.0, float("nan")], 2, "values must be finite numbers"),
        ([1.0, math.inf], 2, "values must be finite numbers"),
        (["1.0"], 2, "values must be finite numbers"),
        (3.0, 2, "values must be finite numbers"),
        ([10**400], 2, "values must be finite numbers"),
        (np.array([]), 2, "needs at least one value"),
        ([1.0], -(10**5000), "n must be an integer >= 1"),
        ([1.0], 2.0, "n must be an integer >= 1"),
        ([1.0], None, "n must be an integer >= 1"),
    ],
    ids=lambda v: type(v).__name__,
)
def test_resampled_extreme_refuses_what_is_not_rewards_or_a_draw_count(values, n, why):
    with pytest.raises(ConfigError, match=f"resampled_extreme: {why}"):
        resampled_extreme(values, n, largest=True)


@pytest.mark.parametrize("evaluation", [None, lambda model: 0.5, 3.0], ids=["None", "callable", "float"])
def test_metrics_of_what_is_not_a_rewards_evaluation_is_a_config_error(evaluation):
    with pytest.raises(ConfigError, match="evaluation_metrics needs a ram_live.evaluate.rewards evaluation"):
        evaluation_metrics(evaluation, "trl")
