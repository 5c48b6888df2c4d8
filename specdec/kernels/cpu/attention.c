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
 * Given RoPE's table, the kernel also rotates the new keys before it writes them and each query
 * as it reads it, in float32 (model.rotate's arithmetic, one rounding), where PyTorch ran five
 * operators a layer. bfloat16 tensors are widened to float32 on load and the output rounded to
 * nearest even.
 */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "pool.h"
#include "vec.h"

#ifdef __clang__
#define SHUF(a, b, ...) __builtin_shufflevector(a, b, __VA_ARGS__)
#else
#define SHUF(a, b, ...) __builtin_shuffle(a, b, (i16x16){__VA_ARGS__})
#endif

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

#define MAX_WIDTH 8192   /* H x D of one token: the query and the value sums live on the stack */

/* One call's arguments; each query token is an item of parallel_for (pool.c). */
struct call {
    const void *q, *k, *v;
    void *ck, *cv, *out;
    long sq, sk, sv, max_len, h, kvh, d, window;
    const int64_t *write_slots, *positions, *read_slots;
    float scale, softcap;
    const void *cos, *sin;   /* [n, rot] each, or 0: q and k come rotated */
    long rot;
    _Atomic int failed;
};

/* RoPE on each head of x [heads, d] in place (Hugging Face's half-split layout, model.rotate):
 * its first rot dims become x cos + x' sin, x' the rot dims rolled by rot / 2, sin negated in
 * its first half (model.rotation); dims past rot stay. In float32, rounded once after. */
static void rotate(float *x, long heads, long d, const float *cos, const float *sin, long rot) {
    float y[512];
    for (long j = 0; j < heads; j++) {
        float *head = x + j * d;
        for (long e = 0; e < rot; e++)
            y[e] = head[e] * cos[e] + head[(e + rot / 2) % rot] * sin[e];
        memcpy(head, y, (size_t)rot * sizeof(float));
    }
}

/* T: the element type; LOAD: 16 elements as float32; FROM_F32: one output element. Keys are
 * taken 16 at a time, every head of them while they are in L1, so a query streams its slot's
 * rows once, in order. */
#define ATTEND(NAME, T, LOAD, TO_F32, FROM_F32)                                                \
/* Token i's RoPE table into cos, sin (float32); false where q and k come rotated. */         \
static int NAME##_table(const struct call *a, long i, float *cos, float *sin) {                \
    if (!a->cos)                                                                               \
        return 0;                                                                              \
    for (long e = 0; e < a->rot; e++) {                                                        \
        cos[e] = TO_F32(((const T *)a->cos)[i * a->rot + e]);                                  \
        sin[e] = TO_F32(((const T *)a->sin)[i * a->rot + e]);                                  \
    }                                                                                          \
    return 1;                                                                                  \
}                                                                                              \
                                                                                               \
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
    float cos[512], sin[512];                                                                  \
    if (NAME##_table(a, i, cos, sin))                                                          \
        rotate(qf, h, d, cos, sin, a->rot);                                                    \
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
         float scale, float softcap, const T *cos, const T *sin, long rot, T *out) {          \
    long row = kvh * d, slot_size = max_len * row;                                             \
    if (h * d > MAX_WIDTH || d % 16 || d > 512 || h % kvh || rot > d || rot % 2)               \
        return -2;                                                                             \
    struct call a = {q, k, v, ck, cv, out, sq, sk, sv, max_len, h, kvh, d, window,             \
                     write_slots, positions, read_slots, scale, softcap, cos, sin, rot, 0};    \
    for (long i = 0; i < n; i++) {                                                             \
        T *kd = ck + write_slots[i] * slot_size + positions[i] * row;                          \
        float kf[MAX_WIDTH], cs[512], sn[512];                                                 \
        if (NAME##_table(&a, i, cs, sn)) {                                                     \
            for (long e = 0; e < row; e++)                                                     \
                kf[e] = TO_F32(k[i * sk + e]);                                                 \
            rotate(kf, kvh, d, cs, sn, rot);                                                   \
            for (long e = 0; e < row; e++)                                                     \
                kd[e] = FROM_F32(kf[e]);                                                       \
        } else {                                                                               \
            memcpy(kd, k + i * sk, row * sizeof(T));                                           \
        }                                                                                      \
        memcpy(cv + write_slots[i] * slot_size + positions[i] * row, v + i * sv,              \
               row * sizeof(T));                                                               \
    }                                                                                          \
    parallel_for(NAME##_query, &a, n);                                                         \
    return a.failed ? -1 : 0;                                                                  \
}

#define IDENTITY(x) (x)
ATTEND(attend_f32, float, load_f32, IDENTITY, IDENTITY)
ATTEND(attend_bf16, uint16_t, load_bf16, bf16_to_f32, f32_to_bf16)
