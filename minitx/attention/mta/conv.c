/* Multi-token attention's work on (rows x keys) maps, as C loops (called through native.py).
 *
 * conv: the key-query convolution. Per map (one batch row and head), with p = c_k / 2 and a
 * (c_q, c_k) kernel k:
 *
 *     out[i][j] = sum_u sum_w k[u][w] * in~[i + offset + u][j + w - p]     for lo'_i <= j <= hi'_i, else 0
 *
 * where in~ is the input map with every entry outside its row's visible keys [lo_r, hi_r] (and
 * every row outside 0..R_in-1, every key outside 0..N-1) read as zero. The causal mask is thereby
 * part of the convolution: no masked copy of the scores is made, and entries no row may see are
 * not computed. offset = 0 is the convolution; offset = -(c_q - 1) with the kernel flipped on both
 * axes is its transpose (the gradient with respect to the input). kernel_grad: the gradient with
 * respect to the kernel.
 * mixed_softmax (and _grad): pre-softmax head mix, mask, softmax and post-softmax head mix, a row
 * of every head at a time; conv_softmax: the convolution and mixed_softmax together, a tile of rows
 * of every head at a time (no gradient). mix: head mixing alone. gated_norm: the output norm and gate.
 * attend_rows: a whole decoding step of a layer, from q, the cached k and v.
 *
 * Why by hand: oneDNN's depthwise convolution of these maps runs at a tenth of matrix-product
 * speed on CPU, BLAS multiplies by a 4 x 4 head-mixing matrix at a fraction of memory speed, and a
 * decoding step made of small torch operations costs more in dispatch than in arithmetic (all
 * measured: benchmarks/RESULTS.md). The convolution keeps several vector sums in registers and
 * streams c_q padded input rows past them (kept in a ring: each row is padded and masked once).
 * Compiled at first use by minitx/attention/mta/native.py; this file includes itself once for float
 * and once for double.
 */
#ifndef T

#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

/* The vectors the loops are written in, and the tiles of them summed in registers, are sized to the
 * machine the compiler targets (native.py: -march=native): with AVX-512, 64-byte vectors and 32
 * registers; otherwise (AVX2 + FMA, or anything else) 32-byte vectors and tiles that fit 16
 * registers, since 64-byte vectors there are register pairs and the AVX-512 tiles (16 and 18
 * sums) would spill to memory at every step: MTA took 4-7x MHA's time on an AVX2 machine so.
 * Each sum is in the same order either way; only the lanes of the softmax's and the gradients'
 * sums are added in another grouping. That, and GCC's tuning for the CPU (which multiply-adds it
 * fuses: -march=native on an AMD Zen fuses fewer than on an Intel CPU), make builds for two CPUs
 * differ in the last bits; the number of threads does not (add_slots). */
#if defined(__AVX512F__)
#define VECTOR_BYTES 64
/* The convolution's tile: output rows x vectors of keys summed in registers (16 of 32). */
#define TILE_ROWS 4
#define TILE_VECTORS 4
/* The kernel gradient's tile: kernel rows x kernel columns summed in registers (18 of 32), over
 * blocks of keys of the band's rows that stay in L1. */
#define GRAD_ROWS 3
#define GRAD_TAPS 6
/* Dot products of head rows summed at once by the mixes' gradients: 4 x 4, a group of 4 heads. */
#define MIX_TILE 4
#else
#define VECTOR_BYTES 32
#define TILE_ROWS 4
#define TILE_VECTORS 2 /* 8 sums, 2 inputs and a kernel tap of 16 registers */
#define GRAD_ROWS 3
#define GRAD_TAPS 4 /* 12 sums; the inputs are read as operands of the multiply-adds */
#define MIX_TILE 2
#endif
#define GRAD_KEYS 256
/* Rows whose kernel-gradient terms each lane sums in T before they go into a double. */
#define ROW_BLOCK 16

/* The units of work native.py hands the workers: conv_softmax's tiles of rows, conv_softmax_grad's
 * bands of rows; and the vectors' width in bytes (native.build_target reports it). */
const int64_t tile_rows = TILE_ROWS, row_block = ROW_BLOCK, vector_bytes = VECTOR_BYTES;

/* task(worker) for workers 0 .. n_workers - 1, one per thread of OpenMP's team (built with
 * OpenMP; native.py's split, whose task is a Python function making one C call on its worker's
 * range of items); without OpenMP one after the other. */
typedef void (*worker_task)(int64_t worker);

void parallel_workers(worker_task task, int64_t n_workers) {
#pragma omp parallel for schedule(static, 1) num_threads(n_workers)
    for (int64_t t = 0; t < n_workers; t++) task(t);
}

int64_t openmp(void) {
#ifdef _OPENMP
    return 1;
#else
    return 0;
#endif
}

/* out[e] = slots[0][e] + slots[1][e] + ... + slots[n - 1][e], added in that order from 0: the
 * gradients of the kernels and the mixes, whose terms the loops leave in a slot per unit of work
 * (a band of rows, a row) instead of in a sum per thread, so that the number of threads and how
 * the units were split between them change no bit of the result. One thread did the same adds,
 * in the same order, into one sum. */
void add_slots(const double *slots, double *out, int64_t n, int64_t size) {
    for (int64_t e = 0; e < size; e++) out[e] = 0;
    for (int64_t s = 0; s < n; s++)
        for (int64_t e = 0; e < size; e++) out[e] += slots[s * size + e];
}

#define T float
#define IS_FLOAT 1
#define S(name) name##_f32
#include __FILE__
#undef T
#undef IS_FLOAT
#undef S

#define T double
#define IS_FLOAT 0
#define S(name) name##_f64
#include __FILE__
#undef T
#undef IS_FLOAT
#undef S

#else

typedef T S(vec) __attribute__((vector_size(VECTOR_BYTES), aligned(sizeof(T))));
#define LANES ((int64_t)(VECTOR_BYTES / sizeof(T)))

/* Row r of the map, padded by p zeros on the left and masked to its visible keys, into dst. */
static void S(pad_row)(T *dst, int64_t width, const T *map, int64_t r, int64_t n_rows, int64_t N,
                       const int64_t *lo, const int64_t *hi, int64_t p) {
    int64_t a = r < 0 || r >= n_rows || lo[r] < 0 ? 0 : lo[r], b = r < 0 || r >= n_rows ? -1 : hi[r] > N - 1 ? N - 1 : hi[r];
    if (a > b) {
        memset(dst, 0, (size_t)width * sizeof(T));
        return;
    }
    /* zeros around the visible keys only: the row is written once */
    memset(dst, 0, (size_t)(p + a) * sizeof(T));
    memcpy(dst + p + a, map + r * N + a, (size_t)(b - a + 1) * sizeof(T));
    memset(dst + p + b + 1, 0, (size_t)(width - p - b - 1) * sizeof(T));
}

/* pad_row for the convolution's tiles, which read a block's keys straight from the map where all
 * of them are visible (conv_tile): only the parts of the padded row a block near either end of
 * the visible keys a..b reads are written, keys up to a + 2p + block and from b - 2p - block. */
