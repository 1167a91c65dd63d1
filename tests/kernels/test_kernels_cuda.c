/* Tests of the CUDA kernels against the CPU ones and the double-precision loops (label gpu):
 * skipped (exit 77) where no device can be used. */
#include <cuda_runtime_api.h>
#include <errno.h>
#include <float.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ref.h"
#include "wltest.h"

/* Under the host emulation (tests/kernels/emu) every block barrier costs a round of context
 * switches: fewer and smaller cases there, the same code paths. */
#if defined(WL_CUDA_EMU)
#define SCALE(gpu, emu) (emu)
#else
#define SCALE(gpu, emu) (gpu)
#endif

/* ------------------------------------------------------------------------------------------------
 * Device memory helpers: every failure is an assertion, not a crash
 * ----------------------------------------------------------------------------------------------*/

static void *dev_alloc(size_t bytes) {
  void *p = NULL;
  cudaError_t e = cudaMalloc(&p, bytes ? bytes : 4);
  CU_ASSERT_EQUAL_FATAL(e, cudaSuccess);
  return p;
}

static void *dev_from(const void *host, size_t bytes) {
  void *p = dev_alloc(bytes);
  CU_ASSERT_EQUAL_FATAL(cudaMemcpy(p, host, bytes, cudaMemcpyHostToDevice), cudaSuccess);
  return p;
}

static void to_host(void *host, const void *dev, size_t bytes) {
  CU_ASSERT_EQUAL_FATAL(cudaDeviceSynchronize(), cudaSuccess);
  CU_ASSERT_EQUAL_FATAL(cudaMemcpy(host, dev, bytes, cudaMemcpyDeviceToHost), cudaSuccess);
}

/* max |got - want| / (atol + rtol |want|) against a float reference. */
static double err_f(const float *got, const float *want, size_t n, double atol, double rtol) {
  double worst = 0;
  for (size_t i = 0; i < n; i++) {
    double e = fabs((double)got[i] - want[i]) / (atol + rtol * fabs((double)want[i]));
    if (!(e <= worst) && !isnan(worst)) worst = e; /* a NaN stays the worst */
  }
  return worst;
}

/* ------------------------------------------------------------------------------------------------
 * GEMM
 * ----------------------------------------------------------------------------------------------*/

/* fp32 to bf16 bits, round to nearest even (finite inputs), as the device converts. */
static uint16_t host_bf16(float f) {
  uint32_t u;
  memcpy(&u, &f, 4);
  u += 0x7fffu + ((u >> 16) & 1u);
  return (uint16_t)(u >> 16);
}

static float bf16_float(uint16_t h) {
  uint32_t u = (uint32_t)h << 16;
  float f;
  memcpy(&f, &u, 4);
  return f;
}

typedef enum { PREC_FP32, PREC_TF32, PREC_BF16 } prec_t;

/* gemm_case's pad that makes lda and ldb the next multiples of 8 (and ldc = n): bf16 operands
 * that TMA can describe, so that an sm_90 device runs the wgmma kernel on them. */
#define LD_ROUND8 ((size_t)-1)

static size_t round8(size_t x) {
  return (x + 7) / 8 * 8;
}

/* One GEMM on the device against the double loop; the error in units of the precision's
 * rounding bound (<= 1 passes). */
static double gemm_case(prec_t prec, wl_trans_t ta, wl_trans_t tb, size_t m, size_t n, size_t k,
                        float alpha, float beta, size_t pad) {
  size_t arows = ta == WL_TRANS ? k : m, acols = ta == WL_TRANS ? m : k;
  size_t brows = tb == WL_TRANS ? n : k, bcols = tb == WL_TRANS ? k : n;
  size_t lda = acols + pad, ldb = bcols + pad, ldc = n + pad;
  if (pad == LD_ROUND8) lda = round8(acols), ldb = round8(bcols), ldc = n;
  size_t na = arows * lda, nb = brows * ldb, nc = m * ldc;
  float *a = ref_alloc(na), *b = ref_alloc(nb), *c = ref_alloc(nc), *c0 = ref_alloc(nc);
  double *want = ref_dalloc(m * n), *absum = ref_dalloc(m * n);
  ref_fill(a, na, -1, 1), ref_fill(b, nb, -1, 1), ref_fill(c0, nc, -1, 1);
  uint16_t *ah = NULL, *bh = NULL;
  if (prec == PREC_BF16) { /* the reference multiplies the rounded inputs */
    ah = malloc(na * 2), bh = malloc(nb * 2);
    for (size_t i = 0; i < na; i++) ah[i] = host_bf16(a[i]), a[i] = bf16_float(ah[i]);
    for (size_t i = 0; i < nb; i++) bh[i] = host_bf16(b[i]), b[i] = bf16_float(bh[i]);
  }
  if (beta == 0.0f)
    for (size_t i = 0; i < nc; i++) c0[i] = NAN;
  ref_gemm(ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, c0, ldc, want, absum);
  float *dc = dev_from(c0, nc * 4);
  int rc;
  if (prec == PREC_BF16) {
    uint16_t *da = dev_from(ah, na * 2), *db = dev_from(bh, nb * 2);
    rc = wl_cuda_gemm_bf16(ta, tb, m, n, k, alpha, da, lda, db, ldb, beta, dc, ldc, NULL);
    to_host(c, dc, nc * 4);
    cudaFree(da), cudaFree(db);
  } else {
    float *da = dev_from(a, na * 4), *db = dev_from(b, nb * 4);
    rc = wl_cuda_sgemm(ta, tb, m, n, k, alpha, da, lda, db, ldb, beta, dc, ldc,
                       prec == PREC_TF32 ? WL_MATH_TF32 : WL_MATH_FP32, NULL);
    to_host(c, dc, nc * 4);
    cudaFree(da), cudaFree(db);
  }
  cudaFree(dc);
  /* TF32 keeps 10 mantissa bits of each input: a product is off by up to about 2^-10. */
  double unit = prec == PREC_TF32 ? 2.0 * ldexp(1.0, -10) : 2.0 * (double)(k + 2) * FLT_EPSILON;
  double worst = rc == 0 ? 0.0 : 1e30;
  for (size_t i = 0; i < m; i++)
    for (size_t j = 0; j < n; j++) {
      double e = fabs(c[i * ldc + j] - want[i * n + j]) / (unit * absum[i * n + j] + 1e-30);
      if (!(e <= worst) && !isnan(worst)) worst = e; /* a NaN stays the worst */
    }
  free(a), free(b), free(c), free(c0), free(want), free(absum), free(ah), free(bh);
  return worst;
}

static size_t odd_size(int max) {
  static const size_t edges[] = {1, 3, 4, 7, 8, 9, 16, 31, 63, 64, 65, 127, 128, 129, 255};
  if (ref_u32() % 2) {
    size_t e = edges[ref_u32() % (sizeof edges / sizeof *edges)];
    if ((int)e <= max) return e;
  }
  return (size_t)ref_int(1, max);
}

