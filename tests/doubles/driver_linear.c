/* The CUDA driver double's linear memory: cuMemAlloc, stream-ordered pools, page-locked host
 * memory, copies and sets. Device memory is host memory counted against the device's capacity,
 * so code under test (and kernels' host twins) really read and write it. For tests only. */
#include "driver.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#define D drv__state

#define DRV_ALIGN ((size_t)512) /* cudaMalloc's alignment; sizes are charged in these units */

static size_t round_up(size_t x, size_t a) {
  return (x + a - 1) / a * a;
}

static size_t bucket(uintptr_t addr) {
  return (size_t)(addr >> 12) % DRV_LINEAR_BUCKETS;
}

static drv_linear_t *linear_find(uintptr_t addr) {
  for (drv_linear_t *l = D.linear[bucket(addr)]; l; l = l->next)
    if (l->addr == addr) return l;
  return NULL;
}

drv_linear_t *drv_linear_find(uintptr_t addr) {
  return linear_find(addr);
}

/* The allocation holding p (its start or any address inside it, as the driver looks it up), or
 * NULL. Past the start a scan: such lookups are few in tests. */
static drv_linear_t *linear_containing(uintptr_t p) {
  drv_linear_t *l = linear_find(p);
  if (l) return l;
  for (size_t b = 0; b < DRV_LINEAR_BUCKETS; b++)
    for (l = D.linear[b]; l; l = l->next)
      if (p - l->addr < l->size) return l;
  return NULL;
}

drv_linear_t *drv_linear_containing(uintptr_t p) {
  return linear_containing(p);
}

bool drv_linear_ptr(uintptr_t p, drv_ptr_t *out) {
  drv_linear_t *l = linear_containing(p);
  if (!l) return false;
  *out = (drv_ptr_t){.device = l->device,
                     .ctx = l->ctx,
                     .host = l->kind == DRV_LINEAR_HOST,
                     .start = l->addr,
                     .size = l->size,
                     .pool = l->kind == DRV_LINEAR_POOL ? l->pool : NULL};
  return true;
}

static void linear_count(const drv_linear_t *l, int sign) {
  uint64_t n = (uint64_t)(sign > 0 ? 1 : -1), b = sign > 0 ? l->charged : -(uint64_t)l->charged;
  if (l->kind == DRV_LINEAR_HOST) {
    D.st.host_allocs += n;
    D.st.host_bytes += b;
  } else {
    D.st.linear_allocs += n;
    D.st.linear_bytes += b;
  }
}

/* Backs an allocation with fresh pages (zeroed, as the tests may rely on nothing else). */
static CUresult linear_new(int kind, int device, struct CUctx_st *ctx, size_t size, bool low32,
                           drv_linear_t **out) {
  drv_linear_t *l = calloc(1, sizeof *l);
  if (!l) return CUDA_ERROR_OUT_OF_MEMORY;
  l->device = device;
  l->ctx = ctx;
  l->size = size;
  l->charged = round_up(size, DRV_ALIGN);
  l->mapped = round_up(size, 4096);
  l->kind = kind;
  int flags = MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE | (low32 ? MAP_32BIT : 0);
  void *p = mmap(NULL, l->mapped, PROT_READ | PROT_WRITE, flags, -1, 0);
  if (p == MAP_FAILED) {
    free(l);
    return CUDA_ERROR_OUT_OF_MEMORY;
  }
  l->addr = (uintptr_t)p;
  size_t b = bucket(l->addr);
  l->next = D.linear[b];
  D.linear[b] = l;
  linear_count(l, +1);
  *out = l;
  return CUDA_SUCCESS;
}

static void linear_free(drv_linear_t *l) {
  for (drv_linear_t **pp = &D.linear[bucket(l->addr)]; *pp; pp = &(*pp)->next)
    if (*pp == l) {
      *pp = l->next;
      break;
    }
  linear_count(l, -1);
  munmap((void *)l->addr, l->mapped);
  /* Openers in other processes keep their mappings (using them is undefined, as on CUDA). */
  if (l->ipc) {
    close(l->ipc_fd);
    D.st.ipc_exported--;
  }
  free(l);
}

/* ---- cuMemAlloc ------------------------------------------------------------------------------*/

static CUresult mem_alloc(uintptr_t *out, size_t size, bool low32) {
  if (!out) return drv_misuse(CUDA_ERROR_INVALID_VALUE, "NULL output");
  if (size == 0) return drv_misuse(CUDA_ERROR_INVALID_VALUE, "size 0");
  /* Owned by the current context, charged to its device. */
  struct CUctx_st *c = drv_current();
  int dev = c->device;
  size_t charged = round_up(size, DRV_ALIGN);
  if (charged < size || !drv_charge(dev, charged)) return CUDA_ERROR_OUT_OF_MEMORY;
  drv_linear_t *l;
  CUresult rc = linear_new(DRV_LINEAR_DEVICE, dev, c, size, low32, &l);
  if (rc != CUDA_SUCCESS) {
    drv_uncharge(dev, charged);
    return rc;
  }
  *out = l->addr;
  return CUDA_SUCCESS;
}

static void pool_release(struct CUmemPoolHandle_st *p, uint64_t bytes);

