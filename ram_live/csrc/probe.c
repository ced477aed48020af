/* The probe's native CPU kernel (ram_live/kernels/probe.py): counts, pairwise intersections and the Gram
   matrix of the task vectors in one pass. Built by ram_live/kernels/cc.py. */
#include <stdint.h>
#include <string.h>

#define MAX_AGENTS 32
#define BLOCK 256   /* entries per block: tau of every agent for one block stays in L1 */
#define FLUSH 16    /* blocks a float32 lane sums (256 products) before its sum goes into float64 */

/* Counts of a range: inter[i][j] (i <= j; active on the diagonal), unique, the histogram of c; dots[i][j] (i <= j). */
typedef struct {
    int64_t inter[MAX_AGENTS * MAX_AGENTS], unique[MAX_AGENTS], hist[MAX_AGENTS + 1];
    double dots[MAX_AGENTS * MAX_AGENTS];
} tally;

#if defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512DQ__)
#define FAST 1
#include "avx512.h"
/* tau of 32 entries stored at out; bit j: |tau_j| > eps or NaN. *big keeps the largest |tau| bits per lane. */
static inline uint32_t tau32(__m512 ae, __m512 ao, __m512 be, __m512 bo, __m512 eps, __m512i *big, float *out) {
    __m512 de = _mm512_sub_ps(ae, be), dd = _mm512_sub_ps(ao, bo);
    _mm512_store_ps(out, de);
    _mm512_store_ps(out + 16, dd);
    __m512 ue = _mm512_abs_ps(de), uo = _mm512_abs_ps(dd);
    *big = _mm512_max_epu32(*big, _mm512_max_epu32(_mm512_castps_si512(ue), _mm512_castps_si512(uo)));
    return (uint32_t)_mm512_cmp_ps_mask(ue, eps, _CMP_NLE_UQ)
         | ((uint32_t)_mm512_cmp_ps_mask(uo, eps, _CMP_NLE_UQ) << 16);
}
/* Per agent t of 64 entries with masks m (zeros beyond k): inter[t][u] += |m_t & m_u|, unique[t] += |m_t & ~multi|. */
static inline void pairs64(const uint64_t *m, uint64_t multi, int k, tally *y) {
#ifdef __AVX512VPOPCNTDQ__
    for (int r = 0; r < k; r += 8) {  /* eight agents u a vector */
        const __m512i w = _mm512_loadu_si512(m + r);
        int64_t *uni = y->unique + r;
        __m512i only = _mm512_andnot_si512(_mm512_set1_epi64((long long)multi), w);
        _mm512_storeu_si512(uni, _mm512_add_epi64(_mm512_loadu_si512(uni), _mm512_popcnt_epi64(only)));
        for (int t = 0; t < k; t++) {
            int64_t *row = y->inter + t * MAX_AGENTS + r;
            __m512i both = _mm512_and_si512(_mm512_set1_epi64((long long)m[t]), w);
            _mm512_storeu_si512(row, _mm512_add_epi64(_mm512_loadu_si512(row), _mm512_popcnt_epi64(both)));
        }
    }
#else
    for (int t = 0; t < k; t++) {
        int64_t *row = y->inter + t * MAX_AGENTS;
        y->unique[t] += __builtin_popcountll(m[t] & ~multi);
        row[t] += __builtin_popcountll(m[t]);
        if (multi) for (int u = t + 1; u < k; u++) row[u] += __builtin_popcountll(m[t] & m[u]);
    }
#endif
}
/* One block of n entries: tau rows (zeros up to a multiple of 64) and the counts, 64 entries a step. */
static int64_t count_block(int dtype, const void *base, const void *const *agents, int k, float eps, int64_t s0, int n,
                           float *tau, tally *y) {
    const __m512 ve = _mm512_set1_ps(eps);
    __m512i big = _mm512_setzero_si512();
    uint64_t m[MAX_AGENTS] = {0};
    for (int g = 0; g < n; g += 64) {
        const int64_t s = s0 + g;
        const int n0 = n - g < 32 ? n - g : 32, n1 = n - g - 32 < 32 ? n - g - 32 : 32;
        __m512 b0, b1, b2, b3, a0, a1, a2, a3;
        __m512i cnt = _mm512_setzero_si512();
        uint64_t once = 0, multi = 0;
        load32(dtype, base, s, n0, &b0, &b1);
        load32(dtype, base, s + 32, n1, &b2, &b3);
        for (int t = 0; t < k; t++) {
            float *out = tau + t * BLOCK + g;
            load32(dtype, agents[t], s, n0, &a0, &a1);
            load32(dtype, agents[t], s + 32, n1, &a2, &a3);
            m[t] = (uint64_t)tau32(a0, a1, b0, b1, ve, &big, out)
                 | (uint64_t)tau32(a2, a3, b2, b3, ve, &big, out + 32) << 32;
            multi |= once & m[t];
            once |= m[t];
            cnt = _mm512_sub_epi8(cnt, _mm512_movm_epi8(m[t]));  /* c of entry j in byte j */
        }
        y->hist[0] += (n - g < 64 ? n - g : 64) - __builtin_popcountll(once);
        if (!multi) { y->hist[1] += __builtin_popcountll(once); }
        else for (int c = 1; c <= k; c++)
            y->hist[c] += __builtin_popcountll(_mm512_cmpeq_epi8_mask(cnt, _mm512_set1_epi8((char)c)));
        pairs64(m, multi, k, y);
    }
    return _mm512_cmpge_epu32_mask(big, _mm512_set1_epi32(0x7F800000)) != 0;
}
/* acc[(i * k + j) * 16 + lane] += tau_i . tau_j over `used` entries for rows i..i+P-1 and j..j+Q-1 (P, Q <= 4,
   constants once inlined: the accumulators stay in registers); `tri`: j == i, the pairs q >= p only. */
