"""The data every layer shares, at the bottom of the import graph: what a tensor is (:class:`TensorSpec`), what a
merge does to each key (:class:`Plan`), which entries count as updated (:class:`Activity`), the counts of the
statistics pass (:class:`RamStatistics`) and what a merge did (:class:`MergeInfo`).

This module imports only torch, so that sources, sinks, the distributed helpers, the methods and the engine can
all take these types without importing each other.

>>> Plan(merge=("w",), copy=("running_mean",), alias={}, check_equal=()).keys
('w', 'running_mean')
"""

from __future__ import annotations

import functools
import operator
from dataclasses import dataclass, field
from typing import Any, Literal

import torch
from torch import Tensor

__all__ = ["TensorSpec", "Plan", "Activity", "RamStatistics", "MergeInfo", "DTYPE_OF", "DEVICE_OF", "SHAPE_OF"]

#: A tensor's dtype, device and shape as functions: checked a property at a time over a model's tensors with ``map``.
DTYPE_OF, DEVICE_OF, SHAPE_OF = (
    operator.attrgetter("dtype"),
    operator.attrgetter("device"),
    operator.attrgetter("shape"),
)


@dataclass(frozen=True)
class TensorSpec:
    """A tensor's shape, dtype and device, known without reading it. ``is_buffer``: taken from the base as is;
    ``counted``: False for DTensor shards replicated elsewhere (global statistics count them once)."""

    shape: tuple[int, ...]
    dtype: torch.dtype
    device: torch.device
    is_buffer: bool = False
    counted: bool = True

    @property
    def numel(self) -> int:
        """The number of entries."""
        n = 1
        for s in self.shape:
            n *= s
        return n


@dataclass(frozen=True)
class Plan:
    """What happens to each key: ``merge`` (floating parameters), ``copy`` (buffers and non-float tensors,
    taken from the base), ``alias`` (tied to an earlier key)."""

    merge: tuple[str, ...]
    copy: tuple[str, ...]
    alias: dict[str, str]
    check_equal: tuple[str, ...]  # non-float, non-buffer keys: must equal the base in every agent

    @property
    def keys(self) -> tuple[str, ...]:
        """Every key of the output, merged first."""
        return self.merge + self.copy + tuple(self.alias)


@dataclass(frozen=True)
class Activity:
    """Which entries of a task vector count as "updated" — the one rule every counter and kernel applies.

    ``"abs"``: |τ| > eps (the paper, eps = 1e-5). ``"changed"``: the stored value differs, compared in the
    narrower dtype of agent and base (for bf16 checkpoints this is |Δ| > ~1e-3·|w|); ``eps`` is unused.

    Attributes:
        rule: ``"abs"`` or ``"changed"`` (not checked here: a merge makes it from its config's checked options).
        eps: the ``"abs"`` threshold on |τ|; ``eps <= 0`` counts every τ ≠ 0.

    Example:
        >>> count_active(agent_w, base_w, Activity("abs", 1e-4))   # doctest: +SKIP
    """

    rule: Literal["abs", "changed"] = "abs"
    eps: float = 1e-5

    @property
    def threshold(self) -> float:
        """The rule as ``|τ| > threshold`` for the kernels that take inputs of one dtype and compute in float32:
        :meth:`threshold_for` float32 ("abs"; ``eps <= 0`` keeps every τ ≠ 0), 0 for "changed" (on one dtype,
        τ ≠ 0 exactly where the stored value changed)."""
        return self.threshold_for(torch.float32)

    def threshold_for(self, dtype: torch.dtype) -> float:
        """``eps`` as a ``dtype`` value for comparisons in that dtype: the largest one ≤ eps, so that ``|τ| >
        threshold`` there is exactly ``|τ| > eps`` (rounded to nearest, 1e-3 is above 1e-3 in float32, and a τ
        of exactly that float32 value would count as inactive).

        Args:
            dtype: the dtype the comparison is made in.

        Returns:
            The threshold as a Python float (a value of ``dtype``); 0.0 for "changed" and for ``eps <= 0``.

        >>> Activity(eps=1e-3).threshold_for(torch.float32) < 1e-3 < float(torch.tensor(1e-3))
        True
        """
        if self.rule != "abs" or self.eps <= 0:
            return 0.0
        return _threshold(self.eps, dtype)


