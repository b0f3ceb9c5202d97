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

#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

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


/* exp of every lane. float: Cephes' reduction to r in [-ln2/2, ln2/2] and its degree-6 polynomial
 * (about 1 ulp), branch-free so that it stays in vector registers; inputs below -87 (where expf
 * leaves the normal range) give exp(-87) ~ 1.6e-38 instead of less. double: libm, lane by lane. */
static inline S(vec) S(vexp)(S(vec) x) {
    typedef S(vec) V;
#if IS_FLOAT
    typedef int32_t I __attribute__((vector_size(64)));
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

/* Softmax of one row's entries a .. e - 1, in place in x (padded to whole vectors: entries past e
 * are overwritten). */
static void S(softmax_row)(T *x, int64_t a, int64_t e) {
    typedef S(vec) V;
    T top = S(max)(x, a, e);
    int64_t end = a + (e - a + LANES - 1) / LANES * LANES;
    V sum = {0};
    for (int64_t j = a; j < end; j += LANES) {
        V v = S(vexp)(*(V *)(x + j) - top);
        *(V *)(x + j) = v;
        if (j + LANES <= e) sum += v;
        else for (int64_t l = 0; l < e - j; l++) sum[l] += v[l];
    }
    double total = 0;
    for (int64_t l = 0; l < LANES; l++) total += sum[l];
    V scale = (V){0} + (T)(1 / total);
    for (int64_t j = a; j < end; j += LANES) *(V *)(x + j) *= scale;
}

/* Rows (b, i) with index u0 .. u1 - 1 of u = b * R + i: for each group of c heads,
 *     M_h = sum_h' mix[g][h'][h] C_h' (mix NULL: M = C),   P_h = softmax over lo_i..hi_i of M_h
 * (0 elsewhere, and 0 for a row that sees nothing). scores, out: (B, H, R, N). */
void S(mixed_softmax)(const T *scores, T *out, const T *mix, int64_t u0, int64_t u1, int64_t H, int64_t R, int64_t N,
                      int64_t c, const int64_t *lo, const int64_t *hi) {
    T *row = malloc((size_t)(N + LANES) * sizeof(T));
    if (!row) return;
    for (int64_t unit = u0; unit < u1; unit++) {
        int64_t b = unit / R, i = unit % R;
        int64_t a = lo[i] < 0 ? 0 : lo[i], e = (hi[i] > N - 1 ? N - 1 : hi[i]) + 1;
        for (int64_t h = 0; h < H; h++) {
            T *dst = out + ((b * H + h) * R + i) * N;
            if (a >= e) {
                memset(dst, 0, (size_t)N * sizeof(T));
                continue;
            }
            int64_t g = h / c, first = g * c;
            if (mix) {
                const T *m = mix + g * c * c + (h - first);  /* m[h' * c] = mix[g][h'][h] */
                for (int64_t j = a; j < e; j++) row[j] = 0;
                for (int64_t k = 0; k < c; k++) {
                    const T *src = scores + ((b * H + first + k) * R + i) * N;
                    T weight = m[k * c];
                    for (int64_t j = a; j < e; j++) row[j] += weight * src[j];
                }
            } else {
                memcpy(row + a, scores + ((b * H + h) * R + i) * N + a, (size_t)(e - a) * sizeof(T));
            }
            S(softmax_row)(row, a, e);
            memset(dst, 0, (size_t)a * sizeof(T));
            memcpy(dst + a, row + a, (size_t)(e - a) * sizeof(T));
            memset(dst + e, 0, (size_t)(N - e) * sizeof(T));
        }
    }
    free(row);
}

/* The gradient of mixed_softmax for the same rows: with dM_h = P_h (dP_h - sum_j P_h dP_h),
 *     dC_h' = sum_h mix[g][h'][h] dM_h,   dmix[g][h'][h] += sum_j C_h' dM_h   (dmix: G c c, in double)
 * dC is 0 outside each row's visible keys. */
void S(mixed_softmax_grad)(const T *scores, const T *probs, const T *grad, T *grad_scores, const T *mix, double *grad_mix,
                           int64_t u0, int64_t u1, int64_t H, int64_t R, int64_t N, int64_t c, const int64_t *lo,
                           const int64_t *hi) {
    T *rows = malloc((size_t)(c * N + LANES) * sizeof(T));
    if (!rows) return;
    for (int64_t unit = u0; unit < u1; unit++) {
        int64_t b = unit / R, i = unit % R;
        int64_t a = lo[i] < 0 ? 0 : lo[i], e = (hi[i] > N - 1 ? N - 1 : hi[i]) + 1;
        for (int64_t first = 0; first < H; first += c) {
            for (int64_t k = 0; k < c; k++)
                memset(grad_scores + ((b * H + first + k) * R + i) * N, 0, (size_t)N * sizeof(T));
            if (a >= e) continue;
            for (int64_t k = 0; k < c; k++) {  /* dM of head first + k into rows[k] */
                size_t at = ((b * H + first + k) * R + i) * N;
                const T *p = probs + at, *d = grad + at;
                T *dm = mix ? rows + k * N : grad_scores + at;
                T dot = (T)S(dot)(p, d, a, e);
                for (int64_t j = a; j < e; j++) dm[j] = p[j] * (d[j] - dot);
            }
            if (!mix) continue;
            const T *m = mix + (first / c) * c * c;
            double *gm = grad_mix + (first / c) * c * c;
            for (int64_t k = 0; k < c; k++) {  /* k: h' */
                T *dc = grad_scores + ((b * H + first + k) * R + i) * N;
                const T *src = scores + ((b * H + first + k) * R + i) * N;
                for (int64_t h = 0; h < c; h++) {
                    const T *dm = rows + h * N;
                    T weight = m[k * c + h];
                    for (int64_t j = a; j < e; j++) dc[j] += weight * dm[j];
                    gm[k * c + h] += S(dot)(src, dm, a, e);
                }
            }
        }
    }
    free(rows);
}

/* Head mixing of rows (b, i), u = b * R + i from u0 to u1: within each group g of c heads,
 *     out_h = sum_k mix[g][k][h] in_k     (transposed: sum_k mix[g][h][k] in_k, the input's gradient)
 * unless out is NULL, and when grad_mix is given, grad_mix[g][k][h] += in_k . other_h (in double):
 * the gradient of mix for an output gradient `other`. */
void S(mix)(const T *in, T *out, const T *mix, int64_t transposed, const T *other, double *grad_mix, int64_t u0,
            int64_t u1, int64_t H, int64_t R, int64_t N, int64_t c) {
    for (int64_t unit = u0; unit < u1; unit++) {
        int64_t b = unit / R, i = unit % R;
        for (int64_t first = 0; first < H; first += c) {
            const T *m = mix + (first / c) * c * c;
            for (int64_t j0 = 0; out && j0 < N; j0 += 512) {  /* a block of each row stays in L1 */
                int64_t j1 = j0 + 512 < N ? j0 + 512 : N;
                for (int64_t h = 0; h < c; h++) {
                    T *dst = out + ((b * H + first + h) * R + i) * N;
                    for (int64_t k = 0; k < c; k++) {
                        const T *src = in + ((b * H + first + k) * R + i) * N;
                        T weight = transposed ? m[h * c + k] : m[k * c + h];
                        if (k == 0)
                            for (int64_t j = j0; j < j1; j++) dst[j] = weight * src[j];
                        else
                            for (int64_t j = j0; j < j1; j++) dst[j] += weight * src[j];
                    }
                }
            }
            if (!grad_mix) continue;
            double *g = grad_mix + (first / c) * c * c;
            for (int64_t k = 0; k < c; k++)
                for (int64_t h = 0; h < c; h++)
                    g[k * c + h] += S(dot)(in + ((b * H + first + k) * R + i) * N, other + ((b * H + first + h) * R + i) * N, 0, N);
        }
    }
}

#undef LANES
#undef ACCUMULATORS
#undef TAPS
#endif
