"""Reading one key from the base, every agent and the method's auxiliary inputs (:class:`Reader`), and the checks
on what is copied or tied rather than merged."""

from __future__ import annotations

from typing import Any, Callable, Sequence

import torch
from torch import Tensor

from ..auxiliary import AuxiliaryInputs
from ..errors import InputMismatchError, NonFiniteError
from ..io.sources import TensorSource
from ..types import Plan
from .stream import DeltaStream, first_nonfinite

__all__ = ["Reader", "check_equal", "check_ties_and_copies", "on_current"]


def on_current(dev: torch.device) -> torch.device:
    """``dev`` with its index: an accelerator named without one (``"cuda"``) is its type's current device, as
    ``.to("cuda")`` takes it, asked when a merge starts (a search's worker may choose its GPU after its merger was
    made), so weights already on ``cuda:1`` while it is current are merged where they are. A backend that is not
    available or has no ``current_device`` keeps ``dev`` as it is.

    Example:
        >>> on_current(torch.device("cpu"))
        device(type='cpu')
    """
    if dev.index is not None or dev.type in ("cpu", "meta"):
        return dev
    backend = getattr(torch, dev.type, None)
    available, current = getattr(backend, "is_available", None), getattr(backend, "current_device", None)
    if not (callable(available) and callable(current) and available()):
        return dev
    index = current()
    return torch.device(dev.type, index) if isinstance(index, int) else dev


class Reader:
    """Reads one key from the base and every agent, on the compute device."""

    def __init__(self, base: TensorSource, agents: Sequence[TensorSource], device: torch.device | None) -> None:
        self.base = base
        self.agents = list(agents)
        self.names = tuple(a.name for a in agents)
        self.device = device
        self.auxiliary = AuxiliaryInputs({}, None)
        self._releasing: tuple[AuxiliaryInputs, list[Callable[[str], None]]] | None = None
        self._ranging: tuple[AuxiliaryInputs, list[TensorSource]] | None = None
        self.grouped: tuple[Any, list[Any]] | None = None  # (plan, the grouped launches' inputs read for it)

    def stream(self, stream: DeltaStream) -> DeltaStream:
        """``stream`` with this key's auxiliary inputs attached."""
        if self.auxiliary:
            stream.auxiliary = self.auxiliary.read(stream.key, stream.device)
            stream.check_auxiliary = self.auxiliary.check
        return stream

    def read(self, key: str) -> tuple[Tensor, list[Tensor], torch.device]:
        """``key`` of the base (moved to the compute device) and of every agent, and that device."""
        base = self.base.get(key)
        device = self.device or base.device
        if base.device != device:
            base = base.to(device)
        return base, [a.get(key) for a in self.agents], device

    def release(self, key: str) -> None:
        """Let sources that map files drop ``key``'s pages."""
        if self._releasing is None or self._releasing[0] is not self.auxiliary:  # once per merge, not per tensor
            sources = (self.base, *self.agents, *self.auxiliary.all_sources())
            self._releasing = (self.auxiliary, [r for r in (getattr(s, "release", None) for s in sources) if r])
        for release in self._releasing[1]:
            release(key)

    def range_releaser(self, key: str, sink: Any = None) -> Callable[[int, int], None] | None:
        """A callback that drops the mapped pages of flat entries ``[start, stop)`` of ``key`` from the inputs
        (and from ``sink``'s output) once a range is merged, so that resident memory holds a few ranges rather than
        K + 2 whole tensors; None when no input maps files."""
        if self._ranging is None or self._ranging[0] is not self.auxiliary:  # once per merge, not per tensor
            every = (self.base, *self.agents, *self.auxiliary.all_sources())
            self._ranging = (self.auxiliary, [src for src in every if getattr(src, "releases_ranges", False)])
        sources = self._ranging[1]
        out = getattr(sink, "release_range", None)
        if not sources and out is None:
            return None

        def release(start: int, stop: int) -> None:
            for src in sources:
                src.release(key, start, stop)
            if out is not None:
                out(key, start, stop)

        return release

    def nbytes(self, key: str) -> int:
        """Bytes of ``key`` over the base and every agent."""
        return sum(s.numel * s.dtype.itemsize for s in (src.spec(key) for src in (self.base, *self.agents)))


def check_equal(reader: Reader, key: str) -> None:
    """A non-floating tensor every agent must hold as the base does (:class:`InputMismatchError` naming one)."""
    base, agents, _ = reader.read(key)
    for name, agent in zip(reader.names, agents):
        if not torch.equal(agent.to(base.device), base):
            raise InputMismatchError(
                f"non-floating tensor {key!r} of agent {name!r} differs from the base's "
                "(integer tensors cannot be merged; they must be equal)",
                key=key,
                agent=name,
            )


def check_ties_and_copies(reader: Reader, plan: Plan) -> None:
    """Before anything is written: an agent that does not tie a name the base ties, and holds other values under
    it, would lose them to the base's tie (the merge keeps one tensor); a floating tensor taken from the base
    as is (a buffer) must be finite, as every merged input must."""
    for name, agent in zip(reader.names, reader.agents):
        keys, tied = set(agent.keys()), agent.aliases()
        for alias, canonical in plan.alias.items():
            if alias not in keys or tied.get(alias) == canonical:
                continue
            mine, theirs = agent.get(alias), agent.get(canonical)
            if not torch.equal(mine, theirs.to(mine.device)):
                raise InputMismatchError(
                    f"tensor {alias!r}: agent {name!r} holds other values there than under {canonical!r}, which "
                    "the base ties it to; the merge keeps the base's tie, so they would be lost (tie them in the "
                    "agent, or untie them in the base)",
                    key=alias,
                    agent=name,
                )
    for key in plan.copy:
        flat = reader.base.get(key).reshape(-1)
        index = first_nonfinite(flat) if flat.dtype.is_floating_point else None
        if index is not None:
            raise NonFiniteError(
                f"tensor {key!r} of the base (a buffer: taken from the base as is) holds "
                f"{flat[index].item()} at flat index {index}",
                key=key,
                agent="base",
            )
