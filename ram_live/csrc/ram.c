/* RAM's native CPU kernels (ram_live/methods/ram/native.py): the merge, the counts, and RAM+ in one read
   (merge_unscaled + rescale). Built by ram_live/kernels/cc.py; see that module's doc for the flags of each level. */
#include <stdint.h>
#include <string.h>

#define BLOCK 512
#define MAX_AGENTS 32

#include "scalar.h"

/* return F(D, K) with K the constant k for 1 to 8 agents (the loops over agents unroll and their masks stay in
   registers: RAM+'s one-read merge took 1.6 x as long with k a variable), F(D, k) beyond */
#define BY_K(F, D) switch (k) {                                                                                 \
        case 1: return F(D, 1); case 2: return F(D, 2); case 3: return F(D, 3); case 4: return F(D, 4);       \
        case 5: return F(D, 5); case 6: return F(D, 6); case 7: return F(D, 7); case 8: return F(D, 8);       \
        default: return F(D, k); }
/* ... and with D the constant input dtype code (SWITCH: BY_K, or BY_P below) */
#define BY_DTYPE(SWITCH, F) if (dtype == 1) { SWITCH(F, 1) } SWITCH(F, 0)

#if defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512DQ__)
#define FAST 1
#include "avx512.h"
/* Bit j: |tau_j| > eps or tau_j is NaN, in one compare (hardshrink's rule, then tau != 0). *big keeps the largest
   |tau| bits per lane: at or above 0x7F800000 (inf; NaN is above) some tau was not finite. */
static inline uint32_t active32(__m512 ae, __m512 ao, __m512 be, __m512 bo, __m512 eps, __m512i *big) {
    __m512 ue = _mm512_abs_ps(_mm512_sub_ps(ae, be)), uo = _mm512_abs_ps(_mm512_sub_ps(ao, bo));
    *big = _mm512_max_epu32(*big, _mm512_max_epu32(_mm512_castps_si512(ue), _mm512_castps_si512(uo)));
    return (uint32_t)_mm512_cmp_ps_mask(ue, eps, _CMP_NLE_UQ) | ((uint32_t)_mm512_cmp_ps_mask(uo, eps, _CMP_NLE_UQ) << 16);
}
/* Agent t's share of 16 entries: where active, ns -= tau and cnt += 1 (masked, which gives the bits of the portable
   loops below: an inactive tau is 0 there and ns is never -0); returns where. */
static inline __attribute__((always_inline)) __mmask16 agent16m(__m512 a, __m512 b, __m512 eps, __m512 *ns,
                                                                __m512 *cnt) {
    __m512 d = _mm512_sub_ps(a, b);
    __mmask16 m = _mm512_cmp_ps_mask(_mm512_abs_ps(d), eps, _CMP_NLE_UQ);
    *ns = _mm512_mask_sub_ps(*ns, m, *ns, d);
    *cnt = _mm512_mask_add_ps(*cnt, m, *cnt, _mm512_set1_ps(1.0f));
    return m;
}
/* shared="sign"'s sums of 16 entries: the sum of -tau and the count of the positive tau (sp, cp), the sum of -tau
   of the negative ones (sn; their count is cnt - cp, exact in float32) */
typedef struct { __m512 sp, cp, sn; } sides16;
/* ... and, where active, lam = lambda_t; sd (sign, else NULL): where active and tau > 0 (< 0), that side's sums
   (a NaN tau, counted as positive, makes ns NaN: the plain mean then) */
static inline __attribute__((always_inline)) void agent16(__m512 a, __m512 b, __m512 eps, __m512 lt, int plus,
                                                          __m512 *ns, __m512 *cnt, __m512 *lam, sides16 *sd) {
    __mmask16 m = agent16m(a, b, eps, ns, cnt);
    if (plus) *lam = _mm512_mask_mov_ps(*lam, m, lt);
    if (sd) {
        const __m512 d = _mm512_sub_ps(a, b);
        const __mmask16 neg = _mm512_mask_cmp_ps_mask(m, d, _mm512_setzero_ps(), _CMP_LT_OQ), pos = m & ~neg;
        sd->sp = _mm512_mask_sub_ps(sd->sp, pos, sd->sp, d);
        sd->cp = _mm512_mask_add_ps(sd->cp, pos, sd->cp, _mm512_set1_ps(1.0f));
        sd->sn = _mm512_mask_sub_ps(sd->sn, neg, sd->sn, d);
    }
}
/* theta* = b - (cnt == 1 ? ns * lam : ns / max(cnt, 1)) (RAM: always the mean); sd (sign, else NULL): the mean
   of the negative side where ns > 0, of the positive side where ns < 0 (NaN: the plain mean) */
