/* Curvature-aware RAM's native CPU kernel (ram_live/methods/ram/native_weighted.py). Built by ram_live/kernels/cc.py. */
#include <stdint.h>
#include <string.h>

#define BLOCK 512

#include "scalar.h"
/* not finite and >= 0: negative, NaN or +Inf */
static inline int bad_importance(float h) { return !(h >= 0.0f) || bits(h) == 0x7F800000u; }

#if defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512DQ__)
#define FAST 1
#include "avx512.h"
/* 32 importances at p + s in the lane order load32 gives the agents (in_dtype) */
static inline void load_imp32(int in_dtype, int imp_dtype, const void *p, int64_t s, int n, __m512 *lo, __m512 *hi) {
    if (in_dtype == imp_dtype || n <= 0) { load32(imp_dtype, p, s, n, lo, hi); return; }
    if (in_dtype == 1) {  /* bfloat16 agents: even entries in lo, odd ones in hi */
        __m512 a, b;
        load32(0, p, s, n, &a, &b);
        const __m512i ie = _mm512_set_epi32(30, 28, 26, 24, 22, 20, 18, 16, 14, 12, 10, 8, 6, 4, 2, 0);
        const __m512i io = _mm512_set_epi32(31, 29, 27, 25, 23, 21, 19, 17, 15, 13, 11, 9, 7, 5, 3, 1);
        *lo = _mm512_permutex2var_ps(a, ie, b);
        *hi = _mm512_permutex2var_ps(a, io, b);
    } else {  /* float32 agents: entry order */
        const uint16_t *h = (const uint16_t *)p + s;
        __m512i x = n >= 32 ? _mm512_loadu_si512(h) : _mm512_maskz_loadu_epi16((__mmask32)((1u << n) - 1u), h);
        *lo = _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm512_castsi512_si256(x)), 16));
        *hi = _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm512_extracti64x4_epi64(x, 1)), 16));
    }
}
/* shared="sign"'s sums of 16 entries, weighted as S and W: over the positive tau (sp = -sum w tau, wp = sum w) and
   the negative ones (sn, wn), rescaled with S and W */
typedef struct { __m512 sp, wp, sn, wn; } wsides16;
/* where active and tau > 0 (< 0): that side's sums take -w tau and w (wd: w tau, the product S takes; a NaN tau,
   counted as positive, makes ns NaN: the plain mean then) */
static inline __attribute__((always_inline)) void wside16(__mmask16 m, __m512 d, __m512 wd, __m512 w, wsides16 *sd) {
    const __mmask16 neg = _mm512_mask_cmp_ps_mask(m, d, _mm512_setzero_ps(), _CMP_LT_OQ), pos = m & ~neg;
    sd->sp = _mm512_mask_sub_ps(sd->sp, pos, sd->sp, wd);
    sd->wp = _mm512_mask_add_ps(sd->wp, pos, sd->wp, w);
    sd->sn = _mm512_mask_sub_ps(sd->sn, neg, sd->sn, wd);
    sd->wn = _mm512_mask_add_ps(sd->wn, neg, sd->wn, w);
}
/* agent t's share of 16 entries (first: t == 0, where S = W = 0 and no rescaling is needed); sd (sign, else
   NULL): the sides' sums */
