/* wl-bench-alloc: replays allocation traces against liballoc (host provider) and glibc malloc in
 * the same run, and prints per-call latency, the ratio between them and liballoc's footprint. */
#include <wavelet/alloc.h>

#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <sched.h>
#include <sys/resource.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "traces.h"
#include "util.h"

#define PROG "wl-bench-alloc"

#define GiB ((size_t)1 << 30)
/* The modelled device: an 80 GiB GPU. The host provider maps pages it never touches, so the
 * peaks below cost address space, not RAM. */
#define HOST_CAPACITY   (80 * GiB)
#define RANDOM_LIVE_CAP (4 * GiB)

#define TARGET_RATIO    1.5
#define TARGET_RESERVED 1.05
#define MAX_ROUNDS      50
#define DEFAULT_ITERS   100
#define DEFAULT_ROUNDS  5
#define QUICK_ITERS     4
#define QUICK_ROUNDS    1
#define MAX_ITERS       100000

#define ALWAYS_INLINE static inline __attribute__((always_inline))

/* ---- the timer: TSC when the kernel trusts it, else CLOCK_MONOTONIC --------------------------*/

static int g_tsc;

ALWAYS_INLINE uint64_t tick_start(void) {
#if defined(__x86_64__)
  if (g_tsc) {
    uint32_t lo, hi;
    /* lfence: earlier instructions finish before the read. */
    __asm__ __volatile__("lfence\n\trdtsc" : "=a"(lo), "=d"(hi)::"memory");
    return (uint64_t)hi << 32 | lo;
  }
#endif
  return wl__now_ns();
}

ALWAYS_INLINE uint64_t tick_stop(void) {
#if defined(__x86_64__)
  if (g_tsc) {
    uint32_t lo, hi, aux;
    /* rdtscp waits for the timed call; lfence keeps later work out of the interval. */
    __asm__ __volatile__("rdtscp\n\tlfence" : "=a"(lo), "=d"(hi), "=c"(aux)::"memory");
    return (uint64_t)hi << 32 | lo;
  }
#endif
  return wl__now_ns();
}

typedef struct timer_s {
  const char *source;
  double ns_per_tick;
  /* The step the counter advances by (1 on bare metal; a virtual TSC may step by ~24 ticks). */
  double quantum_ticks;
  double overhead_ticks, overhead_ns, overhead_min_ns;
  size_t overhead_samples;
} bench_timer_t;

static bench_timer_t g_timer;

static int cmp_u32(const void *a, const void *b) {
  uint32_t x = *(const uint32_t *)a, y = *(const uint32_t *)b;
  return x < y ? -1 : x > y;
}

/* Whether the short differences in d are multiples of q (within a tick and a half). */
static int steps_of(const uint32_t *d, size_t m, double q) {
  size_t off = 0, tested = 0;
  for (size_t i = 0; i < m; i++) {
    if (d[i] > 8 * q) continue; /* long ones (preemption) magnify q's rounding */
    tested++;
    if (fabs(d[i] - floor(d[i] / q + 0.5) * q) > 1.5) off++;
  }
  return tested && off * 100 <= tested;
}

/* The counter's step (1 when it counts every tick). A read may take several steps, so the
 * smallest difference of back-to-back reads is a multiple of the step: try lo/1, lo/2, ... and
 * keep the largest that divides every short difference, refined by least squares. */
static double detect_quantum(uint32_t *d, size_t n) {
  size_t m = 0;
  uint64_t prev = tick_start();
  for (size_t i = 0; i < n; i++) {
    uint64_t now = tick_start();
    if (now != prev) d[m++] = (uint32_t)(now - prev);
    prev = now;
  }
  uint32_t lo = UINT32_MAX;
  for (size_t i = 0; i < m; i++)
    if (d[i] < lo) lo = d[i];
  if (m < n / 4 || lo < 8) return 1;
  for (unsigned k = 1; k <= 8 && (double)lo / k >= 4; k++) {
    double q = (double)lo / k;
    if (!steps_of(d, m, q)) continue;
    double sd = 0, sk = 0;
    for (size_t i = 0; i < m; i++)
      if (d[i] <= 8 * q) sd += d[i], sk += floor(d[i] / q + 0.5);
    return sk > 0 ? sd / sk : q;
  }
  return 1;
}

/* Percentile p of sorted tick samples, in ticks. With a quantised counter a call of true length
 * D reads as one of the two neighbouring steps, in proportion (the read's phase is random), so
 * each step stands for the interval around it and the percentile is interpolated inside it:
 * this recovers sub-step differences that a plain nearest-rank percentile would hide. */
static double pct_ticks(const uint32_t *sorted, size_t n, double p) {
  if (!n) return NAN;
  double q = g_timer.quantum_ticks, target = p * (double)n;
  size_t i = (size_t)target < n ? (size_t)target : n - 1;
  double j = floor(sorted[i] / q + 0.5);
  /* [lo, hi): the samples on step j (binary searches on either side of i). */
  size_t l = 0, r = i;
  while (l < r) {
    size_t mid = l + (r - l) / 2;
    if (floor(sorted[mid] / q + 0.5) < j)
      l = mid + 1;
    else
      r = mid;
  }
  size_t lo = l;
  l = i + 1, r = n;
  while (l < r) {
    size_t mid = l + (r - l) / 2;
    if (floor(sorted[mid] / q + 0.5) <= j)
      l = mid + 1;
    else
      r = mid;
  }
  size_t hi = l;
  double x = j - 0.5 + (target - (double)lo) / (double)(hi - lo);
  return x * q;
}

/* The CPU the benchmark runs on, when it could be pinned there (-1 otherwise): no migration
 * between the two allocators' iterations. */
static int g_cpu = -1;

static void pin_cpu(void) {
  int cpu = sched_getcpu();
  if (cpu < 0) return;
  cpu_set_t set;
  CPU_ZERO(&set);
  CPU_SET(cpu, &set);
  if (sched_setaffinity(0, sizeof set, &set) == 0) g_cpu = cpu;
}

static void timer_init(int quick) {
  g_tsc = 0;
#if defined(__x86_64__)
  /* The kernel picks tsc as its clocksource only when the TSC is invariant and synchronised. */
  FILE *f = fopen("/sys/devices/system/clocksource/clocksource0/current_clocksource", "r");
  char src[32] = "";
  if (f) {
    if (!fgets(src, sizeof src, f)) src[0] = 0;
    fclose(f);
  }
  g_tsc = strncmp(src, "tsc", 3) == 0;
#endif
  g_timer.source = g_tsc ? "tsc" : "clock_gettime(CLOCK_MONOTONIC)";
  g_timer.ns_per_tick = 1.0;
  g_timer.quantum_ticks = 1.0;
  if (g_tsc) {
    uint64_t n0 = wl__now_ns(), c0 = tick_start(), n1, c1;
    uint64_t span = quick ? 10000000ull : 50000000ull;
    do {
      n1 = wl__now_ns();
    } while (n1 - n0 < span);
    c1 = tick_stop();
    g_timer.ns_per_tick = (double)(n1 - n0) / (double)(c1 - c0);
  }
  size_t n = quick ? 20000 : 200000;
  uint32_t *d = malloc(n * sizeof *d);
  if (!d) return;
  g_timer.quantum_ticks = detect_quantum(d, n);
  /* The cost of an empty timed region, subtracted from every figure. */
  for (size_t i = 0; i < n; i++) {
    uint64_t c0 = tick_start();
    uint64_t c1 = tick_stop();
    d[i] = (uint32_t)(c1 - c0);
  }
  qsort(d, n, sizeof *d, cmp_u32);
  g_timer.overhead_ticks = pct_ticks(d, n, 0.5);
  g_timer.overhead_ns = g_timer.overhead_ticks * g_timer.ns_per_tick;
  g_timer.overhead_min_ns = d[0] * g_timer.ns_per_tick;
  g_timer.overhead_samples = n;
  free(d);
}

