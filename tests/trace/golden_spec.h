/* The synthetic training waves behind the golden traces: one definition, used by the generator
 * (gen_golden.c) to write them and by the tests to know what a report must find in them. */
#ifndef WAVELET_TESTS_TRACE_GOLDEN_SPEC_H
#define WAVELET_TESTS_TRACE_GOLDEN_SPEC_H

#include "wavelet/trace.h"

#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#define G_MiB       ((uint64_t)1 << 20)
#define G_ORIGIN_NS 1000000000ull          /* the header's origin: 1 s on the monotonic clock */
#define G_WALL_NS   1767225600000000000ull /* 2026-01-01 00:00 UTC */
#define G_WEIGHTS   (256 * G_MiB)          /* allocated once, before the first iteration */
#define G_NACT      12u                    /* activations per forward pass */
#define G_ACT_UNIT  (4 * G_MiB)            /* activation i is (G_NACT - i) units */
#define G_WS        (8 * G_MiB)  /* a workspace allocated and freed at every forward step */
#define G_TEMP      (32 * G_MiB) /* the optimizer's temporary, in the idle phase */
#define G_CHUNK     (64 * G_MiB) /* the simulated allocator's mapping unit */
#define G_FWD_MS    40.0
#define G_BWD_MS    45.0
#define G_PERIOD_MS 100.0
#define G_FIRST_MS  20.0 /* the first iteration's nominal start after the origin */
#define G_GIB       ((uint64_t)1 << 30)

typedef struct golden_s {
  const char *file;
  uint32_t pid;
  int32_t role;
  uint32_t waves;
  unsigned iters;
  int markers;      /* write the trainer's markers */
  int phases;       /* write phase-detector events instead */
  int gate;         /* write gate wait/grant/release around each forward pass */
  double offset_ms; /* added to every iteration start (a replica's phase shift) */
  unsigned seed;    /* jitter of the iteration starts */
  double jitter_ms; /* at most this much, either way (below 2 ms keeps events in order) */
  uint64_t capacity, mem_limit;
} golden_t;

/* The checked-in traces (tests/trace/golden/). */
static const golden_t golden_set[] = {
    {"markers.wlt", 1001, 0, 1, 12, 1, 0, 1, 0.0, 7, 1.5, 2 * G_GIB, 0},
    {"wave.wlt", 1002, -1, 0, 12, 0, 0, 0, 0.0, 11, 1.5, 2 * G_GIB, 0},
    {"pair0.wlt", 2001, 0, 2, 12, 1, 0, 1, 0.0, 3, 1.0, 2 * G_GIB, 3 * G_GIB / 2},
    {"pair1.wlt", 2002, 1, 2, 12, 1, 0, 1, 50.0, 5, 1.0, 2 * G_GIB, 3 * G_GIB / 2},
};
#define GOLDEN_COUNT (sizeof golden_set / sizeof golden_set[0])

/* Deterministic jitter in [-j, j], rounded to 0.1 ms. */
static inline double golden_jitter(unsigned seed, unsigned k, double j) {
  uint32_t x = seed * 2654435761u + k * 40503u + 12345u;
  x ^= x >> 13;
  x *= 0x5bd1e995u;
  x ^= x >> 15;
  double u = (double)(x % 2001u) / 1000.0 - 1.0; /* -1 .. 1 */
  return round(u * j * 10.0) / 10.0;
}

static inline double golden_start_ms(const golden_t *g, unsigned k) {
  return G_FIRST_MS + g->offset_ms + k * G_PERIOD_MS + golden_jitter(g->seed, k, g->jitter_ms);
}

/* Gate wait before iteration k's forward pass: 0.5 .. 1.5 ms. */
static inline double golden_gate_wait_ms(unsigned k) {
  return 0.5 + 0.5 * (double)(k % 3);
}

static inline uint64_t golden_act(unsigned i) {
  return (G_NACT - i) * G_ACT_UNIT;
}

static inline double golden_fwd_step_ms(unsigned i) {
  return G_FWD_MS * i / G_NACT;
}
static inline double golden_bwd_step_ms(unsigned j) {
  return G_FWD_MS + G_BWD_MS * j / G_NACT;
}

typedef void (*golden_emit_fn)(void *arg, const wl_trace_event_t *ev);

/* The simulated allocator: maps chunks as live memory grows (from its cache first), and after
 * each iteration unmaps what it no longer needs, giving every second chunk back. */
typedef struct golden_sim_s {
  const golden_t *g;
  golden_emit_fn emit;
  void *arg;
  uint64_t live, mapped, cached, next_ptr;
  uint64_t act_ptr[G_NACT];
  unsigned releases;
} golden_sim_t;

static inline uint64_t golden_ns(double ms) {
  return G_ORIGIN_NS + (uint64_t)llround(ms * 1e6);
}

