"""verl's FSDP actor checkpoints as the store needs them: one rank's shards at a time, as boxes.

A checkpoint saved by verl's ``FSDPCheckpointManager`` (every FSDP/FSDP2 trainer of verl) is a folder::

    global_step_<N>/actor/
        model_world_size_<W>_rank_<R>.pt     each rank's ``model.state_dict()``: DTensor shards (FSDP2: ``Shard(0)``
                                             of the fp32 master weights under verl's default model_dtype=fp32)
        optim_world_size_<W>_rank_<R>.pt, extra_state_world_size_<W>_rank_<R>.pt
        fsdp_config.json                     {"FSDP_version": 2, "world_size": W}
        lora_train_meta.json                 LoRA runs: {"r", "lora_alpha", "task_type"}
        huggingface/                         config, tokenizer (and the full model with save_contents=hf_model)

:class:`ActorCheckpoint` opens one rank file at a time with ``torch.load(mmap=True, weights_only=True)`` (nothing
is unpickled but tensors, and nothing is read until a box is used), and gives each tensor's box in the global
tensor: the rank's coordinate in the DTensor's device mesh, the ``torch.chunk`` rule of ``Shard`` placements.
"""

from __future__ import annotations

import json
import logging
import math
import re
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator

import torch
from torch import Tensor

from ram_live.io.dtensor import is_dtensor
from ram_live.errors import UnsupportedInputError
from ram_live.store import LocalTensor

__all__ = ["LORA_RE", "ActorCheckpoint", "RankShards", "find_checkpoints", "hf_key", "shard_box"]

_MODEL_RE = re.compile(r"^model_world_size_(\d+)_rank_(\d+)\.pt$")
_STEP_RE = re.compile(r"^global_step_(\d+)$")
PEFT_PREFIX = "base_model.model."
# verl saves PEFT's own parameter names: <module>.lora_A.<adapter>.weight, <module>.lora_embedding_A.<adapter>
LORA_RE = re.compile(
    r"^(?P<module>.+)\.(?P<kind>lora_A|lora_B|lora_embedding_A|lora_embedding_B)\.(?P<adapter>[^.]+)"
    r"(?P<weight>\.weight)?$"
)


def hf_key(key: str) -> str:
    """A checkpoint key as the base model's Hugging Face folder names it (PEFT's wrapper prefixes removed)."""
    key = key.removeprefix(PEFT_PREFIX)
    return key.replace(".base_layer.", ".")


def find_checkpoints(root: str | Path) -> list[tuple[int, Path]]:
    """The checkpoints under ``root`` that hold model shard files (``model_world_size_<W>_rank_<R>.pt``).

    Args:
        root: verl's ``trainer.default_local_dir`` (holding ``global_step_<N>`` folders), one ``global_step_<N>`` or
            its ``actor`` folder.

    Returns:
        ``(step, actor folder)`` pairs, by step (empty when none holds model files; an actor folder outside a
        ``global_step_<N>`` folder has step 0).

    Raises:
        UnsupportedInputError: ``root`` is not a folder.

    Example:
        >>> find_checkpoints("checkpoints/my_project/my_run")  # doctest: +SKIP
        [(20, PosixPath('.../global_step_20/actor')), (40, PosixPath('.../global_step_40/actor'))]
    """
    root = Path(root)
    if not root.is_dir():
        raise UnsupportedInputError(f"{root}: no such checkpoint folder")
    if _has_model_files(root):
        m = _STEP_RE.match(root.parent.name)
        return [(int(m.group(1)) if m else 0, root)]
    if _STEP_RE.match(root.name):
        actor = root / "actor"
        return [(int(_STEP_RE.match(root.name).group(1)), actor)] if _has_model_files(actor) else []  # type: ignore
    found = []
    for child in root.iterdir():
        m = _STEP_RE.match(child.name)
        if m and _has_model_files(child / "actor"):
            found.append((int(m.group(1)), child / "actor"))
    return sorted(found)


def earlier_checkpoints(actor: Path, step: int) -> list[Path]:
    """The actor folders of the checkpoints before ``step`` next to ``actor`` (``<root>/global_step_<N>/actor``),
    newest first: where a resumed run finds the store run it wrote to (:func:`ram_live.store.runs.find_run_marker`).

    Args:
        actor: a checkpoint's actor folder.
        step: its step.

    Returns:
        The folders (empty when ``actor`` is not inside a ``global_step_<N>`` folder).
    """
    if not _STEP_RE.match(actor.parent.name) or not actor.parent.parent.is_dir():
        return []
    found = []
    for child in actor.parent.parent.iterdir():
        m = _STEP_RE.match(child.name)
        if m and int(m.group(1)) < step:
            found.append((int(m.group(1)), child / "actor"))
    return [p for _, p in sorted(found, reverse=True)]