/* ---- options -------------------------------------------------------------------------------*/

typedef struct opts_s {
  uint32_t iterations, rounds;
  uint64_t seed;
  int dnn, random, quick, json;
  int transformer; /* the DNN trace's model: 0 the CNN, 1 the transformer */
} opts_t;

static void usage(FILE *f) {
  fprintf(f,
          "usage: " PROG " [--trace dnn|random|all] [--model cnn|transformer] [--iterations N]\n"
          "                      [--rounds N] [--seed S] [--quick] [--json] [--help]\n"
          "Replays allocation traces against liballoc (host provider) and glibc malloc in the\n"
          "same run, alternating the two, and reports ns per call (p50/p99), the ratio\n"
          "liballoc/malloc and liballoc's peak physical memory over peak live bytes.\n"
          "  --trace T       dnn (a training loop), random (mixed sizes and streams) or all\n"
          "                  (default)\n"
          "  --model M       the DNN trace's model: cnn (a ResNet-like CNN, default) or\n"
          "                  transformer (a GPT-like decoder)\n"
          "  --iterations N  training iterations, or random steps of 1000 calls, 1..%d\n"
          "                  (default %d; the first is warm-up and not measured)\n"
          "  --rounds N      replays of each allocator, alternating; medians are reported, 1..%d\n"
          "                  (default %d)\n"
          "  --seed S        the traces' seed, a whole number (default 1)\n"
          "  --quick         a small run for smoke tests (%d iterations, %d round)\n"
          "  --json          one JSON object on stdout; the table goes to stderr\n"
          "  --help          this text\n",
          MAX_ITERS, DEFAULT_ITERS, MAX_ROUNDS, DEFAULT_ROUNDS, QUICK_ITERS, QUICK_ROUNDS);
}

static int bad_arg(const char *opt, const char *what, const char *got) {
  if (got)
    fprintf(stderr, PROG ": %s: expected %s, got '%s'\n", opt, what, got);
  else
    fprintf(stderr, PROG ": %s: expected %s\n", opt, what);
  usage(stderr);
  return 2;
}

/* 0: go on, 1: exit 0 (help), 2: bad arguments (already reported). */
static int parse_args(int argc, char **argv, opts_t *o) {
  int iters_set = 0, rounds_set = 0;
  memset(o, 0, sizeof *o);
  o->seed = 1;
  o->dnn = o->random = 1;
  for (int i = 1; i < argc; i++) {
    static const char *const takes_value[] = {"--trace",  "--model", "--iterations",
                                              "--rounds", "--seed",  NULL};
    wl__arg_t a;
    int split = wl__arg_split(argc, argv, &i, takes_value, &a);
    const char *arg = a.name, *val = a.val;
    if (split == -ENODATA) {
      const char *what = !strcmp(arg, "--trace")   ? "a value: dnn, random or all"
                         : !strcmp(arg, "--model") ? "a value: cnn or transformer"
                                                   : "a value: a whole number";
      return bad_arg(arg, what, NULL);
    }
    if (split == -E2BIG) {
      fprintf(stderr, PROG ": %s takes no value, got '%s'\n", arg, val);
      usage(stderr);
      return 2;
    }
    uint64_t v;
    if (!strcmp(arg, "--help") || !strcmp(arg, "-h")) {
      usage(stdout);
      return 1;
    } else if (!strcmp(arg, "--json")) {
      o->json = 1;
    } else if (!strcmp(arg, "--quick")) {
      o->quick = 1;
    } else if (!strcmp(arg, "--trace")) {
      if (!strcmp(val, "dnn"))
        o->dnn = 1, o->random = 0;
      else if (!strcmp(val, "random"))
        o->dnn = 0, o->random = 1;
      else if (!strcmp(val, "all"))
        o->dnn = o->random = 1;
      else
        return bad_arg("--trace", "dnn, random or all", val);
    } else if (!strcmp(arg, "--model")) {
      if (!strcmp(val, "cnn"))
        o->transformer = 0;
      else if (!strcmp(val, "transformer"))
        o->transformer = 1;
      else
        return bad_arg("--model", "cnn or transformer", val);
    } else if (!strcmp(arg, "--iterations")) {
      if (wl__parse_u64(val, 10, 1, MAX_ITERS, &v)) {
        char what[64];
        snprintf(what, sizeof what, "a whole number from 1 to %d", MAX_ITERS);
        return bad_arg("--iterations", what, val);
      }
      o->iterations = (uint32_t)v;
      iters_set = 1;
    } else if (!strcmp(arg, "--rounds")) {
      if (wl__parse_u64(val, 10, 1, MAX_ROUNDS, &v)) {
        char what[64];
        snprintf(what, sizeof what, "a whole number from 1 to %d", MAX_ROUNDS);
        return bad_arg("--rounds", what, val);
      }
      o->rounds = (uint32_t)v;
      rounds_set = 1;
    } else if (!strcmp(arg, "--seed")) {
      if (wl__parse_u64(val, 0, 0, UINT64_MAX, &v))
        return bad_arg("--seed", "a whole number (decimal, or hex with 0x)", val);
      o->seed = v;
    } else {
      fprintf(stderr, PROG ": unknown argument '%s'\n", argv[i]);
      usage(stderr);
      return 2;
    }
  }
  if (!iters_set) o->iterations = o->quick ? QUICK_ITERS : DEFAULT_ITERS;
  if (!rounds_set) o->rounds = o->quick ? QUICK_ROUNDS : DEFAULT_ROUNDS;
  return 0;
}

/* ---- replays ---------------------------------------------------------------------------------*/

/* What one replay leaves behind besides its per-call samples. */
typedef struct replay_s {
  uint64_t untimed_ns;  /* the measured range, one clock read at each end */
  wl_alloc_stats_t st;  /* liballoc only */
  uint64_t trim_bytes;  /* trim variant, measured iterations */
  uint32_t *trim_ticks; /* one per measured iteration */
  size_t ntrim;
  double phys_end_sum, live_end_sum; /* at each measured iteration's end (after any trim) */
  size_t nend;
} replay_t;

static uint32_t clamp32(uint64_t v) {
  return v > UINT32_MAX ? UINT32_MAX : (uint32_t)v;
}

static void report_wl_failure(const char *what, size_t size) {
  wl_alloc_failure_t f;
  char line[256] = "no reason recorded";
  if (wl_alloc_last_failure(&f) == 0) wl_alloc_failure_format(&f, line, sizeof line);
  fprintf(stderr, PROG ": liballoc %s of %zu bytes failed: %s\n", what, size, line);
}

/* Where a replay stands, so that it can be run a stretch of ops at a time (the interleaved
 * pair runs liballoc and glibc an iteration each in turn). */
typedef struct cursor_s {
  size_t i, k; /* the next op, the next sample */
  uint64_t w0; /* when the measured range began */
  uint64_t enq[WL__BENCH_MAX_STREAMS];
} cursor_t;

/* The replay loop over ops [c->i, end), specialised at compile time for timed/untimed and
 * trim/plain. */
