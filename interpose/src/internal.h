/* libwavelet.so's internals: the hook tables, the process state, options, accounting, serving
 * and gating, shared by the files of interpose/src. */
#ifndef WAVELET_INTERPOSE_INTERNAL_H
#define WAVELET_INTERPOSE_INTERNAL_H

#include <cuda.h>
#include <pthread.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include <wavelet/alloc.h>
#include <wavelet/sched.h>
#include <wavelet/trace.h>

#include "log.h"
#include "util.h"

/* Code that may run before a sanitizer runtime has started (the dlsym entry). */
#define WL_NO_SANITIZE __attribute__((no_sanitize("address", "undefined", "thread")))

/* dlsym of a cu[A-Z]* name: the real answer, mapped to our wrapper when it is a hooked one. */
void *wl__dlsym_driver(void *handle, const char *name);

/* A hooked entry point: exported under its exact (versioned) name. */
#define WL_HOOK __attribute__((visibility("default"), used))

#include "hooks.h"

/* Resolves one real entry point (NULL when there is none). Safe from any thread, at any time,
 * during init too; it never calls a hooked function. */
void *wl__real_slow(wl__hook_id_t id);

static inline void *wl__real(wl__hook_id_t id) {
  void *p = __atomic_load_n(&wl__real_fn[id], __ATOMIC_ACQUIRE);
  return WL_LIKELY(p != NULL) ? p : wl__real_slow(id);
}

/* The wrapper whose real target is p, or p itself: how dlsym and cuGetProcAddress answers are
 * mapped, so each caller gets a wrapper of exactly the ABI it asked for. */
void *wl__wrap_ptr(void *p);
/* The same for an entry point the driver handed out for the name sym (cuGetProcAddress,
 * cudaGetDriverEntryPoint), counted; says once per entry point when the driver answered the name
 * of one we hook with a pointer that is no exported symbol (then its calls are not seen). */
void *wl__wrap_entry(const char *sym, void *p);

/* A real driver entry point by its exported name (our hooks' reals included), NULL if none. */
void *wl__real_by_name(const char *name);

/* The same for a runtime entry point we do not hook (NULL if none). */
void *wl__real_rt_by_name(const char *name);

/* The real dlsym (from dlvsym); never NULL after wl__real_dlsym_init. */
typedef void *(*wl__dlsym_fn)(void *, const char *);
extern wl__dlsym_fn wl__real_dlsym;
void wl__real_dlsym_init(void);

/* ---- options ---------------------------------------------------------------------------------*/
typedef enum wl__mode_e {
  WL__MODE_OFF = 0,
  WL__MODE_TRACE = 1,
  WL__MODE_ALLOC = 2,
  WL__MODE_GATE = 3
} wl__mode_t;

typedef struct wl__opts_s {
  int mode;
  char trace[4096]; /* "" : no trace */
  int log_level;
  bool show_stats;
  /* WAVELET_ALLOC_TCACHE: liballoc's per-thread cache, bytes per thread; 0: off. */
  size_t alloc_tcache;
  bool alloc_tcache_set; /* given: otherwise liballoc's default */
  /* WAVELET_GROUP, ROLE, WAVES, MEM_LIMIT, ALLOC_TIMEOUT_MS, GATE_TIMEOUT_MS: libsched's
   * parser (the same table rules), device_memory filled in when the allocator starts. */
  wl_sched_config_t sched;
} wl__opts_t;

extern wl__opts_t wl__opts;

/* Reads every WAVELET_* variable once; bad values are warned about and ignored. */
void wl__opts_load(void);
void wl__opts_print(void);
const char *wl__mode_name(int mode);

/* ---- state -----------------------------------------------------------------------------------*/

/* Per thread: nesting of our own hooks (a runtime hook reaching a driver hook), NCCL regions,
 * and "inside init". Initial-exec TLS: a few bytes, read on every hooked call. */
