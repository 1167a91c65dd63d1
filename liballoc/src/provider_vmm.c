/* The CUDA VMM provider: address space, physical memory and stream events from the CUDA driver,
 * which is loaded at run time so that the library itself loads on machines without one. */
#include "internal.h"

#include <errno.h>

#ifndef WL_HAVE_CUDA_H

int wl_provider_vmm_init(wl_provider_t *out, int device, const char *driver_path) {
  (void)out;
  (void)device;
  (void)driver_path;
  return -ENOSYS;
}

int wl_provider_vmm_init_with(wl_provider_t *out, int device, wl_vmm_resolve_fn resolve,
                              void *arg) {
  (void)out;
  (void)device;
  (void)resolve;
  (void)arg;
  return -ENOSYS;
}

#else

#include <cuda.h>
#include <dlfcn.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>

/* Every driver entry point we call. cuda.h #defines some names to their current version
 * (cuDeviceTotalMem -> cuDeviceTotalMem_v2); the field and the looked-up symbol are spelled
 * through the same macro, so the pointer's type and the symbol always agree. */
#define VMM_REQUIRED(X)                                                                            \
  X(cuInit)                                                                                        \
  X(cuDriverGetVersion)                                                                            \
  X(cuDeviceGetCount)                                                                              \
  X(cuDeviceGet)                                                                                   \
  X(cuDeviceGetAttribute)                                                                          \
  X(cuDeviceTotalMem)                                                                              \
  X(cuDevicePrimaryCtxRetain)                                                                      \
  X(cuDevicePrimaryCtxRelease)                                                                     \
  X(cuCtxGetCurrent)                                                                               \
  X(cuCtxSetCurrent)                                                                               \
  X(cuCtxGetDevice)                                                                                \
  X(cuMemGetAllocationGranularity)                                                                 \
  X(cuMemAddressReserve)                                                                           \
  X(cuMemAddressFree)                                                                              \
  X(cuMemCreate)                                                                                   \
  X(cuMemRelease)                                                                                  \
  X(cuMemMap)                                                                                      \
  X(cuMemSetAccess)                                                                                \
  X(cuMemUnmap)                                                                                    \
  X(cuStreamQuery)                                                                                 \
  X(cuEventCreate)                                                                                 \
  X(cuEventRecord)                                                                                 \
  X(cuEventQuery)                                                                                  \
  X(cuEventDestroy)
#define VMM_OPTIONAL(X)                                                                            \
  X(cuGetErrorName)                                                                                \
  X(cuStreamIsCapturing)                                                                           \
  X(cuMemExportToShareableHandle)                                                                  \
  X(cuMemImportFromShareableHandle)

#define VMM_STR_(x)  #x
#define VMM_STR(x)   VMM_STR_(x)

typedef struct vmm_api_s {
#define VMM_FIELD(f) __typeof__(f) *f;
  VMM_REQUIRED(VMM_FIELD)
  VMM_OPTIONAL(VMM_FIELD)
#undef VMM_FIELD
} vmm_api_t;

typedef struct vmm_sym_s {
  const char *name;
  size_t offset;
  bool required;
} vmm_sym_t;

static const vmm_sym_t vmm_syms[] = {
#define VMM_REQ(f) {VMM_STR(f), offsetof(vmm_api_t, f), true},
#define VMM_OPT(f) {VMM_STR(f), offsetof(vmm_api_t, f), false},
    VMM_REQUIRED(VMM_REQ) VMM_OPTIONAL(VMM_OPT)
#undef VMM_REQ
#undef VMM_OPT
};

#define WL__VMM_ACCESS_MAX 16

typedef struct vmm_s {
  void *lib;
  vmm_api_t api;
  CUcontext ctx;
  CUdevice dev;
  bool retained; /* we retained dev's primary context: released in destroy */
  size_t gran;
  CUmemAllocationProp prop;
  /* Who may access what is mapped: the device, then devices granted access (wl_alloc_grant). */
  CUmemAccessDesc access[WL__VMM_ACCESS_MAX];
  unsigned naccess;
  /* Physical memory is created shareable as a POSIX file descriptor (for CUDA IPC of served
   * memory) while this holds: cleared for good at the first refusal. Atomic. */
  bool shareable;
} vmm_t;