static inline __attribute__((always_inline)) void wagent16(__m512 a, __m512 b, __m512 h, __m512 eps, __m512 lt,
        int plus, int first, __m512 *ns, __m512 *ws, __m512 *top, __m512 *cnt, __m512 *lam, __mmask16 *bad,
        wsides16 *sd) {
    const __m512 one = _mm512_set1_ps(1.0f), zero = _mm512_setzero_ps();
    const __m512 d = _mm512_sub_ps(a, b);
    const __mmask16 m = _mm512_cmp_ps_mask(_mm512_abs_ps(d), eps, _CMP_NLE_UQ);
    /* bad: NaN (0x01, 0x80), +Inf (0x08), -Inf (0x10), negative and not zero (0x40): one instruction */
    *bad |= _mm512_fpclass_ps_mask(h, 0xD9);
    *cnt = _mm512_mask_add_ps(*cnt, m, *cnt, one);
    if (plus) *lam = _mm512_mask_mov_ps(*lam, m, lt);
    if (first) {
        *top = _mm512_maskz_mov_ps(m, h);
        *ns = _mm512_mask_sub_ps(*ns, m, *ns, d);
        *ws = _mm512_mask_add_ps(*ws, m, *ws, one);
        if (sd) wside16(m, d, d, one, sd);
        return;
    }
    if (!m) return;
    /* one division per lane: where h is a new maximum, r = M / h rescales S and W and then w = h / h = 1; elsewhere
       w = h / M (1 where M = 0, which leaves h = 0 too). The same values as computing both quotients. */
    const __mmask16 up = _mm512_mask_cmp_ps_mask(m, h, *top, _CMP_GT_OQ);
    const __mmask16 pos = _mm512_mask_cmp_ps_mask(m & ~up, *top, zero, _CMP_GT_OQ);
    const __m512 num = _mm512_mask_mov_ps(h, up, *top), den = _mm512_mask_mov_ps(*top, up, h);
    const __m512 q = _mm512_mask_div_ps(one, up | pos, num, den);
    *ns = _mm512_mask_mul_ps(*ns, up, *ns, q);
    *ws = _mm512_mask_mul_ps(*ws, up, *ws, q);
    if (sd) {
        sd->sp = _mm512_mask_mul_ps(sd->sp, up, sd->sp, q);
        sd->wp = _mm512_mask_mul_ps(sd->wp, up, sd->wp, q);
        sd->sn = _mm512_mask_mul_ps(sd->sn, up, sd->sn, q);
        sd->wn = _mm512_mask_mul_ps(sd->wn, up, sd->wn, q);
    }
    *top = _mm512_mask_mov_ps(*top, up, h);
    const __m512 w = _mm512_mask_mov_ps(q, up, one), wd = _mm512_mul_ps(w, d);
    *ns = _mm512_mask_sub_ps(*ns, m, *ns, wd);
    *ws = _mm512_mask_add_ps(*ws, m, *ws, w);
    if (sd) wside16(m, d, wd, w, sd);
}
/* theta* = b - (cnt == 1 ? ns * lam : ns / max(ws, 1)); sd (sign, else NULL): the weighted mean of the negative
   side where ns > 0, of the positive side where ns < 0 (NaN: the plain weighted mean) */
