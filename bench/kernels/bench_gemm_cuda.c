/* wl-bench-gemm-cuda: our CUDA GEMMs (fp32 SIMT; TF32 and BF16 wgmma+TMA on sm_90 or mma.sync
 * elsewhere, BF16 as A B and as A B^T) against cuBLAS on the same device buffers, with the
 * ratios and the targets (bf16 >= 0.9 of cuBLAS at 8192, fp32 >= 0.8); a table or --json.
 * Where the wgmma kernel runs, the bf16 rows come twice: the library's schedule (persistent for
 * more tiles than SMs) and the one-block-per-tile kernel forced (_nonpersistent), so that one run
 * shows which is faster. cuBLAS is the baseline only. Exits 77 without a device, 1 when a result
 * is over its tolerance against cuBLAS's. */
#include <cublas_v2.h>
#include <cuda_runtime_api.h>
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "wavelet/kernels.h"
#include "bench_json.h"

#define MAX_SIZES 16

/* bf16nt: C = A B^T (B stored n x k), both operands k-contiguous, the layout wgmma reads without
 * its transpose bits; the others are C = A B. _nonpersistent: the same with the wgmma kernel's
 * one-block-per-tile schedule forced (wl_cuda_gemm_bf16_set_schedule). */
typedef enum { P_FP32, P_TF32, P_BF16, P_BF16_NT, P_BF16_NP, P_BF16_NT_NP, P_COUNT } prec_t;
static const char *prec_name[P_COUNT] = {
    "fp32", "tf32", "bf16", "bf16nt", "bf16_nonpersistent", "bf16nt_nonpersistent"};
static const double prec_target[P_COUNT] = {0.8, 0.0, 0.9, 0.0, 0.0, 0.0}; /* 0: none */
#define TARGET_SIZE 8192

/* The largest max_rel_diff (max |ours - cuBLAS| / max |cuBLAS|) a right result has; a row over
 * it fails the run (exit 1). fp32: the CPU tests' 1e-4 (both sum in fp32, in different orders).
 * tf32: each side rounds the fp32 inputs to 10 mantissa bits itself (ours with cvt.rna, on wgmma
 * and mma.sync alike), products off by up to 2^-10.
 * bf16: both read the same bf16 operands and accumulate in fp32, but the tensor cores' adds are
 * not IEEE fp32 ones; 1e-3 leaves room for that and is still 20x under one skipped 64-wide k-tile
 * at 8192 (about 2e-2 with these inputs). */
static double tolerance(prec_t p) {
  return p == P_FP32 ? 1e-4 : 1e-3;
}

typedef struct result_s {
  int size;
  prec_t prec;
  double ours, cublas; /* TFLOP/s, best of the repetitions */
  double diff;         /* max |ours - cublas| / max |cublas| */
  int ok;              /* diff within tolerance(prec) */
  const char *kernel;  /* ours: "simt", "mma.sync", "wgmma", "wgmma persistent" */
} result_t;

static int is_bf16(prec_t p) {
  return p == P_BF16 || p == P_BF16_NT || p == P_BF16_NP || p == P_BF16_NT_NP;
}

