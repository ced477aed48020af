"""The plan of a merge: which keys are merged, copied from the base or tied (:func:`build_plan`, checked before
anything is read), which agents take part (:func:`kept_agents`), and what merges over unchanged sources share
(:class:`PlanCache`)."""

from __future__ import annotations

from typing import Any, Callable, Sequence

from ..errors import ConfigError, InputMismatchError, NoAgentsError
from ..io.sources import TensorSource
from ..types import Plan, RamStatistics, TensorSpec

__all__ = ["Plan", "PlanCache", "build_plan", "planned", "kept_agents"]


def build_plan(base: TensorSource, agents: Sequence[TensorSource]) -> Plan:
    """Check key sets, shapes and dtypes (nothing is read) and decide what happens to each key."""
    return planned(base, agents)[0]


def planned(base: TensorSource, agents: Sequence[TensorSource]) -> tuple[Plan, dict[str, TensorSpec]]:
    """:func:`build_plan` of ``base`` and ``agents``, and the base's spec of every key it plans (the specs its
    checks took)."""
    if not agents:
        raise NoAgentsError("no agents to merge: pass at least one model in `models`")
    base_keys = base.keys()
    base_set = set(base_keys)
    aliases = base.aliases()
    for agent in agents:
        agent_set = set(agent.keys())
        tied = agent.aliases()
        # a tied name one side leaves out (save_pretrained does) is the tensor it is tied to
        missing = [k for k in base_keys if k not in agent_set and aliases.get(k) not in agent_set]
        extra = sorted(k for k in agent_set - base_set if tied.get(k) not in base_set)
        if missing or extra:
            parts = []
            if missing:
                parts.append(f"missing {len(missing)} key(s) of the base, e.g. {missing[:5]}")
            if extra:
                parts.append(f"{len(extra)} key(s) the base lacks, e.g. {extra[:5]}")
            raise InputMismatchError(
                f"agent {agent.name!r} does not match the base {base.name!r}: {'; '.join(parts)} "
                "(is the base of another architecture?)",
                key=(missing or extra)[0],
                agent=agent.name,
            )
    kept = [k for k in base_keys if k not in aliases]
    base_specs = {k: base.spec(k) for k in base_keys}
    agent_specs = [{k: agent.spec(k) for k in kept} for agent in agents]  # one spec per tensor and input
    buffers = {k for k, spec in base_specs.items() if spec.is_buffer}
    for specs in agent_specs:
        buffers |= {k for k, spec in specs.items() if spec.is_buffer}
    merge, copy, check = [], [], []
    for key in kept:
        b = base_specs[key]
        for agent, specs in zip(agents, agent_specs):
            a = specs[key]
            if a.shape != b.shape:
                raise InputMismatchError(
                    f"tensor {key!r}: agent {agent.name!r} has shape {list(a.shape)}, the base {list(b.shape)}",
                    key=key,
                    agent=agent.name,
                )
            if a.dtype.is_floating_point != b.dtype.is_floating_point or (
                not b.dtype.is_floating_point and a.dtype != b.dtype
            ):
                raise InputMismatchError(
                    f"tensor {key!r}: agent {agent.name!r} has dtype {a.dtype}, the base {b.dtype}",
                    key=key,
                    agent=agent.name,
                )
        if key in buffers or not b.dtype.is_floating_point:
            copy.append(key)
            if key not in buffers:
                check.append(key)
        else:
            merge.append(key)
    plan = Plan(tuple(merge), tuple(copy), {k: v for k, v in aliases.items()}, tuple(check))
    return plan, {key: base_specs[key] for key in plan.keys}


def kept_agents(agents: Sequence[TensorSource], exclude: Sequence[str]) -> Sequence[TensorSource]:
    """``agents`` without those a config's ``exclude`` names (ConfigError naming names that are not agents)."""
    if not exclude:
        return agents
    names = [a.name for a in agents]
    unknown = [n for n in exclude if n not in names]
    if unknown:
        raise ConfigError(
            f"exclude: unknown agent(s) {', '.join(map(repr, unknown))} (the agents are {', '.join(map(repr, names))})"
        )
    kept = [a for a in agents if a.name not in exclude]
    if not kept:
        raise ConfigError("exclude names every agent: at least one must be merged")
    return kept


class PlanCache:
    """What merges over the same sources share while the sources do not change (a search's candidates): the plan
    and every tensor's spec, made once per base and set of agents, and the counts those merges took (reused
    without the digest check that counts passed in with ``statistics=`` get: they were counted over these very
    sources).

    Example:
        >>> cache = PlanCache()
        >>> # run_merge(base, agents, method, config, sink, plans=cache)  # each merge after the first plans nothing
    """

    def __init__(self) -> None:
        self._plans: dict[tuple[int, ...], tuple[tuple[Any, ...], Plan, dict[str, TensorSpec]]] = {}
        self._counted: list[tuple[RamStatistics, tuple[int, ...]]] = []
        self._kept: dict[Any, Any] = {}

    def plan(self, base: TensorSource, agents: Sequence[TensorSource]) -> tuple[Plan, dict[str, TensorSpec]]:
        """:func:`build_plan` of ``base`` and ``agents`` and the base's spec of every key, made at the first call
        with these sources (the cache holds them, so their ids are not reused)."""
        key = _sources_key(base, agents)
        hit = self._plans.get(key)
        if hit is None:
            hit = self._plans[key] = ((base, *agents), *planned(base, agents))
        return hit[1], hit[2]

    def kept(self, plan: Plan, what: Any, make: Callable[[], Any]) -> Any:
        """``make()`` kept under ``what`` for a plan this cache made (e.g. the inputs a grouped launch takes); made
        anew for any other plan (a rank's share of a distributed plan is a new plan every merge)."""
        if not any(made is plan for _, made, _ in self._plans.values()):
            return make()
        key = (id(plan), what)
        if key not in self._kept:
            self._kept[key] = make()
        return self._kept[key]

    def counted(self, statistics: RamStatistics, base: TensorSource, agents: Sequence[TensorSource]) -> None:
        """``statistics`` were counted over ``base`` and ``agents`` by a merge planned here."""
        self._counted.append((statistics, _sources_key(base, agents)))

    def trusts(self, statistics: RamStatistics, base: TensorSource, agents: Sequence[TensorSource]) -> bool:
        """Whether ``statistics`` are counts :meth:`counted` took (the object itself) over these sources."""
        key = _sources_key(base, agents)
        return any(s is statistics and k == key for s, k in self._counted)


def _sources_key(base: TensorSource, agents: Sequence[TensorSource]) -> tuple[int, ...]:
    """The sources of a merge by identity (a cache that holds them: their ids are not reused)."""
    return tuple(map(id, (base, *agents)))
