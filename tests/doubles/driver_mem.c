/* The CUDA driver double's virtual memory management: reservations are PROT_NONE mappings,
 * physical allocations are memfds counted against the device's capacity, cuMemMap maps a memfd
 * over the reservation with no access, and cuMemSetAccess is mprotect. A handle created for it
 * is exported as a dup of its memfd, and an imported fd becomes a handle of its own over the same
 * memory, in any process. For tests only. */
#include "driver.h"

#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#define D drv__state

static bool gran_aligned(uint64_t x) {
  return (x & (DRV_GRANULARITY - 1)) == 0;
}

/* A request the real driver would serve but the double does not model: said, not counted. */
static CUresult unmodelled(const char *what) {
  fprintf(stderr, "wltest-cuda: %s: %s is not modelled\n", D.fn, what);
  return CUDA_ERROR_NOT_SUPPORTED;
}

static CUresult check_location(const CUmemLocation *loc) {
  switch (loc->type) {
  case CU_MEM_LOCATION_TYPE_DEVICE:
    if (!drv_device_valid(loc->id))
      return drv_misuse(CUDA_ERROR_INVALID_DEVICE, "location names device %d", loc->id);
    return CUDA_SUCCESS;
  case CU_MEM_LOCATION_TYPE_HOST:
  case CU_MEM_LOCATION_TYPE_HOST_NUMA:
    return unmodelled("a host location");
  default:
    return drv_misuse(CUDA_ERROR_INVALID_VALUE, "location type %d", (int)loc->type);
  }
}

/* The name of a physical allocation's memfd, which an import checks for. */
#define PHYS_MEMFD_NAME "wltest-cuda-device"

#define HANDLE_TYPES_KNOWN                                                                         \
  (CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR | CU_MEM_HANDLE_TYPE_WIN32 |                           \
   CU_MEM_HANDLE_TYPE_WIN32_KMT | CU_MEM_HANDLE_TYPE_FABRIC)

/* Shareable handle types: POSIX file descriptors are modelled (the memory is a memfd already);
 * Win32 handles do not exist on Linux; fabric handles need IMEX channels, not modelled. */
static CUresult check_handle_types(unsigned types) {
  if (types & ~(unsigned)HANDLE_TYPES_KNOWN)
    return drv_misuse(CUDA_ERROR_INVALID_VALUE, "handle types %#x", types);
  if (types & (CU_MEM_HANDLE_TYPE_WIN32 | CU_MEM_HANDLE_TYPE_WIN32_KMT)) {
    fprintf(stderr, "wltest-cuda: %s: Win32 handles do not exist on Linux\n", D.fn);
    return CUDA_ERROR_NOT_SUPPORTED;
  }
  if (types & CU_MEM_HANDLE_TYPE_FABRIC) return unmodelled("a fabric handle");
  return CUDA_SUCCESS;
}

static CUresult check_prop(const CUmemAllocationProp *prop) {
  if (!prop) return drv_misuse(CUDA_ERROR_INVALID_VALUE, "NULL allocation properties");
  if (prop->type == CU_MEM_ALLOCATION_TYPE_MANAGED) return unmodelled("managed allocation");
  if (prop->type != CU_MEM_ALLOCATION_TYPE_PINNED)
    return drv_misuse(CUDA_ERROR_INVALID_VALUE, "allocation type %d", (int)prop->type);
  if (prop->win32HandleMetaData)
    return drv_misuse(CUDA_ERROR_INVALID_VALUE, "win32HandleMetaData must be NULL on Linux");
  if (prop->allocFlags.compressionType) return unmodelled("compressible memory");
  CUresult rc = check_location(&prop->location);
  if (rc != CUDA_SUCCESS) return rc;
  return check_handle_types((unsigned)prop->requestedHandleTypes);
}

static drv_reservation_t *res_containing(uintptr_t addr, size_t size) {
  for (drv_reservation_t *r = D.reservations; r; r = r->next)
    if (addr >= r->base && addr - r->base <= r->size && size <= r->size - (addr - r->base))
      return r;
  return NULL;
}

static drv_phys_t *phys_find(CUmemGenericAllocationHandle id) {
  for (drv_phys_t *p = D.phys; p; p = p->next)
    if (p->id == id && !p->released) return p;
  return NULL;
}

