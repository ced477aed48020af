"""RAM, RAM+ and RAM+s: the disjoint mean over the agents that updated an entry, unique entries kept (scaled by
the config's λ rule); the engine's hooks for :class:`~ram_live.ram_config.RamConfig`, λ, the importance check, and
the fast kernels and overflow bound they declare. The config and its λ rules are in :mod:`ram_live.ram_config`."""

from __future__ import annotations

import math
from typing import Any, Sequence

import torch
from torch import Tensor

from .. import functional as F
from ..errors import ConfigError, InvalidStateError
from ..ram_config import RAM_METHODS, RULES, Given, RamConfig, Unit
from ..types import Activity
from .base import MethodKernels, RunContext, TensorView
from .registry import register_method

__all__ = ["RAM_METHODS", "RamConfig", "given_lambdas", "lambda_bound", "lambdas_from_counts", "ram_activity",
           "ram_kernels", "ram_overflow_bound", "check_importance"]


# ----------------------------------------------------------------------------------------------- λ


def given_lambdas(config: RamConfig, agents: Sequence[str]) -> list[float]:
    """``Given`` λ in the agents' order; :class:`ConfigError` naming unknown and missing agents."""
    if not isinstance(config.lam, Given):
        raise ConfigError(f"{config.method}: no lambdas to take (lam={config.lam!r}: λ comes from the counts)")
    lambdas = config.lam.lambdas
    unknown = [n for n in lambdas if n not in agents]
    missing = [n for n in agents if n not in lambdas]
    if unknown or missing:
        parts = ([f"unknown agent(s) {', '.join(map(repr, unknown))}"] if unknown else []) + (
            [f"no λ for agent(s) {', '.join(map(repr, missing))}"] if missing else [])
        raise ConfigError(f"lambdas: {'; '.join(parts)} (the merged agents are {', '.join(map(repr, agents))}; "
                          "name every one of them)")
    return [lambdas[n] for n in agents]


def lambda_bound(config: RamConfig, run_lambdas: Tensor | None = None) -> float:
    """The largest |λ| any entry of ``config``'s merge can get (``math.inf`` where nothing bounds it: RAM+ with
    an uncapped α and tensor-local ρ); ``run_lambdas``: the merge's global λ, where known."""
    if isinstance(run_lambdas, Tensor) and run_lambdas.numel():
        return max(1.0, float(run_lambdas.abs().max()))
    return config.lam.bound()


def lambdas_from_counts(config: RamConfig, active: Tensor, unique: Tensor) -> list[float]:
    """λ_t per agent from per-agent counts: ``config.lam.value`` of :func:`ram_live.functional.rho`."""
    return [config.lam.value(F.rho(float(u), float(a))) for a, u in zip(active.tolist(), unique.tolist())]


def _ram_setup(config: RamConfig, ctx: RunContext) -> Tensor | None:
    if isinstance(config.lam, Given):
        return torch.tensor(given_lambdas(config, ctx.agents), dtype=torch.float64, device=ctx.device)
    if not config.lam.uses_rho or config.rho_scope == "tensor":
        return None
    if ctx.statistics is None:  # a method registered with this setup but without needs_statistics
        raise InvalidStateError(f"{config.method} with rho_scope='global' needs the RAM counts of the statistics "
                                "pass, and the run has none (does the method declare needs_statistics?)")
    return torch.tensor(
        lambdas_from_counts(config, ctx.statistics.active, ctx.statistics.unique),
        dtype=torch.float64,
        device=ctx.device,
    )


def _ram_prepare(config: RamConfig, view: TensorView, run_lambdas: Tensor | None) -> Tensor | None:
    if not config.lam.uses_rho:
        return run_lambdas  # given λ, or None for λ = 1
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
    return config.lam.uses_rho and config.rho_scope == "global"


def _ram_accumulator(config: RamConfig, lambdas: Tensor | None, capacity: int, k: int, device: torch.device,
                     dtype: torch.dtype, auxiliary: tuple[str, ...] = ()) -> F.RamAccumulator:
    cls = F.WeightedRamAccumulator if "importance" in auxiliary else F.RamAccumulator
    return cls(capacity, k, device, dtype, None if lambdas is None else lambdas.tolist(), sign=_sign(config))


def _sign(config: Any) -> bool:
    return getattr(config, "shared", "mean") == "sign"


def ram_kernels(config: Any) -> MethodKernels:
    """Every fast kernel (they compute RAM's rule); λ reaches them for every λ rule but :class:`Unit`. Another
    method that computes RAM's rule may declare it too, with a config of its own (no ``lam``: plain RAM).

    Example:
        >>> ram_kernels(RamConfig()).scaled, ram_kernels(RamConfig(lam=Unit())).scaled
        (True, False)
    """
    scaled = not isinstance(getattr(config, "lam", Unit()), Unit)
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


def configure_ram(method: str, config: RamConfig | None, options: dict[str, Any]) -> RamConfig:
    """The config of ``merge(method=method, config=config, **options)``: ``config`` as given, or built from the flat
    keywords (:meth:`RamConfig.from_flat`).

    Raises:
        ConfigError: a config that is not a :class:`RamConfig`, whose λ rule disagrees with ``method``, or given
            together with flat options.
    """
    if config is None:
        return RamConfig.from_flat(method, **options)
    if not isinstance(config, RamConfig):
        raise ConfigError(f"method {method!r} takes a RamConfig, got {type(config).__name__}")
    if options:
        raise ConfigError(f"give the RAM options in the config or as keywords of method={method!r}, not both "
                          f"(got config= and {', '.join(sorted(options))}=)")
    if not config.agrees(method):
        raise ConfigError(f"method={method!r} and config with lam={config.lam!r} disagree: that config is "
                          f"method {config.method!r} (pass the config alone, or the method name and keywords)")
    return config


_DESCRIPTIONS = {
    "ram": "RAM: disjoint mean over active agents, unique entries kept",
    "ram_plus": "RAM+: RAM with unique entries rescaled by λ_t = 1 + r·clip(ρ_t, 0, α)",
    "ram_plus_soft": "RAM+s: λ_t = 1 + r·ρ_t/(1 + ρ_t)",
}
for _name in RAM_METHODS:
    register_method(
        _name,
        RamConfig,
        lambda deltas, ctx, config: F.ram_combine(deltas, ctx.state, (ctx.auxiliary or {}).get("importance"),
                                                  sign=_sign(config)),
        setup=_ram_setup,
        prepare=_ram_prepare,
        activity=ram_activity,
        needs_statistics=_ram_needs_statistics,
        accumulator=_ram_accumulator,
        description=_DESCRIPTIONS.get(_name) or (RULES[_name].__doc__ or "").split("\n")[0],
        auxiliary=("importance",),
        check_auxiliary=check_importance,
        kernels=ram_kernels,
        overflow_bound=ram_overflow_bound,
        configure=lambda _, config, options, short=_name: configure_ram(short, config, options),
    )
