/* Tests of the pinned-host arena over mmap-backed chunks that the test counts and checks, and of
 * its private jemalloc (a program under LD_PRELOAD keeps glibc's malloc). */
#include <errno.h>
#include <pthread.h>
#include <spawn.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include "pinned.h"
#include "wltest.h"

extern char **environ;

/* ---- chunk ops backed by mmap, every chunk recorded ---- */

#define MAX_CHUNKS 4096

static struct {
  pthread_mutex_t lock;
  struct {
    void *p;
    size_t size;
  } c[MAX_CHUNKS];
  int n;
  int allocs, frees, bad_frees, fail_next;
  /* A block the test still holds: a chunk freed under it is a violation. */
  bool (*live_in)(uintptr_t lo, uintptr_t hi);
  int freed_under_live;
} t = {.lock = PTHREAD_MUTEX_INITIALIZER};

static int t_chunk_alloc(void *ctx, size_t size, void **out) {
  pthread_mutex_lock(&t.lock);
  if (t.fail_next > 0 || t.n == MAX_CHUNKS) {
    t.fail_next--;
    pthread_mutex_unlock(&t.lock);
    return -ENOMEM;
  }
  pthread_mutex_unlock(&t.lock);
  void *p =
      mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (p == MAP_FAILED) return -ENOMEM;
  pthread_mutex_lock(&t.lock);
  t.c[t.n].p = p;
  t.c[t.n].size = size;
  t.n++;
  t.allocs++;
  pthread_mutex_unlock(&t.lock);
  *out = p;
  return 0;
}

static void t_chunk_free(void *ctx, void *p, size_t size) {
  pthread_mutex_lock(&t.lock);
  int i = 0;
  while (i < t.n && t.c[i].p != p) i++;
  if (i == t.n || t.c[i].size != size) {
    t.bad_frees++;
    pthread_mutex_unlock(&t.lock);
    return;
  }
  if (t.live_in && t.live_in((uintptr_t)p, (uintptr_t)p + size)) t.freed_under_live++;
  t.c[i] = t.c[--t.n];
  t.frees++;
  pthread_mutex_unlock(&t.lock);
  munmap(p, size);
}

static const wl__pinned_ops_t t_ops = {.chunk_alloc = t_chunk_alloc, .chunk_free = t_chunk_free};

static uint64_t t_chunk_bytes(void) {
  uint64_t b = 0;
  pthread_mutex_lock(&t.lock);
  for (int i = 0; i < t.n; i++) b += t.c[i].size;
  pthread_mutex_unlock(&t.lock);
  return b;
}

static bool in_test_chunk(const void *p, size_t size) {
  bool in = false;
  pthread_mutex_lock(&t.lock);
  for (int i = 0; i < t.n && !in; i++)
    in = (uintptr_t)p >= (uintptr_t)t.c[i].p &&
         (uintptr_t)p + size <= (uintptr_t)t.c[i].p + t.c[i].size;
  pthread_mutex_unlock(&t.lock);
  return in;
}

static void setup(size_t chunk) {
  pthread_mutex_lock(&t.lock);
  t.allocs = t.frees = t.bad_frees = t.fail_next = t.freed_under_live = 0;
  t.live_in = NULL;
  pthread_mutex_unlock(&t.lock);
  CU_ASSERT_EQUAL_FATAL(wl__pinned_configure(chunk), 0);
  CU_ASSERT_EQUAL_FATAL(wl__pinned_init(&t_ops), 0);
}

/* Shuts the arena down and checks that every chunk went back, each exactly once. */
static void teardown(void) {
  wl__pinned_shutdown();
  pthread_mutex_lock(&t.lock);
  CU_ASSERT_EQUAL(t.n, 0);
  CU_ASSERT_EQUAL(t.bad_frees, 0);
  CU_ASSERT_EQUAL(t.allocs, t.frees);
  t.live_in = NULL;
  pthread_mutex_unlock(&t.lock);
}

