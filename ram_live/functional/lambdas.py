"""The RAM+ λ formula, once: ρ from the counts, λ from ρ (every caller — the merge, the probe, the schedules,
the integrations — computes λ with these two)."""

from __future__ import annotations

import math

__all__ = ["ram_lambda", "rho"]


def rho(unique: float, active: float) -> float:
    """Overlap-unique ratio ρ = shared / unique; +inf when the agent has no unique entry (the spec's rule, also
    for an agent that changed nothing: its λ then scales no entry)."""
    return (active - unique) / unique if unique > 0 else math.inf


def ram_lambda(rho_value: float, variant: str, r: float, alpha: float) -> float:
    """λ_t for ``variant`` in {"ram", "ram_plus", "ram_plus_soft"} (see the spec). ``alpha=math.inf``: no
    clip; an agent with ρ = +∞ has no unique entry for λ to scale, and gets 1.0 there (a finite λ: the kernels
    multiply masks by it).

    >>> ram_lambda(rho(unique=2, active=6), "ram_plus", r=0.1, alpha=1.0)   # ρ = 2, clipped to α = 1
    1.1
    """
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
