"""The environment switches of the native kernels, read in one place.

* ``RAM_LIVE_NATIVE=0``: every native kernel off (the torch paths run); read each time a kernel is asked for
  through :func:`ram_live.kernels.cc.kernels`, so it also turns off those a process already loaded.
* ``RAM_LIVE_SIMD``: the instruction level the kernels are built for: ``auto`` (default: what the host has),
  ``avx512``, ``avx2``, ``neon`` or ``scalar``. A level the host cannot run falls back to the host's own
  (e.g. ``RAM_LIVE_SIMD=avx2`` on an AVX-512 host measures the AVX2 build; ``avx512`` on an AVX2 host gets AVX2).
* ``RAM_LIVE_SINGLE_READ``: ``0``/``1``/``auto``, how RAM+ with global ρ reads its inputs (:func:`single_read`).
* ``RAM_LIVE_HUGEPAGES``: ``0``/``1``, huge pages under fresh outputs (:func:`hugepages`).
* ``CC``: the C compiler (default ``cc``).
* ``RAM_LIVE_CACHE``: where the built libraries are kept (default ``$XDG_CACHE_HOME/ram_live`` or
  ``~/.cache/ram_live``); read when a library is built or first loaded.

Example:
    >>> from ram_live import settings
    >>> settings.simd_level() in ("auto", "avx512", "avx2", "neon", "scalar")
    True
"""

from __future__ import annotations

import os
from pathlib import Path

from .errors import ConfigError

__all__ = ["SIMD_LEVELS", "native_enabled", "simd_level", "cache_dir", "single_read", "hugepages", "c_compiler"]

#: Build levels of the native kernels, fastest first (``auto``: the host's).
SIMD_LEVELS = ("avx512", "avx2", "neon", "scalar")


def native_enabled() -> bool:
    """False where ``RAM_LIVE_NATIVE=0``."""
    return os.environ.get("RAM_LIVE_NATIVE", "1") != "0"


def simd_level() -> str:
    """``RAM_LIVE_SIMD`` (``auto`` when unset); raises :class:`~ram_live.errors.ConfigError` on another value."""
    level = os.environ.get("RAM_LIVE_SIMD", "auto").strip().lower() or "auto"
    if level != "auto" and level not in SIMD_LEVELS:
        raise ConfigError(f"RAM_LIVE_SIMD={level!r}: expected auto or one of {', '.join(SIMD_LEVELS)}")
    return level


def cache_dir() -> Path:
    """The folder of the built kernel libraries."""
    if os.environ.get("RAM_LIVE_CACHE"):
        return Path(os.environ["RAM_LIVE_CACHE"])
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "ram_live"


def single_read() -> str:
    """``RAM_LIVE_SINGLE_READ``: ``"0"`` (RAM+ with global ρ always reads its inputs twice), ``"1"`` (reads them
    once whatever the owner maps cost) or ``"auto"`` (default: once where the owner maps fit the memory bound)."""
    return os.environ.get("RAM_LIVE_SINGLE_READ", "auto") or "auto"


def hugepages(default: bool) -> bool:
    """``RAM_LIVE_HUGEPAGES`` ("1"/"0"): whether fresh outputs are advised to use huge pages; unset: ``default``."""
    value = os.environ.get("RAM_LIVE_HUGEPAGES", "")
    return default if value == "" else value != "0"


def c_compiler() -> str:
    """The C compiler the native kernels are built with: ``$CC``, else ``cc``."""
    return os.environ.get("CC", "cc")
