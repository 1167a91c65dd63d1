/* Convolution forward, backward-data and backward-filter on the CPU as implicit GEMMs: the GEMM
 * driver's packing routines gather NHWC/KRSC elements directly, so no im2col matrix is built. */
#include <errno.h>
#include <limits.h>
#include <string.h>

#include "internal.h"

/* ------------------------------------------------------------------------------------------------
 * Descriptor
 * ----------------------------------------------------------------------------------------------*/

static int prod_ok(size_t a, size_t b, size_t c, size_t d) {
  size_t x;
  return wl__mul_ok(a, b, &x) == 0 && wl__mul_ok(x, c, &x) == 0 && wl__mul_ok(x, d, &x) == 0;
}

int wl_conv2d_init(wl_conv2d_t *cv) {
  if (!cv) return -EINVAL;
  if (cv->stride_h == 0) cv->stride_h = 1;
  if (cv->stride_w == 0) cv->stride_w = 1;
  if (cv->dil_h == 0) cv->dil_h = 1;
  if (cv->dil_w == 0) cv->dil_w = 1;
  if (cv->n <= 0 || cv->h <= 0 || cv->w <= 0 || cv->c <= 0 || cv->k <= 0 || cv->r <= 0 ||
      cv->s <= 0 || cv->pad_h < 0 || cv->pad_w < 0 || cv->stride_h < 0 || cv->stride_w < 0 ||
      cv->dil_h < 0 || cv->dil_w < 0)
    return -EINVAL;
  /* In 64 bits so that no int expression below can overflow. */
  long long eh = (long long)(cv->r - 1) * cv->dil_h + 1,
            ew = (long long)(cv->s - 1) * cv->dil_w + 1;
  long long hp = (long long)cv->h + 2LL * cv->pad_h, wp = (long long)cv->w + 2LL * cv->pad_w;
  if (eh > hp || ew > wp || hp > INT_MAX || wp > INT_MAX) return -EINVAL;
  cv->p = (int)((hp - eh) / cv->stride_h + 1);
  cv->q = (int)((wp - ew) / cv->stride_w + 1);
  if (!prod_ok((size_t)cv->n, (size_t)cv->h, (size_t)cv->w, (size_t)cv->c) ||
      !prod_ok((size_t)cv->n, (size_t)cv->p, (size_t)cv->q, (size_t)cv->k) ||
      !prod_ok((size_t)cv->k, (size_t)cv->r, (size_t)cv->s, (size_t)cv->c))
    return -EINVAL;
  return 0;
}

/* ------------------------------------------------------------------------------------------------
 * Forward: Y[NPQ x K] = Xhat[NPQ x RSC] W^T, with Xhat the implicit im2col of x.
 * ----------------------------------------------------------------------------------------------*/

/* Columns [p0, p0+len) of row i (an output pixel) of Xhat, to dst[u*ds]. The columns of one
 * filter row r, (s, c) with c fastest, are contiguous in x when dil_w = 1 (neighbouring s read
 * neighbouring pixels), so each filter row is one clipped copy; otherwise one per (r, s). */
typedef struct xrow_s {
  const float *xn; /* the image */
  long h0, w0;     /* the window's corner, in input pixels (may be negative: padding) */
} xrow_t;

static xrow_t xhat_decode(const wl_conv2d_t *cv, const float *x, size_t i) {
  const size_t PQ = (size_t)cv->p * (size_t)cv->q, n = i / PQ, pq = i % PQ;
  const long oh = (long)(pq / (size_t)cv->q), ow = (long)(pq % (size_t)cv->q);
  xrow_t row = {x + n * (size_t)cv->h * (size_t)cv->w * (size_t)cv->c,
                oh * cv->stride_h - cv->pad_h, ow * cv->stride_w - cv->pad_w};
  return row;
}

