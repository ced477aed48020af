"""Snapshot every n steps, merge every m, evaluate the generalist: the logic of the training callbacks, without a
framework. A plain PyTorch loop uses it directly; ``ram_live.integrations.lightning.RAMCallback`` is a thin
adapter on top.

>>> schedule = RAMSchedule("runs/ram", agent="coder", snapshot_every=50, merge_every=200,
...                        evaluate=lambda model: {"acc": accuracy(model)})          # doctest: +SKIP
>>> schedule.attach(model)              # at train start: the base is the model as it is now (or base=...)
>>> for step in range(1, steps + 1):
...     train_one_step(model)
...     metrics = schedule.on_step(model, step)      # snapshot / merge + evaluate when due; None otherwise
...     if metrics: log(metrics)                     # {"ram/acc": ..., "ram/coder/lambda": ..., ...}

With ``torch.distributed`` initialised, every rank calls every method. Replicated models (DDP): rank 0 writes
the snapshots, every rank merges the same snapshots (rank 0 picks them). Sharded models (DTensor parameters):
every rank writes and merges its own shards; RAM+'s ρ comes from the counts of all ranks.
"""

from __future__ import annotations

import inspect
import os
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from ..engine.stream import DEFAULT_CHUNK_NUMEL
from ..errors import ConfigError, InvalidStateError
from ..importance.sources import check_importance_option
from ..methods.ram.config import RamConfig
from .tensors import MergeResult, metric_float, swap_tensors  # noqa: F401 (re-exported)
from .attaching import attach_base
from .failures import ON_ERROR, agreeing, check_on_error
from .merging import ScheduleMerging
from .search import SearchSetting
from ..store import Collective, LocalCollective, LocalModel, Snapshot, SnapshotStore, SnapshotWriter, StoreError
from ..store.format import LEGACY_RUN

__all__ = ["MergeResult", "RAMSchedule", "every"]

STATE_VERSION = 1


def every(n: int | None, step: int) -> bool:
    """True on steps n, 2n, 3n, … (never for n = None or 0)."""
    return bool(n) and step > 0 and step % int(n) == 0  # type: ignore[operator]


