"""RAM's fast paths, declared to the engine by :func:`~.method.ram_kernels`: the native CPU kernels
(:mod:`.native`; with importances :mod:`.native_weighted`), the ``torch.compile`` kernels (:mod:`.compiled`) and
the merge in one read (:mod:`.single_read`); here, which of them takes a tensor and the runners that walk its
ranges or chunks. Each gives the bits of :class:`~.accumulators.RamAccumulator`, the engine's eager path (tested
against :func:`~.reference.ram_combine`)."""

from __future__ import annotations

import functools
from typing import Any

import torch
from torch import Tensor

from ...engine import threads
from ...engine.compiling import compiled
from ...engine.counts import native_counts
from ...engine import checks
from ...engine.dispatch import Kernel
from ...engine.stream import DeltaStream, nonfinite
from ...types import Activity, RamStatistics
from . import native as ram_native
from . import native_weighted
from .compiled import ram_fused_, ram_fused_weighted_
from .device import device_statistics, merge_device

__all__ = [
    "native_for",
    "build_key",
    "merge_kernel",
    "merge_native",
    "merge_native_weighted",
    "merge_fused",
    "native_statistics",
    "device_merges",
    "warm_up",
]


def native_for(
    stream: DeltaStream, activity: Activity, out: Tensor | None = None, entries: tuple[str, ...] = ("merge",)
) -> tuple[Any, float] | None:
    """The native CPU kernels and their threshold where they apply (not when ``compile=True`` asks for the
    torch.compile kernels) and the parts of ``entries`` build, else None."""
    if stream.compile or stream.device.type != "cpu" or stream.dtype != torch.float32:
        return None
    kernels = ram_native.kernels()
    if (
        kernels is None
        or not ram_native.supports(out, stream.base, stream.tensors)
        or not kernels.ready(stream.base.dtype, *entries)
    ):
        return None
    return kernels, activity.threshold


def merge_kernel(stream: DeltaStream, flat: Tensor, state: Any, workers: int, sign: bool) -> tuple[str, Kernel] | None:
    """The device op on accelerators (:mod:`.device`), else the native kernels, else the compiled ones (see
    :meth:`DeltaStream.fused_eps`), where they take this tensor (with the method's activity rule,
    ``stream.activity``); None: the eager path runs. ``state``: λ per agent, or None."""
    activity = stream.activity
    on_device = stream.device_eps(activity)
    if on_device is not None and (not stream.auxiliary or _device_importances(stream) is not None):
        return "device", functools.partial(
            merge_device, lambdas=state, eps=on_device, sign=sign, importances=_device_importances(stream)
        )
    lambdas = None if state is None else state.to(device=stream.device, dtype=stream.dtype)
    if stream.auxiliary:
        return _weighted(stream, flat, activity, lambdas, workers, sign)
    native = native_for(stream, activity, flat)
    if native is not None:
        return "native", functools.partial(
            merge_native, kernels=native[0], lambdas=lambdas, eps=native[1], workers=workers, sign=sign
        )
    eps = stream.fused_eps(activity)
    if eps is None:
        return None
    return "compiled", functools.partial(merge_fused, lambdas=lambdas, eps=eps, sign=sign)


def _device_importances(stream: DeltaStream) -> list[Tensor] | None:
    """The importances where the device op takes them (RAM's only auxiliary input, on the stream's device), else
    None."""
    importances = stream.auxiliary.get("importance")
    if importances is None or len(stream.auxiliary) != 1 or any(h.device != stream.device for h in importances):
        return None
    return list(importances)


def _weighted(
    stream: DeltaStream, flat: Tensor, activity: Activity, lambdas: Tensor | None, workers: int, sign: bool
) -> tuple[str, Kernel] | None:
    """:func:`merge_kernel` with importances (the only auxiliary input RAM takes): the native weighted kernel, else the
    compiled one, else None (the eager :class:`~.accumulators.WeightedRamAccumulator`)."""
    importances = stream.auxiliary.get("importance")
    if importances is None or len(stream.auxiliary) != 1:
        return None
    native = native_for(stream, activity, flat, entries=())
    weighted = None if native is None else native_weighted.kernels()
    if (
        weighted is not None
        and native_weighted.supports(stream.base, importances)
        and weighted.ready(stream.base.dtype, importances[0].dtype)
    ):
        return "native", functools.partial(
            merge_native_weighted,
            kernels=weighted,
            importances=importances,
            lambdas=lambdas,
            eps=native[1],  # type: ignore[index]
            workers=workers,
            sign=sign,
        )
    eps = stream.fused_eps(activity)
    if eps is None or any(h.device != stream.base.device for h in importances):
        return None
    return "compiled", functools.partial(merge_fused, lambdas=lambdas, eps=eps, importances=importances, sign=sign)


