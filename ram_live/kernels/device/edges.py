"""The inputs' edges of many tensors as one ``torch.library`` custom op, ``torch.ops.ram_live.inputs_edges``: the
bytes of each tensor's first and last ``min(64, numel)`` stored entries, in the order a pass's digest hashes them
(per merged tensor: the heads of its base and agents, then their tails; ``ram_live.engine.digest``), so that a
model's digest costs the host one launch and one copy to the host instead of a gather per tensor. It runs
:func:`.edges_triton.edges_kernel` where Triton serves the device, else torch's strided views and one ``cat``.

Not ``from __future__ import annotations``: ``torch.library.custom_op`` reads the annotations as types.
"""

import operator
from itertools import repeat

import torch
from torch import Tensor

from .common import PLAIN_TENSORS, launch, triton_serves

__all__ = ["inputs_edges", "edges_bytes"]

#: Entries at each end of a tensor.
EDGE = 64


def edges_bytes(tensors: list[Tensor]) -> int:
    """The bytes :func:`inputs_edges` gives for ``tensors``.

    Example:
        >>> edges_bytes([torch.zeros(3), torch.zeros(100, dtype=torch.float16)])
        280
    """
    entries = map(min, repeat(EDGE), map(Tensor.numel, tensors))
    return 2 * sum(map(operator.mul, entries, map(Tensor.element_size, tensors)))


@torch.library.custom_op("ram_live::inputs_edges", mutates_args=())
def inputs_edges(tensors: list[Tensor], per_group: int) -> Tensor:
    """uint8 ``[edges_bytes(tensors)]`` on the tensors' device: for each group of ``per_group`` tensors in turn (a
    merged tensor's base, then its agents), the bytes of their first ``min(64, numel)`` stored entries, then of
    their last (a tensor shorter than 128 entries: its heads and tails overlap, as their slices do)."""
    out = torch.empty(edges_bytes(tensors), dtype=torch.uint8, device=tensors[0].device)
    device = tensors[0].device
    takes = (  # a property at a time over all the tensors: a model's thousands, no Python loop each
        triton_serves(device)
        and len(tensors) % per_group == 0
        and set(map(type, tensors)) <= set(PLAIN_TENSORS)
        and set(map(operator.attrgetter("device"), tensors)) == {device}
        and all(map(Tensor.is_contiguous, tensors))
        and max(map(Tensor.element_size, tensors)) <= 8  # the kernel's edge: 64 entries of at most 8 bytes
    )
    launch("edges_kernel", takes, _triton_edges, _torch_edges, tensors, per_group, out)
    return out


@inputs_edges.register_fake
def _(tensors, per_group) -> Tensor:
    return tensors[0].new_empty(edges_bytes(tensors), dtype=torch.uint8)


def _triton_edges(tensors, per_group, out) -> None:
    from .edges_triton import launch_edges

    launch_edges(tensors, per_group, out)


def _torch_edges(tensors, per_group, out) -> None:
    parts = []
    for i in range(0, len(tensors), per_group):
        group = [t.reshape(-1) for t in tensors[i : i + per_group]]
        heads = [t[:EDGE].contiguous().view(torch.uint8) for t in group]
        tails = [t[-EDGE:].contiguous().view(torch.uint8) for t in group]
        parts += heads + tails
    torch.cat(parts, out=out)
