/* The phase detector on synthetic training waves: noise, jitter, smaller batches, warm-up,
 * evaluation passes, one or two threads, markers, and irregular streams. Prints precision and
 * recall of the iteration boundaries (within one alloc/free event) and where peaks fell. */
#include "internal.h"
#include "wltest.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define KiB       ((size_t)1 << 10)
#define MiB       ((size_t)1 << 20)
#define MAXLAYERS 64

typedef struct gen_cfg_s {
  const char *name;
  int iterations;
  int layers, layers_var; /* layer count in [layers, layers + layers_var] */
  double noise;           /* chance of a stray allocation before each event */
  double jitter;          /* relative jitter of the time between events */
  double small_batch;     /* chance that an iteration's batch is 3/4 of the usual */
  int warmup;             /* iterations that allocate persistent state and try workspaces */
  int eval_every;         /* an evaluation pass after this many training iterations */
  double eval_scale;      /* its batch relative to training */
  int threads;            /* 2: backward on its own thread, as PyTorch's autograd */
  int markers;
  int random_stream; /* no iterations at all */
  unsigned seed;
} gen_cfg_t;

enum { IT_TRAIN = 0, IT_EVAL = 1, IT_WARMUP = 2 };

typedef struct truth_s {
  uint64_t begin, peak;
  uint64_t base, top; /* live bytes before the iteration and at its peak */
  int kind;
} truth_t;

typedef struct gen_s {
  const gen_cfg_t *cfg;
  wl_phase_t *det;
  unsigned rng;
  uint64_t t, idx, live, peak_live, peak_idx;
  /* stray allocations waiting to be freed */
  size_t stray[64];
  int stray_ttl[64];
  int nstray;
  /* ground truth and detections */
  truth_t truth[4096];
  int ntruth;
  uint64_t begins[8192], peaks[8192], losts[8192];
  uint32_t lags[8192]; /* per begin: events between the iteration's start and its announcement */
  uint64_t *live_at;   /* live bytes after each alloc/free event */
  size_t live_cap;
  int nbegins, npeaks, lost;
  size_t act[MAXLAYERS];
  int ws[MAXLAYERS];
} gen_t;

static double urand(gen_t *g) {
  return (double)rand_r(&g->rng) / ((double)RAND_MAX + 1.0);
}

static void feed(gen_t *g, wl_phase_event_kind_t kind, size_t size, int thread) {
  double j = 1.0 + g->cfg->jitter * (2.0 * urand(g) - 1.0);
  g->t += (uint64_t)(10000.0 * j);
  wl_phase_event_t ev = {
      .time_ns = g->t, .thread = 1000u + (unsigned)thread, .kind = kind, .size = size};
  wl_phase_result_t r;
  wl_phase_feed(g->det, &ev, &r);
  if (kind == WL_PEV_ALLOC || kind == WL_PEV_FREE) {
    if (kind == WL_PEV_ALLOC) {
      g->live += size;
      if (g->live > g->peak_live) g->peak_live = g->live, g->peak_idx = g->idx;
    } else {
      g->live -= size;
    }
    if (r.flags & WL_PHASE_F_BEGIN) {
      /* Where the detector says the iteration began (it may say so a few events later). */
      g->lags[g->nbegins & 8191] = r.begin_lag;
      g->begins[g->nbegins++ & 8191] = g->idx - WL_MIN(g->idx, (uint64_t)r.begin_lag);
    }
    if (r.flags & WL_PHASE_F_PEAK) g->peaks[g->npeaks++ & 8191] = g->idx;
    if (g->idx < g->live_cap) g->live_at[g->idx] = g->live;
    g->idx++;
  } else {
    if (r.flags & WL_PHASE_F_BEGIN) g->begins[g->nbegins++ & 8191] = g->idx;
    if (r.flags & WL_PHASE_F_PEAK) g->peaks[g->npeaks++ & 8191] = g->idx;
  }
  if (r.flags & WL_PHASE_F_LOST) g->losts[g->lost++ & 8191] = g->idx;
}

