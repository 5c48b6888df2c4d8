/* Attention over the KV slot pool on the CPU: each query alone, reading its slot's keys in place.
 *
 * A forward's new keys and values are written into the pool first (token i at
 * (write_slots[i], positions[i])), then every query token i attends over the keys of slot
 * read_slots[i] at positions lo .. positions[i], lo = positions[i] - window + 1 under a window
 * (else 0): causal within the forward as across it, whatever rows and padding the forward holds.
 * A query's arithmetic depends on nothing but its own keys: scores q.k (D/16 vector products,
 * summed in a fixed order) times scale, capped (softcap > 0: cap * tanh(s / cap)), a softmax in
 * float32 (its max, then exp(s - max) by a polynomial, summed in key order), and the values summed
 * in key order; so a token's output is bitwise the same alone, in a K+1-token verification or
 * beside any other rows (the batch-invariance of specdec/invariant.py), and no mask, gather or
 * padded key is ever computed. Queries are parallel_for's items (pool.c), after the writes.
 *
 * bfloat16 tensors are widened to float32 on load and the output rounded to nearest even.
 */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "pool.h"

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

#ifdef __clang__
#define SHUF(a, b, ...) __builtin_shufflevector(a, b, __VA_ARGS__)
#else
#define SHUF(a, b, ...) __builtin_shuffle(a, b, (i16x16){__VA_ARGS__})
#endif

/* The lanes of v summed by a fixed tree: lane i plus lane i + w, for w = 8, 4, 2, 1. */
static inline float hsum(v16 v) {
    float a[16];
    memcpy(a, &v, sizeof a);
    for (int w = 8; w; w >>= 1)
        for (int i = 0; i < w; i++)
            a[i] += a[i + w];
    return a[0];
}

