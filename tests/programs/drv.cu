// wl-prog-drv: the driver API doors an interposer must cover. cuGetProcAddress lookups of every
// name the interposer hooks, at several CUDA versions, with and without the per-thread default
// stream flag; dlsym lookups of the exported variants; then a call through each pointer
// obtained. Prints what it did; the last line is a checksum of the data the kernels produced.
#include "common.cuh"

#include <cuda.h>
#include <cudaTypedefs.h>
#include <dlfcn.h>

#include "drv_kernels_fatbin.h"

// The deprecated launch entry points are among the doors.
#pragma GCC diagnostic ignored "-Wdeprecated-declarations"

const char *wl_prog = "wl-prog-drv";

// The kernel's host twin, for the doubles.
extern "C" void wltest_host_wl_drv_add(const wltest_launch_t *l) {
  unsigned *p = *(unsigned **)l->args[0], n = *(unsigned *)l->args[1], k = *(unsigned *)l->args[2];
  for (unsigned i = 0; i < n; i++) p[i] += k + i;
}
extern "C" const unsigned wltest_argsizes_wl_drv_add[] = {sizeof(unsigned *), sizeof(unsigned),
                                                          sizeof(unsigned), 0};

#define CU(call)                                                                                   \
  do {                                                                                             \
    CUresult cu_ = (call);                                                                         \
    if (cu_ != CUDA_SUCCESS) {                                                                     \
      const char *n_ = "?";                                                                        \
      cuGetErrorName(cu_, &n_);                                                                    \
      fprintf(stderr, "%s: error: %s failed: %s (%d)\n", wl_prog, #call, n_, (int)cu_);            \
      exit(1);                                                                                     \
    }                                                                                              \
  } while (0)

// The names an interposer hooks, and the exported variants dlsym may find.
static const char *const hooked[] = {
    "cuMemAlloc",
    "cuMemFree",
    "cuMemAllocAsync",
    "cuMemFreeAsync",
    "cuMemAllocFromPoolAsync",
    "cuMemCreate",
    "cuMemRelease",
    "cuMemMap",
    "cuMemUnmap",
    "cuMemGetInfo",
    "cuMemAllocHost",
    "cuMemHostAlloc",
    "cuMemFreeHost",
    "cuLaunchKernel",
    "cuLaunchKernelEx",
    "cuLaunchCooperativeKernel",
    "cuGraphLaunch",
    "cuLaunchCooperativeKernelMultiDevice",
    "cuLaunch",
    "cuLaunchGrid",
    "cuLaunchGridAsync",
    "cuFuncSetBlockShape",
};
static const char *const suffixes[] = {"", "_v2", "_ptsz", "_ptds", "_v2_ptsz", "_v2_ptds"};
static const int versions[] = {2000, 3020, 11000, 12000, 13000};

static void *lib;
static PFN_cuGetProcAddress_v12000 gpa;

// The exported name a pointer is, if any ("-" when none).
static const char *exported_as(const char *base, void *p, char *buf, size_t len) {
  for (size_t i = 0; i < sizeof suffixes / sizeof suffixes[0]; i++) {
    snprintf(buf, len, "%s%s", base, suffixes[i]);
    if (p && dlsym(lib, buf) == p) return buf;
  }
  return "-";
}

static void *lookup(const char *name, int version, cuuint64_t flags, bool print) {
  void *p = NULL;
  CUdriverProcAddressQueryResult st = CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND;
  CU(gpa(name, &p, version, flags, &st));
  if (print) {
    char buf[96];
    printf("%s: getproc %s %d %s -> %s %s\n", wl_prog, name, version,
           flags == CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM ? "per-thread" : "legacy",
           st == CU_GET_PROC_ADDRESS_SUCCESS                  ? "found"
           : st == CU_GET_PROC_ADDRESS_VERSION_NOT_SUFFICIENT ? "version-not-sufficient"
                                                              : "not-found",
           exported_as(name, p, buf, sizeof buf));
  }
  return p;
}

template <typename F> static F get(const char *name, bool per_thread) {
  void *p = lookup(name, 13000,
                   per_thread ? CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM
                              : CU_GET_PROC_ADDRESS_LEGACY_STREAM,
                   false);
  if (!p) {
    fprintf(stderr, "%s: error: cuGetProcAddress gave no %s\n", wl_prog, name);
    exit(1);
  }
  return (F)p;
}

static void did(const char *what) {
  printf("%s: call %s ok\n", wl_prog, what);
}

enum { N = 2048 };

int main(int argc, char **argv) {
  if (argc != 1) {
    fprintf(stderr, "usage: %s (no arguments)\n", wl_prog);
    return 2;
  }
  // The exported-symbol door: the program is linked with libcuda.
  CU(cuInit(0));
  CUdevice dev;
  CU(cuDeviceGet(&dev, 0));
  CUcontext ctx;
  CU(cuDevicePrimaryCtxRetain(&ctx, dev));
  CU(cuCtxSetCurrent(ctx));
  // The embedded image is only byte-aligned: the driver gets an 8-byte aligned copy.
  unsigned long long *image =
      (unsigned long long *)calloc(sizeof wl_drv_fatbin / 8 + 1, sizeof(unsigned long long));
  memcpy(image, wl_drv_fatbin, sizeof wl_drv_fatbin);
  CUmodule mod;
  CU(cuModuleLoadData(&mod, image));
  CUfunction fn;
  CU(cuModuleGetFunction(&fn, mod, "wl_drv_add"));

  // The dlsym door.
  lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_NOLOAD);
  if (!lib) lib = dlopen("libcuda.so.1", RTLD_NOW);
  if (!lib) {
    fprintf(stderr, "%s: error: dlopen libcuda.so.1: %s\n", wl_prog, dlerror());
    return 1;
  }
  void *g = dlsym(lib, "cuGetProcAddress_v2");
  if (!g) {
    fprintf(stderr, "%s: error: no cuGetProcAddress_v2 in libcuda.so.1\n", wl_prog);
    return 1;
  }
  gpa = (PFN_cuGetProcAddress_v12000)g;
  for (size_t i = 0; i < sizeof hooked / sizeof hooked[0]; i++)
    for (size_t j = 0; j < sizeof suffixes / sizeof suffixes[0]; j++) {
      char name[96];
      snprintf(name, sizeof name, "%s%s", hooked[i], suffixes[j]);
      if (dlsym(lib, name)) printf("%s: dlsym %s -> found\n", wl_prog, name);
    }

  // The cuGetProcAddress door, at several versions, both stream flavours.
  for (size_t i = 0; i < sizeof hooked / sizeof hooked[0]; i++)
    for (size_t v = 0; v < sizeof versions / sizeof versions[0]; v++) {
      lookup(hooked[i], versions[v], CU_GET_PROC_ADDRESS_LEGACY_STREAM, true);
      lookup(hooked[i], versions[v], CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM, true);
    }

  // Calls through the pointers obtained at 13000.
  CUstream s;
  CU(cuStreamCreate(&s, CU_STREAM_NON_BLOCKING));
  size_t fr = 0, tot = 0;
  CU(get<PFN_cuMemGetInfo_v3020>("cuMemGetInfo", false)(&fr, &tot));
  if (fr > tot) {
    fprintf(stderr, "%s: error: cuMemGetInfo free %zu > total %zu\n", wl_prog, fr, tot);
    return 1;
  }
  did("cuMemGetInfo");
  CUdeviceptr buf;
  CU(get<PFN_cuMemAlloc_v3020>("cuMemAlloc", false)(&buf, N * sizeof(unsigned)));
  CU(cuMemsetD8(buf, 0, N * sizeof(unsigned)));
  did("cuMemAlloc");

  unsigned n = N, k = 1;
  void *args[] = {&buf, &n, &k};
  CU(get<PFN_cuLaunchKernel_v4000>("cuLaunchKernel", false)(fn, 4, 1, 1, 256, 1, 1, 0, s, args,
                                                            NULL));
  did("cuLaunchKernel");
  k = 2;
  CU(get<PFN_cuLaunchKernel_v7000_ptsz>("cuLaunchKernel", true)(fn, 4, 1, 1, 256, 1, 1, 0, NULL,
                                                                args, NULL));
  did("cuLaunchKernel_ptsz");
  CUlaunchConfig cfg = {};
  cfg.gridDimX = 2, cfg.gridDimY = 1, cfg.gridDimZ = 1;
  cfg.blockDimX = 128, cfg.blockDimY = 1, cfg.blockDimZ = 1;
  cfg.hStream = s;
  k = 3;
  CU(get<PFN_cuLaunchKernelEx_v11060>("cuLaunchKernelEx", false)(&cfg, fn, args, NULL));
  did("cuLaunchKernelEx");
  cfg.hStream = NULL;
  k = 4;
  CU(get<PFN_cuLaunchKernelEx_v11060_ptsz>("cuLaunchKernelEx", true)(&cfg, fn, args, NULL));
  did("cuLaunchKernelEx_ptsz");
  k = 5;
  CU(get<PFN_cuLaunchCooperativeKernel_v9000>("cuLaunchCooperativeKernel",
                                              false)(fn, 2, 1, 1, 128, 1, 1, 0, s, args));
  did("cuLaunchCooperativeKernel");
  k = 6;
  CU(get<PFN_cuLaunchCooperativeKernel_v9000_ptsz>("cuLaunchCooperativeKernel",
                                                   true)(fn, 2, 1, 1, 128, 1, 1, 0, NULL, args));
  did("cuLaunchCooperativeKernel_ptsz");

  // The deprecated launches, each through the three doors (the exported symbol, cuGetProcAddress,
  // dlsym): the block shape and parameters are the function's state, set again since the launches
  // above invalidated it; cuLaunch and cuLaunchGrid run on the NULL stream. The NULL stream does
  // not wait for the non-blocking s, so the context is synchronised between them.
  CU(cuCtxSynchronize());
  CU(cuFuncSetBlockShape(fn, 128, 1, 1));
  CU(cuFuncSetSharedSize(fn, 0));
  CU(cuParamSetSize(fn, 16));
  CU(cuParamSetv(fn, 0, &buf, sizeof buf)); // unsigned *p, unsigned n, unsigned k
  CU(cuParamSeti(fn, 8, n));
  PFN_cuLaunch_v2000 launch0[3] = {cuLaunch, get<PFN_cuLaunch_v2000>("cuLaunch", false),
                                   (PFN_cuLaunch_v2000)dlsym(lib, "cuLaunch")};
  PFN_cuLaunchGrid_v2000 grid[3] = {cuLaunchGrid,
                                    get<PFN_cuLaunchGrid_v2000>("cuLaunchGrid", false),
                                    (PFN_cuLaunchGrid_v2000)dlsym(lib, "cuLaunchGrid")};
  PFN_cuLaunchGridAsync_v2000 grid_async[3] = {
      cuLaunchGridAsync, get<PFN_cuLaunchGridAsync_v2000>("cuLaunchGridAsync", false),
      (PFN_cuLaunchGridAsync_v2000)dlsym(lib, "cuLaunchGridAsync")};
  static const char *const door[3] = {"exported", "getproc", "dlsym"};
  for (int d = 0; d < 3; d++) {
    char what[64];
    if (!launch0[d] || !grid[d] || !grid_async[d]) {
      fprintf(stderr, "%s: error: no deprecated launch through %s\n", wl_prog, door[d]);
      return 1;
    }
    CU(cuParamSeti(fn, 12, 11 + 3 * d));
    CU(launch0[d](fn));
    snprintf(what, sizeof what, "cuLaunch %s", door[d]);
    did(what);
    CU(cuParamSeti(fn, 12, 12 + 3 * d));
    CU(grid[d](fn, 2, 1));
    snprintf(what, sizeof what, "cuLaunchGrid %s", door[d]);
    did(what);
    CU(cuCtxSynchronize());
    CU(cuParamSeti(fn, 12, 13 + 3 * d));
    CU(grid_async[d](fn, 2, 2, s));
    snprintf(what, sizeof what, "cuLaunchGridAsync %s", door[d]);
    did(what);
    CU(cuCtxSynchronize());
  }

  // The multi-device cooperative launch (deprecated; one device here), through the three doors,
  // where the device has it. On a buffer of its own: the checksum does not depend on it.
  int multi = 0;
  CU(cuDeviceGetAttribute(&multi, CU_DEVICE_ATTRIBUTE_COOPERATIVE_MULTI_DEVICE_LAUNCH, dev));
  if (multi) {
    PFN_cuLaunchCooperativeKernelMultiDevice_v9000 coop_multi[3] = {
        cuLaunchCooperativeKernelMultiDevice,
        get<PFN_cuLaunchCooperativeKernelMultiDevice_v9000>("cuLaunchCooperativeKernelMultiDevice",
                                                            false),
        (PFN_cuLaunchCooperativeKernelMultiDevice_v9000)dlsym(
            lib, "cuLaunchCooperativeKernelMultiDevice")};
    CUdeviceptr other;
    CU(cuMemAlloc(&other, N * sizeof(unsigned)));
    CU(cuMemsetD8(other, 0, N * sizeof(unsigned)));
    unsigned kk = 1;
    void *margs[] = {&other, &n, &kk};
    CUDA_LAUNCH_PARAMS lp = {};
    lp.function = fn;
    lp.gridDimX = 2, lp.gridDimY = 1, lp.gridDimZ = 1;
    lp.blockDimX = 128, lp.blockDimY = 1, lp.blockDimZ = 1;
    lp.hStream = s;
    lp.kernelParams = margs;
    for (int d = 0; d < 3; d++) {
      if (!coop_multi[d]) {
        fprintf(stderr, "%s: error: no cuLaunchCooperativeKernelMultiDevice through %s\n", wl_prog,
                door[d]);
        return 1;
      }
      CU(coop_multi[d](&lp, 1, 0));
      char what[80];
      snprintf(what, sizeof what, "cuLaunchCooperativeKernelMultiDevice %s", door[d]);
      did(what);
    }
    CU(cuStreamSynchronize(s));
    CU(cuMemFree(other));
  } else {
    printf("%s: no cuLaunchCooperativeKernelMultiDevice on this device\n", wl_prog);
  }

  // A captured launch, replayed through both cuGraphLaunch variants.
  CU(cuStreamSynchronize(s));
  CU(cuStreamSynchronize(CU_STREAM_PER_THREAD));
  CU(cuStreamBeginCapture(s, CU_STREAM_CAPTURE_MODE_THREAD_LOCAL));
  k = 7;
  CU(cuLaunchKernel(fn, 4, 1, 1, 256, 1, 1, 0, s, args, NULL));
  CUgraph graph;
  CU(cuStreamEndCapture(s, &graph));
  CUgraphExec exec;
  CU(cuGraphInstantiate(&exec, graph, 0));
  CU(get<PFN_cuGraphLaunch_v10000>("cuGraphLaunch", false)(exec, s));
  did("cuGraphLaunch");
  CU(cuStreamSynchronize(s));
  CU(get<PFN_cuGraphLaunch_v10000_ptsz>("cuGraphLaunch", true)(exec, NULL));
  did("cuGraphLaunch_ptsz");
  CU(cuStreamSynchronize(CU_STREAM_PER_THREAD));

  // Stream-ordered memory, both variants, from the current and from the default pool.
  CUdeviceptr a1, a2, a3, a4;
  CU(get<PFN_cuMemAllocAsync_v11020>("cuMemAllocAsync", false)(&a1, 1 << 20, s));
  did("cuMemAllocAsync");
  CU(get<PFN_cuMemAllocAsync_v11020_ptsz>("cuMemAllocAsync", true)(&a2, 1 << 20, NULL));
  did("cuMemAllocAsync_ptsz");
  CUmemoryPool pool;
  CU(cuDeviceGetDefaultMemPool(&pool, dev));
  CU(get<PFN_cuMemAllocFromPoolAsync_v11020>("cuMemAllocFromPoolAsync", false)(&a3, 1 << 20, pool,
                                                                               s));
  did("cuMemAllocFromPoolAsync");
  CU(get<PFN_cuMemAllocFromPoolAsync_v11020_ptsz>("cuMemAllocFromPoolAsync", true)(&a4, 1 << 20,
                                                                                   pool, NULL));
  did("cuMemAllocFromPoolAsync_ptsz");
  CU(get<PFN_cuMemFreeAsync_v11020>("cuMemFreeAsync", false)(a1, s));
  CU(get<PFN_cuMemFreeAsync_v11020>("cuMemFreeAsync", false)(a3, s));
  did("cuMemFreeAsync");
  CU(get<PFN_cuMemFreeAsync_v11020_ptsz>("cuMemFreeAsync", true)(a2, NULL));
  CU(get<PFN_cuMemFreeAsync_v11020_ptsz>("cuMemFreeAsync", true)(a4, NULL));
  did("cuMemFreeAsync_ptsz");
  CU(cuStreamSynchronize(s));
  CU(cuStreamSynchronize(CU_STREAM_PER_THREAD));

  // Virtual memory management.
  CUmemAllocationProp prop = {};
  prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
  prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  prop.location.id = dev;
  size_t gran = 0;
  CU(cuMemGetAllocationGranularity(&gran, &prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM));
  CUmemGenericAllocationHandle h;
  CU(get<PFN_cuMemCreate_v10020>("cuMemCreate", false)(&h, gran, &prop, 0));
  did("cuMemCreate");
  CUdeviceptr va;
  CU(cuMemAddressReserve(&va, gran, 0, 0, 0));
  CU(get<PFN_cuMemMap_v10020>("cuMemMap", false)(va, gran, 0, h, 0));
  did("cuMemMap");
  CUmemAccessDesc acc = {};
  acc.location = prop.location;
  acc.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
  CU(cuMemSetAccess(va, gran, &acc, 1));
  CU(cuMemcpyDtoD(va, buf, N * sizeof(unsigned)));
  CU(get<PFN_cuMemUnmap_v10020>("cuMemUnmap", false)(va, gran));
  did("cuMemUnmap");
  CU(get<PFN_cuMemRelease_v10020>("cuMemRelease", false)(h));
  did("cuMemRelease");
  CU(cuMemAddressFree(va, gran));

  // Page-locked host memory.
  void *p1, *p2;
  CU(get<PFN_cuMemAllocHost_v3020>("cuMemAllocHost", false)(&p1, N * sizeof(unsigned)));
  did("cuMemAllocHost");
  CU(get<PFN_cuMemHostAlloc_v2020>("cuMemHostAlloc", false)(&p2, 4096, CU_MEMHOSTALLOC_PORTABLE));
  did("cuMemHostAlloc");
  CU(cuMemcpyDtoH(p1, buf, N * sizeof(unsigned)));
  uint64_t sum = wl_fnv(WL_FNV_INIT, p1, N * sizeof(unsigned));
  CU(get<PFN_cuMemFreeHost_v2000>("cuMemFreeHost", false)(p1));
  CU(get<PFN_cuMemFreeHost_v2000>("cuMemFreeHost", false)(p2));
  did("cuMemFreeHost");
  CU(get<PFN_cuMemFree_v3020>("cuMemFree", false)(buf));
  did("cuMemFree");

  CU(cuGraphExecDestroy(exec));
  CU(cuGraphDestroy(graph));
  CU(cuStreamDestroy(s));
  CU(cuModuleUnload(mod));
  free(image);
  CU(cuDevicePrimaryCtxRelease(dev));
  printf("%s: checksum %016llx\n", wl_prog, (unsigned long long)sum);
  return 0;
}
