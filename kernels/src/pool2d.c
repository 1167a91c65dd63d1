/* Max pooling (forward and backward, NHWC) and global average pooling on the CPU. */
#include <errno.h>
#include <float.h>
#include <string.h>

#include "internal.h"

int wl_pool2d_init(wl_pool2d_t *pl) {
  if (!pl) return -EINVAL;
  if (pl->stride_h == 0) pl->stride_h = pl->r;
  if (pl->stride_w == 0) pl->stride_w = pl->s;
  if (pl->n <= 0 || pl->h <= 0 || pl->w <= 0 || pl->c <= 0 || pl->r <= 0 || pl->s <= 0 ||
      pl->stride_h <= 0 || pl->stride_w <= 0 || pl->pad_h < 0 || pl->pad_w < 0 ||
      pl->pad_h >= pl->r || pl->pad_w >= pl->s)
    return -EINVAL;
  long long hp = (long long)pl->h + 2LL * pl->pad_h, wp = (long long)pl->w + 2LL * pl->pad_w;
  if (pl->r > hp || pl->s > wp) return -EINVAL;
  pl->p = (int)((hp - pl->r) / pl->stride_h + 1);
  pl->q = (int)((wp - pl->s) / pl->stride_w + 1);
  size_t t;
  if (wl__mul_ok((size_t)pl->n * (size_t)pl->h, (size_t)pl->w * (size_t)pl->c, &t)) return -EINVAL;
  return 0;
}

/* The clipped window of output (oh, ow): rows [*h0, *h1), columns [*w0, *w1). */
static void window(const wl_pool2d_t *pl, int oh, int ow, int *h0, int *h1, int *w0, int *w1) {
  int hs = oh * pl->stride_h - pl->pad_h, ws = ow * pl->stride_w - pl->pad_w;
  *h0 = hs < 0 ? 0 : hs;
  *w0 = ws < 0 ? 0 : ws;
  *h1 = hs + pl->r > pl->h ? pl->h : hs + pl->r;
  *w1 = ws + pl->s > pl->w ? pl->w : ws + pl->s;
}

typedef struct pool_job_s {
  const wl_pool2d_t *pl;
  const float *x, *dy;
  float *y, *dx;
} pool_job_t;

/* Rows of output (n, oh) [lo, hi). Scanning the window in order with a strict > keeps the first
 * maximum, which the backward pass finds again the same way. */
static void maxpool_fwd_range(void *ctx, size_t lo, size_t hi) {
  const pool_job_t *j = ctx;
  const wl_pool2d_t *pl = j->pl;
  const size_t C = (size_t)pl->c, W = (size_t)pl->w;
  for (size_t row = lo; row < hi; row++) {
    size_t n = row / (size_t)pl->p;
    int oh = (int)(row % (size_t)pl->p);
    const float *xn = j->x + n * (size_t)pl->h * W * C;
    for (int ow = 0; ow < pl->q; ow++) {
      float *yo = j->y + (row * (size_t)pl->q + (size_t)ow) * C;
      int h0, h1, w0, w1;
      window(pl, oh, ow, &h0, &h1, &w0, &w1);
      memcpy(yo, xn + ((size_t)h0 * W + (size_t)w0) * C, C * sizeof(float));
      for (int ih = h0; ih < h1; ih++)
        for (int iw = w0; iw < w1; iw++) {
          const float *xi = xn + ((size_t)ih * W + (size_t)iw) * C;
          for (size_t c = 0; c < C; c++) yo[c] = xi[c] > yo[c] ? xi[c] : yo[c];
        }
    }
  }
}

int wl_maxpool2d_fwd(const wl_pool2d_t *pl, const float *x, float *y) {
  if (!pl || !x || !y || pl->p <= 0 || pl->q <= 0) return -EINVAL;
  pool_job_t j = {pl, x, NULL, y, NULL};
  wl__parallel_for((size_t)pl->n * (size_t)pl->p, 8, maxpool_fwd_range, &j);
  return 0;
}

/* Images [lo, hi): each owns its dx, so threads never add into the same element. */
static void maxpool_bwd_range(void *ctx, size_t lo, size_t hi) {
  const pool_job_t *j = ctx;
  const wl_pool2d_t *pl = j->pl;
  const size_t C = (size_t)pl->c, W = (size_t)pl->w, HWC = (size_t)pl->h * W * C;
  enum { CB = 128 };
  float best[CB];
  size_t arg[CB];
  for (size_t n = lo; n < hi; n++) {
    const float *xn = j->x + n * HWC;
    float *dxn = j->dx + n * HWC;
    memset(dxn, 0, HWC * sizeof(float));
    for (int oh = 0; oh < pl->p; oh++)
      for (int ow = 0; ow < pl->q; ow++) {
        const float *dyo =
            j->dy + ((n * (size_t)pl->p + (size_t)oh) * (size_t)pl->q + (size_t)ow) * C;
        int h0, h1, w0, w1;
        window(pl, oh, ow, &h0, &h1, &w0, &w1);
        for (size_t c0 = 0; c0 < C; c0 += CB) {
          size_t nc = C - c0 < CB ? C - c0 : CB;
          size_t first = ((size_t)h0 * W + (size_t)w0) * C + c0;
          for (size_t c = 0; c < nc; c++) best[c] = xn[first + c], arg[c] = first + c;
          for (int ih = h0; ih < h1; ih++)
            for (int iw = w0; iw < w1; iw++) {
              size_t off = ((size_t)ih * W + (size_t)iw) * C + c0;
              for (size_t c = 0; c < nc; c++)
                if (xn[off + c] > best[c]) best[c] = xn[off + c], arg[c] = off + c;
            }
          for (size_t c = 0; c < nc; c++) dxn[arg[c]] += dyo[c0 + c];
        }
      }
  }
}

int wl_maxpool2d_bwd(const wl_pool2d_t *pl, const float *x, const float *dy, float *dx) {
  if (!pl || !x || !dy || !dx || pl->p <= 0 || pl->q <= 0) return -EINVAL;
  pool_job_t j = {pl, x, dy, NULL, dx};
  wl__parallel_for((size_t)pl->n, 1, maxpool_bwd_range, &j);
  return 0;
}

int wl_avgpool_global_fwd(size_t n, size_t hw, size_t c, const float *x, float *y) {
  if (n == 0 || c == 0) return 0;
  if (hw == 0 || !x || !y) return -EINVAL;
  enum { CB = 256 };
  double acc[CB];
  for (size_t i = 0; i < n; i++)
    for (size_t c0 = 0; c0 < c; c0 += CB) {
      size_t nc = c - c0 < CB ? c - c0 : CB;
      for (size_t k = 0; k < nc; k++) acc[k] = 0.0;
      for (size_t p = 0; p < hw; p++) {
        const float *xp = x + (i * hw + p) * c + c0;
        for (size_t k = 0; k < nc; k++) acc[k] += xp[k];
      }
      for (size_t k = 0; k < nc; k++) y[i * c + c0 + k] = (float)(acc[k] / (double)hw);
    }
  return 0;
}

int wl_avgpool_global_bwd(size_t n, size_t hw, size_t c, const float *dy, float *dx) {
  if (n == 0 || c == 0) return 0;
  if (hw == 0 || !dy || !dx) return -EINVAL;
  const float inv = 1.0f / (float)hw;
  for (size_t i = 0; i < n; i++)
    for (size_t p = 0; p < hw; p++) {
      float *d = dx + (i * hw + p) * c;
      for (size_t k = 0; k < c; k++) d[k] = dy[i * c + k] * inv;
    }
  return 0;
}
