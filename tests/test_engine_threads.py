"""engine/threads.py: how a tensor's ranges are shared among workers, and the shared pool."""

from __future__ import annotations

import threading

import pytest
import torch

from ram_live.engine import threads
from ram_live.engine.stream import DeltaStream


def _stream(numel: int) -> DeltaStream:
    base = torch.zeros(numel)
    return DeltaStream("w", base, [base + 1, base + 2], ("a", "b"), torch.device("cpu"), 1 << 20)


@pytest.mark.parametrize("numel, workers", [(1000, 1), (1000, 3), (1024, 4), (7, 2), (64 * 5 + 1, 8)])
def test_native_walk_covers_every_entry_once_in_ranges_of_native_chunk(monkeypatch, numel, workers) -> None:
    monkeypatch.setattr(threads, "NATIVE_CHUNK", 64)
    stream = _stream(numel)
    released: list[tuple[int, int]] = []
    stream.range_done = lambda start, stop: released.append((start, stop))
    calls: list[tuple[int, int, int]] = []
    lock = threading.Lock()

    def job(worker: int, n_workers: int) -> int:
        def call(start: int, end: int) -> int:
            with lock:
                calls.append((worker, start, end))
            return 1

        return threads.native_walk(stream, worker, n_workers, call)

    results = threads.in_native_workers(stream, workers, job)
    ranges = sorted((s, e) for _, s, e in calls)
    assert ranges == [(s, min(numel, s + 64)) for s in range(0, numel, 64)]  # each once, in NATIVE_CHUNK pieces
    assert sorted(released) == ranges and sum(results) == len(ranges)  # returns the calls' sum
    used = min(workers, -(-numel // 64))
    assert len(results) == used
    for worker, start, _ in calls:  # worker w takes every `used`-th range from its w-th
        assert (start // 64) % used == worker


def test_in_workers_from_a_pool_thread_runs_in_a_pool_of_its_own() -> None:
    """A job the shared pool runs may itself share work: it must not wait on the pool it occupies."""
    stream = _stream(threads.POOL_THREADS * 10)

    def inner(worker: int, n_workers: int) -> tuple[int, int, str]:
        return worker, n_workers, threading.current_thread().name

    def outer(worker: int, n_workers: int) -> list[tuple[int, int, str]]:
        return threads.in_workers(stream, 2, inner, chunk=10)

    results = threads.in_workers(stream, threads.POOL_THREADS, outer, chunk=10)
    assert len(results) == threads.POOL_THREADS
    for inner_results in results:
        assert [(w, n) for w, n, _ in inner_results] == [(0, 2), (1, 2)]
        assert all(name.startswith("ram-live-extra") for _, _, name in inner_results)


def test_worker_count_defaults() -> None:
    assert threads.worker_count(3, torch.device("cpu")) == 3
    assert threads.worker_count(None, torch.device("cpu")) == min(torch.get_num_threads(), 8)
    assert threads.worker_count(None, torch.device("cuda")) == 1
