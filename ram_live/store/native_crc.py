"""CRC-32 (zlib's) with carry-less multiplication (PCLMULQDQ), several times ``zlib.crc32``'s speed.

Folds 64 bytes per step into four 128-bit lanes, then 16 bytes per step, then a Barrett reduction (Gopal et al.,
"Fast CRC Computation for Generic Polynomials Using PCLMULQDQ Instruction", Intel 2009; the constants of the
bit-reflected CRC-32 polynomial are those zlib and Chromium use); the last < 16 bytes go through a table.
The result is bit for bit ``zlib.crc32``'s (tests compare them on every length and alignment).

Compiled once per machine by :func:`ram_live.kernels.cc.load`; :func:`native_crc32` is None without a C
compiler, on CPUs without PCLMULQDQ and SSE4.1, or with ``RAM_LIVE_NATIVE=0``: the store then uses
``zlib.crc32`` (the same values, slower).
"""

from __future__ import annotations

import ctypes
from collections.abc import Callable

from ..kernels import cc


def native_crc32() -> Callable[[int, int, int], int] | None:
    """``crc32(crc, address, length) -> crc`` over memory at ``address`` (zlib's running-CRC convention), or None
    where the kernel cannot run (see the module's doc). The GIL is released while it runs."""
    lib = cc.kernels("crc32", _bind)
    return None if lib is None else lib.ram_crc32


def _bind(lib: ctypes.CDLL, flags: tuple[str, ...]) -> ctypes.CDLL | None:
    lib.ram_crc_supported.restype = ctypes.c_int
    if not lib.ram_crc_supported():
        return None
    lib.ram_crc32.argtypes = [ctypes.c_uint32, ctypes.c_void_p, ctypes.c_uint64]
    lib.ram_crc32.restype = ctypes.c_uint32
    lib.ram_crc_wide.argtypes = [ctypes.c_int]
    lib.ram_crc_wide.restype = ctypes.c_int
    return lib


def allow_wide(allow: bool) -> bool:
    """Use the 512-bit (VPCLMULQDQ) path where the CPU has it (``allow=False``: the 128-bit path only, for
    tests); returns whether it runs."""
    lib = cc.kernels("crc32", _bind)
    return bool(lib.ram_crc_wide(int(allow))) if lib is not None else False
