/* Several processes and the advice: the combined wave on one time grid, a process's wave folded
 * over one iteration, and the phase offsets that minimise the combined peak of shifted waves. */
#include "analysis.h"
#include "util.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>

#define FOLD_POINTS 256u

static int cmp_u64(const void *x, const void *y) {
  uint64_t a = *(const uint64_t *)x, b = *(const uint64_t *)y;
  return a < b ? -1 : a > b;
}

/* Iteration k's cycle: from its begin to the next one's (its idle tail included: the wave
 * repeats with that period). The last one's is unknown (0) unless it is the only one: then its
 * own length. 0 when it has no length. */
static uint64_t cycle_len(const wl_trace_analysis_t *a, size_t k) {
  const wl_trace_iteration_t *it = &a->iters[k];
  uint64_t to = k + 1 < a->niters ? a->iters[k + 1].begin_ns : a->niters == 1 ? it->end_ns : 0;
  return to > it->begin_ns ? to - it->begin_ns : 0;
}

/* The lower median of the iterations' cycles (ns) in *med: 0 when none has one. 0 or -ENOMEM. */
static int median_cycle(const wl_trace_analysis_t *a, uint64_t *med) {
  *med = 0;
  uint64_t *len = malloc(a->niters * sizeof *len);
  if (!len) return -ENOMEM;
  size_t n = 0;
  for (size_t k = 0; k < a->niters; k++)
    if ((len[n] = cycle_len(a, k)) > 0) n++;
  if (n) {
    qsort(len, n, sizeof *len, cmp_u64);
    *med = len[(n - 1) / 2];
  }
  free(len);
  return 0;
}

int wl__fold(const wl_trace_analysis_t *a, size_t m, double *profile, double *period_ns) {
  size_t ni = a->niters;
  if (!a->s.iterations || !ni || a->s.period_ms <= 0) return -EINVAL;
  /* The typical cycle, begin to next begin: cycles far from it (a stall, a slow first one, an
   * evaluation between epochs) would smear the wave, and are left out. The median, not the
   * mean: one slow warm-up among a few short cycles moves the mean past them all. The fold and
   * the period it reports are both this cycle's, so offsets scaled by it stay within it. */
  uint64_t typ_ns;
  int rc = median_cycle(a, &typ_ns);
  if (rc) return rc;
  if (!typ_ns) return -EINVAL;
  const double P = (double)typ_ns, typ = P;
  const uint64_t w = (uint64_t)1 << a->shift;
  if ((double)w * 8 > P) return -ERANGE; /* fewer than 8 bins an iteration: no shape left */
  for (size_t j = 0; j < m; j++) profile[j] = -1;
  size_t used = 0;
  for (size_t k = 0; k < ni; k++) {
    const wl_trace_iteration_t *it = &a->iters[k];
    uint64_t len = cycle_len(a, k);
    if ((double)len < 0.5 * typ || (double)len > 1.5 * typ) continue;
    used++;
    uint64_t end = it->begin_ns + len;
    uint64_t b0 = (it->begin_ns - a->t0) / w, b1 = (end - a->t0 + w - 1) / w;
    if (b1 > a->used) b1 = a->used;
    for (uint64_t b = b0; b < b1; b++) {
      uint64_t ts = a->t0 + b * w, te = ts + w;
      double p0 = ts <= it->begin_ns ? 0 : (double)(ts - it->begin_ns) / (double)len;
      double p1 = (double)(te - it->begin_ns) / (double)len;
      if (!(p0 < 1)) break;
      if (!(p1 < 1)) p1 = 1;
      size_t j0 = (size_t)(p0 * (double)m), j1 = (size_t)(p1 * (double)m);
      if (j1 >= m) j1 = m - 1;
      for (size_t j = j0; j <= j1 && j < m; j++)
        if ((double)a->bins[b].live_max > profile[j]) profile[j] = (double)a->bins[b].live_max;
    }
  }
  if (!used) return -EINVAL;
  /* Points no bin reached (coarse bins) take their left neighbour's value. */
  double last = -1;
  for (size_t j = 0; j < m; j++)
    if (profile[j] >= 0) {
      last = profile[j];
      break;
    }
  for (size_t j = 0; j < m; j++) {
    if (profile[j] < 0)
      profile[j] = last;
    else
      last = profile[j];
  }
  *period_ns = P;
  return 0;
}

