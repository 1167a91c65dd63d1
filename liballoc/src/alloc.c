/* The allocator proper: regions of address space, best-fit blocks with splitting and coalescing,
 * stream-ordered reuse through lazily recorded events, chunked physical mapping under a budget,
 * and trimming. */
#include "internal.h"

#include <errno.h>
#include <linux/futex.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <unistd.h>

#define BLOCK_BATCH 256

static _Thread_local wl_alloc_failure_t tl_failure;
static _Thread_local int tl_has_failure;

/* ---- failures and hooks ----------------------------------------------------------------------*/

void wl__fail(wl_alloc_t *a, int err, size_t request, const char *what) {
  wl_alloc_failure_t *f = &tl_failure;
  f->error = err;
  f->request = request;
  f->live = a ? wl__live(a) : 0;
  f->physical = a ? a->st.physical_bytes : 0;
  f->limit = a && a->budget.limit ? a->budget.limit(a->budget.ctx) : 0;
  snprintf(f->what, sizeof f->what, "%s", what);
  tl_has_failure = 1;
}

/* A caller's mistake is counted, and said in a warning for the first WL__BAD_CALLS_SHOWN only: a
 * program that repeats one must not flood its log (the stats keep the count). Returns nonzero
 * when the caller is to warn; the last warning shown says so. */
#define WL__BAD_CALLS_SHOWN 16
static int bad_call(wl_alloc_t *a) {
  uint64_t n = a ? __atomic_add_fetch(&a->st.bad_calls, 1, __ATOMIC_RELAXED) : 1;
  return n < WL__BAD_CALLS_SHOWN ? 1 : n == WL__BAD_CALLS_SHOWN ? 2 : 0;
}
#define BAD_CALL(a, fmt, ...)                                                                      \
  do {                                                                                             \
    int show_ = bad_call(a);                                                                       \
    if (show_)                                                                                     \
      wl__warn(fmt "%s", __VA_ARGS__,                                                              \
               show_ == 2 ? " (further mistakes of this kind are counted in the stats, not shown)" \
                          : "");                                                                   \
  } while (0)

int wl_alloc_last_failure(wl_alloc_failure_t *out) {
  if (!out) return -EINVAL;
  if (!tl_has_failure) return -ENOENT;
  *out = tl_failure;
  return 0;
}

int wl_alloc_failure_format(const wl_alloc_failure_t *f, char *buf, size_t len) {
  if (!f || !buf || !len) return -EINVAL;
  char r[32], l[32], p[32], m[32];
  wl__fmt_bytes(f->request, r, sizeof r);
  wl__fmt_bytes(f->live, l, sizeof l);
  wl__fmt_bytes(f->physical, p, sizeof p);
  if (f->limit)
    wl__fmt_bytes(f->limit, m, sizeof m);
  else
    snprintf(m, sizeof m, "none");
  int n = snprintf(buf, len, "cannot allocate %s (%zu bytes): %s (live %s, physical %s, limit %s)",
                   r, f->request, f->what, l, p, m);
  return n < 0 ? -EINVAL : 0;
}

const char *wl_format_bytes(size_t bytes, char *buf, size_t len) {
  return wl__fmt_bytes(bytes, buf, len);
}

void wl__hook(wl_alloc_t *a, wl_alloc_event_kind_t kind, uintptr_t ptr, size_t size,
              wl_stream_t stream) {
  wl_alloc_event_t ev = {wl__now_ns(), kind, ptr, size, stream};
  a->cfg.hook(a->cfg.hook_arg, &ev);
}

#define HOOK(a, kind, ptr, size, stream)                                                           \
  do {                                                                                             \
    if (WL_UNLIKELY((a)->cfg.hook)) wl__hook(a, kind, ptr, size, stream);                          \
  } while (0)

/* ---- the lock ---------------------------------------------------------------------------------*/

static inline void cpu_relax(void) {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#elif defined(__aarch64__)
  __asm__ volatile("yield");
#endif
}

void wl__lock_slow(int *lk) {
  /* A holder keeps it for a microsecond or so: spin a little before sleeping. */
  for (int i = 0; i < 100; i++) {
    cpu_relax();
    int c = 0;
    if (__atomic_load_n(lk, __ATOMIC_RELAXED) == 0 &&
        __atomic_compare_exchange_n(lk, &c, 1, false, __ATOMIC_ACQUIRE, __ATOMIC_RELAXED))
      return;
  }
  /* Taken as 2 from here on: whoever unlocks wakes a sleeper, perhaps needlessly. */
  while (__atomic_exchange_n(lk, 2, __ATOMIC_ACQUIRE) != 0)
    syscall(SYS_futex, lk, FUTEX_WAIT_PRIVATE, 2, NULL, NULL, 0);
}

void wl__unlock_slow(int *lk) {
  syscall(SYS_futex, lk, FUTEX_WAKE_PRIVATE, 1, NULL, NULL, 0);
}

/* ---- the default budget: a local limit -------------------------------------------------------*/

static int local_acquire(void *ctx, size_t bytes, uint64_t deadline_ns) {
  wl_alloc_t *a = ctx;
  (void)deadline_ns; /* nobody else releases a local budget: waiting cannot help */
  if (a->local_limit && (bytes > a->local_limit || a->local_used > a->local_limit - bytes))
    return -ENOMEM;
  a->local_used += bytes;
  return 0;
}

static void local_release(void *ctx, size_t bytes) {
  wl_alloc_t *a = ctx;
  a->local_used = wl__sub_sat(a->local_used, bytes);
}

static size_t local_limit(void *ctx) {
  return ((wl_alloc_t *)ctx)->local_limit;
}

/* ---- block structs
 * -----------------------------------------------------------------------------*/

static wl__block_t *block_new(wl_alloc_t *a) {
  if (!a->block_pool) {
    if (a->nblock_slabs == a->cap_block_slabs) {
      size_t cap = a->cap_block_slabs ? a->cap_block_slabs * 2 : 16;
      void **n = realloc(a->block_slabs, cap * sizeof *n);
      if (!n) return NULL;
      a->block_slabs = n;
      a->cap_block_slabs = cap;
    }
    wl__block_t *batch = malloc(BLOCK_BATCH * sizeof *batch);
    if (!batch) return NULL;
    a->block_slabs[a->nblock_slabs++] = batch;
    for (size_t i = 0; i < BLOCK_BATCH; i++) {
      batch[i].next = a->block_pool;
      a->block_pool = &batch[i];
    }
  }
  wl__block_t *b = a->block_pool;
  a->block_pool = b->next;
  /* Field by field: memset is a call here, and every user sets the address, size, region, state
   * and tag, and its tree and list links when it files the block. */
  b->prev = b->next = b->left = b->right = b->parent = b->fprev = b->fnext = NULL;
  b->stream = NULL;
  b->slab = NULL;
  b->seq = 0;
  b->req = 0;
  return b;
}

static void block_put(wl_alloc_t *a, wl__block_t *b) {
  b->next = a->block_pool;
  a->block_pool = b;
}

wl__pending_t *wl__pending_new(wl_alloc_t *a) {
  wl__pending_t *p = a->pend_pool;
  if (p) {
    a->pend_pool = p->next;
    return p;
  }
  return malloc(sizeof *p);
}

void wl__pending_put(wl_alloc_t *a, wl__pending_t *p) {
  p->next = a->pend_pool;
  a->pend_pool = p;
}

/* ---- chunks
 * --------------------------------------------------------------------------------------*/

/* Adds (sign > 0) or removes busy bytes over [addr, addr+len) of region r. A mapped chunk whose
 * busy count reaches zero can be unmapped. */
static inline void busy_one(wl_alloc_t *a, wl__region_t *r, size_t c, size_t ov, int sign) {
  size_t *bc = &r->busy[c];
  if (sign > 0) {
    if (*bc == 0 && r->mapped[c]) a->empty_mapped--;
    *bc += ov;
  } else {
    *bc = wl__sub_sat(*bc, ov);
    if (*bc == 0 && r->mapped[c]) a->empty_mapped++;
  }
}

static void busy_add(wl_alloc_t *a, wl__region_t *r, uintptr_t addr, size_t len, int sign) {
  size_t off = addr - r->base, c = wl__chunk_of(a, off);
  /* Chunk by chunk from the first: the rest of it, then whole ones, then what is left. */
  for (size_t part = (c + 1) * a->chunk - off; len; c++, part = a->chunk) {
    size_t ov = len < part ? len : part;
    busy_one(a, r, c, ov, sign);
    len -= ov;
  }
}

/* A chunk's grant the provider could not turn into memory. */
static void budget_refund(wl_alloc_t *a) {
  if (a->budget.refund)
    a->budget.refund(a->budget.ctx, a->chunk);
  else
    a->budget.release(a->budget.ctx, a->chunk);
}

static void phys_release(wl_alloc_t *a, void *h) {
  a->prov.phys_release(a->prov.ctx, h, a->chunk);
  /* The event before the budget hears of it: another process may take the bytes at once, and
   * its trace must not show them taken before ours shows them given back. */
  HOOK(a, WL_ALLOC_EV_PHYS_RELEASE, 0, a->chunk, NULL);
  a->budget.release(a->budget.ctx, a->chunk);
  WL__ST_SUB(a, physical_bytes, a->chunk);
  WL__ST_ADD(a, phys_releases, 1);
}

/* Gives cached handles back until the cache holds at most keep bytes. */
static void phys_cache_trim(wl_alloc_t *a, size_t keep) {
  while (a->phys_cache_len && a->phys_cache_len * a->chunk > keep) {
    WL__ST_SUB(a, cached_bytes, a->chunk);
    phys_release(a, a->phys_cache[--a->phys_cache_len]);
  }
}

