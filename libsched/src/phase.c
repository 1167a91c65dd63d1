/* The phase detector: turns (time, thread, alloc/free size, launch) events into iteration
 * phases, from explicit markers when the trainer gives them, else from the learned repeating
 * allocation sequence, its peak and the live bytes, reporting UNKNOWN until it is confident. */
#include "internal.h"

#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

/* How far ahead in the pattern an event may match: a few events of one iteration may be missing
 * (an allocation served from elsewhere, a branch not taken). */
#define LOOKAHEAD 3
/* An allocation matches when its live bytes, relative to the iteration's start, are within this
 * fraction of the learned amplitude from the pattern's: an evaluation pass, which frees as it
 * goes, drifts away from the training curve within a few layers. */
#define R_TOL 0.3
/* The same when skipping pattern events to match a later one. */
#define R_TOL_SKIP 0.1
/* Learning runs this often (in alloc/free events) while nothing is learned, or more often while
 * the history is short: an attempt scans the history, so every span / LEARN_SHARE events keeps
 * its cost a few ring reads per event, and a short iteration (a small model, tens of events) is
 * learned within its third or fourth occurrence instead of after 256 events. */
#define LEARN_EVERY 256
#define LEARN_FIRST 12
#define LEARN_SHARE 8
/* Two cycles are "the same iteration" when at least this share of events match both ways. */
#define LEARN_MATCH 0.85
/* Learning aligns two iterations that differ by at most this many events. */
#define BAND 32
/* Iterations between two prunings of the pattern. */
#define PRUNE_EVERY 8
/* Shortest learnable iteration in alloc/free events. */
#define MIN_PERIOD 6
/* After an announced beginning, this many unmatched events in a row mean it was not one (an
 * evaluation pass frees as it goes; stray allocations come one at a time). */
#define LOST_RUN 3
/* An iteration begins with live bytes within this fraction of the amplitude above the last
 * trough (stray allocations are small; a pass that has allocated anything is not at its start). */
#define TROUGH_TOL 0.05
/* A lost tracker takes an allocation of exactly the first size made within this (stricter)
 * fraction above the trough as a new beginning. */
#define RESYNC_TOL 0.02
/* Most pattern events a beginning may have to match before it is announced. A false start (a
 * beginning taken back before the peak: an evaluation pass that starts like a training
 * iteration) after d matched events makes every later beginning wait for d + 1, when d + 1 is at
 * most this: such passes diverge within their first layers. */
#define CONFIRM_MAX 6
/* False starts in the first iterations after learning are not evidence (the warm-up's last
 * iterations differ from the rest), and after this many iterations without one, beginnings are
 * announced at once again (evaluation passes of every epoch cost one false start each). */
#define CONFIRM_PROBATION 4
#define CONFIRM_DECAY     32

typedef struct ring_ev_s {
  int64_t delta; /* + allocated, - freed */
  uint64_t live; /* live bytes after the event */
  uint64_t thread;
} ring_ev_t;

typedef struct pat_s {
  int64_t delta;
  float r;     /* live after the event, minus live before the iteration, over the amplitude */
  uint8_t thr; /* 0: the thread that begins iterations, 1: another (autograd) */
} pat_t;

/* Following a pattern: where we are, and a skip that awaits confirmation. */
typedef struct follow_s {
  size_t pos;   /* the next expected index */
  long pending; /* the index the previous event matched by skipping, unconfirmed; -1: none */
} follow_t;

struct wl_phase_s {
  wl_phase_config_t cfg;
  ring_ev_t *ring;
  size_t cap;
  uint64_t n; /* alloc/free events seen */
  uint64_t live;
  /* markers */
  bool markers;
  wl_phase_kind_t marker_phase;
  /* the learned iteration */
  pat_t *pat, *scratch;
  uint8_t *matched;
  uint32_t *dp; /* the alignment table, grown to (period + 1) x (2 BAND + 1) */
  size_t dp_cap;
  size_t plen, peak, idle;
  uint64_t amp;
  uint64_t main_thread;
  bool locked;
  follow_t fw;
  int64_t pending_delta; /* the last unmatched event, should a skip confirm it */
  uint64_t pending_lb;
  uint64_t base;   /* live bytes before the current iteration began */
  uint64_t trough; /* the same for the last iteration that began */
  double scale;    /* this iteration's batch relative to the learned one */
  uint64_t window; /* last 64 events: 1 matched, 0 not */
  uint64_t low_events;
  unsigned miss_run;   /* unmatched events in a row */
  size_t cycle_hits;   /* pattern events matched in this iteration */
  uint16_t *hits;      /* per pattern event: iterations that had it, since the last pruning */
  uint64_t pcycles;    /* iterations since the last pruning */
  unsigned bad_cycles; /* iterations in a row that matched under 90 % of the pattern */
  bool in_iter, confident_iter, peak_passed;
  unsigned confirm;       /* pattern events a beginning must match before it is announced */
  bool pending_begin;     /* a beginning found and not yet announced */
  unsigned begin_matched; /* pattern events matched since the last beginning (until the peak) */
  unsigned begin_events;  /* alloc/free events since it, itself included */
  unsigned suspect;       /* a beginning taken back after suspect - 1 matched events; 0: none */
  unsigned begin_prefix;  /* pattern events matched since it before the first miss or skip */
  bool begin_clean;       /* no miss or skip since it yet */
  unsigned begin_run;     /* pattern events matched in a row, to the current one */
  unsigned iters_learned; /* iterations that reached their peak since the pattern was learned */
  unsigned iters_clean;   /* the same since the last false start */
  wl_phase_kind_t phase;
  uint64_t since_learn;
  uint64_t iterations;
  wl_phase_stats_t st;
};

