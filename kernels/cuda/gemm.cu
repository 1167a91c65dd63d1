/* The CUDA GEMM entry points (fp32 SIMT or TF32, and BF16 on tensor cores), fp32-to-bf16
 * conversion, and the library's error state. */
#if !defined(WL_CUDA_EMU)
#include <cuda_bf16.h>
#endif

#include "gemm.cuh"

static thread_local int last_error;

int wl__cuda_fail(cudaError_t err) {
  last_error = (int)err;
  if (err == cudaErrorNoDevice || err == cudaErrorInsufficientDriver) return -ENODEV;
  if (err == cudaErrorInvalidValue) return -EINVAL;
  return -EIO;
}

extern "C" WL_API int wl_cuda_last_error(void) {
  return last_error;
}

extern "C" WL_API int wl_cuda_available(void) {
  int n = 0;
  cudaError_t err = cudaGetDeviceCount(&n);
  if (err != cudaSuccess) {
    last_error = (int)err;
    cudaGetLastError(); /* not sticky: leave no error behind for the caller's next check */
    return -ENODEV;
  }
  return n > 0 ? 0 : -ENODEV;
}

int wl__cuda_cc_major(void) {
  static int cache[64]; /* per device, 0 = not yet asked */
  int dev = 0, major = 0;
  if (cudaGetDevice(&dev) != cudaSuccess || dev < 0) return 0;
  if (dev < 64 && __atomic_load_n(&cache[dev], __ATOMIC_RELAXED)) return cache[dev];
  if (cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev) != cudaSuccess)
    return 0;
  if (dev < 64) __atomic_store_n(&cache[dev], major, __ATOMIC_RELAXED);
  return major;
}

/* The checks shared by both GEMMs; 0 or -EINVAL. */
static int gemm_args(wl_trans_t ta, wl_trans_t tb, size_t m, size_t n, size_t k, const void *a,
                     size_t lda, const void *b, size_t ldb, const float *c, size_t ldc) {
  if ((ta != WL_NOTRANS && ta != WL_TRANS) || (tb != WL_NOTRANS && tb != WL_TRANS)) return -EINVAL;
  if (!wl__fits_int(m) || !wl__fits_int(n) || !wl__fits_int(k)) return -EINVAL;
  /* The kernels compute a tile's rows and columns, and k indices up to 8 past the end, in int
   * before the bounds test. */
  if (m > INT_MAX - 256 || n > INT_MAX - 256 || k > INT_MAX - 256) return -EINVAL;
  if (m == 0 || n == 0) return 0;
  if (!c || ldc < n) return -EINVAL;
  if (k > 0 && (!a || !b || lda < (ta == WL_TRANS ? m : k) || ldb < (tb == WL_TRANS ? k : n)))
    return -EINVAL;
  return 0;
}

/* Calls launch(A loader, B loader) with the loaders for the transposition variant. */
template <class T, class F>
static int with_dense(wl_trans_t ta, wl_trans_t tb, int M, int N, int K, const T *a, size_t lda,
                      const T *b, size_t ldb, F &&launch) {
  if (ta == WL_NOTRANS && tb == WL_NOTRANS)
    return launch(wl__make_dense<T, false>(a, lda, M, K), wl__make_dense<T, false>(b, ldb, K, N));
  if (ta == WL_NOTRANS)
    return launch(wl__make_dense<T, false>(a, lda, M, K), wl__make_dense<T, true>(b, ldb, K, N));
  if (tb == WL_NOTRANS)
    return launch(wl__make_dense<T, true>(a, lda, M, K), wl__make_dense<T, false>(b, ldb, K, N));
  return launch(wl__make_dense<T, true>(a, lda, M, K), wl__make_dense<T, true>(b, ldb, K, N));
}

__global__ void wl__scale_c(int M, int N, float *C, long long ldc, float beta) {
  long long total = (long long)M * N;
  for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < total;
       i += (long long)gridDim.x * blockDim.x) {
    float *p = C + (i / N) * ldc + (i % N);
    *p = beta == 0.0f ? 0.0f : beta * *p;
  }
}

