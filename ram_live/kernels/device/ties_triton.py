"""TIES and DARE-TIES as one Triton kernel (:func:`ties_merge_kernel`): trim (each agent's threshold, selected
once per tensor by :func:`.select_triton.select_thresholds_kernel`) or DARE's drop, sign election and the disjoint
mean, in one read of the inputs and one write of the output. The operations are those of
:func:`ram_live.functional.ties_combine` in its order (sums from zero, agent by agent), in float32 with IEEE
division and no fused multiply-add. Each program merges one block of the tensor, unmasked but for a partial last
block."""

from __future__ import annotations

import triton
import triton.language as tl

from .linear_triton import dare_drop, load_delta
from .triton_common import add_invalid, jit, load, pick, store_out

__all__ = ["ties_merge_kernel"]


@triton.jit
def _sign(x):
    """torch.sign: 1, -1, or 0 (for ±0 and NaN)."""
    return tl.where(x > 0, 1.0, tl.where(x < 0, -1.0, 0.0))


@triton.jit
def _agent_delta(
    t: tl.constexpr, agent_ptr, offs, inb, b, thr_ptr, seed, density, K: tl.constexpr, TRIM: tl.constexpr,
    NONE_KEPT: tl.constexpr, DROP: tl.constexpr, MASKED: tl.constexpr,
):  # fmt: skip
    """Agent ``t``'s τ, trimmed (``TRIM``: below its selected threshold; ``NONE_KEPT``: every finite entry) or
    dropped (``DROP``), and its NaN/Inf count; zeros past the K agents."""
    d = tl.zeros(offs.shape, dtype=tl.float32)
    bad = tl.zeros(offs.shape, dtype=tl.int32)
    if t < K:
        d, bad = load_delta(agent_ptr, offs, inb, b, MASKED)
        if (TRIM >> t) & 1:
            d = tl.where(tl.abs(d) < tl.load(thr_ptr + t), 0.0, d)
        if (NONE_KEPT >> t) & 1:
            d = tl.where(tl.abs(d) < float("inf"), 0.0, d)
        if (DROP >> t) & 1:
            d = dare_drop(d, seed, density, offs)
    return d, bad


@jit(do_not_specialize=["numel", *(f"s{t}" for t in range(8))], aligned_anyhow=("bad_ptr", "thr_ptr"))
def ties_merge_kernel(
    out_ptr, base_ptr,
    a0, a1, a2, a3, a4, a5, a6, a7,
    w_ptr, thr_ptr, bad_ptr, numel, scale,
    s0, s1, s2, s3, s4, s5, s6, s7,
    q0, q1, q2, q3, q4, q5, q6, q7,
    K: tl.constexpr, TRIM: tl.constexpr, NONE_KEPT: tl.constexpr, DROP: tl.constexpr,
    SCALED: tl.constexpr, FREQUENCY: tl.constexpr, WEIGHTED: tl.constexpr, DIVIDE: tl.constexpr,
    OUT_BF16: tl.constexpr, BLOCK: tl.constexpr,
):  # fmt: skip
    """θ* = θ₀ + scale · TIES(τ) per entry: ``FREQUENCY`` elects by sign counts (else by the sum), ``WEIGHTED``
    elects on w_t τ_t; ``DIVIDE`` 0 divides the agreeing weighted sum by the agreeing count, 1 by their weights, 2
    not at all. Agents of ``TRIM`` keep |τ| at or above their threshold ``thr[t]`` (float32 ``[K]``), of
    ``NONE_KEPT`` nothing finite, of ``DROP`` DARE's survivors (seed ``s_t``, density ``q_t``). Adds to ``bad`` the
    NaN/Inf task vectors and outputs."""
    pid = tl.program_id(0).to(tl.int64)
    offs = pid * BLOCK + tl.arange(0, BLOCK)
    inb = offs < numel
    if (pid + 1) * BLOCK <= numel:
        invalid = _ties_block(
            out_ptr, base_ptr, a0, a1, a2, a3, a4, a5, a6, a7, w_ptr, thr_ptr, offs, inb, scale, s0, s1, s2, s3, s4,
            s5, s6, s7, q0, q1, q2, q3, q4, q5, q6, q7, K, TRIM, NONE_KEPT, DROP, SCALED, FREQUENCY, WEIGHTED,
            DIVIDE, OUT_BF16, BLOCK, False,
        )  # fmt: skip
    else:
        invalid = _ties_block(
            out_ptr, base_ptr, a0, a1, a2, a3, a4, a5, a6, a7, w_ptr, thr_ptr, offs, inb, scale, s0, s1, s2, s3, s4,
            s5, s6, s7, q0, q1, q2, q3, q4, q5, q6, q7, K, TRIM, NONE_KEPT, DROP, SCALED, FREQUENCY, WEIGHTED,
            DIVIDE, OUT_BF16, BLOCK, True,
        )  # fmt: skip
    add_invalid(bad_ptr, invalid)


