/* The CUDA driver double's modules, libraries and kernel launches: a launch runs the kernel's
 * host twin (if the program defines one) when it is enqueued and takes its simulated duration
 * on the stream's timeline. Device code never runs. For tests only. */
#include "driver.h"

#include <ctype.h>
#include <dlfcn.h>
#include <elf.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define D drv__state

#define FATBIN_MAGIC 0xBA55ED50u

/* ---- images ----------------------------------------------------------------------------------*/

typedef enum { IMG_BAD, IMG_FATBIN, IMG_ELF, IMG_PTX } img_kind_t;

/* What an image is and how long: a fat binary, a cubin (ELF) or PTX text. */
static img_kind_t image_kind(const void *image, size_t *len) {
  const unsigned char *p = image;
  uint32_t magic;
  memcpy(&magic, p, sizeof magic);
  if (magic == FATBIN_MAGIC) {
    uint16_t hdr;
    uint64_t size;
    memcpy(&hdr, p + 6, sizeof hdr);
    memcpy(&size, p + 8, sizeof size);
    *len = hdr + (size_t)size;
    return IMG_FATBIN;
  }
  if (memcmp(p, ELFMAG, SELFMAG) == 0 && p[EI_CLASS] == ELFCLASS64) {
    Elf64_Ehdr eh;
    memcpy(&eh, p, sizeof eh);
    size_t sh_end = (size_t)eh.e_shoff + (size_t)eh.e_shnum * eh.e_shentsize;
    size_t ph_end = (size_t)eh.e_phoff + (size_t)eh.e_phnum * eh.e_phentsize;
    *len = sh_end > ph_end ? sh_end : ph_end;
    return IMG_ELF;
  }
  const char *t = image;
  if (strncmp(t, "//", 2) == 0 || strncmp(t, ".version", 8) == 0 || strstr(t, ".version")) {
    *len = strlen(t);
    return IMG_PTX;
  }
  return IMG_BAD;
}

static bool image_has(const void *image, const char *name) {
  size_t len = 0, n = strlen(name);
  if (image_kind(image, &len) == IMG_BAD || n == 0) return false;
  const char *p = image, *end = p + len;
  while (p + n <= end) {
    const char *q = memchr(p, name[0], (size_t)(end - p));
    if (!q || q + n > end) break;
    if (memcmp(q, name, n) == 0) return true;
    p = q + 1;
  }
  return false;
}

static CUresult module_new(const void *image, bool library, drv_module_t **out) {
  size_t len;
  if (!image) return drv_misuse(CUDA_ERROR_INVALID_VALUE, "NULL image");
  if (image_kind(image, &len) == IMG_BAD)
    return drv_misuse(CUDA_ERROR_INVALID_IMAGE, "not a fat binary, cubin or PTX image");
  drv_module_t *m = calloc(1, sizeof *m);
  if (!m) return CUDA_ERROR_OUT_OF_MEMORY;
  m->magic = DRV_MODULE_MAGIC;
  m->image = image;
  m->library = library;
  m->next = D.modules;
  D.modules = m;
  *out = m;
  return CUDA_SUCCESS;
}

static drv_module_t *module_find(const void *h, bool library) {
  for (drv_module_t *m = D.modules; m; m = m->next)
    if (m == h && m->library == library) return m;
  return NULL;
}

static void module_free(drv_module_t *m) {
  for (drv_module_t **pp = &D.modules; *pp; pp = &(*pp)->next)
    if (*pp == m) {
      *pp = m->next;
      break;
    }
  for (drv_fn_t **pp = &D.fns; *pp;) {
    drv_fn_t *f = *pp;
    if (f->owner != m) {
      pp = &f->next;
      continue;
    }
    *pp = f->next;
    free(f);
  }
  free(m);
}

/* A duration in ns from var: false when unset, or not digits (then said, and ignored). */
static bool env_ns(const char *var, uint64_t *out) {
  const char *v = getenv(var);
  if (!v) return false;
  char *end;
  errno = 0;
  unsigned long long x = strtoull(v, &end, 10);
  if (!isdigit((unsigned char)*v) || *end || errno) {
    fprintf(stderr, "wltest-cuda: %s=%s is not a number of nanoseconds; ignored\n", var, v);
    return false;
  }
  *out = x;
  return true;
}

