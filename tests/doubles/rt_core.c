/* The CUDA runtime double's core: loading the driver and resolving every entry point through its
 * cuGetProcAddress (as the real runtime does), errors, devices, the registration calls nvcc's
 * generated code makes, kernel launches and driver entry point queries. For tests only. */
#include "runtime.h"

#include <dlfcn.h>
#include <fatbinary_section.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define RT_EXPORT __attribute__((visibility("default")))

rt_driver_t rt__drv;

static struct {
  pthread_once_t once;
  pthread_mutex_t lock; /* registrations and lazy loading */
  cudaError_t init_err;
  int ndev;
  CUcontext primary[8];
  _Atomic unsigned gen; /* resets so far: a thread's context made current before one is stale */
  struct rt_fatbin_s *fatbins;
  struct rt_func_s *funcs;
} rt = {.once = PTHREAD_ONCE_INIT, .lock = PTHREAD_MUTEX_INITIALIZER};

static _Thread_local cudaError_t tl_last;
static _Thread_local int tl_device;
static _Thread_local CUcontext tl_ctx;    /* the context this thread made current */
static _Thread_local int tl_ctx_dev;      /* the device it belongs to */
static _Thread_local unsigned tl_ctx_gen; /* rt.gen when it was made current */

/* ---- errors ----------------------------------------------------------------------------------*/

cudaError_t rt_ret(cudaError_t err) {
  if (err != cudaSuccess && err != cudaErrorNotReady) tl_last = err;
  return err;
}

cudaError_t rt_err(CUresult rc) {
  switch (rc) {
  case CUDA_SUCCESS:
    return cudaSuccess;
  case CUDA_ERROR_INVALID_VALUE:
    return cudaErrorInvalidValue;
  case CUDA_ERROR_OUT_OF_MEMORY:
    return cudaErrorMemoryAllocation;
  case CUDA_ERROR_NOT_INITIALIZED:
    return cudaErrorInitializationError;
  case CUDA_ERROR_DEINITIALIZED:
    return cudaErrorCudartUnloading;
  case CUDA_ERROR_INVALID_CONTEXT:
    return cudaErrorDeviceUninitialized;
  case CUDA_ERROR_INVALID_HANDLE:
    return cudaErrorInvalidResourceHandle;
  case CUDA_ERROR_NOT_FOUND:
    return cudaErrorSymbolNotFound;
  case CUDA_ERROR_INVALID_IMAGE:
    return cudaErrorInvalidKernelImage;
  default:
    /* From 100 on, the runtime's codes are the driver's. */
    return (cudaError_t)rc;
  }
}

cudaError_t rt_drv(CUresult rc) {
  return rt_ret(rt_err(rc));
}

cudaError_t rt_missing(const char *what) {
  fprintf(stderr, "wltest-cudart: the driver gave no %s\n", what);
  return cudaErrorNotSupported;
}

cudaError_t CUDARTAPI cudaGetLastError(void) {
  cudaError_t e = tl_last;
  tl_last = cudaSuccess;
  return e;
}

cudaError_t CUDARTAPI cudaPeekAtLastError(void) {
  return tl_last;
}

typedef struct rt_errname_s {
  cudaError_t code;
  const char *name;
} rt_errname_t;

static const rt_errname_t rt_errnames[] = {
#define RT_ERR(e) {e, #e},
#include "rt_errors.inc"
#undef RT_ERR
};

const char *CUDARTAPI cudaGetErrorName(cudaError_t error) {
  for (size_t i = 0; i < sizeof rt_errnames / sizeof rt_errnames[0]; i++)
    if (rt_errnames[i].code == error) return rt_errnames[i].name;
  return "cudaErrorUnknown";
}

const char *CUDARTAPI cudaGetErrorString(cudaError_t error) {
  switch (error) {
  case cudaSuccess:
    return "no error";
  case cudaErrorInvalidValue:
    return "invalid argument";
  case cudaErrorMemoryAllocation:
    return "out of memory";
  case cudaErrorInitializationError:
    return "initialization error";
  case cudaErrorInvalidDevice:
    return "invalid device ordinal";
  case cudaErrorInvalidResourceHandle:
    return "invalid resource handle";
  case cudaErrorNotReady:
    return "device not ready";
  case cudaErrorNoDevice:
    return "no CUDA-capable device is detected";
  case cudaErrorInsufficientDriver:
    return "CUDA driver version is insufficient for CUDA runtime version";
  case cudaErrorNotSupported:
    return "operation not supported";
  case cudaErrorInvalidDeviceFunction:
    return "invalid device function";
  case cudaErrorInvalidConfiguration:
    return "invalid configuration argument";
  case cudaErrorStreamCaptureUnsupported:
    return "operation not permitted when stream is capturing";
  case cudaErrorStreamCaptureInvalidated:
    return "operation failed due to a previous error during capture";
  default:
    break;
  }
  for (size_t i = 0; i < sizeof rt_errnames / sizeof rt_errnames[0]; i++)
    if (rt_errnames[i].code == error) return rt_errnames[i].name;
  return "unrecognized error code";
}