typedef struct wl__tls_s {
  int depth;
  int nccl;
  int in_init;
  uint32_t tid;
} wl__tls_t;
extern __thread wl__tls_t wl__tls __attribute__((tls_model("initial-exec")));

/* The mode once initialised, -1 before. */
extern int wl__mode_now;
/* Set first thing at exit: the gate and the group are left alone from then on (slow paths only;
 * threads still running keep passing calls through to the driver). */
extern int wl__exiting;
int wl__init_slow(void);

/* The mode for this call, initialising on first use; OFF while initialising. */
static inline int wl__mode(void) {
  int m = __atomic_load_n(&wl__mode_now, __ATOMIC_ACQUIRE);
  return WL_LIKELY(m >= 0) ? m : wl__init_slow();
}

/* Entered by a hook that will call into the real library and must not be counted again by a
 * hook the real library reaches (cudart -> cuMemAlloc through our cuGetProcAddress answer). */
#define WL_NEST_BEGIN() (wl__tls.depth++)
#define WL_NEST_END()   (wl__tls.depth--)

uint32_t wl__tid_slow(void);
static inline uint32_t wl__tid(void) {
  uint32_t t = wl__tls.tid;
  return WL_LIKELY(t) ? t : wl__tid_slow();
}

/* ---- stats -----------------------------------------------------------------------------------*/
typedef enum wl__stat_e {
  WL__ST_ALLOCS,
  WL__ST_FREES,
  WL__ST_UNTRACKED_FREES,
  WL__ST_SERVED,
  WL__ST_SERVED_FREES,
  WL__ST_OOMS,
  WL__ST_HOST_ALLOCS,
  WL__ST_HOST_FREES,
  WL__ST_VMM_CREATES,
  WL__ST_VMM_RELEASES,
  WL__ST_LAUNCHES,
  WL__ST_GRAPH_LAUNCHES,
  WL__ST_GATE_ENTERS,
  WL__ST_GATE_WAIT_NS,
  WL__ST_GATE_RELEASES,
  WL__ST_GATE_SKIPPED_NCCL,
  WL__ST_GATE_SKIPPED_CAPTURE,
  WL__ST_BUDGET_WAITS,
  WL__ST_BUDGET_WAIT_NS,
  WL__ST_NCCL_GRAPHS,
  WL__ST_NCCL_EXECS,
  WL__ST_NCCL_GRAPHS_FOUND,
  WL__ST_NCCL_EXEC_UPDATES,
  WL__ST_PROCADDR,
  WL__ST_PROCADDR_UNSEEN,
  WL__ST_DLSYM,
  WL__ST_PASSTHROUGH,
  WL__ST_IPC_EXPORTS,
  WL__ST_IPC_OPENS,
  WL__ST_RESETS,
  WL__ST_CTX_DESTROYS,
  WL__ST_COUNT
} wl__stat_t;

/* Per-thread counters: a block per thread, never freed (threads may exit before the report). */
typedef struct wl__stats_s {
  uint64_t v[WL__ST_COUNT];
} wl__stats_t;
extern __thread wl__stats_t *wl__st __attribute__((tls_model("initial-exec")));
wl__stats_t *wl__stats_slow(void);
static inline void wl__count(wl__stat_t k, uint64_t n) {
  wl__stats_t *s = wl__st;
  if (WL_UNLIKELY(!s)) s = wl__stats_slow();
  /* Only this thread writes its block; the report reads it relaxed. */
  __atomic_store_n(&s->v[k], s->v[k] + n, __ATOMIC_RELAXED);
}
void wl__stats_sum(uint64_t out[WL__ST_COUNT]);
void wl__stats_report(void);

/* ---- accounting: pointer -> (size, kind), a sharded open-addressing hash map -----------------*/
typedef enum wl__kind_e {
  WL__K_DEVICE = 1, /* cuMemAlloc, cudaMalloc */
  WL__K_ASYNC,      /* stream-ordered: cuMemAllocAsync, from a pool */
  WL__K_MANAGED,
  WL__K_PITCH,
  WL__K_HOST,     /* pinned host memory */
  WL__K_VMM,      /* a cuMemCreate handle (the handle map) */
  WL__K_SERVED,   /* ours: liballoc (only counted, the allocator knows its blocks) */
  WL__K_MAPPING,  /* a cuMemMap range (the mapping map) */
  WL__K_IMPORTED, /* the same, of a handle imported from another process (its memory) */
  WL__K_COUNT
} wl__kind_t;

