/* The pinned-host arena: page-locked host allocations served by a private jemalloc arena whose
 * extent hooks carve large pinned chunks, so that cudaMallocHost & co. cost a malloc instead of
 * a page-locking system call each. */
#include "pinned.h"

#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* Types and MALLOCX_* only: the functions are reached through the table `je` below. In the
 * dynamic flavour this is deps/jemalloc's header (its names prefixed wl__je_), in the static one
 * Debian's. */
#include <jemalloc/jemalloc.h>

#include "log.h"
#include "util.h"

/* The jemalloc functions the arena calls, filled by je_load: one code path for both flavours. */
static struct {
  void *(*mallocx)(size_t size, int flags);
  void (*dallocx)(void *ptr, int flags);
  size_t (*sallocx)(const void *ptr, int flags);
  int (*mallctl)(const char *name, void *oldp, size_t *oldlenp, void *newp, size_t newlen);
  void (**malloc_message)(void *cbopaque, const char *s);
} je;

#if defined(WL_PINNED_DYNAMIC)
#include <dlfcn.h>
#include <limits.h>

/* The dynamic flavour: jemalloc is libwavelet-jemalloc.so (built by scripts/jemalloc.sh with
 * dynamic TLS, names prefixed wl__je_ and, since a definition of wl__je_malloc_conf here could
 * not reach it, the arena's options tcache:false,narenas:1,background_thread:false built in; its
 * MALLOC_CONF is WL__JE_MALLOC_CONF), loaded with dlopen at the first wl__pinned_init. So
 * libwavelet.so carries none of jemalloc's TLS and may itself be dlopen'ed. */
#define JE_LIBRARY "libwavelet-jemalloc.so"

static pthread_mutex_t load_lock = PTHREAD_MUTEX_INITIALIZER;
static bool je_loaded;         /* under load_lock; never unset (RTLD_NODELETE) */
static char je_path[PATH_MAX]; /* wl__pinned_set_library's, or beside this object */
static void *(*je_lookup)(void *handle, const char *name); /* NULL: dlsym */

/* At load, before the program can chdir: the object this code is in (libwavelet.so), as an
 * absolute path, names the directory to load jemalloc from. */
__attribute__((constructor)) static void je_default_path(void) {
  Dl_info di;
  if (je_path[0] || !dladdr((void *)je_default_path, &di) || !di.dli_fname) return;
  const char *slash = strrchr(di.dli_fname, '/');
  int dir = slash ? (int)(slash - di.dli_fname + 1) : 0;
  char cwd[PATH_MAX] = "";
  if (di.dli_fname[0] != '/' && !getcwd(cwd, sizeof(cwd) - 1)) return;
  if (cwd[0]) strcat(cwd, "/");
  if (snprintf(je_path, sizeof(je_path), "%s%.*s%s", cwd, dir, di.dli_fname, JE_LIBRARY) >=
      (int)sizeof(je_path))
    je_path[0] = 0;
}

int wl__pinned_set_library(const char *path, void *(*lookup)(void *handle, const char *name)) {
  size_t n = path ? strlen(path) : 0;
  if (n >= sizeof(je_path)) return -ENAMETOOLONG;
  pthread_mutex_lock(&load_lock);
  int rc = je_loaded ? -EBUSY : 0;
  if (!rc && path) memcpy(je_path, path, n + 1);
  if (!rc && lookup) je_lookup = lookup;
  pthread_mutex_unlock(&load_lock);
  return rc;
}

