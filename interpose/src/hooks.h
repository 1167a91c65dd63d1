/* The names libwavelet.so hooks, as X-macro lists (no CUDA header needed), and their ids. */
#ifndef WAVELET_INTERPOSE_HOOKS_H
#define WAVELET_INTERPOSE_HOOKS_H

/* ---- the hooks -------------------------------------------------------------------------------
 * Every hooked name, one line each. The driver's are looked up in libcuda (then RTLD_NEXT), the
 * runtime's and NCCL's in the next library (then an already loaded libcudart/libnccl). */
#define WL__DRV_HOOKS(X)                                                                           \
  X(cuMemAlloc_v2)                                                                                 \
  X(cuMemAllocPitch_v2)                                                                            \
  X(cuMemAllocManaged)                                                                             \
  X(cuMemFree_v2)                                                                                  \
  X(cuMemAllocAsync)                                                                               \
  X(cuMemAllocAsync_ptsz)                                                                          \
  X(cuMemFreeAsync)                                                                                \
  X(cuMemFreeAsync_ptsz)                                                                           \
  X(cuMemAllocFromPoolAsync)                                                                       \
  X(cuMemAllocFromPoolAsync_ptsz)                                                                  \
  X(cuMemCreate)                                                                                   \
  X(cuMemRelease)                                                                                  \
  X(cuMemRetainAllocationHandle)                                                                   \
  X(cuMemImportFromShareableHandle)                                                                \
  X(cuDeviceSetMemPool)                                                                            \
  X(cuMemPoolSetAccess)                                                                            \
  X(cuCtxEnablePeerAccess)                                                                         \
  X(cuMemMap)                                                                                      \
  X(cuMemUnmap)                                                                                    \
  X(cuMemGetInfo_v2)                                                                               \
  X(cuIpcGetMemHandle)                                                                             \
  X(cuIpcOpenMemHandle)                                                                            \
  X(cuIpcOpenMemHandle_v2)                                                                         \
  X(cuIpcCloseMemHandle)                                                                           \
  X(cuMemAllocHost_v2)                                                                             \
  X(cuMemHostAlloc)                                                                                \
  X(cuMemFreeHost)                                                                                 \
  X(cuMemHostGetFlags)                                                                             \
  X(cuStreamDestroy_v2)                                                                            \
  X(cuLaunchKernel)                                                                                \
  X(cuLaunchKernel_ptsz)                                                                           \
  X(cuLaunchKernelEx)                                                                              \
  X(cuLaunchKernelEx_ptsz)                                                                         \
  X(cuLaunchCooperativeKernel)                                                                     \
  X(cuLaunchCooperativeKernel_ptsz)                                                                \
  X(cuLaunchCooperativeKernelMultiDevice)                                                          \
  X(cuLaunch)                                                                                      \
  X(cuLaunchGrid)                                                                                  \
  X(cuLaunchGridAsync)                                                                             \
  X(cuFuncSetBlockShape)                                                                           \
  X(cuGraphLaunch)                                                                                 \
  X(cuGraphLaunch_ptsz)                                                                            \
  X(cuStreamBeginCapture)                                                                          \
  X(cuStreamBeginCapture_ptsz)                                                                     \
  X(cuStreamBeginCapture_v2)                                                                       \
  X(cuStreamBeginCapture_v2_ptsz)                                                                  \
  X(cuStreamBeginCaptureToGraph)                                                                   \
  X(cuStreamBeginCaptureToGraph_ptsz)                                                              \
  X(cuStreamEndCapture)                                                                            \
  X(cuStreamEndCapture_ptsz)                                                                       \
  X(cuGraphInstantiate)                                                                            \
  X(cuGraphInstantiate_v2)                                                                         \
  X(cuGraphInstantiateWithFlags)                                                                   \
  X(cuGraphInstantiateWithParams)                                                                  \
  X(cuGraphInstantiateWithParams_ptsz)                                                             \
  X(cuGraphDestroy)                                                                                \
  X(cuGraphExecDestroy)                                                                            \
  X(cuGraphExecUpdate)                                                                             \
  X(cuGraphExecUpdate_v2)                                                                          \
  X(cuGraphExecKernelNodeSetParams)                                                                \
  X(cuGraphExecKernelNodeSetParams_v2)                                                             \
  X(cuGraphExecNodeSetParams)                                                                      \
  X(cuGraphExecChildGraphNodeSetParams)                                                            \
  X(cuGraphAddNode)                                                                                \
  X(cuGraphAddNode_v2)                                                                             \
  X(cuGraphDestroyNode)                                                                            \
  X(cuDevicePrimaryCtxReset)                                                                       \
  X(cuDevicePrimaryCtxReset_v2)                                                                    \
  X(cuCtxDestroy)                                                                                  \
  X(cuCtxDestroy_v2)                                                                               \
  X(cuGetProcAddress)                                                                              \
  X(cuGetProcAddress_v2)

