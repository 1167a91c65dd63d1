/* wavelet-trace report: reads, analyses and prints memory-wave traces (summary table or JSON, SVG,
 * Perfetto and CSV files, and how many replicas would fit with and without tick-tock). Shared by
 * wavelet-trace and wavelet-run. */
#include "log.h"
#include "report.h"
#include "util.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

const char wlt_report_usage[] =
    "usage: wavelet-trace report FILE... [--json] [--svg OUT] [--perfetto OUT] [--csv OUT] "
    "[--capacity BYTES] [--busy FRACTION] [--partial] [--bins N]";

static int report_usage(void) {
  fprintf(stderr, "%s\n", wlt_report_usage);
  return 2;
}

static const char *src_name(wl_trace_iter_source_t s) {
  switch (s) {
  case WL_TRACE_ITER_MARKERS:
    return "markers";
  case WL_TRACE_ITER_PHASES:
    return "phase events";
  case WL_TRACE_ITER_WAVE:
    return "wave";
  default:
    return "none";
  }
}

static const char *fmtb(uint64_t b, char *buf, size_t len) {
  return wl__fmt_bytes((size_t)b, buf, len);
}

/* ---- the text table
 * ----------------------------------------------------------------------------*/

/* Built whole, then printed with each column as wide as its longest value, so nothing is cut
 * (it used to cut at 23 characters: "15.2 GiB at 3000000.0 m"). Cells live in one growing
 * buffer; ends[] holds each cell's end offset, or ROW_END after a row's last. */
#define NAME_W   22 /* the narrowest the row names' column gets */
#define COL_W    23 /* and each value column */
#define MAX_COLS (WL_TRACE_MAX_REPLICAS + 2)
#define ROW_END  SIZE_MAX

typedef struct table_s {
  char *buf;
  size_t len, cap;
  size_t *ends;
  size_t n, ncap;
  int failed;
} table_t;

static void table_mark(table_t *t, size_t end) {
  if (t->failed) return;
  if (t->n == t->ncap) {
    size_t nc = t->ncap ? 2 * t->ncap : 256;
    size_t *e = realloc(t->ends, nc * sizeof *e);
    if (!e) {
      t->failed = 1;
      return;
    }
    t->ends = e;
    t->ncap = nc;
  }
  t->ends[t->n++] = end;
}

static void cell(table_t *t, const char *s) {
  size_t k = strlen(s) + 1;
  if (t->failed) return;
  if (t->len + k > t->cap) {
    size_t nc = WL_MAX(2 * t->cap, t->len + k + 4096);
    char *b = realloc(t->buf, nc);
    if (!b) {
      t->failed = 1;
      return;
    }
    t->buf = b;
    t->cap = nc;
  }
  memcpy(t->buf + t->len, s, k);
  t->len += k;
  table_mark(t, t->len);
}

static void row_begin(table_t *t, const char *name) {
  cell(t, name);
}

static void row_end(table_t *t) {
  table_mark(t, ROW_END);
}

static void table_print(table_t *t) {
  if (t->failed) {
    printf("(no memory for the table)\n");
  } else {
    size_t w[MAX_COLS] = {0}, c = 0, start = 0;
    for (size_t i = 0; i < t->n; i++) {
      if (t->ends[i] == ROW_END) {
        c = 0;
        continue;
      }
      size_t l = t->ends[i] - 1 - start;
      if (c < MAX_COLS && l > w[c]) w[c] = l;
      start = t->ends[i];
      c++;
    }
    start = 0;
    c = 0;
    for (size_t i = 0; i < t->n; i++) {
      if (t->ends[i] == ROW_END) {
        printf("\n");
        c = 0;
        continue;
      }
      size_t cw = c < MAX_COLS ? w[c] : 0;
      if (c == 0)
        printf("%-*s", (int)WL_MAX(cw, NAME_W), t->buf + start);
      else
        printf(" %-*s", (int)WL_MAX(cw, COL_W), t->buf + start);
      start = t->ends[i];
      c++;
    }
  }
  free(t->buf);
  free(t->ends);
}