void wl_phase_config_default(wl_phase_config_t *cfg) {
  memset(cfg, 0, sizeof *cfg);
  cfg->history = 32768;
  cfg->min_confidence = 0.75f;
}

const char *wl_phase_name(wl_phase_kind_t phase) {
  switch (phase) {
  case WL_PHASE_ITER_BEGIN:
    return "iter_begin";
  case WL_PHASE_FORWARD:
    return "forward";
  case WL_PHASE_BACKWARD:
    return "backward";
  case WL_PHASE_IDLE:
    return "idle";
  default:
    return "unknown";
  }
}

int wl_phase_create(wl_phase_t **out, const wl_phase_config_t *cfg_in) {
  if (!out) return -EINVAL;
  wl_phase_config_t cfg;
  wl_phase_config_default(&cfg);
  if (cfg_in) {
    if (cfg_in->history) cfg.history = cfg_in->history;
    if (cfg_in->min_confidence > 0) cfg.min_confidence = cfg_in->min_confidence;
    cfg.max_period = cfg_in->max_period;
  }
  if (cfg.history < 3 * MIN_PERIOD || cfg.history > ((size_t)1 << 26) || cfg.min_confidence > 1.0f)
    return -EINVAL;
  if (!cfg.max_period || cfg.max_period > cfg.history / 3) cfg.max_period = cfg.history / 3;
  if (cfg.max_period < MIN_PERIOD) return -EINVAL;
  wl_phase_t *p = calloc(1, sizeof *p);
  if (!p) return -ENOMEM;
  p->cfg = cfg;
  p->cap = cfg.history;
  p->ring = calloc(p->cap, sizeof *p->ring);
  p->pat = calloc(cfg.max_period, sizeof *p->pat);
  p->scratch = calloc(cfg.max_period, sizeof *p->scratch);
  p->matched = calloc(cfg.max_period, 1);
  p->hits = calloc(cfg.max_period, sizeof *p->hits);
  if (!p->ring || !p->pat || !p->scratch || !p->matched || !p->hits) {
    wl_phase_destroy(p);
    return -ENOMEM;
  }
  p->phase = WL_PHASE_UNKNOWN;
  p->confirm = 1;
  *out = p;
  return 0;
}

void wl_phase_destroy(wl_phase_t *p) {
  if (!p) return;
  free(p->ring);
  free(p->pat);
  free(p->scratch);
  free(p->matched);
  free(p->hits);
  free(p->dp);
  free(p);
}

void wl_phase_stats_get(const wl_phase_t *p, wl_phase_stats_t *out) {
  *out = p->st;
  out->period = p->locked ? p->plen : 0;
  out->peak_index = p->locked ? p->peak : 0;
  out->confirm = p->confirm;
}

/* ---- matching --------------------------------------------------------------------------------*/

/* Half-octave size class: sizes within a factor of about 1.4 share a class. */
static int sclass(uint64_t x) {
  if (x < 2) return (int)x;
  int lg = 63 - __builtin_clzll(x);
  return 2 * lg + (int)((x >> (lg - 1)) & 1);
}

static uint64_t mag(int64_t d) {
  return d < 0 ? (uint64_t)(-(d + 1)) + 1 : (uint64_t)d;
}

/* exact: same size; otherwise neighbouring size classes (a smaller last batch) will do. */
static bool elem_match(const pat_t *pe, int64_t delta, uint8_t thr, double r, double scale,
                       bool exact, double tol) {
  if ((pe->delta > 0) != (delta > 0) || pe->thr != thr) return false;
  if (exact) {
    if (pe->delta != delta) return false;
  } else {
    int d = sclass(mag(pe->delta)) - sclass(mag(delta));
    if (d < -1 || d > 1) return false;
  }
  if (delta > 0 && fabs(r - (double)pe->r * scale) > tol) return false;
  return true;
}

static double rel(uint64_t live, uint64_t base, uint64_t amp) {
  return amp ? ((double)live - (double)base) / (double)amp : 0.0;
}

/* One event as the matcher sees it. */
typedef struct obs_s {
  int64_t delta;
  uint8_t thr;
  uint64_t live_before, live_after;
} obs_t;

/* Does the event match pattern index i? base is the current iteration's starting live bytes
 * and scale its batch; a candidate in the next iteration (next) measures from this event and
 * takes its scale from it. */
