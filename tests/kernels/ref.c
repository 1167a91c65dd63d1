/* Naive double-precision references for the kernel tests: the textbook loops, nothing clever. */
#include "ref.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>

static uint64_t rng_state = 0x9e3779b97f4a7c15ull;

void ref_seed(uint64_t seed) {
  rng_state = seed ? seed : 0x9e3779b97f4a7c15ull;
}

uint64_t ref_seed_from_env(uint64_t dflt) {
  const char *s = getenv("WL_TEST_SEED");
  uint64_t seed = s && *s ? strtoull(s, NULL, 0) : dflt;
  fprintf(stderr, "seed %llu (set WL_TEST_SEED to change)\n", (unsigned long long)seed);
  return seed;
}

uint32_t ref_u32(void) {
  /* xorshift64* */
  rng_state ^= rng_state >> 12;
  rng_state ^= rng_state << 25;
  rng_state ^= rng_state >> 27;
  return (uint32_t)((rng_state * 0x2545f4914f6cdd1dull) >> 32);
}

int ref_int(int lo, int hi) {
  return lo + (int)(ref_u32() % (uint32_t)(hi - lo + 1));
}

float ref_uniform(float lo, float hi) {
  return lo + (hi - lo) * (float)(ref_u32() >> 8) * (1.0f / 16777216.0f);
}

void ref_fill(float *x, size_t n, float lo, float hi) {
  for (size_t i = 0; i < n; i++) x[i] = ref_uniform(lo, hi);
}

float *ref_alloc(size_t n) {
  float *p = malloc((n ? n : 1) * sizeof(float));
  if (!p) abort();
  return p;
}

double *ref_dalloc(size_t n) {
  double *p = malloc((n ? n : 1) * sizeof(double));
  if (!p) abort();
  return p;
}

void ref_to_double(const float *x, double *y, size_t n) {
  for (size_t i = 0; i < n; i++) y[i] = x[i];
}

void ref_gemm(wl_trans_t ta, wl_trans_t tb, size_t m, size_t n, size_t k, double alpha,
              const float *a, size_t lda, const float *b, size_t ldb, double beta, const float *c0,
              size_t ldc, double *c, double *absum) {
  for (size_t i = 0; i < m; i++)
    for (size_t j = 0; j < n; j++) {
      double s = 0, as = 0;
      for (size_t p = 0; p < k; p++) {
        double av = ta == WL_TRANS ? a[p * lda + i] : a[i * lda + p];
        double bv = tb == WL_TRANS ? b[j * ldb + p] : b[p * ldb + j];
        s += av * bv;
        as += fabs(av * bv);
      }
      double cv = beta != 0.0 ? beta * c0[i * ldc + j] : 0.0;
      c[i * n + j] = alpha * s + cv;
      absum[i * n + j] = fabs(alpha) * as + fabs(cv);
    }
}

void ref_conv_fwd(const wl_conv2d_t *cv, const double *x, const double *w, const double *bias,
                  double *y) {
  for (int n = 0; n < cv->n; n++)
    for (int p = 0; p < cv->p; p++)
      for (int q = 0; q < cv->q; q++)
        for (int k = 0; k < cv->k; k++) {
          double s = bias ? bias[k] : 0.0;
          for (int r = 0; r < cv->r; r++)
            for (int t = 0; t < cv->s; t++) {
              int h = p * cv->stride_h - cv->pad_h + r * cv->dil_h;
              int ww = q * cv->stride_w - cv->pad_w + t * cv->dil_w;
              if (h < 0 || h >= cv->h || ww < 0 || ww >= cv->w) continue;
              for (int c = 0; c < cv->c; c++)
                s += x[(((size_t)n * cv->h + h) * cv->w + ww) * cv->c + c] *
                     w[(((size_t)k * cv->r + r) * cv->s + t) * cv->c + c];
            }
          y[(((size_t)n * cv->p + p) * cv->q + q) * cv->k + k] = s;
        }
}