typedef struct wl__map_s wl__map_t;
extern wl__map_t *const wl__ptrs;     /* device and host pointers */
extern wl__map_t *const wl__handles;  /* cuMemCreate handles */
extern wl__map_t *const wl__mappings; /* cuMemMap ranges by address */
extern wl__map_t *const wl__mapped;   /* the handle each of those maps (in the size field) */

/* 0, or -ENOMEM (not recorded). An existing entry for key is replaced (a free we missed). */
int wl__map_put(wl__map_t *m, uintptr_t key, uint64_t size, unsigned kind);
/* Removes key: 0 with its size and kind, or -ENOENT. */
int wl__map_take(wl__map_t *m, uintptr_t key, uint64_t *size, unsigned *kind);
/* Adds delta to the references counted in key's kind (bits from WL__VMM_REF up), under its
 * shard's lock: the count left, with the entry's size and kind; 0 when none is left, the entry
 * then taken out; -ENOENT when key has no entry. */
int wl__map_ref(wl__map_t *m, uintptr_t key, int delta, uint64_t *size, unsigned *kind);
/* Sets bits in key's kind (when it has an entry). */
void wl__map_mark(wl__map_t *m, uintptr_t key, unsigned bits);
/* After fork: the child forgets the maps (their locks may have been held, their tables half
 * updated, by threads that do not exist there). */
void wl__map_fork_child(void);
/* Live bytes and entries by kind (relaxed sums). */
void wl__map_live(uint64_t bytes[WL__K_COUNT], uint64_t peak[WL__K_COUNT]);

/* Records an allocation (map, counters, trace, phase events). */
void wl__track_alloc(uintptr_t p, uint64_t size, unsigned kind, void *stream);

/* A free in two steps around the real call. wl__free_begin: 1 when p was served by liballoc
 * and is now freed (return success), -EINVAL when p lies in served memory but is no live block
 * (return the invalid-value error), else 0 with *fi saying whether p was tracked. sync: a
 * synchronous free (cuMemFree, cudaFree), stream NULL. */
typedef struct wl__freeinfo_s {
  uint64_t size;
  unsigned kind;
  bool tracked;
} wl__freeinfo_t;
int wl__free_begin(uintptr_t p, void *stream, bool sync, wl__freeinfo_t *fi);
/* The same for a page-locked host free (cuMemFreeHost, cudaFreeHost): never frees served device
 * memory, and takes only a host entry. */
void wl__free_begin_host(uintptr_t p, wl__freeinfo_t *fi);
/* After the real free: accounts it when ok, puts the entry back when the free failed. */
void wl__free_end(uintptr_t p, void *stream, const wl__freeinfo_t *fi, bool ok);

/* ---- trace ----------------------------------------------------------------------------------*/
extern wl_trace_writer_t *wl__trace;
static inline wl_trace_writer_t *wl__tracer(void) {
  return __atomic_load_n(&wl__trace, __ATOMIC_ACQUIRE);
}
void wl__trace_ev(uint16_t kind, uint16_t aux, uint64_t addr, uint64_t size, uint64_t arg);
int wl__trace_open(void);
void wl__trace_close(void);

/* ---- alloc mode: liballoc over the VMM provider, with the group budget ----------------------*/
/* Serves size bytes on stream. 1: served (*out set), 0: not ours to serve (pass through), or
 * a negative errno: refused (out of memory: the caller returns the CUDA OOM code). */
int wl__serve_alloc(size_t size, void *stream, bool sync, uintptr_t *out);
/* In a served block's kind (pointer map): allocated by a synchronous call (a device reset frees
 * it). The allocator's table index is kept in bits 8-15. */
