/* The CUDA driver double's CUDA IPC of cuMemAlloc memory: from its first cuIpcGetMemHandle on,
 * an allocation lives in a memfd mapped shared at its address, and the handle names the exporting
 * process, that memfd and a generation; cuIpcOpenMemHandle in another process opens the memfd
 * through /proc/<pid>/fd and maps it, so both processes read and write the same bytes. For tests
 * only. */
#include "driver.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#define D drv__state

/* The 64 bytes of a CUipcMemHandle made by the double (native byte order: both processes run on
 * one machine). The magic differs from the interposer's ("WLIPC\x01\xa5\x5a"), so that neither
 * takes the other's handles for its own. */
typedef struct ipc_wire_s {
  char magic[8];   /* "WLTSTIPC" */
  int32_t pid;     /* the exporting process */
  int32_t fd;      /* the memfd's number in it */
  uint64_t size;   /* the allocation's size, as asked for */
  uint64_t mapped; /* the memfd's length (whole pages) */
  uint64_t gen;    /* the export's generation, also in the memfd's name */
  uint64_t addr;   /* the exporter's address (for messages only) */
  char zero[16];
} ipc_wire_t;
_Static_assert(sizeof(ipc_wire_t) == CU_IPC_HANDLE_SIZE, "a CUipcMemHandle is 64 bytes");

static const char ipc_magic[8] = {'W', 'L', 'T', 'S', 'T', 'I', 'P', 'C'};

static void memfd_name(char *buf, size_t n, uint64_t gen) {
  snprintf(buf, n, "wltest-cuda-ipc-%llx", (unsigned long long)gen);
}

static bool page_is_zero(const unsigned char *p, size_t n) {
  uint64_t w;
  for (size_t i = 0; i < n; i += sizeof w) {
    memcpy(&w, p + i, sizeof w);
    if (w) return false;
  }
  return true;
}

/* Moves an allocation into a memfd mapped shared at the same address. Zero pages are not copied,
 * so the memfd stays as sparse as the memory was. A write racing with this (another thread's,
 * outside the double) may be lost: the first cuIpcGetMemHandle is the moment. */
