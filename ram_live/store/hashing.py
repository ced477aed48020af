"""Content fingerprints of models, the same whatever the sharding."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
from typing import Any

import torch
from torch import Tensor

from .collective import Collective, LocalCollective
from .encoding import optional_numpy
from .format import bits_of, dtype_name
from .local import LocalModel

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
        index = torch.arange(shape[d], device=device, dtype=torch.int64) + offsets[d]
        inner = inner + (index * strides[d]).view(view)
    inner = inner.reshape(-1)
    wide = t.element_size() == 8
    flat = t.reshape(rows, -1) if dims else t.reshape(1, 1)
    np = optional_numpy() if device.type == "cpu" and t.dtype != torch.bool else None
    if np is not None:  # the same integers with numpy (single-threaded: no thread hand-offs on a busy CPU)
        return _box_hash_numpy(np, bits_of(flat).numpy(), inner.numpy(), offsets, strides, rows, rows_per_chunk, wide)
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
        bits = bits_of(flat[r0:r1].reshape(-1)).to(torch.int64)
        x = a.bitwise_xor_(bits & _M32).mul_(_K_VALUE)
        x.bitwise_xor_(x >> 32).bitwise_and_(_M32)
        if wide:
            x.bitwise_xor_((bits >> 32) & _M32).mul_(_K_WIDE)
            x.bitwise_xor_(x >> 32).bitwise_and_(_M32)
        s1 += int(x.sum())
        s2 += int(x.mul_(_K_LANE2).bitwise_right_shift_(15).bitwise_and_(_M32).sum())
    return s1 % (1 << 64), s2 % (1 << 64)


def _box_hash_numpy(
    np: Any,
    flat: Any,
    inner: Any,
    offsets: Sequence[int],
    strides: Sequence[int],
    rows: int,
    rows_per_chunk: int,
    wide: bool,
) -> tuple[int, int]:
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
        [
            key,
            dtype_name(local.tensors[key].tensor.dtype, key),
            list(local.tensors[key].global_shape),
            f"{totals[2 * i]:016x}{totals[2 * i + 1]:016x}",
        ]
        for i, key in enumerate(keys)
    ]
    payload = json.dumps({"tensors": desc, "aliases": sorted(local.aliases().items())}, separators=(",", ":"))
    return "rlfp1-" + hashlib.sha256(payload.encode()).hexdigest()[:40]
