/* kernels: GEMM, implicit-GEMM convolution, pooling, activations, softmax cross-entropy,
 * optimizer updates and reductions, on the CPU (libwlkernels) and on CUDA (libwlkernels_cuda). */
#ifndef WAVELET_KERNELS_H
#define WAVELET_KERNELS_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* ------------------------------------------------------------------------------------------------
 * Version and export
 * ----------------------------------------------------------------------------------------------*/
#define WL_KERNELS_VERSION_MAJOR 0
#define WL_KERNELS_VERSION_MINOR 1

/* The same definition as in alloc.h (an identical redefinition is allowed). */
#ifndef WL_API
#if defined(__GNUC__)
#define WL_API __attribute__((visibility("default")))
#else
#define WL_API
#endif
#endif

/* ------------------------------------------------------------------------------------------------
 * Conventions
 *
 * Matrices are row-major with a leading dimension (elements between rows). Tensors are NHWC
 * (activations) and KRSC (filters), densely packed. Every function returns 0 or a negative errno
 * (-EINVAL for a NULL pointer, a bad dimension or a label out of range; -ENOMEM when scratch
 * memory cannot be had). Sizes of zero are valid and do nothing. Outputs must not alias inputs
 * unless a prototype says so.
 * ----------------------------------------------------------------------------------------------*/
typedef enum wl_trans_e { WL_NOTRANS = 0, WL_TRANS = 1 } wl_trans_t;

/* A 2-D convolution (cross-correlation, as in every framework). Fill the inputs and call
 * wl_conv2d_init, which checks them and sets p and q. stride and dilation 0 mean 1. */
typedef struct wl_conv2d_s {
  int n, h, w, c;         /* input N x H x W x C */
  int k, r, s;            /* filters K x R x S x C; output N x P x Q x K */
  int pad_h, pad_w;       /* zero padding on each side */
  int stride_h, stride_w; /* 0 means 1 */
  int dil_h, dil_w;       /* 0 means 1 */
  int p, q;               /* set by wl_conv2d_init */
} wl_conv2d_t;

/* A 2-D pooling window over NHWC (channels kept). pad < window on each axis, so that every
 * window holds at least one real element; padding never wins a max. */
typedef struct wl_pool2d_s {
  int n, h, w, c;
  int r, s; /* window height and width */
  int pad_h, pad_w;
  int stride_h, stride_w; /* 0 means the window size */
  int p, q;               /* set by wl_pool2d_init */
} wl_pool2d_t;

/* SGD as in PyTorch: g' = g + weight_decay*w; v = momentum*v + g'; w -= lr*(nesterov ?
 * g' + momentum*v : v). With momentum 0 the velocity is not used and may be NULL. */
typedef struct wl_sgd_s {
  float lr, momentum, weight_decay;
  int nesterov;
} wl_sgd_t;

/* Adam (decoupled = 0: L2 added to the gradient) or AdamW (decoupled = 1: w -= lr*wd*w). */
typedef struct wl_adam_s {
  float lr, beta1, beta2, eps, weight_decay;
  int decoupled;
} wl_adam_t;

typedef enum wl_reduce_op_e {
  WL_REDUCE_SUM = 0,
  WL_REDUCE_SUMSQ, /* sum of squares (gradient norms) */
  WL_REDUCE_MAX,
  WL_REDUCE_MIN,
  WL_REDUCE_ABSMAX, /* max |x| (overflow checks) */
} wl_reduce_op_t;

/* ------------------------------------------------------------------------------------------------
 * CPU: threads
 *
 * The CPU kernels run on a pool of persistent threads, created on first use: by default one per
 * core this process may run on (sched_getaffinity). Calls from several application threads at
 * once are safe; a call made while the pool is busy runs on the caller's thread alone.
 * ----------------------------------------------------------------------------------------------*/

/* Threads the CPU kernels use; n = 0 restores the default. 0 or -EINVAL (n < 0 or n > 256). */
WL_API int wl_kern_set_threads(int n);
/* The number of threads the CPU kernels use now (at least 1). */
WL_API int wl_kern_threads(void);
/* Which micro-kernel the CPU GEMM uses: "avx512f 12x32", "avx2-fma 12x32 (4 x 6x16)", "generic
 * 12x32". Never NULL. */
WL_API const char *wl_kern_isa(void);

/* ------------------------------------------------------------------------------------------------
 * CPU: GEMM
 * ----------------------------------------------------------------------------------------------*/