/* ---- initialisation --------------------------------------------------------------------------*/

static void *driver_proc(const char *name, cuuint64_t flags) {
  void *p = NULL;
  CUdriverProcAddressQueryResult st = CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND;
  if (R.get_proc(name, &p, CUDART_VERSION, flags, &st) != CUDA_SUCCESS ||
      st != CU_GET_PROC_ADDRESS_SUCCESS)
    return NULL;
  return p;
}

/* fork: the child gets the runtime's lock free whatever another thread was doing. */
static void rt_fork_prepare(void) {
  pthread_mutex_lock(&rt.lock);
}
static void rt_fork_release(void) {
  pthread_mutex_unlock(&rt.lock);
}

static void rt_init_once(void) {
  rt.init_err = cudaErrorInsufficientDriver;
  /* Like the real runtime: open the driver, take only cuGetProcAddress from dlsym, then ask it
   * for everything else (itself included) before cuInit. */
  void *lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_GLOBAL);
  /* Registered after the driver's own (its constructor ran in dlopen): prepare handlers run
   * newest first, so a fork takes the runtime's lock before the driver's, the order rt_enter
   * takes them in. Registered earlier, a fork could deadlock with a thread in rt_enter. */
  pthread_atfork(rt_fork_prepare, rt_fork_release, rt_fork_release);
  if (!lib) {
    fprintf(stderr, "wltest-cudart: cannot load libcuda.so.1: %s\n", dlerror());
    return;
  }
  void *gpa = dlsym(lib, "cuGetProcAddress_v2");
  if (!gpa) {
    fprintf(stderr, "wltest-cudart: libcuda.so.1 has no cuGetProcAddress_v2\n");
    return;
  }
  memcpy(&R.get_proc, &gpa, sizeof gpa);
  void *self = driver_proc("cuGetProcAddress", CU_GET_PROC_ADDRESS_LEGACY_STREAM);
  if (self) memcpy(&R.get_proc, &self, sizeof self);
