/* liballoc's tests on the host provider: size classes, split and coalesce, stream-ordered reuse,
 * trimming, budgets, bad input, and a randomized run checking invariants after every step. */
#include "internal.h"
#include "wltest.h"

#include <errno.h>
#include <linux/membarrier.h>
#include <pthread.h>
#include <semaphore.h>
#include <stdlib.h>
#include <string.h>
#include <sched.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#define MiB   ((size_t)1 << 20)
#define CHUNK (20 * MiB)

/* ---- a counting wrapper around the host provider: leaks and injected failures -----------------*/

typedef struct counting_s {
  wl_provider_t inner;
  long reserved, handles, mapped, events; /* outstanding */
  long creates, maps;
  int fail_create, fail_map; /* fail the next N calls */
  /* A stream only one thread can record on (CUDA's per-thread default stream): -EAGAIN
   * elsewhere. */
  wl_stream_t owned;
  pthread_t owner;
  long refused;
} counting_t;

static counting_t cnt;

static int c_reserve(void *ctx, size_t size, uintptr_t *addr) {
  int rc = cnt.inner.reserve(cnt.inner.ctx, size, addr);
  if (!rc) cnt.reserved++;
  return rc;
}
static int c_unreserve(void *ctx, uintptr_t addr, size_t size) {
  cnt.reserved--;
  return cnt.inner.unreserve(cnt.inner.ctx, addr, size);
}
static int c_phys_create(void *ctx, size_t size, void **h) {
  if (cnt.fail_create > 0) {
    cnt.fail_create--;
    return -ENOMEM;
  }
  int rc = cnt.inner.phys_create(cnt.inner.ctx, size, h);
  if (!rc) cnt.handles++, cnt.creates++;
  return rc;
}
static int c_phys_release(void *ctx, void *h, size_t size) {
  cnt.handles--;
  return cnt.inner.phys_release(cnt.inner.ctx, h, size);
}
static int c_map(void *ctx, uintptr_t addr, size_t size, void *h) {
  if (cnt.fail_map > 0) {
    cnt.fail_map--;
    return -EIO;
  }
  int rc = cnt.inner.map(cnt.inner.ctx, addr, size, h);
  if (!rc) cnt.mapped++, cnt.maps++;
  return rc;
}
static int c_unmap(void *ctx, uintptr_t addr, size_t size) {
  cnt.mapped--;
  return cnt.inner.unmap(cnt.inner.ctx, addr, size);
}
static int c_stream_check(void *ctx, wl_stream_t s) {
  return cnt.inner.stream_check(cnt.inner.ctx, s);
}
static int c_event_create(void *ctx, void **e) {
  int rc = cnt.inner.event_create(cnt.inner.ctx, e);
  if (!rc) cnt.events++;
  return rc;
}
static int c_event_destroy(void *ctx, void *e) {
  cnt.events--;
  return cnt.inner.event_destroy(cnt.inner.ctx, e);
}
static int c_event_record(void *ctx, void *e, wl_stream_t s) {
  if (s && s == __atomic_load_n(&cnt.owned, __ATOMIC_ACQUIRE) &&
      !pthread_equal(pthread_self(), cnt.owner)) {
    __atomic_add_fetch(&cnt.refused, 1, __ATOMIC_RELAXED);
    return -EAGAIN;
  }
  return cnt.inner.event_record(cnt.inner.ctx, e, s);
}
static int c_event_query(void *ctx, void *e) {
  return cnt.inner.event_query(cnt.inner.ctx, e);
}
static void c_destroy(void *ctx) {
  (void)ctx; /* the inner provider outlives the allocator: streams are destroyed after it */
}

/* The host provider the current test uses (for streams), and its counting wrapper. */
static wl_provider_t host;

static wl_provider_t counting_provider(size_t capacity) {
  memset(&cnt, 0, sizeof cnt);
  CU_ASSERT_FATAL(wl_provider_host_init(&host, capacity, 0) == 0);
  cnt.inner = host;
  wl_provider_t p = host;
  p.name = "counting-host";
  p.ctx = &cnt;
  p.reserve = c_reserve;
  p.unreserve = c_unreserve;
  p.phys_create = c_phys_create;
  p.phys_release = c_phys_release;
  p.map = c_map;
  p.unmap = c_unmap;
  p.stream_check = c_stream_check;
  p.event_create = c_event_create;
  p.event_destroy = c_event_destroy;
  p.event_record = c_event_record;
  p.event_query = c_event_query;
  p.destroy = c_destroy;
  return p;
}

static wl_alloc_t *make(const wl_alloc_config_t *cfg, size_t capacity) {
  wl_provider_t p = counting_provider(capacity);
  wl_alloc_t *a = NULL;
  CU_ASSERT_FATAL(wl_alloc_create(&a, &p, cfg) == 0);
  return a;
}

/* An allocator without thread caches, for tests of where the core allocator places blocks. */
static wl_alloc_t *make_core(size_t capacity) {
  wl_alloc_config_t cfg;
  wl_alloc_config_default(&cfg);
  cfg.tcache_off = 1;
  return make(&cfg, capacity);
}

/* Blocks held in a's thread caches. */
static size_t tc_count(wl_alloc_t *a) {
  size_t n = 0;
  for (wl__tcache_t *tc = a->tcs; tc; tc = tc->anext)
    for (int b = 0; b < WL__TC_NBINS; b++) n += tc->n[b];
  return n;
}

/* Destroys the allocator and checks that nothing leaked, then the host provider. */
static void finish(wl_alloc_t *a) {
  CU_ASSERT(wl_alloc_check(a) == 0);
  wl_alloc_destroy(a);
  CU_ASSERT_EQUAL(cnt.reserved, 0);
  CU_ASSERT_EQUAL(cnt.handles, 0);
  CU_ASSERT_EQUAL(cnt.mapped, 0);
  CU_ASSERT_EQUAL(cnt.events, 0);
  host.destroy(host.ctx);
}

static wl_alloc_stats_t stats(wl_alloc_t *a) {
  wl_alloc_stats_t st;
  wl_alloc_stats_get(a, &st);
  return st;
}

/* Runs fn with stderr captured; returns the number of lines it wrote. */
static int count_stderr_lines(void (*fn)(void *), void *arg, char *buf, size_t len) {
  int fds[2];
  if (pipe(fds)) return -1;
  fflush(stderr);
  int saved = dup(2);
  dup2(fds[1], 2);
  fn(arg);
  fflush(stderr);
  dup2(saved, 2);
  close(saved);
  close(fds[1]);
  ssize_t n = read(fds[0], buf, len - 1);
  close(fds[0]);
  if (n < 0) n = 0;
  buf[n] = 0;
  int lines = 0;
  for (ssize_t i = 0; i < n; i++) lines += buf[i] == '\n';
  return lines;
}

/* ---- size classes
 * -------------------------------------------------------------------------------*/

/* The size tree against a brute-force search: random inserts, removals and replacements (many
 * equal sizes, so the address breaks ties), checked for key order, heap order and parent links
 * after every step, with lower_bound, max and a block's neighbours compared on each. */
static void test_size_tree(void) {
  enum { N = 600 };
  static wl__block_t b[N];
  bool in[N] = {0};
  wl__block_t *root = NULL;
  uint64_t x = 0x9E3779B97F4A7C15ull;
  size_t count = 0;
  unsigned bad = 0;
  for (int i = 0; i < N; i++) {
    memset(&b[i], 0, sizeof b[i]);
    b[i].addr = (uintptr_t)(i + 1) * 4096 * 7919 % ((uintptr_t)N * 4096 * 8);
  }
  for (int step = 0; step < 40000; step++) {
    x ^= x << 13, x ^= x >> 7, x ^= x << 17;
    int i = (int)(x % N), o = (int)((x >> 32) % N);
    if (in[i] && !in[o] && (x >> 60) == 0) {
      /* o takes i's place with i's key: swap the addresses, keep the sizes equal. */
      uintptr_t t = b[o].addr;
      b[o].addr = b[i].addr;
      b[o].size = b[i].size;
      wl__tree_replace(&root, &b[i], &b[o]);
      b[i].addr = t;
      in[i] = false;
      in[o] = true;
    } else if (!in[i]) {
      b[i].size = ((x >> 20) % 24 + 1) * 4096; /* 24 sizes: ties are the rule */
      wl__tree_insert(&root, &b[i]);
      in[i] = true;
      count++;
    } else {
      wl__tree_remove(&root, &b[i]);
      in[i] = false;
      count--;
    }
    if (wl__tree_check(root) != 0) bad++;
    if (step % 16 == 0 && wl__tree_count(root) != count) bad++;
    size_t want = ((x >> 40) % 26) * 4096;
    const wl__block_t *lb = NULL, *mx = NULL;
    for (int j = 0; j < N; j++) {
      if (!in[j]) continue;
      const wl__block_t *c = &b[j];
      if (c->size >= want &&
          (!lb || c->size < lb->size || (c->size == lb->size && c->addr < lb->addr)))
        lb = c;
      if (!mx || c->size > mx->size || (c->size == mx->size && c->addr > mx->addr)) mx = c;
    }
    if (wl__tree_lower_bound(root, want) != lb || wl__tree_max(root) != mx) bad++;
    if (!lb) continue;
    const wl__block_t *pv = NULL, *nx = NULL; /* lb's neighbours in key order */
    for (int j = 0; j < N; j++) {
      const wl__block_t *c = &b[j];
      if (!in[j] || c == lb) continue;
      bool below = c->size < lb->size || (c->size == lb->size && c->addr < lb->addr);
      if (below && (!pv || c->size > pv->size || (c->size == pv->size && c->addr > pv->addr)))
        pv = c;
      if (!below && (!nx || c->size < nx->size || (c->size == nx->size && c->addr < nx->addr)))
        nx = c;
    }
    wl__block_t *m = (wl__block_t *)lb;
    if (wl__tree_prev(m) != pv || wl__tree_next(m) != nx) bad++;
  }
  CU_ASSERT_EQUAL(bad, 0);
  CU_ASSERT(count > 100); /* the tree was deep enough to rotate at every level */
}

/* Chunk indices come from a multiply and shifts (wl__chunk_of): the same as a divide for every
 * offset a region can have, at the boundaries and in between, for odd multiples of powers of
 * two (the default 20 MiB among them) and powers of two. */
static void test_chunk_index(void) {
  static const size_t chunks[] = {20u << 20, 2u << 20,        6u << 20,          14u << 20,
                                  64u << 20, (size_t)3 << 30, (size_t)4095 << 21};
  uint64_t x = 88172645463325252ull; /* xorshift */
  for (size_t i = 0; i < sizeof chunks / sizeof chunks[0]; i++) {
    wl_alloc_config_t cfg;
    wl_alloc_config_default(&cfg);
    cfg.chunk_size = chunks[i];
    wl_alloc_t *a = make(&cfg, (size_t)64 << 30);
    const size_t c = a->chunk;
    CU_ASSERT_EQUAL(c, chunks[i]);
    CU_ASSERT(a->chunk_mul != 0 || a->chunk_pow2); /* the fast path, never the divide */
    unsigned bad = 0;
    for (size_t k = 1; k < ((size_t)1 << 47) / c; k += 1 + k / 64) {
      const size_t offs[3] = {k * c - 1, k * c, k * c + 1};
      for (int j = 0; j < 3; j++) bad += wl__chunk_of(a, offs[j]) != offs[j] / c;
    }
    for (int r = 0; r < 200000; r++) {
      x ^= x << 13, x ^= x >> 7, x ^= x << 17;
      size_t off = x & (((size_t)1 << 48) - 1);
      bad += wl__chunk_of(a, off) != off / c;
    }
    CU_ASSERT_EQUAL(bad, 0);
    finish(a);
  }
}

static void test_size_classes(void) {
  int prev = -1;
  for (size_t s = 1; s <= WL__SMALL_MAX; s++) {
    int c = wl__size_class(s);
    CU_ASSERT_FATAL(c >= 0 && c < WL__NCLASSES);
    size_t cs = wl__class_size(c);
    CU_ASSERT_FATAL(cs >= s);
    CU_ASSERT_FATAL(cs % WL_ALLOC_ALIGN == 0);
    /* At most 25% rounding above 1 KiB, less than one 256-byte step below. */
    if (s > 1024) {
      CU_ASSERT_FATAL((cs - s) * 4 <= s);
    } else {
      CU_ASSERT_FATAL(cs - s < 256);
    }
    /* The class is the smallest that fits. */
    if (c > 0) CU_ASSERT_FATAL(wl__class_size(c - 1) < s);
    CU_ASSERT_FATAL(c >= prev);
    prev = c;
  }
  CU_ASSERT_EQUAL(wl__size_class(WL__SMALL_MAX), WL__NCLASSES - 1);
  CU_ASSERT_EQUAL(wl__class_size(WL__NCLASSES - 1), WL__SMALL_MAX);
}

static void test_alignment_and_usable_size(void) {
  wl_alloc_t *a = make(NULL, 0);
  size_t sizes[] = {1, 255, 256, 257, 1000, 4097, 65535, 65536, 65537, 1 << 20, 3 * MiB + 7};
  void *p[sizeof sizes / sizeof sizes[0]];
  for (size_t i = 0; i < sizeof sizes / sizeof sizes[0]; i++) {
    p[i] = wl_alloc_async(a, sizes[i], NULL);
    CU_ASSERT_FATAL(p[i] != NULL);
    CU_ASSERT((uintptr_t)p[i] % WL_ALLOC_ALIGN == 0);
    CU_ASSERT_EQUAL(wl_alloc_usable_size(a, p[i]), sizes[i]);
    memset(p[i], 0xa5, sizes[i]); /* mapped and writable */
  }
  CU_ASSERT(wl_alloc_check(a) == 0);
  for (size_t i = 0; i < sizeof sizes / sizeof sizes[0]; i++)
    CU_ASSERT(wl_free_async(a, p[i], NULL) == 0);
  CU_ASSERT_EQUAL(stats(a).live_bytes, 0);
  finish(a);
}

/* ---- split, coalesce, best fit
 * -------------------------------------------------------------------*/

