"""What ``importance=`` accepts, turned into one :class:`TensorSource` per agent (the form RAM's weighted shared
mean reads): per-agent importances given by the caller, a constant per agent, or the importances stored with
store snapshots, which are used only when asked for with :data:`STORED` (``importance="stored"``).

>>> sources, how = resolve_importance("stored", agents)      # every agent a snapshot with importances  # doctest: +SKIP
>>> sources, how = resolve_importance({"coder": 1.0, "tools": 0.2}, agents)                       # doctest: +SKIP
"""

from __future__ import annotations

import math
import numbers
import os
from typing import Any, Mapping, Sequence

import torch
from torch import Tensor

from ..errors import ConfigError, UnsupportedInputError
from ..io.sources import SafetensorsSource, StateDictSource, TensorSource
from ..types import TensorSpec

__all__ = [
    "STORED",
    "ConstantImportance",
    "Importance",
    "check_importance_option",
    "importance_sources",
    "resolve_importance",
    "stored_importance_of",
    "stored_sources",
]

#: ``importance="stored"``: weigh each agent by the importances stored with its store snapshot.
STORED = "stored"

Importance = Mapping[str, Tensor] | str | os.PathLike | TensorSource | float


class ConstantImportance:
    """One number as an agent's importance at every entry of every tensor: in RAM's shared mean a per-agent
    weight (τ* = Σ w_t τ_t / Σ w_t over the active agents). Unbound until the merge gives it the base's tensors
    (:meth:`bind`: shapes, device); each read is a float32 tensor of the parameter's shape filled with the value.

    >>> merge(agents, base=base, method="ram", importance={"coder": 1.0, "tools": 0.2})  # doctest: +SKIP
    """

    def __init__(self, value: float, agent: str, like: TensorSource | None = None) -> None:
        if not math.isfinite(value) or value < 0:
            raise ConfigError(f"importance of agent {agent!r}: {value!r} (a number must be finite and >= 0)")
        self.value, self.agent, self._like = float(value), agent, like
        self.name = f"importance of {agent} (constant {value:g})"

    def bind(self, like: TensorSource) -> "ConstantImportance":
        """This constant over ``like``'s tensors (their keys, shapes and device)."""
        return ConstantImportance(self.value, self.agent, like)

    def keys(self) -> list[str]:
        return [] if self._like is None else list(self._like.keys())

    def spec(self, key: str) -> TensorSpec:
        s = self._like.spec(key)  # type: ignore[union-attr]
        return TensorSpec(tuple(s.shape), torch.float32, s.device)

    def get(self, key: str) -> Tensor:
        s = self._like.spec(key)  # type: ignore[union-attr]
        return torch.full(tuple(s.shape), self.value, dtype=torch.float32, device=s.device)

    def aliases(self) -> dict[str, str]:
        return {}


def resolve_importance(
    importance: Any, agents: Sequence[Any], exclude: Sequence[str] = ()
) -> tuple[dict[str, TensorSource] | None, str | None]:
    """``importance=`` of a merge as ``({agent name: source}, how)``: ``(None, None)`` for None (plain RAM),
    ``(stored, "stored")`` for :data:`STORED`, ``(given, "given")`` for per-agent importances.

    Args:
        importance: None, ``"stored"``, or per-agent importances as :func:`importance_sources` takes them.
        agents: the merge's agents as sources (their ``name``; for ``"stored"`` their ``importance``).
        exclude: agents the merge leaves out (its config's ``exclude``): ``"stored"`` asks nothing of them.

    Returns:
        The per-agent sources (None: none) and how they were given (``MergeInfo.extra["importance"]``).

    Raises:
        ConfigError: ``importance=False`` (None is plain RAM), another string, ``"stored"`` with agents whose
            snapshots carry no importances (named), or a malformed mapping/sequence.
    """
    if importance is None:
        return None, None
    if importance is False or importance is True:
        raise ConfigError(
            f"importance={importance!r}: None is plain RAM; pass 'stored' for the importances stored "
            "with store snapshots, or {agent: importances}"
        )
    if isinstance(importance, str):
        if importance != STORED:
            raise ConfigError(
                f"importance={importance!r}: the one string it takes is 'stored' (the importances "
                "stored with store snapshots); else None (plain RAM) or {agent: importances}"
            )
        kept = [a for a in agents if a.name not in exclude]
        return stored_sources({a.name: stored_importance_of(a) for a in kept}), "stored"
    return importance_sources(importance, [a.name for a in agents]), "given"


