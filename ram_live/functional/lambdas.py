"""ρ from the counts, and λ from ρ by a short method name (the formulas are the λ rules of
:mod:`ram_live.ram_config`; the probe, the schedules and the integrations call these two)."""

from __future__ import annotations

import dataclasses
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
    from ..ram_config import RULES  # the formulas live with the rules

    if variant not in RULES:
        raise ValueError(f"unknown RAM variant {variant!r}")
    names = {f.name for f in dataclasses.fields(RULES[variant])}
    return RULES[variant](**{k: v for k, v in (("r", r), ("alpha", alpha)) if k in names}).value(rho_value)
