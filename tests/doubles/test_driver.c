/* Tests of the CUDA driver double itself (linked against build/tests/doubles/libcuda.so.1):
 * cuGetProcAddress's version and flag semantics, launches that complete on the simulated
 * timeline and run their host twins, out-of-memory at the capacity, pools, capture and graphs
 * (node by node too, cloned, updated), VMM handles shared as file descriptors and cuMemAlloc
 * memory shared by CUDA IPC (with other processes: this executable run again), contexts the
 * program creates and the per-thread context stack, several devices (WLTEST_DEVICE_COUNT, this
 * executable run again), and the misuse it refuses. The ctest entry sets WLTEST_DEVICE_MEM=64M. */
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "driver.h"
#include "wltest.h"

/* The deprecated launch entry points are tested too. */
#pragma GCC diagnostic ignored "-Wdeprecated-declarations"

#define MiB ((size_t)1 << 20)

/* A PTX image naming the kernels the tests launch (the double runs no device code). */
static const char ptx[] = ".version 8.0\n.target sm_80\n.address_size 64\n"
                          ".visible .entry wl_t_add(.param .u64 p, .param .u32 k) { ret; }\n"
                          ".visible .entry wl_t_slow() { ret; }\n";

/* The twin of wl_t_add: p[0] += k. Exported from this executable (ENABLE_EXPORTS). */
__attribute__((visibility("default"))) void wltest_host_wl_t_add(const wltest_launch_t *l);
__attribute__((visibility("default"))) extern const unsigned wltest_argsizes_wl_t_add[];
static int twin_runs;
void wltest_host_wl_t_add(const wltest_launch_t *l) {
  unsigned *p = *(unsigned **)l->args[0];
  p[0] += *(unsigned *)l->args[1];
  twin_runs++;
}
const unsigned wltest_argsizes_wl_t_add[] = {sizeof(void *), sizeof(unsigned), 0};

static CUcontext ctx;
static CUmodule mod;
static CUfunction f_add, f_slow;

static wltest_driver_stats_t stats(void) {
  wltest_driver_stats_t s;
  wltest_driver_stats(&s);
  return s;
}

static uint64_t now_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

/* Runs first: cuGetProcAddress works before cuInit, as the runtime needs. */
static void test_getproc_versions(void) {
  void *p = NULL;
  CUdriverProcAddressQueryResult st;
  CU_ASSERT_EQUAL(cuGetProcAddress_v2("cuMemAlloc", &p, 3020, 0, &st), CUDA_SUCCESS);
  CU_ASSERT_EQUAL(st, CU_GET_PROC_ADDRESS_SUCCESS);
  CU_ASSERT_PTR_EQUAL(p, (void *)cuMemAlloc_v2);
  CU_ASSERT_EQUAL(cuGetProcAddress_v2("cuMemAlloc", &p, 2000, 0, &st), CUDA_SUCCESS);
  CU_ASSERT_PTR_EQUAL(p, (void *)cuMemAlloc_v1);
  CU_ASSERT_PTR_EQUAL(p, dlsym(RTLD_DEFAULT, "cuMemAlloc"));
  /* Too old a version for the name: success, NULL, and the status says why. */
  CU_ASSERT_EQUAL(cuGetProcAddress_v2("cuMemAllocAsync", &p, 11000, 0, &st), CUDA_SUCCESS);
  CU_ASSERT_PTR_NULL(p);
  CU_ASSERT_EQUAL(st, CU_GET_PROC_ADDRESS_VERSION_NOT_SUFFICIENT);
  CU_ASSERT_EQUAL(cuGetProcAddress_v2("cuNoSuchThing", &p, 13000, 0, &st), CUDA_SUCCESS);
  CU_ASSERT_PTR_NULL(p);
  CU_ASSERT_EQUAL(st, CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND);
  /* Per-thread twins only with the flag; a name without one falls back to the legacy one. */
  CU_ASSERT_EQUAL(cuGetProcAddress_v2("cuLaunchKernel", &p, 13000,
                                      CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM, &st),
                  CUDA_SUCCESS);
  CU_ASSERT_PTR_EQUAL(p, (void *)cuLaunchKernel_ptsz);
  CU_ASSERT_EQUAL(cuGetProcAddress_v2("cuLaunchKernel", &p, 6050,
                                      CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM, &st),
                  CUDA_SUCCESS);
  CU_ASSERT_PTR_EQUAL(p, (void *)cuLaunchKernel); /* the _ptsz twin came with 7.0 */
  CU_ASSERT_EQUAL(cuGetProcAddress_v2("cuLaunchKernel", &p, 13000, 0, &st), CUDA_SUCCESS);
  CU_ASSERT_PTR_EQUAL(p, (void *)cuLaunchKernel);
  CU_ASSERT_EQUAL(cuGetProcAddress_v2("cuMemFree", &p, 13000,
                                      CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM, &st),
                  CUDA_SUCCESS);
  CU_ASSERT_PTR_EQUAL(p, (void *)cuMemFree_v2);
  CU_ASSERT_EQUAL(cuGetProcAddress_v2("cuCtxSynchronize", &p, 12080, 0, &st), CUDA_SUCCESS);
  CU_ASSERT_PTR_EQUAL(p, (void *)cuCtxSynchronize);
  CU_ASSERT_EQUAL(cuGetProcAddress_v2("cuCtxSynchronize", &p, 13000, 0, &st), CUDA_SUCCESS);
  CU_ASSERT_PTR_EQUAL(p, (void *)cuCtxSynchronize_v2);
  /* Itself, at both versions (the runtime asks). */
  CU_ASSERT_EQUAL(cuGetProcAddress_v2("cuGetProcAddress", &p, 13000, 0, &st), CUDA_SUCCESS);
  CU_ASSERT_PTR_EQUAL(p, (void *)cuGetProcAddress_v2);
  CU_ASSERT_EQUAL(cuGetProcAddress_v1("cuGetProcAddress", &p, 11030, 0), CUDA_SUCCESS);
  CU_ASSERT_PTR_EQUAL(p, (void *)cuGetProcAddress_v1);
  /* Misuse: a version newer than the driver, unknown flags, NULL arguments. */
  uint64_t m = stats().misuse;
  CU_ASSERT_EQUAL(cuGetProcAddress_v2("cuMemAlloc", &p, 99000, 0, &st), CUDA_ERROR_INVALID_VALUE);
  CU_ASSERT_EQUAL(cuGetProcAddress_v2("cuMemAlloc", &p, 13000, 8, &st), CUDA_ERROR_INVALID_VALUE);
  CU_ASSERT_EQUAL(cuGetProcAddress_v2(NULL, &p, 13000, 0, &st), CUDA_ERROR_INVALID_VALUE);
  CU_ASSERT_EQUAL(stats().misuse - m, 3);
  CU_ASSERT(stats().calls[WLTEST_FN_cuGetProcAddress_v2] >= 12);
}

/* Every exported entry point is reachable by cuGetProcAddress under some base name. */
static void test_getproc_covers_exports(void) {
  static const char *const exported[] = {
#define NAME_(f) #f,
      WLTEST_DRIVER_FNS(NAME_)
#undef NAME_
  };
  for (size_t i = 0; i < sizeof exported / sizeof exported[0]; i++) {
    void *want = dlsym(RTLD_DEFAULT, exported[i]);
    CU_ASSERT_PTR_NOT_NULL(want);
    /* Strip _ptsz/_ptds and _vN to get the base name. */
    char base[96];
    snprintf(base, sizeof base, "%s", exported[i]);
    bool pt = false;
    char *u;
    if ((u = strstr(base, "_ptsz")) || (u = strstr(base, "_ptds"))) {
      *u = 0;
      pt = true;
    }
    if ((u = strrchr(base, '_')) && u[1] == 'v' && u[2] >= '0' && u[2] <= '9') *u = 0;
    bool found = false;
    for (int v = 2000; v <= 13000 && !found; v += 10) {
      void *p = NULL;
      cuGetProcAddress_v2(base, &p, v, pt ? CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM : 0,
                          NULL);
      found = p == want;
    }
    if (!found) fprintf(stderr, "not reachable by cuGetProcAddress: %s\n", exported[i]);
    CU_ASSERT(found);
  }
}

static void test_init(void) {
  CU_ASSERT_EQUAL(cuInit(0), CUDA_SUCCESS);
  CU_ASSERT_EQUAL(cuDevicePrimaryCtxRetain(&ctx, 0), CUDA_SUCCESS);
  CU_ASSERT_EQUAL(cuCtxSetCurrent(ctx), CUDA_SUCCESS);
  CU_ASSERT_EQUAL(stats().capacity, 64 * MiB);
  CU_ASSERT_EQUAL(cuModuleLoadData(&mod, ptx), CUDA_SUCCESS);
  CU_ASSERT_EQUAL(cuModuleGetFunction(&f_add, mod, "wl_t_add"), CUDA_SUCCESS);
  /* The duration of a kernel is read when its function is first looked up. */
  setenv("WLTEST_KERNEL_NS_wl_t_slow", "50000000", 1);
  CU_ASSERT_EQUAL(cuModuleGetFunction(&f_slow, mod, "wl_t_slow"), CUDA_SUCCESS);
  CUfunction again;
  CU_ASSERT_EQUAL(cuModuleGetFunction(&again, mod, "wl_t_add"), CUDA_SUCCESS);
  CU_ASSERT_PTR_EQUAL(again, f_add);
  uint64_t m = stats().misuse;
  CU_ASSERT_EQUAL(cuModuleGetFunction(&again, mod, "wl_t_absent"), CUDA_ERROR_NOT_FOUND);
  CU_ASSERT_EQUAL(cuModuleLoadData(&mod, "not an image"), CUDA_ERROR_INVALID_IMAGE);
  CU_ASSERT_EQUAL(stats().misuse - m, 2);
  char name[64], bus[16];
  CU_ASSERT_EQUAL(cuDeviceGetName(name, sizeof name, 0), CUDA_SUCCESS);
  CU_ASSERT_EQUAL(cuDeviceGetPCIBusId(bus, sizeof bus, 0), CUDA_SUCCESS);
  CUuuid a, b;
  CU_ASSERT_EQUAL(cuDeviceGetUuid_v2(&a, 0), CUDA_SUCCESS);
  CU_ASSERT_EQUAL(cuDeviceGetUuid_v1(&b, 0), CUDA_SUCCESS);
  CU_ASSERT_EQUAL(memcmp(&a, &b, sizeof a), 0);
}

/* The twin runs at enqueue; completion waits for the hold, then for the simulated duration. */
static void test_launch_timeline(void) {
  CUstream s;
  CUevent e0, e1;
  CU_ASSERT_EQUAL_FATAL(cuStreamCreate(&s, CU_STREAM_NON_BLOCKING), CUDA_SUCCESS);
  CU_ASSERT_EQUAL(cuEventCreate(&e0, 0), CUDA_SUCCESS);
  CU_ASSERT_EQUAL(cuEventCreate(&e1, 0), CUDA_SUCCESS);
  CUdeviceptr buf;
  CU_ASSERT_EQUAL_FATAL(cuMemAlloc_v2(&buf, 4096), CUDA_SUCCESS);
  CU_ASSERT_EQUAL(cuMemsetD32_v2(buf, 0, 1024), CUDA_SUCCESS);
  unsigned k = 5;
  void *args[] = {&buf, &k};
  int runs = twin_runs;
  CU_ASSERT_EQUAL(wltest_stream_hold(s), 0);
  CU_ASSERT_EQUAL(cuLaunchKernel(f_add, 1, 1, 1, 32, 1, 1, 0, s, args, NULL), CUDA_SUCCESS);
  CU_ASSERT_EQUAL(twin_runs, runs + 1);
  CU_ASSERT_EQUAL(*(unsigned *)(uintptr_t)buf, 5); /* the effect is already there */
  CU_ASSERT_EQUAL(cuEventRecord(e0, s), CUDA_SUCCESS);
  CU_ASSERT_EQUAL(cuLaunchKernel(f_slow, 1, 1, 1, 1, 1, 1, 0, s, NULL, NULL), CUDA_SUCCESS);
  CU_ASSERT_EQUAL(cuEventRecord(e1, s), CUDA_SUCCESS);
  /* Held: nothing completes. */
  CU_ASSERT_EQUAL(cuEventQuery(e0), CUDA_ERROR_NOT_READY);
  CU_ASSERT_EQUAL(cuStreamQuery(s), CUDA_ERROR_NOT_READY);
  float ms = -1;
  CU_ASSERT_EQUAL(cuEventElapsedTime_v2(&ms, e0, e1), CUDA_ERROR_NOT_READY);
  uint64_t t0 = now_ns();
  CU_ASSERT_EQUAL(wltest_stream_release(s), 0);
  CU_ASSERT_EQUAL(cuEventSynchronize(e1), CUDA_SUCCESS);
  /* Lower bounds only: the slow kernel's 50 ms lie between the two events. */
  CU_ASSERT(now_ns() - t0 >= 50000000ull);
  CU_ASSERT_EQUAL(cuEventQuery(e0), CUDA_SUCCESS);
  CU_ASSERT_EQUAL(cuStreamQuery(s), CUDA_SUCCESS);
  CU_ASSERT_EQUAL(cuEventElapsedTime_v2(&ms, e0, e1), CUDA_SUCCESS);
  CU_ASSERT(ms >= 50.0f);
  CU_ASSERT_EQUAL(cuEventElapsedTime_v1(&ms, e0, e1), CUDA_SUCCESS);
  CU_ASSERT(ms >= 50.0f);
  /* A stream waiting on an event of another completes after it. */
  CUstream s2;
  CU_ASSERT_EQUAL(cuStreamCreate(&s2, 0), CUDA_SUCCESS);
  CU_ASSERT_EQUAL(cuLaunchKernel(f_slow, 1, 1, 1, 1, 1, 1, 0, s, NULL, NULL), CUDA_SUCCESS);
  CU_ASSERT_EQUAL(cuEventRecord(e0, s), CUDA_SUCCESS);
  CU_ASSERT_EQUAL(cuStreamWaitEvent(s2, e0, 0), CUDA_SUCCESS);
  CU_ASSERT_EQUAL(cuEventRecord(e1, s2), CUDA_SUCCESS);
  CU_ASSERT_EQUAL(cuEventSynchronize(e1), CUDA_SUCCESS);
  CU_ASSERT_EQUAL(cuEventQuery(e0), CUDA_SUCCESS);
  CU_ASSERT_EQUAL(cuCtxSynchronize(), CUDA_SUCCESS);
  CU_ASSERT_EQUAL(cuStreamDestroy_v2(s2), CUDA_SUCCESS);
  CU_ASSERT_EQUAL(cuEventDestroy_v2(e0), CUDA_SUCCESS);
  CU_ASSERT_EQUAL(cuEventDestroy_v2(e1), CUDA_SUCCESS);
  CU_ASSERT_EQUAL(cuMemFree_v2(buf), CUDA_SUCCESS);
  CU_ASSERT_EQUAL(cuStreamDestroy_v2(s), CUDA_SUCCESS);
}

static void test_launch_misuse(void) {
  uint64_t m = stats().misuse;
  CU_ASSERT_EQUAL(cuLaunchKernel((CUfunction)(void *)&m, 1, 1, 1, 1, 1, 1, 0, NULL, NULL, NULL),
                  CUDA_ERROR_INVALID_HANDLE);
  CU_ASSERT_EQUAL(cuLaunchKernel(f_slow, 1, 1, 1, 2048, 1, 1, 0, NULL, NULL, NULL),
                  CUDA_ERROR_INVALID_VALUE);
  CU_ASSERT_EQUAL(cuLaunchKernel(f_slow, 0, 1, 1, 1, 1, 1, 0, NULL, NULL, NULL),
                  CUDA_ERROR_INVALID_VALUE);
  CU_ASSERT_EQUAL(cuLaunchKernel(f_slow, 1, 1, 1, 1, 1, 1, 0, (CUstream)(void *)&m, NULL, NULL),
                  CUDA_ERROR_INVALID_HANDLE);
  CU_ASSERT_EQUAL(stats().misuse - m, 4);
  /* Without a current context. */
  CU_ASSERT_EQUAL(cuCtxSetCurrent(NULL), CUDA_SUCCESS);
  CU_ASSERT_EQUAL(cuLaunchKernel(f_slow, 1, 1, 1, 1, 1, 1, 0, NULL, NULL, NULL),
                  CUDA_ERROR_INVALID_CONTEXT);
  CU_ASSERT_EQUAL(cuCtxSetCurrent(ctx), CUDA_SUCCESS);
}

/* The deprecated launches: the block shape, shared size and parameters set beforehand, the twin
 * fed from the parameter bytes; another kind of launch invalidates that state. */
static void test_launch_deprecated(void) {
  CUdeviceptr buf;
  CU_ASSERT_EQUAL_FATAL(cuMemAlloc_v2(&buf, 4096), CUDA_SUCCESS);
  CU_ASSERT_EQUAL(cuMemsetD32_v2(buf, 0, 1024), CUDA_SUCCESS);
  CUstream s;
  CU_ASSERT_EQUAL_FATAL(cuStreamCreate(&s, CU_STREAM_NON_BLOCKING), CUDA_SUCCESS);
  uint64_t launches = stats().launches, m = stats().misuse;
  int runs = twin_runs;
  CU_ASSERT_EQUAL(cuFuncSetBlockShape(f_add, 32, 2, 1), CUDA_SUCCESS);
  CU_ASSERT_EQUAL(cuFuncSetSharedSize(f_add, 128), CUDA_SUCCESS);
  CU_ASSERT_EQUAL(cuParamSetSize(f_add, 12), CUDA_SUCCESS);
  CU_ASSERT_EQUAL(cuParamSetv(f_add, 0, &buf, sizeof buf), CUDA_SUCCESS);
  CU_ASSERT_EQUAL(cuParamSeti(f_add, 8, 3), CUDA_SUCCESS);
  CU_ASSERT_EQUAL(cuLaunch(f_add), CUDA_SUCCESS);
  CU_ASSERT_EQUAL(cuParamSeti(f_add, 8, 4), CUDA_SUCCESS);
  CU_ASSERT_EQUAL(cuLaunchGrid(f_add, 2, 3), CUDA_SUCCESS);
  CU_ASSERT_EQUAL(cuLaunchGridAsync(f_add, 4, 1, s), CUDA_SUCCESS);
  CU_ASSERT_EQUAL(twin_runs, runs + 3);
  CU_ASSERT_EQUAL(stats().launches - launches, 3);
  CU_ASSERT_EQUAL(*(unsigned *)(uintptr_t)buf, 11);
  CU_ASSERT_EQUAL(cuParamSetf(f_add, 8, 1.0f), CUDA_SUCCESS);
  CU_ASSERT_EQUAL(stats().misuse, m);
  /* Refused: a parameter past the limit, too few parameter bytes, a bad grid. */
  CU_ASSERT_EQUAL(cuParamSetv(f_add, 4095, &buf, sizeof buf), CUDA_ERROR_INVALID_VALUE);
  CU_ASSERT_EQUAL(cuParamSetSize(f_add, 8), CUDA_SUCCESS);
  CU_ASSERT_EQUAL(cuLaunch(f_add), CUDA_ERROR_INVALID_VALUE);
  CU_ASSERT_EQUAL(cuParamSetSize(f_add, 12), CUDA_SUCCESS);
  CU_ASSERT_EQUAL(cuLaunchGrid(f_add, 0, 1), CUDA_ERROR_INVALID_VALUE);
  /* cuLaunchKernel invalidates the state: the block shape is needed again. */
  unsigned k = 1;
  void *args[] = {&buf, &k};
  CU_ASSERT_EQUAL(cuLaunchKernel(f_add, 1, 1, 1, 32, 1, 1, 0, s, args, NULL), CUDA_SUCCESS);
  CU_ASSERT_EQUAL(cuLaunchGridAsync(f_add, 1, 1, s), CUDA_ERROR_INVALID_VALUE);
  CU_ASSERT_EQUAL(stats().misuse - m, 4);
  /* The multi-device cooperative launch: one launch per entry, never on a default stream. */
  CUDA_LAUNCH_PARAMS lp = {.function = f_add,
                           .gridDimX = 1,
                           .gridDimY = 1,
                           .gridDimZ = 1,
                           .blockDimX = 32,
                           .blockDimY = 1,
                           .blockDimZ = 1,
                           .hStream = s,
                           .kernelParams = args};
  launches = stats().launches;
  CU_ASSERT_EQUAL(cuLaunchCooperativeKernelMultiDevice(&lp, 1, 0), CUDA_SUCCESS);
  CU_ASSERT_EQUAL(stats().launches - launches, 1);
  CU_ASSERT_EQUAL(*(unsigned *)(uintptr_t)buf, 13);
  lp.hStream = NULL;
  CU_ASSERT_EQUAL(cuLaunchCooperativeKernelMultiDevice(&lp, 1, 0), CUDA_ERROR_INVALID_HANDLE);
  CU_ASSERT_EQUAL(stats().misuse - m, 5);
  CU_ASSERT_EQUAL(cuStreamSynchronize(s), CUDA_SUCCESS);
  CU_ASSERT_EQUAL(cuStreamDestroy_v2(s), CUDA_SUCCESS);
  CU_ASSERT_EQUAL(cuMemFree_v2(buf), CUDA_SUCCESS);
}

/* The legacy default stream waits for blocking streams, not for non-blocking ones. */
static void test_legacy_stream_sync(void) {
  CUstream blocking, nonblocking;
  CUevent e;
  CU_ASSERT_EQUAL_FATAL(cuStreamCreate(&blocking, 0), CUDA_SUCCESS);
  CU_ASSERT_EQUAL_FATAL(cuStreamCreate(&nonblocking, CU_STREAM_NON_BLOCKING), CUDA_SUCCESS);
  CU_ASSERT_EQUAL_FATAL(cuEventCreate(&e, CU_EVENT_DISABLE_TIMING), CUDA_SUCCESS);
  CU_ASSERT_EQUAL(wltest_stream_hold(nonblocking), 0);
  CU_ASSERT_EQUAL(cuEventRecord(e, NULL), CUDA_SUCCESS);
  CU_ASSERT_EQUAL(cuEventQuery(e), CUDA_SUCCESS);
  CU_ASSERT_EQUAL(wltest_stream_hold(blocking), 0);
  CU_ASSERT_EQUAL(cuEventRecord(e, NULL), CUDA_SUCCESS);
  CU_ASSERT_EQUAL(cuEventQuery(e), CUDA_ERROR_NOT_READY);
  CU_ASSERT_EQUAL(wltest_stream_release(blocking), 0);
  CU_ASSERT_EQUAL(cuEventSynchronize(e), CUDA_SUCCESS);
  /* And the other way: a blocking stream's work waits for the legacy stream's. */
  CU_ASSERT_EQUAL(wltest_stream_hold(NULL), 0);
  CU_ASSERT_EQUAL(cuEventRecord(e, blocking), CUDA_SUCCESS);
  CU_ASSERT_EQUAL(cuEventQuery(e), CUDA_ERROR_NOT_READY);
  CU_ASSERT_EQUAL(wltest_stream_release(NULL), 0);
  CU_ASSERT_EQUAL(cuStreamSynchronize(blocking), CUDA_SUCCESS);
  CU_ASSERT_EQUAL(cuEventQuery(e), CUDA_SUCCESS);
  CU_ASSERT_EQUAL(wltest_stream_release(nonblocking), 0);
  CU_ASSERT_EQUAL(cuEventDestroy_v2(e), CUDA_SUCCESS);
  CU_ASSERT_EQUAL(cuStreamDestroy_v2(blocking), CUDA_SUCCESS);
  CU_ASSERT_EQUAL(cuStreamDestroy_v2(nonblocking), CUDA_SUCCESS);
}

static void test_oom_at_capacity(void) {
  size_t fr, tot;
  CU_ASSERT_EQUAL(cuMemGetInfo_v2(&fr, &tot), CUDA_SUCCESS);
  CU_ASSERT_EQUAL(tot, 64 * MiB);
  CU_ASSERT_EQUAL(fr, 64 * MiB);
  CUdeviceptr a, b;
  CU_ASSERT_EQUAL_FATAL(cuMemAlloc_v2(&a, 48 * MiB), CUDA_SUCCESS);
  uint64_t m = stats().misuse;
  CU_ASSERT_EQUAL(cuMemAlloc_v2(&b, 17 * MiB), CUDA_ERROR_OUT_OF_MEMORY);
  CU_ASSERT_EQUAL(stats().misuse, m); /* out of memory is no misuse */
  CU_ASSERT_EQUAL(cuMemGetInfo_v2(&fr, &tot), CUDA_SUCCESS);
  CU_ASSERT_EQUAL(fr, 16 * MiB);
  /* Sizes are charged in 512-byte units, as cudaMalloc aligns them. */
  CU_ASSERT_EQUAL_FATAL(cuMemAlloc_v2(&b, 1), CUDA_SUCCESS);
  CU_ASSERT_EQUAL(stats().linear_bytes, 48 * MiB + 512);
  CU_ASSERT_EQUAL(cuMemFree_v2(b), CUDA_SUCCESS);
  CU_ASSERT_EQUAL(cuMemFree_v2(a), CUDA_SUCCESS);
  CU_ASSERT_EQUAL(cuMemFree_v2(a), CUDA_ERROR_INVALID_VALUE); /* twice: misuse */
  CU_ASSERT_EQUAL(stats().misuse, m + 1);
  CU_ASSERT_EQUAL(stats().used, 0);
  /* Host memory is not device memory. */
  void *h;
  CU_ASSERT_EQUAL(cuMemHostAlloc(&h, 80 * MiB, CU_MEMHOSTALLOC_PORTABLE), CUDA_SUCCESS);
  CU_ASSERT_EQUAL(stats().host_bytes, 80 * MiB);
  CU_ASSERT_EQUAL(cuMemFree_v2((CUdeviceptr)(uintptr_t)h), CUDA_ERROR_INVALID_VALUE);
  CU_ASSERT_EQUAL(cuMemFreeHost(h), CUDA_SUCCESS);
  CU_ASSERT_EQUAL(stats().host_allocs, 0);
}

/* cuMemAllocPitch: rows padded to 512 bytes, charged and freed as device memory; an element size
 * other than 4, 8 or 16 and a NULL pitch are misuse. */
static void test_alloc_pitch(void) {
  CUdeviceptr p;
  size_t pitch = 0;
  uint64_t used = stats().used;
  CU_ASSERT_EQUAL_FATAL(cuMemAllocPitch_v2(&p, &pitch, 100, 10, 4), CUDA_SUCCESS);
  CU_ASSERT_EQUAL(pitch, 512);
  CU_ASSERT_EQUAL(stats().used, used + 5120);
  CU_ASSERT_EQUAL(cuMemsetD8_v2(p, 1, 5120), CUDA_SUCCESS); /* every row, padding too */
  CU_ASSERT_EQUAL(cuMemFree_v2(p), CUDA_SUCCESS);
  CU_ASSERT_EQUAL(stats().used, used);
  CU_ASSERT_EQUAL_FATAL(cuMemAllocPitch_v2(&p, &pitch, 512, 3, 16), CUDA_SUCCESS);
  CU_ASSERT_EQUAL(pitch, 512);
  CU_ASSERT_EQUAL(cuMemFree_v2(p), CUDA_SUCCESS);
  uint64_t m = stats().misuse;
  CU_ASSERT_EQUAL(cuMemAllocPitch_v2(&p, &pitch, 100, 10, 2), CUDA_ERROR_INVALID_VALUE);
  CU_ASSERT_EQUAL(cuMemAllocPitch_v2(&p, NULL, 100, 10, 4), CUDA_ERROR_INVALID_VALUE);
  CU_ASSERT_EQUAL(cuMemAllocPitch_v2(&p, &pitch, SIZE_MAX - 3, 2, 4), CUDA_ERROR_INVALID_VALUE);
  CU_ASSERT_EQUAL(stats().misuse, m + 3);
  CU_ASSERT_EQUAL(stats().used, used);
}

