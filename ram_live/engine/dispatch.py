"""Which kernel runs a tensor: the native CPU kernels where they build and take the inputs, else the compiled
ones (``compile=True``), else the method's torch accumulator, else its stacked ``combine``; likewise for the
counts. The fast kernels run only for methods that declare them (:class:`~ram_live.methods.MethodKernels`)."""

from __future__ import annotations

import functools
from typing import Any, Callable

import torch
from torch import Tensor

from ..errors import ConfigError
from ..kernels import importance as importance_native
from ..kernels import ram as ram_native
from ..methods import MergeMethod, MethodKernels
from ..types import Activity, RamStatistics
from .counts import fused_statistics, native_statistics, torch_statistics
from .merges import merge_fused, merge_native, merge_native_weighted, merge_stacked, merge_streaming
from .stream import DeltaStream

__all__ = ["method_kernels", "native_for", "count_tensor", "merge_kernel", "StreamView"]

#: ``kernel(stream, flat)``: merges the stream's tensor into ``flat``.
Kernel = Callable[[DeltaStream, Tensor], None]


def method_kernels(method: MergeMethod, config: Any) -> MethodKernels | None:
    """The fast kernels ``method`` declares for ``config`` (``MergeMethod.kernels``; they stand in for its
    accumulator, so a method without one gets none)."""
    if method.kernels is None or method.accumulator is None:
        return None
    return method.kernels(config)


def native_for(stream: DeltaStream, activity: Activity, out: Tensor | None = None,
               entries: tuple[str, ...] = ("merge",)) -> tuple[Any, float] | None:
    """The native CPU kernels and their threshold where they apply (see :mod:`ram_live.kernels.ram`; not when
    ``compile=True`` asks for the torch.compile kernels) and the parts of ``entries`` build, else None."""
    if stream.compile or stream.device.type != "cpu" or stream.dtype != torch.float32:
        return None
    kernels = ram_native.kernels()
    if (kernels is None or not ram_native.supports(out, stream.base, stream.tensors)
            or not kernels.ready(stream.base.dtype, *entries)):
        return None
    return kernels, activity.threshold


def count_tensor(stream: DeltaStream, k: int, workers: int = 1,
                 amax: list[tuple[float, float]] | None = None) -> RamStatistics:
    """The RAM counts of ``stream`` (with its activity rule); ``amax``: gets (max |τ|, max |θ₀|) appended where
    the kernels track them (native and torch paths; not the compiled one)."""
    if stream.activity is None:  # TensorView.statistics(None) from a method's own prepare
        raise ConfigError(f"tensor {stream.key!r}: RAM counts need an activity rule (an Activity), got None")
    native = native_for(stream, stream.activity, entries=("counts",))
    if native is not None:
        return native_statistics(stream, k, *native, workers, amax)
    eps = stream.fused_eps(stream.activity)
    if eps is not None:
        return fused_statistics(stream, k, eps)
    return torch_statistics(stream, k, workers, amax)


class StreamView:
    """What a method's ``prepare`` hook sees of a tensor (:class:`~ram_live.methods.TensorView`): its key, size,
    agents and device, each agent's whole task vector, and RAM counts over this tensor alone."""

    def __init__(self, stream: DeltaStream) -> None:
        self.stream = stream
        self.key, self.numel, self.agents, self.device = stream.key, stream.numel, stream.agents, stream.device

    def delta(self, index: int) -> Tensor:
        """Agent ``index``'s whole flat task vector (a new tensor)."""
        return self.stream.delta(index)

    def statistics(self, activity: Activity) -> RamStatistics:
        """RAM counts over this tensor alone, with ``activity``."""
        s = self.stream
        fresh = DeltaStream(s.key, s.base, s.tensors, s.agents, s.device, s.chunk_numel, activity, {},
                            compile=s.compile)
        return count_tensor(fresh, len(s.tensors))


def merge_kernel(method: MergeMethod, config: Any, state: Any, run_state: Any, stream: DeltaStream, flat: Tensor,
                 workers: int) -> tuple[str, Kernel]:
    """``(kind, kernel)`` for this tensor: kind is "native", "compiled" or "eager" (``MergeInfo.extra
    ["kernels"]``). ``state``/``run_state``: the method's per-tensor and per-merge states."""
    kernels = method_kernels(method, config)
    fast = None if kernels is None else _fast_kernel(kernels, method.activity(config), state, stream, flat, workers)
    if fast is not None:
        return fast
    if method.accumulator is not None:
        aux = {"auxiliary": tuple(stream.auxiliary)} if stream.auxiliary else {}
        make = functools.partial(method.accumulator, config, state, stream.stream_chunk, len(stream.tensors),
                                 stream.device, stream.dtype, **aux)
        return "eager", functools.partial(merge_streaming, make_accumulator=make, workers=workers)
    return "eager", functools.partial(merge_stacked, method=method, config=config, state=state, run_state=run_state)


def _fast_kernel(kernels: MethodKernels, activity: Activity, state: Any, stream: DeltaStream, flat: Tensor,
                 workers: int) -> tuple[str, Kernel] | None:
    """The native kernels, else the compiled ones (see :meth:`DeltaStream.fused_eps`), where ``kernels`` allows
    them and they take this tensor; None: the eager path runs."""
    lambdas = None if state is None else state.to(device=stream.device, dtype=stream.dtype)
    if stream.auxiliary:
        return _weighted_kernel(kernels, stream, flat, activity, lambdas, workers)
    native = native_for(stream, activity, flat) if kernels.native else None
    if native is not None:
        return "native", functools.partial(merge_native, kernels=native[0], lambdas=lambdas, eps=native[1],
                                           workers=workers, sign=kernels.sign)
    eps = stream.fused_eps(activity) if kernels.compiled else None
    if eps is None:
        return None
    return "compiled", functools.partial(merge_fused, lambdas=lambdas, eps=eps, sign=kernels.sign)


def _weighted_kernel(kernels: MethodKernels, stream: DeltaStream, flat: Tensor, activity: Activity,
                     lambdas: Tensor | None, workers: int) -> tuple[str, Kernel] | None:
    """:func:`_fast_kernel` with importances (the only auxiliary input the RAM kernels take): the native
    weighted kernel, else the compiled one, else None (the eager
    :class:`~ram_live.functional.WeightedRamAccumulator`)."""
    importances = stream.auxiliary.get("importance")
    if importances is None or len(stream.auxiliary) != 1:
        return None
    native = native_for(stream, activity, flat, entries=()) if kernels.native else None
    weighted = None if native is None else importance_native.kernels()
    if (weighted is not None and importance_native.supports(stream.base, importances)
            and weighted.ready(stream.base.dtype, importances[0].dtype)):
        return "native", functools.partial(merge_native_weighted, kernels=weighted, importances=importances,
                                           lambdas=lambdas, eps=native[1], workers=workers,  # type: ignore[index]
                                           sign=kernels.sign)
    eps = stream.fused_eps(activity) if kernels.compiled else None
    if eps is None or any(h.device != stream.base.device for h in importances):
        return None
    return "compiled", functools.partial(merge_fused, lambdas=lambdas, eps=eps, importances=importances,
                                         sign=kernels.sign)