ALWAYS_INLINE int run_wl(const wl__bench_trace_t *t, wl_alloc_t *a, wl_stream_t *st, void **ptr,
                         uint32_t *samples, replay_t *out, cursor_t *c, size_t end, const int timed,
                         const int trim) {
  uint64_t *enq = c->enq, w0 = c->w0;
  size_t k = c->k, i = c->i;
  int rc = 0;
  for (; i < end; i++) {
    if (WL_UNLIKELY(i == t->measure_from)) w0 = wl__now_ns();
    if (WL_UNLIKELY(i == t->measure_to)) out->untimed_ns = wl__now_ns() - w0;
    const wl__bench_op_t *op = &t->ops[i];
    switch (op->kind) {
    case WL__OP_ALLOC: {
      uint64_t c0 = timed ? tick_start() : 0;
      void *p = wl_alloc_async(a, op->size, st[op->stream]);
      if (timed) samples[k++] = clamp32(tick_stop() - c0);
      if (WL_UNLIKELY(!p)) {
        report_wl_failure("allocation", op->size);
        rc = -1;
        goto out;
      }
      ptr[op->slot] = p;
      break;
    }
    case WL__OP_FREE: {
      uint64_t c0 = timed ? tick_start() : 0;
      rc = wl_free_async(a, ptr[op->slot], st[op->stream]);
      if (timed) samples[k++] = clamp32(tick_stop() - c0);
      if (WL_UNLIKELY(rc)) {
        fprintf(stderr, PROG ": liballoc free failed (%d)\n", rc);
        goto out;
      }
      ptr[op->slot] = NULL;
      break;
    }
    case WL__OP_WORK:
      enq[op->stream] = wl_host_stream_enqueue(st[op->stream]);
      break;
    case WL__OP_DONE:
      for (unsigned s = 0; s < t->nstreams; s++)
        if ((op->stream == WL__BENCH_ALL_STREAMS || op->stream == s) && enq[s] > op->lag)
          wl_host_stream_complete(st[s], enq[s] - op->lag);
      break;
    case WL__OP_ITER: {
      size_t n = 0;
      uint64_t c0 = 0;
      if (trim) {
        c0 = tick_start();
        n = wl_alloc_trim(a, SIZE_MAX);
      }
      if (i >= t->measure_from) {
        if (trim) {
          out->trim_ticks[out->ntrim++] = clamp32(tick_stop() - c0);
          out->trim_bytes += n;
        }
        wl_alloc_stats_t s;
        wl_alloc_stats_get(a, &s);
        out->phys_end_sum += (double)s.physical_bytes;
        out->live_end_sum += (double)s.live_bytes;
        out->nend++;
      }
      break;
    }
    }
  }
  if (end == t->nops && t->measure_to >= t->nops) out->untimed_ns = wl__now_ns() - w0;
out:
  c->i = i;
  c->k = k;
  c->w0 = w0;
  return rc ? -1 : 0;
}

/* A liballoc replay's state: the allocator over a fresh host provider, its streams, the slots. */
typedef struct wlrep_s {
  wl_alloc_t *a;
  wl_stream_t st[WL__BENCH_MAX_STREAMS];
  void **ptr;
} wlrep_t;

static int wl_open(const wl__bench_trace_t *t, wlrep_t *w) {
  memset(w, 0, sizeof *w);
  wl_provider_t prov;
  int rc = wl_provider_host_init(&prov, HOST_CAPACITY, 0);
  if (rc) {
    fprintf(stderr, PROG ": the host provider failed to start (%d)\n", rc);
    return -1;
  }
  wl_alloc_config_t cfg;
  wl_alloc_config_default(&cfg);
  if ((rc = wl_alloc_create(&w->a, &prov, &cfg))) {
    fprintf(stderr, PROG ": wl_alloc_create failed (%d)\n", rc);
    prov.destroy(prov.ctx);
    return -1;
  }
  w->ptr = calloc(t->nslots ? t->nslots : 1, sizeof *w->ptr);
  rc = w->ptr ? 0 : -1;
  for (unsigned s = 0; s < t->nstreams && !rc; s++)
    if (!(w->st[s] = wl_host_stream_create(&prov))) rc = -1;
  if (rc) fprintf(stderr, PROG ": out of memory setting up a replay\n");
  return rc;
}

/* The counters, the invariant check (after a replay that went through), and the teardown. */
static int wl_close(wlrep_t *w, replay_t *out, int rc) {
  if (!w->a) return -1;
  wl_alloc_stats_get(w->a, &out->st);
  if (!rc && wl_alloc_check(w->a)) {
    fprintf(stderr, PROG ": liballoc's invariant check failed after the replay\n");
    rc = -1;
  }
  /* Destroying the allocator destroys the provider, and with it the host streams. */
  wl_alloc_destroy(w->a);
  free(w->ptr);
  return rc;
}

/* Runs ops [c->i, end) of a liballoc replay. */
static int step_wl(const wl__bench_trace_t *t, wlrep_t *w, int timed, int trim, uint32_t *samples,
                   replay_t *out, cursor_t *c, size_t end) {
  if (timed)
    return trim ? run_wl(t, w->a, w->st, w->ptr, samples, out, c, end, 1, 1)
                : run_wl(t, w->a, w->st, w->ptr, samples, out, c, end, 1, 0);
  return trim ? run_wl(t, w->a, w->st, w->ptr, samples, out, c, end, 0, 1)
              : run_wl(t, w->a, w->st, w->ptr, samples, out, c, end, 0, 0);
}

static int replay_wl(const wl__bench_trace_t *t, int timed, int trim, uint32_t *samples,
                     replay_t *out) {
  wlrep_t w;
  cursor_t c = {0};
  int rc = wl_open(t, &w);
  if (!rc) rc = step_wl(t, &w, timed, trim, samples, out, &c, t->nops);
  return wl_close(&w, out, rc);
}

ALWAYS_INLINE int run_malloc(const wl__bench_trace_t *t, void **ptr, uint32_t *samples,
                             replay_t *out, cursor_t *c, size_t end, const int timed) {
  uint64_t w0 = c->w0;
  size_t k = c->k, i = c->i;
  int rc = 0;
  for (; i < end; i++) {
    if (WL_UNLIKELY(i == t->measure_from)) w0 = wl__now_ns();
    if (WL_UNLIKELY(i == t->measure_to)) out->untimed_ns = wl__now_ns() - w0;
    const wl__bench_op_t *op = &t->ops[i];
    switch (op->kind) {
    case WL__OP_ALLOC: {
      uint64_t c0 = timed ? tick_start() : 0;
      void *p = malloc(op->size);
      if (timed) samples[k++] = clamp32(tick_stop() - c0);
      if (WL_UNLIKELY(!p)) {
        fprintf(stderr, PROG ": malloc of %" PRIu64 " bytes failed\n", op->size);
        rc = -1;
        goto out;
      }
      ptr[op->slot] = p;
      break;
    }
    case WL__OP_FREE: {
      uint64_t c0 = timed ? tick_start() : 0;
      free(ptr[op->slot]);
      if (timed) samples[k++] = clamp32(tick_stop() - c0);
      ptr[op->slot] = NULL;
      break;
    }
    default: /* streams mean nothing to malloc */
      break;
    }
  }
  if (end == t->nops && t->measure_to >= t->nops) out->untimed_ns = wl__now_ns() - w0;
out:
  c->i = i;
  c->k = k;
  c->w0 = w0;
  return rc;
}

static int step_malloc(const wl__bench_trace_t *t, void **ptr, int timed, uint32_t *samples,
                       replay_t *out, cursor_t *c, size_t end) {
  return timed ? run_malloc(t, ptr, samples, out, c, end, 1)
               : run_malloc(t, ptr, samples, out, c, end, 0);
}

static void free_slots(const wl__bench_trace_t *t, void **ptr) {
  for (uint32_t s = 0; s < t->nslots; s++) free(ptr[s]); /* after a failure */
  free(ptr);
}

