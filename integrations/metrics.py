"""The generalist's evaluation logged in the layout of the trainer it runs in: the one place that builds those keys.

A :func:`ram_live.evaluate.rewards` evaluation is logged beside the agents' own validation, ``ram/``-prefixed, with
its metric (``mean@k``, ``pass@k``) in the key, each task's score, its std over the task's prompts and its number of
prompts, and each reward function's mean and std over the completions:

========= ================================= ===================================== ================================
layout    objective                         task ``t``                            reward function ``f``
========= ================================= ===================================== ================================
verl      ``ram/val-core/reward/{metric}``  ``ram/val-core/{t}/reward/{metric}``, ``ram/val-aux/rewards/{f}/mean``,
                                            ``ram/val-aux/{t}/reward/{metric}/std``, ``.../std``
                                            ``ram/val-aux/{t}/reward/prompts``,
                                            ``ram/val-aux/{t}/reward/std@{k}``,
                                            ``ram/val-core/{t}/reward/best@{k}/mean``
                                            and ``/std`` (other ``best@{n}``,
                                            ``worst@{n}``: ``val-aux``)
trl       ``ram/eval_reward/{metric}``      ``ram/eval_tasks/{t}/{metric}``,      ``ram/eval_rewards/{f}/mean``,
          (and TRL's ``ram/eval_reward``,   ``.../{metric}/std``, ``.../prompts`` ``.../std``
          ``ram/eval_reward_std``,
          ``ram/eval_frac_reward_zero_std``)
lightning ``ram/val/reward/{metric}``       ``ram/val/{t}/reward/{metric}``,      ``ram/val/rewards/{f}/mean``,
                                            ``.../{metric}/std``, ``.../prompts``, ``.../std``
                                            ``ram/val/{t}/reward/std@{k}``,
                                            ``.../best@{n}/mean``, ``/std``, ``worst@{n}``
========= ================================= ===================================== ================================

A task's std is over its scored prompts' scores (numpy's ``np.std``, as verl's); a function's std is over its
rewards (the sample std, as TRL's ``eval_rewards/{f}/std``). With ``samples=k > 1``, ``std@{k}`` is verl's: the
mean over a task's prompts of the std (``np.std``) of each prompt's weighted rewards, and so are ``best@{n}`` and
``worst@{n}`` (n = 2, 4, ... below k, and k): the mean and std of the best and worst of n rewards drawn with
replacement, computed exactly (:func:`resampled_extreme`) where verl estimates them from 1,000 bootstrap resamples.
As verl's, a prompt with m of its k rewards scored (2 ≤ m < k) gives ``std@{m}``, ``best@{n}`` and ``worst@{n}``
for n up to m, each key the mean over the prompts that have it; ``best@{N}`` under ``val-core`` is at the task's
largest m; prompts with fewer than two scored rewards are left out. With a ``mean@k`` metric the verl layout's
per-task ``mean@{m}`` is verl's too: the mean over the task's prompts with m scored rewards of their mean (the
objective still counts every scored prompt). ``maj@{n}`` needs a prediction per response
and is not logged. TRL's ``reward`` (``ram/eval_reward``) is the mean over the scored completions of the weighted
sum of the reward functions (``GRPOTrainer``'s ``nanmean`` of the ``nansum``, a completion no function scored left
out), whatever the metric; the objective is ``ram/eval_reward/{metric}``. TRL's ``reward_std`` is the sample std
of every scored completion's weighted reward, and ``frac_reward_zero_std`` the fraction of prompts whose k rewards
have a zero sample std (GRPO's groups with no learning signal under ``scale_rewards="group"``: 1 with
``samples=1``, as TRL's). One task (no ``task`` column) is the task ``all``. Evaluations of other kinds are logged
as they return their metrics.
"""

from __future__ import annotations

import math
import numbers
from typing import Any, Callable, Sequence

from ram_live.errors import ConfigError
from ram_live.option_checks import finite_float, shown

from ram_live.evaluate.moments import mean as _mean
from ram_live.evaluate.moments import std as _std
from ram_live.evaluate.moments import weighted_moments

__all__ = ["LAYOUTS", "evaluation_metrics", "logged_as", "resampled_extreme", "search_task_key"]