/* Under load_lock: 0, or -ENOENT after one line saying why. */
static int je_open(void) {
  static const char *const names[] = {"wl__je_mallocx", "wl__je_dallocx", "wl__je_sallocx",
                                      "wl__je_mallctl", "wl__je_malloc_message"};
  enum { N = sizeof(names) / sizeof(names[0]) };
  void *h = je_path[0] ? dlopen(je_path, RTLD_NOW | RTLD_LOCAL | RTLD_NODELETE) : NULL;
  if (!h) {
    const char *why = je_path[0] ? dlerror() : "cannot tell where libwavelet.so is";
    wl__warn("pinned arena: cannot load %s (%s); pinned allocations pass through",
             je_path[0] ? je_path : JE_LIBRARY, why ? why : "?");
    return -ENOENT;
  }
  void *(*lookup)(void *, const char *) = je_lookup ? je_lookup : dlsym;
  void *fn[N];
  for (size_t i = 0; i < N; i++) {
    if (!(fn[i] = lookup(h, names[i]))) {
      /* The handle is kept: RTLD_NODELETE keeps the object mapped anyway. */
      wl__warn("pinned arena: %s defines no %s; pinned allocations pass through", je_path,
               names[i]);
      return -ENOENT;
    }
  }
  je.mallocx = (__typeof__(je.mallocx))fn[0];
  je.dallocx = (__typeof__(je.dallocx))fn[1];
  je.sallocx = (__typeof__(je.sallocx))fn[2];
  je.mallctl = (__typeof__(je.mallctl))fn[3];
  je.malloc_message = fn[4];
  return 0;
}

/* Once it succeeds; tried again at each wl__pinned_init until then. */
static int je_load(void) {
  pthread_mutex_lock(&load_lock);
  int rc = je_loaded ? 0 : je_open();
  if (!rc) je_loaded = true;
  pthread_mutex_unlock(&load_lock);
  return rc;
}
#else
/* The static flavour: Debian builds jemalloc without a symbol prefix; cmake/WaveletJemalloc.cmake
 * renames every symbol of its static archive to wl__je_*, so this module reaches it while every
 * malloc of the process (ours included) stays glibc's. */
void *wl__je_mallocx(size_t size, int flags);
void wl__je_dallocx(void *ptr, int flags);
size_t wl__je_sallocx(const void *ptr, int flags);
int wl__je_mallctl(const char *name, void *oldp, size_t *oldlenp, void *newp, size_t newlen);
extern void (*wl__je_malloc_message)(void *cbopaque, const char *s);

/* jemalloc's only dlsym call, renamed to this (cmake/WaveletJemalloc.cmake): it asks for
 * dlsym(RTLD_NEXT, "pthread_create") while it initialises, which inside libwavelet.so would reach
 * the interposer's own dlsym hook. NULL makes jemalloc (built without lazy locking) call
 * pthread_create directly. */
void *wl__je_dlsym(void *handle, const char *name);
void *wl__je_dlsym(void *handle, const char *name) {
  return NULL;
}

/* Overrides jemalloc's weak default. The private instance serves only this arena, so it needs
 * no thread caches, one automatic arena and no background threads. MALLOC_CONF still applies on
 * top (jemalloc reads it for every copy in the process). */
const char *wl__je_malloc_conf = "tcache:false,narenas:1,background_thread:false";

int wl__pinned_set_library(const char *path, void *(*lookup)(void *handle, const char *name)) {
  (void)path;
  (void)lookup;
  return 0;
}

static int je_load(void) {
  je.mallocx = wl__je_mallocx;
  je.dallocx = wl__je_dallocx;
  je.sallocx = wl__je_sallocx;
  je.mallctl = wl__je_mallctl;
  je.malloc_message = &wl__je_malloc_message;
  return 0;
}
#endif

/* jemalloc's arena_config_t (internal, stable since 5.3.0): the configuration that
 * experimental.arenas_create_ext takes, so that the arena's metadata is NOT allocated through
 * our hooks (the default for arenas.create) and never lands in pinned memory. */
typedef struct wl__je_arena_config_s {
  extent_hooks_t *extent_hooks;
  bool metadata_use_hooks;
} wl__je_arena_config_t;

#define PINNED_MAX_REQUEST (1ull << 40)
#define PINNED_PAGE        4096u
#define PINNED_SMALL_ALIGN 512u /* the H200 driver's step for small pinned blocks */

typedef struct chunk_s {
  uintptr_t start, end; /* [start, end) */
  uintptr_t bump;       /* arena chunks: extents are carved from here upwards */
  bool own;             /* a request with a chunk of its own */
  int key;              /* whose: the arena (device) it was allocated for */
} chunk_t;