static void test_split_coalesce(void) {
  wl_alloc_t *a = make_core(0);
  char *x = wl_alloc_async(a, 2 * MiB, NULL);
  char *y = wl_alloc_async(a, 3 * MiB, NULL);
  char *z = wl_alloc_async(a, 1 * MiB, NULL);
  char *guard = wl_alloc_async(a, 1 * MiB, NULL);
  CU_ASSERT_FATAL(x && y && z && guard);
  /* Splitting the wilderness hands out neighbouring blocks. */
  CU_ASSERT_PTR_EQUAL(y, x + 2 * MiB);
  CU_ASSERT_PTR_EQUAL(z, y + 3 * MiB);
  CU_ASSERT(wl_free_async(a, y, NULL) == 0);
  CU_ASSERT(wl_free_async(a, x, NULL) == 0);
  CU_ASSERT(wl_free_async(a, z, NULL) == 0);
  CU_ASSERT(wl_alloc_check(a) == 0); /* the check fails on unmerged same-tag neighbours */
  /* The three holes coalesced: 6 MiB fits where x was. */
  char *w = wl_alloc_async(a, 6 * MiB, NULL);
  CU_ASSERT_PTR_EQUAL(w, x);
  CU_ASSERT(wl_free_async(a, w, NULL) == 0);
  CU_ASSERT(wl_free_async(a, guard, NULL) == 0);
  finish(a);
}

static void test_best_fit(void) {
  wl_alloc_t *a = make_core(0);
  size_t holes[] = {3 * MiB, 1 * MiB, 2 * MiB, 5 * MiB / 2};
  char *h[4], *g[4];
  for (int i = 0; i < 4; i++) {
    h[i] = wl_alloc_async(a, holes[i], NULL);
    g[i] = wl_alloc_async(a, 128 << 10, NULL); /* keeps the holes apart */
    CU_ASSERT_FATAL(h[i] && g[i]);
  }
  for (int i = 0; i < 4; i++) CU_ASSERT(wl_free_async(a, h[i], NULL) == 0);
  /* 1.5 MiB best fits the 2 MiB hole, 2.2 MiB the 2.5 MiB one, 3 MiB the 3 MiB one. */
  char *p = wl_alloc_async(a, 3 * MiB / 2, NULL);
  char *q = wl_alloc_async(a, 22 * MiB / 10, NULL);
  char *r = wl_alloc_async(a, 3 * MiB, NULL);
  CU_ASSERT_PTR_EQUAL(p, h[2]);
  CU_ASSERT_PTR_EQUAL(q, h[3]);
  CU_ASSERT_PTR_EQUAL(r, h[0]);
  CU_ASSERT(wl_alloc_check(a) == 0);
  wl_free_async(a, p, NULL);
  wl_free_async(a, q, NULL);
  wl_free_async(a, r, NULL);
  for (int i = 0; i < 4; i++) wl_free_async(a, g[i], NULL);
  finish(a);
}

static void test_small_slabs(void) {
  wl_alloc_t *a = make(NULL, 0);
  enum { N = 3000 };
  void **p = calloc(N, sizeof *p);
  for (int i = 0; i < N; i++) {
    size_t sz = 1 + (size_t)(i * 7919) % WL__SMALL_MAX;
    p[i] = wl_alloc_async(a, sz, NULL);
    CU_ASSERT_FATAL(p[i] != NULL);
    CU_ASSERT_EQUAL(wl_alloc_usable_size(a, p[i]), sz);
    memset(p[i], i & 0xff, sz);
  }
  wl_alloc_stats_t st = stats(a);
  CU_ASSERT_EQUAL(st.small_allocs, N);
  CU_ASSERT(wl_alloc_check(a) == 0);
  /* Free every other one, then reallocate: the slots are reused (no new mappings). */
  for (int i = 0; i < N; i += 2) CU_ASSERT(wl_free_async(a, p[i], NULL) == 0);
  uint64_t maps = stats(a).maps;
  for (int i = 0; i < N; i += 2) {
    p[i] = wl_alloc_async(a, 1 + (size_t)(i * 7919) % WL__SMALL_MAX, NULL);
    CU_ASSERT_FATAL(p[i] != NULL);
  }
  CU_ASSERT_EQUAL(stats(a).maps, maps);
  CU_ASSERT(wl_alloc_check(a) == 0);
  for (int i = 0; i < N; i++) CU_ASSERT(wl_free_async(a, p[i], NULL) == 0);
  CU_ASSERT_EQUAL(stats(a).live_bytes, 0);
  CU_ASSERT(wl_alloc_check(a) == 0);
  free(p);
  finish(a);
}

/* Allocated large blocks are found through the starts index (a word per 64 KiB, tagged with the
 * page the block starts at): blocks starting on every page of a window are found, a page-aligned
 * pointer inside a block or an object of a slab is not taken for a block, and the index counts
 * exactly the allocated large blocks. */
static void test_large_starts(void) {
  wl_alloc_t *a = make_core(0);
  enum { N = 40 };
  char *p[N];
  size_t sz[N];
  for (int i = 0; i < N; i++) { /* 68-124 KiB: starts fall on every page of their windows */
    sz[i] = (size_t)(68 + 4 * (i % 15)) << 10;
    p[i] = wl_alloc_async(a, sz[i], NULL);
    CU_ASSERT_FATAL(p[i] != NULL);
  }
  unsigned pages = 0;
  for (int i = 0; i < N; i++) pages |= 1u << (((uintptr_t)p[i] >> 12) & 15);
  CU_ASSERT_EQUAL(pages, 0xffffu);
  char *obj = wl_alloc_async(a, 1000, NULL); /* a slab's first object starts on a page */
  CU_ASSERT_FATAL(obj != NULL);
  CU_ASSERT_EQUAL(a->nstarts, N);
  for (int i = 0; i < N; i++) {
    CU_ASSERT_EQUAL(wl_alloc_usable_size(a, p[i]), sz[i]);
    CU_ASSERT_EQUAL(wl_alloc_usable_size(a, p[i] + 4096), 0); /* same window, not a start */
  }
  CU_ASSERT_EQUAL(wl_alloc_usable_size(a, obj), 1000);
  CU_ASSERT_EQUAL(wl_free_async(a, p[3] + 4096, NULL), -EINVAL);
  CU_ASSERT(wl_alloc_check(a) == 0);
  for (int i = 0; i < N; i += 2) CU_ASSERT(wl_free_async(a, p[i], NULL) == 0);
  CU_ASSERT_EQUAL(a->nstarts, N / 2);
  CU_ASSERT_EQUAL(wl_alloc_usable_size(a, p[0]), 0);
  CU_ASSERT_EQUAL(wl_free_async(a, p[0], NULL), -EINVAL); /* freed: gone from the index */
  CU_ASSERT(wl_alloc_check(a) == 0);
  for (int i = 1; i < N; i += 2) CU_ASSERT(wl_free_async(a, p[i], NULL) == 0);
  CU_ASSERT(wl_free_async(a, obj, NULL) == 0);
  CU_ASSERT_EQUAL(a->nstarts, 0);
  CU_ASSERT_EQUAL(stats(a).live_bytes, 0);
  finish(a);
}

/* wl_alloc_base: any byte of a live allocation's requested size names its start (large blocks
 * and slab objects alike); past the requested size, a freed allocation and memory never
 * allocated name none. */
static void test_alloc_base(void) {
  wl_alloc_t *a = make_core(0);
  char *big = wl_alloc_async(a, (3u << 20) + 100, NULL);
  char *obj = wl_alloc_async(a, 1000, NULL), *obj2 = wl_alloc_async(a, 1000, NULL);
  CU_ASSERT_FATAL(big && obj && obj2);
  CU_ASSERT_PTR_EQUAL(wl_alloc_base(a, big), big);
  CU_ASSERT_PTR_EQUAL(wl_alloc_base(a, big + 4096), big);
  CU_ASSERT_PTR_EQUAL(wl_alloc_base(a, big + (3u << 20) + 99), big);
  CU_ASSERT_PTR_NULL(wl_alloc_base(a, big + (3u << 20) + 100)); /* past the request */
  CU_ASSERT_PTR_EQUAL(wl_alloc_base(a, obj + 999), obj);
  CU_ASSERT_PTR_EQUAL(wl_alloc_base(a, obj2 + 1), obj2);
  CU_ASSERT(wl_free_async(a, obj, NULL) == 0);
  CU_ASSERT(wl_free_async(a, big, NULL) == 0);
  CU_ASSERT_PTR_NULL(wl_alloc_base(a, obj + 10));
  CU_ASSERT_PTR_NULL(wl_alloc_base(a, big + 4096));
  CU_ASSERT_PTR_NULL(wl_alloc_base(a, (void *)8));
  CU_ASSERT(wl_free_async(a, obj2, NULL) == 0);
  finish(a);
}

/* ---- stream-ordered reuse
 * -------------------------------------------------------------------------*/

static void test_stream_reuse_large(void) {
  wl_alloc_t *a = make(NULL, 0);
  wl_stream_t s1 = wl_host_stream_create(&host), s2 = wl_host_stream_create(&host);
  char *p = wl_alloc_async(a, 4 * MiB, s1);
  char *y = wl_alloc_async(a, 4 * MiB, s1);
  char *q = wl_alloc_async(a, 4 * MiB, s1);
  CU_ASSERT_FATAL(p && y && q);
  /* Same stream: reusable at once, even with work pending. */
  uint64_t t = wl_host_stream_enqueue(s1);
  CU_ASSERT(wl_free_async(a, y, s1) == 0);
  char *y2 = wl_alloc_async(a, 4 * MiB, s1);
  CU_ASSERT_PTR_EQUAL(y2, y);
  CU_ASSERT(wl_free_async(a, y2, s1) == 0);
  /* Other stream: not while s1's work is pending, even after a trim. */
  wl_alloc_trim(a, 0);
  char *z = wl_alloc_async(a, 4 * MiB, s2);
  CU_ASSERT_FATAL(z != NULL);
  CU_ASSERT_PTR_NOT_EQUAL(z, y);
  CU_ASSERT(stats(a).pending_bytes >= 4 * MiB);
  /* Once the work completes, s2 gets the exact fit. */
  wl_host_stream_complete(s1, t);
  wl_alloc_trim(a, SIZE_MAX);
  CU_ASSERT_EQUAL(stats(a).pending_bytes, 0);
  char *z2 = wl_alloc_async(a, 4 * MiB, s2);
  CU_ASSERT_PTR_EQUAL(z2, y);
  CU_ASSERT(stats(a).events_recorded >= 1);
  CU_ASSERT(wl_alloc_check(a) == 0);
  wl_free_async(a, p, s1);
  wl_free_async(a, q, s1);
  wl_free_async(a, z, s2);
  wl_free_async(a, z2, s2);
  finish(a);
  (void)0;
}

/* A stream's pending blocks are kept in its list, and in a tree as well once the list is long:
 * either way a request on the stream gets the best fit among them (the smallest that holds it,
 * the lowest address among equals), the same as before the list and the tree changed hands. */
static void test_stream_pending_best_fit(void) {
  wl_alloc_t *a = make_core(0);
  wl_stream_t s1 = wl_host_stream_create(&host);
  enum { N = 60 };
  char *p[N], *guard[N];
  size_t sz[N];
  bool freed[N] = {0};
  for (int i = 0; i < N; i++) {
    sz[i] = (size_t)(1 + (i * 7) % 13) << 20; /* 1-13 MiB, each size several times */
    p[i] = wl_alloc_async(a, sz[i], s1);
    guard[i] = wl_alloc_async(a, 128 << 10, s1); /* keeps the freed blocks apart */
    CU_ASSERT_FATAL(p[i] && guard[i]);
  }
  wl_host_stream_enqueue(s1); /* work pending: the frees stay tagged with s1 */
  for (int i = 0; i < N; i++) {
    CU_ASSERT(wl_free_async(a, p[i], s1) == 0);
    freed[i] = true;
  }
  wl__stream_t *s = wl__stream_get(a, s1);
  CU_ASSERT_FATAL(s != NULL);
  CU_ASSERT_EQUAL(s->nfifo, N);
  CU_ASSERT(s->treed);
  CU_ASSERT(wl_alloc_check(a) == 0);
  bool was_treed = true, flat_seen = false;
  for (int k = 0; k < N; k++) {
    size_t want = (size_t)(1 + (k * 5) % 13) << 20;
    int best = -1;
    for (int i = 0; i < N; i++)
      if (freed[i] && sz[i] >= want &&
          (best < 0 || sz[i] < sz[best] || (sz[i] == sz[best] && p[i] < p[best])))
        best = i;
    if (best < 0) break;
    char *q = wl_alloc_async(a, want, s1);
    CU_ASSERT_PTR_EQUAL(q, p[best]);
    if (q != p[best]) break;
    freed[best] = false;
    /* The rest of a split stays pending on s1 in the block's place: track it as freed. */
    if (sz[best] > want) {
      p[best] += want;
      sz[best] -= want;
      freed[best] = true;
    }
    if (was_treed && !s->treed) flat_seen = true;
    was_treed = s->treed;
    if (k % 8 == 0) CU_ASSERT(wl_alloc_check(a) == 0);
  }
  CU_ASSERT(flat_seen); /* both ways were exercised */
  wl_host_stream_destroy(&host, s1);
  finish(a); /* destroy gives back the blocks still allocated or pending */
}

/* Large frees record an event once a chunk's worth of bytes is freed, not only every 32 frees:
 * another stream can reuse them once the work before them is done, although the stream has
 * queued more work since. */
static void test_event_per_chunk_freed(void) {
  wl_alloc_t *a = make(NULL, 0);
  wl_stream_t s1 = wl_host_stream_create(&host), s2 = wl_host_stream_create(&host);
  char *x = wl_alloc_async(a, 12 * MiB, s1);
  char *y = wl_alloc_async(a, 12 * MiB, s1);
  char *guard = wl_alloc_async(a, 1 * MiB, s1);
  CU_ASSERT_FATAL(x && y && guard);
  CU_ASSERT_PTR_EQUAL(y, x + 12 * MiB);
  uint64_t t1 = wl_host_stream_enqueue(s1);
  uint64_t ev0 = stats(a).events_recorded;
  CU_ASSERT(wl_free_async(a, x, s1) == 0);
  CU_ASSERT(wl_free_async(a, y, s1) == 0); /* 24 MiB freed: one event, covering t1 */
  CU_ASSERT_EQUAL(stats(a).events_recorded, ev0 + 1);
  wl_host_stream_enqueue(s1); /* later work, still running */
  wl_host_stream_complete(s1, t1);
  long maps = cnt.maps;
  char *z = wl_alloc_async(a, 24 * MiB, s2);
  CU_ASSERT_PTR_EQUAL(z, x);
  CU_ASSERT_EQUAL(cnt.maps, maps);
  CU_ASSERT_EQUAL(stats(a).pending_bytes, 0);
  CU_ASSERT(wl_alloc_check(a) == 0);
  wl_free_async(a, z, s2);
  wl_free_async(a, guard, s1);
  finish(a);
}