static inline void golden_put(golden_sim_t *s, double ms, uint16_t kind, uint16_t aux,
                              uint64_t addr, uint64_t size, uint64_t arg, uint32_t id) {
  wl_trace_event_t ev;
  memset(&ev, 0, sizeof ev);
  ev.time_ns = golden_ns(ms);
  ev.kind = kind;
  ev.aux = aux;
  ev.tid = 100000u + s->g->pid;
  ev.addr = addr;
  ev.size = size;
  ev.arg = arg;
  ev.id = id;
  if (kind == WL_TRACE_LAUNCH) ev.grid[0] = 128, ev.grid[1] = ev.grid[2] = 1;
  s->emit(s->arg, &ev);
}

static inline uint64_t golden_alloc(golden_sim_t *s, double ms, uint64_t size) {
  while (s->mapped < s->live + size) {
    golden_put(s, ms, WL_TRACE_MAP, 0, 0x700000000000ull + s->mapped, G_CHUNK, 0, 0);
    s->cached = s->cached >= G_CHUNK ? s->cached - G_CHUNK : 0;
    s->mapped += G_CHUNK;
  }
  uint64_t p = 0x700000000000ull + s->next_ptr;
  s->next_ptr += size;
  s->live += size;
  golden_put(s, ms, WL_TRACE_ALLOC, 0, p, size, 7, 0);
  return p;
}

static inline void golden_free(golden_sim_t *s, double ms, uint64_t p, uint64_t size) {
  s->live -= size;
  golden_put(s, ms, WL_TRACE_FREE_REQ, 0, p, size, 7, 0);
}

static inline void golden_trim(golden_sim_t *s, double ms) {
  uint64_t need = (s->live + G_CHUNK - 1) / G_CHUNK * G_CHUNK;
  while (s->mapped > need) {
    s->mapped -= G_CHUNK;
    golden_put(s, ms, WL_TRACE_UNMAP, 0, 0x700000000000ull + s->mapped, G_CHUNK, 0, 0);
    s->cached += G_CHUNK;
    if (s->releases++ % 2) {
      golden_put(s, ms, WL_TRACE_PHYS_RELEASE, 0, 0, G_CHUNK, 0, 0);
      s->cached -= G_CHUNK;
    }
  }
}

/* Calls emit for every event of golden g, in time order. name_id(k) gives the string id of
 * kernel name k (0, 1), or 0 to write launches without names. */
static inline void golden_events(const golden_t *g, golden_emit_fn emit, void *arg,
                                 const uint32_t names[2]) {
  golden_sim_t s;
  memset(&s, 0, sizeof s);
  s.g = g;
  s.emit = emit;
  s.arg = arg;
  uint64_t weights = golden_alloc(&s, 1.0, G_WEIGHTS);
  double end_ms = 0;
  for (unsigned k = 0; k < g->iters; k++) {
    double t = golden_start_ms(g, k);
    if (g->gate) {
      double gw = golden_gate_wait_ms(k);
      golden_put(&s, t - gw, WL_TRACE_GATE_WAIT, (uint16_t)g->role, 0, 0, 0, 0);
      golden_put(&s, t, WL_TRACE_GATE_GRANT, (uint16_t)g->role, 0, 0, (uint64_t)llround(gw * 1e6),
                 0);
    }
    if (g->markers) golden_put(&s, t, WL_TRACE_MARKER, WL_TRACE_MARK_ITER_BEGIN, 0, 0, 0, 0);
    if (g->phases)
      golden_put(&s, t, WL_TRACE_PHASE, WL_TRACE_PHASE_ITER_BEGIN, 0, G_WEIGHTS, 900000, 2);
    for (unsigned i = 0; i < G_NACT; i++) {
      double ts = t + golden_fwd_step_ms(i);
      s.act_ptr[i] = golden_alloc(&s, ts, golden_act(i));
      uint64_t ws = golden_alloc(&s, ts + 0.1, G_WS);
      if (i % 3 == 0) golden_put(&s, ts + 0.2, WL_TRACE_LAUNCH, 0, 0x5000 + i, 256, 7, names[0]);
      golden_free(&s, ts + 0.3, ws, G_WS);
    }
    if (g->gate)
      golden_put(&s, t + G_FWD_MS, WL_TRACE_GATE_RELEASE, (uint16_t)g->role, 0, 0,
                 (uint64_t)llround(G_FWD_MS * 1e6), 0);
    if (g->markers)
      golden_put(&s, t + G_FWD_MS, WL_TRACE_MARKER, WL_TRACE_MARK_BACKWARD, 0, 0, 0, 0);
    if (g->phases)
      golden_put(&s, t + G_FWD_MS, WL_TRACE_PHASE, WL_TRACE_PHASE_BACKWARD, 0, 0, 900000, 2);
    for (unsigned j = 0; j < G_NACT; j++) {
      unsigned i = G_NACT - 1 - j;
      double ts = t + golden_bwd_step_ms(j);
      golden_free(&s, ts, s.act_ptr[i], golden_act(i));
      if (j % 4 == 0) golden_put(&s, ts + 0.1, WL_TRACE_LAUNCH, 0, 0x6000 + j, 256, 7, names[1]);
    }
    if (g->markers)
      golden_put(&s, t + G_FWD_MS + G_BWD_MS, WL_TRACE_MARKER, WL_TRACE_MARK_ITER_END, 0, 0, 0, 0);
    if (g->phases)
      golden_put(&s, t + G_FWD_MS + G_BWD_MS, WL_TRACE_PHASE, WL_TRACE_PHASE_IDLE, 0, 0, 900000, 2);
    uint64_t tmp = golden_alloc(&s, t + 88.0, G_TEMP);
    golden_free(&s, t + 93.0, tmp, G_TEMP);
    golden_trim(&s, t + 95.0);
    if (k == 3) golden_put(&s, t + 95.5, WL_TRACE_BUDGET_WAIT, 0, 0, G_CHUNK, 500000, 0);
    end_ms = t + 96.0;
  }
  golden_free(&s, end_ms + 1.0, weights, G_WEIGHTS);
  golden_trim(&s, end_ms + 1.5);
}

