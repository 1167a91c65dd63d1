/* Softmax with cross-entropy (forward, gradient) and the accuracy count, on the CPU. */
#include <errno.h>
#include <math.h>

#include "internal.h"

static int labels_ok(size_t n, size_t c, const int32_t *labels) {
  for (size_t i = 0; i < n; i++)
    if (labels[i] < 0 || (size_t)labels[i] >= c) return 0;
  return 1;
}

int wl_softmax_xent_fwd(size_t n, size_t c, const float *logits, const int32_t *labels,
                        float *probs, float *loss) {
  if (n == 0) {
    if (loss) *loss = 0.0f;
    return 0;
  }
  if (c == 0 || !logits || !probs || (loss && !labels)) return -EINVAL;
  if (labels && !labels_ok(n, c, labels)) return -EINVAL;
  double total = 0.0;
  for (size_t i = 0; i < n; i++) {
    const float *x = logits + i * c;
    float *p = probs + i * c;
    float mx = x[0];
    for (size_t j = 1; j < c; j++) mx = x[j] > mx ? x[j] : mx;
    /* Read the label's logit before p (which may be x) overwrites it. */
    float xl = labels ? x[labels[i]] : 0.0f;
    double sum = 0.0;
    for (size_t j = 0; j < c; j++) {
      float e = expf(x[j] - mx);
      p[j] = e;
      sum += e;
    }
    float inv = (float)(1.0 / sum);
    for (size_t j = 0; j < c; j++) p[j] *= inv;
    /* -log softmax = log(sum) - (x_label - max), exact even where the probability underflows. */
    total += log(sum) - ((double)xl - (double)mx);
  }
  if (loss) *loss = (float)(total / (double)n);
  return 0;
}

int wl_softmax_xent_bwd(size_t n, size_t c, const float *probs, const int32_t *labels, float scale,
                        float *dlogits) {
  if (n == 0) return 0;
  if (c == 0 || !probs || !labels || !dlogits) return -EINVAL;
  if (!labels_ok(n, c, labels)) return -EINVAL;
  for (size_t i = 0; i < n; i++) {
    const float *p = probs + i * c;
    float *d = dlogits + i * c;
    float pl = p[labels[i]]; /* before d (which may be p) overwrites it */
    for (size_t j = 0; j < c; j++) d[j] = scale * p[j];
    d[labels[i]] = scale * (pl - 1.0f);
  }
  return 0;
}

int wl_count_correct(size_t n, size_t c, const float *scores, const int32_t *labels,
                     size_t *correct) {
  if (!correct) return -EINVAL;
  *correct = 0;
  if (n == 0) return 0;
  if (c == 0 || !scores || !labels) return -EINVAL;
  size_t ok = 0;
  for (size_t i = 0; i < n; i++) {
    const float *x = scores + i * c;
    size_t best = 0;
    for (size_t j = 1; j < c; j++)
      if (x[j] > x[best]) best = j;
    ok += (int64_t)best == labels[i];
  }
  *correct = ok;
  return 0;
}