static uint64_t pool_attr(CUmemoryPool p, CUmemPool_attribute a) {
  cuuint64_t v = 0;
  CU_ASSERT_EQUAL(cuMemPoolGetAttribute(p, a, &v), CUDA_SUCCESS);
  return v;
}

/* cuDeviceSetMemPool: cuMemAllocAsync takes the device's current pool, cuDeviceGetMemPool names
 * it; another device's pool is refused; destroying it brings the default pool back. */
static void test_set_mem_pool(void) {
  CUmemoryPool def, mine, cur = NULL, got = NULL;
  CUmemPoolProps props = {.allocType = CU_MEM_ALLOCATION_TYPE_PINNED,
                          .location = {.type = CU_MEM_LOCATION_TYPE_DEVICE, .id = 0}};
  CU_ASSERT_EQUAL_FATAL(cuDeviceGetDefaultMemPool(&def, 0), CUDA_SUCCESS);
  CU_ASSERT_EQUAL_FATAL(cuMemPoolCreate(&mine, &props), CUDA_SUCCESS);
  CU_ASSERT_EQUAL(cuDeviceSetMemPool(0, mine), CUDA_SUCCESS);
  CU_ASSERT_EQUAL(cuDeviceGetMemPool(&cur, 0), CUDA_SUCCESS);
  CU_ASSERT_PTR_EQUAL(cur, mine);
  CUstream s;
  CUdeviceptr a;
  CU_ASSERT_EQUAL_FATAL(cuStreamCreate(&s, 0), CUDA_SUCCESS);
  CU_ASSERT_EQUAL_FATAL(cuMemAllocAsync(&a, 2 * MiB, s), CUDA_SUCCESS);
  CU_ASSERT_EQUAL(cuPointerGetAttribute(&got, CU_POINTER_ATTRIBUTE_MEMPOOL_HANDLE, a),
                  CUDA_SUCCESS);
  CU_ASSERT_PTR_EQUAL(got, mine);
  CU_ASSERT_EQUAL(cuMemFreeAsync(a, s), CUDA_SUCCESS);
  CU_ASSERT_EQUAL(cuStreamSynchronize(s), CUDA_SUCCESS);
  uint64_t m = stats().misuse;
  CU_ASSERT_EQUAL(cuDeviceSetMemPool(0, (CUmemoryPool)&m), CUDA_ERROR_INVALID_VALUE);
  CU_ASSERT_EQUAL(stats().misuse, m + 1);
  CU_ASSERT_EQUAL(cuMemPoolDestroy(mine), CUDA_SUCCESS);
  CU_ASSERT_EQUAL(cuDeviceGetMemPool(&cur, 0), CUDA_SUCCESS);
  CU_ASSERT_PTR_EQUAL(cur, def);
  CU_ASSERT_EQUAL(cuStreamDestroy(s), CUDA_SUCCESS);
}

/* Freed pool memory stays reserved until a synchronisation trims the pool to its threshold. */
static void test_pools(void) {
  CUmemoryPool pool;
  CU_ASSERT_EQUAL_FATAL(cuDeviceGetDefaultMemPool(&pool, 0), CUDA_SUCCESS);
  CUstream s;
  CU_ASSERT_EQUAL_FATAL(cuStreamCreate(&s, 0), CUDA_SUCCESS);
  CUdeviceptr a, b;
  CU_ASSERT_EQUAL_FATAL(cuMemAllocAsync(&a, 8 * MiB, s), CUDA_SUCCESS);
  CU_ASSERT_EQUAL(pool_attr(pool, CU_MEMPOOL_ATTR_USED_MEM_CURRENT), 8 * MiB);
  CU_ASSERT_EQUAL(cuMemFreeAsync(a, s), CUDA_SUCCESS);
  CU_ASSERT_EQUAL(pool_attr(pool, CU_MEMPOOL_ATTR_USED_MEM_CURRENT), 0);
  CU_ASSERT_EQUAL(pool_attr(pool, CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT), 8 * MiB);
  /* The cache serves the next allocation: no more device memory. */
  CU_ASSERT_EQUAL_FATAL(cuMemAllocAsync_ptsz(&b, 8 * MiB, s), CUDA_SUCCESS);
  CU_ASSERT_EQUAL(stats().used, 8 * MiB);
  CU_ASSERT_EQUAL(cuMemFreeAsync_ptsz(b, s), CUDA_SUCCESS);
  CU_ASSERT_EQUAL(cuStreamSynchronize(s), CUDA_SUCCESS);
  CU_ASSERT_EQUAL(pool_attr(pool, CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT), 0);
  CU_ASSERT_EQUAL(pool_attr(pool, CU_MEMPOOL_ATTR_RESERVED_MEM_HIGH), 8 * MiB);
  CU_ASSERT_EQUAL(stats().used, 0);
  /* A high release threshold keeps the cache across synchronisations; TrimTo releases it. */
  cuuint64_t max = UINT64_MAX;
  CU_ASSERT_EQUAL(cuMemPoolSetAttribute(pool, CU_MEMPOOL_ATTR_RELEASE_THRESHOLD, &max),
                  CUDA_SUCCESS);
  CU_ASSERT_EQUAL_FATAL(cuMemAllocFromPoolAsync(&a, 4 * MiB, pool, s), CUDA_SUCCESS);
  CU_ASSERT_EQUAL(cuMemFreeAsync(a, s), CUDA_SUCCESS);
  CU_ASSERT_EQUAL(cuStreamSynchronize(s), CUDA_SUCCESS);
  CU_ASSERT_EQUAL(pool_attr(pool, CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT), 4 * MiB);
  CU_ASSERT_EQUAL(cuMemPoolTrimTo(pool, 0), CUDA_SUCCESS);
  CU_ASSERT_EQUAL(pool_attr(pool, CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT), 0);
  cuuint64_t zero = 0;
  CU_ASSERT_EQUAL(cuMemPoolSetAttribute(pool, CU_MEMPOOL_ATTR_RELEASE_THRESHOLD, &zero),
                  CUDA_SUCCESS);
  /* Past the capacity, counting the pool's cache. */
  CU_ASSERT_EQUAL_FATAL(cuMemAllocAsync(&a, 40 * MiB, s), CUDA_SUCCESS);
  CU_ASSERT_EQUAL(cuMemAllocAsync(&b, 40 * MiB, s), CUDA_ERROR_OUT_OF_MEMORY);
  CU_ASSERT_EQUAL(cuMemFreeAsync(a, s), CUDA_SUCCESS);
  /* cuMemFreeAsync also frees cuMemAlloc memory, but not host memory. */
  uint64_t m = stats().misuse;
  CU_ASSERT_EQUAL(cuMemAlloc_v2(&b, 4096), CUDA_SUCCESS);
  CU_ASSERT_EQUAL(cuMemFreeAsync(b, s), CUDA_SUCCESS);
  void *h;
  CU_ASSERT_EQUAL_FATAL(cuMemAllocHost_v2(&h, 4096), CUDA_SUCCESS);
  CU_ASSERT_EQUAL(cuMemFreeAsync((CUdeviceptr)(uintptr_t)h, s), CUDA_ERROR_INVALID_VALUE);
  CU_ASSERT_EQUAL(stats().misuse, m + 1);
  CU_ASSERT_EQUAL(cuMemFreeHost(h), CUDA_SUCCESS);
  /* A pool of one's own. */
  CUmemPoolProps props = {.allocType = CU_MEM_ALLOCATION_TYPE_PINNED,
                          .location = {.type = CU_MEM_LOCATION_TYPE_DEVICE, .id = 0}};
  CUmemoryPool mine;
  CU_ASSERT_EQUAL_FATAL(cuMemPoolCreate(&mine, &props), CUDA_SUCCESS);
  CU_ASSERT_EQUAL_FATAL(cuMemAllocFromPoolAsync_ptsz(&a, 1 * MiB, mine, NULL), CUDA_SUCCESS);
  CU_ASSERT_EQUAL(cuMemPoolDestroy(mine), CUDA_SUCCESS); /* lives until the free */
  CU_ASSERT_EQUAL(cuMemFreeAsync_ptsz(a, NULL), CUDA_SUCCESS);
  CU_ASSERT_EQUAL(cuStreamSynchronize(s), CUDA_SUCCESS);
  CU_ASSERT_EQUAL(stats().used, 0);
  CU_ASSERT_EQUAL(cuStreamDestroy_v2(s), CUDA_SUCCESS);
}

/* A non-blocking stream and a zeroed device buffer of n bytes, as the graph tests start. */
static CUstream stream_and_zeroed(CUdeviceptr *buf, size_t n) {
  CUstream s = NULL;
  CU_ASSERT_EQUAL_FATAL(cuStreamCreate(&s, CU_STREAM_NON_BLOCKING), CUDA_SUCCESS);
  CU_ASSERT_EQUAL_FATAL(cuMemAlloc_v2(buf, n), CUDA_SUCCESS);
  CU_ASSERT_EQUAL(cuMemsetD8_v2(*buf, 0, n), CUDA_SUCCESS);
  return s;
}

/* Launches on a capturing stream go into the graph; a graph launch replays them, twins
 * included, with the arguments copied at capture. */
static void test_capture_and_graph(void) {
  CUdeviceptr buf;
  CUstream s = stream_and_zeroed(&buf, 512);
  CU_ASSERT_EQUAL(cuStreamBeginCapture_v2(s, CU_STREAM_CAPTURE_MODE_GLOBAL), CUDA_SUCCESS);
  CUstreamCaptureStatus cs;
  CU_ASSERT_EQUAL(cuStreamIsCapturing(s, &cs), CUDA_SUCCESS);
  CU_ASSERT_EQUAL(cs, CU_STREAM_CAPTURE_STATUS_ACTIVE);
  cuuint64_t id = 0;
  CU_ASSERT_EQUAL(cuStreamGetCaptureInfo_v3(s, &cs, &id, NULL, NULL, NULL, NULL), CUDA_SUCCESS);
  CU_ASSERT(id != 0);
  unsigned k = 3;
  void *args[] = {&buf, &k};
  int runs = twin_runs;
  CU_ASSERT_EQUAL(cuLaunchKernel(f_add, 1, 1, 1, 1, 1, 1, 0, s, args, NULL), CUDA_SUCCESS);
  k = 4;
  CU_ASSERT_EQUAL(cuLaunchKernel_ptsz(f_add, 1, 1, 1, 1, 1, 1, 0, s, args, NULL), CUDA_SUCCESS);
  CU_ASSERT_EQUAL(twin_runs, runs); /* captured, not run */
  CUgraph g;
  CU_ASSERT_EQUAL_FATAL(cuStreamEndCapture(s, &g), CUDA_SUCCESS);
  CU_ASSERT_EQUAL(cuStreamIsCapturing(s, &cs), CUDA_SUCCESS);
  CU_ASSERT_EQUAL(cs, CU_STREAM_CAPTURE_STATUS_NONE);
  CUgraphExec x;
  CU_ASSERT_EQUAL_FATAL(cuGraphInstantiateWithFlags(&x, g, 0), CUDA_SUCCESS);
  k = 100; /* changing the argument now changes nothing: it was copied */
  CU_ASSERT_EQUAL(cuGraphLaunch(x, s), CUDA_SUCCESS);
  CU_ASSERT_EQUAL(cuGraphLaunch_ptsz(x, NULL), CUDA_SUCCESS);
  CU_ASSERT_EQUAL(twin_runs, runs + 4);
  CU_ASSERT_EQUAL(*(unsigned *)(uintptr_t)buf, 2 * (3 + 4));
  CU_ASSERT_EQUAL(cuCtxSynchronize(), CUDA_SUCCESS);
  /* A synchronisation inside a capture is refused and invalidates it. */
  uint64_t m = stats().misuse;
  CU_ASSERT_EQUAL(cuStreamBeginCapture_v2(s, CU_STREAM_CAPTURE_MODE_RELAXED), CUDA_SUCCESS);
  CU_ASSERT_EQUAL(cuStreamSynchronize(s), CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED);
  CU_ASSERT_EQUAL(cuStreamIsCapturing(s, &cs), CUDA_SUCCESS);
  CU_ASSERT_EQUAL(cs, CU_STREAM_CAPTURE_STATUS_INVALIDATED);
  CUgraph bad;
  CU_ASSERT_EQUAL(cuStreamEndCapture(s, &bad), CUDA_ERROR_STREAM_CAPTURE_INVALIDATED);
  CU_ASSERT_EQUAL(stats().misuse, m + 1);
  /* Every instantiation variant makes an executable graph of the same launches. */
  CUgraphExec xs[4];
  CUgraphNode errnode = (CUgraphNode)1;
  char logbuf[8] = "x";
  CU_ASSERT_EQUAL(cuGraphInstantiate_v1(&xs[0], g, &errnode, logbuf, sizeof logbuf), CUDA_SUCCESS);
  CU_ASSERT_PTR_NULL(errnode);
  CU_ASSERT_STRING_EQUAL(logbuf, "");
  CU_ASSERT_EQUAL(cuGraphInstantiate_v2(&xs[1], g, NULL, NULL, 0), CUDA_SUCCESS);
  CUDA_GRAPH_INSTANTIATE_PARAMS ip = {.flags = 0, .result_out = CUDA_GRAPH_INSTANTIATE_ERROR};
  CU_ASSERT_EQUAL(cuGraphInstantiateWithParams(&xs[2], g, &ip), CUDA_SUCCESS);
  CU_ASSERT_EQUAL(ip.result_out, CUDA_GRAPH_INSTANTIATE_SUCCESS);
  CU_ASSERT_EQUAL(cuGraphInstantiateWithParams_ptsz(&xs[3], g, &ip), CUDA_SUCCESS);
  runs = twin_runs;
  for (int i = 0; i < 4; i++) {
    CU_ASSERT_EQUAL(cuGraphLaunch(xs[i], s), CUDA_SUCCESS);
    CU_ASSERT_EQUAL(cuGraphExecDestroy(xs[i]), CUDA_SUCCESS);
  }
  CU_ASSERT_EQUAL(twin_runs, runs + 8);
  /* The handle destroyed last is the next one made, as a driver may hand an address out again. */
  CUgraphExec again;
  CU_ASSERT_EQUAL(cuGraphInstantiateWithFlags(&again, g, 0), CUDA_SUCCESS);
  CU_ASSERT_PTR_EQUAL(again, xs[3]);
  CU_ASSERT_EQUAL(cuGraphExecDestroy(again), CUDA_SUCCESS);
  m = stats().misuse;
  CU_ASSERT_EQUAL(cuGraphInstantiateWithParams(&xs[0], g, NULL), CUDA_ERROR_INVALID_VALUE);
  CU_ASSERT_EQUAL(cuGraphInstantiate_v2(&xs[0], (CUgraph)&ip, NULL, NULL, 0),
                  CUDA_ERROR_INVALID_VALUE);
  CU_ASSERT_EQUAL(stats().misuse, m + 2);
  CU_ASSERT_EQUAL(cuGraphExecDestroy(x), CUDA_SUCCESS);
  CU_ASSERT_EQUAL(cuGraphDestroy(g), CUDA_SUCCESS);
  CU_ASSERT_EQUAL(cuStreamBeginCapture_v2(s, CU_STREAM_CAPTURE_MODE_GLOBAL), CUDA_SUCCESS);
  CUgraph g2;
  CU_ASSERT_EQUAL(cuStreamEndCapture(s, &g2), CUDA_SUCCESS);
  CU_ASSERT_PTR_EQUAL(g2, g);
  CU_ASSERT_EQUAL(cuGraphDestroy(g2), CUDA_SUCCESS);
  CU_ASSERT_EQUAL(cuMemFree_v2(buf), CUDA_SUCCESS);
  CU_ASSERT_EQUAL(cuStreamDestroy_v2(s), CUDA_SUCCESS);
}

/* Another thread's capture: begun with mode on s, held until told to end (end_capture's result
 * in ended). */
typedef struct capturer_s {
  CUstream s;
  CUstreamCaptureMode mode;
  pthread_mutex_t mu;
  pthread_cond_t cv;
  int stage; /* 1: capturing (or begin failed: begun set), 2: told to end, 3: ended */
  CUresult begun, ended;
} capturer_t;

static void capturer_set(capturer_t *c, int stage) {
  pthread_mutex_lock(&c->mu);
  c->stage = stage;
  pthread_cond_broadcast(&c->cv);
  pthread_mutex_unlock(&c->mu);
}

static void capturer_wait(capturer_t *c, int stage) {
  pthread_mutex_lock(&c->mu);
  while (c->stage < stage) pthread_cond_wait(&c->cv, &c->mu);
  pthread_mutex_unlock(&c->mu);
}

static void *capturer_main(void *arg) {
  capturer_t *c = arg;
  c->begun = cuCtxSetCurrent(ctx);
  if (c->begun == CUDA_SUCCESS) c->begun = cuStreamBeginCapture_v2(c->s, c->mode);
  capturer_set(c, 1);
  capturer_wait(c, 2);
  CUgraph g = NULL;
  c->ended = cuStreamEndCapture(c->s, &g);
  if (g) cuGraphDestroy(g);
  capturer_set(c, 3);
  return NULL;
}

/* Starts another thread capturing on a stream of its own in mode. */
static void capturer_start(capturer_t *c, pthread_t *t, CUstreamCaptureMode mode) {
  memset(c, 0, sizeof *c);
  pthread_mutex_init(&c->mu, NULL);
  pthread_cond_init(&c->cv, NULL);
  c->mode = mode;
  CU_ASSERT_EQUAL_FATAL(cuStreamCreate(&c->s, CU_STREAM_NON_BLOCKING), CUDA_SUCCESS);
  CU_ASSERT_EQUAL_FATAL(pthread_create(t, NULL, capturer_main, c), 0);
  capturer_wait(c, 1);
  CU_ASSERT_EQUAL(c->begun, CUDA_SUCCESS);
}

/* Tells it to end its capture; returns what cuStreamEndCapture said. */
static CUresult capturer_end(capturer_t *c, pthread_t t) {
  capturer_set(c, 2);
  pthread_join(t, NULL);
  CU_ASSERT_EQUAL(cuStreamDestroy_v2(c->s), CUDA_SUCCESS);
  pthread_cond_destroy(&c->cv);
  pthread_mutex_destroy(&c->mu);
  return c->ended;
}

/* The calling thread's capture interaction mode is set to mode; the old one is returned. */
static CUstreamCaptureMode set_mode(CUstreamCaptureMode mode) {
  CU_ASSERT_EQUAL(cuThreadExchangeStreamCaptureMode(&mode), CUDA_SUCCESS);
  return mode;
}

/* cuMemAlloc then cuMemFree of what it gave, or of keep when the allocation was refused: the
 * allocation's result (and the free's in *freed). */
static CUresult alloc_free(CUdeviceptr keep, CUresult *freed) {
  CUdeviceptr p = 0;
  CUresult r = cuMemAlloc_v2(&p, 4096);
  *freed = cuMemFree_v2(r == CUDA_SUCCESS ? p : keep);
  return r;
}

/* Another thread's capture: only a GLOBAL one prohibits, and only a GLOBAL thread; that capture
 * is invalidated. check(want, arg) makes the calls concerned and asserts they answered want. */
static void others_captures(void (*check)(CUresult want, void *arg), void *arg) {
  static const struct {
    CUstreamCaptureMode theirs, mine;
    CUresult want;
  } cases[] = {
      {CU_STREAM_CAPTURE_MODE_GLOBAL, CU_STREAM_CAPTURE_MODE_GLOBAL,
       CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED},
      {CU_STREAM_CAPTURE_MODE_GLOBAL, CU_STREAM_CAPTURE_MODE_THREAD_LOCAL, CUDA_SUCCESS},
      {CU_STREAM_CAPTURE_MODE_GLOBAL, CU_STREAM_CAPTURE_MODE_RELAXED, CUDA_SUCCESS},
      {CU_STREAM_CAPTURE_MODE_THREAD_LOCAL, CU_STREAM_CAPTURE_MODE_GLOBAL, CUDA_SUCCESS},
      {CU_STREAM_CAPTURE_MODE_RELAXED, CU_STREAM_CAPTURE_MODE_GLOBAL, CUDA_SUCCESS},
  };
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    capturer_t c;
    pthread_t t;
    capturer_start(&c, &t, cases[i].theirs);
    CUstreamCaptureMode old = set_mode(cases[i].mine);
    check(cases[i].want, arg);
    set_mode(old);
    CU_ASSERT_EQUAL(capturer_end(&c, t), cases[i].want == CUDA_SUCCESS
                                             ? CUDA_SUCCESS
                                             : CUDA_ERROR_STREAM_CAPTURE_INVALIDATED);
  }
}

/* cuMemAlloc and cuMemFree (of *keep when the allocation was refused) answered want. */
static void alloc_free_check(CUresult want, void *keep) {
  CUresult fr;
  CU_ASSERT_EQUAL(alloc_free(*(CUdeviceptr *)keep, &fr), want);
  CU_ASSERT_EQUAL(fr, want);
}

/* cuThreadExchangeStreamCaptureMode's rule for cuMemAlloc and cuMemFree: refused (and the
 * prohibiting captures invalidated) during the thread's own capture not begun RELAXED, and in
 * GLOBAL mode during another thread's GLOBAL capture; allowed in RELAXED mode, and in
 * THREAD_LOCAL mode whatever other threads capture. The legacy and _ptsz variants. */
static void test_capture_modes(void) {
  CUdeviceptr keep;
  CU_ASSERT_EQUAL_FATAL(cuMemAlloc_v2(&keep, 4096), CUDA_SUCCESS);
  CUstream s;
  CU_ASSERT_EQUAL_FATAL(cuStreamCreate(&s, CU_STREAM_NON_BLOCKING), CUDA_SUCCESS);
  CUstreamCaptureStatus cs;
  CUgraph g;
  CUresult fr;
  /* The mode: GLOBAL until changed, exchanged; bad modes refused. */
  CU_ASSERT_EQUAL(set_mode(CU_STREAM_CAPTURE_MODE_THREAD_LOCAL), CU_STREAM_CAPTURE_MODE_GLOBAL);
  CU_ASSERT_EQUAL(set_mode(CU_STREAM_CAPTURE_MODE_GLOBAL), CU_STREAM_CAPTURE_MODE_THREAD_LOCAL);
  uint64_t m = stats().misuse;
  CUstreamCaptureMode bad = (CUstreamCaptureMode)7;
  CU_ASSERT_EQUAL(cuThreadExchangeStreamCaptureMode(&bad), CUDA_ERROR_INVALID_VALUE);
  CU_ASSERT_EQUAL(cuThreadExchangeStreamCaptureMode(NULL), CUDA_ERROR_INVALID_VALUE);
  CU_ASSERT_EQUAL(stats().misuse, m + 2);
  CU_ASSERT_EQUAL(set_mode(CU_STREAM_CAPTURE_MODE_GLOBAL), CU_STREAM_CAPTURE_MODE_GLOBAL);

  /* Own captures not begun RELAXED (GLOBAL, THREAD_LOCAL, the legacy entry point's GLOBAL, the
   * _ptsz ones on the per-thread stream) refuse both, before looking at the pointer, and are
   * invalidated; keep is still allocated. */
  for (int v = 0; v < 4; v++) {
    m = stats().misuse;
    CUstream cap = v == 3 ? CU_STREAM_PER_THREAD : s;
    CUresult b = v == 0   ? cuStreamBeginCapture_v2(s, CU_STREAM_CAPTURE_MODE_GLOBAL)
                 : v == 1 ? cuStreamBeginCapture_v2(s, CU_STREAM_CAPTURE_MODE_THREAD_LOCAL)
                 : v == 2 ? cuStreamBeginCapture_v1(s)
                          : cuStreamBeginCapture_ptsz(NULL);
    CU_ASSERT_EQUAL_FATAL(b, CUDA_SUCCESS);
    CU_ASSERT_EQUAL(alloc_free(keep, &fr), CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED);
    CU_ASSERT_EQUAL(fr, CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED);
    CU_ASSERT_EQUAL(cuMemFree_v2(0x1234), CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED);
    CU_ASSERT_EQUAL(stats().misuse, m + 3);
    CU_ASSERT_EQUAL(cuStreamIsCapturing(cap, &cs), CUDA_SUCCESS);
    CU_ASSERT_EQUAL(cs, CU_STREAM_CAPTURE_STATUS_INVALIDATED);
    CU_ASSERT_EQUAL(v == 3 ? cuStreamEndCapture_ptsz(NULL, &g) : cuStreamEndCapture(s, &g),
                    CUDA_ERROR_STREAM_CAPTURE_INVALIDATED);
  }
  /* RELAXED: the thread's own RELAXED capture, or its RELAXED mode in a GLOBAL capture
   * (PyTorch's cudaMalloc during capture), allow both; the capture stays valid. */
  CU_ASSERT_EQUAL_FATAL(cuStreamBeginCapture_v2_ptsz(s, CU_STREAM_CAPTURE_MODE_RELAXED),
                        CUDA_SUCCESS);
  CU_ASSERT_EQUAL(alloc_free(keep, &fr), CUDA_SUCCESS);
  CU_ASSERT_EQUAL(fr, CUDA_SUCCESS);
  CU_ASSERT_EQUAL(cuStreamEndCapture(s, &g), CUDA_SUCCESS);
  CU_ASSERT_EQUAL(cuGraphDestroy(g), CUDA_SUCCESS);
  CU_ASSERT_EQUAL_FATAL(cuStreamBeginCapture_v2(s, CU_STREAM_CAPTURE_MODE_GLOBAL), CUDA_SUCCESS);
  CU_ASSERT_EQUAL(set_mode(CU_STREAM_CAPTURE_MODE_RELAXED), CU_STREAM_CAPTURE_MODE_GLOBAL);
  CU_ASSERT_EQUAL(alloc_free(keep, &fr), CUDA_SUCCESS);
  CU_ASSERT_EQUAL(fr, CUDA_SUCCESS);
  CU_ASSERT_EQUAL(set_mode(CU_STREAM_CAPTURE_MODE_GLOBAL), CU_STREAM_CAPTURE_MODE_RELAXED);
  CU_ASSERT_EQUAL(cuStreamIsCapturing(s, &cs), CUDA_SUCCESS);
  CU_ASSERT_EQUAL(cs, CU_STREAM_CAPTURE_STATUS_ACTIVE);
  CU_ASSERT_EQUAL(cuStreamEndCapture(s, &g), CUDA_SUCCESS);
  CU_ASSERT_EQUAL(cuGraphDestroy(g), CUDA_SUCCESS);

  others_captures(alloc_free_check, &keep);

  /* A capture not begun RELAXED is ended by its own thread only. */
  capturer_t c;
  pthread_t t;
  capturer_start(&c, &t, CU_STREAM_CAPTURE_MODE_THREAD_LOCAL);
  m = stats().misuse;
  CU_ASSERT_EQUAL(cuStreamEndCapture(c.s, &g), CUDA_ERROR_STREAM_CAPTURE_WRONG_THREAD);
  CU_ASSERT_EQUAL(stats().misuse, m + 1);
  CU_ASSERT_EQUAL(capturer_end(&c, t), CUDA_SUCCESS);
  CU_ASSERT_EQUAL(cuMemFree_v2(keep), CUDA_SUCCESS);
  CU_ASSERT_EQUAL(cuStreamDestroy_v2(s), CUDA_SUCCESS);
}

/* The VMM calls and cuEventCreate/Destroy, in order on a fresh reservation: how many of the nine
 * answered want. A refused call looks at no argument. */