static void gemm_random(prec_t prec, const char *name) {
  int bad = 0;
  for (int it = 0; it < SCALE(48, 16); it++) {
    wl_trans_t ta = (wl_trans_t)(it & 1), tb = (wl_trans_t)((it >> 1) & 1);
    size_t m = odd_size(SCALE(300, 260)), n = odd_size(SCALE(300, 260)), k = odd_size(300);
    float alpha = ref_uniform(-2, 2);
    float beta = it % 3 == 0 ? 0.0f : it % 3 == 1 ? 1.0f : ref_uniform(-2, 2);
    size_t pad = (size_t)(it % 4 == 0 ? 0 : ref_int(1, 9)); /* pad 0: aligned, 16-byte loads */
    double e = gemm_case(prec, ta, tb, m, n, k, alpha, beta, pad);
    if (!(e <= 1.0) && bad++ < 5)
      fprintf(stderr, "%s %c%c m=%zu n=%zu k=%zu alpha=%g beta=%g pad=%zu: err %g\n", name,
              ta ? 'T' : 'N', tb ? 'T' : 'N', m, n, k, alpha, beta, pad, e);
  }
  CU_ASSERT_EQUAL(bad, 0);
}

static void test_sgemm_fp32(void) {
  gemm_random(PREC_FP32, "sgemm");
}
/* Every fp32 tile shape the launcher picks: narrow C (128 x 16/32/64, rows enough to fill the
 * device), and the split-K of a small C over a long K (32 x 32 tiles for M <= 32, else 64 x 64;
 * beta = 0 and a dense C, else no split). */
static void test_sgemm_tiles(void) {
  const size_t rows = SCALE(132 * 128 + 5, 6 * 128 + 5);
  const struct {
    size_t m, n, k, pad;
    float beta;
  } cases[] = {
      {rows, 1, 9, 0, 0.0f},   {rows, 5, 33, 1, 0.5f},  {rows, 16, 17, 0, 1.0f},
      {rows, 17, 40, 3, 0.0f}, {rows, 32, 8, 0, 0.0f},  {rows, 33, 25, 0, -1.0f},
      {rows, 64, 31, 2, 0.0f}, {rows, 65, 16, 0, 0.0f}, {16, 9, 5000, 0, 0.0f},
      {1, 1, 4096, 0, 0.0f},   {31, 70, 4100, 0, 0.0f}, {32, 25, 9001, 0, 0.0f},
      {33, 20, 8200, 0, 0.0f}, {20, 9, 5000, 0, 1.0f},  {20, 9, 5000, 3, 0.0f},
  };
  int bad = 0;
  for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
    wl_trans_t ta = (wl_trans_t)(i & 1), tb = (wl_trans_t)((i >> 1) & 1);
    double e = gemm_case(PREC_FP32, ta, tb, cases[i].m, cases[i].n, cases[i].k, 1.5f, cases[i].beta,
                         cases[i].pad);
    if (!(e <= 1.0) && bad++ < 5)
      fprintf(stderr, "sgemm tiles %c%c m=%zu n=%zu k=%zu beta=%g pad=%zu: err %g\n",
              ta ? 'T' : 'N', tb ? 'T' : 'N', cases[i].m, cases[i].n, cases[i].k, cases[i].beta,
              cases[i].pad, e);
  }
  CU_ASSERT_EQUAL(bad, 0);
}
/* TF32 on mma.sync (wgmma switched off: it is tested below), every transposition and padding. */
static void test_sgemm_tf32(void) {
  CU_ASSERT_EQUAL_FATAL(wl_cuda_sgemm_tf32_set_wgmma(0), 0);
  CU_ASSERT_STRING_NOT_EQUAL(wl_cuda_sgemm_tf32_kernel(), "wgmma");
  gemm_random(PREC_TF32, "tf32");
  CU_ASSERT_EQUAL(wl_cuda_sgemm_tf32_set_wgmma(1), 0);
}
static void test_gemm_bf16(void) {
  gemm_random(PREC_BF16, "bf16");
}

/* bf16 with leading dimensions TMA accepts (the wgmma kernel on sm_90 and in the host emulation,
 * mma.sync elsewhere): every transposition on sizes below, at and past the 128 x 128 / 128 x 256
 * tiles and the 64-wide k-tiles, K long enough to cycle the 4-stage pipeline several times, and
 * enough tiles for the 128 x 256 variant; odd n gives an odd ldc (the epilogue's single stores). */
static int sm90_device(void) {
  struct cudaDeviceProp prop;
  return cudaGetDeviceProperties(&prop, 0) == cudaSuccess && prop.major == 9 && prop.minor == 0;
}

/* Both tile schedules of the wgmma kernel (one block per tile, persistent: the emulation's 4 SMs
 * or the device's, so the last shape walks several tiles per block), on every shape. */
static void test_gemm_bf16_tma(void) {
  /* On compute capability 9.0 the library (built for sm_90a by default) must take the wgmma
   * kernel here: a silent fallback to mma.sync would pass these cases without testing it. */
  if (sm90_device()) CU_ASSERT_STRING_EQUAL(wl_cuda_gemm_bf16_kernel(), "wgmma");
  static const size_t shapes[][3] = {
      {1, 1, 1},       {7, 9, 13},
      {64, 128, 64},   {65, 127, 65},
      {129, 255, 257}, {200, 136, 1000},
      {128, 256, 16},  {3, 300, 40},
      {300, 5, 70},    {SCALE(2200, 400), SCALE(2400, 520), SCALE(200, 72)}};
  const size_t nshapes = sizeof shapes / sizeof *shapes;
  static const wl_gemm_sched_t scheds[] = {WL_GEMM_SCHED_NONPERSISTENT, WL_GEMM_SCHED_PERSISTENT};
  int bad = 0;
  for (int sc = 0; sc < 2; sc++) {
    CU_ASSERT_EQUAL_FATAL(wl_cuda_gemm_bf16_set_schedule(scheds[sc], 0), 0);
    for (size_t i = 0; i < nshapes; i++)
      for (int t = 0; t < 4; t++) {
        wl_trans_t ta = (wl_trans_t)(t & 1), tb = (wl_trans_t)(t >> 1);
        float alpha = i % 2 ? 1.0f : ref_uniform(-2, 2);
        float beta = i % 3 == 0 ? 0.0f : i % 3 == 1 ? 1.0f : ref_uniform(-2, 2);
        double e = gemm_case(PREC_BF16, ta, tb, shapes[i][0], shapes[i][1], shapes[i][2], alpha,
                             beta, LD_ROUND8);
        if (!(e <= 1.0) && bad++ < 8)
          fprintf(stderr, "bf16 tma %s %c%c m=%zu n=%zu k=%zu alpha=%g beta=%g: err %g\n",
                  sc ? "persistent" : "nonpersistent", ta ? 'T' : 'N', tb ? 'T' : 'N', shapes[i][0],
                  shapes[i][1], shapes[i][2], alpha, beta, e);
      }
  }
  wl_cuda_gemm_bf16_set_schedule(WL_GEMM_SCHED_AUTO, 0);
  CU_ASSERT_EQUAL(bad, 0);
}

/* The persistent schedule with a grid capped at 1 to 5 blocks (on a GPU too), so that each block
 * walks many tiles: ragged last tile rows and columns, both tile widths (128 x 256 once there are
 * 6 wide tiles in the emulation, 132 on a GPU, else 128 x 128), and K of 1 to 8 k-tiles, so that
 * the 4-stage pipeline crosses from one tile into the next with stages in flight at every stage
 * index and phase (3 or 6 k-tiles a tile: a tile starts on another stage each time). */
