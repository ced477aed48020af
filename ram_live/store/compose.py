"""One manifest composed from the parts every rank wrote (:func:`compose_manifest`) and a snapshot's committed
(:func:`commit_manifest`); what makes it valid is :mod:`.manifest`'s."""

from __future__ import annotations

import math
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from ..methods import Activity
from .errors import CorruptSnapshotError, StoreError
from .files import read_json, write_json
from .format import LEGACY_RUN, SNAPSHOT_FORMAT, VERSION, dtype_name, manifest_name
from .importance_codes import HEAD as IMPORTANCE_HEAD
from .importance_codes import IMPORTANCE_VERSION
from .local import LocalModel
from .maintenance import remove_unreferenced
from .manifest import Checked, check_snapshot

__all__ = ["commit_manifest", "compose_manifest"]


def compose_manifest(parts: Sequence[Mapping[str, Any]], local: LocalModel, extra: dict[str, Any]) -> dict[str, Any]:
    """One manifest from the parts of every rank: their files, and the pieces of every tensor (each piece's
    ``file`` set to its part's index). It is not checked here: writers check it before writing it.

    Args:
        parts: every rank's part, ``{"file": file entry, "pieces": key → pieces}`` (as ``write_base_part`` or a
            snapshot part gives it), in file order.
        local: the model as this rank holds it: its keys, tied names, global shapes and dtypes.
        extra: the manifest's head (format, version, fingerprints, ...), copied in first.

    Returns:
        The manifest: ``extra`` with ``keys``, ``aliases``, ``files`` and ``tensors``.

    Raises:
        StoreError: the parts' pieces do not cover every element of some tensor (a rank did not write).
        UnsupportedInputError: a tensor's dtype is not one the store can hold.
    """
    files: list[dict[str, Any]] = []
    tensors: dict[str, Any] = {
        k: {"shape": list(t.global_shape), "dtype": dtype_name(t.tensor.dtype, k), "buffer": t.is_buffer, "pieces": []}
        for k, t in local.tensors.items()
    }
    for part in parts:
        index = len(files)
        files.append(part["file"])
        for key, pieces in part["pieces"].items():
            for p in pieces:
                tensors[key]["pieces"].append({**p, "file": index})
    for key, entry in tensors.items():
        covered = sum(math.prod(p["shape"]) for p in entry["pieces"])
        if covered != math.prod(entry["shape"]):
            raise StoreError(
                f"tensor {key!r}: the ranks' pieces cover {covered} of {math.prod(entry['shape'])} "
                "elements (is every rank writing?)"
            )
    return {**extra, "keys": local.keys(), "aliases": local.aliases(), "files": files, "tensors": tensors}


def commit_manifest(
    folder: Path,
    agent: str,
    step: int,
    parts: Sequence[Mapping[str, Any]],
    local: LocalModel,
    fp: str,
    rule: Activity,
    totals: Any,
    epoch: int | None,
    extra: Mapping[str, Any] | None,
    durable: bool,
    run: str = LEGACY_RUN,
    run_started: float | None = None,
) -> tuple[dict[str, Any], Checked]:
    """Write the manifest of ``run``'s snapshot of ``agent`` at ``step`` into its ``folder``, composed from the
    ``parts`` of every writer and checked as a reader would (a :class:`StoreError` instead of an invalid manifest);
    returns it with its check. A step the same run takes again replaces its old manifest, and the old files it no
    longer references go; another run's snapshot of that step is another file, never touched."""
    now = time.time()
    head: dict[str, Any] = {
        "format": SNAPSHOT_FORMAT,
        "version": VERSION,
        "agent": agent,
        "step": int(step),
        "epoch": None if epoch is None else int(epoch),
        "time": now,
        "time_iso": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(now)),
        "base_fingerprint": fp,
        "dtype": totals.dtype(),
        "activity": {"rule": rule.rule} if rule.rule == "changed" else {"rule": rule.rule, "eps": rule.eps},
        "parts": len(parts),
        "extra": dict(extra or {}),
    }
    if run != LEGACY_RUN:
        head["run"] = run
        head["run_started"] = float(now if run_started is None else run_started)
    if any("importance" in p for part in parts for ps in part["pieces"].values() for p in ps):
        head["version"] = IMPORTANCE_VERSION  # readers before version 3 would refuse the new fields
        head["importance"] = dict(IMPORTANCE_HEAD)
    manifest = compose_manifest(parts, local, head)
    files_bytes = sum(int(f["bytes"]) for f in manifest["files"])
    manifest["stats"] = {
        "numel": totals.numel,
        "changed": totals.changed,
        "bytes": files_bytes,
        "dense_bytes": totals.dense_bytes,
    }
    try:
        checked = check_snapshot(manifest, agent, step, run)  # never write what a reader refuses
    except CorruptSnapshotError as exc:
        raise StoreError(f"refusing to commit an invalid manifest: {exc}") from None
    path = folder / manifest_name(step, run)
    try:
        old = read_json(path)
    except StoreError:  # none, or unreadable: its files (if any) are left to gc
        old = None
    write_json(path, manifest, durable)
    if isinstance(old, dict) and isinstance(old.get("files"), list):  # a step this run takes again (resumed)
        keep = {f["name"] for f in manifest["files"]}
        names = [f.get("name") for f in old["files"] if isinstance(f, dict)]
        remove_unreferenced(folder, [n for n in names if not isinstance(n, str) or n not in keep], step=step)
    return manifest, checked