/* Pending blocks of one stream freed on either side of one of its events stay apart: the older
 * one becomes reusable elsewhere when its event completes, whatever the stream frees next to it
 * afterwards (merged, it would wait for the newest free). */
static void test_pending_epochs_apart(void) {
  wl_alloc_t *a = make(NULL, 0);
  wl_stream_t s1 = wl_host_stream_create(&host), s2 = wl_host_stream_create(&host);
  char *x = wl_alloc_async(a, 24 * MiB, s1);
  char *y = wl_alloc_async(a, 4 * MiB, s1);
  char *guard = wl_alloc_async(a, 1 * MiB, s1);
  CU_ASSERT_FATAL(x && y && guard);
  uint64_t t1 = wl_host_stream_enqueue(s1);
  CU_ASSERT(wl_free_async(a, x, s1) == 0); /* a chunk's worth: recorded */
  wl_host_stream_enqueue(s1);
  CU_ASSERT(wl_free_async(a, y, s1) == 0); /* after the event: not merged into x */
  CU_ASSERT(wl_alloc_check(a) == 0);
  CU_ASSERT_EQUAL(stats(a).pending_bytes, 28 * MiB);
  wl_host_stream_complete(s1, t1);
  char *z = wl_alloc_async(a, 24 * MiB, s2);
  CU_ASSERT_PTR_EQUAL(z, x);
  CU_ASSERT_EQUAL(stats(a).pending_bytes, 4 * MiB); /* y still waits for the later work */
  CU_ASSERT(wl_alloc_check(a) == 0);
  wl_free_async(a, z, s2);
  wl_free_async(a, guard, s1);
  finish(a);
}

/* Before mapping for a stream, a run of its own pending blocks and untagged neighbours that holds
 * the request on mapped memory is used; the rest of the run keeps its tags. */
static void test_coalesce_own_pending(void) {
  wl_alloc_t *a = make(NULL, 0);
  wl_stream_t s1 = wl_host_stream_create(&host), s2 = wl_host_stream_create(&host);
  char *p = wl_alloc_async(a, 8 * MiB, s1);
  char *q = wl_alloc_async(a, 8 * MiB, s1);
  char *r = wl_alloc_async(a, 1 * MiB, s1);
  CU_ASSERT_FATAL(p && q && r);
  CU_ASSERT(wl_free_async(a, p, s1) == 0);
  wl_alloc_trim(a, SIZE_MAX); /* p's stream has no work: p becomes untagged */
  CU_ASSERT_EQUAL(stats(a).pending_bytes, 0);
  uint64_t t = wl_host_stream_enqueue(s1);
  CU_ASSERT(wl_free_async(a, q, s1) == 0); /* pending behind t */
  CU_ASSERT_EQUAL(stats(a).pending_bytes, 8 * MiB);
  /* 12 MiB fits neither p nor q, but s1 may use both: the first 4 MiB of q joins p, and nothing
   * new is mapped. */
  long maps = cnt.maps;
  char *z = wl_alloc_async(a, 12 * MiB, s1);
  CU_ASSERT_PTR_EQUAL(z, p);
  CU_ASSERT_EQUAL(cnt.maps, maps);
  CU_ASSERT_EQUAL(stats(a).pending_bytes, 4 * MiB);
  CU_ASSERT(wl_alloc_check(a) == 0);
  /* The last 4 MiB of q is still s1's until t completes: another stream gets memory elsewhere. */
  char *w = wl_alloc_async(a, 4 * MiB, s2);
  CU_ASSERT_PTR_NOT_EQUAL(w, q + 4 * MiB);
  wl_host_stream_complete(s1, t);
  wl_alloc_trim(a, SIZE_MAX);
  CU_ASSERT_EQUAL(stats(a).pending_bytes, 0);
  char *w2 = wl_alloc_async(a, 4 * MiB, s2);
  CU_ASSERT_PTR_EQUAL(w2, q + 4 * MiB);
  CU_ASSERT(wl_alloc_check(a) == 0);
  wl_free_async(a, z, s1);
  wl_free_async(a, r, s1);
  wl_free_async(a, w, s2);
  wl_free_async(a, w2, s2);
  finish(a);
}

/* A small request that would cut a large hole goes to the mapped part of the top of the address
 * space instead, so the large request that comes back finds its hole whole. */
static void test_small_spares_large_hole(void) {
  wl_alloc_t *a = make(NULL, 0);
  wl_stream_t s1 = wl_host_stream_create(&host);
  char *big = wl_alloc_async(a, 64 * MiB, s1);
  char *guard = wl_alloc_async(a, 1 * MiB, s1); /* the top starts at 65 MiB, mapped to 80 */
  CU_ASSERT_FATAL(big && guard);
  CU_ASSERT(wl_free_async(a, big, s1) == 0);
  wl_alloc_trim(a, (size_t)1 << 30); /* untags big's hole, unmaps nothing */
  CU_ASSERT_EQUAL(stats(a).pending_bytes, 0);
  long maps = cnt.maps;
  char *p = wl_alloc_async(a, 512 << 10, s1);
  CU_ASSERT_PTR_EQUAL(p, guard + 1 * MiB);
  char *q = wl_alloc_async(a, 64 * MiB, s1);
  CU_ASSERT_PTR_EQUAL(q, big);
  CU_ASSERT_EQUAL(cnt.maps, maps);
  /* A request the top's mapped part cannot hold still cuts the hole (no new mapping). */
  CU_ASSERT(wl_free_async(a, q, s1) == 0);
  wl_alloc_trim(a, (size_t)1 << 30);
  char *r = wl_alloc_async(a, 16 * MiB, s1);
  CU_ASSERT_PTR_EQUAL(r, big);
  CU_ASSERT(wl_alloc_check(a) == 0);
  wl_free_async(a, p, s1);
  wl_free_async(a, r, s1);
  wl_free_async(a, guard, s1);
  finish(a);
}

/* The rule above when no untagged block holds the request (the best fit is the stream's own
 * pending block): the top of the address space, then smaller than the request, is not a candidate.
 * It was: the mapping check read past the region's chunk array and, when the stray byte was
 * set, the request went to the top and ran past the region's end. */
static void test_small_spares_large_hole_top_too_small(void) {
  wl_alloc_config_t cfg;
  wl_alloc_config_default(&cfg);
  cfg.tcache_off = 1;
  cfg.chunk_size = 2 * MiB;
  cfg.va_size = 72 * 2 * MiB;
  wl_alloc_t *a = make(&cfg, 0);
  wl_stream_t s1 = wl_host_stream_create(&host);
  char *big = wl_alloc_async(a, 136 * MiB, s1);
  char *below_top = wl_alloc_async(a, 7 * MiB, NULL); /* the top: 1 MiB, mapped, region's end */
  CU_ASSERT_FATAL(big && below_top);
  uint64_t t = wl_host_stream_enqueue(s1); /* work pending: big's hole stays s1's */
  CU_ASSERT(wl_free_async(a, big, s1) == 0);
  char *p = wl_alloc_async(a, 2 * MiB + 128 * 1024, s1);
  CU_ASSERT_PTR_EQUAL(p, big);
  CU_ASSERT(wl_alloc_check(a) == 0);
  wl_host_stream_complete(s1, t);
  wl_free_async(a, p, s1);
  wl_free_async(a, below_top, NULL);
  finish(a);
}

static void test_stream_reuse_small_cross(void) {
  wl_alloc_t *a = make_core(0);
  wl_stream_t s1 = wl_host_stream_create(&host), s2 = wl_host_stream_create(&host);
  void *keep = wl_alloc_async(a, 1000, s1); /* keeps the slab alive */
  void *p = wl_alloc_async(a, 1000, s1);
  CU_ASSERT_FATAL(keep && p);
  /* Freed on s2 (legal in CUDA): s1 may not reuse it before s2's work is done. */
  uint64_t t = wl_host_stream_enqueue(s2);
  CU_ASSERT(wl_free_async(a, p, s2) == 0);
  wl_alloc_trim(a, SIZE_MAX);
  void *r = wl_alloc_async(a, 1000, s1);
  CU_ASSERT_PTR_NOT_EQUAL(r, p);
  CU_ASSERT(stats(a).pending_bytes > 0);
  wl_host_stream_complete(s2, t);
  wl_alloc_trim(a, SIZE_MAX);
  CU_ASSERT_EQUAL(stats(a).pending_bytes, 0);
  void *r2 = wl_alloc_async(a, 1000, s1);
  CU_ASSERT_PTR_EQUAL(r2, p);
  CU_ASSERT(wl_alloc_check(a) == 0);
  wl_free_async(a, keep, s1);
  wl_free_async(a, r, s1);
  wl_free_async(a, r2, s1);
  finish(a);
}

static void test_stream_forget(void) {
  wl_alloc_t *a = make(NULL, 0);
  wl_stream_t s1 = wl_host_stream_create(&host);
  void *big = wl_alloc_async(a, 8 * MiB, s1);
  void *small = wl_alloc_async(a, 512, s1);
  void *live_small = wl_alloc_async(a, 512, s1);
  CU_ASSERT_FATAL(big && small && live_small);
  uint64_t t = wl_host_stream_enqueue(s1);
  wl_free_async(a, big, s1);
  wl_free_async(a, small, s1);
  wl_alloc_stream_forget(a, s1);
  CU_ASSERT(wl_alloc_check(a) == 0);
  /* The stream's work is still pending: its memory stays out of reach. */
  wl_alloc_trim(a, SIZE_MAX);
  CU_ASSERT(stats(a).pending_bytes >= 8 * MiB);
  wl_host_stream_complete(s1, t);
  wl_alloc_trim(a, 0);
  CU_ASSERT_EQUAL(stats(a).pending_bytes, 0);
  /* An object of the forgotten stream can still be freed elsewhere. */
  CU_ASSERT(wl_free_async(a, live_small, NULL) == 0);
  wl_alloc_trim(a, 0);
  CU_ASSERT_EQUAL(stats(a).live_bytes, 0);
  CU_ASSERT_EQUAL(stats(a).mapped_bytes, 0);
  wl_host_stream_destroy(&host, s1);
  finish(a);
}

/* A stream only its own thread can record events on (CUDA's per-thread default stream; the
 * provider refuses elsewhere with -EAGAIN): what it frees stays pending, quietly, whoever polls,
 * even once its work is done (no event covers it), until its thread records; here when it
 * forgets the stream as it ends, and that final event covers the frees. */
static struct {
  wl_alloc_t *a;
  wl_stream_t s;
  pthread_barrier_t bar;
  void *big, *small;
  uint64_t t, t2;
} own;

static void *own_worker(void *arg) {
  (void)arg;
  cnt.owner = pthread_self();
  __atomic_store_n(&cnt.owned, own.s, __ATOMIC_RELEASE);
  own.big = wl_alloc_async(own.a, 4 * MiB, own.s);
  own.t = wl_host_stream_enqueue(own.s); /* work using big and small */
  wl_free_async(own.a, own.big, own.s);
  wl_free_async(own.a, own.small, own.s); /* another stream's slab: pending on s */
  pthread_barrier_wait(&own.bar);         /* the test polls from its thread */
  pthread_barrier_wait(&own.bar);
  own.t2 = wl_host_stream_enqueue(own.s);
  wl_alloc_stream_forget(own.a, own.s); /* as the thread ends */
  return NULL;
}

static void trim_quiet(void *a) {
  wl_alloc_trim(a, SIZE_MAX);
}

static void test_stream_record_refused(void) {
  own.a = make_core(0);
  own.s = wl_host_stream_create(&host);
  own.small = wl_alloc_async(own.a, 512, NULL);
  CU_ASSERT_FATAL(own.small != NULL);
  pthread_barrier_init(&own.bar, NULL, 2);
  pthread_t t;
  pthread_create(&t, NULL, own_worker, NULL);
  pthread_barrier_wait(&own.bar);
  char buf[1024];
  CU_ASSERT_EQUAL(count_stderr_lines(trim_quiet, own.a, buf, sizeof buf), 0);
  CU_ASSERT(cnt.refused > 0);
  CU_ASSERT(stats(own.a).pending_bytes >= 4 * MiB + 512);
  void *z = wl_alloc_async(own.a, 4 * MiB, NULL);
  CU_ASSERT_PTR_NOT_EQUAL(z, own.big);
  wl_host_stream_complete(own.s, own.t);
  wl_alloc_trim(own.a, SIZE_MAX);
  CU_ASSERT(stats(own.a).pending_bytes >= 4 * MiB + 512);
  void *z2 = wl_alloc_async(own.a, 4 * MiB, NULL);
  CU_ASSERT_PTR_NOT_EQUAL(z2, own.big);
  CU_ASSERT(wl_alloc_check(own.a) == 0);
  pthread_barrier_wait(&own.bar);
  pthread_join(t, NULL);
  pthread_barrier_destroy(&own.bar);
  /* The final event waits for the work enqueued before it. */
  wl_alloc_trim(own.a, SIZE_MAX);
  CU_ASSERT(stats(own.a).pending_bytes >= 4 * MiB + 512);
  wl_host_stream_complete(own.s, own.t2);
  wl_alloc_trim(own.a, SIZE_MAX);
  CU_ASSERT_EQUAL(stats(own.a).pending_bytes, 0);
  void *z3 = wl_alloc_async(own.a, 4 * MiB, NULL);
  CU_ASSERT(z3 != NULL);
  CU_ASSERT(wl_alloc_check(own.a) == 0);
  wl_free_async(own.a, z, NULL);
  wl_free_async(own.a, z2, NULL);
  wl_free_async(own.a, z3, NULL);
  __atomic_store_n(&cnt.owned, NULL, __ATOMIC_RELEASE);
  wl_host_stream_destroy(&host, own.s);
  finish(own.a);
}

/* A thread that frees a block on its stream into its thread cache (nothing else freed on the
 * stream), forgets the stream and ends, its cache given back after the forget (the order of a
 * per-thread default stream at thread exit under libwavelet.so): the final event still covers the
 * block, which waits for the stream's work (before, no event was recorded and the block was
 * reusable at once). */
static struct {
  wl_alloc_t *a;
  wl_stream_t s;
  void *b;
  uint64_t t;
} fc;

static void *fc_worker(void *arg) {
  (void)arg;
  fc.b = wl_alloc_async(fc.a, 1 * MiB, fc.s);
  fc.t = wl_host_stream_enqueue(fc.s);
  wl_free_async(fc.a, fc.b, fc.s);
  CU_ASSERT_EQUAL(stats(fc.a).tcache_bytes, 1 * MiB); /* in this thread's cache */
  wl_alloc_stream_forget(fc.a, fc.s);
  return NULL; /* the cache goes back at thread exit */
}

