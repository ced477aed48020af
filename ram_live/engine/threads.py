"""The threads that share a tensor's chunks: how many (:func:`default_workers`), run on the library's one pool
(:mod:`ram_live.kernels.pool`), and the walk of the native kernels over a tensor's ranges (every ``workers``-th
range per worker)."""

from __future__ import annotations

from typing import Any, Callable

import torch

from ..kernels.pool import POOL_THREADS, map_threads
from .stream import DeltaStream

__all__ = [
    "NATIVE_CHUNK",
    "POOL_THREADS",
    "default_workers",
    "worker_count",
    "in_workers",
    "in_native_workers",
    "native_walk",
    "native_ranges",
]

#: Entries per call of the native CPU kernels (threads take every ``workers``-th range of a tensor).
NATIVE_CHUNK = 1 << 18


def default_workers(device: torch.device) -> int:
    """Threads that share a tensor's chunks: on CPU as many as torch's intra-op threads (at most 8), since each
    cache-sized op then runs on one core without OpenMP hand-offs; one on accelerators (one stream).

    Example:
        >>> default_workers(torch.device("cuda"))
        1
    """
    return min(torch.get_num_threads(), 8) if device.type == "cpu" else 1


def worker_count(workers: int | None, device: torch.device) -> int:
    """``workers`` as given, else :func:`default_workers` for ``device``."""
    return workers if workers is not None else default_workers(device)


def in_workers(
    stream: DeltaStream, workers: int, job: Callable[[int, int], Any], chunk: int | None = None
) -> list[Any]:
    """``job(worker, workers)`` for each worker, in threads when there is more than one chunk (of ``chunk``
    entries, default the stream's) to share."""
    workers = max(1, min(workers, -(-stream.numel // (chunk or stream.stream_chunk))))
    return map_threads(lambda w: job(w, workers), range(workers), workers)


def in_native_workers(stream: DeltaStream, workers: int, job: Callable[[int, int], Any]) -> list[Any]:
    """:func:`in_workers` over ranges of :data:`NATIVE_CHUNK` entries (what :func:`native_walk` hands out)."""
    return in_workers(stream, workers, job, NATIVE_CHUNK)


def native_walk(stream: DeltaStream, worker: int, workers: int, call: Callable[[int, int], int]) -> int:
    """``call(start, end)`` on this worker's share of the ranges (every ``workers``-th), each range's pages
    released after it; returns the sum of what the calls return (their counts of non-finite entries)."""
    bad = 0
    for start in range(worker * NATIVE_CHUNK, stream.numel, NATIVE_CHUNK * workers):
        end = min(stream.numel, start + NATIVE_CHUNK)
        bad += call(start, end)
        if stream.range_done is not None:
            stream.range_done(start, end)
    return bad


def native_ranges(stream: DeltaStream, workers: int, call: Callable[[int, int], int]) -> bool:
    """``call(start, end)`` over every range of the stream, shared by the native workers (:func:`native_walk`);
    whether any call reported a non-finite entry (the caller then names the culprit)."""
    return any(in_native_workers(stream, workers, lambda worker, n: native_walk(stream, worker, n, call)))