/* The arena's accounting matches the chunks the test handed out. */
static void check_accounting(void) {
  wl__pinned_stats_t s;
  wl__pinned_stats(&s);
  pthread_mutex_lock(&t.lock);
  int n = t.n, allocs = t.allocs, frees = t.frees;
  pthread_mutex_unlock(&t.lock);
  CU_ASSERT_EQUAL(s.chunks, (uint64_t)n);
  CU_ASSERT_EQUAL(s.chunk_bytes, t_chunk_bytes());
  CU_ASSERT_EQUAL(s.chunk_allocs, (uint64_t)allocs);
  CU_ASSERT_EQUAL(s.chunk_frees, (uint64_t)frees);
}

/* ---- cases ---- */
/* The chunk of the test's that holds p, or NULL. */
static void *chunk_of(const void *p) {
  void *c = NULL;
  pthread_mutex_lock(&t.lock);
  for (int i = 0; i < t.n && !c; i++)
    if ((uintptr_t)p >= (uintptr_t)t.c[i].p && (uintptr_t)p < (uintptr_t)t.c[i].p + t.c[i].size)
      c = t.c[i].p;
  pthread_mutex_unlock(&t.lock);
  return c;
}

static void test_interface_errors(void) {
  CU_ASSERT_PTR_NULL(wl__pinned_alloc(100, 0)); /* before init: passed through */
  CU_ASSERT_EQUAL(wl__pinned_free((void *)&t), -ENOENT);
  CU_ASSERT_EQUAL(wl__pinned_init(NULL), -EINVAL);
  wl__pinned_ops_t half = {.chunk_alloc = t_chunk_alloc};
  CU_ASSERT_EQUAL(wl__pinned_init(&half), -EINVAL);
  CU_ASSERT_EQUAL(wl__pinned_configure(3u << 20), -EINVAL);
  CU_ASSERT_EQUAL(wl__pinned_configure(1u << 20), -EINVAL);
  setup(WL_PINNED_CHUNK_DEFAULT);
  CU_ASSERT_EQUAL(wl__pinned_init(&t_ops), -EALREADY);
  CU_ASSERT_EQUAL(wl__pinned_configure(4u << 20), -EBUSY);
  /* Not served: the caller passes these through to CUDA. */
  CU_ASSERT_PTR_NULL(wl__pinned_alloc(0, 0));
  CU_ASSERT_PTR_NULL(wl__pinned_alloc((size_t)1 << 41, 0));
  CU_ASSERT_PTR_NULL(wl__pinned_alloc(4096, WL_PINNED_F_WRITECOMBINED));
  CU_ASSERT_PTR_NULL(wl__pinned_alloc(4096, WL_PINNED_F_PORTABLE | WL_PINNED_F_WRITECOMBINED));
  CU_ASSERT_PTR_NULL(wl__pinned_alloc(4096, 0x08));
  /* Served, with the flags remembered for cuMemHostGetFlags. */
  for (unsigned f = 0; f < 4; f++) {
    void *p = wl__pinned_alloc(3000, f);
    CU_ASSERT_PTR_NOT_NULL_FATAL(p);
    unsigned flags = 99;
    size_t size = 0, usable = 0;
    CU_ASSERT_EQUAL(wl__pinned_query(p, &size, &usable, &flags), 0);
    CU_ASSERT_EQUAL(flags, f);
    CU_ASSERT_EQUAL(size, 3000);
    CU_ASSERT(usable >= 3000);
    CU_ASSERT_EQUAL(wl__pinned_free(p), 0);
    CU_ASSERT_EQUAL(wl__pinned_query(p, NULL, NULL, NULL), -ENOENT);
  }
  wl__pinned_stats_t s;
  wl__pinned_stats(&s);
  CU_ASSERT_EQUAL(s.served, 4);
  CU_ASSERT(s.passed >= 5);
  CU_ASSERT_EQUAL(s.live_blocks, 0);
  check_accounting();
  teardown();
}

