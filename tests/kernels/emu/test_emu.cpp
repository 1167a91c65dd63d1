/* The emulation's own tests: a launch past what sm_90 accepts runs nothing and leaves the error a
 * real launch would for cudaGetLastError (once: launch errors are not sticky), and the runtime's
 * streams, memory pool, capacity and copies answer as CUDA's do. The refusals print "emu:" lines
 * on purpose; so do the misuses of asynchronous wgmma that stop a test. Also the kernels'
 * host-computed pieces that need no launch: the loaders' fast division (common.cuh). */
#include <signal.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>

#include "common.cuh"
#include "cuda_emu.h"
#include "wltest.h"

/* The kernels: their host addresses are their identities, as for cudaFuncSetAttribute. */
static void k_count(unsigned long long *n) {
  __atomic_add_fetch(n, 1, __ATOMIC_RELAXED);
}
static void k_smem(unsigned long long *n, size_t bytes) {
  if (bytes) wl__emu_smem()[bytes - 1] = 1; /* the last byte of its dynamic shared memory */
  __atomic_add_fetch(n, 1, __ATOMIC_RELAXED);
}

/* Threads that ran. */
static unsigned long long launch(dim3 grid, dim3 block, cudaStream_t st = nullptr) {
  unsigned long long n = 0;
  wl__emu_launch("k_count", __func__, reinterpret_cast<const void *>(k_count), grid, block, 0, st,
                 [&] { k_count(&n); });
  return n;
}

static unsigned long long launch_smem(size_t bytes) {
  unsigned long long n = 0;
  wl__emu_launch("k_smem", __func__, reinterpret_cast<const void *>(k_smem), dim3(2), dim3(32),
                 bytes, nullptr, [&] { k_smem(&n, bytes); });
  return n;
}

static void test_launch_within_limits(void) {
  CU_ASSERT_EQUAL(launch(dim3(3, 2, 2), dim3(32, 4, 2)), 12ull * 256);
  CU_ASSERT_EQUAL(cudaGetLastError(), cudaSuccess);
  CU_ASSERT_EQUAL(launch(dim3(1), dim3(16, 1, 64)), 1024ull); /* z at its most, 1024 threads */
  CU_ASSERT_EQUAL(launch(dim3(1), dim3(1024)), 1024ull);
  CU_ASSERT_EQUAL(launch(dim3(1, 65535, 1), dim3(32)), 65535ull * 32);
  CU_ASSERT_EQUAL(launch(dim3(1, 1, 65535), dim3(32)), 65535ull * 32);
  CU_ASSERT_EQUAL(cudaGetLastError(), cudaSuccess);
}

static void test_launch_refused(void) {
  static const dim3 blocks[] = {dim3(1025),    dim3(1024, 2),  dim3(32, 33),   dim3(1, 1, 65),
                                dim3(0, 1, 1), dim3(32, 0, 1), dim3(32, 1, 0), dim3(2048)};
  for (const dim3 &b : blocks) {
    CU_ASSERT_EQUAL(launch(dim3(1), b), 0ull);
    CU_ASSERT_EQUAL(cudaGetLastError(), cudaErrorInvalidConfiguration);
    CU_ASSERT_EQUAL(cudaGetLastError(), cudaSuccess); /* not sticky */
  }
  static const dim3 grids[] = {dim3(0),          dim3(1, 0),        dim3(1, 1, 0),
                               dim3(1, 65536),   dim3(1, 1, 65536), dim3(0x80000000u),
                               dim3(0xffffffffu)};
  for (const dim3 &g : grids) {
    CU_ASSERT_EQUAL(launch(g, dim3(32)), 0ull);
    CU_ASSERT_EQUAL(cudaGetLastError(), cudaErrorInvalidConfiguration);
  }
  CU_ASSERT_EQUAL(launch(dim3(1), dim3(32)), 32ull); /* and the next launch runs */
  CU_ASSERT_EQUAL(cudaGetLastError(), cudaSuccess);
}

