"""The probe's statistics of one tensor as a Triton kernel (:func:`probe_counts_kernel`): per agent its active and
unique entries, the histogram of the active count c, the pairwise intersections of the activity masks and the
Gram matrix Σ τ_i·τ_j of the raw task vectors in float64 (the products of float32 entries exact; the sums in
another order than the CPU's, so within float64 rounding of it). One read of every input; every program walks a
strided share of the tensor and adds its sums once."""

from __future__ import annotations

import triton
import triton.language as tl

from .triton_common import add_invalid, pick

__all__ = ["probe_counts_kernel"]


@triton.jit
def probe_counts_kernel(
    base_ptr,
    a0, a1, a2, a3, a4, a5, a6, a7,
    counts_ptr, gram_ptr, bad_ptr, numel, eps,
    K: tl.constexpr, KP: tl.constexpr, EPS_ZERO: tl.constexpr, BLOCK: tl.constexpr,
):  # fmt: skip
    """``counts`` (int64, added to): ``[K]`` active, ``[K]`` unique, ``[K + 1]`` histogram, ``[K, K]``
    intersections; ``gram`` (float64 ``[K, K]``, added to). ``KP``: K rounded up to a power of two."""
    pid = tl.program_id(0)
    step = tl.num_programs(0).to(tl.int64) * BLOCK
    lane = tl.arange(0, BLOCK)
    col = tl.arange(0, KP)
    col16 = tl.arange(0, 16)
    invalid = tl.zeros([BLOCK], dtype=tl.int32)
    active = tl.zeros([KP], dtype=tl.int32)
    unique = tl.zeros([KP], dtype=tl.int32)
    histogram = tl.zeros([16], dtype=tl.int32)
    inter = tl.zeros([KP, KP], dtype=tl.int32)
    gram = tl.zeros([KP, KP], dtype=tl.float64)
    for start in tl.range(pid.to(tl.int64) * BLOCK, numel, step):
        offs = start + lane
        inb = offs < numel
        b = tl.load(base_ptr + offs, mask=inb, other=0.0).to(tl.float32)
        bad = (b != b) | (tl.abs(b) == float("inf"))
        c = tl.zeros([BLOCK], dtype=tl.int32)
        masks = tl.zeros([BLOCK, KP], dtype=tl.int32)
        raw = tl.zeros([BLOCK, KP], dtype=tl.float64)
        for t in tl.static_range(K):
            a = tl.load(pick(t, a0, a1, a2, a3, a4, a5, a6, a7) + offs, mask=inb, other=0.0).to(tl.float32)
            d = a - b
            bad = bad | (a != a) | (tl.abs(a) == float("inf")) | (tl.abs(d) == float("inf"))
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
        inter += tl.sum(masks[:, :, None] * masks[:, None, :], axis=0)
        gram += tl.sum(raw[:, :, None] * raw[:, None, :], axis=0)
    add_invalid(bad_ptr, invalid)
    tl.atomic_add(counts_ptr + col, active.to(tl.int64), mask=col < K)
    tl.atomic_add(counts_ptr + K + col, unique.to(tl.int64), mask=col < K)
    tl.atomic_add(counts_ptr + 2 * K + col16, histogram.to(tl.int64), mask=col16 <= K)
    pair = col[:, None] * K + col[None, :]
    inside = (col[:, None] < K) & (col[None, :] < K)
    tl.atomic_add(counts_ptr + 3 * K + 1 + pair, inter.to(tl.int64), mask=inside)
    tl.atomic_add(gram_ptr + pair, gram, mask=inside)
