"""What a merge method is: its stateless ``combine``, the hooks the engine calls, and what it declares about itself
(fast kernels, an overflow bound), so that the engine never needs to know a method by name."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Callable, Protocol

import torch
from torch import Tensor

from ..errors import ConfigError
from ..types import Activity, RamStatistics

__all__ = ["RunContext", "TensorContext", "TensorView", "Combine", "MethodKernels", "MergeMethod", "agent_weights",
           "agent_densities", "scaled"]


@dataclass(frozen=True)
class RunContext:
    """What a ``setup`` hook knows: the agents, the statistics pass's counts (where the method needs them) and the
    device the merge runs on."""

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
class MethodKernels:
    """The engine's fast kernels a method may run for one config.

    They compute RAM's rule on float32 task vectors: the mean of the active agents' τ where several updated an
    entry, ``λ_t · τ_t`` where agent ``t`` alone did (λ from the method's per-tensor state, one per agent, or 1),
    the importance-weighted mean where the method's ``"importance"`` auxiliary input is given. A method whose
    accumulator computes exactly that for a config may declare them (``ram_live.methods.ram.ram_kernels``).

    Args:
        native: the native CPU kernels (``ram_live.kernels.ram``, ``ram_live.kernels.importance``).
        compiled: the ``torch.compile`` kernels (``compile=True``; ``ram_live.functional.ram_fused_``).
        single_read: with global counts (``needs_statistics``) and an in-memory output, the merge that reads the
            inputs once: merged as λ = 1 while counting, λ applied afterwards where one agent alone updated.
        scaled: whether λ reaches the kernels (the build the compile check warms up).
        sign: the shared entries' mean over the agents that agree with its sign (RAM's ``shared="sign"``).

    Example:
        >>> MethodKernels(scaled=True).native
        True
    """

    native: bool = True
    compiled: bool = True
    single_read: bool = False
    scaled: bool = False
    sign: bool = False


@dataclass(frozen=True)
class MergeMethod:
    """A registered merge method (see :func:`ram_live.methods.register_method`)."""

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
    #: ``kernels(config)``: the fast kernels the engine may run instead of ``accumulator`` for this config (the
    #: engine uses them only where the method has an accumulator, which they must match bit for bit), or None.
    kernels: Callable[[Any], MethodKernels | None] | None = None
    #: ``overflow_bound(config, run_state) -> B`` with |τ*| ≤ B · K · max_t |τ_t| at every entry (``math.inf``:
    #: unbounded). An in-place merge skips the dry run of a tensor where max |θ₀| + B · K · max |τ| fits its
    #: dtype; without a bound every tensor gets one.
    overflow_bound: Callable[[Any, Any], float] | None = None
    #: ``configure(name, config, options) -> config``: builds the config of ``merge(method=name, config=...,
    #: **options)`` where the default (``config_cls(**options)``, or ``config`` with options put over it) does not
    #: fit, e.g. RAM's one :class:`~ram_live.ram_config.RamConfig` for three short names.
    configure: Callable[[str, Any, dict[str, Any]], Any] | None = None


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