/* hsum of each of 16 vectors, by the same tree: out lane l = hsum(a[l]), 2 shuffles a sum. */
static inline v16 hsum16(v16 *a) {
    v16 t[8], u[4], w[2];
    for (int i = 0; i < 8; i++)
        t[i] = SHUF(a[2 * i], a[2 * i + 1],
                    0, 1, 2, 3, 4, 5, 6, 7, 16, 17, 18, 19, 20, 21, 22, 23)
             + SHUF(a[2 * i], a[2 * i + 1],
                    8, 9, 10, 11, 12, 13, 14, 15, 24, 25, 26, 27, 28, 29, 30, 31);
    for (int i = 0; i < 4; i++)
        u[i] = SHUF(t[2 * i], t[2 * i + 1],
                    0, 1, 2, 3, 8, 9, 10, 11, 16, 17, 18, 19, 24, 25, 26, 27)
             + SHUF(t[2 * i], t[2 * i + 1],
                    4, 5, 6, 7, 12, 13, 14, 15, 20, 21, 22, 23, 28, 29, 30, 31);
    for (int i = 0; i < 2; i++)
        w[i] = SHUF(u[2 * i], u[2 * i + 1],
                    0, 1, 4, 5, 8, 9, 12, 13, 16, 17, 20, 21, 24, 25, 28, 29)
             + SHUF(u[2 * i], u[2 * i + 1],
                    2, 3, 6, 7, 10, 11, 14, 15, 18, 19, 22, 23, 26, 27, 30, 31);
    return SHUF(w[0], w[1], 0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30)
         + SHUF(w[0], w[1], 1, 3, 5, 7, 9, 11, 13, 15, 17, 19, 21, 23, 25, 27, 29, 31);
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

static inline uint16_t f32_to_bf16(float f) {
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    if ((u & 0x7fffffffu) > 0x7f800000u)
        return (uint16_t)((u >> 16) | 0x40);
    return (uint16_t)((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}

#define MAX_WIDTH 8192   /* H x D of one token: the query and the value sums live on the stack */

/* One call's arguments; each query token is an item of parallel_for (pool.c). */
struct call {
    const void *q, *k, *v;
    void *ck, *cv, *out;
    long sq, sk, sv, max_len, h, kvh, d, window;
    const int64_t *write_slots, *positions, *read_slots;
    float scale, softcap;
    _Atomic int failed;
};

/* T: the element type; LOAD: 16 elements as float32; FROM_F32: one output element. Keys are
 * taken 16 at a time, every head of them while they are in L1, so a query streams its slot's
 * rows once, in order. */
#define ATTEND(NAME, T, LOAD, FROM_F32)                                                        \
static void NAME##_query(void *arg, long i) {                                                  \
    struct call *a = arg;                                                                      \
    const T *q = a->q, *ck = a->ck, *cv = a->cv;                                               \
    T *out = a->out;                                                                           \
    long h = a->h, kvh = a->kvh, d = a->d, max_len = a->max_len;                               \
    long g = h / kvh, chunks = d / 16, row = kvh * d, slot_size = max_len * row;               \
    long stride = max_len + 16;                                                                \
    float scale = a->scale, softcap = a->softcap;                                              \
    float *scores = malloc((size_t)(h * stride) * sizeof(float));                              \
    if (!scores) {                                                                             \
        a->failed = 1;                                                                         \
        return;                                                                                \
    }                                                                                          \
    long pos = a->positions[i];                                                                \
    long first = a->window > 0 && pos - a->window + 1 > 0 ? pos - a->window + 1 : 0;           \
    long keys = pos - first + 1, padded = (keys + 15) / 16 * 16;                               \
    const T *kb = ck + a->read_slots[i] * slot_size + first * row;                             \
    const T *vb = cv + a->read_slots[i] * slot_size + first * row;                             \
    float qf[MAX_WIDTH], top[MAX_WIDTH / 16];                                                  \
    for (long e = 0; e < h * d; e += 16) {                                                     \
        v16 x = LOAD(q + i * a->sq + e);                                                       \
        memcpy(qf + e, &x, sizeof x);                                                          \
    }                                                                                          \
    for (long j = 0; j < h; j++)                                                               \
        top[j] = -INFINITY;                                                                    \
    for (long l0 = 0; l0 < keys; l0 += 16) {                                                   \
        long m = keys - l0 < 16 ? keys - l0 : 16;                                              \
        for (long j = 0; j < h; j++) {                                                         \
            const float *qj = qf + j * d;                                                      \
            const T *key = kb + l0 * row + (j / g) * d;                                        \
            v16 acc[16];                                                                       \
            for (long l = 0; l < 16; l++) {                                                    \
                acc[l] = (v16){};                                                              \
                if (l < m) {                                                                   \
                    acc[l] = load_f32(qj) * LOAD(key + l * row);                               \
                    for (long e = 1; e < chunks; e++)                                          \
                        acc[l] += load_f32(qj + e * 16) * LOAD(key + l * row + e * 16);        \
                }                                                                              \
            }                                                                                  \
            v16 sv16 = hsum16(acc) * scale;                                                    \
            float *dst = scores + j * stride + l0;                                             \
            memcpy(dst, &sv16, sizeof sv16);                                                   \
            for (long l = 0; l < m; l++) {                                                     \
                if (softcap > 0)                                                               \
                    dst[l] = softcap * tanhf(dst[l] / softcap);                                \
                if (dst[l] > top[j])                                                           \
                    top[j] = dst[l];                                                           \
            }                                                                                  \
        }                                                                                      \
    }                                                                                          \
    float total[MAX_WIDTH / 16];                                                               \
    for (long j = 0; j < h; j++) {                                                             \
        float *s = scores + j * stride;                                                        \
        for (long l = keys; l < padded; l++)                                                   \
            s[l] = -INFINITY;                                                                  \
        v16 sum = (v16){};                                                                     \
        for (long l = 0; l < padded; l += 16) {                                                \
            v16 p = vexp(load_f32(s + l) - top[j]);                                            \
            memcpy(s + l, &p, sizeof p);                                                       \
            sum += p;                                                                          \
        }                                                                                      \
        total[j] = hsum(sum);                                                                  \
    }                                                                                          \
    v16 acc[MAX_WIDTH / 16];                                                                   \
    memset(acc, 0, (size_t)(h * chunks) * sizeof(v16));                                        \
    for (long l = 0; l < keys; l++) {                                                          \
        const T *val = vb + l * row;                                                           \
        for (long c = 0; c < kvh; c++)                                                         \
            for (long e = 0; e < chunks; e++) {                                                \
                v16 x = LOAD(val + c * d + e * 16);                                            \
                for (long j = c * g; j < (c + 1) * g; j++)                                     \
                    acc[j * chunks + e] += x * scores[j * stride + l];                         \
            }                                                                                  \
    }                                                                                          \
    for (long j = 0; j < h; j++) {                                                             \
        T *o = out + (i * h + j) * d;                                                          \
        float inv = 1.0f / total[j];                                                           \
        for (long e = 0; e < chunks; e++) {                                                    \
            float y[16];                                                                       \
            v16 r = acc[j * chunks + e] * inv;                                                 \
            memcpy(y, &r, sizeof y);                                                           \
            for (int z = 0; z < 16; z++)                                                       \
                o[e * 16 + z] = FROM_F32(y[z]);                                                \
        }                                                                                      \
    }                                                                                          \
    free(scores);                                                                              \
}                                                                                              \
                                                                                               \
int NAME(const T *q, long sq, const T *k, long sk, const T *v, long sv, T *ck, T *cv,          \
         long max_len, const int64_t *write_slots, const int64_t *positions,                   \
         const int64_t *read_slots, long n, long h, long kvh, long d, long window,             \
         float scale, float softcap, T *out) {                                                 \
    long row = kvh * d, slot_size = max_len * row;                                             \
    if (h * d > MAX_WIDTH || d % 16 || h % kvh)                                                \
        return -2;                                                                             \
    for (long i = 0; i < n; i++) {                                                             \
        memcpy(ck + write_slots[i] * slot_size + positions[i] * row, k + i * sk,              \
               row * sizeof(T));                                                               \
        memcpy(cv + write_slots[i] * slot_size + positions[i] * row, v + i * sv,              \
               row * sizeof(T));                                                               \
    }                                                                                          \
    struct call a = {q, k, v, ck, cv, out, sq, sk, sv, max_len, h, kvh, d, window,             \
                     write_slots, positions, read_slots, scale, softcap, 0};                   \
    parallel_for(NAME##_query, &a, n);                                                         \
    return a.failed ? -1 : 0;                                                                  \
}

#define IDENTITY(x) (x)
ATTEND(attend_f32, float, load_f32, IDENTITY)
ATTEND(attend_bf16, uint16_t, load_bf16, f32_to_bf16)
