/* Whole-array reductions on the CPU (sum, sum of squares, max, min, max |x|). */
#include <errno.h>
#include <math.h>

#include "internal.h"

int wl_reduce(wl_reduce_op_t op, size_t n, const float *x, float *out) {
  if (!out || (n && !x)) return -EINVAL;
  if (op < WL_REDUCE_SUM || op > WL_REDUCE_ABSMAX) return -EINVAL;
  if (op == WL_REDUCE_SUM || op == WL_REDUCE_SUMSQ) {
    /* Four double accumulators: exact enough for any float array and still vectorisable. */
    double s[4] = {0, 0, 0, 0};
    size_t i = 0;
    if (op == WL_REDUCE_SUM) {
      for (; i + 4 <= n; i += 4)
        for (int u = 0; u < 4; u++) s[u] += x[i + u];
      for (; i < n; i++) s[0] += x[i];
    } else {
      for (; i + 4 <= n; i += 4)
        for (int u = 0; u < 4; u++) s[u] += (double)x[i + u] * x[i + u];
      for (; i < n; i++) s[0] += (double)x[i] * x[i];
    }
    *out = (float)((s[0] + s[1]) + (s[2] + s[3]));
    return 0;
  }
  if (n == 0) return -EINVAL;
  /* A NaN anywhere makes the result NaN, as a sum would be: a diverged tensor must not look
   * finite (a compare-and-keep loop kept or dropped it depending on where it stood). */
  float r = op == WL_REDUCE_ABSMAX ? fabsf(x[0]) : x[0];
  for (size_t i = 1; i < n && r == r; i++) {
    float v = x[i];
    if (v != v)
      r = v;
    else if (op == WL_REDUCE_MAX)
      r = v > r ? v : r;
    else if (op == WL_REDUCE_MIN)
      r = v < r ? v : r;
    else
      r = fabsf(v) > r ? fabsf(v) : r;
  }
  *out = r;
  return 0;
}