#define RT_RESOLVE(field, name, type)                                                              \
  {                                                                                                \
    void *p_ = driver_proc(#name, CU_GET_PROC_ADDRESS_LEGACY_STREAM);                              \
    memcpy(&R.field, &p_, sizeof p_);                                                              \
  }
  RT_DRIVER_FNS(RT_RESOLVE)
#undef RT_RESOLVE
#define RT_RESOLVE_PT(field, name, type)                                                           \
  {                                                                                                \
    void *p_ = driver_proc(#name, CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM);                  \
    memcpy(&R.field, &p_, sizeof p_);                                                              \
  }
  RT_DRIVER_PTSZ_FNS(RT_RESOLVE_PT)
#undef RT_RESOLVE_PT
  if (!R.init || !R.device_count) {
    fprintf(stderr, "wltest-cudart: the driver gave no cuInit or cuDeviceGetCount\n");
    return;
  }
  CUresult rc = R.init(0);
  if (rc == CUDA_SUCCESS) rc = R.device_count(&rt.ndev);
  if (rc != CUDA_SUCCESS) {
    rt.init_err = rc == CUDA_ERROR_NO_DEVICE ? cudaErrorNoDevice : cudaErrorInitializationError;
    return;
  }
  if (rt.ndev > (int)(sizeof rt.primary / sizeof rt.primary[0]))
    rt.ndev = (int)(sizeof rt.primary / sizeof rt.primary[0]);
  rt.init_err = rt.ndev > 0 ? cudaSuccess : cudaErrorNoDevice;
}

cudaError_t rt_enter_noctx(void) {
  pthread_once(&rt.once, rt_init_once);
  return rt.init_err;
}

/* The context a runtime call works in, as the real runtime picks it: the one current on the
 * calling thread, whoever made it current (the program with cuCtxSetCurrent or cuCtxCreate too:
 * its device becomes the thread's current device); with none current (or only ours from before a
 * reset), the primary context of the thread's current device, retained and made current. With
 * set_primary (cudaSetDevice), that primary context whatever is current. */
static cudaError_t enter(bool set_primary) {
  cudaError_t e = rt_enter_noctx();
  if (e != cudaSuccess) return rt_ret(e);
  unsigned now = atomic_load_explicit(&rt.gen, memory_order_acquire);
  CUcontext cur = NULL;
  if (!set_primary && R.ctx_get && R.ctx_get(&cur) == CUDA_SUCCESS && cur) {
    /* The common case, without the lock: the context this thread used last, no reset since. */
    if (cur == tl_ctx && tl_ctx_gen == now) return cudaSuccess;
    CUdevice d;
    if (cur != tl_ctx && R.ctx_device && R.ctx_device(&d, cur) == CUDA_SUCCESS && d >= 0 &&
        d < rt.ndev) {
      tl_device = d;
      tl_ctx = cur;
      tl_ctx_dev = d;
      tl_ctx_gen = now;
      return cudaSuccess;
    }
  }
  int dev = tl_device;
  pthread_mutex_lock(&rt.lock);
  CUresult rc = CUDA_SUCCESS;
  if (!rt.primary[dev]) {
    CUdevice d;
    rc = R.device_get(&d, dev);
    if (rc == CUDA_SUCCESS) rc = R.primary_retain(&rt.primary[dev], d);
  }
  CUcontext ctx = rt.primary[dev];
  unsigned gen = atomic_load_explicit(&rt.gen, memory_order_relaxed);
  pthread_mutex_unlock(&rt.lock);
  if (rc != CUDA_SUCCESS) return rt_drv(rc);
  /* After a reset the handle may be the same, but it was retained again: set it anyway. */
  if (cur != ctx || tl_ctx != ctx || tl_ctx_gen != gen) {
    rc = R.ctx_set(ctx);
    if (rc != CUDA_SUCCESS) return rt_drv(rc);
  }
  tl_ctx = ctx;
  tl_ctx_dev = dev;
  tl_ctx_gen = gen;
  return cudaSuccess;
}

cudaError_t rt_enter(void) {
  return enter(false);
}

int rt_device(void) {
  return tl_device;
}

/* ---- devices ---------------------------------------------------------------------------------*/

cudaError_t CUDARTAPI cudaGetDeviceCount(int *count) {
  if (!count) return rt_ret(cudaErrorInvalidValue);
  cudaError_t e = rt_enter_noctx();
  *count = e == cudaSuccess ? rt.ndev : 0;
  return rt_ret(e);
}

cudaError_t CUDARTAPI cudaSetDevice(int device) {
  cudaError_t e = rt_enter_noctx();
  if (e != cudaSuccess) return rt_ret(e);
  if (device < 0 || device >= rt.ndev) return rt_ret(cudaErrorInvalidDevice);
  tl_device = device;
  return enter(true);
}

cudaError_t CUDARTAPI cudaGetDevice(int *device) {
  if (!device) return rt_ret(cudaErrorInvalidValue);
  cudaError_t e = rt_enter_noctx();
  if (e != cudaSuccess) return rt_ret(e);
  /* The current context's device, when one is current (the program's included). */
  CUcontext cur = NULL;
  CUdevice d;
  if (R.ctx_get && R.ctx_get(&cur) == CUDA_SUCCESS && cur && R.ctx_device &&
      R.ctx_device(&d, cur) == CUDA_SUCCESS && d >= 0 && d < rt.ndev)
    tl_device = d;
  *device = tl_device;
  return cudaSuccess;
}

cudaError_t CUDARTAPI cudaDriverGetVersion(int *driverVersion) {
  if (!driverVersion) return rt_ret(cudaErrorInvalidValue);
  cudaError_t e = rt_enter_noctx();
  if (e != cudaSuccess && e != cudaErrorNoDevice) {
    *driverVersion = 0;
    return cudaSuccess;
  }
  return RT_CALL(driver_version, driverVersion);
}

cudaError_t CUDARTAPI cudaRuntimeGetVersion(int *runtimeVersion) {
  if (!runtimeVersion) return rt_ret(cudaErrorInvalidValue);
  *runtimeVersion = CUDART_VERSION;
  return cudaSuccess;
}

cudaError_t CUDARTAPI cudaDeviceGetAttribute(int *value, enum cudaDeviceAttr attr, int device) {
  if (!value) return rt_ret(cudaErrorInvalidValue);
  cudaError_t e = rt_enter_noctx();
  if (e != cudaSuccess) return rt_ret(e);
  if (device < 0 || device >= rt.ndev) return rt_ret(cudaErrorInvalidDevice);
  /* The runtime's attribute numbers are the driver's. */
  return RT_CALL(device_attr, value, (CUdevice_attribute)attr, device);
}

cudaError_t CUDARTAPI cudaGetDeviceProperties(struct cudaDeviceProp *prop, int device) {
  if (!prop) return rt_ret(cudaErrorInvalidValue);
  cudaError_t e = rt_enter_noctx();
  if (e != cudaSuccess) return rt_ret(e);
  if (device < 0 || device >= rt.ndev) return rt_ret(cudaErrorInvalidDevice);
  memset(prop, 0, sizeof *prop);
  CUresult rc = R.device_name(prop->name, (int)sizeof prop->name, device);
  if (rc == CUDA_SUCCESS) rc = R.device_uuid((CUuuid *)&prop->uuid, device);
  if (rc == CUDA_SUCCESS) rc = R.device_mem(&prop->totalGlobalMem, device);
  if (rc != CUDA_SUCCESS) return rt_drv(rc);
  /* Only what the driver models; the rest stays 0. */
  struct {
    int *field;
    CUdevice_attribute attr;
  } ints[] = {
      {&prop->warpSize, CU_DEVICE_ATTRIBUTE_WARP_SIZE},
      {&prop->maxThreadsPerBlock, CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_BLOCK},
      {&prop->maxThreadsDim[0], CU_DEVICE_ATTRIBUTE_MAX_BLOCK_DIM_X},
      {&prop->maxThreadsDim[1], CU_DEVICE_ATTRIBUTE_MAX_BLOCK_DIM_Y},
      {&prop->maxThreadsDim[2], CU_DEVICE_ATTRIBUTE_MAX_BLOCK_DIM_Z},
      {&prop->maxGridSize[0], CU_DEVICE_ATTRIBUTE_MAX_GRID_DIM_X},
      {&prop->maxGridSize[1], CU_DEVICE_ATTRIBUTE_MAX_GRID_DIM_Y},
      {&prop->maxGridSize[2], CU_DEVICE_ATTRIBUTE_MAX_GRID_DIM_Z},
      {&prop->regsPerBlock, CU_DEVICE_ATTRIBUTE_MAX_REGISTERS_PER_BLOCK},
      {&prop->major, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR},
      {&prop->minor, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR},
      {&prop->multiProcessorCount, CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT},
      {&prop->l2CacheSize, CU_DEVICE_ATTRIBUTE_L2_CACHE_SIZE},
      {&prop->maxThreadsPerMultiProcessor, CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_MULTIPROCESSOR},
      {&prop->maxBlocksPerMultiProcessor, CU_DEVICE_ATTRIBUTE_MAX_BLOCKS_PER_MULTIPROCESSOR},
      {&prop->regsPerMultiprocessor, CU_DEVICE_ATTRIBUTE_MAX_REGISTERS_PER_MULTIPROCESSOR},
      {&prop->pciBusID, CU_DEVICE_ATTRIBUTE_PCI_BUS_ID},
      {&prop->concurrentKernels, CU_DEVICE_ATTRIBUTE_CONCURRENT_KERNELS},
      {&prop->asyncEngineCount, CU_DEVICE_ATTRIBUTE_ASYNC_ENGINE_COUNT},
      {&prop->unifiedAddressing, CU_DEVICE_ATTRIBUTE_UNIFIED_ADDRESSING},
      {&prop->memoryBusWidth, CU_DEVICE_ATTRIBUTE_GLOBAL_MEMORY_BUS_WIDTH},
      {&prop->canMapHostMemory, CU_DEVICE_ATTRIBUTE_CAN_MAP_HOST_MEMORY},
      {&prop->cooperativeLaunch, CU_DEVICE_ATTRIBUTE_COOPERATIVE_LAUNCH},
      {&prop->memoryPoolsSupported, CU_DEVICE_ATTRIBUTE_MEMORY_POOLS_SUPPORTED},
  };
  for (size_t i = 0; i < sizeof ints / sizeof ints[0]; i++) {
    rc = R.device_attr(ints[i].field, ints[i].attr, device);
    if (rc != CUDA_SUCCESS) return rt_drv(rc);
  }
  int v;
  if (R.device_attr(&v, CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK, device) == CUDA_SUCCESS)
    prop->sharedMemPerBlock = (size_t)v;
  if (R.device_attr(&v, CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN, device) ==
      CUDA_SUCCESS)
    prop->sharedMemPerBlockOptin = (size_t)v;
  if (R.device_attr(&v, CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_MULTIPROCESSOR, device) ==
      CUDA_SUCCESS)
    prop->sharedMemPerMultiprocessor = (size_t)v;
  if (R.device_attr(&v, CU_DEVICE_ATTRIBUTE_TOTAL_CONSTANT_MEMORY, device) == CUDA_SUCCESS)
    prop->totalConstMem = (size_t)v;
  return cudaSuccess;
}

/* The calling thread's device: the driver resets its primary context (memory goes, but for
 * stream-ordered memory; streams, events and executable graphs go), then the runtime gives back
 * its own retain and forgets the context, so that its next call on the device retains it again
 * and makes it current in every thread, as a first initialisation does. Registered kernels stay
 * (their libraries belong to no context). */
cudaError_t CUDARTAPI cudaDeviceReset(void) {
  cudaError_t e = rt_enter_noctx();
  if (e != cudaSuccess) return rt_ret(e);
  if (!R.primary_reset || !R.primary_release)
    return rt_ret(rt_missing(R.primary_reset ? "primary_release" : "primary_reset"));
  int dev = tl_device;
  pthread_mutex_lock(&rt.lock);
  CUdevice d;
  CUresult rc = R.device_get(&d, dev);
  if (rc == CUDA_SUCCESS) rc = R.primary_reset(d);
  if (rc == CUDA_SUCCESS && rt.primary[dev]) {
    rc = R.primary_release(d);
    if (rc == CUDA_SUCCESS) rt.primary[dev] = NULL;
  }
  if (rc == CUDA_SUCCESS) atomic_fetch_add_explicit(&rt.gen, 1, memory_order_release);
  pthread_mutex_unlock(&rt.lock);
  return rt_drv(rc);
}

cudaError_t CUDARTAPI cudaDeviceSynchronize(void) {
  cudaError_t e = rt_enter();
  if (e != cudaSuccess) return e;
  return RT_CALL(ctx_sync, NULL);
}

/* ---- driver entry points ---------------------------------------------------------------------*/

static cudaError_t entry_point(const char *symbol, void **funcPtr, unsigned version,
                               unsigned long long flags,
                               enum cudaDriverEntryPointQueryResult *status, bool per_thread) {
  if (!symbol || !funcPtr) return rt_ret(cudaErrorInvalidValue);
  cudaError_t e = rt_enter_noctx();
  if (e != cudaSuccess) return rt_ret(e);
  if (flags & ~(unsigned long long)(cudaEnableLegacyStream | cudaEnablePerThreadDefaultStream))
    return rt_ret(cudaErrorInvalidValue);
  cuuint64_t f = flags;
  if (flags == cudaEnableDefault)
    f = per_thread ? CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM
                   : CU_GET_PROC_ADDRESS_LEGACY_STREAM;
  CUdriverProcAddressQueryResult st = CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND;
  CUresult rc = R.get_proc(symbol, funcPtr, (int)version, f, &st);
  if (status)
    *status = st == CU_GET_PROC_ADDRESS_SUCCESS ? cudaDriverEntryPointSuccess
              : st == CU_GET_PROC_ADDRESS_VERSION_NOT_SUFFICIENT
                  ? cudaDriverEntryPointVersionNotSufficent
                  : cudaDriverEntryPointSymbolNotFound;
  return rt_drv(rc);
}

RT_EXPORT cudaError_t CUDARTAPI
cudaGetDriverEntryPoint_ptsz(const char *symbol, void **funcPtr, unsigned long long flags,
                             enum cudaDriverEntryPointQueryResult *driverStatus);
RT_EXPORT cudaError_t CUDARTAPI cudaGetDriverEntryPointByVersion_ptsz(
    const char *symbol, void **funcPtr, unsigned int cudaVersion, unsigned long long flags,
    enum cudaDriverEntryPointQueryResult *driverStatus);

cudaError_t CUDARTAPI cudaGetDriverEntryPoint(const char *symbol, void **funcPtr,
                                              unsigned long long flags,
                                              enum cudaDriverEntryPointQueryResult *driverStatus) {
  return entry_point(symbol, funcPtr, CUDART_VERSION, flags, driverStatus, false);
}

cudaError_t CUDARTAPI
cudaGetDriverEntryPoint_ptsz(const char *symbol, void **funcPtr, unsigned long long flags,
                             enum cudaDriverEntryPointQueryResult *driverStatus) {
  return entry_point(symbol, funcPtr, CUDART_VERSION, flags, driverStatus, true);
}

cudaError_t CUDARTAPI cudaGetDriverEntryPointByVersion(
    const char *symbol, void **funcPtr, unsigned int cudaVersion, unsigned long long flags,
    enum cudaDriverEntryPointQueryResult *driverStatus) {
  return entry_point(symbol, funcPtr, cudaVersion, flags, driverStatus, false);
}

cudaError_t CUDARTAPI cudaGetDriverEntryPointByVersion_ptsz(
    const char *symbol, void **funcPtr, unsigned int cudaVersion, unsigned long long flags,
    enum cudaDriverEntryPointQueryResult *driverStatus) {
  return entry_point(symbol, funcPtr, cudaVersion, flags, driverStatus, true);
}

/* ---- fat binaries and kernels ----------------------------------------------------------------*/

/* What nvcc's generated code registers: a fat binary (loaded as a library on first use) and the
 * kernels in it, each known by the address of its host stub. */
typedef struct rt_fatbin_s {
  void *handle; /* first: the void ** handed back is the address of this struct */
  const void *image;
  CUlibrary lib;
  struct rt_fatbin_s *next;
} rt_fatbin_t;

typedef struct rt_func_s {
  const void *host;
  rt_fatbin_t *fb;
  CUkernel kernel;
  struct rt_func_s *next;
  char name[];
} rt_func_t;

RT_EXPORT void **CUDARTAPI __cudaRegisterFatBinary(void *fatCubin);
RT_EXPORT void CUDARTAPI __cudaRegisterFatBinaryEnd(void **fatCubinHandle);
RT_EXPORT void CUDARTAPI __cudaUnregisterFatBinary(void **fatCubinHandle);
RT_EXPORT void CUDARTAPI __cudaRegisterFunction(void **fatCubinHandle, const char *hostFun,
                                                char *deviceFun, const char *deviceName,
                                                int thread_limit, uint3 *tid, uint3 *bid,
                                                dim3 *bDim, dim3 *gDim, int *wSize);
RT_EXPORT void CUDARTAPI __cudaRegisterVar(void **fatCubinHandle, char *hostVar,
                                           char *deviceAddress, const char *deviceName, int ext,
                                           size_t size, int constant, int global);
RT_EXPORT char CUDARTAPI __cudaInitModule(void **fatCubinHandle);
RT_EXPORT unsigned CUDARTAPI __cudaPushCallConfiguration(dim3 gridDim, dim3 blockDim,
                                                         size_t sharedMem,
                                                         struct CUstream_st *stream);
RT_EXPORT cudaError_t CUDARTAPI __cudaPopCallConfiguration(dim3 *gridDim, dim3 *blockDim,
                                                           size_t *sharedMem, void *stream);
RT_EXPORT cudaError_t CUDARTAPI __cudaGetKernel(cudaKernel_t *kernel, const void *hostFun);
RT_EXPORT cudaError_t CUDARTAPI __cudaLaunchKernel(cudaKernel_t kernel, dim3 gridDim, dim3 blockDim,
                                                   void **args, size_t sharedMem,
                                                   cudaStream_t stream);
RT_EXPORT cudaError_t CUDARTAPI __cudaLaunchKernel_ptsz(cudaKernel_t kernel, dim3 gridDim,
                                                        dim3 blockDim, void **args,
                                                        size_t sharedMem, cudaStream_t stream);

void **CUDARTAPI __cudaRegisterFatBinary(void *fatCubin) {
  const __fatBinC_Wrapper_t *w = fatCubin;
  rt_fatbin_t *fb = calloc(1, sizeof *fb);
  if (!fb) abort(); /* as the real one: nothing sensible to return */
  fb->image = (w && w->magic == FATBINC_MAGIC) ? (const void *)w->data : fatCubin;
  pthread_mutex_lock(&rt.lock);
  fb->next = rt.fatbins;
  rt.fatbins = fb;
  pthread_mutex_unlock(&rt.lock);
  return &fb->handle;
}

void CUDARTAPI __cudaRegisterFatBinaryEnd(void **fatCubinHandle) {
  (void)fatCubinHandle; /* loaded lazily, at the first use of one of its kernels */
}

void CUDARTAPI __cudaUnregisterFatBinary(void **fatCubinHandle) {
  rt_fatbin_t *fb = (rt_fatbin_t *)(void *)fatCubinHandle;
  pthread_mutex_lock(&rt.lock);
  for (rt_fatbin_t **pp = &rt.fatbins; *pp; pp = &(*pp)->next)
    if (*pp == fb) {
      *pp = fb->next;
      break;
    }
  for (rt_func_t **pp = &rt.funcs; *pp;) {
    rt_func_t *f = *pp;
    if (f->fb != fb) {
      pp = &f->next;
      continue;
    }
    *pp = f->next;
    free(f);
  }
  pthread_mutex_unlock(&rt.lock);
  if (fb->lib && R.lib_unload) R.lib_unload(fb->lib);
  free(fb);
}

void CUDARTAPI __cudaRegisterFunction(void **fatCubinHandle, const char *hostFun, char *deviceFun,
                                      const char *deviceName, int thread_limit, uint3 *tid,
                                      uint3 *bid, dim3 *bDim, dim3 *gDim, int *wSize) {
  (void)deviceFun, (void)thread_limit, (void)tid, (void)bid, (void)bDim, (void)gDim, (void)wSize;
  size_t n = strlen(deviceName);
  rt_func_t *f = calloc(1, sizeof *f + n + 1);
  if (!f) abort();
  f->host = hostFun;
  f->fb = (rt_fatbin_t *)(void *)fatCubinHandle;
  memcpy(f->name, deviceName, n + 1);
  pthread_mutex_lock(&rt.lock);
  f->next = rt.funcs;
  rt.funcs = f;
  pthread_mutex_unlock(&rt.lock);
}

void CUDARTAPI __cudaRegisterVar(void **fatCubinHandle, char *hostVar, char *deviceAddress,
                                 const char *deviceName, int ext, size_t size, int constant,
                                 int global) {
  /* Device variables are not modelled: a program that touches one gets an error then. */
  (void)fatCubinHandle, (void)hostVar, (void)deviceAddress, (void)deviceName, (void)ext, (void)size,
      (void)constant, (void)global;
}

char CUDARTAPI __cudaInitModule(void **fatCubinHandle) {
  (void)fatCubinHandle;
  return 1;
}

CUkernel rt_kernel(const void *host_fn, cudaError_t *err) {
  *err = rt_enter();
  if (*err != cudaSuccess) return NULL;
  pthread_mutex_lock(&rt.lock);
  rt_func_t *f = rt.funcs;
  while (f && f->host != host_fn) f = f->next;
  CUresult rc = CUDA_SUCCESS;
  if (f && !f->kernel) {
    if (!f->fb->lib) rc = R.lib_load(&f->fb->lib, f->fb->image, NULL, NULL, 0, NULL, NULL, 0);
    if (rc == CUDA_SUCCESS) rc = R.lib_kernel(&f->kernel, f->fb->lib, f->name);
  }
  CUkernel k = f ? f->kernel : NULL;
  pthread_mutex_unlock(&rt.lock);
  if (!f)
    *err = rt_ret(cudaErrorInvalidDeviceFunction);
  else if (rc != CUDA_SUCCESS)
    *err = rt_drv(rc);
  return *err == cudaSuccess ? k : NULL;
}

/* The <<<>>> configuration: a per-thread stack, as launches can nest through argument
 * evaluation. */
typedef struct rt_config_s {
  dim3 grid, block;
  size_t shared;
  struct CUstream_st *stream;
} rt_config_t;
static _Thread_local rt_config_t tl_configs[16];
static _Thread_local int tl_nconfigs;

unsigned CUDARTAPI __cudaPushCallConfiguration(dim3 gridDim, dim3 blockDim, size_t sharedMem,
                                               struct CUstream_st *stream) {
  if (tl_nconfigs == (int)(sizeof tl_configs / sizeof tl_configs[0])) return 1;
  tl_configs[tl_nconfigs++] = (rt_config_t){gridDim, blockDim, sharedMem, stream};
  return 0;
}

cudaError_t CUDARTAPI __cudaPopCallConfiguration(dim3 *gridDim, dim3 *blockDim, size_t *sharedMem,
                                                 void *stream) {
  if (tl_nconfigs == 0) return rt_ret(cudaErrorMissingConfiguration);
  rt_config_t *c = &tl_configs[--tl_nconfigs];
  *gridDim = c->grid;
  *blockDim = c->block;
  *sharedMem = c->shared;
  memcpy(stream, &c->stream, sizeof c->stream);
  return cudaSuccess;
}

cudaError_t CUDARTAPI __cudaGetKernel(cudaKernel_t *kernel, const void *hostFun) {
  if (!kernel) return rt_ret(cudaErrorInvalidValue);
  cudaError_t e;
  *kernel = (cudaKernel_t)rt_kernel(hostFun, &e);
  return e;
}

/* The registered device name of a kernel (mangled for C++ kernels, as CUDA's). */
cudaError_t CUDARTAPI cudaFuncGetName(const char **name, const void *func) {
  if (!name || !func) return rt_ret(cudaErrorInvalidValue);
  cudaError_t e = rt_enter();
  if (e != cudaSuccess) return e;
  pthread_mutex_lock(&rt.lock);
  rt_func_t *f = rt.funcs;
  while (f && f->host != func) f = f->next;
  if (f) *name = f->name;
  pthread_mutex_unlock(&rt.lock);
  return f ? cudaSuccess : rt_ret(cudaErrorInvalidDeviceFunction);
}

/* Every launch goes to the driver's cuLaunchKernel*, with the kernel as a CUfunction (CUDA
 * allows a CUkernel there), so that a driver-level interposer sees it. */
static cudaError_t launch(CUkernel k, dim3 g, dim3 b, void **args, size_t shared, cudaStream_t s,
                          bool per_thread, bool coop) {
  cudaError_t e = rt_enter();
  if (e != cudaSuccess) return e;
  if (!k) return rt_ret(cudaErrorInvalidDeviceFunction);
  if (shared > UINT32_MAX) return rt_ret(cudaErrorInvalidValue);
  CUfunction f = (CUfunction)(void *)k;
  CUstream cs = (CUstream)s;
  if (coop)
    return per_thread
               ? RT_CALL(launch_coop_pt, f, g.x, g.y, g.z, b.x, b.y, b.z, (unsigned)shared, cs,
                         args)
               : RT_CALL(launch_coop, f, g.x, g.y, g.z, b.x, b.y, b.z, (unsigned)shared, cs, args);
  cudaError_t r =
      per_thread
          ? RT_CALL(launch_pt, f, g.x, g.y, g.z, b.x, b.y, b.z, (unsigned)shared, cs, args, NULL)
          : RT_CALL(launch, f, g.x, g.y, g.z, b.x, b.y, b.z, (unsigned)shared, cs, args, NULL);
  /* A bad configuration is the runtime's own error. */
  return r == cudaErrorInvalidValue ? rt_ret(cudaErrorInvalidConfiguration) : r;
}

cudaError_t CUDARTAPI __cudaLaunchKernel(cudaKernel_t kernel, dim3 gridDim, dim3 blockDim,
                                         void **args, size_t sharedMem, cudaStream_t stream) {
  return launch((CUkernel)kernel, gridDim, blockDim, args, sharedMem, stream, false, false);
}

cudaError_t CUDARTAPI __cudaLaunchKernel_ptsz(cudaKernel_t kernel, dim3 gridDim, dim3 blockDim,
                                              void **args, size_t sharedMem, cudaStream_t stream) {
  return launch((CUkernel)kernel, gridDim, blockDim, args, sharedMem, stream, true, false);
}

RT_EXPORT cudaError_t CUDARTAPI cudaLaunchKernel_ptsz(const void *func, dim3 gridDim, dim3 blockDim,
                                                      void **args, size_t sharedMem,
                                                      cudaStream_t stream);
RT_EXPORT cudaError_t CUDARTAPI cudaLaunchCooperativeKernel_ptsz(const void *func, dim3 gridDim,
                                                                 dim3 blockDim, void **args,
                                                                 size_t sharedMem,
                                                                 cudaStream_t stream);
RT_EXPORT cudaError_t CUDARTAPI cudaLaunchKernelExC_ptsz(const cudaLaunchConfig_t *config,
                                                         const void *func, void **args);

cudaError_t CUDARTAPI cudaLaunchKernel(const void *func, dim3 gridDim, dim3 blockDim, void **args,
                                       size_t sharedMem, cudaStream_t stream) {
  cudaError_t e;
  CUkernel k = rt_kernel(func, &e);
  if (!k) return e;
  return launch(k, gridDim, blockDim, args, sharedMem, stream, false, false);
}

cudaError_t CUDARTAPI cudaLaunchKernel_ptsz(const void *func, dim3 gridDim, dim3 blockDim,
                                            void **args, size_t sharedMem, cudaStream_t stream) {
  cudaError_t e;
  CUkernel k = rt_kernel(func, &e);
  if (!k) return e;
  return launch(k, gridDim, blockDim, args, sharedMem, stream, true, false);
}

cudaError_t CUDARTAPI cudaLaunchCooperativeKernel(const void *func, dim3 gridDim, dim3 blockDim,
                                                  void **args, size_t sharedMem,
                                                  cudaStream_t stream) {
  cudaError_t e;
  CUkernel k = rt_kernel(func, &e);
  if (!k) return e;
  return launch(k, gridDim, blockDim, args, sharedMem, stream, false, true);
}

cudaError_t CUDARTAPI cudaLaunchCooperativeKernel_ptsz(const void *func, dim3 gridDim,
                                                       dim3 blockDim, void **args, size_t sharedMem,
                                                       cudaStream_t stream) {
  cudaError_t e;
  CUkernel k = rt_kernel(func, &e);
  if (!k) return e;
  return launch(k, gridDim, blockDim, args, sharedMem, stream, true, true);
}

static cudaError_t launch_ex(const cudaLaunchConfig_t *config, const void *func, void **args,
                             bool per_thread) {
  if (!config) return rt_ret(cudaErrorInvalidValue);
  cudaError_t e;
  CUkernel k = rt_kernel(func, &e);
  if (!k) return e;
  if (config->dynamicSmemBytes > UINT32_MAX) return rt_ret(cudaErrorInvalidValue);
  /* The attribute arrays have the same layout; the ids are the driver's. */
  CUlaunchConfig c = {
      .gridDimX = config->gridDim.x,
      .gridDimY = config->gridDim.y,
      .gridDimZ = config->gridDim.z,
      .blockDimX = config->blockDim.x,
      .blockDimY = config->blockDim.y,
      .blockDimZ = config->blockDim.z,
      .sharedMemBytes = (unsigned)config->dynamicSmemBytes,
      .hStream = (CUstream)config->stream,
      .attrs = (CUlaunchAttribute *)(void *)config->attrs,
      .numAttrs = config->numAttrs,
  };
  CUfunction f = (CUfunction)(void *)k;
  return per_thread ? RT_CALL(launch_ex_pt, &c, f, args, NULL)
                    : RT_CALL(launch_ex, &c, f, args, NULL);
}

cudaError_t CUDARTAPI cudaLaunchKernelExC(const cudaLaunchConfig_t *config, const void *func,
                                          void **args) {
  return launch_ex(config, func, args, false);
}

cudaError_t CUDARTAPI cudaLaunchKernelExC_ptsz(const cudaLaunchConfig_t *config, const void *func,
                                               void **args) {
  return launch_ex(config, func, args, true);
}
