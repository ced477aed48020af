/* The snapshot store's 8-bit importance codes (ram_live/kernels/codes.py; the format: ram_live/store/importance_codes.py).
   Built by ram_live/kernels/cc.py. Integer operations only, so every build level gives the bits of the torch path.

   ram_imp_encode reads the importances at a piece's stored entries once (all of them, at int32/int64 indices or
   at a bitmask's set bits), block by block: it checks them, keeps their running maximum and writes each block's
   codes against it. The maximum grows a few times at most (its octave only rises, 2040 values), and codes written
   against an older maximum are exact functions of the final one (a code q > lo of octave o is o + 255 - top; one
   at the lower clamp stays there): ram_imp_fix moves those, only where the maximum did grow. Decoding writes a
   piece's float32 importances, 0 at entries it does not store. */
#include <stdint.h>
#include <string.h>

#define NEG_ZERO 0x80000000u
#define INF_BITS 0x7F800000u
#define TOP_OCTAVE 2039  /* the octave of 1.875 * 2^127; 2040 (values from 1.9375 * 2^127 on) would decode as Inf */
#define BLOCK 1024

/* -0.0 reads as +0.0 (>= 0, code 0 like it); every other value with the sign bit set stays above INF_BITS, so
   the largest bits of a block are >= INF_BITS iff some importance in it is negative, NaN or Inf. Branch-free
   (the compiler vectorises the loops). */
static inline uint32_t unsign_zero(uint32_t b) { return b & (0u - (uint32_t)(b != NEG_ZERO)); }
/* float32 bits -> exponent and 3 mantissa bits, rounded to nearest (at most TOP_OCTAVE) */
static inline int32_t octave_of(uint32_t v) {
    const int32_t o = (int32_t)((v + (1u << 19)) >> 20);
    return o > TOP_OCTAVE ? TOP_OCTAVE : o;
}

static inline uint32_t max_block(const uint32_t *restrict h, int m, uint32_t mx) {
    for (int i = 0; i < m; i++) {
        const uint32_t v = unsign_zero(h[i]);
        mx = v > mx ? v : mx;
    }
    return mx;
}
/* codes of h[0, m) against a maximum of octave top: octave + 255 - top clamped to [max(1, 256 - top), 255],
   0 for 0 */
static inline void codes_block(const uint32_t *restrict h, int m, int32_t top, uint8_t *restrict out) {
    const int32_t shift = 255 - top, lo = 256 - top > 1 ? 256 - top : 1;
    for (int i = 0; i < m; i++) {
        const uint32_t v = unsign_zero(h[i]);
        int32_t q = octave_of(v) + shift;
        q = q < lo ? lo : q;
        q = q > 255 ? 255 : q;
        out[i] = (uint8_t)(q & -(int32_t)(v != 0));
    }
}

#if defined(__AVX512F__)
#include <immintrin.h>
#define STEP 16
/* the float32 bits of the marked entries of h[i, i + 16) (bits16: their mask) at buf, in order; returns how many */
static inline int compress_f32(const uint32_t *h, uint32_t bits16, uint32_t *buf) {
    const __m512i x = _mm512_loadu_si512(h);
    _mm512_storeu_si512(buf, _mm512_maskz_compress_epi32((__mmask16)bits16, x));
    return __builtin_popcount(bits16);
}
static inline int compress_bf16(const uint16_t *h, uint32_t bits16, uint32_t *buf) {
    const __m512i x = _mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i *)h)), 16);
    _mm512_storeu_si512(buf, _mm512_maskz_compress_epi32((__mmask16)bits16, x));
    return __builtin_popcount(bits16);
}
#elif defined(__AVX2__) && defined(__BMI2__)
#include <immintrin.h>
#define STEP 8
/* AVX2 has no compress: the lane order of the marked entries from the mask by pdep/pext */
static inline __m256i order8(uint32_t bits8) {
    const uint64_t spread = _pdep_u64(bits8, 0x0101010101010101ull) * 0xFFu;
    const uint64_t lanes = _pext_u64(0x0706050403020100ull, spread);
    return _mm256_cvtepu8_epi32(_mm_cvtsi64_si128((long long)lanes));
}
static inline int compress_f32(const uint32_t *h, uint32_t bits8, uint32_t *buf) {
    const __m256i x = _mm256_loadu_si256((const __m256i *)h);
    _mm256_storeu_si256((__m256i *)buf, _mm256_permutevar8x32_epi32(x, order8(bits8)));
    return __builtin_popcount(bits8);
}
static inline int compress_bf16(const uint16_t *h, uint32_t bits8, uint32_t *buf) {
    const __m256i x = _mm256_slli_epi32(_mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)h)), 16);
    _mm256_storeu_si256((__m256i *)buf, _mm256_permutevar8x32_epi32(x, order8(bits8)));
    return __builtin_popcount(bits8);
}
#else
#define STEP 8
/* branch-free: every entry is stored, then the count moves on by its bit */
static inline int compress_f32(const uint32_t *h, uint32_t bits8, uint32_t *buf) {
    int m = 0;
    for (int j = 0; j < 8; j++) { buf[m] = h[j]; m += (bits8 >> j) & 1u; }
    return m;
}
static inline int compress_bf16(const uint16_t *h, uint32_t bits8, uint32_t *buf) {
    int m = 0;
    for (int j = 0; j < 8; j++) { buf[m] = (uint32_t)h[j] << 16; m += (bits8 >> j) & 1u; }
    return m;
}
#endif


