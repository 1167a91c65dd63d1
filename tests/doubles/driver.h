/* The CUDA driver double's internals: one lock, the objects it hands out, call accounting. */
#ifndef WAVELET_TESTS_DOUBLES_DRIVER_H
#define WAVELET_TESTS_DOUBLES_DRIVER_H

/* The library is built with hidden visibility; what the real headers declare is its ABI. */
#pragma GCC visibility push(default)
#include <cuda.h>

#include "wltest_cuda.h"

/* Exported names the header does not declare in the default (legacy-stream) mode: the
 * per-thread-stream twins, and the first versions that the header's macros now rename. The asm
 * labels give the old versions C names of their own. */
CUresult CUDAAPI cuGetProcAddress_v1(const char *symbol, void **pfn, int cudaVersion,
                                     cuuint64_t flags) __asm__("cuGetProcAddress");
CUresult CUDAAPI cuMemGetInfo_v1(unsigned int *free, unsigned int *total) __asm__("cuMemGetInfo");
CUresult CUDAAPI cuMemAlloc_v1(unsigned int *dptr, unsigned int bytesize) __asm__("cuMemAlloc");
CUresult CUDAAPI cuMemFree_v1(unsigned int dptr) __asm__("cuMemFree");
CUresult CUDAAPI cuIpcOpenMemHandle_v1(CUdeviceptr *pdptr, CUipcMemHandle handle,
                                       unsigned int Flags) __asm__("cuIpcOpenMemHandle");
CUresult CUDAAPI cuMemAllocHost_v1(void **pp, unsigned int bytesize) __asm__("cuMemAllocHost");
CUresult CUDAAPI cuDeviceGetUuid_v1(CUuuid *uuid, CUdevice dev) __asm__("cuDeviceGetUuid");
CUresult CUDAAPI cuDevicePrimaryCtxReset_v1(CUdevice dev) __asm__("cuDevicePrimaryCtxReset");
CUresult CUDAAPI cuCtxCreate_v1(CUcontext *pctx, unsigned int flags,
                                CUdevice dev) __asm__("cuCtxCreate");
CUresult CUDAAPI cuCtxCreate_v2(CUcontext *pctx, unsigned int flags, CUdevice dev);
CUresult CUDAAPI cuCtxCreate_v3(CUcontext *pctx, CUexecAffinityParam *paramsArray, int numParams,
                                unsigned int flags, CUdevice dev);
CUresult CUDAAPI cuCtxDestroy_v1(CUcontext ctx) __asm__("cuCtxDestroy");
CUresult CUDAAPI cuCtxPushCurrent_v1(CUcontext ctx) __asm__("cuCtxPushCurrent");
CUresult CUDAAPI cuCtxPopCurrent_v1(CUcontext *pctx) __asm__("cuCtxPopCurrent");
CUresult CUDAAPI cuStreamGetCtx_ptsz(CUstream hStream, CUcontext *pctx);
CUresult CUDAAPI cuStreamGetCtx_v2_ptsz(CUstream hStream, CUcontext *pCtx, CUgreenCtx *pGreenCtx);
CUresult CUDAAPI cuEventElapsedTime_v1(float *ms, CUevent start,
                                       CUevent end) __asm__("cuEventElapsedTime");
CUresult CUDAAPI cuMemAllocAsync_ptsz(CUdeviceptr *dptr, size_t bytesize, CUstream hStream);
CUresult CUDAAPI cuMemFreeAsync_ptsz(CUdeviceptr dptr, CUstream hStream);
CUresult CUDAAPI cuMemAllocFromPoolAsync_ptsz(CUdeviceptr *dptr, size_t bytesize, CUmemoryPool pool,
                                              CUstream hStream);
CUresult CUDAAPI cuLaunchKernel_ptsz(CUfunction f, unsigned int gridDimX, unsigned int gridDimY,
                                     unsigned int gridDimZ, unsigned int blockDimX,
                                     unsigned int blockDimY, unsigned int blockDimZ,
                                     unsigned int sharedMemBytes, CUstream hStream,
                                     void **kernelParams, void **extra);
CUresult CUDAAPI cuLaunchKernelEx_ptsz(const CUlaunchConfig *config, CUfunction f,
                                       void **kernelParams, void **extra);
