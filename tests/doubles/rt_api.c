/* The CUDA runtime double's memory, stream, event and graph entry points: each is a thin call of
 * the driver entry point the real runtime uses, resolved through cuGetProcAddress. For tests
 * only. */
#include "runtime.h"

#include <stdint.h>
#include <string.h>

#define ENTER()                                                                                    \
  do {                                                                                             \
    cudaError_t enter_ = rt_enter();                                                               \
    if (enter_ != cudaSuccess) return enter_;                                                      \
  } while (0)

/* ---- device memory ---------------------------------------------------------------------------*/

cudaError_t CUDARTAPI cudaMalloc(void **devPtr, size_t size) {
  if (!devPtr) return rt_ret(cudaErrorInvalidValue);
  ENTER();
  /* cudaMalloc(0) succeeds with NULL, and reaches no driver. */
  if (size == 0) {
    *devPtr = NULL;
    return cudaSuccess;
  }
  CUdeviceptr p = 0;
  cudaError_t e = RT_CALL(mem_alloc, &p, size);
  *devPtr = e == cudaSuccess ? (void *)(uintptr_t)p : NULL;
  return e;
}

cudaError_t CUDARTAPI cudaFree(void *devPtr) {
  ENTER(); /* cudaFree(NULL) is the classic way to initialise the runtime */
  if (!devPtr) return cudaSuccess;
  return RT_CALL(mem_free, (CUdeviceptr)(uintptr_t)devPtr);
}

cudaError_t CUDARTAPI cudaMemGetInfo(size_t *free, size_t *total) {
  if (!free || !total) return rt_ret(cudaErrorInvalidValue);
  ENTER();
  return RT_CALL(mem_info, free, total);
}

RT_TWIN(cudaError_t, cudaMallocAsync, _ptsz, (void **devPtr, size_t size, cudaStream_t hStream),
        (devPtr, size, hStream)) {
  if (!devPtr) return rt_ret(cudaErrorInvalidValue);
  ENTER();
  CUdeviceptr p = 0;
  cudaError_t e = per_thread ? RT_CALL(alloc_async_pt, &p, size, (CUstream)hStream)
                             : RT_CALL(alloc_async, &p, size, (CUstream)hStream);
  *devPtr = e == cudaSuccess ? (void *)(uintptr_t)p : NULL;
  return e;
}

RT_TWIN(cudaError_t, cudaFreeAsync, _ptsz, (void *devPtr, cudaStream_t hStream),
        (devPtr, hStream)) {
  ENTER();
  CUdeviceptr p = (CUdeviceptr)(uintptr_t)devPtr;
  return per_thread ? RT_CALL(free_async_pt, p, (CUstream)hStream)
                    : RT_CALL(free_async, p, (CUstream)hStream);
}

RT_TWIN(cudaError_t, cudaMallocFromPoolAsync, _ptsz,
        (void **ptr, size_t size, cudaMemPool_t memPool, cudaStream_t stream),
        (ptr, size, memPool, stream)) {
  if (!ptr) return rt_ret(cudaErrorInvalidValue);
  ENTER();
  CUdeviceptr p = 0;
  cudaError_t e = per_thread
                      ? RT_CALL(alloc_pool_pt, &p, size, (CUmemoryPool)memPool, (CUstream)stream)
                      : RT_CALL(alloc_pool, &p, size, (CUmemoryPool)memPool, (CUstream)stream);
  *ptr = e == cudaSuccess ? (void *)(uintptr_t)p : NULL;
  return e;
}

cudaError_t CUDARTAPI cudaDeviceGetDefaultMemPool(cudaMemPool_t *memPool, int device) {
  if (!memPool) return rt_ret(cudaErrorInvalidValue);
  ENTER();
  return RT_CALL(default_pool, (CUmemoryPool *)memPool, device);
}

cudaError_t CUDARTAPI cudaDeviceGetMemPool(cudaMemPool_t *memPool, int device) {
  if (!memPool) return rt_ret(cudaErrorInvalidValue);
  ENTER();
  return RT_CALL(device_pool, (CUmemoryPool *)memPool, device);
}

/* The runtime's pool attributes are the driver's, by number. */
cudaError_t CUDARTAPI cudaMemPoolSetAttribute(cudaMemPool_t memPool, enum cudaMemPoolAttr attr,
                                              void *value) {
  ENTER();
  return RT_CALL(pool_set, (CUmemoryPool)memPool, (CUmemPool_attribute)attr, value);
}