static void S(pad_edges)(T *dst, int64_t width, const T *map, int64_t r, int64_t n_rows, int64_t N,
                         const int64_t *lo, const int64_t *hi, int64_t p, int64_t block) {
    int64_t a = lo[r] < 0 ? 0 : lo[r], b = hi[r] > N - 1 ? N - 1 : hi[r];
    int64_t left_end = a + 2 * p + block < b + 1 ? a + 2 * p + block : b + 1;  /* keys a .. left_end - 1 */
    int64_t right = b - 2 * p - block > left_end ? b - 2 * p - block : left_end;  /* keys right .. b */
    if (right - left_end < 4 * LANES || r < 0 || r >= n_rows) {  /* little in between: the whole row */
        S(pad_row)(dst, width, map, r, n_rows, N, lo, hi, p);
        return;
    }
    memset(dst, 0, (size_t)(p + a) * sizeof(T));
    memcpy(dst + p + a, map + r * N + a, (size_t)(left_end - a) * sizeof(T));
    memcpy(dst + p + right, map + r * N + right, (size_t)(b + 1 - right) * sizeof(T));
    memset(dst + p + b + 1, 0, (size_t)(width - p - b - 1) * sizeof(T));
}

static int S(row_empty)(int64_t r, int64_t n_rows, const int64_t *lo, const int64_t *hi, int64_t N) {
    return r < 0 || r >= n_rows || hi[r] < 0 || lo[r] > N - 1 || lo[r] > hi[r];
}

/* Output rows i0 .. i0 + n_out - 1 (n_out <= TILE_ROWS) of one map into dst (its row i0), rows
 * read through the ring of padded rows (held: the row each slot holds, kept across calls on one
 * map). A tile of TILE_ROWS output rows x TILE_VECTORS vectors of keys is summed in registers: each
 * input vector loaded feeds every output row of the tile that reads its row (up to c_q of them),
 * so that the loop runs on multiply-adds rather than on loads (one load per multiply-add, as a
 * row at a time needs, ran at about half the multiply-add rate). Each output row still adds its
 * terms in the order (u, w), so the result is the same to the bit as a row at a time. */
static void S(conv_tile)(const T *map, T *dst, const T *k, T *ring, int64_t *held, const T **rows, int64_t i0,
                        int64_t n_out, int64_t R_in, int64_t N, int64_t c_q, int64_t c_k, int64_t offset,
                        const int64_t *in_lo, const int64_t *in_hi, const int64_t *out_lo, const int64_t *out_hi) {
    typedef S(vec) V;
    const int64_t p = c_k / 2, block = TILE_VECTORS * LANES, n_slots = c_q + TILE_ROWS - 1;
    const int64_t width = N + 2 * p + block, n_in = n_out + c_q - 1;
    T tail[TILE_VECTORS * LANES];
    /* The tile's input rows, each padded and masked once into the ring (NULL: sees nothing), near
     * the ends of its visible keys; a block whose keys are all visible reads the map itself. */
    const T *direct[TILE_ROWS + 16];  /* c_q <= 17 (else every block reads the ring) */
    int64_t first[TILE_ROWS + 16], last[TILE_ROWS + 16];
    const int use_map = n_in <= TILE_ROWS + 16;
    for (int64_t n = 0; n < n_in; n++) {
        int64_t r = i0 + offset + n, s = (r % n_slots + n_slots) % n_slots;
        rows[n] = NULL;
        if (S(row_empty)(r, R_in, in_lo, in_hi, N)) continue;
        if (held[s] != r) {
            if (use_map) S(pad_edges)(ring + s * width, width, map, r, R_in, N, in_lo, in_hi, p, block);
            else S(pad_row)(ring + s * width, width, map, r, R_in, N, in_lo, in_hi, p);
            held[s] = r;
        }
        rows[n] = ring + s * width;
        if (use_map) {
            direct[n] = map + r * N - p;  /* direct[n][j + w] is in[r][j + w - p] */
            /* blocks j with first <= j <= last read only visible keys j - p .. j + block + p - 1 */
            first[n] = (in_lo[r] < 0 ? 0 : in_lo[r]) + p;
            last[n] = (in_hi[r] > N - 1 ? N - 1 : in_hi[r]) - block - p + 1;
        }
    }
    int64_t lo = N, hi = -1;  /* the keys any row of the tile keeps */
    for (int64_t t = 0; t < n_out; t++) {
        int64_t a = out_lo[i0 + t] < 0 ? 0 : out_lo[i0 + t], b = out_hi[i0 + t] > N - 1 ? N - 1 : out_hi[i0 + t];
        if (a <= b) lo = a < lo ? a : lo, hi = b > hi ? b : hi;
    }
    for (int64_t j = lo; j <= hi; j += block) {
        V a[TILE_ROWS][TILE_VECTORS] = {{{0}}};
        for (int64_t n = 0; n < n_in; n++) {
            if (!rows[n]) continue;
            /* in~[r][j + w - p] is ring[p + j + w - p], or the map's where all is visible */
            const T *x = use_map && j >= first[n] && j <= last[n] ? direct[n] + j : rows[n] + j;
            /* output row t reads this input row through kernel row u = n - t */
            const int64_t t0 = n - c_q + 1 > 0 ? n - c_q + 1 : 0, t1 = n < n_out - 1 ? n : n_out - 1;
            for (int64_t w = 0; w < c_k; w++) {
                V xv[TILE_VECTORS];
                for (int v = 0; v < TILE_VECTORS; v++) xv[v] = *(const V *)(x + w + v * LANES);
                for (int t = 0; t < TILE_ROWS; t++) {
                    if (t < t0 || t > t1) continue;
                    V c = (V){0} + k[(n - t) * c_k + w];
                    for (int v = 0; v < TILE_VECTORS; v++) a[t][v] += c * xv[v];
                }
            }
        }
        for (int t = 0; t < TILE_ROWS; t++) {
            if (t >= n_out) break;
            T *to = j + block <= N ? dst + t * N + j : tail;
            for (int v = 0; v < TILE_VECTORS; v++) *(V *)(to + v * LANES) = a[t][v];
            if (to == tail) memcpy(dst + t * N + j, tail, (size_t)(N - j) * sizeof(T));
        }
    }
    /* Zeros outside each row's keys (the tile wrote its whole span, and nothing else). */
    for (int64_t t = 0; t < n_out; t++) {
        T *row_out = dst + t * N;
        int64_t a = out_lo[i0 + t] < 0 ? 0 : out_lo[i0 + t], b = out_hi[i0 + t] > N - 1 ? N - 1 : out_hi[i0 + t];
        if (a > b) a = N, b = N - 1;
        memset(row_out, 0, (size_t)(a < N ? a : N) * sizeof(T));
        if (a < N) memset(row_out + b + 1, 0, (size_t)(N - 1 - b) * sizeof(T));
    }
}

/* Output rows r0 .. r1 - 1 of maps m0 .. m1 - 1 of in (n_maps, R_in, N) into out (n_maps, R_out, N)
 * (other rows are not written); map m uses kernel m % H. Tiles of conv_tile. */
void S(conv_rows)(const T *in, T *out, const T *kernel, int64_t m0, int64_t m1, int64_t H, int64_t R_in,
                  int64_t R_out, int64_t N, int64_t c_q, int64_t c_k, int64_t offset, int64_t r0, int64_t r1,
                  const int64_t *in_lo, const int64_t *in_hi, const int64_t *out_lo, const int64_t *out_hi) {
    const int64_t n_slots = c_q + TILE_ROWS - 1, width = N + 2 * (c_k / 2) + TILE_VECTORS * LANES;
    T *ring = malloc((size_t)(n_slots * width) * sizeof(T));
    int64_t *held = malloc((size_t)n_slots * sizeof(int64_t));  /* the input row each slot holds */
    const T **rows = malloc((size_t)n_slots * sizeof(T *));
    if (!ring || !held || !rows) goto done;
    for (int64_t m = m0; m < m1; m++) {
        for (int64_t s = 0; s < n_slots; s++) held[s] = INT64_MIN;
        for (int64_t i0 = r0; i0 < r1; i0 += TILE_ROWS)
            S(conv_tile)(in + m * R_in * N, out + (m * R_out + i0) * N, kernel + (m % H) * c_q * c_k, ring, held, rows,
                         i0, r1 - i0 < TILE_ROWS ? r1 - i0 : TILE_ROWS, R_in, N, c_q, c_k, offset, in_lo, in_hi,
                         out_lo, out_hi);
    }
done:
    free(ring), free(held), free(rows);
}

