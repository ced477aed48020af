"""Comparisons of a device's results with the CPU's and with a float64 reference: distances in units in the last
place (ULP) of the output dtype, bit equality where the spec makes a result exact, and exact counts."""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

__all__ = ["TOLERANCE_ULP", "compare_outputs", "exact_counts", "reference64", "scaled_ulp_distance", "ulp_distance"]

#: The documented tolerance across devices (docs/performance.md, "GPU readiness"): every output entry within one
#: ULP of the output dtype of the CPU result, and of the float64 reference in ULPs at the scale of the operands
#: (:func:`scaled_ulp_distance`).
TOLERANCE_ULP = 1

_INT = {torch.bfloat16: torch.int16, torch.float16: torch.int16, torch.float32: torch.int32, torch.float64: torch.int64}


def _ordered(t: Tensor) -> Tensor:
    """The float's bits as integers ordered like the values (+0 and -0 both 0), in int64."""
    x = t.contiguous().view(_INT[t.dtype]).to(torch.int64)
    sign_bit = 1 << (8 * t.element_size() - 1)
    return torch.where(x >= 0, x, -(x + sign_bit))


def ulp_distance(a: Tensor, b: Tensor) -> Tensor:
    """|a - b| in ULPs of their (shared) dtype, entry by entry (int64; NaNs are not expected here)."""
    if a.dtype != b.dtype or a.shape != b.shape:
        raise ValueError(f"dtype/shape differ: {a.dtype} {tuple(a.shape)} vs {b.dtype} {tuple(b.shape)}")
    return (_ordered(a) - _ordered(b)).abs()


def scaled_ulp_distance(got: Tensor, ref: Tensor, base: Tensor) -> Tensor:
    """|got - ref| in ULPs of ``got``'s dtype at the scale of the operands, max(|θ₀|, |ref|), entry by entry
    (float64). The merge computes θ₀ + τ* in float32 (λ a float32), so where θ₀ and τ* cancel, a result near 0 is
    off the float64 reference by a float32 rounding of θ₀: thousands of ULPs at the result's own scale, a fraction
    of one at the operands'."""
    scale = torch.maximum(base.double().abs(), ref.double().abs())
    info = torch.finfo(got.dtype)
    exponent = torch.floor(torch.log2(scale.clamp_min(info.tiny)))
    ulp = torch.exp2(exponent) * info.eps
    return (got.double() - ref.double()).abs() / ulp


def _bits_equal(a: Tensor, b: Tensor) -> Tensor:
    return a.contiguous().view(_INT[a.dtype]) == b.contiguous().view(_INT[b.dtype])


def compare_outputs(
    got: dict[str, Tensor], want: dict[str, Tensor], base: dict[str, Tensor], agents: list[dict[str, Tensor]]
) -> dict[str, Any]:
    """``got`` (e.g. the device's result, copied to the CPU) against ``want`` (the CPU's) on the same keys: the
    largest ULP distance, the share of entries whose bits differ, and whether every entry that no agent changed
    kept the base's exact bits in ``got`` (the spec makes those exact)."""
    numel = differ = untouched = untouched_bad = 0
    worst = 0
    for key, w in want.items():
        g = got[key].to(w.device)
        numel += w.numel()
        differ += int((~_bits_equal(g, w)).sum())
        worst = max(worst, int(ulp_distance(g, w).max()) if w.numel() else 0)
        same = torch.ones_like(w, dtype=torch.bool)
        for a in agents:
            same &= _bits_equal(a[key], base[key])
        untouched += int(same.sum())
        untouched_bad += int((same & ~_bits_equal(g, base[key])).sum())
    return {
        "entries": numel,
        "max_ulp": worst,
        "share_differing": differ / max(numel, 1),
        "untouched_entries": untouched,
        "untouched_changed": untouched_bad,
    }


@torch.no_grad()
def reference64(
    base: dict[str, Tensor],
    agents: list[dict[str, Tensor]],
    eps: float = 1e-5,
    lambdas: list[float] | None = None,
    importance: list[dict[str, Tensor]] | None = None,
    summed: bool = False,
) -> dict[str, Tensor]:
    """RAM from its definition in float64 (docs/methods.md, docs/curvature.md), rounded to the base's dtype:
    c = 0 keeps the base, c = 1 adds λ_t·τ_t, c ≥ 2 the (importance-weighted) mean of the active τ.
    ``summed``: task arithmetic instead (θ₀ + Σ τ_t)."""
    out: dict[str, Tensor] = {}
    for key, b in base.items():
        b64 = b.double()
        taus = torch.stack([a[key].double() - b64 for a in agents])
        if summed:
            out[key] = (b64 + taus.sum(0)).to(b.dtype)
            continue
        m = taus.abs() > eps
        c = m.sum(0)
        w = torch.ones_like(taus) if importance is None else torch.stack([h[key].double() for h in importance])
        w = torch.where(m, w, 0.0)
        wsum = w.sum(0)
        w = torch.where(wsum > 0, w, m.double())  # every active importance 0: the plain mean
        shared = (w * taus).sum(0) / w.sum(0).clamp_min(1e-300)
        lam = torch.tensor(lambdas or [1.0] * len(agents), dtype=torch.float64).view(-1, *([1] * b.dim()))
        unique = (torch.where(m, taus, 0.0) * lam).sum(0)
        delta = torch.where(c >= 2, shared, torch.where(c == 1, unique, 0.0))
        out[key] = torch.where(c == 0, b64, b64 + delta).to(b.dtype)
        out[key] = torch.where(c == 0, b, out[key])
    return out


@torch.no_grad()
def exact_counts(base: dict[str, Tensor] | Any, agents: list[Any]) -> dict[str, list[int]]:
    """Per agent, the entries it changed (active: its stored value differs from the base's; every changed entry
    of these inputs is active) and those no other agent changed (unique), and the histogram of c; counted with
    integer ops, exactly, on the tensors' own device."""
    sd = base if isinstance(base, dict) else dict(base.named_parameters())
    sds = [a if isinstance(a, dict) else dict(a.named_parameters()) for a in agents]
    k = len(sds)
    active, unique, hist = [0] * k, [0] * k, [0] * (k + 1)
    for key, b in sd.items():
        masks = torch.stack([~_bits_equal(a[key], b) for a in sds])
        c = masks.sum(0)
        for t in range(k):
            active[t] += int(masks[t].sum())
            unique[t] += int((masks[t] & (c == 1)).sum())
        hist = [h + n for h, n in zip(hist, torch.bincount(c.flatten(), minlength=k + 1).tolist())]
    return {"active": active, "unique": unique, "histogram": hist}
