/* The portable RAM kernels: GCC/Clang vector extensions (8 float32 lanes with AVX2, 4 elsewhere), which the compiler turns into AVX2,
   NEON or SSE code by the -march it is given. Groups of 32 entries (4 vectors) go through all agents with their
   sums in registers (one pass over the K + 1 inputs, as the AVX-512 loops); activity is a lane mask, the counts
   popcounts of its 32-bit words; the bfloat16 <-> float32 conversions are integer shifts, round to nearest even
   in integer operations. The same float32 operations in the same order as the AVX-512 loops and the torch
   paths, so all give the same bits. A tail of fewer than 32 entries runs through the same code on zero-padded
   copies (tau = 0 there: inactive). Included by ram.c where the AVX-512 loops are not compiled in. */
#ifndef RAM_VEC_H
#define RAM_VEC_H
#include <stdint.h>
#include <string.h>
#if defined(__AVX2__)
#include <immintrin.h>
#endif

#define GROUP 32
#if defined(__AVX2__)
#define LANES 8  /* 256-bit vectors */
#define LANE_INDEX {0, 1, 2, 3, 4, 5, 6, 7}
#else
#define LANES 4  /* 128-bit vectors: NEON, SSE2 */
#define LANE_INDEX {0, 1, 2, 3}
#endif
#define NV (GROUP / LANES)  /* vectors per group */

typedef float vf __attribute__((vector_size(4 * LANES)));
typedef int32_t vi __attribute__((vector_size(4 * LANES)));
typedef uint32_t vu __attribute__((vector_size(4 * LANES)));
typedef uint16_t vh __attribute__((vector_size(2 * LANES)));

#define ALWAYS static inline __attribute__((always_inline))

ALWAYS vf splatf(float x) { return (vf){} + x; }
ALWAYS vu splatu(uint32_t x) { return (vu){} + x; }
/* m ? a : b per lane (m: all ones or zero) */
ALWAYS vf self(vi m, vf a, vf b) { return (vf)(((vi)a & m) | ((vi)b & ~m)); }
ALWAYS vu maxu(vu a, vu b) { return (vu)(((vi)a & (vi)(a > b)) | ((vi)b & ~(vi)(a > b))); }

/* LANES entries of dtype (0 float32, 1 bfloat16) at p + i as float32 */
ALWAYS vf loadv(int dtype, const void *p, int64_t i) {
    if (dtype == 1) {
        vh h;
        memcpy(&h, (const uint16_t *)p + i, sizeof h);
        return (vf)(__builtin_convertvector(h, vu) << 16);
    }
    vf f;
    memcpy(&f, (const float *)p + i, sizeof f);
    return f;
}
/* float32 -> bfloat16 bits: round to nearest even, NaN -> 0x7FC0 (to_bf16 of scalar.h, per lane) */
ALWAYS vu bf16v(vf r) {
    const vu u = (vu)r;
    const vu v = (u + splatu(0x7FFFu) + ((u >> 16) & splatu(1u))) >> 16;
    const vi nan = (vi)((u & splatu(0x7FFFFFFFu)) > splatu(0x7F800000u));
    return (vu)(((vi)splatu(0x7FC0u) & nan) | ((vi)v & ~nan));
}
ALWAYS void storev(int dtype, void *p, int64_t i, vf r) {
    if (dtype == 1) {
        const vh h = __builtin_convertvector(bf16v(r), vh);
        memcpy((uint16_t *)p + i, &h, sizeof h);
    } else {
        memcpy((float *)p + i, &r, sizeof r);
    }
}
/* lanes not finite once stored in dtype (nonfinite_as of scalar.h): -1 there */
ALWAYS vi nonfinitev(int dtype, vf r) {
    return (vi)(((vu)r & splatu(0x7FFFFFFFu)) >= splatu(dtype == 1 ? 0x7F7F8000u : 0x7F800000u));
}
/* bit i: lane i of m set */
ALWAYS uint32_t movemask(vi m) {
#if defined(__AVX2__)
    return (uint32_t)_mm256_movemask_ps((__m256)m);
#else
    const vu w = ((vu)m >> 31) << (vu)LANE_INDEX;
    uint32_t r = 0;
    for (int l = 0; l < LANES; l++) r |= w[l];
    return r;
#endif
}
/* active: |tau| > eps or tau NaN (hardshrink's rule, then tau != 0) */
ALWAYS vi activev(vf d, vf eps) { return ~(vi)((vf)((vu)d & splatu(0x7FFFFFFFu)) <= eps); }
ALWAYS int32_t hsum(vi v) {
    int32_t r = 0;
    for (int l = 0; l < LANES; l++) r += v[l];
    return r;
}

