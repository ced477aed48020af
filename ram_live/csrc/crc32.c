/* zlib's CRC-32 with PCLMULQDQ / VPCLMULQDQ (ram_live/kernels/crc.py; x86-64 only). */
#include <stdint.h>
#include <immintrin.h>

static uint32_t table[256];
static int wide;

int ram_crc_supported(void) {
    __builtin_cpu_init();
    for (uint32_t i = 0; i < 256; i++) {
        uint32_t c = i;
        for (int k = 0; k < 8; k++) c = c & 1 ? (c >> 1) ^ 0xEDB88320u : c >> 1;
        table[i] = c;
    }
    wide = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512vl")
        && __builtin_cpu_supports("vpclmulqdq");
    return __builtin_cpu_supports("pclmul") && __builtin_cpu_supports("sse4.1");
}

int ram_crc_wide(int allow) {  /* allow = 0: the 128-bit path only (tests); returns whether the wide one runs */
    __builtin_cpu_init();
    wide = allow && __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512vl")
        && __builtin_cpu_supports("vpclmulqdq");
    return wide;
}

/* the last 16-byte blocks folded into x1, then the reduction to 32 bits; len a multiple of 16 */
__attribute__((target("pclmul,sse4.1")))
static uint32_t fold_tail(__m128i x1, const unsigned char *buf, uint64_t len) {
    const __m128i k3k4 = _mm_set_epi64x(0x00ccaa009eLL, 0x01751997d0LL);
    const __m128i k5k0 = _mm_set_epi64x(0, 0x0163cd6124LL);
    const __m128i poly = _mm_set_epi64x(0x01f7011641LL, 0x01db710641LL);
    __m128i x0 = k3k4, x2, x3, x5;
    while (len >= 16) {
        x2 = _mm_loadu_si128((const __m128i *)buf);
        x5 = _mm_clmulepi64_si128(x1, x0, 0x00);
        x1 = _mm_clmulepi64_si128(x1, x0, 0x11);
        x1 = _mm_xor_si128(_mm_xor_si128(x1, x2), x5);
        buf += 16;
        len -= 16;
    }
    x2 = _mm_clmulepi64_si128(x1, x0, 0x10);
    x3 = _mm_setr_epi32(~0, 0, ~0, 0);
    x1 = _mm_srli_si128(x1, 8);
    x1 = _mm_xor_si128(x1, x2);
    x0 = k5k0;
    x2 = _mm_srli_si128(x1, 4);
    x1 = _mm_and_si128(x1, x3);
    x1 = _mm_clmulepi64_si128(x1, x0, 0x00);
    x1 = _mm_xor_si128(x1, x2);
    x0 = poly;
    x2 = _mm_and_si128(x1, x3);
    x2 = _mm_clmulepi64_si128(x2, x0, 0x10);
    x2 = _mm_and_si128(x2, x3);
    x2 = _mm_clmulepi64_si128(x2, x0, 0x00);
    x1 = _mm_xor_si128(x1, x2);
    return (uint32_t)_mm_extract_epi32(x1, 1);
}

/* state: the inverted CRC; len >= 64, a multiple of 16 */
__attribute__((target("pclmul,sse4.1")))
static uint32_t fold(const unsigned char *buf, uint64_t len, uint32_t state) {
    const __m128i k1k2 = _mm_set_epi64x(0x01c6e41596LL, 0x0154442bd4LL);
    const __m128i k3k4 = _mm_set_epi64x(0x00ccaa009eLL, 0x01751997d0LL);
    __m128i x0, x1, x2, x3, x4, x5, x6, x7, x8, y5, y6, y7, y8;
    x1 = _mm_loadu_si128((const __m128i *)(buf + 0x00));
    x2 = _mm_loadu_si128((const __m128i *)(buf + 0x10));
    x3 = _mm_loadu_si128((const __m128i *)(buf + 0x20));
    x4 = _mm_loadu_si128((const __m128i *)(buf + 0x30));
    x1 = _mm_xor_si128(x1, _mm_cvtsi32_si128((int)state));
    x0 = k1k2;
    buf += 64;
    len -= 64;
    while (len >= 64) {
        x5 = _mm_clmulepi64_si128(x1, x0, 0x00);
        x6 = _mm_clmulepi64_si128(x2, x0, 0x00);
        x7 = _mm_clmulepi64_si128(x3, x0, 0x00);
        x8 = _mm_clmulepi64_si128(x4, x0, 0x00);
        x1 = _mm_clmulepi64_si128(x1, x0, 0x11);
        x2 = _mm_clmulepi64_si128(x2, x0, 0x11);
        x3 = _mm_clmulepi64_si128(x3, x0, 0x11);
        x4 = _mm_clmulepi64_si128(x4, x0, 0x11);
        y5 = _mm_loadu_si128((const __m128i *)(buf + 0x00));
        y6 = _mm_loadu_si128((const __m128i *)(buf + 0x10));
        y7 = _mm_loadu_si128((const __m128i *)(buf + 0x20));
        y8 = _mm_loadu_si128((const __m128i *)(buf + 0x30));
        x1 = _mm_xor_si128(_mm_xor_si128(x1, x5), y5);
        x2 = _mm_xor_si128(_mm_xor_si128(x2, x6), y6);
        x3 = _mm_xor_si128(_mm_xor_si128(x3, x7), y7);
        x4 = _mm_xor_si128(_mm_xor_si128(x4, x8), y8);
        buf += 64;
        len -= 64;
    }
    x0 = k3k4;
    x5 = _mm_clmulepi64_si128(x1, x0, 0x00);
    x1 = _mm_clmulepi64_si128(x1, x0, 0x11);
    x1 = _mm_xor_si128(_mm_xor_si128(x1, x2), x5);
    x5 = _mm_clmulepi64_si128(x1, x0, 0x00);
    x1 = _mm_clmulepi64_si128(x1, x0, 0x11);
    x1 = _mm_xor_si128(_mm_xor_si128(x1, x3), x5);
    x5 = _mm_clmulepi64_si128(x1, x0, 0x00);
    x1 = _mm_clmulepi64_si128(x1, x0, 0x11);
    x1 = _mm_xor_si128(_mm_xor_si128(x1, x4), x5);
    return fold_tail(x1, buf, len);
}

