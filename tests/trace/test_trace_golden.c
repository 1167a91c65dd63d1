/* The golden traces: the checked-in files are exactly what the generator writes, and the analysis
 * finds in them exactly the peaks, troughs, periods, phases and waits they were made with. */
#include "golden_spec.h"
#include "wltest.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <sys/stat.h>
#include <unistd.h>

int golden_write(const golden_t *g, const char *path);

#define GMAX(a, b) ((a) > (b) ? (a) : (b))

static char tmpdir[256];

static uint8_t *slurp(const char *path, size_t *len) {
  FILE *f = fopen(path, "rb");
  if (!f) return NULL;
  fseek(f, 0, SEEK_END);
  long n = ftell(f);
  fseek(f, 0, SEEK_SET);
  uint8_t *b = malloc((size_t)n + 1);
  *len = fread(b, 1, (size_t)n, f);
  fclose(f);
  return b;
}

static const char *gpath(const char *file) {
  static char buf[4][512];
  static int k;
  char *p = buf[k++ % 4];
  snprintf(p, 512, "%s/%s", WL_GOLDEN_DIR, file);
  return p;
}

static wl_trace_analysis_t *analyse(const char *path, wl_trace_reader_info_t *info) {
  wl_trace_analysis_t *a = NULL;
  char err[600];
  int rc = wl_trace_analyze_file(path, 0, NULL, &a, info, err, sizeof err);
  if (rc) fprintf(stderr, "%s\n", err);
  CU_ASSERT_EQUAL(rc, 0);
  return a;
}

static void test_checked_in_files_match_the_generator(void) {
  for (size_t i = 0; i < GOLDEN_COUNT; i++) {
    char out[512];
    snprintf(out, sizeof out, "%s/%s", tmpdir, golden_set[i].file);
    CU_ASSERT_EQUAL_FATAL(golden_write(&golden_set[i], out), 0);
    size_t n1, n2;
    uint8_t *a = slurp(out, &n1), *b = slurp(gpath(golden_set[i].file), &n2);
    CU_ASSERT_PTR_NOT_NULL_FATAL(a);
    CU_ASSERT_PTR_NOT_NULL_FATAL(b);
    CU_ASSERT_EQUAL(n1, n2);
    CU_ASSERT(n1 == n2 && memcmp(a, b, n1) == 0);
    if (n1 != n2 || memcmp(a, b, n1))
      fprintf(stderr, "%s differs from a fresh %s: the format or the generator changed\n",
              gpath(golden_set[i].file), out);
    free(a);
    free(b);
  }
}

/* What every golden must show, whatever found its iterations. */
static void check_common(const golden_t *g, const golden_expect_t *e, const wl_trace_summary_t *s,
                         const wl_trace_reader_info_t *info) {
  CU_ASSERT(info->complete);
  CU_ASSERT_EQUAL(info->end_events, e->events);
  CU_ASSERT_EQUAL(s->events, e->events);
  CU_ASSERT_EQUAL(s->allocs, e->allocs);
  CU_ASSERT_EQUAL(s->frees, e->frees);
  CU_ASSERT_EQUAL(s->launches, e->launches);
  CU_ASSERT_EQUAL(s->peak_bytes, e->peak);
  CU_ASSERT_EQUAL(s->trough_bytes, e->trough);
  CU_ASSERT_EQUAL(s->physical_peak_bytes, e->phys_peak);
  CU_ASSERT_EQUAL(s->physical_at_peak_bytes, e->phys_at_peak);
  CU_ASSERT_EQUAL(s->gate_waits, e->gate_waits);
  CU_ASSERT_EQUAL(s->gate_wait_ns, e->gate_wait_ns);
  CU_ASSERT_EQUAL(s->budget_waits, e->budget_waits);
  CU_ASSERT_EQUAL(s->budget_wait_ns, e->budget_wait_ns);
  CU_ASSERT_EQUAL(s->iterations, g->iters);
  CU_ASSERT_EQUAL(s->header.pid, g->pid);
  CU_ASSERT_EQUAL(s->header.role, g->role);
  CU_ASSERT_EQUAL(s->header.device_capacity, g->capacity);
  CU_ASSERT_EQUAL(s->header.mem_limit, g->mem_limit);
  CU_ASSERT_EQUAL(s->last_ns, e->last_ns);
}