#define WL__SERVED_SYNC 0x10000u
/* Frees p in stream order when it lies in memory liballoc serves: 1 freed, -EINVAL not a live
 * block there (the caller returns the driver's invalid-value error), 2 a live block liballoc
 * refused for its stream (the caller passes the call through: the driver answers for the
 * stream, and the block stays allocated), 0 not ours. */
int wl__serve_free(uintptr_t p, void *stream, bool sync);
/* Before the program destroys stream: liballoc forgets it (blocks freed on it become reusable
 * when its work is done, and a new stream at its address is a new stream). */
void wl__serve_stream_destroy(void *stream);
/* Replaces the driver's free/total with the budget's view (alloc and gate modes). */
void wl__serve_meminfo(size_t *free_b, size_t *total_b);
/* Gives back every mapped chunk no block uses (their stream work done): before waiting at the
 * gate, so the member rising now can have the memory. */
void wl__serve_trim(void);
/* Live and peak bytes of the served blocks (liballoc's counts, summed over devices). */
void wl__serve_live(uint64_t *live, uint64_t *peak);
/* The group member (NULL when none). */
extern wl_sched_t *wl__member;
void wl__serve_at_exit(void);
/* Prints each group's stats (the gate's first). */
void wl__serve_report(void (*out)(void *, const char *), void *arg);
/* The groups joined (one per GPU served), in the order of their names: the order every process
 * takes their gates in, so that processes spanning GPUs never wait for each other in a circle.
 * How many were written to out (at most cap). */
int wl__serve_groups(wl_sched_t **out, int cap);
void wl__serve_fork_child(void);

/* 1 when p lies in memory liballoc serves (its reservations; no lookup of the block). */
int wl__serve_owns(uintptr_t p);
/* The allocator whose reservations hold p, or NULL. */
wl_alloc_t *wl__serve_alloc_of(uintptr_t p);
/* The driver's entry points for a VMM provider of ours (capture.c's relaxed ones included). */
void *wl__serve_resolve(void *arg, const char *name);
/* The device of the calling thread's current context (*ctx_out, when not NULL: the context), or
 * -1 when there is none (the driver answers then, with its own error). */
int wl__current_device(CUcontext *ctx_out);
/* Device's primary context: 1 active (*primary its handle), 0 inactive (it holds nothing), -1
 * the driver cannot say. */
int wl__primary_of(int device, CUcontext *primary);
/* Whether ctx is device's primary context (the driver's answer; true when it cannot say). */
bool wl__is_primary(CUcontext ctx, int device);
/* Makes device's primary context current on the calling thread (retained meanwhile), for making
 * what must outlive the program's own contexts: 0, or a negative errno (nothing changed).
 * wl__primary_leave puts *prev back and releases it. */
int wl__primary_enter(int device, CUcontext *prev);
void wl__primary_leave(int device, CUcontext prev);
/* The device whose primary context is current on the calling thread, -1 when none is (no
 * context, or one the program created). Cached per thread: a driver call when nothing changed. */
int wl__current_primary(void);
/* Whether an allocation from pool (cuMemAllocFromPoolAsync) is served: only from the current
 * device's default pool. */
bool wl__serve_pool(void *pool, void *stream);
/* After the program's cuDeviceSetMemPool; whether cuMemAllocAsync is served (false while the
 * device's current pool is one the program set). */
void wl__serve_set_pool(int device, void *pool);
/* In a passed-through device allocation's kind (pointer map): booked in the group of the device
 * in bits 8-15 (an allocation that liballoc did not serve: under a context the program created,
 * from a pool of the program's, on a device whose VMM the driver refused, or pitched). */
#define WL__PASS_BOOKED 0x100000u
/* Before a device allocation (call, the hook's name) passes through in alloc and gate modes: it
 * is booked first, so the group's budget holds all of its device memory (not during a stream
 * capture: a graph's memory is made at its launch). A stream-ordered one on a stream the
 * program made is its stream's context's (NULL for the others). The kind bits to record (0:
 * nothing booked), or -ENOMEM (refused: the caller returns the out-of-memory error). */
