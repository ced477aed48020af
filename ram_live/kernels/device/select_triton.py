"""The top-k magnitude selection of TIES' trim as Triton kernels: a radix select over the float32 bits of |τ| (τ =
agent − base, computed from the inputs as they are read, never stored), three digit passes of 11, 11 and 9 bits.
Each pass is one multi-block launch over all agents (:func:`radix_histogram_kernel`): every program walks a strided
share of the tensor, counts its digits per agent in a block histogram (``tl.histogram``) and adds the non-zero bins
to the pass's ``[K, NBINS]`` int32 histogram once. Where a pass needs the digits chosen before it, each program
derives them from the earlier histograms itself (:func:`select_state`, a scan of ``K x NBINS`` counts), so no
launch sits between the passes and nothing is read on the host. After the third pass one single-program launch
(:func:`select_thresholds_kernel`) writes each agent's threshold, once per tensor, for the merge kernel to load."""

from __future__ import annotations

import triton
import triton.language as tl

from .triton_common import load

__all__ = ["NBINS", "radix_histogram_kernel", "select_state", "select_thresholds_kernel", "agent_lane", "vector8"]

#: Bins of every pass's histogram (the last pass uses its first 512).
NBINS = tl.constexpr(2048)


@triton.jit
def vector8(KP: tl.constexpr, v0, v1, v2, v3, v4, v5, v6, v7):
    """The eight scalars as a ``[KP]`` vector (its first KP of them)."""
    rows = tl.arange(0, KP)
    out = tl.where(rows == 0, v0, 0)
    out = tl.where(rows == 1, v1, out)
    out = tl.where(rows == 2, v2, out)
    out = tl.where(rows == 3, v3, out)
    out = tl.where(rows == 4, v4, out)
    out = tl.where(rows == 5, v5, out)
    out = tl.where(rows == 6, v6, out)
    out = tl.where(rows == 7, v7, out)
    return out


@triton.jit
def agent_lane(vec, t: tl.constexpr, KP: tl.constexpr):
    """Entry ``t`` of the ``[KP]`` vector ``vec``, as a scalar."""
    return tl.sum(tl.where(tl.arange(0, KP) == t, vec, 0), axis=0)


@triton.jit
def select_state(hist_ptr, ranks, K: tl.constexpr, KP: tl.constexpr, PASSES: tl.constexpr):
    """Per agent (a ``[KP]`` vector each): the high bits of its ``ranks``-th largest |τ| fixed by the first
    ``PASSES`` passes' histograms, and its rank among the entries that share them. After the three passes the bits
    are the whole threshold. Rows of agents that select nothing hold meaningless values. One agent's histogram
    row at a time (``NBINS`` counts in registers, not ``K x NBINS``)."""
    rows = tl.arange(0, KP)
    cols = tl.arange(0, NBINS)
    prefixes = tl.zeros([KP], dtype=tl.int32)
    left = ranks
    for t in tl.static_range(K):
        prefix = tl.zeros([], dtype=tl.int32)
        rank = agent_lane(ranks, t, KP)
        for p in tl.static_range(PASSES):
            # bins from the top: counts[i] = entries in bin NBINS - 1 - i
            counts = tl.load(hist_ptr + (p * K + t) * NBINS + (NBINS - 1 - cols))
            at_or_above = tl.cumsum(counts, axis=0)
            above = at_or_above < rank  # the bins wholly above the wanted entry
            digit = NBINS - 1 - tl.sum(above.to(tl.int32), axis=0)
            rank = rank - tl.sum(tl.where(above, counts, 0), axis=0)
            if p == 2:
                prefix = (prefix << 9) | digit
            else:
                prefix = (prefix << 11) | digit
        prefixes = tl.where(rows == t, prefix, prefixes)
        left = tl.where(rows == t, rank, left)
    return prefixes, left


@triton.jit
def select_state_all(hist_ptr, ranks, K: tl.constexpr, KP: tl.constexpr, PASSES: tl.constexpr):
    """:func:`select_state` over every agent's row at once (``K x NBINS`` counts in registers, the agents' scans
    side by side): for a single program with many warps, where the scans' latency is the launch's."""
    rows = tl.arange(0, KP)
    cols = tl.arange(0, NBINS)
    prefix = tl.zeros([KP], dtype=tl.int32)
    rank = ranks
    for p in tl.static_range(PASSES):
        # bins from the top: counts[r, i] = entries of row r in bin NBINS - 1 - i
        counts = tl.load(
            hist_ptr + (p * K + rows[:, None]) * NBINS + (NBINS - 1 - cols[None, :]), mask=rows[:, None] < K, other=0
        )
        at_or_above = tl.cumsum(counts, axis=1)
        above = at_or_above < rank[:, None]
        digit = NBINS - 1 - tl.sum(above.to(tl.int32), axis=1)
        rank = rank - tl.sum(tl.where(above, counts, 0), axis=1)
        if p == 2:
            prefix = (prefix << 9) | digit
        else:
            prefix = (prefix << 11) | digit
    return prefix, rank


