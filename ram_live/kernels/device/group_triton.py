"""Many tensors in one launch: RAM's merge (:func:`ram_merge_group_kernel`) and activity counts
(:func:`activity_counts_group_kernel`), and the table every grouped kernel reads (the baselines' grouped kernels are
:mod:`.group_baseline_triton`'s). Each program reads its tensor's pointers from the table and works through
:data:`SPAN` (counts: :data:`COUNT_SPAN`) blocks of it with the one-tensor kernel's own block
(:func:`~.ram_triton.ram_merge_kernel`, :func:`~.counts_triton.activity_counts_kernel`: the same operations, so the
same bits and counts). A model's hundreds of tensors then cost the host one launch and one table instead of a
launch each.

The table (int64 ``[T, ROW]``, one row per tensor, built by :func:`group_table`): the output's and the base's
addresses, :data:`MAX_AGENTS` agents' addresses, :data:`MAX_AGENTS` per-agent values (the importances' addresses,
or DARE's seeds), the tensor's entries, its first program and its slot in the invalid-count buffer. The programs'
tensors (int32 ``[P]``) depend only on the tensors' sizes, so they are kept between merges of the same model
(:func:`program_tensors`)."""

from __future__ import annotations

import functools
from itertools import chain
from typing import Sequence

import torch
import triton
import triton.language as tl
from torch import Tensor

from .common import MAX_AGENTS, block_size, register_cap
from .counts_triton import COUNT_WARPS, _flush_counts, _step
from .ram_triton import MERGE_WARPS, _merge_block
from .triton_common import add_invalid, jit

__all__ = [
    "COUNT_SPAN",
    "SPAN",
    "ROW",
    "activity_counts_group_kernel",
    "launch_activity_counts_group",
    "launch_ram_merge_group",
    "address",
    "agent_addresses",
    "group_dtypes",
    "group_table",
    "group_tables",
    "tensor_of",
    "program_tensors",
    "ram_merge_group_kernel",
]

#: Blocks each program merges (one tensor's, in order).
SPAN = 16
#: Blocks each program counts: more than it merges, since each program adds its counts to one buffer at its end
#: (fewer programs, fewer atomic adds on the same few addresses).
COUNT_SPAN = 64
#: Columns of a tensor's row in the table: out, base, 8 agents, 8 importances, entries, first program, slot.
ROW = 2 + 2 * MAX_AGENTS + 3
_TL_DTYPES = {torch.float32: tl.float32, torch.bfloat16: tl.bfloat16, torch.float16: tl.float16, torch.int16: tl.int16}


@triton.jit
def address(row, col: tl.constexpr, T: tl.constexpr):
    """Column ``col`` of a tensor's row as a pointer to ``T``, 16-byte aligned (the host groups only such; the
    columns of absent agents hold 0, never read)."""
    return tl.multiple_of(tl.load(row + col).to(tl.pointer_type(T)), 16)


@triton.jit
def tensor_of(table_ptr, program_ptr, BLOCK: tl.constexpr, SPAN_: tl.constexpr, ROW_: tl.constexpr):
    """This program's tensor: its index, its row of the table, its entries and the first entry this program
    takes."""
    pid = tl.program_id(0)
    index = tl.load(program_ptr + pid).to(tl.int64)
    row = table_ptr + index * ROW_
    return index, row, tl.load(row + ROW_ - 3), (pid - tl.load(row + ROW_ - 2)) * (BLOCK * SPAN_)


@triton.jit
def agent_addresses(row, col: tl.constexpr, T: tl.constexpr):
    """The eight per-agent pointers to ``T`` of a row from column ``col`` (agents at 2, importances at 10)."""
    return (
        address(row, col, T), address(row, col + 1, T), address(row, col + 2, T), address(row, col + 3, T),
        address(row, col + 4, T), address(row, col + 5, T), address(row, col + 6, T), address(row, col + 7, T),
    )  # fmt: skip