/* Combined peak of profiles p[i] shifted by s[i] (replica i is s[i] points ahead). */
static double shifted_peak(const double *const *p, const size_t *s, size_t k, size_t m,
                           double *sum) {
  for (size_t j = 0; j < m; j++) sum[j] = 0;
  for (size_t i = 0; i < k; i++)
    for (size_t j = 0; j < m; j++) sum[j] += p[i][(j + s[i]) % m];
  double pk = 0;
  for (size_t j = 0; j < m; j++)
    if (sum[j] > pk) pk = sum[j];
  return pk;
}

/* Coordinate descent from even spacing: each replica in turn moves to its best shift with the
 * others fixed, until no move lowers the peak. s[0] stays 0. Returns the peak. */
static double best_shifts(const double *const *p, size_t k, size_t m, size_t *s, double *sum) {
  for (size_t i = 0; i < k; i++) s[i] = (i * m / k) % m;
  double best = shifted_peak(p, s, k, m, sum);
  for (int round = 0; round < 8; round++) {
    int moved = 0;
    for (size_t i = 1; i < k; i++) {
      /* sum without replica i */
      for (size_t j = 0; j < m; j++) sum[j] -= p[i][(j + s[i]) % m];
      size_t bs = s[i];
      double bp = INFINITY;
      for (size_t c = 0; c < m; c++) {
        double pk = 0;
        for (size_t j = 0; j < m; j++) {
          double v = sum[j] + p[i][(j + c) % m];
          if (v > pk) {
            pk = v;
            if (pk >= bp) break;
          }
        }
        if (pk < bp) {
          bp = pk;
          bs = c;
        }
      }
      if (bs != s[i] && bp < best - 1e-9 * best) moved = 1;
      s[i] = bs;
      for (size_t j = 0; j < m; j++) sum[j] += p[i][(j + s[i]) % m];
      double now = 0;
      for (size_t j = 0; j < m; j++)
        if (sum[j] > now) now = sum[j];
      best = now;
    }
    if (!moved) break;
  }
  return best;
}

/* The best placement of k copies of profile prof (m points): coordinate descent on a copy
 * max-pooled to fewer points as k grows, so the cost stays bounded (at most 64 x 64 x 64 x 8
 * steps); aligned copies are a placement too. Each copy adds slack bytes to a shifted placement
 * (its partly used chunks, see wl_trace_capacity). delay[i] receives replica i's start after
 * replica 0 in points of m, *peak the combined peak. 0 or -ENOMEM. */
static int place(const double *prof, size_t m, unsigned k, double peak, double slack, double *delay,
                 double *out) {
  if (k <= 1) {
    delay[0] = 0;
    *out = peak;
    return 0;
  }
  size_t mk = k <= 8 ? m : k <= 32 ? m / 2 : m / 4, g = m / mk;
  double *q = malloc(mk * sizeof *q), *sum = malloc(mk * sizeof *sum);
  const double **pp = malloc(k * sizeof *pp);
  size_t *s = malloc(k * sizeof *s);
  if (!q || !sum || !pp || !s) {
    free(q);
    free(sum);
    free(pp);
    free(s);
    return -ENOMEM;
  }
  for (size_t j = 0; j < mk; j++) {
    q[j] = prof[j * g];
    for (size_t t = 1; t < g; t++) q[j] = fmax(q[j], prof[j * g + t]);
  }
  for (unsigned i = 0; i < k; i++) pp[i] = q;
  double pk = best_shifts(pp, k, mk, s, sum) + (double)k * slack;
  if ((double)k * peak <= pk) {
    pk = (double)k * peak;
    memset(s, 0, k * sizeof *s);
  }
  for (unsigned i = 0; i < k; i++) delay[i] = (double)((mk - s[i] % mk) % mk) * (double)g;
  *out = pk;
  free(q);
  free(sum);
  free(pp);
  free(s);
  return 0;
}

