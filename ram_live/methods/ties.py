"""TIES: trim each task vector to its largest magnitudes, elect a sign per entry, average the agreeing entries."""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Any, Literal, Sequence

from torch import Tensor

from .. import functional as F
from ..kernels.device.select import MagnitudeSelection, select_magnitudes
from ..option_checks import check_choice, check_densities, check_finite, check_range, check_weights
from .base import MethodKernels, TensorContext, TensorView, agent_densities, agent_weights, scaled
from .baseline_device import device_stream, merge_ties, ties_group
from .registry import register_method

__all__ = ["TiesConfig", "TiesDeviceState", "ties_prepare", "ties_elect", "check_election"]


def check_election(config: Any) -> None:
    """The sign-election options TIES and DARE-TIES share."""
    check_choice("majority_sign", config.majority_sign, ("total", "frequency"))
    check_choice("elect_on", config.elect_on, ("unweighted", "weighted"))
    check_choice("divide_by", config.divide_by, ("count", "weights", "none"))


@dataclass(frozen=True)
class TiesConfig:
    """Trim each τ_t to its top-``density`` magnitudes (per tensor), elect signs, average agreeing entries.

    Defaults equal ``peft.utils.merge_utils.ties`` (then × ``scale``); ``elect_on="weighted",
    divide_by="weights"`` is mergekit's convention (``divide_by="none"``: mergekit's ``normalize: false``, the
    weighted sum of the agreeing entries). ``densities``: one density per agent, in the agents' order (mergekit's
    per-model ``density``), instead of ``density`` for all.

    Attributes:
        density: the share of each τ_t's entries kept (by magnitude, per tensor), in [0, 1].
        weights: one weight per agent (None: all 1).
        scale: the factor on the merged τ*.
        majority_sign: ``"total"`` (the sign of Σ τ) or ``"frequency"`` (the sign most agents have).
        elect_on: ``"unweighted"`` or ``"weighted"`` (mergekit's: the sign of Σ w_t τ_t).
        divide_by: ``"count"`` (agreeing agents), ``"weights"`` (their weights) or ``"none"`` (the sum).
        densities: one density per agent, instead of ``density``.

    Raises:
        ConfigError: an option out of its range, naming it.

    >>> merge(agents, base=base, config=TiesConfig(density=0.2))  # doctest: +SKIP
    """

    density: float = 0.2
    weights: Sequence[float] | None = None
    scale: float = 1.0
    majority_sign: Literal["total", "frequency"] = "total"
    elect_on: Literal["unweighted", "weighted"] = "unweighted"
    divide_by: Literal["count", "weights", "none"] = "count"
    densities: Sequence[float] | None = None

    def __post_init__(self) -> None:
        check_range("density", self.density, 0.0, 1.0)
        check_densities(self.densities, positive=False)
        check_weights(self.weights)
        check_finite("scale", self.scale)
        check_election(self)


@dataclass(frozen=True)
class TiesDeviceState:
    """One tensor's state on the device path: the trim's radix select (left on the device) and the weights."""

    selection: MagnitudeSelection
    weights: Tensor


def ties_prepare(config: TiesConfig, view: TensorView, weights: Tensor) -> list[float | None] | TiesDeviceState:
    """Per agent, the magnitude threshold of its top-density trim over the whole tensor: host floats by
    ``kthvalue``, or where the device path takes the tensor a radix select on the device (no host read)."""
    densities = agent_densities(config, view.agents)
    stream = device_stream(view)
    if stream is not None:
        return TiesDeviceState(select_magnitudes(stream.base, stream.tensors, densities), weights)
    return [F.magnitude_threshold(view.delta(t), densities[t]) for t in range(len(view.agents))]


def _ties_combine(deltas: Tensor, ctx: TensorContext, config: TiesConfig) -> Tensor:
    state = ctx.state
    thresholds = state.selection.thresholds(deltas.device) if isinstance(state, TiesDeviceState) else state
    return ties_elect(F.trim_(deltas, thresholds), ctx.run_state, config)


def _ties_kernels(config: TiesConfig) -> MethodKernels:
    def merge(stream: Any, out: Tensor, state: Any, workers: int) -> Any:
        if not isinstance(state, TiesDeviceState):
            return None
        return "device", functools.partial(merge_ties, weights=state.weights, config=config, selection=state.selection)

    return MethodKernels(merge=merge, group=functools.partial(ties_group, config))


def ties_elect(deltas: Tensor, weights: Tensor, config: Any) -> Tensor:
    """Sign election and the disjoint mean (or sum, ``divide_by="none"``) of trimmed or dropped deltas."""
    tau = F.ties_combine(
        deltas, weights, majority_sign=config.majority_sign, elect_on=config.elect_on, divide_by=config.divide_by
    )
    return scaled(tau, config.scale)


register_method(
    "ties",
    TiesConfig,
    _ties_combine,
    setup=lambda config, ctx: agent_weights(config.weights, ctx),
    prepare=ties_prepare,
    kernels=_ties_kernels,
    description="TIES: trim, elect sign, disjoint mean",
)
