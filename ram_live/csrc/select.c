/* Snapshot capture's changed-entry selection (ram_live/kernels/select.py), built at the build level by ram_live/kernels/cc.py:
   the AVX-512 loops where the compiler targets AVX-512 (BW, VBMI2: vpcompressw/d), portable loops elsewhere
   (AVX2, NEON, the baseline). Integer compares and copies only: every level writes the same bytes. */
#include <stdint.h>
#include <string.h>

#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "the bitmask is written as little-endian words"
#endif

/* The scalar tail of a range: entries [i, n) (i a multiple of 8), as the vector loops below. */
#define TAIL(T)                                                                                                   \
static int64_t tail_##T(const T *a, const T *b, int64_t i, int64_t n, uint8_t *bits, T *vals, int64_t j,          \
                        int32_t *pos, int64_t cap, int64_t offset) {                                              \
    for (; i < n; i += 8) {                                                                                       \
        uint8_t byte = 0;                                                                                         \
        for (int k = 0; k < 8 && i + k < n; k++) {                                                                \
            if (a[i + k] != b[i + k]) {                                                                           \
                if (j < cap) pos[j] = (int32_t)(offset + i + k);                                                  \
                vals[j++] = a[i + k];                                                                             \
                byte |= (uint8_t)(1u << k);                                                                       \
            }                                                                                                     \
        }                                                                                                         \
        bits[i >> 3] = byte;                                                                                      \
    }                                                                                                             \
    return j;                                                                                                     \
}
TAIL(int16_t)
TAIL(int32_t)

#if defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512VBMI2__)
#include <immintrin.h>
#define SELECT_BITS 512

int ram_supported(void) {
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw")
        && __builtin_cpu_supports("avx512vbmi2") && __builtin_cpu_supports("popcnt");
}

static inline __mmask16 low16(int c) { return (__mmask16)((1u << c) - 1); }

/* The values' output, written in whole 64-byte lines with non-temporal stores (no read of the destination
   before the write: at 50 % changed ~15 % faster than plain stores). The bytes before the first aligned line
   are stored plainly; then each put lands in a staging buffer, flushed a line at a time. */
typedef struct {
    char *out, *line;  /* the output; the next aligned line to stream (NULL before the first) */
    int64_t done, head, fill;  /* bytes written plainly, bytes before the first aligned line, bytes staged */
    char stage[128] __attribute__((aligned(64)));
} Out;

static void out_init(Out *o, void *out) {
    o->out = (char *)out;
    o->line = NULL;
    o->done = o->fill = 0;
    o->head = (int64_t)((64 - ((uintptr_t)out & 63)) & 63);
}

/* Append the low nbytes (<= 64) of v. */
__attribute__((target("avx512f,avx512bw")))
static inline void out_put(Out *o, __m512i v, int nbytes) {
    __mmask64 m = nbytes == 64 ? ~0ULL : (1ULL << nbytes) - 1;
    if (o->line == NULL) {
        _mm512_mask_storeu_epi8(o->out + o->done, m, v);
        o->done += nbytes;
        if (o->done >= o->head) {  /* stage what passed the first line's start */
            o->line = o->out + o->head;
            o->fill = o->done - o->head;
            memcpy(o->stage, o->line, (size_t)o->fill);
        }
        return;
    }
    _mm512_mask_storeu_epi8(o->stage + o->fill, m, v);
    o->fill += nbytes;
    if (o->fill >= 64) {
        _mm512_stream_si512((__m512i *)o->line, _mm512_load_si512(o->stage));
        _mm512_store_si512(o->stage, _mm512_load_si512(o->stage + 64));
        o->line += 64;
        o->fill -= 64;
    }
}

/* Write what is staged (plain stores) and order the streamed lines before anything after. */
static void out_end(Out *o) {
    if (o->line != NULL)
        memcpy(o->line, o->stage, (size_t)o->fill);
    _mm_sfence();
}

