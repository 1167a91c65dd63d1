/* libwltrace's analysis on synthetic event streams: markers, phase events, iterations found in
 * the wave at several periods and jitters, no false iterations in a wave that does not repeat,
 * bounded bins, the physical-memory model, the combined wave and the capacity advice. */
#include "wltest.h"
#include "wavelet/trace.h"

#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#define MiB ((uint64_t)1 << 20)

typedef struct stream_s {
  wl_trace_event_t *ev;
  size_t n, cap;
} stream_t;

static void put(stream_t *s, uint64_t t, uint16_t kind, uint16_t aux, uint64_t size, uint64_t arg) {
  if (s->n == s->cap) {
    s->cap = s->cap ? 2 * s->cap : 1024;
    s->ev = realloc(s->ev, s->cap * sizeof *s->ev);
  }
  wl_trace_event_t *e = &s->ev[s->n++];
  memset(e, 0, sizeof *e);
  e->time_ns = t;
  e->kind = kind;
  e->aux = aux;
  e->size = size;
  e->arg = arg;
}

typedef struct wave_s {
  double period_ms, fwd_frac, bwd_frac; /* forward and backward as fractions of the period */
  unsigned iters, steps;                /* allocations per forward pass */
  uint64_t base, step;                  /* bytes held throughout, bytes per allocation */
  double jitter_ms;                     /* iteration start jitter (deterministic) */
  int markers, phases;
  uint64_t t0;
} wave_t;

static double jit(unsigned k, double j) {
  uint32_t x = k * 2654435761u + 99991u;
  x ^= x >> 15;
  x *= 0x2c1b3c6du;
  x ^= x >> 12;
  return ((double)(x % 2001u) / 1000.0 - 1.0) * j;
}

static uint64_t ms(double v) {
  return (uint64_t)llround(v * 1e6);
}

/* Builds a wave; starts[k] receives iteration k's start (ns). */
static void make_wave(const wave_t *w, stream_t *s, uint64_t *starts) {
  uint64_t t0 = w->t0 ? w->t0 : 1000000000ull;
  put(s, t0, WL_TRACE_ALLOC, 0, w->base, 0);
  for (unsigned k = 0; k < w->iters; k++) {
    double st = 5 + 2 * w->jitter_ms + k * w->period_ms + jit(k, w->jitter_ms);
    uint64_t b = t0 + ms(st);
    if (starts) starts[k] = b;
    double F = w->period_ms * w->fwd_frac, B = w->period_ms * w->bwd_frac;
    if (w->markers) put(s, b, WL_TRACE_MARKER, WL_TRACE_MARK_ITER_BEGIN, 0, 0);
    if (w->phases) put(s, b, WL_TRACE_PHASE, WL_TRACE_PHASE_ITER_BEGIN, 0, 0);
    for (unsigned i = 0; i < w->steps; i++)
      put(s, b + ms(F * i / w->steps), WL_TRACE_ALLOC, 0, w->step, 0);
    if (w->markers) put(s, b + ms(F), WL_TRACE_MARKER, WL_TRACE_MARK_BACKWARD, 0, 0);
    if (w->phases) put(s, b + ms(F), WL_TRACE_PHASE, WL_TRACE_PHASE_BACKWARD, 0, 0);
    for (unsigned i = 0; i < w->steps; i++)
      put(s, b + ms(F + B * i / w->steps), WL_TRACE_FREE_REQ, 0, w->step, 0);
    if (w->markers) put(s, b + ms(F + B), WL_TRACE_MARKER, WL_TRACE_MARK_ITER_END, 0, 0);
    if (w->phases) put(s, b + ms(F + B), WL_TRACE_PHASE, WL_TRACE_PHASE_IDLE, 0, 0);
  }
}

static size_t t_max_psteps; /* analyse's max_physical_steps (0: the default) */

static wl_trace_analysis_t *analyse(const stream_t *s, size_t bins) {
  wl_trace_analysis_config_t cfg;
  wl_trace_analysis_config_default(&cfg);
  if (bins) cfg.bins = bins;
  if (t_max_psteps) cfg.max_physical_steps = t_max_psteps;
  wl_trace_analysis_t *a = NULL;
  CU_ASSERT_EQUAL(wl_trace_analysis_create(&a, NULL, &cfg), 0);
  if (!a) return NULL;
  /* Fed in uneven batches, as a reader delivers them. */
  for (size_t i = 0; i < s->n;) {
    size_t k = WL_TRACE_KIND_COUNT + i % 97;
    if (k > s->n - i) k = s->n - i;
    wl_trace_analysis_feed(a, s->ev + i, k);
    i += k;
  }
  CU_ASSERT_EQUAL(wl_trace_analysis_finish(a), 0);
  return a;
}

static void period_stats(const uint64_t *starts, unsigned n, double *mean, double *sd) {
  double s = 0, s2 = 0;
  for (unsigned k = 0; k + 1 < n; k++) s += (double)(starts[k + 1] - starts[k]) / 1e6;
  *mean = s / (n - 1);
  for (unsigned k = 0; k + 1 < n; k++) {
    double d = (double)(starts[k + 1] - starts[k]) / 1e6 - *mean;
    s2 += d * d;
  }
  *sd = n > 2 ? sqrt(s2 / (n - 2)) : 0;
}

static void test_markers_give_exact_iterations(void) {
  wave_t w = {80, 0.4, 0.45, 15, 20, 300 * MiB, 10 * MiB, 2.0, 1, 0, 0};
  stream_t s = {0};
  uint64_t starts[15];
  make_wave(&w, &s, starts);
  wl_trace_analysis_t *a = analyse(&s, 0);
  wl_trace_summary_t su;
  wl_trace_analysis_summary(a, &su);
  double mean, sd;
  period_stats(starts, w.iters, &mean, &sd);
  CU_ASSERT_EQUAL(su.source, WL_TRACE_ITER_MARKERS);
  CU_ASSERT_EQUAL(su.iterations, w.iters);
  CU_ASSERT_DOUBLE_EQUAL(su.period_ms, mean, 1e-6);
  CU_ASSERT_DOUBLE_EQUAL(su.period_spread_ms, sd, 1e-6);
  CU_ASSERT_DOUBLE_EQUAL(su.forward_ms, w.period_ms * w.fwd_frac, 1e-6);
  CU_ASSERT_DOUBLE_EQUAL(su.backward_ms, w.period_ms * w.bwd_frac, 1e-6);
  CU_ASSERT_EQUAL(su.peak_bytes, w.base + w.steps * w.step);
  CU_ASSERT_EQUAL(su.trough_bytes, w.base);
  CU_ASSERT_EQUAL(su.physical_peak_bytes, 0); /* no map events: not traced */
  size_t n;
  const wl_trace_iteration_t *it = wl_trace_analysis_iterations(a, &n);
  CU_ASSERT_EQUAL_FATAL(n, w.iters);
  for (unsigned k = 0; k < w.iters; k++) {
    CU_ASSERT_EQUAL(it[k].begin_ns, starts[k]);
    CU_ASSERT_EQUAL(it[k].peak_bytes, w.base + w.steps * w.step);
    if (k + 1 < w.iters) CU_ASSERT_EQUAL(it[k].end_ns, starts[k + 1]);
  }
  wl_trace_analysis_destroy(a);
  free(s.ev);
}