static CUresult mem_free(uintptr_t addr) {
  drv_linear_t *l = addr ? linear_find(addr) : NULL;
  if (!l || l->kind == DRV_LINEAR_HOST)
    return drv_misuse(CUDA_ERROR_INVALID_VALUE, "%#lx is not a device allocation",
                      (unsigned long)addr);
  if (l->kind == DRV_LINEAR_POOL) {
    struct CUmemPoolHandle_st *p = l->pool;
    p->used -= l->charged;
    /* The memory stays in the pool's cache (until a synchronisation trims it), unless the
     * program destroyed the pool. */
    if (p->destroyed) pool_release(p, 0);
  } else {
    drv_uncharge(l->device, l->charged);
  }
  linear_free(l);
  return CUDA_SUCCESS;
}

/* cuMemAlloc and cuMemFree are potentially unsafe during stream capture: refused where a capture
 * prohibits them for the calling thread, before their arguments are looked at (assumed; the
 * host-memory calls are not modelled so). */
CUresult CUDAAPI cuMemAlloc(CUdeviceptr *dptr, size_t bytesize) {
  DRV_BEGIN(cuMemAlloc_v2, DRV_NEED_CTX);
  DRV_UNSAFE(DRV_UNSAFE_ALWAYS);
  uintptr_t a = 0;
  CUresult rc = mem_alloc(dptr ? &a : NULL, bytesize, false);
  if (rc == CUDA_SUCCESS) *dptr = (CUdeviceptr)a;
  return drv_end(rc);
}

CUresult CUDAAPI cuMemFree(CUdeviceptr dptr) {
  DRV_BEGIN(cuMemFree_v2, DRV_NEED_CTX);
  DRV_UNSAFE(DRV_UNSAFE_ALWAYS);
  return drv_end(mem_free((uintptr_t)dptr));
}

CUresult CUDAAPI cuMemGetInfo(size_t *free_bytes, size_t *total) {
  DRV_BEGIN(cuMemGetInfo_v2, DRV_NEED_CTX);
  if (!free_bytes || !total) return drv_end(drv_misuse(CUDA_ERROR_INVALID_VALUE, "NULL output"));
  /* The current context's device. */
  size_t used = drv_device_used(drv_current()->device);
  *free_bytes = used < D.capacity ? D.capacity - used : 0;
  *total = D.capacity;
  return drv_end(CUDA_SUCCESS);
}

/* cuMemGetInfo_v2 at an address no symbol names (WLTEST_PROC_PRIVATE): a driver whose
 * cuGetProcAddress answers are not its exported functions. noinline and no tail call, so the
 * address stays its own. */
__attribute__((noinline)) static CUresult private_mem_get_info(size_t *free_bytes, size_t *total) {
  CUresult r = cuMemGetInfo(free_bytes, total);
  __asm__ volatile("" ::: "memory");
  return r;
}

void *drv_private_twin(const char *variant) {
  return strcmp(variant, "cuMemGetInfo_v2") == 0 ? (void *)private_mem_get_info : NULL;
}

/* Managed memory: a device allocation like cuMemAlloc's here (the double's device memory is host
 * memory already; a driver would page it in on demand), for one of the two attach flags. */
CUresult CUDAAPI cuMemAllocManaged(CUdeviceptr *dptr, size_t bytesize, unsigned int flags) {
  DRV_BEGIN(cuMemAllocManaged, DRV_NEED_CTX);
  DRV_UNSAFE(DRV_UNSAFE_ALWAYS);
  if (flags != CU_MEM_ATTACH_GLOBAL && flags != CU_MEM_ATTACH_HOST)
    return drv_end(drv_misuse(CUDA_ERROR_INVALID_VALUE, "flags %#x", flags));
  uintptr_t a = 0;
  CUresult rc = mem_alloc(dptr ? &a : NULL, bytesize, false);
  if (rc == CUDA_SUCCESS) *dptr = (CUdeviceptr)a;
  return drv_end(rc);
}

/* Pitched memory: rows padded to D.pitch_align bytes (WLTEST_PITCH_ALIGN), a device allocation
 * like cuMemAlloc's otherwise. */
CUresult CUDAAPI cuMemAllocPitch(CUdeviceptr *dptr, size_t *pitch, size_t width, size_t height,
                                 unsigned int elem) {
  DRV_BEGIN(cuMemAllocPitch_v2, DRV_NEED_CTX);
  DRV_UNSAFE(DRV_UNSAFE_ALWAYS);
  if (!dptr || !pitch) return drv_end(drv_misuse(CUDA_ERROR_INVALID_VALUE, "NULL output"));
  if (elem != 4 && elem != 8 && elem != 16)
    return drv_end(drv_misuse(CUDA_ERROR_INVALID_VALUE, "element size %u, not 4, 8 or 16", elem));
  if (!width || !height) return drv_end(drv_misuse(CUDA_ERROR_INVALID_VALUE, "size 0"));
  size_t p = round_up(width, D.pitch_align);
  if (p < width || height > SIZE_MAX / p)
    return drv_end(
        drv_misuse(CUDA_ERROR_INVALID_VALUE, "%zu rows of %zu bytes overflow", height, width));
  uintptr_t a = 0;
  CUresult rc = mem_alloc(&a, p * height, false);
  if (rc == CUDA_SUCCESS) {
    *dptr = (CUdeviceptr)a;
    *pitch = p;
  }
  return drv_end(rc);
}