static inline __attribute__((always_inline)) __m512 theta16(__m512 b, __m512 ns, __m512 cnt, __m512 lam, int plus,
                                                            const sides16 *sd) {
    const __m512 one = _mm512_set1_ps(1.0f), zero = _mm512_setzero_ps();
    __m512 num = ns, den = _mm512_mask_mov_ps(cnt, _mm512_cmp_ps_mask(cnt, one, _CMP_LT_OQ), one);
    if (sd) {  /* the quotient chosen by its operands: one division */
        const __mmask16 gt = _mm512_cmp_ps_mask(ns, zero, _CMP_GT_OQ), lt = _mm512_cmp_ps_mask(ns, zero, _CMP_LT_OQ);
        num = _mm512_mask_mov_ps(_mm512_mask_mov_ps(num, gt, sd->sn), lt, sd->sp);
        den = _mm512_mask_mov_ps(_mm512_mask_sub_ps(den, gt, cnt, sd->cp), lt, sd->cp);
    }
    __m512 r = _mm512_div_ps(num, den);
    if (plus) r = _mm512_mask_mul_ps(r, _mm512_cmp_ps_mask(cnt, one, _CMP_EQ_OQ), ns, lam);
    return _mm512_sub_ps(b, r);
}
static inline __attribute__((always_inline)) int64_t merge_range(
        int in_dtype, int out_dtype, int plus, int sign, const void *base, const void *const *agents, int k,
        const float *lambdas, float eps, void *out, int64_t start, int64_t end) {
    const __m512 ve = _mm512_set1_ps(eps), zero = _mm512_setzero_ps();
    int64_t bad = 0;
    for (int64_t s = start; s < end; s += 32) {
        int n = (int)(end - s < 32 ? end - s : 32);
        __m512 be, bo, ae, ao, ns_e = zero, ns_o = zero, c_e = zero, c_o = zero, l_e = zero, l_o = zero;
        sides16 sd_e = {zero, zero, zero}, sd_o = sd_e;
        load32(in_dtype, base, s, n, &be, &bo);
        for (int t = 0; t < k; t++) {
            const __m512 lt = plus ? _mm512_set1_ps(lambdas[t]) : zero;
            load32(in_dtype, agents[t], s, n, &ae, &ao);
            agent16(ae, be, ve, lt, plus, &ns_e, &c_e, &l_e, sign ? &sd_e : NULL);
            agent16(ao, bo, ve, lt, plus, &ns_o, &c_o, &l_o, sign ? &sd_o : NULL);
        }
        bad += store32(in_dtype, out_dtype, out, s, n, theta16(be, ns_e, c_e, l_e, plus, sign ? &sd_e : NULL),
                       theta16(bo, ns_o, c_o, l_o, plus, sign ? &sd_o : NULL));
    }
    return bad;
}
static inline __attribute__((always_inline)) int64_t merge_by_k(
        int in_dtype, int out_dtype, int plus, int sign, const void *base, const void *const *agents, int k,
        const float *lambdas, float eps, void *out, int64_t start, int64_t end) {
#define F(UNUSED, K) merge_range(in_dtype, out_dtype, plus, sign, base, agents, K, lambdas, eps, out, start, end)
    BY_K(F, 0)
#undef F
}
#define MERGE_RANGE(I, O, P, S) merge_by_k(I, O, P, S, base, agents, k, lambdas, eps, out, start, end)
#define MERGE_ANY_K(I, O, P, S) merge_range(I, O, P, S, base, agents, k, lambdas, eps, out, start, end)
/* the set bits of each of 16 words (the nibble-table count where the CPU lacks VPOPCNTDQ) */
#ifdef __AVX512VPOPCNTDQ__
#define POPCNT16(v) _mm512_popcnt_epi32(v)
#else
static inline __m512i popcnt16_sw(__m512i v) {
    const __m512i lut = _mm512_set_epi8(4,3,3,2,3,2,2,1,3,2,2,1,2,1,1,0, 4,3,3,2,3,2,2,1,3,2,2,1,2,1,1,0,
                                        4,3,3,2,3,2,2,1,3,2,2,1,2,1,1,0, 4,3,3,2,3,2,2,1,3,2,2,1,2,1,1,0);
    const __m512i lowm = _mm512_set1_epi8(0x0F);
    __m512i c = _mm512_add_epi8(_mm512_shuffle_epi8(lut, _mm512_and_si512(v, lowm)),
                                _mm512_shuffle_epi8(lut, _mm512_and_si512(_mm512_srli_epi16(v, 4), lowm)));
    return _mm512_madd_epi16(_mm512_maddubs_epi16(c, _mm512_set1_epi8(1)), _mm512_set1_epi16(1));
}
#define POPCNT16(v) popcnt16_sw(v)
#endif
/* the sum of 16 unsigned 32-bit lanes, in 64 bits */
static inline int64_t sum16_u32(__m512i v) {
    return _mm512_reduce_add_epi64(_mm512_add_epi64(_mm512_cvtepu32_epi64(_mm512_castsi512_si256(v)),
                                                    _mm512_cvtepu32_epi64(_mm512_extracti64x4_epi64(v, 1))));
}
/* RAM+ in one read of the inputs, part 1: the RAM result where c != 1, and where agent t alone is active its own
   value (out has the inputs' dtype, so that is exact) and t + 1 in the owner planes: word j of a 32-entry group
   holds bit j of (owner + 1) for each entry, in load32's lane order. Adds the active and unique counts (as
   ram_counts). start is a multiple of 32. Per lane, x adds 1 + 64 (t + 1) for each active agent t: its low six
   bits are c, and where c = 1 the rest is t + 1. The per-agent counts are popcounts of the masks, summed per
   lane and added up in 64 bits once per call (a lane gains at most 32 per 512 entries: its unsigned 32 bits
   hold any range below 2^36 entries). */
