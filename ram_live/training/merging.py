"""The merging half of :class:`~ram_live.training.schedule.RAMSchedule` (:class:`ScheduleMerging`, which it
inherits): the latest snapshot of every agent merged onto the base (or the merge a search picks), the merged
weights swapped into the live model, and the evaluation's metrics.

>>> result = schedule.merge(model, step=200)                                                # doctest: +SKIP
>>> with schedule.swapped(model, result):                                                  # doctest: +SKIP
...     score = evaluate(model)
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterator, Mapping
from typing import Any

from ..api import ram_merge
from ..store import LocalModel
from .failures import agreeing
from .search import schedule_search, search_metrics
from .tensors import MergeResult, _open_latest, _probe_numbers, _stored_importance, metric_float, swap_tensors

__all__ = ["ScheduleMerging"]


class ScheduleMerging:
    """:meth:`merge`, :meth:`swapped` and :meth:`merge_and_evaluate` of a :class:`RAMSchedule` (its state: the
    store, the base, the RAM config, the search setting, the counters)."""

    def _open(self, live: LocalModel, step: int) -> tuple[dict[str, int], dict[str, Any]]:
        return _open_latest(self, live, step)

    def merge(
        self,
        model: Any,
        step: int,
        epoch: int | None = None,
        evaluate: Callable[[Any], Mapping[str, Any]] | None = None,
    ) -> MergeResult:
        """Merge the latest snapshot of every agent in the store (this run's included; taken now if
        ``snapshot_before_merge`` and this run's is older) onto the base; under ``search``, the merge it picks.

        Args:
            model: the training model (the merged tensors are shaped like this process's part of it).
            step: the training step of the merge.
            epoch: passed on to :meth:`snapshot`.
            evaluate: the search's evaluation when the setting names none (default: the schedule's).

        Returns:
            A :class:`MergeResult`.

        Raises:
            StoreError: :meth:`attach` was not called, or the store holds no snapshot to merge.
            ConfigError: ``importance="stored"`` and a picked snapshot carries none (its agent named).
            SearchError: under ``search``, an evaluation that raised or returned no finite number.
        """
        base = self._require()
        if self.snapshot_before_merge and self.last_snapshot_step < step:
            self.snapshot(model, step, epoch)
        if self.async_write:
            with agreeing(self.collective, "writing its snapshot"):  # on disk before anyone picks it; a barrier
                self.flush()
        t0 = time.perf_counter()
        live = LocalModel.from_obj(model, name=self.agent)
        live.check_like(base, self.agent)
        picks, sources = self._open(live, step)
        names = list(picks)
        agents = []
        for name, s in sources.items():
            if isinstance(s, LocalModel):
                agents.append(s.renamed(name))
            elif self.sharded:
                agents.append(s.restrict(base.boxes(), name))  # this rank's boxes of every snapshot
            else:
                agents.append(s)
        distributed = self.sharded and self.collective.world_size > 1
        variant, searched = self.ram.method, None
        if self.search is not None:  # candidates are swapped into the model: read this agent from its snapshot
            named = {
                a.name: self.store.open(a.name, picks[a.name], run=self.run)
                if isinstance(sources[a.name], LocalModel)
                else a
                for a in agents
            }
            tensors, info, searched = schedule_search(self, model, named, base, step, evaluate or self.evaluate)
            variant = str(searched["best"]["method"])
        else:
            importance = _stored_importance(self, picks, sources, base) if self.importance is not None else None
            tensors, info = ram_merge(
                {a.name: a for a in agents},
                base=base,
                config=self.ram,
                chunk_numel=self.chunk_numel,
                return_info=True,
                importance=importance,
                **({"process_group": True} if distributed else {}),
            )
            if importance is not None:
                info.extra["importance"] = "stored"
        lambdas, rho, density = _probe_numbers(
            self, info, base, agents, names, distributed, searched=searched is not None
        )
        self.last_merge_step = step
        self.merges += 1
        result = MergeResult(step, tensors, picks, lambdas, rho, density, time.perf_counter() - t0, variant)
        result.extra["runs"] = dict(self.picked_runs)  # the store run of each agent's snapshot
        if searched is not None:
            result.extra["search"] = self.last_search = searched
        if "importance" in info.extra:
            result.extra["importance"] = info.extra["importance"]
        return result

    @contextlib.contextmanager
    def swapped(self, model: Any, result: MergeResult) -> Iterator[Any]:
        """Within the block the model holds the merged weights (parameters and buffers); afterwards its own,
        bit-exactly (values are swapped through copies, tensor objects and storages stay the same).

        Args:
            model: the training model.
            result: a :meth:`merge`'s result.

        Yields:
            ``model``, holding the merged weights.
        """
        live = LocalModel.from_obj(model, name=self.agent)
        swap_tensors(live, result.tensors)
        try:
            yield model
        finally:
            swap_tensors(live, result.tensors)

    def merge_and_evaluate(
        self,
        model: Any,
        step: int,
        epoch: int | None = None,
        evaluate: Callable[[Any], Mapping[str, Any]] | None = None,
    ) -> dict[str, float]:
        """:meth:`merge`, then ``evaluate(model)`` with the merged weights swapped in.

        Args:
            model: the training model.
            step: the training step of the merge.
            epoch: passed on to :meth:`snapshot`.
            evaluate: this merge's evaluation (default: the schedule's).

        Returns:
            The metrics, ``ram/``-prefixed: the merge's numbers (:meth:`MergeResult.metrics`), the search's, and the
            evaluation's.

        Raises:
            RemoteRankError: under ``torch.distributed``, the merge or the evaluation failed on another rank (its
                error is raised there); every rank leaves each of them together.
        """
        fn = evaluate or self.evaluate
        c = self.collective  # the ranks leave the merge and the evaluation together, failed or not
        with agreeing(c, f"merging at step {step}"):
            result = self.last_result = self.merge(model, step, epoch, fn)
        metrics = result.metrics()
        if "search" in result.extra:
            metrics.update(search_metrics(result.extra["search"], layout=getattr(fn, "layout", None)))
        if fn is not None:
            with agreeing(c, f"evaluating the merge of step {step}"):
                with self.swapped(model, result):  # floats taken inside: a score may be a view of the weights
                    scores = {k: metric_float(v) for k, v in _as_metrics(fn, fn(model)).items()}
            for key, value in scores.items():
                metrics[key if key.startswith("ram/") else f"ram/{key}"] = value
        self.history.append({"step": float(step), **metrics})
        return metrics


def _as_metrics(fn: Any, value: Any) -> Mapping[str, Any]:
    """An evaluation's return as metrics: a dict as it is; a number as ``eval``, or, from an evaluation that names
    its own (``ram_live.evaluate.rewards``: ``reward``, ``reward/<fn>``, ``eval/<task>``), those."""
    if value is None or isinstance(value, Mapping):
        return value or {}
    logged = getattr(fn, "logged_metrics", None)
    return logged() if callable(logged) else {"eval": value}
