"""A verl actor checkpoint written into a :class:`~.pieces.PieceWriter`, one rank's shard file (or a few
LoRA-merged tensors) at a time, never the whole model; the active entries counted on the way with the
merge's own activity rule (:func:`ram_live.functional.count_active`)."""

from __future__ import annotations

import logging
import math
from typing import Any, Mapping

import torch
from torch import Tensor

from ram_live import functional as F
from ram_live.methods import Activity
from ram_live.store import LocalTensor

from .checkpoint import ActorCheckpoint, hf_key
from .common import VerlIntegrationError
from .config import RAMVerlOptions
from .lora import checkpoint_lora_deltas
from .optim import rank_importance
from .pieces import PieceWriter

__all__ = ["CheckpointCounts", "CheckpointReader"]

log = logging.getLogger("ram_live.verl")


class CheckpointCounts:
    """Floating entries seen and, of those, the ones active under ``activity`` (the ``ram/<agent>/active`` metric)."""

    def __init__(self, activity: Activity) -> None:
        self.activity = activity
        self.numel = 0
        self.active = 0

    def add(self, agent: Tensor, base: Tensor) -> None:
        """Count one box of the agent against the base's box (same dtype and shape)."""
        self.numel += agent.numel()
        self.active += F.count_active(agent, base, self.activity)