static void phys_free(drv_phys_t *p) {
  for (drv_phys_t **pp = &D.phys; *pp; pp = &(*pp)->next)
    if (*pp == p) {
      *pp = p->next;
      break;
    }
  close(p->fd);
  if (p->imported) {
    D.st.imported_bytes -= p->size;
  } else {
    drv_uncharge(p->device, p->size);
    D.st.phys_bytes -= p->size;
  }
  free(p);
}

static bool overlaps(uintptr_t a, size_t as, uintptr_t b, size_t bs) {
  return a < b + bs && b < a + as;
}

/* True when [addr, addr+size) is exactly the union of whole mappings: what cuMemUnmap and
 * cuMemSetAccess accept. Mappings never overlap, so whole ones summing to size tile it. */
static bool whole_mappings(uintptr_t addr, size_t size) {
  size_t sum = 0;
  for (drv_mapping_t *m = D.mappings; m; m = m->next) {
    if (!overlaps(addr, size, m->addr, m->size)) continue;
    if (m->addr < addr || m->addr + m->size > addr + size) return false;
    sum += m->size;
  }
  return sum == size;
}

static CUresult check_range(uint64_t addr, size_t size) {
  if (size == 0 || !gran_aligned(addr) || !gran_aligned(size))
    return drv_misuse(CUDA_ERROR_INVALID_VALUE,
                      "range %#llx+%zu is empty or not aligned to the granularity",
                      (unsigned long long)addr, size);
  if (addr + size < addr)
    return drv_misuse(CUDA_ERROR_INVALID_VALUE, "range %#llx+%zu wraps", (unsigned long long)addr,
                      size);
  return CUDA_SUCCESS;
}

CUresult CUDAAPI cuMemGetAllocationGranularity(size_t *granularity, const CUmemAllocationProp *prop,
                                               CUmemAllocationGranularity_flags option) {
  DRV_BEGIN(cuMemGetAllocationGranularity, DRV_NEED_INIT);
  if (!granularity) return drv_end(drv_misuse(CUDA_ERROR_INVALID_VALUE, "NULL output"));
  CUresult rc = check_prop(prop);
  if (rc != CUDA_SUCCESS) return drv_end(rc);
  if (option != CU_MEM_ALLOC_GRANULARITY_MINIMUM && option != CU_MEM_ALLOC_GRANULARITY_RECOMMENDED)
    return drv_end(drv_misuse(CUDA_ERROR_INVALID_VALUE, "option %d", (int)option));
  *granularity = DRV_GRANULARITY;
  return drv_end(CUDA_SUCCESS);
}

