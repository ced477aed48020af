/* The snapshot store's 8-bit importance codes (ram_live/_codes_native.py; the format: ram_live/store/importance.py).
   Built by ram_live/_cc.py. Integer operations only, so every build level gives the bits of the torch path.

   Encoding takes two calls. ram_imp_scan reads the importances at the stored entries of a piece once (all of
   them, at int32/int64 indices or at a bitmask's set bits), checks them, takes their largest float32 bits and
   writes each one's "octave + 1" (0 for +-0) as uint16; ram_imp_codes turns those into the codes once the
   piece's maximum is known. Decoding writes a piece's float32 importances, 0 at entries it does not store. */
#include <stdint.h>
#include <string.h>

#define NEG_ZERO 0x80000000u
#define INF_BITS 0x7F800000u

#define BLOCK 1024

/* -0.0 reads as +0.0 (>= 0, code 0 like it); every other value with the sign bit set stays above INF_BITS, so
   the largest bits of a range are >= INF_BITS iff some importance is negative, NaN or Inf. Branch-free (the
   compiler vectorises the loop). */
static inline uint32_t unsign_zero(uint32_t b) { return b & (0u - (uint32_t)(b != NEG_ZERO)); }

/* h[0, m) as float32 bits -> octave + 1 (exponent and 3 mantissa bits, rounded to nearest), 0 for 0; returns the
   largest bits seen together with mx */
static inline uint32_t octaves(const uint32_t *restrict h, int64_t m, uint16_t *restrict s, uint32_t mx) {
    for (int64_t i = 0; i < m; i++) {
        const uint32_t v = unsign_zero(h[i]);
        mx = v > mx ? v : mx;
        s[i] = (uint16_t)(((v + (1u << 19)) >> 20) + (v != 0));
    }
    return mx;
}
static inline uint32_t octaves16(const uint16_t *restrict h, int64_t m, uint16_t *restrict s, uint32_t mx) {
    for (int64_t i = 0; i < m; i++) {
        const uint32_t v = unsign_zero((uint32_t)h[i] << 16);
        mx = v > mx ? v : mx;
        s[i] = (uint16_t)(((v + (1u << 19)) >> 20) + (v != 0));
    }
    return mx;
}

/* indices [start, end) of idx: the importances gathered block by block (an index outside [0, n) reads entry 0
   and is reported), then their octaves */
#define SCAN_INDEX(NAME, T, I, OCT)                                                                              \
static int64_t NAME(const T *restrict h, const I *restrict idx, int64_t n, int64_t start, int64_t end,           \
                    uint16_t *restrict s, uint32_t *top) {                                                       \
    T buf[BLOCK];                                                                                                \
    uint32_t mx = 0, out = 0;                                                                                    \
    for (int64_t j = start; j < end; j += BLOCK) {                                                               \
        const int m = end - j < BLOCK ? (int)(end - j) : BLOCK;                                                  \
        for (int q = 0; q < m; q++) {                                                                            \
            const uint64_t i = (uint64_t)(int64_t)idx[j + q];                                                    \
            const int inside = i < (uint64_t)n;                                                                  \
            out |= !inside;                                                                                      \
            buf[q] = h[inside ? i : 0];                                                                          \
        }                                                                                                        \
        mx = OCT(buf, m, s + (j - start), mx);                                                                   \
    }                                                                                                            \
    *top = mx;                                                                                                   \
    return out ? -2 : mx >= INF_BITS ? -1 : end - start;                                                         \
}
SCAN_INDEX(scan_i32_f32, uint32_t, int32_t, octaves)
SCAN_INDEX(scan_i32_bf16, uint16_t, int32_t, octaves16)
SCAN_INDEX(scan_i64_f32, uint32_t, int64_t, octaves)
SCAN_INDEX(scan_i64_bf16, uint16_t, int64_t, octaves16)

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

/* entries [start, end) of a bitmask (start a multiple of 8): the marked importances gathered as float32 bits
   block by block, then their octaves */
#define SCAN_BITS(NAME, T, COMPRESS, WIDEN)                                                                      \
static int64_t NAME(const T *restrict h, const uint8_t *restrict mask, int64_t start, int64_t end,               \
                    uint16_t *restrict s, uint32_t *top) {                                                       \
    uint32_t buf[BLOCK + STEP];                                                                                  \
    uint32_t mx = 0;                                                                                             \
    int64_t c = 0;                                                                                               \
    for (int64_t b = start; b < end; b += BLOCK) {                                                               \
        const int64_t e = end - b < BLOCK ? end : b + BLOCK;                                                     \
        int m = 0;                                                                                               \
        int64_t i = b;                                                                                           \
        for (; i + STEP <= e; i += STEP) {                                                                       \
            const uint32_t bits = mask_bits(mask, i);                                                            \
            m += COMPRESS(h + i, bits, buf + m);  /* a zero mask writes nothing the count keeps */                                                    \
        }                                                                                                        \
        for (; i < e; i++) {                                                                                     \
            buf[m] = WIDEN(h[i]);                                                                                \
            m += (mask[i >> 3] >> (i & 7)) & 1u;                                                                 \
        }                                                                                                        \
        mx = octaves(buf, m, s + c, mx);                                                                         \
        c += m;                                                                                                  \
    }                                                                                                            \
    *top = mx;                                                                                                   \
    return mx >= INF_BITS ? -1 : c;                                                                              \
}
static inline uint32_t widen_f32(uint32_t x) { return x; }
static inline uint32_t widen_bf16(uint16_t x) { return (uint32_t)x << 16; }
SCAN_BITS(scan_bits_f32, uint32_t, compress_f32, widen_f32)
SCAN_BITS(scan_bits_bf16, uint16_t, compress_bf16, widen_bf16)

