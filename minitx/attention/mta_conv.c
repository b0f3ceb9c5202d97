/* The key-query convolution of multi-token attention, computed directly on (rows x keys) maps.
 *
 * Per map (one batch row and head), with p = c_k / 2 and a (c_q, c_k) kernel k:
 *
 *     out[i][j] = sum_u sum_w k[u][w] * in~[i + offset + u][j + w - p]     for lo'_i <= j <= hi'_i, else 0
 *
 * where in~ is the input map with every entry outside its row's visible keys [lo_r, hi_r] (and
 * every row outside 0..R_in-1, every key outside 0..N-1) read as zero. The causal mask is thereby
 * part of the convolution: no masked copy of the scores is made, and entries no row may see are
 * not computed. offset = 0 is the convolution; offset = -(c_q - 1) with the kernel flipped on both
 * axes is its transpose (the gradient with respect to the input). `kernel_grad` is the gradient
 * with respect to the kernel.
 *
 * Why by hand: oneDNN's depthwise convolution of these maps runs at a tenth of matrix-product
 * speed on CPU (measured), while these loops keep several vector sums in registers and stream
 * c_q padded input rows past them (kept in a ring: each row is padded and masked once).
 * Compiled at first use by minitx/attention/native.py; this file includes itself once for float
 * and once for double.
 */
#ifndef T

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#define T float
#define S(name) name##_f32
#include __FILE__
#undef T
#undef S

#define T double
#define S(name) name##_f64
#include __FILE__
#undef T
#undef S

#else

typedef T S(vec) __attribute__((vector_size(64), aligned(sizeof(T))));
#define LANES ((int64_t)(64 / sizeof(T)))
/* Independent sums in flight: enough to hide the latency of a multiply-add on two units. */
#define ACCUMULATORS 8
/* Kernel columns whose gradients one pass over a row pair sums at once (11, the LM setting, in one). */
#define TAPS 12

/* Row r of the map, padded by p zeros on the left and masked to its visible keys, into dst. */
static void S(pad_row)(T *dst, int64_t width, const T *map, int64_t r, int64_t n_rows, int64_t N,
                       const int64_t *lo, const int64_t *hi, int64_t p) {
    memset(dst, 0, (size_t)width * sizeof(T));
    if (r < 0 || r >= n_rows) return;
    int64_t a = lo[r] < 0 ? 0 : lo[r], b = hi[r] > N - 1 ? N - 1 : hi[r];
    if (a <= b) memcpy(dst + p + a, map + r * N + a, (size_t)(b - a + 1) * sizeof(T));
}

static int S(row_empty)(int64_t r, int64_t n_rows, const int64_t *lo, const int64_t *hi, int64_t N) {
    return r < 0 || r >= n_rows || hi[r] < 0 || lo[r] > N - 1 || lo[r] > hi[r];
}

/* Maps m0 .. m1 - 1 of in (n_maps, R_in, N) into out (n_maps, R_out, N); map m uses kernel m % H. */
void S(conv)(const T *in, T *out, const T *kernel, int64_t m0, int64_t m1, int64_t H, int64_t R_in, int64_t R_out,
             int64_t N, int64_t c_q, int64_t c_k, int64_t offset, const int64_t *in_lo, const int64_t *in_hi,
             const int64_t *out_lo, const int64_t *out_hi) {
    typedef S(vec) V;
    const int64_t p = c_k / 2, block = ACCUMULATORS * LANES;
    const int64_t width = N + 2 * p + block;  /* the slack lets a block read past the row's end */
    T *ring = malloc((size_t)(c_q * width) * sizeof(T));
    const T **rows = malloc((size_t)c_q * sizeof(T *)), **taps = malloc((size_t)c_q * sizeof(T *));
    T tail[ACCUMULATORS * LANES];
    if (!ring || !rows || !taps) goto done;
    for (int64_t m = m0; m < m1; m++) {
        const T *map = in + m * R_in * N, *k = kernel + (m % H) * c_q * c_k;
        T *dst = out + m * R_out * N;
        for (int64_t u = 0; u < c_q - 1; u++)  /* input row offset + u lives in slot (offset + u) mod c_q */
            S(pad_row)(ring + (((offset + u) % c_q + c_q) % c_q) * width, width, map, offset + u, R_in, N, in_lo, in_hi, p);
        for (int64_t i = 0; i < R_out; i++) {
            int64_t newest = i + offset + c_q - 1;
            S(pad_row)(ring + ((newest % c_q + c_q) % c_q) * width, width, map, newest, R_in, N, in_lo, in_hi, p);
            T *row_out = dst + i * N;
            int64_t lo = out_lo[i] < 0 ? 0 : out_lo[i], hi = out_hi[i] > N - 1 ? N - 1 : out_hi[i];
            if (lo > hi) {
                memset(row_out, 0, (size_t)N * sizeof(T));
                continue;
            }
            memset(row_out, 0, (size_t)lo * sizeof(T));
            memset(row_out + hi + 1, 0, (size_t)(N - 1 - hi) * sizeof(T));
            int64_t n_rows = 0;  /* the input rows this output row reads that have anything visible */
            for (int64_t u = 0; u < c_q; u++) {
                int64_t r = i + offset + u;
                if (S(row_empty)(r, R_in, in_lo, in_hi, N)) continue;
                rows[n_rows] = ring + ((r % c_q + c_q) % c_q) * width;
                taps[n_rows++] = k + u * c_k;
            }
            for (int64_t j = lo; j <= hi; j += block) {
                V a[ACCUMULATORS] = {{0}};
                for (int64_t n = 0; n < n_rows; n++) {
                    const T *x = rows[n] + j;  /* in~[r][j + w - p] is ring[p + j + w - p] */
                    const T *ku = taps[n];
                    for (int64_t w = 0; w < c_k; w++) {
                        V c = (V){0} + ku[w];
                        for (int t = 0; t < ACCUMULATORS; t++) a[t] += c * *(const V *)(x + w + t * LANES);
                    }
                }
                T *to = j + block <= hi + 1 ? row_out + j : tail;
                for (int t = 0; t < ACCUMULATORS; t++) *(V *)(to + t * LANES) = a[t];
                if (to == tail) memcpy(row_out + j, tail, (size_t)(hi + 1 - j) * sizeof(T));
            }
        }
    }
done:
    free(ring), free(rows), free(taps);
}

