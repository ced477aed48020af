"""The generalist's evaluation in the trainer's own layout (ram_live/integrations/metrics.py): the keys and their
numbers by hand, and the real Lightning Trainer logging them."""

from __future__ import annotations

import math
import statistics

import pytest
import torch

from ram_live.errors import ConfigError
from ram_live.evaluate import rewards
from ram_live.integrations.metrics import LAYOUTS, evaluation_metrics, logged_as, resampled_extreme

import evaluate_helpers as h
from evaluate_helpers import PROMPTS

SOURCES = ["gsm8k", "gsm8k", "math", "gsm8k", "code", "math", "gsm8k"]
# prompt i's two samples; count_a scores each by its number of a's, passes (pass@k) from 1.0
TEXTS = [["aa", ""], ["b", "a"], ["a", "a"], ["", ""], ["aaa", "a"], ["ab", ""], ["x", "aa"]]


def two_samples(merged, prompts, settings, seeds):
    return [TEXTS[PROMPTS.index(p)] for p in prompts]


def count_a(completions, **kwargs):
    return [float(c.count("a")) for c in completions]


def is_short(completions, **kwargs):
    return [float(len(c) < 2) for c in completions]


def rows():
    return [{"prompt": p, "data_source": s} for p, s in zip(PROMPTS, SOURCES)]


def by_hand(metric):
    per_prompt = []
    for texts in TEXTS:
        counts = [float(t.count("a")) + float(len(t) < 2) for t in texts]
        if metric == "mean@2":
            per_prompt.append(sum(counts) / 2)
        else:  # pass@2 with threshold 1: a prompt passes when either sample reaches 1
            per_prompt.append(1.0 if max(counts) >= 1.0 else 0.0)
    tasks = {}
    for s, v in zip(SOURCES, per_prompt):
        tasks.setdefault(s, []).append(v)
    return tasks


@pytest.mark.parametrize("metric", ["mean@2", "pass@2"])
def test_every_layout_names_the_metric_and_gives_each_tasks_std_and_prompts(tok, metric):
    evaluate = rewards(
        rows(), [count_a, is_short], tokenizer=tok, samples=2, metric=metric, generate=two_samples, model=h.model(0)
    )
    score = evaluate(h.model(0))
    tasks = by_hand(metric)
    assert score == pytest.approx(sum(sum(v) / len(v) for v in tasks.values()) / 3, abs=1e-12)
    rewards_of = {"count_a": [float(t.count("a")) for ts in TEXTS for t in ts]}
    rewards_of["is_short"] = [float(len(t) < 2) for ts in TEXTS for t in ts]

    verl = evaluation_metrics(evaluate, "verl")
    assert verl[f"ram/val-core/reward/{metric}"] == score
    for task, values in tasks.items():
        assert verl[f"ram/val-core/{task}/reward/{metric}"] == pytest.approx(sum(values) / len(values), abs=1e-12)
        assert verl[f"ram/val-aux/{task}/reward/{metric}/std"] == pytest.approx(statistics.pstdev(values), abs=1e-12)
        assert verl[f"ram/val-aux/{task}/reward/prompts"] == len(values)
    for func, values in rewards_of.items():
        assert verl[f"ram/val-aux/rewards/{func}/mean"] == pytest.approx(statistics.mean(values), abs=1e-12)
        assert verl[f"ram/val-aux/rewards/{func}/std"] == pytest.approx(statistics.stdev(values), abs=1e-12)
    # verl's std@2: per task, the mean over its prompts of each prompt's two weighted rewards' np.std
    combined = [[float(t.count("a")) + float(len(t) < 2) for t in texts] for texts in TEXTS]
    spread = {}
    for s, pair in zip(SOURCES, combined):
        spread.setdefault(s, []).append(statistics.pstdev(pair))
    for task, stds in spread.items():
        assert verl[f"ram/val-aux/{task}/reward/std@2"] == pytest.approx(statistics.mean(stds), abs=1e-12)
    # best@2 / worst@2 by hand: of two draws from (x, y), x <= y, the best is y but for the 1 in 4 draws x, x
    best, worst = {}, {}
    for s, pair in zip(SOURCES, combined):
        x, y = sorted(pair)
        best.setdefault(s, []).append(((x + 3 * y) / 4, (3 / 16) ** 0.5 * (y - x)))
        worst.setdefault(s, []).append(((3 * x + y) / 4, (3 / 16) ** 0.5 * (y - x)))
    for task in best:
        for i, stat in enumerate(("mean", "std")):
            want_best = statistics.mean(v[i] for v in best[task])
            want_worst = statistics.mean(v[i] for v in worst[task])
            assert verl[f"ram/val-core/{task}/reward/best@2/{stat}"] == pytest.approx(want_best, abs=1e-12)
            assert verl[f"ram/val-aux/{task}/reward/worst@2/{stat}"] == pytest.approx(want_worst, abs=1e-12)
    assert len(verl) == 1 + 8 * 3 + 2 * 2

    trl = evaluation_metrics(evaluate, "trl")
    assert trl[f"ram/eval_reward/{metric}"] == score
    # TRL's eval_reward: the mean over the completions of the weighted sum of the reward functions, whatever the
    # metric (here 14 completions, both functions of weight 1)
    flat = [float(t.count("a")) + float(len(t) < 2) for ts in TEXTS for t in ts]
    assert trl["ram/eval_reward"] == pytest.approx(sum(flat) / 14, abs=1e-12)
    assert trl["ram/eval_tasks/math/prompts"] == 2.0 and f"ram/eval_tasks/code/{metric}/std" in trl
    assert trl["ram/eval_rewards/count_a/std"] == verl["ram/val-aux/rewards/count_a/std"]
    # TRL's reward_std (every completion's weighted reward, sample std) and frac_reward_zero_std (prompts whose
    # two rewards are equal: prompts 2, 3 and 5 of 7)
    flat = [r for pair in combined for r in pair]
    assert trl["ram/eval_reward_std"] == pytest.approx(statistics.stdev(flat), abs=1e-12)
    assert trl["ram/eval_frac_reward_zero_std"] == pytest.approx(3 / 7, abs=1e-12)
    assert len(trl) == 4 + 3 * 3 + 2 * 2

    light = evaluation_metrics(evaluate, "lightning")
    assert light[f"ram/val/reward/{metric}"] == score and light["ram/val/gsm8k/reward/prompts"] == 4.0
    assert light["ram/val/math/reward/std@2"] == verl["ram/val-aux/math/reward/std@2"]
    assert light["ram/val/code/reward/best@2/mean"] == verl["ram/val-core/code/reward/best@2/mean"]
    assert {k.split("/")[1] for k in light} == {"val"} and len(light) == 1 + 8 * 3 + 2 * 2


