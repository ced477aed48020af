/* AVX-512 (F, BW, DQ) loads and stores of 32 float32/bfloat16 entries, shared by the merge, importance and probe
   kernels. Included only where __AVX512F__, __AVX512BW__ and __AVX512DQ__ are defined. */
#ifndef RAM_AVX512_H
#define RAM_AVX512_H
#include <immintrin.h>
/* n <= 32 entries at p + s as two float32 vectors (n <= 0: zeros). bf16: the pairs in 32-bit lanes, << 16 the even
   entry and & 0xFFFF0000 the odd one, so the lanes hold a fixed permutation of the entries, the same for every
   input, which counts, sums and dot products do not see. Masked-off lanes of a tail load 0 in the base and the
   agents alike: tau = 0, inactive. */
static inline void load32(int dtype, const void *p, int64_t s, int n, __m512 *lo, __m512 *hi) {
    if (n <= 0) { *lo = *hi = _mm512_setzero_ps(); return; }
    if (dtype == 1) {
        const uint16_t *h = (const uint16_t *)p + s;
        __m512i x = n >= 32 ? _mm512_loadu_si512(h) : _mm512_maskz_loadu_epi16((__mmask32)((1u << n) - 1u), h);
        *lo = _mm512_castsi512_ps(_mm512_slli_epi32(x, 16));
        *hi = _mm512_castsi512_ps(_mm512_and_si512(x, _mm512_set1_epi32((int)0xFFFF0000u)));
    } else {
        const float *f = (const float *)p + s;
        if (n >= 32) { *lo = _mm512_loadu_ps(f); *hi = _mm512_loadu_ps(f + 16); return; }
        *lo = _mm512_maskz_loadu_ps((__mmask16)(n >= 16 ? 0xFFFFu : (1u << n) - 1u), f);
        *hi = _mm512_maskz_loadu_ps((__mmask16)(n > 16 ? (1u << (n - 16)) - 1u : 0u), f + 16);
    }
}
/* float32 bits -> bfloat16 in the low half of each lane: round to nearest even, NaN -> 0x7FC0 */
static inline __m512i bf16x16(__m512 r) {
    __m512i u = _mm512_castps_si512(r);
    __m512i lsb = _mm512_and_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(1));
    __m512i v = _mm512_srli_epi32(_mm512_add_epi32(_mm512_add_epi32(u, _mm512_set1_epi32(0x7FFF)), lsb), 16);
    __mmask16 nan = _mm512_cmpgt_epu32_mask(_mm512_and_si512(u, _mm512_set1_epi32(0x7FFFFFFF)),
                                            _mm512_set1_epi32(0x7F800000));
    return _mm512_mask_mov_epi32(v, nan, _mm512_set1_epi32(0x7FC0));
}
/* Store the n <= 32 results lo/hi (in load32's lane order) at out + s; returns how many are not finite as stored
   (bfloat16: |x| from 0x7F7F8000 up rounds to Inf; unordered, NaN, counts too). */
static inline __attribute__((always_inline)) int store32(int in_dtype, int out_dtype, void *out, int64_t s, int n,
                                                         __m512 lo, __m512 hi) {
    const __mmask32 all = n >= 32 ? 0xFFFFFFFFu : (1u << n) - 1u;
    const __mmask16 m_lo = (__mmask16)all, m_hi = (__mmask16)(all >> 16);
    const __m512 top = _mm512_castsi512_ps(_mm512_set1_epi32(out_dtype == 1 ? 0x7F7F8000 : 0x7F800000));
    int bad = __builtin_popcount((uint32_t)_mm512_cmp_ps_mask(_mm512_abs_ps(lo), top, _CMP_NLT_UQ))
            + __builtin_popcount((uint32_t)_mm512_cmp_ps_mask(_mm512_abs_ps(hi), top, _CMP_NLT_UQ));
    if (in_dtype == 1 && out_dtype == 1) {  /* even entries in the low halves, odd ones in the high halves */
        __m512i v = _mm512_or_si512(bf16x16(lo), _mm512_slli_epi32(bf16x16(hi), 16));
        _mm512_mask_storeu_epi16((uint16_t *)out + s, all, v);
    } else if (out_dtype == 1) {
        __m512i v = _mm512_inserti64x4(_mm512_castsi256_si512(_mm512_cvtepi32_epi16(bf16x16(lo))),
                                       _mm512_cvtepi32_epi16(bf16x16(hi)), 1);
        _mm512_mask_storeu_epi16((uint16_t *)out + s, all, v);
    } else {
        if (in_dtype == 1) {  /* back to entry order: interleave the even and odd lanes */
            const __m512i i_lo = _mm512_set_epi32(23, 7, 22, 6, 21, 5, 20, 4, 19, 3, 18, 2, 17, 1, 16, 0);
            const __m512i i_hi = _mm512_set_epi32(31, 15, 30, 14, 29, 13, 28, 12, 27, 11, 26, 10, 25, 9, 24, 8);
            __m512 e = lo;
            lo = _mm512_permutex2var_ps(e, i_lo, hi);
            hi = _mm512_permutex2var_ps(e, i_hi, hi);
        }
        _mm512_mask_storeu_ps((float *)out + s, m_lo, lo);
        _mm512_mask_storeu_ps((float *)out + s + 16, m_hi, hi);
    }
    return bad;
}
#endif
