"""Task arithmetic, linear and DARE-linear as one Triton kernel (:func:`linear_merge_kernel`): each input read once,
the output written once, with the CPU path's float32 operations in its order (τ_t = agent − base; DARE's
``τ_t · keep / density``; ``Σ_t τ_t · w_t`` from zero, agent by agent; ``· scale``; the base where the sum is 0),
IEEE division (``div_rn``) and no fused multiply-add (launched with ``enable_fp_fusion=False``). Also the helpers
the TIES kernel shares: the task vector with its invalid count (:func:`load_delta`) and DARE's drop
(:func:`dare_drop`, Triton's Philox ``tl.rand`` keyed by the agent's seed, counter = the flat index)."""

from __future__ import annotations

import triton
import triton.language as tl

from .triton_common import add_invalid, inside, jit, load, pick, store_out

__all__ = ["linear_merge_kernel", "load_delta", "dare_drop"]


@triton.jit
def load_delta(agent_ptr, offs, inb, b, MASKED: tl.constexpr):
    """τ = agent − base in float32, and 1 where it is NaN/Inf (a non-finite base or agent, or an overflow)."""
    d = load(agent_ptr, offs, inb, MASKED) - b
    return d, inside(~(tl.abs(d) < float("inf")), inb, MASKED)


@triton.jit
def dare_drop(d, seed, density, offs):
    """DARE: ``d · keep / density`` with ``keep = tl.rand(seed, offs) < density`` (as the CPU's ``mul_``, ``div_``)."""
    keep = (tl.rand(seed, offs.to(tl.int32)) < density).to(tl.float32)
    return tl.math.div_rn(d * keep, density)


@jit(do_not_specialize=["numel", "s0", "s1", "s2", "s3", "s4", "s5", "s6", "s7"], aligned_anyhow=("bad_ptr",))
def linear_merge_kernel(
    out_ptr, base_ptr,
    a0, a1, a2, a3, a4, a5, a6, a7,
    w_ptr, bad_ptr, numel, scale,
    s0, s1, s2, s3, s4, s5, s6, s7,
    q0, q1, q2, q3, q4, q5, q6, q7,
    K: tl.constexpr, DROP: tl.constexpr, SCALED: tl.constexpr, OUT_BF16: tl.constexpr, BLOCK: tl.constexpr,
):  # fmt: skip
    """θ* = θ₀ + scale · Σ_t w_t τ_t (``w``: float64 ``[K]``, rounded to float32 as the CPU's ``.to``); agents of
    the ``DROP`` bitmask first drop entries with their seed ``s_t`` and density ``q_t``. Adds to ``bad`` the NaN/Inf
    task vectors and outputs. Every block but a partial last one unmasked."""
    pid = tl.program_id(0).to(tl.int64)
    offs = pid * BLOCK + tl.arange(0, BLOCK)
    inb = offs < numel
    if (pid + 1) * BLOCK <= numel:
        invalid = _linear_block(
            out_ptr, base_ptr, a0, a1, a2, a3, a4, a5, a6, a7, w_ptr, offs, inb, scale, s0, s1, s2, s3, s4, s5, s6,
            s7, q0, q1, q2, q3, q4, q5, q6, q7, K, DROP, SCALED, OUT_BF16, BLOCK, False,
        )  # fmt: skip
    else:
        invalid = _linear_block(
            out_ptr, base_ptr, a0, a1, a2, a3, a4, a5, a6, a7, w_ptr, offs, inb, scale, s0, s1, s2, s3, s4, s5, s6,
            s7, q0, q1, q2, q3, q4, q5, q6, q7, K, DROP, SCALED, OUT_BF16, BLOCK, True,
        )  # fmt: skip
    add_invalid(bad_ptr, invalid)


@triton.jit
def _linear_block(
    out_ptr, base_ptr,
    a0, a1, a2, a3, a4, a5, a6, a7,
    w_ptr, offs, inb, scale,
    s0, s1, s2, s3, s4, s5, s6, s7,
    q0, q1, q2, q3, q4, q5, q6, q7,
    K: tl.constexpr, DROP: tl.constexpr, SCALED: tl.constexpr, OUT_BF16: tl.constexpr, BLOCK: tl.constexpr,
    MASKED: tl.constexpr,
):  # fmt: skip
    """One block of :func:`linear_merge_kernel`; returns its invalid entries."""
    b = load(base_ptr, offs, inb, MASKED)
    acc = tl.zeros([BLOCK], dtype=tl.float32)
    invalid = tl.zeros([BLOCK], dtype=tl.int32)
    for t in tl.static_range(K):
        d, bad = load_delta(pick(t, a0, a1, a2, a3, a4, a5, a6, a7), offs, inb, b, MASKED)
        invalid += bad
        if (DROP >> t) & 1:
            d = dare_drop(d, pick(t, s0, s1, s2, s3, s4, s5, s6, s7), pick(t, q0, q1, q2, q3, q4, q5, q6, q7), offs)
        acc = acc + d * tl.load(w_ptr + t).to(tl.float32)
    if SCALED:
        acc = acc * scale
    invalid += store_out(out_ptr, offs, inb, tl.where(acc != 0, acc + b, b), OUT_BF16, MASKED)
    return invalid