static int vmm_calls(CUresult want) {
  CUmemAllocationProp prop = {.type = CU_MEM_ALLOCATION_TYPE_PINNED,
                              .location = {CU_MEM_LOCATION_TYPE_DEVICE, 0}};
  CUmemAccessDesc acc = {.location = prop.location, .flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE};
  CUdeviceptr va = 0;
  CUmemGenericAllocationHandle h = 0;
  CUevent e = NULL;
  CUresult r[9];
  int n = 0, ok = 0;
  r[n++] = cuMemAddressReserve(&va, 2 * MiB, 0, 0, 0);
  r[n++] = cuMemCreate(&h, 2 * MiB, &prop, 0);
  r[n++] = cuMemMap(va, 2 * MiB, 0, h, 0);
  r[n++] = cuMemSetAccess(va, 2 * MiB, &acc, 1);
  r[n++] = cuMemUnmap(va, 2 * MiB);
  r[n++] = cuMemRelease(h);
  r[n++] = cuMemAddressFree(va, 2 * MiB);
  r[n++] = cuEventCreate(&e, 0);
  r[n++] = cuEventDestroy_v2(e);
  for (int i = 0; i < n; i++) ok += r[i] == want;
  return ok;
}

static void vmm_check(CUresult want, void *unused) {
  (void)unused;
  CU_ASSERT_EQUAL(vmm_calls(want), 9);
}

/* Without WLTEST_CAPTURE_UNSAFE the VMM calls and event create/destroy are allowed during
 * another thread's GLOBAL capture; with WLTEST_CAPTURE_UNSAFE=vmm (read at cuInit: the test runs
 * itself again in a child with it set) they follow cuMemAlloc's rule: refused, and the
 * prohibiting captures invalidated, during the thread's own capture not begun RELAXED and, in
 * GLOBAL mode, during another thread's GLOBAL capture; allowed in RELAXED mode. */
static void test_capture_unsafe_vmm(void) {
  if (!getenv("WLTEST_CAPTURE_UNSAFE")) {
    capturer_t c;
    pthread_t t;
    capturer_start(&c, &t, CU_STREAM_CAPTURE_MODE_GLOBAL);
    CU_ASSERT_EQUAL(vmm_calls(CUDA_SUCCESS), 9);
    CU_ASSERT_EQUAL(capturer_end(&c, t), CUDA_SUCCESS);
    CU_ASSERT_TRUE(
        wl_test_rerun("WLTEST_CAPTURE_UNSAFE", "vmm", "test_doubles_driver", "capture_unsafe_vmm"));
    return;
  }
  CU_ASSERT_EQUAL_FATAL(cuInit(0), CUDA_SUCCESS);
  CU_ASSERT_EQUAL_FATAL(cuDevicePrimaryCtxRetain(&ctx, 0), CUDA_SUCCESS);
  CU_ASSERT_EQUAL_FATAL(cuCtxSetCurrent(ctx), CUDA_SUCCESS);
  CUstream s;
  CUgraph g;
  CUstreamCaptureStatus cs;
  CU_ASSERT_EQUAL_FATAL(cuStreamCreate(&s, CU_STREAM_NON_BLOCKING), CUDA_SUCCESS);
  CU_ASSERT_EQUAL(vmm_calls(CUDA_SUCCESS), 9);
  /* The thread's own GLOBAL capture: all refused (misuse), the capture invalidated. */
  uint64_t m = stats().misuse;
  CU_ASSERT_EQUAL_FATAL(cuStreamBeginCapture_v2(s, CU_STREAM_CAPTURE_MODE_GLOBAL), CUDA_SUCCESS);
  CU_ASSERT_EQUAL(vmm_calls(CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED), 9);
  CU_ASSERT_EQUAL(stats().misuse, m + 9);
  CU_ASSERT_EQUAL(cuStreamIsCapturing(s, &cs), CUDA_SUCCESS);
  CU_ASSERT_EQUAL(cs, CU_STREAM_CAPTURE_STATUS_INVALIDATED);
  CU_ASSERT_EQUAL(cuStreamEndCapture(s, &g), CUDA_ERROR_STREAM_CAPTURE_INVALIDATED);
  /* RELAXED mode inside it: allowed, the capture stays valid. */
  CU_ASSERT_EQUAL_FATAL(cuStreamBeginCapture_v2(s, CU_STREAM_CAPTURE_MODE_GLOBAL), CUDA_SUCCESS);
  CU_ASSERT_EQUAL(set_mode(CU_STREAM_CAPTURE_MODE_RELAXED), CU_STREAM_CAPTURE_MODE_GLOBAL);
  CU_ASSERT_EQUAL(vmm_calls(CUDA_SUCCESS), 9);
  set_mode(CU_STREAM_CAPTURE_MODE_GLOBAL);
  CU_ASSERT_EQUAL(cuStreamEndCapture(s, &g), CUDA_SUCCESS);
  CU_ASSERT_EQUAL(cuGraphDestroy(g), CUDA_SUCCESS);
  /* Another thread's capture. */
  others_captures(vmm_check, NULL);
  CU_ASSERT_EQUAL(cuStreamDestroy_v2(s), CUDA_SUCCESS);
}

/* One thread of wl_t_add (p[0] += k) with args: as a CUfunction, or as the CUkernel kern. */
static CUDA_KERNEL_NODE_PARAMS add_params(void **args, CUkernel kern) {
  return (CUDA_KERNEL_NODE_PARAMS){.func = kern ? NULL : f_add,
                                   .gridDimX = 1,
                                   .gridDimY = 1,
                                   .gridDimZ = 1,
                                   .blockDimX = 1,
                                   .blockDimY = 1,
                                   .blockDimZ = 1,
                                   .kernelParams = args,
                                   .kern = kern,
                                   .ctx = kern ? ctx : NULL};
}

/* A kernel node of wl_t_add after dep: as a CUfunction, or as the CUkernel kern. */
static CUgraphNode add_node(CUgraph g, CUgraphNode dep, CUkernel kern, CUdeviceptr *buf,
                            unsigned *k) {
  void *args[] = {buf, k};
  CUDA_KERNEL_NODE_PARAMS p = add_params(args, kern);
  CUgraphNode n = NULL;
  CU_ASSERT_EQUAL(cuGraphAddKernelNode(&n, g, dep ? &dep : NULL, dep ? 1 : 0, &p), CUDA_SUCCESS);
  return n;
}

/* Runs x once on s and returns what it added to *buf. */
static unsigned run_exec(CUgraphExec x, CUstream s, CUdeviceptr buf) {
  unsigned before = *(unsigned *)(uintptr_t)buf;
  CU_ASSERT_EQUAL(cuGraphLaunch(x, s), CUDA_SUCCESS);
  CU_ASSERT_EQUAL(cuStreamSynchronize(s), CUDA_SUCCESS);
  return *(unsigned *)(uintptr_t)buf - before;
}

/* Graphs built node by node: kernel nodes (CUfunction or CUkernel, arguments copied when
 * added), child graph nodes (a copy), the node queries, clones; executable graphs run their
 * nodes, child graphs' included, and take new parameters (cuGraphExecKernelNodeSetParams, both
 * ABIs) or a whole topologically identical graph (cuGraphExecUpdate, both ABIs). Bad handles and
 * arguments get CUDA's error codes. */
static void test_graph_nodes(void) {
  CUdeviceptr buf;
  CUstream s = stream_and_zeroed(&buf, 64);
  CUlibrary lib;
  CUkernel kern;
  CU_ASSERT_EQUAL_FATAL(cuLibraryLoadData(&lib, ptx, NULL, NULL, 0, NULL, NULL, 0), CUDA_SUCCESS);
  CU_ASSERT_EQUAL_FATAL(cuLibraryGetKernel(&kern, lib, "wl_t_add"), CUDA_SUCCESS);
  const char *name = NULL;
  CU_ASSERT_EQUAL(cuKernelGetName(&name, kern), CUDA_SUCCESS);
  CU_ASSERT_STRING_EQUAL(name, "wl_t_add");

  /* g: add 1 (a CUfunction), add 2 (a CUkernel), then a child graph adding 4. */
  CUgraph g, child;
  CU_ASSERT_EQUAL_FATAL(cuGraphCreate(&g, 0), CUDA_SUCCESS);
  CU_ASSERT_EQUAL_FATAL(cuGraphCreate(&child, 0), CUDA_SUCCESS);
  unsigned k = 1;
  CUgraphNode n1 = add_node(g, NULL, NULL, &buf, &k);
  k = 2;
  CUgraphNode n2 = add_node(g, n1, kern, &buf, &k);
  k = 4;
  add_node(child, NULL, NULL, &buf, &k);
  CUgraphNode nc;
  CU_ASSERT_EQUAL_FATAL(cuGraphAddChildGraphNode(&nc, g, &n2, 1, child), CUDA_SUCCESS);
  k = 1000;
  add_node(child, NULL, NULL, &buf, &k); /* the node holds a copy: not in g */

  /* The queries. */
  size_t n = 0;
  CU_ASSERT_EQUAL(cuGraphGetNodes(g, NULL, &n), CUDA_SUCCESS);
  CU_ASSERT_EQUAL(n, 3);
  CUgraphNode nodes[5] = {0};
  n = 2;
  CU_ASSERT_EQUAL(cuGraphGetNodes(g, nodes, &n), CUDA_SUCCESS);
  CU_ASSERT_EQUAL(n, 2);
  CU_ASSERT_PTR_EQUAL(nodes[0], n1);
  CU_ASSERT_PTR_EQUAL(nodes[1], n2);
  CU_ASSERT_PTR_NULL(nodes[2]);
  n = 5;
  nodes[4] = n1;
  CU_ASSERT_EQUAL(cuGraphGetNodes(g, nodes, &n), CUDA_SUCCESS);
  CU_ASSERT_EQUAL(n, 3);
  CU_ASSERT_PTR_EQUAL(nodes[2], nc);
  CU_ASSERT_PTR_NULL(nodes[3]);
  CU_ASSERT_PTR_NULL(nodes[4]);
  CUgraphNodeType type;
  CU_ASSERT_EQUAL(cuGraphNodeGetType(n1, &type), CUDA_SUCCESS);
  CU_ASSERT_EQUAL(type, CU_GRAPH_NODE_TYPE_KERNEL);
  CU_ASSERT_EQUAL(cuGraphNodeGetType(nc, &type), CUDA_SUCCESS);
  CU_ASSERT_EQUAL(type, CU_GRAPH_NODE_TYPE_GRAPH);
  CUDA_KERNEL_NODE_PARAMS p;
  CU_ASSERT_EQUAL(cuGraphKernelNodeGetParams(n1, &p), CUDA_SUCCESS);
  CU_ASSERT_PTR_EQUAL(p.func, f_add);
  CU_ASSERT_PTR_NULL(p.kern);
  CU_ASSERT_EQUAL(*(unsigned *)p.kernelParams[1], 1); /* copied when added */
  CU_ASSERT_EQUAL(cuGraphKernelNodeGetParams(n2, &p), CUDA_SUCCESS);
  CU_ASSERT_PTR_NULL(p.func);
  CU_ASSERT_PTR_EQUAL(p.kern, kern);
  CU_ASSERT_PTR_EQUAL(p.ctx, ctx);
  CUgraph inner = NULL;
  CU_ASSERT_EQUAL(cuGraphChildGraphNodeGetGraph(nc, &inner), CUDA_SUCCESS);
  CU_ASSERT(inner != NULL && inner != child);
  CU_ASSERT_EQUAL(cuGraphGetNodes(inner, NULL, &n), CUDA_SUCCESS);
  CU_ASSERT_EQUAL(n, 1);

  /* Instantiated, the child graph runs with the rest; a clone runs the same. */
  CUgraphExec x, xc;
  CU_ASSERT_EQUAL_FATAL(cuGraphInstantiateWithFlags(&x, g, 0), CUDA_SUCCESS);
  int runs = twin_runs;
  CU_ASSERT_EQUAL(run_exec(x, s, buf), 7);
  CU_ASSERT_EQUAL(twin_runs, runs + 3);
  CUgraph copy;
  CU_ASSERT_EQUAL_FATAL(cuGraphClone(&copy, g), CUDA_SUCCESS);
  CU_ASSERT(copy != g);
  n = 3;
  CU_ASSERT_EQUAL(cuGraphGetNodes(copy, nodes, &n), CUDA_SUCCESS);
  CU_ASSERT_EQUAL(n, 3);
  CU_ASSERT(nodes[0] != n1 && nodes[1] != n2 && nodes[2] != nc);
  CUgraphNode copy_n1 = nodes[0];
  CU_ASSERT_EQUAL_FATAL(cuGraphInstantiateWithFlags(&xc, copy, 0), CUDA_SUCCESS);
  CU_ASSERT_EQUAL(run_exec(xc, s, buf), 7);

  /* New parameters for one node of the executable graph: g's node, never the clone's. */
  k = 10;
  void *args[] = {&buf, &k};
  CUDA_KERNEL_NODE_PARAMS np = add_params(args, NULL);
  CU_ASSERT_EQUAL(cuGraphExecKernelNodeSetParams(x, n1, &np), CUDA_SUCCESS);
  CU_ASSERT_EQUAL(run_exec(x, s, buf), 16);
  k = 20;
  CU_ASSERT_EQUAL(cuGraphExecKernelNodeSetParams_v1(x, n1, (const CUDA_KERNEL_NODE_PARAMS_v1 *)&np),
                  CUDA_SUCCESS);
  CU_ASSERT_EQUAL(run_exec(x, s, buf), 26);
  uint64_t m = stats().misuse;
  CU_ASSERT_EQUAL(cuGraphExecKernelNodeSetParams(x, copy_n1, &np), CUDA_ERROR_INVALID_VALUE);
  CU_ASSERT_EQUAL(cuGraphExecKernelNodeSetParams(x, nc, &np), CUDA_ERROR_INVALID_VALUE);
  CU_ASSERT_EQUAL(cuGraphExecKernelNodeSetParams((CUgraphExec)&np, n1, &np),
                  CUDA_ERROR_INVALID_VALUE);
  CU_ASSERT_EQUAL(cuGraphExecKernelNodeSetParams(x, n1, NULL), CUDA_ERROR_INVALID_VALUE);
  CU_ASSERT_EQUAL(stats().misuse, m + 4);

  /* An update from a graph of the same shape: every node's parameters, the function's too. */
  CUgraph u, uchild, flat2, flat3;
  CU_ASSERT_EQUAL_FATAL(cuGraphCreate(&u, 0), CUDA_SUCCESS);
  CU_ASSERT_EQUAL_FATAL(cuGraphCreate(&uchild, 0), CUDA_SUCCESS);
  k = 100;
  CUgraphNode u1 = add_node(u, NULL, kern, &buf, &k);
  k = 200;
  add_node(u, u1, NULL, &buf, &k);
  k = 300;
  add_node(uchild, NULL, NULL, &buf, &k);
  CUgraphNode uc;
  CU_ASSERT_EQUAL(cuGraphAddChildGraphNode(&uc, u, NULL, 0, uchild), CUDA_SUCCESS);
  CUgraphExecUpdateResultInfo info = {.result = CU_GRAPH_EXEC_UPDATE_ERROR};
  CU_ASSERT_EQUAL(cuGraphExecUpdate(x, u, &info), CUDA_SUCCESS);
  CU_ASSERT_EQUAL(info.result, CU_GRAPH_EXEC_UPDATE_SUCCESS);
  CU_ASSERT_EQUAL(run_exec(x, s, buf), 600);
  /* The executable graph's nodes are still paired with g's. */
  k = 1;
  CU_ASSERT_EQUAL(cuGraphExecKernelNodeSetParams(x, n1, &np), CUDA_SUCCESS);
  CU_ASSERT_EQUAL(run_exec(x, s, buf), 501);
  /* Another shape: refused, and nothing changed. */
  CU_ASSERT_EQUAL_FATAL(cuGraphCreate(&flat2, 0), CUDA_SUCCESS);
  CU_ASSERT_EQUAL_FATAL(cuGraphCreate(&flat3, 0), CUDA_SUCCESS);
  add_node(flat2, NULL, NULL, &buf, &k);
  add_node(flat2, NULL, NULL, &buf, &k);
  add_node(flat3, NULL, NULL, &buf, &k);
  add_node(flat3, NULL, NULL, &buf, &k);
  CUgraphNode f3 = add_node(flat3, NULL, NULL, &buf, &k);
  CU_ASSERT_EQUAL(cuGraphExecUpdate(x, flat2, &info), CUDA_ERROR_GRAPH_EXEC_UPDATE_FAILURE);
  CU_ASSERT_EQUAL(info.result, CU_GRAPH_EXEC_UPDATE_ERROR_TOPOLOGY_CHANGED);
  CU_ASSERT_PTR_NULL(info.errorNode);
  CUgraphNode errnode = NULL;
  CUgraphExecUpdateResult res = CU_GRAPH_EXEC_UPDATE_SUCCESS;
  CU_ASSERT_EQUAL(cuGraphExecUpdate_v1(x, flat3, &errnode, &res),
                  CUDA_ERROR_GRAPH_EXEC_UPDATE_FAILURE);
  CU_ASSERT_EQUAL(res, CU_GRAPH_EXEC_UPDATE_ERROR_NODE_TYPE_CHANGED);
  CU_ASSERT_PTR_EQUAL(errnode, f3);
  CU_ASSERT_EQUAL(run_exec(x, s, buf), 501);
  CU_ASSERT_EQUAL(cuGraphExecUpdate_v1(xc, g, &errnode, &res), CUDA_SUCCESS);
  CU_ASSERT_EQUAL(res, CU_GRAPH_EXEC_UPDATE_SUCCESS);
  CU_ASSERT_PTR_NULL(errnode);

  /* Misuse: every bad handle and argument gets CUDA_ERROR_INVALID_VALUE. */
  m = stats().misuse;
  CUgraph bad;
  CUgraphNode badn;
  CU_ASSERT_EQUAL(cuGraphCreate(&bad, 1), CUDA_ERROR_INVALID_VALUE);
  CU_ASSERT_EQUAL(cuGraphCreate(NULL, 0), CUDA_ERROR_INVALID_VALUE);
  CU_ASSERT_EQUAL(cuGraphAddKernelNode(&badn, (CUgraph)&np, NULL, 0, &np),
                  CUDA_ERROR_INVALID_VALUE);
  CU_ASSERT_EQUAL(cuGraphAddKernelNode(&badn, g, &uc, 1, &np), CUDA_ERROR_INVALID_VALUE);
  CU_ASSERT_EQUAL(cuGraphAddKernelNode(&badn, g, NULL, 1, &np), CUDA_ERROR_INVALID_VALUE);
  CU_ASSERT_EQUAL(cuGraphAddKernelNode(&badn, g, NULL, 0, NULL), CUDA_ERROR_INVALID_VALUE);
  np.func = (CUfunction)(void *)&np;
  CU_ASSERT_EQUAL(cuGraphAddKernelNode(&badn, g, NULL, 0, &np), CUDA_ERROR_INVALID_VALUE);
  np.func = f_add;
  np.gridDimX = 0;
  CU_ASSERT_EQUAL(cuGraphAddKernelNode(&badn, g, NULL, 0, &np), CUDA_ERROR_INVALID_VALUE);
  np.gridDimX = 1;
  CU_ASSERT_EQUAL(cuGraphKernelNodeGetParams(nc, &p), CUDA_ERROR_INVALID_VALUE);
  CU_ASSERT_EQUAL(cuGraphKernelNodeGetParams((CUgraphNode)&np, &p), CUDA_ERROR_INVALID_VALUE);
  CU_ASSERT_EQUAL(cuGraphNodeGetType((CUgraphNode)&np, &type), CUDA_ERROR_INVALID_VALUE);
  CU_ASSERT_EQUAL(cuGraphNodeGetType(n1, NULL), CUDA_ERROR_INVALID_VALUE);
  CU_ASSERT_EQUAL(cuGraphGetNodes((CUgraph)&np, NULL, &n), CUDA_ERROR_INVALID_VALUE);
  CU_ASSERT_EQUAL(cuGraphGetNodes(g, nodes, NULL), CUDA_ERROR_INVALID_VALUE);
  CU_ASSERT_EQUAL(cuGraphChildGraphNodeGetGraph(n1, &inner), CUDA_ERROR_INVALID_VALUE);
  CU_ASSERT_EQUAL(cuGraphAddChildGraphNode(&badn, g, NULL, 0, (CUgraph)&np),
                  CUDA_ERROR_INVALID_VALUE);
  CU_ASSERT_EQUAL(cuGraphClone(&bad, (CUgraph)&np), CUDA_ERROR_INVALID_VALUE);
  CU_ASSERT_EQUAL(cuGraphExecUpdate((CUgraphExec)&np, u, &info), CUDA_ERROR_INVALID_VALUE);
  CU_ASSERT_EQUAL(cuGraphExecUpdate(x, (CUgraph)&np, &info), CUDA_ERROR_INVALID_VALUE);
  CU_ASSERT_EQUAL(info.result, CU_GRAPH_EXEC_UPDATE_ERROR);
  CU_ASSERT_EQUAL(cuGraphExecUpdate(x, u, NULL), CUDA_ERROR_INVALID_VALUE);
  CU_ASSERT_EQUAL(stats().misuse, m + 20);
  CU_ASSERT_EQUAL(cuGraphGetNodes(g, NULL, &n), CUDA_SUCCESS);
  CU_ASSERT_EQUAL(n, 3); /* nothing was added */

  CU_ASSERT_EQUAL(cuGraphExecDestroy(x), CUDA_SUCCESS);
  CU_ASSERT_EQUAL(cuGraphExecDestroy(xc), CUDA_SUCCESS);
  CUgraph all[] = {g, child, copy, u, uchild, flat2, flat3};
  for (size_t i = 0; i < sizeof all / sizeof all[0]; i++)
    CU_ASSERT_EQUAL(cuGraphDestroy(all[i]), CUDA_SUCCESS);
  CU_ASSERT_EQUAL(cuGraphDestroy(inner), CUDA_ERROR_INVALID_VALUE); /* the node's, gone with it */
  CU_ASSERT_EQUAL(cuLibraryUnload(lib), CUDA_SUCCESS);
  CU_ASSERT_EQUAL(cuMemFree_v2(buf), CUDA_SUCCESS);
  CU_ASSERT_EQUAL(cuStreamDestroy_v2(s), CUDA_SUCCESS);
}

/* The generic forms (12.2): cuGraphAddNode (both ABIs) makes kernel, child graph and conditional
 * nodes, which the node queries answer for; a conditional node's body graphs come back in
 * phGraph_out and run as its handle's default value selects; cuGraphExecNodeSetParams and
 * cuGraphExecChildGraphNodeSetParams change an executable graph's kernels; cuGraphDestroyNode
 * removes a node. Misuse gets CUDA's error codes and is counted. */