static inline __attribute__((always_inline)) __m512 wtheta16(__m512 b, __m512 ns, __m512 ws, __m512 cnt, __m512 lam,
                                                             int plus, const wsides16 *sd) {
    const __m512 one = _mm512_set1_ps(1.0f), zero = _mm512_setzero_ps();
    __m512 num = ns, den = _mm512_mask_mov_ps(ws, _mm512_cmp_ps_mask(ws, one, _CMP_LT_OQ), one);
    if (sd) {  /* the quotient chosen by its operands: one division */
        const __mmask16 gt = _mm512_cmp_ps_mask(ns, zero, _CMP_GT_OQ), lt = _mm512_cmp_ps_mask(ns, zero, _CMP_LT_OQ);
        num = _mm512_mask_mov_ps(_mm512_mask_mov_ps(num, gt, sd->sn), lt, sd->sp);
        den = _mm512_mask_mov_ps(_mm512_mask_mov_ps(den, gt, sd->wn), lt, sd->wp);
    }
    __m512 r = _mm512_div_ps(num, den);
    if (plus) r = _mm512_mask_mul_ps(r, _mm512_cmp_ps_mask(cnt, one, _CMP_EQ_OQ), ns, lam);
    return _mm512_sub_ps(b, r);
}
static inline __attribute__((always_inline)) int64_t wmerge_range(
        int in_dtype, int imp_dtype, int out_dtype, int plus, int sign, const void *base, const void *const *agents,
        const void *const *imps, int k, const float *lambdas, float eps, void *out, int64_t start, int64_t end) {
    const __m512 ve = _mm512_set1_ps(eps), zero = _mm512_setzero_ps();
    int64_t bad = 0;
    for (int64_t s = start; s < end; s += 32) {
        int n = (int)(end - s < 32 ? end - s : 32);
        __m512 be, bo, ae, ao, he, ho;
        __m512 ns_e = zero, ns_o = zero, w_e = zero, w_o = zero, t_e = zero, t_o = zero;
        __m512 c_e = zero, c_o = zero, l_e = zero, l_o = zero;
        wsides16 sd_e = {zero, zero, zero, zero}, sd_o = sd_e;
        __mmask16 bad_h = 0;  /* lanes with a bad importance in some agent */
        load32(in_dtype, base, s, n, &be, &bo);
        for (int t = 0; t < k; t++) {
            const __m512 lt = plus ? _mm512_set1_ps(lambdas[t]) : zero;
            load32(in_dtype, agents[t], s, n, &ae, &ao);
            load_imp32(in_dtype, imp_dtype, imps[t], s, n, &he, &ho);
            wagent16(ae, be, he, ve, lt, plus, t == 0, &ns_e, &w_e, &t_e, &c_e, &l_e, &bad_h, sign ? &sd_e : NULL);
            wagent16(ao, bo, ho, ve, lt, plus, t == 0, &ns_o, &w_o, &t_o, &c_o, &l_o, &bad_h, sign ? &sd_o : NULL);
        }
        bad += __builtin_popcount((uint32_t)bad_h);
        bad += store32(in_dtype, out_dtype, out, s, n, wtheta16(be, ns_e, w_e, c_e, l_e, plus, sign ? &sd_e : NULL),
                       wtheta16(bo, ns_o, w_o, c_o, l_o, plus, sign ? &sd_o : NULL));
    }
    return bad;
}
#define W(I, H, O, P, S, K) wmerge_range(I, H, O, P, S, base, agents, imps, K, lambdas, eps, out, start, end)
#define BY_K4(I, H, O, P, S) switch (k) {                                                                      \
        case 1: return W(I, H, O, P, S, 1); case 2: return W(I, H, O, P, S, 2);                               \
        case 3: return W(I, H, O, P, S, 3); case 4: return W(I, H, O, P, S, 4); default: return W(I, H, O, P, S, k); }
