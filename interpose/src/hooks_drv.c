/* The driver-API hooks: allocation, VMM, pinned host memory, launches, stream capture and the
 * cuGetProcAddress door. Each one calls the real entry point it stands for (never by name). */
#include "internal.h"

#include <errno.h>
#include <string.h>

/* The deprecated launch entry points (cuLaunch, cuLaunchGrid[Async], cuFuncSetBlockShape,
 * cuLaunchCooperativeKernelMultiDevice) are still exported and called: we hook them. */
#pragma GCC diagnostic ignored "-Wdeprecated-declarations"

/* cuda.h maps these names to their newest version; here they are the legacy exports. */
#undef cuGetProcAddress
#undef cuStreamBeginCapture
#undef cuGraphInstantiate
#undef cuGraphExecUpdate
#undef cuGraphExecKernelNodeSetParams
#undef cuGraphAddNode
#undef cuIpcOpenMemHandle
#undef cuDevicePrimaryCtxReset
#undef cuCtxDestroy

/* Exports cuda.h does not declare without per-thread-stream or internal macros: same ABI as
 * their base names (the _ptsz twins), or the legacy versions' ABI. */
CUresult cuMemAllocAsync_ptsz(CUdeviceptr *, size_t, CUstream);
CUresult cuMemFreeAsync_ptsz(CUdeviceptr, CUstream);
CUresult cuMemAllocFromPoolAsync_ptsz(CUdeviceptr *, size_t, CUmemoryPool, CUstream);
CUresult cuLaunchKernel_ptsz(CUfunction, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned,
                             unsigned, CUstream, void **, void **);
CUresult cuLaunchKernelEx_ptsz(const CUlaunchConfig *, CUfunction, void **, void **);
CUresult cuLaunchCooperativeKernel_ptsz(CUfunction, unsigned, unsigned, unsigned, unsigned,
                                        unsigned, unsigned, unsigned, CUstream, void **);
CUresult cuGraphLaunch_ptsz(CUgraphExec, CUstream);
CUresult cuStreamBeginCapture(CUstream);
CUresult cuStreamBeginCapture_ptsz(CUstream);
CUresult cuStreamBeginCapture_v2_ptsz(CUstream, CUstreamCaptureMode);
CUresult cuStreamBeginCaptureToGraph_ptsz(CUstream, CUgraph, const CUgraphNode *,
                                          const CUgraphEdgeData *, size_t, CUstreamCaptureMode);
CUresult cuStreamEndCapture_ptsz(CUstream, CUgraph *);
CUresult cuGetProcAddress(const char *, void **, int, cuuint64_t);
CUresult cuGraphInstantiate(CUgraphExec *, CUgraph, CUgraphNode *, char *, size_t);
CUresult cuGraphInstantiate_v2(CUgraphExec *, CUgraph, CUgraphNode *, char *, size_t);
CUresult cuGraphInstantiateWithParams_ptsz(CUgraphExec *, CUgraph, CUDA_GRAPH_INSTANTIATE_PARAMS *);
CUresult cuGraphExecUpdate(CUgraphExec, CUgraph, CUgraphNode *, CUgraphExecUpdateResult *);
CUresult cuGraphExecKernelNodeSetParams(CUgraphExec, CUgraphNode,
                                        const CUDA_KERNEL_NODE_PARAMS_v1 *);
CUresult cuGraphAddNode(CUgraphNode *, CUgraph, const CUgraphNode *, size_t, CUgraphNodeParams *);
CUresult cuIpcOpenMemHandle(CUdeviceptr *, CUipcMemHandle, unsigned int);
CUresult cuDevicePrimaryCtxReset(CUdevice);
CUresult cuCtxDestroy(CUcontext);

#define REAL(n) ((__typeof__(&n))wl__real(WL__H_##n))

/* The real entry point, or a driver-like error when there is none (no driver loaded). */
#define GET_REAL(n)                                                                                \
  __typeof__(&n) real = REAL(n);                                                                   \
  if (WL_UNLIKELY(!real)) return CUDA_ERROR_NOT_INITIALIZED

/* Runs the real call with our hooks passing through, should the driver reach one of its own
 * exported entry points (which the preload would route to us). */
#define NESTED(call)                                                                               \
  ({                                                                                               \
    WL_NEST_BEGIN();                                                                               \
    __typeof__(call) r_ = (call);                                                                  \
    WL_NEST_END();                                                                                 \
    r_;                                                                                            \
  })

/* A hook passes straight through when the mode is off or when one of our hooks called it. */
#define PASS(mode) ((mode) == WL__MODE_OFF || wl__tls.depth)

/* The per-thread default stream of a _ptsz entry point, for our own stream-ordered work. */
static inline CUstream ptsz_stream(CUstream s) {
  return s ? s : CU_STREAM_PER_THREAD;
}

/* alloc/gate mode: serve from liballoc. 1 when it decided (*res set), 0 to pass through. While
 * captures are in progress the driver's: an allocation on a capturing stream (a graph memory
 * node), and a synchronous one (sync) where a capture prohibits it for this thread (the driver
 * refuses it and invalidates the capture, as without us). */
static int serve(int mode, CUdeviceptr *dptr, size_t size, CUstream stream, bool sync,
                 CUresult *res) {
  if (mode < WL__MODE_ALLOC || !dptr || !size) return 0;
  if (WL_UNLIKELY(__atomic_load_n(&wl__captures, __ATOMIC_RELAXED)) &&
      (sync ? wl__capture_prohibits() : wl__stream_capturing(stream)))
    return 0;
  uintptr_t p;
  int r = wl__serve_alloc(size, stream, sync, &p);
  if (r == 1) {
    *dptr = (CUdeviceptr)p;
    *res = CUDA_SUCCESS;
    return 1;
  }
  if (r < 0) {
    *res = CUDA_ERROR_OUT_OF_MEMORY;
    return 1;
  }
  return 0;
}

/* ---- device memory ---------------------------------------------------------------------------*/

static CUresult alloc_done(CUresult r, CUdeviceptr *dptr, size_t size, unsigned kind,
                           CUstream stream) {
  if (r == CUDA_SUCCESS && dptr)
    wl__track_alloc((uintptr_t)*dptr, size, kind, stream);
  else
    wl__serve_unbook_kind(kind, size);
  return r;
}

/* A device allocation passing through (a program's pool, a device whose VMM the driver refused,
 * a context the program created), booked first: the budget holds all of the group's memory. */
#define PASS_BOOKED(mode, size, call, dptr, kind, stream)                                          \
  ({                                                                                               \
    int bk_ = (mode) >= WL__MODE_ALLOC ? wl__serve_book_pass(size, __func__, stream) : 0;          \
    bk_ < 0 ? CUDA_ERROR_OUT_OF_MEMORY                                                             \
            : alloc_done(NESTED(call), dptr, size, (kind) | (unsigned)bk_, stream);                \
  })

WL_HOOK CUresult cuMemAlloc_v2(CUdeviceptr *dptr, size_t size) {
  GET_REAL(cuMemAlloc_v2);
  int mode = wl__mode();
  if (PASS(mode)) return real(dptr, size);
  CUresult res;
  if (serve(mode, dptr, size, NULL, true, &res)) return res;
  return PASS_BOOKED(mode, size, real(dptr, size), dptr, WL__K_DEVICE, NULL);
}

/* Pitched memory is never served (liballoc does not pitch rows); it passes through booked, in
 * any context. The pitch is the driver's choice, known after the call: rows of 512 bytes (what
 * drivers give) are booked before it, and the difference settled after. A wider pitch whose
 * rest does not fit gives the allocation back as out of memory. */