static void test_graph_generic(void) {
  CUdeviceptr buf;
  CUstream s = stream_and_zeroed(&buf, 64);
  CUgraph g, child, body_src;
  CU_ASSERT_EQUAL_FATAL(cuGraphCreate(&g, 0), CUDA_SUCCESS);
  CU_ASSERT_EQUAL_FATAL(cuGraphCreate(&child, 0), CUDA_SUCCESS);
  unsigned k = 1;
  void *args[] = {&buf, &k};
  CUgraphNodeParams kp = {.type = CU_GRAPH_NODE_TYPE_KERNEL,
                          .kernel = {.func = f_add,
                                     .gridDimX = 1,
                                     .gridDimY = 1,
                                     .gridDimZ = 1,
                                     .blockDimX = 1,
                                     .blockDimY = 1,
                                     .blockDimZ = 1,
                                     .kernelParams = args}};
  CUgraphNode n1, nc, ncond, nswitch;
  CU_ASSERT_EQUAL_FATAL(cuGraphAddNode(&n1, g, NULL, NULL, 0, &kp), CUDA_SUCCESS);
  k = 2;
  CUgraphNode c1;
  CU_ASSERT_EQUAL_FATAL(cuGraphAddNode_v1(&c1, child, NULL, 0, &kp), CUDA_SUCCESS);
  CUgraphNodeParams cp = {.type = CU_GRAPH_NODE_TYPE_GRAPH, .graph = {.graph = child}};
  CU_ASSERT_EQUAL_FATAL(cuGraphAddNode_v1(&nc, g, &n1, 1, &cp), CUDA_SUCCESS);
  CUgraphNodeType type;
  CU_ASSERT_EQUAL(cuGraphNodeGetType(n1, &type), CUDA_SUCCESS);
  CU_ASSERT_EQUAL(type, CU_GRAPH_NODE_TYPE_KERNEL);
  CUDA_KERNEL_NODE_PARAMS p;
  CU_ASSERT_EQUAL(cuGraphKernelNodeGetParams(n1, &p), CUDA_SUCCESS);
  CU_ASSERT_PTR_EQUAL(p.func, f_add);
  CU_ASSERT_EQUAL(cuGraphNodeGetType(nc, &type), CUDA_SUCCESS);
  CU_ASSERT_EQUAL(type, CU_GRAPH_NODE_TYPE_GRAPH);

  /* An IF node whose handle defaults to 1 (body 0 runs: adds 4), a SWITCH node whose handle has
   * no default (0: body 0 runs, adds 8; body 1 would add 1000). */
  CUgraphConditionalHandle h1, h0;
  CU_ASSERT_EQUAL_FATAL(
      cuGraphConditionalHandleCreate(&h1, g, ctx, 1, CU_GRAPH_COND_ASSIGN_DEFAULT), CUDA_SUCCESS);
  CU_ASSERT_EQUAL_FATAL(cuGraphConditionalHandleCreate(&h0, g, ctx, 7, 0), CUDA_SUCCESS);
  CUgraphNodeParams ifp = {
      .type = CU_GRAPH_NODE_TYPE_CONDITIONAL,
      .conditional = {.handle = h1, .type = CU_GRAPH_COND_TYPE_IF, .size = 2, .ctx = ctx}};
  CU_ASSERT_EQUAL_FATAL(cuGraphAddNode(&ncond, g, &nc, NULL, 1, &ifp), CUDA_SUCCESS);
  CU_ASSERT_PTR_NOT_NULL_FATAL(ifp.conditional.phGraph_out);
  CUgraph *ifb = ifp.conditional.phGraph_out;
  CUgraphNode b;
  k = 4;
  CU_ASSERT_EQUAL(cuGraphAddNode(&b, ifb[0], NULL, NULL, 0, &kp), CUDA_SUCCESS);
  k = 1000;
  CU_ASSERT_EQUAL(cuGraphAddNode(&b, ifb[1], NULL, NULL, 0, &kp), CUDA_SUCCESS);
  CUgraphNodeParams swp = {
      .type = CU_GRAPH_NODE_TYPE_CONDITIONAL,
      .conditional = {.handle = h0, .type = CU_GRAPH_COND_TYPE_SWITCH, .size = 2, .ctx = ctx}};
  CU_ASSERT_EQUAL_FATAL(cuGraphAddNode(&nswitch, g, NULL, NULL, 0, &swp), CUDA_SUCCESS);
  CUgraph *swb = swp.conditional.phGraph_out;
  k = 8;
  CU_ASSERT_EQUAL(cuGraphAddNode(&b, swb[0], NULL, NULL, 0, &kp), CUDA_SUCCESS);
  k = 1000;
  CU_ASSERT_EQUAL(cuGraphAddNode(&b, swb[1], NULL, NULL, 0, &kp), CUDA_SUCCESS);
  CU_ASSERT_EQUAL(cuGraphNodeGetType(ncond, &type), CUDA_SUCCESS);
  CU_ASSERT_EQUAL(type, CU_GRAPH_NODE_TYPE_CONDITIONAL);
  CU_ASSERT_EQUAL(cuGraphKernelNodeGetParams(b, &p), CUDA_SUCCESS); /* a body's node */
  size_t n = 0;
  CU_ASSERT_EQUAL(cuGraphGetNodes(g, NULL, &n), CUDA_SUCCESS);
  CU_ASSERT_EQUAL(n, 4);
  CU_ASSERT_EQUAL(cuGraphGetNodes(ifb[0], NULL, &n), CUDA_SUCCESS);
  CU_ASSERT_EQUAL(n, 1);
  CUgraphExec x;
  CU_ASSERT_EQUAL_FATAL(cuGraphInstantiateWithFlags(&x, g, 0), CUDA_SUCCESS);
  CU_ASSERT_EQUAL(run_exec(x, s, buf), 15);

  /* The executable graph's kernel node and child graph take new parameters. */
  k = 16;
  CU_ASSERT_EQUAL(cuGraphExecNodeSetParams(x, n1, &kp), CUDA_SUCCESS);
  CU_ASSERT_EQUAL(run_exec(x, s, buf), 30);
  CU_ASSERT_EQUAL_FATAL(cuGraphCreate(&body_src, 0), CUDA_SUCCESS);
  k = 32;
  CU_ASSERT_EQUAL(cuGraphAddNode(&b, body_src, NULL, NULL, 0, &kp), CUDA_SUCCESS);
  CU_ASSERT_EQUAL(cuGraphExecChildGraphNodeSetParams(x, nc, body_src), CUDA_SUCCESS);
  CU_ASSERT_EQUAL(run_exec(x, s, buf), 60);
  k = 64;
  CUgraphNodeParams cp2 = {.type = CU_GRAPH_NODE_TYPE_GRAPH, .graph = {.graph = child}};
  CU_ASSERT_EQUAL(cuGraphExecNodeSetParams(x, nc, &cp2), CUDA_SUCCESS);
  CU_ASSERT_EQUAL(run_exec(x, s, buf), 30); /* child's node was copied with k = 2 */

  /* Misuse. */
  uint64_t m = stats().misuse;
  CUgraphNode badn;
  CUgraph bad;
  CUgraphConditionalHandle hb;
  kp.reserved0[1] = 1;
  CU_ASSERT_EQUAL(cuGraphAddNode(&badn, g, NULL, NULL, 0, &kp), CUDA_ERROR_INVALID_VALUE);
  kp.reserved0[1] = 0;
  CU_ASSERT_EQUAL(cuGraphAddNode(&badn, g, NULL, NULL, 0, NULL), CUDA_ERROR_INVALID_VALUE);
  CU_ASSERT_EQUAL(cuGraphAddNode(NULL, g, NULL, NULL, 0, &kp), CUDA_ERROR_INVALID_VALUE);
  CU_ASSERT_EQUAL(cuGraphAddNode(&badn, (CUgraph)&kp, NULL, NULL, 0, &kp),
                  CUDA_ERROR_INVALID_VALUE);
  ifp.conditional.handle = 9999;
  CU_ASSERT_EQUAL(cuGraphAddNode(&badn, g, NULL, NULL, 0, &ifp), CUDA_ERROR_INVALID_VALUE);
  ifp.conditional.handle = h1;
  ifp.conditional.size = 3;
  CU_ASSERT_EQUAL(cuGraphAddNode(&badn, g, NULL, NULL, 0, &ifp), CUDA_ERROR_INVALID_VALUE);
  CU_ASSERT_EQUAL(cuGraphConditionalHandleCreate(&hb, g, ctx, 0, 2), CUDA_ERROR_INVALID_VALUE);
  CU_ASSERT_EQUAL(cuGraphConditionalHandleCreate(NULL, g, ctx, 0, 0), CUDA_ERROR_INVALID_VALUE);
  CU_ASSERT_EQUAL(cuGraphConditionalHandleCreate(&hb, (CUgraph)&kp, ctx, 0, 0),
                  CUDA_ERROR_INVALID_VALUE);
  CU_ASSERT_EQUAL(cuGraphExecNodeSetParams(x, nc, &kp), CUDA_ERROR_INVALID_VALUE); /* type */
  CU_ASSERT_EQUAL(cuGraphExecNodeSetParams(x, n1, NULL), CUDA_ERROR_INVALID_VALUE);
  CU_ASSERT_EQUAL(cuGraphExecChildGraphNodeSetParams(x, n1, child), CUDA_ERROR_INVALID_VALUE);
  CU_ASSERT_EQUAL(cuGraphExecChildGraphNodeSetParams(x, nc, g), CUDA_ERROR_INVALID_VALUE);
  CU_ASSERT_EQUAL(cuGraphExecChildGraphNodeSetParams((CUgraphExec)&kp, nc, child),
                  CUDA_ERROR_INVALID_VALUE);
  CU_ASSERT_EQUAL(cuGraphAddChildGraphNode(&badn, child, NULL, 0, g), CUDA_ERROR_INVALID_VALUE);
  CU_ASSERT_EQUAL(cuGraphClone(&bad, g), CUDA_ERROR_NOT_SUPPORTED);
  CU_ASSERT_EQUAL(cuGraphDestroyNode((CUgraphNode)&kp), CUDA_ERROR_INVALID_VALUE);
  CU_ASSERT_EQUAL(stats().misuse, m + 17);
  /* The topology of a child graph set must match: one node more is refused. */
  CU_ASSERT_EQUAL(cuGraphAddNode(&b, body_src, NULL, NULL, 0, &kp), CUDA_SUCCESS);
  CU_ASSERT_EQUAL(cuGraphExecChildGraphNodeSetParams(x, nc, body_src), CUDA_ERROR_INVALID_VALUE);
  CU_ASSERT_EQUAL(run_exec(x, s, buf), 30);

  /* Destroyed nodes leave the graph, body graphs with their node (and the array naming them,
   * which is the driver's: read before). */
  CUgraph swb0 = swb[0];
  CU_ASSERT_EQUAL(cuGraphDestroyNode(nswitch), CUDA_SUCCESS);
  CU_ASSERT_EQUAL(cuGraphGetNodes(g, NULL, &n), CUDA_SUCCESS);
  CU_ASSERT_EQUAL(n, 3);
  CU_ASSERT_EQUAL(cuGraphGetNodes(swb0, NULL, &n), CUDA_ERROR_INVALID_VALUE);
  CU_ASSERT_EQUAL(cuGraphDestroyNode(ncond), CUDA_SUCCESS);
  CU_ASSERT_EQUAL(cuGraphClone(&bad, g), CUDA_SUCCESS); /* no conditional node left */
  CU_ASSERT_EQUAL(cuGraphDestroy(bad), CUDA_SUCCESS);
  CU_ASSERT_EQUAL(cuGraphExecDestroy(x), CUDA_SUCCESS);
  CUgraph all[] = {g, child, body_src};
  for (size_t i = 0; i < sizeof all / sizeof all[0]; i++)
    CU_ASSERT_EQUAL(cuGraphDestroy(all[i]), CUDA_SUCCESS);
  CU_ASSERT_EQUAL(cuMemFree_v2(buf), CUDA_SUCCESS);
  CU_ASSERT_EQUAL(cuStreamDestroy_v2(s), CUDA_SUCCESS);
}

/* A destroyed stream's pending work still completes, and its events with it. */
static void test_destroy_pending(void) {
  CUstream s;
  CUevent e;
  CU_ASSERT_EQUAL_FATAL(cuStreamCreate(&s, 0), CUDA_SUCCESS);
  CU_ASSERT_EQUAL_FATAL(cuEventCreate(&e, CU_EVENT_DISABLE_TIMING), CUDA_SUCCESS);
  CU_ASSERT_EQUAL(cuLaunchKernel(f_slow, 1, 1, 1, 1, 1, 1, 0, s, NULL, NULL), CUDA_SUCCESS);
  CU_ASSERT_EQUAL(cuEventRecord(e, s), CUDA_SUCCESS);
  CU_ASSERT_EQUAL(cuStreamDestroy_v2(s), CUDA_SUCCESS);
  CU_ASSERT_EQUAL(cuEventSynchronize(e), CUDA_SUCCESS);
  CU_ASSERT_EQUAL(cuEventQuery(e), CUDA_SUCCESS);
  float ms;
  CU_ASSERT_EQUAL(cuEventElapsedTime_v2(&ms, e, e), CUDA_ERROR_INVALID_HANDLE); /* no timing */
  CU_ASSERT_EQUAL(cuEventDestroy_v2(e), CUDA_SUCCESS);
  wltest_driver_stats_t st = stats();
  CU_ASSERT_EQUAL(st.streams, 0);
  CU_ASSERT_EQUAL(st.events, 0);
}

/* Another thread's per-thread default stream: its own timeline. */
static void *pt_other(void *arg) {
  CUevent e = arg;
  CUresult rc = cuCtxSetCurrent(ctx);
  if (rc == CUDA_SUCCESS) rc = cuLaunchKernel_ptsz(f_slow, 1, 1, 1, 1, 1, 1, 0, NULL, NULL, NULL);
  if (rc == CUDA_SUCCESS) rc = cuEventRecord(e, CU_STREAM_PER_THREAD);
  if (rc == CUDA_SUCCESS) rc = cuStreamSynchronize(CU_STREAM_PER_THREAD);
  return (void *)(uintptr_t)rc;
}

/* Each thread has its own per-thread default stream: holding this thread's does not hold
 * another's, nor the legacy stream; and they are not counted as created streams. */
static void test_per_thread_streams(void) {
  uint64_t streams = stats().streams;
  CUevent mine, theirs;
  CU_ASSERT_EQUAL_FATAL(cuEventCreate(&mine, 0), CUDA_SUCCESS);
  CU_ASSERT_EQUAL_FATAL(cuEventCreate(&theirs, 0), CUDA_SUCCESS);
  CU_ASSERT_EQUAL(wltest_stream_hold(CU_STREAM_PER_THREAD), 0);
  CU_ASSERT_EQUAL(cuLaunchKernel_ptsz(f_slow, 1, 1, 1, 1, 1, 1, 0, NULL, NULL, NULL), CUDA_SUCCESS);
  CU_ASSERT_EQUAL(cuEventRecord(mine, CU_STREAM_PER_THREAD), CUDA_SUCCESS);
  pthread_t t;
  CU_ASSERT_EQUAL_FATAL(pthread_create(&t, NULL, pt_other, theirs), 0);
  void *rc;
  pthread_join(t, &rc);
  CU_ASSERT_EQUAL((CUresult)(uintptr_t)rc, CUDA_SUCCESS);
  CU_ASSERT_EQUAL(cuEventQuery(theirs), CUDA_SUCCESS);
  CU_ASSERT_EQUAL(cuEventQuery(mine), CUDA_ERROR_NOT_READY);
  CU_ASSERT_EQUAL(cuStreamQuery(CU_STREAM_LEGACY), CUDA_SUCCESS);
  CU_ASSERT_EQUAL(stats().streams, streams);
  CU_ASSERT_EQUAL(wltest_stream_release(CU_STREAM_PER_THREAD), 0);
  CU_ASSERT_EQUAL(cuStreamSynchronize(CU_STREAM_PER_THREAD), CUDA_SUCCESS);
  CU_ASSERT_EQUAL(cuEventQuery(mine), CUDA_SUCCESS);
  CU_ASSERT_EQUAL(cuEventDestroy_v2(mine), CUDA_SUCCESS);
  CU_ASSERT_EQUAL(cuEventDestroy_v2(theirs), CUDA_SUCCESS);
}

/* Child mode (this executable run with --child-hold): joins the shared device, holds 40 MiB,
 * says so on stdout and waits to be killed. */
static int child_hold(void) {
  CUcontext c;
  CUdeviceptr p;
  if (cuInit(0) || cuDevicePrimaryCtxRetain(&c, 0) || cuCtxSetCurrent(c) ||
      cuMemAlloc_v2(&p, 40 * MiB))
    return 1;
  if (write(1, "h", 1) != 1) return 1;
  for (;;) pause();
}

/* Processes naming the same WLTEST_DEVICE_SHM share one device's memory; a killed process's
 * memory comes back. */
static void test_shared_device(void) {
  int fds[2];
  CU_ASSERT_EQUAL_FATAL(pipe(fds), 0);
  pid_t child = fork();
  CU_ASSERT_FATAL(child >= 0);
  if (child == 0) {
    dup2(fds[1], 1);
    execl("/proc/self/exe", "test_doubles_driver", "--child-hold", (char *)NULL);
    _exit(127);
  }
  close(fds[1]);
  char c = 0;
  CU_ASSERT_EQUAL(read(fds[0], &c, 1), 1);
  close(fds[0]);
  CU_ASSERT_EQUAL(c, 'h');
  size_t fr, tot;
  CU_ASSERT_EQUAL(cuMemGetInfo_v2(&fr, &tot), CUDA_SUCCESS);
  CU_ASSERT_EQUAL(fr, 24 * MiB);
  CUdeviceptr p;
  CU_ASSERT_EQUAL(cuMemAlloc_v2(&p, 32 * MiB), CUDA_ERROR_OUT_OF_MEMORY);
  CU_ASSERT_EQUAL(stats().used, 0); /* this process's own */
  kill(child, SIGKILL);
  waitpid(child, NULL, 0);
  CU_ASSERT_EQUAL_FATAL(cuMemAlloc_v2(&p, 32 * MiB), CUDA_SUCCESS);
  CU_ASSERT_EQUAL(cuMemGetInfo_v2(&fr, &tot), CUDA_SUCCESS);
  CU_ASSERT_EQUAL(fr, 32 * MiB);
  CU_ASSERT_EQUAL(cuMemFree_v2(p), CUDA_SUCCESS);
}

/* ---- shareable VMM handles and CUDA IPC ------------------------------------------------------*/

static const CUmemAllocationProp fd_prop = {.type = CU_MEM_ALLOCATION_TYPE_PINNED,
                                            .location = {CU_MEM_LOCATION_TYPE_DEVICE, 0},
                                            .requestedHandleTypes =
                                                CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR};

/* Reserves size bytes, maps h there and grants read-write access: the address, or 0. */
static CUdeviceptr map_rw(CUmemGenericAllocationHandle h, size_t size) {
  CUdeviceptr va = 0;
  CUmemAccessDesc acc = {.location = fd_prop.location, .flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE};
  if (cuMemAddressReserve(&va, size, 0, 0, 0) != CUDA_SUCCESS) return 0;
  if (cuMemMap(va, size, 0, h, 0) != CUDA_SUCCESS || cuMemSetAccess(va, size, &acc, 1)) {
    cuMemAddressFree(va, size);
    return 0;
  }
  return va;
}

static CUresult unmap_free(CUdeviceptr va, size_t size) {
  CUresult rc = cuMemUnmap(va, size);
  return rc != CUDA_SUCCESS ? rc : cuMemAddressFree(va, size);
}

/* Writes a pattern of seed over n bytes; checks it. */
static void fill(CUdeviceptr va, size_t n, unsigned seed) {
  unsigned char *p = (unsigned char *)(uintptr_t)va;
  for (size_t i = 0; i < n; i++) p[i] = (unsigned char)(i % 251 + seed);
}
static bool holds_from(CUdeviceptr va, size_t from, size_t n, unsigned seed) {
  const unsigned char *p = (const unsigned char *)(uintptr_t)va;
  for (size_t i = from; i < n; i++)
    if (p[i] != (unsigned char)(i % 251 + seed)) return false;
  return true;
}
static bool holds(CUdeviceptr va, size_t n, unsigned seed) {
  return holds_from(va, 0, n, seed);
}

/* cuMemRetainAllocationHandle: the handle of mapped memory, one more reference, also after the
 * last handle was released while it stayed mapped (NCCL's free); memory goes at the last unmap
 * once every reference is released. */
static void test_vmm_retain(void) {
  uint64_t used = stats().used, handles = stats().handles;
  CUmemGenericAllocationHandle h = 0, r = 0, r2 = 0;
  CUdeviceptr va = 0;
  CU_ASSERT_EQUAL_FATAL(cuMemCreate(&h, 2 * MiB, &fd_prop, 0), CUDA_SUCCESS);
  CU_ASSERT_EQUAL_FATAL(cuMemAddressReserve(&va, 2 * MiB, 0, 0, 0), CUDA_SUCCESS);
  CU_ASSERT_EQUAL(cuMemMap(va, 2 * MiB, 0, h, 0), CUDA_SUCCESS);
  CU_ASSERT_EQUAL(cuMemRetainAllocationHandle(&r, (void *)(uintptr_t)(va + 4096)), CUDA_SUCCESS);
  CU_ASSERT_EQUAL(r, h);
  CU_ASSERT_EQUAL(stats().handles, handles + 2); /* two references */
  CU_ASSERT_EQUAL(cuMemRelease(h), CUDA_SUCCESS);
  CU_ASSERT_EQUAL(cuMemRelease(r), CUDA_SUCCESS);
  CU_ASSERT_EQUAL(stats().handles, handles);
  CU_ASSERT_EQUAL(stats().used, used + 2 * MiB); /* mapped: still there */
  CU_ASSERT_EQUAL(cuMemRetainAllocationHandle(&r2, (void *)(uintptr_t)va), CUDA_SUCCESS);
  CU_ASSERT_EQUAL(r2, h);
  CU_ASSERT_EQUAL(cuMemRelease(r2), CUDA_SUCCESS);
  CU_ASSERT_EQUAL(cuMemUnmap(va, 2 * MiB), CUDA_SUCCESS);
  CU_ASSERT_EQUAL(stats().used, used); /* the last unmap freed it */
  uint64_t m = stats().misuse;
  CU_ASSERT_EQUAL(cuMemRetainAllocationHandle(&r2, (void *)(uintptr_t)va),
                  CUDA_ERROR_INVALID_VALUE);
  CU_ASSERT_EQUAL(stats().misuse, m + 1);
  CU_ASSERT_EQUAL(cuMemAddressFree(va, 2 * MiB), CUDA_SUCCESS);
}

/* A handle created for POSIX file descriptors is exported as a new descriptor (close-on-exec)
 * and imported as a handle of its own over the same memory: mappings of both see each other's
 * writes. The import is not charged; releasing it releases only it. */
static void test_vmm_fd_share(void) {
  int v = -1;
  CU_ASSERT_EQUAL(
      cuDeviceGetAttribute(&v, CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR_SUPPORTED, 0),
      CUDA_SUCCESS);
  CU_ASSERT_EQUAL(v, 1);
  CU_ASSERT_EQUAL(cuDeviceGetAttribute(&v, CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_FABRIC_SUPPORTED, 0),
                  CUDA_SUCCESS);
  CU_ASSERT_EQUAL(v, 0);
  size_t gran = 0;
  CU_ASSERT_EQUAL(cuMemGetAllocationGranularity(&gran, &fd_prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM),
                  CUDA_SUCCESS);
  CU_ASSERT_EQUAL(gran, 2 * MiB);
  uint64_t m = stats().misuse, used = stats().used;
  CUmemGenericAllocationHandle h = 0, h2 = 0;
  CU_ASSERT_EQUAL_FATAL(cuMemCreate(&h, 2 * MiB, &fd_prop, 0), CUDA_SUCCESS);
  CU_ASSERT_EQUAL(stats().used, used + 2 * MiB);
  CUmemAllocationProp got;
  CU_ASSERT_EQUAL(cuMemGetAllocationPropertiesFromHandle(&got, h), CUDA_SUCCESS);
  CU_ASSERT_EQUAL(got.type, CU_MEM_ALLOCATION_TYPE_PINNED);
  CU_ASSERT_EQUAL(got.location.type, CU_MEM_LOCATION_TYPE_DEVICE);
  CU_ASSERT_EQUAL(got.location.id, 0);
  CU_ASSERT_EQUAL(got.requestedHandleTypes, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR);
  int fd = -1;
  CU_ASSERT_EQUAL_FATAL(
      cuMemExportToShareableHandle(&fd, h, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0),
      CUDA_SUCCESS);
  CU_ASSERT(fd > 2);
  CU_ASSERT(fcntl(fd, F_GETFD) & FD_CLOEXEC);
  size_t fr0, fr1, tot;
  CU_ASSERT_EQUAL(cuMemGetInfo_v2(&fr0, &tot), CUDA_SUCCESS);
  CU_ASSERT_EQUAL_FATAL(cuMemImportFromShareableHandle(&h2, (void *)(uintptr_t)fd,
                                                       CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR),
                        CUDA_SUCCESS);
  CU_ASSERT_NOT_EQUAL(h2, h);
  /* The caller's descriptor stays the caller's: closing it leaves the import whole. */
  CU_ASSERT_EQUAL(close(fd), 0);
  CU_ASSERT_EQUAL(cuMemGetInfo_v2(&fr1, &tot), CUDA_SUCCESS);
  CU_ASSERT_EQUAL(fr1, fr0); /* not charged */
  wltest_driver_stats_t st = stats();
  CU_ASSERT_EQUAL(st.used, used + 2 * MiB);
  CU_ASSERT_EQUAL(st.imported_handles, 1);
  CU_ASSERT_EQUAL(st.imported_bytes, 2 * MiB);
  CU_ASSERT_EQUAL(cuMemGetAllocationPropertiesFromHandle(&got, h2), CUDA_SUCCESS);
  CU_ASSERT_EQUAL(got.requestedHandleTypes, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR);
  CUdeviceptr a = map_rw(h, 2 * MiB), b = map_rw(h2, 2 * MiB);
  CU_ASSERT_FATAL(a && b && a != b);
  fill(a, 2 * MiB, 3);
  CU_ASSERT(holds(b, 2 * MiB, 3));
  fill(b + MiB, MiB, 9);
  CU_ASSERT(holds(a + MiB, MiB, 9));
  /* An imported handle may be exported again. */
  int fd2 = -1;
  CU_ASSERT_EQUAL(
      cuMemExportToShareableHandle(&fd2, h2, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0),
      CUDA_SUCCESS);
  CU_ASSERT(fd2 > 2 && close(fd2) == 0);
  /* Releasing the import releases it alone; its mapping lives until unmapped. */
  CU_ASSERT_EQUAL(cuMemRelease(h2), CUDA_SUCCESS);
  CU_ASSERT_EQUAL(stats().imported_handles, 0);
  CU_ASSERT(holds(b, MiB, 3));
  CU_ASSERT_EQUAL(unmap_free(b, 2 * MiB), CUDA_SUCCESS);
  CU_ASSERT_EQUAL(stats().imported_bytes, 0);
  CU_ASSERT(holds(a, MiB, 3));
  CU_ASSERT_EQUAL(stats().used, used + 2 * MiB);
  CU_ASSERT_EQUAL(cuMemRelease(h2), CUDA_ERROR_INVALID_VALUE); /* released: misuse */
  CU_ASSERT_EQUAL(unmap_free(a, 2 * MiB), CUDA_SUCCESS);
  CU_ASSERT_EQUAL(cuMemRelease(h), CUDA_SUCCESS);
  CU_ASSERT_EQUAL(stats().used, used);
  CU_ASSERT_EQUAL(stats().misuse, m + 1);
}

/* What cannot be shared so, and the codes: types other than POSIX file descriptors are not
 * supported (no misuse); exporting a type the handle was not created for, unknown handles, flags,
 * and descriptors that are not the double's memory are misuse (CUDA_ERROR_INVALID_VALUE). */
static void test_vmm_fd_errors(void) {
  CUmemAllocationProp prop = fd_prop;
  CUmemGenericAllocationHandle h = 0, plain = 0, imp = 0;
  uint64_t m = stats().misuse, used = stats().used;
  prop.requestedHandleTypes = CU_MEM_HANDLE_TYPE_FABRIC;
  CU_ASSERT_EQUAL(cuMemCreate(&h, 2 * MiB, &prop, 0), CUDA_ERROR_NOT_SUPPORTED);
  prop.requestedHandleTypes = CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR | CU_MEM_HANDLE_TYPE_WIN32;
  CU_ASSERT_EQUAL(cuMemCreate(&h, 2 * MiB, &prop, 0), CUDA_ERROR_NOT_SUPPORTED);
  CU_ASSERT_EQUAL(stats().misuse, m);
  CU_ASSERT_EQUAL(stats().used, used);
  prop.requestedHandleTypes = (CUmemAllocationHandleType)0x40;
  CU_ASSERT_EQUAL(cuMemCreate(&h, 2 * MiB, &prop, 0), CUDA_ERROR_INVALID_VALUE);
  CU_ASSERT_EQUAL(stats().misuse, ++m);
  prop.requestedHandleTypes = CU_MEM_HANDLE_TYPE_NONE;
  CU_ASSERT_EQUAL_FATAL(cuMemCreate(&plain, 2 * MiB, &prop, 0), CUDA_SUCCESS);
  CU_ASSERT_EQUAL_FATAL(cuMemCreate(&h, 2 * MiB, &fd_prop, 0), CUDA_SUCCESS);
  int fd = -1;
  const CUmemAllocationHandleType FD = CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;
  CU_ASSERT_EQUAL(cuMemExportToShareableHandle(&fd, plain, FD, 0), CUDA_ERROR_INVALID_VALUE);
  CU_ASSERT_EQUAL(cuMemExportToShareableHandle(&fd, h, CU_MEM_HANDLE_TYPE_FABRIC, 0),
                  CUDA_ERROR_INVALID_VALUE);
  CU_ASSERT_EQUAL(cuMemExportToShareableHandle(&fd, h, FD, 1), CUDA_ERROR_INVALID_VALUE);
  CU_ASSERT_EQUAL(cuMemExportToShareableHandle(NULL, h, FD, 0), CUDA_ERROR_INVALID_VALUE);
  CU_ASSERT_EQUAL(cuMemExportToShareableHandle(&fd, h + 1000, FD, 0), CUDA_ERROR_INVALID_VALUE);
  CU_ASSERT_EQUAL(fd, -1);
  CU_ASSERT_EQUAL(stats().misuse, m += 5);
  /* Descriptors that are not the double's memory, and ones that are not open. */
  int pfd[2];
  CU_ASSERT_EQUAL_FATAL(pipe(pfd), 0);
  CU_ASSERT_EQUAL(cuMemImportFromShareableHandle(&imp, (void *)(uintptr_t)pfd[0], FD),
                  CUDA_ERROR_INVALID_VALUE);
  close(pfd[0]);
  close(pfd[1]);
  CU_ASSERT_EQUAL(cuMemImportFromShareableHandle(&imp, (void *)(uintptr_t)pfd[0], FD),
                  CUDA_ERROR_INVALID_VALUE);
  CU_ASSERT_EQUAL(cuMemImportFromShareableHandle(&imp, (void *)(intptr_t)-1, FD),
                  CUDA_ERROR_INVALID_VALUE);
  CU_ASSERT_EQUAL(stats().misuse, m += 3);
  CU_ASSERT_EQUAL_FATAL(cuMemExportToShareableHandle(&fd, h, FD, 0), CUDA_SUCCESS);
  CU_ASSERT_EQUAL(
      cuMemImportFromShareableHandle(&imp, (void *)(uintptr_t)fd, FD | CU_MEM_HANDLE_TYPE_FABRIC),
      CUDA_ERROR_INVALID_VALUE);
  CU_ASSERT_EQUAL(stats().misuse, ++m);
  CU_ASSERT_EQUAL(
      cuMemImportFromShareableHandle(&imp, (void *)(uintptr_t)fd, CU_MEM_HANDLE_TYPE_FABRIC),
      CUDA_ERROR_NOT_SUPPORTED);
  CU_ASSERT_EQUAL(stats().misuse, m);
  CU_ASSERT_EQUAL(stats().imported_handles, 0);
  CUmemAllocationProp got;
  CU_ASSERT_EQUAL(cuMemGetAllocationPropertiesFromHandle(&got, plain), CUDA_SUCCESS);
  CU_ASSERT_EQUAL(got.requestedHandleTypes, CU_MEM_HANDLE_TYPE_NONE);
  CU_ASSERT_EQUAL(close(fd), 0);
  CU_ASSERT_EQUAL(cuMemRelease(plain), CUDA_SUCCESS);
  CU_ASSERT_EQUAL(cuMemRelease(h), CUDA_SUCCESS);
  CU_ASSERT_EQUAL(cuMemGetAllocationPropertiesFromHandle(&got, h), CUDA_ERROR_INVALID_VALUE);
  CU_ASSERT_EQUAL(stats().misuse, m + 1);
  CU_ASSERT_EQUAL(stats().used, used);
}

