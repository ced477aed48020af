"""The one thread pool of the library: the engine's workers, snapshot capture and checksums, and the importance
codes all run on it (a pool per call costs a fraction of a millisecond, which adds up over a model's hundreds of
tensors).

It is made on first use and forgotten in a forked child (which has the pool object but none of its threads). A
task that itself asks for threads — a tensor's snapshot encoded inside the store's per-tensor tasks, a merge
decoding importance codes — must not wait on the pool it runs on (all its threads could be waiting): such calls
get threads of their own (:func:`map_threads`) or run in the caller (:func:`submit`).
"""

from __future__ import annotations

import os
import threading
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, Callable, Iterable, TypeVar

__all__ = ["POOL_THREADS", "shared_pool", "in_pool_thread", "map_threads", "submit"]

T = TypeVar("T")
R = TypeVar("R")

#: Threads of the shared pool; a call that asks for more gets a pool of its own.
POOL_THREADS = 8
_PREFIX = "ram-live-pool"
_EXTRA = "ram-live-extra"
_POOL: ThreadPoolExecutor | None = None
_LOCK = threading.Lock()


def shared_pool() -> ThreadPoolExecutor:
    """The pool of :data:`POOL_THREADS` threads the library shares (made on first use)."""
    global _POOL
    with _LOCK:
        if _POOL is None:
            _POOL = ThreadPoolExecutor(POOL_THREADS, thread_name_prefix=_PREFIX)
        return _POOL


def in_pool_thread() -> bool:
    """Whether the caller is one of the library's worker threads, the shared pool's or one of a pool of their own
    (which must not wait on the shared pool: its threads may all be waiting on them)."""
    return threading.current_thread().name.startswith((_PREFIX, _EXTRA))


def map_threads(fn: Callable[[T], R], items: Iterable[T], threads: int | None = None) -> list[R]:
    """``[fn(x) for x in items]`` over threads: in the caller for one item, else on the shared pool, or on
    ``threads`` threads of their own where the caller is a pool thread or asks for more than the pool has.

    Example:
        >>> map_threads(lambda x: x * x, range(4))
        [0, 1, 4, 9]
    """
    items = list(items)
    if len(items) <= 1:
        return [fn(x) for x in items]
    threads = min(threads or len(items), len(items))
    if threads > POOL_THREADS or in_pool_thread():
        with ThreadPoolExecutor(threads, thread_name_prefix=_EXTRA) as pool:
            return list(pool.map(fn, items))
    return list(shared_pool().map(fn, items))


def submit(fn: Callable[..., R], *args: Any) -> Future[R]:
    """``fn(*args)`` started on the shared pool (the caller goes on meanwhile); run at once in the caller where the
    caller is itself a pool thread."""
    if not in_pool_thread():
        return shared_pool().submit(fn, *args)
    done: Future[R] = Future()
    try:
        done.set_result(fn(*args))
    except BaseException as exc:  # handed to whoever waits on the future, as the pool would
        done.set_exception(exc)
    return done


def _forget_pool() -> None:
    global _POOL, _LOCK
    _POOL, _LOCK = None, threading.Lock()


os.register_at_fork(after_in_child=_forget_pool)
