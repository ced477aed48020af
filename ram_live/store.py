"""Task-vector snapshots of agents during training: a store on a (shared) file system, one folder per agent.

A snapshot keeps, per tensor, the agent's values at the positions where they differ from the base plus those
positions (int32 indices or a packed bitmask, whichever is smaller; all values when nearly everything changed),
in safetensors. Base + snapshot reconstructs the agent bit-exactly in its own dtype, and the size on disk is
proportional to what changed. Each snapshot has a JSON manifest, written last and atomically (temporary name,
then rename): readers trust only manifests, so a writer killed at any moment leaves no half snapshot visible.
Nothing is pickled: tensors are safetensors, everything else JSON.

Layout of a store folder::

    store.json                              {"format": "ram_live.store", "version": 1}
    _base/base.json                         the base's manifest (fingerprint, tensors, pieces)
    _base/base-<nonce>.p<rank>.safetensors  the base's tensors (dense)
    <agent>/<step:012d>.json                one manifest per snapshot
    <agent>/<step:012d>-<nonce>.p<rank>.safetensors

Snapshots are :class:`~ram_live.sources.TensorSource` s that carry their base, so they merge straight away:

>>> store = SnapshotStore("runs/ram")                                       # doctest: +SKIP
>>> writer = store.writer("coder", base=model)        # at train start: persists (or checks) the base
>>> writer.snapshot(model, step=50)                    # every n steps: diff on the weights' device
>>> generalist = ram_merge(store.latest_all())         # any process: every agent's latest snapshot

Sharded models (DTensor parameters, e.g. Lightning's ``ModelParallelStrategy``) are stored as pieces: every rank
writes the boxes of the tensors it holds (replicas once), rank 0 writes the manifest. A reader assembles full
tensors from pieces of any layout, or reads only one box (:meth:`Snapshot.restrict`) to merge shard-wise
(``ram_merge(..., process_group=True)`` on those boxes).
"""

from __future__ import annotations

import ctypes
import hashlib
import json
import math
import os
import re
import time
import uuid
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import torch
from torch import Tensor, nn

from . import functional as F
from .distributed import is_dtensor
from .memory import advise_hugepages
from .engine import DEFAULT_CHUNK_NUMEL, DeltaStream, build_plan
from .errors import ConfigError, InputMismatchError, RamLiveError, UnsupportedInputError
from .methods import Activity
from .sources import TensorSource, TensorSpec

__all__ = [
    "BaseMismatchError",
    "Collective",
    "CorruptSnapshotError",
    "LocalCollective",
    "LocalModel",
    "LocalTensor",
    "Snapshot",
    "SnapshotInfo",
    "SnapshotNotFoundError",
    "SnapshotStore",
    "SnapshotWriter",
    "StoreBase",
    "StoreError",
    "TorchCollective",
    "fingerprint",
    "ram_statistics",
]

STORE_FORMAT = "ram_live.store"
SNAPSHOT_FORMAT = "ram_live.snapshot"
BASE_FORMAT = "ram_live.base"
VERSION = 1
BASE_DIR = "_base"
_AGENT_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")
_MANIFEST_RE = re.compile(r"^(\d+)\.json$")


# ----------------------------------------------------------------------------------------------- errors


class StoreError(RamLiveError):
    """Something is wrong with a snapshot store."""


class BaseMismatchError(StoreError, ValueError):
    """A model, snapshot or store was made against a different base (fingerprints differ)."""


class SnapshotNotFoundError(StoreError, LookupError):
    """No such agent or snapshot (or it was pruned while being opened)."""


class CorruptSnapshotError(StoreError, ValueError):
    """A manifest that does not match its files (never produced by this module's writers)."""


# ----------------------------------------------------------------------------------------------- dtypes

_DTYPES: dict[str, torch.dtype] = {
    "float64": torch.float64, "float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16,
    "int64": torch.int64, "int32": torch.int32, "int16": torch.int16, "int8": torch.int8, "uint8": torch.uint8,
    "bool": torch.bool,
}
for _name in ("float8_e4m3fn", "float8_e5m2"):
    if hasattr(torch, _name):
        _DTYPES[_name] = getattr(torch, _name)
_DTYPE_NAMES = {v: k for k, v in _DTYPES.items()}
_BITS = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}


def _dtype_name(dtype: torch.dtype, key: str = "?") -> str:
    try:
        return _DTYPE_NAMES[dtype]
    except KeyError:
        raise UnsupportedInputError(f"tensor {key!r} has dtype {dtype}, which the snapshot store cannot hold") from None


def _dtype(name: str) -> torch.dtype:
    try:
        return _DTYPES[name]
    except KeyError:
        raise CorruptSnapshotError(f"unknown dtype {name!r} in a manifest") from None


def _bits(t: Tensor) -> Tensor:
    """The same memory as integers of the same width (bit-exact comparisons; NaN == NaN, -0.0 != 0.0)."""
    return t.view(_BITS[t.element_size()])


# ----------------------------------------------------------------------------------------------- collectives


class Collective(Protocol):
    """The few collective operations the store and the schedule need (all ranks call each one together)."""

    rank: int
    world_size: int

    def barrier(self) -> None: ...

    def all_gather_int64(self, values: Sequence[int]) -> list[list[int]]: ...

    def all_reduce_sum_(self, tensor: Tensor) -> Tensor: ...

    def broadcast_json(self, obj: Any) -> Any: ...


class LocalCollective:
    """One process: every collective is the identity."""

    rank = 0
    world_size = 1

    def barrier(self) -> None:
        pass

    def all_gather_int64(self, values: Sequence[int]) -> list[list[int]]:
        return [list(values)]

    def all_reduce_sum_(self, tensor: Tensor) -> Tensor:
        return tensor

    def broadcast_json(self, obj: Any) -> Any:
        return json.loads(json.dumps(obj))


class TorchCollective:
    """``torch.distributed``'s default group (gloo tensors on CPU, NCCL tensors on the current CUDA device).

    Objects travel as JSON bytes in uint8 tensors (``broadcast_object_list`` would pickle)."""

    def __init__(self, group: Any = None) -> None:
        import torch.distributed as dist

        self._dist = dist
        self.group = group
        self.rank = dist.get_rank(group)
        self.world_size = dist.get_world_size(group)
        backend = str(dist.get_backend(group))
        if "nccl" in backend and torch.cuda.is_available():
            self.device = torch.device("cuda", torch.cuda.current_device())
        else:
            self.device = torch.device("cpu")

    def barrier(self) -> None:
        if self.device.type == "cuda":
            self._dist.barrier(group=self.group, device_ids=[self.device.index])
        else:
            self._dist.barrier(group=self.group)

    def all_gather_int64(self, values: Sequence[int]) -> list[list[int]]:
        local = torch.tensor(list(values), dtype=torch.int64, device=self.device)
        out = [torch.empty_like(local) for _ in range(self.world_size)]
        self._dist.all_gather(out, local, group=self.group)
        return [o.tolist() for o in out]

    def all_reduce_sum_(self, tensor: Tensor) -> Tensor:
        moved = tensor.to(self.device)
        self._dist.all_reduce(moved, group=self.group)
        if moved is not tensor:
            tensor.copy_(moved)
        return tensor

    def broadcast_json(self, obj: Any) -> Any:
        payload = json.dumps(obj).encode() if self.rank == 0 else b""
        size = torch.tensor([len(payload)], dtype=torch.int64, device=self.device)
        self._dist.broadcast(size, src=0, group=self.group)
        buf = torch.zeros(int(size.item()), dtype=torch.uint8, device=self.device)
        if self.rank == 0 and payload:
            buf.copy_(torch.frombuffer(bytearray(payload), dtype=torch.uint8))
        self._dist.broadcast(buf, src=0, group=self.group)
        return json.loads(bytes(buf.cpu().tolist()).decode())


def default_collective() -> Collective:
    """:class:`TorchCollective` when ``torch.distributed`` is initialised with more than one rank, else local."""
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1:
        return TorchCollective()
    return LocalCollective()


# ----------------------------------------------------------------------------------------------- local models


Box = tuple[tuple[int, ...], tuple[int, ...]]  # (offsets, shape) within the global tensor


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
    owner = coordinate is not None and all(
        coordinate[i] == 0 for i, p in enumerate(t.placements) if p.is_replicate()
    )
    return local, tuple(int(o) for o in offsets), owner


def _storage_id(t: Tensor) -> tuple[Any, ...] | None:
    if t.device.type == "meta" or t.numel() == 0 or is_dtensor(t):
        return None
    return (t.untyped_storage().data_ptr(), t.storage_offset(), tuple(t.shape), tuple(t.stride()), t.dtype)


