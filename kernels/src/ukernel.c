/* The GEMM micro-kernel: a 6x16 register block in GCC vector extensions, built for AVX2+FMA and
 * for the baseline ISA, chosen at run time (scalar loops where vector extensions are missing). */
#include <string.h>

#include "internal.h"

#if defined(__GNUC__)
/* 12 of the 16 AVX registers hold the 6x16 block, 2 hold B and 1 the broadcast A (BLIS's Haswell
 * shape). aligned(4) on the unaligned type lets C rows sit anywhere. */
typedef float wl__v8 __attribute__((vector_size(32)));
typedef float wl__v8u __attribute__((vector_size(32), aligned(4)));

static inline __attribute__((always_inline)) void
ukr_body(size_t kc, const float *restrict a, const float *restrict b, float *restrict c, size_t ldc,
         float alpha, float beta, size_t mr, size_t nr) {
  wl__v8 c00 = {0}, c01 = {0}, c10 = {0}, c11 = {0}, c20 = {0}, c21 = {0};
  wl__v8 c30 = {0}, c31 = {0}, c40 = {0}, c41 = {0}, c50 = {0}, c51 = {0};
  b = __builtin_assume_aligned(b, 32);
  /* C is touched only at the end: start fetching its rows now, under the multiply. */
  for (size_t i = 0; i < mr; i++) {
    __builtin_prefetch(c + i * ldc, 1, 3);
    __builtin_prefetch(c + i * ldc + WL__NR - 1, 1, 3);
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
  wl__v8 acc[WL__MR][2] = {{c00, c01}, {c10, c11}, {c20, c21}, {c30, c31}, {c40, c41}, {c50, c51}};
  if (mr == WL__MR && nr == WL__NR) {
    for (size_t i = 0; i < WL__MR; i++) {
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
  /* An edge tile: the full block goes to the stack, only its valid part to C. */
  float tmp[WL__MR * WL__NR] __attribute__((aligned(64)));
  for (size_t i = 0; i < WL__MR; i++) {
    *(wl__v8 *)(tmp + i * WL__NR) = alpha * acc[i][0];
    *(wl__v8 *)(tmp + i * WL__NR + 8) = alpha * acc[i][1];
  }
  for (size_t i = 0; i < mr; i++) {
    float *row = c + i * ldc;
    if (beta == 0.0f)
      for (size_t j = 0; j < nr; j++) row[j] = tmp[i * WL__NR + j];
    else
      for (size_t j = 0; j < nr; j++) row[j] = tmp[i * WL__NR + j] + beta * row[j];
  }
}

#if defined(__x86_64__) || defined(__i386__)
#define WL__HAVE_AVX2_KERNEL 1
__attribute__((target("avx2,fma"))) static void ukr_avx2(size_t kc, const float *a, const float *b,
                                                         float *c, size_t ldc, float alpha,
                                                         float beta, size_t mr, size_t nr) {
  ukr_body(kc, a, b, c, ldc, alpha, beta, mr, nr);
}
#endif

static void ukr_generic(size_t kc, const float *a, const float *b, float *c, size_t ldc,
                        float alpha, float beta, size_t mr, size_t nr) {
  ukr_body(kc, a, b, c, ldc, alpha, beta, mr, nr);
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

static void choose(int generic) {
  wl__ukernel_fn fn = ukr_generic;
  const char *name = "generic 6x16";
#if defined(WL__HAVE_AVX2_KERNEL)
  __builtin_cpu_init();
  if (!generic && __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) {
    fn = ukr_avx2;
    name = "avx2-fma 6x16";
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

void wl__ukernel_select(int generic) {
  choose(generic);
}

const char *wl__ukernel_name(void) {
  wl__ukernel();
  return chosen_name;
}

const char *wl_kern_isa(void) {
  return wl__ukernel_name();
}