/* One alloc or free of the program, with stray allocations sprinkled in as noise. */
static void ev(gen_t *g, int alloc, size_t size, int thread) {
  for (int i = 0; i < g->nstray;) {
    if (--g->stray_ttl[i] <= 0) {
      feed(g, WL_PEV_FREE, g->stray[i], 0);
      g->stray[i] = g->stray[--g->nstray];
      g->stray_ttl[i] = g->stray_ttl[g->nstray];
    } else {
      i++;
    }
  }
  if (g->cfg->noise > 0 && g->nstray < 64 && urand(g) < g->cfg->noise) {
    size_t sz = 4 * KiB + (size_t)(urand(g) * 60.0) * KiB;
    feed(g, WL_PEV_ALLOC, sz, 0);
    g->stray[g->nstray] = sz;
    g->stray_ttl[g->nstray++] = 1 + (int)(urand(g) * 6.0);
  }
  feed(g, alloc ? WL_PEV_ALLOC : WL_PEV_FREE, size, thread);
}

static size_t scaled(size_t x, double f) {
  return (size_t)((double)x * f) & ~(size_t)255;
}

static void train_iteration(gen_t *g, int it, int kind) {
  const gen_cfg_t *c = g->cfg;
  int layers = c->layers + (c->layers_var ? (int)(urand(g) * (c->layers_var + 1)) : 0);
  if (layers > MAXLAYERS) layers = MAXLAYERS;
  double f = (c->small_batch > 0 && urand(g) < c->small_batch) ? 0.75 : 1.0;
  int bw = c->threads > 1 ? 1 : 0;
  g->peak_live = 0;
  truth_t *tr = &g->truth[g->ntruth++ & 4095];
  tr->kind = kind;
  size_t input = scaled(3 * MiB, f);
  tr->base = g->live;
  if (c->markers) {
    /* With markers the marker is the boundary. */
    tr->begin = g->idx;
    feed(g, WL_PEV_MARK_ITER_BEGIN, 0, 0);
    ev(g, 1, input, 0);
  } else {
    /* Strays come before the iteration's own first event. */
    ev(g, 1, input, 0);
    tr->begin = g->idx - 1;
  }
  size_t act[MAXLAYERS];
  for (int l = 0; l < layers; l++) {
    act[l] = scaled(g->act[l], f);
    ev(g, 1, act[l], 0);
    feed(g, WL_PEV_LAUNCH, 0, 0);
    if (g->ws[l]) {
      ev(g, 1, 256 * KiB, 0);
      ev(g, 0, 256 * KiB, 0);
    }
    if (kind == IT_WARMUP) { /* cuDNN-style trial workspaces */
      ev(g, 1, 8 * MiB, 0);
      ev(g, 0, 8 * MiB, 0);
    }
  }
  ev(g, 1, 4 * KiB, 0); /* loss */
  if (c->markers) feed(g, WL_PEV_MARK_BACKWARD, 0, 0);
  size_t grad = act[layers - 1];
  ev(g, 1, grad, bw);
  for (int l = layers - 1; l >= 0; l--) {
    size_t prev = l ? act[l - 1] : input;
    ev(g, 1, prev, bw);
    ev(g, 1, 512 * KiB, bw); /* weight gradient, kept until the optimizer step */
    feed(g, WL_PEV_LAUNCH, 0, bw);
    ev(g, 0, act[l], bw);
    ev(g, 0, grad, bw);
    grad = prev;
  }
  ev(g, 0, grad, bw);
  ev(g, 0, input, 0);
  ev(g, 0, 4 * KiB, 0);
  tr->peak = g->peak_idx;
  tr->top = g->peak_live;
  for (int l = 0; l < layers; l++) {
    ev(g, 1, 128 * KiB, 0);
    feed(g, WL_PEV_LAUNCH, 0, 0);
    ev(g, 0, 128 * KiB, 0);
    ev(g, 0, 512 * KiB, 0);
  }
  if (it == 0 && kind == IT_WARMUP)
    for (int l = 0; l < layers; l++) ev(g, 1, 1 * MiB, 0); /* optimizer state, kept */
  if (c->markers) feed(g, WL_PEV_MARK_ITER_END, 0, 0);
}