/* Keeps an unmapped handle for reuse when the cache has room (or force), else gives it back.
 * While a thread waits for the budget nothing is kept: the wait ends only when the budget gets
 * memory back. */
static void phys_cache_put(wl_alloc_t *a, void *h, bool force) {
  bool room = !a->budget_waiters && (a->phys_cache_len + 1) * a->chunk <= a->cfg.phys_cache_limit;
  if ((room || force) && a->phys_cache_len == a->phys_cache_cap) {
    size_t cap = a->phys_cache_cap ? a->phys_cache_cap * 2 : 16;
    void **n = realloc(a->phys_cache, cap * sizeof *n);
    if (n) {
      a->phys_cache = n;
      a->phys_cache_cap = cap;
    }
  }
  if ((room || force) && a->phys_cache_len < a->phys_cache_cap) {
    a->phys_cache[a->phys_cache_len++] = h;
    WL__ST_ADD(a, cached_bytes, a->chunk);
    return;
  }
  phys_release(a, h);
}

static int unmap_chunk(wl_alloc_t *a, wl__region_t *r, size_t c, void **handle) {
  uintptr_t addr = r->base + c * a->chunk;
  int rc = a->prov.unmap(a->prov.ctx, addr, a->chunk);
  if (rc) {
    if (rc == -ESHUTDOWN) return rc; /* the driver is gone: the process is exiting */
    wl__warn_once("unmapping %zu bytes at %#lx failed (%d); keeping it mapped", a->chunk,
                  (unsigned long)addr, rc);
    return rc;
  }
  *handle = r->handle[c];
  r->handle[c] = NULL;
  r->mapped[c] = 0;
  if (r->busy[c] == 0) a->empty_mapped--;
  WL__ST_SUB(a, mapped_bytes, a->chunk);
  WL__ST_ADD(a, unmaps, 1);
  HOOK(a, WL_ALLOC_EV_UNMAP, addr, a->chunk, NULL);
  return 0;
}

/* Finds an empty mapped chunk outside [x0, x1] of region xr, highest address first. */
static bool find_empty_chunk(wl_alloc_t *a, const wl__region_t *xr, size_t x0, size_t x1,
                             wl__region_t **out_r, size_t *out_c) {
  if (!a->empty_mapped) return false;
  for (uint32_t i = a->nregions; i-- > 0;) {
    wl__region_t *r = &a->regions[i];
    for (size_t c = r->nchunks; c-- > 0;) {
      if (!r->mapped[c] || r->busy[c]) continue;
      if (r == xr && c >= x0 && c <= x1) continue;
      *out_r = r;
      *out_c = c;
      return true;
    }
  }
  return false;
}

/* Gets a physical handle of one chunk: from the cache, from the budget and the provider, or by
 * unmapping an empty chunk elsewhere; last, waits for the budget. The wait drops the lock, so
 * the caller must re-examine its chunk afterwards. */
static int get_handle(wl_alloc_t *a, wl__region_t *xr, size_t x0, size_t x1, void **h) {
  if (a->phys_cache_len) {
    *h = a->phys_cache[--a->phys_cache_len];
    WL__ST_SUB(a, cached_bytes, a->chunk);
    return 0;
  }
  /* Move an empty chunk's memory here rather than grow: remapping costs less than creating
   * (cuMemUnmap ~25 us against cuMemCreate ~190 us) and keeps physical memory near live
   * memory when free address space is fragmented. */
  wl__region_t *r;
  size_t c;
  if (find_empty_chunk(a, xr, x0, x1, &r, &c) && unmap_chunk(a, r, c, h) == 0) return 0;
  bool device_full = false;
  int rc = a->budget.acquire(a->budget.ctx, a->chunk, 0);
  if (rc == 0) {
    rc = a->prov.phys_create(a->prov.ctx, a->chunk, h);
    if (rc == 0) goto created;
    budget_refund(a);
    device_full = rc == -ENOMEM; /* the budget had room: memory it cannot see fills the device */
  }
  if (rc == -ENOMEM && a->budget.acquire != local_acquire && a->cfg.alloc_timeout_ms &&
      (!device_full || a->budget.wait_release)) {
    /* Wait for other processes to give memory back, without holding our lock so our own
     * threads can free meanwhile. */
    uint64_t deadline = wl__now_ns() + (uint64_t)a->cfg.alloc_timeout_ms * 1000000ull;
    a->budget_waiters++; /* our frees meanwhile go to the budget (wl__feed_waiters) */
    if (device_full) WL__ST_ADD(a, device_full_waits, 1);
    for (;;) {
      wl__unlock(a);
      rc = 0;
      if (device_full) {
        rc = a->budget.wait_release(a->budget.ctx, a->chunk, deadline);
        rc = rc == -EAGAIN ? 0 : rc;
      }
      /* Waiting for the ledger only when it has no room now (a wait is counted and traced). */
      if (rc == 0 && (rc = a->budget.acquire(a->budget.ctx, a->chunk, 0)) != 0)
        rc = a->budget.acquire(a->budget.ctx, a->chunk, deadline);
      wl__lock(a);
      if (rc) break;
      rc = a->prov.phys_create(a->prov.ctx, a->chunk, h);
      if (rc == 0) break;
      budget_refund(a);
      device_full = rc == -ENOMEM;
      if (!device_full || !a->budget.wait_release) break;
    }
    a->budget_waiters--;
    if (rc == 0) goto created;
    if (device_full && rc == -ETIMEDOUT) rc = -ENOMEM; /* the device's refusal, not the budget's */
  }
  WL__ST_ADD(a, budget_denials, 1);
  HOOK(a, WL_ALLOC_EV_BUDGET_DENY, 0, a->chunk, NULL);
  return rc ? rc : -ENOMEM;
created:
  WL__ST_ADD(a, physical_bytes, a->chunk);
  WL__ST_ADD(a, phys_creates, 1);
  if (a->st.physical_bytes > a->st.physical_peak)
    WL__ST_SET(a, physical_peak, a->st.physical_bytes);
  return 0;
}

/* While a thread of ours waits for the budget (our lock dropped), memory our other threads free
 * must reach the budget: the waiter sleeps in budget.acquire until the budget gets memory back,
 * and an empty chunk or a cached handle kept here would let it sleep to its deadline and fail.
 * Called with the lock at the end of the calls that can empty chunks; the waiter's own chunks are
 * busy, so they stay. */
void wl__feed_waiters(wl_alloc_t *a) {
  phys_cache_trim(a, 0);
  for (uint32_t i = a->nregions; i-- > 0 && a->empty_mapped;) {
    wl__region_t *r = &a->regions[i];
    for (size_t c = r->nchunks; c-- > 0 && a->empty_mapped;) {
      void *h;
      if (r->mapped[c] && !r->busy[c] && unmap_chunk(a, r, c, &h) == 0) phys_release(a, h);
    }
  }
}

/* Maps every unmapped chunk under [addr, addr+len) of region r. 0 or negative errno. */
static int ensure_mapped(wl_alloc_t *a, wl__region_t *r, uintptr_t addr, size_t len) {
  size_t c0 = wl__chunk_of(a, addr - r->base), c1 = wl__chunk_of(a, addr + len - 1 - r->base);
  for (size_t c = c0; c <= c1; c++) {
    if (r->mapped[c]) continue;
    void *h;
    int rc = get_handle(a, r, c0, c1, &h);
    if (rc) return rc;
    if (r->mapped[c]) {
      /* Another thread mapped it while we waited for the budget. */
      phys_cache_put(a, h, true);
      continue;
    }
    uintptr_t caddr = r->base + c * a->chunk;
    rc = a->prov.map(a->prov.ctx, caddr, a->chunk, h);
    if (rc) {
      phys_cache_put(a, h, true);
      return rc;
    }
    r->mapped[c] = 1;
    r->handle[c] = h;
    if (r->busy[c] == 0) a->empty_mapped++;
    WL__ST_ADD(a, mapped_bytes, a->chunk);
    WL__ST_ADD(a, maps, 1);
    if (a->st.mapped_bytes > a->st.mapped_peak) WL__ST_SET(a, mapped_peak, a->st.mapped_bytes);
    HOOK(a, WL_ALLOC_EV_MAP, caddr, a->chunk, NULL);
  }
  return 0;
}

/* ---- regions
 * -------------------------------------------------------------------------------------*/

static void fifo_remove(wl__stream_t *s, wl__block_t *b) {
  if (b->fprev)
    b->fprev->fnext = b->fnext;
  else
    s->fifo_head = b->fnext;
  if (b->fnext)
    b->fnext->fprev = b->fprev;
  else
    s->fifo_tail = b->fprev;
  b->fprev = b->fnext = NULL;
}

static void fifo_append(wl__stream_t *s, wl__block_t *b) {
  b->fnext = NULL;
  b->fprev = s->fifo_tail;
  if (s->fifo_tail)
    s->fifo_tail->fnext = b;
  else
    s->fifo_head = b;
  s->fifo_tail = b;
}

/* Takes a free block out of its tree, or its stream's list (and tree). */
static void free_detach(wl_alloc_t *a, wl__block_t *b) {
  wl__stream_t *s = b->stream;
  if (!s) {
    wl__tree_remove(&a->any_tree, b);
    return;
  }
  fifo_remove(s, b);
  if (s->treed) {
    wl__tree_remove(&s->tree, b);
    if (s->nfifo - 1 <= WL__FIFO_FLAT) { /* the nodes' links go stale: a new tree resets them */
      s->tree = NULL;
      s->treed = false;
    }
  }
  s->nfifo--;
  s->tagged_bytes -= b->size;
  WL__ST_SUB(a, pending_bytes, b->size);
}