def _has_model_files(folder: Path) -> bool:
    return folder.is_dir() and any(_MODEL_RE.match(p.name) for p in folder.iterdir())


@dataclass
class RankShards:
    """One rank's tensors: ``boxes`` by checkpoint key (owned boxes only: a replica is owned by one rank),
    ``aliases`` (a key whose tensor is another key's: tied weights), and the raw state dict."""

    rank: int
    boxes: dict[str, LocalTensor]
    aliases: dict[str, str]
    state: dict[str, Any]


class ActorCheckpoint:
    """One ``global_step_<N>/actor`` folder written by verl's ``FSDPCheckpointManager``: its rank files, world size,
    step and LoRA metadata (nothing is loaded until :meth:`load` / :meth:`shards`).

    Args:
        path: the ``actor`` folder, or the ``global_step_<N>`` folder holding it.

    Raises:
        UnsupportedInputError: no such folder; no ``fsdp_config.json`` and model files of several (or no) world
            sizes; a rank's model file missing (checkpoint incomplete, or saved without ``model`` in
            ``save_contents``).

    Example:
        >>> ckpt = ActorCheckpoint("checkpoints/run/global_step_40")  # doctest: +SKIP
    """

    def __init__(self, path: str | Path) -> None:
        path = Path(path)
        if _STEP_RE.match(path.name) and (path / "actor").is_dir():
            path = path / "actor"
        self.path = path
        if not path.is_dir():
            raise UnsupportedInputError(f"{path}: no such verl checkpoint folder")
        m = _STEP_RE.match(path.parent.name)
        self.step = int(m.group(1)) if m else None
        files: dict[int, dict[int, Path]] = {}
        for p in path.iterdir():
            mm = _MODEL_RE.match(p.name)
            if mm:
                files.setdefault(int(mm.group(1)), {})[int(mm.group(2))] = p
        config = path / "fsdp_config.json"
        world = None
        if config.is_file():
            world = json.loads(config.read_text()).get("world_size")
        if world is None:
            if len(files) != 1:
                raise UnsupportedInputError(
                    f"{path}: no fsdp_config.json and model files of {len(files)} world sizes: cannot tell which"
                )
            world = next(iter(files))
        self.world_size = int(world)
        ranks = files.get(self.world_size, {})
        missing = sorted(set(range(self.world_size)) - set(ranks))
        if missing:
            raise UnsupportedInputError(
                f"{path}: model_world_size_{self.world_size}_rank_R.pt is missing for rank(s) {missing[:8]} "
                "(checkpoint incomplete, or saved without 'model' in save_contents?)"
            )
        self.files = [ranks[r] for r in range(self.world_size)]
        meta = path / "lora_train_meta.json"
        self.lora_meta: dict[str, Any] | None = json.loads(meta.read_text()) if meta.is_file() else None
        self.hf_dir = path / "huggingface"

    def __repr__(self) -> str:
        return f"ActorCheckpoint({str(self.path)!r}, step={self.step}, world_size={self.world_size})"

    def load(self, rank: int) -> dict[str, Any]:
        """Rank ``rank``'s state dict, memory-mapped (``weights_only``: tensors, DTensors and their meshes only).

        Args:
            rank: the rank, ``0 <= rank < world_size``.

        Returns:
            The rank file's state dict (DTensor shards or tensors by checkpoint key).

        Raises:
            UnsupportedInputError: the file is not readable as tensors only, or holds no dict.
        """
        import torch.distributed.tensor  # noqa: F401 - registers DTensor for weights_only loading

        path = self.files[rank]
        mesh_log = logging.getLogger("torch.distributed.device_mesh")
        level = mesh_log.level
        mesh_log.setLevel(logging.ERROR)  # "unpickling of the DeviceMesh occurred before the PGs were created"
        try:
            return self._load(path)
        finally:
            mesh_log.setLevel(level)

    def _load(self, path: Path) -> dict[str, Any]:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            try:
                state = torch.load(path, map_location="cpu", weights_only=True, mmap=True)
            except RuntimeError as exc:
                if "mmap" not in str(exc):
                    raise
                state = torch.load(path, map_location="cpu", weights_only=True)  # legacy (non-zip) format
            except Exception as exc:
                raise UnsupportedInputError(
                    f"{path}: not readable as tensors only ({type(exc).__name__}: {str(exc)[:300]}); the integration "
                    "reads DTensor/tensor state dicts of FSDP/FSDP2 checkpoints"
                ) from None
        if not isinstance(state, dict):
            raise UnsupportedInputError(f"{path}: holds a {type(state).__name__}, not a state dict")
        return state

    def shards(self, rank: int) -> RankShards:
        """Rank ``rank``'s boxes (views of the memory-mapped file; nothing is copied).

        Args:
            rank: the rank, ``0 <= rank < world_size``.

        Returns:
            A :class:`RankShards`: each key's box in the global tensor (a replicated or unsharded tensor is owned by
            one rank only), the aliases of tied weights, and the raw state dict.

        Raises:
            UnsupportedInputError: the file is unreadable (:meth:`load`); an entry is not a tensor or DTensor; a
                placement other than ``Shard`` / ``Replicate``, or a shard whose shape its placements do not give.
        """
        state = self.load(rank)
        boxes: dict[str, LocalTensor] = {}
        aliases: dict[str, str] = {}
        seen: dict[tuple[Any, ...], str] = {}
        for key, value in state.items():
            if not isinstance(value, Tensor):
                raise UnsupportedInputError(f"{self.files[rank]}: entry {key!r} is a {type(value).__name__}")
            local, global_shape, offsets, owner = _box(key, value, rank, self.world_size)
            ident = (
                (
                    local.untyped_storage().data_ptr(),
                    local.storage_offset(),
                    tuple(local.shape),
                    tuple(local.stride()),
                    local.dtype,
                    global_shape,
                )
                if local.numel()
                else None
            )
            if ident is not None and ident in seen:
                aliases[key] = seen[ident]
                continue
            if ident is not None:
                seen[ident] = key
            if owner:
                boxes[key] = LocalTensor(local, global_shape, offsets, True)
            else:
                boxes[key] = LocalTensor(local, global_shape, offsets, False)
        return RankShards(rank, boxes, aliases, state)

    def iter_shards(self) -> Iterator[RankShards]:
        """Every rank's :meth:`shards`, one rank file open at a time.

        Yields:
            A :class:`RankShards` per rank, rank 0 first.

        Raises:
            UnsupportedInputError: as :meth:`shards`.
        """
        for r in range(self.world_size):
            yield self.shards(r)