static void eval_pass(gen_t *g) {
  const gen_cfg_t *c = g->cfg;
  truth_t *tr = &g->truth[g->ntruth++ & 4095];
  tr->kind = IT_EVAL;
  size_t prev = scaled(3 * MiB, c->eval_scale);
  if (c->markers) {
    tr->begin = g->idx;
    feed(g, WL_PEV_MARK_ITER_BEGIN, 0, 0);
    ev(g, 1, prev, 0);
  } else {
    ev(g, 1, prev, 0);
    tr->begin = g->idx - 1;
  }
  for (int l = 0; l < c->layers; l++) {
    size_t a = scaled(g->act[l], c->eval_scale);
    ev(g, 1, a, 0);
    feed(g, WL_PEV_LAUNCH, 0, 0);
    ev(g, 0, prev, 0); /* no_grad: the input of a layer goes as soon as it is used */
    prev = a;
  }
  ev(g, 0, prev, 0);
  tr->peak = 0;
  if (c->markers) feed(g, WL_PEV_MARK_ITER_END, 0, 0);
}

static void random_stream(gen_t *g, int events) {
  size_t live[256];
  int n = 0;
  for (int i = 0; i < events; i++) {
    if (n < 256 && (n == 0 || urand(g) < 0.5)) {
      live[n] = 4 * KiB + (size_t)(urand(g) * 8192.0) * KiB;
      feed(g, WL_PEV_ALLOC, live[n++], (int)(urand(g) * 2.0));
    } else {
      int k = (int)(urand(g) * n);
      feed(g, WL_PEV_FREE, live[k], (int)(urand(g) * 2.0));
      live[k] = live[--n];
    }
  }
}

/* WLTEST_SEED shifts every scenario's seed, to explore; the default run is fixed. The seeds case
 * sets it itself. */
static int seed_override = -1;
static unsigned seed_shift(void) {
  if (seed_override >= 0) return (unsigned)seed_override;
  const char *e = getenv("WLTEST_SEED");
  return e ? (unsigned)strtoul(e, NULL, 10) : 0;
}

typedef struct result_s {
  /* peaks: exact (within one event of the maximum), near (after 95 % of the rise), early
   * (before: the next member may start rising too soon), late (after the maximum) */
  int train, counted, tp, fp, fp_eval, early, exact, near, late, missing_peak, lost;
  int first_detected; /* training iteration index of the first boundary found */
  int max_lag;        /* most events between a boundary and its announcement */
  int prompt;         /* counted boundaries found and announced within one event */
  double prompt_rate; /* prompt / counted */
  int lost_after;     /* most alloc/free events from a false begin to its LOST */
  double precision, recall;
} result_t;

/* Learning needs two whole iterations and a bit: boundaries before this many training
 * iterations (after the warm-up) do not count against recall. */
#define ALLOWANCE 5

