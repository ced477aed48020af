"""Reading a store: its base (:class:`StoreBase`) and snapshots (:class:`Snapshot`, :class:`BoxSource`), rebuilt
from their manifests' pieces."""

from __future__ import annotations

import hashlib
import json
import warnings
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import torch
from torch import Tensor

from ..io.sources import TensorSpec
from .datafiles import Files
from .encoding import apply_encoding
from .errors import BaseMismatchError, CorruptSnapshotError, UnverifiedSnapshotWarning
from .files import read_json
from .format import Box, box_of, dtype_of, intersect, manifest_name
from .manifest import Checked, check_base, check_snapshot


class StoreFolder(Protocol):
    """What snapshots need of their store (:class:`~ram_live.store.SnapshotStore` is one): its folder, its base,
    opening a snapshot again, and reading the importances a snapshot carries."""

    @property
    def root(self) -> Path: ...

    def base_source(self, device: torch.device | str = "cpu") -> StoreBase: ...

    def open(self, agent: str, step: int, *, device: torch.device | str = "cpu") -> Snapshot: ...

    def importance_source(self, snapshot: Snapshot) -> Any: ...


def _unverified(what: str) -> None:
    warnings.warn(
        UnverifiedSnapshotWarning(
            f"{what} was written by an older ram_live (manifest version 1): its data files carry no checksums, so "
            "damage to them cannot be detected (take it again to checksum it)"
        ),
        stacklevel=4,
    )


class _ManifestTable:
    """The :class:`TensorSource` methods a manifest's table of tensors answers: keys, specs and tied names."""

    device: torch.device

    def _read_table(self, manifest: Mapping[str, Any]) -> None:
        self._tensors: dict[str, Any] = manifest["tensors"]
        self._aliases: dict[str, str] = manifest.get("aliases", {})
        self._keys: list[str] = manifest.get("keys") or list(self._tensors) + list(self._aliases)

    def keys(self) -> list[str]:
        return list(self._keys)

    def spec(self, key: str) -> TensorSpec:
        e = self._tensors[self._aliases.get(key, key)]
        return TensorSpec(tuple(e["shape"]), dtype_of(e["dtype"]), self.device, bool(e.get("buffer")))

    def aliases(self) -> dict[str, str]:
        return dict(self._aliases)

    def records(self) -> Mapping[str, Mapping[str, Any]]:
        """The manifest's record of each stored tensor (shape, dtype, pieces: what :mod:`.importance_codes` reads);
        read-only by convention: the table is the verified manifest's."""
        return self._tensors


class StoreBase(_ManifestTable):
    """The store's base model as a :class:`TensorSource` (dense; assembled from pieces), with its ``fingerprint``."""

    def __init__(
        self,
        folder: Path,
        manifest: Mapping[str, Any],
        device: torch.device | str = "cpu",
        checked: Checked | None = None,
    ) -> None:
        self.name = "base"
        self.folder = folder
        self.checked = checked or check_base(manifest)
        self.manifest = manifest
        self.fingerprint: str = manifest["fingerprint"]
        self.device = torch.device(device)
        self._read_table(manifest)
        if not self.checked.checksummed:
            _unverified("the store's base")
        self._files = Files(folder, self.checked.files, "the store's base")

    def verify(self) -> int:
        """Check every data file's checksum now (else each is checked on first use); returns the bytes checked."""
        return self._files.verify()

    def get(self, key: str) -> Tensor:
        key = self._aliases.get(key, key)
        shape = tuple(self._tensors[key]["shape"])
        return self.get_box(key, (0,) * len(shape), shape, copy=False).to(self.device)

    def get_box(self, key: str, offsets: Sequence[int], shape: Sequence[int], copy: bool = True) -> Tensor:
        """The box ``offsets`` + ``shape`` of the base's tensor ``key`` on the CPU: a new tensor, or with
        ``copy=False`` possibly a view of the memory-mapped file (never to be written)."""
        key = self._aliases.get(key, key)
        entry = self._tensors[key]
        want: Box = (tuple(offsets), tuple(shape))
        pieces = entry["pieces"]
        for p in pieces:
            if box_of(p) == want:
                t = self._files.files[p["file"]].tensor(p["values"])  # the manifest's check: a name, of this box
                return t.clone() if copy else t
        out = torch.empty(want[1], dtype=dtype_of(entry["dtype"]))
        covered = 0
        for p in pieces:
            inter = intersect(want, box_of(p))
            if inter is None:
                continue
            mine, theirs = inter
            part = self._files.slice(p["file"], p["values"], theirs)
            out[tuple(mine)] = part
            covered += part.numel()
        if covered != out.numel():
            raise CorruptSnapshotError(f"base tensor {key!r}: its pieces do not cover the box {want}")
        return out


class Snapshot(_ManifestTable):
    """One agent's snapshot, read lazily: a :class:`TensorSource` whose ``get`` returns base + changes, bit-exact
    in the stored dtype, and whose ``base_source()`` is the store's base."""

    def __init__(
        self,
        store: StoreFolder,
        agent: str,
        step: int,
        manifest: Mapping[str, Any],
        device: torch.device | str = "cpu",
        name: str | None = None,
        checked: Checked | None = None,
    ) -> None:
        self.store = store
        self.agent = agent
        self.step = step
        self.name = name or agent
        self.manifest = manifest
        self.device = torch.device(device)
        self.checked = checked or check_snapshot(manifest, agent, step)
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
            _unverified(f"snapshot {where}")
        self._files = Files(store.root / agent, self.checked.files, where, agent, step)

    def __repr__(self) -> str:
        return (
            f"Snapshot(agent={self.agent!r}, step={self.step}, changed={self.changed:,}/{self.numel:,}, "
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

    def stored(self, file: str, record: Mapping[str, Any] | None) -> Tensor | None:
        """The array ``record`` (a piece's ``values``, ``positions`` or ``importance`` entry) of the data file
        ``file`` of this snapshot, its checksum verified on first use; None for a missing record."""
        return self._files.tensor(file, record)

    def verify(self) -> int:
        """Check the checksum of every data file of this snapshot and of the store's base now (else each is
        checked on first use); :class:`CorruptSnapshotError` naming agent, step and file on a mismatch. Returns
        the bytes checked."""
        return self._files.verify() + self._base.verify()

    # -- TensorSource (keys, spec, aliases: _ManifestTable)
    def get(self, key: str) -> Tensor:
        """The agent's tensor ``key``, bit-exact (a new tensor, or a read-only view of the file when every value
        of it is stored: never to be written)."""
        key = self._aliases.get(key, key)
        shape = tuple(self._tensors[key]["shape"])
        return self.get_box(key, (0,) * len(shape), shape)

    def get_box(self, key: str, offsets: Sequence[int], shape: Sequence[int]) -> Tensor:
        """The box ``offsets`` + ``shape`` of the agent's tensor ``key`` (base + this snapshot's changes)."""
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
        """This snapshot seen through ``boxes`` (key → (offsets, shape)): a source of local shards."""
        return BoxSource(self, boxes, name or self.name)

    def to_state_dict(self) -> dict[str, Tensor]:
        """Every tensor, reconstructed (tied names share one tensor)."""
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
    """

    store: StoreFolder = field(repr=False)
    agent: str
    step: int

    @property
    def path(self) -> Path:
        return self.store.root / self.agent / manifest_name(self.step)

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
        return self.store.open(self.agent, self.step, device=device)