class CheckpointReader:
    """Reads checkpoints of one run into snapshots (``options``: the run's validated ``ram`` group). Keeps
    across checkpoints only whether it already warned about missing optimizer state."""

    def __init__(self, options: RAMVerlOptions) -> None:
        self.opts = options
        self.warned_importance = False

    def _add(
        self,
        writer: PieceWriter,
        group: dict[str, LocalTensor],
        base_group: dict[str, LocalTensor],
        importance: dict[str, Tensor] | None = None,
    ) -> None:
        if group:
            writer.add(group, base_group, {k: importance[k] for k in group} if importance is not None else None)
            group.clear()
            base_group.clear()

    def _rank_importance(
        self, ckpt: ActorCheckpoint, shards: Any, rank: int, stored: list[bool]
    ) -> dict[str, Tensor] | None:
        """This rank's exp_avg_sq boxes by checkpoint key (None: none; every rank alike, else an error)."""
        if self.opts.importance != "adam":
            return None
        keys = [k for k in shards.state if k not in shards.aliases]
        shapes = {k: tuple(shards.boxes[k].tensor.shape) for k in keys}
        imp, why = rank_importance(
            ckpt.path, ckpt.world_size, rank, keys, shapes, bias_correction=self.opts.importance_bias_correction
        )
        if rank > 0 and (imp is not None) != stored[0]:
            raise VerlIntegrationError(
                f"{ckpt.path}: rank {rank}'s optimizer state "
                f"{'maps' if imp is not None else f'does not map ({why})'}, rank 0's "
                f"{'does' if stored[0] else 'does not'}: the optimizer files disagree"
            )
        if rank == 0:
            stored[:] = [imp is not None]
            if imp is None and not self.warned_importance:
                self.warned_importance = True
                log.warning(
                    "ram_live: %s: snapshots without importances (%s); merges are plain RAM where no "
                    "agent's snapshots carry them, refused where some do",
                    self.opts.agent,
                    why,
                )
        if imp is not None:
            for alias, target in shards.aliases.items():
                imp[alias] = imp[target]
        return imp

    @staticmethod
    def _box_pair(
        base: Any, key: str, t: LocalTensor, dtype: torch.dtype, counts: CheckpointCounts
    ) -> tuple[LocalTensor, LocalTensor]:
        """The agent's box in the snapshot's ``dtype`` and the base's same box, counted."""
        dtype = dtype if t.tensor.dtype.is_floating_point else t.tensor.dtype
        data = t.tensor if t.tensor.dtype == dtype else t.tensor.to(dtype)
        b = base.get_box(key, t.offsets, tuple(data.shape))
        if data.dtype.is_floating_point:
            counts.add(data, b)
        return (LocalTensor(data, t.global_shape, t.offsets, True), LocalTensor(b, t.global_shape, t.offsets, True))

    def full(
        self,
        ckpt: ActorCheckpoint,
        writer: PieceWriter,
        base: Any,
        specs: Mapping[str, Any],
        dtype: torch.dtype,
        counts: CheckpointCounts,
    ) -> dict[str, Any]:
        """Every rank's shards of a full-weights checkpoint (one rank's boxes never share a part with the
        next's); returns the manifest's ``verl`` details."""
        group: dict[str, LocalTensor] = {}
        base_group: dict[str, LocalTensor] = {}
        size = 0
        stored = [False]
        for rank in range(ckpt.world_size):
            shards = ckpt.shards(rank)
            imp = self._rank_importance(ckpt, shards, rank, stored)
            imp_group: dict[str, Tensor] | None = {} if imp is not None else None
            names = {}
            for key in shards.boxes:
                name = hf_key(key)
                if name not in specs:
                    raise VerlIntegrationError(
                        f"{ckpt.files[rank]}: tensor {key!r} ({name!r}) is not in the base model {self.opts.base!r}: "
                        "was this run trained from another base?"
                    )
                names[key] = name
            for alias, target in shards.aliases.items():
                name = hf_key(alias)
                if name in specs:  # the base stores the tied copy too: snapshot it from the shared tensor
                    names[alias] = name
                    shards.boxes[alias] = shards.boxes[target]
            for key, t in shards.boxes.items():
                if not t.owner:
                    continue
                pair = self._box_pair(base, names[key], t, dtype, counts)
                group[names[key]], base_group[names[key]] = pair
                if imp_group is not None and imp is not None:
                    imp_group[names[key]] = imp[key]
                size += pair[0].tensor.numel() * pair[0].tensor.element_size()
                if size >= self.opts.max_part_bytes:
                    self._add(writer, group, base_group, imp_group)
                    size = 0
            self._add(writer, group, base_group, imp_group)
            size = 0
            del shards  # let the rank's memory map go
        return {"lora": False}

    def lora(
        self,
        ckpt: ActorCheckpoint,
        writer: PieceWriter,
        base: Any,
        specs: Mapping[str, Any],
        dtype: torch.dtype,
        counts: CheckpointCounts,
    ) -> dict[str, Any]:
        """A LoRA checkpoint: each target weight as base + ΔW (in the base's dtype), every other tensor
        unchanged; returns the manifest's ``verl`` details."""
        deltas, info = checkpoint_lora_deltas(ckpt, self.opts)
        group: dict[str, LocalTensor] = {}
        base_group: dict[str, LocalTensor] = {}
        size = 0
        touched = set()
        for module, delta in deltas.items():
            key = f"{module}.weight"
            if key not in specs:
                raise VerlIntegrationError(f"{ckpt.path}: LoRA module {module!r} has no weight {key!r} in the base")
            shape, base_dtype = specs[key]
            if tuple(delta.shape) != tuple(shape):
                raise VerlIntegrationError(
                    f"{ckpt.path}: ΔW of {module!r} is {list(delta.shape)}, the base weight {list(shape)}"
                )
            b = base.get_box(key, (0,) * len(shape), shape)
            agent = (b.float() + delta).to(base_dtype)
            t = LocalTensor(agent, tuple(shape), (0,) * len(shape), True)
            pair = self._box_pair(base, key, t, dtype, counts)
            group[key], base_group[key] = pair
            touched.add(key)
            size += agent.numel() * agent.element_size()
            if size >= self.opts.max_part_bytes:
                self._add(writer, group, base_group)
                size = 0
        self._add(writer, group, base_group)
        writer.add_unchanged([k for k in specs if k not in touched])
        counts.numel += sum(math.prod(specs[k][0]) for k in specs if k not in touched and specs[k][1].is_floating_point)
        return {"lora": True, **info, "lora_modules": len(deltas)}