static void test_gemm_bf16_persistent(void) {
  static const struct {
    size_t m, n, k;
    int blocks;
  } cases[] = {
      /* (tiles as the emulation makes them; on a GPU all are 128 x 128) */
      {300, 250, 136, 1},  /* 3 x 2 tiles of 128 x 128, 3 k-tiles: one block walks all 6 */
      {300, 520, 40, 2},   /* 3 x 3 tiles of 128 x 256, 1 k-tile: each stage a tile of its own */
      {257, 777, 200, 3},  /* 3 x 4 tiles of 128 x 256, 4 k-tiles */
      {129, 1030, 330, 4}, /* 2 x 5 tiles of 128 x 256, 6 k-tiles: blocks walk 2 or 3 tiles */
      {520, 130, 72, 3},   /* 5 x 2 tiles of 128 x 128, 2 k-tiles */
      {64, 64, 500, 1},    /* one tile, 8 k-tiles: the pipeline alone */
  };
  int bad = 0;
  for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
    CU_ASSERT_EQUAL_FATAL(wl_cuda_gemm_bf16_set_schedule(WL_GEMM_SCHED_PERSISTENT, cases[i].blocks),
                          0);
    for (int t = 0; t < 4; t++) {
      wl_trans_t ta = (wl_trans_t)(t & 1), tb = (wl_trans_t)(t >> 1);
      float alpha = t % 2 ? 1.0f : ref_uniform(-2, 2);
      float beta = (i + t) % 3 == 0 ? 0.0f : (i + t) % 3 == 1 ? 1.0f : ref_uniform(-2, 2);
      double e =
          gemm_case(PREC_BF16, ta, tb, cases[i].m, cases[i].n, cases[i].k, alpha, beta, LD_ROUND8);
      if (!(e <= 1.0) && bad++ < 8)
        fprintf(stderr, "bf16 persistent (%d blocks) %c%c m=%zu n=%zu k=%zu beta=%g: err %g\n",
                cases[i].blocks, ta ? 'T' : 'N', tb ? 'T' : 'N', cases[i].m, cases[i].n, cases[i].k,
                beta, e);
    }
  }
  wl_cuda_gemm_bf16_set_schedule(WL_GEMM_SCHED_AUTO, 0);
  CU_ASSERT_EQUAL(bad, 0);
}

/* wgmma issued for TF32 so far (the emulation counts them; 0 on a GPU, where the kernel name is
 * the check). */
static unsigned long long tf32_wgmma_issued(void) {
#if defined(WL_CUDA_EMU)
  return wl__emu_wgmma_issued(1);
#else
  return 0;
#endif
}

/* TF32 with wgmma (sm_90 and the host emulation): operands rounded into K-major scratch copies,
 * so every transposition and any leading dimension (pad 0, 1 or 3: lda not a multiple of 4) takes
 * it; sizes below, at and past the 128 x 128 / 128 x 256 tiles and the 32-wide k-tiles, K long
 * enough to cycle the 4 stages; both schedules, and the persistent grid capped at 1 to 3 blocks
 * so that blocks walk several tiles with the pipeline running on across them. */
static void test_sgemm_tf32_wgmma(void) {
  CU_ASSERT_EQUAL(wl_cuda_sgemm_tf32_set_wgmma(2), -EINVAL);
#if defined(WL_CUDA_EMU)
  const int want_wgmma = 1;
#else
  const int want_wgmma = sm90_device();
#endif
  /* a silent fallback to mma.sync would pass these cases without testing wgmma */
  if (want_wgmma) CU_ASSERT_STRING_EQUAL(wl_cuda_sgemm_tf32_kernel(), "wgmma");
  static const size_t shapes[][3] = {
      {1, 1, 1},       {7, 9, 13},
      {64, 128, 32},   {65, 127, 33},
      {129, 255, 257}, {200, 136, 600},
      {128, 256, 16},  {3, 300, 40},
      {300, 5, 70},    {SCALE(2200, 400), SCALE(2400, 520), SCALE(200, 72)}};
  const size_t nshapes = sizeof shapes / sizeof *shapes;
  static const wl_gemm_sched_t scheds[] = {WL_GEMM_SCHED_NONPERSISTENT, WL_GEMM_SCHED_PERSISTENT};
  int bad = 0;
  for (int sc = 0; sc < 3; sc++) {
    /* sc 2: persistent on 1 to 3 blocks (each walks several tiles) */
    for (size_t i = 0; i < nshapes; i++) {
      CU_ASSERT_EQUAL_FATAL(
          wl_cuda_gemm_bf16_set_schedule(scheds[sc ? 1 : 0], sc == 2 ? 1 + (int)(i % 3) : 0), 0);
      for (int t = 0; t < 4; t++) {
        /* the layouts are the copy's, not the schedule's: one a shape when capped (time) */
        if (sc == 2 && t != (int)(i % 4)) continue;
        wl_trans_t ta = (wl_trans_t)(t & 1), tb = (wl_trans_t)(t >> 1);
        float alpha = i % 2 ? 1.0f : ref_uniform(-2, 2);
        float beta = (i + t) % 3 == 0 ? 0.0f : (i + t) % 3 == 1 ? 1.0f : ref_uniform(-2, 2);
        size_t pad = (size_t)((i + t + sc) % 3 == 0 ? 0 : (i + t + sc) % 3 == 1 ? 1 : 3);
        const unsigned long long before = tf32_wgmma_issued();
        double e = gemm_case(PREC_TF32, ta, tb, shapes[i][0], shapes[i][1], shapes[i][2], alpha,
                             beta, pad);
#if defined(WL_CUDA_EMU)
        if (tf32_wgmma_issued() == before) e = 1e30; /* not the wgmma kernel */
#else
        (void)before;
#endif
        if (!(e <= 1.0) && bad++ < 8)
          fprintf(stderr, "tf32 wgmma %s %c%c m=%zu n=%zu k=%zu alpha=%g beta=%g pad=%zu: err %g\n",
                  sc == 0   ? "nonpersistent"
                  : sc == 1 ? "persistent"
                            : "persistent capped",
                  ta ? 'T' : 'N', tb ? 'T' : 'N', shapes[i][0], shapes[i][1], shapes[i][2], alpha,
                  beta, pad, e);
      }
    }
  }
  wl_cuda_gemm_bf16_set_schedule(WL_GEMM_SCHED_AUTO, 0);
  CU_ASSERT_EQUAL(bad, 0);
#if defined(WL_CUDA_EMU)
  wl__emu_set_sm_count(2);
  CU_ASSERT_STRING_EQUAL(wl_cuda_sgemm_tf32_schedule(128, 256), "wgmma");
  CU_ASSERT_STRING_EQUAL(wl_cuda_sgemm_tf32_schedule(129, 256), "wgmma persistent");
  wl__emu_set_sm_count(0);
#else
  if (want_wgmma)
    CU_ASSERT_STRING_EQUAL(wl_cuda_sgemm_tf32_schedule(8192, 8192), "wgmma persistent");
#endif
  CU_ASSERT_EQUAL(wl_cuda_sgemm_tf32_set_wgmma(0), 0);
  CU_ASSERT_STRING_NOT_EQUAL(wl_cuda_sgemm_tf32_schedule(8192, 8192), "wgmma");
  CU_ASSERT_EQUAL(wl_cuda_sgemm_tf32_set_wgmma(1), 0);
}

