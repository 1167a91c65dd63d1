/* The CUDA driver double's test controls: statistics, stream holds and fault injection. Tests
 * find these with dlsym on the double (libcuda.so.1 under build/tests/doubles). */
#ifndef WAVELET_TESTS_WLTEST_CUDA_H
#define WAVELET_TESTS_WLTEST_CUDA_H

#include <cuda.h>
#include <stdint.h>

#include "wltest_twin.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Every driver entry point the double exports, by its exported (versioned) name. The list gives
 * the call counters their indices and fault injection its names. */
#define WLTEST_DRIVER_FNS(X)                                                                       \
  X(cuInit)                                                                                        \
  X(cuDriverGetVersion)                                                                            \
  X(cuGetErrorName)                                                                                \
  X(cuGetErrorString)                                                                              \
  X(cuGetProcAddress)                                                                              \
  X(cuGetProcAddress_v2)                                                                           \
  X(cuDeviceGet)                                                                                   \
  X(cuDeviceGetCount)                                                                              \
  X(cuDeviceTotalMem_v2)                                                                           \
  X(cuDeviceGetAttribute)                                                                          \
  X(cuDeviceGetName)                                                                               \
  X(cuDeviceGetUuid)                                                                               \
  X(cuDeviceGetUuid_v2)                                                                            \
  X(cuDeviceGetPCIBusId)                                                                           \
  X(cuDevicePrimaryCtxRetain)                                                                      \
  X(cuDevicePrimaryCtxRelease_v2)                                                                  \
  X(cuDevicePrimaryCtxGetState)                                                                    \
  X(cuDevicePrimaryCtxReset)                                                                       \
  X(cuDevicePrimaryCtxReset_v2)                                                                    \
  X(cuCtxGetCurrent)                                                                               \
  X(cuCtxSetCurrent)                                                                               \
  X(cuCtxGetDevice)                                                                                \
  X(cuCtxGetDevice_v2)                                                                             \
  X(cuCtxSynchronize)                                                                              \
  X(cuCtxSynchronize_v2)                                                                           \
  X(cuCtxCreate)                                                                                   \
  X(cuCtxCreate_v2)                                                                                \
  X(cuCtxCreate_v3)                                                                                \
  X(cuCtxCreate_v4)                                                                                \
  X(cuCtxDestroy)                                                                                  \
  X(cuCtxDestroy_v2)                                                                               \
  X(cuCtxPushCurrent)                                                                              \
  X(cuCtxPushCurrent_v2)                                                                           \
  X(cuCtxPopCurrent)                                                                               \
  X(cuCtxPopCurrent_v2)                                                                            \
  X(cuMemAllocPitch_v2)                                                                            \
  X(cuMemAllocManaged)                                                                             \
  X(cuMemGetAllocationGranularity)                                                                 \
  X(cuMemAddressReserve)                                                                           \
  X(cuMemAddressFree)                                                                              \
  X(cuMemCreate)                                                                                   \
  X(cuMemRelease)                                                                                  \
  X(cuMemRetainAllocationHandle)                                                                   \
  X(cuMemMap)                                                                                      \
  X(cuMemSetAccess)                                                                                \
  X(cuMemUnmap)                                                                                    \
  X(cuMemExportToShareableHandle)                                                                  \
  X(cuMemImportFromShareableHandle)                                                                \
  X(cuMemGetAllocationPropertiesFromHandle)                                                        \
  X(cuPointerGetAttribute)                                                                         \
  X(cuPointerGetAttributes)                                                                        \
  X(cuMemGetInfo)                                                                                  \
  X(cuMemGetInfo_v2)                                                                               \
  X(cuIpcGetMemHandle)                                                                             \
  X(cuIpcOpenMemHandle)                                                                            \
  X(cuIpcOpenMemHandle_v2)                                                                         \
  X(cuIpcCloseMemHandle)                                                                           \
  X(cuMemAlloc)                                                                                    \
  X(cuMemAlloc_v2)                                                                                 \
  X(cuMemFree)                                                                                     \
  X(cuMemFree_v2)                                                                                  \
  X(cuMemAllocHost)                                                                                \
  X(cuMemAllocHost_v2)                                                                             \
  X(cuMemHostAlloc)                                                                                \
  X(cuMemFreeHost)                                                                                 \
  X(cuMemHostGetFlags)                                                                             \
  X(cuMemAllocAsync)                                                                               \
  X(cuMemAllocAsync_ptsz)                                                                          \
  X(cuMemFreeAsync)                                                                                \
  X(cuMemFreeAsync_ptsz)                                                                           \
  X(cuMemAllocFromPoolAsync)                                                                       \
  X(cuMemAllocFromPoolAsync_ptsz)                                                                  \
  X(cuDeviceGetDefaultMemPool)                                                                     \
  X(cuDeviceGetMemPool)                                                                            \
  X(cuDeviceSetMemPool)                                                                            \
  X(cuMemPoolSetAccess)                                                                            \
  X(cuMemGetAccess)                                                                                \
  X(cuCtxEnablePeerAccess)                                                                         \
  X(cuCtxDisablePeerAccess)                                                                        \
  X(cuMemPoolCreate)                                                                               \
  X(cuMemPoolDestroy)                                                                              \
  X(cuMemPoolSetAttribute)                                                                         \
  X(cuMemPoolGetAttribute)                                                                         \
  X(cuMemPoolTrimTo)                                                                               \
  X(cuMemcpy)                                                                                      \
  X(cuMemcpyAsync)                                                                                 \
  X(cuMemcpyHtoD_v2)                                                                               \
  X(cuMemcpyDtoH_v2)                                                                               \
  X(cuMemcpyDtoD_v2)                                                                               \
  X(cuMemcpyHtoDAsync_v2)                                                                          \
  X(cuMemcpyDtoHAsync_v2)                                                                          \
  X(cuMemcpyDtoDAsync_v2)                                                                          \
  X(cuMemsetD8_v2)                                                                                 \
  X(cuMemsetD32_v2)                                                                                \
  X(cuMemsetD8Async)                                                                               \
  X(cuMemsetD32Async)                                                                              \
  X(cuModuleLoadData)                                                                              \
  X(cuModuleGetFunction)                                                                           \
  X(cuModuleUnload)                                                                                \
  X(cuFuncGetName)                                                                                 \
  X(cuKernelGetName)                                                                               \
  X(cuLibraryLoadData)                                                                             \
  X(cuLibraryGetKernel)                                                                            \
  X(cuLibraryUnload)                                                                               \
  X(cuLaunchKernel)                                                                                \
  X(cuLaunchKernel_ptsz)                                                                           \
  X(cuLaunchKernelEx)                                                                              \
  X(cuLaunchKernelEx_ptsz)                                                                         \
  X(cuLaunchCooperativeKernel)                                                                     \
  X(cuLaunchCooperativeKernel_ptsz)                                                                \
  X(cuLaunchCooperativeKernelMultiDevice)                                                          \
  X(cuFuncSetBlockShape)                                                                           \
  X(cuFuncSetSharedSize)                                                                           \
  X(cuParamSetSize)                                                                                \
  X(cuParamSeti)                                                                                   \
  X(cuParamSetf)                                                                                   \
  X(cuParamSetv)                                                                                   \
  X(cuLaunch)                                                                                      \
  X(cuLaunchGrid)                                                                                  \
  X(cuLaunchGridAsync)                                                                             \
  X(cuStreamCreate)                                                                                \
  X(cuStreamDestroy_v2)                                                                            \
  X(cuStreamQuery)                                                                                 \
  X(cuStreamSynchronize)                                                                           \
  X(cuStreamWaitEvent)                                                                             \
  X(cuStreamBeginCapture)                                                                          \
  X(cuStreamBeginCapture_ptsz)                                                                     \
  X(cuStreamBeginCapture_v2)                                                                       \
  X(cuStreamBeginCapture_v2_ptsz)                                                                  \
  X(cuStreamEndCapture)                                                                            \
  X(cuStreamEndCapture_ptsz)                                                                       \
  X(cuThreadExchangeStreamCaptureMode)                                                             \
  X(cuStreamIsCapturing)                                                                           \
  X(cuStreamGetDevice)                                                                             \
  X(cuStreamGetCtx)                                                                                \
  X(cuStreamGetCtx_ptsz)                                                                           \
  X(cuStreamGetCtx_v2)                                                                             \
  X(cuStreamGetCtx_v2_ptsz)                                                                        \
  X(cuStreamGetCaptureInfo_v3)                                                                     \
  X(cuEventCreate)                                                                                 \
  X(cuEventRecord)                                                                                 \
  X(cuEventQuery)                                                                                  \
  X(cuEventSynchronize)                                                                            \
  X(cuEventElapsedTime)                                                                            \
  X(cuEventElapsedTime_v2)                                                                         \
  X(cuEventDestroy_v2)                                                                             \
  X(cuGraphInstantiate)                                                                            \
  X(cuGraphInstantiate_v2)                                                                         \
  X(cuGraphInstantiateWithFlags)                                                                   \
  X(cuGraphInstantiateWithParams)                                                                  \
  X(cuGraphInstantiateWithParams_ptsz)                                                             \
  X(cuGraphLaunch)                                                                                 \
  X(cuGraphLaunch_ptsz)                                                                            \
  X(cuGraphExecDestroy)                                                                            \
  X(cuGraphDestroy)                                                                                \
  X(cuGraphCreate)                                                                                 \
  X(cuGraphAddKernelNode_v2)                                                                       \
  X(cuGraphKernelNodeGetParams_v2)                                                                 \
  X(cuGraphAddChildGraphNode)                                                                      \
  X(cuGraphChildGraphNodeGetGraph)                                                                 \
  X(cuGraphGetNodes)                                                                               \
  X(cuGraphNodeGetType)                                                                            \
  X(cuGraphClone)                                                                                  \
  X(cuGraphExecUpdate)                                                                             \
  X(cuGraphExecUpdate_v2)                                                                          \
  X(cuGraphExecKernelNodeSetParams)                                                                \
  X(cuGraphExecKernelNodeSetParams_v2)                                                             \
  X(cuGraphAddNode)                                                                                \
  X(cuGraphAddNode_v2)                                                                             \
  X(cuGraphConditionalHandleCreate)                                                                \
  X(cuGraphExecNodeSetParams)                                                                      \
  X(cuGraphExecChildGraphNodeSetParams)                                                            \
  X(cuGraphDestroyNode)

