"""Task arithmetic: the base plus a scaled, weighted sum of the task vectors."""

from __future__ import annotations

import functools

from dataclasses import dataclass
from typing import Sequence

from .. import functional as F
from ..option_checks import check_finite, check_weights
from .base import MethodKernels, agent_weights, scaled
from .baseline_device import device_stream, linear_group, linear_merge_hook
from .registry import register_method

__all__ = ["TaskArithmeticConfig"]


@dataclass(frozen=True)
class TaskArithmeticConfig:
    """θ* = θ₀ + scale · Σ_t w_t τ_t. With ``scale=1`` equals ``peft.utils.merge_utils.task_arithmetic``.

    Attributes:
        weights: one weight per agent, in the agents' order (None: all 1).
        scale: the factor on the weighted sum.

    Raises:
        ConfigError: weights or scale that are not finite numbers.

    >>> merge(agents, base=base, config=TaskArithmeticConfig(scale=0.5))  # doctest: +SKIP
    """

    weights: Sequence[float] | None = None
    scale: float = 1.0

    def __post_init__(self) -> None:
        check_weights(self.weights)
        check_finite("scale", self.scale)


register_method(
    "task_arithmetic",
    TaskArithmeticConfig,
    lambda deltas, ctx, config: scaled(F.task_arithmetic_combine(deltas, ctx.run_state), config.scale),
    setup=lambda config, ctx: agent_weights(config.weights, ctx),
    prepare=lambda config, view, weights: weights if device_stream(view) is not None else None,
    kernels=lambda config: MethodKernels(
        merge=linear_merge_hook(config.scale), group=functools.partial(linear_group, config.scale)
    ),
    description="base + scale × weighted sum of task vectors",
)