static void test_dynamic_shared_memory(void) {
  CU_ASSERT_EQUAL(launch_smem(48 * 1024), 64ull);
  CU_ASSERT_EQUAL(cudaGetLastError(), cudaSuccess);
  CU_ASSERT_EQUAL(launch_smem(48 * 1024 + 1), 0ull); /* not opted in */
  CU_ASSERT_EQUAL(cudaGetLastError(), cudaErrorInvalidValue);
  CU_ASSERT_EQUAL(
      cudaFuncSetAttribute(k_smem, cudaFuncAttributeMaxDynamicSharedMemorySize, 100 * 1024),
      cudaSuccess);
  CU_ASSERT_EQUAL(launch_smem(100 * 1024), 64ull);
  CU_ASSERT_EQUAL(launch_smem(100 * 1024 + 1), 0ull);
  CU_ASSERT_EQUAL(cudaGetLastError(), cudaErrorInvalidValue);
  /* The attribute is per kernel: k_count still has 48 KiB. */
  unsigned long long n = 0;
  wl__emu_launch("k_count", __func__, reinterpret_cast<const void *>(k_count), dim3(1), dim3(32),
                 64 * 1024, nullptr, [&] { k_count(&n); });
  CU_ASSERT_EQUAL(n, 0ull);
  CU_ASSERT_EQUAL(cudaGetLastError(), cudaErrorInvalidValue);
  /* 227 KiB is the most any kernel may have. */
  CU_ASSERT_EQUAL(
      cudaFuncSetAttribute(k_smem, cudaFuncAttributeMaxDynamicSharedMemorySize, 227 * 1024 + 1),
      cudaErrorInvalidValue);
  CU_ASSERT_EQUAL(cudaGetLastError(), cudaErrorInvalidValue);
  CU_ASSERT_EQUAL(
      cudaFuncSetAttribute(k_smem, cudaFuncAttributeMaxDynamicSharedMemorySize, 227 * 1024),
      cudaSuccess);
  CU_ASSERT_EQUAL(launch_smem(227 * 1024), 64ull);
  CU_ASSERT_EQUAL(launch_smem(227 * 1024 + 16), 0ull);
  CU_ASSERT_EQUAL(cudaGetLastError(), cudaErrorInvalidValue);
}

static void test_streams(void) {
  cudaStream_t s = nullptr;
  CU_ASSERT_EQUAL_FATAL(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), cudaSuccess);
  CU_ASSERT_EQUAL(launch(dim3(2), dim3(64), s), 128ull);
  CU_ASSERT_EQUAL(cudaStreamSynchronize(s), cudaSuccess);
  CU_ASSERT_EQUAL(cudaStreamCreateWithFlags(&s, 0x80), cudaErrorInvalidValue);
  CU_ASSERT_EQUAL(cudaGetLastError(), cudaErrorInvalidValue);
  CU_ASSERT_EQUAL(cudaStreamDestroy(s), cudaSuccess);
  /* A destroyed stream is no stream: launches, copies and waits on it fail. */
  CU_ASSERT_EQUAL(launch(dim3(1), dim3(32), s), 0ull);
  CU_ASSERT_EQUAL(cudaGetLastError(), cudaErrorInvalidResourceHandle);
  CU_ASSERT_EQUAL(cudaStreamSynchronize(s), cudaErrorInvalidResourceHandle);
  CU_ASSERT_EQUAL(cudaStreamDestroy(s), cudaErrorInvalidResourceHandle);
  void *p = nullptr;
  CU_ASSERT_EQUAL(cudaMallocAsync(&p, 64, s), cudaErrorInvalidResourceHandle);
  CU_ASSERT_EQUAL(cudaGetLastError(), cudaErrorInvalidResourceHandle);
  CU_ASSERT_EQUAL(cudaStreamSynchronize(nullptr), cudaSuccess); /* the default stream */
}

