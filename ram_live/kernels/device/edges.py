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

from ...errors import ConfigError
from . import common
from .common import EDGE, launch, plain_on

__all__ = ["edge_rows", "edges_bytes", "inputs_edges"]


def edge_rows(flat: Tensor) -> Tensor:
    """The bytes of a flat tensor's first and last ``min(64, numel)`` entries as ``[2, bytes]`` (head, tail): one
    strided view where the tensor is contiguous and long enough.

    Example:
        >>> edge_rows(torch.arange(3, dtype=torch.uint8)).tolist()
        [[0, 1, 2], [0, 1, 2]]
    """
    if flat.is_contiguous() and flat.numel() >= 2 * EDGE:
        data = flat.view(torch.uint8)
        width = EDGE * flat.element_size()
        return data.as_strided((2, width), (data.numel() - width, 1))
    return torch.stack([p.contiguous().view(torch.uint8) for p in (flat[:EDGE], flat[-EDGE:])])


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
    _check_groups(tensors, per_group)
    device = tensors[0].device
    out = torch.empty(edges_bytes(tensors), dtype=torch.uint8, device=device)
    takes = (
        common.triton_serves(device)  # read at the call, as the other ops' checks read it
        and plain_on(tensors, device)
        and max(map(Tensor.element_size, tensors)) <= 8  # the kernel's edge: 64 entries of at most 8 bytes
    )
    launch("edges_kernel", takes, _triton_edges, _torch_edges, tensors, per_group, out)
    return out


@inputs_edges.register_fake
def _(tensors, per_group) -> Tensor:
    _check_groups(tensors, per_group)
    return tensors[0].new_empty(edges_bytes(tensors), dtype=torch.uint8)


def _check_groups(tensors: list[Tensor], per_group: int) -> None:
    if not tensors or per_group < 1 or len(tensors) % per_group:
        raise ConfigError(
            f"inputs_edges takes tensors in whole groups of per_group >= 1 (a merged tensor's base and agents): "
            f"got {len(tensors)} tensor(s), per_group={per_group}"
        )


def _triton_edges(tensors, per_group, out) -> None:
    from .edges_triton import launch_edges

    launch_edges(tensors, per_group, out)


def _torch_edges(tensors, per_group, out) -> None:
    groups = range(0, len(tensors), per_group)
    rows = [torch.cat([edge_rows(t.reshape(-1)) for t in tensors[i : i + per_group]], dim=1) for i in groups]
    torch.cat([r.view(-1) for r in rows], out=out)
