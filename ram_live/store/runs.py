"""Runs: each training run of an agent writes its snapshots under its own run id, kept apart from every other run's.

A manifest of run ``r`` is ``<agent>/<step:012d>.<r>.json`` and records ``run`` and ``run_started`` (the time the
run began); data files stay ``<step:012d>-<nonce>.p<rank>.safetensors`` (the nonce keeps two runs' files of one
step apart). Manifests named ``<step:012d>.json`` (written before stores knew runs) are one run, ``"legacy"``,
the oldest. So a fresh run under a used agent name never replaces or removes a snapshot of another run, and
"the agent's latest snapshot" is taken from its *current* run (the latest-started run with a snapshot), never
from an older run's higher step.

>>> store.runs("coder")                          # oldest first; the last is the current run   # doctest: +SKIP
[RunInfo(agent='coder', run='legacy', ...), RunInfo(agent='coder', run='20261206-194641-3fa2c1', ...)]
"""

from __future__ import annotations

import calendar
import logging
import math
import os
import time
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .errors import SnapshotNotFoundError, StoreError
from .files import read_json, real_folder, write_json
from .format import (
    LEGACY_RUN,
    RUN_RE,
    STORE_FORMAT,
    STORE_VERSION,
    check_run,
    manifest_key,
    manifest_name,
    new_run_id,
)

__all__ = [
    "RUN_MARKER",
    "RunIndex",
    "RunInfo",
    "find_run_marker",
    "manifest_keys",
    "mark_runs",
    "say_run",
    "write_run_marker",
]

log = logging.getLogger("ram_live.training")  # where the training integrations log


def mark_runs(root: Path, durable: bool) -> None:
    """Make ``store.json`` say version 2 before the first snapshot of a named run: a ram_live without runs would
    take that run's data files for a killed writer's and collect them; it refuses a newer store instead."""
    marker = root / "store.json"
    info = read_json(marker)
    if isinstance(info, dict) and type(info.get("version")) is int and info["version"] < STORE_VERSION:
        write_json(marker, {**info, "format": STORE_FORMAT, "version": STORE_VERSION}, durable)


@dataclass(frozen=True)
class RunInfo:
    """One run of an agent, as listed (:meth:`SnapshotStore.runs <ram_live.store.SnapshotStore.runs>`).

    Attributes:
        agent: the agent's name.
        run: the run id (``"legacy"``: the snapshots written before stores knew runs).
        started: when the run began (seconds since the epoch), None for the legacy run.
        steps: the steps of its complete snapshots, ascending.
    """

    agent: str
    run: str
    started: float | None
    steps: tuple[int, ...]

    @property
    def legacy(self) -> bool:
        return self.run == LEGACY_RUN


def manifest_keys(folder: Path) -> list[tuple[int, str]]:
    """``(step, run)`` of every manifest in an agent's ``folder`` (empty when it is missing or a symlink)."""
    if not real_folder(folder):
        return []
    try:
        names = os.listdir(folder)
    except FileNotFoundError:
        return []
    return sorted(k for k in map(manifest_key, names) if k is not None)


class RunIndex:
    """The runs of a store's agents, with each run's start read from its newest manifest (cached per file)."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self._started: dict[Path, tuple[tuple[int, int, int], float | None]] = {}

    def runs(self, agent: str) -> list[RunInfo]:
        """``agent``'s runs that hold a complete snapshot, oldest-started first (the last is the current run)."""
        folder = self.root / agent
        by_run: dict[str, list[int]] = {}
        for step, run in manifest_keys(folder):
            by_run.setdefault(run, []).append(step)
        out = [
            RunInfo(agent, run, None if run == LEGACY_RUN else self._run_started(folder, run, steps), tuple(steps))
            for run, steps in by_run.items()
        ]
        return sorted(out, key=lambda r: (-math.inf if r.started is None else r.started, r.run))

    def open_run(self, agent: str, run: str | None) -> tuple[str, float | None]:
        """What :meth:`SnapshotStore.open_run <ram_live.store.SnapshotStore.open_run>` returns (see there)."""
        if run is None:  # after every run there: a fresh run is current even if another machine's clock is ahead
            now = time.time()
            runs = self.runs(agent)
            latest = runs[-1].started if runs else None
            started = now if latest is None or latest < now else math.nextafter(latest, math.inf)
            return new_run_id(now), started
        run = check_run(run)
        if run == LEGACY_RUN:
            return run, None
        started = self.started(agent, run)
        return run, time.time() if started is None else started

    def started(self, agent: str, run: str) -> float | None:
        """When ``agent``'s ``run`` began, as its manifests record (None: legacy, or no readable manifest)."""
        if run == LEGACY_RUN:
            return None
        steps = [s for s, r in manifest_keys(self.root / agent) if r == run]
        return self._run_started(self.root / agent, run, steps)

    def elsewhere(self, agent: str, step: int, current: str) -> SnapshotNotFoundError | None:
        """The error of a step missing in ``agent``'s ``current`` run that other runs hold (None where none does)."""
        others = [r.run for r in self.runs(agent) if r.run != current and step in r.steps]
        if not others:
            return None
        return SnapshotNotFoundError(
            f"{self.root}: agent {agent!r} has no snapshot at step {step} in its current run {current!r}; run(s) "
            f"{', '.join(others)} hold one (open(..., run=...))"
        )

    def _run_started(self, folder: Path, run: str, steps: Iterable[int]) -> float | None:
        for step in sorted(steps, reverse=True):  # the newest readable manifest says it
            path = folder / manifest_name(step, run)
            try:
                st = os.stat(path)
            except FileNotFoundError:  # pruned meanwhile
                continue
            stamp = (st.st_ino, st.st_size, st.st_mtime_ns)
            cached = self._started.get(path)
            if cached is not None and cached[0] == stamp:
                value = cached[1]
            else:
                try:
                    m = read_json(path)
                except StoreError:
                    continue
                v = m.get("run_started") if isinstance(m, dict) and m.get("run") == run else None
                value = float(v) if type(v) in (int, float) and math.isfinite(v) else None
                self._started[path] = (stamp, value)
            if value is not None:
                return value
        return _stamp_of(run)