static void print_table(const wlt_report_t *r) {
  char b[320], x[32], y[32];
  printf("wavelet-trace report: %zu trace%s\n\n", r->k, r->k == 1 ? "" : "s");
  table_t t = {0};
  row_begin(&t, "");
  for (size_t i = 0; i < r->k; i++) cell(&t, r->p[i].label);
  if (r->comb) cell(&t, "combined");
  row_end(&t);
#define ROW(name, ...)                                                                             \
  do {                                                                                             \
    row_begin(&t, name);                                                                           \
    for (size_t i = 0; i < r->k; i++) {                                                            \
      const wlt_proc_t *p = &r->p[i];                                                              \
      const wl_trace_summary_t *s = &p->s;                                                         \
      (void)s;                                                                                     \
      snprintf(b, sizeof b, __VA_ARGS__);                                                          \
      cell(&t, b);                                                                                 \
    }                                                                                              \
  } while (0)
#define ROWX(name, code)                                                                           \
  do {                                                                                             \
    row_begin(&t, name);                                                                           \
    for (size_t i = 0; i < r->k; i++) {                                                            \
      const wl_trace_summary_t *s = &r->p[i].s;                                                    \
      code;                                                                                        \
      cell(&t, b);                                                                                 \
    }                                                                                              \
  } while (0)
  ROW("file", "%s", strrchr(p->path, '/') ? strrchr(p->path, '/') + 1 : p->path);
  row_end(&t);
  ROW("device", "%s", s->header.device_name[0] ? s->header.device_name : "?");
  row_end(&t);
  ROW("events", "%llu", (unsigned long long)s->events);
  row_end(&t);
  ROW("duration", "%.3f s", (double)(s->last_ns - s->first_ns) / 1e9);
  row_end(&t);
  ROW("allocations / frees", "%llu / %llu", (unsigned long long)s->allocs,
      (unsigned long long)s->frees);
  row_end(&t);
  /* No allocation, no peak: peak_ns is then 0, and no time to give. */
  ROWX("live peak",
       if (s->peak_bytes) snprintf(b, sizeof b, "%s at %.1f ms", fmtb(s->peak_bytes, x, sizeof x),
                                   (double)(s->peak_ns - r->tmin) / 1e6);
       else snprintf(b, sizeof b, "-"));
  if (r->comb) cell(&t, fmtb(r->comb->peak_bytes, x, sizeof x));
  row_end(&t);
  ROW("live trough", "%s", fmtb(s->trough_bytes, x, sizeof x));
  if (r->comb) cell(&t, fmtb(r->comb->trough_bytes, x, sizeof x));
  row_end(&t);
  ROW("physical peak", "%s",
      s->physical_peak_bytes ? fmtb(s->physical_peak_bytes, x, sizeof x) : "not traced");
  if (r->comb)
    cell(&t,
         r->comb->physical_traced ? fmtb(r->comb->physical_peak_bytes, x, sizeof x) : "not traced");
  row_end(&t);
  ROWX("fragmentation",
       if (s->fragmentation > 0) snprintf(b, sizeof b, "%.2f (physical/live)", s->fragmentation);
       else snprintf(b, sizeof b, "-"));
  row_end(&t);
  ROW("iterations", "%llu (%s, conf %.2f)", (unsigned long long)s->iterations, src_name(s->source),
      s->confidence);
  row_end(&t);
  ROWX("period", if (s->iterations > 1)
                     snprintf(b, sizeof b, "%.2f ms +- %.2f", s->period_ms, s->period_spread_ms);
       else snprintf(b, sizeof b, "-"));
  row_end(&t);
  ROWX("forward / backward",
       if (s->iterations) snprintf(b, sizeof b, "%.1f / %.1f ms", s->forward_ms, s->backward_ms);
       else snprintf(b, sizeof b, "-"));
  row_end(&t);
  ROWX("idle", if (s->iterations) snprintf(b, sizeof b, "%.1f ms", s->idle_ms);
       else snprintf(b, sizeof b, "-"));
  row_end(&t);
  ROW("gate wait", "%.1f ms (%llu waits)", (double)s->gate_wait_ns / 1e6,
      (unsigned long long)s->gate_waits);
  row_end(&t);
  ROW("memory wait", "%.1f ms (%llu waits)", (double)s->budget_wait_ns / 1e6,
      (unsigned long long)s->budget_waits);
  row_end(&t);
  ROW("denials / OOMs", "%llu / %llu", (unsigned long long)s->budget_denials,
      (unsigned long long)s->ooms);
  row_end(&t);
  ROW("events dropped", "%llu", (unsigned long long)s->dropped);
  row_end(&t);
  ROW("ended", "%s",
      p->info.truncated   ? "cut short (--partial)"
      : p->info.complete  ? "cleanly"
      : p->info.recovered ? "died (rings recovered)"
                          : "without end record");
  row_end(&t);
  ROW("resolution", "%.1f us bins", (double)s->bin_width_ns / 1e3);
  row_end(&t);
#undef ROW
#undef ROWX
  table_print(&t);
  for (size_t i = 0; i < r->k; i++) {
    const wl_trace_summary_t *s = &r->p[i].s;
    if (!s->iterations && s->candidate_period_ms > 0)
      printf("\n%s: no iterations found (best candidate: period %.2f ms, confidence %.2f)\n",
             r->p[i].label, s->candidate_period_ms, s->confidence);
    else if (!s->iterations)
      printf("\n%s: no iterations found (no repeating rise and fall in the wave)\n", r->p[i].label);
    if (s->dropped)
      printf("\n%s: %llu events were dropped while tracing: live bytes may be off\n", r->p[i].label,
             (unsigned long long)s->dropped);
  }
  if (r->comb) {
    const wl_trace_combined_t *c = r->comb;
    double frac = c->rising_ns ? (double)c->overlap_ns / (double)c->rising_ns : 0;
    printf("\ncombined wave: peak %s, trough %s\n", fmtb(c->peak_bytes, x, sizeof x),
           fmtb(c->trough_bytes, y, sizeof y));
    if (!c->rising_ns) {
      printf("rising phases: unknown (no iterations found)\n");
    } else {
      printf("rising phases overlapped for %.1f ms of %.1f ms rising (%.1f %%): %s\n",
             (double)c->overlap_ns / 1e6, (double)c->rising_ns / 1e6, 100 * frac,
             c->overlap_ns ? "they did overlap" : "they never overlapped (tick-tock held)");
      if (c->rising_bin_ns)
        printf("  (to within %.1f us bins: some traces' rising phases are known only to their "
               "bins, their iterations found in the wave or more than were kept)\n",
               (double)c->rising_bin_ns / 1e3);
      else
        printf("  (exact: from each trace's markers or phase events)\n");
    }
    if (r->have_offsets) {
      printf("best phase offsets of these traces:");
      for (size_t i = 0; i < r->k; i++) printf(" %.1f", r->offsets_ms[i]);
      printf(" ms: combined peak at most %s (each phase's worst iteration; measured %s)\n",
             fmtb(r->offsets_peak, x, sizeof x), fmtb(c->peak_bytes, y, sizeof y));
    }
  }
  if (r->have_cap) {
    const wl_trace_capacity_t *c = &r->cap;
    printf("\nadvice for %s (%s):\n", fmtb(c->capacity_bytes, x, sizeof x),
           r->capacity_given ? "--capacity" : "the traced device's memory");
    if (!c->usable) {
      printf("  no iterations found in %s, so there is no wave to shift\n", r->p[0].label);
    } else {
      printf("  one replica's wave (%s) peaks at %s over a %.1f ms iteration", r->p[0].label,
             fmtb(c->peak_bytes, x, sizeof x), c->period_ms);
      if (c->fragmentation > 1.0)
        printf(" (physical memory: its live bytes x %.3f, its fragmentation at the peak)",
               c->fragmentation);
      printf("\n");
      printf("  replicas that fit without tick-tock: %u (each needs its full peak)\n",
             c->replicas_without);
      printf("  replicas that fit with tick-tock:    %u", c->replicas_ticktock);
      if (c->replicas_ticktock) {
        printf(" at offsets");
        for (unsigned i = 0; i < c->replicas_ticktock; i++)
          printf("%s %.1f", i ? "," : "", c->offsets_ms[i]);
        printf(" ms (combined peak %s)", fmtb(c->combined_peak_bytes, x, sizeof x));
      }
      printf("\n  predicted throughput vs one replica alone: tick-tock %.2fx, without %.2fx\n",
             c->throughput_ticktock, c->throughput_without);
      printf("  model: %s\n", c->model);
    }
  }
}

