"""CRC-32 (zlib's, the one of gzip, zip and PNG) of data files, over several threads at once.

Each thread computes the CRC of one contiguous range (the PCLMULQDQ kernel of :mod:`ram_live.store.native_crc`, else
``zlib.crc32``; both release the GIL); the ranges' CRCs are then combined (:func:`crc32_combine`, zlib's own
method: multiplication by x^(8n) modulo the polynomial), so the result is the plain CRC-32 of the whole file,
the one ``python -c "import zlib; print(f'{zlib.crc32(open(F, "rb").read()):08x}')"`` prints.
"""

from __future__ import annotations

import ctypes
import zlib
from collections.abc import Sequence
from concurrent.futures import Future

import torch

from ..kernels.pool import submit

_POLY = 0xEDB88320  # the CRC-32 polynomial, reflected
_STEP = 1 << 23  # bytes per zlib.crc32 call (a thread's range is hashed in such steps)
_MIN_SPLIT = 1 << 22  # ranges below this are not worth a thread


def _multmodp(a: int, b: int) -> int:
    """a(x) * b(x) modulo the CRC polynomial (reflected bit order, as zlib)."""
    m, p = 1 << 31, 0
    while True:
        if a & m:
            p ^= b
            if a & (m - 1) == 0:
                return p
        m >>= 1
        b = (b >> 1) ^ _POLY if b & 1 else b >> 1


_X2N = [1 << 30]  # x^(2^k) modulo the polynomial, k = 0..31
for _ in range(31):
    _X2N.append(_multmodp(_X2N[-1], _X2N[-1]))


def crc32_combine(crc1: int, crc2: int, len2: int) -> int:
    """The CRC-32 of ``A + B`` from ``crc1`` of A, ``crc2`` of B and B's length in bytes."""
    p, k, n = 1 << 31, 3, len2  # x^(8 * len2)
    while n:
        if n & 1:
            p = _multmodp(_X2N[k & 31], p)
        n >>= 1
        k += 1
    return _multmodp(p, crc1) ^ crc2


def crc_range(buffers: Sequence[memoryview], crc: int = 0) -> int:
    """The running CRC-32 ``crc`` continued over ``buffers`` (writable views go to the native kernel)."""
    from .native_crc import native_crc32

    fn = native_crc32()
    for buf in buffers:
        if not len(buf):
            continue
        if fn is not None and not buf.readonly:
            crc = fn(crc, ctypes.addressof(ctypes.c_char.from_buffer(buf)), len(buf))
            continue
        for s in range(0, len(buf), _STEP):
            crc = zlib.crc32(buf[s : s + _STEP], crc)
    return crc


def _split(buffers: Sequence[memoryview], parts: int) -> list[list[memoryview]]:
    """``buffers`` (byte views, in order) cut into ``parts`` ranges of nearly equal size."""
    total = sum(len(b) for b in buffers)
    per = -(-total // parts)
    ranges: list[list[memoryview]] = [[]]
    room = per
    for buf in buffers:
        while len(buf):
            take = min(room, len(buf))
            ranges[-1].append(buf[:take])
            buf, room = buf[take:], room - take
            if room == 0:
                ranges.append([])
                room = per
    return [r for r in ranges if r]


def crc32_start(buffers: Sequence[memoryview], threads: int | None = None) -> tuple[list[Future[int]], list[int]]:
    """Start the CRC-32 of the concatenation of ``buffers`` on the store's thread pool (the caller may write the
    same buffers meanwhile); :func:`crc32_finish` returns it."""
    total = sum(len(b) for b in buffers)
    threads = threads or max(1, min(torch.get_num_threads(), 8))
    parts = max(1, min(threads, total // _MIN_SPLIT))
    ranges = _split(buffers, parts)
    return [submit(crc_range, r) for r in ranges], [sum(len(b) for b in r) for r in ranges]


def crc32_finish(started: tuple[list[Future[int]], list[int]]) -> int:
    futures, lengths = started
    crc = 0
    for future, length in zip(futures, lengths):
        crc = crc32_combine(crc, future.result(), length)
    return crc


def crc32(buffers: Sequence[memoryview], threads: int | None = None) -> int:
    """The CRC-32 of the concatenation of ``buffers``, over up to ``threads`` threads.

    Example:
        >>> crc32([memoryview(b"hello "), memoryview(b"world")]) == zlib.crc32(b"hello world")
        True
    """
    total = sum(len(b) for b in buffers)
    if total < 2 * _MIN_SPLIT or (threads or 2) == 1:
        return crc_range(buffers)
    return crc32_finish(crc32_start(buffers, threads))


def crc_hex(crc: int) -> str:
    return f"{crc & 0xFFFFFFFF:08x}"