def _stamp_of(run: str) -> float | None:
    """The start a generated run id (:func:`~.format.new_run_id`) carries, for a run none of whose manifests can
    be read (else it would count as the oldest run)."""
    try:
        return float(calendar.timegm(time.strptime(run[:15], "%Y%m%d-%H%M%S")))
    except ValueError:
        return None


RUN_MARKER = "ram_live_run.json"  # a trainer checkpoint folder's record of the store run it was snapshotted into


def write_run_marker(folder: Path, store_root: Path, agent: str, run: str, step: int) -> bool:
    """Record in a trainer's checkpoint ``folder`` which run of ``agent`` in the store at ``store_root`` its
    weights went to, so a trainer resumed from it continues that run (:func:`find_run_marker`). Returns False
    when the folder cannot be written (the run is then not found again on resume: a resumed run starts a new
    one, which never touches another run's snapshots)."""
    record = {"store": str(Path(store_root).resolve()), "agent": agent, "run": run, "step": int(step)}
    try:
        write_json(folder / RUN_MARKER, record, durable=False)
    except OSError:
        return False
    return True


def find_run_marker(folders: Iterable[Path], store_root: Path, agent: str) -> str | None:
    """The run recorded (:func:`write_run_marker`) for ``agent`` and the store at ``store_root`` in the first of
    ``folders`` (newest checkpoint first) that holds such a record; None when none does."""
    want = str(Path(store_root).resolve())
    for folder in folders:
        try:
            record = read_json(folder / RUN_MARKER)
        except StoreError:
            continue
        if isinstance(record, dict) and record.get("store") == want and record.get("agent") == agent:
            run = record.get("run")
            if isinstance(run, str) and RUN_RE.match(run):
                return run
    return None


def say_run(store: Any, agent: str, run: str) -> None:
    """One log line (logger ``ram_live.training``) when ``agent`` has other runs in ``store`` (a
    :class:`~ram_live.store.SnapshotStore`): which run this one writes, and that they are kept apart (a fresh run
    under a used name is the most common restart; nothing of the earlier run changes)."""
    runs = store.runs(agent)
    others = [r for r in runs if r.run != run]
    if not others:
        return
    mine = [r for r in runs if r.run == run]
    if mine:
        later = runs[runs.index(mine[0]) + 1 :]
        if not later:
            log.info(
                "ram_live: %r continues its run %s in %s (last step %d)", agent, run, store.root, mine[0].steps[-1]
            )
            return
        log.warning(  # a resumed older run is not the agent's current run: other agents' merges take the later one
            "ram_live: %r continues its run %s in %s (last step %d), but a later-started run, %s (last step %d), "
            "stays its current run: merges of other agents, `ram-live merge` and store.latest(%r) take that run's "
            "snapshots, not this run's (store.prune(0, %r, run=%r) removes it if it was abandoned)",
            agent,
            run,
            store.root,
            mine[0].steps[-1],
            later[-1].run,
            later[-1].steps[-1],
            agent,
            agent,
            later[-1].run,
        )
        return
    last = others[-1]
    log.warning(
        "ram_live: agent %r has %d earlier run(s) in %s (the latest: %s, last step %d); this run writes a new run, "
        "%s, kept apart: the earlier runs' snapshots stay as they are, and merges take this run's (to continue "
        "an earlier run, resume its trainer from its checkpoint; `ram-live stores %s` lists the runs)",
        agent,
        len(others),
        store.root,
        last.run,
        last.steps[-1],
        run,
        store.root,
    )