/* Entries a[0, n) whose bits differ from b's (n entries of 2 bytes): bit i%8 of bits[i/8] set for each, their
   values written to vals in order, and while fewer than cap are written their positions (offset + i, int32) to
   pos (room for cap + 32). Returns how many changed. Masked stores: vals needs room for those only. */
__attribute__((target("avx512f,avx512bw,avx512vbmi2,popcnt")))
int64_t ram_select16(const int16_t *a, const int16_t *b, int64_t n, uint8_t *bits, int16_t *vals,
                     int32_t *pos, int64_t cap, int64_t offset) {
    int64_t i = 0, j = 0;
    const __m512i lane16 = _mm512_set_epi16(31, 30, 29, 28, 27, 26, 25, 24, 23, 22, 21, 20, 19, 18, 17, 16,
                                            15, 14, 13, 12, 11, 10, 9, 8, 7, 6, 5, 4, 3, 2, 1, 0);
    Out out;
    out_init(&out, vals);
    for (; i + 32 <= n; i += 32) {
        __m512i x = _mm512_loadu_si512(a + i);
        __mmask32 k = _mm512_cmpneq_epi16_mask(x, _mm512_loadu_si512(b + i));
        uint32_t w = (uint32_t)k;
        memcpy(bits + (i >> 3), &w, 4);
        int c = __builtin_popcount(w);  /* no branch on w: at a few % changed it would be unpredictable */
        out_put(&out, _mm512_maskz_compress_epi16(k, x), 2 * c);
        if (j < cap) {  /* the lanes' numbers compressed as 16-bit, widened to 32 and offset: positions */
            __m512i lanes = _mm512_maskz_compress_epi16(k, lane16);
            __m512i base = _mm512_set1_epi32((int32_t)(offset + i));
            _mm512_mask_storeu_epi32(pos + j, low16(c < 16 ? c : 16),
                                     _mm512_add_epi32(base, _mm512_cvtepu16_epi32(_mm512_castsi512_si256(lanes))));
            if (c > 16)  /* rare where indices are the smaller encoding (< 1/32 changed) */
                _mm512_mask_storeu_epi32(pos + j + 16, low16(c - 16), _mm512_add_epi32(
                    base, _mm512_cvtepu16_epi32(_mm512_extracti64x4_epi64(lanes, 1))));
        }
        j += c;
    }
    out_end(&out);
    return tail_int16_t(a, b, i, n, bits, vals, j, pos, cap, offset);
}

/* The same for entries of 4 bytes. */
__attribute__((target("avx512f,avx512bw,popcnt")))
int64_t ram_select32(const int32_t *a, const int32_t *b, int64_t n, uint8_t *bits, int32_t *vals,
                     int32_t *pos, int64_t cap, int64_t offset) {
    int64_t i = 0, j = 0;
    const __m512i sixteen = _mm512_set1_epi32(16);
    __m512i at = _mm512_add_epi32(_mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15),
                                  _mm512_set1_epi32((int32_t)offset));
    Out out;
    out_init(&out, vals);
    for (; i + 16 <= n; i += 16, at = _mm512_add_epi32(at, sixteen)) {
        __m512i x = _mm512_loadu_si512(a + i);
        __mmask16 k = _mm512_cmpneq_epi32_mask(x, _mm512_loadu_si512(b + i));
        uint16_t w = (uint16_t)k;
        memcpy(bits + (i >> 3), &w, 2);
        int c = __builtin_popcount(w);
        out_put(&out, _mm512_maskz_compress_epi32(k, x), 4 * c);
        if (j < cap)
            _mm512_mask_storeu_epi32(pos + j, low16(c), _mm512_maskz_compress_epi32(k, at));
        j += c;
    }
    out_end(&out);
    return tail_int32_t(a, b, i, n, bits, vals, j, pos, cap, offset);
}
#else
#include "select_vec.h"
#endif

/* 512 where the AVX-512 loops were compiled in, 256 for the AVX2 ones of select_vec.h, 0 for its generic loops */
int ram_select_simd_bits(void) { return SELECT_BITS; }