int wl__serve_book_pass(size_t size, const char *call, void *stream);
/* After a pool allocation of the program's passed through and succeeded: booked in the group of
 * the device the memory landed on (the pool decides: another device's, or host memory for a host
 * pool, which is not booked), not during a capture. The kind bits to record (0: nothing booked),
 * or -ENOMEM (refused: the caller frees it and returns the out-of-memory error). */
int wl__serve_book_placed(uintptr_t ptr, size_t size, const char *call);
/* A booked allocation freed (kind as recorded), or never made. */
void wl__serve_unbook_kind(unsigned kind, size_t size);
/* Peer access (cuCtxEnablePeerAccess, cuMemPoolSetAccess on a default pool): peer's kernels may
 * reach owner's served memory, mapped now or later. */
void wl__serve_grant(int owner, int peer);
void wl__serve_pool_access(void *pool, const CUmemAccessDesc *map, size_t count);
/* The device of ctx, -1 when the driver does not know it. */
int wl__context_device(CUcontext ctx);
bool wl__serve_current_pool(void);
/* Before a context the program created is destroyed: the per-thread answers are looked at
 * again. */
void wl__serve_ctx_destroy(CUcontext ctx);
/* The table index serving device, -1 when none (for the reset's sweep of gate-mode entries). */
int wl__serve_index(int device);
/* Before device's reset, after the accounting's sweep freed the synchronous allocations' blocks:
 * the allocator's streams and events are abandoned (wl_alloc_abandon_streams); stream-ordered
 * blocks live on, as the driver's own do. */
void wl__serve_reset(int device);

/* ---- the program's own VMM memory (vmm.c) ----------------------------------------------------
 * A cuMemCreate handle's kind in wl__handles: WL__K_VMM, its device in bits 8-15, WL__VMM_BOOKED
 * when its bytes are booked in that device's group (alloc and gate modes), WL__VMM_MAPPED once
 * it was mapped, and its references from WL__VMM_REF up: the handle's own, each
 * cuMemRetainAllocationHandle, each mapping. The driver frees the memory when the last goes, and
 * so is the booking given back. A handle imported from another process (WL__VMM_IMPORTED, size
 * 0) counts its references too, but its memory is the exporter's: its mappings are kept as
 * WL__K_IMPORTED, out of the trace's physical memory, and nothing is booked or given back. */
#define WL__VMM_BOOKED   0x10000u
#define WL__VMM_MAPPED   0x20000u
#define WL__VMM_IMPORTED 0x40000u
#define WL__VMM_REF      0x80000u
/* Before the real cuMemCreate of device memory on device, or another allocation that passes
 * through (alloc and gate modes; call names it in the out-of-memory line): booked in its group
 * first. 0 booked, 1 nothing to book in (no group), -ENOMEM refused after the wait. */
int wl__serve_book(int device, size_t bytes, const char *call);
void wl__serve_unbook(int device, size_t bytes);
/* After a real cuMemCreate made h (device memory on device), and a real
 * cuMemImportFromShareableHandle gave h. */
void wl__vmm_created(uintptr_t h, size_t size, int device, bool booked);
void wl__vmm_imported(uintptr_t h);
/* Around a real cuMemRelease or cuMemUnmap (any mode but off): _begin drops the references the
 * call ends (before it: once the driver frees, a new handle may get the same value), _end settles
 * them (ok: the driver did; else they are put back) and frees what _begin took. An unmap may end
 * any number of mappings: the first few in the op, more on the heap. */
