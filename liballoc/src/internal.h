/* liballoc internals: the structures shared by the allocator's source files. */
#ifndef WAVELET_ALLOC_INTERNAL_H
#define WAVELET_ALLOC_INTERNAL_H

#include <wavelet/alloc.h>

#include <pthread.h>
#include <stdbool.h>

#include "log.h"
#include "ptrmap.h"
#include "util.h"

/* Large blocks are rounded to this; small ones to their size class. */
#define WL__LARGE_ALIGN 4096u
/* Requests up to this size are served from slabs of one size class. */
#define WL__SMALL_MAX   (64u * 1024u)
#define WL__NCLASSES    28
#define WL__MAX_REGIONS 32
/* Requests above this are refused outright (no device has 64 TiB). */
#define WL__HUGE ((size_t)1 << 46)

typedef struct wl__stream_s wl__stream_t;
typedef struct wl__slab_s wl__slab_t;

/* ---- blocks (alloc.c) ----------------------------------------------------------------------*/
enum { WL__B_FREE = 0, WL__B_ALLOC = 1, WL__B_SLAB = 2 };

/* A block of address space. The blocks of a region tile it in address order. A free block is
 * either untagged (stream NULL: no pending work, reusable anywhere) or tagged with the stream
 * it was freed on and that stream's free sequence number (reusable there at once, elsewhere once
 * an event covering seq has completed). */
typedef struct wl__block_s {
  uintptr_t addr;
  size_t size;
  struct wl__block_s *prev, *next;           /* address order */
  struct wl__block_s *left, *right, *parent; /* size tree */
  struct wl__block_s *fprev, *fnext;         /* tagged free blocks, in seq order per stream */
  wl__stream_t *stream;
  uint64_t seq;
  size_t req; /* requested bytes, allocated blocks */
  wl__slab_t *slab;
  uint32_t prio; /* the size tree's heap order */
  uint8_t state;
  uint8_t region;
} wl__block_t;

/* Block structs come in malloc'd arrays: 16-aligned, so the start index tags them (below). */
_Static_assert(sizeof(wl__block_t) % 16 == 0, "block structs are 16-aligned in their batches");

/* ---- the size tree (tree.c): a treap keyed by (size, addr) ----------------------------------*/
void wl__tree_insert(wl__block_t **root, wl__block_t *b);
void wl__tree_remove(wl__block_t **root, wl__block_t *b);
/* Puts b (not in a tree) where old is, old's priority included, and takes old out. The caller
 * keeps the key order: b's key lies between old's neighbours'. */
void wl__tree_replace(wl__block_t **root, wl__block_t *old, wl__block_t *b);
/* The block before and after n in key order, or NULL (found from the links, not the keys, so
 * they hold while n's own key is being changed). */
wl__block_t *wl__tree_prev(wl__block_t *n);
wl__block_t *wl__tree_next(wl__block_t *n);
/* Smallest block with size >= size (lowest address among equals), or NULL. */
wl__block_t *wl__tree_lower_bound(wl__block_t *root, size_t size);
/* The largest block (highest address among equals), or NULL. */
wl__block_t *wl__tree_max(wl__block_t *root);
size_t wl__tree_count(const wl__block_t *root);
/* Checks order and balance; 0 or -EFAULT. */
int wl__tree_check(const wl__block_t *root);

/* ---- the pointer map (common/ptrmap.h): address -> block or slab ----------------------------*/

/* ---- streams and events --------------------------------------------------------------------*/
typedef struct wl__evrec_s {
  void *ev;
  uint64_t seq; /* frees on the stream up to seq are covered */
} wl__evrec_t;

/* A small object freed on a stream other than its slab's owner, waiting for that stream. */
typedef struct wl__pending_s {
  struct wl__pending_s *next;
  wl__slab_t *slab;
  uint32_t index;
  uint64_t seq;
} wl__pending_t;

/* A stream's tagged free blocks are few (3 on average when it allocates on wl-bench-alloc's DNN
 * trace) and most wait only until its next event completes: they are kept in its list alone and
 * a best fit scans it, until the list grows past WL__FIFO_TREE blocks; then they are in a size
 * tree as well, until it shrinks to WL__FIFO_FLAT. */
#define WL__FIFO_TREE 48
#define WL__FIFO_FLAT 12

