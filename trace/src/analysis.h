/* The analysis object, shared by the streaming pass (analysis.c), the wave detector (detect.c)
 * and the combination and advice (combine.c). */
#ifndef WAVELET_TRACE_ANALYSIS_H
#define WAVELET_TRACE_ANALYSIS_H

#include "internal.h"

/* Running mean and variance (Welford), so statistics need no per-iteration storage. */
typedef struct wl__stat_s {
  uint64_t n;
  double mean, m2;
} wl__stat_t;

static inline void wl__stat_add(wl__stat_t *s, double x) {
  s->n++;
  double d = x - s->mean;
  s->mean += d / (double)s->n;
  s->m2 += d * (x - s->mean);
}

static inline double wl__stat_sd(const wl__stat_t *s) {
  return s->n > 1 ? __builtin_sqrt(s->m2 / (double)(s->n - 1)) : 0.0;
}

/* A double as bytes, saturating: sums of hostile sizes may pass 2^64. */
static inline uint64_t wl__to_u64(double v) {
  if (!(v > 0)) return 0;
  return v >= 18446744073709551615.0 ? UINT64_MAX : (uint64_t)v;
}

typedef struct wl__rise_s {
  uint64_t b, e;
} wl__rise_t;

/* Physical memory (mapped plus cached) from time t on. */
typedef struct wl__pstep_s {
  uint64_t t, bytes;
} wl__pstep_t;

struct wl_trace_analysis_s {
  wl_trace_header_t hdr;
  size_t max_iterations, max_spans;

  /* the wave */
  wl_trace_bin_t *bins;
  uint8_t *flags;
  size_t nbins, used, cur;
  unsigned shift;
  uint64_t t0;
  int started, finished;

  uint64_t live, mapped, cached, last_t;
  int phys_seen;

  wl_trace_summary_t s;

  /* iterations: the list kept for output, and statistics over all of them */
  wl_trace_iteration_t *iters;
  size_t niters;
  uint64_t iter_count;
  wl__stat_t period, fwd, bwd, idle, peak;
  uint64_t trough_min;

  /* the explicit tracker (markers or phase events) */
  wl_trace_iter_source_t xsrc;
  int open, phase; /* phase: 0 none, 1 forward, 2 backward, 3 idle */
  /* Forward begun, no allocation or launch since: a member waiting for the gate's token after
   * its iteration began is not rising yet, and its bins are not flagged forward. */
  int rise_wait;
  wl_trace_iteration_t it;
  uint64_t last_begin, last_fall;
  int have_last;
  size_t last_index; /* where the previous iteration sits in iters, or SIZE_MAX */

  wl_trace_span_t *spans;
  size_t nspans;

  /* The rising (forward) phases from markers or phase events, each [b, e) exactly as the events
   * gave it, in time order (at most max_iterations + 1): the combined wave's overlap is decided
   * on these, since bins shared by two processes' adjacent phases would make them look
   * overlapped. rises_lost: more than that, or iterations found in the wave; combine.c then
   * falls back on the flagged bins. */
  wl__rise_t *rises;
  size_t nrises;
  int rises_lost;
  uint64_t rise_ns; /* start of the rise under way (phase 1, rise_wait 0) */

  /* Every change of physical memory (MAP, UNMAP, PHYS_RELEASE: one a chunk, so few), in time
   * order: the combined physical peak is swept from them exactly, since a chunk one process gives
   * back and another takes within one bin would count twice in the bins. psteps_lost: more than
   * max_psteps, or memory ran out; combine.c then takes the bins' upper bound. */
  wl__pstep_t *psteps;
  size_t npsteps, cap_psteps, max_psteps;
  int psteps_lost;
};

/* detect.c: finds iterations in the binned wave and records them in a (source WAVE). */
int wl__detect_wave(wl_trace_analysis_t *a);

/* analysis.c: appends an iteration to the output list and the statistics. */
void wl__iter_record(wl_trace_analysis_t *a, const wl_trace_iteration_t *it);

/* combine.c: one process's wave over one iteration, m points (each phase's maximum over the
 * iterations). 0, -EINVAL (no iterations), -ERANGE (bins too coarse), -ENOMEM. */
int wl__fold(const wl_trace_analysis_t *a, size_t m, double *profile, double *period_ns);

#endif
