/* For tests only: the driver entry points the VMM driver double (tests/doubles) does not model
 * yet (classic and stream-ordered allocations, pinned host memory, launches, cuGetProcAddress),
 * on host memory with a capacity (WLTEST_DEVICE_MEM). Test programs link it; libwavelet.so
 * finds these as the "real" driver through RTLD_NEXT. Launches only count. */
#include <cuda.h>
#include <dlfcn.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define EXT __attribute__((visibility("default")))

#undef cuGetProcAddress

CUresult cuMemAllocAsync_ptsz(CUdeviceptr *, size_t, CUstream);
CUresult cuMemFreeAsync_ptsz(CUdeviceptr, CUstream);
CUresult cuLaunchKernel_ptsz(CUfunction, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned,
                             unsigned, CUstream, void **, void **);
uint64_t wltest_ext_launches(void);

static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static size_t capacity, used;
static uint64_t launches;

/* Each block carries its size in a 256-byte header, so frees know it. */
static size_t cap(void) {
  if (!capacity) {
    const char *e = getenv("WLTEST_DEVICE_MEM");
    size_t c = (size_t)8 << 30;
    if (e) {
      char *end;
      unsigned long long v = strtoull(e, &end, 10);
      if (*end == 'G' || *end == 'g') v <<= 30;
      if (*end == 'M' || *end == 'm') v <<= 20;
      if (*end == 'K' || *end == 'k') v <<= 10;
      if (v) c = (size_t)v;
    }
    capacity = c;
  }
  return capacity;
}

static CUresult take(void **out, size_t size) {
  if (!out) return CUDA_ERROR_INVALID_VALUE;
  if (!size) return CUDA_ERROR_INVALID_VALUE;
  pthread_mutex_lock(&lock);
  if (used + size > cap()) {
    pthread_mutex_unlock(&lock);
    return CUDA_ERROR_OUT_OF_MEMORY;
  }
  used += size;
  pthread_mutex_unlock(&lock);
  char *p = aligned_alloc(256, 256 + ((size + 255) & ~(size_t)255));
  if (!p) return CUDA_ERROR_OUT_OF_MEMORY;
  memcpy(p, &size, sizeof size);
  *out = p + 256;
  return CUDA_SUCCESS;
}

static CUresult give(void *p) {
  if (!p) return CUDA_SUCCESS;
  char *b = (char *)p - 256;
  size_t size;
  memcpy(&size, b, sizeof size);
  pthread_mutex_lock(&lock);
  used -= size;
  pthread_mutex_unlock(&lock);
  free(b);
  return CUDA_SUCCESS;
}

EXT CUresult cuMemAlloc_v2(CUdeviceptr *d, size_t size) {
  void *p;
  CUresult r = take(&p, size);
  if (r == CUDA_SUCCESS) *d = (CUdeviceptr)(uintptr_t)p;
  return r;
}
EXT CUresult cuMemFree_v2(CUdeviceptr d) {
  return give((void *)(uintptr_t)d);
}
EXT CUresult cuMemAllocManaged(CUdeviceptr *d, size_t size, unsigned flags) {
  (void)flags;
  return cuMemAlloc_v2(d, size);
}
EXT CUresult cuMemAllocAsync(CUdeviceptr *d, size_t size, CUstream s) {
  (void)s;
  return cuMemAlloc_v2(d, size);
}
EXT CUresult cuMemAllocAsync_ptsz(CUdeviceptr *d, size_t size, CUstream s) {
  (void)s;
  return cuMemAlloc_v2(d, size);
}
EXT CUresult cuMemFreeAsync(CUdeviceptr d, CUstream s) {
  (void)s;
  return give((void *)(uintptr_t)d);
}
EXT CUresult cuMemFreeAsync_ptsz(CUdeviceptr d, CUstream s) {
  (void)s;
  return give((void *)(uintptr_t)d);
}
EXT CUresult cuMemAllocFromPoolAsync(CUdeviceptr *d, size_t size, CUmemoryPool pool, CUstream s) {
  (void)pool;
  (void)s;
  return cuMemAlloc_v2(d, size);
}
EXT CUresult cuMemGetInfo_v2(size_t *f, size_t *t) {
  if (!f || !t) return CUDA_ERROR_INVALID_VALUE;
  pthread_mutex_lock(&lock);
  *t = cap();
  *f = capacity - used;
  pthread_mutex_unlock(&lock);
  return CUDA_SUCCESS;
}
EXT CUresult cuMemAllocHost_v2(void **pp, size_t size) {
  if (!pp || !size) return CUDA_ERROR_INVALID_VALUE;
  *pp = aligned_alloc(4096, (size + 4095) & ~(size_t)4095);
  return *pp ? CUDA_SUCCESS : CUDA_ERROR_OUT_OF_MEMORY;
}
EXT CUresult cuMemHostAlloc(void **pp, size_t size, unsigned flags) {
  (void)flags;
  return cuMemAllocHost_v2(pp, size);
}
EXT CUresult cuMemFreeHost(void *p) {
  free(p);
  return CUDA_SUCCESS;
}