/* ---- errors ----------------------------------------------------------------------------------*/

/* One line per CUDA error code per process: a failing driver repeats itself. */
static uint32_t vmm_logged[(1024 + 32) / 32];

static int vmm_errno(CUresult r) {
  switch (r) {
  case CUDA_SUCCESS:
    return 0;
  case CUDA_ERROR_OUT_OF_MEMORY:
    return -ENOMEM;
  case CUDA_ERROR_INVALID_VALUE:
  case CUDA_ERROR_INVALID_HANDLE:
    return -EINVAL;
  case CUDA_ERROR_NOT_SUPPORTED:
    return -ENOTSUP;
  /* Refused because of a stream capture in progress (a call it prohibits, an implicit
   * synchronisation with a capturing stream): for now, not for good. */
  case CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED:
  case CUDA_ERROR_STREAM_CAPTURE_INVALIDATED:
  case CUDA_ERROR_STREAM_CAPTURE_IMPLICIT:
  case CUDA_ERROR_CAPTURED_EVENT:
  case CUDA_ERROR_STREAM_CAPTURE_WRONG_THREAD:
    return -EAGAIN;
  /* The driver has shut down (the process is exiting, after the runtime's teardown): everything
   * it held is gone, and nothing is wrong (seen on an H200, at the exit of a program that had
   * used CUDA IPC). */
  case CUDA_ERROR_DEINITIALIZED:
    return -ESHUTDOWN;
  default:
    return -EIO;
  }
}

static const char *vmm_err_name(const vmm_t *v, CUresult r) {
  const char *name = NULL;
  if (v->api.cuGetErrorName && v->api.cuGetErrorName(r, &name) != CUDA_SUCCESS) name = NULL;
  return name ? name : "unknown CUDA error";
}

/* Maps r to a negative errno, logging the first failure of each kind. */
static int vmm_fail(const vmm_t *v, const char *what, CUresult r) {
  if (r == CUDA_SUCCESS) return 0;
  if (r == CUDA_ERROR_DEINITIALIZED) return vmm_errno(r); /* exiting: said nowhere */
  unsigned bit = (unsigned)r < 1024 ? (unsigned)r : 1024;
  uint32_t mask = 1u << (bit % 32);
  if (!(__atomic_fetch_or(&vmm_logged[bit / 32], mask, __ATOMIC_RELAXED) & mask))
    wl__warn("vmm provider: %s failed: %s (%d)", what, vmm_err_name(v, r), (int)r);
  return vmm_errno(r);
}

/* ---- the context -----------------------------------------------------------------------------*/

/* Makes our context current on this thread for one call and says what to restore. The driver
 * keeps the current context per thread and cuCtxGetCurrent only reads it, so asking each time
 * is cheap; a cache of our own could not see the application switching contexts meanwhile.
 * Threads without a context (the allocator's trim thread) get ours for the call only. */
static CUresult vmm_enter(const vmm_t *v, CUcontext *prev) {
  CUcontext cur = NULL;
  CUresult r = v->api.cuCtxGetCurrent(&cur);
  *prev = cur;
  if (r != CUDA_SUCCESS) {
    *prev = v->ctx; /* nothing to restore */
    return r;
  }
  if (cur == v->ctx) return CUDA_SUCCESS;
  r = v->api.cuCtxSetCurrent(v->ctx);
  if (r != CUDA_SUCCESS) *prev = v->ctx;
  return r;
}

static void vmm_leave(const vmm_t *v, CUcontext prev) {
  if (prev != v->ctx) v->api.cuCtxSetCurrent(prev);
}

/* Runs one driver call with our context current; r receives its result. */
#define VMM_CALL(v, r, call)                                                                       \
  do {                                                                                             \
    CUcontext prev_;                                                                               \
    (r) = vmm_enter((v), &prev_);                                                                  \
    if ((r) == CUDA_SUCCESS) {                                                                     \
      (r) = (call);                                                                                \
      vmm_leave((v), prev_);                                                                       \
    }                                                                                              \
  } while (0)

