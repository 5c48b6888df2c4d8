/* The CPU kernels' vectors: 16 float32 lanes in GCC's portable vector extensions (one AVX-512
 * register, two AVX2 ones), their loads, bfloat16's widening and rounding, a fixed-order lane
 * sum, and exp for a softmax's or SiLU's non-positive arguments. */
#ifndef SPECDEC_VEC_H
#define SPECDEC_VEC_H

#include <stdint.h>
#include <string.h>

typedef float v16 __attribute__((vector_size(64)));
typedef int32_t i16x16 __attribute__((vector_size(64)));
typedef uint16_t u16x16 __attribute__((vector_size(32)));
typedef uint32_t u32x16 __attribute__((vector_size(64)));

static inline v16 load_f32(const float *p) {
    v16 v;
    memcpy(&v, p, sizeof v);
    return v;
}

static inline v16 load_bf16(const uint16_t *p) {
    u16x16 h;
    memcpy(&h, p, sizeof h);
    u32x16 u = __builtin_convertvector(h, u32x16) << 16;
    v16 f;
    memcpy(&f, &u, sizeof f);
    return f;
}

static inline float bf16_to_f32(uint16_t h) {
    uint32_t u = (uint32_t)h << 16;
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

static inline uint16_t f32_to_bf16(float f) {
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    if ((u & 0x7fffffffu) > 0x7f800000u)
        return (uint16_t)((u >> 16) | 0x40);
    return (uint16_t)((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}

/* The lanes of v summed by a fixed tree: lane i plus lane i + w, for w = 8, 4, 2, 1. */
static inline float hsum(v16 v) {
    float a[16];
    memcpy(a, &v, sizeof a);
    for (int w = 8; w; w >>= 1)
        for (int i = 0; i < w; i++)
            a[i] += a[i + w];
    return a[0];
}

/* exp(x) for x <= 0 (a softmax's shifted scores), about 1 ulp: 2^n exp(r), |r| <= ln2 / 2. */
static inline v16 vexp(v16 x) {
    const v16 lo = (v16){} - 87.0f;
    i16x16 under = x < lo;
    x = (v16)(((i16x16)x & ~under) | ((i16x16)lo & under));
    v16 t = x * 1.44269504088896341f - 0.5f;
    i16x16 n = __builtin_convertvector(t, i16x16);          /* toward zero: round(x log2 e) */
    v16 nf = __builtin_convertvector(n, v16);
    v16 r = x - nf * 0.693145751953125f - nf * 1.428606765330187e-06f;
    v16 p = 1.0f / 720 + r * (1.0f / 5040);
    p = 1.0f / 120 + r * p;
    p = 1.0f / 24 + r * p;
    p = 1.0f / 6 + r * p;
    p = 0.5f + r * p;
    p = 1.0f + r * p;
    p = 1.0f + r * p;
    i16x16 bits = (n + 127) << 23;
    v16 scale;
    memcpy(&scale, &bits, sizeof scale);
    return (v16)((i16x16)(p * scale) & ~under);              /* below e^-87: exactly 0 */
}

#endif