static void test_markers_golden(void) {
  const golden_t *g = &golden_set[0];
  golden_expect_t e;
  golden_expect(g, &e);
  wl_trace_reader_info_t info;
  wl_trace_analysis_t *a = analyse(gpath(g->file), &info);
  CU_ASSERT_PTR_NOT_NULL_FATAL(a);
  wl_trace_summary_t s;
  wl_trace_analysis_summary(a, &s);
  check_common(g, &e, &s, &info);
  CU_ASSERT_EQUAL(s.source, WL_TRACE_ITER_MARKERS);
  CU_ASSERT_DOUBLE_EQUAL(s.confidence, 1.0, 1e-12);
  CU_ASSERT_DOUBLE_EQUAL(s.period_ms, e.period_ms, 1e-6);
  CU_ASSERT_DOUBLE_EQUAL(s.period_spread_ms, e.period_sd_ms, 1e-6);
  CU_ASSERT_DOUBLE_EQUAL(s.forward_ms, G_FWD_MS, 1e-6);
  CU_ASSERT_DOUBLE_EQUAL(s.backward_ms, G_BWD_MS, 1e-6);
  CU_ASSERT_DOUBLE_EQUAL(s.idle_ms, e.idle_ms, 1e-6);
  size_t n;
  const wl_trace_iteration_t *it = wl_trace_analysis_iterations(a, &n);
  CU_ASSERT_EQUAL_FATAL(n, g->iters);
  for (unsigned k = 0; k < g->iters; k++) {
    CU_ASSERT_EQUAL(it[k].begin_ns, golden_ns(golden_start_ms(g, k)));
    CU_ASSERT_EQUAL(it[k].backward_ns, golden_ns(golden_start_ms(g, k) + G_FWD_MS));
    CU_ASSERT_EQUAL(it[k].peak_bytes, e.peak);
  }
  wl_trace_analysis_destroy(a);
}

static void test_wave_golden(void) {
  const golden_t *g = &golden_set[1];
  golden_expect_t e;
  golden_expect(g, &e);
  wl_trace_reader_info_t info;
  wl_trace_analysis_t *a = analyse(gpath(g->file), &info);
  CU_ASSERT_PTR_NOT_NULL_FATAL(a);
  wl_trace_summary_t s;
  wl_trace_analysis_summary(a, &s);
  check_common(g, &e, &s, &info);
  double bin = (double)s.bin_width_ns / 1e6;
  CU_ASSERT_EQUAL(s.source, WL_TRACE_ITER_WAVE);
  CU_ASSERT(s.confidence >= 0.8);
  CU_ASSERT(fabs(s.period_ms - e.period_ms) <= 2 * bin);
  CU_ASSERT(fabs(s.period_spread_ms - e.period_sd_ms) <= 2 * bin);
  CU_ASSERT(fabs(s.forward_ms - e.peak_offset_ms) <= 2 * bin);
  CU_ASSERT(fabs(s.backward_ms - (e.fall_offset_ms - e.peak_offset_ms)) <= 2 * bin);
  size_t n;
  const wl_trace_iteration_t *it = wl_trace_analysis_iterations(a, &n);
  CU_ASSERT_EQUAL_FATAL(n, g->iters);
  for (unsigned k = 0; k < g->iters; k++) {
    double want = (double)golden_ns(golden_start_ms(g, k));
    CU_ASSERT(fabs((double)it[k].begin_ns - want) <= 2 * (double)s.bin_width_ns);
    CU_ASSERT_EQUAL(it[k].peak_bytes, e.peak);
    CU_ASSERT_EQUAL(it[k].trough_bytes, G_WEIGHTS);
  }
  wl_trace_analysis_destroy(a);
}

/* The exact combined peak of two goldens: the largest sum over every event time. */
typedef struct sum_s {
  uint64_t t[8192], live[8192];
  size_t n;
  uint64_t cur;
} sum_t;

static void sum_ev(void *arg, const wl_trace_event_t *ev) {
  sum_t *s = arg;
  if (ev->kind == WL_TRACE_ALLOC) s->cur += ev->size;
  if (ev->kind == WL_TRACE_FREE_REQ) s->cur -= ev->size;
  if (s->n < 8192) {
    s->t[s->n] = ev->time_ns;
    s->live[s->n++] = s->cur;
  }
}

static uint64_t live_at(const sum_t *s, uint64_t t) {
  uint64_t v = 0;
  for (size_t i = 0; i < s->n && s->t[i] <= t; i++) v = s->live[i];
  return v;
}