static int replay_malloc(const wl__bench_trace_t *t, int timed, uint32_t *samples, replay_t *out) {
  void **ptr = calloc(t->nslots ? t->nslots : 1, sizeof *ptr);
  if (!ptr) {
    fprintf(stderr, PROG ": out of memory setting up a replay\n");
    return -1;
  }
  cursor_t c = {0};
  int rc = step_malloc(t, ptr, timed, samples, out, &c, t->nops);
  free_slots(t, ptr);
  return rc;
}

/* ---- statistics ------------------------------------------------------------------------------*/

/* Four 8-bit LSD passes: sorting every replay's samples must not cost more than the replay. */
static void radix_sort(uint32_t *v, uint32_t *tmp, size_t n) {
  for (int shift = 0; shift < 32; shift += 8) {
    size_t count[257] = {0};
    for (size_t i = 0; i < n; i++) count[((v[i] >> shift) & 0xff) + 1]++;
    for (int b = 0; b < 256; b++) count[b + 1] += count[b];
    for (size_t i = 0; i < n; i++) tmp[count[(v[i] >> shift) & 0xff]++] = v[i];
    memcpy(v, tmp, n * sizeof *v);
  }
}

static double to_ns(double ticks) {
  double v = (ticks - g_timer.overhead_ticks) * g_timer.ns_per_tick;
  return v > 0 ? v : 0;
}

static double pct(const uint32_t *sorted, size_t n, double p) {
  return n ? to_ns(pct_ticks(sorted, n, p)) : NAN;
}

/* One replay's figures (ns per call; the timer's overhead already subtracted). */
typedef struct figs_s {
  double p50, p90, p99, p999, max, mean;
  double alloc_p50, alloc_p99, free_p50, free_p99;
  double untimed_mean; /* the measured range timed as a whole, divided by its calls */
  double untimed_ns;
  double trim_p50, trim_p99, trim_max; /* trim variant */
  /* Minor page faults taken inside the allocator's calls of a timed replay (the interleaved pair
   * only): glibc's count differs between runs of one binary, and with it its figures. */
  double faults;
} figs_t;

#define NFIGS (sizeof(figs_t) / sizeof(double))

typedef struct work_s {
  uint32_t *all, *allocs, *frees, *tmp;
} work_t;

static void figures(const wl__bench_trace_t *t, const uint8_t *is_alloc, const uint32_t *samples,
                    work_t *w, figs_t *f) {
  size_t n = t->sample_to - t->sample_from, na = 0, nf = 0;
  const uint32_t *s = samples + t->sample_from;
  double sum = 0;
  for (size_t i = 0; i < n; i++) {
    w->all[i] = s[i];
    sum += s[i];
    if (is_alloc[t->sample_from + i])
      w->allocs[na++] = s[i];
    else
      w->frees[nf++] = s[i];
  }
  radix_sort(w->all, w->tmp, n);
  f->p50 = pct(w->all, n, 0.50);
  f->p90 = pct(w->all, n, 0.90);
  f->p99 = pct(w->all, n, 0.99);
  f->p999 = pct(w->all, n, 0.999);
  f->max = n ? to_ns(w->all[n - 1]) : NAN;
  f->mean = n ? to_ns(sum / (double)n) : NAN;
  radix_sort(w->allocs, w->tmp, na);
  f->alloc_p50 = pct(w->allocs, na, 0.50);
  f->alloc_p99 = pct(w->allocs, na, 0.99);
  radix_sort(w->frees, w->tmp, nf);
  f->free_p50 = pct(w->frees, nf, 0.50);
  f->free_p99 = pct(w->frees, nf, 0.99);
}

static int cmp_double(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return x < y ? -1 : x > y;
}

