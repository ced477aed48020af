"""What a merge method is: its stateless ``combine``, the hooks the engine calls, and what it declares about itself
(fast kernels, an overflow bound), so that the engine never needs to know a method by name."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
import dataclasses
from dataclasses import dataclass
from typing import Any, Callable, NamedTuple, Protocol

import torch
from torch import Tensor

from ..errors import ConfigError
from ..types import Activity, RamStatistics

__all__ = [
    "GroupItem",
    "group_columns",
    "GroupMerge",
    "RunContext",
    "TensorContext",
    "TensorView",
    "Combine",
    "MethodKernels",
    "MergeMethod",
    "agent_weights",
    "agent_densities",
    "scaled",
]


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
    """The fast paths a method declares for one config. The engine runs them where they take a tensor and knows
    nothing else of them; the method's accumulator (or ``combine``) runs everywhere else, and every fast path must
    give its bits. RAM declares its own in :mod:`ram_live.methods.ram.fast`.

    Args:
        merge: ``merge(stream, out, state, workers) -> (kind, kernel) | None``: a kernel that merges this tensor
            (``kernel(stream, out)``, ``kind`` "native" or "compiled", reported in ``MergeInfo.extra["kernels"]``),
            or None where none takes it.
        count: ``count(stream, k, workers, amax) -> RamStatistics | None``: the tensor's activity counts by a fast
            kernel, or None (the engine's torch or compiled counter runs).
        reads_once: ``reads_once(sink, k) -> bool``: whether :attr:`single_read` applies to this merge.
        single_read: ``single_read(job, plan, specs, progress, device, digest) -> (statistics, run_state)``: the
            whole merge in one read of the inputs (counts and merge together), where :attr:`reads_once` says so.
        warm_up: ``warm_up(device, k, auxiliary) -> None``: builds the compiled kernels on a tiny input before
            anything is written; it raises where the toolchain fails, and the engine then merges eagerly.
        native: ``native() -> bool``: whether vector-level native CPU kernels are built here (``compile="auto"``
            then does not compile on CPU).
        device: ``device(device) -> bool``: whether the method's fused device kernels merge on this device
            (``compile`` then builds nothing there: one mechanism per device).
        group: ``group(run_state, activity, agents) -> GroupMerge | None`` (``agents``: their names): on a
            device, many tensors merged in one launch, or None where this merge's tensors need their own launches.
            The engine groups the tensors a sink holds in memory (:mod:`ram_live.engine.grouped`).
        group_counts: ``group_counts(activity) -> GroupMerge | None``: on a device, many tensors' activity counts
            in one launch (each :class:`GroupItem`'s ``out`` the statistics pass's running counts), or None.

    Raises:
        ConfigError: a field that is neither a callable nor None (the former flags ``native=True``,
            ``single_read=True``: declare ``kernels=ram_kernels`` instead).

    Example:
        >>> MethodKernels().merge is None
        True
    """

    merge: Callable[..., Any] | None = None
    count: Callable[..., Any] | None = None
    reads_once: Callable[[Any, int], bool] | None = None
    single_read: Callable[..., Any] | None = None
    warm_up: Callable[[torch.device, int, bool], None] | None = None
    native: Callable[[], bool] | None = None
    device: Callable[[torch.device], bool] | None = None
    group: Callable[[Any, Activity | None, tuple[str, ...]], Any] | None = None
    group_counts: Callable[[Activity | None], Any] | None = None

    def __post_init__(self) -> None:
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            if value is not None and not callable(value):
                raise ConfigError(
                    f"MethodKernels({f.name}={value!r}): each field is a callable the engine runs, or None "
                    "(a RAM-like method declares RAM's: kernels=ram_live.methods.ram.method.ram_kernels)"
                )


class GroupItem(NamedTuple):
    """One tensor of a grouped launch (:class:`GroupMerge`): its slot in the pass's invalid counts, its key, its
    output (the statistics pass: its running counts), its base and its agents (contiguous tensors that
    :func:`~ram_live.kernels.device.common.group_key` puts in one group)."""

    slot: int
    key: str
    out: Tensor
    base: Tensor
    agents: list[Tensor]


class GroupMerge(NamedTuple):
    """A method's merge of many tensors in one launch (:attr:`MethodKernels.group`).

    Args:
        accepts: ``accepts(base, agents) -> bool``: whether a tensor of these flat inputs can join a group.
        merge: ``merge(items, invalid)``: each :class:`GroupItem` merged into its ``out``, its invalid entries
            added to ``invalid[item.slot]``.
    """

    accepts: Callable[[Tensor, list[Tensor]], bool]
    merge: Callable[[list, Tensor], None]


def group_columns(items: Sequence[GroupItem]) -> tuple[list[Tensor], list[Tensor], list[Tensor], list[int]]:
    """A grouped launch's outputs, bases, agents (``K`` per tensor, in order) and slots, as its op takes them."""
    return (
        [i.out for i in items],
        [i.base for i in items],
        [a for i in items for a in i.agents],
        [i.slot for i in items],
    )


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
    #: ``kernels(config)``: the fast paths the engine may run for this config (:class:`MethodKernels`; they must
    #: give the bits of ``accumulator``, or of ``combine`` without one), or None.
    kernels: Callable[[Any], MethodKernels | None] | None = None
    #: ``overflow_bound(config, run_state) -> B`` with |τ*| ≤ B · K · max_t |τ_t| at every entry (``math.inf``:
    #: unbounded). An in-place merge skips the dry run of a tensor where max |θ₀| + B · K · max |τ| fits its
    #: dtype; without a bound every tensor gets one.
    overflow_bound: Callable[[Any, Any], float] | None = None
    #: ``configure(name, config, options) -> config``: builds the config of ``merge(method=name, config=...,
    #: **options)`` where the default (``config_cls(**options)``, or ``config`` with options put over it) does not
    #: fit, e.g. RAM's one :class:`~ram_live.methods.ram.config.RamConfig` for three short names.
    configure: Callable[[str, Any, dict[str, Any]], Any] | None = None
    #: ``record(config, info, run_state)``: what the method reports in its :class:`~ram_live.types.MergeInfo` once
    #: ``setup`` ran (RAM: λ and ρ per agent).
    record: Callable[[Any, Any, Any], None] | None = None


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
        raise ConfigError(
            f"densities has {len(config.densities)} entries for {len(agents)} agents ({', '.join(agents)})"
        )
    return [float(d) for d in config.densities]


def scaled(tau: Tensor, scale: float) -> Tensor:
    """``tau`` times ``scale`` (in place; untouched for 1)."""
    return tau if scale == 1.0 else tau.mul_(scale)