static result_t run(const gen_cfg_t *c) {
  gen_t *g = calloc(1, sizeof *g);
  g->cfg = c;
  g->rng = c->seed + seed_shift() * 7919u;
  g->live_cap = 1u << 20;
  g->live_at = calloc(g->live_cap, sizeof *g->live_at);
  wl_phase_config_t pc;
  wl_phase_config_default(&pc);
  wl_phase_create(&g->det, &pc);
  for (int l = 0; l < MAXLAYERS; l++) {
    g->act[l] = (1 + (size_t)rand_r(&g->rng) % 4) * MiB + (size_t)(rand_r(&g->rng) % 64) * 4096;
    g->ws[l] = rand_r(&g->rng) % 3 == 0;
  }
  for (int l = 0; l < c->layers + c->layers_var; l++) ev(g, 1, 512 * KiB, 0); /* weights */
  if (c->random_stream) {
    random_stream(g, c->iterations);
  } else {
    int trained = 0;
    for (int it = 0; it < c->iterations; it++) {
      train_iteration(g, it, it < c->warmup ? IT_WARMUP : IT_TRAIN);
      trained++;
      if (c->eval_every && trained % c->eval_every == 0) eval_pass(g);
    }
  }
  result_t r = {0};
  r.first_detected = -1;
  bool used[8192] = {false};
  int ti = 0;
  for (int i = 0; i < g->ntruth && i < 4096; i++) {
    truth_t *t = &g->truth[i];
    if (t->kind != IT_TRAIN) continue;
    r.train++;
    bool counted = ti++ >= ALLOWANCE;
    r.counted += counted;
    int hit = -1;
    for (int k = 0; k < g->nbegins && k < 8192; k++) {
      uint64_t d = g->begins[k];
      if (!used[k] && d + 1 >= t->begin && d <= t->begin + 1) {
        hit = k;
        break;
      }
    }
    if (hit < 0) continue;
    used[hit] = true;
    if (counted) r.tp++;
    if ((int)g->lags[hit] > r.max_lag) r.max_lag = (int)g->lags[hit];
    if (counted && g->begins[hit] + g->lags[hit] <= t->begin + 1) r.prompt++;
    if (r.first_detected < 0) r.first_detected = ti - 1;
    /* The peak reported after this begin and before the next begin. */
    uint64_t next = (uint64_t)-1;
    for (int k = 0; k < g->nbegins && k < 8192; k++)
      if (g->begins[k] > g->begins[hit] && g->begins[k] < next) next = g->begins[k];
    int found = 0;
    for (int k = 0; k < g->npeaks && k < 8192; k++) {
      uint64_t p = g->peaks[k];
      if (p < g->begins[hit] || p >= next) continue;
      found = 1;
      double rise = (double)(t->top - t->base);
      double frac =
          p < g->live_cap && rise > 0 ? ((double)g->live_at[p] - (double)t->base) / rise : 0.0;
      if (p + 1 >= t->peak && p <= t->peak + 1)
        r.exact++;
      else if (p > t->peak + 1)
        r.late++;
      else if (frac >= 0.95)
        r.near++;
      else
        r.early++;
      break;
    }
    if (!found) r.missing_peak++;
  }
  for (int k = 0; k < g->nbegins && k < 8192; k++) {
    if (used[k]) continue;
    r.fp++;
    if (getenv("WLTEST_FP")) {
      uint64_t nearest = 0;
      for (int i = 0; i < g->ntruth && i < 4096; i++)
        if (g->truth[i].begin <= g->begins[k]) nearest = g->truth[i].begin;
      fprintf(stderr, "false begin at %llu (previous boundary %llu)\n",
              (unsigned long long)g->begins[k], (unsigned long long)nearest);
    }
    int after = -1;
    for (int q = 0; q < g->lost && q < 8192; q++)
      if (g->losts[q] >= g->begins[k] && (after < 0 || (int)(g->losts[q] - g->begins[k]) < after))
        after = (int)(g->losts[q] - g->begins[k]);
    if (after < 0) after = 1 << 20; /* never taken back */
    if (after > r.lost_after) r.lost_after = after;
    for (int i = 0; i < g->ntruth && i < 4096; i++)
      if (g->truth[i].kind == IT_EVAL && g->begins[k] + 1 >= g->truth[i].begin &&
          g->begins[k] <= g->truth[i].begin + 1)
        r.fp_eval++;
  }
  int tp_all = 0;
  for (int k = 0; k < g->nbegins && k < 8192; k++) tp_all += used[k];
  r.precision = tp_all + r.fp ? (double)tp_all / (double)(tp_all + r.fp) : 1.0;
  r.recall = r.counted ? (double)r.tp / (double)r.counted : 1.0;
  r.prompt_rate = r.counted ? (double)r.prompt / (double)r.counted : 1.0;
  r.lost = g->lost;
  wl_phase_stats_t st;
  wl_phase_stats_get(g->det, &st);
  if (seed_override < 0 || getenv("WLTEST_VERBOSE"))
    printf("\n    %-22s iters %4d  recall %6.2f%%  precision %6.2f%%  prompt %6.2f%% (lag <= %d)  "
           "fp %3d (eval %3d)  peaks exact %3d near %3d early %2d late %2d none %3d  lost %3d "
           "(within %2d)  first %2d  period %zu",
           c->name, r.train, 100.0 * r.recall, 100.0 * r.precision, 100.0 * r.prompt_rate,
           r.max_lag, r.fp, r.fp_eval, r.exact, r.near, r.early, r.late, r.missing_peak, r.lost,
           r.lost_after < (1 << 20) ? r.lost_after : -1, r.first_detected, st.period);
  wl_phase_destroy(g->det);
  free(g->live_at);
  free(g);
  return r;
}