/* main sets the emulated device's memory to 1 MiB. */
static void test_memory(void) {
  void *a = nullptr, *b = nullptr, *c = nullptr;
  CU_ASSERT_EQUAL_FATAL(cudaMallocAsync(&a, 512 * 1024, nullptr), cudaSuccess);
  CU_ASSERT_EQUAL_FATAL(cudaMalloc(&b, 512 * 1024 - 100), cudaSuccess); /* 256-byte granules */
  CU_ASSERT_EQUAL(cudaMallocAsync(&c, 1, nullptr), cudaErrorMemoryAllocation);
  CU_ASSERT_PTR_NULL(c);
  CU_ASSERT_EQUAL(cudaGetLastError(), cudaErrorMemoryAllocation);
  CU_ASSERT_EQUAL(cudaFreeAsync(b, nullptr), cudaSuccess);
  CU_ASSERT_EQUAL(cudaFree(b), cudaErrorInvalidValue); /* twice */
  CU_ASSERT_EQUAL(cudaMallocAsync(&c, 1, nullptr), cudaSuccess);

  char host[64] = {1};
  char *d = (char *)a;
  CU_ASSERT_EQUAL(cudaMemcpy(d + 512 * 1024 - 64, host, 64, cudaMemcpyHostToDevice), cudaSuccess);
  CU_ASSERT_EQUAL(cudaMemcpy(d + 512 * 1024 - 63, host, 64, cudaMemcpyHostToDevice),
                  cudaErrorInvalidValue); /* one byte past the end */
  char back[64] = {0};
  CU_ASSERT_EQUAL(cudaMemcpyAsync(back, d + 512 * 1024 - 64, 64, cudaMemcpyDeviceToHost, nullptr),
                  cudaSuccess);
  CU_ASSERT_EQUAL(back[0], 1);
  CU_ASSERT_EQUAL(cudaMemcpy(host, host + 1, 8, cudaMemcpyDeviceToHost), cudaErrorInvalidValue);
  CU_ASSERT_EQUAL(cudaMemcpy(d, d + 64, 64, cudaMemcpyDeviceToDevice), cudaSuccess);
  CU_ASSERT_EQUAL(cudaMemsetAsync(d, 0, 512 * 1024, nullptr), cudaSuccess);
  CU_ASSERT_EQUAL(cudaMemsetAsync(d, 0, 512 * 1024 + 1, nullptr), cudaErrorInvalidValue);
  CU_ASSERT_EQUAL(cudaMemset(host, 0, 8), cudaErrorInvalidValue);
  CU_ASSERT_EQUAL(cudaFree(host), cudaErrorInvalidValue);
  CU_ASSERT_EQUAL(cudaGetLastError(), cudaErrorInvalidValue);
  CU_ASSERT_EQUAL(cudaFree(nullptr), cudaSuccess);
  CU_ASSERT_EQUAL(cudaFreeAsync(a, nullptr), cudaSuccess);
  CU_ASSERT_EQUAL(cudaFree(c), cudaSuccess);
}

static void test_device_and_pool(void) {
  CU_ASSERT_EQUAL(cudaSetDevice(0), cudaSuccess);
  CU_ASSERT_EQUAL(cudaSetDevice(1), cudaErrorInvalidDevice);
  CU_ASSERT_EQUAL(cudaGetLastError(), cudaErrorInvalidDevice);
  cudaMemPool_t pool = nullptr;
  CU_ASSERT_EQUAL(cudaDeviceGetDefaultMemPool(&pool, 1), cudaErrorInvalidDevice);
  CU_ASSERT_EQUAL_FATAL(cudaDeviceGetDefaultMemPool(&pool, 0), cudaSuccess);
  unsigned long long zero = 0;
  CU_ASSERT_EQUAL(cudaMemPoolSetAttribute(pool, cudaMemPoolAttrReleaseThreshold, &zero),
                  cudaSuccess);
  CU_ASSERT_EQUAL(cudaMemPoolSetAttribute(nullptr, cudaMemPoolAttrReleaseThreshold, &zero),
                  cudaErrorInvalidValue);
  CU_ASSERT_EQUAL(cudaGetLastError(), cudaErrorInvalidValue);
  CU_ASSERT_STRING_EQUAL(cudaGetErrorString(cudaErrorInvalidConfiguration),
                         "invalid configuration argument");
  /* the SM count the persistent GEMM sizes its grid by: small unless set */
  int sms = 0;
  CU_ASSERT_EQUAL(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0), cudaSuccess);
  CU_ASSERT_EQUAL(sms, 4);
  wl__emu_set_sm_count(7);
  CU_ASSERT_EQUAL(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0), cudaSuccess);
  CU_ASSERT_EQUAL(sms, 7);
  wl__emu_set_sm_count(0);
  CU_ASSERT_EQUAL(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0), cudaSuccess);
  CU_ASSERT_EQUAL(sms, 4);
}