static inline __attribute__((always_inline)) int64_t unscaled_range(
        int dtype, const void *base, const void *const *agents, int k, float eps, void *out, int64_t start,
        int64_t end, uint32_t *planes, int p, int64_t *active, int64_t *unique) {
    const __m512 ve = _mm512_set1_ps(eps), zero = _mm512_setzero_ps();
    const __m512i low = _mm512_set1_epi32(63), one = _mm512_set1_epi32(1);
    /* the masks of 16 groups (agent t's in m[t][.], the alone-active lanes in u[.]), counted 16 groups at a time */
    uint32_t m[MAX_AGENTS][16] __attribute__((aligned(64))), u[16] __attribute__((aligned(64)));
    __m512i acc_a[MAX_AGENTS], acc_u[MAX_AGENTS];
    for (int t = 0; t < k; t++) acc_a[t] = acc_u[t] = _mm512_setzero_si512();
    int64_t bad = 0;
    int g = 0;
    for (int64_t s = start; s < end; s += 32) {
        int n = (int)(end - s < 32 ? end - s : 32);
        __m512 be, bo, ae, ao, ns_e = zero, ns_o = zero, v_e = zero, v_o = zero;
        __m512i x_e = _mm512_setzero_si512(), x_o = x_e;
        load32(dtype, base, s, n, &be, &bo);
        for (int t = 0; t < k; t++) {
            const __m512i code = _mm512_set1_epi32(1 + ((t + 1) << 6));
            load32(dtype, agents[t], s, n, &ae, &ao);
            const __m512 de = _mm512_sub_ps(ae, be), d_o = _mm512_sub_ps(ao, bo);
            const __mmask16 me = _mm512_cmp_ps_mask(_mm512_abs_ps(de), ve, _CMP_NLE_UQ);
            const __mmask16 mo = _mm512_cmp_ps_mask(_mm512_abs_ps(d_o), ve, _CMP_NLE_UQ);
            ns_e = _mm512_mask_sub_ps(ns_e, me, ns_e, de);
            ns_o = _mm512_mask_sub_ps(ns_o, mo, ns_o, d_o);
            x_e = _mm512_mask_add_epi32(x_e, me, x_e, code);
            x_o = _mm512_mask_add_epi32(x_o, mo, x_o, code);
            v_e = _mm512_mask_mov_ps(v_e, me, ae);
            v_o = _mm512_mask_mov_ps(v_o, mo, ao);
            _store_mask32((__mmask32 *)&m[t][g], _mm512_kunpackw(mo, me));
        }
        const __m512i ce = _mm512_and_si512(x_e, low), co = _mm512_and_si512(x_o, low);
        const __mmask16 ue = _mm512_cmpeq_epi32_mask(ce, one), uo = _mm512_cmpeq_epi32_mask(co, one);
        _store_mask32((__mmask32 *)&u[g], _mm512_kunpackw(uo, ue));
        const __m512i oe = _mm512_srli_epi32(x_e, 6), oo = _mm512_srli_epi32(x_o, 6);
        uint32_t *w = planes + (s >> 5) * p;
        for (int j = 0; j < p; j++) {
            const __m512i bit = _mm512_set1_epi32(1 << j);
            w[j] = _cvtmask32_u32(_mm512_kunpackw(_mm512_mask_test_epi32_mask(uo, oo, bit),
                                                 _mm512_mask_test_epi32_mask(ue, oe, bit)));
        }
        __m512 re = _mm512_mask_mov_ps(theta16(be, ns_e, _mm512_cvtepi32_ps(ce), zero, 0, NULL), ue, v_e);
        __m512 ro = _mm512_mask_mov_ps(theta16(bo, ns_o, _mm512_cvtepi32_ps(co), zero, 0, NULL), uo, v_o);
        bad += store32(dtype, dtype, out, s, n, re, ro);
        if (++g == 16 || s + 32 >= end) {  /* count: popcounts of 16 groups' masks at once */
            const __mmask16 live = (__mmask16)((1u << g) - 1u);
            const __m512i uv = _mm512_maskz_load_epi32(live, u);
            for (int t = 0; t < k; t++) {
                const __m512i mv = _mm512_maskz_load_epi32(live, m[t]);
                acc_a[t] = _mm512_add_epi32(acc_a[t], POPCNT16(mv));
                acc_u[t] = _mm512_add_epi32(acc_u[t], POPCNT16(_mm512_and_si512(mv, uv)));
            }
            g = 0;
        }
    }
    for (int t = 0; t < k; t++) {
        active[t] += sum16_u32(acc_a[t]);
        unique[t] += sum16_u32(acc_u[t]);
    }
    return bad;
}
/* unscaled_range for up to SMALL_K agents, the same results: who is active alone ("once" minus "multi"), the
   counts and the planes are bit operations on the 32-bit masks in general-purpose registers, beside the vector
   units (for more agents that scalar work costs more than unscaled_range's vector codes: measured) */
