"""RAM's rule, the reference: paper Eq. 7 on a chunk of thresholded task vectors ``[K, C]``, read as the spec
states it; the fast paths beside it (:mod:`.accumulators`, :mod:`.compiled`, :mod:`.native`, :mod:`.single_read`)
are within float32 rounding of it, and give one another's bits (``tests/test_ram_paths.py``).

>>> d = torch.tensor([[0.5, 0.0, 0.2], [0.0, 0.0, 0.4]])
>>> ram_combine(d, torch.tensor([1.0, 1.0]))
tensor([0.5000, 0.0000, 0.3000])
"""

from __future__ import annotations

import torch
from torch import Tensor

__all__ = ["elect", "importance_weights", "overlap_counts", "ram_combine"]


def overlap_counts(deltas: Tensor) -> Tensor:
    """c_i = Σ_t m_t,i as float32 (deltas already thresholded)."""
    return torch.count_nonzero(deltas, dim=0).to(torch.float32)


def ram_combine(
    deltas: Tensor, lambdas: Tensor | None = None, importance: Tensor | None = None, sign: bool = False
) -> Tensor:
    """Paper Eq. 7 on thresholded deltas: 0 where no agent is active, λ_t·τ_t where only agent t is, and the
    mean over the active agents where two or more are. ``lambdas=None`` is plain RAM (λ = 1). ``importance``
    (``[K, C]``, non-negative): the mean is weighted by it (:func:`importance_weights`). ``sign``: the shared
    entries' mean over only the active agents whose τ has the sign of the mean over all of them (:func:`elect`)."""
    counts = overlap_counts(deltas)
    weights = None if importance is None else importance_weights(deltas, importance)
    total = deltas.sum(dim=0) if weights is None else (deltas * weights).sum(dim=0)
    norm = counts if weights is None else weights.sum(dim=0)
    mean = total / norm.clamp(min=1.0)
    if sign:
        agree = elect(deltas, total)
        kept = deltas * agree if weights is None else deltas * weights * agree
        kept_norm = agree.sum(dim=0, dtype=deltas.dtype) if weights is None else (weights * agree).sum(dim=0)
        mean = torch.where(total != 0, kept.sum(dim=0) / kept_norm, mean)
    if lambdas is None:
        return mean
    scaled = lambdas.to(deltas.dtype) @ deltas
    return torch.where(counts == 1, scaled, mean)


def elect(deltas: Tensor, total: Tensor) -> Tensor:
    """Per entry, the agents whose τ has the sign of ``total`` (the shared mean's numerator, Σ τ or Σ w·τ): a
    ``[K, C]`` bool mask; where ``total`` is 0 or NaN, every agent with τ ≠ 0."""
    return torch.where(total > 0, deltas > 0, torch.where(total < 0, deltas < 0, deltas != 0))


def importance_weights(deltas: Tensor, importance: Tensor) -> Tensor:
    """Weights w_t = h_t / max over the active agents of h (1 where that max is 0; 0 for inactive agents), per
    entry, for thresholded ``deltas`` and importances ``h`` (both ``[K, C]``). Equal importances give weights of
    exactly 1.0: the weighted mean is then the plain one, bit for bit."""
    active = deltas != 0
    h = importance.to(deltas.dtype)
    top = torch.where(active, h, 0.0).amax(dim=0)
    weights = torch.where(top > 0, h / torch.where(top > 0, top, 1.0), 1.0)
    return torch.where(active, weights, 0.0)