/* ---- JSON
 * --------------------------------------------------------------------------------------*/

static void json_proc(FILE *f, const wlt_proc_t *p) {
  const wl_trace_summary_t *s = &p->s;
  fprintf(f, "{\"file\":");
  wlt_json_str(f, p->path);
  fprintf(f, ",\"pid\":%u,\"role\":%d,\"device\":%d,\"device_name\":", s->header.pid,
          s->header.role, s->header.device);
  wlt_json_str(f, s->header.device_name);
  fprintf(f, ",\"command\":");
  wlt_json_str(f, s->header.command);
  fprintf(f, ",\"device_capacity_bytes\":%llu,\"mem_limit_bytes\":%llu",
          (unsigned long long)s->header.device_capacity, (unsigned long long)s->header.mem_limit);
  fprintf(f, ",\"events\":%llu,\"allocs\":%llu,\"frees\":%llu,\"launches\":%llu",
          (unsigned long long)s->events, (unsigned long long)s->allocs,
          (unsigned long long)s->frees, (unsigned long long)s->launches);
  fprintf(f, ",\"duration_ms\":");
  wlt_json_num(f, (double)(s->last_ns - s->first_ns) / 1e6, 3);
  fprintf(f, ",\"peak_bytes\":%llu,\"peak_time_ms\":", (unsigned long long)s->peak_bytes);
  if (s->peak_bytes)
    wlt_json_num(f, (double)(s->peak_ns - s->first_ns) / 1e6, 3);
  else
    fputs("null", f); /* no allocation: no peak, and no time for one */
  fprintf(f, ",\"trough_bytes\":%llu,\"physical_peak_bytes\":%llu,\"fragmentation\":",
          (unsigned long long)s->trough_bytes, (unsigned long long)s->physical_peak_bytes);
  if (s->fragmentation > 0)
    wlt_json_num(f, s->fragmentation, 4);
  else
    fputs("null", f);
  fprintf(f, ",\"iterations\":%llu,\"iteration_source\":\"%s\",\"confidence\":",
          (unsigned long long)s->iterations, src_name(s->source));
  wlt_json_num(f, s->confidence, 3);
  fprintf(f, ",\"period_ms\":");
  if (s->iterations > 1) {
    wlt_json_num(f, s->period_ms, 4);
    fprintf(f, ",\"period_spread_ms\":");
    wlt_json_num(f, s->period_spread_ms, 4);
  } else {
    fprintf(f, "null,\"period_spread_ms\":null");
  }
  fprintf(f, ",\"candidate_period_ms\":");
  wlt_json_num(f, s->candidate_period_ms, 4);
  fprintf(f, ",\"forward_ms\":");
  wlt_json_num(f, s->forward_ms, 4);
  fprintf(f, ",\"backward_ms\":");
  wlt_json_num(f, s->backward_ms, 4);
  fprintf(f, ",\"idle_ms\":");
  wlt_json_num(f, s->idle_ms, 4);
  fprintf(f, ",\"gate_waits\":%llu,\"gate_wait_ms\":", (unsigned long long)s->gate_waits);
  wlt_json_num(f, (double)s->gate_wait_ns / 1e6, 4);
  fprintf(f, ",\"memory_waits\":%llu,\"memory_wait_ms\":", (unsigned long long)s->budget_waits);
  wlt_json_num(f, (double)s->budget_wait_ns / 1e6, 4);
  fprintf(f, ",\"budget_denials\":%llu,\"ooms\":%llu,\"dropped_events\":%llu",
          (unsigned long long)s->budget_denials, (unsigned long long)s->ooms,
          (unsigned long long)s->dropped);
  fprintf(f, ",\"complete\":%s,\"truncated\":%s,\"recovered_events\":%llu,\"bin_width_us\":",
          p->info.complete ? "true" : "false", p->info.truncated ? "true" : "false",
          (unsigned long long)p->info.recovered);
  wlt_json_num(f, (double)s->bin_width_ns / 1e3, 3);
  fprintf(f, "}");
}