typedef struct live_s {
  uintptr_t p; /* 0: empty, 1: tombstone */
  size_t size, usable;
  unsigned flags;
  bool own;
  int key;
} live_t;

#define LIVE_EMPTY 0u
#define LIVE_TOMB  1u

static struct {
  pthread_mutex_t lock; /* chunks and live table; never held while calling jemalloc */
  wl__pinned_ops_t ops;
  size_t chunk_size;
  /* One jemalloc arena per key (device): pinned memory belongs to the context it was allocated
   * in, so a block must never lie in a chunk another device's context pinned (a reset of that
   * device would unmap it). arena[k] is valid when made[k]. */
  unsigned arena[WL_PINNED_KEYS];
  bool made[WL_PINNED_KEYS];
  atomic_bool ready;
  atomic_bool child;
  chunk_t *chunks; /* sorted by start */
  size_t nchunks, chunks_cap;
  live_t *live;
  size_t live_cap, live_used, live_tombs; /* live_cap: 0 or a power of two */
  _Atomic uint64_t served, passed, bad_frees, chunk_allocs, chunk_frees;
  uint64_t live_bytes, wasted; /* under lock */
} g = {.lock = PTHREAD_MUTEX_INITIALIZER, .chunk_size = WL_PINNED_CHUNK_DEFAULT};

static extent_hooks_t g_hooks;

/* ---- the chunk registry (under g.lock) ---- */

/* Index of the chunk containing a, or -1. */
static long chunk_find(uintptr_t a) {
  size_t lo = 0, hi = g.nchunks;
  while (lo < hi) {
    size_t mid = lo + (hi - lo) / 2;
    if (g.chunks[mid].end <= a)
      lo = mid + 1;
    else
      hi = mid;
  }
  if (lo < g.nchunks && g.chunks[lo].start <= a && a < g.chunks[lo].end) return (long)lo;
  return -1;
}

static bool chunk_insert(uintptr_t start, size_t size, bool own, int key) {
  if (g.nchunks == g.chunks_cap) {
    size_t cap = g.chunks_cap ? g.chunks_cap * 2 : 64;
    chunk_t *n = realloc(g.chunks, cap * sizeof(*n));
    if (!n) return false;
    g.chunks = n;
    g.chunks_cap = cap;
  }
  size_t i = 0;
  while (i < g.nchunks && g.chunks[i].start < start) i++;
  memmove(&g.chunks[i + 1], &g.chunks[i], (g.nchunks - i) * sizeof(*g.chunks));
  g.chunks[i] =
      (chunk_t){.start = start, .end = start + size, .bump = start, .own = own, .key = key};
  g.nchunks++;
  return true;
}

static void chunk_remove(size_t i) {
  memmove(&g.chunks[i], &g.chunks[i + 1], (g.nchunks - i - 1) * sizeof(*g.chunks));
  g.nchunks--;
}

/* ---- the live table: open addressing, linear probing (under g.lock) ---- */

static size_t live_hash(uintptr_t p, size_t cap) {
  return (size_t)(((uint64_t)p >> 8) * 0x9E3779B97F4A7C15ull >> 20) & (cap - 1);
}

static live_t *live_find(uintptr_t p) {
  if (!g.live_cap) return NULL;
  for (size_t i = live_hash(p, g.live_cap), n = 0; n < g.live_cap;
       i = (i + 1) & (g.live_cap - 1), n++) {
    if (g.live[i].p == LIVE_EMPTY) return NULL;
    if (g.live[i].p == p) return &g.live[i];
  }
  return NULL;
}

static bool live_grow(void) {
  size_t cap = g.live_cap ? g.live_cap : 256;
  if ((g.live_used + 1) * 2 > cap) cap *= 2;
  live_t *n = calloc(cap, sizeof(*n));
  if (!n) return false;
  for (size_t i = 0; i < g.live_cap; i++) {
    if (g.live[i].p <= LIVE_TOMB) continue;
    size_t j = live_hash(g.live[i].p, cap);
    while (n[j].p != LIVE_EMPTY) j = (j + 1) & (cap - 1);
    n[j] = g.live[i];
  }
  free(g.live);
  g.live = n;
  g.live_cap = cap;
  g.live_tombs = 0;
  return true;
}

