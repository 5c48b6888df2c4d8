/* y = x W^T on the CPU at the speed of reading W, the same bits for a row whatever M is.
 *
 * A decode step's linear layers are matrix-vector products (M = 1-16 rows): each weight byte is
 * used M times, so the step is bound by reading the weights from memory, and a kernel that
 * streams W at the memory's bandwidth is the whole game. W is packed once at load into tiles of
 * 64 output columns, [ceil(N / 64), K, 64]: tile t holds W[64 t .. 64 t + 63, :] transposed, so
 * the inner loop reads one contiguous stream and multiplies it into 4 vector accumulators per row
 * with a broadcast of x[r, j] (no horizontal sums, no gathers).
 *
 * Every output y[r, n] is one accumulator summed over j = 0 .. K-1 in order, with the same
 * multiply-add, whatever M is and whichever group of rows r was computed in: a row's result is
 * bitwise that of the row alone (batch-invariant, specdec/invariant.py). Rows are taken 6 at a
 * time, so that 24 accumulators and the tile's 4 vectors fit in AVX-512's 32 registers; the tile
 * (K x 256 bytes in float32) stays in L2 across row groups, which makes prefill's many rows run
 * at the core's arithmetic rate.
 *
 * Output tiles are parallel_for's items (pool.c): whichever thread computes a tile, it is the same
 * arithmetic.
 *
 * Written with GCC's portable vector extensions, compiled at load with -march=native for the
 * machine that runs it (build.py): AVX-512 where the CPU has it, two AVX2 halves where not.
 * bfloat16 weights and activations are widened to float32 (a shift), accumulated in float32 and
 * rounded to bfloat16 to nearest even, as PyTorch rounds.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "pool.h"
#include "vec.h"

#ifdef __AVX512BF16__
#include <immintrin.h>
#define PAIRS 1   /* bfloat16 by vdpbf16ps: two products per lane and instruction */
#else
#define PAIRS 0
#endif

#define TILE 64
#define GROUP 6

static inline v16 widen(u16x16 h) {
    u32x16 u = __builtin_convertvector(h, u32x16) << 16;
    v16 f;
    memcpy(&f, &u, sizeof f);
    return f;
}

/* acc[r][0..3] += tile row j (64 columns) * x[r, j], j = 0 .. k-1 in order. */
#define ACCUMULATE(R, LOAD)                                                          \
    v16 acc[R][4];                                                                   \
    memset(acc, 0, sizeof acc);                                                      \
    for (long j = 0; j < k; j++) {                                                   \
        v16 w0, w1, w2, w3;                                                          \
        LOAD;                                                                        \
        for (int r = 0; r < R; r++) {                                                \
            float s = x[r * k + j];                                                  \
            acc[r][0] += w0 * s;                                                     \
            acc[r][1] += w1 * s;                                                     \
            acc[r][2] += w2 * s;                                                     \
            acc[r][3] += w3 * s;                                                     \
        }                                                                            \
    }

#define LOAD_F32                                                                     \
    const v16 *wj = (const v16 *)(w + j * TILE);                                     \
    w0 = wj[0]; w1 = wj[1]; w2 = wj[2]; w3 = wj[3]

#define LOAD_BF16                                                                    \
    const u16x16 *wj = (const u16x16 *)(w + j * TILE);                               \
    w0 = widen(wj[0]); w1 = widen(wj[1]); w2 = widen(wj[2]); w3 = widen(wj[3])