@triton.jit
def _agent_histogram(
    acc, t: tl.constexpr, agent_ptr, offs, inb, b, prefix, K: tl.constexpr, KP: tl.constexpr,
    ACTIVE: tl.constexpr, PASS: tl.constexpr, SHIFT: tl.constexpr, DIGIT_MASK: tl.constexpr,
    MATCH_SHIFT: tl.constexpr, MASKED: tl.constexpr,
):  # fmt: skip
    """``acc`` plus this block's histogram of agent ``t``'s digits (entries whose higher digits match only)."""
    if t < K:
        if (ACTIVE >> t) & 1:
            d = load(agent_ptr, offs, inb, MASKED) - b
            bits = d.to(tl.int32, bitcast=True) & 0x7FFFFFFF
            digit = (bits >> SHIFT) & DIGIT_MASK
            if PASS > 0:
                keep = (bits >> MATCH_SHIFT) == agent_lane(prefix, t, KP)
                if MASKED:
                    keep = keep & inb
                acc += tl.histogram(digit, NBINS, mask=keep)
            elif MASKED:
                acc += tl.histogram(digit, NBINS, mask=inb)
            else:
                acc += tl.histogram(digit, NBINS)
    return acc


@triton.jit
def _histogram_step(
    h0, h1, h2, h3, h4, h5, h6, h7, base_ptr, a0, a1, a2, a3, a4, a5, a6, a7, offs, inb, prefix,
    K: tl.constexpr, KP: tl.constexpr, ACTIVE: tl.constexpr, PASS: tl.constexpr, SHIFT: tl.constexpr,
    DIGIT_MASK: tl.constexpr, MATCH_SHIFT: tl.constexpr, MASKED: tl.constexpr,
):  # fmt: skip
    """One block's digits added to the eight agents' histograms."""
    b = load(base_ptr, offs, inb, MASKED)
    h0 = _agent_histogram(h0, 0, a0, offs, inb, b, prefix, K, KP, ACTIVE, PASS, SHIFT, DIGIT_MASK, MATCH_SHIFT, MASKED)
    h1 = _agent_histogram(h1, 1, a1, offs, inb, b, prefix, K, KP, ACTIVE, PASS, SHIFT, DIGIT_MASK, MATCH_SHIFT, MASKED)
    h2 = _agent_histogram(h2, 2, a2, offs, inb, b, prefix, K, KP, ACTIVE, PASS, SHIFT, DIGIT_MASK, MATCH_SHIFT, MASKED)
    h3 = _agent_histogram(h3, 3, a3, offs, inb, b, prefix, K, KP, ACTIVE, PASS, SHIFT, DIGIT_MASK, MATCH_SHIFT, MASKED)
    h4 = _agent_histogram(h4, 4, a4, offs, inb, b, prefix, K, KP, ACTIVE, PASS, SHIFT, DIGIT_MASK, MATCH_SHIFT, MASKED)
    h5 = _agent_histogram(h5, 5, a5, offs, inb, b, prefix, K, KP, ACTIVE, PASS, SHIFT, DIGIT_MASK, MATCH_SHIFT, MASKED)
    h6 = _agent_histogram(h6, 6, a6, offs, inb, b, prefix, K, KP, ACTIVE, PASS, SHIFT, DIGIT_MASK, MATCH_SHIFT, MASKED)
    h7 = _agent_histogram(h7, 7, a7, offs, inb, b, prefix, K, KP, ACTIVE, PASS, SHIFT, DIGIT_MASK, MATCH_SHIFT, MASKED)
    return h0, h1, h2, h3, h4, h5, h6, h7


@triton.jit
def _flush(hist_ptr, acc, t: tl.constexpr, K: tl.constexpr, ACTIVE: tl.constexpr, PASS: tl.constexpr):
    if t < K:
        if (ACTIVE >> t) & 1:
            cols = tl.arange(0, NBINS)
            tl.atomic_add(hist_ptr + (PASS * K + t) * NBINS + cols, acc, mask=acc != 0)