#define SMALL_K 4
static inline __attribute__((always_inline)) int64_t unscaled_small(
        int dtype, const void *base, const void *const *agents, int k, float eps, void *out, int64_t start,
        int64_t end, uint32_t *planes, int p, int64_t *active, int64_t *unique) {
    const __m512 ve = _mm512_set1_ps(eps), zero = _mm512_setzero_ps();
    int64_t act[MAX_AGENTS] = {0}, uni[MAX_AGENTS] = {0};
    uint32_t m[MAX_AGENTS];
    int64_t bad = 0;
    for (int64_t s = start; s < end; s += 32) {
        int n = (int)(end - s < 32 ? end - s : 32);
        __m512 be, bo, ae, ao, ns_e = zero, ns_o = zero, c_e = zero, c_o = zero, v_e = zero, v_o = zero;
        uint32_t once = 0, multi = 0;
        load32(dtype, base, s, n, &be, &bo);
        for (int t = 0; t < k; t++) {
            load32(dtype, agents[t], s, n, &ae, &ao);
            const __mmask16 me = agent16m(ae, be, ve, &ns_e, &c_e), mo = agent16m(ao, bo, ve, &ns_o, &c_o);
            v_e = _mm512_mask_mov_ps(v_e, me, ae);
            v_o = _mm512_mask_mov_ps(v_o, mo, ao);
            m[t] = (uint32_t)_cvtmask16_u32(me) | ((uint32_t)_cvtmask16_u32(mo) << 16);
            multi |= once & m[t];
            once |= m[t];
        }
        const uint32_t uu = once & ~multi;
        uint32_t w[5] = {0, 0, 0, 0, 0};
        for (int t = 0; t < k; t++) {
            const uint32_t alone = m[t] & uu;
            act[t] += __builtin_popcount(m[t]);
            uni[t] += __builtin_popcount(alone);
            for (int j = 0; j < p; j++)
                if ((t + 1) >> j & 1) w[j] |= alone;
        }
        for (int j = 0; j < p; j++) planes[(s >> 5) * p + j] = w[j];
        const __mmask16 ue = _cvtu32_mask16(uu & 0xFFFFu), uo = _cvtu32_mask16(uu >> 16);
        __m512 re = _mm512_mask_mov_ps(theta16(be, ns_e, c_e, zero, 0, NULL), ue, v_e);
        __m512 ro = _mm512_mask_mov_ps(theta16(bo, ns_o, c_o, zero, 0, NULL), uo, v_o);
        bad += store32(dtype, dtype, out, s, n, re, ro);
    }
    for (int t = 0; t < k; t++) { active[t] += act[t]; unique[t] += uni[t]; }
    return bad;
}
/* ram_counts' AVX-512 loop. An entry is unique to t when t's bit is set and no other agent's is: "multi" marks
   entries active in two or more agents. */
