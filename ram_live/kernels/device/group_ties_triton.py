"""TIES with its trim, many tensors at a time: the radix select's three digit passes
(:func:`radix_histogram_group_kernel`), the thresholds (:func:`select_thresholds_group_kernel`, one program per
tensor) and the merge (:func:`ties_group_kernel`), one launch each for a whole group, from
:mod:`.group_triton`'s table (the per-agent values: each agent's selection rank in that tensor). Each tensor's
three histograms (int32 ``[3, K, NBINS]``) and thresholds (float32 ``[K]``) are rows of one buffer each, found by the
tensor's index. Each program runs the one-tensor kernels' own steps (:mod:`.select_triton`,
:func:`~.ties_triton.ties_merge_kernel`), so the thresholds and the bits are theirs."""

from __future__ import annotations

from typing import Sequence

import torch
import triton
import triton.language as tl
from torch import Tensor

from .common import block_size, register_cap
from .group_triton import ROW, SPAN, address, agent_addresses, group_dtypes, group_tables, tensor_of
from .ram_triton import MERGE_WARPS
from .select_triton import NBINS, _flush, _histogram_step, select_state, select_state_all, vector8
from .ties_triton import _ties_block
from .triton_common import add_invalid, jit

__all__ = [
    "HIST_SPAN",
    "launch_ties_group",
    "radix_histogram_group_kernel",
    "select_thresholds_group_kernel",
    "ties_group_kernel",
]

#: Blocks each program of a digit pass counts (each program adds its histograms once, at its end).
HIST_SPAN = 64


@triton.jit
def _ranks(row, KP: tl.constexpr):
    """The tensor's eight selection ranks (the table's per-agent values) as an int32 ``[KP]`` vector."""
    return vector8(
        KP, tl.load(row + 10).to(tl.int32), tl.load(row + 11).to(tl.int32), tl.load(row + 12).to(tl.int32),
        tl.load(row + 13).to(tl.int32), tl.load(row + 14).to(tl.int32), tl.load(row + 15).to(tl.int32),
        tl.load(row + 16).to(tl.int32), tl.load(row + 17).to(tl.int32),
    )  # fmt: skip


@jit(do_not_specialize=[], aligned_anyhow=())
def radix_histogram_group_kernel(
    table_ptr, program_ptr, hist_base,
    K: tl.constexpr, KP: tl.constexpr, ACTIVE: tl.constexpr, PASS: tl.constexpr, SHIFT: tl.constexpr,
    DIGIT_MASK: tl.constexpr, MATCH_SHIFT: tl.constexpr, IN_T: tl.constexpr, AGENT_T: tl.constexpr,
    BLOCK: tl.constexpr, SPAN_: tl.constexpr, ROW_: tl.constexpr,
):  # fmt: skip
    """:func:`~.select_triton.radix_histogram_kernel`'s pass ``PASS`` over ``SPAN_`` blocks of the tensor
    ``program_ptr[pid]``, added to that tensor's histograms (``hist_base`` + its index × 3 K NBINS)."""
    index, row, numel, start = tensor_of(table_ptr, program_ptr, BLOCK, SPAN_, ROW_)
    hist_ptr = hist_base + index * (3 * K * NBINS)
    base_ptr = address(row, 1, IN_T)
    a0, a1, a2, a3, a4, a5, a6, a7 = agent_addresses(row, 2, AGENT_T)
    lane = tl.arange(0, BLOCK)
    prefix = tl.zeros([KP], dtype=tl.int32)
    if PASS > 0:
        prefix, _ = select_state(hist_ptr, _ranks(row, KP), K, KP, PASS)
    h0 = tl.zeros([NBINS], dtype=tl.int32)
    h1 = tl.zeros([NBINS], dtype=tl.int32)
    h2 = tl.zeros([NBINS], dtype=tl.int32)
    h3 = tl.zeros([NBINS], dtype=tl.int32)
    h4 = tl.zeros([NBINS], dtype=tl.int32)
    h5 = tl.zeros([NBINS], dtype=tl.int32)
    h6 = tl.zeros([NBINS], dtype=tl.int32)
    h7 = tl.zeros([NBINS], dtype=tl.int32)
    for j in range(SPAN_):
        first = start + j * BLOCK
        offs = first + lane
        if first + BLOCK <= numel:
            h0, h1, h2, h3, h4, h5, h6, h7 = _histogram_step(
                h0, h1, h2, h3, h4, h5, h6, h7, base_ptr, a0, a1, a2, a3, a4, a5, a6, a7, offs, offs < numel,
                prefix, K, KP, ACTIVE, PASS, SHIFT, DIGIT_MASK, MATCH_SHIFT, False,
            )  # fmt: skip
        elif first < numel:
            h0, h1, h2, h3, h4, h5, h6, h7 = _histogram_step(
                h0, h1, h2, h3, h4, h5, h6, h7, base_ptr, a0, a1, a2, a3, a4, a5, a6, a7, offs, offs < numel,
                prefix, K, KP, ACTIVE, PASS, SHIFT, DIGIT_MASK, MATCH_SHIFT, True,
            )  # fmt: skip
    _flush(hist_ptr, h0, 0, K, ACTIVE, PASS)
    _flush(hist_ptr, h1, 1, K, ACTIVE, PASS)
    _flush(hist_ptr, h2, 2, K, ACTIVE, PASS)
    _flush(hist_ptr, h3, 3, K, ACTIVE, PASS)
    _flush(hist_ptr, h4, 4, K, ACTIVE, PASS)
    _flush(hist_ptr, h5, 5, K, ACTIVE, PASS)
    _flush(hist_ptr, h6, 6, K, ACTIVE, PASS)
    _flush(hist_ptr, h7, 7, K, ACTIVE, PASS)