static inline __attribute__((always_inline)) void gram_tile(const float *tau, int k, int i, int j, int used, float *acc,
                                                            const int P, const int Q, const int tri) {
    __m512 r[4][4];
    for (int p = 0; p < P; p++)
        for (int q = tri ? p : 0; q < Q; q++) r[p][q] = _mm512_load_ps(acc + ((i + p) * k + j + q) * 16);
    for (int x = 0; x < used; x += 16) {
        __m512 u[4], v[4];
        for (int p = 0; p < P; p++) u[p] = _mm512_load_ps(tau + (i + p) * BLOCK + x);
        for (int q = 0; q < Q; q++) v[q] = tri ? u[q] : _mm512_load_ps(tau + (j + q) * BLOCK + x);
        for (int p = 0; p < P; p++)
            for (int q = tri ? p : 0; q < Q; q++) r[p][q] = _mm512_fmadd_ps(u[p], v[q], r[p][q]);
    }
    for (int p = 0; p < P; p++)
        for (int q = tri ? p : 0; q < Q; q++) _mm512_store_ps(acc + ((i + p) * k + j + q) * 16, r[p][q]);
}
#define TILE(P, Q, TRI) gram_tile(tau, k, i, j, used, acc, P, Q, TRI)
/* The pairs i <= j in tiles of 4 x 4 rows (triangles on the diagonal, narrower tiles at the edge). */
static void gram_block(const float *tau, int k, int used, float *acc) {
    for (int i = 0; i + 4 <= k; i += 4) {
        int j = i;
        TILE(4, 4, 1);
        for (j = i + 4; j + 4 <= k; j += 4) TILE(4, 4, 0);
        switch (k - j) { case 3: TILE(4, 3, 0); break; case 2: TILE(4, 2, 0); break; case 1: TILE(4, 1, 0); break; }
    }
    const int i = k & ~3, j = i;
    switch (k - i) { case 3: TILE(3, 3, 1); break; case 2: TILE(2, 2, 1); break; case 1: TILE(1, 1, 1); break; }
}
#else
#include "scalar.h"

/* One block for input type T: tau rows (zeros up to a multiple of 64), agent t's activity in bit t of code[i],
   then per entry its c, whether it is unique, and its pairs. */
