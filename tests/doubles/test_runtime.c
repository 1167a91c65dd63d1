/* Tests of the CUDA runtime double (build/tests/doubles/libcudart.so.13) over the driver double:
 * it reaches the driver only through cuGetProcAddress, maps the driver's errors to the runtime's,
 * keeps the per-thread last error, answers cudaGetDriverEntryPoint* by version and flags,
 * shares cudaMalloc memory with another process through CUDA IPC, resets the device, and
 * serves several devices (WLTEST_DEVICE_COUNT, this executable run again).
 * The ctest entry puts the doubles on LD_LIBRARY_PATH and sets WLTEST_DEVICE_MEM=64M. */
#include <cuda.h>
#include <cuda_runtime_api.h>
#include <dlfcn.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "wltest.h"
#include "wltest_cuda.h"

#define MiB ((size_t)1 << 20)

static void *drv;
static void (*stats_fn)(wltest_driver_stats_t *);

static wltest_driver_stats_t stats(void) {
  wltest_driver_stats_t s;
  stats_fn(&s);
  return s;
}

/* The runtime loaded the driver double: finds it and its statistics (false when it cannot). */
static bool find_stats(void) {
  drv = dlopen("libcuda.so.1", RTLD_NOW | RTLD_NOLOAD);
  void *p = drv ? dlsym(drv, "wltest_driver_stats") : NULL;
  if (p) memcpy(&stats_fn, &p, sizeof p);
  return p != NULL;
}

static void test_init_through_getproc(void) {
  int n = 0;
  CU_ASSERT_EQUAL(cudaGetDeviceCount(&n), cudaSuccess);
  CU_ASSERT_EQUAL(n, 1);
  CU_ASSERT_TRUE_FATAL(find_stats());
  wltest_driver_stats_t s = stats();
  /* Every entry point came from cuGetProcAddress (one lookup each, both stream flavours). */
  CU_ASSERT(s.calls[WLTEST_FN_cuGetProcAddress_v2] >= 50);
  CU_ASSERT_EQUAL(s.calls[WLTEST_FN_cuInit], 1);
  CU_ASSERT_EQUAL(s.misuse, 0);
  struct cudaDeviceProp prop;
  CU_ASSERT_EQUAL(cudaGetDeviceProperties(&prop, 0), cudaSuccess);
  CU_ASSERT_EQUAL(prop.totalGlobalMem, 64 * MiB);
  CU_ASSERT_EQUAL(prop.warpSize, 32);
  CU_ASSERT(prop.name[0] != 0);
  int v = 0;
  CU_ASSERT_EQUAL(cudaDeviceGetAttribute(&v, cudaDevAttrMultiProcessorCount, 0), cudaSuccess);
  CU_ASSERT_EQUAL(v, prop.multiProcessorCount);
  CU_ASSERT_EQUAL(cudaSetDevice(1), cudaErrorInvalidDevice);
  CU_ASSERT_EQUAL(cudaGetLastError(), cudaErrorInvalidDevice);
  CU_ASSERT_EQUAL(cudaSetDevice(0), cudaSuccess);
}

