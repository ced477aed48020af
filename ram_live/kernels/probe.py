"""Native CPU kernel for :func:`ram_live.probe`: one pass over the K + 1 inputs of a range gives what the torch path
counts chunk by chunk (per agent active and unique entries, the pairwise intersections of the activity masks, the
histogram of c = active agents per entry) and the Gram matrix of the raw task vectors τ_t = θ_t − θ₀.

The counts use the merge kernels' rule (active: ``!(|τ| <= eps)``, hardshrink's then τ ≠ 0, with τ in float32 as
torch computes it), so they are the torch path's integers exactly (tested). The Gram matrix is summed per lane in
float32 (FMA) over 4096 entries at a time, then in float64: well within the 1e-6 of ‖τ_i‖·‖τ_j‖ that the cosine
needs (~1e-8 measured on 25 M entries, where the torch path's float32 matmul is ~3e-6 off), not the torch path's
bits. On CPUs with AVX-512 (F, BW, DQ) 64 entries of each agent become one 64-bit mask (counts by popcount, c per
entry in bytes) and τ of a block of 256 entries goes through 4 × 4 register tiles; elsewhere portable loops. Float32
and bfloat16 inputs of one dtype, at most 32 agents (:func:`supports`); :func:`kernel` is None without a C compiler
or with ``RAM_LIVE_NATIVE=0``, and the torch path runs.
"""

from __future__ import annotations

import ctypes
from dataclasses import dataclass
from typing import Any, Sequence

import torch
from torch import Tensor

from . import cc
from .layout import DTYPES, FLAGS, MAX_AGENTS, supports as layout_supports

__all__ = ["MAX_AGENTS", "FLAGS", "ProbeCounts", "Kernel", "build", "kernel", "supports"]


@dataclass
class ProbeCounts:
    """One tensor's counts: per agent ``active`` and ``unique``, the pairwise intersections ``inter`` (k × k,
    ``active`` on the diagonal), the ``histogram`` of c = 0..K (all int64), and ``gram``, Σ τ_i·τ_j of the raw
    task vectors (k × k, float64)."""

    active: Tensor
    unique: Tensor
    inter: Tensor
    histogram: Tensor
    gram: Tensor

    @classmethod
    def zeros(cls, k: int) -> ProbeCounts:
        ints = [torch.zeros(n, dtype=torch.int64) for n in ((k,), (k,), (k, k), (k + 1,))]
        return cls(*ints, torch.zeros(k, k, dtype=torch.float64))

    def add_(self, other: ProbeCounts) -> ProbeCounts:
        for name in ("active", "unique", "inter", "histogram", "gram"):
            getattr(self, name).add_(getattr(other, name))
        return self


@dataclass(frozen=True)
class Kernel:
    """The compiled kernel; ``simd_bits``: 512 where the AVX-512 (F, BW, DQ) loops run, 0 where the portable do."""

    lib: Any
    simd_bits: int

    def probe(
        self, base: Tensor, agents: Sequence[Tensor], eps: float, start: int, end: int, counts: ProbeCounts
    ) -> bool:
        """Add the counts of flat entries ``[start, end)`` of ``base``/``agents`` to ``counts`` (activity: ``|τ| >
        eps``, or τ ≠ 0 with ``eps=0``). Returns whether some task-vector entry is not finite."""
        outputs = (counts.active, counts.unique, counts.inter, counts.histogram, counts.gram)
        agent_ptrs = (ctypes.c_void_p * len(agents))(*(a.data_ptr() for a in agents))
        bad = self.lib.ram_probe(
            DTYPES[base.dtype],
            base.data_ptr(),
            agent_ptrs,
            len(agents),
            eps,
            start,
            end,
            *(t.data_ptr() for t in outputs),
        )
        if bad < 0:
            raise ValueError(f"the probe kernel takes 1 to {MAX_AGENTS} agents, got {len(agents)}")
        return bool(bad)


def supports(base: Tensor, agents: Sequence[Tensor]) -> bool:
    """Whether the kernel takes these flat tensors: CPU, contiguous, one dtype of float32/bfloat16, at most
    :data:`MAX_AGENTS` agents (the merge kernels' rule)."""
    return layout_supports(None, base, agents)


def build(flags: Sequence[str] | None = None) -> Kernel | None:
    """The kernel compiled with ``flags`` (default: this host's build level; built once per machine, loaded once
    per process), or None where it cannot be built."""
    return cc.bind("probe", _bind, flags)


def _bind(lib: Any, flags: tuple[str, ...]) -> Kernel:
    ptr = ctypes.c_void_p
    args = [ctypes.c_int, ptr, ptr, ctypes.c_int, ctypes.c_float, ctypes.c_int64, ctypes.c_int64]
    lib.ram_probe.argtypes, lib.ram_probe.restype = args + [ptr] * 5, ctypes.c_int64
    return Kernel(lib, int(lib.ram_probe_simd_bits()))


def kernel() -> Kernel | None:
    """The kernel of this machine, built on first use; None where it cannot be or ``RAM_LIVE_NATIVE=0`` (the
    torch path then runs)."""
    return cc.kernels("probe", _bind)
