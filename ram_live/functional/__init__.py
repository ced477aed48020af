"""Stateless tensor kernels.

Every merge kernel takes ``deltas``, a float32 tensor of shape ``[K, C]``: row ``t`` holds agent ``t``'s task
vector τ_t = θ_t − θ₀ over one chunk of ``C`` elements of one tensor. Kernels return the merged task vector τ*
of shape ``[C]``; the engine adds it to the base. They never see whole models, so memory does not grow with
the model, and the engine sizes ``C`` so that ``K × C`` stays constant.

>>> d = torch.tensor([[0.5, 0.0, 0.2], [0.0, 0.0, 0.4]])
>>> ram_combine(d, torch.tensor([1.0, 1.0]))
tensor([0.5000, 0.0000, 0.3000])

A module per job: :mod:`.activity` (the activity rule, and the counters' use of it), :mod:`.lambdas` (ρ and
λ), :mod:`.combine` (RAM's combine and statistics on a chunk, task arithmetic), :mod:`.sparsify` (trim, TIES,
DARE), :mod:`.accumulators` (streaming RAM one agent at a time), :mod:`.fused` (single expressions for
``torch.compile``). ``from ram_live import functional as F; F.ram_combine`` reaches every name.
"""

from __future__ import annotations

import torch  # noqa: F401  (the doctest above uses it)

from .accumulators import RamAccumulator, RamCounter, WeightedRamAccumulator
from .activity import (
    ActivityRule,
    active_delta,
    active_mask,
    activity_mask,
    apply_activity_,
    compute_dtype,
    count_active,
    count_delta_active,
    delta_active,
    narrower_dtype,
)
from .combine import (
    elect,
    importance_weights,
    overlap_counts,
    ram_combine,
    ram_statistics,
    task_arithmetic_combine,
    task_deltas_,
)
from .fused import compiled, ram_counts_fused, ram_fused_, ram_fused_weighted_
from .lambdas import ram_lambda, rho
from .sparsify import dare_drop_, magnitude_threshold, stable_seed, ties_combine, trim_

__all__ = [
    "task_deltas_",
    "apply_activity_",
    "activity_mask",
    "overlap_counts",
    "ram_combine",
    "elect",
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
    "ActivityRule",
    "active_delta",
    "active_mask",
    "compute_dtype",
    "count_active",
    "count_delta_active",
    "delta_active",
    "narrower_dtype",
]
