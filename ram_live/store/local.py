"""A model as this process holds it (:class:`LocalModel`): whole tensors, or DTensors' local shards as boxes."""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor, nn

from ..io.dtensor import is_dtensor
from ..io.model_files import store_files_of
from ..errors import InputMismatchError, UnsupportedInputError
from ..io.sources import TensorSource, TensorSpec
from .format import Box, dtype_name


@dataclass
class LocalTensor:
    """What this process holds of one tensor: ``tensor`` is the box ``offsets`` + ``tensor.shape`` of a tensor of
    ``global_shape``; ``owner`` says whether this process writes (and counts) that box (replicas: one owner)."""

    tensor: Tensor
    global_shape: tuple[int, ...]
    offsets: tuple[int, ...]
    owner: bool = True
    is_buffer: bool = False

    @property
    def box(self) -> Box:
        return self.offsets, tuple(self.tensor.shape)

    @property
    def full(self) -> bool:
        return tuple(self.tensor.shape) == self.global_shape


def _dtensor_local(key: str, t: Any) -> tuple[Tensor, tuple[int, ...], bool]:
    """Local tensor, global offsets and ownership of a DTensor (owner: coordinate 0 on every replicated mesh dim)."""
    from torch.distributed.tensor._utils import compute_local_shape_and_global_offset

    mesh = t.device_mesh
    for placement in t.placements:
        kind = type(placement).__name__
        if placement.is_partial():
            raise UnsupportedInputError(f"tensor {key!r} is a DTensor with a Partial placement; reduce it first")
        if kind not in ("Shard", "Replicate"):
            raise UnsupportedInputError(
                f"tensor {key!r} is a DTensor with placement {placement!r}; the store supports Shard and Replicate "
                "placements (FSDP2 or tensor parallelism alone; not the strided shards of FSDP2 + TP)"
            )
    local = t.to_local()
    shape, offsets = compute_local_shape_and_global_offset(t.shape, mesh, t.placements)
    if tuple(local.shape) != tuple(shape):
        raise UnsupportedInputError(
            f"tensor {key!r}: local shard shape {tuple(local.shape)} is not the box {tuple(shape)} the placements give"
        )
    coordinate = mesh.get_coordinate()
    owner = coordinate is not None and all(coordinate[i] == 0 for i, p in enumerate(t.placements) if p.is_replicate())
    return local, tuple(int(o) for o in offsets), owner


def _storage_id(t: Tensor) -> tuple[Any, ...] | None:
    if t.device.type == "meta" or t.numel() == 0 or is_dtensor(t):
        return None
    return (t.untyped_storage().data_ptr(), t.storage_offset(), tuple(t.shape), tuple(t.stride()), t.dtype)


