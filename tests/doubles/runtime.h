/* The CUDA runtime double's internals: the driver entry points it resolves through
 * cuGetProcAddress, its per-thread state and the error discipline every entry point follows. */
#ifndef WAVELET_TESTS_DOUBLES_RUNTIME_H
#define WAVELET_TESTS_DOUBLES_RUNTIME_H

/* The library is built with hidden visibility; what the real headers declare is its ABI. */
#pragma GCC visibility push(default)
#include <cuda.h>
#include <cudaTypedefs.h>
#include <cuda_runtime_api.h>
#pragma GCC visibility pop

#include <stdbool.h>
#include <stddef.h>

/* Every driver entry point the runtime uses: its field, the base name it asks cuGetProcAddress
 * for, and the PFN typedef of the variant it expects at CUDART_VERSION. */
#define RT_DRIVER_FNS(X)                                                                           \
  X(init, cuInit, PFN_cuInit_v2000)                                                                \
  X(driver_version, cuDriverGetVersion, PFN_cuDriverGetVersion_v2020)                              \
  X(device_count, cuDeviceGetCount, PFN_cuDeviceGetCount_v2000)                                    \
  X(device_get, cuDeviceGet, PFN_cuDeviceGet_v2000)                                                \
  X(device_attr, cuDeviceGetAttribute, PFN_cuDeviceGetAttribute_v2000)                             \
  X(device_name, cuDeviceGetName, PFN_cuDeviceGetName_v2000)                                       \
  X(device_mem, cuDeviceTotalMem, PFN_cuDeviceTotalMem_v3020)                                      \
  X(device_uuid, cuDeviceGetUuid, PFN_cuDeviceGetUuid_v11040)                                      \
  X(primary_retain, cuDevicePrimaryCtxRetain, PFN_cuDevicePrimaryCtxRetain_v7000)                  \
  X(primary_release, cuDevicePrimaryCtxRelease, PFN_cuDevicePrimaryCtxRelease_v11000)              \
  X(primary_reset, cuDevicePrimaryCtxReset, PFN_cuDevicePrimaryCtxReset_v11000)                    \
  X(ctx_set, cuCtxSetCurrent, PFN_cuCtxSetCurrent_v4000)                                           \
  X(ctx_get, cuCtxGetCurrent, PFN_cuCtxGetCurrent_v4000)                                           \
  X(ctx_device, cuCtxGetDevice, PFN_cuCtxGetDevice_v13000)                                         \
  X(ctx_sync, cuCtxSynchronize, PFN_cuCtxSynchronize_v13000)                                       \
  X(mem_alloc, cuMemAlloc, PFN_cuMemAlloc_v3020)                                                   \
  X(mem_free, cuMemFree, PFN_cuMemFree_v3020)                                                      \
  X(mem_info, cuMemGetInfo, PFN_cuMemGetInfo_v3020)                                                \
  X(ipc_get, cuIpcGetMemHandle, PFN_cuIpcGetMemHandle_v4010)                                       \
  X(ipc_open, cuIpcOpenMemHandle, PFN_cuIpcOpenMemHandle_v11000)                                   \
  X(ipc_close, cuIpcCloseMemHandle, PFN_cuIpcCloseMemHandle_v4010)                                 \
  X(host_alloc_v2, cuMemAllocHost, PFN_cuMemAllocHost_v3020)                                       \
  X(host_alloc, cuMemHostAlloc, PFN_cuMemHostAlloc_v2020)                                          \
  X(host_free, cuMemFreeHost, PFN_cuMemFreeHost_v2000)                                             \
  X(alloc_async, cuMemAllocAsync, PFN_cuMemAllocAsync_v11020)                                      \
  X(free_async, cuMemFreeAsync, PFN_cuMemFreeAsync_v11020)                                         \
  X(alloc_pool, cuMemAllocFromPoolAsync, PFN_cuMemAllocFromPoolAsync_v11020)                       \
  X(default_pool, cuDeviceGetDefaultMemPool, PFN_cuDeviceGetDefaultMemPool_v11020)                 \
  X(device_pool, cuDeviceGetMemPool, PFN_cuDeviceGetMemPool_v11020)                                \
  X(pool_set, cuMemPoolSetAttribute, PFN_cuMemPoolSetAttribute_v11020)                             \
  X(pool_get, cuMemPoolGetAttribute, PFN_cuMemPoolGetAttribute_v11020)                             \
  X(pool_trim, cuMemPoolTrimTo, PFN_cuMemPoolTrimTo_v11020)                                        \
  X(memcpy, cuMemcpy, PFN_cuMemcpy_v4000)                                                          \
  X(memcpy_async, cuMemcpyAsync, PFN_cuMemcpyAsync_v4000)                                          \
  X(memset, cuMemsetD8, PFN_cuMemsetD8_v3020)                                                      \
  X(memset_async, cuMemsetD8Async, PFN_cuMemsetD8Async_v3020)                                      \
  X(lib_load, cuLibraryLoadData, PFN_cuLibraryLoadData_v12000)                                     \
  X(lib_kernel, cuLibraryGetKernel, PFN_cuLibraryGetKernel_v12000)                                 \
  X(lib_unload, cuLibraryUnload, PFN_cuLibraryUnload_v12000)                                       \
  X(launch, cuLaunchKernel, PFN_cuLaunchKernel_v4000)                                              \
  X(launch_ex, cuLaunchKernelEx, PFN_cuLaunchKernelEx_v11060)                                      \
  X(launch_coop, cuLaunchCooperativeKernel, PFN_cuLaunchCooperativeKernel_v9000)                   \
  X(stream_create, cuStreamCreate, PFN_cuStreamCreate_v2000)                                       \
  X(stream_destroy, cuStreamDestroy, PFN_cuStreamDestroy_v4000)                                    \
  X(stream_query, cuStreamQuery, PFN_cuStreamQuery_v2000)                                          \
  X(stream_sync, cuStreamSynchronize, PFN_cuStreamSynchronize_v2000)                               \
  X(stream_wait, cuStreamWaitEvent, PFN_cuStreamWaitEvent_v3020)                                   \
  X(event_create, cuEventCreate, PFN_cuEventCreate_v2000)                                          \
  X(event_record, cuEventRecord, PFN_cuEventRecord_v2000)                                          \
  X(event_query, cuEventQuery, PFN_cuEventQuery_v2000)                                             \
  X(event_sync, cuEventSynchronize, PFN_cuEventSynchronize_v2000)                                  \
  X(event_elapsed, cuEventElapsedTime, PFN_cuEventElapsedTime_v12080)                              \
  X(event_destroy, cuEventDestroy, PFN_cuEventDestroy_v4000)                                       \
  X(capture_begin, cuStreamBeginCapture, PFN_cuStreamBeginCapture_v10010)                          \
  X(capture_end, cuStreamEndCapture, PFN_cuStreamEndCapture_v10000)                                \
  X(capture_is, cuStreamIsCapturing, PFN_cuStreamIsCapturing_v10000)                               \
  X(capture_info, cuStreamGetCaptureInfo, PFN_cuStreamGetCaptureInfo_v12030)                       \
  X(capture_mode, cuThreadExchangeStreamCaptureMode, PFN_cuThreadExchangeStreamCaptureMode_v10010) \
  X(graph_instantiate, cuGraphInstantiateWithFlags, PFN_cuGraphInstantiateWithFlags_v11040)        \
  X(graph_launch, cuGraphLaunch, PFN_cuGraphLaunch_v10000)                                         \
  X(graph_exec_destroy, cuGraphExecDestroy, PFN_cuGraphExecDestroy_v10000)                         \
  X(graph_destroy, cuGraphDestroy, PFN_cuGraphDestroy_v10000)