static void test_stream_forget_cached(void) {
  wl_alloc_config_t cfg;
  wl_alloc_config_default(&cfg);
  cfg.tcache_bytes = 8 * MiB;
  fc.a = make(&cfg, 0);
  fc.s = wl_host_stream_create(&host);
  pthread_t t;
  pthread_create(&t, NULL, fc_worker, NULL);
  pthread_join(t, NULL);
  CU_ASSERT_FATAL(fc.b != NULL);
  wl_alloc_trim(fc.a, SIZE_MAX);
  CU_ASSERT_EQUAL(stats(fc.a).tcache_bytes, 0);
  CU_ASSERT(stats(fc.a).pending_bytes >= 1 * MiB);
  void *z = wl_alloc_async(fc.a, 1 * MiB, NULL);
  CU_ASSERT_PTR_NOT_EQUAL(z, fc.b);
  wl_host_stream_complete(fc.s, fc.t);
  wl_alloc_trim(fc.a, SIZE_MAX);
  CU_ASSERT_EQUAL(stats(fc.a).pending_bytes, 0);
  CU_ASSERT(wl_alloc_check(fc.a) == 0);
  wl_free_async(fc.a, z, NULL);
  wl_host_stream_destroy(&host, fc.s);
  finish(fc.a);
}

/* ---- trimming and the physical cache
 * ---------------------------------------------------------------*/

static void test_trim(void) {
  wl_alloc_config_t cfg;
  wl_alloc_config_default(&cfg);
  cfg.release_threshold = CHUNK;
  wl_alloc_t *a = make(&cfg, 0);
  wl_stream_t s = wl_host_stream_create(&host);
  void *p[10];
  for (int i = 0; i < 10; i++) CU_ASSERT_FATAL((p[i] = wl_alloc_async(a, 15 * MiB, s)) != NULL);
  CU_ASSERT_EQUAL(stats(a).mapped_bytes, 8 * CHUNK); /* 150 MiB over 20 MiB chunks */
  uint64_t t = wl_host_stream_enqueue(s);
  for (int i = 0; i < 10; i++) wl_free_async(a, p[i], s);
  /* Work pending on s: nothing may be unmapped. */
  CU_ASSERT_EQUAL(wl_alloc_trim(a, 0), 0);
  CU_ASSERT_EQUAL(stats(a).mapped_bytes, 8 * CHUNK);
  wl_host_stream_complete(s, t);
  /* Above the watermark only. */
  CU_ASSERT_EQUAL(wl_alloc_trim(a, SIZE_MAX), 7 * CHUNK);
  CU_ASSERT_EQUAL(stats(a).mapped_bytes, CHUNK);
  CU_ASSERT_EQUAL(wl_alloc_trim(a, 0), CHUNK);
  wl_alloc_stats_t st = stats(a);
  CU_ASSERT_EQUAL(st.mapped_bytes, 0);
  CU_ASSERT_EQUAL(st.physical_bytes, 0); /* no cache configured: given back */
  CU_ASSERT_EQUAL(cnt.handles, 0);
  CU_ASSERT_EQUAL(st.physical_peak, 8 * CHUNK);
  CU_ASSERT(wl_alloc_check(a) == 0);
  finish(a);
}

/* A keep (or threshold) near SIZE_MAX keeps everything: live + keep must not wrap. */
static void test_trim_keep_huge(void) {
  wl_alloc_config_t cfg;
  wl_alloc_config_default(&cfg);
  cfg.release_threshold = SIZE_MAX - 1;
  wl_alloc_t *a = make(&cfg, 0);
  void *live = wl_alloc_async(a, MiB, NULL);
  void *p = wl_alloc_async(a, 5 * CHUNK, NULL);
  CU_ASSERT_FATAL(live && p);
  wl_free_async(a, p, NULL);
  size_t mapped = stats(a).mapped_bytes;
  CU_ASSERT_EQUAL(wl_alloc_trim(a, SIZE_MAX - 1), 0);
  CU_ASSERT_EQUAL(wl_alloc_trim(a, SIZE_MAX), 0); /* the configured threshold */
  CU_ASSERT_EQUAL(stats(a).mapped_bytes, mapped);
  CU_ASSERT(wl_alloc_trim(a, 0) > 0); /* there was something to give back */
  wl_free_async(a, live, NULL);
  finish(a);
}

static void test_phys_cache(void) {
  wl_alloc_config_t cfg;
  wl_alloc_config_default(&cfg);
  cfg.phys_cache_limit = 2 * CHUNK;
  wl_alloc_t *a = make(&cfg, 0);
  void *p = wl_alloc_async(a, 5 * CHUNK, NULL);
  CU_ASSERT_FATAL(p != NULL);
  wl_free_async(a, p, NULL);
  wl_alloc_trim(a, 0);
  wl_alloc_stats_t st = stats(a);
  CU_ASSERT_EQUAL(st.cached_bytes, 2 * CHUNK);
  CU_ASSERT_EQUAL(st.physical_bytes, 2 * CHUNK);
  CU_ASSERT_EQUAL(cnt.handles, 2);
  long creates = cnt.creates;
  p = wl_alloc_async(a, 2 * CHUNK, NULL);
  CU_ASSERT_FATAL(p != NULL);
  CU_ASSERT_EQUAL(cnt.creates, creates); /* served from the cache */
  CU_ASSERT_EQUAL(stats(a).cached_bytes, 0);
  wl_free_async(a, p, NULL);
  finish(a);
}

static void test_trim_thread(void) {
  wl_alloc_config_t cfg;
  wl_alloc_config_default(&cfg);
  cfg.trim_thread = 1;
  cfg.trim_interval_ms = 5;
  cfg.release_threshold = CHUNK;
  wl_alloc_t *a = make(&cfg, 0);
  void *p = wl_alloc_async(a, 10 * CHUNK, NULL);
  CU_ASSERT_FATAL(p != NULL);
  wl_free_async(a, p, NULL);
  /* Liveness, not speed: give it up to 10 s. */
  for (int i = 0; i < 2000 && stats(a).mapped_bytes > CHUNK; i++) usleep(5000);
  CU_ASSERT(stats(a).mapped_bytes <= CHUNK);
  CU_ASSERT(stats(a).trims > 0);
  finish(a);
}

/* ---- budgets
 * -----------------------------------------------------------------------------------------*/

static void test_local_limit(void) {
  wl_alloc_config_t cfg;
  wl_alloc_config_default(&cfg);
  cfg.mem_limit = 3 * CHUNK;
  wl_alloc_t *a = make(&cfg, 0);
  void *p = wl_alloc_async(a, 50 * MiB, NULL);
  CU_ASSERT_FATAL(p != NULL);
  void *q = wl_alloc_async(a, 30 * MiB, NULL);
  CU_ASSERT_PTR_NULL(q);
  wl_alloc_failure_t f;
  CU_ASSERT_FATAL(wl_alloc_last_failure(&f) == 0);
  CU_ASSERT_EQUAL(f.error, -ENOMEM);
  CU_ASSERT_EQUAL(f.request, 30 * MiB);
  CU_ASSERT_EQUAL(f.limit, 3 * CHUNK);
  CU_ASSERT_EQUAL(f.live, 50 * MiB);
  char line[256];
  CU_ASSERT(wl_alloc_failure_format(&f, line, sizeof line) == 0);
  CU_ASSERT(strstr(line, "cannot allocate 30.0 MiB") != NULL);
  CU_ASSERT(strstr(line, "limit 60.0 MiB") != NULL);
  CU_ASSERT(stats(a).budget_denials > 0);
  CU_ASSERT(wl_alloc_check(a) == 0);
  /* Nothing lost: after a free the same request succeeds. */
  wl_free_async(a, p, NULL);
  q = wl_alloc_async(a, 30 * MiB, NULL);
  CU_ASSERT_PTR_NOT_NULL(q);
  wl_free_async(a, q, NULL);
  finish(a);
}

/* Memory moves from an empty chunk to where it is needed instead of exceeding the budget. */
static void test_steal_empty_chunk(void) {
  wl_alloc_config_t cfg;
  wl_alloc_config_default(&cfg);
  cfg.mem_limit = 2 * CHUNK;
  wl_alloc_t *a = make(&cfg, 0);
  void *x = wl_alloc_async(a, CHUNK, NULL);     /* chunk 0 */
  void *b = wl_alloc_async(a, 128 << 10, NULL); /* start of chunk 1 */
  CU_ASSERT_FATAL(x && b);
  wl_free_async(a, x, NULL);
  void *c = wl_alloc_async(a, 3 * CHUNK / 2, NULL); /* needs chunks 1 and 2 */
  CU_ASSERT_PTR_NOT_NULL(c);
  CU_ASSERT_EQUAL(stats(a).physical_bytes, 2 * CHUNK);
  CU_ASSERT(wl_alloc_check(a) == 0);
  wl_free_async(a, b, NULL);
  wl_free_async(a, c, NULL);
  finish(a);
}

/* A budget shared by two allocators, as libsched's is by two processes. */
typedef struct shared_budget_s {
  pthread_mutex_t m;
  pthread_cond_t cv;
  size_t limit, used;
  long acquires, releases, waits, refunds;
  long kicks, device_waits; /* memory given back outside the budget; waits for any give-back */
  int abandon;              /* waiters give up (-ETIMEDOUT) at once */
  int pressed;              /* what sb_pressed answers: another holder waits */
} shared_budget_t;

static int sb_acquire(void *ctx, size_t bytes, uint64_t deadline) {
  shared_budget_t *b = ctx;
  pthread_mutex_lock(&b->m);
  int rc = 0;
  while (b->used + bytes > b->limit) {
    if (!deadline) {
      rc = -ENOMEM;
      break;
    }
    if (b->abandon) {
      rc = -ETIMEDOUT;
      break;
    }
    b->waits++;
    struct timespec ts = {(time_t)(deadline / 1000000000ull), (long)(deadline % 1000000000ull)};
    if (pthread_cond_timedwait(&b->cv, &b->m, &ts) == ETIMEDOUT && b->used + bytes > b->limit) {
      rc = -ETIMEDOUT;
      break;
    }
  }
  if (!rc) b->used += bytes, b->acquires++;
  pthread_mutex_unlock(&b->m);
  return rc;
}

/* Bytes back, counted as a release or a refund. */
static void sb_give_back(shared_budget_t *b, size_t bytes, long *count) {
  pthread_mutex_lock(&b->m);
  b->used -= bytes;
  (*count)++;
  pthread_cond_broadcast(&b->cv);
  pthread_mutex_unlock(&b->m);
}

static void sb_release(void *ctx, size_t bytes) {
  shared_budget_t *b = ctx;
  sb_give_back(b, bytes, &b->releases);
}

static void sb_refund(void *ctx, size_t bytes) {
  shared_budget_t *b = ctx;
  sb_give_back(b, bytes, &b->refunds);
}

static size_t sb_limit(void *ctx) {
  return ((shared_budget_t *)ctx)->limit;
}

static int sb_pressed(void *ctx) {
  return __atomic_load_n(&((shared_budget_t *)ctx)->pressed, __ATOMIC_RELAXED);
}

/* wait_release: until memory comes back (a release, or a kick for memory the budget does not
 * see) or the deadline. */
static int sb_wait_release(void *ctx, size_t bytes, uint64_t deadline) {
  shared_budget_t *b = ctx;
  (void)bytes;
  pthread_mutex_lock(&b->m);
  long seen = b->releases + b->kicks;
  b->device_waits++;
  int rc = 0;
  struct timespec ts = {(time_t)(deadline / 1000000000ull), (long)(deadline % 1000000000ull)};
  while (b->releases + b->kicks == seen)
    if (pthread_cond_timedwait(&b->cv, &b->m, &ts) == ETIMEDOUT) {
      rc = -ETIMEDOUT;
      break;
    }
  pthread_mutex_unlock(&b->m);
  return rc;
}

static void sb_init(shared_budget_t *b, size_t limit) {
  memset(b, 0, sizeof *b);
  pthread_mutex_init(&b->m, NULL);
  pthread_condattr_t ca;
  pthread_condattr_init(&ca);
  pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
  pthread_cond_init(&b->cv, &ca);
  pthread_condattr_destroy(&ca);
  b->limit = limit;
}

typedef struct release_later_s {
  wl_alloc_t *a;
  void *p;
} release_later_t;

static void *release_later(void *arg) {
  release_later_t *r = arg;
  usleep(50000);
  wl_free_async(r->a, r->p, NULL);
  wl_alloc_trim(r->a, 0);
  return NULL;
}

static void test_shared_budget_wait(void) {
  shared_budget_t sb;
  sb_init(&sb, 3 * CHUNK);
  wl_budget_t budget = {&sb, sb_acquire, sb_release, sb_limit, NULL, NULL, NULL};
  wl_provider_t h1, h2;
  CU_ASSERT_FATAL(wl_provider_host_init(&h1, 0, 0) == 0);
  CU_ASSERT_FATAL(wl_provider_host_init(&h2, 0, 0) == 0);
  wl_alloc_config_t cfg;
  wl_alloc_config_default(&cfg);
  cfg.budget = &budget;
  cfg.alloc_timeout_ms = 10000;
  wl_alloc_t *a1, *a2;
  CU_ASSERT_FATAL(wl_alloc_create(&a1, &h1, &cfg) == 0);
  CU_ASSERT_FATAL(wl_alloc_create(&a2, &h2, &cfg) == 0);
  void *p1 = wl_alloc_async(a1, 2 * CHUNK, NULL);
  CU_ASSERT_FATAL(p1 != NULL);
  /* a2 needs two chunks, one is free: it waits until a1 gives its memory back. */
  release_later_t r = {a1, p1};
  pthread_t t;
  pthread_create(&t, NULL, release_later, &r);
  void *p2 = wl_alloc_async(a2, 2 * CHUNK, NULL);
  pthread_join(t, NULL);
  CU_ASSERT_PTR_NOT_NULL(p2);
  CU_ASSERT(sb.waits > 0);
  CU_ASSERT_EQUAL(stats(a1).physical_bytes, 0);
  CU_ASSERT(wl_alloc_check(a1) == 0 && wl_alloc_check(a2) == 0);
  wl_free_async(a2, p2, NULL);
  wl_alloc_destroy(a1);
  wl_alloc_destroy(a2);
  CU_ASSERT_EQUAL(sb.used, 0);
  CU_ASSERT_EQUAL(sb.acquires, sb.releases);
}

static void keep_provider(void *ctx) {
  (void)ctx;
}

