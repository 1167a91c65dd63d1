/* What the kernel benchmarks share in their JSON. */
#ifndef WAVELET_BENCH_KERNELS_JSON_H
#define WAVELET_BENCH_KERNELS_JSON_H

#include <math.h>
#include <stdio.h>

/* A JSON number, or null for NaN and infinity, which JSON cannot say (a wrong result's diff). */
static inline const char *jnum(char *buf, size_t len, double v) {
  if (isfinite(v))
    snprintf(buf, len, "%.2e", v);
  else
    snprintf(buf, len, "null");
  return buf;
}

#endif
