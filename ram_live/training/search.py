"""Held-out merge selection in the training callbacks: one :class:`SearchSetting`, declared once and taken by
:class:`~ram_live.RAMSchedule` (so the Lightning callback) and the verl integration (``ram.search``).

At each merge the callback runs :func:`ram_live.search` over the latest snapshot of every agent with the user's
evaluation on held-out data, merges the winner, logs ``ram/search/*`` (:mod:`.search_metrics`) and saves the chosen
options next to the merged generalist (:mod:`.search_record`: :func:`~.search_record.save_record`, read back with
:func:`~.search_record.load_choice`).

>>> setting = SearchSetting(evaluate=lambda model: {"acc": held_out_accuracy(model)}, metric="acc",   # doctest: +SKIP
...                         budget=60)
>>> schedule = RAMSchedule("runs/ram", agent="coder", merge_every=200, search=setting)       # doctest: +SKIP
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

from torch import Tensor

from ..errors import ConfigError
from ..loading import load_callable
from ..selection.optuna_storage import models_fingerprint
from ..store.format import LEGACY_RUN
from .candidates import candidate_evaluation, tensors_of
from .search_metrics import search_metrics
from .search_record import jsonable, save_record

__all__ = ["SearchSetting", "record_of", "search_metrics"]

MODES = ("max", "min")


@dataclass(frozen=True)
class SearchSetting:
    """How a callback chooses each merge: ``ram_live.search`` with the user's held-out evaluation.

    Args:
        evaluate: the selection evaluation. In :class:`~ram_live.RAMSchedule` / the Lightning callback:
            ``evaluate(model) -> dict | float``, called with each candidate's weights swapped into the training
            model (restored bit for bit afterwards); in verl: ``evaluate(merged_dir, step=step) -> dict | float``
            on a folder holding the candidate (a callable, or a dotted path ``pkg.mod:fn``). ``None``: the
            callback's own ``evaluate`` (Lightning: the module's validation loop). Give it data that is not the
            data you report on, or the logged scores of the chosen merge are selection scores.
        metric: the key of the returned dict to optimise (also found under ``ram/<metric>``); may be omitted when
            the dict has exactly one key or the evaluation returns a number.
        mode: ``"max"`` (higher is better, default) or ``"min"`` (a loss).
        budget: evaluate calls per merge (a hard cap, >= 1), or prompt-evaluations as ``"20x"`` (an evaluation
            with the prompt protocol, e.g. :func:`ram_live.evaluate.rewards`).
        fidelity: as in :func:`ram_live.search`: None or ``"halving"`` (the race; needs ``"20x"``-style budget and
            an evaluation with the prompt protocol). With that protocol the winner's per-task scores are logged
            under the evaluation's own per-task keys (TRL: ``ram/search/eval_tasks/<task>/<metric>``).
        space, seed: as in :func:`ram_live.search` (``None``: its default space).
        confirm, confirm_top: a second held-out evaluation (same kind as ``evaluate``) for the best
            ``confirm_top`` candidates, reported next to the selection score.
        sampler: as in :func:`ram_live.search`: None (its default), ``"moves"``, ``"tpe"``, an Optuna sampler's
            name (``"optuna-tpe"``, ``"optuna-gp"``, ``"optuna-cmaes"``, ``"optuna-random"``, ``"optuna-nsga2"``:
            seeded by ``seed``; what a config such as verl's ``+ram.search.sampler`` holds) or an Optuna sampler.
        storage, study: keep each merge's search in Optuna's storage (an RDB URL such as
            ``"sqlite:///search.db"``): each periodic search is a study of its own, named by :meth:`study_name`
            (``<study>:<agent>:<run>:step_<step>``, ``study`` default ``"ram_live"``), so a training job resumed
            from its checkpoint resumes the interrupted merge's search without scoring again, a new run never
            takes an earlier run's scores, and ``optuna-dashboard`` lists every merge. Not with several ranks
            (DDP): their evaluations are collective, and a rank taking a score from the study would leave the
            others waiting.

    Raises:
        ConfigError: an option is not valid (budget, fidelity, confirm_top, seed, mode, metric, or an evaluate /
            confirm that is neither a callable, a dotted path nor None).

    Example:
        >>> s = SearchSetting(evaluate=lambda m: {"loss": 0.5}, metric="loss", mode="min", budget=20)
        >>> s.score({"loss": 0.5})
        -0.5
    """

    evaluate: Callable[..., Any] | str | None = None
    metric: str | None = None
    mode: str = "max"
    budget: int | str = 60
    fidelity: str | None = None
    space: Any = None
    seed: int = 0
    confirm: Callable[..., Any] | str | None = None
    confirm_top: int = 3
    sampler: Any = None
    storage: Any = None
    study: str | None = None

    def __post_init__(self) -> None:
        from ..selection.fidelity import parse_budget, parse_fidelity
        from ..selection.optuna_storage import check_storage, in_memory
        from ..selection.sampler import parse_sampler

        try:
            parse_budget(self.budget)
            parse_fidelity(self.fidelity)
            if not isinstance(self.seed, bool) and isinstance(self.seed, int):
                parse_sampler(self.sampler, self.seed)
            check_storage(self.storage, self.study)
        except ConfigError as exc:
            raise ConfigError(f"search {exc}") from None
        if in_memory(self.storage):
            raise ConfigError(
                f"search storage={self.storage!r:.80} keeps the study in this process's memory: a resumed job "
                "cannot read it; give a file (storage='sqlite:///search.db') or a database server's URL"
            )
        if isinstance(self.confirm_top, bool) or not isinstance(self.confirm_top, int) or self.confirm_top < 1:
            raise ConfigError(f"search confirm_top must be an int >= 1, got {self.confirm_top!r}")
        if isinstance(self.seed, bool) or not isinstance(self.seed, int):
            raise ConfigError(f"search seed must be an int, got {self.seed!r}")
        if self.mode not in MODES:
            raise ConfigError(f"search mode must be 'max' or 'min', got {self.mode!r}")
        if self.metric is not None and (not isinstance(self.metric, str) or not self.metric):
            raise ConfigError(f"search metric must be a metric name (a non-empty str) or None, got {self.metric!r}")
        for name in ("evaluate", "confirm"):
            value = getattr(self, name)
            if value is not None and not callable(value) and not _is_path(value):
                raise ConfigError(
                    f"search {name} must be a callable, a dotted path 'pkg.mod:fn' or None, got {value!r}"
                )

    @classmethod
    def from_mapping(cls, values: Mapping[str, Any] | SearchSetting | None) -> SearchSetting | None:
        """From a plain mapping (a config group such as verl's ``ram.search``).

        Args:
            values: the options by name, a setting (returned as it is) or None.

        Returns:
            The setting, or None for None.

        Raises:
            ConfigError: ``values`` is not a mapping, holds an unknown option, or an option is not valid.
        """
        if values is None or isinstance(values, SearchSetting):
            return values
        if not isinstance(values, Mapping):
            raise ConfigError(f"search must be a mapping of search options, got {type(values).__name__}")
        allowed = [f.name for f in fields(cls)]
        unknown = sorted(set(values) - set(allowed))
        if unknown:
            raise ConfigError(f"unknown search option(s) {', '.join(unknown)}; the options are: {', '.join(allowed)}")
        return cls(**dict(values))

    def study_name(self, agent: str, step: int, run: str | None = None) -> str | None:
        """The study of the search at ``step``: ``<study>:<agent>:<run>:step_<step>`` (``study`` default
        ``"ram_live"``; no ``<run>:`` without a run), or None without ``storage``. One study for all merges would
        hand a later merge the scores of an earlier one, whose snapshots were other weights.

        Args:
            agent: the callback's agent.
            step: the merge's training step.
            run: the training run (a resumed job's is its checkpoint's), or None.

        Returns:
            The study's name, or None.

        Example:
            >>> SearchSetting(storage="sqlite:///s.db").study_name("coder", 200, "20260101-a1b2c3")
            'ram_live:coder:20260101-a1b2c3:step_200'
        """
        if self.storage is None:
            return None
        parts = [self.study or "ram_live", agent] + ([run] if run else []) + [f"step_{int(step)}"]
        return ":".join(parts)

    def search_options(self, agent: str, step: int, run: str | None = None, inputs: Any = None) -> dict[str, Any]:
        """The keywords of :func:`ram_live.search` this setting gives (all but the evaluations and the agents),
        the study named by :meth:`study_name`, and with ``inputs`` the inputs' digest after it (a job resumed after
        other agents published newer snapshots searches them in a study of its own).

        Args:
            agent, step, run: as for :meth:`study_name`.
            inputs: ``(models, base)`` as the search gets them, or None.

        Returns:
            ``budget``, ``space``, ``seed``, ``fidelity``, ``confirm_top``, ``sampler``, ``storage``, ``study``.

        Example:
            >>> sorted(SearchSetting(budget=20).search_options("coder", 200))[:3]
            ['budget', 'confirm_top', 'fidelity']
        """
        names = ("budget", "space", "seed", "fidelity", "confirm_top", "sampler", "storage")
        study = self.study_name(agent, step, run)
        if study is not None and inputs is not None:
            study = f"{study}:{models_fingerprint(*inputs)[:16]}"
        return {**{k: getattr(self, k) for k in names}, "study": study}

    def evaluation(self, fallback: Callable[..., Any] | None = None) -> Callable[..., Any]:
        """The selection evaluation as a callable: ``evaluate`` (a dotted path loaded), else ``fallback``.

        Args:
            fallback: the callback's own evaluation, used when ``evaluate`` is None.

        Returns:
            The evaluation.

        Raises:
            ConfigError: neither is given, or the dotted path does not load.
        """
        fn = load_callable(self.evaluate, "search evaluate") if self.evaluate is not None else fallback
        if fn is None:
            raise ConfigError("search needs an evaluation: set SearchSetting(evaluate=...) or the callback's evaluate")
        return fn

    def confirmation(self) -> Callable[..., Any] | None:
        """The confirming evaluation as a callable (a dotted path loaded).

        Returns:
            ``confirm``, or None when not set.

        Raises:
            ConfigError: the dotted path does not load.
        """
        return load_callable(self.confirm, "search confirm") if self.confirm is not None else None

    def score(self, value: Any) -> float:
        """The number ``search`` maximises, from what the evaluation returned.

        Args:
            value: a number, a tensor (its mean) or a dict of metrics (``metric``, or ``ram/<metric>``, picked).

        Returns:
            The metric's value, negated for ``mode="min"``.

        Raises:
            ConfigError: the dict lacks ``metric``, or has several keys and no ``metric`` is set.
        """
        if isinstance(value, Mapping):
            if self.metric is None:
                if len(value) != 1:
                    raise ConfigError(
                        f"search: the evaluation returned {sorted(value)}; set SearchSetting(metric=...) "
                        "to the one to optimise"
                    )
                value = next(iter(value.values()))
            elif self.metric in value:
                value = value[self.metric]
            elif f"ram/{self.metric}" in value:
                value = value[f"ram/{self.metric}"]
            else:
                raise ConfigError(
                    f"search metric {self.metric!r} is not among the evaluation's metrics {sorted(value)}"
                )
        number = float(value.detach().float().mean().item()) if isinstance(value, Tensor) else float(value)
        return number if self.mode == "max" else -number

    def metric_value(self, score: float) -> float:
        """The metric's own value of a search score.

        Args:
            score: a score :meth:`score` returned.

        Returns:
            The metric's value (the sign of ``mode="min"`` undone).
        """
        return score if self.mode == "max" else -score

    def describe(self) -> dict[str, Any]:
        """The setting as JSON-able values.

        Returns:
            Option name → value (callables as ``module:qualname``).
        """
        from ..selection.sampler import sampler_label

        out = {}
        for f in fields(self):
            v = getattr(self, f.name)
            if f.name == "sampler":
                out[f.name] = sampler_label(v)
            elif f.name == "storage" and v is not None and not isinstance(v, str):
                out[f.name] = f"<{type(v).__name__}>"  # an Optuna storage object
            else:
                out[f.name] = _name_of(v) if callable(v) else jsonable(v)
        return out


# ----------------------------------------------------------------------------------------------- the record


def record_of(
    setting: SearchSetting, result: Any, *, step: int, seconds: float, evaluation: Any = None
) -> dict[str, Any]:
    """What is kept of one search: the chosen options (``merge(**best)``), the metric's value of the best and of
    the best baseline, evaluations and times, and the name of the evaluation's metric (``task_metric``:
    ``"pass@4"`` for a :func:`ram_live.evaluate.rewards` evaluation, the metric of ``best_tasks``; ``evaluation``:
    the search's evaluation, default ``setting.evaluate``), the sampler that refined the arms. JSON-able
    (non-finite numbers as the strings 'inf' / '-inf')."""
    baseline = result.best_baseline
    metric = getattr(getattr(setting.evaluate if evaluation is None else evaluation, "metric", None), "name", None)
    return {
        "step": int(step),
        "metric": setting.metric,
        "mode": setting.mode,
        "budget": setting.budget,
        "best": jsonable(dict(result.best)),
        "best_score": setting.metric_value(float(result.best_score)),
        "best_tasks": jsonable(result.best_trial.tasks),
        "task_metric": metric if isinstance(metric, str) else None,
        "best_baseline": None
        if baseline is None
        else {
            "method": baseline.method,
            "options": jsonable(dict(baseline.options)),
            "score": setting.metric_value(float(baseline.score)),
        },
        "evaluations": len(result.scored),
        "sampler": getattr(result, "sampler", None),  # what refined the arms: "moves", "tpe", "optuna:<class>"
        "arbitrary": bool(getattr(result, "arbitrary", False)),  # every candidate scored the same: no real choice
        "choice_causes": list(getattr(result, "choice_causes", [])),
        "agents": list(result.agents),
        "extrapolation": jsonable(result.best_trial.extrapolation),
        "seconds": {
            "total": seconds,
            "merge": float(result.merge_seconds),
            "evaluate": float(result.evaluate_seconds),
            "overhead": float(result.overhead_seconds),
        },
        "setting": setting.describe(),
    }


# ----------------------------------------------------------------------------------------------- RAMSchedule


def schedule_search(
    schedule: Any,
    model: Any,
    agents: Mapping[str, Any],
    base: Any,
    step: int,
    fallback: Callable[..., Any] | None = None,
) -> tuple[dict[str, Tensor], Any, dict[str, Any]]:
    """:class:`~ram_live.RAMSchedule`'s merge under ``search=``: every candidate swapped into ``model`` for the
    evaluation (restored after each), the winner merged; returns its tensors, its MergeInfo and the record
    (saved by rank 0 to ``<store>/_search/<agent>/step_<step>.json``). Under DDP every rank runs the same search
    on scores averaged over the ranks, so all ranks choose the same merge."""
    from ..api import merge
    from ..selection import search
    from ..store import LocalModel
    from .preflight import check_storage_ranks

    setting: SearchSetting = schedule.search
    if schedule.sharded:
        raise ConfigError(
            "search= needs whole tensors in each process (single device or DDP); this model's "
            "parameters are sharded (DTensor)"
        )
    c = schedule.collective
    check_storage_ranks(setting, c.world_size)
    live = LocalModel.from_obj(model, name=schedule.agent)

    def wrap(fn: Callable[..., Any]) -> Callable[[Any], float]:
        return candidate_evaluation(setting, fn, live, model, c)

    evaluation, confirm = setting.evaluation(fallback), setting.confirmation()  # a file's callable loaded once
    t0 = time.perf_counter()
    result = search(
        dict(agents),
        base=base,
        evaluate=wrap(evaluation),
        confirm=wrap(confirm) if confirm is not None else None,
        importance=schedule.importance,
        **setting.search_options(schedule.agent, step, schedule.run, inputs=(dict(agents), base)),
    )
    seconds = time.perf_counter() - t0
    tensors, info = merge(dict(agents), base=base, return_info=True, chunk_numel=schedule.chunk_numel, **result.best)
    record = record_of(setting, result, step=step, seconds=seconds, evaluation=evaluation)
    path = record_path(Path(schedule.store.root), schedule.agent, step, schedule.run)
    record["run"], record["file"] = schedule.run, str(path)
    if c.rank == 0:
        save_record(path, record, result, durable=schedule.durable)
    return tensors_of(tensors), info, record


# ----------------------------------------------------------------------------------------------- helpers


def record_path(root: Path, agent: str, step: int, run: str | None) -> Path:
    """Where a schedule's search record of ``step`` goes: ``<store>/_search/<agent>/step_<step>.json``, or
    ``step_<step>.<run>.json`` where another run of the agent saved that name (a rerun never replaces an earlier
    run's record; records without a run are the legacy run's)."""
    plain = root / "_search" / agent / f"step_{step}.json"
    try:
        owner = json.loads(plain.read_text()).get("run", LEGACY_RUN)
    except FileNotFoundError:
        return plain
    except (OSError, ValueError, AttributeError):
        owner = None  # unreadable: another's, kept
    return plain if run is None or owner == run else plain.with_name(f"step_{step}.{run}.json")


def _is_path(value: Any) -> bool:
    return isinstance(value, str) and "." in value.replace(":", ".")


def _name_of(fn: Any) -> str:
    return f"{getattr(fn, '__module__', '?')}:{getattr(fn, '__qualname__', type(fn).__name__)}"
