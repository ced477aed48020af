/* The portable loops of select.c (included there where the AVX-512 ones are not compiled in): 64 entries a step,
   compared in GCC/Clang vector extensions (AVX2, AVX-512 or NEON compares, whatever the flags give), the 64
   results narrowed to bytes and packed into one 64-bit mask by a multiply per 8 bytes; then the changed values
   (and, while j < cap, their positions) written in order. Sparse steps walk the mask's set bits; dense ones copy
   each entry into a staging row and advance by its bit (no branch per entry), then copy the row out, so nothing
   is written past the values. */
#ifndef RAM_SELECT_VEC_H
#define RAM_SELECT_VEC_H
#include <stdint.h>
#include <string.h>

int ram_supported(void) { return 1; }

typedef int8_t sel_i8x64 __attribute__((vector_size(64)));
typedef int16_t sel_i16x64 __attribute__((vector_size(128)));
typedef int32_t sel_i32x64 __attribute__((vector_size(256)));
typedef uint64_t sel_u64x8 __attribute__((vector_size(64)));

#ifdef __AVX2__
#include <immintrin.h>
#define SELECT_BITS 256
/* AVX2: the compares' movemask (a generic vector-extension narrowing costs more than the whole AVX-512 pass), and
   the compression of 8 entries a shuffle, its control looked up by the 8 bits of their mask. */
static uint8_t sel_lut16[256][16] __attribute__((aligned(16)));
static int32_t sel_lut32[256][8] __attribute__((aligned(32)));

__attribute__((constructor)) static void sel_tables(void) {
    for (int m = 0; m < 256; m++) {
        int r = 0;
        for (int k = 0; k < 8; k++)
            if (m >> k & 1) {
                sel_lut16[m][2 * r] = (uint8_t)(2 * k);
                sel_lut16[m][2 * r + 1] = (uint8_t)(2 * k + 1);
                sel_lut32[m][r++] = k;
            }
        for (int q = r; q < 8; q++) {
            sel_lut16[m][2 * q] = sel_lut16[m][2 * q + 1] = 0x80;
            sel_lut32[m][q] = 0;
        }
    }
}

static inline uint64_t sel_mask16(const int16_t *a, const int16_t *b) {
    uint64_t m = 0;
    for (int h = 0; h < 64; h += 32) {
        __m256i e0 = _mm256_cmpeq_epi16(_mm256_loadu_si256((const __m256i *)(a + h)),
                                        _mm256_loadu_si256((const __m256i *)(b + h)));
        __m256i e1 = _mm256_cmpeq_epi16(_mm256_loadu_si256((const __m256i *)(a + h + 16)),
                                        _mm256_loadu_si256((const __m256i *)(b + h + 16)));
        __m256i p = _mm256_permute4x64_epi64(_mm256_packs_epi16(e0, e1), 0xD8);  /* bytes back in entry order */
        m |= (uint64_t)(uint32_t)~_mm256_movemask_epi8(p) << h;
    }
    return m;
}

static inline uint64_t sel_mask32(const int32_t *a, const int32_t *b) {
    uint64_t m = 0;
    for (int h = 0; h < 64; h += 8) {
        __m256i e = _mm256_cmpeq_epi32(_mm256_loadu_si256((const __m256i *)(a + h)),
                                       _mm256_loadu_si256((const __m256i *)(b + h)));
        m |= (uint64_t)(~(uint32_t)_mm256_movemask_ps(_mm256_castsi256_ps(e)) & 0xFFu) << h;
    }
    return m;
}

/* The entries of a[0, 64) under m compressed into row (room for 72), in order. */
static inline void sel_compress16(const int16_t *a, uint64_t m, int16_t *row) {
    int r = 0;
    for (int q = 0; q < 8; q++) {
        const unsigned byte = (unsigned)(m >> (8 * q)) & 0xFFu;
        __m128i v = _mm_shuffle_epi8(_mm_loadu_si128((const __m128i *)(a + 8 * q)),
                                     _mm_load_si128((const __m128i *)sel_lut16[byte]));
        _mm_storeu_si128((__m128i *)(row + r), v);
        r += __builtin_popcount(byte);
    }
}

