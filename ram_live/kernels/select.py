"""Native CPU kernels for snapshot capture (:func:`ram_live.store.encoding._encode` on CPU tensors of 2- or 4-byte entries).

One pass over a range of the model and its base, 32 (16) entries per step with AVX-512: compare the bits, store
the step's mask as the bitmask (entry ``i`` is bit ``i % 8`` of byte ``i // 8``: numpy's ``bitorder="little"``, the
store's format), the changed values compressed after the previous ones (``vpcompressw``/``vpcompressd``) and, as
long as few enough changed for int32 indices to be the smaller encoding, their positions. Each entry is read once
and the output is only what changed; numpy needs several passes and a branchy selection (~0.7 ns per entry at 50 %
changed, several times this kernel).

The C source (``ram_live/csrc/select.c``) is compiled once per machine by :func:`ram_live.kernels.cc.load` (the system C
compiler, cached in ``$RAM_LIVE_CACHE``, default ``~/.cache/ram_live``). :func:`kernels` is None when there is no
compiler, the CPU lacks AVX-512 (BW, VBMI2), or ``RAM_LIVE_NATIVE=0``: the numpy path then.
"""

from __future__ import annotations

import ctypes
from dataclasses import dataclass
from typing import Any

from . import cc

ALIGN = 256  # entries: the ranges a tensor is split into for threads start at multiples of this (whole bytes)


@dataclass
class Kernels:
    lib: Any

    def select(self, a: int, b: int, n: int, bits: int, vals: int, itemsize: int, pos: int = 0, cap: int = 0,
               offset: int = 0) -> int:
        """Compare ``n`` entries at addresses ``a``, ``b``; write the bitmask at ``bits``, the changed values at
        ``vals``, the first ``cap`` of their positions (+ ``offset``, int32) at ``pos`` (room for ``cap + 32``);
        return their count. Releases the GIL (threads run side by side)."""
        fn = self.lib.ram_select16 if itemsize == 2 else self.lib.ram_select32
        return int(fn(a, b, n, bits, vals, pos, cap, offset))


#: Tests' seam: None forces the numpy path, False (the default) leaves :func:`kernels` to the shared loader.
_KERNELS: Kernels | None | bool = False


def kernels() -> Kernels | None:
    """The compiled kernels, built on first use; None where they cannot run (see the module's doc)."""
    return cc.kernels("select", _bind) if _KERNELS is False else _KERNELS


def _load() -> Kernels | None:
    return cc.bind("select", _bind)


def _bind(lib: Any, flags: tuple[str, ...]) -> Kernels | None:
    lib.ram_supported.restype = ctypes.c_int
    if not lib.ram_supported():
        return None
    ptr, i64 = ctypes.c_void_p, ctypes.c_int64
    for name in ("ram_select16", "ram_select32"):
        getattr(lib, name).argtypes = [ptr, ptr, i64, ptr, ptr, ptr, i64, i64]
        getattr(lib, name).restype = i64
    return Kernels(lib)