static int64_t scan_dense_f32(const uint32_t *h, int64_t start, int64_t end, uint16_t *s, uint32_t *top) {
    *top = octaves(h + start, end - start, s, 0);
    return *top >= INF_BITS ? -1 : end - start;
}
static int64_t scan_dense_bf16(const uint16_t *h, int64_t start, int64_t end, uint16_t *s, uint32_t *top) {
    *top = octaves16(h + start, end - start, s, 0);
    return *top >= INF_BITS ? -1 : end - start;
}

/* kind: 0 dense (entries [start, end)), 1 int32 indices, 2 int64 indices (positions [start, end) of idx, each in
   [0, n)), 3 bitmask (entries [start, end), start a multiple of 8). dtype: 0 float32,
   1 bfloat16. Returns the number of uint16 written to s, -1 where an importance is negative, NaN or Inf, -2 for an
   index outside [0, n). *top: the largest float32 bits among them (0 for none). */
int64_t ram_imp_scan(int dtype, const void *h, int kind, const void *pos, int64_t n, int64_t start, int64_t end,
                     uint16_t *s, uint32_t *top) {
    *top = 0;
    if (end <= start) return 0;
    switch (kind * 2 + dtype) {
    case 0: return scan_dense_f32((const uint32_t *)h, start, end, s, top);
    case 1: return scan_dense_bf16((const uint16_t *)h, start, end, s, top);
    case 2: return scan_i32_f32((const uint32_t *)h, (const int32_t *)pos, n, start, end, s, top);
    case 3: return scan_i32_bf16((const uint16_t *)h, (const int32_t *)pos, n, start, end, s, top);
    case 4: return scan_i64_f32((const uint32_t *)h, (const int64_t *)pos, n, start, end, s, top);
    case 5: return scan_i64_bf16((const uint16_t *)h, (const int64_t *)pos, n, start, end, s, top);
    case 6: return scan_bits_f32((const uint32_t *)h, (const uint8_t *)pos, start, end, s, top);
    case 7: return scan_bits_bf16((const uint16_t *)h, (const uint8_t *)pos, start, end, s, top);
    }
    return -3;
}

/* octave + 1 values -> codes of a piece whose maximum's octave is top: q = octave + 255 - top clamped to
   [max(1, 256 - top), 255], 0 for 0 */
void ram_imp_codes(const uint16_t *restrict s, int64_t count, int32_t top, uint8_t *restrict codes) {
    const int32_t shift = 254 - top, lo = 256 - top > 1 ? 256 - top : 1;
    for (int64_t i = 0; i < count; i++) {
        const int32_t o = (int32_t)s[i];
        int32_t q = o + shift;
        q = q < lo ? lo : q;
        q = q > 255 ? 255 : q;
        codes[i] = (uint8_t)(o ? q : 0);
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

/* a piece's importances into out[0, n): kind as ram_imp_scan's (1, 2: count indices; 3: a bitmask of n entries),
   0 at entries not stored. Returns 0, or -1 where the positions do not match the codes (an index outside
   [0, n), a bitmask marking another number of entries than count, a dense piece of count != n). */
int64_t ram_imp_decode(const uint8_t *restrict codes, int64_t count, int32_t top, int kind, const void *pos,
                       int64_t n, uint32_t *restrict out) {
    if (kind == 0) {
        if (count != n) return -1;
        for (int64_t i = 0; i < n; i++) out[i] = decode1(codes[i], top);
        return 0;
    }
    if (kind == 1 || kind == 2) {
        memset(out, 0, (size_t)n * 4);
        uint32_t bad = 0;
        for (int64_t j = 0; j < count; j++) {
            const int64_t i = kind == 1 ? (int64_t)((const int32_t *)pos)[j] : ((const int64_t *)pos)[j];
            const int inside = i >= 0 && i < n;
            bad |= !inside;
            if (inside) out[i] = decode1(codes[j], top);
        }
        return bad ? -1 : 0;
    }
    if (kind != 3) return -1;
    const uint8_t *mask = (const uint8_t *)pos;
    if (count == 0) {  /* a bitmask with set bits and no codes: caught by the count at the end */
        memset(out, 0, (size_t)n * 4);
        return ram_imp_popcount(mask, 0, (n + 7) >> 3) ? -1 : 0;
    }
    int64_t c = 0;
    for (int64_t b = 0; b < n; b += 8) {
        const uint32_t m = mask[b >> 3];
        const int e = n - b < 8 ? (int)(n - b) : 8;
        if (!m) {
            memset(out + b, 0, (size_t)e * 4);
            continue;
        }
        if (m == 0xFFu && e == 8 && c + 8 <= count) {
            for (int j = 0; j < 8; j++) out[b + j] = decode1(codes[c + j], top);
            c += 8;
            continue;
        }
        for (int j = 0; j < e; j++) {  /* branch-free: a read past the codes is clamped, and caught below */
            const uint32_t on = (m >> j) & 1u;
            const uint32_t v = decode1(codes[c < count ? c : count - 1], top);
            out[b + j] = v & (0u - on);
            c += on;
        }
    }
    return c == count ? 0 : -1;
}