static void test_phase_events_and_markers_precedence(void) {
  wave_t w = {50, 0.3, 0.5, 10, 10, 100 * MiB, 5 * MiB, 0, 0, 1, 0};
  stream_t s = {0};
  make_wave(&w, &s, NULL);
  wl_trace_analysis_t *a = analyse(&s, 0);
  wl_trace_summary_t su;
  wl_trace_analysis_summary(a, &su);
  CU_ASSERT_EQUAL(su.source, WL_TRACE_ITER_PHASES);
  CU_ASSERT_EQUAL(su.iterations, w.iters);
  CU_ASSERT_DOUBLE_EQUAL(su.forward_ms, 15.0, 1e-6);
  wl_trace_analysis_destroy(a);
  /* Both: markers alone decide, even when phase events came first. */
  free(s.ev);
  memset(&s, 0, sizeof s);
  w.markers = 1;
  w.fwd_frac = 0.35;
  make_wave(&w, &s, NULL);
  a = analyse(&s, 0);
  wl_trace_analysis_summary(a, &su);
  CU_ASSERT_EQUAL(su.source, WL_TRACE_ITER_MARKERS);
  CU_ASSERT_EQUAL(su.iterations, w.iters);
  CU_ASSERT_DOUBLE_EQUAL(su.forward_ms, w.period_ms * w.fwd_frac, 1e-6);
  wl_trace_analysis_destroy(a);
  free(s.ev);
}

static void test_wave_iterations_at_several_periods(void) {
  static const struct {
    double period_ms, jitter_ms;
    unsigned iters;
  } cases[] = {{7, 0, 30}, {50, 1.0, 12}, {300, 6.0, 8}, {1200, 20, 6}};
  for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
    wave_t w = {cases[c].period_ms,
                0.45,
                0.4,
                cases[c].iters,
                24,
                500 * MiB,
                20 * MiB,
                cases[c].jitter_ms,
                0,
                0,
                0};
    stream_t s = {0};
    uint64_t starts[64];
    make_wave(&w, &s, starts);
    wl_trace_analysis_t *a = analyse(&s, 0);
    wl_trace_summary_t su;
    wl_trace_analysis_summary(a, &su);
    double mean, sd, bin_ms = (double)su.bin_width_ns / 1e6;
    period_stats(starts, w.iters, &mean, &sd);
    if (getenv("WL_TEST_VERBOSE"))
      fprintf(stderr,
              "case %zu: iters %llu/%u period %.3f/%.3f sd %.3f/%.3f fwd %.3f conf %.2f ac %.2f "
              "bin %.4f trough %llu\n",
              c, (unsigned long long)su.iterations, w.iters, su.period_ms, mean,
              su.period_spread_ms, sd, su.forward_ms, su.confidence, su.autocorr, bin_ms,
              (unsigned long long)(su.trough_bytes >> 20));
    CU_ASSERT_EQUAL(su.source, WL_TRACE_ITER_WAVE);
    CU_ASSERT_EQUAL(su.iterations, w.iters);
    CU_ASSERT(su.confidence >= 0.5);
    CU_ASSERT(fabs(su.period_ms - mean) <= 2 * bin_ms + 1e-9);
    CU_ASSERT(fabs(su.period_spread_ms - sd) <= 2 * bin_ms + 0.05 * sd);
    /* The peak sits at the last allocation of the forward pass. */
    double peak_off = w.period_ms * w.fwd_frac * (w.steps - 1) / w.steps;
    CU_ASSERT(fabs(su.forward_ms - peak_off) <= 2 * bin_ms);
    CU_ASSERT_EQUAL(su.peak_bytes, w.base + w.steps * w.step);
    CU_ASSERT_EQUAL(su.trough_bytes, w.base);
    size_t n;
    const wl_trace_iteration_t *it = wl_trace_analysis_iterations(a, &n);
    CU_ASSERT_EQUAL(n, w.iters);
    for (size_t k = 0; k < n && k < w.iters; k++)
      CU_ASSERT(fabs((double)it[k].begin_ns - (double)starts[k]) <= 2 * su.bin_width_ns);
    /* Bins carry the phases found. */
    size_t nb;
    const uint8_t *flags;
    wl_trace_analysis_bins(a, &nb, NULL, NULL, &flags);
    size_t fwd = 0, bwd = 0;
    for (size_t i = 0; i < nb; i++) {
      fwd += !!(flags[i] & WL_TRACE_BIN_FORWARD);
      bwd += !!(flags[i] & WL_TRACE_BIN_BACKWARD);
    }
    CU_ASSERT(fwd > 0 && bwd > 0);
    wl_trace_analysis_destroy(a);
    free(s.ev);
  }
}

/* No flat trough (the next forward starts as the backward ends) and coarse bins, under ten an
 * iteration: the begin must stop at the turn, not walk back into the previous fall. */
static void test_wave_without_flat_trough_in_coarse_bins(void) {
  wave_t w = {10, 0.5, 0.5, 60, 40, 64 * MiB, 8 * MiB, 0, 0, 0, 0};
  stream_t s = {0};
  uint64_t starts[60];
  make_wave(&w, &s, starts);
  wl_trace_analysis_t *a = analyse(&s, 1024);
  wl_trace_summary_t su;
  wl_trace_analysis_summary(a, &su);
  double bin_ms = (double)su.bin_width_ns / 1e6, mean, sd;
  period_stats(starts, w.iters, &mean, &sd);
  CU_ASSERT(w.period_ms / bin_ms < 12); /* really coarse */
  CU_ASSERT_EQUAL(su.source, WL_TRACE_ITER_WAVE);
  CU_ASSERT(su.iterations + 1 >= w.iters && su.iterations <= w.iters);
  CU_ASSERT(fabs(su.period_ms - mean) <= bin_ms);
  CU_ASSERT(fabs(su.forward_ms - w.period_ms * w.fwd_frac) <= 2 * bin_ms);
  CU_ASSERT(fabs(su.backward_ms - w.period_ms * w.bwd_frac) <= 2 * bin_ms);
  wl_trace_analysis_destroy(a);
  free(s.ev);
}

