"""One process writing a model into a :class:`~ram_live.store.SnapshotStore` a group of boxes at a time.

The store's own writers take a whole model (or, sharded, one rank's part per process, all ranks together). A
verl checkpoint is the opposite case: one process (the trainer's driver, or the offline command) reads the
ranks' shard files one after the other and must never hold the whole model. :class:`PieceWriter` writes each
group of boxes (one rank's shards, or a few whole tensors) as its own part file, exactly the layout of a sharded
snapshot (pieces with offsets), then commits one manifest. :func:`stream_fingerprint` computes the store's
content fingerprint from the same groups (it is independent of how the model is cut, so it equals
:func:`ram_live.store.fingerprint` of the whole model).

This module writes through the store's part-level API (:meth:`SnapshotStore.write_part`,
:meth:`~SnapshotStore.commit_snapshot`, :meth:`~SnapshotStore.write_base_part`,
:meth:`~SnapshotStore.compose_manifest`, :func:`ram_live.store.files.write_json`); nothing else in the
integration does, so that moving these classes into the store is a copy.
"""

from __future__ import annotations

import time
import uuid
from typing import Any, Iterable, Mapping, Sequence

import torch
from torch import Tensor

from ram_live.errors import UnsupportedInputError
from ram_live.methods import Activity
from ram_live.store import (
    BASE_DIR,
    BASE_FORMAT,
    VERSION,
    BaseMismatchError,
    LocalModel,
    LocalTensor,
    SnapshotStore,
    SnapshotWriter,
    fingerprint,
)
from ram_live.store.files import write_json

__all__ = ["BaseWriter", "PieceWriter", "group_model", "meta_model", "stream_fingerprint"]


def meta_model(specs: Mapping[str, tuple[tuple[int, ...], torch.dtype]], name: str = "model") -> LocalModel:
    """A :class:`LocalModel` of meta tensors (keys, global shapes, dtypes; no data): what a manifest describes."""
    tensors = {
        k: LocalTensor(torch.empty(shape, dtype=dtype, device="meta"), tuple(shape), (0,) * len(shape), False)
        for k, (shape, dtype) in specs.items()
    }
    return LocalModel(tensors, {}, list(specs), name, distributed=True)


def group_model(
    specs: Mapping[str, tuple[tuple[int, ...], torch.dtype]], boxes: Mapping[str, LocalTensor], name: str = "group"
) -> LocalModel:
    """Every key of ``specs``; the keys of ``boxes`` hold those boxes (owned), the others are meta placeholders."""
    tensors = {}
    for k, (shape, dtype) in specs.items():
        t = boxes.get(k)
        tensors[k] = (
            t
            if t is not None
            else LocalTensor(
                torch.empty((0,) * len(shape), dtype=dtype, device="meta"), tuple(shape), (0,) * len(shape), False
            )
        )
    return LocalModel(tensors, {}, list(specs), name, distributed=True)


class _Record:
    """A collective that lets :func:`ram_live.store.fingerprint` hash one group of boxes and hand back its partial
    sums (the other "ranks" contribute zeros), or replays every group's partial sums to finish the hash."""

    rank = 0

    def __init__(self, replay: Sequence[Sequence[int]] | None = None) -> None:
        self.replay = [list(r) for r in replay] if replay is not None else None
        self.world_size = max(2, len(self.replay or ()))
        self.recorded: list[int] | None = None

    def barrier(self) -> None:  # pragma: no cover - fingerprint never calls it
        pass

    def all_gather_int64(self, values: Sequence[int]) -> list[list[int]]:
        if self.replay is not None:
            if len(self.replay) < 2:
                self.replay.append([0] * len(values))
            return self.replay
        self.recorded = list(values)
        return [list(values), [0] * len(values)]

    def all_reduce_sum_(self, tensor: Tensor) -> Tensor:  # pragma: no cover
        return tensor

    def broadcast_json(self, obj: Any) -> Any:  # pragma: no cover
        return obj


class FingerprintAccumulator:
    """:func:`ram_live.store.fingerprint` of a model seen one group of boxes at a time (each element once)."""

    def __init__(self, specs: Mapping[str, tuple[tuple[int, ...], torch.dtype]]) -> None:
        self.specs = dict(specs)
        self.partials: list[list[int]] = []

    def add(self, boxes: Mapping[str, LocalTensor]) -> None:
        rec = _Record()
        fingerprint(group_model(self.specs, boxes), rec)
        assert rec.recorded is not None
        self.partials.append(rec.recorded)

    def value(self) -> str:
        return fingerprint(meta_model(self.specs), _Record(self.partials or [[0] * (2 * len(self.specs))]))