@jit(do_not_specialize=["eps"], aligned_anyhow=("bad_ptr",))
def ram_merge_group_kernel(
    table_ptr, program_ptr, lam_ptr, bad_ptr, eps,
    K: tl.constexpr, SCALED: tl.constexpr, SIGN: tl.constexpr, WEIGHTED: tl.constexpr,
    EPS_ZERO: tl.constexpr, OUT_BF16: tl.constexpr,
    OUT_T: tl.constexpr, IN_T: tl.constexpr, AGENT_T: tl.constexpr, H_T: tl.constexpr,
    BLOCK: tl.constexpr, SPAN_: tl.constexpr, ROW_: tl.constexpr,
):  # fmt: skip
    """:func:`~.ram_triton.ram_merge_kernel` over ``SPAN_`` blocks of the tensor ``program_ptr[pid]`` of the table;
    every whole block unmasked, a partial last one masked."""
    _, row, numel, start = tensor_of(table_ptr, program_ptr, BLOCK, SPAN_, ROW_)
    out_ptr = address(row, 0, OUT_T)
    base_ptr = address(row, 1, IN_T)
    a0, a1, a2, a3, a4, a5, a6, a7 = agent_addresses(row, 2, AGENT_T)
    h0, h1, h2, h3, h4, h5, h6, h7 = agent_addresses(row, 10, H_T)
    invalid = tl.zeros([BLOCK], dtype=tl.int32)
    for j in range(SPAN_):
        first = start + j * BLOCK
        offs = first + tl.arange(0, BLOCK)
        inb = offs < numel
        if first + BLOCK <= numel:
            invalid += _merge_block(
                out_ptr, base_ptr, a0, a1, a2, a3, a4, a5, a6, a7, h0, h1, h2, h3, h4, h5, h6, h7, lam_ptr, offs,
                inb, eps, K, SCALED, SIGN, WEIGHTED, EPS_ZERO, OUT_BF16, BLOCK, False,
            )  # fmt: skip
        elif first < numel:
            invalid += _merge_block(
                out_ptr, base_ptr, a0, a1, a2, a3, a4, a5, a6, a7, h0, h1, h2, h3, h4, h5, h6, h7, lam_ptr, offs,
                inb, eps, K, SCALED, SIGN, WEIGHTED, EPS_ZERO, OUT_BF16, BLOCK, True,
            )  # fmt: skip
    add_invalid(bad_ptr + tl.load(row + ROW_ - 1), invalid)


@jit(do_not_specialize=["eps"], aligned_anyhow=("counts_ptr", "bad_ptr"))
def activity_counts_group_kernel(
    table_ptr, program_ptr, counts_ptr, bad_ptr, eps,
    K: tl.constexpr, KP: tl.constexpr, NP: tl.constexpr, EPS_ZERO: tl.constexpr,
    IN_T: tl.constexpr, AGENT_T: tl.constexpr,
    ROWS: tl.constexpr, VEC: tl.constexpr, SPAN_: tl.constexpr, ROW_: tl.constexpr,
):  # fmt: skip
    """:func:`~.counts_triton.activity_counts_kernel`'s counts (no pairs) of ``SPAN_`` blocks of the tensor
    ``program_ptr[pid]`` of the table, added to ``counts`` once at the program's end."""
    BLOCK: tl.constexpr = ROWS * VEC
    _, row, numel, start = tensor_of(table_ptr, program_ptr, BLOCK, SPAN_, ROW_)
    base_ptr = address(row, 1, IN_T)
    a0, a1, a2, a3, a4, a5, a6, a7 = agent_addresses(row, 2, AGENT_T)
    lane = tl.arange(0, ROWS)[:, None] * VEC + tl.arange(0, VEC)[None, :]
    patterns = tl.zeros([NP], dtype=tl.int32)
    invalid = tl.zeros([ROWS], dtype=tl.int32)
    for j in range(SPAN_):
        first = start + j * BLOCK
        offs = first + lane
        if first + BLOCK <= numel:
            counted, bad, r0, r1, r2, r3, r4, r5, r6, r7 = _step(
                base_ptr, a0, a1, a2, a3, a4, a5, a6, a7, offs, offs < numel, eps, K, NP, EPS_ZERO, False
            )
            patterns += counted
            invalid += bad
        elif first < numel:
            counted, bad, r0, r1, r2, r3, r4, r5, r6, r7 = _step(
                base_ptr, a0, a1, a2, a3, a4, a5, a6, a7, offs, offs < numel, eps, K, NP, EPS_ZERO, True
            )
            patterns += counted
            invalid += bad
    _flush_counts(counts_ptr, patterns, K, KP, NP, False)
    add_invalid(bad_ptr + tl.load(row + ROW_ - 1), invalid)