/* A group's inputs: at base/agents + s, or (a tail of n < 32 entries) zero-padded copies. */
typedef struct {
    const void *base;
    const void *agents[MAX_AGENTS];
    unsigned char pad[MAX_AGENTS + 1][GROUP * 4];
} tail_inputs;

static void pad_inputs(tail_inputs *t, int dtype, const void *base, const void *const *agents, int k, int64_t s,
                       int n) {
    const size_t w = dtype == 1 ? 2 : 4;
    memset(t->pad, 0, (size_t)(k + 1) * sizeof t->pad[0]);
    memcpy(t->pad[0], (const char *)base + s * w, (size_t)n * w);
    for (int i = 0; i < k; i++) {
        memcpy(t->pad[i + 1], (const char *)agents[i] + s * w, (size_t)n * w);
        t->agents[i] = t->pad[i + 1];
    }
    t->base = t->pad[0];
}

/* theta* of 32 entries from s into r; returns the non-finite lanes (as out_dtype) among the first n. sign: also
   the sum of -tau and the count of the positive tau (sp, cp) and the sum of -tau of the negative ones (sn, over
   cnt - cp of them), and the mean of the side of ns's sign (ram.c's agent16 and theta16). */
ALWAYS int32_t vmerge_group(int in_dtype, int out_dtype, int plus, int sign, const void *base,
                            const void *const *agents, int k, const float *lambdas, vf eps, int64_t s, int n,
                            vf r[NV]) {
    const vf one = splatf(1.0f), zero = splatf(0.0f);
    vf b[NV], ns[NV], cnt[NV], lam[NV], sp[NV], cp[NV], sn[NV];
    for (int q = 0; q < NV; q++) {
        b[q] = loadv(in_dtype, base, s + LANES * q);
        ns[q] = cnt[q] = lam[q] = sp[q] = cp[q] = sn[q] = zero;
    }
    for (int t = 0; t < k; t++) {
        const vf lt = splatf(plus ? lambdas[t] : 0.0f);
        for (int q = 0; q < NV; q++) {
            const vf d = loadv(in_dtype, agents[t], s + LANES * q) - b[q];
            const vi m = activev(d, eps);
            ns[q] = ns[q] - (vf)((vi)d & m);
            cnt[q] = cnt[q] + (vf)((vi)one & m);
            if (plus) lam[q] = self(m, lt, lam[q]);
            if (sign) {
                const vi neg = m & (vi)(d < zero), pos = m & ~neg;
                sp[q] = sp[q] - (vf)((vi)d & pos);
                cp[q] = cp[q] + (vf)((vi)one & pos);
                sn[q] = sn[q] - (vf)((vi)d & neg);
            }
        }
    }
    vi bad = (vi)zero;
    for (int q = 0; q < NV; q++) {
        vf num = ns[q], den = self((vi)(cnt[q] < one), one, cnt[q]);
        if (sign) {
            const vi gt = (vi)(ns[q] > zero), lt = (vi)(ns[q] < zero);
            num = self(lt, sp[q], self(gt, sn[q], num));
            den = self(lt, cp[q], self(gt, cnt[q] - cp[q], den));
        }
        const vf mean = num / den;
        r[q] = b[q] - (plus ? self((vi)(cnt[q] == one), ns[q] * lam[q], mean) : mean);
        const vi lanes = (vi)LANE_INDEX + LANES * q < n;
        bad -= nonfinitev(out_dtype, r[q]) & lanes;
    }
    return hsum(bad);
}

/* the tail's group: one instance for all dtypes and k (the same operations) */
static __attribute__((noinline)) int32_t vmerge_tail(int in_dtype, int out_dtype, int plus, int sign,
        const void *base, const void *const *agents, int k, const float *lambdas, vf eps, int n, vf r[NV]) {
    return vmerge_group(in_dtype, out_dtype, plus, sign, base, agents, k, lambdas, eps, 0, n, r);
}

