/* Scalar helpers of the native kernels: float32/bfloat16 reads, float bits, finiteness tests, and the float32 ->
   bfloat16 rounding (round to nearest even; NaN -> 0x7FC0, c10's round_to_nearest_even). */
#ifndef RAM_SCALAR_H
#define RAM_SCALAR_H
#include <stdint.h>
#include <string.h>

static inline float from_f32(float x) { return x; }
static inline float from_bf16(uint16_t x) { uint32_t u = (uint32_t)x << 16; float f; memcpy(&f, &u, 4); return f; }
static inline uint32_t bits(float x) { uint32_t u; memcpy(&u, &x, 4); return u; }
static inline int nonfinite(float x) { return (bits(x) & 0x7F800000u) == 0x7F800000u; }
/* x is NaN/Inf once stored in dtype 1 (bfloat16: from 0x7F7F8000 up, round to nearest even gives Inf) or 0 */
static inline int nonfinite_as(int dtype, float x) {
    return (bits(x) & 0x7FFFFFFFu) >= (dtype == 1 ? 0x7F7F8000u : 0x7F800000u);
}
static inline uint16_t to_bf16(float x) {
    uint32_t u = bits(x);
    return ((u & 0x7FFFFFFFu) > 0x7F800000u) ? (uint16_t)0x7FC0u : (uint16_t)((u + 0x7FFFu + ((u >> 16) & 1u)) >> 16);
}
#endif