#define PITCH_GUESS 512u

WL_HOOK CUresult cuMemAllocPitch_v2(CUdeviceptr *dptr, size_t *pitch, size_t width, size_t height,
                                    unsigned int elem) {
  GET_REAL(cuMemAllocPitch_v2);
  int mode = wl__mode();
  if (PASS(mode)) return real(dptr, pitch, width, height, elem);
  size_t row = (width + PITCH_GUESS - 1) & ~(size_t)(PITCH_GUESS - 1), guess = 0;
  if (dptr && pitch && row >= width && height && row <= SIZE_MAX / height) guess = row * height;
  int bk = mode >= WL__MODE_ALLOC ? wl__serve_book_pass(guess, __func__, NULL) : 0;
  if (bk < 0) return CUDA_ERROR_OUT_OF_MEMORY;
  CUresult r = NESTED(real(dptr, pitch, width, height, elem));
  size_t size = r == CUDA_SUCCESS && pitch ? *pitch * height : 0;
  if (bk && r != CUDA_SUCCESS) {
    wl__serve_unbook_kind((unsigned)bk, guess);
    return r;
  }
  int dev = (int)(((unsigned)bk >> 8) & 0xffu);
  if (bk && size < guess) wl__serve_unbook(dev, guess - size);
  if (bk && size > guess && wl__serve_book(dev, size - guess, __func__) < 0) {
    __typeof__(&cuMemFree_v2) fr = REAL(cuMemFree_v2);
    if (fr) NESTED(fr(*dptr));
    wl__serve_unbook(dev, guess);
    return CUDA_ERROR_OUT_OF_MEMORY;
  }
  return alloc_done(r, dptr, size, WL__K_PITCH | (unsigned)bk, NULL);
}

WL_HOOK CUresult cuMemAllocManaged(CUdeviceptr *dptr, size_t size, unsigned int flags) {
  GET_REAL(cuMemAllocManaged);
  int mode = wl__mode();
  if (PASS(mode)) return real(dptr, size, flags);
  return alloc_done(NESTED(real(dptr, size, flags)), dptr, size, WL__K_MANAGED, NULL);
}

static inline CUresult free_sync(__typeof__(&cuMemFree_v2) real, CUdeviceptr p) {
  wl__freeinfo_t fi;
  int served = wl__free_begin((uintptr_t)p, NULL, true, &fi);
  if (served) return served > 0 ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
  CUresult r = NESTED(real(p));
  wl__free_end((uintptr_t)p, NULL, &fi, r == CUDA_SUCCESS);
  return r;
}

/* While captures are in progress (out of line: the common path only tests the count). A served
 * block where a capture prohibits the free gets the driver's refusal (it refuses before looking
 * at the pointer) and stays the program's; any other answer means the driver did not prohibit it
 * after all: freed as usual. */
static __attribute__((noinline, cold)) CUresult free_sync_captured(__typeof__(&cuMemFree_v2) real,
                                                                   CUdeviceptr p) {
  if (wl__serve_owns((uintptr_t)p) && wl__capture_prohibits()) {
    CUresult r = NESTED(real(p));
    if (r == CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED) return r;
  }
  return free_sync(real, p);
}

WL_HOOK CUresult cuMemFree_v2(CUdeviceptr p) {
  GET_REAL(cuMemFree_v2);
  int mode = wl__mode();
  if (PASS(mode)) return real(p);
  if (WL_UNLIKELY(__atomic_load_n(&wl__captures, __ATOMIC_RELAXED)))
    return free_sync_captured(real, p);
  return free_sync(real, p);
}

WL_HOOK CUresult cuMemAllocAsync(CUdeviceptr *dptr, size_t size, CUstream s) {
  GET_REAL(cuMemAllocAsync);
  int mode = wl__mode();
  if (PASS(mode)) return real(dptr, size, s);
  CUresult res;
  if (wl__serve_current_pool() && serve(mode, dptr, size, s, false, &res)) return res;
  return PASS_BOOKED(mode, size, real(dptr, size, s), dptr, WL__K_ASYNC, s);
}

WL_HOOK CUresult cuMemAllocAsync_ptsz(CUdeviceptr *dptr, size_t size, CUstream s) {
  GET_REAL(cuMemAllocAsync_ptsz);
  int mode = wl__mode();
  if (PASS(mode)) return real(dptr, size, s);
  CUresult res;
  if (wl__serve_current_pool() && serve(mode, dptr, size, ptsz_stream(s), false, &res)) return res;
  return PASS_BOOKED(mode, size, real(dptr, size, s), dptr, WL__K_ASYNC, ptsz_stream(s));
}

/* Peer access reaches cuMemAlloc memory and pool memory opened with cuMemPoolSetAccess, not VMM
 * memory, which needs cuMemSetAccess: served memory is opened to the peer by hand. */
WL_HOOK CUresult cuCtxEnablePeerAccess(CUcontext peer, unsigned int flags) {
  GET_REAL(cuCtxEnablePeerAccess);
  int mode = wl__mode();
  if (PASS(mode)) return real(peer, flags);
  CUresult r = NESTED(real(peer, flags));
  if (r == CUDA_SUCCESS && mode >= WL__MODE_ALLOC)
    wl__serve_grant(wl__context_device(peer), wl__current_device(NULL));
  return r;
}

WL_HOOK CUresult cuMemPoolSetAccess(CUmemoryPool pool, const CUmemAccessDesc *map, size_t count) {
  GET_REAL(cuMemPoolSetAccess);
  int mode = wl__mode();
  if (PASS(mode)) return real(pool, map, count);
  CUresult r = NESTED(real(pool, map, count));
  if (r == CUDA_SUCCESS && mode >= WL__MODE_ALLOC) wl__serve_pool_access(pool, map, count);
  return r;
}

/* The program's choice of the device's current pool: cuMemAllocAsync is then that pool's. */
WL_HOOK CUresult cuDeviceSetMemPool(CUdevice dev, CUmemoryPool pool) {
  GET_REAL(cuDeviceSetMemPool);
  int mode = wl__mode();
  if (PASS(mode)) return real(dev, pool);
  CUresult r = NESTED(real(dev, pool));
  if (r == CUDA_SUCCESS) wl__serve_set_pool((int)dev, pool);
  return r;
}

/* A pool's allocation passing through: the pool decides where it is (another device's memory,
 * or host memory), so it is booked after the call where it landed, and given back on its stream
 * as out of memory when it does not fit. */
static CUresult pool_done(int mode, CUresult r, CUdeviceptr *dptr, size_t size, CUstream s) {
  int bk = 0;
  if (r == CUDA_SUCCESS && dptr && mode >= WL__MODE_ALLOC)
    bk = wl__serve_book_placed((uintptr_t)*dptr, size, "cuMemAllocFromPoolAsync");
  if (bk < 0) {
    __typeof__(&cuMemFreeAsync) fr = REAL(cuMemFreeAsync);
    if (fr) NESTED(fr(*dptr, s));
    *dptr = 0;
    return CUDA_ERROR_OUT_OF_MEMORY;
  }
  return alloc_done(r, dptr, size, WL__K_ASYNC | (unsigned)bk, s);
}

WL_HOOK CUresult cuMemAllocFromPoolAsync(CUdeviceptr *dptr, size_t size, CUmemoryPool pool,
                                         CUstream s) {
  GET_REAL(cuMemAllocFromPoolAsync);
  int mode = wl__mode();
  if (PASS(mode)) return real(dptr, size, pool, s);
  CUresult res;
  if (wl__serve_pool(pool, s) && serve(mode, dptr, size, s, false, &res)) return res;
  return pool_done(mode, NESTED(real(dptr, size, pool, s)), dptr, size, s);
}