LAYOUTS: dict[str, dict[str, tuple[str, ...]]] = {
    "verl": {
        "objective": ("val-core/reward/{metric}",),
        "task": ("val-core/{task}/reward/{metric}",),
        "std": ("val-aux/{task}/reward/{metric}/std",),
        "prompts": ("val-aux/{task}/reward/prompts",),
        "mean": ("val-aux/rewards/{func}/mean",),
        "func_std": ("val-aux/rewards/{func}/std",),
        "sample_std": ("val-aux/{task}/reward/std@{k}",),
        "extreme": ("{section}/{task}/reward/{which}@{n}/{stat}",),
        "sample_mean": ("{section}/{task}/reward/mean@{n}",),
        "reward_mean": (),
        "reward_std": (),
        "zero_std": (),
    },
    "trl": {
        "objective": ("eval_reward/{metric}",),
        "task": ("eval_tasks/{task}/{metric}",),
        "std": ("eval_tasks/{task}/{metric}/std",),
        "prompts": ("eval_tasks/{task}/prompts",),
        "mean": ("eval_rewards/{func}/mean",),
        "func_std": ("eval_rewards/{func}/std",),
        "sample_std": (),
        "extreme": (),
        "sample_mean": (),
        "reward_mean": ("eval_reward",),
        "reward_std": ("eval_reward_std",),
        "zero_std": ("eval_frac_reward_zero_std",),
    },
    "lightning": {
        "objective": ("val/reward/{metric}",),
        "task": ("val/{task}/reward/{metric}",),
        "std": ("val/{task}/reward/{metric}/std",),
        "prompts": ("val/{task}/reward/prompts",),
        "mean": ("val/rewards/{func}/mean",),
        "func_std": ("val/rewards/{func}/std",),
        "sample_std": ("val/{task}/reward/std@{k}",),
        "extreme": ("val/{task}/reward/{which}@{n}/{stat}",),
        "sample_mean": (),
        "reward_mean": (),
        "reward_std": (),
        "zero_std": (),
    },
}


def evaluation_metrics(evaluation: Any, layout: str) -> dict[str, float]:
    """The last call of a :func:`ram_live.evaluate.rewards` evaluation as ``layout``'s ``ram/`` keys.

    Args:
        evaluation: a called :class:`~ram_live.evaluate.Rewards` (its ``metrics``, ``per_prompt``, ``metric``).
        layout: ``"verl"``, ``"trl"`` or ``"lightning"`` (:data:`LAYOUTS`).

    Returns:
        ``{"ram/<key>": value}``; ``{}`` before the evaluation's first call.

    Raises:
        ConfigError: an unknown ``layout``; an ``evaluation`` that is not a :func:`ram_live.evaluate.rewards` one.
    """
    _check_layout(layout)
    if not callable(getattr(evaluation, "function_rewards", None)):
        raise ConfigError(
            f"evaluation_metrics needs a ram_live.evaluate.rewards evaluation, got {type(evaluation).__name__}"
        )
    if not evaluation.metrics:
        return {}
    keys, metric = LAYOUTS[layout], evaluation.metric.name
    out: dict[str, float] = {}

    def put(kind: str, value: float, **names: str) -> None:
        for template in keys[kind]:
            out["ram/" + template.format(metric=metric, **names)] = float(value)

    put("objective", evaluation.metrics["reward"])
    by_task: dict[str, list[float]] = {}
    for task, score in zip(evaluation.prompt_tasks(), evaluation.per_prompt):
        if score is not None:
            by_task.setdefault(task, []).append(score)
    # verl keys a prompt's mean by its m scored responses (mean@m): with a mean@k metric its per-task keys are verl's
    verl_mean = bool(keys["sample_mean"]) and evaluation.metric.kind == "mean"
    for task, scores in by_task.items():
        if not verl_mean:
            put("task", evaluation.tasks.get(task, _mean(scores)), task=task)
        put("std", _std(scores, ddof=0), task=task)
        put("prompts", len(scores), task=task)
    for func, values in evaluation.function_rewards().items():
        put("mean", _mean(values), func=func)
        put("func_std", _std(values, ddof=1), func=func)
    groups = [[r for r in group if r is not None] for group in evaluation.sample_rewards]
    k = evaluation.settings.samples
    per_task: dict[str, dict[tuple[str, int, str], list[float]]] = {}
    for task, scored in zip(evaluation.prompt_tasks(), groups):
        if verl_mean and scored:
            per_task.setdefault(task, {}).setdefault(("mean", len(scored), ""), []).append(_mean(scored))
        if len(scored) > 1:  # verl's std@n, best@n and worst@n: a prompt's m > 1 scored responses, keyed by m
            into = per_task.setdefault(task, {})
            m = len(scored)
            into.setdefault(("std", m, ""), []).append(_std(scored, ddof=0))
            for n in _subset_sizes(m):
                for which, largest in (("best", True), ("worst", False)):
                    mean, std = resampled_extreme(scored, n, largest=largest)
                    into.setdefault((which, n, "mean"), []).append(mean)
                    into.setdefault((which, n, "std"), []).append(std)
    for task, keyed in per_task.items():
        most = max(n for _, n, _ in keyed)  # verl files best@N at a data source's most responses under val-core
        for (which, n, stat), values in sorted(keyed.items()):
            value = _mean(values)  # the mean over the prompts that have the key, as verl's
            if which == "std":
                put("sample_std", value, task=task, k=str(n))
            elif which == "mean":
                put("sample_mean", value, task=task, n=str(n), section="val-core" if n == most else "val-aux")
            else:
                section = "val-core" if which == "best" and n == most else "val-aux"
                put("extreme", value, task=task, which=which, n=str(n), stat=stat, section=section)
    flat = [r for scored in groups for r in scored]
    put("reward_mean", _mean(flat))  # TRL's eval_reward
    put("reward_std", _std(flat, ddof=1))
    # TRL's group std is torch.isclose to 0 (atol 1e-8); one scored sample of k > 1 gives NaN there: not zero
    zero = [k == 1 or (len(scored) > 1 and _std(scored, ddof=1) <= 1e-8) for scored in groups]
    put("zero_std", sum(zero) / len(zero) if zero else math.nan)
    return out


