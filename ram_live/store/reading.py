"""Reading a store: its snapshots (:class:`Snapshot`, :class:`BoxSource`), rebuilt from their manifests' pieces
over the store's base (:class:`~ram_live.store.base.StoreBase`)."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import torch
from torch import Tensor

from ..io.sources import TensorSpec
from .base import ManifestTable, StoreBase, unverified
from .datafiles import Files
from .encoding import apply_encoding
from .errors import BaseMismatchError, CorruptSnapshotError
from .files import read_json
from .format import LEGACY_RUN, Box, box_of, intersect, manifest_name
from .manifest import Checked, check_snapshot


class StoreFolder(Protocol):
    """What snapshots need of their store (:class:`~ram_live.store.SnapshotStore` is one): its folder, its base,
    opening a snapshot again, and reading the importances a snapshot carries."""

    @property
    def root(self) -> Path: ...

    def base_source(self, device: torch.device | str = "cpu") -> StoreBase: ...

    def open(
        self, agent: str, step: int, *, run: str | None = None, device: torch.device | str = "cpu"
    ) -> Snapshot: ...

    def importance_source(self, snapshot: Snapshot) -> Any: ...


class Snapshot(ManifestTable):
    """One agent's snapshot, read lazily: a :class:`TensorSource` whose ``get`` returns base + changes, bit-exact
    in the stored dtype, and whose ``base_source()`` is the store's base.

    Made by :meth:`SnapshotStore.open <ram_live.store.SnapshotStore.open>` / ``latest``: its manifest is checked in
    full and its data files opened here (each file's checksum is verified before its first tensor is used). One
    written by ram_live's first format (no checksums) warns :class:`UnverifiedSnapshotWarning`.

    Args:
        store: the store it is in.
        agent: the agent's name.
        step: the snapshot's step.
        manifest: its manifest, as read.
        device: where :meth:`get` / :meth:`get_box` put tensors (and where the base reads to).
        name: its name as a source (default: ``agent``).
        checked: what :func:`check_snapshot` found of ``manifest``, when it was checked already.
        run: the run of its manifest's file name (default: the run the manifest records; ``"legacy"`` when it
            records none).

    Raises:
        BaseMismatchError: it was taken against another base than the store's.
        CorruptSnapshotError: the manifest is not valid, names a tensor the base lacks (or of another shape or
            dtype), or a data file is not the one it names.
        StoreError: the manifest's format version is newer than this ram_live's.
        SnapshotNotFoundError: the store has no base, or a data file is missing (pruned while opening).

    Example:
        >>> SnapshotStore("runs/ram").latest("coder").get("lm_head.weight")   # doctest: +SKIP
    """

    def __init__(
        self,
        store: StoreFolder,
        agent: str,
        step: int,
        manifest: Mapping[str, Any],
        device: torch.device | str = "cpu",
        name: str | None = None,
        checked: Checked | None = None,
        run: str | None = None,
    ) -> None:
        self.store = store
        self.agent = agent
        self.step = step
        #: the run it belongs to (:mod:`.runs`)
        self.run: str = run if run is not None else manifest.get("run", LEGACY_RUN)
        self.name = name or agent
        self.manifest = manifest
        self.device = torch.device(device)
        self.checked = checked or check_snapshot(manifest, agent, step, self.run)
        self._read_table(manifest)
        self._base = store.base_source(device)
        if manifest["base_fingerprint"] != self._base.fingerprint:
            raise BaseMismatchError(
                f"snapshot {agent!r} step {step} was taken against base {manifest['base_fingerprint']}, "
                f"but the store's base is {self._base.fingerprint}"
            )
        where = f"agent {agent!r} step {step}"
        for key, entry in self._tensors.items():
            b = self._base.records().get(key)
            if b is None or b["shape"] != entry["shape"] or b["dtype"] != entry["dtype"]:
                raise CorruptSnapshotError(
                    f"{where}: tensor {key!r} {entry['dtype']} {entry['shape']} is not a tensor of the store's base",
                    agent=agent,
                    step=step,
                )
        if not self.checked.checksummed:
            unverified(f"snapshot {where}")
        self._files = Files(store.root / agent, self.checked.files, where, agent, step)

    def __repr__(self) -> str:
        return (
            f"Snapshot(agent={self.agent!r}, run={self.run!r}, step={self.step}, "
            f"changed={self.changed:,}/{self.numel:,}, "
            f"bytes={self.bytes:,})"
        )

    # -- facts
    @property
    def numel(self) -> int:
        return int(self.manifest["stats"]["numel"])

    @property
    def changed(self) -> int:
        return int(self.manifest["stats"]["changed"])

    @property
    def density(self) -> float:
        return self.changed / self.numel if self.numel else 0.0

    @property
    def bytes(self) -> int:
        """Bytes of this snapshot's data files on disk."""
        return sum(int(f["bytes"]) for f in self.manifest["files"])

    @property
    def dense_bytes(self) -> int:
        """Bytes of a dense copy of the model in its dtypes."""
        return int(self.manifest["stats"]["dense_bytes"])

    @property
    def lossless(self) -> bool:
        return self.manifest["activity"]["rule"] == "changed"

    @property
    def fingerprint(self) -> str:
        return self._base.fingerprint

    def base_source(self) -> StoreBase:
        """The store's base, which this snapshot is a diff against.

        Returns:
            The :class:`StoreBase`, reading to this snapshot's device.
        """
        return self._base

    @property
    def importance(self) -> Any:
        """The importances stored with this snapshot (a :class:`~ram_live.store.importance_codes.ImportanceSource`:
        float32, the parameters' shapes, 0 at entries the snapshot did not store), or None when it has none.
        ``merge(..., importance={name: snap.importance, ...})`` takes it, and
        ``ram_merge(store.latest_all(), importance="stored")`` takes every agent's."""
        if "importance" not in self.manifest:
            return None
        return self.store.importance_source(self)

    def stored(self, file: int, record: str | None) -> Tensor | None:
        """An array of one of this snapshot's data files, as stored (the file's checksum is verified on first use).

        Args:
            file: the data file's index in the manifest's ``files`` (a piece's ``file``).
            record: the array's name in it (a piece's ``values``, ``positions`` or ``importance`` entry), or None.

        Returns:
            The array (a view of the memory-mapped file, never to be written), or None for a ``record`` of None.

        Raises:
            CorruptSnapshotError: the file fails its checksum, or cannot give the array.
        """
        return self._files.tensor(file, record)

    def verify(self) -> int:
        """Check the checksum of every data file of this snapshot and of the store's base now (else each is
        checked on first use).

        Returns:
            The bytes checked (files written without checksums count 0).

        Raises:
            CorruptSnapshotError: a file's checksum is not its manifest's (naming agent, step and file).
        """
        return self._files.verify() + self._base.verify()

    # -- TensorSource (keys, spec, aliases: _ManifestTable)
    def get(self, key: str) -> Tensor:
        """The agent's tensor ``key``: the base's plus this snapshot's changes, bit-exact.

        Args:
            key: a tensor name (a tied name gives its tensor).

        Returns:
            The tensor on this snapshot's device, in its stored dtype: a new tensor, or on the CPU a view of the
            file when every value of it is stored (never to be written).

        Raises:
            CorruptSnapshotError: a data file (this snapshot's or the base's) fails its checksum, or a piece's
                values or positions do not fit it.
        """
        key = self._aliases.get(key, key)
        shape = tuple(self._tensors[key]["shape"])
        return self.get_box(key, (0,) * len(shape), shape)

    def get_box(self, key: str, offsets: Sequence[int], shape: Sequence[int]) -> Tensor:
        """The box ``offsets`` + ``shape`` of the agent's tensor ``key`` (base + this snapshot's changes).

        Args:
            key: a tensor name (a tied name gives its tensor).
            offsets: the box's first index along each dimension.
            shape: the box's size along each dimension.

        Returns:
            The box on this snapshot's device, in the stored dtype (as :meth:`get` says: possibly a view).

        Raises:
            CorruptSnapshotError: a data file (this snapshot's or the base's) fails its checksum, or a piece's
                values or positions do not fit it.
        """
        key = self._aliases.get(key, key)
        want: Box = (tuple(offsets), tuple(shape))
        pieces = self._tensors[key]["pieces"]
        if len(pieces) == 1 and pieces[0]["encoding"] == "dense" and box_of(pieces[0]) == want:
            # every value is stored (the manifest's check: a dense piece names its values, of its size)
            values = self._files.files[pieces[0]["file"]].tensor(pieces[0]["values"])
            return values.view(want[1]).to(self.device)
        out = self._base.get_box(key, *want)
        for i, p in enumerate(pieces):
            if p["encoding"] == "none":
                continue
            inter = intersect(want, box_of(p))
            if inter is None:
                continue
            values = self._files.tensor(p["file"], p["values"])
            positions = self._files.tensor(p["file"], p.get("positions"))
            where = f"agent {self.agent!r} step {self.step}: tensor {key!r} piece {i}"
            if box_of(p) == want:
                apply_encoding(out.view(-1), p["encoding"], values, positions, where)
            else:
                piece = self._base.get_box(key, *box_of(p))
                apply_encoding(piece.view(-1), p["encoding"], values, positions, where)
                mine, theirs = inter
                out[tuple(mine)] = piece[tuple(theirs)]
        return out.to(self.device)

    def restrict(self, boxes: Mapping[str, Box], name: str | None = None) -> BoxSource:
        """This snapshot seen through ``boxes``: a source of local shards (each ``get`` is one box).

        Args:
            boxes: stored tensor name → its box, ``(offsets, shape)``.
            name: the source's name (default: this snapshot's).

        Returns:
            A :class:`BoxSource` over this snapshot (its ``base_source()`` and ``importance`` cut the same boxes).
        """
        return BoxSource(self, boxes, name or self.name)

    def to_state_dict(self) -> dict[str, Tensor]:
        """Every tensor, reconstructed (as :meth:`get`: possibly views of the files, never to be written).

        Returns:
            Name → tensor for every key, tied names sharing one tensor.
        """
        out: dict[str, Tensor] = {}
        for key in self._keys:
            canonical = self._aliases.get(key, key)
            out[key] = out[canonical] if canonical in out else self.get(canonical)
        return out


