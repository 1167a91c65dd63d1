/* The streaming pass of the analysis: live and physical bytes into adaptive time bins, counters,
 * waits, and iterations from explicit markers or phase events, all in memory fixed at creation. */
#include "analysis.h"
#include "util.h"

#include <errno.h>
#include <stdlib.h>

#define BINS_DEFAULT   (1u << 18)
#define ITERS_DEFAULT  65536u
#define SPANS_DEFAULT  65536u
#define PSTEPS_DEFAULT (1u << 20)
#define SHIFT0         10u /* the first bin width: 1.024 us */

void wl_trace_analysis_config_default(wl_trace_analysis_config_t *cfg) {
  cfg->bins = BINS_DEFAULT;
  cfg->max_iterations = ITERS_DEFAULT;
  cfg->max_spans = SPANS_DEFAULT;
  cfg->max_physical_steps = PSTEPS_DEFAULT;
}

int wl_trace_analysis_create(wl_trace_analysis_t **out, const wl_trace_header_t *hdr,
                             const wl_trace_analysis_config_t *cfg) {
  if (!out) return -EINVAL;
  *out = NULL;
  wl_trace_analysis_config_t c;
  wl_trace_analysis_config_default(&c);
  if (cfg) {
    if (cfg->bins) c.bins = cfg->bins;
    if (cfg->max_iterations) c.max_iterations = cfg->max_iterations;
    if (cfg->max_spans) c.max_spans = cfg->max_spans;
    if (cfg->max_physical_steps) c.max_physical_steps = cfg->max_physical_steps;
  }
  if (!wl__is_pow2(c.bins) || c.bins < 64 || c.bins > (1u << 20)) return -EINVAL;
  wl_trace_analysis_t *a = calloc(1, sizeof *a);
  if (!a) return -ENOMEM;
  a->nbins = c.bins;
  a->max_iterations = c.max_iterations;
  a->max_spans = c.max_spans;
  a->max_psteps = c.max_physical_steps;
  a->bins = malloc(c.bins * sizeof *a->bins);
  a->flags = calloc(c.bins, 1);
  if (!a->bins || !a->flags) {
    wl_trace_analysis_destroy(a);
    return -ENOMEM;
  }
  if (hdr) a->hdr = *hdr;
  a->s.header = a->hdr;
  a->shift = SHIFT0;
  a->trough_min = UINT64_MAX;
  a->last_index = SIZE_MAX;
  *out = a;
  return 0;
}

void wl_trace_analysis_destroy(wl_trace_analysis_t *a) {
  if (!a) return;
  free(a->bins);
  free(a->flags);
  free(a->iters);
  free(a->spans);
  free(a->rises);
  free(a->psteps);
  free(a);
}

static inline uint64_t add_sat(uint64_t x, uint64_t y) {
  return x + y < x ? UINT64_MAX : x + y;
}

static inline uint64_t phys_now(const wl_trace_analysis_t *a) {
  return add_sat(a->mapped, a->cached);
}

/* Halves the resolution: bin i becomes the merge of bins 2i and 2i+1. */
static void compact(wl_trace_analysis_t *a) {
  size_t half = (a->used + 1) / 2;
  for (size_t i = 0; i < half; i++) {
    wl_trace_bin_t b = a->bins[2 * i];
    uint8_t f = a->flags[2 * i];
    if (2 * i + 1 < a->used) {
      const wl_trace_bin_t *c = &a->bins[2 * i + 1];
      if (c->live_max > b.live_max) b.live_max = c->live_max;
      if (c->live_min < b.live_min) b.live_min = c->live_min;
      if (c->phys_max > b.phys_max) b.phys_max = c->phys_max;
      f |= a->flags[2 * i + 1];
    }
    a->bins[i] = b;
    a->flags[i] = f;
  }
  memset(a->flags + half, 0, a->nbins - half);
  a->used = half;
  a->cur >>= 1;
  a->shift++;
}

static inline uint8_t phase_flag(const wl_trace_analysis_t *a) {
  return a->phase == 1   ? (a->rise_wait ? 0 : WL_TRACE_BIN_FORWARD)
         : a->phase == 2 ? WL_TRACE_BIN_BACKWARD
                         : 0;
}