def stream_fingerprint(
    specs: Mapping[str, tuple[tuple[int, ...], torch.dtype]], groups: Iterable[Mapping[str, LocalTensor]]
) -> str:
    acc = FingerprintAccumulator(specs)
    for g in groups:
        acc.add(g)
    return acc.value()


class _Rank:
    """The only collective attribute :meth:`SnapshotWriter.capture` reads: the rank that names pieces."""

    def __init__(self, rank: int) -> None:
        self.rank = rank
        self.world_size = 1


class _Totals:
    """The counters a manifest records (a :class:`ram_live.store.writer.SnapshotTotals`, like the store's own)."""

    def __init__(self) -> None:
        self.numel = 0
        self.changed = 0
        self.dense_bytes = 0
        self.by_dtype: dict[str, int] = {}

    def add(self, other: Any, dtype: torch.dtype) -> None:
        self.numel += other.numel
        self.changed += other.changed
        self.dense_bytes += other.dense_bytes
        name = str(dtype).replace("torch.", "")
        self.by_dtype[name] = self.by_dtype.get(name, 0) + other.numel

    def dtype(self) -> str | None:
        return max(self.by_dtype, key=self.by_dtype.__getitem__) if self.by_dtype else None


class _Count:
    def __init__(self, numel: int, changed: int, dense_bytes: int) -> None:
        self.numel, self.changed, self.dense_bytes = numel, changed, dense_bytes


class PieceWriter:
    """Writes one snapshot of ``agent`` at ``step`` from groups of boxes, then commits its manifest.

    ``specs``: every key's global shape and dtype (the store's base keys). Each :meth:`add` takes a group of
    boxes of the agent (``{key: LocalTensor}``) and the base's values of the same boxes, selects the changed
    values (``activity``: ``"changed"`` lossless, or ``"abs"`` with ``eps``) and writes them as one part file.
    :meth:`commit` checks that the boxes cover every tensor exactly and writes the manifest (last, atomically).
    """

    def __init__(
        self,
        store: SnapshotStore,
        agent: str,
        step: int,
        specs: Mapping[str, tuple[tuple[int, ...], torch.dtype]],
        fingerprint: str,
        *,
        activity: str = "changed",
        eps: float = 0.0,
        run: str,
        run_started: float | None = None,
    ) -> None:
        self.store = store
        self.agent = store.check_agent(agent)
        self.step = int(step)
        self.run, self.run_started = run, run_started  # the store run it goes to (SnapshotStore.open_run)
        self.specs = dict(specs)
        if store.base_fingerprint != fingerprint:
            raise BaseMismatchError(f"{store.root}: the store's base is {store.base_fingerprint}, not {fingerprint}")
        self.fingerprint = fingerprint
        self.rule = Activity(activity, float(eps))  # type: ignore[arg-type]
        self.activity, self.eps = activity, float(eps)
        self.nonce = uuid.uuid4().hex[:12]
        self.parts: list[dict[str, Any]] = []
        self.totals = _Totals()
        self._covered: dict[str, int] = {}

    def add(
        self,
        boxes: Mapping[str, LocalTensor],
        base_boxes: Mapping[str, LocalTensor],
        importance: Mapping[str, Tensor] | None = None,
    ) -> dict[str, int]:
        """Encode and write one group (``importance``: the boxes' importances, stored at their changed entries);
        returns ``{"numel", "changed", "bytes"}`` of it."""
        index = len(self.parts)
        for key, t in boxes.items():
            shape, dtype = self.specs[key]
            if t.tensor.dtype != dtype or tuple(t.global_shape) != tuple(shape):
                raise UnsupportedInputError(
                    f"{self.agent}: tensor {key!r} is {t.tensor.dtype} {list(t.global_shape)}, the store's base "
                    f"{dtype} {list(shape)}"
                )
            b = base_boxes[key]
            if b.box != t.box:
                raise UnsupportedInputError(f"{self.agent}: tensor {key!r}: base box {b.box} != agent box {t.box}")
        base = LocalModel(dict(base_boxes), {}, list(boxes), "base", distributed=True)
        model = LocalModel(dict(boxes), {}, list(boxes), self.agent, distributed=True)
        # a writer of this group's boxes: the base was checked whole (its fingerprint is the store's)
        writer = SnapshotWriter(
            self.store,
            self.agent,
            base,
            activity=self.activity,
            eps=self.eps,
            collective=_Rank(index),
            clone_base=False,  # type: ignore[arg-type]
            trusted_fingerprint=self.fingerprint,
            run=self.run,
        )
        capture = writer.capture(model, importance=importance)
        part = self.store.write_part(self.agent, self.step, self.nonce, index, capture.tensors, capture.pieces)
        self.parts.append(part)
        dtype = next(iter(boxes.values())).tensor.dtype if boxes else torch.float32
        self.totals.add(capture.totals, dtype)
        for key, t in boxes.items():
            if t.owner:
                self._covered[key] = self._covered.get(key, 0) + t.tensor.numel()
        return {"numel": capture.totals.numel, "changed": capture.totals.changed, "bytes": part["file"]["bytes"]}

    def add_unchanged(self, keys: Iterable[str]) -> None:
        """Record whole tensors equal to the base (no data: pieces of encoding ``"none"``) in one part."""
        import math

        pieces = {}
        for key in keys:
            shape, _ = self.specs[key]
            pieces[key] = [{"offsets": [0] * len(shape), "shape": list(shape), "encoding": "none", "count": 0}]
            self._covered[key] = self._covered.get(key, 0) + math.prod(shape)
            n = math.prod(shape)
            dtype = self.specs[key][1]
            self.totals.add(_Count(n, 0, n * dtype.itemsize), dtype)
        if pieces:
            index = len(self.parts)
            self.parts.append(self.store.write_part(self.agent, self.step, self.nonce, index, {}, pieces))

    def commit(self, *, epoch: int | None = None, extra: Mapping[str, Any] | None = None) -> Any:
        import math

        for key, (shape, _) in self.specs.items():
            if self._covered.get(key, 0) != math.prod(shape):
                raise UnsupportedInputError(
                    f"{self.agent}: tensor {key!r}: the checkpoint's shards cover {self._covered.get(key, 0)} of "
                    f"{math.prod(shape)} elements"
                )
        like = meta_model(self.specs, self.agent)
        return self.store.commit_snapshot(
            self.agent,
            self.step,
            self.parts,
            like,
            self.fingerprint,
            self.rule,
            self.totals,
            epoch,
            extra,
            run=self.run,
            run_started=self.run_started,
        )

    def abort(self) -> None:
        """Remove the part files written so far (no manifest references them)."""
        for p in self.parts:
            (self.store.root / self.agent / p["file"]["name"]).unlink(missing_ok=True)
        self.parts.clear()


