/* Thread caches: per thread and allocator, bins of recently freed blocks that the thread's next
 * allocation of the same size on the same stream takes back without the allocator's lock; they
 * drain into the shared pools under the lock on overflow, trim, a failed allocation, a stream
 * change and thread exit. */
#include "internal.h"

#include <errno.h>
#include <linux/membarrier.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <unistd.h>

/* Why the freeing thread's cache takes a block, whichever thread allocated it: a block carries
 * no owner, so a cross-thread free needs no remote list, and being freed on a stream makes it
 * reusable on that stream at once whoever freed it. The allocating thread just misses. */

struct wl__tthread_s {
  wl__tcache_t *head; /* this thread's caches, most recently used first */
  wl__tthread_t *prev, *next;
};

/* The registry of threads with caches, for thread exit, destroy and fork; slow paths only. Lock
 * order: the registry, then an allocator's lock. */
static pthread_mutex_t reg_lock = PTHREAD_MUTEX_INITIALIZER;
static wl__tthread_t *reg_threads;
static pthread_key_t reg_key;
static pthread_once_t reg_once = PTHREAD_ONCE_INIT;
static bool reg_ok;
/* membarrier(2) is usable and fast: the owner's side of entering a cache needs no fence
 * instruction. */
static bool asym;
#define MEMBARRIER_SLOW_NS (200 * 1000)
/* The calling thread's holder. Default TLS model, not initial-exec: libwlalloc.so may be
 * dlopened, and the key (not this variable) is what thread exit goes through. */
static _Thread_local wl__tthread_t *tl_thr;

void wl__tc_setup(wl_alloc_t *a) {
  if (a->cfg.tcache_off || a->cfg.hook) return; /* the hook is called under the lock */
  size_t lim = a->cfg.tcache_bytes;
  if (!lim) {
    lim = (size_t)8 << 20;
    size_t budget = a->budget.limit ? a->budget.limit(a->budget.ctx) : 0;
    if (budget && budget / 64 < lim) lim = budget / 64;
  }
  if (lim < WL__LARGE_ALIGN) return;
  if (lim > ((size_t)1 << 30)) lim = (size_t)1 << 30; /* entries keep sizes in 32 bits */
  a->tc_limit = lim;
  a->tc_max = wl__align_up(lim / 4, WL__LARGE_ALIGN);
}

/* ---- entering a cache -------------------------------------------------------------------------*/

/* Entering a cache is Dekker's protocol between its thread (busy) and a flusher holding the
 * allocator's lock (flushing): each announces itself, then looks at the other, and backs off when
 * the other is inside; neither waits (the thread takes the locked path, the flusher skips the
 * cache). A locked instruction on every call would cost as much as the lock it replaces, so the
 * thread's side is a plain store and a compiler barrier, and the flusher's membarrier(2) stands
 * in for the thread's fence (where the kernel lacks it, both sides fence). */
static inline bool tc_enter(wl__tcache_t *tc) {
  __atomic_store_n(&tc->busy, 1, __ATOMIC_RELAXED);
  if (WL_LIKELY(asym))
    __atomic_signal_fence(__ATOMIC_SEQ_CST);
  else
    __atomic_thread_fence(__ATOMIC_SEQ_CST);
  if (WL_LIKELY(!__atomic_load_n(&tc->flushing, __ATOMIC_ACQUIRE))) return true;
  __atomic_store_n(&tc->busy, 0, __ATOMIC_RELEASE);
  return false;
}

static inline void tc_leave(wl__tcache_t *tc) {
  __atomic_store_n(&tc->busy, 0, __ATOMIC_RELEASE);
}

/* The flusher's heavy fence: every thread of the process passes a full barrier. false when
 * membarrier failed: the threads did not fence, so no cache may be flushed. */
static bool heavy_fence(void) {
  if (asym) return syscall(__NR_membarrier, MEMBARRIER_CMD_PRIVATE_EXPEDITED, 0, 0) == 0;
  __atomic_thread_fence(__ATOMIC_SEQ_CST);
  return true;
}

