"""Merge methods: one small config dataclass each, and a registry keyed by name.

A method is a stateless ``combine(deltas[K, C], ctx, config) -> τ*[C]`` plus optional hooks the engine calls:
``setup`` once per merge (e.g. RAM+'s global λ from the statistics pass), ``prepare`` once per tensor (TIES
thresholds, DARE generators, tensor-local λ). Register your own:

>>> @register_method("median", MedianConfig)                     # doctest: +SKIP
... def median(deltas, ctx, config):
...     return deltas.median(dim=0).values
"""

from __future__ import annotations

import dataclasses
import math
import numbers
from collections.abc import Collection, Mapping
from dataclasses import dataclass
from typing import Any, Callable, Literal, Protocol, Sequence

import torch
from torch import Tensor

from . import functional as F
from .errors import ConfigError, MethodExistsError, UnknownMethodError
from .types import Activity, RamStatistics

__all__ = [
    "Activity",
    "RunContext",
    "TensorContext",
    "TensorView",
    "MergeMethod",
    "register_method",
    "get_method",
    "available_methods",
    "make_config",
    "LinearConfig",
    "TaskArithmeticConfig",
    "TiesConfig",
    "DareLinearConfig",
    "DareTiesConfig",
    "RamConfig",
    "RamPlusConfig",
    "RamPlusSoftConfig",
]


# ----------------------------------------------------------------------------------------------- contexts


@dataclass(frozen=True)
class RunContext:
    agents: tuple[str, ...]
    statistics: RamStatistics | None
    device: torch.device


@dataclass(frozen=True)
class TensorContext:
    """What a ``combine`` call knows besides the deltas: which tensor, which agents, and the hooks' states."""

    key: str
    agents: tuple[str, ...]
    start: int
    run_state: Any = None
    state: Any = None
    #: the method's per-agent auxiliary inputs of this chunk, ``{name: [K, C]}`` (see ``MergeMethod.auxiliary``)
    auxiliary: Mapping[str, Tensor] | None = None


class TensorView(Protocol):
    """The engine's view of one tensor across agents, for ``prepare`` hooks."""

    key: str
    numel: int
    agents: tuple[str, ...]
    device: torch.device

    def delta(self, index: int) -> Tensor:
        """Agent ``index``'s whole task vector for this tensor, flat, float32."""

    def statistics(self, activity: Activity) -> RamStatistics:
        """RAM counts over this tensor only."""


Combine = Callable[[Tensor, TensorContext, Any], Tensor]


@dataclass(frozen=True)
class MergeMethod:
    name: str
    config_cls: type
    combine: Combine
    setup: Callable[[Any, RunContext], Any] | None = None
    prepare: Callable[[Any, TensorView, Any], Any] | None = None
    activity: Callable[[Any], Activity | None] = lambda config: None
    needs_statistics: Callable[[Any], bool] = lambda config: False
    #: Optional fast path: ``accumulator(config, state, capacity, k, device, dtype)`` returns an object with
    #: ``begin(n)``, ``add(t, delta)`` (one agent at a time) and ``merged(base_f) -> θ₀ + τ*``; it must compute
    #: exactly what ``combine`` computes (tests check both).
    accumulator: Callable[..., Any] | None = None
    description: str = ""
    #: Per-agent auxiliary inputs the method takes (e.g. RAM's ``"importance"``), tensors of the parameters'
    #: shapes streamed chunk by chunk like the agents: ``combine`` finds them in ``ctx.auxiliary``, accumulators
    #: are built with ``auxiliary=(names)`` and get ``add(t, delta, **{name: chunk})``.
    auxiliary: tuple[str, ...] = ()
    #: ``check_auxiliary(name, flat)``: ``(index, reason)`` of the first invalid entry of one agent's auxiliary
    #: tensor, or None; the engine raises naming the agent and tensor.
    check_auxiliary: Callable[[str, Tensor], tuple[int, str] | None] | None = None


_REGISTRY: dict[str, MergeMethod] = {}


def register_method(
    name: str,
    config_cls: type,
    combine: Combine | None = None,
    **hooks: Any,
) -> Any:
    """Register a merge method under ``name``; usable as a decorator on ``combine``.

    Raises :class:`MethodExistsError` when the name is taken.
    """

    def _register(fn: Combine) -> Combine:
        if name in _REGISTRY:
            raise MethodExistsError(f"a merge method named {name!r} is already registered")
        if not dataclasses.is_dataclass(config_cls):
            raise ConfigError(f"config_cls of {name!r} must be a dataclass, got {config_cls!r}")
        _REGISTRY[name] = MergeMethod(name=name, config_cls=config_cls, combine=fn, **hooks)
        return fn

    return _register(combine) if combine is not None else _register