/* A wave that never repeats: a random walk of allocations. No iterations may be claimed. */
static void test_no_false_iterations(void) {
  stream_t s = {0};
  uint64_t live = 0, t = 1000000000ull, x = 88172645463325252ull;
  for (int i = 0; i < 20000; i++) {
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    uint64_t size = (x % 64 + 1) * MiB;
    t += 50000 + x % 200000;
    if ((x >> 20) % 2 && live >= size) {
      put(&s, t, WL_TRACE_FREE_REQ, 0, size, 0);
      live -= size;
    } else {
      put(&s, t, WL_TRACE_ALLOC, 0, size, 0);
      live += size;
    }
  }
  wl_trace_analysis_t *a = analyse(&s, 0);
  wl_trace_summary_t su;
  wl_trace_analysis_summary(a, &su);
  CU_ASSERT_EQUAL(su.iterations, 0);
  CU_ASSERT(su.confidence < 0.5);
  CU_ASSERT_EQUAL(su.source, WL_TRACE_ITER_NONE);
  /* one allocation held forever: no wave at all */
  wl_trace_analysis_destroy(a);
  free(s.ev);
  memset(&s, 0, sizeof s);
  put(&s, 1000, WL_TRACE_ALLOC, 0, 5 * MiB, 0);
  put(&s, 5000000, WL_TRACE_LAUNCH, 0, 0, 0);
  a = analyse(&s, 0);
  wl_trace_analysis_summary(a, &su);
  CU_ASSERT_EQUAL(su.iterations, 0);
  CU_ASSERT_EQUAL(su.peak_bytes, 5 * MiB);
  CU_ASSERT_EQUAL(su.trough_bytes, 5 * MiB);
  wl_trace_analysis_destroy(a);
  free(s.ev);
}

/* Memory does not grow with the trace: the bins stay within their count and keep exact peaks. */
static void test_bins_stay_bounded(void) {
  wl_trace_analysis_config_t cfg;
  wl_trace_analysis_config_default(&cfg);
  cfg.bins = 1024;
  wl_trace_analysis_t *a;
  CU_ASSERT_EQUAL_FATAL(wl_trace_analysis_create(&a, NULL, &cfg), 0);
  wl_trace_event_t ev[256];
  uint64_t t = 1, live = 0, peak = 0;
  size_t max_used = 0;
  for (int round = 0; round < 4000; round++) {
    for (int i = 0; i < 256; i++) {
      memset(&ev[i], 0, sizeof ev[i]);
      t += 1000 + (uint64_t)(i * 37 % 500) + (uint64_t)round * 10;
      ev[i].time_ns = t;
      int up = (i / 32) % 2 == 0;
      ev[i].kind = up ? WL_TRACE_ALLOC : WL_TRACE_FREE_REQ;
      ev[i].size = (uint64_t)(i % 32 + 1 + round % 5) * 4096;
      live = up ? live + ev[i].size : live - ev[i].size;
      if (live > peak) peak = live;
    }
    wl_trace_analysis_feed(a, ev, 256);
    size_t n;
    wl_trace_analysis_bins(a, &n, NULL, NULL, NULL);
    if (n > max_used) max_used = n;
  }
  CU_ASSERT_EQUAL(wl_trace_analysis_finish(a), 0);
  wl_trace_summary_t su;
  wl_trace_analysis_summary(a, &su);
  CU_ASSERT(max_used <= 1024);
  CU_ASSERT_EQUAL(su.events, 4000u * 256u);
  CU_ASSERT_EQUAL(su.peak_bytes, peak);
  size_t n;
  const wl_trace_bin_t *b = wl_trace_analysis_bins(a, &n, NULL, NULL, NULL);
  uint64_t bmax = 0;
  for (size_t i = 0; i < n; i++)
    if (b[i].live_max > bmax) bmax = b[i].live_max;
  CU_ASSERT_EQUAL(bmax, peak);
  wl_trace_analysis_destroy(a);
  /* Odd values are clamped, not trusted: time going back, frees of more than is live, sizes
   * near 2^64, a jump of centuries. */
  CU_ASSERT_EQUAL_FATAL(wl_trace_analysis_create(&a, NULL, &cfg), 0);
  wl_trace_event_t odd[5] = {{.time_ns = 1000, .kind = WL_TRACE_ALLOC, .size = UINT64_MAX - 5},
                             {.time_ns = 10, .kind = WL_TRACE_ALLOC, .size = 100},
                             {.time_ns = 2000, .kind = WL_TRACE_FREE_REQ, .size = UINT64_MAX},
                             {.time_ns = 2000, .kind = WL_TRACE_FREE_REQ, .size = 7},
                             {.time_ns = UINT64_MAX, .kind = WL_TRACE_UNMAP, .size = 1}};
  CU_ASSERT_EQUAL(wl_trace_analysis_feed(a, odd, 5), 0);
  CU_ASSERT_EQUAL(wl_trace_analysis_finish(a), 0);
  wl_trace_analysis_summary(a, &su);
  CU_ASSERT_EQUAL(su.peak_bytes, UINT64_MAX);
  CU_ASSERT_EQUAL(su.last_ns, UINT64_MAX);
  wl_trace_analysis_bins(a, &n, NULL, NULL, NULL);
  CU_ASSERT(n <= 1024);
  wl_trace_analysis_destroy(a);
}

