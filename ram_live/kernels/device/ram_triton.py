"""RAM's family as a Triton kernel: the merge (:func:`ram_merge_kernel`: plain, λ, ``shared="sign"``, importances;
the statistics pass's counts are :mod:`.counts_triton`'s, shared with the probe). It reads every input once and
writes its output once, in float32, with the operations of
:class:`~ram_live.methods.ram.accumulators.RamAccumulator` (and its weighted subclass) in the same order, so that
its bits are the CPU path's: IEEE division (``div_rn``), no fused multiply-add (launched with
``enable_fp_fusion=False``), the output rounded to nearest even."""

from __future__ import annotations

import triton
import triton.language as tl

from .common import agent_args, block_size, kernel_out, register_cap
from .triton_common import add_invalid, inside, jit, load, pick, store_out

__all__ = ["launch_ram_merge", "ram_merge_kernel"]

#: Warps per program of the merge kernel (each program merges one block of the tensor).
MERGE_WARPS = 4


@triton.jit
def _active_delta(agent_ptr, offs, inb, b, eps, EPS_ZERO: tl.constexpr, MASKED: tl.constexpr):
    """τ = agent − base in float32, zeroed where |τ| <= eps (``hardshrink``; kept NaN)."""
    d = load(agent_ptr, offs, inb, MASKED) - b
    if not EPS_ZERO:
        d = tl.where((d >= -eps) & (d <= eps), 0.0, d)
    return d


@jit(do_not_specialize=["numel"], aligned_anyhow=("bad_ptr",))
def ram_merge_kernel(
    out_ptr, base_ptr,
    a0, a1, a2, a3, a4, a5, a6, a7,
    h0, h1, h2, h3, h4, h5, h6, h7,
    lam_ptr, bad_ptr, numel, eps,
    K: tl.constexpr, SCALED: tl.constexpr, SIGN: tl.constexpr, WEIGHTED: tl.constexpr,
    EPS_ZERO: tl.constexpr, OUT_BF16: tl.constexpr, BLOCK: tl.constexpr,
):  # fmt: skip
    """θ* = θ₀ − m per entry, m the accumulator's negated τ* (Σ −τ over the active agents divided by their
    count or weight, λ_t·(−τ_t) where one agent alone is active, the elected side's mean with ``SIGN``). Every
    block but a partial last one unmasked."""
    pid = tl.program_id(0).to(tl.int64)
    offs = pid * BLOCK + tl.arange(0, BLOCK)
    inb = offs < numel
    if (pid + 1) * BLOCK <= numel:
        invalid = _merge_block(
            out_ptr, base_ptr, a0, a1, a2, a3, a4, a5, a6, a7, h0, h1, h2, h3, h4, h5, h6, h7, lam_ptr, offs, inb,
            eps, K, SCALED, SIGN, WEIGHTED, EPS_ZERO, OUT_BF16, BLOCK, False,
        )  # fmt: skip
    else:
        invalid = _merge_block(
            out_ptr, base_ptr, a0, a1, a2, a3, a4, a5, a6, a7, h0, h1, h2, h3, h4, h5, h6, h7, lam_ptr, offs, inb,
            eps, K, SCALED, SIGN, WEIGHTED, EPS_ZERO, OUT_BF16, BLOCK, True,
        )  # fmt: skip
    add_invalid(bad_ptr, invalid)


@triton.jit
def _merge_block(
    out_ptr, base_ptr,
    a0, a1, a2, a3, a4, a5, a6, a7,
    h0, h1, h2, h3, h4, h5, h6, h7,
    lam_ptr, offs, inb, eps,
    K: tl.constexpr, SCALED: tl.constexpr, SIGN: tl.constexpr, WEIGHTED: tl.constexpr,
    EPS_ZERO: tl.constexpr, OUT_BF16: tl.constexpr, BLOCK: tl.constexpr, MASKED: tl.constexpr,
):  # fmt: skip
    """One block of :func:`ram_merge_kernel`; returns its invalid entries."""
    b = load(base_ptr, offs, inb, MASKED)
    zero = tl.zeros([BLOCK], dtype=tl.float32)
    neg, cnt, lam_sum = zero, zero, zero
    p_neg, p_w, n_neg, n_w = zero, zero, zero, zero
    total, top = zero, zero
    invalid = tl.zeros([BLOCK], dtype=tl.int32)
    for t in tl.static_range(K):
        d = _active_delta(pick(t, a0, a1, a2, a3, a4, a5, a6, a7), offs, inb, b, eps, EPS_ZERO, MASKED)
        m = (d != 0).to(tl.float32)
        cnt = cnt + m
        if SCALED:
            lam_sum = lam_sum + m * tl.load(lam_ptr + t)
        if WEIGHTED:
            h = load(pick(t, h0, h1, h2, h3, h4, h5, h6, h7), offs, inb, MASKED)
            invalid += inside((~(h >= 0.0)) | (h == float("inf")), inb, MASKED)
            if t == 0:
                top = h * m
                w = m
            else:
                up = (h > top) & (m != 0)
                r = tl.where(up, tl.math.div_rn(top, h), 1.0)
                neg = neg * r
                total = total * r
                if SIGN:
                    p_neg, p_w, n_neg, n_w = p_neg * r, p_w * r, n_neg * r, n_w * r
                top = tl.where(up, h, top)
                w = tl.where((top > 0) & (m != 0), tl.math.div_rn(h, top), m)
            wd = w * d
            neg = neg - wd
            total = total + w
            if SIGN:
                pos = (d > 0).to(tl.float32)
                p_neg = p_neg - wd * pos
                p_w = p_w + w * pos
                negative = (d < 0).to(tl.float32)
                n_neg = n_neg - wd * negative
                n_w = n_w + w * negative
        else:
            neg = neg - d
            if SIGN:
                pos = (d > 0).to(tl.float32)
                p_neg = p_neg - d * pos
                p_w = p_w + pos
                n_neg = n_neg - d * (d < 0).to(tl.float32)
    norm = tl.maximum(total, 1.0) if WEIGHTED else tl.maximum(cnt, 1.0)
    mean = tl.math.div_rn(neg, norm)
    if SIGN:
        if not WEIGHTED:
            n_w = cnt - p_w
        mean = tl.where(neg > 0, tl.math.div_rn(n_neg, n_w), mean)
        mean = tl.where(neg < 0, tl.math.div_rn(p_neg, p_w), mean)
    if SCALED:
        mean = tl.where(cnt == 1.0, lam_sum * neg, mean)
    invalid += store_out(out_ptr, offs, inb, b - mean, OUT_BF16, MASKED)
    return invalid


def launch_ram_merge(out, base, agents, importances, lambdas, eps, sign, invalid) -> None:
    """:func:`ram_merge_kernel` over one flat tensor, one block per program (ram_live::ram_merge_'s arguments)."""
    written, bf16 = kernel_out(out)
    numel = base.numel()
    block = block_size([base, *agents, *importances], MERGE_WARPS)
    ram_merge_kernel[(max(1, -(-numel // block)),)](
        written, base, *agent_args(agents), *agent_args(importances), lambdas, invalid, numel, float(eps),
        K=len(agents), SCALED=lambdas is not None, SIGN=sign, WEIGHTED=bool(importances), EPS_ZERO=eps == 0,
        OUT_BF16=bf16, BLOCK=block, num_warps=MERGE_WARPS, enable_fp_fusion=False,
        **register_cap(base.device),
    )  # fmt: skip
