/* A decoder layer's small work between its GEMMs, one call each instead of a handful of
 * PyTorch operators: the residual add with the RMSNorm after it, and SiLU(gate) x up.
 *
 * At batch 1 on the CPU each operator call costs microseconds of dispatch around nanoseconds of
 * arithmetic, and a layer ran some 60 of them (benchmarks/step_profile.py). Each row is computed
 * alone, in a fixed order, so rows stay batch-invariant. The arithmetic follows model.py's:
 * float32 inside, the dtype's rounding where PyTorch rounds (the residual sum, the normalized
 * row before Llama's weight multiplies it, SiLU's result before the product); the sum of squares
 * in a vector order of its own, so a float32 result may differ from PyTorch's in the last bits.
 */
#include <math.h>
#include <stdint.h>
#include <string.h>

#include "pool.h"
#include "vec.h"

static inline float bf(uint16_t h) { return bf16_to_f32(h); }
static inline uint16_t to_bf(float f) { return f32_to_bf16(f); }
static inline float round_f32(float f) { return f; }
static inline float round_bf16(float f) { return bf(to_bf(f)); }

/* Sum of squares in 16 interleaved partial sums (a row of 1024 is 64 of each), then a tree. */
static inline float sum_squares(const float *h, long d) {
    float part[16] = {0};
    long i = 0;
    for (; i + 16 <= d; i += 16)
        for (int j = 0; j < 16; j++)
            part[j] += h[i + j] * h[i + j];
    for (int j = 0; i < d; i++, j++)
        part[j] += h[i] * h[i];
    for (int w = 8; w; w >>= 1)
        for (int j = 0; j < w; j++)
            part[j] += part[j + w];
    return part[0];
}

#define MAX_D 16384

/* residual: x + add (rounded as the dtype), written to sum when add is given; out: RMSNorm of
 * it, Llama's (w times the normalized row, rounded to the dtype first) or Gemma's (gemma:
 * the normalized row times 1 + w, rounded once). Returns -2 past MAX_D. */
#define NORM(NAME, T, LOAD, STORE, ROUND)                                                       \
int NAME(const T *x, const T *add, const T *w, long n, long d, float eps, int gemma, T *sum,    \
         T *out) {                                                                              \
    if (d > MAX_D)                                                                              \
        return -2;                                                                              \
    for (long r = 0; r < n; r++) {                                                              \
        float h[MAX_D];                                                                         \
        const T *xr = x + r * d;                                                                \
        for (long i = 0; i < d; i++)                                                            \
            h[i] = add ? ROUND(LOAD(xr[i]) + LOAD(add[r * d + i])) : LOAD(xr[i]);              \
        if (add)                                                                                \
            for (long i = 0; i < d; i++)                                                        \
                sum[r * d + i] = STORE(h[i]);                                                   \
        float scale = 1.0f / sqrtf(sum_squares(h, d) / (float)d + eps);                         \
        T *o = out + r * d;                                                                     \
        if (gemma)                                                                              \
            for (long i = 0; i < d; i++)                                                        \
                o[i] = STORE(h[i] * scale * (1.0f + LOAD(w[i])));                               \
        else                                                                                    \
            for (long i = 0; i < d; i++)                                                        \
                o[i] = STORE(LOAD(w[i]) * ROUND(h[i] * scale));                                 \
    }                                                                                           \
    return 0;                                                                                   \
}

#define IDENTITY(x) (x)
NORM(rmsnorm_f32, float, IDENTITY, IDENTITY, round_f32)
NORM(rmsnorm_bf16, uint16_t, bf, to_bf, round_bf16)

/* SiLU(x) = x sigmoid(x), exp only ever of -|x| (vexp's domain), 16 lanes at a time. */
static inline v16 silu(v16 x) {
    i16x16 neg = x < 0;
    v16 a = (v16)((i16x16)x & 0x7fffffff);
    v16 e = vexp(-a);
    v16 pos_sig = 1.0f / (1.0f + e), neg_sig = e / (1.0f + e);
    v16 sig = (v16)(((i16x16)pos_sig & ~neg) | ((i16x16)neg_sig & neg));
    return x * sig;
}

/* out [n, i] = SiLU(gate) x up for gate_up [n, 2 i] (gate first), SiLU rounded to the dtype
 * before the product as PyTorch's two operators round. A row's last lanes (i % 16) go through
 * the same vector code, padded. */
#define SILU_MUL(NAME, T, LOAD, STORE, ROUND)                                                   \
int NAME(const T *gate_up, long n, long i, T *out) {                                            \
    for (long r = 0; r < n; r++) {                                                              \
        const T *g = gate_up + r * 2 * i, *u = g + i;                                           \
        T *o = out + r * i;                                                                     \
        for (long j = 0; j < i; j += 16) {                                                      \
            float x[16] = {0}, s[16];                                                           \
            long m = i - j < 16 ? i - j : 16;                                                   \
            for (long l = 0; l < m; l++)                                                        \
                x[l] = LOAD(g[j + l]);                                                          \
            v16 y = silu(load_f32(x));                                                          \
            memcpy(s, &y, sizeof s);                                                            \
            for (long l = 0; l < m; l++)                                                        \
                o[j + l] = STORE(ROUND(s[l]) * LOAD(u[j + l]));                                 \
        }                                                                                       \
    }                                                                                           \
    return 0;                                                                                   \
}

SILU_MUL(silu_mul_f32, float, IDENTITY, IDENTITY, round_f32)
SILU_MUL(silu_mul_bf16, uint16_t, bf, to_bf, round_bf16)