#define TC_SCAN 4 /* entries an allocation looks at */

/* A counter only the holder of busy writes and the stats read. */
#define TC_ADD(tc, f, v) __atomic_store_n(&(tc)->f, (tc)->f + (v), __ATOMIC_RELAXED)

static inline int large_bin(size_t size) {
  return WL__NCLASSES + (int)(((uint64_t)(size >> 12) * 0x9E3779B97F4A7C15ull) >> 60);
}

/* The slot of a bound, not forgotten stream, or -1. */
static inline int tc_stream(const wl__tcache_t *tc, wl_stream_t h) {
  for (int i = 0; i < WL__TC_STREAMS; i++) {
    wl__stream_t *s = tc->stream[i];
    if (s && tc->handle[i] == h) return __atomic_load_n(&s->dead, __ATOMIC_RELAXED) ? -1 : i;
  }
  return -1;
}

/* ---- giving blocks back (the allocator's lock held) -------------------------------------------*/

static void flush_ent(wl_alloc_t *a, wl__tcache_t *tc, const wl__tcent_t *e) {
  wl__stream_t *s = tc->stream[e->si];
  wl__addr_del(a, e->ptr, e->v);
  if ((uintptr_t)e->v & 1)
    wl__small_free(a, (wl__slab_t *)((uintptr_t)e->v & ~(uintptr_t)1), e->ptr, s);
  else
    wl__large_free(a, e->v, s);
  TC_ADD(tc, bytes, -(size_t)e->size);
}

/* The k oldest entries of bin b. */
static void flush_bin(wl_alloc_t *a, wl__tcache_t *tc, int b, uint32_t k) {
  for (uint32_t i = 0; i < k; i++) flush_ent(a, tc, &tc->e[b][i]);
  memmove(&tc->e[b][0], &tc->e[b][k], (tc->n[b] - k) * sizeof tc->e[b][0]);
  tc->n[b] -= k;
}

static void flush_bins(wl_alloc_t *a, wl__tcache_t *tc) {
  for (int b = 0; b < WL__TC_NBINS; b++)
    if (tc->n[b]) flush_bin(a, tc, b, tc->n[b]);
}

/* The entries freed on stream slot si, then the slot itself. */
static void unbind(wl_alloc_t *a, wl__tcache_t *tc, int si) {
  for (int b = 0; b < WL__TC_NBINS; b++) {
    uint32_t k = 0;
    for (uint32_t i = 0; i < tc->n[b]; i++) {
      if (tc->e[b][i].si == (uint32_t)si)
        flush_ent(a, tc, &tc->e[b][i]);
      else
        tc->e[b][k++] = tc->e[b][i];
    }
    tc->n[b] = k;
  }
  tc->stream[si]->tc_refs--; /* a forgotten stream may now be freed */
  tc->stream[si] = NULL;
}

/* Gives everything back, unlinks tc from a and frees it. */
static void tc_release(wl_alloc_t *a, wl__tcache_t *tc) {
  flush_bins(a, tc);
  for (int i = 0; i < WL__TC_STREAMS; i++)
    if (tc->stream[i]) unbind(a, tc, i);
  a->tc_gone_hits += tc->hits;
  a->tc_gone_small += tc->small_hits;
  a->tc_gone_frees += tc->frees;
  if (tc->aprev)
    tc->aprev->anext = tc->anext;
  else
    a->tcs = tc->anext;
  if (tc->anext) tc->anext->aprev = tc->aprev;
  free(tc);
}

