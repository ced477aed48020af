"""The activity counts of one tensor as a Triton kernel (:func:`activity_counts_kernel`), for RAM's statistics
pass (``ram_live::ram_counts_``) and the probe (``ram_live::probe_counts_``): per agent its active and unique
entries and the histogram of the active count c; with ``PAIRS`` (the probe) also the pairwise intersections of
the activity masks and the Gram matrix Σ τ_i·τ_j of the raw task vectors in float64 (the products of float32
entries exact; the sums in another order than the CPU's, so within float64 rounding of it). One read of every
input; every program walks a strided share of the tensor and adds its sums once."""

from __future__ import annotations

import triton
import triton.language as tl

from .common import agent_args, device_programs
from .triton_common import add_invalid, pick

__all__ = ["activity_counts_kernel", "launch_activity_counts"]


@triton.jit
def activity_counts_kernel(
    base_ptr,
    a0, a1, a2, a3, a4, a5, a6, a7,
    counts_ptr, gram_ptr, bad_ptr, numel, eps,
    K: tl.constexpr, KP: tl.constexpr, PAIRS: tl.constexpr, EPS_ZERO: tl.constexpr, BLOCK: tl.constexpr,
):  # fmt: skip
    """``counts`` (int64, added to): ``[K]`` active, ``[K]`` unique, ``[K + 1]`` histogram and, with ``PAIRS``,
    ``[K, K]`` intersections; ``gram`` (float64 ``[K, K]``, added to; None without ``PAIRS``). NaN/Inf inputs and
    task vectors are counted into ``bad``. ``KP``: K rounded up to a power of two (at least 2)."""
    pid = tl.program_id(0)
    step = tl.num_programs(0).to(tl.int64) * BLOCK
    lane = tl.arange(0, BLOCK)
    col = tl.arange(0, KP)
    col16 = tl.arange(0, 16)
    invalid = tl.zeros([BLOCK], dtype=tl.int32)
    active = tl.zeros([KP], dtype=tl.int32)
    unique = tl.zeros([KP], dtype=tl.int32)
    histogram = tl.zeros([16], dtype=tl.int32)
    if PAIRS:
        inter = tl.zeros([KP, KP], dtype=tl.int32)
        gram = tl.zeros([KP, KP], dtype=tl.float64)
    for start in tl.range(pid.to(tl.int64) * BLOCK, numel, step):
        offs = start + lane
        inb = offs < numel
        b = tl.load(base_ptr + offs, mask=inb, other=0.0).to(tl.float32)
        bad = (b != b) | (tl.abs(b) == float("inf"))
        c = tl.zeros([BLOCK], dtype=tl.int32)
        masks = tl.zeros([BLOCK, KP], dtype=tl.int32)
        if PAIRS:
            raw = tl.zeros([BLOCK, KP], dtype=tl.float64)
        for t in tl.static_range(K):
            a = tl.load(pick(t, a0, a1, a2, a3, a4, a5, a6, a7) + offs, mask=inb, other=0.0).to(tl.float32)
            d = a - b
            bad = bad | (a != a) | (tl.abs(a) == float("inf")) | (tl.abs(d) == float("inf"))
            if PAIRS:
                raw += tl.where(col[None, :] == t, d.to(tl.float64)[:, None], 0.0)
            if not EPS_ZERO:
                d = tl.where((d >= -eps) & (d <= eps), 0.0, d)
            m = ((d != 0) & inb).to(tl.int32)
            c += m
            masks += tl.where(col[None, :] == t, m[:, None], 0)
        invalid += (bad & inb).to(tl.int32)
        active += tl.sum(masks, axis=0)
        unique += tl.sum(masks * (c == 1).to(tl.int32)[:, None], axis=0)
        histogram += tl.sum(((col16[None, :] == c[:, None]) & inb[:, None]).to(tl.int32), axis=0)
        if PAIRS:
            inter += tl.sum(masks[:, :, None] * masks[:, None, :], axis=0)
            gram += tl.sum(raw[:, :, None] * raw[:, None, :], axis=0)
    add_invalid(bad_ptr, invalid)
    tl.atomic_add(counts_ptr + col, active.to(tl.int64), mask=col < K)
    tl.atomic_add(counts_ptr + K + col, unique.to(tl.int64), mask=col < K)
    tl.atomic_add(counts_ptr + 2 * K + col16, histogram.to(tl.int64), mask=col16 <= K)
    if PAIRS:
        pair = col[:, None] * K + col[None, :]
        inside = (col[:, None] < K) & (col[None, :] < K)
        tl.atomic_add(counts_ptr + 3 * K + 1 + pair, inter.to(tl.int64), mask=inside)
        tl.atomic_add(gram_ptr + pair, gram, mask=inside)


def launch_activity_counts(base, agents, eps, counts, gram, invalid, *, block: int, programs_per_sm: int) -> None:
    """:func:`activity_counts_kernel` over one flat tensor, ``programs_per_sm`` programs per multiprocessor walking
    ``block`` entries a step; ``gram`` None: the counts alone (RAM's statistics), else also the pairs (the probe)."""
    k, numel = len(agents), base.numel()
    activity_counts_kernel[(device_programs(base.device, numel, block, programs_per_sm),)](
        base, *agent_args(agents), counts, gram, invalid, numel, float(eps),
        K=k, KP=max(2, 1 << (k - 1).bit_length()), PAIRS=gram is not None, EPS_ZERO=eps == 0, BLOCK=block,
        num_warps=4,
    )  # fmt: skip
