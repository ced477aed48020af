"""The activity rule, once: which entries of a task vector count as updated.

The merge thresholds deltas with :func:`apply_activity_`; every counter of "active" entries (the probe, the
verl and PEFT density metrics, the store's lossy snapshots) counts with :func:`active_mask` /
:func:`count_active`, which apply the same rule to the same float values, so a count and the merge agree
entry for entry, also at the float boundary (a τ of exactly ``eps`` rounded to float32).

>>> from ram_live.methods import Activity
>>> eps = 1e-3                                    # float32(1e-3) is slightly above 1e-3: |τ| > eps there
>>> count_active(torch.tensor([1e-3, 5e-4]), torch.zeros(2), Activity("abs", eps))
1
"""

from __future__ import annotations

from typing import Protocol

import torch
from torch import Tensor

__all__ = [
    "ActivityRule",
    "active_delta",
    "active_mask",
    "activity_mask",
    "apply_activity_",
    "compute_dtype",
    "count_active",
    "count_delta_active",
    "delta_active",
    "narrower_dtype",
]

_CHUNK = 1 << 22


class ActivityRule(Protocol):
    """What the counters need of :class:`ram_live.methods.Activity`: its rule and its threshold per dtype."""

    @property
    def rule(self) -> str: ...

    def threshold_for(self, dtype: torch.dtype) -> float: ...


def apply_activity_(deltas: Tensor, eps: float) -> Tensor:
    """Zero every entry with ``|τ| <= eps`` in place (the paper's strict rule ``|τ| > eps``); ``eps=0`` keeps
    every non-zero entry, which on exactly computed deltas is "the stored value changed"."""
    return torch.hardshrink(deltas, eps, out=deltas) if eps > 0 else deltas


def active_delta(agent: Tensor, base_f: Tensor, eps: float) -> Tensor:
    """τ = agent − base_f with the entries :func:`apply_activity_` zeroes zeroed, out of place (the form the
    compiled kernels fuse); NaN kept, as by ``hardshrink``: a NaN must reach the finite check."""
    delta = agent.float() - base_f
    if eps > 0:
        delta = torch.where((delta >= -eps) & (delta <= eps), 0.0, delta)
    return delta


def activity_mask(deltas: Tensor) -> Tensor:
    """Activity mask of deltas on which :func:`apply_activity_` already ran: ``m = τ ≠ 0``."""
    return deltas != 0


def compute_dtype(*dtypes: torch.dtype) -> torch.dtype:
    """The dtype the merge computes task vectors in: float64 when an input is float64, else float32."""
    return torch.float64 if torch.float64 in dtypes else torch.float32


def narrower_dtype(a: torch.dtype, b: torch.dtype) -> torch.dtype:
    """The less precise of two floating dtypes (fewer bits; at equal bits the larger machine epsilon)."""
    fa, fb = torch.finfo(a), torch.finfo(b)
    return a if fa.bits < fb.bits or (fa.bits == fb.bits and fa.eps > fb.eps) else b


def delta_active(delta: Tensor, activity: ActivityRule, out: Tensor | None = None) -> Tensor:
    """Where the task vector ``delta`` (in the merge's compute dtype) is active: the entries
    :func:`apply_activity_` keeps at ``activity.threshold_for(delta.dtype)``, i.e. not ``|τ| <= threshold``
    (NaN counts; with threshold 0, τ ≠ 0). ``delta`` is left as it is.

    >>> from ram_live.methods import Activity
    >>> delta_active(torch.tensor([1e-3, -2e-3, 0.0]), Activity("abs", 1e-3))   # float32(1e-3) > 1e-3
    tensor([ True,  True, False])
    """
    return torch.logical_not(delta.abs() <= activity.threshold_for(delta.dtype), out=out)


def active_mask(agent: Tensor, base: Tensor, activity: ActivityRule, out: Tensor | None = None) -> Tensor:
    """Where ``agent`` counts as updated against ``base`` (same shape), exactly as the merge decides it.

    τ = agent − base in :func:`compute_dtype`, then :func:`delta_active`; for ``"changed"`` across dtypes the
    stored values are compared in the narrower dtype (what a checkpoint stored in it would show), as the merge
    does. ``out``: a bool tensor of the shape to write into.
    """
    if activity.rule == "changed" and agent.dtype != base.dtype:
        narrow = narrower_dtype(agent.dtype, base.dtype)
        return torch.ne(agent.to(narrow), base.to(device=agent.device, dtype=narrow), out=out)
    wide = compute_dtype(agent.dtype, base.dtype)
    delta = agent.to(wide) - base.to(device=agent.device, dtype=wide)
    return torch.logical_not(delta.abs_() <= activity.threshold_for(wide), out=out)


def count_active(agent: Tensor, base: Tensor, activity: ActivityRule) -> int:
    """The number of entries :func:`active_mask` marks, in chunks (memory stays a few chunks whatever the size)."""
    a, b = agent.reshape(-1), base.reshape(-1)
    return sum(
        int(torch.count_nonzero(active_mask(a[s : s + _CHUNK], b[s : s + _CHUNK], activity)))
        for s in range(0, a.numel(), _CHUNK)
    )


def count_delta_active(delta: Tensor, activity: ActivityRule) -> int:
    """The number of entries :func:`delta_active` marks in ``delta``, in chunks."""
    d = delta.reshape(-1)
    return sum(int(torch.count_nonzero(delta_active(d[s : s + _CHUNK], activity))) for s in range(0, d.numel(), _CHUNK))