WL_HOOK CUresult cuMemAllocFromPoolAsync_ptsz(CUdeviceptr *dptr, size_t size, CUmemoryPool pool,
                                              CUstream s) {
  GET_REAL(cuMemAllocFromPoolAsync_ptsz);
  int mode = wl__mode();
  if (PASS(mode)) return real(dptr, size, pool, s);
  CUresult res;
  if (wl__serve_pool(pool, ptsz_stream(s)) && serve(mode, dptr, size, ptsz_stream(s), false, &res))
    return res;
  return pool_done(mode, NESTED(real(dptr, size, pool, s)), dptr, size, ptsz_stream(s));
}

WL_HOOK CUresult cuMemFreeAsync(CUdeviceptr p, CUstream s) {
  GET_REAL(cuMemFreeAsync);
  int mode = wl__mode();
  if (PASS(mode)) return real(p, s);
  wl__freeinfo_t fi;
  int served = wl__free_begin((uintptr_t)p, s, false, &fi);
  if (served) return served > 0 ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
  CUresult r = NESTED(real(p, s));
  wl__free_end((uintptr_t)p, s, &fi, r == CUDA_SUCCESS);
  return r;
}

WL_HOOK CUresult cuMemFreeAsync_ptsz(CUdeviceptr p, CUstream s) {
  GET_REAL(cuMemFreeAsync_ptsz);
  int mode = wl__mode();
  if (PASS(mode)) return real(p, s);
  wl__freeinfo_t fi;
  int served = wl__free_begin((uintptr_t)p, ptsz_stream(s), false, &fi);
  if (served) return served > 0 ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
  CUresult r = NESTED(real(p, s));
  wl__free_end((uintptr_t)p, ptsz_stream(s), &fi, r == CUDA_SUCCESS);
  return r;
}

WL_HOOK CUresult cuMemGetInfo_v2(size_t *free_b, size_t *total_b) {
  GET_REAL(cuMemGetInfo_v2);
  int mode = wl__mode();
  CUresult r = NESTED(real(free_b, total_b));
  if (r == CUDA_SUCCESS && mode >= WL__MODE_ALLOC && !wl__tls.depth && free_b && total_b)
    wl__serve_meminfo(free_b, total_b);
  return r;
}

/* CUDA IPC (ipc.c): served memory, a VMM mapping the driver has no IPC handle for, is exported
 * as handles of ours, which only processes under libwavelet.so open; the driver's handles pass
 * through both ways. Where served memory cannot be shared (the driver would not make its chunks
 * shareable) the driver answers, and it is said once. */
WL_HOOK CUresult cuIpcGetMemHandle(CUipcMemHandle *h, CUdeviceptr p) {
  GET_REAL(cuIpcGetMemHandle);
  int mode = wl__mode();
  wl_alloc_t *a = PASS(mode) || mode < WL__MODE_ALLOC || !h ? NULL : wl__serve_alloc_of(p);
  int rc = a ? wl__ipc_export(a, (uintptr_t)p, h) : -ENOENT;
  if (rc == 0) return CUDA_SUCCESS;
  if (rc == -EINVAL) return CUDA_ERROR_INVALID_VALUE; /* not the start of a live allocation */
  if (rc == -ENOMEM) return CUDA_ERROR_OUT_OF_MEMORY;
  CUresult r = NESTED(real(h, p));
  if (r != CUDA_SUCCESS && a)
    wl__warn_once("cuIpcGetMemHandle(%#llx): memory served by liballoc cannot be shared here "
                  "(%s; the driver answered %d); run processes that share device memory through "
                  "CUDA IPC with WAVELET_MODE=trace",
                  (unsigned long long)p, strerror(-rc), (int)r);
  return r;
}

static CUresult ipc_open(__typeof__(&cuIpcOpenMemHandle_v2) real, CUdeviceptr *pdptr,
                         CUipcMemHandle h, unsigned flags) {
  CUresult r;
  if (!PASS(wl__mode()) && pdptr && wl__ipc_open(pdptr, &h, flags, &r)) return r;
  return NESTED(real(pdptr, h, flags));
}

WL_HOOK CUresult cuIpcOpenMemHandle(CUdeviceptr *pdptr, CUipcMemHandle h, unsigned flags) {
  GET_REAL(cuIpcOpenMemHandle);
  return ipc_open(real, pdptr, h, flags);
}

WL_HOOK CUresult cuIpcOpenMemHandle_v2(CUdeviceptr *pdptr, CUipcMemHandle h, unsigned flags) {
  GET_REAL(cuIpcOpenMemHandle_v2);
  return ipc_open(real, pdptr, h, flags);
}

WL_HOOK CUresult cuIpcCloseMemHandle(CUdeviceptr p) {
  GET_REAL(cuIpcCloseMemHandle);
  CUresult r;
  if (!PASS(wl__mode()) && wl__ipc_close((uintptr_t)p, &r)) return r;
  return NESTED(real(p));
}

/* ---- VMM: handles are physical memory, mappings make it visible -----------------------------*/

WL_HOOK CUresult cuMemCreate(CUmemGenericAllocationHandle *h, size_t size,
                             const CUmemAllocationProp *prop, unsigned long long flags) {
  GET_REAL(cuMemCreate);
  int mode = wl__mode();
  if (PASS(mode)) return real(h, size, prop, flags);
  /* Host-NUMA handles (NCCL's cuMem host buffers) are not device memory. */
  int dev = prop && prop->location.type == CU_MEM_LOCATION_TYPE_DEVICE ? prop->location.id : -1;
  int booked = 1;
  if (mode >= WL__MODE_ALLOC && dev >= 0 && h && size) {
    booked = wl__serve_book(dev, size, "cuMemCreate");
    if (booked < 0) return CUDA_ERROR_OUT_OF_MEMORY;
  }
  CUresult r = NESTED(real(h, size, prop, flags));
  if (r != CUDA_SUCCESS || dev < 0) {
    if (booked == 0) wl__serve_unbook(dev, size);
    return r;
  }
  wl__vmm_created((uintptr_t)*h, size, dev, booked == 0);
  return r;
}

WL_HOOK CUresult cuMemRelease(CUmemGenericAllocationHandle h) {
  GET_REAL(cuMemRelease);
  int mode = wl__mode();
  if (PASS(mode)) return real(h);
  wl__vmm_op_t op;
  wl__vmm_release_begin((uintptr_t)h, &op);
  CUresult r = NESTED(real(h));
  wl__vmm_end(&op, r == CUDA_SUCCESS);
  return r;
}

WL_HOOK CUresult cuMemRetainAllocationHandle(CUmemGenericAllocationHandle *h, void *addr) {
  GET_REAL(cuMemRetainAllocationHandle);
  int mode = wl__mode();
  if (PASS(mode)) return real(h, addr);
  CUresult r = NESTED(real(h, addr));
  if (r == CUDA_SUCCESS && h) wl__vmm_retained((uintptr_t)*h);
  return r;
}

/* Another process's memory: recorded for its mappings, never booked (see vmm.c). */
WL_HOOK CUresult cuMemImportFromShareableHandle(CUmemGenericAllocationHandle *h, void *os,
                                                CUmemAllocationHandleType type) {
  GET_REAL(cuMemImportFromShareableHandle);
  int mode = wl__mode();
  if (PASS(mode)) return real(h, os, type);
  CUresult r = NESTED(real(h, os, type));
  if (r == CUDA_SUCCESS && h) wl__vmm_imported((uintptr_t)*h);
  return r;
}