/* grad[m][u][w] = sum_i sum_j dout[i][j] * in~[i + u][j + w - p] over each output row's visible
 * keys (the forward wrote zeros elsewhere, so those entries pass no gradient). Sums in double. */
void S(kernel_grad)(const T *in, const T *dout, double *grad, int64_t m0, int64_t m1, int64_t R_in, int64_t R_out,
                    int64_t N, int64_t c_q, int64_t c_k, const int64_t *in_lo, const int64_t *in_hi,
                    const int64_t *out_lo, const int64_t *out_hi) {
    typedef S(vec) V;
    const int64_t p = c_k / 2;
    const int64_t width = N + 2 * p + TAPS + LANES;
    T *ring = malloc((size_t)(c_q * width) * sizeof(T));
    if (!ring) return;
    for (int64_t m = m0; m < m1; m++) {
        const T *map = in + m * R_in * N, *dmap = dout + m * R_out * N;
        double *g = grad + m * c_q * c_k;
        memset(g, 0, (size_t)(c_q * c_k) * sizeof(double));
        for (int64_t u = 0; u < c_q - 1; u++)
            S(pad_row)(ring + (u % c_q) * width, width, map, u, R_in, N, in_lo, in_hi, p);
        for (int64_t i = 0; i < R_out; i++) {
            int64_t newest = i + c_q - 1;
            S(pad_row)(ring + (newest % c_q) * width, width, map, newest, R_in, N, in_lo, in_hi, p);
            int64_t lo = out_lo[i] < 0 ? 0 : out_lo[i], hi = out_hi[i] > N - 1 ? N - 1 : out_hi[i];
            if (lo > hi) continue;
            const T *d = dmap + i * N;
            int64_t full = lo + (hi + 1 - lo) / LANES * LANES;  /* vectors up to here, then single entries */
            for (int64_t u = 0; u < c_q; u++) {
                if (S(row_empty)(i + u, R_in, in_lo, in_hi, N)) continue;
                const T *x = ring + ((i + u) % c_q) * width;
                for (int64_t w0 = 0; w0 < c_k; w0 += TAPS) {
                    V a[TAPS] = {{0}};
                    int64_t n_w = c_k - w0 < TAPS ? c_k - w0 : TAPS;
                    for (int64_t j = lo; j < full; j += LANES) {
                        V dv = *(const V *)(d + j);
                        for (int t = 0; t < TAPS; t++)  /* reads past c_k land in the slack: unused */
                            a[t] += dv * *(const V *)(x + j + w0 + t);
                    }
                    for (int64_t t = 0; t < n_w; t++) {
                        double sum = 0;
                        for (int64_t l = 0; l < LANES; l++) sum += a[t][l];
                        for (int64_t j = full; j <= hi; j++) sum += (double)d[j] * x[j + w0 + t];
                        g[u * c_k + w0 + t] += sum;
                    }
                }
            }
        }
    }
    free(ring);
}

#undef LANES
#undef ACCUMULATORS
#undef TAPS
#endif