size_t wl__tc_flush_all(wl_alloc_t *a) {
  size_t n = 0;
  bool any = false;
  for (wl__tcache_t *tc = a->tcs; tc; tc = tc->anext)
    if (tc->orphan || __atomic_load_n(&tc->bytes, __ATOMIC_RELAXED)) {
      __atomic_store_n(&tc->flushing, 1, __ATOMIC_SEQ_CST);
      any = true;
    }
  if (!any) return 0;
  bool fenced = heavy_fence(); /* one for all the caches */
  for (wl__tcache_t *tc = a->tcs, *next; tc; tc = next) {
    next = tc->anext;
    if (!tc->flushing) continue;
    if (!fenced || __atomic_load_n(&tc->busy, __ATOMIC_ACQUIRE)) { /* its thread is inside */
      __atomic_store_n(&tc->flushing, 0, __ATOMIC_RELEASE);
      continue;
    }
    n += tc->bytes;
    if (tc->orphan) {
      tc_release(a, tc);
      continue;
    }
    flush_bins(a, tc);
    __atomic_store_n(&tc->flushing, 0, __ATOMIC_RELEASE);
  }
  return n;
}

/* ---- the owning thread's slow paths (the cache entered) ---------------------------------------*/

/* Binds stream h to a slot, giving back the blocks of the slot it takes. -1 when h is unusable. */
static int tc_bind(wl_alloc_t *a, wl__tcache_t *tc, wl_stream_t h) {
  wl__lock(a);
  int si = -1;
  for (int i = 0; i < WL__TC_STREAMS && si < 0; i++)
    if (tc->stream[i] && tc->handle[i] == h) si = i; /* forgotten since */
  for (int i = 0; i < WL__TC_STREAMS && si < 0; i++)
    if (!tc->stream[i]) si = i;
  if (si < 0) si = (int)(tc->evict++ % WL__TC_STREAMS);
  if (tc->stream[si]) unbind(a, tc, si);
  wl__stream_t *s = wl__stream_get(a, h);
  if (s) {
    s->tc_refs++;
    tc->stream[si] = s;
    tc->handle[si] = h;
  } else {
    si = -1;
  }
  if (WL_UNLIKELY(a->budget_waiters)) wl__feed_waiters(a); /* the unbound slot's blocks */
  wl__unlock(a);
  return si;
}

/* Room for size more bytes in bin b: the older half of a full bin goes back, then the older
 * half of every bin, then everything. */
static void tc_make_room(wl_alloc_t *a, wl__tcache_t *tc, int b, size_t size) {
  wl__lock(a);
  if (tc->n[b] == WL__TC_CAP) flush_bin(a, tc, b, WL__TC_CAP / 2);
  if (tc->bytes + size > a->tc_limit)
    for (int i = 0; i < WL__TC_NBINS; i++) flush_bin(a, tc, i, (tc->n[i] + 1) / 2);
  if (tc->bytes + size > a->tc_limit) flush_bins(a, tc);
  if (WL_UNLIKELY(a->budget_waiters)) wl__feed_waiters(a);
  wl__unlock(a);
}

/* ---- threads ----------------------------------------------------------------------------------*/

/* Thread exit (the key's destructor): every cache goes back to its allocator. */
static void thread_exit(void *arg) {
  wl__tthread_t *t = arg;
  pthread_mutex_lock(&reg_lock);
  while (t->head) {
    wl__tcache_t *tc = t->head;
    t->head = tc->tnext;
    wl_alloc_t *a = __atomic_load_n(&tc->alloc, __ATOMIC_ACQUIRE);
    if (a) {
      wl__lock(a); /* a flusher holds it while it holds tc */
      tc_release(a, tc);
      if (a->budget_waiters) wl__feed_waiters(a);
      wl__unlock(a);
    } else {
      free(tc); /* its allocator was destroyed */
    }
  }
  if (t->prev)
    t->prev->next = t->next;
  else
    reg_threads = t->next;
  if (t->next) t->next->prev = t->prev;
  pthread_mutex_unlock(&reg_lock);
  if (tl_thr == t) tl_thr = NULL;
  free(t);
}

static void reg_prepare(void) {
  pthread_mutex_lock(&reg_lock);
}

static void reg_parent(void) {
  pthread_mutex_unlock(&reg_lock);
}

/* Only the forking thread lives on in the child: the others' caches become orphans, which the
 * next trim, failed allocation or destroy gives back and frees (one whose thread was inside it
 * at the fork is left alone until destroy: its bins may be half written). */