struct wl__stream_s {
  wl_stream_t handle;
  wl__block_t *tree; /* free blocks tagged with this stream, while treed */
  wl__block_t *fifo_head, *fifo_tail;
  uint32_t nfifo;
  bool treed;
  uint64_t free_seq, recorded_seq, done_seq;
  wl__evrec_t *evq; /* ring of recorded events */
  uint32_t evq_cap, evq_head, evq_len;
  size_t tagged_bytes;
  size_t unrec_bytes; /* bytes freed since the last recorded event */
  wl__pending_t *pend_head, *pend_tail;
  wl__slab_t *partial[WL__NCLASSES]; /* slabs with free objects, owned by this stream */
  wl__slab_t *empty[WL__NCLASSES];   /* one empty slab per class kept for reuse */
  uint32_t nslabs;                   /* slabs owned */
  bool dead;                         /* forgotten: records no new events */
  uint32_t tc_refs;                  /* thread caches bound to it: kept while nonzero */
  wl__stream_t *dead_next;
  wl__stream_t *live_prev, *live_next; /* the live streams, for process_all */
};

/* ---- slabs (small.c) -----------------------------------------------------------------------*/
struct wl__slab_s {
  wl__block_t *blk;
  wl__stream_t *owner;
  wl__slab_t *prev, *next; /* in owner->partial[cls] */
  uint32_t cls, objsize, nobj, nfree, hint;
  bool listed;
  wl__slab_t *all_prev, *all_next; /* every slab, for destroy */
  uint32_t *req;                   /* requested bytes per object, 0 when free or pending */
  uint64_t bits[];                 /* 1 = free */
};

/* ---- thread caches (tcache.c) ----------------------------------------------------------------*/
/* Bins: one per small size class, then large blocks hashed by their exact size. */
#define WL__TC_LARGE_BINS 16
#define WL__TC_NBINS      (WL__NCLASSES + WL__TC_LARGE_BINS)
#define WL__TC_CAP        16 /* entries per bin */
#define WL__TC_STREAMS    4  /* streams a cache serves at once */

/* A block freed into a thread cache: still allocated to the core allocator (in the pointer map,
 * its slab slot taken or its block state ALLOC, so its chunks stay mapped), with requested bytes
 * 0, so it is not live; reusable at once on the stream it was freed on. */
typedef struct wl__tcent_s {
  uintptr_t ptr;
  void *v;       /* the pointer map's value: a block, or a slab | 1 */
  uint32_t size; /* bytes it holds: the object or block size (at most tc_max) */
  uint32_t si;   /* index into the cache's streams */
} wl__tcent_t;

typedef struct wl__tthread_s wl__tthread_t;

/* What every call touches comes first, in a few cache lines. */
typedef struct wl__tcache_s {
  wl_alloc_t *alloc; /* atomic; NULL once the allocator is destroyed */
  int busy;          /* atomic: its thread is inside */
  int flushing;      /* atomic: a flusher (with the allocator's lock) is inside */
  wl_stream_t handle[WL__TC_STREAMS];
  wl__stream_t *stream[WL__TC_STREAMS]; /* referenced (tc_refs) while bound */
  /* Counters of the lock-free paths, kept here rather than in shared atomics (a locked
   * instruction each): written by whoever holds busy, summed into the stats under the lock. */
  size_t bytes;                     /* held in the bins */
  uint64_t hits, small_hits, frees; /* allocations served, small ones, frees taken */
  uint8_t n[WL__TC_NBINS];
  /* Demand: allocations of a bin's size not yet matched by a cached free (large bins: of
   * want_pages 4 KiB pages exactly). A free is cached only against demand, so sizes this
   * thread does not ask for again go straight back to the shared pools, not through the cache. */
  uint8_t want[WL__TC_NBINS];
  uint32_t want_pages[WL__TC_LARGE_BINS];
  bool orphan; /* its thread is gone (a fork child): the allocator frees it */
  uint32_t evict;
  wl__tthread_t *thr;
  struct wl__tcache_s *tnext;         /* the thread's caches (under the registry lock) */
  struct wl__tcache_s *aprev, *anext; /* the allocator's caches (under its lock) */
  wl__tcent_t e[WL__TC_NBINS][WL__TC_CAP];
} wl__tcache_t;

