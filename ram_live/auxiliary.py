"""Per-agent auxiliary inputs of a merge method (RAM's importances): tensors of the parameters' shapes, one set per
agent, read tensor by tensor and streamed chunk by chunk like the agents themselves.

The engine resolves them once per merge (:func:`resolve`: every merged agent has one, every merged tensor is there
with the parameter's shape, nothing read), reads them per tensor (:class:`AuxiliaryInputs`), and validates their
values with the method's ``check_auxiliary`` before a tensor's merge is kept (:func:`validate`).
"""

from __future__ import annotations

from typing import Any, Callable, Mapping, Sequence

import torch
from torch import Tensor

from .errors import ConfigError, InputMismatchError
from .io.sources import TensorSource

__all__ = ["AuxiliaryInputs", "resolve", "validate"]

Check = Callable[[str, Tensor], "tuple[int, str] | None"]


class AuxiliaryInputs:
    """``{name: [source per agent, in the agents' order]}`` and the method's value check."""

    def __init__(self, sources: dict[str, list[TensorSource]], check: Check | None) -> None:
        self.sources = sources
        self.check = check

    def __bool__(self) -> bool:
        return bool(self.sources)

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(self.sources)

    def read(self, key: str, device: torch.device) -> dict[str, list[Tensor]]:
        """Every agent's ``key`` of each input, flat (views of memory-mapped files where they are on ``device``)."""
        out = {}
        for name, sources in self.sources.items():
            tensors = []
            for src in sources:
                t = src.get(key)
                tensors.append((t if t.device == device else t.to(device)).reshape(-1))
            out[name] = tensors
        return out

    def all_sources(self) -> list[TensorSource]:
        return [src for sources in self.sources.values() for src in sources]


def resolve(
    method: Any,
    auxiliary: Mapping[str, Mapping[str, TensorSource]] | None,
    agents: Sequence[TensorSource],
    merged: Sequence[str],
    base: TensorSource,
) -> AuxiliaryInputs:
    """Check ``auxiliary`` (``{input name: {agent name: source}}``) against the method and the plan, reading
    nothing: the method takes each input; every merged agent has one (names beyond the merged agents are left
    alone: an ``exclude``d agent may keep its entry); each source has every merged tensor, floating, of the
    base's shape. Raises :class:`ConfigError` / :class:`InputMismatchError` naming the input, agent and tensor."""
    if not auxiliary:
        return AuxiliaryInputs({}, None)
    takes = tuple(getattr(method, "auxiliary", ()))
    sources: dict[str, list[TensorSource]] = {}
    names = [a.name for a in agents]
    for name, per_agent in auxiliary.items():
        if name not in takes:
            raise ConfigError(f"method {method.name!r} takes no {name} (it takes: {', '.join(takes) or 'none'})")
        missing = [n for n in names if n not in per_agent]
        if missing:
            raise ConfigError(
                f"{name}: no entry for agent(s) {', '.join(map(repr, missing))} (give one for every "
                f"merged agent: {', '.join(map(repr, names))})"
            )
        chosen = [_bound(per_agent[n], base) for n in names]
        for agent, src in zip(names, chosen):
            keys = set(src.keys())
            for key in merged:
                if key not in keys:
                    raise InputMismatchError(
                        f"{name} of agent {agent!r} has no tensor {key!r} (every merged tensor "
                        "needs one; use ones for entries without information)",
                        key=key,
                        agent=agent,
                    )
                spec, want = src.spec(key), base.spec(key)
                if tuple(spec.shape) != tuple(want.shape):
                    raise InputMismatchError(
                        f"{name} of agent {agent!r}, tensor {key!r}: shape {list(spec.shape)}, "
                        f"the parameter's is {list(want.shape)}",
                        key=key,
                        agent=agent,
                    )
                if not spec.dtype.is_floating_point:
                    raise InputMismatchError(
                        f"{name} of agent {agent!r}, tensor {key!r}: dtype {spec.dtype} is not floating point",
                        key=key,
                        agent=agent,
                    )
        sources[name] = chosen
    return AuxiliaryInputs(sources, getattr(method, "check_auxiliary", None))


def _bound(source: Any, base: TensorSource) -> TensorSource:
    """``source`` over the base's tensors where it takes its shapes from them (``bind(base)``: e.g. a constant
    per agent, :class:`~ram_live.importance.ConstantImportance`), else ``source`` itself."""
    bind = getattr(source, "bind", None)
    return bind(base) if callable(bind) else source


def validate(key: str, agents: Sequence[str], tensors: Mapping[str, Sequence[Tensor]], check: Check | None) -> None:
    """Raise :class:`InputMismatchError` naming the input, agent, tensor and flat index of the first entry that
    ``check`` refuses (nothing happens without a check)."""
    if check is None:
        return
    for name, per_agent in tensors.items():
        for agent, flat in zip(agents, per_agent):
            for start in range(0, flat.numel(), CHECK_CHUNK):  # chunks: the check's temporaries stay small
                found = check(name, flat[start : start + CHECK_CHUNK])
                if found is not None:
                    index, reason = found
                    raise InputMismatchError(
                        f"{name} of agent {agent!r}, tensor {key!r}: flat index {start + index} {reason}",
                        key=key,
                        agent=agent,
                    )


#: Entries per call of a method's ``check_auxiliary``.
CHECK_CHUNK = 1 << 22