WL_HOOK CUresult cuMemMap(CUdeviceptr ptr, size_t size, size_t offset,
                          CUmemGenericAllocationHandle h, unsigned long long flags) {
  GET_REAL(cuMemMap);
  int mode = wl__mode();
  CUresult r = NESTED(real(ptr, size, offset, h, flags));
  if (PASS(mode) || r != CUDA_SUCCESS) return r;
  wl__vmm_mapped((uintptr_t)ptr, size, (uintptr_t)h);
  return r;
}

WL_HOOK CUresult cuMemUnmap(CUdeviceptr ptr, size_t size) {
  GET_REAL(cuMemUnmap);
  int mode = wl__mode();
  if (PASS(mode)) return real(ptr, size);
  wl__vmm_op_t op;
  wl__vmm_unmap_begin((uintptr_t)ptr, size, &op);
  CUresult r = NESTED(real(ptr, size));
  wl__vmm_end(&op, r == CUDA_SUCCESS);
  return r;
}

/* ---- pinned host memory ----------------------------------------------------------------------*/

/* alloc/gate modes: the pinned arena first; trace mode: the driver, accounted. */
static CUresult host_alloc(int mode, void **pp, size_t size, unsigned flags) {
  if (mode < WL__MODE_ALLOC || !pp) return CUDA_ERROR_NOT_SUPPORTED;
  void *p = wl__pinned_serve(size, flags);
  if (!p) return CUDA_ERROR_NOT_SUPPORTED;
  *pp = p;
  wl__track_alloc((uintptr_t)p, size, WL__K_HOST, NULL);
  return CUDA_SUCCESS;
}

WL_HOOK CUresult cuMemAllocHost_v2(void **pp, size_t size) {
  GET_REAL(cuMemAllocHost_v2);
  int mode = wl__mode();
  if (PASS(mode)) return real(pp, size);
  if (host_alloc(mode, pp, size, 0) == CUDA_SUCCESS) return CUDA_SUCCESS;
  CUresult r = NESTED(real(pp, size));
  if (r == CUDA_SUCCESS && pp) wl__track_alloc((uintptr_t)*pp, size, WL__K_HOST, NULL);
  return r;
}

WL_HOOK CUresult cuMemHostAlloc(void **pp, size_t size, unsigned int flags) {
  GET_REAL(cuMemHostAlloc);
  int mode = wl__mode();
  if (PASS(mode)) return real(pp, size, flags);
  if (host_alloc(mode, pp, size, flags) == CUDA_SUCCESS) return CUDA_SUCCESS;
  CUresult r = NESTED(real(pp, size, flags));
  if (r == CUDA_SUCCESS && pp) wl__track_alloc((uintptr_t)*pp, size, WL__K_HOST, NULL);
  return r;
}

WL_HOOK CUresult cuMemFreeHost(void *p) {
  GET_REAL(cuMemFreeHost);
  int mode = wl__mode();
  if (PASS(mode)) return real(p);
  wl__freeinfo_t fi;
  wl__free_begin_host((uintptr_t)p, &fi);
  int rc = wl__pinned_release(p);
  if (rc != -ENOENT) { /* the arena's: freed, or a bad free that must not reach the driver */
    wl__free_end((uintptr_t)p, NULL, &fi, rc == 0);
    return rc == 0 ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
  }
  CUresult r = NESTED(real(p));
  wl__free_end((uintptr_t)p, NULL, &fi, r == CUDA_SUCCESS);
  return r;
}

/* An arena block's flags are those it was asked for (the driver, at its address, would answer
 * for the arena's chunk); anything else is the driver's. */
WL_HOOK CUresult cuMemHostGetFlags(unsigned int *pf, void *p) {
  GET_REAL(cuMemHostGetFlags);
  int mode = wl__mode();
  unsigned f;
  if (!PASS(mode) && mode >= WL__MODE_ALLOC && pf && wl__pinned_flags(p, &f)) {
    *pf = f;
    return CUDA_SUCCESS;
  }
  return NESTED(real(pf, p));
}

/* ---- device reset ----------------------------------------------------------------------------
 * The driver destroys the device's allocations, streams and events: ours on it go first, while
 * they can still be destroyed properly (reset.c). */

static CUresult device_reset(CUresult (*real)(CUdevice), CUdevice dev) {
  if (WL_UNLIKELY(!real)) return CUDA_ERROR_NOT_INITIALIZED;
  int mode = wl__mode();
  if (PASS(mode)) return real(dev);
  wl__device_reset((int)dev);
  return NESTED(real(dev));
}

WL_HOOK CUresult cuDevicePrimaryCtxReset_v2(CUdevice dev) {
  return device_reset(REAL(cuDevicePrimaryCtxReset_v2), dev);
}

WL_HOOK CUresult cuDevicePrimaryCtxReset(CUdevice dev) {
  return device_reset(REAL(cuDevicePrimaryCtxReset), dev);
}

/* A context the program created goes with everything cuCtxDestroy is documented to destroy
 * (reset.c). The primary context is not the program's to destroy: the driver refuses, and
 * nothing is done. */
static CUresult ctx_destroy(CUresult (*real)(CUcontext), CUcontext ctx) {
  if (WL_UNLIKELY(!real)) return CUDA_ERROR_NOT_INITIALIZED;
  int mode = wl__mode();
  if (PASS(mode) || !ctx) return real(ctx);
  wl__context_destroy(ctx);
  return NESTED(real(ctx));
}

WL_HOOK CUresult cuCtxDestroy_v2(CUcontext ctx) {
  return ctx_destroy(REAL(cuCtxDestroy_v2), ctx);
}

WL_HOOK CUresult cuCtxDestroy(CUcontext ctx) {
  return ctx_destroy(REAL(cuCtxDestroy), ctx);
}

/* ---- streams ---------------------------------------------------------------------------------*/

/* liballoc keys its stream-ordered reuse by handle: it must forget a stream before the handle
 * dies, or it keeps serving (and freeing) on the dead handle where the driver refuses, and a new
 * stream the driver makes at the same address would be taken for the old one. */
WL_HOOK CUresult cuStreamDestroy_v2(CUstream s) {
  GET_REAL(cuStreamDestroy_v2);
  int mode = wl__mode();
  if (PASS(mode)) return real(s);
  if (mode >= WL__MODE_ALLOC) wl__serve_stream_destroy(s);
  return NESTED(real(s));
}

/* ---- launches --------------------------------------------------------------------------------
 * The common case is a few loads and a jump to the real launch: mode known, no trace, and in
 * gate mode the same thread as the last launch and no gate entry wanted. Anything else goes to
 * the hook's _slow twin (same arguments, so both calls stay jumps and nothing is saved). No
 * nesting around the real launch: a driver does not launch through its own exports. */

enum { LAUNCH_SLOW = 0, LAUNCH_PASS = 1, LAUNCH_TRACE = 2 };

/* LAUNCH_PASS: jump to the real launch; LAUNCH_TRACE: a trace is on and no gate (trace or alloc
 * mode): the hook's _traced twin counts, records and jumps; LAUNCH_SLOW: the _slow twin. */