/* ---- regions and chunks --------------------------------------------------------------------*/
typedef struct wl__region_s {
  wl__block_t *head; /* the block at base */
  uintptr_t base;
  size_t size, nchunks;
  uintptr_t *starts; /* per 64 KiB: the allocated large block starting there (wl__start_get) */
  uint8_t *mapped;   /* per chunk */
  void **handle;     /* per chunk, when mapped */
  size_t *busy;      /* per chunk: bytes allocated or freed with work pending */
} wl__region_t;

struct wl_alloc_s {
  int lock; /* wl__lock */
  wl_provider_t prov;
  wl_alloc_config_t cfg;
  wl_budget_t budget;
  size_t local_limit, local_used; /* the default budget */
  size_t chunk;
  size_t max_request; /* the device's capacity, at most WL__HUGE */
  /* Offsets to chunk indices without a divide (a 64-bit div costs 40-90 cycles, and every large
   * call divides 2-6 times): off / chunk = ((off >> chunk_shift) * chunk_mul) >> 64, exact for
   * every offset below 2^48 when chunk_mul is not 0 (see wl__chunk_of). */
  unsigned chunk_shift;
  bool chunk_pow2;
  uint64_t chunk_mul;

  wl__region_t regions[WL__MAX_REGIONS];
  uint32_t nregions;
  uint32_t budget_waiters; /* threads waiting for the budget with the lock dropped */
  wl__block_t *any_tree;   /* untagged free blocks */
  size_t empty_mapped;     /* mapped chunks with busy == 0 */

  wl__ptrmap_t ptrs;       /* small objects (large blocks: the regions' starts) */
  size_t nstarts;          /* large blocks in the starts */
  wl__block_t *block_pool; /* free block structs */
  void **block_slabs;      /* the batches they came from */
  size_t nblock_slabs, cap_block_slabs;
  wl__pending_t *pend_pool;
  wl__slab_t *slabs; /* every slab */

  wl__stream_t **streams; /* open-addressing table of live streams */
  size_t stream_cap, stream_count;
  wl__stream_t *live_streams; /* the same, listed */
  wl__stream_t *last_stream;
  wl__stream_t *dead_streams;

  void **ev_pool;
  size_t ev_pool_len, ev_pool_cap;

  void **phys_cache;
  size_t phys_cache_len, phys_cache_cap;

  wl_alloc_stats_t st;

  /* Thread caches: tc_limit bytes per thread, blocks up to tc_max each; off when tc_limit is 0. */
  size_t tc_limit, tc_max;
  wl__tcache_t *tcs;                                   /* every cache of this allocator */
  uint64_t tc_gone_hits, tc_gone_small, tc_gone_frees; /* of caches already freed */
  size_t live_fast; /* live bytes the caches added (see wl__live) */

  pthread_t trim_tid;
  pthread_mutex_t trim_mu; /* the trim thread's wait; taken after the lock, never before */
  pthread_cond_t trim_cv;
  bool trim_running, trim_stop;
  bool trim_kick; /* atomic: set under the lock and trim_mu, cleared under trim_mu */
};

/* The allocator's lock: a futex word, 0 free, 1 held, 2 held with sleepers (mutex 3 of
 * Drepper's "Futexes Are Tricky"). Uncontended it is one locked instruction each way, where
 * pthread_mutex_lock and _unlock took about 75 instructions a pair, a sixth of a large call on
 * wl-bench-alloc's DNN trace. Not recursive; nothing waits on it but lockers. */
void wl__lock_slow(int *lk);
void wl__unlock_slow(int *lk);

static inline void wl__lock(wl_alloc_t *a) {
  int c = 0;
  if (WL_UNLIKELY(
          !__atomic_compare_exchange_n(&a->lock, &c, 1, false, __ATOMIC_ACQUIRE, __ATOMIC_RELAXED)))
    wl__lock_slow(&a->lock);
}

static inline void wl__unlock(wl_alloc_t *a) {
  if (WL_UNLIKELY(__atomic_exchange_n(&a->lock, 0, __ATOMIC_RELEASE) != 1))
    wl__unlock_slow(&a->lock);
}

