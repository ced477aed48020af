"""Stateless tensor kernels.

Every merge kernel takes ``deltas``, a float32 tensor of shape ``[K, C]``: row ``t`` holds agent ``t``'s task
vector τ_t = θ_t − θ₀ over one chunk of ``C`` elements of one tensor. Kernels return the merged task vector τ*
of shape ``[C]``; the engine adds it to the base. They never see whole models, so memory does not grow with
the model, and the engine sizes ``C`` so that ``K × C`` stays constant.

>>> d = torch.tensor([[0.5, 0.0, 0.2], [0.0, 0.0, 0.4]])
>>> ram_combine(d, torch.tensor([1.0, 1.0]))
tensor([0.5000, 0.0000, 0.3000])
"""

from __future__ import annotations

import hashlib
import math
import types
from typing import Any, Literal, Sequence

import torch
from torch import Tensor

__all__ = [
    "task_deltas_",
    "apply_activity_",
    "activity_mask",
    "overlap_counts",
    "ram_combine",
    "ram_statistics",
    "rho",
    "ram_lambda",
    "task_arithmetic_combine",
    "magnitude_threshold",
    "trim_",
    "ties_combine",
    "dare_drop_",
    "stable_seed",
    "RamAccumulator",
    "WeightedRamAccumulator",
    "importance_weights",
    "ram_fused_weighted_",
    "RamCounter",
    "ram_fused_",
    "ram_counts_fused",
    "compiled",
]


def task_deltas_(out: Tensor, base: Tensor, agents: Sequence[Tensor]) -> Tensor:
    """Write ``agents[t] − base`` into ``out[t]`` in float32 (exact for bf16/fp16 inputs up to f32 rounding)."""
    for row, agent in zip(out, agents):
        if agent.device == row.device:
            torch.sub(agent, base, out=row)
        else:
            row.copy_(agent)
            row.sub_(base)
    return out


def apply_activity_(deltas: Tensor, eps: float) -> Tensor:
    """Zero every entry with ``|τ| <= eps`` in place (the paper's strict rule ``|τ| > eps``); ``eps=0`` keeps
    every non-zero entry, which on exactly computed deltas is "the stored value changed"."""
    return torch.hardshrink(deltas, eps, out=deltas) if eps > 0 else deltas


def activity_mask(deltas: Tensor) -> Tensor:
    """Activity mask of deltas on which :func:`apply_activity_` already ran: ``m = τ ≠ 0``."""
    return deltas != 0


def overlap_counts(deltas: Tensor) -> Tensor:
    """c_i = Σ_t m_t,i as float32 (deltas already thresholded)."""
    return torch.count_nonzero(deltas, dim=0).to(torch.float32)


def ram_combine(deltas: Tensor, lambdas: Tensor | None = None, importance: Tensor | None = None) -> Tensor:
    """Paper Eq. 7 on thresholded deltas: 0 where no agent is active, λ_t·τ_t where only agent t is, and the
    mean over the active agents where two or more are. ``lambdas=None`` is plain RAM (λ = 1). ``importance``
    (``[K, C]``, non-negative): the mean is weighted by it (:func:`importance_weights`)."""
    counts = overlap_counts(deltas)
    if importance is None:
        total, norm = deltas.sum(dim=0), counts
    else:
        weights = importance_weights(deltas, importance)
        total, norm = (deltas * weights).sum(dim=0), weights.sum(dim=0)
    mean = total.div_(norm.clamp(min=1.0))
    if lambdas is None:
        return mean
    scaled = lambdas.to(deltas.dtype) @ deltas
    return torch.where(counts == 1, scaled, mean)


def importance_weights(deltas: Tensor, importance: Tensor) -> Tensor:
    """Weights w_t = h_t / max over the active agents of h (1 where that max is 0; 0 for inactive agents), per
    entry, for thresholded ``deltas`` and importances ``h`` (both ``[K, C]``). Equal importances give weights of
    exactly 1.0: the weighted mean is then the plain one, bit for bit."""
    active = deltas != 0
    h = importance.to(deltas.dtype)
    top = torch.where(active, h, 0.0).amax(dim=0)
    weights = torch.where(top > 0, h / torch.where(top > 0, top, 1.0), 1.0)
    return torch.where(active, weights, 0.0)