cudaError_t CUDARTAPI cudaMemPoolGetAttribute(cudaMemPool_t memPool, enum cudaMemPoolAttr attr,
                                              void *value) {
  ENTER();
  return RT_CALL(pool_get, (CUmemoryPool)memPool, (CUmemPool_attribute)attr, value);
}

cudaError_t CUDARTAPI cudaMemPoolTrimTo(cudaMemPool_t memPool, size_t minBytesToKeep) {
  ENTER();
  return RT_CALL(pool_trim, (CUmemoryPool)memPool, minBytesToKeep);
}

/* ---- CUDA IPC --------------------------------------------------------------------------------*/

/* The handles are the driver's, byte for byte (both are 64 opaque bytes). */
_Static_assert(sizeof(cudaIpcMemHandle_t) == sizeof(CUipcMemHandle), "IPC handles differ");

cudaError_t CUDARTAPI cudaIpcGetMemHandle(cudaIpcMemHandle_t *handle, void *devPtr) {
  if (!handle) return rt_ret(cudaErrorInvalidValue);
  ENTER();
  CUipcMemHandle h;
  cudaError_t e = RT_CALL(ipc_get, &h, (CUdeviceptr)(uintptr_t)devPtr);
  if (e == cudaSuccess) memcpy(handle, &h, sizeof h);
  return e;
}

/* cudaIpcMemLazyEnablePeerAccess is the driver's CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS. */
cudaError_t CUDARTAPI cudaIpcOpenMemHandle(void **devPtr, cudaIpcMemHandle_t handle,
                                           unsigned int flags) {
  if (!devPtr) return rt_ret(cudaErrorInvalidValue);
  ENTER();
  CUipcMemHandle h;
  memcpy(&h, &handle, sizeof h);
  CUdeviceptr p = 0;
  cudaError_t e = RT_CALL(ipc_open, &p, h, flags);
  *devPtr = e == cudaSuccess ? (void *)(uintptr_t)p : NULL;
  return e;
}

cudaError_t CUDARTAPI cudaIpcCloseMemHandle(void *devPtr) {
  ENTER();
  return RT_CALL(ipc_close, (CUdeviceptr)(uintptr_t)devPtr);
}

/* ---- host memory -----------------------------------------------------------------------------*/

cudaError_t CUDARTAPI cudaMallocHost(void **ptr, size_t size) {
  if (!ptr) return rt_ret(cudaErrorInvalidValue);
  ENTER();
  if (size == 0) {
    *ptr = NULL;
    return cudaSuccess;
  }
  return RT_CALL(host_alloc_v2, ptr, size);
}

cudaError_t CUDARTAPI cudaHostAlloc(void **pHost, size_t size, unsigned int flags) {
  if (!pHost) return rt_ret(cudaErrorInvalidValue);
  ENTER();
  if (size == 0) {
    *pHost = NULL;
    return cudaSuccess;
  }
  /* cudaHostAlloc* flags are the driver's CU_MEMHOSTALLOC_*. */
  return RT_CALL(host_alloc, pHost, size, flags);
}

cudaError_t CUDARTAPI cudaFreeHost(void *ptr) {
  ENTER();
  if (!ptr) return cudaSuccess;
  return RT_CALL(host_free, ptr);
}

/* ---- copies and sets -------------------------------------------------------------------------*/

static bool kind_ok(enum cudaMemcpyKind kind) {
  return kind >= cudaMemcpyHostToHost && kind <= cudaMemcpyDefault;
}

RT_TWIN(cudaError_t, cudaMemcpy, _ptds,
        (void *dst, const void *src, size_t count, enum cudaMemcpyKind kind),
        (dst, src, count, kind)) {
  if (!kind_ok(kind)) return rt_ret(cudaErrorInvalidMemcpyDirection);
  ENTER();
  if (count == 0) return cudaSuccess;
  CUdeviceptr d = (CUdeviceptr)(uintptr_t)dst, s = (CUdeviceptr)(uintptr_t)src;
  /* On the per-thread stream, a synchronous copy is an asynchronous one waited for. */
  if (per_thread) {
    cudaError_t e = RT_CALL(memcpy_async, d, s, count, CU_STREAM_PER_THREAD);
    return e != cudaSuccess ? e : RT_CALL(stream_sync, CU_STREAM_PER_THREAD);
  }
  return RT_CALL(memcpy, d, s, count);
}