static void test_alignment_and_no_overlap(void) {
  setup(WL_PINNED_CHUNK_DEFAULT);
  enum { N = 600 };
  static void *p[N];
  static size_t sz[N];
  for (int i = 0; i < N; i++) {
    sz[i] = (size_t)1 + ((size_t)i * 7919u) % (1u << ((i % 5) * 4 + 4)); /* 1 B .. 1 MiB */
    p[i] = wl__pinned_alloc(sz[i], 0);
    CU_ASSERT_PTR_NOT_NULL_FATAL(p[i]);
    uintptr_t a = (uintptr_t)p[i];
    CU_ASSERT_EQUAL(a % (sz[i] >= 4096 ? 4096 : 256), 0);
    CU_ASSERT(in_test_chunk(p[i], sz[i]));
    CU_ASSERT(wl__pinned_owns(p[i]));
    CU_ASSERT(wl__pinned_owns((char *)p[i] + sz[i] - 1));
    memset(p[i], (unsigned char)i, sz[i]);
  }
  for (int i = 0; i < N; i++) {
    const unsigned char *b = p[i];
    size_t bad = 0;
    for (size_t k = 0; k < sz[i]; k++) bad += b[k] != (unsigned char)i;
    CU_ASSERT_EQUAL(bad, 0); /* no other block wrote over this one */
  }
  check_accounting();
  for (int i = 0; i < N; i++) CU_ASSERT_EQUAL(wl__pinned_free(p[i]), 0);
  teardown();
}

static void test_reuse(void) {
  setup(WL_PINNED_CHUNK_DEFAULT);
  void *first = wl__pinned_alloc(10000, 0);
  CU_ASSERT_PTR_NOT_NULL_FATAL(first);
  CU_ASSERT_EQUAL(wl__pinned_free(first), 0);
  int allocs = t.allocs;
  /* Freed memory is reused: 20000 cycles over a working set never need another chunk. */
  void *w[16] = {0};
  for (int i = 0; i < 20000; i++) {
    int k = i % 16;
    if (w[k]) CU_ASSERT_EQUAL(wl__pinned_free(w[k]), 0);
    w[k] = wl__pinned_alloc((size_t)1000 + (size_t)(i % 7) * 50000, 0);
    CU_ASSERT_PTR_NOT_NULL_FATAL(w[k]);
  }
  CU_ASSERT_EQUAL(t.allocs, allocs);
  CU_ASSERT_EQUAL(t.allocs, 1);
  for (int k = 0; k < 16; k++) CU_ASSERT_EQUAL(wl__pinned_free(w[k]), 0);
  /* The same request again lands in memory already handed out once. */
  void *again = wl__pinned_alloc(10000, 0);
  CU_ASSERT(in_test_chunk(again, 10000));
  CU_ASSERT_EQUAL(t.allocs, 1);
  CU_ASSERT_EQUAL(wl__pinned_free(again), 0);
  check_accounting();
  teardown();
}

