/* The CPU kernels' thread pool: persistent workers woken per parallel region, reset after fork. */
#include <errno.h>
#include <pthread.h>
#include <sched.h>
#include <stdlib.h>

#include "internal.h"

#define WL__MAX_THREADS 256

typedef struct wl__pool_s {
  pthread_mutex_t mu;     /* guards everything below */
  pthread_cond_t work;    /* a new generation was published */
  pthread_cond_t done;    /* remaining reached 0 */
  pthread_mutex_t region; /* held by the one caller running a parallel region */
  int nworkers;           /* workers started (tids 1..nworkers) */
  uint64_t gen;
  wl__task_fn fn;
  void *arg;
  int nthreads;       /* of the current region */
  int remaining;      /* workers of the current region still running */
  uint64_t spawn_gen; /* gen before the region that starts new workers */
} wl__pool_t;

static wl__pool_t pool = {.mu = PTHREAD_MUTEX_INITIALIZER,
                          .work = PTHREAD_COND_INITIALIZER,
                          .done = PTHREAD_COND_INITIALIZER,
                          .region = PTHREAD_MUTEX_INITIALIZER};
static int requested_threads; /* 0: default */
static pthread_once_t atfork_once = PTHREAD_ONCE_INIT;
static _Thread_local int in_worker;

/* The child of a fork has none of the workers: start again from an empty pool. */
static void pool_atfork_child(void) {
  pthread_mutex_init(&pool.mu, NULL);
  pthread_cond_init(&pool.work, NULL);
  pthread_cond_init(&pool.done, NULL);
  pthread_mutex_init(&pool.region, NULL);
  pool.nworkers = 0;
  pool.gen = 0;
  pool.remaining = 0;
}

static void pool_atfork_register(void) {
  pthread_atfork(NULL, NULL, pool_atfork_child);
}

static void *worker_main(void *p) {
  int tid = (int)(intptr_t)p;
  in_worker = 1;
  pthread_mutex_lock(&pool.mu);
  uint64_t seen = pool.spawn_gen; /* so the region that started us is not missed */
  for (;;) {
    while (pool.gen == seen) pthread_cond_wait(&pool.work, &pool.mu);
    seen = pool.gen;
    if (tid >= pool.nthreads) continue; /* not part of this region */
    wl__task_fn fn = pool.fn;
    void *arg = pool.arg;
    int nt = pool.nthreads;
    pthread_mutex_unlock(&pool.mu);
    fn(arg, tid, nt);
    pthread_mutex_lock(&pool.mu);
    if (--pool.remaining == 0) pthread_cond_signal(&pool.done);
  }
  return NULL;
}

static int default_threads(void) {
  cpu_set_t set;
  if (sched_getaffinity(0, sizeof set, &set) == 0) {
    int n = CPU_COUNT(&set);
    if (n > 0) return n < WL__MAX_THREADS ? n : WL__MAX_THREADS;
  }
  return 1;
}

int wl_kern_set_threads(int n) {
  if (n < 0 || n > WL__MAX_THREADS) return -EINVAL;
  __atomic_store_n(&requested_threads, n, __ATOMIC_RELAXED);
  return 0;
}

int wl_kern_threads(void) {
  int n = __atomic_load_n(&requested_threads, __ATOMIC_RELAXED);
  if (n > 0) return n;
  static int dflt;
  int d = __atomic_load_n(&dflt, __ATOMIC_RELAXED);
  if (!d) {
    d = default_threads();
    __atomic_store_n(&dflt, d, __ATOMIC_RELAXED);
  }
  return d;
}

void wl__parallel(wl__task_fn fn, void *arg, int nthreads) {
  /* Tasks partition by the nthreads they are given, so one call with 1 does all the work. */
  if (nthreads <= 1 || in_worker) {
    fn(arg, 0, 1);
    return;
  }
  if (nthreads > WL__MAX_THREADS) nthreads = WL__MAX_THREADS;
  pthread_once(&atfork_once, pool_atfork_register);
  if (pthread_mutex_trylock(&pool.region) != 0) {
    fn(arg, 0, 1); /* another application thread has the pool */
    return;
  }
  pthread_mutex_lock(&pool.mu);
  pool.spawn_gen = pool.gen;
  while (pool.nworkers < nthreads - 1) {
    pthread_t th;
    pthread_attr_t attr;
    pthread_attr_init(&attr);
    pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
    int rc = pthread_create(&th, &attr, worker_main, (void *)(intptr_t)(pool.nworkers + 1));
    pthread_attr_destroy(&attr);
    if (rc != 0) break; /* fewer threads: tasks partition by the nthreads they are given */
    pool.nworkers++;
  }
  int nw = pool.nworkers < nthreads - 1 ? pool.nworkers : nthreads - 1;
  pool.fn = fn;
  pool.arg = arg;
  pool.nthreads = nw + 1;
  pool.remaining = nw;
  pool.gen++;
  pthread_cond_broadcast(&pool.work);
  pthread_mutex_unlock(&pool.mu);

  /* The caller is tid 0; nested calls from the task run inline. */
  in_worker = 1;
  fn(arg, 0, nw + 1);
  in_worker = 0;

  pthread_mutex_lock(&pool.mu);
  while (pool.remaining > 0) pthread_cond_wait(&pool.done, &pool.mu);
  pthread_mutex_unlock(&pool.mu);
  pthread_mutex_unlock(&pool.region);
}

void wl__split(size_t n, size_t grain, int nparts, int i, size_t *lo, size_t *hi) {
  if (grain == 0) grain = 1;
  size_t units = (n + grain - 1) / grain;
  size_t per = units / (size_t)nparts, extra = units % (size_t)nparts;
  size_t u0 = (size_t)i * per + ((size_t)i < extra ? (size_t)i : extra);
  size_t u1 = u0 + per + ((size_t)i < extra ? 1 : 0);
  size_t a = u0 * grain, b = u1 * grain;
  *lo = a < n ? a : n;
  *hi = b < n ? b : n;
}

typedef struct pfor_s {
  size_t n, grain;
  void (*fn)(void *ctx, size_t lo, size_t hi);
  void *ctx;
} pfor_t;

static void pfor_task(void *arg, int tid, int nt) {
  pfor_t *pf = arg;
  size_t lo, hi;
  wl__split(pf->n, pf->grain, nt, tid, &lo, &hi);
  if (lo < hi) pf->fn(pf->ctx, lo, hi);
}

void wl__parallel_for(size_t n, size_t grain, void (*fn)(void *ctx, size_t lo, size_t hi),
                      void *ctx) {
  if (n == 0) return;
  if (grain == 0) grain = 1;
  size_t chunks = (n + grain - 1) / grain;
  int t = wl_kern_threads();
  if ((size_t)t > chunks) t = (int)chunks;
  if (t <= 1) {
    fn(ctx, 0, n);
    return;
  }
  pfor_t pf = {n, grain, fn, ctx};
  wl__parallel(pfor_task, &pf, t);
}