static bool match_at(const pat_t *pat, size_t i, const obs_t *o, bool next, uint64_t base,
                     uint64_t amp, double scale, bool exact, double tol) {
  uint64_t b = next ? o->live_before : base;
  double sc = next ? (double)mag(o->delta) / (double)mag(pat[i].delta) : scale;
  return elem_match(&pat[i], o->delta, o->thr, rel(o->live_after, b, amp), sc, exact, tol);
}

/* Advances f with one event. Returns the pattern index the event matched, or -1 (none, or a
 * skip that the next event must confirm). *from is where this step started, so the indices
 * passed are from .. result (cyclic); *prev tells that the previous event is now known to have
 * matched the index before the result. The expected event matches exactly, then nearly (a
 * smaller batch); a later one (up to LOOKAHEAD ahead: events the iteration did not make) only
 * exactly, with closely matching live bytes, and once the next event matches the index after
 * it: a stray allocation or a repeated size (every layer's weight gradient) must not make the
 * tracker jump over real events. */
static long follow(follow_t *f, const pat_t *pat, size_t len, const obs_t *o, uint64_t base,
                   uint64_t amp, double scale, bool exact_only, bool wrap, size_t *from,
                   bool *prev) {
  *from = f->pos;
  *prev = false;
  if (f->pending >= 0) {
    size_t k = ((size_t)f->pending + 1) % len;
    bool next = k == 0 || k < f->pos;
    if ((wrap || !next) &&
        (match_at(pat, k, o, next, base, amp, scale, true, R_TOL) ||
         (!exact_only && match_at(pat, k, o, next, base, amp, scale, false, R_TOL)))) {
      *prev = true;
      f->pending = -1;
      f->pos = (k + 1) % len;
      return (long)k;
    }
    f->pending = -1;
  }
  for (int pass = 0; pass < 2; pass++) {
    if (pass == 1 && exact_only) break;
    bool next = f->pos == 0;
    if (!wrap && next && *from != 0) break;
    if (match_at(pat, f->pos, o, next, base, amp, scale, pass == 0, R_TOL)) {
      long idx = (long)f->pos;
      f->pos = (f->pos + 1) % len;
      return idx;
    }
  }
  for (size_t d = 1; d <= LOOKAHEAD && d < len; d++) {
    size_t i = (f->pos + d) % len;
    bool next = f->pos + d >= len;
    if (next && !wrap) break;
    if (match_at(pat, i, o, next, base, amp, scale, true, R_TOL_SKIP)) {
      f->pending = (long)i;
      break;
    }
  }
  return -1;
}

/* ---- learning --------------------------------------------------------------------------------*/

static const ring_ev_t *ring_at(const wl_phase_t *p, uint64_t idx) {
  return &p->ring[idx % p->cap];
}

/* Live bytes before event idx. */
static uint64_t live_before(const wl_phase_t *p, uint64_t idx) {
  const ring_ev_t *e = ring_at(p, idx);
  return e->delta >= 0 ? e->live - (uint64_t)e->delta : e->live + mag(e->delta);
}

/* The last troughs of the live-bytes curve and the peak after each. */
#define ZZ_KEEP 6
typedef struct zz_s {
  uint64_t trough[ZZ_KEEP], peak[ZZ_KEEP]; /* peak[k]: highest event after trough[k] */
  int n;                                   /* troughs kept (the newest last) */
} zz_t;

/* Finds the troughs of the live-bytes curve over events [from, to) by a zigzag with half the
 * range as the reversal threshold. A trough is the last event at the minimum, so an iteration
 * begins with the event after it; the peak is the first event at the maximum. */
static bool zigzag(const wl_phase_t *p, uint64_t from, uint64_t to, zz_t *z) {
  uint64_t lo = UINT64_MAX, hi = 0;
  for (uint64_t i = from; i < to; i++) {
    uint64_t v = ring_at(p, i)->live;
    if (v < lo) lo = v;
    if (v > hi) hi = v;
  }
  if (hi <= lo || hi - lo < 4096) return false;
  uint64_t delta = (hi - lo) / 2;
  memset(z, 0, sizeof *z);
  int dir = 0;
  bool have_trough = false;
  uint64_t cmin = UINT64_MAX, cmin_i = from, cmax = 0, cmax_i = from;
  for (uint64_t i = from; i < to; i++) {
    uint64_t v = ring_at(p, i)->live;
    if (dir <= 0 && v <= cmin) cmin = v, cmin_i = i;
    if (dir >= 0 && v > cmax) cmax = v, cmax_i = i;
    if (dir <= 0 && v >= cmin + delta) {
      if (z->n == ZZ_KEEP) {
        memmove(z->trough, z->trough + 1, (ZZ_KEEP - 1) * sizeof z->trough[0]);
        memmove(z->peak, z->peak + 1, (ZZ_KEEP - 1) * sizeof z->peak[0]);
        z->n--;
      }
      z->trough[z->n] = cmin_i;
      z->peak[z->n] = 0;
      z->n++;
      have_trough = true;
      dir = 1;
      cmax = v, cmax_i = i;
    } else if (dir >= 0 && cmax >= v + delta) {
      if (have_trough) z->peak[z->n - 1] = cmax_i;
      dir = -1;
      cmin = v, cmin_i = i;
    }
  }
  return z->n >= 3;
}