@triton.jit
def _ties_block(
    out_ptr, base_ptr,
    a0, a1, a2, a3, a4, a5, a6, a7,
    w_ptr, thr_ptr, offs, inb, scale,
    s0, s1, s2, s3, s4, s5, s6, s7,
    q0, q1, q2, q3, q4, q5, q6, q7,
    K: tl.constexpr, TRIM: tl.constexpr, NONE_KEPT: tl.constexpr, DROP: tl.constexpr,
    SCALED: tl.constexpr, FREQUENCY: tl.constexpr, WEIGHTED: tl.constexpr, DIVIDE: tl.constexpr,
    OUT_BF16: tl.constexpr, BLOCK: tl.constexpr, MASKED: tl.constexpr,
):  # fmt: skip
    """One block of :func:`ties_merge_kernel`; returns its invalid entries."""
    b = load(base_ptr, offs, inb, MASKED)
    d0, e0 = _agent_delta(0, a0, offs, inb, b, thr_ptr, s0, q0, K, TRIM, NONE_KEPT, DROP, MASKED)
    d1, e1 = _agent_delta(1, a1, offs, inb, b, thr_ptr, s1, q1, K, TRIM, NONE_KEPT, DROP, MASKED)
    d2, e2 = _agent_delta(2, a2, offs, inb, b, thr_ptr, s2, q2, K, TRIM, NONE_KEPT, DROP, MASKED)
    d3, e3 = _agent_delta(3, a3, offs, inb, b, thr_ptr, s3, q3, K, TRIM, NONE_KEPT, DROP, MASKED)
    d4, e4 = _agent_delta(4, a4, offs, inb, b, thr_ptr, s4, q4, K, TRIM, NONE_KEPT, DROP, MASKED)
    d5, e5 = _agent_delta(5, a5, offs, inb, b, thr_ptr, s5, q5, K, TRIM, NONE_KEPT, DROP, MASKED)
    d6, e6 = _agent_delta(6, a6, offs, inb, b, thr_ptr, s6, q6, K, TRIM, NONE_KEPT, DROP, MASKED)
    d7, e7 = _agent_delta(7, a7, offs, inb, b, thr_ptr, s7, q7, K, TRIM, NONE_KEPT, DROP, MASKED)
    invalid = e0 + e1 + e2 + e3 + e4 + e5 + e6 + e7
    magnitude = tl.zeros([BLOCK], dtype=tl.float32)
    for t in tl.static_range(K):
        d = pick(t, d0, d1, d2, d3, d4, d5, d6, d7)
        if WEIGHTED:
            d = d * tl.load(w_ptr + t).to(tl.float32)
        if FREQUENCY:
            magnitude = magnitude + _sign(d)
        else:
            magnitude = magnitude + d
    majority = tl.where(magnitude >= 0, 1.0, -1.0)
    mixed = tl.zeros([BLOCK], dtype=tl.float32)
    norm = tl.zeros([BLOCK], dtype=tl.float32)
    for t in tl.static_range(K):
        d = pick(t, d0, d1, d2, d3, d4, d5, d6, d7)
        w = tl.load(w_ptr + t).to(tl.float32)
        agree = (_sign(d) == majority).to(tl.float32)
        mixed = mixed + (d * w) * agree
        if DIVIDE == 0:
            norm = norm + agree
        elif DIVIDE == 1:
            norm = norm + agree * w
    tau = mixed
    if DIVIDE == 0:
        tau = tl.math.div_rn(mixed, tl.maximum(norm, 1.0))
    elif DIVIDE == 1:
        tau = tl.where(norm != 0, tl.math.div_rn(mixed, tl.where(norm != 0, norm, 1.0)), 0.0)
    if SCALED:
        tau = tau * scale
    invalid += store_out(out_ptr, offs, inb, tl.where(tau != 0, tau + b, b), OUT_BF16, MASKED)
    return invalid
