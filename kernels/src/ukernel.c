/* The GEMM micro-kernels on a 12x32 tile: AVX-512 computes it in one register block, AVX2+FMA
 * and the baseline ISA as four 6x16 blocks, all in GCC vector extensions and chosen at run time
 * (scalar loops where vector extensions are missing). */
#include <string.h>

#include "internal.h"

#if defined(__GNUC__)
/* The 6x16 block: 12 of the 16 AVX registers hold it, 2 hold B and 1 the broadcast A (BLIS's
 * Haswell shape). It reads rows [0, 6) and columns [0, 16) of the packed panels, whose steps are
 * MR and NR floats. aligned(4) on the unaligned type lets C rows sit anywhere. */
typedef float wl__v8 __attribute__((vector_size(32)));
typedef float wl__v8u __attribute__((vector_size(32), aligned(4)));
#define R8 6
#define C8 16

/* An edge block's valid part, from the whole block computed into tmp (rows of w floats). */
static inline __attribute__((always_inline)) void
store_edge(const float *tmp, size_t w, float *c, size_t ldc, float beta, size_t mr, size_t nr) {
  for (size_t i = 0; i < mr; i++) {
    float *row = c + i * ldc;
    if (beta == 0.0f)
      for (size_t j = 0; j < nr; j++) row[j] = tmp[i * w + j];
    else
      for (size_t j = 0; j < nr; j++) row[j] = tmp[i * w + j] + beta * row[j];
  }
}

static inline __attribute__((always_inline)) void
ukr_6x16(size_t kc, const float *restrict a, const float *restrict b, float *restrict c, size_t ldc,
         float alpha, float beta, size_t mr, size_t nr) {
  wl__v8 c00 = {0}, c01 = {0}, c10 = {0}, c11 = {0}, c20 = {0}, c21 = {0};
  wl__v8 c30 = {0}, c31 = {0}, c40 = {0}, c41 = {0}, c50 = {0}, c51 = {0};
  b = __builtin_assume_aligned(b, 32);
  /* C is touched only at the end: start fetching its rows now, under the multiply. */
  for (size_t i = 0; i < mr; i++) {
    __builtin_prefetch(c + i * ldc, 1, 3);
    __builtin_prefetch(c + i * ldc + C8 - 1, 1, 3);
  }
  /* A scalar times a vector broadcasts (vbroadcastss from memory feeding two FMAs). */
#pragma GCC unroll 4
  for (size_t p = 0; p < kc; p++) {
    const wl__v8 b0 = *(const wl__v8 *)(b + 0);
    const wl__v8 b1 = *(const wl__v8 *)(b + 8);
    c00 += a[0] * b0;
    c01 += a[0] * b1;
    c10 += a[1] * b0;
    c11 += a[1] * b1;
    c20 += a[2] * b0;
    c21 += a[2] * b1;
    c30 += a[3] * b0;
    c31 += a[3] * b1;
    c40 += a[4] * b0;
    c41 += a[4] * b1;
    c50 += a[5] * b0;
    c51 += a[5] * b1;
    a += WL__MR;
    b += WL__NR;
  }
  wl__v8 acc[R8][2] = {{c00, c01}, {c10, c11}, {c20, c21}, {c30, c31}, {c40, c41}, {c50, c51}};
  if (mr == R8 && nr == C8) {
    for (size_t i = 0; i < R8; i++) {
      wl__v8u *row = (wl__v8u *)(c + i * ldc);
      if (beta == 0.0f) {
        row[0] = alpha * acc[i][0];
        row[1] = alpha * acc[i][1];
      } else {
        row[0] = alpha * acc[i][0] + beta * row[0];
        row[1] = alpha * acc[i][1] + beta * row[1];
      }
    }
    return;
  }
  /* An edge block: the full block goes to the stack, only its valid part to C. */
  float tmp[R8 * C8] __attribute__((aligned(64)));
  for (size_t i = 0; i < R8; i++) {
    *(wl__v8 *)(tmp + i * C8) = alpha * acc[i][0];
    *(wl__v8 *)(tmp + i * C8 + 8) = alpha * acc[i][1];
  }
  store_edge(tmp, C8, c, ldc, beta, mr, nr);
}

/* The tile as four 6x16 blocks (only those holding valid rows and columns). */
static inline __attribute__((always_inline)) void ukr_tiles(size_t kc, const float *a,
                                                            const float *b, float *c, size_t ldc,
                                                            float alpha, float beta, size_t mr,
                                                            size_t nr) {
  for (size_t i0 = 0; i0 < mr; i0 += R8)
    for (size_t j0 = 0; j0 < nr; j0 += C8)
      ukr_6x16(kc, a + i0, b + j0, c + i0 * ldc + j0, ldc, alpha, beta, mr - i0 < R8 ? mr - i0 : R8,
               nr - j0 < C8 ? nr - j0 : C8);
}

