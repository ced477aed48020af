"""Which kernel runs a tensor: a fast path the method declares (:class:`~ram_live.methods.base.MethodKernels`)
where one takes it, else the method's torch accumulator, else its stacked ``combine``; likewise for the activity
counts (the method's fast counter, else the compiled one with ``compile=True``, else torch ops). The engine
knows no method by name."""

from __future__ import annotations

import functools
from typing import Any, Callable

from torch import Tensor

from ..errors import ConfigError
from ..methods.base import MergeMethod, MethodKernels
from ..types import Activity, RamStatistics
from .counts import fused_statistics, torch_statistics
from .merges import merge_stacked, merge_streaming
from .stream import DeltaStream

__all__ = ["method_kernels", "count_tensor", "merge_kernel", "StreamView"]

#: ``kernel(stream, flat)``: merges the stream's tensor into ``flat``.
Kernel = Callable[[DeltaStream, Tensor], None]


def method_kernels(method: MergeMethod, config: Any) -> MethodKernels | None:
    """The fast paths ``method`` declares for ``config`` (``MergeMethod.kernels``), or None."""
    return None if method.kernels is None else method.kernels(config)


def count_tensor(
    stream: DeltaStream,
    k: int,
    workers: int = 1,
    amax: list[tuple[float, float]] | None = None,
    kernels: MethodKernels | None = None,
) -> RamStatistics:
    """The activity counts of ``stream`` (with its activity rule); ``amax``: gets (max |τ|, max |θ₀|) appended
    where the counter tracks them (the fast and torch ones; not the compiled one); ``kernels``: the method's
    fast paths, whose counter runs first."""
    if stream.activity is None:  # TensorView.statistics(None) from a method's own prepare
        raise ConfigError(f"tensor {stream.key!r}: RAM counts need an activity rule (an Activity), got None")
    if kernels is not None and kernels.count is not None:
        stats = kernels.count(stream, k, workers, amax)
        if stats is not None:
            return stats
    eps = stream.fused_eps(stream.activity)
    if eps is not None:
        return fused_statistics(stream, k, eps)
    return torch_statistics(stream, k, workers, amax)


class StreamView:
    """What a method's ``prepare`` hook sees of a tensor (:class:`~ram_live.methods.TensorView`): its key, size,
    agents and device, each agent's whole task vector, and activity counts over this tensor alone (``kernels``:
    the method's fast paths, for the counts)."""

    def __init__(self, stream: DeltaStream, kernels: MethodKernels | None = None) -> None:
        self.stream, self.kernels = stream, kernels
        self.key, self.numel, self.agents, self.device = stream.key, stream.numel, stream.agents, stream.device

    def delta(self, index: int) -> Tensor:
        """Agent ``index``'s whole flat task vector (a new tensor)."""
        return self.stream.delta(index)

    def statistics(self, activity: Activity) -> RamStatistics:
        """Activity counts over this tensor alone, with ``activity``."""
        s = self.stream
        fresh = DeltaStream(
            s.key, s.base, s.tensors, s.agents, s.device, s.chunk_numel, activity, {}, compile=s.compile
        )
        return count_tensor(fresh, len(s.tensors), kernels=self.kernels)


def merge_kernel(
    method: MergeMethod,
    config: Any,
    state: Any,
    run_state: Any,
    stream: DeltaStream,
    flat: Tensor,
    workers: int,
    kernels: MethodKernels | None = None,
) -> tuple[str, Kernel]:
    """``(kind, kernel)`` for this tensor: kind is "native", "compiled" or "eager" (``MergeInfo.extra
    ["kernels"]``). ``state``/``run_state``: the method's per-tensor and per-merge states; ``kernels``: its fast
    paths (:func:`method_kernels`)."""
    fast = None if kernels is None or kernels.merge is None else kernels.merge(stream, flat, state, workers)
    if fast is not None:
        return fast
    if method.accumulator is not None:
        aux = {"auxiliary": tuple(stream.auxiliary)} if stream.auxiliary else {}
        make = functools.partial(
            method.accumulator,
            config,
            state,
            stream.stream_chunk,
            len(stream.tensors),
            stream.device,
            stream.dtype,
            **aux,
        )
        return "eager", functools.partial(merge_streaming, make_accumulator=make, workers=workers)
    return "eager", functools.partial(merge_stacked, method=method, config=config, state=state, run_state=run_state)