static void test_big_requests_own_chunk(void) {
  const size_t chunk = 4u << 20;
  setup(chunk);
  void *small = wl__pinned_alloc(100, 0);
  CU_ASSERT_PTR_NOT_NULL_FATAL(small);
  CU_ASSERT_EQUAL(t.allocs, 1);
  /* Half a chunk or more: a chunk of its own, exactly the request rounded to pages. */
  const size_t big = (chunk / 2) + 123;
  void *b = wl__pinned_alloc(big, WL_PINNED_F_DEVICEMAP);
  CU_ASSERT_PTR_NOT_NULL_FATAL(b);
  CU_ASSERT_EQUAL(t.allocs, 2);
  pthread_mutex_lock(&t.lock);
  bool found = false;
  for (int i = 0; i < t.n; i++)
    if (t.c[i].p == b) found = t.c[i].size == ((big + 4095) & ~(size_t)4095);
  pthread_mutex_unlock(&t.lock);
  CU_ASSERT(found);
  void *huge = wl__pinned_alloc(3 * chunk + 1, 0);
  CU_ASSERT_PTR_NOT_NULL_FATAL(huge);
  memset(huge, 1, 3 * chunk + 1);
  wl__pinned_stats_t s;
  wl__pinned_stats(&s);
  CU_ASSERT_EQUAL(s.own_chunks, 2);
  CU_ASSERT_EQUAL(s.live_blocks, 3);
  CU_ASSERT_EQUAL(s.live_bytes, 100 + big + 3 * chunk + 1);
  check_accounting();
  /* Its free returns the chunk at once; the shared chunk stays. */
  CU_ASSERT_EQUAL(wl__pinned_free(b), 0);
  CU_ASSERT_EQUAL(t.frees, 1);
  CU_ASSERT_FALSE(wl__pinned_owns(b));
  CU_ASSERT_EQUAL(wl__pinned_free(b), -ENOENT); /* gone: no longer ours */
  CU_ASSERT_EQUAL(wl__pinned_free(huge), 0);
  CU_ASSERT_EQUAL(t.frees, 2);
  CU_ASSERT_EQUAL(wl__pinned_free(small), 0);
  CU_ASSERT_EQUAL(t.frees, 2);
  check_accounting();
  teardown();
}

static void test_foreign_and_bad_frees(void) {
  setup(WL_PINNED_CHUNK_DEFAULT);
  char *p = wl__pinned_alloc(8192, 0);
  CU_ASSERT_PTR_NOT_NULL_FATAL(p);
  void *heap = malloc(64);
  int stack;
  CU_ASSERT_EQUAL(wl__pinned_free(heap), -ENOENT);
  CU_ASSERT_EQUAL(wl__pinned_free(&stack), -ENOENT);
  CU_ASSERT_EQUAL(wl__pinned_free(NULL), -ENOENT);
  CU_ASSERT_FALSE(wl__pinned_owns(heap));
  CU_ASSERT_FALSE(wl__pinned_owns(NULL));
  free(heap);
  /* Inside a chunk but not a live block: refused, never passed through. */
  CU_ASSERT(wl__pinned_owns(p + 100));
  CU_ASSERT_EQUAL(wl__pinned_free(p + 100), -EINVAL);
  CU_ASSERT_EQUAL(wl__pinned_free(p), 0);
  CU_ASSERT_EQUAL(wl__pinned_free(p), -EINVAL); /* double free */
  wl__pinned_stats_t s;
  wl__pinned_stats(&s);
  CU_ASSERT_EQUAL(s.bad_frees, 2);
  CU_ASSERT_EQUAL(s.live_blocks, 0);
  teardown();
}

/* The arena's metadata is not in pinned chunks: with every chunk inaccessible, blocks are still
 * freed and allocated (those touch only jemalloc's metadata). A metadata write into a chunk
 * would fault. Also: creating the arena takes no chunk. */
static void test_metadata_outside_chunks(void) {
  setup(WL_PINNED_CHUNK_DEFAULT);
  CU_ASSERT_EQUAL(t.allocs, 0);
  enum { N = 3000 };
  static void *p[N];
  for (int i = 0; i < N; i++) {
    p[i] = wl__pinned_alloc((size_t)16 + (size_t)(i % 40) * 700, 0);
    CU_ASSERT_PTR_NOT_NULL_FATAL(p[i]);
  }
  pthread_mutex_lock(&t.lock);
  for (int i = 0; i < t.n; i++) CU_ASSERT_EQUAL(mprotect(t.c[i].p, t.c[i].size, PROT_NONE), 0);
  pthread_mutex_unlock(&t.lock);
  for (int i = 0; i < N; i += 2) CU_ASSERT_EQUAL(wl__pinned_free(p[i]), 0);
  for (int i = 0; i < N; i += 2) {
    p[i] = wl__pinned_alloc((size_t)16 + (size_t)(i % 40) * 700, 0);
    CU_ASSERT_PTR_NOT_NULL(p[i]);
  }
  pthread_mutex_lock(&t.lock);
  for (int i = 0; i < t.n; i++) mprotect(t.c[i].p, t.c[i].size, PROT_READ | PROT_WRITE);
  pthread_mutex_unlock(&t.lock);
  for (int i = 0; i < N; i++) CU_ASSERT_EQUAL(wl__pinned_free(p[i]), 0);
  teardown();
}