static void test_errors_and_oom(void) {
  void *a = NULL, *b = NULL;
  CU_ASSERT_EQUAL_FATAL(cudaMalloc(&a, 48 * MiB), cudaSuccess);
  uint64_t calls = stats().calls[WLTEST_FN_cuMemAlloc_v2];
  CU_ASSERT_EQUAL(cudaMalloc(&b, 32 * MiB), cudaErrorMemoryAllocation);
  CU_ASSERT_EQUAL(stats().calls[WLTEST_FN_cuMemAlloc_v2], calls + 1); /* the _v2 ABI */
  CU_ASSERT_PTR_NULL(b);
  /* The last error sticks until read, per thread. */
  CU_ASSERT_EQUAL(cudaPeekAtLastError(), cudaErrorMemoryAllocation);
  CU_ASSERT_EQUAL(cudaGetLastError(), cudaErrorMemoryAllocation);
  CU_ASSERT_EQUAL(cudaGetLastError(), cudaSuccess);
  CU_ASSERT_STRING_EQUAL(cudaGetErrorName(cudaErrorMemoryAllocation), "cudaErrorMemoryAllocation");
  CU_ASSERT_STRING_EQUAL(cudaGetErrorString(cudaErrorMemoryAllocation), "out of memory");
  CU_ASSERT_STRING_EQUAL(cudaGetErrorName(cudaErrorStreamCaptureInvalidated),
                         "cudaErrorStreamCaptureInvalidated");
  CU_ASSERT_STRING_EQUAL(cudaGetErrorString((cudaError_t)123456), "unrecognized error code");
  size_t fr, tot;
  CU_ASSERT_EQUAL(cudaMemGetInfo(&fr, &tot), cudaSuccess);
  CU_ASSERT_EQUAL(tot, 64 * MiB);
  CU_ASSERT_EQUAL(fr, 16 * MiB);
  CU_ASSERT_EQUAL(cudaFree(a), cudaSuccess);
  CU_ASSERT_EQUAL(cudaFree(NULL), cudaSuccess);
  CU_ASSERT_EQUAL(cudaMalloc(&b, 0), cudaSuccess);
  CU_ASSERT_PTR_NULL(b);
  /* Freeing twice: the driver's CUDA_ERROR_INVALID_VALUE. */
  CU_ASSERT_EQUAL(cudaMalloc(&a, 4096), cudaSuccess);
  CU_ASSERT_EQUAL(cudaFree(a), cudaSuccess);
  CU_ASSERT_EQUAL(cudaFree(a), cudaErrorInvalidValue);
  CU_ASSERT_EQUAL(cudaGetLastError(), cudaErrorInvalidValue);
}

static void test_async_pinned_events(void) {
  cudaStream_t s;
  CU_ASSERT_EQUAL_FATAL(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), cudaSuccess);
  void *a, *h;
  CU_ASSERT_EQUAL_FATAL(cudaMallocAsync(&a, 8 * MiB, s), cudaSuccess);
  CU_ASSERT_EQUAL(cudaMemsetAsync(a, 7, 8 * MiB, s), cudaSuccess);
  CU_ASSERT_EQUAL_FATAL(cudaMallocHost(&h, 4096), cudaSuccess);
  CU_ASSERT_EQUAL(cudaMemcpyAsync(h, a, 4096, cudaMemcpyDeviceToHost, s), cudaSuccess);
  cudaEvent_t e0, e1;
  CU_ASSERT_EQUAL(cudaEventCreate(&e0), cudaSuccess);
  CU_ASSERT_EQUAL(cudaEventCreate(&e1), cudaSuccess);
  CU_ASSERT_EQUAL(cudaEventRecord(e0, s), cudaSuccess);
  CU_ASSERT_EQUAL(cudaEventRecord(e1, s), cudaSuccess);
  CU_ASSERT_EQUAL(cudaFreeAsync(a, s), cudaSuccess);
  CU_ASSERT_EQUAL(cudaStreamSynchronize(s), cudaSuccess);
  CU_ASSERT_EQUAL(((unsigned char *)h)[4095], 7);
  float ms = -1;
  CU_ASSERT_EQUAL(cudaEventElapsedTime(&ms, e0, e1), cudaSuccess);
  CU_ASSERT(ms >= 0);
  CU_ASSERT_EQUAL(cudaStreamQuery(s), cudaSuccess);
  cudaMemPool_t pool;
  CU_ASSERT_EQUAL(cudaDeviceGetDefaultMemPool(&pool, 0), cudaSuccess);
  uint64_t high = 0;
  CU_ASSERT_EQUAL(cudaMemPoolGetAttribute(pool, cudaMemPoolAttrReservedMemHigh, &high),
                  cudaSuccess);
  CU_ASSERT(high >= 8 * MiB);
  CU_ASSERT_EQUAL(cudaMallocFromPoolAsync(&a, MiB, pool, s), cudaSuccess);
  CU_ASSERT_EQUAL(cudaFreeAsync(a, s), cudaSuccess);
  void *h2;
  CU_ASSERT_EQUAL(cudaHostAlloc(&h2, 4096, cudaHostAllocPortable), cudaSuccess);
  CU_ASSERT_EQUAL(cudaFreeHost(h2), cudaSuccess);
  CU_ASSERT_EQUAL(cudaFreeHost(h), cudaSuccess);
  CU_ASSERT_EQUAL(cudaEventDestroy(e0), cudaSuccess);
  CU_ASSERT_EQUAL(cudaEventDestroy(e1), cudaSuccess);
  CU_ASSERT_EQUAL(cudaStreamDestroy(s), cudaSuccess);
  CU_ASSERT_EQUAL(cudaDeviceSynchronize(), cudaSuccess);
  wltest_driver_stats_t st = stats();
  CU_ASSERT_EQUAL(st.host_allocs, 0);
  CU_ASSERT_EQUAL(st.linear_allocs, 0);
  CU_ASSERT_EQUAL(st.used, 0);   /* the synchronisation trimmed the pool */
  CU_ASSERT_EQUAL(st.misuse, 1); /* the double free above */
}