static gen_cfg_t base(const char *name) {
  gen_cfg_t c = {0};
  c.name = name;
  c.iterations = 300;
  c.layers = 12;
  c.threads = 2;
  c.seed = 7;
  return c;
}

/* The regular cases: every boundary after learning, exactly, and the peaks never early. With
 * strict, also nearly all peaks at the maximum (late ones are safe, but waste overlap). */
static void check(const gen_cfg_t *c, bool strict) {
  result_t r = run(c);
  CU_ASSERT_TRUE(r.recall >= 0.99);
  CU_ASSERT_TRUE(r.precision >= 0.99);
  CU_ASSERT_TRUE(r.prompt_rate >= 0.99); /* announced within one event too, not only found */
  CU_ASSERT_TRUE(r.early <= r.train / 100);
  CU_ASSERT_TRUE(r.exact + r.near + r.late >= (r.tp * 95) / 100);
  if (strict) CU_ASSERT_TRUE(r.exact + r.near >= (r.tp * 90) / 100);
}

static void check_regular(const gen_cfg_t *c) {
  check(c, true);
}

static void test_clean(void) {
  gen_cfg_t c = base("clean");
  check_regular(&c);
}

static void test_noise(void) {
  gen_cfg_t c = base("noise 3%");
  c.noise = 0.03;
  check_regular(&c);
}

static void test_noise_jitter(void) {
  gen_cfg_t c = base("noise 5% + jitter 0.8");
  c.noise = 0.05;
  c.jitter = 0.8;
  c.seed = 11;
  check_regular(&c);
}

static void test_one_thread(void) {
  gen_cfg_t c = base("one thread, noise 2%");
  c.threads = 1;
  c.noise = 0.02;
  c.seed = 3;
  check_regular(&c);
}

static void test_small_batches(void) {
  gen_cfg_t c = base("smaller batches 15%");
  c.small_batch = 0.15;
  c.noise = 0.02;
  c.seed = 5;
  /* Allocations that do not scale with the batch move the peak: learned from one batch size,
   * the release comes a little late in the other. */
  check(&c, false);
}

static void test_warmup(void) {
  gen_cfg_t c = base("warm-up 3, noise 2%");
  c.warmup = 3;
  c.noise = 0.02;
  c.seed = 13;
  check_regular(&c);
}

static void test_deep(void) {
  gen_cfg_t c = base("48 layers, noise 2%");
  c.layers = 48;
  c.iterations = 120;
  c.noise = 0.02;
  c.seed = 17;
  check_regular(&c);
}

static void test_eval_other_batch(void) {
  gen_cfg_t c = base("eval /10, batch x2");
  c.eval_every = 10;
  c.eval_scale = 2.0;
  c.noise = 0.02;
  c.seed = 19;
  result_t r = run(&c);
  CU_ASSERT_TRUE(r.recall >= 0.99);
  CU_ASSERT_EQUAL(r.fp, 0);
  CU_ASSERT_TRUE(r.early <= r.train / 100);
}

/* An evaluation pass that starts exactly like a training iteration cannot be told apart at its
 * first events. The first one is taken for an iteration and taken back (LOST) within a few
 * events; from then on beginnings are announced once they have matched more events than that
 * pass did, so no later pass is gated. */
