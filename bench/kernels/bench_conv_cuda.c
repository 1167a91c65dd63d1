/* wl-bench-conv-cuda: our CUDA convolutions (implicit GEMM, fp32 on CUDA cores; forward,
 * backward-data, backward-filter) against cuDNN on the same device buffers: the reference models'
 * layers at batch 256 and two ResNet-50 layers, cuDNN time / ours and the target (>= 0.7
 * of cuDNN); a table or --json. cuDNN is the baseline only, and is not linked: it is opened at
 * run time (the GPU machine may have it only inside PyTorch's wheel). Exits 77 without a device
 * or without cuDNN, 1 when a result differs from cuDNN's beyond the tolerance. */
#include <cuda_runtime_api.h>
#include <cudnn.h>
#include <dlfcn.h>
#include <link.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "wavelet/kernels.h"

#define PROG         "wl-bench-conv-cuda"
#define TARGET_RATIO 0.7
/* max |ours - cuDNN| / max |cuDNN|: fp32 sums in another order (and cuDNN's Winograd or FFT
 * algorithms) stay near 1e-5; a wrong index or a missed tap is of order 0.1 and more. */
#define TOLERANCE 1e-3
/* cuDNN's algorithms may use up to this much workspace, allocated once before any timing. */
#define WS_CAP       ((size_t)1 << 30)
#define MIN_BATCH_MS 1.0   /* a timed repetition runs calls for at least this long */
#define WARMUP_MS    100.0 /* untimed calls before the repetitions (clocks settle) */

typedef enum { P_FWD, P_BWD_DATA, P_BWD_FILTER, P_COUNT } pass_t;
static const char *pass_name[P_COUNT] = {"fwd", "bwd_data", "bwd_filter"};

/* first: the network's input layer (C = 1), whose backward-data the trainer never runs (its
 * input is the data), so it is not measured either. */
typedef struct shape_s {
  const char *name;
  int n, h, w, c, k, r, pad, stride, first;
} shape_t;

/* bench/wavelet/net.c's convolutions at gpu-check's batch (256), then a ResNet-50 stage-1 3x3
 * layer, its stride-2 stage-2 3x3, and a stage-1 1x1 expansion at batch 32. */
static const shape_t shapes[] = {
    {"cnn.conv1", 256, 28, 28, 1, 32, 5, 2, 1, 1},
    {"cnn.conv2", 256, 14, 14, 32, 64, 5, 2, 1, 0},
    {"resnet.stem", 256, 28, 28, 1, 16, 3, 1, 1, 1},
    {"resnet.res1", 256, 28, 28, 16, 16, 3, 1, 1, 0},
    {"resnet.conv2", 256, 14, 14, 16, 32, 3, 1, 1, 0},
    {"resnet.res2", 256, 14, 14, 32, 32, 3, 1, 1, 0},
    {"r50.3x3", 32, 56, 56, 64, 64, 3, 1, 1, 0},
    {"r50.3x3s2", 32, 56, 56, 128, 128, 3, 1, 2, 0},
    {"r50.1x1", 32, 56, 56, 64, 256, 1, 0, 1, 0},
};
#define NSHAPES ((int)(sizeof shapes / sizeof shapes[0]))

typedef struct result_s {
  const shape_t *sh;
  pass_t pass;
  int p, q;
  double ours_ms, cudnn_ms, err;
  int algo, math;
  size_t ws;
  const char *error; /* NULL, or why this row has no valid ratio */
} result_t;

/* The cuDNN functions used, resolved with dlsym into pointers of their declared types. */
#define CUDNN_FUNCS(X)                                                                             \
  X(cudnnGetVersion)                                                                               \
  X(cudnnGetErrorString)                                                                           \
  X(cudnnCreate)                                                                                   \
  X(cudnnDestroy)                                                                                  \
  X(cudnnCreateTensorDescriptor)                                                                   \
  X(cudnnSetTensor4dDescriptor)                                                                    \
  X(cudnnDestroyTensorDescriptor)                                                                  \
  X(cudnnCreateFilterDescriptor)                                                                   \
  X(cudnnSetFilter4dDescriptor)                                                                    \
  X(cudnnDestroyFilterDescriptor)                                                                  \
  X(cudnnCreateConvolutionDescriptor)                                                              \
  X(cudnnSetConvolution2dDescriptor)                                                               \
  X(cudnnSetConvolutionMathType)                                                                   \
  X(cudnnDestroyConvolutionDescriptor)                                                             \
  X(cudnnGetConvolution2dForwardOutputDim)                                                         \
  X(cudnnFindConvolutionForwardAlgorithmEx)                                                        \
  X(cudnnFindConvolutionBackwardDataAlgorithmEx)                                                   \
  X(cudnnFindConvolutionBackwardFilterAlgorithmEx)                                                 \
  X(cudnnConvolutionForward)                                                                       \
  X(cudnnConvolutionBackwardData)                                                                  \
  X(cudnnConvolutionBackwardFilter)

