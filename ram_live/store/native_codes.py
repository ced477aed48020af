"""Native CPU encoder and decoder of the snapshot store's 8-bit importance codes (csrc/impcodes.c; the format:
:mod:`ram_live.store.importance_codes`). Integer operations only: the codes and the decoded importances are the
torch path's bits (tested at every build level).

Encoding reads a piece's importances once, at its stored entries (all of them, int32/int64 indices or a
bitmask), block by block: it checks them and writes their codes against the running maximum; codes written
before the maximum last grew are moved to it afterwards (a pass over those codes only). Tensors of at least
``SPLIT`` stored entries are split over threads (ctypes releases the GIL). :func:`kernels` is None without a C
compiler or with ``RAM_LIVE_NATIVE=0``: the store then uses the torch path.
"""

from __future__ import annotations

import ctypes
import struct
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from ..kernels import cc
from ..kernels.pool import map_threads
from ..errors import InvalidStateError
from ..io.memory import advise_hugepages

__all__ = ["Kernels", "kernels", "build", "octave", "DTYPES", "KINDS", "SPLIT", "TOP_OCTAVE", "BAD_VALUE", "BAD_INDEX"]

DTYPES = {torch.float32: 0, torch.bfloat16: 1}
KINDS = {"dense": 0, "indices32": 1, "indices64": 2, "bitmask": 3}
SPLIT = 1 << 20  # stored entries per thread at least
TOP_OCTAVE = 2039  # the largest octave a code counts from (2040 would decode as Inf)
SEGMENTS = 2048  # a range's running maximum takes at most 2041 octaves
BAD_VALUE, BAD_INDEX = -1, -2  # what a scan returns for a negative/NaN/Inf importance and for an index outside [0, n)


def octave(top_bits: int) -> int:
    """float32 bits → exponent and 3 mantissa bits, rounded to nearest, at most ``TOP_OCTAVE`` (the format's
    ``_octaves``)."""
    return min((top_bits + (1 << 19)) >> 20, TOP_OCTAVE)


def _float(bits: int) -> float:
    return struct.unpack("<f", struct.pack("<I", bits))[0]


@dataclass
class Kernels:
    lib: Any

    def encode(self, flat: Tensor, kind: str, positions: Tensor | None, count: int) -> tuple[Tensor, float] | int:
        """uint8 codes and the float32 maximum of ``flat``'s importances at a piece's stored entries (``kind``: a
        key of :data:`KINDS`; ``count`` entries), or :data:`BAD_VALUE` / :data:`BAD_INDEX` (the caller finds and
        names the culprit). ``flat``: contiguous CPU float32/bfloat16."""
        n, k = flat.numel(), KINDS[kind]
        if k == 0 and count != n:  # the kernel reads count entries of flat: never past its end
            raise InvalidStateError(f"a dense piece's importances are all {n} entries, got count={count}")
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
        codes = advise_hugepages(torch.empty(count, dtype=torch.uint8))  # its first-touch faults cost as much
        r_n = max(1, len(ranges))
        tops = (ctypes.c_uint32 * r_n)()
        segs = [(ctypes.c_int64 * (2 * SEGMENTS))() for _ in range(r_n)]
        nsegs = (ctypes.c_int32 * r_n)()
        dtype, h, cp = DTYPES[flat.dtype], flat.data_ptr(), codes.data_ptr()

        def run(r: int) -> int:
            s, e = ranges[r]
            return int(
                self.lib.ram_imp_encode(
                    dtype,
                    h,
                    k,
                    pos,
                    n,
                    s,
                    e,
                    cp + offsets[r],
                    ctypes.byref(tops, 4 * r),
                    segs[r],
                    ctypes.byref(nsegs, 4 * r),
                )
            )

        got = map_threads(run, range(len(ranges)))
        if BAD_INDEX in got or any(g != size for g, size in zip(got, sizes) if g >= 0):
            return BAD_INDEX
        if BAD_VALUE in got:
            return BAD_VALUE
        top_bits = max(tops[: len(ranges)], default=0)
        if top_bits == 0:  # all zero: so are the codes
            return codes, 0.0
        top = octave(top_bits)
        for r in range(len(ranges)):  # codes written against a smaller running maximum (rare; a cheap pass)
            if nsegs[r] > 1 or segs[r][1] != top:
                self.lib.ram_imp_fix(cp + offsets[r], sizes[r], segs[r], nsegs[r], top)
        return codes, _float(top_bits)

    def decode(
        self,
        codes: Tensor,
        maximum: float,
        kind: str,
        positions: Tensor | None,
        n: int,
        dtype: torch.dtype = torch.float32,
    ) -> Tensor | None:
        """The importances of a piece of ``n`` entries (0 where it stores none) as float32 or bfloat16 (the same
        values: a decoded importance has a 3-bit mantissa), or None where the positions do not match the codes."""
        out = advise_hugepages(torch.empty(n, dtype=dtype))
        top = octave(struct.unpack("<I", struct.pack("<f", maximum))[0])
        pos = 0 if positions is None else positions.data_ptr()
        ok = self.lib.ram_imp_decode(
            codes.data_ptr(), codes.numel(), top, KINDS[kind], pos, n, DTYPES[dtype], out.data_ptr()
        )
        return out if ok == 0 else None


#: Tests' seam: None forces the torch path, False (the default) leaves :func:`kernels` to the shared loader.
_KERNELS: Kernels | None | bool = False


def build(flags: list[str] | None = None) -> Kernels | None:
    """The kernels compiled with ``flags`` (default: the host level's, :func:`ram_live.kernels.cc.flags`), or None."""
    return cc.bind("impcodes", _bind, flags)


def _bind(lib: ctypes.CDLL, flags: tuple[str, ...]) -> Kernels:
    ptr, i64, i32 = ctypes.c_void_p, ctypes.c_int64, ctypes.c_int
    lib.ram_imp_encode.argtypes = [i32, ptr, i32, ptr, i64, i64, i64, ptr, ptr, ptr, ptr]
    lib.ram_imp_encode.restype = i64
    lib.ram_imp_fix.argtypes = [ptr, i64, ptr, ctypes.c_int32, ctypes.c_int32]
    lib.ram_imp_fix.restype = None
    lib.ram_imp_decode.argtypes = [ptr, i64, ctypes.c_int32, i32, ptr, i64, i32, ptr]
    lib.ram_imp_decode.restype = i64
    lib.ram_imp_popcount.argtypes = [ptr, i64, i64]
    lib.ram_imp_popcount.restype = i64
    return Kernels(lib)


def kernels() -> Kernels | None:
    """The compiled kernels, built on first use (once per machine); None where they cannot be (and with
    ``RAM_LIVE_NATIVE=0``, read at each call like every family's)."""
    return cc.kernels("impcodes", _bind) if _KERNELS is False else _KERNELS
