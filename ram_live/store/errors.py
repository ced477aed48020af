"""The store's exceptions."""

from __future__ import annotations

from ..errors import RamLiveError


class StoreError(RamLiveError):
    """Something is wrong with a snapshot store."""


class BaseMismatchError(StoreError, ValueError):
    """A model, snapshot or store was made against a different base (fingerprints differ)."""


class SnapshotNotFoundError(StoreError, LookupError):
    """No such agent or snapshot (or it was pruned while being opened)."""


class CorruptSnapshotError(StoreError, ValueError):
    """A manifest that does not match its files (never produced by this module's writers)."""

