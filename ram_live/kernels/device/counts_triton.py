"""The activity counts of one tensor as a Triton kernel (:func:`activity_counts_kernel`), for RAM's statistics
pass (``ram_live::ram_counts_``) and the probe (``ram_live::probe_counts_``): per agent its active and unique
entries and the histogram of the active count c; with ``PAIRS`` (the probe) also the pairwise intersections of
the activity masks and the Gram matrix Σ τ_i·τ_j of the raw task vectors in float64 (the products of float32
entries exact; the sums in another order than the CPU's, so within float64 rounding of it).

One read of every input, 16 bytes of each per thread and step (128-bit loads); every program walks a strided
share of the tensor. Each entry's activity pattern (bit t: agent t active) goes into a per-program histogram of
the 2^K patterns (``tl.histogram``), from which the program derives every count once, at its end: no reduction
across threads per step. The probe's Gram sums are kept per thread (one float64 per pair of agents), summed
across threads once at the end."""

from __future__ import annotations

import triton
import triton.language as tl

from .common import agent_args, block_size, device_programs, register_cap
from .triton_common import jit, load

__all__ = ["activity_counts_kernel", "launch_activity_counts"]

#: Warps per program of the counting kernel.
COUNT_WARPS = 4


@triton.jit
def _agent(
    t: tl.constexpr, agent_ptr, offs, inb, b, eps, K: tl.constexpr, EPS_ZERO: tl.constexpr, MASKED: tl.constexpr
):
    """Agent ``t``'s raw τ (zeros past the K agents), its activity bit in the pattern, and where it is NaN/Inf."""
    raw = tl.zeros(offs.shape, dtype=tl.float32)
    bit = tl.zeros(offs.shape, dtype=tl.int32)
    bad = tl.zeros(offs.shape, dtype=tl.int1)
    if t < K:
        a = load(agent_ptr, offs, inb, MASKED)
        raw = a - b
        d = raw
        bad = (a != a) | (tl.abs(a) == float("inf")) | (tl.abs(raw) == float("inf"))
        if not EPS_ZERO:
            d = tl.where((d >= -eps) & (d <= eps), 0.0, d)
        bit = (d != 0).to(tl.int32) << t
    return raw, bit, bad


@triton.jit
def _pair(ri, rj, i: tl.constexpr, j: tl.constexpr, K: tl.constexpr):
    """Σ over each thread's entries of τ_i·τ_j in float64 (zero for agents past K)."""
    if j < K:
        return tl.sum(ri.to(tl.float64) * rj.to(tl.float64), axis=1)
    else:
        return tl.zeros([ri.shape[0]], dtype=tl.float64)


@triton.jit
def _flush_pair(gram_ptr, g, i: tl.constexpr, j: tl.constexpr, K: tl.constexpr):
    if j < K:
        total = tl.sum(g, axis=0)
        tl.atomic_add(gram_ptr + i * K + j, total)
        if i != j:
            tl.atomic_add(gram_ptr + j * K + i, total)