/* ---- the operations --------------------------------------------------------------------------*/

static int vmm_reserve(void *ctx, size_t size, uintptr_t *addr) {
  vmm_t *v = ctx;
  CUdeviceptr p = 0;
  CUresult r;
  /* Granularity-aligned, so every chunk offset is a valid mapping address. */
  VMM_CALL(v, r, v->api.cuMemAddressReserve(&p, size, v->gran, 0, 0));
  if (r != CUDA_SUCCESS) return vmm_fail(v, "cuMemAddressReserve", r);
  *addr = (uintptr_t)p;
  return 0;
}

static int vmm_unreserve(void *ctx, uintptr_t addr, size_t size) {
  vmm_t *v = ctx;
  CUresult r;
  VMM_CALL(v, r, v->api.cuMemAddressFree((CUdeviceptr)addr, size));
  return vmm_fail(v, "cuMemAddressFree", r);
}

static int vmm_phys_create(void *ctx, size_t size, void **handle) {
  vmm_t *v = ctx;
  CUmemGenericAllocationHandle h = 0;
  CUmemAllocationProp prop = v->prop;
  bool shareable = __atomic_load_n(&v->shareable, __ATOMIC_RELAXED);
  if (shareable) prop.requestedHandleTypes = CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;
  CUresult r;
  VMM_CALL(v, r, v->api.cuMemCreate(&h, size, &prop, 0));
  /* A device or system (a container, a virtualised GPU) that says it can share and then will
   * not: plain memory from now on; only CUDA IPC of served memory is lost. Out of memory and a
   * capture's refusal are not that. */
  if (shareable && r != CUDA_SUCCESS && vmm_errno(r) != -ENOMEM && vmm_errno(r) != -EAGAIN) {
    __atomic_store_n(&v->shareable, false, __ATOMIC_RELAXED);
    wl__warn("vmm provider: shareable physical memory refused (%s, %d); CUDA IPC of served "
             "memory is off",
             vmm_err_name(v, r), (int)r);
    prop.requestedHandleTypes = CU_MEM_HANDLE_TYPE_NONE;
    VMM_CALL(v, r, v->api.cuMemCreate(&h, size, &prop, 0));
  }
  if (r != CUDA_SUCCESS) return vmm_fail(v, "cuMemCreate", r);
  *handle = (void *)(uintptr_t)h;
  return 0;
}

static int vmm_phys_release(void *ctx, void *handle, size_t size) {
  vmm_t *v = ctx;
  (void)size;
  CUresult r;
  VMM_CALL(v, r, v->api.cuMemRelease((CUmemGenericAllocationHandle)(uintptr_t)handle));
  return vmm_fail(v, "cuMemRelease", r);
}

static int vmm_map(void *ctx, uintptr_t addr, size_t size, void *handle) {
  vmm_t *v = ctx;
  CUcontext prev;
  CUresult r = vmm_enter(v, &prev);
  if (r != CUDA_SUCCESS) return vmm_fail(v, "cuCtxSetCurrent", r);
  const char *what = "cuMemMap";
  r = v->api.cuMemMap((CUdeviceptr)addr, size, 0, (CUmemGenericAllocationHandle)(uintptr_t)handle,
                      0);
  if (r == CUDA_SUCCESS) {
    what = "cuMemSetAccess";
    r = v->api.cuMemSetAccess((CUdeviceptr)addr, size, v->access, v->naccess);
    /* A mapping nobody may touch is of no use: take it back so the range stays reusable. */
    if (r != CUDA_SUCCESS) v->api.cuMemUnmap((CUdeviceptr)addr, size);
  }
  vmm_leave(v, prev);
  return vmm_fail(v, what, r);
}