class LocalModel:
    """A model as this process holds it: ``{key: LocalTensor}`` for the canonical keys, tied names as aliases.

    A :class:`~ram_live.sources.TensorSource` of the local tensors (shape = the local box), so a local model can be
    the base or an agent of a merge.
    """

    def __init__(self, tensors: dict[str, LocalTensor], aliases: dict[str, str], keys: list[str],
                 name: str = "local", distributed: bool = False) -> None:
        self.name = name
        self.tensors = tensors
        self._aliases = aliases
        self._keys = keys
        self.distributed = distributed  # made from DTensors: each rank holds (and merges) its own part

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
            from .sources import as_source

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
            _dtype_name(local.dtype, key)
            if clone:
                local = local.clone(memory_format=torch.contiguous_format)
            tensors[key] = LocalTensor(local, global_shape, offsets, owner, key in buffers)
        return cls(tensors, aliases, list(state), name, distributed)

    def clone(self, name: str | None = None) -> LocalModel:
        tensors = {
            k: LocalTensor(v.tensor.clone(memory_format=torch.contiguous_format), v.global_shape, v.offsets,
                           v.owner, v.is_buffer)
            for k, v in self.tensors.items()
        }
        return LocalModel(tensors, dict(self._aliases), list(self._keys), name or self.name, self.distributed)

    def renamed(self, name: str) -> LocalModel:
        return LocalModel(self.tensors, self._aliases, self._keys, name, self.distributed)

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
                key=(missing or extra or [None])[0], agent=who,
            )
        for key, mine in self.tensors.items():
            theirs = other.tensors.get(key)
            if theirs is None:
                raise InputMismatchError(f"{who}: {key!r} is tied differently than in the base", key=key, agent=who)
            if mine.global_shape != theirs.global_shape or mine.box != theirs.box:
                raise InputMismatchError(
                    f"{who}: tensor {key!r} has shape {list(mine.global_shape)} (local box {mine.box}), the base "
                    f"{list(theirs.global_shape)} (local box {theirs.box})", key=key, agent=who,
                )
            if mine.tensor.dtype != theirs.tensor.dtype:
                raise InputMismatchError(
                    f"{who}: tensor {key!r} has dtype {mine.tensor.dtype}, the base {theirs.tensor.dtype} (snapshots "
                    "store bits: train in the base's dtype, or give a base of the model's dtype)", key=key, agent=who,
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


def _spec(shape: tuple[int, ...], dtype: torch.dtype, device: torch.device, is_buffer: bool,
          counted: bool = True) -> TensorSpec:
    """A TensorSpec; ``counted`` (whether this rank's box counts in global statistics) where the core has it."""
    if "counted" in getattr(TensorSpec, "__dataclass_fields__", {}):
        return TensorSpec(shape, dtype, device, is_buffer, counted)  # type: ignore[call-arg]
    return TensorSpec(shape, dtype, device, is_buffer)


# ----------------------------------------------------------------------------------------------- fingerprint

_M32 = 0xFFFFFFFF
_K_INDEX = 0x7FEB352D  # odd multipliers < 2^31: products of 32-bit values stay below 2^63 (no int64 overflow)
_K_HIGH = 0x2C1B3C6D
_K_VALUE = 0x6A09E667
_K_WIDE = 0x3C6EF372 | 1
_K_LANE2 = 0x5BE0CD19
_HASH_CHUNK = 1 << 18


def _box_hash(t: Tensor, offsets: Sequence[int], global_shape: Sequence[int]) -> tuple[int, int]:
    """Two sums over the elements of a box of a tensor of a hash of (global flat index, bits), mod 2^64.

    The sums of the boxes of any partition of a tensor add up to the sums of the whole tensor, so a fingerprint
    is the same whatever the sharding. On the tensor's device, in chunks of rows; about 17 integer operations
    per element.
    """
    s1 = s2 = 0
    n = t.numel()
    if n == 0:
        return 0, 0
    device = t.device
    dims = len(global_shape)
    strides = [1] * dims
    for d in range(dims - 2, -1, -1):
        strides[d] = strides[d + 1] * global_shape[d + 1]
    shape = tuple(t.shape)
    rows = shape[0] if dims else 1
    row_numel = max(1, n // max(rows, 1))
    rows_per_chunk = max(1, _HASH_CHUNK // row_numel)
    # global flat index of the box's element (0, i1, i2, ...) minus that of (0, 0, ...): broadcast sum
    inner = torch.zeros((), dtype=torch.int64, device=device)
    for d in range(1, dims):
        view = [1] * (dims - 1)
        view[d - 1] = shape[d]
        inner = inner + ((torch.arange(shape[d], device=device, dtype=torch.int64) + offsets[d]) * strides[d]).view(view)
    inner = inner.reshape(-1)
    wide = t.element_size() == 8
    flat = t.reshape(rows, -1) if dims else t.reshape(1, 1)
    np = _numpy() if device.type == "cpu" and t.dtype != torch.bool else None
    if np is not None:  # the same integers with numpy (single-threaded: no thread hand-offs on a busy CPU)
        return _box_hash_numpy(np, _bits(flat).numpy(), inner.numpy(), offsets, strides, rows, rows_per_chunk, wide)
    for r0 in range(0, rows, rows_per_chunk):
        r1 = min(rows, r0 + rows_per_chunk)
        if dims:
            row_idx = (torch.arange(r0, r1, device=device, dtype=torch.int64) + offsets[0]) * strides[0]
            g = (row_idx.view(-1, 1) + inner.view(1, -1)).reshape(-1)
        else:
            g = torch.zeros(1, dtype=torch.int64, device=device)
        if int(g[-1]) > _M32:  # huge tensors: hash the high half of the index too (0 elsewhere: same result)
            a = (g & _M32).mul_(_K_INDEX).bitwise_xor_((g >> 32).mul_(_K_HIGH))
        else:
            a = g.mul_(_K_INDEX)
        a.bitwise_xor_(a >> 29).bitwise_and_(_M32)
        bits = _bits(flat[r0:r1].reshape(-1)).to(torch.int64)
        x = a.bitwise_xor_(bits & _M32).mul_(_K_VALUE)
        x.bitwise_xor_(x >> 32).bitwise_and_(_M32)
        if wide:
            x.bitwise_xor_((bits >> 32) & _M32).mul_(_K_WIDE)
            x.bitwise_xor_(x >> 32).bitwise_and_(_M32)
        s1 += int(x.sum())
        s2 += int(x.mul_(_K_LANE2).bitwise_right_shift_(15).bitwise_and_(_M32).sum())
    return s1 % (1 << 64), s2 % (1 << 64)


def _box_hash_numpy(np: Any, flat: Any, inner: Any, offsets: Sequence[int], strides: Sequence[int], rows: int,
                    rows_per_chunk: int, wide: bool) -> tuple[int, int]:
    """:func:`_box_hash` on a CPU array of the tensor's bits, ``[rows, row]`` (same operations, same result)."""
    s1 = s2 = 0
    dims = len(strides)
    for r0 in range(0, rows, rows_per_chunk):
        r1 = min(rows, r0 + rows_per_chunk)
        if dims:
            row_idx = (np.arange(r0, r1, dtype=np.int64) + offsets[0]) * strides[0]
            g = (row_idx.reshape(-1, 1) + inner.reshape(1, -1)).reshape(-1)
        else:
            g = np.zeros(1, dtype=np.int64)
        if int(g[-1]) > _M32:
            a = ((g & _M32) * _K_INDEX) ^ ((g >> 32) * _K_HIGH)
        else:
            a = g * _K_INDEX
        a ^= a >> 29
        a &= _M32
        bits = flat[r0:r1].reshape(-1).astype(np.int64)
        a ^= bits & _M32
        a *= _K_VALUE
        a ^= a >> 32
        a &= _M32
        if wide:
            a ^= (bits >> 32) & _M32
            a *= _K_WIDE
            a ^= a >> 32
            a &= _M32
        s1 += int(a.sum())
        a *= _K_LANE2
        a >>= 15
        a &= _M32
        s2 += int(a.sum())
    return s1 % (1 << 64), s2 % (1 << 64)


def fingerprint(model: Any, collective: Collective | None = None) -> str:
    """A content fingerprint of a model (any input :meth:`LocalModel.from_obj` takes), independent of how it is
    sharded: keys, dtypes, shapes, tied names and every element's bits. With DTensors every rank calls it
    (``collective`` combines the ranks' owned boxes)."""
    local = model if isinstance(model, LocalModel) else LocalModel.from_obj(model)
    collective = collective or LocalCollective()
    keys = sorted(local.tensors)
    partial: list[int] = []
    for key in keys:
        t = local.tensors[key]
        h = _box_hash(t.tensor, t.offsets, t.global_shape) if t.owner else (0, 0)
        partial.extend(x - (1 << 64) if x >= (1 << 63) else x for x in h)
    if collective.world_size > 1:
        gathered = collective.all_gather_int64(partial)
        totals = [sum(col) % (1 << 64) for col in zip(*gathered)]
    else:
        totals = [x % (1 << 64) for x in partial]
    desc = [
        [key, _dtype_name(local.tensors[key].tensor.dtype, key), list(local.tensors[key].global_shape),
         f"{totals[2 * i]:016x}{totals[2 * i + 1]:016x}"]
        for i, key in enumerate(keys)
    ]
    payload = json.dumps({"tensors": desc, "aliases": sorted(local.aliases().items())}, separators=(",", ":"))
    return "rlfp1-" + hashlib.sha256(payload.encode()).hexdigest()[:40]


# ----------------------------------------------------------------------------------------------- encoding


def pack_bits(mask: Tensor) -> Tensor:
    """bool ``[n]`` → uint8 ``[ceil(n/8)]``; element ``8b + j`` is bit ``j`` of byte ``b`` (numpy ``bitorder="little"``).
    On the mask's device."""
    n = mask.numel()
    m = mask.reshape(-1).view(torch.uint8)
    pad = (-n) % 8
    if pad:
        m = torch.cat([m, m.new_zeros(pad)])
    elif m.storage_offset() % 8:
        m = m.clone()
    # each byte is 0 or 1: one multiply gathers the 8 bits of a word into its top byte (no carries; mod 2^64)
    return ((m.view(torch.int64) * 0x0102040810204080) >> 56).to(torch.uint8)


def unpack_bits(packed: Tensor, n: int) -> Tensor:
    """Inverse of :func:`pack_bits`: uint8 ``[ceil(n/8)]`` → bool ``[n]``."""
    shifts = torch.arange(8, dtype=torch.uint8, device=packed.device)
    return ((packed.view(-1, 1) >> shifts) & 1).view(-1)[:n].to(torch.bool)


@dataclass
class _Encoded:
    encoding: str  # "none" | "indices" | "bitmask" | "dense"
    count: int
    values: Tensor | None = None
    positions: Tensor | None = None


def _changed_mask(cur: Tensor, base: Tensor, activity: Activity) -> Tensor:
    if activity.rule == "changed":
        return _bits(cur) != _bits(base)
    # lossy: keep |τ| > eps (and every non-finite value); computed in float32 (float64 for float64), in chunks
    out = torch.empty(cur.shape, dtype=torch.bool, device=cur.device)
    wide = torch.float64 if cur.dtype == torch.float64 else torch.float32
    step = 1 << 22
    for s in range(0, cur.numel(), step):
        d = cur[s : s + step].to(wide) - base[s : s + step].to(wide)
        torch.logical_not(d.abs_() <= activity.eps, out=out[s : s + step])
    return out


_NUMPY: Any = False  # numpy module once looked up (None when not installed)
_CPU_CHUNK = 1 << 18  # elements per step of the CPU path (a multiple of 8: bitmask bytes line up)


def _numpy() -> Any:
    """numpy if installed (optional: the CPU path's selection is ~10x faster than torch's masked_select)."""
    global _NUMPY
    if _NUMPY is False:
        try:
            import numpy
        except ImportError:  # pragma: no cover - numpy ships with nearly every torch install
            numpy = None
        _NUMPY = numpy
    return _NUMPY


def _choose(n: int, count: int, size: int) -> str:
    if count == 0:
        return "none"
    index_size = 4 if n < 2**31 else 8
    costs = {"indices": count * (index_size + size), "bitmask": (n + 7) // 8 + count * size, "dense": n * size}
    return min(costs, key=lambda k: (costs[k], k != "dense"))


def _encode(cur: Tensor, base: Tensor, activity: Activity, to_cpu: bool = True, split: bool = True) -> _Encoded:
    """The changed values of ``cur`` against ``base`` (flat, same dtype), selected on their device. ``split``:
    the CPU paths may spread one tensor over threads."""
    n = cur.numel()
    if n == 0:
        return _Encoded("none", 0)
    np = _numpy() if cur.device.type == "cpu" and activity.rule == "changed" else None
    if np is not None and cur.is_contiguous() and base.is_contiguous() and cur.dtype != torch.bool:
        if _native_path(cur, base, activity):
            return _encode_native(np, _native(), cur, base, split)
        return _encode_numpy(np, cur, base)
    changed = _changed_mask(cur, base, activity)
    count = int(torch.count_nonzero(changed))
    encoding = _choose(n, count, cur.element_size())
    if encoding == "none":
        return _Encoded("none", 0)
    if encoding == "dense":
        values = cur.clone() if (cur.device.type == "cpu" or not to_cpu) else cur
        positions = None
    elif encoding == "indices":
        idx = changed.nonzero().view(-1)
        values = cur[idx]
        positions = idx.to(torch.int32 if n < 2**31 else torch.int64)
    else:
        values = cur[changed]
        positions = pack_bits(changed)
    if to_cpu:
        values = values.cpu()
        positions = positions.cpu() if positions is not None else None
    return _Encoded(encoding, count, values, positions)


_POOL: Any = None


def _pool() -> Any:
    global _POOL
    if _POOL is None:
        from concurrent.futures import ThreadPoolExecutor

        _POOL = ThreadPoolExecutor(max_workers=8, thread_name_prefix="ram_live_store")
    return _POOL


def _scan(np: Any, cn: Any, bn: Any, start: int, end: int) -> tuple[Any, int, list[tuple[str, Any]]]:
    """Compare ``cn`` and ``bn`` over [start, end) in cache-sized steps. Returns the changed values (in order),
    their count, and per step its positions: ``("idx", indices)`` for sparse steps (changed in < 1/32),
    ``("bits", packed bitmask)`` for the others."""
    out = np.empty(end - start, dtype=cn.dtype)  # only the part written is ever touched
    mask = np.empty(min(end - start, _CPU_CHUNK), dtype=np.bool_)
    count = 0
    steps: list[tuple[str, Any]] = []
    for s in range(start, end, _CPU_CHUNK):
        e = min(end, s + _CPU_CHUNK)
        m = mask[: e - s]
        np.not_equal(cn[s:e], bn[s:e], out=m)
        c = int(np.count_nonzero(m))
        if 32 * c < e - s:
            idx = np.flatnonzero(m)
            np.take(cn[s:e], idx, out=out[count : count + c])
            steps.append(("idx", idx))
        else:
            if c == e - s:
                out[count : count + c] = cn[s:e]
            else:
                np.compress(m, cn[s:e], out=out[count : count + c])
            steps.append(("bits", np.packbits(m, bitorder="little")))
        count += c
    return out, count, steps


def _encode_numpy(np: Any, cur: Tensor, base: Tensor) -> _Encoded:
    """The CPU path: compare, count and select in cache-sized steps, over a few threads (numpy releases the
    GIL), then the encoding: indices or bitmask assembled from the steps' own positions."""
    cn = _bits(cur).reshape(-1).numpy()
    bn = _bits(base).reshape(-1).numpy()
    n = cn.size
    n_steps = (n + _CPU_CHUNK - 1) // _CPU_CHUNK
    workers = max(1, min(torch.get_num_threads(), 8, n_steps // 2))
    if workers == 1:
        parts = [_scan(np, cn, bn, 0, n)]
    else:
        per = (n_steps + workers - 1) // workers * _CPU_CHUNK
        futures = [_pool().submit(_scan, np, cn, bn, s, min(n, s + per)) for s in range(0, n, per)]
        parts = [f.result() for f in futures]
    count = sum(p[1] for p in parts)
    encoding = _choose(n, count, cn.itemsize)
    if encoding == "none":
        return _Encoded("none", 0)
    if encoding == "dense" and count < n:
        return _Encoded("dense", count, cur.reshape(-1).clone())
    values_np = parts[0][0][:count] if len(parts) == 1 else np.concatenate([o[:c] for o, c, _ in parts])
    values = torch.from_numpy(values_np).view(cur.dtype)
    if encoding == "dense":
        return _Encoded("dense", count, values)
    steps = [step for _, _, part in parts for step in part]
    if encoding == "bitmask":
        packed = np.empty((n + 7) // 8, dtype=np.uint8)
        for i, (kind, data) in enumerate(steps):
            s = i * _CPU_CHUNK
            e = min(n, s + _CPU_CHUNK)
            if kind == "idx":
                m = np.zeros(e - s, dtype=np.bool_)
                m[data] = True
                data = np.packbits(m, bitorder="little")
            packed[s // 8 : (e + 7) // 8] = data
        return _Encoded("bitmask", count, values, torch.from_numpy(packed))
    chunks = []
    for i, (kind, data) in enumerate(steps):
        s = i * _CPU_CHUNK
        if kind == "bits":  # a dense step of a sparse tensor
            e = min(n, s + _CPU_CHUNK)
            data = np.flatnonzero(np.unpackbits(data, count=e - s, bitorder="little").view(np.bool_))
        chunks.append(data + s if s else data)
    index_dtype = np.int32 if n < 2**31 else np.int64
    idx_all = np.concatenate(chunks).astype(index_dtype, copy=False)
    return _Encoded("indices", count, values, torch.from_numpy(idx_all))


def _native() -> Any:
    """The compiled AVX-512 selection kernels (:mod:`ram_live._select`), or None: the numpy path."""
    from ._select import kernels

    return kernels()


def _native_path(cur: Tensor, base: Tensor, activity: Activity) -> bool:
    """Whether :func:`_encode` takes :func:`_encode_native` for this pair."""
    return (cur.device.type == "cpu" and activity.rule == "changed" and cur.dtype != torch.bool
            and cur.element_size() in (2, 4) and 0 < cur.numel() < 2**31 and cur.is_contiguous()
            and base.is_contiguous() and _numpy() is not None and _native() is not None)


def _encode_many(pairs: Sequence[tuple[Tensor, Tensor]], activity: Activity) -> list[_Encoded]:
    """:func:`_encode` of every pair. Pairs on the native CPU path run side by side, one thread per pair (no
    ranges to move together afterwards), balanced over the threads largest first; a pair bigger than a thread's
    share, a small one, and every other pair, is encoded alone (spread over the threads where its path does)."""
    workers = max(1, min(torch.get_num_threads(), 8))
    total = sum(cur.numel() for cur, _ in pairs)
    side = [i for i, (cur, base) in enumerate(pairs)  # small pairs: a thread costs more than it gives
            if workers > 1 and _NATIVE_MIN_SPLIT <= cur.numel() <= total // workers
            and _native_path(cur, base, activity)]
    out: list[_Encoded | None] = [None] * len(pairs)
    chosen = set(side)
    for i, (cur, base) in enumerate(pairs):
        if i not in chosen:
            out[i] = _encode(cur, base, activity)
    queues: list[list[int]] = [[] for _ in range(workers)]
    loads = [0] * workers
    for i in sorted(side, key=lambda i: -pairs[i][0].numel()):
        w = loads.index(min(loads))
        queues[w].append(i)
        loads[w] += pairs[i][0].numel()

    def run(queue: list[int]) -> None:
        for i in queue:
            out[i] = _encode(*pairs[i], activity, split=False)

    for _ in _pool().map(run, [q for q in queues if q]):
        pass
    return [enc for enc in out if enc is not None]


_NATIVE_MIN_SPLIT = 1 << 20  # entries: tensors at least this big are split over threads


def _ranges(n: int, workers: int, align: int) -> list[tuple[int, int]]:
    """[0, n) in ``workers`` nearly equal ranges starting at multiples of ``align`` (whole bitmask bytes)."""
    per = -(-n // workers // align) * align
    return [(s, min(n, s + per)) for s in range(0, n, per)] if per else [(0, n)]


def _encode_native(np: Any, native: Any, cur: Tensor, base: Tensor, split: bool = True) -> _Encoded:
    """The CPU path with :mod:`ram_live._select`'s kernels: one pass per range of the tensor (ranges over
    threads) writes the bitmask, the changed values and (while they may still be the smaller encoding) the int32
    indices, each range at its own offset; the ranges' values and indices are then moved together."""
    from ._select import ALIGN

    cn = _bits(cur).reshape(-1).numpy()
    bn = _bits(base).reshape(-1).numpy()
    n, size = cn.size, cn.itemsize
    # int32 indices are the smaller encoding iff 4 * count <= ceil(n / 8) (see _choose; n < 2^31 here): while
    # they may be, a range writes them
    cap = (n + 7) // 8 // 4
    workers = max(1, min(torch.get_num_threads(), 8, n // _NATIVE_MIN_SPLIT)) if split else 1
    ranges = _ranges(n, workers, ALIGN)
    bits = np.empty((n + 7) // 8, dtype=np.uint8)
    vals = np.empty(n, dtype=cn.dtype)  # only the part written is ever touched
    for fresh in (bits, vals):  # first-touch faults of fresh output cost as much as the pass itself here
        advise_hugepages(torch.from_numpy(fresh))
    idx = np.empty(len(ranges) * (cap + 32), dtype=np.int32)
    a, b, pb, pv, pi = cn.ctypes.data, bn.ctypes.data, bits.ctypes.data, vals.ctypes.data, idx.ctypes.data

    def run(r: int) -> int:
        s, e = ranges[r]
        return native.select(a + s * size, b + s * size, e - s, pb + s // 8, pv + s * size, size,
                             pi + 4 * r * (cap + 32), cap, s)

    counts = [run(0)] if len(ranges) == 1 else list(_pool().map(run, range(len(ranges))))
    count = sum(counts)
    encoding = _choose(n, count, size)
    if encoding == "none":
        return _Encoded("none", 0)
    if encoding == "dense" and count < n:
        return _Encoded("dense", count, cur.reshape(-1).clone())
    done = counts[0]
    for r in range(1, len(ranges)):  # move each range's values (and indices) after the previous ones
        c, s = counts[r], ranges[r][0]
        ctypes.memmove(pv + done * size, pv + s * size, c * size)
        if encoding == "indices":
            ctypes.memmove(pi + 4 * done, pi + 4 * r * (cap + 32), 4 * c)
        done += c
    values = torch.from_numpy(vals[:count]).view(cur.dtype)
    if encoding == "dense":
        return _Encoded("dense", count, values)
    if encoding == "bitmask":
        return _Encoded("bitmask", count, values, torch.from_numpy(bits))
    return _Encoded("indices", count, values, torch.from_numpy(idx[:count]))


def _apply(flat: Tensor, encoding: str, values: Tensor | None, positions: Tensor | None) -> Tensor:
    """Write a piece's changed values into ``flat`` (the base's values of that piece, flat), in place."""
    if encoding == "none":
        return flat
    assert values is not None
    values = values.to(flat.device)
    if encoding == "dense":
        return flat.copy_(values)
    assert positions is not None
    positions = positions.to(flat.device)
    np = _numpy() if flat.device.type == "cpu" and flat.dtype != torch.bool and flat.is_contiguous() else None
    if np is not None:  # CPU: numpy's scatter is several times faster than masked_scatter_
        fn = _bits(flat).numpy()
        vn = _bits(values.contiguous()).numpy()
        if encoding == "indices":
            fn[positions.numpy()] = vn
        elif encoding == "bitmask":
            pn = positions.numpy()
            done = 0
            for s in range(0, fn.size, _CPU_CHUNK):
                e = min(fn.size, s + _CPU_CHUNK)
                bits = np.unpackbits(pn[s // 8 : (e + 7) // 8], count=e - s, bitorder="little").view(np.bool_)
                idx = np.flatnonzero(bits)
                fn[s:e][idx] = vn[done : done + idx.size]
                done += idx.size
        else:
            raise CorruptSnapshotError(f"unknown encoding {encoding!r}")
        return flat
    if encoding == "indices":
        flat[positions.to(torch.int64)] = values
    elif encoding == "bitmask":
        flat.masked_scatter_(unpack_bits(positions, flat.numel()), values)
    else:
        raise CorruptSnapshotError(f"unknown encoding {encoding!r}")
    return flat


# ----------------------------------------------------------------------------------------------- files


def _fsync_dir(path: Path) -> None:
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:  # pragma: no cover - platforms without directory fds
        return
    try:
        os.fsync(fd)
    except OSError:  # pragma: no cover
        pass
    finally:
        os.close(fd)


def _tmp_name(final: Path) -> Path:
    return final.parent / f".tmp-{uuid.uuid4().hex[:12]}-{final.name}"


def _write_safetensors(path: Path, tensors: dict[str, Tensor], metadata: dict[str, str], durable: bool) -> int:
    from safetensors.torch import save_file

    tmp = _tmp_name(path)
    try:
        save_file({k: v.contiguous() for k, v in tensors.items()}, str(tmp), metadata=metadata)
        if durable:
            with open(tmp, "rb+") as fh:
                os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    return path.stat().st_size


def _write_json(path: Path, obj: Any, durable: bool, exclusive: bool = False) -> bool:
    """Write JSON to a temporary name, then rename it into place (``exclusive``: only if ``path`` does not exist;
    returns False when it did)."""
    tmp = _tmp_name(path)
    data = json.dumps(obj, indent=1, allow_nan=False).encode()
    try:
        with open(tmp, "wb") as fh:
            fh.write(data)
            fh.flush()
            if durable:
                os.fsync(fh.fileno())
        if exclusive:
            try:
                os.link(tmp, path)
            except FileExistsError:
                return False
            finally:
                tmp.unlink(missing_ok=True)
        else:
            os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    if durable:
        _fsync_dir(path.parent)
    return True


def _read_json(path: Path) -> Any:
    try:
        with open(path, "rb") as fh:
            return json.loads(fh.read())
    except FileNotFoundError:
        raise SnapshotNotFoundError(f"{path}: no such manifest (pruned?)") from None
    except json.JSONDecodeError as exc:  # never for files this module wrote (renamed in place whole)
        raise CorruptSnapshotError(f"{path}: unreadable manifest ({exc})") from None


def _intersect(a: Box, b: Box) -> tuple[list[slice], list[slice]] | None:
    """Slices of box ``a`` and of box ``b`` (each relative to itself) that cover their intersection."""
    sa, sb = [], []
    for (oa, na), (ob, nb) in zip(zip(*a), zip(*b)):
        lo, hi = max(oa, ob), min(oa + na, ob + nb)
        if hi <= lo:
            return None
        sa.append(slice(lo - oa, hi - oa))
        sb.append(slice(lo - ob, hi - ob))
    return sa, sb


def _box(piece: Mapping[str, Any]) -> Box:
    return tuple(piece["offsets"]), tuple(piece["shape"])


# ----------------------------------------------------------------------------------------------- reading


class _Files:
    """Open safetensors handles of one manifest's files (memory-mapped; survive a later unlink)."""

    def __init__(self, folder: Path, files: Sequence[Mapping[str, Any]], device: torch.device) -> None:
        from safetensors import safe_open

        self.handles = []
        for f in files:
            path = folder / f["name"]
            try:
                size = path.stat().st_size
                handle = safe_open(str(path), framework="pt", device="cpu")
            except FileNotFoundError:
                raise SnapshotNotFoundError(f"{path}: data file missing (snapshot pruned while opening?)") from None
            if size != f["bytes"]:
                raise CorruptSnapshotError(f"{path}: {size} bytes, the manifest says {f['bytes']}")
            self.handles.append(handle)
        self.device = device

    def tensor(self, file: int, name: str | None) -> Tensor | None:
        return None if name is None else self.handles[file].get_tensor(name)

    def slice(self, file: int, name: str, slices: Sequence[slice]) -> Tensor:
        return self.handles[file].get_slice(name)[tuple(slices)]


class StoreBase:
    """The store's base model as a :class:`TensorSource` (dense; assembled from pieces), with its ``fingerprint``."""

    def __init__(self, folder: Path, manifest: Mapping[str, Any], device: torch.device | str = "cpu") -> None:
        self.name = "base"
        self.folder = folder
        self.manifest = manifest
        self.fingerprint: str = manifest["fingerprint"]
        self.device = torch.device(device)
        self._tensors: dict[str, Any] = manifest["tensors"]
        self._aliases: dict[str, str] = manifest.get("aliases", {})
        self._keys: list[str] = manifest.get("keys") or list(self._tensors) + list(self._aliases)
        self._files = _Files(folder, manifest["files"], self.device)

    def keys(self) -> list[str]:
        return list(self._keys)

    def spec(self, key: str) -> TensorSpec:
        e = self._tensors[self._aliases.get(key, key)]
        return TensorSpec(tuple(e["shape"]), _dtype(e["dtype"]), self.device, bool(e.get("buffer")))

    def aliases(self) -> dict[str, str]:
        return dict(self._aliases)

    def get(self, key: str) -> Tensor:
        key = self._aliases.get(key, key)
        shape = tuple(self._tensors[key]["shape"])
        return self.get_box(key, (0,) * len(shape), shape, copy=False).to(self.device)

    def get_box(self, key: str, offsets: Sequence[int], shape: Sequence[int], copy: bool = True) -> Tensor:
        """The box ``offsets`` + ``shape`` of the base's tensor ``key`` on the CPU: a new tensor, or with
        ``copy=False`` possibly a view of the memory-mapped file (never to be written)."""
        key = self._aliases.get(key, key)
        entry = self._tensors[key]
        want: Box = (tuple(offsets), tuple(shape))
        pieces = entry["pieces"]
        for p in pieces:
            if _box(p) == want:
                t = self._files.tensor(p["file"], p["values"])
                assert t is not None
                return t.clone() if copy else t
        out = torch.empty(want[1], dtype=_dtype(entry["dtype"]))
        covered = 0
        for p in pieces:
            inter = _intersect(want, _box(p))
            if inter is None:
                continue
            mine, theirs = inter
            part = self._files.slice(p["file"], p["values"], theirs)
            out[tuple(mine)] = part
            covered += part.numel()
        if covered != out.numel():
            raise CorruptSnapshotError(f"base tensor {key!r}: its pieces do not cover the box {want}")
        return out


class Snapshot:
    """One agent's snapshot, read lazily: a :class:`TensorSource` whose ``get`` returns base + changes, bit-exact
    in the stored dtype, and whose ``base_source()`` is the store's base."""

    def __init__(self, store: SnapshotStore, agent: str, step: int, manifest: Mapping[str, Any],
                 device: torch.device | str = "cpu", name: str | None = None) -> None:
        self.store = store
        self.agent = agent
        self.step = step
        self.name = name or agent
        self.manifest = manifest
        self.device = torch.device(device)
        self._tensors: dict[str, Any] = manifest["tensors"]
        self._aliases: dict[str, str] = manifest.get("aliases", {})
        self._keys: list[str] = manifest.get("keys") or list(self._tensors) + list(self._aliases)
        self._base = store.base_source(device)
        if manifest["base_fingerprint"] != self._base.fingerprint:
            raise BaseMismatchError(
                f"snapshot {agent!r} step {step} was taken against base {manifest['base_fingerprint']}, but the store's "
                f"base is {self._base.fingerprint}"
            )
        self._files = _Files(store.root / agent, manifest["files"], self.device)

    def __repr__(self) -> str:
        return (f"Snapshot(agent={self.agent!r}, step={self.step}, changed={self.changed:,}/{self.numel:,}, "
                f"bytes={self.bytes:,})")

    # -- facts
    @property
    def numel(self) -> int:
        return int(self.manifest["stats"]["numel"])

    @property
    def changed(self) -> int:
        return int(self.manifest["stats"]["changed"])

    @property
    def density(self) -> float:
        return self.changed / self.numel if self.numel else 0.0

    @property
    def bytes(self) -> int:
        """Bytes of this snapshot's data files on disk."""
        return sum(int(f["bytes"]) for f in self.manifest["files"])

    @property
    def dense_bytes(self) -> int:
        """Bytes of a dense copy of the model in its dtypes."""
        return int(self.manifest["stats"]["dense_bytes"])

    @property
    def lossless(self) -> bool:
        return self.manifest["activity"]["rule"] == "changed"

    @property
    def fingerprint(self) -> str:
        return self._base.fingerprint

    def base_source(self) -> StoreBase:
        return self._base

    # -- TensorSource
    def keys(self) -> list[str]:
        return list(self._keys)

    def spec(self, key: str) -> TensorSpec:
        e = self._tensors[self._aliases.get(key, key)]
        return TensorSpec(tuple(e["shape"]), _dtype(e["dtype"]), self.device, bool(e.get("buffer")))

    def aliases(self) -> dict[str, str]:
        return dict(self._aliases)

    def get(self, key: str) -> Tensor:
        """The agent's tensor ``key``, bit-exact (a new tensor, or a read-only view of the file when every value
        of it is stored: never to be written)."""
        key = self._aliases.get(key, key)
        shape = tuple(self._tensors[key]["shape"])
        return self.get_box(key, (0,) * len(shape), shape)

    def get_box(self, key: str, offsets: Sequence[int], shape: Sequence[int]) -> Tensor:
        """The box ``offsets`` + ``shape`` of the agent's tensor ``key`` (base + this snapshot's changes)."""
        key = self._aliases.get(key, key)
        want: Box = (tuple(offsets), tuple(shape))
        pieces = self._tensors[key]["pieces"]
        if len(pieces) == 1 and pieces[0]["encoding"] == "dense" and _box(pieces[0]) == want:
            values = self._files.tensor(pieces[0]["file"], pieces[0]["values"])  # every value is stored
            assert values is not None
            return values.view(want[1]).to(self.device)
        out = self._base.get_box(key, *want)
        for p in pieces:
            if p["encoding"] == "none":
                continue
            inter = _intersect(want, _box(p))
            if inter is None:
                continue
            values = self._files.tensor(p["file"], p["values"])
            positions = self._files.tensor(p["file"], p.get("positions"))
            if _box(p) == want:
                _apply(out.view(-1), p["encoding"], values, positions)
            else:
                piece = self._base.get_box(key, *_box(p))
                _apply(piece.view(-1), p["encoding"], values, positions)
                mine, theirs = inter
                out[tuple(mine)] = piece[tuple(theirs)]
        return out.to(self.device)

    def restrict(self, boxes: Mapping[str, Box], name: str | None = None) -> BoxSource:
        """This snapshot seen through ``boxes`` (key → (offsets, shape)): a source of local shards."""
        return BoxSource(self, boxes, name or self.name)

    def to_state_dict(self) -> dict[str, Tensor]:
        """Every tensor, reconstructed (tied names share one tensor)."""
        out: dict[str, Tensor] = {}
        for key in self._keys:
            canonical = self._aliases.get(key, key)
            out[key] = out[canonical] if canonical in out else self.get(canonical)
        return out


class BoxSource:
    """A source that returns one box per key of an underlying source with ``get_box`` (a local shard)."""

    def __init__(self, source: Any, boxes: Mapping[str, Box], name: str) -> None:
        self.source = source
        self.boxes = dict(boxes)
        self.name = name
        fp = getattr(source, "fingerprint", None)
        layout = hashlib.sha256(json.dumps(sorted(self.boxes.items())).encode()).hexdigest()[:16]
        self.fingerprint = f"{fp}:{layout}" if fp is not None else None

    def keys(self) -> list[str]:
        return self.source.keys()

    def spec(self, key: str) -> TensorSpec:
        s = self.source.spec(key)
        canonical = self.source.aliases().get(key, key)
        return TensorSpec(tuple(self.boxes[canonical][1]), s.dtype, s.device, s.is_buffer)

    def get(self, key: str) -> Tensor:
        canonical = self.source.aliases().get(key, key)
        return self.source.get_box(canonical, *self.boxes[canonical])

    def aliases(self) -> dict[str, str]:
        return self.source.aliases()

    def base_source(self) -> Any:
        base = self.source.base_source()
        return BoxSource(base, self.boxes, "base")


@dataclass(frozen=True)
class SnapshotInfo:
    """A snapshot as listed (its manifest is read on :meth:`open` / :attr:`manifest`)."""

    store: SnapshotStore = field(repr=False)
    agent: str
    step: int

    @property
    def path(self) -> Path:
        return self.store.root / self.agent / f"{self.step:012d}.json"

    @property
    def manifest(self) -> dict[str, Any]:
        return _read_json(self.path)

    def open(self, device: torch.device | str = "cpu") -> Snapshot:
        return self.store.open(self.agent, self.step, device=device)


# ----------------------------------------------------------------------------------------------- the store


class SnapshotStore:
    """A folder of task-vector snapshots of several agents trained from one base.

    Any number of processes may write (one writer per agent, or one per rank of a sharded agent) and read at
    the same time; readers see only complete snapshots. ``durable=True`` fsyncs data files before their manifest
    (survives power loss, not only killed processes).
    """

    def __init__(self, root: str | os.PathLike[str], *, create: bool = True, durable: bool = True) -> None:
        self.root = Path(root)
        self.durable = durable
        self._base_cache: dict[tuple[str, str], StoreBase] = {}
        marker = self.root / "store.json"
        if not marker.exists():
            if not create:
                raise SnapshotNotFoundError(f"{self.root}: not a snapshot store (no store.json)")
            self.root.mkdir(parents=True, exist_ok=True)
            _write_json(marker, {"format": STORE_FORMAT, "version": VERSION}, durable=False, exclusive=True)
        info = _read_json(marker)
        if info.get("format") != STORE_FORMAT:
            raise CorruptSnapshotError(f"{marker}: not a ram_live snapshot store")
        if int(info.get("version", 0)) > VERSION:
            raise StoreError(f"{self.root}: store format version {info['version']} is newer than this ram_live's")

    def __repr__(self) -> str:
        return f"SnapshotStore({str(self.root)!r})"

    # -- base

    @property
    def base_path(self) -> Path:
        return self.root / BASE_DIR / "base.json"

    def has_base(self) -> bool:
        return self.base_path.exists()

    @property
    def base_fingerprint(self) -> str | None:
        if not self.has_base():
            return None
        return _read_json(self.base_path)["fingerprint"]

    def base_source(self, device: torch.device | str = "cpu") -> StoreBase:
        """The base every snapshot of this store is a diff against (raises if none was set)."""
        if not self.has_base():
            raise SnapshotNotFoundError(f"{self.root}: the store has no base yet (a writer sets it)")
        manifest = _read_json(self.base_path)
        cache_key = (manifest["fingerprint"], str(torch.device(device)))
        if cache_key not in self._base_cache:
            self._base_cache[cache_key] = StoreBase(self.root / BASE_DIR, manifest, device)
        return self._base_cache[cache_key]

    def set_base(self, base: Any, *, collective: Collective | None = None, writer: bool = True) -> str:
        """Persist ``base`` as the store's base, or check that it equals the one there (:class:`BaseMismatchError`
        otherwise). Returns its fingerprint. All ranks call it; with a sharded base every rank writes its boxes;
        ``writer=False`` on ranks that hold a replica and must not write (DDP ranks > 0)."""
        local = base if isinstance(base, LocalModel) else LocalModel.from_obj(base)
        collective = collective or LocalCollective()
        fp = fingerprint(local, collective)
        existing = collective.broadcast_json(self.base_fingerprint) if collective.world_size > 1 \
            else self.base_fingerprint
        if existing is None:
            folder = self.root / BASE_DIR
            folder.mkdir(parents=True, exist_ok=True)
            nonce = collective.broadcast_json(uuid.uuid4().hex[:12])
            part = None
            if writer:
                tensors = {k: t for k, t in local.tensors.items() if t.owner}
                part = self._write_base_part(folder, nonce, collective.rank, local, tensors)
            parts = self._exchange_parts(folder, f"base-{nonce}", part, collective)
            if collective.rank == 0:
                manifest = self._compose(parts, local, extra={"format": BASE_FORMAT, "version": VERSION,
                                                              "fingerprint": fp, "time": time.time()})
                won = _write_json(self.base_path, manifest, self.durable, exclusive=True)
                if not won:  # another writer set it first: keep theirs
                    for f in manifest["files"]:
                        (folder / f["name"]).unlink(missing_ok=True)
            collective.barrier()
            existing = self.base_fingerprint
        if existing != fp:
            raise BaseMismatchError(
                f"{self.root}: the store's base has fingerprint {existing}, this model's base {fp}: the agents of one "
                "store must all be trained from the same base (start a new store, or pass the right base=)"
            )
        return fp

    def _write_base_part(self, folder: Path, nonce: str, rank: int, local: LocalModel,
                         tensors: Mapping[str, LocalTensor]) -> dict[str, Any]:
        name = f"base-{nonce}.p{rank}.safetensors"
        data = {f"{k}@{rank}": t.tensor.detach().cpu() for k, t in tensors.items()}
        size = _write_safetensors(folder / name, data, {"format": BASE_FORMAT}, self.durable)
        pieces = {
            k: [{"offsets": list(t.offsets), "shape": list(t.tensor.shape), "values": f"{k}@{rank}"}]
            for k, t in tensors.items()
        }
        return {"file": {"name": name, "bytes": size}, "pieces": pieces}

    def _exchange_parts(self, folder: Path, stem: str, part: dict[str, Any] | None,
                        collective: Collective) -> list[dict[str, Any]]:
        """Rank 0 learns every rank's part (sidecar JSON files on the shared folder, then a barrier)."""
        if collective.world_size == 1:
            return [part] if part is not None else []
        sidecar = folder / f".{stem}.p{collective.rank}.part.json"
        _write_json(sidecar, part, durable=False)
        collective.barrier()
        parts = []
        if collective.rank == 0:
            for r in range(collective.world_size):
                path = folder / f".{stem}.p{r}.part.json"
                p = _read_json(path)
                if p is not None:
                    parts.append(p)
        collective.barrier()
        sidecar.unlink(missing_ok=True)
        return parts

    @staticmethod
    def _compose(parts: Sequence[Mapping[str, Any]], local: LocalModel, extra: dict[str, Any]) -> dict[str, Any]:
        """One manifest from the parts of every rank: files, and the pieces of every tensor."""
        files: list[dict[str, Any]] = []
        tensors: dict[str, Any] = {
            k: {"shape": list(t.global_shape), "dtype": _dtype_name(t.tensor.dtype, k), "buffer": t.is_buffer,
                "pieces": []}
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
                raise StoreError(f"tensor {key!r}: the ranks' pieces cover {covered} of {math.prod(entry['shape'])} "
                                 "elements (is every rank writing?)")
        return {**extra, "keys": local.keys(), "aliases": local.aliases(), "files": files, "tensors": tensors}

    # -- agents and snapshots

    @staticmethod
    def check_agent(agent: str) -> str:
        if not isinstance(agent, str) or not _AGENT_RE.match(agent):
            raise ConfigError(
                f"agent name {agent!r} is not a valid store name: letters, digits, '.', '_', '-', starting with a "
                "letter or digit, at most 128 characters"
            )
        return agent

    def agents(self) -> list[str]:
        """Agents with at least one snapshot, sorted."""
        if not self.root.exists():
            return []
        return sorted(p.name for p in self.root.iterdir() if p.is_dir() and _AGENT_RE.match(p.name) and self.steps(p.name))

    def steps(self, agent: str) -> list[int]:
        """Steps of ``agent``'s complete snapshots, ascending."""
        folder = self.root / agent
        try:
            names = os.listdir(folder)
        except FileNotFoundError:
            return []
        return sorted(int(m.group(1)) for m in map(_MANIFEST_RE.match, names) if m)

    def list(self, agent: str | None = None) -> list[SnapshotInfo]:
        """Complete snapshots of ``agent`` (or of every agent), by agent then step."""
        agents = [self.check_agent(agent)] if agent is not None else self.agents()
        return [SnapshotInfo(self, a, s) for a in agents for s in self.steps(a)]

    def open(self, agent: str, step: int, *, device: torch.device | str = "cpu") -> Snapshot:
        self.check_agent(agent)
        manifest = _read_json(self.root / agent / f"{step:012d}.json")
        if manifest.get("format") != SNAPSHOT_FORMAT:
            raise CorruptSnapshotError(f"{agent!r} step {step}: not a ram_live snapshot manifest")
        return Snapshot(self, agent, step, manifest, device)

    def latest(self, agent: str, *, device: torch.device | str = "cpu", retries: int = 5) -> Snapshot:
        """``agent``'s newest complete snapshot (:class:`SnapshotNotFoundError` if it has none)."""
        self.check_agent(agent)
        for _ in range(retries + 1):
            steps = self.steps(agent)
            if not steps:
                raise SnapshotNotFoundError(f"{self.root}: agent {agent!r} has no snapshot")
            try:
                return self.open(agent, steps[-1], device=device)
            except SnapshotNotFoundError:  # pruned or replaced between listing and opening: list again
                continue
        raise SnapshotNotFoundError(f"{self.root}: could not open a snapshot of {agent!r} (pruned concurrently)")

    def latest_all(self, agents: Iterable[str] | None = None, *,
                   device: torch.device | str = "cpu") -> dict[str, Snapshot]:
        """Every agent's (or the named agents') newest snapshot, name → :class:`Snapshot`: pass it straight to
        ``ram_merge`` / ``probe``."""
        names = list(agents) if agents is not None else self.agents()
        return {a: self.latest(a, device=device) for a in names}

    def prune(self, keep: int, agent: str | None = None) -> list[SnapshotInfo]:
        """Delete all but the newest ``keep`` snapshots of ``agent`` (or of every agent); returns what went.
        The manifest goes first, so readers never see a snapshot without its files; readers that opened it
        already keep reading (files are memory-mapped)."""
        if keep < 0:
            raise ConfigError(f"keep must be >= 0, got {keep}")
        removed = []
        for a in ([self.check_agent(agent)] if agent else self.agents()):
            steps = self.steps(a)
            for step in steps[: max(0, len(steps) - keep)]:
                self._remove(a, step)
                removed.append(SnapshotInfo(self, a, step))
        return removed

    def _remove(self, agent: str, step: int) -> None:
        path = self.root / agent / f"{step:012d}.json"
        try:
            manifest = _read_json(path)
        except (SnapshotNotFoundError, CorruptSnapshotError):
            manifest = {"files": []}
        path.unlink(missing_ok=True)
        for f in manifest.get("files", []):
            (self.root / agent / f["name"]).unlink(missing_ok=True)

    def gc(self, grace_s: float = 3600.0) -> list[Path]:
        """Delete files no manifest references (left by killed writers) older than ``grace_s`` seconds; a younger
        one may belong to a snapshot being written right now."""
        now = time.time()
        removed = []
        folders = [self.root / BASE_DIR] + [p for p in self.root.iterdir() if p.is_dir() and p.name != BASE_DIR]
        for folder in folders:
            referenced = set()
            for name in os.listdir(folder):
                if _MANIFEST_RE.match(name) or name == "base.json":
                    try:
                        referenced |= {f["name"] for f in _read_json(folder / name).get("files", [])}
                    except StoreError:
                        continue
            for name in os.listdir(folder):
                path = folder / name
                if _MANIFEST_RE.match(name) or name == "base.json" or name in referenced:
                    continue
                try:
                    if now - path.stat().st_mtime >= grace_s and path.is_file():
                        path.unlink()
                        removed.append(path)
                except FileNotFoundError:
                    continue
        return removed

    # -- writing

    def writer(self, agent: str, base: Any, *, activity: str = "changed", eps: float = 0.0,
               collective: Collective | None = None, clone_base: bool = True, writer: bool = True) -> SnapshotWriter:
        """A :class:`SnapshotWriter` for ``agent`` holding ``base`` (see there)."""
        return SnapshotWriter(self, agent, base, activity=activity, eps=eps, collective=collective,
                              clone_base=clone_base, writer=writer)

    def snapshot(self, agent: str, model: Any, step: int, *, epoch: int | None = None,
                 extra: Mapping[str, Any] | None = None, activity: str = "changed", eps: float = 0.0) -> Snapshot:
        """Snapshot ``model`` against the store's base read from disk tensor by tensor (one process, no DTensors;
        a training loop should hold a :meth:`writer`, which keeps the base on the weights' device)."""
        base = self.base_source()
        local = LocalModel.from_obj(model)
        rule = _activity(activity, eps)
        parts, total = [], _Totals()
        pieces: dict[str, list[dict[str, Any]]] = {}
        tensors: dict[str, Tensor] = {}
        for key, t in local.tensors.items():
            if local.sharded:
                raise UnsupportedInputError("store.snapshot takes whole tensors; use a writer for sharded models")
            b = base.get(key).to(t.tensor.device)
            if b.dtype != t.tensor.dtype or tuple(b.shape) != tuple(t.tensor.shape):
                raise InputMismatchError(f"tensor {key!r} does not match the store's base", key=key, agent=agent)
            enc = _encode(t.tensor.reshape(-1), b.reshape(-1), rule)
            pieces[key] = [_piece_entry(key, 0, t, enc, tensors)]
            total.add(t, enc)
        nonce = uuid.uuid4().hex[:12]
        parts.append(self._write_part(agent, step, nonce, 0, tensors, pieces))
        return self._commit(agent, step, parts, local, base.fingerprint, rule, total, epoch, extra)

    def _write_part(self, agent: str, step: int, nonce: str, rank: int, tensors: dict[str, Tensor],
                    pieces: dict[str, list[dict[str, Any]]]) -> dict[str, Any]:
        folder = self.root / agent
        folder.mkdir(parents=True, exist_ok=True)
        name = f"{step:012d}-{nonce}.p{rank}.safetensors"
        size = _write_safetensors(folder / name, tensors, {"format": SNAPSHOT_FORMAT}, self.durable)
        return {"file": {"name": name, "bytes": size}, "pieces": pieces}

    def _commit(self, agent: str, step: int, parts: Sequence[Mapping[str, Any]], local: LocalModel, fp: str,
                rule: Activity, totals: _Totals, epoch: int | None, extra: Mapping[str, Any] | None) -> Snapshot:
        now = time.time()
        head = {
            "format": SNAPSHOT_FORMAT, "version": VERSION, "agent": agent, "step": int(step),
            "epoch": None if epoch is None else int(epoch), "time": now,
            "time_iso": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(now)),
            "base_fingerprint": fp, "dtype": totals.dtype(),
            "activity": {"rule": rule.rule} if rule.rule == "changed" else {"rule": rule.rule, "eps": rule.eps},
            "parts": len(parts), "extra": dict(extra or {}),
        }
        manifest = self._compose(parts, local, head)
        files_bytes = sum(int(f["bytes"]) for f in manifest["files"])
        manifest["stats"] = {"numel": totals.numel, "changed": totals.changed, "bytes": files_bytes,
                             "dense_bytes": totals.dense_bytes}
        path = self.root / agent / f"{step:012d}.json"
        try:
            old = _read_json(path)
        except SnapshotNotFoundError:
            old = None
        _write_json(path, manifest, self.durable)
        if old is not None:  # a re-taken step (resumed run): its old files are no longer referenced
            keep = {f["name"] for f in manifest["files"]}
            for f in old.get("files", []):
                if f["name"] not in keep:
                    (self.root / agent / f["name"]).unlink(missing_ok=True)
        return Snapshot(self, agent, step, manifest)


def _activity(rule: str, eps: float) -> Activity:
    if rule not in ("changed", "abs"):
        raise ConfigError(f"snapshot activity must be 'changed' (lossless) or 'abs' (|τ| > eps), got {rule!r}")
    if rule == "abs" and not eps >= 0:
        raise ConfigError(f"eps must be >= 0, got {eps!r}")
    return Activity(rule, float(eps))  # type: ignore[arg-type]


class _Totals:
    def __init__(self) -> None:
        self.numel = 0
        self.changed = 0
        self.dense_bytes = 0
        self._by_dtype: dict[str, int] = {}

    def add(self, t: LocalTensor, enc: _Encoded) -> None:
        n = t.tensor.numel()
        self.numel += n
        self.changed += enc.count
        self.dense_bytes += n * t.tensor.element_size()
        name = _dtype_name(t.tensor.dtype)
        self._by_dtype[name] = self._by_dtype.get(name, 0) + n

    def merge(self, other: Sequence[int]) -> None:
        self.numel, self.changed, self.dense_bytes = (int(x) for x in other)

    def dtype(self) -> str | None:
        return max(self._by_dtype, key=self._by_dtype.__getitem__) if self._by_dtype else None


def _piece_entry(key: str, rank: int, t: LocalTensor, enc: _Encoded, tensors: dict[str, Tensor]) -> dict[str, Any]:
    entry: dict[str, Any] = {"offsets": list(t.offsets), "shape": list(t.tensor.shape), "encoding": enc.encoding,
                             "count": enc.count}
    if enc.values is not None:
        name = f"{key}@{rank}/values"
        tensors[name] = enc.values
        entry["values"] = name
    if enc.positions is not None:
        name = f"{key}@{rank}/{enc.encoding}"
        tensors[name] = enc.positions
        entry["positions"] = name
    return entry


class SnapshotWriter:
    """Takes snapshots of one agent against a base it holds on the weights' device.

    At creation the base is copied (``clone_base``), fingerprinted and persisted in the store, or checked against
    the store's (:class:`BaseMismatchError` when they differ). :meth:`snapshot` compares the model with it bit by
    bit on the weights' device, selects the changed values there, and moves only those (and their positions) to
    the CPU; nothing else of the model is copied.

    ``trusted_fingerprint``: the fingerprint of a base read from this very store (skips hashing it again).

    ``activity="changed"`` (default) is lossless. ``activity="abs"`` keeps only entries with |τ| > ``eps``: the
    reconstruction is then the base elsewhere, which RAM (whose rule drops those entries anyway) merges identically
    when its own ``eps`` is at least the snapshot's.
    """

    def __init__(self, store: SnapshotStore, agent: str, base: Any, *, activity: str = "changed", eps: float = 0.0,
                 collective: Collective | None = None, clone_base: bool = True, writer: bool = True,
                 trusted_fingerprint: str | None = None) -> None:
        self.store = store
        self.agent = store.check_agent(agent)
        self.rule = _activity(activity, eps)
        self.collective = collective or LocalCollective()
        self.writes = writer
        self.base = LocalModel.from_obj(base, clone=clone_base, name="base")
        if trusted_fingerprint is not None and trusted_fingerprint == store.base_fingerprint:
            self.fingerprint = trusted_fingerprint  # the base was read from this store: no need to hash it again
        else:
            self.fingerprint = store.set_base(self.base, collective=self.collective, writer=writer)

    def snapshot(self, model: Any, step: int, *, epoch: int | None = None,
                 extra: Mapping[str, Any] | None = None) -> Snapshot | None:
        """Write ``model``'s snapshot at ``step`` (all ranks call it when sharded; rank 0 returns the
        :class:`Snapshot`, the others None)."""
        local = LocalModel.from_obj(model, name=self.agent)
        local.check_like(self.base, self.agent)
        return self.write(self.capture(local), step, epoch=epoch, extra=extra)

    def capture(self, model: Any) -> Capture:
        """The changed values of every owned tensor, on the CPU (the part of a snapshot a rank writes)."""
        local = model if isinstance(model, LocalModel) else LocalModel.from_obj(model, name=self.agent)
        tensors: dict[str, Tensor] = {}
        pieces: dict[str, list[dict[str, Any]]] = {}
        totals = _Totals()
        rank = self.collective.rank
        with torch.no_grad():
            keys = [key for key, t in local.tensors.items() if t.owner and self.writes]
            pairs = [(local.tensors[key].tensor.reshape(-1), self.base.tensors[key].tensor.reshape(-1)) for key in keys]
            for key, enc in zip(keys, _encode_many(pairs, self.rule)):
                t = local.tensors[key]
                pieces[key] = [_piece_entry(key, rank, t, enc, tensors)]
                totals.add(t, enc)
        return Capture(local, tensors, pieces, totals)

    def write(self, capture: Capture, step: int, *, epoch: int | None = None,
              extra: Mapping[str, Any] | None = None) -> Snapshot | None:
        """Write a :meth:`capture` (possibly in another thread): part files, then rank 0's manifest."""
        c = self.collective
        nonce = c.broadcast_json(uuid.uuid4().hex[:12]) if c.world_size > 1 else uuid.uuid4().hex[:12]
        part = self.store._write_part(self.agent, step, nonce, c.rank, capture.tensors, capture.pieces) \
            if self.writes else None
        parts = self.store._exchange_parts(self.store.root / self.agent, f"{step:012d}-{nonce}", part, c)
        totals = capture.totals
        if c.world_size > 1:
            mine = [totals.numel, totals.changed, totals.dense_bytes]
            totals.merge([sum(col) for col in zip(*c.all_gather_int64(mine))])
        snap = None
        if c.rank == 0:
            snap = self.store._commit(self.agent, step, parts, capture.local, self.fingerprint, self.rule, totals,
                                      epoch, extra)
        c.barrier()
        return snap


@dataclass
class Capture:
    """What :meth:`SnapshotWriter.capture` took: CPU tensors and the piece table, ready to write."""

    local: LocalModel
    tensors: dict[str, Tensor]
    pieces: dict[str, list[dict[str, Any]]]
    totals: _Totals

    @property
    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in self.tensors.values())


# ----------------------------------------------------------------------------------------------- shard-wise merging


def ram_statistics(base: TensorSource, agents: Sequence[TensorSource], activity: Activity, *,
                   owned: Callable[[str], bool] = lambda key: True, collective: Collective | None = None,
                   device: torch.device | None = None, chunk_numel: int = DEFAULT_CHUNK_NUMEL,
                   per_key: bool = False) -> dict[str, Any]:
    """RAM's statistics pass over the keys the merge merges (``owned(key)``: count this process's box of it),
    summed over ranks: per agent ``active``/``unique`` counts, ``total`` entries, the histogram of c, and with
    ``per_key`` the counts per tensor."""
    collective = collective or LocalCollective()
    plan = build_plan(base, agents)
    k = len(agents)
    names = tuple(a.name for a in agents)
    keys = list(plan.merge)
    counts = torch.zeros(len(keys), 2, k, dtype=torch.int64)
    histogram = torch.zeros(k + 1, dtype=torch.int64)
    totals = torch.zeros(len(keys), dtype=torch.int64)
    workspace: dict[Any, Tensor] = {}
    with torch.no_grad():
        for i, key in enumerate(keys):
            if not owned(key):
                continue
            b = base.get(key)
            dev = device or b.device
            stream = DeltaStream(key, b.to(dev), [a.get(key) for a in agents], names, dev, chunk_numel, activity,
                                 workspace)
            for _, _, deltas in stream:
                a, u, h = F.ram_statistics(deltas)
                counts[i, 0] += a.cpu()
                counts[i, 1] += u.cpu()
                histogram += h.cpu()
            totals[i] = stream.numel
    flat = torch.cat([counts.view(-1), histogram, totals])
    collective.all_reduce_sum_(flat)
    counts = flat[: counts.numel()].view(len(keys), 2, k)
    histogram = flat[counts.numel(): counts.numel() + k + 1]
    totals = flat[counts.numel() + k + 1:]
    out: dict[str, Any] = {
        "agents": names, "active": counts[:, 0].sum(0), "unique": counts[:, 1].sum(0),
        "total": int(totals.sum()), "histogram": histogram,
    }
    if per_key:
        out["per_key"] = {key: (counts[i, 0], counts[i, 1]) for i, key in enumerate(keys)}
    return out