/* cudaGetDriverEntryPoint is deprecated in CUDA 13, but still what older callers use. */
#pragma GCC diagnostic ignored "-Wdeprecated-declarations"
static void test_driver_entry_points(void) {
  void *p = NULL;
  enum cudaDriverEntryPointQueryResult st;
  CU_ASSERT_EQUAL(cudaGetDriverEntryPointByVersion("cuMemAlloc", &p, 12000, cudaEnableDefault, &st),
                  cudaSuccess);
  CU_ASSERT_EQUAL(st, cudaDriverEntryPointSuccess);
  CU_ASSERT_PTR_EQUAL(p, dlsym(drv, "cuMemAlloc_v2"));
  CU_ASSERT_EQUAL(cudaGetDriverEntryPointByVersion("cuMemAlloc", &p, 2000, cudaEnableDefault, &st),
                  cudaSuccess);
  CU_ASSERT_PTR_EQUAL(p, dlsym(drv, "cuMemAlloc"));
  CU_ASSERT_EQUAL(
      cudaGetDriverEntryPoint("cuLaunchKernel", &p, cudaEnablePerThreadDefaultStream, &st),
      cudaSuccess);
  CU_ASSERT_PTR_EQUAL(p, dlsym(drv, "cuLaunchKernel_ptsz"));
  CU_ASSERT_EQUAL(cudaGetDriverEntryPoint("cuLaunchKernel", &p, cudaEnableDefault, &st),
                  cudaSuccess);
  CU_ASSERT_PTR_EQUAL(p, dlsym(drv, "cuLaunchKernel"));
  CU_ASSERT_EQUAL(
      cudaGetDriverEntryPointByVersion("cuMemAllocAsync", &p, 11000, cudaEnableDefault, &st),
      cudaSuccess);
  CU_ASSERT_PTR_NULL(p);
  CU_ASSERT_EQUAL(st, cudaDriverEntryPointVersionNotSufficent);
  CU_ASSERT_EQUAL(cudaGetDriverEntryPoint("cuNoSuchThing", &p, cudaEnableDefault, &st),
                  cudaSuccess);
  CU_ASSERT_EQUAL(st, cudaDriverEntryPointSymbolNotFound);
  CU_ASSERT_EQUAL(cudaGetDriverEntryPoint("cuMemAlloc", &p, 16, &st), cudaErrorInvalidValue);
}

static bool all(const unsigned char *p, size_t n, unsigned char v) {
  for (size_t i = 0; i < n; i++)
    if (p[i] != v) return false;
  return true;
}