/* Files a tagged free block in its stream's list, and in its tree when the list is long. */
static void tagged_attach(wl_alloc_t *a, wl__block_t *b) {
  wl__stream_t *s = b->stream;
  fifo_append(s, b);
  s->nfifo++;
  if (s->treed) {
    wl__tree_insert(&s->tree, b);
  } else if (s->nfifo > WL__FIFO_TREE) {
    for (wl__block_t *t = s->fifo_head; t; t = t->fnext) wl__tree_insert(&s->tree, t);
    s->treed = true;
  }
  s->tagged_bytes += b->size;
  WL__ST_ADD(a, pending_bytes, b->size);
}

/* The best fit among s's tagged free blocks: the smallest (size, address) of at least size. */
static wl__block_t *tagged_fit(const wl__stream_t *s, size_t size) {
  if (s->treed) return wl__tree_lower_bound(s->tree, size);
  wl__block_t *best = NULL;
  for (wl__block_t *b = s->fifo_head; b; b = b->fnext)
    if (b->size >= size &&
        (!best || b->size < best->size || (b->size == best->size && b->addr < best->addr)))
      best = b;
  return best;
}

/* The size trees' order. */
static bool key_less(const wl__block_t *x, const wl__block_t *y) {
  return x->size < y->size || (x->size == y->size && x->addr < y->addr);
}

/* Whether free block b may absorb its free neighbour n. Untagged blocks always merge. Blocks
 * tagged with the same stream merge only when both were freed before the stream's last recorded
 * event or both after it: a merged block keeps the later sequence number, and without this rule
 * a stream that keeps freeing next to its pending memory would keep raising that number, so the
 * memory would not become reusable elsewhere for as long as the stream stays busy (on
 * wl-bench-alloc's DNN trace a communication stream's pending block grew to 184 MiB). */
static inline bool mergeable(const wl__block_t *b, const wl__block_t *n) {
  if (!n || n->state != WL__B_FREE || n->stream != b->stream) return false;
  if (!b->stream) return true;
  uint64_t r = b->stream->recorded_seq;
  return (b->seq > r) == (n->seq > r);
}

/* Merges free block hi into lo, the block just below it: lo's struct stays, with the later
 * sequence number, and hi's goes back to the pool. Returns lo. */
static wl__block_t *absorb(wl_alloc_t *a, wl__block_t *lo, wl__block_t *hi) {
  lo->size += hi->size;
  lo->next = hi->next;
  if (hi->next) hi->next->prev = lo;
  if (hi->seq > lo->seq) lo->seq = hi->seq;
  block_put(a, hi);
  return lo;
}

/* An untagged block's merges keep the first neighbour's node in the tree (in_tree, filed under a
 * key that only grows) rather than taking it out and filing the merged block anew. (Adjacent
 * untagged free blocks never both exist: at most one merge on either side.) */
static void untagged_attach(wl_alloc_t *a, wl__block_t *b) {
  wl__block_t *n, *in_tree = NULL;
  while (mergeable(b, n = b->prev)) {
    if (in_tree) wl__tree_remove(&a->any_tree, in_tree); /* b itself: n keeps its place */
    in_tree = n;
    b = absorb(a, n, b);
  }
  while (mergeable(b, n = b->next)) {
    if (!in_tree)
      wl__tree_replace(&a->any_tree, n, in_tree = b);
    else
      free_detach(a, n);
    absorb(a, b, n);
  }
  b->state = WL__B_FREE;
  if (in_tree) {
    wl__block_t *nx = wl__tree_next(b);
    if (!nx || key_less(b, nx)) return; /* still in order where it is */
    wl__tree_remove(&a->any_tree, b);
  }
  wl__tree_insert(&a->any_tree, b);
}

/* Merges free block b (detached, state FREE, tag set) with the free neighbours it may absorb,
 * then files it. Same-stream neighbours keep the later sequence number, so reuse stays safe. */
static void free_attach(wl_alloc_t *a, wl__block_t *b) {
  if (!b->stream) {
    untagged_attach(a, b);
    return;
  }
  wl__block_t *n;
  while (mergeable(b, n = b->prev)) {
    free_detach(a, n);
    b = absorb(a, n, b);
  }
  while (mergeable(b, n = b->next)) {
    free_detach(a, n);
    absorb(a, b, n);
  }
  b->state = WL__B_FREE;
  tagged_attach(a, b);
}

/* A region's starts: a word per 64 KiB (20 MiB for a 160 GiB range) from mmap, so the pages
 * nothing starts in are never touched, and so that the malloc of the process (whose mmap
 * threshold rises when it frees a mapped chunk) does not see them. NULL without memory. */
static uintptr_t *starts_new(size_t region_size) {
  size_t len = ((region_size >> WL__START_SHIFT) + 1) * sizeof(uintptr_t);
  void *p =
      mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  return p == MAP_FAILED ? NULL : p;
}

static void starts_free(uintptr_t *starts, size_t region_size) {
  if (starts) munmap(starts, ((region_size >> WL__START_SHIFT) + 1) * sizeof(uintptr_t));
}

static int region_add(wl_alloc_t *a, size_t size) {
  if (a->nregions == WL__MAX_REGIONS) return -ENOMEM;
  size = wl__round_up(size, a->chunk);
  if (!size) return -ENOMEM;
  wl__region_t *r = &a->regions[a->nregions];
  memset(r, 0, sizeof *r);
  r->nchunks = size / a->chunk;
  r->mapped = calloc(r->nchunks, 1);
  r->handle = calloc(r->nchunks, sizeof *r->handle);
  r->busy = calloc(r->nchunks, sizeof *r->busy);
  r->starts = starts_new(size);
  wl__block_t *b = block_new(a);
  int rc = -ENOMEM;
  if (r->mapped && r->handle && r->busy && r->starts && b)
    rc = a->prov.reserve(a->prov.ctx, size, &r->base);
  if (rc) {
    free(r->mapped);
    free(r->handle);
    free(r->busy);
    starts_free(r->starts, size);
    if (b) block_put(a, b);
    memset(r, 0, sizeof *r);
    return rc;
  }
  r->size = size;
  r->head = b; /* the lowest block absorbs its neighbours, so it stays the head */
  b->addr = r->base;
  b->size = size;
  b->region = (uint8_t)a->nregions;
  b->state = WL__B_FREE;
  __atomic_store_n(&a->nregions, a->nregions + 1, __ATOMIC_RELEASE); /* wl__start_get reads it */
  WL__ST_ADD(a, reserved_bytes, size);
  wl__tree_insert(&a->any_tree, b);
  return 0;
}

/* Files allocated large block b in its region's starts, or takes it out. */
static void start_put(wl_alloc_t *a, wl__block_t *b) {
  wl__region_t *r = &a->regions[b->region];
  uintptr_t off = b->addr - r->base;
  __atomic_store_n(&r->starts[off >> WL__START_SHIFT], (uintptr_t)b | ((off >> 12) & 15),
                   __ATOMIC_RELEASE);
  a->nstarts++;
}

static void start_del(wl_alloc_t *a, wl__block_t *b) {
  wl__region_t *r = &a->regions[b->region];
  __atomic_store_n(&r->starts[(b->addr - r->base) >> WL__START_SHIFT], (uintptr_t)0,
                   __ATOMIC_RELEASE);
  a->nstarts--;
}

void *wl__addr_get(wl_alloc_t *a, uintptr_t p) {
  wl__block_t *b = wl__start_get(a, p);
  return b ? (void *)b : wl__ptrmap_get(&a->ptrs, p);
}

void wl__addr_del(wl_alloc_t *a, uintptr_t p, void *v) {
  if ((uintptr_t)v & 1)
    wl__ptrmap_del(&a->ptrs, p);
  else
    start_del(a, v);
}

static wl__region_t *region_find(wl_alloc_t *a, uintptr_t p) {
  for (uint32_t i = 0; i < a->nregions; i++)
    if (p >= a->regions[i].base && p - a->regions[i].base < a->regions[i].size)
      return &a->regions[i];
  return NULL;
}

/* ---- streams and events
 * --------------------------------------------------------------------------*/

static size_t stream_slot(wl_stream_t h, size_t cap) {
  return (size_t)(((uint64_t)(uintptr_t)h * 0x9E3779B97F4A7C15ull) >> 24) & (cap - 1);
}

static int stream_table_put(wl_alloc_t *a, wl__stream_t *s) {
  if ((a->stream_count + 1) * 2 > a->stream_cap) {
    size_t cap = a->stream_cap ? a->stream_cap * 2 : 16;
    wl__stream_t **t = calloc(cap, sizeof *t);
    if (!t) return -ENOMEM;
    for (size_t i = 0; i < a->stream_cap; i++) {
      wl__stream_t *o = a->streams[i];
      if (!o) continue;
      size_t j = stream_slot(o->handle, cap);
      while (t[j]) j = (j + 1) & (cap - 1);
      t[j] = o;
    }
    free(a->streams);
    a->streams = t;
    a->stream_cap = cap;
  }
  size_t j = stream_slot(s->handle, a->stream_cap);
  while (a->streams[j]) j = (j + 1) & (a->stream_cap - 1);
  a->streams[j] = s;
  a->stream_count++;
  s->live_prev = NULL;
  s->live_next = a->live_streams;
  if (a->live_streams) a->live_streams->live_prev = s;
  a->live_streams = s;
  return 0;
}