/* Builds pattern elements for events (t, t2] relative to the trough at t. */
static size_t cycle_to_pattern(const wl_phase_t *p, uint64_t t, uint64_t t2, uint64_t amp,
                               uint64_t thread, pat_t *out) {
  uint64_t base = ring_at(p, t)->live;
  size_t k = 0;
  for (uint64_t i = t + 1; i <= t2; i++, k++) {
    const ring_ev_t *e = ring_at(p, i);
    out[k].delta = e->delta;
    out[k].r = (float)rel(e->live, base, amp);
    out[k].thr = e->thread == thread ? 0 : 1;
  }
  return k;
}

/* Do pattern event q and ring event e (of a cycle starting at base) match for learning? */
static bool same_event(const pat_t *q, const ring_ev_t *e, uint64_t base, uint64_t amp,
                       uint64_t thread) {
  return q->delta == e->delta && q->thr == (e->thread == thread ? 0 : 1) &&
         (e->delta < 0 || fabs((double)q->r - rel(e->live, base, amp)) <= R_TOL);
}

/* Aligns cycle (t1, t2] with pattern pat[0..len) (the previous cycle): the heaviest common
 * subsequence of events with the same exact size, sign and thread and nearly the same relative
 * live bytes, within a band around the diagonal (iterations differ by a few events, not by
 * shifts). An event weighs its size class, so that when a stray allocation happens to recur in
 * both cycles, a real event wins over it. Marks the matched events in p->matched and returns
 * how many matched; 0 when the lengths differ too much for the band (or out of memory). */
static size_t align(wl_phase_t *p, const pat_t *pat, size_t len, uint64_t t1, uint64_t t2,
                    uint64_t amp, uint64_t thread) {
  size_t n = (size_t)(t2 - t1);
  size_t diff = len > n ? len - n : n - len;
  if (diff + 4 > BAND) return 0;
  const size_t W = BAND, cols = 2 * BAND + 1;
  size_t need = (len + 1) * cols;
  if (need > p->dp_cap) {
    /* Learning an iteration longer than any before: the only allocation after creation. */
    uint32_t *dp = realloc(p->dp, need * sizeof *dp);
    if (!dp) return 0;
    p->dp = dp;
    p->dp_cap = need;
  }
  uint32_t *L = p->dp;
  uint64_t base = ring_at(p, t1)->live;
  /* L[i][j] for j in [i - W, i + W], stored at column j - i + W. */
#define CELL(i, j) L[(size_t)(i)*cols + (size_t)((j) + W - (i))]
#define IN(i, j)   ((j) + W >= (i) && (j) <= (i) + W)
  for (size_t i = 0; i <= len; i++) {
    size_t jlo = i > W ? i - W : 0, jhi = WL_MIN(n, i + W);
    for (size_t j = jlo; j <= jhi; j++) {
      uint32_t v = 0;
      if (i && j) {
        uint32_t up = IN(i - 1, j) ? CELL(i - 1, j) : 0;
        uint32_t left = IN(i, j - 1) ? CELL(i, j - 1) : 0;
        v = up > left ? up : left;
        if (same_event(&pat[i - 1], ring_at(p, t1 + j), base, amp, thread)) {
          uint32_t w = (uint32_t)sclass(mag(pat[i - 1].delta)) + 1;
          if (CELL(i - 1, j - 1) + w > v) v = CELL(i - 1, j - 1) + w;
        }
      }
      CELL(i, j) = v;
    }
  }
  memset(p->matched, 0, n);
  size_t i = len, j = n, hits = 0;
  while (i && j) {
    uint32_t here = CELL(i, j);
    uint32_t w = (uint32_t)sclass(mag(pat[i - 1].delta)) + 1;
    if (same_event(&pat[i - 1], ring_at(p, t1 + j), base, amp, thread) &&
        CELL(i - 1, j - 1) + w == here) {
      p->matched[j - 1] = 1;
      hits++;
      i--, j--;
    } else if (IN(i - 1, j) && CELL(i - 1, j) == here) {
      i--;
    } else {
      j--;
    }
  }
#undef IN
#undef CELL
  return hits;
}

static void track_event(wl_phase_t *p, int64_t delta, uint8_t thr, uint64_t lb,
                        wl_phase_result_t *r, bool report);

/* Tries to learn the iteration from cycles (t0, t1] and (t1, t2] with peaks pk1 and pk2. */
static bool learn_pair(wl_phase_t *p, const uint64_t tr[3], uint64_t pk1, uint64_t peak2);

/* Tries to learn the iteration from the history; true when locked. Two consecutive iterations
 * that match make the pattern; the newest such pair among the last few wins. */