/* Randomised: blocks of every size class, small chunks so the big path runs often; a chunk is
 * never freed while a block in it is live, and the accounting matches throughout. */
enum { RN = 400 };
static struct {
  void *p[RN];
  size_t sz[RN];
} rnd;

static bool rnd_live_in(uintptr_t lo, uintptr_t hi) {
  for (int i = 0; i < RN; i++)
    if (rnd.p[i] && (uintptr_t)rnd.p[i] < hi && (uintptr_t)rnd.p[i] + rnd.sz[i] > lo) return true;
  return false;
}

static void test_random_no_chunk_freed_while_live(void) {
  setup(2u << 20);
  memset(&rnd, 0, sizeof(rnd));
  /* Called by chunk_free with t.lock held; rnd is only changed by this thread, outside it. */
  t.live_in = rnd_live_in;
  unsigned seed = 12345;
  for (int step = 0; step < 60000; step++) {
    int i = (int)(rand_r(&seed) % RN);
    if (rnd.p[i]) {
      CU_ASSERT_EQUAL(*(unsigned char *)rnd.p[i], (unsigned char)i);
      void *q = rnd.p[i];
      pthread_mutex_lock(&t.lock);
      rnd.p[i] = NULL; /* before the free: its own chunk may go back now */
      pthread_mutex_unlock(&t.lock);
      CU_ASSERT_EQUAL(wl__pinned_free(q), 0);
    } else {
      unsigned r = (unsigned)rand_r(&seed);
      size_t sz = r % 100 == 0 ? (size_t)(1u << 20) + r % (3u << 20) : (size_t)1 + r % 20000;
      void *q = wl__pinned_alloc(sz, r & 3);
      CU_ASSERT_PTR_NOT_NULL_FATAL(q);
      *(unsigned char *)q = (unsigned char)i;
      ((unsigned char *)q)[sz - 1] = (unsigned char)i;
      pthread_mutex_lock(&t.lock);
      rnd.p[i] = q;
      rnd.sz[i] = sz;
      pthread_mutex_unlock(&t.lock);
    }
    if (step % 10000 == 0) check_accounting();
  }
  check_accounting();
  CU_ASSERT_EQUAL(t.freed_under_live, 0);
  CU_ASSERT(t.frees > 0); /* big blocks did go back */
  for (int i = 0; i < RN; i++) {
    void *q = rnd.p[i];
    pthread_mutex_lock(&t.lock);
    rnd.p[i] = NULL;
    pthread_mutex_unlock(&t.lock);
    if (q) CU_ASSERT_EQUAL(wl__pinned_free(q), 0);
  }
  CU_ASSERT_EQUAL(t.freed_under_live, 0);
  teardown();
}

static void test_chunk_alloc_failure(void) {
  setup(WL_PINNED_CHUNK_DEFAULT);
  t.fail_next = 1000000;
  CU_ASSERT_PTR_NULL(wl__pinned_alloc(100, 0));
  CU_ASSERT_PTR_NULL(wl__pinned_alloc(WL_PINNED_CHUNK_DEFAULT, 0));
  t.fail_next = 0;
  void *p = wl__pinned_alloc(100, 0);
  CU_ASSERT_PTR_NOT_NULL(p);
  CU_ASSERT_EQUAL(wl__pinned_free(p), 0);
  wl__pinned_stats_t s;
  wl__pinned_stats(&s);
  CU_ASSERT_EQUAL(s.passed, 2);
  teardown();
}