static void xhat_row(const wl_conv2d_t *cv, const xrow_t *row, size_t p0, size_t len, float *dst,
                     size_t ds) {
  const size_t C = (size_t)cv->c, S = (size_t)cv->s;
  const float *xn = row->xn;
  const long h0 = row->h0, w0 = row->w0;
  size_t c = p0 % C, rs = p0 / C, s = rs % S, r = rs / S;
  for (size_t t = 0; t < len;) {
    const long ih = h0 + (long)r * cv->dil_h;
    const int row_ok = ih >= 0 && ih < cv->h;
    if (cv->dil_w == 1) {
      /* Offsets L in the filter row: L = s*C + c, pixel w0 + L/C; valid L in [lo, hi). */
      size_t lb = s * C + c, run = S * C - lb < len - t ? S * C - lb : len - t, le = lb + run;
      long vlo = w0 < 0 ? -w0 : 0, vhi = (long)cv->w - w0 < (long)S ? (long)cv->w - w0 : (long)S;
      size_t lo = row_ok && vhi > vlo ? (size_t)vlo * C : le,
             hi = row_ok && vhi > vlo ? (size_t)vhi * C : le;
      if (lo < lb) lo = lb;
      if (hi > le) hi = le;
      if (lo > hi) lo = hi;
      float *d = dst + t * ds;
      size_t u = lb;
      for (; u < lo; u++) d[(u - lb) * ds] = 0.0f;
      if (u < hi) {
        const float *src = xn + (size_t)ih * (size_t)cv->w * C + (size_t)(w0 * (long)C + (long)u);
        for (; u < hi; u++, src++) d[(u - lb) * ds] = *src;
      }
      for (; u < le; u++) d[(u - lb) * ds] = 0.0f;
      t += run;
      c = 0, s = 0, r++;
    } else {
      size_t run = C - c < len - t ? C - c : len - t;
      const long iw = w0 + (long)s * cv->dil_w;
      float *d = dst + t * ds;
      if (row_ok && iw >= 0 && iw < cv->w) {
        const float *src = xn + ((size_t)ih * (size_t)cv->w + (size_t)iw) * C + c;
        for (size_t u = 0; u < run; u++) d[u * ds] = src[u];
      } else {
        for (size_t u = 0; u < run; u++) d[u * ds] = 0.0f;
      }
      t += run;
      c = 0;
      if (++s == S) s = 0, r++;
    }
  }
}

/* Xhat rows (output pixels) [i0, i0+mc), columns (r,s,c) [p0, p0+kc), as MR-panels. */
static void pack_fwd_a(const wl__operand_t *op, size_t i0, size_t mc, size_t p0, size_t kc,
                       float *dst) {
  const wl_conv2d_t *cv = op->ctx;
  const size_t M = (size_t)cv->p * (size_t)cv->q * (size_t)cv->n;
  for (size_t ip = 0; ip < mc; ip += WL__MR, dst += kc * WL__MR) {
    for (size_t ii = 0; ii < WL__MR; ii++) {
      size_t i = i0 + ip + ii;
      if (ip + ii >= mc || i >= M) {
        for (size_t t = 0; t < kc; t++) dst[t * WL__MR + ii] = 0.0f;
        continue;
      }
      xrow_t row = xhat_decode(cv, op->p, i);
      xhat_row(cv, &row, p0, kc, dst + ii, WL__MR);
    }
  }
}

int wl_conv2d_fwd(const wl_conv2d_t *cv, const float *x, const float *w, const float *bias,
                  float *y) {
  if (!cv || !x || !w || !y || cv->p <= 0 || cv->q <= 0) return -EINVAL;
  size_t M = (size_t)cv->n * (size_t)cv->p * (size_t)cv->q, K = (size_t)cv->k;
  size_t CRS = (size_t)cv->c * (size_t)cv->r * (size_t)cv->s;
  wl__operand_t a = {pack_fwd_a, x, 0, cv}, b;
  wl__operand_b(&b, WL_TRANS, w, CRS);
  int rc = wl__gemm(M, K, CRS, 1.0f, &a, &b, 0.0f, y, K);
  if (rc == 0 && bias) rc = wl_bias_add(M, K, y, bias);
  return rc;
}

/* ------------------------------------------------------------------------------------------------
 * Backward data: dX[NHW x C] = dYhat[NHW x RSK] W'[RSK x C]. The reduction runs over (r,s,k), k
 * fastest, so that both gathers read contiguous runs: dy's channels and w's rows.
 * ----------------------------------------------------------------------------------------------*/

/* dYhat row (n,h,w), column (r,s,k): dy[n, oh, ow, k] where h = oh*stride - pad + r*dil, zero
 * where no such output pixel exists. */
static void pack_bwd_data_a(const wl__operand_t *op, size_t i0, size_t mc, size_t p0, size_t kc,
                            float *dst) {
  const wl_conv2d_t *cv = op->ctx;
  const float *dy = op->p;
  const size_t K = (size_t)cv->k, HW = (size_t)cv->h * (size_t)cv->w, M = HW * (size_t)cv->n;
  for (size_t ip = 0; ip < mc; ip += WL__MR, dst += kc * WL__MR) {
    for (size_t ii = 0; ii < WL__MR; ii++) {
      size_t i = i0 + ip + ii;
      float *d = dst + ii;
      if (ip + ii >= mc || i >= M) {
        for (size_t t = 0; t < kc; t++) d[t * WL__MR] = 0.0f;
        continue;
      }
      size_t n = i / HW, hw = i % HW;
      int h = (int)(hw / (size_t)cv->w), w = (int)(hw % (size_t)cv->w);
      const float *dyn = dy + n * (size_t)cv->p * (size_t)cv->q * K;
      size_t k = p0 % K, rs = p0 / K;
      int s = (int)(rs % (size_t)cv->s), r = (int)(rs / (size_t)cv->s);
      for (size_t t = 0; t < kc;) {
        size_t run = K - k < kc - t ? K - k : kc - t;
        int nh = h + cv->pad_h - r * cv->dil_h, nw = w + cv->pad_w - s * cv->dil_w;
        int oh = nh / cv->stride_h, ow = nw / cv->stride_w;
        if (nh >= 0 && nw >= 0 && nh % cv->stride_h == 0 && nw % cv->stride_w == 0 && oh < cv->p &&
            ow < cv->q) {
          const float *src = dyn + ((size_t)oh * (size_t)cv->q + (size_t)ow) * K + k;
          for (size_t u = 0; u < run; u++) d[(t + u) * WL__MR] = src[u];
        } else {
          for (size_t u = 0; u < run; u++) d[(t + u) * WL__MR] = 0.0f;
        }
        t += run;
        k = 0;
        if (++s == cv->s) s = 0, r++;
      }
    }
  }
}