static void stream_table_del(wl_alloc_t *a, wl__stream_t *s) {
  size_t mask = a->stream_cap - 1, i = stream_slot(s->handle, a->stream_cap);
  while (a->streams[i] != s) i = (i + 1) & mask;
  a->streams[i] = NULL;
  a->stream_count--;
  if (s->live_prev)
    s->live_prev->live_next = s->live_next;
  else
    a->live_streams = s->live_next;
  if (s->live_next) s->live_next->live_prev = s->live_prev;
  /* Re-file the rest of the probe run. */
  for (size_t j = (i + 1) & mask; a->streams[j]; j = (j + 1) & mask) {
    wl__stream_t *o = a->streams[j];
    a->streams[j] = NULL;
    size_t k = stream_slot(o->handle, a->stream_cap);
    while (a->streams[k]) k = (k + 1) & mask;
    a->streams[k] = o;
  }
}

/* The live stream record for handle h, or NULL. */
static wl__stream_t *stream_find(wl_alloc_t *a, wl_stream_t h) {
  if (!a->stream_cap) return NULL;
  size_t mask = a->stream_cap - 1;
  wl__stream_t *s;
  for (size_t i = stream_slot(h, a->stream_cap); (s = a->streams[i]); i = (i + 1) & mask)
    if (s->handle == h) return s;
  return NULL;
}

/* The stream record for handle h, created (and checked with the provider) on first sight. */
static wl__stream_t *stream_get(wl_alloc_t *a, wl_stream_t h) {
  wl__stream_t *s = a->last_stream;
  if (WL_LIKELY(s && s->handle == h)) return s;
  if ((s = stream_find(a, h))) {
    a->last_stream = s;
    return s;
  }
  if (a->prov.stream_check && a->prov.stream_check(a->prov.ctx, h)) return NULL;
  s = calloc(1, sizeof *s);
  if (!s) return NULL;
  s->handle = h;
  if (stream_table_put(a, s)) {
    free(s);
    return NULL;
  }
  a->last_stream = s;
  return s;
}

wl__stream_t *wl__stream_get(wl_alloc_t *a, wl_stream_t h) {
  return stream_get(a, h);
}

static void *event_get(wl_alloc_t *a) {
  if (a->ev_pool_len) return a->ev_pool[--a->ev_pool_len];
  void *ev = NULL;
  if (a->prov.event_create(a->prov.ctx, &ev)) return NULL;
  return ev;
}

static void event_put(wl_alloc_t *a, void *ev) {
  if (a->ev_pool_len == a->ev_pool_cap) {
    size_t cap = a->ev_pool_cap ? a->ev_pool_cap * 2 : 16;
    void **n = realloc(a->ev_pool, cap * sizeof *n);
    if (!n) {
      a->prov.event_destroy(a->prov.ctx, ev);
      return;
    }
    a->ev_pool = n;
    a->ev_pool_cap = cap;
  }
  a->ev_pool[a->ev_pool_len++] = ev;
}

/* Records one event covering every free on s so far (frees record nothing themselves: one
 * event per round, not per free). */
static void stream_record(wl_alloc_t *a, wl__stream_t *s) {
  if (s->dead || s->free_seq <= s->recorded_seq) return;
  if (s->evq_len == s->evq_cap) {
    uint32_t cap = s->evq_cap ? s->evq_cap * 2 : 8;
    wl__evrec_t *q = malloc(cap * sizeof *q);
    if (!q) return;
    for (uint32_t i = 0; i < s->evq_len; i++) q[i] = s->evq[(s->evq_head + i) % s->evq_cap];
    free(s->evq);
    s->evq = q;
    s->evq_cap = cap;
    s->evq_head = 0;
  }
  void *ev = event_get(a);
  if (!ev) {
    wl__warn_once("cannot create a stream event; freed memory waits for its stream");
    return;
  }
  int rc = a->prov.event_record(a->prov.ctx, ev, s->handle);
  if (rc == -EAGAIN) {
    /* Not now (s captures a graph) or not from this thread (another thread's per-thread default
     * stream): its frees stay pending, reusable on s alone, until a record that can covers
     * them. */
    event_put(a, ev);
    return;
  }
  if (rc) {
    event_put(a, ev);
    if (rc == -ESHUTDOWN) return; /* the driver is gone: the process is exiting */
    wl__warn_once("recording an event on stream %p failed (%d); was it destroyed without "
                  "wl_alloc_stream_forget?",
                  s->handle, rc);
    return;
  }
  s->evq[(s->evq_head + s->evq_len) % s->evq_cap] = (wl__evrec_t){ev, s->free_seq};
  s->evq_len++;
  s->recorded_seq = s->free_seq;
  s->unrec_bytes = 0;
  WL__ST_ADD(a, events_recorded, 1);
}

static bool stream_idle(const wl__stream_t *s) {
  for (int c = 0; c < WL__NCLASSES; c++)
    if (s->partial[c] || s->empty[c]) return false;
  return !s->fifo_head && !s->pend_head && s->evq_len == 0;
}

/* Makes the blocks and objects freed on s up to done_seq reusable anywhere. */
static void stream_release_done(wl_alloc_t *a, wl__stream_t *s) {
  while (s->fifo_head && s->fifo_head->seq <= s->done_seq) {
    wl__block_t *b = s->fifo_head;
    free_detach(a, b);
    b->stream = NULL;
    busy_add(a, &a->regions[b->region], b->addr, b->size, -1);
    free_attach(a, b);
  }
  while (s->pend_head && s->pend_head->seq <= s->done_seq) {
    wl__pending_t *p = s->pend_head;
    s->pend_head = p->next;
    if (!s->pend_head) s->pend_tail = NULL;
    WL__ST_SUB(a, pending_bytes, p->slab->objsize);
    wl__small_release(a, p->slab, p->index, s);
    wl__pending_put(a, p);
  }
}

/* Polls s's events in order and makes the blocks and objects they cover reusable anywhere. */
static void stream_process(wl_alloc_t *a, wl__stream_t *s) {
  if (s->fifo_head || s->pend_head) stream_record(a, s);
  while (s->evq_len) {
    wl__evrec_t *e = &s->evq[s->evq_head];
    if (a->prov.event_query(a->prov.ctx, e->ev) != 0) break;
    s->done_seq = e->seq;
    event_put(a, e->ev);
    s->evq_head = (s->evq_head + 1) % s->evq_cap;
    s->evq_len--;
  }
  stream_release_done(a, s);
}

static void process_all(wl_alloc_t *a) {
  for (wl__stream_t *s = a->live_streams; s; s = s->live_next) stream_process(a, s);
  for (wl__stream_t **pp = &a->dead_streams; *pp;) {
    wl__stream_t *s = *pp;
    stream_process(a, s);
    if (stream_idle(s) && !s->nslabs && !s->tc_refs) {
      *pp = s->dead_next;
      free(s->evq);
      free(s);
    } else {
      pp = &s->dead_next;
    }
  }
}

/* ---- large blocks
 * ---------------------------------------------------------------------------------*/

/* True when the first size bytes of b lie on some unmapped chunk. */
static bool needs_mapping(wl_alloc_t *a, const wl__block_t *b, size_t size) {
  const wl__region_t *r = &a->regions[b->region];
  size_t c0 = wl__chunk_of(a, b->addr - r->base),
         c1 = wl__chunk_of(a, b->addr + size - 1 - r->base);
  for (size_t c = c0; c <= c1; c++)
    if (!r->mapped[c]) return true;
  return false;
}

/* A best fit this many times the request, and a chunk larger, counts as cutting a large hole. */
#define CUT_RATIO 64

static wl__block_t *best_fit(wl_alloc_t *a, size_t size, wl__stream_t *s) {
  wl__block_t *own = s->fifo_head ? tagged_fit(s, size) : NULL;
  wl__block_t *any = wl__tree_lower_bound(a->any_tree, size);
  wl__block_t *b = own && any ? (own->size <= any->size ? own : any) : own ? own : any;
  if (b && b->size / CUT_RATIO >= size && b->size - size >= a->chunk) {
    /* A small request would cut a large hole. The top of the address space (the largest
     * untagged block, last in its region) is mapped only up to about the last chunk in use, and
     * that mapped part is a hole of its own: a request it holds goes there, keeping the large
     * hole whole for the large request that will want it. (On a transformer trace, a slab cut
     * from a freed 2 GiB logits buffer made the next 2 GiB buffer map new memory.) */
    wl__block_t *top = wl__tree_max(a->any_tree);
    /* top may be smaller than the request when b is the stream's own pending block. */
    if (top && top != b && top->size >= size && !top->next && !needs_mapping(a, top, size)) b = top;
  }
  return b;
}

static bool joinable(const wl__block_t *n, const wl__stream_t *s) {
  return n && n->state == WL__B_FREE && (!n->stream || n->stream == s);
}

/* Splits free block b (detached) at addr with the spare struct rest: b keeps the part below, and
 * the part above, with b's tag, is filed as a free block of its own. */
static void split_off(wl_alloc_t *a, wl__block_t *b, uintptr_t addr, wl__block_t *rest) {
  rest->addr = addr;
  rest->size = b->addr + b->size - addr;
  rest->region = b->region;
  rest->stream = b->stream;
  rest->seq = b->seq;
  rest->prev = b;
  rest->next = b->next;
  if (b->next) b->next->prev = rest;
  b->next = rest;
  b->size = addr - b->addr;
  uint8_t st = b->state;
  b->state = WL__B_ALLOC; /* so that rest does not merge back into b */
  free_attach(a, rest);
  b->state = st;
}