static double ratio(unsigned k, double P, double work) {
  if (!k) return 0;
  double cycle = fmax(P, (double)k * work);
  return cycle > 0 ? (double)k * P / cycle : 0;
}

/* The wave the advice shifts: one iteration of a folded (m points), in physical memory when the
 * trace has it: the live wave times the fragmentation at its peak, and each shifted copy adds its
 * slack there (physical - live: partly used chunks, which weigh most where a wave is low; without
 * it a pair on the doubles waited a quarter of its time). Not the physical wave itself, which a
 * run alone keeps high with liballoc's cache and lazy trimming, both given back at once when a
 * peer waits (its folded need came out at two peaks). *peak and *mean of the profile; 0, or
 * -EINVAL / -ERANGE (no shape to shift: wl__fold). */
static int advice_wave(const wl_trace_analysis_t *a, size_t m, double *prof, double *period,
                       double *frag, double *slack, double *peak, double *mean) {
  *frag = 1.0;
  *slack = *peak = *mean = 0;
  int rc = wl__fold(a, m, prof, period);
  if (rc) return rc;
  if (a->phys_seen && a->s.fragmentation > 1.0) {
    *frag = a->s.fragmentation;
    for (size_t j = 0; j < m; j++) prof[j] *= *frag;
    *slack = (double)(a->s.physical_at_peak_bytes - a->s.peak_bytes);
  }
  for (size_t j = 0; j < m; j++) {
    if (prof[j] > *peak) *peak = prof[j];
    *mean += prof[j] / (double)m;
  }
  return 0;
}

int wl_trace_ticktock_peak(const wl_trace_analysis_t *a, unsigned k, uint64_t *peak) {
  if (!a || !peak || !k || k > WL_TRACE_MAX_REPLICAS) return -EINVAL;
  *peak = 0;
  const size_t m = FOLD_POINTS;
  double *prof = malloc(m * sizeof *prof), *s = malloc(WL_TRACE_MAX_REPLICAS * sizeof *s);
  int rc = -ENOMEM;
  double P, frag, slack, pk1, mean, pk;
  if (prof && s) rc = advice_wave(a, m, prof, &P, &frag, &slack, &pk1, &mean);
  if (!rc && pk1 <= 0) rc = -EINVAL;
  if (!rc) rc = place(prof, m, k, pk1, slack, s, &pk);
  if (!rc) *peak = wl__to_u64(pk);
  free(prof);
  free(s);
  return rc;
}