/* Child mode (--child-ipc HANDLE): another process opens the parent's cudaMalloc memory (4096
 * bytes of 0x5a) through the runtime, twice (the same pointer), sets it to 0xa5 and closes it
 * twice; bad handles and pointers get the runtime's codes; the calls reached the driver's
 * 11.0 ABI through cuGetProcAddress. 0 when all held. */
static int child_ipc(const char *hex) {
  cudaIpcMemHandle_t h;
  WL_CHILD_CHECK(wl_test_unhex(hex, &h, sizeof h));
  void *p = NULL, *q = NULL;
  WL_CHILD_CHECK(cudaIpcOpenMemHandle(&p, h, cudaIpcMemLazyEnablePeerAccess) == cudaSuccess);
  unsigned char buf[4096];
  WL_CHILD_CHECK(cudaMemcpy(buf, p, sizeof buf, cudaMemcpyDeviceToHost) == cudaSuccess);
  WL_CHILD_CHECK(all(buf, sizeof buf, 0x5a));
  WL_CHILD_CHECK(cudaIpcOpenMemHandle(&q, h, cudaIpcMemLazyEnablePeerAccess) == cudaSuccess);
  WL_CHILD_CHECK(q == p);
  WL_CHILD_CHECK(cudaMemset(p, 0xa5, sizeof buf) == cudaSuccess);
  cudaIpcMemHandle_t bad = h;
  bad.reserved[1] ^= 1;
  void *r = NULL;
  WL_CHILD_CHECK(cudaIpcOpenMemHandle(&r, bad, 0) == cudaErrorInvalidResourceHandle);
  WL_CHILD_CHECK(cudaGetLastError() == cudaErrorInvalidResourceHandle);
  WL_CHILD_CHECK(cudaIpcCloseMemHandle(q) == cudaSuccess);
  WL_CHILD_CHECK(cudaIpcCloseMemHandle(p) == cudaSuccess);
  WL_CHILD_CHECK(cudaIpcCloseMemHandle(p) == cudaErrorInvalidValue);
  WL_CHILD_CHECK(find_stats());
  wltest_driver_stats_t st = stats();
  WL_CHILD_CHECK(st.calls[WLTEST_FN_cuIpcOpenMemHandle_v2] == 3);
  WL_CHILD_CHECK(st.calls[WLTEST_FN_cuIpcOpenMemHandle] == 0);
  WL_CHILD_CHECK(st.calls[WLTEST_FN_cuIpcCloseMemHandle] == 3);
  WL_CHILD_CHECK(st.ipc_opened == 0 && st.misuse == 2);
  return 0;
}

/* cudaIpcGetMemHandle, cudaIpcOpenMemHandle and cudaIpcCloseMemHandle over the driver's CUDA
 * IPC: the same handle each time, another process shares the bytes (child_ipc), the exporting
 * process cannot open its own handle (cudaErrorDeviceUninitialized, as CUDA's "invalid device
 * context"), an interior pointer has no handle. */