static bool live_insert(const live_t *e) {
  if ((g.live_used + g.live_tombs + 1) * 2 > g.live_cap && !live_grow()) return false;
  size_t i = live_hash(e->p, g.live_cap);
  while (g.live[i].p > LIVE_TOMB) i = (i + 1) & (g.live_cap - 1);
  if (g.live[i].p == LIVE_TOMB) g.live_tombs--;
  g.live[i] = *e;
  g.live_used++;
  g.live_bytes += e->size;
  return true;
}

static void live_remove(live_t *e) {
  g.live_bytes -= e->size;
  e->p = LIVE_TOMB;
  g.live_used--;
  g.live_tombs++;
}

/* ---- jemalloc's extent hooks ---- */

/* The key whose arena jemalloc's index names (under g.lock), or -1. */
static int key_of_arena(unsigned arena_ind) {
  for (int k = 0; k < WL_PINNED_KEYS; k++)
    if (g.made[k] && g.arena[k] == arena_ind) return k;
  return -1;
}

/* Carves an extent from the arena's own chunks (first fit), taking a new chunk when none has
 * room. Extents are never handed back (dalloc opts out), so a bump pointer per chunk is
 * enough. */
static void *hook_alloc(extent_hooks_t *h, void *new_addr, size_t size, size_t alignment,
                        bool *zero, bool *commit, unsigned arena_ind) {
  uintptr_t r = 0;
  if (!wl__is_pow2(alignment) || alignment < PINNED_PAGE) alignment = PINNED_PAGE;
  pthread_mutex_lock(&g.lock);
  int key = key_of_arena(arena_ind);
  if (key < 0) {
    pthread_mutex_unlock(&g.lock);
    return NULL;
  }
  if (new_addr) {
    /* In-place growth: only at a chunk's bump pointer, never across two chunks. */
    long i = chunk_find((uintptr_t)new_addr);
    if (i >= 0 && !g.chunks[i].own && g.chunks[i].key == key &&
        g.chunks[i].bump == (uintptr_t)new_addr && (uintptr_t)new_addr > g.chunks[i].start &&
        g.chunks[i].end - g.chunks[i].bump >= size) {
      r = g.chunks[i].bump;
      g.chunks[i].bump += size;
    }
    pthread_mutex_unlock(&g.lock);
    goto out;
  }
  for (size_t i = 0; i < g.nchunks && !r; i++) {
    chunk_t *c = &g.chunks[i];
    if (c->own || c->key != key) continue;
    uintptr_t a = (c->bump + alignment - 1) & ~(uintptr_t)(alignment - 1);
    if (a >= c->bump && a <= c->end && c->end - a >= size) {
      r = a;
      g.wasted += a - c->bump;
      c->bump = a + size;
    }
  }
  pthread_mutex_unlock(&g.lock);
  if (!r) {
    size_t need = wl__align_up(size + alignment - PINNED_PAGE, PINNED_PAGE);
    size_t csize = WL_MAX(g.chunk_size, need);
    void *mem = NULL;
    if (need == 0 || g.ops.chunk_alloc(g.ops.ctx, csize, &mem) != 0 || !mem) return NULL;
    atomic_fetch_add(&g.chunk_allocs, 1);
    pthread_mutex_lock(&g.lock);
    if (!chunk_insert((uintptr_t)mem, csize, false, key)) {
      pthread_mutex_unlock(&g.lock);
      g.ops.chunk_free(g.ops.ctx, mem, csize);
      atomic_fetch_add(&g.chunk_frees, 1);
      return NULL;
    }
    chunk_t *c = &g.chunks[chunk_find((uintptr_t)mem)];
    r = (c->start + alignment - 1) & ~(uintptr_t)(alignment - 1);
    g.wasted += r - c->start;
    c->bump = r + size;
    pthread_mutex_unlock(&g.lock);
  }
out:
  if (!r) return NULL;
  /* Pinned pages are always committed; zeroed only when jemalloc asks (we cannot know whether
   * the driver zeroes them). */
  if (*zero) memset((void *)r, 0, size);
  *commit = true;
  return (void *)r;
}