/* Splits untagged free block b (in the tree) at b->addr + size when the rest, whose key is
 * smaller than b's, can take b's place in the tree: b comes out allocated, the rest free. The
 * rest does not merge: b's neighbours were not untagged free blocks either. */
static bool split_in_place(wl_alloc_t *a, wl__block_t *b, size_t size, wl__block_t *rest) {
  rest->addr = b->addr + size;
  rest->size = b->size - size;
  wl__block_t *pv = wl__tree_prev(b);
  if (pv && !key_less(pv, rest)) return false;
  rest->region = b->region;
  rest->stream = NULL;
  rest->seq = b->seq;
  rest->state = WL__B_FREE;
  rest->prev = b;
  rest->next = b->next;
  if (b->next) b->next->prev = rest;
  b->next = rest;
  wl__tree_replace(&a->any_tree, b, rest);
  b->size = size;
  b->state = WL__B_ALLOC;
  return true;
}

/* Freed memory of stream s stays apart from untagged neighbours (other streams must wait for
 * it), so a request of s may find no single block although s could use a run of adjacent ones,
 * each untagged or tagged with s. Before new physical memory is mapped for s, look for the
 * smallest such run whose first size bytes are mapped, and take exactly those bytes as one
 * detached block tagged with s; the rest of the run keeps its tags. NULL when there is none.
 * Runs are looked up from s's tagged blocks: a few dozen, and only on this slow path. */
static wl__block_t *coalesce_fit(wl_alloc_t *a, size_t size, wl__stream_t *s) {
  wl__block_t *best = NULL;
  size_t best_len = SIZE_MAX;
  for (wl__block_t *t = s->fifo_head; t; t = t->fnext) {
    wl__block_t *first = t;
    bool lowest = true;
    while (lowest && joinable(first->prev, s)) {
      first = first->prev;
      lowest = !first->stream;
    }
    if (!lowest) continue; /* the run is examined once, from its lowest tagged block */
    size_t len = 0;
    wl__block_t *n = first;
    for (; joinable(n, s); n = n->next) len += n->size;
    if (len < size || len >= best_len || first->next == n) continue; /* one block: best_fit's */
    wl__block_t probe = *first;
    probe.size = size;
    if (needs_mapping(a, &probe, size)) continue;
    best = first;
    best_len = len;
  }
  wl__block_t *spare = best ? block_new(a) : NULL;
  if (!spare) return NULL;
  wl__region_t *r = &a->regions[best->region];
  uintptr_t end = best->addr + size;
  uint64_t seq = 0;
  for (wl__block_t *n = best; n && n->addr < end; n = best->next) {
    free_detach(a, n);
    if (n->addr + n->size > end) {
      split_off(a, n, end, spare);
      spare = NULL;
    }
    if (n->stream) {
      if (n->seq > seq) seq = n->seq;
    } else {
      busy_add(a, r, n->addr, n->size, +1); /* untagged bytes join s's pending memory */
    }
    if (n != best) {
      best->size += n->size;
      best->next = n->next;
      if (n->next) n->next->prev = best;
      block_put(a, n);
    }
  }
  if (spare) block_put(a, spare);
  best->stream = s;
  best->seq = seq;
  return best;
}

/* Takes a block of exactly size (a multiple of WL__LARGE_ALIGN) for stream s and maps it.
 * Live bytes are the caller's to count. NULL with the failure recorded. */
wl__block_t *wl__large_alloc(wl_alloc_t *a, size_t size, size_t req, wl__stream_t *s) {
  bool detached = false;
  wl__block_t *b = best_fit(a, size, s);
  if (!b) {
    process_all(a);
    b = best_fit(a, size, s);
  }
  if (!b) {
    size_t grow = WL_MAX(a->cfg.va_size, size);
    int rc = region_add(a, grow);
    if (rc) {
      if (rc == -EAGAIN)
        wl__fail(a, rc, req, "the driver refused to reserve address space during a capture");
      else
        wl__fail(a, -ENOMEM, req, "no address space left to reserve");
      return NULL;
    }
    b = best_fit(a, size, s);
  }
  bool mapped = !needs_mapping(a, b, size); /* its first size bytes */
  if (!mapped) {
    /* Before taking new physical memory, give the thread caches' blocks back (they may merge
     * into what this needs) and see whether freed memory of other streams is ready. */
    if (a->tcs) wl__tc_flush_all(a);
    process_all(a);
    b = best_fit(a, size, s);
    if (needs_mapping(a, b, size)) {
      wl__block_t *c = coalesce_fit(a, size, s);
      if (c) {
        b = c;
        detached = true;
      }
    }
  }
  wl__stream_t *tag = b->stream;
  uint64_t seq = b->seq;
  wl__block_t *r =
      b->size - size >= WL__LARGE_ALIGN ? block_new(a) : NULL; /* else b stays larger */
  if (detached || tag || !r || !split_in_place(a, b, size, r)) {
    if (!detached) free_detach(a, b);
    b->state = WL__B_ALLOC;
    if (r) split_off(a, b, b->addr + size, r);
  }
  wl__region_t *reg = &a->regions[b->region];
  if (!tag) busy_add(a, reg, b->addr, b->size, +1);
  b->state = WL__B_ALLOC;
  b->stream = s;
  int rc = mapped && b->size == size ? 0 : ensure_mapped(a, reg, b->addr, b->size);
  if (rc) {
    /* Put it back as it was: a tagged block keeps its pending work. */
    b->stream = tag;
    b->seq = seq;
    if (!tag) busy_add(a, reg, b->addr, b->size, -1);
    free_attach(a, b);
    wl__fail(a, rc, req,
             rc == -ETIMEDOUT ? "timed out waiting for the memory budget"
             : rc == -ENOMEM  ? "the memory budget or the device is full"
             : rc == -EAGAIN  ? "the driver refused to map memory during a capture"
                              : "mapping physical memory failed");
    return NULL;
  }
  return b;
}

void wl__large_free(wl_alloc_t *a, wl__block_t *b, wl__stream_t *s) {
  b->stream = s;
  /* A forgotten stream's final event already covers everything freed on it; when it could not
   * be recorded, free_seq is beyond every event and the block is never reusable elsewhere. */
  b->seq = s->dead ? s->free_seq : ++s->free_seq;
  b->slab = NULL;
  b->req = 0;
  s->unrec_bytes += b->size;
  free_attach(a, b);
  wl__stream_tick(a, s);
}

/* Every 32 frees on a stream, or once it has freed a chunk's worth of bytes since its last
 * event, record an event and poll the older ones, so that memory another stream asks for later
 * is already known to be free: recording only when it is needed would cover work the device has
 * not finished yet, and the other stream would map new memory. The byte count matters where
 * large blocks are freed a few at a time (activations, communication buffers): counting frees
 * alone left up to 31 of them pending, apart from their untagged neighbours, and the DNN trace's
 * peak physical memory rose from 1.03 to 1.07-1.13 times its live peak. An event per 20 MiB
 * freed costs little next to the work that used them. */
void wl__stream_tick(wl_alloc_t *a, wl__stream_t *s) {
  if (((s->free_seq & 31) == 0 || s->unrec_bytes >= a->chunk) && !s->dead) stream_process(a, s);
}

/* ---- public entry points
 * ------------------------------------------------------------------------*/

void wl_alloc_config_default(wl_alloc_config_t *cfg) {
  memset(cfg, 0, sizeof *cfg);
}

static void *trim_main(void *arg);

/* chunk = 2^shift x odd: off / chunk = (off >> shift) / odd, and for y = off >> shift below
 * 2^48 >> shift, y / odd = (y x ceil(2^64 / odd)) >> 64 exactly when y x odd < 2^64 (the
 * rounding error y x (m - 2^64/odd) / 2^64 < y / 2^64 stays below the gap 1/odd to the next
 * whole number). Otherwise mul 0 asks for a shift (odd = 1) or a divide. */
static void chunk_divider(wl_alloc_t *a) {
  unsigned shift = (unsigned)__builtin_ctzll(a->chunk);
  uint64_t odd = a->chunk >> shift;
  a->chunk_shift = shift;
  a->chunk_mul = 0;
  a->chunk_pow2 = odd == 1;
  if (odd == 1) return;
  unsigned __int128 ymax = ((unsigned __int128)1 << 48) >> shift;
  if ((ymax * odd) >> 64) return;
  a->chunk_mul = (uint64_t)(((unsigned __int128)1 << 64) / odd) + 1;
}