@triton.jit
def _step(
    base_ptr, a0, a1, a2, a3, a4, a5, a6, a7, offs, inb, eps,
    K: tl.constexpr, NP: tl.constexpr, EPS_ZERO: tl.constexpr, MASKED: tl.constexpr,
):  # fmt: skip
    """One block: the histogram of its activity patterns, each thread's NaN/Inf count, and the agents' raw τ."""
    b = load(base_ptr, offs, inb, MASKED)
    bad = (b != b) | (tl.abs(b) == float("inf"))
    r0, p0, e0 = _agent(0, a0, offs, inb, b, eps, K, EPS_ZERO, MASKED)
    r1, p1, e1 = _agent(1, a1, offs, inb, b, eps, K, EPS_ZERO, MASKED)
    r2, p2, e2 = _agent(2, a2, offs, inb, b, eps, K, EPS_ZERO, MASKED)
    r3, p3, e3 = _agent(3, a3, offs, inb, b, eps, K, EPS_ZERO, MASKED)
    r4, p4, e4 = _agent(4, a4, offs, inb, b, eps, K, EPS_ZERO, MASKED)
    r5, p5, e5 = _agent(5, a5, offs, inb, b, eps, K, EPS_ZERO, MASKED)
    r6, p6, e6 = _agent(6, a6, offs, inb, b, eps, K, EPS_ZERO, MASKED)
    r7, p7, e7 = _agent(7, a7, offs, inb, b, eps, K, EPS_ZERO, MASKED)
    pattern = (p0 | p1 | p2 | p3 | p4 | p5 | p6 | p7).reshape([offs.shape[0] * offs.shape[1]])
    bad = bad | e0 | e1 | e2 | e3 | e4 | e5 | e6 | e7
    if MASKED:
        counted = tl.histogram(pattern, NP, mask=inb.reshape([offs.shape[0] * offs.shape[1]]))
        bad = bad & inb
    else:
        counted = tl.histogram(pattern, NP)
    return counted, tl.sum(bad.to(tl.int32), axis=1), r0, r1, r2, r3, r4, r5, r6, r7