static bool learn(wl_phase_t *p) {
  uint64_t end = p->n, span = WL_MIN(p->n, (uint64_t)p->cap);
  zz_t z;
  /* Old history (warm-up, a previous model) may hide the wave: look at ever shorter tails. */
  for (uint64_t len = span; len >= 3 * MIN_PERIOD; len /= 2) {
    if (!zigzag(p, end - len, end, &z)) continue;
    for (int k = z.n - 1; k >= 2; k--) {
      uint64_t tr[3] = {z.trough[k - 2], z.trough[k - 1], z.trough[k]};
      if (z.peak[k - 2] && z.peak[k - 1] && learn_pair(p, tr, z.peak[k - 2], z.peak[k - 1]))
        return true;
    }
    return false;
  }
  return false;
}

static bool learn_pair(wl_phase_t *p, const uint64_t tr[3], uint64_t pk1, uint64_t peak2) {
  uint64_t end = p->n;
  uint64_t pk[2] = {pk1, peak2};
  uint64_t n1 = tr[1] - tr[0], n2 = tr[2] - tr[1];
  if (n1 < MIN_PERIOD || n2 < MIN_PERIOD || n1 > p->cfg.max_period || n2 > p->cfg.max_period)
    return false;
  uint64_t lmax = WL_MAX(n1, n2), lmin = WL_MIN(n1, n2);
  if (lmax - lmin > lmax / 10 + 4) return false;
  if (ring_at(p, pk[0])->live < ring_at(p, tr[0])->live ||
      ring_at(p, peak2)->live < ring_at(p, tr[1])->live)
    return false;
  uint64_t a1 = ring_at(p, pk[0])->live - ring_at(p, tr[0])->live;
  uint64_t a2 = ring_at(p, peak2)->live - ring_at(p, tr[1])->live;
  uint64_t amax = WL_MAX(a1, a2), amin = WL_MIN(a1, a2);
  if (amax == 0 || (double)(amax - amin) > 0.35 * (double)amax) return false;
  /* The thread that begins the newer cycle is the main thread. */
  uint64_t thread = ring_at(p, tr[1] + 1)->thread;
  size_t len1 = cycle_to_pattern(p, tr[0], tr[1], a1, thread, p->scratch);
  size_t hits = align(p, p->scratch, len1, tr[1], tr[2], a2, thread);
  if ((double)hits < LEARN_MATCH * (double)n2 || (double)hits < LEARN_MATCH * (double)n1)
    return false;
  /* The pattern is the newer cycle without its unmatched (noise) events. */
  size_t len2 = cycle_to_pattern(p, tr[1], tr[2], a2, thread, p->scratch);
  /* The peak is the highest matched allocation up to the cycle's maximum: the maximum itself
   * unless that was noise. */
  size_t k = 0, peak = 0;
  float best = -1e30f;
  for (size_t i = 0; i < len2; i++) {
    if (!p->matched[i]) continue;
    p->pat[k] = p->scratch[i];
    if (p->pat[k].delta > 0 && tr[1] + 1 + i <= peak2 && p->pat[k].r > best) {
      best = p->pat[k].r;
      peak = k;
    }
    k++;
  }
  if (k < MIN_PERIOD) return false;
  p->plen = k;
  p->peak = peak;
  /* IDLE from the first event after the peak that is back near the trough. */
  p->idle = k;
  for (size_t i = peak + 1; i < k; i++)
    if (p->pat[i].r <= 0.1f) {
      p->idle = i;
      break;
    }
  p->amp = a2;
  p->main_thread = thread;
  p->locked = true;
  p->window = ~0ull;
  p->low_events = 0;
  p->st.learned++;
  /* Catch up with the events after the newer cycle (the current iteration so far). */
  p->fw.pos = 0;
  p->fw.pending = -1;
  p->cycle_hits = 0;
  p->bad_cycles = 0;
  p->pcycles = 0;
  memset(p->hits, 0, p->plen * sizeof *p->hits);
  p->scale = 1.0;
  p->base = p->trough = ring_at(p, tr[2])->live;
  p->in_iter = false;
  p->confident_iter = false;
  p->peak_passed = false;
  p->pending_begin = false;
  p->suspect = 0;
  p->iters_learned = p->iters_clean = 0;
  p->confirm = 1; /* a new pattern: what was learned of false starts is stale */
  for (uint64_t i = tr[2] + 1; i < end; i++) {
    const ring_ev_t *e = ring_at(p, i);
    track_event(p, e->delta, e->thread == thread ? 0 : 1, live_before(p, i), NULL, false);
  }
  return true;
}

/* ---- tracking --------------------------------------------------------------------------------*/

static double confidence(const wl_phase_t *p) {
  return (double)__builtin_popcountll(p->window) / 64.0;
}

/* Drops the pattern events that most iterations did not have (strays that happened to recur
 * in the two iterations it was learned from), every PRUNE_EVERY iterations. *cur is the index
 * just matched; it is moved to its place in the pruned pattern (the tracker's position too). A
 * pattern that loses too much is forgotten instead. */