/* Counter helpers: written under the lock, read without it. */
#define WL__ST_ADD(a, f, v) __atomic_store_n(&(a)->st.f, (a)->st.f + (v), __ATOMIC_RELAXED)
#define WL__ST_SUB(a, f, v)                                                                        \
  __atomic_store_n(&(a)->st.f, wl__sub_sat((a)->st.f, (v)), __ATOMIC_RELAXED)
#define WL__ST_SET(a, f, v) __atomic_store_n(&(a)->st.f, (v), __ATOMIC_RELAXED)
#define WL__ST_GET(a, f)    __atomic_load_n(&(a)->st.f, __ATOMIC_RELAXED)
/* Live bytes are two counters that add up (modulo 2^64: either may wrap alone): st.live_bytes,
 * changed under the lock with plain stores, and live_fast, changed by the thread caches with a
 * locked add. One shared counter would put a locked instruction on every locked call too. */
static inline size_t wl__live(wl_alloc_t *a) {
  return WL__ST_GET(a, live_bytes) + __atomic_load_n(&a->live_fast, __ATOMIC_RELAXED);
}

static inline void wl__live_peak(wl_alloc_t *a, size_t live) {
  size_t peak = WL__ST_GET(a, live_peak);
  while (live > peak && !__atomic_compare_exchange_n(&a->st.live_peak, &peak, live, true,
                                                     __ATOMIC_RELAXED, __ATOMIC_RELAXED)) {
  }
}

/* Allocated large blocks by address. A large block is over 64 KiB, so at most one allocated block
 * starts in each 64 KiB window of a region: a word per window holds it, tagged in its low four bits
 * with the 4 KiB page of the window it starts at. A look-up is one load, where the pointer map
 * (which keeps the small objects) hashes and probes, and an update one store instead of a
 * backward-shifting delete. The thread caches read it without the lock: a word is written whole,
 * and nothing shifts (the regions, once counted in nregions, never change). NULL when no
 * allocated large block starts at p. */
#define WL__START_SHIFT 16

static inline wl__block_t *wl__start_get(wl_alloc_t *a, uintptr_t p) {
  if (p & (WL__LARGE_ALIGN - 1)) return NULL;
  uint32_t n = __atomic_load_n(&a->nregions, __ATOMIC_ACQUIRE);
  for (uint32_t i = 0; i < n; i++) {
    const wl__region_t *r = &a->regions[i];
    uintptr_t off = p - r->base;
    if (off >= r->size) continue;
    uintptr_t w = __atomic_load_n(&r->starts[off >> WL__START_SHIFT], __ATOMIC_ACQUIRE);
    return w && (w & 15) == ((off >> 12) & 15) ? (wl__block_t *)(w & ~(uintptr_t)15) : NULL;
  }
  return NULL;
}

/* The chunk holding offset off of a region. */
static inline size_t wl__chunk_of(const wl_alloc_t *a, size_t off) {
  if (WL_LIKELY(a->chunk_mul && off < ((size_t)1 << 48)))
    return (size_t)(((unsigned __int128)(off >> a->chunk_shift) * a->chunk_mul) >> 64);
  if (a->chunk_pow2) return off >> a->chunk_shift;
  return off / a->chunk;
}

/* With the lock. */
static inline void wl__live_add(wl_alloc_t *a, size_t bytes) {
  WL__ST_SET(a, live_bytes, a->st.live_bytes + bytes);
  wl__live_peak(a, wl__live(a));
}

static inline void wl__live_sub(wl_alloc_t *a, size_t bytes) {
  WL__ST_SET(a, live_bytes, a->st.live_bytes - bytes);
}

/* Without it (a thread cache). */
static inline void wl__live_add_fast(wl_alloc_t *a, size_t bytes) {
  size_t f = __atomic_fetch_add(&a->live_fast, bytes, __ATOMIC_RELAXED) + bytes;
  wl__live_peak(a, f + WL__ST_GET(a, live_bytes));
}

static inline void wl__live_sub_fast(wl_alloc_t *a, size_t bytes) {
  __atomic_fetch_sub(&a->live_fast, bytes, __ATOMIC_RELAXED);
}