static void print_json(const wlt_report_t *r) {
  FILE *f = stdout;
  fprintf(f, "{\"tool\":\"wavelet-trace\",\"format_version\":\"%d.%d\",\"processes\":[",
          WL_TRACE_VERSION_MAJOR, WL_TRACE_VERSION_MINOR);
  uint64_t iters = 0;
  double psum = 0;
  unsigned pn = 0;
  for (size_t i = 0; i < r->k; i++) {
    if (i) fputc(',', f);
    json_proc(f, &r->p[i]);
    iters += r->p[i].s.iterations;
    if (r->p[i].s.iterations > 1) {
      psum += r->p[i].s.period_ms;
      pn++;
    }
  }
  fprintf(f, "]");
  /* The headline fields: the one process, or for several the combined wave. */
  uint64_t peak = r->comb ? r->comb->peak_bytes : r->p[0].s.peak_bytes;
  uint64_t trough = r->comb ? r->comb->trough_bytes : r->p[0].s.trough_bytes;
  fprintf(f, ",\"peak_bytes\":%llu,\"trough_bytes\":%llu,\"iterations\":%llu,\"period_ms\":",
          (unsigned long long)peak, (unsigned long long)trough, (unsigned long long)iters);
  if (pn)
    wlt_json_num(f, psum / pn, 4);
  else
    fputs("null", f);
  fprintf(f, ",\"combined\":");
  if (r->comb) {
    const wl_trace_combined_t *c = r->comb;
    fprintf(f, "{\"peak_bytes\":%llu,\"trough_bytes\":%llu,\"physical_peak_bytes\":",
            (unsigned long long)c->peak_bytes, (unsigned long long)c->trough_bytes);
    if (c->physical_traced)
      fprintf(f, "%llu", (unsigned long long)c->physical_peak_bytes);
    else
      fputs("null", f); /* not every trace has its physical memory */
    fprintf(f, ",\"rising_ms\":");
    wlt_json_num(f, (double)c->rising_ns / 1e6, 3);
    fprintf(f, ",\"rising_overlap_ms\":");
    wlt_json_num(f, (double)c->overlap_ns / 1e6, 3);
    fprintf(f, ",\"rising_overlap_fraction\":");
    wlt_json_num(f, c->rising_ns ? (double)c->overlap_ns / (double)c->rising_ns : 0, 4);
    fprintf(f, ",\"rising_overlapped\":%s", c->overlap_ns ? "true" : "false");
    /* null: exact, from markers or phase events; otherwise the bins that stood in for them. */
    fprintf(f, ",\"rising_resolution_us\":");
    if (c->rising_bin_ns)
      wlt_json_num(f, (double)c->rising_bin_ns / 1e3, 3);
    else
      fputs("null", f);
    fprintf(f, ",\"best_offsets_ms\":");
    if (r->have_offsets) {
      fputc('[', f);
      for (size_t i = 0; i < r->k; i++) {
        if (i) fputc(',', f);
        wlt_json_num(f, r->offsets_ms[i], 3);
      }
      fprintf(f, "],\"best_offsets_peak_bytes\":%llu}", (unsigned long long)r->offsets_peak);
    } else {
      fprintf(f, "null,\"best_offsets_peak_bytes\":null}");
    }
  } else {
    fputs("null", f);
  }
  fprintf(f, ",\"capacity\":");
  if (r->have_cap && r->cap.usable) {
    const wl_trace_capacity_t *c = &r->cap;
    fprintf(f, "{\"capacity_bytes\":%llu,\"source\":\"%s\",\"wave_peak_bytes\":%llu",
            (unsigned long long)c->capacity_bytes, r->capacity_given ? "option" : "trace header",
            (unsigned long long)c->peak_bytes);
    fprintf(f, ",\"fragmentation\":");
    wlt_json_num(f, c->fragmentation, 4);
    fprintf(f, ",\"replicas_without\":%u,\"replicas_ticktock\":%u,\"combined_peak_bytes\":%llu",
            c->replicas_without, c->replicas_ticktock, (unsigned long long)c->combined_peak_bytes);
    fprintf(f, ",\"offsets_ms\":[");
    for (unsigned i = 0; i < c->replicas_ticktock; i++) {
      if (i) fputc(',', f);
      wlt_json_num(f, c->offsets_ms[i], 3);
    }
    fprintf(f, "],\"period_ms\":");
    wlt_json_num(f, c->period_ms, 4);
    fprintf(f, ",\"work_ms\":");
    wlt_json_num(f, c->work_ms, 4);
    fprintf(f, ",\"busy\":");
    wlt_json_num(f, c->busy, 3);
    fprintf(f, ",\"throughput_ratio_ticktock\":");
    wlt_json_num(f, c->throughput_ticktock, 4);
    fprintf(f, ",\"throughput_ratio_without\":");
    wlt_json_num(f, c->throughput_without, 4);
    fprintf(f, ",\"model\":");
    wlt_json_str(f, c->model);
    fprintf(f, "}");
  } else if (r->have_cap) {
    fprintf(f, "{\"capacity_bytes\":%llu,\"usable\":false,\"why\":\"no iterations found\"}",
            (unsigned long long)r->cap.capacity_bytes);
  } else {
    fputs("null", f);
  }
  fprintf(f, "}\n");
}