/* Moves the current bin to the one holding time t, carrying the state through empty bins. */
static inline void advance(wl_trace_analysis_t *a, uint64_t t) {
  uint64_t d = t - a->t0;
  while (a->shift < 63 && (d >> a->shift) >= a->nbins) compact(a);
  size_t idx = (size_t)(d >> a->shift);
  if (idx >= a->nbins) idx = a->nbins - 1;
  if (WL_LIKELY(idx == a->cur)) return;
  wl_trace_bin_t b = {a->live, a->live, phys_now(a)};
  uint8_t f = phase_flag(a);
  for (size_t i = a->cur + 1; i <= idx; i++) {
    a->bins[i] = b;
    a->flags[i] = f;
  }
  a->cur = idx;
  a->used = idx + 1;
}

static void span_add(wl_trace_analysis_t *a, uint16_t kind, uint64_t end, uint64_t wait) {
  if (a->nspans >= a->max_spans) return;
  if (!a->spans) {
    a->spans = malloc(a->max_spans * sizeof *a->spans);
    if (!a->spans) return;
  }
  wl_trace_span_t *sp = &a->spans[a->nspans++];
  sp->end_ns = end;
  sp->begin_ns = end > wait ? end - wait : 0;
  sp->kind = kind;
}

static void rise_add(wl_trace_analysis_t *a, uint64_t b, uint64_t e) {
  if (a->rises_lost) return;
  size_t cap = a->max_iterations + 1; /* one a complete iteration, and one left open */
  if (!a->rises) a->rises = malloc(cap * sizeof *a->rises);
  if (!a->rises || a->nrises >= cap) {
    a->rises_lost = 1;
    return;
  }
  a->rises[a->nrises++] = (wl__rise_t){b, e};
}

/* A forward phase that has risen (allocated or launched since its begin) ends at t. */
static void rise_end(wl_trace_analysis_t *a, uint64_t t) {
  if (a->phase == 1 && !a->rise_wait) rise_add(a, a->rise_ns, t);
}

void wl__iter_record(wl_trace_analysis_t *a, const wl_trace_iteration_t *it) {
  a->iter_count++;
  wl__stat_add(&a->peak, (double)it->peak_bytes);
  if (it->trough_bytes < a->trough_min) a->trough_min = it->trough_bytes;
  if (a->niters < a->max_iterations) {
    if (!a->iters) a->iters = malloc(a->max_iterations * sizeof *a->iters);
    if (a->iters) {
      a->last_index = a->niters;
      a->iters[a->niters++] = *it;
      return;
    }
  }
  a->last_index = SIZE_MAX;
}

/* Forgets explicit iterations (phase events) when markers turn up: markers alone decide. */
static void explicit_reset(wl_trace_analysis_t *a) {
  a->niters = 0;
  a->iter_count = 0;
  memset(&a->period, 0, sizeof a->period);
  memset(&a->fwd, 0, sizeof a->fwd);
  memset(&a->bwd, 0, sizeof a->bwd);
  memset(&a->idle, 0, sizeof a->idle);
  memset(&a->peak, 0, sizeof a->peak);
  a->trough_min = UINT64_MAX;
  a->open = a->phase = a->have_last = 0;
  a->last_index = SIZE_MAX;
  memset(a->flags, 0, a->nbins);
  a->nrises = 0;
  a->rises_lost = 0;
}

static void explicit_close(wl_trace_analysis_t *a, uint64_t t, int by_end) {
  wl_trace_iteration_t *it = &a->it;
  it->end_ns = t;
  if (by_end) it->fall_ns = t;
  if (it->backward_ns) {
    wl__stat_add(&a->fwd, (double)(it->backward_ns - it->begin_ns));
    wl__stat_add(&a->bwd, (double)(t - it->backward_ns));
  }
  wl__iter_record(a, it);
  a->last_fall = it->fall_ns;
  a->open = 0;
}

/* what: 1 begin, 2 backward, 3 end. */
static void explicit_event(wl_trace_analysis_t *a, wl_trace_iter_source_t src, int what,
                           uint64_t t) {
  if (src == WL_TRACE_ITER_MARKERS && a->xsrc == WL_TRACE_ITER_PHASES) explicit_reset(a);
  if (src == WL_TRACE_ITER_PHASES && a->xsrc == WL_TRACE_ITER_MARKERS) return;
  a->xsrc = src;
  switch (what) {
  case 1:
    rise_end(a, t);
    if (a->open) explicit_close(a, t, 0);
    if (a->have_last) {
      wl__stat_add(&a->period, (double)(t - a->last_begin));
      if (a->last_fall) wl__stat_add(&a->idle, (double)(t - a->last_fall));
      /* The previous iteration lasts until this begin. */
      if (a->last_index != SIZE_MAX) a->iters[a->last_index].end_ns = t;
    }
    a->have_last = 1;
    a->last_begin = t;
    a->last_fall = 0;
    memset(&a->it, 0, sizeof a->it);
    a->it.begin_ns = t;
    a->it.peak_bytes = a->it.trough_bytes = a->live;
    a->open = 1;
    a->phase = 1;
    a->rise_wait = 1;
    break;
  case 2:
    if (a->open && a->phase == 1) {
      rise_end(a, t);
      a->it.backward_ns = t;
      a->phase = 2;
      a->rise_wait = 0;
    }
    break;
  case 3:
    rise_end(a, t);
    if (a->open) explicit_close(a, t, 1);
    a->phase = 3;
    break;
  }
}