RT_TWIN(cudaError_t, cudaMemcpyAsync, _ptsz,
        (void *dst, const void *src, size_t count, enum cudaMemcpyKind kind, cudaStream_t stream),
        (dst, src, count, kind, stream)) {
  if (!kind_ok(kind)) return rt_ret(cudaErrorInvalidMemcpyDirection);
  ENTER();
  if (count == 0) return cudaSuccess;
  return RT_CALL(memcpy_async, (CUdeviceptr)(uintptr_t)dst, (CUdeviceptr)(uintptr_t)src, count,
                 rt_stream(stream, per_thread));
}

RT_TWIN(cudaError_t, cudaMemset, _ptds, (void *devPtr, int value, size_t count),
        (devPtr, value, count)) {
  ENTER();
  if (count == 0) return cudaSuccess;
  CUdeviceptr d = (CUdeviceptr)(uintptr_t)devPtr;
  if (per_thread) {
    cudaError_t e = RT_CALL(memset_async, d, (unsigned char)value, count, CU_STREAM_PER_THREAD);
    return e != cudaSuccess ? e : RT_CALL(stream_sync, CU_STREAM_PER_THREAD);
  }
  return RT_CALL(memset, d, (unsigned char)value, count);
}

RT_TWIN(cudaError_t, cudaMemsetAsync, _ptsz,
        (void *devPtr, int value, size_t count, cudaStream_t stream),
        (devPtr, value, count, stream)) {
  ENTER();
  if (count == 0) return cudaSuccess;
  return RT_CALL(memset_async, (CUdeviceptr)(uintptr_t)devPtr, (unsigned char)value, count,
                 rt_stream(stream, per_thread));
}

/* ---- streams ---------------------------------------------------------------------------------*/

cudaError_t CUDARTAPI cudaStreamCreateWithFlags(cudaStream_t *pStream, unsigned int flags) {
  if (!pStream) return rt_ret(cudaErrorInvalidValue);
  ENTER();
  return RT_CALL(stream_create, (CUstream *)pStream, flags);
}

cudaError_t CUDARTAPI cudaStreamCreate(cudaStream_t *pStream) {
  return cudaStreamCreateWithFlags(pStream, cudaStreamDefault);
}

cudaError_t CUDARTAPI cudaStreamDestroy(cudaStream_t stream) {
  ENTER();
  return RT_CALL(stream_destroy, (CUstream)stream);
}

RT_TWIN(cudaError_t, cudaStreamSynchronize, _ptsz, (cudaStream_t stream), (stream)) {
  ENTER();
  return RT_CALL(stream_sync, rt_stream(stream, per_thread));
}

RT_TWIN(cudaError_t, cudaStreamQuery, _ptsz, (cudaStream_t stream), (stream)) {
  ENTER();
  return RT_CALL(stream_query, rt_stream(stream, per_thread));
}

RT_TWIN(cudaError_t, cudaStreamWaitEvent, _ptsz,
        (cudaStream_t stream, cudaEvent_t event, unsigned int flags), (stream, event, flags)) {
  ENTER();
  return RT_CALL(stream_wait, rt_stream(stream, per_thread), (CUevent)event, flags);
}

/* ---- events ----------------------------------------------------------------------------------*/

cudaError_t CUDARTAPI cudaEventCreateWithFlags(cudaEvent_t *event, unsigned int flags) {
  if (!event) return rt_ret(cudaErrorInvalidValue);
  ENTER();
  return RT_CALL(event_create, (CUevent *)event, flags);
}

cudaError_t CUDARTAPI cudaEventCreate(cudaEvent_t *event) {
  return cudaEventCreateWithFlags(event, cudaEventDefault);
}

RT_TWIN(cudaError_t, cudaEventRecord, _ptsz, (cudaEvent_t event, cudaStream_t stream),
        (event, stream)) {
  ENTER();
  return RT_CALL(event_record, (CUevent)event, rt_stream(stream, per_thread));
}

cudaError_t CUDARTAPI cudaEventQuery(cudaEvent_t event) {
  ENTER();
  return RT_CALL(event_query, (CUevent)event);
}

cudaError_t CUDARTAPI cudaEventSynchronize(cudaEvent_t event) {
  ENTER();
  return RT_CALL(event_sync, (CUevent)event);
}

