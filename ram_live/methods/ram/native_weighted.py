"""Native CPU kernel of curvature-aware RAM: :mod:`ram_live.methods.ram.native`'s merge with the shared entries' mean
weighted by each agent's importances, which are read chunk by chunk beside the agents (one more input each, no
scratch: the extra memory stays that of the plain merge).

The operations and their order are :class:`~.accumulators.WeightedRamAccumulator`'s (an online maximum M of
the active agents' importances; S = −Σ w·τ, W = Σ w with w = h / M, rescaled by M_old / M_new when the maximum
grows; w = 1 where M = 0), compiled without contraction into FMAs, so both give the same bits (tested). The
kernel also counts importances that are negative, NaN or Inf (with the non-finite results: the engine then names
the culprit). AVX-512 (F, BW, DQ) where the CPU has it, for 1 to 4 agents unrolled; portable loops over blocks
of 512 entries elsewhere. Agents float32 or bfloat16 (one dtype), importances float32 or bfloat16 (one dtype,
either), output float32 or bfloat16; the torch paths take everything else. Built in parts, one per pair of input
and importance dtypes, each when a merge first needs it (:mod:`ram_live.kernels.cc`). :func:`kernels` is None without a
C compiler or with ``RAM_LIVE_NATIVE=0``.
"""

from __future__ import annotations

import ctypes
from dataclasses import dataclass, field
from typing import Any, Sequence

import torch
from torch import Tensor

from ...kernels import cc
from ...kernels.layout import DTYPES, FLAGS, MAX_AGENTS

__all__ = ["Kernels", "FLAGS", "build", "kernels", "supports"]


_P, _I64, _I32, _F32 = ctypes.c_void_p, ctypes.c_int64, ctypes.c_int, ctypes.c_float
#: ram_weighted.c's parts (its RAM_PART numbers) by (input, importance) dtype codes (:data:`DTYPES`): each a library
#: of its own, built on its first call; part 0 (``ram_weighted_simd_bits`` alone) is :func:`build`'s check.
PARTS = {(1, 1): 1, (1, 0): 2, (0, 1): 3, (0, 0): 4}
_SIGNATURE = [_I32, _P, _P, _P, _I32, _P, _F32, _P, _I64, _I64, _I32]
_NAMES = {0: "f32", 1: "bf16"}


@dataclass
class Kernels:
    """The kernel of one build: ``flags``, and ``simd_bits``, 512 where the AVX-512 kernel runs, 0 where the
    portable loops do."""

    flags: tuple[str, ...]
    simd_bits: int
    _functions: dict = field(default_factory=dict, repr=False, compare=False)

    def _fn(self, in_dtype: int, imp_dtype: int) -> Any:
        fn = self._functions.get((in_dtype, imp_dtype))
        if fn is None:
            name = f"ram_merge_weighted_{_NAMES[in_dtype]}_{_NAMES[imp_dtype]}"
            fn = cc.function("ram_weighted", PARTS[in_dtype, imp_dtype], name, self.flags, _SIGNATURE, _I64)
            self._functions[(in_dtype, imp_dtype)] = fn
        return fn

    def ready(self, dtype: torch.dtype, importance_dtype: torch.dtype) -> bool:
        """Whether the part for these input and importance dtypes is built (building it now); False where it does
        not build: the caller runs another path, before anything of the tensor is written."""
        return cc.builds(lambda: self._fn(DTYPES[dtype], DTYPES[importance_dtype]))

    def merge_weighted(
        self,
        out: Tensor,
        base: Tensor,
        agents: Sequence[Tensor],
        importances: Sequence[Tensor],
        lambdas: Tensor | None,
        eps: float,
        start: int,
        end: int,
        sign: bool = False,
    ) -> int:
        """θ* of flat entries ``[start, end)`` into ``out`` with the shared entries' mean weighted by
        ``importances`` (flat, one per agent); ``lambdas``: float32 λ per agent or None; ``sign``: RAM's
        ``shared="sign"`` (:class:`~.accumulators.WeightedRamAccumulator`'s ``sign``). Returns the number
        of non-finite results plus a positive count where some importance is negative, NaN or Inf (0: all
        valid)."""
        k = len(agents)
        ptrs = (ctypes.c_void_p * k)(*(a.data_ptr() for a in agents))
        imps = (ctypes.c_void_p * k)(*(h.data_ptr() for h in importances))
        lam = None if lambdas is None else ctypes.c_void_p(lambdas.data_ptr())
        fn = self._fn(DTYPES[base.dtype], DTYPES[importances[0].dtype])
        return int(
            fn(DTYPES[out.dtype], base.data_ptr(), ptrs, imps, k, lam, eps, out.data_ptr(), start, end, int(sign))
        )


def supports(base: Tensor, importances: Sequence[Tensor]) -> bool:
    """Whether the kernel takes these importances (the agents and output are
    :func:`ram_live.kernels.layout.supports`' business): CPU, contiguous, as long as the base, one dtype of
    float32/bfloat16."""
    return (
        0 < len(importances) <= MAX_AGENTS
        and importances[0].dtype in DTYPES
        and all(
            h.device.type == "cpu"
            and h.is_contiguous()
            and h.numel() == base.numel()
            and h.dtype == importances[0].dtype
            for h in importances
        )
    )


#: Tests' seam: None forces the torch paths, False (the default) leaves :func:`kernels` to the shared loader.
_KERNELS: Kernels | None | bool = False


def build(flags: Sequence[str] | None = None) -> Kernels | None:
    """The kernel compiled with ``flags`` (default: this host's build level; each part built on first use, once
    per machine, loaded once per process), or None where it cannot be built."""
    return cc.bind("ram_weighted", _bind, flags)


def _bind(lib: Any, flags: tuple[str, ...]) -> Kernels:
    lib.ram_weighted_simd_bits.restype = ctypes.c_int
    return Kernels(flags, int(lib.ram_weighted_simd_bits()))


def kernels() -> Kernels | None:
    """The compiled kernel of this host's level, built on first use (once per machine); None where it cannot be
    or ``RAM_LIVE_NATIVE=0``."""
    return cc.kernels("ram_weighted", _bind) if _KERNELS is False else _KERNELS
