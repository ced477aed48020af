"""The integration's logic, free of verl: verl checkpoints → snapshots, snapshots → merged Hugging Face folders.

:class:`RAMVerl` is what the checkpoint callback, the ``RayPPOTrainer`` mixin and the offline command share:

>>> opts = options_from_mapping({"store": "runs/ram", "agent": "coder", "base": "Qwen2.5-0.5B"})  # doctest: +SKIP
>>> ram = RAMVerl(opts)                                                                      # doctest: +SKIP
>>> ram.snapshot("checkpoints/p/e/global_step_20", step=20)      # one rank's shard file at a time     # doctest: +SKIP
>>> ram.merge(step=20)                            # -> merged_dir/coder/global_step_20      # doctest: +SKIP

The jobs live in their own modules: :mod:`.snapshot` (a checkpoint's shards into a snapshot), :mod:`.lora`
(ΔW of a LoRA checkpoint), :mod:`.merging` (the merge, its record and metrics), :mod:`.evaluation` (the
evaluations, in this process or a Ray actor: :mod:`.remote`), :mod:`.common` (dtype names, the base folder, the
evaluate function), :mod:`.store_base` (the store's base from ``ram.base``).
"""

from __future__ import annotations

import logging
import math
import os
import time
from pathlib import Path
from typing import Any, Callable, Mapping

import torch

from ram_live.methods import Activity
from ram_live.store import LocalCollective, SnapshotStore
from ram_live.training.failures import guarded
from ram_live.store.runs import find_run_marker, say_run, write_run_marker

from .checkpoint import LORA_RE, ActorCheckpoint, earlier_checkpoints
from .checks import preflight
from .common import DTYPE_OF, VerlIntegrationError, load_evaluate, resolve_base
from .config import RAMVerlOptions
from .evaluation import build_evaluations
from .merging import merge_latest
from .pieces import PieceWriter
from .snapshot import CheckpointCounts, CheckpointReader
from .store_base import base_folder_source, base_out_dtype, store_base_fingerprint, write_store_base

__all__ = ["DTYPE_OF", "RAMVerl", "VerlIntegrationError", "load_evaluate", "resolve_base"]

log = logging.getLogger("ram_live.verl")