int wl_trace_capacity(const wl_trace_analysis_t *a, uint64_t capacity, double busy,
                      wl_trace_capacity_t *out) {
  if (!a || !out || !(busy > 0 && busy <= 1)) return -EINVAL;
  memset(out, 0, sizeof *out);
  out->capacity_bytes = capacity;
  out->busy = busy;
  const size_t m = FOLD_POINTS;
  double *prof = malloc(m * sizeof *prof), *s = malloc(WL_TRACE_MAX_REPLICAS * sizeof *s);
  int rc = -ENOMEM;
  if (!prof || !s) goto out;
  double P, slack, peak, mean;
  rc = 0;
  out->fragmentation = 1.0;
  /* not usable: no shape to shift */
  if (!capacity || advice_wave(a, m, prof, &P, &out->fragmentation, &slack, &peak, &mean)) goto out;
  if (peak <= 0) goto out;
  out->usable = 1;
  out->peak_bytes = wl__to_u64(peak);
  out->period_ms = P / 1e6;
  const wl_trace_summary_t *su = &a->s;
  double work = su->forward_ms + su->backward_ms;
  if (work <= 0 || work > out->period_ms) work = out->period_ms;
  out->work_ms = work;
  double wk = busy * work;
  snprintf(out->model, sizeof out->model,
           "GPU busy %.2f x (forward+backward) = %.1f ms of each %.1f ms iteration, shared "
           "perfectly: rate = K / max(P, K x %.1f ms)",
           busy, wk, out->period_ms, wk);
  out->replicas_without =
      (unsigned)WL_MIN((double)WL_TRACE_MAX_REPLICAS, floor((double)capacity / peak));
  /* Tick-tock: the most replicas whose best shifted combined peak fits. The optimum only grows
   * with K (drop one replica from a K+1 placement and K remain), so a binary search over K
   * needs a handful of placements. Between the aligned count, which fits, and the bound of the
   * mean: every shift keeps the sum's mean at K times one wave's mean. */
  unsigned lo = out->replicas_without ? out->replicas_without : 1;
  unsigned hi = (unsigned)WL_MIN((double)WL_TRACE_MAX_REPLICAS, floor((double)capacity / mean));
  double pk;
  if (peak > (double)capacity) {
    lo = hi = 0;
  } else {
    if (hi < lo) hi = lo;
    while (lo < hi) {
      unsigned mid = (lo + hi + 1) / 2;
      rc = place(prof, m, mid, peak, slack, s, &pk);
      if (rc) goto out;
      if (pk <= (double)capacity)
        lo = mid;
      else
        hi = mid - 1;
    }
  }
  unsigned kt = lo;
  double kpeak = 0;
  if (kt) {
    rc = place(prof, m, kt, peak, slack, s, &kpeak);
    if (rc) goto out;
  }
  out->replicas_ticktock = kt;
  out->combined_peak_bytes = wl__to_u64(kpeak);
  for (unsigned i = 0; i < kt; i++) out->offsets_ms[i] = s[i] / (double)m * out->period_ms;
  out->throughput_ticktock = ratio(kt, out->period_ms, wk);
  out->throughput_without = ratio(out->replicas_without, out->period_ms, wk);
out:
  free(prof);
  free(s);
  return rc;
}

int wl_trace_best_offsets(const wl_trace_analysis_t *const *a, size_t k, double *offsets_ms,
                          uint64_t *peak) {
  if (!a || !k || k > WL_TRACE_MAX_REPLICAS || !offsets_ms || !peak) return -EINVAL;
  const size_t m = FOLD_POINTS;
  double *prof = malloc(k * m * sizeof *prof), *sum = malloc(m * sizeof *sum);
  const double **pp = malloc(k * sizeof *pp);
  size_t *s = malloc(k * sizeof *s);
  int rc = -ENOMEM;
  if (!prof || !sum || !pp || !s) goto out;
  double pmean = 0, pmin = INFINITY, pmax = 0;
  for (size_t i = 0; i < k; i++) {
    double P;
    if ((rc = wl__fold(a[i], m, prof + i * m, &P))) goto out;
    pp[i] = prof + i * m;
    pmean += P / (double)k;
    pmin = fmin(pmin, P);
    pmax = fmax(pmax, P);
  }
  rc = -EINVAL;
  if (pmax > 1.05 * pmin) goto out;
  double pk = best_shifts(pp, k, m, s, sum);
  for (size_t i = 0; i < k; i++)
    offsets_ms[i] = (double)((m - s[i] % m) % m) / (double)m * pmean / 1e6;
  *peak = wl__to_u64(pk);
  rc = 0;
out:
  free(prof);
  free(sum);
  free(pp);
  free(s);
  return rc;
}

/* The start of bin b of a, saturating at the end of time. */
static uint64_t bin_time(const wl_trace_analysis_t *a, uint64_t b) {
  if (b && (b > (UINT64_MAX >> a->shift) || (b << a->shift) > UINT64_MAX - a->t0))
    return UINT64_MAX;
  return a->t0 + (b << a->shift);
}