/* What a report must find, computed from the event sequence itself. */
typedef struct golden_expect_s {
  uint64_t peak, trough, phys_peak, phys_at_peak, events, allocs, frees, launches;
  uint64_t gate_waits, gate_wait_ns, budget_waits, budget_wait_ns;
  uint64_t last_ns; /* last event */
  double period_ms, period_sd_ms, idle_ms;
  double peak_offset_ms; /* from an iteration's begin to its peak (the last workspace) */
  double fall_offset_ms; /* from the begin to the last backward free */
} golden_expect_t;

typedef struct golden_scan_s {
  golden_expect_t *e;
  uint64_t live, mapped, cached, first_iter_ns, last_iter_end_ns;
} golden_scan_t;

static inline void golden_scan_ev(void *arg, const wl_trace_event_t *ev) {
  golden_scan_t *sc = arg;
  golden_expect_t *e = sc->e;
  e->events++;
  switch (ev->kind) {
  case WL_TRACE_ALLOC:
    sc->live += ev->size;
    e->allocs++;
    break;
  case WL_TRACE_FREE_REQ:
    sc->live -= ev->size;
    e->frees++;
    break;
  case WL_TRACE_MAP:
    sc->cached -= sc->cached >= ev->size ? ev->size : sc->cached;
    sc->mapped += ev->size;
    break;
  case WL_TRACE_UNMAP:
    sc->mapped -= ev->size;
    sc->cached += ev->size;
    break;
  case WL_TRACE_PHYS_RELEASE:
    sc->cached -= ev->size;
    break;
  case WL_TRACE_LAUNCH:
    e->launches++;
    break;
  case WL_TRACE_GATE_GRANT:
    e->gate_waits++;
    e->gate_wait_ns += ev->arg;
    break;
  case WL_TRACE_BUDGET_WAIT:
    e->budget_waits++;
    e->budget_wait_ns += ev->arg;
    break;
  default:
    break;
  }
  if (sc->live > e->peak) {
    e->peak = sc->live;
    e->phys_at_peak = sc->mapped + sc->cached;
  }
  if (sc->mapped + sc->cached > e->phys_peak) e->phys_peak = sc->mapped + sc->cached;
  if (ev->time_ns >= sc->first_iter_ns && ev->time_ns <= sc->last_iter_end_ns &&
      sc->live < e->trough)
    e->trough = sc->live;
  e->last_ns = ev->time_ns;
}

static inline void golden_expect(const golden_t *g, golden_expect_t *e) {
  memset(e, 0, sizeof *e);
  e->trough = UINT64_MAX;
  golden_scan_t sc;
  memset(&sc, 0, sizeof sc);
  sc.e = e;
  sc.first_iter_ns = golden_ns(golden_start_ms(g, 0));
  sc.last_iter_end_ns = golden_ns(golden_start_ms(g, g->iters - 1) + G_FWD_MS + G_BWD_MS);
  static const uint32_t names[2] = {1, 2};
  golden_events(g, golden_scan_ev, &sc, names);
  double sum = 0, sum2 = 0, idle = 0;
  unsigned n = g->iters - 1;
  for (unsigned k = 0; k < n; k++) {
    double d = golden_start_ms(g, k + 1) - golden_start_ms(g, k);
    sum += d;
    idle += golden_start_ms(g, k + 1) - (golden_start_ms(g, k) + G_FWD_MS + G_BWD_MS);
  }
  e->period_ms = sum / n;
  for (unsigned k = 0; k < n; k++) {
    double d = golden_start_ms(g, k + 1) - golden_start_ms(g, k) - e->period_ms;
    sum2 += d * d;
  }
  e->period_sd_ms = n > 1 ? sqrt(sum2 / (n - 1)) : 0;
  e->idle_ms = idle / n;
  e->peak_offset_ms = golden_fwd_step_ms(G_NACT - 1) + 0.1;
  e->fall_offset_ms = golden_bwd_step_ms(G_NACT - 1);
}

#endif
