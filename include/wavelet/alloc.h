/* liballoc: a stream-ordered device-memory allocator over a provider (CUDA VMM or host pages). */
#ifndef WAVELET_ALLOC_H
#define WAVELET_ALLOC_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#ifdef __cplusplus
extern "C" {
#endif

/* ------------------------------------------------------------------------------------------------
 * Version and export
 * ----------------------------------------------------------------------------------------------*/
#define WL_ALLOC_VERSION_MAJOR 0
#define WL_ALLOC_VERSION_MINOR 1

#if defined(__GNUC__)
#define WL_API __attribute__((visibility("default")))
#else
#define WL_API
#endif

/* Every block is aligned to at least this (CUDA guarantees 256 for cudaMalloc). */
#define WL_ALLOC_ALIGN 256u

/* ------------------------------------------------------------------------------------------------
 * Types
 * ----------------------------------------------------------------------------------------------*/
typedef struct wl_alloc_s wl_alloc_t;

/* A stream handle, opaque to the allocator (a CUstream for the VMM provider, a handle from
 * wl_host_stream_create or NULL for the host provider). NULL is a valid stream. */
typedef void *wl_stream_t;

/* The provider: where address space, physical memory and stream events come from. All functions
 * return 0 or a negative errno. A physical handle is opaque; every handle is `chunk` bytes. */
typedef struct wl_provider_s {
  const char *name;
  void *ctx;
  /* Smallest mapping unit (the device's allocation granularity), a power of two. */
  size_t granularity;
  /* Device (or host model) capacity in bytes, 0 when unknown; only informs messages. */
  size_t capacity;
  int (*reserve)(void *ctx, size_t size, uintptr_t *addr);
  int (*unreserve)(void *ctx, uintptr_t addr, size_t size);
  int (*phys_create)(void *ctx, size_t size, void **handle);
  int (*phys_release)(void *ctx, void *handle, size_t size);
  /* Map a physical handle at addr (inside a reservation) and make it accessible. */
  int (*map)(void *ctx, uintptr_t addr, size_t size, void *handle);
  int (*unmap)(void *ctx, uintptr_t addr, size_t size);
  /* Checks a stream handle once, when the allocator first sees it (-EINVAL: unknown stream). */
  int (*stream_check)(void *ctx, wl_stream_t stream);
  int (*event_create)(void *ctx, void **event);
  int (*event_destroy)(void *ctx, void *event);
  /* -EAGAIN: the stream cannot be named from the calling thread (a thread's per-thread default
   * stream, recorded on by its own thread only); the stream's frees stay pending, reusable on
   * it alone, until a record from a thread that can succeeds. */
  int (*event_record)(void *ctx, void *event, wl_stream_t stream);
  /* 0: complete, -EBUSY: not yet, other negative errno: error (treated as not complete). */
  int (*event_query)(void *ctx, void *event);
  void (*destroy)(void *ctx);
  /* Sharing with other processes; optional (NULL: -ENOTSUP). phys_export gives a new file
   * descriptor for a handle's memory (the caller closes it; -ENOTSUP when the handle cannot be
   * shared). import maps n pieces of piece bytes each, exported by another process as fds (the
   * caller keeps and closes them), one after another at a new address; unimport undoes it, given
   * import's token. Imported memory is the exporter's: no budget is asked for it. */
  int (*phys_export)(void *ctx, void *handle, int *fd);
  int (*import)(void *ctx, const int *fds, size_t n, size_t piece, uintptr_t *addr, void **token);
  int (*unimport)(void *ctx, void *token);
  /* Another device's access (optional, NULL: -ENOTSUP): with size 0, device may access what is
   * mapped from now on; else [addr, addr + size), mapped before, is opened to it. */
  int (*grant)(void *ctx, int device, uintptr_t addr, size_t size);
} wl_provider_t;

/* The budget: asked before mapping more physical memory, told when it is given back. The default
 * budget is a local limit (or none). libsched implements a budget shared by a GPU's processes. */
typedef struct wl_budget_s {
  void *ctx;
  /* 0, or -ENOMEM (refused) / -ETIMEDOUT (deadline passed while waiting). deadline_ns is on
   * CLOCK_MONOTONIC; 0 means do not wait. */
  int (*acquire)(void *ctx, size_t bytes, uint64_t deadline_ns);
  void (*release)(void *ctx, size_t bytes);
  /* The limit this budget enforces in bytes, 0 for none; for messages and mem-info. */
  size_t (*limit)(void *ctx);
  /* Optional (NULL: release is called). Gives back the grant of the last acquire, which was
   * never used because the physical memory could not be created, so a budget that keeps peaks
   * can drop it from them. */
  void (*refund)(void *ctx, size_t bytes);
  /* Optional (NULL: such a request fails at once). For a device found full although the budget
   * had room (memory it cannot see: CUDA contexts, libraries' own allocations, other programs):
   * waits for bytes to come back, until another holder of the budget gives memory back (0), a
   * while has passed in which memory the budget cannot see may have been freed (-EAGAIN), or
   * deadline_ns (-ETIMEDOUT). The caller then tries the device again. */
  int (*wait_release)(void *ctx, size_t bytes, uint64_t deadline_ns);
  /* Optional (NULL: never): nonzero while another holder of the budget waits for memory. The
   * allocator then keeps no unused memory (its trims keep nothing mapped rather than
   * release_threshold, and nothing in the physical cache; a free that leaves an empty chunk
   * wakes the trimmer), so a peer that rises while this one falls gets memory a chunk at a time
   * as it is freed. Called on such frees and by the trimmer: it must be cheap. */
  int (*pressed)(void *ctx);
} wl_budget_t;

/* What the event hook sees (the tracer's input). */
typedef enum wl_alloc_event_kind_e {
  WL_ALLOC_EV_ALLOC = 1,    /* size: requested bytes */
  WL_ALLOC_EV_FREE,         /* size: requested bytes of the freed block */
  WL_ALLOC_EV_MAP,          /* physical memory mapped (size bytes) */
  WL_ALLOC_EV_UNMAP,        /* physical memory unmapped */
  WL_ALLOC_EV_PHYS_RELEASE, /* physical memory given back to the device and the budget */
  WL_ALLOC_EV_BUDGET_DENY,  /* the budget refused size bytes */
  WL_ALLOC_EV_OOM           /* an allocation of size bytes failed */
} wl_alloc_event_kind_t;

typedef struct wl_alloc_event_s {
  uint64_t time_ns; /* CLOCK_MONOTONIC */
  wl_alloc_event_kind_t kind;
  uintptr_t ptr;
  size_t size;
  wl_stream_t stream;
} wl_alloc_event_t;

/* Called with the allocator's lock held: it must be quick and must not call the allocator. */
typedef void (*wl_alloc_hook_fn)(void *arg, const wl_alloc_event_t *ev);

typedef struct wl_alloc_config_s {
  /* Address space to reserve up front; 0: provider capacity x 2, or 64 GiB when unknown. */
  size_t va_size;
  /* Physical mapping unit, a multiple of the provider's granularity; 0: 20 MiB. */
  size_t chunk_size;
  /* Keep at most this much mapped-but-unused memory when trimming; 0: one chunk. */
  size_t release_threshold;
  /* Unmapped physical memory kept for reuse instead of given back; 0: none. */
  size_t phys_cache_limit;
  /* Local limit on physical bytes, used when no budget is given; 0: unlimited. */
  size_t mem_limit;
  /* How long an allocation may wait for the budget, in ms; 0: do not wait. */
  uint32_t alloc_timeout_ms;
  /* Start a background thread that trims every trim_interval_ms (0: 100 ms) and when
   * unused mapped memory crosses the threshold. Without it, call wl_alloc_trim. */
  int trim_thread;
  uint32_t trim_interval_ms;
  /* Per-thread cache of freed blocks, served again without the lock to the thread that asks for
   * the same size on the same stream: at most tcache_bytes per thread (0: 8 MiB, or 1/64 of
   * the budget's limit when that is less), blocks up to a quarter of it. tcache_off, or a hook,
   * turns it off. Cached blocks are not live; they stay mapped (physical) until a trim, a miss
   * that needs the memory, or their thread's exit gives them back. */
  size_t tcache_bytes;
  int tcache_off;
  /* Optional shared budget; NULL: the local limit above. Copied; ctx must outlive the allocator. */
  const wl_budget_t *budget;
  wl_alloc_hook_fn hook;
  void *hook_arg;
} wl_alloc_config_t;

/* Why the calling thread's last failed call failed. */
typedef struct wl_alloc_failure_s {
  int error;       /* negative errno: -ENOMEM, -ETIMEDOUT, -EINVAL; -EAGAIN: the driver refused
                      for now (during a stream capture); another: the provider failed */
  size_t request;  /* bytes asked for */
  size_t live;     /* live bytes at the time */
  size_t physical; /* physical bytes held (mapped plus cached) */
  size_t limit;    /* budget limit, 0 for none */
  char what[96];   /* one phrase: what went wrong */
} wl_alloc_failure_t;

typedef struct wl_alloc_stats_s {
  size_t live_bytes, live_peak;         /* requested bytes of allocated blocks */
  size_t mapped_bytes, mapped_peak;     /* physical memory mapped into the range */
  size_t physical_bytes, physical_peak; /* mapped plus cached unmapped handles */
  size_t cached_bytes;                  /* unmapped handles kept for reuse */
  size_t reserved_bytes;                /* address space */
  size_t pending_bytes;                 /* freed blocks waiting for their stream's work */
  uint64_t allocs, frees, small_allocs;
  uint64_t maps, unmaps, phys_creates, phys_releases;
  uint64_t events_recorded, trims, budget_denials, ooms, bad_calls;
  uint64_t device_full_waits; /* chunks that waited: the device was full, the budget had room */
  size_t free_blocks, largest_free; /* free large blocks and the largest (fragmentation) */
  size_t tcache_bytes;              /* freed blocks held in thread caches (mapped, not live) */
  uint64_t tcache_hits;             /* allocations served from a thread cache */
  /* 1 when thread caches exist and their threads fence for themselves on every cached call: this
   * machine's membarrier(2) is missing or slow (gVisor's takes about 10 ms a call). */
  uint64_t tcache_self_fenced;
} wl_alloc_stats_t;

/* ------------------------------------------------------------------------------------------------
 * Providers
 * ----------------------------------------------------------------------------------------------*/

/* The host provider: address space from mmap, physical memory as memfd pages mapped into it (so
 * mapping works as VMM does). capacity 0: unlimited; otherwise phys_create fails past it.
 * granularity 0: 2 MiB. Returns 0 or a negative errno; *out is filled by value. */
WL_API int wl_provider_host_init(wl_provider_t *out, size_t capacity, size_t granularity);

/* Host streams: work is modelled as tickets. A stream's events complete once every ticket
 * enqueued before the record has been completed. */
WL_API wl_stream_t wl_host_stream_create(const wl_provider_t *host);
WL_API void wl_host_stream_destroy(const wl_provider_t *host, wl_stream_t stream);
/* Enqueues one unit of pretend work on stream; returns its ticket (>= 1). */
WL_API uint64_t wl_host_stream_enqueue(wl_stream_t stream);
/* Marks the stream's work complete up to and including ticket. */
WL_API void wl_host_stream_complete(wl_stream_t stream, uint64_t ticket);

/* The CUDA VMM provider for device `device`: loads the driver at run time (driver_path NULL:
 * "libcuda.so.1"), uses cuMemAddressReserve/cuMemCreate/cuMemMap/cuMemSetAccess/cuMemUnmap/
 * cuMemRelease and CUDA events. The calling thread's current context is used. -ENOSYS when built
 * without the CUDA toolkit, -ENODEV when no driver or device is found. */
WL_API int wl_provider_vmm_init(wl_provider_t *out, int device, const char *driver_path);

/* The same over entry points the caller resolves: resolve(arg, name) returns the driver's
 * function for a versioned export name ("cuMemCreate", "cuDeviceTotalMem_v2", ...) or NULL.
 * For an interposer, whose own hooks must not see the provider's calls. 0 or negative errno
 * as above (-EINVAL without resolve). */
typedef void *(*wl_vmm_resolve_fn)(void *arg, const char *name);
WL_API int wl_provider_vmm_init_with(wl_provider_t *out, int device, wl_vmm_resolve_fn resolve,
                                     void *arg);

/* ------------------------------------------------------------------------------------------------
 * The allocator
 * ----------------------------------------------------------------------------------------------*/

/* Fills cfg with the defaults. */
WL_API void wl_alloc_config_default(wl_alloc_config_t *cfg);

/* Creates an allocator over provider (copied; the allocator destroys it). 0 or negative errno. */
WL_API int wl_alloc_create(wl_alloc_t **out, const wl_provider_t *provider,
                           const wl_alloc_config_t *cfg);

/* Frees everything, live blocks included, unmaps, releases and gives the budget back. */
WL_API void wl_alloc_destroy(wl_alloc_t *a);
/* For a device reset, whose streams and events die while stream-ordered memory lives on (CUDA:
 * "cudaDeviceReset() will not destroy memory allocations by cudaMallocAsync()"): every event is
 * destroyed now, every block freed in stream order counts as complete (the reset ends the work
 * it waited for) and is reusable anywhere, every stream is forgotten, the thread caches are
 * emptied. Live blocks stay live; frees and allocations afterwards name new streams. */
WL_API void wl_alloc_abandon_streams(wl_alloc_t *a);

/* Allocates size bytes usable on stream at once. NULL on failure, with the reason in
 * wl_alloc_last_failure. Size 0 is refused (-EINVAL). */
WL_API void *wl_alloc_async(wl_alloc_t *a, size_t size, wl_stream_t stream);

/* Frees ptr in stream order: reusable on stream at once, elsewhere after stream's prior work.
 * 0, or -EINVAL for NULL, a foreign pointer, a double free or an unknown stream (one warning
 * line; nothing is changed). */
WL_API int wl_free_async(wl_alloc_t *a, void *ptr, wl_stream_t stream);

/* Requested size of a live block, 0 if ptr is not one. */
WL_API size_t wl_alloc_usable_size(wl_alloc_t *a, const void *ptr);

/* The start of the live allocation ptr points into (its start or any byte of its requested
 * size), or NULL. A walk of the region's blocks: for rare calls (CUDA IPC of an interior
 * pointer, which the driver answers with the allocation's handle). */
WL_API void *wl_alloc_base(wl_alloc_t *a, const void *ptr);

/* The physical memory beneath a live allocation, for another process (CUDA IPC): the pieces
 * (chunks) it lies in, as file descriptors, and where it starts in the first. */
typedef struct wl_alloc_export_s {
  size_t offset;  /* ptr's offset into the first piece */
  size_t size;    /* the allocation's requested bytes */
  size_t piece;   /* bytes per piece */
  size_t npieces; /* pieces, in address order */
  int *fds;       /* npieces descriptors (malloc'd) */
} wl_alloc_export_t;

/* Exports the allocation starting at ptr: 0, -EINVAL when ptr is not the start of a live
 * allocation, -ENOTSUP when the provider cannot share its memory, another negative errno from
 * the provider. The pieces stay the exporter's: freeing ptr gives them to other allocations as
 * usual (an importer must be done with them first, as with CUDA IPC). */
WL_API int wl_alloc_export(wl_alloc_t *a, const void *ptr, wl_alloc_export_t *out);

/* Closes an export's descriptors and frees its array. */
WL_API void wl_alloc_export_close(wl_alloc_export_t *e);

/* Looks for completed stream work and gives back mapped memory beyond keep_bytes of unused
 * memory (SIZE_MAX: the configured threshold). Returns the bytes unmapped. */
WL_API size_t wl_alloc_trim(wl_alloc_t *a, size_t keep_bytes);

/* Forgets a stream the caller is about to destroy (its blocks become reusable when its last
 * recorded work completes). Call it where the provider can record on the stream (a per-thread
 * default stream: on its thread); blocks freed after the last event that could be recorded stay
 * unusable elsewhere for good. */
WL_API void wl_alloc_stream_forget(wl_alloc_t *a, wl_stream_t stream);
/* Opens everything the allocator serves, mapped now or later, to another device (peer access:
 * VMM memory is reachable only from the devices it is opened to). 0, -ENOTSUP (the provider
 * cannot), or the provider's error. */
WL_API int wl_alloc_grant(wl_alloc_t *a, int device);

/* The calling thread's last failure. 0 when there is one, -ENOENT otherwise (-EINVAL: NULL). */
WL_API int wl_alloc_last_failure(wl_alloc_failure_t *out);

/* One line into buf: 0, or -EINVAL for NULL or len 0. "cannot allocate 1.0 GiB: budget refused
 * (live 3.2 GiB, physical 3.5 GiB, limit 4 GiB)" */
WL_API int wl_alloc_failure_format(const wl_alloc_failure_t *f, char *buf, size_t len);

/* Cheap counters (relaxed reads, no lock). A NULL allocator reads as all zeros. */
WL_API void wl_alloc_stats_get(wl_alloc_t *a, wl_alloc_stats_t *out);

/* Prints the stats as a fixed-width table, or as one JSON object when json is nonzero. */
typedef void (*wl_out_fn)(void *arg, const char *text);
WL_API void wl_alloc_stats_print(wl_alloc_t *a, wl_out_fn out, void *arg, int json);

/* Checks every internal invariant (block tiling, no overlap, counters, live <= physical <=
 * reserved). 0 when all hold, -EFAULT (with a warning naming the first broken one) otherwise,
 * -EINVAL for NULL.
 * Takes time linear in the number of blocks: for tests and debugging. */
WL_API int wl_alloc_check(wl_alloc_t *a);

/* Formats a byte count as "1.5 GiB" into buf. */
WL_API const char *wl_format_bytes(size_t bytes, char *buf, size_t len);

#ifdef __cplusplus
}
#endif
#endif /* WAVELET_ALLOC_H */
