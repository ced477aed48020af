"""The generalist's scores in verl's own validation layout: ``ram/val-core/{data_source}/reward/mean@N`` and
``ram/val-aux/{data_source}/reward/std@N`` hold what verl's ``process_validation_metrics`` computes for the same
samples (skipped where verl cannot be imported)."""

from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("transformers")
metric_utils = pytest.importorskip("verl.trainer.ppo.metric_utils")

from ram_live.evaluate import rewards  # noqa: E402
from ram_live.integrations.metrics import evaluation_metrics  # noqa: E402

import evaluate_helpers as h  # noqa: E402
from evaluate_helpers import PROMPTS  # noqa: E402

SOURCES = ["gsm8k", "gsm8k", "math", "gsm8k", "code", "math", "gsm8k"]
TEXTS = [["aa", "", "a"], ["b", "a", "a"], ["a", "a", ""], ["", "", "x"], ["aaa", "a", "b"], ["ab", "", "a"]]
TEXTS.append(["x", "aa", ""])


def three_samples(merged, prompts, settings, seeds):
    return [TEXTS[PROMPTS.index(p)] for p in prompts]


def count_a(completions, **kwargs):
    return [float(c.count("a")) for c in completions]


def test_val_core_keys_hold_verls_own_numbers(tmp_path):
    rows = [{"prompt": p, "data_source": s} for p, s in zip(PROMPTS, SOURCES)]
    evaluate = rewards(rows, count_a, tokenizer=h.tokenizer(), samples=3, generate=three_samples, model=h.model(0))
    evaluate(h.model(0))
    ours = evaluation_metrics(evaluate, "verl")
    sources = [s for s in SOURCES for _ in range(3)]
    uids = [str(i) for i in range(len(PROMPTS)) for _ in range(3)]
    reward = [float(t.count("a")) for texts in TEXTS for t in texts]
    verl = metric_utils.process_validation_metrics(sources, uids, {"reward": reward})
    for source in set(SOURCES):
        # verl's trainer logs the core variable's mean@N (N the most samples) as val-core/{data_source}/{var}/{metric}
        key = f"val-core/{source}/reward/mean@3"
        assert ours[f"ram/{key}"] == pytest.approx(float(verl[source]["reward"]["mean@3"]), abs=1e-12), key
        assert ours[f"ram/val-aux/{source}/reward/prompts"] == SOURCES.count(source)
        # and the spread over each prompt's samples, val-aux/{data_source}/{var}/std@N
        key = f"val-aux/{source}/reward/std@3"
        assert ours[f"ram/{key}"] == pytest.approx(float(verl[source]["reward"]["std@3"]), abs=1e-12), key
        # best@n / worst@n (n = 2, 3): ours exact, verl's from 1,000 bootstrap resamples a prompt: equal within
        # four of verl's standard errors (its std over resamples / sqrt(1000))
        for n in (2, 3):
            for which in ("best", "worst"):
                section = "val-core" if which == "best" and n == 3 else "val-aux"
                theirs = verl[source]["reward"]
                error = float(theirs[f"{which}@{n}/std"]) / 1000**0.5
                got = ours[f"ram/{section}/{source}/reward/{which}@{n}/mean"]
                assert got == pytest.approx(float(theirs[f"{which}@{n}/mean"]), abs=4 * error + 1e-12), (n, which)


FOUR = [["aa", "", "a", "b"], ["b", "a", "a", "aaa"], ["a", "", "", "ab"], ["", "", "x", ""], ["aaa", "a", "b", "ba"]]
FOUR += [["ab", "", "a", "a"], ["x", "aa", "", "a"]]


def four_samples(merged, prompts, settings, seeds):
    return [FOUR[PROMPTS.index(p)] for p in prompts]


def count_a_or_none(completions, **kwargs):
    return [None if c == "" else float(c.count("a")) for c in completions]


def test_partly_scored_prompts_are_keyed_as_verl_keys_them():
    """k = 4 samples, some unscored: each prompt's m scored rewards give std@m, best@n and worst@n for n up to m,
    each key averaged over the prompts that have it, filed under val-core or val-aux by verl's own rule (the
    trainer's: best@N at a data source's most responses is core)."""
    rows = [{"prompt": p, "data_source": s} for p, s in zip(PROMPTS, SOURCES)]
    evaluate = rewards(rows, count_a_or_none, tokenizer=h.tokenizer(), samples=4, generate=four_samples)
    evaluate(h.model(0))
    logged = evaluation_metrics(evaluate, "verl")
    ours = {k: v for k, v in logged.items() if any(w in k for w in ("/std@", "/best@", "/worst@"))}
    sources = [s for s in SOURCES for _ in range(4)]
    uids = [str(i) for i in range(len(PROMPTS)) for _ in range(4)]
    verl = metric_utils.process_validation_metrics(sources, uids, {"reward": count_a_or_none(sum(FOUR, []))})
    expected = {}
    for source, var2metric in verl.items():
        for var, metric2val in var2metric.items():
            n_max = max(int(name.split("@")[-1].split("/")[0]) for name in metric2val)
            for name, value in metric2val.items():
                if not name.startswith(("std@", "best@", "worst@")):
                    continue
                core = name.startswith(("mean", "maj", "best")) and f"@{n_max}" in name
                expected[f"ram/{'val-core' if core else 'val-aux'}/{source}/{var}/{name}"] = float(value)
    assert sorted(ours) == sorted(expected) and any("std@3" in k for k in ours) and any("std@4" in k for k in ours)
    for key, value in expected.items():
        if "/std@" in key:
            assert ours[key] == pytest.approx(value, abs=1e-12), key
        else:  # verl's bootstrap: within four of its standard errors
            spread = expected[key.rsplit("/", 1)[0] + "/std"]
            assert ours[key] == pytest.approx(value, abs=4 * spread / 1000**0.5 + 1e-12), key


def test_best_and_worst_are_what_verls_bootstrap_converges_to():
    """verl's own bootstrap_metric with many resamples converges to resampled_extreme's exact values."""
    from ram_live.integrations.metrics import resampled_extreme

    data = [1.0, 0.0, 3.0, 3.0, 2.0]
    for n in (2, 4, 5):
        (best, best_std), (worst, worst_std) = metric_utils.bootstrap_metric(
            data, n, [np.max, np.min], n_bootstrap=200_000, seed=7
        )
        assert resampled_extreme(data, n, largest=True) == pytest.approx((best, best_std), abs=0.01)
        assert resampled_extreme(data, n, largest=False) == pytest.approx((worst, worst_std), abs=0.01)