/* The automatic choice: persistent when there are more tiles than SMs (the emulation's SM count
 * set to 2, so a few tiles are more); the setter's bad arguments. */
static void test_gemm_bf16_schedule(void) {
  CU_ASSERT_EQUAL(wl_cuda_gemm_bf16_set_schedule((wl_gemm_sched_t)3, 0), -EINVAL);
  CU_ASSERT_EQUAL(wl_cuda_gemm_bf16_set_schedule(WL_GEMM_SCHED_AUTO, -1), -EINVAL);
  CU_ASSERT_EQUAL(wl_cuda_gemm_bf16_set_schedule(WL_GEMM_SCHED_AUTO, 0), 0);
#if defined(WL_CUDA_EMU)
  wl__emu_set_sm_count(2);
  CU_ASSERT_STRING_EQUAL(wl_cuda_gemm_bf16_schedule(128, 256), "wgmma");            /* 2 tiles */
  CU_ASSERT_STRING_EQUAL(wl_cuda_gemm_bf16_schedule(129, 256), "wgmma persistent"); /* 4 */
  /* 3 x 3 tiles on 2 blocks: one walks 5, the other 4 */
  CU_ASSERT(gemm_case(PREC_BF16, WL_NOTRANS, WL_TRANS, 300, 300, 200, 0.5f, 1.0f, LD_ROUND8) <=
            1.0);
  wl__emu_set_sm_count(0);
  CU_ASSERT_STRING_EQUAL(wl_cuda_gemm_bf16_schedule(129, 256), "wgmma"); /* 4 tiles, 4 SMs */
#else
  if (sm90_device()) {
    CU_ASSERT_STRING_EQUAL(wl_cuda_gemm_bf16_schedule(8192, 8192), "wgmma persistent");
    CU_ASSERT_STRING_EQUAL(wl_cuda_gemm_bf16_schedule(1024, 1024), "wgmma");
  }
#endif
  CU_ASSERT_EQUAL(wl_cuda_gemm_bf16_set_schedule(WL_GEMM_SCHED_NONPERSISTENT, 0), 0);
  if (sm90_device()) CU_ASSERT_STRING_EQUAL(wl_cuda_gemm_bf16_schedule(8192, 8192), "wgmma");
  CU_ASSERT_EQUAL(wl_cuda_gemm_bf16_set_schedule(WL_GEMM_SCHED_AUTO, 0), 0);
}

/* The wgmma kernel after a device reset: its raised shared-memory limit went with the old
 * context, and the library must raise it again (it cached that it had). Last of the suite: the
 * reset frees every allocation. */
static void test_gemm_bf16_after_reset(void) {
  CU_ASSERT(gemm_case(PREC_BF16, WL_NOTRANS, WL_NOTRANS, 129, 255, 257, 1.0f, 0.0f, LD_ROUND8) <=
            1.0);
  CU_ASSERT_EQUAL_FATAL(cudaDeviceReset(), cudaSuccess);
  CU_ASSERT(gemm_case(PREC_BF16, WL_NOTRANS, WL_NOTRANS, 129, 255, 257, 1.0f, 0.0f, LD_ROUND8) <=
            1.0);
  CU_ASSERT(gemm_case(PREC_BF16, WL_TRANS, WL_NOTRANS, 300, 136, 70, 0.5f, 1.0f, LD_ROUND8) <= 1.0);
}

/* 128x128 tiles (enough of them to fill the device) and split-K (few tiles, long K). */
static void test_gemm_big(void) {
  static const size_t shapes[][3] = {{SCALE(1536, 300), SCALE(1600, 260), 96},
                                     {64, 72, SCALE(9000, 4500)},
                                     {SCALE(1031, 257), SCALE(1100, 390), 257}};
  for (size_t i = 0; i < 3; i++)
    for (int p = 0; p < 3; p++) {
      double e = gemm_case((prec_t)p, (wl_trans_t)(i & 1), WL_NOTRANS, shapes[i][0], shapes[i][1],
                           shapes[i][2], 1.0f, 0.0f, 0);
      CU_ASSERT(e <= 1.0);
      if (!(e <= 1.0))
        fprintf(stderr, "big gemm %zux%zux%zu prec %d: err %g\n", shapes[i][0], shapes[i][1],
                shapes[i][2], p, e);
    }
}

static void test_f32_to_bf16(void) {
  size_t n = 100003;
  float *x = ref_alloc(n);
  uint16_t *y = malloc(n * 2);
  ref_fill(x, n, -1000, 1000);
  x[0] = 0.0f, x[1] = -0.0f, x[2] = 1.00390625f; /* a tie: rounds to even */
  float *dx = dev_from(x, n * 4);
  uint16_t *dy = dev_alloc(n * 2);
  CU_ASSERT_EQUAL(wl_cuda_f32_to_bf16(n, dx, dy, NULL), 0);
  to_host(y, dy, n * 2);
  size_t bad = 0;
  for (size_t i = 0; i < n; i++) bad += y[i] != host_bf16(x[i]);
  CU_ASSERT_EQUAL(bad, 0);
  cudaFree(dx), cudaFree(dy), free(x), free(y);
}

static void test_gemm_errors(void) {
  float *d = dev_alloc(64);
  CU_ASSERT_EQUAL(
      wl_cuda_sgemm(WL_NOTRANS, WL_NOTRANS, 2, 2, 2, 1, d, 1, d, 2, 0, d, 2, WL_MATH_FP32, NULL),
      -EINVAL);
  CU_ASSERT_EQUAL(
      wl_cuda_sgemm(WL_NOTRANS, WL_NOTRANS, 2, 2, 2, 1, d, 2, d, 2, 0, d, 2, (wl_math_t)9, NULL),
      -EINVAL);
  CU_ASSERT_EQUAL(wl_cuda_sgemm(WL_NOTRANS, WL_NOTRANS, 0, 2, 2, 1, NULL, 2, NULL, 2, 0, NULL, 2,
                                WL_MATH_FP32, NULL),
                  0);
  CU_ASSERT_EQUAL(wl_cuda_available(), 0);
  cudaFree(d);
}

/* ------------------------------------------------------------------------------------------------
 * Convolution and pooling
 * ----------------------------------------------------------------------------------------------*/

