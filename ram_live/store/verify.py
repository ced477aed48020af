"""Checking a whole store (:meth:`SnapshotStore.verify`, ``ram-live stores PATH --verify``): every manifest in
full, every data file's size, tensors and checksum, read again from disk."""

from __future__ import annotations

import time
import warnings
from collections.abc import Iterable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Protocol

from .datafiles import Files
from .errors import BaseMismatchError, StoreError, UnverifiedSnapshotWarning
from .files import read_json
from .format import BASE_DIR, LEGACY_RUN, manifest_name
from .manifest import check_base, check_snapshot
from .reading import Snapshot


class CheckedStore(Protocol):
    """What :func:`verify_store` reads of a store (:class:`~ram_live.store.SnapshotStore` is one)."""

    @property
    def root(self) -> Path: ...

    @property
    def base_path(self) -> Path: ...

    @property
    def base_fingerprint(self) -> str | None: ...

    def has_base(self) -> bool: ...

    def check_agent(self, agent: str) -> str: ...

    def agents(self) -> list[str]: ...

    def list(self, agent: str | None = None) -> list[Any]: ...

    def open(self, agent: str, step: int, *, run: str | None = None) -> Snapshot: ...


@dataclass
class VerifyEntry:
    """What was checked of the base (``agent`` and ``step`` None) or of one snapshot."""

    agent: str | None
    step: int | None
    files: int = 0
    bytes: int = 0  # bytes whose checksum was compared
    checksummed: bool = True  # False: a version 1 manifest (its tensors were decoded instead)
    problem: str | None = None
    run: str | None = None  # the snapshot's run (None for the base)

    @property
    def ok(self) -> bool:
        return self.problem is None

    @property
    def name(self) -> str:
        if self.agent is None:
            return "base"
        return f"{self.agent} step {self.step}" + ("" if self.run in (None, LEGACY_RUN) else f" ({self.run})")


@dataclass
class VerifyReport:
    """Every base and snapshot checked, with the problems found (``ok``: none).

    Attributes:
        root: the store's folder.
        entries: one :class:`VerifyEntry` per base or snapshot checked.
        seconds: how long the check took.
    """

    root: str
    entries: list[VerifyEntry] = field(default_factory=list)
    seconds: float = 0.0

    @property
    def ok(self) -> bool:
        return all(e.ok for e in self.entries)

    @property
    def problems(self) -> list[VerifyEntry]:
        return [e for e in self.entries if not e.ok]

    @property
    def unverified(self) -> list[VerifyEntry]:
        """Entries without checksums (written before manifests carried them)."""
        return [e for e in self.entries if not e.checksummed]

    @property
    def bytes(self) -> int:
        return sum(e.bytes for e in self.entries)

    def to_dict(self) -> dict[str, Any]:
        """The report as JSON-able values.

        Returns:
            The totals and every entry.
        """
        return {
            "store": self.root,
            "ok": self.ok,
            "checked": len(self.entries),
            "problems": len(self.problems),
            "unverified": len(self.unverified),
            "bytes": self.bytes,
            "seconds": self.seconds,
            "entries": [asdict(e) for e in self.entries],
        }

    def table(self) -> str:
        """The report as a text table.

        Returns:
            One line per entry, then the totals.
        """
        lines = [f"{'what':<48}{'files':>6}{'checked MB':>12}  result"]
        for e in self.entries:
            result = e.problem or ("ok" if e.checksummed else "ok (no checksums: written by an older ram_live)")
            lines.append(f"{e.name[:47]:<48}{e.files:>6}{e.bytes / 1e6:>12.1f}  {result}")
        rate = f", {self.bytes / self.seconds / 1e9:.2f} GB/s" if self.seconds > 0 else ""
        lines.append(
            f"{len(self.entries)} checked, {len(self.problems)} with problems, {len(self.unverified)} "
            f"without checksums; {self.bytes / 1e6:.1f} MB in {self.seconds:.2f} s{rate}"
        )
        return "\n".join(lines)


def verify_store(store: CheckedStore, agents: Iterable[str] | None, strict: bool) -> VerifyReport:
    """What :meth:`SnapshotStore.verify` does (see there)."""
    report = VerifyReport(str(store.root))
    t0 = time.perf_counter()
    base_ok = False
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UnverifiedSnapshotWarning)  # the report says so
        if store.has_base():
            entry = VerifyEntry(None, None)
            report.entries.append(entry)
            try:
                manifest = read_json(store.base_path)
                checked = check_base(manifest)
                entry.files, entry.checksummed = len(checked.files), checked.checksummed
                entry.bytes = Files(store.root / BASE_DIR, checked.files, "the store's base").verify()
                base_ok = True
            except (StoreError, OSError) as exc:
                entry.problem = f"{type(exc).__name__}: {exc}"
                if strict:
                    raise
        names = [store.check_agent(a) for a in agents] if agents is not None else store.agents()
        for agent in names:
            for info in store.list(agent):
                entry = VerifyEntry(agent, info.step, run=info.run)
                report.entries.append(entry)
                try:
                    _verify_snapshot(store, agent, info.step, info.run, entry, base_ok)
                except (StoreError, OSError) as exc:
                    entry.problem = f"{type(exc).__name__}: {exc}"
                    if strict:
                        raise
    report.seconds = time.perf_counter() - t0
    return report


def _verify_snapshot(store: CheckedStore, agent: str, step: int, run: str, entry: VerifyEntry, base_ok: bool) -> None:
    manifest = read_json(store.root / agent / manifest_name(step, run))
    checked = check_snapshot(manifest, agent, step, run)
    entry.files, entry.checksummed = len(checked.files), checked.checksummed
    entry.bytes = Files(store.root / agent, checked.files, f"agent {agent!r} step {step}", agent, step).verify()
    if not base_ok:
        raise StoreError("its files are intact, but the store's base is not (see base)")
    if manifest["base_fingerprint"] != store.base_fingerprint:
        raise BaseMismatchError(
            f"taken against base {manifest['base_fingerprint']}, the store's is {store.base_fingerprint}"
        )
    if not checked.checksummed:  # no checksums: at least every tensor must decode
        snap = store.open(agent, step, run=run)
        for key in snap.keys():
            snap.get(key)
    else:
        store.open(agent, step, run=run)  # the tensors fit the base's
