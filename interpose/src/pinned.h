/* The pinned-host arena: cudaMallocHost/cudaHostAlloc/cuMemAllocHost/cuMemHostAlloc served by a
 * private jemalloc arena over large page-locked chunks.
 *
 * Linking: pinned.c needs the target wl_jemalloc_private of cmake/WaveletJemalloc.cmake, in one of
 * two flavours (the process's malloc stays glibc's in both):
 * - dynamic (WL_PINNED_DYNAMIC; deps/jemalloc built by scripts/jemalloc.sh): jemalloc is
 *   libwavelet-jemalloc.so, with dynamic TLS and names prefixed wl__je_, which wl__pinned_init
 *   loads with dlopen from beside the object holding this code (or wl__pinned_set_library's
 *   path). Nothing of jemalloc is linked in, so libwavelet.so can be dlopen'ed.
 * - static, the fallback: Debian's static jemalloc with every symbol renamed wl__je_*, linked in.
 *   It uses initial-exec TLS, so a shared library containing it is marked STATIC_TLS: it loads
 *   with LD_PRELOAD or as a DT_NEEDED dependency, while dlopen() of it fails ("cannot allocate
 *   memory in static TLS block") unless GLIBC_TUNABLES=glibc.rtld.optional_static_tls=16384 is
 *   set for the process. */
#ifndef WAVELET_INTERPOSE_PINNED_H
#define WAVELET_INTERPOSE_PINNED_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* Where chunks come from. The interposer allocates them with the REAL
 * cuMemHostAlloc(CU_MEMHOSTALLOC_PORTABLE | CU_MEMHOSTALLOC_DEVICEMAP) and frees them with the
 * real cuMemFreeHost: every request the arena serves asks for a subset of those properties
 * (see wl__pinned_alloc). Tests back them with mmap. Both are called without any of the arena's
 * locks held by this module, but possibly inside jemalloc (with one of its arena locks held):
 * they must not call wl__pinned_*. A chunk's memory must be page aligned. */
typedef struct wl__pinned_ops_s {
  int (*chunk_alloc)(void *ctx, size_t size, void **out); /* 0 or -ENOMEM */
  void (*chunk_free)(void *ctx, void *p, size_t size);
  void *ctx;
} wl__pinned_ops_t;

/* The cuMemHostAlloc/cudaHostAlloc flag bits (same values in both APIs). */
#define WL_PINNED_F_PORTABLE      0x01u
#define WL_PINNED_F_DEVICEMAP     0x02u
#define WL_PINNED_F_WRITECOMBINED 0x04u

/* The arena's chunk size. A request of half a chunk or more gets a chunk of its own, returned to
 * chunk_free at its free; smaller ones share chunks, which stay pinned until shutdown. */
#define WL_PINNED_CHUNK_DEFAULT (64u << 20)

/* Before wl__pinned_init only (tests): another chunk size, a power of two of 2 MiB or more.
 * 0 or -EINVAL (bad size), -EBUSY (already initialised). */
int wl__pinned_configure(size_t chunk_size);

/* The dynamic flavour, before jemalloc is loaded (the first successful wl__pinned_init): path:
 * the libwavelet-jemalloc.so to load (NULL: keep the default, libwavelet-jemalloc.so in the
 * directory of the object this code is linked into, as dladdr names it at load; tests, whose
 * executables are elsewhere, pass the build's copy); lookup: the dlsym to find its functions
 * with (NULL: keep dlsym; libwavelet.so passes the real one, its own being a hook). 0, -EBUSY
 * (already loaded) or -ENAMETOOLONG. The static flavour ignores both and returns 0. */
int wl__pinned_set_library(const char *path, void *(*lookup)(void *handle, const char *name));