static inline int launch_fast(void) {
  int mode = __atomic_load_n(&wl__mode_now, __ATOMIC_ACQUIRE);
  if (WL_UNLIKELY(mode < 0)) return LAUNCH_SLOW;
  if (mode == WL__MODE_OFF || wl__tls.depth) return LAUNCH_PASS;
  wl__stats_t *st = wl__st;
  if (WL_UNLIKELY(!st)) return LAUNCH_SLOW;
  if (WL_UNLIKELY(__atomic_load_n(&wl__trace, __ATOMIC_RELAXED) != NULL))
    return mode == WL__MODE_GATE ? LAUNCH_SLOW : LAUNCH_TRACE;
  if (mode == WL__MODE_GATE) {
    /* While a capture is in progress, launches are looked at: NCCL's mark their graph. */
    uint32_t tid = wl__tls.tid;
    if (WL_UNLIKELY(!tid || tid != __atomic_load_n(&wl__gate_last_launch_tid, __ATOMIC_RELAXED) ||
                    __atomic_load_n(&wl__gate_want, __ATOMIC_RELAXED) ||
                    __atomic_load_n(&wl__captures, __ATOMIC_RELAXED)))
      return LAUNCH_SLOW;
  }
  __atomic_store_n(&st->v[WL__ST_LAUNCHES], st->v[WL__ST_LAUNCHES] + 1, __ATOMIC_RELAXED);
  return LAUNCH_PASS;
}

/* The traced launch (launch_fast said LAUNCH_TRACE): none of the _slow twin's re-checks, one
 * call to the writer with the fields in registers. */
#define LAUNCH_TRACED(hook, stream_of)                                                             \
  static SLOW CUresult hook##_traced(CUfunction f, unsigned gx, unsigned gy, unsigned gz,          \
                                     unsigned bx, unsigned by, unsigned bz, unsigned shmem,        \
                                     CUstream s, void **params, void **extra) {                    \
    __typeof__(&hook) real = FAST_REAL(hook);                                                      \
    wl__count(WL__ST_LAUNCHES, 1);                                                                 \
    const uint32_t g[3] = {gx, gy, gz};                                                            \
    wl_trace_writer_t *w = wl__tracer();                                                           \
    if (w)                                                                                         \
      wl_trace_emit_launch(w, (uint64_t)(uintptr_t)f, (uint64_t)bx *by *bz,                        \
                           (uint64_t)(uintptr_t)stream_of(s), g, 0);                               \
    return real(f, gx, gy, gz, bx, by, bz, shmem, s, params, extra);                               \
  }

#define FAST_REAL(n) ((__typeof__(&n))__atomic_load_n(&wl__real_fn[WL__H_##n], __ATOMIC_ACQUIRE))
#define SLOW         __attribute__((noinline))

static SLOW CUresult launch_slow(CUfunction f, unsigned gx, unsigned gy, unsigned gz, unsigned bx,
                                 unsigned by, unsigned bz, unsigned shmem, CUstream s,
                                 void **params, void **extra) {
  GET_REAL(cuLaunchKernel);
  int mode = wl__mode();
  if (!PASS(mode)) {
    const unsigned g[3] = {gx, gy, gz};
    wl__on_launch(mode, f, WL__FN_DRV, (uint64_t)bx * by * bz, s, g);
  }
  return real(f, gx, gy, gz, bx, by, bz, shmem, s, params, extra);
}

#define SAME_STREAM(s) (s)
LAUNCH_TRACED(cuLaunchKernel, SAME_STREAM)

WL_HOOK CUresult cuLaunchKernel(CUfunction f, unsigned gx, unsigned gy, unsigned gz, unsigned bx,
                                unsigned by, unsigned bz, unsigned shmem, CUstream s, void **params,
                                void **extra) {
  __typeof__(&cuLaunchKernel) real = FAST_REAL(cuLaunchKernel);
  int how = real ? launch_fast() : LAUNCH_SLOW;
  if (WL_LIKELY(how == LAUNCH_PASS))
    return real(f, gx, gy, gz, bx, by, bz, shmem, s, params, extra);
  if (how == LAUNCH_TRACE)
    return cuLaunchKernel_traced(f, gx, gy, gz, bx, by, bz, shmem, s, params, extra);
  return launch_slow(f, gx, gy, gz, bx, by, bz, shmem, s, params, extra);
}

static SLOW CUresult launch_ptsz_slow(CUfunction f, unsigned gx, unsigned gy, unsigned gz,
                                      unsigned bx, unsigned by, unsigned bz, unsigned shmem,
                                      CUstream s, void **params, void **extra) {
  GET_REAL(cuLaunchKernel_ptsz);
  int mode = wl__mode();
  if (!PASS(mode)) {
    const unsigned g[3] = {gx, gy, gz};
    wl__on_launch(mode, f, WL__FN_DRV, (uint64_t)bx * by * bz, ptsz_stream(s), g);
  }
  return real(f, gx, gy, gz, bx, by, bz, shmem, s, params, extra);
}

LAUNCH_TRACED(cuLaunchKernel_ptsz, ptsz_stream)

WL_HOOK CUresult cuLaunchKernel_ptsz(CUfunction f, unsigned gx, unsigned gy, unsigned gz,
                                     unsigned bx, unsigned by, unsigned bz, unsigned shmem,
                                     CUstream s, void **params, void **extra) {
  __typeof__(&cuLaunchKernel_ptsz) real = FAST_REAL(cuLaunchKernel_ptsz);
  int how = real ? launch_fast() : LAUNCH_SLOW;
  if (WL_LIKELY(how == LAUNCH_PASS))
    return real(f, gx, gy, gz, bx, by, bz, shmem, s, params, extra);
  if (how == LAUNCH_TRACE)
    return cuLaunchKernel_ptsz_traced(f, gx, gy, gz, bx, by, bz, shmem, s, params, extra);
  return launch_ptsz_slow(f, gx, gy, gz, bx, by, bz, shmem, s, params, extra);
}

static inline void launch_ex(int mode, const CUlaunchConfig *c, CUfunction f, bool ptsz) {
  if (!c) return;
  const unsigned g[3] = {c->gridDimX, c->gridDimY, c->gridDimZ};
  CUstream s = ptsz ? ptsz_stream(c->hStream) : c->hStream;
  wl__on_launch(mode, f, WL__FN_DRV, (uint64_t)c->blockDimX * c->blockDimY * c->blockDimZ, s, g);
}

static SLOW CUresult launch_ex_slow(const CUlaunchConfig *c, CUfunction f, void **params,
                                    void **extra) {
  GET_REAL(cuLaunchKernelEx);
  int mode = wl__mode();
  if (!PASS(mode)) launch_ex(mode, c, f, false);
  return real(c, f, params, extra);
}

WL_HOOK CUresult cuLaunchKernelEx(const CUlaunchConfig *c, CUfunction f, void **params,
                                  void **extra) {
  __typeof__(&cuLaunchKernelEx) real = FAST_REAL(cuLaunchKernelEx);
  if (WL_LIKELY(real && launch_fast() == LAUNCH_PASS)) return real(c, f, params, extra);
  return launch_ex_slow(c, f, params, extra);
}

static SLOW CUresult launch_ex_ptsz_slow(const CUlaunchConfig *c, CUfunction f, void **params,
                                         void **extra) {
  GET_REAL(cuLaunchKernelEx_ptsz);
  int mode = wl__mode();
  if (!PASS(mode)) launch_ex(mode, c, f, true);
  return real(c, f, params, extra);
}

WL_HOOK CUresult cuLaunchKernelEx_ptsz(const CUlaunchConfig *c, CUfunction f, void **params,
                                       void **extra) {
  __typeof__(&cuLaunchKernelEx_ptsz) real = FAST_REAL(cuLaunchKernelEx_ptsz);
  if (WL_LIKELY(real && launch_fast() == LAUNCH_PASS)) return real(c, f, params, extra);
  return launch_ex_ptsz_slow(c, f, params, extra);
}

