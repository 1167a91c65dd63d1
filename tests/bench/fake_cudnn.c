/* A stand-in for libcudnn.so.9, for bench_conv_cuda_args only (loaded by wl-bench-conv-cuda
 * through WAVELET_CUDNN_LIB, on the CUDA test doubles): the functions the benchmark resolves,
 * with the real prototypes (cudnn.h). It computes nothing; it refuses (CUDNN_STATUS_BAD_PARAM)
 * any request that is not what the benchmark promises: NHWC float tensors, NHWC (KRSC) float
 * filters, cross-correlation in fp32, CUDNN_FMA_MATH, and the algorithm and workspace size its
 * Find reported as the fastest usable one. Find lists a faster tensor-core algorithm first, an
 * unsupported one, then algorithm 1 with FAKE_WS bytes of workspace; with
 * WLTEST_FAKE_CUDNN=tensorop it lists only tensor-core algorithms. */
#include <cudnn.h>
#include <stdlib.h>
#include <string.h>

#define FAKE_WS   4096
#define FAKE_ALGO 1

struct cudnnContext {
  int unused;
};
struct cudnnTensorStruct {
  int set, n, c, h, w;
};
struct cudnnFilterStruct {
  int set, k, c, r, s;
};
struct cudnnConvolutionStruct {
  int set, pad_h, pad_w, u, v, dil_h, dil_w;
  cudnnMathType_t math;
};

size_t cudnnGetVersion(void) {
  return 91900;
}

const char *cudnnGetErrorString(cudnnStatus_t s) {
  switch (s) {
  case CUDNN_STATUS_SUCCESS:
    return "CUDNN_STATUS_SUCCESS";
  case CUDNN_STATUS_BAD_PARAM:
    return "CUDNN_STATUS_BAD_PARAM";
  case CUDNN_STATUS_NOT_SUPPORTED:
    return "CUDNN_STATUS_NOT_SUPPORTED";
  default:
    return "CUDNN_STATUS_(other)";
  }
}

cudnnStatus_t cudnnCreate(cudnnHandle_t *h) {
  *h = calloc(1, sizeof **h);
  return *h ? CUDNN_STATUS_SUCCESS : CUDNN_STATUS_ALLOC_FAILED;
}
cudnnStatus_t cudnnDestroy(cudnnHandle_t h) {
  free(h);
  return CUDNN_STATUS_SUCCESS;
}

#define CREATE_DESTROY(type, create, destroy)                                                      \
  cudnnStatus_t create(type *d) {                                                                  \
    *d = calloc(1, sizeof **d);                                                                    \
    return *d ? CUDNN_STATUS_SUCCESS : CUDNN_STATUS_ALLOC_FAILED;                                  \
  }                                                                                                \
  cudnnStatus_t destroy(type d) {                                                                  \
    free(d);                                                                                       \
    return CUDNN_STATUS_SUCCESS;                                                                   \
  }
CREATE_DESTROY(cudnnTensorDescriptor_t, cudnnCreateTensorDescriptor, cudnnDestroyTensorDescriptor)
CREATE_DESTROY(cudnnFilterDescriptor_t, cudnnCreateFilterDescriptor, cudnnDestroyFilterDescriptor)
CREATE_DESTROY(cudnnConvolutionDescriptor_t, cudnnCreateConvolutionDescriptor,
               cudnnDestroyConvolutionDescriptor)

cudnnStatus_t cudnnSetTensor4dDescriptor(cudnnTensorDescriptor_t d, cudnnTensorFormat_t format,
                                         cudnnDataType_t type, int n, int c, int h, int w) {
  if (format != CUDNN_TENSOR_NHWC || type != CUDNN_DATA_FLOAT) return CUDNN_STATUS_BAD_PARAM;
  *d = (struct cudnnTensorStruct){1, n, c, h, w};
  return CUDNN_STATUS_SUCCESS;
}