#define F32_ROWS(R)                                                                  \
static void f32_rows##R(const float *x, long k, const float *w, float *y, long ldy,  \
                        int cols) {                                                  \
    ACCUMULATE(R, LOAD_F32)                                                          \
    for (int r = 0; r < R; r++)                                                      \
        memcpy(y + r * ldy, acc[r], cols * sizeof(float));                           \
}
#define BF16_ROWS(R)                                                                 \
static void bf16_rows##R(const float *x, long k, const uint16_t *w, uint16_t *y,     \
                         long ldy, int cols) {                                       \
    ACCUMULATE(R, LOAD_BF16)                                                         \
    for (int r = 0; r < R; r++) {                                                    \
        const float *a = (const float *)acc[r];                                      \
        for (int c = 0; c < cols; c++)                                               \
            y[r * ldy + c] = f32_to_bf16(a[c]);                                      \
    }                                                                                \
}
F32_ROWS(1) F32_ROWS(2) F32_ROWS(3) F32_ROWS(4) F32_ROWS(5) F32_ROWS(6)
#if !PAIRS
BF16_ROWS(1) BF16_ROWS(2) BF16_ROWS(3) BF16_ROWS(4) BF16_ROWS(5) BF16_ROWS(6)
#endif

#if PAIRS
/* bfloat16 on CPUs with AVX512_BF16: packed [ceil(n / 64), ceil(k / 2), 64, 2], a tile's k-pair j
 * holding (W[c, 2j], W[c, 2j + 1]) for its 64 columns c; x as pairs of bfloat16 (one 32-bit
 * word, broadcast). vdpbf16ps adds both products of a pair to a column's float32 accumulator,
 * in a fixed order, at twice the FMA's rate where many rows make the work arithmetic-bound. */
#define PAIR_ROWS(R)                                                                 \
static void pair_rows##R(const uint32_t *x, long k2, const uint16_t *w, uint16_t *y, \
                         long ldy, int cols) {                                       \
    __m512 acc[R][4];                                                                \
    for (int r = 0; r < R; r++)                                                      \
        for (int q = 0; q < 4; q++)                                                  \
            acc[r][q] = _mm512_setzero_ps();                                         \
    for (long j = 0; j < k2; j++) {                                                  \
        const __m512i *wj = (const __m512i *)(w + j * 2 * TILE);                     \
        __m512bh w0 = (__m512bh)_mm512_load_si512(wj);                               \
        __m512bh w1 = (__m512bh)_mm512_load_si512(wj + 1);                           \
        __m512bh w2 = (__m512bh)_mm512_load_si512(wj + 2);                           \
        __m512bh w3 = (__m512bh)_mm512_load_si512(wj + 3);                           \
        for (int r = 0; r < R; r++) {                                                \
            __m512bh s = (__m512bh)_mm512_set1_epi32((int)x[r * k2 + j]);            \
            acc[r][0] = _mm512_dpbf16_ps(acc[r][0], w0, s);                          \
            acc[r][1] = _mm512_dpbf16_ps(acc[r][1], w1, s);                          \
            acc[r][2] = _mm512_dpbf16_ps(acc[r][2], w2, s);                          \
            acc[r][3] = _mm512_dpbf16_ps(acc[r][3], w3, s);                          \
        }                                                                            \
    }                                                                                \
    for (int r = 0; r < R; r++) {                                                    \
        float a[TILE];                                                               \
        for (int q = 0; q < 4; q++)                                                  \
            _mm512_storeu_ps(a + 16 * q, acc[r][q]);                                 \
        for (int c = 0; c < cols; c++)                                               \
            y[r * ldy + c] = f32_to_bf16(a[c]);                                      \
    }                                                                                \
}
PAIR_ROWS(1) PAIR_ROWS(2) PAIR_ROWS(3) PAIR_ROWS(4) PAIR_ROWS(5) PAIR_ROWS(6)
typedef void (*pair_fn)(const uint32_t *, long, const uint16_t *, uint16_t *, long, int);
static const pair_fn PAIR[GROUP + 1] = {0, pair_rows1, pair_rows2, pair_rows3, pair_rows4,
                                        pair_rows5, pair_rows6};
#endif

typedef void (*f32_fn)(const float *, long, const float *, float *, long, int);
static const f32_fn F32[GROUP + 1] = {0, f32_rows1, f32_rows2, f32_rows3, f32_rows4,
                                      f32_rows5, f32_rows6};
