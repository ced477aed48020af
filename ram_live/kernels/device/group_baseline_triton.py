"""The baselines' grouped kernels: task arithmetic, linear and DARE-linear (:func:`linear_merge_group_kernel`) and
DARE-TIES (:func:`dare_ties_group_kernel`), many tensors in one launch from :mod:`.group_triton`'s table, each
program merging :data:`~.group_triton.SPAN` blocks of one tensor with the one-tensor kernel's own block
(:func:`~.linear_triton.linear_merge_kernel`, :func:`~.ties_triton.ties_merge_kernel`: the same bits). DARE's seeds
are per tensor and agent: the table's per-agent values. TIES' trim keeps a launch per tensor (each tensor selects
its own thresholds first)."""

from __future__ import annotations

from typing import Sequence

import triton
import triton.language as tl
from torch import Tensor

from .common import block_size, register_cap
from .group_triton import ROW, SPAN, address, agent_addresses, group_dtypes, group_table, tensor_of
from .linear_triton import _linear_block
from .ram_triton import MERGE_WARPS
from .ties_triton import _ties_block
from .triton_common import add_invalid, jit

__all__ = ["dare_ties_group_kernel", "launch_dare_ties_group", "launch_linear_merge_group", "linear_merge_group_kernel"]


@triton.jit
def _seed(row, t: tl.constexpr, DROP: tl.constexpr):
    """Agent ``t``'s DARE seed from the table where it drops, else 0 (never read)."""
    if (DROP >> t) & 1:
        return tl.load(row + 10 + t)
    else:
        return tl.zeros([], dtype=tl.int64)


@jit(do_not_specialize=["scale"], aligned_anyhow=("bad_ptr",))
def linear_merge_group_kernel(
    table_ptr, program_ptr, w_ptr, bad_ptr, scale,
    q0, q1, q2, q3, q4, q5, q6, q7,
    K: tl.constexpr, DROP: tl.constexpr, SCALED: tl.constexpr, OUT_BF16: tl.constexpr,
    OUT_T: tl.constexpr, IN_T: tl.constexpr, AGENT_T: tl.constexpr,
    BLOCK: tl.constexpr, SPAN_: tl.constexpr, ROW_: tl.constexpr,
):  # fmt: skip
    """:func:`~.linear_triton.linear_merge_kernel` over ``SPAN_`` blocks of the tensor ``program_ptr[pid]`` of the
    table (agents of the ``DROP`` bitmask drop with their seed from the table and their density ``q_t``)."""
    _, row, numel, start = tensor_of(table_ptr, program_ptr, BLOCK, SPAN_, ROW_)
    out_ptr = address(row, 0, OUT_T)
    base_ptr = address(row, 1, IN_T)
    a0, a1, a2, a3, a4, a5, a6, a7 = agent_addresses(row, 2, AGENT_T)
    s0, s1, s2, s3 = _seed(row, 0, DROP), _seed(row, 1, DROP), _seed(row, 2, DROP), _seed(row, 3, DROP)
    s4, s5, s6, s7 = _seed(row, 4, DROP), _seed(row, 5, DROP), _seed(row, 6, DROP), _seed(row, 7, DROP)
    invalid = tl.zeros([BLOCK], dtype=tl.int32)
    for j in range(SPAN_):
        first = start + j * BLOCK
        offs = first + tl.arange(0, BLOCK)
        inb = offs < numel
        if first + BLOCK <= numel:
            invalid += _linear_block(
                out_ptr, base_ptr, a0, a1, a2, a3, a4, a5, a6, a7, w_ptr, offs, inb, scale, s0, s1, s2, s3, s4, s5, s6,
                s7, q0, q1, q2, q3, q4, q5, q6, q7, K, DROP, SCALED, OUT_BF16, BLOCK, False,
            )  # fmt: skip
        elif first < numel:
            invalid += _linear_block(
                out_ptr, base_ptr, a0, a1, a2, a3, a4, a5, a6, a7, w_ptr, offs, inb, scale, s0, s1, s2, s3, s4, s5, s6,
                s7, q0, q1, q2, q3, q4, q5, q6, q7, K, DROP, SCALED, OUT_BF16, BLOCK, True,
            )  # fmt: skip
    add_invalid(bad_ptr + tl.load(row + ROW_ - 1), invalid)