int wl_alloc_create(wl_alloc_t **out, const wl_provider_t *provider, const wl_alloc_config_t *cfg) {
  if (!out || !provider) return -EINVAL;
  *out = NULL;
  const wl_provider_t *p = provider;
  if (!p->reserve || !p->unreserve || !p->phys_create || !p->phys_release || !p->map || !p->unmap ||
      !p->event_create || !p->event_destroy || !p->event_record || !p->event_query ||
      !wl__is_pow2(p->granularity)) {
    wl__warn("allocator: provider '%s' is incomplete or has a granularity (%zu) that is not a "
             "power of two",
             p->name ? p->name : "?", p->granularity);
    return -EINVAL;
  }
  wl_alloc_config_t c;
  if (cfg)
    c = *cfg;
  else
    wl_alloc_config_default(&c);
  if (!c.chunk_size) c.chunk_size = WL_MAX((size_t)20 << 20, p->granularity);
  if (c.chunk_size % p->granularity) {
    wl__warn("allocator: chunk size %zu is not a multiple of the granularity %zu", c.chunk_size,
             p->granularity);
    return -EINVAL;
  }
  if (!c.va_size) c.va_size = p->capacity ? p->capacity * 2 : (size_t)64 << 30;
  if (!c.release_threshold) c.release_threshold = c.chunk_size;
  if (!c.trim_interval_ms) c.trim_interval_ms = 100;
  if (c.tcache_off) c.tcache_bytes = 0;

  wl_alloc_t *a = calloc(1, sizeof *a);
  if (!a) return -ENOMEM;
  a->prov = *p;
  a->cfg = c;
  a->chunk = c.chunk_size;
  chunk_divider(a);
  a->max_request = p->capacity && p->capacity < WL__HUGE ? p->capacity : WL__HUGE;
  if (c.budget) {
    a->budget = *c.budget;
  } else {
    a->budget = (wl_budget_t){a, local_acquire, local_release, local_limit, NULL, NULL, NULL};
    a->local_limit = c.mem_limit;
  }
  int rc = -ENOMEM;
  if (pthread_mutex_init(&a->trim_mu, NULL)) goto fail;
  if (wl__ptrmap_init(&a->ptrs, 1024)) goto fail_lock;
  wl__tc_setup(a);
  if ((rc = region_add(a, c.va_size))) {
    wl__warn("allocator: cannot reserve %zu bytes of address space (%d)", c.va_size, rc);
    goto fail_map;
  }
  if (c.trim_thread) {
    pthread_condattr_t ca;
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    pthread_cond_init(&a->trim_cv, &ca);
    pthread_condattr_destroy(&ca);
    if (wl__thread_create(&a->trim_tid, NULL, trim_main, a) == 0)
      a->trim_running = true;
    else
      wl__warn("allocator: cannot start the trim thread; call wl_alloc_trim instead");
  }
  *out = a;
  return 0;
fail_map:
  wl__ptrmap_free(&a->ptrs);
fail_lock:
  pthread_mutex_destroy(&a->trim_mu);
fail:
  free(a);
  return rc;
}

/* Size rounding shared by alloc and check: large blocks to 4 KiB. */
static size_t large_size(size_t size) {
  return wl__align_up(size, WL__LARGE_ALIGN);
}

static void *alloc_locked(wl_alloc_t *a, size_t size, wl__stream_t *s) {
  void *ptr = NULL;
  if (size <= WL__SMALL_MAX) {
    ptr = wl__small_alloc(a, size, s);
    if (ptr) WL__ST_ADD(a, small_allocs, 1);
  } else {
    wl__block_t *b = wl__large_alloc(a, large_size(size), size, s);
    if (b) {
      start_put(a, b);
      __atomic_store_n(&b->req, size, __ATOMIC_RELAXED);
      ptr = (void *)b->addr;
    }
  }
  return ptr;
}

void *wl_alloc_async(wl_alloc_t *a, size_t size, wl_stream_t stream) {
  if (WL_UNLIKELY(!a)) return NULL;
  if (WL_UNLIKELY(size - 1 >= a->max_request)) { /* 0, or over the device or 64 TiB */
    wl__fail(a, size ? -ENOMEM : -EINVAL, size,
             size ? "the request is larger than the device" : "size 0 is not a valid request");
    BAD_CALL(a, "allocate: %s (%zu bytes)", tl_failure.what, size);
    return NULL;
  }
  void *ptr = NULL;
  /* Sizes no cache holds skip it: a miss costs the thread's cache look-up. */
  if (WL_LIKELY(a->tc_limit) && (size <= WL__SMALL_MAX || size <= a->tc_max) &&
      (ptr = wl__tc_alloc(a, size, stream)))
    return ptr;
  wl__lock(a);
  wl__stream_t *s = stream_get(a, stream);
  if (WL_UNLIKELY(!s)) {
    wl__fail(a, -EINVAL, size, "unknown stream");
    wl__unlock(a);
    BAD_CALL(a, "allocate: stream %p is not a stream of this device", stream);
    return NULL;
  }
  ptr = alloc_locked(a, size, s);
  /* The thread caches may hold what this needs (mapped, or mapped memory to move). */
  if (WL_UNLIKELY(!ptr && a->tcs) && wl__tc_flush_all(a)) ptr = alloc_locked(a, size, s);
  if (WL_LIKELY(ptr)) {
    wl__live_add(a, size);
    WL__ST_ADD(a, allocs, 1); /* the caches count their own */
    HOOK(a, WL_ALLOC_EV_ALLOC, (uintptr_t)ptr, size, stream);
  } else {
    WL__ST_ADD(a, ooms, 1);
    HOOK(a, WL_ALLOC_EV_OOM, 0, size, stream);
  }
  if (WL_UNLIKELY(a->budget_waiters)) wl__feed_waiters(a); /* polling may have emptied chunks */
  wl__unlock(a);
  return ptr;
}

/* The requested bytes of the live allocation starting at p, its value v (a block, or a slab | 1)
 * from the pointer map or the starts; 0 when not live (freed into a thread cache included). */
static size_t live_req(uintptr_t p, void *v) {
  if (v && ((uintptr_t)v & 1)) {
    wl__slab_t *slab = (wl__slab_t *)((uintptr_t)v & ~(uintptr_t)1);
    return __atomic_load_n(&slab->req[(p - slab->blk->addr) / slab->objsize], __ATOMIC_RELAXED);
  }
  return v ? __atomic_load_n(&((wl__block_t *)v)->req, __ATOMIC_RELAXED) : 0;
}

/* Another holder of the budget waits for memory: keep none unused. */
static bool pressed(wl_alloc_t *a) {
  return a->budget.pressed && a->budget.pressed(a->budget.ctx);
}

/* The unused mapped memory a trim keeps by default: the threshold, or none while pressed
 * (*press says which). */
static size_t default_keep(wl_alloc_t *a, bool *press) {
  *press = pressed(a);
  return *press ? 0 : a->cfg.release_threshold;
}

int wl_free_async(wl_alloc_t *a, void *ptr, wl_stream_t stream) {
  if (WL_UNLIKELY(!a || !ptr)) {
    BAD_CALL(a, "free: NULL %s", a ? "pointer" : "allocator");
    return -EINVAL;
  }
  uintptr_t p = (uintptr_t)ptr;
  void *v = NULL;
  if (WL_LIKELY(a->tc_limit) && wl__tc_free(a, p, stream, &v) == 0) return 0;
  wl__lock(a);
  const char *bad = NULL;
  wl__stream_t *s = stream_get(a, stream);
  /* The cache's look-up holds while the caller owns p; the check is for a double free racing
   * with a cache that gives p back. */
  wl__block_t *hint = v;
  if (!hint || hint->addr != p || hint->state != WL__B_ALLOC) v = NULL;
  if (!v && s) v = wl__addr_get(a, p);
  if (!s) v = NULL;
  if (!s)
    bad = "unknown stream";
  else if (!v)
    bad = region_find(a, p) ? "double free, or not the start of a block"
                            : "foreign pointer (not allocated here)";
  /* The requested bytes are 0 once freed into a thread cache: then this is a double free. (Not
   * an exchange: two threads freeing one pointer at once is the caller's race.) */
  size_t req = live_req(p, v);
  wl__slab_t *slab = ((uintptr_t)v & 1) ? (wl__slab_t *)((uintptr_t)v & ~(uintptr_t)1) : NULL;
  if (v && !req) bad = "double free (the block is already free)";
  if (WL_UNLIKELY(bad)) {
    wl__unlock(a);
    BAD_CALL(a, "free of %p on stream %p: %s; ignored", ptr, stream, bad);
    return -EINVAL;
  }
  wl__addr_del(a, p, v);
  if (slab)
    wl__small_free(a, slab, p, s);
  else
    wl__large_free(a, v, s);
  wl__live_sub(a, req);
  WL__ST_ADD(a, frees, 1);
  HOOK(a, WL_ALLOC_EV_FREE, p, req, stream);
  /* Wake the trimmer once when unused mapped memory crosses the threshold, or while a peer waits
   * for the budget when a trim can give something back (an empty chunk, or frees waiting for
   * their stream): asked only then, so the common free pays a comparison or two. */
  size_t unused = wl__sub_sat(a->st.mapped_bytes, wl__live(a));
  if (a->trim_running && unused > a->chunk && !__atomic_load_n(&a->trim_kick, __ATOMIC_RELAXED) &&
      (unused - a->chunk > a->cfg.release_threshold ||
       ((a->empty_mapped || a->st.pending_bytes) && pressed(a)))) {
    pthread_mutex_lock(&a->trim_mu);
    __atomic_store_n(&a->trim_kick, true, __ATOMIC_RELAXED);
    pthread_cond_signal(&a->trim_cv);
    pthread_mutex_unlock(&a->trim_mu);
  }
  if (WL_UNLIKELY(a->budget_waiters)) wl__feed_waiters(a);
  wl__unlock(a);
  return 0;
}

size_t wl_alloc_usable_size(wl_alloc_t *a, const void *ptr) {
  if (!a || !ptr) return 0;
  wl__lock(a);
  size_t n = live_req((uintptr_t)ptr, wl__addr_get(a, (uintptr_t)ptr));
  wl__unlock(a);
  return n;
}