def get_method(name: str) -> MergeMethod:
    try:
        return _REGISTRY[name]
    except KeyError:
        raise UnknownMethodError(
            f"unknown merge method {name!r}; available: {', '.join(sorted(_REGISTRY))}"
        ) from None


def available_methods() -> list[str]:
    return sorted(_REGISTRY)


def make_config(name: str, config: Any = None, **options: Any) -> Any:
    """Build ``name``'s config from keyword options (over ``config``'s where given), naming any unknown option."""
    method = get_method(name)
    if config is not None and not isinstance(config, method.config_cls):
        raise ConfigError(f"method {name!r} takes a {method.config_cls.__name__}, got {type(config).__name__}")
    known = {f.name for f in dataclasses.fields(method.config_cls)}
    unknown = sorted(set(options) - known)
    if unknown:
        raise ConfigError(
            f"unknown option(s) {', '.join(map(repr, unknown))} for method {name!r}; "
            f"its options are: {', '.join(sorted(known))}"
        )
    if config is not None and not options:
        return config
    try:
        return dataclasses.replace(config, **options) if config is not None else method.config_cls(**options)
    except (TypeError, ValueError) as exc:
        raise ConfigError(f"invalid options for method {name!r}: {exc}") from exc


# ----------------------------------------------------------------------------------------------- helpers


def _check_choice(name: str, value: Any, choices: Sequence[Any]) -> None:
    if value not in choices:
        raise ConfigError(f"{name} must be one of {', '.join(map(repr, choices))}, got {value!r}")


#: Options are applied to float32 task vectors: a value beyond float32's range is as useless as ±Inf.
_FLOAT32_MAX = torch.finfo(torch.float32).max


def _check_finite(name: str, value: Any) -> None:
    if not (isinstance(value, numbers.Real) and abs(value) <= _FLOAT32_MAX):
        raise ConfigError(f"{name} must be a finite number (|x| <= {_FLOAT32_MAX:.4g}), got {value!r}")


def _check_range(name: str, value: float, low: float, high: float = math.inf) -> None:
    _check_finite(name, value)
    if not low <= value <= high:
        bounds = f">= {low}" if high == math.inf else f"in [{low}, {high}]"
        raise ConfigError(f"{name} must be {bounds}, got {value!r}")


def _check_weights(weights: Sequence[float] | None) -> None:
    if weights is None:
        return
    if isinstance(weights, (Mapping, str, bytes)) or not isinstance(weights, Collection):
        raise ConfigError(
            f"weights must be a sequence of numbers, one per agent in the agents' order, got {type(weights).__name__}"
        )
    for i, w in enumerate(weights.tolist() if isinstance(weights, Tensor) else weights):
        _check_finite(f"weights[{i}]", w)


def _weights(weights: Sequence[float] | None, ctx: RunContext) -> Tensor:
    """One weight per agent, in float64 (the combines cast them to the deltas' dtype: float64 inputs keep them
    exact)."""
    k = len(ctx.agents)
    if weights is None:
        return torch.ones(k, dtype=torch.float64, device=ctx.device)
    if len(weights) != k:
        raise ConfigError(f"weights has {len(weights)} entries for {k} agents ({', '.join(ctx.agents)})")
    return torch.tensor([float(w) for w in weights], dtype=torch.float64, device=ctx.device)


def _scaled(tau: Tensor, scale: float) -> Tensor:
    return tau if scale == 1.0 else tau.mul_(scale)


# ----------------------------------------------------------------------------------------------- linear / TA


@dataclass(frozen=True)
class LinearConfig:
    """θ* = θ₀ + Σ_t w̃_t τ_t with w̃ = w / Σ_t w_t (``normalize=True``: = Σ_t w̃_t θ_t) or w̃ = w."""

    weights: Sequence[float] | None = None
    normalize: bool = True

    def __post_init__(self) -> None:
        _check_weights(self.weights)


def _linear_setup(config: LinearConfig, ctx: RunContext) -> Tensor:
    weights = _weights(config.weights, ctx)
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
    setup=_linear_setup,
    description="weighted average of the models",
)


@dataclass(frozen=True)
class TaskArithmeticConfig:
    """θ* = θ₀ + scale · Σ_t w_t τ_t. With ``scale=1`` equals ``peft.utils.merge_utils.task_arithmetic``."""

    weights: Sequence[float] | None = None
    scale: float = 1.0

    def __post_init__(self) -> None:
        _check_weights(self.weights)
        _check_finite("scale", self.scale)


