"""Snapshots and the base written to the store folder: part files (one per writing rank), the ranks' parts
gathered on rank 0, and the manifest committed last and atomically, so a snapshot becomes visible whole. Also the
one-process capture of a whole model against the base read from disk (:meth:`SnapshotStore.snapshot`).

:class:`~ram_live.store.SnapshotStore` exposes these as its part-level methods (``write_part``,
``commit_snapshot``, ``write_base_part``, ``exchange_parts``); the functions here take the folders and options
they need, so this module sees no store object.

>>> part = write_part(store.root / "coder", 50, nonce, 0, tensors, pieces, durable=True)     # doctest: +SKIP
>>> manifest, checked = commit_manifest(store.root / "coder", "coder", 50, [part], local, fp, rule, totals,
...                                     None, None, durable=True)                           # doctest: +SKIP
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from torch import Tensor

from ..errors import InputMismatchError, UnsupportedInputError
from ..methods import Activity
from .collective import Collective
from .datafiles import write_datafile
from .encoding import encode
from .errors import CorruptSnapshotError, StoreError
from .files import read_json, write_json
from .format import BASE_FORMAT, SNAPSHOT_FORMAT, VERSION, check_nonce, check_rank, check_step, manifest_name
from .importance_codes import HEAD as IMPORTANCE_HEAD
from .importance_codes import IMPORTANCE_VERSION, encode_active, local_importance
from .local import LocalModel, LocalTensor
from .maintenance import remove_unreferenced
from .manifest import Checked, check_snapshot, compose_manifest
from .writer import CaptureTotals, SnapshotTotals, piece_entry, takes_importance

__all__ = ["capture_whole", "commit_manifest", "exchange_parts", "write_base_part", "write_part"]


def write_base_part(folder: Path, nonce: str, rank: int, tensors: Mapping[str, LocalTensor],
                    durable: bool) -> dict[str, Any]:
    """Write ``tensors`` (a writer's boxes of the base, dense) as the part file ``rank`` of the base in ``folder``
    (the store's ``_base``); returns the part (``{"file", "pieces"}``) for :func:`.manifest.compose_manifest`."""
    name = f"base-{check_nonce(nonce)}.p{check_rank(rank)}.safetensors"
    data = {f"{k}@{rank}": t.tensor.detach().cpu() for k, t in tensors.items()}
    entry = write_datafile(folder / name, data, {"format": BASE_FORMAT}, durable)
    pieces = {
        k: [{"offsets": list(t.offsets), "shape": list(t.tensor.shape), "values": f"{k}@{rank}"}]
        for k, t in tensors.items()
    }
    return {"file": entry, "pieces": pieces}


def exchange_parts(folder: Path, stem: str, part: dict[str, Any] | None,
                   collective: Collective) -> list[dict[str, Any]]:
    """Rank 0 learns every rank's part (sidecar JSON files on the shared folder, then a barrier); the other ranks
    get an empty list."""
    if collective.world_size == 1:
        return [part] if part is not None else []
    sidecar = folder / f".{stem}.p{collective.rank}.part.json"
    write_json(sidecar, part, durable=False)
    collective.barrier()
    parts = []
    if collective.rank == 0:
        for r in range(collective.world_size):
            path = folder / f".{stem}.p{r}.part.json"
            p = read_json(path)
            if p is not None:
                parts.append(p)
    collective.barrier()
    sidecar.unlink(missing_ok=True)
    return parts


def write_part(folder: Path, step: int, nonce: str, rank: int, tensors: dict[str, Tensor],
               pieces: dict[str, list[dict[str, Any]]], durable: bool) -> dict[str, Any]:
    """Write the part file ``rank`` of the snapshot at ``step`` into the agent's ``folder`` (made if missing);
    returns the part (``{"file", "pieces"}``) for :func:`commit_manifest`."""
    folder.mkdir(parents=True, exist_ok=True)
    name = f"{check_step(step):012d}-{check_nonce(nonce)}.p{check_rank(rank)}.safetensors"
    entry = write_datafile(folder / name, tensors, {"format": SNAPSHOT_FORMAT}, durable)
    return {"file": entry, "pieces": pieces}


def capture_whole(base: Any, local: LocalModel, agent: str, rule: Activity,
                  importance: Mapping[str, Tensor] | None) -> tuple[dict[str, Tensor], dict[str, Any], CaptureTotals]:
    """The one part of a whole (unsharded) model's snapshot against ``base`` (a source of the store's base, read
    tensor by tensor): its tensors, its pieces and its counts. A sharded model is an
    :class:`UnsupportedInputError`, a tensor unlike the base's an :class:`InputMismatchError`."""
    total = CaptureTotals()
    pieces: dict[str, list[dict[str, Any]]] = {}
    tensors: dict[str, Tensor] = {}
    if local.sharded:
        raise UnsupportedInputError("store.snapshot takes whole tensors; use a writer for sharded models")
    imps = {key: local_importance(importance, key, t.tensor.shape, agent, t.tensor.device)
            for key, t in local.tensors.items() if importance is not None and takes_importance(t)}
    for key, t in local.tensors.items():
        b = base.get(key).to(t.tensor.device)
        if b.dtype != t.tensor.dtype or tuple(b.shape) != tuple(t.tensor.shape):
            raise InputMismatchError(f"tensor {key!r} does not match the store's base", key=key, agent=agent)
        enc = encode(t.tensor.reshape(-1), b.reshape(-1), rule)
        imp = encode_active(imps[key], enc, key, agent) if key in imps else None
        pieces[key] = [piece_entry(key, 0, t, enc, tensors, imp)]
        total.add(t, enc)
    return tensors, pieces, total


def commit_manifest(folder: Path, agent: str, step: int, parts: Sequence[Mapping[str, Any]], local: LocalModel,
                    fp: str, rule: Activity, totals: SnapshotTotals, epoch: int | None,
                    extra: Mapping[str, Any] | None, durable: bool) -> tuple[dict[str, Any], Checked]:
    """Write the manifest of ``agent``'s snapshot at ``step`` into its ``folder``, composed from the ``parts`` of
    every writer and checked as a reader would (a :class:`StoreError` instead of an invalid manifest); returns it
    with its check. A step taken again replaces the old manifest, and the old files it no longer references go."""
    now = time.time()
    head = {
        "format": SNAPSHOT_FORMAT, "version": VERSION, "agent": agent, "step": int(step),
        "epoch": None if epoch is None else int(epoch), "time": now,
        "time_iso": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(now)),
        "base_fingerprint": fp, "dtype": totals.dtype(),
        "activity": {"rule": rule.rule} if rule.rule == "changed" else {"rule": rule.rule, "eps": rule.eps},
        "parts": len(parts), "extra": dict(extra or {}),
    }
    if any("importance" in p for part in parts for ps in part["pieces"].values() for p in ps):
        head["version"] = IMPORTANCE_VERSION  # readers before version 3 would refuse the new fields
        head["importance"] = dict(IMPORTANCE_HEAD)
    manifest = compose_manifest(parts, local, head)
    files_bytes = sum(int(f["bytes"]) for f in manifest["files"])
    manifest["stats"] = {"numel": totals.numel, "changed": totals.changed, "bytes": files_bytes,
                         "dense_bytes": totals.dense_bytes}
    try:
        checked = check_snapshot(manifest, agent, step)  # never write what a reader refuses
    except CorruptSnapshotError as exc:
        raise StoreError(f"refusing to commit an invalid manifest: {exc}") from None
    path = folder / manifest_name(step)
    try:
        old = read_json(path)
    except StoreError:  # none, or unreadable: its files (if any) are left to gc
        old = None
    write_json(path, manifest, durable)
    if isinstance(old, dict) and isinstance(old.get("files"), list):  # a re-taken step (resumed run)
        keep = {f["name"] for f in manifest["files"]}
        names = [f.get("name") for f in old["files"] if isinstance(f, dict)]
        remove_unreferenced(folder, [n for n in names if not isinstance(n, str) or n not in keep], step=step)
    return manifest, checked
