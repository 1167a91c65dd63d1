/* The runtime-API hooks (where libcudart is a shared library): the runtime twins of the driver
 * hooks. While one runs, the driver hooks it reaches pass through (no double accounting). */
#include "internal.h"

/* cudaGetDriverEntryPoint is deprecated, and still called: we hook it. */
#pragma GCC diagnostic ignored "-Wdeprecated-declarations"
#include <cuda_runtime_api.h>
#include <errno.h>

cudaError_t cudaMallocAsync_ptsz(void **, size_t, cudaStream_t);
cudaError_t cudaFreeAsync_ptsz(void *, cudaStream_t);
cudaError_t cudaMallocFromPoolAsync_ptsz(void **, size_t, cudaMemPool_t, cudaStream_t);
cudaError_t cudaLaunchKernel_ptsz(const void *, dim3, dim3, void **, size_t, cudaStream_t);
cudaError_t cudaLaunchKernelExC_ptsz(const cudaLaunchConfig_t *, const void *, void **);
cudaError_t cudaLaunchCooperativeKernel_ptsz(const void *, dim3, dim3, void **, size_t,
                                             cudaStream_t);
cudaError_t cudaGraphLaunch_ptsz(cudaGraphExec_t, cudaStream_t);
cudaError_t cudaGetDriverEntryPoint_ptsz(const char *, void **, unsigned long long,
                                         enum cudaDriverEntryPointQueryResult *);
cudaError_t cudaGetDriverEntryPointByVersion_ptsz(const char *, void **, unsigned int,
                                                  unsigned long long,
                                                  enum cudaDriverEntryPointQueryResult *);

