/* Finding iterations in the live-bytes wave when the trace carries no markers: the period from
 * the autocorrelation of the binned wave (by FFT), then each iteration's begin, peak and fall
 * from thresholds on a sliding window one period long. */
#include "analysis.h"
#include "util.h"

#include <errno.h>
#include <math.h>
#include <stdlib.h>

/* In-place iterative radix-2 FFT of n (a power of two) complex values; inverse when inv. */
static void fft(double *re, double *im, size_t n, int inv) {
  for (size_t i = 1, j = 0; i < n; i++) {
    size_t bit = n >> 1;
    for (; j & bit; bit >>= 1) j ^= bit;
    j ^= bit;
    if (i < j) {
      double t = re[i];
      re[i] = re[j];
      re[j] = t;
      t = im[i];
      im[i] = im[j];
      im[j] = t;
    }
  }
  for (size_t len = 2; len <= n; len <<= 1) {
    double ang = 2 * M_PI / (double)len * (inv ? 1 : -1);
    double wr = cos(ang), wi = sin(ang);
    for (size_t i = 0; i < n; i += len) {
      double cr = 1, ci = 0;
      for (size_t k = 0; k < len / 2; k++) {
        size_t p = i + k, q = i + k + len / 2;
        double xr = re[q] * cr - im[q] * ci, xi = re[q] * ci + im[q] * cr;
        re[q] = re[p] - xr;
        im[q] = im[p] - xi;
        re[p] += xr;
        im[p] += xi;
        double t = cr * wr - ci * wi;
        ci = cr * wi + ci * wr;
        cr = t;
      }
    }
  }
}

/* Autocorrelation r[0..m) of y[0..m) (biased: sum over the overlap). r must hold m values. */
static int autocorr(const double *y, size_t m, double *r) {
  size_t n = 1;
  while (n < 2 * m) n <<= 1;
  double *re = calloc(n, sizeof *re), *im = calloc(n, sizeof *im);
  if (!re || !im) {
    free(re);
    free(im);
    return -ENOMEM;
  }
  memcpy(re, y, m * sizeof *y);
  fft(re, im, n, 0);
  for (size_t i = 0; i < n; i++) {
    re[i] = re[i] * re[i] + im[i] * im[i];
    im[i] = 0;
  }
  fft(re, im, n, 1);
  for (size_t i = 0; i < m; i++) r[i] = re[i] / (double)n;
  free(re);
  free(im);
  return 0;
}

/* Sliding maximum (sign 1) or minimum (sign -1) of x over [i - h, i + h], by a monotonic deque. */
static void sliding(const uint64_t *x, size_t n, size_t h, int sign, uint64_t *out, size_t *dq) {
  size_t head = 0, tail = 0, next = 0;
  for (size_t i = 0; i < n; i++) {
    size_t hi = i + h < n ? i + h : n - 1;
    for (; next <= hi; next++) {
      while (tail > head && (sign > 0 ? x[dq[tail - 1]] <= x[next] : x[dq[tail - 1]] >= x[next]))
        tail--;
      dq[tail++] = next;
    }
    size_t lo = i > h ? i - h : 0;
    while (dq[head] < lo) head++;
    out[i] = x[dq[head]];
  }
}

/* The k-th smallest of v[0..n) (v is reordered): Wirth's selection, linear on average. */
static uint64_t select_k(uint64_t *v, size_t n, size_t k) {
  long l = 0, r = (long)n - 1, kk = (long)k;
  while (l < r) {
    uint64_t x = v[kk];
    long i = l, j = r;
    do {
      while (v[i] < x) i++;
      while (x < v[j]) j--;
      if (i <= j) {
        uint64_t t = v[i];
        v[i] = v[j];
        v[j] = t;
        i++;
        j--;
      }
    } while (i <= j);
    if (j < kk) l = i;
    if (kk < i) r = j;
  }
  return v[k];
}

#define DECIM_MAX 32768u /* points the FFT sees at most */

/* The period of y[0..m) (mean removed) in points: the strongest autocorrelation peak past the
 * central lobe with two periods inside the window, preferring the fundamental. For long inputs
 * the FFT runs on a decimated copy and the lag is refined on the full resolution. 0 with *p and
 * *rho (the normalised, unbiased autocorrelation there) set; 1 when there is no period; or
 * -ENOMEM. */
