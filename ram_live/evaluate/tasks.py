"""Prompts grouped into tasks, and the objective over the tasks' scores.

A task is the value of one prompt column (verl's ``data_source`` by default, when the prompts have it). Each task's
score is the mean of its prompts' scores; the objective is the mean over the tasks (each task counts the same,
however many prompts it has), the worst task, or a weighted mean. A prompt that is not scored (``None``, as TRL's
``nanmean`` leaves it out) is left out of its task; a task none of whose prompts is scored is left out of the
objective and of the table.
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from ..errors import ConfigError
from ..option_checks import finite_float
from .checks import short
from .moments import mean, weighted_moments
from .prompts import Prompts

__all__ = ["AUTO", "ONE_TASK", "OBJECTIVES", "Tasks", "group"]

#: The single task's name when the prompts are not grouped.
ONE_TASK = "all"
OBJECTIVES = ("mean", "min", "weighted")


class _Auto:
    """``task``'s default: the ``data_source`` column when the prompts have one, else one task."""

    def __repr__(self) -> str:
        return "'data_source' when present"


AUTO: Any = _Auto()


@dataclass(frozen=True)
class Tasks:
    """Each prompt's task (``of[i]``), the tasks in order of first appearance (``names``), the column they come
    from (None: one task, :data:`ONE_TASK`), the objective and, for ``"weighted"``, each task's weight."""

    of: list[str]
    names: list[str]
    column: str | None
    objective: str = "mean"
    weights: dict[str, float] | None = None

    def aggregate(self, values: Mapping[int, float | None]) -> tuple[float | None, dict[str, float]]:
        """The objective over ``{prompt index: score}`` and each task's score (the mean of its scored prompts, in
        prompt order). Tasks without a scored prompt are left out; the objective is None when no task is left (or,
        weighted, when only tasks of weight 0 are)."""
        sums: dict[str, list[float]] = {}
        for i in sorted(values):
            v = values[i]
            if v is not None:
                sums.setdefault(self.of[i], []).append(v)
        table = {t: mean(sums[t]) for t in self.names if t in sums}  # scaled: huge scores average finitely
        if not table:
            return None, {}
        scores = list(table.values())
        if self.objective == "min":
            return min(scores), table
        if self.objective == "weighted":
            w = self.weights or {}
            total = sum(w[t] for t in table)
            if total == 0:
                return None, table
            return weighted_moments([w[t] / total for t in table], scores)[0], table
        return mean(scores), table


def group(
    prompts: Prompts, task: Any = AUTO, objective: str | None = None, weights: Mapping[Any, Any] | None = None
) -> Tasks:
    """Group ``prompts`` into tasks and check the objective.

    Args:
        prompts: the loaded prompts.
        task: the column whose value is a prompt's task; :data:`AUTO` (default): ``data_source`` when the prompts
            have it, else one task; None: one task.
        objective: ``"mean"`` (over tasks; default), ``"min"`` (the worst task) or ``"weighted"`` (default when
            ``weights`` is given).
        weights: ``{task: weight}``, one finite weight >= 0 for every task (0 leaves a task out of the objective;
            it is still reported), their sum > 0.

    Raises:
        ConfigError: an unknown column, a task value that is not a non-blank string or finite number (None, NaN
            or a blank string: a missing value), an unknown objective, weights naming an unknown task or missing
            one, a bad weight.

    >>> from ram_live.evaluate import load_prompts
    >>> group(load_prompts([{"prompt": "a", "data_source": "x"}, {"prompt": "b", "data_source": "y"}])).names
    ['x', 'y']
    """
    column = _column(prompts, task)
    if column is None:
        of = [ONE_TASK] * len(prompts)
    else:
        of = []
        for i, value in enumerate(prompts.columns[column]):
            if isinstance(value, numbers.Integral) and not isinstance(value, (bool, int)):
                value = int(value)  # a numpy integer (a column of a DataFrame's rows)
            if value is None or isinstance(value, bool) or not isinstance(value, (str, int, float)):
                missing = " (a missing value)" if value is None else ""
                raise ConfigError(
                    f"{prompts.where(i)}: the task column {column!r} holds {short(value)}{missing}; a task is a "
                    "string or a number: fill it in, or pass task=None for one task"
                )
            if isinstance(value, float) and not math.isfinite(value):
                missing = " (a missing value, as pandas writes one)" if math.isnan(value) else ""
                raise ConfigError(
                    f"{prompts.where(i)}: the task column {column!r} holds {value}{missing}; a task is a string or "
                    "a finite number: fill it in, or pass task=None for one task"
                )
            if isinstance(value, str) and not value.strip():
                raise ConfigError(
                    f"{prompts.where(i)}: the task column {column!r} holds {value!r} (a missing value): a task is "
                    "named by a non-blank string or a number: fill it in, or pass task=None for one task"
                )
            of.append(value if isinstance(value, str) else str(value))
    names = list(dict.fromkeys(of))
    if objective is None:
        objective = "weighted" if weights is not None else "mean"
    if objective not in OBJECTIVES:
        raise ConfigError(
            f"rewards: objective must be 'mean', 'min' or 'weighted' (with weights=), got {short(objective)}"
        )
    if objective == "weighted" and weights is None:
        raise ConfigError("rewards: objective='weighted' needs weights={task: weight, ...}")
    if weights is not None and objective != "weighted":
        raise ConfigError(
            f"rewards: weights= makes the objective a weighted mean; objective={objective!r} was also given (drop one)"
        )
    checked = _weights(weights, names, column) if weights is not None else None
    return Tasks(of, names, column, objective, checked)


def _column(prompts: Prompts, task: Any) -> str | None:
    if task is AUTO:
        return "data_source" if "data_source" in prompts.columns else None
    if task is None:
        return None
    if not isinstance(task, str):
        raise ConfigError(f"rewards: task must be a column name (a str) or None, got {short(task)}")
    if task not in prompts.columns:
        raise ConfigError(
            f"rewards: task={task!r} is not a column of the prompts (their columns: "
            f"{sorted(prompts.columns) or 'only prompt'})"
        )
    return task


def _weights(weights: Any, names: list[str], column: str | None) -> dict[str, float]:
    if not isinstance(weights, Mapping):
        raise ConfigError(f"rewards: weights must be a dict {{task: weight}}, got {short(weights)}")
    known = set(names)
    out: dict[str, float] = {}
    for key, w in weights.items():
        name = key if isinstance(key, str) else str(key)
        if name not in known:
            where = f"column {column!r}" if column is not None else "the prompts (not grouped: one task, 'all')"
            raise ConfigError(
                f"rewards: weights name the task {name!r}, which no prompt has (tasks of {where}: {short(names)})"
            )
        try:
            value = finite_float(w)
        except ValueError as exc:
            raise ConfigError(f"rewards: the weight of task {name!r} is {short(w)}: {exc}") from None
        if value < 0:
            raise ConfigError(f"rewards: the weight of task {name!r} is {value}; weights must be >= 0")
        out[name] = value
    missing = [t for t in names if t not in out]
    if missing:
        raise ConfigError(
            f"rewards: weights give no weight to the task(s) {short(missing)}; give every task a "
            "weight (0 leaves one out of the objective)"
        )
    if sum(out.values()) <= 0:
        raise ConfigError("rewards: the weights sum to 0; give at least one task a weight > 0")
    return out
