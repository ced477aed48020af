"""Build one of the C sources of ``ram_live/csrc`` into a shared library once per machine; load it with ``ctypes``.

The flags follow the host's instruction level (:func:`host_level`): x86-64-v4 (AVX-512 F, BW, VL, DQ) →
``-march=native`` (the kernels' AVX-512 loops), x86-64-v3 (AVX2, FMA, F16C, BMI2) → ``-march=x86-64-v3``,
aarch64 → ``-march=armv8-a`` (NEON), anything else → the compiler's baseline. ``RAM_LIVE_SIMD`` (read by
:mod:`ram_live.settings`) forces a lower level, e.g. the AVX2 build on an AVX-512 host. Contraction into FMAs
stays off at every level, so all of them give the same bits.

The library lands in :func:`ram_live.settings.cache_dir` under a name hashed from the source and every header
of ``csrc`` (their contents), the flags, the compiler and the CPU's feature flags (a cache shared by machines of
different CPUs never hands one a library built for another's instructions). Built in a temporary folder and
renamed into place, so processes that build at once agree. Native kernels are tried on Linux and macOS, x86-64
and aarch64, unless ``RAM_LIVE_NATIVE=0``.
"""

from __future__ import annotations

import ctypes
import functools
import hashlib
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import uuid
from pathlib import Path

from . import settings

__all__ = ["COMMON_FLAGS", "native_enabled", "cache_dir", "host_level", "build_level", "flags", "source",
           "load_library", "is_x86"]

CSRC = Path(__file__).with_name("csrc")
#: Flags of every build: no FMA contraction (the torch paths' bits), no errno from math functions.
COMMON_FLAGS = ("-O3", "-ffp-contract=off", "-fno-strict-aliasing", "-fno-math-errno")
_X86 = ("x86_64", "amd64")
_ARM = ("aarch64", "arm64")
_RANK = {"avx512": 3, "avx2": 2, "neon": 2, "scalar": 0}


def is_x86() -> bool:
    return platform.machine().lower() in _X86


def native_enabled() -> bool:
    """Native kernels are tried on Linux and macOS, x86-64 and aarch64, unless ``RAM_LIVE_NATIVE=0``."""
    return (settings.native_enabled() and sys.platform.startswith(("linux", "darwin"))
            and platform.machine().lower() in _X86 + _ARM)


def cache_dir() -> Path:
    return settings.cache_dir()


@functools.cache
def _cpu_flags() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith(("flags", "Features")):
                return line
    except OSError:
        pass
    if sys.platform == "darwin":
        try:
            return subprocess.run(["sysctl", "-n", "machdep.cpu.brand_string", "hw.optional.arm64"],
                                  capture_output=True, text=True, timeout=5).stdout
        except (OSError, subprocess.SubprocessError):
            pass
    return platform.processor()


def host_level() -> str:
    """``avx512``, ``avx2``, ``neon`` or ``scalar``: the best level this CPU runs."""
    machine = platform.machine().lower()
    if machine in _ARM:
        return "neon"
    if machine not in _X86:
        return "scalar"
    have = set(_cpu_flags().split())
    if {"avx512f", "avx512bw", "avx512vl", "avx512dq"} <= have:
        return "avx512"
    if {"avx2", "fma", "f16c", "bmi2"} <= have:
        return "avx2"
    return "scalar"


def build_level() -> str:
    """The level the kernels are built for: ``RAM_LIVE_SIMD`` where the host runs it, else :func:`host_level`."""
    host, wanted = host_level(), settings.simd_level()
    if wanted == "auto" or wanted == host:
        return host
    runnable = wanted == "scalar" or (wanted == "avx2" and host == "avx512")
    return wanted if runnable else host


def flags(level: str | None = None) -> tuple[str, ...]:
    """The compiler flags of ``level`` (default :func:`build_level`)."""
    level = level or build_level()
    arch = {"avx512": ("-march=native",) if host_level() == "avx512" else ("-march=x86-64-v4",),
            "avx2": ("-march=x86-64-v3", "-mtune=native") if is_x86() else (),
            "neon": ("-march=armv8-a",),
            "scalar": ("-march=x86-64",) if is_x86() else ()}[level]
    return COMMON_FLAGS + arch


def source(name: str) -> Path:
    """The path of ``csrc/<name>``."""
    return CSRC / name


def _headers() -> str:
    return "\0".join(p.name + "\0" + p.read_text() for p in sorted(CSRC.glob("*.h")))


def _build(source: str | Path, name: str, build_flags: list[str]) -> Path | None:
    compiler = shutil.which(os.environ.get("CC", "cc"))
    if compiler is None:
        return None
    text = source.read_text() if isinstance(source, Path) else source
    tag = hashlib.sha256("\0".join([text, _headers(), *build_flags, compiler, _cpu_flags()]).encode()).hexdigest()
    target = cache_dir() / f"{name}-{tag[:16]}.so"
    if target.exists():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="ram_live_build_") as tmp:
        src = Path(tmp) / f"{name}.c"
        src.write_text(text)
        out = Path(tmp) / f"{name}.so"
        subprocess.run([compiler, *build_flags, f"-I{CSRC}", "-shared", "-fPIC", "-o", str(out), str(src)],
                       check=True, capture_output=True, timeout=120)
        staged = target.with_name(f".{target.name}.{uuid.uuid4().hex[:8]}")
        shutil.copyfile(out, staged)
        os.replace(staged, target)
    return target


def load_library(source: str | Path, name: str, build_flags: list[str] | tuple[str, ...] | None = None
                 ) -> ctypes.CDLL | None:
    """``source`` (a file, e.g. :func:`source` ``("ram.c")``, or C text) compiled with ``build_flags`` (default
    :func:`flags`; built on first use, then cached), or None where native kernels are off, there is no C
    compiler, or the build fails."""
    if not native_enabled():
        return None
    try:
        path = _build(source, name, list(flags() if build_flags is None else build_flags))
        return None if path is None else ctypes.CDLL(str(path))
    except (OSError, subprocess.SubprocessError):
        return None