/* Another program's memory on the provider, given back after a while. */
typedef struct give_back_later_s {
  wl_provider_t *prov;
  void *handle;
  shared_budget_t *sb;
} give_back_later_t;

static void *give_back_later(void *arg) {
  give_back_later_t *g = arg;
  usleep(50000);
  g->prov->phys_release(g->prov->ctx, g->handle, CHUNK);
  pthread_mutex_lock(&g->sb->m);
  g->sb->kicks++;
  pthread_cond_broadcast(&g->sb->cv);
  pthread_mutex_unlock(&g->sb->m);
  return NULL;
}

/* The device (a provider of 3 chunks) is full of memory the budget (8 chunks) cannot see: an
 * allocation waits through the budget's wait_release and gets its memory once the other memory
 * is given back; with nobody giving back it fails at the deadline, and without wait_release at
 * once, its grants refunded either way. */
static void test_device_full_waits_for_release(void) {
  shared_budget_t sb;
  sb_init(&sb, 8 * CHUNK);
  wl_budget_t waiting = {&sb, sb_acquire, sb_release, sb_limit, NULL, sb_wait_release, NULL};
  wl_budget_t plain = {&sb, sb_acquire, sb_release, sb_limit, NULL, NULL, NULL};
  wl_provider_t h;
  CU_ASSERT_FATAL(wl_provider_host_init(&h, 3 * CHUNK, 0) == 0);
  void *other[2];
  CU_ASSERT_FATAL(h.phys_create(h.ctx, CHUNK, &other[0]) == 0);
  CU_ASSERT_FATAL(h.phys_create(h.ctx, CHUNK, &other[1]) == 0);
  wl_provider_t dev = h; /* one device for three allocators: destroyed here, not by them */
  dev.destroy = keep_provider;
  wl_alloc_config_t cfg;
  wl_alloc_config_default(&cfg);
  cfg.budget = &waiting;
  cfg.alloc_timeout_ms = 10000;
  wl_alloc_t *a, *b, *c;
  CU_ASSERT_FATAL(wl_alloc_create(&a, &dev, &cfg) == 0);
  give_back_later_t g = {&h, other[0], &sb};
  pthread_t t;
  pthread_create(&t, NULL, give_back_later, &g);
  void *p = wl_alloc_async(a, 2 * CHUNK, NULL); /* one chunk free on the device, two needed */
  pthread_join(t, NULL);
  CU_ASSERT_PTR_NOT_NULL(p);
  CU_ASSERT(sb.device_waits >= 1);
  CU_ASSERT(stats(a).device_full_waits >= 1);
  CU_ASSERT_EQUAL(stats(a).physical_bytes, 2 * CHUNK);
  CU_ASSERT_EQUAL(sb.used, 2 * CHUNK);
  /* The device is full again (other[1] and a's two chunks), and stays so. */
  cfg.alloc_timeout_ms = 30;
  CU_ASSERT_FATAL(wl_alloc_create(&b, &dev, &cfg) == 0);
  long waits = sb.device_waits;
  CU_ASSERT_PTR_NULL(wl_alloc_async(b, CHUNK, NULL));
  CU_ASSERT(sb.device_waits > waits);
  CU_ASSERT_EQUAL(stats(b).budget_denials, 1);
  cfg.budget = &plain;
  CU_ASSERT_FATAL(wl_alloc_create(&c, &dev, &cfg) == 0);
  waits = sb.device_waits;
  CU_ASSERT_PTR_NULL(wl_alloc_async(c, CHUNK, NULL));
  CU_ASSERT_EQUAL(sb.device_waits, waits);
  CU_ASSERT_EQUAL(stats(c).device_full_waits, 0);
  CU_ASSERT_EQUAL(sb.used, 2 * CHUNK); /* the failed grants went back */
  wl_free_async(a, p, NULL);
  CU_ASSERT(wl_alloc_check(a) == 0);
  wl_alloc_destroy(a);
  wl_alloc_destroy(b);
  wl_alloc_destroy(c);
  h.phys_release(h.ctx, other[1], CHUNK);
  CU_ASSERT_EQUAL(sb.used, 0);
  h.destroy(h.ctx);
}

static void test_shared_budget_timeout(void) {
  shared_budget_t sb;
  sb_init(&sb, 2 * CHUNK);
  wl_budget_t budget = {&sb, sb_acquire, sb_release, sb_limit, NULL, NULL, NULL};
  wl_provider_t h1;
  CU_ASSERT_FATAL(wl_provider_host_init(&h1, 0, 0) == 0);
  wl_alloc_config_t cfg;
  wl_alloc_config_default(&cfg);
  cfg.budget = &budget;
  cfg.alloc_timeout_ms = 30;
  wl_alloc_t *a;
  CU_ASSERT_FATAL(wl_alloc_create(&a, &h1, &cfg) == 0);
  void *p = wl_alloc_async(a, 2 * CHUNK, NULL);
  CU_ASSERT_FATAL(p != NULL);
  void *q = wl_alloc_async(a, 1 * MiB, NULL);
  CU_ASSERT_PTR_NULL(q);
  wl_alloc_failure_t f;
  CU_ASSERT_FATAL(wl_alloc_last_failure(&f) == 0);
  CU_ASSERT_EQUAL(f.error, -ETIMEDOUT);
  CU_ASSERT_EQUAL(f.limit, 2 * CHUNK);
  CU_ASSERT(wl_alloc_check(a) == 0);
  wl_free_async(a, p, NULL);
  wl_alloc_destroy(a);
  CU_ASSERT_EQUAL(sb.used, 0);
}

typedef struct wait_alloc_s {
  wl_alloc_t *a;
  size_t size;
  void *p;
} wait_alloc_t;

/* Liveness, not speed: returns once a waiter has reached the budget (20 s at most). */
static void sb_await_waiter(shared_budget_t *sb) {
  for (int i = 0; i < 20000; i++) {
    pthread_mutex_lock(&sb->m);
    long waits = sb->waits;
    pthread_mutex_unlock(&sb->m);
    if (waits) break;
    usleep(1000);
  }
  CU_ASSERT(sb->waits > 0);
}

/* The releases so far; then the budget's waiters give up, which they would otherwise do only
 * after an hour when the memory never comes back. */
static long sb_abandon(shared_budget_t *sb) {
  pthread_mutex_lock(&sb->m);
  long releases = sb->releases;
  sb->abandon = 1;
  pthread_cond_broadcast(&sb->cv);
  pthread_mutex_unlock(&sb->m);
  return releases;
}

static void *wait_alloc(void *arg) {
  wait_alloc_t *w = arg;
  w->p = wl_alloc_async(w->a, w->size, NULL);
  return NULL;
}

/* The end of a budget-wait test: the memory must have reached the budget; then the waiter is
 * let go (it would otherwise sleep an hour), must have its block, and nothing stays drawn. */
static void waiter_done(shared_budget_t *sb, wl_alloc_t *a, pthread_t t, wait_alloc_t *w) {
  CU_ASSERT(sb_abandon(sb) > 0);
  pthread_join(t, NULL);
  CU_ASSERT_PTR_NOT_NULL(w->p);
  CU_ASSERT(wl_alloc_check(a) == 0);
  if (w->p) wl_free_async(a, w->p, NULL);
  finish(a);
  CU_ASSERT_EQUAL(sb->used, 0);
}

/* A thread waits for the budget (our lock dropped) while another of our threads frees: the wait
 * ends only when the budget gets memory back, so the freed chunks must go to it then, not stay
 * mapped (or cached) here until the waiter's deadline. No trim thread, so nothing else would give
 * them back; the budget's waiters give up only when the test says so. */
static void test_shared_budget_wait_own_free(void) {
  for (int cache = 0; cache < 2; cache++) {
    shared_budget_t sb;
    sb_init(&sb, 2 * CHUNK);
    wl_budget_t budget = {&sb, sb_acquire, sb_release, sb_limit, NULL, NULL, NULL};
    wl_alloc_config_t cfg;
    wl_alloc_config_default(&cfg);
    cfg.budget = &budget;
    cfg.alloc_timeout_ms = 3600 * 1000;
    cfg.phys_cache_limit = cache ? 2 * CHUNK : 0;
    cfg.tcache_off = 1;
    wl_alloc_t *a = make(&cfg, 0);
    void *p = wl_alloc_async(a, 2 * CHUNK, NULL);
    CU_ASSERT_FATAL(p != NULL);
    wait_alloc_t w = {a, CHUNK, NULL};
    pthread_t t;
    pthread_create(&t, NULL, wait_alloc, &w);
    /* Liveness, not speed: the waiter reaches the budget. */
    sb_await_waiter(&sb);
    wl_free_async(a, p, NULL);
    if (cache) wl_alloc_trim(a, 0); /* unmapped handles are not kept for us while it waits */
    waiter_done(&sb, a, t, &w);
  }
}

/* While another thread waits for the budget, a thread frees a block into its cache (its chunk
 * stays busy) and exits: the cache goes back to the allocator, and the chunk it empties must go
 * on to the budget. (Caches are emptied before a wait begins; this free comes after.) */
typedef struct cache_holder_s {
  wl_alloc_t *a;
  sem_t cached, go;
} cache_holder_t;

static void *cache_holder(void *arg) {
  cache_holder_t *h = arg;
  void *p = wl_alloc_async(h->a, 1 * MiB, NULL);
  CU_ASSERT_PTR_NOT_NULL(p);
  sem_post(&h->cached);
  sem_wait(&h->go);
  wl_free_async(h->a, p, NULL); /* into this thread's cache: its chunk stays busy */
  return NULL;                  /* the cache is given back at thread exit */
}

static void test_shared_budget_wait_cache_exit(void) {
  shared_budget_t sb;
  sb_init(&sb, CHUNK);
  wl_budget_t budget = {&sb, sb_acquire, sb_release, sb_limit, NULL, NULL, NULL};
  wl_alloc_config_t cfg;
  wl_alloc_config_default(&cfg);
  cfg.budget = &budget;
  cfg.alloc_timeout_ms = 3600 * 1000;
  cfg.tcache_bytes = 8 * MiB;
  wl_alloc_t *a = make(&cfg, 0);
  cache_holder_t h = {.a = a};
  sem_init(&h.cached, 0, 0);
  sem_init(&h.go, 0, 0);
  pthread_t ht;
  pthread_create(&ht, NULL, cache_holder, &h);
  sem_wait(&h.cached);
  /* The rest of chunk 0, so that the waiter's chunk is the next one (the whole budget). */
  void *filler = wl_alloc_async(a, CHUNK - 1 * MiB, NULL);
  CU_ASSERT_PTR_NOT_NULL_FATAL(filler);
  CU_ASSERT_EQUAL_FATAL(stats(a).physical_bytes, CHUNK);
  wait_alloc_t w = {a, CHUNK, NULL};
  pthread_t t;
  pthread_create(&t, NULL, wait_alloc, &w);
  sb_await_waiter(&sb);
  wl_free_async(a, filler, NULL); /* chunk 0 stays busy: the holder's block */
  sem_post(&h.go);
  pthread_join(ht, NULL);
  waiter_done(&sb, a, t, &w);
  sem_destroy(&h.cached);
  sem_destroy(&h.go);
}

/* While another holder of the budget waits (pressed), trims keep no unused memory mapped, and
 * a free that leaves a chunk unused wakes the trimmer at once, below the release threshold (the
 * trimmer's own round is an hour away here: only that wake can have trimmed). */
static void test_pressed_budget_trims_all(void) {
  shared_budget_t sb;
  sb_init(&sb, 16 * CHUNK);
  wl_budget_t budget = {&sb, sb_acquire, sb_release, sb_limit, NULL, NULL, sb_pressed};
  wl_alloc_config_t cfg;
  wl_alloc_config_default(&cfg);
  cfg.budget = &budget;
  cfg.tcache_off = 1;
  cfg.release_threshold = 3 * CHUNK;
  cfg.phys_cache_limit = 4 * CHUNK;
  wl_alloc_t *a = make(&cfg, 0);
  void *p = wl_alloc_async(a, 4 * CHUNK, NULL);
  CU_ASSERT_PTR_NOT_NULL_FATAL(p);
  wl_free_async(a, p, NULL);
  wl_alloc_trim(a, SIZE_MAX); /* the default keep: the threshold, and the unmapped one cached */
  CU_ASSERT_EQUAL(stats(a).mapped_bytes, 3 * CHUNK);
  CU_ASSERT_EQUAL(stats(a).cached_bytes, CHUNK);
  sb.pressed = 1;
  wl_alloc_trim(a, SIZE_MAX); /* nothing kept, mapped or cached */
  CU_ASSERT_EQUAL(stats(a).mapped_bytes, 0);
  CU_ASSERT_EQUAL(stats(a).physical_bytes, 0);
  CU_ASSERT_EQUAL(sb.used, 0);
  finish(a);

  cfg.trim_thread = 1;
  cfg.trim_interval_ms = 3600 * 1000;
  cfg.phys_cache_limit = 0;
  sb.pressed = 0;
  a = make(&cfg, 0);
  p = wl_alloc_async(a, 2 * CHUNK, NULL);
  CU_ASSERT_PTR_NOT_NULL_FATAL(p);
  sb.pressed = 1;
  wl_free_async(a, p, NULL); /* 2 chunks unused: under threshold + chunk, over one chunk */
  /* Liveness, not speed: give it up to 10 s. */
  for (int i = 0; i < 2000 && stats(a).mapped_bytes > 0; i++) usleep(5000);
  CU_ASSERT_EQUAL(stats(a).mapped_bytes, 0);
  CU_ASSERT_EQUAL(sb.used, 0);
  finish(a);
}

/* ---- provider failures
 * -----------------------------------------------------------------------------*/

static void test_provider_failures(void) {
  wl_alloc_t *a = make(NULL, 0);
  cnt.fail_create = 1;
  CU_ASSERT_PTR_NULL(wl_alloc_async(a, 4 * MiB, NULL));
  CU_ASSERT(wl_alloc_check(a) == 0);
  cnt.fail_map = 1;
  CU_ASSERT_PTR_NULL(wl_alloc_async(a, 4 * MiB, NULL));
  wl_alloc_failure_t f;
  CU_ASSERT(wl_alloc_last_failure(&f) == 0);
  CU_ASSERT_EQUAL(f.error, -EIO);
  CU_ASSERT(wl_alloc_check(a) == 0);
  void *p = wl_alloc_async(a, 4 * MiB, NULL);
  CU_ASSERT_PTR_NOT_NULL(p);
  CU_ASSERT_EQUAL(stats(a).live_bytes, 4 * MiB);
  wl_free_async(a, p, NULL);
  finish(a);
}

