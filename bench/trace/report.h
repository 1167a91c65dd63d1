/* wavelet-trace's report: the analysed traces and what the renderers (text, JSON, SVG, Perfetto,
 * CSV) share. */
#ifndef WAVELET_BENCH_TRACE_REPORT_H
#define WAVELET_BENCH_TRACE_REPORT_H

#include "wavelet/trace.h"

#include <stdio.h>

typedef struct wlt_proc_s {
  const char *path;
  wl_trace_analysis_t *a;
  wl_trace_summary_t s;
  wl_trace_reader_info_t info;
  const wl_trace_bin_t *bins;
  const uint8_t *flags;
  size_t nbins;
  uint64_t t0, width;
  const wl_trace_iteration_t *iters;
  size_t niters;
  const wl_trace_span_t *spans;
  size_t nspans;
  char label[80]; /* "pid 1001 (role 0)" */
} wlt_proc_t;

typedef struct wlt_report_s {
  wlt_proc_t *p;
  size_t k;
  wl_trace_combined_t *comb; /* NULL for one trace */
  uint64_t tmin, tmax;       /* first and last event over all traces */
  uint64_t capacity;         /* 0: none known */
  int capacity_given;        /* from --capacity, not from the trace header */
  int have_cap;
  wl_trace_capacity_t cap;
  int have_offsets;
  double offsets_ms[WL_TRACE_MAX_REPLICAS];
  uint64_t offsets_peak;
} wlt_report_t;

/* report.c: `wavelet-trace report ARGS...` (argv without the "report"): prints the report,
 * writes the files asked for, returns the exit status (0, 1 a file could not be written, 2 bad
 * arguments or a trace that cannot be read). */
int wlt_report_main(int argc, char **argv);
extern const char wlt_report_usage[];

/* render.c: 0, or -errno when the file cannot be written (the caller says so). */
int wlt_write_svg(const wlt_report_t *r, const char *path);
int wlt_write_perfetto(const wlt_report_t *r, const char *path);
int wlt_write_csv(const wlt_report_t *r, const char *path);

/* A string as a JSON string literal: quotes, backslashes, control and non-ASCII bytes escaped
 * (bytes >= 0x80 as \u00XX), so the output is valid JSON whatever the trace's names hold. */
void wlt_json_str(FILE *f, const char *s);
/* A double for JSON: finite values with %.*f, anything else as null. */
void wlt_json_num(FILE *f, double v, int prec);

/* The budget line of process i (mem_limit of its header, else the report's capacity), 0: none. */
uint64_t wlt_budget(const wlt_report_t *r, size_t i);

#endif