static SLOW CUresult coop_slow(CUfunction f, unsigned gx, unsigned gy, unsigned gz, unsigned bx,
                               unsigned by, unsigned bz, unsigned shmem, CUstream s,
                               void **params) {
  GET_REAL(cuLaunchCooperativeKernel);
  int mode = wl__mode();
  if (!PASS(mode)) {
    const unsigned g[3] = {gx, gy, gz};
    wl__on_launch(mode, f, WL__FN_DRV, (uint64_t)bx * by * bz, s, g);
  }
  return real(f, gx, gy, gz, bx, by, bz, shmem, s, params);
}

WL_HOOK CUresult cuLaunchCooperativeKernel(CUfunction f, unsigned gx, unsigned gy, unsigned gz,
                                           unsigned bx, unsigned by, unsigned bz, unsigned shmem,
                                           CUstream s, void **params) {
  __typeof__(&cuLaunchCooperativeKernel) real = FAST_REAL(cuLaunchCooperativeKernel);
  if (WL_LIKELY(real && launch_fast() == LAUNCH_PASS))
    return real(f, gx, gy, gz, bx, by, bz, shmem, s, params);
  return coop_slow(f, gx, gy, gz, bx, by, bz, shmem, s, params);
}

static SLOW CUresult coop_ptsz_slow(CUfunction f, unsigned gx, unsigned gy, unsigned gz,
                                    unsigned bx, unsigned by, unsigned bz, unsigned shmem,
                                    CUstream s, void **params) {
  GET_REAL(cuLaunchCooperativeKernel_ptsz);
  int mode = wl__mode();
  if (!PASS(mode)) {
    const unsigned g[3] = {gx, gy, gz};
    wl__on_launch(mode, f, WL__FN_DRV, (uint64_t)bx * by * bz, ptsz_stream(s), g);
  }
  return real(f, gx, gy, gz, bx, by, bz, shmem, s, params);
}

WL_HOOK CUresult cuLaunchCooperativeKernel_ptsz(CUfunction f, unsigned gx, unsigned gy, unsigned gz,
                                                unsigned bx, unsigned by, unsigned bz,
                                                unsigned shmem, CUstream s, void **params) {
  __typeof__(&cuLaunchCooperativeKernel_ptsz) real = FAST_REAL(cuLaunchCooperativeKernel_ptsz);
  if (WL_LIKELY(real && launch_fast() == LAUNCH_PASS))
    return real(f, gx, gy, gz, bx, by, bz, shmem, s, params);
  return coop_ptsz_slow(f, gx, gy, gz, bx, by, bz, shmem, s, params);
}

/* One launch on each device's stream: each is counted, traced and may enter the gate, as the
 * same launches made one by one would. */
static SLOW CUresult coop_multi_slow(CUDA_LAUNCH_PARAMS *list, unsigned n, unsigned flags) {
  GET_REAL(cuLaunchCooperativeKernelMultiDevice);
  int mode = wl__mode();
  if (!PASS(mode) && list)
    for (unsigned i = 0; i < n; i++) {
      const CUDA_LAUNCH_PARAMS *p = &list[i];
      const unsigned g[3] = {p->gridDimX, p->gridDimY, p->gridDimZ};
      wl__on_launch(mode, p->function, WL__FN_DRV,
                    (uint64_t)p->blockDimX * p->blockDimY * p->blockDimZ, p->hStream, g);
    }
  return real(list, n, flags);
}

WL_HOOK CUresult cuLaunchCooperativeKernelMultiDevice(CUDA_LAUNCH_PARAMS *list, unsigned n,
                                                      unsigned flags) {
  __typeof__(&cuLaunchCooperativeKernelMultiDevice) real =
      FAST_REAL(cuLaunchCooperativeKernelMultiDevice);
  /* launch_fast counts one launch: only a single-device list may take the fast path. */
  if (WL_LIKELY(real && n == 1 && launch_fast() == LAUNCH_PASS)) return real(list, n, flags);
  return coop_multi_slow(list, n, flags);
}

/* ---- the deprecated launches: cuLaunch and cuLaunchGrid (on the NULL stream), cuLaunchGridAsync.
 * Their block shape is what cuFuncSetBlockShape last gave the function, so that call is hooked
 * to remember it (threads per block, for the trace) in a small table that only grows: a
 * function found nowhere (the table full, or never shaped) is traced with 0 threads. Their
 * shared size and parameters (cuFuncSetSharedSize, cuParamSet*) do not matter here. */

enum { SHAPES = 1024 }; /* a power of two */
static struct {
  void *fn;
  uint64_t threads;
} shapes[SHAPES];

static inline unsigned shape_slot(const void *f, unsigned i) {
  uint64_t h = (uint64_t)(uintptr_t)f * 0x9e3779b97f4a7c15ull;
  return (unsigned)((h >> 40) + i) & (SHAPES - 1);
}

static void shape_set(void *f, uint64_t threads) {
  for (unsigned i = 0; i < SHAPES; i++) {
    unsigned k = shape_slot(f, i);
    void *cur = NULL;
    if (__atomic_compare_exchange_n(&shapes[k].fn, &cur, f, false, __ATOMIC_ACQ_REL,
                                    __ATOMIC_ACQUIRE) ||
        cur == f) {
      __atomic_store_n(&shapes[k].threads, threads, __ATOMIC_RELAXED);
      return;
    }
  }
  wl__warn_once("more than %d functions given a block shape by cuFuncSetBlockShape: the launches "
                "of the others are traced with 0 threads",
                SHAPES);
}

static uint64_t shape_threads(const void *f) {
  for (unsigned i = 0; i < SHAPES; i++) {
    unsigned k = shape_slot(f, i);
    void *cur = __atomic_load_n(&shapes[k].fn, __ATOMIC_ACQUIRE);
    if (cur == f) return __atomic_load_n(&shapes[k].threads, __ATOMIC_RELAXED);
    if (!cur) break;
  }
  return 0;
}

WL_HOOK CUresult cuFuncSetBlockShape(CUfunction f, int x, int y, int z) {
  GET_REAL(cuFuncSetBlockShape);
  int mode = wl__mode();
  CUresult rc = real(f, x, y, z);
  if (!PASS(mode) && rc == CUDA_SUCCESS && f && x > 0 && y > 0 && z > 0)
    shape_set(f, (uint64_t)x * (uint64_t)y * (uint64_t)z);
  return rc;
}

static inline void legacy_launch(int mode, CUfunction f, int w, int h, CUstream s) {
  const unsigned g[3] = {(unsigned)w, (unsigned)h, 1};
  wl__on_launch(mode, f, WL__FN_DRV, shape_threads(f), s, g);
}

static SLOW CUresult launch_legacy_slow(CUfunction f) {
  GET_REAL(cuLaunch);
  int mode = wl__mode();
  if (!PASS(mode)) legacy_launch(mode, f, 1, 1, NULL);
  return real(f);
}

WL_HOOK CUresult cuLaunch(CUfunction f) {
  __typeof__(&cuLaunch) real = FAST_REAL(cuLaunch);
  if (WL_LIKELY(real && launch_fast() == LAUNCH_PASS)) return real(f);
  return launch_legacy_slow(f);
}

static SLOW CUresult launch_grid_slow(CUfunction f, int w, int h) {
  GET_REAL(cuLaunchGrid);
  int mode = wl__mode();
  if (!PASS(mode)) legacy_launch(mode, f, w, h, NULL);
  return real(f, w, h);
}

WL_HOOK CUresult cuLaunchGrid(CUfunction f, int w, int h) {
  __typeof__(&cuLaunchGrid) real = FAST_REAL(cuLaunchGrid);
  if (WL_LIKELY(real && launch_fast() == LAUNCH_PASS)) return real(f, w, h);
  return launch_grid_slow(f, w, h);
}