/* A grant the provider could not turn into memory goes back as a refund when the budget takes
 * refunds (so that its peaks can forget it), as a release otherwise; either way nothing stays
 * drawn. */
static void test_provider_failure_refund(void) {
  for (int with_refund = 0; with_refund < 2; with_refund++) {
    shared_budget_t sb;
    sb_init(&sb, 4 * CHUNK);
    wl_budget_t budget = {&sb,  sb_acquire, sb_release, sb_limit, with_refund ? sb_refund : NULL,
                          NULL, NULL};
    wl_alloc_config_t cfg;
    wl_alloc_config_default(&cfg);
    cfg.budget = &budget;
    cfg.alloc_timeout_ms = 0; /* no second try after the failure */
    wl_alloc_t *a = make(&cfg, 0);
    cnt.fail_create = 1;
    CU_ASSERT_PTR_NULL(wl_alloc_async(a, 4 * MiB, NULL));
    CU_ASSERT_EQUAL(sb.used, 0);
    CU_ASSERT_EQUAL(sb.acquires, 1);
    CU_ASSERT_EQUAL(sb.refunds, with_refund ? 1 : 0);
    CU_ASSERT_EQUAL(sb.releases, with_refund ? 0 : 1);
    void *p = wl_alloc_async(a, 4 * MiB, NULL);
    CU_ASSERT_PTR_NOT_NULL(p);
    CU_ASSERT_EQUAL(sb.used, CHUNK);
    wl_free_async(a, p, NULL);
    finish(a);
    CU_ASSERT_EQUAL(sb.used, 0);
    CU_ASSERT_EQUAL(sb.refunds, with_refund ? 1 : 0); /* the real chunk was released */
  }
}

static void test_device_capacity(void) {
  wl_alloc_t *a = make(NULL, 100 * MiB); /* a 100 MiB "device" */
  void *p = wl_alloc_async(a, 90 * MiB, NULL);
  CU_ASSERT_FATAL(p != NULL);
  CU_ASSERT_PTR_NULL(wl_alloc_async(a, 30 * MiB, NULL));
  CU_ASSERT_PTR_NULL(wl_alloc_async(a, 200 * MiB, NULL)); /* larger than the device */
  wl_alloc_failure_t f;
  CU_ASSERT(wl_alloc_last_failure(&f) == 0);
  CU_ASSERT(strstr(f.what, "larger than the device") != NULL);
  wl_free_async(a, p, NULL);
  finish(a);
}

/* ---- bad input
 * -----------------------------------------------------------------------------------------*/

typedef struct bad_s {
  wl_alloc_t *a;
  void *ptr;
  wl_stream_t stream;
  size_t size;
  int rc;
  void *out;
} bad_t;

static void do_free(void *arg) {
  bad_t *b = arg;
  b->rc = wl_free_async(b->a, b->ptr, b->stream);
}

static void do_alloc(void *arg) {
  bad_t *b = arg;
  b->out = wl_alloc_async(b->a, b->size, b->stream);
}

static void test_bad_input(void) {
  wl_alloc_t *a = make(NULL, 0);
  char buf[2048];
  char *p = wl_alloc_async(a, 4 * MiB, NULL);
  char *s = wl_alloc_async(a, 300, NULL);
  CU_ASSERT_FATAL(p && s);
  wl_alloc_stats_t before = stats(a);

  bad_t b = {a, NULL, NULL, 0, 0, NULL};
  CU_ASSERT_EQUAL(count_stderr_lines(do_alloc, &b, buf, sizeof buf), 1);
  CU_ASSERT_PTR_NULL(b.out);
  CU_ASSERT(strstr(buf, "wavelet: ") == buf);
  size_t huge[] = {SIZE_MAX, SIZE_MAX - 255, (size_t)1 << 50};
  for (int i = 0; i < 3; i++) {
    b.size = huge[i];
    CU_ASSERT_EQUAL(count_stderr_lines(do_alloc, &b, buf, sizeof buf), 1);
    CU_ASSERT_PTR_NULL(b.out);
  }
  /* Free: NULL, double, interior, foreign heap and stack pointers, unknown stream. */
  int local;
  void *heap = malloc(64);
  void *bad_ptrs[] = {NULL, p + 4096, heap, &local};
  for (int i = 0; i < 4; i++) {
    b.ptr = bad_ptrs[i];
    CU_ASSERT_EQUAL(count_stderr_lines(do_free, &b, buf, sizeof buf), 1);
    CU_ASSERT_EQUAL(b.rc, -EINVAL);
  }
  free(heap);
  b.ptr = p;
  b.stream = (wl_stream_t)(uintptr_t)0xdead0000;
  CU_ASSERT_EQUAL(count_stderr_lines(do_free, &b, buf, sizeof buf), 1);
  CU_ASSERT_EQUAL(b.rc, -EINVAL);
  CU_ASSERT(strstr(buf, "unknown stream") != NULL);
  b.size = 100;
  CU_ASSERT_EQUAL(count_stderr_lines(do_alloc, &b, buf, sizeof buf), 1);
  CU_ASSERT_PTR_NULL(b.out);
  /* Nothing changed. */
  wl_alloc_stats_t after = stats(a);
  CU_ASSERT_EQUAL(after.live_bytes, before.live_bytes);
  CU_ASSERT_EQUAL(after.allocs, before.allocs);
  CU_ASSERT_EQUAL(after.frees, before.frees);
  CU_ASSERT_EQUAL(after.bad_calls, before.bad_calls + 10);
  CU_ASSERT(wl_alloc_check(a) == 0);
  /* The real frees work; the second of each is a double free. */
  b.stream = NULL;
  CU_ASSERT(wl_free_async(a, p, NULL) == 0);
  CU_ASSERT(wl_free_async(a, s, NULL) == 0);
  b.ptr = p;
  CU_ASSERT_EQUAL(count_stderr_lines(do_free, &b, buf, sizeof buf), 1);
  CU_ASSERT(strstr(buf, "double free") != NULL);
  b.ptr = s;
  CU_ASSERT_EQUAL(count_stderr_lines(do_free, &b, buf, sizeof buf), 1);
  CU_ASSERT_EQUAL(b.rc, -EINVAL);
  /* A program repeating its mistake does not flood the log: the 16th is the last shown, and
   * says so; every one is still refused and counted. */
  unsigned lines = 0, noted = 0;
  for (int i = 0; i < 10; i++) {
    lines += (unsigned)count_stderr_lines(do_free, &b, buf, sizeof buf);
    CU_ASSERT_EQUAL(b.rc, -EINVAL);
    noted += strstr(buf, "not shown") != NULL;
  }
  CU_ASSERT_EQUAL(stats(a).bad_calls, before.bad_calls + 22);
  CU_ASSERT_EQUAL(lines, 4); /* the 13th to the 16th */
  CU_ASSERT_EQUAL(noted, 1);
  CU_ASSERT(wl_alloc_check(a) == 0);
  CU_ASSERT_EQUAL(stats(a).live_bytes, 0);
  finish(a);
}

static void null_out(void *arg, const char *text) {
  (void)arg;
  (void)text;
}

/* Every public function takes NULL for its handles without crashing. */
static void test_bad_input_null(void) {
  wl_alloc_t *a = make(NULL, 0);
  wl_alloc_stats_t st;
  memset(&st, 0xff, sizeof st);
  wl_alloc_stats_get(NULL, &st);
  CU_ASSERT_EQUAL(st.live_bytes, 0);
  CU_ASSERT_EQUAL(st.allocs, 0);
  wl_alloc_stats_get(a, NULL);
  wl_alloc_stats_print(NULL, null_out, NULL, 0);
  wl_alloc_stats_print(NULL, null_out, NULL, 1);
  wl_alloc_stats_print(a, NULL, NULL, 0);
  CU_ASSERT_EQUAL(wl_alloc_check(NULL), -EINVAL);
  CU_ASSERT_EQUAL(wl_alloc_last_failure(NULL), -EINVAL);
  wl_alloc_failure_t f = {0};
  char buf[128];
  CU_ASSERT_EQUAL(wl_alloc_failure_format(NULL, buf, sizeof buf), -EINVAL);
  CU_ASSERT_EQUAL(wl_alloc_failure_format(&f, NULL, sizeof buf), -EINVAL);
  CU_ASSERT_EQUAL(wl_alloc_failure_format(&f, buf, 0), -EINVAL);
  CU_ASSERT_PTR_NULL(wl_alloc_async(NULL, 100, NULL));
  CU_ASSERT_EQUAL(wl_free_async(NULL, NULL, NULL), -EINVAL);
  CU_ASSERT_EQUAL(wl_alloc_usable_size(NULL, buf), 0);
  CU_ASSERT_EQUAL(wl_alloc_trim(NULL, 0), 0);
  wl_alloc_stream_forget(NULL, NULL);
  wl_alloc_destroy(NULL);
  CU_ASSERT_EQUAL(wl_provider_host_init(NULL, 0, 0), -EINVAL);
  CU_ASSERT_PTR_NULL(wl_host_stream_create(NULL));
  wl_host_stream_destroy(NULL, NULL);
  CU_ASSERT_EQUAL(wl_host_stream_enqueue(NULL), 0);
  wl_host_stream_complete(NULL, 1);
  CU_ASSERT(wl_alloc_check(a) == 0);
  finish(a);
}

static void test_bad_config(void) {
  wl_provider_t p;
  CU_ASSERT_FATAL(wl_provider_host_init(&p, 0, 0) == 0);
  wl_alloc_config_t cfg;
  wl_alloc_config_default(&cfg);
  cfg.chunk_size = 3 * MiB; /* not a multiple of 2 MiB */
  wl_alloc_t *a = NULL;
  CU_ASSERT_EQUAL(wl_alloc_create(&a, &p, &cfg), -EINVAL);
  CU_ASSERT_PTR_NULL(a);
  wl_provider_t broken = p;
  broken.map = NULL;
  CU_ASSERT_EQUAL(wl_alloc_create(&a, &broken, NULL), -EINVAL);
  CU_ASSERT_EQUAL(wl_alloc_create(NULL, &p, NULL), -EINVAL);
  p.destroy(p.ctx);
  wl_provider_t q;
  CU_ASSERT_EQUAL(wl_provider_host_init(&q, 0, 3000), -EINVAL);
}

/* ---- hook and stats
 * -------------------------------------------------------------------------------------*/

static long hook_counts[8];
static size_t hook_alloc_bytes;

static void hook(void *arg, const wl_alloc_event_t *ev) {
  (void)arg;
  hook_counts[ev->kind]++;
  if (ev->kind == WL_ALLOC_EV_ALLOC) hook_alloc_bytes += ev->size;
  CU_ASSERT(ev->time_ns > 0);
}

static void test_hook(void) {
  memset(hook_counts, 0, sizeof hook_counts);
  hook_alloc_bytes = 0;
  wl_alloc_config_t cfg;
  wl_alloc_config_default(&cfg);
  cfg.hook = hook;
  wl_alloc_t *a = make(&cfg, 0);
  void *p = wl_alloc_async(a, 30 * MiB, NULL);
  void *q = wl_alloc_async(a, 777, NULL);
  wl_free_async(a, p, NULL);
  wl_free_async(a, q, NULL);
  wl_alloc_trim(a, 0);
  CU_ASSERT_EQUAL(hook_counts[WL_ALLOC_EV_ALLOC], 2);
  CU_ASSERT_EQUAL(hook_counts[WL_ALLOC_EV_FREE], 2);
  CU_ASSERT_EQUAL(hook_alloc_bytes, 30 * MiB + 777);
  CU_ASSERT_EQUAL(hook_counts[WL_ALLOC_EV_MAP], (long)stats(a).maps);
  CU_ASSERT_EQUAL(hook_counts[WL_ALLOC_EV_UNMAP], (long)stats(a).unmaps);
  CU_ASSERT(hook_counts[WL_ALLOC_EV_MAP] >= 2);
  finish(a);
}

/* A device reset's streams die with their work while the memory lives on: every event is
 * destroyed, blocks and small objects freed on a stream with its work still pending are
 * reusable on a new stream at once, live ones stay live and are freed later on new streams;
 * nothing leaks. */
static void test_abandon_streams(void) {
  wl_alloc_t *a = make(NULL, 0);
  wl_stream_t s1 = wl_host_stream_create(&host);
  char *live = wl_alloc_async(a, 4 * MiB, s1), *gone = wl_alloc_async(a, 4 * MiB, s1);
  char *small_live = wl_alloc_async(a, 900, s1), *small_gone = wl_alloc_async(a, 900, s1);
  CU_ASSERT_FATAL(live && gone && small_live && small_gone);
  wl_host_stream_enqueue(s1); /* work that never completes: the reset ends it */
  CU_ASSERT_EQUAL(wl_free_async(a, gone, s1), 0);
  CU_ASSERT_EQUAL(wl_free_async(a, small_gone, s1), 0);
  wl_alloc_trim(a, 0);
  CU_ASSERT(stats(a).pending_bytes >= 4 * MiB);
  CU_ASSERT(cnt.events > 0);
  wl_alloc_abandon_streams(a);
  CU_ASSERT_EQUAL(cnt.events, 0);
  CU_ASSERT_EQUAL(stats(a).pending_bytes, 0);
  CU_ASSERT_EQUAL(wl_alloc_usable_size(a, live), 4 * MiB);
  CU_ASSERT(wl_alloc_usable_size(a, small_live) >= 900);
  CU_ASSERT_EQUAL(wl_alloc_check(a), 0);
  wl_stream_t s2 = wl_host_stream_create(&host);
  char *again = wl_alloc_async(a, 4 * MiB, s2);
  CU_ASSERT_PTR_EQUAL(again, gone); /* the exact fit, though s1's work never completed */
  CU_ASSERT_EQUAL(wl_free_async(a, live, s2), 0);
  CU_ASSERT_EQUAL(wl_free_async(a, small_live, s2), 0);
  CU_ASSERT_EQUAL(wl_free_async(a, again, s2), 0);
  wl_alloc_abandon_streams(NULL); /* no allocator: nothing */
  wl_alloc_stream_forget(a, s2);
  wl_host_stream_destroy(&host, s2);
  wl_host_stream_destroy(&host, s1);
  finish(a);
}

static void append(void *arg, const char *text) {
  strncat((char *)arg, text, 4095 - strlen((char *)arg));
}

