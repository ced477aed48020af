"""TIES: trim each task vector to its largest magnitudes, elect a sign per entry, average the agreeing entries."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal, Sequence

import torch
from torch import Tensor

from .. import functional as F
from .base import TensorView
from ..option_checks import check_choice, check_densities, check_finite, check_range, check_weights
from .base import agent_densities, agent_weights, scaled
from .registry import register_method

__all__ = ["TiesConfig", "ties_prepare", "ties_elect", "check_election"]


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


def ties_prepare(config: TiesConfig, view: TensorView, weights: Tensor) -> list[float | None]:
    """Per agent, the magnitude threshold of its top-density trim over the whole tensor."""
    densities = agent_densities(config, view.agents)
    return [F.magnitude_threshold(view.delta(t), densities[t]) for t in range(len(view.agents))]


def ties_elect(deltas: Tensor, weights: Tensor, config: Any) -> Tensor:
    """Sign election and the disjoint mean (or sum, ``divide_by="none"``) of trimmed or dropped deltas."""
    if config.divide_by == "none":  # mergekit's normalize: false: Σ_t w_t τ_t over the agreeing entries
        w = weights.to(deltas.dtype).view(-1, 1)
        weighted = deltas * w
        elected_from = weighted if config.elect_on == "weighted" else deltas
        magnitude = elected_from.sum(dim=0) if config.majority_sign == "total" else elected_from.sign().sum(dim=0)
        tau = (weighted * (deltas.sign() == torch.where(magnitude >= 0, 1.0, -1.0))).sum(dim=0)
        return scaled(tau, config.scale)
    tau = F.ties_combine(
        deltas, weights, majority_sign=config.majority_sign, elect_on=config.elect_on, divide_by=config.divide_by
    )
    return scaled(tau, config.scale)


register_method(
    "ties",
    TiesConfig,
    lambda deltas, ctx, config: ties_elect(F.trim_(deltas, ctx.state), ctx.run_state, config),
    setup=lambda config, ctx: agent_weights(config.weights, ctx),
    prepare=ties_prepare,
    description="TIES: trim, elect sign, disjoint mean",
)