ALWAYS int64_t vmerge(int in_dtype, int out_dtype, int plus, int sign, const void *base, const void *const *agents,
                      int k, const float *lambdas, float eps, void *out, int64_t start, int64_t end) {
    const vf veps = splatf(eps);
    int64_t bad = 0, s = start;
    vf r[NV];
    for (; s + GROUP <= end; s += GROUP) {
        bad += vmerge_group(in_dtype, out_dtype, plus, sign, base, agents, k, lambdas, veps, s, GROUP, r);
        for (int q = 0; q < NV; q++) storev(out_dtype, out, s + LANES * q, r[q]);
    }
    if (s < end) {
        const int n = (int)(end - s);
        tail_inputs t;
        unsigned char o[GROUP * 4];
        pad_inputs(&t, in_dtype, base, agents, k, s, n);
        bad += vmerge_tail(in_dtype, out_dtype, plus, sign, t.base, t.agents, k, lambdas, veps, n, r);
        for (int q = 0; q < NV; q++) storev(out_dtype, o, LANES * q, r[q]);
        memcpy((char *)out + s * (out_dtype == 1 ? 2 : 4), o, (size_t)n * (out_dtype == 1 ? 2 : 4));
    }
    return bad;
}

/* ram_counts of 32 entries: agent t's activity word in m[t]; big/bigb raised to the |tau| / |base| bits */
ALWAYS void vcounts_group(int dtype, const void *base, const void *const *agents, int k, vf eps, int64_t s,
                          uint32_t *m, vu *big, vu *bigb) {
    vf b[NV];
    for (int q = 0; q < NV; q++) {
        b[q] = loadv(dtype, base, s + LANES * q);
        *bigb = maxu(*bigb, (vu)b[q] & splatu(0x7FFFFFFFu));
    }
    for (int t = 0; t < k; t++) {
        uint32_t w = 0;
        for (int q = 0; q < NV; q++) {
            const vf d = loadv(dtype, agents[t], s + LANES * q) - b[q];
            *big = maxu(*big, (vu)d & splatu(0x7FFFFFFFu));
            w |= movemask(activev(d, eps)) << (LANES * q);
        }
        m[t] = w;
    }
}

ALWAYS int64_t vcounts(int dtype, const void *base, const void *const *agents, int k, float eps, int64_t start,
                       int64_t end, int64_t *active, int64_t *unique, uint32_t *amax) {
    const vf veps = splatf(eps);
    int64_t act[MAX_AGENTS] = {0}, uni[MAX_AGENTS] = {0};
    uint32_t m[MAX_AGENTS];
    vu big = splatu(0), bigb = splatu(0);
    tail_inputs t;
    for (int64_t s = start; s < end; s += GROUP) {
        const int n = (int)(end - s < GROUP ? end - s : GROUP);
        if (n < GROUP) {
            pad_inputs(&t, dtype, base, agents, k, s, n);
            vcounts_group(dtype, t.base, t.agents, k, veps, 0, m, &big, &bigb);
        } else {
            vcounts_group(dtype, base, agents, k, veps, s, m, &big, &bigb);
        }
        uint32_t once = 0, multi = 0;
        for (int i = 0; i < k; i++) { multi |= once & m[i]; once |= m[i]; }
        for (int i = 0; i < k; i++) {
            act[i] += __builtin_popcount(m[i]);
            uni[i] += __builtin_popcount(m[i] & ~multi);
        }
    }
    for (int i = 0; i < k; i++) { active[i] += act[i]; unique[i] += uni[i]; }
    uint32_t mt = 0, mb = 0;
    for (int l = 0; l < LANES; l++) { mt = big[l] > mt ? big[l] : mt; mb = bigb[l] > mb ? bigb[l] : mb; }
    if (amax) {
        if (mt > amax[0]) amax[0] = mt;
        if (mb > amax[1]) amax[1] = mb;
    }
    return mt >= 0x7F800000u;
}

/* RAM+ in one read, part 1 (ram_merge_unscaled): the RAM result where c != 1, the active agent's own value where
   c = 1, owner + 1 in the planes (entry order: bit i of word j of a group is bit j of entry i's owner + 1) */