static void test_physical_model_and_waits(void) {
  stream_t s = {0};
  /* map 3 chunks, unmap 2 (cached), release 1, map 2 (1 from the cache, 1 new) */
  put(&s, 10, WL_TRACE_MAP, 0, 64 * MiB, 0);
  put(&s, 11, WL_TRACE_MAP, 0, 64 * MiB, 0);
  put(&s, 12, WL_TRACE_MAP, 0, 64 * MiB, 0);
  put(&s, 13, WL_TRACE_ALLOC, 0, 150 * MiB, 0);
  put(&s, 20, WL_TRACE_FREE_REQ, 0, 150 * MiB, 0);
  put(&s, 21, WL_TRACE_UNMAP, 0, 64 * MiB, 0);
  put(&s, 22, WL_TRACE_UNMAP, 0, 64 * MiB, 0);
  put(&s, 23, WL_TRACE_PHYS_RELEASE, 0, 64 * MiB, 0);
  put(&s, 30, WL_TRACE_MAP, 0, 64 * MiB, 0);
  put(&s, 31, WL_TRACE_MAP, 0, 64 * MiB, 0);
  put(&s, 32, WL_TRACE_ALLOC, 0, 180 * MiB, 0);
  put(&s, 40, WL_TRACE_GATE_WAIT, 1, 0, 0);
  put(&s, 45, WL_TRACE_GATE_GRANT, 1, 0, 5);
  put(&s, 50, WL_TRACE_BUDGET_WAIT, 0, 64 * MiB, 7);
  put(&s, 51, WL_TRACE_BUDGET_DENY, 0, 64 * MiB, 0);
  put(&s, 52, WL_TRACE_OOM, 0, 64 * MiB, 0);
  put(&s, 60, WL_TRACE_DROPPED, 0, 3, 0);
  wl_trace_analysis_t *a = analyse(&s, 0);
  wl_trace_summary_t su;
  wl_trace_analysis_summary(a, &su);
  /* Unmapping keeps 128 MiB cached (physical stays 192), the release leaves 64 cached, the
   * next map takes that from the cache and the last is new: 192 MiB again, never more. */
  CU_ASSERT_EQUAL(su.physical_peak_bytes, 3 * 64 * MiB);
  CU_ASSERT_EQUAL(su.physical_at_peak_bytes, 3 * 64 * MiB);
  CU_ASSERT_EQUAL(su.peak_bytes, 180 * MiB);
  CU_ASSERT_DOUBLE_EQUAL(su.fragmentation, 192.0 / 180.0, 1e-9);
  CU_ASSERT_EQUAL(su.gate_waits, 1);
  CU_ASSERT_EQUAL(su.gate_wait_ns, 5);
  CU_ASSERT_EQUAL(su.budget_waits, 1);
  CU_ASSERT_EQUAL(su.budget_wait_ns, 7);
  CU_ASSERT_EQUAL(su.budget_denials, 1);
  CU_ASSERT_EQUAL(su.ooms, 1);
  CU_ASSERT_EQUAL(su.dropped, 3);
  size_t n;
  const wl_trace_span_t *sp = wl_trace_analysis_spans(a, &n);
  CU_ASSERT_EQUAL_FATAL(n, 2);
  CU_ASSERT_EQUAL(sp[0].begin_ns, 40);
  CU_ASSERT_EQUAL(sp[0].end_ns, 45);
  CU_ASSERT_EQUAL(sp[0].kind, WL_TRACE_GATE_GRANT);
  CU_ASSERT_EQUAL(sp[1].kind, WL_TRACE_BUDGET_WAIT);
  wl_trace_analysis_destroy(a);
  free(s.ev);
}

/* Two replicas half a period apart never rise together; aligned ones always do. */
static void test_combined_wave_and_overlap(void) {
  for (int aligned = 0; aligned <= 1; aligned++) {
    wave_t w0 = {100, 0.3, 0.3, 10, 10, 200 * MiB, 30 * MiB, 0, 1, 0, 0};
    wave_t w1 = w0;
    w1.t0 = w0.t0 = 2000000000ull;
    if (!aligned) w1.t0 += ms(50);
    stream_t s0 = {0}, s1 = {0};
    make_wave(&w0, &s0, NULL);
    make_wave(&w1, &s1, NULL);
    wl_trace_analysis_t *a[2] = {analyse(&s0, 0), analyse(&s1, 0)};
    wl_trace_combined_t *c;
    CU_ASSERT_EQUAL_FATAL(wl_trace_combine((const wl_trace_analysis_t *const *)a, 2, 0, &c), 0);
    uint64_t peak1 = w0.base + w0.steps * w0.step;
    if (aligned) {
      CU_ASSERT_EQUAL(c->peak_bytes, 2 * peak1);
      CU_ASSERT(c->overlap_ns * 10 >= c->rising_ns * 9);
    } else {
      CU_ASSERT_EQUAL(c->overlap_ns, 0);
      CU_ASSERT(c->peak_bytes < 2 * peak1);
      CU_ASSERT(c->peak_bytes >= peak1 + w1.base);
    }
    double off[2];
    uint64_t pk;
    CU_ASSERT_EQUAL(wl_trace_best_offsets((const wl_trace_analysis_t *const *)a, 2, off, &pk), 0);
    CU_ASSERT_DOUBLE_EQUAL(off[0], 0, 1e-9);
    CU_ASSERT(pk < 2 * peak1);
    CU_ASSERT(pk >= peak1 + w0.base);
    wl_trace_combined_destroy(c);
    wl_trace_analysis_destroy(a[0]);
    wl_trace_analysis_destroy(a[1]);
    free(s0.ev);
    free(s1.ev);
  }
}

/* The combined physical wave: two processes' mapped-plus-cached bytes (MAP, UNMAP,
 * PHYS_RELEASE) summed on one grid; a process that traced none makes it partial. */
static void test_combined_physical(void) {
  const uint64_t t = 1000000000ull;
  stream_t s0 = {0}, s1 = {0}, s2 = {0};
  put(&s0, t, WL_TRACE_ALLOC, 0, 10 * MiB, 0);
  put(&s0, t + ms(10), WL_TRACE_MAP, 0, 100 * MiB, 0);
  put(&s0, t + ms(60), WL_TRACE_UNMAP, 0, 100 * MiB, 0); /* cached: still held */
  put(&s0, t + ms(61), WL_TRACE_PHYS_RELEASE, 0, 100 * MiB, 0);
  put(&s0, t + ms(100), WL_TRACE_ALLOC, 0, 10 * MiB, 0);
  put(&s1, t, WL_TRACE_ALLOC, 0, 10 * MiB, 0);
  put(&s1, t + ms(40), WL_TRACE_MAP, 0, 80 * MiB, 0);
  put(&s1, t + ms(90), WL_TRACE_UNMAP, 0, 80 * MiB, 0);
  put(&s1, t + ms(91), WL_TRACE_PHYS_RELEASE, 0, 80 * MiB, 0);
  put(&s1, t + ms(100), WL_TRACE_ALLOC, 0, 10 * MiB, 0);
  put(&s2, t, WL_TRACE_ALLOC, 0, 10 * MiB, 0);
  put(&s2, t + ms(100), WL_TRACE_ALLOC, 0, 10 * MiB, 0);
  wl_trace_analysis_t *a[3] = {analyse(&s0, 0), analyse(&s1, 0), analyse(&s2, 0)};
  wl_trace_combined_t *c;
  CU_ASSERT_EQUAL_FATAL(wl_trace_combine((const wl_trace_analysis_t *const *)a, 2, 0, &c), 0);
  CU_ASSERT_EQUAL(c->physical_traced, 1);
  CU_ASSERT_EQUAL(c->physical_peak_bytes, 180 * MiB);
  CU_ASSERT(c->physical_peak_ns >= t + ms(39) && c->physical_peak_ns <= t + ms(61));
  CU_ASSERT_EQUAL(c->peak_bytes, 40 * MiB); /* live: each process's two allocations */
  wl_trace_combined_destroy(c);
  const wl_trace_analysis_t *b[2] = {a[0], a[2]};
  CU_ASSERT_EQUAL_FATAL(wl_trace_combine(b, 2, 0, &c), 0);
  CU_ASSERT_EQUAL(c->physical_traced, 0);
  CU_ASSERT_EQUAL(c->physical_peak_bytes, 100 * MiB);
  wl_trace_combined_destroy(c);
  for (int i = 0; i < 3; i++) wl_trace_analysis_destroy(a[i]);
  free(s0.ev);
  free(s1.ev);
  free(s2.ev);
}

