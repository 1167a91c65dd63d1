/* Per-pointer accounting: sharded open-addressing hash maps (pointer -> size, kind) with O(1)
 * insert and remove from any thread, and the trace events for allocations and frees. */
#include "internal.h"

#include <errno.h>
#include <string.h>
#include <sys/mman.h>

#define SHARDS      64
#define FIRST_CAP   256
#define KEY_EMPTY   ((uintptr_t)0)
#define KEY_DELETED ((uintptr_t)1)

typedef struct entry_s {
  uintptr_t key;
  uint64_t size;
  uint32_t kind;
} entry_t;

/* One shard: its own spin lock (held for a probe or two), its own table. Cache-line aligned so
 * threads working on different shards do not share a line. */
typedef struct shard_s {
  int lock;
  uint32_t cap, used, deleted; /* used: written under the lock, read without by snapshot */
  entry_t *tab;
} __attribute__((aligned(64))) shard_t;

struct wl__map_s {
  shard_t shard[SHARDS];
};

static wl__map_t maps[4];
wl__map_t *const wl__ptrs = &maps[0];
wl__map_t *const wl__handles = &maps[1];
wl__map_t *const wl__mappings = &maps[2];
wl__map_t *const wl__mapped = &maps[3];

/* Live bytes by kind: relaxed atomics (a shared line, touched on alloc and free only). */
static int64_t live_bytes[WL__K_COUNT];
static int64_t peak_bytes[WL__K_COUNT];

static inline uint64_t hash(uintptr_t k) {
  uint64_t x = (uint64_t)k;
  x ^= x >> 33;
  x *= 0xff51afd7ed558ccdull;
  x ^= x >> 33;
  return x;
}

static inline void cpu_relax(void) {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#endif
}

static inline void lock(shard_t *s) {
  while (__atomic_exchange_n(&s->lock, 1, __ATOMIC_ACQUIRE))
    while (__atomic_load_n(&s->lock, __ATOMIC_RELAXED)) cpu_relax();
}
static inline void unlock(shard_t *s) {
  __atomic_store_n(&s->lock, 0, __ATOMIC_RELEASE);
}