static SLOW CUresult launch_grid_async_slow(CUfunction f, int w, int h, CUstream s) {
  GET_REAL(cuLaunchGridAsync);
  int mode = wl__mode();
  if (!PASS(mode)) legacy_launch(mode, f, w, h, s);
  return real(f, w, h, s);
}

WL_HOOK CUresult cuLaunchGridAsync(CUfunction f, int w, int h, CUstream s) {
  __typeof__(&cuLaunchGridAsync) real = FAST_REAL(cuLaunchGridAsync);
  if (WL_LIKELY(real && launch_fast() == LAUNCH_PASS)) return real(f, w, h, s);
  return launch_grid_async_slow(f, w, h, s);
}

/* A whole graph is one launch, and one gate decision (never gated when it holds NCCL work,
 * see graph.c). */
WL_HOOK CUresult cuGraphLaunch(CUgraphExec g, CUstream s) {
  GET_REAL(cuGraphLaunch);
  int mode = wl__mode();
  if (!PASS(mode)) {
    wl__count(WL__ST_GRAPH_LAUNCHES, 1);
    wl__on_launch(mode, g, WL__FN_GRAPH, 0, s, NULL);
  }
  return real(g, s);
}

WL_HOOK CUresult cuGraphLaunch_ptsz(CUgraphExec g, CUstream s) {
  GET_REAL(cuGraphLaunch_ptsz);
  int mode = wl__mode();
  if (!PASS(mode)) {
    wl__count(WL__ST_GRAPH_LAUNCHES, 1);
    wl__on_launch(mode, g, WL__FN_GRAPH, 0, ptsz_stream(s), NULL);
  }
  return real(g, s);
}

/* ---- stream capture: the captures in progress, counted (launches and allocations ask the
 * driver about a stream only while one may be capturing) and recorded with their mode and thread
 * (capture.c: where the driver refuses synchronous allocations) --------------------------------*/

/* Counted and recorded before the real call (capture.c), and taken back when the driver refused;
 * the legacy entry points capture in GLOBAL mode. */
static CUresult capture_begun(CUresult r, CUstream s) {
  if (r != CUDA_SUCCESS) wl__capture_begin_failed(s);
  return r;
}

WL_HOOK CUresult cuStreamBeginCapture(CUstream s) {
  GET_REAL(cuStreamBeginCapture);
  wl__capture_begin(s, CU_STREAM_CAPTURE_MODE_GLOBAL);
  return capture_begun(NESTED(real(s)), s);
}

WL_HOOK CUresult cuStreamBeginCapture_ptsz(CUstream s) {
  GET_REAL(cuStreamBeginCapture_ptsz);
  wl__capture_begin(ptsz_stream(s), CU_STREAM_CAPTURE_MODE_GLOBAL);
  return capture_begun(NESTED(real(s)), ptsz_stream(s));
}

WL_HOOK CUresult cuStreamBeginCapture_v2(CUstream s, CUstreamCaptureMode m) {
  GET_REAL(cuStreamBeginCapture_v2);
  wl__capture_begin(s, (int)m);
  return capture_begun(NESTED(real(s, m)), s);
}

WL_HOOK CUresult cuStreamBeginCapture_v2_ptsz(CUstream s, CUstreamCaptureMode m) {
  GET_REAL(cuStreamBeginCapture_v2_ptsz);
  wl__capture_begin(ptsz_stream(s), (int)m);
  return capture_begun(NESTED(real(s, m)), ptsz_stream(s));
}

WL_HOOK CUresult cuStreamBeginCaptureToGraph(CUstream s, CUgraph g, const CUgraphNode *deps,
                                             const CUgraphEdgeData *data, size_t n,
                                             CUstreamCaptureMode m) {
  GET_REAL(cuStreamBeginCaptureToGraph);
  wl__capture_begin(s, (int)m);
  return capture_begun(NESTED(real(s, g, deps, data, n, m)), s);
}

WL_HOOK CUresult cuStreamBeginCaptureToGraph_ptsz(CUstream s, CUgraph g, const CUgraphNode *deps,
                                                  const CUgraphEdgeData *data, size_t n,
                                                  CUstreamCaptureMode m) {
  GET_REAL(cuStreamBeginCaptureToGraph_ptsz);
  wl__capture_begin(ptsz_stream(s), (int)m);
  return capture_begun(NESTED(real(s, g, deps, data, n, m)), ptsz_stream(s));
}

/* A capture that recorded NCCL work (by its id, asked before the capture ends) hands its mark
 * to the graph it returns; the capture is forgotten once over (after the real call: until then
 * synchronous allocations go to the driver). */
static CUresult capture_ended_graph(CUstream s, uint64_t id, CUresult r, CUgraph *g) {
  if (id) wl__graph_capture_ended(id, r, r == CUDA_SUCCESS && g ? *g : NULL);
  wl__capture_ended(s, r);
  return r;
}

WL_HOOK CUresult cuStreamEndCapture(CUstream s, CUgraph *g) {
  GET_REAL(cuStreamEndCapture);
  uint64_t id = wl__graph_capture_marked(s);
  return capture_ended_graph(s, id, NESTED(real(s, g)), g);
}

WL_HOOK CUresult cuStreamEndCapture_ptsz(CUstream s, CUgraph *g) {
  GET_REAL(cuStreamEndCapture_ptsz);
  uint64_t id = wl__graph_capture_marked(ptsz_stream(s));
  return capture_ended_graph(ptsz_stream(s), id, NESTED(real(s, g)), g);
}

/* ---- graphs: instantiation passes a graph's NCCL mark (or what inspecting it finds) on to the
 * executable graph, updates change it, destruction forgets it (gate mode only: nothing else
 * reads the marks). The tables follow the handles
 * whichever door they came through, so nesting does not matter here. ------------------------*/

static CUresult instantiated(int mode, CUresult r, CUgraphExec *e, CUgraph g) {
  if (mode == WL__MODE_GATE && r == CUDA_SUCCESS && e) wl__graph_instantiated(g, *e);
  return r;
}

WL_HOOK CUresult cuGraphInstantiate(CUgraphExec *e, CUgraph g, CUgraphNode *err, char *log,
                                    size_t n) {
  GET_REAL(cuGraphInstantiate);
  int mode = wl__mode();
  return instantiated(mode, NESTED(real(e, g, err, log, n)), e, g);
}

WL_HOOK CUresult cuGraphInstantiate_v2(CUgraphExec *e, CUgraph g, CUgraphNode *err, char *log,
                                       size_t n) {
  GET_REAL(cuGraphInstantiate_v2);
  int mode = wl__mode();
  return instantiated(mode, NESTED(real(e, g, err, log, n)), e, g);
}

WL_HOOK CUresult cuGraphInstantiateWithFlags(CUgraphExec *e, CUgraph g, unsigned long long flags) {
  GET_REAL(cuGraphInstantiateWithFlags);
  int mode = wl__mode();
  return instantiated(mode, NESTED(real(e, g, flags)), e, g);
}

WL_HOOK CUresult cuGraphInstantiateWithParams(CUgraphExec *e, CUgraph g,
                                              CUDA_GRAPH_INSTANTIATE_PARAMS *p) {
  GET_REAL(cuGraphInstantiateWithParams);
  int mode = wl__mode();
  return instantiated(mode, NESTED(real(e, g, p)), e, g);
}

