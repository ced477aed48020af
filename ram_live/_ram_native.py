"""Native CPU kernels for RAM: the merge (θ* of a range, written in the output's dtype) and the statistics
(per-agent active and unique counts), one pass over the K + 1 inputs each.

The same float32 operations in the same order as :class:`ram_live.functional.RamAccumulator` and
:class:`~ram_live.functional.RamCounter` (τ = θ_t − θ₀; ``hardshrink``'s rule; Σ −τ; the mean over active agents
or λ·τ where one agent is active; θ₀ − that), compiled without contraction into FMAs, so both give the same bits
(tested); bfloat16 outputs round to nearest even as torch does. Blocks of 512 entries stay in L1, so each input
is read from memory once and the loops vectorise (``-O3 -march=native``). The engine runs ranges of a tensor in
threads (the calls release the GIL). Float32 and bfloat16 only, all inputs of one dtype, at most 32 agents; the
torch paths take everything else. :func:`kernels` is None without a C compiler or with ``RAM_LIVE_NATIVE=0``.
"""

from __future__ import annotations

import ctypes
from dataclasses import dataclass
from typing import Any, Sequence

import torch
from torch import Tensor

from ._cc import load_library

MAX_AGENTS = 32
DTYPES = {torch.float32: 0, torch.bfloat16: 1}