@triton.jit(do_not_specialize=["numel", "k0", "k1", "k2", "k3", "k4", "k5", "k6", "k7"])
def radix_histogram_kernel(
    base_ptr,
    a0, a1, a2, a3, a4, a5, a6, a7,
    hist_ptr, numel,
    k0, k1, k2, k3, k4, k5, k6, k7,
    K: tl.constexpr, KP: tl.constexpr, ACTIVE: tl.constexpr, PASS: tl.constexpr, SHIFT: tl.constexpr,
    DIGIT_MASK: tl.constexpr, MATCH_SHIFT: tl.constexpr, BLOCK: tl.constexpr,
):  # fmt: skip
    """Pass ``PASS``'s histogram, added to ``hist[PASS]`` (int32 ``[3, K, NBINS]``): per agent of the ``ACTIVE``
    bitmask, its digit ``(|τ| bits >> SHIFT) & DIGIT_MASK`` over the entries whose bits above ``MATCH_SHIFT`` equal
    those its ``k``-th largest |τ| has (found from the earlier passes)."""
    pid = tl.program_id(0)
    step = tl.num_programs(0).to(tl.int64) * BLOCK
    lane = tl.arange(0, BLOCK)
    prefix = tl.zeros([KP], dtype=tl.int32)
    if PASS > 0:
        prefix, _ = select_state(hist_ptr, vector8(KP, k0, k1, k2, k3, k4, k5, k6, k7), K, KP, PASS)
    h0 = tl.zeros([NBINS], dtype=tl.int32)
    h1 = tl.zeros([NBINS], dtype=tl.int32)
    h2 = tl.zeros([NBINS], dtype=tl.int32)
    h3 = tl.zeros([NBINS], dtype=tl.int32)
    h4 = tl.zeros([NBINS], dtype=tl.int32)
    h5 = tl.zeros([NBINS], dtype=tl.int32)
    h6 = tl.zeros([NBINS], dtype=tl.int32)
    h7 = tl.zeros([NBINS], dtype=tl.int32)
    whole = numel // BLOCK * BLOCK
    for start in tl.range(pid.to(tl.int64) * BLOCK, whole, step):  # the whole blocks, unmasked
        offs = start + lane
        h0, h1, h2, h3, h4, h5, h6, h7 = _histogram_step(
            h0, h1, h2, h3, h4, h5, h6, h7, base_ptr, a0, a1, a2, a3, a4, a5, a6, a7, offs, offs < numel, prefix,
            K, KP, ACTIVE, PASS, SHIFT, DIGIT_MASK, MATCH_SHIFT, False,
        )  # fmt: skip
    if (whole < numel) & (pid == (numel // BLOCK) % tl.num_programs(0)):  # a partial last block
        offs = whole + lane
        h0, h1, h2, h3, h4, h5, h6, h7 = _histogram_step(
            h0, h1, h2, h3, h4, h5, h6, h7, base_ptr, a0, a1, a2, a3, a4, a5, a6, a7, offs, offs < numel, prefix,
            K, KP, ACTIVE, PASS, SHIFT, DIGIT_MASK, MATCH_SHIFT, True,
        )  # fmt: skip
    _flush(hist_ptr, h0, 0, K, ACTIVE, PASS)
    _flush(hist_ptr, h1, 1, K, ACTIVE, PASS)
    _flush(hist_ptr, h2, 2, K, ACTIVE, PASS)
    _flush(hist_ptr, h3, 3, K, ACTIVE, PASS)
    _flush(hist_ptr, h4, 4, K, ACTIVE, PASS)
    _flush(hist_ptr, h5, 5, K, ACTIVE, PASS)
    _flush(hist_ptr, h6, 6, K, ACTIVE, PASS)
    _flush(hist_ptr, h7, 7, K, ACTIVE, PASS)


@triton.jit(do_not_specialize=[f"k{t}" for t in range(8)])
def select_thresholds_kernel(
    hist_ptr, thr_ptr,
    k0, k1, k2, k3, k4, k5, k6, k7,
    K: tl.constexpr, KP: tl.constexpr, TRIM: tl.constexpr,
):  # fmt: skip
    """``thr`` (float32 ``[K]``): the ``k_t``-th largest |τ| of each agent of the ``TRIM`` bitmask, from the three
    passes' histograms (one program); the other agents' entries are left as they are."""
    rows = tl.arange(0, KP)
    bits, _ = select_state_all(hist_ptr, vector8(KP, k0, k1, k2, k3, k4, k5, k6, k7), K, KP, 3)
    tl.store(thr_ptr + rows, bits.to(tl.float32, bitcast=True), mask=(rows < K) & (((TRIM >> rows) & 1) != 0))