CUresult CUDAAPI cuLaunchCooperativeKernel_ptsz(CUfunction f, unsigned int gridDimX,
                                                unsigned int gridDimY, unsigned int gridDimZ,
                                                unsigned int blockDimX, unsigned int blockDimY,
                                                unsigned int blockDimZ, unsigned int sharedMemBytes,
                                                CUstream hStream, void **kernelParams);
CUresult CUDAAPI cuGraphLaunch_ptsz(CUgraphExec hGraphExec, CUstream hStream);
CUresult CUDAAPI cuStreamBeginCapture_v1(CUstream hStream) __asm__("cuStreamBeginCapture");
CUresult CUDAAPI cuStreamBeginCapture_ptsz(CUstream hStream);
CUresult CUDAAPI cuStreamBeginCapture_v2_ptsz(CUstream hStream, CUstreamCaptureMode mode);
CUresult CUDAAPI cuStreamEndCapture_ptsz(CUstream hStream, CUgraph *phGraph);
CUresult CUDAAPI cuGraphInstantiate_v1(CUgraphExec *phGraphExec, CUgraph hGraph,
                                       CUgraphNode *phErrorNode, char *logBuffer,
                                       size_t bufferSize) __asm__("cuGraphInstantiate");
CUresult CUDAAPI cuGraphInstantiate_v2(CUgraphExec *phGraphExec, CUgraph hGraph,
                                       CUgraphNode *phErrorNode, char *logBuffer,
                                       size_t bufferSize);
CUresult CUDAAPI
cuGraphExecUpdate_v1(CUgraphExec hGraphExec, CUgraph hGraph, CUgraphNode *hErrorNode_out,
                     CUgraphExecUpdateResult *updateResult_out) __asm__("cuGraphExecUpdate");
CUresult CUDAAPI cuGraphExecKernelNodeSetParams_v1(
    CUgraphExec hGraphExec, CUgraphNode hNode,
    const CUDA_KERNEL_NODE_PARAMS_v1 *nodeParams) __asm__("cuGraphExecKernelNodeSetParams");
CUresult CUDAAPI cuGraphInstantiateWithParams_ptsz(
    CUgraphExec *phGraphExec, CUgraph hGraph, CUDA_GRAPH_INSTANTIATE_PARAMS *instantiateParams);
CUresult CUDAAPI cuGraphAddNode_v1(CUgraphNode *phGraphNode, CUgraph hGraph,
                                   const CUgraphNode *dependencies, size_t numDependencies,
                                   CUgraphNodeParams *nodeParams) __asm__("cuGraphAddNode");
#pragma GCC visibility pop

#include <pthread.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* WLTEST_DEVICE_COUNT's limit; D.ndev devices exist (default 1). */
#define DRV_MAXDEV      WLTEST_MAX_DEVICES
#define DRV_GRANULARITY ((size_t)2 << 20)

/* Magic numbers: a handle is only ever looked up in the lists, never trusted, but a dump of a
 * live object says what it is. */
#define DRV_CTX_MAGIC    0x5754435458000001ull
#define DRV_STREAM_MAGIC 0x5754535452000001ull
#define DRV_EVENT_MAGIC  0x5754455654000001ull
#define DRV_FN_MAGIC     0x575446554e000001ull
#define DRV_MODULE_MAGIC 0x57544d4f44000001ull
#define DRV_GRAPH_MAGIC  0x5754475248000001ull
#define DRV_EXEC_MAGIC   0x5754455845000001ull
#define DRV_NODE_MAGIC   0x57544e4f44000001ull
#define DRV_POOL_MAGIC   0x5754504f4f000001ull

/* A piece of stream work that has not completed: a launch (ns of simulated time), an event
 * record (stamps the event), a wait for another stream's ticket, or a test's hold. */
typedef struct drv_item_s {
  uint64_t ticket;
  uint64_t ns;    /* simulated duration */
  uint64_t t_enq; /* when it was enqueued (CLOCK_MONOTONIC ns) */
  struct CUevent_st *event;
  uint64_t event_gen;
  struct CUstream_st *wait_stream; /* NULL: no wait */
  uint64_t wait_ticket;
  bool hold; /* a test's hold: completes when released */
  struct drv_item_s *next;
} drv_item_t;