def test_one_task_is_all_and_unscored_prompts_are_not_counted(tok):
    def some_none(completions, **kwargs):
        return [None if c == "" else float(c.count("a")) for c in completions]

    evaluate = rewards(PROMPTS, some_none, tokenizer=tok, samples=2, generate=two_samples, model=h.model(0))
    evaluate(h.model(0))
    out = evaluation_metrics(evaluate, "verl")
    assert out["ram/val-aux/all/reward/prompts"] == 6.0  # prompt 3's samples are both empty: not scored
    assert out["ram/val-core/reward/mean@2"] == evaluate.metrics["reward"] == 7.5 / 6  # the objective: every prompt
    # verl's mean@m: a prompt's mean keyed by its m scored responses, each key the mean over the prompts that have
    # it (val-core at the most): prompts 1, 2, 4, 6 have both (means 0.5, 1, 2, 1), prompts 0 and 5 one (2, 1)
    assert out["ram/val-core/all/reward/mean@2"] == pytest.approx(4.5 / 4, abs=1e-12)
    assert out["ram/val-aux/all/reward/mean@1"] == pytest.approx(1.5, abs=1e-12)
    assert "ram/val-core/all/reward/mean@1" not in out and "ram/val/all/reward/mean@1" not in out
    # the samples' spread leaves the unscored ones out: a prompt with one scored sample has no std@2 (verl's std@n
    # is of n > 1) and no zero std (TRL's nanstd of one value is NaN); prompt 2 ("a", "a") alone has two equal
    scored = [[float(t.count("a")) for t in texts if t != ""] for texts in TEXTS]
    stds = [statistics.pstdev(v) for v in scored if len(v) > 1]
    assert out["ram/val-aux/all/reward/std@2"] == pytest.approx(statistics.mean(stds), abs=1e-12)
    trl = evaluation_metrics(evaluate, "trl")
    assert trl["ram/eval_frac_reward_zero_std"] == pytest.approx(1 / 7, abs=1e-12)
    assert trl["ram/eval_reward_std"] == pytest.approx(statistics.stdev([r for v in scored for r in v]), abs=1e-12)


@pytest.mark.parametrize("n", [1, 2, 3, 5])
def test_resampled_extremes_are_the_exact_bootstrap(n):
    """best@n / worst@n: the mean and std of the extreme of n draws with replacement, by enumerating every draw."""
    import itertools

    values = [0.5, 2.0, 2.0, -1.0]
    draws = list(itertools.product(values, repeat=n))
    for largest, pick in ((True, max), (False, min)):
        extremes = [pick(d) for d in draws]
        mean, std = resampled_extreme(values, n, largest=largest)
        assert mean == pytest.approx(statistics.mean(extremes), abs=1e-12)
        assert std == pytest.approx(statistics.pstdev(extremes), abs=1e-12)