/* Child mode (--child-import FD SEED): a process of its own on the shared device imports the
 * descriptor it inherited, checks the parent's pattern SEED and that nothing was charged to it,
 * then writes SEED + 1 for the parent to see. 0 when all held. */

static int child_import(int fd, unsigned seed) {
  CUcontext c;
  size_t fr0, fr1, tot;
  WL_CHILD_CHECK(cuInit(0) == CUDA_SUCCESS);
  WL_CHILD_CHECK(cuDevicePrimaryCtxRetain(&c, 0) == CUDA_SUCCESS && cuCtxSetCurrent(c) == 0);
  WL_CHILD_CHECK(cuMemGetInfo_v2(&fr0, &tot) == CUDA_SUCCESS);
  WL_CHILD_CHECK(fr0 < tot); /* the parent's memory is on the shared device */
  CUmemGenericAllocationHandle h;
  WL_CHILD_CHECK(cuMemImportFromShareableHandle(&h, (void *)(uintptr_t)fd,
                                                CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR) ==
                 CUDA_SUCCESS);
  WL_CHILD_CHECK(close(fd) == 0);
  CUdeviceptr va = map_rw(h, 2 * MiB);
  WL_CHILD_CHECK(va != 0);
  WL_CHILD_CHECK(holds(va, 2 * MiB, seed));
  fill(va, 2 * MiB, seed + 1);
  WL_CHILD_CHECK(cuMemGetInfo_v2(&fr1, &tot) == CUDA_SUCCESS);
  WL_CHILD_CHECK(fr1 == fr0);
  wltest_driver_stats_t st = stats();
  WL_CHILD_CHECK(st.used == 0 && st.imported_handles == 1 && st.imported_bytes == 2 * MiB);
  WL_CHILD_CHECK(unmap_free(va, 2 * MiB) == CUDA_SUCCESS);
  WL_CHILD_CHECK(cuMemRelease(h) == CUDA_SUCCESS);
  WL_CHILD_CHECK(stats().misuse == 0);
  return 0;
}

/* Runs this executable again with args (after --child-...), the descriptor keep inherited (-1:
 * none): its exit status, or -1. A new program, as the processes sharing memory are, not a
 * forked copy of this one with the double's state (and the memory's mappings) inherited. */
static int run_child(int keep, const char *a1, const char *a2, const char *a3) {
  pid_t child = fork();
  if (child < 0) return -1;
  if (child == 0) {
    if (keep >= 0) {
      int k = dup(keep); /* without close-on-exec */
      char buf[16];
      snprintf(buf, sizeof buf, "%d", k);
      execl("/proc/self/exe", "test_doubles_driver", a1, buf, a2, a3, (char *)NULL);
    } else {
      execl("/proc/self/exe", "test_doubles_driver", a1, a2, a3, (char *)NULL);
    }
    _exit(127);
  }
  int st = 0;
  if (waitpid(child, &st, 0) != child || !WIFEXITED(st)) return -1;
  return WEXITSTATUS(st);
}

/* Another process imports an exported descriptor and shares the bytes both ways. */
static void test_vmm_fd_child(void) {
  CUmemGenericAllocationHandle h;
  CU_ASSERT_EQUAL_FATAL(cuMemCreate(&h, 2 * MiB, &fd_prop, 0), CUDA_SUCCESS);
  CUdeviceptr va = map_rw(h, 2 * MiB);
  CU_ASSERT_FATAL(va != 0);
  fill(va, 2 * MiB, 40);
  int fd = -1;
  CU_ASSERT_EQUAL_FATAL(
      cuMemExportToShareableHandle(&fd, h, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0),
      CUDA_SUCCESS);
  CU_ASSERT_EQUAL(run_child(fd, "--child-import", "40", NULL), 0);
  CU_ASSERT(holds(va, 2 * MiB, 41));
  CU_ASSERT_EQUAL(close(fd), 0);
  CU_ASSERT_EQUAL(unmap_free(va, 2 * MiB), CUDA_SUCCESS);
  CU_ASSERT_EQUAL(cuMemRelease(h), CUDA_SUCCESS);
}

/* With WLTEST_NO_POSIX_FD=1 (read at cuInit: the test runs itself again with it set) the device
 * says it has no descriptor handles and cuMemCreate refuses them, as a driver without them would:
 * CUDA_ERROR_NOT_SUPPORTED, no misuse; plain handles still work. */
static void test_no_posix_fd(void) {
  if (!getenv("WLTEST_NO_POSIX_FD")) {
    CU_ASSERT_TRUE(wl_test_rerun("WLTEST_NO_POSIX_FD", "1", "test_doubles_driver", "no_posix_fd"));
    return;
  }
  CU_ASSERT_EQUAL_FATAL(cuInit(0), CUDA_SUCCESS);
  int v = -1;
  CU_ASSERT_EQUAL(
      cuDeviceGetAttribute(&v, CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR_SUPPORTED, 0),
      CUDA_SUCCESS);
  CU_ASSERT_EQUAL(v, 0);
  CUmemGenericAllocationHandle h = 0, h2 = 0;
  CU_ASSERT_EQUAL(cuMemCreate(&h, 2 * MiB, &fd_prop, 0), CUDA_ERROR_NOT_SUPPORTED);
  CU_ASSERT_EQUAL(stats().used, 0);
  CUmemAllocationProp plain = fd_prop;
  plain.requestedHandleTypes = CU_MEM_HANDLE_TYPE_NONE;
  CU_ASSERT_EQUAL_FATAL(cuMemCreate(&h, 2 * MiB, &plain, 0), CUDA_SUCCESS);
  CU_ASSERT_EQUAL(cuMemImportFromShareableHandle(&h2, (void *)(uintptr_t)0,
                                                 CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR),
                  CUDA_ERROR_NOT_SUPPORTED);
  CUdeviceptr va = map_rw(h, 2 * MiB);
  CU_ASSERT(va != 0);
  CU_ASSERT_EQUAL(unmap_free(va, 2 * MiB), CUDA_SUCCESS);
  CU_ASSERT_EQUAL(cuMemRelease(h), CUDA_SUCCESS);
  CU_ASSERT_EQUAL(stats().misuse, 0);
}

#define IPC_BYTES (MiB + 100) /* not whole pages */

/* Child mode (--child-ipc HANDLE SEED): opens a cuMemAlloc allocation of IPC_BYTES another process
 * exported, checks pattern SEED; opens it again (the 4.1 ABI: the same pointer, one more
 * reference), copies, sets and launches on it as on device memory, writes pattern SEED + 1 with
 * wl_t_add's twin adding 7 to its first word, and closes it twice; refuses bad handles and
 * closes. 0 when all held. */
static int child_ipc(const char *hex, unsigned seed) {
  const size_t n = IPC_BYTES;
  CUipcMemHandle h;
  CUcontext c;
  WL_CHILD_CHECK(wl_test_unhex(hex, &h, sizeof h));
  WL_CHILD_CHECK(cuInit(0) == CUDA_SUCCESS);
  WL_CHILD_CHECK(cuDevicePrimaryCtxRetain(&c, 0) == CUDA_SUCCESS && cuCtxSetCurrent(c) == 0);
  CUmodule md;
  CUfunction add;
  WL_CHILD_CHECK(cuModuleLoadData(&md, ptx) == CUDA_SUCCESS);
  WL_CHILD_CHECK(cuModuleGetFunction(&add, md, "wl_t_add") == CUDA_SUCCESS);
  size_t fr0, fr1, tot;
  WL_CHILD_CHECK(cuMemGetInfo_v2(&fr0, &tot) == CUDA_SUCCESS);
  CUdeviceptr p = 0, q = 0;
  WL_CHILD_CHECK(cuIpcOpenMemHandle(&p, h, CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS) == CUDA_SUCCESS);
  WL_CHILD_CHECK(p != 0);
  WL_CHILD_CHECK(cuIpcOpenMemHandle_v1(&q, h, 0) == CUDA_SUCCESS);
  WL_CHILD_CHECK(q == p);
  wltest_driver_stats_t st = stats();
  WL_CHILD_CHECK(st.ipc_opened == 1 && st.used == 0);
  WL_CHILD_CHECK(cuMemGetInfo_v2(&fr1, &tot) == CUDA_SUCCESS && fr1 == fr0);
  WL_CHILD_CHECK(holds(p, n, seed));
  /* Device memory to the double's copies, sets and launches. */
  unsigned char *back = malloc(n);
  WL_CHILD_CHECK(back && cuMemcpyDtoH_v2(back, p, n) == CUDA_SUCCESS);
  WL_CHILD_CHECK(holds((CUdeviceptr)(uintptr_t)back, n, seed));
  CUdeviceptr tmp;
  WL_CHILD_CHECK(cuMemAlloc_v2(&tmp, n) == CUDA_SUCCESS);
  fill((CUdeviceptr)(uintptr_t)back, n, seed + 1);
  WL_CHILD_CHECK(cuMemcpyHtoD_v2(tmp, back, n) == CUDA_SUCCESS);
  WL_CHILD_CHECK(cuMemsetD8_v2(p, 0, n) == CUDA_SUCCESS);
  WL_CHILD_CHECK(cuMemcpyDtoD_v2(p, tmp, n) == CUDA_SUCCESS);
  WL_CHILD_CHECK(cuMemFree_v2(tmp) == CUDA_SUCCESS);
  free(back);
  unsigned k = 7;
  void *args[] = {&p, &k};
  WL_CHILD_CHECK(cuLaunchKernel(add, 1, 1, 1, 1, 1, 1, 0, NULL, args, NULL) == CUDA_SUCCESS);
  WL_CHILD_CHECK(cuCtxSynchronize() == CUDA_SUCCESS);
  /* Not cuMemAlloc memory: no cuMemFree, no handle of its own. */
  CUipcMemHandle again;
  WL_CHILD_CHECK(cuMemFree_v2(p) == CUDA_ERROR_INVALID_VALUE);
  WL_CHILD_CHECK(cuIpcGetMemHandle(&again, p) == CUDA_ERROR_INVALID_VALUE);
  /* Bad handles: not the double's, a generation that was never exported, a flag. */
  CUipcMemHandle bad = h;
  bad.reserved[0] ^= 1;
  WL_CHILD_CHECK(cuIpcOpenMemHandle(&q, bad, 0) == CUDA_ERROR_INVALID_HANDLE);
  bad = h;
  bad.reserved[32] ^= 1; /* the generation */
  WL_CHILD_CHECK(cuIpcOpenMemHandle(&q, bad, 0) == CUDA_ERROR_INVALID_HANDLE);
  WL_CHILD_CHECK(cuIpcOpenMemHandle(&q, h, 2) == CUDA_ERROR_INVALID_VALUE);
  WL_CHILD_CHECK(stats().misuse == 4);
  /* Two references: the first close leaves it mapped, the second unmaps. */
  WL_CHILD_CHECK(cuIpcCloseMemHandle(p) == CUDA_SUCCESS);
  WL_CHILD_CHECK(stats().ipc_opened == 1);
  WL_CHILD_CHECK(*(volatile unsigned char *)(uintptr_t)(p + n - 1) ==
                 (unsigned char)((n - 1) % 251 + seed + 1));
  WL_CHILD_CHECK(cuIpcCloseMemHandle(p) == CUDA_SUCCESS);
  st = stats();
  WL_CHILD_CHECK(st.ipc_opened == 0 && st.ipc_open_bytes == 0);
  WL_CHILD_CHECK(cuIpcCloseMemHandle(p) == CUDA_ERROR_INVALID_VALUE);
  WL_CHILD_CHECK(stats().misuse == 5);
  return 0;
}

/* Child mode (--child-ipc-gone HANDLE): the handle's allocation was freed: refused. */
static int child_ipc_gone(const char *hex) {
  CUipcMemHandle h;
  CUcontext c;
  CUdeviceptr p = 0;
  WL_CHILD_CHECK(wl_test_unhex(hex, &h, sizeof h));
  WL_CHILD_CHECK(cuInit(0) == CUDA_SUCCESS);
  WL_CHILD_CHECK(cuDevicePrimaryCtxRetain(&c, 0) == CUDA_SUCCESS && cuCtxSetCurrent(c) == 0);
  WL_CHILD_CHECK(cuIpcOpenMemHandle(&p, h, 0) == CUDA_ERROR_INVALID_HANDLE);
  WL_CHILD_CHECK(p == 0 && stats().ipc_opened == 0);
  return 0;
}

/* Child mode (--child-ipc-reset HANDLE): a reset before any context is nothing to do; then an
 * opened handle (device memory of this process's device, interior pointers too) goes with its
 * context's reset: unknown to cuPointerGetAttribute, closing it a misuse. Writes 99 through it
 * first, for the parent to see. 0 when all held. */
static int child_ipc_reset(const char *hex) {
  CUipcMemHandle h;
  CUcontext c;
  CUdeviceptr p = 0;
  WL_CHILD_CHECK(wl_test_unhex(hex, &h, sizeof h));
  WL_CHILD_CHECK(cuInit(0) == CUDA_SUCCESS);
  WL_CHILD_CHECK(cuDevicePrimaryCtxReset_v2(0) == CUDA_SUCCESS);
  WL_CHILD_CHECK(stats().resets == 1);
  WL_CHILD_CHECK(cuDevicePrimaryCtxRetain(&c, 0) == CUDA_SUCCESS && cuCtxSetCurrent(c) == 0);
  WL_CHILD_CHECK(cuIpcOpenMemHandle(&p, h, 0) == CUDA_SUCCESS);
  int dev = -1;
  unsigned type = 0;
  CUdeviceptr start = 0;
  size_t size = 0;
  CUcontext owner = NULL;
  WL_CHILD_CHECK(cuPointerGetAttribute(&dev, CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL, p + 8) == 0);
  WL_CHILD_CHECK(cuPointerGetAttribute(&type, CU_POINTER_ATTRIBUTE_MEMORY_TYPE, p + 8) == 0);
  WL_CHILD_CHECK(cuPointerGetAttribute(&start, CU_POINTER_ATTRIBUTE_RANGE_START_ADDR, p + 8) == 0);
  WL_CHILD_CHECK(cuPointerGetAttribute(&size, CU_POINTER_ATTRIBUTE_RANGE_SIZE, p + 8) == 0);
  WL_CHILD_CHECK(cuPointerGetAttribute(&owner, CU_POINTER_ATTRIBUTE_CONTEXT, p) == 0);
  WL_CHILD_CHECK(dev == 0 && type == CU_MEMORYTYPE_DEVICE && start == p && size == IPC_BYTES &&
                 owner == c);
  *(volatile unsigned char *)(uintptr_t)p = 99;
  WL_CHILD_CHECK(stats().ipc_opened == 1);
  WL_CHILD_CHECK(cuDevicePrimaryCtxReset_v2(0) == CUDA_SUCCESS);
  wltest_driver_stats_t st = stats();
  WL_CHILD_CHECK(st.ipc_opened == 0 && st.ipc_open_bytes == 0 && st.resets == 2);
  WL_CHILD_CHECK(cuPointerGetAttribute(&dev, CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL, p) ==
                 CUDA_ERROR_INVALID_VALUE);
  WL_CHILD_CHECK(stats().misuse == 0);
  WL_CHILD_CHECK(cuIpcCloseMemHandle(p) == CUDA_ERROR_INVALID_VALUE);
  WL_CHILD_CHECK(stats().misuse == 1);
  return 0;
}

/* CUDA IPC of cuMemAlloc memory: the handle is the same each time and names this process; the
 * bytes written before it survive; another process opens it and shares the bytes both ways
 * (child_ipc); this process cannot open its own handle; pool memory and interior pointers have
 * none; a freed handle cannot be opened, and a new allocation (at the same address or not) gets
 * a new handle. */
static void test_ipc(void) {
  const size_t n = IPC_BYTES;
  CUdeviceptr d;
  CU_ASSERT_EQUAL_FATAL(cuMemAlloc_v2(&d, n), CUDA_SUCCESS);
  fill(d, n, 60);
  uint64_t m = stats().misuse, used = stats().used;
  CUipcMemHandle h, h2;
  CU_ASSERT_EQUAL_FATAL(cuIpcGetMemHandle(&h, d), CUDA_SUCCESS);
  CU_ASSERT_EQUAL(stats().ipc_exported, 1);
  CU_ASSERT(holds(d, n, 60)); /* moved into shared memory whole */
  CU_ASSERT_EQUAL(cuIpcGetMemHandle(&h2, d), CUDA_SUCCESS);
  CU_ASSERT_EQUAL(memcmp(&h, &h2, sizeof h), 0);
  CU_ASSERT_EQUAL(memcmp(h.reserved, "WLTSTIPC", 8), 0);
  CU_ASSERT_NOT_EQUAL(memcmp(h.reserved, "WLIPC\x01\xa5\x5a", 8), 0); /* not the interposer's */
  int32_t pid;
  memcpy(&pid, h.reserved + 8, sizeof pid);
  CU_ASSERT_EQUAL(pid, (int32_t)getpid());
  CU_ASSERT_EQUAL(stats().used, used);
  /* Not in the exporting process (CUDA answers "invalid device context"). */
  CUdeviceptr p = 0;
  CU_ASSERT_EQUAL(cuIpcOpenMemHandle(&p, h, CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS),
                  CUDA_ERROR_INVALID_CONTEXT);
  CU_ASSERT_EQUAL(stats().misuse, ++m);
  char hex[2 * sizeof h + 1];
  wl_test_hex(&h, sizeof h, hex);
  CU_ASSERT_EQUAL(run_child(-1, "--child-ipc", hex, "60"), 0);
  /* The child's bytes: pattern 61, and its kernel's +7 on the first word. */
  unsigned char head[4];
  for (int i = 0; i < 4; i++) head[i] = (unsigned char)(i + 61);
  unsigned want, first;
  memcpy(&want, head, sizeof want);
  memcpy(&first, (void *)(uintptr_t)d, sizeof first);
  CU_ASSERT_EQUAL(first, want + 7);
  CU_ASSERT(holds_from(d, 4, n, 61));
  /* A pointer inside the allocation gets its handle, as from the driver (an H200 answers so);
   * pool memory and a NULL output get none. */
  CU_ASSERT_EQUAL(cuIpcGetMemHandle(&h2, d + 512), CUDA_SUCCESS);
  CU_ASSERT_EQUAL(memcmp(&h, &h2, sizeof h), 0);
  CUdeviceptr pooled;
  CU_ASSERT_EQUAL_FATAL(cuMemAllocAsync(&pooled, MiB, NULL), CUDA_SUCCESS);
  CU_ASSERT_EQUAL(cuIpcGetMemHandle(&h2, pooled), CUDA_ERROR_INVALID_VALUE);
  CU_ASSERT_EQUAL(cuMemFreeAsync(pooled, NULL), CUDA_SUCCESS);
  CU_ASSERT_EQUAL(cuIpcGetMemHandle(NULL, d), CUDA_ERROR_INVALID_VALUE);
  CU_ASSERT_EQUAL(cuIpcCloseMemHandle(d), CUDA_ERROR_INVALID_VALUE);
  CU_ASSERT_EQUAL(stats().misuse, m += 2);
  /* Freed: the handle opens nothing; the next allocation's handle is another. */
  CU_ASSERT_EQUAL(cuMemFree_v2(d), CUDA_SUCCESS);
  CU_ASSERT_EQUAL(stats().ipc_exported, 0);
  CUdeviceptr d2;
  CU_ASSERT_EQUAL_FATAL(cuMemAlloc_v2(&d2, n), CUDA_SUCCESS);
  CU_ASSERT_EQUAL_FATAL(cuIpcGetMemHandle(&h2, d2), CUDA_SUCCESS);
  CU_ASSERT_NOT_EQUAL(memcmp(&h, &h2, sizeof h), 0);
  CU_ASSERT_EQUAL(run_child(-1, "--child-ipc-gone", hex, NULL), 0);
  CU_ASSERT_EQUAL(cuMemFree_v2(d2), CUDA_SUCCESS);
  CU_ASSERT_EQUAL(cuCtxSynchronize(), CUDA_SUCCESS); /* the pool gives its cache back */
  CU_ASSERT_EQUAL(stats().used, used - (n + 511) / 512 * 512);
}

/* The attribute of ptr, or the call's result cast in when it fails. */
static int ptr_int(CUpointer_attribute a, CUdeviceptr ptr) {
  int v = -100;
  CUresult rc = cuPointerGetAttribute(&v, a, ptr);
  return rc == CUDA_SUCCESS ? v : -(int)rc;
}
static CUdeviceptr ptr_start(CUdeviceptr ptr) {
  CUdeviceptr v = 0;
  return cuPointerGetAttribute(&v, CU_POINTER_ATTRIBUTE_RANGE_START_ADDR, ptr) ? 1 : v;
}
static size_t ptr_size(CUdeviceptr ptr) {
  size_t v = 0;
  return cuPointerGetAttribute(&v, CU_POINTER_ATTRIBUTE_RANGE_SIZE, ptr) ? 1 : v;
}
static CUcontext ptr_ctx(CUdeviceptr ptr) {
  CUcontext v = (CUcontext)(uintptr_t)1;
  return cuPointerGetAttribute(&v, CU_POINTER_ATTRIBUTE_CONTEXT, ptr) ? (CUcontext)(uintptr_t)2 : v;
}

/* What cuPointerGetAttribute says of each kind of memory, interior pointers included: the device,
 * the memory type, the context (none for VMM mappings), the allocation's range (a mapping's
 * reservation), the pool. Unknown addresses are CUDA_ERROR_INVALID_VALUE without a misuse. */
static void test_pointer_attributes(void) {
  uint64_t m = stats().misuse;
  CUdeviceptr d, pooled;
  void *h;
  CU_ASSERT_EQUAL_FATAL(cuMemAlloc_v2(&d, 1000), CUDA_SUCCESS);
  CU_ASSERT_EQUAL_FATAL(cuMemHostAlloc(&h, 5000, CU_MEMHOSTALLOC_PORTABLE), CUDA_SUCCESS);
  CU_ASSERT_EQUAL_FATAL(cuMemAllocAsync(&pooled, 3000, NULL), CUDA_SUCCESS);
  CUdeviceptr hp = (CUdeviceptr)(uintptr_t)h;
  /* Device memory, at its start and inside. */
  CU_ASSERT_EQUAL(ptr_int(CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL, d + 999), 0);
  CU_ASSERT_EQUAL(ptr_int(CU_POINTER_ATTRIBUTE_MEMORY_TYPE, d), CU_MEMORYTYPE_DEVICE);
  CU_ASSERT_PTR_EQUAL(ptr_ctx(d + 500), ctx);
  CU_ASSERT_EQUAL(ptr_start(d + 999), d);
  CU_ASSERT_EQUAL(ptr_size(d + 1), 1000);
  CUmemoryPool pool = (CUmemoryPool)(uintptr_t)1, dflt;
  CU_ASSERT_EQUAL(cuPointerGetAttribute(&pool, CU_POINTER_ATTRIBUTE_MEMPOOL_HANDLE, d),
                  CUDA_SUCCESS);
  CU_ASSERT_PTR_NULL(pool);
  /* Past its end (the page is the double's, the allocation is not). */
  CU_ASSERT_EQUAL(ptr_int(CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL, d + 1000),
                  -(int)CUDA_ERROR_INVALID_VALUE);
  /* Page-locked host memory: the context it was allocated in. */
  CU_ASSERT_EQUAL(ptr_int(CU_POINTER_ATTRIBUTE_MEMORY_TYPE, hp + 4999), CU_MEMORYTYPE_HOST);
  CU_ASSERT_EQUAL(ptr_int(CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL, hp + 4096), 0);
  CU_ASSERT_PTR_EQUAL(ptr_ctx(hp), ctx);
  CU_ASSERT_EQUAL(ptr_start(hp + 4096), hp);
  CU_ASSERT_EQUAL(ptr_size(hp + 4096), 5000);
  /* Stream-ordered memory: its pool. */
  CU_ASSERT_EQUAL_FATAL(cuDeviceGetDefaultMemPool(&dflt, 0), CUDA_SUCCESS);
  CU_ASSERT_EQUAL(cuPointerGetAttribute(&pool, CU_POINTER_ATTRIBUTE_MEMPOOL_HANDLE, pooled + 10),
                  CUDA_SUCCESS);
  CU_ASSERT_PTR_EQUAL(pool, dflt);
  CU_ASSERT_EQUAL(ptr_int(CU_POINTER_ATTRIBUTE_MEMORY_TYPE, pooled + 2999), CU_MEMORYTYPE_DEVICE);
  CU_ASSERT_EQUAL(ptr_start(pooled + 2999), pooled);
  CU_ASSERT_EQUAL(ptr_size(pooled), 3000);
  /* A VMM mapping in the upper half of a reservation: no context, the reservation's range; the
   * unmapped lower half holds no memory. */
  CUmemGenericAllocationHandle vh;
  CUdeviceptr va = 0;
  CUmemAccessDesc acc = {.location = fd_prop.location, .flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE};
  CU_ASSERT_EQUAL_FATAL(cuMemCreate(&vh, 2 * MiB, &fd_prop, 0), CUDA_SUCCESS);
  CU_ASSERT_EQUAL_FATAL(cuMemAddressReserve(&va, 4 * MiB, 0, 0, 0), CUDA_SUCCESS);
  CU_ASSERT_EQUAL_FATAL(cuMemMap(va + 2 * MiB, 2 * MiB, 0, vh, 0), CUDA_SUCCESS);
  CU_ASSERT_EQUAL(cuMemSetAccess(va + 2 * MiB, 2 * MiB, &acc, 1), CUDA_SUCCESS);
  CU_ASSERT_EQUAL(ptr_int(CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL, va + 3 * MiB), 0);
  CU_ASSERT_EQUAL(ptr_int(CU_POINTER_ATTRIBUTE_MEMORY_TYPE, va + 2 * MiB), CU_MEMORYTYPE_DEVICE);
  CU_ASSERT_PTR_NULL(ptr_ctx(va + 3 * MiB));
  CU_ASSERT_EQUAL(ptr_start(va + 4 * MiB - 1), va);
  CU_ASSERT_EQUAL(ptr_size(va + 2 * MiB), 4 * MiB);
  CU_ASSERT_EQUAL(ptr_int(CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL, va + 100),
                  -(int)CUDA_ERROR_INVALID_VALUE);
  /* Unknown addresses, freed memory: legitimate questions, not misuse. */
  int local = 0;
  CU_ASSERT_EQUAL(ptr_int(CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL, (CUdeviceptr)(uintptr_t)&local),
                  -(int)CUDA_ERROR_INVALID_VALUE);
  CU_ASSERT_EQUAL(ptr_int(CU_POINTER_ATTRIBUTE_MEMORY_TYPE, 0), -(int)CUDA_ERROR_INVALID_VALUE);
  CU_ASSERT_EQUAL(stats().misuse, m);
  /* The plural call: several at once; an unknown address is no error, its values the defaults
   * (NULL, 0, and device -2 as real drivers answer). */
  CUpointer_attribute as[] = {CU_POINTER_ATTRIBUTE_MEMORY_TYPE, CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL,
                              CU_POINTER_ATTRIBUTE_RANGE_START_ADDR, CU_POINTER_ATTRIBUTE_CONTEXT};
  unsigned type = 7;
  int dev = 7;
  CUdeviceptr start = 7;
  CUcontext owner = NULL;
  void *out[] = {&type, &dev, &start, &owner};
  CU_ASSERT_EQUAL(cuPointerGetAttributes(4, as, out, hp + 10), CUDA_SUCCESS);
  CU_ASSERT_EQUAL(type, CU_MEMORYTYPE_HOST);
  CU_ASSERT_EQUAL(dev, 0);
  CU_ASSERT_EQUAL(start, hp);
  CU_ASSERT_PTR_EQUAL(owner, ctx);
  CU_ASSERT_EQUAL(cuPointerGetAttributes(4, as, out, (CUdeviceptr)(uintptr_t)&local), CUDA_SUCCESS);
  CU_ASSERT_EQUAL(type, 0);
  CU_ASSERT_EQUAL(dev, CU_DEVICE_INVALID);
  CU_ASSERT_EQUAL(start, 0);
  CU_ASSERT_PTR_NULL(owner);
  CU_ASSERT_EQUAL(stats().misuse, m);
  /* An attribute the double does not model: said, not misuse; one that does not exist and a NULL
   * output: misuse. */
  unsigned long long id;
  CU_ASSERT_EQUAL(cuPointerGetAttribute(&id, CU_POINTER_ATTRIBUTE_BUFFER_ID, d),
                  CUDA_ERROR_NOT_SUPPORTED);
  CU_ASSERT_EQUAL(stats().misuse, m);
  CU_ASSERT_EQUAL(cuPointerGetAttribute(&id, (CUpointer_attribute)999, d),
                  CUDA_ERROR_INVALID_VALUE);
  CU_ASSERT_EQUAL(cuPointerGetAttribute(NULL, CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL, d),
                  CUDA_ERROR_INVALID_VALUE);
  CU_ASSERT_EQUAL(stats().misuse, m + 2);
  /* Freed: unknown again. */
  CU_ASSERT_EQUAL(cuMemFree_v2(d), CUDA_SUCCESS);
  CU_ASSERT_EQUAL(ptr_int(CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL, d), -(int)CUDA_ERROR_INVALID_VALUE);
  CU_ASSERT_EQUAL(cuMemFreeHost(h), CUDA_SUCCESS);
  CU_ASSERT_EQUAL(cuMemFreeAsync(pooled, NULL), CUDA_SUCCESS);
  CU_ASSERT_EQUAL(cuMemUnmap(va + 2 * MiB, 2 * MiB), CUDA_SUCCESS);
  CU_ASSERT_EQUAL(cuMemAddressFree(va, 4 * MiB), CUDA_SUCCESS);
  CU_ASSERT_EQUAL(cuMemRelease(vh), CUDA_SUCCESS);
  CU_ASSERT_EQUAL(cuCtxSynchronize(), CUDA_SUCCESS);
  CU_ASSERT_EQUAL(stats().used, 0);
}