cudnnStatus_t cudnnSetFilter4dDescriptor(cudnnFilterDescriptor_t d, cudnnDataType_t type,
                                         cudnnTensorFormat_t format, int k, int c, int h, int w) {
  if (format != CUDNN_TENSOR_NHWC || type != CUDNN_DATA_FLOAT) return CUDNN_STATUS_BAD_PARAM;
  *d = (struct cudnnFilterStruct){1, k, c, h, w};
  return CUDNN_STATUS_SUCCESS;
}

cudnnStatus_t cudnnSetConvolution2dDescriptor(cudnnConvolutionDescriptor_t d, int pad_h, int pad_w,
                                              int u, int v, int dil_h, int dil_w,
                                              cudnnConvolutionMode_t mode,
                                              cudnnDataType_t compute) {
  if (mode != CUDNN_CROSS_CORRELATION || compute != CUDNN_DATA_FLOAT || u < 1 || v < 1 ||
      dil_h < 1 || dil_w < 1)
    return CUDNN_STATUS_BAD_PARAM;
  *d = (struct cudnnConvolutionStruct){1, pad_h, pad_w, u, v, dil_h, dil_w, CUDNN_DEFAULT_MATH};
  return CUDNN_STATUS_SUCCESS;
}

cudnnStatus_t cudnnSetConvolutionMathType(cudnnConvolutionDescriptor_t d, cudnnMathType_t m) {
  d->math = m;
  return CUDNN_STATUS_SUCCESS;
}

cudnnStatus_t cudnnGetConvolution2dForwardOutputDim(const cudnnConvolutionDescriptor_t cd,
                                                    const cudnnTensorDescriptor_t x,
                                                    const cudnnFilterDescriptor_t w, int *n, int *c,
                                                    int *h, int *wo) {
  if (!cd->set || !x->set || !w->set || x->c != w->c) return CUDNN_STATUS_BAD_PARAM;
  *n = x->n, *c = w->k;
  *h = (x->h + 2 * cd->pad_h - cd->dil_h * (w->r - 1) - 1) / cd->u + 1;
  *wo = (x->w + 2 * cd->pad_w - cd->dil_w * (w->s - 1) - 1) / cd->v + 1;
  return CUDNN_STATUS_SUCCESS;
}

/* The descriptors set and consistent (b is a's output), the math pinned to FMA, the workspace
 * given. */
static int usable(const cudnnConvolutionDescriptor_t cd, const cudnnTensorDescriptor_t a,
                  const cudnnTensorDescriptor_t b, const cudnnFilterDescriptor_t w, const void *ws,
                  size_t wsz) {
  int n, c, h, wo;
  if (!b->set || cudnnGetConvolution2dForwardOutputDim(cd, a, w, &n, &c, &h, &wo) || b->n != n ||
      b->c != c || b->h != h || b->w != wo)
    return 0;
  return cd->math == CUDNN_FMA_MATH && ws && wsz >= FAKE_WS;
}

#define FIND_BODY                                                                                  \
  if (!usable(cd, a, b, wd, ws, wsz) || !n || !perf || req < 3) return CUDNN_STATUS_BAD_PARAM;     \
  const char *mode = getenv("WLTEST_FAKE_CUDNN");                                                  \
  memset(perf, 0, 3 * sizeof *perf);                                                               \
  perf[0].algo = 6; /* the fastest, but on tensor cores */                                         \
  perf[0].status = CUDNN_STATUS_SUCCESS, perf[0].time = 0.1f;                                      \
  perf[0].mathType = CUDNN_TENSOR_OP_MATH;                                                         \
  perf[1].algo = 2, perf[1].status = CUDNN_STATUS_NOT_SUPPORTED, perf[1].time = -1;                \
  perf[2].algo = FAKE_ALGO, perf[2].status = CUDNN_STATUS_SUCCESS, perf[2].time = 1.0f;            \
  perf[2].memory = FAKE_WS;                                                                        \
  perf[2].mathType =                                                                               \
      mode && !strcmp(mode, "tensorop") ? CUDNN_TENSOR_OP_MATH_ALLOW_CONVERSION : CUDNN_FMA_MATH;  \
  *n = 3;                                                                                          \
  return CUDNN_STATUS_SUCCESS

