"""Build a small C source into a shared library once per machine and load it with ``ctypes``.

The library lands in ``$RAM_LIVE_CACHE`` (default ``~/.cache/ram_live``) under a name hashed from the source,
the flags, the compiler and the CPU's feature flags (a cache shared by machines of different CPUs never hands one
a library built for another's instructions). Built in a temporary folder and renamed into place, so processes
that build at once agree. ``RAM_LIVE_NATIVE=0`` turns every native kernel off (the torch paths then run).
"""

from __future__ import annotations

import ctypes
import hashlib
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import uuid
from pathlib import Path

__all__ = ["native_enabled", "cache_dir", "load_library"]


def native_enabled() -> bool:
    """Native kernels are tried on x86-64 Linux unless ``RAM_LIVE_NATIVE=0``."""
    return (os.environ.get("RAM_LIVE_NATIVE", "1") != "0" and sys.platform.startswith("linux")
            and platform.machine() == "x86_64")


def cache_dir() -> Path:
    if os.environ.get("RAM_LIVE_CACHE"):
        return Path(os.environ["RAM_LIVE_CACHE"])
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "ram_live"


def _cpu_flags() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("flags"):
                return line
    except OSError:
        pass
    return platform.processor()


def _build(source: str, name: str, flags: list[str]) -> Path | None:
    compiler = shutil.which(os.environ.get("CC", "cc"))
    if compiler is None:
        return None
    tag = hashlib.sha256("\0".join([source, *flags, compiler, _cpu_flags()]).encode()).hexdigest()[:16]
    target = cache_dir() / f"{name}-{tag}.so"
    if target.exists():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="ram_live_build_") as tmp:
        src = Path(tmp) / f"{name}.c"
        src.write_text(source)
        out = Path(tmp) / f"{name}.so"
        subprocess.run([compiler, *flags, "-shared", "-fPIC", "-o", str(out), str(src)], check=True,
                       capture_output=True, timeout=120)
        staged = target.with_name(f".{target.name}.{uuid.uuid4().hex[:8]}")
        shutil.copyfile(out, staged)
        os.replace(staged, target)
    return target


def load_library(source: str, name: str, flags: list[str]) -> ctypes.CDLL | None:
    """``source`` compiled with ``flags`` (built on first use, then cached), or None where native kernels are
    off, there is no C compiler, or the build fails."""
    if not native_enabled():
        return None
    try:
        path = _build(source, name, flags)
        return None if path is None else ctypes.CDLL(str(path))
    except (OSError, subprocess.SubprocessError):
        return None