/* C[m x n] = alpha * op(A) op(B) + beta * C. op(A) is m x k: A is m x k (lda >= k), or k x m
 * (lda >= m) with ta = WL_TRANS; likewise op(B) is k x n. With beta = 0, C is not read (NaN in
 * C does not propagate). Blocked and packed, a 12x32 vector micro-kernel, threaded.
 * 0, -EINVAL or -ENOMEM. */
WL_API int wl_sgemm(wl_trans_t ta, wl_trans_t tb, size_t m, size_t n, size_t k, float alpha,
                    const float *a, size_t lda, const float *b, size_t ldb, float beta, float *c,
                    size_t ldc);

/* ------------------------------------------------------------------------------------------------
 * CPU: convolution (implicit GEMM: the im2col matrix is never built, the GEMM's packing routines
 * gather from the tensor instead)
 * ----------------------------------------------------------------------------------------------*/

/* Checks cv and sets cv->p, cv->q (and stride/dilation 0 to 1). 0 or -EINVAL. */
WL_API int wl_conv2d_init(wl_conv2d_t *cv);
/* y[N,P,Q,K] = conv(x[N,H,W,C], w[K,R,S,C]) + bias[K] (bias may be NULL). */
WL_API int wl_conv2d_fwd(const wl_conv2d_t *cv, const float *x, const float *w, const float *bias,
                         float *y);
/* dx[N,H,W,C] from dy[N,P,Q,K] and w (overwrites dx). */
WL_API int wl_conv2d_bwd_data(const wl_conv2d_t *cv, const float *dy, const float *w, float *dx);
/* dw[K,R,S,C] from x and dy (overwrites dw); dbias[K] = sum of dy over N,P,Q when not NULL. */
WL_API int wl_conv2d_bwd_filter(const wl_conv2d_t *cv, const float *x, const float *dy, float *dw,
                                float *dbias);

/* ------------------------------------------------------------------------------------------------
 * CPU: pooling
 * ----------------------------------------------------------------------------------------------*/

/* Checks pl and sets pl->p, pl->q (and stride 0 to the window). 0 or -EINVAL. */
WL_API int wl_pool2d_init(wl_pool2d_t *pl);
/* y[N,P,Q,C] = max over each window of x[N,H,W,C]. */
WL_API int wl_maxpool2d_fwd(const wl_pool2d_t *pl, const float *x, float *y);
/* dx = 0, then each dy goes to the first maximum of its window in x (recomputed, so no index
 * tensor is kept; the same element the forward pass chose). */
WL_API int wl_maxpool2d_bwd(const wl_pool2d_t *pl, const float *x, const float *dy, float *dx);
/* y[N,C] = mean of x[N,HW,C] over HW (global average pooling), and its gradient. */
WL_API int wl_avgpool_global_fwd(size_t n, size_t hw, size_t c, const float *x, float *y);
WL_API int wl_avgpool_global_bwd(size_t n, size_t hw, size_t c, const float *dy, float *dx);

/* ------------------------------------------------------------------------------------------------
 * CPU: bias, activations, element-wise
 * ----------------------------------------------------------------------------------------------*/

/* y[i][j] += bias[j] for rows x cols (row-major, dense; NHWC with cols = C). */
WL_API int wl_bias_add(size_t rows, size_t cols, float *y, const float *bias);
/* dbias[j] = sum_i dy[i][j] (overwrites dbias). */
WL_API int wl_bias_grad(size_t rows, size_t cols, const float *dy, float *dbias);
/* y = max(x, 0); y may be x. */
WL_API int wl_relu_fwd(size_t n, const float *x, float *y);
/* dx = y > 0 ? dy : 0, from the forward output y (so the forward may run in place); dx may be
 * dy. */
WL_API int wl_relu_bwd(size_t n, const float *y, const float *dy, float *dx);
/* y += alpha * x (residual connections, gradient accumulation). */
WL_API int wl_axpy(size_t n, float alpha, const float *x, float *y);
/* x *= alpha. */
WL_API int wl_scale(size_t n, float alpha, float *x);

/* ------------------------------------------------------------------------------------------------
 * CPU: softmax with cross-entropy
 * ----------------------------------------------------------------------------------------------*/

/* probs[n,c] = softmax(logits) per row (probs may be logits); *loss = mean over the rows of
 * -log probs[i][labels[i]] (loss may be NULL). Labels outside [0, c) give -EINVAL. */
WL_API int wl_softmax_xent_fwd(size_t n, size_t c, const float *logits, const int32_t *labels,
                               float *probs, float *loss);
/* dlogits = scale * (probs - onehot(labels)); scale = 1/n is the gradient of the mean loss.
 * dlogits may be probs. */
WL_API int wl_softmax_xent_bwd(size_t n, size_t c, const float *probs, const int32_t *labels,
                               float scale, float *dlogits);