/* Called under the allocator's lock, as vmm_map is: the list is read and grown there only. */
static int vmm_grant(void *ctx, int device, uintptr_t addr, size_t size) {
  vmm_t *v = ctx;
  CUmemAccessDesc d = {.location = {.type = CU_MEM_LOCATION_TYPE_DEVICE, .id = device},
                       .flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE};
  if (!size) {
    for (unsigned i = 0; i < v->naccess; i++)
      if (v->access[i].location.id == device) return 0;
    if (v->naccess == WL__VMM_ACCESS_MAX) return -ENOSPC;
    /* With nothing mapped yet no cuMemSetAccess has tried the device: at least it must be one. */
    CUdevice dev;
    CUresult r;
    VMM_CALL(v, r, v->api.cuDeviceGet(&dev, device));
    if (r != CUDA_SUCCESS) return vmm_fail(v, "cuDeviceGet", r);
    v->access[v->naccess++] = d;
    return 0;
  }
  CUresult r;
  VMM_CALL(v, r, v->api.cuMemSetAccess((CUdeviceptr)addr, size, &d, 1));
  return vmm_fail(v, "cuMemSetAccess", r);
}

static int vmm_unmap(void *ctx, uintptr_t addr, size_t size) {
  vmm_t *v = ctx;
  CUresult r;
  VMM_CALL(v, r, v->api.cuMemUnmap((CUdeviceptr)addr, size));
  return vmm_fail(v, "cuMemUnmap", r);
}

static int vmm_stream_check(void *ctx, wl_stream_t stream) {
  vmm_t *v = ctx;
  CUresult r;
  /* Asked first whether it captures: a query of a capturing stream is "invalid" and invalidates
   * its capture (the programming guide), where this question is documented not to. */
  if (v->api.cuStreamIsCapturing) {
    CUstreamCaptureStatus st = CU_STREAM_CAPTURE_STATUS_NONE;
    VMM_CALL(v, r, v->api.cuStreamIsCapturing((CUstream)stream, &st));
    if ((r == CUDA_SUCCESS && st != CU_STREAM_CAPTURE_STATUS_NONE) ||
        r == CUDA_ERROR_STREAM_CAPTURE_IMPLICIT)
      return 0;
    if (r != CUDA_SUCCESS) return -EINVAL; /* not a stream (unlogged, as below) */
  }
  VMM_CALL(v, r, v->api.cuStreamQuery((CUstream)stream));
  /* A capturing stream answers with a capture error: it exists all the same. Not logged: an
   * unknown stream is the caller's mistake, and the allocator reports it. */
  bool ok = r == CUDA_SUCCESS || r == CUDA_ERROR_NOT_READY ||
            r == CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED || r == CUDA_ERROR_STREAM_CAPTURE_IMPLICIT;
  return ok ? 0 : -EINVAL;
}

static int vmm_event_create(void *ctx, void **event) {
  vmm_t *v = ctx;
  CUevent e = NULL;
  CUresult r;
  VMM_CALL(v, r, v->api.cuEventCreate(&e, CU_EVENT_DISABLE_TIMING));
  if (r != CUDA_SUCCESS) return vmm_fail(v, "cuEventCreate", r);
  *event = e;
  return 0;
}

static int vmm_event_destroy(void *ctx, void *event) {
  vmm_t *v = ctx;
  CUresult r;
  VMM_CALL(v, r, v->api.cuEventDestroy((CUevent)event));
  return vmm_fail(v, "cuEventDestroy", r);
}

static int vmm_event_record(void *ctx, void *event, wl_stream_t stream) {
  vmm_t *v = ctx;
  CUresult r;
  /* Recorded into a capture, the event would answer CUDA_ERROR_CAPTURED_EVENT until recorded
   * again, and the frees behind it would wait for good: not now (the caller tries later). */
  if (v->api.cuStreamIsCapturing) {
    CUstreamCaptureStatus st = CU_STREAM_CAPTURE_STATUS_NONE;
    VMM_CALL(v, r, v->api.cuStreamIsCapturing((CUstream)stream, &st));
    if (r == CUDA_SUCCESS && st != CU_STREAM_CAPTURE_STATUS_NONE) return -EAGAIN;
    if (r != CUDA_SUCCESS && vmm_errno(r) == -EAGAIN) return -EAGAIN;
  }
  VMM_CALL(v, r, v->api.cuEventRecord((CUevent)event, (CUstream)stream));
  return vmm_fail(v, "cuEventRecord", r);
}