@triton.jit
def select_thresholds_group_kernel(
    table_ptr, hist_base, thr_base, K: tl.constexpr, KP: tl.constexpr, TRIM: tl.constexpr, ROW_: tl.constexpr
):
    """:func:`~.select_triton.select_thresholds_kernel` for tensor ``pid`` of the table: its agents' thresholds
    into ``thr_base`` + its index × K."""
    index = tl.program_id(0).to(tl.int64)
    rows = tl.arange(0, KP)
    bits, _ = select_state_all(hist_base + index * (3 * K * NBINS), _ranks(table_ptr + index * ROW_, KP), K, KP, 3)
    keep = (rows < K) & (((TRIM >> rows) & 1) != 0)
    tl.store(thr_base + index * K + rows, bits.to(tl.float32, bitcast=True), mask=keep)


@jit(do_not_specialize=["scale"], aligned_anyhow=("bad_ptr",))
def ties_group_kernel(
    table_ptr, program_ptr, w_ptr, thr_base, bad_ptr, scale,
    K: tl.constexpr, TRIM: tl.constexpr, NONE_KEPT: tl.constexpr, SCALED: tl.constexpr, FREQUENCY: tl.constexpr,
    WEIGHTED: tl.constexpr, DIVIDE: tl.constexpr, OUT_BF16: tl.constexpr, OUT_T: tl.constexpr, IN_T: tl.constexpr,
    AGENT_T: tl.constexpr, BLOCK: tl.constexpr, SPAN_: tl.constexpr, ROW_: tl.constexpr,
):  # fmt: skip
    """:func:`~.ties_triton.ties_merge_kernel` with the trim (no DARE) over ``SPAN_`` blocks of the tensor
    ``program_ptr[pid]``, its thresholds at ``thr_base`` + its index × K."""
    index, row, numel, start = tensor_of(table_ptr, program_ptr, BLOCK, SPAN_, ROW_)
    thr_ptr = thr_base + index * K
    out_ptr = address(row, 0, OUT_T)
    base_ptr = address(row, 1, IN_T)
    a0, a1, a2, a3, a4, a5, a6, a7 = agent_addresses(row, 2, AGENT_T)
    invalid = tl.zeros([BLOCK], dtype=tl.int32)
    for j in range(SPAN_):
        first = start + j * BLOCK
        offs = first + tl.arange(0, BLOCK)
        inb = offs < numel
        if first + BLOCK <= numel:
            invalid += _ties_block(
                out_ptr, base_ptr, a0, a1, a2, a3, a4, a5, a6, a7, w_ptr, thr_ptr, offs, inb, scale, 0, 0, 0, 0, 0, 0,
                0, 0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0, K, TRIM, NONE_KEPT, 0, SCALED, FREQUENCY, WEIGHTED,
                DIVIDE, OUT_BF16, BLOCK, False,
            )  # fmt: skip
        elif first < numel:
            invalid += _ties_block(
                out_ptr, base_ptr, a0, a1, a2, a3, a4, a5, a6, a7, w_ptr, thr_ptr, offs, inb, scale, 0, 0, 0, 0, 0, 0,
                0, 0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0, K, TRIM, NONE_KEPT, 0, SCALED, FREQUENCY, WEIGHTED,
                DIVIDE, OUT_BF16, BLOCK, True,
            )  # fmt: skip
    add_invalid(bad_ptr + tl.load(row + ROW_ - 1), invalid)