/* *correct = rows whose largest score (first on ties) is at the label. */
WL_API int wl_count_correct(size_t n, size_t c, const float *scores, const int32_t *labels,
                            size_t *correct);

/* ------------------------------------------------------------------------------------------------
 * CPU: optimizers and reductions
 * ----------------------------------------------------------------------------------------------*/

/* One SGD step over n parameters (see wl_sgd_t); v may be NULL when momentum is 0. */
WL_API int wl_sgd_step(const wl_sgd_t *opt, size_t n, float *w, const float *g, float *v);
/* One Adam step; step counts from 1 (bias correction); m and v start at zero. */
WL_API int wl_adam_step(const wl_adam_t *opt, long step, size_t n, float *w, const float *g,
                        float *m, float *v);
/* *out = op over x[0..n) (accumulated in double). n = 0: 0 for sums, -EINVAL otherwise. A NaN
 * in x makes every reduction NaN (max, min and max |x| included). */
WL_API int wl_reduce(wl_reduce_op_t op, size_t n, const float *x, float *out);

/* ------------------------------------------------------------------------------------------------
 * CUDA (libwlkernels_cuda; present when built with the toolkit)
 *
 * The same operations on device pointers, launched with <<<>>> (cudaLaunchKernel, so the
 * interposer sees and gates them) on `stream` (a cudaStream_t; NULL is the default stream). They
 * return 0, -EINVAL (bad arguments), -ENODEV (no usable device) or -EIO (the launch failed: the
 * CUDA error is in wl_cuda_last_error()). Launches are asynchronous, as in CUDA.
 * ----------------------------------------------------------------------------------------------*/

/* How an fp32 GEMM multiplies: on CUDA cores, or on tensor cores with inputs rounded to TF32
 * (about 3 decimal digits; sm_80+, CUDA cores elsewhere). A GEMM with few output tiles and a long
 * K (the convolutions' filter gradients) is split along K and summed with atomics, so its last
 * bits can vary from run to run. */
typedef enum wl_math_e { WL_MATH_FP32 = 0, WL_MATH_TF32 = 1 } wl_math_t;

/* The cudaError_t of the last failed call on this thread (0 when none). */
WL_API int wl_cuda_last_error(void);
/* 0 when a device is usable; -ENODEV otherwise (never crashes without a driver). */
WL_API int wl_cuda_available(void);

WL_API int wl_cuda_sgemm(wl_trans_t ta, wl_trans_t tb, size_t m, size_t n, size_t k, float alpha,
                         const float *a, size_t lda, const float *b, size_t ldb, float beta,
                         float *c, size_t ldc, wl_math_t math, void *stream);
/* bf16 inputs (uint16_t bit patterns), fp32 accumulate and output, on tensor cores: wgmma with
 * TMA on compute capability 9.0 when the library has sm_90a code and a and b are 16-byte aligned
 * with lda and ldb multiples of 8, else mma.sync (sm_80+, which every architecture the library is
 * built for is). */
WL_API int wl_cuda_gemm_bf16(wl_trans_t ta, wl_trans_t tb, size_t m, size_t n, size_t k,
                             float alpha, const uint16_t *a, size_t lda, const uint16_t *b,
                             size_t ldb, float beta, float *c, size_t ldc, void *stream);
/* Round-to-nearest-even conversions between fp32 and bf16 on the device. */
WL_API int wl_cuda_f32_to_bf16(size_t n, const float *x, uint16_t *y, void *stream);
/* The kernel wl_cuda_gemm_bf16 runs on the current device for operands TMA can describe:
 * "wgmma" or "mma.sync" (for tests and benchmarks, which would otherwise not see a fallback). */
WL_API const char *wl_cuda_gemm_bf16_kernel(void);
/* How the wgmma kernel covers C: one block per tile, or persistent (one block per SM walking the
 * tiles, which overlaps a tile's epilogue with the next tile's loads and has no tail of
 * launches). AUTO, the default, is persistent when there are more tiles than SMs. */
typedef enum wl_gemm_sched_e {
  WL_GEMM_SCHED_AUTO = 0,
  WL_GEMM_SCHED_PERSISTENT = 1,
  WL_GEMM_SCHED_NONPERSISTENT = 2
} wl_gemm_sched_t;
/* Sets the schedule for the whole process (for benchmarks that time both, and tests);
 * max_blocks > 0 caps the persistent grid below the SM count (tests: blocks that walk many
 * tiles), 0 leaves it at the SM count. 0 or -EINVAL. */