static void test_ipc(void) {
  void *a = NULL, *p = NULL;
  CU_ASSERT_EQUAL_FATAL(cudaMalloc(&a, 4096), cudaSuccess);
  CU_ASSERT_EQUAL(cudaMemset(a, 0x5a, 4096), cudaSuccess);
  cudaIpcMemHandle_t h, h2;
  CU_ASSERT_EQUAL_FATAL(cudaIpcGetMemHandle(&h, a), cudaSuccess);
  CU_ASSERT_EQUAL(cudaIpcGetMemHandle(&h2, a), cudaSuccess);
  CU_ASSERT_EQUAL(memcmp(&h, &h2, sizeof h), 0);
  CU_ASSERT_EQUAL(cudaIpcGetMemHandle(NULL, a), cudaErrorInvalidValue);
  CU_ASSERT_EQUAL(cudaIpcGetMemHandle(&h2, (char *)a + 256), cudaSuccess); /* the allocation's */
  CU_ASSERT_EQUAL(memcmp(&h, &h2, sizeof h), 0);
  CU_ASSERT_EQUAL(cudaIpcOpenMemHandle(&p, h, cudaIpcMemLazyEnablePeerAccess),
                  cudaErrorDeviceUninitialized);
  CU_ASSERT_PTR_NULL(p);
  CU_ASSERT_EQUAL(cudaGetLastError(), cudaErrorDeviceUninitialized);
  char hex[2 * sizeof h + 1];
  wl_test_hex(&h, sizeof h, hex);
  pid_t child = fork();
  CU_ASSERT_FATAL(child >= 0);
  if (child == 0) {
    execl("/proc/self/exe", "test_doubles_runtime", "--child-ipc", hex, (char *)NULL);
    _exit(127);
  }
  int st = 0;
  CU_ASSERT_EQUAL(waitpid(child, &st, 0), child);
  CU_ASSERT(WIFEXITED(st) && WEXITSTATUS(st) == 0);
  unsigned char buf[4096];
  CU_ASSERT_EQUAL(cudaMemcpy(buf, a, sizeof buf, cudaMemcpyDeviceToHost), cudaSuccess);
  CU_ASSERT(all(buf, sizeof buf, 0xa5));
  CU_ASSERT_EQUAL(cudaIpcCloseMemHandle(a), cudaErrorInvalidValue);
  CU_ASSERT_EQUAL(cudaFree(a), cudaSuccess);
  CU_ASSERT_EQUAL(stats().ipc_exported, 0);
}

/* A thread that made the context current before the reset and calls again after it, before any
 * other thread re-initialises the runtime. */
static pthread_barrier_t reset_bar;
static void *reset_other(void *arg) {
  (void)arg;
  cudaError_t before = cudaFree(NULL);
  pthread_barrier_wait(&reset_bar); /* the main thread resets */
  pthread_barrier_wait(&reset_bar);
  void *p = NULL;
  cudaError_t after = cudaMalloc(&p, 4096);
  if (after == cudaSuccess) after = cudaFree(p);
  return (void *)(uintptr_t)(before != cudaSuccess ? before : after);
}

/* cudaDeviceReset: the driver's primary context is reset through the driver's
 * cuDevicePrimaryCtxReset, the runtime's retain given back; memory comes back (but for
 * stream-ordered memory, which stays, as documented), the old pointers, streams and events are
 * unknown, and the next call (in any thread) initialises afresh. */