/* Physical memory changed at t (to phys_now): kept for the combined sweep. A change to the same
 * value is none, and two at one time are one; past the cap the list is dropped (the combined
 * peak then comes from the bins). */
static void pstep_add(wl_trace_analysis_t *a, uint64_t t) {
  if (a->psteps_lost) return;
  uint64_t v = phys_now(a);
  if (a->npsteps) {
    wl__pstep_t *last = &a->psteps[a->npsteps - 1];
    if (last->bytes == v) return;
    if (last->t == t) {
      last->bytes = v;
      return;
    }
  }
  if (a->npsteps == a->cap_psteps) {
    size_t cap = a->cap_psteps ? 2 * a->cap_psteps : 256;
    if (cap > a->max_psteps) cap = a->max_psteps;
    wl__pstep_t *n = a->npsteps < cap ? realloc(a->psteps, cap * sizeof *n) : NULL;
    if (!n) {
      free(a->psteps);
      a->psteps = NULL;
      a->npsteps = a->cap_psteps = 0;
      a->psteps_lost = 1;
      return;
    }
    a->psteps = n;
    a->cap_psteps = cap;
  }
  a->psteps[a->npsteps++] = (wl__pstep_t){t, v};
}

/* The rarer kinds, with the state in the struct. */
static void feed_other(wl_trace_analysis_t *a, const wl_trace_event_t *ev, uint64_t t) {
  wl_trace_summary_t *s = &a->s;
  switch (ev->kind) {
  case WL_TRACE_MAP: {
    uint64_t take = WL_MIN(a->cached, ev->size);
    a->cached -= take;
    a->mapped = add_sat(a->mapped, ev->size);
    a->phys_seen = 1;
    pstep_add(a, t);
    break;
  }
  case WL_TRACE_UNMAP:
    a->mapped = wl__sub_sat(a->mapped, ev->size);
    a->cached = add_sat(a->cached, ev->size);
    pstep_add(a, t);
    break;
  case WL_TRACE_PHYS_RELEASE:
    a->cached = wl__sub_sat(a->cached, ev->size);
    pstep_add(a, t);
    break;
  case WL_TRACE_SYNC:
    s->syncs++;
    break;
  case WL_TRACE_PHASE:
    s->phase_events++;
    if (ev->aux == WL_TRACE_PHASE_ITER_BEGIN)
      explicit_event(a, WL_TRACE_ITER_PHASES, 1, t);
    else if (ev->aux == WL_TRACE_PHASE_BACKWARD)
      explicit_event(a, WL_TRACE_ITER_PHASES, 2, t);
    else if (ev->aux == WL_TRACE_PHASE_IDLE)
      explicit_event(a, WL_TRACE_ITER_PHASES, 3, t);
    break;
  case WL_TRACE_GATE_GRANT:
    s->gate_waits++;
    s->gate_wait_ns = add_sat(s->gate_wait_ns, ev->arg);
    span_add(a, WL_TRACE_GATE_GRANT, t, ev->arg);
    break;
  case WL_TRACE_BUDGET_WAIT:
    if (!(ev->aux & 2)) s->budget_waits++; /* 2: the same wait's next round */
    s->budget_wait_ns = add_sat(s->budget_wait_ns, ev->arg);
    span_add(a, WL_TRACE_BUDGET_WAIT, t, ev->arg);
    break;
  case WL_TRACE_BUDGET_DENY:
    s->budget_denials++;
    break;
  case WL_TRACE_OOM:
    s->ooms++;
    break;
  case WL_TRACE_MARKER:
    s->markers++;
    if (ev->aux >= WL_TRACE_MARK_ITER_BEGIN && ev->aux <= WL_TRACE_MARK_ITER_END)
      explicit_event(a, WL_TRACE_ITER_MARKERS, ev->aux, t);
    break;
  case WL_TRACE_DROPPED:
    s->dropped = add_sat(s->dropped, ev->size);
    break;
  default:
    break;
  }
}