@jit(do_not_specialize=["numel"], aligned_anyhow=("counts_ptr", "gram_ptr", "bad_ptr"))
def activity_counts_kernel(
    base_ptr,
    a0, a1, a2, a3, a4, a5, a6, a7,
    counts_ptr, gram_ptr, bad_ptr, numel, eps,
    K: tl.constexpr, KP: tl.constexpr, NP: tl.constexpr, PAIRS: tl.constexpr, EPS_ZERO: tl.constexpr,
    ROWS: tl.constexpr, VEC: tl.constexpr,
):  # fmt: skip
    """``counts`` (int64, added to): ``[K]`` active, ``[K]`` unique, ``[K + 1]`` histogram and, with ``PAIRS``,
    ``[K, K]`` intersections; ``gram`` (float64 ``[K, K]``, added to; None without ``PAIRS``). NaN/Inf inputs and
    task vectors are counted into ``bad``. ``KP``: K rounded up to a power of two (at least 2); ``NP``: 2^K
    patterns (at least 2); each step reads ``ROWS`` x ``VEC`` entries, ``VEC`` contiguous ones per thread."""
    BLOCK: tl.constexpr = ROWS * VEC
    pid = tl.program_id(0)
    step = tl.num_programs(0).to(tl.int64) * BLOCK
    lane = tl.arange(0, ROWS)[:, None] * VEC + tl.arange(0, VEC)[None, :]
    patterns = tl.zeros([NP], dtype=tl.int32)
    invalid = tl.zeros([ROWS], dtype=tl.int32)
    g00 = tl.zeros([ROWS], dtype=tl.float64)
    g01 = tl.zeros([ROWS], dtype=tl.float64)
    g02 = tl.zeros([ROWS], dtype=tl.float64)
    g03 = tl.zeros([ROWS], dtype=tl.float64)
    g04 = tl.zeros([ROWS], dtype=tl.float64)
    g05 = tl.zeros([ROWS], dtype=tl.float64)
    g06 = tl.zeros([ROWS], dtype=tl.float64)
    g07 = tl.zeros([ROWS], dtype=tl.float64)
    g11 = tl.zeros([ROWS], dtype=tl.float64)
    g12 = tl.zeros([ROWS], dtype=tl.float64)
    g13 = tl.zeros([ROWS], dtype=tl.float64)
    g14 = tl.zeros([ROWS], dtype=tl.float64)
    g15 = tl.zeros([ROWS], dtype=tl.float64)
    g16 = tl.zeros([ROWS], dtype=tl.float64)
    g17 = tl.zeros([ROWS], dtype=tl.float64)
    g22 = tl.zeros([ROWS], dtype=tl.float64)
    g23 = tl.zeros([ROWS], dtype=tl.float64)
    g24 = tl.zeros([ROWS], dtype=tl.float64)
    g25 = tl.zeros([ROWS], dtype=tl.float64)
    g26 = tl.zeros([ROWS], dtype=tl.float64)
    g27 = tl.zeros([ROWS], dtype=tl.float64)
    g33 = tl.zeros([ROWS], dtype=tl.float64)
    g34 = tl.zeros([ROWS], dtype=tl.float64)
    g35 = tl.zeros([ROWS], dtype=tl.float64)
    g36 = tl.zeros([ROWS], dtype=tl.float64)
    g37 = tl.zeros([ROWS], dtype=tl.float64)
    g44 = tl.zeros([ROWS], dtype=tl.float64)
    g45 = tl.zeros([ROWS], dtype=tl.float64)
    g46 = tl.zeros([ROWS], dtype=tl.float64)
    g47 = tl.zeros([ROWS], dtype=tl.float64)
    g55 = tl.zeros([ROWS], dtype=tl.float64)
    g56 = tl.zeros([ROWS], dtype=tl.float64)
    g57 = tl.zeros([ROWS], dtype=tl.float64)
    g66 = tl.zeros([ROWS], dtype=tl.float64)
    g67 = tl.zeros([ROWS], dtype=tl.float64)
    g77 = tl.zeros([ROWS], dtype=tl.float64)
    whole = numel // BLOCK * BLOCK
    for start in tl.range(pid.to(tl.int64) * BLOCK, whole, step):  # the whole blocks, unmasked
        offs = start + lane
        counted, bad, r0, r1, r2, r3, r4, r5, r6, r7 = _step(
            base_ptr, a0, a1, a2, a3, a4, a5, a6, a7, offs, offs < numel, eps, K, NP, EPS_ZERO, False
        )
        patterns += counted
        invalid += bad
        if PAIRS:
            g00 += _pair(r0, r0, 0, 0, K)
            g01 += _pair(r0, r1, 0, 1, K)
            g02 += _pair(r0, r2, 0, 2, K)
            g03 += _pair(r0, r3, 0, 3, K)
            g04 += _pair(r0, r4, 0, 4, K)
            g05 += _pair(r0, r5, 0, 5, K)
            g06 += _pair(r0, r6, 0, 6, K)
            g07 += _pair(r0, r7, 0, 7, K)
            g11 += _pair(r1, r1, 1, 1, K)
            g12 += _pair(r1, r2, 1, 2, K)
            g13 += _pair(r1, r3, 1, 3, K)
            g14 += _pair(r1, r4, 1, 4, K)
            g15 += _pair(r1, r5, 1, 5, K)
            g16 += _pair(r1, r6, 1, 6, K)
            g17 += _pair(r1, r7, 1, 7, K)
            g22 += _pair(r2, r2, 2, 2, K)
            g23 += _pair(r2, r3, 2, 3, K)
            g24 += _pair(r2, r4, 2, 4, K)
            g25 += _pair(r2, r5, 2, 5, K)
            g26 += _pair(r2, r6, 2, 6, K)
            g27 += _pair(r2, r7, 2, 7, K)
            g33 += _pair(r3, r3, 3, 3, K)
            g34 += _pair(r3, r4, 3, 4, K)
            g35 += _pair(r3, r5, 3, 5, K)
            g36 += _pair(r3, r6, 3, 6, K)
            g37 += _pair(r3, r7, 3, 7, K)
            g44 += _pair(r4, r4, 4, 4, K)
            g45 += _pair(r4, r5, 4, 5, K)
            g46 += _pair(r4, r6, 4, 6, K)
            g47 += _pair(r4, r7, 4, 7, K)
            g55 += _pair(r5, r5, 5, 5, K)
            g56 += _pair(r5, r6, 5, 6, K)
            g57 += _pair(r5, r7, 5, 7, K)
            g66 += _pair(r6, r6, 6, 6, K)
            g67 += _pair(r6, r7, 6, 7, K)
            g77 += _pair(r7, r7, 7, 7, K)
    if (whole < numel) & (pid == (numel // BLOCK) % tl.num_programs(0)):  # a partial last block
        offs = whole + lane
        counted, bad, r0, r1, r2, r3, r4, r5, r6, r7 = _step(
            base_ptr, a0, a1, a2, a3, a4, a5, a6, a7, offs, offs < numel, eps, K, NP, EPS_ZERO, True
        )
        patterns += counted
        invalid += bad
        if PAIRS:
            g00 += _pair(r0, r0, 0, 0, K)
            g01 += _pair(r0, r1, 0, 1, K)
            g02 += _pair(r0, r2, 0, 2, K)
            g03 += _pair(r0, r3, 0, 3, K)
            g04 += _pair(r0, r4, 0, 4, K)
            g05 += _pair(r0, r5, 0, 5, K)
            g06 += _pair(r0, r6, 0, 6, K)
            g07 += _pair(r0, r7, 0, 7, K)
            g11 += _pair(r1, r1, 1, 1, K)
            g12 += _pair(r1, r2, 1, 2, K)
            g13 += _pair(r1, r3, 1, 3, K)
            g14 += _pair(r1, r4, 1, 4, K)
            g15 += _pair(r1, r5, 1, 5, K)
            g16 += _pair(r1, r6, 1, 6, K)
            g17 += _pair(r1, r7, 1, 7, K)
            g22 += _pair(r2, r2, 2, 2, K)
            g23 += _pair(r2, r3, 2, 3, K)
            g24 += _pair(r2, r4, 2, 4, K)
            g25 += _pair(r2, r5, 2, 5, K)
            g26 += _pair(r2, r6, 2, 6, K)
            g27 += _pair(r2, r7, 2, 7, K)
            g33 += _pair(r3, r3, 3, 3, K)
            g34 += _pair(r3, r4, 3, 4, K)
            g35 += _pair(r3, r5, 3, 5, K)
            g36 += _pair(r3, r6, 3, 6, K)
            g37 += _pair(r3, r7, 3, 7, K)
            g44 += _pair(r4, r4, 4, 4, K)
            g45 += _pair(r4, r5, 4, 5, K)
            g46 += _pair(r4, r6, 4, 6, K)
            g47 += _pair(r4, r7, 4, 7, K)
            g55 += _pair(r5, r5, 5, 5, K)
            g56 += _pair(r5, r6, 5, 6, K)
            g57 += _pair(r5, r7, 5, 7, K)
            g66 += _pair(r6, r6, 6, 6, K)
            g67 += _pair(r6, r7, 6, 7, K)
            g77 += _pair(r7, r7, 7, 7, K)
    n_bad = tl.sum(invalid, axis=0)
    tl.atomic_add(bad_ptr, n_bad.to(tl.int64), mask=n_bad > 0)
    _flush_counts(counts_ptr, patterns, K, KP, NP, PAIRS)
    if PAIRS:
        _flush_pair(gram_ptr, g00, 0, 0, K)
        _flush_pair(gram_ptr, g01, 0, 1, K)
        _flush_pair(gram_ptr, g02, 0, 2, K)
        _flush_pair(gram_ptr, g03, 0, 3, K)
        _flush_pair(gram_ptr, g04, 0, 4, K)
        _flush_pair(gram_ptr, g05, 0, 5, K)
        _flush_pair(gram_ptr, g06, 0, 6, K)
        _flush_pair(gram_ptr, g07, 0, 7, K)
        _flush_pair(gram_ptr, g11, 1, 1, K)
        _flush_pair(gram_ptr, g12, 1, 2, K)
        _flush_pair(gram_ptr, g13, 1, 3, K)
        _flush_pair(gram_ptr, g14, 1, 4, K)
        _flush_pair(gram_ptr, g15, 1, 5, K)
        _flush_pair(gram_ptr, g16, 1, 6, K)
        _flush_pair(gram_ptr, g17, 1, 7, K)
        _flush_pair(gram_ptr, g22, 2, 2, K)
        _flush_pair(gram_ptr, g23, 2, 3, K)
        _flush_pair(gram_ptr, g24, 2, 4, K)
        _flush_pair(gram_ptr, g25, 2, 5, K)
        _flush_pair(gram_ptr, g26, 2, 6, K)
        _flush_pair(gram_ptr, g27, 2, 7, K)
        _flush_pair(gram_ptr, g33, 3, 3, K)
        _flush_pair(gram_ptr, g34, 3, 4, K)
        _flush_pair(gram_ptr, g35, 3, 5, K)
        _flush_pair(gram_ptr, g36, 3, 6, K)
        _flush_pair(gram_ptr, g37, 3, 7, K)
        _flush_pair(gram_ptr, g44, 4, 4, K)
        _flush_pair(gram_ptr, g45, 4, 5, K)
        _flush_pair(gram_ptr, g46, 4, 6, K)
        _flush_pair(gram_ptr, g47, 4, 7, K)
        _flush_pair(gram_ptr, g55, 5, 5, K)
        _flush_pair(gram_ptr, g56, 5, 6, K)
        _flush_pair(gram_ptr, g57, 5, 7, K)
        _flush_pair(gram_ptr, g66, 6, 6, K)
        _flush_pair(gram_ptr, g67, 6, 7, K)
        _flush_pair(gram_ptr, g77, 7, 7, K)


@triton.jit
def _flush_counts(counts_ptr, patterns, K: tl.constexpr, KP: tl.constexpr, NP: tl.constexpr, PAIRS: tl.constexpr):
    """A program's counts from its histogram of activity patterns ``patterns[p]`` (bit t of p: agent t active),
    added to ``counts``: active_t = Σ patterns of bit t; unique_t = patterns[2^t]; histogram[c] = Σ patterns of
    c bits; intersections[i, j] = Σ patterns of bits i and j."""
    p = tl.arange(0, NP)
    col = tl.arange(0, KP)
    col16 = tl.arange(0, 16)
    bits = (p[:, None] >> col[None, :]) & 1
    h = patterns[:, None]
    active = tl.sum(h * bits, axis=0)
    unique = tl.sum(tl.where(p[:, None] == (1 << col)[None, :], h, 0), axis=0)
    ones = tl.sum(bits, axis=1)
    histogram = tl.sum(tl.where(ones[:, None] == col16[None, :], h, 0), axis=0)
    tl.atomic_add(counts_ptr + col, active.to(tl.int64), mask=(col < K) & (active != 0))
    tl.atomic_add(counts_ptr + K + col, unique.to(tl.int64), mask=(col < K) & (unique != 0))
    tl.atomic_add(counts_ptr + 2 * K + col16, histogram.to(tl.int64), mask=(col16 <= K) & (histogram != 0))
    if PAIRS:
        for i in tl.static_range(K):
            inter = tl.sum(h * bits * ((p >> i) & 1)[:, None], axis=0)
            tl.atomic_add(counts_ptr + 3 * K + 1 + i * K + col, inter.to(tl.int64), mask=(col < K) & (inter != 0))


def launch_activity_counts(base, agents, eps, counts, gram, invalid, *, programs_per_sm: int) -> None:
    """:func:`activity_counts_kernel` over one flat tensor, ``programs_per_sm`` programs per multiprocessor walking
    strided shares of it; ``gram`` None: the counts alone (RAM's statistics), else also the pairs (the probe)."""
    k, numel = len(agents), base.numel()
    block = block_size([base, *agents], COUNT_WARPS)
    activity_counts_kernel[(device_programs(base.device, numel, block, programs_per_sm),)](
        base, *agent_args(agents), counts, gram, invalid, numel, float(eps),
        K=k, KP=max(2, 1 << (k - 1).bit_length()), NP=max(2, 1 << k), PAIRS=gram is not None, EPS_ZERO=eps == 0,
        ROWS=32 * COUNT_WARPS, VEC=block // (32 * COUNT_WARPS), num_warps=COUNT_WARPS,
        **register_cap(base.device),
    )  # fmt: skip