/* The per-thread-default-stream variants, asked for with
 * CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM (for the runtime's _ptsz entry points). */
#define RT_DRIVER_PTSZ_FNS(X)                                                                      \
  X(launch_pt, cuLaunchKernel, PFN_cuLaunchKernel_v7000_ptsz)                                      \
  X(launch_ex_pt, cuLaunchKernelEx, PFN_cuLaunchKernelEx_v11060_ptsz)                              \
  X(launch_coop_pt, cuLaunchCooperativeKernel, PFN_cuLaunchCooperativeKernel_v9000_ptsz)           \
  X(alloc_async_pt, cuMemAllocAsync, PFN_cuMemAllocAsync_v11020_ptsz)                              \
  X(free_async_pt, cuMemFreeAsync, PFN_cuMemFreeAsync_v11020_ptsz)                                 \
  X(alloc_pool_pt, cuMemAllocFromPoolAsync, PFN_cuMemAllocFromPoolAsync_v11020_ptsz)               \
  X(graph_launch_pt, cuGraphLaunch, PFN_cuGraphLaunch_v10000_ptsz)

typedef struct rt_driver_s {
  PFN_cuGetProcAddress_v12000 get_proc;
#define RT_FIELD(field, name, type) type field;
  RT_DRIVER_FNS(RT_FIELD)
  RT_DRIVER_PTSZ_FNS(RT_FIELD)
#undef RT_FIELD
} rt_driver_t;