static void reg_child(void) {
  for (wl__tthread_t *t = reg_threads, *next; t; t = next) {
    next = t->next;
    if (t == tl_thr) continue;
    for (wl__tcache_t *tc = t->head, *tn; tc; tc = tn) {
      tn = tc->tnext;
      if (tc->alloc)
        tc->orphan = true;
      else
        free(tc);
    }
    free(t);
  }
  reg_threads = tl_thr;
  if (tl_thr) tl_thr->prev = tl_thr->next = NULL;
  pthread_mutex_init(&reg_lock, NULL);
  /* The child is a new process to membarrier: register again while it has one thread. */
  if (asym && syscall(__NR_membarrier, MEMBARRIER_CMD_REGISTER_PRIVATE_EXPEDITED, 0, 0))
    asym = false;
}

static void reg_init(void) {
  reg_ok = pthread_key_create(&reg_key, thread_exit) == 0;
  if (reg_ok) pthread_atfork(reg_prepare, reg_parent, reg_child);
  /* Before any cache exists, so no thread ever skips a fence the flusher does not make up for. */
  long cmds = syscall(__NR_membarrier, MEMBARRIER_CMD_QUERY, 0, 0);
  asym = cmds > 0 && (cmds & MEMBARRIER_CMD_PRIVATE_EXPEDITED) &&
         syscall(__NR_membarrier, MEMBARRIER_CMD_REGISTER_PRIVATE_EXPEDITED, 0, 0) == 0;
  /* A flush holds the allocator's lock across the barrier. Where membarrier is emulated by
   * stopping every thread (gVisor: about 10 ms a call, where Linux takes a microsecond or two),
   * that would stall every allocation behind each trim, so the threads fence for themselves
   * there. A timed call tells them apart (four orders of magnitude); up to three, so that one
   * call preempted on a loaded machine does not make every thread fence for the process's life. */
  bool fast = false;
  for (int i = 0; asym && !fast && i < 3; i++) {
    uint64_t t0 = wl__now_ns();
    asym = syscall(__NR_membarrier, MEMBARRIER_CMD_PRIVATE_EXPEDITED, 0, 0) == 0;
    fast = asym && wl__now_ns() - t0 < MEMBARRIER_SLOW_NS;
  }
  asym = asym && fast;
}

/* Unloading the library (dlclose) must not leave thread exit calling into unmapped code. */
__attribute__((destructor)) static void reg_fini(void) {
  if (reg_ok) pthread_key_delete(reg_key);
  reg_ok = false;
}

/* The calling thread's cache for a, created on first use; frees caches of destroyed allocators
 * on the way. NULL without memory. */
static wl__tcache_t *tc_slow_get(wl_alloc_t *a) {
  pthread_once(&reg_once, reg_init);
  if (!reg_ok) return NULL;
  wl__tcache_t *found = NULL;
  pthread_mutex_lock(&reg_lock);
  wl__tthread_t *t = tl_thr;
  if (!t) {
    t = calloc(1, sizeof *t);
    if (!t || pthread_setspecific(reg_key, t)) {
      free(t);
      goto out;
    }
    t->next = reg_threads;
    if (reg_threads) reg_threads->prev = t;
    reg_threads = t;
    tl_thr = t;
  }
  for (wl__tcache_t **pp = &t->head; *pp;) {
    wl__tcache_t *tc = *pp;
    wl_alloc_t *ta = __atomic_load_n(&tc->alloc, __ATOMIC_ACQUIRE);
    if (ta == a || !ta) {
      *pp = tc->tnext;
      if (ta)
        found = tc;
      else
        free(tc);
      continue;
    }
    pp = &tc->tnext;
  }
  if (!found && (found = calloc(1, sizeof *found))) {
    found->alloc = a;
    found->thr = t;
    wl__lock(a);
    found->anext = a->tcs;
    if (a->tcs) a->tcs->aprev = found;
    a->tcs = found;
    wl__unlock(a);
  }
  if (found) {
    found->tnext = t->head;
    t->head = found;
  }
out:
  pthread_mutex_unlock(&reg_lock);
  return found;
}