static int vmm_event_query(void *ctx, void *event) {
  vmm_t *v = ctx;
  CUresult r;
  VMM_CALL(v, r, v->api.cuEventQuery((CUevent)event));
  if (r == CUDA_ERROR_NOT_READY) return -EBUSY;
  return vmm_fail(v, "cuEventQuery", r);
}

/* ---- sharing with other processes (CUDA IPC of served memory) -------------------------------*/

static int vmm_phys_export(void *ctx, void *handle, int *fd) {
  vmm_t *v = ctx;
  /* Not asked of the driver once sharing is off: some handles may still be shareable (made
   * before the refusal), but an allocation half of such chunks is not worth telling apart. */
  if (!v->api.cuMemExportToShareableHandle || !__atomic_load_n(&v->shareable, __ATOMIC_RELAXED))
    return -ENOTSUP;
  int out = -1;
  CUresult r;
  VMM_CALL(v, r,
           v->api.cuMemExportToShareableHandle(&out,
                                               (CUmemGenericAllocationHandle)(uintptr_t)handle,
                                               CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0));
  /* Created before sharing was refused, or never shareable: not an error of the driver's. */
  if (r == CUDA_ERROR_INVALID_VALUE || r == CUDA_ERROR_NOT_SUPPORTED ||
      r == CUDA_ERROR_NOT_PERMITTED)
    return -ENOTSUP;
  if (r != CUDA_SUCCESS) return vmm_fail(v, "cuMemExportToShareableHandle", r);
  *fd = out;
  return 0;
}

/* An import: the reservation and the handles mapped in it. */
typedef struct vmm_import_s {
  CUdeviceptr base;
  size_t size, n;
  CUmemGenericAllocationHandle h[];
} vmm_import_t;

static void vmm_import_undo(vmm_t *v, vmm_import_t *im, size_t mapped, size_t handles) {
  size_t piece = im->size / im->n;
  for (size_t i = 0; i < mapped; i++) v->api.cuMemUnmap(im->base + i * piece, piece);
  for (size_t i = 0; i < handles; i++) v->api.cuMemRelease(im->h[i]);
  if (im->base) v->api.cuMemAddressFree(im->base, im->size);
  free(im);
}

static int vmm_import(void *ctx, const int *fds, size_t n, size_t piece, uintptr_t *addr,
                      void **token) {
  vmm_t *v = ctx;
  if (!v->api.cuMemImportFromShareableHandle) return -ENOTSUP;
  if (!n || !piece || piece % v->gran || n > SIZE_MAX / piece) return -EINVAL;
  vmm_import_t *im = calloc(1, sizeof *im + n * sizeof im->h[0]);
  if (!im) return -ENOMEM;
  im->size = n * piece;
  im->n = n;
  CUcontext prev;
  CUresult r = vmm_enter(v, &prev);
  if (r != CUDA_SUCCESS) {
    free(im);
    return vmm_fail(v, "cuCtxSetCurrent", r);
  }
  const char *what = "cuMemImportFromShareableHandle";
  size_t handles = 0, mapped = 0;
  for (; handles < n; handles++) {
    r = v->api.cuMemImportFromShareableHandle(&im->h[handles], (void *)(uintptr_t)fds[handles],
                                              CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR);
    if (r != CUDA_SUCCESS) goto fail;
  }
  what = "cuMemAddressReserve";
  if ((r = v->api.cuMemAddressReserve(&im->base, im->size, v->gran, 0, 0)) != CUDA_SUCCESS)
    goto fail;
  what = "cuMemMap";
  for (; mapped < n; mapped++)
    if ((r = v->api.cuMemMap(im->base + mapped * piece, piece, 0, im->h[mapped], 0)) !=
        CUDA_SUCCESS)
      goto fail;
  what = "cuMemSetAccess";
  if ((r = v->api.cuMemSetAccess(im->base, im->size, v->access, v->naccess)) != CUDA_SUCCESS)
    goto fail;
  vmm_leave(v, prev);
  *addr = (uintptr_t)im->base;
  *token = im;
  return 0;
fail:
  vmm_import_undo(v, im, mapped, handles);
  vmm_leave(v, prev);
  return vmm_fail(v, what, r);
}