ALWAYS int32_t vunscaled_group(int dtype, const void *base, const void *const *agents, int k, vf eps, int64_t s,
                               int n, vf r[NV], uint32_t *w, int p, int64_t *act, int64_t *uni) {
    const vf one = splatf(1.0f), zero = splatf(0.0f);
    vf b[NV], ns[NV], cnt[NV], v[NV];
    uint32_t m[MAX_AGENTS], once = 0, multi = 0;
    for (int q = 0; q < NV; q++) { b[q] = loadv(dtype, base, s + LANES * q); ns[q] = cnt[q] = v[q] = zero; }
    for (int t = 0; t < k; t++) {
        uint32_t word = 0;
        for (int q = 0; q < NV; q++) {
            const vf a = loadv(dtype, agents[t], s + LANES * q), d = a - b[q];
            const vi mq = activev(d, eps);
            ns[q] = ns[q] - (vf)((vi)d & mq);
            cnt[q] = cnt[q] + (vf)((vi)one & mq);
            v[q] = self(mq, a, v[q]);
            word |= movemask(mq) << (LANES * q);
        }
        m[t] = word;
        multi |= once & word;
        once |= word;
    }
    const uint32_t alone_any = once & ~multi;
    for (int j = 0; j < p; j++) w[j] = 0;
    for (int t = 0; t < k; t++) {
        const uint32_t alone = m[t] & alone_any;
        act[t] += __builtin_popcount(m[t]);
        uni[t] += __builtin_popcount(alone);
        for (int j = 0; j < p; j++)
            if ((t + 1) >> j & 1) w[j] |= alone;
    }
    vi bad = (vi)zero;
    for (int q = 0; q < NV; q++) {
        const vf mean = b[q] - ns[q] / self((vi)(cnt[q] < one), one, cnt[q]);
        r[q] = self((vi)(cnt[q] == one), v[q], mean);
        const vi lanes = (vi)LANE_INDEX + LANES * q < n;
        bad -= nonfinitev(dtype, r[q]) & lanes;
    }
    return hsum(bad);
}

static __attribute__((noinline)) int32_t vunscaled_tail(int dtype, const void *base, const void *const *agents,
        int k, vf eps, int n, vf r[NV], uint32_t *w, int p, int64_t *act, int64_t *uni) {
    return vunscaled_group(dtype, base, agents, k, eps, 0, n, r, w, p, act, uni);
}

ALWAYS int64_t vunscaled(int dtype, const void *base, const void *const *agents, int k, float eps, void *out,
                         int64_t start, int64_t end, uint32_t *planes, int p, int64_t *active, int64_t *unique) {
    const vf veps = splatf(eps);
    int64_t act[MAX_AGENTS] = {0}, uni[MAX_AGENTS] = {0}, bad = 0, s = start;
    vf r[NV];
    for (; s + GROUP <= end; s += GROUP) {
        bad += vunscaled_group(dtype, base, agents, k, veps, s, GROUP, r, planes + (s >> 5) * p, p, act, uni);
        for (int q = 0; q < NV; q++) storev(dtype, out, s + LANES * q, r[q]);
    }
    if (s < end) {
        const int n = (int)(end - s);
        tail_inputs t;
        unsigned char o[GROUP * 4];
        pad_inputs(&t, dtype, base, agents, k, s, n);
        bad += vunscaled_tail(dtype, t.base, t.agents, k, veps, n, r, planes + (s >> 5) * p, p, act, uni);
        for (int q = 0; q < NV; q++) storev(dtype, o, LANES * q, r[q]);
        memcpy((char *)out + s * (dtype == 1 ? 2 : 4), o, (size_t)n * (dtype == 1 ? 2 : 4));
    }
    for (int i = 0; i < k; i++) { active[i] += act[i]; unique[i] += uni[i]; }
    return bad;
}

