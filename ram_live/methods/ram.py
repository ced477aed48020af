"""RAM, RAM+ and RAM+s: the disjoint mean over the agents that updated an entry, unique entries kept (RAM+:
rescaled by λ_t from the overlap ratio ρ_t); their configs, λ, the importance check, and the fast kernels and
overflow bound they declare to the engine."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Sequence

import torch
from torch import Tensor

from .. import functional as F
from ..errors import ConfigError, InvalidStateError
from ..options import RAM_VARIANTS, RamFields, RamPlusFields
from ..types import Activity
from .base import MethodKernels, RunContext, TensorView
from .registry import register_method

__all__ = ["RAM_VARIANTS", "RamConfig", "RamPlusConfig", "RamPlusSoftConfig", "given_lambdas", "lambda_bound",
           "lambdas_from_counts", "ram_activity", "ram_kernels", "ram_overflow_bound", "check_importance"]



@dataclass(frozen=True)
class RamConfig(RamFields):
    """RAM (paper Eq. 7, λ = 1): mean over the active agents where ≥ 2 updated, the one agent's τ where one
    did, the base where none did. ``activity``/``eps``: see :class:`~ram_live.types.Activity`.

    ``lambdas`` (every RAM variant): ``{agent: λ_t}`` for **every** merged agent, the factor on the entries that
    agent alone updated, instead of the ρ-derived λ (ρ is not counted then: no statistics pass; ``r``/``alpha``
    are unused). Names not among the merged agents, and merged agents left out, are :class:`ConfigError` naming
    them. λ_t = 1 for every agent is plain RAM, bit for bit. Any finite λ is taken (λ > 1 extrapolates τ_t).
    ``exclude``: names of agents to leave out of the merge, as if they were not passed (the search's
    leave-one-out candidates); at least one agent must remain.

    ``shared`` (every RAM variant; not the paper's rule unless ``"mean"``, the default): ``"sign"`` makes the
    shared region conflict-aware. Where two or more agents are active, the mean runs over those whose τ has the
    sign of the plain mean (of Σ w·τ with importances), and the others are left out; where that sum is 0, it stays
    the plain mean (0). Where every active agent agrees in sign, this is RAM's value, bit for bit, and unique
    entries and λ are unchanged (docs/methods.md).

    >>> cfg = RamConfig(lambdas={"coder": 2.0, "tools": 0.5})
    >>> cfg.lambdas["coder"]
    2.0
    """

    variant = "ram"


@dataclass(frozen=True)
class RamPlusConfig(RamConfig, RamPlusFields):
    """RAM+: unique entries of agent t scaled by λ_t = 1 + r · clip(ρ_t, 0, alpha) (paper: r=0.1, α=2).

    ``alpha=math.inf``: no clip, λ_t = 1 + r · max(ρ_t, 0). An agent with ρ_t = +∞ (no unique entry) has no
    entry for λ_t to scale; it is reported as 1 + r · alpha for a finite ``alpha`` and as 1.0 for an uncapped
    one. The authors' script is ``r=0.2, alpha=1.0``; mergekit's ``ramplus_tl`` is ``r=0.1, alpha=0.2,
    rho_scope="tensor"``."""

    variant = "ram_plus"


@dataclass(frozen=True)
class RamPlusSoftConfig(RamPlusConfig):
    """RAM+s: λ_t = 1 + r · ρ_t / (1 + ρ_t) = 1 + r · shared_t / active_t (``alpha`` is unused)."""

    variant = "ram_plus_soft"


# ----------------------------------------------------------------------------------------------- λ


def given_lambdas(config: RamConfig, agents: Sequence[str]) -> list[float]:
    """``config.lambdas`` in the agents' order; :class:`ConfigError` naming unknown and missing agents."""
    if config.lambdas is None:
        raise ConfigError(f"{config.variant}: no lambdas to take (lambdas=None: λ comes from the counts)")
    unknown = [n for n in config.lambdas if n not in agents]
    missing = [n for n in agents if n not in config.lambdas]
    if unknown or missing:
        parts = ([f"unknown agent(s) {', '.join(map(repr, unknown))}"] if unknown else []) + (
            [f"no λ for agent(s) {', '.join(map(repr, missing))}"] if missing else [])
        raise ConfigError(f"lambdas: {'; '.join(parts)} (the merged agents are {', '.join(map(repr, agents))}; "
                          "name every one of them)")
    return [config.lambdas[n] for n in agents]


def lambda_bound(config: RamConfig, run_lambdas: Tensor | None = None) -> float:
    """The largest |λ| any entry of ``config``'s merge can get (``math.inf`` where nothing bounds it: RAM+ with
    an uncapped α and tensor-local ρ); ``run_lambdas``: the merge's global λ, where known."""
    if isinstance(run_lambdas, Tensor) and run_lambdas.numel():
        return max(1.0, float(run_lambdas.abs().max()))
    if config.lambdas is not None:
        return max([1.0] + [abs(v) for v in config.lambdas.values()])
    r = getattr(config, "r", 0.0)
    if config.variant == "ram":
        return 1.0
    if config.variant == "ram_plus_soft":
        return 1.0 + r
    return 1.0 + r * config.alpha


def lambdas_from_counts(config: RamConfig, active: Tensor, unique: Tensor) -> list[float]:
    """λ_t per agent from per-agent counts, for ``config``'s variant (:func:`ram_live.functional.ram_lambda` of
    :func:`ram_live.functional.rho`)."""
    r = getattr(config, "r", 0.0)
    alpha = getattr(config, "alpha", math.inf)
    return [
        F.ram_lambda(F.rho(float(u), float(a)), config.variant, r, alpha)
        for a, u in zip(active.tolist(), unique.tolist())
    ]


def _ram_setup(config: RamConfig, ctx: RunContext) -> Tensor | None:
    if config.lambdas is not None:
        return torch.tensor(given_lambdas(config, ctx.agents), dtype=torch.float64, device=ctx.device)
    if config.variant == "ram" or getattr(config, "rho_scope", "global") == "tensor":
        return None
    if ctx.statistics is None:  # a method registered with this setup but without needs_statistics
        raise InvalidStateError(f"{config.variant} with rho_scope='global' needs the RAM counts of the statistics "
                                "pass, and the run has none (does the method declare needs_statistics?)")
    return torch.tensor(
        lambdas_from_counts(config, ctx.statistics.active, ctx.statistics.unique),
        dtype=torch.float64,
        device=ctx.device,
    )


def _ram_prepare(config: RamConfig, view: TensorView, run_lambdas: Tensor | None) -> Tensor | None:
    if config.lambdas is not None:
        return run_lambdas
    if config.variant == "ram":
        return None
    if config.rho_scope == "global":
        return run_lambdas
    stats = view.statistics(ram_activity(config))
    lambdas = lambdas_from_counts(config, stats.active, stats.unique)
    return torch.tensor(lambdas, dtype=torch.float64, device=view.device)


# ----------------------------------------------------------------------------------------------- hooks


def ram_activity(config: RamConfig) -> Activity:
    """The config's activity rule."""
    return Activity(rule=config.activity, eps=config.eps)


def _ram_needs_statistics(config: RamConfig) -> bool:
    return config.lambdas is None and config.variant != "ram" and config.rho_scope == "global"


def _ram_accumulator(config: RamConfig, lambdas: Tensor | None, capacity: int, k: int, device: torch.device,
                     dtype: torch.dtype, auxiliary: tuple[str, ...] = ()) -> F.RamAccumulator:
    cls = F.WeightedRamAccumulator if "importance" in auxiliary else F.RamAccumulator
    return cls(capacity, k, device, dtype, None if lambdas is None else lambdas.tolist(), sign=_sign(config))


def _sign(config: Any) -> bool:
    return getattr(config, "shared", "mean") == "sign"


def ram_kernels(config: Any) -> MethodKernels:
    """Every fast kernel (they compute RAM's rule); λ reaches them for RAM+ variants or given ``lambdas``. Another
    method that computes RAM's rule may declare it too, with a config of its own (no ``variant``: plain RAM).

    Example:
        >>> ram_kernels(RamPlusConfig()).scaled, ram_kernels(RamConfig()).scaled
        (True, False)
    """
    scaled = getattr(config, "variant", "ram") != "ram" or getattr(config, "lambdas", None) is not None
    # the single read merges as plain RAM while counting: not the sign rule (that merge counts first, then merges)
    return MethodKernels(native=True, compiled=True, single_read=not _sign(config), scaled=scaled, sign=_sign(config))


def ram_overflow_bound(config: RamConfig, run_state: Any) -> float:
    """|τ*| ≤ λ_max · K · max |τ| (the float32 sum of K task vectors, then the mean or λ): :func:`lambda_bound`."""
    return lambda_bound(config, run_state)


def check_importance(name: str, flat: Tensor) -> tuple[int, str] | None:
    """The first entry of an agent's flat importances that is negative, NaN or Inf, as ``(index, reason)``."""
    bad = ~((flat >= 0) & (flat != math.inf))
    if not bool(bad.any()):
        return None
    index = int(bad.nonzero()[0, 0])
    value = float(flat[index])
    return index, f"holds {value} (importances must be finite and >= 0)"


for _name, _cls, _desc in (
    ("ram", RamConfig, "RAM: disjoint mean over active agents, unique entries kept"),
    ("ram_plus", RamPlusConfig, "RAM+: RAM with unique entries rescaled by λ_t = 1 + r·clip(ρ_t, 0, α)"),
    ("ram_plus_soft", RamPlusSoftConfig, "RAM+s: λ_t = 1 + r·ρ_t/(1 + ρ_t)"),
):
    register_method(
        _name,
        _cls,
        lambda deltas, ctx, config: F.ram_combine(deltas, ctx.state, (ctx.auxiliary or {}).get("importance"),
                                                  sign=_sign(config)),
        setup=_ram_setup,
        prepare=_ram_prepare,
        activity=ram_activity,
        needs_statistics=_ram_needs_statistics,
        accumulator=_ram_accumulator,
        description=_desc,
        auxiliary=("importance",),
        check_auxiliary=check_importance,
        kernels=ram_kernels,
        overflow_bound=ram_overflow_bound,
    )
