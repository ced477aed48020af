"""Streaming RAM over one chunk, one agent at a time (no ``[K, C]`` stack of task vectors): the merged values
(:class:`RamAccumulator`; the shared mean weighted by importances: :class:`WeightedRamAccumulator`). The engine's
eager path; same bits as :func:`.reference.ram_combine`."""

from __future__ import annotations

from typing import Sequence

import torch
from torch import Tensor

__all__ = ["RamAccumulator", "WeightedRamAccumulator"]


class RamAccumulator:
    """Streaming RAM over one chunk: agents' thresholded deltas are added one at a time (no ``[K, C]`` stack of
    deltas, only of their 0/1 activity masks), then :meth:`merged` returns θ₀ + τ*.

    The sum is kept negated (Σ −τ starts at +0 and stays +0 where no agent is active), so θ₀ − (Σ −τ)/c leaves
    every untouched entry with the base's exact bits, −0.0 included, without a ``where``.

    >>> acc = RamAccumulator(4, 2, torch.device("cpu"))
    >>> acc.begin(2); acc.add(0, torch.tensor([0.5, 0.0])); acc.add(1, torch.tensor([0.25, 0.0]))
    >>> acc.merged(torch.tensor([1.0, -0.0]))
    tensor([1.3750, -0.0000])

    ``sign=True`` (the ``shared="sign"`` option): where two or more agents are active, the mean over those whose τ
    has the sign of Σ τ (all of them where Σ τ is 0). Beside Σ −τ and the count it keeps Σ −τ of the positive
    and of the negative τ and the count of the positive ones, each added in the agents' order (the negative count
    is the count less the positive); the native and compiled kernels do the same operations in the same order.
    """

    def __init__(
        self,
        capacity: int,
        k: int,
        device: torch.device,
        dtype: torch.dtype = torch.float32,
        lambdas: Sequence[float] | None = None,
        sign: bool = False,
    ) -> None:
        capacity = max(capacity, 1)
        self._masks = torch.empty(k, capacity, dtype=dtype, device=device)
        self._buf = torch.empty(4, capacity, dtype=dtype, device=device)
        self.lambdas = None if lambdas is None else torch.tensor(list(lambdas), dtype=dtype, device=device)
        self.sign = sign
        self._sides = torch.empty(5, capacity, dtype=dtype, device=device) if sign else None
        self._side_mask = torch.empty(capacity, dtype=torch.bool, device=device) if sign else None

    def begin(self, n: int) -> None:
        self.masks = self._masks[:, :n]
        self.neg_sum, self.count, self.tmp, self.weight = (row[:n] for row in self._buf)
        self.neg_sum.zero_()
        self.count.zero_()
        if self._sides is not None:
            self.sides = self._sides[:4, :n].zero_()  # Σ −τ and Σ w over τ > 0, then over τ < 0
            self.side_tmp, self.side_mask = self._sides[4, :n], self._side_mask[:n]  # type: ignore[index]

    def add(self, t: int, delta: Tensor) -> None:
        # counted row by row: a sum over the [K, C] masks would exceed torch's grain and hop threads
        torch.ne(delta, 0, out=self.masks[t])
        self.count.add_(self.masks[t])
        self.neg_sum.sub_(delta)
        if self.sign:
            self._add_sides(delta, delta, None)

    def _add_sides(self, delta: Tensor, weighted: Tensor, weight: Tensor | None) -> None:
        """Σ −(w·τ) and Σ w of the positive τ (``sides[0:2]``) and the negative (``[2:4]``); unweighted (w = 1)
        the negative count is left to :meth:`merged`, which derives it from the count (exact: small integers)."""
        for side, compare in ((0, torch.gt), (2, torch.lt)):
            compare(delta, 0, out=self.side_mask)
            self.sides[side].sub_(torch.mul(weighted, self.side_mask, out=self.side_tmp))
            if weight is not None:
                self.sides[side + 1].add_(torch.mul(weight, self.side_mask, out=self.side_tmp))
            elif side == 0:
                self.sides[1].add_(self.side_mask)

    def _elected(self, mean: Tensor) -> Tensor:
        """``mean`` (Σ −τ / norm) where Σ τ is 0 or NaN, else the elected side's Σ −τ / Σ w (in place)."""
        pos = torch.div(self.sides[0], self.sides[1], out=self.sides[1])
        neg = torch.div(self.sides[2], self.sides[3], out=self.sides[3])
        torch.where(self.neg_sum > 0, neg, mean, out=mean)
        return torch.where(self.neg_sum < 0, pos, mean, out=mean)

    def merged(self, base: Tensor) -> Tensor:
        """θ₀ + τ* for this chunk (a view of internal scratch: copy it out before the next chunk)."""
        if self.sign:
            mean = torch.div(self.neg_sum, torch.clamp(self.count, min=1.0, out=self.tmp), out=self.weight)
            torch.sub(self.count, self.sides[1], out=self.sides[3])  # the negative τ: all active ones but the positive
            mean = self._elected(mean)
            if self.lambdas is not None:
                unique_scaled = torch.mv(self.masks.T, self.lambdas, out=self.tmp).mul_(self.neg_sum)
                torch.where(self.count == 1.0, unique_scaled, mean, out=mean)
            return torch.sub(base, mean, out=self.tmp)
        if self.lambdas is None:
            torch.clamp(self.count, min=1.0, out=self.tmp)
            self.neg_sum.div_(self.tmp)
        else:
            # λ of the one active agent where c = 1 (a GEMV over the masks), the mean where c ≥ 2; torch.lerp
            # with weight exactly 1 or 0 returns its end or its start exactly
            unique_scaled = torch.mv(self.masks.T, self.lambdas, out=self.tmp).mul_(self.neg_sum)
            torch.eq(self.count, 1.0, out=self.weight)
            mean = self.neg_sum.div_(self.count.clamp_(min=1.0))
            torch.lerp(mean, unique_scaled, self.weight, out=self.neg_sum)
        return torch.sub(base, self.neg_sum, out=self.tmp)


