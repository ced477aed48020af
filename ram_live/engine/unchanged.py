"""Agents that changed nothing: a merge says so with one :class:`~ram_live.errors.UnchangedAgentWarning` naming
them, and records them in ``MergeInfo.extra["unchanged"]`` (:func:`report_unchanged`, every method): from the
counts where the merge has them (no active entry: density 0, ρ = +∞), else, for inputs on the CPU, by comparing
each agent with the base tensor by tensor until one differs (:func:`identical_agents`: a changed agent costs a
read of its first changed tensor).

A caller that counts for itself and warns in its own words (the training callbacks, verl) runs its merges inside
:func:`quiet_unchanged`, so that a merge warns once, not once per layer of code."""

from __future__ import annotations

import contextlib
import sys
import warnings
from contextvars import ContextVar
from typing import Any, Iterator, Sequence

import torch

from ..errors import UnchangedAgentWarning

__all__ = ["identical_agents", "quiet_unchanged", "report_unchanged", "unchanged_agents", "warn_unchanged"]

_QUIET: ContextVar[bool] = ContextVar("ram_live_quiet_unchanged", default=False)


def unchanged_agents(names: Sequence[str], active: Sequence[float]) -> list[str]:
    """The agents with no active entry, in the merge's order.

    Args:
        names: the agents' names.
        active: their active entries, in the same order (the statistics pass's ``active``).

    Returns:
        The names whose count is 0.

    Example:
        >>> unchanged_agents(["coder", "tools"], [12, 0])
        ['tools']
    """
    return [name for name, count in zip(names, active) if float(count) == 0]


@contextlib.contextmanager
def quiet_unchanged() -> Iterator[None]:
    """Within the block, merges record unchanged agents in their info without warning: for a caller that warns
    itself, once (this thread and context only)."""
    token = _QUIET.set(True)
    try:
        yield
    finally:
        _QUIET.reset(token)


def _outside_level() -> int:
    """``stacklevel`` for a warning given in :func:`warn_unchanged`: the first frame outside ram_live (the user's
    call, or the training framework's hook), however deep the merge that counted ran."""
    frame, level = sys._getframe(2), 2
    while frame.f_back is not None and str(frame.f_globals.get("__name__", "")).startswith("ram_live"):
        frame, level = frame.f_back, level + 1
    return level


def warn_unchanged(agents: Sequence[str], where: str = "", *, force: bool = False) -> None:
    """One :class:`~ram_live.errors.UnchangedAgentWarning` naming ``agents`` (nothing when there are none, or
    inside :func:`quiet_unchanged` unless ``force``).

    Args:
        agents: the names of the agents that changed no entry.
        where: who merged, put before the message (``"RAMCallback('coder'): "``).
        force: warn inside :func:`quiet_unchanged` too (the caller that silenced the merges warns with it).
    """
    if not agents or (_QUIET.get() and not force):
        return
    named = ", ".join(map(repr, agents))
    one = len(agents) == 1
    warnings.warn(
        UnchangedAgentWarning(
            f"{where}agent{'' if one else 's'} {named} changed no entry of the base (density 0, ρ = inf): "
            f"{'it adds' if one else 'they add'} nothing to the merge (was {'it' if one else 'each'} trained? a "
            "GRPO run whose reward is always 0 never updates its weights)",
            agents=tuple(agents),
        ),
        stacklevel=_outside_level(),
    )


def identical_agents(reader: Any, keys: Sequence[str]) -> list[str]:
    """The agents whose every tensor of ``keys`` equals the base's, bit for bit (agents of another dtype than the
    base's count as changed), comparing tensor by tensor until each agent has one that differs.

    Args:
        reader: the merge's :class:`~ram_live.engine.reader.Reader`.
        keys: the merged tensors.

    Returns:
        Their names, in the merge's order.
    """
    undecided = set(range(len(reader.names)))
    for key in keys:
        if not undecided:
            break
        base, agents, _ = reader.read(key)
        for t in sorted(undecided):
            agent = agents[t]
            if agent.dtype != base.dtype or not torch.equal(agent, base.to(agent.device)):
                undecided.discard(t)
        reader.release(key)
    return [name for t, name in enumerate(reader.names) if t in undecided]


def report_unchanged(info: Any, reader: Any, keys: Sequence[str], where: str) -> None:
    """Record in ``info.extra["unchanged"]`` and warn once about the agents that changed nothing: from
    ``info.statistics`` where the merge counted, else by :func:`identical_agents` where the inputs are on the CPU
    (on an accelerator that comparison would read the device per tensor; nothing is said there without counts);
    nothing inside :func:`quiet_unchanged` without counts (its caller counts for itself).

    Args:
        info: the merge's :class:`~ram_live.types.MergeInfo`.
        reader: the merge's reader.
        keys: the merged tensors.
        where: who merged, put before the message.
    """
    if info.statistics is not None:
        unchanged = unchanged_agents(info.agents, info.statistics.active.tolist())
    elif _QUIET.get() or not keys or any(reader.base.spec(key).device.type != "cpu" for key in keys[:1]):
        return
    else:
        unchanged = identical_agents(reader, keys)
    if unchanged:
        info.extra["unchanged"] = unchanged
        warn_unchanged(unchanged, where)