cudnnStatus_t cudnnFindConvolutionForwardAlgorithmEx(
    cudnnHandle_t h, const cudnnTensorDescriptor_t a, const void *x,
    const cudnnFilterDescriptor_t wd, const void *w, const cudnnConvolutionDescriptor_t cd,
    const cudnnTensorDescriptor_t b, void *y, const int req, int *n,
    cudnnConvolutionFwdAlgoPerf_t *perf, void *ws, size_t wsz) {
  FIND_BODY;
}

cudnnStatus_t cudnnFindConvolutionBackwardDataAlgorithmEx(
    cudnnHandle_t h, const cudnnFilterDescriptor_t wd, const void *w,
    const cudnnTensorDescriptor_t b, const void *dy, const cudnnConvolutionDescriptor_t cd,
    const cudnnTensorDescriptor_t a, void *dx, const int req, int *n,
    cudnnConvolutionBwdDataAlgoPerf_t *perf, void *ws, size_t wsz) {
  FIND_BODY;
}

cudnnStatus_t cudnnFindConvolutionBackwardFilterAlgorithmEx(
    cudnnHandle_t h, const cudnnTensorDescriptor_t a, const void *x,
    const cudnnTensorDescriptor_t b, const void *dy, const cudnnConvolutionDescriptor_t cd,
    const cudnnFilterDescriptor_t wd, void *dw, const int req, int *n,
    cudnnConvolutionBwdFilterAlgoPerf_t *perf, void *ws, size_t wsz) {
  FIND_BODY;
}

/* The run: the algorithm and workspace Find offered, alpha 1 and beta 0. Computes nothing. */
static cudnnStatus_t run(int algo, const void *alpha, const void *beta,
                         const cudnnConvolutionDescriptor_t cd, const cudnnTensorDescriptor_t a,
                         const cudnnTensorDescriptor_t b, const cudnnFilterDescriptor_t wd,
                         const void *ws, size_t wsz) {
  if (!usable(cd, a, b, wd, ws, wsz) || algo != FAKE_ALGO || wsz != FAKE_WS ||
      *(const float *)alpha != 1.0f || *(const float *)beta != 0.0f)
    return CUDNN_STATUS_BAD_PARAM;
  return CUDNN_STATUS_SUCCESS;
}

cudnnStatus_t cudnnConvolutionForward(cudnnHandle_t h, const void *alpha,
                                      const cudnnTensorDescriptor_t a, const void *x,
                                      const cudnnFilterDescriptor_t wd, const void *w,
                                      const cudnnConvolutionDescriptor_t cd,
                                      cudnnConvolutionFwdAlgo_t algo, void *ws, size_t wsz,
                                      const void *beta, const cudnnTensorDescriptor_t b, void *y) {
  return run((int)algo, alpha, beta, cd, a, b, wd, ws, wsz);
}

cudnnStatus_t cudnnConvolutionBackwardData(cudnnHandle_t h, const void *alpha,
                                           const cudnnFilterDescriptor_t wd, const void *w,
                                           const cudnnTensorDescriptor_t b, const void *dy,
                                           const cudnnConvolutionDescriptor_t cd,
                                           cudnnConvolutionBwdDataAlgo_t algo, void *ws, size_t wsz,
                                           const void *beta, const cudnnTensorDescriptor_t a,
                                           void *dx) {
  return run((int)algo, alpha, beta, cd, a, b, wd, ws, wsz);
}

cudnnStatus_t cudnnConvolutionBackwardFilter(cudnnHandle_t h, const void *alpha,
                                             const cudnnTensorDescriptor_t a, const void *x,
                                             const cudnnTensorDescriptor_t b, const void *dy,
                                             const cudnnConvolutionDescriptor_t cd,
                                             cudnnConvolutionBwdFilterAlgo_t algo, void *ws,
                                             size_t wsz, const void *beta,
                                             const cudnnFilterDescriptor_t wd, void *dw) {
  return run((int)algo, alpha, beta, cd, a, b, wd, ws, wsz);
}
