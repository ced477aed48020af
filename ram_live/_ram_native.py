"""Native CPU kernels for RAM: the merge (θ* of a range, written in the output's dtype) and the statistics
(per-agent active and unique counts), one pass over the K + 1 inputs each.

The same float32 operations in the same order as :class:`ram_live.functional.RamAccumulator` and
:class:`~ram_live.functional.RamCounter` (τ = θ_t − θ₀; ``hardshrink``'s rule; Σ −τ; the mean over active agents
or λ·τ where one agent is active; θ₀ − that), compiled without contraction into FMAs, so both give the same bits
(tested); bfloat16 outputs round to nearest even as torch does. Blocks of 512 entries stay in L1, so each input
is read from memory once and the loops vectorise (``-O3 -march=native``). The engine runs ranges of a tensor in
threads (the calls release the GIL). Float32 and bfloat16 only, all inputs of one dtype, at most 64 agents; the
torch paths take everything else. :func:`kernels` is None without a C compiler or with ``RAM_LIVE_NATIVE=0``.
"""

from __future__ import annotations

import ctypes
from dataclasses import dataclass
from typing import Any, Sequence

import torch
from torch import Tensor

from ._cc import load_library

MAX_AGENTS = 64
DTYPES = {torch.float32: 0, torch.bfloat16: 1}

_SOURCE = r"""
#include <stdint.h>
#include <string.h>

#define BLOCK 512
#define MAX_AGENTS 64

/* dtype codes: 0 float32, 1 bfloat16 */
static inline void load(int dtype, const void *src, int64_t start, float *restrict dst, int n) {
    if (dtype == 1) {
        const uint16_t *s = (const uint16_t *)src + start;
        uint32_t *d = (uint32_t *)dst;
        for (int i = 0; i < n; i++) d[i] = (uint32_t)s[i] << 16;
    } else {
        memcpy(dst, (const float *)src + start, (size_t)n * sizeof(float));
    }
}

/* float32 -> bfloat16, round to nearest even; NaN -> 0x7FC0 (c10's round_to_nearest_even) */
static inline void store(int dtype, void *dst, int64_t start, const float *restrict src, int n) {
    if (dtype == 1) {
        uint16_t *d = (uint16_t *)dst + start;
        const uint32_t *s = (const uint32_t *)src;
        for (int i = 0; i < n; i++) {
            uint32_t u = s[i];
            uint32_t r = (u + 0x7FFFu + ((u >> 16) & 1u)) >> 16;
            d[i] = ((u & 0x7FFFFFFFu) > 0x7F800000u) ? (uint16_t)0x7FC0u : (uint16_t)r;
        }
    } else {
        memcpy((float *)dst + start, src, (size_t)n * sizeof(float));
    }
}

static inline int nonfinite(float x) {
    uint32_t u;
    memcpy(&u, &x, sizeof u);
    return (u & 0x7F800000u) == 0x7F800000u;
}

/* theta* over [start, end) into out; lambdas NULL: RAM. Returns the number of non-finite results. */
int64_t ram_merge(int in_dtype, int out_dtype, const void *base, const void *const *agents, int k,
                  const float *lambdas, float eps, void *out, int64_t start, int64_t end) {
    float b[BLOCK] __attribute__((aligned(64))), a[BLOCK] __attribute__((aligned(64)));
    float ns[BLOCK] __attribute__((aligned(64))), cnt[BLOCK] __attribute__((aligned(64)));
    float lam[BLOCK] __attribute__((aligned(64)));
    int64_t bad = 0;
    for (int64_t s = start; s < end; s += BLOCK) {
        int n = (int)(end - s < BLOCK ? end - s : BLOCK);
        load(in_dtype, base, s, b, n);
        for (int i = 0; i < n; i++) { ns[i] = 0.0f; cnt[i] = 0.0f; lam[i] = 0.0f; }
        for (int t = 0; t < k; t++) {
            load(in_dtype, agents[t], s, a, n);
            const float lt = lambdas ? lambdas[t] : 0.0f;
            if (eps > 0.0f)
                for (int i = 0; i < n; i++) { float d = a[i] - b[i]; a[i] = (d >= -eps && d <= eps) ? 0.0f : d; }
            else
                for (int i = 0; i < n; i++) a[i] = a[i] - b[i];
            for (int i = 0; i < n; i++) {
                float m = (a[i] != 0.0f) ? 1.0f : 0.0f;
                ns[i] = ns[i] - a[i];
                cnt[i] = cnt[i] + m;
                lam[i] = lam[i] + m * lt;
            }
        }
        int64_t nb = 0;
        if (lambdas)
            for (int i = 0; i < n; i++) {
                float mean = ns[i] / (cnt[i] < 1.0f ? 1.0f : cnt[i]);
                float v = b[i] - (cnt[i] == 1.0f ? ns[i] * lam[i] : mean);
                nb += nonfinite(v);
                a[i] = v;
            }
        else
            for (int i = 0; i < n; i++) {
                float v = b[i] - ns[i] / (cnt[i] < 1.0f ? 1.0f : cnt[i]);
                nb += nonfinite(v);
                a[i] = v;
            }
        bad += nb;
        store(out_dtype, out, s, a, n);
    }
    return bad;
}

/* Per agent, active and unique entries over [start, end), added to active[] and unique[]. Returns the number
   of non-finite task-vector entries. */
int64_t ram_counts(int dtype, const void *base, const void *const *agents, int k, float eps, int64_t start,
                   int64_t end, int64_t *active, int64_t *unique) {
    float b[BLOCK] __attribute__((aligned(64))), a[BLOCK] __attribute__((aligned(64)));
    float cnt[BLOCK] __attribute__((aligned(64)));
    uint8_t m[MAX_AGENTS][BLOCK] __attribute__((aligned(64)));
    int64_t bad = 0;
    for (int64_t s = start; s < end; s += BLOCK) {
        int n = (int)(end - s < BLOCK ? end - s : BLOCK);
        load(dtype, base, s, b, n);
        for (int i = 0; i < n; i++) cnt[i] = 0.0f;
        for (int t = 0; t < k; t++) {
            load(dtype, agents[t], s, a, n);
            int64_t nb = 0;
            uint8_t *mt = m[t];
            if (eps > 0.0f)
                for (int i = 0; i < n; i++) { float d = a[i] - b[i]; a[i] = (d >= -eps && d <= eps) ? 0.0f : d; }
            else
                for (int i = 0; i < n; i++) a[i] = a[i] - b[i];
            for (int i = 0; i < n; i++) {
                nb += nonfinite(a[i]);
                mt[i] = a[i] != 0.0f;
                cnt[i] = cnt[i] + (a[i] != 0.0f ? 1.0f : 0.0f);
            }
            bad += nb;
        }
        for (int t = 0; t < k; t++) {
            const uint8_t *mt = m[t];
            int32_t act = 0, uni = 0;
            for (int i = 0; i < n; i++) {
                act += mt[i];
                uni += mt[i] & (cnt[i] == 1.0f);
            }
            active[t] += act;
            unique[t] += uni;
        }
    }
    return bad;
}
"""