#define BY_PLUS(I, H, O, S) if (lambdas) { BY_K4(I, H, O, 1, S) } BY_K4(I, H, O, 0, S)
#else
/* sides (sign, else NULL): shared="sign"'s sums, 4 rows of BLOCK (wmerge_range's sp, wp, sn, wn) */
#define WBLOCK(NAME, T, FROM, H, HFROM)                                                                          \
static int64_t NAME(const T *base, const T *const *agents, const H *const *imps, int k, const float *lambdas,     \
                    float eps, int64_t s, int n, float *restrict b, float *restrict ns, float *restrict ws,        \
                    float *restrict top, float *restrict cnt, float *restrict lam, float *restrict sides) {       \
    int32_t bad = 0;                                                                                           \
    for (int i = 0; i < n; i++) { b[i] = FROM(base[s + i]); ns[i] = ws[i] = top[i] = cnt[i] = lam[i] = 0.0f; } \
    if (sides) memset(sides, 0, 4 * BLOCK * sizeof *sides);                                                    \
    for (int t = 0; t < k; t++) {                                                                              \
        const T *restrict a = agents[t] + s;                                                                   \
        const H *restrict hp = imps[t] + s;                                                                    \
        const float lt = lambdas ? lambdas[t] : 0.0f;                                                          \
        for (int i = 0; i < n; i++) {                                                                          \
            float d = FROM(a[i]) - b[i];                                                                       \
            if (eps > 0.0f) d = (d >= -eps && d <= eps) ? 0.0f : d;                                            \
            const float h = HFROM(hp[i]);                                                                      \
            bad += bad_importance(h);                                                                          \
            const int act = d != 0.0f;                                                                         \
            const float m = act ? 1.0f : 0.0f;                                                                 \
            float w;                                                                                           \
            cnt[i] = cnt[i] + m;                                                                               \
            lam[i] = lam[i] + m * lt;                                                                          \
            if (t == 0) { top[i] = act ? h : 0.0f; w = m; }                                                    \
            else {                                                                                             \
                const int up = act && h > top[i];                                                              \
                const float r = up ? top[i] / h : 1.0f;                                                        \
                ns[i] = ns[i] * r; ws[i] = ws[i] * r;                                                          \
                if (sides)                                                                                     \
                    for (int j = 0; j < 4; j++) sides[j * BLOCK + i] = sides[j * BLOCK + i] * r;               \
                top[i] = up ? h : top[i];                                                                      \
                w = act ? (top[i] > 0.0f ? h / top[i] : 1.0f) : 0.0f;                                          \
            }                                                                                                  \
            ns[i] = ns[i] - w * d;                                                                             \
            ws[i] = ws[i] + w;                                                                                 \
            if (sides && (d > 0.0f || d < 0.0f)) {                                                             \
                float *side = sides + (d > 0.0f ? 0 : 2 * BLOCK);                                              \
                side[i] = side[i] - w * d;                                                                     \
                side[BLOCK + i] = side[BLOCK + i] + w;                                                         \
            }                                                                                                  \
        }                                                                                                      \
    }                                                                                                          \
    return bad;                                                                                                \
}
WBLOCK(wblock_f32_f32, float, from_f32, float, from_f32)
WBLOCK(wblock_f32_bf16, float, from_f32, uint16_t, from_bf16)
WBLOCK(wblock_bf16_f32, uint16_t, from_bf16, float, from_f32)
WBLOCK(wblock_bf16_bf16, uint16_t, from_bf16, uint16_t, from_bf16)
#endif

/* 512 where the AVX-512 kernel was compiled in, 0 for the portable loops (in every part) */
int ram_weighted_simd_bits(void) {
#ifdef FAST
    return 512;
#else
    return 0;
#endif
}

#ifndef FAST
/* the portable loops: blocks of BLOCK entries (wblock_*), then theta* per entry */
static inline __attribute__((always_inline)) int64_t wmerge_blocks(
        int in_dtype, int imp_dtype, int out_dtype, int sign, const void *base, const void *const *agents,
        const void *const *imps, int k, const float *lambdas, float eps, void *out, int64_t start, int64_t end) {
    float b[BLOCK] __attribute__((aligned(64))), ns[BLOCK] __attribute__((aligned(64)));
    float ws[BLOCK] __attribute__((aligned(64))), top[BLOCK] __attribute__((aligned(64)));
    float cnt[BLOCK] __attribute__((aligned(64))), lam[BLOCK] __attribute__((aligned(64)));
    float sides_buf[4 * BLOCK] __attribute__((aligned(64)));
    float *sides = sign ? sides_buf : NULL;
    int64_t bad = 0;
    for (int64_t s = start; s < end; s += BLOCK) {
        int n = (int)(end - s < BLOCK ? end - s : BLOCK);
        if (in_dtype == 1)
            bad += (imp_dtype == 1 ? wblock_bf16_bf16((const uint16_t *)base, (const uint16_t *const *)agents,
                                                      (const uint16_t *const *)imps, k, lambdas, eps, s, n, b, ns, ws,
                                                      top, cnt, lam, sides)
                                   : wblock_bf16_f32((const uint16_t *)base, (const uint16_t *const *)agents,
                                                     (const float *const *)imps, k, lambdas, eps, s, n, b, ns, ws, top,
                                                     cnt, lam, sides));
        else
            bad += (imp_dtype == 1 ? wblock_f32_bf16((const float *)base, (const float *const *)agents,
                                                     (const uint16_t *const *)imps, k, lambdas, eps, s, n, b, ns, ws,
                                                     top, cnt, lam, sides)
                                   : wblock_f32_f32((const float *)base, (const float *const *)agents,
                                                    (const float *const *)imps, k, lambdas, eps, s, n, b, ns, ws, top,
                                                    cnt, lam, sides));
        for (int i = 0; i < n; i++) {
            float mean = ns[i] / (ws[i] < 1.0f ? 1.0f : ws[i]);
            if (sides && ns[i] > 0.0f) mean = sides[2 * BLOCK + i] / sides[3 * BLOCK + i];
            if (sides && ns[i] < 0.0f) mean = sides[i] / sides[BLOCK + i];
            const float r = b[i] - ((lambdas && cnt[i] == 1.0f) ? ns[i] * lam[i] : mean);
            bad += nonfinite_as(out_dtype, r);
            if (out_dtype == 1) ((uint16_t *)out)[s + i] = to_bf16(r); else ((float *)out)[s + i] = r;
        }
    }
    return bad;
}
#endif

