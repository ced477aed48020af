"""Native CPU kernels for snapshot capture (:func:`ram_live.store.encoding._encode` on CPU tensors of 2- or 4-byte
entries).

One pass over a range of the model and its base: compare the bits, store the mask as the bitmask (entry ``i`` is
bit ``i % 8`` of byte ``i // 8``: numpy's ``bitorder="little"``, the store's format), the changed values after the
previous ones and, as long as few enough changed for int32 indices to be the smaller encoding, their positions.
Each entry is read once and the output is only what changed; numpy needs several passes and a branchy selection.

The C source (``ram_live/csrc/select.c``) is built at the build level of :mod:`ram_live.kernels.cc`
(``RAM_LIVE_SIMD``): with AVX-512 (BW, VBMI2) 32 (16) entries a step compressed by ``vpcompressw``/``vpcompressd``;
with AVX2 the loops of ``csrc/select_vec.h`` (compare and movemask, 8 entries compressed a shuffle, its control
from a table); at every other level (the x86-64 baseline, NEON) its generic vector-extension loops. Integer
compares and copies only: every level writes the same bytes (tested at each). The generic loops were measured
slower than numpy on the x86-64 baseline (docs/store.md), so :func:`kernels`, the capture's choice, leaves them to
the tests (:func:`build`); it is None there, without a compiler, or with ``RAM_LIVE_NATIVE=0``: the numpy path
then.
"""

from __future__ import annotations

import ctypes
from dataclasses import dataclass
from typing import Any, Sequence

from ..kernels import cc

ALIGN = 256  # entries: the ranges a tensor is split into for threads start at multiples of this (whole bytes)


@dataclass
class Kernels:
    """The compiled kernels; ``simd_bits``: 512 for the AVX-512 loops, 256 for the AVX2 ones, 0 for the generic."""

    lib: Any
    simd_bits: int = 0

    def select(
        self, a: int, b: int, n: int, bits: int, vals: int, itemsize: int, pos: int = 0, cap: int = 0, offset: int = 0
    ) -> int:
        """Compare ``n`` entries at addresses ``a``, ``b``; write the bitmask at ``bits``, the changed values at
        ``vals``, the first ``cap`` of their positions (+ ``offset``, int32) at ``pos`` (room for ``cap + 32``);
        return their count. Releases the GIL (threads run side by side)."""
        fn = self.lib.ram_select16 if itemsize == 2 else self.lib.ram_select32
        return int(fn(a, b, n, bits, vals, pos, cap, offset))


#: Tests' seam: None forces the numpy path, False (the default) leaves :func:`kernels` to the shared loader.
_KERNELS: Kernels | None | bool = False


def kernels() -> Kernels | None:
    """The compiled kernels the capture uses, built on first use; None where they cannot run or where only the
    generic loops are built (see the module's doc): the numpy path then."""
    if _KERNELS is not False:
        return _KERNELS
    found = cc.kernels("select", _bind)
    return found if found is not None and found.simd_bits else None


def _load() -> Kernels | None:
    return cc.bind("select", _bind)


def build(flags: Sequence[str] | None = None) -> Kernels | None:
    """The kernels compiled with ``flags`` (default: this host's build level), or None where they cannot be."""
    return cc.bind("select", _bind, flags)


def _bind(lib: Any, flags: tuple[str, ...]) -> Kernels | None:
    lib.ram_supported.restype = ctypes.c_int
    if not lib.ram_supported():
        return None
    ptr, i64 = ctypes.c_void_p, ctypes.c_int64
    for name in ("ram_select16", "ram_select32"):
        getattr(lib, name).argtypes = [ptr, ptr, i64, ptr, ptr, ptr, i64, i64]
        getattr(lib, name).restype = i64
    lib.ram_select_simd_bits.restype = ctypes.c_int
    return Kernels(lib, int(lib.ram_select_simd_bits()))