/* ---- report
 * ------------------------------------------------------------------------------------*/

int wlt_report_main(int argc, char **argv) {
  const char *svg = NULL, *perfetto = NULL, *csv = NULL, *cap_s = NULL;
  int json = 0, partial = 0;
  double busy = 1.0;
  wl_trace_analysis_config_t acfg;
  wl_trace_analysis_config_default(&acfg);
  const char **files = calloc((size_t)argc, sizeof *files);
  size_t k = 0;
  if (!files) return 1;
  int opts = 1;
  for (int i = 0; i < argc; i++) {
    const char *a = argv[i];
    int more = i + 1 < argc;
    if (opts && !strcmp(a, "--")) {
      opts = 0;
    } else if (opts && !strcmp(a, "--json")) {
      json = 1;
    } else if (opts && !strcmp(a, "--partial")) {
      partial = 1;
    } else if (opts && (!strcmp(a, "--svg") || !strcmp(a, "--perfetto") || !strcmp(a, "--csv") ||
                        !strcmp(a, "--capacity") || !strcmp(a, "--busy") || !strcmp(a, "--bins"))) {
      if (!more) {
        fprintf(stderr, "wavelet-trace: %s needs a value\n", a);
        free(files);
        return report_usage();
      }
      const char *v = argv[++i];
      if (!strcmp(a, "--svg"))
        svg = v;
      else if (!strcmp(a, "--perfetto"))
        perfetto = v;
      else if (!strcmp(a, "--csv"))
        csv = v;
      else if (!strcmp(a, "--capacity"))
        cap_s = v;
      else if (!strcmp(a, "--busy")) {
        char *end;
        busy = strtod(v, &end);
        if (*end || !(busy > 0 && busy <= 1)) {
          fprintf(stderr, "wavelet-trace: --busy wants a fraction in (0, 1], not '%s'\n", v);
          free(files);
          return report_usage();
        }
      } else {
        size_t nb = 0;
        if (wl__parse_size(v, 0, &nb) || !wl__is_pow2(nb) || nb < 64 || nb > (1u << 20)) {
          fprintf(stderr, "wavelet-trace: --bins wants a power of two from 64 to 1M, not '%s'\n",
                  v);
          free(files);
          return report_usage();
        }
        acfg.bins = nb;
      }
    } else if (opts && a[0] == '-' && a[1]) {
      fprintf(stderr, "wavelet-trace: unknown option '%s'\n", a);
      free(files);
      return report_usage();
    } else {
      files[k++] = a;
    }
  }
  if (!k) {
    fprintf(stderr, "wavelet-trace: report needs at least one trace file\n");
    free(files);
    return report_usage();
  }
  if (k > WL_TRACE_MAX_REPLICAS) {
    fprintf(stderr, "wavelet-trace: at most %d traces at once\n", WL_TRACE_MAX_REPLICAS);
    free(files);
    return 2;
  }
  size_t capacity = 0;
  if (cap_s && (wl__parse_size(cap_s, 0, &capacity) || capacity == 0)) {
    fprintf(stderr, "wavelet-trace: --capacity wants a size such as 80G or 81920M, not '%s'\n",
            cap_s);
    free(files);
    return report_usage();
  }

  wlt_report_t r;
  memset(&r, 0, sizeof r);
  r.p = calloc(k, sizeof *r.p);
  if (!r.p) return 1;
  r.k = k;
  int status = 0;
  r.tmin = UINT64_MAX;
  for (size_t i = 0; i < k; i++) {
    wlt_proc_t *p = &r.p[i];
    char err[600];
    p->path = files[i];
    int rc = wl_trace_analyze_file(files[i], partial ? WL_TRACE_OPEN_SALVAGE : 0, &acfg, &p->a,
                                   &p->info, err, sizeof err);
    if (rc) {
      if (rc == -ENODATA && !partial && p->info.offset >= WL_TRACE_HEADER_SIZE)
        wl__error("%s (--partial reports the records before the cut)", err);
      else
        wl__error("%s", err);
      status = 2;
      break;
    }
    if (p->info.truncated)
      wl__warn("%s: reporting the records before the cut", err);
    else if (!p->info.complete && p->info.recovered)
      wl__warn("%s: the process died without closing its trace; %llu events after its last "
               "block were recovered from %s%s",
               files[i], (unsigned long long)p->info.recovered, files[i], WL_TRACE_RINGS_SUFFIX);
    else if (!p->info.complete)
      wl__warn("%s: byte %llu: no end record: the process did not exit cleanly or is still "
               "writing; reporting up to there",
               files[i], (unsigned long long)p->info.offset);
    wl_trace_analysis_summary(p->a, &p->s);
    p->bins = wl_trace_analysis_bins(p->a, &p->nbins, &p->t0, &p->width, &p->flags);
    p->iters = wl_trace_analysis_iterations(p->a, &p->niters);
    p->spans = wl_trace_analysis_spans(p->a, &p->nspans);
    if (p->s.header.role >= 0)
      snprintf(p->label, sizeof p->label, "pid %u (role %d)", p->s.header.pid, p->s.header.role);
    else
      snprintf(p->label, sizeof p->label, "pid %u", p->s.header.pid);
    if (p->s.events) {
      if (p->s.first_ns < r.tmin) r.tmin = p->s.first_ns;
      if (p->s.last_ns > r.tmax) r.tmax = p->s.last_ns;
    }
  }
  if (status) goto out;
  if (r.tmin == UINT64_MAX) r.tmin = r.tmax = 0;

  const wl_trace_analysis_t **as = malloc(k * sizeof *as);
  if (!as) {
    status = 1;
    goto out;
  }
  for (size_t i = 0; i < k; i++) as[i] = r.p[i].a;
  if (k > 1) {
    if (wl_trace_combine(as, k, 0, &r.comb)) r.comb = NULL;
    if (wl_trace_best_offsets(as, k, r.offsets_ms, &r.offsets_peak) == 0) r.have_offsets = 1;
  }
  free(as);
  r.capacity = capacity ? capacity : r.p[0].s.header.device_capacity;
  r.capacity_given = capacity != 0;
  if (r.capacity && wl_trace_capacity(r.p[0].a, r.capacity, busy, &r.cap) == 0) r.have_cap = 1;

  if (json)
    print_json(&r);
  else
    print_table(&r);
  static const struct {
    const char *what;
    int (*fn)(const wlt_report_t *, const char *);
  } outs[] = {{"svg", wlt_write_svg}, {"perfetto", wlt_write_perfetto}, {"csv", wlt_write_csv}};
  const char *paths[] = {svg, perfetto, csv};
  for (int i = 0; i < 3; i++) {
    if (!paths[i]) continue;
    int rc = outs[i].fn(&r, paths[i]);
    if (rc) {
      wl__error("%s: cannot write the %s file: %s", paths[i], outs[i].what, strerror(-rc));
      status = 1;
    } else if (!json) {
      printf("%s: wrote %s\n", outs[i].what, paths[i]);
    }
  }
out:
  for (size_t i = 0; i < k; i++) wl_trace_analysis_destroy(r.p[i].a);
  wl_trace_combined_destroy(r.comb);
  free(r.p);
  free(files);
  return status;
}