#if defined(__x86_64__) || defined(__i386__)
#define WL__HAVE_X86_KERNELS 1
__attribute__((target("avx2,fma"))) static void ukr_avx2(size_t kc, const float *a, const float *b,
                                                         float *c, size_t ldc, float alpha,
                                                         float beta, size_t mr, size_t nr) {
  ukr_tiles(kc, a, b, c, ldc, alpha, beta, mr, nr);
}

/* The whole 12x32 tile: 24 of the 32 zmm registers accumulate, 2 hold B and broadcasts of A
 * feed 24 FMAs per k step (FMA-bound on two FMA ports: 14 loads a step fit two load ports). */
typedef float wl__v16 __attribute__((vector_size(64)));
typedef float wl__v16u __attribute__((vector_size(64), aligned(4)));

__attribute__((target("avx512f"))) static void
ukr_avx512(size_t kc, const float *restrict a, const float *restrict b, float *restrict c,
           size_t ldc, float alpha, float beta, size_t mr, size_t nr) {
  wl__v16 acc[WL__MR][2];
  memset(acc, 0, sizeof acc);
  b = __builtin_assume_aligned(b, 64);
  for (size_t i = 0; i < mr; i++) {
    __builtin_prefetch(c + i * ldc, 1, 3);
    __builtin_prefetch(c + i * ldc + WL__NR - 1, 1, 3);
  }
#pragma GCC unroll 2
  for (size_t p = 0; p < kc; p++) {
    const wl__v16 b0 = *(const wl__v16 *)(b + 0);
    const wl__v16 b1 = *(const wl__v16 *)(b + 16);
#pragma GCC unroll 12
    for (size_t i = 0; i < WL__MR; i++) {
      acc[i][0] += a[i] * b0;
      acc[i][1] += a[i] * b1;
    }
    a += WL__MR;
    b += WL__NR;
  }
  if (mr == WL__MR && nr == WL__NR) {
#pragma GCC unroll 12
    for (size_t i = 0; i < WL__MR; i++) {
      wl__v16u *row = (wl__v16u *)(c + i * ldc);
      if (beta == 0.0f) {
        row[0] = alpha * acc[i][0];
        row[1] = alpha * acc[i][1];
      } else {
        row[0] = alpha * acc[i][0] + beta * row[0];
        row[1] = alpha * acc[i][1] + beta * row[1];
      }
    }
    return;
  }
  float tmp[WL__MR * WL__NR] __attribute__((aligned(64)));
  for (size_t i = 0; i < WL__MR; i++) {
    *(wl__v16 *)(tmp + i * WL__NR) = alpha * acc[i][0];
    *(wl__v16 *)(tmp + i * WL__NR + 16) = alpha * acc[i][1];
  }
  store_edge(tmp, WL__NR, c, ldc, beta, mr, nr);
}
#endif

static void ukr_generic(size_t kc, const float *a, const float *b, float *c, size_t ldc,
                        float alpha, float beta, size_t mr, size_t nr) {
  ukr_tiles(kc, a, b, c, ldc, alpha, beta, mr, nr);
}

#else /* no vector extensions: plain loops */

static void ukr_generic(size_t kc, const float *a, const float *b, float *c, size_t ldc,
                        float alpha, float beta, size_t mr, size_t nr) {
  float acc[WL__MR * WL__NR] = {0};
  for (size_t p = 0; p < kc; p++)
    for (size_t i = 0; i < WL__MR; i++)
      for (size_t j = 0; j < WL__NR; j++)
        acc[i * WL__NR + j] += a[p * WL__MR + i] * b[p * WL__NR + j];
  for (size_t i = 0; i < mr; i++)
    for (size_t j = 0; j < nr; j++)
      c[i * ldc + j] = alpha * acc[i * WL__NR + j] + (beta == 0.0f ? 0.0f : beta * c[i * ldc + j]);
}
#endif

static wl__ukernel_fn chosen;
static const char *chosen_name;

/* limit: 0 the best this CPU runs, 1 the portable kernel, 2 at most AVX2 (for tests). */
static void choose(int limit) {
  wl__ukernel_fn fn = ukr_generic;
  const char *name = "generic 12x32";
#if defined(WL__HAVE_X86_KERNELS)
  __builtin_cpu_init();
  if (limit != 1 && __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) {
    fn = ukr_avx2;
    name = "avx2-fma 12x32 (4 x 6x16)";
  }
  if (limit == 0 && __builtin_cpu_supports("avx512f")) {
    fn = ukr_avx512;
    name = "avx512f 12x32";
  }
#endif
  __atomic_store_n(&chosen_name, name, __ATOMIC_RELAXED);
  __atomic_store_n(&chosen, fn, __ATOMIC_RELEASE);
}

wl__ukernel_fn wl__ukernel(void) {
  wl__ukernel_fn fn = __atomic_load_n(&chosen, __ATOMIC_ACQUIRE);
  if (!fn) {
    choose(0); /* idempotent: racing callers store the same values */
    fn = chosen;
  }
  return fn;
}

void wl__ukernel_select(int limit) {
  choose(limit);
}

const char *wl__ukernel_name(void) {
  wl__ukernel();
  return chosen_name;
}

const char *wl_kern_isa(void) {
  return wl__ukernel_name();
}