/* A stream is a timeline of tickets: work is enqueued (enq) and completes in order (done). Its
 * completion is computed from the clock whenever somebody looks (drv_stream_advance): the head
 * item starts when the one before it completed (or when it was enqueued, or when what it waits
 * for completed) and completes ns later. That is what a per-stream worker thread would do, with
 * exact simulated times and no threads. */
struct CUstream_st {
  uint64_t magic;
  struct CUctx_st *ctx;
  struct CUstream_st *next;
  unsigned flags;
  uint64_t enq, done;
  uint64_t t_done;         /* when the last completed item completed */
  drv_item_t *head, *tail; /* work not yet complete, in order */
  bool zombie;             /* destroyed by the program; freed once its work completes */
  int waiters;             /* threads in drv_stream_wait: a zombie is not freed under them */
  bool per_thread;         /* a thread's per-thread default stream (CU_STREAM_PER_THREAD) */
  pthread_t owner;         /* that thread */
  int capture;             /* CUstreamCaptureStatus */
  uint64_t capture_id;
  int capture_mode;         /* the CUstreamCaptureMode it was begun with */
  pthread_t capture_thread; /* the thread that began it */
  struct CUgraph_st *graph; /* the graph being captured into */
};

struct CUevent_st {
  uint64_t magic;
  struct CUctx_st *ctx;
  struct CUevent_st *next;
  unsigned flags;
  struct CUstream_st *stream; /* where it was last recorded; NULL: never, or work drained */
  uint64_t ticket;
  uint64_t gen;  /* records so far: a stale record item does not stamp */
  uint64_t t_ns; /* when its record completed (valid once complete) */
  bool stamped;
  bool captured; /* last recorded in a capturing stream: not to be queried or waited for */
};

/* A kernel: a CUfunction of a module or a CUkernel of a library (the handles of both point at
 * it; CUDA lets a CUkernel be launched as a CUfunction). */
/* The most parameter bytes cuParamSetSize takes (the classic 4 KiB kernel parameter limit). */
#define DRV_PARAM_MAX 4096

typedef struct drv_fn_s {
  uint64_t magic;
  struct drv_fn_s *next;
  void *owner; /* the module or library */
  uint64_t ns; /* simulated duration of a launch */
  void (*twin)(const wltest_launch_t *);
  const unsigned *argsizes; /* wltest_argsizes_<name>, 0-terminated, or NULL */
  /* The deprecated launch state cuLaunch/cuLaunchGrid[Async] use: cuFuncSetBlockShape,
   * cuFuncSetSharedSize and cuParamSet*. Any other launch of the function invalidates it, as
   * the driver documents (a block of 0 threads then: a legacy launch is refused). */
  unsigned block[3];
  unsigned shared;
  unsigned param_size;
  /* aligned as a kernel parameter buffer is: the twins read pointers and 8-byte values there */
  _Alignas(16) unsigned char params[DRV_PARAM_MAX];
  char name[];
} drv_fn_t;

/* A module (cuModuleLoadData) or a library (cuLibraryLoadData): an image the double does not
 * run, and the kernels looked up in it. */
typedef struct drv_module_s {
  uint64_t magic;
  struct drv_module_s *next;
  const void *image;
  bool library;
} drv_module_t;

/* A graph node: a launch (its arguments copied, when their sizes are known), a child graph
 * (the node's own copy of the graph it was given) or a conditional node (its body graphs, made
 * with it). A CUgraphNode points at one. id pairs the nodes of an executable graph with the
 * nodes they were instantiated from. */
typedef struct drv_node_s {
  uint64_t magic;
  CUgraphNodeType type; /* CU_GRAPH_NODE_TYPE_KERNEL, _GRAPH or _CONDITIONAL */
  uint64_t id;
  drv_fn_t *fn;
  bool as_kernel; /* given as a CUkernel (kern, ctx), not as a CUfunction */
  CUcontext kctx;
  unsigned grid[3], block[3], shared;
  int nargs; /* -1: sizes unknown, the replay runs no twin */
  void **args;
  char *argbuf;
  struct CUgraph_st *child; /* a child graph node's graph */
  /* A conditional node: its kind, handle and body graphs (the array the program was given). */
  CUgraphConditionalNodeType cond_type;
  CUgraphConditionalHandle cond;
  struct CUgraph_st **bodies;
  unsigned nbodies;
} drv_node_t;