/* Scatter form: every (output, filter tap) pair adds its product where it came from. */
void ref_conv_bwd_data(const wl_conv2d_t *cv, const float *dy, const float *w, double *dx) {
  size_t nx = (size_t)cv->n * cv->h * cv->w * cv->c;
  for (size_t i = 0; i < nx; i++) dx[i] = 0.0;
  for (int n = 0; n < cv->n; n++)
    for (int p = 0; p < cv->p; p++)
      for (int q = 0; q < cv->q; q++)
        for (int k = 0; k < cv->k; k++) {
          double g = dy[(((size_t)n * cv->p + p) * cv->q + q) * cv->k + k];
          for (int r = 0; r < cv->r; r++)
            for (int t = 0; t < cv->s; t++) {
              int h = p * cv->stride_h - cv->pad_h + r * cv->dil_h;
              int ww = q * cv->stride_w - cv->pad_w + t * cv->dil_w;
              if (h < 0 || h >= cv->h || ww < 0 || ww >= cv->w) continue;
              for (int c = 0; c < cv->c; c++)
                dx[(((size_t)n * cv->h + h) * cv->w + ww) * cv->c + c] +=
                    g * w[(((size_t)k * cv->r + r) * cv->s + t) * cv->c + c];
            }
        }
}

void ref_conv_bwd_filter(const wl_conv2d_t *cv, const float *x, const float *dy, double *dw) {
  size_t nw = (size_t)cv->k * cv->r * cv->s * cv->c;
  for (size_t i = 0; i < nw; i++) dw[i] = 0.0;
  for (int n = 0; n < cv->n; n++)
    for (int p = 0; p < cv->p; p++)
      for (int q = 0; q < cv->q; q++)
        for (int k = 0; k < cv->k; k++) {
          double g = dy[(((size_t)n * cv->p + p) * cv->q + q) * cv->k + k];
          for (int r = 0; r < cv->r; r++)
            for (int t = 0; t < cv->s; t++) {
              int h = p * cv->stride_h - cv->pad_h + r * cv->dil_h;
              int ww = q * cv->stride_w - cv->pad_w + t * cv->dil_w;
              if (h < 0 || h >= cv->h || ww < 0 || ww >= cv->w) continue;
              for (int c = 0; c < cv->c; c++)
                dw[(((size_t)k * cv->r + r) * cv->s + t) * cv->c + c] +=
                    g * x[(((size_t)n * cv->h + h) * cv->w + ww) * cv->c + c];
            }
        }
}

void ref_maxpool_fwd(const wl_pool2d_t *pl, const double *x, double *y) {
  for (int n = 0; n < pl->n; n++)
    for (int p = 0; p < pl->p; p++)
      for (int q = 0; q < pl->q; q++)
        for (int c = 0; c < pl->c; c++) {
          double best = -INFINITY;
          for (int r = 0; r < pl->r; r++)
            for (int t = 0; t < pl->s; t++) {
              int h = p * pl->stride_h - pl->pad_h + r, w = q * pl->stride_w - pl->pad_w + t;
              if (h < 0 || h >= pl->h || w < 0 || w >= pl->w) continue;
              double v = x[(((size_t)n * pl->h + h) * pl->w + w) * pl->c + c];
              if (v > best) best = v;
            }
          y[(((size_t)n * pl->p + p) * pl->q + q) * pl->c + c] = best;
        }
}

double ref_softmax_xent(size_t n, size_t c, const double *logits, const int32_t *labels) {
  double total = 0;
  for (size_t i = 0; i < n; i++) {
    const double *x = logits + i * c;
    double mx = x[0], s = 0;
    for (size_t j = 1; j < c; j++) mx = x[j] > mx ? x[j] : mx;
    for (size_t j = 0; j < c; j++) s += exp(x[j] - mx);
    total += log(s) + mx - x[labels[i]];
  }
  return total / (double)n;
}

double ref_err(const float *got, const double *want, size_t n, double atol, double rtol) {
  double worst = 0;
  for (size_t i = 0; i < n; i++) {
    double e = fabs((double)got[i] - want[i]) / (atol + rtol * fabs(want[i]));
    if (!(e <= worst)) worst = e; /* NaN propagates as the worst */
    if (isnan(worst)) return worst;
  }
  return worst;
}