/* Maps m0 .. m1 - 1 of in (n_maps, R_in, N) into out (n_maps, R_out, N), every output row. */
void S(conv)(const T *in, T *out, const T *kernel, int64_t m0, int64_t m1, int64_t H, int64_t R_in, int64_t R_out,
             int64_t N, int64_t c_q, int64_t c_k, int64_t offset, const int64_t *in_lo, const int64_t *in_hi,
             const int64_t *out_lo, const int64_t *out_hi) {
    S(conv_rows)(in, out, kernel, m0, m1, H, R_in, R_out, N, c_q, c_k, offset, 0, R_out, in_lo, in_hi, out_lo, out_hi);
}

/* The kernel gradient's scratch for one map at a time (kernel_grad_band): a ring of padded input
 * rows, the row each slot holds, row pointers, the band's output gradient rows, the sums. */
typedef struct {
    T *ring, *d;
    int64_t *held;
    const T **rows;
    S(vec) *sums;
} S(grad_scratch);

static int S(grad_scratch_new)(S(grad_scratch) *g, int64_t n_maps, int64_t N, int64_t c_q, int64_t c_k) {
    const int64_t n_slots = ROW_BLOCK + c_q - 1, qs = (c_q + GRAD_ROWS - 1) / GRAD_ROWS * GRAD_ROWS;
    const int64_t ks = (c_k + GRAD_TAPS - 1) / GRAD_TAPS * GRAD_TAPS, width = N + 2 * (c_k / 2) + ks + GRAD_KEYS;
    g->ring = malloc((size_t)(n_maps * n_slots * width) * sizeof(T));
    g->d = malloc((size_t)(ROW_BLOCK * (N + GRAD_KEYS)) * sizeof(T));
    g->held = malloc((size_t)(n_maps * n_slots) * sizeof(int64_t));
    g->rows = malloc((size_t)n_slots * sizeof(T *));
    g->sums = malloc((size_t)(qs * ks) * sizeof(S(vec)));
    return g->ring && g->d && g->held && g->rows && g->sums;
}

static void S(grad_scratch_free)(S(grad_scratch) *g) { free(g->ring), free(g->d), free(g->held), free(g->rows), free(g->sums); }

/* grad[u][w] += sum_i sum_j dout[i][j] * in~[i + u][j + w - p] over output rows i0 .. i0 + n_out - 1
 * (n_out <= ROW_BLOCK) of one map and each row's visible keys (the forward wrote zeros elsewhere,
 * so those entries pass no gradient); scratch map `slot` of g (its ring is kept across the bands
 * of one map). A tile of GRAD_ROWS kernel rows x GRAD_TAPS kernel columns is summed in registers
 * over a block of GRAD_KEYS keys at a time (the band's rows of that block stay in L1), each input
 * vector loaded feeding every kernel row that meets it. Each lane sums in T over the band, then
 * the band's sums go into double. */
static void S(kernel_grad_band)(const T *map, const T *dmap, double *grad, S(grad_scratch) *g, int64_t slot,
                                int64_t i0, int64_t n_out, int64_t R_in, int64_t N, int64_t c_q, int64_t c_k,
                                const int64_t *in_lo, const int64_t *in_hi, const int64_t *out_lo,
                                const int64_t *out_hi) {
    typedef S(vec) V;
    const int64_t p = c_k / 2, n_slots = ROW_BLOCK + c_q - 1, n_in = n_out + c_q - 1;
    const int64_t qs = (c_q + GRAD_ROWS - 1) / GRAD_ROWS * GRAD_ROWS, ks = (c_k + GRAD_TAPS - 1) / GRAD_TAPS * GRAD_TAPS;
    const int64_t width = N + 2 * p + ks + GRAD_KEYS, d_width = N + GRAD_KEYS;
    T *ring = g->ring + slot * n_slots * width, *d = g->d;
    int64_t *held = g->held + slot * n_slots;
    const T **rows = g->rows;
    V *sums = g->sums;
    int64_t lo = N, hi = -1;  /* the keys any row of the band keeps */
    for (int64_t t = 0; t < n_out; t++) {
        /* The row's visible gradient, zeros elsewhere: the band's span may pass its ends. */
        int64_t a = out_lo[i0 + t] < 0 ? 0 : out_lo[i0 + t], b = out_hi[i0 + t] > N - 1 ? N - 1 : out_hi[i0 + t];
        T *dt = d + t * d_width;
        if (a > b) {
            memset(dt, 0, (size_t)d_width * sizeof(T));
            continue;
        }
        memset(dt, 0, (size_t)a * sizeof(T));
        memcpy(dt + a, dmap + (i0 + t) * N + a, (size_t)(b - a + 1) * sizeof(T));
        memset(dt + b + 1, 0, (size_t)(d_width - b - 1) * sizeof(T));
        lo = a < lo ? a : lo, hi = b > hi ? b : hi;
    }
    if (lo > hi) return;
    for (int64_t n = 0; n < n_in; n++) {
        int64_t r = i0 + n, s = r % n_slots;
        rows[n] = NULL;
        if (S(row_empty)(r, R_in, in_lo, in_hi, N)) continue;
        if (held[s] != r) S(pad_row)(ring + s * width, width, map, r, R_in, N, in_lo, in_hi, p), held[s] = r;
        rows[n] = ring + s * width;
    }
    memset(sums, 0, (size_t)(qs * ks) * sizeof(V));
    for (int64_t j0 = lo; j0 <= hi; j0 += GRAD_KEYS) {
        const int64_t j1 = j0 + GRAD_KEYS < hi + 1 ? j0 + GRAD_KEYS : hi + 1;
        for (int64_t u0 = 0; u0 < c_q; u0 += GRAD_ROWS)
            for (int64_t w0 = 0; w0 < c_k; w0 += GRAD_TAPS) {
                V a[GRAD_ROWS][GRAD_TAPS];
                for (int uu = 0; uu < GRAD_ROWS; uu++)
                    for (int ww = 0; ww < GRAD_TAPS; ww++) a[uu][ww] = sums[(u0 + uu) * ks + w0 + ww];
                /* input row n meets output row n - u: kernel rows u0 + uu with 0 <= n - u < n_out */
                for (int64_t n = u0; n < n_out + u0 + GRAD_ROWS - 1 && n < n_in; n++) {
                    if (!rows[n]) continue;
                    const T *x = rows[n] + w0;  /* in~[r][j + w - p] is ring[j + w] */
                    for (int64_t j = j0; j < j1; j += LANES) {
                        V xv[GRAD_TAPS];
                        for (int ww = 0; ww < GRAD_TAPS; ww++) xv[ww] = *(const V *)(x + j + ww);
                        for (int uu = 0; uu < GRAD_ROWS; uu++) {
                            int64_t t = n - u0 - uu;  /* the output row, within the band */
                            if (t < 0 || t >= n_out || u0 + uu >= c_q) continue;
                            V dv = *(const V *)(d + t * d_width + j);
                            for (int ww = 0; ww < GRAD_TAPS; ww++) a[uu][ww] += dv * xv[ww];
                        }
                    }
                }
                for (int uu = 0; uu < GRAD_ROWS; uu++)
                    for (int ww = 0; ww < GRAD_TAPS; ww++) sums[(u0 + uu) * ks + w0 + ww] = a[uu][ww];
            }
    }
    for (int64_t u = 0; u < c_q; u++)  /* taps past c_k, rows past c_q: unused */
        for (int64_t w = 0; w < c_k; w++) {
            double total = 0;
            for (int64_t l = 0; l < LANES; l++) total += sums[u * ks + w][l];
            grad[u * c_k + w] += total;
        }
}