WL_HOOK CUresult cuGraphInstantiateWithParams_ptsz(CUgraphExec *e, CUgraph g,
                                                   CUDA_GRAPH_INSTANTIATE_PARAMS *p) {
  GET_REAL(cuGraphInstantiateWithParams_ptsz);
  int mode = wl__mode();
  return instantiated(mode, NESTED(real(e, g, p)), e, g);
}

/* Changed after instantiation: an update takes its new graph's mark (inspected as at
 * instantiation), a kernel node set to one of NCCL's kernels marks the executable graph. */
WL_HOOK CUresult cuGraphExecUpdate(CUgraphExec e, CUgraph g, CUgraphNode *err,
                                   CUgraphExecUpdateResult *res) {
  GET_REAL(cuGraphExecUpdate);
  int mode = wl__mode();
  CUresult r = NESTED(real(e, g, err, res));
  if (mode == WL__MODE_GATE && r == CUDA_SUCCESS) wl__graph_exec_updated(e, g);
  return r;
}

WL_HOOK CUresult cuGraphExecUpdate_v2(CUgraphExec e, CUgraph g, CUgraphExecUpdateResultInfo *info) {
  GET_REAL(cuGraphExecUpdate_v2);
  int mode = wl__mode();
  CUresult r = NESTED(real(e, g, info));
  if (mode == WL__MODE_GATE && r == CUDA_SUCCESS) wl__graph_exec_updated(e, g);
  return r;
}

WL_HOOK CUresult cuGraphExecKernelNodeSetParams(CUgraphExec e, CUgraphNode n,
                                                const CUDA_KERNEL_NODE_PARAMS_v1 *p) {
  GET_REAL(cuGraphExecKernelNodeSetParams);
  int mode = wl__mode();
  CUresult r = NESTED(real(e, n, p));
  if (mode == WL__MODE_GATE && r == CUDA_SUCCESS && p) wl__graph_exec_kernel_set(e, p->func, NULL);
  return r;
}

WL_HOOK CUresult cuGraphExecKernelNodeSetParams_v2(CUgraphExec e, CUgraphNode n,
                                                   const CUDA_KERNEL_NODE_PARAMS *p) {
  GET_REAL(cuGraphExecKernelNodeSetParams_v2);
  int mode = wl__mode();
  CUresult r = NESTED(real(e, n, p));
  if (mode == WL__MODE_GATE && r == CUDA_SUCCESS && p)
    wl__graph_exec_kernel_set(e, p->func, p->kern);
  return r;
}

/* The generic form (12.2): a kernel node set to one of NCCL's kernels, or a child graph node
 * set to a graph holding NCCL work, marks the executable graph. */
WL_HOOK CUresult cuGraphExecNodeSetParams(CUgraphExec e, CUgraphNode n, CUgraphNodeParams *p) {
  GET_REAL(cuGraphExecNodeSetParams);
  int mode = wl__mode();
  CUresult r = NESTED(real(e, n, p));
  if (mode != WL__MODE_GATE || r != CUDA_SUCCESS || !p) return r;
  if (p->type == CU_GRAPH_NODE_TYPE_KERNEL)
    wl__graph_exec_kernel_set(e, p->kernel.func, p->kernel.kern);
  else if (p->type == CU_GRAPH_NODE_TYPE_GRAPH)
    wl__graph_exec_child_set(e, p->graph.graph);
  return r;
}

WL_HOOK CUresult cuGraphExecChildGraphNodeSetParams(CUgraphExec e, CUgraphNode n, CUgraph child) {
  GET_REAL(cuGraphExecChildGraphNodeSetParams);
  int mode = wl__mode();
  CUresult r = NESTED(real(e, n, child));
  if (mode == WL__MODE_GATE && r == CUDA_SUCCESS) wl__graph_exec_child_set(e, child);
  return r;
}

/* Nodes added by the generic form: a conditional node's body graphs are handed out only here,
 * so they are remembered for the inspection at instantiation. */
WL_HOOK CUresult cuGraphAddNode(CUgraphNode *n, CUgraph g, const CUgraphNode *deps, size_t nd,
                                CUgraphNodeParams *p) {
  GET_REAL(cuGraphAddNode);
  int mode = wl__mode();
  CUresult r = NESTED(real(n, g, deps, nd, p));
  if (mode == WL__MODE_GATE && r == CUDA_SUCCESS && n && p) wl__graph_node_added(g, *n, p);
  return r;
}

WL_HOOK CUresult cuGraphAddNode_v2(CUgraphNode *n, CUgraph g, const CUgraphNode *deps,
                                   const CUgraphEdgeData *data, size_t nd, CUgraphNodeParams *p) {
  GET_REAL(cuGraphAddNode_v2);
  int mode = wl__mode();
  CUresult r = NESTED(real(n, g, deps, data, nd, p));
  if (mode == WL__MODE_GATE && r == CUDA_SUCCESS && n && p) wl__graph_node_added(g, *n, p);
  return r;
}

WL_HOOK CUresult cuGraphDestroyNode(CUgraphNode n) {
  GET_REAL(cuGraphDestroyNode);
  int mode = wl__mode();
  CUresult r = NESTED(real(n));
  if (mode == WL__MODE_GATE && r == CUDA_SUCCESS) wl__graph_node_destroyed(n);
  return r;
}

/* Forgotten before the real call, so a handle the driver frees and hands out again at once (on
 * another thread) is never taken for the old one; put back when the driver refused. */
WL_HOOK CUresult cuGraphDestroy(CUgraph g) {
  GET_REAL(cuGraphDestroy);
  bool gate = wl__mode() == WL__MODE_GATE;
  int known = gate && wl__graph_forget(WL__GRAPH, g);
  /* Its conditional nodes' bodies go with it (should the driver refuse, a graph holding them
   * fails its inspection from then on: gated as one launch). */
  if (gate) wl__graph_destroyed(g);
  CUresult r = NESTED(real(g));
  if (known && r != CUDA_SUCCESS) wl__graph_remember(WL__GRAPH, g);
  return r;
}

WL_HOOK CUresult cuGraphExecDestroy(CUgraphExec e) {
  GET_REAL(cuGraphExecDestroy);
  int known = wl__mode() == WL__MODE_GATE && wl__graph_forget(WL__GRAPH_EXEC, e);
  CUresult r = NESTED(real(e));
  if (known && r != CUDA_SUCCESS) wl__graph_remember(WL__GRAPH_EXEC, e);
  return r;
}

/* ---- the cuGetProcAddress door ---------------------------------------------------------------
 * The real lookup answers (honouring version and flags); we hand back the wrapper whose real
 * target is exactly that pointer, or the pointer itself for anything we do not hook. The
 * lookup of cuGetProcAddress itself maps to these wrappers the same way. */

WL_HOOK CUresult cuGetProcAddress(const char *sym, void **pfn, int version, cuuint64_t flags) {
  GET_REAL(cuGetProcAddress);
  CUresult r = NESTED(real(sym, pfn, version, flags));
  if (r == CUDA_SUCCESS && pfn && *pfn && wl__mode() != WL__MODE_OFF)
    *pfn = wl__wrap_entry(sym, *pfn);
  return r;
}

WL_HOOK CUresult cuGetProcAddress_v2(const char *sym, void **pfn, int version, cuuint64_t flags,
                                     CUdriverProcAddressQueryResult *status) {
  GET_REAL(cuGetProcAddress_v2);
  CUresult r = NESTED(real(sym, pfn, version, flags, status));
  if (r == CUDA_SUCCESS && pfn && *pfn && wl__mode() != WL__MODE_OFF)
    *pfn = wl__wrap_entry(sym, *pfn);
  return r;
}