@functools.lru_cache(maxsize=8)
def _programs(numels: tuple[int, ...], per_program: int, device: torch.device) -> tuple[Tensor, tuple[int, ...]]:
    counts = torch.tensor([-(-n // per_program) for n in numels], dtype=torch.int64)
    firsts = torch.cumsum(counts, 0) - counts
    tensors = torch.repeat_interleave(torch.arange(len(numels), dtype=torch.int32), counts)
    return tensors.to(device), tuple(firsts.tolist())


def program_tensors(numels: Sequence[int], per_program: int, device: torch.device) -> tuple[Tensor, tuple[int, ...]]:
    """The tensor of each program (int32 ``[P]`` on ``device``) and each tensor's first program, for tensors of
    ``numels`` entries and ``per_program`` entries a program; kept for the last few models' sizes.

    Example:
        >>> program_tensors([5, 40000], 16384, torch.device("cpu"))[0].tolist()
        [0, 1, 1, 1]
    """
    return _programs(tuple(numels), per_program, device)


def group_table(
    outs: Sequence[Tensor],
    bases: Sequence[Tensor],
    agents: Sequence[Sequence[Tensor]],
    values: Sequence[Sequence[int]],
    slots: Sequence[int],
    per_program: int,
) -> tuple[Tensor, Tensor]:
    """A launch's programs (:func:`program_tensors`, ``per_program`` entries each) and its table (see the module's
    doc), both on the tensors' device: ``outs`` empty for counts (no outputs); ``values``: per tensor its agents'
    values (importances' addresses, DARE's seeds, TIES' ranks), or empty.

    Example:
        >>> t = torch.zeros(4)
        >>> group_table([t], [t], [[t]], [], [5], 1024)[1][0, -3:].tolist()
        [4, 0, 5]
    """
    return group_tables(outs, bases, agents, values, slots, [per_program])[0]


def group_tables(
    outs: Sequence[Tensor],
    bases: Sequence[Tensor],
    agents: Sequence[Sequence[Tensor]],
    values: Sequence[Sequence[int]],
    slots: Sequence[int],
    per_programs: Sequence[int],
) -> list[tuple[Tensor, Tensor]]:
    """:func:`group_table` for launches over the same tensors with ``per_programs`` entries a program each (TIES'
    digit passes and its merge): the rows are built once, each table gets its own first programs.

    Example:
        >>> t = torch.zeros(4096)
        >>> [table[:, -2].tolist() for _, table in group_tables([t, t], [t, t], [[t], [t]], [], [0, 1], [1024, 4096])]
        [[0, 4], [0, 1]]
    """
    device, t, k = bases[0].device, len(bases), len(agents[0])
    numels = list(map(Tensor.numel, bases))
    table = torch.zeros(t, ROW, dtype=torch.int64)  # filled a column at a time: a model's rows cost no Python loop
    if outs:
        table[:, 0] = torch.tensor(list(map(Tensor.data_ptr, outs)), dtype=torch.int64)
    table[:, 1] = torch.tensor(list(map(Tensor.data_ptr, bases)), dtype=torch.int64)
    table[:, 2 : 2 + k] = torch.tensor(list(map(Tensor.data_ptr, chain.from_iterable(agents))), dtype=torch.int64).view(
        t, k
    )
    if values:
        v = len(values[0])
        flat = torch.tensor([x for row in values for x in row], dtype=torch.int64)
        table[:, 2 + MAX_AGENTS : 2 + MAX_AGENTS + v] = flat.view(t, v)
    table[:, ROW - 3] = torch.tensor(numels, dtype=torch.int64)
    table[:, ROW - 1] = torch.tensor(slots, dtype=torch.int64)
    out = []
    for i, per_program in enumerate(per_programs):
        programs, firsts = program_tensors(numels, per_program, device)
        placed = table if i == len(per_programs) - 1 else table.clone()
        placed[:, ROW - 2] = torch.tensor(firsts, dtype=torch.int64)
        if device.type == "cuda":  # from pinned memory the copy is queued; from pageable memory it may wait for the GPU
            placed = placed.pin_memory()
        out.append((programs, placed.to(device, non_blocking=True)))
    return out


def group_dtypes(outs: Sequence[Tensor], bases: Sequence[Tensor], agents: Sequence[Sequence[Tensor]]) -> dict:
    """The constexprs that type a table's pointers; a bfloat16 output is written as its int16 bits."""
    bf16 = outs[0].dtype == torch.bfloat16
    return {
        "OUT_BF16": bf16,
        "OUT_T": _TL_DTYPES[torch.int16 if bf16 else outs[0].dtype],
        "IN_T": _TL_DTYPES[bases[0].dtype],
        "AGENT_T": _TL_DTYPES[agents[0][0].dtype],
    }


def launch_ram_merge_group(
    outs: Sequence[Tensor],
    bases: Sequence[Tensor],
    agents: Sequence[Sequence[Tensor]],
    importances: Sequence[Sequence[Tensor]],
    lambdas: Tensor | None,
    eps: float,
    sign: bool,
    invalid: Tensor,
    slots: Sequence[int],
) -> None:
    """One launch of :func:`ram_merge_group_kernel` over contiguous tensors of one device and one dtype each for
    the outputs, the bases, the agents and the importances (16-byte aligned, fewer than 2³¹ entries; the op checks),
    tensor ``i`` adding its invalid entries to ``invalid[slots[i]]``."""
    device = bases[0].device
    block = block_size([bases[0], *agents[0], *(importances[0] if importances else ())], MERGE_WARPS)
    hs = [[h.data_ptr() for h in row] for row in importances]
    programs, table = group_table(outs, bases, agents, hs, slots, block * SPAN)
    h_dtype = importances[0][0].dtype if importances else torch.float32
    ram_merge_group_kernel[(programs.numel(),)](
        table, programs, lambdas, invalid, float(eps),
        K=len(agents[0]), SCALED=lambdas is not None, SIGN=sign, WEIGHTED=bool(importances), EPS_ZERO=eps == 0,
        H_T=_TL_DTYPES[h_dtype], BLOCK=block, SPAN_=SPAN, ROW_=ROW, num_warps=MERGE_WARPS, enable_fp_fusion=False,
        **group_dtypes(outs, bases, agents), **register_cap(device),
    )  # fmt: skip


def launch_activity_counts_group(
    bases: Sequence[Tensor],
    agents: Sequence[Sequence[Tensor]],
    eps: float,
    counts: Tensor,
    invalid: Tensor,
    slots: Sequence[int],
) -> None:
    """One launch of :func:`activity_counts_group_kernel`: every tensor's counts added to ``counts`` (int64
    ``[3K + 1]``), tensor ``i``'s invalid entries to ``invalid[slots[i]]``; tensors as
    :func:`launch_ram_merge_group` takes them."""
    device, k = bases[0].device, len(agents[0])
    block = block_size([bases[0], *agents[0]], COUNT_WARPS)
    programs, table = group_table([], bases, agents, [], slots, block * COUNT_SPAN)
    activity_counts_group_kernel[(programs.numel(),)](
        table, programs, counts, invalid, float(eps),
        K=k, KP=max(2, 1 << (k - 1).bit_length()), NP=max(2, 1 << k), EPS_ZERO=eps == 0,
        IN_T=_TL_DTYPES[bases[0].dtype], AGENT_T=_TL_DTYPES[agents[0][0].dtype], ROWS=32 * COUNT_WARPS,
        VEC=block // (32 * COUNT_WARPS), SPAN_=COUNT_SPAN, ROW_=ROW, num_warps=COUNT_WARPS, **register_cap(device),
    )  # fmt: skip