/* grad[m][u][w] = sum_i sum_j dout[i][j] * in~[i + u][j + w - p], maps m0 .. m1 - 1, in bands of
 * ROW_BLOCK output rows (kernel_grad_band). */
void S(kernel_grad)(const T *in, const T *dout, double *grad, int64_t m0, int64_t m1, int64_t R_in, int64_t R_out,
                    int64_t N, int64_t c_q, int64_t c_k, const int64_t *in_lo, const int64_t *in_hi,
                    const int64_t *out_lo, const int64_t *out_hi) {
    S(grad_scratch) g;
    if (S(grad_scratch_new)(&g, 1, N, c_q, c_k))
        for (int64_t m = m0; m < m1; m++) {
            memset(grad + m * c_q * c_k, 0, (size_t)(c_q * c_k) * sizeof(double));
            for (int64_t s = 0; s < ROW_BLOCK + c_q - 1; s++) g.held[s] = INT64_MIN;
            for (int64_t i0 = 0; i0 < R_out; i0 += ROW_BLOCK)
                S(kernel_grad_band)(in + m * R_in * N, dout + m * R_out * N, grad + m * c_q * c_k, &g, 0, i0,
                                    R_out - i0 < ROW_BLOCK ? R_out - i0 : ROW_BLOCK, R_in, N, c_q, c_k, in_lo, in_hi,
                                    out_lo, out_hi);
        }
    S(grad_scratch_free)(&g);
}


/* conv and kernel_grad for maps whose rows hold several documents (a packed training batch):
 * the intervals are per batch row, (B, R_in) and (B, R_out), map m reading those of row m / H, and
 * an output row reads only the input rows of its own document. Each row's lo is its document's
 * first key, so the rows of one document are the rows with one lo. Each run of output rows of one
 * document is the plain loop on that document's input rows alone, every other row read as zero:
 * what the document gives when it begins the map, so nothing crosses a document boundary. */
void S(conv_documents)(const T *in, T *out, const T *kernel, int64_t m0, int64_t m1, int64_t H, int64_t R_in,
                       int64_t R_out, int64_t N, int64_t c_q, int64_t c_k, int64_t offset, const int64_t *in_lo,
                       const int64_t *in_hi, const int64_t *out_lo, const int64_t *out_hi) {
    for (int64_t m = m0; m < m1; m++) {
        int64_t b = m / H;
        const int64_t *il = in_lo + b * R_in, *ih = in_hi + b * R_in, *ol = out_lo + b * R_out, *oh = out_hi + b * R_out;
        for (int64_t i0 = 0, i1; i0 < R_out; i0 = i1) {
            for (i1 = i0 + 1; i1 < R_out && ol[i1] == ol[i0]; i1++) {}
            /* Output rows i0 .. i1 - 1 read input rows i0 + offset .. i1 - 1 + offset + c_q - 1; of
             * these, the document's (contiguous: documents are) are ra .. rb - 1. */
            int64_t ra = i0 + offset < 0 ? 0 : i0 + offset, rb = i1 + offset + c_q - 1 > R_in ? R_in : i1 + offset + c_q - 1;
            while (ra < rb && il[ra] != ol[i0]) ra++;
            while (rb > ra && il[rb - 1] != ol[i0]) rb--;
            S(conv)(in + (m * R_in + ra) * N, out + (m * R_out + i0) * N, kernel + (m % H) * c_q * c_k, 0, 1, 1,
                    rb - ra, i1 - i0, N, c_q, c_k, i0 + offset - ra, il + ra, ih + ra, ol + i0, oh + i0);
        }
    }
}

void S(kernel_grad_documents)(const T *in, const T *dout, double *grad, int64_t m0, int64_t m1, int64_t H,
                              int64_t R_in, int64_t R_out, int64_t N, int64_t c_q, int64_t c_k, const int64_t *in_lo,
                              const int64_t *in_hi, const int64_t *out_lo, const int64_t *out_hi) {
    int64_t *lo = malloc((size_t)(2 * (R_out + c_q)) * sizeof(int64_t)), *hi = lo + R_out + c_q;
    double *part = malloc((size_t)(c_q * c_k) * sizeof(double));
    if (!lo || !part) goto done;
    for (int64_t m = m0; m < m1; m++) {
        int64_t b = m / H;
        const int64_t *il = in_lo + b * R_in, *ih = in_hi + b * R_in, *ol = out_lo + b * R_out, *oh = out_hi + b * R_out;
        double *g = grad + m * c_q * c_k;
        memset(g, 0, (size_t)(c_q * c_k) * sizeof(double));
        for (int64_t i0 = 0, i1; i0 < R_out; i0 = i1) {
            for (i1 = i0 + 1; i1 < R_out && ol[i1] == ol[i0]; i1++) {}
            /* kernel_grad's output row i reads input rows i .. i + c_q - 1: its input from row i0,
             * the rows of other documents given no visible key. */
            int64_t n_in = i1 - i0 + c_q - 1 > R_in - i0 ? R_in - i0 : i1 - i0 + c_q - 1;
            for (int64_t r = 0; r < n_in; r++) {
                int same = il[i0 + r] == ol[i0];
                lo[r] = same ? il[i0 + r] : 0, hi[r] = same ? ih[i0 + r] : -1;
            }
            S(kernel_grad)(in + (m * R_in + i0) * N, dout + (m * R_out + i0) * N, part, 0, 1, n_in, i1 - i0, N, c_q,
                           c_k, lo, hi, ol + i0, oh + i0);
            for (int64_t t = 0; t < c_q * c_k; t++) g[t] += part[t];
        }
    }
done:
    free(lo), free(part);
}

/* exp of every lane. float: Cephes' reduction to r in [-ln2/2, ln2/2] and its degree-6 polynomial
 * (about 1 ulp), branch-free so that it stays in vector registers; inputs below -87 (where expf
 * leaves the normal range) give exp(-87) ~ 1.6e-38 instead of less. double: libm, lane by lane. */
static inline S(vec) S(vexp)(S(vec) x) {
#if IS_FLOAT
    typedef S(vec) V;
    typedef int32_t I __attribute__((vector_size(VECTOR_BYTES)));
    I low = x < -87.0f;
    x = (V)(((I)x & ~low) | ((I)((V){0} - 87.0f) & low));
    V n = (x * 1.44269504088896341f + 12582912.0f) - 12582912.0f; /* round(x / ln 2) */
    V r = x - n * 0.693359375f + n * 2.12194440e-4f;
    V y = 1.9875691500E-4f * r + 1.3981999507E-3f;
    y = y * r + 8.3334519073E-3f;
    y = y * r + 4.1665795894E-2f;
    y = y * r + 1.6666665459E-1f;
    y = y * r + 5.0000001201E-1f;
    y = y * r * r + r + 1.0f;
    I e = (__builtin_convertvector(n, I) + 127) << 23;
    return y * (V)e;
#else
    for (int64_t l = 0; l < LANES; l++) x[l] = exp(x[l]);
    return x;
#endif
}

/* Vector sums and maxima: C compilers keep floating-point reductions in order (no vectors) unless told
 * to reassociate everything, which the rest of this file should not be. */