/* A chunk one process gives back and another takes a moment later, in one bin of the combined
 * grid: the bins' sum holds both, the exact peak one (a budget of one chunk was never exceeded).
 * At the same nanosecond what is given back counts first (liballoc traces it before its budget
 * hears of it). */
static void test_combined_physical_hand_off(void) {
  const uint64_t t = 1000000000ull;
  for (int same_ns = 0; same_ns <= 1; same_ns++) {
    stream_t s0 = {0}, s1 = {0};
    uint64_t handed = t + ms(50) + 1000;
    put(&s0, t, WL_TRACE_ALLOC, 0, 10 * MiB, 0);
    put(&s0, t + ms(1), WL_TRACE_MAP, 0, 100 * MiB, 0);
    put(&s0, t + ms(50), WL_TRACE_UNMAP, 0, 100 * MiB, 0);
    put(&s0, handed, WL_TRACE_PHYS_RELEASE, 0, 100 * MiB, 0);
    put(&s0, t + ms(100), WL_TRACE_FREE_REQ, 0, 10 * MiB, 0);
    put(&s1, t, WL_TRACE_ALLOC, 0, 10 * MiB, 0);
    put(&s1, same_ns ? handed : handed + 500, WL_TRACE_MAP, 0, 100 * MiB, 0);
    put(&s1, t + ms(100), WL_TRACE_FREE_REQ, 0, 10 * MiB, 0);
    wl_trace_analysis_t *a[2] = {analyse(&s0, 0), analyse(&s1, 0)};
    wl_trace_combined_t *c;
    CU_ASSERT_EQUAL_FATAL(wl_trace_combine((const wl_trace_analysis_t *const *)a, 2, 16, &c), 0);
    uint64_t binned = 0;
    for (size_t g = 0; g < c->n; g++)
      if (c->phys[g] > binned) binned = c->phys[g];
    CU_ASSERT_EQUAL(binned, 200 * MiB); /* the bins' upper bound: both in one bin */
    CU_ASSERT_EQUAL(c->physical_traced, 1);
    CU_ASSERT_EQUAL(c->physical_peak_exact, 1);
    CU_ASSERT_EQUAL(c->physical_peak_bytes, 100 * MiB);
    CU_ASSERT(c->physical_peak_ns >= t + ms(1) && c->physical_peak_ns <= handed + 500);
    wl_trace_combined_destroy(c);
    wl_trace_analysis_destroy(a[0]);
    wl_trace_analysis_destroy(a[1]);
    free(s0.ev);
    free(s1.ev);
  }
}

/* A process counts as zero after its trace's last event, in the sweep as in the bins: one that
 * ended with 100 MiB mapped and one that mapped 100 MiB later never held 200 together. Past
 * max_physical_steps the list is dropped and the peak is the bins' upper bound, said so; sizes
 * near 2^64 (saturated) neither overflow nor wrap. */
static void test_combined_physical_ends_and_caps(void) {
  const uint64_t t = 1000000000ull;
  stream_t s0 = {0}, s1 = {0};
  put(&s0, t, WL_TRACE_ALLOC, 0, 10 * MiB, 0);
  put(&s0, t + ms(1), WL_TRACE_MAP, 0, 100 * MiB, 0);
  put(&s0, t + ms(100), WL_TRACE_ALLOC, 0, 1 * MiB, 0);
  put(&s1, t + ms(200), WL_TRACE_ALLOC, 0, 10 * MiB, 0);
  put(&s1, t + ms(201), WL_TRACE_MAP, 0, 100 * MiB, 0);
  put(&s1, t + ms(300), WL_TRACE_ALLOC, 0, 1 * MiB, 0);
  wl_trace_analysis_t *a[2] = {analyse(&s0, 0), analyse(&s1, 0)};
  wl_trace_combined_t *c;
  CU_ASSERT_EQUAL_FATAL(wl_trace_combine((const wl_trace_analysis_t *const *)a, 2, 0, &c), 0);
  CU_ASSERT_EQUAL(c->physical_peak_exact, 1);
  CU_ASSERT_EQUAL(c->physical_peak_bytes, 100 * MiB);
  wl_trace_combined_destroy(c);
  wl_trace_analysis_destroy(a[0]);
  wl_trace_analysis_destroy(a[1]);

  /* Four changes kept: s2's eight are too many; the peak comes from the bins. */
  stream_t s2 = {0};
  for (int i = 0; i < 4; i++) {
    put(&s2, t + ms(10 * i), WL_TRACE_MAP, 0, 20 * MiB, 0);
    put(&s2, t + ms(10 * i + 5), WL_TRACE_UNMAP, 0, 20 * MiB, 0); /* cached: no change */
    put(&s2, t + ms(10 * i + 6), WL_TRACE_PHYS_RELEASE, 0, 20 * MiB, 0);
  }
  t_max_psteps = 4;
  a[0] = analyse(&s2, 0);
  a[1] = analyse(&s1, 0);
  t_max_psteps = 0;
  CU_ASSERT_EQUAL_FATAL(wl_trace_combine((const wl_trace_analysis_t *const *)a, 2, 0, &c), 0);
  CU_ASSERT_EQUAL(c->physical_peak_exact, 0);
  CU_ASSERT(c->physical_peak_bytes >= 100 * MiB);
  wl_trace_combined_destroy(c);
  wl_trace_analysis_destroy(a[0]);
  wl_trace_analysis_destroy(a[1]);

  /* Saturated sizes: two processes at 2^64 - 1 bytes each. */
  stream_t s3 = {0}, s4 = {0};
  put(&s3, t, WL_TRACE_MAP, 0, UINT64_MAX, 0);
  put(&s3, t + ms(1), WL_TRACE_MAP, 0, UINT64_MAX, 0);
  put(&s3, t + ms(2), WL_TRACE_UNMAP, 0, UINT64_MAX / 2, 0);
  put(&s4, t, WL_TRACE_MAP, 0, UINT64_MAX, 0);
  a[0] = analyse(&s3, 0);
  a[1] = analyse(&s4, 0);
  CU_ASSERT_EQUAL_FATAL(wl_trace_combine((const wl_trace_analysis_t *const *)a, 2, 0, &c), 0);
  CU_ASSERT_EQUAL(c->physical_peak_exact, 1);
  CU_ASSERT_EQUAL(c->physical_peak_bytes, UINT64_MAX);
  wl_trace_combined_destroy(c);
  wl_trace_analysis_destroy(a[0]);
  wl_trace_analysis_destroy(a[1]);
  free(s0.ev);
  free(s1.ev);
  free(s2.ev);
  free(s3.ev);
  free(s4.ev);
}