static void test_device_reset(void) {
  void *a = NULL, *h = NULL, *pooled = NULL;
  cudaStream_t s;
  cudaEvent_t e;
  CU_ASSERT_EQUAL_FATAL(cudaMalloc(&a, 16 * MiB), cudaSuccess);
  CU_ASSERT_EQUAL_FATAL(cudaMallocHost(&h, 4096), cudaSuccess);
  CU_ASSERT_EQUAL_FATAL(cudaMallocAsync(&pooled, 4 * MiB, NULL), cudaSuccess);
  CU_ASSERT_EQUAL_FATAL(cudaStreamCreate(&s), cudaSuccess);
  CU_ASSERT_EQUAL_FATAL(cudaEventCreate(&e), cudaSuccess);
  size_t fr, tot;
  CU_ASSERT_EQUAL(cudaMemGetInfo(&fr, &tot), cudaSuccess);
  CU_ASSERT_EQUAL(fr, tot - 20 * MiB);
  pthread_t t;
  CU_ASSERT_EQUAL_FATAL(pthread_barrier_init(&reset_bar, NULL, 2), 0);
  CU_ASSERT_EQUAL_FATAL(pthread_create(&t, NULL, reset_other, NULL), 0);
  pthread_barrier_wait(&reset_bar);
  wltest_driver_stats_t st0 = stats();
  CU_ASSERT_EQUAL(cudaDeviceReset(), cudaSuccess);
  wltest_driver_stats_t st = stats();
  CU_ASSERT_EQUAL(st.calls[WLTEST_FN_cuDevicePrimaryCtxReset_v2],
                  st0.calls[WLTEST_FN_cuDevicePrimaryCtxReset_v2] + 1);
  CU_ASSERT_EQUAL(st.resets, st0.resets + 1);
  CU_ASSERT_EQUAL(st.primary_refs, st0.primary_refs - 1); /* the runtime's retain */
  CU_ASSERT_EQUAL(st.used, 4 * MiB);                      /* the pool's */
  CU_ASSERT_EQUAL(st.host_allocs, 0);
  CU_ASSERT_EQUAL(st.streams, 0);
  CU_ASSERT_EQUAL(st.events, 0);
  pthread_barrier_wait(&reset_bar);
  void *rc = NULL;
  pthread_join(t, &rc);
  CU_ASSERT_EQUAL((cudaError_t)(uintptr_t)rc, cudaSuccess);
  pthread_barrier_destroy(&reset_bar);
  CU_ASSERT_EQUAL(stats().primary_refs, st0.primary_refs); /* retained again */
  /* The old objects are the driver's unknown ones now. */
  uint64_t m = stats().misuse;
  CU_ASSERT_EQUAL(cudaFree(a), cudaErrorInvalidValue);
  CU_ASSERT_EQUAL(cudaFreeHost(h), cudaErrorInvalidValue);
  CU_ASSERT_EQUAL(cudaStreamQuery(s), cudaErrorInvalidResourceHandle);
  CU_ASSERT_EQUAL(cudaEventQuery(e), cudaErrorInvalidResourceHandle);
  CU_ASSERT_EQUAL(cudaGetLastError(), cudaErrorInvalidResourceHandle);
  CU_ASSERT_EQUAL(stats().misuse, m + 4);
  /* Stream-ordered memory stays until freed. */
  CU_ASSERT_EQUAL(cudaFreeAsync(pooled, NULL), cudaSuccess);
  CU_ASSERT_EQUAL(cudaDeviceSynchronize(), cudaSuccess);
  CU_ASSERT_EQUAL(cudaMemGetInfo(&fr, &tot), cudaSuccess);
  CU_ASSERT_EQUAL(fr, tot);
  /* Everything works afresh; a second reset in a row too. */
  CU_ASSERT_EQUAL_FATAL(cudaMalloc(&a, 8 * MiB), cudaSuccess);
  CU_ASSERT_EQUAL(cudaMemset(a, 1, 8 * MiB), cudaSuccess);
  CU_ASSERT_EQUAL_FATAL(cudaStreamCreate(&s), cudaSuccess);
  CU_ASSERT_EQUAL(cudaStreamSynchronize(s), cudaSuccess);
  CU_ASSERT_EQUAL(cudaDeviceReset(), cudaSuccess);
  CU_ASSERT_EQUAL(cudaDeviceReset(), cudaSuccess);
  CU_ASSERT_EQUAL(stats().resets, st0.resets + 3);
  CU_ASSERT_EQUAL(cudaMemGetInfo(&fr, &tot), cudaSuccess);
  CU_ASSERT_EQUAL(fr, tot);
  CU_ASSERT_EQUAL(cudaMalloc(&a, 4096), cudaSuccess);
  CU_ASSERT_EQUAL(cudaFree(a), cudaSuccess);
  CU_ASSERT_EQUAL(stats().misuse, m + 4);
}

/* ---- several devices (WLTEST_DEVICE_COUNT) ---------------------------------------------------*/

static size_t rt_free(int device) {
  size_t fr = 0, tot = 0;
  if (cudaSetDevice(device) != cudaSuccess || cudaMemGetInfo(&fr, &tot) != cudaSuccess) return 1;
  return fr;
}