#define COUNT_BLOCK(NAME, T, FROM)                                                                                \
static int64_t NAME(const T *base, const T *const *agents, int k, float eps, int64_t s, int n, float *tau,         \
                    tally *y) {                                                                                  \
    float b[BLOCK];                                                                                              \
    uint32_t code[BLOCK];                                                                                        \
    int64_t bad = 0;                                                                                             \
    for (int i = 0; i < n; i++) { b[i] = FROM(base[s + i]); code[i] = 0; }                                       \
    for (int t = 0; t < k; t++) {                                                                                \
        const T *restrict a = agents[t] + s;                                                                     \
        float *restrict d = tau + t * BLOCK;                                                                     \
        int32_t nb = 0;                                                                                          \
        for (int i = 0; i < n; i++) {                                                                            \
            float x = FROM(a[i]) - b[i];                                                                         \
            d[i] = x;                                                                                            \
            nb += nonfinite(x);                                                                                  \
            code[i] |= (uint32_t)!(x >= -eps && x <= eps) << t;                                                  \
        }                                                                                                        \
        for (int i = n; i < ((n + 63) & ~63); i++) d[i] = 0.0f;                                                  \
        bad += nb;                                                                                               \
    }                                                                                                            \
    for (int i = 0; i < n; i++) {                                                                                \
        uint32_t c = code[i];                                                                                    \
        y->hist[__builtin_popcount(c)]++;                                                                        \
        if (c && !(c & (c - 1))) y->unique[__builtin_ctz(c)]++;                                                  \
        for (; c; c &= c - 1) {                                                                                  \
            int64_t *row = y->inter + __builtin_ctz(c) * MAX_AGENTS;                                             \
            for (uint32_t r = c; r; r &= r - 1) row[__builtin_ctz(r)]++;                                         \
        }                                                                                                        \
    }                                                                                                            \
    return bad;                                                                                                  \
}
COUNT_BLOCK(count_f32, float, from_f32)
COUNT_BLOCK(count_bf16, uint16_t, from_bf16)

static int64_t count_block(int dtype, const void *base, const void *const *agents, int k, float eps, int64_t s, int n,
                           float *tau, tally *y) {
    if (dtype == 1)
        return count_bf16((const uint16_t *)base, (const uint16_t *const *)agents, k, eps, s, n, tau, y);
    return count_f32((const float *)base, (const float *const *)agents, k, eps, s, n, tau, y);
}
static void gram_block(const float *tau, int k, int used, float *restrict acc) {
    for (int i = 0; i < k; i++)
        for (int j = i; j < k; j++) {
            float *restrict a = acc + (i * k + j) * 16;
            const float *u = tau + i * BLOCK, *v = tau + j * BLOCK;
            for (int x = 0; x < used; x += 16)
                for (int l = 0; l < 16; l++) a[l] += u[x + l] * v[x + l];
        }
}
#endif

/* 512 where the AVX-512 kernel was compiled in, 0 for the portable loops */
int ram_probe_simd_bits(void) {
#ifdef FAST
    return 512;
#else
    return 0;
#endif
}

/* Adds the counts of flat entries [start, end) (dtype 0 float32, 1 bfloat16; k <= 32 agents) to active[k],
   unique[k], inter[k * k] (symmetric, active on the diagonal), hist[k + 1], and tau_i . tau_j to gram[k * k].
   Returns nonzero when some task-vector entry is not finite, -1 for k outside 1..32. */
int64_t ram_probe(int dtype, const void *base, const void *const *agents, int k, float eps, int64_t start,
                  int64_t end, int64_t *active, int64_t *unique, int64_t *inter, int64_t *hist, double *gram) {
    float tau[MAX_AGENTS * BLOCK] __attribute__((aligned(64)));              /* 32 KiB */
    float acc[MAX_AGENTS * MAX_AGENTS * 16] __attribute__((aligned(64)));    /* 64 KiB: float32 lanes per pair */
    tally y;
    int64_t bad = 0, blocks = 0;
    if (k < 1 || k > MAX_AGENTS) return -1;
    memset(&y, 0, sizeof y);
    memset(acc, 0, sizeof(float) * 16 * (size_t)(k * k));
    for (int64_t s = start; s < end; s += BLOCK) {
        const int n = (int)(end - s < BLOCK ? end - s : BLOCK);
        bad += count_block(dtype, base, agents, k, eps, s, n, tau, &y);
        gram_block(tau, k, (n + 63) & ~63, acc);
        if (++blocks % FLUSH == 0 || s + BLOCK >= end)
            for (int i = 0; i < k; i++)
                for (int j = i; j < k; j++) {
                    float *a = acc + (i * k + j) * 16;
                    double v = 0.0;
                    for (int l = 0; l < 16; l++) { v += (double)a[l]; a[l] = 0.0f; }
                    y.dots[i * MAX_AGENTS + j] += v;
                }
    }
    for (int i = 0; i < k; i++) {
        active[i] += y.inter[i * MAX_AGENTS + i];
        unique[i] += y.unique[i];
        for (int j = i; j < k; j++) {
            const int64_t both = y.inter[i * MAX_AGENTS + j];
            const double v = y.dots[i * MAX_AGENTS + j];
            inter[i * k + j] += both;
            gram[i * k + j] += v;
            if (j != i) { inter[j * k + i] += both; gram[j * k + i] += v; }
        }
    }
    for (int c = 0; c <= k; c++) hist[c] += y.hist[c];
    return bad;
}