/* The interposer emits an iteration's begin when it detects it, and then waits for the token:
 * waiting is not rising. Member 1 begins while member 0 rises and allocates only once granted
 * at member 0's peak: no overlap. Its forward bins start at the first allocation. */
static void test_gate_wait_is_not_rising(void) {
  wave_t w0 = {100, 0.3, 0.3, 10, 10, 200 * MiB, 30 * MiB, 0, 0, 1, 2000000000ull};
  stream_t s0 = {0}, s1 = {0};
  uint64_t starts[10];
  make_wave(&w0, &s0, starts);
  /* Member 1: begins 10 ms after member 0 (inside its 30 ms forward), waits until member 0's
   * peak, then rises for 30 ms and falls. */
  put(&s1, starts[0] - ms(1), WL_TRACE_ALLOC, 0, 100 * MiB, 0);
  for (unsigned k = 0; k < 10; k++) {
    uint64_t b = starts[k] + ms(10), g = starts[k] + ms(30);
    put(&s1, b, WL_TRACE_PHASE, WL_TRACE_PHASE_ITER_BEGIN, 0, 0);
    put(&s1, b, WL_TRACE_GATE_WAIT, 1, 0, 0);
    put(&s1, g, WL_TRACE_GATE_GRANT, 1, 0, g - b);
    for (unsigned i = 0; i < 10; i++) put(&s1, g + ms(3.0 * i), WL_TRACE_ALLOC, 0, 30 * MiB, 0);
    put(&s1, g + ms(30), WL_TRACE_PHASE, WL_TRACE_PHASE_BACKWARD, 0, 0);
    for (unsigned i = 0; i < 10; i++)
      put(&s1, g + ms(30 + 3.0 * i), WL_TRACE_FREE_REQ, 0, 30 * MiB, 0);
    put(&s1, g + ms(60), WL_TRACE_PHASE, WL_TRACE_PHASE_IDLE, 0, 0);
  }
  wl_trace_analysis_t *a[2] = {analyse(&s0, 0), analyse(&s1, 0)};
  wl_trace_combined_t *c;
  CU_ASSERT_EQUAL_FATAL(wl_trace_combine((const wl_trace_analysis_t *const *)a, 2, 0, &c), 0);
  /* At most a bin where member 0's last allocation and member 1's first share one. */
  CU_ASSERT(c->overlap_ns <= 10 * 2 * c->width_ns);
  CU_ASSERT(c->rising_ns >= ms(500)); /* 10 x (30 + 30) ms, less the bins shared */
  if (c->overlap_ns > 10 * 2 * c->width_ns)
    fprintf(stderr, "\noverlap %.2f ms of %.2f ms rising (bin %.3f ms)\n", c->overlap_ns / 1e6,
            c->rising_ns / 1e6, c->width_ns / 1e6);
  wl_trace_combined_destroy(c);
  wl_trace_analysis_destroy(a[0]);
  wl_trace_analysis_destroy(a[1]);
  free(s0.ev);
  free(s1.ev);
}

/* Two waves analysed and combined: the setup and teardown the combined-wave tests share. */
typedef struct pair_s {
  stream_t s[2];
  wl_trace_analysis_t *a[2];
  wl_trace_combined_t *c;
} pair_t;

static int pair_combine(pair_t *p, const wave_t *w0, const wave_t *w1) {
  memset(p, 0, sizeof *p);
  make_wave(w0, &p->s[0], NULL);
  make_wave(w1, &p->s[1], NULL);
  p->a[0] = analyse(&p->s[0], 0);
  p->a[1] = analyse(&p->s[1], 0);
  return wl_trace_combine((const wl_trace_analysis_t *const *)p->a, 2, 0, &p->c);
}

static void pair_free(pair_t *p) {
  wl_trace_combined_destroy(p->c);
  for (int i = 0; i < 2; i++) {
    wl_trace_analysis_destroy(p->a[i]);
    free(p->s[i].ev);
  }
}

/* Tick-tock over a long trace: 5 minutes of two replicas whose forward phases alternate with
 * 40 us between one's backward and the other's begin. The combined bins are 4.6 ms wide, so
 * both replicas rise in many of the same bins, yet they never rise at the same moment: no
 * overlap. Moved 5 ms closer, they overlap by 4.96 ms an iteration, measured to the ns. */
static void test_alternating_phases_do_not_overlap(void) {
  const double P = 100, F = 50 - 0.04; /* ms */
  for (int close = 0; close <= 1; close++) {
    wave_t w0 = {P, F / P, 0.3, 3000, 4, 100 * MiB, 10 * MiB, 0, 0, 1, 2000000000ull};
    wave_t w1 = w0;
    w1.t0 = w0.t0 + ms(close ? 45 : 50);
    pair_t p;
    CU_ASSERT_EQUAL_FATAL(pair_combine(&p, &w0, &w1), 0);
    const wl_trace_combined_t *c = p.c;
    CU_ASSERT(c->width_ns > ms(1));       /* the bins are far coarser than the 40 us gaps */
    CU_ASSERT_EQUAL(c->rising_bin_ns, 0); /* phase events: exact */
    double want_ov = close ? 3000 * (F - 45) : 0, want_rise = 3000 * (close ? 45 + F : 2 * F);
    CU_ASSERT_DOUBLE_EQUAL(c->overlap_ns / 1e6, want_ov, 1e-3 * 3000);
    CU_ASSERT_DOUBLE_EQUAL(c->rising_ns / 1e6, want_rise, 1e-3 * 3000);
    if (!close) CU_ASSERT_EQUAL(c->overlap_ns, 0);
    size_t marked = 0;
    for (size_t g = 0; g < c->n; g++) marked += c->overlap[g];
    CU_ASSERT(close ? marked > 0 : marked == 0);
    if (fabs(c->overlap_ns / 1e6 - want_ov) > 3 || fabs(c->rising_ns / 1e6 - want_rise) > 3)
      fprintf(stderr, "\noverlap %.3f ms (want %.3f), rising %.3f ms (want %.3f)\n",
              c->overlap_ns / 1e6, want_ov, c->rising_ns / 1e6, want_rise);
    pair_free(&p);
  }
}