/* The device an address belongs to, asked of the driver: -1 when it does not know it. */
static int ptr_device(void *p) {
  CUresult (*get)(void *, CUpointer_attribute, CUdeviceptr);
  void *sym = dlsym(drv, "cuPointerGetAttribute");
  if (!sym) return -2;
  memcpy(&get, &sym, sizeof sym);
  int v = -1;
  return get(&v, CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL, (CUdeviceptr)(uintptr_t)p) == CUDA_SUCCESS
             ? v
             : -1;
}

/* A thread starts on device 0, whatever another thread set. */
static void *device_other(void *arg) {
  (void)arg;
  int d = -1;
  if (cudaGetDevice(&d) != cudaSuccess || d != 0) return (void *)1;
  if (cudaSetDevice(1) != cudaSuccess || cudaGetDevice(&d) != cudaSuccess || d != 1)
    return (void *)2;
  return NULL;
}

/* With WLTEST_DEVICE_COUNT=2 (the test runs itself again with it set): the runtime counts two
 * devices; the current device is per thread; cudaMalloc and cudaMallocHost go to the current
 * device's primary context and cudaMemGetInfo answers for it; cudaDeviceReset resets the calling
 * thread's device only. */
static void test_multi_device(void) {
  if (!getenv("WLTEST_DEVICE_COUNT")) {
    CU_ASSERT_TRUE(
        wl_test_rerun("WLTEST_DEVICE_COUNT", "2", "test_doubles_runtime", "multi_device"));
    return;
  }
  int n = 0, d = -1;
  CU_ASSERT_EQUAL(cudaGetDeviceCount(&n), cudaSuccess);
  CU_ASSERT_EQUAL_FATAL(n, 2);
  CU_ASSERT_TRUE_FATAL(find_stats());
  CU_ASSERT_EQUAL(cudaSetDevice(2), cudaErrorInvalidDevice);
  CU_ASSERT_EQUAL(cudaGetLastError(), cudaErrorInvalidDevice);
  CU_ASSERT_EQUAL(cudaGetDevice(&d), cudaSuccess);
  CU_ASSERT_EQUAL(d, 0);
  struct cudaDeviceProp prop;
  CU_ASSERT_EQUAL(cudaGetDeviceProperties(&prop, 1), cudaSuccess);
  CU_ASSERT_EQUAL(prop.pciBusID, 0x1c);
  CU_ASSERT_EQUAL(prop.totalGlobalMem, 64 * MiB);

  void *a0 = NULL, *a1 = NULL, *h1 = NULL;
  cudaStream_t s1;
  CU_ASSERT_EQUAL_FATAL(cudaMalloc(&a0, 4 * MiB), cudaSuccess);
  CU_ASSERT_EQUAL_FATAL(cudaSetDevice(1), cudaSuccess);
  CU_ASSERT_EQUAL(cudaGetDevice(&d), cudaSuccess);
  CU_ASSERT_EQUAL(d, 1);
  CU_ASSERT_EQUAL_FATAL(cudaMalloc(&a1, 8 * MiB), cudaSuccess);
  CU_ASSERT_EQUAL_FATAL(cudaMallocHost(&h1, 4096), cudaSuccess);
  CU_ASSERT_EQUAL_FATAL(cudaStreamCreate(&s1), cudaSuccess);
  CU_ASSERT_EQUAL(ptr_device(a0), 0);
  CU_ASSERT_EQUAL(ptr_device(a1), 1);
  CU_ASSERT_EQUAL(ptr_device(h1), 1);
  wltest_driver_stats_t st = stats();
  CU_ASSERT_EQUAL(st.device_used[0], 4 * MiB);
  CU_ASSERT_EQUAL(st.device_used[1], 8 * MiB);
  CU_ASSERT_EQUAL(rt_free(1), 56 * MiB);
  CU_ASSERT_EQUAL(rt_free(0), 60 * MiB);
  /* Another thread has a current device of its own. */
  pthread_t t;
  void *rc = (void *)9;
  CU_ASSERT_EQUAL_FATAL(pthread_create(&t, NULL, device_other, NULL), 0);
  pthread_join(t, &rc);
  CU_ASSERT_PTR_NULL(rc);
  CU_ASSERT_EQUAL(cudaGetDevice(&d), cudaSuccess);
  CU_ASSERT_EQUAL(d, 0);

  /* Resetting device 1 leaves device 0 alone. */
  uint64_t m = stats().misuse, resets = stats().resets;
  CU_ASSERT_EQUAL_FATAL(cudaSetDevice(1), cudaSuccess);
  CU_ASSERT_EQUAL(cudaDeviceReset(), cudaSuccess);
  CU_ASSERT_EQUAL(stats().resets, resets + 1);
  CU_ASSERT_EQUAL(ptr_device(a1), -1);
  CU_ASSERT_EQUAL(ptr_device(h1), -1);
  CU_ASSERT_EQUAL(ptr_device(a0), 0);
  CU_ASSERT_EQUAL(stats().device_used[1], 0);
  CU_ASSERT_EQUAL(rt_free(1), 64 * MiB);
  CU_ASSERT_EQUAL(rt_free(0), 60 * MiB);
  CU_ASSERT_EQUAL(cudaMemset(a0, 3, 4 * MiB), cudaSuccess);
  CU_ASSERT_EQUAL(((unsigned char *)a0)[4 * MiB - 1], 3);
  CU_ASSERT_EQUAL(stats().misuse, m);
  CU_ASSERT_EQUAL(cudaSetDevice(1), cudaSuccess);
  CU_ASSERT_EQUAL(cudaStreamQuery(s1), cudaErrorInvalidResourceHandle);
  CU_ASSERT_EQUAL(cudaFree(a1), cudaErrorInvalidValue);
  CU_ASSERT_EQUAL(stats().misuse, m + 2);
  /* Device 1 works afresh; device 0's memory frees as usual. */
  CU_ASSERT_EQUAL_FATAL(cudaMalloc(&a1, MiB), cudaSuccess);
  CU_ASSERT_EQUAL(ptr_device(a1), 1);
  CU_ASSERT_EQUAL(cudaFree(a1), cudaSuccess);
  CU_ASSERT_EQUAL(cudaSetDevice(0), cudaSuccess);
  CU_ASSERT_EQUAL(cudaFree(a0), cudaSuccess);
  CU_ASSERT_EQUAL(stats().used, 0);
  CU_ASSERT_EQUAL(stats().misuse, m + 2);
}

