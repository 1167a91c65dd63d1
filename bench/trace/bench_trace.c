/* wl-bench-trace: writes a large synthetic trace, then measures, against a raw sequential read of
 * the same file in the same run, how fast the reader and the full report pass get through it; and
 * the writer with its crash-safe rings file against rings on the heap, in the same run. */
#include "log.h"
#include "util.h"
#include "wavelet/trace.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#define TARGET_EVENTS_PER_S 20e6

static double now_s(void) {
  return (double)wl__now_ns() / 1e9;
}

/* CPU time of this process: on a shared machine the wall clock also counts other people's work. */
static double cpu_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

static double loadavg(void) {
  FILE *f = fopen("/proc/loadavg", "r");
  double v = -1;
  if (f) {
    if (fscanf(f, "%lf", &v) != 1) v = -1;
    fclose(f);
  }
  return v;
}

/* Peak resident memory of this process (VmHWM), in bytes. */
static uint64_t rss_peak(void) {
  FILE *f = fopen("/proc/self/status", "r");
  if (!f) return 0;
  char line[256];
  uint64_t kb = 0;
  while (fgets(line, sizeof line, f))
    if (sscanf(line, "VmHWM: %lu kB", &kb) == 1) break;
  fclose(f);
  return kb * 1024;
}

/* A wave of `per` events an iteration: allocations rising to the peak, then their frees in
 * reverse, with a launch every fourth event; one event per microsecond. */
static int write_trace(const char *path, uint64_t n, unsigned per, int rings_file, double *secs,
                       double *cpu) {
  wl_trace_writer_config_t cfg;
  wl_trace_writer_config_default(&cfg);
  cfg.path = path;
  cfg.rings_file = rings_file;
  cfg.header.device_capacity = 80ull << 30;
  snprintf(cfg.header.device_name, sizeof cfg.header.device_name, "benchmark");
  wl_trace_writer_t *w;
  int rc = wl_trace_writer_open(&w, &cfg);
  if (rc) return rc;
  uint32_t kname = wl_trace_intern(w, "bench_kernel");
  uint64_t t = wl__now_ns();
  unsigned half = per / 2;
  double t0 = now_s(), c0 = cpu_s();
  wl_trace_event_t ev;
  memset(&ev, 0, sizeof ev);
  for (uint64_t i = 0; i < n; i++) {
    unsigned ph = (unsigned)(i % per);
    ev.time_ns = t + i * 1000;
    ev.id = 0;
    unsigned q = ph < half ? ph : per - 1 - ph;
    if (q % 4 == 3) {
      ev.kind = WL_TRACE_LAUNCH;
      ev.addr = 0x1000;
      ev.size = 256;
      ev.id = kname;
    } else {
      ev.kind = ph < half ? WL_TRACE_ALLOC : WL_TRACE_FREE_REQ;
      ev.size = ((q * 2654435761u) % 64 + 1) << 20;
      ev.addr = 0x7f0000000000ull + q * (64ull << 20);
    }
    if (wl_trace_emit(w, &ev)) {
      wl_trace_writer_close(w);
      return -ENOBUFS;
    }
  }
  rc = wl_trace_writer_close(w);
  *secs = now_s() - t0;
  *cpu = cpu_s() - c0;
  return rc;
}

/* The baseline: read(2) the file in 2 MiB pieces (the reader's buffer) and fold every word, so
 * the bytes are really touched. */
static int raw_read(const char *path, uint64_t *bytes, double *secs, double *cpu, uint64_t *fold) {
  int fd = open(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0) return -errno;
  size_t cap = 2u << 20;
  uint64_t *buf = malloc(cap);
  if (!buf) {
    close(fd);
    return -ENOMEM;
  }
  double t0 = now_s(), c0 = cpu_s();
  uint64_t total = 0, x = 0;
  for (;;) {
    ssize_t k = read(fd, buf, cap);
    if (k < 0 && errno == EINTR) continue;
    if (k <= 0) break;
    for (size_t i = 0; i < (size_t)k / 8; i++) x ^= buf[i];
    total += (uint64_t)k;
  }
  *secs = now_s() - t0;
  *cpu = cpu_s() - c0;
  *bytes = total;
  *fold = x;
  free(buf);
  close(fd);
  return 0;
}

static int reader_pass(const char *path, uint64_t *events, double *secs, double *cpu) {
  wl_trace_reader_t *r;
  int rc = wl_trace_open(&r, path, 0);
  if (rc) {
    wl__error("%s", wl_trace_reader_error(r));
    wl_trace_reader_close(r);
    return rc;
  }
  wl_trace_event_t evs[512];
  double t0 = now_s(), c0 = cpu_s();
  uint64_t n = 0;
  long k;
  while ((k = wl_trace_read(r, evs, 512)) > 0) n += (uint64_t)k;
  *secs = now_s() - t0;
  *cpu = cpu_s() - c0;
  *events = n;
  if (k < 0) wl__error("%s", wl_trace_reader_error(r));
  wl_trace_reader_close(r);
  return k < 0 ? (int)k : 0;
}