/* STEP mask bits from entry i (a multiple of 8) on: bit j of byte b is entry 8b + j */
static inline uint32_t mask_bits(const uint8_t *mask, int64_t i) {
#if STEP == 16
    uint16_t w;
    memcpy(&w, mask + (i >> 3), 2);
    return w;
#else
    return mask[i >> 3];
#endif
}
static inline uint32_t widen(int dtype, const void *h, int64_t i) {
    return dtype ? (uint32_t)((const uint16_t *)h)[i] << 16 : ((const uint32_t *)h)[i];
}

/* the float32 bits of the importances of the stored entries of block [b, e) (entries for dense and bitmask,
   positions of idx for indices) into buf; returns how many, *out |= 1 for an index outside [0, n) */
static inline int gather(int dtype, int kind, const void *restrict h, const void *restrict pos, int64_t n,
                         int64_t b, int64_t e, uint32_t *restrict buf, uint32_t *out) {
    int m = 0;
    if (kind == 0) {
        if (dtype) for (int64_t i = b; i < e; i++) buf[m++] = (uint32_t)((const uint16_t *)h)[i] << 16;
        else memcpy(buf, (const uint32_t *)h + b, (size_t)(e - b) * 4);
        return (int)(e - b);
    }
    if (kind == 1 || kind == 2) {
        uint32_t bad = 0;
        for (int64_t j = b; j < e; j++) {
            const uint64_t i = kind == 1 ? (uint64_t)(int64_t)((const int32_t *)pos)[j] : (uint64_t)((const int64_t *)pos)[j];
            const int inside = i < (uint64_t)n;
            bad |= !inside;
            buf[m++] = widen(dtype, h, inside ? (int64_t)i : 0);
        }
        *out |= bad;
        return m;
    }
    const uint8_t *mask = (const uint8_t *)pos;
    int64_t i = b;
    if (dtype) for (; i + STEP <= e; i += STEP) m += compress_bf16((const uint16_t *)h + i, mask_bits(mask, i), buf + m);
    else for (; i + STEP <= e; i += STEP) m += compress_f32((const uint32_t *)h + i, mask_bits(mask, i), buf + m);
    for (; i < e; i++) {
        buf[m] = widen(dtype, h, i);
        m += (mask[i >> 3] >> (i & 7)) & 1u;
    }
    return m;
}

/* The codes of the importances h (dtype 0 float32, 1 bfloat16) at the stored entries [start, end) of a piece:
   kind 0 dense (entries), 1 int32 / 2 int64 indices (positions of idx, each in [0, n)), 3 bitmask (entries;
   start a multiple of 8), written to codes in order, against the running maximum. *mx: the largest float32 bits
   (0 for none); segs[2 s], segs[2 s + 1]: where the codes against octave top begin, and that top (nseg of them,
   at most 2041). Returns the number of codes, -1 where an importance is negative, NaN or Inf, -2 for an index
   outside [0, n). ram_imp_fix then brings them to the piece's maximum. */
int64_t ram_imp_encode(int dtype, const void *h, int kind, const void *pos, int64_t n, int64_t start,
                       int64_t end, uint8_t *codes, uint32_t *mx_out, int64_t *segs, int32_t *nseg) {
    uint32_t buf[BLOCK + STEP];
    uint32_t mx = 0, out = 0;
    int32_t top = -1, ns = 0;
    int64_t c = 0;
    for (int64_t b = start; b < end; b += BLOCK) {
        const int64_t e = end - b < BLOCK ? end : b + BLOCK;
        const uint32_t *p = buf;
        int m;
        if (kind == 0 && dtype == 0) {
            p = (const uint32_t *)h + b;
            m = (int)(e - b);
        } else {
            m = gather(dtype, kind, h, pos, n, b, e, buf, &out);
        }
        mx = max_block(p, m, mx);
        if (mx >= INF_BITS) break;
        const int32_t t = octave_of(mx);
        if (t != top) {
            segs[2 * ns] = c;
            segs[2 * ns + 1] = t;
            ns++;
            top = t;
        }
        codes_block(p, m, top, codes + c);
        c += m;
    }
    *mx_out = mx;
    *nseg = ns;
    return out ? -2 : mx >= INF_BITS ? -1 : c;
}

