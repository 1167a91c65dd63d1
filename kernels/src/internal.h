/* Internals of the CPU kernels: the thread pool, the packed GEMM driver and its operands. */
#ifndef WAVELET_KERNELS_INTERNAL_H
#define WAVELET_KERNELS_INTERNAL_H

#include <errno.h>
#include <stddef.h>
#include <stdint.h>

#include "wavelet/kernels.h"

/* ------------------------------------------------------------------------------------------------
 * "pool.c": persistent worker threads
 * ----------------------------------------------------------------------------------------------*/

/* A task runs once on each of nthreads threads with tid in [0, nthreads). */
typedef void (*wl__task_fn)(void *arg, int tid, int nthreads);

/* Runs fn on up to nthreads threads (the caller is tid 0) and returns when all are done. Tasks
 * must split their work by the nthreads they are passed: it is 1 when the pool is busy or the
 * call comes from a worker, fewer than asked when threads cannot be created. */
void wl__parallel(wl__task_fn fn, void *arg, int nthreads);

/* Runs fn(ctx, lo, hi) over [0, n) in chunks of at least `grain`, threaded when n is large. */
void wl__parallel_for(size_t n, size_t grain, void (*fn)(void *ctx, size_t lo, size_t hi),
                      void *ctx);

/* Splits [0, n) into nparts near-equal runs of multiples of `grain`: part i is [*lo, *hi). */
void wl__split(size_t n, size_t grain, int nparts, int i, size_t *lo, size_t *hi);

/* ------------------------------------------------------------------------------------------------
 * "ukernel.c": the register-blocked micro-kernel
 * ----------------------------------------------------------------------------------------------*/

/* The micro-kernels' tile: AVX-512 holds it in 24 zmm registers, AVX2 as four 6x16 blocks. */
#define WL__MR 12
#define WL__NR 32

/* c[mr x nr] = alpha * A B + beta * c over kc, with A a packed MR-panel (a[p*MR + i]) and B a
 * packed NR-panel (b[p*NR + j], 64-byte aligned). mr <= MR, nr <= NR; beta == 0: c is not
 * read. */
typedef void (*wl__ukernel_fn)(size_t kc, const float *a, const float *b, float *c, size_t ldc,
                               float alpha, float beta, size_t mr, size_t nr);

/* The best micro-kernel this CPU runs (chosen once). */
wl__ukernel_fn wl__ukernel(void);
const char *wl__ukernel_name(void);
/* Tests: 1 forces the portable kernel, 0 restores the best one. Not for concurrent use. */
void wl__ukernel_select(int generic);

/* ------------------------------------------------------------------------------------------------
 * "gemm.c": the blocked GEMM driver over operands that pack themselves
 * ----------------------------------------------------------------------------------------------*/

/* An operand of C = A B. pack writes a block in micro-panel order, zero-padded to whole panels:
 * for A (m x k) the rows [i0, i0+mc) and columns [p0, p0+kc) as panels of MR rows,
 * dst[(i/MR)*kc*MR + p*MR + i%MR]; for B (k x n) the rows [p0, p0+kc) and columns [j0, j0+nc) as
 * panels of NR columns, dst[(j/NR)*kc*NR + p*NR + j%NR]. Plain matrices and the implicit im2col
 * views of the convolutions are both operands. */
typedef struct wl__operand_s wl__operand_t;
struct wl__operand_s {
  void (*pack)(const wl__operand_t *op, size_t r0, size_t nr, size_t c0, size_t nc, float *dst);
  const float *p;
  size_t ld;
  const void *ctx; /* e.g. the convolution */
};

/* Plain row-major operands (trans selects op(X) = X^T). */
void wl__operand_a(wl__operand_t *op, wl_trans_t trans, const float *a, size_t lda);
void wl__operand_b(wl__operand_t *op, wl_trans_t trans, const float *b, size_t ldb);

/* C[m x n] = alpha * A B + beta * C, threaded. 0 or -ENOMEM. */
int wl__gemm(size_t m, size_t n, size_t k, float alpha, const wl__operand_t *a,
             const wl__operand_t *b, float beta, float *c, size_t ldc);

/* ------------------------------------------------------------------------------------------------
 * Shared helpers
 * ----------------------------------------------------------------------------------------------*/

/* a * b without overflow into *out; 0 or -EINVAL. */
static inline int wl__mul_ok(size_t a, size_t b, size_t *out) {
  if (a && b > SIZE_MAX / a) return -EINVAL;
  *out = a * b;
  return 0;
}

#endif