uint64_t drv_kernel_ns_default(void) {
  uint64_t ns = 10000;
  env_ns("WLTEST_KERNEL_NS", &ns);
  return ns;
}

/* What a kernel's name says, looked up before the lock is taken: dlsym may run an interposer's
 * code, which may call the driver. */
typedef struct fn_info_s {
  bool has_ns;
  uint64_t ns;
  void *twin;
  const unsigned *argsizes;
} fn_info_t;

static void fn_info(const char *name, fn_info_t *fi) {
  memset(fi, 0, sizeof *fi);
  if (!name) return;
  char var[320], sym[320];
  snprintf(var, sizeof var, "WLTEST_KERNEL_NS_%s", name);
  fi->has_ns = env_ns(var, &fi->ns);
  snprintf(sym, sizeof sym, "wltest_host_%s", name);
  fi->twin = dlsym(RTLD_DEFAULT, sym);
  snprintf(sym, sizeof sym, "wltest_argsizes_%s", name);
  fi->argsizes = dlsym(RTLD_DEFAULT, sym);
}

static CUresult fn_get(drv_module_t *m, const char *name, const fn_info_t *fi, drv_fn_t **out) {
  if (!name) return drv_misuse(CUDA_ERROR_INVALID_VALUE, "NULL name");
  for (drv_fn_t *f = D.fns; f; f = f->next)
    if (f->owner == m && strcmp(f->name, name) == 0) {
      *out = f;
      return CUDA_SUCCESS;
    }
  if (!image_has(m->image, name)) {
    size_t len;
    if (image_kind(m->image, &len) != IMG_FATBIN)
      return drv_misuse(CUDA_ERROR_NOT_FOUND, "no kernel %s in the image", name);
    /* A compressed fat binary hides its names: trust the caller. */
    fprintf(stderr, "wltest-cuda: %s: %s not seen in the (compressed?) fat binary; accepted\n",
            D.fn, name);
  }
  size_t n = strlen(name);
  drv_fn_t *f = calloc(1, sizeof *f + n + 1);
  if (!f) return CUDA_ERROR_OUT_OF_MEMORY;
  memcpy(f->name, name, n + 1);
  f->magic = DRV_FN_MAGIC;
  f->owner = m;
  f->ns = fi->has_ns ? fi->ns : D.kernel_ns;
  memcpy(&f->twin, &fi->twin, sizeof fi->twin);
  f->argsizes = fi->argsizes;
  f->next = D.fns;
  D.fns = f;
  *out = f;
  return CUDA_SUCCESS;
}

drv_fn_t *drv_fn_find(const void *h) {
  for (drv_fn_t *f = D.fns; f; f = f->next)
    if (f == h) return f;
  return NULL;
}

CUresult CUDAAPI cuModuleLoadData(CUmodule *module, const void *image) {
  DRV_BEGIN(cuModuleLoadData, DRV_NEED_CTX);
  if (!module) return drv_end(drv_misuse(CUDA_ERROR_INVALID_VALUE, "NULL output"));
  drv_module_t *m = NULL;
  CUresult rc = module_new(image, false, &m);
  if (rc == CUDA_SUCCESS) *module = (CUmodule)(void *)m;
  return drv_end(rc);
}

CUresult CUDAAPI cuModuleGetFunction(CUfunction *hfunc, CUmodule hmod, const char *name) {
  fn_info_t fi;
  fn_info(name, &fi);
  DRV_BEGIN(cuModuleGetFunction, DRV_NEED_CTX);
  if (!hfunc) return drv_end(drv_misuse(CUDA_ERROR_INVALID_VALUE, "NULL output"));
  drv_module_t *m = module_find(hmod, false);
  if (!m) return drv_end(drv_misuse(CUDA_ERROR_INVALID_HANDLE, "unknown module %p", (void *)hmod));
  drv_fn_t *f;
  CUresult rc = fn_get(m, name, &fi, &f);
  if (rc == CUDA_SUCCESS) *hfunc = (CUfunction)(void *)f;
  return drv_end(rc);
}

