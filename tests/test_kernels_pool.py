"""The one thread pool (ram_live/kernels/pool.py): results in order, nested use from the pool's own threads never
waits on the pool (it would deadlock once every thread waits), exceptions reach the caller, a forked child
makes a pool of its own."""

import os
import threading

import pytest

from ram_live.kernels import pool


def test_map_threads_keeps_order_and_uses_the_shared_pool():
    names = pool.map_threads(lambda i: (i, threading.current_thread().name), range(5))
    assert [i for i, _ in names] == list(range(5))
    assert all(n.startswith("ram-live-pool") for _, n in names)
    assert pool.map_threads(lambda i: i + 1, [41]) == [42]  # one item: in the caller
    assert pool.map_threads(lambda i: i, []) == []


def test_more_threads_than_the_pool_get_their_own():
    got = pool.map_threads(
        lambda i: threading.current_thread().name, range(pool.POOL_THREADS + 2), pool.POOL_THREADS + 2
    )
    assert all(n.startswith("ram-live-extra") for n in got)
    # their threads count as the library's too: what they start runs in them or on threads of its own
    inner = pool.map_threads(
        lambda i: (pool.in_pool_thread(), pool.submit(threading.current_thread).result().name),
        range(pool.POOL_THREADS + 2),
        pool.POOL_THREADS + 2,
    )
    assert all(flag and name.startswith("ram-live-extra") for flag, name in inner)


def test_nested_use_from_every_pool_thread_does_not_deadlock():
    # every pool thread blocked in an inner map at once: an inner map on the same pool would never finish
    barrier = threading.Barrier(pool.POOL_THREADS, timeout=30)

    def outer(i: int) -> int:
        barrier.wait()
        inner = pool.map_threads(lambda j: i * 10 + j, range(3))
        started = pool.submit(lambda: i)
        return sum(inner) + started.result(timeout=30)

    got = pool.map_threads(outer, range(pool.POOL_THREADS), pool.POOL_THREADS)
    assert got == [i * 30 + 3 + i for i in range(pool.POOL_THREADS)]


def test_submit_hands_exceptions_to_the_waiter():
    def boom() -> None:
        raise KeyError("tensor w")

    with pytest.raises(KeyError, match="tensor w"):
        pool.submit(boom).result(timeout=30)
    with pytest.raises(KeyError, match="tensor w"):  # the same from a pool thread, where it runs in the caller
        pool.map_threads(lambda _: pool.submit(boom).result(timeout=30), range(2))


@pytest.mark.skipif(not hasattr(os, "fork"), reason="no fork")
def test_a_forked_child_makes_a_pool_of_its_own():
    parent = pool.shared_pool()
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # child: the parent's pool object has no threads here; never returns into pytest
        try:
            ok = pool.shared_pool() is not parent and pool.map_threads(lambda i: i * 2, range(3)) == [0, 2, 4]
            os.write(write, b"1" if ok else b"0")
        finally:
            os._exit(0)
    os.close(write)
    assert os.read(read, 1) == b"1"
    os.waitpid(pid, 0)
