"""Native CPU kernels for RAM: the merge (θ* of a range, written in the output's dtype) and the statistics
(per-agent active and unique counts), one pass over the K + 1 inputs each; and RAM+ in one read
(:meth:`Kernels.merge_unscaled`, which merges as RAM while counting and records who alone changed what, then
:meth:`Kernels.rescale`, which applies λ there once the counts are in).

The same float32 operations in the same order as :class:`ram_live.methods.ram.accumulators.RamAccumulator` and
:class:`~ram_live.functional.RamCounter` (τ = θ_t − θ₀; ``hardshrink``'s rule; Σ −τ; the mean over active agents
or λ·τ where one agent is active; θ₀ − that), compiled without contraction into FMAs, so both give the same bits
(tested); bfloat16 outputs round to nearest even as torch does. On CPUs with AVX-512 (F, BW, DQ) 32 entries of
every input sit in registers at once (activity is one compare into a mask, the counts are popcounts); elsewhere
the portable vector loops of ``csrc/ram_vec.h`` (AVX2, NEON, SSE from one source). Both are compiled once per
agent count up to 8 (unrolled, their masks in registers), so the source is large: :mod:`ram_live.kernels.cc` builds it
in parts side by side, once per machine, and only when a merge first needs it. The engine runs ranges of a
tensor in threads (the calls release the GIL). Float32 and bfloat16 only, all inputs of one dtype, at most 32
agents; the torch paths take everything else. :func:`kernels` is None without a C compiler or with
``RAM_LIVE_NATIVE=0``.
"""

from __future__ import annotations

import ctypes
from dataclasses import dataclass, field
from typing import Any, Sequence

import torch
from torch import Tensor

from ...kernels import cc
from ...kernels.layout import DTYPES, FLAGS, MAX_AGENTS, supports

__all__ = [
    "DTYPES",
    "FLAGS",
    "MAX_AGENTS",
    "MAX_UNSCALED_AGENTS",
    "Kernels",
    "build",
    "kernels",
    "plane_count",
    "planes_numel",
    "supports",
]

#: Most agents :meth:`Kernels.merge_unscaled` takes (owner + 1 in at most 5 planes).
MAX_UNSCALED_AGENTS = 31


_P, _I64, _I32, _F32 = ctypes.c_void_p, ctypes.c_int64, ctypes.c_int, ctypes.c_float
#: ram.c's parts (its RAM_PART numbers) by entry point and input dtype code (:data:`DTYPES`): each a library of
#: its own, built on its first call; part 0 (``ram_simd_bits`` alone) is :func:`build`'s check that the compiler
#: takes the source and these flags.
PARTS = {"merge": (2, 1), "merge_unscaled": (4, 3), "counts": (6, 5), "rescale": (8, 7)}
_SIGNATURES = {
    "merge": [_I32, _P, _P, _I32, _P, _F32, _P, _I64, _I64, _I32],
    "merge_unscaled": [_P, _P, _I32, _F32, _P, _I64, _I64, _P, _I32, _P, _P],
    "counts": [_P, _P, _I32, _F32, _I64, _I64, _P, _P, _P],
    "rescale": [_P, _P, _P, _I32, _P, _I32, _I64, _I64],
}
#: What a call of an entry point needs next (for the same input dtype): built in the background meanwhile.
_NEXT = {"merge_unscaled": "rescale"}


