/* Replicas under the preload: the cuda backend's colocate and ticktock replicas run as this
 * executable exec'd with LD_PRELOAD=libwavelet.so, gated and budgeted by the interposer as an
 * unmodified trainer would be; here are their start, their markers and their gate time. */
#include "bench.h"

#include <wavelet/trace.h>

#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#define CHILD_ARG "--as-replica"
#define CHECK_ARG "--check-preload"

/* The replicas get libwavelet.so by LD_PRELOAD, so the check loads it the same way (a dlopen here
 * would also need GLIBC_TUNABLES in the fallback build, whose jemalloc TLS is initial-exec): it
 * preloads it into this executable exec'd with CHECK_ARG, in off mode, which looks the markers
 * up as a replica would. */
int wb_preload_check(const char *path, char *why, size_t len) {
  int pfd[2];
  if (pipe(pfd)) {
    snprintf(why, len, "%s: cannot check it: %s", path, strerror(errno));
    return -1;
  }
  fflush(NULL);
  pid_t pid = fork();
  if (pid < 0) {
    close(pfd[0]);
    close(pfd[1]);
    snprintf(why, len, "%s: cannot check it: %s", path, strerror(errno));
    return -1;
  }
  if (pid == 0) {
    close(pfd[0]);
    dup2(pfd[1], 2); /* the loader's complaint and ours */
    close(pfd[1]);
    setenv("LD_PRELOAD", path, 1);
    setenv("WAVELET_MODE", "off", 1);
    char *argv[] = {"wavelet-bench", CHECK_ARG, (char *)path, NULL};
    execv("/proc/self/exe", argv);
    fprintf(stderr, "cannot exec /proc/self/exe: %s\n", strerror(errno));
    _exit(1);
  }
  close(pfd[1]);
  char msg[1024];
  size_t n = 0;
  ssize_t k;
  while (n < sizeof msg - 1 && (k = read(pfd[0], msg + n, sizeof msg - 1 - n)) != 0) {
    if (k < 0) {
      if (errno == EINTR) continue;
      break;
    }
    n += (size_t)k;
  }
  msg[n] = 0;
  close(pfd[0]);
  int st = 0;
  while (waitpid(pid, &st, 0) < 0 && errno == EINTR) {
  }
  if (WIFEXITED(st) && WEXITSTATUS(st) == 0) return 0;
  /* The first line says it (the loader's "cannot be preloaded", or ours). */
  char *nl = strchr(msg, '\n');
  if (nl) *nl = 0;
  snprintf(why, len, "%s: %s", path, msg[0] ? msg : "checking it failed");
  return -1;
}

int wb_preload_check_child(int argc, char **argv) {
  if (argc != 3 || strcmp(argv[1], CHECK_ARG)) return -1;
  wb_markers_t m;
  char why[512];
  void *h = dlopen(argv[2], RTLD_NOW | RTLD_NOLOAD);
  if (!h) {
    fprintf(stderr, "not loaded with LD_PRELOAD (not a library, or not for this machine)\n");
    return 1;
  }
  if (wb_preload_markers(argv[2], &m, why, sizeof why) || !dlsym(h, "cudaMallocAsync")) {
    fprintf(stderr, "loads, but is not libwavelet.so (no trainer markers or cudaMallocAsync)\n");
    return 1;
  }
  return 0;
}

int wb_preload_markers(const char *path, wb_markers_t *m, char *why, size_t len) {
  memset(m, 0, sizeof *m);
  void *h = dlopen(path, RTLD_NOW | RTLD_NOLOAD);
  if (!h) {
    snprintf(why, len, "%s is not loaded in this replica (LD_PRELOAD was not honoured)", path);
    return -1;
  }
  *(void **)&m->iteration_begin = dlsym(h, "wl_iteration_begin");
  *(void **)&m->backward_begin = dlsym(h, "wl_backward_begin");
  *(void **)&m->iteration_end = dlsym(h, "wl_iteration_end");
  /* The preload stays loaded for the life of the process; the handle's reference is harmless. */
  if (!m->iteration_begin || !m->backward_begin || !m->iteration_end) {
    snprintf(why, len, "%s does not export the markers (wl_iteration_begin, ...)", path);
    return -1;
  }
  return 0;
}

