"""``compile=``: whether a merge runs the ``torch.compile`` kernels (:func:`resolve_compile`), and a check that the
toolchain builds them before anything is written (:func:`compiler_works`)."""

from __future__ import annotations

import functools
import importlib.util
import os
import shutil
import warnings
from typing import Any

import torch

from ..kernels import cc

from ..kernels import ram as ram_native
from .. import functional as F
from ..errors import ConfigError

__all__ = ["COMPILE_AUTO_MIN", "build_key", "compiler_available", "resolve_compile", "compiler_works"]

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


def resolve_compile(compile: bool | str, device: torch.device, agent_entries: int) -> bool:
    """``compile`` of :func:`ram_live.merge` as a decision. ``"auto"``, by what the host has:

    * fewer than :data:`COMPILE_AUTO_MIN` agent-entries: never (the compile would cost more than it saves);
    * CPU with the native kernels built at a vector level (AVX-512, AVX2 or NEON: ``ram_live.kernels.cc.build_level``):
      never, the native kernels run at a few times the copy floor, faster than inductor's code, and there is
      nothing to compile per process;
    * otherwise (GPUs; CPUs without native kernels, or with only the baseline ``scalar`` build, where inductor
      generates code for the CPU's own instructions): compile where a toolchain is available.

    Example:
        >>> resolve_compile("auto", torch.device("cpu"), 10)
        False
    """
    if isinstance(compile, bool):
        return compile
    if compile != "auto":
        raise ConfigError(f"compile must be True, False or 'auto', got {compile!r}")
    if agent_entries < COMPILE_AUTO_MIN:
        return False
    if device.type == "cpu" and ram_native.kernels() is not None and cc.build_level() != "scalar":
        return False
    return compiler_available(device.type)


def build_key(scaled: bool, sign: bool) -> Any:
    """Which compiled RAM build a merge takes, beside its agent count (:func:`ram_live.functional.compiled`'s
    ``key``): with or without λ, and the ``shared="sign"`` rule (the plain builds keep their earlier keys)."""
    return (not scaled, "sign") if sign else not scaled


def compiler_works(device: torch.device, k: int, weighted: bool, importance: bool = False, sign: bool = False
                   ) -> bool:
    """Build (or load from the cache) the dynamic-shape RAM kernel on a tiny input, so that a missing or broken
    toolchain falls back to the eager path with a warning before anything is written."""
    try:
        zeros = torch.zeros(3, device=device)
        lambdas = torch.ones(k, device=device) if weighted else None
        key = (k, build_key(weighted, sign))
        F.compiled(F.ram_fused_, key=key)(zeros.clone(), zeros, [zeros] * k, lambdas, 0.0, sign)
        if importance:
            F.compiled(F.ram_fused_weighted_, key=key)(zeros.clone(), zeros, [zeros] * k, [zeros] * k, lambdas,
                                                       0.0, sign)
        return True
    except Exception as exc:  # noqa: BLE001 - any failure of the toolchain means "merge eagerly"
        warnings.warn(f"torch.compile failed on {device} ({type(exc).__name__}: {str(exc)[:200]}); merging with "
                      "the eager kernels instead (same results, slower)", RuntimeWarning, stacklevel=3)
        return False