register_method(
    "task_arithmetic",
    TaskArithmeticConfig,
    lambda deltas, ctx, config: _scaled(F.task_arithmetic_combine(deltas, ctx.run_state), config.scale),
    setup=lambda config, ctx: _weights(config.weights, ctx),
    description="base + scale × weighted sum of task vectors",
)


# ----------------------------------------------------------------------------------------------- TIES / DARE


@dataclass(frozen=True)
class TiesConfig:
    """Trim each τ_t to its top-``density`` magnitudes (per tensor), elect signs, average agreeing entries.

    Defaults equal ``peft.utils.merge_utils.ties`` (then × ``scale``); ``elect_on="weighted",
    divide_by="weights"`` is mergekit's convention (``divide_by="none"``: mergekit's ``normalize: false``, the
    weighted sum of the agreeing entries). ``densities``: one density per agent, in the agents' order (mergekit's
    per-model ``density``), instead of ``density`` for all.
    """

    density: float = 0.2
    weights: Sequence[float] | None = None
    scale: float = 1.0
    majority_sign: Literal["total", "frequency"] = "total"
    elect_on: Literal["unweighted", "weighted"] = "unweighted"
    divide_by: Literal["count", "weights", "none"] = "count"
    densities: Sequence[float] | None = None

    def __post_init__(self) -> None:
        _check_range("density", self.density, 0.0, 1.0)
        _check_densities(self.densities, positive=False)
        _check_weights(self.weights)
        _check_finite("scale", self.scale)
        _check_choice("majority_sign", self.majority_sign, ("total", "frequency"))
        _check_choice("elect_on", self.elect_on, ("unweighted", "weighted"))
        _check_choice("divide_by", self.divide_by, ("count", "weights", "none"))


def _check_densities(densities: Sequence[float] | None, positive: bool) -> None:
    if densities is None:
        return
    if isinstance(densities, (Mapping, str, bytes)) or not isinstance(densities, Collection):
        raise ConfigError(f"densities must be a sequence of numbers, one per agent, got {type(densities).__name__}")
    for i, d in enumerate(densities):
        _check_range(f"densities[{i}]", d, 0.0, 1.0)
        if positive and d == 0:
            raise ConfigError(f"densities[{i}] must be > 0 for DARE (survivors are rescaled by 1/density)")


def _agent_densities(config: Any, agents: Sequence[str]) -> list[float]:
    """The density of each agent: ``densities`` (checked against the agents) or ``density`` for all."""
    if config.densities is None:
        return [float(config.density)] * len(agents)
    if len(config.densities) != len(agents):
        raise ConfigError(f"densities has {len(config.densities)} entries for {len(agents)} agents "
                          f"({', '.join(agents)})")
    return [float(d) for d in config.densities]


def _ties_prepare(config: TiesConfig, view: TensorView, weights: Tensor) -> list[float | None]:
    densities = _agent_densities(config, view.agents)
    return [F.magnitude_threshold(view.delta(t), densities[t]) for t in range(len(view.agents))]


def _ties_elect(deltas: Tensor, weights: Tensor, config: Any) -> Tensor:
    if config.divide_by == "none":  # mergekit's normalize: false: Σ_t w_t τ_t over the agreeing entries
        w = weights.to(deltas.dtype).view(-1, 1)
        weighted = deltas * w
        elected_from = weighted if config.elect_on == "weighted" else deltas
        magnitude = elected_from.sum(dim=0) if config.majority_sign == "total" else elected_from.sign().sum(dim=0)
        tau = (weighted * (deltas.sign() == torch.where(magnitude >= 0, 1.0, -1.0))).sum(dim=0)
        return _scaled(tau, config.scale)
    tau = F.ties_combine(
        deltas, weights, majority_sign=config.majority_sign, elect_on=config.elect_on, divide_by=config.divide_by
    )
    return _scaled(tau, config.scale)


register_method(
    "ties",
    TiesConfig,
    lambda deltas, ctx, config: _ties_elect(F.trim_(deltas, ctx.state), ctx.run_state, config),
    setup=lambda config, ctx: _weights(config.weights, ctx),
    prepare=_ties_prepare,
    description="TIES: trim, elect sign, disjoint mean",
)