/* true = "not done": the extent stays mapped and jemalloc retains it for reuse. A chunk goes back
 * only with the whole arena (wl__pinned_shutdown). */
static bool hook_dalloc(extent_hooks_t *h, void *addr, size_t size, bool committed, unsigned ai) {
  return true;
}

static bool hook_commit(extent_hooks_t *h, void *addr, size_t size, size_t off, size_t len,
                        unsigned ai) {
  return false; /* already committed */
}

/* Refused: decommitting would hand page-locked pages back to the kernel under the driver. */
static bool hook_decommit(extent_hooks_t *h, void *addr, size_t size, size_t off, size_t len,
                          unsigned ai) {
  return true;
}

static bool hook_split(extent_hooks_t *h, void *addr, size_t size, size_t size_a, size_t size_b,
                       bool committed, unsigned ai) {
  return false;
}

/* Two extents merge only inside one chunk: a block that straddled two cuMemHostAlloc chunks
 * would not be one page-locked allocation for the driver's copy engines. */
static bool hook_merge(extent_hooks_t *h, void *addr_a, size_t size_a, void *addr_b, size_t size_b,
                       bool committed, unsigned ai) {
  pthread_mutex_lock(&g.lock);
  long i = chunk_find((uintptr_t)addr_a);
  bool same =
      i >= 0 && chunk_find((uintptr_t)addr_b) == i && (uintptr_t)addr_b + size_b <= g.chunks[i].end;
  pthread_mutex_unlock(&g.lock);
  return !same;
}

static void je_message(void *opaque, const char *s) {
  char line[200];
  size_t n = strnlen(s, sizeof(line) - 1);
  memcpy(line, s, n);
  while (n && (line[n - 1] == '\n' || line[n - 1] == '\r')) n--;
  line[n] = 0;
  if (n) wl__error("pinned arena: jemalloc: %s", line);
}

/* ---- the interface ---- */

int wl__pinned_configure(size_t chunk_size) {
  if (chunk_size < (2u << 20) || !wl__is_pow2(chunk_size)) {
    wl__warn("pinned arena: chunk size %zu is not a power of two of 2 MiB or more", chunk_size);
    return -EINVAL;
  }
  if (atomic_load(&g.ready)) return -EBUSY;
  g.chunk_size = chunk_size;
  return 0;
}

/* jemalloc 5.3's fork handlers count its arenas before they lock them and again after the
 * fork: an arena created in between (ours, on another thread) has its locks unlocked in the
 * parent without having been locked, releasing them under whoever holds them (ThreadSanitizer
 * reported it). Our handlers, registered after jemalloc's, run before its prefork (glibc runs
 * prepare handlers last-registered first) and keep arena creation out of the whole fork. */
static pthread_mutex_t create_lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_once_t create_once = PTHREAD_ONCE_INIT;

static void create_lock_take(void) {
  pthread_mutex_lock(&create_lock);
}

static void create_lock_give(void) {
  pthread_mutex_unlock(&create_lock);
}

static void create_atfork(void) {
  unsigned n = 0;
  size_t len = sizeof(n);
  je.mallctl("arenas.narenas", &n, &len, NULL, 0); /* jemalloc registers its handlers */
  pthread_atfork(create_lock_take, create_lock_give, create_lock_give);
}

static int je_set(unsigned arena, const char *leaf, void *val, size_t len) {
  char name[64];
  snprintf(name, sizeof(name), "arena.%u.%s", arena, leaf);
  return je.mallctl(name, NULL, NULL, val, len);
}

/* Creates key's arena (under create_lock: arena creation stays out of a fork). 0 or a negative
 * errno (one line said why). */