/* The first versions, with 32-bit sizes and pointers (MAP_32BIT keeps pointers in range). */
CUresult CUDAAPI cuMemAlloc_v1(unsigned int *dptr, unsigned int bytesize) {
  DRV_BEGIN(cuMemAlloc, DRV_NEED_CTX);
  DRV_UNSAFE(DRV_UNSAFE_ALWAYS);
  uintptr_t a = 0;
  CUresult rc = mem_alloc(dptr ? &a : NULL, bytesize, true);
  if (rc == CUDA_SUCCESS && a > UINT32_MAX) {
    mem_free(a);
    rc = CUDA_ERROR_OUT_OF_MEMORY;
  }
  if (rc == CUDA_SUCCESS) *dptr = (unsigned int)a;
  return drv_end(rc);
}

CUresult CUDAAPI cuMemFree_v1(unsigned int dptr) {
  DRV_BEGIN(cuMemFree, DRV_NEED_CTX);
  DRV_UNSAFE(DRV_UNSAFE_ALWAYS);
  return drv_end(mem_free(dptr));
}

CUresult CUDAAPI cuMemGetInfo_v1(unsigned int *free_bytes, unsigned int *total) {
  DRV_BEGIN(cuMemGetInfo, DRV_NEED_CTX);
  if (!free_bytes || !total) return drv_end(drv_misuse(CUDA_ERROR_INVALID_VALUE, "NULL output"));
  size_t used = drv_device_used(drv_current()->device);
  size_t f = used < D.capacity ? D.capacity - used : 0;
  *free_bytes = f > UINT32_MAX ? UINT32_MAX : (unsigned int)f;
  *total = D.capacity > UINT32_MAX ? UINT32_MAX : (unsigned int)D.capacity;
  return drv_end(CUDA_SUCCESS);
}

/* ---- pools -----------------------------------------------------------------------------------*/

static struct CUmemPoolHandle_st *pool_new(int device, bool is_default) {
  struct CUmemPoolHandle_st *p = calloc(1, sizeof *p);
  if (!p) return NULL;
  p->magic = DRV_POOL_MAGIC;
  p->device = device;
  p->is_default = is_default;
  p->next = D.pools;
  D.pools = p;
  p->reuse[0] = p->reuse[1] = p->reuse[2] = 1;
  return p;
}

static struct CUmemPoolHandle_st *pool_default(int device) {
  for (struct CUmemPoolHandle_st *p = D.pools; p; p = p->next)
    if (p->is_default && p->device == device) return p;
  return pool_new(device, true);
}

static struct CUmemPoolHandle_st *pool_find(CUmemoryPool h) {
  for (struct CUmemPoolHandle_st *p = D.pools; p; p = p->next)
    if (p == h && !p->destroyed) return p;
  return NULL;
}

static void pool_unlink(struct CUmemPoolHandle_st *p) {
  for (struct CUmemPoolHandle_st **pp = &D.pools; *pp; pp = &(*pp)->next)
    if (*pp == p) {
      *pp = p->next;
      break;
    }
  free(p);
}

/* Gives back cached bytes until the pool holds no more than keep (never what is in use). */
static void pool_release(struct CUmemPoolHandle_st *p, uint64_t keep) {
  if (p->destroyed) keep = 0;
  uint64_t floor = p->used > keep ? p->used : keep;
  if (p->reserved > floor) {
    uint64_t give = p->reserved - floor;
    p->reserved -= give;
    D.st.pool_reserved -= give;
    drv_uncharge(p->device, give);
  }
  if (p->destroyed && p->used == 0) pool_unlink(p);
}

void drv_pools_trim(void) {
  for (struct CUmemPoolHandle_st *p = D.pools, *next; p; p = next) {
    next = p->next;
    if (p->reserved > p->threshold) pool_release(p, p->threshold);
  }
}

static CUresult pool_alloc(struct CUmemPoolHandle_st *p, CUdeviceptr *dptr, size_t size,
                           CUstream hStream) {
  if (!dptr) return drv_misuse(CUDA_ERROR_INVALID_VALUE, "NULL output");
  if (size == 0) return drv_misuse(CUDA_ERROR_INVALID_VALUE, "size 0");
  struct CUstream_st *s;
  CUresult rc = drv_stream_get(hStream, &s);
  if (rc != CUDA_SUCCESS) return rc;
  if (s->capture != CU_STREAM_CAPTURE_STATUS_NONE) return drv_capture_refuse(s);
  size_t charged = round_up(size, DRV_ALIGN);
  /* The pool's cache serves first; what it lacks comes from the device. */
  uint64_t cached = p->reserved - p->used;
  uint64_t grow = charged > cached ? charged - cached : 0;
  if (charged < size || !drv_charge(p->device, grow)) return CUDA_ERROR_OUT_OF_MEMORY;
  drv_linear_t *l;
  rc = linear_new(DRV_LINEAR_POOL, p->device, NULL, size, false, &l);
  if (rc != CUDA_SUCCESS) {
    drv_uncharge(p->device, grow);
    return rc;
  }
  l->pool = p;
  p->reserved += grow;
  D.st.pool_reserved += grow;
  p->used += charged;
  if (p->reserved > p->reserved_high) p->reserved_high = p->reserved;
  if (p->used > p->used_high) p->used_high = p->used;
  *dptr = (CUdeviceptr)l->addr;
  return CUDA_SUCCESS;
}

