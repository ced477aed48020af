"""The option checks and small helpers the method configs share (weights, densities, ranges, agent names)."""

from __future__ import annotations

from collections.abc import Collection, Mapping
from typing import Any, Sequence

import torch
from torch import Tensor

from ..errors import ConfigError
from .base import RunContext

__all__ = ["FLOAT32_MAX", "check_choice", "check_finite", "check_range", "check_weights", "check_densities",
           "check_names", "agent_weights", "agent_densities", "scaled"]

from ..option_checks import FLOAT32_MAX, check_choice, check_finite, check_names, check_range


def check_weights(weights: Sequence[float] | None) -> None:
    """``weights``: None, or finite numbers, one per agent."""
    if weights is None:
        return
    if isinstance(weights, (Mapping, str, bytes)) or not isinstance(weights, Collection):
        raise ConfigError(
            f"weights must be a sequence of numbers, one per agent in the agents' order, got {type(weights).__name__}"
        )
    for i, w in enumerate(weights.tolist() if isinstance(weights, Tensor) else weights):
        check_finite(f"weights[{i}]", w)


def check_densities(densities: Sequence[float] | None, positive: bool) -> None:
    """``densities``: None, or numbers in [0, 1] (``positive``: > 0, as DARE rescales by 1/density)."""
    if densities is None:
        return
    if isinstance(densities, (Mapping, str, bytes)) or not isinstance(densities, Collection):
        raise ConfigError(f"densities must be a sequence of numbers, one per agent, got {type(densities).__name__}")
    for i, d in enumerate(densities):
        check_range(f"densities[{i}]", d, 0.0, 1.0)
        if positive and d == 0:
            raise ConfigError(f"densities[{i}] must be > 0 for DARE (survivors are rescaled by 1/density)")


def agent_weights(weights: Sequence[float] | None, ctx: RunContext) -> Tensor:
    """One weight per agent, in float64 (the combines cast them to the deltas' dtype: float64 inputs keep them
    exact)."""
    k = len(ctx.agents)
    if weights is None:
        return torch.ones(k, dtype=torch.float64, device=ctx.device)
    if len(weights) != k:
        raise ConfigError(f"weights has {len(weights)} entries for {k} agents ({', '.join(ctx.agents)})")
    return torch.tensor([float(w) for w in weights], dtype=torch.float64, device=ctx.device)


def agent_densities(config: Any, agents: Sequence[str]) -> list[float]:
    """The density of each agent: ``densities`` (checked against the agents) or ``density`` for all."""
    if config.densities is None:
        return [float(config.density)] * len(agents)
    if len(config.densities) != len(agents):
        raise ConfigError(f"densities has {len(config.densities)} entries for {len(agents)} agents "
                          f"({', '.join(agents)})")
    return [float(d) for d in config.densities]


def scaled(tau: Tensor, scale: float) -> Tensor:
    """``tau`` times ``scale`` (in place; untouched for 1)."""
    return tau if scale == 1.0 else tau.mul_(scale)