static double median(double *v, size_t n) {
  if (!n) return NAN;
  qsort(v, n, sizeof *v, cmp_double);
  return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

/* ---- one trace, all variants, all rounds ----------------------------------------------------*/

enum { V_WL = 0, V_MALLOC, V_TRIM, NVARIANTS };
static const char *const variant_name[NVARIANTS] = {"liballoc", "malloc", "liballoc_trim"};
static const char *const variant_label[NVARIANTS] = {"liballoc", "glibc malloc", "liballoc + trim"};

typedef struct vres_s {
  int ran;
  figs_t round[MAX_ROUNDS];
  figs_t med;
  double best_p50;
  wl_alloc_stats_t st; /* the last timed replay's counters */
  double trim_bytes_per_iter, phys_end, live_end;
  uint64_t trim_calls;
} vres_t;

typedef struct tres_s {
  wl__bench_trace_t t;
  vres_t v[NVARIANTS];
  size_t nsamples, measured_iters;
  /* liballoc p50 / glibc p50 of each measured iteration of the interleaved replays, all rounds */
  double *ratios;
  size_t nratios;
  double ratio_med, ratio_p10, ratio_p90, ratio_min, ratio_max;
} tres_t;

/* Variant v's figures from a timed replay whose samples are in `samples`. */
static void take_timed(tres_t *r, int v, uint32_t round, const uint8_t *is_alloc,
                       const uint32_t *samples, const replay_t *timed, work_t *w) {
  const wl__bench_trace_t *t = &r->t;
  vres_t *vr = &r->v[v];
  figs_t *f = &vr->round[round];
  figures(t, is_alloc, samples, w, f);
  if (v == V_TRIM) {
    radix_sort(timed->trim_ticks, w->tmp, timed->ntrim);
    f->trim_p50 = pct(timed->trim_ticks, timed->ntrim, 0.5);
    f->trim_p99 = pct(timed->trim_ticks, timed->ntrim, 0.99);
    f->trim_max = timed->ntrim ? to_ns(timed->trim_ticks[timed->ntrim - 1]) : NAN;
    vr->trim_calls = timed->ntrim;
    vr->trim_bytes_per_iter = timed->ntrim ? (double)timed->trim_bytes / timed->ntrim : 0;
  }
  if (v != V_MALLOC) {
    vr->st = timed->st;
    vr->phys_end = timed->nend ? timed->phys_end_sum / timed->nend : 0;
    vr->live_end = timed->nend ? timed->live_end_sum / timed->nend : 0;
  }
  vr->ran = 1;
}

/* Variant v replayed once without per-call timers: the "mean untimed" cross-check. */
static int run_untimed(tres_t *r, int v, uint32_t round, uint32_t *samples, uint32_t *trim_ticks) {
  const wl__bench_trace_t *t = &r->t;
  figs_t *f = &r->v[v].round[round];
  replay_t untimed = {0};
  untimed.trim_ticks = trim_ticks;
  int rc = v == V_MALLOC ? replay_malloc(t, 0, samples, &untimed)
                         : replay_wl(t, 0, v == V_TRIM, samples, &untimed);
  if (!rc) {
    f->untimed_ns = (double)untimed.untimed_ns;
    f->untimed_mean = r->nsamples ? (double)untimed.untimed_ns / (double)r->nsamples : NAN;
  }
  return rc;
}

/* The trim variant: a timed replay of its own, then an untimed one. */
static int run_trim(tres_t *r, uint32_t round, const uint8_t *is_alloc, uint32_t *samples,
                    work_t *w) {
  const wl__bench_trace_t *t = &r->t;
  replay_t timed = {0};
  uint32_t *trim_ticks = calloc(t->iterations + 1, sizeof *trim_ticks);
  if (!trim_ticks) return -1;
  timed.trim_ticks = trim_ticks;
  int rc = replay_wl(t, 1, 1, samples, &timed);
  if (!rc) take_timed(r, V_TRIM, round, is_alloc, samples, &timed, w);
  r->v[V_TRIM].round[round].faults = NAN;
  if (!rc) rc = run_untimed(r, V_TRIM, round, samples, trim_ticks);
  free(trim_ticks);
  return rc;
}

/* The calling thread's minor page faults so far. */
static long minor_faults(void) {
  struct rusage u;
  return getrusage(RUSAGE_THREAD, &u) ? 0 : u.ru_minflt;
}

/* liballoc and glibc in one interleaved replay of the trace: an iteration of one, then the same
 * iteration of the other, which one goes first alternating every iteration (and every round), so
 * that both see the machine as it is during the same few hundred microseconds. bounds gets the
 * sample index at each iteration's end. */
static int run_pair(tres_t *r, uint32_t round, const uint8_t *is_alloc, uint32_t *s_wl,
                    uint32_t *s_m, size_t *bounds, work_t *w) {
  const wl__bench_trace_t *t = &r->t;
  replay_t ow = {0}, om = {0};
  wlrep_t wr = {0};
  cursor_t cw = {0}, cm = {0};
  void **ptr = calloc(t->nslots ? t->nslots : 1, sizeof *ptr);
  int rc = ptr ? wl_open(t, &wr) : -1;
  size_t seg = 0;
  double faults[2] = {0, 0};
  for (size_t i = 0; !rc && i < t->nops; seg++) {
    size_t end = i;
    while (end < t->nops && t->ops[end].kind != WL__OP_ITER) end++;
    if (end < t->nops) end++; /* the iteration's end belongs to it (the trim variant's point) */
    int wl_first = (seg + round) % 2 == 0;
    for (int k = 0; k < 2 && !rc; k++) {
      int is_wl = (k == 0) == wl_first;
      long f0 = minor_faults();
      rc = is_wl ? step_wl(t, &wr, 1, 0, s_wl, &ow, &cw, end)
                 : step_malloc(t, ptr, 1, s_m, &om, &cm, end);
      faults[is_wl ? 0 : 1] += (double)(minor_faults() - f0);
    }
    if (!rc && cw.k != cm.k) {
      fprintf(stderr, PROG ": the interleaved replays disagree on the calls made\n");
      rc = -1;
    }
    /* Only iterations wholly inside the measured range give a ratio. */
    if (!rc && i >= t->measure_from && end <= t->measure_to && seg > 0 && cw.k > bounds[seg - 1]) {
      size_t k0 = bounds[seg - 1], n = cw.k - k0;
      double p[2];
      for (int v = 0; v < 2; v++) {
        memcpy(w->all, (v ? s_m : s_wl) + k0, n * sizeof *w->all);
        radix_sort(w->all, w->tmp, n);
        p[v] = pct(w->all, n, 0.5);
      }
      if (p[1] > 0) r->ratios[r->nratios++] = p[0] / p[1];
    }
    if (seg <= t->iterations) bounds[seg] = cw.k;
    i = end;
  }
  rc = ptr ? wl_close(&wr, &ow, rc) : -1;
  if (ptr) free_slots(t, ptr);
  if (!rc) {
    take_timed(r, V_WL, round, is_alloc, s_wl, &ow, w);
    take_timed(r, V_MALLOC, round, is_alloc, s_m, &om, w);
    r->v[V_WL].round[round].faults = faults[0];
    r->v[V_MALLOC].round[round].faults = faults[1];
  }
  return rc;
}

/* The q-quantile of sorted v, interpolated between neighbours. */
static double quantile(const double *v, size_t n, double q) {
  if (!n) return NAN;
  double x = q * (double)(n - 1);
  size_t j = (size_t)x;
  return j + 1 < n ? v[j] + (x - (double)j) * (v[j + 1] - v[j]) : v[n - 1];
}

static int run_trace(tres_t *r, const opts_t *o) {
  const wl__bench_trace_t *t = &r->t;
  r->nsamples = t->sample_to - t->sample_from;
  r->measured_iters = t->iterations > 1 ? t->iterations - 1 : 1;
  uint32_t *samples = malloc((t->nsamples_total + 1) * sizeof *samples);
  uint32_t *samples_m = malloc((t->nsamples_total + 1) * sizeof *samples_m);
  size_t *bounds = malloc((t->iterations + 2) * sizeof *bounds);
  r->ratios = malloc(((size_t)o->rounds * (t->iterations + 1) + 1) * sizeof *r->ratios);
  r->nratios = 0;
  uint8_t *is_alloc = malloc(t->nsamples_total + 1);
  size_t wn = t->nsamples_total + t->iterations + 2;
  work_t w = {malloc(wn * sizeof *w.all), malloc(wn * sizeof *w.allocs),
              malloc(wn * sizeof *w.frees), malloc(wn * sizeof *w.tmp)};
  int rc = samples && samples_m && bounds && r->ratios && is_alloc && w.all && w.allocs &&
                   w.frees && w.tmp
               ? 0
               : -1;
  if (rc) fprintf(stderr, PROG ": out of memory for %zu samples\n", t->nsamples_total);
  for (size_t i = 0, k = 0; !rc && i < t->nops; i++)
    if (t->ops[i].kind == WL__OP_ALLOC || t->ops[i].kind == WL__OP_FREE)
      is_alloc[k++] = t->ops[i].kind == WL__OP_ALLOC;
  int with_trim = !strcmp(t->name, "dnn");
  /* Each round: both allocators untimed (which also warms both up the same way before the first
   * timed replay), in alternating order; then the interleaved timed pair; then the trim variant. */
  for (uint32_t round = 0; round < o->rounds && !rc; round++) {
    int first = round % 2 ? V_MALLOC : V_WL;
    rc = run_untimed(r, first, round, samples, NULL);
    if (!rc) rc = run_untimed(r, first == V_WL ? V_MALLOC : V_WL, round, samples, NULL);
    if (!rc) rc = run_pair(r, round, is_alloc, samples, samples_m, bounds, &w);
    if (!rc && with_trim) rc = run_trim(r, round, is_alloc, samples, &w);
  }
  /* The ratio: the median over every measured iteration of every round, and its spread. */
  if (!rc && r->nratios) {
    qsort(r->ratios, r->nratios, sizeof *r->ratios, cmp_double);
    r->ratio_med = quantile(r->ratios, r->nratios, 0.5);
    r->ratio_p10 = quantile(r->ratios, r->nratios, 0.1);
    r->ratio_p90 = quantile(r->ratios, r->nratios, 0.9);
    r->ratio_min = r->ratios[0];
    r->ratio_max = r->ratios[r->nratios - 1];
  } else if (!rc) {
    r->ratio_med = r->ratio_p10 = r->ratio_p90 = r->ratio_min = r->ratio_max = NAN;
  }
  /* The medians over rounds, figure by figure. */
  for (int v = 0; v < NVARIANTS && !rc; v++) {
    vres_t *vr = &r->v[v];
    if (!vr->ran) continue;
    double vals[MAX_ROUNDS];
    for (size_t k = 0; k < NFIGS; k++) {
      for (uint32_t round = 0; round < o->rounds; round++)
        vals[round] = ((const double *)&vr->round[round])[k];
      ((double *)&vr->med)[k] = median(vals, o->rounds);
    }
    vr->best_p50 = vr->round[0].p50;
    for (uint32_t round = 1; round < o->rounds; round++)
      if (vr->round[round].p50 < vr->best_p50) vr->best_p50 = vr->round[round].p50;
  }
  free(samples);
  free(samples_m);
  free(bounds);
  free(r->ratios);
  r->ratios = NULL;
  free(is_alloc);
  free(w.all);
  free(w.allocs);
  free(w.frees);
  free(w.tmp);
  return rc;
}

/* ---- derived figures -------------------------------------------------------------------------*/

static double ratio_vs_malloc(const tres_t *r) {
  return r->ratio_med;
}

static double reserved_over_live(const vres_t *v) {
  return v->st.live_peak ? (double)v->st.physical_peak / (double)v->st.live_peak : NAN;
}

/* ---- the table -------------------------------------------------------------------------------*/

static const char *fmt_b(double bytes, char *buf, size_t len) {
  return wl__fmt_bytes(bytes > 0 ? (size_t)bytes : 0, buf, len);
}

static void print_table(FILE *f, const opts_t *o, tres_t *const *res, int nres) {
  fprintf(f, PROG ": liballoc (host provider) against glibc malloc, the same calls in the same "
                  "run\n");
  fprintf(f,
          "  seed %" PRIu64 ", %u iteration%s (the first is warm-up), %u round%s; liballoc and "
          "glibc replayed interleaved an iteration at a time; figures are medians over rounds; "
          "%s\n",
          o->seed, o->iterations, o->iterations == 1 ? "" : "s", o->rounds,
          o->rounds == 1 ? "" : "s", g_cpu >= 0 ? "pinned to one CPU" : "not pinned");
  fprintf(f,
          "  timer %s, step %.1f ns (percentiles interpolated within a step); its overhead, "
          "%.1f ns (median of %zu empty timed regions), is subtracted from every figure\n\n",
          g_timer.source, g_timer.quantum_ticks * g_timer.ns_per_tick, g_timer.overhead_ns,
          g_timer.overhead_samples);
  fprintf(f, "%-7s %-16s %9s %8s %8s %8s %9s %9s %8s %10s\n", "trace", "allocator", "calls",
          "p50 ns", "p99 ns", "p99.9 ns", "alloc p50", "free p50", "mean ns", "phys/live");
  for (int i = 0; i < nres; i++) {
    const tres_t *r = res[i];
    for (int v = 0; v < NVARIANTS; v++) {
      const vres_t *vr = &r->v[v];
      if (!vr->ran) continue;
      char rr[16];
      if (v == V_MALLOC)
        snprintf(rr, sizeof rr, "n/a");
      else
        snprintf(rr, sizeof rr, "%.3f", reserved_over_live(vr));
      fprintf(f, "%-7s %-16s %9zu %8.1f %8.1f %8.1f %9.1f %9.1f %8.1f %10s\n", r->t.name,
              variant_label[v], r->nsamples, vr->med.p50, vr->med.p99, vr->med.p999,
              vr->med.alloc_p50, vr->med.free_p50, vr->med.untimed_mean, rr);
    }
  }
  fprintf(f, "  mean ns: the measured range timed as a whole without per-call timers, divided by "
             "its calls\n");
  fprintf(f, "  phys/live: liballoc's peak physical memory over its peak live bytes; glibc does "
             "not report a comparable figure\n\n");
  for (int i = 0; i < nres; i++) {
    const tres_t *r = res[i];
    double ratio = ratio_vs_malloc(r), rr = reserved_over_live(&r->v[V_WL]);
    char b1[32], b2[32], b3[32], b4[32];
    if (!strcmp(r->t.name, "dnn"))
      fprintf(f, "dnn: %s, %u %s at batch %u, %u streams, ", r->t.model, r->t.layers,
              strcmp(r->t.model, "cnn") ? "blocks" : "layers", r->t.batch, r->t.nstreams);
    else
      fprintf(f, "%s: sizes %s - %s, %u streams, ", r->t.name,
              fmt_b((double)r->t.min_size, b2, sizeof b2),
              fmt_b((double)r->t.max_size, b3, sizeof b3), r->t.nstreams);
    fprintf(f, "live peak %s, liballoc physical peak %s\n",
            fmt_b((double)r->t.live_peak, b1, sizeof b1),
            fmt_b((double)r->v[V_WL].st.physical_peak, b4, sizeof b4));
    fprintf(f,
            "  ratio_vs_malloc: median of liballoc p50 / glibc p50 over %zu interleaved "
            "iterations: %.3f (p10 %.3f, p90 %.3f, min %.3f, max %.3f)\n",
            r->nratios, ratio, r->ratio_p10, r->ratio_p90, r->ratio_min, r->ratio_max);
    if (!strcmp(r->t.name, "dnn")) {
      fprintf(f,
              "  ratio_vs_malloc %.3f (target <= %.2f: %s); reserved_over_live_peak %.3f "
              "(target <= %.2f: %s)\n",
              ratio, TARGET_RATIO, ratio <= TARGET_RATIO ? "met" : "MISSED", rr, TARGET_RESERVED,
              rr <= TARGET_RESERVED ? "met" : "MISSED");
    } else {
      fprintf(f,
              "  ratio_vs_malloc %.3f; reserved_over_live_peak %.3f (no targets on this "
              "trace)\n",
              ratio, rr);
    }
    const vres_t *tv = &r->v[V_TRIM];
    if (tv->ran) {
      const vres_t *pv = &r->v[V_WL];
      double cost = (tv->med.untimed_ns - pv->med.untimed_ns) / (double)r->measured_iters;
      fprintf(f,
              "  trim: wl_alloc_trim at each iteration's end returned %s per iteration "
              "(physical between iterations %s, against %s without trim);\n"
              "        one call p50 %.1f us, p99 %.1f us; with the re-mapping it causes an "
              "iteration costs %+.1f us (%.0f extra maps per iteration)\n",
              fmt_b(tv->trim_bytes_per_iter, b1, sizeof b1), fmt_b(tv->phys_end, b2, sizeof b2),
              fmt_b(pv->phys_end, b3, sizeof b3), tv->med.trim_p50 / 1e3, tv->med.trim_p99 / 1e3,
              cost / 1e3,
              (double)(tv->st.maps - pv->st.maps) /
                  (double)(r->t.iterations ? r->t.iterations : 1));
    }
  }
}

/* ---- JSON ------------------------------------------------------------------------------------*/

typedef struct jw_s {
  FILE *f;
  int depth;
  int first[16];
} jw_t;

static void jw_key(jw_t *w, const char *key) {
  if (w->depth > 0) {
    fputs(w->first[w->depth] ? "\n" : ",\n", w->f);
    w->first[w->depth] = 0;
    fprintf(w->f, "%*s", 2 * w->depth, "");
  }
  if (key) fprintf(w->f, "\"%s\": ", key);
}

static void jw_open(jw_t *w, const char *key, char c) {
  jw_key(w, key);
  fputc(c, w->f);
  w->first[++w->depth] = 1;
}

static void jw_close(jw_t *w, char c) {
  int empty = w->first[w->depth];
  w->depth--;
  if (!empty) fprintf(w->f, "\n%*s", 2 * w->depth, "");
  fputc(c, w->f);
}

static void jw_num(jw_t *w, const char *key, double v, int decimals) {
  jw_key(w, key);
  if (isfinite(v))
    fprintf(w->f, "%.*f", decimals, v);
  else
    fputs("null", w->f);
}

static void jw_u64(jw_t *w, const char *key, uint64_t v) {
  jw_key(w, key);
  fprintf(w->f, "%" PRIu64, v);
}

static void jw_str(jw_t *w, const char *key, const char *s) {
  jw_key(w, key);
  fputc('"', w->f);
  for (; *s; s++) {
    if (*s == '"' || *s == '\\') fputc('\\', w->f);
    fputc(*s, w->f);
  }
  fputc('"', w->f);
}

static void jw_bool(jw_t *w, const char *key, int b) {
  jw_key(w, key);
  fputs(b ? "true" : "false", w->f);
}

static void jw_null(jw_t *w, const char *key) {
  jw_key(w, key);
  fputs("null", w->f);
}

static void jw_target(jw_t *w, const char *key, double value, double max) {
  jw_open(w, key, '{');
  jw_num(w, "max", max, 2);
  jw_num(w, "value", value, 3);
  if (isfinite(value))
    jw_bool(w, "met", value <= max);
  else
    jw_null(w, "met");
  jw_close(w, '}');
}

/* How ratio_vs_malloc was taken and how much it moved between iterations. */
static void jw_ratio_spread(jw_t *w, const tres_t *r) {
  jw_num(w, "ratio_vs_malloc_p10", r->ratio_p10, 3);
  jw_num(w, "ratio_vs_malloc_p90", r->ratio_p90, 3);
  jw_num(w, "ratio_vs_malloc_min", r->ratio_min, 3);
  jw_num(w, "ratio_vs_malloc_max", r->ratio_max, 3);
  jw_u64(w, "ratio_vs_malloc_iterations", r->nratios);
  jw_num(w, "ratio_vs_malloc_of_medians", r->v[V_WL].med.p50 / r->v[V_MALLOC].med.p50, 3);
}

static void jw_figs(jw_t *w, const vres_t *vr, uint32_t rounds) {
  const figs_t *m = &vr->med;
  jw_num(w, "ns_per_op_p50", m->p50, 1);
  jw_num(w, "ns_per_op_p90", m->p90, 1);
  jw_num(w, "ns_per_op_p99", m->p99, 1);
  jw_num(w, "ns_per_op_p999", m->p999, 1);
  jw_num(w, "ns_per_op_max", m->max, 1);
  jw_num(w, "ns_per_op_mean", m->mean, 1);
  jw_num(w, "ns_per_op_mean_untimed", m->untimed_mean, 1);
  jw_num(w, "alloc_ns_p50", m->alloc_p50, 1);
  jw_num(w, "alloc_ns_p99", m->alloc_p99, 1);
  jw_num(w, "free_ns_p50", m->free_p50, 1);
  jw_num(w, "free_ns_p99", m->free_p99, 1);
  jw_num(w, "ns_per_op_p50_best", vr->best_p50, 1);
  jw_num(w, "page_faults_per_replay", m->faults, 0);
  jw_open(w, "ns_per_op_p50_rounds", '[');
  for (uint32_t k = 0; k < rounds; k++) jw_num(w, NULL, vr->round[k].p50, 1);
  jw_close(w, ']');
}

static void jw_wl_stats(jw_t *w, const vres_t *vr) {
  const wl_alloc_stats_t *s = &vr->st;
  jw_num(w, "reserved_over_live_peak", reserved_over_live(vr), 4);
  jw_u64(w, "live_peak_bytes", s->live_peak);
  jw_u64(w, "physical_peak_bytes", s->physical_peak);
  jw_u64(w, "mapped_peak_bytes", s->mapped_peak);
  jw_u64(w, "reserved_bytes", s->reserved_bytes);
  jw_num(w, "physical_at_iteration_end_bytes", vr->phys_end, 0);
  jw_num(w, "live_at_iteration_end_bytes", vr->live_end, 0);
  jw_u64(w, "allocs", s->allocs);
  jw_u64(w, "small_allocs", s->small_allocs);
  jw_u64(w, "maps", s->maps);
  jw_u64(w, "unmaps", s->unmaps);
  jw_u64(w, "phys_creates", s->phys_creates);
  jw_u64(w, "phys_releases", s->phys_releases);
  jw_u64(w, "events_recorded", s->events_recorded);
  jw_u64(w, "trims", s->trims);
}

static void jw_trace(jw_t *w, const tres_t *r, uint32_t rounds) {
  const wl__bench_trace_t *t = &r->t;
  int dnn = !strcmp(t->name, "dnn");
  double ratio = ratio_vs_malloc(r), rr = reserved_over_live(&r->v[V_WL]);
  jw_open(w, t->name, '{');
  int cnn = dnn && !strcmp(t->model, "cnn");
  jw_str(w, "description",
         cnn   ? "training iterations of a ResNet-like CNN: forward allocates activations and "
                 "workspaces, backward frees them in reverse while allocating gradients; weight "
                 "gradients live until the optimizer step; DDP buckets on a second stream, a "
                 "prefetch stream every fourth iteration"
         : dnn ? "training iterations of a GPT-like decoder (bf16 autocast, flash attention, "
                 "tied-embedding logits with an fp32 cross-entropy): forward keeps each block's "
                 "activations and weight casts, backward frees them in reverse while allocating "
                 "gradients; weight gradients live until the optimizer step; DDP buckets on a "
                 "second stream"
               : "steps of 1000 calls: 60% allocations of 256 B - 64 MiB (log-uniform), frees of "
                 "random live blocks, 10% of them on another stream, live bytes capped");
  if (dnn) {
    jw_str(w, "model", t->model);
    jw_u64(w, "layers", t->layers);
    jw_u64(w, "batch", t->batch);
    jw_u64(w, "param_bytes", t->param_bytes);
    jw_u64(w, "activation_bytes", t->activation_bytes);
  } else {
    jw_u64(w, "live_cap_bytes", RANDOM_LIVE_CAP);
  }
  jw_u64(w, "streams", t->nstreams);
  jw_u64(w, "iterations", t->iterations);
  jw_u64(w, "measured_iterations", r->measured_iters);
  jw_u64(w, "ops_measured", r->nsamples);
  jw_u64(w, "ops_total", t->nsamples_total);
  jw_u64(w, "allocs", t->allocs);
  jw_u64(w, "frees", t->frees);
  jw_u64(w, "cross_stream_frees", t->cross_stream_frees);
  jw_u64(w, "min_size_bytes", t->min_size);
  jw_u64(w, "max_size_bytes", t->max_size);
  jw_u64(w, "live_peak_bytes", t->live_peak);
  jw_num(w, "ns_per_op_p50", r->v[V_WL].med.p50, 1);
  jw_num(w, "ns_per_op_p99", r->v[V_WL].med.p99, 1);
  jw_num(w, "ratio_vs_malloc", ratio, 3);
  jw_ratio_spread(w, r);
  jw_num(w, "ratio_vs_malloc_p99", r->v[V_WL].med.p99 / r->v[V_MALLOC].med.p99, 3);
  jw_num(w, "ratio_vs_malloc_mean_untimed",
         r->v[V_WL].med.untimed_mean / r->v[V_MALLOC].med.untimed_mean, 3);
  jw_num(w, "reserved_over_live_peak", rr, 4);
  if (dnn) {
    jw_open(w, "targets", '{');
    jw_target(w, "ratio_vs_malloc", ratio, TARGET_RATIO);
    jw_target(w, "reserved_over_live_peak", rr, TARGET_RESERVED);
    jw_close(w, '}');
    jw_bool(w, "targets_met", ratio <= TARGET_RATIO && rr <= TARGET_RESERVED);
  } else {
    jw_null(w, "targets");
  }
  jw_open(w, variant_name[V_WL], '{');
  jw_figs(w, &r->v[V_WL], rounds);
  jw_wl_stats(w, &r->v[V_WL]);
  jw_close(w, '}');
  jw_open(w, variant_name[V_MALLOC], '{');
  jw_figs(w, &r->v[V_MALLOC], rounds);
  jw_null(w, "reserved_over_live_peak");
  jw_str(w, "reserved_over_live_peak_note",
         "n/a: not measurable for glibc (it has no physical_peak counter, and the pages it never "
         "touches cost nothing)");
  jw_close(w, '}');
  const vres_t *tv = &r->v[V_TRIM], *pv = &r->v[V_WL];
  if (tv->ran) {
    jw_open(w, variant_name[V_TRIM], '{');
    jw_str(w, "what",
           "wl_alloc_trim(a, SIZE_MAX) at each iteration's end, after the GPU "
           "caught up; physical memory is re-mapped by the next iteration");
    jw_figs(w, tv, rounds);
    jw_wl_stats(w, tv);
    jw_u64(w, "trim_calls", tv->trim_calls);
    jw_num(w, "trim_ns_p50", tv->med.trim_p50, 1);
    jw_num(w, "trim_ns_p99", tv->med.trim_p99, 1);
    jw_num(w, "trim_ns_max", tv->med.trim_max, 1);
    jw_num(w, "returned_bytes_per_iteration", tv->trim_bytes_per_iter, 0);
    jw_num(w, "extra_maps_per_iteration",
           (double)(tv->st.maps - pv->st.maps) / (double)(t->iterations ? t->iterations : 1), 1);
    jw_num(w, "cost_per_iteration_ns",
           (tv->med.untimed_ns - pv->med.untimed_ns) / (double)r->measured_iters, 0);
    jw_num(w, "ns_per_op_p50_vs_plain", tv->med.p50 / pv->med.p50, 3);
    jw_num(w, "ns_per_op_mean_untimed_vs_plain", tv->med.untimed_mean / pv->med.untimed_mean, 3);
    jw_str(w, "note",
           "the host provider maps with mmap (about a microsecond); CUDA VMM's "
           "cuMemCreate+cuMemMap+cuMemSetAccess cost about 230 us per 2 MiB handle, "
           "so the cost on a GPU is larger");
    jw_close(w, '}');
  }
  jw_close(w, '}');
}

static void print_json(FILE *f, const opts_t *o, tres_t *const *res, int nres) {
  jw_t w = {f, 0, {1}};
  const tres_t *primary = res[0];
  for (int i = 0; i < nres; i++)
    if (!strcmp(res[i]->t.name, "dnn")) primary = res[i];
  int dnn = !strcmp(primary->t.name, "dnn");
  double ratio = ratio_vs_malloc(primary), rr = reserved_over_live(&primary->v[V_WL]);
  jw_open(&w, NULL, '{');
  jw_str(&w, "benchmark", PROG);
  jw_str(&w, "primary_trace", primary->t.name);
  jw_num(&w, "ns_per_op_p50", primary->v[V_WL].med.p50, 1);
  jw_num(&w, "ns_per_op_p99", primary->v[V_WL].med.p99, 1);
  jw_num(&w, "ratio_vs_malloc", ratio, 3);
  jw_ratio_spread(&w, primary);
  jw_num(&w, "reserved_over_live_peak", rr, 4);
  jw_num(&w, "malloc_ns_per_op_p50", primary->v[V_MALLOC].med.p50, 1);
  jw_num(&w, "malloc_ns_per_op_p99", primary->v[V_MALLOC].med.p99, 1);
  if (dnn) {
    jw_open(&w, "targets", '{');
    jw_target(&w, "ratio_vs_malloc", ratio, TARGET_RATIO);
    jw_target(&w, "reserved_over_live_peak", rr, TARGET_RESERVED);
    jw_close(&w, '}');
    jw_bool(&w, "targets_met", ratio <= TARGET_RATIO && rr <= TARGET_RESERVED);
  } else {
    jw_null(&w, "targets");
    jw_null(&w, "targets_met");
  }
  jw_open(&w, "config", '{');
  jw_u64(&w, "seed", o->seed);
  jw_u64(&w, "iterations", o->iterations);
  jw_u64(&w, "warmup_iterations", o->iterations > 1 ? 1 : 0);
  jw_u64(&w, "rounds", o->rounds);
  jw_bool(&w, "quick", o->quick);
  jw_str(&w, "provider", "host");
  jw_u64(&w, "host_capacity_bytes", HOST_CAPACITY);
  jw_str(&w, "allocator_config", "wl_alloc_config_default");
  if (g_cpu >= 0)
    jw_u64(&w, "pinned_cpu", (uint64_t)g_cpu);
  else
    jw_null(&w, "pinned_cpu");
  jw_str(&w, "statistic",
         "latencies: median over rounds of each round's figure; ratio_vs_malloc: median over "
         "every measured iteration of every round of liballoc's p50 over glibc's p50 in that "
         "iteration, the two replayed interleaved (an iteration of one, then the same iteration "
         "of the other, the order alternating every iteration)");
  jw_close(&w, '}');
  jw_open(&w, "timer", '{');
  jw_str(&w, "source", g_timer.source);
  jw_num(&w, "ns_per_tick", g_timer.ns_per_tick, 6);
  jw_num(&w, "step_ns", g_timer.quantum_ticks * g_timer.ns_per_tick, 2);
  jw_num(&w, "overhead_ns", g_timer.overhead_ns, 2);
  jw_num(&w, "overhead_min_ns", g_timer.overhead_min_ns, 2);
  jw_bool(&w, "overhead_subtracted", 1);
  jw_str(&w, "method",
         g_tsc ? "each call is timed alone between lfence;rdtsc and rdtscp;lfence (TSC "
                 "calibrated against CLOCK_MONOTONIC); the median of 200000 empty timed regions "
                 "is subtracted from every figure (clamped at 0); where the counter advances in "
                 "steps (step_ns), percentiles are interpolated within a step"
               : "each call is timed alone between two clock_gettime(CLOCK_MONOTONIC) reads; "
                 "the median of 200000 empty timed regions is subtracted from every figure "
                 "(clamped at 0); where the clock advances in steps (step_ns), percentiles are "
                 "interpolated within a step");
  jw_close(&w, '}');
  jw_open(&w, "traces", '{');
  for (int i = 0; i < nres; i++) jw_trace(&w, res[i], o->rounds);
  jw_close(&w, '}');
  jw_close(&w, '}');
  fputc('\n', f);
}

/* ---- main ------------------------------------------------------------------------------------*/

int main(int argc, char **argv) {
  opts_t o;
  int rc = parse_args(argc, argv, &o);
  if (rc) return rc == 1 ? 0 : rc;
  pin_cpu();
  timer_init(o.quick);

  static tres_t dnn, rnd;
  tres_t *res[2];
  int nres = 0;
  if (o.dnn) {
    if (o.transformer ? wl__bench_trace_transformer(&dnn.t, o.seed, o.iterations)
                      : wl__bench_trace_dnn(&dnn.t, o.seed, o.iterations)) {
      fprintf(stderr, PROG ": out of memory generating the DNN trace\n");
      return 1;
    }
    res[nres++] = &dnn;
  }
  if (o.random) {
    if (wl__bench_trace_random(&rnd.t, o.seed, o.iterations, RANDOM_LIVE_CAP)) {
      fprintf(stderr, PROG ": out of memory generating the random trace\n");
      return 1;
    }
    res[nres++] = &rnd;
  }
  for (int i = 0; i < nres; i++)
    if (run_trace(res[i], &o)) return 1;

  /* A cross-check that the replay is the trace: liballoc counts the live peak the trace has. */
  for (int i = 0; i < nres; i++)
    if (res[i]->v[V_WL].st.live_peak != res[i]->t.live_peak)
      fprintf(stderr,
              PROG ": warning: %s trace: liballoc's live peak %zu differs from the "
                   "trace's %zu\n",
              res[i]->t.name, res[i]->v[V_WL].st.live_peak, res[i]->t.live_peak);

  if (o.json) {
    print_table(stderr, &o, res, nres);
    print_json(stdout, &o, res, nres);
  } else {
    print_table(stdout, &o, res, nres);
  }
  for (int i = 0; i < nres; i++) wl__bench_trace_free(&res[i]->t);
  return fflush(stdout) ? 1 : 0;
}