static inline wl__tcache_t *tc_get(wl_alloc_t *a) {
  wl__tthread_t *t = tl_thr;
  if (WL_LIKELY(t && t->head && __atomic_load_n(&t->head->alloc, __ATOMIC_ACQUIRE) == a))
    return t->head;
  return tc_slow_get(a);
}

void wl__tc_destroy(wl_alloc_t *a) {
  pthread_mutex_lock(&reg_lock); /* against thread exit, which would flush into a */
  for (wl__tcache_t *tc = a->tcs, *next; tc; tc = next) {
    next = tc->anext;
    if (tc->orphan) {
      free(tc);
      continue;
    }
    /* Its thread frees it; the blocks go with the allocator. */
    memset(tc->n, 0, sizeof tc->n);
    memset(tc->stream, 0, sizeof tc->stream);
    tc->bytes = 0;
    __atomic_store_n(&tc->alloc, NULL, __ATOMIC_RELEASE);
  }
  a->tcs = NULL;
  pthread_mutex_unlock(&reg_lock);
}

/* ---- the fast paths ---------------------------------------------------------------------------*/

void *wl__tc_alloc(wl_alloc_t *a, size_t size, wl_stream_t stream) {
  wl__tcache_t *tc = tc_get(a);
  if (WL_UNLIKELY(!tc || !tc_enter(tc))) return NULL;
  void *ptr = NULL;
  int si = tc_stream(tc, stream);
  size_t want = 0;
  int b = -1;
  if (size <= WL__SMALL_MAX) {
    b = wl__size_class(size);
  } else {
    want = wl__align_up(size, WL__LARGE_ALIGN);
    if (want <= a->tc_max) b = large_bin(want);
  }
  if (b >= 0) {
    uint8_t *w = &tc->want[b];
    if (want && tc->want_pages[b - WL__NCLASSES] != (uint32_t)(want >> 12)) {
      tc->want_pages[b - WL__NCLASSES] = (uint32_t)(want >> 12);
      *w = 0;
    }
    if (*w < WL__TC_CAP) ++*w;
  }
  if (si >= 0 && b >= 0) {
    /* The newest few only: a miss must stay cheap, and a bin shared by streams would otherwise
     * cost a scan of every entry (six cache lines) on each miss. */
    uint32_t lo = tc->n[b] > TC_SCAN ? tc->n[b] - TC_SCAN : 0;
    for (uint32_t i = tc->n[b]; i-- > lo;) {
      wl__tcent_t *e = &tc->e[b][i];
      if (e->si != (uint32_t)si || (want && e->size != want)) continue;
      ptr = (void *)e->ptr;
      if ((uintptr_t)e->v & 1) {
        wl__slab_t *slab = (wl__slab_t *)((uintptr_t)e->v & ~(uintptr_t)1);
        __atomic_store_n(&slab->req[(e->ptr - slab->blk->addr) / slab->objsize], (uint32_t)size,
                         __ATOMIC_RELAXED);
      } else {
        __atomic_store_n(&((wl__block_t *)e->v)->req, size, __ATOMIC_RELAXED);
      }
      TC_ADD(tc, bytes, -(size_t)e->size);
      TC_ADD(tc, hits, 1);
      if (!want) TC_ADD(tc, small_hits, 1);
      memmove(e, e + 1, (tc->n[b] - 1 - i) * sizeof *e); /* keep the bin oldest first */
      tc->n[b]--;
      break;
    }
  }
  tc_leave(tc);
  if (ptr) wl__live_add_fast(a, size);
  return ptr;
}

