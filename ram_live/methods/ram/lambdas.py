"""λ, the factor RAM+ puts on the entries one agent alone updated: ρ from the counts (:func:`rho`), λ per agent
from a config's rule (:func:`lambdas_from_counts`, :func:`given_lambdas`), by a short method name
(:func:`ram_lambda`, for the probe and the schedules), and its bound (:func:`lambda_bound`). The rules' formulas
are the λ rules of :mod:`.config`."""

from __future__ import annotations

import dataclasses
import math
from typing import Sequence

from torch import Tensor

from ...errors import ConfigError
from .config import RamConfig
from .rules import RULES, Given

__all__ = ["given_lambdas", "lambda_bound", "lambdas_from_counts", "ram_lambda", "rho"]


def rho(unique: float, active: float) -> float:
    """Overlap-unique ratio ρ = shared / unique; +inf when the agent has no unique entry (the spec's rule, also
    for an agent that changed nothing: its λ then scales no entry).

    >>> rho(unique=2, active=6)
    2.0
    """
    return (active - unique) / unique if unique > 0 else math.inf


def ram_lambda(rho_value: float, variant: str, r: float, alpha: float) -> float:
    """λ_t for ``variant`` in {"ram", "ram_plus", "ram_plus_soft"} (see the spec). ``alpha=math.inf``: no
    clip; an agent with ρ = +∞ has no unique entry for λ to scale, and gets 1.0 there (a finite λ: the kernels
    multiply masks by it).

    Raises:
        ValueError: an unknown variant.

    >>> ram_lambda(rho(unique=2, active=6), "ram_plus", r=0.1, alpha=1.0)   # ρ = 2, clipped to α = 1
    1.1
    """
    if variant not in RULES:
        raise ValueError(f"unknown RAM variant {variant!r}")
    names = {f.name for f in dataclasses.fields(RULES[variant])}
    return RULES[variant](**{k: v for k, v in (("r", r), ("alpha", alpha)) if k in names}).value(rho_value)


def given_lambdas(config: RamConfig, agents: Sequence[str]) -> list[float]:
    """``Given`` λ in the agents' order.

    Raises:
        ConfigError: a config whose λ rule is not :class:`~.config.Given`, or unknown and missing agents (named).
    """
    if not isinstance(config.lam, Given):
        raise ConfigError(f"{config.method}: no lambdas to take (lam={config.lam!r}: λ comes from the counts)")
    lambdas = config.lam.lambdas
    unknown = [n for n in lambdas if n not in agents]
    missing = [n for n in agents if n not in lambdas]
    if unknown or missing:
        parts = ([f"unknown agent(s) {', '.join(map(repr, unknown))}"] if unknown else []) + (
            [f"no λ for agent(s) {', '.join(map(repr, missing))}"] if missing else []
        )
        raise ConfigError(
            f"lambdas: {'; '.join(parts)} (the merged agents are {', '.join(map(repr, agents))}; "
            "name every one of them)"
        )
    return [lambdas[n] for n in agents]


def lambda_bound(config: RamConfig, run_lambdas: Tensor | None = None) -> float:
    """The largest |λ| any entry of ``config``'s merge can get (``math.inf`` where nothing bounds it: RAM+ with
    an uncapped α and tensor-local ρ); ``run_lambdas``: the merge's global λ, where known."""
    if isinstance(run_lambdas, Tensor) and run_lambdas.numel():
        return max(1.0, float(run_lambdas.abs().max()))
    return config.lam.bound()


def lambdas_from_counts(config: RamConfig, active: Tensor, unique: Tensor) -> list[float]:
    """λ_t per agent from per-agent counts: ``config.lam.value`` of :func:`rho`."""
    return [config.lam.value(rho(float(u), float(a))) for a, u in zip(active.tolist(), unique.tolist())]