/* W' row (r,s,k), column c: w[k, r, s, c]; a panel row is NR contiguous channels. */
static void pack_bwd_data_b(const wl__operand_t *op, size_t p0, size_t kc, size_t j0, size_t nc,
                            float *dst) {
  const wl_conv2d_t *cv = op->ctx;
  const size_t K = (size_t)cv->k, C = (size_t)cv->c, RS = (size_t)cv->r * (size_t)cv->s;
  for (size_t jp = 0; jp < nc; jp += WL__NR, dst += kc * WL__NR) {
    size_t nr = nc - jp < WL__NR ? nc - jp : WL__NR;
    for (size_t t = 0; t < kc; t++) {
      size_t p = p0 + t, k = p % K, rs = p / K;
      const float *src = op->p + (k * RS + rs) * C + j0 + jp;
      float *d = dst + t * WL__NR;
      size_t j = 0;
      for (; j < nr; j++) d[j] = src[j];
      for (; j < WL__NR; j++) d[j] = 0.0f;
    }
  }
}

int wl_conv2d_bwd_data(const wl_conv2d_t *cv, const float *dy, const float *w, float *dx) {
  if (!cv || !dy || !w || !dx || cv->p <= 0 || cv->q <= 0) return -EINVAL;
  size_t M = (size_t)cv->n * (size_t)cv->h * (size_t)cv->w, C = (size_t)cv->c;
  size_t KRS = (size_t)cv->k * (size_t)cv->r * (size_t)cv->s;
  wl__operand_t a = {pack_bwd_data_a, dy, 0, cv}, b = {pack_bwd_data_b, w, 0, cv};
  return wl__gemm(M, C, KRS, 1.0f, &a, &b, 0.0f, dx, C);
}

/* ------------------------------------------------------------------------------------------------
 * Backward filter: dW[K x RSC] = dY^T[K x NPQ] Xhat[NPQ x RSC].
 * ----------------------------------------------------------------------------------------------*/

/* Xhat rows (output pixels) [p0, p0+kc), columns (r,s,c) [j0, j0+nc), as NR-panels. */
static void pack_bwd_filter_b(const wl__operand_t *op, size_t p0, size_t kc, size_t j0, size_t nc,
                              float *dst) {
  const wl_conv2d_t *cv = op->ctx;
  for (size_t t = 0; t < kc; t++) {
    xrow_t row = xhat_decode(cv, op->p, p0 + t);
    for (size_t jp = 0; jp < nc; jp += WL__NR) {
      size_t nr = nc - jp < WL__NR ? nc - jp : WL__NR;
      float *d = dst + (jp / WL__NR) * kc * WL__NR + t * WL__NR;
      xhat_row(cv, &row, j0 + jp, nr, d, 1);
      for (size_t u = nr; u < WL__NR; u++) d[u] = 0.0f;
    }
  }
}

int wl_conv2d_bwd_filter(const wl_conv2d_t *cv, const float *x, const float *dy, float *dw,
                         float *dbias) {
  if (!cv || !x || !dy || !dw || cv->p <= 0 || cv->q <= 0) return -EINVAL;
  size_t NPQ = (size_t)cv->n * (size_t)cv->p * (size_t)cv->q, K = (size_t)cv->k;
  size_t CRS = (size_t)cv->c * (size_t)cv->r * (size_t)cv->s;
  wl__operand_t a, b = {pack_bwd_filter_b, x, 0, cv};
  wl__operand_a(&a, WL_TRANS, dy, K);
  int rc = wl__gemm(K, CRS, NPQ, 1.0f, &a, &b, 0.0f, dw, CRS);
  if (rc == 0 && dbias) rc = wl_bias_grad(NPQ, K, dy, dbias);
  return rc;
}