static double S(dot)(const T *x, const T *y, int64_t a, int64_t e) {
    typedef S(vec) V;
    V acc0 = {0}, acc1 = {0};
    int64_t j = a;
    for (; j + 2 * LANES <= e; j += 2 * LANES) {
        acc0 += *(const V *)(x + j) * *(const V *)(y + j);
        acc1 += *(const V *)(x + j + LANES) * *(const V *)(y + j + LANES);
    }
    double sum = 0;
    for (int64_t l = 0; l < LANES; l++) sum += (double)acc0[l] + acc1[l];
    for (; j < e; j++) sum += (double)x[j] * y[j];
    return sum;
}

/* x . y over the D numbers of one head's row (a decoding step's scores): one vector sum, its lanes
 * added in float, as a matrix product would (S(dot) sums lanes in double: slow per key). */
static T S(dot_head)(const T *x, const T *y, int64_t D) {
    typedef S(vec) V;
    V acc = {0};
    int64_t j = 0;
    for (; j + LANES <= D; j += LANES) acc += *(const V *)(x + j) * *(const V *)(y + j);
    T sum = 0;
    for (int64_t l = 0; l < LANES; l++) sum += acc[l];
    for (; j < D; j++) sum += x[j] * y[j];
    return sum;
}

static T S(max)(const T *x, int64_t a, int64_t e) {
    typedef S(vec) V;
    T top = x[a];
    int64_t j = a;
    if (e - a >= LANES) {
        V m = *(const V *)(x + a);
        for (j = a + LANES; j + LANES <= e; j += LANES) {
            V v = *(const V *)(x + j);
            __typeof__(v > m) more = v > m;  /* lanes of all ones where v is larger */
            m = (V)(((__typeof__(more))v & more) | ((__typeof__(more))m & ~more));
        }
        for (int64_t l = 0; l < LANES; l++) top = m[l] > top ? m[l] : top;
    }
    for (; j < e; j++) top = x[j] > top ? x[j] : top;
    return top;
}

/* Softmax of one row's entries a .. e - 1, in place (nothing outside them is read or written). */
static void S(softmax_row)(T *x, int64_t a, int64_t e) {
    typedef S(vec) V;
    T top = S(max)(x, a, e);
    V sum = {0};
    int64_t j = a;
    for (; j + LANES <= e; j += LANES) {
        V v = S(vexp)(*(V *)(x + j) - top);
        *(V *)(x + j) = v;
        sum += v;
    }
    if (j < e) {  /* the last part vector, through a copy padded with -inf (whose exp is ~0, unused) */
        V v = (V){0} - (T)INFINITY;
        for (int64_t l = 0; l < e - j; l++) v[l] = x[j + l];
        v = S(vexp)(v - top);
        for (int64_t l = 0; l < e - j; l++) x[j + l] = v[l], sum[l] += v[l];
    }
    double total = 0;
    for (int64_t l = 0; l < LANES; l++) total += sum[l];
    T scale = (T)(1 / total);
    for (j = a; j < e; j++) x[j] *= scale;
}

/* Head mixing of one row of every head over keys a .. e - 1: within groups of c heads,
 * dst_h = sum_k mix[g][k][h] src_k (transposed: mix[g][h][k]). dst and src: H row pointers (dst
 * must not be src). Each output vector is summed in registers over the c inputs, in order k = 0, 1, ..,
 * and stored once. */
static void S(mix_rows)(T **dst, T *const *src, const T *mix, int64_t transposed, int64_t H, int64_t c, int64_t a,
                        int64_t e) {
    typedef S(vec) V;
    for (int64_t j0 = a; j0 < e; j0 += 512) {  /* a block of each row stays in L1 */
        int64_t j1 = j0 + 512 < e ? j0 + 512 : e;
        for (int64_t h = 0; h < H; h++) {
            int64_t first = h / c * c;
            const T *m = mix + first * c;  /* this group's c x c block */
            T *d = dst[h];
            int64_t j = j0;
            for (; j + 2 * LANES <= j1; j += 2 * LANES) {
                V s0 = {0}, s1 = {0};
                for (int64_t k = 0; k < c; k++) {
                    const T *x = src[first + k] + j;
                    V weight = (V){0} + (transposed ? m[(h - first) * c + k] : m[k * c + h - first]);
                    s0 += weight * *(const V *)x;
                    s1 += weight * *(const V *)(x + LANES);
                }
                *(V *)(d + j) = s0, *(V *)(d + j + LANES) = s1;
            }
            for (; j < j1; j++) {
                T sum = 0;
                for (int64_t k = 0; k < c; k++)
                    sum += (transposed ? m[(h - first) * c + k] : m[k * c + h - first]) * src[first + k][j];
                d[j] = sum;
            }
        }
    }
}

/* grad_mix[g][k][h] += x_k . y_h over keys a .. e - 1, within groups of c heads (in double): a tile
 * of MIX_TILE x MIX_TILE dot products summed in registers per lane, then lane by lane in double. */
static void S(mix_grad_rows)(double *grad_mix, T *const *x, T *const *y, int64_t H, int64_t c, int64_t a, int64_t e) {
    typedef S(vec) V;
    int64_t whole = a + (e - a) / LANES * LANES;
    for (int64_t first = 0; first < H; first += c)
        for (int64_t k0 = 0; k0 < c; k0 += MIX_TILE)
            for (int64_t h0 = 0; h0 < c; h0 += MIX_TILE) {
                V acc[MIX_TILE][MIX_TILE] = {{{0}}};
                const T *xs[MIX_TILE], *ys[MIX_TILE];
                for (int t = 0; t < MIX_TILE; t++) {  /* past the group's end: any row, unused */
                    xs[t] = x[first + (k0 + t < c ? k0 + t : k0)];
                    ys[t] = y[first + (h0 + t < c ? h0 + t : h0)];
                }
                for (int64_t j = a; j < whole; j += LANES) {
                    V xv[MIX_TILE], yv[MIX_TILE];
                    for (int t = 0; t < MIX_TILE; t++) xv[t] = *(const V *)(xs[t] + j), yv[t] = *(const V *)(ys[t] + j);
                    for (int kk = 0; kk < MIX_TILE; kk++)
                        for (int hh = 0; hh < MIX_TILE; hh++) acc[kk][hh] += xv[kk] * yv[hh];
                }
                for (int kk = 0; kk < MIX_TILE && k0 + kk < c; kk++)
                    for (int hh = 0; hh < MIX_TILE && h0 + hh < c; hh++) {
                        double total = 0;
                        for (int64_t l = 0; l < LANES; l++) total += acc[kk][hh][l];
                        for (int64_t j = whole; j < e; j++) total += (double)xs[kk][j] * ys[hh][j];
                        grad_mix[first * c + (k0 + kk) * c + h0 + hh] += total;
                    }
            }
}

static void S(zero_outside)(T *row, int64_t N, int64_t a, int64_t e) {
    memset(row, 0, (size_t)a * sizeof(T));
    memset(row + e, 0, (size_t)(N - e) * sizeof(T));
}

/* One row of every head over keys a .. e - 1: p = softmax(pre-mix of src), dst = post-mix of p
 * (pre, post NULL: no mix; dst may be p then). */
static void S(weigh_row)(T **dst, T **p, T *const *src, const T *pre, const T *post, int64_t H, int64_t c_pre,
                         int64_t c_post, int64_t a, int64_t e) {
    if (pre) S(mix_rows)(p, src, pre, 0, H, c_pre, a, e);
    else for (int64_t h = 0; h < H; h++) if (p[h] != src[h]) memcpy(p[h] + a, src[h] + a, (size_t)(e - a) * sizeof(T));
    for (int64_t h = 0; h < H; h++) S(softmax_row)(p[h], a, e);
    if (post) S(mix_rows)(dst, p, post, 0, H, c_post, a, e);
}