static void prune(wl_phase_t *p, size_t *cur) {
  uint32_t keep_min = (uint32_t)(p->pcycles / 2);
  size_t k = 0, npeak = SIZE_MAX, ncur = 0, npos = 0, old_pos = p->fw.pos;
  float best = -1e30f;
  size_t best_i = 0;
  for (size_t i = 0; i < p->plen; i++) {
    bool keep = p->hits[i] >= keep_min;
    if (i == *cur) ncur = k;
    if (i == old_pos) npos = k;
    if (!keep) continue;
    if (i == p->peak) npeak = k;
    if (i <= p->peak && p->pat[i].delta > 0 && p->pat[i].r > best) best = p->pat[i].r, best_i = k;
    p->pat[k++] = p->pat[i];
  }
  if (k < MIN_PERIOD || k * 10 < p->plen * 7) {
    p->locked = false;
    p->in_iter = p->confident_iter = false;
    p->st.lost++;
    p->since_learn = 0;
    return;
  }
  if (k < p->plen) p->st.pruned += p->plen - k;
  p->plen = k;
  p->peak = npeak != SIZE_MAX ? npeak : best_i;
  p->idle = k;
  for (size_t i = p->peak + 1; i < k; i++)
    if (p->pat[i].r <= 0.1f) {
      p->idle = i;
      break;
    }
  *cur = ncur < k ? ncur : 0;
  p->fw.pos = npos % k;
  p->fw.pending = -1;
  memset(p->hits, 0, k * sizeof *p->hits);
  p->pcycles = 0;
}

/* A beginning was taken back after `matched` pattern events. If the next beginning comes before
 * this iteration's peak, it was not one (an evaluation pass, not a burst of noise inside a real
 * iteration): see suspect_settle. */
static void false_start(wl_phase_t *p, unsigned matched) {
  p->suspect = matched + 1;
}

/* At a beginning: the suspect start never reached its peak, so it was a false start, and later
 * beginnings must match one event more than it did before they are announced (unless that is
 * more than a pass diverging early would explain). */
static void suspect_settle(wl_phase_t *p) {
  if (!p->suspect) return;
  p->st.false_starts++;
  if (p->iters_learned >= CONFIRM_PROBATION) {
    p->iters_clean = 0;
    if (p->suspect > p->confirm && p->suspect <= CONFIRM_MAX) p->confirm = p->suspect;
  }
  p->suspect = 0;
}

/* Follows the learned pattern with one alloc/free event whose live bytes before were lb. With
 * report false (catching up after learning) no boundary is reported. */
