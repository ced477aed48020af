"""DARE: drop each task-vector entry at random, rescale the survivors, then task arithmetic or TIES' election."""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Any, Literal, Sequence

import torch
from torch import Tensor

from .. import functional as F
from ..errors import ConfigError
from ..option_checks import check_densities, check_finite, check_range, check_seed, check_weights
from .base import MethodKernels, TensorContext, TensorView, agent_densities, agent_weights, scaled
from .baseline_device import linear_group, device_stream, merge_linear, merge_ties
from .registry import register_method
from .ties import check_election, ties_elect

__all__ = ["DareLinearConfig", "DareTiesConfig", "dare_generator"]


@dataclass(frozen=True)
class DareLinearConfig:
    """Drop each entry of τ_t with probability 1 − ``density``, rescale survivors by 1/density, then task
    arithmetic. Equals ``peft.utils.merge_utils.dare_linear`` for the same masks (× ``scale``). The mask of
    (agent, tensor) is drawn from a generator seeded with ``stable_seed(seed, agent, key)``. ``densities``: one
    density per agent, in the agents' order, instead of ``density`` for all.

    Attributes:
        density: the share of each τ_t's entries kept, in (0, 1].
        weights: one weight per agent (None: all 1).
        scale: the factor on the weighted sum.
        seed: the masks' seed.
        densities: one density per agent, instead of ``density``.

    Raises:
        ConfigError: an option out of its range, naming it.

    >>> merge(agents, base=base, config=DareLinearConfig(density=0.3, seed=1))  # doctest: +SKIP
    """

    density: float = 0.5
    weights: Sequence[float] | None = None
    scale: float = 1.0
    seed: int = 0
    densities: Sequence[float] | None = None

    def __post_init__(self) -> None:
        check_range("density", self.density, 0.0, 1.0)
        if self.density == 0:
            raise ConfigError("density must be > 0 for DARE (survivors are rescaled by 1/density)")
        check_densities(self.densities, positive=True)
        check_weights(self.weights)
        check_finite("scale", self.scale)
        check_seed("seed", self.seed)


@dataclass(frozen=True)
class DareTiesConfig(DareLinearConfig):
    """DARE's random drop, then TIES' sign election and disjoint mean (PEFT's ``dare_ties`` by default;
    ``divide_by="none"``: mergekit's ``normalize: false``).

    Attributes:
        density, weights, scale, seed, densities: as :class:`DareLinearConfig`.
        majority_sign: ``"total"`` (the sign of Σ τ) or ``"frequency"`` (the sign most agents have).
        elect_on: ``"unweighted"`` or ``"weighted"`` (mergekit's: the sign of Σ w_t τ_t).
        divide_by: ``"count"`` (agreeing agents), ``"weights"`` (their weights) or ``"none"`` (the sum).

    Raises:
        ConfigError: an option out of its range, naming it.

    >>> merge(agents, base=base, config=DareTiesConfig(density=0.3))  # doctest: +SKIP
    """

    majority_sign: Literal["total", "frequency"] = "total"
    elect_on: Literal["unweighted", "weighted"] = "unweighted"
    divide_by: Literal["count", "weights", "none"] = "count"

    def __post_init__(self) -> None:
        super().__post_init__()
        check_election(self)


def dare_generator(seed: int, agent: str, key: str, device: torch.device) -> torch.Generator:
    """The generator DARE draws agent ``agent``'s mask of tensor ``key`` from."""
    generator = torch.Generator(device=device)
    generator.manual_seed(F.stable_seed("dare", seed, agent, key))
    return generator


@dataclass
class DareState:
    """One tensor's generators and densities (per agent), and the reused keep-mask buffer; on the device path
    (``seeds`` set) the masks' seeds and the weights instead of generators."""

    generators: list[torch.Generator]
    densities: list[float]
    keep: Tensor | None = None
    seeds: list[int] | None = None
    weights: Tensor | None = None


def dare_prepare(config: DareLinearConfig, view: TensorView, weights: Tensor) -> DareState:
    """The tensor's generators (seeded by agent and key) and the agents' densities. Where the device path takes the
    tensor: the same seeds, for the kernels' Philox masks (which differ from the CPU generators' masks)."""
    densities = agent_densities(config, view.agents)
    if device_stream(view) is not None:
        seeds = [F.stable_seed("dare", config.seed, a, view.key) for a in view.agents]
        return DareState([], densities, seeds=seeds, weights=weights)
    return DareState([dare_generator(config.seed, a, view.key, view.device) for a in view.agents], densities)


def _dare_kernels(config: DareLinearConfig) -> MethodKernels:
    def merge(stream: Any, out: Tensor, state: Any, workers: int) -> Any:
        if not isinstance(state, DareState) or state.seeds is None:
            return None
        drop = {"weights": state.weights, "densities": state.densities, "seeds": state.seeds}
        if isinstance(config, DareTiesConfig):
            return "device", functools.partial(merge_ties, config=config, **drop)
        return "device", functools.partial(merge_linear, scale=config.scale, **drop)

    scale = 1.0 if isinstance(config, DareTiesConfig) else config.scale
    return MethodKernels(merge=merge, group=functools.partial(linear_group, scale, dare=config))


def dare_drop(deltas: Tensor, ctx: TensorContext, config: DareLinearConfig) -> Tensor:
    """``deltas`` with DARE's drop and rescale applied in place, chunk by chunk from the tensor's generators."""
    state: DareState = ctx.state
    if not state.generators:  # a device state whose kernel did not run: the CPU's masks
        state.generators = [dare_generator(config.seed, a, ctx.key, deltas.device) for a in ctx.agents]
    if state.keep is None or state.keep.numel() < deltas.shape[1]:
        state.keep = torch.empty(deltas.shape[1], dtype=deltas.dtype, device=deltas.device)
    keep = state.keep[: deltas.shape[1]]
    if config.densities is None:
        return F.dare_drop_(deltas, config.density, state.generators, keep)
    for t, (density, generator) in enumerate(zip(state.densities, state.generators)):
        F.dare_drop_(deltas[t : t + 1], density, [generator], keep)  # a row view: dropped in place
    return deltas


register_method(
    "dare_linear",
    DareLinearConfig,
    lambda deltas, ctx, config: scaled(
        F.task_arithmetic_combine(dare_drop(deltas, ctx, config), ctx.run_state), config.scale
    ),
    setup=lambda config, ctx: agent_weights(config.weights, ctx),
    prepare=dare_prepare,
    kernels=_dare_kernels,
    description="DARE drop-and-rescale, then task arithmetic",
)

register_method(
    "dare_ties",
    DareTiesConfig,
    lambda deltas, ctx, config: ties_elect(dare_drop(deltas, ctx, config), ctx.run_state, config),
    setup=lambda config, ctx: agent_weights(config.weights, ctx),
    prepare=dare_prepare,
    kernels=_dare_kernels,
    description="DARE drop-and-rescale, then TIES election",
)