#define THREADS    4
#define PER_THREAD 30000

static void *thread_main(void *arg) {
  uintptr_t id = (uintptr_t)arg;
  unsigned seed = (unsigned)id * 7 + 1;
  void *held[64] = {0};
  size_t size[64] = {0};
  long errors = 0;
  for (int i = 0; i < PER_THREAD; i++) {
    int k = (int)(rand_r(&seed) % 64);
    if (held[k]) {
      const unsigned char *b = held[k];
      errors += b[0] != (unsigned char)(id + k) || b[size[k] - 1] != (unsigned char)(id + k);
      errors += wl__pinned_free(held[k]) != 0;
      held[k] = NULL;
    } else {
      size[k] = (size_t)1 + (size_t)(rand_r(&seed) % 70000);
      held[k] = wl__pinned_alloc(size[k], 0);
      if (!held[k]) {
        errors++;
        continue;
      }
      memset(held[k], (unsigned char)(id + k), size[k]);
    }
  }
  for (int k = 0; k < 64; k++)
    if (held[k]) errors += wl__pinned_free(held[k]) != 0;
  return (void *)errors;
}

static void test_threads(void) {
  setup(WL_PINNED_CHUNK_DEFAULT);
  pthread_t th[THREADS];
  for (uintptr_t i = 0; i < THREADS; i++)
    CU_ASSERT_EQUAL_FATAL(pthread_create(&th[i], NULL, thread_main, (void *)(i * 64)), 0);
  for (int i = 0; i < THREADS; i++) {
    void *errors = NULL;
    pthread_join(th[i], &errors);
    CU_ASSERT_EQUAL((long)errors, 0);
  }
  wl__pinned_stats_t s;
  wl__pinned_stats(&s);
  CU_ASSERT_EQUAL(s.live_blocks, 0);
  CU_ASSERT_EQUAL(s.live_bytes, 0);
  check_accounting();
  teardown();
}

/* A forked child serves nothing (its chunks are not page-locked) and forgets the parent's
 * blocks without touching them. */
static void test_fork_child(void) {
  setup(WL_PINNED_CHUNK_DEFAULT);
  void *p = wl__pinned_alloc(5000, 0);
  CU_ASSERT_PTR_NOT_NULL_FATAL(p);
  pid_t pid = fork();
  if (pid == 0) {
    wl__pinned_fork_child();
    int bad = 0;
    bad |= wl__pinned_alloc(100, 0) != NULL;
    bad |= (!wl__pinned_owns(p)) << 1;
    bad |= (wl__pinned_free(p) != 0) << 2;
    bad |= (wl__pinned_free(p) != -EINVAL) << 3;
    _exit(bad);
  }
  int st = 0;
  CU_ASSERT_EQUAL(waitpid(pid, &st, 0), pid);
  CU_ASSERT(WIFEXITED(st));
  CU_ASSERT_EQUAL(WEXITSTATUS(st), 0);
  /* The parent is unaffected. */
  CU_ASSERT_EQUAL(wl__pinned_free(p), 0);
  void *q = wl__pinned_alloc(5000, 0);
  CU_ASSERT_PTR_NOT_NULL(q);
  CU_ASSERT_EQUAL(wl__pinned_free(q), 0);
  teardown();
}