/* Iterations found in the wave have no exact phases: their bins stand in, and the combined
 * wave says how fine those are. */
static void test_wave_rises_fall_back_to_bins(void) {
  wave_t w0 = {100, 0.3, 0.3, 20, 10, 200 * MiB, 30 * MiB, 0, 0, 0, 2000000000ull};
  wave_t w1 = w0;
  w1.t0 += ms(50);
  pair_t p;
  CU_ASSERT_EQUAL_FATAL(pair_combine(&p, &w0, &w1), 0);
  const wl_trace_combined_t *c = p.c;
  wl_trace_summary_t su;
  wl_trace_analysis_summary(p.a[0], &su);
  CU_ASSERT_EQUAL(su.source, WL_TRACE_ITER_WAVE);
  CU_ASSERT(c->rising_bin_ns >= su.bin_width_ns && c->rising_bin_ns > 0);
  CU_ASSERT(c->rising_ns > ms(20 * 2 * 25)); /* about 30 ms a forward phase, found to a bin */
  CU_ASSERT_EQUAL(c->overlap_ns, 0);
  pair_free(&p);
}

/* The combined trough is taken where every trace runs: after the shorter one ends it counts as
 * zero, and the longer one alone is no trough of the pair. */
static void test_combined_trough_over_the_common_span(void) {
  wave_t w0 = {100, 0.3, 0.3, 10, 10, 200 * MiB, 30 * MiB, 0, 1, 0, 2000000000ull};
  wave_t w1 = w0;
  w1.iters = 20;
  pair_t p;
  CU_ASSERT_EQUAL_FATAL(pair_combine(&p, &w0, &w1), 0);
  const wl_trace_combined_t *c = p.c;
  CU_ASSERT(c->trough_bytes >= w0.base + w1.base);
  if (c->trough_bytes < w0.base + w1.base)
    fprintf(stderr, "\ntrough %llu MiB, both bases %llu MiB\n",
            (unsigned long long)(c->trough_bytes / MiB),
            (unsigned long long)((w0.base + w1.base) / MiB));
  pair_free(&p);
}

/* A triangle wave: two copies half a period apart sum to a constant, 2*base + amplitude. */
static void test_capacity_advice_on_a_triangle(void) {
  wave_t w = {100, 0.5, 0.5, 12, 64, 1024 * MiB, 32 * MiB, 0, 1, 0, 0};
  stream_t s = {0};
  make_wave(&w, &s, NULL);
  wl_trace_analysis_t *a = analyse(&s, 0);
  uint64_t amp = w.steps * w.step, peak = w.base + amp;
  /* Room for two shifted copies (with a step to spare), not two aligned ones. */
  uint64_t cap = 2 * w.base + amp + 2 * w.step;
  CU_ASSERT_FATAL(cap < 2 * peak);
  wl_trace_capacity_t c;
  CU_ASSERT_EQUAL_FATAL(wl_trace_capacity(a, cap, 1.0, &c), 0);
  CU_ASSERT(c.usable);
  CU_ASSERT_EQUAL(c.peak_bytes, peak);
  CU_ASSERT_EQUAL(c.replicas_without, cap / peak);
  CU_ASSERT_EQUAL(c.replicas_ticktock, 2);
  CU_ASSERT(c.combined_peak_bytes <= cap);
  CU_ASSERT(fabs(c.offsets_ms[1] - w.period_ms / 2) <= w.period_ms * 0.05);
  /* The stated model: K / max(P, K * busy * work), relative to one replica. */
  double P = c.period_ms, wk = c.busy * c.work_ms;
  CU_ASSERT_DOUBLE_EQUAL(c.throughput_ticktock, 2 * P / fmax(P, 2 * wk), 1e-9);
  CU_ASSERT_DOUBLE_EQUAL(c.throughput_without, 1 * P / fmax(P, 1 * wk), 1e-9);
  CU_ASSERT_PTR_NOT_NULL(strstr(c.model, "max(P"));
  /* A busy fraction of a half leaves room: the ratio grows. */
  wl_trace_capacity_t h;
  CU_ASSERT_EQUAL(wl_trace_capacity(a, cap, 0.5, &h), 0);
  CU_ASSERT(h.throughput_ticktock > c.throughput_ticktock);
  /* More room: more replicas, never fewer with tick-tock than without. */
  wl_trace_capacity_t big;
  CU_ASSERT_EQUAL(wl_trace_capacity(a, 8 * peak, 1.0, &big), 0);
  CU_ASSERT_EQUAL(big.replicas_without, 8);
  CU_ASSERT(big.replicas_ticktock >= big.replicas_without);
  CU_ASSERT(big.combined_peak_bytes <= 8 * peak);
  /* Too small for one. */
  CU_ASSERT_EQUAL(wl_trace_capacity(a, peak - 1, 1.0, &big), 0);
  CU_ASSERT_EQUAL(big.replicas_ticktock, 0);
  CU_ASSERT_EQUAL(big.replicas_without, 0);
  CU_ASSERT_EQUAL(wl_trace_capacity(a, cap, 1.5, &big), -EINVAL);
  wl_trace_analysis_destroy(a);
  free(s.ev);
}

/* The same triangle served by liballoc: its physical memory a quarter above its live bytes at
 * the peak. The advice is in physical memory (what a budget holds): the live wave times 1.25, and
 * each shifted copy its slack at the peak, so the budget that held two shifted live waves now
 * holds one. Without physical memory, as before. */