def _box(key: str, t: Tensor, rank: int, world_size: int) -> tuple[Tensor, tuple[int, ...], tuple[int, ...], bool]:
    """(local tensor, global shape, offsets, owner) of a checkpoint entry of rank ``rank``."""
    if not is_dtensor(t):
        if type(t) is not torch.Tensor and not isinstance(t, torch.nn.Parameter):
            raise UnsupportedInputError(
                f"tensor {key!r} is a {type(t).__name__}; verl checkpoints of FSDP/FSDP2 hold DTensors or tensors"
            )
        # FSDP leaves what it does not shard whole on every rank (buffers, unwrapped parameters): rank 0 owns it
        return t, tuple(t.shape), (0,) * t.dim(), rank == 0
    offsets, owner = shard_box(
        key, tuple(t.shape), t.device_mesh.mesh, tuple(t.placements), rank, tuple(t._local_tensor.shape)
    )
    return t._local_tensor, tuple(t.shape), offsets, owner


def shard_box(
    key: str,
    global_shape: tuple[int, ...],
    mesh: Tensor,
    placements: tuple[Any, ...],
    rank: int,
    local_shape: tuple[int, ...],
) -> tuple[tuple[int, ...], bool]:
    """(offsets, owner) of rank ``rank``'s shard of a DTensor of ``global_shape`` on a device mesh of global ranks
    ``mesh`` with ``placements``: ``Shard(d)`` cuts dim d as ``torch.chunk`` does (nested shards cut the previous
    box), ``Replicate`` makes the rank at coordinate 0 of that mesh dim the owner (FSDP: ``[Shard(0)]``; HSDP:
    ``[Replicate(), Shard(0)]``). Checks the result against the shard's ``local_shape``."""
    where = (mesh == rank).nonzero()
    if where.shape[0] != 1:
        raise UnsupportedInputError(f"tensor {key!r}: rank {rank} is not in its device mesh {mesh.tolist()}")
    coordinate = where[0].tolist()
    shape = list(global_shape)
    offsets = [0] * len(shape)
    owner = True
    for dim, placement in enumerate(placements):
        kind = type(placement).__name__
        if kind == "Replicate":
            owner = owner and coordinate[dim] == 0
        elif kind == "Shard":
            d = placement.dim
            n = mesh.shape[dim]
            chunk = math.ceil(shape[d] / n) if shape[d] else 0
            start = min(coordinate[dim] * chunk, shape[d])
            length = max(0, min(chunk, shape[d] - start))
            offsets[d] += start
            shape[d] = length
        else:
            raise UnsupportedInputError(
                f"tensor {key!r} has placement {placement!r}; verl checkpoints of FSDP/FSDP2 (with or without HSDP) "
                "use Shard and Replicate only (FSDP2 + tensor parallel's strided shards are not supported)"
            )
    if list(local_shape) != shape:
        raise UnsupportedInputError(
            f"tensor {key!r}: rank {rank}'s shard has shape {list(local_shape)}, its placements {placements} on mesh "
            f"{mesh.tolist()} give {shape}"
        )
    return tuple(offsets), owner