def test_resampled_extremes_keep_their_spread_far_from_zero():
    mean, std = resampled_extreme([1e8, 1e8 + 1], 2, largest=True)
    assert mean == 1e8 + 0.75 and std == pytest.approx(0.75**0.5 * 0.5, rel=1e-9)


@pytest.mark.parametrize("values,n", [([], 2), ([1.0], 0), ([1.0], 2.5), ([1.0], True)])
def test_resampled_extremes_refuse_no_values_or_draws(values, n):
    with pytest.raises(ConfigError, match="resampled_extreme: (needs at least one value|n must be an integer >= 1)"):
        resampled_extreme(values, n, largest=True)


def test_one_sample_logs_no_spread_and_every_group_has_zero_std(tok):
    def one_sample(merged, prompts, settings, seeds):
        return [TEXTS[PROMPTS.index(p)][0] for p in prompts]

    evaluate = rewards(PROMPTS, count_a, tokenizer=tok, generate=one_sample, model=h.model(0))
    evaluate(h.model(0))
    assert not [k for k in evaluation_metrics(evaluate, "verl") if any(w in k for w in ("std@", "best@", "worst@"))]
    trl = evaluation_metrics(evaluate, "trl")
    assert trl["ram/eval_frac_reward_zero_std"] == 1.0  # TRL's std is 0 for groups of one completion
    firsts = [float(texts[0].count("a")) for texts in TEXTS]
    assert trl["ram/eval_reward_std"] == pytest.approx(statistics.stdev(firsts), abs=1e-12)


def test_layouts_are_checked_and_other_evaluations_pass_through(tok):
    plain = lambda model: 0.5  # noqa: E731
    assert logged_as(plain, "trl") is plain and logged_as(None, "verl") is None
    with pytest.raises(ConfigError, match="layout must be one of"):
        logged_as(plain, "keras")
    evaluate = rewards(PROMPTS, count_a, tokenizer=tok, samples=2, generate=two_samples, model=h.model(0))
    assert evaluation_metrics(evaluate, "trl") == {}  # before a call
    wrapped = logged_as(evaluate, "trl")
    assert wrapped(h.model(0)) == evaluate.metrics["reward"] and wrapped.metric is evaluate.metric
    assert wrapped.logged_metrics() == evaluation_metrics(evaluate, "trl")
    assert set(LAYOUTS) == {"verl", "trl", "lightning"}


L = pytest.importorskip("lightning")


class LM(L.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.lm = h.model(0).train()  # every agent of a store starts from the same base

    def training_step(self, batch, i):
        (ids,) = batch
        return self.lm(input_ids=ids, labels=ids).loss

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.05)


def test_the_lightning_callback_logs_the_layout_with_the_real_trainer(tmp_path, tok):
    from lightning.pytorch.loggers import CSVLogger

    from ram_live.integrations.lightning import RAMCallback

    evaluate = rewards(rows(), [count_a, is_short], tokenizer=tok, samples=2, metric="pass@2", generate=two_samples)
    callbacks = {}
    for agent, seed in (("a", 1), ("b", 2)):
        ids = torch.randint(3, len(h.VOCAB), (8, 6), generator=torch.Generator().manual_seed(seed))
        data = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(ids), batch_size=4)
        callbacks[agent] = RAMCallback(
            tmp_path / "store", agent, snapshot_every=2, merge_every=2, evaluate=evaluate, durable=False
        )
        trainer = L.Trainer(
            max_steps=2,
            callbacks=[callbacks[agent]],
            logger=CSVLogger(tmp_path / "logs", name=agent),
            enable_checkpointing=False,
            enable_progress_bar=False,
            enable_model_summary=False,
            accelerator="cpu",
        )
        trainer.fit(LM(), data)
    logged = callbacks["b"].history[-1]
    tasks = by_hand("pass@2")
    assert logged["ram/val/reward/pass@2"] == pytest.approx(sum(sum(v) / len(v) for v in tasks.values()) / 3)
    for task, values in tasks.items():
        assert logged[f"ram/val/{task}/reward/pass@2"] == pytest.approx(sum(values) / len(values))
        assert logged[f"ram/val/{task}/reward/pass@2/std"] == pytest.approx(statistics.pstdev(values))
        assert logged[f"ram/val/{task}/reward/prompts"] == len(values)
    assert not [k for k in logged if k.startswith(("ram/eval", "ram/reward"))]  # the old keys are gone
    assert math.isfinite(logged["ram/val/rewards/is_short/std"]) and logged["ram/agents"] == 2.0
    csv_keys = (tmp_path / "logs" / "b" / "version_0" / "metrics.csv").read_text().splitlines()[0].split(",")
    assert "ram/val/gsm8k/reward/pass@2" in csv_keys  # reached the trainer's logger