/* A process's rising phases in time order, one at a time: the exact ones when the analysis kept
 * them, else runs of its bins flagged forward. */
typedef struct rise_cur_s {
  const wl_trace_analysis_t *a;
  size_t i;      /* next rise, or next bin to scan */
  uint64_t b, e; /* the current rise */
  int have, in;  /* have: b, e hold one; in: the sweep is inside it */
} rise_cur_t;

static void rise_next(rise_cur_t *c) {
  const wl_trace_analysis_t *a = c->a;
  c->have = c->in = 0;
  if (!a->rises_lost) {
    while (c->i < a->nrises && !c->have) {
      const wl__rise_t *r = &a->rises[c->i++];
      if (r->e > r->b) c->b = r->b, c->e = r->e, c->have = 1;
    }
    return;
  }
  while (c->i < a->used && !(a->flags[c->i] & WL_TRACE_BIN_FORWARD)) c->i++;
  if (c->i >= a->used) return;
  size_t j = c->i;
  while (j < a->used && (a->flags[j] & WL_TRACE_BIN_FORWARD)) j++;
  c->b = bin_time(a, c->i);
  c->e = bin_time(a, j);
  c->i = j;
  c->have = c->e > c->b;
}

/* Marks the combined bins that [b, e) touches in c->overlap. */
static void mark_overlap(wl_trace_combined_t *c, uint64_t b, uint64_t e) {
  if (e <= b || b < c->t0_ns) return;
  uint64_t g0 = (b - c->t0_ns) / c->width_ns, g1 = (e - 1 - c->t0_ns) / c->width_ns;
  for (uint64_t g = g0; g <= g1 && g < c->n; g++) c->overlap[g] = 1;
}

/* Rising and overlap time by a sweep over every process's rising phases: a count of processes
 * rising, changed at each phase's begin and end (ends first where they meet, so one replica
 * starting the moment another stops is no overlap). k is at most a few dozen: the next boundary
 * is found by a scan. 0 or -ENOMEM. */
static int sweep_rises(const wl_trace_analysis_t *const *a, size_t k, wl_trace_combined_t *c) {
  rise_cur_t *cur = calloc(k, sizeof *cur);
  if (!cur) return -ENOMEM;
  for (size_t i = 0; i < k; i++) {
    if (!a[i] || !a[i]->started) continue;
    cur[i].a = a[i];
    rise_next(&cur[i]);
    int flagged = cur[i].have;
    /* Bins stand in for this one's phases: the result is only as fine as they are. */
    if (a[i]->rises_lost && flagged && ((uint64_t)1 << a[i]->shift) > c->rising_bin_ns)
      c->rising_bin_ns = (uint64_t)1 << a[i]->shift;
  }
  unsigned count = 0;
  uint64_t now = 0;
  for (;;) {
    size_t best = SIZE_MAX;
    uint64_t bt = 0;
    int bend = 0;
    for (size_t i = 0; i < k; i++) {
      if (!cur[i].have) continue;
      uint64_t t = cur[i].in ? cur[i].e : cur[i].b;
      if (best == SIZE_MAX || t < bt || (t == bt && cur[i].in && !bend)) {
        best = i;
        bt = t;
        bend = cur[i].in;
      }
    }
    if (best == SIZE_MAX) break;
    if (count >= 1) c->rising_ns += bt - now;
    if (count >= 2) {
      c->overlap_ns += bt - now;
      mark_overlap(c, now, bt);
    }
    now = bt;
    if (bend) {
      count--;
      rise_next(&cur[best]);
    } else {
      count++;
      cur[best].in = 1;
    }
  }
  free(cur);
  return 0;
}

/* One process's change of physical memory, for the sweep (values up to 2^64 - 1 saturated: the
 * differences and sums need more than 64 bits). */