static int make_arena(int key) {
  wl__je_arena_config_t cfg = {.extent_hooks = &g_hooks, .metadata_use_hooks = false};
  unsigned arena = 0;
  size_t len = sizeof(arena);
  int rc = 0;
  create_lock_take();
  if (!g.made[key]) {
    rc = je.mallctl("experimental.arenas_create_ext", &arena, &len, &cfg, sizeof(cfg));
    if (!rc) {
      /* Never decay: freed pinned pages stay dirty and are reused, not purged. */
      ssize_t never = -1;
      size_t grow = g.chunk_size;
      if (je_set(arena, "dirty_decay_ms", &never, sizeof(never)) ||
          je_set(arena, "muzzy_decay_ms", &never, sizeof(never)) ||
          je_set(arena, "retain_grow_limit", &grow, sizeof(grow)))
        wl__warn("pinned arena: could not set the arena's decay or growth limit (kept jemalloc's)");
      pthread_mutex_lock(&g.lock);
      g.arena[key] = arena;
      g.made[key] = true;
      pthread_mutex_unlock(&g.lock);
    }
  }
  create_lock_give();
  if (rc) {
    wl__error("pinned arena: jemalloc could not create the arena (%s); pinned allocations pass "
              "through",
              strerror(rc));
    return -rc;
  }
  return 0;
}

int wl__pinned_init(const wl__pinned_ops_t *ops) {
  if (!ops || !ops->chunk_alloc || !ops->chunk_free) return -EINVAL;
  if (atomic_load(&g.ready)) return -EALREADY;
  int rc = je_load();
  if (rc) return rc;
  *je.malloc_message = je_message;
  g.ops = *ops;
  g_hooks = (extent_hooks_t){.alloc = hook_alloc,
                             .dalloc = hook_dalloc,
                             .destroy = NULL, /* chunks go back in wl__pinned_shutdown */
                             .commit = hook_commit,
                             .decommit = hook_decommit,
                             .purge_lazy = NULL, /* opted out: pinned pages are never purged */
                             .purge_forced = NULL,
                             .split = hook_split,
                             .merge = hook_merge};
  pthread_once(&create_once, create_atfork);
  memset(g.made, 0, sizeof(g.made));
  if ((rc = make_arena(0)) != 0) return rc;
  atomic_store(&g.served, 0);
  atomic_store(&g.passed, 0);
  atomic_store(&g.bad_frees, 0);
  atomic_store(&g.chunk_allocs, 0);
  atomic_store(&g.chunk_frees, 0);
  atomic_store(&g.child, false);
  atomic_store(&g.ready, true);
  return 0;
}

void *wl__pinned_alloc(size_t size, unsigned flags) {
  return wl__pinned_alloc_for(size, flags, 0);
}

void *wl__pinned_alloc_for(size_t size, unsigned flags, int key) {
  if (!atomic_load_explicit(&g.ready, memory_order_acquire) || atomic_load(&g.child) || size == 0 ||
      size > PINNED_MAX_REQUEST || (flags & ~(WL_PINNED_F_PORTABLE | WL_PINNED_F_DEVICEMAP)) ||
      key < 0 || key >= WL_PINNED_KEYS) {
    atomic_fetch_add(&g.passed, 1);
    return NULL;
  }
  pthread_mutex_lock(&g.lock);
  bool made = g.made[key];
  unsigned arena = g.arena[key];
  pthread_mutex_unlock(&g.lock);
  if (!made && size < g.chunk_size / 2) {
    if (make_arena(key) != 0) {
      atomic_fetch_add(&g.passed, 1);
      return NULL;
    }
    pthread_mutex_lock(&g.lock);
    arena = g.arena[key];
    pthread_mutex_unlock(&g.lock);
  }
  live_t e = {.size = size, .flags = flags, .key = key};
  void *p = NULL;
  if (size >= g.chunk_size / 2) {
    /* Its own chunk: no arena tail is wasted and the pages go back at its free. */
    size_t csize = wl__align_up(size, PINNED_PAGE);
    if (g.ops.chunk_alloc(g.ops.ctx, csize, &p) != 0 || !p) {
      atomic_fetch_add(&g.passed, 1);
      return NULL;
    }
    atomic_fetch_add(&g.chunk_allocs, 1);
    e.own = true;
    e.usable = csize;
  } else {
    size_t align = size >= PINNED_PAGE ? PINNED_PAGE : PINNED_SMALL_ALIGN;
    int mflags = MALLOCX_ALIGN(align) | MALLOCX_ARENA(arena) | MALLOCX_TCACHE_NONE;
    p = je.mallocx(size, mflags);
    if (!p) {
      atomic_fetch_add(&g.passed, 1);
      return NULL;
    }
    e.usable = je.sallocx(p, mflags);
  }
  e.p = (uintptr_t)p;
  pthread_mutex_lock(&g.lock);
  bool ok = (!e.own || chunk_insert(e.p, e.usable, true, key)) && live_insert(&e);
  if (!ok && e.own) {
    long i = chunk_find(e.p);
    if (i >= 0) chunk_remove((size_t)i);
  }
  pthread_mutex_unlock(&g.lock);
  if (!ok) {
    if (e.own) {
      g.ops.chunk_free(g.ops.ctx, p, e.usable);
      atomic_fetch_add(&g.chunk_frees, 1);
    } else {
      je.dallocx(p, MALLOCX_TCACHE_NONE);
    }
    atomic_fetch_add(&g.passed, 1);
    return NULL;
  }
  atomic_fetch_add(&g.served, 1);
  return p;
}