CUresult CUDAAPI cuFuncGetName(const char **name, CUfunction hfunc) {
  DRV_BEGIN(cuFuncGetName, DRV_NEED_INIT);
  if (!name) return drv_end(drv_misuse(CUDA_ERROR_INVALID_VALUE, "NULL output"));
  drv_fn_t *f = drv_fn_find(hfunc);
  if (!f)
    return drv_end(drv_misuse(CUDA_ERROR_INVALID_HANDLE, "unknown function %p", (void *)hfunc));
  *name = f->name;
  return drv_end(CUDA_SUCCESS);
}

/* A CUkernel's name: the same kernel as the CUfunction (see drv_fn_t). */
CUresult CUDAAPI cuKernelGetName(const char **name, CUkernel hfunc) {
  DRV_BEGIN(cuKernelGetName, DRV_NEED_INIT);
  if (!name) return drv_end(drv_misuse(CUDA_ERROR_INVALID_VALUE, "NULL output"));
  drv_fn_t *f = drv_fn_find(hfunc);
  if (!f) return drv_end(drv_misuse(CUDA_ERROR_INVALID_VALUE, "unknown kernel %p", (void *)hfunc));
  *name = f->name;
  return drv_end(CUDA_SUCCESS);
}

CUresult CUDAAPI cuModuleUnload(CUmodule hmod) {
  DRV_BEGIN(cuModuleUnload, DRV_NEED_CTX);
  drv_module_t *m = module_find(hmod, false);
  if (!m) return drv_end(drv_misuse(CUDA_ERROR_INVALID_HANDLE, "unknown module %p", (void *)hmod));
  module_free(m);
  return drv_end(CUDA_SUCCESS);
}

CUresult CUDAAPI cuLibraryLoadData(CUlibrary *library, const void *code, CUjit_option *jitOptions,
                                   void **jitOptionsValues, unsigned int numJitOptions,
                                   CUlibraryOption *libraryOptions, void **libraryOptionValues,
                                   unsigned int numLibraryOptions) {
  DRV_BEGIN(cuLibraryLoadData, DRV_NEED_INIT);
  if (!library) return drv_end(drv_misuse(CUDA_ERROR_INVALID_VALUE, "NULL output"));
  if ((numJitOptions && (!jitOptions || !jitOptionsValues)) ||
      (numLibraryOptions && (!libraryOptions || !libraryOptionValues)))
    return drv_end(drv_misuse(CUDA_ERROR_INVALID_VALUE, "options counted but not given"));
  drv_module_t *m = NULL;
  CUresult rc = module_new(code, true, &m);
  if (rc == CUDA_SUCCESS) *library = (CUlibrary)(void *)m;
  return drv_end(rc);
}

CUresult CUDAAPI cuLibraryGetKernel(CUkernel *pKernel, CUlibrary library, const char *name) {
  fn_info_t fi;
  fn_info(name, &fi);
  DRV_BEGIN(cuLibraryGetKernel, DRV_NEED_INIT);
  if (!pKernel) return drv_end(drv_misuse(CUDA_ERROR_INVALID_VALUE, "NULL output"));
  drv_module_t *m = module_find(library, true);
  if (!m)
    return drv_end(drv_misuse(CUDA_ERROR_INVALID_HANDLE, "unknown library %p", (void *)library));
  drv_fn_t *f;
  CUresult rc = fn_get(m, name, &fi, &f);
  if (rc == CUDA_SUCCESS) *pKernel = (CUkernel)(void *)f;
  return drv_end(rc);
}

CUresult CUDAAPI cuLibraryUnload(CUlibrary library) {
  DRV_BEGIN(cuLibraryUnload, DRV_NEED_INIT);
  drv_module_t *m = module_find(library, true);
  if (!m)
    return drv_end(drv_misuse(CUDA_ERROR_INVALID_HANDLE, "unknown library %p", (void *)library));
  module_free(m);
  return drv_end(CUDA_SUCCESS);
}

/* ---- launches --------------------------------------------------------------------------------*/

