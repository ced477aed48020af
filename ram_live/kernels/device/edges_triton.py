"""The Triton code of ``torch.ops.ram_live.inputs_edges`` (:mod:`.edges`): the bytes of each flat tensor's first
and last ``min(64, numel)`` entries, copied into one buffer in one launch.

The table (int64 ``[R, 5]``, one row per tensor): its address, its bytes, the bytes of its edge, and where its head
and its tail go in the buffer."""

from __future__ import annotations

from typing import Sequence

import torch
import triton
import triton.language as tl
from torch import Tensor

from .common import EDGE

__all__ = ["MAX_EDGE_BYTES", "edges_kernel", "edge_table", "launch_edges"]

#: The widest edge: 64 float64 entries.
MAX_EDGE_BYTES = EDGE * 8


@triton.jit
def edges_kernel(table, out, BLOCK: tl.constexpr):
    """One program a tensor: its head and its tail, byte by byte (any address, any dtype)."""
    row = table + tl.program_id(0) * 5
    src = tl.load(row).to(tl.pointer_type(tl.uint8))
    nbytes = tl.load(row + 1)
    width = tl.load(row + 2)
    offs = tl.arange(0, BLOCK)
    inside = offs < width
    head = tl.load(src + offs, mask=inside, other=0)
    tl.store(out + tl.load(row + 3) + offs, head, mask=inside)
    tail = tl.load(src + (nbytes - width) + offs, mask=inside, other=0)
    tl.store(out + tl.load(row + 4) + offs, tail, mask=inside)


def edge_table(tensors: Sequence[Tensor], per_group: int) -> tuple[Tensor, int]:
    """The table of ``tensors`` (flat and contiguous; ``per_group`` a merged tensor: its base, then its agents) and
    the buffer's bytes: per group its tensors' heads, then their tails (as ``InputsDigest.update`` lays them out).

    Example:
        >>> table, size = edge_table([torch.zeros(3), torch.zeros(100, dtype=torch.float16)], 2)
        >>> table[:, 2:].tolist(), size
        ([[12, 0, 140], [128, 12, 152]], 280)
    """
    entries = torch.tensor(list(map(Tensor.numel, tensors)), dtype=torch.int64)
    sizes = torch.tensor(list(map(Tensor.element_size, tensors)), dtype=torch.int64)
    width = entries.clamp(max=EDGE) * sizes
    per = width.view(-1, per_group)
    half = per.sum(1, keepdim=True)
    starts = torch.cumsum(2 * half, 0) - 2 * half
    head = starts + torch.cumsum(per, 1) - per
    table = torch.stack(
        [
            torch.tensor(list(map(Tensor.data_ptr, tensors)), dtype=torch.int64),
            entries * sizes,
            width,
            head.view(-1),
            (head + half).view(-1),
        ],
        dim=1,
    )
    return table, int(2 * half.sum())


def launch_edges(tensors: Sequence[Tensor], per_group: int, out: Tensor) -> None:
    """One launch of :func:`edges_kernel` over ``tensors`` (flat, contiguous, on one device) into ``out`` (uint8, of
    :func:`edge_table`'s size, on their device)."""
    table, _ = edge_table(tensors, per_group)
    if out.device.type == "cuda":  # from pinned memory the copy is queued
        table = table.pin_memory()
    edges_kernel[(len(tensors),)](table.to(out.device, non_blocking=True), out, BLOCK=MAX_EDGE_BYTES, num_warps=4)
