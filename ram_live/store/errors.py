"""The store's exceptions and warnings."""

from __future__ import annotations

from ..errors import RamLiveError


class StoreError(RamLiveError):
    """Something is wrong with a snapshot store."""


class BaseMismatchError(StoreError, ValueError):
    """A model, snapshot or store was made against a different base (fingerprints differ)."""


class SnapshotNotFoundError(StoreError, LookupError):
    """No such agent or snapshot (or it was pruned while being opened)."""


class CorruptSnapshotError(StoreError, ValueError):
    """A manifest that is not one this module's writers write, or a data file that does not match its manifest
    (size, checksum, tensors). ``agent`` and ``step`` name the snapshot (both None for the store's base),
    ``file`` the file at fault, where known."""

    def __init__(
        self, message: str, *, agent: str | None = None, step: int | None = None, file: str | None = None
    ) -> None:
        super().__init__(message)
        self.agent = agent
        self.step = step
        self.file = file


class StoreWarning(UserWarning):
    """Something about a store that does not stop it from being read."""


class UnverifiedSnapshotWarning(StoreWarning):
    """A snapshot or base written before manifests carried checksums (format version 1): it loads, but damage to
    its data files cannot be detected."""