int wl__pinned_free(void *p) {
  if (!p) return -ENOENT;
  uintptr_t a = (uintptr_t)p;
  pthread_mutex_lock(&g.lock);
  live_t *e = live_find(a);
  if (!e) {
    bool inside = chunk_find(a) >= 0;
    pthread_mutex_unlock(&g.lock);
    if (!inside) return -ENOENT;
    atomic_fetch_add(&g.bad_frees, 1);
    wl__warn("pinned arena: free of %p, inside a pinned chunk but not a live block (a double or "
             "interior free); ignored",
             p);
    return -EINVAL;
  }
  live_t copy = *e;
  live_remove(e);
  bool child = atomic_load(&g.child);
  if (copy.own && !child) {
    long i = chunk_find(a);
    if (i >= 0) chunk_remove((size_t)i);
  }
  pthread_mutex_unlock(&g.lock);
  if (child) return 0; /* the parent's pages: forgotten, not reused */
  if (copy.own) {
    g.ops.chunk_free(g.ops.ctx, p, copy.usable);
    atomic_fetch_add(&g.chunk_frees, 1);
  } else {
    je.dallocx(p, MALLOCX_TCACHE_NONE); /* jemalloc finds the block's arena itself */
  }
  return 0;
}

bool wl__pinned_owns(const void *p) {
  if (!p) return false;
  pthread_mutex_lock(&g.lock);
  bool in = chunk_find((uintptr_t)p) >= 0;
  pthread_mutex_unlock(&g.lock);
  return in;
}

int wl__pinned_query(const void *p, size_t *size, size_t *usable, unsigned *flags) {
  pthread_mutex_lock(&g.lock);
  live_t *e = p ? live_find((uintptr_t)p) : NULL;
  live_t copy = e ? *e : (live_t){0};
  pthread_mutex_unlock(&g.lock);
  if (!e) return -ENOENT;
  if (size) *size = copy.size;
  if (usable) *usable = copy.usable;
  if (flags) *flags = copy.flags;
  return 0;
}

int wl__pinned_key(const void *p) {
  pthread_mutex_lock(&g.lock);
  live_t *e = p ? live_find((uintptr_t)p) : NULL;
  int key = e ? e->key : -1;
  pthread_mutex_unlock(&g.lock);
  return key;
}

/* Destroys key's arena if it has one: 0, or jemalloc's error (its extents then stay mapped in
 * its chunks, which must not be freed). */
static int destroy_arena(int key) {
  int rc = 0;
  create_lock_take();
  if (g.made[key]) {
    char name[64];
    snprintf(name, sizeof(name), "arena.%u.destroy", g.arena[key]);
    rc = je.mallctl(name, NULL, NULL, NULL, 0);
    pthread_mutex_lock(&g.lock);
    g.made[key] = false; /* a later request makes a new one, on new chunks */
    pthread_mutex_unlock(&g.lock);
  }
  create_lock_give();
  return rc;
}