cudaError_t CUDARTAPI cudaEventElapsedTime(float *ms, cudaEvent_t start, cudaEvent_t end) {
  if (!ms) return rt_ret(cudaErrorInvalidValue);
  ENTER();
  return RT_CALL(event_elapsed, ms, (CUevent)start, (CUevent)end);
}

cudaError_t CUDARTAPI cudaEventDestroy(cudaEvent_t event) {
  ENTER();
  return RT_CALL(event_destroy, (CUevent)event);
}

/* ---- stream capture and graphs ---------------------------------------------------------------*/

RT_TWIN(cudaError_t, cudaStreamBeginCapture, _ptsz,
        (cudaStream_t stream, enum cudaStreamCaptureMode mode), (stream, mode)) {
  ENTER();
  return RT_CALL(capture_begin, rt_stream(stream, per_thread), (CUstreamCaptureMode)mode);
}

RT_TWIN(cudaError_t, cudaStreamEndCapture, _ptsz, (cudaStream_t stream, cudaGraph_t *pGraph),
        (stream, pGraph)) {
  ENTER();
  return RT_CALL(capture_end, rt_stream(stream, per_thread), (CUgraph *)pGraph);
}

RT_TWIN(cudaError_t, cudaStreamIsCapturing, _ptsz,
        (cudaStream_t stream, enum cudaStreamCaptureStatus *pCaptureStatus),
        (stream, pCaptureStatus)) {
  if (!pCaptureStatus) return rt_ret(cudaErrorInvalidValue);
  ENTER();
  return RT_CALL(capture_is, rt_stream(stream, per_thread),
                 (CUstreamCaptureStatus *)pCaptureStatus);
}

RT_TWIN(cudaError_t, cudaStreamGetCaptureInfo, _ptsz,
        (cudaStream_t stream, enum cudaStreamCaptureStatus *captureStatus_out,
         unsigned long long *id_out, cudaGraph_t *graph_out,
         const cudaGraphNode_t **dependencies_out, const cudaGraphEdgeData **edgeData_out,
         size_t *numDependencies_out),
        (stream, captureStatus_out, id_out, graph_out, dependencies_out, edgeData_out,
         numDependencies_out)) {
  ENTER();
  return RT_CALL(capture_info, rt_stream(stream, per_thread),
                 (CUstreamCaptureStatus *)captureStatus_out, (cuuint64_t *)id_out,
                 (CUgraph *)graph_out, (const CUgraphNode **)dependencies_out,
                 (const CUgraphEdgeData **)edgeData_out, numDependencies_out);
}

/* The runtime's modes are the driver's, by number; the exchange needs no context. */
cudaError_t CUDARTAPI cudaThreadExchangeStreamCaptureMode(enum cudaStreamCaptureMode *mode) {
  if (!mode) return rt_ret(cudaErrorInvalidValue);
  cudaError_t e = rt_enter_noctx();
  if (e != cudaSuccess) return rt_ret(e);
  return RT_CALL(capture_mode, (CUstreamCaptureMode *)mode);
}

cudaError_t CUDARTAPI cudaGraphInstantiate(cudaGraphExec_t *pGraphExec, cudaGraph_t graph,
                                           unsigned long long flags) {
  if (!pGraphExec) return rt_ret(cudaErrorInvalidValue);
  ENTER();
  return RT_CALL(graph_instantiate, (CUgraphExec *)pGraphExec, (CUgraph)graph, flags);
}

cudaError_t CUDARTAPI cudaGraphInstantiateWithFlags(cudaGraphExec_t *pGraphExec, cudaGraph_t graph,
                                                    unsigned long long flags) {
  return cudaGraphInstantiate(pGraphExec, graph, flags);
}

RT_TWIN(cudaError_t, cudaGraphLaunch, _ptsz, (cudaGraphExec_t graphExec, cudaStream_t stream),
        (graphExec, stream)) {
  ENTER();
  return per_thread ? RT_CALL(graph_launch_pt, (CUgraphExec)graphExec, (CUstream)stream)
                    : RT_CALL(graph_launch, (CUgraphExec)graphExec, (CUstream)stream);
}

cudaError_t CUDARTAPI cudaGraphExecDestroy(cudaGraphExec_t graphExec) {
  ENTER();
  return RT_CALL(graph_exec_destroy, (CUgraphExec)graphExec);
}

cudaError_t CUDARTAPI cudaGraphDestroy(cudaGraph_t graph) {
  ENTER();
  return RT_CALL(graph_destroy, (CUgraph)graph);
}