void *wl_alloc_base(wl_alloc_t *a, const void *ptr) {
  if (!a || !ptr) return NULL;
  uintptr_t p = (uintptr_t)ptr, base = 0;
  wl__lock(a);
  wl__region_t *r = region_find(a, p);
  /* The region's blocks in address order: rare calls (an IPC export of an interior pointer). */
  for (wl__block_t *b = r ? r->head : NULL; b && b->addr <= p; b = b->next) {
    if (p - b->addr >= b->size) continue;
    if (b->state == WL__B_ALLOC) {
      if (p - b->addr < live_req(b->addr, b)) base = b->addr;
    } else if (b->state == WL__B_SLAB) {
      wl__slab_t *slab = b->slab;
      uintptr_t obj = b->addr + (p - b->addr) / slab->objsize * slab->objsize;
      size_t req = live_req(obj, (void *)((uintptr_t)slab | 1));
      if (req && p - obj < req) base = obj;
    }
    break;
  }
  wl__unlock(a);
  return (void *)base;
}

int wl_alloc_export(wl_alloc_t *a, const void *ptr, wl_alloc_export_t *out) {
  if (!a || !ptr || !out) return -EINVAL;
  memset(out, 0, sizeof *out);
  if (!a->prov.phys_export) return -ENOTSUP;
  uintptr_t p = (uintptr_t)ptr;
  wl__lock(a);
  size_t req = live_req(p, wl__addr_get(a, p));
  wl__region_t *r = req ? region_find(a, p) : NULL;
  int rc = -EINVAL;
  if (!r) goto out;
  /* Under the lock: the chunks stay mapped while the block is live, and a free racing the
   * export (the caller's bug) cannot hand them to another block halfway. */
  size_t off = p - r->base, c0 = wl__chunk_of(a, off), c1 = wl__chunk_of(a, off + req - 1);
  size_t n = c1 - c0 + 1;
  int *fds = malloc(n * sizeof *fds);
  rc = -ENOMEM;
  if (!fds) goto out;
  size_t i = 0;
  for (rc = 0; i < n && !rc; i++)
    rc = r->mapped[c0 + i] ? a->prov.phys_export(a->prov.ctx, r->handle[c0 + i], &fds[i])
                           : -EFAULT; /* a live block's chunk unmapped: never */
  if (rc) {
    while (--i > 0) close(fds[i - 1]);
    free(fds);
    goto out;
  }
  *out = (wl_alloc_export_t){off - c0 * a->chunk, req, a->chunk, n, fds};
out:
  wl__unlock(a);
  return rc;
}

void wl_alloc_export_close(wl_alloc_export_t *e) {
  if (!e) return;
  for (size_t i = 0; i < e->npieces && e->fds; i++) close(e->fds[i]);
  free(e->fds);
  memset(e, 0, sizeof *e);
}

/* Whether mapped memory exceeds live memory by more than keep: a difference, since live + keep
 * wraps for a keep near SIZE_MAX ("keep everything"), which then gave everything back. */
static bool unused_over(wl_alloc_t *a, size_t keep) {
  return wl__sub_sat(a->st.mapped_bytes, wl__live(a)) > keep;
}

/* press: a peer waits for the budget (keep is then 0): the physical cache goes too, and the
 * thread caches only when they hold a chunk's worth (less cannot empty one). */
static size_t trim_locked(wl_alloc_t *a, size_t keep, bool press) {
  /* Cached blocks keep their chunks mapped: give them back when there is memory to return. */
  if (a->tcs && unused_over(a, keep) && (!press || wl__tc_bytes(a) >= a->chunk))
    wl__tc_flush_all(a);
  /* Empty slabs kept for reuse pin their chunks: give them back first (after the completed
   * cross-stream frees have emptied what they can). */
  process_all(a);
  for (size_t i = 0; i < a->stream_cap; i++) {
    wl__stream_t *s = a->streams[i];
    if (s) wl__small_drop_empty(a, s, false);
  }
  process_all(a);
  size_t unmapped = 0;
  for (uint32_t i = a->nregions; i-- > 0 && a->empty_mapped;) {
    wl__region_t *r = &a->regions[i];
    for (size_t c = r->nchunks; c-- > 0 && a->empty_mapped;) {
      if (!r->mapped[c] || r->busy[c]) continue;
      if (!unused_over(a, keep)) break;
      void *h;
      if (unmap_chunk(a, r, c, &h) == 0) {
        phys_cache_put(a, h, false);
        unmapped += a->chunk;
      }
    }
  }
  /* Handles moved here under pressure may exceed the cache limit. */
  phys_cache_trim(a, press ? 0 : a->cfg.phys_cache_limit);
  if (a->budget_waiters) wl__feed_waiters(a);
  WL__ST_ADD(a, trims, 1);
  return unmapped;
}

size_t wl_alloc_trim(wl_alloc_t *a, size_t keep_bytes) {
  if (!a) return 0;
  wl__lock(a);
  bool press = false;
  if (keep_bytes == SIZE_MAX) keep_bytes = default_keep(a, &press);
  size_t n = trim_locked(a, keep_bytes, press);
  wl__unlock(a);
  return n;
}

/* Waits on trim_mu, and takes the lock only to trim, after letting go of trim_mu (the free path
 * that kicks it holds the lock and then takes trim_mu). */
static void *trim_main(void *arg) {
  wl_alloc_t *a = arg;
  pthread_mutex_lock(&a->trim_mu);
  while (!a->trim_stop) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    uint64_t ns = (uint64_t)ts.tv_nsec + (uint64_t)a->cfg.trim_interval_ms * 1000000ull;
    ts.tv_sec += (time_t)(ns / 1000000000ull);
    ts.tv_nsec = (long)(ns % 1000000000ull);
    if (!__atomic_load_n(&a->trim_kick, __ATOMIC_RELAXED))
      pthread_cond_timedwait(&a->trim_cv, &a->trim_mu, &ts);
    if (a->trim_stop) break;
    __atomic_store_n(&a->trim_kick, false, __ATOMIC_RELAXED);
    pthread_mutex_unlock(&a->trim_mu);
    wl__lock(a);
    bool press;
    size_t keep = default_keep(a, &press);
    if (a->st.pending_bytes || a->empty_mapped || a->phys_cache_len ||
        (a->tcs && wl__tc_bytes(a) && unused_over(a, keep)))
      trim_locked(a, keep, press);
    wl__unlock(a);
    pthread_mutex_lock(&a->trim_mu);
  }
  pthread_mutex_unlock(&a->trim_mu);
  return NULL;
}

int wl_alloc_grant(wl_alloc_t *a, int device) {
  if (!a || device < 0) return -EINVAL;
  if (!a->prov.grant) return -ENOTSUP;
  wl__lock(a);
  /* Each mapped chunk, then future mappings (made under this lock, so none is missed): a device
   * the driver refuses must not join the list every later mapping is opened to, or every later
   * mapping would fail. */
  int rc = 0;
  for (uint32_t i = 0; !rc && i < a->nregions; i++) {
    wl__region_t *r = &a->regions[i];
    for (size_t c = 0; !rc && c < r->nchunks; c++)
      if (r->mapped[c]) rc = a->prov.grant(a->prov.ctx, device, r->base + c * a->chunk, a->chunk);
  }
  if (!rc) rc = a->prov.grant(a->prov.ctx, device, 0, 0);
  wl__unlock(a);
  return rc;
}

void wl_alloc_stream_forget(wl_alloc_t *a, wl_stream_t stream) {
  if (!a) return;
  wl__lock(a);
  wl__stream_t *s = stream_find(a, stream);
  if (s) {
    wl__small_drop_empty(a, s, true);
    /* Blocks the thread caches hold, freed on s, come back later with the final event's seq:
     * it must be recorded even when nothing else was freed on s since the last one. */
    if (s->tc_refs) s->free_seq++;
    stream_record(a, s); /* the final event: covers every free on s */
    s->dead = true;
    stream_table_del(a, s);
    if (a->last_stream == s) a->last_stream = NULL;
    s->dead_next = a->dead_streams;
    a->dead_streams = s;
    stream_process(a, s);
    if (a->budget_waiters) wl__feed_waiters(a);
  }
  wl__unlock(a);
}

void wl_alloc_abandon_streams(wl_alloc_t *a) {
  if (!a) return;
  wl__lock(a);
  /* Cached blocks go back to their streams first, to be released with them. */
  if (a->tcs) wl__tc_flush_all(a);
  while (a->live_streams) { /* forgotten as wl_alloc_stream_forget does, with no final event */
    wl__stream_t *s = a->live_streams;
    wl__small_drop_empty(a, s, true);
    s->dead = true;
    stream_table_del(a, s);
    s->dead_next = a->dead_streams;
    a->dead_streams = s;
  }
  a->last_stream = NULL;
  for (wl__stream_t *s = a->dead_streams; s; s = s->dead_next) {
    while (s->evq_len) {
      a->prov.event_destroy(a->prov.ctx, s->evq[s->evq_head].ev);
      s->evq_head = (s->evq_head + 1) % s->evq_cap;
      s->evq_len--;
    }
    s->recorded_seq = s->done_seq = s->free_seq; /* every free on s is complete */
    stream_release_done(a, s);
  }
  process_all(a); /* frees the streams left with nothing */
  while (a->ev_pool_len) a->prov.event_destroy(a->prov.ctx, a->ev_pool[--a->ev_pool_len]);
  if (a->budget_waiters) wl__feed_waiters(a);
  wl__unlock(a);
}

static void stream_free_all(wl_alloc_t *a, wl__stream_t *s) {
  while (s->evq_len) {
    a->prov.event_destroy(a->prov.ctx, s->evq[s->evq_head].ev);
    s->evq_head = (s->evq_head + 1) % s->evq_cap;
    s->evq_len--;
  }
  while (s->pend_head) {
    wl__pending_t *p = s->pend_head;
    s->pend_head = p->next;
    free(p);
  }
  free(s->evq);
  free(s);
}

