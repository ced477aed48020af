"""Stateless tensor kernels shared by the methods and the engine.

Every merge kernel takes ``deltas``, a float32 tensor of shape ``[K, C]``: row ``t`` holds agent ``t``'s task
vector τ_t = θ_t − θ₀ over one chunk of ``C`` elements of one tensor, and returns the merged task vector τ* of
shape ``[C]``; the engine adds it to the base. They never see whole models, so memory does not grow with the
model, and the engine sizes ``C`` so that ``K × C`` stays constant.

>>> d = torch.tensor([[0.5, 0.0, 0.2], [0.0, 0.0, 0.4]])
>>> task_arithmetic_combine(d, torch.tensor([1.0, 1.0]))
tensor([0.5000, 0.0000, 0.6000])

A module per job: :mod:`.activity` (the activity rule), :mod:`.counting` (active and unique entries per agent),
:mod:`.combine` (task vectors, task arithmetic), :mod:`.trimming` (trim, TIES, DARE). RAM's rule and its fast
paths live in their own room, :mod:`ram_live.methods.ram`. ``from ram_live import functional as F`` reaches every
name below.
"""

from __future__ import annotations

import torch  # noqa: F401  (the doctest above uses it)

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
from .combine import task_arithmetic_combine, task_deltas_
from .counting import RamCounter, ram_counts_fused, ram_statistics
from .trimming import dare_drop_, magnitude_threshold, stable_seed, ties_combine, trim_

__all__ = [
    "task_deltas_",
    "apply_activity_",
    "activity_mask",
    "task_arithmetic_combine",
    "magnitude_threshold",
    "trim_",
    "ties_combine",
    "dare_drop_",
    "stable_seed",
    "RamCounter",
    "ram_counts_fused",
    "ram_statistics",
    "ActivityRule",
    "active_delta",
    "active_mask",
    "compute_dtype",
    "count_active",
    "count_delta_active",
    "delta_active",
    "narrower_dtype",
]