def _subset_sizes(k: int) -> list[int]:
    """verl's subset sizes for ``k`` responses: 2, 4, 8, ... below ``k``, then ``k``."""
    sizes, n = [], 2
    while n < k:
        sizes.append(n)
        n *= 2
    return [*sizes, k]


def resampled_extreme(values: Sequence[float], n: int, largest: bool) -> tuple[float, float]:
    """The mean and std of the best (``largest``) or worst of ``n`` draws with replacement from ``values``: exactly
    what verl's ``best@n`` / ``worst@n`` estimate by 1,000 bootstrap resamples. The i-th smallest of m values is
    the maximum of n draws with probability (i/m)^n − ((i−1)/m)^n.

    Args:
        values: one prompt's rewards.
        n: draws per resample.
        largest: the best (maximum) or the worst (minimum).

    Returns:
        ``(mean, std)`` of that extreme (the std over resamples, ``np.std``'s).

    Raises:
        ConfigError: no values, a value that is not a finite number, or ``n`` not an integer >= 1.

    Example:
        >>> resampled_extreme([0.0, 1.0], 2, largest=True)  # P(best = 1) = 3/4
        (0.75, 0.4330127018922193)
    """
    if isinstance(n, bool) or not isinstance(n, numbers.Integral) or n < 1:
        raise ConfigError(f"resampled_extreme: n must be an integer >= 1 (draws per resample), got {shown(n)}")
    try:
        rewards = [finite_float(v) for v in values]
    except (TypeError, ValueError) as exc:
        raise ConfigError(f"resampled_extreme: values must be finite numbers, got {shown(values)} ({exc})") from None
    if not rewards:
        raise ConfigError("resampled_extreme: needs at least one value, got none")
    ordered = sorted(rewards, reverse=not largest)
    m = len(ordered)
    draws = float(n) if int(n).bit_length() < 1024 else math.inf  # (i/m)**inf is 0 below the extreme
    probabilities = [(i / m) ** draws - ((i - 1) / m) ** draws for i in range(1, m + 1)]
    return weighted_moments(probabilities, ordered)


def _check_layout(layout: Any) -> None:
    if not isinstance(layout, str) or layout not in LAYOUTS:
        raise ConfigError(f"layout must be one of {sorted(LAYOUTS)}, got {layout!r:.80}")


class _LoggedAs:
    """``evaluate`` unchanged (called, and its attributes read, as itself) whose ``logged_metrics`` are
    ``layout``'s keys: what a training schedule logs after calling it."""

    def __init__(self, evaluate: Any, layout: str) -> None:
        self.evaluate, self.layout = evaluate, layout

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self.evaluate(*args, **kwargs)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.evaluate, name)

    def logged_metrics(self) -> dict[str, float]:
        return evaluation_metrics(self.evaluate, self.layout)


def logged_as(evaluate: Callable[..., Any] | None, layout: str) -> Any:
    """``evaluate`` whose scores are logged in ``layout`` (:func:`evaluation_metrics`) where it is a
    :func:`ram_live.evaluate.rewards` evaluation; any other evaluation (or None) as it is.

    Args:
        evaluate: the callback's evaluation.
        layout: ``"verl"``, ``"trl"`` or ``"lightning"``.

    Returns:
        The evaluation to hand to the schedule.

    Raises:
        ConfigError: an unknown ``layout``.
    """
    _check_layout(layout)
    if evaluate is None or not callable(getattr(evaluate, "function_rewards", None)):
        return evaluate
    return _LoggedAs(evaluate, layout)


def search_task_key(task: str, metric: str | None, layout: str | None) -> str:
    """The key, under ``ram/search/``, of the search winner's score on ``task``: the evaluation's own per-task key
    in ``layout`` (``trl``: ``eval_tasks/{task}/{metric}``, so ``ram/search/eval_tasks/math/pass@4`` beside the
    evaluation's ``ram/eval_tasks/math/pass@4``); ``eval/{task}`` without a layout or a metric name, as
    ``rewards().logged_metrics()`` keys a task in a plain :class:`~ram_live.RAMSchedule`.

    Args:
        task: the task's name.
        metric: the evaluation's metric (``"pass@4"``), or None.
        layout: ``"verl"``, ``"trl"``, ``"lightning"`` or None.

    Returns:
        The key without its ``ram/search/`` prefix.

    Example:
        >>> search_task_key("math", "pass@4", "trl")
        'eval_tasks/math/pass@4'
    """
    if layout in LAYOUTS and metric:
        return LAYOUTS[layout]["task"][0].format(task=task, metric=metric)
    return f"eval/{task}"