/* A thread synchronising a held stream: in the double's wait when the reset comes. */
static void *reset_waiter(void *arg) {
  CUresult rc = cuCtxSetCurrent(ctx);
  if (rc == CUDA_SUCCESS) rc = cuStreamSynchronize((CUstream)arg);
  return (void *)(uintptr_t)rc;
}

/* True when [p, p+n) holds no mapped page (a touch would fault). */
static bool unmapped(const void *p, size_t n) {
  unsigned char vec[4];
  return n <= 4 * 4096 && mincore((void *)((uintptr_t)p & ~(uintptr_t)4095), n, vec) != 0 &&
         errno == ENOMEM;
}

/* cuDevicePrimaryCtxReset: the context's streams (a held one, a capturing one, with a thread
 * waiting), events and executable graphs go, its cuMemAlloc and page-locked memory is unmapped
 * and given back, and using any of them afterwards is the double's misuse answer; stream-ordered
 * memory, VMM memory, graphs and modules stay; the context stays current and retained, and works
 * afresh. An IPC handle opened in a context goes with it (child_ipc_reset). */
static void test_reset(void) {
  void *p = NULL;
  CU_ASSERT_EQUAL(cuGetProcAddress_v2("cuDevicePrimaryCtxReset", &p, 7000, 0, NULL), 0);
  CU_ASSERT_PTR_EQUAL(p, dlsym(RTLD_DEFAULT, "cuDevicePrimaryCtxReset"));
  CU_ASSERT_EQUAL(cuGetProcAddress_v2("cuDevicePrimaryCtxReset", &p, 13000, 0, NULL), 0);
  CU_ASSERT_PTR_EQUAL(p, (void *)cuDevicePrimaryCtxReset_v2);
  unsigned pflags = 7;
  int active = -1;
  CU_ASSERT_EQUAL(cuDevicePrimaryCtxGetState(0, &pflags, &active), CUDA_SUCCESS);
  CU_ASSERT(pflags == 0 && active == 1); /* the suite holds it retained */
  size_t fr, tot;
  CU_ASSERT_EQUAL(cuMemGetInfo_v2(&fr, &tot), CUDA_SUCCESS);
  CU_ASSERT_EQUAL_FATAL(fr, tot);
  wltest_driver_stats_t st0 = stats();
  /* What goes. */
  CUstream s, cap;
  CUevent e;
  CUdeviceptr d;
  void *h;
  CU_ASSERT_EQUAL_FATAL(cuStreamCreate(&s, 0), CUDA_SUCCESS);
  CU_ASSERT_EQUAL_FATAL(cuStreamCreate(&cap, CU_STREAM_NON_BLOCKING), CUDA_SUCCESS);
  CU_ASSERT_EQUAL_FATAL(cuEventCreate(&e, 0), CUDA_SUCCESS);
  CU_ASSERT_EQUAL_FATAL(cuMemAlloc_v2(&d, 4 * MiB), CUDA_SUCCESS);
  CU_ASSERT_EQUAL_FATAL(cuMemHostAlloc(&h, 3 * 4096, 0), CUDA_SUCCESS);
  unsigned k = 3;
  void *args[] = {&d, &k};
  CUgraph g;
  CUgraphExec x;
  CU_ASSERT_EQUAL(cuStreamBeginCapture_v2(cap, CU_STREAM_CAPTURE_MODE_GLOBAL), CUDA_SUCCESS);
  CU_ASSERT_EQUAL(cuLaunchKernel(f_add, 1, 1, 1, 1, 1, 1, 0, cap, args, NULL), CUDA_SUCCESS);
  CU_ASSERT_EQUAL_FATAL(cuStreamEndCapture(cap, &g), CUDA_SUCCESS);
  CU_ASSERT_EQUAL_FATAL(cuGraphInstantiateWithFlags(&x, g, 0), CUDA_SUCCESS);
  /* What stays: stream-ordered memory and a VMM mapping. */
  CUdeviceptr pooled;
  CU_ASSERT_EQUAL_FATAL(cuMemAllocAsync(&pooled, 2 * MiB, s), CUDA_SUCCESS);
  CUmemGenericAllocationHandle vh;
  CU_ASSERT_EQUAL_FATAL(cuMemCreate(&vh, 2 * MiB, &fd_prop, 0), CUDA_SUCCESS);
  CUdeviceptr va = map_rw(vh, 2 * MiB);
  CU_ASSERT_FATAL(va != 0);
  fill(va, 2 * MiB, 70);
  /* Pending work held on s, a thread waiting for it, a capture under way on cap. */
  CU_ASSERT_EQUAL(wltest_stream_hold(s), 0);
  CU_ASSERT_EQUAL(cuLaunchKernel(f_slow, 1, 1, 1, 1, 1, 1, 0, s, NULL, NULL), CUDA_SUCCESS);
  CU_ASSERT_EQUAL(cuEventRecord(e, s), CUDA_SUCCESS);
  uint64_t syncs = stats().calls[WLTEST_FN_cuStreamSynchronize];
  pthread_t t;
  CU_ASSERT_EQUAL_FATAL(pthread_create(&t, NULL, reset_waiter, s), 0);
  /* The waiter holds the lock from its call's start until it waits (the stream is held): once
   * the counter says it called, it is waiting. */
  while (stats().calls[WLTEST_FN_cuStreamSynchronize] == syncs) sched_yield();
  CU_ASSERT_EQUAL(cuStreamBeginCapture_v2(cap, CU_STREAM_CAPTURE_MODE_GLOBAL), CUDA_SUCCESS);
  uint64_t m = stats().misuse;

  CU_ASSERT_EQUAL_FATAL(cuDevicePrimaryCtxReset_v2(0), CUDA_SUCCESS);
  /* Unmapped at once: a touch would fault, as on a device whose memory went. */
  CU_ASSERT(unmapped((void *)(uintptr_t)d, 4096));
  CU_ASSERT(unmapped(h, 3 * 4096));
  void *rc = NULL;
  pthread_join(t, &rc);
  CU_ASSERT_EQUAL((CUresult)(uintptr_t)rc, CUDA_SUCCESS); /* woken: the work was abandoned */
  wltest_driver_stats_t st = stats();
  CU_ASSERT_EQUAL(st.resets, st0.resets + 1);
  CU_ASSERT_EQUAL(st.streams, st0.streams);
  CU_ASSERT_EQUAL(st.events, st0.events);
  CU_ASSERT_EQUAL(st.dropped, st0.dropped + 4); /* two streams, an event, an executable graph */
  CU_ASSERT_EQUAL(st.host_allocs, st0.host_allocs);
  CU_ASSERT_EQUAL(st.linear_allocs, st0.linear_allocs + 1); /* the stream-ordered one */
  CU_ASSERT_EQUAL(st.primary_refs, st0.primary_refs);
  CU_ASSERT_EQUAL(st.mappings, st0.mappings + 1);
  CU_ASSERT_EQUAL(st.misuse, m);
  /* The memory came back, but for what stays (the pool's and the VMM allocation's). */
  CU_ASSERT_EQUAL(cuMemGetInfo_v2(&fr, &tot), CUDA_SUCCESS);
  CU_ASSERT_EQUAL(fr, tot - 4 * MiB);
  /* Freed memory is unknown: a question answers so, a use is misuse. */
  CU_ASSERT_EQUAL(ptr_int(CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL, d), -(int)CUDA_ERROR_INVALID_VALUE);
  CU_ASSERT_EQUAL(stats().misuse, m);
  CU_ASSERT_EQUAL(cuMemFree_v2(d), CUDA_ERROR_INVALID_VALUE);
  unsigned flags;
  CU_ASSERT_EQUAL(cuMemHostGetFlags(&flags, h), CUDA_ERROR_INVALID_VALUE);
  CU_ASSERT_EQUAL(cuMemFreeHost(h), CUDA_ERROR_INVALID_VALUE);
  CU_ASSERT_EQUAL(stats().misuse, m += 3);
  /* So are the streams (the capture went with its stream), the event, the executable graph. */
  CU_ASSERT_EQUAL(cuStreamQuery(s), CUDA_ERROR_INVALID_HANDLE);
  CU_ASSERT_EQUAL(cuStreamSynchronize(s), CUDA_ERROR_INVALID_HANDLE);
  CU_ASSERT_EQUAL(cuStreamEndCapture(cap, &g), CUDA_ERROR_INVALID_HANDLE);
  CU_ASSERT_EQUAL(cuStreamDestroy_v2(s), CUDA_ERROR_INVALID_HANDLE);
  CU_ASSERT_EQUAL(cuEventQuery(e), CUDA_ERROR_INVALID_HANDLE);
  CU_ASSERT_EQUAL(cuEventRecord(e, NULL), CUDA_ERROR_INVALID_HANDLE);
  CU_ASSERT_EQUAL(cuEventDestroy_v2(e), CUDA_ERROR_INVALID_HANDLE);
  CU_ASSERT_EQUAL(cuGraphLaunch(x, NULL), CUDA_ERROR_INVALID_VALUE);
  CU_ASSERT_EQUAL(wltest_stream_release(s), -1);
  CU_ASSERT_EQUAL(stats().misuse, m += 8);
  /* Stream-ordered memory stays (cudaDeviceReset's documentation), VMM memory too. */
  CU_ASSERT_EQUAL(ptr_int(CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL, pooled + 1), 0);
  CU_ASSERT_EQUAL(cuMemFreeAsync(pooled, NULL), CUDA_SUCCESS);
  CU_ASSERT(holds(va, 2 * MiB, 70));
  fill(va, 2 * MiB, 71);
  CU_ASSERT(holds(va, 2 * MiB, 71));
  CU_ASSERT_EQUAL(unmap_free(va, 2 * MiB), CUDA_SUCCESS);
  CU_ASSERT_EQUAL(cuMemRelease(vh), CUDA_SUCCESS);
  CU_ASSERT_EQUAL(cuCtxSynchronize(), CUDA_SUCCESS); /* the pool gives its cache back */
  CU_ASSERT_EQUAL(cuMemGetInfo_v2(&fr, &tot), CUDA_SUCCESS);
  CU_ASSERT_EQUAL(fr, tot);
  /* The same context, current and retained: one more retain and release balance. */
  CUcontext cur = NULL, again = NULL;
  CU_ASSERT_EQUAL(cuCtxGetCurrent(&cur), CUDA_SUCCESS);
  CU_ASSERT_PTR_EQUAL(cur, ctx);
  CUdevice dev = -1;
  CU_ASSERT_EQUAL(cuCtxGetDevice(&dev), CUDA_SUCCESS);
  CU_ASSERT_EQUAL(dev, 0);
  CU_ASSERT_EQUAL(cuDevicePrimaryCtxRetain(&again, 0), CUDA_SUCCESS);
  CU_ASSERT_PTR_EQUAL(again, ctx);
  CU_ASSERT_EQUAL(cuDevicePrimaryCtxRelease_v2(0), CUDA_SUCCESS);
  CU_ASSERT_EQUAL(stats().primary_refs, st0.primary_refs);
  /* Work afresh: memory (no capture prohibits it now), a stream, an event, a launch and its
   * twin, the kept graph instantiated again, the kept module. */
  CUfunction fn;
  CU_ASSERT_EQUAL(cuModuleGetFunction(&fn, mod, "wl_t_add"), CUDA_SUCCESS);
  CU_ASSERT_PTR_EQUAL(fn, f_add);
  CUdeviceptr d2;
  CU_ASSERT_EQUAL_FATAL(cuMemAlloc_v2(&d2, 4096), CUDA_SUCCESS);
  CU_ASSERT_EQUAL(cuMemsetD32_v2(d2, 0, 1), CUDA_SUCCESS);
  CUstream s2;
  CUevent e2;
  CU_ASSERT_EQUAL_FATAL(cuStreamCreate(&s2, 0), CUDA_SUCCESS);
  CU_ASSERT_EQUAL_FATAL(cuEventCreate(&e2, 0), CUDA_SUCCESS);
  void *args2[] = {&d2, &k};
  CU_ASSERT_EQUAL(cuLaunchKernel(f_add, 1, 1, 1, 1, 1, 1, 0, s2, args2, NULL), CUDA_SUCCESS);
  CU_ASSERT_EQUAL(cuEventRecord(e2, s2), CUDA_SUCCESS);
  CU_ASSERT_EQUAL(cuEventSynchronize(e2), CUDA_SUCCESS);
  CU_ASSERT_EQUAL(*(unsigned *)(uintptr_t)d2, 3);
  CUgraphExec x2;
  CU_ASSERT_EQUAL(cuGraphInstantiateWithFlags(&x2, g, 0), CUDA_SUCCESS);
  CU_ASSERT_EQUAL(cuGraphExecDestroy(x2), CUDA_SUCCESS);
  CU_ASSERT_EQUAL(cuGraphDestroy(g), CUDA_SUCCESS);
  CU_ASSERT_EQUAL(cuEventDestroy_v2(e2), CUDA_SUCCESS);
  CU_ASSERT_EQUAL(cuStreamDestroy_v2(s2), CUDA_SUCCESS);
  CU_ASSERT_EQUAL(cuMemFree_v2(d2), CUDA_SUCCESS);
  CU_ASSERT_EQUAL(stats().misuse, m);
  /* The 7.0 ABI; a device that does not exist. */
  CU_ASSERT_EQUAL(cuDevicePrimaryCtxReset_v1(0), CUDA_SUCCESS);
  CU_ASSERT_EQUAL(stats().resets, st0.resets + 2);
  CU_ASSERT_EQUAL(cuDevicePrimaryCtxReset_v2(1), CUDA_ERROR_INVALID_DEVICE);
  CU_ASSERT_EQUAL(stats().misuse, m + 1);
  CU_ASSERT_EQUAL(stats().resets, st0.resets + 2);
}

/* Another process's IPC handle opened here goes with the context's reset; the exporter's memory
 * does not (child_ipc_reset). */
static void test_reset_ipc(void) {
  const size_t n = IPC_BYTES;
  CUdeviceptr d;
  CU_ASSERT_EQUAL_FATAL(cuMemAlloc_v2(&d, n), CUDA_SUCCESS);
  fill(d, n, 80);
  CUipcMemHandle h;
  CU_ASSERT_EQUAL_FATAL(cuIpcGetMemHandle(&h, d), CUDA_SUCCESS);
  char hex[2 * sizeof h + 1];
  wl_test_hex(&h, sizeof h, hex);
  CU_ASSERT_EQUAL(run_child(-1, "--child-ipc-reset", hex, NULL), 0);
  CU_ASSERT_EQUAL(*(unsigned char *)(uintptr_t)d, 99);
  CU_ASSERT(holds_from(d, 1, n, 80));
  CU_ASSERT_EQUAL(cuMemFree_v2(d), CUDA_SUCCESS);
}
/* ---- created contexts (cuCtxCreate) ----------------------------------------------------------*/

/* The calling thread's current context, or 2 when the call fails. */
static CUcontext current(void) {
  CUcontext c = (CUcontext)(uintptr_t)1;
  return cuCtxGetCurrent(&c) == CUDA_SUCCESS ? c : (CUcontext)(uintptr_t)2;
}

/* cuStreamGetCtx's answer, or 2 when it fails. */
static CUcontext stream_ctx(CUstream s) {
  CUcontext c = (CUcontext)(uintptr_t)1;
  return cuStreamGetCtx(s, &c) == CUDA_SUCCESS ? c : (CUcontext)(uintptr_t)2;
}

/* cuGetProcAddress hands out each ABI of the context calls and of cuStreamGetCtx at the version
 * it came with (cudaTypedefs.h), the per-thread twins with the flag. */
static void test_ctx_getproc(void) {
  const cuuint64_t pt = CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM;
  static const struct {
    const char *name;
    int version;
    bool pt;
    const char *variant;
  } want[] = {
      {"cuCtxCreate", 2000, false, "cuCtxCreate"},
      {"cuCtxCreate", 3020, false, "cuCtxCreate_v2"},
      {"cuCtxCreate", 11040, false, "cuCtxCreate_v3"},
      {"cuCtxCreate", 12050, false, "cuCtxCreate_v4"},
      {"cuCtxCreate", 13000, false, "cuCtxCreate_v4"},
      {"cuCtxDestroy", 3020, false, "cuCtxDestroy"},
      {"cuCtxDestroy", 4000, false, "cuCtxDestroy_v2"},
      {"cuCtxPushCurrent", 2000, false, "cuCtxPushCurrent"},
      {"cuCtxPushCurrent", 13000, false, "cuCtxPushCurrent_v2"},
      {"cuCtxPopCurrent", 3020, false, "cuCtxPopCurrent"},
      {"cuCtxPopCurrent", 13000, false, "cuCtxPopCurrent_v2"},
      {"cuStreamGetCtx", 9020, false, "cuStreamGetCtx"},
      {"cuStreamGetCtx", 12000, true, "cuStreamGetCtx_ptsz"},
      {"cuStreamGetCtx", 13000, false, "cuStreamGetCtx_v2"},
      {"cuStreamGetCtx", 13000, true, "cuStreamGetCtx_v2_ptsz"},
  };
  for (size_t i = 0; i < sizeof want / sizeof want[0]; i++) {
    void *p = NULL, *exported = dlsym(RTLD_DEFAULT, want[i].variant);
    CUdriverProcAddressQueryResult st = CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND;
    CU_ASSERT_EQUAL(
        cuGetProcAddress_v2(want[i].name, &p, want[i].version, want[i].pt ? pt : 0, &st),
        CUDA_SUCCESS);
    CU_ASSERT_EQUAL(st, CU_GET_PROC_ADDRESS_SUCCESS);
    CU_ASSERT_PTR_NOT_NULL(exported);
    if (p != exported)
      fprintf(stderr, "%s at %d: not %s\n", want[i].name, want[i].version, want[i].variant);
    CU_ASSERT_PTR_EQUAL(p, exported);
  }
  void *p = NULL;
  CUdriverProcAddressQueryResult st;
  CU_ASSERT_EQUAL(cuGetProcAddress_v2("cuStreamGetCtx", &p, 9010, 0, &st), CUDA_SUCCESS);
  CU_ASSERT_PTR_NULL(p);
  CU_ASSERT_EQUAL(st, CU_GET_PROC_ADDRESS_VERSION_NOT_SUFFICIENT);
}

/* cuCtxCreate (every ABI) makes a context of its own, current (pushed) on the calling thread;
 * cuCtxDestroy destroys it and pops it when current. Destroyed, unknown and primary handles are
 * refused; a destroyed context left on the stack fails calls until popped. */
static void test_ctx_create_destroy(void) {
  wltest_driver_stats_t st0 = stats();
  uint64_t m = st0.misuse;
  CU_ASSERT_PTR_EQUAL_FATAL(current(), ctx);
  CUcontext c = NULL, p = NULL;
  CU_ASSERT_EQUAL_FATAL(cuCtxCreate(&c, NULL, 0, 0), CUDA_SUCCESS);
  CU_ASSERT_PTR_NOT_NULL(c);
  CU_ASSERT_PTR_NOT_EQUAL(c, ctx);
  CU_ASSERT_PTR_EQUAL(current(), c);
  CU_ASSERT_EQUAL(stats().contexts, st0.contexts + 1);
  CU_ASSERT_EQUAL(stats().primary_refs, st0.primary_refs);
  CUdevice dev = -1;
  CU_ASSERT_EQUAL(cuCtxGetDevice(&dev), CUDA_SUCCESS);
  CU_ASSERT_EQUAL(dev, 0);
  dev = -1;
  CU_ASSERT_EQUAL(cuCtxGetDevice_v2(&dev, c), CUDA_SUCCESS);
  CU_ASSERT_EQUAL(dev, 0);
  CU_ASSERT_EQUAL(cuCtxSynchronize_v2(c), CUDA_SUCCESS);
  /* Not the primary context, which stays the device's. */
  CUcontext prim = NULL;
  CU_ASSERT_EQUAL(cuDevicePrimaryCtxRetain(&prim, 0), CUDA_SUCCESS);
  CU_ASSERT_PTR_EQUAL(prim, ctx);
  CU_ASSERT_EQUAL(cuDevicePrimaryCtxRelease_v2(0), CUDA_SUCCESS);
  /* Popped, the context below is current again; pushed back, it is current. */
  CU_ASSERT_EQUAL(cuCtxPopCurrent(&p), CUDA_SUCCESS);
  CU_ASSERT_PTR_EQUAL(p, c);
  CU_ASSERT_PTR_EQUAL(current(), ctx);
  CU_ASSERT_EQUAL(cuCtxPushCurrent(c), CUDA_SUCCESS);
  CU_ASSERT_PTR_EQUAL(current(), c);
  /* Destroyed while current here: popped. */
  CU_ASSERT_EQUAL(cuCtxDestroy(c), CUDA_SUCCESS);
  CU_ASSERT_PTR_EQUAL(current(), ctx);
  CU_ASSERT_EQUAL(stats().contexts, st0.contexts);
  CU_ASSERT_EQUAL(stats().misuse, m);
  /* A destroyed handle, a primary one, NULL: refused; the primary context still works. */
  CU_ASSERT_EQUAL(cuCtxDestroy(c), CUDA_ERROR_INVALID_CONTEXT);
  CU_ASSERT_EQUAL(cuCtxSetCurrent(c), CUDA_ERROR_INVALID_CONTEXT);
  CU_ASSERT_EQUAL(cuCtxPushCurrent(c), CUDA_ERROR_INVALID_CONTEXT);
  CU_ASSERT_EQUAL(cuCtxSynchronize_v2(c), CUDA_ERROR_INVALID_CONTEXT);
  CU_ASSERT_EQUAL(cuCtxDestroy(ctx), CUDA_ERROR_INVALID_CONTEXT);
  CU_ASSERT_EQUAL(cuCtxDestroy_v1(ctx), CUDA_ERROR_INVALID_CONTEXT);
  CU_ASSERT_EQUAL(cuCtxDestroy(NULL), CUDA_ERROR_INVALID_VALUE);
  CU_ASSERT_EQUAL(stats().misuse, m += 7);
  CU_ASSERT_PTR_EQUAL(current(), ctx);
  size_t fr, tot;
  CU_ASSERT_EQUAL(cuMemGetInfo_v2(&fr, &tot), CUDA_SUCCESS);
  unsigned fl = 7;
  int active = 0;
  CU_ASSERT_EQUAL(cuDevicePrimaryCtxGetState(0, &fl, &active), CUDA_SUCCESS);
  CU_ASSERT_EQUAL(active, 1);
  CU_ASSERT_EQUAL(stats().primary_refs, st0.primary_refs);

  /* The older ABIs; flags are checked (one scheduling flag); what is not modelled is said, not
   * a misuse, and makes no context. */
  CUcontext c1 = NULL, c2 = NULL, c3 = NULL, bad = NULL;
  CU_ASSERT_EQUAL_FATAL(cuCtxCreate_v1(&c1, CU_CTX_SCHED_YIELD, 0), CUDA_SUCCESS);
  CU_ASSERT_EQUAL_FATAL(cuCtxCreate_v2(&c2, CU_CTX_SCHED_BLOCKING_SYNC | CU_CTX_MAP_HOST, 0),
                        CUDA_SUCCESS);
  CU_ASSERT_EQUAL_FATAL(cuCtxCreate_v3(&c3, NULL, 0, 0, 0), CUDA_SUCCESS);
  CU_ASSERT(c1 != c2 && c2 != c3 && c1 != c3 && c1 != ctx);
  CU_ASSERT_PTR_EQUAL(current(), c3);
  CU_ASSERT_EQUAL(cuCtxCreate(&bad, NULL, CU_CTX_SCHED_SPIN | CU_CTX_SCHED_YIELD, 0),
                  CUDA_ERROR_INVALID_VALUE);
  CU_ASSERT_EQUAL(cuCtxCreate(&bad, NULL, 0x100, 0), CUDA_ERROR_INVALID_VALUE);
  CU_ASSERT_EQUAL(cuCtxCreate(&bad, NULL, 0, 1), CUDA_ERROR_INVALID_DEVICE);
  CU_ASSERT_EQUAL(cuCtxCreate(NULL, NULL, 0, 0), CUDA_ERROR_INVALID_VALUE);
  CUctxCreateParams none = {0};
  CU_ASSERT_EQUAL(cuCtxCreate(&bad, &none, 0, 0), CUDA_ERROR_INVALID_VALUE);
  CU_ASSERT_EQUAL(cuCtxCreate_v3(&bad, NULL, 1, 0, 0), CUDA_ERROR_INVALID_VALUE);
  CU_ASSERT_EQUAL(stats().misuse, m += 6);
  CUexecAffinityParam aff = {.type = CU_EXEC_AFFINITY_TYPE_SM_COUNT, .param.smCount.val = 8};
  CUctxCreateParams with = {.execAffinityParams = &aff, .numExecAffinityParams = 1};
  CU_ASSERT_EQUAL(cuCtxCreate(&bad, &with, 0, 0), CUDA_ERROR_NOT_SUPPORTED);
  CU_ASSERT_EQUAL(cuCtxCreate_v3(&bad, &aff, 1, 0, 0), CUDA_ERROR_NOT_SUPPORTED);
  CU_ASSERT_EQUAL(stats().misuse, m);
  CU_ASSERT_PTR_NULL(bad);
  CU_ASSERT_PTR_EQUAL(current(), c3);
  CU_ASSERT_EQUAL(stats().contexts, st0.contexts + 3);
  /* The stack is [ctx, c1, c2, c3]. c1, destroyed below the top, stays there: once it is on top,
   * calls that need it get CUDA_ERROR_CONTEXT_IS_DESTROYED (a misuse) until it is popped. */
  CU_ASSERT_EQUAL(cuCtxDestroy_v1(c3), CUDA_SUCCESS);
  CU_ASSERT_PTR_EQUAL(current(), c2);
  CU_ASSERT_EQUAL(cuCtxDestroy(c1), CUDA_SUCCESS);
  CU_ASSERT_PTR_EQUAL(current(), c2);
  CU_ASSERT_EQUAL(cuCtxDestroy(c2), CUDA_SUCCESS);
  CU_ASSERT_PTR_EQUAL(current(), c1);
  CU_ASSERT_EQUAL(stats().misuse, m);
  CU_ASSERT_EQUAL(cuMemGetInfo_v2(&fr, &tot), CUDA_ERROR_CONTEXT_IS_DESTROYED);
  CU_ASSERT_EQUAL(cuCtxGetDevice(&dev), CUDA_ERROR_CONTEXT_IS_DESTROYED);
  CU_ASSERT_EQUAL(cuCtxSynchronize_v2(NULL), CUDA_ERROR_CONTEXT_IS_DESTROYED);
  CU_ASSERT_EQUAL(cuStreamGetCtx(NULL, &p), CUDA_ERROR_CONTEXT_IS_DESTROYED);
  CU_ASSERT_EQUAL(stats().misuse, m += 4);
  CU_ASSERT_EQUAL(cuCtxPopCurrent_v1(&p), CUDA_SUCCESS);
  CU_ASSERT_PTR_EQUAL(p, c1);
  CU_ASSERT_PTR_EQUAL(current(), ctx);
  CU_ASSERT_EQUAL(stats().contexts, st0.contexts);
  CU_ASSERT_EQUAL(stats().misuse, m);
}