/* A graph: its nodes in the order they were added (the double runs a graph in that order; edges
 * are not modelled). Graphs the program made are in D.graphs; a child graph belongs to its
 * node. */
struct CUgraph_st {
  uint64_t magic;
  struct CUgraph_st *next;
  drv_node_t **nodes;
  size_t n, cap;
};

/* An executable graph: the kernel nodes of its graph, child graphs flattened in, and the shape
 * they had ('k' a kernel node, '(' and ')' around a child graph's) for cuGraphExecUpdate. */
struct CUgraphExec_st {
  uint64_t magic;
  struct CUgraphExec_st *next;
  struct CUctx_st *ctx; /* instantiated in it: goes with it (last release, reset) */
  drv_node_t *nodes;
  size_t n;
  char *shape;
};

/* A memory pool: the counters of a stream-ordered allocator. Freed memory stays reserved (the
 * pool's cache) until a synchronisation trims it above the release threshold. */
struct CUmemPoolHandle_st {
  uint64_t magic;
  struct CUmemPoolHandle_st *next;
  int device;
  bool is_default;
  bool destroyed; /* by the program, with allocations outstanding: freed after the last */
  uint64_t threshold;
  uint64_t reserved, used, reserved_high, used_high;
  int reuse[3];                /* follow event dependencies, opportunistic, internal dependencies */
  unsigned access[DRV_MAXDEV]; /* cuMemPoolSetAccess's flags per device (recorded only) */
};

/* A linear allocation: device memory (cuMemAlloc, pools) or page-locked host memory. */
enum { DRV_LINEAR_DEVICE = 1, DRV_LINEAR_POOL = 2, DRV_LINEAR_HOST = 3 };
typedef struct drv_linear_s {
  uintptr_t addr;
  size_t size, charged, mapped; /* asked for; counted against the capacity; mmap length */
  int kind;
  int device;           /* the current context's at allocation, a pool's device */
  struct CUctx_st *ctx; /* DEVICE, HOST: the context current at allocation (its destroy or
                           reset frees it); POOL: NULL, stream-ordered memory has none */
  unsigned host_flags;  /* DRV_LINEAR_HOST: the flags it was allocated with */
  struct CUmemPoolHandle_st *pool;
  /* Since its first cuIpcGetMemHandle, a cuMemAlloc allocation lives in a memfd (mapped shared
   * at the same address) that other processes open through /proc; gen tells its handle apart
   * from those of allocations that had the same address before. */
  bool ipc;
  int ipc_fd;
  uint64_t ipc_gen;
  struct drv_linear_s *next; /* hash chain */
} drv_linear_t;

/* A CUDA IPC handle opened by this process (cuIpcOpenMemHandle): the exporter's memfd mapped at
 * addr, until the last cuIpcCloseMemHandle. */
typedef struct drv_ipc_open_s {
  CUipcMemHandle handle;
  uintptr_t addr;
  size_t size, mapped;  /* the exporter's size; the mapping's length */
  int device;           /* the current context's when opened */
  struct CUctx_st *ctx; /* that context: its destroy or reset unmaps it */
  uint64_t refs;
  struct drv_ipc_open_s *next;
} drv_ipc_open_t;

#define DRV_LINEAR_BUCKETS 4096

/* A context: a device's primary context, or one the program created (cuCtxCreate). A primary
 * context's handle stays the same for the life of the process, as the real driver's does; it is
 * usable while retained (refs > 0). A created one starts with refs 1 and is usable until
 * cuCtxDestroy; then it stays, destroyed, in D.created (never freed, never handed out again), so
 * that threads that still have it current find it destroyed and its handle stays recognisable. */
struct CUctx_st {
  uint64_t magic;
  int device;
  uint64_t refs;
  bool created;                   /* made by cuCtxCreate: not a primary context */
  bool destroyed;                 /* a created context after cuCtxDestroy */
  unsigned peers;                 /* devices whose memory it may access (cuCtxEnablePeerAccess) */
  struct CUctx_st *next;          /* D.created */
  struct CUstream_st null_stream; /* the legacy default stream (also stands for per-thread) */
};

