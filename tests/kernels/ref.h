/* Naive double-precision references for the kernel tests (also used by the GPU tests). */
#ifndef WAVELET_TESTS_KERNELS_REF_H
#define WAVELET_TESTS_KERNELS_REF_H

#include <stddef.h>
#include <stdint.h>

#include "wavelet/kernels.h"

/* A small, seeded generator so that every run checks the same cases (WL_TEST_SEED changes it). */
void ref_seed(uint64_t seed);
uint64_t ref_seed_from_env(uint64_t dflt);
uint32_t ref_u32(void);
int ref_int(int lo, int hi); /* uniform in [lo, hi] */
float ref_uniform(float lo, float hi);
void ref_fill(float *x, size_t n, float lo, float hi);
float *ref_alloc(size_t n); /* aborts on failure; free() it */
double *ref_dalloc(size_t n);

/* c = alpha op(a) op(b) + beta c0, and absum = |alpha| sum |a||b| + |beta c0| (the error scale). */
void ref_gemm(wl_trans_t ta, wl_trans_t tb, size_t m, size_t n, size_t k, double alpha,
              const float *a, size_t lda, const float *b, size_t ldb, double beta, const float *c0,
              size_t ldc, double *c, double *absum);

/* The convolution in double: y = conv(x, w) + bias (bias may be NULL). */
void ref_conv_fwd(const wl_conv2d_t *cv, const double *x, const double *w, const double *bias,
                  double *y);
/* Direct loops for the two backward passes (double accumulation of float inputs). */
void ref_conv_bwd_data(const wl_conv2d_t *cv, const float *dy, const float *w, double *dx);
void ref_conv_bwd_filter(const wl_conv2d_t *cv, const float *x, const float *dy, double *dw);

void ref_maxpool_fwd(const wl_pool2d_t *pl, const double *x, double *y);
/* Mean cross-entropy of softmax(logits) in double. */
double ref_softmax_xent(size_t n, size_t c, const double *logits, const int32_t *labels);

/* Widening copies. */
void ref_to_double(const float *x, double *y, size_t n);

/* max |got - want| / (atol + rtol |want|) over n: <= 1 passes. */
double ref_err(const float *got, const double *want, size_t n, double atol, double rtol);

#endif