/* Part 2 (ram_rescale) on one group with an owner: out = base - (-(out - base)) * lambda_owner there */
ALWAYS int32_t vrescale_group(int dtype, const void *base, const void *out, const uint32_t *w, int p,
                              const float *tab, int k, int64_t s, int n, vf r[NV]) {
    const vf zero = splatf(0.0f);
    vi bad = (vi)zero;
    for (int q = 0; q < NV; q++) {
        const vu lane = (vu)LANE_INDEX + (uint32_t)(LANES * q);
        vu owner = splatu(0);
        for (int j = 0; j < p; j++) owner |= ((splatu(w[j]) >> lane) & splatu(1u)) << j;
        const vi has = (vi)(owner != splatu(0)) & (vi)(owner <= splatu((uint32_t)k));
        owner = (vu)((vi)owner & has);
        vf lam;
#if defined(__AVX2__)
        if (k < 8) {  /* the table in one register: one permute */
            vf t8;
            memcpy(&t8, tab, sizeof t8);
            lam = (vf)_mm256_permutevar8x32_ps((__m256)t8, (__m256i)owner);
        } else
#endif
        for (int l = 0; l < LANES; l++) lam[l] = tab[owner[l]];
        const vf b = loadv(dtype, base, s + LANES * q), o = loadv(dtype, out, s + LANES * q);
        const vf x = b - (zero - (o - b)) * lam;
        r[q] = self(has, x, o);
        bad -= nonfinitev(dtype, x) & has & ((vi)LANE_INDEX + LANES * q < n);
    }
    return hsum(bad);
}

ALWAYS int64_t vrescale(int dtype, const void *base, void *out, const uint32_t *planes, int p,
                        const float *lambdas, int k, int64_t start, int64_t end) {
    const size_t width = dtype == 1 ? 2 : 4;
    float tab[MAX_AGENTS + 1] = {0};  /* lambda of owner index + 1; 0: no owner */
    tab[0] = 1.0f;
    for (int t = 0; t < k; t++) tab[t + 1] = lambdas[t];
    int64_t bad = 0;
    vf r[NV];
    for (int64_t s = start; s < end; s += GROUP) {
        const uint32_t *w = planes + (s >> 5) * p;
        uint32_t u = 0;
        for (int j = 0; j < p; j++) u |= w[j];
        if (!u) continue;
        const int n = (int)(end - s < GROUP ? end - s : GROUP);
        if (n == GROUP) {
            bad += vrescale_group(dtype, base, out, w, p, tab, k, s, n, r);
            for (int q = 0; q < NV; q++) storev(dtype, out, s + LANES * q, r[q]);
        } else {
            unsigned char bb[GROUP * 4] = {0}, oo[GROUP * 4] = {0};
            memcpy(bb, (const char *)base + s * width, (size_t)n * width);
            memcpy(oo, (const char *)out + s * width, (size_t)n * width);
            bad += vrescale_group(dtype, bb, oo, w, p, tab, k, 0, n, r);
            for (int q = 0; q < NV; q++) storev(dtype, oo, LANES * q, r[q]);
            memcpy((char *)out + s * width, oo, (size_t)n * width);
        }
    }
    return bad;
}
/* One function per (dtype, RAM / RAM+, mean / sign, K = 1..8), each compiled apart with its constants (inlined
   all into one, GCC optimised the later instances worse), called through tables; other cases take k as a
   variable. One table and dispatch per input dtype (D), each used by one part of ram.c's build: a part compiles
   only the functions it references. */
#define VM_ARGS const void *base, const void *const *agents, const float *lambdas, float eps, void *out, \
                int64_t start, int64_t end
#define DEF_VM(D, P, S, K) static __attribute__((noinline)) int64_t vm_##D##_##P##_##S##_##K(VM_ARGS) { \
    return vmerge(D, D, P, S, base, agents, K, lambdas, eps, out, start, end); }
#define DEF_VM_K(D, P, S) DEF_VM(D, P, S, 1) DEF_VM(D, P, S, 2) DEF_VM(D, P, S, 3) DEF_VM(D, P, S, 4) \
                          DEF_VM(D, P, S, 5) DEF_VM(D, P, S, 6) DEF_VM(D, P, S, 7) DEF_VM(D, P, S, 8)
