/* Bias, ReLU and the BLAS-1 helpers (axpy, scale) on the CPU: memory-bound loops, threaded when
 * large. */
#include <errno.h>
#include <string.h>

#include "internal.h"

/* Below this many elements one thread streams faster than waking others. */
#define PAR_GRAIN (1u << 16)

int wl_bias_add(size_t rows, size_t cols, float *y, const float *bias) {
  if (rows == 0 || cols == 0) return 0;
  if (!y || !bias) return -EINVAL;
  for (size_t i = 0; i < rows; i++) {
    float *row = y + i * cols;
    for (size_t j = 0; j < cols; j++) row[j] += bias[j];
  }
  return 0;
}

int wl_bias_grad(size_t rows, size_t cols, const float *dy, float *dbias) {
  if (cols == 0) return 0;
  if (!dbias || (rows && !dy)) return -EINVAL;
  /* Column sums in double, a block of columns at a time so the accumulators stay on the stack. */
  enum { BLOCK = 256 };
  double acc[BLOCK];
  for (size_t j0 = 0; j0 < cols; j0 += BLOCK) {
    size_t nb = cols - j0 < BLOCK ? cols - j0 : BLOCK;
    for (size_t j = 0; j < nb; j++) acc[j] = 0.0;
    for (size_t i = 0; i < rows; i++) {
      const float *row = dy + i * cols + j0;
      for (size_t j = 0; j < nb; j++) acc[j] += row[j];
    }
    for (size_t j = 0; j < nb; j++) dbias[j0 + j] = (float)acc[j];
  }
  return 0;
}

typedef struct ew_s {
  const float *x, *y;
  float *out;
  float alpha;
} ew_t;

static void relu_fwd_range(void *ctx, size_t lo, size_t hi) {
  const ew_t *e = ctx;
  for (size_t i = lo; i < hi; i++) e->out[i] = e->x[i] > 0.0f ? e->x[i] : 0.0f;
}

int wl_relu_fwd(size_t n, const float *x, float *y) {
  if (n == 0) return 0;
  if (!x || !y) return -EINVAL;
  ew_t e = {x, NULL, y, 0.0f};
  wl__parallel_for(n, PAR_GRAIN, relu_fwd_range, &e);
  return 0;
}

static void relu_bwd_range(void *ctx, size_t lo, size_t hi) {
  const ew_t *e = ctx; /* x: dy, y: forward output */
  for (size_t i = lo; i < hi; i++) e->out[i] = e->y[i] > 0.0f ? e->x[i] : 0.0f;
}

int wl_relu_bwd(size_t n, const float *y, const float *dy, float *dx) {
  if (n == 0) return 0;
  if (!y || !dy || !dx) return -EINVAL;
  ew_t e = {dy, y, dx, 0.0f};
  wl__parallel_for(n, PAR_GRAIN, relu_bwd_range, &e);
  return 0;
}

static void axpy_range(void *ctx, size_t lo, size_t hi) {
  const ew_t *e = ctx;
  for (size_t i = lo; i < hi; i++) e->out[i] += e->alpha * e->x[i];
}

int wl_axpy(size_t n, float alpha, const float *x, float *y) {
  if (n == 0) return 0;
  if (!x || !y) return -EINVAL;
  ew_t e = {x, NULL, y, alpha};
  wl__parallel_for(n, PAR_GRAIN, axpy_range, &e);
  return 0;
}

static void scale_range(void *ctx, size_t lo, size_t hi) {
  const ew_t *e = ctx;
  for (size_t i = lo; i < hi; i++) e->out[i] *= e->alpha;
}

int wl_scale(size_t n, float alpha, float *x) {
  if (n == 0) return 0;
  if (!x) return -EINVAL;
  ew_t e = {NULL, NULL, x, alpha};
  wl__parallel_for(n, PAR_GRAIN, scale_range, &e);
  return 0;
}