CUresult drv_launch_enqueue(drv_fn_t *fn, const unsigned grid[3], const unsigned block[3],
                            unsigned shared, struct CUstream_st *s, void **args) {
  /* The effect happens now, in program order; completion follows the simulated timeline. A
   * kernel declared without parameters (wltest_argsizes_NAME = {0}) may come without
   * kernelParams; otherwise a twin needs them (a graph replay without their sizes has none). */
  static void *noargs[1];
  if (!args && fn->argsizes && fn->argsizes[0] == 0) args = noargs;
  if (fn->twin && args) {
    wltest_launch_t l = {.name = fn->name, .shared_bytes = shared, .stream = s, .args = args};
    memcpy(l.grid, grid, sizeof l.grid);
    memcpy(l.block, block, sizeof l.block);
    fn->twin(&l);
    D.st.twins++;
  }
  D.st.launches++;
  return drv_enqueue(s, fn->ns, NULL, NULL, 0) ? CUDA_SUCCESS : CUDA_ERROR_OUT_OF_MEMORY;
}

/* legacy: cuLaunch/cuLaunchGrid[Async], which use the function's deprecated launch state; any
 * other launch invalidates that state (cuLaunchKernel's documentation says so). */
static CUresult launch_as(const void *f, const unsigned grid[3], const unsigned block[3],
                          unsigned shared, CUstream hStream, void **params, void **extra,
                          bool legacy) {
  drv_fn_t *fn = drv_fn_find(f);
  if (!fn) return drv_misuse(CUDA_ERROR_INVALID_HANDLE, "unknown function %p", f);
  if (!legacy) {
    memset(fn->block, 0, sizeof fn->block);
    fn->shared = fn->param_size = 0;
  } else if (!block[0]) {
    return drv_misuse(CUDA_ERROR_INVALID_VALUE,
                      "%s has no block shape (cuFuncSetBlockShape since its last launch by "
                      "another entry point)",
                      fn->name);
  }
  if (!grid[0] || !grid[1] || !grid[2] || grid[0] > 0x7fffffffu || grid[1] > 65535 ||
      grid[2] > 65535)
    return drv_misuse(CUDA_ERROR_INVALID_VALUE, "grid %ux%ux%u", grid[0], grid[1], grid[2]);
  if (!block[0] || !block[1] || !block[2] || block[0] > 1024 || block[1] > 1024 || block[2] > 64 ||
      (uint64_t)block[0] * block[1] * block[2] > 1024)
    return drv_misuse(CUDA_ERROR_INVALID_VALUE, "block %ux%ux%u", block[0], block[1], block[2]);
  if (shared > 227u * 1024)
    return drv_misuse(CUDA_ERROR_INVALID_VALUE, "%u bytes of shared memory", shared);
  if (params && extra)
    return drv_misuse(CUDA_ERROR_INVALID_VALUE, "both kernelParams and extra are given");
  if (extra) {
    fprintf(stderr, "wltest-cuda: %s: arguments through 'extra' are not modelled\n", D.fn);
    return CUDA_ERROR_NOT_SUPPORTED;
  }
  struct CUstream_st *s;
  CUresult rc = drv_stream_get(hStream, &s);
  if (rc != CUDA_SUCCESS) return rc;
  if (s->capture != CU_STREAM_CAPTURE_STATUS_NONE)
    return drv_capture_launch(s, fn, grid, block, shared, params);
  return drv_launch_enqueue(fn, grid, block, shared, s, params);
}

static CUresult launch(const void *f, const unsigned grid[3], const unsigned block[3],
                       unsigned shared, CUstream hStream, void **params, void **extra) {
  return launch_as(f, grid, block, shared, hStream, params, extra, false);
}

#define DIMS                                                                                       \
  const unsigned grid[3] = {gridDimX, gridDimY, gridDimZ};                                         \
  const unsigned block[3] = {blockDimX, blockDimY, blockDimZ}