/* The device's current pool: the one cuDeviceSetMemPool set, else its default pool. */
static struct CUmemPoolHandle_st *pool_current(int device) {
  struct CUmemPoolHandle_st *p = D.current_pool[device];
  return p ? p : pool_default(device);
}

/* "cuMemAllocAsync allocates from the current mempool of the provided stream's device": a
 * created stream's device, not the current context's (the legacy and per-thread streams are the
 * current context's). An unknown stream is refused by pool_alloc. */
static CUresult alloc_async(CUdeviceptr *dptr, size_t size, CUstream hStream) {
  struct CUstream_st *s = drv_stream_find(drv_current(), hStream);
  int dev = s && s->ctx ? s->ctx->device : drv_current()->device;
  struct CUmemPoolHandle_st *p = pool_current(dev);
  if (!p) return CUDA_ERROR_OUT_OF_MEMORY;
  return pool_alloc(p, dptr, size, hStream);
}

static CUresult alloc_from_pool(CUdeviceptr *dptr, size_t size, CUmemoryPool pool,
                                CUstream hStream) {
  struct CUmemPoolHandle_st *p = pool_find(pool);
  if (!p) return drv_misuse(CUDA_ERROR_INVALID_VALUE, "unknown pool %p", (void *)pool);
  return pool_alloc(p, dptr, size, hStream);
}

/* Stream-ordered free: pool memory goes back to its pool's cache. Kernels' effects happened at
 * enqueue, so the pages can go now. */
static CUresult free_async(CUdeviceptr dptr, CUstream hStream) {
  struct CUstream_st *s;
  CUresult rc = drv_stream_get(hStream, &s);
  if (rc != CUDA_SUCCESS) return rc;
  if (s->capture != CU_STREAM_CAPTURE_STATUS_NONE) return drv_capture_refuse(s);
  /* cuMemAlloc memory may be freed this way too (CUDA then synchronises). */
  drv_linear_t *l = dptr ? linear_find((uintptr_t)dptr) : NULL;
  if (!l || l->kind == DRV_LINEAR_HOST)
    return drv_misuse(CUDA_ERROR_INVALID_VALUE, "%#llx is not a device allocation",
                      (unsigned long long)dptr);
  return mem_free((uintptr_t)dptr);
}

CUresult CUDAAPI cuMemAllocAsync(CUdeviceptr *dptr, size_t bytesize, CUstream hStream) {
  DRV_BEGIN(cuMemAllocAsync, DRV_NEED_CTX);
  return drv_end(alloc_async(dptr, bytesize, hStream));
}

CUresult CUDAAPI cuMemAllocAsync_ptsz(CUdeviceptr *dptr, size_t bytesize, CUstream hStream) {
  DRV_BEGIN(cuMemAllocAsync_ptsz, DRV_NEED_CTX);
  return drv_end(alloc_async(dptr, bytesize, hStream ? hStream : CU_STREAM_PER_THREAD));
}

CUresult CUDAAPI cuMemAllocFromPoolAsync(CUdeviceptr *dptr, size_t bytesize, CUmemoryPool pool,
                                         CUstream hStream) {
  DRV_BEGIN(cuMemAllocFromPoolAsync, DRV_NEED_CTX);
  return drv_end(alloc_from_pool(dptr, bytesize, pool, hStream));
}

CUresult CUDAAPI cuMemAllocFromPoolAsync_ptsz(CUdeviceptr *dptr, size_t bytesize, CUmemoryPool pool,
                                              CUstream hStream) {
  DRV_BEGIN(cuMemAllocFromPoolAsync_ptsz, DRV_NEED_CTX);
  return drv_end(alloc_from_pool(dptr, bytesize, pool, hStream ? hStream : CU_STREAM_PER_THREAD));
}

CUresult CUDAAPI cuMemFreeAsync(CUdeviceptr dptr, CUstream hStream) {
  DRV_BEGIN(cuMemFreeAsync, DRV_NEED_CTX);
  return drv_end(free_async(dptr, hStream));
}

CUresult CUDAAPI cuMemFreeAsync_ptsz(CUdeviceptr dptr, CUstream hStream) {
  DRV_BEGIN(cuMemFreeAsync_ptsz, DRV_NEED_CTX);
  return drv_end(free_async(dptr, hStream ? hStream : CU_STREAM_PER_THREAD));
}

CUresult CUDAAPI cuDeviceGetDefaultMemPool(CUmemoryPool *pool_out, CUdevice dev) {
  DRV_BEGIN(cuDeviceGetDefaultMemPool, DRV_NEED_INIT);
  if (!pool_out) return drv_end(drv_misuse(CUDA_ERROR_INVALID_VALUE, "NULL output"));
  if (!drv_device_valid(dev))
    return drv_end(drv_misuse(CUDA_ERROR_INVALID_DEVICE, "no device %d", dev));
  struct CUmemPoolHandle_st *p = pool_default(dev);
  if (!p) return drv_end(CUDA_ERROR_OUT_OF_MEMORY);
  *pool_out = p;
  return drv_end(CUDA_SUCCESS);
}