static CUresult launch(void) {
  __atomic_add_fetch(&launches, 1, __ATOMIC_RELAXED);
  return CUDA_SUCCESS;
}
EXT CUresult cuLaunchKernel(CUfunction f, unsigned gx, unsigned gy, unsigned gz, unsigned bx,
                            unsigned by, unsigned bz, unsigned sh, CUstream s, void **p, void **e) {
  (void)f, (void)gx, (void)gy, (void)gz, (void)bx, (void)by, (void)bz, (void)sh, (void)s, (void)p,
      (void)e;
  return launch();
}
EXT CUresult cuLaunchKernel_ptsz(CUfunction f, unsigned gx, unsigned gy, unsigned gz, unsigned bx,
                                 unsigned by, unsigned bz, unsigned sh, CUstream s, void **p,
                                 void **e) {
  return cuLaunchKernel(f, gx, gy, gz, bx, by, bz, sh, s, p, e);
}
EXT CUresult cuLaunchKernelEx(const CUlaunchConfig *c, CUfunction f, void **p, void **e) {
  (void)c, (void)f, (void)p, (void)e;
  return launch();
}
EXT CUresult cuGraphLaunch(CUgraphExec g, CUstream s) {
  (void)g, (void)s;
  return launch();
}

/* Test control: launches seen by the "driver". */
EXT uint64_t wltest_ext_launches(void) {
  return __atomic_load_n(&launches, __ATOMIC_RELAXED);
}

/* cuGetProcAddress over this library's entry points, with the version and per-thread rules of
 * the real one for the names it has: "cuMemAlloc" is cuMemAlloc_v2 from 3.2 on, and the
 * per-thread-default-stream flag selects the _ptsz twins. */
typedef struct proc_s {
  const char *name;
  int min_version; /* the version from which this export answers */
  int ptds;        /* 1: only for the per-thread flag */
  void *fn;
} proc_t;

CUresult cuGetProcAddress_v2(const char *, void **, int, cuuint64_t,
                             CUdriverProcAddressQueryResult *);
CUresult cuGetProcAddress(const char *, void **, int, cuuint64_t);

static const proc_t procs[] = {
    {"cuMemAlloc", 3020, 0, (void *)cuMemAlloc_v2},
    {"cuMemFree", 3020, 0, (void *)cuMemFree_v2},
    {"cuMemGetInfo", 3020, 0, (void *)cuMemGetInfo_v2},
    {"cuMemAllocHost", 3020, 0, (void *)cuMemAllocHost_v2},
    {"cuMemHostAlloc", 2020, 0, (void *)cuMemHostAlloc},
    {"cuMemFreeHost", 2000, 0, (void *)cuMemFreeHost},
    {"cuMemAllocManaged", 6000, 0, (void *)cuMemAllocManaged},
    {"cuMemAllocAsync", 11020, 0, (void *)cuMemAllocAsync},
    {"cuMemAllocAsync", 11020, 1, (void *)cuMemAllocAsync_ptsz},
    {"cuMemFreeAsync", 11020, 0, (void *)cuMemFreeAsync},
    {"cuMemFreeAsync", 11020, 1, (void *)cuMemFreeAsync_ptsz},
    {"cuMemAllocFromPoolAsync", 11020, 0, (void *)cuMemAllocFromPoolAsync},
    {"cuLaunchKernel", 4000, 0, (void *)cuLaunchKernel},
    {"cuLaunchKernel", 7000, 1, (void *)cuLaunchKernel_ptsz},
    {"cuLaunchKernelEx", 11060, 0, (void *)cuLaunchKernelEx},
    {"cuGraphLaunch", 10000, 0, (void *)cuGraphLaunch},
    {"cuGetProcAddress", 11030, 0, (void *)cuGetProcAddress},
    {"cuGetProcAddress", 12000, 0, (void *)cuGetProcAddress_v2},
};

/* Then the VMM double's entry points (same process): found by exported name. */
static void *from_driver(const char *name) {
  static void *h;
  if (!h) h = dlopen("libcuda.so.1", RTLD_NOW | RTLD_NOLOAD);
  return h ? dlsym(h, name) : NULL;
}

EXT CUresult cuGetProcAddress_v2(const char *sym, void **pfn, int version, cuuint64_t flags,
                                 CUdriverProcAddressQueryResult *st) {
  if (!sym || !pfn) return CUDA_ERROR_INVALID_VALUE;
  int ptds = (flags & CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM) != 0;
  void *best = NULL;
  int best_v = -1;
  for (size_t i = 0; i < sizeof procs / sizeof procs[0]; i++) {
    const proc_t *p = &procs[i];
    if (strcmp(p->name, sym) || p->min_version > version) continue;
    if (p->ptds && !ptds) continue;
    int v = p->min_version * 2 + p->ptds; /* the per-thread twin wins when asked for */
    if (v > best_v) {
      best_v = v;
      best = p->fn;
    }
  }
  if (!best) best = from_driver(sym);
  *pfn = best;
  if (st) *st = best ? CU_GET_PROC_ADDRESS_SUCCESS : CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND;
  return best ? CUDA_SUCCESS : CUDA_ERROR_NOT_FOUND;
}

EXT CUresult cuGetProcAddress(const char *sym, void **pfn, int version, cuuint64_t flags) {
  return cuGetProcAddress_v2(sym, pfn, version, flags, NULL);
}
