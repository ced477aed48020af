"""RAM as single expressions over the K + 1 inputs of a chunk, for ``torch.compile`` to fuse into one pass
(``merge(..., compile=True)``), and their compiled builds (:func:`compiled`)."""

from __future__ import annotations

import types
from typing import Any, Sequence

import torch
from torch import Tensor

from .activity import active_delta

__all__ = ["compiled", "ram_counts_fused", "ram_fused_", "ram_fused_weighted_"]


def ram_fused_(out: Tensor, base: Tensor, agents: Sequence[Tensor], lambdas: Tensor | None, eps: float,
               sign: bool = False) -> Tensor:
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


def ram_fused_weighted_(out: Tensor, base: Tensor, agents: Sequence[Tensor], importances: Sequence[Tensor],
                        lambdas: Tensor | None, eps: float, sign: bool = False) -> Tensor:
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


def ram_counts_fused(base: Tensor, agents: Sequence[Tensor], eps: float) -> tuple[Tensor, Tensor, Tensor]:
    """RAM statistics of one chunk in one expression (for ``torch.compile``): per agent the active and unique
    entries (float32, exact for chunks of fewer than 2^24 entries), and Σ τ over every agent (NaN/Inf in any
    input show there). Same rule as :class:`RamCounter`."""
    base_f = base.float()
    count = torch.zeros_like(base_f)
    check = torch.zeros_like(base_f)
    masks = []
    for agent in agents:
        delta = active_delta(agent, base_f, eps)
        mask = (delta != 0).float()  # float sums vectorise (bool sums do not); exact below 2^24 per chunk
        masks.append(mask)
        count = count + mask
        check = check + delta
    one = (count == 1.0).float()
    active = torch.stack([m.sum() for m in masks])
    unique = torch.stack([(m * one).sum() for m in masks])
    return active, unique, check.sum()


_COMPILED: dict[tuple[str, bool, Any], Any] = {}


def compiled(kernel: Any, static: bool = False, key: Any = None) -> Any:
    """``kernel`` (:func:`ram_fused_` or :func:`ram_counts_fused`) compiled once per process and per ``key``.

    ``static=True`` specialises on the chunk's length (the engine's full chunks: reductions then run several
    times faster); the dynamic-shape build takes each tensor's last, shorter chunk. The engine keys builds by
    the number of agents and whether λ is given. Each build compiles a private copy of the function: Dynamo
    caches graphs per code object, so builds of one function would share, evict and (past its recompile limit)
    silently drop each other's graphs.
    """
    name = (kernel.__name__, static, key)
    if name not in _COMPILED:
        private = types.FunctionType(kernel.__code__.replace(), kernel.__globals__, kernel.__name__,
                                     kernel.__defaults__, kernel.__closure__)
        _COMPILED[name] = torch.compile(private, dynamic=not static)
    return _COMPILED[name]
