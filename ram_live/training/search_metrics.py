"""``ram/search/*``: the metrics a training callback logs of one search's record
(:func:`~ram_live.training.search.record_of`); re-exported by :mod:`ram_live.training.search`."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ..option_checks import finite_float

__all__ = ["search_metrics"]


def search_metrics(
    record: Mapping[str, Any], prefix: str = "ram/search/", layout: str | None = None
) -> dict[str, float]:
    """``ram/search/*`` floats of a record: best score, best baseline's score, evaluations, seconds, the chosen
    method (``method/<name>`` = 1) and its numeric options (``option/<key>``, ``lambda/<agent>`` ...), and the
    winner's score on each task under the evaluation's own per-task key in ``layout`` (the trainer's: TRL's
    ``ram/search/eval_tasks/<task>/<metric>`` beside ``ram/eval_tasks/<task>/<metric>``;
    :func:`~ram_live.integrations.metrics.search_task_key`)."""
    from ..integrations.metrics import search_task_key

    out = {f"{prefix}best_score": float(record["best_score"]), f"{prefix}evaluations": float(record["evaluations"])}
    if record.get("best_baseline") is not None:
        out[f"{prefix}best_baseline_score"] = float(record["best_baseline"]["score"])
    if "arbitrary" in record:  # 1: the search could not choose (ram_live.selection.choice)
        out[f"{prefix}arbitrary"] = float(bool(record["arbitrary"]))
    for key, value in record["seconds"].items():
        out[f"{prefix}{key}_seconds"] = float(value)
    for task, value in (record.get("best_tasks") or {}).items():
        _put_finite(out, prefix + search_task_key(str(task), record.get("task_metric"), layout), value)
    _put_finite(out, f"{prefix}extrapolation", record.get("extrapolation"))
    best = dict(record["best"])
    out[f"{prefix}method/{best.pop('method')}"] = 1.0
    agents = list(record.get("agents") or [])
    for key, value in best.items():
        if isinstance(value, list) and len(value) == len(agents):  # per-agent weights, in the agents' order
            value = dict(zip(agents, value))
        if isinstance(value, Mapping):
            for name, v in value.items():
                _put_finite(out, f"{prefix}{key.rstrip('s') if key == 'lambdas' else key}/{name}", v)
        else:
            _put_finite(out, f"{prefix}option/{key}", value)
    return out


def _put_finite(out: dict[str, float], key: str, value: Any) -> None:
    """``out[key] = value`` as a float when it is a finite number; anything else (an option's string, NaN) is no
    metric."""
    try:
        out[key] = finite_float(value)
    except ValueError:
        pass