static void track_event(wl_phase_t *p, int64_t delta, uint8_t thr, uint64_t lb,
                        wl_phase_result_t *r, bool report) {
  uint64_t la = delta >= 0 ? lb + (uint64_t)delta : lb - WL_MIN(lb, mag(delta));
  uint64_t tol_bytes = (uint64_t)(TROUGH_TOL * (double)p->amp);
  obs_t o = {delta, thr, lb, la};
  bool begin = false, peak = false, prev = false;
  size_t from = p->fw.pos;
  long idx;
  if (confidence(p) < p->cfg.min_confidence && delta == p->pat[0].delta && thr == p->pat[0].thr &&
      lb <= p->trough + (uint64_t)(RESYNC_TOL * (double)p->amp)) {
    /* Lost (after an evaluation pass, say), and this looks exactly like a beginning. */
    p->fw.pos = 1 % p->plen;
    p->fw.pending = -1;
    p->window = ~0ull;
    p->low_events = 0;
    p->st.resyncs++;
    idx = 0;
    from = 0;
  } else {
    idx = follow(&p->fw, p->pat, p->plen, &o, p->base, p->amp, p->scale, false, true, &from, &prev);
  }
  if (idx >= 0) {
    size_t i = (size_t)idx;
    /* Unwrapped end of the indices passed by this step. */
    size_t to = i >= from ? i : i + p->plen;
    p->hits[i] += p->hits[i] < UINT16_MAX;
    if (prev) {
      size_t pi = (i + p->plen - 1) % p->plen;
      p->hits[pi] += p->hits[pi] < UINT16_MAX;
    }
    /* A step that starts at index 0 or wraps past the end enters a new iteration. Its first
     * events may be missing from the stream (a stray allocation learned by chance): the first
     * matched event then begins it. */
    if (i == 0 || from == 0 || to >= p->plen) {
      /* A pattern that keeps matching badly is stale (the warm-up, or the program changed):
       * learn again. */
      p->bad_cycles = p->cycle_hits * 10 < p->plen * 9 ? p->bad_cycles + 1 : 0;
      p->cycle_hits = 0;
      bool first_prev = prev && i > 0;
      size_t first = first_prev ? i - 1 : i;
      uint64_t start = first_prev ? p->pending_lb : lb;
      int64_t first_delta = first_prev ? p->pending_delta : delta;
      /* Live bytes the missing events would have added. */
      uint64_t back =
          first ? (uint64_t)(fmax(0.0, p->pat[first - 1].r) * p->scale * (double)p->amp) : 0;
      uint64_t s0 = start > back ? start - back : 0;
      p->scale = (double)mag(first_delta) / (double)mag(p->pat[first].delta);
      if (p->scale < 0.5 || p->scale > 2.0) p->scale = 1.0;
      /* A beginning starts from the trough: an evaluation pass whose second allocation looks
       * like a first one does not. */
      begin = s0 <= p->trough + tol_bytes;
      if (!begin) {
        p->in_iter = true;
        p->confident_iter = false;
        p->peak_passed = first > p->peak;
      }
      p->base = p->trough = s0;
      if (++p->pcycles >= PRUNE_EVERY) {
        bool told = p->confident_iter && !p->peak_passed;
        prune(p, &i);
        if (!p->locked) {
          /* The pattern is gone with an announced iteration before its peak: take it back. */
          if (told && r && report) r->flags |= WL_PHASE_F_LOST;
          return;
        }
        from = to = i;
      }
    }
    p->cycle_hits += prev ? 2 : 1;
    /* Did we reach (or pass) the peak? */
    size_t pk = p->peak;
    if (!begin && to < p->plen && from <= pk && pk <= to) peak = true;
    p->window = (p->window << 1) | 1;
    if (prev) p->window |= 2;
    p->miss_run = 0;
  } else {
    p->window <<= 1;
    p->st.noise++;
    p->miss_run++;
    p->pending_delta = delta;
    p->pending_lb = lb;
  }
  double conf = confidence(p);
  bool ok = conf >= p->cfg.min_confidence;
  if (begin) {
    suspect_settle(p);
    p->in_iter = true;
    p->peak_passed = false;
    p->confident_iter = false;
    p->pending_begin = ok && report;
    p->begin_matched = p->begin_events = p->begin_prefix = p->begin_run = 0;
    p->begin_clean = true;
  }
  /* Pattern events this step passed over without a matching event (a skip). */
  bool skipped =
      idx >= 0 && !begin && (size_t)idx != from && !(prev && (size_t)idx == (from + 1) % p->plen);
  if (p->in_iter && !p->peak_passed) {
    p->begin_events++;
    if (idx < 0 || skipped) p->begin_clean = false;
    if (idx >= 0) p->begin_matched += prev ? 2 : 1;
    p->begin_run = idx >= 0 ? p->begin_run + (prev ? 2 : 1) : 0;
    if (idx >= 0 && p->begin_clean) p->begin_prefix = p->begin_matched;
  }
  bool failing = !ok || p->miss_run >= LOST_RUN;
  if (p->pending_begin) {
    if (failing || skipped) {
      /* Not announced, so nothing to take back; later beginnings may have to wait longer. A
       * stray event does not end a pending beginning, a skipped pattern event does: the pass
       * lacks what the iteration has. */
      p->pending_begin = false;
      false_start(p, p->begin_prefix);
    } else if (idx >= 0 && p->begin_run >= p->confirm) {
      /* confirm events in a row: a stray between them only delays the announcement, while a
       * pass that frees as it goes never gets there. */
      p->pending_begin = false;
      p->confident_iter = true;
      p->iterations++;
      p->st.begins++;
      if (r) {
        r->flags |= WL_PHASE_F_BEGIN;
        r->begin_lag = p->begin_events - 1;
      }
    }
  }
  if (peak && p->in_iter && !p->peak_passed) {
    p->peak_passed = true;
    p->pending_begin = false; /* a peak before the confirmation: this iteration goes ungated */
    p->suspect = 0;           /* it was an iteration after all */
    p->iters_learned++;
    if (++p->iters_clean >= CONFIRM_DECAY) p->confirm = 1;
    if (p->confident_iter && report) {
      p->st.peaks++;
      if (r) r->flags |= WL_PHASE_F_PEAK;
    }
  }
  if (failing && p->confident_iter && !p->peak_passed) {
    /* We told the caller an iteration began, and no longer recognise it. */
    p->confident_iter = false;
    false_start(p, p->begin_prefix);
    if (r && report) r->flags |= WL_PHASE_F_LOST;
  }
  if (!ok) {
    p->phase = WL_PHASE_UNKNOWN;
  } else if (begin) {
    p->phase = p->confident_iter ? WL_PHASE_ITER_BEGIN : WL_PHASE_UNKNOWN;
  } else if (!p->in_iter || !p->confident_iter) {
    p->phase = WL_PHASE_UNKNOWN;
  } else if (!p->peak_passed) {
    p->phase = WL_PHASE_FORWARD;
  } else {
    size_t pos = p->fw.pos;
    p->phase = (!peak && (pos >= p->idle || pos == 0)) ? WL_PHASE_IDLE : WL_PHASE_BACKWARD;
  }
  if (conf < 0.5 || p->bad_cycles >= 2) {
    /* Lost for a whole iteration or two: forget the pattern and learn again. */
    if (++p->low_events > 2 * (uint64_t)p->plen || p->bad_cycles >= 2) {
      /* The pattern goes: a beginning announced at this very event is withdrawn, one announced
       * before and not yet past its peak is taken back, or the caller would keep the gate's token
       * until the detector, learning again, announced another. */
      if (r && (r->flags & WL_PHASE_F_BEGIN))
        r->flags &= ~WL_PHASE_F_BEGIN;
      else if (r && report && p->confident_iter && !p->peak_passed)
        r->flags |= WL_PHASE_F_LOST;
      p->bad_cycles = 0;
      p->locked = false;
      p->in_iter = p->confident_iter = false;
      p->phase = WL_PHASE_UNKNOWN;
      p->st.lost++;
      p->since_learn = 0;
    }
  } else {
    p->low_events = 0;
  }
  if (r) r->confidence = (float)conf;
}