CUresult CUDAAPI cuLaunchKernel(CUfunction f, unsigned int gridDimX, unsigned int gridDimY,
                                unsigned int gridDimZ, unsigned int blockDimX,
                                unsigned int blockDimY, unsigned int blockDimZ,
                                unsigned int sharedMemBytes, CUstream hStream, void **kernelParams,
                                void **extra) {
  DRV_BEGIN(cuLaunchKernel, DRV_NEED_CTX);
  DIMS;
  return drv_end(launch(f, grid, block, sharedMemBytes, hStream, kernelParams, extra));
}

CUresult CUDAAPI cuLaunchKernel_ptsz(CUfunction f, unsigned int gridDimX, unsigned int gridDimY,
                                     unsigned int gridDimZ, unsigned int blockDimX,
                                     unsigned int blockDimY, unsigned int blockDimZ,
                                     unsigned int sharedMemBytes, CUstream hStream,
                                     void **kernelParams, void **extra) {
  DRV_BEGIN(cuLaunchKernel_ptsz, DRV_NEED_CTX);
  DIMS;
  return drv_end(launch(f, grid, block, sharedMemBytes, hStream ? hStream : CU_STREAM_PER_THREAD,
                        kernelParams, extra));
}

CUresult CUDAAPI cuLaunchCooperativeKernel(CUfunction f, unsigned int gridDimX,
                                           unsigned int gridDimY, unsigned int gridDimZ,
                                           unsigned int blockDimX, unsigned int blockDimY,
                                           unsigned int blockDimZ, unsigned int sharedMemBytes,
                                           CUstream hStream, void **kernelParams) {
  DRV_BEGIN(cuLaunchCooperativeKernel, DRV_NEED_CTX);
  DIMS;
  return drv_end(launch(f, grid, block, sharedMemBytes, hStream, kernelParams, NULL));
}

CUresult CUDAAPI cuLaunchCooperativeKernel_ptsz(CUfunction f, unsigned int gridDimX,
                                                unsigned int gridDimY, unsigned int gridDimZ,
                                                unsigned int blockDimX, unsigned int blockDimY,
                                                unsigned int blockDimZ, unsigned int sharedMemBytes,
                                                CUstream hStream, void **kernelParams) {
  DRV_BEGIN(cuLaunchCooperativeKernel_ptsz, DRV_NEED_CTX);
  DIMS;
  return drv_end(launch(f, grid, block, sharedMemBytes, hStream ? hStream : CU_STREAM_PER_THREAD,
                        kernelParams, NULL));
}

static CUresult launch_ex(const CUlaunchConfig *config, CUfunction f, void **params, void **extra,
                          bool ptsz) {
  if (!config) return drv_misuse(CUDA_ERROR_INVALID_VALUE, "NULL config");
  if (config->numAttrs && !config->attrs)
    return drv_misuse(CUDA_ERROR_INVALID_VALUE, "%u attributes but no array", config->numAttrs);
  const unsigned grid[3] = {config->gridDimX, config->gridDimY, config->gridDimZ};
  const unsigned block[3] = {config->blockDimX, config->blockDimY, config->blockDimZ};
  CUstream s = config->hStream;
  if (ptsz && !s) s = CU_STREAM_PER_THREAD;
  return launch(f, grid, block, config->sharedMemBytes, s, params, extra);
}

CUresult CUDAAPI cuLaunchKernelEx(const CUlaunchConfig *config, CUfunction f, void **kernelParams,
                                  void **extra) {
  DRV_BEGIN(cuLaunchKernelEx, DRV_NEED_CTX);
  return drv_end(launch_ex(config, f, kernelParams, extra, false));
}

CUresult CUDAAPI cuLaunchKernelEx_ptsz(const CUlaunchConfig *config, CUfunction f,
                                       void **kernelParams, void **extra) {
  DRV_BEGIN(cuLaunchKernelEx_ptsz, DRV_NEED_CTX);
  return drv_end(launch_ex(config, f, kernelParams, extra, true));
}