static inline __attribute__((always_inline)) int64_t counts_range(
        int dtype, const void *base, const void *const *agents, int k, float eps, int64_t start, int64_t end,
        int64_t *active, int64_t *unique, uint32_t *amax) {
    int64_t act[MAX_AGENTS] = {0}, uni[MAX_AGENTS] = {0};
    const __m512 ve = _mm512_set1_ps(eps);
    const __m512i magnitude = _mm512_set1_epi32(0x7FFFFFFF);
    __m512i big = _mm512_setzero_si512(), bigb = big;
    for (int64_t s = start; s < end; s += 32) {
        int n = (int)(end - s < 32 ? end - s : 32);
        __m512 be, bo, ae, ao;
        uint32_t m[MAX_AGENTS], once = 0, multi = 0;
        load32(dtype, base, s, n, &be, &bo);
        bigb = _mm512_max_epu32(bigb, _mm512_max_epu32(_mm512_and_si512(_mm512_castps_si512(be), magnitude),
                                                       _mm512_and_si512(_mm512_castps_si512(bo), magnitude)));
        for (int t = 0; t < k; t++) {
            load32(dtype, agents[t], s, n, &ae, &ao);
            m[t] = active32(ae, ao, be, bo, ve, &big);
            multi |= once & m[t];
            once |= m[t];
        }
        for (int t = 0; t < k; t++) {
            act[t] += __builtin_popcount(m[t]);
            uni[t] += __builtin_popcount(m[t] & ~multi);
        }
    }
    for (int t = 0; t < k; t++) { active[t] += act[t]; unique[t] += uni[t]; }
    if (amax) {  /* the float bits of max |tau| and max |base| (magnitudes order as unsigned integers) */
        const uint32_t mt = _mm512_reduce_max_epu32(big), mb = _mm512_reduce_max_epu32(bigb);
        if (mt > amax[0]) amax[0] = mt;
        if (mb > amax[1]) amax[1] = mb;
    }
    return _mm512_cmpge_epu32_mask(big, _mm512_set1_epi32(0x7F800000)) != 0;
}
/* Part 2: where the planes name an owner t, out = base - (-(out - base)) * lambda_t, the ops and order of the
   merge's c = 1 case, so the bits are those of the two-pass RAM+. Groups without an owner are not read. */