static int find_period_d(const double *y, size_t m, size_t d, double *p, double *rho) {
  size_t md = m / d;
  if (md < 32) d = 1, md = m;
  double *yd = malloc(md * sizeof *yd), *r = malloc(md * sizeof *r);
  int rc = -ENOMEM;
  if (!yd || !r) goto out;
  for (size_t i = 0; i < md; i++) {
    double acc = 0;
    for (size_t j = 0; j < d; j++) acc += y[i * d + j];
    yd[i] = acc / (double)d;
  }
  if (autocorr(yd, md, r)) goto out;
  rc = 1;
  if (r[0] <= 0) goto out;
  size_t kmin = 1, kmax = md / 2;
  while (kmin < kmax && r[kmin] > 0) kmin++;
  if (kmin >= kmax) goto out;
  size_t kb = kmin;
  for (size_t k = kmin; k <= kmax; k++)
    if (r[k] > r[kb]) kb = k;
  if (r[kb] <= 0) goto out;
  for (size_t div = 4; div >= 2; div--) {
    size_t c = (kb + div / 2) / div, best = 0;
    for (size_t k = c > 2 ? c - 2 : 1; k <= c + 2 && k < kb; k++)
      if (k >= kmin && r[k] >= 0.9 * r[kb] && r[k] >= r[k - 1] && r[k] >= r[k + 1] &&
          (!best || r[k] > r[best]))
        best = k;
    if (best) {
      kb = best;
      break;
    }
  }
  double lag, rk, r0;
  if (d == 1) {
    lag = (double)kb;
    if (kb > 1 && kb + 1 < md) {
      double den = r[kb - 1] - 2 * r[kb] + r[kb + 1];
      if (den < 0) lag += 0.5 * (r[kb - 1] - r[kb + 1]) / den;
    }
    rk = r[kb];
    r0 = r[0];
  } else {
    /* exact products for the lags the decimated peak stands for */
    size_t lo = (kb - 1) * d, hi = (kb + 1) * d, best = kb * d;
    if (hi >= m) hi = m - 1;
    double rb = -INFINITY, prev = 0, at_prev = 0, at_next = 0;
    r0 = 0;
    for (size_t i = 0; i < m; i++) r0 += y[i] * y[i];
    for (size_t k = lo; k <= hi; k++) {
      double acc = 0;
      for (size_t i = 0; i + k < m; i++) acc += y[i] * y[i + k];
      if (acc > rb) {
        rb = acc;
        best = k;
        at_prev = k > lo ? prev : acc;
        at_next = acc;
      } else if (k == best + 1) {
        at_next = acc;
      }
      prev = acc;
    }
    lag = (double)best;
    double den = at_prev - 2 * rb + at_next;
    if (den < 0) lag += 0.5 * (at_prev - at_next) / den;
    rk = rb;
    kb = best;
  }
  if (r0 <= 0) goto out;
  double v = rk / r0 * (double)m / (double)(m - kb);
  *rho = v > 1 ? 1 : v < 0 ? 0 : v;
  *p = lag;
  rc = 0;
out:
  free(yd);
  free(r);
  return rc;
}

static int find_period(const double *y, size_t m, double *p, double *rho) {
  size_t d = (m + DECIM_MAX - 1) / DECIM_MAX;
  int rc = find_period_d(y, m, d, p, rho);
  /* A short period is blurred by the decimation (a fraction of a point decides between P and
   * 2P): look again at full resolution over a window that still holds hundreds of them. */
  if (d > 1 && (rc == 1 || (rc == 0 && *p < 64.0 * (double)d))) {
    double p2, rho2;
    int rc2 = find_period_d(y, WL_MIN(m, (size_t)DECIM_MAX), 1, &p2, &rho2);
    if (rc2 < 0) return rc2;
    if (rc2 == 0) {
      *p = p2;
      *rho = rho2;
      return 0;
    }
  }
  return rc;
}