/* Creates the arena (jemalloc's metadata stays in ordinary memory; nothing is pinned until the
 * first request). 0, -EALREADY, -EINVAL (ops incomplete), -ENOENT (dynamic flavour: jemalloc's
 * library missing, or lacking a function; tried again at the next call) or another negative
 * errno from jemalloc; the arena then stays off and every request passes through. Every failure
 * but -EALREADY and -EINVAL has been reported in one line. */
int wl__pinned_init(const wl__pinned_ops_t *ops);

/* Arenas are kept apart by key (the interposer's: the device of the current context, since
 * pinned memory belongs to the context it was allocated in): a block is carved only from chunks
 * allocated for its key. wl__pinned_alloc is wl__pinned_alloc_for key 0. */
#define WL_PINNED_KEYS 16

/* A pinned block of `size` bytes, aligned to 4 KiB (256 bytes below 4 KiB), or NULL when this
 * request is not served and the caller must pass it through to CUDA: before init, in a forked
 * child, size 0 or over 1 TiB, flags with WRITECOMBINED (its uncached, write-combining pages
 * differ from the arena's) or unknown bits, or when a chunk cannot be allocated. Served:
 * flags 0, PORTABLE, DEVICEMAP and both (chunks are portable and mapped; with unified
 * addressing a mapped block's device pointer is its host pointer). */
void *wl__pinned_alloc(size_t size, unsigned cu_host_alloc_flags);
/* The same for key (0 to WL_PINNED_KEYS - 1; another is passed through): chunks are allocated
 * with key's context current (the caller's), and the first small request makes key's arena. */
void *wl__pinned_alloc_for(size_t size, unsigned cu_host_alloc_flags, int key);

/* 0: freed. -ENOENT: not the arena's memory, the caller passes the free through. -EINVAL: inside
 * the arena's chunks but not a live block (a double or interior free): the caller must NOT pass
 * it through (the real cuMemFreeHost could free a whole chunk) and returns an invalid-value
 * error. In a forked child a block of the parent is forgotten, not reused (0). */
int wl__pinned_free(void *p);

/* Whether p points into memory of the arena (any chunk, live block or not). */
bool wl__pinned_owns(const void *p);

/* For cuMemHostGetFlags and friends: when p is the start of a live block, its requested size,
 * usable size and flags; 0 or -ENOENT. Any out pointer may be NULL. */
int wl__pinned_query(const void *p, size_t *size, size_t *usable, unsigned *flags);

/* The key (device) of the live block starting at p, or -1. */
int wl__pinned_key(const void *p);

/* For a device reset: key's arena destroyed, its blocks forgotten and its chunks (shared and own)
 * given to chunk_free; the other keys' untouched. The number of chunks let go. */
size_t wl__pinned_reset_key(int key);

/* Call from the interposer's pthread_atfork child handler: the child's chunks are not page-locked
 * (CUDA does not survive fork), so the child serves nothing and forgets the parent's blocks. */
void wl__pinned_fork_child(void);

typedef struct wl__pinned_stats_s {
  uint64_t chunks;       /* chunks held now (arena and own) */
  uint64_t chunk_bytes;  /* their bytes */
  uint64_t own_chunks;   /* of which requests with a chunk of their own */
  uint64_t chunk_allocs; /* chunk_alloc calls that succeeded, since init */
  uint64_t chunk_frees;  /* chunk_free calls, since init */
  uint64_t live_blocks;  /* blocks handed out and not freed */
  uint64_t live_bytes;   /* their requested bytes */
  uint64_t served;       /* requests served, since init */
  uint64_t passed;       /* requests not served (NULL), since init */
  uint64_t bad_frees;    /* -EINVAL frees */
  uint64_t wasted_bytes; /* chunk bytes skipped to align the extents jemalloc asked for */
} wl__pinned_stats_t;

void wl__pinned_stats(wl__pinned_stats_t *out);

/* Tests and exit: destroys the arena and frees every chunk. Blocks still live are lost (their
 * memory is freed). Afterwards wl__pinned_init may be called again. */
void wl__pinned_shutdown(void);

#endif