/* Tables come from mmap, not malloc: the trainer's allocator is not ours to use from hooks. */
static entry_t *tab_new(uint32_t cap) {
  void *p = mmap(NULL, (size_t)cap * sizeof(entry_t), PROT_READ | PROT_WRITE,
                 MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  return p == MAP_FAILED ? NULL : p;
}

static void tab_free(entry_t *t, uint32_t cap) {
  if (t) munmap(t, (size_t)cap * sizeof(entry_t));
}

/* Rebuilds the shard at a capacity fitting its live entries (drops tombstones). */
static int rehash(shard_t *s) {
  uint32_t cap = s->cap ? s->cap : FIRST_CAP;
  while ((uint64_t)(s->used + 1) * 2 > cap) cap *= 2;
  entry_t *t = tab_new(cap);
  if (!t) return -ENOMEM;
  for (uint32_t i = 0; i < s->cap; i++) {
    entry_t *e = &s->tab[i];
    if (e->key == KEY_EMPTY || e->key == KEY_DELETED) continue;
    uint32_t j = (uint32_t)hash(e->key) & (cap - 1);
    while (t[j].key != KEY_EMPTY) j = (j + 1) & (cap - 1);
    t[j] = *e;
  }
  tab_free(s->tab, s->cap);
  s->tab = t;
  s->cap = cap;
  s->deleted = 0;
  return 0;
}

/* The slot holding key, or NULL. */
static entry_t *find(shard_t *s, uintptr_t key, uint64_t h) {
  if (!s->tab) return NULL;
  uint32_t m = s->cap - 1;
  for (uint32_t i = (uint32_t)h & m, n = 0; n < s->cap; i = (i + 1) & m, n++) {
    entry_t *e = &s->tab[i];
    if (e->key == key) return e;
    if (e->key == KEY_EMPTY) return NULL;
  }
  return NULL;
}

static void live_add(unsigned kind, int64_t d) {
  kind &= 0xff; /* served blocks carry their allocator's index above */
  /* Served blocks: liballoc counts their live and peak bytes already (the stats report asks
   * it); two atomic operations on a shared line saved per served call. */
  if (kind >= WL__K_COUNT || kind == WL__K_SERVED) return;
  int64_t now = __atomic_add_fetch(&live_bytes[kind], d, __ATOMIC_RELAXED);
  int64_t pk = __atomic_load_n(&peak_bytes[kind], __ATOMIC_RELAXED);
  while (now > pk && !__atomic_compare_exchange_n(&peak_bytes[kind], &pk, now, true,
                                                  __ATOMIC_RELAXED, __ATOMIC_RELAXED)) {
  }
}

int wl__map_put(wl__map_t *m, uintptr_t key, uint64_t size, unsigned kind) {
  if (key <= KEY_DELETED) return -EINVAL;
  uint64_t h = hash(key);
  shard_t *s = &m->shard[(h >> 58) & (SHARDS - 1)];
  lock(s);
  if (WL_UNLIKELY(!s->tab || (uint64_t)(s->used + s->deleted + 1) * 4 > (uint64_t)s->cap * 3)) {
    if (rehash(s)) {
      unlock(s);
      wl__warn_once("accounting: out of memory for the pointer map; some allocations are not "
                    "accounted");
      return -ENOMEM;
    }
  }
  /* One probe for both questions: is key here already (a free we never saw: replace it), and
   * where does it go (the first tombstone on the way, else the empty slot that ends it). The
   * load factor stays under 3/4, so an empty slot ends every probe. */
  uint32_t mask = s->cap - 1;
  entry_t *slot = NULL;
  for (uint32_t i = (uint32_t)h & mask;; i = (i + 1) & mask) {
    entry_t *e = &s->tab[i];
    if (e->key == key) {
      unsigned old_kind = e->kind;
      uint64_t old_size = e->size;
      e->size = size;
      e->kind = kind;
      unlock(s);
      live_add(old_kind, -(int64_t)old_size);
      live_add(kind, (int64_t)size);
      return 0;
    }
    if (e->key == KEY_DELETED) {
      if (!slot) slot = e;
    } else if (e->key == KEY_EMPTY) {
      if (!slot) slot = e;
      break;
    }
  }
  if (slot->key == KEY_DELETED) s->deleted--;
  *slot = (entry_t){.key = key, .size = size, .kind = kind};
  __atomic_store_n(&s->used, s->used + 1, __ATOMIC_RELAXED); /* snapshot reads it unlocked */
  unlock(s);
  live_add(kind, (int64_t)size);
  return 0;
}

/* Takes e out of s (locked). */
static void remove_entry(shard_t *s, entry_t *e) {
  /* No tombstone when the next slot is empty (no probe runs through this one): an address freed
   * and allocated again and again (a cached size) then never fills the shard with tombstones,
   * whose clean-up (a rehash, mmap and munmap) cost more than the rest of the operation. */
  if (s->tab[(uint32_t)(e - s->tab + 1) & (s->cap - 1)].key == KEY_EMPTY) {
    e->key = KEY_EMPTY;
  } else {
    e->key = KEY_DELETED;
    s->deleted++;
  }
  __atomic_store_n(&s->used, s->used - 1, __ATOMIC_RELAXED);
}

/* key's entry with its shard locked (*sp: unlock it), or NULL with nothing locked. */
static entry_t *find_locked(wl__map_t *m, uintptr_t key, shard_t **sp) {
  if (key <= KEY_DELETED) return NULL;
  uint64_t h = hash(key);
  shard_t *s = *sp = &m->shard[(h >> 58) & (SHARDS - 1)];
  lock(s);
  entry_t *e = find(s, key, h);
  if (!e) unlock(s);
  return e;
}

/* Takes e out (its shard locked: unlocked here), with its size and kind. */
static void take_out(shard_t *s, entry_t *e, uint64_t *size, unsigned *kind) {
  uint64_t sz = e->size;
  unsigned k = e->kind;
  remove_entry(s, e);
  unlock(s);
  live_add(k, -(int64_t)sz);
  if (size) *size = sz;
  if (kind) *kind = k;
}

int wl__map_take(wl__map_t *m, uintptr_t key, uint64_t *size, unsigned *kind) {
  shard_t *s;
  entry_t *e = find_locked(m, key, &s);
  if (!e) return -ENOENT;
  take_out(s, e, size, kind);
  return 0;
}

int wl__map_ref(wl__map_t *m, uintptr_t key, int delta, uint64_t *size, unsigned *kind) {
  shard_t *s;
  entry_t *e = find_locked(m, key, &s);
  if (!e) return -ENOENT;
  int64_t refs = (int64_t)(e->kind / WL__VMM_REF) + delta;
  if (refs <= 0) {
    take_out(s, e, size, kind);
    return 0;
  }
  if (refs > (int64_t)(UINT32_MAX / WL__VMM_REF)) refs = UINT32_MAX / WL__VMM_REF; /* saturates */
  e->kind = e->kind % WL__VMM_REF + (unsigned)refs * WL__VMM_REF;
  if (size) *size = e->size;
  if (kind) *kind = e->kind;
  unlock(s);
  return (int)refs;
}

void wl__map_mark(wl__map_t *m, uintptr_t key, unsigned bits) {
  shard_t *s;
  entry_t *e = find_locked(m, key, &s);
  if (!e) return;
  e->kind |= bits;
  unlock(s);
}

/* The child starts with empty maps: the parent's entries name memory of a CUDA context the child
 * cannot use, and a shard another thread held at the fork may be half updated (its table even
 * unmapped mid-rehash), so nothing of it is read. The parent's tables are left as they are (the
 * child's copy-on-write pages; freeing one could free what a half-done rehash still points to). */
void wl__map_fork_child(void) {
  for (unsigned i = 0; i < sizeof maps / sizeof maps[0]; i++)
    for (unsigned j = 0; j < SHARDS; j++) maps[i].shard[j] = (shard_t){0};
  memset(live_bytes, 0, sizeof live_bytes);
  memset(peak_bytes, 0, sizeof peak_bytes);
}

void wl__map_live(uint64_t bytes[WL__K_COUNT], uint64_t peak[WL__K_COUNT]) {
  for (unsigned k = 0; k < WL__K_COUNT; k++) {
    int64_t b = __atomic_load_n(&live_bytes[k], __ATOMIC_RELAXED);
    bytes[k] = b > 0 ? (uint64_t)b : 0;
    peak[k] = (uint64_t)__atomic_load_n(&peak_bytes[k], __ATOMIC_RELAXED);
  }
}

/* ---- tracking --------------------------------------------------------------------------------*/

void wl__track_alloc(uintptr_t p, uint64_t size, unsigned kind, void *stream) {
  if (!p) return;
  wl__map_put(kind == WL__K_VMM ? wl__handles : wl__ptrs, p, size, kind);
  if (kind == WL__K_HOST)
    wl__count(WL__ST_HOST_ALLOCS, 1);
  else if (kind == WL__K_VMM)
    wl__count(WL__ST_VMM_CREATES, 1);
  else
    wl__count(WL__ST_ALLOCS, 1);
  /* Device memory the program asked for: the live-bytes wave. Pinned host memory and VMM
   * handles are not device allocations in the trace (handles appear as MAP/UNMAP). */
  if (kind != WL__K_HOST && kind != WL__K_VMM) {
    if (wl__mode() == WL__MODE_GATE) wl__gate_mem_event(1, size, stream);
    if (__atomic_load_n(&wl__trace, __ATOMIC_RELAXED))
      wl__trace_ev(WL_TRACE_ALLOC, 0, p, size, (uint64_t)(uintptr_t)stream);
  }
}

int wl__free_begin(uintptr_t p, void *stream, bool sync, wl__freeinfo_t *fi) {
  fi->tracked = false;
  if (!p) return 0;
  /* Served memory is told by its address (alloc and gate modes only have any). */
  int r = wl__serve_free(p, stream, sync);
  if (r == 2) return 0; /* ours, refused for its stream: the driver answers, nothing to account */
  if (r) return r;
  if (wl__map_take(wl__ptrs, p, &fi->size, &fi->kind)) {
    wl__count(WL__ST_UNTRACKED_FREES, 1);
    return 0;
  }
  fi->tracked = true;
  return 0;
}

/* A host free of device memory is the driver's error, and the memory stays allocated: served
 * blocks are not looked at, and a device entry is left where it is. */
void wl__free_begin_host(uintptr_t p, wl__freeinfo_t *fi) {
  fi->tracked = false;
  if (!p || wl__map_take(wl__ptrs, p, &fi->size, &fi->kind)) {
    if (p) wl__count(WL__ST_UNTRACKED_FREES, 1);
    return;
  }
  if ((fi->kind & 0xff) != WL__K_HOST) {
    wl__map_put(wl__ptrs, p, fi->size, fi->kind);
    return;
  }
  fi->tracked = true;
}

void wl__free_end(uintptr_t p, void *stream, const wl__freeinfo_t *fi, bool ok) {
  if (!fi->tracked) return;
  if (!ok) { /* still allocated */
    wl__map_put(wl__ptrs, p, fi->size, fi->kind);
    return;
  }
  if (fi->kind == WL__K_HOST) {
    wl__count(WL__ST_HOST_FREES, 1);
    return;
  }
  wl__count(WL__ST_FREES, 1);
  wl__serve_unbook_kind(fi->kind, fi->size);
  if (wl__mode() == WL__MODE_GATE) wl__gate_mem_event(0, fi->size, stream);
  if (__atomic_load_n(&wl__trace, __ATOMIC_RELAXED))
    wl__trace_ev(WL_TRACE_FREE_REQ, 0, p, fi->size, (uint64_t)(uintptr_t)stream);
}

/* ---- device reset, context destruction
 * ---------------------------------------------------------*/

/* The tracked pointers' entries, copied shard by shard under each lock into an mmap'd array
 * (the caller munmaps *bytes); NULL when there are none or no memory. */
static entry_t *snapshot(wl__map_t *m, size_t *n, size_t *bytes) {
  size_t want = 0;
  for (unsigned j = 0; j < SHARDS; j++)
    want += __atomic_load_n(&m->shard[j].used, __ATOMIC_RELAXED);
  *n = 0;
  if (!want) return NULL;
  want += 64; /* room for entries put while we copy */
  *bytes = want * sizeof(entry_t);
  entry_t *out = mmap(NULL, *bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (out == MAP_FAILED) return NULL;
  for (unsigned j = 0; j < SHARDS; j++) {
    shard_t *s = &m->shard[j];
    lock(s);
    for (uint32_t i = 0; s->tab && i < s->cap && *n < want; i++)
      if (s->tab[i].key > KEY_DELETED) out[(*n)++] = s->tab[i];
    unlock(s);
  }
  return out;
}

/* Whether key still has an entry of kind (under its shard's lock). */
static bool still_tracked(uintptr_t key, unsigned kind) {
  shard_t *s;
  entry_t *e = find_locked(wl__ptrs, key, &s);
  if (!e) return false;
  bool same = e->kind == kind;
  unlock(s);
  return same;
}

/* What the driver destroys (a device reset: device >= 0 and its primary context ctx, NULL when
 * the driver cannot say which that is; a context the program created: ctx) goes as freed: the
 * synchronous, pitched and managed allocations and the pinned host memory allocated there, asked of
 * the driver pointer by pointer before the call (rare enough), not stream-ordered ones
 * ("cudaDeviceReset() will not destroy memory allocations by cudaMallocAsync()", and cuCtxDestroy's
 * note says the same) nor VMM handles and mappings (the program's own, no context's). Served blocks
 * of synchronous allocations are freed as the program would free them: at a reset only, as only
 * primary contexts are served. */
static void sweep(int device, CUcontext ctx) {
  __typeof__(&cuPointerGetAttribute) attr =
      (__typeof__(&cuPointerGetAttribute))wl__real(WL__H_cuPointerGetAttribute);
  int served = device >= 0 ? wl__serve_index(device) : -1;
  size_t n = 0, bytes = 0;
  entry_t *es = snapshot(wl__ptrs, &n, &bytes);
  unsigned untold = 0;
  for (size_t i = 0; i < n; i++) {
    unsigned k = es[i].kind & 0xff;
    bool gone = false;
    if (k == WL__K_SERVED) {
      if ((es[i].kind & WL__SERVED_SYNC) && served >= 0 &&
          (int)((es[i].kind >> 8) & 0xff) == served)
        wl__serve_free(es[i].key, NULL, false); /* takes the entry; liballoc reports it */
      continue;
    }
    if (k != WL__K_ASYNC && k != WL__K_VMM && k != WL__K_MAPPING) {
      CUresult r = CUDA_ERROR_NOT_SUPPORTED;
      if (ctx) {
        CUcontext c = NULL;
        if (attr) r = attr(&c, CU_POINTER_ATTRIBUTE_CONTEXT, (CUdeviceptr)es[i].key);
        gone = r == CUDA_SUCCESS && c == ctx;
      } else {
        int d = -1;
        if (attr) r = attr(&d, CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL, (CUdeviceptr)es[i].key);
        gone = r == CUDA_SUCCESS && d == device;
      }
      /* The driver knows nothing of it: freed by another thread since the snapshot (its free
       * took the entry out first), or really untold. */
      if (r != CUDA_SUCCESS && still_tracked(es[i].key, es[i].kind)) untold++;
    }
    uint64_t size;
    unsigned kind;
    if (!gone || wl__map_take(wl__ptrs, es[i].key, &size, &kind)) continue; /* or freed since */
    if ((kind & 0xff) == WL__K_HOST) {
      wl__count(WL__ST_HOST_FREES, 1);
      continue;
    }
    wl__count(WL__ST_FREES, 1);
    wl__serve_unbook_kind(kind, size);
    if (__atomic_load_n(&wl__trace, __ATOMIC_RELAXED))
      wl__trace_ev(WL_TRACE_FREE_REQ, 0, es[i].key, size, 0);
  }
  if (es) munmap(es, bytes);
  if (untold && device < 0)
    wl__warn("context %p destroyed: the driver would not say where %u tracked allocation%s "
             "lie; they stay accounted as live",
             (void *)ctx, untold, untold == 1 ? "" : "s");
  else if (untold)
    wl__warn("device %d reset: the driver would not say where %u tracked allocation%s lie; "
             "they stay accounted as live",
             device, untold, untold == 1 ? "" : "s");
}

void wl__account_reset(int device, CUcontext primary) {
  sweep(device, primary);
}

void wl__account_ctx_destroy(CUcontext ctx) {
  sweep(-1, ctx);
}
