"""The baselines' kernels on ``[K, C]`` delta chunks: magnitude trim and TIES sign election, DARE's random drop."""

from __future__ import annotations

import functools
import hashlib
import math
from typing import Literal, Sequence

import torch
from torch import Tensor

__all__ = ["dare_drop_", "magnitude_threshold", "stable_seed", "ties_combine", "trim_"]


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


def trim_(deltas: Tensor, thresholds: Sequence[float | None] | Tensor) -> Tensor:
    """Zero, per agent row, the entries below that agent's magnitude threshold (see :func:`magnitude_threshold`):
    floats (None: keep all), or a float32 ``[K]`` tensor on the deltas' device (0 keeps all; no host read)."""
    for t, row in enumerate(deltas):
        threshold = thresholds[t]
        if threshold is not None:
            row.masked_fill_(row.abs() < threshold, 0.0)
    return deltas


def ties_combine(
    deltas: Tensor,
    weights: Tensor,
    *,
    majority_sign: Literal["total", "frequency"] = "total",
    elect_on: Literal["unweighted", "weighted"] = "unweighted",
    divide_by: Literal["count", "weights", "none"] = "count",
) -> Tensor:
    """TIES sign election and disjoint merge on trimmed deltas.

    Defaults reproduce ``peft.utils.merge_utils.ties``/``dare_ties``: elect the sign of Σ_t τ_t over the
    unweighted trimmed deltas (ties go to +), average the agreeing weighted entries dividing by their count.
    ``elect_on="weighted", divide_by="weights"`` is mergekit's convention; ``divide_by="none"`` (mergekit's
    ``normalize: false``) returns the weighted sum of the agreeing entries.
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
    if divide_by == "none":
        return mixed
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


@functools.lru_cache(maxsize=1 << 16, typed=True)  # a model's tensors x agents, asked again by every merge
def stable_seed(*parts: object) -> int:
    """A 63-bit seed from its parts (hashable), stable across processes and Python versions (unlike ``hash``)."""
    digest = hashlib.blake2b("\x1f".join(map(str, parts)).encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little") & (2**63 - 1)