typedef enum wltest_fn_e {
#define WLTEST_FN_ENUM_(f) WLTEST_FN_##f,
  WLTEST_DRIVER_FNS(WLTEST_FN_ENUM_)
#undef WLTEST_FN_ENUM_
      WLTEST_FN__COUNT
} wltest_fn_t;

/* The most devices WLTEST_DEVICE_COUNT may ask for. */
#define WLTEST_MAX_DEVICES 8

typedef struct wltest_driver_stats_s {
  uint64_t capacity;     /* device memory (WLTEST_DEVICE_MEM, default 8 GiB) */
  uint64_t reservations; /* live cuMemAddressReserve ranges */
  uint64_t reserved_bytes;
  uint64_t handles;                /* cuMemCreate handles not yet released */
  uint64_t phys_bytes;             /* device memory in use: unreleased, or released but mapped */
  uint64_t imported_handles;       /* cuMemImportFromShareableHandle handles not yet released */
  uint64_t imported_bytes;         /* their memory (not charged: it is the exporter's) */
  uint64_t mappings, mapped_bytes; /* live cuMemMap mappings */
  uint64_t accessible_bytes;       /* mapped bytes with access granted by cuMemSetAccess */
  uint64_t streams, events;        /* live objects from cuStreamCreate / cuEventCreate */
  uint64_t primary_refs;           /* primary context retains, over all devices */
  uint64_t contexts;               /* contexts from cuCtxCreate not yet destroyed */
  uint64_t dropped;                /* streams, events and executable graphs still alive when
                                      their context's last retain was released, it was reset
                                      or destroyed (freed then, as CUDA does) */
  uint64_t resets;                 /* successful cuDevicePrimaryCtxReset(_v2) calls */
  uint64_t linear_allocs, linear_bytes;     /* live cuMemAlloc/pool allocations, charged bytes */
  uint64_t pool_reserved;                   /* bytes the pools hold (in use and cached) */
  uint64_t host_allocs, host_bytes;         /* live page-locked host allocations */
  uint64_t ipc_exported;                    /* live cuMemAlloc allocations with an IPC handle */
  uint64_t ipc_opened, ipc_open_bytes;      /* IPC handles opened here (not charged), their bytes */
  uint64_t used;                            /* device memory in use, all kinds, all devices */
  uint64_t devices;                         /* WLTEST_DEVICE_COUNT (default 1) */
  uint64_t device_used[WLTEST_MAX_DEVICES]; /* used, per device (cuMemGetInfo there) */
  uint64_t launches;                        /* kernels enqueued (graph replays included) */
  uint64_t twins;                           /* host twins run */
  uint64_t misuse;                          /* calls refused because the caller broke a rule */
  uint64_t injected;                        /* failures returned because of wltest_fail_next */
  uint64_t calls[WLTEST_FN__COUNT];         /* every call, refused ones included */
  char last_misuse[192];                    /* "cuMemMap: ...", empty when none */
} wltest_driver_stats_t;

/* A snapshot of the counters. */
void wltest_driver_stats(wltest_driver_stats_t *out);

/* The index of an entry point: its exported name ("cuDeviceTotalMem_v2") or the name the header
 * spells ("cuDeviceTotalMem"). -1 when the double has no such function. */
int wltest_fn_id(const char *fn);

/* Makes the next call of fn (from any thread) return err without doing anything. 0, or -1 for
 * an unknown name. Injected failures do not count as misuse. */
int wltest_fail_next(const char *fn, CUresult err);

/* Holds a stream's work: until released, the stream is busy and every event recorded on it
 * stays CUDA_ERROR_NOT_READY. NULL and CU_STREAM_LEGACY mean the calling thread's current
 * context's default stream. 0, or -1 for an unknown stream. Destroying a held stream lets its
 * work finish. */
int wltest_stream_hold(CUstream stream);
int wltest_stream_release(CUstream stream);

#ifdef __cplusplus
}
#endif
#endif