/* Runs pinned_preload_check, with the test module preloaded or not; returns its exit status. */
static int run_check(bool preload) {
  char pre[1024], asan[256];
  snprintf(pre, sizeof(pre), "LD_PRELOAD=%s", WL_PRELOAD_MODULE);
  /* A sanitizer runtime must come first unless told otherwise. */
  const char *ao = getenv("ASAN_OPTIONS");
  snprintf(asan, sizeof(asan), "ASAN_OPTIONS=%s%sverify_asan_link_order=0", ao ? ao : "",
           ao && *ao ? ":" : "");
  char *env[512];
  int n = 0;
  for (char **e = environ; *e && n < 500; e++)
    if (strncmp(*e, "LD_PRELOAD=", 11) && strncmp(*e, "ASAN_OPTIONS=", 13)) env[n++] = *e;
  if (preload) env[n++] = pre;
  env[n++] = asan;
  env[n] = NULL;
  char *argv[] = {(char *)WL_PRELOAD_CHECK, NULL};
  pid_t pid;
  if (posix_spawn(&pid, WL_PRELOAD_CHECK, NULL, NULL, argv, env) != 0) return -1;
  int st = 0;
  if (waitpid(pid, &st, 0) != pid || !WIFEXITED(st)) return -1;
  return WEXITSTATUS(st);
}

static void test_preload_keeps_glibc_malloc(void) {
  CU_ASSERT_EQUAL(run_check(true), 0);
  /* Without the module the check notices (so it cannot pass by not looking). */
  CU_ASSERT_EQUAL(run_check(false), 100);
}

static void test_reinit_cycles(void) {
  for (int round = 0; round < 5; round++) {
    setup(round % 2 ? 2u << 20 : WL_PINNED_CHUNK_DEFAULT);
    void *p = wl__pinned_alloc(1000, 0), *q = wl__pinned_alloc(3u << 20, 0);
    CU_ASSERT_PTR_NOT_NULL(p);
    CU_ASSERT_PTR_NOT_NULL(q);
    CU_ASSERT_EQUAL(wl__pinned_free(p), 0);
    /* q is left live: shutdown frees its chunk anyway. */
    teardown();
    CU_ASSERT_FALSE(wl__pinned_owns(q));
  }
}

#ifdef WL_JEMALLOC_SO
static const char *g_argv0;

/* The dynamic flavour without its library, in a fresh process (a loaded library stays): a
 * missing file, then a library without jemalloc's functions, each fail the init with -ENOENT
 * and every request passes through; the init with the real library then serves. */
static void test_missing_library(void) {
  if (!getenv("WLTEST_PINNED_NOLIB")) {
    CU_ASSERT(wl_test_rerun("WLTEST_PINNED_NOLIB", "1", g_argv0, "missing_library"));
    return;
  }
  CU_ASSERT_EQUAL_FATAL(wl__pinned_set_library("/nonexistent/libwavelet-jemalloc.so", NULL), 0);
  CU_ASSERT_EQUAL(wl__pinned_init(&t_ops), -ENOENT);
  CU_ASSERT_PTR_NULL(wl__pinned_alloc(100, 0));
  CU_ASSERT_EQUAL(wl__pinned_set_library("libm.so.6", NULL), 0); /* no wl__je_* functions */
  CU_ASSERT_EQUAL(wl__pinned_init(&t_ops), -ENOENT);
  CU_ASSERT_PTR_NULL(wl__pinned_alloc(100, 0));
  CU_ASSERT_EQUAL(t.allocs, 0);
  CU_ASSERT_EQUAL(wl__pinned_set_library(WL_JEMALLOC_SO, NULL), 0);
  setup(WL_PINNED_CHUNK_DEFAULT);
  CU_ASSERT_EQUAL(wl__pinned_set_library(WL_JEMALLOC_SO, NULL), -EBUSY);
  void *p = wl__pinned_alloc(100, 0);
  CU_ASSERT_PTR_NOT_NULL(p);
  CU_ASSERT_EQUAL(wl__pinned_free(p), 0);
  teardown();
}
#endif

/* Keys (devices) never share a chunk; resetting one key gives back its chunks, shared and own,
 * and forgets its blocks, while the other key's blocks stay live in theirs; the reset key then
 * serves again from new chunks. */