CUresult CUDAAPI cuDeviceGetMemPool(CUmemoryPool *pool, CUdevice dev) {
  DRV_BEGIN(cuDeviceGetMemPool, DRV_NEED_INIT);
  if (!pool) return drv_end(drv_misuse(CUDA_ERROR_INVALID_VALUE, "NULL output"));
  if (!drv_device_valid(dev))
    return drv_end(drv_misuse(CUDA_ERROR_INVALID_DEVICE, "no device %d", dev));
  struct CUmemPoolHandle_st *p = pool_current(dev);
  if (!p) return drv_end(CUDA_ERROR_OUT_OF_MEMORY);
  *pool = p;
  return drv_end(CUDA_SUCCESS);
}

/* "The memory pool must be local to the specified device": cuMemAllocAsync on the device's
 * contexts takes it from then on. */
CUresult CUDAAPI cuDeviceSetMemPool(CUdevice dev, CUmemoryPool pool) {
  DRV_BEGIN(cuDeviceSetMemPool, DRV_NEED_INIT);
  if (!drv_device_valid(dev))
    return drv_end(drv_misuse(CUDA_ERROR_INVALID_DEVICE, "no device %d", dev));
  struct CUmemPoolHandle_st *p = pool_find(pool);
  if (!p) return drv_end(drv_misuse(CUDA_ERROR_INVALID_VALUE, "unknown pool %p", (void *)pool));
  if (p->device != dev)
    return drv_end(
        drv_misuse(CUDA_ERROR_INVALID_VALUE, "pool %p is device %d's", (void *)pool, p->device));
  D.current_pool[dev] = p->is_default ? NULL : p;
  return drv_end(CUDA_SUCCESS);
}

CUresult CUDAAPI cuMemPoolCreate(CUmemoryPool *pool, const CUmemPoolProps *poolProps) {
  DRV_BEGIN(cuMemPoolCreate, DRV_NEED_INIT);
  if (!pool || !poolProps)
    return drv_end(drv_misuse(CUDA_ERROR_INVALID_VALUE, "NULL output or properties"));
  if (poolProps->allocType != CU_MEM_ALLOCATION_TYPE_PINNED)
    return drv_end(
        drv_misuse(CUDA_ERROR_INVALID_VALUE, "allocation type %d", (int)poolProps->allocType));
  if (poolProps->location.type != CU_MEM_LOCATION_TYPE_DEVICE ||
      !drv_device_valid(poolProps->location.id))
    return drv_end(drv_misuse(CUDA_ERROR_INVALID_VALUE, "location %d/%d is not a device",
                              (int)poolProps->location.type, poolProps->location.id));
  if (poolProps->handleTypes != CU_MEM_HANDLE_TYPE_NONE) {
    fprintf(stderr, "wltest-cuda: cuMemPoolCreate: shareable pools are not modelled\n");
    return drv_end(CUDA_ERROR_NOT_SUPPORTED);
  }
  struct CUmemPoolHandle_st *p = pool_new(poolProps->location.id, false);
  if (!p) return drv_end(CUDA_ERROR_OUT_OF_MEMORY);
  *pool = p;
  return drv_end(CUDA_SUCCESS);
}

/* Recorded, not enforced: which devices may access the pool's memory. */
CUresult CUDAAPI cuMemPoolSetAccess(CUmemoryPool pool, const CUmemAccessDesc *map, size_t count) {
  DRV_BEGIN(cuMemPoolSetAccess, DRV_NEED_INIT);
  struct CUmemPoolHandle_st *p = pool_find(pool);
  if (!p) return drv_end(drv_misuse(CUDA_ERROR_INVALID_VALUE, "unknown pool %p", (void *)pool));
  if (count && !map) return drv_end(drv_misuse(CUDA_ERROR_INVALID_VALUE, "NULL map"));
  for (size_t i = 0; i < count; i++)
    if (map[i].location.type != CU_MEM_LOCATION_TYPE_DEVICE ||
        !drv_device_valid(map[i].location.id))
      return drv_end(drv_misuse(CUDA_ERROR_INVALID_VALUE, "location %d/%d is not a device",
                                (int)map[i].location.type, map[i].location.id));
  for (size_t i = 0; i < count; i++) p->access[map[i].location.id] = (unsigned)map[i].flags;
  return drv_end(CUDA_SUCCESS);
}

CUresult CUDAAPI cuMemPoolDestroy(CUmemoryPool pool) {
  DRV_BEGIN(cuMemPoolDestroy, DRV_NEED_INIT);
  struct CUmemPoolHandle_st *p = pool_find(pool);
  if (!p) return drv_end(drv_misuse(CUDA_ERROR_INVALID_VALUE, "unknown pool %p", (void *)pool));
  if (p->is_default)
    return drv_end(drv_misuse(CUDA_ERROR_INVALID_VALUE, "a device's default pool"));
  /* Outstanding allocations keep it alive until their free, as documented. A device whose
   * current pool it was goes back to its default one. */
  p->destroyed = true;
  if (D.current_pool[p->device] == p) D.current_pool[p->device] = NULL;
  pool_release(p, 0);
  return drv_end(CUDA_SUCCESS);
}

