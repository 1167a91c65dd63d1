/* The CUDA driver double's cuGetProcAddress: every entry point it exports, by the base name the
 * caller asks for, the CUDA version each ABI variant appeared in, and its per-thread-stream
 * twin, as cudaTypedefs.h lists them. For tests only. */
#include "driver.h"

#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* The table holds the deprecated launch entry points too (cuLaunch, cuParamSet*, ...). */
#pragma GCC diagnostic ignored "-Wdeprecated-declarations"

#define D drv__state

typedef struct proc_s {
  const char *name; /* base name, as asked for */
  int version;      /* the CUDA version this variant appeared in */
  bool ptsz;        /* the per-thread default stream variant (_ptsz/_ptds) */
  void *fn;
  const char *variant; /* the exported name of fn */
} proc_t;

#define P(name, version, fn)                                                                       \
  { #name, version, false, (void *)(fn), #fn }
#define PT(name, version, fn)                                                                      \
  { #name, version, true, (void *)(fn), #fn }

/* Variants of one name in increasing version. Only what the double implements. */
static const proc_t procs[] = {
    P(cuGetProcAddress, 11030, cuGetProcAddress_v1),
    P(cuGetProcAddress, 12000, cuGetProcAddress_v2),
    P(cuInit, 2000, cuInit),
    P(cuDriverGetVersion, 2020, cuDriverGetVersion),
    P(cuGetErrorName, 6000, cuGetErrorName),
    P(cuGetErrorString, 6000, cuGetErrorString),
    P(cuDeviceGet, 2000, cuDeviceGet),
    P(cuDeviceGetCount, 2000, cuDeviceGetCount),
    P(cuDeviceTotalMem, 3020, cuDeviceTotalMem_v2),
    P(cuDeviceGetAttribute, 2000, cuDeviceGetAttribute),
    P(cuDeviceGetName, 2000, cuDeviceGetName),
    P(cuDeviceGetUuid, 9020, cuDeviceGetUuid_v1),
    P(cuDeviceGetUuid, 11040, cuDeviceGetUuid_v2),
    P(cuDeviceGetPCIBusId, 4010, cuDeviceGetPCIBusId),
    P(cuDevicePrimaryCtxRetain, 7000, cuDevicePrimaryCtxRetain),
    P(cuDevicePrimaryCtxRelease, 11000, cuDevicePrimaryCtxRelease_v2),
    P(cuDevicePrimaryCtxGetState, 7000, cuDevicePrimaryCtxGetState),
    P(cuDevicePrimaryCtxReset, 7000, cuDevicePrimaryCtxReset_v1),
    P(cuDevicePrimaryCtxReset, 11000, cuDevicePrimaryCtxReset_v2),
    P(cuCtxGetCurrent, 4000, cuCtxGetCurrent),
    P(cuCtxSetCurrent, 4000, cuCtxSetCurrent),
    P(cuCtxGetDevice, 2000, cuCtxGetDevice),
    P(cuCtxGetDevice, 13000, cuCtxGetDevice_v2),
    P(cuCtxSynchronize, 2000, cuCtxSynchronize),
    P(cuCtxSynchronize, 13000, cuCtxSynchronize_v2),
    P(cuCtxCreate, 2000, cuCtxCreate_v1),
    P(cuCtxCreate, 3020, cuCtxCreate_v2),
    P(cuCtxCreate, 11040, cuCtxCreate_v3),
    P(cuCtxCreate, 12050, cuCtxCreate_v4),
    P(cuCtxDestroy, 2000, cuCtxDestroy_v1),
    P(cuCtxDestroy, 4000, cuCtxDestroy_v2),
    P(cuCtxPushCurrent, 2000, cuCtxPushCurrent_v1),
    P(cuCtxPushCurrent, 4000, cuCtxPushCurrent_v2),
    P(cuCtxPopCurrent, 2000, cuCtxPopCurrent_v1),
    P(cuCtxPopCurrent, 4000, cuCtxPopCurrent_v2),
    P(cuMemGetAllocationGranularity, 10020, cuMemGetAllocationGranularity),
    P(cuMemAddressReserve, 10020, cuMemAddressReserve),
    P(cuMemAddressFree, 10020, cuMemAddressFree),
    P(cuMemCreate, 10020, cuMemCreate),
    P(cuMemRelease, 10020, cuMemRelease),
    P(cuMemRetainAllocationHandle, 11000, cuMemRetainAllocationHandle),
    P(cuMemMap, 10020, cuMemMap),
    P(cuMemSetAccess, 10020, cuMemSetAccess),
    P(cuMemUnmap, 10020, cuMemUnmap),
    P(cuMemExportToShareableHandle, 10020, cuMemExportToShareableHandle),
    P(cuMemImportFromShareableHandle, 10020, cuMemImportFromShareableHandle),
    P(cuMemGetAllocationPropertiesFromHandle, 10020, cuMemGetAllocationPropertiesFromHandle),
    P(cuPointerGetAttribute, 4000, cuPointerGetAttribute),
    P(cuPointerGetAttributes, 7000, cuPointerGetAttributes),
    P(cuMemGetInfo, 2000, cuMemGetInfo_v1),
    P(cuMemGetInfo, 3020, cuMemGetInfo_v2),
    P(cuIpcGetMemHandle, 4010, cuIpcGetMemHandle),
    P(cuIpcOpenMemHandle, 4010, cuIpcOpenMemHandle_v1),
    P(cuIpcOpenMemHandle, 11000, cuIpcOpenMemHandle_v2),
    P(cuIpcCloseMemHandle, 4010, cuIpcCloseMemHandle),
    P(cuMemAlloc, 2000, cuMemAlloc_v1),
    P(cuMemAlloc, 3020, cuMemAlloc_v2),
    P(cuMemAllocPitch, 3020, cuMemAllocPitch_v2),
    P(cuMemAllocManaged, 6000, cuMemAllocManaged),
    P(cuMemFree, 2000, cuMemFree_v1),
    P(cuMemFree, 3020, cuMemFree_v2),
    P(cuMemAllocHost, 2000, cuMemAllocHost_v1),
    P(cuMemAllocHost, 3020, cuMemAllocHost_v2),
    P(cuMemHostAlloc, 2020, cuMemHostAlloc),
    P(cuMemFreeHost, 2000, cuMemFreeHost),
    P(cuMemHostGetFlags, 2030, cuMemHostGetFlags),
    P(cuMemAllocAsync, 11020, cuMemAllocAsync),
    PT(cuMemAllocAsync, 11020, cuMemAllocAsync_ptsz),
    P(cuMemFreeAsync, 11020, cuMemFreeAsync),
    PT(cuMemFreeAsync, 11020, cuMemFreeAsync_ptsz),
    P(cuMemAllocFromPoolAsync, 11020, cuMemAllocFromPoolAsync),
    PT(cuMemAllocFromPoolAsync, 11020, cuMemAllocFromPoolAsync_ptsz),
    P(cuDeviceGetDefaultMemPool, 11020, cuDeviceGetDefaultMemPool),
    P(cuDeviceGetMemPool, 11020, cuDeviceGetMemPool),
    P(cuDeviceSetMemPool, 11020, cuDeviceSetMemPool),
    P(cuMemPoolSetAccess, 11020, cuMemPoolSetAccess),
    P(cuMemGetAccess, 10020, cuMemGetAccess),
    P(cuCtxEnablePeerAccess, 4000, cuCtxEnablePeerAccess),
    P(cuCtxDisablePeerAccess, 4000, cuCtxDisablePeerAccess),
    P(cuMemPoolCreate, 11020, cuMemPoolCreate),
    P(cuMemPoolDestroy, 11020, cuMemPoolDestroy),
    P(cuMemPoolSetAttribute, 11020, cuMemPoolSetAttribute),
    P(cuMemPoolGetAttribute, 11020, cuMemPoolGetAttribute),
    P(cuMemPoolTrimTo, 11020, cuMemPoolTrimTo),
    P(cuMemcpy, 4000, cuMemcpy),
    P(cuMemcpyAsync, 4000, cuMemcpyAsync),
    P(cuMemcpyHtoD, 3020, cuMemcpyHtoD_v2),
    P(cuMemcpyDtoH, 3020, cuMemcpyDtoH_v2),
    P(cuMemcpyDtoD, 3020, cuMemcpyDtoD_v2),
    P(cuMemcpyHtoDAsync, 3020, cuMemcpyHtoDAsync_v2),
    P(cuMemcpyDtoHAsync, 3020, cuMemcpyDtoHAsync_v2),
    P(cuMemcpyDtoDAsync, 3020, cuMemcpyDtoDAsync_v2),
    P(cuMemsetD8, 3020, cuMemsetD8_v2),
    P(cuMemsetD32, 3020, cuMemsetD32_v2),
    P(cuMemsetD8Async, 3020, cuMemsetD8Async),
    P(cuMemsetD32Async, 3020, cuMemsetD32Async),
    P(cuModuleLoadData, 2000, cuModuleLoadData),
    P(cuModuleGetFunction, 2000, cuModuleGetFunction),
    P(cuModuleUnload, 2000, cuModuleUnload),
    P(cuFuncGetName, 12030, cuFuncGetName),
    P(cuKernelGetName, 12030, cuKernelGetName),
    P(cuLibraryLoadData, 12000, cuLibraryLoadData),
    P(cuLibraryGetKernel, 12000, cuLibraryGetKernel),
    P(cuLibraryUnload, 12000, cuLibraryUnload),
    P(cuLaunchKernel, 4000, cuLaunchKernel),
    PT(cuLaunchKernel, 7000, cuLaunchKernel_ptsz),
    P(cuLaunchKernelEx, 11060, cuLaunchKernelEx),
    PT(cuLaunchKernelEx, 11060, cuLaunchKernelEx_ptsz),
    P(cuLaunchCooperativeKernel, 9000, cuLaunchCooperativeKernel),
    PT(cuLaunchCooperativeKernel, 9000, cuLaunchCooperativeKernel_ptsz),
    P(cuLaunchCooperativeKernelMultiDevice, 9000, cuLaunchCooperativeKernelMultiDevice),
    P(cuFuncSetBlockShape, 2000, cuFuncSetBlockShape),
    P(cuFuncSetSharedSize, 2000, cuFuncSetSharedSize),
    P(cuParamSetSize, 2000, cuParamSetSize),
    P(cuParamSeti, 2000, cuParamSeti),
    P(cuParamSetf, 2000, cuParamSetf),
    P(cuParamSetv, 2000, cuParamSetv),
    P(cuLaunch, 2000, cuLaunch),
    P(cuLaunchGrid, 2000, cuLaunchGrid),
    P(cuLaunchGridAsync, 2000, cuLaunchGridAsync),
    P(cuStreamCreate, 2000, cuStreamCreate),
    P(cuStreamDestroy, 4000, cuStreamDestroy_v2),
    P(cuStreamQuery, 2000, cuStreamQuery),
    P(cuStreamSynchronize, 2000, cuStreamSynchronize),
    P(cuStreamWaitEvent, 3020, cuStreamWaitEvent),
    P(cuStreamBeginCapture, 10000, cuStreamBeginCapture_v1),
    PT(cuStreamBeginCapture, 10000, cuStreamBeginCapture_ptsz),
    P(cuStreamBeginCapture, 10010, cuStreamBeginCapture_v2),
    PT(cuStreamBeginCapture, 10010, cuStreamBeginCapture_v2_ptsz),
    P(cuStreamEndCapture, 10000, cuStreamEndCapture),
    PT(cuStreamEndCapture, 10000, cuStreamEndCapture_ptsz),
    P(cuThreadExchangeStreamCaptureMode, 10010, cuThreadExchangeStreamCaptureMode),
    P(cuStreamIsCapturing, 10000, cuStreamIsCapturing),
    P(cuStreamGetDevice, 12080, cuStreamGetDevice),
    P(cuStreamGetCtx, 9020, cuStreamGetCtx),
    PT(cuStreamGetCtx, 9020, cuStreamGetCtx_ptsz),
    P(cuStreamGetCtx, 12050, cuStreamGetCtx_v2),
    PT(cuStreamGetCtx, 12050, cuStreamGetCtx_v2_ptsz),
    P(cuStreamGetCaptureInfo, 12030, cuStreamGetCaptureInfo_v3),
    P(cuEventCreate, 2000, cuEventCreate),
    P(cuEventRecord, 2000, cuEventRecord),
    P(cuEventQuery, 2000, cuEventQuery),
    P(cuEventSynchronize, 2000, cuEventSynchronize),
    P(cuEventElapsedTime, 2000, cuEventElapsedTime_v1),
    P(cuEventElapsedTime, 12080, cuEventElapsedTime_v2),
    P(cuEventDestroy, 4000, cuEventDestroy_v2),
    P(cuGraphInstantiate, 10000, cuGraphInstantiate_v1),
    P(cuGraphInstantiate, 11000, cuGraphInstantiate_v2),
    P(cuGraphInstantiateWithFlags, 11040, cuGraphInstantiateWithFlags),
    P(cuGraphInstantiateWithParams, 12000, cuGraphInstantiateWithParams),
    PT(cuGraphInstantiateWithParams, 12000, cuGraphInstantiateWithParams_ptsz),
    P(cuGraphLaunch, 10000, cuGraphLaunch),
    PT(cuGraphLaunch, 10000, cuGraphLaunch_ptsz),
    P(cuGraphExecDestroy, 10000, cuGraphExecDestroy),
    P(cuGraphDestroy, 10000, cuGraphDestroy),
    P(cuGraphCreate, 10000, cuGraphCreate),
    P(cuGraphAddKernelNode, 12000, cuGraphAddKernelNode_v2),
    P(cuGraphKernelNodeGetParams, 12000, cuGraphKernelNodeGetParams_v2),
    P(cuGraphAddChildGraphNode, 10000, cuGraphAddChildGraphNode),
    P(cuGraphChildGraphNodeGetGraph, 10000, cuGraphChildGraphNodeGetGraph),
    P(cuGraphGetNodes, 10000, cuGraphGetNodes),
    P(cuGraphNodeGetType, 10000, cuGraphNodeGetType),
    P(cuGraphClone, 10000, cuGraphClone),
    P(cuGraphExecUpdate, 10020, cuGraphExecUpdate_v1),
    P(cuGraphExecUpdate, 12000, cuGraphExecUpdate_v2),
    P(cuGraphExecKernelNodeSetParams, 10010, cuGraphExecKernelNodeSetParams_v1),
    P(cuGraphExecKernelNodeSetParams, 12000, cuGraphExecKernelNodeSetParams_v2),
    P(cuGraphAddNode, 12020, cuGraphAddNode_v1),
    P(cuGraphAddNode, 12030, cuGraphAddNode_v2),
    P(cuGraphConditionalHandleCreate, 12030, cuGraphConditionalHandleCreate),
    P(cuGraphExecNodeSetParams, 12020, cuGraphExecNodeSetParams),
    P(cuGraphExecChildGraphNodeSetParams, 11010, cuGraphExecChildGraphNodeSetParams),
    P(cuGraphDestroyNode, 10000, cuGraphDestroyNode),
};

/* WLTEST_PROC_LOG=path: every answer is appended as "name version flags variant", so a test can
 * see which entry points a caller (the real CUDA runtime, say) asked for and got. One write per
 * line (O_APPEND): lines of several threads do not mix. */
static void log_answer(const char *symbol, int version, cuuint64_t flags, const char *variant) {
  const char *path = getenv("WLTEST_PROC_LOG");
  if (!path || !*path) return;
  /* The _v1 functions are exported under the base name (an asm label, as in the real driver). */
  size_t vl = strlen(variant);
  int keep = vl > 3 && strcmp(variant + vl - 3, "_v1") == 0 ? (int)vl - 3 : (int)vl;
  char line[512];
  int n = snprintf(line, sizeof line, "%s %d %llu %.*s\n", symbol, version,
                   (unsigned long long)flags, keep, variant);
  int fd = open(path, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
  if (fd < 0) return;
  if (n > 0 && (size_t)n < sizeof line && write(fd, line, (size_t)n) < 0) {
    /* a test's log: nothing to do about it here */
  }
  close(fd);
}

/* WLTEST_PROC_PRIVATE=name,...: those names are answered with a private twin (see
 * drv_private_twin), as a driver whose answers are not its exported symbols would. */
static void *private_answer(const char *symbol, const char *variant) {
  const char *env = getenv("WLTEST_PROC_PRIVATE");
  if (!env) return NULL;
  size_t n = strlen(symbol);
  for (const char *p = env; (p = strstr(p, symbol)); p += n)
    if ((p == env || p[-1] == ',') && (p[n] == 0 || p[n] == ',')) return drv_private_twin(variant);
  return NULL;
}

/* The newest variant of name at or before version; per-thread twins preferred when asked for
 * (falling back to the legacy one, as documented). */
static CUresult lookup(const char *symbol, void **pfn, int cudaVersion, cuuint64_t flags,
                       CUdriverProcAddressQueryResult *status) {
  if (!symbol || !pfn) return drv_misuse(CUDA_ERROR_INVALID_VALUE, "NULL symbol or output");
  *pfn = NULL;
  if (flags & ~(cuuint64_t)(CU_GET_PROC_ADDRESS_LEGACY_STREAM |
                            CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM))
    return drv_misuse(CUDA_ERROR_INVALID_VALUE, "flags %#llx", (unsigned long long)flags);
  if (cudaVersion > CUDA_VERSION)
    return drv_misuse(CUDA_ERROR_INVALID_VALUE, "version %d is newer than the driver's %d",
                      cudaVersion, CUDA_VERSION);
  bool per_thread = flags & CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM;
  const proc_t *legacy = NULL, *pt = NULL;
  bool known = false;
  for (size_t i = 0; i < sizeof procs / sizeof procs[0]; i++) {
    const proc_t *p = &procs[i];
    if (strcmp(p->name, symbol) != 0) continue;
    known = true;
    if (p->version > cudaVersion) continue;
    if (p->ptsz) {
      if (per_thread && (!pt || p->version >= pt->version)) pt = p;
    } else if (!legacy || p->version >= legacy->version) {
      legacy = p;
    }
  }
  /* A per-thread twin of an older ABI than the newest legacy variant does not apply. */
  const proc_t *best = pt && (!legacy || pt->version >= legacy->version) ? pt : legacy;
  if (best) {
    void *twin = private_answer(symbol, best->variant);
    *pfn = twin ? twin : best->fn;
  }
  if (best) log_answer(symbol, cudaVersion, flags, best->variant);
  if (status)
    *status = best    ? CU_GET_PROC_ADDRESS_SUCCESS
              : known ? CU_GET_PROC_ADDRESS_VERSION_NOT_SUFFICIENT
                      : CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND;
  /* Not found is CUDA_SUCCESS with a NULL pointer, as the header documents. */
  return CUDA_SUCCESS;
}

CUresult CUDAAPI cuGetProcAddress_v2(const char *symbol, void **pfn, int cudaVersion,
                                     cuuint64_t flags,
                                     CUdriverProcAddressQueryResult *symbolStatus) {
  DRV_BEGIN(cuGetProcAddress_v2, DRV_NEED_NONE);
  return drv_end(lookup(symbol, pfn, cudaVersion, flags, symbolStatus));
}

CUresult CUDAAPI cuGetProcAddress_v1(const char *symbol, void **pfn, int cudaVersion,
                                     cuuint64_t flags) {
  DRV_BEGIN(cuGetProcAddress, DRV_NEED_NONE);
  return drv_end(lookup(symbol, pfn, cudaVersion, flags, NULL));
}
