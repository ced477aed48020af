"""RAM, RAM+ and RAM+s registered as merge methods: the engine's hooks for :class:`~.config.RamConfig` (λ once per
merge or per tensor, the activity rule, the importance check, the eager accumulator, what it reports) and what
they declare (the fast paths of :mod:`.fast`, the overflow bound)."""

from __future__ import annotations

import functools
import math
from typing import Any

import torch
from torch import Tensor

from ...errors import ConfigError, InvalidStateError
from ...types import Activity, MergeInfo
from ...kernels import cc
from ..base import MethodKernels, RunContext, TensorView
from ..registry import register_method
from .accumulators import RamAccumulator, WeightedRamAccumulator
from . import native as ram_native
from .config import RamConfig
from .rules import RAM_METHODS, RULES, Given, Unit
from .device import count_group_runner, group_runner
from .fast import device_merges, merge_kernel, native_statistics, warm_up
from .lambdas import given_lambdas, lambda_bound, lambdas_from_counts, rho
from .reference import ram_combine
from .single_read import reads_once, single_read_pass

__all__ = ["check_importance", "configure_ram", "ram_activity", "ram_kernels", "ram_overflow_bound", "record_lambdas"]


def _setup(config: RamConfig, ctx: RunContext) -> Tensor | None:
    if isinstance(config.lam, Given):
        return torch.tensor(given_lambdas(config, ctx.agents), dtype=torch.float64, device=ctx.device)
    if not config.lam.uses_rho or config.rho_scope == "tensor":
        return None
    if ctx.statistics is None:  # a method registered with this setup but without needs_statistics
        raise InvalidStateError(
            f"{config.method} with rho_scope='global' needs the RAM counts of the statistics "
            "pass, and the run has none (does the method declare needs_statistics?)"
        )
    return torch.tensor(
        lambdas_from_counts(config, ctx.statistics.active, ctx.statistics.unique),
        dtype=torch.float64,
        device=ctx.device,
    )


def _prepare(config: RamConfig, view: TensorView, run_lambdas: Tensor | None) -> Tensor | None:
    if not config.lam.uses_rho:
        return run_lambdas  # given λ, or None for λ = 1
    if config.rho_scope == "global":
        return run_lambdas
    stats = view.statistics(ram_activity(config))
    lambdas = lambdas_from_counts(config, stats.active, stats.unique)
    return torch.tensor(lambdas, dtype=torch.float64, device=view.device)


def ram_activity(config: RamConfig) -> Activity:
    """The config's activity rule."""
    return Activity(rule=config.activity, eps=config.eps)


def _needs_statistics(config: RamConfig) -> bool:
    return config.lam.uses_rho and config.rho_scope == "global"


def _accumulator(
    config: RamConfig,
    lambdas: Tensor | None,
    capacity: int,
    k: int,
    device: torch.device,
    dtype: torch.dtype,
    auxiliary: tuple[str, ...] = (),
) -> RamAccumulator:
    cls = WeightedRamAccumulator if "importance" in auxiliary else RamAccumulator
    return cls(capacity, k, device, dtype, None if lambdas is None else lambdas.tolist(), sign=config.shared == "sign")


def _combine(deltas: Tensor, ctx: Any, config: RamConfig) -> Tensor:
    importance = (ctx.auxiliary or {}).get("importance")
    return ram_combine(deltas, ctx.state, importance, sign=config.shared == "sign")


def record_lambdas(config: RamConfig, info: MergeInfo, run_state: Any) -> None:
    """λ and ρ per agent in ``info`` where the run state is one λ per agent, from the counts or given."""
    statistics, names = info.statistics, info.agents
    given = isinstance(config.lam, Given)  # λ given per agent, no counts
    if isinstance(run_state, Tensor) and (statistics is not None or given) and run_state.numel() == len(names):
        info.lambdas = dict(zip(names, map(float, run_state.tolist())))
    if info.lambdas is not None and statistics is not None:
        info.rho = {
            n: rho(float(u), float(a)) for n, a, u in zip(names, statistics.active.tolist(), statistics.unique.tolist())
        }


def ram_kernels(config: Any) -> MethodKernels:
    """RAM's fast paths for ``config``: λ reaches them for every λ rule but :class:`~.config.Unit`; ``shared="sign"``
    has no single read (that merge counts first, then merges). Another method that computes RAM's rule may
    declare them too, with a config of its own (no ``lam``: plain RAM).

    Example:
        >>> ram_kernels(RamConfig()).single_read is not None
        True
    """
    scaled = not isinstance(getattr(config, "lam", Unit()), Unit)
    sign = getattr(config, "shared", "mean") == "sign"
    return MethodKernels(
        merge=functools.partial(merge_kernel, sign=sign),
        count=native_statistics,
        reads_once=None if sign else reads_once,
        single_read=None if sign else single_read_pass,
        warm_up=functools.partial(warm_up, scaled=scaled, sign=sign),
        native=lambda: ram_native.kernels() is not None and cc.build_level() != "scalar",
        device=device_merges,
        group=functools.partial(group_runner, config),
        group_counts=count_group_runner,
    )


def ram_overflow_bound(config: RamConfig, run_state: Any) -> float:
    """|τ*| ≤ λ_max · K · max |τ| (the float32 sum of K task vectors, then the mean or λ):
    :func:`~.lambdas.lambda_bound`."""
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
        raise ConfigError(
            f"give the RAM options in the config or as keywords of method={method!r}, not both "
            f"(got config= and {', '.join(sorted(options))}=)"
        )
    if not config.agrees(method):
        raise ConfigError(
            f"method={method!r} and config with lam={config.lam!r} disagree: that config is "
            f"method {config.method!r} (pass the config alone, or the method name and keywords)"
        )
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
        _combine,
        setup=_setup,
        prepare=_prepare,
        activity=ram_activity,
        needs_statistics=_needs_statistics,
        accumulator=_accumulator,
        description=_DESCRIPTIONS.get(_name) or (RULES[_name].__doc__ or "").split("\n")[0],
        auxiliary=("importance",),
        check_auxiliary=check_importance,
        kernels=ram_kernels,
        overflow_bound=ram_overflow_bound,
        configure=lambda _, config, options, short=_name: configure_ram(short, config, options),
        record=record_lambdas,
    )