#ifndef FAST
/* The portable vector loop (GCC/Clang vector extensions: 8 float32 lanes with AVX2, 4 elsewhere): per vector of
   entries all agents in registers, the AVX-512 loop's operations in its order (masks as lane selects, one
   quotient per lane: M / h where h is a new maximum, else h / M), so its bits; the last < WNV * WL entries take the
   block loops above (the same values). */
#if defined(__AVX2__)
#include <immintrin.h>
#define WL 8
#else
#define WL 4
#endif
typedef float wvf __attribute__((vector_size(4 * WL)));
typedef int32_t wvi __attribute__((vector_size(4 * WL)));
typedef uint32_t wvu __attribute__((vector_size(4 * WL)));
typedef uint16_t wvh __attribute__((vector_size(2 * WL)));
#define WALWAYS static inline __attribute__((always_inline))
WALWAYS wvf wsplat(float x) { return (wvf){} + x; }
WALWAYS wvu wsplatu(uint32_t x) { return (wvu){} + x; }
WALWAYS wvf wsel(wvi m, wvf a, wvf b) { return (wvf)(((wvi)a & m) | ((wvi)b & ~m)); }
WALWAYS wvf wload(int dtype, const void *p, int64_t i) {
    if (dtype == 1) {
        wvh h;
        memcpy(&h, (const uint16_t *)p + i, sizeof h);
        return (wvf)(__builtin_convertvector(h, wvu) << 16);
    }
    wvf f;
    memcpy(&f, (const float *)p + i, sizeof f);
    return f;
}
WALWAYS void wstore(int dtype, void *p, int64_t i, wvf r) {
    if (dtype == 1) {  /* to_bf16 of scalar.h per lane: round to nearest even, NaN -> 0x7FC0 */
        const wvu u = (wvu)r;
        const wvu v = (u + wsplatu(0x7FFFu) + ((u >> 16) & wsplatu(1u))) >> 16;
        const wvi nan = (wvi)((u & wsplatu(0x7FFFFFFFu)) > wsplatu(0x7F800000u));
        const wvh h = __builtin_convertvector((wvu)(((wvi)wsplatu(0x7FC0u) & nan) | ((wvi)v & ~nan)), wvh);
        memcpy((uint16_t *)p + i, &h, sizeof h);
    } else {
        memcpy((float *)p + i, &r, sizeof r);
    }
}
WALWAYS int wany(wvi m) {
#if defined(__AVX2__)
    return _mm256_movemask_ps((__m256)m) != 0;
#else
    int32_t r = 0;
    for (int l = 0; l < WL; l++) r |= m[l];
    return r != 0;
#endif
}
#define WNV 4  /* vectors per step: independent lanes to overlap the quotients' latency */
/* sign: shared="sign"'s sums as wmerge_range's (sp, wp, sn, wn), and the mean of the side of ns's sign */
WALWAYS int64_t wmerge_vec(int in_dtype, int imp_dtype, int out_dtype, int plus, int sign, const void *base,
                           const void *const *agents, const void *const *imps, int k, const float *lambdas,
                           float eps, void *out, int64_t start, int64_t end) {
    const wvf one = wsplat(1.0f), zero = wsplat(0.0f), ve = wsplat(eps), inf = (wvf)wsplatu(0x7F800000u);
    wvi bad = (wvi)wsplatu(0);  /* per lane: entries with a bad importance or a non-finite result */
    for (int64_t s = start; s + WNV * WL <= end; s += WNV * WL) {
        wvf b[WNV], ns[WNV], ws[WNV], top[WNV], cnt[WNV], lam[WNV], sp[WNV], wp[WNV], sn[WNV], wn[WNV];
        wvi badh[WNV];
        for (int v = 0; v < WNV; v++) {
            b[v] = wload(in_dtype, base, s + v * WL);
            ns[v] = ws[v] = top[v] = cnt[v] = lam[v] = sp[v] = wp[v] = sn[v] = wn[v] = zero;
            badh[v] = (wvi)wsplatu(0);
        }
        for (int t = 0; t < k; t++) {
            for (int v = 0; v < WNV; v++) {
                const wvf d = wload(in_dtype, agents[t], s + v * WL) - b[v];
                const wvf h = wload(imp_dtype, imps[t], s + v * WL);
                const wvi m = ~(wvi)((wvf)((wvu)d & wsplatu(0x7FFFFFFFu)) <= ve);
                badh[v] |= ~(wvi)(h >= zero) | (wvi)(h == inf);
                cnt[v] = wsel(m, cnt[v] + one, cnt[v]);
                if (plus) lam[v] = wsel(m, wsplat(lambdas[t]), lam[v]);
                const wvi dn = m & (wvi)(d < zero), dp = m & ~dn;
                if (t == 0) {
                    top[v] = wsel(m, h, zero);
                    ns[v] = wsel(m, ns[v] - d, ns[v]);
                    ws[v] = wsel(m, ws[v] + one, ws[v]);
                    if (sign) {
                        sp[v] = wsel(dp, sp[v] - d, sp[v]);
                        wp[v] = wsel(dp, wp[v] + one, wp[v]);
                        sn[v] = wsel(dn, sn[v] - d, sn[v]);
                        wn[v] = wsel(dn, wn[v] + one, wn[v]);
                    }
                    continue;
                }
                if (!wany(m)) continue;
                const wvi up = m & (wvi)(h > top[v]);
                const wvi pos = m & ~up & (wvi)(top[v] > zero);
                const wvf q = wsel(up | pos, wsel(up, top[v], h) / wsel(up, h, top[v]), one);
                ns[v] = wsel(up, ns[v] * q, ns[v]);
                ws[v] = wsel(up, ws[v] * q, ws[v]);
                if (sign) {
                    sp[v] = wsel(up, sp[v] * q, sp[v]);
                    wp[v] = wsel(up, wp[v] * q, wp[v]);
                    sn[v] = wsel(up, sn[v] * q, sn[v]);
                    wn[v] = wsel(up, wn[v] * q, wn[v]);
                }
                top[v] = wsel(up, h, top[v]);
                const wvf w = wsel(up, one, q), wd = w * d;
                ns[v] = wsel(m, ns[v] - wd, ns[v]);
                ws[v] = wsel(m, ws[v] + w, ws[v]);
                if (sign) {
                    sp[v] = wsel(dp, sp[v] - wd, sp[v]);
                    wp[v] = wsel(dp, wp[v] + w, wp[v]);
                    sn[v] = wsel(dn, sn[v] - wd, sn[v]);
                    wn[v] = wsel(dn, wn[v] + w, wn[v]);
                }
            }
        }
        for (int v = 0; v < WNV; v++) {
            wvf num = ns[v], den = wsel((wvi)(ws[v] < one), one, ws[v]);
            if (sign) {
                const wvi gt = (wvi)(ns[v] > zero), lt = (wvi)(ns[v] < zero);
                num = wsel(lt, sp[v], wsel(gt, sn[v], num));
                den = wsel(lt, wp[v], wsel(gt, wn[v], den));
            }
            wvf r = num / den;
            if (plus) r = wsel((wvi)(cnt[v] == one), ns[v] * lam[v], r);
            r = b[v] - r;
            wstore(out_dtype, out, s + v * WL, r);
            const wvu lim = wsplatu(out_dtype == 1 ? 0x7F7F8000u : 0x7F800000u);
            bad -= badh[v] | (wvi)(((wvu)r & wsplatu(0x7FFFFFFFu)) >= lim);
        }
    }
    int64_t total = 0;
    for (int l = 0; l < WL; l++) total += bad[l];
    return total;
}
/* the vector loop, then the block loops for the last < WNV * WL entries */
WALWAYS int64_t wmerge_portable(int in_dtype, int imp_dtype, int out_dtype, int plus, int sign, const void *base,
                                const void *const *agents, const void *const *imps, int k, const float *lambdas,
                                float eps, void *out, int64_t start, int64_t end) {
    const int64_t tail = end - (end - start) % (WNV * WL);
    int64_t bad = wmerge_vec(in_dtype, imp_dtype, out_dtype, plus, sign, base, agents, imps, k, lambdas, eps, out,
                             start, tail);
    if (tail < end)
        bad += wmerge_blocks(in_dtype, imp_dtype, out_dtype, sign, base, agents, imps, k, lambdas, eps, out, tail,
                             end);
    return bad;
}
#define WPORT(I, H, O, P, S) return wmerge_portable(I, H, O, P, S, base, agents, imps, k, lambdas, eps, out, start, \
                                                    end);
