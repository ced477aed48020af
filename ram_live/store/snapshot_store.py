"""The store folder (:class:`SnapshotStore`): its base, agents and snapshots listed, opened, pruned and verified;
parts and manifests are written by :mod:`.committing`."""

from __future__ import annotations

import os
import time
import uuid
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from ..errors import ConfigError
from ..methods import Activity
from . import committing
from .collective import Collective, LocalCollective
from .errors import BaseMismatchError, CorruptSnapshotError, SnapshotNotFoundError, StoreError
from .files import read_json, real_folder, write_json
from .format import (
    AGENT_RE,
    BASE_DIR,
    BASE_FORMAT,
    STORE_FORMAT,
    STORE_VERSION,
    VERSION,
    check_step,
    manifest_name,
    manifest_step,
)
from .hashing import fingerprint
from .local import LocalModel, LocalTensor
from .maintenance import collect_garbage, remove_snapshot, remove_unreferenced
from .manifest import Checked, check_base, compose_manifest
from .reading import Snapshot, SnapshotInfo, StoreBase
from .verify import VerifyReport, verify_store
from .importance_codes import ImportanceSource
from .writer import SnapshotTotals, SnapshotWriter, activity_rule


class SnapshotStore:
    """A folder of task-vector snapshots of several agents trained from one base.

    Any number of processes may write (one writer per agent, or one per rank of a sharded agent) and read at
    the same time; readers see only complete snapshots. ``durable=True`` fsyncs data files before their manifest
    (survives power loss, not only killed processes). Every manifest is checked in full before a file it names
    is read or deleted, every data file's CRC-32 before its first tensor is used (:meth:`verify`: all now).
    Files follow the umask.

    Example:
        >>> store = SnapshotStore("runs/ram")                                   # doctest: +SKIP
        >>> store.writer("coder", base=model).snapshot(model, step=50)          # doctest: +SKIP
        >>> store.verify().ok                                                   # doctest: +SKIP
        True
    """

    def __init__(self, root: str | os.PathLike[str], *, create: bool = True, durable: bool = True) -> None:
        self.root = Path(root)
        self.durable = durable
        self._base_cache: dict[tuple[str, str], StoreBase] = {}
        marker = self.root / "store.json"
        if not marker.exists():
            if not create:
                raise SnapshotNotFoundError(f"{self.root}: not a snapshot store (no store.json)")
            self.root.mkdir(parents=True, exist_ok=True)
            write_json(marker, {"format": STORE_FORMAT, "version": STORE_VERSION}, durable=False, exclusive=True)
        info = read_json(marker)
        if not isinstance(info, dict) or info.get("format") != STORE_FORMAT:
            raise CorruptSnapshotError(f"{marker}: not a ram_live snapshot store")
        version = info.get("version", 0)
        if type(version) is not int:
            raise CorruptSnapshotError(f"{marker}: store format version {version!r:.40} is not an integer")
        if version > STORE_VERSION:
            raise StoreError(f"{self.root}: store format version {version} is newer than this ram_live's")
        self._base_checked: tuple[Any, dict[str, Any], Checked] | None = None

    def __repr__(self) -> str:
        return f"SnapshotStore({str(self.root)!r})"

    # -- base

    @property
    def base_path(self) -> Path:
        return self.root / BASE_DIR / "base.json"

    def has_base(self) -> bool:
        return self.base_path.exists()

    def _base_manifest(self) -> tuple[dict[str, Any], Checked]:
        """The base's manifest, checked in full (once per version of the file)."""
        if not real_folder(self.root / BASE_DIR):
            raise CorruptSnapshotError(f"{self.root / BASE_DIR}: not a folder (a symlink?)")
        try:
            st = os.stat(self.base_path)
        except FileNotFoundError:
            raise SnapshotNotFoundError(f"{self.root}: the store has no base yet (a writer sets it)") from None
        stamp = (st.st_ino, st.st_size, st.st_mtime_ns)
        if self._base_checked is None or self._base_checked[0] != stamp:
            manifest = read_json(self.base_path)
            self._base_checked = (stamp, manifest, check_base(manifest))
        return self._base_checked[1], self._base_checked[2]

    @property
    def base_fingerprint(self) -> str | None:
        if not self.has_base():
            return None
        return self._base_manifest()[0]["fingerprint"]

    def base_source(self, device: torch.device | str = "cpu") -> StoreBase:
        """The base every snapshot of this store is a diff against (raises if none was set)."""
        if not self.has_base():
            raise SnapshotNotFoundError(f"{self.root}: the store has no base yet (a writer sets it)")
        manifest, checked = self._base_manifest()
        cache_key = (manifest["fingerprint"], str(torch.device(device)))
        if cache_key not in self._base_cache:
            self._base_cache[cache_key] = StoreBase(self.root / BASE_DIR, manifest, device, checked)
        return self._base_cache[cache_key]

    def set_base(self, base: Any, *, collective: Collective | None = None, writer: bool = True) -> str:
        """Persist ``base`` as the store's base, or check that it equals the one there (:class:`BaseMismatchError`
        otherwise). Returns its fingerprint. All ranks call it; with a sharded base every rank writes its boxes;
        ``writer=False`` on ranks that hold a replica and must not write (DDP ranks > 0)."""
        local = base if isinstance(base, LocalModel) else LocalModel.from_obj(base)
        collective = collective or LocalCollective()
        fp = fingerprint(local, collective)
        existing = collective.broadcast_json(self.base_fingerprint) if collective.world_size > 1 \
            else self.base_fingerprint
        if existing is None:
            folder = self.root / BASE_DIR
            folder.mkdir(parents=True, exist_ok=True)
            nonce = collective.broadcast_json(uuid.uuid4().hex[:12])
            part = None
            if writer:
                tensors = {k: t for k, t in local.tensors.items() if t.owner}
                part = self.write_base_part(folder, nonce, collective.rank, local, tensors)
            parts = self.exchange_parts(folder, f"base-{nonce}", part, collective)
            if collective.rank == 0:
                manifest = self.compose_manifest(parts, local, extra={"format": BASE_FORMAT, "version": VERSION,
                                                                      "fingerprint": fp, "time": time.time()})
                check_base(manifest)  # never write what a reader refuses
                won = write_json(self.base_path, manifest, self.durable, exclusive=True)
                if not won:  # another writer set it first: keep theirs
                    remove_unreferenced(folder, [f["name"] for f in manifest["files"]], base=True)
            collective.barrier()
            existing = self.base_fingerprint
        if existing != fp:
            raise BaseMismatchError(
                f"{self.root}: the store's base has fingerprint {existing}, this model's base {fp}: the agents of one "
                "store must all be trained from the same base (start a new store, or pass the right base=)"
            )
        return fp

    def write_base_part(self, folder: Path, nonce: str, rank: int, local: LocalModel,
                        tensors: Mapping[str, LocalTensor]) -> dict[str, Any]:
        """Write ``tensors`` (this writer's boxes of the base, dense) as the part file ``rank`` of the base in
        ``folder`` (the store's ``_base``); returns the part (``{"file", "pieces"}``) for :meth:`compose_manifest`."""
        return committing.write_base_part(folder, nonce, rank, tensors, self.durable)

    def exchange_parts(self, folder: Path, stem: str, part: dict[str, Any] | None,
                       collective: Collective) -> list[dict[str, Any]]:
        """Rank 0 learns every rank's part (sidecar JSON files on the shared folder, then a barrier)."""
        return committing.exchange_parts(folder, stem, part, collective)

    compose_manifest = staticmethod(compose_manifest)  # part-level API (integrations/verl/pieces.py)

    # -- agents and snapshots

    @staticmethod
    def check_agent(agent: str) -> str:
        if not isinstance(agent, str) or not AGENT_RE.match(agent):
            raise ConfigError(
                f"agent name {agent!r} is not a valid store name: letters, digits, '.', '_', '-', starting with a "
                "letter or digit, at most 128 characters"
            )
        return agent

    def agents(self) -> list[str]:
        """Agents with at least one snapshot, sorted (folders of agent names; never a symlink)."""
        if not self.root.exists():
            return []
        return sorted(p.name for p in self.root.iterdir()
                      if AGENT_RE.match(p.name) and p.name != BASE_DIR and real_folder(p) and self.steps(p.name))

    def steps(self, agent: str) -> list[int]:
        """Steps of ``agent``'s complete snapshots, ascending."""
        folder = self.root / agent
        if not real_folder(folder):
            return []
        try:
            names = os.listdir(folder)
        except FileNotFoundError:
            return []
        return sorted(s for s in map(manifest_step, names) if s is not None)

    def list(self, agent: str | None = None) -> list[SnapshotInfo]:
        """Complete snapshots of ``agent`` (or of every agent), by agent then step."""
        agents = [self.check_agent(agent)] if agent is not None else self.agents()
        return [SnapshotInfo(self, a, s) for a in agents for s in self.steps(a)]

    def open(self, agent: str, step: int, *, device: torch.device | str = "cpu") -> Snapshot:
        """``agent``'s snapshot at ``step``: its manifest checked in full, its data files opened (each file's
        checksum is verified before its first tensor is used; :meth:`Snapshot.verify`: all now)."""
        self.check_agent(agent)
        step = check_step(step)
        folder = self.root / agent
        if folder.is_symlink():
            raise CorruptSnapshotError(f"{folder}: a symlink, not a folder of the store", agent=agent, step=step)
        manifest = read_json(folder / manifest_name(step))
        return Snapshot(self, agent, step, manifest, device)

    def importance_source(self, snapshot: Snapshot) -> ImportanceSource:
        """The importances ``snapshot`` (of this store, with importances) carries (:attr:`Snapshot.importance`)."""
        return ImportanceSource(snapshot)

    def latest(self, agent: str, *, device: torch.device | str = "cpu", retries: int = 5) -> Snapshot:
        """``agent``'s newest complete snapshot (:class:`SnapshotNotFoundError` if it has none)."""
        self.check_agent(agent)
        for _ in range(retries + 1):
            steps = self.steps(agent)
            if not steps:
                raise SnapshotNotFoundError(f"{self.root}: agent {agent!r} has no snapshot")
            try:
                return self.open(agent, steps[-1], device=device)
            except SnapshotNotFoundError:  # pruned or replaced between listing and opening: list again
                continue
        raise SnapshotNotFoundError(f"{self.root}: could not open a snapshot of {agent!r} (pruned concurrently)")

    def latest_all(self, agents: Iterable[str] | None = None, *,
                   device: torch.device | str = "cpu") -> dict[str, Snapshot]:
        """Every agent's (or the named agents') newest snapshot, name → :class:`Snapshot`: pass it straight to
        ``ram_merge`` / ``probe``."""
        names = list(agents) if agents is not None else self.agents()
        return {a: self.latest(a, device=device) for a in names}

    def prune(self, keep: int, agent: str | None = None) -> list[SnapshotInfo]:
        """Delete all but the newest ``keep`` snapshots of ``agent`` (or of every agent); returns what went.
        The manifest goes first, so readers never see a snapshot without its files; readers that opened it
        already keep reading (files are memory-mapped)."""
        if keep < 0:
            raise ConfigError(f"keep must be >= 0, got {keep}")
        removed = []
        for a in ([self.check_agent(agent)] if agent else self.agents()):
            steps = self.steps(a)
            for step in steps[: max(0, len(steps) - keep)]:
                self._remove(a, step)
                removed.append(SnapshotInfo(self, a, step))
        return removed

    def _remove(self, agent: str, step: int) -> None:
        remove_snapshot(self.root / agent, step)

    def gc(self, grace_s: float = 3600.0) -> list[Path]:
        """Delete what killed writers left: data files no manifest references and temporary files, older than
        ``grace_s`` seconds (a younger one may belong to a write in progress). Only regular files of the
        store's own names in the agents' folders and ``_base`` go; a step whose manifest cannot be read keeps
        its files."""
        return collect_garbage(self.root, grace_s)

    def verify(self, agents: Iterable[str] | None = None, *, strict: bool = False) -> VerifyReport:
        """Check the base and every snapshot (of ``agents``, default all): manifests in full, data files'
        sizes, tensors and checksums. Returns a :class:`VerifyReport` of everything checked and every problem
        found; ``strict=True`` raises the first problem instead.

        Example:
            >>> report = SnapshotStore("runs/ram", create=False).verify()     # doctest: +SKIP
            >>> report.ok, len(report.entries), report.bytes                    # doctest: +SKIP
            (True, 41, 1873920112)
        """
        return verify_store(self, agents, strict)

    # -- writing

    def writer(self, agent: str, base: Any, *, activity: str = "changed", eps: float = 0.0,
               collective: Collective | None = None, clone_base: bool = True, writer: bool = True) -> SnapshotWriter:
        """A :class:`SnapshotWriter` for ``agent`` holding ``base`` (see there)."""
        return SnapshotWriter(self, agent, base, activity=activity, eps=eps, collective=collective,
                              clone_base=clone_base, writer=writer)

    def snapshot(self, agent: str, model: Any, step: int, *, epoch: int | None = None,
                 extra: Mapping[str, Any] | None = None, activity: str = "changed", eps: float = 0.0,
                 importance: Mapping[str, Tensor] | None = None) -> Snapshot:
        """Snapshot ``model`` against the store's base read from disk tensor by tensor (one process, no DTensors;
        a training loop should hold a :meth:`writer`, which keeps the base on the weights' device).
        ``importance``: per-parameter importances kept at the active entries (:meth:`SnapshotWriter.snapshot`)."""
        base = self.base_source()
        local = LocalModel.from_obj(model)
        rule = activity_rule(activity, eps)
        tensors, pieces, totals = committing.capture_whole(base, local, agent, rule, importance)
        part = self.write_part(agent, step, uuid.uuid4().hex[:12], 0, tensors, pieces)
        return self.commit_snapshot(agent, step, [part], local, base.fingerprint, rule, totals, epoch, extra)

    def write_part(self, agent: str, step: int, nonce: str, rank: int, tensors: dict[str, Tensor],
                   pieces: dict[str, list[dict[str, Any]]]) -> dict[str, Any]:
        """Write the part file ``rank`` of ``agent``'s snapshot at ``step`` (``nonce``: shared by the parts of one
        snapshot): ``tensors`` are the changed values and positions that ``pieces`` (key → piece entries) name.
        Returns the part (``{"file", "pieces"}``) for :meth:`commit_snapshot`; no reader sees it before then."""
        folder = self.root / self.check_agent(agent)
        return committing.write_part(folder, step, nonce, rank, tensors, pieces, self.durable)

    def commit_snapshot(self, agent: str, step: int, parts: Sequence[Mapping[str, Any]], local: LocalModel,
                        fp: str, rule: Activity, totals: SnapshotTotals, epoch: int | None,
                        extra: Mapping[str, Any] | None) -> Snapshot:
        """Write the manifest of ``agent``'s snapshot at ``step`` from the ``parts`` of every writer (last and
        atomically: the snapshot becomes visible whole). ``local`` gives the keys, shapes and dtypes, ``fp`` the
        base's fingerprint, ``rule`` the activity it was taken with, ``totals`` its counts. A step taken again
        replaces the old snapshot (whose files no longer referenced are removed)."""
        step = check_step(step)
        manifest, checked = committing.commit_manifest(self.root / agent, agent, step, parts, local, fp, rule,
                                                       totals, epoch, extra, self.durable)
        return Snapshot(self, agent, step, manifest, checked=checked)