#define WL__VMM_OP_INLINE 8
typedef struct wl__vmm_ref_s {
  uintptr_t h;   /* the handle */
  int left;      /* its references left after this one, 0: none (entry taken out), -1: unknown */
  uint64_t size; /* the handle's size and kind */
  unsigned kind;
  uintptr_t map; /* unmap: the mapping's address, size and kind */
  uint64_t msize;
  unsigned mkind;
} wl__vmm_ref_t;
typedef struct wl__vmm_op_s {
  int n, cap;
  wl__vmm_ref_t *r; /* inl, or the heap's */
  wl__vmm_ref_t inl[WL__VMM_OP_INLINE];
} wl__vmm_op_t;
void wl__vmm_release_begin(uintptr_t h, wl__vmm_op_t *op);
void wl__vmm_unmap_begin(uintptr_t ptr, size_t size, wl__vmm_op_t *op);
void wl__vmm_end(wl__vmm_op_t *op, bool ok);
/* After a real cuMemMap of h at ptr, and a real cuMemRetainAllocationHandle giving h. */
void wl__vmm_mapped(uintptr_t ptr, size_t size, uintptr_t h);
void wl__vmm_retained(uintptr_t h);

/* ---- device reset (reset.c) ------------------------------------------------------------------*/
/* Before the real cudaDeviceReset/cuDevicePrimaryCtxReset of device (any mode but off): what
 * the driver is about to destroy goes first (see reset.c). */
void wl__device_reset(int device);
/* Before the real cuCtxDestroy of a context the program created (any mode but off): what the
 * driver is about to destroy goes first (see reset.c). */
void wl__context_destroy(CUcontext ctx);
/* The accounting's part: the device's allocations a reset destroys (synchronous, managed and
 * pinned host memory; not stream-ordered ones) taken out as freed, served ones through
 * wl__serve_free. */
void wl__account_reset(int device, CUcontext primary);
/* The same for a context the program created: its allocations (none is served). */
void wl__account_ctx_destroy(CUcontext ctx);
/* gate.c's part: the pending peak waited for, its event destroyed. */
void wl__gate_reset(void);
/* The same when the peak's event belongs to ctx, which is being destroyed. */
void wl__gate_ctx_destroy(CUcontext ctx);
/* pinned_glue.c's part: the arena's chunks of device go (with the arena when all are). */
void wl__pinned_reset(int device);

/* ---- CUDA IPC of served memory (ipc.c) -------------------------------------------------------*/
/* Exports alive; while nonzero, a served free calls wl__ipc_forget. */
extern int wl__ipc_nexports;
/* A handle of ours for the live served allocation at p (the same one again for the same
 * allocation): 0, or a negative errno (-EINVAL: not the start of one, -ENOTSUP: its memory
 * cannot be shared). */
int wl__ipc_export(wl_alloc_t *a, uintptr_t p, CUipcMemHandle *out);
/* p is being freed: its export, if any, is forgotten (before the free, so an open cannot get
 * the chunks of an allocation no longer live). */
void wl__ipc_forget(uintptr_t p);
/* 1 when the handle is ours (*res is the answer, *pdptr the address on success), 0 when it is
 * the driver's. */
int wl__ipc_open(CUdeviceptr *pdptr, const CUipcMemHandle *handle, unsigned flags, CUresult *res);
/* 1 when p was opened by wl__ipc_open (*res the answer), 0 when it is the driver's. */
int wl__ipc_close(uintptr_t p, CUresult *res);
void wl__ipc_fork_child(void);
/* Before device's reset: the handles of ours opened in its primary context (on the device when
 * NULL) unmapped; before a created context's destruction, those opened in it. */
void wl__ipc_reset(int device, CUcontext primary);
void wl__ipc_ctx_destroy(CUcontext ctx);

/* ---- stream captures in progress (capture.c) -------------------------------------------------*/
/* Live process-wide count of stream captures begun through our hooks (and being begun). Hidden in
 * the declaration too, so the allocation and free hooks test it with one instruction, not a
 * load of its address first. */
extern int wl__captures __attribute__((visibility("hidden")));
/* Around a real cuStreamBeginCapture*: counted and recorded (stream, mode, the calling thread)
 * before it, taken back after it when the driver refused. A per-thread default stream is keyed by
 * its thread. */