/* k = 0 or alpha = 0: C = beta C (without reading C when beta = 0). */
static int scale_only(int M, int N, float *C, size_t ldc, float beta, cudaStream_t st) {
  if (beta == 1.0f) return 0;
  WL__LAUNCH(wl__scale_c, wl__blocks((size_t)M * N, 256), 256, st, M, N, C, (long long)ldc, beta);
  return wl__cuda_check_launch();
}

extern "C" WL_API int wl_cuda_sgemm(wl_trans_t ta, wl_trans_t tb, size_t m, size_t n, size_t k,
                                    float alpha, const float *a, size_t lda, const float *b,
                                    size_t ldb, float beta, float *c, size_t ldc, wl_math_t math,
                                    void *stream) {
  int rc = gemm_args(ta, tb, m, n, k, a, lda, b, ldb, c, ldc);
  if (rc || m == 0 || n == 0) return rc;
  if (math != WL_MATH_FP32 && math != WL_MATH_TF32) return -EINVAL;
  cudaStream_t st = wl__stream(stream);
  const int M = (int)m, N = (int)n, K = (int)k;
  if (K == 0 || alpha == 0.0f) return scale_only(M, N, c, ldc, beta, st);
  const bool tc = math == WL_MATH_TF32 && wl__cuda_cc_major() >= 8;
  if (tc) { /* wgmma on sm_90a where it runs; else mma.sync below */
    rc = wl__gemm_tf32_wgmma(ta, tb, M, N, K, alpha, a, lda, b, ldb, beta, c, ldc, st);
    if (rc <= 0) return rc;
  }
  return with_dense<float>(ta, tb, M, N, K, a, lda, b, ldb, [&](auto la, auto lb) {
    if (tc) return wl__launch_gemm_mma<float>(la, lb, M, N, K, alpha, beta, c, (long long)ldc, st);
    return wl__launch_sgemm_simt(la, lb, M, N, K, alpha, beta, c, (long long)ldc, st);
  });
}

extern "C" WL_API int wl_cuda_gemm_bf16(wl_trans_t ta, wl_trans_t tb, size_t m, size_t n, size_t k,
                                        float alpha, const uint16_t *a, size_t lda,
                                        const uint16_t *b, size_t ldb, float beta, float *c,
                                        size_t ldc, void *stream) {
  int rc = gemm_args(ta, tb, m, n, k, a, lda, b, ldb, c, ldc);
  if (rc || m == 0 || n == 0) return rc;
  cudaStream_t st = wl__stream(stream);
  const int M = (int)m, N = (int)n, K = (int)k;
  if (K == 0 || alpha == 0.0f) return scale_only(M, N, c, ldc, beta, st);
  rc = wl__gemm_bf16_wgmma(ta, tb, M, N, K, alpha, a, lda, b, ldb, beta, c, ldc, st);
  if (rc <= 0) return rc; /* else: mma.sync below */
  return with_dense<uint16_t>(ta, tb, M, N, K, a, lda, b, ldb, [&](auto la, auto lb) {
    return wl__launch_gemm_mma<uint16_t>(la, lb, M, N, K, alpha, beta, c, (long long)ldc, st);
  });
}

__global__ void wl__f32_to_bf16(long long n, const float *x, uint16_t *y) {
  for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n;
       i += (long long)gridDim.x * blockDim.x)
    y[i] = __bfloat16_as_ushort(__float2bfloat16_rn(x[i]));
}

extern "C" WL_API int wl_cuda_f32_to_bf16(size_t n, const float *x, uint16_t *y, void *stream) {
  if (n == 0) return 0;
  if (!x || !y) return -EINVAL;
  WL__LAUNCH(wl__f32_to_bf16, wl__blocks(n, 256), 256, wl__stream(stream), (long long)n, x, y);
  return wl__cuda_check_launch();
}
