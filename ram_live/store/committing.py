"""The store's writing half (:class:`StoreWriting`, inherited by :class:`~ram_live.store.SnapshotStore`): the
base set or checked, part files written (one per writing rank), the ranks' parts gathered on rank 0, and the
manifest committed last and atomically, so a snapshot becomes visible whole; also the one-process capture of a
whole model against the base read from disk (:meth:`StoreWriting.snapshot`).

>>> part = store.write_part("coder", 50, nonce, 0, tensors, pieces)                          # doctest: +SKIP
>>> run, started = store.open_run("coder")                                                    # doctest: +SKIP
>>> snap = store.commit_snapshot("coder", 50, [part], local, fp, rule, totals, None, None, run=run)  # doctest: +SKIP
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from torch import Tensor

from ..errors import InputMismatchError, UnsupportedInputError
from ..io.model_files import save_store_files
from ..methods import Activity
from .collective import Collective, LocalCollective
from .datafiles import write_datafile
from .encoding import encode
from .errors import BaseMismatchError
from .files import read_json, write_json
from .format import (
    BASE_DIR,
    BASE_FORMAT,
    LEGACY_RUN,
    SNAPSHOT_FORMAT,
    VERSION,
    check_nonce,
    check_rank,
    check_run,
    check_step,
)
from .importance_codes import encode_active, local_importance
from .local import LocalModel, LocalTensor
from .maintenance import remove_unreferenced
from .hashing import fingerprint
from .compose import commit_manifest, compose_manifest
from .manifest import check_base
from .reading import Snapshot, StoreBase
from .runs import RunIndex, mark_runs
from .writer import CaptureTotals, SnapshotTotals, SnapshotWriter, activity_rule, piece_entry, takes_importance

__all__ = ["StoreWriting"]


class StoreWriting:
    """The writing half of :class:`~ram_live.store.SnapshotStore`, which inherits it: the base set (or checked),
    part files written, the ranks' parts gathered, manifests committed, and the writers handed out. It uses the
    store's ``root``, ``durable``, :meth:`check_agent`, :attr:`base_fingerprint` and :meth:`base_source`."""

    root: Path  # the store's, as are the four below
    durable: bool
    base_fingerprint: str | None
    check_agent: Callable[[str], str]
    base_source: Callable[..., StoreBase]
    run_index: RunIndex  # the store's, as are the two below
    _session_runs: dict[str, tuple[str, float | None]]

    def open_run(self, agent: str, run: str | None = None) -> tuple[str, float | None]:
        """The run ``agent``'s next snapshots go to, and when it began: a new run (``run=None``), or ``run``
        continued (a resumed trainer's; ``"legacy"``: the snapshots written before stores knew runs).

        Args:
            agent: the agent's name.
            run: None for a new run, or the id of the run to continue (it need not hold a snapshot yet).

        Returns:
            ``(run id, start time)``; the start is the one the run's snapshots record (None for the legacy run).

        Raises:
            ConfigError: ``agent`` or ``run`` is not valid.

        Example:
            >>> run, started = store.open_run("coder")                          # doctest: +SKIP
        """
        return self.run_index.open_run(self.check_agent(agent), run)

    def set_base(self, base: Any, *, collective: Collective | None = None, writer: bool = True) -> str:
        """Persist ``base`` as the store's base, or check that it equals the one there (:class:`BaseMismatchError`
        otherwise). All ranks call it; with a sharded base every rank writes its boxes.

        Args:
            base: the base model (a module, a state dict or a :class:`LocalModel`).
            collective: the ranks' collective (default: this process alone).
            writer: ``False`` on ranks that hold a replica and must not write (DDP ranks > 0).

        Returns:
            The base's fingerprint.

        Raises:
            BaseMismatchError: the store's base is another one.
        """
        local = base if isinstance(base, LocalModel) else LocalModel.from_obj(base)
        collective = collective or LocalCollective()
        fp = fingerprint(local, collective)
        existing = (
            collective.broadcast_json(self.base_fingerprint) if collective.world_size > 1 else self.base_fingerprint
        )
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
                manifest = self.compose_manifest(
                    parts,
                    local,
                    extra={"format": BASE_FORMAT, "version": VERSION, "fingerprint": fp, "time": time.time()},
                )
                check_base(manifest)  # never write what a reader refuses
                won = write_json(self.base_path, manifest, self.durable, exclusive=True)
                if not won:  # another writer set it first: keep theirs
                    remove_unreferenced(folder, [f["name"] for f in manifest["files"]], base=True)
                else:  # its config and tokenizer: folders merged from the store load with from_pretrained
                    save_store_files(folder, local.model_files())
            collective.barrier()
            existing = self.base_fingerprint
        if existing != fp:
            raise BaseMismatchError(
                f"{self.root}: the store's base has fingerprint {existing}, this model's base {fp}: the agents of one "
                "store must all be trained from the same base (start a new store, or pass the right base=)"
            )
        return fp

    def write_base_part(
        self, folder: Path, nonce: str, rank: int, local: LocalModel, tensors: Mapping[str, LocalTensor]
    ) -> dict[str, Any]:
        """Write ``tensors`` (this writer's boxes of the base, dense) as the part file ``rank`` of the base in
        ``folder`` (the store's ``_base``).

        Args:
            folder: the store's ``_base`` folder.
            nonce: shared by the parts of one base (1-32 letters or digits).
            rank: the writer's rank (names the part file).
            local: the writer's part of the model (unused: the boxes are in ``tensors``).
            tensors: the boxes this writer owns, by key.

        Returns:
            The part (``{"file", "pieces"}``) for :meth:`compose_manifest`.

        Raises:
            ConfigError: ``nonce`` or ``rank`` is not a valid part name.
        """
        name = f"base-{check_nonce(nonce)}.p{check_rank(rank)}.safetensors"
        data = {f"{k}@{rank}": t.tensor.detach().cpu() for k, t in tensors.items()}
        entry = write_datafile(folder / name, data, {"format": BASE_FORMAT}, self.durable)
        pieces = {
            k: [{"offsets": list(t.offsets), "shape": list(t.tensor.shape), "values": f"{k}@{rank}"}]
            for k, t in tensors.items()
        }
        return {"file": entry, "pieces": pieces}

    def exchange_parts(
        self, folder: Path, stem: str, part: dict[str, Any] | None, collective: Collective
    ) -> list[dict[str, Any]]:
        """Rank 0 learns every rank's part (sidecar JSON files on the shared folder, then a barrier).

        Args:
            folder: the shared folder the parts are written in.
            stem: the sidecar files' stem (unique to the snapshot or base).
            part: this rank's part (None: it wrote none).
            collective: the ranks' collective.

        Returns:
            Every rank's part on rank 0, an empty list on the other ranks.
        """
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

    compose_manifest = staticmethod(compose_manifest)  # part-level API (integrations/verl/pieces.py)

    def writer(
        self,
        agent: str,
        base: Any,
        *,
        activity: str = "changed",
        eps: float = 0.0,
        collective: Collective | None = None,
        clone_base: bool = True,
        writer: bool = True,
        run: str | None = None,
    ) -> SnapshotWriter:
        """A :class:`SnapshotWriter` for ``agent`` holding ``base`` (see there for the errors it raises): a new run
        of ``agent`` (``run=None``), or ``run`` continued.

        Args:
            agent: the agent's name.
            base: the base model, kept on the weights' device.
            activity: ``"changed"`` or ``"abs"`` (entries with ``|Δ| > eps``).
            eps: the threshold of ``"abs"``.
            collective: the ranks' collective (default: this process alone).
            clone_base: keep a copy of ``base`` (not the live tensors).
            writer: ``False`` on ranks that hold a replica and must not write.
            run: None (a new run, kept apart from the agent's earlier runs) or the id of a run to continue
                (:attr:`SnapshotWriter.run` of an earlier writer, e.g. kept in a trainer's checkpoint).

        Returns:
            The :class:`SnapshotWriter`.
        """
        return SnapshotWriter(
            self,
            agent,
            base,
            activity=activity,
            eps=eps,
            collective=collective,
            clone_base=clone_base,
            writer=writer,
            run=run,
        )

    def snapshot(
        self,
        agent: str,
        model: Any,
        step: int,
        *,
        epoch: int | None = None,
        extra: Mapping[str, Any] | None = None,
        activity: str = "changed",
        eps: float = 0.0,
        importance: Mapping[str, Tensor] | None = None,
        run: str | None = None,
    ) -> Snapshot:
        """Snapshot ``model`` against the store's base read from disk tensor by tensor (one process, no DTensors;
        a training loop should hold a :meth:`writer`, which keeps the base on the weights' device).

        Args:
            agent: the agent's name.
            model: the agent's model (a module or a state dict of whole tensors).
            step: the snapshot's step.
            epoch: recorded in the manifest.
            extra: JSON-able values kept in the manifest's ``extra``.
            activity: ``"changed"`` or ``"abs"``.
            eps: the threshold of ``"abs"``.
            importance: per-parameter importances kept at the active entries (:meth:`SnapshotWriter.snapshot`).
            run: the run it belongs to (:meth:`open_run`); None: one run per agent and store object (its first
                call opens a new run, later calls continue it).

        Returns:
            The new :class:`Snapshot`.

        Raises:
            SnapshotNotFoundError: the store has no base yet.
            UnsupportedInputError: the model is sharded (use a :meth:`writer`).
            InputMismatchError: a tensor's shape or dtype differs from the base's.
            ConfigError: ``agent``, ``step``, ``activity`` or ``importance`` is not valid.
        """
        self.check_agent(agent)
        if run is None:
            if agent not in self._session_runs:
                self._session_runs[agent] = self.open_run(agent)
            run, started = self._session_runs[agent]
        else:
            run, started = self.open_run(agent, run)
        base = self.base_source()
        local = LocalModel.from_obj(model)
        rule = activity_rule(activity, eps)
        total = CaptureTotals()
        pieces: dict[str, list[dict[str, Any]]] = {}
        tensors: dict[str, Tensor] = {}
        if local.sharded:
            raise UnsupportedInputError("store.snapshot takes whole tensors; use a writer for sharded models")
        imps = {
            key: local_importance(importance, key, t.tensor.shape, agent, t.tensor.device)
            for key, t in local.tensors.items()
            if importance is not None and takes_importance(t)
        }
        for key, t in local.tensors.items():
            b = base.get(key).to(t.tensor.device)
            if b.dtype != t.tensor.dtype or tuple(b.shape) != tuple(t.tensor.shape):
                raise InputMismatchError(f"tensor {key!r} does not match the store's base", key=key, agent=agent)
            enc = encode(t.tensor.reshape(-1), b.reshape(-1), rule)
            imp = encode_active(imps[key], enc, key, agent) if key in imps else None
            pieces[key] = [piece_entry(key, 0, t, enc, tensors, imp)]
            total.add(t, enc)
        part = self.write_part(agent, step, uuid.uuid4().hex[:12], 0, tensors, pieces)
        return self.commit_snapshot(
            agent, step, [part], local, base.fingerprint, rule, total, epoch, extra, run=run, run_started=started
        )

    def write_part(
        self,
        agent: str,
        step: int,
        nonce: str,
        rank: int,
        tensors: dict[str, Tensor],
        pieces: dict[str, list[dict[str, Any]]],
    ) -> dict[str, Any]:
        """Write the part file ``rank`` of ``agent``'s snapshot at ``step`` (``nonce``: shared by the parts of one
        snapshot): ``tensors`` are the changed values and positions that ``pieces`` (key → piece entries) name.
        No reader sees it before :meth:`commit_snapshot`.

        Args:
            agent: the agent's name.
            step: the snapshot's step.
            nonce: shared by the parts of one snapshot (1-32 letters or digits).
            rank: the writer's rank (names the part file).
            tensors: the data file's tensors.
            pieces: key → piece entries naming them.

        Returns:
            The part (``{"file", "pieces"}``) for :meth:`commit_snapshot`.

        Raises:
            ConfigError: ``agent``, ``step``, ``nonce`` or ``rank`` is not valid.
        """
        folder = self.root / self.check_agent(agent)
        folder.mkdir(parents=True, exist_ok=True)
        name = f"{check_step(step):012d}-{check_nonce(nonce)}.p{check_rank(rank)}.safetensors"
        entry = write_datafile(folder / name, tensors, {"format": SNAPSHOT_FORMAT}, self.durable)
        return {"file": entry, "pieces": pieces}

    def commit_snapshot(
        self,
        agent: str,
        step: int,
        parts: Sequence[Mapping[str, Any]],
        local: LocalModel,
        fp: str,
        rule: Activity,
        totals: SnapshotTotals,
        epoch: int | None,
        extra: Mapping[str, Any] | None,
        *,
        run: str,
        run_started: float | None = None,
    ) -> Snapshot:
        """Write the manifest of ``run``'s snapshot of ``agent`` at ``step`` from the ``parts`` of every writer
        (last and atomically: the snapshot becomes visible whole). ``local`` gives the keys, shapes and dtypes,
        ``fp`` the base's fingerprint, ``rule`` the activity it was taken with, ``totals`` its counts. A step the
        same run takes again replaces its old snapshot (whose files no longer referenced are removed); another
        run's snapshot of that step stays as it is.

        Args:
            agent: the agent's name.
            step: the snapshot's step.
            parts: every writer's part (:meth:`write_part`, gathered by :meth:`exchange_parts`).
            local: the model's keys, shapes and dtypes.
            fp: the base's fingerprint.
            rule: the activity rule the snapshot was taken with.
            totals: its counts.
            epoch: recorded in the manifest.
            extra: JSON-able values kept in the manifest's ``extra``.
            run: the run it belongs to (:meth:`open_run`).
            run_started: when that run began (:meth:`open_run`; None: now).

        Returns:
            The committed :class:`Snapshot`.

        Raises:
            ConfigError: ``step`` is not an integer, or ``run`` is not a run id.
            StoreError: the composed manifest is not valid (nothing is written).
        """
        step = check_step(step)
        run = check_run(run)
        if run != LEGACY_RUN:
            mark_runs(self.root, self.durable)
        manifest, checked = commit_manifest(
            self.root / agent, agent, step, parts, local, fp, rule, totals, epoch, extra, self.durable, run, run_started
        )
        return Snapshot(self, agent, step, manifest, checked=checked, run=run)