def stored_importance_of(agent: Any) -> Any:
    """An agent's stored importances: its snapshot's, zeros for a snapshot that changed nothing (it stores no entry,
    so no importance, and is never active), None for an agent without."""
    found = getattr(agent, "importance", None)
    if found is not None:
        return found
    snapshot = agent if hasattr(agent, "changed") else getattr(agent, "source", None)
    if hasattr(snapshot, "manifest") and getattr(snapshot, "changed", None) == 0:
        return ConstantImportance(0.0, agent.name)
    return None


def stored_sources(per_agent: Mapping[str, Any]) -> dict[str, TensorSource]:
    """``{agent: stored importance source or None}`` → the sources, every agent having one.

    Raises:
        ConfigError: naming the agents whose snapshots carry no importances (or that are not snapshots).
    """
    missing = sorted(str(n) for n, s in per_agent.items() if s is None)
    if missing:
        raise ConfigError(
            f"importance='stored': agent(s) {', '.join(map(repr, missing))} carry no stored "
            "importances (not a store snapshot, or one written without importance=); store them with "
            "every agent's snapshots, pass {agent: importances}, or None for plain RAM"
        )
    return dict(per_agent)


def check_importance_option(value: Any, where: str) -> str | None:
    """A setting that only chooses between plain RAM (None) and the stored importances (``"stored"``)."""
    if value is not None and (not isinstance(value, str) or value != STORED):
        raise ConfigError(
            f"{where}: importance must be None (plain RAM) or 'stored' (the importances stored with "
            f"every agent's snapshot), got {value!r}"
        )
    return value


def importance_sources(
    importance: Mapping[str, Importance] | Sequence[Importance], agents: Sequence[str]
) -> dict[str, TensorSource]:
    """``merge``'s ``importance=`` as one :class:`TensorSource` per agent name: a state dict ``{key: Tensor}``,
    a ``.safetensors`` file or folder (memory-mapped, read tensor by tensor), any source (e.g. a snapshot's), or a
    number (:class:`ConstantImportance`: that value everywhere, a per-agent weight in the
    shared mean).
    A mapping is keyed by agent name (names that are not agents are a :class:`ConfigError`; agents without one
    are refused by the merge, which knows which agents it keeps); a sequence follows the agents' order.

    Args:
        importance: ``{agent name: importances}`` or a sequence in the agents' order.
        agents: the agents' names.

    Returns:
        ``{agent name: TensorSource}``.

    Raises:
        ConfigError: a sequence of the wrong length, unknown agent names, a state dict with a non-tensor.
        UnsupportedInputError: a value of another type.

    >>> importance_sources({"coder": adam_importance(opt, coder), "tools": 0.5}, ["coder", "tools"])  # doctest: +SKIP
    """
    if isinstance(importance, Mapping) and not any(isinstance(v, Tensor) for v in importance.values()):
        per_agent = dict(importance)
    elif isinstance(importance, Sequence) and not isinstance(importance, (str, bytes)):
        if len(importance) != len(agents):
            raise ConfigError(
                f"importance has {len(importance)} entries for {len(agents)} agents "
                f"({', '.join(map(repr, agents))}); or pass a mapping agent name -> importances"
            )
        per_agent = dict(zip(agents, importance))
    else:
        raise ConfigError(
            "importance must map each agent's name to its importances (a state dict, a safetensors "
            f"path or a TensorSource), got {type(importance).__name__}"
        )
    unknown = [str(n) for n in per_agent if n not in agents]
    if unknown:
        raise ConfigError(
            f"importance: unknown agent(s) {', '.join(map(repr, unknown))} (the agents are "
            f"{', '.join(map(repr, agents))})"
        )
    return {name: _as_source(value, name) for name, value in per_agent.items()}


def _as_source(value: Any, agent: str) -> TensorSource:
    name = f"importance of {agent}"
    if isinstance(value, numbers.Real) and not isinstance(value, bool):
        return ConstantImportance(float(value), agent)  # one weight for every entry (RAM's shared mean)
    if isinstance(value, (str, os.PathLike)):
        return SafetensorsSource(value, name)
    if isinstance(value, Mapping):
        bad = [k for k, v in value.items() if not isinstance(v, Tensor)]
        if bad:
            raise ConfigError(
                f"importance of agent {agent!r}: {bad[0]!r} is a {type(value[bad[0]]).__name__}, not a Tensor"
            )
        return StateDictSource(value, name)
    if isinstance(value, TensorSource):
        return value
    raise UnsupportedInputError(
        f"importance of agent {agent!r}: a {type(value).__name__}; pass a state dict, a "
        "safetensors file/folder or a TensorSource"
    )