def merge_native(
    stream: DeltaStream,
    flat: Tensor,
    kernels: Any,
    lambdas: Tensor | None,
    eps: float,
    workers: int,
    sign: bool = False,
) -> None:
    """The native RAM kernel over the stream's ranges, in threads (``sign``: RAM's ``shared="sign"``)."""
    if threads.native_ranges(
        stream,
        workers,
        lambda start, end: kernels.merge(flat, stream.base, stream.tensors, lambdas, eps, start, end, sign=sign),
    ):
        stream.raise_nonfinite(0, stream.numel, flat)


def merge_native_weighted(
    stream: DeltaStream,
    flat: Tensor,
    kernels: Any,
    importances: list[Tensor],
    lambdas: Tensor | None,
    eps: float,
    workers: int,
    sign: bool = False,
) -> None:
    """:func:`merge_native` with importances; the kernel counts invalid importances with the non-finite
    results, and either names its culprit."""
    if threads.native_ranges(
        stream,
        workers,
        lambda start, end: kernels.merge_weighted(
            flat, stream.base, stream.tensors, importances, lambdas, eps, start, end, sign=sign
        ),
    ):
        stream.validate_auxiliary()
        stream.raise_nonfinite(0, stream.numel, flat)


def build_key(scaled: bool, sign: bool) -> Any:
    """Which compiled RAM build a merge takes, beside its agent count (:func:`~ram_live.engine.compiling.compiled`'s
    ``key``): with or without λ, and the ``shared="sign"`` rule (the plain builds keep their earlier keys)."""
    return (not scaled, "sign") if sign else not scaled


def merge_fused(
    stream: DeltaStream,
    flat: Tensor,
    lambdas: Tensor | None,
    eps: float,
    importances: list[Tensor] | None = None,
    sign: bool = False,
) -> None:
    """Each chunk merged by the compiled :func:`~.compiled.ram_fused_` (with ``importances``:
    :func:`~.compiled.ram_fused_weighted_`) straight into ``flat`` (through a scratch chunk when ``flat`` lives
    on another device)."""
    bad = torch.zeros((), dtype=torch.int64, device=stream.device)
    scratch = (
        None
        if flat.device == stream.device
        else torch.empty(min(stream.numel, stream.fused_chunk), dtype=flat.dtype, device=stream.device)
    )
    kernel_fn = ram_fused_ if importances is None else ram_fused_weighted_
    for start, end, kernel, base, agents in stream.fused_chunks(kernel_fn, build_key(lambdas is not None, sign)):
        written = flat[start:end] if scratch is None else scratch[: end - start]
        if importances is None:
            kernel(written, base, agents, lambdas, eps, sign)
        else:
            kernel(written, base, agents, [h[start:end] for h in importances], lambdas, eps, sign)
        bad += nonfinite(written)
        if scratch is not None:
            flat[start:end].copy_(written)
    if bool(bad):
        stream.raise_nonfinite(0, stream.numel, flat)


def native_statistics(
    stream: DeltaStream, k: int, workers: int, amax: list[tuple[float, float]] | None = None
) -> RamStatistics | None:
    """The counts by the device op on accelerators (left on the device; no ``amax``), else by the native kernels
    where they take the stream (else None); ``amax``: gets (max |τ|, max |θ₀|) appended."""
    if stream.device_eps(stream.activity) is not None:
        return device_statistics(stream, k)
    native = native_for(stream, stream.activity, entries=("counts",))
    if native is None:
        return None
    kernels, eps = native
    tops: dict[int, Tensor] = {}  # per worker (keyed by its counts tensor): max |τ|, max |θ₀|

    def count(start: int, end: int, active: Tensor, unique: Tensor) -> int:
        top = None if amax is None else tops.setdefault(id(active), torch.zeros(2))
        return int(kernels.counts(stream.base, stream.tensors, eps, start, end, active, unique, top))

    stats = native_counts(stream, k, workers, count)
    if amax is not None and tops:
        top = torch.stack(list(tops.values())).amax(0)
        amax.append((float(top[0]), float(top[1])))
    return stats


def device_merges(device: torch.device) -> bool:
    """Whether RAM merges on ``device`` run the device op (every accelerator): ``compile=True`` has nothing to
    build there."""
    return checks.deferred_device(device)


def warm_up(device: torch.device, k: int, auxiliary: bool, scaled: bool = False, sign: bool = False) -> None:
    """Build (or load from the cache) the dynamic-shape RAM kernels on a tiny input; raises where the toolchain
    fails (the engine then merges eagerly, with a warning, before anything is written)."""
    zeros = torch.zeros(3, device=device)
    lambdas = torch.ones(k, device=device) if scaled else None
    key = (k, build_key(scaled, sign))
    compiled(ram_fused_, key=key)(zeros.clone(), zeros, [zeros] * k, lambdas, 0.0, sign)
    if auxiliary:
        compiled(ram_fused_weighted_, key=key)(zeros.clone(), zeros, [zeros] * k, [zeros] * k, lambdas, 0.0, sign)