/* An invalid WLTEST_DEVICE_COUNT leaves one device, for the runtime too. */
static void test_device_count_invalid(void) {
  if (!getenv("WLTEST_DEVICE_COUNT")) {
    CU_ASSERT_TRUE(
        wl_test_rerun("WLTEST_DEVICE_COUNT", "0", "test_doubles_runtime", "device_count_invalid"));
    return;
  }
  int n = 0;
  CU_ASSERT_EQUAL(cudaGetDeviceCount(&n), cudaSuccess);
  CU_ASSERT_EQUAL(n, 1);
  CU_ASSERT_EQUAL(cudaSetDevice(1), cudaErrorInvalidDevice);
}

int main(int argc, char **argv) {
  if (argc > 2 && strcmp(argv[1], "--child-ipc") == 0) return child_ipc(argv[2]);
  static const wl_test_case_t cases[] = {
      {"init_through_getproc", test_init_through_getproc},
      {"errors_and_oom", test_errors_and_oom},
      {"async_pinned_events", test_async_pinned_events},
      {"driver_entry_points", test_driver_entry_points},
      {"ipc", test_ipc},
      {"device_reset", test_device_reset},
      {"multi_device", test_multi_device},
      {"device_count_invalid", test_device_count_invalid},
      {NULL, NULL},
  };
  return wl_test_main(argc, argv, "doubles_runtime", cases);
}
