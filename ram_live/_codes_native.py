"""Native CPU encoder and decoder of the snapshot store's 8-bit importance codes (csrc/impcodes.c; the format:
:mod:`ram_live.store.importance`). Integer operations only: the codes and the decoded importances are the torch
path's bits (tested at every build level).

Encoding reads a piece's importances once, at its stored entries (all of them, int32/int64 indices or a
bitmask), checking them and taking their maximum while it writes each entry's octave; a second pass over those
(2 bytes an entry) writes the codes. Tensors of at least ``SPLIT`` stored entries are split over threads (ctypes
releases the GIL). :func:`kernels` is None without a C compiler or with ``RAM_LIVE_NATIVE=0``: the store then
uses the torch path.
"""

from __future__ import annotations

import ctypes
import os
import struct
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from . import _cc

__all__ = ["Kernels", "kernels", "DTYPES", "KINDS", "SPLIT", "BAD_VALUE", "BAD_INDEX"]

DTYPES = {torch.float32: 0, torch.bfloat16: 1}
KINDS = {"dense": 0, "indices32": 1, "indices64": 2, "bitmask": 3}
SPLIT = 1 << 20  # stored entries per thread at least
BAD_VALUE, BAD_INDEX = -1, -2  # what a scan returns for a negative/NaN/Inf importance and for an index outside [0, n)

_POOL: ThreadPoolExecutor | None = None


def _pool() -> ThreadPoolExecutor:
    global _POOL
    if _POOL is None:
        _POOL = ThreadPoolExecutor(max_workers=8, thread_name_prefix="ram_live_codes")
    return _POOL


def _forget_pool() -> None:
    global _POOL
    _POOL = None  # a forked child has the pool object but none of its threads


os.register_at_fork(after_in_child=_forget_pool)


def octave(top_bits: int) -> int:
    """float32 bits → exponent and 3 mantissa bits, rounded to nearest (the format's ``_octaves``)."""
    return (top_bits + (1 << 19)) >> 20


def _float(bits: int) -> float:
    return struct.unpack("<f", struct.pack("<I", bits))[0]


@dataclass
class Kernels:
    lib: Any

    def encode(self, flat: Tensor, kind: str, positions: Tensor | None, count: int
               ) -> tuple[Tensor, float] | int:
        """uint8 codes and the float32 maximum of ``flat``'s importances at a piece's stored entries (``kind``: a
        key of :data:`KINDS`; ``count`` entries), or :data:`BAD_VALUE` / :data:`BAD_INDEX` (the caller finds and
        names the culprit). ``flat``: contiguous CPU float32/bfloat16."""
        n, k = flat.numel(), KINDS[kind]
        if k == 0:
            assert count == n
        work = count if k in (1, 2) else n
        parts = max(1, min(torch.get_num_threads(), 8, count // SPLIT))
        per = -(-work // parts // 8) * 8 if parts > 1 else work  # bitmask ranges start at whole bytes
        ranges = [(s, min(work, s + per)) for s in range(0, work, per)] if work else []
        pos = 0 if positions is None else positions.data_ptr()
        if k == 3:
            sizes = [int(self.lib.ram_imp_popcount(pos, s // 8, (e + 7) // 8)) for s, e in ranges]
        else:
            sizes = [e - s for s, e in ranges]
        if sum(sizes) != count:
            return BAD_INDEX
        offsets = [sum(sizes[:r]) for r in range(len(ranges))]
        scratch = torch.empty(count, dtype=torch.uint16)
        tops = (ctypes.c_uint32 * max(1, len(ranges)))()
        dtype, h, sp = DTYPES[flat.dtype], flat.data_ptr(), scratch.data_ptr()

        def scan(r: int) -> int:
            s, e = ranges[r]
            return int(self.lib.ram_imp_scan(dtype, h, k, pos, n, s, e, sp + 2 * offsets[r],
                                             ctypes.byref(tops, 4 * r)))

        got = [scan(0)] if len(ranges) == 1 else list(_pool().map(scan, range(len(ranges))))
        for g, size in zip(got, sizes):
            if g < 0:
                return BAD_INDEX if BAD_INDEX in got else BAD_VALUE
            if g != size:
                return BAD_INDEX
        top_bits = max(tops[: len(ranges)], default=0)
        if top_bits == 0:
            return torch.zeros(count, dtype=torch.uint8), 0.0
        codes = torch.empty(count, dtype=torch.uint8)
        top, cp = octave(top_bits), codes.data_ptr()

        def finish(r: int) -> None:
            self.lib.ram_imp_codes(sp + 2 * offsets[r], sizes[r], top, cp + offsets[r])

        if len(ranges) == 1:
            finish(0)
        else:
            list(_pool().map(finish, range(len(ranges))))
        return codes, _float(top_bits)

    def decode(self, codes: Tensor, maximum: float, kind: str, positions: Tensor | None, n: int) -> Tensor | None:
        """The float32 importances of a piece of ``n`` entries (0 where it stores none), or None where the
        positions do not match the codes."""
        out = torch.empty(n, dtype=torch.float32)
        top = octave(struct.unpack("<I", struct.pack("<f", maximum))[0])
        pos = 0 if positions is None else positions.data_ptr()
        ok = self.lib.ram_imp_decode(codes.data_ptr(), codes.numel(), top, KINDS[kind], pos, n, out.data_ptr())
        return out if ok == 0 else None


_KERNELS: Kernels | None | bool = False


def build(flags: list[str] | None = None) -> Kernels | None:
    """The kernels compiled with ``flags`` (default: the host level's, :func:`ram_live._cc.flags`), or None."""
    lib = _cc.load_library(_cc.source("impcodes.c"), "impcodes", flags)
    if lib is None:
        return None
    ptr, i64, i32 = ctypes.c_void_p, ctypes.c_int64, ctypes.c_int
    lib.ram_imp_scan.argtypes = [i32, ptr, i32, ptr, i64, i64, i64, ptr, ptr]
    lib.ram_imp_scan.restype = i64
    lib.ram_imp_codes.argtypes = [ptr, i64, ctypes.c_int32, ptr]
    lib.ram_imp_codes.restype = None
    lib.ram_imp_decode.argtypes = [ptr, i64, ctypes.c_int32, i32, ptr, i64, ptr]
    lib.ram_imp_decode.restype = i64
    lib.ram_imp_popcount.argtypes = [ptr, i64, i64]
    lib.ram_imp_popcount.restype = i64
    return Kernels(lib)


def kernels() -> Kernels | None:
    """The compiled kernels, built on first use (once per machine); None where they cannot be."""
    global _KERNELS
    if _KERNELS is False:
        _KERNELS = build()
    return _KERNELS