CUresult CUDAAPI cuMemAddressReserve(CUdeviceptr *ptr, size_t size, size_t alignment,
                                     CUdeviceptr addr, unsigned long long flags) {
  DRV_BEGIN(cuMemAddressReserve, DRV_NEED_INIT);
  DRV_UNSAFE(DRV_UNSAFE_VMM);
  size_t page = (size_t)sysconf(_SC_PAGESIZE);
  if (!ptr) return drv_end(drv_misuse(CUDA_ERROR_INVALID_VALUE, "NULL output"));
  if (size == 0 || size % page)
    return drv_end(
        drv_misuse(CUDA_ERROR_INVALID_VALUE, "size %zu is not a multiple of the page size", size));
  if (alignment & (alignment - 1))
    return drv_end(
        drv_misuse(CUDA_ERROR_INVALID_VALUE, "alignment %zu is not a power of two", alignment));
  if (addr % page)
    return drv_end(drv_misuse(CUDA_ERROR_INVALID_VALUE, "address hint %#llx is not page-aligned",
                              (unsigned long long)addr));
  if (flags) return drv_end(drv_misuse(CUDA_ERROR_INVALID_VALUE, "flags %#llx, must be 0", flags));
  /* Real reservations are at least granularity-aligned. Over-reserve, then trim both ends. */
  size_t align = alignment > DRV_GRANULARITY ? alignment : DRV_GRANULARITY;
  if (size > SIZE_MAX - align) return drv_end(CUDA_ERROR_OUT_OF_MEMORY);
  void *p = mmap((void *)(uintptr_t)addr, size + align, PROT_NONE,
                 MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (p == MAP_FAILED) return drv_end(CUDA_ERROR_OUT_OF_MEMORY);
  uintptr_t lo = (uintptr_t)p, base = (lo + align - 1) & ~(uintptr_t)(align - 1);
  if (base > lo) munmap(p, base - lo);
  if (lo + size + align > base + size)
    munmap((void *)(base + size), lo + size + align - (base + size));
  drv_reservation_t *r = malloc(sizeof *r);
  if (!r) {
    munmap((void *)base, size);
    return drv_end(CUDA_ERROR_OUT_OF_MEMORY);
  }
  r->base = base;
  r->size = size;
  r->next = D.reservations;
  D.reservations = r;
  D.st.reservations++;
  D.st.reserved_bytes += size;
  *ptr = (CUdeviceptr)base;
  return drv_end(CUDA_SUCCESS);
}

CUresult CUDAAPI cuMemAddressFree(CUdeviceptr ptr, size_t size) {
  DRV_BEGIN(cuMemAddressFree, DRV_NEED_INIT);
  DRV_UNSAFE(DRV_UNSAFE_VMM);
  drv_reservation_t **pp = &D.reservations;
  while (*pp && ((*pp)->base != ptr || (*pp)->size != size)) pp = &(*pp)->next;
  if (!*pp)
    return drv_end(drv_misuse(CUDA_ERROR_INVALID_VALUE, "no reservation of %zu bytes at %#llx",
                              size, (unsigned long long)ptr));
  size_t left = 0;
  for (drv_mapping_t *m = D.mappings; m; m = m->next)
    if (overlaps(ptr, size, m->addr, m->size)) left++;
  if (left)
    return drv_end(drv_misuse(CUDA_ERROR_INVALID_VALUE, "%zu mapping(s) left in the range", left));
  drv_reservation_t *r = *pp;
  *pp = r->next;
  munmap((void *)r->base, r->size);
  D.st.reservations--;
  D.st.reserved_bytes -= r->size;
  free(r);
  return drv_end(CUDA_SUCCESS);
}

CUresult CUDAAPI cuMemCreate(CUmemGenericAllocationHandle *handle, size_t size,
                             const CUmemAllocationProp *prop, unsigned long long flags) {
  DRV_BEGIN(cuMemCreate, DRV_NEED_INIT);
  DRV_UNSAFE(DRV_UNSAFE_VMM);
  if (!handle) return drv_end(drv_misuse(CUDA_ERROR_INVALID_VALUE, "NULL output"));
  if (flags) return drv_end(drv_misuse(CUDA_ERROR_INVALID_VALUE, "flags %#llx, must be 0", flags));
  CUresult rc = check_prop(prop);
  if (rc != CUDA_SUCCESS) return drv_end(rc);
  if (size == 0 || !gran_aligned(size))
    return drv_end(drv_misuse(CUDA_ERROR_INVALID_VALUE,
                              "size %zu is not a multiple of the granularity", size));
  /* A driver without file descriptor handles (WLTEST_NO_POSIX_FD) refuses to make one. */
  if ((prop->requestedHandleTypes & CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR) && D.no_posix_fd) {
    fprintf(stderr, "wltest-cuda: cuMemCreate: no POSIX file descriptor handles "
                    "(WLTEST_NO_POSIX_FD)\n");
    return drv_end(CUDA_ERROR_NOT_SUPPORTED);
  }
  /* Charged to the device the properties name (check_prop refused any other). */
  if (!drv_charge(prop->location.id, size)) return drv_end(CUDA_ERROR_OUT_OF_MEMORY);
  drv_phys_t *p = calloc(1, sizeof *p);
  int fd = memfd_create(PHYS_MEMFD_NAME, MFD_CLOEXEC);
  if (!p || fd < 0 || ftruncate(fd, (off_t)size) != 0) {
    free(p);
    if (fd >= 0) close(fd);
    drv_uncharge(prop->location.id, size);
    return drv_end(CUDA_ERROR_OUT_OF_MEMORY);
  }
  p->id = D.next_handle++;
  p->refs = 1;
  p->size = size;
  p->fd = fd;
  p->device = prop->location.id;
  p->types = (unsigned)prop->requestedHandleTypes;
  p->next = D.phys;
  D.phys = p;
  D.st.handles++;
  D.st.phys_bytes += size;
  *handle = p->id;
  return drv_end(CUDA_SUCCESS);
}

CUresult CUDAAPI cuMemRelease(CUmemGenericAllocationHandle handle) {
  DRV_BEGIN(cuMemRelease, DRV_NEED_INIT);
  DRV_UNSAFE(DRV_UNSAFE_VMM);
  drv_phys_t *p = phys_find(handle);
  if (!p)
    return drv_end(
        drv_misuse(CUDA_ERROR_INVALID_VALUE, "unknown or released handle %#llx", handle));
  if (p->imported)
    D.st.imported_handles--;
  else
    D.st.handles--;
  if (--p->refs) return drv_end(CUDA_SUCCESS); /* retained again: one release each */
  p->released = true;
  /* Mapped memory outlives its handle until the last unmap, as documented. */
  if (p->maps == 0) phys_free(p);
  return drv_end(CUDA_SUCCESS);
}

/* The handle of the memory mapped at addr, one more reference to it ("must be released with
 * cuMemRelease"), also after its last handle was released while it stayed mapped (NCCL frees
 * its buffers so). */
CUresult CUDAAPI cuMemRetainAllocationHandle(CUmemGenericAllocationHandle *handle, void *addr) {
  DRV_BEGIN(cuMemRetainAllocationHandle, DRV_NEED_INIT);
  if (!handle) return drv_end(drv_misuse(CUDA_ERROR_INVALID_VALUE, "NULL output"));
  for (drv_mapping_t *m = D.mappings; m; m = m->next)
    if ((uintptr_t)addr - m->addr < m->size) {
      drv_phys_t *p = m->phys;
      p->refs++;
      p->released = false;
      if (p->imported)
        D.st.imported_handles++;
      else
        D.st.handles++;
      *handle = p->id;
      return drv_end(CUDA_SUCCESS);
    }
  return drv_end(drv_misuse(CUDA_ERROR_INVALID_VALUE, "%p is not mapped", addr));
}

CUresult CUDAAPI cuMemMap(CUdeviceptr ptr, size_t size, size_t offset,
                          CUmemGenericAllocationHandle handle, unsigned long long flags) {
  DRV_BEGIN(cuMemMap, DRV_NEED_INIT);
  DRV_UNSAFE(DRV_UNSAFE_VMM);
  if (flags) return drv_end(drv_misuse(CUDA_ERROR_INVALID_VALUE, "flags %#llx, must be 0", flags));
  if (offset) return drv_end(drv_misuse(CUDA_ERROR_INVALID_VALUE, "offset %zu, must be 0", offset));
  CUresult rc = check_range(ptr, size);
  if (rc != CUDA_SUCCESS) return drv_end(rc);
  drv_phys_t *p = phys_find(handle);
  if (!p)
    return drv_end(
        drv_misuse(CUDA_ERROR_INVALID_VALUE, "unknown or released handle %#llx", handle));
  if (size > p->size)
    return drv_end(
        drv_misuse(CUDA_ERROR_INVALID_VALUE, "%zu bytes of a %zu-byte allocation", size, p->size));
  if (!res_containing(ptr, size))
    return drv_end(drv_misuse(CUDA_ERROR_INVALID_VALUE, "%#llx+%zu is not inside one reservation",
                              (unsigned long long)ptr, size));
  for (drv_mapping_t *m = D.mappings; m; m = m->next)
    if (overlaps(ptr, size, m->addr, m->size))
      return drv_end(drv_misuse(CUDA_ERROR_INVALID_VALUE, "%#llx+%zu overlaps the mapping at %#lx",
                                (unsigned long long)ptr, size, (unsigned long)m->addr));
  drv_mapping_t *m = calloc(1, sizeof *m);
  if (!m) return drv_end(CUDA_ERROR_OUT_OF_MEMORY);
  /* No access until cuMemSetAccess, as on a GPU. */
  void *q = mmap((void *)(uintptr_t)ptr, size, PROT_NONE, MAP_SHARED | MAP_FIXED, p->fd, 0);
  if (q == MAP_FAILED) {
    free(m);
    return drv_end(CUDA_ERROR_OUT_OF_MEMORY);
  }
  m->addr = (uintptr_t)ptr;
  m->size = size;
  m->phys = p;
  m->prot = CU_MEM_ACCESS_FLAGS_PROT_NONE;
  m->next = D.mappings;
  D.mappings = m;
  p->maps++;
  D.st.mappings++;
  D.st.mapped_bytes += size;
  return drv_end(CUDA_SUCCESS);
}

CUresult CUDAAPI cuMemSetAccess(CUdeviceptr ptr, size_t size, const CUmemAccessDesc *desc,
                                size_t count) {
  DRV_BEGIN(cuMemSetAccess, DRV_NEED_INIT);
  DRV_UNSAFE(DRV_UNSAFE_VMM);
  if (!desc || count == 0)
    return drv_end(drv_misuse(CUDA_ERROR_INVALID_VALUE, "no access descriptors"));
  /* Access is per device, but the memory has one host protection: the widest any device has
   * (NONE < READ < READWRITE, as the flags' values are). The last word on a device counts. */
  bool given[DRV_MAXDEV] = {false};
  unsigned want[DRV_MAXDEV] = {0};
  for (size_t i = 0; i < count; i++) {
    CUresult rc = check_location(&desc[i].location);
    if (rc != CUDA_SUCCESS) return drv_end(rc);
    if (desc[i].flags != CU_MEM_ACCESS_FLAGS_PROT_NONE &&
        desc[i].flags != CU_MEM_ACCESS_FLAGS_PROT_READ &&
        desc[i].flags != CU_MEM_ACCESS_FLAGS_PROT_READWRITE)
      return drv_end(drv_misuse(CUDA_ERROR_INVALID_VALUE, "access flags %d", (int)desc[i].flags));
    given[desc[i].location.id] = true;
    want[desc[i].location.id] = (unsigned)desc[i].flags;
  }
  CUresult rc = check_range(ptr, size);
  if (rc != CUDA_SUCCESS) return drv_end(rc);
  if (!whole_mappings(ptr, size))
    return drv_end(drv_misuse(CUDA_ERROR_INVALID_VALUE, "%#llx+%zu is not a fully mapped range",
                              (unsigned long long)ptr, size));
  for (drv_mapping_t *m = D.mappings; m; m = m->next) {
    if (!overlaps(ptr, size, m->addr, m->size)) continue;
    unsigned prot = CU_MEM_ACCESS_FLAGS_PROT_NONE;
    for (int d = 0; d < DRV_MAXDEV; d++) {
      unsigned a = given[d] ? want[d] : m->access[d];
      if (a > prot) prot = a;
    }
    int mp = prot == CU_MEM_ACCESS_FLAGS_PROT_READWRITE ? PROT_READ | PROT_WRITE
             : prot == CU_MEM_ACCESS_FLAGS_PROT_READ    ? PROT_READ
                                                        : PROT_NONE;
    if (mprotect((void *)m->addr, m->size, mp) != 0) return drv_end(CUDA_ERROR_OUT_OF_MEMORY);
    for (int d = 0; d < DRV_MAXDEV; d++)
      if (given[d]) m->access[d] = want[d];
    if (m->prot == CU_MEM_ACCESS_FLAGS_PROT_NONE && prot != CU_MEM_ACCESS_FLAGS_PROT_NONE)
      D.st.accessible_bytes += m->size;
    else if (m->prot != CU_MEM_ACCESS_FLAGS_PROT_NONE && prot == CU_MEM_ACCESS_FLAGS_PROT_NONE)
      D.st.accessible_bytes -= m->size;
    m->prot = prot;
  }
  return drv_end(CUDA_SUCCESS);
}

/* What cuMemSetAccess granted location's device on the mapping holding ptr. */
CUresult CUDAAPI cuMemGetAccess(unsigned long long *flags, const CUmemLocation *location,
                                CUdeviceptr ptr) {
  DRV_BEGIN(cuMemGetAccess, DRV_NEED_INIT);
  if (!flags || !location) return drv_end(drv_misuse(CUDA_ERROR_INVALID_VALUE, "NULL argument"));
  if (location->type != CU_MEM_LOCATION_TYPE_DEVICE || !drv_device_valid(location->id))
    return drv_end(drv_misuse(CUDA_ERROR_INVALID_VALUE, "location %d/%d is not a device",
                              (int)location->type, location->id));
  for (drv_mapping_t *m = D.mappings; m; m = m->next)
    if ((uintptr_t)ptr - m->addr < m->size) {
      *flags = m->access[location->id];
      return drv_end(CUDA_SUCCESS);
    }
  return drv_end(
      drv_misuse(CUDA_ERROR_INVALID_VALUE, "%#llx is not mapped", (unsigned long long)ptr));
}

CUresult CUDAAPI cuMemUnmap(CUdeviceptr ptr, size_t size) {
  DRV_BEGIN(cuMemUnmap, DRV_NEED_INIT);
  DRV_UNSAFE(DRV_UNSAFE_VMM);
  CUresult rc = check_range(ptr, size);
  if (rc != CUDA_SUCCESS) return drv_end(rc);
  if (!whole_mappings(ptr, size))
    return drv_end(drv_misuse(CUDA_ERROR_INVALID_VALUE,
                              "%#llx+%zu is not whole mappings (unmapped, or a sub-range)",
                              (unsigned long long)ptr, size));
  /* The range turns back into reservation: inaccessible, no pages. */
  void *q = mmap((void *)(uintptr_t)ptr, size, PROT_NONE,
                 MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED | MAP_NORESERVE, -1, 0);
  if (q == MAP_FAILED) return drv_end(CUDA_ERROR_UNKNOWN);
  for (drv_mapping_t **pp = &D.mappings; *pp;) {
    drv_mapping_t *m = *pp;
    if (!overlaps(ptr, size, m->addr, m->size)) {
      pp = &m->next;
      continue;
    }
    *pp = m->next;
    if (m->prot != CU_MEM_ACCESS_FLAGS_PROT_NONE) D.st.accessible_bytes -= m->size;
    D.st.mappings--;
    D.st.mapped_bytes -= m->size;
    if (--m->phys->maps == 0 && m->phys->released) phys_free(m->phys);
    free(m);
  }
  return drv_end(CUDA_SUCCESS);
}

/* A mapped address: the device of the mapped handle's location, and the range CUDA documents
 * for RANGE_START_ADDR/SIZE, the reservation's ("not necessarily the mapped region"). An address
 * reserved but not mapped is unknown (no memory is there). */
bool drv_vmm_ptr(uintptr_t p, drv_ptr_t *out) {
  for (drv_mapping_t *m = D.mappings; m; m = m->next) {
    if (p - m->addr >= m->size) continue;
    drv_reservation_t *r = res_containing(m->addr, m->size);
    /* No context: VMM memory belongs to none (cuCtxDestroy's documentation). */
    *out = (drv_ptr_t){
        .device = m->phys->device, .start = r ? r->base : m->addr, .size = r ? r->size : m->size};
    return true;
  }
  return false;
}

bool drv_fd_is_memfd(int fd, const char *name) {
  char path[64], link[256];
  snprintf(path, sizeof path, "/proc/self/fd/%d", fd);
  ssize_t n = readlink(path, link, sizeof link - 1);
  if (n < 0) return false;
  link[n] = 0;
  /* "/memfd:NAME (deleted)" on Linux; the suffix is not relied on. */
  size_t len = strlen(name);
  return strncmp(link, "/memfd:", 7) == 0 && strncmp(link + 7, name, len) == 0 &&
         (link[7 + len] == 0 || link[7 + len] == ' ');
}

/* ---- shareable handles ------------------------------------------------------------------------*/

/* A POSIX file descriptor (an int) for a handle created to be exported so: a new descriptor of
 * its memfd (O_CLOEXEC), the caller's to close. Imported handles may be exported again. */
CUresult CUDAAPI cuMemExportToShareableHandle(void *shareableHandle,
                                              CUmemGenericAllocationHandle handle,
                                              CUmemAllocationHandleType handleType,
                                              unsigned long long flags) {
  DRV_BEGIN(cuMemExportToShareableHandle, DRV_NEED_INIT);
  if (!shareableHandle) return drv_end(drv_misuse(CUDA_ERROR_INVALID_VALUE, "NULL output"));
  if (flags) return drv_end(drv_misuse(CUDA_ERROR_INVALID_VALUE, "flags %#llx, must be 0", flags));
  drv_phys_t *p = phys_find(handle);
  if (!p)
    return drv_end(
        drv_misuse(CUDA_ERROR_INVALID_VALUE, "unknown or released handle %#llx", handle));
  /* Only the types asked for at creation (the header names no code: INVALID_VALUE). */
  if (handleType != CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR || !(p->types & handleType))
    return drv_end(drv_misuse(CUDA_ERROR_INVALID_VALUE,
                              "handle %#llx was not created to be exported as type %#x (only "
                              "%#x)",
                              handle, (unsigned)handleType, p->types));
  int fd = fcntl(p->fd, F_DUPFD_CLOEXEC, 0);
  if (fd < 0) return drv_end(CUDA_ERROR_OPERATING_SYSTEM);
  *(int *)shareableHandle = fd;
  return drv_end(CUDA_SUCCESS);
}

/* osHandle is the descriptor itself, cast to a pointer ((void *)(uintptr_t)fd), as CUDA's samples
 * pass it. The new handle is a descriptor of its own over the same memfd (the caller keeps and
 * closes its own), so mappings of it see the exporter's bytes, in this process or another. Not
 * charged: the memory is the exporter's (and counted there on a shared device). */
CUresult CUDAAPI cuMemImportFromShareableHandle(CUmemGenericAllocationHandle *handle,
                                                void *osHandle,
                                                CUmemAllocationHandleType shHandleType) {
  DRV_BEGIN(cuMemImportFromShareableHandle, DRV_NEED_INIT);
  if (!handle) return drv_end(drv_misuse(CUDA_ERROR_INVALID_VALUE, "NULL output"));
  if (shHandleType == CU_MEM_HANDLE_TYPE_NONE || (shHandleType & (shHandleType - 1)))
    return drv_end(drv_misuse(CUDA_ERROR_INVALID_VALUE, "handle type %#x is not one type",
                              (unsigned)shHandleType));
  CUresult rc = check_handle_types((unsigned)shHandleType);
  if (rc != CUDA_SUCCESS) return drv_end(rc);
  if (D.no_posix_fd) {
    fprintf(stderr, "wltest-cuda: %s: no POSIX file descriptor handles (WLTEST_NO_POSIX_FD)\n",
            D.fn);
    return drv_end(CUDA_ERROR_NOT_SUPPORTED);
  }
  uintptr_t v = (uintptr_t)osHandle;
  struct stat st;
  if (v > INT32_MAX || fstat((int)v, &st) != 0)
    return drv_end(
        drv_misuse(CUDA_ERROR_INVALID_VALUE, "%#lx is not an open file descriptor", (long)v));
  int in = (int)v;
  if (!drv_fd_is_memfd(in, PHYS_MEMFD_NAME) || st.st_size <= 0 ||
      !gran_aligned((uint64_t)st.st_size))
    return drv_end(
        drv_misuse(CUDA_ERROR_INVALID_VALUE, "descriptor %d was not exported by this driver", in));
  drv_phys_t *p = calloc(1, sizeof *p);
  int fd = p ? fcntl(in, F_DUPFD_CLOEXEC, 0) : -1;
  if (fd < 0) {
    free(p);
    return drv_end(p ? CUDA_ERROR_OPERATING_SYSTEM : CUDA_ERROR_OUT_OF_MEMORY);
  }
  p->id = D.next_handle++;
  p->refs = 1;
  p->size = (size_t)st.st_size;
  p->fd = fd;
  p->device = 0; /* a descriptor does not say which device the exporter's memory is on */
  p->types = CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;
  p->imported = true;
  p->next = D.phys;
  D.phys = p;
  D.st.imported_handles++;
  D.st.imported_bytes += p->size;
  *handle = p->id;
  return drv_end(CUDA_SUCCESS);
}

/* What the handle was created with (an imported one: pinned device memory, exportable as a file
 * descriptor). */
CUresult CUDAAPI cuMemGetAllocationPropertiesFromHandle(CUmemAllocationProp *prop,
                                                        CUmemGenericAllocationHandle handle) {
  DRV_BEGIN(cuMemGetAllocationPropertiesFromHandle, DRV_NEED_INIT);
  if (!prop) return drv_end(drv_misuse(CUDA_ERROR_INVALID_VALUE, "NULL output"));
  drv_phys_t *p = phys_find(handle);
  if (!p)
    return drv_end(
        drv_misuse(CUDA_ERROR_INVALID_VALUE, "unknown or released handle %#llx", handle));
  memset(prop, 0, sizeof *prop);
  prop->type = CU_MEM_ALLOCATION_TYPE_PINNED;
  prop->location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  prop->location.id = p->device;
  prop->requestedHandleTypes = (CUmemAllocationHandleType)p->types;
  return drv_end(CUDA_SUCCESS);
}