typedef struct pdelta_s {
  uint64_t t;
  __int128 d;
} pdelta_t;

static int pdelta_cmp(const void *x, const void *y) {
  const pdelta_t *p = x, *q = y;
  if (p->t != q->t) return p->t < q->t ? -1 : 1;
  return p->d < q->d ? -1 : p->d > q->d; /* at one time, what is given back first */
}

/* The combined physical peak, exact: the processes' changes merged in time order, each process
 * counting as zero after its trace's last event, as in the bins. The bins' sums are an upper
 * bound (a chunk given back by one process and taken by another within one bin counts twice),
 * and a budget holds exactly, so the peak must not exceed it. Changes at the same nanosecond
 * count what is given back first: liballoc traces a give-back before its budget hears of it, so
 * another process's take always comes after. Left to the bins (physical_peak_exact 0) when a
 * process lost its list (its cap, or memory). */
static int sweep_phys(const wl_trace_analysis_t *const *a, size_t k, wl_trace_combined_t *c) {
  size_t n = 0;
  for (size_t i = 0; i < k; i++) {
    if (!a[i] || !a[i]->started || !a[i]->phys_seen) continue;
    if (a[i]->psteps_lost) return 0;
    n += a[i]->npsteps + 1;
  }
  c->physical_peak_exact = 1;
  if (!n) return 0;
  pdelta_t *d = malloc(n * sizeof *d);
  if (!d) return -ENOMEM;
  size_t m = 0;
  for (size_t i = 0; i < k; i++) {
    if (!a[i] || !a[i]->started || !a[i]->phys_seen) continue;
    uint64_t prev = 0;
    for (size_t j = 0; j < a[i]->npsteps; j++) {
      const wl__pstep_t *st = &a[i]->psteps[j];
      d[m++] = (pdelta_t){st->t, (__int128)st->bytes - (__int128)prev};
      prev = st->bytes;
    }
    /* Its trace ends: what it held is no longer counted (a process that exits with its memory
     * mapped, as the interposer does, gives it back then). */
    uint64_t end = a[i]->last_t + 1 > a[i]->last_t ? a[i]->last_t + 1 : a[i]->last_t;
    if (prev) d[m++] = (pdelta_t){end, -(__int128)prev};
  }
  qsort(d, m, sizeof *d, pdelta_cmp);
  __int128 sum = 0, best = 0;
  uint64_t best_t = c->t0_ns;
  for (size_t j = 0; j < m; j++) {
    sum += d[j].d;
    if (sum > best) best = sum, best_t = d[j].t;
  }
  free(d);
  c->physical_peak_bytes = best > (__int128)UINT64_MAX ? UINT64_MAX : (uint64_t)best;
  c->physical_peak_ns = best_t;
  return 0;
}