DEF_VM_K(0, 0, 0) DEF_VM_K(0, 1, 0) DEF_VM_K(1, 0, 0) DEF_VM_K(1, 1, 0)
DEF_VM_K(0, 0, 1) DEF_VM_K(0, 1, 1) DEF_VM_K(1, 0, 1) DEF_VM_K(1, 1, 1)
#define VM_ROW(D, P, S) {vm_##D##_##P##_##S##_1, vm_##D##_##P##_##S##_2, vm_##D##_##P##_##S##_3,             \
                         vm_##D##_##P##_##S##_4, vm_##D##_##P##_##S##_5, vm_##D##_##P##_##S##_6,             \
                         vm_##D##_##P##_##S##_7, vm_##D##_##P##_##S##_8}

static __attribute__((noinline)) int64_t vmerge_any(int in_dtype, int out_dtype, int plus, int sign,
        const void *base, const void *const *agents, int k, const float *lambdas, float eps, void *out,
        int64_t start, int64_t end) {
    return sign ? vmerge(in_dtype, out_dtype, plus, 1, base, agents, k, lambdas, eps, out, start, end)
                : vmerge(in_dtype, out_dtype, plus, 0, base, agents, k, lambdas, eps, out, start, end);
}
#define DEF_VMERGE_DISPATCH(D)                                                                                 \
static int64_t (*const vm_table_##D[2][2][8])(VM_ARGS) = {{VM_ROW(D, 0, 0), VM_ROW(D, 1, 0)},                 \
                                                         {VM_ROW(D, 0, 1), VM_ROW(D, 1, 1)}};                \
static int64_t vmerge_dispatch_##D(int out_dtype, const void *base, const void *const *agents, int k,         \
                                   const float *lambdas, float eps, void *out, int64_t start, int64_t end,     \
                                   int sign) {                                                                 \
    const int plus = lambdas != NULL;                                                                          \
    if (out_dtype == D && k >= 1 && k <= 8)                                                                    \
        return vm_table_##D[sign != 0][plus][k - 1](base, agents, lambdas, eps, out, start, end);              \
    return vmerge_any(D, out_dtype, plus, sign != 0, base, agents, k, lambdas, eps, out, start, end);          \
}
DEF_VMERGE_DISPATCH(0)
DEF_VMERGE_DISPATCH(1)

#define VU_ARGS const void *base, const void *const *agents, float eps, void *out, int64_t start, int64_t end, \
                uint32_t *planes, int64_t *active, int64_t *unique
#define DEF_VU(D, K) static __attribute__((noinline)) int64_t vu_##D##_##K(VU_ARGS) { \
    return vunscaled(D, base, agents, K, eps, out, start, end, planes, 32 - __builtin_clz(K), active, unique); }
#define DEF_VU_K(D) DEF_VU(D, 1) DEF_VU(D, 2) DEF_VU(D, 3) DEF_VU(D, 4) DEF_VU(D, 5) DEF_VU(D, 6) DEF_VU(D, 7) \
                    DEF_VU(D, 8)
DEF_VU_K(0) DEF_VU_K(1)
#define VU_ROW(D) {vu_##D##_1, vu_##D##_2, vu_##D##_3, vu_##D##_4, vu_##D##_5, vu_##D##_6, vu_##D##_7, vu_##D##_8}

static __attribute__((noinline)) int64_t vunscaled_any(int dtype, const void *base, const void *const *agents,
        int k, float eps, void *out, int64_t start, int64_t end, uint32_t *planes, int64_t *active,
        int64_t *unique) {
    return vunscaled(dtype, base, agents, k, eps, out, start, end, planes, 32 - __builtin_clz(k), active, unique);
}
#define DEF_VUNSCALED_DISPATCH(D)                                                                              \
static int64_t (*const vu_table_##D[8])(VU_ARGS) = VU_ROW(D);                                                  \
static int64_t vunscaled_dispatch_##D(const void *base, const void *const *agents, int k, float eps,          \
                                      void *out, int64_t start, int64_t end, uint32_t *planes,                 \
                                      int64_t *active, int64_t *unique) {                                      \
    if (k >= 1 && k <= 8)                                                                                      \
        return vu_table_##D[k - 1](base, agents, eps, out, start, end, planes, active, unique);                \
    return vunscaled_any(D, base, agents, k, eps, out, start, end, planes, active, unique);                    \
}
DEF_VUNSCALED_DISPATCH(0)
DEF_VUNSCALED_DISPATCH(1)
#endif