CUresult CUDAAPI cuMemPoolSetAttribute(CUmemoryPool pool, CUmemPool_attribute attr, void *value) {
  DRV_BEGIN(cuMemPoolSetAttribute, DRV_NEED_INIT);
  struct CUmemPoolHandle_st *p = pool_find(pool);
  if (!p) return drv_end(drv_misuse(CUDA_ERROR_INVALID_VALUE, "unknown pool %p", (void *)pool));
  if (!value) return drv_end(drv_misuse(CUDA_ERROR_INVALID_VALUE, "NULL value"));
  switch (attr) {
  case CU_MEMPOOL_ATTR_REUSE_FOLLOW_EVENT_DEPENDENCIES:
  case CU_MEMPOOL_ATTR_REUSE_ALLOW_OPPORTUNISTIC:
  case CU_MEMPOOL_ATTR_REUSE_ALLOW_INTERNAL_DEPENDENCIES:
    p->reuse[attr - CU_MEMPOOL_ATTR_REUSE_FOLLOW_EVENT_DEPENDENCIES] = *(int *)value != 0;
    break;
  case CU_MEMPOOL_ATTR_RELEASE_THRESHOLD:
    p->threshold = *(cuuint64_t *)value;
    break;
  case CU_MEMPOOL_ATTR_RESERVED_MEM_HIGH:
  case CU_MEMPOOL_ATTR_USED_MEM_HIGH:
    /* Only a reset (to the current value) is allowed. */
    if (*(cuuint64_t *)value != 0)
      return drv_end(drv_misuse(CUDA_ERROR_INVALID_VALUE, "a high watermark can only be reset"));
    if (attr == CU_MEMPOOL_ATTR_RESERVED_MEM_HIGH)
      p->reserved_high = p->reserved;
    else
      p->used_high = p->used;
    break;
  default:
    return drv_end(drv_misuse(CUDA_ERROR_INVALID_VALUE, "attribute %d cannot be set", (int)attr));
  }
  return drv_end(CUDA_SUCCESS);
}

CUresult CUDAAPI cuMemPoolGetAttribute(CUmemoryPool pool, CUmemPool_attribute attr, void *value) {
  DRV_BEGIN(cuMemPoolGetAttribute, DRV_NEED_INIT);
  struct CUmemPoolHandle_st *p = pool_find(pool);
  if (!p) return drv_end(drv_misuse(CUDA_ERROR_INVALID_VALUE, "unknown pool %p", (void *)pool));
  if (!value) return drv_end(drv_misuse(CUDA_ERROR_INVALID_VALUE, "NULL value"));
  switch (attr) {
  case CU_MEMPOOL_ATTR_REUSE_FOLLOW_EVENT_DEPENDENCIES:
  case CU_MEMPOOL_ATTR_REUSE_ALLOW_OPPORTUNISTIC:
  case CU_MEMPOOL_ATTR_REUSE_ALLOW_INTERNAL_DEPENDENCIES:
    *(int *)value = p->reuse[attr - CU_MEMPOOL_ATTR_REUSE_FOLLOW_EVENT_DEPENDENCIES];
    break;
  case CU_MEMPOOL_ATTR_RELEASE_THRESHOLD:
    *(cuuint64_t *)value = p->threshold;
    break;
  case CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT:
    *(cuuint64_t *)value = p->reserved;
    break;
  case CU_MEMPOOL_ATTR_RESERVED_MEM_HIGH:
    *(cuuint64_t *)value = p->reserved_high;
    break;
  case CU_MEMPOOL_ATTR_USED_MEM_CURRENT:
    *(cuuint64_t *)value = p->used;
    break;
  case CU_MEMPOOL_ATTR_USED_MEM_HIGH:
    *(cuuint64_t *)value = p->used_high;
    break;
  default:
    return drv_end(drv_misuse(CUDA_ERROR_INVALID_VALUE, "attribute %d", (int)attr));
  }
  return drv_end(CUDA_SUCCESS);
}

CUresult CUDAAPI cuMemPoolTrimTo(CUmemoryPool pool, size_t minBytesToKeep) {
  DRV_BEGIN(cuMemPoolTrimTo, DRV_NEED_INIT);
  struct CUmemPoolHandle_st *p = pool_find(pool);
  if (!p) return drv_end(drv_misuse(CUDA_ERROR_INVALID_VALUE, "unknown pool %p", (void *)pool));
  pool_release(p, minBytesToKeep);
  return drv_end(CUDA_SUCCESS);
}

/* ---- page-locked host memory -----------------------------------------------------------------*/

static CUresult host_alloc(void **pp, size_t size, unsigned flags) {
  if (!pp) return drv_misuse(CUDA_ERROR_INVALID_VALUE, "NULL output");
  if (size == 0) return drv_misuse(CUDA_ERROR_INVALID_VALUE, "size 0");
  unsigned known =
      CU_MEMHOSTALLOC_PORTABLE | CU_MEMHOSTALLOC_DEVICEMAP | CU_MEMHOSTALLOC_WRITECOMBINED;
  if (flags & ~known) return drv_misuse(CUDA_ERROR_INVALID_VALUE, "flags %#x", flags);
  drv_linear_t *l;
  struct CUctx_st *c = drv_current();
  CUresult rc = linear_new(DRV_LINEAR_HOST, c->device, c, size, false, &l);
  if (rc == CUDA_SUCCESS) {
    l->host_flags = flags;
    *pp = (void *)l->addr;
  }
  return rc;
}