static int vmm_unimport(void *ctx, void *token) {
  vmm_t *v = ctx;
  vmm_import_t *im = token;
  if (!im) return -EINVAL;
  CUcontext prev;
  CUresult r = vmm_enter(v, &prev);
  if (r != CUDA_SUCCESS) return vmm_fail(v, "cuCtxSetCurrent", r);
  vmm_import_undo(v, im, im->n, im->n);
  vmm_leave(v, prev);
  return 0;
}

static void vmm_destroy(void *ctx) {
  vmm_t *v = ctx;
  if (v->retained)
    vmm_fail(v, "cuDevicePrimaryCtxRelease", v->api.cuDevicePrimaryCtxRelease(v->dev));
  if (v->lib) dlclose(v->lib);
  free(v);
}

/* ---- init ------------------------------------------------------------------------------------*/

/* Picks the context: the calling thread's when it belongs to the device, else the device's
 * primary context. The primary context is retained either way (the calling thread's current
 * one when it is the primary): our calls run in it and our events belong to it, and a program
 * that releases its last reference while we serve (wl-prog-drv does, before exit) would
 * destroy it under us (VMM memory itself belongs to no context and would survive). */
static CUresult vmm_pick_context(vmm_t *v, const char **what) {
  CUcontext cur = NULL, primary = NULL;
  *what = "cuCtxGetCurrent";
  CUresult r = v->api.cuCtxGetCurrent(&cur);
  if (r != CUDA_SUCCESS) return r;
  if (cur) {
    CUdevice d;
    if (v->api.cuCtxGetDevice(&d) != CUDA_SUCCESS || d != v->dev) cur = NULL;
  }
  *what = "cuDevicePrimaryCtxRetain";
  r = v->api.cuDevicePrimaryCtxRetain(&primary, v->dev);
  if (r != CUDA_SUCCESS) return r;
  if (cur && cur != primary) { /* a context of the program's own (cuCtxCreate): used as it is */
    v->api.cuDevicePrimaryCtxRelease(v->dev);
    v->ctx = cur;
    return CUDA_SUCCESS;
  }
  v->ctx = primary;
  v->retained = true;
  return CUDA_SUCCESS;
}