/* Another thread with a created context current: its own stack; after the main thread destroys
 * the context, its calls get CUDA_ERROR_CONTEXT_IS_DESTROYED, cuCtxGetCurrent still answers the
 * handle (as real drivers do) and a pop takes it off. The bits of the checks that failed. */
typedef struct ctx_other_s {
  CUcontext c;
  pthread_barrier_t bar;
} ctx_other_t;

static void *ctx_other(void *arg) {
  ctx_other_t *o = arg;
  uintptr_t bad = 0;
  size_t fr, tot;
  CUcontext p = NULL;
  if (current() != NULL) bad |= 1; /* a new thread's stack is empty */
  if (cuCtxPushCurrent(o->c) != CUDA_SUCCESS || current() != o->c) bad |= 2;
  if (cuMemGetInfo_v2(&fr, &tot) != CUDA_SUCCESS) bad |= 4;
  pthread_barrier_wait(&o->bar);
  pthread_barrier_wait(&o->bar); /* destroyed meanwhile */
  if (cuMemGetInfo_v2(&fr, &tot) != CUDA_ERROR_CONTEXT_IS_DESTROYED) bad |= 8;
  if (current() != o->c) bad |= 16;
  if (cuCtxPopCurrent(&p) != CUDA_SUCCESS || p != o->c || current() != NULL) bad |= 32;
  return (void *)bad;
}

/* Each thread has a stack of contexts: push and pop in order (a context may be on it twice),
 * cuCtxSetCurrent replaces the top (NULL pops it; on an empty stack NULL does nothing and a
 * context is pushed); popping an empty stack is a misuse; the double's stack holds 64. */
static void test_ctx_stack(void) {
  uint64_t m = stats().misuse;
  CUcontext a = NULL, b = NULL, p = NULL;
  CU_ASSERT_EQUAL_FATAL(cuCtxCreate(&a, NULL, 0, 0), CUDA_SUCCESS);
  CU_ASSERT_EQUAL_FATAL(cuCtxCreate(&b, NULL, 0, 0), CUDA_SUCCESS);
  CU_ASSERT_EQUAL(cuCtxPushCurrent(a), CUDA_SUCCESS);
  CU_ASSERT_EQUAL(cuCtxPushCurrent_v1(ctx), CUDA_SUCCESS);
  const CUcontext order[] = {ctx, a, b, a}; /* pushed: ctx, a, b, a, ctx */
  for (size_t i = 0; i < sizeof order / sizeof order[0]; i++) {
    p = NULL;
    CU_ASSERT_EQUAL(cuCtxPopCurrent(&p), CUDA_SUCCESS);
    CU_ASSERT_PTR_EQUAL(p, order[i]);
  }
  CU_ASSERT_PTR_EQUAL(current(), ctx);
  CU_ASSERT_EQUAL(cuCtxPushCurrent(a), CUDA_SUCCESS);
  CU_ASSERT_EQUAL(cuCtxSetCurrent(b), CUDA_SUCCESS); /* [ctx, b] */
  CU_ASSERT_PTR_EQUAL(current(), b);
  CU_ASSERT_EQUAL(cuCtxPopCurrent(&p), CUDA_SUCCESS);
  CU_ASSERT_PTR_EQUAL(p, b);
  CU_ASSERT_PTR_EQUAL(current(), ctx);
  CU_ASSERT_EQUAL(cuCtxSetCurrent(NULL), CUDA_SUCCESS); /* [] */
  CU_ASSERT_PTR_NULL(current());
  CU_ASSERT_EQUAL(cuCtxSetCurrent(NULL), CUDA_SUCCESS);
  CU_ASSERT_PTR_NULL(current());
  CU_ASSERT_EQUAL(stats().misuse, m);
  size_t fr, tot;
  CU_ASSERT_EQUAL(cuCtxPopCurrent(&p), CUDA_ERROR_INVALID_CONTEXT);
  CU_ASSERT_EQUAL(cuMemGetInfo_v2(&fr, &tot), CUDA_ERROR_INVALID_CONTEXT);
  CU_ASSERT_EQUAL(cuStreamGetCtx(NULL, &p), CUDA_ERROR_INVALID_CONTEXT);
  CU_ASSERT_EQUAL(cuCtxPushCurrent(NULL), CUDA_ERROR_INVALID_VALUE);
  CU_ASSERT_EQUAL(stats().misuse, m += 4);
  CU_ASSERT_EQUAL(cuCtxSetCurrent(a), CUDA_SUCCESS); /* [a] */
  CU_ASSERT_EQUAL(cuCtxPushCurrent(ctx), CUDA_SUCCESS);
  CU_ASSERT_EQUAL(cuCtxPopCurrent(NULL), CUDA_SUCCESS);
  CU_ASSERT_PTR_EQUAL(current(), a);
  CU_ASSERT_EQUAL(cuCtxSetCurrent(ctx), CUDA_SUCCESS); /* [ctx] */
  CU_ASSERT_PTR_EQUAL(current(), ctx);
  /* Full: said, not a misuse; nothing is made. */
  uint64_t contexts = stats().contexts;
  int n = 0;
  CUresult rc;
  while ((rc = cuCtxPushCurrent(a)) == CUDA_SUCCESS && n < 1000) n++;
  CU_ASSERT_EQUAL(rc, CUDA_ERROR_NOT_SUPPORTED);
  CU_ASSERT_EQUAL(n, 63);
  CU_ASSERT_EQUAL(cuCtxCreate(&p, NULL, 0, 0), CUDA_ERROR_NOT_SUPPORTED);
  CU_ASSERT_EQUAL(stats().contexts, contexts);
  while (n-- > 0) CU_ASSERT_EQUAL(cuCtxPopCurrent(NULL), CUDA_SUCCESS);
  CU_ASSERT_PTR_EQUAL(current(), ctx);
  CU_ASSERT_EQUAL(stats().misuse, m);
  /* Another thread's stack. */
  ctx_other_t o = {.c = b};
  CU_ASSERT_EQUAL_FATAL(pthread_barrier_init(&o.bar, NULL, 2), 0);
  pthread_t t;
  CU_ASSERT_EQUAL_FATAL(pthread_create(&t, NULL, ctx_other, &o), 0);
  pthread_barrier_wait(&o.bar);
  CU_ASSERT_PTR_EQUAL(current(), ctx); /* its push was its own */
  CU_ASSERT_EQUAL(cuCtxDestroy(b), CUDA_SUCCESS);
  CU_ASSERT_PTR_EQUAL(current(), ctx); /* not current here: nothing popped */
  pthread_barrier_wait(&o.bar);
  void *bad = (void *)1;
  pthread_join(t, &bad);
  CU_ASSERT_EQUAL((uintptr_t)bad, 0);
  pthread_barrier_destroy(&o.bar);
  CU_ASSERT_EQUAL(stats().misuse, m + 1); /* its call after the destroy */
  CU_ASSERT_EQUAL(cuCtxDestroy(a), CUDA_SUCCESS);
  CU_ASSERT_PTR_EQUAL(current(), ctx);
}

/* What belongs to a created context goes with its cuCtxDestroy: its cuMemAlloc memory (given
 * back to the device's capacity) and page-locked memory (unmapped), its streams (work pending)
 * and events. The primary context's memory and stream, stream-ordered memory and VMM memory
 * stay. CU_POINTER_ATTRIBUTE_CONTEXT and cuStreamGetCtx say whose memory and streams are. */
static void test_ctx_destroy_memory(void) {
  CU_ASSERT_EQUAL(cuCtxSynchronize(), CUDA_SUCCESS); /* the pools give their caches back */
  wltest_driver_stats_t st0 = stats();
  uint64_t m = st0.misuse;
  size_t fr0, fr, tot;
  CU_ASSERT_EQUAL_FATAL(cuMemGetInfo_v2(&fr0, &tot), CUDA_SUCCESS);
  /* The primary context's. */
  CUdeviceptr dp;
  CUstream sp;
  CU_ASSERT_EQUAL_FATAL(cuMemAlloc_v2(&dp, MiB), CUDA_SUCCESS);
  fill(dp, 4096, 20);
  CU_ASSERT_EQUAL_FATAL(cuStreamCreate(&sp, 0), CUDA_SUCCESS);
  /* The created context's, and memory of no context made while it is current. */
  CUcontext c;
  CU_ASSERT_EQUAL_FATAL(cuCtxCreate(&c, NULL, 0, 0), CUDA_SUCCESS);
  CUdeviceptr d, pooled;
  void *h;
  CUstream s;
  CUevent e;
  CU_ASSERT_EQUAL_FATAL(cuMemAlloc_v2(&d, 4 * MiB), CUDA_SUCCESS);
  CU_ASSERT_EQUAL_FATAL(cuMemAllocHost_v2(&h, 2 * 4096), CUDA_SUCCESS);
  CU_ASSERT_EQUAL_FATAL(cuStreamCreate(&s, 0), CUDA_SUCCESS);
  CU_ASSERT_EQUAL_FATAL(cuEventCreate(&e, 0), CUDA_SUCCESS);
  CU_ASSERT_EQUAL_FATAL(cuMemAllocAsync(&pooled, 2 * MiB, s), CUDA_SUCCESS);
  CUmemGenericAllocationHandle vh;
  CU_ASSERT_EQUAL_FATAL(cuMemCreate(&vh, 2 * MiB, &fd_prop, 0), CUDA_SUCCESS);
  CUdeviceptr va = map_rw(vh, 2 * MiB);
  CU_ASSERT_FATAL(va != 0);
  fill(va, 2 * MiB, 30);
  /* Charged to its device, as before: 1 + 4 + 2 + 2 MiB. */
  CU_ASSERT_EQUAL(cuMemGetInfo_v2(&fr, &tot), CUDA_SUCCESS);
  CU_ASSERT_EQUAL(fr, fr0 - 9 * MiB);
  CU_ASSERT_EQUAL(stats().device_used[0], st0.device_used[0] + 9 * MiB);
  /* Whose memory: the context current at its allocation; none for stream-ordered and VMM
   * memory (answered with success and NULL). */
  CUdeviceptr hp = (CUdeviceptr)(uintptr_t)h;
  CU_ASSERT_PTR_EQUAL(ptr_ctx(d + 100), c);
  CU_ASSERT_PTR_EQUAL(ptr_ctx(hp + 4096), c);
  CU_ASSERT_PTR_EQUAL(ptr_ctx(dp), ctx);
  CU_ASSERT_PTR_NULL(ptr_ctx(pooled + 1));
  CU_ASSERT_PTR_NULL(ptr_ctx(va + 1));
  CU_ASSERT_EQUAL(ptr_int(CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL, d), 0);
  CUpointer_attribute as[] = {CU_POINTER_ATTRIBUTE_CONTEXT, CU_POINTER_ATTRIBUTE_MEMORY_TYPE};
  CUcontext owner = NULL;
  unsigned type = 0;
  void *out[] = {&owner, &type};
  CU_ASSERT_EQUAL(cuPointerGetAttributes(2, as, out, hp + 8), CUDA_SUCCESS);
  CU_ASSERT_PTR_EQUAL(owner, c);
  CU_ASSERT_EQUAL(type, CU_MEMORYTYPE_HOST);
  /* Whose stream: its creator's; the special streams are the current context. */
  CU_ASSERT_PTR_EQUAL(stream_ctx(s), c);
  CU_ASSERT_PTR_EQUAL(stream_ctx(sp), ctx);
  CU_ASSERT_PTR_EQUAL(stream_ctx(NULL), c);
  CU_ASSERT_PTR_EQUAL(stream_ctx(CU_STREAM_LEGACY), c);
  CU_ASSERT_PTR_EQUAL(stream_ctx(CU_STREAM_PER_THREAD), c);
  CUcontext got = NULL;
  CUgreenCtx green = (CUgreenCtx)(uintptr_t)1;
  CU_ASSERT_EQUAL(cuStreamGetCtx_ptsz(NULL, &got), CUDA_SUCCESS);
  CU_ASSERT_PTR_EQUAL(got, c);
  CU_ASSERT_EQUAL(cuStreamGetCtx_v2(s, &got, &green), CUDA_SUCCESS);
  CU_ASSERT_PTR_EQUAL(got, c);
  CU_ASSERT_PTR_NULL(green);
  CU_ASSERT_EQUAL(cuStreamGetCtx_v2_ptsz(sp, &got, NULL), CUDA_SUCCESS);
  CU_ASSERT_PTR_EQUAL(got, ctx);
  CU_ASSERT_EQUAL(stats().misuse, m);
  CU_ASSERT_EQUAL(cuStreamGetCtx(s, NULL), CUDA_ERROR_INVALID_VALUE);
  CU_ASSERT_EQUAL(cuStreamGetCtx((CUstream)(uintptr_t)&got, &got), CUDA_ERROR_INVALID_HANDLE);
  CU_ASSERT_EQUAL(stats().misuse, m += 2);
  /* Work pending on its stream when it goes. */
  CU_ASSERT_EQUAL(wltest_stream_hold(s), 0);
  CU_ASSERT_EQUAL(cuLaunchKernel(f_slow, 1, 1, 1, 1, 1, 1, 0, s, NULL, NULL), CUDA_SUCCESS);
  CU_ASSERT_EQUAL(cuEventRecord(e, s), CUDA_SUCCESS);

  CU_ASSERT_EQUAL_FATAL(cuCtxDestroy(c), CUDA_SUCCESS);
  CU_ASSERT_PTR_EQUAL(current(), ctx);
  CU_ASSERT(unmapped((void *)(uintptr_t)d, 4096));
  CU_ASSERT(unmapped(h, 2 * 4096));
  wltest_driver_stats_t st = stats();
  CU_ASSERT_EQUAL(st.streams, st0.streams + 1); /* sp */
  CU_ASSERT_EQUAL(st.events, st0.events);
  CU_ASSERT_EQUAL(st.dropped, st0.dropped + 2); /* s and e */
  CU_ASSERT_EQUAL(st.host_allocs, st0.host_allocs);
  CU_ASSERT_EQUAL(st.linear_allocs, st0.linear_allocs + 2); /* dp, pooled */
  CU_ASSERT_EQUAL(st.device_used[0], st0.device_used[0] + 5 * MiB);
  CU_ASSERT_EQUAL(st.misuse, m);
  CU_ASSERT_EQUAL(cuMemGetInfo_v2(&fr, &tot), CUDA_SUCCESS);
  CU_ASSERT_EQUAL(fr, fr0 - 5 * MiB);
  /* Unknown now: a question answers so, a use is a misuse. */
  CU_ASSERT_EQUAL(ptr_int(CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL, d), -(int)CUDA_ERROR_INVALID_VALUE);
  CU_ASSERT_EQUAL(ptr_int(CU_POINTER_ATTRIBUTE_MEMORY_TYPE, hp), -(int)CUDA_ERROR_INVALID_VALUE);
  CU_ASSERT_EQUAL(stats().misuse, m);
  unsigned flags;
  CU_ASSERT_EQUAL(cuMemHostGetFlags(&flags, h), CUDA_ERROR_INVALID_VALUE);
  CU_ASSERT_EQUAL(cuMemFreeHost(h), CUDA_ERROR_INVALID_VALUE);
  CU_ASSERT_EQUAL(cuMemFree_v2(d), CUDA_ERROR_INVALID_VALUE);
  CU_ASSERT_EQUAL(cuStreamQuery(s), CUDA_ERROR_INVALID_HANDLE);
  CU_ASSERT_EQUAL(cuStreamGetCtx(s, &got), CUDA_ERROR_INVALID_HANDLE);
  CU_ASSERT_EQUAL(cuEventQuery(e), CUDA_ERROR_INVALID_HANDLE);
  CU_ASSERT_EQUAL(stats().misuse, m += 6);
  /* What stays (checked mapped before it is read). */
  CU_ASSERT_FATAL(!unmapped((void *)(uintptr_t)dp, 4096));
  CU_ASSERT_FATAL(!unmapped((void *)(uintptr_t)va, 4096));
  CU_ASSERT(holds(dp, 4096, 20));
  CU_ASSERT_PTR_EQUAL(ptr_ctx(dp), ctx);
  CU_ASSERT(holds(va, 2 * MiB, 30));
  CU_ASSERT_EQUAL(ptr_int(CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL, pooled), 0);
  CU_ASSERT_EQUAL(cuStreamQuery(sp), CUDA_SUCCESS);
  CU_ASSERT_EQUAL(cuMemFreeAsync(pooled, sp), CUDA_SUCCESS);
  CU_ASSERT_EQUAL(unmap_free(va, 2 * MiB), CUDA_SUCCESS);
  CU_ASSERT_EQUAL(cuMemRelease(vh), CUDA_SUCCESS);
  CU_ASSERT_EQUAL(cuMemFree_v2(dp), CUDA_SUCCESS);
  CU_ASSERT_EQUAL(cuStreamDestroy_v2(sp), CUDA_SUCCESS);
  CU_ASSERT_EQUAL(cuCtxSynchronize(), CUDA_SUCCESS);
  CU_ASSERT_EQUAL(cuMemGetInfo_v2(&fr, &tot), CUDA_SUCCESS);
  CU_ASSERT_EQUAL(fr, fr0);
  st = stats();
  CU_ASSERT_EQUAL(st.used, st0.used);
  CU_ASSERT_EQUAL(st.linear_allocs, st0.linear_allocs);
  CU_ASSERT_EQUAL(st.streams, st0.streams);
  CU_ASSERT_EQUAL(st.misuse, m);
}

/* A reset of the device's primary context takes what is the primary context's only: a context
 * created on the device keeps its memory, page-locked memory and stream, until its destroy; its
 * legacy stream, waiting on a held stream of the primary context, is let go (the wait on a freed
 * stream is forgotten: an ASan build sees it otherwise). */
static void test_ctx_primary_reset(void) {
  wltest_driver_stats_t st0 = stats();
  uint64_t m = st0.misuse, used = st0.device_used[0];
  CUdeviceptr dp, d;
  void *hp, *h;
  CUcontext c;
  CUstream s, sp;
  CUevent ep;
  CU_ASSERT_EQUAL_FATAL(cuMemAlloc_v2(&dp, MiB), CUDA_SUCCESS);
  CU_ASSERT_EQUAL_FATAL(cuMemHostAlloc(&hp, 4096, 0), CUDA_SUCCESS);
  CU_ASSERT_EQUAL_FATAL(cuStreamCreate(&sp, 0), CUDA_SUCCESS);
  CU_ASSERT_EQUAL_FATAL(cuEventCreate(&ep, 0), CUDA_SUCCESS);
  CU_ASSERT_EQUAL(wltest_stream_hold(sp), 0);
  CU_ASSERT_EQUAL(cuEventRecord(ep, sp), CUDA_SUCCESS);
  CU_ASSERT_EQUAL_FATAL(cuCtxCreate(&c, NULL, 0, 0), CUDA_SUCCESS);
  CU_ASSERT_EQUAL_FATAL(cuMemAlloc_v2(&d, 2 * MiB), CUDA_SUCCESS);
  CU_ASSERT_EQUAL_FATAL(cuMemHostAlloc(&h, 4096, 0), CUDA_SUCCESS);
  CU_ASSERT_EQUAL_FATAL(cuStreamCreate(&s, 0), CUDA_SUCCESS);
  fill(d, 4096, 40);
  fill((CUdeviceptr)(uintptr_t)h, 4096, 50);
  CU_ASSERT_EQUAL(stats().device_used[0], used + 3 * MiB);
  CU_ASSERT_EQUAL(cuStreamWaitEvent(NULL, ep, 0), CUDA_SUCCESS); /* c's legacy stream */
  CU_ASSERT_EQUAL(cuStreamQuery(NULL), CUDA_ERROR_NOT_READY);

  CU_ASSERT_EQUAL_FATAL(cuDevicePrimaryCtxReset_v2(0), CUDA_SUCCESS);
  wltest_driver_stats_t st = stats();
  CU_ASSERT_EQUAL(st.resets, st0.resets + 1);
  CU_ASSERT_EQUAL(st.dropped, st0.dropped + 2); /* sp and ep, not s */
  CU_ASSERT_EQUAL(st.streams, st0.streams + 1);
  CU_ASSERT_EQUAL(cuStreamSynchronize(NULL), CUDA_SUCCESS);
  CU_ASSERT_EQUAL(cuStreamQuery(NULL), CUDA_SUCCESS);
  CU_ASSERT(unmapped((void *)(uintptr_t)dp, 4096));
  CU_ASSERT(unmapped(hp, 4096));
  CU_ASSERT_FATAL(!unmapped((void *)(uintptr_t)d, 4096));
  CU_ASSERT_FATAL(!unmapped(h, 4096));
  CU_ASSERT(holds(d, 4096, 40));
  CU_ASSERT(holds((CUdeviceptr)(uintptr_t)h, 4096, 50));
  CU_ASSERT_PTR_EQUAL(ptr_ctx(d + 8), c);
  CU_ASSERT_PTR_EQUAL(ptr_ctx((CUdeviceptr)(uintptr_t)h), c);
  CU_ASSERT_EQUAL(stats().device_used[0], used + 2 * MiB);
  CU_ASSERT_PTR_EQUAL(current(), c);
  CU_ASSERT_EQUAL(cuStreamQuery(s), CUDA_SUCCESS);
  CU_ASSERT_PTR_EQUAL(stream_ctx(s), c);
  CU_ASSERT_EQUAL(stats().misuse, m);
  /* Its destroy takes them. */
  CU_ASSERT_EQUAL(cuCtxDestroy(c), CUDA_SUCCESS);
  CU_ASSERT_PTR_EQUAL(current(), ctx);
  CU_ASSERT(unmapped((void *)(uintptr_t)d, 4096));
  CU_ASSERT(unmapped(h, 4096));
  st = stats();
  CU_ASSERT_EQUAL(st.device_used[0], used);
  CU_ASSERT_EQUAL(st.streams, st0.streams);
  CU_ASSERT_EQUAL(st.dropped, st0.dropped + 3);
  CU_ASSERT_EQUAL(st.misuse, m);
}

/* Child mode (--child-ipc-ctx HANDLE): an IPC handle opened while a created context is current
 * belongs to it: CU_POINTER_ATTRIBUTE_CONTEXT says so, the primary context's reset leaves it
 * mapped, the context's destroy unmaps it (closing it then is a misuse). Writes 97 through it
 * first, for the parent to see. 0 when all held. */
static int child_ipc_ctx(const char *hex) {
  CUipcMemHandle h;
  CUcontext prim, c, owner = NULL;
  CUdeviceptr p = 0;
  WL_CHILD_CHECK(wl_test_unhex(hex, &h, sizeof h));
  WL_CHILD_CHECK(cuInit(0) == CUDA_SUCCESS);
  WL_CHILD_CHECK(cuDevicePrimaryCtxRetain(&prim, 0) == CUDA_SUCCESS && cuCtxSetCurrent(prim) == 0);
  WL_CHILD_CHECK(cuCtxCreate(&c, NULL, 0, 0) == CUDA_SUCCESS);
  WL_CHILD_CHECK(cuIpcOpenMemHandle(&p, h, 0) == CUDA_SUCCESS);
  WL_CHILD_CHECK(cuPointerGetAttribute(&owner, CU_POINTER_ATTRIBUTE_CONTEXT, p + 8) == 0);
  WL_CHILD_CHECK(owner == c);
  *(volatile unsigned char *)(uintptr_t)p = 97;
  WL_CHILD_CHECK(cuDevicePrimaryCtxReset_v2(0) == CUDA_SUCCESS);
  WL_CHILD_CHECK(stats().ipc_opened == 1);
  WL_CHILD_CHECK(*(volatile unsigned char *)(uintptr_t)p == 97);
  WL_CHILD_CHECK(cuCtxDestroy(c) == CUDA_SUCCESS);
  wltest_driver_stats_t st = stats();
  WL_CHILD_CHECK(st.ipc_opened == 0 && st.ipc_open_bytes == 0);
  int dev = -1;
  WL_CHILD_CHECK(cuPointerGetAttribute(&dev, CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL, p) ==
                 CUDA_ERROR_INVALID_VALUE);
  WL_CHILD_CHECK(stats().misuse == 0);
  WL_CHILD_CHECK(cuIpcCloseMemHandle(p) == CUDA_ERROR_INVALID_VALUE); /* in prim, current again */
  WL_CHILD_CHECK(stats().misuse == 1);
  return 0;
}

/* Another process's IPC handle opened in a created context goes with its destroy, not with the
 * primary context's reset (child_ipc_ctx). */
static void test_ctx_ipc(void) {
  const size_t n = IPC_BYTES;
  CUdeviceptr d;
  CU_ASSERT_EQUAL_FATAL(cuMemAlloc_v2(&d, n), CUDA_SUCCESS);
  fill(d, n, 85);
  CUipcMemHandle h;
  CU_ASSERT_EQUAL_FATAL(cuIpcGetMemHandle(&h, d), CUDA_SUCCESS);
  char hex[2 * sizeof h + 1];
  wl_test_hex(&h, sizeof h, hex);
  CU_ASSERT_EQUAL(run_child(-1, "--child-ipc-ctx", hex, NULL), 0);
  CU_ASSERT_EQUAL(*(unsigned char *)(uintptr_t)d, 97);
  CU_ASSERT(holds_from(d, 1, n, 85));
  CU_ASSERT_EQUAL(cuMemFree_v2(d), CUDA_SUCCESS);
}

/* ---- several devices (WLTEST_DEVICE_COUNT) ---------------------------------------------------*/

static size_t free_on(CUcontext c) {
  size_t fr = 0, tot = 0;
  if (cuCtxSetCurrent(c) != CUDA_SUCCESS || cuMemGetInfo_v2(&fr, &tot) != CUDA_SUCCESS) return 1;
  return fr;
}

/* With WLTEST_DEVICE_COUNT=2 (the test runs itself again with it set): two devices, each with
 * its own primary context, capacity and default pool; memory is charged to the device it belongs
 * to and its pointers say which; VMM access is per device; resetting device 1 takes device 1's
 * memory, streams and pinned memory and leaves device 0's alone. */