/* wl__fdiv against / and % for every divisor up to 70000 and large ones, at the numerators
 * where a wrong multiplier or shift shows first: around multiples of d and at 2^31 - 1. */
static void check_fdiv(int d, int *bad) {
  const wl__fdiv f = wl__make_fdiv(d);
  const long long top = 2147483647ll;
  const long long k = top / d;
  const long long ns[] = {0,         1,     d - 1,   d,   (long long)d + 1, 2ll * d - 1, 2ll * d,
                          k * d - 1, k * d, top - 1, top, top / 2,          top / 3};
  for (long long n : ns) {
    if (n < 0 || n > top) continue;
    int rem = -1, q = f.divmod((int)n, rem);
    if (q != (int)(n / d) || rem != (int)(n % d) || f.div((int)n) != q) {
      if ((*bad)++ < 5) fprintf(stderr, "fdiv: %lld / %d: %d rem %d\n", n, d, q, rem);
    }
  }
}

static void test_fast_division(void) {
  int bad = 0;
  for (int d = 1; d <= 70000; d++) check_fdiv(d, &bad);
  const int big[] = {65537,         46341,   1 << 20,       (1 << 20) + 1, 999999937,
                     (1 << 30) - 1, 1 << 30, (1 << 30) + 1, 2147483646,    2147483647};
  for (int d : big) check_fdiv(d, &bad);
  unsigned x = 12345;
  for (int i = 0; i < 200000; i++) { /* random pairs */
    x = x * 1103515245u + 12345u;
    int d = (int)(x >> 1) % 100000 + 1;
    x = x * 1103515245u + 12345u;
    int n = (int)(x >> 1);
    const wl__fdiv f = wl__make_fdiv(d);
    if (f.div(n) != n / d && bad++ < 5) fprintf(stderr, "fdiv: %d / %d\n", n, d);
  }
  CU_ASSERT_EQUAL(bad, 0);
}

/* Asynchronous wgmma: one warpgroup multiplies A (64 x 16) by B (16 x 8), both K-major with the
 * 128-byte swizzle at the first 1024-byte boundary, all ones, so each accumulator gets the sum
 * of 16 products of its A and B values. */
enum { WG_STAGE = 8192, WG_SMEM = 1024 + 3 * WG_STAGE };
enum wg_mode { WG_LATE_WRITE, WG_GROUPS, WG_TMA_RACE, WG_NO_WAIT };

static uint32_t wg_base(void) {
  return (__cvta_generic_to_shared(wl__emu_smem()) + 1023u) & ~1023u;
}
static uint64_t wg_desc(uint32_t addr) { /* K-major: LBO 16 (unused), SBO 1024 */
  return (uint64_t)(addr >> 4) | (1ull << 16) | ((uint64_t)(1024 >> 4) << 32) | (1ull << 62);
}
static void wg_fill(uint32_t addr, float v) {
  uint32_t u;
  memcpy(&u, &v, 4);
  const uint16_t h = (uint16_t)(u >> 16);
  unsigned char *p = wl__emu_smem() - __cvta_generic_to_shared(wl__emu_smem()) + addr;
  for (int i = 0; i < WG_STAGE / 2; i++) memcpy(p + 2 * i, &h, 2);
}