static void test_pair_golden(void) {
  const golden_t *g0 = &golden_set[2], *g1 = &golden_set[3];
  wl_trace_reader_info_t info;
  wl_trace_analysis_t *a[2] = {analyse(gpath(g0->file), &info), analyse(gpath(g1->file), &info)};
  CU_ASSERT_PTR_NOT_NULL_FATAL(a[0]);
  CU_ASSERT_PTR_NOT_NULL_FATAL(a[1]);
  for (int i = 0; i < 2; i++) {
    golden_expect_t e;
    golden_expect(&golden_set[2 + i], &e);
    wl_trace_summary_t s;
    wl_trace_analysis_summary(a[i], &s);
    wl_trace_reader_info_t inf;
    wl_trace_analysis_t *b = analyse(gpath(golden_set[2 + i].file), &inf);
    check_common(&golden_set[2 + i], &e, &s, &inf);
    wl_trace_analysis_destroy(b);
  }
  static sum_t s0, s1;
  memset(&s0, 0, sizeof s0);
  memset(&s1, 0, sizeof s1);
  static const uint32_t names[2] = {1, 2};
  golden_events(g0, sum_ev, &s0, names);
  golden_events(g1, sum_ev, &s1, names);
  uint64_t exact = 0;
  for (size_t i = 0; i < s0.n; i++) exact = GMAX(exact, s0.live[i] + live_at(&s1, s0.t[i]));
  for (size_t i = 0; i < s1.n; i++) exact = GMAX(exact, s1.live[i] + live_at(&s0, s1.t[i]));
  wl_trace_combined_t *c;
  CU_ASSERT_EQUAL_FATAL(wl_trace_combine((const wl_trace_analysis_t *const *)a, 2, 0, &c), 0);
  /* Each bin sums the maxima, an upper bound within one allocation of the exact peak. */
  CU_ASSERT(c->peak_bytes >= exact);
  CU_ASSERT(c->peak_bytes <= exact + golden_act(0));
  /* Forward passes last 40 ms, the replicas are 50 ms apart: their rises never overlap. */
  CU_ASSERT_EQUAL(c->overlap_ns, 0);
  double rising_ms = (double)c->rising_ns / 1e6, want = 2.0 * g0->iters * G_FWD_MS;
  CU_ASSERT(fabs(rising_ms - want) <= want * 0.01);
  double off[2];
  uint64_t pk;
  CU_ASSERT_EQUAL(wl_trace_best_offsets((const wl_trace_analysis_t *const *)a, 2, off, &pk), 0);
  /* The folded wave is each phase's maximum over the iterations, so with jittered iterations the
   * prediction is conservative: above one peak plus the other's trough, below two peaks, and
   * the best shift keeps the 40 ms rises apart. */
  wl_trace_summary_t s0s;
  wl_trace_analysis_summary(a[0], &s0s);
  CU_ASSERT(pk >= s0s.peak_bytes + s0s.trough_bytes);
  CU_ASSERT(pk < 2 * s0s.peak_bytes);
  CU_ASSERT(fabs(off[1] - G_PERIOD_MS / 2) <= G_PERIOD_MS / 2 - G_FWD_MS);
  /* the capacity advice, on the budget the pair ran under */
  wl_trace_capacity_t cap;
  wl_trace_summary_t s;
  wl_trace_analysis_summary(a[0], &s);
  CU_ASSERT_EQUAL(wl_trace_capacity(a[0], g0->mem_limit, 1.0, &cap), 0);
  CU_ASSERT(cap.usable);
  CU_ASSERT_EQUAL(cap.peak_bytes, s.peak_bytes);
  CU_ASSERT_EQUAL(cap.replicas_without, g0->mem_limit / s.peak_bytes);
  CU_ASSERT(cap.replicas_ticktock >= 2);
  CU_ASSERT(cap.combined_peak_bytes <= g0->mem_limit);
  wl_trace_combined_destroy(c);
  wl_trace_analysis_destroy(a[0]);
  wl_trace_analysis_destroy(a[1]);
}

/* The same wave with phase events instead of markers, and an aligned pair (written here). */
static void test_generated_variants(void) {
  golden_t g = golden_set[0];
  g.markers = 0;
  g.phases = 1;
  char p[512];
  snprintf(p, sizeof p, "%s/phases.wlt", tmpdir);
  CU_ASSERT_EQUAL_FATAL(golden_write(&g, p), 0);
  wl_trace_reader_info_t info;
  wl_trace_analysis_t *a = analyse(p, &info);
  CU_ASSERT_PTR_NOT_NULL_FATAL(a);
  wl_trace_summary_t s;
  wl_trace_analysis_summary(a, &s);
  golden_expect_t e;
  golden_expect(&g, &e);
  check_common(&g, &e, &s, &info);
  CU_ASSERT_EQUAL(s.source, WL_TRACE_ITER_PHASES);
  CU_ASSERT_DOUBLE_EQUAL(s.period_ms, e.period_ms, 1e-6);
  CU_ASSERT_DOUBLE_EQUAL(s.forward_ms, G_FWD_MS, 1e-6);
  wl_trace_analysis_destroy(a);

  golden_t g1 = golden_set[3];
  g1.offset_ms = 0;
  g1.seed = golden_set[2].seed;
  snprintf(p, sizeof p, "%s/aligned.wlt", tmpdir);
  CU_ASSERT_EQUAL_FATAL(golden_write(&g1, p), 0);
  wl_trace_analysis_t *b[2] = {analyse(gpath(golden_set[2].file), &info), analyse(p, &info)};
  wl_trace_combined_t *c;
  CU_ASSERT_EQUAL_FATAL(wl_trace_combine((const wl_trace_analysis_t *const *)b, 2, 0, &c), 0);
  wl_trace_analysis_summary(b[0], &s);
  CU_ASSERT_EQUAL(c->peak_bytes, 2 * s.peak_bytes);
  CU_ASSERT(c->overlap_ns * 100 >= c->rising_ns * 99);
  wl_trace_combined_destroy(c);
  wl_trace_analysis_destroy(b[0]);
  wl_trace_analysis_destroy(b[1]);
}