static void test_multi_device(void) {
  if (!getenv("WLTEST_DEVICE_COUNT")) {
    CU_ASSERT_TRUE(
        wl_test_rerun("WLTEST_DEVICE_COUNT", "2", "test_doubles_driver", "multi_device"));
    return;
  }
  CU_ASSERT_EQUAL_FATAL(cuInit(0), CUDA_SUCCESS);
  int n = 0;
  CU_ASSERT_EQUAL(cuDeviceGetCount(&n), CUDA_SUCCESS);
  CU_ASSERT_EQUAL_FATAL(n, 2);
  CU_ASSERT_EQUAL(stats().devices, 2);
  CUdevice dev = -1;
  CU_ASSERT_EQUAL(cuDeviceGet(&dev, 1), CUDA_SUCCESS);
  CU_ASSERT_EQUAL(dev, 1);
  uint64_t m = stats().misuse;
  CU_ASSERT_EQUAL(cuDeviceGet(&dev, 2), CUDA_ERROR_INVALID_DEVICE);
  CU_ASSERT_EQUAL(stats().misuse, m + 1);
  /* Each device: the capacity, its own PCI bus id and UUID. */
  char bus0[16], bus1[16];
  CU_ASSERT_EQUAL(cuDeviceGetPCIBusId(bus0, sizeof bus0, 0), CUDA_SUCCESS);
  CU_ASSERT_EQUAL(cuDeviceGetPCIBusId(bus1, sizeof bus1, 1), CUDA_SUCCESS);
  CU_ASSERT_STRING_EQUAL(bus0, "0000:1b:00.0");
  CU_ASSERT_STRING_EQUAL(bus1, "0000:1c:00.0");
  int bus = 0;
  CU_ASSERT_EQUAL(cuDeviceGetAttribute(&bus, CU_DEVICE_ATTRIBUTE_PCI_BUS_ID, 1), CUDA_SUCCESS);
  CU_ASSERT_EQUAL(bus, 0x1c);
  CUuuid u0, u1;
  CU_ASSERT_EQUAL(cuDeviceGetUuid_v2(&u0, 0), CUDA_SUCCESS);
  CU_ASSERT_EQUAL(cuDeviceGetUuid_v2(&u1, 1), CUDA_SUCCESS);
  CU_ASSERT_NOT_EQUAL(memcmp(&u0, &u1, sizeof u0), 0);
  size_t total = 0;
  CU_ASSERT_EQUAL(cuDeviceTotalMem_v2(&total, 1), CUDA_SUCCESS);
  CU_ASSERT_EQUAL(total, 64 * MiB);

  /* A primary context per device. */
  CUcontext c0 = NULL, c1 = NULL;
  CU_ASSERT_EQUAL_FATAL(cuDevicePrimaryCtxRetain(&c0, 0), CUDA_SUCCESS);
  CU_ASSERT_EQUAL_FATAL(cuDevicePrimaryCtxRetain(&c1, 1), CUDA_SUCCESS);
  CU_ASSERT_PTR_NOT_EQUAL(c0, c1);
  unsigned fl = 0;
  int active = 0;
  CU_ASSERT_EQUAL(cuDevicePrimaryCtxGetState(1, &fl, &active), CUDA_SUCCESS);
  CU_ASSERT_EQUAL(active, 1);
  CU_ASSERT_EQUAL(cuCtxSetCurrent(c1), CUDA_SUCCESS);
  CU_ASSERT_EQUAL(cuCtxGetDevice(&dev), CUDA_SUCCESS);
  CU_ASSERT_EQUAL(dev, 1);
  CU_ASSERT_EQUAL(cuCtxSetCurrent(c0), CUDA_SUCCESS);
  CU_ASSERT_EQUAL(cuCtxGetDevice(&dev), CUDA_SUCCESS);
  CU_ASSERT_EQUAL(dev, 0);

  /* Linear memory: charged to the current context's device, and says so. */
  CUdeviceptr d0, d1;
  void *h0, *h1;
  CU_ASSERT_EQUAL_FATAL(cuMemAlloc_v2(&d0, 4 * MiB), CUDA_SUCCESS);
  CU_ASSERT_EQUAL_FATAL(cuMemHostAlloc(&h0, 4096, 0), CUDA_SUCCESS);
  CU_ASSERT_EQUAL_FATAL(cuCtxSetCurrent(c1), CUDA_SUCCESS);
  CU_ASSERT_EQUAL_FATAL(cuMemAlloc_v2(&d1, 8 * MiB), CUDA_SUCCESS);
  CU_ASSERT_EQUAL_FATAL(cuMemHostAlloc(&h1, 4096, 0), CUDA_SUCCESS);
  CU_ASSERT_EQUAL(free_on(c0), 60 * MiB);
  CU_ASSERT_EQUAL(free_on(c1), 56 * MiB);
  wltest_driver_stats_t st = stats();
  CU_ASSERT_EQUAL(st.device_used[0], 4 * MiB);
  CU_ASSERT_EQUAL(st.device_used[1], 8 * MiB);
  CU_ASSERT_EQUAL(st.used, 12 * MiB);
  CU_ASSERT_EQUAL(ptr_int(CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL, d0 + 1), 0);
  CU_ASSERT_EQUAL(ptr_int(CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL, d1 + 1), 1);
  CU_ASSERT_PTR_EQUAL(ptr_ctx(d0), c0);
  CU_ASSERT_PTR_EQUAL(ptr_ctx(d1), c1);
  /* Page-locked memory: the device of the context current at allocation, not charged. */
  CUdeviceptr hp0 = (CUdeviceptr)(uintptr_t)h0, hp1 = (CUdeviceptr)(uintptr_t)h1;
  CU_ASSERT_EQUAL(ptr_int(CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL, hp0), 0);
  CU_ASSERT_EQUAL(ptr_int(CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL, hp1 + 8), 1);
  CU_ASSERT_EQUAL(ptr_int(CU_POINTER_ATTRIBUTE_MEMORY_TYPE, hp1), CU_MEMORYTYPE_HOST);
  /* A device 1 allocation is 64 MiB at most: device 0's memory does not help. */
  CUdeviceptr big;
  CU_ASSERT_EQUAL(cuMemAlloc_v2(&big, 60 * MiB), CUDA_ERROR_OUT_OF_MEMORY);

  /* Stream-ordered memory: the pool's device; each device has its own default pool. */
  CUmemoryPool p0 = NULL, p1 = NULL, got = NULL;
  CU_ASSERT_EQUAL(cuDeviceGetDefaultMemPool(&p0, 0), CUDA_SUCCESS);
  CU_ASSERT_EQUAL(cuDeviceGetDefaultMemPool(&p1, 1), CUDA_SUCCESS);
  CU_ASSERT_PTR_NOT_EQUAL(p0, p1);
  CUdeviceptr a1, a0;
  CU_ASSERT_EQUAL_FATAL(cuMemAllocAsync(&a1, 2 * MiB, NULL), CUDA_SUCCESS); /* under c1 */
  CU_ASSERT_EQUAL(ptr_int(CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL, a1), 1);
  CU_ASSERT_EQUAL(cuPointerGetAttribute(&got, CU_POINTER_ATTRIBUTE_MEMPOOL_HANDLE, a1),
                  CUDA_SUCCESS);
  CU_ASSERT_PTR_EQUAL(got, p1);
  /* From device 0's pool while device 1's context is current: device 0's memory. */
  CU_ASSERT_EQUAL_FATAL(cuMemAllocFromPoolAsync(&a0, 2 * MiB, p0, NULL), CUDA_SUCCESS);
  CU_ASSERT_EQUAL(ptr_int(CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL, a0), 0);
  CU_ASSERT_EQUAL(free_on(c0), 58 * MiB);
  CU_ASSERT_EQUAL(free_on(c1), 54 * MiB);
  /* On a stream of device 0 while device 1's context is current: from device 0's pool. */
  CUstream os0;
  CUdeviceptr b0;
  CU_ASSERT_EQUAL_FATAL(cuCtxSetCurrent(c0), CUDA_SUCCESS);
  CU_ASSERT_EQUAL_FATAL(cuStreamCreate(&os0, CU_STREAM_NON_BLOCKING), CUDA_SUCCESS);
  CU_ASSERT_EQUAL_FATAL(cuCtxSetCurrent(c1), CUDA_SUCCESS);
  CU_ASSERT_EQUAL_FATAL(cuMemAllocAsync(&b0, 2 * MiB, os0), CUDA_SUCCESS);
  CU_ASSERT_EQUAL(ptr_int(CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL, b0), 0);
  CU_ASSERT_EQUAL(free_on(c0), 56 * MiB);
  CU_ASSERT_EQUAL(cuCtxSetCurrent(c1), CUDA_SUCCESS);
  CU_ASSERT_EQUAL(cuMemFreeAsync(b0, os0), CUDA_SUCCESS);
  CU_ASSERT_EQUAL(cuStreamSynchronize(os0), CUDA_SUCCESS);
  CU_ASSERT_EQUAL(cuStreamDestroy_v2(os0), CUDA_SUCCESS);

  /* VMM: charged to the location's device; a device that does not exist is misuse. */
  CUmemAllocationProp prop = fd_prop;
  prop.location.id = 1;
  CUmemGenericAllocationHandle vh, bad = 0;
  CU_ASSERT_EQUAL_FATAL(cuMemCreate(&vh, 2 * MiB, &prop, 0), CUDA_SUCCESS);
  CU_ASSERT_EQUAL(free_on(c0), 58 * MiB);
  CU_ASSERT_EQUAL(free_on(c1), 52 * MiB);
  m = stats().misuse;
  prop.location.id = 2;
  CU_ASSERT_EQUAL(cuMemCreate(&bad, 2 * MiB, &prop, 0), CUDA_ERROR_INVALID_DEVICE);
  CU_ASSERT_EQUAL(stats().misuse, m + 1);
  CUdeviceptr va = 0;
  CU_ASSERT_EQUAL_FATAL(cuMemAddressReserve(&va, 2 * MiB, 0, 0, 0), CUDA_SUCCESS);
  CU_ASSERT_EQUAL_FATAL(cuMemMap(va, 2 * MiB, 0, vh, 0), CUDA_SUCCESS);
  CU_ASSERT_EQUAL(ptr_int(CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL, va + 4096), 1);
  /* Access is per device: device 0 losing it leaves device 1's, and the memory usable. */
  CUmemAccessDesc both[2] = {
      {.location = {CU_MEM_LOCATION_TYPE_DEVICE, 0}, .flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE},
      {.location = {CU_MEM_LOCATION_TYPE_DEVICE, 1}, .flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE}};
  CU_ASSERT_EQUAL(cuMemSetAccess(va, 2 * MiB, both, 2), CUDA_SUCCESS);
  unsigned long long flags = 0;
  CU_ASSERT_EQUAL(cuMemGetAccess(&flags, &both[0].location, va + 4096), CUDA_SUCCESS);
  CU_ASSERT_EQUAL(flags, CU_MEM_ACCESS_FLAGS_PROT_READWRITE);
  uint64_t acc = stats().accessible_bytes;
  CUmemAccessDesc none0 = {.location = {CU_MEM_LOCATION_TYPE_DEVICE, 0},
                           .flags = CU_MEM_ACCESS_FLAGS_PROT_NONE};
  CU_ASSERT_EQUAL(cuMemSetAccess(va, 2 * MiB, &none0, 1), CUDA_SUCCESS);
  CU_ASSERT_EQUAL(cuMemGetAccess(&flags, &both[0].location, va), CUDA_SUCCESS);
  CU_ASSERT_EQUAL(flags, CU_MEM_ACCESS_FLAGS_PROT_NONE);
  CU_ASSERT_EQUAL(stats().accessible_bytes, acc);
  fill(va, 2 * MiB, 90);
  CU_ASSERT(holds(va, 2 * MiB, 90));
  CUmemAccessDesc none1 = none0;
  none1.location.id = 1;
  CU_ASSERT_EQUAL(cuMemSetAccess(va, 2 * MiB, &none1, 1), CUDA_SUCCESS);
  CU_ASSERT_EQUAL(stats().accessible_bytes, acc - 2 * MiB);

  /* Peer access: recorded per context, once; pool access per device. */
  CU_ASSERT_EQUAL(cuCtxEnablePeerAccess(c0, 0), CUDA_SUCCESS); /* device 1 reaches device 0 */
  CU_ASSERT_EQUAL(cuCtxEnablePeerAccess(c0, 0), CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED);
  CU_ASSERT_EQUAL(cuCtxDisablePeerAccess(c0), CUDA_SUCCESS);
  CU_ASSERT_EQUAL(cuCtxDisablePeerAccess(c0), CUDA_ERROR_PEER_ACCESS_NOT_ENABLED);
  m = stats().misuse;
  CU_ASSERT_EQUAL(cuCtxEnablePeerAccess(c1, 0), CUDA_ERROR_INVALID_DEVICE); /* itself */
  CU_ASSERT_EQUAL(stats().misuse, m + 1);
  CUmemoryPool pool0;
  CU_ASSERT_EQUAL(cuDeviceGetDefaultMemPool(&pool0, 0), CUDA_SUCCESS);
  CU_ASSERT_EQUAL(cuMemPoolSetAccess(pool0, &both[1], 1), CUDA_SUCCESS);

  /* A launch on a stream of device 1 (created while its context is current) runs its twin. */
  CUmodule mm;
  CUfunction add;
  CU_ASSERT_EQUAL_FATAL(cuModuleLoadData(&mm, ptx), CUDA_SUCCESS);
  CU_ASSERT_EQUAL_FATAL(cuModuleGetFunction(&add, mm, "wl_t_add"), CUDA_SUCCESS);
  CUstream s0, s1;
  CU_ASSERT_EQUAL_FATAL(cuCtxSetCurrent(c0), CUDA_SUCCESS);
  CU_ASSERT_EQUAL_FATAL(cuStreamCreate(&s0, 0), CUDA_SUCCESS);
  CU_ASSERT_EQUAL_FATAL(cuCtxSetCurrent(c1), CUDA_SUCCESS);
  CU_ASSERT_EQUAL_FATAL(cuStreamCreate(&s1, 0), CUDA_SUCCESS);
  CU_ASSERT_EQUAL(cuStreamGetDevice(s1, &dev), CUDA_SUCCESS);
  CU_ASSERT_EQUAL(dev, 1);
  CU_ASSERT_EQUAL(cuMemsetD32_v2(d1, 0, 1), CUDA_SUCCESS);
  unsigned k = 5;
  void *args[] = {&d1, &k};
  CU_ASSERT_EQUAL(cuLaunchKernel(add, 1, 1, 1, 1, 1, 1, 0, s1, args, NULL), CUDA_SUCCESS);
  CU_ASSERT_EQUAL(cuStreamSynchronize(s1), CUDA_SUCCESS);
  CU_ASSERT_EQUAL(*(unsigned *)(uintptr_t)d1, 5);

  /* Resetting device 1 takes its memory, page-locked memory and streams; device 0's stay. */
  m = stats().misuse;
  memset((void *)(uintptr_t)d0, 0x11, 4096);
  CU_ASSERT_EQUAL_FATAL(cuDevicePrimaryCtxReset_v2(1), CUDA_SUCCESS);
  CU_ASSERT(unmapped((void *)(uintptr_t)d1, 4096));
  CU_ASSERT(unmapped(h1, 4096));
  CU_ASSERT_FALSE(unmapped((void *)(uintptr_t)d0, 4096));
  CU_ASSERT_FALSE(unmapped(h0, 4096));
  CU_ASSERT_EQUAL(*(unsigned char *)(uintptr_t)d0, 0x11);
  CU_ASSERT_EQUAL(ptr_int(CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL, d1), -(int)CUDA_ERROR_INVALID_VALUE);
  CU_ASSERT_EQUAL(ptr_int(CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL, d0), 0);
  CU_ASSERT_EQUAL(ptr_int(CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL, hp0), 0);
  /* Device 1 keeps its stream-ordered and VMM memory (as one device does); device 0 all. */
  CU_ASSERT_EQUAL(free_on(c1), 60 * MiB);
  CU_ASSERT_EQUAL(free_on(c0), 58 * MiB);
  CU_ASSERT_EQUAL(stats().misuse, m);
  CU_ASSERT_EQUAL(cuStreamQuery(s1), CUDA_ERROR_INVALID_HANDLE);
  CU_ASSERT_EQUAL(cuStreamQuery(s0), CUDA_SUCCESS);
  CU_ASSERT_EQUAL(cuMemFree_v2(d1), CUDA_ERROR_INVALID_VALUE);
  CU_ASSERT_EQUAL(stats().misuse, m + 2);
  CU_ASSERT_EQUAL(cuDevicePrimaryCtxGetState(0, &fl, &active), CUDA_SUCCESS);
  CU_ASSERT_EQUAL(active, 1);

  /* A context created on device 1 (device 0's current): its memory is device 1's, and goes
   * with it. */
  CUcontext cc = NULL;
  uint64_t used0 = stats().device_used[0], used1 = stats().device_used[1];
  CU_ASSERT_EQUAL_FATAL(cuCtxCreate(&cc, NULL, 0, 1), CUDA_SUCCESS);
  CU_ASSERT_EQUAL(cuCtxGetDevice(&dev), CUDA_SUCCESS);
  CU_ASSERT_EQUAL(dev, 1);
  CUdeviceptr dc;
  CU_ASSERT_EQUAL_FATAL(cuMemAlloc_v2(&dc, 4 * MiB), CUDA_SUCCESS);
  CU_ASSERT_EQUAL(stats().device_used[1], used1 + 4 * MiB);
  CU_ASSERT_EQUAL(stats().device_used[0], used0);
  CU_ASSERT_EQUAL(ptr_int(CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL, dc), 1);
  CU_ASSERT_PTR_EQUAL(ptr_ctx(dc), cc);
  CU_ASSERT_EQUAL(cuCtxDestroy(cc), CUDA_SUCCESS);
  CU_ASSERT_EQUAL(stats().device_used[1], used1);
  CU_ASSERT_PTR_EQUAL(current(), c0);
  CU_ASSERT_EQUAL(stats().misuse, m + 2);

  /* Everything given back, per device. */
  CU_ASSERT_EQUAL(cuMemUnmap(va, 2 * MiB), CUDA_SUCCESS);
  CU_ASSERT_EQUAL(cuMemAddressFree(va, 2 * MiB), CUDA_SUCCESS);
  CU_ASSERT_EQUAL(cuMemRelease(vh), CUDA_SUCCESS);
  CU_ASSERT_EQUAL(cuMemFreeAsync(a1, NULL), CUDA_SUCCESS);
  CU_ASSERT_EQUAL(cuMemFreeAsync(a0, NULL), CUDA_SUCCESS);
  CU_ASSERT_EQUAL(cuCtxSynchronize(), CUDA_SUCCESS); /* trims the pools */
  CU_ASSERT_EQUAL(free_on(c1), 64 * MiB);
  CU_ASSERT_EQUAL(cuStreamDestroy_v2(s0), CUDA_SUCCESS);
  CU_ASSERT_EQUAL(cuMemFree_v2(d0), CUDA_SUCCESS);
  CU_ASSERT_EQUAL(cuMemFreeHost(h0), CUDA_SUCCESS);
  CU_ASSERT_EQUAL(free_on(c0), 64 * MiB);
  st = stats();
  CU_ASSERT(st.used == 0 && st.device_used[0] == 0 && st.device_used[1] == 0);
  CU_ASSERT_EQUAL(cuModuleUnload(mm), CUDA_SUCCESS);
  CU_ASSERT_EQUAL(cuCtxSetCurrent(NULL), CUDA_SUCCESS);
  CU_ASSERT_EQUAL(cuDevicePrimaryCtxRelease_v2(1), CUDA_SUCCESS);
  CU_ASSERT_EQUAL(cuDevicePrimaryCtxRelease_v2(0), CUDA_SUCCESS);
  CU_ASSERT_EQUAL(stats().primary_refs, 0);
  CU_ASSERT_EQUAL(stats().misuse, m + 2);
}

/* WLTEST_DEVICE_COUNT out of range (the test runs itself again with it set): one line on stderr
 * naming the variable and what it takes, then one device. */
static void test_device_count_invalid(void) {
  const char *env = getenv("WLTEST_DEVICE_COUNT");
  if (!env) {
    CU_ASSERT_TRUE(
        wl_test_rerun("WLTEST_DEVICE_COUNT", "9", "test_doubles_driver", "device_count_invalid"));
    CU_ASSERT_TRUE(
        wl_test_rerun("WLTEST_DEVICE_COUNT", "2x", "test_doubles_driver", "device_count_invalid"));
    return;
  }
  /* What cuInit says on stderr, caught in a file. */
  FILE *f = tmpfile();
  CU_ASSERT_PTR_NOT_NULL_FATAL(f);
  int saved = dup(2);
  CU_ASSERT_FATAL(saved >= 0);
  fflush(stderr);
  CU_ASSERT_FATAL(dup2(fileno(f), 2) == 2);
  CUresult rc = cuInit(0);
  fflush(stderr);
  dup2(saved, 2);
  close(saved);
  CU_ASSERT_EQUAL(rc, CUDA_SUCCESS);
  char line[256] = {0}, want[64];
  rewind(f);
  CU_ASSERT_PTR_NOT_NULL(fgets(line, sizeof line, f));
  snprintf(want, sizeof want, "WLTEST_DEVICE_COUNT=%s ", env);
  CU_ASSERT_PTR_NOT_NULL(strstr(line, want));
  CU_ASSERT_PTR_NOT_NULL(strstr(line, "from 1 to 8"));
  char more[64];
  CU_ASSERT_PTR_NULL(fgets(more, sizeof more, f)); /* one line */
  fclose(f);
  int n = 0;
  CU_ASSERT_EQUAL(cuDeviceGetCount(&n), CUDA_SUCCESS);
  CU_ASSERT_EQUAL(n, 1);
  CU_ASSERT_EQUAL(stats().devices, 1);
}

static void test_release_context(void) {
  CU_ASSERT_EQUAL(cuModuleUnload(mod), CUDA_SUCCESS);
  CU_ASSERT_EQUAL(cuDevicePrimaryCtxRelease_v2(0), CUDA_SUCCESS);
  wltest_driver_stats_t st = stats();
  CU_ASSERT_EQUAL(st.primary_refs, 0);
  CU_ASSERT_EQUAL(st.linear_allocs, 0);
  CU_ASSERT(st.launches >= 8);
}

/* The last release of a primary context destroys it with its cuMemAlloc and page-locked memory
 * (after release_context: no reference is left); a new retain starts a fresh one. */
static void test_primary_last_release(void) {
  CUcontext c = NULL;
  CUdeviceptr d = 0;
  void *h = NULL;
  wltest_driver_stats_t before = stats();
  CU_ASSERT_EQUAL(before.primary_refs, 0);
  CU_ASSERT_EQUAL_FATAL(cuDevicePrimaryCtxRetain(&c, 0), CUDA_SUCCESS);
  CU_ASSERT_EQUAL(cuCtxSetCurrent(c), CUDA_SUCCESS);
  CU_ASSERT_EQUAL(cuMemAlloc_v2(&d, 1u << 20), CUDA_SUCCESS);
  CU_ASSERT_EQUAL(cuMemHostAlloc(&h, 10000, 0), CUDA_SUCCESS);
  CU_ASSERT_EQUAL(stats().linear_allocs, before.linear_allocs + 1);
  CU_ASSERT_EQUAL(stats().host_allocs, before.host_allocs + 1);
  CU_ASSERT(stats().used > before.used);
  CU_ASSERT_EQUAL(cuDevicePrimaryCtxRelease_v2(0), CUDA_SUCCESS);
  wltest_driver_stats_t after = stats();
  CU_ASSERT_EQUAL(after.primary_refs, 0);
  CU_ASSERT_EQUAL(after.linear_allocs, before.linear_allocs);
  CU_ASSERT_EQUAL(after.used, before.used);
  CU_ASSERT_EQUAL(after.host_allocs, before.host_allocs); /* gone with it */
  CU_ASSERT_EQUAL_FATAL(cuDevicePrimaryCtxRetain(&c, 0), CUDA_SUCCESS);
  CU_ASSERT_EQUAL(cuCtxSetCurrent(c), CUDA_SUCCESS);
  CU_ASSERT_EQUAL(cuMemAlloc_v2(&d, 4096), CUDA_SUCCESS);
  CU_ASSERT_EQUAL(cuMemFree_v2(d), CUDA_SUCCESS);
  CU_ASSERT_EQUAL(cuDevicePrimaryCtxRelease_v2(0), CUDA_SUCCESS);
}

int main(int argc, char **argv) {
  if (argc > 1 && strcmp(argv[1], "--child-hold") == 0) return child_hold();
  if (argc > 3 && strcmp(argv[1], "--child-import") == 0)
    return child_import(atoi(argv[2]), (unsigned)atoi(argv[3]));
  if (argc > 3 && strcmp(argv[1], "--child-ipc") == 0)
    return child_ipc(argv[2], (unsigned)atoi(argv[3]));
  if (argc > 2 && strcmp(argv[1], "--child-ipc-gone") == 0) return child_ipc_gone(argv[2]);
  if (argc > 2 && strcmp(argv[1], "--child-ipc-reset") == 0) return child_ipc_reset(argv[2]);
  if (argc > 2 && strcmp(argv[1], "--child-ipc-ctx") == 0) return child_ipc_ctx(argv[2]);
  /* A device shared with the children this test starts, and with nobody else. */
  char shm[64];
  snprintf(shm, sizeof shm, "/wltest-doubles-%d", (int)getpid());
  setenv("WLTEST_DEVICE_SHM", shm, 1);
  static const wl_test_case_t cases[] = {
      {"getproc_versions", test_getproc_versions},
      {"getproc_covers_exports", test_getproc_covers_exports},
      {"init", test_init},
      {"launch_timeline", test_launch_timeline},
      {"launch_misuse", test_launch_misuse},
      {"launch_deprecated", test_launch_deprecated},
      {"legacy_stream_sync", test_legacy_stream_sync},
      {"oom_at_capacity", test_oom_at_capacity},
      {"alloc_pitch", test_alloc_pitch},
      {"pools", test_pools},
      {"set_mem_pool", test_set_mem_pool},
      {"capture_and_graph", test_capture_and_graph},
      {"capture_modes", test_capture_modes},
      {"capture_unsafe_vmm", test_capture_unsafe_vmm},
      {"graph_nodes", test_graph_nodes},
      {"graph_generic", test_graph_generic},
      {"destroy_pending", test_destroy_pending},
      {"per_thread_streams", test_per_thread_streams},
      {"shared_device", test_shared_device},
      {"vmm_fd_share", test_vmm_fd_share},
      {"vmm_retain", test_vmm_retain},
      {"vmm_fd_errors", test_vmm_fd_errors},
      {"vmm_fd_child", test_vmm_fd_child},
      {"no_posix_fd", test_no_posix_fd},
      {"ipc", test_ipc},
      {"pointer_attributes", test_pointer_attributes},
      {"reset", test_reset},
      {"reset_ipc", test_reset_ipc},
      {"ctx_getproc", test_ctx_getproc},
      {"ctx_create_destroy", test_ctx_create_destroy},
      {"ctx_stack", test_ctx_stack},
      {"ctx_destroy_memory", test_ctx_destroy_memory},
      {"ctx_primary_reset", test_ctx_primary_reset},
      {"ctx_ipc", test_ctx_ipc},
      {"multi_device", test_multi_device},
      {"device_count_invalid", test_device_count_invalid},
      {"release_context", test_release_context},
      {"primary_last_release", test_primary_last_release},
      {NULL, NULL},
  };
  int rc = wl_test_main(argc, argv, "doubles_driver", cases);
  shm_unlink(shm);
  return rc;
}