int wl_trace_analysis_feed(wl_trace_analysis_t *a, const wl_trace_event_t *evs, size_t n) {
  if (!a || a->finished) return -EINVAL;
  if (!n) return 0;
  wl_trace_summary_t *s = &a->s;
  if (WL_UNLIKELY(!a->started)) {
    a->started = 1;
    a->t0 = a->last_t = evs[0].time_ns;
    s->first_ns = a->t0;
    /* The first bin starts at the first event, not before it: no made-up zero minimum. */
    a->bins[0] = (wl_trace_bin_t){0, UINT64_MAX, 0};
    a->used = 1;
    a->cur = 0;
  }
  /* The hot state lives in locals: the compiler cannot keep struct fields in registers across
   * the stores into the bins, which it must assume may alias them. */
  uint64_t live = a->live, phys = phys_now(a), last_t = a->last_t, allocs = 0, frees = 0;
  uint64_t launches = 0, peak = s->peak_bytes, phys_peak = s->physical_peak_bytes;
  const uint64_t t0 = a->t0;
  unsigned shift = a->shift;
  size_t cur = a->cur;
  wl_trace_bin_t *b = &a->bins[cur];
  uint8_t pflag = phase_flag(a);
  int open = a->open, rise_wait = a->rise_wait;
  for (size_t i = 0; i < n; i++) {
    const wl_trace_event_t *ev = &evs[i];
    uint64_t t = ev->time_ns;
    if (WL_UNLIKELY(t < last_t)) t = last_t; /* the flush race: keep time monotonic */
    last_t = t;
    if (WL_UNLIKELY(((t - t0) >> shift) != cur)) {
      a->live = live;
      advance(a, t);
      shift = a->shift;
      cur = a->cur;
      b = &a->bins[cur];
    }
    switch (ev->kind) {
    case WL_TRACE_ALLOC:
      live = live + ev->size < live ? UINT64_MAX : live + ev->size;
      allocs++;
      if (WL_UNLIKELY(rise_wait))
        rise_wait = a->rise_wait = 0, a->rise_ns = t, pflag = phase_flag(a);
      break;
    case WL_TRACE_FREE_REQ:
      live = live > ev->size ? live - ev->size : 0;
      frees++;
      break;
    case WL_TRACE_LAUNCH:
      launches++;
      if (WL_UNLIKELY(rise_wait))
        rise_wait = a->rise_wait = 0, a->rise_ns = t, pflag = phase_flag(a);
      break;
    default:
      a->live = live;
      if (open) {
        if (live > a->it.peak_bytes) a->it.peak_bytes = live;
        if (live < a->it.trough_bytes) a->it.trough_bytes = live;
      }
      feed_other(a, ev, t);
      phys = phys_now(a);
      pflag = phase_flag(a);
      open = a->open;
      rise_wait = a->rise_wait;
      break;
    }
    if (live > b->live_max) b->live_max = live;
    if (live < b->live_min) b->live_min = live;
    if (phys > b->phys_max) b->phys_max = phys;
    if (WL_UNLIKELY(pflag)) a->flags[cur] |= pflag;
    if (WL_UNLIKELY(live > peak)) {
      peak = live;
      s->peak_ns = t;
      s->physical_at_peak_bytes = phys;
    }
    if (WL_UNLIKELY(phys > phys_peak)) phys_peak = phys;
    if (open) {
      if (live > a->it.peak_bytes) a->it.peak_bytes = live;
      if (live < a->it.trough_bytes) a->it.trough_bytes = live;
    }
  }
  a->live = live;
  a->last_t = last_t;
  s->events += n;
  s->allocs += allocs;
  s->frees += frees;
  s->launches += launches;
  s->peak_bytes = peak;
  s->physical_peak_bytes = phys_peak;
  s->last_ns = last_t;
  return 0;
}