/* One row i of every head (row pointers src, p, dst as weigh_row's) for mixed_softmax: over the
 * row's keys lo_i .. hi_i (lo, hi NULL: every key), zeros elsewhere (in p too if keep_p). */
static void S(softmax_unit)(T **dst, T **p, T *const *src, int keep_p, const T *pre, const T *post, int64_t H,
                            int64_t N, int64_t c_pre, int64_t c_post, int64_t i, const int64_t *lo, const int64_t *hi) {
    int64_t a = !lo || lo[i] < 0 ? 0 : lo[i], e = !hi || hi[i] > N - 1 ? N : hi[i] + 1;
    if (a >= e) {
        for (int64_t h = 0; h < H; h++) {
            memset(dst[h], 0, (size_t)N * sizeof(T));
            if (keep_p) memset(p[h], 0, (size_t)N * sizeof(T));
        }
        return;
    }
    S(weigh_row)(dst, p, src, pre, post, H, c_pre, c_post, a, e);
    for (int64_t h = 0; h < H; h++) {
        S(zero_outside)(dst[h], N, a, e);
        if (keep_p) S(zero_outside)(p[h], N, a, e);
    }
}

/* Rows (b, i), unit u = b * R + i from u0 to u1, of (B, H, R, N) maps; row i of batch row b sees
 * keys lo[b * stride + i] .. hi[b * stride + i] (stride 0: the batch rows share R intervals; R:
 * (B, R) intervals, the documents of a packed batch):
 *     M = pre-mix of C (pre NULL: M = C),  P = softmax of M over the visible keys,
 *     out = post-mix of P (post NULL: out = P);  probs (if not NULL) gets P.
 * pre mixes groups of c_pre heads, post of c_post; everything is 0 outside the visible keys, and a
 * row that sees nothing is 0. lo and hi NULL: every row sees every key. */
void S(mixed_softmax)(const T *scores, T *out, T *probs, const T *pre, const T *post, int64_t u0, int64_t u1, int64_t H,
                      int64_t R, int64_t N, int64_t c_pre, int64_t c_post, const int64_t *lo, const int64_t *hi,
                      int64_t stride) {
    T *buffer = malloc((size_t)(H * N + LANES) * sizeof(T));
    T **rows = malloc((size_t)(3 * H) * sizeof(T *));
    if (!buffer || !rows) goto done;
    T **src = rows, **p = rows + H, **dst = rows + 2 * H;
    for (int64_t unit = u0; unit < u1; unit++) {
        int64_t b = unit / R, i = unit % R;
        for (int64_t h = 0; h < H; h++) {
            size_t at = ((b * H + h) * R + i) * N;
            src[h] = (T *)scores + at, dst[h] = out + at;
            p[h] = probs ? probs + at : (post ? buffer + h * N : out + at);
        }
        S(softmax_unit)(dst, p, src, probs != NULL, pre, post, H, N, c_pre, c_post, i, lo ? lo + b * stride : NULL,
                        hi ? hi + b * stride : NULL);
    }
done:
    free(buffer), free(rows);
}

/* conv (offset 0) then mixed_softmax, a tile of TILE_ROWS rows of every head at a time, so that
 * the convolved scores go from the convolution to the softmax in cache rather than through memory:
 * tiles u = b * n_tiles + i0 / TILE_ROWS from u0 to u1 of scores (B, H, R_in, N) with kernel
 * (H, c_q, c_k); out, probs as
 * mixed_softmax's on (B, H, R_out, N) with the output rows' keys out_lo..out_hi; conved (NULL:
 * not kept) gets the convolved scores. The same numbers as the two calls. */
void S(conv_softmax)(const T *scores, T *conved, T *out, T *probs, const T *kernel, const T *pre, const T *post,
                     int64_t u0, int64_t u1, int64_t H, int64_t R_in, int64_t R_out, int64_t N, int64_t c_q, int64_t c_k,
                     int64_t c_pre, int64_t c_post, const int64_t *in_lo, const int64_t *in_hi, const int64_t *out_lo,
                     const int64_t *out_hi) {
    const int64_t n_slots = c_q + TILE_ROWS - 1, width = N + 2 * (c_k / 2) + TILE_VECTORS * LANES;
    T *ring = malloc((size_t)(H * n_slots * width) * sizeof(T));
    int64_t *held = malloc((size_t)(H * n_slots) * sizeof(int64_t));
    const T **in_rows = malloc((size_t)n_slots * sizeof(T *));
    T *tile = conved ? NULL : malloc((size_t)(H * TILE_ROWS * N) * sizeof(T));
    T *buffer = malloc((size_t)(H * N + LANES) * sizeof(T));
    T **rows = malloc((size_t)(3 * H) * sizeof(T *));
    if (!ring || !held || !in_rows || (!conved && !tile) || !buffer || !rows) goto done;
    T **src = rows, **p = rows + H, **dst = rows + 2 * H;
    const int64_t n_tiles = (R_out + TILE_ROWS - 1) / TILE_ROWS;
    for (int64_t unit = u0, b = -1; unit < u1; unit++) {
        if (unit / n_tiles != b)  /* a new map: its rows are in no slot */
            for (int64_t s = 0; s < H * n_slots; s++) held[s] = INT64_MIN;
        b = unit / n_tiles;
        {
            const int64_t i0 = unit % n_tiles * TILE_ROWS, n_out = R_out - i0 < TILE_ROWS ? R_out - i0 : TILE_ROWS;
            for (int64_t h = 0; h < H; h++) {
                T *to = conved ? conved + ((b * H + h) * R_out + i0) * N : tile + h * TILE_ROWS * N;
                S(conv_tile)(scores + (b * H + h) * R_in * N, to, kernel + h * c_q * c_k, ring + h * n_slots * width,
                             held + h * n_slots, in_rows, i0, n_out, R_in, N, c_q, c_k, 0, in_lo, in_hi, out_lo, out_hi);
            }
            for (int64_t t = 0; t < n_out; t++) {
                for (int64_t h = 0; h < H; h++) {
                    size_t at = ((b * H + h) * R_out + i0 + t) * N;
                    src[h] = conved ? conved + at : tile + (h * TILE_ROWS + t) * N, dst[h] = out + at;
                    p[h] = probs ? probs + at : (post ? buffer + h * N : out + at);
                }
                S(softmax_unit)(dst, p, src, probs != NULL, pre, post, H, N, c_pre, c_post, i0 + t, out_lo, out_hi);
            }
        }
    }
done:
    free(ring), free(held), free(in_rows), free(tile), free(buffer), free(rows);
}

/* The gradient of mixed_softmax for one row of every head over keys a .. e - 1 (a >= e: the row
 * sees nothing), from out's gradient g and the saved P:
 *     dP = post-mix transposed of g,    d post[g][k][h] += P_k . g_h
 *     dM_h = P_h (dP_h - P_h . dP_h)
 *     dC = pre-mix transposed of dM,    d pre[g][k][h] += C_k . dM_h
 * c, p, g: H row pointers (C, P, g); dc gets dC, 0 outside the keys. (d pre, d post: in double, may
 * be NULL when pre, post are.) buffer: 2 H N scratch; dp, dm: H row pointers each, scratch. */
