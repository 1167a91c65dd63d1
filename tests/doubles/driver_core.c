/* The CUDA driver double's core: initialisation, error names, devices, primary contexts, the
 * call discipline every entry point follows, and the test controls. For tests only. */
#include "driver.h"

#include <ctype.h>
#include <dlfcn.h>
#include <link.h>
#include <errno.h>
#include <limits.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

drv_t drv__state = {
    .lock = PTHREAD_MUTEX_INITIALIZER,
    .next_handle = 0x57c0de000001ull, /* far from small integers and pointers */
};
#define D drv__state

/* The calling thread's context stack (cuCtxPushCurrent/PopCurrent, cuCtxCreate pushes,
 * cuCtxSetCurrent replaces the top); the current context is its top. CUDA documents no depth;
 * the double's is fixed, so the stack needs no memory of its own, which would have to be freed
 * at thread exit while the thread's other destructors may still make calls. */
#define DRV_CTX_STACK 64
static _Thread_local struct CUctx_st *tl_stack[DRV_CTX_STACK];
static _Thread_local int tl_depth;

/* Waits on the timeline use absolute CLOCK_MONOTONIC deadlines. */
static void drv_progress_init(void) {
  pthread_condattr_t a;
  pthread_condattr_init(&a);
  pthread_condattr_setclock(&a, CLOCK_MONOTONIC);
  pthread_cond_init(&D.progress, &a);
  pthread_condattr_destroy(&a);
}

/* fork: the child gets the lock free whatever another thread was doing, and a private copy of
 * the double (CUDA itself does not support a forked child using its parent's context). The
 * condition variable is made anew too: a copy taken while parent threads waited on it (in
 * cuCtxSynchronize, say) counts waiters the child does not have, and its first broadcast would
 * wait for them for ever. */
static void drv_fork_prepare(void) {
  pthread_mutex_lock(&D.lock);
}
static void drv_fork_parent(void) {
  pthread_mutex_unlock(&D.lock);
}
static void drv_fork_child(void) {
  drv_progress_init();
  drv_device_forked();
  pthread_mutex_unlock(&D.lock);
}

__attribute__((constructor)) static void drv_init_cond(void) {
  drv_progress_init();
  pthread_atfork(drv_fork_prepare, drv_fork_parent, drv_fork_child);
}

/* WLTEST_EXPECT_PRELOAD=path (set by tests that preload an interposer): that library must be
 * loaded ahead of this one, so that its exported entry points are the ones the program calls, or
 * the process says so and exits 97 before the program runs. ld.so only warns about a preload it
 * cannot load, and a program run without the interposer prints what it prints under it: such a
 * test would pass without the code it tests. (Not by dlsym: the interposer hooks it.) */
typedef struct drv_preload_s {
  char want[PATH_MAX], self[PATH_MAX];
  int at, want_at, self_at;
} drv_preload_t;

static int drv_preload_seen(struct dl_phdr_info *info, size_t size, void *arg) {
  (void)size;
  drv_preload_t *p = arg;
  char path[PATH_MAX];
  int at = p->at++;
  if (!info->dlpi_name || !info->dlpi_name[0] || !realpath(info->dlpi_name, path)) return 0;
  if (p->want_at < 0 && !strcmp(path, p->want)) p->want_at = at;
  if (p->self_at < 0 && !strcmp(path, p->self)) p->self_at = at;
  return 0;
}

__attribute__((constructor)) static void drv_expect_preload(void) {
  const char *want = getenv("WLTEST_EXPECT_PRELOAD");
  if (!want || !*want) return;
  static drv_preload_t p;
  p.at = 0;
  p.want_at = p.self_at = -1;
  Dl_info self;
  if (realpath(want, p.want) && dladdr((void *)drv_expect_preload, &self) && self.dli_fname &&
      realpath(self.dli_fname, p.self))
    dl_iterate_phdr(drv_preload_seen, &p);
  if (p.want_at >= 0 && p.self_at >= 0 && p.want_at < p.self_at) return;
  fprintf(stderr, "wltest-cuda: WLTEST_EXPECT_PRELOAD=%s is not in effect: %s\n", want,
          p.want_at < 0 ? "not loaded" : "loaded after the driver");
  _exit(97);
}

static const char *const drv_fn_names[WLTEST_FN__COUNT] = {
#define DRV_FN_NAME(f) #f,
    WLTEST_DRIVER_FNS(DRV_FN_NAME)
#undef DRV_FN_NAME
};

/* ---- the call discipline ---------------------------------------------------------------------*/

CUresult drv_misuse(CUresult err, const char *fmt, ...) {
  char msg[160];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof msg, fmt, ap);
  va_end(ap);
  D.st.misuse++;
  snprintf(D.st.last_misuse, sizeof D.st.last_misuse, "%s: %s", D.fn ? D.fn : "?", msg);
  /* Loud on purpose: a misuse is a bug in the code under test, and this line says which. */
  fprintf(stderr, "wltest-cuda: misuse: %s -> %d\n", D.st.last_misuse, (int)err);
  return err;
}

struct CUctx_st *drv_current(void) {
  return tl_depth ? tl_stack[tl_depth - 1] : NULL;
}

CUresult drv_ctx_usable(struct CUctx_st *c, const char *what) {
  if (!c) return drv_misuse(CUDA_ERROR_INVALID_CONTEXT, "no %s context", what);
  /* A context destroyed by another thread while current here (cuCtxDestroy's documentation). */
  if (c->destroyed)
    return drv_misuse(CUDA_ERROR_CONTEXT_IS_DESTROYED, "the %s context %p was destroyed", what,
                      (void *)c);
  if (c->refs == 0)
    return drv_misuse(CUDA_ERROR_INVALID_CONTEXT, "the %s context %p was released", what,
                      (void *)c);
  return CUDA_SUCCESS;
}

CUresult drv_begin(wltest_fn_t fn, const char *name, int need) {
  pthread_mutex_lock(&D.lock);
  D.fn = name;
  D.st.calls[fn]++;
  CUresult rc = D.fail_next[fn];
  if (rc != CUDA_SUCCESS) {
    D.fail_next[fn] = CUDA_SUCCESS;
    D.st.injected++;
  } else if (D.fail_always[fn] != CUDA_SUCCESS && !(D.fail_skip[fn] && D.fail_skip[fn]--)) {
    rc = D.fail_always[fn];
    D.st.injected++;
  } else if (need >= DRV_NEED_INIT && !D.initialized) {
    rc = drv_misuse(CUDA_ERROR_NOT_INITIALIZED, "called before cuInit");
  } else if (need >= DRV_NEED_CTX) {
    rc = drv_ctx_usable(drv_current(), "current");
  }
  if (rc != CUDA_SUCCESS) {
    D.fn = NULL;
    pthread_mutex_unlock(&D.lock);
  }
  return rc;
}

