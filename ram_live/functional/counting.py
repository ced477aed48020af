"""Activity counts of one chunk (per agent, its active and unique entries): one agent at a time
(:class:`RamCounter`), in one expression for ``torch.compile`` (:func:`ram_counts_fused`), or on a stacked
chunk (:func:`ram_statistics`, with the histogram of overlaps). The statistics pass,
RAM+'s ρ and the in-place validation rest on them."""

from __future__ import annotations

from typing import Sequence

import torch
from torch import Tensor

from .activity import active_delta

__all__ = ["RamCounter", "ram_counts_fused", "ram_statistics"]


class RamCounter:
    """Streaming RAM statistics: per agent the active and unique entries (and, optionally, the histogram of c).

    Also sums Σ −τ so that :meth:`finite` can tell whether any input was NaN/Inf.
    """

    def __init__(
        self, capacity: int, k: int, device: torch.device, dtype: torch.dtype = torch.float32, histogram: bool = False
    ) -> None:
        capacity = max(capacity, 1)
        self._masks = torch.empty(k, capacity, dtype=dtype, device=device)
        self._buf = torch.empty(3, capacity, dtype=dtype, device=device)
        self.k = k
        self.unique = torch.zeros(k, dtype=torch.float64, device=device)
        self.active = torch.zeros(k, dtype=torch.float64, device=device)
        self.histogram = torch.zeros(k + 1, dtype=torch.int64, device=device) if histogram else None
        self.check = torch.zeros((), dtype=dtype, device=device)

    def begin(self, n: int) -> None:
        self.n = n
        self.masks = self._masks[:, :n]
        self.neg_sum, self.count, self.is_one = (row[:n] for row in self._buf)
        self.neg_sum.zero_()
        self.count.zero_()

    def add(self, t: int, delta: Tensor) -> None:
        torch.ne(delta, 0, out=self.masks[t])
        self.count.add_(self.masks[t])
        self.neg_sum.sub_(delta)

    def end(self) -> None:
        """Fold the chunk: unique = masks @ [c == 1] (a GEMV), active = row sums of the masks."""
        torch.eq(self.count, 1.0, out=self.is_one)
        self.unique += torch.mv(self.masks, self.is_one).double()
        self.active += self.masks.sum(dim=1).double()
        if self.histogram is not None:
            self.histogram += torch.bincount(self.count.to(torch.int64), minlength=self.k + 1)
        self.check += self.neg_sum.sum()

    def finite(self) -> bool:
        """Whether every delta added so far was finite (NaN/Inf propagate into Σ −τ)."""
        return bool(torch.isfinite(self.check))

    def result(self) -> tuple[Tensor, Tensor, Tensor]:
        histogram = self.histogram.cpu() if self.histogram is not None else torch.zeros(self.k + 1, dtype=torch.int64)
        return (self.active.round().to(torch.int64).cpu(), self.unique.round().to(torch.int64).cpu(), histogram)


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


def ram_statistics(deltas: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """Per agent, the number of active and of unique entries, and the histogram of c = 0..K (all int64).

    ``deltas`` must already be thresholded (or be the activity masks themselves).
    """
    k = deltas.shape[0]
    mask = deltas != 0
    counts = mask.sum(dim=0)
    active = mask.sum(dim=1)
    unique = (mask & (counts == 1)).sum(dim=1)
    # c = 0..K compared with each value (no bincount: its output size depends on the values, a host sync on GPUs)
    histogram = (counts == torch.arange(k + 1, device=counts.device).unsqueeze(1)).sum(dim=1)
    return active, unique, histogram