class WeightedRamAccumulator(RamAccumulator):
    """:class:`RamAccumulator` with the shared entries' mean weighted by per-agent importances h ≥ 0 (curvature-
    aware RAM): ``add(t, delta, importance=h)``. Streams one agent at a time with an online maximum: M is the
    largest importance of the active agents so far, S = −Σ w·τ and W = Σ w with w = h / M; a new maximum
    rescales S and W by M_old / M_new (0 for the first active agent). Where every active h is 0, w = 1: the
    plain mean. Equal importances give w = 1.0 exactly, hence RAM's bits; normalising by the maximum keeps
    |S| ≤ Σ |τ| whatever the importances' scale. The native kernels do the same operations in the same order.

    >>> acc = WeightedRamAccumulator(2, 2, torch.device("cpu"))
    >>> acc.begin(1)
    >>> acc.add(0, torch.tensor([0.5]), importance=torch.tensor([3.0]))
    >>> acc.add(1, torch.tensor([0.25]), importance=torch.tensor([1.0]))
    >>> acc.merged(torch.tensor([1.0]))                      # 1 + (3·0.5 + 1·0.25) / 4
    tensor([1.4375])
    """

    def __init__(
        self,
        capacity: int,
        k: int,
        device: torch.device,
        dtype: torch.dtype = torch.float32,
        lambdas: Sequence[float] | None = None,
        sign: bool = False,
    ) -> None:
        super().__init__(capacity, k, device, dtype, lambdas, sign)
        capacity = max(capacity, 1)
        self._wbuf = torch.empty(4, capacity, dtype=dtype, device=device)
        self._up = torch.empty(capacity, dtype=torch.bool, device=device)

    def begin(self, n: int) -> None:
        super().begin(n)
        self.total, self.top, self.scratch, self.w = (row[:n] for row in self._wbuf)
        self.up = self._up[:n]
        self.total.zero_()
        self.top.zero_()

    def add(self, t: int, delta: Tensor, importance: Tensor | None = None) -> None:  # type: ignore[override]
        if importance is None:
            raise TypeError("WeightedRamAccumulator.add needs the agent's importance chunk")
        h = importance
        mask = self.masks[t]
        torch.ne(delta, 0, out=mask)
        self.count.add_(mask)
        if t > 0:  # before the first agent S = W = 0: rescaling changes nothing
            torch.gt(h, self.top, out=self.up).logical_and_(mask.bool())
            r = torch.where(self.up, torch.div(self.top, h, out=self.scratch), 1.0)
            self.neg_sum.mul_(r)
            self.total.mul_(r)
            if self.sign:
                self.sides.mul_(r)
            torch.where(self.up, h, self.top, out=self.top)
            # h / M where active with M > 0; 1 where active with M = 0; 0 where inactive (h / M may be Inf there)
            w = torch.where((self.top > 0).logical_and_(mask.bool()), torch.div(h, self.top, out=self.scratch), mask)
        else:
            torch.mul(h, mask, out=self.top)  # h where active, else 0 (valid importances are finite)
            w = mask
        self.neg_sum.sub_(torch.mul(w, delta, out=self.w))
        self.total.add_(w)
        if self.sign:
            self._add_sides(delta, self.w, w)

    def merged(self, base: Tensor) -> Tensor:
        """θ₀ + τ* for this chunk (a view of internal scratch: copy it out before the next chunk)."""
        torch.clamp(self.total, min=1.0, out=self.tmp)
        mean = torch.div(self.neg_sum, self.tmp, out=self.scratch)
        if self.sign:
            mean = self._elected(mean)
        if self.lambdas is not None:
            unique_scaled = torch.mv(self.masks.T, self.lambdas, out=self.tmp).mul_(self.neg_sum)
            torch.eq(self.count, 1.0, out=self.weight)
            mean = torch.lerp(mean, unique_scaled, self.weight, out=self.neg_sum)
        return torch.sub(base, mean, out=self.tmp)