@functools.lru_cache(maxsize=256)
def _threshold(eps: float, dtype: torch.dtype) -> float:
    """The largest value of ``dtype`` at most ``eps`` (computed once per pair: merges ask per tensor)."""
    with torch.device("cpu"):
        t = torch.tensor(eps, dtype=torch.float64).to(dtype)
        if float(t) > eps:
            t = torch.nextafter(t, torch.zeros((), dtype=dtype))
        return float(t)


@dataclass(frozen=True)
class RamStatistics:
    """Counts of the statistics pass, per agent: active entries, unique ones, and the histogram of c = 0..K.

    Only ``probe(...).statistics()`` (``ProbeReport.statistics``) fills ``histogram``; in the counts a merge takes
    itself (``MergeInfo.statistics``) it is all zeros: merges need only ``active`` and ``unique``.

    A merge stamps what they were counted over: the ``agents``, the ``activity`` rule, the ``numel`` entries (on
    this process) and a ``fingerprint`` of the inputs (a digest of every tensor's first and last 64 entries), so
    that a later merge of the same inputs can take them (``statistics=``) instead of counting again."""

    active: Tensor
    unique: Tensor
    histogram: Tensor
    agents: tuple[str, ...] = ()
    activity: Activity | None = None
    numel: int = 0
    fingerprint: str = ""

    @property
    def shared(self) -> Tensor:
        """Per agent, the active entries some other agent updated too."""
        return self.active - self.unique


@dataclass
class MergeInfo:
    """What a merge did: the method and config, λ and ρ per agent where the method has them, the statistics
    pass's counts, and timings. ``passes``: how many times the agents' weights were read (RAM+ with global ρ: 1
    when the output stays in memory and every tensor went through the native kernels within the owner-map budget,
    else 2; in place 2, validation and write, or 3 where some tensor needed a dry run: ``extra["dry_run"]``).
    ``extra["kernels"]``: how many tensors each kind of kernel merged ("native" CPU, "compiled"
    torch.compile, "eager" torch ops); ``extra["single_read"]``: how many tensors RAM+ merged in one read;
    ``extra["compiled"]``: what ``compile`` resolved to.

    Attributes:
        method: the merge method's name.
        config: the method's config, as resolved.
        agents: the agents' names, in order.
        lambdas: λ per agent (None where the method has none).
        rho: ρ per agent (None where the method has none).
        statistics: the statistics pass's counts (None where the method takes none).
        passes: how many times the agents' weights were read.
        seconds: the merge's wall time.
        tensors: how many tensors were merged.
        parameters: how many entries were merged.
        extra: method- and engine-specific facts (the keys above, and more).

    Example:
        >>> ram_merge(agents, base=base, return_info=True)[1].passes   # doctest: +SKIP
    """

    method: str
    config: Any
    agents: tuple[str, ...]
    lambdas: dict[str, float] | None = None
    rho: dict[str, float] | None = None
    statistics: RamStatistics | None = None
    passes: int = 1
    seconds: float = 0.0
    tensors: int = 0
    parameters: int = 0
    extra: dict[str, Any] = field(default_factory=dict)

    def count_kernel(self, kind: str, tensors: int = 1) -> None:
        """Record that ``tensors`` more tensors were merged by a kernel of ``kind`` (counted in
        ``extra["kernels"]``).

        Args:
            kind: the kernel's kind: ``"native"``, ``"compiled"``, ``"eager"`` or ``"device"``.
            tensors: how many.
        """
        kernels = self.extra.setdefault("kernels", {})
        kernels[kind] = kernels.get(kind, 0) + tensors