#if !PAIRS
typedef void (*bf16_fn)(const float *, long, const uint16_t *, uint16_t *, long, int);
static const bf16_fn BF16[GROUP + 1] = {0, bf16_rows1, bf16_rows2, bf16_rows3, bf16_rows4,
                                        bf16_rows5, bf16_rows6};
#endif

struct call {
    const float *x;          /* [m, k] float32 (bfloat16 inputs widened first) */
    const uint32_t *xp;      /* bfloat16 by pairs: [m, ceil(k / 2)] */
    const void *packed;
    void *y;
    long m, k, n;
};

/* One item of parallel_for: output tile t for every row. */
static void f32_tile(void *arg, long t) {
    const struct call *c = arg;
    int cols = c->n - t * TILE < TILE ? (int)(c->n - t * TILE) : TILE;
    for (long r = 0; r < c->m; r += GROUP) {
        long rows = c->m - r < GROUP ? c->m - r : GROUP;
        F32[rows](c->x + r * c->k, c->k, (const float *)c->packed + t * c->k * TILE,
                  (float *)c->y + r * c->n + t * TILE, c->n, cols);
    }
}

static void bf16_tile(void *arg, long t) {
    const struct call *c = arg;
    int cols = c->n - t * TILE < TILE ? (int)(c->n - t * TILE) : TILE;
    for (long r = 0; r < c->m; r += GROUP) {
        long rows = c->m - r < GROUP ? c->m - r : GROUP;
#if PAIRS
        long k2 = (c->k + 1) / 2;
        PAIR[rows](c->xp + r * k2, k2, (const uint16_t *)c->packed + t * k2 * 2 * TILE,
                   (uint16_t *)c->y + r * c->n + t * TILE, c->n, cols);
#else
        BF16[rows](c->x + r * c->k, c->k, (const uint16_t *)c->packed + t * c->k * TILE,
                   (uint16_t *)c->y + r * c->n + t * TILE, c->n, cols);
#endif
    }
}

/* x [m, k], packed [ceil(n / 64), k, 64] (64-byte aligned), y [m, n]: all contiguous. Returns 0. */
int linear_f32(const float *x, long m, long k, const float *packed, long n, float *y) {
    struct call c = {x, 0, packed, y, m, k, n};
    parallel_for(f32_tile, &c, (n + TILE - 1) / TILE);
    return 0;
}

/* How linear_bf16 wants its weight packed: 1, by pairs of k ([ceil(n / 64), ceil(k / 2), 64, 2]),
 * where the CPU has AVX512_BF16; 0, as float32's. */
int linear_bf16_pairs(void) {
    return PAIRS;
}

/* The same in bfloat16 (raw uint16 bits); returns 0, or -1 where memory ran out. */
int linear_bf16(const uint16_t *x, long m, long k, const uint16_t *packed, long n,
                uint16_t *y) {
#if PAIRS
    long k2 = (k + 1) / 2;
    uint32_t *xp = malloc((size_t)(m * k2) * sizeof(uint32_t));
    if (!xp)
        return -1;
    for (long r = 0; r < m; r++) {   /* a row's last pair padded with a zero */
        xp[r * k2 + k2 - 1] = 0;
        memcpy(xp + r * k2, x + r * k, (size_t)k * sizeof(uint16_t));
    }
    struct call c = {0, xp, packed, y, m, k, n};
    parallel_for(bf16_tile, &c, (n + TILE - 1) / TILE);
    free(xp);
#else
    float *xf = malloc((size_t)(m * k) * sizeof(float));
    if (!xf)
        return -1;
    for (long i = 0; i < m * k; i++)
        xf[i] = bf16_to_f32(x[i]);
    struct call c = {xf, 0, packed, y, m, k, n};
    parallel_for(bf16_tile, &c, (n + TILE - 1) / TILE);
    free(xf);
#endif
    return 0;
}