@dataclass(frozen=True)
class DareLinearConfig:
    """Drop each entry of τ_t with probability 1 − ``density``, rescale survivors by 1/density, then task
    arithmetic. Equals ``peft.utils.merge_utils.dare_linear`` for the same masks (× ``scale``). The mask of
    (agent, tensor) is drawn from a generator seeded with ``stable_seed(seed, agent, key)``. ``densities``: one
    density per agent, in the agents' order, instead of ``density`` for all."""

    density: float = 0.5
    weights: Sequence[float] | None = None
    scale: float = 1.0
    seed: int = 0
    densities: Sequence[float] | None = None

    def __post_init__(self) -> None:
        _check_range("density", self.density, 0.0, 1.0)
        if self.density == 0:
            raise ConfigError("density must be > 0 for DARE (survivors are rescaled by 1/density)")
        _check_densities(self.densities, positive=True)
        _check_weights(self.weights)
        _check_finite("scale", self.scale)


@dataclass(frozen=True)
class DareTiesConfig(DareLinearConfig):
    """DARE's random drop, then TIES' sign election and disjoint mean (PEFT's ``dare_ties`` by default;
    ``divide_by="none"``: mergekit's ``normalize: false``)."""

    majority_sign: Literal["total", "frequency"] = "total"
    elect_on: Literal["unweighted", "weighted"] = "unweighted"
    divide_by: Literal["count", "weights", "none"] = "count"

    def __post_init__(self) -> None:
        super().__post_init__()
        _check_choice("majority_sign", self.majority_sign, ("total", "frequency"))
        _check_choice("elect_on", self.elect_on, ("unweighted", "weighted"))
        _check_choice("divide_by", self.divide_by, ("count", "weights", "none"))


def dare_generator(seed: int, agent: str, key: str, device: torch.device) -> torch.Generator:
    """The generator DARE draws agent ``agent``'s mask of tensor ``key`` from."""
    generator = torch.Generator(device=device)
    generator.manual_seed(F.stable_seed("dare", seed, agent, key))
    return generator


@dataclass
class _DareState:
    generators: list[torch.Generator]
    densities: list[float]
    keep: Tensor | None = None


def _dare_prepare(config: DareLinearConfig, view: TensorView, weights: Tensor) -> _DareState:
    return _DareState([dare_generator(config.seed, a, view.key, view.device) for a in view.agents],
                      _agent_densities(config, view.agents))


def _dare_drop(deltas: Tensor, ctx: TensorContext, config: DareLinearConfig) -> Tensor:
    state: _DareState = ctx.state
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
    lambda deltas, ctx, config: _scaled(
        F.task_arithmetic_combine(_dare_drop(deltas, ctx, config), ctx.run_state), config.scale
    ),
    setup=lambda config, ctx: _weights(config.weights, ctx),
    prepare=_dare_prepare,
    description="DARE drop-and-rescale, then task arithmetic",
)

register_method(
    "dare_ties",
    DareTiesConfig,
    lambda deltas, ctx, config: _ties_elect(_dare_drop(deltas, ctx, config), ctx.run_state, config),
    setup=lambda config, ctx: _weights(config.weights, ctx),
    prepare=_dare_prepare,
    description="DARE drop-and-rescale, then TIES election",
)


# ----------------------------------------------------------------------------------------------- RAM

#: The RAM family's method names (``ram_merge``'s ``variant``).
RAM_VARIANTS = ("ram", "ram_plus", "ram_plus_soft")


@dataclass(frozen=True)
class RamConfig:
    """RAM (paper Eq. 7, λ = 1): mean over the active agents where ≥ 2 updated, the one agent's τ where one
    did, the base where none did. ``activity``/``eps``: see :class:`Activity`.

    ``lambdas`` (every RAM variant): ``{agent: λ_t}`` for **every** merged agent, the factor on the entries that
    agent alone updated, instead of the ρ-derived λ (ρ is not counted then: no statistics pass; ``r``/``alpha``
    are unused). Names not among the merged agents, and merged agents left out, are :class:`ConfigError` naming
    them. λ_t = 1 for every agent is plain RAM, bit for bit. Any finite λ is taken (λ > 1 extrapolates τ_t).
    ``exclude``: names of agents to leave out of the merge, as if they were not passed (the search's
    leave-one-out candidates); at least one agent must remain.

    >>> cfg = RamConfig(lambdas={"coder": 2.0, "tools": 0.5})
    >>> cfg.lambdas["coder"]
    2.0
    """

    eps: float = 1e-5
    activity: Literal["abs", "changed"] = "abs"
    lambdas: Mapping[str, float] | None = dataclasses.field(default=None, kw_only=True)
    exclude: Sequence[str] = dataclasses.field(default=(), kw_only=True)

    def __post_init__(self) -> None:
        _check_range("eps", self.eps, 0.0)
        _check_choice("activity", self.activity, ("abs", "changed"))
        if self.lambdas is not None:
            object.__setattr__(self, "lambdas", _check_lambdas(self.lambdas))
        object.__setattr__(self, "exclude", _check_names("exclude", self.exclude))

    variant = "ram"


