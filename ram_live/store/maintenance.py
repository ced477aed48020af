"""Deleting from a store: pruned snapshots, files of re-taken steps, and what killed writers left (gc).

A data file goes only when no manifest of any run names it (gc), or with the one manifest that names it (a
pruned snapshot, a step its own run took again): never with another run's snapshot.

Whatever a manifest says, only regular files of the store's own names go: in an agent's folder, data files of
the step concerned (``<step:012d>-<nonce>.p<rank>.safetensors``), its manifest, and temporary files; in
``_base``, base data files and temporary files. Never a symlink (nor what it points to), a folder, a name
with a ``/`` or ``..``, or a file of another agent or step.
"""

from __future__ import annotations

import os
import time
import warnings
from collections.abc import Iterable
from pathlib import Path

from .errors import SnapshotNotFoundError, StoreError, StoreWarning
from .files import read_json, real_folder, remove_file
from .format import AGENT_RE, BASE_DIR, LEGACY_RUN, data_step, is_base_data, is_store_temp, manifest_name, manifest_step


def remove_unreferenced(
    folder: Path, names: Iterable[object], *, step: int | None = None, base: bool = False
) -> list[Path]:
    """Remove the data files ``names`` from ``folder``: each must be a data file name of ``step`` (``base``: of
    the base); others are left alone with a :class:`StoreWarning`. Returns what went."""
    removed, refused = [], []
    # a file another manifest of the step names (one copied under another run's name) stays; an unreadable one
    # of the step could name any: all stay, for gc
    named = set() if base or step is None else _named_at(folder, step)
    for name in names:
        ok = isinstance(name, str) and (is_base_data(name) if base else data_step(name) == step)
        if not ok:
            refused.append(name)
        elif named is None or name in named:
            continue
        elif remove_file(folder / name):  # type: ignore[operator]
            removed.append(folder / name)  # type: ignore[operator]
    if refused:
        warnings.warn(
            StoreWarning(
                f"{folder}: a manifest names {len(refused)} file(s) that are not data files of "
                f"{'the base' if base else f'step {step}'} (e.g. {str(refused[0])[:120]!r}); they were not deleted"
            ),
            stacklevel=3,
        )
    return removed


def _named_at(folder: Path, step: int) -> set[str] | None:
    """The data files the manifests of ``step`` (of every run) in ``folder`` name; None if one cannot be read."""
    named: set[str] = set()
    try:
        names = os.listdir(folder)
    except FileNotFoundError:
        return named
    for name in names:
        if manifest_step(name) != step:
            continue
        try:
            manifest = read_json(folder / name)
        except SnapshotNotFoundError:  # removed meanwhile
            continue
        except StoreError:
            return None
        files = manifest.get("files") if isinstance(manifest, dict) else None
        if not isinstance(files, list):
            return None
        named |= {f["name"] for f in files if isinstance(f, dict) and isinstance(f.get("name"), str)}
    return named


def remove_snapshot(folder: Path, step: int, run: str = LEGACY_RUN) -> None:
    """Remove ``run``'s snapshot at ``step`` from the agent's ``folder``: its manifest first (readers then no longer
    see it), then its data files (other runs' files of that step have other names and stay). A manifest that
    cannot be read leaves its files to :func:`collect_garbage`."""
    if not real_folder(folder):
        return
    path = folder / manifest_name(step, run)
    try:
        manifest = read_json(path)
    except StoreError:
        manifest = None
    remove_file(path)
    files = manifest.get("files") if isinstance(manifest, dict) else None
    if isinstance(files, list):
        remove_unreferenced(folder, [f.get("name") for f in files if isinstance(f, dict)], step=step)


def _referenced(folder: Path, names: list[str], base: bool) -> tuple[set[str], set[int], bool]:
    """Data files the manifests in ``folder`` name, the steps whose manifest cannot be read, and whether the
    base's manifest could not be read."""
    referenced: set[str] = set()
    unreadable: set[int] = set()
    base_unreadable = False
    for name in names:
        step = manifest_step(name)
        if step is None and not (base and name == "base.json"):
            continue
        try:
            manifest = read_json(folder / name)
            files = manifest.get("files") if isinstance(manifest, dict) else None
            if not isinstance(files, list):
                raise StoreError("no file list")
            referenced |= {f["name"] for f in files if isinstance(f, dict) and isinstance(f.get("name"), str)}
        except StoreError:
            if step is not None:
                unreadable.add(step)
            else:
                base_unreadable = True
    return referenced, unreadable, base_unreadable


def collect_garbage(root: Path, grace_s: float) -> list[Path]:
    """What :meth:`SnapshotStore.gc` removes (see there)."""
    now = time.time()
    removed: list[Path] = []
    folders = [(root / BASE_DIR, True)] + [
        (p, False) for p in sorted(root.iterdir()) if AGENT_RE.match(p.name) and p.name != BASE_DIR
    ]
    for folder, base in folders:
        if not real_folder(folder):
            continue
        try:
            names = sorted(os.listdir(folder))
        except FileNotFoundError:
            continue
        referenced, unreadable, base_unreadable = _referenced(folder, names, base)
        for name in names:
            if name in referenced:
                continue
            if base:
                ok = (is_base_data(name) and not base_unreadable) or is_store_temp(name, base=True)
            else:
                step = data_step(name)
                ok = (step is not None and step not in unreadable) or is_store_temp(name, base=False)
            if not ok:
                continue
            path = folder / name
            try:
                if now - os.lstat(path).st_mtime >= grace_s and remove_file(path):
                    removed.append(path)
            except FileNotFoundError:
                continue
    return removed
