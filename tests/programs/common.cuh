// What the test programs share: error checks, a checksum, argument parsing, and the kernels
// with their host twins (run by the CUDA test doubles; unused on a real GPU).
#ifndef WAVELET_TESTS_PROGRAMS_COMMON_CUH
#define WAVELET_TESTS_PROGRAMS_COMMON_CUH

#include <cuda_runtime.h>

#include <ctype.h>
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "wltest_twin.h"

extern const char *wl_prog; // the program's name, for messages

// Any failure: one line naming the call and the error, exit status 1.
#define CK(call)                                                                                   \
  do {                                                                                             \
    cudaError_t ck_ = (call);                                                                      \
    if (ck_ != cudaSuccess) {                                                                      \
      fprintf(stderr, "%s: error: %s failed: %s (%s)\n", wl_prog, #call, cudaGetErrorName(ck_),    \
              cudaGetErrorString(ck_));                                                            \
      exit(1);                                                                                     \
    }                                                                                              \
  } while (0)

// FNV-1a, 64 bits.
static inline uint64_t wl_fnv(uint64_t h, const void *p, size_t n) {
  const unsigned char *b = (const unsigned char *)p;
  for (size_t i = 0; i < n; i++) h = (h ^ b[i]) * 0x100000001b3ull;
  return h;
}
#define WL_FNV_INIT 0xcbf29ce484222325ull

// A count: digits, optionally followed by K, M or G (powers of 1024). Exits on bad input.
static inline unsigned long long wl_arg_size(const char *what, const char *s) {
  char *end;
  errno = 0;
  unsigned long long v = strtoull(s, &end, 10);
  unsigned shift = 0;
  if (*end == 'K' || *end == 'k') shift = 10, end++;
  else if (*end == 'M' || *end == 'm') shift = 20, end++;
  else if (*end == 'G' || *end == 'g') shift = 30, end++;
  if (!isdigit((unsigned char)*s) || errno || *end || v == 0 || v > (~0ull >> shift)) {
    fprintf(stderr, "%s: %s '%s' is not a positive count (digits, optional K/M/G)\n", wl_prog,
            what, s);
    exit(2);
  }
  return v << shift;
}

// ---- kernels: grid-stride loops over unsigned words, deterministic on any grid ----------------

// p[i] = seed * (i + 1)
extern "C" __global__ void wl_fill(unsigned *p, unsigned n, unsigned seed);
// y[i] = y[i] * 31 + x[i] + k
extern "C" __global__ void wl_mix(unsigned *y, const unsigned *x, unsigned n, unsigned k);
// *acc += sum of x[i] (atomic: order-independent)
extern "C" __global__ void wl_sum(const unsigned *x, unsigned n, unsigned long long *acc);

#ifdef WL_PROGRAMS_DEFINE_KERNELS
extern "C" __global__ void wl_fill(unsigned *p, unsigned n, unsigned seed) {
  for (unsigned i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x)
    p[i] = seed * (i + 1);
}
extern "C" __global__ void wl_mix(unsigned *y, const unsigned *x, unsigned n, unsigned k) {
  for (unsigned i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x)
    y[i] = y[i] * 31u + x[i] + k;
}
extern "C" __global__ void wl_sum(const unsigned *x, unsigned n, unsigned long long *acc) {
  for (unsigned i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x)
    atomicAdd(acc, (unsigned long long)x[i]);
}

// The twins: the same on the host, when the doubles enqueue a launch.
extern "C" void wltest_host_wl_fill(const wltest_launch_t *l) {
  unsigned *p = *(unsigned **)l->args[0], n = *(unsigned *)l->args[1],
           seed = *(unsigned *)l->args[2];
  for (unsigned i = 0; i < n; i++) p[i] = seed * (i + 1);
}
extern "C" void wltest_host_wl_mix(const wltest_launch_t *l) {
  unsigned *y = *(unsigned **)l->args[0];
  const unsigned *x = *(const unsigned **)l->args[1];
  unsigned n = *(unsigned *)l->args[2], k = *(unsigned *)l->args[3];
  for (unsigned i = 0; i < n; i++) y[i] = y[i] * 31u + x[i] + k;
}
extern "C" void wltest_host_wl_sum(const wltest_launch_t *l) {
  const unsigned *x = *(const unsigned **)l->args[0];
  unsigned n = *(unsigned *)l->args[1];
  unsigned long long *acc = *(unsigned long long **)l->args[2];
  for (unsigned i = 0; i < n; i++) *acc += x[i];
}
// Argument sizes, so that captured launches can be replayed by the doubles.
extern "C" const unsigned wltest_argsizes_wl_fill[] = {sizeof(unsigned *), sizeof(unsigned),
                                                       sizeof(unsigned), 0};
extern "C" const unsigned wltest_argsizes_wl_mix[] = {sizeof(unsigned *), sizeof(unsigned *),
                                                      sizeof(unsigned), sizeof(unsigned), 0};
extern "C" const unsigned wltest_argsizes_wl_sum[] = {sizeof(unsigned *), sizeof(unsigned),
                                                      sizeof(unsigned long long *), 0};
#endif

#endif