/* ---- cross-file internals ------------------------------------------------------------------*/
/* alloc.c */
/* The pointer map's or the starts' value for p (a block, or a slab | 1), or NULL. */
void *wl__addr_get(wl_alloc_t *a, uintptr_t p);
/* Takes p, whose value is v, out of the starts or the pointer map. */
void wl__addr_del(wl_alloc_t *a, uintptr_t p, void *v);
wl__block_t *wl__large_alloc(wl_alloc_t *a, size_t size, size_t req, wl__stream_t *s);
void wl__large_free(wl_alloc_t *a, wl__block_t *b, wl__stream_t *s);
void wl__stream_tick(wl_alloc_t *a, wl__stream_t *s);
/* While budget_waiters: gives empty chunks and cached handles back to the budget, which the
 * waiters sleep on (alloc.c). Under the lock, at the end of anything that can empty a chunk. */
void wl__feed_waiters(wl_alloc_t *a);
void wl__fail(wl_alloc_t *a, int err, size_t request, const char *what);
wl__pending_t *wl__pending_new(wl_alloc_t *a);
void wl__pending_put(wl_alloc_t *a, wl__pending_t *p);
void wl__hook(wl_alloc_t *a, wl_alloc_event_kind_t kind, uintptr_t ptr, size_t size,
              wl_stream_t stream);

wl__stream_t *wl__stream_get(wl_alloc_t *a, wl_stream_t h);

/* tcache.c */
/* Sets the cache limits from the configuration (create). */
void wl__tc_setup(wl_alloc_t *a);
/* A cached block for size on stream, counted live, or NULL (a miss: take the lock). */
void *wl__tc_alloc(wl_alloc_t *a, size_t size, wl_stream_t stream);
/* wl__tc_free's part after the look-up, v the pointer map's value for ptr. */
int wl__tc_free_found(wl_alloc_t *a, uintptr_t ptr, wl_stream_t stream, void *v, void **vout);
/* 0 when ptr went into the calling thread's cache (counted freed), -1 when the locked path must
 * take it (not ours, a double free, no room, a stream the cache cannot bind); then *vout is the
 * pointer map's value for ptr when the look-up was done, else NULL. */
static inline int wl__tc_free(wl_alloc_t *a, uintptr_t ptr, wl_stream_t stream, void **vout) {
  /* The look-up first, inline: a block larger than any cache takes (on wl-bench-alloc's DNN
   * trace, most frees) goes to the locked path at once with it, without entering a cache. */
  void *v = wl__start_get(a, ptr);
  if (!v && (!wl__ptrmap_get_unlocked(&a->ptrs, ptr, &v) || !v)) return -1;
  if (!((uintptr_t)v & 1) && ((wl__block_t *)v)->size > a->tc_max) {
    *vout = v;
    return -1;
  }
  return wl__tc_free_found(a, ptr, stream, v, vout);
}
/* With the lock: gives every cache's blocks back to the core allocator (caches in use by their
 * thread right now are skipped) and frees the caches of threads that are gone. */
size_t wl__tc_flush_all(wl_alloc_t *a); /* returns the bytes given back */
/* Detaches every cache (destroy). */
void wl__tc_destroy(wl_alloc_t *a);
/* With the lock: the bytes every cache holds; the caches' counters added to a stats snapshot. */
size_t wl__tc_bytes(wl_alloc_t *a);
void wl__tc_stats(wl_alloc_t *a, wl_alloc_stats_t *out);
/* wl_alloc_check's part: 0 when the caches' blocks and bytes match the counters. */
int wl__tc_check(wl_alloc_t *a, size_t *nblocks);

/* small.c */
int wl__size_class(size_t size);
size_t wl__class_size(int cls);
void *wl__small_alloc(wl_alloc_t *a, size_t req, wl__stream_t *s);
int wl__small_free(wl_alloc_t *a, wl__slab_t *slab, uintptr_t ptr, wl__stream_t *s);
/* Returns the object's slot to its slab once its pending work is done. */
void wl__small_release(wl_alloc_t *a, wl__slab_t *slab, uint32_t index, wl__stream_t *s);
/* Gives back the empty slabs s keeps for reuse; with orphan, also stops allocating from its
 * partial slabs (the stream is being forgotten). */
void wl__small_drop_empty(wl_alloc_t *a, wl__stream_t *s, bool orphan);
/* Frees every slab struct (destroy). */
void wl__small_free_all(wl_alloc_t *a);
int wl__small_check(wl_alloc_t *a, wl__slab_t *slab, size_t *live);

#endif