/* bad counts the threads that saw other than the model promises. */
static void k_wgmma(wg_mode mode, int *bad) {
  const uint32_t a = wg_base(), b = a + WG_STAGE, bar = a + 2 * WG_STAGE;
  const int t = (int)threadIdx.x;
  if (t == 0) {
    wg_fill(a, 1.0f), wg_fill(b, 1.0f);
    wl__emu_mbar_init(bar, 1);
  }
  __syncthreads();
  float d[4] = {0, 0, 0, 0}, e[4] = {1, 1, 1, 1};
  wl__emu_wgmma(d, 8, wg_desc(a), wg_desc(b), false, false);
  wl__emu_wg_commit();
  bool ok = isnan(d[0]);       /* the accumulators are not the kernel's until the wait */
  if (mode == WG_LATE_WRITE) { /* operands are read at the wait: A changed before it counts */
    __syncthreads();
    if (t == 0) wg_fill(a, 2.0f);
    __syncthreads();
    wl__emu_wg_wait(0);
    for (float x : d) ok = ok && x == 32.0f;
  } else if (mode == WG_GROUPS) { /* wait_group 1 completes all but the newest group */
    wl__emu_wgmma(e, 8, wg_desc(a), wg_desc(b), false, false);
    wl__emu_wg_commit();
    wl__emu_wg_wait(1);
    ok = ok && d[0] == 16.0f && isnan(e[0]);
    wl__emu_wg_wait(0);
    for (int i = 0; i < 4; i++) ok = ok && d[i] == 16.0f && e[i] == 17.0f;
  } else if (mode == WG_TMA_RACE) { /* a stage loaded again while a wgmma may read it: stops */
    alignas(16) static const uint16_t g[64 * 64] = {0};
    const CUtensorMap map = {g, {64, 64}, 128, 2};
    if (t == 0) {
      wl__emu_mbar_arrive(bar, WG_STAGE);
      wl__emu_tma_load(a, &map, bar, 0, 0);
    }
    wl__emu_wg_wait(0);
  } /* WG_NO_WAIT: ends with a wgmma pending, which stops the test */
  if (!ok) __atomic_add_fetch(bad, 1, __ATOMIC_RELAXED);
}

static int run_wgmma(wg_mode mode) {
  int bad = 0;
  wl__emu_launch("k_wgmma", __func__, reinterpret_cast<const void *>(k_wgmma), dim3(1), dim3(128),
                 WG_SMEM, nullptr, [&] { k_wgmma(mode, &bad); });
  return bad;
}

/* Whether the launch stopped the process (abort), in a child. */
static bool wgmma_stops(wg_mode mode) {
  fflush(NULL);
  pid_t pid = fork();
  if (pid == 0) {
    run_wgmma(mode);
    _exit(0);
  }
  int st = 0;
  if (pid < 0 || waitpid(pid, &st, 0) != pid) return false;
  return WIFSIGNALED(st) && WTERMSIG(st) == SIGABRT;
}

static void test_wgmma_async(void) {
  CU_ASSERT_EQUAL(run_wgmma(WG_LATE_WRITE), 0);
  CU_ASSERT_EQUAL(run_wgmma(WG_GROUPS), 0);
  CU_ASSERT_EQUAL(cudaGetLastError(), cudaSuccess);
  CU_ASSERT(wgmma_stops(WG_TMA_RACE));
  CU_ASSERT(wgmma_stops(WG_NO_WAIT));
}

/* TF32 wgmma (m64n8k8) on operands TMA loaded as fp32 with the 128-byte swizzle (32 floats a
 * row): A is 64 x 32, B 8 x 32 (N x K, as B^T), both K-major; four k8 steps 32 bytes apart, as
 * gemm_wgmma.cu issues them. The values carry bits below TF32's 10 mantissa bits, which the
 * tensor core ignores. MN-major (the transpose bit) is refused for tf32. */
static float tf32_a(int r, int k) {
  return (float)((r * 3 + k) % 9 - 4) + 0.125f * (float)(k % 4) + 1e-4f;
}
static float tf32_b(int c, int k) {
  return (float)((c * 5 + k * 7) % 11 - 5) * 0.5f - 3e-4f;
}
static float tf32_trunc(float x) {
  uint32_t u;
  memcpy(&u, &x, 4);
  u &= ~0x1fffu;
  memcpy(&x, &u, 4);
  return x;
}