CUresult CUDAAPI cuLaunchCooperativeKernelMultiDevice(CUDA_LAUNCH_PARAMS *launchParamsList,
                                                      unsigned int numDevices, unsigned int flags) {
  DRV_BEGIN(cuLaunchCooperativeKernelMultiDevice, DRV_NEED_CTX);
  if (!launchParamsList || !numDevices)
    return drv_end(drv_misuse(CUDA_ERROR_INVALID_VALUE, "no launch parameters"));
  if (numDevices > (unsigned)D.ndev)
    return drv_end(
        drv_misuse(CUDA_ERROR_INVALID_VALUE, "%u devices, %d present", numDevices, D.ndev));
  if (flags & ~(unsigned)(CUDA_COOPERATIVE_LAUNCH_MULTI_DEVICE_NO_PRE_LAUNCH_SYNC |
                          CUDA_COOPERATIVE_LAUNCH_MULTI_DEVICE_NO_POST_LAUNCH_SYNC))
    return drv_end(drv_misuse(CUDA_ERROR_INVALID_VALUE, "flags %#x", flags));
  /* The header: never the NULL, legacy or per-thread stream. The synchronisation across the
   * devices is not modelled: each launch takes its own stream's timeline. */
  for (unsigned i = 0; i < numDevices; i++) {
    CUstream h = launchParamsList[i].hStream;
    if (!h || h == CU_STREAM_LEGACY || h == CU_STREAM_PER_THREAD)
      return drv_end(drv_misuse(CUDA_ERROR_INVALID_HANDLE, "launch %u on a default stream", i));
  }
  for (unsigned i = 0; i < numDevices; i++) {
    const CUDA_LAUNCH_PARAMS *p = &launchParamsList[i];
    const unsigned grid[3] = {p->gridDimX, p->gridDimY, p->gridDimZ};
    const unsigned block[3] = {p->blockDimX, p->blockDimY, p->blockDimZ};
    CUresult rc =
        launch(p->function, grid, block, p->sharedMemBytes, p->hStream, p->kernelParams, NULL);
    if (rc != CUDA_SUCCESS) return drv_end(rc);
  }
  return drv_end(CUDA_SUCCESS);
}

/* ---- the deprecated launch state and its launches ----------------------------------------------
 * cuFuncSetBlockShape, cuFuncSetSharedSize and cuParamSet* fill the function's state; cuLaunch,
 * cuLaunchGrid and cuLaunchGridAsync launch it. The host twin gets its arguments from the
 * parameter bytes at their natural alignment (wltest_argsizes_<name> gives the sizes); without
 * those sizes the launch runs no twin. */

static CUresult legacy_fn(CUfunction hfunc, drv_fn_t **out) {
  *out = drv_fn_find(hfunc);
  return *out ? CUDA_SUCCESS
              : drv_misuse(CUDA_ERROR_INVALID_HANDLE, "unknown function %p", (void *)hfunc);
}

CUresult CUDAAPI cuFuncSetBlockShape(CUfunction hfunc, int x, int y, int z) {
  DRV_BEGIN(cuFuncSetBlockShape, DRV_NEED_CTX);
  drv_fn_t *fn;
  CUresult rc = legacy_fn(hfunc, &fn);
  if (rc != CUDA_SUCCESS) return drv_end(rc);
  if (x <= 0 || y <= 0 || z <= 0)
    return drv_end(drv_misuse(CUDA_ERROR_INVALID_VALUE, "block %dx%dx%d", x, y, z));
  fn->block[0] = (unsigned)x, fn->block[1] = (unsigned)y, fn->block[2] = (unsigned)z;
  return drv_end(CUDA_SUCCESS);
}

CUresult CUDAAPI cuFuncSetSharedSize(CUfunction hfunc, unsigned int bytes) {
  DRV_BEGIN(cuFuncSetSharedSize, DRV_NEED_CTX);
  drv_fn_t *fn;
  CUresult rc = legacy_fn(hfunc, &fn);
  if (rc == CUDA_SUCCESS) fn->shared = bytes; /* checked at the launch, as launches do */
  return drv_end(rc);
}

CUresult CUDAAPI cuParamSetSize(CUfunction hfunc, unsigned int numbytes) {
  DRV_BEGIN(cuParamSetSize, DRV_NEED_CTX);
  drv_fn_t *fn;
  CUresult rc = legacy_fn(hfunc, &fn);
  if (rc != CUDA_SUCCESS) return drv_end(rc);
  if (numbytes > DRV_PARAM_MAX)
    return drv_end(drv_misuse(CUDA_ERROR_INVALID_VALUE, "%u parameter bytes", numbytes));
  fn->param_size = numbytes;
  return drv_end(CUDA_SUCCESS);
}