static double conv_case(wl_conv2d_t cv) {
  size_t nx = (size_t)cv.n * cv.h * cv.w * cv.c, nw = (size_t)cv.k * cv.r * cv.s * cv.c;
  size_t ny = (size_t)cv.n * cv.p * cv.q * cv.k, nk = (size_t)cv.k;
  float *x = ref_alloc(nx), *w = ref_alloc(nw), *b = ref_alloc(nk), *dy = ref_alloc(ny);
  float *y = ref_alloc(ny), *dx = ref_alloc(nx), *dw = ref_alloc(nw), *db = ref_alloc(nk);
  float *yc = ref_alloc(ny), *dxc = ref_alloc(nx), *dwc = ref_alloc(nw), *dbc = ref_alloc(nk);
  ref_fill(x, nx, -1, 1), ref_fill(w, nw, -1, 1), ref_fill(b, nk, -1, 1), ref_fill(dy, ny, -1, 1);
  /* The CPU kernels are checked against the naive loops in test_kernels. */
  int rc = wl_conv2d_fwd(&cv, x, w, b, yc) | wl_conv2d_bwd_data(&cv, dy, w, dxc) |
           wl_conv2d_bwd_filter(&cv, x, dy, dwc, dbc);
  float *gx = dev_from(x, nx * 4), *gw = dev_from(w, nw * 4), *gb = dev_from(b, nk * 4);
  float *gdy = dev_from(dy, ny * 4), *gy = dev_alloc(ny * 4), *gdx = dev_alloc(nx * 4);
  float *gdw = dev_alloc(nw * 4), *gdb = dev_alloc(nk * 4);
  rc |= wl_cuda_conv2d_fwd(&cv, gx, gw, gb, gy, NULL);
  rc |= wl_cuda_conv2d_bwd_data(&cv, gdy, gw, gdx, NULL);
  rc |= wl_cuda_conv2d_bwd_filter(&cv, gx, gdy, gdw, gdb, NULL);
  to_host(y, gy, ny * 4), to_host(dx, gdx, nx * 4), to_host(dw, gdw, nw * 4);
  to_host(db, gdb, nk * 4);
  double worst = rc ? 1e30 : 0.0;
  /* Sums of up to CRS, KRS and NPQ products of magnitude <= 1, in different orders. */
  double e[4] = {err_f(y, yc, ny, 1e-5 * (double)(nw / nk), 1e-5),
                 err_f(dx, dxc, nx, 1e-5 * (double)(nw / (size_t)cv.c), 1e-5),
                 err_f(dw, dwc, nw, 2e-5 * (double)(ny / nk), 1e-5),
                 err_f(db, dbc, nk, 2e-5 * (double)(ny / nk), 1e-5)};
  for (int i = 0; i < 4; i++)
    if (!(e[i] <= worst) && !isnan(worst)) worst = e[i]; /* a NaN stays the worst */
  cudaFree(gx), cudaFree(gw), cudaFree(gb), cudaFree(gdy), cudaFree(gy), cudaFree(gdx);
  cudaFree(gdw), cudaFree(gdb);
  free(x), free(w), free(b), free(dy), free(y), free(dx), free(dw), free(db);
  free(yc), free(dxc), free(dwc), free(dbc);
  return worst;
}

static void print_conv(const wl_conv2d_t *cv, double err) {
  fprintf(stderr, "conv n%d h%d w%d c%d k%d r%d s%d pad %d,%d stride %d,%d dil %d,%d: err %g\n",
          cv->n, cv->h, cv->w, cv->c, cv->k, cv->r, cv->s, cv->pad_h, cv->pad_w, cv->stride_h,
          cv->stride_w, cv->dil_h, cv->dil_w, err);
}

static void test_conv(void) {
  int bad = 0;
  for (int it = 0; it < SCALE(40, 12); it++) {
    wl_conv2d_t cv = {0};
    do {
      cv.n = ref_int(1, 3), cv.h = ref_int(1, 14), cv.w = ref_int(1, 14);
      cv.c = it % 2 ? 4 * ref_int(1, 5) : ref_int(1, 9); /* C % 4 == 0: the 16-byte gathers */
      cv.k = it % 4 < 2 ? 4 * ref_int(1, 5) : ref_int(1, 9);
      cv.r = ref_int(1, 5), cv.s = ref_int(1, 5);
      cv.pad_h = ref_int(0, 2), cv.pad_w = ref_int(0, 2);
      cv.stride_h = ref_int(1, 3), cv.stride_w = ref_int(1, 3);
      cv.dil_h = ref_int(1, 2), cv.dil_w = ref_int(1, 2);
    } while (wl_conv2d_init(&cv) != 0);
    double e = conv_case(cv);
    if (!(e <= 1.0) && bad++ < 5) print_conv(&cv, e);
  }
  CU_ASSERT_EQUAL(bad, 0);
}

/* Every pass of each shape against the CPU, within tolerance. */
static void conv_cases(const wl_conv2d_t *shapes, size_t n) {
  for (size_t i = 0; i < n; i++) {
    wl_conv2d_t cv = shapes[i];
    CU_ASSERT_EQUAL_FATAL(wl_conv2d_init(&cv), 0);
    double e = conv_case(cv);
    CU_ASSERT(e <= 1.0);
    if (!(e <= 1.0)) print_conv(&cv, e);
  }
}

/* The reference CNN's layers at a training batch: 128x128 tiles, split-K in the filter gradient. */
static void test_conv_model_shapes(void) {
  const wl_conv2d_t shapes[] = {
      {.n = 64, .h = 28, .w = 28, .c = 1, .k = 32, .r = 5, .s = 5, .pad_h = 2, .pad_w = 2},
      {.n = 64, .h = 14, .w = 14, .c = 32, .k = 64, .r = 5, .s = 5, .pad_h = 2, .pad_w = 2},
      {.n = 16,
       .h = 16,
       .w = 16,
       .c = 64,
       .k = 64,
       .r = 3,
       .s = 3,
       .pad_h = 1,
       .pad_w = 1,
       .stride_h = 2,
       .stride_w = 2},
  };
  conv_cases(shapes, sizeof shapes / sizeof *shapes);
}

/* The loaders' and launcher's special paths on shapes that reach them: stride 1 and strided
 * backward-data, C = 1 and C % 4 != 0 (scalar gathers), padding, dilation, narrow outputs
 * (128 x 16/32/64 tiles) and filter gradients with N*P*Q >= 4096 (split-K over 32 x 32 tiles
 * for K <= 32 filters, 64 x 64 above). */
static void test_conv_paths(void) {
  /* One shape a line: */
  /* clang-format off */
  const wl_conv2d_t shapes[] = {
      /* the stem: C = 1, 16 filters, 3x3, pad 1 */
      {.n = 8, .h = 24, .w = 24, .c = 1, .k = 16, .r = 3, .s = 3, .pad_h = 1, .pad_w = 1},
      /* C % 4 != 0, dilation 2 */
      {.n = 10, .h = 24, .w = 24, .c = 6, .k = 12, .r = 3, .s = 3, .pad_h = 1, .pad_w = 1,
       .dil_h = 2, .dil_w = 2},
      /* stride 2, 40 filters (64 x 64 split, 128 x 64 forward tiles) */
      {.n = 16, .h = 33, .w = 33, .c = 8, .k = 40, .r = 3, .s = 3, .pad_h = 1, .pad_w = 1,
       .stride_h = 2, .stride_w = 2},
      /* mixed strides and dilations, odd everything */
      {.n = 16, .h = 20, .w = 30, .c = 5, .k = 7, .r = 2, .s = 3, .pad_h = 0, .pad_w = 2,
       .stride_h = 2, .stride_w = 1, .dil_h = 1, .dil_w = 2},
      /* stride 1 in h only, K % 4 == 0, C % 4 == 0 (16-byte gathers) */
      {.n = 9, .h = 25, .w = 23, .c = 12, .k = 28, .r = 5, .s = 5, .pad_h = 2, .pad_w = 1,
       .stride_h = 1, .stride_w = 3},
  };
  /* clang-format on */
  conv_cases(shapes, sizeof shapes / sizeof *shapes);
}