static void k_wgmma_tf32(bool mn_major, int *bad) {
  alignas(16) static float ga[64 * 32], gb[8 * 32];
  const uint32_t a = wg_base(), b = a + WG_STAGE, bar = a + 2 * WG_STAGE;
  const int t = (int)threadIdx.x;
  if (t == 0) {
    for (int r = 0; r < 64; r++)
      for (int k = 0; k < 32; k++) ga[r * 32 + k] = tf32_a(r, k);
    for (int c = 0; c < 8; c++)
      for (int k = 0; k < 32; k++) gb[c * 32 + k] = tf32_b(c, k);
    const CUtensorMap ma = {ga, {32, 64}, 128, 4}, mb = {gb, {32, 8}, 128, 4};
    wl__emu_mbar_init(bar, 1);
    wl__emu_mbar_arrive(bar, 2 * WG_STAGE);
    wl__emu_tma_load(a, &ma, bar, 0, 0);
    wl__emu_tma_load(b, &mb, bar, 0, 0); /* rows 8-63 of the box: zeros */
  }
  __syncthreads();
  while (!wl__emu_mbar_done(bar, 0)) wl__emu_yield();
  float d[4] = {0, 0, 0, 0};
  for (int kk = 0; kk < 4; kk++)
    wl__emu_wgmma(d, 8, wg_desc(a + 32u * kk), wg_desc(b + 32u * kk), mn_major, false,
                  WL__EMU_WG_TF32);
  wl__emu_wg_commit();
  wl__emu_wg_wait(0);
  const int warp = t / 32, lane = t % 32;
  bool ok = true;
  for (int i = 0; i < 4; i++) {
    const int r = warp * 16 + lane / 4 + 8 * (i / 2), c = 2 * (lane % 4) + i % 2;
    double want = 0;
    for (int k = 0; k < 32; k++)
      want += (double)tf32_trunc(tf32_a(r, k)) * tf32_trunc(tf32_b(c, k));
    ok = ok && fabs(d[i] - want) <= 1e-5 * (fabs(want) + 1);
  }
  if (!ok) __atomic_add_fetch(bad, 1, __ATOMIC_RELAXED);
}

static int run_wgmma_tf32(bool mn_major) {
  int bad = 0;
  wl__emu_launch("k_wgmma_tf32", __func__, reinterpret_cast<const void *>(k_wgmma_tf32), dim3(1),
                 dim3(128), WG_SMEM, nullptr, [&] { k_wgmma_tf32(mn_major, &bad); });
  return bad;
}

static void test_wgmma_tf32(void) {
  CU_ASSERT_EQUAL(run_wgmma_tf32(false), 0);
  CU_ASSERT_EQUAL(cudaGetLastError(), cudaSuccess);
  fflush(NULL);
  pid_t pid = fork();
  if (pid == 0) {
    run_wgmma_tf32(true);
    _exit(0);
  }
  int st = 0;
  CU_ASSERT(pid > 0 && waitpid(pid, &st, 0) == pid && WIFSIGNALED(st) && WTERMSIG(st) == SIGABRT);
}

int main(int argc, char **argv) {
  setenv("WAVELET_EMU_DEVICE_MEMORY", "1M", 1); /* read at the first allocation */
  static const wl_test_case_t cases[] = {
      {"launch_within_limits", test_launch_within_limits},
      {"launch_refused", test_launch_refused},
      {"dynamic_shared_memory", test_dynamic_shared_memory},
      {"streams", test_streams},
      {"memory", test_memory},
      {"device_and_pool", test_device_and_pool},
      {"fast_division", test_fast_division},
      {"wgmma_async", test_wgmma_async},
      {"wgmma_tf32", test_wgmma_tf32},
      {NULL, NULL},
  };
  return wl_test_main(argc, argv, "cuda_emu", cases);
}
