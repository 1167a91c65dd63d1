/* SGD with momentum and Adam/AdamW parameter updates on the CPU (PyTorch's formulas). */
#include <errno.h>
#include <math.h>

#include "internal.h"

#define PAR_GRAIN (1u << 15)

typedef struct opt_job_s {
  const void *opt;
  float *w, *m, *v;
  const float *g;
  float bc1, bc2_sqrt; /* Adam's bias corrections */
} opt_job_t;

static void sgd_range(void *ctx, size_t lo, size_t hi) {
  const opt_job_t *j = ctx;
  const wl_sgd_t *o = j->opt;
  const float lr = o->lr, mu = o->momentum, wd = o->weight_decay;
  for (size_t i = lo; i < hi; i++) {
    float g = j->g[i] + wd * j->w[i];
    if (mu != 0.0f) {
      float v = mu * j->v[i] + g;
      j->v[i] = v;
      g = o->nesterov ? g + mu * v : v;
    }
    j->w[i] -= lr * g;
  }
}

int wl_sgd_step(const wl_sgd_t *opt, size_t n, float *w, const float *g, float *v) {
  if (!opt) return -EINVAL;
  if (n == 0) return 0;
  if (!w || !g || (opt->momentum != 0.0f && !v)) return -EINVAL;
  opt_job_t j = {opt, w, NULL, v, g, 0.0f, 0.0f};
  wl__parallel_for(n, PAR_GRAIN, sgd_range, &j);
  return 0;
}

static void adam_range(void *ctx, size_t lo, size_t hi) {
  const opt_job_t *j = ctx;
  const wl_adam_t *o = j->opt;
  const float b1 = o->beta1, b2 = o->beta2, lr = o->lr, wd = o->weight_decay, eps = o->eps;
  const float step = lr / j->bc1;
  for (size_t i = lo; i < hi; i++) {
    float w = j->w[i], g = j->g[i];
    if (o->decoupled)
      w -= lr * wd * w;
    else
      g += wd * w;
    float m = b1 * j->m[i] + (1.0f - b1) * g;
    float v = b2 * j->v[i] + (1.0f - b2) * g * g;
    j->m[i] = m;
    j->v[i] = v;
    j->w[i] = w - step * m / (sqrtf(v) / j->bc2_sqrt + eps);
  }
}

int wl_adam_step(const wl_adam_t *opt, long step, size_t n, float *w, const float *g, float *m,
                 float *v) {
  if (!opt || step < 1 || !(opt->beta1 >= 0.0f && opt->beta1 < 1.0f) ||
      !(opt->beta2 >= 0.0f && opt->beta2 < 1.0f))
    return -EINVAL;
  if (n == 0) return 0;
  if (!w || !g || !m || !v) return -EINVAL;
  opt_job_t j = {opt, w, m, v, g, 0.0f, 0.0f};
  j.bc1 = (float)(1.0 - pow(opt->beta1, (double)step));
  j.bc2_sqrt = (float)sqrt(1.0 - pow(opt->beta2, (double)step));
  if (!(j.bc1 > 0.0f) || !(j.bc2_sqrt > 0.0f)) return -EINVAL; /* a correction rounded to 0 */
  wl__parallel_for(n, PAR_GRAIN, adam_range, &j);
  return 0;
}