int wl__tc_free_found(wl_alloc_t *a, uintptr_t p, wl_stream_t stream, void *v, void **vout) {
  wl__tcache_t *tc = tc_get(a);
  if (WL_UNLIKELY(!tc || !tc_enter(tc))) return -1;
  int rc = -1, si = tc_stream(tc, stream);
  if (WL_UNLIKELY(si < 0)) si = tc_bind(a, tc, stream);
  size_t size, req = 0;
  int b;
  if (si < 0) goto out;
  if ((uintptr_t)v & 1) {
    wl__slab_t *slab = (wl__slab_t *)((uintptr_t)v & ~(uintptr_t)1);
    size = slab->objsize;
    b = (int)slab->cls;
    if (!tc->want[b]) goto out;
    if (tc->n[b] == WL__TC_CAP || tc->bytes + size > a->tc_limit) tc_make_room(a, tc, b, size);
    uint32_t *r = &slab->req[(p - slab->blk->addr) / size];
    /* Not an exchange: the locked path frees a block only with its lock, and two threads
     * freeing one pointer at once is the caller's race; this catches the sequential double free. */
    if ((req = __atomic_load_n(r, __ATOMIC_RELAXED))) __atomic_store_n(r, 0, __ATOMIC_RELAXED);
  } else {
    wl__block_t *blk = v;
    size = blk->size;
    if (size > a->tc_max) goto out;
    b = large_bin(size);
    if (!tc->want[b] || tc->want_pages[b - WL__NCLASSES] != (uint32_t)(size >> 12)) goto out;
    if (tc->n[b] == WL__TC_CAP || tc->bytes + size > a->tc_limit) tc_make_room(a, tc, b, size);
    if ((req = __atomic_load_n(&blk->req, __ATOMIC_RELAXED)))
      __atomic_store_n(&blk->req, 0, __ATOMIC_RELAXED);
  }
  if (!req) goto out; /* a double free: the locked path says so */
  tc->want[b]--;
  tc->e[b][tc->n[b]++] = (wl__tcent_t){p, v, (uint32_t)size, (uint32_t)si};
  TC_ADD(tc, bytes, size);
  TC_ADD(tc, frees, 1);
  rc = 0;
out:
  tc_leave(tc);
  /* A block's struct is never freed before the allocator, so the locked path may start from it
   * (after checking it); a slab's may be, so it looks a slab up again. */
  if (rc && v && !((uintptr_t)v & 1)) *vout = v;
  if (rc == 0) wl__live_sub_fast(a, req);
  return rc;
}

/* ---- stats and checks (the allocator's lock held) ---------------------------------------------*/

size_t wl__tc_bytes(wl_alloc_t *a) {
  size_t n = 0;
  for (wl__tcache_t *tc = a->tcs; tc; tc = tc->anext)
    n += __atomic_load_n(&tc->bytes, __ATOMIC_RELAXED);
  return n;
}

void wl__tc_stats(wl_alloc_t *a, wl_alloc_stats_t *out) {
  uint64_t hits = a->tc_gone_hits, small = a->tc_gone_small, frees = a->tc_gone_frees;
  for (wl__tcache_t *tc = a->tcs; tc; tc = tc->anext) {
    hits += __atomic_load_n(&tc->hits, __ATOMIC_RELAXED);
    small += __atomic_load_n(&tc->small_hits, __ATOMIC_RELAXED);
    frees += __atomic_load_n(&tc->frees, __ATOMIC_RELAXED);
  }
  out->allocs += hits;
  out->small_allocs += small;
  out->frees += frees;
  out->tcache_hits = hits;
  out->tcache_bytes = wl__tc_bytes(a);
  out->tcache_self_fenced = a->tcs && !asym;
}

int wl__tc_check(wl_alloc_t *a, size_t *nblocks) {
  size_t n = 0, bytes = 0;
  for (wl__tcache_t *tc = a->tcs; tc; tc = tc->anext) {
    size_t tb = 0;
    for (int b = 0; b < WL__TC_NBINS; b++)
      for (uint32_t i = 0; i < tc->n[b]; i++) {
        const wl__tcent_t *e = &tc->e[b][i];
        if (e->si >= WL__TC_STREAMS || !tc->stream[e->si] || wl__addr_get(a, e->ptr) != e->v)
          return -EFAULT;
        tb += e->size;
        n++;
      }
    if (tb != tc->bytes) return -EFAULT;
    bytes += tb;
  }
  *nblocks = n;
  (void)bytes;
  return 0;
}