@dataclass
class Kernels:
    """The kernels of one build: ``flags``, and ``simd_bits``, 512 where the AVX-512 (F, BW, DQ) kernels run, 0
    where the portable loops do."""

    flags: tuple[str, ...]
    simd_bits: int
    _functions: dict = field(default_factory=dict, repr=False, compare=False)

    def _fn(self, entry: str, dtype: int) -> Any:
        fn = self._functions.get((entry, dtype))
        if fn is None:
            if entry in _NEXT:
                cc.prefetch("ram", PARTS[_NEXT[entry]][dtype], self.flags)
            fn = cc.function(
                "ram",
                PARTS[entry][dtype],
                f"ram_{entry}_{'bf16' if dtype else 'f32'}",
                self.flags,
                _SIGNATURES[entry],
                _I64,
            )
            self._functions[(entry, dtype)] = fn
        return fn

    def ready(self, dtype: torch.dtype, *entries: str) -> bool:
        """Whether the parts of ``entries`` for ``dtype`` inputs are built (building them now); False where one
        does not build (a killed or timed-out compiler, a full cache disk): the caller runs the torch path, before
        anything of the tensor is written."""
        return cc.builds(lambda: [self._fn(entry, DTYPES[dtype]) for entry in entries])

    def merge(
        self,
        out: Tensor,
        base: Tensor,
        agents: Sequence[Tensor],
        lambdas: Tensor | None,
        eps: float,
        start: int,
        end: int,
        sign: bool = False,
    ) -> int:
        """θ* of flat entries ``[start, end)`` of ``base``/``agents`` into ``out`` (flat, same length);
        ``lambdas``: float32 λ per agent (RAM+) or None; ``sign``: RAM's ``shared="sign"``
        (:class:`~.accumulators.RamAccumulator`'s ``sign``). Returns how many results are not finite."""
        ptrs = (ctypes.c_void_p * len(agents))(*(a.data_ptr() for a in agents))
        lam = None if lambdas is None else ctypes.c_void_p(lambdas.data_ptr())
        return int(
            self._fn("merge", DTYPES[base.dtype])(
                DTYPES[out.dtype], base.data_ptr(), ptrs, len(agents), lam, eps, out.data_ptr(), start, end, int(sign)
            )
        )

    def merge_unscaled(
        self,
        out: Tensor,
        base: Tensor,
        agents: Sequence[Tensor],
        eps: float,
        start: int,
        end: int,
        planes: Tensor,
        active: Tensor,
        unique: Tensor,
    ) -> int:
        """RAM+'s merge before λ, in the same read as its counts: the RAM result of ``[start, end)`` where two or
        more agents are active, an agent's own value where it alone is (``out`` has the inputs' dtype), its
        index + 1 in the owner ``planes`` (int32, :func:`plane_count` words per 32 entries; ``start`` a multiple
        of 32), and the active/unique counts added as :meth:`counts` does. Returns how many results are not
        finite. :meth:`rescale` then applies λ."""
        _check_range(start, end)
        ptrs = (ctypes.c_void_p * len(agents))(*(a.data_ptr() for a in agents))
        return int(
            self._fn("merge_unscaled", DTYPES[base.dtype])(
                base.data_ptr(),
                ptrs,
                len(agents),
                eps,
                out.data_ptr(),
                start,
                end,
                planes.data_ptr(),
                plane_count(len(agents)),
                active.data_ptr(),
                unique.data_ptr(),
            )
        )

    def rescale(self, out: Tensor, base: Tensor, planes: Tensor, lambdas: Tensor, start: int, end: int) -> int:
        """θ₀ + λ_t·τ where ``planes`` (of :meth:`merge_unscaled`) name agent t the only active one, in ``out``
        over ``[start, end)`` (``start`` a multiple of 32): the bits of :meth:`merge` with these λ. Returns how
        many results are not finite."""
        _check_range(start, end)
        k = lambdas.numel()
        return int(
            self._fn("rescale", DTYPES[base.dtype])(
                base.data_ptr(), out.data_ptr(), planes.data_ptr(), plane_count(k), lambdas.data_ptr(), k, start, end
            )
        )

    def counts(
        self,
        base: Tensor,
        agents: Sequence[Tensor],
        eps: float,
        start: int,
        end: int,
        active: Tensor,
        unique: Tensor,
        amax: Tensor | None = None,
    ) -> bool:
        """Add the active/unique counts of ``[start, end)`` to ``active``/``unique`` (int64, one per agent);
        ``amax`` (float32, 2 entries, or None): raised to max |τ| and max |base| there. Returns whether some
        task-vector entry is not finite."""
        ptrs = (ctypes.c_void_p * len(agents))(*(a.data_ptr() for a in agents))
        return bool(
            self._fn("counts", DTYPES[base.dtype])(
                base.data_ptr(),
                ptrs,
                len(agents),
                eps,
                start,
                end,
                active.data_ptr(),
                unique.data_ptr(),
                None if amax is None else amax.data_ptr(),
            )
        )


def _check_range(start: int, end: int) -> None:
    if start % 32:  # a group of 32 entries shares its plane words
        raise ValueError(f"range [{start}, {end}): the start must be a multiple of 32")


def plane_count(k: int) -> int:
    """Owner planes of :meth:`Kernels.merge_unscaled` for ``k`` agents: the bits of k + 1 (32-bit words per 32
    entries, so ``plane_count(k) / 8`` bytes per entry: 0.25 for 2–3 agents, 0.5 for 8–15)."""
    return k.bit_length()


def planes_numel(numel: int, k: int) -> int:
    """int32 words of the owner planes of a tensor of ``numel`` entries."""
    return -(-numel // 32) * plane_count(k)


#: Tests' seam: None forces the torch paths, False (the default) leaves :func:`kernels` to the shared loader.
_KERNELS: Kernels | None | bool = False


def build(flags: Sequence[str] | None = None) -> Kernels | None:
    """The kernels compiled with ``flags`` (default: this host's build level, :func:`ram_live.kernels.cc.flags`; each
    part built on first use, once per machine, loaded once per process), or None where they cannot be built."""
    return cc.bind("ram", _bind, flags)


def _bind(lib: Any, flags: tuple[str, ...]) -> Kernels:
    lib.ram_simd_bits.restype = ctypes.c_int
    return Kernels(flags, int(lib.ram_simd_bits()))


def kernels() -> Kernels | None:
    """The compiled kernels of this host's level, built on first use (once per machine); None where they cannot
    be or ``RAM_LIVE_NATIVE=0``."""
    return cc.kernels("ram", _bind) if _KERNELS is False else _KERNELS
