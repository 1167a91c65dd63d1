/* A stand-in replica for wavelet-run's tests: writes a memory wave to $WAVELET_TRACE through
 * libwltrace's writer, shifted by half an iteration per role, as the interposer would. */
#include "wavelet/trace.h"

#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

int main(void) {
  const char *path = getenv("WAVELET_TRACE"), *role_s = getenv("WAVELET_ROLE");
  if (!path) {
    fprintf(stderr, "wr_replica: WAVELET_TRACE is not set\n");
    return 3;
  }
  int role = role_s ? atoi(role_s) : 0;
  wl_trace_writer_config_t cfg;
  wl_trace_writer_config_default(&cfg);
  cfg.path = path;
  cfg.header.role = role;
  cfg.header.device = 0;
  cfg.header.device_capacity = 4ull << 30;
  snprintf(cfg.header.device_name, sizeof cfg.header.device_name, "wr_replica device");
  wl_trace_writer_t *w;
  if (wl_trace_writer_open(&w, &cfg)) {
    fprintf(stderr, "wr_replica: cannot write %s\n", path);
    return 4;
  }
  /* 8 iterations of 20 ms: 16 allocations of 16 MiB rise over 10 ms, then fall; markers. */
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  uint64_t t0 = (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
  t0 += (uint64_t)(role % 2) * 10000000ull;
  unsigned n = 0;
  for (unsigned it = 0; it < 8; it++) {
    uint64_t base = t0 + it * 20000000ull;
    wl_trace_event_t m = {
        .time_ns = base, .kind = WL_TRACE_MARKER, .aux = WL_TRACE_MARK_ITER_BEGIN};
    n += wl_trace_emit(w, &m) == 0;
    for (unsigned i = 0; i < 16; i++) {
      wl_trace_event_t a = {.time_ns = base + i * 600000ull + 1000, .kind = WL_TRACE_ALLOC};
      a.addr = 0x100000000ull + i * (16ull << 20);
      a.size = 16ull << 20;
      n += wl_trace_emit(w, &a) == 0;
    }
    m.time_ns = base + 10000000ull;
    m.aux = WL_TRACE_MARK_BACKWARD;
    n += wl_trace_emit(w, &m) == 0;
    for (unsigned i = 0; i < 16; i++) {
      wl_trace_event_t f = {.time_ns = base + 10000000ull + i * 600000ull + 1000,
                            .kind = WL_TRACE_FREE_REQ};
      f.addr = 0x100000000ull + (15 - i) * (16ull << 20);
      f.size = 16ull << 20;
      n += wl_trace_emit(w, &f) == 0;
    }
    m.time_ns = base + 19900000ull;
    m.aux = WL_TRACE_MARK_ITER_END;
    n += wl_trace_emit(w, &m) == 0;
  }
  /* WR_DIE=ROLE: that replica is killed before it closes its trace (the reader recovers the
   * events still in its rings). */
  const char *die = getenv("WR_DIE");
  if (die && atoi(die) == role) {
    printf("role %d emitted %u events and dies\n", role, n);
    fflush(stdout);
    raise(SIGKILL);
  }
  if (wl_trace_writer_close(w)) return 5;
  printf("role %d wrote %u events to %s\n", role, n, path);
  return 0;
}