int wl_trace_analysis_finish(wl_trace_analysis_t *a) {
  if (!a) return -EINVAL;
  if (a->finished) return 0;
  a->finished = 1;
  wl_trace_summary_t *s = &a->s;
  int rc = 0;
  rise_end(a, a->last_t); /* a forward phase still under way at the end */
  if (a->iter_count) {
    s->source = a->xsrc;
    s->confidence = 1.0;
  } else {
    /* No explicit iterations: look for them in the wave, whose rises are only known to a bin. */
    memset(a->flags, 0, a->nbins);
    a->nrises = 0;
    a->rises_lost = 1;
    rc = wl__detect_wave(a);
  }
  s->iterations = a->iter_count;
  s->period_ms = a->period.n ? a->period.mean / 1e6 : 0;
  s->period_spread_ms = wl__stat_sd(&a->period) / 1e6;
  s->forward_ms = a->fwd.mean / 1e6;
  s->backward_ms = a->bwd.mean / 1e6;
  s->idle_ms = a->idle.mean / 1e6;
  s->iter_peak_mean_bytes = a->peak.mean;
  if (!s->iterations) s->source = WL_TRACE_ITER_NONE;
  if (s->iterations) {
    s->trough_bytes = a->trough_min;
  } else {
    /* No steady state to speak of: the lowest point after the first allocation. */
    uint64_t lo = UINT64_MAX;
    int seen = 0;
    for (size_t i = 0; i < a->used; i++) {
      if (!seen && a->bins[i].live_max == 0) continue;
      seen = 1;
      if (a->bins[i].live_min < lo) lo = a->bins[i].live_min;
    }
    s->trough_bytes = seen ? lo : 0;
  }
  if (!a->phys_seen) {
    s->physical_peak_bytes = s->physical_at_peak_bytes = 0;
  }
  s->fragmentation = a->phys_seen && s->peak_bytes
                         ? (double)s->physical_at_peak_bytes / (double)s->peak_bytes
                         : 0.0;
  s->bin_width_ns = (uint64_t)1 << a->shift;
  return rc;
}

void wl_trace_analysis_summary(const wl_trace_analysis_t *a, wl_trace_summary_t *out) {
  if (!a) {
    memset(out, 0, sizeof *out);
    return;
  }
  *out = a->s;
}

const wl_trace_bin_t *wl_trace_analysis_bins(const wl_trace_analysis_t *a, size_t *n,
                                             uint64_t *t0_ns, uint64_t *width_ns,
                                             const uint8_t **flags) {
  if (!a) return NULL;
  if (n) *n = a->started ? a->used : 0;
  if (t0_ns) *t0_ns = a->t0;
  if (width_ns) *width_ns = (uint64_t)1 << a->shift;
  if (flags) *flags = a->flags;
  return a->bins;
}

const wl_trace_iteration_t *wl_trace_analysis_iterations(const wl_trace_analysis_t *a, size_t *n) {
  if (!a) return NULL;
  if (n) *n = a->niters;
  return a->iters;
}

const wl_trace_span_t *wl_trace_analysis_spans(const wl_trace_analysis_t *a, size_t *n) {
  if (!a) return NULL;
  if (n) *n = a->nspans;
  return a->spans;
}

int wl_trace_analyze_file(const char *path, unsigned flags, const wl_trace_analysis_config_t *cfg,
                          wl_trace_analysis_t **out, wl_trace_reader_info_t *info, char *err,
                          size_t errlen) {
  if (!out) return -EINVAL;
  *out = NULL;
  if (err && errlen) err[0] = 0;
  wl_trace_reader_t *r = NULL;
  int rc = wl_trace_open(&r, path, flags);
  wl_trace_analysis_t *a = NULL;
  if (!rc) rc = wl_trace_analysis_create(&a, wl_trace_reader_header(r), cfg);
  enum { BATCH = 512 };
  wl_trace_event_t *evs = rc ? NULL : malloc(BATCH * sizeof *evs);
  if (!rc && !evs) rc = -ENOMEM;
  while (!rc) {
    long k = wl_trace_read(r, evs, BATCH);
    if (k == 0) break;
    if (k < 0) {
      rc = (int)k;
      break;
    }
    wl_trace_analysis_feed(a, evs, (size_t)k);
  }
  free(evs);
  wl_trace_reader_info_t ri;
  wl_trace_reader_info(r, &ri);
  if (rc == -ENODATA && (flags & WL_TRACE_OPEN_SALVAGE) && a) {
    ri.truncated = 1;
    if (err && errlen) snprintf(err, errlen, "%s", wl_trace_reader_error(r));
    rc = 0;
  } else if (rc && err && errlen) {
    const char *m = r ? wl_trace_reader_error(r) : "";
    if (m[0])
      snprintf(err, errlen, "%s", m);
    else
      snprintf(err, errlen, "%s: byte 0: cannot read (%d)", path ? path : "(null)", rc);
  }
  if (info) *info = ri;
  wl_trace_reader_close(r);
  if (!rc) rc = wl_trace_analysis_finish(a);
  if (rc) {
    wl_trace_analysis_destroy(a);
    return rc;
  }
  *out = a;
  return 0;
}