CUresult drv_end(CUresult rc) {
  D.fn = NULL;
  pthread_mutex_unlock(&D.lock);
  return rc;
}

/* ---- initialisation and version --------------------------------------------------------------*/

/* Digits with an optional K/M/G/T suffix (powers of 1024): "8G", "256M", "1073741824". */
static int parse_size(const char *s, size_t *out) {
  if (!s || !isdigit((unsigned char)*s)) return -1;
  char *end;
  errno = 0;
  unsigned long long v = strtoull(s, &end, 10);
  if (errno) return -1;
  unsigned shift = 0;
  switch (toupper((unsigned char)*end)) {
  case 'K':
    shift = 10;
    end++;
    break;
  case 'M':
    shift = 20;
    end++;
    break;
  case 'G':
    shift = 30;
    end++;
    break;
  case 'T':
    shift = 40;
    end++;
    break;
  default:
    break;
  }
  if (shift && (*end == 'i' || *end == 'I')) end++;
  if (*end == 'B' || *end == 'b') end++;
  if (*end || v == 0 || v > (SIZE_MAX >> shift)) return -1;
  *out = (size_t)v << shift;
  return 0;
}

/* WLTEST_DRV_FAIL=name:code[:skip],...: from then on (after skip successful calls) every call of
 * the entry point returns code, as a driver or sandbox that lacks a feature would. Under the
 * lock, at the first cuInit; a bad entry is reported and ignored. */
static void parse_fail_env(void) {
  const char *env = getenv("WLTEST_DRV_FAIL");
  if (!env || !*env) return;
  char *copy = strdup(env), *save = NULL;
  for (char *e = copy ? strtok_r(copy, ",", &save) : NULL; e; e = strtok_r(NULL, ",", &save)) {
    char *c1 = strchr(e, ':');
    char *end = NULL;
    unsigned long code = 0, skip = 0;
    int id = -1;
    if (c1) {
      *c1 = 0;
      id = wltest_fn_id(e);
      code = strtoul(c1 + 1, &end, 10);
      if (end && *end == ':') skip = strtoul(end + 1, &end, 10);
    }
    if (id < 0 || !end || *end || code == 0) {
      fprintf(stderr,
              "wltest-cuda: WLTEST_DRV_FAIL entry '%s' is not name:code[:skip] with a "
              "known entry point; ignored\n",
              e);
      continue;
    }
    D.fail_always[id] = (CUresult)code;
    D.fail_skip[id] = skip;
  }
  free(copy);
}

/* WLTEST_CAPTURE_UNSAFE=vmm: the VMM calls and cuEventCreate/Destroy count as potentially unsafe
 * during stream capture, as cuMemAlloc does (whether a real driver counts them is not
 * documented): a stricter driver, for the tests of our own calls during captures. */
static void parse_unsafe_env(void) {
  const char *env = getenv("WLTEST_CAPTURE_UNSAFE");
  if (!env || !*env) return;
  if (strcmp(env, "vmm") == 0)
    D.unsafe_vmm = true;
  else
    fprintf(stderr, "wltest-cuda: WLTEST_CAPTURE_UNSAFE=%s is not 'vmm'; ignored\n", env);
}

/* WLTEST_PITCH_ALIGN: the row alignment of pitched allocations (a power of two from 32 to 64K;
 * default 512, what drivers commonly give). */
static void parse_pitch_env(void) {
  D.pitch_align = 512;
  const char *env = getenv("WLTEST_PITCH_ALIGN");
  if (!env) return;
  char *end = NULL;
  errno = 0;
  long n = isdigit((unsigned char)*env) ? strtol(env, &end, 10) : 0;
  if (errno || !end || *end || n < 32 || n > 65536 || (n & (n - 1))) {
    fprintf(stderr,
            "wltest-cuda: WLTEST_PITCH_ALIGN=%s is not a power of two from 32 to 65536; using "
            "512\n",
            env);
    return;
  }
  D.pitch_align = (size_t)n;
}

/* WLTEST_DEVICE_COUNT: how many devices the double has (1 to DRV_MAXDEV, default 1). */
static int parse_count_env(void) {
  const char *env = getenv("WLTEST_DEVICE_COUNT");
  if (!env) return 1;
  char *end = NULL;
  errno = 0;
  long n = isdigit((unsigned char)*env) ? strtol(env, &end, 10) : 0;
  if (errno || !end || *end || n < 1 || n > DRV_MAXDEV) {
    fprintf(stderr,
            "wltest-cuda: WLTEST_DEVICE_COUNT=%s is not a device count from 1 to %d; using 1\n",
            env, DRV_MAXDEV);
    return 1;
  }
  return (int)n;
}

CUresult CUDAAPI cuInit(unsigned int Flags) {
  DRV_BEGIN(cuInit, DRV_NEED_NONE);
  if (Flags != 0)
    return drv_end(drv_misuse(CUDA_ERROR_INVALID_VALUE, "flags %u, must be 0", Flags));
  if (!D.initialized) {
    D.capacity = (size_t)8 << 30;
    const char *env = getenv("WLTEST_DEVICE_MEM");
    if (env && parse_size(env, &D.capacity))
      fprintf(stderr, "wltest-cuda: WLTEST_DEVICE_MEM=%s is not a size; using 8 GiB\n", env);
    D.st.capacity = D.capacity;
    D.ndev = parse_count_env();
    D.st.devices = (uint64_t)D.ndev;
    D.kernel_ns = drv_kernel_ns_default();
    parse_fail_env();
    parse_unsafe_env();
    /* A driver or device without POSIX file descriptor handles, for tests of a fallback. */
    const char *nofd = getenv("WLTEST_NO_POSIX_FD");
    D.no_posix_fd = nofd && strcmp(nofd, "1") == 0;
    parse_pitch_env();
    drv_device_init();
    D.initialized = true;
  }
  return drv_end(CUDA_SUCCESS);
}

CUresult CUDAAPI cuDriverGetVersion(int *driverVersion) {
  DRV_BEGIN(cuDriverGetVersion, DRV_NEED_NONE);
  if (!driverVersion) return drv_end(drv_misuse(CUDA_ERROR_INVALID_VALUE, "NULL output"));
  *driverVersion = CUDA_VERSION;
  return drv_end(CUDA_SUCCESS);
}

/* ---- error names ------------------------------------------------------------------------------*/

typedef struct drv_err_s {
  CUresult code;
  const char *name, *desc;
} drv_err_t;