static void check_eval_same_batch(const gen_cfg_t *c) {
  result_t r = run(c);
  CU_ASSERT_TRUE(r.fp <= 1);
  CU_ASSERT_EQUAL(r.fp, r.fp_eval); /* false begins only where an evaluation starts */
  CU_ASSERT_TRUE(r.lost >= r.fp_eval);
  CU_ASSERT_TRUE(r.lost_after <= 24);
  CU_ASSERT_TRUE(r.recall >= 0.99);
  CU_ASSERT_TRUE(r.precision >= 0.99);
  CU_ASSERT_TRUE(r.max_lag <= 5);
}

static gen_cfg_t eval_same_batch_cfg(void) {
  gen_cfg_t c = base("eval /10, same batch");
  c.eval_every = 10;
  c.eval_scale = 1.0;
  c.seed = 23;
  return c;
}

static void test_eval_same_batch(void) {
  gen_cfg_t c = eval_same_batch_cfg();
  check_eval_same_batch(&c);
}

static void test_markers(void) {
  gen_cfg_t c = base("markers, noise 5%");
  c.markers = 1;
  c.noise = 0.05;
  c.eval_every = 10;
  c.eval_scale = 1.0;
  result_t r = run(&c);
  /* Markers are trusted from the first iteration; an evaluation step is a (marked) begin. */
  CU_ASSERT_EQUAL(r.first_detected, 0);
  CU_ASSERT_TRUE(r.recall >= 0.999);
  CU_ASSERT_EQUAL(r.fp, r.fp_eval);
}

static void test_irregular_random(void) {
  gen_cfg_t c = base("random stream");
  c.random_stream = 1;
  c.iterations = 40000;
  result_t r = run(&c);
  CU_ASSERT_EQUAL(r.fp, 0); /* never gates */
}

static void test_irregular_layers(void) {
  gen_cfg_t c = base("layers 8..16 (dynamic)");
  c.layers = 8;
  c.layers_var = 8;
  c.noise = 0.02;
  c.seed = 29;
  result_t r = run(&c);
  CU_ASSERT_TRUE(r.precision >= 0.99); /* whatever it finds is right */
  CU_ASSERT_EQUAL(r.fp, 0);            /* and it never gates wrongly */
}

/* Every scenario again over more seeds: WLTEST_PHASE_SEEDS=200 (about a minute), 3 by default.
 * Targets, over all boundaries of all seeds: recall, precision and prompt announcement >= 99 % on
 * the regular scenarios; at most one false begin per run with same-batch evaluation passes
 * (the first); none on the irregular ones. */
typedef struct agg_s {
  const char *name;
  int kind; /* 0 regular, 1 eval same batch, 2 irregular */
  long counted, tp, prompt, found, fp, runs, bad_runs;
  double min_recall, min_precision;
} agg_t;

static void agg_add(agg_t *a, const result_t *r) {
  if (!a->runs) a->min_recall = a->min_precision = 1.0;
  a->runs++;
  a->counted += r->counted;
  a->tp += r->tp;
  a->prompt += r->prompt;
  int found = (int)lround(r->precision < 1.0 ? r->fp * r->precision / (1.0 - r->precision) : 0);
  a->found += found;
  a->fp += r->fp;
  a->min_recall = fmin(a->min_recall, r->recall);
  a->min_precision = fmin(a->min_precision, r->precision);
  bool bad = a->kind == 0   ? r->recall < 0.99 || r->precision < 0.99 || r->prompt_rate < 0.99
             : a->kind == 1 ? r->fp > 1 || r->recall < 0.99
                            : r->fp > 0;
  a->bad_runs += bad;
}