WL_API int wl_cuda_gemm_bf16_set_schedule(wl_gemm_sched_t sched, int max_blocks);
/* What wl_cuda_gemm_bf16 runs now on the current device for an m x n C and operands TMA can
 * describe: "wgmma persistent", "wgmma" (one block per tile) or "mma.sync". Never NULL. */
WL_API const char *wl_cuda_gemm_bf16_schedule(size_t m, size_t n);
/* WL_MATH_TF32 on compute capability 9.0 with the library's sm_90a code: both operands are rounded
 * to TF32 (cvt.rna, as on mma.sync) into a K-major copy in stream-ordered scratch memory
 * (cudaMallocAsync, (m + n) k floats, freed on the stream after the GEMM), then multiplied by the
 * wgmma kernels (the same schedule as bf16: wl_cuda_gemm_bf16_set_schedule); elsewhere, or when
 * the scratch cannot be allocated, mma.sync (sm_80+) or CUDA cores. The kernel the current device
 * gets: "wgmma", "mma.sync" or "simt" (for tests and benchmarks). */
WL_API const char *wl_cuda_sgemm_tf32_kernel(void);
/* As wl_cuda_gemm_bf16_schedule for a TF32 sgemm with an m x n C: "wgmma persistent", "wgmma",
 * "mma.sync" or "simt". Never NULL. */
WL_API const char *wl_cuda_sgemm_tf32_schedule(size_t m, size_t n);
/* 0: TF32 always on mma.sync (tests of that path, comparisons); 1 (the default): wgmma where it
 * runs. For the whole process. 0 or -EINVAL. */
WL_API int wl_cuda_sgemm_tf32_set_wgmma(int on);

WL_API int wl_cuda_conv2d_fwd(const wl_conv2d_t *cv, const float *x, const float *w,
                              const float *bias, float *y, void *stream);
WL_API int wl_cuda_conv2d_bwd_data(const wl_conv2d_t *cv, const float *dy, const float *w,
                                   float *dx, void *stream);
/* dbias may be NULL. */
WL_API int wl_cuda_conv2d_bwd_filter(const wl_conv2d_t *cv, const float *x, const float *dy,
                                     float *dw, float *dbias, void *stream);
WL_API int wl_cuda_maxpool2d_fwd(const wl_pool2d_t *pl, const float *x, float *y, void *stream);
WL_API int wl_cuda_maxpool2d_bwd(const wl_pool2d_t *pl, const float *x, const float *dy, float *dx,
                                 void *stream);
WL_API int wl_cuda_avgpool_global_fwd(size_t n, size_t hw, size_t c, const float *x, float *y,
                                      void *stream);
WL_API int wl_cuda_avgpool_global_bwd(size_t n, size_t hw, size_t c, const float *dy, float *dx,
                                      void *stream);
WL_API int wl_cuda_bias_add(size_t rows, size_t cols, float *y, const float *bias, void *stream);
WL_API int wl_cuda_bias_grad(size_t rows, size_t cols, const float *dy, float *dbias, void *stream);
WL_API int wl_cuda_relu_fwd(size_t n, const float *x, float *y, void *stream);
WL_API int wl_cuda_relu_bwd(size_t n, const float *y, const float *dy, float *dx, void *stream);
WL_API int wl_cuda_axpy(size_t n, float alpha, const float *x, float *y, void *stream);
WL_API int wl_cuda_scale(size_t n, float alpha, float *x, void *stream);
/* loss: a device float (mean loss), may be NULL. Labels are on the device; one out of range
 * makes the loss NaN (the device cannot return an error synchronously). */
WL_API int wl_cuda_softmax_xent_fwd(size_t n, size_t c, const float *logits, const int32_t *labels,
                                    float *probs, float *loss, void *stream);
WL_API int wl_cuda_softmax_xent_bwd(size_t n, size_t c, const float *probs, const int32_t *labels,
                                    float scale, float *dlogits, void *stream);
/* correct: a device uint32 counter, incremented (zero it first). */
WL_API int wl_cuda_count_correct(size_t n, size_t c, const float *scores, const int32_t *labels,
                                 uint32_t *correct, void *stream);
WL_API int wl_cuda_sgd_step(const wl_sgd_t *opt, size_t n, float *w, const float *g, float *v,
                            void *stream);
WL_API int wl_cuda_adam_step(const wl_adam_t *opt, long step, size_t n, float *w, const float *g,
                             float *m, float *v, void *stream);
/* out: a device float. */
WL_API int wl_cuda_reduce(wl_reduce_op_t op, size_t n, const float *x, float *out, void *stream);

#ifdef __cplusplus
}
#endif

#endif