/* ---- markers ---------------------------------------------------------------------------------*/

static void on_marker(wl_phase_t *p, wl_phase_event_kind_t k, wl_phase_result_t *r) {
  if (!p->markers) {
    p->markers = true;
    p->locked = false;
  }
  switch (k) {
  case WL_PEV_MARK_ITER_BEGIN:
    if (p->marker_phase == WL_PHASE_FORWARD) r->flags |= WL_PHASE_F_LOST; /* no backward */
    p->marker_phase = WL_PHASE_ITER_BEGIN;
    r->flags |= WL_PHASE_F_BEGIN;
    p->iterations++;
    p->st.begins++;
    break;
  case WL_PEV_MARK_BACKWARD:
    if (p->marker_phase == WL_PHASE_ITER_BEGIN || p->marker_phase == WL_PHASE_FORWARD) {
      r->flags |= WL_PHASE_F_PEAK;
      p->st.peaks++;
    }
    p->marker_phase = WL_PHASE_BACKWARD;
    break;
  default:
    /* An iteration that ends without a backward (an evaluation step): the gate goes too. */
    if (p->marker_phase == WL_PHASE_ITER_BEGIN || p->marker_phase == WL_PHASE_FORWARD)
      r->flags |= WL_PHASE_F_PEAK;
    p->marker_phase = WL_PHASE_IDLE;
    break;
  }
}

static uint64_t learn_interval(const wl_phase_t *p) {
  uint64_t span = WL_MIN(p->n, (uint64_t)p->cap) / LEARN_SHARE;
  return WL_MAX((uint64_t)LEARN_FIRST, WL_MIN(span, (uint64_t)LEARN_EVERY));
}

wl_phase_kind_t wl_phase_feed(wl_phase_t *p, const wl_phase_event_t *ev, wl_phase_result_t *out) {
  wl_phase_result_t r = {0};
  if (!p || !ev) {
    if (out) *out = r;
    return WL_PHASE_UNKNOWN;
  }
  p->st.events++;
  switch (ev->kind) {
  case WL_PEV_MARK_ITER_BEGIN:
  case WL_PEV_MARK_BACKWARD:
  case WL_PEV_MARK_ITER_END:
    on_marker(p, ev->kind, &r);
    break;
  case WL_PEV_ALLOC:
  case WL_PEV_FREE: {
    uint64_t sz = ev->size > (size_t)INT64_MAX ? (uint64_t)INT64_MAX : (uint64_t)ev->size;
    int64_t delta = ev->kind == WL_PEV_ALLOC ? (int64_t)sz : -(int64_t)sz;
    uint64_t lb = p->live;
    /* Saturating: a free of memory allocated before we started watching cannot underflow. */
    p->live = delta >= 0 ? (lb > UINT64_MAX - sz ? UINT64_MAX : lb + sz) : lb - WL_MIN(lb, sz);
    ring_ev_t *e = &p->ring[p->n % p->cap];
    e->delta = delta;
    e->live = p->live;
    e->thread = ev->thread;
    p->n++;
    if (p->markers) {
      if (p->marker_phase == WL_PHASE_ITER_BEGIN) p->marker_phase = WL_PHASE_FORWARD;
      break;
    }
    if (p->locked) {
      track_event(p, delta, ev->thread == p->main_thread ? 0 : 1, lb, &r, true);
    } else if (++p->since_learn >= learn_interval(p)) {
      p->since_learn = 0;
      learn(p);
    }
    break;
  }
  default: /* launches: only markers mode uses them, to leave ITER_BEGIN */
    if (p->markers && p->marker_phase == WL_PHASE_ITER_BEGIN) p->marker_phase = WL_PHASE_FORWARD;
    break;
  }
  if (p->markers) {
    r.phase = p->marker_phase;
    r.confidence = 1.0f;
    r.source = WL_PHASE_SRC_MARKERS;
    if (r.phase == WL_PHASE_ITER_BEGIN && !(r.flags & WL_PHASE_F_BEGIN)) r.phase = WL_PHASE_FORWARD;
  } else if (p->locked) {
    r.phase = p->phase;
    r.source = WL_PHASE_SRC_PATTERN;
    if (ev->kind != WL_PEV_ALLOC && ev->kind != WL_PEV_FREE) {
      r.confidence = (float)confidence(p);
      if (r.phase == WL_PHASE_ITER_BEGIN) r.phase = WL_PHASE_FORWARD;
    }
  } else {
    r.phase = WL_PHASE_UNKNOWN;
  }
  r.iterations = p->iterations;
  r.live_bytes = (size_t)WL_MIN(p->live, (uint64_t)SIZE_MAX);
  if (out) *out = r;
  return r.phase;
}