/* codes [0, count) written by ram_imp_encode (segments segs, nseg) -> codes against a maximum of octave top */
void ram_imp_fix(uint8_t *restrict codes, int64_t count, const int64_t *segs, int32_t nseg, int32_t top) {
    const int32_t lo = 256 - top > 1 ? 256 - top : 1;
    for (int32_t s = 0; s < nseg; s++) {
        const int32_t d = top - (int32_t)segs[2 * s + 1];
        if (d <= 0) continue;
        const int64_t e = s + 1 < nseg ? segs[2 * s + 2] : count;
        for (int64_t i = segs[2 * s]; i < e; i++) {
            const int32_t q0 = codes[i];
            int32_t q = q0 - d;
            q = q < lo ? lo : q;
            codes[i] = (uint8_t)(q & -(int32_t)(q0 != 0));
        }
    }
}

/* set bits of mask bytes [start, end) */
int64_t ram_imp_popcount(const uint8_t *mask, int64_t start, int64_t end) {
    int64_t c = 0, i = start;
    for (; i + 8 <= end; i += 8) {
        uint64_t w;
        memcpy(&w, mask + i, 8);
        c += __builtin_popcountll(w);
    }
    for (; i < end; i++) c += __builtin_popcount(mask[i]);
    return c;
}

/* codes -> float32 bits: (code + top - 255) << 20, 0 for code 0 */
static inline uint32_t decode1(uint32_t q, int32_t top) {
    return ((uint32_t)((int32_t)q + top - 255) << 20) & (0u - (q != 0));
}

/* A bitmask piece's decoding DSTEP entries at a time: the codes of the marked entries expanded into their lanes
   (AVX-512 expand; AVX2: a pdep lane order), decoded and stored (0 where not marked); DSTEP 0: no such step. */
#if defined(__AVX512F__) && defined(__AVX512BW__)
#define DSTEP 16
static inline __m512i dec_vec(const uint8_t *codes, uint32_t bits, int32_t top) {
    const __m512i q = _mm512_maskz_expand_epi32((__mmask16)bits,
                                                _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)codes)));
    const __m512i v = _mm512_slli_epi32(_mm512_add_epi32(q, _mm512_set1_epi32(top - 255)), 20);
    return _mm512_maskz_mov_epi32(_mm512_test_epi32_mask(q, q), v);
}
static inline void dec_store_f32(uint32_t *out, __m512i v) { _mm512_storeu_si512(out, v); }
static inline void dec_store_bf16(uint16_t *out, __m512i v) {
    _mm256_storeu_si256((__m256i *)out, _mm512_cvtepi32_epi16(_mm512_srli_epi32(v, 16)));
}
#elif defined(__AVX2__) && defined(__BMI2__)
#define DSTEP 8
static inline __m256i dec_vec(const uint8_t *codes, uint32_t bits, int32_t top) {
    const uint64_t spread = _pdep_u64(bits, 0x0101010101010101ull) * 0xFFu;
    const __m256i lanes = _mm256_cvtepu8_epi32(_mm_cvtsi64_si128((long long)_pdep_u64(0x0706050403020100ull, spread)));
    const __m256i on = _mm256_cvtepi8_epi32(_mm_cvtsi64_si128((long long)spread));
    const __m256i raw = _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)codes));
    const __m256i q = _mm256_and_si256(_mm256_permutevar8x32_epi32(raw, lanes), on);
    const __m256i v = _mm256_slli_epi32(_mm256_add_epi32(q, _mm256_set1_epi32(top - 255)), 20);
    return _mm256_andnot_si256(_mm256_cmpeq_epi32(q, _mm256_setzero_si256()), v);
}
static inline void dec_store_f32(uint32_t *out, __m256i v) { _mm256_storeu_si256((__m256i *)out, v); }
static inline void dec_store_bf16(uint16_t *out, __m256i v) {
    const __m256i p = _mm256_permute4x64_epi64(_mm256_packus_epi32(_mm256_srli_epi32(v, 16), v), 0x08);
    _mm_storeu_si128((__m128i *)out, _mm256_castsi256_si128(p));
}
#else
#define DSTEP 0
static inline int dec_vec(const uint8_t *codes, uint32_t bits, int32_t top) { (void)codes; (void)bits; return top; }
static inline void dec_store_f32(uint32_t *out, int v) { (void)out; (void)v; }
static inline void dec_store_bf16(uint16_t *out, int v) { (void)out; (void)v; }
#endif