_SOURCE = r"""
#include <stdint.h>
#include <string.h>

#define BLOCK 512
#define MAX_AGENTS 32

static inline float from_f32(float x) { return x; }
static inline float from_bf16(uint16_t x) { uint32_t u = (uint32_t)x << 16; float f; memcpy(&f, &u, 4); return f; }
static inline uint32_t bits(float x) { uint32_t u; memcpy(&u, &x, 4); return u; }
static inline int nonfinite(float x) { return (bits(x) & 0x7F800000u) == 0x7F800000u; }
/* float32 -> bfloat16, round to nearest even; NaN -> 0x7FC0 (c10's round_to_nearest_even) */
static inline uint16_t to_bf16(float x) {
    uint32_t u = bits(x);
    return ((u & 0x7FFFFFFFu) > 0x7F800000u) ? (uint16_t)0x7FC0u : (uint16_t)((u + 0x7FFFu + ((u >> 16) & 1u)) >> 16);
}

/* tau = a - b with hardshrink's rule when eps > 0: (d >= -eps && d <= eps) ? 0 : d (NaN kept) */
#define DELTA(d, av, bv, EPS) float d = (av) - (bv); if (EPS) d = (d >= -eps && d <= eps) ? 0.0f : d;

/* One block of the merge for input type T: ns = sum of -tau, cnt = active agents, lam = lambda of the active. */
#define MERGE_BLOCK(NAME, T, FROM, EPS)                                                                          \
static void NAME(const T *base, const T *const *agents, int k, const float *lambdas, float eps, int64_t s, int n, \
                 float *restrict b, float *restrict ns, float *restrict cnt, float *restrict lam) {              \
    for (int i = 0; i < n; i++) { b[i] = FROM(base[s + i]); ns[i] = 0.0f; cnt[i] = 0.0f; lam[i] = 0.0f; }    \
    for (int t = 0; t < k; t++) {                                                                              \
        const T *restrict a = agents[t] + s;                                                                   \
        const float lt = lambdas ? lambdas[t] : 0.0f;                                                          \
        for (int i = 0; i < n; i++) {                                                                          \
            DELTA(d, FROM(a[i]), b[i], EPS)                                                                       \
            float m = (d != 0.0f) ? 1.0f : 0.0f;                                                               \
            ns[i] = ns[i] - d;                                                                                 \
            cnt[i] = cnt[i] + m;                                                                               \
            lam[i] = lam[i] + m * lt;                                                                          \
        }                                                                                                      \
    }                                                                                                          \
}
MERGE_BLOCK(block_f32, float, from_f32, 0)
MERGE_BLOCK(block_f32_eps, float, from_f32, 1)
MERGE_BLOCK(block_bf16, uint16_t, from_bf16, 0)
MERGE_BLOCK(block_bf16_eps, uint16_t, from_bf16, 1)

/* theta* over [start, end) into out; lambdas NULL: RAM. Returns the number of non-finite results.
   dtype codes: 0 float32, 1 bfloat16. */
int64_t ram_merge(int in_dtype, int out_dtype, const void *base, const void *const *agents, int k,
                  const float *lambdas, float eps, void *out, int64_t start, int64_t end) {
    float b[BLOCK] __attribute__((aligned(64))), ns[BLOCK] __attribute__((aligned(64)));
    float cnt[BLOCK] __attribute__((aligned(64))), lam[BLOCK] __attribute__((aligned(64)));
    float r[BLOCK] __attribute__((aligned(64)));
    int64_t bad = 0;
    for (int64_t s = start; s < end; s += BLOCK) {
        int n = (int)(end - s < BLOCK ? end - s : BLOCK);
        if (in_dtype == 1)
            (eps > 0.0f ? block_bf16_eps : block_bf16)((const uint16_t *)base, (const uint16_t *const *)agents, k,
                                                       lambdas, eps, s, n, b, ns, cnt, lam);
        else
            (eps > 0.0f ? block_f32_eps : block_f32)((const float *)base, (const float *const *)agents, k,
                                                     lambdas, eps, s, n, b, ns, cnt, lam);
        int32_t nb = 0;
        if (lambdas)
            for (int i = 0; i < n; i++) {
                float mean = ns[i] / (cnt[i] < 1.0f ? 1.0f : cnt[i]);
                r[i] = b[i] - (cnt[i] == 1.0f ? ns[i] * lam[i] : mean);
                nb += nonfinite(r[i]);
            }
        else
            for (int i = 0; i < n; i++) {
                r[i] = b[i] - ns[i] / (cnt[i] < 1.0f ? 1.0f : cnt[i]);
                nb += nonfinite(r[i]);
            }
        bad += nb;
        if (out_dtype == 1) {
            uint16_t *o = (uint16_t *)out + s;
            for (int i = 0; i < n; i++) o[i] = to_bf16(r[i]);
        } else {
            memcpy((float *)out + s, r, (size_t)n * sizeof(float));
        }
    }
    return bad;
}

/* Statistics of one block: agent t's activity is bit t of code[i]; active[t] counted on the way; an entry is
   unique to t when its code is exactly bit t. Returns the number of non-finite task-vector entries. */
#define COUNT_BLOCK(NAME, T, FROM, EPS)                                                                          \
static int64_t NAME(const T *base, const T *const *agents, int k, float eps, int64_t s, int n,                  \
                    float *restrict b, uint32_t *restrict code, int64_t *active, int64_t *unique) {              \
    int32_t bad = 0;                                                                                           \
    for (int i = 0; i < n; i++) { b[i] = FROM(base[s + i]); code[i] = 0; }                                     \
    for (int t = 0; t < k; t++) {                                                                              \
        const T *restrict a = agents[t] + s;                                                                   \
        int32_t act = 0;                                                                                       \
        for (int i = 0; i < n; i++) {                                                                          \
            DELTA(d, FROM(a[i]), b[i], EPS)                                                                       \
            int m = d != 0.0f;                                                                                 \
            bad += nonfinite(d);                                                                               \
            act += m;                                                                                          \
            code[i] |= (uint32_t)m << t;                                                                       \
        }                                                                                                      \
        active[t] += act;                                                                                      \
    }                                                                                                          \
    for (int t = 0; t < k; t++) {                                                                              \
        const uint32_t only = 1u << t;                                                                \
        int32_t uni = 0;                                                                                       \
        for (int i = 0; i < n; i++) uni += code[i] == only;                                                    \
        unique[t] += uni;                                                                                      \
    }                                                                                                          \
    return bad;                                                                                                \
}
COUNT_BLOCK(count_f32, float, from_f32, 0)
COUNT_BLOCK(count_f32_eps, float, from_f32, 1)
COUNT_BLOCK(count_bf16, uint16_t, from_bf16, 0)
COUNT_BLOCK(count_bf16_eps, uint16_t, from_bf16, 1)

/* Per agent, active and unique entries over [start, end), added to active[] and unique[]. Returns the number
   of non-finite task-vector entries. */
int64_t ram_counts(int dtype, const void *base, const void *const *agents, int k, float eps, int64_t start,
                   int64_t end, int64_t *active, int64_t *unique) {
    float b[BLOCK] __attribute__((aligned(64)));
    uint32_t code[BLOCK] __attribute__((aligned(64)));
    int64_t bad = 0;
    for (int64_t s = start; s < end; s += BLOCK) {
        int n = (int)(end - s < BLOCK ? end - s : BLOCK);
        if (dtype == 1)
            bad += (eps > 0.0f ? count_bf16_eps : count_bf16)((const uint16_t *)base, (const uint16_t *const *)agents,
                                                              k, eps, s, n, b, code, active, unique);
        else
            bad += (eps > 0.0f ? count_f32_eps : count_f32)((const float *)base, (const float *const *)agents, k,
                                                            eps, s, n, b, code, active, unique);
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
