"""Capturing snapshots on the weights' device (:class:`SnapshotWriter`) and the piece tables they write."""

from __future__ import annotations

import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import torch
from torch import Tensor

from ..errors import ConfigError
from ..methods import Activity
from .collective import Collective, LocalCollective
from .encoding import Encoded, encode_many
from .format import dtype_name
from .importance_codes import encode_active, local_importance
from .local import LocalModel, LocalTensor
from .reading import Snapshot


def activity_rule(rule: str, eps: float) -> Activity:
    if rule not in ("changed", "abs"):
        raise ConfigError(f"snapshot activity must be 'changed' (lossless) or 'abs' (|τ| > eps), got {rule!r}")
    if rule == "abs" and not eps >= 0:
        raise ConfigError(f"eps must be >= 0, got {eps!r}")
    return Activity(rule, float(eps))  # type: ignore[arg-type]


class SnapshotTarget(Protocol):
    """What a :class:`SnapshotWriter` needs of its store (:class:`~ram_live.store.SnapshotStore` is one): the
    base set or checked, part files written, their pieces gathered from the ranks, the manifest committed."""

    @property
    def root(self) -> Path: ...

    @property
    def base_fingerprint(self) -> str | None: ...

    def check_agent(self, agent: str) -> str: ...

    def set_base(self, base: Any, *, collective: Collective | None = None, writer: bool = True) -> str: ...

    def open_run(self, agent: str, run: str | None = None) -> tuple[str, float | None]: ...

    def write_part(
        self,
        agent: str,
        step: int,
        nonce: str,
        rank: int,
        tensors: dict[str, Tensor],
        pieces: dict[str, list[dict[str, Any]]],
    ) -> dict[str, Any]: ...

    def exchange_parts(
        self, folder: Path, stem: str, part: dict[str, Any] | None, collective: Collective
    ) -> list[dict[str, Any]]: ...

    def commit_snapshot(
        self,
        agent: str,
        step: int,
        parts: Sequence[Mapping[str, Any]],
        local: LocalModel,
        fp: str,
        rule: Activity,
        totals: SnapshotTotals,
        epoch: int | None,
        extra: Mapping[str, Any] | None,
        *,
        run: str,
        run_started: float | None = None,
    ) -> Snapshot: ...


class SnapshotTotals(Protocol):
    """The counts a snapshot's manifest records (:meth:`SnapshotStore.commit_snapshot` reads them)."""

    numel: int
    changed: int
    dense_bytes: int

    def dtype(self) -> str | None:
        """The dtype holding most of the elements (the manifest's ``dtype``), or None when there are none."""
        ...


class CaptureTotals:
    def __init__(self) -> None:
        self.numel = 0
        self.changed = 0
        self.dense_bytes = 0
        self._by_dtype: dict[str, int] = {}

    def add(self, t: LocalTensor, enc: Encoded) -> None:
        n = t.tensor.numel()
        self.numel += n
        self.changed += enc.count
        self.dense_bytes += n * t.tensor.element_size()
        name = dtype_name(t.tensor.dtype)
        self._by_dtype[name] = self._by_dtype.get(name, 0) + n

    def merge(self, other: Sequence[int]) -> None:
        self.numel, self.changed, self.dense_bytes = (int(x) for x in other)

    def dtype(self) -> str | None:
        return max(self._by_dtype, key=self._by_dtype.__getitem__) if self._by_dtype else None


def piece_entry(
    key: str,
    rank: int,
    t: LocalTensor,
    enc: Encoded,
    tensors: dict[str, Tensor],
    importance: tuple[Tensor, float] | None = None,
) -> dict[str, Any]:
    entry: dict[str, Any] = {
        "offsets": list(t.offsets),
        "shape": list(t.tensor.shape),
        "encoding": enc.encoding,
        "count": enc.count,
    }
    if importance is not None:
        name = f"{key}@{rank}/importance"
        tensors[name] = importance[0]
        entry["importance"] = name
        entry["importance_max"] = importance[1]
    if enc.values is not None:
        name = f"{key}@{rank}/values"
        tensors[name] = enc.values
        entry["values"] = name
    if enc.positions is not None:
        name = f"{key}@{rank}/{enc.encoding}"
        tensors[name] = enc.positions
        entry["positions"] = name
    return entry


