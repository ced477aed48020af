"""``compile=``: whether a merge runs a method's ``torch.compile`` kernels (:func:`resolve_compile`), a check that
the toolchain builds them before anything is written (:func:`compiler_works`), and the one cache of compiled
builds (:func:`compiled`)."""

from __future__ import annotations

import functools
import importlib.util
import os
import shutil
import types
import warnings
from typing import Any

import torch

from ..errors import ConfigError
from ..methods.base import MethodKernels

__all__ = ["COMPILE_AUTO_MIN", "compiled", "compiler_available", "resolve_compile", "compiler_works"]

#: ``compile="auto"`` compiles merges of at least this many agent-entries (Σ numel × K): compiling costs seconds
#: (a warm cache) to tens of seconds (cold) once per process, which smaller merges do not win back.
COMPILE_AUTO_MIN = 4 << 30


@functools.cache
def compiler_available(device_type: str) -> bool:
    """Whether ``torch.compile`` can build kernels for this device type here: a C++ compiler on CPU, Triton on
    CUDA/XPU; never elsewhere."""
    if device_type == "cpu":
        return any(shutil.which(c) for c in (os.environ.get("CXX", ""), "g++", "c++", "clang++") if c)
    if device_type in ("cuda", "xpu"):
        return importlib.util.find_spec("triton") is not None
    return False


def resolve_compile(
    compile: bool | str, device: torch.device, agent_entries: int, kernels: MethodKernels | None = None
) -> bool:
    """``compile`` of :func:`ram_live.merge` as a decision (``kernels``: the method's fast paths). ``"auto"``, by
    what the host has:

    * a method with no compiled kernels (no ``warm_up``), or fewer than :data:`COMPILE_AUTO_MIN` agent-entries:
      never (the compile would cost more than it saves);
    * CPU where the method's native kernels are built at a vector level (``kernels.native()``; AVX-512, AVX2 or
      NEON): never, they run at a few times the copy floor, faster than inductor's code;
    * a device where the method's fused device kernels merge (``kernels.device``; RAM's family on GPUs): never,
      whatever ``compile`` says (they are the one mechanism there);
    * otherwise (GPUs; CPUs without native kernels, or with only the baseline ``scalar`` build, where inductor
      generates code for the CPU's own instructions): compile where a toolchain is available.

    Example:
        >>> resolve_compile("auto", torch.device("cpu"), 10)
        False
    """
    if kernels is not None and kernels.device is not None and kernels.device(device):
        if compile not in (True, False, "auto"):
            raise ConfigError(f"compile must be True, False or 'auto', got {compile!r}")
        return False  # the method's fused device kernels merge there: nothing to compile
    if isinstance(compile, bool):
        return compile
    if compile != "auto":
        raise ConfigError(f"compile must be True, False or 'auto', got {compile!r}")
    if kernels is None or kernels.warm_up is None or agent_entries < COMPILE_AUTO_MIN:
        return False
    if device.type == "cpu" and kernels.native is not None and kernels.native():
        return False
    return compiler_available(device.type)


def compiler_works(kernels: MethodKernels | None, device: torch.device, k: int, auxiliary: bool) -> bool:
    """Build (or load from the cache) the method's compiled kernels on a tiny input (``kernels.warm_up``), so that
    a missing or broken toolchain falls back to the eager path with a warning before anything is written; False
    for a method that declares none (TIES, DARE, task arithmetic, linear: they merge, and count, eagerly)."""
    if kernels is None or kernels.warm_up is None:
        return False
    try:
        kernels.warm_up(device, k, auxiliary)
        return True
    except Exception as exc:  # noqa: BLE001 - any failure of the toolchain means "merge eagerly"
        warnings.warn(
            f"torch.compile failed on {device} ({type(exc).__name__}: {str(exc)[:200]}); merging with "
            "the eager kernels instead (same results, slower)",
            RuntimeWarning,
            stacklevel=3,
        )
        return False


_COMPILED: dict[tuple[str, bool, Any], Any] = {}


def compiled(kernel: Any, static: bool = False, key: Any = None) -> Any:
    """``kernel`` (a method's fused expression, or :func:`~ram_live.functional.counting.ram_counts_fused`) compiled
    once per process and per ``key``.

    ``static=True`` specialises on the chunk's length (the engine's full chunks: reductions then run several
    times faster); the dynamic-shape build takes each tensor's last, shorter chunk. Callers key builds (RAM: by
    the number of agents, whether λ is given and the shared rule). Each build compiles a private copy of the
    function: Dynamo caches graphs per code object, so builds of one function would share, evict and (past its
    recompile limit) silently drop each other's graphs.
    """
    name = (kernel.__name__, static, key)
    if name not in _COMPILED:
        private = types.FunctionType(
            kernel.__code__.replace(), kernel.__globals__, kernel.__name__, kernel.__defaults__, kernel.__closure__
        )
        _COMPILED[name] = torch.compile(private, dynamic=not static)
    return _COMPILED[name]