size_t wl__pinned_reset_key(int key) {
  if (!atomic_load_explicit(&g.ready, memory_order_acquire) || atomic_load(&g.child) || key < 0 ||
      key >= WL_PINNED_KEYS)
    return 0;
  int rc = destroy_arena(key);
  if (rc)
    wl__warn("pinned arena: jemalloc could not destroy arena %d (%s); its chunks are left to the "
             "driver",
             key, strerror(rc));
  pthread_mutex_lock(&g.lock);
  for (size_t i = 0; i < g.live_cap; i++)
    if (g.live[i].p > LIVE_TOMB && g.live[i].key == key) live_remove(&g.live[i]);
  chunk_t *gone = malloc((g.nchunks ? g.nchunks : 1) * sizeof(*gone));
  size_t n = 0;
  for (size_t i = 0; i < g.nchunks;) {
    if (g.chunks[i].key != key) {
      i++;
      continue;
    }
    if (gone) gone[n++] = g.chunks[i];
    chunk_remove(i);
  }
  pthread_mutex_unlock(&g.lock);
  /* Freed now, while the driver still knows them (it would free them with the reset anyway). */
  for (size_t i = 0; i < n; i++) {
    if (!gone[i].own && rc) continue;
    g.ops.chunk_free(g.ops.ctx, (void *)gone[i].start, gone[i].end - gone[i].start);
    atomic_fetch_add(&g.chunk_frees, 1);
  }
  free(gone);
  return n;
}

void wl__pinned_fork_child(void) {
  /* Another thread may have held the lock at fork; only this thread exists now. */
  pthread_mutex_init(&g.lock, NULL);
  atomic_store(&g.child, true);
}

void wl__pinned_stats(wl__pinned_stats_t *out) {
  memset(out, 0, sizeof(*out));
  pthread_mutex_lock(&g.lock);
  for (size_t i = 0; i < g.nchunks; i++) {
    out->chunks++;
    out->chunk_bytes += g.chunks[i].end - g.chunks[i].start;
    out->own_chunks += g.chunks[i].own;
  }
  out->live_blocks = g.live_used;
  out->live_bytes = g.live_bytes;
  out->wasted_bytes = g.wasted;
  pthread_mutex_unlock(&g.lock);
  out->chunk_allocs = atomic_load(&g.chunk_allocs);
  out->chunk_frees = atomic_load(&g.chunk_frees);
  out->served = atomic_load(&g.served);
  out->passed = atomic_load(&g.passed);
  out->bad_frees = atomic_load(&g.bad_frees);
}

void wl__pinned_shutdown(void) {
  if (!atomic_exchange(&g.ready, false)) return;
  bool arena_gone = true;
  if (!atomic_load(&g.child)) {
    for (int k = 0; k < WL_PINNED_KEYS; k++) {
      int rc = destroy_arena(k);
      if (rc) {
        /* jemalloc still maps extents into the arena chunks: keep them (a leak, not a crash). */
        wl__warn("pinned arena: jemalloc could not destroy arena %d (%s); its chunks are kept", k,
                 strerror(rc));
        arena_gone = false;
      }
    }
  }
  pthread_mutex_lock(&g.lock);
  chunk_t *chunks = g.chunks;
  size_t n = g.nchunks;
  g.chunks = NULL;
  g.nchunks = g.chunks_cap = 0;
  free(g.live);
  g.live = NULL;
  g.live_cap = g.live_used = g.live_tombs = 0;
  g.live_bytes = g.wasted = 0;
  pthread_mutex_unlock(&g.lock);
  bool child = atomic_load(&g.child);
  for (size_t i = 0; i < n; i++) {
    if (child || (!chunks[i].own && !arena_gone)) continue;
    g.ops.chunk_free(g.ops.ctx, (void *)chunks[i].start, chunks[i].end - chunks[i].start);
    atomic_fetch_add(&g.chunk_frees, 1);
  }
  free(chunks);
}