static void test_seeds(void) {
  const char *e = getenv("WLTEST_PHASE_SEEDS");
  int seeds = e ? atoi(e) : 3;
  if (seeds < 1) seeds = 1;
  gen_cfg_t cf[12];
  int kind[12], n = 0;
  cf[n] = base("clean"), kind[n++] = 0;
  cf[n] = base("noise 3%"), cf[n].noise = 0.03, kind[n++] = 0;
  cf[n] = base("noise 5% + jitter 0.8"), cf[n].noise = 0.05, cf[n].jitter = 0.8, kind[n++] = 0;
  cf[n] = base("one thread, noise 2%"), cf[n].threads = 1, cf[n].noise = 0.02, kind[n++] = 0;
  cf[n] = base("warm-up 3, noise 2%"), cf[n].warmup = 3, cf[n].noise = 0.02, kind[n++] = 0;
  cf[n] = base("48 layers, noise 2%"), cf[n].layers = 48, cf[n].iterations = 120;
  cf[n].noise = 0.02, kind[n++] = 0;
  cf[n] = base("eval /10, batch x2"), cf[n].eval_every = 10, cf[n].eval_scale = 2.0;
  cf[n].noise = 0.02, kind[n++] = 0;
  cf[n] = eval_same_batch_cfg(), kind[n++] = 1;
  cf[n] = base("random stream"), cf[n].random_stream = 1, cf[n].iterations = 40000;
  kind[n++] = 2;
  cf[n] = base("layers 8..16 (dynamic)"), cf[n].layers = 8, cf[n].layers_var = 8;
  cf[n].noise = 0.02, kind[n++] = 2;
  agg_t agg[12] = {{0}};
  for (int i = 0; i < n; i++) agg[i].name = cf[i].name, agg[i].kind = kind[i];
  for (int sd = 1; sd <= seeds; sd++) {
    seed_override = sd;
    for (int i = 0; i < n; i++) {
      result_t r = run(&cf[i]);
      agg_add(&agg[i], &r);
    }
  }
  seed_override = -1;
  printf("\n    %d seeds: %-22s %8s %8s %8s %8s %9s\n", seeds, "scenario", "recall", "prompt", "fp",
         "min rec", "bad runs");
  for (int i = 0; i < n; i++) {
    agg_t *a = &agg[i];
    double rec = a->counted ? (double)a->tp / (double)a->counted : 1.0;
    double prompt = a->counted ? (double)a->prompt / (double)a->counted : 1.0;
    printf("    %-32s %7.2f%% %7.2f%% %8ld %7.2f%% %5ld/%ld\n", a->name, 100.0 * rec,
           100.0 * prompt, a->fp, 100.0 * a->min_recall, a->bad_runs, a->runs);
    if (a->kind == 0) {
      CU_ASSERT_TRUE(rec >= 0.99);
      CU_ASSERT_TRUE(prompt >= 0.99);
      CU_ASSERT_TRUE((double)a->fp <= 0.01 * (double)a->tp);
    } else if (a->kind == 1) {
      CU_ASSERT_TRUE(rec >= 0.99);
      CU_ASSERT_TRUE(a->fp <= a->runs); /* at most the first evaluation pass of each run */
    } else {
      CU_ASSERT_EQUAL(a->fp, 0);
    }
  }
}

/* Every announced beginning ends, at its peak or taken back (LOST), within an iteration: also
 * when the pattern is forgotten on the very event that announced one. Iterations that lack three
 * of the learned temporary pairs (each still followed) forget it after two bad cycles; that
 * happened on a beginning, whose BEGIN stayed announced with nothing after it, so a member kept
 * the gate's token for three iterations (123 events). */
static void rp_feed(wl_phase_t *p, uint64_t *ev, int alloc, size_t size, uint64_t *open_since,
                    uint64_t *longest, int *unended) {
  wl_phase_event_t e = {
      .time_ns = *ev, .thread = 1, .kind = alloc ? WL_PEV_ALLOC : WL_PEV_FREE, .size = size};
  wl_phase_result_t r;
  wl_phase_feed(p, &e, &r);
  if (*open_since && (r.flags & (WL_PHASE_F_PEAK | WL_PHASE_F_LOST | WL_PHASE_F_BEGIN))) {
    if (!(r.flags & (WL_PHASE_F_PEAK | WL_PHASE_F_LOST))) ++*unended; /* a BEGIN over a BEGIN */
    if (*ev - *open_since > *longest) *longest = *ev - *open_since;
    *open_since = 0;
  }
  if (r.flags & WL_PHASE_F_BEGIN) *open_since = *ev;
  ++*ev;
}