static inline void sel_compress32(const int32_t *a, uint64_t m, int32_t *row) {
    int r = 0;
    for (int q = 0; q < 8; q++) {
        const unsigned byte = (unsigned)(m >> (8 * q)) & 0xFFu;
        __m256i v = _mm256_permutevar8x32_epi32(_mm256_loadu_si256((const __m256i *)(a + 8 * q)),
                                                _mm256_load_si256((const __m256i *)sel_lut32[byte]));
        _mm256_storeu_si256((__m256i *)(row + r), v);
        r += __builtin_popcount(byte);
    }
}
#else
#define SELECT_BITS 0
/* Bit k of the result: lane k of ne (0 or -1) is set. Byte q of each 64-bit word holds lane 8w + q as 0 or 1;
   the multiply gathers the word's eight into its top byte in lane order. */
static inline uint64_t sel_pack(sel_i8x64 ne) {
    sel_u64x8 w = (sel_u64x8)(ne & 1);
    w = (w * 0x0102040810204080ULL) >> 56;
    uint64_t m = 0;
    for (int q = 0; q < 8; q++) m |= w[q] << (8 * q);
    return m;
}

static inline uint64_t sel_mask16(const int16_t *a, const int16_t *b) {
    sel_i16x64 x, y;
    memcpy(&x, a, sizeof x);
    memcpy(&y, b, sizeof y);
    return sel_pack(__builtin_convertvector(x != y, sel_i8x64));
}

static inline uint64_t sel_mask32(const int32_t *a, const int32_t *b) {
    sel_i32x64 x, y;
    memcpy(&x, a, sizeof x);
    memcpy(&y, b, sizeof y);
    return sel_pack(__builtin_convertvector(x != y, sel_i8x64));
}


/* The entries of a[0, 64) under m into row (room for 72), in order: each entry copied, the slot advanced by its
   bit (no branch per entry). */
#define SEL_COMPRESS(NAME, T)                                                                                     \
static inline void NAME(const T *a, uint64_t m, T *row) {                                                        \
    int r = 0;                                                                                                    \
    for (int k = 0; k < 64; k++) { row[r] = a[k]; r += (int)((m >> k) & 1); }                                    \
}
SEL_COMPRESS(sel_compress16, int16_t)
SEL_COMPRESS(sel_compress32, int32_t)
#endif

/* The step's changed entries of a (mask m) appended at vals + j, their positions (offset + index) at pos while
   below cap; returns the new j. */
#define SEL_STEP(T, COMPRESS)                                                                                     \
static inline int64_t sel_step_##T(const T *a, uint64_t m, T *vals, int64_t j, int32_t *pos, int64_t cap,         \
                                   int64_t at) {                                                                  \
    const int c = __builtin_popcountll(m);                                                                        \
    if (c == 64) {                                                                                                \
        memcpy(vals + j, a, 64 * sizeof(T));                                                                      \
    } else if (c > 8) {                                                                                           \
        T row[72] __attribute__((aligned(32)));                                                                   \
        COMPRESS(a, m, row);                                                                                      \
        memcpy(vals + j, row, (size_t)c * sizeof(T));                                                             \
    } else {                                                                                                      \
        int64_t q = j;                                                                                            \
        for (uint64_t r = m; r; r &= r - 1) vals[q++] = a[__builtin_ctzll(r)];                                    \
    }                                                                                                             \
    if (j < cap) {                                                                                                \
        int64_t q = j;                                                                                            \
        for (uint64_t r = m; r && q < cap; r &= r - 1) pos[q++] = (int32_t)(at + __builtin_ctzll(r));            \
    }                                                                                                             \
    return j + c;                                                                                                 \
}
SEL_STEP(int16_t, sel_compress16)
SEL_STEP(int32_t, sel_compress32)

/* Entries a[0, n) whose bits differ from b's: bit i%8 of bits[i/8] set for each, their values written to vals in
   order, and while fewer than cap are written their positions (offset + i, int32) to pos (room for cap + 32).
   Returns how many changed. vals needs room for those only. */
#define SEL_SELECT(NAME, T, MASK)                                                                                 \
int64_t NAME(const T *a, const T *b, int64_t n, uint8_t *bits, T *vals, int32_t *pos, int64_t cap,               \
             int64_t offset) {                                                                                    \
    int64_t i = 0, j = 0;                                                                                         \
    for (; i + 64 <= n; i += 64) {                                                                                \
        const uint64_t m = MASK(a + i, b + i);                                                                    \
        memcpy(bits + (i >> 3), &m, 8);                                                                           \
        if (m) j = sel_step_##T(a + i, m, vals, j, pos, cap, offset + i);                                         \
    }                                                                                                             \
    return tail_##T(a, b, i, n, bits, vals, j, pos, cap, offset);                                                 \
}
SEL_SELECT(ram_select16, int16_t, sel_mask16)
SEL_SELECT(ram_select32, int32_t, sel_mask32)
#endif