#define WL__RT_HOOKS(X)                                                                            \
  X(cudaMalloc)                                                                                    \
  X(cudaFree)                                                                                      \
  X(cudaMallocAsync)                                                                               \
  X(cudaMallocAsync_ptsz)                                                                          \
  X(cudaFreeAsync)                                                                                 \
  X(cudaFreeAsync_ptsz)                                                                            \
  X(cudaMallocFromPoolAsync)                                                                       \
  X(cudaMallocFromPoolAsync_ptsz)                                                                  \
  X(cudaMallocHost)                                                                                \
  X(cudaHostAlloc)                                                                                 \
  X(cudaFreeHost)                                                                                  \
  X(cudaMemGetInfo)                                                                                \
  X(cudaDeviceReset)                                                                               \
  X(cudaLaunchKernel)                                                                              \
  X(cudaLaunchKernel_ptsz)                                                                         \
  X(cudaLaunchKernelExC)                                                                           \
  X(cudaLaunchKernelExC_ptsz)                                                                      \
  X(cudaLaunchCooperativeKernel)                                                                   \
  X(cudaLaunchCooperativeKernel_ptsz)                                                              \
  X(cudaGraphLaunch)                                                                               \
  X(cudaGraphLaunch_ptsz)                                                                          \
  X(cudaGetDriverEntryPoint)                                                                       \
  X(cudaGetDriverEntryPoint_ptsz)                                                                  \
  X(cudaGetDriverEntryPointByVersion)                                                              \
  X(cudaGetDriverEntryPointByVersion_ptsz)

#define WL__NCCL_HOOKS(X)                                                                          \
  X(ncclAllReduce)                                                                                 \
  X(ncclBroadcast)                                                                                 \
  X(ncclBcast)                                                                                     \
  X(ncclReduce)                                                                                    \
  X(ncclAllGather)                                                                                 \
  X(ncclReduceScatter)                                                                             \
  X(ncclSend)                                                                                      \
  X(ncclRecv)                                                                                      \
  X(ncclGroupEnd)

/* Driver entry points we call ourselves but do not hook. */
#define WL__DRV_PRIVATE(X)                                                                         \
  X(cuInit)                                                                                        \
  X(cuCtxGetCurrent)                                                                               \
  X(cuCtxSetCurrent)                                                                               \
  X(cuCtxGetDevice)                                                                                \
  X(cuDeviceGet)                                                                                   \
  X(cuDeviceGetUuid_v2)                                                                            \
  X(cuDeviceTotalMem_v2)                                                                           \
  X(cuStreamIsCapturing)                                                                           \
  X(cuStreamGetDevice)                                                                             \
  X(cuStreamGetCtx)                                                                                \
  X(cuDeviceGetDefaultMemPool)                                                                     \
  X(cuDeviceGetMemPool)                                                                            \
  X(cuDeviceGetCount)                                                                              \
  X(cuCtxGetDevice_v2)                                                                             \
  X(cuDevicePrimaryCtxGetState)                                                                    \
  X(cuDevicePrimaryCtxRetain)                                                                      \
  X(cuDevicePrimaryCtxRelease_v2)                                                                  \
  X(cuStreamGetCaptureInfo_v3)                                                                     \
  X(cuThreadExchangeStreamCaptureMode)                                                             \
  X(cuEventCreate)                                                                                 \
  X(cuEventRecord)                                                                                 \
  X(cuEventSynchronize)                                                                            \
  X(cuEventQuery)                                                                                  \
  X(cuEventDestroy_v2)                                                                             \
  X(cuStreamSynchronize)                                                                           \
  X(cuCtxSynchronize)                                                                              \
  X(cuGraphGetNodes)                                                                               \
  X(cuGraphNodeGetType)                                                                            \
  X(cuGraphKernelNodeGetParams_v2)                                                                 \
  X(cuGraphChildGraphNodeGetGraph)                                                                 \
  X(cuPointerGetAttribute)

typedef enum wl__hook_id_e {
#define WL__ID(n) WL__H_##n,
  WL__DRV_HOOKS(WL__ID) WL__H_DRV_END,
  WL__RT_HOOKS(WL__ID) WL__H_RT_END,
  WL__NCCL_HOOKS(WL__ID) WL__H_NCCL_END,
  WL__DRV_PRIVATE(WL__ID) WL__H_COUNT
#undef WL__ID
} wl__hook_id_t;

/* Real entry points by id (NULL until resolved), our wrappers and names. */
extern void *wl__real_fn[WL__H_COUNT];
extern void *const wl__wrapper_fn[WL__H_COUNT];
extern const char *const wl__hook_name[WL__H_COUNT];

#endif
