"""One tensor's activity counts (active and unique entries per agent) by the engine's own counters: compiled
(:func:`fused_statistics`) and torch ops (:func:`torch_statistics`), and the threaded walk a native counter runs
in (:func:`native_counts`). :func:`ram_live.engine.dispatch.count_tensor` picks one, after a method's own."""

from __future__ import annotations

from typing import Callable

import torch
from torch import Tensor

from ..functional.counting import RamCounter, ram_counts_fused
from ..types import RamStatistics
from . import threads
from .stream import DeltaStream

__all__ = ["ADDED", "native_counts", "fused_statistics", "torch_statistics"]

#: What a counter returns where it added the tensor's counts into ``stream.totals`` itself (device passes).
ADDED = RamStatistics(torch.zeros(0, dtype=torch.int64), torch.zeros(0, dtype=torch.int64), torch.zeros(0))


def native_counts(
    stream: DeltaStream,
    k: int,
    workers: int,
    count: Callable[[int, int, Tensor, Tensor], int],
    out: Tensor | None = None,
) -> RamStatistics:
    """``count(start, end, active, unique)`` over the stream's ranges in threads (it adds to the int64 counts and
    returns its number of non-finite entries); the summed counts, or the :class:`NonFiniteError` naming one
    (``out``: what ``count`` writes, if anything)."""

    def job(worker: int, n_workers: int) -> tuple[Tensor, Tensor, int]:
        active, unique = torch.zeros(k, dtype=torch.int64), torch.zeros(k, dtype=torch.int64)
        bad = threads.native_walk(stream, worker, n_workers, lambda start, end: count(start, end, active, unique))
        return active, unique, bad

    results = threads.in_native_workers(stream, workers, job)
    if any(bad for _, _, bad in results):
        stream.raise_nonfinite(0, stream.numel, out)
    return RamStatistics(
        sum(r[0] for r in results),
        sum(r[1] for r in results),  # type: ignore[arg-type]
        torch.zeros(k + 1, dtype=torch.int64),
    )


def fused_statistics(stream: DeltaStream, k: int, eps: float) -> RamStatistics:
    """The counts by the compiled :func:`~ram_live.functional.counting.ram_counts_fused`."""
    active = torch.zeros(k, dtype=torch.float64, device=stream.device)
    unique = torch.zeros_like(active)
    check = torch.zeros((), dtype=torch.float32, device=stream.device)
    for _, _, kernel, base, agents in stream.fused_chunks(ram_counts_fused):
        a, u, c = kernel(base, agents, eps)
        active += a
        unique += u
        check += c
    if not bool(torch.isfinite(check)):
        stream.raise_nonfinite(0, stream.numel)
    return RamStatistics(
        active.cpu().round().long(), unique.cpu().round().long(), torch.zeros(k + 1, dtype=torch.int64)
    )


def torch_statistics(
    stream: DeltaStream, k: int, workers: int = 1, amax: list[tuple[float, float]] | None = None
) -> RamStatistics:
    """The counts by torch ops, one agent at a time per chunk (:class:`~ram_live.functional.counting.RamCounter`)."""

    def job(worker: int, n_workers: int) -> tuple[RamCounter, Tensor | None]:
        counter = RamCounter(stream.stream_chunk, k, stream.device, stream.dtype)
        top = None if amax is None else torch.zeros(2, dtype=stream.dtype, device=stream.device)
        for _, base_f, agents in stream.streamed(worker, n_workers):
            counter.begin(base_f.numel())
            if top is not None:
                top[1] = torch.maximum(top[1], base_f.abs().amax())
            for t, delta in agents:
                counter.add(t, delta)
                if top is not None:
                    top[0] = torch.maximum(top[0], delta.abs().amax())
            counter.end()
        return counter, top

    runs = threads.in_workers(stream, workers, job)
    counters = [c for c, _ in runs]
    if not all(c.finite() for c in counters):
        stream.raise_nonfinite(0, stream.numel)
    if amax is not None and runs:
        top = torch.stack([t for _, t in runs if t is not None]).amax(0)
        amax.append((float(top[0]), float(top[1])))
    results = [c.result() for c in counters]
    return RamStatistics(*(sum(r[i] for r in results) for i in range(3)))  # type: ignore[arg-type]