def launch_ties_group(
    outs: Sequence[Tensor],
    bases: Sequence[Tensor],
    agents: Sequence[Sequence[Tensor]],
    weights: Tensor,
    ranks: Sequence[Sequence[int]],
    scale: float,
    majority: int,
    weighted: bool,
    divide: int,
    invalid: Tensor,
    slots: Sequence[int],
) -> None:
    """TIES over a group in five launches (three digit passes, the thresholds, the merge): ``ranks`` per tensor and
    agent (:func:`~.select.selection_rank`), one trim pattern for the group (which agents select, which keep
    nothing); the rest as :func:`~.group_baseline_triton.launch_dare_ties_group`."""
    from .select import HIST_WARPS, PASSES, THRESHOLD_WARPS

    device, k = bases[0].device, len(agents[0])
    trim = sum(1 << t for t, r in enumerate(ranks[0]) if r > 0)
    none_kept = sum(1 << t for t, r in enumerate(ranks[0]) if r == 0)
    kp = max(2, 1 << (k - 1).bit_length())
    dtypes = group_dtypes(outs, bases, agents)
    thresholds = torch.empty(len(bases), k, dtype=torch.float32, device=device)
    block = block_size([bases[0], *agents[0]], MERGE_WARPS)
    hist_block = block_size([bases[0], *agents[0]], HIST_WARPS)
    *counting, (programs, table) = group_tables(
        outs, bases, agents, ranks, slots, ([hist_block * HIST_SPAN] if trim else []) + [block * SPAN]
    )
    if trim:
        hist = torch.zeros(len(bases), 3, k, NBINS, dtype=torch.int32, device=device)
        hist_programs, hist_table = counting[0]
        for p, (shift, digit_mask, match_shift) in enumerate(PASSES):
            radix_histogram_group_kernel[(hist_programs.numel(),)](
                hist_table, hist_programs, hist, K=k, KP=kp, ACTIVE=trim, PASS=p, SHIFT=shift, DIGIT_MASK=digit_mask,
                MATCH_SHIFT=match_shift, IN_T=dtypes["IN_T"], AGENT_T=dtypes["AGENT_T"], BLOCK=hist_block,
                SPAN_=HIST_SPAN, ROW_=ROW, num_warps=HIST_WARPS, **register_cap(device),
            )  # fmt: skip
        select_thresholds_group_kernel[(len(bases),)](
            hist_table, hist, thresholds, K=k, KP=kp, TRIM=trim, ROW_=ROW, num_warps=THRESHOLD_WARPS
        )
    ties_group_kernel[(programs.numel(),)](
        table, programs, weights, thresholds, invalid, float(scale),
        K=k, TRIM=trim, NONE_KEPT=none_kept, SCALED=scale != 1.0, FREQUENCY=majority == 1, WEIGHTED=weighted,
        DIVIDE=divide, BLOCK=block, SPAN_=SPAN, ROW_=ROW, num_warps=MERGE_WARPS, enable_fp_fusion=False,
        **dtypes, **register_cap(device),
    )  # fmt: skip