static inline __attribute__((always_inline)) int64_t rescale_range(
        int dtype, const void *base, void *out, const uint32_t *planes, int p, const float *lambdas, int k,
        int64_t start, int64_t end) {
    float tab[32] __attribute__((aligned(64)));
    for (int i = 0; i < 32; i++) tab[i] = (i >= 1 && i <= k) ? lambdas[i - 1] : 1.0f;
    const __m512 t_lo = _mm512_load_ps(tab), t_hi = _mm512_load_ps(tab + 16), zero = _mm512_setzero_ps();
    int64_t bad = 0;
    for (int64_t s = start; s < end; s += 32) {
        const uint32_t *w = planes + (s >> 5) * p;
        uint32_t u = 0;
        for (int j = 0; j < p; j++) u |= w[j];
        if (!u) continue;
        int n = (int)(end - s < 32 ? end - s : 32);
        __m512i ie = _mm512_setzero_si512(), io = _mm512_setzero_si512();
        for (int j = 0; j < p; j++) {  /* plane j's bits are the lanes that add 1 << j to the owner index */
            const __m512i bit = _mm512_set1_epi32(1 << j);
            ie = _mm512_mask_or_epi32(ie, _cvtu32_mask16(w[j] & 0xFFFFu), ie, bit);
            io = _mm512_mask_or_epi32(io, _cvtu32_mask16(w[j] >> 16), io, bit);
        }
        __m512 be, bo, oe, oo;
        load32(dtype, base, s, n, &be, &bo);
        load32(dtype, out, s, n, &oe, &oo);
        __m512 re = _mm512_sub_ps(be, _mm512_mul_ps(_mm512_sub_ps(zero, _mm512_sub_ps(oe, be)),
                                                    _mm512_permutex2var_ps(t_lo, ie, t_hi)));
        __m512 ro = _mm512_sub_ps(bo, _mm512_mul_ps(_mm512_sub_ps(zero, _mm512_sub_ps(oo, bo)),
                                                    _mm512_permutex2var_ps(t_lo, io, t_hi)));
        bad += store32(dtype, dtype, out, s, n, _mm512_mask_mov_ps(oe, (__mmask16)u, re),
                       _mm512_mask_mov_ps(oo, (__mmask16)(u >> 16), ro));
    }
    return bad;
}
#else
#include "ram_vec.h"
#endif

/* 512 where the AVX-512 kernels were compiled in, 0 for the portable loops (in every part) */
int ram_simd_bits(void) {
#ifdef FAST
    return 512;
#else
    return 0;
#endif
}

/* The build in parts: ram_live/kernels/cc.py compiles each part (-DRAM_PART=n, 1 <= n < RAM_PARTS) into a library of
   its own when a call first needs it (ram_live/methods/ram/native.py's PARTS: each entry point for each input dtype;
   part 0 is ram_simd_bits alone, the check that the compiler takes the source). Compiled once without RAM_PART,
   one library holds every part. dtype codes: 0 float32, 1 bfloat16. */
#define RAM_PARTS 9
#ifdef RAM_PART
#define IN_PART(n) (RAM_PART == (n))
#else
#define IN_PART(n) 1
#endif
#define MERGE_ARGS int out_dtype, const void *base, const void *const *agents, int k, const float *lambdas, \
                   float eps, void *out, int64_t start, int64_t end, int sign
#define UNSCALED_ARGS const void *base, const void *const *agents, int k, float eps, void *out, int64_t start, \
                      int64_t end, uint32_t *planes, int p, int64_t *active, int64_t *unique
#define COUNTS_ARGS const void *base, const void *const *agents, int k, float eps, int64_t start, int64_t end, \
                    int64_t *active, int64_t *unique, uint32_t *amax
#define RESCALE_ARGS const void *base, void *out, const uint32_t *planes, int p, const float *lambdas, int k, \
                     int64_t start, int64_t end