/* The page-locked allocation holding p (any address inside it), or NULL. */
static drv_linear_t *host_containing(uintptr_t p) {
  drv_linear_t *l = linear_containing(p);
  return l && l->kind == DRV_LINEAR_HOST ? l : NULL;
}

/* The flags the allocation holding p was made with (cuMemAllocHost: 0). */
CUresult CUDAAPI cuMemHostGetFlags(unsigned int *pFlags, void *p) {
  DRV_BEGIN(cuMemHostGetFlags, DRV_NEED_CTX);
  if (!pFlags) return drv_end(drv_misuse(CUDA_ERROR_INVALID_VALUE, "NULL output"));
  drv_linear_t *l = p ? host_containing((uintptr_t)p) : NULL;
  if (!l)
    return drv_end(
        drv_misuse(CUDA_ERROR_INVALID_VALUE, "%p is not in a page-locked host allocation", p));
  *pFlags = l->host_flags;
  return drv_end(CUDA_SUCCESS);
}

CUresult CUDAAPI cuMemAllocHost(void **pp, size_t bytesize) {
  DRV_BEGIN(cuMemAllocHost_v2, DRV_NEED_CTX);
  return drv_end(host_alloc(pp, bytesize, 0));
}

CUresult CUDAAPI cuMemAllocHost_v1(void **pp, unsigned int bytesize) {
  DRV_BEGIN(cuMemAllocHost, DRV_NEED_CTX);
  return drv_end(host_alloc(pp, bytesize, 0));
}

CUresult CUDAAPI cuMemHostAlloc(void **pp, size_t bytesize, unsigned int Flags) {
  DRV_BEGIN(cuMemHostAlloc, DRV_NEED_CTX);
  return drv_end(host_alloc(pp, bytesize, Flags));
}

CUresult CUDAAPI cuMemFreeHost(void *p) {
  DRV_BEGIN(cuMemFreeHost, DRV_NEED_CTX);
  drv_linear_t *l = p ? linear_find((uintptr_t)p) : NULL;
  if (!l || l->kind != DRV_LINEAR_HOST)
    return drv_end(
        drv_misuse(CUDA_ERROR_INVALID_VALUE, "%p is not a page-locked host allocation", p));
  linear_free(l);
  return drv_end(CUDA_SUCCESS);
}

/* ---- a context's reset or destroy -----------------------------------------------------------*/

/* The context's cuMemAlloc and page-locked host memory goes, as "all allocations" of a context
 * do on CUDA (cuCtxDestroy names cuMemAlloc and cuMemAllocHost memory): the pages are unmapped,
 * so a later touch faults (host memory too: the runtime's documentation says such memory
 * vanishes with its device's state). Stream-ordered memory stays, its pools with it: it belongs
 * to no context (cuCtxDestroy's note; cudaDeviceReset's documentation says it "will not destroy
 * memory allocations by cudaMallocAsync() and cudaMallocFromPoolAsync()"). */
void drv_linear_drop_ctx(struct CUctx_st *ctx) {
  for (size_t b = 0; b < DRV_LINEAR_BUCKETS; b++)
    for (drv_linear_t *l = D.linear[b], *next; l; l = next) {
      next = l->next;
      if (l->ctx != ctx || l->kind == DRV_LINEAR_POOL) continue;
      if (l->kind == DRV_LINEAR_DEVICE) drv_uncharge(l->device, l->charged);
      linear_free(l);
    }
}

/* ---- copies and sets -------------------------------------------------------------------------*/

/* Copies and sets take effect when called (program order); an asynchronous one also takes a
 * ticket on its stream, a synchronous one waits for the legacy stream first, as CUDA does. */
static CUresult copy(CUdeviceptr dst, CUdeviceptr src, size_t n, CUstream hStream, bool async) {
  if (n == 0) return CUDA_SUCCESS;
  if (!dst || !src) return drv_misuse(CUDA_ERROR_INVALID_VALUE, "NULL address");
  struct CUstream_st *s;
  CUresult rc = drv_stream_get(async ? hStream : CU_STREAM_LEGACY, &s);
  if (rc != CUDA_SUCCESS) return rc;
  if (s->capture != CU_STREAM_CAPTURE_STATUS_NONE) return drv_capture_refuse(s);
  /* A synchronous one waits for the legacy stream, and through it for the blocking streams. */
  if (!async) {
    if (!drv_enqueue(s, 0, NULL, NULL, 0)) return CUDA_ERROR_OUT_OF_MEMORY;
    drv_stream_wait(s, s->enq);
  }
  memmove((void *)(uintptr_t)dst, (const void *)(uintptr_t)src, n);
  if (async && !drv_enqueue(s, 0, NULL, NULL, 0)) return CUDA_ERROR_OUT_OF_MEMORY;
  return CUDA_SUCCESS;
}