/* A batch of none: nothing to compute, and no launch (a GPU refuses a grid of 0 blocks); the
 * filter gradient over no samples is zero, as on the CPU. */
static void test_conv_empty_batch(void) {
  wl_conv2d_t cv = {.n = 1, .h = 6, .w = 6, .c = 4, .k = 8, .r = 3, .s = 3, .pad_h = 1, .pad_w = 1};
  CU_ASSERT_EQUAL_FATAL(wl_conv2d_init(&cv), 0);
  cv.n = 0;
  size_t nx = 6 * 6 * 4, nw = 8 * 3 * 3 * 4, ny = 6 * 6 * 8;
  float *w = ref_alloc(nw), *dw = ref_alloc(nw), *db = ref_alloc(8), *dwc = ref_alloc(nw);
  float *dbc = ref_alloc(8);
  ref_fill(w, nw, -1, 1), ref_fill(dw, nw, -1, 1);
  float *gx = dev_alloc(nx * 4), *gw = dev_from(w, nw * 4), *gy = dev_alloc(ny * 4);
  float *gdw = dev_from(dw, nw * 4), *gdb = dev_from(dw, 8 * 4);
  CU_ASSERT_EQUAL(wl_conv2d_bwd_filter(&cv, w, w, dwc, dbc), 0);
  CU_ASSERT_EQUAL(wl_cuda_conv2d_fwd(&cv, gx, gw, gw, gy, NULL), 0);
  CU_ASSERT_EQUAL(wl_cuda_conv2d_bwd_data(&cv, gy, gw, gx, NULL), 0);
  CU_ASSERT_EQUAL(wl_cuda_conv2d_bwd_filter(&cv, gx, gy, gdw, gdb, NULL), 0);
  CU_ASSERT_EQUAL(cudaGetLastError(), cudaSuccess);
  to_host(dw, gdw, nw * 4), to_host(db, gdb, 8 * 4);
  CU_ASSERT_EQUAL(memcmp(dw, dwc, nw * 4), 0);
  CU_ASSERT_EQUAL(memcmp(db, dbc, 8 * 4), 0);
  /* A GEMM size within int but without the kernels' room past it (N x P x Q = 2^31 - 200) is
   * refused before any launch. */
  wl_conv2d_t big = cv;
  big.n = 1, big.h = 1, big.w = 2147483447, big.r = big.s = 1, big.pad_h = big.pad_w = 0;
  CU_ASSERT_EQUAL_FATAL(wl_conv2d_init(&big), 0);
  CU_ASSERT_EQUAL(wl_cuda_conv2d_fwd(&big, gx, gw, gw, gy, NULL), -EINVAL);
  CU_ASSERT_EQUAL(wl_cuda_conv2d_bwd_filter(&big, gx, gy, gdw, gdb, NULL), -EINVAL);
  cudaFree(gx), cudaFree(gw), cudaFree(gy), cudaFree(gdw), cudaFree(gdb);
  free(w), free(dw), free(db), free(dwc), free(dbc);
}

static void test_maxpool(void) {
  int bad = 0;
  for (int it = 0; it < SCALE(20, 8); it++) {
    wl_pool2d_t pl = {0};
    do {
      pl.n = ref_int(1, 3), pl.h = ref_int(1, 12), pl.w = ref_int(1, 12), pl.c = ref_int(1, 70);
      pl.r = ref_int(1, 3), pl.s = ref_int(1, 3);
      pl.pad_h = ref_int(0, pl.r - 1), pl.pad_w = ref_int(0, pl.s - 1);
      pl.stride_h = ref_int(0, 3), pl.stride_w = ref_int(0, 3);
    } while (wl_pool2d_init(&pl) != 0);
    size_t nx = (size_t)pl.n * pl.h * pl.w * pl.c, ny = (size_t)pl.n * pl.p * pl.q * pl.c;
    float *x = ref_alloc(nx), *dy = ref_alloc(ny), *y = ref_alloc(ny), *dx = ref_alloc(nx);
    float *yc = ref_alloc(ny), *dxc = ref_alloc(nx);
    for (size_t i = 0; i < nx; i++) x[i] = (float)(ref_u32() % 7); /* ties: the first wins */
    ref_fill(dy, ny, -1, 1);
    int rc = wl_maxpool2d_fwd(&pl, x, yc) | wl_maxpool2d_bwd(&pl, x, dy, dxc);
    float *gx = dev_from(x, nx * 4), *gdy = dev_from(dy, ny * 4), *gy = dev_alloc(ny * 4);
    float *gdx = dev_alloc(nx * 4);
    rc |= wl_cuda_maxpool2d_fwd(&pl, gx, gy, NULL) | wl_cuda_maxpool2d_bwd(&pl, gx, gdy, gdx, NULL);
    to_host(y, gy, ny * 4), to_host(dx, gdx, nx * 4);
    double e = rc ? 1e30 : 0.0;
    double e1 = err_f(y, yc, ny, 1e-30, 0), e2 = err_f(dx, dxc, nx, 1e-5, 1e-5);
    if (!(e1 <= e)) e = e1; /* NaN too */
    if (!(e2 <= e) && !isnan(e)) e = e2;
    if (!(e <= 1.0) && bad++ < 5)
      fprintf(stderr, "maxpool n%d h%d w%d c%d win %dx%d pad %d,%d stride %d,%d: err %g\n", pl.n,
              pl.h, pl.w, pl.c, pl.r, pl.s, pl.pad_h, pl.pad_w, pl.stride_h, pl.stride_w, e);
    cudaFree(gx), cudaFree(gdy), cudaFree(gy), cudaFree(gdx);
    free(x), free(dy), free(y), free(dx), free(yc), free(dxc);
  }
  CU_ASSERT_EQUAL(bad, 0);
}

static void test_avgpool_global(void) {
  size_t n = (size_t)ref_int(1, 9), hw = (size_t)ref_int(1, 64), c = (size_t)ref_int(1, 300);
  float *x = ref_alloc(n * hw * c), *dy = ref_alloc(n * c), *y = ref_alloc(n * c);
  float *dx = ref_alloc(n * hw * c), *yc = ref_alloc(n * c), *dxc = ref_alloc(n * hw * c);
  ref_fill(x, n * hw * c, -1, 1), ref_fill(dy, n * c, -1, 1);
  int rc = wl_avgpool_global_fwd(n, hw, c, x, yc) | wl_avgpool_global_bwd(n, hw, c, dy, dxc);
  float *gx = dev_from(x, n * hw * c * 4), *gdy = dev_from(dy, n * c * 4);
  float *gy = dev_alloc(n * c * 4), *gdx = dev_alloc(n * hw * c * 4);
  rc |= wl_cuda_avgpool_global_fwd(n, hw, c, gx, gy, NULL);
  rc |= wl_cuda_avgpool_global_bwd(n, hw, c, gdy, gdx, NULL);
  to_host(y, gy, n * c * 4), to_host(dx, gdx, n * hw * c * 4);
  CU_ASSERT_EQUAL(rc, 0);
  CU_ASSERT(err_f(y, yc, n * c, 1e-5, 1e-5) <= 1.0);
  CU_ASSERT(err_f(dx, dxc, n * hw * c, 1e-7, 1e-6) <= 1.0);
  cudaFree(gx), cudaFree(gdy), cudaFree(gy), cudaFree(gdx);
  free(x), free(dy), free(y), free(dx), free(yc), free(dxc);
}

