/* wavelet-bench's random numbers: splitmix64, so a seed gives the same run everywhere. */
#ifndef WB_RNG_H
#define WB_RNG_H

#include <stdint.h>

typedef struct wb_rng_s {
  uint64_t s;
} wb_rng_t;

static inline void wb_rng_seed(wb_rng_t *r, uint64_t seed) {
  r->s = seed;
}

static inline uint64_t wb_rng_next(wb_rng_t *r) {
  uint64_t z = (r->s += 0x9e3779b97f4a7c15ull);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

/* Uniform in [-1, 1). */
static inline float wb_rng_sym(wb_rng_t *r) {
  return (float)((double)(wb_rng_next(r) >> 11) * (2.0 / 9007199254740992.0) - 1.0);
}

#endif
