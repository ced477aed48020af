"""Reading the store's base (:class:`StoreBase`), and the table of tensors every manifest carries
(:class:`ManifestTable`, which :class:`~ram_live.store.Snapshot` shares)."""

from __future__ import annotations

import warnings
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from ..io.sources import TensorSpec
from .datafiles import Files
from .errors import CorruptSnapshotError, UnverifiedSnapshotWarning
from .format import Box, box_of, dtype_of, intersect
from .manifest import Checked, check_base


def unverified(what: str) -> None:
    """Warn that ``what`` (a version-1 base or snapshot) carries no checksums."""
    warnings.warn(
        UnverifiedSnapshotWarning(
            f"{what} was written by an older ram_live (manifest version 1): its data files carry no checksums, so "
            "damage to them cannot be detected (take it again to checksum it)"
        ),
        stacklevel=4,
    )


class ManifestTable:
    """The :class:`TensorSource` methods a manifest's table of tensors answers: keys, specs and tied names."""

    device: torch.device

    def _read_table(self, manifest: Mapping[str, Any]) -> None:
        self._tensors: dict[str, Any] = manifest["tensors"]
        self._aliases: dict[str, str] = manifest.get("aliases", {})
        self._keys: list[str] = manifest.get("keys") or list(self._tensors) + list(self._aliases)

    def keys(self) -> list[str]:
        """The model's tensor names, tied names included, in the model's order.

        Returns:
            A new list of the names.
        """
        return list(self._keys)

    def spec(self, key: str) -> TensorSpec:
        """What the tensor ``key`` is, without reading it.

        Args:
            key: a tensor name (a tied name gives its tensor's spec).

        Returns:
            Its :class:`TensorSpec`: shape, stored dtype, this source's device, and whether it is a buffer.
        """
        e = self._tensors[self._aliases.get(key, key)]
        return TensorSpec(tuple(e["shape"]), dtype_of(e["dtype"]), self.device, bool(e.get("buffer")))

    def aliases(self) -> dict[str, str]:
        """The tied names.

        Returns:
            A new dict: tied name → the name its tensor is stored under (empty when nothing is tied).
        """
        return dict(self._aliases)

    def records(self) -> Mapping[str, Mapping[str, Any]]:
        """The manifest's record of each stored tensor (shape, dtype, pieces: what :mod:`.importance_codes` reads).

        Returns:
            Stored name → record; read-only by convention (the table is the verified manifest's).
        """
        return self._tensors


class StoreBase(ManifestTable):
    """The store's base model as a :class:`TensorSource` (dense; assembled from pieces), with its ``fingerprint``.
    Made by :meth:`SnapshotStore.base_source <ram_live.store.SnapshotStore.base_source>`: its manifest is checked in
    full and its data files opened here (each file's checksum is verified before its first tensor is used). A base
    written by ram_live's first format (no checksums) warns :class:`UnverifiedSnapshotWarning`.

    Args:
        folder: the store's ``_base`` folder.
        manifest: the base's manifest (``_base/base.json``), as read.
        device: where :meth:`get` puts tensors (:meth:`get_box` reads to the CPU).
        checked: what :func:`check_base` found of ``manifest``, when it was checked already (else it is checked here).

    Raises:
        CorruptSnapshotError: the manifest is not valid, or a data file is not the one it names (size, tensors).
        StoreError: the manifest's format version is newer than this ram_live's.
        SnapshotNotFoundError: a data file is missing.

    Example:
        >>> SnapshotStore("runs/ram").base_source().get("lm_head.weight")   # doctest: +SKIP
    """

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
            unverified("the store's base")
        self._files = Files(folder, self.checked.files, "the store's base")

    def verify(self) -> int:
        """Check every data file's checksum now (else each is checked on first use).

        Returns:
            The bytes checked (0 for a base written without checksums).

        Raises:
            CorruptSnapshotError: a data file's checksum is not the manifest's.
        """
        return self._files.verify()

    def get(self, key: str) -> Tensor:
        """The base's tensor ``key``, on this base's device.

        Args:
            key: a tensor name (a tied name gives its tensor).

        Returns:
            The tensor in its stored dtype; on the CPU possibly a view of the memory-mapped file (never to be written).

        Raises:
            CorruptSnapshotError: its data file fails its checksum, or its pieces do not cover it.
        """
        key = self._aliases.get(key, key)
        shape = tuple(self._tensors[key]["shape"])
        return self.get_box(key, (0,) * len(shape), shape, copy=False).to(self.device)

    def get_box(self, key: str, offsets: Sequence[int], shape: Sequence[int], copy: bool = True) -> Tensor:
        """The box ``offsets`` + ``shape`` of the base's tensor ``key``, on the CPU.

        Args:
            key: a tensor name (a tied name gives its tensor).
            offsets: the box's first index along each dimension.
            shape: the box's size along each dimension.
            copy: return a new tensor; ``False``: possibly a view of the memory-mapped file (never to be written).

        Returns:
            The box, in the stored dtype.

        Raises:
            CorruptSnapshotError: a data file fails its checksum, or the pieces do not cover the box.
        """
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