/* theta* over [start, end) into out (of out_dtype); lambdas NULL: RAM; sign nonzero: shared="sign" (the mean of
   the agents whose tau has the sign of the sum of tau). Returns the number of non-finite results. An output of
   another dtype than the inputs' is rare: k stays a variable there. */
#ifdef FAST
/* M(I, O, P, S) with P (RAM+) and S (sign) constants */
#define BY_PS(M, I, O) (sign ? (lambdas ? M(I, O, 1, 1) : M(I, O, 0, 1)) : (lambdas ? M(I, O, 1, 0) : M(I, O, 0, 0)))
#endif
#if IN_PART(1)
int64_t ram_merge_bf16(MERGE_ARGS) {
#ifdef FAST
    return out_dtype == 1 ? BY_PS(MERGE_RANGE, 1, 1) : BY_PS(MERGE_ANY_K, 1, 0);
#else
    return vmerge_dispatch_1(out_dtype, base, agents, k, lambdas, eps, out, start, end, sign);
#endif
}
#endif
#if IN_PART(2)
int64_t ram_merge_f32(MERGE_ARGS) {
#ifdef FAST
    return out_dtype == 1 ? BY_PS(MERGE_ANY_K, 0, 1) : BY_PS(MERGE_RANGE, 0, 0);
#else
    return vmerge_dispatch_0(out_dtype, base, agents, k, lambdas, eps, out, start, end, sign);
#endif
}
#endif

/* RAM+ in one read of the inputs (see unscaled_range and rescale_range; out has the inputs' dtype; p, the
   plane count, follows from k). */
#ifdef FAST
#define UNSCALED(D) (void)p; BY_K(UNSCALED_F, D)
#define UNSCALED_F(D, K) ((K) <= SMALL_K ? unscaled_small : unscaled_range)(D, base, agents, K, eps, out, start, \
                                                                end, planes, 32 - __builtin_clz(K), active, unique)
#else
#define UNSCALED(D) (void)p; return vunscaled_dispatch_##D(base, agents, k, eps, out, start, end, planes, active, \
                                                         unique);
#endif
#if IN_PART(3)
int64_t ram_merge_unscaled_bf16(UNSCALED_ARGS) { UNSCALED(1) }
#endif
#if IN_PART(4)
int64_t ram_merge_unscaled_f32(UNSCALED_ARGS) { UNSCALED(0) }
#endif

/* Per agent, active and unique entries over [start, end), added to active[] and unique[]; amax (or NULL): raised
   to the float32 bits of max |tau| (amax[0]) and max |base| (amax[1]). Returns nonzero when a task-vector entry
   is not finite (the number of them, or with AVX-512 1). */
#ifdef FAST
#define COUNTS_F(D, K) counts_range(D, base, agents, K, eps, start, end, active, unique, amax)
#define COUNTS(D) BY_K(COUNTS_F, D)
#else
#define COUNTS(D) return vcounts(D, base, agents, k, eps, start, end, active, unique, amax);
#endif
#if IN_PART(5)
int64_t ram_counts_bf16(COUNTS_ARGS) { COUNTS(1) }
#endif
#if IN_PART(6)
int64_t ram_counts_f32(COUNTS_ARGS) { COUNTS(0) }
#endif

/* RAM+'s second part: lambda where the planes name an owner */
#ifdef FAST
/* p a constant, as k above */
#define BY_P(F, D) switch (p) { case 1: return F(D, 1); case 2: return F(D, 2); case 3: return F(D, 3);       \
                                case 4: return F(D, 4); default: return F(D, p); }
#define RESCALE_F(D, P) rescale_range(D, base, out, planes, P, lambdas, k, start, end)
#define RESCALE(D) BY_P(RESCALE_F, D)
#else
#define RESCALE(D) return vrescale(D, base, out, planes, p, lambdas, k, start, end);
#endif
#if IN_PART(7)
int64_t ram_rescale_bf16(RESCALE_ARGS) { RESCALE(1) }
#endif
#if IN_PART(8)
int64_t ram_rescale_f32(RESCALE_ARGS) { RESCALE(0) }
#endif