extern rt_driver_t rt__drv;
#define R rt__drv

/* Sets the calling thread's last error (cudaErrorNotReady is no error) and returns err. */
cudaError_t rt_ret(cudaError_t err);
/* The runtime's code for a driver result. */
cudaError_t rt_err(CUresult rc);
/* rt_ret(rt_err(rc)). */
cudaError_t rt_drv(CUresult rc);
/* Initialises the runtime once (driver loaded and initialised) and makes the calling thread's
 * device's primary context current. cudaSuccess or the error to return. */
cudaError_t rt_enter(void);
/* Initialises the driver only (device queries need no context). */
cudaError_t rt_enter_noctx(void);
/* The calling thread's device. */
int rt_device(void);
/* The kernel registered for a host stub (loaded on first use), or NULL (set error). */
CUkernel rt_kernel(const void *host_fn, cudaError_t *err);

/* The driver's stream handle for a runtime stream: the per-thread entry points map the default
 * stream to CU_STREAM_PER_THREAD. */
static inline CUstream rt_stream(cudaStream_t s, bool per_thread) {
  return (s == NULL && per_thread) ? CU_STREAM_PER_THREAD : (CUstream)s;
}

/* Calls a driver entry point resolved at init; one the driver did not give is
 * cudaErrorNotSupported (said once per call site). */
#define RT_CALL(fn, ...) (R.fn ? rt_drv(R.fn(__VA_ARGS__)) : rt_ret(rt_missing(#fn)))
cudaError_t rt_missing(const char *what);

/* Declares and defines an exported runtime entry point and its per-thread twin (NAME_ptsz or
 * NAME_ptds), both calling the static body NAME_impl(per_thread, args...). */
#define RT_TWIN(ret, name, suffix, params, args)                                                   \
  static ret name##_impl(bool per_thread, RT_UNPAREN params);                                      \
  __attribute__((visibility("default"))) ret CUDARTAPI name##suffix(RT_UNPAREN params);            \
  ret CUDARTAPI name params {                                                                      \
    return name##_impl(false, RT_UNPAREN args);                                                    \
  }                                                                                                \
  ret CUDARTAPI name##suffix params {                                                              \
    return name##_impl(true, RT_UNPAREN args);                                                     \
  }                                                                                                \
  static ret name##_impl(bool per_thread, RT_UNPAREN params)
#define RT_UNPAREN(...) __VA_ARGS__

#endif