#define REAL(n) ((__typeof__(&n))wl__real(WL__H_##n))
#define GET_REAL(n)                                                                                \
  __typeof__(&n) real = REAL(n);                                                                   \
  if (WL_UNLIKELY(!real)) {                                                                        \
    wl__warn_once("no CUDA runtime provides %s; returning cudaErrorInitializationError", #n);      \
    return cudaErrorInitializationError;                                                           \
  }
#define PASS(mode) ((mode) == WL__MODE_OFF || wl__tls.depth)

/* Runs the real call with the driver hooks it reaches passing through. */
#define NESTED(call)                                                                               \
  ({                                                                                               \
    WL_NEST_BEGIN();                                                                               \
    cudaError_t e_ = (call);                                                                       \
    WL_NEST_END();                                                                                 \
    e_;                                                                                            \
  })

static inline cudaStream_t ptsz_stream(cudaStream_t s) {
  return s ? s : cudaStreamPerThread;
}

/* A served call that fails answers as the real one would, and the runtime's last error
 * (cudaGetLastError, cudaPeekAtLastError) must say so too: programs check it after a batch of
 * calls. The runtime has no call that sets it, so the real cudaMalloc is made to fail the same
 * way, at once and with no effect: a size no device has (out of memory), or no output (invalid
 * value). Not where a capture prohibits synchronous calls for this thread: that call would break
 * the capture. */
static __attribute__((noinline, cold)) cudaError_t rt_failed(cudaError_t e) {
  __typeof__(&cudaMalloc) m = REAL(cudaMalloc);
  if (!m || (__atomic_load_n(&wl__captures, __ATOMIC_RELAXED) && wl__capture_prohibits())) return e;
  void *x = NULL;
  cudaError_t got = NESTED(e == cudaErrorMemoryAllocation ? m(&x, (size_t)1 << 62) : m(NULL, 1));
  if (got != e) {
    wl__warn_once("cudaGetLastError may not report a failed served call: the runtime answered "
                  "%d, not %d",
                  (int)got, (int)e);
    if (got == cudaSuccess && x) {
      __typeof__(&cudaFree) f = REAL(cudaFree);
      if (f) NESTED(f(x));
    }
  }
  return e;
}

/* After a device reset the runtime makes its context anew at the thread's next runtime call,
 * and makes it current: a served call that never reaches the runtime left the thread on the
 * destroyed one (on an H200, the next cuMemsetD8 answered CONTEXT_IS_DESTROYED). The runtime's
 * own no-op does it (cudaFree(NULL)), once per thread and reset. */
static __thread unsigned rt_resets_seen;

static __attribute__((noinline, cold)) void rt_after_reset(unsigned resets) {
  __typeof__(&cudaFree) f = REAL(cudaFree);
  if (f) NESTED(f(NULL));
  rt_resets_seen = resets;
}

/* alloc/gate mode: 1 when decided (*err set), 0 to pass through. While captures are in progress
 * the runtime's (and the driver's), as in hooks_drv.c: on a capturing stream, and synchronous
 * (sync) where a capture prohibits it for this thread. */
static int serve(int mode, void **p, size_t size, cudaStream_t s, bool sync, cudaError_t *err) {
  if (mode < WL__MODE_ALLOC || !p || !size) return 0;
  if (WL_UNLIKELY(__atomic_load_n(&wl__captures, __ATOMIC_RELAXED)) &&
      (sync ? wl__capture_prohibits() : wl__stream_capturing(s)))
    return 0;
  unsigned resets = __atomic_load_n(&wl__resets, __ATOMIC_ACQUIRE);
  if (WL_UNLIKELY(resets != rt_resets_seen)) rt_after_reset(resets);
  uintptr_t out;
  int r = wl__serve_alloc(size, s, sync, &out);
  if (r == 1) {
    *p = (void *)out;
    *err = cudaSuccess;
    return 1;
  }
  if (r < 0) {
    *err = rt_failed(cudaErrorMemoryAllocation);
    return 1;
  }
  return 0;
}

static cudaError_t alloc_done(cudaError_t e, void **p, size_t size, unsigned kind, void *s) {
  if (e == cudaSuccess && p)
    wl__track_alloc((uintptr_t)*p, size, kind, s);
  else
    wl__serve_unbook_kind(kind, size);
  return e;
}

/* A device allocation passing through (a program's pool, a device whose VMM the driver refused,
 * a context the program created), booked first: the budget holds all of the group's memory. */
#define PASS_BOOKED(mode, size, call, p, kind, s)                                                  \
  ({                                                                                               \
    int bk_ = (mode) >= WL__MODE_ALLOC ? wl__serve_book_pass(size, __func__, s) : 0;               \
    bk_ < 0 ? rt_failed(cudaErrorMemoryAllocation)                                                 \
            : alloc_done(NESTED(call), p, size, (kind) | (unsigned)bk_, s);                        \
  })

/* ---- memory ----------------------------------------------------------------------------------*/

WL_HOOK cudaError_t cudaMalloc(void **p, size_t size) {
  GET_REAL(cudaMalloc);
  int mode = wl__mode();
  if (PASS(mode)) return real(p, size);
  cudaError_t e;
  if (serve(mode, p, size, NULL, true, &e)) return e;
  return PASS_BOOKED(mode, size, real(p, size), p, WL__K_DEVICE, NULL);
}

static inline cudaError_t free_sync(__typeof__(&cudaFree) real, void *p) {
  wl__freeinfo_t fi;
  int served = wl__free_begin((uintptr_t)p, NULL, true, &fi);
  if (served) return served > 0 ? cudaSuccess : rt_failed(cudaErrorInvalidValue);
  cudaError_t e = NESTED(real(p));
  wl__free_end((uintptr_t)p, NULL, &fi, e == cudaSuccess);
  return e;
}

/* While captures are in progress, out of line: a served block where a capture prohibits the free
 * gets the runtime's refusal and is kept (see cuMemFree_v2). */
static __attribute__((noinline, cold)) cudaError_t free_sync_captured(__typeof__(&cudaFree) real,
                                                                      void *p) {
  if (wl__serve_owns((uintptr_t)p) && wl__capture_prohibits()) {
    cudaError_t e = NESTED(real(p));
    if (e == cudaErrorStreamCaptureUnsupported) return e;
  }
  return free_sync(real, p);
}

WL_HOOK cudaError_t cudaFree(void *p) {
  GET_REAL(cudaFree);
  int mode = wl__mode();
  if (PASS(mode)) return real(p);
  if (WL_UNLIKELY(__atomic_load_n(&wl__captures, __ATOMIC_RELAXED)))
    return free_sync_captured(real, p);
  return free_sync(real, p);
}

WL_HOOK cudaError_t cudaMallocAsync(void **p, size_t size, cudaStream_t s) {
  GET_REAL(cudaMallocAsync);
  int mode = wl__mode();
  if (PASS(mode)) return real(p, size, s);
  cudaError_t e;
  if (wl__serve_current_pool() && serve(mode, p, size, s, false, &e)) return e;
  return PASS_BOOKED(mode, size, real(p, size, s), p, WL__K_ASYNC, s);
}

WL_HOOK cudaError_t cudaMallocAsync_ptsz(void **p, size_t size, cudaStream_t s) {
  GET_REAL(cudaMallocAsync_ptsz);
  int mode = wl__mode();
  if (PASS(mode)) return real(p, size, s);
  cudaError_t e;
  if (wl__serve_current_pool() && serve(mode, p, size, ptsz_stream(s), false, &e)) return e;
  return PASS_BOOKED(mode, size, real(p, size, s), p, WL__K_ASYNC, ptsz_stream(s));
}

/* A pool's allocation passing through: booked after the call where the pool put it (see the
 * driver's twin), freed on its stream as out of memory when it does not fit. */
static cudaError_t pool_done(int mode, cudaError_t e, void **p, size_t size, cudaStream_t s) {
  int bk = 0;
  if (e == cudaSuccess && p && mode >= WL__MODE_ALLOC)
    bk = wl__serve_book_placed((uintptr_t)*p, size, "cudaMallocFromPoolAsync");
  if (bk < 0) {
    __typeof__(&cudaFreeAsync) fr = REAL(cudaFreeAsync);
    if (fr) NESTED(fr(*p, s));
    *p = NULL;
    return rt_failed(cudaErrorMemoryAllocation);
  }
  return alloc_done(e, p, size, WL__K_ASYNC | (unsigned)bk, s);
}

WL_HOOK cudaError_t cudaMallocFromPoolAsync(void **p, size_t size, cudaMemPool_t pool,
                                            cudaStream_t s) {
  GET_REAL(cudaMallocFromPoolAsync);
  int mode = wl__mode();
  if (PASS(mode)) return real(p, size, pool, s);
  cudaError_t e;
  if (wl__serve_pool(pool, s) && serve(mode, p, size, s, false, &e)) return e;
  return pool_done(mode, NESTED(real(p, size, pool, s)), p, size, s);
}

WL_HOOK cudaError_t cudaMallocFromPoolAsync_ptsz(void **p, size_t size, cudaMemPool_t pool,
                                                 cudaStream_t s) {
  GET_REAL(cudaMallocFromPoolAsync_ptsz);
  int mode = wl__mode();
  if (PASS(mode)) return real(p, size, pool, s);
  cudaError_t e;
  if (wl__serve_pool(pool, ptsz_stream(s)) && serve(mode, p, size, ptsz_stream(s), false, &e))
    return e;
  return pool_done(mode, NESTED(real(p, size, pool, s)), p, size, ptsz_stream(s));
}

WL_HOOK cudaError_t cudaFreeAsync(void *p, cudaStream_t s) {
  GET_REAL(cudaFreeAsync);
  int mode = wl__mode();
  if (PASS(mode)) return real(p, s);
  wl__freeinfo_t fi;
  int served = wl__free_begin((uintptr_t)p, s, false, &fi);
  if (served) return served > 0 ? cudaSuccess : rt_failed(cudaErrorInvalidValue);
  cudaError_t e = NESTED(real(p, s));
  wl__free_end((uintptr_t)p, s, &fi, e == cudaSuccess);
  return e;
}

WL_HOOK cudaError_t cudaFreeAsync_ptsz(void *p, cudaStream_t s) {
  GET_REAL(cudaFreeAsync_ptsz);
  int mode = wl__mode();
  if (PASS(mode)) return real(p, s);
  wl__freeinfo_t fi;
  int served = wl__free_begin((uintptr_t)p, ptsz_stream(s), false, &fi);
  if (served) return served > 0 ? cudaSuccess : rt_failed(cudaErrorInvalidValue);
  cudaError_t e = NESTED(real(p, s));
  wl__free_end((uintptr_t)p, ptsz_stream(s), &fi, e == cudaSuccess);
  return e;
}

static int host_serve(int mode, void **p, size_t size, unsigned flags) {
  if (mode < WL__MODE_ALLOC || !p) return 0;
  void *b = wl__pinned_serve(size, flags);
  if (!b) return 0;
  *p = b;
  wl__track_alloc((uintptr_t)b, size, WL__K_HOST, NULL);
  return 1;
}

WL_HOOK cudaError_t cudaMallocHost(void **p, size_t size) {
  GET_REAL(cudaMallocHost);
  int mode = wl__mode();
  if (PASS(mode)) return real(p, size);
  if (host_serve(mode, p, size, 0)) return cudaSuccess;
  return alloc_done(NESTED(real(p, size)), p, size, WL__K_HOST, NULL);
}

WL_HOOK cudaError_t cudaHostAlloc(void **p, size_t size, unsigned int flags) {
  GET_REAL(cudaHostAlloc);
  int mode = wl__mode();
  if (PASS(mode)) return real(p, size, flags);
  if (host_serve(mode, p, size, flags)) return cudaSuccess;
  return alloc_done(NESTED(real(p, size, flags)), p, size, WL__K_HOST, NULL);
}

WL_HOOK cudaError_t cudaFreeHost(void *p) {
  GET_REAL(cudaFreeHost);
  int mode = wl__mode();
  if (PASS(mode)) return real(p);
  wl__freeinfo_t fi;
  wl__free_begin_host((uintptr_t)p, &fi);
  int rc = wl__pinned_release(p);
  if (rc != -ENOENT) {
    wl__free_end((uintptr_t)p, NULL, &fi, rc == 0);
    return rc == 0 ? cudaSuccess : rt_failed(cudaErrorInvalidValue);
  }
  cudaError_t e = NESTED(real(p));
  wl__free_end((uintptr_t)p, NULL, &fi, e == cudaSuccess);
  return e;
}

WL_HOOK cudaError_t cudaMemGetInfo(size_t *free_b, size_t *total_b) {
  GET_REAL(cudaMemGetInfo);
  int mode = wl__mode();
  if (PASS(mode)) return real(free_b, total_b);
  cudaError_t e = NESTED(real(free_b, total_b));
  if (e == cudaSuccess && mode >= WL__MODE_ALLOC && free_b && total_b)
    wl__serve_meminfo(free_b, total_b);
  return e;
}

/* The device cudaDeviceReset resets: its current context's (cudaSetDevice makes the primary
 * context current), -1 when that is none (the runtime has used no device on this thread) or a
 * context the program created: then the runtime "will destroy only the internal CUDA RT state
 * for that CUcontext" and no allocation goes. */
static int rt_reset_device(void) {
  CUcontext ctx = NULL;
  int d = wl__current_device(&ctx);
  return d >= 0 && wl__is_primary(ctx, d) ? d : -1;
}

WL_HOOK cudaError_t cudaDeviceReset(void) {
  GET_REAL(cudaDeviceReset);
  int mode = wl__mode();
  if (PASS(mode)) return real();
  int d = rt_reset_device();
  if (d >= 0) wl__device_reset(d);
  return NESTED(real());
}

/* ---- launches --------------------------------------------------------------------------------*/

static inline void on_launch(int mode, const void *f, dim3 g, dim3 b, cudaStream_t s) {
  const unsigned grid[3] = {g.x, g.y, g.z};
  wl__on_launch(mode, (void *)f, WL__FN_RT, (uint64_t)b.x * b.y * b.z, s, grid);
}

WL_HOOK cudaError_t cudaLaunchKernel(const void *f, dim3 g, dim3 b, void **args, size_t shmem,
                                     cudaStream_t s) {
  GET_REAL(cudaLaunchKernel);
  int mode = wl__mode();
  if (PASS(mode)) return real(f, g, b, args, shmem, s);
  on_launch(mode, f, g, b, s);
  return NESTED(real(f, g, b, args, shmem, s));
}

WL_HOOK cudaError_t cudaLaunchKernel_ptsz(const void *f, dim3 g, dim3 b, void **args, size_t shmem,
                                          cudaStream_t s) {
  GET_REAL(cudaLaunchKernel_ptsz);
  int mode = wl__mode();
  if (PASS(mode)) return real(f, g, b, args, shmem, s);
  on_launch(mode, f, g, b, ptsz_stream(s));
  return NESTED(real(f, g, b, args, shmem, s));
}

WL_HOOK cudaError_t cudaLaunchKernelExC(const cudaLaunchConfig_t *c, const void *f, void **args) {
  GET_REAL(cudaLaunchKernelExC);
  int mode = wl__mode();
  if (PASS(mode)) return real(c, f, args);
  if (c) on_launch(mode, f, c->gridDim, c->blockDim, c->stream);
  return NESTED(real(c, f, args));
}

WL_HOOK cudaError_t cudaLaunchKernelExC_ptsz(const cudaLaunchConfig_t *c, const void *f,
                                             void **args) {
  GET_REAL(cudaLaunchKernelExC_ptsz);
  int mode = wl__mode();
  if (PASS(mode)) return real(c, f, args);
  if (c) on_launch(mode, f, c->gridDim, c->blockDim, ptsz_stream(c->stream));
  return NESTED(real(c, f, args));
}

WL_HOOK cudaError_t cudaLaunchCooperativeKernel(const void *f, dim3 g, dim3 b, void **args,
                                                size_t shmem, cudaStream_t s) {
  GET_REAL(cudaLaunchCooperativeKernel);
  int mode = wl__mode();
  if (PASS(mode)) return real(f, g, b, args, shmem, s);
  on_launch(mode, f, g, b, s);
  return NESTED(real(f, g, b, args, shmem, s));
}

WL_HOOK cudaError_t cudaLaunchCooperativeKernel_ptsz(const void *f, dim3 g, dim3 b, void **args,
                                                     size_t shmem, cudaStream_t s) {
  GET_REAL(cudaLaunchCooperativeKernel_ptsz);
  int mode = wl__mode();
  if (PASS(mode)) return real(f, g, b, args, shmem, s);
  on_launch(mode, f, g, b, ptsz_stream(s));
  return NESTED(real(f, g, b, args, shmem, s));
}

WL_HOOK cudaError_t cudaGraphLaunch(cudaGraphExec_t g, cudaStream_t s) {
  GET_REAL(cudaGraphLaunch);
  int mode = wl__mode();
  if (PASS(mode)) return real(g, s);
  wl__count(WL__ST_GRAPH_LAUNCHES, 1);
  wl__on_launch(mode, g, WL__FN_GRAPH, 0, s, NULL);
  return NESTED(real(g, s));
}

WL_HOOK cudaError_t cudaGraphLaunch_ptsz(cudaGraphExec_t g, cudaStream_t s) {
  GET_REAL(cudaGraphLaunch_ptsz);
  int mode = wl__mode();
  if (PASS(mode)) return real(g, s);
  wl__count(WL__ST_GRAPH_LAUNCHES, 1);
  wl__on_launch(mode, g, WL__FN_GRAPH, 0, ptsz_stream(s), NULL);
  return NESTED(real(g, s));
}

/* ---- driver entry points handed out by the runtime: mapped like cuGetProcAddress's ----------*/

static cudaError_t entry_done(cudaError_t e, const char *sym, void **fp) {
  if (e == cudaSuccess && fp && *fp && wl__mode() != WL__MODE_OFF) *fp = wl__wrap_entry(sym, *fp);
  return e;
}

WL_HOOK cudaError_t cudaGetDriverEntryPoint(const char *sym, void **fp, unsigned long long flags,
                                            enum cudaDriverEntryPointQueryResult *st) {
  GET_REAL(cudaGetDriverEntryPoint);
  return entry_done(NESTED(real(sym, fp, flags, st)), sym, fp);
}

WL_HOOK cudaError_t cudaGetDriverEntryPoint_ptsz(const char *sym, void **fp,
                                                 unsigned long long flags,
                                                 enum cudaDriverEntryPointQueryResult *st) {
  GET_REAL(cudaGetDriverEntryPoint_ptsz);
  return entry_done(NESTED(real(sym, fp, flags, st)), sym, fp);
}

WL_HOOK cudaError_t cudaGetDriverEntryPointByVersion(const char *sym, void **fp, unsigned int ver,
                                                     unsigned long long flags,
                                                     enum cudaDriverEntryPointQueryResult *st) {
  GET_REAL(cudaGetDriverEntryPointByVersion);
  return entry_done(NESTED(real(sym, fp, ver, flags, st)), sym, fp);
}

WL_HOOK cudaError_t cudaGetDriverEntryPointByVersion_ptsz(
    const char *sym, void **fp, unsigned int ver, unsigned long long flags,
    enum cudaDriverEntryPointQueryResult *st) {
  GET_REAL(cudaGetDriverEntryPointByVersion_ptsz);
  return entry_done(NESTED(real(sym, fp, ver, flags, st)), sym, fp);
}