static CUresult ipc_back(drv_linear_t *l) {
  uint64_t gen = ((uint64_t)(uint32_t)getpid() << 32) | ++D.next_ipc_gen;
  char name[64];
  memfd_name(name, sizeof name, gen);
  int fd = memfd_create(name, MFD_CLOEXEC);
  if (fd < 0) return CUDA_ERROR_OUT_OF_MEMORY;
  if (ftruncate(fd, (off_t)l->mapped) != 0) {
    close(fd);
    return CUDA_ERROR_OUT_OF_MEMORY;
  }
  unsigned char *tmp = mmap(NULL, l->mapped, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (tmp == MAP_FAILED) {
    close(fd);
    return CUDA_ERROR_MAP_FAILED;
  }
  const unsigned char *src = (const unsigned char *)l->addr;
  for (size_t off = 0; off < l->mapped; off += 4096) {
    size_t n = l->mapped - off < 4096 ? l->mapped - off : 4096;
    if (!page_is_zero(src + off, n)) memcpy(tmp + off, src + off, n);
  }
  munmap(tmp, l->mapped);
  void *q = mmap((void *)l->addr, l->mapped, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_FIXED, fd, 0);
  if (q == MAP_FAILED) {
    close(fd);
    return CUDA_ERROR_MAP_FAILED;
  }
  l->ipc = true;
  l->ipc_fd = fd;
  l->ipc_gen = gen;
  D.st.ipc_exported++;
  return CUDA_SUCCESS;
}

/* A handle exists for cuMemAlloc allocations only (not for VMM mappings or pool memory); a
 * pointer into one gets the allocation's handle, as the driver answers (on an H200 too), and the
 * importer gets the allocation's start. Asking again gives the same handle; a later allocation
 * at the same address gets a new generation, so a new handle, as documented. */
CUresult CUDAAPI cuIpcGetMemHandle(CUipcMemHandle *handle, CUdeviceptr dptr) {
  DRV_BEGIN(cuIpcGetMemHandle, DRV_NEED_CTX);
  if (!handle) return drv_end(drv_misuse(CUDA_ERROR_INVALID_VALUE, "NULL output"));
  drv_linear_t *l = drv_linear_containing((uintptr_t)dptr);
  if (!l || l->kind != DRV_LINEAR_DEVICE) return drv_end(CUDA_ERROR_INVALID_VALUE);
  if (!l->ipc) {
    CUresult rc = ipc_back(l);
    if (rc != CUDA_SUCCESS) return drv_end(rc);
  }
  ipc_wire_t w = {.pid = (int32_t)getpid(),
                  .fd = l->ipc_fd,
                  .size = l->size,
                  .mapped = l->mapped,
                  .gen = l->ipc_gen,
                  .addr = l->addr};
  memcpy(w.magic, ipc_magic, sizeof w.magic);
  memcpy(handle, &w, sizeof w);
  return drv_end(CUDA_SUCCESS);
}

static CUresult ipc_open(CUdeviceptr *pdptr, CUipcMemHandle handle, unsigned flags) {
  if (!pdptr) return drv_misuse(CUDA_ERROR_INVALID_VALUE, "NULL output");
  /* The header says the flag must be given; 0 (no peer access to enable) is accepted too. */
  if (flags & ~(unsigned)CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS)
    return drv_misuse(CUDA_ERROR_INVALID_VALUE, "flags %#x", flags);
  ipc_wire_t w;
  memcpy(&w, &handle, sizeof w);
  if (memcmp(w.magic, ipc_magic, sizeof ipc_magic) != 0)
    return drv_misuse(CUDA_ERROR_INVALID_HANDLE, "not a CUDA IPC memory handle of this driver");
  /* A real driver refuses its own process's handles ("invalid device context"). */
  if (w.pid == (int32_t)getpid())
    return drv_misuse(CUDA_ERROR_INVALID_CONTEXT, "the handle was exported by this process");
  /* Opened already: the same pointer, one more reference. */
  for (drv_ipc_open_t *o = D.ipc_opens; o; o = o->next)
    if (memcmp(&o->handle, &handle, sizeof handle) == 0) {
      o->refs++;
      *pdptr = (CUdeviceptr)o->addr;
      return CUDA_SUCCESS;
    }
  char path[64], name[64];
  snprintf(path, sizeof path, "/proc/%d/fd/%d", (int)w.pid, (int)w.fd);
  int fd = w.pid > 0 && w.fd >= 0 ? open(path, O_RDWR | O_CLOEXEC) : -1;
  if (fd < 0)
    return drv_misuse(CUDA_ERROR_INVALID_HANDLE, "process %d or its allocation is gone (%s)",
                      (int)w.pid, strerror(errno));
  /* The fd number may name another file by now: the memfd's name carries the generation. */
  memfd_name(name, sizeof name, w.gen);
  struct stat st;
  if (!drv_fd_is_memfd(fd, name) || fstat(fd, &st) != 0 || (uint64_t)st.st_size != w.mapped ||
      w.size > w.mapped || w.mapped == 0) {
    close(fd);
    return drv_misuse(CUDA_ERROR_INVALID_HANDLE,
                      "process %d has no such allocation at %#llx (freed?)", (int)w.pid,
                      (unsigned long long)w.addr);
  }
  drv_ipc_open_t *o = calloc(1, sizeof *o);
  void *p = o ? mmap(NULL, w.mapped, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0) : MAP_FAILED;
  close(fd);
  if (p == MAP_FAILED) {
    free(o);
    return o ? CUDA_ERROR_MAP_FAILED : CUDA_ERROR_OUT_OF_MEMORY;
  }
  o->handle = handle;
  o->addr = (uintptr_t)p;
  o->size = w.size;
  o->mapped = w.mapped;
  o->ctx = drv_current();
  o->device = o->ctx->device;
  o->refs = 1;
  o->next = D.ipc_opens;
  D.ipc_opens = o;
  D.st.ipc_opened++;
  D.st.ipc_open_bytes += w.mapped;
  *pdptr = (CUdeviceptr)o->addr;
  return CUDA_SUCCESS;
}

/* Not charged to this process: the memory is the exporter's. */
CUresult CUDAAPI cuIpcOpenMemHandle(CUdeviceptr *pdptr, CUipcMemHandle handle, unsigned int Flags) {
  DRV_BEGIN(cuIpcOpenMemHandle_v2, DRV_NEED_CTX);
  return drv_end(ipc_open(pdptr, handle, Flags));
}

/* 4.1's ABI: the same arguments. */
CUresult CUDAAPI cuIpcOpenMemHandle_v1(CUdeviceptr *pdptr, CUipcMemHandle handle,
                                       unsigned int Flags) {
  DRV_BEGIN(cuIpcOpenMemHandle, DRV_NEED_CTX);
  return drv_end(ipc_open(pdptr, handle, Flags));
}

static void ipc_unmap(drv_ipc_open_t *o) {
  munmap((void *)o->addr, o->mapped);
  D.st.ipc_opened--;
  D.st.ipc_open_bytes -= o->mapped;
  free(o);
}

CUresult CUDAAPI cuIpcCloseMemHandle(CUdeviceptr dptr) {
  DRV_BEGIN(cuIpcCloseMemHandle, DRV_NEED_CTX);
  for (drv_ipc_open_t **pp = &D.ipc_opens; *pp; pp = &(*pp)->next) {
    drv_ipc_open_t *o = *pp;
    if (o->addr != (uintptr_t)dptr) continue;
    if (--o->refs == 0) {
      *pp = o->next;
      ipc_unmap(o);
    }
    return drv_end(CUDA_SUCCESS);
  }
  return drv_end(drv_misuse(CUDA_ERROR_INVALID_VALUE, "%#llx was not opened by cuIpcOpenMemHandle",
                            (unsigned long long)dptr));
}

/* A context's reset or destroy unmaps what was opened in it, whatever the references: a later
 * close is a misuse, a later touch faults. The exporter's memory is not touched. */
void drv_ipc_drop_ctx(struct CUctx_st *ctx) {
  for (drv_ipc_open_t **pp = &D.ipc_opens; *pp;) {
    drv_ipc_open_t *o = *pp;
    if (o->ctx != ctx) {
      pp = &o->next;
      continue;
    }
    *pp = o->next;
    ipc_unmap(o);
  }
}

bool drv_ipc_ptr(uintptr_t p, drv_ptr_t *out) {
  for (drv_ipc_open_t *o = D.ipc_opens; o; o = o->next)
    if (p - o->addr < o->size) {
      *out = (drv_ptr_t){.device = o->device, .ctx = o->ctx, .start = o->addr, .size = o->size};
      return true;
    }
  return false;
}