static CUresult set(CUdeviceptr dst, uint32_t v, unsigned width, size_t n, CUstream hStream,
                    bool async) {
  if (n == 0) return CUDA_SUCCESS;
  if (!dst) return drv_misuse(CUDA_ERROR_INVALID_VALUE, "NULL address");
  if (dst % width)
    return drv_misuse(CUDA_ERROR_INVALID_VALUE, "%#llx is not %u-byte aligned",
                      (unsigned long long)dst, width);
  struct CUstream_st *s;
  CUresult rc = drv_stream_get(async ? hStream : CU_STREAM_LEGACY, &s);
  if (rc != CUDA_SUCCESS) return rc;
  if (s->capture != CU_STREAM_CAPTURE_STATUS_NONE) return drv_capture_refuse(s);
  if (!async) {
    if (!drv_enqueue(s, 0, NULL, NULL, 0)) return CUDA_ERROR_OUT_OF_MEMORY;
    drv_stream_wait(s, s->enq);
  }
  if (width == 1) {
    memset((void *)(uintptr_t)dst, (int)(v & 0xff), n);
  } else {
    uint32_t *p = (uint32_t *)(uintptr_t)dst;
    for (size_t i = 0; i < n; i++) p[i] = v;
  }
  if (async && !drv_enqueue(s, 0, NULL, NULL, 0)) return CUDA_ERROR_OUT_OF_MEMORY;
  return CUDA_SUCCESS;
}

#define HOSTPTR(p) ((CUdeviceptr)(uintptr_t)(p))

CUresult CUDAAPI cuMemcpy(CUdeviceptr dst, CUdeviceptr src, size_t ByteCount) {
  DRV_BEGIN(cuMemcpy, DRV_NEED_CTX);
  return drv_end(copy(dst, src, ByteCount, NULL, false));
}

CUresult CUDAAPI cuMemcpyAsync(CUdeviceptr dst, CUdeviceptr src, size_t ByteCount,
                               CUstream hStream) {
  DRV_BEGIN(cuMemcpyAsync, DRV_NEED_CTX);
  return drv_end(copy(dst, src, ByteCount, hStream, true));
}

CUresult CUDAAPI cuMemcpyHtoD(CUdeviceptr dstDevice, const void *srcHost, size_t ByteCount) {
  DRV_BEGIN(cuMemcpyHtoD_v2, DRV_NEED_CTX);
  return drv_end(copy(dstDevice, HOSTPTR(srcHost), ByteCount, NULL, false));
}

CUresult CUDAAPI cuMemcpyDtoH(void *dstHost, CUdeviceptr srcDevice, size_t ByteCount) {
  DRV_BEGIN(cuMemcpyDtoH_v2, DRV_NEED_CTX);
  return drv_end(copy(HOSTPTR(dstHost), srcDevice, ByteCount, NULL, false));
}

CUresult CUDAAPI cuMemcpyDtoD(CUdeviceptr dstDevice, CUdeviceptr srcDevice, size_t ByteCount) {
  DRV_BEGIN(cuMemcpyDtoD_v2, DRV_NEED_CTX);
  return drv_end(copy(dstDevice, srcDevice, ByteCount, NULL, false));
}

CUresult CUDAAPI cuMemcpyHtoDAsync(CUdeviceptr dstDevice, const void *srcHost, size_t ByteCount,
                                   CUstream hStream) {
  DRV_BEGIN(cuMemcpyHtoDAsync_v2, DRV_NEED_CTX);
  return drv_end(copy(dstDevice, HOSTPTR(srcHost), ByteCount, hStream, true));
}

CUresult CUDAAPI cuMemcpyDtoHAsync(void *dstHost, CUdeviceptr srcDevice, size_t ByteCount,
                                   CUstream hStream) {
  DRV_BEGIN(cuMemcpyDtoHAsync_v2, DRV_NEED_CTX);
  return drv_end(copy(HOSTPTR(dstHost), srcDevice, ByteCount, hStream, true));
}

CUresult CUDAAPI cuMemcpyDtoDAsync(CUdeviceptr dstDevice, CUdeviceptr srcDevice, size_t ByteCount,
                                   CUstream hStream) {
  DRV_BEGIN(cuMemcpyDtoDAsync_v2, DRV_NEED_CTX);
  return drv_end(copy(dstDevice, srcDevice, ByteCount, hStream, true));
}

CUresult CUDAAPI cuMemsetD8(CUdeviceptr dstDevice, unsigned char uc, size_t N) {
  DRV_BEGIN(cuMemsetD8_v2, DRV_NEED_CTX);
  return drv_end(set(dstDevice, uc, 1, N, NULL, false));
}

CUresult CUDAAPI cuMemsetD32(CUdeviceptr dstDevice, unsigned int ui, size_t N) {
  DRV_BEGIN(cuMemsetD32_v2, DRV_NEED_CTX);
  return drv_end(set(dstDevice, ui, 4, N, NULL, false));
}

CUresult CUDAAPI cuMemsetD8Async(CUdeviceptr dstDevice, unsigned char uc, size_t N,
                                 CUstream hStream) {
  DRV_BEGIN(cuMemsetD8Async, DRV_NEED_CTX);
  return drv_end(set(dstDevice, uc, 1, N, hStream, true));
}

CUresult CUDAAPI cuMemsetD32Async(CUdeviceptr dstDevice, unsigned int ui, size_t N,
                                  CUstream hStream) {
  DRV_BEGIN(cuMemsetD32Async, DRV_NEED_CTX);
  return drv_end(set(dstDevice, ui, 4, N, hStream, true));
}