static void test_stats_print(void) {
  wl_alloc_t *a = make(NULL, 0);
  void *p = wl_alloc_async(a, 3 * MiB, NULL);
  char out[4096] = "";
  wl_alloc_stats_print(a, append, out, 1);
  CU_ASSERT(out[0] == '{');
  CU_ASSERT(strstr(out, "\"live_bytes\": 3145728") != NULL);
  CU_ASSERT(strstr(out, "\"tcache_bytes\": ") != NULL);
  CU_ASSERT(strstr(out, "}\n") != NULL);
  out[0] = 0;
  wl_alloc_stats_print(a, append, out, 0);
  CU_ASSERT(strstr(out, "live_bytes") != NULL);
  CU_ASSERT(strstr(out, "3.0 MiB") != NULL);
  wl_free_async(a, p, NULL);
  finish(a);
}

/* ---- randomized
 * -------------------------------------------------------------------------------------------*/

typedef struct live_s {
  char *p;
  size_t size;
  int stream;
  uint32_t tag;
} live_t;

static uint64_t rng = 0x9E3779B97F4A7C15ull;
static uint64_t next_rand(void) {
  rng ^= rng << 13;
  rng ^= rng >> 7;
  rng ^= rng << 17;
  return rng;
}

/* One bit per 256 bytes of the first region: a block that overlaps another fails at once. */
static uint64_t *paint;
static uintptr_t paint_base;
static size_t paint_bits;

static int paint_range(uintptr_t p, size_t size, int set) {
  size_t b0 = (p - paint_base) / 256, b1 = (p - paint_base + size + 255) / 256;
  if (p < paint_base || b1 > paint_bits) return -1;
  /* Check the whole range first, then flip it, a word at a time. */
  for (int pass = 0; pass < 2; pass++) {
    for (size_t b = b0; b < b1;) {
      size_t w = b / 64, lo = b % 64, n = WL_MIN(64 - lo, b1 - b);
      uint64_t mask = (n == 64 ? ~0ull : ((1ull << n) - 1)) << lo;
      if (pass == 0 && (set ? (paint[w] & mask) != 0 : (paint[w] & mask) != mask)) return -1;
      if (pass == 1) paint[w] ^= mask;
      b += n;
    }
  }
  return 0;
}

static void test_randomized(void) {
  wl_alloc_config_t cfg;
  wl_alloc_config_default(&cfg);
  cfg.va_size = (size_t)16 << 30;
  cfg.phys_cache_limit = 4 * CHUNK;
  wl_alloc_t *a = make(&cfg, 0);
  paint_base = a->regions[0].base;
  paint_bits = a->regions[0].size / 256;
  paint = calloc(paint_bits / 64 + 1, sizeof *paint);
  CU_ASSERT_FATAL(paint != NULL);
  enum { NS = 4, MAXLIVE = 20000 };
  wl_stream_t streams[NS] = {NULL};
  for (int i = 1; i < NS; i++) streams[i] = wl_host_stream_create(&host);
  uint64_t tickets[NS] = {0};
  live_t *live = calloc(MAXLIVE, sizeof *live);
  size_t nlive = 0, live_bytes = 0;
  long steps = 2000000, failures = 0;
  const char *scale = getenv("WLTEST_RANDOM_STEPS");
  if (scale) steps = atol(scale);
  const char *seed = getenv("WLTEST_RANDOM_SEED"); /* for soak runs; 0 is not a valid state */
  if (seed && strtoull(seed, NULL, 0)) rng = strtoull(seed, NULL, 0);
  for (long step = 0; step < steps; step++) {
    uint64_t r = next_rand();
    int op = (int)(r % 100);
    /* Keep the live set near 2 GiB so that it stays inside the first region. */
    if ((op < 55 && nlive < MAXLIVE && live_bytes < ((size_t)2 << 30)) || nlive == 0) {
      /* Mostly small and medium, sometimes tens of MiB. */
      size_t size;
      uint64_t k = (r >> 8) % 100;
      if (k < 60)
        size = 1 + (r >> 20) % 4096;
      else if (k < 90)
        size = 1 + (r >> 20) % (1 << 20);
      else
        size = 1 + (r >> 20) % (24 << 20);
      int s = (int)((r >> 40) % NS);
      char *p = wl_alloc_async(a, size, streams[s]);
      if (!p) {
        failures++;
        continue;
      }
      CU_ASSERT_FATAL((uintptr_t)p % WL_ALLOC_ALIGN == 0);
      if (paint_range((uintptr_t)p, size, 1)) {
        printf("\n    step %ld: block %p of %zu bytes overlaps a live one (or lies outside region "
               "0)\n",
               step, (void *)p, size);
        CU_FAIL_FATAL("overlap");
      }
      uint32_t tag = (uint32_t)(r >> 32);
      p[size - 1] = (char)(tag >> 8);
      p[0] = (char)tag; /* last, so a 1-byte block holds the first tag */
      live[nlive++] = (live_t){p, size, s, tag};
      live_bytes += size;
    } else if (op < 97) {
      size_t i = (size_t)((r >> 8) % nlive);
      live_t l = live[i];
      live[i] = live[--nlive];
      CU_ASSERT_FATAL(l.p[0] == (char)l.tag &&
                      (l.size == 1 || l.p[l.size - 1] == (char)(l.tag >> 8)));
      CU_ASSERT_FATAL(paint_range((uintptr_t)l.p, l.size, 0) == 0);
      /* Mostly on the allocating stream, sometimes on another (legal, with pending work). */
      int s = ((r >> 30) % 10) ? l.stream : (int)((r >> 34) % NS);
      if (s && (r >> 50) % 4 == 0) tickets[s] = wl_host_stream_enqueue(streams[s]);
      CU_ASSERT_FATAL(wl_free_async(a, l.p, streams[s]) == 0);
      live_bytes -= l.size;
    } else if (op < 99) {
      int s = 1 + (int)((r >> 8) % (NS - 1));
      wl_host_stream_complete(streams[s], tickets[s]);
    } else {
      wl_alloc_trim(a, (r >> 8) % 2 ? SIZE_MAX : 0);
    }
    /* Cheap invariants after every step; the full walk now and then. */
    const wl_alloc_stats_t *st = &a->st;
    CU_ASSERT_FATAL(wl__live(a) == live_bytes);
    CU_ASSERT_FATAL(wl__live(a) <= st->mapped_bytes);
    CU_ASSERT_FATAL(st->mapped_bytes <= st->reserved_bytes);
    CU_ASSERT_FATAL(st->physical_bytes == st->mapped_bytes + st->cached_bytes);
    CU_ASSERT_FATAL(a->ptrs.count + a->nstarts == nlive + tc_count(a));
    if (step % 50000 == 0) CU_ASSERT_FATAL(wl_alloc_check(a) == 0);
  }
  CU_ASSERT_EQUAL(failures, 0);
  CU_ASSERT(wl_alloc_check(a) == 0);
  for (size_t i = 0; i < nlive; i++)
    CU_ASSERT(wl_free_async(a, live[i].p, streams[live[i].stream]) == 0);
  for (int s = 1; s < NS; s++) wl_host_stream_complete(streams[s], UINT64_MAX);
  wl_alloc_trim(a, 0);
  wl_alloc_stats_t st = stats(a);
  CU_ASSERT_EQUAL(st.live_bytes, 0);
  CU_ASSERT_EQUAL(st.pending_bytes, 0);
  CU_ASSERT_EQUAL(st.mapped_bytes, 0);
  printf("\n    randomized: %ld steps, %llu maps, %llu unmaps, physical peak %zu MiB, live peak "
         "%zu MiB ",
         steps, (unsigned long long)st.maps, (unsigned long long)st.unmaps, st.physical_peak >> 20,
         st.live_peak >> 20);
  free(live);
  free(paint);
  finish(a);
}

/* The allocator's lock (a futex word) under contention: increments made under it by four threads
 * all count, with spinning and sleeping waiters alike (a read, a pause and a write, so that an
 * unprotected section would lose some). */
static struct {
  wl_alloc_t *a;
  volatile uint64_t n;
} lk;
static void *lock_worker(void *arg) {
  (void)arg;
  for (int i = 0; i < 200000; i++) {
    wl__lock(lk.a);
    uint64_t v = lk.n;
    if (i % 1024 == 0) sched_yield(); /* a holder that sleeps: the others go to the futex */
    lk.n = v + 1;
    wl__unlock(lk.a);
  }
  return NULL;
}

static void test_lock(void) {
  lk.a = make(NULL, 0);
  lk.n = 0;
  pthread_t t[4];
  for (int i = 0; i < 4; i++) pthread_create(&t[i], NULL, lock_worker, NULL);
  for (int i = 0; i < 4; i++) pthread_join(t[i], NULL);
  CU_ASSERT_EQUAL(lk.n, 4 * 200000);
  CU_ASSERT_EQUAL(lk.a->lock, 0);
  finish(lk.a);
}

/* Several threads on one allocator: the lock keeps the blocks apart. */
static wl_alloc_t *mt_a;
static void *mt_worker(void *arg) {
  uint64_t x = (uintptr_t)arg * 0x9E3779B97F4A7C15ull + 1;
  void *keep[64] = {0};
  for (int i = 0; i < 100000; i++) {
    x ^= x << 13, x ^= x >> 7, x ^= x << 17;
    int k = (int)(x % 64);
    if (keep[k]) {
      if (((char *)keep[k])[0] != (char)(uintptr_t)arg) return (void *)1;
      wl_free_async(mt_a, keep[k], NULL);
      keep[k] = NULL;
    } else {
      size_t size = 1 + (x >> 16) % (x % 7 ? 8192 : (4 << 20));
      keep[k] = wl_alloc_async(mt_a, size, NULL);
      if (!keep[k]) return (void *)1;
      ((char *)keep[k])[0] = (char)(uintptr_t)arg;
    }
  }
  for (int k = 0; k < 64; k++)
    if (keep[k]) wl_free_async(mt_a, keep[k], NULL);
  return NULL;
}

/* ---- thread caches --------------------------------------------------------------------------*/

static wl_alloc_t *make_tc(size_t mem_limit) {
  wl_alloc_config_t cfg;
  wl_alloc_config_default(&cfg);
  cfg.tcache_bytes = 8 * MiB; /* blocks up to 2 MiB */
  cfg.mem_limit = mem_limit;
  return make(&cfg, 0);
}

/* Live, mapped and physical bytes as they must be, whatever the caches hold. */
static void check_exact(wl_alloc_t *a, size_t live) {
  wl_alloc_stats_t st = stats(a);
  CU_ASSERT_EQUAL(st.live_bytes, live);
  CU_ASSERT(st.live_bytes + st.tcache_bytes <= st.mapped_bytes);
  CU_ASSERT_EQUAL(st.physical_bytes, st.mapped_bytes + st.cached_bytes);
  CU_ASSERT_EQUAL(st.allocs - st.frees, a->ptrs.count + a->nstarts - tc_count(a));
  CU_ASSERT(wl_alloc_check(a) == 0);
}

static void test_tcache_reuse(void) {
  wl_alloc_t *a = make_tc(0);
  char *p = wl_alloc_async(a, MiB, NULL), *s = wl_alloc_async(a, 1000, NULL);
  CU_ASSERT_FATAL(p && s);
  long maps = cnt.maps;
  CU_ASSERT(wl_free_async(a, p, NULL) == 0);
  CU_ASSERT(wl_free_async(a, s, NULL) == 0);
  wl_alloc_stats_t st = stats(a);
  CU_ASSERT_EQUAL(st.tcache_bytes, MiB + 1024); /* the 1000-byte object's class is 1 KiB */
  CU_ASSERT_EQUAL(tc_count(a), 2);
  check_exact(a, 0);
  /* A cached block is not live: size 0, and freeing it again is refused and changes nothing. */
  CU_ASSERT_EQUAL(wl_alloc_usable_size(a, p), 0);
  CU_ASSERT_EQUAL(wl_free_async(a, p, NULL), -EINVAL);
  CU_ASSERT_EQUAL(wl_free_async(a, s, NULL), -EINVAL);
  check_exact(a, 0);
  /* The same sizes on the same stream come back from the cache, without mapping. */
  char *q = wl_alloc_async(a, MiB - 4096 + 1, NULL), *r = wl_alloc_async(a, 900, NULL);
  CU_ASSERT_PTR_EQUAL(q, p);
  CU_ASSERT_PTR_EQUAL(r, s);
  CU_ASSERT_EQUAL(wl_alloc_usable_size(a, q), MiB - 4096 + 1);
  st = stats(a);
  CU_ASSERT_EQUAL(st.tcache_hits, 2);
  CU_ASSERT_EQUAL(st.tcache_bytes, 0);
  /* The threads fence for themselves where membarrier is missing, or slow as gVisor's (10 ms a
   * call, four orders of magnitude over Linux's): otherwise every flush would hold the lock that
   * long. Under the _gvisor variant the shim makes it so (wl_test_main checked that it is in
   * effect), so no clock is read; elsewhere the kernel's speed is the fastest of five calls,
   * far from the library's 200 us either way on Linux and under runsc (between, not judged). */
  long cmds = syscall(__NR_membarrier, MEMBARRIER_CMD_QUERY, 0, 0);
  const char *gv = getenv("WLTEST_GVISOR");
  int slow = -1;
  if (cmds <= 0 || !(cmds & MEMBARRIER_CMD_PRIVATE_EXPEDITED) || (gv && !strcmp(gv, "1"))) {
    slow = 1;
  } else {
    uint64_t best = UINT64_MAX;
    for (int i = 0; i < 5; i++) {
      uint64_t t0 = wl__now_ns();
      syscall(__NR_membarrier, MEMBARRIER_CMD_PRIVATE_EXPEDITED, 0, 0);
      uint64_t dt = wl__now_ns() - t0;
      if (dt < best) best = dt;
    }
    slow = best < 50 * 1000 ? 0 : best > 2000 * 1000 ? 1 : -1;
  }
  if (slow >= 0) CU_ASSERT_EQUAL(st.tcache_self_fenced, slow);
  CU_ASSERT_EQUAL(cnt.maps, maps);
  check_exact(a, MiB - 4096 + 1 + 900);
  /* Another stream does not take a block freed on this one before its work is done. */
  wl_stream_t s1 = wl_host_stream_create(&host);
  uint64_t t = wl_host_stream_enqueue(s1);
  CU_ASSERT(wl_free_async(a, q, s1) == 0);
  char *x = wl_alloc_async(a, MiB, NULL);
  CU_ASSERT_PTR_NOT_EQUAL(x, q);
  CU_ASSERT(wl_free_async(a, x, NULL) == 0);
  wl_host_stream_complete(s1, t);
  wl_free_async(a, r, NULL);
  /* Forgetting the stream with its block still cached: the final event covers it. */
  wl_alloc_stream_forget(a, s1);
  wl_alloc_trim(a, 0);
  st = stats(a);
  CU_ASSERT_EQUAL(st.tcache_bytes, 0);
  CU_ASSERT_EQUAL(st.pending_bytes, 0);
  CU_ASSERT_EQUAL(st.mapped_bytes, 0);
  check_exact(a, 0);
  wl_host_stream_destroy(&host, s1);
  finish(a);
}

