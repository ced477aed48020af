"""The store folder (:class:`SnapshotStore`): its base, agents and snapshots listed, opened, pruned and verified.
Its writing half (the base set, parts and manifests written, writers handed out) is
:class:`.committing.StoreWriting`, which it inherits."""

from __future__ import annotations

import os
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import torch

from ..errors import ConfigError
from .committing import StoreWriting
from .errors import CorruptSnapshotError, SnapshotNotFoundError, StoreError
from .files import read_json, real_folder, write_json
from .format import AGENT_RE, BASE_DIR, STORE_FORMAT, STORE_VERSION, check_run, check_step, manifest_name
from .maintenance import collect_garbage, remove_snapshot
from .manifest import Checked, check_base
from .reading import Snapshot, SnapshotInfo, StoreBase
from .runs import RunIndex, RunInfo, manifest_keys
from .verify import VerifyReport, verify_store
from .importance_codes import ImportanceSource


class SnapshotStore(StoreWriting):
    """A folder of task-vector snapshots of several agents trained from one base.

    Any number of processes may write (one writer per agent, or one per rank of a sharded agent) and read at
    the same time; readers see only complete snapshots. ``durable=True`` fsyncs data files before their manifest
    (survives power loss, not only killed processes). Every manifest is checked in full before a file it names
    is read or deleted, every data file's CRC-32 before its first tensor is used (:meth:`verify`: all now).
    Files follow the umask.

    Args:
        root: the store's folder (made, with its ``store.json``, unless ``create=False``).
        create: make the store if ``root`` holds none; ``False``: it must exist.
        durable: fsync data files before their manifest.

    Raises:
        SnapshotNotFoundError: ``create=False`` and ``root`` is not a store (no ``store.json``).
        CorruptSnapshotError: ``store.json`` is not a ram_live store's, or its version is not an integer.
        StoreError: the store's format version is newer than this ram_live's.

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
        self.run_index = RunIndex(self.root)
        self._session_runs: dict[str, tuple[str, float | None]] = {}  # store.snapshot's run per agent
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
        """Whether a writer has set the store's base.

        Returns:
            True once ``_base/base.json`` exists.
        """
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
        """The base every snapshot of this store is a diff against (cached per fingerprint and device).

        Args:
            device: where its tensors are read to.

        Returns:
            The base as a :class:`StoreBase` (a tensor source).

        Raises:
            SnapshotNotFoundError: no base was set yet.
            CorruptSnapshotError: the base's folder or manifest is not valid.
        """
        if not self.has_base():
            raise SnapshotNotFoundError(f"{self.root}: the store has no base yet (a writer sets it)")
        manifest, checked = self._base_manifest()
        cache_key = (manifest["fingerprint"], str(torch.device(device)))
        if cache_key not in self._base_cache:
            self._base_cache[cache_key] = StoreBase(self.root / BASE_DIR, manifest, device, checked)
        return self._base_cache[cache_key]

    # -- agents and snapshots

    @staticmethod
    def check_agent(agent: str) -> str:
        """Check an agent's name as a store folder name.

        Args:
            agent: the name.

        Returns:
            ``agent``, unchanged.

        Raises:
            ConfigError: not letters, digits, ``.``, ``_``, ``-`` starting with a letter or digit, or over 128
                characters.
        """
        if not isinstance(agent, str) or not AGENT_RE.match(agent):
            raise ConfigError(
                f"agent name {agent!r} is not a valid store name: letters, digits, '.', '_', '-', starting with a "
                "letter or digit, at most 128 characters"
            )
        return agent

    def agents(self) -> list[str]:
        """Agents with at least one snapshot (folders of agent names; never a symlink).

        Returns:
            Their names, sorted.
        """
        if not self.root.exists():
            return []
        return sorted(
            p.name
            for p in self.root.iterdir()
            if AGENT_RE.match(p.name) and p.name != BASE_DIR and real_folder(p) and manifest_keys(p)
        )

    def runs(self, agent: str) -> list[RunInfo]:
        """``agent``'s runs that hold a snapshot, oldest-started first: the last is its *current* run, the one
        :meth:`latest` and merges take its snapshots from. Snapshots written before stores knew runs are one run,
        ``"legacy"``, the oldest.

        Args:
            agent: the agent's name.

        Returns:
            A :class:`RunInfo` per run (id, start time, steps).

        Raises:
            ConfigError: ``agent`` is not a valid agent name.
        """
        return self.run_index.runs(self.check_agent(agent))

    def current_run(self, agent: str) -> str | None:
        """``agent``'s current run: the latest-started run that holds a snapshot (None when it has none).

        Args:
            agent: the agent's name.

        Returns:
            The run id, or None.
        """
        runs = self.runs(agent)
        return runs[-1].run if runs else None

    def steps(self, agent: str, run: str | None = None) -> list[int]:
        """Steps of the complete snapshots of one run of ``agent``.

        Args:
            agent: the agent's name.
            run: the run (default: the agent's current run, :meth:`current_run`).

        Returns:
            The steps, ascending (empty when the run has none).

        Raises:
            ConfigError: ``agent`` or ``run`` is not valid.
        """
        self.check_agent(agent)
        if run is None:
            runs = self.runs(agent)
            return list(runs[-1].steps) if runs else []
        run = check_run(run)
        return [s for s, r in manifest_keys(self.root / agent) if r == run]

    def list(self, agent: str | None = None, *, run: str | None = None) -> list[SnapshotInfo]:
        """Complete snapshots of ``agent`` (or of every agent), of every run (or of ``run``).

        Args:
            agent: one agent's name, or None for all.
            run: one run's id, or None for every run.

        Returns:
            A :class:`SnapshotInfo` per snapshot, by agent, then run (oldest-started first), then step.

        Raises:
            ConfigError: ``agent`` or ``run`` is not valid.
        """
        agents = [self.check_agent(agent)] if agent is not None else self.agents()
        want = None if run is None else check_run(run)
        return [
            SnapshotInfo(self, a, s, r.run)
            for a in agents
            for r in self.runs(a)
            if want is None or r.run == want
            for s in r.steps
        ]

    def open(self, agent: str, step: int, *, run: str | None = None, device: torch.device | str = "cpu") -> Snapshot:
        """``agent``'s snapshot at ``step`` of ``run``: its manifest checked in full, its data files opened (each
        file's checksum is verified before its first tensor is used; :meth:`Snapshot.verify`: all now).

        Args:
            agent: the agent's name.
            step: the snapshot's step.
            run: its run (default: the agent's current run).
            device: where its tensors are read to.

        Returns:
            The :class:`Snapshot` (a tensor source that carries its base).

        Raises:
            ConfigError: ``agent``, ``step`` or ``run`` is not valid.
            SnapshotNotFoundError: there is no such snapshot.
            CorruptSnapshotError: the agent's folder is a symlink, or the manifest is not valid.
        """
        self.check_agent(agent)
        step = check_step(step)
        folder = self.root / agent
        if folder.is_symlink():
            raise CorruptSnapshotError(f"{folder}: a symlink, not a folder of the store", agent=agent, step=step)
        implicit, run = run is None, self.current_run(agent) if run is None else check_run(run)
        if run is None:
            raise SnapshotNotFoundError(f"{self.root}: agent {agent!r} has no snapshot")
        try:
            manifest = read_json(folder / manifest_name(step, run))
        except SnapshotNotFoundError as exc:  # where other runs hold that step, say so
            raise (self.run_index.elsewhere(agent, step, run) if implicit else None) or exc from None
        return Snapshot(self, agent, step, manifest, device, run=run)

    def importance_source(self, snapshot: Snapshot) -> ImportanceSource:
        """The importances ``snapshot`` (of this store, with importances) carries (:attr:`Snapshot.importance`).

        Args:
            snapshot: a snapshot of this store.

        Returns:
            An :class:`ImportanceSource` over its stored importances.
        """
        return ImportanceSource(snapshot)

    def latest(
        self, agent: str, *, run: str | None = None, device: torch.device | str = "cpu", retries: int = 5
    ) -> Snapshot:
        """``agent``'s newest complete snapshot of its current run (or of ``run``; listed again if it is pruned
        between listing and opening). Another run's snapshots are never taken, not even of a higher step.

        Args:
            agent: the agent's name.
            run: the run (default: the agent's current run, :meth:`current_run`).
            device: where its tensors are read to.
            retries: how many times to list again.

        Returns:
            The newest :class:`Snapshot`.

        Raises:
            ConfigError: ``agent`` is not a valid agent name.
            SnapshotNotFoundError: the agent has no snapshot (or every try raced a prune).
            CorruptSnapshotError: the newest snapshot's manifest is not valid.
        """
        self.check_agent(agent)
        for _ in range(retries + 1):
            runs = [r for r in self.runs(agent) if run is None or r.run == run]
            if not runs:
                which = "" if run is None else f" in run {run!r}"
                raise SnapshotNotFoundError(f"{self.root}: agent {agent!r} has no snapshot{which}")
            try:
                return self.open(agent, runs[-1].steps[-1], run=runs[-1].run, device=device)
            except SnapshotNotFoundError:  # pruned or replaced between listing and opening: list again
                continue
        raise SnapshotNotFoundError(f"{self.root}: could not open a snapshot of {agent!r} (pruned concurrently)")

    def latest_all(
        self, agents: Iterable[str] | None = None, *, device: torch.device | str = "cpu"
    ) -> dict[str, Snapshot]:
        """Every agent's (or the named agents') newest snapshot of its current run, name → :class:`Snapshot`: pass
        it straight to ``ram_merge`` / ``probe``.

        Args:
            agents: the agents' names (default: every agent of the store).
            device: where their tensors are read to.

        Returns:
            Name → newest :class:`Snapshot`.

        Raises:
            SnapshotNotFoundError: a named agent has no snapshot.
        """
        names = list(agents) if agents is not None else self.agents()
        return {a: self.latest(a, device=device) for a in names}

    def prune(self, keep: int, agent: str | None = None, *, run: str | None = None) -> list[SnapshotInfo]:
        """Delete all but the newest ``keep`` snapshots of each run of ``agent`` (or of every agent), or of
        ``run`` only (what a training run prunes: never another run's snapshots); returns what went. The
        manifest goes first, so readers never see a snapshot without its files; readers that opened it already
        keep reading (files are memory-mapped).

        Args:
            keep: how many of the newest snapshots to keep per run (>= 0).
            agent: one agent's name, or None for all.
            run: one run's id, or None for each run.

        Returns:
            A :class:`SnapshotInfo` per removed snapshot.

        Raises:
            ConfigError: ``keep`` is negative, or ``agent`` or ``run`` is not valid.
        """
        if keep < 0:
            raise ConfigError(f"keep must be >= 0, got {keep}")
        want = None if run is None else check_run(run)
        removed = []
        for a in [self.check_agent(agent)] if agent else self.agents():
            for r in self.runs(a):
                if want is not None and r.run != want:
                    continue
                for step in r.steps[: max(0, len(r.steps) - keep)]:
                    remove_snapshot(self.root / a, step, r.run)
                    removed.append(SnapshotInfo(self, a, step, r.run))
        return removed

    def gc(self, grace_s: float = 3600.0) -> list[Path]:
        """Delete what killed writers left: data files no manifest references and temporary files, older than
        ``grace_s`` seconds (a younger one may belong to a write in progress). Only regular files of the
        store's own names in the agents' folders and ``_base`` go; a step whose manifest cannot be read keeps
        its files.

        Args:
            grace_s: the minimum age, in seconds, of a file that goes.

        Returns:
            The paths removed.
        """
        return collect_garbage(self.root, grace_s)

    def verify(self, agents: Iterable[str] | None = None, *, strict: bool = False) -> VerifyReport:
        """Check the base and every snapshot (of ``agents``, default all): manifests in full, data files'
        sizes, tensors and checksums. Returns a :class:`VerifyReport` of everything checked and every problem
        found.

        Args:
            agents: the agents to check (default: all), besides the base.
            strict: raise the first problem instead of reporting it.

        Returns:
            A :class:`VerifyReport`.

        Raises:
            StoreError: with ``strict=True``, the first problem (e.g. a :class:`CorruptSnapshotError`).

        Example:
            >>> report = SnapshotStore("runs/ram", create=False).verify()     # doctest: +SKIP
            >>> report.ok, len(report.entries), report.bytes                    # doctest: +SKIP
            (True, 41, 1873920112)
        """
        return verify_store(self, agents, strict)