class RAMVerl:
    """Snapshots of one agent from verl's checkpoints, and merges of the latest snapshot of every agent.

    Args:
        options: the ``ram`` group, validated (:func:`options_from_mapping` / :func:`options_from_verl`).
        master_dtype: the dtype verl trains the actor in (``actor.fsdp_config.model_dtype``; fp32 by default), when
            known before the first checkpoint: the store's base is then prepared (set or checked) right away, as it
            is with ``ram.weights`` other than ``"master"``; else at the first snapshot.

    Raises:
        ConfigError: ``ram.base`` not in the local cache or not a folder; ``ram.evaluate`` / ``ram.rewards`` not
            loadable; a Ray cluster without the GPU the evaluation asks for. When the base is prepared here, as
            :meth:`prepare`.
        VerlIntegrationError: when the base is prepared here, as :meth:`prepare`.
        BaseMismatchError: when the base is prepared here, as :meth:`prepare`.

    Example:
        >>> ram = RAMVerl(options_from_mapping({"store": "runs/ram", "agent": "coder", "base": "m/"}))  # doctest: +SKIP
    """

    def __init__(self, options: RAMVerlOptions, *, master_dtype: torch.dtype | None = None) -> None:
        self.opts = options
        self.store = SnapshotStore(options.store, durable=options.durable)
        self.base_dir = resolve_base(options.base) if options.base else None
        #: the run's evaluations: here outside Ray, in a Ray actor inside a Ray job (:mod:`.evaluation`)
        self.evaluations = build_evaluations(options, self.base_dir)
        self.evaluate = self.evaluations.evaluate
        self.fingerprint: str | None = None
        self.dtype: torch.dtype | None = None  # the store's (and every snapshot's) dtype
        self.history: list[dict[str, float]] = []
        self.saves = 0
        self.last_snapshot_step = -1
        self.last_merge_step = -1
        self.last_merged: Path | None = None
        #: this agent's run in the store: the run recorded in the checkpoint verl resumed from, else a new one
        #: (set at the first snapshot; the offline command sets it beforehand)
        self.run: str | None = None
        self._run_started: float | None = None
        self._run_open = False
        #: look for the run in earlier checkpoints (False under verl's ``trainer.resume_mode=disable``: a fresh run)
        self.resumes = True
        self.reader = CheckpointReader(options)
        # on_error (ram_live.training.failures): the driver alone snapshots and merges
        self.on_error, self.errors, self.last_error, self.collective = options.on_error, 0, None, LocalCollective()
        self.agent = options.agent
        preflight(options)  # before training: the search setting, merged_dir
        if options.weights != "master":
            self.prepare(DTYPE_OF[options.weights])
        elif master_dtype is not None:
            self.prepare(master_dtype)

    # ------------------------------------------------------------------------------------------- base

    def prepare(self, dtype: torch.dtype) -> str:
        """Set the store's base (the base model's weights cast to ``dtype``) or check it is the store's; once per run
        (later calls only check ``dtype``).

        Args:
            dtype: the snapshots' dtype (the checkpoint's master weights' or ``ram.weights``'s).

        Returns:
            The fingerprint of the store's base.

        Raises:
            VerlIntegrationError: ``dtype`` differs from this run's earlier snapshots', or (no ``ram.base``) from
                the dtype of the store's base.
            ConfigError: no ``ram.base`` and the store holds no base yet, or ``ram.base`` is no readable
                safetensors folder.
            BaseMismatchError: the store's base is not ``ram.base`` cast to ``dtype``.
        """
        if self.fingerprint is not None:
            if dtype != self.dtype:
                raise VerlIntegrationError(
                    f"{self.opts.agent}: the checkpoint holds {dtype} weights, this run's snapshots are {self.dtype}"
                )
            return self.fingerprint
        if self.base_dir is None and self.store.has_base():
            self.fingerprint = store_base_fingerprint(self.store, dtype, self.opts.weights)
        else:
            src = base_folder_source(self.base_dir)
            self.fingerprint = write_store_base(self.store, src, dtype, self.opts.max_part_bytes)
        self.dtype = dtype
        return self.fingerprint

    # ------------------------------------------------------------------------------------------- snapshots

    def snapshot(
        self, checkpoint_dir: str | os.PathLike[str], step: int, *, extra: Mapping[str, Any] | None = None
    ) -> dict[str, float]:
        """Snapshot the actor checkpoint in ``checkpoint_dir`` as this agent's snapshot at ``step``, one rank's shard
        file at a time (a LoRA checkpoint: base + ΔW); then prunes to ``ram.keep``.

        Args:
            checkpoint_dir: a ``global_step_<N>`` folder or its ``actor`` folder.
            step: the snapshot's step (verl's global step).
            extra: more JSON entries for the snapshot's manifest, next to its ``verl`` record.

        Returns:
            This agent's numbers: ``ram/<agent>/snapshot_step``, ``changed`` and ``active`` (fractions of the
            entries), ``snapshot_mb``, ``snapshot_seconds``.

        Raises:
            UnsupportedInputError: the checkpoint folder or a rank file is unreadable (:class:`ActorCheckpoint`).
            VerlIntegrationError: ``ram.lora=true`` on a checkpoint without LoRA tensors; no floating-point tensor;
                a tensor the base lacks; ranks' optimizer files that disagree; and as :meth:`prepare`.
            ConfigError: as :meth:`prepare`.
            BaseMismatchError: as :meth:`prepare`.

        Example:
            >>> ram.snapshot("checkpoints/p/e/global_step_20", step=20)  # doctest: +SKIP
        """
        t0 = time.perf_counter()
        ckpt = ActorCheckpoint(checkpoint_dir)
        first = ckpt.shards(0)
        lora = self._is_lora(first)
        dtype = self._snapshot_dtype(first, lora)
        del first  # each rank's file is mapped while it is read, then let go
        fp = self.prepare(dtype)
        base = self.store.base_source()
        specs = {k: (tuple(base.spec(k).shape), base.spec(k).dtype) for k in base.keys()}
        if not self._run_open:  # a resumed verl run continues the run its checkpoints record
            earlier = earlier_checkpoints(ckpt.path, step) if self.resumes else []
            run = self.run or find_run_marker(earlier, self.store.root, self.opts.agent)
            self.run, self._run_started = self.store.open_run(self.opts.agent, run)
            self._run_open = True
            say_run(self.store, self.opts.agent, self.run)
        writer = PieceWriter(
            self.store,
            self.opts.agent,
            step,
            specs,
            fp,
            activity=self.opts.snapshot_activity,
            eps=self.opts.snapshot_eps,
            run=self.run,  # type: ignore[arg-type]
            run_started=self._run_started,
        )
        counts = CheckpointCounts(Activity(self.opts.ram.activity, self.opts.ram.eps))  # type: ignore[arg-type]
        try:
            read = self.reader.lora if lora else self.reader.full
            info = read(ckpt, writer, base, specs, dtype, counts)
            meta = {
                "verl": {
                    "weights": self.opts.weights,
                    "dtype": str(dtype).replace("torch.", ""),
                    "checkpoint": str(ckpt.path),
                    "global_step": int(step),
                    "world_size": ckpt.world_size,
                    **info,
                }
            }
            snap = writer.commit(extra={**meta, **(extra or {})})
        except BaseException:
            writer.abort()
            raise
        write_run_marker(ckpt.path, self.store.root, self.opts.agent, self.run, step)  # type: ignore[arg-type]
        if self.opts.keep is not None:
            self.store.prune(self.opts.keep, self.opts.agent, run=self.run)
        self.last_snapshot_step = step
        a = self.opts.agent
        metrics = {
            f"ram/{a}/snapshot_step": float(step),
            f"ram/{a}/changed": snap.changed / max(snap.numel, 1),
            f"ram/{a}/active": counts.active / (counts.numel or 1),
            f"ram/{a}/snapshot_mb": snap.bytes / 2**20,
            f"ram/{a}/snapshot_seconds": time.perf_counter() - t0,
        }
        log.info(
            "ram_live: %s step %s: %.4f of %d entries changed (%.4f with |τ| > %g), %.1f MB in %.1f s",
            a,
            step,
            metrics[f"ram/{a}/changed"],
            snap.numel,
            metrics[f"ram/{a}/active"],
            self.opts.ram.eps,
            metrics[f"ram/{a}/snapshot_mb"],
            metrics[f"ram/{a}/snapshot_seconds"],
        )
        return metrics

    def _is_lora(self, first: Any) -> bool:
        has = any(LORA_RE.match(k) for k in first.state)
        if self.opts.lora == "auto":
            return has
        if self.opts.lora and not has:
            raise VerlIntegrationError("ram.lora=true, but the checkpoint holds no lora_A/lora_B tensor")
        return bool(self.opts.lora)

    def _snapshot_dtype(self, first: Any, lora: bool) -> torch.dtype:
        if self.opts.weights != "master":
            return DTYPE_OF[self.opts.weights]
        if lora:  # frozen base + ΔW: the base layers' dtype as trained
            for k, t in first.boxes.items():
                if not LORA_RE.match(k) and t.tensor.dtype.is_floating_point:
                    return t.tensor.dtype
            return self.dtype or torch.float32
        for t in first.boxes.values():
            if t.tensor.dtype.is_floating_point:
                return t.tensor.dtype
        raise VerlIntegrationError("the checkpoint holds no floating-point tensor")

    # ------------------------------------------------------------------------------------------- merging

    def out_dtype(self) -> torch.dtype | None:
        """The merged weights' dtype.

        Returns:
            ``ram.merged_dtype``'s; with ``"auto"`` the base folder's first floating-point dtype, or None (the
            inputs') without ``ram.base``.

        Raises:
            ConfigError: ``"auto"`` and ``ram.base`` is no readable safetensors folder.
        """
        return base_out_dtype(self.opts.merged_dtype, self.base_dir)

    def merge(self, step: int) -> dict[str, float]:
        """Merge the latest snapshot of every agent (``ram.agents``) into ``merged_dir/<agent>/global_step_<step>`` (a
        Hugging Face folder: weights, the base's config and tokenizer, and ``ram_merge.json``), evaluate it, prune
        this run's old merges (``ram.keep_merged``). Under ``ram.search``, the merge :func:`ram_live.search` picks.
        Agents that changed no entry are named in one ``UnchangedAgentWarning`` and in ``ram_merge.json``.

        Args:
            step: the merge's step (names the folder; where that name is taken, as when a resumed run merges a
                step again, ``global_step_<step>-v1``, ...: an existing folder is never replaced).

        Returns:
            The ``ram/*`` metrics: ``ram/agents``, ``ram/merge_seconds``, ``ram/<agent>/snapshot_step|density|rho``
            (and ``lambda``), ``ram/search/*`` under search, and the evaluation's scores.

        Raises:
            ConfigError: ``ram.merged_dir`` is not set; some picked snapshots carry importances and others not.
            VerlIntegrationError: the store holds no snapshot of the agents.
            EvaluationError: the evaluation raised, timed out (``ram.eval_timeout``) or its Ray actor failed.
            SearchError: under ``ram.search``, no candidate could be merged and scored.

        Example:
            >>> ram.merge(step=20)  # doctest: +SKIP
        """
        metrics, self.last_merged = merge_latest(self, step)
        self.last_merge_step = step
        return metrics

    def close(self) -> None:
        """Free the evaluation actor (inside Ray), if any; a later evaluation starts a new one."""
        self.evaluations.close()

    # ------------------------------------------------------------------------------------------- the save event

    def should_snapshot(self, save_index: int) -> bool:
        """Whether this save is snapshotted (:meth:`on_save` also snapshots the last step and every merge step).

        Args:
            save_index: which save this is, 1-based (:meth:`save_index`).

        Returns:
            True on multiples of ``ram.snapshot_every``.
        """
        return save_index % self.opts.snapshot_every == 0

    def should_merge(self, save_index: int, last: bool) -> bool:
        """Whether this save is merged.

        Args:
            save_index: which save this is, 1-based (:meth:`save_index`).
            last: this save is at the run's last training step.

        Returns:
            False without ``ram.merge_every``; else True on its multiples and at the last step.
        """
        return self.opts.merge_every is not None and (save_index % self.opts.merge_every == 0 or last)

    def save_index(self, global_step: int) -> int:
        """Which save this is (1-based).

        Args:
            global_step: verl's global step of the save.

        Returns:
            ``ceil(global_step / trainer.save_freq)`` (at least 1) when ``save_freq`` is known (the same after a
            resume); else the number of :meth:`on_save` calls of this process.
        """
        if self.opts.save_freq:
            return max(1, math.ceil(global_step / self.opts.save_freq))
        return self.saves

    def on_save(
        self,
        global_step: int,
        checkpoint_dir: str | os.PathLike[str],
        *,
        last: bool = False,
        log_fn: Callable[[dict[str, float], int], None] | None = None,
    ) -> dict[str, float]:
        """What a checkpoint save triggers: a snapshot and/or a merge when due (a merge step is snapshotted first);
        at the last step the evaluation actor is freed. Non-empty metrics go to :attr:`history` and ``log_fn``.

        Args:
            global_step: verl's global step of the save.
            checkpoint_dir: the save's ``global_step_<N>`` folder (or its ``actor`` folder).
            last: the save is at the run's last training step (snapshot and, with ``merge_every``, merge it).
            log_fn: ``log_fn(metrics, step)``, called with the metrics when there are any.

        Returns:
            The metrics of :meth:`snapshot` and :meth:`merge` (empty when neither was due).

        Raises:
            UnsupportedInputError: as :meth:`snapshot`.
            VerlIntegrationError: as :meth:`snapshot` and :meth:`merge`.
            ConfigError: as :meth:`snapshot` and :meth:`merge`.
            EvaluationError: as :meth:`merge`.
        """
        self.saves += 1
        index = self.save_index(global_step)
        metrics: dict[str, float] = {}
        owner, errors = f"ram ({self.opts.agent!r})", self.errors
        if global_step > self.last_snapshot_step and (self.should_snapshot(index) or last):
            with guarded(self, owner, "snapshot", global_step):  # on_error: a warning and ram/errors, or raise
                metrics.update(self.snapshot(checkpoint_dir, global_step))
        if global_step > self.last_merge_step and self.should_merge(index, last):
            with guarded(self, owner, "merge", global_step):
                if self.last_snapshot_step != global_step:  # merge this step's weights, not an older snapshot's
                    metrics.update(self.snapshot(checkpoint_dir, global_step))
                metrics.update(self.merge(global_step))
        if self.errors > errors:
            metrics["ram/errors"] = float(self.errors)
        if last:
            self.close()  # the run ends: the evaluation actor's GPU is freed
        if metrics:
            self.history.append({"step": float(global_step), **metrics})
            if log_fn is not None:
                log_fn(metrics, global_step)
        return metrics