void wl__capture_begin(void *stream, int mode);
void wl__capture_begin_failed(void *stream);
/* After a real cuStreamEndCapture: forgotten and uncounted when r says the capture is over. */
void wl__capture_ended(void *stream, CUresult r);
/* 1 when a capture we know of prohibits "potentially unsafe" calls (synchronous allocations and
 * frees) for the calling thread in its capture interaction mode (asked from the driver): the
 * driver would refuse them with CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED. Only while wl__captures. */
int wl__capture_prohibits(void);
/* Device d (its primary context) has finished its work: a synchronous free's implicit
 * synchronisation. */
void wl__device_synchronize(int d);
/* Device resets seen (reset.c): a served runtime call after one first lets the runtime make its
 * new context, as the real call would. */
extern unsigned wl__resets;
/* 1 when stream is capturing now (asks the driver only while some capture is active). */
int wl__stream_capturing(void *stream);
/* The entry point to hand liballoc for the driver's name (real: the driver's own): for its calls
 * that change or query memory and event state, a wrapper that runs the call in RELAXED capture
 * interaction mode while any capture is in progress (our own calls never count against a
 * program's capture); real for the others. */
void *wl__capture_relaxed(const char *name, void *real);
/* Puts the calling thread in RELAXED capture interaction mode (our own threads, for good); its
 * previous mode, -1 when the driver cannot say. */
int wl__capture_relax(void);
/* Gives the calling thread back the mode wl__capture_relax() returned. */
void wl__capture_unrelax(int mode);
void wl__capture_fork_child(void);
/* Before a device reset: the captures on its primary context's streams (the device's when NULL)
 * forgotten; before a created context's destruction, those on its streams. */
void wl__capture_reset(int device, CUcontext primary);
void wl__capture_ctx_destroy(CUcontext ctx);

/* ---- graphs holding NCCL work (gate mode, graph.c) -------------------------------------------*/
/* A launch while some capture is in progress: when stream is capturing and the launch is NCCL's
 * (inside an NCCL entry point, a kernel named as NCCL's, or a graph holding NCCL work), the
 * capture is marked. */
void wl__graph_capture_launch(void *stream, const void *fn, int fn_kind);
/* Before the real cuStreamEndCapture: the id of stream's capture when it is marked, else 0. */
uint64_t wl__graph_capture_marked(void *stream);
/* After it, for a marked capture: the capture is forgotten once over, its graph marked. */
void wl__graph_capture_ended(uint64_t id, CUresult r, void *graph);
/* After a successful instantiation: exec is marked when graph is, or when graph (not marked)
 * is found holding NCCL kernels by asking the driver about its nodes (then graph is marked). */
void wl__graph_instantiated(const void *graph, const void *exec);
/* After a successful cuGraphExecUpdate: exec is marked when graph is (or is found so, as above),
 * and forgotten otherwise. */
void wl__graph_exec_updated(const void *exec, const void *graph);
/* After a successful cuGraphExecKernelNodeSetParams (or the generic form for a kernel node):
 * exec is marked when the node's kernel (func, or when that is NULL the CUkernel kern) is
 * NCCL's. (A node set away from an NCCL kernel leaves the mark: the other nodes cannot be asked
 * about.) */
void wl__graph_exec_kernel_set(const void *exec, const void *func, const void *kern);
/* After a successful cuGraphExecChildGraphNodeSetParams (or the generic form for a child graph
 * node): exec is marked when child holds NCCL work (inspected as at instantiation). */
void wl__graph_exec_child_set(const void *exec, const void *child);
/* After a successful cuGraphAddNode: a conditional node's body graphs are remembered (the
 * driver hands them out only there), so that inspection can reach them. */
void wl__graph_node_added(const void *graph, const void *node, const CUgraphNodeParams *p);
/* After a successful cuGraphDestroyNode, and before cuGraphDestroy: the conditional nodes it
 * held (bodies' included) are forgotten. */