static void test_capacity_advice_in_physical_memory(void) {
  wave_t w = {100, 0.5, 0.5, 12, 64, 1024 * MiB, 32 * MiB, 0, 1, 0, 0};
  stream_t s = {0};
  uint64_t amp = w.steps * w.step, peak = w.base + amp;
  /* mapped before the first allocation, never unmapped: 1.25 peaks throughout */
  put(&s, 1000000000ull - 1, WL_TRACE_MAP, 0, peak / 4 * 5, 0);
  make_wave(&w, &s, NULL);
  wl_trace_analysis_t *a = analyse(&s, 0);
  wl_trace_summary_t su;
  wl_trace_analysis_summary(a, &su);
  CU_ASSERT_DOUBLE_EQUAL(su.fragmentation, 1.25, 1e-9);
  uint64_t cap = 2 * w.base + amp + 2 * w.step; /* two shifted live waves fit, as above */
  wl_trace_capacity_t c;
  CU_ASSERT_EQUAL_FATAL(wl_trace_capacity(a, cap, 1.0, &c), 0);
  CU_ASSERT(c.usable);
  CU_ASSERT_DOUBLE_EQUAL(c.fragmentation, 1.25, 1e-9);
  CU_ASSERT_EQUAL(c.peak_bytes, peak / 4 * 5);
  CU_ASSERT_EQUAL(c.replicas_ticktock, 1);
  /* Room for two shifted physical waves, each with its slack at the peak (a quarter peak here):
   * two again. */
  uint64_t pcap = (2 * w.base + amp) / 4 * 5 + 4 * w.step + 2 * (peak / 4);
  CU_ASSERT_FATAL(pcap < 2 * (peak / 4 * 5));
  CU_ASSERT_EQUAL_FATAL(wl_trace_capacity(a, pcap, 1.0, &c), 0);
  CU_ASSERT_EQUAL(c.replicas_ticktock, 2);
  CU_ASSERT(c.combined_peak_bytes <= pcap && c.combined_peak_bytes > cap);
  CU_ASSERT_EQUAL_FATAL(wl_trace_capacity(a, pcap - 2 * (peak / 4), 1.0, &c), 0);
  CU_ASSERT_EQUAL(c.replicas_ticktock, 1);
  wl_trace_analysis_destroy(a);
  free(s.ev);
}

/* A slow first iteration among a few short ones (a warm-up: 80 ms, then five of 10 ms): the
 * mean period (22 ms) is past every short one, and the fold, which keeps iterations near the
 * typical length, kept none; by the median it keeps the five, and two copies shift. */
static void test_fold_by_the_median_iteration(void) {
  wave_t w = {10, 0.4, 0.4, 6, 16, 64 * MiB, 4 * MiB, 0, 1, 0, 0};
  stream_t s = {0};
  uint64_t starts[6];
  make_wave(&w, &s, starts);
  for (size_t i = 0; i < s.n; i++)
    if (s.ev[i].time_ns >= starts[1]) s.ev[i].time_ns += ms(70);
  wl_trace_analysis_t *a = analyse(&s, 0);
  wl_trace_summary_t su;
  wl_trace_analysis_summary(a, &su);
  CU_ASSERT_EQUAL(su.source, WL_TRACE_ITER_MARKERS);
  CU_ASSERT(su.period_ms > 20);
  uint64_t pk = 0, peak = w.base + w.steps * w.step;
  CU_ASSERT_EQUAL(wl_trace_ticktock_peak(a, 2, &pk), 0);
  CU_ASSERT(pk >= peak && pk < 2 * peak);
  /* The advice's period is the typical cycle (10 ms), not the mean (24 ms), and the offsets lie
   * within it. */
  wl_trace_capacity_t c;
  CU_ASSERT_EQUAL(wl_trace_capacity(a, 2 * peak, 1.0, &c), 0);
  CU_ASSERT(c.usable && fabs(c.period_ms - w.period_ms) < 0.05 * w.period_ms);
  CU_ASSERT(c.replicas_ticktock >= 2 && c.offsets_ms[1] < c.period_ms);
  wl_trace_analysis_destroy(a);
  free(s.ev);
}

/* A slow iteration (its own rise and fall stretched, not the idle time after it) among steady
 * ones is left out of the fold: the folded wave and its cycle are the steady ones'. */
static void test_fold_leaves_out_a_long_iteration(void) {
  wave_t w = {10, 0.4, 0.4, 7, 16, 64 * MiB, 4 * MiB, 0, 1, 0, 0};
  stream_t s = {0};
  uint64_t starts[7];
  make_wave(&w, &s, starts);
  /* iteration 2 runs five times as long: its events spread out from its start, later ones
   * shifted by the 40 ms it gained */
  for (size_t i = 0; i < s.n; i++) {
    uint64_t t = s.ev[i].time_ns;
    if (t >= starts[2] && t < starts[3])
      s.ev[i].time_ns = starts[2] + (t - starts[2]) * 5;
    else if (t >= starts[3])
      s.ev[i].time_ns += ms(40);
  }
  wl_trace_analysis_t *a = analyse(&s, 0);
  wl_trace_summary_t su;
  wl_trace_analysis_summary(a, &su);
  CU_ASSERT_EQUAL(su.source, WL_TRACE_ITER_MARKERS);
  uint64_t peak = w.base + w.steps * w.step;
  wl_trace_capacity_t c;
  CU_ASSERT_EQUAL(wl_trace_capacity(a, 2 * peak, 1.0, &c), 0);
  CU_ASSERT(c.usable && fabs(c.period_ms - w.period_ms) < 0.05 * w.period_ms);
  CU_ASSERT(c.replicas_ticktock >= 2 && c.offsets_ms[1] < c.period_ms);
  /* The steady wave shifted half a cycle: its combined peak is well below two peaks. */
  uint64_t pk = 0;
  CU_ASSERT_EQUAL(wl_trace_ticktock_peak(a, 2, &pk), 0);
  CU_ASSERT(pk >= peak && pk < 2 * peak);
  wl_trace_analysis_destroy(a);
  free(s.ev);
}

int main(int argc, char **argv) {
  static const wl_test_case_t cases[] = {
      {"markers_give_exact_iterations", test_markers_give_exact_iterations},
      {"phase_events_and_markers_precedence", test_phase_events_and_markers_precedence},
      {"wave_iterations_at_several_periods", test_wave_iterations_at_several_periods},
      {"wave_without_flat_trough_in_coarse_bins", test_wave_without_flat_trough_in_coarse_bins},
      {"no_false_iterations", test_no_false_iterations},
      {"bins_stay_bounded", test_bins_stay_bounded},
      {"physical_model_and_waits", test_physical_model_and_waits},
      {"combined_wave_and_overlap", test_combined_wave_and_overlap},
      {"combined_physical", test_combined_physical},
      {"combined_physical_hand_off", test_combined_physical_hand_off},
      {"combined_physical_ends_and_caps", test_combined_physical_ends_and_caps},
      {"combined_trough_over_the_common_span", test_combined_trough_over_the_common_span},
      {"gate_wait_is_not_rising", test_gate_wait_is_not_rising},
      {"alternating_phases_do_not_overlap", test_alternating_phases_do_not_overlap},
      {"wave_rises_fall_back_to_bins", test_wave_rises_fall_back_to_bins},
      {"capacity_advice_on_a_triangle", test_capacity_advice_on_a_triangle},
      {"capacity_advice_in_physical_memory", test_capacity_advice_in_physical_memory},
      {"fold_by_the_median_iteration", test_fold_by_the_median_iteration},
      {"fold_leaves_out_a_long_iteration", test_fold_leaves_out_a_long_iteration},
      {NULL, NULL}};
  return wl_test_main(argc, argv, "trace_analysis", cases);
}
