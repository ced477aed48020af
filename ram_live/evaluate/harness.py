"""``lm_eval(tasks, ...)``: lm-eval-harness tasks on the in-memory model (no save, no reload) as an
``evaluate(model) -> float`` for :func:`ram_live.search`; the full results are kept on the evaluator.

Needs the optional extra ``lm-eval`` (in the ram-live clone: ``pip install -e ".[lm-eval]"``).
"""

from __future__ import annotations

import math
import os
from typing import Any, Sequence

from ..errors import ConfigError, EvaluationError
from .engines import checked_resolver
from .models import Resolver

__all__ = ["LmEval", "lm_eval"]


def _lm_eval() -> Any:
    try:
        import lm_eval
        import lm_eval.models.huggingface  # noqa: F401
        import lm_eval.tasks  # noqa: F401
    except ImportError as exc:
        raise ConfigError(
            'ram_live.evaluate.lm_eval needs lm-eval-harness: pip install -e ".[lm-eval]" (in the ram-live clone)'
        ) from exc
    return lm_eval


def lm_eval(
    tasks: str | Sequence[str],
    *,
    metric: str = "acc",
    tokenizer: Any = None,
    model: Any = None,
    include_path: str | os.PathLike | None = None,
    include_defaults: bool = True,
    batch_size: int = 8,
    num_fewshot: int | None = None,
    limit: int | float | None = None,
    seed: int = 0,
    **simple_evaluate_kwargs: Any,
) -> LmEval:
    """An evaluation ``evaluate(model) -> float``: lm-eval-harness's ``simple_evaluate`` on the model as it is in
    memory (wrapped in ``HFLM(pretrained=<model>, tokenizer=...)``), returning one metric.

    Args:
        tasks: task names (lm-eval's, or ones defined by YAML files under ``include_path``).
        metric: the metric returned: ``"acc"`` (its ``,none`` filter) or a full key ``"exact_match,strict-match"``;
            averaged over ``tasks`` (each task must report it). Higher must be better.
        tokenizer: a tokenizer or its folder (None: the evaluated folder's, or ``model``'s).
        model: what a state dict is loaded into (a module, or an HF folder), as for
            :func:`~ram_live.evaluate.rewards`.
        include_path: a folder of task YAML files (local tasks); ``include_defaults=False`` skips indexing
            lm-eval's own tasks.
        batch_size, num_fewshot, limit, seed: passed to ``simple_evaluate`` (seed to its random, numpy, torch
            and few-shot seeds); other keywords too.
        **simple_evaluate_kwargs: further keywords of ``simple_evaluate``.

    Returns:
        An :class:`LmEval`: call it on a module, a state dict or an HF folder for the metric's mean over ``tasks``.

    Raises:
        ConfigError: ``tasks`` is empty or not names, ``metric`` is not a non-empty string, lm-eval is not
            installed, or ``model`` / ``tokenizer`` is not a module / tokenizer or an existing folder of one (a
            path is checked now, a tokenizer folder loaded now).

    >>> evaluate = lm_eval(["arc_easy"], metric="acc_norm", tokenizer=tok, limit=200)     # doctest: +SKIP
    >>> result = ram_live.search(agents, base=base, evaluate=evaluate)                     # doctest: +SKIP
    >>> evaluate.results["results"]["arc_easy"]                                       # doctest: +SKIP
    """
    names = [tasks] if isinstance(tasks, str) else list(tasks)
    if not names or not all(isinstance(t, str) and t for t in names):
        raise ConfigError(f"lm_eval: tasks must be task names, got {tasks!r}")
    if not isinstance(metric, str) or not metric:
        raise ConfigError(f"lm_eval: metric must be a metric name such as 'acc', got {metric!r}")
    _lm_eval()
    return LmEval(
        names,
        metric,
        checked_resolver(model, tokenizer),
        include_path,
        include_defaults,
        dict(
            batch_size=batch_size,
            num_fewshot=num_fewshot,
            limit=limit,
            random_seed=seed,
            numpy_random_seed=seed,
            torch_random_seed=seed,
            fewshot_random_seed=seed,
            **simple_evaluate_kwargs,
        ),
    )


class LmEval:
    """The evaluation :func:`lm_eval` returns; after a call ``results`` holds ``simple_evaluate``'s results and
    ``metrics`` the chosen metric per task. Build it with :func:`lm_eval`, which checks the arguments.

    Args:
        tasks: the task names.
        metric: the metric's name, ``"acc"`` or a full key ``"exact_match,strict-match"``.
        resolver: turns what a call is handed into ``(model, tokenizer)``.
        include_path: a folder of task YAML files, or None.
        include_defaults: whether lm-eval's own tasks are indexed too.
        kwargs: the keywords passed to ``simple_evaluate``.

    Calling it raises :class:`~ram_live.evaluate.EvaluationError` when lm-eval fails on the tasks, returns no results, a
    task does not report the metric, or the mean is not finite.

    >>> evaluate = lm_eval("arc_easy", tokenizer=tok); score = evaluate(model)          # doctest: +SKIP
    """

    def __init__(
        self,
        tasks: list[str],
        metric: str,
        resolver: Resolver,
        include_path: Any,
        include_defaults: bool,
        kwargs: dict[str, Any],
    ) -> None:
        self.tasks, self.metric, self.resolver, self.kwargs = tasks, metric, resolver, kwargs
        self.include_path = None if include_path is None else os.fspath(include_path)
        self.include_defaults = include_defaults
        self._manager: Any = None
        self.results: dict[str, Any] = {}
        self.metrics: dict[str, float] = {}

    def __call__(self, merged: Any, step: int | None = None) -> float:
        """The chosen metric of ``merged``, averaged over the tasks (``step``: verl's keyword, unused)."""
        lm_eval = _lm_eval()
        from lm_eval.models.huggingface import HFLM

        model, tokenizer = self.resolver.resolve(merged)
        if self._manager is None:
            self._manager = lm_eval.tasks.TaskManager(
                include_path=self.include_path, include_defaults=self.include_defaults
            )
        training = model.training
        try:
            lm = HFLM(pretrained=model, tokenizer=tokenizer, batch_size=self.kwargs["batch_size"])
            results = lm_eval.simple_evaluate(
                model=lm, tasks=self.tasks, task_manager=self._manager, log_samples=False, **self.kwargs
            )
        except (KeyError, ValueError) as exc:
            raise EvaluationError(f"lm_eval on tasks {self.tasks}: {type(exc).__name__}: {exc}") from exc
        finally:
            model.train(training)
        if results is None:
            raise EvaluationError("lm_eval: simple_evaluate returned no results (a non-zero rank?)")
        self.results = results
        key = self.metric if "," in self.metric else f"{self.metric},none"
        metrics = {}
        for task in self.tasks:
            row = results["results"].get(task, {})
            if key not in row:
                raise EvaluationError(
                    f"lm_eval: task {task!r} reports no {key!r} (its metrics: {sorted(k for k in row if ',' in k)})"
                )
            metrics[task] = float(row[key])
        self.metrics = metrics
        score = sum(metrics.values()) / len(metrics)
        if not math.isfinite(score):
            raise EvaluationError(f"lm_eval: {key} is {score} on {self.tasks}")
        return score