int wl_trace_combine(const wl_trace_analysis_t *const *a, size_t k, size_t bins,
                     wl_trace_combined_t **out) {
  if (!a || !k || !out) return -EINVAL;
  *out = NULL;
  if (!bins) bins = 65536;
  uint64_t t0 = UINT64_MAX, t1 = 0, c0 = 0, c1 = UINT64_MAX; /* union and intersection */
  for (size_t i = 0; i < k; i++) {
    if (!a[i] || !a[i]->started) continue;
    uint64_t e = bin_time(a[i], a[i]->used);
    t0 = WL_MIN(t0, a[i]->t0);
    t1 = WL_MAX(t1, e);
    c0 = WL_MAX(c0, a[i]->t0);
    c1 = WL_MIN(c1, e);
  }
  if (t0 >= t1) return -EINVAL;
  wl_trace_combined_t *c = calloc(1, sizeof *c);
  uint64_t *tmp = NULL;
  if (!c) return -ENOMEM;
  uint64_t span = t1 - t0;
  c->width_ns = span / bins + (span % bins != 0);
  c->n = (size_t)(span / c->width_ns + (span % c->width_ns != 0)); /* no overflow near 2^64 */
  c->t0_ns = t0;
  c->live = calloc(c->n, sizeof *c->live);
  c->phys = calloc(c->n, sizeof *c->phys);
  c->rising = calloc(c->n, 1);
  c->overlap = calloc(c->n, 1);
  tmp = malloc(c->n * sizeof *tmp);
  uint64_t *tmpp = malloc(c->n * sizeof *tmpp);
  uint8_t *rise = malloc(c->n);
  if (!c->live || !c->phys || !c->rising || !c->overlap || !tmp || !tmpp || !rise) {
    free(tmp);
    free(tmpp);
    free(rise);
    wl_trace_combined_destroy(c);
    return -ENOMEM;
  }
  c->physical_traced = 1;
  for (size_t i = 0; i < k; i++) {
    const wl_trace_analysis_t *p = a[i];
    if (!p || !p->started) continue;
    if (!p->phys_seen) c->physical_traced = 0;
    memset(tmp, 0, c->n * sizeof *tmp);
    memset(tmpp, 0, c->n * sizeof *tmpp);
    memset(rise, 0, c->n);
    for (size_t b = 0; b < p->used; b++) {
      uint64_t ts = bin_time(p, b), te = bin_time(p, b + 1) - 1;
      if (ts > t1 - 1) break;
      if (te > t1 - 1) te = t1 - 1;
      size_t g0 = (size_t)((ts - t0) / c->width_ns), g1 = (size_t)((te - t0) / c->width_ns);
      if (g1 >= c->n) g1 = c->n - 1;
      for (size_t g = g0; g <= g1; g++) {
        if (p->bins[b].live_max > tmp[g]) tmp[g] = p->bins[b].live_max;
        if (p->phys_seen && p->bins[b].phys_max > tmpp[g]) tmpp[g] = p->bins[b].phys_max;
        if (p->flags[b] & WL_TRACE_BIN_FORWARD) rise[g] = 1;
      }
    }
    for (size_t g = 0; g < c->n; g++) {
      c->live[g] = c->live[g] + tmp[g] < c->live[g] ? UINT64_MAX : c->live[g] + tmp[g];
      c->phys[g] = c->phys[g] + tmpp[g] < c->phys[g] ? UINT64_MAX : c->phys[g] + tmpp[g];
      if (rise[g] && c->rising[g] < 255) c->rising[g]++;
    }
  }
  free(tmp);
  free(tmpp);
  free(rise);
  c->trough_bytes = UINT64_MAX;
  for (size_t g = 0; g < c->n; g++) {
    if (c->live[g] > c->peak_bytes) {
      c->peak_bytes = c->live[g];
      c->peak_ns = t0 + g * c->width_ns;
    }
    if (c->phys[g] > c->physical_peak_bytes) {
      c->physical_peak_bytes = c->phys[g];
      c->physical_peak_ns = t0 + g * c->width_ns;
    }
    /* Bins wholly inside the span every trace covers (ts < c1 first: c1 - ts is unsigned). */
    uint64_t ts = t0 + g * c->width_ns;
    if ((c0 >= c1 || (ts >= c0 && ts < c1 && c1 - ts >= c->width_ns)) &&
        c->live[g] < c->trough_bytes)
      c->trough_bytes = c->live[g];
  }
  if (c->trough_bytes == UINT64_MAX) c->trough_bytes = 0;
  if (sweep_phys(a, k, c)) {
    wl_trace_combined_destroy(c);
    return -ENOMEM;
  }
  if (sweep_rises(a, k, c)) {
    wl_trace_combined_destroy(c);
    return -ENOMEM;
  }
  *out = c;
  return 0;
}

void wl_trace_combined_destroy(wl_trace_combined_t *c) {
  if (!c) return;
  free(c->live);
  free(c->phys);
  free(c->rising);
  free(c->overlap);
  free(c);
}