class RAMSchedule(ScheduleMerging):
    """Snapshots of one agent into a shared :class:`~ram_live.store.SnapshotStore`, and periodic RAM merges of the
    latest snapshot of every agent there: the framework-free loop behind the training callbacks.

    Args:
        store: the store, or its folder (shared by every agent's run).
        agent: this run's agent name.
        snapshot_every, merge_every: in optimizer steps (None: never; override :meth:`should_snapshot` /
            :meth:`should_merge` for other rules).
        evaluate: ``evaluate(model) -> dict | float``, called with the merged weights swapped into the model
            (restored exactly afterwards); its metrics are logged ``ram/``-prefixed.
        ram: the merges' :class:`~ram_live.RamConfig` (default ``RamConfig()``, RAM+), or its flat mapping
            ``{"method": "ram", "eps": 0.0}`` (:meth:`RamConfig.to_dict`); :attr:`ram` holds the config.
        snapshot_activity, snapshot_eps: ``"changed"`` (lossless, default) or ``"abs"`` (keep |τ| > eps only).
        keep: prune this agent's snapshots to the newest ``keep``.
        agents: merge only these agents (default: every agent in the store).
        snapshot_before_merge: take this agent's snapshot at a merge step if its latest is older.
        async_write: capture the changed values at the step and write them in a background thread (replicated
            models; sharded ones write in step).
        durable: fsync snapshot files before their manifest.
        chunk_numel: the merges' chunk size.
        search: a :class:`~ram_live.training.search.SearchSetting` (or its options as a mapping): each merge is the
            one :func:`ram_live.search` picks with that held-out evaluation (single device or DDP); the metrics gain
            ``ram/search/*``, :attr:`MergeResult.extra` ``["search"]`` and :attr:`last_search` hold the record, also
            saved to ``<store>/_search/<agent>/step_<N>.json`` and kept in :meth:`state_dict`.
        importance: None (default: plain RAM) or ``"stored"``: every merge (and search) weighs the shared entries
            by the importances stored with the picked snapshots (:meth:`snapshot`'s ``importance=``, or
            :attr:`importance_from`); a picked snapshot without them is a ConfigError naming its agent.
        on_error: ``"warn"`` (default): a snapshot, merge, evaluation, search or save failing in a callback's hook is
            a warning counted in :attr:`errors` (``ram/errors``; :mod:`.failures`); ``"raise"``: it ends training.

    Raises:
        ConfigError: an unknown option (RAM's go in ``ram=``) or an invalid value, naming it.

    >>> schedule = RAMSchedule("runs/ram", agent="coder", snapshot_every=50, merge_every=200)  # doctest: +SKIP
    >>> schedule.attach(model); metrics = schedule.on_step(model, step)  # doctest: +SKIP
    """

    def __init__(
        self,
        store: SnapshotStore | str | os.PathLike[str],
        agent: str,
        *,
        snapshot_every: int | None = None,
        merge_every: int | None = None,
        evaluate: Callable[[Any], Mapping[str, Any]] | None = None,
        ram: RamConfig | Mapping[str, Any] | None = None,
        snapshot_activity: str = "changed",
        snapshot_eps: float = 0.0,
        keep: int | None = None,
        agents: Sequence[str] | None = None,
        snapshot_before_merge: bool = True,
        async_write: bool = False,
        durable: bool = True,
        chunk_numel: int = DEFAULT_CHUNK_NUMEL,
        search: SearchSetting | Mapping[str, Any] | None = None,
        importance: str | None = None,
        on_error: str = ON_ERROR[0],
        **unknown: Any,
    ) -> None:
        for name, value in (("snapshot_every", snapshot_every), ("merge_every", merge_every), ("keep", keep)):
            if value is not None and (not isinstance(value, int) or value < 0):
                raise ConfigError(f"{name} must be a non-negative int or None, got {value!r}")
        self.check_options(unknown, "RAMSchedule")  # a ConfigError naming them (RAM's go in ram=)
        self.ram = RamConfig.from_dict(ram, where="RAMSchedule")
        if snapshot_activity not in ("changed", "abs"):
            raise ConfigError(f"snapshot_activity must be 'changed' or 'abs', got {snapshot_activity!r}")
        SnapshotStore.check_agent(agent)
        self._store_arg = store
        self._store: SnapshotStore | None = store if isinstance(store, SnapshotStore) else None
        self.durable = durable
        self.agent = agent
        self.snapshot_every = snapshot_every
        self.merge_every = merge_every
        self.evaluate = evaluate
        self.last_result: MergeResult | None = None  # of the latest merge_and_evaluate
        self.snapshot_activity, self.snapshot_eps = snapshot_activity, snapshot_eps
        self.keep = keep
        self.agents = list(agents) if agents is not None else None
        self.snapshot_before_merge = snapshot_before_merge
        self.async_write = async_write
        self._pending: Any = None  # the background write in flight (async_write)
        self._executor: Any = None
        self.chunk_numel = chunk_numel
        self.search = SearchSetting.from_mapping(search)
        self.importance = check_importance_option(importance, "RAMSchedule")
        self.last_search: dict[str, Any] | None = None  # the record of the latest searched merge
        self.on_error = check_on_error(on_error)
        self.errors, self.last_error = 0, None  # failures turned into warnings (ram/errors); the latest's record
        # counters (state_dict)
        self.last_snapshot_step = self.last_merge_step = -1
        self.snapshots = self.merges = 0
        self.base_fingerprint: str | None = None
        #: this run's id in the store (:mod:`ram_live.store.runs`): opened by :meth:`attach` (a new run), restored by
        #: :meth:`load_state_dict` (a resumed trainer continues its run)
        self.run: str | None = None
        self.picked_runs: dict[str, str] = {}  # the run of each snapshot the latest merge picked
        # set by attach()
        self.collective: Collective = LocalCollective()
        self.base: LocalModel | None = None
        self.writer: SnapshotWriter | None = None
        self.sharded = False
        self.history: list[dict[str, float]] = []
        #: ``f(model) -> {name: tensor} | None``: the importances of every snapshot not given ``importance=``
        #: (the callbacks set it to read Adam's ``exp_avg_sq`` from the live optimizer)
        self.importance_from: Callable[[Any], Mapping[str, Any] | None] | None = None

    @classmethod
    def option_names(cls) -> tuple[str, ...]:
        """Returns: the constructor's keyword options (``ram`` among them)."""
        skip = {"self", "store", "agent", "unknown"}
        return tuple(n for n in inspect.signature(cls.__init__).parameters if n not in skip)

    @classmethod
    def check_options(cls, names: Any, where: str) -> None:
        """Refuse keywords that are not constructor options.

        Args:
            names: the keywords to check.
            where: the caller, named in the error (e.g. a callback that passes its keywords on).

        Raises:
            ConfigError: naming the unknown ones (RAM's options go in ``ram=RamConfig(...)``).
        """
        unknown = sorted(set(names) - set(cls.option_names()))
        if unknown:
            flat = {f for m in ("ram", "ram_plus", "ram_plus_soft") for f in RamConfig.flat_names(m)} | {"variant"}
            hint = (
                "; RAM's options go in ram=RamConfig(...) (or a mapping {'method': ..., option: value})"
                if set(unknown) & flat
                else ""
            )
            raise ConfigError(
                f"{where}: unknown option(s) {', '.join(map(repr, unknown))}{hint}; its options "
                f"are: {', '.join(cls.option_names())}"
            )

    # ------------------------------------------------------------------------------------------- set-up

    @property
    def store(self) -> SnapshotStore:
        if self._store is None:
            self._store = SnapshotStore(self._store_arg, durable=self.durable)  # type: ignore[arg-type]
        return self._store

    @property
    def attached(self) -> bool:
        return self.base is not None

    def attach(self, model: Any, base: Any = None, *, collective: Collective | None = None) -> str:
        """Set the run's base: take it (a fresh run, ``base=None``: the model as it is now), load it (a resumed run,
        or ``base="store"``) or use the given one; persist it in the store or check it against the store's.

        Args:
            model: the training model (an ``nn.Module``, DDP-wrapped or with DTensor parameters).
            base: None, ``"store"``, or the base model (a module or state dict).
            collective: the ranks' collective (default: torch.distributed's where initialised, else one process).

        Returns:
            The base's fingerprint.

        Raises:
            StoreError: ``"store"`` (or a resumed run) and the store holds no base.
            BaseMismatchError: the base differs from the store's, from another rank's, or from the one this run was
                trained against.
            InputMismatchError: the base's tensors do not match the model's.
        """
        return attach_base(self, model, base, collective)

    def _writer(self) -> SnapshotWriter:
        if self.writer is None:  # attach failed after taking the base (its error said why)
            raise InvalidStateError(f"RAMSchedule({self.agent!r}): attach(model) failed; call it again")
        return self.writer

    def _require(self) -> LocalModel:
        if self.base is None:
            raise StoreError("RAMSchedule.attach(model) must be called first (at train start)")
        return self.base

    # ------------------------------------------------------------------------------------------- decisions

    def should_snapshot(self, step: int, epoch: int | None = None) -> bool:
        """Whether to snapshot now.

        Args:
            step: the optimizer steps taken (1-based).
            epoch: the epoch, for rules of your own.

        Returns:
            True on multiples of ``snapshot_every``.
        """
        return every(self.snapshot_every, step)

    def should_merge(self, step: int, epoch: int | None = None) -> bool:
        """Whether to merge the generalist now.

        Args:
            step: the optimizer steps taken (1-based).
            epoch: the epoch, for rules of your own.

        Returns:
            True on multiples of ``merge_every``.
        """
        return every(self.merge_every, step)

    def on_step(
        self,
        model: Any,
        step: int,
        epoch: int | None = None,
        evaluate: Callable[[Any], Mapping[str, Any]] | None = None,
    ) -> dict[str, float] | None:
        """Snapshot and/or merge and evaluate, when due.

        Args:
            model: the training model.
            step: the optimizer steps taken (1-based).
            epoch: the epoch, for rules of your own.
            evaluate: this merge's evaluation (default: the schedule's).

        Returns:
            The metrics to log (``ram/...``) after a merge, else None.
        """
        if step > self.last_snapshot_step and self.should_snapshot(step, epoch):
            self.snapshot(model, step, epoch)
        if step > self.last_merge_step and self.should_merge(step, epoch):
            return self.merge_and_evaluate(model, step, epoch, evaluate)
        return None

    # ------------------------------------------------------------------------------------------- actions

    def snapshot(
        self,
        model: Any,
        step: int,
        epoch: int | None = None,
        extra: Mapping[str, Any] | None = None,
        importance: Mapping[str, Any] | None = None,
    ) -> Snapshot | None:
        """Write this agent's snapshot (every rank calls).

        With ``async_write`` (replicated models) the changed values are captured now and written to disk by a
        background thread while training goes on (:meth:`flush` waits for the write).

        Args:
            model: the training model.
            step: the step the snapshot is of.
            epoch: recorded with it.
            extra: JSON-able metadata stored in its manifest.
            importance: ``{parameter name: tensor}`` stored at its active entries (e.g.
                ``adam_importance(optimizer, model)``; DTensors: their local shards); merges weigh by them under
                ``importance="stored"`` (docs/curvature.md). Default: :attr:`importance_from`'s, where set.

        Returns:
            The :class:`Snapshot` on rank 0 of a replicated run or on every rank of a sharded one; None on other
            ranks and with ``async_write``.

        Raises:
            StoreError: :meth:`attach` was not called.
            InputMismatchError: the model's tensors do not match the base's, or invalid importances.
        """
        self._require()
        c, snap = self.collective, None
        if importance is None and self.importance_from is not None:
            importance = self.importance_from(model)
        if self.sharded:
            snap = self._writer().snapshot(model, step, epoch=epoch, extra=extra, importance=importance)
            self._prune()
        else:
            with agreeing(c, f"writing {self.agent!r}'s snapshot of step {step}"):  # rank 0 writes; a barrier too
                if c.rank == 0:
                    self.flush()  # async_write: the previous snapshot's background write
                    writer = self._writer()
                    local = LocalModel.from_obj(model, name=self.agent)
                    local.check_like(writer.base, self.agent)
                    capture = writer.capture(local, importance=importance)
                    if self.async_write:
                        if self._executor is None:
                            from concurrent.futures import ThreadPoolExecutor

                            self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="ram_live_write")
                        self._pending = self._executor.submit(self._write, capture, step, epoch, extra)
                    else:
                        snap = self._write(capture, step, epoch, extra)
        self.last_snapshot_step = step
        self.snapshots += 1
        return snap

    def _write(self, capture: Any, step: int, epoch: int | None, extra: Mapping[str, Any] | None) -> Snapshot | None:
        snap = self._writer().write(capture, step, epoch=epoch, extra=extra)
        self._prune()
        return snap

    def _prune(self) -> None:
        if self.keep is not None and self.collective.rank == 0:
            self.store.prune(self.keep, self.agent, run=self.run)  # never another run's snapshots

    def flush(self) -> None:
        """Wait for a background write (``async_write``); raises its error, if any."""
        pending, self._pending = self._pending, None
        if pending is not None:
            pending.result()

    # ------------------------------------------------------------------------------------------- state

    def state_dict(self) -> dict[str, Any]:
        """The counters a checkpoint keeps (waits for a background write first).

        Returns:
            JSON-able ``{"version", "agent", "store", "base_fingerprint", "last_snapshot_step", ...}``.
        """
        self.flush()  # a checkpoint never counts a snapshot that is not on disk
        return {
            "version": STATE_VERSION,
            "agent": self.agent,
            "store": str(self._store.root if self._store is not None else self._store_arg),
            "base_fingerprint": self.base_fingerprint,
            "run": self.run,
            "last_snapshot_step": self.last_snapshot_step,
            "last_merge_step": self.last_merge_step,
            "snapshots": self.snapshots,
            "merges": self.merges,
            "last_search": self.last_search,
            "errors": self.errors,
        }

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Restore the counters of :meth:`state_dict` (a resumed run; :meth:`attach` then loads the store's base).

        Args:
            state: what :meth:`state_dict` returned.

        Raises:
            ConfigError: the state is another agent's.
        """
        if state.get("agent") not in (None, self.agent):
            raise ConfigError(f"state of agent {state.get('agent')!r} loaded into the schedule of {self.agent!r}")
        self.base_fingerprint = state.get("base_fingerprint")
        # a checkpoint of a ram_live before runs wrote the legacy run (LEGACY_RUN)
        self.run = state.get("run", LEGACY_RUN if self.base_fingerprint is not None else None)
        self.last_snapshot_step = int(state.get("last_snapshot_step", -1))
        self.last_merge_step = int(state.get("last_merge_step", -1))
        self.snapshots = int(state.get("snapshots", 0))
        self.merges = int(state.get("merges", 0))
        self.last_search = state.get("last_search")
        self.errors = int(state.get("errors", 0))