#define CK(call)                                                                                   \
  do {                                                                                             \
    cudaError_t e_ = (call);                                                                       \
    if (e_ != cudaSuccess) {                                                                       \
      fprintf(stderr, "wl-bench-gemm-cuda: %s: %s\n", #call, cudaGetErrorString(e_));              \
      exit(1);                                                                                     \
    }                                                                                              \
  } while (0)

/* Enough buffer sets that one pass over them is at least 2x the L2 (CUTLASS's methodology), so
 * repetitions do not hit in cache. */
typedef struct bufs_s {
  int n, sets;
  void *a[16], *b[16];
  float *c[16];
} bufs_t;

static void upload_random(void *dev, size_t n, int bf16) {
  float *h = malloc(n * sizeof(float));
  if (!h) exit(1);
  for (size_t i = 0; i < n; i++) h[i] = (float)rand() / (float)RAND_MAX - 0.5f;
  if (bf16) {
    float *tmp;
    CK(cudaMalloc((void **)&tmp, n * sizeof(float)));
    CK(cudaMemcpy(tmp, h, n * sizeof(float), cudaMemcpyHostToDevice));
    if (wl_cuda_f32_to_bf16(n, tmp, dev, NULL) != 0) exit(1);
    CK(cudaDeviceSynchronize());
    cudaFree(tmp);
  } else {
    CK(cudaMemcpy(dev, h, n * sizeof(float), cudaMemcpyHostToDevice));
  }
  free(h);
}

static int run_ours(prec_t p, const bufs_t *b, int s) {
  size_t n = (size_t)b->n;
  if (p == P_BF16_NT || p == P_BF16_NT_NP)
    return wl_cuda_gemm_bf16(WL_NOTRANS, WL_TRANS, n, n, n, 1.0f, b->a[s], n, b->b[s], n, 0.0f,
                             b->c[s], n, NULL);
  if (p == P_BF16 || p == P_BF16_NP)
    return wl_cuda_gemm_bf16(WL_NOTRANS, WL_NOTRANS, n, n, n, 1.0f, b->a[s], n, b->b[s], n, 0.0f,
                             b->c[s], n, NULL);
  return wl_cuda_sgemm(WL_NOTRANS, WL_NOTRANS, n, n, n, 1.0f, b->a[s], n, b->b[s], n, 0.0f, b->c[s],
                       n, p == P_TF32 ? WL_MATH_TF32 : WL_MATH_FP32, NULL);
}

/* Row-major C = A B is column-major C^T = B^T A^T: swap the operands (C = A B^T: C^T = B A^T,
 * B's buffer read transposed). */
static int run_cublas(cublasHandle_t h, prec_t p, const bufs_t *b, int s) {
  int n = b->n;
  const float one = 1.0f, zero = 0.0f;
  cublasStatus_t st;
  if (p == P_FP32) {
    st = cublasSgemm(h, CUBLAS_OP_N, CUBLAS_OP_N, n, n, n, &one, b->b[s], n, b->a[s], n, &zero,
                     b->c[s], n);
  } else {
    cudaDataType_t t = is_bf16(p) ? CUDA_R_16BF : CUDA_R_32F;
    cublasComputeType_t ct = p == P_TF32 ? CUBLAS_COMPUTE_32F_FAST_TF32 : CUBLAS_COMPUTE_32F;
    const int nt = p == P_BF16_NT || p == P_BF16_NT_NP;
    st = cublasGemmEx(h, nt ? CUBLAS_OP_T : CUBLAS_OP_N, CUBLAS_OP_N, n, n, n, &one, b->b[s], t, n,
                      b->a[s], t, n, &zero, b->c[s], CUDA_R_32F, n, ct, CUBLAS_GEMM_DEFAULT);
  }
  return st == CUBLAS_STATUS_SUCCESS ? 0 : -EIO;
}

/* One batch of n calls of ours (or cuBLAS's) from set *s on, timed with events: seconds. */
static double time_batch(int (*ours)(prec_t, const bufs_t *, int),
                         int (*theirs)(cublasHandle_t, prec_t, const bufs_t *, int),
                         cublasHandle_t h, prec_t p, const bufs_t *b, int n, int *s, cudaEvent_t e0,
                         cudaEvent_t e1) {
  CK(cudaEventRecord(e0, NULL));
  for (int i = 0; i < n; i++, *s = (*s + 1) % b->sets) {
    int rc = ours ? ours(p, b, *s) : theirs(h, p, b, *s);
    if (rc) {
      fprintf(stderr, "wl-bench-gemm-cuda: %s %s gemm failed (%d, CUDA error %d)\n",
              ours ? "our" : "cuBLAS", prec_name[p], rc, wl_cuda_last_error());
      exit(1);
    }
  }
  CK(cudaEventRecord(e1, NULL));
  CK(cudaEventSynchronize(e1));
  float ms = 0;
  CK(cudaEventElapsedTime(&ms, e0, e1));
  return ms * 1e-3;
}

/* Seconds per call of ours and of cuBLAS: the best of batches (of at least 20 ms) taken in turn,
 * for at least min_time each. In turn, not one after the other: timed second, one side always
 * ran on a device already hot and clocked down by the first (a helper's review of the H200 run
 * found ours always second). Each side's first batch is warm-up. */
static void time_pair(int (*ours)(prec_t, const bufs_t *, int),
                      int (*theirs)(cublasHandle_t, prec_t, const bufs_t *, int), cublasHandle_t h,
                      prec_t p, const bufs_t *b, double min_time, double *ours_s,
                      double *theirs_s) {
  cudaEvent_t e0, e1;
  CK(cudaEventCreate(&e0));
  CK(cudaEventCreate(&e1));
  double best[2] = {INFINITY, INFINITY}, total[2] = {0, 0};
  int batch[2] = {1, 1}, s = 0;
  for (int rep = 0; rep < 2000 && (rep < 8 || total[0] < min_time || total[1] < min_time); rep++) {
    int k = rep & 1; /* 0: ours, 1: cuBLAS */
    double t = time_batch(k ? NULL : ours, k ? theirs : NULL, h, p, b, batch[k], &s, e0, e1);
    total[k] += t;
    if (rep > 1 && t / batch[k] < best[k]) best[k] = t / batch[k]; /* reps 0 and 1: warm-up */
    if (t < 0.02 && batch[k] < 1024) batch[k] *= 2;
  }
  cudaEventDestroy(e0);
  cudaEventDestroy(e1);
  *ours_s = best[0];
  *theirs_s = best[1];
}

static double max_rel_diff(const bufs_t *b, cublasHandle_t h, prec_t p) {
  size_t nn = (size_t)b->n * b->n;
  float *x = malloc(nn * 4), *y = malloc(nn * 4);
  if (!x || !y) exit(1);
  if (run_ours(p, b, 0) || run_cublas(h, p, b, 0) != 0) exit(1);
  CK(cudaDeviceSynchronize());
  /* Both write the same C: NaN (0xff bytes) before each, so a side that leaves C unwritten
   * cannot compare its predecessor's result with itself. */
  CK(cudaMemset(b->c[0], 0xff, nn * 4));
  if (run_ours(p, b, 0)) exit(1);
  CK(cudaMemcpy(x, b->c[0], nn * 4, cudaMemcpyDeviceToHost));
  CK(cudaMemset(b->c[0], 0xff, nn * 4));
  if (run_cublas(h, p, b, 0)) exit(1);
  CK(cudaMemcpy(y, b->c[0], nn * 4, cudaMemcpyDeviceToHost));
  double d = 0, m = 0;
  int nan = 0; /* a NaN or infinity on either side: the maxima below would skip it */
  for (size_t i = 0; i < nn; i++) {
    double e = fabs((double)x[i] - y[i]);
    nan |= !isfinite(e);
    d = e > d ? e : d;
    m = fabs(y[i]) > m ? fabs(y[i]) : m;
  }
  free(x), free(y);
  return nan ? NAN : m > 0 ? d / m : d;
}

static void usage(FILE *f) {
  fprintf(f, "usage: wl-bench-gemm-cuda [--json] [--sizes N,N,...]\n"
             "                          [--prec fp32,tf32,bf16,bf16nt,bf16_nonpersistent,\n"
             "                                  bf16nt_nonpersistent] [--min-time S]\n"
             "  Square row-major GEMMs on device 0 (A B; bf16nt A B^T), ours against cuBLAS.\n"
             "  bf16 and bf16nt run the library's schedule; the _nonpersistent rows force the\n"
             "  wgmma kernel's one block per tile (by default only where wgmma runs). Sizes\n"
             "  default to 1024,4096,8192; each measurement runs for at least S seconds\n"
             "  (default 1).\n");
}

int main(int argc, char **argv) {
  int json = 0, sizes[MAX_SIZES] = {1024, 4096, 8192}, nsizes = 3;
  int want[P_COUNT] = {1, 1, 1, 1, -1, -1}; /* -1: where the device runs the wgmma kernel */
  double min_time = 1.0;
  for (int i = 1; i < argc; i++) {
    const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
    if (!strcmp(a, "--json")) {
      json = 1;
    } else if (!strcmp(a, "--sizes") && v) {
      nsizes = 0;
      for (const char *s = v; *s;) {
        char *end;
        long n = strtol(s, &end, 10);
        if (end == s || n < 16 || n > 32768 || nsizes == MAX_SIZES || (*end && *end != ',')) {
          fprintf(stderr, "wl-bench-gemm-cuda: bad --sizes '%s' (16..32768, comma-separated)\n", v);
          return 2;
        }
        sizes[nsizes++] = (int)n;
        s = *end ? end + 1 : end;
      }
      i++;
    } else if (!strcmp(a, "--prec") && v) {
      memset(want, 0, sizeof want);
      char buf[256];
      snprintf(buf, sizeof buf, "%s", v);
      for (char *tok = strtok(buf, ","); tok; tok = strtok(NULL, ",")) {
        int found = 0;
        for (int p = 0; p < P_COUNT; p++)
          if (!strcmp(tok, prec_name[p])) want[p] = found = 1;
        if (!found) {
          fprintf(stderr,
                  "wl-bench-gemm-cuda: bad --prec '%s' (fp32, tf32, bf16, bf16nt, "
                  "bf16_nonpersistent, bf16nt_nonpersistent)\n",
                  tok);
          return 2;
        }
      }
      i++;
    } else if (!strcmp(a, "--min-time") && v) {
      char *end;
      min_time = strtod(v, &end);
      if (*end || !(min_time >= 0 && min_time <= 60)) {
        fprintf(stderr, "wl-bench-gemm-cuda: bad --min-time '%s' (0..60 seconds)\n", v);
        return 2;
      }
      i++;
    } else if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
      usage(stdout);
      return 0;
    } else {
      fprintf(stderr, "wl-bench-gemm-cuda: unknown or incomplete argument '%s'\n", a);
      usage(stderr);
      return 2;
    }
  }
  if (wl_cuda_available() != 0) {
    fprintf(stderr, "wl-bench-gemm-cuda: no usable CUDA device (CUDA error %d): skipped\n",
            wl_cuda_last_error());
    return 77;
  }
  struct cudaDeviceProp prop;
  CK(cudaGetDeviceProperties(&prop, 0));
  const int wgmma = !strcmp(wl_cuda_gemm_bf16_kernel(), "wgmma");
  for (int p = 0; p < P_COUNT; p++)
    if (want[p] < 0) want[p] = wgmma;
  cublasHandle_t h;
  if (cublasCreate(&h) != CUBLAS_STATUS_SUCCESS) {
    fprintf(stderr, "wl-bench-gemm-cuda: cublasCreate failed\n");
    return 1;
  }

  result_t res[MAX_SIZES * P_COUNT];
  int nres = 0;
  for (int si = 0; si < nsizes; si++)
    for (int p = 0; p < P_COUNT; p++) {
      if (!want[p]) continue;
      bufs_t b = {sizes[si], 1, {0}, {0}, {0}};
      const int bf16 = is_bf16((prec_t)p);
      size_t nn = (size_t)b.n * b.n, in = bf16 ? 2 : 4;
      size_t set_bytes = nn * (2 * in + 4), l2 = (size_t)prop.l2CacheSize;
      b.sets = (int)((2 * l2 + set_bytes - 1) / set_bytes);
      if (b.sets < 1) b.sets = 1;
      if (b.sets > 16) b.sets = 16;
      for (int s = 0; s < b.sets; s++) {
        CK(cudaMalloc(&b.a[s], nn * in));
        CK(cudaMalloc(&b.b[s], nn * in));
        CK(cudaMalloc((void **)&b.c[s], nn * 4));
        upload_random(b.a[s], nn, bf16);
        upload_random(b.b[s], nn, bf16);
      }
      result_t *r = &res[nres++];
      r->size = b.n, r->prec = (prec_t)p;
      const int np = p == P_BF16_NP || p == P_BF16_NT_NP;
      if (wl_cuda_gemm_bf16_set_schedule(np ? WL_GEMM_SCHED_NONPERSISTENT : WL_GEMM_SCHED_AUTO, 0))
        exit(1);
      r->kernel = bf16          ? wl_cuda_gemm_bf16_schedule((size_t)b.n, (size_t)b.n)
                  : p == P_TF32 ? wl_cuda_sgemm_tf32_schedule((size_t)b.n, (size_t)b.n)
                                : "simt";
      double flop = 2.0 * (double)b.n * b.n * b.n;
      r->diff = max_rel_diff(&b, h, (prec_t)p);
      r->ok = r->diff <= tolerance((prec_t)p); /* NaN fails */
      if (!r->ok)
        fprintf(stderr,
                "wl-bench-gemm-cuda: %d^3 %s (%s): max rel diff %.2e from cuBLAS, over the "
                "tolerance %.0e: our GEMM is wrong\n",
                b.n, prec_name[p], r->kernel, r->diff, tolerance((prec_t)p));
      double ours_s, cublas_s;
      time_pair(run_ours, run_cublas, h, (prec_t)p, &b, min_time, &ours_s, &cublas_s);
      r->cublas = flop / cublas_s * 1e-12;
      r->ours = flop / ours_s * 1e-12;
      if (!json)
        fprintf(stderr, "  %5d^3 %s (%s): ours %.1f, cuBLAS %.1f TFLOP/s\n", b.n, prec_name[p],
                r->kernel, r->ours, r->cublas);
      for (int s = 0; s < b.sets; s++) cudaFree(b.a[s]), cudaFree(b.b[s]), cudaFree(b.c[s]);
    }
  cublasDestroy(h);
  wl_cuda_gemm_bf16_set_schedule(WL_GEMM_SCHED_AUTO, 0);
  int all_ok = 1;
  for (int i = 0; i < nres; i++) all_ok &= res[i].ok;

  if (json) {
    printf("{\"benchmark\":\"wl-bench-gemm-cuda\",\"device\":\"%s\",\"sm\":\"%d%d\","
           "\"bf16_kernel\":\"%s\",\"tf32_kernel\":\"%s\","
           "\"baseline\":\"cuBLAS\",\"targets\":{\"size\":%d,\"fp32_ratio_min\":%.2f,"
           "\"bf16_ratio_min\":%.2f},\"results\":[",
           prop.name, prop.major, prop.minor, wl_cuda_gemm_bf16_kernel(),
           wl_cuda_sgemm_tf32_kernel(), TARGET_SIZE, prec_target[P_FP32], prec_target[P_BF16]);
    char dbuf[32];
    for (int i = 0; i < nres; i++)
      printf("%s{\"m\":%d,\"n\":%d,\"k\":%d,\"precision\":\"%s\",\"kernel\":\"%s\","
             "\"tflops\":%.2f,\"cublas_tflops\":%.2f,\"ratio_vs_cublas\":%.3f,"
             "\"max_rel_diff\":%s,\"max_rel_diff_max\":%.0e,\"ok\":%s}",
             i ? "," : "", res[i].size, res[i].size, res[i].size, prec_name[res[i].prec],
             res[i].kernel, res[i].ours, res[i].cublas, res[i].ours / res[i].cublas,
             jnum(dbuf, sizeof dbuf, res[i].diff), tolerance(res[i].prec),
             res[i].ok ? "true" : "false");
    printf("],\"ok\":%s}\n", all_ok ? "true" : "false");
  } else {
    printf("wl-bench-gemm-cuda: %s (sm_%d%d), row-major A B (bf16nt: A B^T), bf16 kernel %s, "
           "tf32 kernel %s, baseline cuBLAS\n",
           prop.name, prop.major, prop.minor, wl_cuda_gemm_bf16_kernel(),
           wl_cuda_sgemm_tf32_kernel());
    printf("%6s %20s %16s %12s %14s %8s %12s %6s %8s\n", "size", "prec", "kernel", "ours TFLOP/s",
           "cuBLAS TFLOP/s", "ratio", "max rel diff", "result", "target");
    for (int i = 0; i < nres; i++) {
      double tgt = res[i].size == TARGET_SIZE ? prec_target[res[i].prec] : 0.0;
      char t[16] = "-";
      if (tgt > 0)
        snprintf(t, sizeof t, "%s %.2f", res[i].ours / res[i].cublas >= tgt ? ">=" : "<", tgt);
      printf("%6d %20s %16s %12.1f %14.1f %8.3f %12.1e %6s %8s\n", res[i].size,
             prec_name[res[i].prec], res[i].kernel, res[i].ours, res[i].cublas,
             res[i].ours / res[i].cublas, res[i].diff, res[i].ok ? "ok" : "WRONG", t);
    }
    if (!all_ok)
      printf("error: results over the tolerance (fp32 1e-4, tf32 and bf16 1e-3 max rel diff)\n");
    printf("targets (issue 6): bf16 >= 0.90 and fp32 >= 0.80 of cuBLAS at %d^3\n", TARGET_SIZE);
  }
  return all_ok ? 0 : 1;
}