static int usage(void) {
  fprintf(stderr,
          "usage: wl-bench-trace [--events N] [--file PATH] [--reps R] [--keep] [--json]\n");
  return 2;
}

int main(int argc, char **argv) {
  uint64_t n = 10000000;
  const char *file = NULL;
  int keep = 0, json_only = 0, reps = 3;
  for (int i = 1; i < argc; i++) {
    if (!strcmp(argv[i], "--events") && i + 1 < argc) {
      size_t v;
      if (wl__parse_size(argv[++i], 0, &v) || v < 1000) {
        fprintf(stderr, "wl-bench-trace: --events wants a count of at least 1000 (K/M suffixes)\n");
        return 2;
      }
      n = v;
    } else if (!strcmp(argv[i], "--file") && i + 1 < argc) {
      file = argv[++i];
    } else if (!strcmp(argv[i], "--reps") && i + 1 < argc) {
      reps = atoi(argv[++i]);
      if (reps < 1 || reps > 20) {
        fprintf(stderr, "wl-bench-trace: --reps wants 1 to 20\n");
        return 2;
      }
    } else if (!strcmp(argv[i], "--keep")) {
      keep = 1;
    } else if (!strcmp(argv[i], "--json")) {
      json_only = 1;
    } else {
      return usage();
    }
  }
  char tmp[256];
  if (!file) {
    const char *dir = getenv("TMPDIR");
    snprintf(tmp, sizeof tmp, "%s/wl-bench-trace-%d.wlt", dir && *dir ? dir : "/tmp",
             (int)getpid());
    file = tmp;
  }
  /* The writer: rings in a shared mapping of FILE.rings (the default, crash-safe) against rings
   * on the heap (the baseline), alternating, best of reps; CPU time counts the page faults and
   * write-back the mapping may cost. */
  double wsecs = 1e30, wcpu = 1e30, hsecs = 1e30, hcpu = 1e30;
  int rc = 0;
  for (int r = 0; r < reps && !rc; r++) {
    double s, c;
    rc = write_trace(file, n, 1000, 0, &s, &c);
    hsecs = s < hsecs ? s : hsecs;
    hcpu = c < hcpu ? c : hcpu;
    if (!rc) rc = write_trace(file, n, 1000, 1, &s, &c);
    wsecs = s < wsecs ? s : wsecs;
    wcpu = c < wcpu ? c : wcpu;
  }
  if (rc) {
    wl__error("%s: cannot write the trace: %s", file, strerror(-rc));
    return 1;
  }
  double w_ratio = wsecs / hsecs, w_ratio_cpu = wcpu / (hcpu > 1e-6 ? hcpu : 1e-6);
  /* Best of reps for each pass, alternating, so neither gets a warmer cache. */
  double raw_s = 1e30, rd_s = 1e30, rep_s = 1e30, raw_c = 1e30, rd_c = 1e30, rep_c = 1e30;
  uint64_t bytes = 0, fold = 0, events = 0;
  wl_trace_summary_t sum;
  memset(&sum, 0, sizeof sum);
  double load = loadavg();
  for (int r = 0; r < reps; r++) {
    double s = 0, c = 0;
    if ((rc = raw_read(file, &bytes, &s, &c, &fold))) break;
    raw_s = s < raw_s ? s : raw_s;
    raw_c = c < raw_c ? c : raw_c;
    if ((rc = reader_pass(file, &events, &s, &c))) break;
    rd_s = s < rd_s ? s : rd_s;
    rd_c = c < rd_c ? c : rd_c;
    wl_trace_analysis_t *a;
    char err[600];
    double t0 = now_s(), c0 = cpu_s();
    rc = wl_trace_analyze_file(file, 0, NULL, &a, NULL, err, sizeof err);
    if (rc) {
      wl__error("%s", err);
      break;
    }
    wl_trace_analysis_summary(a, &sum);
    wl_trace_analysis_destroy(a);
    s = now_s() - t0;
    c = cpu_s() - c0;
    rep_s = s < rep_s ? s : rep_s;
    rep_c = c < rep_c ? c : rep_c;
  }
  if (!keep) unlink(file);
  if (rc) return 1;
  if (events != n) {
    wl__error("%s: read %llu events of %llu written", file, (unsigned long long)events,
              (unsigned long long)n);
    return 1;
  }
  /* CPU times below a clock tick are noise; keep them positive. */
  raw_c = raw_c > 1e-6 ? raw_c : 1e-6;
  rd_c = rd_c > 1e-6 ? rd_c : 1e-6;
  rep_c = rep_c > 1e-6 ? rep_c : 1e-6;
  double raw_mbs = (double)bytes / raw_s / 1e6, raw_eps = (double)n / raw_s;
  double rd_eps = (double)n / rd_s, rep_eps = (double)n / rep_s, w_eps = (double)n / wsecs;
  double rep_eps_cpu = (double)n / rep_c, rd_eps_cpu = (double)n / rd_c;
  double ratio = rep_s / raw_s, ratio_cpu = rep_c / raw_c;
  uint64_t rss = rss_peak();
  int meets = rep_eps >= TARGET_EVENTS_PER_S, meets_cpu = rep_eps_cpu >= TARGET_EVENTS_PER_S;
  if (!json_only) {
    printf("wl-bench-trace: %llu events, %.1f MiB trace (%s), best of %d, load average %.1f\n\n",
           (unsigned long long)n, (double)bytes / (1 << 20), file, reps, load);
    printf("%-32s %9s %9s %13s %13s %9s\n", "pass", "wall s", "cpu s", "events/s", "events/cpu-s",
           "MB/s");
    printf("%-32s %9.3f %9.3f %13.3e %13.3e %9.0f\n", "baseline: write, rings on heap", hsecs, hcpu,
           (double)n / hsecs, (double)n / hcpu, (double)bytes / hsecs / 1e6);
    printf("%-32s %9.3f %9.3f %13.3e %13.3e %9.0f\n", "write, rings in FILE.rings", wsecs, wcpu,
           w_eps, (double)n / wcpu, (double)bytes / wsecs / 1e6);
    printf("%-32s %9.3f %9.3f %13.3e %13.3e %9.0f\n", "baseline: raw sequential read", raw_s, raw_c,
           raw_eps, (double)n / raw_c, raw_mbs);
    printf("%-32s %9.3f %9.3f %13.3e %13.3e %9.0f\n", "reader (decode + checksums)", rd_s, rd_c,
           rd_eps, rd_eps_cpu, (double)bytes / rd_s / 1e6);
    printf("%-32s %9.3f %9.3f %13.3e %13.3e %9.0f\n", "report pass (read + analysis)", rep_s, rep_c,
           rep_eps, rep_eps_cpu, (double)bytes / rep_s / 1e6);
    printf("\nreport pass / raw read: %.2fx the wall time, %.2fx the CPU time\n", ratio, ratio_cpu);
    printf("write with the rings file / rings on the heap: %.2fx the wall time, %.2fx the CPU "
           "time\n",
           w_ratio, w_ratio_cpu);
    printf("target %.0e events/s: %s by the wall clock, %s by CPU time\n", TARGET_EVENTS_PER_S,
           meets ? "met" : "NOT met", meets_cpu ? "met" : "NOT met");
    printf("peak resident memory %.1f MiB for a %.1f MiB trace; found %llu iterations, peak %.1f "
           "MiB\n\n",
           (double)rss / (1 << 20), (double)bytes / (1 << 20), (unsigned long long)sum.iterations,
           (double)sum.peak_bytes / (1 << 20));
  }
  printf("{\"benchmark\":\"trace\",\"events\":%llu,\"file_bytes\":%llu,\"reps\":%d,"
         "\"loadavg\":%.2f,\"write_s\":%.4f,\"write_cpu_s\":%.4f,\"write_events_per_s\":%.0f,"
         "\"baseline_write_heap_rings_s\":%.4f,\"baseline_write_heap_rings_cpu_s\":%.4f,"
         "\"write_vs_heap_rings_time_ratio\":%.3f,\"write_vs_heap_rings_cpu_ratio\":%.3f,"
         "\"baseline_raw_read_s\":%.4f,\"baseline_raw_read_cpu_s\":%.4f,"
         "\"baseline_raw_read_mb_per_s\":%.0f,\"reader_s\":%.4f,\"reader_events_per_s\":%.0f,"
         "\"reader_events_per_cpu_s\":%.0f,\"report_s\":%.4f,\"report_cpu_s\":%.4f,"
         "\"report_events_per_s\":%.0f,\"report_events_per_cpu_s\":%.0f,"
         "\"report_vs_raw_read_time_ratio\":%.3f,\"report_vs_raw_read_cpu_ratio\":%.3f,"
         "\"target_events_per_s\":%.0f,\"meets_target_wall\":%s,\"meets_target_cpu\":%s,"
         "\"rss_peak_bytes\":%llu,\"iterations_found\":%llu,\"checksum_fold\":%llu}\n",
         (unsigned long long)n, (unsigned long long)bytes, reps, load, wsecs, wcpu, w_eps, hsecs,
         hcpu, w_ratio, w_ratio_cpu, raw_s, raw_c, raw_mbs, rd_s, rd_eps, rd_eps_cpu, rep_s, rep_c,
         rep_eps, rep_eps_cpu, ratio, ratio_cpu, TARGET_EVENTS_PER_S, meets ? "true" : "false",
         meets_cpu ? "true" : "false", (unsigned long long)rss, (unsigned long long)sum.iterations,
         (unsigned long long)(fold & 0xffff));
  return 0;
}