#endif

/* The build in parts (see ram.c): ram_live/kernels/cc.py compiles each part (-DRAM_PART=n) into a library of its own
   when a call first needs it, one per input and importance dtype (ram_live/methods/ram/native_weighted.py's PARTS); part
   0 is ram_weighted_simd_bits alone. Compiled without RAM_PART, one library holds every part.

   theta* over [start, end) into out, the shared entries' mean weighted by imps; lambdas NULL: RAM; sign nonzero:
   shared="sign" (the weighted mean of the agents whose tau has the sign of the weighted sum). Returns the number
   of non-finite results plus (at least 1 where there are any) bad importances: 0 iff all is well. dtype codes: 0
   float32, 1 bfloat16. */
#define RAM_PARTS 5
#ifdef RAM_PART
#define IN_PART(n) (RAM_PART == (n))
#else
#define IN_PART(n) 1
#endif
#define WEIGHTED_ARGS int out_dtype, const void *base, const void *const *agents, const void *const *imps, int k, \
                      const float *lambdas, float eps, void *out, int64_t start, int64_t end, int sign
#ifdef FAST
#define WEIGHTED(I, H) if (out_dtype == I) { if (sign) { BY_PLUS(I, H, I, 1) } BY_PLUS(I, H, I, 0) }          \
                       return sign ? W(I, H, out_dtype, lambdas != 0, 1, k) : W(I, H, out_dtype, lambdas != 0, 0, k);
#else
#define WEIGHTED(I, H) if (sign) { WSIGNED(I, H, 1) } WSIGNED(I, H, 0)
#define WSIGNED(I, H, S) if (lambdas) { if (out_dtype == 1) { WPORT(I, H, 1, 1, S) } WPORT(I, H, 0, 1, S) }  \
                         if (out_dtype == 1) { WPORT(I, H, 1, 0, S) } WPORT(I, H, 0, 0, S)
#endif
#if IN_PART(1)
int64_t ram_merge_weighted_bf16_bf16(WEIGHTED_ARGS) { WEIGHTED(1, 1) }
#endif
#if IN_PART(2)
int64_t ram_merge_weighted_bf16_f32(WEIGHTED_ARGS) { WEIGHTED(1, 0) }
#endif
#if IN_PART(3)
int64_t ram_merge_weighted_f32_bf16(WEIGHTED_ARGS) { WEIGHTED(0, 1) }
#endif
#if IN_PART(4)
int64_t ram_merge_weighted_f32_f32(WEIGHTED_ARGS) { WEIGHTED(0, 0) }
#endif