static void S(softmax_grad_row)(T *const *c, T *const *p, T *const *g, T **dc, T *buffer, T **dp, T **dm,
                                const T *pre, const T *post, double *grad_pre, double *grad_post, int64_t H,
                                int64_t N, int64_t c_pre, int64_t c_post, int64_t a, int64_t e) {
    for (int64_t h = 0; h < H; h++) {
        dp[h] = post ? buffer + h * N : g[h];
        dm[h] = pre ? buffer + (H + h) * N : dc[h];
    }
    if (a < e) {
        if (post) {
            S(mix_rows)(dp, g, post, 1, H, c_post, a, e);
            S(mix_grad_rows)(grad_post, p, g, H, c_post, a, e);
        }
        for (int64_t h = 0; h < H; h++) {
            T dot = (T)S(dot)(p[h], dp[h], a, e);
            for (int64_t j = a; j < e; j++) dm[h][j] = p[h][j] * (dp[h][j] - dot);
        }
        if (pre) {
            S(mix_rows)(dc, dm, pre, 1, H, c_pre, a, e);
            S(mix_grad_rows)(grad_pre, c, dm, H, c_pre, a, e);
        }
    } else {
        a = e = 0;
    }
    for (int64_t h = 0; h < H; h++) S(zero_outside)(dc[h], N, a, e);
}

/* mixed_softmax's gradient for rows (b, i), unit u = b * R + i from u0 to u1 (softmax_grad_row):
 * scores are its C, probs its saved P, grad out's gradient; grad_scores gets dC. Intervals as
 * mixed_softmax's. grad_pre, grad_post: a slot of H * c_pre (H * c_post) zeros per unit, which gets
 * that row's terms of the mix's gradient (add_slots sums them in the order of the units, so that
 * how the rows were split between threads does not change a bit). */
void S(mixed_softmax_grad)(const T *scores, const T *probs, const T *grad, T *grad_scores, const T *pre, const T *post,
                           double *grad_pre, double *grad_post, int64_t u0, int64_t u1, int64_t H, int64_t R, int64_t N,
                           int64_t c_pre, int64_t c_post, const int64_t *lo, const int64_t *hi, int64_t stride) {
    T *buffer = malloc((size_t)(2 * H * N + LANES) * sizeof(T));
    T **rows = malloc((size_t)(6 * H) * sizeof(T *));
    if (!buffer || !rows) goto done;
    T **c = rows, **p = rows + H, **g = rows + 2 * H, **dc = rows + 3 * H;
    for (int64_t unit = u0; unit < u1; unit++) {
        int64_t b = unit / R, i = unit % R, r = b * stride + i;
        int64_t a = !lo || lo[r] < 0 ? 0 : lo[r], e = !hi || hi[r] > N - 1 ? N : hi[r] + 1;
        for (int64_t h = 0; h < H; h++) {
            size_t at = ((b * H + h) * R + i) * N;
            c[h] = (T *)scores + at, p[h] = (T *)probs + at, g[h] = (T *)grad + at, dc[h] = grad_scores + at;
        }
        S(softmax_grad_row)(c, p, g, dc, buffer, rows + 4 * H, rows + 5 * H, pre, post,
                            grad_pre ? grad_pre + unit * H * c_pre : NULL, grad_post ? grad_post + unit * H * c_post : NULL,
                            H, N, c_pre, c_post, a, e);
    }
done:
    free(buffer), free(rows);
}

/* The gradient of conv_softmax whose forward kept the convolved scores C and P (conved; probs, which
 * is out where there is no post mix), from out's gradient `grad`: the gradients of the scores
 * (B, H, R_in, N), of the kernel and of the mixes, in bands of ROW_BLOCK output rows of every head,
 * units u = b * n_bands + band from u0 to u1. A band's rows of dC (softmax_grad_row) go into
 * dconved, where the band's kernel gradient (kernel_grad_band) and the convolution's input gradient
 * (conv_tile with the kernel flipped on both axes, offset -(c_q - 1)) read them while they are in
 * cache: two passes over the map fewer than the three calls, whose numbers these are (the double
 * sums aside, added in another order). Input-gradient row i reads dC rows i - c_q + 1 .. i: rows
 * of u0's map before u0's band's row i0 + c_q - 1 read rows another worker writes, so unless u0's
 * band is its map's first they are left to conv_rows once every worker is done (native.py).
 * grad_kernel: a slot of H * c_q * c_k zeros per unit (band), grad_pre and grad_post (NULL where
 * pre, post are) a slot of H * c_pre (H * c_post) zeros per output row b * R_out + i: each gets its
 * band's (row's) terms, in double, for add_slots to sum in order (independent of the threads). */
void S(conv_softmax_grad)(const T *scores, const T *conved, const T *probs, const T *grad, T *dconved, T *grad_scores,
                          const T *flipped, const T *pre, const T *post, double *grad_kernel, double *grad_pre,
                          double *grad_post, int64_t u0, int64_t u1, int64_t H, int64_t R_in, int64_t R_out, int64_t N,
                          int64_t c_q, int64_t c_k, int64_t c_pre, int64_t c_post, const int64_t *in_lo,
                          const int64_t *in_hi, const int64_t *out_lo, const int64_t *out_hi) {
    const int64_t n_bands = (R_out + ROW_BLOCK - 1) / ROW_BLOCK;
    const int64_t n_slots = c_q + TILE_ROWS - 1, width = N + 2 * (c_k / 2) + TILE_VECTORS * LANES;
    const int64_t first_map = u0 / n_bands, first_band = u0 % n_bands;
    const int64_t safe = first_band ? first_band * ROW_BLOCK + c_q - 1 : 0;  /* first_map's rows from here */
    S(grad_scratch) g;
    int ok = S(grad_scratch_new)(&g, H, N, c_q, c_k);
    T *ring = malloc((size_t)(H * n_slots * width) * sizeof(T));
    int64_t *held = malloc((size_t)(H * n_slots) * sizeof(int64_t));
    const T **in_rows = malloc((size_t)n_slots * sizeof(T *));
    T *buffer = malloc((size_t)(2 * H * N + LANES) * sizeof(T));
    T **rows = malloc((size_t)(6 * H) * sizeof(T *));
    if (!ok || !ring || !held || !in_rows || !buffer || !rows) goto done;
    T **c = rows, **p = rows + H, **gr = rows + 2 * H, **dc = rows + 3 * H;
    for (int64_t unit = u0, b = -1; unit < u1; unit++) {
        if (unit / n_bands != b) {  /* a new map: its rows are in no slot */
            for (int64_t s = 0; s < H * (ROW_BLOCK + c_q - 1); s++) g.held[s] = INT64_MIN;
            for (int64_t s = 0; s < H * n_slots; s++) held[s] = INT64_MIN;
        }
        b = unit / n_bands;
        const int64_t i0 = unit % n_bands * ROW_BLOCK, n_out = R_out - i0 < ROW_BLOCK ? R_out - i0 : ROW_BLOCK;
        for (int64_t i = i0; i < i0 + n_out; i++) {
            int64_t a = out_lo[i] < 0 ? 0 : out_lo[i], e = out_hi[i] > N - 1 ? N : out_hi[i] + 1;
            for (int64_t h = 0; h < H; h++) {
                size_t at = ((b * H + h) * R_out + i) * N;
                c[h] = (T *)conved + at, p[h] = (T *)probs + at, gr[h] = (T *)grad + at, dc[h] = dconved + at;
            }
            const int64_t row = b * R_out + i;
            S(softmax_grad_row)(c, p, gr, dc, buffer, rows + 4 * H, rows + 5 * H, pre, post,
                                grad_pre ? grad_pre + row * H * c_pre : NULL,
                                grad_post ? grad_post + row * H * c_post : NULL, H, N, c_pre, c_post, a, e);
        }
        for (int64_t h = 0; h < H; h++)
            S(kernel_grad_band)(scores + (b * H + h) * R_in * N, dconved + (b * H + h) * R_out * N,
                                grad_kernel + (unit * H + h) * c_q * c_k, &g, h, i0, n_out, R_in, N, c_q, c_k, in_lo,
                                in_hi, out_lo, out_hi);
        /* input-gradient rows first .. last - 1: the band's (and, after the map's last band, the
         * c_q - 1 rows past R_out) */
        int64_t first = b == first_map && i0 < safe ? safe : i0, last = i0 + n_out == R_out ? R_in : i0 + n_out;
        for (int64_t r0 = first; r0 < last; r0 += TILE_ROWS)
            for (int64_t h = 0; h < H; h++)
                S(conv_tile)(dconved + (b * H + h) * R_out * N, grad_scores + ((b * H + h) * R_in + r0) * N,
                             flipped + h * c_q * c_k, ring + h * n_slots * width, held + h * n_slots, in_rows, r0,
                             last - r0 < TILE_ROWS ? last - r0 : TILE_ROWS, R_out, N, c_q, c_k, -(c_q - 1), out_lo,
                             out_hi, in_lo, in_hi);
    }
done:
    S(grad_scratch_free)(&g);
    free(ring), free(held), free(in_rows), free(buffer), free(rows);
}