/* ------------------------------------------------------------------------------------------------
 * Element-wise, softmax, optimizers, reductions
 * ----------------------------------------------------------------------------------------------*/

static void test_bias_relu_blas1(void) {
  size_t rows = (size_t)ref_int(1, 3000), cols = (size_t)ref_int(1, 300), n = rows * cols;
  float *y = ref_alloc(n), *b = ref_alloc(cols), *g = ref_alloc(n), *out = ref_alloc(n);
  float *want = ref_alloc(n), *db = ref_alloc(cols), *dbc = ref_alloc(cols);
  ref_fill(y, n, -1, 1), ref_fill(b, cols, -1, 1), ref_fill(g, n, -1, 1);
  float *gy = dev_from(y, n * 4), *gb = dev_from(b, cols * 4), *gg = dev_from(g, n * 4);
  float *gdb = dev_alloc(cols * 4), *go = dev_alloc(n * 4);

  memcpy(want, y, n * 4);
  CU_ASSERT_EQUAL(wl_bias_add(rows, cols, want, b), 0);
  CU_ASSERT_EQUAL(wl_cuda_bias_add(rows, cols, gy, gb, NULL), 0);
  to_host(out, gy, n * 4);
  CU_ASSERT(err_f(out, want, n, 1e-7, 1e-6) <= 1.0);

  CU_ASSERT_EQUAL(wl_bias_grad(rows, cols, g, dbc), 0);
  CU_ASSERT_EQUAL(wl_cuda_bias_grad(rows, cols, gg, gdb, NULL), 0);
  to_host(db, gdb, cols * 4);
  CU_ASSERT(err_f(db, dbc, cols, 1e-5 * (double)rows, 1e-5) <= 1.0);

  /* gy now holds y + b: ReLU it, then the backward pass of g through it. */
  float *relu = ref_alloc(n);
  CU_ASSERT_EQUAL(wl_relu_fwd(n, want, relu), 0);
  CU_ASSERT_EQUAL(wl_cuda_relu_fwd(n, gy, go, NULL), 0);
  to_host(out, go, n * 4);
  CU_ASSERT_EQUAL(memcmp(out, relu, n * 4), 0);
  CU_ASSERT_EQUAL(wl_relu_bwd(n, relu, g, want), 0);
  CU_ASSERT_EQUAL(wl_cuda_relu_bwd(n, go, gg, go, NULL), 0); /* in place over y */
  to_host(out, go, n * 4);
  CU_ASSERT_EQUAL(memcmp(out, want, n * 4), 0);

  /* axpy and scale on g. */
  float alpha = ref_uniform(-2, 2);
  memcpy(want, relu, n * 4);
  CU_ASSERT_EQUAL(wl_axpy(n, alpha, g, want), 0);
  CU_ASSERT_EQUAL(wl_scale(n, 0.5f, want), 0);
  float *gr = dev_from(relu, n * 4);
  CU_ASSERT_EQUAL(wl_cuda_axpy(n, alpha, gg, gr, NULL), 0);
  CU_ASSERT_EQUAL(wl_cuda_scale(n, 0.5f, gr, NULL), 0);
  to_host(out, gr, n * 4);
  CU_ASSERT(err_f(out, want, n, 1e-6, 1e-6) <= 1.0);
  cudaFree(gy), cudaFree(gb), cudaFree(gg), cudaFree(gdb), cudaFree(go), cudaFree(gr);
  free(y), free(b), free(g), free(out), free(want), free(db), free(dbc), free(relu);
}

static void test_softmax_xent(void) {
  for (int it = 0; it < 4; it++) {
    size_t n = (size_t)ref_int(1, 3000), c = (size_t)ref_int(1, 70);
    float spread = it % 2 ? 60.0f : 4.0f;
    float *x = ref_alloc(n * c), *p = ref_alloc(n * c), *pc = ref_alloc(n * c);
    float *d = ref_alloc(n * c), *dc = ref_alloc(n * c), loss = 0, lossc = 0;
    int32_t *lab = malloc(n * 4);
    ref_fill(x, n * c, -spread, spread);
    for (size_t i = 0; i < n; i++) lab[i] = (int32_t)(ref_u32() % c);
    CU_ASSERT_EQUAL(wl_softmax_xent_fwd(n, c, x, lab, pc, &lossc), 0);
    CU_ASSERT_EQUAL(wl_softmax_xent_bwd(n, c, pc, lab, 1.0f / (float)n, dc), 0);
    size_t right = 0;
    CU_ASSERT_EQUAL(wl_count_correct(n, c, x, lab, &right), 0);
    float *gx = dev_from(x, n * c * 4), *gp = dev_alloc(n * c * 4), *gl = dev_alloc(4);
    int32_t *glab = dev_from(lab, n * 4);
    uint32_t *gcount = dev_alloc(4), count = 0;
    CU_ASSERT_EQUAL(cudaMemset(gcount, 0, 4), cudaSuccess);
    CU_ASSERT_EQUAL(wl_cuda_count_correct(n, c, gx, glab, gcount, NULL), 0);
    CU_ASSERT_EQUAL(wl_cuda_softmax_xent_fwd(n, c, gx, glab, gp, gl, NULL), 0);
    to_host(p, gp, n * c * 4), to_host(&loss, gl, 4), to_host(&count, gcount, 4);
    CU_ASSERT_EQUAL(wl_cuda_softmax_xent_bwd(n, c, gp, glab, 1.0f / (float)n, gp, NULL), 0);
    to_host(d, gp, n * c * 4);
    CU_ASSERT(err_f(p, pc, n * c, 1e-7, 1e-5) <= 1.0);
    /* p - 1 at the label cancels: the error scale is that of p, times the 1/n scale. */
    CU_ASSERT(err_f(d, dc, n * c, 1e-5 / (double)n, 1e-5) <= 1.0);
    CU_ASSERT(fabs(loss - lossc) <= 1e-5 * (1.0 + fabs(lossc)));
    CU_ASSERT_EQUAL(count, right);
    cudaFree(gx), cudaFree(gp), cudaFree(gl), cudaFree(glab), cudaFree(gcount);
    free(x), free(p), free(pc), free(d), free(dc), free(lab);
  }
}

/* Four steps of each SGD variant the CPU tests take (plain without a velocity, momentum, with
 * weight decay, Nesterov) and of each Adam mode (coupled without and with weight decay, as
 * wavelet-bench runs it and as L2, and decoupled AdamW), against the CPU kernels. */
