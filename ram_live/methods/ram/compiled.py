"""RAM as single expressions over the K + 1 inputs of a chunk, for ``torch.compile`` to fuse into one pass
(``merge(..., compile=True)``; built by :func:`ram_live.engine.compiling.compiled`)."""

from __future__ import annotations

from typing import Sequence

import torch
from torch import Tensor

from ...functional.activity import active_delta

__all__ = ["ram_fused_", "ram_fused_weighted_"]


def ram_fused_(
    out: Tensor, base: Tensor, agents: Sequence[Tensor], lambdas: Tensor | None, eps: float, sign: bool = False
) -> Tensor:
    """Write θ₀ + τ* of one chunk into ``out`` (in ``out``'s dtype) and return Σ θ* (NaN/Inf in any input show
    there). One expression for ``torch.compile`` to fuse into a single pass over the K + 1 inputs and the output
    (``merge(..., compile=True)``). Same float operations in the same order as :class:`RamAccumulator`, so both
    give the same bits (tested). Float32 compute: the engine runs float64 inputs eagerly. ``sign``: the
    ``shared="sign"`` rule (:class:`RamAccumulator`'s ``sign``)."""
    base_f = base.float()
    neg_sum = torch.zeros_like(base_f)
    count = torch.zeros_like(base_f)
    lam = torch.zeros_like(base_f)
    sides = [torch.zeros_like(base_f) for _ in range(4)] if sign else []
    for t, agent in enumerate(agents):
        delta = active_delta(agent, base_f, eps)
        mask = (delta != 0).float()
        neg_sum = neg_sum - delta
        count = count + mask
        if sign:
            sides = _add_sides(sides, delta, delta, None)
        if lambdas is not None:
            lam = lam + mask * lambdas[t]
    mean = neg_sum / count.clamp(min=1.0)
    if sign:
        mean = _elected([*sides[:3], count - sides[1]], neg_sum, mean)
    if lambdas is not None:
        mean = torch.where(count == 1.0, neg_sum * lam, mean)
    merged = base_f - mean
    out.copy_(merged)
    return merged.sum()


def _add_sides(sides: list[Tensor], delta: Tensor, weighted: Tensor, weight: Tensor | None) -> list[Tensor]:
    """:meth:`RamAccumulator._add_sides` as an expression."""
    out = []
    for side, where in ((0, delta > 0), (2, delta < 0)):
        out.append(sides[side] - torch.where(where, weighted, 0.0))
        if weight is not None:
            out.append(sides[side + 1] + torch.where(where, weight, 0.0))
        else:  # unweighted, the negative count is derived at the end
            out.append(sides[1] + where.float() if side == 0 else sides[3])
    return out


def _elected(sides: list[Tensor], neg_sum: Tensor, mean: Tensor) -> Tensor:
    """:meth:`RamAccumulator._elected` as an expression."""
    mean = torch.where(neg_sum > 0, sides[2] / sides[3], mean)
    return torch.where(neg_sum < 0, sides[0] / sides[1], mean)


def ram_fused_weighted_(
    out: Tensor,
    base: Tensor,
    agents: Sequence[Tensor],
    importances: Sequence[Tensor],
    lambdas: Tensor | None,
    eps: float,
    sign: bool = False,
) -> Tensor:
    """:func:`ram_fused_` with the shared entries weighted by ``importances`` (one per agent, like the agents):
    the operations of :class:`WeightedRamAccumulator` in its order. Returns Σ θ* (the engine checks the
    importances' values before it runs)."""
    base_f = base.float()
    neg_sum = torch.zeros_like(base_f)
    total = torch.zeros_like(base_f)
    top = torch.zeros_like(base_f)
    count = torch.zeros_like(base_f)
    lam = torch.zeros_like(base_f)
    sides = [torch.zeros_like(base_f) for _ in range(4)] if sign else []
    for t, (agent, importance) in enumerate(zip(agents, importances)):
        h = importance.float()
        delta = active_delta(agent, base_f, eps)
        active = delta != 0
        mask = active.float()
        count = count + mask
        if t > 0:
            up = (h > top) & active
            r = torch.where(up, top / h, 1.0)
            neg_sum = neg_sum * r
            total = total * r
            sides = [x * r for x in sides]
            top = torch.where(up, h, top)
            w = torch.where((top > 0) & active, h / top, mask)
        else:
            top = torch.where(active, h, 0.0)
            w = mask
        wd = w * delta
        neg_sum = neg_sum - wd
        total = total + w
        if sign:
            sides = _add_sides(sides, delta, wd, w)
        if lambdas is not None:
            lam = lam + mask * lambdas[t]
    mean = neg_sum / total.clamp(min=1.0)
    if sign:
        mean = _elected(sides, neg_sum, mean)
    if lambdas is not None:
        mean = torch.where(count == 1.0, neg_sum * lam, mean)
    merged = base_f - mean
    out.copy_(merged)
    return merged.sum()