/* Head mixing of whole rows (b, i), u = b * R + i from u0 to u1 (mix_rows over every key),
 * unless out is NULL; when grad_mix is given (a slot of H * c zeros per unit), its slot u gets
 * [g][k][h] += in_k . other_h (in double): row u's terms of the gradient of mix for an output
 * gradient `other`, for add_slots to sum in order. */
void S(mix)(const T *in, T *out, const T *mix, int64_t transposed, const T *other, double *grad_mix, int64_t u0,
            int64_t u1, int64_t H, int64_t R, int64_t N, int64_t c) {
    T **rows = malloc((size_t)(3 * H) * sizeof(T *));
    if (!rows) return;
    for (int64_t unit = u0; unit < u1; unit++) {
        int64_t b = unit / R, i = unit % R;
        for (int64_t h = 0; h < H; h++) {
            size_t at = ((b * H + h) * R + i) * N;
            rows[h] = (T *)in + at, rows[H + h] = out ? out + at : NULL, rows[2 * H + h] = other ? (T *)other + at : NULL;
        }
        if (out) S(mix_rows)(rows + H, rows, mix, transposed, H, c, 0, N);
        if (grad_mix) S(mix_grad_rows)(grad_mix + unit * H * c, rows, rows + 2 * H, H, c, 0, N);
    }
    free(rows);
}

/* MTA's output norm for rows 0 .. n_rows - 1 of D numbers, without gradients (decoding):
 *     n = x / sqrt(mean(x^2) + eps) * weight,   out = n * sigmoid(n . gate + bias)   */
void S(gated_norm)(const T *x, T *out, const T *weight, const T *gate, const T *bias, double eps, int64_t n_rows,
                   int64_t D) {
    for (int64_t r = 0; r < n_rows; r++) {
        const T *row = x + r * D;
        T *dst = out + r * D;
        double squares = 0, logit = 0;
        for (int64_t d = 0; d < D; d++) squares += (double)row[d] * row[d];
        T scale = (T)(1 / sqrt(squares / D + eps));
        for (int64_t d = 0; d < D; d++) {
            dst[d] = row[d] * scale * weight[d];
            logit += (double)dst[d] * gate[d];
        }
        T open = (T)(1 / (1 + exp(-(logit + bias[0]))));
        for (int64_t d = 0; d < D; d++) dst[d] *= open;
    }
}

/* A decoding step of a layer, without gradients: for batch rows b0 .. b1 - 1 and each head h
 * (kv head g = h / (H / G)), with q's R rows per head of which row r sees keys lo[r] .. hi[r]
 * (lo, hi NULL: every key),
 *     S_h = scale q_h K_g^T,  C = the pre-softmax convolution of S by kernel (H, c_q, c_k) (NULL:
 *     C = S, c_q = 1),  P' = post-mix(softmax(pre-mix(C))),  o_h = P'_h V_g,
 *     out_h = gated_norm(o_h) if norm is given, else o_h,
 * for the last R - c_q + 1 rows (the first c_q - 1 are the convolution's history; a row that sees
 * nothing gets zeros). q: (B, H, R, D) and out: (B, H, R - c_q + 1, D), contiguous; k, v: rows of D
 * numbers, key j of (b, g) at b * batch + g * head + s * D with s = (first_slot + j) mod N: a cache's
 * ring read in position order where it wrapped, without a copy (first_slot: its oldest key's slot). */
void S(attend_rows)(const T *q, const T *k, const T *v, T *out, int64_t batch, int64_t head, const T *kernel,
                    const T *pre, const T *post, const T *norm, const T *gate, const T *bias, double eps, double scale,
                    int64_t b0, int64_t b1, int64_t H, int64_t G, int64_t R, int64_t N, int64_t D, int64_t c_q,
                    int64_t c_k, int64_t c_pre, int64_t c_post, const int64_t *lo, const int64_t *hi,
                    int64_t first_slot) {
    int64_t R_out = R - c_q + 1;
    T *scores = malloc((size_t)(H * R * N) * sizeof(T));
    T *conved = kernel ? malloc((size_t)(H * R_out * N) * sizeof(T)) : scores;
    T *buffer = malloc((size_t)(H * N + LANES) * sizeof(T));
    T **rows = malloc((size_t)(3 * H) * sizeof(T *));
    if (!scores || !conved || !buffer || !rows) goto done;
    T **c = rows, **p = rows + H, **w = rows + 2 * H;
    for (int64_t b = b0; b < b1; b++) {
        for (int64_t h = 0; h < H; h++) {
            const T *kg = k + b * batch + h / (H / G) * head;
            for (int64_t r = 0; r < R; r++) {
                const T *qr = q + ((b * H + h) * R + r) * D;
                T *dst = scores + (h * R + r) * N;
                int64_t a = !lo || lo[r] < 0 ? 0 : lo[r], e = !hi || hi[r] > N - 1 ? N : hi[r] + 1;
                for (int64_t j = a; j < e; j++) {
                    int64_t s = j + first_slot < N ? j + first_slot : j + first_slot - N;
                    dst[j] = (T)(scale * S(dot_head)(qr, kg + s * D, D));
                }
            }
        }
        if (kernel) S(conv)(scores, conved, kernel, 0, H, H, R, R_out, N, c_q, c_k, 0, lo, hi, lo + c_q - 1, hi + c_q - 1);
        for (int64_t i = 0; i < R_out; i++) {
            int64_t r = c_q - 1 + i;
            int64_t a = !lo || lo[r] < 0 ? 0 : lo[r], e = !hi || hi[r] > N - 1 ? N : hi[r] + 1;
            for (int64_t h = 0; h < H; h++) {
                c[h] = conved + (h * R_out + i) * N, p[h] = buffer + h * N, w[h] = post ? c[h] : p[h];
                memset(out + ((b * H + h) * R_out + i) * D, 0, (size_t)D * sizeof(T));
            }
            if (a >= e) continue;
            S(weigh_row)(w, p, c, pre, post, H, c_pre, c_post, a, e);  /* post-mixed weights land in c */
            for (int64_t h = 0; h < H; h++) {
                const T *vg = v + b * batch + h / (H / G) * head;
                T *o = out + ((b * H + h) * R_out + i) * D;
                for (int64_t j = a; j < e; j++) {
                    const T *vj = vg + (j + first_slot < N ? j + first_slot : j + first_slot - N) * D;
                    for (int64_t d = 0; d < D; d++) o[d] += w[h][j] * vj[d];
                }
                if (norm) S(gated_norm)(o, o, norm, gate, bias, eps, 1, D);
            }
        }
    }
done:
    free(scores), free(buffer), free(rows);
    if (kernel) free(conved);
}

#undef LANES
#endif