class BoxSource:
    """A source that returns one box per key of an underlying source with ``get_box`` (a local shard)."""

    def __init__(self, source: Any, boxes: Mapping[str, Box], name: str) -> None:
        self.source = source
        self.boxes = dict(boxes)
        self.name = name
        fp = getattr(source, "fingerprint", None)
        layout = hashlib.sha256(json.dumps(sorted(self.boxes.items())).encode()).hexdigest()[:16]
        self.fingerprint = f"{fp}:{layout}" if fp is not None else None

    def keys(self) -> list[str]:
        return self.source.keys()

    def spec(self, key: str) -> TensorSpec:
        s = self.source.spec(key)
        canonical = self.source.aliases().get(key, key)
        return TensorSpec(tuple(self.boxes[canonical][1]), s.dtype, s.device, s.is_buffer)

    def get(self, key: str) -> Tensor:
        canonical = self.source.aliases().get(key, key)
        return self.source.get_box(canonical, *self.boxes[canonical])

    def aliases(self) -> dict[str, str]:
        return self.source.aliases()

    def base_source(self) -> Any:
        base = self.source.base_source()
        return BoxSource(base, self.boxes, "base")

    @property
    def importance(self) -> Any:
        """The underlying snapshot's importances seen through the same boxes (None when it has none)."""
        imp = getattr(self.source, "importance", None)
        return None if imp is None else BoxSource(imp, self.boxes, imp.name)


@dataclass(frozen=True)
class SnapshotInfo:
    """A snapshot as listed (its manifest is read on :meth:`open` / :attr:`manifest`).

    Attributes:
        store: the store it is in.
        agent: the agent's name.
        step: the snapshot's step.
        run: the run it belongs to (``"legacy"``: written before stores knew runs).
    """

    store: StoreFolder = field(repr=False)
    agent: str
    step: int
    run: str = LEGACY_RUN

    @property
    def path(self) -> Path:
        return self.store.root / self.agent / manifest_name(self.step, self.run)

    @property
    def manifest(self) -> dict[str, Any]:
        return read_json(self.path)

    def open(self, device: torch.device | str = "cpu") -> Snapshot:
        """Open the snapshot (:meth:`SnapshotStore.open <ram_live.store.SnapshotStore.open>`).

        Args:
            device: where its tensors are read to.

        Returns:
            The :class:`Snapshot`.
        """
        return self.store.open(self.agent, self.step, run=self.run, device=device)