void wl_alloc_destroy(wl_alloc_t *a) {
  if (!a) return;
  if (a->trim_running) {
    pthread_mutex_lock(&a->trim_mu);
    a->trim_stop = true;
    pthread_cond_signal(&a->trim_cv);
    pthread_mutex_unlock(&a->trim_mu);
    pthread_join(a->trim_tid, NULL);
    pthread_cond_destroy(&a->trim_cv);
  }
  wl__tc_destroy(a);
  wl__small_free_all(a);
  for (size_t i = 0; i < a->stream_cap; i++)
    if (a->streams[i]) stream_free_all(a, a->streams[i]);
  while (a->dead_streams) {
    wl__stream_t *s = a->dead_streams;
    a->dead_streams = s->dead_next;
    stream_free_all(a, s);
  }
  for (uint32_t i = 0; i < a->nregions; i++) {
    wl__region_t *r = &a->regions[i];
    for (size_t c = 0; c < r->nchunks; c++) {
      if (!r->mapped[c]) continue;
      void *h = r->handle[c];
      if (a->prov.unmap(a->prov.ctx, r->base + c * a->chunk, a->chunk) == 0) phys_release(a, h);
    }
    a->prov.unreserve(a->prov.ctx, r->base, r->size);
    free(r->mapped);
    free(r->handle);
    free(r->busy);
    starts_free(r->starts, r->size);
  }
  while (a->phys_cache_len) phys_release(a, a->phys_cache[--a->phys_cache_len]);
  free(a->phys_cache);
  for (size_t i = 0; i < a->ev_pool_len; i++) a->prov.event_destroy(a->prov.ctx, a->ev_pool[i]);
  free(a->ev_pool);
  while (a->pend_pool) {
    wl__pending_t *p = a->pend_pool;
    a->pend_pool = p->next;
    free(p);
  }
  for (size_t i = 0; i < a->nblock_slabs; i++) free(a->block_slabs[i]);
  free(a->block_slabs);
  free(a->streams);
  wl__ptrmap_free(&a->ptrs);
  if (a->prov.destroy) a->prov.destroy(a->prov.ctx);
  pthread_mutex_destroy(&a->trim_mu);
  free(a);
}

/* ---- invariants
 * -----------------------------------------------------------------------------------*/

#define CHECK(cond, ...)                                                                           \
  do {                                                                                             \
    if (!(cond)) {                                                                                 \
      wl__warn("allocator check failed: " __VA_ARGS__);                                            \
      rc = -EFAULT;                                                                                \
      goto out;                                                                                    \
    }                                                                                              \
  } while (0)

int wl_alloc_check(wl_alloc_t *a) {
  if (!a) return -EINVAL;
  int rc = 0;
  wl__lock(a);
  size_t live = 0, free_any = 0, nalloc = 0, mapped = 0, empty = 0, ncached = 0, cached = 0;
  for (uint32_t i = 0; i < a->nregions; i++) {
    wl__region_t *r = &a->regions[i];
    size_t *busy = calloc(r->nchunks, sizeof *busy);
    CHECK(busy, "out of memory");
    wl__block_t *head = r->head;
    CHECK(head && !head->prev, "region %u has no first block", i);
    CHECK(head->addr == r->base, "region %u does not start with a block", i);
    uintptr_t end = r->base;
    for (wl__block_t *b = head; b; b = b->next) {
      CHECK(b->addr == end, "blocks of region %u do not tile it at %#lx", i, (unsigned long)end);
      CHECK(b->size > 0 && b->size % WL__LARGE_ALIGN == 0, "block %#lx has size %zu",
            (unsigned long)b->addr, b->size);
      CHECK(b->region == i, "block %#lx names region %u", (unsigned long)b->addr, b->region);
      end = b->addr + b->size;
      bool is_busy = b->state != WL__B_FREE || b->stream != NULL;
      if (b->state == WL__B_FREE) {
        /* Neighbours of one tag merge, except pending blocks freed on either side of one of
         * their stream's events (see mergeable): both freed after the last one cannot be. */
        const wl__block_t *n = b->next;
        CHECK(!n || n->state != WL__B_FREE || n->stream != b->stream ||
                  (b->stream &&
                   (b->seq <= b->stream->recorded_seq || n->seq <= b->stream->recorded_seq)),
              "adjacent free blocks with the same tag at %#lx were not merged",
              (unsigned long)b->addr);
        if (!b->stream) free_any++;
      } else if (b->state == WL__B_ALLOC) {
        CHECK(wl__start_get(a, b->addr) == b, "live block %#lx missing from the starts",
              (unsigned long)b->addr);
        CHECK(b->req <= b->size, "block %#lx has request %zu for size %zu", (unsigned long)b->addr,
              b->req, b->size);
        live += b->req;
        nalloc++;
        if (!b->req) { /* in a thread cache */
          ncached++;
          cached += b->size;
        }
      } else {
        size_t slive = 0;
        CHECK(b->slab && b->slab->blk == b, "slab block %#lx without its slab",
              (unsigned long)b->addr);
        CHECK(wl__small_check(a, b->slab, &slive) == 0, "slab at %#lx is inconsistent",
              (unsigned long)b->addr);
        live += slive;
        for (uint32_t k = 0; k < b->slab->nobj; k++) {
          if (b->slab->req[k]) {
            nalloc++;
          } else if (!(b->slab->bits[k / 64] >> (k % 64) & 1) &&
                     wl__ptrmap_get(&a->ptrs, b->addr + (uintptr_t)k * b->slab->objsize)) {
            nalloc++; /* taken, not pending, still mapped: in a thread cache */
            ncached++;
            cached += b->slab->objsize;
          }
        }
      }
      if (is_busy) {
        size_t c0 = wl__chunk_of(a, b->addr - r->base),
               c1 = wl__chunk_of(a, b->addr + b->size - 1 - r->base);
        for (size_t c = c0; c <= c1; c++) {
          uintptr_t cs = r->base + c * a->chunk, ce = cs + a->chunk;
          uintptr_t s = b->addr > cs ? b->addr : cs, e = end < ce ? end : ce;
          busy[c] += e - s;
          if (b->state != WL__B_FREE)
            CHECK(r->mapped[c], "live block %#lx lies on unmapped chunk %zu",
                  (unsigned long)b->addr, c);
        }
      }
    }
    CHECK(end == r->base + r->size, "blocks of region %u end at %#lx, not at its end", i,
          (unsigned long)end);
    for (size_t c = 0; c < r->nchunks; c++) {
      CHECK(busy[c] == r->busy[c], "chunk %zu of region %u: busy %zu, counted %zu", c, i,
            r->busy[c], busy[c]);
      if (r->mapped[c]) {
        mapped += a->chunk;
        if (!busy[c]) empty++;
      }
    }
    free(busy);
  }
  for (size_t k = 0; k < a->stream_cap; k++) {
    wl__stream_t *s = a->streams[k];
    if (!s) continue;
    size_t n = 0, bytes = 0;
    for (wl__block_t *b = s->fifo_head; b; b = b->fnext) {
      CHECK(b->stream == s && b->state == WL__B_FREE, "stream list holds a foreign block");
      n++;
      bytes += b->size;
    }
    CHECK(n == s->nfifo, "stream %p: list %zu blocks, counted %u", s->handle, n, s->nfifo);
    CHECK(s->treed ? n == wl__tree_count(s->tree) && n > WL__FIFO_FLAT : !s->tree,
          "stream %p: list %zu, tree %zu blocks", s->handle, n, wl__tree_count(s->tree));
    CHECK(bytes == s->tagged_bytes, "stream %p: tagged bytes %zu, counted %zu", s->handle,
          s->tagged_bytes, bytes);
    CHECK(wl__tree_check(s->tree) == 0, "stream %p: size tree is unbalanced or unordered",
          s->handle);
  }
  CHECK(wl__tree_check(a->any_tree) == 0, "the size tree is unbalanced or unordered");
  CHECK(free_any == wl__tree_count(a->any_tree), "free blocks %zu, tree holds %zu", free_any,
        wl__tree_count(a->any_tree));
  CHECK(nalloc == a->ptrs.count + a->nstarts, "live blocks %zu, map and starts hold %zu + %zu",
        nalloc, a->ptrs.count, a->nstarts);
  size_t tc_n = 0;
  CHECK(wl__tc_check(a, &tc_n) == 0, "a thread cache's entries or bytes do not add up");
  CHECK(tc_n == ncached && cached == wl__tc_bytes(a),
        "thread caches hold %zu blocks (%zu bytes), counted %zu (%zu bytes)", tc_n, wl__tc_bytes(a),
        ncached, cached);
  CHECK(live == wl__live(a), "live bytes %zu, counted %zu", wl__live(a), live);
  CHECK(mapped == a->st.mapped_bytes, "mapped bytes %zu, counted %zu", a->st.mapped_bytes, mapped);
  CHECK(empty == a->empty_mapped, "empty mapped chunks %zu, counted %zu", a->empty_mapped, empty);
  CHECK(a->st.physical_bytes == a->st.mapped_bytes + a->phys_cache_len * a->chunk,
        "physical %zu != mapped %zu + cached %zu", a->st.physical_bytes, a->st.mapped_bytes,
        a->phys_cache_len * a->chunk);
  CHECK(wl__live(a) <= a->st.mapped_bytes && a->st.mapped_bytes <= a->st.reserved_bytes,
        "live %zu <= mapped %zu <= reserved %zu does not hold", wl__live(a), a->st.mapped_bytes,
        a->st.reserved_bytes);
out:
  wl__unlock(a);
  return rc;
}