static void test_begin_always_ends(void) {
  wl_phase_t *p;
  CU_ASSERT_EQUAL_FATAL(wl_phase_create(&p, NULL), 0);
  uint64_t ev = 1, open_since = 0, longest = 0;
  int unended = 0;
  /* 40 events an iteration: 10 activations up, then per layer a temporary pair and the free. */
  for (int it = 0; it < 21; it++) {
    unsigned skip = it >= 12 && it < 15 ? (1u << 8) | (1u << 5) | (1u << 2) : 0;
    for (int i = 0; i < 10; i++)
      rp_feed(p, &ev, 1, (size_t)(i + 1) * MiB + 4096 * (size_t)i, &open_since, &longest, &unended);
    for (int i = 9; i >= 0; i--) {
      size_t grad = (size_t)(i + 1) * 64 * 1024 + 512 * (size_t)i + 256;
      if (!(skip & (1u << i))) {
        rp_feed(p, &ev, 1, grad, &open_since, &longest, &unended);
        rp_feed(p, &ev, 0, grad, &open_since, &longest, &unended);
      }
      rp_feed(p, &ev, 0, (size_t)(i + 1) * MiB + 4096 * (size_t)i, &open_since, &longest, &unended);
    }
  }
  wl_phase_stats_t st;
  wl_phase_stats_get(p, &st);
  CU_ASSERT(st.begins >= 10);
  CU_ASSERT(st.lost >= 1); /* the scenario did forget the pattern */
  CU_ASSERT_EQUAL(unended, 0);
  CU_ASSERT(longest <= 40);
  if (longest > 40 || unended)
    fprintf(stderr, "longest open %llu, unended %d\n", (unsigned long long)longest, unended);
  wl_phase_destroy(p);
}

static void test_api_edges(void) {
  wl_phase_t *p;
  wl_phase_config_t pc;
  wl_phase_config_default(&pc);
  pc.history = 5;
  CU_ASSERT_EQUAL(wl_phase_create(&p, &pc), -EINVAL);
  pc.history = 1024;
  pc.min_confidence = 2.0f;
  CU_ASSERT_EQUAL(wl_phase_create(&p, &pc), -EINVAL);
  CU_ASSERT_EQUAL(wl_phase_create(&p, NULL), 0);
  wl_phase_result_t r;
  CU_ASSERT_EQUAL(wl_phase_feed(p, NULL, &r), WL_PHASE_UNKNOWN);
  /* A free of memory allocated before the detector started cannot underflow. */
  wl_phase_event_t e = {.kind = WL_PEV_FREE, .size = SIZE_MAX};
  CU_ASSERT_EQUAL(wl_phase_feed(p, &e, &r), WL_PHASE_UNKNOWN);
  CU_ASSERT_EQUAL(r.live_bytes, 0);
  e.kind = WL_PEV_ALLOC;
  e.size = SIZE_MAX;
  wl_phase_feed(p, &e, &r);
  wl_phase_feed(p, &e, &r);
  CU_ASSERT_TRUE(r.live_bytes >= (size_t)INT64_MAX);
  CU_ASSERT_STRING_EQUAL(wl_phase_name(WL_PHASE_BACKWARD), "backward");
  CU_ASSERT_STRING_EQUAL(wl_phase_name((wl_phase_kind_t)99), "unknown");
  wl_phase_destroy(p);
  wl_phase_destroy(NULL);
}

int main(int argc, char **argv) {
  static const wl_test_case_t cases[] = {
      {"clean", test_clean},
      {"noise", test_noise},
      {"noise_jitter", test_noise_jitter},
      {"one_thread", test_one_thread},
      {"small_batches", test_small_batches},
      {"warmup", test_warmup},
      {"deep", test_deep},
      {"eval_other_batch", test_eval_other_batch},
      {"eval_same_batch", test_eval_same_batch},
      {"markers", test_markers},
      {"irregular_random", test_irregular_random},
      {"irregular_layers", test_irregular_layers},
      {"api_edges", test_api_edges},
      {"begin_always_ends", test_begin_always_ends},
      {"seeds", test_seeds},
      {NULL, NULL},
  };
  return wl_test_main(argc, argv, "sched_phase", cases);
}