typedef struct drv_reservation_s {
  uintptr_t base;
  size_t size;
  struct drv_reservation_s *next;
} drv_reservation_t;

typedef struct drv_phys_s {
  CUmemGenericAllocationHandle id;
  size_t size;
  int fd; /* memfd: the "device memory" */
  int device;
  unsigned types; /* CUmemAllocationHandleType bits it may be exported as */
  bool imported;  /* cuMemImportFromShareableHandle: another allocation's memory, not charged */
  bool released;  /* no handle reference left (refs 0): freed at its last unmap */
  uint64_t
      refs; /* handle references: cuMemCreate or the import, each cuMemRetainAllocationHandle */
  uint64_t maps; /* live mappings of it */
  struct drv_phys_s *next;
} drv_phys_t;

typedef struct drv_mapping_s {
  uintptr_t addr;
  size_t size;
  drv_phys_t *phys;
  unsigned prot; /* CU_MEM_ACCESS_FLAGS_PROT_*: the widest of access[] (one host protection) */
  unsigned access[DRV_MAXDEV]; /* what cuMemSetAccess granted each device */
  struct drv_mapping_s *next;
} drv_mapping_t;

typedef struct drv_s {
  pthread_mutex_t lock;
  bool initialized;
  const char *fn;          /* the call in progress (under the lock), for messages */
  int ndev;                /* WLTEST_DEVICE_COUNT, read at cuInit */
  size_t capacity;         /* each device's (WLTEST_DEVICE_MEM) */
  size_t used[DRV_MAXDEV]; /* this process's bytes on each device */
  struct CUctx_st *primary[DRV_MAXDEV];
  struct CUctx_st *created; /* cuCtxCreate's contexts, destroyed ones included */
  drv_reservation_t *reservations;
  drv_phys_t *phys;
  drv_mapping_t *mappings;
  struct CUstream_st *streams;
  struct CUevent_st *events;
  struct CUstream_st *zombies; /* destroyed streams whose work has not completed */
  drv_fn_t *fns;
  drv_module_t *modules;
  struct CUgraph_st *graphs;
  struct CUgraphExec_st *execs;
  struct CUmemPoolHandle_st *pools;
  struct CUmemPoolHandle_st *current_pool[DRV_MAXDEV]; /* cuDeviceSetMemPool's; NULL: default */
  drv_linear_t *linear[DRV_LINEAR_BUCKETS];
  uint64_t kernel_ns; /* WLTEST_KERNEL_NS */
  bool unsafe_vmm;    /* WLTEST_CAPTURE_UNSAFE=vmm */
  bool no_posix_fd;   /* WLTEST_NO_POSIX_FD=1: no POSIX file descriptor handles */
  size_t pitch_align; /* WLTEST_PITCH_ALIGN: cuMemAllocPitch's row alignment (default 512) */
  uint64_t next_ipc_gen;
  drv_ipc_open_t *ipc_opens;
  uint64_t next_capture_id;
  uint64_t next_node_id;
  pthread_cond_t progress; /* broadcast when work is enqueued or a hold released */
  CUmemGenericAllocationHandle next_handle;
  CUresult fail_next[WLTEST_FN__COUNT];
  /* WLTEST_DRV_FAIL: every call after the first fail_skip ones returns fail_always. */
  CUresult fail_always[WLTEST_FN__COUNT];
  unsigned long fail_skip[WLTEST_FN__COUNT];
  wltest_driver_stats_t st; /* counters kept as they change; copied out by wltest_driver_stats */
} drv_t;

extern drv_t drv__state;

/* The variant's function at an address no exported symbol names, NULL when it has none
 * (driver_linear.c: cuMemGetInfo_v2 only). */
void *drv_private_twin(const char *variant);

/* ---- call discipline (driver_core.c) ---------------------------------------------------------*/
enum {
  DRV_NEED_NONE = 0, /* works before cuInit */
  DRV_NEED_INIT = 1,
  DRV_NEED_CTX = 2 /* needs a current, retained context */
};

/* Takes the lock, counts the call, then returns an injected failure or the error for a broken
 * precondition (lock released) or CUDA_SUCCESS (lock held until drv_end). */