void wl__graph_node_destroyed(const void *node);
void wl__graph_destroyed(const void *graph);
/* 1 when exec was instantiated from a graph holding NCCL work. */
int wl__graph_exec_has_nccl(const void *exec);
/* Destruction, around the real call: forget (1 when h was marked), then remember again when
 * the driver refused (the handle lives on). */
enum { WL__GRAPH = 0, WL__GRAPH_EXEC = 1 };
int wl__graph_forget(int kind, const void *h);
void wl__graph_remember(int kind, const void *h);
void wl__graph_fork_child(void);

/* ---- gate mode -------------------------------------------------------------------------------*/
/* Set by the phase tracking when the next launch should enter the gate. */
extern int wl__gate_want;
/* What a launch's fn is: a driver CUfunction, a runtime host stub, or a graph (or nothing: the
 * gate entered at an allocation); or a CUkernel (a graph's kernel node, never a launch). */
typedef enum wl__fn_kind_e {
  WL__FN_NONE = 0,
  WL__FN_DRV,
  WL__FN_RT,
  WL__FN_GRAPH,
  WL__FN_KERNEL
} wl__fn_kind_t;
void wl__gate_launch_slow(void *stream, const void *fn, int fn_kind);
/* 1 when fn is one of NCCL's kernels, by its name (ncclDevKernel_*, ncclKernel_*): NCCL built
 * into the program statically (libtorch_cuda.so) has no entry point we could hook. */
int wl__is_nccl_kernel(const void *fn, int fn_kind);
/* Phase events from the alloc and free hooks (gate mode). */
void wl__gate_mem_event(int is_alloc, size_t size, void *stream);
/* A served allocation, before it is taken: fed to the detector and, when it begins an
 * iteration, the gate is entered here as at a launch (NCCL and capture excepted). */
void wl__gate_before_alloc(size_t size, void *stream);
extern uint32_t wl__gate_last_launch_tid;
void wl__gate_launch_thread(void *stream);
void wl__gate_at_exit(void);
void wl__gate_fork_child(void);

/* The launch hooks' common path: count, trace, and in gate mode maybe enter the gate. */
static inline void wl__on_launch(int mode, void *fn, int fn_kind, uint64_t threads, void *stream,
                                 const unsigned grid[3]) {
  wl__count(WL__ST_LAUNCHES, 1);
  if (mode == WL__MODE_GATE) {
    uint32_t tid = wl__tid();
    if (WL_UNLIKELY(tid != __atomic_load_n(&wl__gate_last_launch_tid, __ATOMIC_RELAXED)))
      wl__gate_launch_thread(stream);
    if (WL_UNLIKELY(__atomic_load_n(&wl__captures, __ATOMIC_RELAXED)))
      wl__graph_capture_launch(stream, fn, fn_kind);
    if (WL_UNLIKELY(__atomic_load_n(&wl__gate_want, __ATOMIC_RELAXED)))
      wl__gate_launch_slow(stream, fn, fn_kind);
  }
  wl_trace_writer_t *w = wl__tracer();
  if (WL_UNLIKELY(w != NULL)) /* straight to the writer: one call, fields in registers */
    wl_trace_emit_launch(w, (uint64_t)(uintptr_t)fn, threads, (uint64_t)(uintptr_t)stream, grid, 0);
}

/* ---- pinned host memory (alloc and gate modes): pinned.c's arena -----------------------------*/
void wl__pinned_setup(void);
/* A block from the arena, or NULL: pass the request through. */
void *wl__pinned_serve(size_t size, unsigned flags);
/* 0 freed, -ENOENT not the arena's (pass through), -EINVAL a bad free inside the arena. */
int wl__pinned_release(void *p);
/* 1 with *flags when p is a block the arena served: what the driver answers cuMemHostGetFlags for
 * an allocation of its own made with the block's flags; 0 when not the arena's. */
int wl__pinned_flags(void *p, unsigned *flags);
void wl__pinned_child(void);
void wl__pinned_report(void);

#endif
