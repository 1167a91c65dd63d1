/* Writes the golden traces of golden_spec.h through the real writer: `gen_golden DIR` writes
 * every trace of golden_set into DIR (tests compare them with the checked-in copies). */
#include "golden_spec.h"

#include <stdio.h>

typedef struct gen_s {
  wl_trace_writer_t *w;
  uint64_t last;
} gen_t;

static void emit(void *arg, const wl_trace_event_t *ev) {
  gen_t *g = arg;
  if (ev->time_ns < g->last) {
    fprintf(stderr, "gen_golden: events out of order at %llu ns\n",
            (unsigned long long)ev->time_ns);
    exit(1);
  }
  g->last = ev->time_ns;
  if (wl_trace_emit(g->w, ev)) {
    fprintf(stderr, "gen_golden: an event was dropped\n");
    exit(1);
  }
}

/* Writes one golden trace to path. 0 or negative errno. */
int golden_write(const golden_t *g, const char *path);
int golden_write(const golden_t *g, const char *path) {
  wl_trace_writer_config_t cfg;
  wl_trace_writer_config_default(&cfg);
  cfg.path = path;
  cfg.ring_events = 1024; /* one thread, so the inline flushes fall at the same events each run */
  cfg.header.pid = g->pid;
  cfg.header.role = g->role;
  cfg.header.device = 0;
  cfg.header.origin_ns = G_ORIGIN_NS;
  cfg.header.wall_ns = G_WALL_NS;
  cfg.header.device_capacity = g->capacity;
  cfg.header.mem_limit = g->mem_limit;
  cfg.header.waves = g->waves;
  snprintf(cfg.header.device_name, sizeof cfg.header.device_name, "synthetic 2 GiB device");
  snprintf(cfg.header.host, sizeof cfg.header.host, "golden");
  snprintf(cfg.header.command, sizeof cfg.header.command, "gen_golden %s", g->file);
  wl_trace_writer_t *w;
  int rc = wl_trace_writer_open(&w, &cfg);
  if (rc) return rc;
  uint32_t names[2] = {wl_trace_intern(w, "forward_layer_kernel"),
                       wl_trace_intern(w, "backward_layer_kernel")};
  gen_t gen = {w, 0};
  golden_events(g, emit, &gen, names);
  return wl_trace_writer_close(w);
}

#ifndef GOLDEN_NO_MAIN
/* `gen_golden --expect`: what a report must find in each golden, as one JSON object. */
static int print_expect(void) {
  printf("{");
  for (size_t i = 0; i < GOLDEN_COUNT; i++) {
    const golden_t *g = &golden_set[i];
    golden_expect_t e;
    golden_expect(g, &e);
    printf("%s\"%s\":{\"pid\":%u,\"role\":%d,\"markers\":%s,\"events\":%llu,\"peak_bytes\":%llu,"
           "\"trough_bytes\":%llu,\"physical_peak_bytes\":%llu,\"iterations\":%u,"
           "\"period_ms\":%.6f,\"period_spread_ms\":%.6f,\"forward_ms\":%.6f,\"backward_ms\":%.6f,"
           "\"peak_offset_ms\":%.6f,\"fall_offset_ms\":%.6f,\"gate_waits\":%llu,"
           "\"gate_wait_ms\":%.6f,\"capacity_bytes\":%llu,\"mem_limit_bytes\":%llu,"
           "\"offset_ms\":%.3f,\"max_step_bytes\":%llu}",
           i ? "," : "", g->file, g->pid, g->role, g->markers ? "true" : "false",
           (unsigned long long)e.events, (unsigned long long)e.peak, (unsigned long long)e.trough,
           (unsigned long long)e.phys_peak, g->iters, e.period_ms, e.period_sd_ms, G_FWD_MS,
           G_BWD_MS, e.peak_offset_ms, e.fall_offset_ms, (unsigned long long)e.gate_waits,
           (double)e.gate_wait_ns / 1e6, (unsigned long long)g->capacity,
           (unsigned long long)g->mem_limit, g->offset_ms, (unsigned long long)golden_act(0));
  }
  printf("}\n");
  return 0;
}

/* `gen_golden --launches-only PATH`: a trace with events but no allocation (no live peak). */
static int launches_only(const char *path) {
  wl_trace_writer_config_t cfg;
  wl_trace_writer_config_default(&cfg);
  cfg.path = path;
  cfg.header.pid = 3001;
  cfg.header.origin_ns = G_ORIGIN_NS;
  wl_trace_writer_t *w;
  int rc = wl_trace_writer_open(&w, &cfg);
  for (unsigned i = 0; !rc && i < 100; i++) {
    wl_trace_event_t ev = {.time_ns = G_ORIGIN_NS + 1000000000ull + i * 1000000ull,
                           .kind = WL_TRACE_LAUNCH};
    rc = wl_trace_emit(w, &ev);
  }
  if (!rc) rc = wl_trace_writer_close(w);
  if (rc) fprintf(stderr, "gen_golden: %s: %d\n", path, rc);
  return rc ? 1 : 0;
}

int main(int argc, char **argv) {
  if (argc == 2 && !strcmp(argv[1], "--expect")) return print_expect();
  if (argc == 3 && !strcmp(argv[1], "--launches-only")) return launches_only(argv[2]);
  if (argc != 2) {
    fprintf(stderr, "usage: gen_golden DIR | gen_golden --expect\n");
    return 2;
  }
  for (size_t i = 0; i < GOLDEN_COUNT; i++) {
    char path[4096];
    snprintf(path, sizeof path, "%s/%s", argv[1], golden_set[i].file);
    int rc = golden_write(&golden_set[i], path);
    if (rc) {
      fprintf(stderr, "gen_golden: %s: %d\n", path, rc);
      return 1;
    }
    printf("gen_golden: wrote %s\n", path);
  }
  return 0;
}
#endif