#define E(code, desc)                                                                              \
  { code, #code, desc }
/* Every code of the header (a name for each); descriptions for those our tests meet. */
static const drv_err_t drv_errs[] = {
    E(CUDA_SUCCESS, "no error"),
    E(CUDA_ERROR_INVALID_VALUE, "invalid argument"),
    E(CUDA_ERROR_OUT_OF_MEMORY, "out of memory"),
    E(CUDA_ERROR_NOT_INITIALIZED, "initialization error"),
    E(CUDA_ERROR_DEINITIALIZED, "driver shutting down"),
    E(CUDA_ERROR_NO_DEVICE, "no CUDA-capable device is detected"),
    E(CUDA_ERROR_INVALID_DEVICE, "invalid device ordinal"),
    E(CUDA_ERROR_INVALID_CONTEXT, "invalid device context"),
    E(CUDA_ERROR_CONTEXT_IS_DESTROYED, "context is destroyed"),
    E(CUDA_ERROR_INVALID_HANDLE, "invalid resource handle"),
    E(CUDA_ERROR_NOT_READY, "device not ready"),
    E(CUDA_ERROR_ILLEGAL_ADDRESS, "an illegal memory access was encountered"),
    E(CUDA_ERROR_NOT_PERMITTED, "operation not permitted"),
    E(CUDA_ERROR_NOT_SUPPORTED, "operation not supported"),
    E(CUDA_ERROR_UNKNOWN, "unknown error"),
    E(CUDA_ERROR_PROFILER_DISABLED, NULL),
    E(CUDA_ERROR_PROFILER_NOT_INITIALIZED, NULL),
    E(CUDA_ERROR_PROFILER_ALREADY_STARTED, NULL),
    E(CUDA_ERROR_PROFILER_ALREADY_STOPPED, NULL),
    E(CUDA_ERROR_STUB_LIBRARY, NULL),
    E(CUDA_ERROR_CALL_REQUIRES_NEWER_DRIVER, NULL),
    E(CUDA_ERROR_DEVICE_UNAVAILABLE, NULL),
    E(CUDA_ERROR_DEVICE_NOT_LICENSED, NULL),
    E(CUDA_ERROR_INVALID_IMAGE, NULL),
    E(CUDA_ERROR_CONTEXT_ALREADY_CURRENT, NULL),
    E(CUDA_ERROR_MAP_FAILED, NULL),
    E(CUDA_ERROR_UNMAP_FAILED, NULL),
    E(CUDA_ERROR_ARRAY_IS_MAPPED, NULL),
    E(CUDA_ERROR_ALREADY_MAPPED, NULL),
    E(CUDA_ERROR_NO_BINARY_FOR_GPU, NULL),
    E(CUDA_ERROR_ALREADY_ACQUIRED, NULL),
    E(CUDA_ERROR_NOT_MAPPED, NULL),
    E(CUDA_ERROR_NOT_MAPPED_AS_ARRAY, NULL),
    E(CUDA_ERROR_NOT_MAPPED_AS_POINTER, NULL),
    E(CUDA_ERROR_ECC_UNCORRECTABLE, NULL),
    E(CUDA_ERROR_UNSUPPORTED_LIMIT, NULL),
    E(CUDA_ERROR_CONTEXT_ALREADY_IN_USE, NULL),
    E(CUDA_ERROR_PEER_ACCESS_UNSUPPORTED, NULL),
    E(CUDA_ERROR_INVALID_PTX, NULL),
    E(CUDA_ERROR_INVALID_GRAPHICS_CONTEXT, NULL),
    E(CUDA_ERROR_NVLINK_UNCORRECTABLE, NULL),
    E(CUDA_ERROR_JIT_COMPILER_NOT_FOUND, NULL),
    E(CUDA_ERROR_UNSUPPORTED_PTX_VERSION, NULL),
    E(CUDA_ERROR_JIT_COMPILATION_DISABLED, NULL),
    E(CUDA_ERROR_UNSUPPORTED_EXEC_AFFINITY, NULL),
    E(CUDA_ERROR_UNSUPPORTED_DEVSIDE_SYNC, NULL),
    E(CUDA_ERROR_CONTAINED, NULL),
    E(CUDA_ERROR_INVALID_SOURCE, NULL),
    E(CUDA_ERROR_FILE_NOT_FOUND, NULL),
    E(CUDA_ERROR_SHARED_OBJECT_SYMBOL_NOT_FOUND, NULL),
    E(CUDA_ERROR_SHARED_OBJECT_INIT_FAILED, NULL),
    E(CUDA_ERROR_OPERATING_SYSTEM, NULL),
    E(CUDA_ERROR_ILLEGAL_STATE, NULL),
    E(CUDA_ERROR_LOSSY_QUERY, NULL),
    E(CUDA_ERROR_NOT_FOUND, NULL),
    E(CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES, NULL),
    E(CUDA_ERROR_LAUNCH_TIMEOUT, NULL),
    E(CUDA_ERROR_LAUNCH_INCOMPATIBLE_TEXTURING, NULL),
    E(CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED, NULL),
    E(CUDA_ERROR_PEER_ACCESS_NOT_ENABLED, NULL),
    E(CUDA_ERROR_PRIMARY_CONTEXT_ACTIVE, NULL),
    E(CUDA_ERROR_ASSERT, NULL),
    E(CUDA_ERROR_TOO_MANY_PEERS, NULL),
    E(CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED, NULL),
    E(CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED, NULL),
    E(CUDA_ERROR_HARDWARE_STACK_ERROR, NULL),
    E(CUDA_ERROR_ILLEGAL_INSTRUCTION, NULL),
    E(CUDA_ERROR_MISALIGNED_ADDRESS, NULL),
    E(CUDA_ERROR_INVALID_ADDRESS_SPACE, NULL),
    E(CUDA_ERROR_INVALID_PC, NULL),
    E(CUDA_ERROR_LAUNCH_FAILED, NULL),
    E(CUDA_ERROR_COOPERATIVE_LAUNCH_TOO_LARGE, NULL),
    E(CUDA_ERROR_TENSOR_MEMORY_LEAK, NULL),
    E(CUDA_ERROR_SYSTEM_NOT_READY, NULL),
    E(CUDA_ERROR_SYSTEM_DRIVER_MISMATCH, NULL),
    E(CUDA_ERROR_COMPAT_NOT_SUPPORTED_ON_DEVICE, NULL),
    E(CUDA_ERROR_MPS_CONNECTION_FAILED, NULL),
    E(CUDA_ERROR_MPS_RPC_FAILURE, NULL),
    E(CUDA_ERROR_MPS_SERVER_NOT_READY, NULL),
    E(CUDA_ERROR_MPS_MAX_CLIENTS_REACHED, NULL),
    E(CUDA_ERROR_MPS_MAX_CONNECTIONS_REACHED, NULL),
    E(CUDA_ERROR_MPS_CLIENT_TERMINATED, NULL),
    E(CUDA_ERROR_CDP_NOT_SUPPORTED, NULL),
    E(CUDA_ERROR_CDP_VERSION_MISMATCH, NULL),
    E(CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED, NULL),
    E(CUDA_ERROR_STREAM_CAPTURE_INVALIDATED, NULL),
    E(CUDA_ERROR_STREAM_CAPTURE_MERGE, NULL),
    E(CUDA_ERROR_STREAM_CAPTURE_UNMATCHED, NULL),
    E(CUDA_ERROR_STREAM_CAPTURE_UNJOINED, NULL),
    E(CUDA_ERROR_STREAM_CAPTURE_ISOLATION, NULL),
    E(CUDA_ERROR_STREAM_CAPTURE_IMPLICIT, NULL),
    E(CUDA_ERROR_CAPTURED_EVENT, NULL),
    E(CUDA_ERROR_STREAM_CAPTURE_WRONG_THREAD, NULL),
    E(CUDA_ERROR_TIMEOUT, NULL),
    E(CUDA_ERROR_GRAPH_EXEC_UPDATE_FAILURE, NULL),
    E(CUDA_ERROR_EXTERNAL_DEVICE, NULL),
    E(CUDA_ERROR_INVALID_CLUSTER_SIZE, NULL),
    E(CUDA_ERROR_FUNCTION_NOT_LOADED, NULL),
    E(CUDA_ERROR_INVALID_RESOURCE_TYPE, NULL),
    E(CUDA_ERROR_INVALID_RESOURCE_CONFIGURATION, NULL),
    E(CUDA_ERROR_KEY_ROTATION, NULL),
};
#undef E

static const drv_err_t *err_find(CUresult code) {
  for (size_t i = 0; i < sizeof drv_errs / sizeof drv_errs[0]; i++)
    if (drv_errs[i].code == code) return &drv_errs[i];
  return NULL;
}

CUresult CUDAAPI cuGetErrorName(CUresult error, const char **pStr) {
  DRV_BEGIN(cuGetErrorName, DRV_NEED_NONE);
  if (!pStr) return drv_end(drv_misuse(CUDA_ERROR_INVALID_VALUE, "NULL output"));
  const drv_err_t *e = err_find(error);
  *pStr = e ? e->name : NULL;
  return drv_end(e ? CUDA_SUCCESS
                   : drv_misuse(CUDA_ERROR_INVALID_VALUE, "unknown code %d", (int)error));
}

CUresult CUDAAPI cuGetErrorString(CUresult error, const char **pStr) {
  DRV_BEGIN(cuGetErrorString, DRV_NEED_NONE);
  if (!pStr) return drv_end(drv_misuse(CUDA_ERROR_INVALID_VALUE, "NULL output"));
  const drv_err_t *e = err_find(error);
  *pStr = e ? (e->desc ? e->desc : e->name) : NULL;
  return drv_end(e ? CUDA_SUCCESS
                   : drv_misuse(CUDA_ERROR_INVALID_VALUE, "unknown code %d", (int)error));
}

/* ---- devices ---------------------------------------------------------------------------------*/

bool drv_device_valid(int dev) {
  return dev >= 0 && dev < D.ndev;
}

CUresult CUDAAPI cuDeviceGetCount(int *count) {
  DRV_BEGIN(cuDeviceGetCount, DRV_NEED_INIT);
  if (!count) return drv_end(drv_misuse(CUDA_ERROR_INVALID_VALUE, "NULL output"));
  *count = D.ndev;
  return drv_end(CUDA_SUCCESS);
}

CUresult CUDAAPI cuDeviceGet(CUdevice *device, int ordinal) {
  DRV_BEGIN(cuDeviceGet, DRV_NEED_INIT);
  if (!device) return drv_end(drv_misuse(CUDA_ERROR_INVALID_VALUE, "NULL output"));
  if (!drv_device_valid(ordinal))
    return drv_end(drv_misuse(CUDA_ERROR_INVALID_DEVICE, "no device %d", ordinal));
  *device = ordinal;
  return drv_end(CUDA_SUCCESS);
}

CUresult CUDAAPI cuDeviceTotalMem(size_t *bytes, CUdevice dev) {
  DRV_BEGIN(cuDeviceTotalMem_v2, DRV_NEED_INIT);
  if (!bytes) return drv_end(drv_misuse(CUDA_ERROR_INVALID_VALUE, "NULL output"));
  if (!drv_device_valid(dev))
    return drv_end(drv_misuse(CUDA_ERROR_INVALID_DEVICE, "no device %d", dev));
  *bytes = D.capacity;
  return drv_end(CUDA_SUCCESS);
}

CUresult CUDAAPI cuDeviceGetAttribute(int *pi, CUdevice_attribute attrib, CUdevice dev) {
  DRV_BEGIN(cuDeviceGetAttribute, DRV_NEED_INIT);
  if (!pi) return drv_end(drv_misuse(CUDA_ERROR_INVALID_VALUE, "NULL output"));
  if (!drv_device_valid(dev))
    return drv_end(drv_misuse(CUDA_ERROR_INVALID_DEVICE, "no device %d", dev));
  if ((int)attrib <= 0 || attrib >= CU_DEVICE_ATTRIBUTE_MAX)
    return drv_end(
        drv_misuse(CUDA_ERROR_INVALID_VALUE, "attribute %d does not exist", (int)attrib));
  /* An H100-like device; only what our code asks about is modelled. */
  switch (attrib) {
  case CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED:
    *pi = 1;
    break;
  case CU_DEVICE_ATTRIBUTE_UNIFIED_ADDRESSING:
    *pi = 1;
    break;
  case CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR:
    *pi = 9;
    break;
  case CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR:
    *pi = 0;
    break;
  case CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT:
    *pi = 132;
    break;
  case CU_DEVICE_ATTRIBUTE_WARP_SIZE:
    *pi = 32;
    break;
  case CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_BLOCK:
  case CU_DEVICE_ATTRIBUTE_MAX_BLOCK_DIM_X:
  case CU_DEVICE_ATTRIBUTE_MAX_BLOCK_DIM_Y:
    *pi = 1024;
    break;
  case CU_DEVICE_ATTRIBUTE_MAX_BLOCK_DIM_Z:
    *pi = 64;
    break;
  case CU_DEVICE_ATTRIBUTE_MAX_GRID_DIM_X:
    *pi = 0x7fffffff;
    break;
  case CU_DEVICE_ATTRIBUTE_MAX_GRID_DIM_Y:
  case CU_DEVICE_ATTRIBUTE_MAX_GRID_DIM_Z:
    *pi = 65535;
    break;
  case CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK:
    *pi = 48 * 1024;
    break;
  case CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN:
    *pi = 227 * 1024;
    break;
  case CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_MULTIPROCESSOR:
    *pi = 228 * 1024;
    break;
  case CU_DEVICE_ATTRIBUTE_MAX_REGISTERS_PER_BLOCK:
  case CU_DEVICE_ATTRIBUTE_MAX_REGISTERS_PER_MULTIPROCESSOR:
    *pi = 65536;
    break;
  case CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_MULTIPROCESSOR:
    *pi = 2048;
    break;
  case CU_DEVICE_ATTRIBUTE_MAX_BLOCKS_PER_MULTIPROCESSOR:
    *pi = 32;
    break;
  case CU_DEVICE_ATTRIBUTE_TOTAL_CONSTANT_MEMORY:
    *pi = 65536;
    break;
  case CU_DEVICE_ATTRIBUTE_CLOCK_RATE:
    *pi = 1980000; /* kHz */
    break;
  case CU_DEVICE_ATTRIBUTE_MEMORY_CLOCK_RATE:
    *pi = 2619000; /* kHz */
    break;
  case CU_DEVICE_ATTRIBUTE_GLOBAL_MEMORY_BUS_WIDTH:
    *pi = 5120;
    break;
  case CU_DEVICE_ATTRIBUTE_L2_CACHE_SIZE:
    *pi = 50 * 1024 * 1024;
    break;
  case CU_DEVICE_ATTRIBUTE_PCI_BUS_ID:
    *pi = 0x1b + dev; /* as cuDeviceGetPCIBusId says */
    break;
  case CU_DEVICE_ATTRIBUTE_PCI_DEVICE_ID:
  case CU_DEVICE_ATTRIBUTE_PCI_DOMAIN_ID:
  case CU_DEVICE_ATTRIBUTE_INTEGRATED:
  case CU_DEVICE_ATTRIBUTE_TCC_DRIVER:
  case CU_DEVICE_ATTRIBUTE_COMPUTE_MODE: /* CU_COMPUTEMODE_DEFAULT */
    *pi = 0;
    break;
  case CU_DEVICE_ATTRIBUTE_CONCURRENT_KERNELS:
  case CU_DEVICE_ATTRIBUTE_CAN_MAP_HOST_MEMORY:
  case CU_DEVICE_ATTRIBUTE_MEMORY_POOLS_SUPPORTED:
  case CU_DEVICE_ATTRIBUTE_COOPERATIVE_LAUNCH:
  case CU_DEVICE_ATTRIBUTE_COOPERATIVE_MULTI_DEVICE_LAUNCH:
  case CU_DEVICE_ATTRIBUTE_GLOBAL_L1_CACHE_SUPPORTED:
  case CU_DEVICE_ATTRIBUTE_LOCAL_L1_CACHE_SUPPORTED:
  case CU_DEVICE_ATTRIBUTE_STREAM_PRIORITIES_SUPPORTED:
    *pi = 1;
    break;
  case CU_DEVICE_ATTRIBUTE_ASYNC_ENGINE_COUNT:
    *pi = 3;
    break;
  case CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR_SUPPORTED:
    *pi = !D.no_posix_fd;
    break;
  case CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_WIN32_HANDLE_SUPPORTED:
  case CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_WIN32_KMT_HANDLE_SUPPORTED:
  case CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_FABRIC_SUPPORTED: /* no IMEX channels */
    *pi = 0;
    break;
  default:
    /* Not a misuse: the double is incomplete. Say so, since a real driver would answer. */
    fprintf(stderr, "wltest-cuda: cuDeviceGetAttribute: attribute %d is not modelled\n",
            (int)attrib);
    return drv_end(CUDA_ERROR_NOT_SUPPORTED);
  }
  return drv_end(CUDA_SUCCESS);
}

static CUresult device_check(const void *out, CUdevice dev) {
  if (!out) return drv_misuse(CUDA_ERROR_INVALID_VALUE, "NULL output");
  if (!drv_device_valid(dev)) return drv_misuse(CUDA_ERROR_INVALID_DEVICE, "no device %d", dev);
  return CUDA_SUCCESS;
}

CUresult CUDAAPI cuDeviceGetName(char *name, int len, CUdevice dev) {
  DRV_BEGIN(cuDeviceGetName, DRV_NEED_INIT);
  CUresult rc = device_check(name, dev);
  if (rc != CUDA_SUCCESS) return drv_end(rc);
  if (len <= 0) return drv_end(drv_misuse(CUDA_ERROR_INVALID_VALUE, "length %d", len));
  snprintf(name, (size_t)len, "%s", "Wavelet Test Double (no GPU)");
  return drv_end(CUDA_SUCCESS);
}

/* A fixed UUID per device, so that tests can compare it. */
static void uuid_of(CUuuid *uuid, CUdevice dev) {
  static const char base[16] = {0x57, 0x4c, 0x54, 0x45, 0x53, 0x54, 0x2d, 0x44,
                                0x4f, 0x55, 0x42, 0x4c, 0x45, 0x00, 0x00, 0x00};
  memcpy(uuid->bytes, base, sizeof uuid->bytes);
  uuid->bytes[15] = (char)dev;
}

CUresult CUDAAPI cuDeviceGetUuid_v1(CUuuid *uuid, CUdevice dev) {
  DRV_BEGIN(cuDeviceGetUuid, DRV_NEED_INIT);
  CUresult rc = device_check(uuid, dev);
  if (rc == CUDA_SUCCESS) uuid_of(uuid, dev);
  return drv_end(rc);
}

CUresult CUDAAPI cuDeviceGetUuid_v2(CUuuid *uuid, CUdevice dev) {
  DRV_BEGIN(cuDeviceGetUuid_v2, DRV_NEED_INIT);
  CUresult rc = device_check(uuid, dev);
  if (rc == CUDA_SUCCESS) uuid_of(uuid, dev);
  return drv_end(rc);
}

CUresult CUDAAPI cuDeviceGetPCIBusId(char *pciBusId, int len, CUdevice dev) {
  DRV_BEGIN(cuDeviceGetPCIBusId, DRV_NEED_INIT);
  CUresult rc = device_check(pciBusId, dev);
  if (rc != CUDA_SUCCESS) return drv_end(rc);
  if (len < 13) return drv_end(drv_misuse(CUDA_ERROR_INVALID_VALUE, "length %d < 13", len));
  snprintf(pciBusId, (size_t)len, "0000:%02x:00.0", 0x1b + dev);
  return drv_end(CUDA_SUCCESS);
}

/* ---- contexts --------------------------------------------------------------------------------*/

/* Any context behind a handle, destroyed ones included, or NULL. */
static struct CUctx_st *ctx_lookup(CUcontext h) {
  if (!h) return NULL;
  for (int i = 0; i < DRV_MAXDEV; i++)
    if (D.primary[i] == h) return D.primary[i];
  for (struct CUctx_st *c = D.created; c; c = c->next)
    if (c == h) return c;
  return NULL;
}

struct CUctx_st *drv_ctx_find(CUcontext h) {
  struct CUctx_st *c = ctx_lookup(h);
  return c && !c->destroyed ? c : NULL;
}

/* A context handle given as an argument: an unknown, destroyed or released one is
 * CUDA_ERROR_INVALID_CONTEXT (a misuse). */
static CUresult ctx_arg(CUcontext h, struct CUctx_st **out) {
  struct CUctx_st *c = ctx_lookup(h);
  if (!c) return drv_misuse(CUDA_ERROR_INVALID_CONTEXT, "unknown context %p", (void *)h);
  if (c->destroyed)
    return drv_misuse(CUDA_ERROR_INVALID_CONTEXT, "context %p was destroyed", (void *)h);
  if (c->refs == 0)
    return drv_misuse(CUDA_ERROR_INVALID_CONTEXT, "context %p was released", (void *)h);
  *out = c;
  return CUDA_SUCCESS;
}

static struct CUctx_st *ctx_new(int dev) {
  struct CUctx_st *c = calloc(1, sizeof *c);
  if (!c) return NULL;
  c->magic = DRV_CTX_MAGIC;
  c->device = dev;
  c->null_stream.magic = DRV_STREAM_MAGIC;
  c->null_stream.ctx = c;
  return c;
}

/* Not a misuse: a real driver's stack would grow. */
static CUresult stack_full(void) {
  fprintf(stderr, "wltest-cuda: %s: context stacks deeper than %d are not modelled\n", D.fn,
          DRV_CTX_STACK);
  return CUDA_ERROR_NOT_SUPPORTED;
}

/* ---- primary contexts ------------------------------------------------------------------------*/

CUresult CUDAAPI cuDevicePrimaryCtxRetain(CUcontext *pctx, CUdevice dev) {
  DRV_BEGIN(cuDevicePrimaryCtxRetain, DRV_NEED_INIT);
  if (!pctx) return drv_end(drv_misuse(CUDA_ERROR_INVALID_VALUE, "NULL output"));
  if (!drv_device_valid(dev))
    return drv_end(drv_misuse(CUDA_ERROR_INVALID_DEVICE, "no device %d", dev));
  struct CUctx_st *c = D.primary[dev];
  if (!c) {
    c = ctx_new(dev);
    if (!c) return drv_end(CUDA_ERROR_OUT_OF_MEMORY);
    D.primary[dev] = c;
  }
  c->refs++;
  D.st.primary_refs++;
  *pctx = c;
  return drv_end(CUDA_SUCCESS);
}

CUresult CUDAAPI cuDevicePrimaryCtxRelease(CUdevice dev) {
  DRV_BEGIN(cuDevicePrimaryCtxRelease_v2, DRV_NEED_INIT);
  if (!drv_device_valid(dev))
    return drv_end(drv_misuse(CUDA_ERROR_INVALID_DEVICE, "no device %d", dev));
  struct CUctx_st *c = D.primary[dev];
  if (!c || c->refs == 0)
    return drv_end(
        drv_misuse(CUDA_ERROR_INVALID_CONTEXT, "device %d's primary context is not retained", dev));
  c->refs--;
  D.st.primary_refs--;
  /* The last release destroys the context's resources, as the real driver does: its streams,
   * events and graphs, its cuMemAlloc and page-locked memory and the IPC handles opened in it
   * (as a reset does; the handle stays, and a new retain starts a fresh context). */
  if (c->refs == 0) {
    drv_ctx_drop_objects(c);
    drv_linear_drop_ctx(c);
    drv_ipc_drop_ctx(c);
  }
  return drv_end(CUDA_SUCCESS);
}

/* Flags are not modelled (0); active while retained. */
CUresult CUDAAPI cuDevicePrimaryCtxGetState(CUdevice dev, unsigned int *flags, int *active) {
  DRV_BEGIN(cuDevicePrimaryCtxGetState, DRV_NEED_INIT);
  if (!flags || !active) return drv_end(drv_misuse(CUDA_ERROR_INVALID_VALUE, "NULL output"));
  if (!drv_device_valid(dev))
    return drv_end(drv_misuse(CUDA_ERROR_INVALID_DEVICE, "no device %d", dev));
  *flags = 0;
  *active = D.primary[dev] && D.primary[dev]->refs > 0;
  return drv_end(CUDA_SUCCESS);
}

/* cuDevicePrimaryCtxReset: "destroys and cleans up all resources associated with the current
 * device in the current process", but "does not release" the context. The double keeps the
 * handle and its retains (threads that have it current keep it, and calls afterwards work as on
 * a fresh context) and frees what belongs to it: its pending work (abandoned), streams, events
 * and executable graphs, its cuMemAlloc memory, the page-locked host memory allocated in it and
 * the IPC handles opened in it, given back to the capacity. Contexts the program created on the
 * device keep theirs (they are not the primary context). Stream-ordered memory and pools stay
 * (cudaDeviceReset's documentation says so). Whether a reset takes VMM memory (cuMemCreate
 * handles, reservations, mappings) the documentation does not say; the double keeps it, as it
 * belongs to no context (cuCtxDestroy's documentation). Modules, libraries and graphs stay too:
 * the double ties them to no context. */
static CUresult primary_reset(CUdevice dev) {
  if (!drv_device_valid(dev)) return drv_misuse(CUDA_ERROR_INVALID_DEVICE, "no device %d", dev);
  D.st.resets++;
  struct CUctx_st *c = D.primary[dev];
  if (!c) return CUDA_SUCCESS; /* never made: nothing to reset */
  drv_ctx_drop_objects(c);
  drv_linear_drop_ctx(c);
  drv_ipc_drop_ctx(c);
  return CUDA_SUCCESS;
}

CUresult CUDAAPI cuDevicePrimaryCtxReset(CUdevice dev) {
  DRV_BEGIN(cuDevicePrimaryCtxReset_v2, DRV_NEED_INIT);
  return drv_end(primary_reset(dev));
}

/* 7.0's ABI: the same argument. */
CUresult CUDAAPI cuDevicePrimaryCtxReset_v1(CUdevice dev) {
  DRV_BEGIN(cuDevicePrimaryCtxReset, DRV_NEED_INIT);
  return drv_end(primary_reset(dev));
}

/* ---- peer access -----------------------------------------------------------------------------
 * Recorded, not enforced (a launch may touch any memory): the current context may access the
 * peer context's device's memory from now on. */

CUresult CUDAAPI cuCtxEnablePeerAccess(CUcontext peer, unsigned int flags) {
  DRV_BEGIN(cuCtxEnablePeerAccess, DRV_NEED_CTX);
  struct CUctx_st *me = drv_current(), *p;
  CUresult rc = ctx_arg(peer, &p);
  if (rc != CUDA_SUCCESS) return drv_end(rc);
  if (flags) return drv_end(drv_misuse(CUDA_ERROR_INVALID_VALUE, "flags %#x, must be 0", flags));
  if (p->device == me->device)
    return drv_end(drv_misuse(CUDA_ERROR_INVALID_DEVICE, "peer context is on this device"));
  if (me->peers & (1u << p->device)) return drv_end(CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED);
  me->peers |= 1u << p->device;
  return drv_end(CUDA_SUCCESS);
}

CUresult CUDAAPI cuCtxDisablePeerAccess(CUcontext peer) {
  DRV_BEGIN(cuCtxDisablePeerAccess, DRV_NEED_CTX);
  struct CUctx_st *me = drv_current(), *p;
  CUresult rc = ctx_arg(peer, &p);
  if (rc != CUDA_SUCCESS) return drv_end(rc);
  if (!(me->peers & (1u << p->device))) return drv_end(CUDA_ERROR_PEER_ACCESS_NOT_ENABLED);
  me->peers &= ~(1u << p->device);
  return drv_end(CUDA_SUCCESS);
}

/* ---- created contexts ------------------------------------------------------------------------*/

/* Every cuCtxCreate: a new context on dev (refs 1, its own legacy stream), pushed on the calling
 * thread's stack, so current here, as CUDA does. Flags are checked (one scheduling flag at most,
 * nothing outside CU_CTX_FLAGS_MASK), not modelled. */
static CUresult ctx_create(CUcontext *pctx, unsigned flags, CUdevice dev) {
  if (!pctx) return drv_misuse(CUDA_ERROR_INVALID_VALUE, "NULL output");
  if (!drv_device_valid(dev)) return drv_misuse(CUDA_ERROR_INVALID_DEVICE, "no device %d", dev);
  unsigned sched = flags & CU_CTX_SCHED_MASK;
  if ((flags & ~(unsigned)CU_CTX_FLAGS_MASK) || (sched & (sched - 1)))
    return drv_misuse(CUDA_ERROR_INVALID_VALUE, "flags %#x", flags);
  if (tl_depth == DRV_CTX_STACK) return stack_full();
  struct CUctx_st *c = ctx_new(dev);
  if (!c) return CUDA_ERROR_OUT_OF_MEMORY;
  c->created = true;
  c->refs = 1;
  c->next = D.created;
  D.created = c;
  D.st.contexts++;
  tl_stack[tl_depth++] = c;
  *pctx = c;
  return CUDA_SUCCESS;
}

/* Execution affinity and CIG are not modelled: said, not counted as misuse. */
static CUresult not_modelled(const char *what) {
  fprintf(stderr, "wltest-cuda: %s: %s is not modelled\n", D.fn, what);
  return CUDA_ERROR_NOT_SUPPORTED;
}

/* 2.0's and 3.2's ABIs: flags and a device. */
CUresult CUDAAPI cuCtxCreate_v1(CUcontext *pctx, unsigned int flags, CUdevice dev) {
  DRV_BEGIN(cuCtxCreate, DRV_NEED_INIT);
  return drv_end(ctx_create(pctx, flags, dev));
}

CUresult CUDAAPI cuCtxCreate_v2(CUcontext *pctx, unsigned int flags, CUdevice dev) {
  DRV_BEGIN(cuCtxCreate_v2, DRV_NEED_INIT);
  return drv_end(ctx_create(pctx, flags, dev));
}

/* 11.4's ABI: execution affinity parameters, none accepted. */
CUresult CUDAAPI cuCtxCreate_v3(CUcontext *pctx, CUexecAffinityParam *paramsArray, int numParams,
                                unsigned int flags, CUdevice dev) {
  DRV_BEGIN(cuCtxCreate_v3, DRV_NEED_INIT);
  if (numParams < 0 || (numParams > 0 && !paramsArray))
    return drv_end(drv_misuse(CUDA_ERROR_INVALID_VALUE, "%d affinity parameters at %p", numParams,
                              (void *)paramsArray));
  if (numParams > 0) return drv_end(not_modelled("execution affinity"));
  return drv_end(ctx_create(pctx, flags, dev));
}

/* 12.5's ABI (cuCtxCreate_v4): the parameters may be NULL; given, exactly one of
 * execAffinityParams and cigParams must be set (the header's rule), and neither is modelled. */
CUresult CUDAAPI cuCtxCreate(CUcontext *pctx, CUctxCreateParams *ctxCreateParams,
                             unsigned int flags, CUdevice dev) {
  DRV_BEGIN(cuCtxCreate_v4, DRV_NEED_INIT);
  if (ctxCreateParams) {
    if (!ctxCreateParams->execAffinityParams == !ctxCreateParams->cigParams)
      return drv_end(drv_misuse(CUDA_ERROR_INVALID_VALUE,
                                "exactly one of execAffinityParams and cigParams must be set"));
    return drv_end(
        not_modelled(ctxCreateParams->cigParams ? "a CIG context" : "execution affinity"));
  }
  return drv_end(ctx_create(pctx, flags, dev));
}

/* cuCtxDestroy, for a context the program created (a primary one is released instead: misuse).
 * As on a reset, at once: pending work is abandoned, its streams, events and executable graphs
 * are freed, the cuMemAlloc and page-locked memory allocated in it is unmapped (device memory
 * given back to the capacity), the IPC handles opened in it are unmapped. VMM and stream-ordered
 * memory stay: "These memory allocations are not associated with any CUDA context". Popped when
 * current here; threads that still have it current get CUDA_ERROR_CONTEXT_IS_DESTROYED. */
static CUresult ctx_destroy(CUcontext h) {
  if (!h) return drv_misuse(CUDA_ERROR_INVALID_VALUE, "NULL context");
  struct CUctx_st *c = ctx_lookup(h);
  if (!c || c->destroyed)
    return drv_misuse(CUDA_ERROR_INVALID_CONTEXT, "unknown or destroyed context %p", (void *)h);
  if (!c->created)
    return drv_misuse(CUDA_ERROR_INVALID_CONTEXT,
                      "%p is device %d's primary context: it is released, not destroyed", (void *)h,
                      c->device);
  drv_ctx_drop_objects(c);
  drv_linear_drop_ctx(c);
  drv_ipc_drop_ctx(c);
  c->destroyed = true;
  c->refs = 0;
  D.st.contexts--;
  if (drv_current() == c) tl_depth--;
  return CUDA_SUCCESS;
}

CUresult CUDAAPI cuCtxDestroy(CUcontext ctx) {
  DRV_BEGIN(cuCtxDestroy_v2, DRV_NEED_INIT);
  return drv_end(ctx_destroy(ctx));
}

/* 2.0's ABI: the same argument. */
CUresult CUDAAPI cuCtxDestroy_v1(CUcontext ctx) {
  DRV_BEGIN(cuCtxDestroy, DRV_NEED_INIT);
  return drv_end(ctx_destroy(ctx));
}

/* ---- the thread's context stack --------------------------------------------------------------*/

/* Any live context, primary (retained) or created, may be pushed, several times and on several
 * threads (since 4.0's ABI; the double gives 2.0's the same rule). */
static CUresult ctx_push(CUcontext h) {
  if (!h) return drv_misuse(CUDA_ERROR_INVALID_VALUE, "NULL context");
  struct CUctx_st *c;
  CUresult rc = ctx_arg(h, &c);
  if (rc != CUDA_SUCCESS) return rc;
  if (tl_depth == DRV_CTX_STACK) return stack_full();
  tl_stack[tl_depth++] = c;
  return CUDA_SUCCESS;
}

/* The top goes, whatever became of it (a context destroyed by another thread can be popped),
 * and the one below, if any, is current again. pctx may be NULL. */
static CUresult ctx_pop(CUcontext *pctx) {
  if (tl_depth == 0) return drv_misuse(CUDA_ERROR_INVALID_CONTEXT, "no current context to pop");
  struct CUctx_st *c = tl_stack[--tl_depth];
  if (pctx) *pctx = c;
  return CUDA_SUCCESS;
}

CUresult CUDAAPI cuCtxPushCurrent(CUcontext ctx) {
  DRV_BEGIN(cuCtxPushCurrent_v2, DRV_NEED_INIT);
  return drv_end(ctx_push(ctx));
}

CUresult CUDAAPI cuCtxPushCurrent_v1(CUcontext ctx) {
  DRV_BEGIN(cuCtxPushCurrent, DRV_NEED_INIT);
  return drv_end(ctx_push(ctx));
}

CUresult CUDAAPI cuCtxPopCurrent(CUcontext *pctx) {
  DRV_BEGIN(cuCtxPopCurrent_v2, DRV_NEED_INIT);
  return drv_end(ctx_pop(pctx));
}

CUresult CUDAAPI cuCtxPopCurrent_v1(CUcontext *pctx) {
  DRV_BEGIN(cuCtxPopCurrent, DRV_NEED_INIT);
  return drv_end(ctx_pop(pctx));
}

/* The top of the stack, whatever became of it (real drivers keep answering a destroyed one). */
CUresult CUDAAPI cuCtxGetCurrent(CUcontext *pctx) {
  DRV_BEGIN(cuCtxGetCurrent, DRV_NEED_INIT);
  if (!pctx) return drv_end(drv_misuse(CUDA_ERROR_INVALID_VALUE, "NULL output"));
  *pctx = drv_current();
  return drv_end(CUDA_SUCCESS);
}

/* "If there exists a CUDA context stack on the calling CPU thread, this will replace the top of
 * that stack with ctx. If ctx is NULL then this will be equivalent to popping the top of the
 * calling CPU thread's CUDA context stack (or a no-op if the [...] stack is empty)." An empty
 * stack gets ctx pushed. */
CUresult CUDAAPI cuCtxSetCurrent(CUcontext ctx) {
  DRV_BEGIN(cuCtxSetCurrent, DRV_NEED_INIT);
  struct CUctx_st *c = NULL;
  if (ctx) {
    CUresult rc = ctx_arg(ctx, &c);
    if (rc != CUDA_SUCCESS) return drv_end(rc);
  }
  if (!c) {
    if (tl_depth > 0) tl_depth--;
  } else if (tl_depth > 0) {
    tl_stack[tl_depth - 1] = c;
  } else {
    tl_stack[tl_depth++] = c;
  }
  return drv_end(CUDA_SUCCESS);
}

/* ---- the current context ---------------------------------------------------------------------*/

/* ctx, or the current context when NULL (the 13.0 variants' rule). */
static CUresult ctx_or_current(CUcontext ctx, struct CUctx_st **out) {
  if (ctx) return ctx_arg(ctx, out);
  *out = drv_current();
  return drv_ctx_usable(*out, "current");
}

CUresult CUDAAPI cuCtxGetDevice(CUdevice *device) {
  DRV_BEGIN(cuCtxGetDevice, DRV_NEED_CTX);
  if (!device) return drv_end(drv_misuse(CUDA_ERROR_INVALID_VALUE, "NULL output"));
  *device = drv_current()->device;
  return drv_end(CUDA_SUCCESS);
}

CUresult CUDAAPI cuCtxGetDevice_v2(CUdevice *device, CUcontext ctx) {
  DRV_BEGIN(cuCtxGetDevice_v2, DRV_NEED_INIT);
  if (!device) return drv_end(drv_misuse(CUDA_ERROR_INVALID_VALUE, "NULL output"));
  struct CUctx_st *c;
  CUresult rc = ctx_or_current(ctx, &c);
  if (rc == CUDA_SUCCESS) *device = c->device;
  return drv_end(rc);
}

CUresult CUDAAPI cuCtxSynchronize(void) {
  DRV_BEGIN(cuCtxSynchronize, DRV_NEED_CTX);
  drv_ctx_sync(drv_current());
  return drv_end(CUDA_SUCCESS);
}

CUresult CUDAAPI cuCtxSynchronize_v2(CUcontext ctx) {
  DRV_BEGIN(cuCtxSynchronize_v2, DRV_NEED_INIT);
  struct CUctx_st *c;
  CUresult rc = ctx_or_current(ctx, &c);
  if (rc == CUDA_SUCCESS) drv_ctx_sync(c);
  return drv_end(rc);
}

/* ---- test controls ---------------------------------------------------------------------------*/

void wltest_driver_stats(wltest_driver_stats_t *out) {
  pthread_mutex_lock(&D.lock);
  *out = D.st;
  pthread_mutex_unlock(&D.lock);
}

int wltest_fn_id(const char *fn) {
  if (!fn) return -1;
  size_t n = strlen(fn);
  for (int i = 0; i < WLTEST_FN__COUNT; i++) {
    const char *e = drv_fn_names[i];
    if (strcmp(e, fn) == 0) return i;
    /* The header's spelling of a versioned name: "cuMemGetInfo" for "cuMemGetInfo_v2". */
    if (strncmp(e, fn, n) == 0 && e[n] == '_' && e[n + 1] == 'v' &&
        isdigit((unsigned char)e[n + 2]))
      return i;
  }
  return -1;
}

int wltest_fail_next(const char *fn, CUresult err) {
  int id = wltest_fn_id(fn);
  if (id < 0) return -1;
  pthread_mutex_lock(&D.lock);
  D.fail_next[id] = err;
  pthread_mutex_unlock(&D.lock);
  return 0;
}