/* A golden cut where a crash would cut it: at a block boundary, and inside a block. */
static void test_cut_goldens(void) {
  size_t len = 0;
  uint8_t *b = slurp(gpath(golden_set[0].file), &len);
  CU_ASSERT_PTR_NOT_NULL_FATAL(b);
  /* the boundary before the last block (the END record's) */
  size_t off = WL_TRACE_HEADER_SIZE, last = off;
  while (off + WL_TRACE_BLOCK_HEADER <= len) {
    last = off;
    off += WL_TRACE_BLOCK_HEADER + (size_t)b[off + 4] + ((size_t)b[off + 5] << 8) +
           ((size_t)b[off + 6] << 16);
  }
  char p[512];
  snprintf(p, sizeof p, "%s/crashed.wlt", tmpdir);
  FILE *f = fopen(p, "wb");
  fwrite(b, 1, last, f);
  fclose(f);
  wl_trace_reader_info_t info;
  wl_trace_analysis_t *a = analyse(p, &info);
  CU_ASSERT_PTR_NOT_NULL_FATAL(a);
  CU_ASSERT_EQUAL(info.complete, 0);
  CU_ASSERT_EQUAL(info.truncated, 0);
  wl_trace_summary_t s;
  wl_trace_analysis_summary(a, &s);
  CU_ASSERT_EQUAL(s.iterations, golden_set[0].iters);
  wl_trace_analysis_destroy(a);
  /* cut in the middle of the first block: strict refuses, salvage reports the prefix */
  size_t cut = WL_TRACE_HEADER_SIZE + 1000;
  f = fopen(p, "wb");
  fwrite(b, 1, cut, f);
  fclose(f);
  char err[600];
  CU_ASSERT_EQUAL(wl_trace_analyze_file(p, 0, NULL, &a, &info, err, sizeof err), -ENODATA);
  CU_ASSERT_PTR_NULL(a);
  char want[64];
  snprintf(want, sizeof want, ": byte %zu: truncated", cut);
  CU_ASSERT_PTR_NOT_NULL(strstr(err, want));
  CU_ASSERT_PTR_NOT_NULL(strstr(err, p));
  CU_ASSERT_EQUAL(wl_trace_analyze_file(p, WL_TRACE_OPEN_SALVAGE, NULL, &a, &info, err, sizeof err),
                  0);
  CU_ASSERT_PTR_NOT_NULL_FATAL(a);
  CU_ASSERT(info.truncated);
  CU_ASSERT(info.salvaged);
  wl_trace_analysis_summary(a, &s);
  CU_ASSERT(s.events > 0 && s.events < (1000 - 8) / 40 + 1); /* whole 40-byte records only */
  wl_trace_analysis_destroy(a);
  free(b);
}

int main(int argc, char **argv) {
  snprintf(tmpdir, sizeof tmpdir, "/tmp/wl-test-trace-golden-XXXXXX");
  if (!mkdtemp(tmpdir)) return 2;
  static const wl_test_case_t cases[] = {
      {"checked_in_files_match_the_generator", test_checked_in_files_match_the_generator},
      {"markers_golden", test_markers_golden},
      {"wave_golden", test_wave_golden},
      {"pair_golden", test_pair_golden},
      {"generated_variants", test_generated_variants},
      {"cut_goldens", test_cut_goldens},
      {NULL, NULL}};
  int rc = wl_test_main(argc, argv, "trace_golden", cases);
  char cmd[512];
  snprintf(cmd, sizeof cmd, "rm -rf '%s'", tmpdir);
  if (system(cmd)) {
  }
  return rc;
}