class BaseWriter:
    """Sets the store's base from groups of whole or partial tensors, or checks it against the store's.

    Hashes every group; when the store has no base yet, also writes each group as a part file and commits the
    base manifest at the end (exclusively: if another writer set a base meanwhile, ours is removed and the two
    fingerprints are compared). :meth:`finish` returns the fingerprint; :class:`BaseMismatchError` when the
    store holds another base.
    """

    def __init__(self, store: SnapshotStore, specs: Mapping[str, tuple[tuple[int, ...], torch.dtype]]) -> None:
        self.store = store
        self.specs = dict(specs)
        self.acc = FingerprintAccumulator(specs)
        self.write = not store.has_base()
        self.nonce = uuid.uuid4().hex[:12]
        self.parts: list[dict[str, Any]] = []
        self.folder = store.root / BASE_DIR

    def add(self, boxes: Mapping[str, LocalTensor]) -> None:
        self.acc.add(boxes)
        if self.write:
            self.folder.mkdir(parents=True, exist_ok=True)
            local = LocalModel(dict(boxes), {}, list(boxes), "base", distributed=True)
            index = len(self.parts)
            self.parts.append(self.store.write_base_part(self.folder, self.nonce, index, local, dict(boxes)))

    def finish(self) -> str:
        fp = self.acc.value()
        if self.write:
            manifest = self.store.compose_manifest(
                self.parts,
                meta_model(self.specs, "base"),
                extra={"format": BASE_FORMAT, "version": VERSION, "fingerprint": fp, "time": time.time()},
            )
            won = write_json(self.store.base_path, manifest, self.store.durable, exclusive=True)
            if not won:
                for f in manifest["files"]:
                    (self.folder / f["name"]).unlink(missing_ok=True)
        existing = self.store.base_fingerprint
        if existing != fp:
            raise BaseMismatchError(
                f"{self.store.root}: the store's base has fingerprint {existing}, this run's base {fp}: the agents of "
                "one store must all be trained from the same base and snapshot with the same `weights` setting "
                "(master weights and their bf16 cast need separate stores)"
            )
        return fp