static CUresult param_set(CUfunction hfunc, int offset, const void *ptr, unsigned numbytes) {
  drv_fn_t *fn;
  CUresult rc = legacy_fn(hfunc, &fn);
  if (rc != CUDA_SUCCESS) return rc;
  if (!ptr && numbytes) return drv_misuse(CUDA_ERROR_INVALID_VALUE, "NULL value");
  if (offset < 0 || (uint64_t)(unsigned)offset + numbytes > DRV_PARAM_MAX)
    return drv_misuse(CUDA_ERROR_INVALID_VALUE, "%u bytes at offset %d", numbytes, offset);
  if (numbytes) memcpy(fn->params + offset, ptr, numbytes);
  return CUDA_SUCCESS;
}

CUresult CUDAAPI cuParamSeti(CUfunction hfunc, int offset, unsigned int value) {
  DRV_BEGIN(cuParamSeti, DRV_NEED_CTX);
  return drv_end(param_set(hfunc, offset, &value, sizeof value));
}

CUresult CUDAAPI cuParamSetf(CUfunction hfunc, int offset, float value) {
  DRV_BEGIN(cuParamSetf, DRV_NEED_CTX);
  return drv_end(param_set(hfunc, offset, &value, sizeof value));
}

CUresult CUDAAPI cuParamSetv(CUfunction hfunc, int offset, void *ptr, unsigned int numbytes) {
  DRV_BEGIN(cuParamSetv, DRV_NEED_CTX);
  return drv_end(param_set(hfunc, offset, ptr, numbytes));
}

enum { LEGACY_MAX_ARGS = 64 };

static CUresult legacy_launch(CUfunction f, int width, int height, CUstream hStream) {
  drv_fn_t *fn;
  CUresult rc = legacy_fn(f, &fn);
  if (rc != CUDA_SUCCESS) return rc;
  if (width <= 0 || height <= 0)
    return drv_misuse(CUDA_ERROR_INVALID_VALUE, "grid %dx%d", width, height);
  void *args[LEGACY_MAX_ARGS + 1];
  void **argp = NULL;
  if (fn->argsizes) {
    size_t off = 0, i = 0;
    for (; fn->argsizes[i] && i < LEGACY_MAX_ARGS; i++) {
      size_t size = fn->argsizes[i], align = size >= 8 ? 8 : size >= 4 ? 4 : size >= 2 ? 2 : 1;
      off = (off + align - 1) & ~(align - 1);
      args[i] = fn->params + off;
      off += size;
    }
    if (off > fn->param_size)
      return drv_misuse(CUDA_ERROR_INVALID_VALUE,
                        "%s takes %zu parameter bytes, cuParamSetSize gave %u", fn->name, off,
                        fn->param_size);
    if (!fn->argsizes[i]) argp = args;
  }
  const unsigned grid[3] = {(unsigned)width, (unsigned)height, 1};
  const unsigned block[3] = {fn->block[0], fn->block[1], fn->block[2]};
  return launch_as(f, grid, block, fn->shared, hStream, argp, NULL, true);
}

CUresult CUDAAPI cuLaunch(CUfunction f) {
  DRV_BEGIN(cuLaunch, DRV_NEED_CTX);
  return drv_end(legacy_launch(f, 1, 1, NULL));
}

CUresult CUDAAPI cuLaunchGrid(CUfunction f, int grid_width, int grid_height) {
  DRV_BEGIN(cuLaunchGrid, DRV_NEED_CTX);
  return drv_end(legacy_launch(f, grid_width, grid_height, NULL));
}

CUresult CUDAAPI cuLaunchGridAsync(CUfunction f, int grid_width, int grid_height,
                                   CUstream hStream) {
  DRV_BEGIN(cuLaunchGridAsync, DRV_NEED_CTX);
  return drv_end(legacy_launch(f, grid_width, grid_height, hStream));
}