void wb_trace_path(const wb_opts_t *o, int role, char *buf, size_t len) {
  int k = role % o->replicas, local_rank = role / o->replicas;
  if (o->gpus)
    snprintf(buf, len, "%s/rank-%d-replica-%d.wlt", o->trace_dir,
             o->node * wb_local_ranks(o) + local_rank, k);
  else
    snprintf(buf, len, "%s/replica-%d.wlt", o->trace_dir, role);
}

/* Sets NAME=value in the (forked, single-threaded) child's environment. */
static int put(const char *name, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static int put(const char *name, const char *fmt, ...) {
  char v[4200];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(v, sizeof v, fmt, ap);
  va_end(ap);
  return setenv(name, v, 1);
}

pid_t wb_preload_spawn(const wb_opts_t *o, int role, int shared_fd, int dp_fd,
                       const sigset_t *mask) {
  fflush(NULL);
  pid_t parent = getpid();
  pid_t pid = fork();
  if (pid != 0) return pid;
  /* The child: dies with the launcher rather than train on unsupervised. */
  prctl(PR_SET_PDEATHSIG, SIGTERM);
  if (getppid() != parent) _exit(128 + SIGTERM);
  /* The launcher's blocked signals would stay blocked across the exec. */
  sigprocmask(SIG_SETMASK, mask, NULL);
  fcntl(shared_fd, F_SETFD, 0);
  if (dp_fd >= 0) fcntl(dp_fd, F_SETFD, 0);
  int k = role % o->replicas, local_rank = role / o->replicas;
  const char *old = getenv("LD_PRELOAD");
  int bad = 0;
  if (old && *old)
    bad |= put("LD_PRELOAD", "%s:%s", o->preload, old);
  else
    bad |= put("LD_PRELOAD", "%s", o->preload);
  bad |= put("WAVELET_MODE", "%s", o->mode == WB_TICKTOCK ? "gate" : "alloc");
  /* One group per GPU, as the embedded path joins. */
  if (o->gpus)
    bad |= put("WAVELET_GROUP", "%s-g%d", o->group, local_rank);
  else
    bad |= put("WAVELET_GROUP", "%s", o->group);
  bad |= put("WAVELET_ROLE", "%d", k);
  bad |= put("WAVELET_WAVES", "%d", o->replicas < 2 ? 2 : o->replicas);
  bad |= put("WAVELET_MEM_LIMIT", "%zu", o->mem_limit); /* 0: the ledger only accounts */
  bad |= put("WAVELET_ALLOC_TIMEOUT_MS", "%u", o->alloc_timeout_ms);
  bad |= put("WAVELET_GATE_TIMEOUT_MS", "%u", 60000u);
  if (o->trace_dir) {
    char path[4096];
    wb_trace_path(o, role, path, sizeof path);
    bad |= put("WAVELET_TRACE", "%s", path);
  }
  char hidden[4200];
  snprintf(hidden, sizeof hidden, "%d:%d:%d:%s", role, shared_fd, dp_fd, o->preload);
  char **argv = calloc((size_t)o->argc + 3, sizeof *argv);
  if (bad || !argv) {
    fprintf(stderr, "wavelet-bench: replica %d: cannot set up its environment\n", role);
    _exit(1);
  }
  for (int i = 0; i < o->argc; i++) argv[i] = o->argv[i];
  argv[o->argc] = CHILD_ARG;
  argv[o->argc + 1] = hidden;
  execv("/proc/self/exe", argv);
  fprintf(stderr, "wavelet-bench: replica %d: cannot exec /proc/self/exe: %s\n", role,
          strerror(errno));
  _exit(1);
}

int wb_preload_child_args(int *argc, char **argv, int *role, int *shared_fd, int *dp_fd,
                          char *preload, size_t len) {
  if (*argc < 3 || strcmp(argv[*argc - 2], CHILD_ARG)) return 0;
  const char *v = argv[*argc - 1];
  int off = 0;
  if (sscanf(v, "%d:%d:%d:%n", role, shared_fd, dp_fd, &off) != 3 || off == 0 || !v[off] ||
      *role < 0 || *role >= WB_MAX_PROCS || *shared_fd < 0 || strlen(v + off) >= len)
    return -1;
  snprintf(preload, len, "%s", v + off);
  *argc -= 2;
  argv[*argc] = NULL;
  return 1;
}

int wb_preload_traces(const wb_opts_t *o, wb_shared_t *sh, wb_traced_t *out) {
  memset(out, 0, sizeof *out);
  out->phys_known = 1;
  int rc = 0;
  for (int g = 0; g < wb_local_ranks(o); g++) {
    /* One GPU's replicas: each trace analysed once, for its gate wait and the combined wave. */
    wl_trace_analysis_t *a[WB_MAX_PROCS] = {0};
    int read = 1;
    for (int k = 0; k < o->replicas; k++) {
      int i = g * o->replicas + k;
      char path[4096], err[256];
      wb_trace_path(o, i, path, sizeof path);
      if (wl_trace_analyze_file(path, WL_TRACE_OPEN_SALVAGE, NULL, &a[k], NULL, err, sizeof err)) {
        read = 0;
        continue;
      }
      /* The analysis sums GATE_GRANT events' waits, and BUDGET_WAIT events' (the interposer's
       * waits for the group's memory). */
      wl_trace_summary_t s;
      wl_trace_analysis_summary(a[k], &s);
      sh->r[i].mem_wait_ns = s.budget_wait_ns;
      sh->r[i].mem_wait_known = 1;
      if (o->mode == WB_TICKTOCK) {
        sh->r[i].gate_wait_ns = s.gate_wait_ns;
        sh->r[i].gate_grants = s.gate_waits;
        sh->r[i].gate_wait_known = 1;
      }
    }
    if (read && o->mode == WB_SINGLE && o->replicas == 1) {
      uint64_t pk = 0; /* two of it at their best offsets, in physical memory when traced */
      if (wl_trace_ticktock_peak(a[0], 2, &pk) == 0 && pk > out->pair_peak) out->pair_peak = pk;
      if (wl_trace_ticktock_peak(a[0], 1, &pk) == 0 && pk > out->one_peak) out->one_peak = pk;
    }
    wl_trace_combined_t *c = NULL;
    if (read &&
        wl_trace_combine((const wl_trace_analysis_t *const *)a, (size_t)o->replicas, 0, &c) == 0) {
      if (c->peak_bytes > out->peak) out->peak = c->peak_bytes;
      if (c->physical_peak_bytes > out->phys_peak) out->phys_peak = c->physical_peak_bytes;
      if (!c->physical_traced) out->phys_known = 0;
      out->rising_ns += c->rising_ns;
      out->overlap_ns += c->overlap_ns;
    } else {
      rc = -1;
    }
    wl_trace_combined_destroy(c);
    for (int k = 0; k < o->replicas; k++) wl_trace_analysis_destroy(a[k]);
  }
  return rc;
}

uint64_t wb_pair_budget(const wb_traced_t *t, int *capped) {
  *capped = 0;
  if (!t->pair_peak || !t->phys_known || !t->phys_peak) return 0;
  double need = (double)t->pair_peak, one = (double)t->phys_peak;
  if (t->one_peak && (double)t->one_peak < one) one = (double)t->one_peak;
  double cap = 0.95 * 2.0 * one;
  if (need >= cap) {
    *capped = 1;
    need = cap;
  }
  return (uint64_t)ceil(need);
}