@jit(do_not_specialize=["scale"], aligned_anyhow=("bad_ptr",))
def dare_ties_group_kernel(
    table_ptr, program_ptr, w_ptr, bad_ptr, scale,
    q0, q1, q2, q3, q4, q5, q6, q7,
    K: tl.constexpr, DROP: tl.constexpr, SCALED: tl.constexpr, FREQUENCY: tl.constexpr, WEIGHTED: tl.constexpr,
    DIVIDE: tl.constexpr, OUT_BF16: tl.constexpr, OUT_T: tl.constexpr, IN_T: tl.constexpr, AGENT_T: tl.constexpr,
    BLOCK: tl.constexpr, SPAN_: tl.constexpr, ROW_: tl.constexpr,
):  # fmt: skip
    """:func:`~.ties_triton.ties_merge_kernel` without the trim (DARE-TIES: DARE's drop, then TIES' election) over
    ``SPAN_`` blocks of the tensor ``program_ptr[pid]`` of the table."""
    _, row, numel, start = tensor_of(table_ptr, program_ptr, BLOCK, SPAN_, ROW_)
    out_ptr = address(row, 0, OUT_T)
    base_ptr = address(row, 1, IN_T)
    a0, a1, a2, a3, a4, a5, a6, a7 = agent_addresses(row, 2, AGENT_T)
    s0, s1, s2, s3 = _seed(row, 0, DROP), _seed(row, 1, DROP), _seed(row, 2, DROP), _seed(row, 3, DROP)
    s4, s5, s6, s7 = _seed(row, 4, DROP), _seed(row, 5, DROP), _seed(row, 6, DROP), _seed(row, 7, DROP)
    invalid = tl.zeros([BLOCK], dtype=tl.int32)
    for j in range(SPAN_):
        first = start + j * BLOCK
        offs = first + tl.arange(0, BLOCK)
        inb = offs < numel
        if first + BLOCK <= numel:
            invalid += _ties_block(
                out_ptr, base_ptr, a0, a1, a2, a3, a4, a5, a6, a7, w_ptr, w_ptr, offs, inb, scale, s0, s1, s2, s3, s4,
                s5, s6, s7, q0, q1, q2, q3, q4, q5, q6, q7, K, 0, 0, DROP, SCALED, FREQUENCY, WEIGHTED, DIVIDE,
                OUT_BF16, BLOCK, False,
            )  # fmt: skip
        elif first < numel:
            invalid += _ties_block(
                out_ptr, base_ptr, a0, a1, a2, a3, a4, a5, a6, a7, w_ptr, w_ptr, offs, inb, scale, s0, s1, s2, s3, s4,
                s5, s6, s7, q0, q1, q2, q3, q4, q5, q6, q7, K, 0, 0, DROP, SCALED, FREQUENCY, WEIGHTED, DIVIDE,
                OUT_BF16, BLOCK, True,
            )  # fmt: skip
    add_invalid(bad_ptr + tl.load(row + ROW_ - 1), invalid)


def _launch(kernel, outs, bases, agents, seeds, drop, densities, weights, invalid, slots, **constexprs) -> None:
    """One launch of a baseline's grouped ``kernel`` (its table, programs and shared arguments)."""
    device = bases[0].device
    block = block_size([bases[0], *agents[0]], MERGE_WARPS)
    programs, table = group_table(outs, bases, agents, seeds, slots, block * SPAN)
    kernel[(programs.numel(),)](
        table, programs, weights, invalid, float(constexprs.pop("scale")), *densities,
        K=len(agents[0]), DROP=drop, BLOCK=block, SPAN_=SPAN, ROW_=ROW, num_warps=MERGE_WARPS,
        enable_fp_fusion=False, **constexprs, **group_dtypes(outs, bases, agents), **register_cap(device),
    )  # fmt: skip


def launch_linear_merge_group(
    outs: Sequence[Tensor],
    bases: Sequence[Tensor],
    agents: Sequence[Sequence[Tensor]],
    weights: Tensor,
    scale: float,
    seeds: Sequence[Sequence[int]],
    drop: int,
    densities: Sequence[float],
    invalid: Tensor,
    slots: Sequence[int],
) -> None:
    """One launch of :func:`linear_merge_group_kernel` (``weights``: float64 ``[K]`` on the device; ``seeds``: per
    tensor its agents' DARE seeds, or empty; ``drop``/``densities``: the agents that drop and eight densities, as
    :func:`~.linear.drop_arguments` gives them), tensor ``i`` adding its invalid entries to ``invalid[slots[i]]``."""
    _launch(
        linear_merge_group_kernel, outs, bases, agents, seeds, drop, densities, weights, invalid, slots,
        scale=scale, SCALED=scale != 1.0,
    )  # fmt: skip


def launch_dare_ties_group(
    outs: Sequence[Tensor],
    bases: Sequence[Tensor],
    agents: Sequence[Sequence[Tensor]],
    weights: Tensor,
    scale: float,
    seeds: Sequence[Sequence[int]],
    drop: int,
    densities: Sequence[float],
    majority: int,
    weighted: bool,
    divide: int,
    invalid: Tensor,
    slots: Sequence[int],
) -> None:
    """One launch of :func:`dare_ties_group_kernel`, as :func:`launch_linear_merge_group` with TIES' election
    options (``majority``, ``weighted``, ``divide``: as ``ties_merge_`` takes them)."""
    _launch(
        dare_ties_group_kernel, outs, bases, agents, seeds, drop, densities, weights, invalid, slots,
        scale=scale, SCALED=scale != 1.0, FREQUENCY=majority == 1, WEIGHTED=weighted, DIVIDE=divide,
    )  # fmt: skip