int wl__detect_wave(wl_trace_analysis_t *a) {
  wl_trace_summary_t *s = &a->s;
  const size_t n = a->used;
  const wl_trace_bin_t *bins = a->bins;
  if (n < 32) return 0;
  const uint64_t w = (uint64_t)1 << a->shift;

  uint64_t gmax = 0;
  for (size_t i = 0; i < n; i++)
    if (bins[i].live_max > gmax) gmax = bins[i].live_max;
  if (gmax == 0) return 0;
  /* The steady part: from the first to the last bin at half the peak or more, so the ramp of
   * loading the model and the final teardown do not dominate the autocorrelation. */
  size_t i0 = 0, i1 = n - 1;
  while (i0 < n && bins[i0].live_max < gmax / 2) i0++;
  while (i1 > i0 && bins[i1].live_max < gmax / 2) i1--;
  size_t m = i1 - i0 + 1;
  if (m < 32) return 0;

  int rc = -ENOMEM;
  double *y = malloc(m * sizeof *y);
  uint64_t *x = malloc(n * sizeof *x), *xmin = malloc(n * sizeof *xmin);
  uint64_t *smax = malloc(n * sizeof *smax), *smin = malloc(n * sizeof *smin);
  size_t *dq = malloc(n * sizeof *dq);
  uint64_t *begins = NULL, *amp = NULL, *tmp = NULL;
  if (!y || !x || !xmin || !smax || !smin || !dq) goto out;
  double mean = 0;
  for (size_t i = 0; i < m; i++) mean += (double)bins[i0 + i].live_max;
  mean /= (double)m;
  for (size_t i = 0; i < m; i++) y[i] = (double)bins[i0 + i].live_max - mean;
  double p = 0, rho = 0;
  rc = find_period(y, m, &p, &rho);
  if (rc) {
    if (rc > 0) rc = 0;
    goto out;
  }
  s->autocorr = rho;
  s->candidate_period_ms = p * (double)w / 1e6;

  /* Rises through the middle of a window one period wide, with hysteresis. */
  size_t W = (size_t)(p + 0.5), h = W / 2;
  for (size_t i = 0; i < n; i++) {
    x[i] = bins[i].live_max;
    xmin[i] = bins[i].live_min;
  }
  sliding(x, n, h, 1, smax, dq);
  sliding(xmin, n, h, -1, smin, dq);
  uint64_t A = 0;
  for (size_t i = i0; i <= i1; i++)
    if (smax[i] - smin[i] > A) A = smax[i] - smin[i];
  /* The steady trough: a low percentile of the steady part. A window that reaches back before
   * the model was loaded would put the trough at zero; the local minimum wins only above it
   * (a slow leak lifts the trough over time). */
  tmp = malloc(m * sizeof *tmp);
  size_t cap = n / (W ? W / 2 + 1 : 1) + 2, nb = 0;
  begins = malloc(cap * sizeof *begins);
  amp = malloc(cap * sizeof *amp);
  if (!tmp || !begins || !amp) {
    rc = -ENOMEM;
    goto out;
  }
  memcpy(tmp, xmin + i0, m * sizeof *tmp);
  const uint64_t lo_s = select_k(tmp, m, m / 50);
  int low = 0, have_rise = 0;
  size_t last_rise = 0;
  for (size_t i = 0; i < n; i++) {
    uint64_t lo = smin[i], rg = smax[i] - smin[i];
    if (rg * 5 < A) continue; /* too flat here to call anything a rise */
    if (xmin[i] < lo + rg / 4) low = 1;
    if (low && x[i] >= lo + rg / 2) {
      low = 0;
      if (have_rise && (double)(i - last_rise) < 0.5 * p) continue;
      /* The begin: back down the rise to the trough. Walking back, keep the lowest bin seen;
       * stop at trough level, or once the wave climbs more than 5 % of the range above that
       * lowest bin (the previous fall, when there is no flat trough between). Smaller bumps
       * (a workspace allocated and freed) do not stop the walk. */
      uint64_t tl = WL_MAX(lo, WL_MIN(lo_s, x[i])), tol = (smax[i] - tl) / 20;
      size_t j = i, jmin = i, lim = i > W ? i - W : 0;
      if (have_rise && lim < last_rise) lim = last_rise;
      uint64_t runmin = x[i];
      while (j > lim && x[jmin] > tl) {
        uint64_t v = x[j - 1];
        if (v > runmin + tol) break;
        j--;
        if (v < runmin) runmin = v, jmin = j;
      }
      /* a bin at trough level lies before the rise; one above it holds the turn */
      size_t bj = x[jmin] <= tl && jmin < i ? jmin + 1 : jmin;
      if (nb < cap) begins[nb++] = bj;
      last_rise = i;
      have_rise = 1;
    }
  }
  /* Drop rises far smaller than the typical one (a model being loaded, a stray spike). */
  for (size_t k = 0; k < nb; k++) {
    size_t b = begins[k], e = k + 1 < nb ? begins[k + 1] : n;
    uint64_t hi = 0, lo = UINT64_MAX;
    for (size_t i = b; i < e; i++) {
      if (x[i] > hi) hi = x[i];
      if (xmin[i] < lo) lo = xmin[i];
    }
    amp[k] = hi - lo;
  }
  if (nb) {
    memcpy(tmp, amp, nb * sizeof *tmp);
    uint64_t med = select_k(tmp, nb, nb / 2);
    size_t k2 = 0;
    for (size_t k = 0; k < nb; k++)
      if (amp[k] * 2 >= med) begins[k2++] = begins[k];
    nb = k2;
  }
  wl__stat_t per = {0};
  for (size_t k = 0; k + 1 < nb; k++) wl__stat_add(&per, (double)(begins[k + 1] - begins[k]));
  double cv = per.n > 1 && per.mean > 0 ? wl__stat_sd(&per) / per.mean : 1.0;
  double reg = 1 - 2 * cv;
  if (reg < 0) reg = 0;
  double conf = rho * reg;
  if (nb < 3) conf *= 0.5;
  if (per.n && fabs(per.mean - p) > 0.2 * p) conf *= 0.5;
  s->confidence = conf;
  if (conf < 0.5) goto out;

  size_t nit = 0;
  for (size_t k = 0; k < nb; k++) {
    size_t b = begins[k], e = k + 1 < nb ? begins[k + 1] : n;
    size_t pk = b;
    uint64_t lo = UINT64_MAX;
    for (size_t i = b; i < e; i++) {
      if (x[i] > x[pk]) pk = i;
      if (xmin[i] < lo) lo = xmin[i];
    }
    uint64_t tl = WL_MAX(smin[pk], WL_MIN(lo_s, x[pk])), thr = tl + (x[pk] - tl) / 20;
    size_t f = pk;
    while (f < e && x[f] > thr) f++;
    if (k + 1 == nb && f >= n) break; /* the last rise never came back down: incomplete */
    if (k + 1 == nb) { /* the last one ends at its fall, not with the teardown after it */
      lo = UINT64_MAX;
      for (size_t i = b; i <= f; i++)
        if (xmin[i] < lo) lo = xmin[i];
    }
    wl_trace_iteration_t it = {0};
    it.begin_ns = a->t0 + b * w;
    it.backward_ns = a->t0 + pk * w;
    it.fall_ns = a->t0 + f * w;
    it.end_ns = k + 1 < nb ? a->t0 + e * w : it.fall_ns;
    it.peak_bytes = x[pk];
    it.trough_bytes = lo;
    wl__iter_record(a, &it);
    wl__stat_add(&a->fwd, (double)(it.backward_ns - it.begin_ns));
    wl__stat_add(&a->bwd, (double)(it.fall_ns - it.backward_ns));
    if (k + 1 < nb) {
      wl__stat_add(&a->period, (double)(it.end_ns - it.begin_ns));
      wl__stat_add(&a->idle, (double)(it.end_ns - it.fall_ns));
    }
    for (size_t i = b; i <= pk && i < n; i++) a->flags[i] |= WL_TRACE_BIN_FORWARD;
    for (size_t i = pk + 1; i <= f && i < n; i++) a->flags[i] |= WL_TRACE_BIN_BACKWARD;
    nit++;
  }
  if (nit) s->source = WL_TRACE_ITER_WAVE;
out:
  free(y);
  free(x);
  free(xmin);
  free(smax);
  free(smin);
  free(dq);
  free(begins);
  free(amp);
  free(tmp);
  return rc;
}