/* Loads the entry points from lib (dlsym) or through resolve, then sets the provider up. */
static int vmm_init(wl_provider_t *out, int device, const char *path, void *lib,
                    wl_vmm_resolve_fn resolve, void *arg) {
  vmm_t *v = calloc(1, sizeof *v);
  if (!v) {
    if (lib) dlclose(lib);
    return -ENOMEM;
  }
  v->lib = lib;
  for (size_t i = 0; i < sizeof vmm_syms / sizeof vmm_syms[0]; i++) {
    void *sym = lib ? dlsym(lib, vmm_syms[i].name) : resolve(arg, vmm_syms[i].name);
    if (!sym && vmm_syms[i].required) {
      wl__warn("vmm provider: %s has no %s; driver too old?", path, vmm_syms[i].name);
      goto fail;
    }
    memcpy((char *)&v->api + vmm_syms[i].offset, &sym, sizeof sym);
  }

  const char *what;
  CUresult r;
  int version = 0, count = 0, vmm_ok = 0;
  size_t gran = 0, total = 0;
  if ((r = v->api.cuInit(0)) != CUDA_SUCCESS) {
    what = "cuInit";
    goto fail_cu;
  }
  if ((r = v->api.cuDriverGetVersion(&version)) != CUDA_SUCCESS) {
    what = "cuDriverGetVersion";
    goto fail_cu;
  }
  if (version < 10020) { /* VMM arrived with CUDA 10.2 */
    wl__warn("vmm provider: the CUDA driver (version %d) predates virtual memory management",
             version);
    goto fail;
  }
  if ((r = v->api.cuDeviceGetCount(&count)) != CUDA_SUCCESS) {
    what = "cuDeviceGetCount";
    goto fail_cu;
  }
  if (device >= count) {
    wl__warn("vmm provider: no CUDA device %d (%d found)", device, count);
    goto fail;
  }
  if ((r = v->api.cuDeviceGet(&v->dev, device)) != CUDA_SUCCESS) {
    what = "cuDeviceGet";
    goto fail_cu;
  }
  r = v->api.cuDeviceGetAttribute(&vmm_ok, CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED,
                                  v->dev);
  if (r != CUDA_SUCCESS || !vmm_ok) {
    wl__warn("vmm provider: CUDA device %d does not support virtual memory management", device);
    goto fail;
  }
  v->prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
  v->prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  v->prop.location.id = device; /* an ordinal, which a CUdevice need not be */
  v->access[0].location = v->prop.location;
  v->access[0].flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
  v->naccess = 1;
  int fd_ok = 0;
  if (v->api.cuMemExportToShareableHandle && v->api.cuMemImportFromShareableHandle &&
      v->api.cuDeviceGetAttribute(&fd_ok,
                                  CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR_SUPPORTED,
                                  v->dev) == CUDA_SUCCESS)
    v->shareable = fd_ok != 0;
  r = v->api.cuMemGetAllocationGranularity(&gran, &v->prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM);
  if (r != CUDA_SUCCESS) {
    what = "cuMemGetAllocationGranularity";
    goto fail_cu;
  }
  if (!wl__is_pow2(gran)) {
    wl__warn("vmm provider: device %d reports a granularity of %zu, not a power of two", device,
             gran);
    goto fail;
  }
  v->gran = gran;
  if ((r = v->api.cuDeviceTotalMem(&total, v->dev)) != CUDA_SUCCESS) {
    what = "cuDeviceTotalMem";
    goto fail_cu;
  }
  if ((r = vmm_pick_context(v, &what)) != CUDA_SUCCESS) goto fail_cu;

  *out = (wl_provider_t){
      .name = "cuda-vmm",
      .ctx = v,
      .granularity = gran,
      .capacity = total,
      .reserve = vmm_reserve,
      .unreserve = vmm_unreserve,
      .phys_create = vmm_phys_create,
      .phys_release = vmm_phys_release,
      .map = vmm_map,
      .unmap = vmm_unmap,
      .stream_check = vmm_stream_check,
      .event_create = vmm_event_create,
      .event_destroy = vmm_event_destroy,
      .event_record = vmm_event_record,
      .event_query = vmm_event_query,
      .destroy = vmm_destroy,
      .phys_export = vmm_phys_export,
      .import = vmm_import,
      .unimport = vmm_unimport,
      .grant = vmm_grant,
  };
  return 0;

fail_cu:
  wl__warn("vmm provider: %s failed for device %d: %s (%d)", what, device, vmm_err_name(v, r),
           (int)r);
fail:
  if (lib) dlclose(lib);
  free(v);
  return -ENODEV;
}

int wl_provider_vmm_init(wl_provider_t *out, int device, const char *driver_path) {
  if (!out || device < 0) return -EINVAL;
  const char *path = driver_path ? driver_path : "libcuda.so.1";
  /* NODELETE: the driver starts threads at cuInit, so unmapping it at dlclose is never safe. */
  void *lib = dlopen(path, RTLD_NOW | RTLD_LOCAL | RTLD_NODELETE);
  if (!lib) {
    const char *e = dlerror();
    wl__warn("vmm provider: cannot load the CUDA driver: %s", e ? e : path);
    return -ENODEV;
  }
  return vmm_init(out, device, path, lib, NULL, NULL);
}

int wl_provider_vmm_init_with(wl_provider_t *out, int device, wl_vmm_resolve_fn resolve,
                              void *arg) {
  if (!out || device < 0 || !resolve) return -EINVAL;
  return vmm_init(out, device, "the given driver", NULL, resolve, arg);
}

#endif /* WL_HAVE_CUDA_H */