static struct {
#define FIELD(f) __typeof__(&f) f;
  CUDNN_FUNCS(FIELD)
#undef FIELD
} dnn;
static char dnn_path[512];

/* WAVELET_CUDNN_LIB when set (and then only it: a benchmark must not quietly measure another
 * cuDNN than the one named), else libcudnn.so.9, then libcudnn.so, from the loader's path.
 * cuDNN 9's libcudnn.so.9 opens its sub-libraries (libcudnn_cnn.so.9, the engines) by soname,
 * through its RUNPATH ($ORIGIN) and LD_LIBRARY_PATH. 0, or -1 with the reason in why. */
static int dnn_load(char *why, size_t len) {
  const char *env = getenv("WAVELET_CUDNN_LIB");
  const char *names[2] = {"libcudnn.so.9", "libcudnn.so"};
  int nnames = 2;
  if (env && *env) names[0] = env, nnames = 1;
  void *lib = NULL;
  for (int i = 0; i < nnames && !lib; i++) lib = dlopen(names[i], RTLD_NOW | RTLD_LOCAL);
  if (!lib) {
    snprintf(why, len, "cannot load cuDNN (%s%s): %s", names[0],
             nnames > 1 ? " or libcudnn.so; WAVELET_CUDNN_LIB names it" : "", dlerror());
    return -1;
  }
#define RESOLVE(f)                                                                                 \
  if (!(*(void **)&dnn.f = dlsym(lib, #f))) {                                                      \
    snprintf(why, len, "the library loaded as cuDNN lacks %s", #f);                                \
    return -1;                                                                                     \
  }
  CUDNN_FUNCS(RESOLVE)
#undef RESOLVE
  struct link_map *lm = NULL; /* the file the loader chose, for the report */
  snprintf(dnn_path, sizeof dnn_path, "%s",
           dlinfo(lib, RTLD_DI_LINKMAP, &lm) == 0 && lm && lm->l_name && *lm->l_name ? lm->l_name
                                                                                     : names[0]);
  size_t v = dnn.cudnnGetVersion();
  if (v < 90000) { /* 9.x numbers versions as major * 10000 + minor * 100 + patch */
    snprintf(why, len, "cuDNN %zu in %s is too old (9.0 or newer is needed)", v, dnn_path);
    return -1;
  }
  return 0;
}

#define CK(call)                                                                                   \
  do {                                                                                             \
    cudaError_t e_ = (call);                                                                       \
    if (e_ != cudaSuccess) {                                                                       \
      fprintf(stderr, PROG ": %s: %s\n", #call, cudaGetErrorString(e_));                           \
      exit(1);                                                                                     \
    }                                                                                              \
  } while (0)

/* One shape's device buffers and descriptors. */
typedef struct layer_s {
  wl_conv2d_t cv;
  size_t nx, nw, ny;
  float *x, *w, *y, *dy, *dx, *dw;
  cudnnTensorDescriptor_t xd, yd;
  cudnnFilterDescriptor_t wd;
  cudnnConvolutionDescriptor_t cd;
} layer_t;

static cudnnHandle_t dh;
static void *ws;

static void upload_random(float *dev, size_t n, uint64_t seed) {
  float *h = malloc(n * sizeof *h);
  if (!h) exit(1);
  for (size_t i = 0; i < n; i++) { /* uniform in [-0.5, 0.5): splitmix64's high bits */
    uint64_t z = (seed += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    h[i] = (float)((z ^ (z >> 31)) >> 40) / (float)(1 << 24) - 0.5f;
  }
  CK(cudaMemcpy(dev, h, n * sizeof *h, cudaMemcpyHostToDevice));
  free(h);
}

/* 0, or the failing cuDNN status. */
static int layer_init(layer_t *l, const shape_t *s) {
  memset(l, 0, sizeof *l);
  wl_conv2d_t cv = {.n = s->n,
                    .h = s->h,
                    .w = s->w,
                    .c = s->c,
                    .k = s->k,
                    .r = s->r,
                    .s = s->r,
                    .pad_h = s->pad,
                    .pad_w = s->pad,
                    .stride_h = s->stride,
                    .stride_w = s->stride};
  if (wl_conv2d_init(&cv) != 0) {
    fprintf(stderr, PROG ": %s: wl_conv2d_init refused the shape\n", s->name);
    exit(1);
  }
  l->cv = cv;
  l->nx = (size_t)cv.n * cv.h * cv.w * cv.c;
  l->nw = (size_t)cv.k * cv.r * cv.s * cv.c;
  l->ny = (size_t)cv.n * cv.p * cv.q * cv.k;
  CK(cudaMalloc((void **)&l->x, l->nx * 4));
  CK(cudaMalloc((void **)&l->dx, l->nx * 4));
  CK(cudaMalloc((void **)&l->w, l->nw * 4));
  CK(cudaMalloc((void **)&l->dw, l->nw * 4));
  CK(cudaMalloc((void **)&l->y, l->ny * 4));
  CK(cudaMalloc((void **)&l->dy, l->ny * 4));
  upload_random(l->x, l->nx, 1);
  upload_random(l->w, l->nw, 2);
  upload_random(l->dy, l->ny, 3);
  cudnnStatus_t st;
#define TRY(call)                                                                                  \
  if ((st = (call)) != CUDNN_STATUS_SUCCESS) return (int)st
  TRY(dnn.cudnnCreateTensorDescriptor(&l->xd));
  TRY(dnn.cudnnCreateTensorDescriptor(&l->yd));
  TRY(dnn.cudnnCreateFilterDescriptor(&l->wd));
  TRY(dnn.cudnnCreateConvolutionDescriptor(&l->cd));
  /* NHWC activations and KRSC filters (cuDNN's NHWC filter format), as our kernels take them. */
  TRY(dnn.cudnnSetTensor4dDescriptor(l->xd, CUDNN_TENSOR_NHWC, CUDNN_DATA_FLOAT, cv.n, cv.c, cv.h,
                                     cv.w));
  TRY(dnn.cudnnSetFilter4dDescriptor(l->wd, CUDNN_DATA_FLOAT, CUDNN_TENSOR_NHWC, cv.k, cv.c, cv.r,
                                     cv.s));
  TRY(dnn.cudnnSetConvolution2dDescriptor(l->cd, cv.pad_h, cv.pad_w, cv.stride_h, cv.stride_w,
                                          cv.dil_h, cv.dil_w, CUDNN_CROSS_CORRELATION,
                                          CUDNN_DATA_FLOAT));
  /* Plain fp32 FMA: no TF32 tensor cores, which our kernels do not use either. */
  TRY(dnn.cudnnSetConvolutionMathType(l->cd, CUDNN_FMA_MATH));
  int on, oc, oh, ow;
  TRY(dnn.cudnnGetConvolution2dForwardOutputDim(l->cd, l->xd, l->wd, &on, &oc, &oh, &ow));
  if (on != cv.n || oc != cv.k || oh != cv.p || ow != cv.q) {
    fprintf(stderr, PROG ": %s: cuDNN's output %dx%dx%dx%d is not ours %dx%dx%dx%d\n", s->name, on,
            oh, ow, oc, cv.n, cv.p, cv.q, cv.k);
    exit(1);
  }
  TRY(dnn.cudnnSetTensor4dDescriptor(l->yd, CUDNN_TENSOR_NHWC, CUDNN_DATA_FLOAT, cv.n, cv.k, cv.p,
                                     cv.q));
#undef TRY
  return 0;
}

static void layer_free(layer_t *l) {
  cudaFree(l->x), cudaFree(l->dx), cudaFree(l->w), cudaFree(l->dw), cudaFree(l->y);
  cudaFree(l->dy);
  if (l->xd) dnn.cudnnDestroyTensorDescriptor(l->xd);
  if (l->yd) dnn.cudnnDestroyTensorDescriptor(l->yd);
  if (l->wd) dnn.cudnnDestroyFilterDescriptor(l->wd);
  if (l->cd) dnn.cudnnDestroyConvolutionDescriptor(l->cd);
}

static float *out_of(layer_t *l, pass_t p, size_t *n) {
  *n = p == P_FWD ? l->ny : p == P_BWD_DATA ? l->nx : l->nw;
  return p == P_FWD ? l->y : p == P_BWD_DATA ? l->dx : l->dw;
}

static int run_ours(layer_t *l, pass_t p) {
  if (p == P_FWD) return wl_cuda_conv2d_fwd(&l->cv, l->x, l->w, NULL, l->y, NULL);
  if (p == P_BWD_DATA) return wl_cuda_conv2d_bwd_data(&l->cv, l->dy, l->w, l->dx, NULL);
  return wl_cuda_conv2d_bwd_filter(&l->cv, l->x, l->dy, l->dw, NULL, NULL);
}

static int run_cudnn(layer_t *l, pass_t p, int algo, size_t wsz) {
  const float one = 1.0f, zero = 0.0f;
  if (p == P_FWD)
    return (int)dnn.cudnnConvolutionForward(dh, &one, l->xd, l->x, l->wd, l->w, l->cd,
                                            (cudnnConvolutionFwdAlgo_t)algo, ws, wsz, &zero, l->yd,
                                            l->y);
  if (p == P_BWD_DATA)
    return (int)dnn.cudnnConvolutionBackwardData(dh, &one, l->wd, l->w, l->yd, l->dy, l->cd,
                                                 (cudnnConvolutionBwdDataAlgo_t)algo, ws, wsz,
                                                 &zero, l->xd, l->dx);
  return (int)dnn.cudnnConvolutionBackwardFilter(dh, &one, l->xd, l->x, l->yd, l->dy, l->cd,
                                                 (cudnnConvolutionBwdFilterAlgo_t)algo, ws, wsz,
                                                 &zero, l->wd, l->dw);
}

/* cuDNN's fastest algorithm for the pass that succeeds within WS_CAP without tensor cores
 * (cudnnFind*AlgorithmEx runs them all on these buffers, results sorted by time). 0, or the
 * failing status (CUDNN_STATUS_NOT_SUPPORTED when none qualifies). */
#define PICK(perf, n)                                                                              \
  for (int i_ = 0; i_ < (n); i_++)                                                                 \
    if ((perf)[i_].status == CUDNN_STATUS_SUCCESS && (perf)[i_].memory <= WS_CAP &&                \
        (perf)[i_].mathType != CUDNN_TENSOR_OP_MATH &&                                             \
        (perf)[i_].mathType != CUDNN_TENSOR_OP_MATH_ALLOW_CONVERSION) {                            \
      *algo = (int)(perf)[i_].algo, *wsz = (perf)[i_].memory, *math = (int)(perf)[i_].mathType;    \
      return 0;                                                                                    \
    }                                                                                              \
  return (int)CUDNN_STATUS_NOT_SUPPORTED

static int find_algo(layer_t *l, pass_t p, int *algo, size_t *wsz, int *math) {
  int n = 0;
  cudnnStatus_t st;
  if (p == P_FWD) {
    cudnnConvolutionFwdAlgoPerf_t perf[CUDNN_CONVOLUTION_FWD_ALGO_COUNT];
    st = dnn.cudnnFindConvolutionForwardAlgorithmEx(dh, l->xd, l->x, l->wd, l->w, l->cd, l->yd,
                                                    l->y, CUDNN_CONVOLUTION_FWD_ALGO_COUNT, &n,
                                                    perf, ws, WS_CAP);
    if (st != CUDNN_STATUS_SUCCESS) return (int)st;
    PICK(perf, n);
  } else if (p == P_BWD_DATA) {
    cudnnConvolutionBwdDataAlgoPerf_t perf[CUDNN_CONVOLUTION_BWD_DATA_ALGO_COUNT];
    st = dnn.cudnnFindConvolutionBackwardDataAlgorithmEx(
        dh, l->wd, l->w, l->yd, l->dy, l->cd, l->xd, l->dx, CUDNN_CONVOLUTION_BWD_DATA_ALGO_COUNT,
        &n, perf, ws, WS_CAP);
    if (st != CUDNN_STATUS_SUCCESS) return (int)st;
    PICK(perf, n);
  } else {
    cudnnConvolutionBwdFilterAlgoPerf_t perf[CUDNN_CONVOLUTION_BWD_FILTER_ALGO_COUNT];
    st = dnn.cudnnFindConvolutionBackwardFilterAlgorithmEx(
        dh, l->xd, l->x, l->yd, l->dy, l->cd, l->wd, l->dw, CUDNN_CONVOLUTION_BWD_FILTER_ALGO_COUNT,
        &n, perf, ws, WS_CAP);
    if (st != CUDNN_STATUS_SUCCESS) return (int)st;
    PICK(perf, n);
  }
}
#undef PICK

static int cmp_double(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return x < y ? -1 : x > y;
}

/* One side of a measurement: ours or cuDNN's (with its algorithm), the calls per timed batch,
 * and the repetitions' milliseconds per call. */
typedef struct meas_s {
  layer_t *l;
  pass_t p;
  int ours, algo;
  size_t wsz;
  int batch;
  double t[1000];
} meas_t;

/* Runs `batch` calls between two events; their milliseconds. */
static double run_batch(meas_t *t, cudaEvent_t e0, cudaEvent_t e1, int batch) {
  CK(cudaEventRecord(e0, NULL));
  for (int i = 0; i < batch; i++) {
    int rc = t->ours ? run_ours(t->l, t->p) : run_cudnn(t->l, t->p, t->algo, t->wsz);
    if (rc) {
      if (t->ours)
        fprintf(stderr, PROG ": our %s failed (%d, CUDA error %d)\n", pass_name[t->p], rc,
                wl_cuda_last_error());
      else
        fprintf(stderr, PROG ": cuDNN's %s failed: %s\n", pass_name[t->p],
                dnn.cudnnGetErrorString((cudnnStatus_t)rc));
      exit(1);
    }
  }
  CK(cudaEventRecord(e1, NULL));
  CK(cudaEventSynchronize(e1));
  float ms = 0;
  CK(cudaEventElapsedTime(&ms, e0, e1));
  return ms;
}

/* Warm-up: one call sizes the batch (MIN_BATCH_MS), then batches for WARMUP_MS. */
static void warm_up(meas_t *t, cudaEvent_t e0, cudaEvent_t e1) {
  double one = run_batch(t, e0, e1, 1);
  t->batch = one > 0 ? (int)ceil(MIN_BATCH_MS / one) : 256;
  if (t->batch < 1) t->batch = 1;
  if (t->batch > 256) t->batch = 256;
  double spent = one;
  for (int i = 0; i < 1000 && spent < WARMUP_MS; i++) spent += run_batch(t, e0, e1, t->batch);
}

/* Milliseconds per call, the median of reps batches; ours and cuDNN's batches alternate, so
 * clock changes during the measurement fall on both. */
static void time_pair(meas_t *a, meas_t *b, int reps, double *ms_a, double *ms_b) {
  cudaEvent_t e0, e1;
  CK(cudaEventCreate(&e0));
  CK(cudaEventCreate(&e1));
  warm_up(a, e0, e1);
  warm_up(b, e0, e1);
  for (int r = 0; r < reps; r++) {
    a->t[r] = run_batch(a, e0, e1, a->batch) / a->batch;
    b->t[r] = run_batch(b, e0, e1, b->batch) / b->batch;
  }
  qsort(a->t, (size_t)reps, sizeof a->t[0], cmp_double);
  qsort(b->t, (size_t)reps, sizeof b->t[0], cmp_double);
  *ms_a = reps % 2 ? a->t[reps / 2] : (a->t[reps / 2 - 1] + a->t[reps / 2]) / 2;
  *ms_b = reps % 2 ? b->t[reps / 2] : (b->t[reps / 2 - 1] + b->t[reps / 2]) / 2;
  cudaEventDestroy(e0);
  cudaEventDestroy(e1);
}

/* max |ours - cuDNN| / max |cuDNN| over the pass's output (NaN when either has a NaN). */
static double compare(layer_t *l, pass_t p, int algo, size_t wsz, const char **error) {
  size_t n;
  float *out = out_of(l, p, &n);
  float *a = malloc(n * 4), *b = malloc(n * 4);
  if (!a || !b) exit(1);
  CK(cudaMemset(out, 0xff, n * 4)); /* NaN: a pass that leaves its output alone cannot pass */
  int rc = run_ours(l, p);
  if (rc) {
    fprintf(stderr, PROG ": our %s failed (%d, CUDA error %d)\n", pass_name[p], rc,
            wl_cuda_last_error());
    exit(1);
  }
  CK(cudaMemcpy(a, out, n * 4, cudaMemcpyDeviceToHost));
  CK(cudaMemset(out, 0xff, n * 4));
  if ((rc = run_cudnn(l, p, algo, wsz)) != 0) {
    *error = dnn.cudnnGetErrorString((cudnnStatus_t)rc);
    free(a), free(b);
    return NAN;
  }
  CK(cudaMemcpy(b, out, n * 4, cudaMemcpyDeviceToHost));
  double d = 0, m = 0;
  for (size_t i = 0; i < n; i++) {
    double e = fabs((double)a[i] - b[i]);
    if (isnan(e)) d = NAN;
    if (!isnan(d) && e > d) d = e;
    if (fabs(b[i]) > m) m = fabs(b[i]);
  }
  free(a), free(b);
  return m > 0 ? d / m : d;
}

static double gflop(const result_t *r) {
  const shape_t *s = r->sh;
  return 2.0 * s->n * r->p * r->q * s->k * s->c * s->r * s->r * 1e-9;
}

static void usage(FILE *f) {
  fprintf(f, "usage: " PROG " [--json] [--shapes NAME,...] [--passes fwd,bwd_data,bwd_filter]\n"
             "                          [--reps N]\n"
             "  Our fp32 convolutions (NHWC, KRSC) against cuDNN's, fp32 FMA without TF32, on\n"
             "  device 0; each figure is the median of N timed repetitions (default 15, 3..1000)\n"
             "  after a warm-up. cuDNN is opened at run time: WAVELET_CUDNN_LIB, else\n"
             "  libcudnn.so.9 or libcudnn.so from the loader's path. Shapes:\n");
  for (int i = 0; i < NSHAPES; i++) {
    const shape_t *s = &shapes[i];
    fprintf(f, "    %-13s N=%-3d %3dx%-3d %3d->%-3d %dx%d pad %d stride %d%s\n", s->name, s->n,
            s->h, s->w, s->c, s->k, s->r, s->r, s->pad, s->stride,
            s->first ? " (input layer: no bwd_data)" : "");
  }
}

/* Parses a comma-separated list of names out of `names` into want[]; 0, or -1 with the bad
 * token in bad. */
static int parse_list(const char *v, const char *const *names, int count, size_t stride, int *want,
                      char *bad, size_t badlen) {
  char buf[512];
  snprintf(buf, sizeof buf, "%s", v);
  memset(want, 0, (size_t)count * sizeof *want);
  int any = 0;
  char *save = NULL;
  for (char *tok = strtok_r(buf, ",", &save); tok; tok = strtok_r(NULL, ",", &save)) {
    int found = 0;
    for (int i = 0; i < count; i++)
      if (!strcmp(tok, *(const char *const *)((const char *)names + i * stride)))
        want[i] = found = any = 1;
    if (!found) {
      snprintf(bad, badlen, "%s", tok);
      return -1;
    }
  }
  if (!any) snprintf(bad, badlen, "%s", v);
  return any ? 0 : -1;
}

int main(int argc, char **argv) {
  int json = 0, reps = 15, want_shape[NSHAPES], want_pass[P_COUNT];
  for (int i = 0; i < NSHAPES; i++) want_shape[i] = 1;
  for (int p = 0; p < P_COUNT; p++) want_pass[p] = 1;
  for (int i = 1; i < argc; i++) {
    const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
    char bad[512];
    if (!strcmp(a, "--json")) {
      json = 1;
    } else if (!strcmp(a, "--shapes") && v) {
      if (parse_list(v, &shapes[0].name, NSHAPES, sizeof shapes[0], want_shape, bad, sizeof bad)) {
        fprintf(stderr, PROG ": bad --shapes '%s' (expected names from --help, comma-separated)\n",
                bad);
        return 2;
      }
      i++;
    } else if (!strcmp(a, "--passes") && v) {
      if (parse_list(v, pass_name, P_COUNT, sizeof pass_name[0], want_pass, bad, sizeof bad)) {
        fprintf(stderr, PROG ": bad --passes '%s' (fwd, bwd_data, bwd_filter, comma-separated)\n",
                bad);
        return 2;
      }
      i++;
    } else if (!strcmp(a, "--reps") && v) {
      char *end;
      long n = strtol(v, &end, 10);
      if (end == v || *end || n < 3 || n > 1000) {
        fprintf(stderr, PROG ": bad --reps '%s' (a whole number from 3 to 1000)\n", v);
        return 2;
      }
      reps = (int)n;
      i++;
    } else if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
      usage(stdout);
      return 0;
    } else if (!v && (!strcmp(a, "--shapes") || !strcmp(a, "--passes") || !strcmp(a, "--reps"))) {
      fprintf(stderr, PROG ": %s: expected a value after it\n", a);
      return 2;
    } else {
      fprintf(stderr, PROG ": unknown or incomplete argument '%s'\n", a);
      usage(stderr);
      return 2;
    }
  }
  if (wl_cuda_available() != 0) {
    fprintf(stderr, PROG ": no usable CUDA device (CUDA error %d): skipped\n",
            wl_cuda_last_error());
    return 77;
  }
  char why[1024];
  if (dnn_load(why, sizeof why)) {
    fprintf(stderr, PROG ": %s: skipped\n", why);
    return 77;
  }
  struct cudaDeviceProp prop;
  CK(cudaGetDeviceProperties(&prop, 0));
  cudnnStatus_t st = dnn.cudnnCreate(&dh);
  if (st != CUDNN_STATUS_SUCCESS) { /* a device and a cuDNN that does not work: a failure */
    fprintf(stderr, PROG ": cudnnCreate (%s): %s\n", dnn_path, dnn.cudnnGetErrorString(st));
    return 1;
  }
  CK(cudaMalloc(&ws, WS_CAP));
  size_t version = dnn.cudnnGetVersion();

  result_t res[NSHAPES * P_COUNT];
  int nres = 0, bad_rows = 0;
  static meas_t ta, tb;
  for (int si = 0; si < NSHAPES; si++) {
    if (!want_shape[si]) continue;
    const shape_t *s = &shapes[si];
    layer_t l;
    const int init_rc = layer_init(&l, s);
    for (int p = 0; p < P_COUNT; p++) {
      if (!want_pass[p] || (p == P_BWD_DATA && s->first)) continue;
      result_t *r = &res[nres++];
      memset(r, 0, sizeof *r);
      r->sh = s, r->pass = (pass_t)p, r->p = l.cv.p, r->q = l.cv.q;
      r->err = NAN, r->ours_ms = r->cudnn_ms = NAN, r->algo = -1;
      int rc = init_rc ? init_rc : find_algo(&l, (pass_t)p, &r->algo, &r->ws, &r->math);
      if (rc) {
        r->error = dnn.cudnnGetErrorString((cudnnStatus_t)rc);
      } else {
        r->err = compare(&l, (pass_t)p, r->algo, r->ws, &r->error);
      }
      if (!r->error && !(r->err <= TOLERANCE)) r->error = "result differs from cuDNN's";
      if (r->error) {
        fprintf(stderr, PROG ": %s %s: %s (max rel err %.2e)\n", s->name, pass_name[p], r->error,
                r->err);
        bad_rows++;
        continue;
      }
      ta = (meas_t){.l = &l, .p = (pass_t)p, .ours = 1};
      tb = (meas_t){.l = &l, .p = (pass_t)p, .ours = 0, .algo = r->algo, .wsz = r->ws};
      time_pair(&ta, &tb, reps, &r->ours_ms, &r->cudnn_ms);
      if (!json)
        fprintf(stderr, "  %-13s %-10s ours %.3f ms, cuDNN %.3f ms\n", s->name, pass_name[p],
                r->ours_ms, r->cudnn_ms);
    }
    layer_free(&l);
  }
  cudaFree(ws);
  dnn.cudnnDestroy(dh);

  /* Geometric means of cuDNN / ours per pass, over the rows that passed the check. The target
   * is met when each measured pass's mean is at least TARGET_RATIO and no row failed. */
  double gm[P_COUNT] = {0};
  int cnt[P_COUNT] = {0}, met = bad_rows == 0, any = 0;
  for (int i = 0; i < nres; i++)
    if (!res[i].error) {
      gm[res[i].pass] += log(res[i].cudnn_ms / res[i].ours_ms);
      cnt[res[i].pass]++;
    }
  for (int p = 0; p < P_COUNT; p++)
    if (cnt[p]) {
      gm[p] = exp(gm[p] / cnt[p]);
      met = met && gm[p] >= TARGET_RATIO;
      any = 1;
    }
  met = met && any;

  if (json) {
    printf("{\"benchmark\":\"" PROG "\",\"device\":\"%s\",\"sm\":\"%d%d\",\"baseline\":\"cuDNN\","
           "\"cudnn_version\":%zu,\"cudnn_library\":\"%s\",\"math\":\"fp32 FMA on CUDA cores, "
           "no TF32 (cuDNN: CUDNN_FMA_MATH)\",\"layout\":\"NHWC activations, KRSC filters\","
           "\"workspace_cap_bytes\":%zu,\"reps\":%d,\"statistic\":\"median\","
           "\"tolerance\":%.0e,\"results\":[",
           prop.name, prop.major, prop.minor, version, dnn_path, WS_CAP, reps, TOLERANCE);
    for (int i = 0; i < nres; i++) {
      const result_t *r = &res[i];
      const shape_t *s = r->sh;
      printf("%s{\"shape\":\"%s\",\"n\":%d,\"h\":%d,\"w\":%d,\"c\":%d,\"k\":%d,\"r\":%d,\"s\":%d,"
             "\"pad\":%d,\"stride\":%d,\"p\":%d,\"q\":%d,\"pass\":\"%s\",\"gflop\":%.3f,",
             i ? "," : "", s->name, s->n, s->h, s->w, s->c, s->k, s->r, s->r, s->pad, s->stride,
             r->p, r->q, pass_name[r->pass], gflop(r));
      if (r->error && isnan(r->err))
        printf("\"ok\":false,\"error\":\"%s\",\"max_rel_err\":null}", r->error);
      else if (r->error)
        printf("\"ok\":false,\"error\":\"%s\",\"max_rel_err\":%.2e}", r->error, r->err);
      else
        printf("\"ok\":true,\"ms\":%.4f,\"cudnn_ms\":%.4f,\"ratio_vs_cudnn\":%.3f,"
               "\"max_rel_err\":%.2e,\"cudnn_algo\":%d,\"cudnn_math_type\":%d,"
               "\"cudnn_workspace_bytes\":%zu}",
               r->ours_ms, r->cudnn_ms, r->cudnn_ms / r->ours_ms, r->err, r->algo, r->math, r->ws);
    }
    printf("],\"summary\":{\"geomean_ratio_vs_cudnn\":{");
    for (int p = 0, first = 1; p < P_COUNT; p++)
      if (cnt[p]) printf("%s\"%s\":%.3f", first ? "" : ",", pass_name[p], gm[p]), first = 0;
    printf("},\"target_ratio_min\":%.2f,\"target_met\":%s,\"failed_rows\":%d}}\n", TARGET_RATIO,
           met ? "true" : "false", bad_rows);
  } else {
    printf(PROG ": %s (sm_%d%d), baseline cuDNN %zu (%s)\n", prop.name, prop.major, prop.minor,
           version, dnn_path);
    printf("fp32 on CUDA cores for both (cuDNN: CUDNN_FMA_MATH, no TF32); NHWC, KRSC; median of "
           "%d; cuDNN's fastest algorithm within %zu MiB of workspace\n",
           reps, WS_CAP >> 20);
    printf("%-13s %-10s %9s %9s %10s %7s %12s %5s\n", "shape", "pass", "ours ms", "cuDNN ms",
           "ours TF/s", "ratio", "max rel err", "algo");
    for (int i = 0; i < nres; i++) {
      const result_t *r = &res[i];
      if (r->error) {
        printf("%-13s %-10s %s\n", r->sh->name, pass_name[r->pass], r->error);
        continue;
      }
      printf("%-13s %-10s %9.3f %9.3f %10.2f %7.3f %12.1e %5d\n", r->sh->name, pass_name[r->pass],
             r->ours_ms, r->cudnn_ms, gflop(r) / r->ours_ms * 1e-3, r->cudnn_ms / r->ours_ms,
             r->err, r->algo);
    }
    printf("geometric mean of cuDNN time / ours:%s", any ? "" : " none (no row passed)");
    for (int p = 0; p < P_COUNT; p++)
      if (cnt[p]) printf(" %s %.3f", pass_name[p], gm[p]);
    printf("\ntarget (issue 6): >= %.2f of cuDNN in each pass: %s%s\n", TARGET_RATIO,
           met ? "met" : "not met", bad_rows ? " (rows failed: see above)" : "");
  }
  return bad_rows ? 1 : 0;
}