class SnapshotWriter:
    """Takes snapshots of one agent against a base it holds on the weights' device.

    At creation the base is copied (``clone_base``), fingerprinted and persisted in the store, or checked against
    the store's (:class:`BaseMismatchError` when they differ). :meth:`snapshot` compares the model with it bit by
    bit on the weights' device, selects the changed values there, and moves only those (and their positions) to
    the CPU; nothing else of the model is copied.

    ``trusted_fingerprint``: the fingerprint of a base read from this very store (skips hashing it again).

    Each writer writes one run of the agent (:attr:`run`): a new one by default, kept apart from the agent's earlier
    runs (their snapshots are never replaced or removed, also at the same steps, and merges take the agent's
    snapshots from its newest run only); ``run=`` continues an earlier run (a resumed trainer's).

    ``activity="changed"`` (default) is lossless. ``activity="abs"`` keeps only entries with |τ| > ``eps``: the
    reconstruction is then the base elsewhere, which RAM (whose rule drops those entries anyway) merges identically
    when its own ``eps`` is at least the snapshot's.

    Args:
        store: the store (a :class:`~ram_live.store.SnapshotStore`).
        agent: the agent's name.
        base: the base model (module, state dict or source; DTensor parameters: this rank's shards).
        activity: ``"changed"`` or ``"abs"``.
        eps: the threshold of ``"abs"``.
        collective: the ranks' collective (default: this process alone).
        clone_base: keep a copy of ``base``, not the live tensors.
        writer: ``False`` on ranks that hold a replica and must not write (DDP ranks > 0).
        trusted_fingerprint: see above.
        run: None (a new run) or the id of the run to continue (an earlier writer's :attr:`run`).

    Raises:
        ConfigError: ``agent``, ``activity``, ``eps`` or ``run`` is not valid.
        BaseMismatchError: the store's base is another one.
    """

    def __init__(
        self,
        store: SnapshotTarget,
        agent: str,
        base: Any,
        *,
        activity: str = "changed",
        eps: float = 0.0,
        collective: Collective | None = None,
        clone_base: bool = True,
        writer: bool = True,
        trusted_fingerprint: str | None = None,
        run: str | None = None,
    ) -> None:
        self.store = store
        self.agent = store.check_agent(agent)
        self.rule = activity_rule(activity, eps)
        self.collective = collective or LocalCollective()
        if self.collective.world_size > 1:  # every rank writes into rank 0's run
            mine = list(store.open_run(self.agent, run)) if self.collective.rank == 0 else None
            opened = self.collective.broadcast_json(mine)
        else:
            opened = list(store.open_run(self.agent, run))
        #: this writer's run id, and when the run began (None: the legacy run)
        self.run: str = opened[0]  # type: ignore[index]
        self.run_started: float | None = opened[1]  # type: ignore[index]
        self.writes = writer
        self.base = LocalModel.from_obj(base, clone=clone_base, name="base")
        if trusted_fingerprint is not None and trusted_fingerprint == store.base_fingerprint:
            self.fingerprint = trusted_fingerprint  # the base was read from this store: no need to hash it again
        else:
            self.fingerprint = store.set_base(self.base, collective=self.collective, writer=writer)

    def snapshot(
        self,
        model: Any,
        step: int,
        *,
        epoch: int | None = None,
        extra: Mapping[str, Any] | None = None,
        importance: Mapping[str, Tensor] | None = None,
    ) -> Snapshot | None:
        """Write ``model``'s snapshot at ``step`` (all ranks call it when sharded; rank 0 returns the
        :class:`Snapshot`, the others None).

        Args:
            model: the agent (module, state dict or source; DTensor parameters: this rank's shards).
            step: the training step (names the snapshot).
            epoch, extra: recorded in the manifest.
            importance: ``{parameter name: non-negative tensor of its shape}`` (e.g.
                :func:`ram_live.importance.adam_importance`; DTensors: their local shards are kept with the
                local shards of the weights), stored at the snapshot's active entries (:mod:`.importance_codes`).

        Returns:
            The new :class:`Snapshot` on rank 0, None on the other ranks.

        Raises:
            InputMismatchError: the model's tensors differ from the base's (keys, shapes, dtypes).
            ConfigError: ``step`` or ``importance`` is not valid.

        Example:
            >>> writer.snapshot(model, step=50, importance=adam_importance(opt, model))      # doctest: +SKIP
        """
        local = LocalModel.from_obj(model, name=self.agent)
        local.check_like(self.base, self.agent)
        return self.write(self.capture(local, importance=importance), step, epoch=epoch, extra=extra)

    def capture(self, model: Any, importance: Mapping[str, Tensor] | None = None) -> Capture:
        """The changed values of every owned tensor (and their ``importance``, see :meth:`snapshot`), on the CPU
        (the part of a snapshot a rank writes). Importances are checked before anything is written.

        Args:
            model: the agent (module, state dict, source or :class:`LocalModel`).
            importance: per-parameter importances, as :meth:`snapshot` takes them.

        Returns:
            The :class:`Capture`, for :meth:`write`.
        """
        local = model if isinstance(model, LocalModel) else LocalModel.from_obj(model, name=self.agent)
        tensors: dict[str, Tensor] = {}
        pieces: dict[str, list[dict[str, Any]]] = {}
        totals = CaptureTotals()
        rank = self.collective.rank
        with torch.no_grad():
            keys = [key for key, t in local.tensors.items() if t.owner and self.writes]
            pairs = [(local.tensors[key].tensor.reshape(-1), self.base.tensors[key].tensor.reshape(-1)) for key in keys]
            imps = {
                key: local_importance(
                    importance, key, local.tensors[key].tensor.shape, self.agent, local.tensors[key].tensor.device
                )
                for key in keys
                if importance is not None and takes_importance(local.tensors[key])
            }
            for key, enc in zip(keys, encode_many(pairs, self.rule)):
                t = local.tensors[key]
                imp = encode_active(imps[key], enc, key, self.agent) if key in imps else None
                pieces[key] = [piece_entry(key, rank, t, enc, tensors, imp)]
                totals.add(t, enc)
        return Capture(local, tensors, pieces, totals)

    def write(
        self, capture: Capture, step: int, *, epoch: int | None = None, extra: Mapping[str, Any] | None = None
    ) -> Snapshot | None:
        """Write a :meth:`capture` (possibly in another thread): part files, then rank 0's manifest.

        Args:
            capture: what :meth:`capture` took.
            step: the training step (names the snapshot).
            epoch: recorded in the manifest.
            extra: JSON-able values kept in the manifest's ``extra``.

        Returns:
            The new :class:`Snapshot` on rank 0, None on the other ranks.
        """
        c = self.collective
        nonce = c.broadcast_json(uuid.uuid4().hex[:12]) if c.world_size > 1 else uuid.uuid4().hex[:12]
        part = (
            self.store.write_part(self.agent, step, nonce, c.rank, capture.tensors, capture.pieces)
            if self.writes
            else None
        )
        parts = self.store.exchange_parts(self.store.root / self.agent, f"{step:012d}-{nonce}", part, c)
        totals = capture.totals
        if c.world_size > 1:
            mine = [totals.numel, totals.changed, totals.dense_bytes]
            totals.merge([sum(col) for col in zip(*c.all_gather_int64(mine))])
        snap = None
        if c.rank == 0:
            snap = self.store.commit_snapshot(
                self.agent,
                step,
                parts,
                capture.local,
                self.fingerprint,
                self.rule,
                totals,
                epoch,
                extra,
                run=self.run,
                run_started=self.run_started,
            )
        c.barrier()
        return snap


def takes_importance(t: LocalTensor) -> bool:
    """Whether a snapshot with importances stores them for this tensor (floating parameters, not buffers)."""
    return not t.is_buffer and t.tensor.dtype.is_floating_point


@dataclass
class Capture:
    """What :meth:`SnapshotWriter.capture` took: CPU tensors and the piece table, ready to write."""

    local: LocalModel
    tensors: dict[str, Tensor]
    pieces: dict[str, list[dict[str, Any]]]
    totals: CaptureTotals

    @property
    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in self.tensors.values())