CUresult drv_begin(wltest_fn_t fn, const char *name, int need);
/* Releases the lock and returns rc. */
CUresult drv_end(CUresult rc);
/* Counts a misuse of the call in progress, prints it, and returns err. Under the lock. */
CUresult drv_misuse(CUresult err, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

#define DRV_BEGIN(fn, need)                                                                        \
  do {                                                                                             \
    CUresult begin_rc_ = drv_begin(WLTEST_FN_##fn, #fn, (need));                                   \
    if (begin_rc_ != CUDA_SUCCESS) return begin_rc_;                                               \
  } while (0)

/* The calling thread's current context: the top of its context stack, or NULL (usable under
 * the lock after DRV_NEED_CTX). */
struct CUctx_st *drv_current(void);
/* The context behind a CUcontext handle (a primary one, retained or not, or a created one not
 * destroyed), or NULL. */
struct CUctx_st *drv_ctx_find(CUcontext c);
/* Why a context cannot be used (counted as misuse), or CUDA_SUCCESS: none (what, for the message,
 * names it), released, destroyed. */
CUresult drv_ctx_usable(struct CUctx_st *c, const char *what);
bool drv_device_valid(int dev);

/* ---- streams (driver_stream.c) ---------------------------------------------------------------*/
/* The stream behind a handle (see drv_stream_get), or NULL. */
struct CUstream_st *drv_stream_find(struct CUctx_st *ctx, CUstream s);
/* Frees the streams, events and executable graphs of a context whose last retain was released,
 * that is reset or destroyed. Pending work is abandoned: threads waiting on it wake to find it
 * complete, and a stream they wait on is freed by the last of them. */
void drv_ctx_drop_objects(struct CUctx_st *ctx);
/* Now, on the simulated timeline (CLOCK_MONOTONIC, ns). */
uint64_t drv_now(void);
/* Appends work to a stream (under the lock): ns of simulated time, an event to stamp, a wait for
 * another stream's ticket. False without memory (the caller returns
 * CUDA_ERROR_OUT_OF_MEMORY). */
bool drv_enqueue(struct CUstream_st *s, uint64_t ns, struct CUevent_st *e,
                 struct CUstream_st *wait_stream, uint64_t wait_ticket);
/* Completes what the clock says is complete. */
void drv_stream_advance(struct CUstream_st *s, uint64_t now);
/* Waits (lock released while waiting) until the stream's done reaches ticket. */
void drv_stream_wait(struct CUstream_st *s, uint64_t ticket);
/* Synchronises every stream of a context, then trims the pools (a synchronisation point). */
void drv_ctx_sync(struct CUctx_st *ctx);
/* The stream a call works on: CUDA_ERROR_INVALID_HANDLE (a misuse) for an unknown one. NULL and
 * CU_STREAM_LEGACY are the context's legacy default stream, CU_STREAM_PER_THREAD the calling
 * thread's own default stream in the context (the ptsz entry points map NULL to it). */
CUresult drv_stream_get(CUstream h, struct CUstream_st **out);
/* A capturing stream refuses work it cannot capture: invalidates the capture and returns
 * CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED; CUDA_SUCCESS when not capturing. */
CUresult drv_capture_refuse(struct CUstream_st *s);
/* A call CUDA calls potentially unsafe during capture (cuMemAlloc, cuMemFree: DRV_UNSAFE_ALWAYS),
 * or one counted so only under WLTEST_CAPTURE_UNSAFE=vmm (the VMM calls, cuEventCreate and
 * cuEventDestroy: DRV_UNSAFE_VMM), under the calling thread's capture interaction mode
 * (cuThreadExchangeStreamCaptureMode's rule): when captures prohibit it, they are invalidated and
 * CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED returned (a misuse); CUDA_SUCCESS otherwise. */
enum { DRV_UNSAFE_ALWAYS = 0, DRV_UNSAFE_VMM = 1 };
CUresult drv_capture_unsafe(int kind);

/* In an entry point, after DRV_BEGIN: returns the refusal when captures prohibit the call. */
#define DRV_UNSAFE(kind)                                                                           \
  do {                                                                                             \
    CUresult unsafe_rc_ = drv_capture_unsafe(kind);                                                \
    if (unsafe_rc_ != CUDA_SUCCESS) return drv_end(unsafe_rc_);                                    \
  } while (0)

/* Adds a launch to the graph a stream is capturing into. */
CUresult drv_capture_launch(struct CUstream_st *s, drv_fn_t *fn, const unsigned grid[3],
                            const unsigned block[3], unsigned shared, void **args);

/* ---- graphs (driver_graph.c) -----------------------------------------------------------------*/
/* An empty graph (the last one destroyed, if any: a driver may hand an address out again), not
 * yet in D.graphs; NULL without memory. */
struct CUgraph_st *drv_graph_new(void);
/* Frees a graph that is in no list, its nodes and child graphs. */
void drv_graph_free(struct CUgraph_st *g);
/* Frees the executable graphs instantiated in ctx (counted in dropped). */
void drv_graph_execs_drop(struct CUctx_st *ctx);

/* ---- VMM (driver_mem.c) ----------------------------------------------------------------------*/
/* True when fd is a memfd the double made under that name (by /proc/self/fd). */
bool drv_fd_is_memfd(int fd, const char *name);

/* ---- device memory (driver_device.c) ---------------------------------------------------------*/
/* Joins the shared device named by WLTEST_DEVICE_SHM, if any (at cuInit). */
void drv_device_init(void);
/* In a forked child: leaves the shared device to the parent (the child's view is private). */
void drv_device_forked(void);
/* Charges bytes against device dev's capacity: false when they do not fit (out of memory). */
bool drv_charge(int dev, size_t bytes);
void drv_uncharge(int dev, size_t bytes);
/* Device dev's memory in use: this process's, or every live process's on a shared device. */
size_t drv_device_used(int dev);

/* ---- memory (driver_linear.c) ----------------------------------------------------------------*/
/* The linear allocation (device, pool or host) that starts at addr, or NULL. */
drv_linear_t *drv_linear_find(uintptr_t addr);
/* The allocation holding addr (its start or inside it), or NULL. */
drv_linear_t *drv_linear_containing(uintptr_t addr);
/* Pools above their release threshold give back their cache (at synchronisation points). */
void drv_pools_trim(void);
/* A primary context's reset or a created context's destroy: frees the cuMemAlloc and
 * page-locked host memory allocated in ctx (not stream-ordered memory, which belongs to no
 * context). */
void drv_linear_drop_ctx(struct CUctx_st *ctx);

/* ---- CUDA IPC (driver_ipc.c) -----------------------------------------------------------------*/
/* A primary context's reset or a created context's destroy: unmaps the IPC handles opened in
 * ctx. */
void drv_ipc_drop_ctx(struct CUctx_st *ctx);

/* ---- pointer attributes (driver_pointer.c, from each kind of memory's owner) -----------------*/
/* The allocation an address lies in, as cuPointerGetAttribute describes it. */
typedef struct drv_ptr_s {
  int device;
  struct CUctx_st *ctx; /* the owning context; NULL for VMM and stream-ordered memory */
  bool host;            /* page-locked host memory; else device memory */
  uintptr_t start;
  size_t size;
  struct CUmemPoolHandle_st *pool; /* a stream-ordered allocation's pool */
} drv_ptr_t;
/* True, *out filled, when p lies in linear memory (driver_linear.c), an opened IPC handle
 * (driver_ipc.c) or a VMM mapping (driver_mem.c). Under the lock. */
bool drv_linear_ptr(uintptr_t p, drv_ptr_t *out);
bool drv_ipc_ptr(uintptr_t p, drv_ptr_t *out);
bool drv_vmm_ptr(uintptr_t p, drv_ptr_t *out);

/* ---- launches (driver_launch.c) --------------------------------------------------------------*/
/* WLTEST_KERNEL_NS, read at cuInit (default 10 us). */
uint64_t drv_kernel_ns_default(void);
/* The kernel behind a CUfunction or CUkernel handle, or NULL. */
drv_fn_t *drv_fn_find(const void *h);
/* Runs a launch's host twin (if any) and enqueues its simulated duration. Under the lock. */
CUresult drv_launch_enqueue(drv_fn_t *fn, const unsigned grid[3], const unsigned block[3],
                            unsigned shared, struct CUstream_st *s, void **args);

#endif