def ram_statistics(deltas: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """Per agent, the number of active and of unique entries, and the histogram of c = 0..K (all int64).

    ``deltas`` must already be thresholded.
    """
    k = deltas.shape[0]
    mask = deltas != 0
    counts = mask.sum(dim=0)
    active = mask.sum(dim=1)
    unique = (mask & (counts == 1)).sum(dim=1)
    histogram = torch.bincount(counts, minlength=k + 1)
    return active, unique, histogram


def rho(unique: float, active: float) -> float:
    """Overlap-unique ratio ρ = shared / unique; +inf when the agent has no unique entry (the spec's rule, also
    for an agent that changed nothing: its λ then scales no entry)."""
    return (active - unique) / unique if unique > 0 else math.inf


def ram_lambda(rho_value: float, variant: str, r: float, alpha: float) -> float:
    """λ_t for ``variant`` in {"ram", "ram_plus", "ram_plus_soft"} (see the spec). ``alpha=math.inf``: no
    clip; an agent with ρ = +∞ has no unique entry for λ to scale, and gets 1.0 there (a finite λ: the kernels
    multiply masks by it)."""
    if variant == "ram":
        return 1.0
    if variant == "ram_plus":
        if math.isinf(alpha) and math.isinf(rho_value):
            return 1.0
        return 1.0 + r * min(max(rho_value, 0.0), alpha)
    if variant == "ram_plus_soft":
        share = 1.0 if math.isinf(rho_value) else rho_value / (1.0 + rho_value)
        return 1.0 + r * share
    raise ValueError(f"unknown RAM variant {variant!r}")


def task_arithmetic_combine(deltas: Tensor, weights: Tensor) -> Tensor:
    """Σ_t w_t τ_t (PEFT's ``task_arithmetic``)."""
    return (deltas * weights.to(deltas.dtype).view(-1, 1)).sum(dim=0)


def magnitude_threshold(delta: Tensor, density: float) -> float | None:
    """The smallest |τ| that a top-``density`` trim keeps over one whole tensor, or ``None`` for "keep all".

    k = int(density · numel) as in PEFT; ``-1.0`` (keep nothing) when k = 0. Entries tied with the k-th
    magnitude are all kept (PEFT's ``topk`` keeps an unspecified subset of them).
    """
    if density >= 1.0:
        return None
    numel = delta.numel()
    k = int(density * numel)
    if k <= 0:
        return math.inf
    return float(torch.kthvalue(delta.reshape(-1).abs(), numel - k + 1).values)


def trim_(deltas: Tensor, thresholds: Sequence[float | None]) -> Tensor:
    """Zero, per agent row, the entries below that agent's magnitude threshold (see :func:`magnitude_threshold`)."""
    for row, threshold in zip(deltas, thresholds):
        if threshold is not None:
            row.masked_fill_(row.abs() < threshold, 0.0)
    return deltas


def ties_combine(
    deltas: Tensor,
    weights: Tensor,
    *,
    majority_sign: Literal["total", "frequency"] = "total",
    elect_on: Literal["unweighted", "weighted"] = "unweighted",
    divide_by: Literal["count", "weights"] = "count",
) -> Tensor:
    """TIES sign election and disjoint merge on trimmed deltas.

    Defaults reproduce ``peft.utils.merge_utils.ties``/``dare_ties``: elect the sign of Σ_t τ_t over the
    unweighted trimmed deltas (ties go to +), average the agreeing weighted entries dividing by their count.
    ``elect_on="weighted", divide_by="weights"`` is mergekit's convention.
    """
    weights = weights.to(deltas.dtype)
    weighted = deltas * weights.view(-1, 1)
    elected_from = weighted if elect_on == "weighted" else deltas
    sign = deltas.sign()
    if majority_sign == "total":
        magnitude = elected_from.sum(dim=0)
    elif majority_sign == "frequency":
        magnitude = elected_from.sign().sum(dim=0)
    else:
        raise ValueError(f"majority_sign must be 'total' or 'frequency', got {majority_sign!r}")
    majority = torch.where(magnitude >= 0, 1.0, -1.0)
    agree = sign == majority
    mixed = (weighted * agree).sum(dim=0)
    if divide_by == "count":
        return mixed / torch.clamp(agree.sum(dim=0), min=1.0)
    norm = (agree * weights.view(-1, 1)).sum(dim=0)
    return torch.where(norm != 0, mixed / torch.where(norm != 0, norm, 1.0), 0.0)


def dare_drop_(deltas: Tensor, density: float, generators: Sequence[torch.Generator], keep: Tensor) -> Tensor:
    """DARE: keep each entry with probability ``density`` and rescale survivors by 1/density, in place.

    Row t draws from ``generators[t]`` with ``torch.bernoulli`` exactly as PEFT's ``random_pruning`` does with
    the global generator, so seeding that generator identically gives PEFT's mask. ``keep`` is scratch of
    shape ``[C]``.
    """
    if density >= 1.0:
        return deltas
    probabilities = torch.full_like(keep, density)
    for row, generator in zip(deltas, generators):
        torch.bernoulli(probabilities, generator=generator, out=keep)
        row.mul_(keep).div_(density)
    return deltas


def stable_seed(*parts: object) -> int:
    """A 63-bit seed from its parts, stable across processes and Python versions (unlike ``hash``)."""
    digest = hashlib.blake2b("\x1f".join(map(str, parts)).encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little") & (2**63 - 1)


class RamAccumulator:
    """Streaming RAM over one chunk: agents' thresholded deltas are added one at a time (no ``[K, C]`` stack of
    deltas, only of their 0/1 activity masks), then :meth:`merged` returns θ₀ + τ*.

    The sum is kept negated (Σ −τ starts at +0 and stays +0 where no agent is active), so θ₀ − (Σ −τ)/c leaves
    every untouched entry with the base's exact bits, −0.0 included, without a ``where``.

    >>> acc = RamAccumulator(4, 2, torch.device("cpu"))
    >>> acc.begin(2); acc.add(0, torch.tensor([0.5, 0.0])); acc.add(1, torch.tensor([0.25, 0.0]))
    >>> acc.merged(torch.tensor([1.0, -0.0]))
    tensor([ 1.3750, -0.0000])
    """

    def __init__(self, capacity: int, k: int, device: torch.device, dtype: torch.dtype = torch.float32,
                 lambdas: Sequence[float] | None = None) -> None:
        capacity = max(capacity, 1)
        self._masks = torch.empty(k, capacity, dtype=dtype, device=device)
        self._buf = torch.empty(4, capacity, dtype=dtype, device=device)
        self.lambdas = None if lambdas is None else torch.tensor(list(lambdas), dtype=dtype, device=device)

    def begin(self, n: int) -> None:
        self.masks = self._masks[:, :n]
        self.neg_sum, self.count, self.tmp, self.weight = (row[:n] for row in self._buf)
        self.neg_sum.zero_()
        self.count.zero_()

    def add(self, t: int, delta: Tensor) -> None:
        # counted row by row: a sum over the [K, C] masks would exceed torch's grain and hop threads
        torch.ne(delta, 0, out=self.masks[t])
        self.count.add_(self.masks[t])
        self.neg_sum.sub_(delta)

    def merged(self, base: Tensor) -> Tensor:
        """θ₀ + τ* for this chunk (a view of internal scratch: copy it out before the next chunk)."""
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

    def __init__(self, capacity: int, k: int, device: torch.device, dtype: torch.dtype = torch.float32,
                 lambdas: Sequence[float] | None = None) -> None:
        super().__init__(capacity, k, device, dtype, lambdas)
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
            torch.where(self.up, h, self.top, out=self.top)
            # h / M where active with M > 0; 1 where active with M = 0; 0 where inactive (h / M may be Inf there)
            w = torch.where((self.top > 0).logical_and_(mask.bool()), torch.div(h, self.top, out=self.scratch), mask)
        else:
            torch.mul(h, mask, out=self.top)  # h where active, else 0 (valid importances are finite)
            w = mask
        self.neg_sum.sub_(torch.mul(w, delta, out=self.w))
        self.total.add_(w)

    def merged(self, base: Tensor) -> Tensor:
        """θ₀ + τ* for this chunk (a view of internal scratch: copy it out before the next chunk)."""
        torch.clamp(self.total, min=1.0, out=self.tmp)
        mean = torch.div(self.neg_sum, self.tmp, out=self.scratch)
        if self.lambdas is not None:
            unique_scaled = torch.mv(self.masks.T, self.lambdas, out=self.tmp).mul_(self.neg_sum)
            torch.eq(self.count, 1.0, out=self.weight)
            mean = torch.lerp(mean, unique_scaled, self.weight, out=self.neg_sum)
        return torch.sub(base, mean, out=self.tmp)


class RamCounter:
    """Streaming RAM statistics: per agent the active and unique entries (and, optionally, the histogram of c).

    Also sums Σ −τ so that :meth:`finite` can tell whether any input was NaN/Inf.
    """

    def __init__(self, capacity: int, k: int, device: torch.device, dtype: torch.dtype = torch.float32,
                 histogram: bool = False) -> None:
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


def _active_delta(agent: Tensor, base_f: Tensor, eps: float) -> Tensor:
    """τ with sub-threshold entries zeroed, NaN kept (like ``hardshrink``: a NaN must reach the finite check)."""
    delta = agent.float() - base_f
    if eps > 0:
        delta = torch.where((delta >= -eps) & (delta <= eps), 0.0, delta)
    return delta


def ram_fused_(out: Tensor, base: Tensor, agents: Sequence[Tensor], lambdas: Tensor | None, eps: float) -> Tensor:
    """Write θ₀ + τ* of one chunk into ``out`` (in ``out``'s dtype) and return Σ θ* (NaN/Inf in any input show
    there). One expression for ``torch.compile`` to fuse into a single pass over the K + 1 inputs and the output
    (``merge(..., compile=True)``). Same float operations in the same order as :class:`RamAccumulator`, so both
    give the same bits (tested). Float32 compute: the engine runs float64 inputs eagerly."""
    base_f = base.float()
    neg_sum = torch.zeros_like(base_f)
    count = torch.zeros_like(base_f)
    lam = torch.zeros_like(base_f)
    for t, agent in enumerate(agents):
        delta = _active_delta(agent, base_f, eps)
        mask = (delta != 0).float()
        neg_sum = neg_sum - delta
        count = count + mask
        if lambdas is not None:
            lam = lam + mask * lambdas[t]
    mean = neg_sum / count.clamp(min=1.0)
    if lambdas is not None:
        mean = torch.where(count == 1.0, neg_sum * lam, mean)
    merged = base_f - mean
    out.copy_(merged)
    return merged.sum()


def ram_fused_weighted_(out: Tensor, base: Tensor, agents: Sequence[Tensor], importances: Sequence[Tensor],
                        lambdas: Tensor | None, eps: float) -> Tensor:
    """:func:`ram_fused_` with the shared entries weighted by ``importances`` (one per agent, like the agents):
    the operations of :class:`WeightedRamAccumulator` in its order. Returns Σ θ* (the engine checks the
    importances' values before it runs)."""
    base_f = base.float()
    neg_sum = torch.zeros_like(base_f)
    total = torch.zeros_like(base_f)
    top = torch.zeros_like(base_f)
    count = torch.zeros_like(base_f)
    lam = torch.zeros_like(base_f)
    for t, (agent, importance) in enumerate(zip(agents, importances)):
        h = importance.float()
        delta = _active_delta(agent, base_f, eps)
        active = delta != 0
        mask = active.float()
        count = count + mask
        if t > 0:
            up = (h > top) & active
            r = torch.where(up, top / h, 1.0)
            neg_sum = neg_sum * r
            total = total * r
            top = torch.where(up, h, top)
            w = torch.where((top > 0) & active, h / top, mask)
        else:
            top = torch.where(active, h, 0.0)
            w = mask
        neg_sum = neg_sum - w * delta
        total = total + w
        if lambdas is not None:
            lam = lam + mask * lambdas[t]
    mean = neg_sum / total.clamp(min=1.0)
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
        delta = _active_delta(agent, base_f, eps)
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