class LocalModel:
    """A model as this process holds it: ``{key: LocalTensor}`` for the canonical keys, tied names as aliases.

    A :class:`~ram_live.io.sources.TensorSource` of the local tensors (shape = the local box), so a local model can be
    the base or an agent of a merge. ``model_files()``: the config, generation config and tokenizer files of the
    model or folder it was made from (:func:`~ram_live.io.model_files.store_files_of`), which a store keeps with its
    base; ``{}`` for other inputs.
    """

    def __init__(
        self,
        tensors: dict[str, LocalTensor],
        aliases: dict[str, str],
        keys: list[str],
        name: str = "local",
        distributed: bool = False,
    ) -> None:
        self.name = name
        self.tensors = tensors
        self._aliases = aliases
        self._keys = keys
        self.distributed = distributed  # made from DTensors: each rank holds (and merges) its own part
        self.model_files: Callable[[], dict[str, bytes]] = dict

    # -- construction

    @classmethod
    def from_obj(cls, obj: Any, *, clone: bool = False, name: str = "local") -> LocalModel:
        """From an ``nn.Module`` (its ``state_dict`` keys, buffers marked, DTensors as local shards), a state dict,
        a :class:`TensorSource`, or a path (safetensors file / HF folder). ``clone=True`` copies every tensor
        (a frozen base of a module that keeps training)."""
        if isinstance(obj, LocalModel):
            return obj.clone(name) if clone else obj
        buffers: set[str] = set()
        aliases: dict[str, str] = {}
        if isinstance(obj, nn.Module):
            state = obj.state_dict(keep_vars=True)
            params = {n for n, _ in obj.named_parameters(remove_duplicate=False)}
            buffers = {k for k in state if k not in params}
            seen: dict[int, str] = {}
            for key, value in state.items():
                if id(value) in seen:
                    aliases[key] = seen[id(value)]
                else:
                    seen[id(value)] = key
        elif isinstance(obj, Mapping):
            state = dict(obj)
            for key, value in state.items():
                if not isinstance(value, Tensor):
                    raise UnsupportedInputError(f"{name}: value of {key!r} is a {type(value).__name__}, not a Tensor")
        else:
            from ..io.sources import as_source

            src = obj if isinstance(obj, TensorSource) else as_source(obj, name)
            aliases = dict(src.aliases())
            state = {k: src.get(k) for k in src.keys() if k not in aliases}
            state.update({k: state[v] for k, v in aliases.items()})
            buffers = {k for k in src.keys() if src.spec(k).is_buffer}
        if not isinstance(obj, nn.Module):
            seen_storage: dict[tuple[Any, ...], str] = {}
            for key, value in state.items():
                if key in aliases:
                    continue
                ident = _storage_id(value)
                if ident is None:
                    continue
                if ident in seen_storage:
                    aliases[key] = seen_storage[ident]
                else:
                    seen_storage[ident] = key
        tensors: dict[str, LocalTensor] = {}
        distributed = False
        for key, value in state.items():
            if key in aliases:
                continue
            value = value.detach()
            if is_dtensor(value):
                distributed = True
                local, offsets, owner = _dtensor_local(key, value)
                global_shape = tuple(value.shape)
            else:
                local, offsets, owner = value, (0,) * value.dim(), True
                global_shape = tuple(value.shape)
            dtype_name(local.dtype, key)
            if clone:
                local = local.clone(memory_format=torch.contiguous_format)
            tensors[key] = LocalTensor(local, global_shape, offsets, owner, key in buffers)
        model = cls(tensors, aliases, list(state), name, distributed)
        if isinstance(obj, (nn.Module, str, os.PathLike)):
            model.model_files = store_files_of(obj)
        return model

    def clone(self, name: str | None = None) -> LocalModel:
        tensors = {
            k: LocalTensor(
                v.tensor.clone(memory_format=torch.contiguous_format), v.global_shape, v.offsets, v.owner, v.is_buffer
            )
            for k, v in self.tensors.items()
        }
        return self._with_files(
            LocalModel(tensors, dict(self._aliases), list(self._keys), name or self.name, self.distributed)
        )

    def renamed(self, name: str) -> LocalModel:
        return self._with_files(LocalModel(self.tensors, self._aliases, self._keys, name, self.distributed))

    def _with_files(self, other: LocalModel) -> LocalModel:
        other.model_files = self.model_files
        return other

    @property
    def sharded(self) -> bool:
        """True for DTensor models (each rank holds its part) and whenever a tensor is only part of its whole."""
        return self.distributed or any(not t.full for t in self.tensors.values())

    def boxes(self) -> dict[str, Box]:
        return {k: t.box for k, t in self.tensors.items()}

    def numel(self) -> int:
        return sum(t.tensor.numel() for t in self.tensors.values())

    def check_like(self, other: LocalModel, who: str) -> None:
        """Same keys, boxes and dtypes as ``other`` (raises :class:`InputMismatchError` naming the key)."""
        if set(self._keys) != set(other._keys):
            missing = sorted(set(other._keys) - set(self._keys))
            extra = sorted(set(self._keys) - set(other._keys))
            raise InputMismatchError(
                f"{who} does not match the base: missing {missing[:5]}, extra {extra[:5]}",
                key=(missing or extra or [None])[0],
                agent=who,
            )
        for key, mine in self.tensors.items():
            theirs = other.tensors.get(key)
            if theirs is None:
                raise InputMismatchError(f"{who}: {key!r} is tied differently than in the base", key=key, agent=who)
            if mine.global_shape != theirs.global_shape or mine.box != theirs.box:
                raise InputMismatchError(
                    f"{who}: tensor {key!r} has shape {list(mine.global_shape)} (local box {mine.box}), the base "
                    f"{list(theirs.global_shape)} (local box {theirs.box})",
                    key=key,
                    agent=who,
                )
            if mine.tensor.dtype != theirs.tensor.dtype:
                raise InputMismatchError(
                    f"{who}: tensor {key!r} has dtype {mine.tensor.dtype}, the base {theirs.tensor.dtype} (snapshots "
                    "store bits: train in the base's dtype, or give a base of the model's dtype)",
                    key=key,
                    agent=who,
                )

    # -- TensorSource

    def keys(self) -> list[str]:
        return list(self._keys)

    def spec(self, key: str) -> TensorSpec:
        t = self.tensors[self._aliases.get(key, key)]
        return _spec(tuple(t.tensor.shape), t.tensor.dtype, t.tensor.device, t.is_buffer, t.owner)

    def get(self, key: str) -> Tensor:
        return self.tensors[self._aliases.get(key, key)].tensor

    def aliases(self) -> dict[str, str]:
        return dict(self._aliases)


def _spec(
    shape: tuple[int, ...], dtype: torch.dtype, device: torch.device, is_buffer: bool, counted: bool = True
) -> TensorSpec:
    """A TensorSpec; ``counted`` (whether this rank's box counts in global statistics) where the core has it."""
    if "counted" in getattr(TensorSpec, "__dataclass_fields__", {}):
        return TensorSpec(shape, dtype, device, is_buffer, counted)  # type: ignore[call-arg]
    return TensorSpec(shape, dtype, device, is_buffer)