_FLAGS = ["-O3", "-march=native", "-ffp-contract=off", "-fno-strict-aliasing", "-fno-math-errno"]


@dataclass
class Kernels:
    lib: Any

    def merge(self, out: Tensor, base: Tensor, agents: Sequence[Tensor], lambdas: Tensor | None, eps: float,
              start: int, end: int) -> int:
        """θ* of flat entries ``[start, end)`` of ``base``/``agents`` into ``out`` (flat, same length);
        ``lambdas``: float32 λ per agent (RAM+) or None. Returns how many results are not finite."""
        ptrs = (ctypes.c_void_p * len(agents))(*(a.data_ptr() for a in agents))
        lam = None if lambdas is None else ctypes.c_void_p(lambdas.data_ptr())
        return int(self.lib.ram_merge(DTYPES[base.dtype], DTYPES[out.dtype], base.data_ptr(), ptrs, len(agents),
                                      lam, eps, out.data_ptr(), start, end))

    def counts(self, base: Tensor, agents: Sequence[Tensor], eps: float, start: int, end: int, active: Tensor,
               unique: Tensor) -> int:
        """Add the active/unique counts of ``[start, end)`` to ``active``/``unique`` (int64, one per agent).
        Returns how many task-vector entries are not finite."""
        ptrs = (ctypes.c_void_p * len(agents))(*(a.data_ptr() for a in agents))
        return int(self.lib.ram_counts(DTYPES[base.dtype], base.data_ptr(), ptrs, len(agents), eps, start, end,
                                       active.data_ptr(), unique.data_ptr()))


def supports(out: Tensor | None, base: Tensor, agents: Sequence[Tensor]) -> bool:
    """Whether the kernels take these flat tensors: CPU, contiguous, one input dtype of float32/bfloat16, an
    output of either, at most :data:`MAX_AGENTS` agents."""
    tensors = [base, *agents] + ([] if out is None else [out])
    return (base.dtype in DTYPES and 0 < len(agents) <= MAX_AGENTS
            and all(t.device.type == "cpu" and t.is_contiguous() for t in tensors)
            and all(a.dtype == base.dtype for a in agents) and (out is None or out.dtype in DTYPES))


_KERNELS: Kernels | None | bool = False


def kernels() -> Kernels | None:
    """The compiled kernels, built on first use (once per machine); None where they cannot be."""
    global _KERNELS
    if _KERNELS is False:
        lib = load_library(_SOURCE, "ram", _FLAGS)
        if lib is not None:
            ptr, i64, i32, f32 = ctypes.c_void_p, ctypes.c_int64, ctypes.c_int, ctypes.c_float
            lib.ram_merge.argtypes = [i32, i32, ptr, ptr, i32, ptr, f32, ptr, i64, i64]
            lib.ram_merge.restype = i64
            lib.ram_counts.argtypes = [i32, ptr, ptr, i32, f32, i64, i64, ptr, ptr]
            lib.ram_counts.restype = i64
        _KERNELS = None if lib is None else Kernels(lib)
    return _KERNELS
