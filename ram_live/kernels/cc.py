"""Build the C sources of ``ram_live/csrc`` into shared libraries once per machine; load them with ``ctypes``.

One loader for every kernel family (:data:`FAMILIES`): :func:`load` gives a family's library (built on first
use, then loaded from the cache; one handle per process), :func:`bind` the object its module wraps it in (one
per process too) and :func:`kernels` the same for the hot path. Each family is built only when a call first
needs it. ``RAM_LIVE_NATIVE=0`` turns every family off at once, at any time (all three return None while it is
set): the one switch tests need.

The flags follow the host's instruction level (:func:`host_level`): x86-64-v4 (AVX-512 F, BW, VL, DQ) →
``-march=native`` (the kernels' AVX-512 loops), x86-64-v3 (AVX2, FMA, F16C, BMI2) → ``-march=x86-64-v3``,
aarch64 → ``-march=armv8-a`` (NEON), anything else → the compiler's baseline. ``RAM_LIVE_SIMD`` (read by
:mod:`ram_live.settings`) forces a lower level, e.g. the AVX2 build on an AVX-512 host. Contraction into FMAs
stays off at every level, so all of them give the same bits.

A large source is built in parts (``ram.c``: each entry point for each input dtype; ``ram_weighted.c``: each pair
of input and importance dtypes; ``-DRAM_PART=n``, the source putting each part's functions under ``#if``), each
a library of its own, built when a call first needs it (:func:`function`), so a first merge compiles only the
code it runs. Every library lands in
:func:`ram_live.settings.cache_dir` under a name hashed from the source and every header of ``csrc`` (their
contents), the flags, the part, the compiler and the CPU's feature flags (a cache shared by machines of
different CPUs never hands one a library built for another's instructions). Built in a temporary folder and
renamed into place, so processes that build at once agree. Native kernels are tried on Linux and macOS, x86-64
and aarch64.

Example:
    >>> from ram_live.kernels import cc
    >>> lib = cc.load("ram")  # None without a C compiler or with RAM_LIVE_NATIVE=0
    >>> lib is None or lib.ram_simd_bits() in (0, 512)
    True
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
import threading
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Sequence, TypeVar

from .. import settings
from ..errors import RamLiveError

__all__ = [
    "COMMON_FLAGS",
    "FAMILIES",
    "Family",
    "KernelBuildError",
    "native_enabled",
    "cache_dir",
    "host_level",
    "build_level",
    "flags",
    "source",
    "load",
    "bind",
    "kernels",
    "function",
    "builds",
    "prefetch",
    "load_library",
    "is_x86",
]

CSRC = Path(__file__).resolve().parent.parent / "csrc"
#: Flags of every build: no FMA contraction (the torch paths' bits), no errno from math functions.
COMMON_FLAGS = ("-O3", "-ffp-contract=off", "-fno-strict-aliasing", "-fno-math-errno")
#: Seconds one compiler process may take.
TIMEOUT = 120
_X86 = ("x86_64", "amd64")
_ARM = ("aarch64", "arm64")
T = TypeVar("T")


class KernelBuildError(RamLiveError, RuntimeError):
    """A part of a native kernel library did not build after its family's first part did (the compiler's
    messages in the text)."""


@dataclass(frozen=True)
class Family:
    """A kernel library: ``source`` in ``csrc``, the ``library`` name of its cached files, ``fixed_flags`` where
    it does not follow the build level (kernels that pick their instructions at run time), ``x86_only``."""

    source: str
    library: str
    fixed_flags: tuple[str, ...] | None = None
    x86_only: bool = False
    #: For a source built in parts (``-DRAM_PART=n``, each a library of its own, built when first needed): the
    #: part :func:`load` and :func:`bind` give, the check that the family builds; None: the whole source.
    entry_part: int | None = None


#: The kernel families, by the name :func:`load` takes.
FAMILIES: dict[str, Family] = {
    "ram": Family("ram.c", "ram", entry_part=0),
    "ram_weighted": Family("ram_weighted.c", "ram_weighted", entry_part=0),
    "probe": Family("probe.c", "ram_probe"),
    "impcodes": Family("impcodes.c", "impcodes"),
    "select": Family("select.c", "select"),
    "crc32": Family("crc32.c", "crc32", ("-O2",), x86_only=True),
}


def is_x86() -> bool:
    return platform.machine().lower() in _X86


def native_enabled() -> bool:
    """Native kernels are tried on Linux and macOS, x86-64 and aarch64, unless ``RAM_LIVE_NATIVE=0``."""
    return (
        settings.native_enabled()
        and sys.platform.startswith(("linux", "darwin"))
        and platform.machine().lower() in _X86 + _ARM
    )


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
            return subprocess.run(
                ["sysctl", "-n", "machdep.cpu.brand_string", "hw.optional.arm64"],
                capture_output=True,
                text=True,
                timeout=5,
            ).stdout
        except (OSError, subprocess.SubprocessError):
            pass
    return platform.processor()


@functools.cache
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
    arch = {
        "avx512": ("-march=native",) if host_level() == "avx512" else ("-march=x86-64-v4",),
        "avx2": ("-march=x86-64-v3", "-mtune=native") if is_x86() else (),
        "neon": ("-march=armv8-a",),
        "scalar": ("-march=x86-64",) if is_x86() else (),
    }[level]
    return COMMON_FLAGS + arch


def source(name: str) -> Path:
    """The path of ``csrc/<name>``."""
    return CSRC / name


# ------------------------------------------------------------------------------------------------ loading

_LOCK = threading.Lock()
_KEY_LOCKS: dict[tuple, threading.Lock] = {}
_HANDLES: dict[tuple, ctypes.CDLL | None] = {}
_ERRORS: dict[tuple, str] = {}
_BOUND: dict[tuple, object] = {}
_QUICK: dict[tuple, object] = {}


def _after_fork() -> None:
    global _LOCK, _KEY_LOCKS  # a lock a build thread held at the fork would stay held in the child
    _LOCK, _KEY_LOCKS = threading.Lock(), {}


os.register_at_fork(after_in_child=_after_fork)


def load(family: str, build_flags: Sequence[str] | None = None, part: int | None = None) -> ctypes.CDLL | None:
    """The library of ``family`` (a key of :data:`FAMILIES`) compiled with ``build_flags`` (default: the
    family's fixed flags, else :func:`flags` of the build level), built on first use and cached on disk, one
    handle per process; None where native kernels are off, there is no C compiler, or the build fails. A
    family built in parts gives its ``part`` (default: its :attr:`Family.entry_part`)."""
    fam = FAMILIES[family]
    if fam.x86_only and not is_x86():
        return None
    chosen = build_flags if build_flags is not None else (fam.fixed_flags or flags())
    return load_library(source(fam.source), fam.library, chosen, fam.entry_part if part is None else part)


def bind(
    family: str, binder: Callable[[ctypes.CDLL, tuple[str, ...]], T | None], build_flags: Sequence[str] | None = None
) -> T | None:
    """``binder(lib, flags)`` of :func:`load` ``(family, build_flags)`` and the flags it was built with (the
    module's typed wrapper: argtypes set, a run-time CPU check), made once per process and library; None where
    :func:`load` gives None or ``binder`` does. Every setting (``RAM_LIVE_NATIVE``, ``RAM_LIVE_SIMD``,
    ``RAM_LIVE_CACHE``, ``CC``) is read at each call."""
    fam = FAMILIES[family]
    chosen = tuple(build_flags if build_flags is not None else (fam.fixed_flags or flags()))
    lib = load(family, chosen)
    if lib is None:
        return None
    key = (binder, id(lib))
    with _LOCK:
        if key not in _BOUND:
            _BOUND[key] = binder(lib, chosen)
        return _BOUND[key]  # type: ignore[return-value]


def kernels(family: str, binder: Callable[[ctypes.CDLL, tuple[str, ...]], T | None]) -> T | None:
    """:func:`bind` ``(family, binder)`` at the build level, for the engines' hot path (asked once per tensor):
    remembered per value of ``RAM_LIVE_NATIVE`` and ``RAM_LIVE_SIMD``, the switches read at each call (the
    compiler and the cache folder only matter to a build, so a library once loaded stays this process's)."""
    quick = (family, binder, settings.native_enabled(), settings.simd_level())
    found = _QUICK.get(quick, _QUICK)
    if found is _QUICK:
        found = _QUICK[quick] = bind(family, binder)
    return found  # type: ignore[return-value]


def function(
    family: str, part: int, name: str, build_flags: Sequence[str], argtypes: list, restype: object
) -> Callable[..., Any]:
    """The C function ``name`` of ``part`` of ``family`` (built now if it is not yet), typed. Raises
    :class:`KernelBuildError` where the part does not build: its family's entry part did, so the caller already
    chose the native path (which ``RAM_LIVE_NATIVE`` switched off since does not undo)."""
    fam = FAMILIES[family]
    key = _key(source(fam.source), fam.library, tuple(build_flags), part)
    lib = _open(key, source(fam.source))
    if lib is None:
        raise KernelBuildError(
            f"part {part} of the native kernels {fam.source} ({name}, flags "
            f"{' '.join(build_flags)}) did not build where part {fam.entry_part} did: "
            f"{_ERRORS.get(key, '')}"
        )
    fn = getattr(lib, name)
    fn.argtypes, fn.restype = argtypes, restype
    return fn


def builds(get_functions: Callable[[], Any]) -> bool:
    """Whether ``get_functions()`` (a binding's look-up of the :func:`function` s a call will run) finds their parts
    built, building them now; False where one does not build, so that the caller takes another path before
    anything of its tensor is written."""
    try:
        get_functions()
    except KernelBuildError:
        return False
    return True


def prefetch(family: str, part: int, build_flags: Sequence[str]) -> None:
    """Start building ``part`` of ``family`` in the background (a call will soon need it; the process waits for
    it at exit, so the cache holds it whole)."""
    threading.Thread(target=load, args=(family, tuple(build_flags), part), name=f"ram_live_cc_{family}_{part}").start()


def load_library(
    source: str | Path, name: str, build_flags: Sequence[str] | None = None, part: int | None = None
) -> ctypes.CDLL | None:
    """``source`` (a file, e.g. :func:`source` ``("ram.c")``, or C text) compiled with ``build_flags`` (default
    :func:`flags`; built on first use, then cached), one handle per process; or None where native kernels are
    off, there is no C compiler, or the build fails. ``part``: only that part of a source built in parts
    (``-DRAM_PART=part``); None: all of it."""
    if not native_enabled():
        return None
    return _open(_key(source, name, tuple(flags() if build_flags is None else build_flags), part), source)


def _open(key: tuple, source: str | Path) -> ctypes.CDLL | None:
    """The library of :func:`_key` ``key``: the handle of this process, else from the cache, else built."""
    name, build_flags, part = key[1], key[2], key[3]
    with _LOCK:
        if key in _HANDLES:
            return _HANDLES[key]
        key_lock = _KEY_LOCKS.setdefault(key, threading.Lock())
    with key_lock:  # one build per library; other libraries build meanwhile
        with _LOCK:
            if key in _HANDLES:
                return _HANDLES[key]
        try:
            path = _build(source, name, list(build_flags), part)
            lib = None if path is None else ctypes.CDLL(str(path))
            if path is None:
                _ERRORS[key] = f"no C compiler {settings.c_compiler()!r}"
        except (OSError, subprocess.SubprocessError) as exc:
            lib = None
            _ERRORS[key] = _message(exc)
        with _LOCK:
            _HANDLES[key] = lib
        return lib


def _key(source: str | Path, name: str, build_flags: tuple[str, ...], part: int | None) -> tuple:
    return (str(source), name, build_flags, part, settings.c_compiler(), str(cache_dir()))


def _message(exc: BaseException) -> str:
    stderr = getattr(exc, "stderr", None)
    text = stderr.decode(errors="replace") if isinstance(stderr, bytes) else str(stderr or "")
    return f"{type(exc).__name__}: {exc}" + (f"\n{text[-2000:]}" if text else "")


# ------------------------------------------------------------------------------------------------ building


def _headers() -> str:
    return "\0".join(p.name + "\0" + p.read_text() for p in sorted(CSRC.glob("*.h")))


def _build(source: str | Path, name: str, build_flags: list[str], part: int | None = None) -> Path | None:
    compiler = shutil.which(settings.c_compiler())
    if compiler is None:
        return None
    text = source.read_text() if isinstance(source, Path) else source
    part_flags = [] if part is None else [f"-DRAM_PART={part}"]
    tag = hashlib.sha256(
        "\0".join([text, _headers(), *build_flags, *part_flags, compiler, _cpu_flags()]).encode()
    ).hexdigest()
    stem = name if part is None else f"{name}.{part}"
    target = cache_dir() / f"{stem}-{tag[:16]}.so"
    if target.exists():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="ram_live_build_") as tmp:
        src = Path(tmp) / f"{name}.c"
        src.write_text(text)
        out = Path(tmp) / f"{stem}.so"
        subprocess.run(
            [compiler, *build_flags, *part_flags, f"-I{CSRC}", "-shared", "-fPIC", "-o", str(out), str(src)],
            check=True,
            capture_output=True,
            timeout=TIMEOUT,
        )
        staged = target.with_name(f".{target.name}.{uuid.uuid4().hex[:8]}")
        shutil.copyfile(out, staged)
        os.replace(staged, target)
    return target