static void test_optimizers(void) {
  for (int variant = 0; variant < 4; variant++) {
    wl_sgd_t o = {.lr = ref_uniform(0.01f, 0.5f),
                  .momentum = variant == 0 ? 0.0f : ref_uniform(0.5f, 0.99f),
                  .weight_decay = variant >= 2 ? ref_uniform(0.0f, 0.1f) : 0.0f,
                  .nesterov = variant == 3};
    size_t n = (size_t)ref_int(1, 200000);
    float *w = ref_alloc(n), *g = ref_alloc(n), *out = ref_alloc(n), *vel = ref_alloc(n);
    ref_fill(w, n, -1, 1);
    memset(vel, 0, n * 4);
    float *gw = dev_from(w, n * 4), *gg = dev_alloc(n * 4);
    float *gvel = variant == 0 ? NULL : dev_from(vel, n * 4);
    for (int step = 1; step <= 4; step++) {
      ref_fill(g, n, -1, 1);
      CU_ASSERT_EQUAL(cudaMemcpy(gg, g, n * 4, cudaMemcpyHostToDevice), cudaSuccess);
      CU_ASSERT_EQUAL(wl_sgd_step(&o, n, w, g, variant == 0 ? NULL : vel), 0);
      CU_ASSERT_EQUAL(wl_cuda_sgd_step(&o, n, gw, gg, gvel, NULL), 0);
    }
    to_host(out, gw, n * 4);
    double e = err_f(out, w, n, 1e-5, 1e-5);
    CU_ASSERT(e <= 1.0);
    if (!(e <= 1.0)) fprintf(stderr, "sgd variant %d (n=%zu): err %g\n", variant, n, e);
    cudaFree(gw), cudaFree(gg), cudaFree(gvel);
    free(w), free(g), free(out), free(vel);
  }
  for (int mode = 0; mode < 3; mode++) {
    wl_adam_t o = {.lr = 1e-2f,
                   .beta1 = 0.9f,
                   .beta2 = 0.999f,
                   .eps = 1e-8f,
                   .weight_decay = mode == 0 ? 0.0f : ref_uniform(0.0f, 0.05f),
                   .decoupled = mode == 2};
    size_t n = (size_t)ref_int(1, 200000);
    float *w = ref_alloc(n), *g = ref_alloc(n), *out = ref_alloc(n);
    float *m = ref_alloc(n), *v = ref_alloc(n);
    ref_fill(w, n, -1, 1);
    memset(m, 0, n * 4), memset(v, 0, n * 4);
    float *gw = dev_from(w, n * 4), *gg = dev_alloc(n * 4);
    float *gm = dev_from(m, n * 4), *gv = dev_from(v, n * 4);
    for (int step = 1; step <= 4; step++) {
      ref_fill(g, n, -1, 1);
      CU_ASSERT_EQUAL(cudaMemcpy(gg, g, n * 4, cudaMemcpyHostToDevice), cudaSuccess);
      CU_ASSERT_EQUAL(wl_adam_step(&o, step, n, w, g, m, v), 0);
      CU_ASSERT_EQUAL(wl_cuda_adam_step(&o, step, n, gw, gg, gm, gv, NULL), 0);
    }
    to_host(out, gw, n * 4);
    double e = err_f(out, w, n, 1e-5, 1e-5);
    CU_ASSERT(e <= 1.0);
    if (!(e <= 1.0)) fprintf(stderr, "adam mode %d (n=%zu): err %g\n", mode, n, e);
    cudaFree(gw), cudaFree(gg), cudaFree(gm), cudaFree(gv);
    free(w), free(g), free(out), free(m), free(v);
  }
  /* Momentum needs a velocity, as on the CPU. */
  wl_sgd_t mo = {.lr = 0.1f, .momentum = 0.9f};
  float *gx = dev_alloc(4);
  CU_ASSERT_EQUAL(wl_cuda_sgd_step(&mo, 1, gx, gx, NULL, NULL), -EINVAL);
  cudaFree(gx);
}

static void test_reduce(void) {
  size_t n = (size_t)ref_int(1, 1000000);
  float *x = ref_alloc(n);
  ref_fill(x, n, -2, 1);
  float *gx = dev_from(x, n * 4), *gout = dev_alloc(4);
  for (int op = WL_REDUCE_SUM; op <= WL_REDUCE_ABSMAX; op++) {
    float want = 0, got = NAN;
    CU_ASSERT_EQUAL(wl_reduce((wl_reduce_op_t)op, n, x, &want), 0);
    CU_ASSERT_EQUAL(wl_cuda_reduce((wl_reduce_op_t)op, n, gx, gout, NULL), 0);
    to_host(&got, gout, 4);
    CU_ASSERT(fabs(got - want) <= 1e-6 * (1.0 + fabs(want)));
  }
  /* A NaN in the middle: NaN from every reduction, as on the CPU. */
  float nan = NAN;
  CU_ASSERT_EQUAL(cudaMemcpy(gx + n / 2, &nan, 4, cudaMemcpyHostToDevice), cudaSuccess);
  for (int op = WL_REDUCE_SUM; op <= WL_REDUCE_ABSMAX; op++) {
    float got = 0;
    CU_ASSERT_EQUAL(wl_cuda_reduce((wl_reduce_op_t)op, n, gx, gout, NULL), 0);
    to_host(&got, gout, 4);
    CU_ASSERT(isnan(got));
  }
  cudaFree(gx), cudaFree(gout);
  free(x);
}

int main(int argc, char **argv) {
  int count = 0;
  cudaError_t e = cudaGetDeviceCount(&count);
  if (e != cudaSuccess || count == 0) {
    fprintf(stderr, "test_kernels_cuda: no usable CUDA device (%s): skipped\n",
            e != cudaSuccess ? cudaGetErrorString(e) : "no devices");
    return 77;
  }
  struct cudaDeviceProp prop;
  if (cudaGetDeviceProperties(&prop, 0) == cudaSuccess)
    fprintf(stderr, "device 0: %s, sm_%d%d, bf16 GEMM kernel %s, tf32 %s\n", prop.name, prop.major,
            prop.minor, wl_cuda_gemm_bf16_kernel(), wl_cuda_sgemm_tf32_kernel());
  ref_seed(ref_seed_from_env(20260807));
  static const wl_test_case_t cases[] = {
      {"sgemm_fp32", test_sgemm_fp32},
      {"sgemm_tiles", test_sgemm_tiles},
      {"sgemm_tf32", test_sgemm_tf32},
      {"sgemm_tf32_wgmma", test_sgemm_tf32_wgmma},
      {"gemm_bf16", test_gemm_bf16},
      {"gemm_bf16_tma", test_gemm_bf16_tma},
      {"gemm_bf16_persistent", test_gemm_bf16_persistent},
      {"gemm_bf16_schedule", test_gemm_bf16_schedule},
      {"gemm_big", test_gemm_big},
      {"f32_to_bf16", test_f32_to_bf16},
      {"gemm_errors", test_gemm_errors},
      {"conv", test_conv},
      {"conv_model_shapes", test_conv_model_shapes},
      {"conv_paths", test_conv_paths},
      {"conv_empty_batch", test_conv_empty_batch},
      {"maxpool", test_maxpool},
      {"avgpool_global", test_avgpool_global},
      {"bias_relu_blas1", test_bias_relu_blas1},
      {"softmax_xent", test_softmax_xent},
      {"optimizers", test_optimizers},
      {"reduce", test_reduce},
      {"gemm_bf16_after_reset", test_gemm_bf16_after_reset},
      {NULL, NULL},
  };
  return wl_test_main(argc, argv, "kernels_cuda", cases);
}
