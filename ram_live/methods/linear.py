"""Linear: the weighted average of the models."""

from __future__ import annotations

import functools

import math
from dataclasses import dataclass
from typing import Sequence

from torch import Tensor

from .. import functional as F
from ..errors import ConfigError
from .base import RunContext
from ..option_checks import check_weights
from .base import MethodKernels, agent_weights
from .baseline_device import device_stream, linear_group, linear_merge_hook
from .registry import register_method

__all__ = ["LinearConfig"]


@dataclass(frozen=True)
class LinearConfig:
    """θ* = θ₀ + Σ_t w̃_t τ_t with w̃ = w / Σ_t w_t (``normalize=True``: = Σ_t w̃_t θ_t) or w̃ = w.

    Attributes:
        weights: one weight per agent, in the agents' order (None: all 1).
        normalize: divide the weights by their sum.

    Raises:
        ConfigError: weights that are not finite numbers.

    >>> merge(agents, base=base, config=LinearConfig(weights=[0.7, 0.3]))  # doctest: +SKIP
    """

    weights: Sequence[float] | None = None
    normalize: bool = True

    def __post_init__(self) -> None:
        check_weights(self.weights)


def linear_setup(config: LinearConfig, ctx: RunContext) -> Tensor:
    """The weights, normalised to sum to 1 where ``normalize``."""
    weights = agent_weights(config.weights, ctx)
    if config.normalize:
        total = float(weights.sum())
        if total == 0 or not math.isfinite(total):
            raise ConfigError(f"linear: the weights sum to {total} and normalize=True")
        weights = weights / total
    return weights


register_method(
    "linear",
    LinearConfig,
    lambda deltas, ctx, config: F.task_arithmetic_combine(deltas, ctx.run_state),
    setup=linear_setup,
    prepare=lambda config, view, weights: weights if device_stream(view) is not None else None,
    kernels=lambda config: MethodKernels(merge=linear_merge_hook(1.0), group=functools.partial(linear_group, 1.0)),
    description="weighted average of the models",
)