def _check_lambdas(lambdas: Any) -> dict[str, float]:
    """``lambdas`` as a fresh ``{agent: float}`` (so that later edits of the caller's mapping change nothing)."""
    if not isinstance(lambdas, Mapping):
        raise ConfigError(f"lambdas must be a mapping {{agent name: λ}}, got {type(lambdas).__name__}")
    out = {}
    for name, value in lambdas.items():
        if not isinstance(name, str):
            raise ConfigError(f"lambdas: agent names must be strings, got {name!r}")
        _check_finite(f"lambdas[{name!r}]", value)
        out[name] = float(value)
    return out


def _check_names(option: str, names: Any) -> tuple[str, ...]:
    if isinstance(names, str) or not isinstance(names, Collection) or not all(isinstance(n, str) for n in names):
        raise ConfigError(f"{option} must be a sequence of agent names, got {names!r}")
    return tuple(names)


def given_lambdas(config: RamConfig, agents: Sequence[str]) -> list[float]:
    """``config.lambdas`` in the agents' order; :class:`ConfigError` naming unknown and missing agents."""
    assert config.lambdas is not None
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


@dataclass(frozen=True)
class RamPlusConfig(RamConfig):
    """RAM+: unique entries of agent t scaled by λ_t = 1 + r · clip(ρ_t, 0, alpha) (paper: r=0.1, α=2).

    ``alpha=math.inf``: no clip, λ_t = 1 + r · max(ρ_t, 0). An agent with ρ_t = +∞ (no unique entry) has no
    entry for λ_t to scale; it is reported as 1 + r · alpha for a finite ``alpha`` and as 1.0 for an uncapped
    one. The authors' script is ``r=0.2, alpha=1.0``; mergekit's ``ramplus_tl`` is ``r=0.1, alpha=0.2,
    rho_scope="tensor"``."""

    r: float = 0.1
    alpha: float = 2.0
    rho_scope: Literal["global", "tensor"] = "global"

    def __post_init__(self) -> None:
        super().__post_init__()
        _check_range("r", self.r, 0.0)
        if self.alpha != math.inf:  # inf: uncapped
            _check_range("alpha", self.alpha, 0.0)
        _check_choice("rho_scope", self.rho_scope, ("global", "tensor"))

    variant = "ram_plus"


@dataclass(frozen=True)
class RamPlusSoftConfig(RamPlusConfig):
    """RAM+s: λ_t = 1 + r · ρ_t / (1 + ρ_t) = 1 + r · shared_t / active_t (``alpha`` is unused)."""

    variant = "ram_plus_soft"


def lambdas_from_counts(config: RamConfig, active: Tensor, unique: Tensor) -> list[float]:
    """λ_t per agent from per-agent counts, for ``config``'s variant."""
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
    assert ctx.statistics is not None
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
    stats = view.statistics(_ram_activity(config))
    lambdas = lambdas_from_counts(config, stats.active, stats.unique)
    return torch.tensor(lambdas, dtype=torch.float64, device=view.device)


def _ram_activity(config: RamConfig) -> Activity:
    return Activity(rule=config.activity, eps=config.eps)


def _ram_needs_statistics(config: RamConfig) -> bool:
    return config.lambdas is None and config.variant != "ram" and config.rho_scope == "global"


def _ram_accumulator(config: RamConfig, lambdas: Tensor | None, capacity: int, k: int, device: torch.device,
                     dtype: torch.dtype, auxiliary: tuple[str, ...] = ()) -> F.RamAccumulator:
    cls = F.WeightedRamAccumulator if "importance" in auxiliary else F.RamAccumulator
    return cls(capacity, k, device, dtype, None if lambdas is None else lambdas.tolist())


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
        lambda deltas, ctx, config: F.ram_combine(deltas, ctx.state, (ctx.auxiliary or {}).get("importance")),
        setup=_ram_setup,
        prepare=_ram_prepare,
        activity=_ram_activity,
        needs_statistics=_ram_needs_statistics,
        accumulator=_ram_accumulator,
        description=_desc,
        auxiliary=("importance",),
        check_auxiliary=check_importance,
    )