static void test_keys_apart_and_reset(void) {
  setup(4u << 20);
  void *a0 = wl__pinned_alloc_for(1000, 0, 0), *a1 = wl__pinned_alloc_for(1000, 0, 1);
  void *b0 = wl__pinned_alloc_for(3000, 0, 0), *big1 = wl__pinned_alloc_for(3u << 20, 0, 1);
  CU_ASSERT_FATAL(a0 && a1 && b0 && big1);
  CU_ASSERT_PTR_NOT_NULL(chunk_of(a0));
  CU_ASSERT_PTR_NOT_EQUAL(chunk_of(a0), chunk_of(a1)); /* device 1's first request: a new chunk */
  CU_ASSERT_PTR_EQUAL(chunk_of(a0), chunk_of(b0));
  CU_ASSERT_PTR_NULL(wl__pinned_alloc_for(100, 0, WL_PINNED_KEYS)); /* no such key: through */
  memset(a0, 0x5a, 1000);
  pthread_mutex_lock(&t.lock);
  int frees0 = t.frees;
  pthread_mutex_unlock(&t.lock);
  CU_ASSERT_EQUAL(wl__pinned_reset_key(1), 2); /* its shared chunk and big1's own */
  pthread_mutex_lock(&t.lock);
  CU_ASSERT_EQUAL(t.frees - frees0, 2);
  pthread_mutex_unlock(&t.lock);
  CU_ASSERT_PTR_NULL(chunk_of(a1));
  CU_ASSERT_PTR_NOT_NULL(chunk_of(a0));
  CU_ASSERT_EQUAL(((unsigned char *)a0)[999], 0x5a);
  CU_ASSERT_EQUAL(wl__pinned_query(a1, NULL, NULL, NULL), -ENOENT); /* forgotten */
  CU_ASSERT_EQUAL(wl__pinned_query(a0, NULL, NULL, NULL), 0);
  void *c1 = wl__pinned_alloc_for(1000, 0, 1);
  CU_ASSERT_PTR_NOT_NULL(c1);
  CU_ASSERT_PTR_NOT_EQUAL(chunk_of(c1), chunk_of(a0));
  CU_ASSERT_EQUAL(wl__pinned_reset_key(5), 0); /* nothing of key 5's */
  CU_ASSERT_EQUAL(wl__pinned_free(c1), 0);
  CU_ASSERT_EQUAL(wl__pinned_free(a0), 0);
  CU_ASSERT_EQUAL(wl__pinned_free(b0), 0);
  check_accounting();
  teardown();
}

int main(int argc, char **argv) {
#ifdef WL_JEMALLOC_SO
  /* The dynamic flavour: jemalloc is loaded from beside this executable unless told. */
  g_argv0 = argv[0];
  if (wl__pinned_set_library(WL_JEMALLOC_SO, NULL) != 0) return 2;
#endif
  static const wl_test_case_t cases[] = {
#ifdef WL_JEMALLOC_SO
      {"missing_library", test_missing_library},
#endif
      {"interface_errors", test_interface_errors},
      {"alignment_and_no_overlap", test_alignment_and_no_overlap},
      {"reuse", test_reuse},
      {"big_requests_own_chunk", test_big_requests_own_chunk},
      {"foreign_and_bad_frees", test_foreign_and_bad_frees},
      {"metadata_outside_chunks", test_metadata_outside_chunks},
      {"random_no_chunk_freed_while_live", test_random_no_chunk_freed_while_live},
      {"chunk_alloc_failure", test_chunk_alloc_failure},
      {"threads", test_threads},
      {"fork_child", test_fork_child},
      {"reinit_cycles", test_reinit_cycles},
      {"keys_apart_and_reset", test_keys_apart_and_reset},
      {"preload_keeps_glibc_malloc", test_preload_keeps_glibc_malloc},
      {NULL, NULL}};
  return wl_test_main(argc, argv, "pinned", cases);
}