/* Threads that allocate, hand half their blocks to the next thread and free what they are
 * handed: every free of a handed block is a cross-thread free. Rounds are separated by a
 * barrier, so the run is the same every time. */
#define XT_THREADS 4
#define XT_BLOCKS  24
#define XT_ROUNDS  200

static struct {
  wl_alloc_t *a;
  pthread_barrier_t bar;
  void *hand[XT_THREADS][XT_BLOCKS / 2];
  size_t hand_size[XT_THREADS][XT_BLOCKS / 2];
  size_t live; /* bytes, checked between rounds by thread 0 */
  int bad;
} xt;

static size_t xt_size(int t, int i, int round) {
  static const size_t sizes[] = {256, 1000, 4096, 40000, 100000, 700000, MiB, 2 * MiB, 3 * MiB};
  return sizes[(t + i + round / 50) % 9]; /* 3 MiB is too large to cache */
}

static void *xt_worker(void *arg) {
  int me = (int)(uintptr_t)arg, next = (me + 1) % XT_THREADS;
  void *mine[XT_BLOCKS / 2];
  for (int round = 0; round < XT_ROUNDS; round++) {
    for (int i = 0; i < XT_BLOCKS; i++) {
      size_t n = xt_size(me, i, round);
      void *p = wl_alloc_async(xt.a, n, NULL);
      if (!p || wl_alloc_usable_size(xt.a, p) != n) __atomic_store_n(&xt.bad, 1, __ATOMIC_RELAXED);
      memset(p, me, n < 4096 ? n : 4096); /* would corrupt another thread's block if shared */
      if (i % 2) {
        xt.hand[next][i / 2] = p;
        xt.hand_size[next][i / 2] = n;
      } else {
        mine[i / 2] = p;
      }
    }
    for (int i = 0; i < XT_BLOCKS / 2; i++) {
      if (*(unsigned char *)mine[i] != me) __atomic_store_n(&xt.bad, 2, __ATOMIC_RELAXED);
      if (wl_free_async(xt.a, mine[i], NULL)) __atomic_store_n(&xt.bad, 3, __ATOMIC_RELAXED);
    }
    pthread_barrier_wait(&xt.bar); /* every hand-over done */
    for (int i = 0; i < XT_BLOCKS / 2; i++) {
      void *p = xt.hand[me][i];
      if (*(unsigned char *)p != (me + XT_THREADS - 1) % XT_THREADS)
        __atomic_store_n(&xt.bad, 4, __ATOMIC_RELAXED);
      if (wl_free_async(xt.a, p, NULL)) __atomic_store_n(&xt.bad, 5, __ATOMIC_RELAXED);
    }
    pthread_barrier_wait(&xt.bar); /* every block freed: nothing is live */
    if (me == 0 && (stats(xt.a).live_bytes != 0 || wl_alloc_check(xt.a) != 0))
      __atomic_store_n(&xt.bad, 6, __ATOMIC_RELAXED);
    pthread_barrier_wait(&xt.bar);
  }
  return NULL;
}

static void test_tcache_cross_thread(void) {
  xt.a = make_tc(0);
  xt.bad = 0;
  pthread_barrier_init(&xt.bar, NULL, XT_THREADS);
  pthread_t t[XT_THREADS];
  for (uintptr_t i = 0; i < XT_THREADS; i++) pthread_create(&t[i], NULL, xt_worker, (void *)i);
  for (int i = 0; i < XT_THREADS; i++) pthread_join(t[i], NULL);
  pthread_barrier_destroy(&xt.bar);
  CU_ASSERT_EQUAL(xt.bad, 0);
  wl_alloc_stats_t st = stats(xt.a);
  /* The threads are gone and gave their caches back; the counters are exact. */
  CU_ASSERT(st.tcache_hits > 0);
  CU_ASSERT_EQUAL(st.tcache_bytes, 0);
  CU_ASSERT_EQUAL(xt.a->tcs, NULL);
  CU_ASSERT_EQUAL(st.allocs, (uint64_t)XT_THREADS * XT_BLOCKS * XT_ROUNDS);
  CU_ASSERT_EQUAL(st.frees, st.allocs);
  check_exact(xt.a, 0);
  wl_alloc_trim(xt.a, 0);
  CU_ASSERT_EQUAL(stats(xt.a).mapped_bytes, 0);
  finish(xt.a);
}

/* A thread that fills its cache, then waits (alive, idle) while the test looks. */
static struct {
  wl_alloc_t *a;
  pthread_barrier_t bar;
  int phase2; /* after the wait: allocate and free again on this allocator */
} idle;

static void *idle_worker(void *arg) {
  (void)arg;
  void *p[6];
  for (int k = 0; k < 2; k++) { /* the second round's frees meet demand: they are cached */
    for (int i = 0; i < 6; i++) p[i] = wl_alloc_async(idle.a, (size_t)(i + 1) * 256 * 1024, NULL);
    for (int i = 0; i < 6; i++) wl_free_async(idle.a, p[i], NULL);
  }
  pthread_barrier_wait(&idle.bar); /* cache filled */
  pthread_barrier_wait(&idle.bar); /* the test has looked */
  if (idle.phase2) {
    void *q = wl_alloc_async(idle.a, 512 * 1024, NULL);
    wl_free_async(idle.a, q, NULL);
  }
  return NULL;
}

static void test_tcache_trim_flushes(void) {
  wl_alloc_t *a = idle.a = make_tc(0);
  idle.phase2 = 1;
  pthread_barrier_init(&idle.bar, NULL, 2);
  pthread_t t;
  pthread_create(&t, NULL, idle_worker, NULL);
  pthread_barrier_wait(&idle.bar);
  wl_alloc_stats_t st = stats(a);
  CU_ASSERT_EQUAL(st.tcache_bytes, (size_t)21 * 256 * 1024); /* 1+2+...+6 quarter MiB */
  CU_ASSERT(st.mapped_bytes > 0);
  check_exact(a, 0);
  /* Nothing is live: a trim gives the idle thread's cache back and unmaps everything. */
  CU_ASSERT(wl_alloc_trim(a, 0) > 0);
  st = stats(a);
  CU_ASSERT_EQUAL(st.tcache_bytes, 0);
  CU_ASSERT_EQUAL(st.mapped_bytes, 0);
  CU_ASSERT_EQUAL(cnt.mapped, 0);
  check_exact(a, 0);
  pthread_barrier_wait(&idle.bar);
  pthread_join(t, NULL);
  CU_ASSERT_EQUAL(stats(a).tcache_bytes, 0); /* its exit gave back what it cached again */
  CU_ASSERT_EQUAL(a->tcs, NULL);
  check_exact(a, 0);
  pthread_barrier_destroy(&idle.bar);
  finish(a);
}

static void test_tcache_destroy_with_caches(void) {
  /* An allocator destroyed while a live thread still has a cache for it; that thread then uses
   * a new allocator (perhaps at the same address) and exits. */
  idle.a = make_tc(0);
  idle.phase2 = 1;
  pthread_barrier_init(&idle.bar, NULL, 2);
  pthread_t t;
  pthread_create(&t, NULL, idle_worker, NULL);
  pthread_barrier_wait(&idle.bar);
  CU_ASSERT(stats(idle.a).tcache_bytes > 0);
  finish(idle.a);
  idle.a = make_tc(0);
  pthread_barrier_wait(&idle.bar);
  pthread_join(t, NULL);
  CU_ASSERT_EQUAL(stats(idle.a).live_bytes, 0);
  CU_ASSERT_EQUAL(stats(idle.a).tcache_bytes, 0);
  CU_ASSERT_EQUAL(stats(idle.a).allocs, 1);
  pthread_barrier_destroy(&idle.bar);
  finish(idle.a);
}

static void test_tcache_budget(void) {
  /* Two chunks of budget. An idle thread's cache holds blocks on one mapped chunk; a request
   * for both chunks' worth succeeds because the caches are given back before mapping more,
   * and physical memory never passes the limit. */
  wl_alloc_t *a = idle.a = make_tc(2 * CHUNK);
  idle.phase2 = 0;
  pthread_barrier_init(&idle.bar, NULL, 2);
  pthread_t t;
  pthread_create(&t, NULL, idle_worker, NULL);
  pthread_barrier_wait(&idle.bar);
  CU_ASSERT(stats(a).tcache_bytes > 0);
  void *big = wl_alloc_async(a, 2 * CHUNK, NULL);
  CU_ASSERT_PTR_NOT_NULL(big);
  wl_alloc_stats_t st = stats(a);
  CU_ASSERT(st.physical_peak <= 2 * CHUNK);
  CU_ASSERT_EQUAL(st.tcache_bytes, 0);
  check_exact(a, 2 * CHUNK);
  pthread_barrier_wait(&idle.bar);
  pthread_join(t, NULL);
  wl_free_async(a, big, NULL);
  CU_ASSERT(stats(a).physical_peak <= 2 * CHUNK);
  check_exact(a, 0);
  pthread_barrier_destroy(&idle.bar);
  finish(a);
}

static void test_tcache_fork(void) {
  /* A fork while another thread has a cache: the child gives that orphaned cache back at its
   * first trim and keeps working; the parent is untouched. */
  wl_alloc_t *a = idle.a = make_tc(0);
  idle.phase2 = 1;
  pthread_barrier_init(&idle.bar, NULL, 2);
  pthread_t t;
  pthread_create(&t, NULL, idle_worker, NULL);
  pthread_barrier_wait(&idle.bar);
  size_t cached = stats(a).tcache_bytes;
  CU_ASSERT(cached > 0);
  fflush(NULL);
  pid_t pid = fork();
  if (pid == 0) {
    int bad = 0;
    void *p = wl_alloc_async(a, MiB, NULL);
    bad |= !p || wl_free_async(a, p, NULL) != 0;
    bad |= stats(a).tcache_bytes != cached + MiB ? 2 : 0;
    wl_alloc_trim(a, 0);
    wl_alloc_stats_t st = stats(a);
    bad |= st.tcache_bytes || st.mapped_bytes || st.live_bytes ? 4 : 0;
    bad |= a->tcs == NULL || a->tcs->anext != NULL ? 8 : 0; /* only the child's own is left */
    bad |= wl_alloc_check(a) ? 16 : 0;
    wl_alloc_destroy(a);
    _exit(bad);
  }
  CU_ASSERT_FATAL(pid > 0);
  int status = 0;
  CU_ASSERT(waitpid(pid, &status, 0) == pid);
  CU_ASSERT(WIFEXITED(status) && WEXITSTATUS(status) == 0);
  CU_ASSERT_EQUAL(stats(a).tcache_bytes, cached);
  pthread_barrier_wait(&idle.bar);
  pthread_join(t, NULL);
  check_exact(a, 0);
  pthread_barrier_destroy(&idle.bar);
  finish(a);
}

static void test_threads(void) {
  wl_alloc_config_t cfg;
  wl_alloc_config_default(&cfg);
  cfg.trim_thread = 1;
  cfg.trim_interval_ms = 1;
  mt_a = make(&cfg, 0);
  pthread_t t[4];
  for (uintptr_t i = 0; i < 4; i++) pthread_create(&t[i], NULL, mt_worker, (void *)(i + 1));
  for (int i = 0; i < 4; i++) {
    void *rc;
    pthread_join(t[i], &rc);
    CU_ASSERT_PTR_NULL(rc);
  }
  CU_ASSERT_EQUAL(stats(mt_a).live_bytes, 0);
  finish(mt_a);
}

int main(int argc, char **argv) {
  static const wl_test_case_t cases[] = {
      {"size_classes", test_size_classes},
      {"chunk_index", test_chunk_index},
      {"size_tree", test_size_tree},
      {"alignment_and_usable_size", test_alignment_and_usable_size},
      {"split_coalesce", test_split_coalesce},
      {"best_fit", test_best_fit},
      {"small_slabs", test_small_slabs},
      {"large_starts", test_large_starts},
      {"alloc_base", test_alloc_base},
      {"stream_reuse_large", test_stream_reuse_large},
      {"stream_pending_best_fit", test_stream_pending_best_fit},
      {"event_per_chunk_freed", test_event_per_chunk_freed},
      {"pending_epochs_apart", test_pending_epochs_apart},
      {"coalesce_own_pending", test_coalesce_own_pending},
      {"small_spares_large_hole", test_small_spares_large_hole},
      {"small_spares_large_hole_top_too_small", test_small_spares_large_hole_top_too_small},
      {"stream_reuse_small_cross", test_stream_reuse_small_cross},
      {"stream_forget", test_stream_forget},
      {"stream_record_refused", test_stream_record_refused},
      {"stream_forget_cached", test_stream_forget_cached},
      {"trim", test_trim},
      {"trim_keep_huge", test_trim_keep_huge},
      {"phys_cache", test_phys_cache},
      {"trim_thread", test_trim_thread},
      {"local_limit", test_local_limit},
      {"steal_empty_chunk", test_steal_empty_chunk},
      {"shared_budget_wait", test_shared_budget_wait},
      {"shared_budget_timeout", test_shared_budget_timeout},
      {"device_full_waits_for_release", test_device_full_waits_for_release},
      {"shared_budget_wait_own_free", test_shared_budget_wait_own_free},
      {"provider_failure_refund", test_provider_failure_refund},
      {"shared_budget_wait_cache_exit", test_shared_budget_wait_cache_exit},
      {"pressed_budget_trims_all", test_pressed_budget_trims_all},
      {"provider_failures", test_provider_failures},
      {"device_capacity", test_device_capacity},
      {"bad_input", test_bad_input},
      {"bad_input_null", test_bad_input_null},
      {"bad_config", test_bad_config},
      {"hook", test_hook},
      {"abandon_streams", test_abandon_streams},
      {"stats_print", test_stats_print},
      {"lock", test_lock},
      {"threads", test_threads},
      {"tcache_reuse", test_tcache_reuse},
      {"tcache_cross_thread", test_tcache_cross_thread},
      {"tcache_trim_flushes", test_tcache_trim_flushes},
      {"tcache_destroy_with_caches", test_tcache_destroy_with_caches},
      {"tcache_budget", test_tcache_budget},
      {"tcache_fork", test_tcache_fork},
      {"randomized", test_randomized},
      {NULL, NULL},
  };
  return wl_test_main(argc, argv, "alloc", cases);
}