/* 128-bit lanes folded forward by 512 bits, with the next 64 bytes xored in */
#define FOLD512(z, k, d) _mm512_ternarylogic_epi64(_mm512_clmulepi64_epi128(z, k, 0x00), \
                                                   _mm512_clmulepi64_epi128(z, k, 0x11), d, 0x96)

/* the same CRC 256 bytes per step in four 512-bit registers (VPCLMULQDQ); len >= 256, a multiple of 16 */
__attribute__((target("avx512f,avx512vl,vpclmulqdq,pclmul,sse4.1")))
static uint32_t fold512(const unsigned char *buf, uint64_t len, uint32_t state) {
    const __m512i k2048 = _mm512_set4_epi64(0x01322d1430LL, 0x011542778aLL, 0x01322d1430LL, 0x011542778aLL);
    const __m512i k512 = _mm512_set4_epi64(0x01c6e41596LL, 0x0154442bd4LL, 0x01c6e41596LL, 0x0154442bd4LL);
    __m512i z0 = _mm512_loadu_si512((const void *)(buf + 0x00));
    __m512i z1 = _mm512_loadu_si512((const void *)(buf + 0x40));
    __m512i z2 = _mm512_loadu_si512((const void *)(buf + 0x80));
    __m512i z3 = _mm512_loadu_si512((const void *)(buf + 0xc0));
    z0 = _mm512_xor_si512(z0, _mm512_castsi128_si512(_mm_cvtsi32_si128((int)state)));
    buf += 256;
    len -= 256;
    while (len >= 256) {
        z0 = FOLD512(z0, k2048, _mm512_loadu_si512((const void *)(buf + 0x00)));
        z1 = FOLD512(z1, k2048, _mm512_loadu_si512((const void *)(buf + 0x40)));
        z2 = FOLD512(z2, k2048, _mm512_loadu_si512((const void *)(buf + 0x80)));
        z3 = FOLD512(z3, k2048, _mm512_loadu_si512((const void *)(buf + 0xc0)));
        buf += 256;
        len -= 256;
    }
    z1 = FOLD512(z0, k512, z1);
    z2 = FOLD512(z1, k512, z2);
    z3 = FOLD512(z2, k512, z3);
    while (len >= 64) {
        z3 = FOLD512(z3, k512, _mm512_loadu_si512((const void *)buf));
        buf += 64;
        len -= 64;
    }
    /* the four lanes of z3 folded into one: by 384, 256 and 128 bits */
    const __m128i k384 = _mm_set_epi64x(0x0174359406LL, 0x003db1ecdcLL);
    const __m128i k256 = _mm_set_epi64x(0x015a546366LL, 0x00f1da05aaLL);
    const __m128i k128 = _mm_set_epi64x(0x00ccaa009eLL, 0x01751997d0LL);
    __m128i l0 = _mm512_extracti32x4_epi32(z3, 0), l1 = _mm512_extracti32x4_epi32(z3, 1);
    __m128i l2 = _mm512_extracti32x4_epi32(z3, 2), x1 = _mm512_extracti32x4_epi32(z3, 3);
    x1 = _mm_xor_si128(x1, _mm_xor_si128(_mm_clmulepi64_si128(l0, k384, 0x00), _mm_clmulepi64_si128(l0, k384, 0x11)));
    x1 = _mm_xor_si128(x1, _mm_xor_si128(_mm_clmulepi64_si128(l1, k256, 0x00), _mm_clmulepi64_si128(l1, k256, 0x11)));
    x1 = _mm_xor_si128(x1, _mm_xor_si128(_mm_clmulepi64_si128(l2, k128, 0x00), _mm_clmulepi64_si128(l2, k128, 0x11)));
    return fold_tail(x1, buf, len);
}

uint32_t ram_crc32(uint32_t crc, const unsigned char *buf, uint64_t len) {
    uint32_t state = ~crc;
    if (len >= 64) {
        uint64_t chunk = len & ~(uint64_t)15;
        state = wide && chunk >= 256 ? fold512(buf, chunk, state) : fold(buf, chunk, state);
        buf += chunk;
        len -= chunk;
    }
    while (len--) state = table[(state ^ *buf++) & 0xff] ^ (state >> 8);
    return ~state;
}