/* a piece's importances into out[0, n) as float32 (OT uint32_t) or bfloat16 (uint16_t: exact, a decoded value's
   low 16 bits are 0): kind as ram_imp_encode's (1, 2: count indices; 3: a bitmask of n entries), 0 at entries
   not stored. Returns 0, or -1 where the positions do not match the codes (an index outside [0, n), a bitmask
   marking another number of entries than count, a dense piece of count != n). */
#define DECODE(NAME, OT, SHIFT, STORE)                                                                           \
static int64_t NAME(const uint8_t *restrict codes, int64_t count, int32_t top, int kind, const void *pos,         \
                    int64_t n, OT *restrict out) {                                                               \
    if (kind == 0) {                                                                                             \
        if (count != n) return -1;                                                                               \
        for (int64_t i = 0; i < n; i++) out[i] = (OT)(decode1(codes[i], top) >> SHIFT);                          \
        return 0;                                                                                                \
    }                                                                                                            \
    if (kind == 1 || kind == 2) {                                                                                \
        memset(out, 0, (size_t)n * sizeof(OT));                                                                  \
        uint32_t bad = 0;                                                                                        \
        for (int64_t j = 0; j < count; j++) {                                                                    \
            const int64_t i = kind == 1 ? (int64_t)((const int32_t *)pos)[j] : ((const int64_t *)pos)[j];        \
            const int inside = i >= 0 && i < n;                                                                  \
            bad |= !inside;                                                                                      \
            if (inside) out[i] = (OT)(decode1(codes[j], top) >> SHIFT);                                          \
        }                                                                                                        \
        return bad ? -1 : 0;                                                                                     \
    }                                                                                                            \
    if (kind != 3) return -1;                                                                                    \
    const uint8_t *mask = (const uint8_t *)pos;                                                                  \
    if (count == 0) {  /* a bitmask with set bits and no codes: caught by the count at the end */               \
        memset(out, 0, (size_t)n * sizeof(OT));                                                                  \
        return ram_imp_popcount(mask, 0, (n + 7) >> 3) ? -1 : 0;                                                 \
    }                                                                                                            \
    int64_t c = 0, b = 0;                                                                                        \
    for (; DSTEP && b + DSTEP <= n && c + DSTEP <= count; b += DSTEP) { /* DSTEP entries at a time */            \
        const uint32_t bits = DSTEP == 16 ? (uint32_t)mask[b >> 3] | (uint32_t)mask[(b >> 3) + 1] << 8           \
                                          : mask[b >> 3];                                                        \
        STORE(out + b, dec_vec(codes + c, bits, top));                                                           \
        c += __builtin_popcount(bits);                                                                           \
    }                                                                                                            \
    for (; b < n; b += 8) {                                                                                      \
        const uint32_t m = mask[b >> 3];                                                                         \
        const int e = n - b < 8 ? (int)(n - b) : 8;                                                              \
        if (!m) {                                                                                                \
            memset(out + b, 0, (size_t)e * sizeof(OT));                                                          \
            continue;                                                                                            \
        }                                                                                                        \
        if (m == 0xFFu && e == 8 && c + 8 <= count) {                                                            \
            for (int j = 0; j < 8; j++) out[b + j] = (OT)(decode1(codes[c + j], top) >> SHIFT);                  \
            c += 8;                                                                                              \
            continue;                                                                                            \
        }                                                                                                        \
        for (int j = 0; j < e; j++) {  /* branch-free: a read past the codes is clamped, and caught below */    \
            const uint32_t on = (m >> j) & 1u;                                                                   \
            const uint32_t v = decode1(codes[c < count ? c : count - 1], top);                                   \
            out[b + j] = (OT)((v & (0u - on)) >> SHIFT);                                                         \
            c += on;                                                                                             \
        }                                                                                                        \
    }                                                                                                            \
    return c == count ? 0 : -1;                                                                                  \
}
DECODE(decode_f32, uint32_t, 0, dec_store_f32)
DECODE(decode_bf16, uint16_t, 16, dec_store_bf16)

/* out_dtype 0: float32, 1: bfloat16 (the same values) */
int64_t ram_imp_decode(const uint8_t *codes, int64_t count, int32_t top, int kind, const void *pos, int64_t n,
                       int out_dtype, void *out) {
    return out_dtype ? decode_bf16(codes, count, top, kind, pos, n, (uint16_t *)out)
                     : decode_f32(codes, count, top, kind, pos, n, (uint32_t *)out);
}
