/* libwavelet.so under real programs: each test program with and without the preload (same
 * output), the accounting in its trace (exact), co-located replicas in gate mode (no two rising
 * at once, the budget held, out of memory without the gate), SIGKILL of a replica, the NCCL
 * bypass, the C library's malloc, fork and bad options. */
#include <CUnit/Basic.h>
#include <dirent.h>
#include <elf.h>
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <wavelet/sched.h>
#include <wavelet/trace.h>

#include "hooks.h" /* the hooked names, the list the exports are checked against */

extern char **environ;

static char tmpdir[256];

/* ---- running programs ------------------------------------------------------------------------*/

typedef struct proc_s {
  pid_t pid;
  int out; /* its stdout */
  int in;  /* its stdin */
  int preloaded;
  char err[512];
} proc_t;

/* Starts argv with the environment plus extra (NULL-terminated "K=V" list); stderr goes to a
 * file under tmpdir (path in p->err). With a preload, the driver double makes the process exit
 * 97 unless libwavelet.so is loaded ahead of it (WLTEST_EXPECT_PRELOAD), and finish fails the
 * test: ld.so only warns about a preload it cannot load, and most programs print the same
 * without it. */
static int spawn(proc_t *p, char *const argv[], const char *const extra[], const char *preload) {
  static int seq;
  int o[2], i[2];
  if (pipe(o) || pipe(i)) return -1;
  snprintf(p->err, sizeof p->err, "%s/stderr-%d", tmpdir, seq++);
  p->preloaded = preload != NULL;
  pid_t pid = fork();
  if (pid < 0) return -1;
  if (pid == 0) {
    dup2(o[1], 1);
    dup2(i[0], 0);
    int fd = open(p->err, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    if (fd >= 0) dup2(fd, 2);
    close(o[0]);
    close(i[1]);
    signal(SIGPIPE, SIG_DFL); /* ignored by the runner; an ignored signal stays so across exec */
    setenv("LD_LIBRARY_PATH", WL_DOUBLES_DIR, 1);
#ifdef WL_SANITIZED
    /* The sanitizer runtime is linked into the program, after the preload in load order. */
    {
      static char asan[1024];
      const char *ao = getenv("ASAN_OPTIONS");
      /* The nvcc-built programs are not sanitized themselves; LeakSanitizer's thread tracer
       * faults at their exit (before any leak is looked at), so leaks are checked in ours. It
       * faults the same way at the exit of wl-ip-dlopen in alloc and gate modes (reading
       * 0x200000020 while it stops the threads), whose library was not preloaded. */
      int no_leaks = strstr(argv[0], "/wl-prog-") || strstr(argv[0], "/wl-ip-dlopen");
      snprintf(asan, sizeof asan, "%s%sverify_asan_link_order=0%s", ao ? ao : "", ao ? ":" : "",
               no_leaks ? ":detect_leaks=0" : "");
      setenv("ASAN_OPTIONS", asan, 1);
    }
#endif
#ifdef WL_TSAN
    /* Our helper threads make every hooked program multi-threaded, and a forked child starts
     * its own again: ThreadSanitizer calls that unsupported and dies unless told not to. Its
     * deadlock detector holds 64 locks at most; jemalloc's fork handler takes more. */
    {
      static char tsan[1024];
      const char *to = getenv("TSAN_OPTIONS");
      snprintf(tsan, sizeof tsan, "%s%sdie_after_fork=0:detect_deadlocks=0", to ? to : "",
               to ? ":" : "");
      setenv("TSAN_OPTIONS", tsan, 1);
    }
#endif
    setenv("WLTEST_DEVICE_MEM", "2G", 0);
    if (preload) {
      setenv("LD_PRELOAD", preload, 1);
      setenv("WLTEST_EXPECT_PRELOAD", WL_LIBWAVELET, 1);
    } else {
      unsetenv("LD_PRELOAD");
      unsetenv("WLTEST_EXPECT_PRELOAD");
    }
    for (const char *const *e = extra; e && *e; e++) putenv((char *)*e);
    execv(argv[0], argv);
    _exit(127);
  }
  close(o[1]);
  close(i[0]);
  p->pid = pid;
  p->out = o[0];
  p->in = i[1];
  return 0;
}

static char *slurp(const char *path);

/* The analysis of the trace at path (which must read) in su. */
static void trace_summary(const char *path, wl_trace_summary_t *su) {
  wl_trace_analysis_t *a = NULL;
  char err[256];
  int rc = wl_trace_analyze_file(path, WL_TRACE_OPEN_SALVAGE, NULL, &a, NULL, err, sizeof err);
  CU_ASSERT_EQUAL(rc, 0);
  if (rc) fprintf(stderr, "\n%s\n", err);
  wl_trace_analysis_summary(a, su); /* zeros for a NULL analysis */
  wl_trace_analysis_destroy(a);
}

/* Reads the process's whole stdout and waits for it; returns its exit status (or 128 + signal).
 * A process started with the preload that ran without it fails the test here. */
static int finish(proc_t *p, char *out, size_t cap) {
  size_t n = 0;
  ssize_t k;
  while ((k = read(p->out, out + n, cap - 1 - n)) > 0) n += (size_t)k;
  out[n] = 0;
  close(p->out);
  close(p->in);
  int st;
  waitpid(p->pid, &st, 0);
  if (p->preloaded) {
    char *e = slurp(p->err);
    int missing = strstr(e, "WLTEST_EXPECT_PRELOAD=") || strstr(e, "cannot be preloaded");
    CU_ASSERT_FALSE(missing);
    if (missing) fprintf(stderr, "\nthe preload was not in effect:\n%s", e);
    free(e);
  }
  return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
}

static int run(char *const argv[], const char *const extra[], const char *preload, char *out,
               size_t cap, char *errpath, size_t errcap) {
  proc_t p;
  if (spawn(&p, argv, extra, preload)) return -1;
  int rc = finish(&p, out, cap);
  if (errpath) snprintf(errpath, errcap, "%s", p.err);
  return rc;
}

/* The modes the comparison tests run a program in, in order (from index 2 on, memory is served). */
static const char *const all_modes[] = {"off", "trace", "alloc", "gate"};

/* Runs argv with the preload in all_modes[m], in group (a WAVELET_GROUP= setting), with more
 * settings (NULL-terminated; may be NULL). */
static int run_mode(char *const argv[], int m, const char *group, const char *const more[],
                    char *out, size_t cap, char *errpath, size_t errcap) {
  char envm[64];
  snprintf(envm, sizeof envm, "WAVELET_MODE=%s", all_modes[m]);
  const char *extra[16] = {envm, group};
  size_t n = 2;
  for (; more && *more && n + 1 < sizeof extra / sizeof extra[0]; more++) extra[n++] = *more;
  extra[n] = NULL;
  return run(argv, extra, WL_LIBWAVELET, out, cap, errpath, errcap);
}

/* run_mode, which must succeed and print plain's output (both shown when not). */
static void run_mode_same(char *const argv[], int m, const char *group, const char *const more[],
                          const char *plain, char *out, size_t cap, char *errpath, size_t errcap) {
  CU_ASSERT_EQUAL(run_mode(argv, m, group, more, out, cap, errpath, errcap), 0);
  CU_ASSERT_STRING_EQUAL(out, plain);
  if (strcmp(out, plain)) fprintf(stderr, "\nmode %s:\n%s--- plain:\n%s", all_modes[m], out, plain);
}

/* Reads one line from the process (blocking); 0 at EOF. */
static int read_line(proc_t *p, char *buf, size_t cap) {
  size_t n = 0;
  char c;
  while (n + 1 < cap && read(p->out, &c, 1) == 1) {
    if (c == '\n') break;
    buf[n++] = c;
  }
  buf[n] = 0;
  return n > 0;
}

/* A line containing want within ms milliseconds (a process blocked where it must not be never
 * prints it); 1 when it came. */
static int wait_line(proc_t *p, const char *want, int ms) {
  char buf[512];
  size_t n = 0;
  for (;;) {
    struct pollfd pfd = {.fd = p->out, .events = POLLIN};
    if (poll(&pfd, 1, ms) != 1) return 0;
    char c;
    if (read(p->out, &c, 1) != 1) return 0;
    if (c != '\n' && n + 1 < sizeof buf) {
      buf[n++] = c;
      continue;
    }
    buf[n] = 0;
    if (strstr(buf, want)) return 1;
    n = 0;
  }
}

static char *slurp(const char *path) {
  FILE *f = fopen(path, "r");
  if (!f) return strdup("");
  static char buf[65536];
  size_t n = fread(buf, 1, sizeof buf - 1, f);
  buf[n] = 0;
  fclose(f);
  return strdup(buf);
}

/* argv in trace, alloc and gate modes: trace mode must print plain (the driver's output), alloc
 * and gate modes served (plain itself, unless their answers differ by design: budgets, access).
 * check, when given, looks at the stderr of the alloc and gate runs. */
static void run_modes(char *const argv[], const char *group, const char *const more[],
                      const char *plain, const char *served, void (*check)(const char *err)) {
  char out[2048], err[512];
  run_mode_same(argv, 1, group, more, plain, out, sizeof out, err, sizeof err);
  for (int m = 2; m < 4; m++) {
    CU_ASSERT_EQUAL(run_mode(argv, m, group, more, out, sizeof out, err, sizeof err), 0);
    CU_ASSERT_STRING_EQUAL(out, served);
    if (!check) continue;
    char *e = slurp(err);
    check(e);
    free(e);
  }
}

static unsigned long long field(const char *out, const char *name) {
  const char *p = strstr(out, name);
  return p ? strtoull(p + strlen(name), NULL, 10) : ~0ull;
}

/* ---- the holder (wl-ip-holder): another member of the group -----------------------------------*/

/* Starts it with argv (NULL: it takes the token) and extra; returns once it holds. */
static void holder_start(proc_t *h, char *const argv[], const char *const extra[]) {
  char *const token[] = {WL_HOLDER, NULL};
  CU_ASSERT_EQUAL_FATAL(spawn(h, argv ? argv : token, extra, NULL), 0);
  char line[128];
  CU_ASSERT_TRUE_FATAL(read_line(h, line, sizeof line));
  CU_ASSERT_STRING_EQUAL(line, "held");
}

/* Tells it to let go; the time it did (CLOCK_MONOTONIC ns). */
static unsigned long long holder_release(proc_t *h) {
  char line[128];
  CU_ASSERT_EQUAL(write(h->in, "go\n", 3), 3);
  CU_ASSERT_TRUE(read_line(h, line, sizeof line));
  return strncmp(line, "released ", 9) ? 0 : strtoull(line + 9, NULL, 10);
}

/* Tells it to leave the group, and waits for it. */
static void holder_end(proc_t *h) {
  char line[128];
  CU_ASSERT_EQUAL(write(h->in, "bye\n", 4), 4);
  finish(h, line, sizeof line);
}

/* ---- traces ----------------------------------------------------------------------------------*/

typedef struct tstats_s {
  unsigned long long allocs, frees, launches, alloc_bytes, free_bytes, events;
  unsigned long long maps, unmaps;
  int complete;
} tstats_t;

static int trace_stats(const char *path, tstats_t *t) {
  memset(t, 0, sizeof *t);
  wl_trace_reader_t *r = NULL;
  int rc = wl_trace_open(&r, path, WL_TRACE_OPEN_SALVAGE);
  if (rc) {
    if (r) {
      fprintf(stderr, "%s\n", wl_trace_reader_error(r));
      wl_trace_reader_close(r);
    }
    return rc;
  }
  wl_trace_event_t ev[256];
  long n;
  while ((n = wl_trace_read(r, ev, 256)) > 0) {
    for (long i = 0; i < n; i++) {
      t->events++;
      switch (ev[i].kind) {
      case WL_TRACE_ALLOC:
        t->allocs++;
        t->alloc_bytes += ev[i].size;
        break;
      case WL_TRACE_FREE_REQ:
        t->frees++;
        t->free_bytes += ev[i].size;
        break;
      case WL_TRACE_LAUNCH:
        t->launches++;
        break;
      case WL_TRACE_MAP:
        t->maps++;
        break;
      case WL_TRACE_UNMAP:
        t->unmaps++;
        break;
      default:
        break;
      }
    }
  }
  wl_trace_reader_info_t info;
  wl_trace_reader_info(r, &info);
  t->complete = info.complete;
  wl_trace_reader_close(r);
  return n < 0 ? (int)n : 0;
}

/* ---- the probe: three doors, threads, VMM, pinned ---------------------------------------------*/

static char out_plain[65536];

static void probe_plain(void) {
  static int done;
  if (done) return;
  char *argv[] = {WL_PROBE, "doors", NULL};
  int rc = run(argv, NULL, NULL, out_plain, sizeof out_plain, NULL, 0);
  CU_ASSERT_EQUAL_FATAL(rc, 0);
  CU_ASSERT_PTR_NOT_NULL(strstr(out_plain, "checksum"));
  done = 1;
}

/* The same output under the preload, and an exact trace. */
static void probe_mode(const char *mode, int expect_trace) {
  probe_plain();
  char trace[512], env_trace[600], env_mode[64], env_group[128], err[512];
  snprintf(trace, sizeof trace, "%s/probe-%s.wlt", tmpdir, mode);
  snprintf(env_trace, sizeof env_trace, "WAVELET_TRACE=%s", trace);
  snprintf(env_mode, sizeof env_mode, "WAVELET_MODE=%s", mode);
  snprintf(env_group, sizeof env_group, "WAVELET_GROUP=wltest-probe-%d", (int)getpid());
  const char *extra[] = {env_trace, env_mode, env_group, "WAVELET_SHOW_STATS=1", NULL};
  char *argv[] = {WL_PROBE, "doors", NULL};
  static char out[65536];
  int rc = run(argv, extra, WL_LIBWAVELET, out, sizeof out, err, sizeof err);
  CU_ASSERT_EQUAL(rc, 0);
  CU_ASSERT_STRING_EQUAL(out, out_plain);
  if (rc || strcmp(out, out_plain)) {
    char *e = slurp(err);
    fprintf(stderr, "\n--- mode %s output:\n%s--- stderr:\n%s\n", mode, out, e);
    free(e);
  }
  tstats_t t;
  int trc = trace_stats(trace, &t);
  if (!expect_trace) {
    CU_ASSERT_NOT_EQUAL(trc, 0); /* no file */
    return;
  }
  CU_ASSERT_EQUAL_FATAL(trc, 0);
  CU_ASSERT_TRUE(t.complete);
  CU_ASSERT_EQUAL(t.allocs, field(out, "allocations "));
  CU_ASSERT_EQUAL(t.frees, field(out, "frees "));
  CU_ASSERT_EQUAL(t.launches, field(out, "launches "));
  CU_ASSERT_EQUAL(t.alloc_bytes - t.free_bytes, field(out, "live "));
  if (t.allocs != field(out, "allocations ") || t.alloc_bytes - t.free_bytes != field(out, "live "))
    fprintf(stderr, "\nmode %s: trace allocs %llu frees %llu launches %llu live %llu\n%s", mode,
            t.allocs, t.frees, t.launches, t.alloc_bytes - t.free_bytes, out);
  if (!strcmp(mode, "trace")) CU_ASSERT_EQUAL(t.maps, 1);  /* the program's own VMM mapping */
  if (!strcmp(mode, "alloc")) CU_ASSERT_TRUE(t.maps >= 1); /* liballoc's chunks */
}

static void test_probe_trace(void) {
  probe_mode("trace", 1);
}
static void test_probe_off(void) {
  probe_mode("off", 0);
}
static void test_probe_alloc(void) {
  probe_mode("alloc", 1);
}

/* A driver whose VMM calls fail for a reason other than memory (a sandbox without VMM support,
 * WLTEST_DRV_FAIL here): the first failure makes the device's allocations pass through, said in
 * one line, so the program runs as without us, whether it fails at the first chunk or after some
 * allocations were served (those are still freed by liballoc). A refusal for a stream capture
 * (CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED) passes that allocation through and serving goes on. */
static void test_vmm_refused(void) {
  static const struct {
    const char *fail, *mode;
    int served, stops; /* stops: serving ends (a refusal for a capture is not the VMM's fault) */
  } cases[] = {
      {"WLTEST_DRV_FAIL=cuMemCreate:801", "alloc", 0, 1},
      {"WLTEST_DRV_FAIL=cuMemSetAccess:999", "gate", 0, 1},
      {"WLTEST_DRV_FAIL=cuMemCreate:801:1", "alloc", 1, 1},
      {"WLTEST_DRV_FAIL=cuMemMap:801:1", "gate", 1, 1},
      {"WLTEST_DRV_FAIL=cuMemCreate:900:1", "alloc", 1, 0},
  };
  char *argv[] = {WL_REPLICA, "3", "4", "8", NULL};
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    char plain[1024], out[1024], err[512], env_mode[64], env_group[128];
    const char *pextra[] = {cases[i].fail, NULL};
    CU_ASSERT_EQUAL_FATAL(run(argv, pextra, NULL, plain, sizeof plain, NULL, 0), 0);
    snprintf(env_mode, sizeof env_mode, "WAVELET_MODE=%s", cases[i].mode);
    snprintf(env_group, sizeof env_group, "WAVELET_GROUP=wltest-vmmfail-%d", (int)getpid());
    const char *extra[] = {cases[i].fail, env_mode, env_group, "WAVELET_SHOW_STATS=1", NULL};
    int rc = run(argv, extra, WL_LIBWAVELET, out, sizeof out, err, sizeof err);
    char *e = slurp(err);
    CU_ASSERT_EQUAL(rc, 0);
    CU_ASSERT_STRING_EQUAL(out, plain);
    const char *line = "passing this device's allocations through from now on";
    const char *at = strstr(e, line);
    CU_ASSERT_EQUAL(at != NULL, cases[i].stops);
    CU_ASSERT_TRUE(!at || !strstr(at + 1, line)); /* said once */
    unsigned long long served = field(e, "served by liballoc");
    CU_ASSERT_TRUE(cases[i].served ? served > 0 && served != ~0ull : served == 0);
    if (rc || (at != NULL) != cases[i].stops || strcmp(out, plain))
      fprintf(stderr, "\n%s (%s): exit %d\n%s%s\n", cases[i].fail, cases[i].mode, rc, out, e);
    free(e);
  }
}

/* A driver that has shut down (CUDA_ERROR_DEINITIALIZED, what an H200 answered liballoc's exit
 * work after the runtime's teardown) is not an error to report: every event record fails so
 * here, the program's output is unchanged, and nothing is said about it. */
static void test_driver_shut_down(void) {
  char *argv[] = {WL_REPLICA, "3", "4", "8", NULL};
  char plain[1024], out[1024], err[512], env_group[128];
  const char *fail = "WLTEST_DRV_FAIL=cuEventRecord:4";
  const char *pextra[] = {fail, NULL};
  CU_ASSERT_EQUAL_FATAL(run(argv, pextra, NULL, plain, sizeof plain, NULL, 0), 0);
  snprintf(env_group, sizeof env_group, "WAVELET_GROUP=wltest-deinit-%d", (int)getpid());
  const char *extra[] = {fail, "WAVELET_MODE=alloc", env_group, "WAVELET_SHOW_STATS=1", NULL};
  CU_ASSERT_EQUAL(run(argv, extra, WL_LIBWAVELET, out, sizeof out, err, sizeof err), 0);
  CU_ASSERT_STRING_EQUAL(out, plain);
  char *e = slurp(err);
  unsigned long long served = field(e, "served by liballoc");
  CU_ASSERT_TRUE(served > 0 && served != ~0ull);
  CU_ASSERT_PTR_NULL(strstr(e, "cuEventRecord failed"));
  CU_ASSERT_PTR_NULL(strstr(e, "recording an event"));
  free(e);
  wl_sched_group_remove(env_group + strlen("WAVELET_GROUP="));
}

/* The allocator learns of a stream that captures without querying it: a query invalidates a
 * capture (the programming guide; the driver double refuses it so since 2026-12-04). Here a
 * served block freed on a new, capturing stream. Before, liballoc's first look at the stream
 * was a cuStreamQuery, and the double said so. */
static void test_capture_stream_unqueried(void) {
  char *argv[] = {WL_PROBE, "capture-free", NULL};
  char out[1024], err[512], env_group[128];
  snprintf(env_group, sizeof env_group, "WAVELET_GROUP=wltest-capfree-%d", (int)getpid());
  for (int m = 0; m < 2; m++) {
    const char *extra[] = {m ? "WAVELET_MODE=gate" : "WAVELET_MODE=alloc", env_group, NULL};
    CU_ASSERT_EQUAL(run(argv, extra, WL_LIBWAVELET, out, sizeof out, err, sizeof err), 0);
    CU_ASSERT_PTR_NOT_NULL(strstr(out, "capture-free: done"));
    char *e = slurp(err);
    CU_ASSERT_PTR_NULL(strstr(e, "cuStreamQuery: not permitted on a capturing stream"));
    free(e);
  }
  wl_sched_group_remove(env_group + strlen("WAVELET_GROUP="));
}

static void test_malloc_is_glibc(void) {
  char *argv[] = {WL_PROBE, "malloc", NULL};
  char out[1024], err[512];
  const char *extra[] = {"WAVELET_MODE=alloc", NULL};
  int rc = run(argv, extra, WL_LIBWAVELET, out, sizeof out, err, sizeof err);
#if defined(WL_SANITIZED)
  /* Under the address sanitizer malloc is the sanitizer's (still not jemalloc's). */
  (void)rc;
  CU_ASSERT_PTR_NOT_NULL(strstr(out, "malloc from libasan"));
#elif defined(WL_TSAN)
  (void)rc;
  CU_ASSERT_PTR_NOT_NULL(strstr(out, "malloc from libtsan"));
#else
  CU_ASSERT_EQUAL(rc, 0);
  CU_ASSERT_PTR_NOT_NULL(strstr(out, ": glibc"));
#endif
}

static void test_fork(void) {
  char *argv[] = {WL_PROBE, "fork", NULL};
  char out[1024], trace[600];
  snprintf(trace, sizeof trace, "WAVELET_TRACE=%s/fork-%%p.wlt", tmpdir);
  const char *extra[] = {trace, "WAVELET_MODE=trace", NULL};
  int rc = run(argv, extra, WL_LIBWAVELET, out, sizeof out, NULL, 0);
  CU_ASSERT_EQUAL(rc, 0);
  CU_ASSERT_PTR_NOT_NULL(strstr(out, "fork: child ok"));
}

/* One run of wl-ip-forker (forks, and "early" or NULL): every child exits 0, none hangs. */
static void forker_case(const char *const *extra, char *forks, char *how, const char *mode) {
  char *argv[] = {WL_FORKER, forks, how, NULL};
  char out[256], err[512], want[96];
  int rc = run(argv, extra, WL_LIBWAVELET, out, sizeof out, err, sizeof err);
  if (rc != 0) {
    char *e = slurp(err);
    fprintf(stderr, "\nforker %s %s (%s): status %d\n%s%s", forks, how ? how : "", mode, rc, out,
            e);
    free(e);
  }
  CU_ASSERT_EQUAL(rc, 0);
  snprintf(want, sizeof want, "forker: forks %s ok %s failed 0 hung 0", forks, forks);
  CU_ASSERT_PTR_NOT_NULL(strstr(out, want));
}

/* Fork while four threads allocate, free and launch through the hooks (and a fifth grows and
 * empties the pointer map): every child, whose first hooked calls come while the parent's threads
 * may have held any of the interposer's locks, exits 0 in time in trace, alloc and gate modes;
 * and forks while another thread's first hooked call initialises the interposer (its lock held).
 * wl-ip-forker kills a child past its deadline (a hang) and the whole program has an alarm. */
static void test_fork_threads(void) {
#ifdef WL_SANITIZED
  /* GCC 12's AddressSanitizer does not make its own allocator fork-safe: a child forked while
   * another thread holds the allocator's lock waits for it forever (gdb: the child in
   * __sanitizer::SizeClassAllocator64::GetFromAllocator, from the loader's malloc). That is the
   * sanitizer's hang, not ours: the plain build runs this test. */
  fprintf(stderr, "(skipped under AddressSanitizer: its allocator is not fork-safe) ");
  return;
#endif
  static const char *const modes[] = {"trace", "alloc", "gate"};
  char envg[128], trace[512];
  snprintf(envg, sizeof envg, "WAVELET_GROUP=wltest-ip-fork-%d", (int)getpid());
  snprintf(trace, sizeof trace, "WAVELET_TRACE=%s/forker.wlt", tmpdir);
  for (int m = 0; m < 3; m++) {
    char envm[64];
    snprintf(envm, sizeof envm, "WAVELET_MODE=%s", modes[m]);
    const char *extra[] = {envg, trace, envm, NULL};
    forker_case(extra, "200", NULL, modes[m]);
#ifndef WL_TSAN
    /* forks while the first hooked call initialises on another thread (not under
     * ThreadSanitizer: a child forked while another thread is inside dlopen waits forever for
     * the sanitizer's own library lock, in __sanitizer::LibIgnore::OnLibraryLoaded) */
    forker_case(extra, "20", "early", modes[m]);
#endif
  }
}

/* alloc and gate modes: the budget is the device as cuMemGetInfo tells it, from the first call,
 * before anything is allocated; trace mode: the device. */
static void test_meminfo(void) {
  char *argv[] = {WL_PROBE, "meminfo", NULL};
  char out[1024], group[96];
  snprintf(group, sizeof group, "WAVELET_GROUP=wltest-meminfo-%d", (int)getpid());
  const char *gate[] = {"WAVELET_MODE=gate", "WAVELET_MEM_LIMIT=1G", group, NULL};
  CU_ASSERT_EQUAL(run(argv, gate, WL_LIBWAVELET, out, sizeof out, NULL, 0), 0);
  CU_ASSERT_EQUAL(field(out, "first total "), 1ull << 30);
  CU_ASSERT_EQUAL(field(out, "\ntotal "), 1ull << 30);
  const char *alloc[] = {"WAVELET_MODE=alloc", "WAVELET_MEM_LIMIT=1G", group, NULL};
  CU_ASSERT_EQUAL(run(argv, alloc, WL_LIBWAVELET, out, sizeof out, NULL, 0), 0);
  CU_ASSERT_EQUAL(field(out, "first total "), 1ull << 30);
  /* the first line's free: nothing is held yet, the whole budget is free */
  CU_ASSERT_EQUAL(field(out, " free "), 1ull << 30);
  CU_ASSERT_EQUAL(field(out, "\ntotal "), 1ull << 30);
  unsigned long long fr = field(strstr(out, "\ntotal ") ? strstr(out, "\ntotal ") : out, " free ");
  /* the 64 MiB block lives in one 80 MiB chunk-aligned stretch: free is below 1 GiB - 64 MiB */
  CU_ASSERT_TRUE(fr <= (1ull << 30) - (64ull << 20));
  CU_ASSERT_TRUE(fr >= (1ull << 30) - (128ull << 20));
  CU_ASSERT_EQUAL(field(out, "proc total "), 1ull << 30); /* the same through cuGetProcAddress */
  const char *trace[] = {"WAVELET_MODE=trace", NULL};
  CU_ASSERT_EQUAL(run(argv, trace, WL_LIBWAVELET, out, sizeof out, NULL, 0), 0);
  CU_ASSERT_EQUAL(field(out, "total "), 2ull << 30); /* WLTEST_DEVICE_MEM */
  /* A driver whose answer is no exported symbol: that door is not seen (the device's view),
   * and the log says so once, by name. */
  const char *priv[] = {"WAVELET_MODE=alloc",
                        "WAVELET_MEM_LIMIT=1G",
                        "WAVELET_SHOW_STATS=1",
                        "WLTEST_PROC_PRIVATE=cuMemGetInfo",
                        group,
                        NULL};
  char err[512];
  CU_ASSERT_EQUAL(run(argv, priv, WL_LIBWAVELET, out, sizeof out, err, sizeof err), 0);
  CU_ASSERT_EQUAL(field(out, "total "), 1ull << 30);
  CU_ASSERT_EQUAL(field(out, "proc total "), 2ull << 30);
  char *e = slurp(err);
  const char *line = "the driver answered cuMemGetInfo with";
  const char *at = strstr(e, line);
  CU_ASSERT_PTR_NOT_NULL(at);
  CU_ASSERT_TRUE(at && !strstr(at + 1, line));
  CU_ASSERT_TRUE(field(e, "answers we cannot wrap") >= 1 &&
                 field(e, "answers we cannot wrap") != ~0ull);
  if (!at) fprintf(stderr, "\n%s%s\n", out, e);
  free(e);
}

/* A process that only asks (a launcher sizing its replicas) is told the budget but takes no
 * role: the group of K roles is not joined, so the replicas it starts find theirs free. With a
 * group already there, its limit and use are what it is told. */
static void test_meminfo_does_not_join(void) {
  char *argv[] = {WL_PROBE, "meminfo-only", NULL};
  char out[512], group[128], name[64];
  snprintf(name, sizeof name, "wltest-ip-mionly-%d", (int)getpid());
  snprintf(group, sizeof group, "WAVELET_GROUP=%s", name);
  for (int m = 2; m < 4; m++) {
    const char *more[] = {"WAVELET_MEM_LIMIT=1G", NULL};
    CU_ASSERT_EQUAL(run_mode(argv, m, group, more, out, sizeof out, NULL, 0), 0);
    CU_ASSERT_EQUAL(field(out, "only total "), 1ull << 30);
    CU_ASSERT_EQUAL(field(out, " free "), 1ull << 30);
    CU_ASSERT_EQUAL(wl_sched_group_exists(name), 0);
  }
  /* The group exists (a member holds 300 MiB of a 768 MiB budget): the asker is told that. */
  wl_sched_config_t cfg;
  wl_sched_config_default(&cfg);
  cfg.group = name;
  cfg.mem_limit = 768ull << 20;
  wl_sched_t *s = NULL;
  CU_ASSERT_EQUAL_FATAL(wl_sched_join(&s, &cfg), 0);
  CU_ASSERT_EQUAL(wl_sched_acquire(s, 300ull << 20, 0), 0);
  const char *more[] = {"WAVELET_MEM_LIMIT=1G", NULL};
  CU_ASSERT_EQUAL(run_mode(argv, 3, group, more, out, sizeof out, NULL, 0), 0);
  CU_ASSERT_EQUAL(field(out, "only total "), 768ull << 20);
  CU_ASSERT_EQUAL(field(out, " free "), 468ull << 20);
  wl_sched_release(s, 300ull << 20);
  wl_sched_leave(s);
  wl_sched_group_remove(name);
}

/* Another interposer of a driver function, preloaded after us, asks dlsym(RTLD_NEXT) for its
 * next: it must get the driver's function, never its own (our lookup answers "next after
 * libwavelet", which is that library); a library forwarding to itself would recurse forever. */
static void test_rtld_next_interposer(void) {
  char *argv[] = {WL_PROBE, "meminfo", NULL};
  char out[1024], err[512];
  const char *extra[] = {"WAVELET_MODE=trace", NULL};
  int rc = run(argv, extra, WL_LIBWAVELET " " WL_NEXT_LIB, out, sizeof out, err, sizeof err);
  CU_ASSERT_EQUAL(rc, 0);
  char *e = slurp(err);
  const char *said = "wl-ip-next: next cuMemAlloc_v2 is ", *next = strstr(e, said);
  CU_ASSERT_PTR_NOT_NULL(next);
  int driver = next && !strncmp(next + strlen(said), WL_DOUBLES_DIR "/libcuda.so",
                                strlen(WL_DOUBLES_DIR "/libcuda.so"));
  CU_ASSERT_TRUE(driver);
  if (rc || !driver) fprintf(stderr, "\n%s\n", e);
  free(e);
}

/* The names libwavelet.so defines in its dynamic symbol table (functions and objects, global or
 * weak), each "name\n" in buf; their count, or -1 when the file cannot be read as ELF64. */
static int exported_names(const char *path, char *buf, size_t cap) {
  int fd = open(path, O_RDONLY);
  if (fd < 0) return -1;
  struct stat st;
  void *m = fstat(fd, &st) == 0 ? mmap(NULL, (size_t)st.st_size, PROT_READ, MAP_PRIVATE, fd, 0)
                                : MAP_FAILED;
  close(fd);
  if (m == MAP_FAILED) return -1;
  const unsigned char *b = m;
  const Elf64_Ehdr *eh = m;
  int n = -1;
  size_t used = 0;
  buf[0] = 0;
  if ((size_t)st.st_size < sizeof *eh || memcmp(eh->e_ident, ELFMAG, SELFMAG) ||
      eh->e_ident[EI_CLASS] != ELFCLASS64 || eh->e_shentsize != sizeof(Elf64_Shdr) ||
      eh->e_shoff + (uint64_t)eh->e_shnum * sizeof(Elf64_Shdr) > (uint64_t)st.st_size)
    goto out;
  const Elf64_Shdr *sh = (const Elf64_Shdr *)(b + eh->e_shoff);
  for (unsigned i = 0; i < eh->e_shnum; i++) {
    if (sh[i].sh_type != SHT_DYNSYM || sh[i].sh_link >= eh->e_shnum) continue;
    const Elf64_Sym *sym = (const Elf64_Sym *)(b + sh[i].sh_offset);
    const char *str = (const char *)(b + sh[sh[i].sh_link].sh_offset);
    n = 0;
    for (size_t k = 0; k < sh[i].sh_size / sizeof *sym; k++) {
      unsigned bind = ELF64_ST_BIND(sym[k].st_info), type = ELF64_ST_TYPE(sym[k].st_info);
      if (sym[k].st_shndx == SHN_UNDEF || (bind != STB_GLOBAL && bind != STB_WEAK) ||
          (type != STT_FUNC && type != STT_OBJECT))
        continue;
      int w = snprintf(buf + used, cap - used, "%s\n", str + sym[k].st_name);
      if (w < 0 || (size_t)w >= cap - used) {
        n = -1;
        goto out;
      }
      used += (size_t)w;
      n++;
    }
  }
out:
  munmap(m, (size_t)st.st_size);
  return n;
}

/* libwavelet.so exports exactly the names it hooks (hooks.h's lists), dlsym and the trainer's
 * markers: the version script's patterns (cu[A-Z]*, ...) would let any new global of such a
 * name out silently, and a name exported but not hooked would take the program's calls. */
static void test_exports_are_the_hooks(void) {
  static char names[65536];
  int n = exported_names(WL_LIBWAVELET, names, sizeof names);
  CU_ASSERT_TRUE_FATAL(n > 0);
  static const char *const want[] = {
#define WL__NAME(x) #x,
      WL__DRV_HOOKS(WL__NAME) WL__RT_HOOKS(WL__NAME) WL__NCCL_HOOKS(WL__NAME)
#undef WL__NAME
          "dlsym",
      "wl_iteration_begin", "wl_backward_begin", "wl_iteration_end"};
  const int nwant = (int)(sizeof want / sizeof want[0]);
  char line[160];
  int found = 0;
  for (int i = 0; i < nwant; i++) {
    snprintf(line, sizeof line, "\n%s\n", want[i]);
    /* names starts without a newline: compare the first line too */
    int in = strstr(names, line + 1) == names || strstr(names, line) != NULL;
    if (!in) fprintf(stderr, "\nhooked but not exported: %s\n", want[i]);
    CU_ASSERT_TRUE(in);
    found += in;
  }
  for (char *p = names, *e; *p; p = e + 1) {
    e = strchr(p, '\n');
    *e = 0;
    int known = 0;
    for (int i = 0; i < nwant && !known; i++) known = !strcmp(p, want[i]);
    if (!known) fprintf(stderr, "\nexported but not a hook: %s\n", p);
    CU_ASSERT_TRUE(known);
  }
  CU_ASSERT_EQUAL(found, nwant);
  CU_ASSERT_EQUAL(n, nwant);
}

/* WAVELET_LOG=debug prints the resolved table. */
static void test_debug_table(void) {
  char *argv[] = {WL_PROBE, "meminfo", NULL};
  char out[1024], err[512];
  const char *extra[] = {"WAVELET_LOG=debug", "WAVELET_MODE=trace", NULL};
  CU_ASSERT_EQUAL(run(argv, extra, WL_LIBWAVELET, out, sizeof out, err, sizeof err), 0);
  char *e = slurp(err);
  CU_ASSERT_PTR_NOT_NULL(strstr(e, "option WAVELET_MODE"));
  CU_ASSERT_PTR_NOT_NULL(strstr(e, "option WAVELET_MEM_LIMIT"));
  CU_ASSERT_PTR_NOT_NULL(strstr(e, "option WAVELET_TRACE"));
  free(e);
}

#ifdef WL_PROG_REPLICA
/* The trainer's markers reach the trace in trace and alloc modes as MARKER events, so its
 * iterations come from them (the analysis's strongest source): before, only gate mode's phase
 * events had them, and the other modes' iterations were guessed from the wave, or not found. Gate
 * mode keeps its phase events alone (they begin where the gate is entered), with the same
 * iterations. Without the markers the source is something else (the check can fail). */
static void markers_case(int m, int markers) {
  char group[96], envg[128], trace[512], envt[600];
  snprintf(group, sizeof group, "wltest-ip-mark-%d-%d", (int)getpid(), m);
  snprintf(envg, sizeof envg, "WAVELET_GROUP=%s", group);
  snprintf(trace, sizeof trace, "%s/markers-%s-%d.wlt", tmpdir, all_modes[m], markers);
  snprintf(envt, sizeof envt, "WAVELET_TRACE=%s", trace);
  const char *more[] = {envt, NULL};
  char *argv[] = {WL_PROG_REPLICA,
                  "--iters",
                  "4",
                  "--kernels",
                  "2",
                  "--peak",
                  "8M",
                  "--quiet",
                  markers ? "--markers" : NULL,
                  NULL};
  static char out[8192];
  char err[512];
  CU_ASSERT_EQUAL(run_mode(argv, m, envg, more, out, sizeof out, err, sizeof err), 0);
  wl_trace_summary_t su;
  trace_summary(trace, &su);
  if (markers && !strcmp(all_modes[m], "gate")) {
    CU_ASSERT_EQUAL(su.source, WL_TRACE_ITER_PHASES);
    CU_ASSERT_EQUAL(su.iterations, 4);
    CU_ASSERT_EQUAL(su.markers, 0);
  } else if (markers) {
    CU_ASSERT_EQUAL(su.source, WL_TRACE_ITER_MARKERS);
    CU_ASSERT_EQUAL(su.iterations, 4);
    CU_ASSERT_EQUAL(su.markers, 12); /* begin, backward and end of each */
  } else {
    CU_ASSERT_NOT_EQUAL(su.source, WL_TRACE_ITER_MARKERS);
    CU_ASSERT_EQUAL(su.markers, 0);
  }
  if (markers && su.iterations != 4)
    fprintf(stderr, "\nmode %s: source %d, %llu iterations, %llu markers\n", all_modes[m],
            (int)su.source, (unsigned long long)su.iterations, (unsigned long long)su.markers);
  unlink(trace);
  wl_sched_group_remove(group);
}

static void test_markers_traced(void) {
  for (int m = 1; m < 4; m++) markers_case(m, 1);
  markers_case(1, 0);
}
#endif

/* Two processes of one WAVELET_TRACE (a path without %p, inherited): the second writes its own
 * trace beside the first one's (PATH.<pid>, said once) and leaves the first one's whole. Before,
 * it truncated the first one's file and rings, and the first process died of SIGBUS. */
static void test_trace_path_shared(void) {
  char trace[512], envt[600];
  snprintf(trace, sizeof trace, "%s/shared-trace.wlt", tmpdir);
  snprintf(envt, sizeof envt, "WAVELET_TRACE=%s", trace);
  const char *extra[] = {envt, "WAVELET_MODE=trace", NULL};
  proc_t first;
  char *hargv[] = {WL_PROBE, "hold", "1", NULL};
  CU_ASSERT_EQUAL_FATAL(spawn(&first, hargv, extra, WL_LIBWAVELET), 0);
  char line[128];
  CU_ASSERT_TRUE_FATAL(read_line(&first, line, sizeof line));
  CU_ASSERT_STRING_EQUAL(line, "hold: 1 MiB 0");
  proc_t second;
  char *pargv[] = {WL_PROBE, "meminfo", NULL};
  CU_ASSERT_EQUAL_FATAL(spawn(&second, pargv, extra, WL_LIBWAVELET), 0);
  char out[4096];
  CU_ASSERT_EQUAL(finish(&second, out, sizeof out), 0);
  char *e = slurp(second.err);
  CU_ASSERT_PTR_NOT_NULL(e && strstr(e, "is being written by another live process"));
  free(e);
  char beside[600];
  snprintf(beside, sizeof beside, "%s.%d", trace, (int)second.pid);
  tstats_t t2;
  CU_ASSERT_EQUAL(trace_stats(beside, &t2), 0);
  CU_ASSERT_EQUAL(t2.complete, 1);
  CU_ASSERT_EQUAL(write(first.in, "go\n", 3), 3);
  CU_ASSERT_EQUAL(finish(&first, out, sizeof out), 0);
  CU_ASSERT_PTR_NOT_NULL(strstr(out, "hold: freed"));
  tstats_t t1;
  CU_ASSERT_EQUAL(trace_stats(trace, &t1), 0);
  CU_ASSERT_EQUAL(t1.complete, 1);
  CU_ASSERT_EQUAL(t1.allocs, 1);
  CU_ASSERT_EQUAL(t1.frees, 1);
  unlink(beside);
}

static void test_bad_options(void) {
  probe_plain();
  char *argv[] = {WL_PROBE, "doors", NULL};
  static char out[65536];
  char err[512];
  const char *extra[] = {"WAVELET_MODE=sideways", "WAVELET_SHOW_STATS=maybe", "WAVELET_WAVES=1",
                         "WAVELET_LOG=loud", NULL};
  int rc = run(argv, extra, WL_LIBWAVELET, out, sizeof out, err, sizeof err);
  CU_ASSERT_EQUAL(rc, 0);
  CU_ASSERT_STRING_EQUAL(out, out_plain);
  char *e = slurp(err);
  CU_ASSERT_PTR_NOT_NULL(strstr(e, "WAVELET_MODE='sideways' is not valid"));
  CU_ASSERT_PTR_NOT_NULL(strstr(e, "WAVELET_SHOW_STATS='maybe' is not valid"));
  CU_ASSERT_PTR_NOT_NULL(strstr(e, "WAVELET_WAVES='1' is not valid"));
  CU_ASSERT_PTR_NOT_NULL(strstr(e, "WAVELET_LOG='loud' is not valid"));
  free(e);
  /* A trace that cannot be written (its folder does not exist, or it names a folder): one line
   * naming it, and the program runs as without us, in trace and gate modes. */
  static const char *const traces[] = {"WAVELET_TRACE=/nonexistent-wavelet-dir/t.wlt",
                                       "WAVELET_TRACE=/tmp"};
  for (int i = 0; i < 2; i++)
    for (int m = 1; m < 4; m += 2) {
      char envm[64], group[96];
      snprintf(envm, sizeof envm, "WAVELET_MODE=%s", all_modes[m]);
      snprintf(group, sizeof group, "WAVELET_GROUP=wltest-badtrace-%d", (int)getpid());
      const char *bad[] = {envm, traces[i], group, NULL};
      CU_ASSERT_EQUAL(run(argv, bad, WL_LIBWAVELET, out, sizeof out, err, sizeof err), 0);
      CU_ASSERT_STRING_EQUAL(out, out_plain);
      e = slurp(err);
      const char *line = strstr(e, "cannot write the trace to ");
      CU_ASSERT_PTR_NOT_NULL(line);
      CU_ASSERT_TRUE(line && strstr(line, traces[i] + strlen("WAVELET_TRACE=")) == line + 26);
      if (!line) fprintf(stderr, "\n%s: %s\n", traces[i], e);
      free(e);
      wl_sched_group_remove(group + strlen("WAVELET_GROUP="));
    }
}

/* ---- replicas ---------------------------------------------------------------------------------*/

#define MAXK 3

typedef struct span_s {
  unsigned long long begin, end;
} span_t;

/* The intervals a replica held the token (GATE_GRANT to GATE_RELEASE), the physical bytes over
 * time (MAP - UNMAP + cached model is not needed: liballoc's MAP/UNMAP/PHYS_RELEASE give
 * mapped bytes; we track mapped plus unmapped-but-not-released). */
typedef struct rtrace_s {
  span_t held[4096];
  int nheld;
  /* (time, delta physical) steps */
  unsigned long long t[65536];
  long long d[65536];
  int n;
} rtrace_t;

static rtrace_t rt[MAXK];

static int read_replica(const char *path, rtrace_t *x) {
  memset(x, 0, sizeof *x);
  wl_trace_reader_t *r = NULL;
  if (wl_trace_open(&r, path, WL_TRACE_OPEN_SALVAGE)) {
    if (r) wl_trace_reader_close(r);
    return -1;
  }
  wl_trace_event_t ev[256];
  long n;
  unsigned long long grant = 0, last = 0;
  long long cached = 0;
  while ((n = wl_trace_read(r, ev, 256)) > 0) {
    for (long i = 0; i < n; i++) {
      wl_trace_event_t *e = &ev[i];
      long long d = 0;
      if (e->time_ns > last) last = e->time_ns;
      if (e->kind == WL_TRACE_GATE_GRANT) grant = e->time_ns;
      if (e->kind == WL_TRACE_GATE_RELEASE && grant && x->nheld < 4096) {
        x->held[x->nheld++] = (span_t){grant, e->time_ns};
        grant = 0;
      }
      /* physical = mapped + cached; MAP draws on the cache first */
      if (e->kind == WL_TRACE_MAP) {
        long long from_cache = cached < (long long)e->size ? cached : (long long)e->size;
        cached -= from_cache;
        d = (long long)e->size - from_cache;
      } else if (e->kind == WL_TRACE_UNMAP) {
        cached += (long long)e->size;
      } else if (e->kind == WL_TRACE_PHYS_RELEASE) {
        long long k = cached < (long long)e->size ? cached : (long long)e->size;
        cached -= k;
        d = -k;
      }
      if (d && x->n < 65536) {
        x->t[x->n] = e->time_ns;
        x->d[x->n++] = d;
      }
    }
  }
  if (grant && x->nheld < 4096) x->held[x->nheld++] = (span_t){grant, ~0ull};
  /* The process ended after its last event: the group takes back what it still held. */
  long long left = 0;
  for (int i = 0; i < x->n; i++) left += x->d[i];
  if (left > 0 && x->n < 65536) {
    x->t[x->n] = last + 1;
    x->d[x->n++] = -left;
  }
  wl_trace_reader_close(r);
  return n < 0 ? -1 : 0;
}

/* The most physical memory the replicas held together at any one time. */
static long long combined_peak(int k) {
  int idx[MAXK] = {0};
  long long cur = 0, peak = 0;
  for (;;) {
    int best = -1;
    for (int i = 0; i < k; i++)
      if (idx[i] < rt[i].n && (best < 0 || rt[i].t[idx[i]] < rt[best].t[idx[best]])) best = i;
    if (best < 0) break;
    cur += rt[best].d[idx[best]++];
    if (cur > peak) peak = cur;
  }
  return peak;
}

static int overlaps(int k) {
  int bad = 0;
  for (int a = 0; a < k; a++)
    for (int b = a + 1; b < k; b++)
      for (int i = 0; i < rt[a].nheld; i++)
        for (int j = 0; j < rt[b].nheld; j++)
          if (rt[a].held[i].begin < rt[b].held[j].end && rt[b].held[j].begin < rt[a].held[i].end)
            bad++;
  return bad;
}

#define LAYERS "6"
#define MIB    "8"
/* One replica's peak: 6 activations of 8 MiB in liballoc's 20 MiB chunks: 60 MiB physical. */
#define PEAK_BYTES (60ull << 20)

/* k replicas in `mode` with a budget; returns how many completed; traces in rt[]. kill_one:
 * SIGKILL replica 0 a little after the start. wait_ms: how long an allocation may wait for the
 * budget. */
static int replicas(int k, const char *mode, unsigned long long budget, int iters, int kill_one,
                    int wait_ms, int *ooms) {
  char group[64], envg[96], envm[64], envl[64], envt[MAXK][600], iters_s[16], envw[64];
  snprintf(group, sizeof group, "wltest-ip-%d-%s-%d", (int)getpid(), mode, k);
  snprintf(envg, sizeof envg, "WAVELET_GROUP=%s", group);
  snprintf(envm, sizeof envm, "WAVELET_MODE=%s", mode);
  snprintf(envl, sizeof envl, "WAVELET_MEM_LIMIT=%llu", budget);
  snprintf(envw, sizeof envw, "WAVELET_ALLOC_TIMEOUT_MS=%d", wait_ms);
  snprintf(iters_s, sizeof iters_s, "%d", iters);
  char wav[32];
  snprintf(wav, sizeof wav, "WAVELET_WAVES=%d", k);
  proc_t p[MAXK];
  const char *tpath[MAXK]; /* each in its setting, after "WAVELET_TRACE=" */
  for (int i = 0; i < k; i++) {
    snprintf(envt[i], sizeof envt[i], "WAVELET_TRACE=%s/rep-%s-%d-%d-%d.wlt", tmpdir, mode, k,
             kill_one, i);
    tpath[i] = envt[i] + strlen("WAVELET_TRACE=");
    const char *extra[] = {envg, envm, envl, envt[i], wav, envw, "WAVELET_GATE_TIMEOUT_MS=20000",
                           NULL};
    char *argv[] = {WL_REPLICA, iters_s, LAYERS, MIB, NULL};
    CU_ASSERT_EQUAL_FATAL(spawn(&p[i], argv, extra, WL_LIBWAVELET), 0);
  }
  if (kill_one) {
    /* Mid-run: once replica 0's trace holds a flushed block (it is then past its start-up). */
    for (int w = 0; w < 2000; w++) {
      struct stat st;
      if (stat(tpath[0], &st) == 0 && st.st_size > 512) break;
      usleep(5000);
    }
    kill(p[0].pid, SIGKILL);
  }
  int completed = 0;
  *ooms = 0;
  for (int i = 0; i < k; i++) {
    char out[4096];
    int rc = finish(&p[i], out, sizeof out);
    if (rc == 0 && strstr(out, "done")) completed++;
    if (strstr(out, "out of memory")) (*ooms)++;
    if (rc != 0 && !(kill_one && i == 0) && !strstr(out, "out of memory")) {
      char *e = slurp(p[i].err);
      fprintf(stderr, "\nreplica %d (%s) exit %d:\n%s%s\n", i, mode, rc, out, e);
      free(e);
    }
    read_replica(tpath[i], &rt[i]);
  }
  wl_sched_group_remove(group);
  return completed;
}

/* A budget below what k peaks need together. Gated (gate mode: allocations may wait for memory
 * another replica gives back): every replica completes, no two hold the rising-phase token at
 * once, and the traces never show more physical memory than the budget. Ungated (alloc mode,
 * no waiting: co-location on a device that says no, as a GPU does): out of memory. */
static void gated_vs_ungated(int k) {
  unsigned long long budget = k == 2 ? (100ull << 20) : (110ull << 20);
  CU_ASSERT_TRUE(budget < (unsigned long long)k * PEAK_BYTES);
  int ooms = 0;
  int done = replicas(k, "gate", budget, 8, 0, 5000, &ooms);
  CU_ASSERT_EQUAL(done, k);
  CU_ASSERT_EQUAL(ooms, 0);
  int held = 0;
  for (int i = 0; i < k; i++) held += rt[i].nheld;
  CU_ASSERT_TRUE(held >= k * 4); /* the gate was really used */
  int ov = overlaps(k);
  CU_ASSERT_EQUAL(ov, 0);
  /* The ledger admits at most the budget: the traces of all replicas together must agree. */
  long long peak = combined_peak(k);
  CU_ASSERT_TRUE(peak > 0 && (unsigned long long)peak <= budget);
  if (done != k || ov || (unsigned long long)peak > budget)
    fprintf(stderr, "\ngate k=%d: done %d, token spans %d, overlaps %d, peak %lld budget %llu\n", k,
            done, held, ov, peak, budget);
  done = replicas(k, "alloc", budget, 8, 0, 0, &ooms);
  CU_ASSERT_TRUE(ooms >= 1);
  CU_ASSERT_TRUE(done < k);
  peak = combined_peak(k);
  CU_ASSERT_TRUE((unsigned long long)peak <= budget); /* the ledger holds the line */
}

static void test_two_replicas(void) {
  gated_vs_ungated(2);
}
static void test_three_replicas(void) {
  gated_vs_ungated(3);
}

static void test_sigkill_replica(void) {
  int ooms = 0;
  int done = replicas(3, "gate", 3 * PEAK_BYTES, 8, 1, 5000, &ooms);
  CU_ASSERT_EQUAL(done, 2);
  CU_ASSERT_EQUAL(ooms, 0);
  /* The killed replica's trace is readable up to its last flushed block. */
  CU_ASSERT_TRUE(rt[0].n > 0);
}

/* "Readable after SIGKILL up to the last record": a process killed mid-run (no exit work) leaves
 * every record it made in its trace, in each mode. */
static void test_sigkill_trace_exact(void) {
  for (int m = 1; m < 4; m++) {
    char trace[512], envt[600], envm[64], group[96];
    snprintf(trace, sizeof trace, "%s/killed-%s.wlt", tmpdir, all_modes[m]);
    snprintf(envt, sizeof envt, "WAVELET_TRACE=%s", trace);
    snprintf(envm, sizeof envm, "WAVELET_MODE=%s", all_modes[m]);
    snprintf(group, sizeof group, "WAVELET_GROUP=wltest-killed-%d-%d", (int)getpid(), m);
    char *argv[] = {WL_PROBE, "killed", NULL};
    const char *extra[] = {envm, envt, group, NULL};
    char out[256];
    CU_ASSERT_EQUAL(run(argv, extra, WL_LIBWAVELET, out, sizeof out, NULL, 0), 128 + SIGKILL);
    tstats_t t;
    CU_ASSERT_EQUAL(trace_stats(trace, &t), 0);
    CU_ASSERT_EQUAL(t.allocs, 300);
    CU_ASSERT_EQUAL(t.frees, 100);
    CU_ASSERT_EQUAL(t.launches, 50);
    CU_ASSERT_EQUAL(t.alloc_bytes, 4096ull * 300 * 301 / 2);
    CU_ASSERT_EQUAL(t.free_bytes, 4096ull * 100 * 101 / 2);
    if (t.allocs != 300 || t.frees != 100 || t.launches != 50)
      fprintf(stderr, "\n%s mode: %llu allocs, %llu frees, %llu launches\n", all_modes[m], t.allocs,
              t.frees, t.launches);
    snprintf(group, sizeof group, "wltest-killed-%d-%d", (int)getpid(), m);
    wl_sched_group_remove(group);
  }
}

/* A launch inside NCCL is not gated while another member holds the token. */
static void test_nccl_bypass(void) {
  char group[64], envg[96], envt[600], trace[512];
  snprintf(group, sizeof group, "wltest-ip-nccl-%d", (int)getpid());
  snprintf(envg, sizeof envg, "WAVELET_GROUP=%s", group);
  snprintf(trace, sizeof trace, "%s/nccl.wlt", tmpdir);
  snprintf(envt, sizeof envt, "WAVELET_TRACE=%s", trace);
  proc_t holder, rep;
  const char *hextra[] = {envg, NULL};
  holder_start(&holder, NULL, hextra);
  char line[128];
  const char *rextra[] = {envg, envt, "WAVELET_MODE=gate", "WAVELET_GATE_TIMEOUT_MS=0", NULL};
  char *rargv[] = {WL_REPLICA, "2", "2", "1", "nccl", NULL};
  char preload[1024];
  snprintf(preload, sizeof preload, "%s %s", WL_LIBWAVELET, WL_NCCL_LIB);
  CU_ASSERT_EQUAL_FATAL(spawn(&rep, rargv, rextra, preload), 0);
  /* The collective's launch goes through while the token is held elsewhere. */
  CU_ASSERT_TRUE(read_line(&rep, line, sizeof line));
  CU_ASSERT_STRING_EQUAL(line, "nccl-launch done");
  CU_ASSERT_TRUE(read_line(&rep, line, sizeof line));
  unsigned long long nccl_fn = strtoull(line + strlen("nccl-function "), NULL, 10);
  CU_ASSERT_NOT_EQUAL(nccl_fn, 0);
  unsigned long long released = holder_release(&holder);
  char out[4096];
  int rc = finish(&rep, out, sizeof out);
  CU_ASSERT_EQUAL(rc, 0);
  holder_end(&holder);
  /* In the trace: the first grant came after the holder released; the NCCL launch before. */
  wl_trace_reader_t *r = NULL;
  CU_ASSERT_EQUAL_FATAL(wl_trace_open(&r, trace, WL_TRACE_OPEN_SALVAGE), 0);
  wl_trace_event_t ev[256];
  long n;
  unsigned long long first_grant = 0, nccl_launch = 0;
  while ((n = wl_trace_read(r, ev, 256)) > 0)
    for (long i = 0; i < n; i++) {
      if (ev[i].kind == WL_TRACE_GATE_GRANT && !first_grant) first_grant = ev[i].time_ns;
      if (ev[i].kind == WL_TRACE_LAUNCH && ev[i].addr == nccl_fn && !nccl_launch)
        nccl_launch = ev[i].time_ns;
    }
  wl_trace_reader_close(r);
  CU_ASSERT_TRUE(first_grant >= released);
  CU_ASSERT_TRUE(nccl_launch > 0 && nccl_launch < released);
  wl_sched_group_remove(group);
}

/* NCCL linked into the program statically: no entry point marks the region, the kernel's name
 * does. Its launch at an iteration's beginning goes through while another member holds the
 * token (no gate timeout: were it gated, it would wait for the holder). argv is a replica whose
 * first collective launch prints `want`; nccl_execs: the executable graphs the interposer counts
 * as NCCL's (a collective launched as a captured graph). */
static void static_nccl_case(const char *tag, char **argv, const char *want,
                             unsigned long long nccl_execs) {
  char group[64], envg[96];
  snprintf(group, sizeof group, "wltest-ip-%s-%d", tag, (int)getpid());
  snprintf(envg, sizeof envg, "WAVELET_GROUP=%s", group);
  proc_t holder, rep;
  /* The holder makes the group, with no gate timeout: it keeps the token until told. */
  const char *hextra[] = {envg, "WAVELET_GATE_TIMEOUT_MS=0", NULL};
  holder_start(&holder, NULL, hextra);
  const char *rextra[] = {envg, "WAVELET_MODE=gate", "WAVELET_GATE_TIMEOUT_MS=0",
                          "WAVELET_SHOW_STATS=1", NULL};
  CU_ASSERT_EQUAL_FATAL(spawn(&rep, argv, rextra, WL_LIBWAVELET), 0);
  int through = wait_line(&rep, want, 15000);
  CU_ASSERT_TRUE(through);
  if (!through) fprintf(stderr, "\n%s: the collective's launch did not go through\n", tag);
  holder_release(&holder);
  char out[4096];
  CU_ASSERT_EQUAL(finish(&rep, out, sizeof out), 0);
  char *e = slurp(rep.err);
  CU_ASSERT_EQUAL(field(e, "NCCL graphs instantiated"), nccl_execs);
  free(e);
  holder_end(&holder);
  wl_sched_group_remove(group);
}

static void test_nccl_static_drv(void) {
  char *argv[] = {WL_REPLICA, "2", "2", "1", "nccl-static", NULL};
  static_nccl_case("ncclsd", argv, "nccl-launch done", 0);
}

/* ---- CUDA graphs holding NCCL work -----------------------------------------------------------*/

/* A graph that wl-ip-replica's graph `mode` captured at start-up is launched as the first
 * iteration begins, while another member holds the token with no gate timeout. nccl: every
 * graph holds NCCL work, and its launches go through at once, before the holder releases.
 * Otherwise the replica must wait at the graph's launch itself: it is seen waiting for the
 * token before it printed "graph-launch done" (a launch that went through would have printed
 * that line first, and waited at the next allocation). The trace sees every graph launch either
 * way; nccl_execs: how many executable graphs the interposer counts as NCCL's at instantiation,
 * nccl_updates: how many updates left an executable graph marked. */
static void graph_case(const char *mode, int nccl, unsigned long long nccl_execs,
                       unsigned long long nccl_updates) {
  char group[64], envg[96], envt[600], trace[512];
  snprintf(group, sizeof group, "wltest-ip-%s-%d", mode, (int)getpid());
  snprintf(envg, sizeof envg, "WAVELET_GROUP=%s", group);
  snprintf(trace, sizeof trace, "%s/%s.wlt", tmpdir, mode);
  snprintf(envt, sizeof envt, "WAVELET_TRACE=%s", trace);
  proc_t holder, rep;
  const char *hextra[] = {envg, "WAVELET_GATE_TIMEOUT_MS=0", NULL};
  holder_start(&holder, NULL, hextra);
  char line[128];
  const char *rextra[] = {
      envg, envt, "WAVELET_MODE=gate", "WAVELET_GATE_TIMEOUT_MS=0", "WAVELET_SHOW_STATS=1", NULL};
  char *rargv[] = {WL_REPLICA, "2", "2", "1", (char *)mode, NULL};
  char preload[1024];
  snprintf(preload, sizeof preload, "%s %s", WL_LIBWAVELET, WL_NCCL_LIB);
  CU_ASSERT_EQUAL_FATAL(spawn(&rep, rargv, rextra, preload), 0);
  unsigned long long exec[8];
  int nexec = 0, reuse_exec = -1;
  while (read_line(&rep, line, sizeof line) && strcmp(line, "graph-launch begin")) {
    char *sp = strncmp(line, "graph-exec ", 11) ? NULL : strchr(line + 11, ' ');
    if (sp && nexec < 8) exec[nexec++] = strtoull(sp + 1, NULL, 10);
    sscanf(line, "reuse graph %*d exec %d", &reuse_exec);
  }
  CU_ASSERT_STRING_EQUAL(line, "graph-launch begin");
  CU_ASSERT_TRUE(nexec >= 1);
  if (nccl) {
    int through = wait_line(&rep, "graph-launch done", 15000);
    CU_ASSERT_TRUE(through);
    if (!through) fprintf(stderr, "\n%s: the graph's launch did not go through\n", mode);
  } else {
    CU_ASSERT_EQUAL(write(holder.in, "wait\n", 5), 5);
    CU_ASSERT_TRUE(read_line(&holder, line, sizeof line));
    CU_ASSERT_STRING_EQUAL(line, "waiter");
    int early = wait_line(&rep, "graph-launch done", 0); /* what it printed before waiting */
    CU_ASSERT_FALSE(early);
    if (early) fprintf(stderr, "\n%s: the graph's launch was not gated\n", mode);
  }
  unsigned long long released = holder_release(&holder);
  char out[4096];
  CU_ASSERT_EQUAL(finish(&rep, out, sizeof out), 0);
  CU_ASSERT_PTR_NOT_NULL(strstr(out, "done 2"));
  holder_end(&holder);
  wl_trace_reader_t *r = NULL;
  CU_ASSERT_EQUAL_FATAL(wl_trace_open(&r, trace, WL_TRACE_OPEN_SALVAGE), 0);
  wl_trace_event_t ev[256];
  long n;
  unsigned long long first_grant = 0, first_launch[8] = {0}, launches[8] = {0};
  while ((n = wl_trace_read(r, ev, 256)) > 0)
    for (long i = 0; i < n; i++) {
      if (ev[i].kind == WL_TRACE_GATE_GRANT && !first_grant) first_grant = ev[i].time_ns;
      for (int k = 0; k < nexec; k++)
        if (ev[i].kind == WL_TRACE_LAUNCH && ev[i].addr == exec[k]) {
          if (!launches[k]++) first_launch[k] = ev[i].time_ns;
        }
    }
  wl_trace_reader_close(r);
  CU_ASSERT_TRUE(first_grant >= released);
  for (int k = 0; k < nexec; k++) {
    CU_ASSERT_EQUAL(launches[k], 2); /* one a iteration */
    if (nccl) CU_ASSERT_TRUE(first_launch[k] > 0 && first_launch[k] < released);
  }
  char *e = slurp(rep.err);
  CU_ASSERT_EQUAL(field(e, "NCCL graphs instantiated"), nccl_execs);
  CU_ASSERT_EQUAL(field(e, "NCCL graph updates"), nccl_updates);
  if (nccl) CU_ASSERT_TRUE(field(e, "gate skipped in NCCL") >= (unsigned long long)nexec);
  /* An inspection that failed says so, once; none other fails. */
  if (strstr(mode, "-fail")) {
    const char *w = strstr(e, "could not inspect a CUDA graph");
    CU_ASSERT_PTR_NOT_NULL(w);
    if (w) CU_ASSERT_PTR_NULL(strstr(w + 1, "could not inspect a CUDA graph"));
  } else {
    CU_ASSERT_PTR_NULL(strstr(e, "could not inspect a CUDA graph"));
  }
  if (field(e, "NCCL graphs instantiated") != nccl_execs ||
      field(e, "NCCL graph updates") != nccl_updates)
    fprintf(stderr, "\n%s:\n%s", mode, e);
  free(e);
  if (!strcmp(mode, "graph-reuse")) CU_ASSERT_EQUAL(reuse_exec, 1); /* the old handle came back */
  wl_sched_group_remove(group);
}

/* The kernel named as NCCL's, captured between two others; the graph instantiated through each
 * of the five entry points, each launched. */
static void test_graph_nccl_static(void) {
  graph_case("graph-nccl-static", 1, 5, 0);
}

/* The kernel ncclAllReduce launches (not named as NCCL's), captured inside its region. */
static void test_graph_nccl_region(void) {
  graph_case("graph-nccl", 1, 1, 0);
}

/* The same conditions, a graph without NCCL work: gated, so the cases above can fail. */
static void test_graph_plain(void) {
  graph_case("graph", 0, 0, 0);
}

/* An NCCL graph and its executable destroyed, then a plain graph made with the same handles:
 * gated (the marks went with the destroyed handles). */
static void test_graph_reuse(void) {
  graph_case("graph-reuse", 0, 1, 0);
}

/* Graphs not made by capture are inspected at instantiation: built node by node around the
 * kernel named as NCCL's, */
static void test_graph_nodes(void) {
  graph_case("graph-nodes", 1, 1, 0);
}

/* An inspection that fails (the driver refuses cuGraphGetNodes) leaves the graph gated as one
 * launch, as before, with one line; the program goes on. */
static void test_graph_nodes_fail(void) {
  graph_case("graph-nodes-fail", 0, 0, 0);
}

/* that kernel (a CUkernel) in a child graph node, */
static void test_graph_child(void) {
  graph_case("graph-child", 1, 1, 0);
}

/* or a clone of a captured NCCL graph (the clone is a new graph the capture never marked). */
static void test_graph_clone(void) {
  graph_case("graph-clone", 1, 1, 0);
}

/* An executable graph of forward kernels updated from a graph with the NCCL kernel: never gated
 * after, */
static void test_graph_update(void) {
  graph_case("graph-update", 1, 0, 1);
}

/* one with NCCL work updated to forward kernels only: gated again, */
static void test_graph_update_plain(void) {
  graph_case("graph-update-plain", 0, 1, 0);
}

/* and one whose kernel node is set to the NCCL kernel: never gated. */
static void test_graph_set_params(void) {
  graph_case("graph-set-params", 1, 0, 1);
}

/* The same by the generic cuGraphExecNodeSetParams (12.2), */
static void test_graph_node_params(void) {
  graph_case("graph-node-params", 1, 0, 1);
}

/* and a child graph node set to a graph holding the NCCL kernel: never gated. */
static void test_graph_child_params(void) {
  graph_case("graph-child-params", 1, 0, 1);
}

/* A graph built with the generic cuGraphAddNode is inspected like the others, */
static void test_graph_add_node(void) {
  graph_case("graph-add-node", 1, 1, 0);
}

/* and so is a conditional node's body graph (known from cuGraphAddNode, which hands it out): the
 * NCCL kernel in it is never gated; */
static void test_graph_cond(void) {
  graph_case("graph-cond", 1, 1, 0);
}

/* a forward kernel in it is gated, and its inspection did not fail. */
static void test_graph_cond_plain(void) {
  graph_case("graph-cond-plain", 0, 0, 0);
}

/* Exit while four threads keep allocating, launching and freeing through the hooks (trace,
 * alloc and gate modes, many times): never a crash or a hang, and the trace is complete. */
static void test_exit_race(void) {
  static const char *const modes[] = {"trace", "alloc", "gate"};
  char group[96], envg[128], trace[512], envt[600];
  snprintf(group, sizeof group, "wltest-ip-exit-%d", (int)getpid());
  snprintf(envg, sizeof envg, "WAVELET_GROUP=%s", group);
  snprintf(trace, sizeof trace, "%s/exit.wlt", tmpdir);
  snprintf(envt, sizeof envt, "WAVELET_TRACE=%s", trace);
  int bad = 0, incomplete = 0;
  for (int m = 0; m < 3; m++) {
    char envm[64];
    snprintf(envm, sizeof envm, "WAVELET_MODE=%s", modes[m]);
    for (int i = 0; i < 12; i++) {
      const char *extra[] = {envg, envt, envm, NULL};
      char *argv[] = {WL_PROBE, "exit-race", "0", NULL};
      char out[256], err[512];
      int rc = run(argv, extra, WL_LIBWAVELET, out, sizeof out, err, sizeof err);
      if (rc != 0) {
        bad++;
        char *e = slurp(err);
        fprintf(stderr, "\nexit race (%s, run %d): status %d\n%s%s", modes[m], i, rc, out, e);
        free(e);
      }
      tstats_t t;
      int trc = trace_stats(trace, &t);
      if (trc || !t.complete) {
        incomplete++;
        char *e = slurp(err);
        fprintf(stderr, "\nexit race (%s, run %d): trace %d, complete %d, %llu events\n%s",
                modes[m], i, trc, t.complete, t.events, e);
        free(e);
      }
    }
  }
  CU_ASSERT_EQUAL(bad, 0);
  CU_ASSERT_EQUAL(incomplete, 0);
  wl_sched_group_remove(group);
}

/* Runs argv without the preload (its output into plain), then under it in trace, alloc and
 * gate modes, each traced to <tmpdir>/<tag>-<mode>.wlt: every run exits 0 and prints exactly
 * the plain run's output; check (when given) looks at each mode's trace. */
static void same_in_every_mode(char *const argv[], const char *tag, char *plain, size_t cap,
                               void (*check)(const char *trace)) {
  static char out[4096];
  char err[512];
  CU_ASSERT_EQUAL(run(argv, NULL, NULL, plain, cap, err, sizeof err), 0);
  static const char *const modes[] = {"trace", "alloc", "gate"};
  for (int m = 0; m < 3; m++) {
    char trace[512], env_trace[600], env_mode[64];
    snprintf(trace, sizeof trace, "%s/%s-%s.wlt", tmpdir, tag, modes[m]);
    snprintf(env_trace, sizeof env_trace, "WAVELET_TRACE=%s", trace);
    snprintf(env_mode, sizeof env_mode, "WAVELET_MODE=%s", modes[m]);
    const char *extra[] = {env_mode, env_trace, NULL};
    CU_ASSERT_EQUAL(run(argv, extra, WL_LIBWAVELET, out, sizeof out, err, sizeof err), 0);
    CU_ASSERT_STRING_EQUAL(out, plain);
    if (check) check(trace);
  }
}

static void reload_trace(const char *trace) {
  tstats_t t;
  CU_ASSERT_EQUAL(trace_stats(trace, &t), 0);
  CU_ASSERT(t.complete);
  CU_ASSERT_EQUAL(t.allocs, 2);
  CU_ASSERT_EQUAL(t.frees, 2);
  CU_ASSERT_EQUAL(t.alloc_bytes, t.free_bytes);
}

/* The runtime loaded with dlopen, closed and loaded again where the first copy was kept from
 * landing: the hooks must not call into the unloaded copy (trace mode crashed before), the
 * program's output is the same as without the preload, and the trace holds both rounds. */
static void test_reload(void) {
  char *argv[] = {WL_RELOAD, NULL};
  static char plain[4096];
  same_in_every_mode(argv, "reload", plain, sizeof plain, reload_trace);
  CU_ASSERT_PTR_NOT_NULL(strstr(plain, "reload ok"));
}

/* The size of path's TLS block (its PT_TLS segment's p_memsz; 0 without one), or -1 when it is
 * not a readable 64-bit ELF file. */
static long elf_tls_size(const char *path) {
  long size = -1;
  FILE *f = fopen(path, "rb");
  Elf64_Ehdr eh;
  if (!f) return -1;
  if (fread(&eh, sizeof eh, 1, f) == 1 && memcmp(eh.e_ident, ELFMAG, SELFMAG) == 0 &&
      eh.e_ident[EI_CLASS] == ELFCLASS64 && eh.e_phentsize == sizeof(Elf64_Phdr)) {
    size = 0;
    for (unsigned i = 0; i < eh.e_phnum; i++) {
      Elf64_Phdr ph;
      if (fseek(f, (long)(eh.e_phoff + (Elf64_Off)i * sizeof ph), SEEK_SET) != 0 ||
          fread(&ph, sizeof ph, 1, f) != 1) {
        size = -1;
        break;
      }
      if (ph.p_type == PT_TLS) size = (long)ph.p_memsz;
    }
  }
  fclose(f);
  return size;
}

/* libwavelet.so loaded with dlopen (RTLD_LOCAL, after the driver) instead of preloaded: its
 * exports answer as the driver does in every mode (they found the driver's own exports as "our
 * wrappers" and failed every call before), and after the program's dlclose the library stays
 * mapped under its threads and the entry points it handed out (it was unmapped before). glibc
 * keeps about 1.6 KiB of static TLS for libraries dlopen'ed with initial-exec TLS: with jemalloc
 * in its own library (WL_JEMALLOC_DYNAMIC, deps/jemalloc) ours is ~250 bytes and the dlopen
 * needs nothing; with Debian's static jemalloc linked in (the fallback) its 2.6 KiB need glibc's
 * optional static TLS raised. */
static void test_dlopen(void) {
  static const char *const modes[] = {"off", "trace", "alloc", "gate"};
#ifdef WL_JEMALLOC_DYNAMIC
  /* Well inside the surplus: a change that brings jemalloc's TLS back in fails here first. */
  long tls = elf_tls_size(WL_LIBWAVELET);
  CU_ASSERT(tls >= 0 && tls < 1024);
  if (tls < 0 || tls >= 1024) fprintf(stderr, "libwavelet.so's TLS block: %ld bytes\n", tls);
#define WL_DLOPEN_TUNABLE NULL
#else
#define WL_DLOPEN_TUNABLE "GLIBC_TUNABLES=glibc.rtld.optional_static_tls=16384"
#endif
  char first[1024] = "";
  for (int m = 0; m < 4; m++) {
    char trace[512], env_trace[600], env_mode[64], group[96], out[1024], err[512];
    snprintf(trace, sizeof trace, "%s/dlopen-%s.wlt", tmpdir, modes[m]);
    snprintf(env_trace, sizeof env_trace, "WAVELET_TRACE=%s", trace);
    snprintf(env_mode, sizeof env_mode, "WAVELET_MODE=%s", modes[m]);
    snprintf(group, sizeof group, "WAVELET_GROUP=wltest-dlopen-%d", (int)getpid());
    const char *extra[] = {env_mode,          env_trace, group, "WAVELET_SHOW_STATS=1",
                           WL_DLOPEN_TUNABLE, NULL};
    char *argv[] = {WL_DLOPEN, WL_LIBWAVELET, NULL};
    int rc = run(argv, extra, NULL, out, sizeof out, err, sizeof err);
    CU_ASSERT_EQUAL(rc, 0);
    if (rc) fprintf(stderr, "wl-ip-dlopen in mode %s: %d\n%s", modes[m], rc, out);
    CU_ASSERT_PTR_NOT_NULL(strstr(out, "first alloc 0 free 0 async 0 free-async 0\n"));
    /* Memory the driver gave before the library was loaded: its free passes through, is counted
     * as a free of a pointer never seen, and leaves the accounting and the trace as they were. */
    CU_ASSERT_PTR_NOT_NULL(strstr(out, "early free 0\n"));
    if (m > 0) {
      char *e = slurp(err);
      CU_ASSERT_EQUAL(field(e, "frees of unknown pointers"), 1);
      free(e);
    }
    CU_ASSERT_PTR_NOT_NULL(strstr(out, "stays loaded yes\n"));
    CU_ASSERT_PTR_NOT_NULL(strstr(out, "after dlclose alloc 0 free 0 async 0 free-async 0\n"));
    CU_ASSERT_PTR_NOT_NULL(strstr(out, "dlopen ok\n"));
    if (m == 0)
      snprintf(first, sizeof first, "%s", out);
    else
      CU_ASSERT_STRING_EQUAL(out, first);
    if (m == 1) { /* trace mode: both rounds accounted, the trace finished at exit */
      tstats_t t;
      CU_ASSERT_EQUAL(trace_stats(trace, &t), 0);
      CU_ASSERT(t.complete);
      CU_ASSERT_EQUAL(t.allocs, 4);
      CU_ASSERT_EQUAL(t.frees, 4);
      CU_ASSERT_EQUAL(t.alloc_bytes, 6ull << 20);
      CU_ASSERT_EQUAL(t.free_bytes, 6ull << 20);
    }
  }
}

static void pyext_trace(const char *trace) {
  tstats_t t;
  CU_ASSERT_EQUAL(trace_stats(trace, &t), 0);
  CU_ASSERT(t.complete);
  CU_ASSERT_EQUAL(t.allocs, 15); /* 3 steps: 1 cudaMalloc and 4 cudaMallocAsync */
  CU_ASSERT_EQUAL(t.frees, 15);
  CU_ASSERT_EQUAL(t.alloc_bytes, 3 * (1 + 1 + 2 + 3 + 4) * (1ull << 20));
  CU_ASSERT_EQUAL(t.free_bytes, t.alloc_bytes);
}

/* PyTorch's shape: the runtime is a dependency of an extension the host loads RTLD_LOCAL, so it
 * is in no global scope (RTLD_NEXT from the preload does not find it), and backward frees on
 * another thread. Same output in every mode, every allocation and free in the trace. */
static void test_python_extension(void) {
  char *argv[] = {WL_PYHOST, WL_PYEXT, "3", NULL};
  static char plain[1024];
  same_in_every_mode(argv, "pyext", plain, sizeof plain, pyext_trace);
  CU_ASSERT_PTR_NOT_NULL(strstr(plain, "step 2 ok\npyhost done 0\n"));
}

/* A signal the program blocks everywhere waits for the thread that unblocks it: our helper
 * threads (trace flusher, liballoc's trim thread, the gate's helper) start with every signal
 * blocked, so none of them takes it in between (each did before, in its mode). */
static void test_signals(void) {
  char *argv[] = {WL_PROBE, "signals", NULL};
  static char plain[1024];
  same_in_every_mode(argv, "signals", plain, sizeof plain, NULL);
  CU_ASSERT_PTR_NOT_NULL(strstr(plain, "handled while blocked no, on the unblocking thread yes"));
}

/* An allocation that must wait for the group's memory: another member holds all but 16 MiB of
 * a 1 GiB budget until 300 ms after the served 64 MiB allocation is seen waiting (the holder
 * watches the group: under gVisor the probe once took over 100 ms to start, and a fixed 300 ms
 * from its spawn left it less than the 200 ms checked); it then completes, and the wait is in
 * the stats and in the trace (BUDGET_WAIT: what wavelet-bench reports as the memory wait of
 * replicas under the preload). */
static void test_budget_wait(void) {
  char group[96], envg[128], trace[512], envt[600], held[64];
  snprintf(group, sizeof group, "wltest-bwait-%d", (int)getpid());
  snprintf(envg, sizeof envg, "WAVELET_GROUP=%s", group);
  snprintf(trace, sizeof trace, "%s/budget-wait.wlt", tmpdir);
  snprintf(envt, sizeof envt, "WAVELET_TRACE=%s", trace);
  snprintf(held, sizeof held, "%llu", (1ull << 30) - (16ull << 20));
  proc_t holder, probe;
  const char *hextra[] = {envg, "WAVELET_MEM_LIMIT=1G", NULL};
  char *hargv[] = {WL_HOLDER, "mem", held, NULL};
  holder_start(&holder, hargv, hextra);
  const char *pextra[] = {envg,
                          envt,
                          "WAVELET_MODE=alloc",
                          "WAVELET_MEM_LIMIT=1G",
                          "WAVELET_ALLOC_TIMEOUT_MS=20000",
                          "WAVELET_SHOW_STATS=1",
                          NULL};
  char *pargv[] = {WL_PROBE, "meminfo", NULL};
  CU_ASSERT_EQUAL_FATAL(spawn(&probe, pargv, pextra, WL_LIBWAVELET), 0);
  char line[64];
  CU_ASSERT_EQUAL(write(holder.in, "wait\n", 5), 5);
  CU_ASSERT_TRUE(read_line(&holder, line, sizeof line));
  CU_ASSERT_STRING_EQUAL(line, "waiter");
  usleep(300000);
  holder_release(&holder);
  char out[4096];
  CU_ASSERT_EQUAL(finish(&probe, out, sizeof out), 0);
  holder_end(&holder);
  char *e = slurp(probe.err);
  unsigned long long waits = field(e, "memory budget waits"),
                     wait_ns = field(e, "memory budget wait (ns)");
  CU_ASSERT(waits >= 1 && waits != ~0ull);
  CU_ASSERT(wait_ns >= 200000000ull && wait_ns != ~0ull);
  free(e);
  wl_trace_summary_t su;
  trace_summary(trace, &su);
  CU_ASSERT_EQUAL(su.budget_waits, waits);
  CU_ASSERT_EQUAL(su.budget_wait_ns, wait_ns);
  wl_sched_group_remove(group);
}

/* A process that exits normally leaves the group's ledger as it found it at once (its credit
 * given back at exit), not only when the next member reclaims the dead slot. The member's booking
 * is seen first, while it holds 64 MiB, so that the ledger coming back to 0 is its exit's doing. */
static void test_exit_leaves_group(void) {
  char group[96], envg[128];
  snprintf(group, sizeof group, "wltest-ip-leave-%d", (int)getpid());
  snprintf(envg, sizeof envg, "WAVELET_GROUP=%s", group);
  wl_sched_config_t cfg;
  wl_sched_config_default(&cfg);
  cfg.group = group;
  cfg.flags |= WL_SCHED_MANUAL_GATE;
  wl_sched_t *s = NULL;
  CU_ASSERT_EQUAL_FATAL(wl_sched_join(&s, &cfg), 0);
  /* hold allocates 64 MiB and waits for a line; freed, liballoc keeps the chunk mapped (and
   * booked) until exit */
  char *argv[] = {WL_PROBE, "hold", "64", NULL};
  const char *extra[] = {envg, "WAVELET_MODE=alloc", "WAVELET_MEM_LIMIT=1G", NULL};
  proc_t p;
  CU_ASSERT_EQUAL_FATAL(spawn(&p, argv, extra, WL_LIBWAVELET), 0);
  char line[128];
  CU_ASSERT_TRUE(read_line(&p, line, sizeof line));
  CU_ASSERT_STRING_EQUAL(line, "hold: 64 MiB 0");
  wl_sched_stats_t st;
  wl_sched_stats_get(s, &st);
  CU_ASSERT_TRUE(st.used >= (64u << 20)); /* the member's booking, in the group's ledger */
  CU_ASSERT_EQUAL(st.members, 2);
  CU_ASSERT_EQUAL(write(p.in, "\n", 1), 1);
  char out[1024];
  CU_ASSERT_EQUAL(finish(&p, out, sizeof out), 0);
  wl_sched_stats_get(s, &st);
  CU_ASSERT_EQUAL(st.used, 0);
  if (st.used) fprintf(stderr, "\ngroup used %zu bytes after the member exited\n", st.used);
  wl_sched_leave(s);
  wl_sched_group_remove(group);
}

/* wl-ip-probe <what> prints only the driver's answers: the same output without the preload and
 * in off, trace, alloc and gate modes, never a crash. */
static void driver_answers(const char *what) {
  char *argv[] = {WL_PROBE, (char *)what, NULL};
  static char plain[16384], out[16384];
  char done[64];
  snprintf(done, sizeof done, "%s: done", what);
  CU_ASSERT_EQUAL_FATAL(run(argv, NULL, NULL, plain, sizeof plain, NULL, 0), 0);
  CU_ASSERT_PTR_NOT_NULL(strstr(plain, done));
  char group[96];
  snprintf(group, sizeof group, "WAVELET_GROUP=wltest-ip-odd-%d", (int)getpid());
  for (int m = 0; m < 4; m++) {
    run_mode_same(argv, m, group, NULL, plain, out, sizeof out, NULL, 0);
  }
  wl_sched_group_remove(group + strlen("WAVELET_GROUP="));
}

/* Odd but legal use: before cuInit, NULL outputs, frees of what is not an allocation, double
 * and interior frees. */
static void test_odd_calls(void) {
  driver_answers("odd");
}

/* Served memory met by unusual calls: host frees of device memory (which freed a served block
 * while the driver refused), stream-ordered calls on invalid and destroyed streams (served, or
 * freed with success, where the driver refuses), classic and stream-ordered frees of each
 * other's memory, pinned flags, the default streams. */
static void test_edge_calls(void) {
  driver_answers("edge");
}

/* The runtime's last error after served calls that fail (out of memory, invalid frees) is the
 * real call's, and a served call that succeeds leaves an earlier error in place. */
static void test_last_error(void) {
  driver_answers("last-error");
}

/* Counts the lines of a file holding needle. */
static int count_lines(const char *path, const char *needle) {
  char *e = slurp(path);
  int n = 0;
  for (const char *p = e; (p = strstr(p, needle)); p += strlen(needle)) n++;
  free(e);
  return n;
}

/* Synchronous allocations and frees while stream captures are in progress (wl-ip-probe capture:
 * the thread's own capture not RELAXED, its own RELAXED one, another thread's GLOBAL or other
 * capture with this thread GLOBAL, THREAD_LOCAL or RELAXED, PyTorch's RELAXED cudaMalloc in a
 * GLOBAL capture; through the driver and the runtime): the driver's answers and the captures it
 * invalidated (its misuse lines) are the same without the preload and in every mode, and in
 * alloc and gate modes every allocation that succeeded was served and every free freed to
 * liballoc. (Before, served where the driver refuses: 76 lines differed in alloc and gate modes,
 * tried.) */
static void test_capture_modes(void) {
  char *argv[] = {WL_PROBE, "capture", NULL};
  static char plain[32768], out[32768];
  char err[512];
  CU_ASSERT_EQUAL_FATAL(run(argv, NULL, NULL, plain, sizeof plain, err, sizeof err), 0);
  CU_ASSERT_PTR_NOT_NULL_FATAL(strstr(plain, "capture: done"));
  int misuse = count_lines(err, "wltest-cuda: misuse:");
  CU_ASSERT(misuse > 0);
  unsigned long long allocs = field(plain, "succeeded: allocations "),
                     frees = field(plain, " frees ");
  char group[96];
  snprintf(group, sizeof group, "WAVELET_GROUP=wltest-ip-capture-%d", (int)getpid());
  const char *stats[] = {"WAVELET_SHOW_STATS=1", NULL};
  for (int m = 0; m < 4; m++) {
    run_mode_same(argv, m, group, stats, plain, out, sizeof out, err, sizeof err);
    CU_ASSERT_EQUAL(count_lines(err, "wltest-cuda: misuse:"), misuse);
    if (m >= 2) {
      char *e = slurp(err);
      CU_ASSERT_EQUAL(field(e, "served by liballoc"), allocs);
      CU_ASSERT_EQUAL(field(e, "freed to liballoc"), frees);
      free(e);
    }
  }
  wl_sched_group_remove(group + strlen("WAVELET_GROUP="));
}

/* CUDA IPC across processes (wl-ip-probe ipc starts itself as the opener): the same output in
 * every mode, where alloc and gate modes serve the memory (a VMM mapping, for which the driver
 * has no IPC handle) and make the handles themselves; before, cuIpcGetMemHandle failed there.
 * The child first opens a handle in a context of its own, which its cuCtxDestroy closes (a later
 * close is refused), then both under the primary context. The child's stats come first in the
 * shared stderr (it ends first): three opens; the parent's: two exports. A driver that will not
 * make memory shareable (the double's WLTEST_NO_POSIX_FD): the driver's answer for a mapping, and
 * one line saying why. */
static void test_ipc_of_served_memory(void) {
  char *argv[] = {WL_PROBE, "ipc", NULL};
  char plain[2048], out[2048], err[512];
  CU_ASSERT_EQUAL_FATAL(run(argv, NULL, NULL, plain, sizeof plain, NULL, 0), 0);
  CU_ASSERT_PTR_NOT_NULL(strstr(plain, "parent: handle 1 0\n"));
  CU_ASSERT_PTR_NOT_NULL(strstr(plain, "child: open big again 0, same address 1\n"));
  CU_ASSERT_PTR_NOT_NULL(strstr(plain, "child: closed by the destroy 1\n"));
  CU_ASSERT_PTR_NOT_NULL(strstr(plain, "parent: bytes 1 now 0x61 0x61 0x61\n"));
  CU_ASSERT_PTR_NOT_NULL(strstr(plain, "parent: child exit 0\n"));
  char group[96];
  snprintf(group, sizeof group, "WAVELET_GROUP=wltest-ip-ipc-%d", (int)getpid());
  const char *stats[] = {"WAVELET_SHOW_STATS=1", NULL};
  for (int m = 0; m < 4; m++) {
    run_mode_same(argv, m, group, stats, plain, out, sizeof out, err, sizeof err);
    char *e = slurp(err);
    const char *child = strstr(e, "CUDA IPC exports");
    const char *parent = child ? strstr(child + 1, "CUDA IPC exports") : NULL;
    if (m >= 2) {
      CU_ASSERT_EQUAL(child ? field(child, "CUDA IPC opens") : 0, 3);
      CU_ASSERT_EQUAL(parent ? field(parent, "CUDA IPC exports") : 0, 2);
    }
    CU_ASSERT_PTR_NULL(strstr(e, "cannot be shared here"));
    free(e);
  }
  const char *no_fd[] = {"WLTEST_NO_POSIX_FD=1", NULL};
  CU_ASSERT_EQUAL(run_mode(argv, 2, group, no_fd, out, sizeof out, err, sizeof err), 0);
  CU_ASSERT_PTR_NOT_NULL(strstr(out, "parent: handle 1 1\n")); /* CUDA_ERROR_INVALID_VALUE */
  char *e = slurp(err);
  CU_ASSERT_PTR_NOT_NULL(strstr(e, "cannot be shared here"));
  free(e);
  wl_sched_group_remove(group + strlen("WAVELET_GROUP="));
}

/* Every group this run made: their names end in its pid, or in its pid and a suffix (-N for a
 * replica, a dot and more for a further device). Tests leave theirs when an assertion fails
 * midway; /dev/shm is the machine's memory. */
static void remove_groups_of_run(void) {
  char mark[32];
  int n = snprintf(mark, sizeof mark, "-%d", (int)getpid());
  DIR *dir = opendir("/dev/shm");
  if (!dir) return;
  for (struct dirent *de; (de = readdir(dir)) != NULL;) {
    if (strncmp(de->d_name, "wavelet-wltest-", strlen("wavelet-wltest-"))) continue;
    for (const char *p = strstr(de->d_name, mark); p; p = strstr(p + 1, mark))
      if (p[n] == 0 || p[n] == '-' || p[n] == '.') {
        wl_sched_group_remove(de->d_name + strlen("wavelet-"));
        break;
      }
  }
  closedir(dir);
}

/* Occurrences of what in s. */
static int count_of(const char *s, const char *what) {
  int n = 0;
  for (const char *p = s; p && (p = strstr(p, what)) != NULL; p += strlen(what)) n++;
  return n;
}

/* A device reset with allocations of every kind live (wl-ip-probe reset: the driver's
 * cuDevicePrimaryCtxReset_v2, then the runtime's cudaDeviceReset): the same output in every
 * mode (the stream-ordered allocation survives with its contents and is freed afterwards, the
 * synchronous ones are gone), the trace accounts every allocation freed (by the reset or by the
 * program), the stats count two resets and nothing live on the device or pinned at exit, and
 * the double saw no misuse beyond the program's own free of a pointer from before the reset
 * (served, that one is refused by liballoc instead). Before, liballoc's events and the pinned
 * arena's chunks outlived the reset (destroyed later as dead handles, carved from unmapped
 * pages), and the program's synchronous blocks stayed allocated and booked. */
static void test_device_reset(void) {
  char *argv[] = {WL_PROBE, "reset", NULL};
  char plain[2048], out[2048], err[512], perr[512];
  CU_ASSERT_EQUAL_FATAL(run(argv, NULL, NULL, plain, sizeof plain, perr, sizeof perr), 0);
  CU_ASSERT_PTR_NOT_NULL(strstr(plain, "reset: cudaDeviceReset 0\n"));
  CU_ASSERT_PTR_NOT_NULL(strstr(plain, "reset: cudaMalloc after 0\n"));
  CU_ASSERT_PTR_NOT_NULL(strstr(plain, "after the driver's reset: stream-ordered kept 1\n"));
  CU_ASSERT_PTR_NOT_NULL(strstr(plain, "after the runtime's reset: its free 0\n"));
  CU_ASSERT_PTR_NOT_NULL(strstr(plain, "reset: done\n"));
  char *pe = slurp(perr);
  int misuse = count_of(pe, "wltest-cuda");
  CU_ASSERT_EQUAL(misuse, 1);
  free(pe);
  char group[96], trace[512], env_trace[600];
  snprintf(group, sizeof group, "WAVELET_GROUP=wltest-ip-reset-%d", (int)getpid());
  for (int m = 1; m < 4; m++) {
    snprintf(trace, sizeof trace, "%s/reset-%s.wlt", tmpdir, all_modes[m]);
    snprintf(env_trace, sizeof env_trace, "WAVELET_TRACE=%s", trace);
    const char *more[] = {"WAVELET_SHOW_STATS=1", env_trace, NULL};
    run_mode_same(argv, m, group, more, plain, out, sizeof out, err, sizeof err);
    tstats_t t;
    CU_ASSERT_EQUAL(trace_stats(trace, &t), 0);
    CU_ASSERT(t.complete);
    CU_ASSERT_EQUAL(t.allocs, 10); /* 4 a round, 2 rounds, 2 by the runtime */
    CU_ASSERT_EQUAL(t.frees, 10);
    CU_ASSERT_EQUAL(t.alloc_bytes, t.free_bytes);
    char *e = slurp(err);
    CU_ASSERT_EQUAL(field(e, "device resets"), 2);
    const char *live = strstr(e, "live bytes by kind");
    CU_ASSERT_PTR_NOT_NULL(live);
    if (live) {
      CU_ASSERT_EQUAL(field(live, "device"), 0);
      CU_ASSERT_EQUAL(field(live, "async"), 0);
      CU_ASSERT_EQUAL(field(live, "pinned"), 0);
      CU_ASSERT_EQUAL(field(live, "served"), 0);
    }
    CU_ASSERT(count_of(e, "wltest-cuda") <= misuse);
    if (count_of(e, "wltest-cuda") > misuse) fprintf(stderr, "mode %s:\n%s", all_modes[m], e);
    free(e);
  }
  wl_sched_group_remove(group + strlen("WAVELET_GROUP="));
}

/* A GLOBAL capture left in progress at a device reset ends with its stream (wl-ip-probe
 * reset-capture): the same output in every mode, and in alloc and gate modes the synchronous
 * allocations afterwards are served (before, the dead capture still counted and every one went
 * to the driver). */
static void served_three(const char *err) {
  CU_ASSERT_EQUAL(field(err, "served by liballoc"), 3);
}

static void test_reset_ends_captures(void) {
  char *argv[] = {WL_PROBE, "reset-capture", NULL};
  char plain[1024];
  CU_ASSERT_EQUAL_FATAL(run(argv, NULL, NULL, plain, sizeof plain, NULL, 0), 0);
  CU_ASSERT_PTR_NOT_NULL(strstr(plain, "reset-capture: reset 0\nreset-capture: alloc 0\n"));
  char group[96];
  snprintf(group, sizeof group, "WAVELET_GROUP=wltest-ip-rcap-%d", (int)getpid());
  const char *stats[] = {"WAVELET_SHOW_STATS=1", NULL};
  run_modes(argv, group, stats, plain, plain, served_three);
  wl_sched_group_remove(group + strlen("WAVELET_GROUP="));
}

/* Two devices (the driver double's WLTEST_DEVICE_COUNT=2; wl-ip-probe reset-multi): memory on
 * both, served by an allocator each in alloc and gate modes; a reset of device 1 leaves device
 * 0's memory alone (contents kept, freed as usual) and takes device 1's synchronous memory only.
 * The same output in every mode, the trace exact (4 allocations and 4 frees). */
static void test_reset_one_of_two_devices(void) {
  char *argv[] = {WL_PROBE, "reset-multi", NULL};
  char plain[1024], out[1024], err[512];
  const char *two[] = {"WLTEST_DEVICE_COUNT=2", NULL};
  CU_ASSERT_EQUAL_FATAL(run(argv, two, NULL, plain, sizeof plain, NULL, 0), 0);
  CU_ASSERT_PTR_NOT_NULL(strstr(plain, "reset-multi: device 1's memory on device 1\n"));
  CU_ASSERT_PTR_NOT_NULL(strstr(plain, "reset-multi: device 1's synchronous memory gone 1\n"));
  CU_ASSERT_PTR_NOT_NULL(strstr(plain, "reset-multi: device 1's stream-ordered memory kept 1\n"));
  CU_ASSERT_PTR_NOT_NULL(strstr(plain, "reset-multi: device 0 kept 1 1\n"));
  CU_ASSERT_PTR_NOT_NULL(strstr(plain, "reset-multi: done\n"));
  char group[96], trace[512], env_trace[600];
  snprintf(group, sizeof group, "WAVELET_GROUP=wltest-ip-rmulti-%d", (int)getpid());
  for (int m = 1; m < 4; m++) {
    snprintf(trace, sizeof trace, "%s/reset-multi-%s.wlt", tmpdir, all_modes[m]);
    snprintf(env_trace, sizeof env_trace, "WAVELET_TRACE=%s", trace);
    const char *more[] = {"WLTEST_DEVICE_COUNT=2", "WAVELET_SHOW_STATS=1", env_trace, NULL};
    run_mode_same(argv, m, group, more, plain, out, sizeof out, err, sizeof err);
    tstats_t t;
    CU_ASSERT_EQUAL(trace_stats(trace, &t), 0);
    CU_ASSERT_EQUAL(t.allocs, 4);
    CU_ASSERT_EQUAL(t.frees, 4);
    CU_ASSERT_EQUAL(t.alloc_bytes, t.free_bytes);
    char *e = slurp(err);
    if (m >= 2) CU_ASSERT_EQUAL(field(e, "served by liballoc"), 4);
    free(e);
  }
  wl_sched_group_remove_all(group + strlen("WAVELET_GROUP="));
}

/* Each device's memory in its own GPU's group (wl-ip-probe budget-multi, the driver double with
 * two devices, a budget of 1 GiB): plain, both 600 MiB allocations and the third succeed and
 * cuMemGetInfo answers the double's capacity; in alloc and gate modes both fit (one budget for the
 * process refused device 1's), the third is refused on device 1's budget, cuMemGetInfo answers
 * 1 GiB for each device with the 600 MiB taken, and two groups were joined: the configured name
 * for device 0, the name and a dot for device 1. */
static void test_budget_per_device(void) {
  char *argv[] = {WL_PROBE, "budget-multi", NULL};
  char plain[1024], out[1024], err[512];
  const char *two[] = {"WLTEST_DEVICE_COUNT=2", NULL};
  CU_ASSERT_EQUAL_FATAL(run(argv, two, NULL, plain, sizeof plain, NULL, 0), 0);
  CU_ASSERT_PTR_NOT_NULL(strstr(plain, "budget-multi: device 1 alloc 0\n"));
  CU_ASSERT_PTR_NULL(strstr(plain, "budget-multi: device 1 total 1024 MiB")); /* the double's */
  CU_ASSERT_PTR_NOT_NULL(strstr(plain, "budget-multi: device 1 more 0\n"));
  char group[96];
  snprintf(group, sizeof group, "WAVELET_GROUP=wltest-ip-bmulti-%d", (int)getpid());
  const char *more[] = {
      "WLTEST_DEVICE_COUNT=2", "WAVELET_MEM_LIMIT=1G", "WAVELET_ALLOC_TIMEOUT_MS=100",
      "WAVELET_SHOW_STATS=1",  "WAVELET_LOG=info",     NULL};
  for (int m = 2; m < 4; m++) {
    CU_ASSERT_EQUAL(run_mode(argv, m, group, more, out, sizeof out, err, sizeof err), 0);
    for (int d = 0; d < 2; d++) {
      char line[96];
      snprintf(line, sizeof line, "budget-multi: device %d alloc 0\n", d);
      CU_ASSERT_PTR_NOT_NULL(strstr(out, line));
      snprintf(line, sizeof line, "budget-multi: device %d total 1024 MiB, free ", d);
      const char *f = strstr(out, line);
      CU_ASSERT_PTR_NOT_NULL(f);
      if (f) CU_ASSERT(strtoul(f + strlen(line), NULL, 10) <= 1024 - 600);
    }
    CU_ASSERT_PTR_NOT_NULL(strstr(out, "budget-multi: device 1 more 2\n"));
    CU_ASSERT_PTR_NOT_NULL(strstr(out, "budget-multi: done\n"));
    char *e = slurp(err);
    char joined[160];
    snprintf(joined, sizeof joined, "device 0: joined group %s ", group + strlen("WAVELET_GROUP="));
    CU_ASSERT_PTR_NOT_NULL(strstr(e, joined));
    snprintf(joined, sizeof joined, "device 1: joined group %s.", group + strlen("WAVELET_GROUP="));
    CU_ASSERT_PTR_NOT_NULL(strstr(e, joined));
    if (!strstr(e, joined)) fprintf(stderr, "mode %s:\n%s", all_modes[m], e);
    free(e);
    wl_sched_group_remove_all(group + strlen("WAVELET_GROUP="));
  }
}

/* Synchronous allocations and frees beside stream-ordered memory (wl-ip-probe sync-order), in
 * the served modes: cuMemAlloc never returns a block freed on the legacy stream while that
 * stream's work is held, cuMemFree waits for the device as a real driver may, and no other
 * stream gets the freed block while a kernel on a non-blocking stream still runs. Before, a
 * served cuMemAlloc took the legacy stream's pending block at once, and the served cuMemFree
 * waited for nothing; nor did a served cuMemFreeHost, where the H200 waited for a copy from the
 * block. (Without serving the double answers "yes" to the first and last: its
 * memory is host pages, an address the kernel of a moment ago had may come back at once, and
 * that kernel's effects happened when it was enqueued.) */
static void test_sync_order(void) {
  char *argv[] = {WL_PROBE, "sync-order", NULL};
  char out[512], err[512];
  static const char *const want =
      "sync-order: cuMemAlloc got the block freed on the held legacy stream: no\n"
      "sync-order: the kernel was over when cuMemFree returned: yes\n"
      "sync-order: another stream got the block under the kernel: no\n"
      "sync-order: the copy was over when cuMemFreeHost returned: yes\n"
      "sync-order: done\n";
  char group[96];
  snprintf(group, sizeof group, "WAVELET_GROUP=wltest-ip-sorder-%d", (int)getpid());
  for (int m = 2; m < 4; m++) {
    CU_ASSERT_EQUAL(run_mode(argv, m, group, NULL, out, sizeof out, err, sizeof err), 0);
    CU_ASSERT_STRING_EQUAL(out, want);
  }
  wl_sched_group_remove_all(group + strlen("WAVELET_GROUP="));
}

/* A served block freed in stream order on another device's legacy stream (wl-ip-probe
 * free-other-device, two devices): never back on its own device while the kernel before the free
 * runs there. Before, the free was ordered on the block's device's legacy stream instead. (As
 * above, the double's own memory is not asked.) */
static void test_free_other_device(void) {
  char *argv[] = {WL_PROBE, "free-other-device", NULL};
  char out[512], err[512];
  const char *two[] = {"WLTEST_DEVICE_COUNT=2", NULL};
  static const char *const want =
      "free-other-device: device 0 got the block under device 1's kernel: no\n"
      "free-other-device: done\n";
  char group[96];
  snprintf(group, sizeof group, "WAVELET_GROUP=wltest-ip-fother-%d", (int)getpid());
  for (int m = 2; m < 4; m++) {
    CU_ASSERT_EQUAL(run_mode(argv, m, group, two, out, sizeof out, err, sizeof err), 0);
    CU_ASSERT_STRING_EQUAL(out, want);
  }
  wl_sched_group_remove_all(group + strlen("WAVELET_GROUP="));
}

/* A group is one GPU's, whichever device a process serves first (wl-ip-probe budget-multi, the
 * driver double with two devices, a budget of 1 GiB). Another member holds 600 MiB of the
 * group named WAVELET_GROUP on device 1's GPU (the double's UUID for device 1). The probe
 * serves device 0 first: the name is device 1's GPU's, so device 0's memory goes to the name
 * and a dot, where 600 MiB fit, and device 1's to the name, where the holder's 600 MiB leave no
 * room. Before, device 0 took the name (the holder's ledger refused it) and device 1 fit. */
static void test_group_is_one_gpus(void) {
  char group[96], envg[128];
  snprintf(group, sizeof group, "wltest-ip-gpu-%d", (int)getpid());
  snprintf(envg, sizeof envg, "WAVELET_GROUP=%s", group);
  const char *hextra[] = {envg, "WAVELET_MEM_LIMIT=1G", NULL};
  /* driver_core.c's uuid_of: "WLTEST-DOUBLE" and the ordinal */
  char *hargv[] = {WL_HOLDER, "mem", "629145600", "gpu", "GPU-574c544553542d444f55424c45000001",
                   NULL};
  char *argv[] = {WL_PROBE, "budget-multi", NULL};
  const char *more[] = {"WLTEST_DEVICE_COUNT=2", "WAVELET_MEM_LIMIT=1G",
                        "WAVELET_ALLOC_TIMEOUT_MS=100", "WAVELET_LOG=info", NULL};
  for (int m = 2; m < 4; m++) {
    proc_t holder;
    holder_start(&holder, hargv, hextra);
    char out[1024], err[512];
    CU_ASSERT_EQUAL(run_mode(argv, m, envg, more, out, sizeof out, err, sizeof err), 0);
    CU_ASSERT_PTR_NOT_NULL(strstr(out, "budget-multi: device 0 alloc 0\n"));
    CU_ASSERT_PTR_NOT_NULL(strstr(out, "budget-multi: device 1 alloc 2\n"));
    CU_ASSERT_PTR_NOT_NULL(strstr(out, "budget-multi: done\n"));
    char *e = slurp(err);
    char line[320];
    snprintf(line, sizeof line, "group %s is another GPU's; joining %s.", group, group);
    CU_ASSERT_PTR_NOT_NULL(strstr(e, line));
    snprintf(line, sizeof line, "device 0: joined group %s.", group);
    CU_ASSERT_PTR_NOT_NULL(strstr(e, line));
    snprintf(line, sizeof line, "device 1: joined group %s ", group);
    CU_ASSERT_PTR_NOT_NULL(strstr(e, line));
    if (!strstr(e, line)) fprintf(stderr, "mode %s:\n%s", all_modes[m], e);
    free(e);
    holder_release(&holder);
    holder_end(&holder);
    wl_sched_group_remove_all(group);
  }
}

/* The time of the trace's first event of kind, 0 when none. */
static unsigned long long first_in_trace(const char *trace, unsigned kind) {
  wl_trace_reader_t *r = NULL;
  if (wl_trace_open(&r, trace, WL_TRACE_OPEN_SALVAGE)) return 0;
  wl_trace_event_t ev[256];
  long n;
  unsigned long long t = 0;
  while (!t && (n = wl_trace_read(r, ev, 256)) > 0)
    for (long i = 0; i < n && !t; i++)
      if (ev[i].kind == kind) t = ev[i].time_ns;
  wl_trace_reader_close(r);
  return t;
}

/* A process on two GPUs takes the token of both GPUs' groups (wl-ip-replica two-devices, the
 * driver double's two devices). Another member holds the token of device 1's GPU's group, which
 * it stamped with that GPU, so the name is device 1's and device 0's group is the name and a dot.
 * The replica runs on device 0 and has joined device 1's group too: its first grant comes after
 * the holder's release. Before, it took device 0's token only and rose at once, beside a process
 * rising on device 1. */
static void test_gate_every_gpu(void) {
  char group[96], envg[128], trace[512], envt[600];
  snprintf(group, sizeof group, "wltest-ip-gate2-%d", (int)getpid());
  snprintf(envg, sizeof envg, "WAVELET_GROUP=%s", group);
  snprintf(trace, sizeof trace, "%s/gate-two.wlt", tmpdir);
  snprintf(envt, sizeof envt, "WAVELET_TRACE=%s", trace);
  proc_t holder, rep;
  const char *hextra[] = {envg, "WAVELET_GATE_TIMEOUT_MS=0", NULL};
  char *hargv[] = {WL_HOLDER, "token", "-", "gpu", "GPU-574c544553542d444f55424c45000001", NULL};
  holder_start(&holder, hargv, hextra);
  const char *rextra[] = {
      envg, envt, "WAVELET_MODE=gate", "WAVELET_GATE_TIMEOUT_MS=0", "WLTEST_DEVICE_COUNT=2", NULL};
  char *rargv[] = {WL_REPLICA, "2", "2", "1", "two-devices", NULL};
  CU_ASSERT_EQUAL_FATAL(spawn(&rep, rargv, rextra, WL_LIBWAVELET), 0);
  char line[64];
  CU_ASSERT_EQUAL(write(holder.in, "wait\n", 5), 5);
  CU_ASSERT_TRUE(read_line(&holder, line, sizeof line));
  CU_ASSERT_STRING_EQUAL(line, "waiter");
  unsigned long long released = holder_release(&holder);
  char out[4096];
  CU_ASSERT_EQUAL(finish(&rep, out, sizeof out), 0);
  CU_ASSERT_PTR_NOT_NULL(strstr(out, "done 2"));
  holder_end(&holder);
  unsigned long long first_grant = first_in_trace(trace, WL_TRACE_GATE_GRANT);
  CU_ASSERT_TRUE(first_grant >= released && released > 0);
  wl_sched_group_remove_all(group);
}

/* A device full of memory the budget cannot see (wl-ip-probe hold; the driver double's device of
 * 1 GiB shared by processes, WLTEST_DEVICE_SHM). A program outside the group holds 600 MiB; a
 * member whose budget is the whole device asks for 600 MiB: the ledger has room, the device does
 * not. It waits, counted as waiting for memory (the holder, a member holding 1 byte, sees it),
 * and gets the memory once the other program frees its own. Before, it failed at once. */
static void test_device_full_waits(void) {
  char group[96], envg[128], shm[96], envs[128], trace[512], envt[600];
  snprintf(trace, sizeof trace, "%s/device-full.wlt", tmpdir);
  snprintf(envt, sizeof envt, "WAVELET_TRACE=%s", trace);
  snprintf(group, sizeof group, "wltest-ip-dfull-%d", (int)getpid());
  snprintf(envg, sizeof envg, "WAVELET_GROUP=%s", group);
  snprintf(shm, sizeof shm, "/wltest-ip-dfull-%d", (int)getpid());
  snprintf(envs, sizeof envs, "WLTEST_DEVICE_SHM=%s", shm);
  for (int m = 2; m < 4; m++) {
    proc_t holder, hog, member;
    const char *hextra[] = {envg, "WAVELET_MEM_LIMIT=1G", NULL};
    char *hargv[] = {WL_HOLDER, "mem", "1", NULL};
    holder_start(&holder, hargv, hextra);
    const char *dev[] = {envs, "WLTEST_DEVICE_MEM=1G", NULL};
    char *argv[] = {WL_PROBE, "hold", "600", NULL};
    CU_ASSERT_EQUAL_FATAL(spawn(&hog, argv, dev, NULL), 0);
    char line[128];
    CU_ASSERT_TRUE(read_line(&hog, line, sizeof line));
    CU_ASSERT_STRING_EQUAL(line, "hold: 600 MiB 0");
    char envm[64];
    snprintf(envm, sizeof envm, "WAVELET_MODE=%s", all_modes[m]);
    const char *mextra[] = {envs,
                            envt,
                            "WLTEST_DEVICE_MEM=1G",
                            envg,
                            envm,
                            "WAVELET_MEM_LIMIT=1G",
                            "WAVELET_ALLOC_TIMEOUT_MS=20000",
                            "WAVELET_SHOW_STATS=1",
                            NULL};
    CU_ASSERT_EQUAL_FATAL(spawn(&member, argv, mextra, WL_LIBWAVELET), 0);
    CU_ASSERT_EQUAL(write(holder.in, "wait\n", 5), 5);
    CU_ASSERT_TRUE(read_line(&holder, line, sizeof line));
    CU_ASSERT_STRING_EQUAL(line, "waiter");
    CU_ASSERT_EQUAL(write(hog.in, "go\n", 3), 3);
    CU_ASSERT_TRUE(read_line(&member, line, sizeof line));
    CU_ASSERT_STRING_EQUAL(line, "hold: 600 MiB 0");
    CU_ASSERT_EQUAL(write(member.in, "go\n", 3), 3);
    char out[512];
    CU_ASSERT_EQUAL(finish(&hog, out, sizeof out), 0);
    CU_ASSERT_EQUAL(finish(&member, out, sizeof out), 0);
    char *e = slurp(member.err);
    /* One wait however many watch rounds it took, in the stats and in the trace. */
    unsigned long long waits = field(e, "memory budget waits");
    CU_ASSERT_EQUAL(waits, 1);
    CU_ASSERT_PTR_NULL(strstr(e, "out of memory"));
    if (waits != 1 || strstr(e, "out of memory")) fprintf(stderr, "mode %s:\n%s", all_modes[m], e);
    free(e);
    wl_trace_summary_t su;
    trace_summary(trace, &su);
    CU_ASSERT_EQUAL(su.budget_waits, 1);
    CU_ASSERT(su.budget_wait_ns > 0);
    holder_release(&holder);
    holder_end(&holder);
    wl_sched_group_remove_all(group);
    shm_unlink(shm);
  }
}

/* Pinned memory of two devices' contexts at a reset of one (wl-ip-probe reset-pinned, the driver
 * double with two devices): the same output in every mode (device 0's blocks keep their contents
 * and free, later pinned allocations work), every pinned allocation accounted freed; in alloc and
 * gate modes every request served, device 1's blocks gone with its arena and nothing left live.
 * Before, the arena carved device 0's small block from the chunk device 1's context had pinned,
 * and the reset unmapped it. */
static void test_reset_pinned_of_two_devices(void) {
  char *argv[] = {WL_PROBE, "reset-pinned", NULL};
  char plain[1024], out[1024], err[512];
  const char *two[] = {"WLTEST_DEVICE_COUNT=2", NULL};
  CU_ASSERT_EQUAL_FATAL(run(argv, two, NULL, plain, sizeof plain, NULL, 0), 0);
  CU_ASSERT_PTR_NOT_NULL(strstr(plain, "reset-pinned: device 0's kept 1\n"));
  CU_ASSERT_PTR_NOT_NULL(strstr(plain, "reset-pinned: frees 0 0 0\n"));
  char group[96];
  snprintf(group, sizeof group, "WAVELET_GROUP=wltest-ip-rpin-%d", (int)getpid());
  const char *more[] = {"WLTEST_DEVICE_COUNT=2", "WAVELET_SHOW_STATS=1", NULL};
  for (int m = 1; m < 4; m++) {
    run_mode_same(argv, m, group, more, plain, out, sizeof out, err, sizeof err);
    char *e = slurp(err);
    CU_ASSERT_EQUAL(field(e, "pinned host allocations"), 5);
    CU_ASSERT_EQUAL(field(e, "pinned host frees"), 5);
    if (m >= 2) {
      const char *arena = strstr(e, "pinned arena");
      CU_ASSERT_EQUAL(arena ? field(arena, "pinned arena") : 0, 5); /* served */
      CU_ASSERT_PTR_NOT_NULL(arena ? strstr(arena, " 0 live blocks") : NULL);
    }
    free(e);
  }
  wl_sched_group_remove(group + strlen("WAVELET_GROUP="));
}

/* Allocations from pools other than the current device's default one (wl-ip-probe pools, the
 * driver double with two devices, device 1 current): the same output in every mode (device 0's
 * pool gives device 0's memory, a pool of the program's its own, each pointer names its pool, and
 * cuMemAllocAsync takes the program's pool while it is current), and in alloc and gate modes only
 * device 1's default pool is served (twice); device 0's default pool named with device 0 current
 * but on device 1's stream gives device 0's memory, unserved. Before, every pool's allocation was
 * served from the current device's allocator, cuMemAllocAsync ignored the current pool, and the
 * last one was served from device 1's allocator. */
static void served_two(const char *err) {
  CU_ASSERT_EQUAL(field(err, "served by liballoc"), 2);
}

static void test_pools_not_served(void) {
  char *argv[] = {WL_PROBE, "pools", NULL};
  char plain[1024];
  const char *two[] = {"WLTEST_DEVICE_COUNT=2", NULL};
  CU_ASSERT_EQUAL_FATAL(run(argv, two, NULL, plain, sizeof plain, NULL, 0), 0);
  CU_ASSERT_PTR_NOT_NULL(strstr(plain, "pools: from device 0's default: on device 0,"));
  CU_ASSERT_PTR_NOT_NULL(
      strstr(plain, "pools: device 0's default on device 1's stream: on device 0\n"));
  CU_ASSERT_EQUAL(count_of(plain, "names its pool 1\n"), 2);
  CU_ASSERT_PTR_NOT_NULL(
      strstr(plain, "program's pool current: from it 1\npools: after its destroy 0\n"));
  CU_ASSERT_PTR_NOT_NULL(strstr(plain, "pools: done\n"));
  char group[96];
  snprintf(group, sizeof group, "WAVELET_GROUP=wltest-ip-pools-%d", (int)getpid());
  const char *more[] = {"WLTEST_DEVICE_COUNT=2", "WAVELET_SHOW_STATS=1", NULL};
  run_modes(argv, group, more, plain, plain, served_two);
  wl_sched_group_remove_all(group + strlen("WAVELET_GROUP="));
}

/* Memory from a pool of the program's is the driver's, booked in the budget: in alloc and gate
 * modes the 256 MiB budget refuses the second 100 MiB (out of memory, 2) and takes them after the
 * free; the driver alone (2 GiB) gives all of it. Before, pool memory was outside the budget. */
static void test_pool_memory_in_budget(void) {
  char *argv[] = {WL_PROBE, "pool-budget", NULL};
  char out[1024];
  CU_ASSERT_EQUAL_FATAL(run(argv, NULL, NULL, out, sizeof out, NULL, 0), 0);
  CU_ASSERT_STRING_EQUAL(out, "pool-budget: 200 MiB 0, 100 MiB more 0, cuMemAlloc 100 MiB 0\n"
                              "pool-budget: after the free, 100 MiB 0\n");
  /* A pool on another device than the current one: booked where its memory is. */
  char *dargv[] = {WL_PROBE, "pool-device", NULL};
  for (int m = 2; m < 4; m++) {
    char group[96];
    snprintf(group, sizeof group, "WAVELET_GROUP=wltest-ip-poold-%d-%d", (int)getpid(), m);
    const char *more[] = {"WAVELET_MEM_LIMIT=256M", "WAVELET_ALLOC_TIMEOUT_MS=0",
                          "WLTEST_DEVICE_COUNT=2", NULL};
    CU_ASSERT_EQUAL(run_mode(dargv, m, group, more, out, sizeof out, NULL, 0), 0);
    CU_ASSERT_STRING_EQUAL(out, "pool-device: device 1's pool 200 MiB 0, device 0 200 MiB 0, pool "
                                "100 MiB more 2\n");
    wl_sched_group_remove_all(group + strlen("WAVELET_GROUP="));
  }
  for (int m = 2; m < 4; m++) {
    char group[96];
    snprintf(group, sizeof group, "WAVELET_GROUP=wltest-ip-poolb-%d-%d", (int)getpid(), m);
    const char *more[] = {"WAVELET_MEM_LIMIT=256M", "WAVELET_ALLOC_TIMEOUT_MS=0", NULL};
    CU_ASSERT_EQUAL(run_mode(argv, m, group, more, out, sizeof out, NULL, 0), 0);
    CU_ASSERT_STRING_EQUAL(out, "pool-budget: 200 MiB 0, 100 MiB more 2, cuMemAlloc 100 MiB 2\n"
                                "pool-budget: after the free, 100 MiB 0\n");
    wl_sched_group_remove(group + strlen("WAVELET_GROUP="));
  }
}

/* Managed memory is the driver's in every mode (never served), accounted in the trace by its
 * size, and not booked (it is paged in on demand: booking its whole size would refuse what the
 * driver gives): 8 MiB under a 4 MiB budget still succeed. */
static void test_managed_memory(void) {
  char *argv[] = {WL_PROBE, "managed", NULL};
  char plain[1024], out[1024];
  CU_ASSERT_EQUAL_FATAL(run(argv, NULL, NULL, plain, sizeof plain, NULL, 0), 0);
  CU_ASSERT_PTR_NOT_NULL(strstr(plain, "managed: alloc 0\n"));
  CU_ASSERT_PTR_NOT_NULL(strstr(plain, "managed: bad flags 1\n"));
  for (int m = 1; m < 4; m++) {
    char trace[512], envt[600], group[96];
    snprintf(trace, sizeof trace, "%s/managed-%s.wlt", tmpdir, all_modes[m]);
    snprintf(envt, sizeof envt, "WAVELET_TRACE=%s", trace);
    snprintf(group, sizeof group, "WAVELET_GROUP=wltest-ip-managed-%d", (int)getpid());
    const char *more[] = {envt, "WAVELET_MEM_LIMIT=4M", NULL};
    run_mode_same(argv, m, group, more, plain, out, sizeof out, NULL, 0);
    tstats_t t;
    CU_ASSERT_EQUAL(trace_stats(trace, &t), 0);
    CU_ASSERT_EQUAL(t.allocs, 1);
    CU_ASSERT_EQUAL(t.frees, 1);
    CU_ASSERT_EQUAL(t.alloc_bytes, 8ull << 20);
    CU_ASSERT_EQUAL(t.free_bytes, 8ull << 20);
    wl_sched_group_remove(group + strlen("WAVELET_GROUP="));
  }
}

/* Peer access to served memory (wl-ip-probe peer, two devices): the driver's cuMemAlloc and pool
 * memory is no VMM mapping (cuMemGetAccess answers nothing, -1, in plain and trace modes); in
 * alloc and gate modes served memory is, and cuCtxEnablePeerAccess or cuMemPoolSetAccess on the
 * default pool opens it to the peer (3, read-write; 0 before), also what is mapped afterwards.
 * Before, the peer's kernels could not reach served memory at all. */
static void test_peer_access(void) {
  char *argv[] = {WL_PROBE, "peer", NULL};
  char plain[1024];
  const char *two[] = {"WLTEST_DEVICE_COUNT=2", NULL};
  CU_ASSERT_EQUAL_FATAL(run(argv, two, NULL, plain, sizeof plain, NULL, 0), 0);
  CU_ASSERT_EQUAL(count_of(plain, " -1\n"), 6);
  char group[96];
  snprintf(group, sizeof group, "WAVELET_GROUP=wltest-ip-peer-%d", (int)getpid());
  static const char *const want = "peer: device 1 on device 0's, before 0\n"
                                  "peer: device 1 on device 0's, after 3\n"
                                  "peer: device 1 on device 0's, allocated after 3\n"
                                  "peer: device 0 on device 1's, before 0\n"
                                  "peer: device 0 on device 1's, after 3\n"
                                  "peer: device 0 on device 1's, allocated after 3\n"
                                  "peer: done\n";
  run_modes(argv, group, two, plain, want, NULL);
  wl_sched_group_remove_all(group + strlen("WAVELET_GROUP="));
}

/* Allocations under a context the program created are booked (wl-ip-probe budget-ctx, a budget of
 * 1 GiB, 600 MiB served to the primary context): plain and in trace mode every allocation
 * succeeds (the same output); in alloc and gate modes 600 MiB more under the created context is
 * refused, 300 MiB fits, 200 MiB stream-ordered does not, and its destroy gives the 300 MiB back
 * (the primary's next 300 MiB fits). Before, they were outside the budget. */
static void test_created_context_budget(void) {
  char *argv[] = {WL_PROBE, "budget-ctx", NULL};
  char plain[1024];
  CU_ASSERT_EQUAL_FATAL(run(argv, NULL, NULL, plain, sizeof plain, NULL, 0), 0);
  CU_ASSERT_EQUAL(count_of(plain, " 0\n"), 8);
  char group[96];
  snprintf(group, sizeof group, "WAVELET_GROUP=wltest-ip-bctx-%d", (int)getpid());
  const char *more[] = {"WAVELET_MEM_LIMIT=1G", "WAVELET_ALLOC_TIMEOUT_MS=100", NULL};
  static const char *const want = "budget-ctx: created, 600 MiB more 2\n"
                                  "budget-ctx: created, 300 MiB 0\n"
                                  "budget-ctx: created, 200 MiB stream-ordered 2\n"
                                  "budget-ctx: primary current, 200 MiB on the created "
                                  "context's stream 2\n"
                                  "budget-ctx: primary current, 100 MiB on it 0\n"
                                  "budget-ctx: primary, 100 MiB more 2\n"
                                  "budget-ctx: destroy 0\n"
                                  "budget-ctx: primary, 300 MiB after the destroy 0\n"
                                  "budget-ctx: done\n";
  run_modes(argv, group, more, plain, want, NULL);
  wl_sched_group_remove(group + strlen("WAVELET_GROUP="));
}

/* The program's own VMM memory under the budget (wl-ip-probe vmm-budget, a budget of 1 GiB and
 * 600 MiB handles): plain and in trace mode every create succeeds (the same output); in alloc and
 * gate modes a create is refused while another handle's memory lives, also when that handle was
 * released but is still mapped, and through NCCL's free (retain, release, unmap, release) until
 * its last release; nothing is left live at exit. Before, cuMemCreate was outside the budget:
 * PyTorch with expandable segments, and NCCL's buffers, were never booked. */
static void vmm_budget_stats(const char *e) {
  CU_ASSERT_EQUAL(field(e, "memory budget waits"), 4);
  const char *live = strstr(e, "live bytes by kind");
  CU_ASSERT_EQUAL(live ? field(live, "vmm handles") : 1, 0);
}

static void test_vmm_under_budget(void) {
  char *argv[] = {WL_PROBE, "vmm-budget", NULL};
  char plain[1024];
  CU_ASSERT_EQUAL_FATAL(run(argv, NULL, NULL, plain, sizeof plain, NULL, 0), 0);
  CU_ASSERT_EQUAL(count_of(plain, " 0\n"), 6);
  CU_ASSERT_PTR_NOT_NULL(strstr(plain, "vmm-budget: done\n"));
  char group[96];
  snprintf(group, sizeof group, "WAVELET_GROUP=wltest-ip-vmmb-%d", (int)getpid());
  const char *more[] = {"WAVELET_MEM_LIMIT=1G", "WAVELET_ALLOC_TIMEOUT_MS=100",
                        "WAVELET_SHOW_STATS=1", NULL};
  static const char *const want = "vmm-budget: a second while the first lives 2\n"
                                  "vmm-budget: the first released but mapped 2\n"
                                  "vmm-budget: the first unmapped 0\n"
                                  "vmm-budget: retained the same 1\n"
                                  "vmm-budget: NCCL's free, released once 2\n"
                                  "vmm-budget: NCCL's free, unmapped 2\n"
                                  "vmm-budget: NCCL's free, released again 0\n"
                                  "vmm-budget: done\n";
  run_modes(argv, group, more, plain, want, vmm_budget_stats);
  wl_sched_group_remove(group + strlen("WAVELET_GROUP="));
}

/* Seeded random sequences of driver calls (wl-ip-fuzz: allocations of every kind on several
 * streams and their frees, copies and read-backs, pinned and VMM memory, launches, events,
 * captures, created contexts, device resets, calls that must fail): the transcript, which names
 * no address, is the same without the preload and in every mode, every read-back is right and
 * the program ends cleanly; some seeds run three threads, some two devices. A wider sweep:
 * wl-ip-fuzz SEED STEPS [THREADS] by hand (WLTEST_DEVICE_COUNT=2 for two devices), as this does. */
/* Shorter under the sanitizers, which run every call many times slower: CI keeps its time. */
#if defined(WL_SANITIZED) || defined(WL_TSAN)
#define FUZZ_STEPS          "400"
#define FUZZ_STEPS_THREADED "300"
#else
#define FUZZ_STEPS          "1000"
#define FUZZ_STEPS_THREADED "600"
#endif

static void test_random_sequences(void) {
  /* Seed 7 with three threads, each a sequence of its own; 11 and 12 on the double's two
   * devices (switching between their primary contexts), 12 threaded too. */
  static const struct {
    unsigned seed, threads, devices;
  } runs[] = {{1, 1, 1}, {2, 1, 1}, {3, 1, 1}, {5, 1, 1}, {7, 3, 1}, {11, 1, 2}, {12, 3, 2}};
  static char plain[131072], out[131072];
  char group[96];
  snprintf(group, sizeof group, "WAVELET_GROUP=wltest-ip-fuzz-%d", (int)getpid());
  for (size_t i = 0; i < sizeof runs / sizeof runs[0]; i++) {
    char seed[16], threads[16];
    snprintf(seed, sizeof seed, "%u", runs[i].seed);
    snprintf(threads, sizeof threads, "%u", runs[i].threads);
    const char *dev[] = {"WLTEST_DEVICE_MEM=16G",
                         runs[i].devices == 2 ? "WLTEST_DEVICE_COUNT=2" : "WLTEST_DEVICE_COUNT=1",
                         NULL};
    const char *steps = runs[i].threads > 1 ? FUZZ_STEPS_THREADED : FUZZ_STEPS;
    char *argv[] = {WL_FUZZ, seed, (char *)steps, threads, NULL};
    char done[32];
    snprintf(done, sizeof done, "\ndone %s steps\n", steps);
    CU_ASSERT_EQUAL_FATAL(run(argv, dev, NULL, plain, sizeof plain, NULL, 0), 0);
    CU_ASSERT_PTR_NOT_NULL(strstr(plain, done));
    CU_ASSERT_PTR_NULL(strstr(plain, "BAD"));
    CU_ASSERT(strlen(plain) < sizeof plain - 1); /* not cut short */
    if (runs[i].devices == 2) CU_ASSERT_PTR_NOT_NULL(strstr(plain, " device 1\n"));
    for (int m = 1; m < 4; m++) {
      char err[512];
      run_mode_same(argv, m, group, dev, plain, out, sizeof out, err, sizeof err);
      if (strcmp(out, plain)) fprintf(stderr, "(seed %u)\n", runs[i].seed);
    }
  }
  wl_sched_group_remove_all(group + strlen("WAVELET_GROUP="));
}

/* The same sequences under a budget far below what they ask for (200 MiB, no wait), in alloc and
 * gate modes: many allocations are refused (the out-of-memory error the program handles), and
 * still every read-back is right, the run ends cleanly and nothing synchronous, pitched, pinned or
 * VMM is left live at exit (stream-ordered memory a destroyed context left behind is the
 * driver's, and stays). */
static void test_random_sequences_tight(void) {
  static char out[131072];
  char group[96];
  snprintf(group, sizeof group, "WAVELET_GROUP=wltest-ip-fuzzt-%d", (int)getpid());
  const char *more[] = {"WLTEST_DEVICE_MEM=1G", "WAVELET_MEM_LIMIT=200M",
                        "WAVELET_ALLOC_TIMEOUT_MS=0", "WAVELET_SHOW_STATS=1", NULL};
  char *one[] = {WL_FUZZ, "1", "1000", NULL}, *three[] = {WL_FUZZ, "4", "600", "3", NULL};
  char **runs[] = {one, three};
  for (int i = 0; i < 2; i++)
    for (int m = 2; m < 4; m++) {
      char err[512];
      CU_ASSERT_EQUAL(run_mode(runs[i], m, group, more, out, sizeof out, err, sizeof err), 0);
      CU_ASSERT_PTR_NULL(strstr(out, "BAD"));
      CU_ASSERT_PTR_NOT_NULL(strstr(out, i ? "\ndone 600 steps\n" : "\ndone 1000 steps\n"));
      CU_ASSERT(count_of(out, " 2 on -1\n") >= 3); /* refusals happened */
      char *e = slurp(err);
      const char *live = e ? strstr(e, "live bytes by kind") : NULL;
      CU_ASSERT_PTR_NOT_NULL_FATAL(live);
      static const char *const kinds[] = {"device", "pitch", "pinned", "vmm handles", "vmm mapped"};
      for (size_t k = 0; k < sizeof kinds / sizeof kinds[0]; k++)
        CU_ASSERT_EQUAL(field(live, kinds[k]), 0);
      free(e);
    }
  wl_sched_group_remove(group + strlen("WAVELET_GROUP="));
}

/* One unmap over many mappings, one of them of an imported handle (wl-ip-probe vmm-walk, a
 * budget of 1 GiB, 24 mappings of 40 MiB): the same output in every mode, so in alloc and gate
 * modes every handle's booking came back at the unmap and 1000 MiB fit at once; no wait, and
 * nothing live at exit, the imported mapping counted apart. Before, the walk stopped at the
 * imported handle's mapping (never recorded) and after 16 mappings: the rest stayed booked. */
static void vmm_walk_stats(const char *e) {
  CU_ASSERT_EQUAL(field(e, "memory budget waits"), 0);
  const char *live = strstr(e, "live bytes by kind");
  CU_ASSERT_PTR_NOT_NULL_FATAL(live);
  CU_ASSERT_EQUAL(field(live, "vmm handles"), 0);
  CU_ASSERT_EQUAL(field(live, "vmm mapped"), 0);
  CU_ASSERT_EQUAL(field(live, "vmm imported"), 0);
  const char *imp = strstr(live, "vmm imported");
  CU_ASSERT_EQUAL(imp ? strtoull(imp + strlen("vmm imported"), (char **)&imp, 10) : 1, 0);
  CU_ASSERT_EQUAL(imp ? strtoull(imp, NULL, 10) : 0, 40ull << 20); /* its peak */
}

static void test_vmm_unmap_many(void) {
  char *argv[] = {WL_PROBE, "vmm-walk", NULL};
  char plain[512];
  CU_ASSERT_EQUAL_FATAL(run(argv, NULL, NULL, plain, sizeof plain, NULL, 0), 0);
  CU_ASSERT_STRING_EQUAL(plain, "vmm-walk: the imported mapping reads 7\n"
                                "vmm-walk: 24 mappings unmapped at once, then 1000 MiB 0\n"
                                "vmm-walk: done\n");
  char group[96];
  snprintf(group, sizeof group, "WAVELET_GROUP=wltest-ip-vmmw-%d", (int)getpid());
  const char *more[] = {"WAVELET_MEM_LIMIT=1G", "WAVELET_ALLOC_TIMEOUT_MS=100",
                        "WAVELET_SHOW_STATS=1", NULL};
  run_modes(argv, group, more, plain, plain, vmm_walk_stats);
  wl_sched_group_remove(group + strlen("WAVELET_GROUP="));
}

/* Pitched memory under the budget (wl-ip-probe pitch, a budget of 1 GiB on a device of 1200 MiB):
 * in alloc and gate modes 600 MiB do not fit beside ~586 MiB of pitched rows until they are
 * freed; with the driver padding rows to 64 KiB ("wide"), a pitched allocation whose real size
 * is far over what was booked before the call is given back as out of memory when the rest does
 * not fit, and nothing of it stays (1000 MiB fit after). Plain and in trace mode everything fits.
 * Before, pitched memory was never booked. */
static void no_pitch_left(const char *e) {
  const char *live = strstr(e, "live bytes by kind");
  CU_ASSERT_EQUAL(live ? field(live, "pitch") : 1, 0);
  CU_ASSERT_EQUAL(field(e, "memory budget waits"), 1);
}

static void test_pitch_under_budget(void) {
  char group[96];
  snprintf(group, sizeof group, "WAVELET_GROUP=wltest-ip-pitch-%d", (int)getpid());
  for (int wide = 0; wide < 2; wide++) {
    char *argv[] = {WL_PROBE, "pitch", wide ? "wide" : NULL, NULL};
    const char *dev[] = {"WLTEST_DEVICE_MEM=1200M",
                         wide ? "WLTEST_PITCH_ALIGN=65536" : "WLTEST_PITCH_ALIGN=512", NULL};
    char plain[512];
    CU_ASSERT_EQUAL_FATAL(run(argv, dev, NULL, plain, sizeof plain, NULL, 0), 0);
    const char *want_plain = wide ? "pitch: 600 MiB alone 0\n"
                                    "pitch: rows of 1100 bytes beside them 0\n"
                                    "pitch: 1000 MiB after 0\n"
                                    "pitch: done\n"
                                  : "pitch: 600 MiB beside 585 MiB pitched 0\n"
                                    "pitch: 600 MiB alone 0\n"
                                    "pitch: rows of 1100 bytes beside them 0\n"
                                    "pitch: 1000 MiB after 0\n"
                                    "pitch: done\n";
    CU_ASSERT_STRING_EQUAL(plain, want_plain);
    const char *want = wide ? "pitch: 600 MiB alone 0\n"
                              "pitch: rows of 1100 bytes beside them 2\n"
                              "pitch: 1000 MiB after 0\n"
                              "pitch: done\n"
                            : "pitch: 600 MiB beside 585 MiB pitched 2\n"
                              "pitch: 600 MiB alone 0\n"
                              "pitch: rows of 1100 bytes beside them 0\n"
                              "pitch: 1000 MiB after 0\n"
                              "pitch: done\n";
    const char *more[] = {dev[0],
                          dev[1],
                          "WAVELET_MEM_LIMIT=1G",
                          "WAVELET_ALLOC_TIMEOUT_MS=100",
                          "WAVELET_SHOW_STATS=1",
                          NULL};
    run_modes(argv, group, more, plain, want, no_pitch_left);
  }
  wl_sched_group_remove(group + strlen("WAVELET_GROUP="));
}

/* The primary context released for good between two pinned allocations (wl-ip-probe
 * pinned-release; the driver double frees a context's page-locked memory at its last release):
 * the same output in every mode, and in alloc and gate modes both blocks served by the arena.
 * Before, nothing retained the context the arena's chunk was pinned under, and the second block
 * came from the freed chunk (SIGSEGV). */
static void arena_served_two(const char *err) {
  const char *arena = strstr(err, "pinned arena");
  CU_ASSERT_EQUAL(arena ? field(arena, "pinned arena") : 0, 2); /* served */
}

static void test_pinned_after_last_release(void) {
  char *argv[] = {WL_PROBE, "pinned-release", NULL};
  char plain[512];
  CU_ASSERT_EQUAL_FATAL(run(argv, NULL, NULL, plain, sizeof plain, NULL, 0), 0);
  CU_ASSERT_PTR_NOT_NULL(strstr(plain, "pinned-release: second 8\npinned-release: done\n"));
  char group[96];
  snprintf(group, sizeof group, "WAVELET_GROUP=wltest-ip-prel-%d", (int)getpid());
  const char *stats[] = {"WAVELET_SHOW_STATS=1", NULL};
  run_modes(argv, group, stats, plain, plain, arena_served_two);
}

/* Contexts the program creates and destroys (wl-ip-probe ctx): the same output in every mode
 * (what each destroy takes is gone, the stream-ordered allocation kept with its contents, the
 * primary context's memory filled and freed, synchronous allocations after the last destroy
 * succeed), the trace accounts every device allocation freed (by a destroy or by the program),
 * the stats count three destroyed contexts, every pinned block freed and nothing live at exit. In
 * alloc and gate modes only the primary context's allocations are served (its 3 kept and 3 later
 * ones, its 3 pinned blocks), and the arena's blocks are all freed. Before, the created contexts'
 * allocations were served and outlived their destroy (booked for good), and the arena carved the
 * primary's pinned blocks from chunks a destroyed context had pinned. */
static void test_created_contexts(void) {
  char *argv[] = {WL_PROBE, "ctx", NULL};
  char plain[2048], out[2048], err[512], perr[512];
  CU_ASSERT_EQUAL_FATAL(run(argv, NULL, NULL, plain, sizeof plain, perr, sizeof perr), 0);
  CU_ASSERT_PTR_NOT_NULL(strstr(plain, "ctx: round 0 current 1 "));
  CU_ASSERT_PTR_NOT_NULL(strstr(plain, "ctx: round 2 destroy 0\nctx: round 2 popped 1\n"));
  CU_ASSERT_PTR_NOT_NULL(strstr(plain, ", freed 0\n"));
  CU_ASSERT_EQUAL(count_of(plain, "ctx: alloc 0\n"), 3);
  CU_ASSERT_EQUAL(count_of(plain, ", freed 0 0\n"), 3);
  CU_ASSERT_PTR_NOT_NULL(strstr(plain, "ctx: done\n"));
  char *pe = slurp(perr);
  int misuse = count_of(pe, "wltest-cuda");
  free(pe);
  char group[96], trace[512], env_trace[600];
  snprintf(group, sizeof group, "WAVELET_GROUP=wltest-ip-ctx-%d", (int)getpid());
  for (int m = 1; m < 4; m++) {
    snprintf(trace, sizeof trace, "%s/ctx-%s.wlt", tmpdir, all_modes[m]);
    snprintf(env_trace, sizeof env_trace, "WAVELET_TRACE=%s", trace);
    const char *more[] = {"WAVELET_SHOW_STATS=1", env_trace, NULL};
    run_mode_same(argv, m, group, more, plain, out, sizeof out, err, sizeof err);
    tstats_t t;
    CU_ASSERT_EQUAL(trace_stats(trace, &t), 0);
    CU_ASSERT(t.complete);
    CU_ASSERT_EQUAL(t.allocs, 12); /* 3 a round, 3 after */
    CU_ASSERT_EQUAL(t.frees, 12);
    CU_ASSERT_EQUAL(t.alloc_bytes, t.free_bytes);
    char *e = slurp(err);
    CU_ASSERT_EQUAL(field(e, "contexts destroyed"), 3);
    CU_ASSERT_EQUAL(field(e, "pinned host allocations"), 9);
    CU_ASSERT_EQUAL(field(e, "pinned host frees"), 9);
    const char *live = strstr(e, "live bytes by kind");
    CU_ASSERT_PTR_NOT_NULL(live);
    if (live) {
      CU_ASSERT_EQUAL(field(live, "device"), 0);
      CU_ASSERT_EQUAL(field(live, "async"), 0);
      CU_ASSERT_EQUAL(field(live, "pinned"), 0);
      CU_ASSERT_EQUAL(field(live, "served"), 0);
    }
    if (m >= 2) {
      CU_ASSERT_EQUAL(field(e, "served by liballoc"), 6);
      const char *arena = strstr(e, "pinned arena");
      CU_ASSERT_EQUAL(arena ? field(arena, "pinned arena") : 0, 3); /* served */
      CU_ASSERT_PTR_NOT_NULL(arena ? strstr(arena, " 0 live blocks") : NULL);
    }
    CU_ASSERT(count_of(e, "wltest-cuda") <= misuse);
    if (count_of(e, "wltest-cuda") > misuse) fprintf(stderr, "mode %s:\n%s", all_modes[m], e);
    free(e);
  }
  wl_sched_group_remove(group + strlen("WAVELET_GROUP="));
}

/* Many exports (wl-ip-probe ipc-many, alloc and gate modes): 3000 handles hold no descriptors
 * between opens (one per export before: a trainer sharing a thousand tensors hit the limit of
 * 1024), and the live allocations' exports survive a third of the others being freed between
 * them (the same handle again), while new allocations get new handles. */
static void test_ipc_many_exports(void) {
  char *argv[] = {WL_PROBE, "ipc-many", NULL};
  char out[512], group[96];
  snprintf(group, sizeof group, "WAVELET_GROUP=wltest-ip-ipcm-%d", (int)getpid());
  for (int m = 2; m < 4; m++) {
    CU_ASSERT_EQUAL(run_mode(argv, m, group, NULL, out, sizeof out, NULL, 0), 0);
    int ok = 0, n = 0, held = -1, same = 0, kept = -1, fresh = 0, nfresh = -1;
    CU_ASSERT_EQUAL(sscanf(out,
                           "ipc-many: handles %d of %d, descriptors held %d, same handle %d of %d, "
                           "new handles %d of %d",
                           &ok, &n, &held, &same, &kept, &fresh, &nfresh),
                    7);
    CU_ASSERT_EQUAL(ok, 3000);
    CU_ASSERT_EQUAL(n, 3000);
    CU_ASSERT(held >= 0 && held <= 2); /* the exporter's socket */
    CU_ASSERT_EQUAL(same, 2000);
    CU_ASSERT_EQUAL(kept, 2000);
    CU_ASSERT_EQUAL(fresh, 1000);
    CU_ASSERT_EQUAL(nfresh, 1000);
    if (held < 0 || held > 2 || same != 2000) fprintf(stderr, "\n%s: %s", all_modes[m], out);
  }
  wl_sched_group_remove(group + strlen("WAVELET_GROUP="));
}

/* cuMemHostGetFlags of pinned blocks the arena served (alloc and gate modes): the flags the
 * driver answers for its own allocation with the same flags, as without us (before: the arena
 * chunk's, PORTABLE | DEVICEMAP, for every block). */
static void test_pinned_flags(void) {
  char *argv[] = {WL_PROBE, "pinned-flags", NULL};
  char plain[1024], out[1024], err[512];
  CU_ASSERT_EQUAL_FATAL(run(argv, NULL, NULL, plain, sizeof plain, NULL, 0), 0);
  CU_ASSERT_PTR_NOT_NULL(strstr(plain, "pinned-flags: cuMemHostAlloc 0x1: 0 0x1\n"));
  char group[96];
  snprintf(group, sizeof group, "WAVELET_GROUP=wltest-ip-pflags-%d", (int)getpid());
  const char *stats[] = {"WAVELET_SHOW_STATS=1", NULL};
  for (int m = 0; m < 4; m++) {
    run_mode_same(argv, m, group, stats, plain, out, sizeof out, err, sizeof err);
    char *e = slurp(err);
    if (m >= 2) CU_ASSERT_EQUAL(field(e, "pinned arena"), 5); /* all but write-combined */
    free(e);
  }
  wl_sched_group_remove(group + strlen("WAVELET_GROUP="));
}

/* libwavelet.so's own driver calls (liballoc's VMM provider on the program's threads and on its
 * trim thread) never count against a program's stream capture: wl-ip-probe own-calls, under the
 * driver double's stricter WLTEST_CAPTURE_UNSAFE=vmm (VMM calls and event creation unsafe during
 * capture), gets the same answers with the preload as without it (main's GLOBAL capture ends
 * well, another thread's stream-ordered calls meanwhile succeed) and no misuse, in every mode;
 * in alloc and gate modes those calls were served, and memory was mapped and given back
 * meanwhile. (Before: in alloc and gate modes the allocator's first cuMemAddressReserve was
 * refused, main's capture ended CUDA_ERROR_STREAM_CAPTURE_INVALIDATED and nothing was served,
 * tried.) */
static void test_own_calls_in_capture(void) {
  char *argv[] = {WL_PROBE, "own-calls", NULL};
  static char plain[8192], out[8192];
  char err[512];
  const char *strict[] = {"WLTEST_CAPTURE_UNSAFE=vmm", NULL};
  CU_ASSERT_EQUAL_FATAL(run(argv, strict, NULL, plain, sizeof plain, err, sizeof err), 0);
  CU_ASSERT_PTR_NOT_NULL_FATAL(strstr(plain, "own-calls: done"));
  CU_ASSERT_EQUAL(count_lines(err, "wltest-cuda: misuse:"), 0);
  unsigned long long allocs = field(plain, "succeeded: allocations ");
  CU_ASSERT_EQUAL(allocs, 6);
  char group[96];
  snprintf(group, sizeof group, "WAVELET_GROUP=wltest-ip-own-%d", (int)getpid());
  for (int m = 0; m < 4; m++) {
    char trace[512], envt[600];
    snprintf(trace, sizeof trace, "%s/own-calls-%s.wlt", tmpdir, all_modes[m]);
    snprintf(envt, sizeof envt, "WAVELET_TRACE=%s", trace);
    const char *more[] = {strict[0], envt, "WAVELET_SHOW_STATS=1", NULL};
    CU_ASSERT_EQUAL(run_mode(argv, m, group, more, out, sizeof out, err, sizeof err), 0);
    CU_ASSERT_STRING_EQUAL(out, plain);
    int misuse = count_lines(err, "wltest-cuda: misuse:");
    CU_ASSERT_EQUAL(misuse, 0);
    if (strcmp(out, plain) || misuse) {
      char *e = slurp(err);
      fprintf(stderr, "\nmode %s:\n%s--- plain:\n%s--- stderr:\n%s", all_modes[m], out, plain, e);
      free(e);
    }
    if (m >= 2) {
      char *e = slurp(err);
      CU_ASSERT_EQUAL(field(e, "served by liballoc"), allocs);
      free(e);
      tstats_t t;
      CU_ASSERT_EQUAL_FATAL(trace_stats(trace, &t), 0);
      CU_ASSERT(t.maps >= 1 && t.unmaps >= 1);
    }
  }
  wl_sched_group_remove(group + strlen("WAVELET_GROUP="));
}

/* Per-thread default streams are a stream per thread: in alloc and gate modes a block one thread
 * freed on its own while its work there was pending never went to another thread (on its
 * per-thread stream, a created one, the legacy one, a _ptsz NULL), nor after that thread ended
 * with the work still running. The program completes without the preload and in every mode. (In
 * alloc and gate modes liballoc took the one handle CU_STREAM_PER_THREAD for every thread's stream:
 * tried, B got A's block in four of the lines.) */
static void test_per_thread_streams(void) {
  char *argv[] = {WL_PROBE, "ptds", NULL};
  static char out[8192];
  static const char *const modes[] = {NULL, "off", "trace", "alloc", "gate"};
  char group[96];
  snprintf(group, sizeof group, "WAVELET_GROUP=wltest-ip-ptds-%d", (int)getpid());
  for (int m = 0; m < 5; m++) {
    char envm[64];
    snprintf(envm, sizeof envm, "WAVELET_MODE=%s", modes[m] ? modes[m] : "off");
    const char *extra[] = {envm, group, NULL};
    int rc = run(argv, extra, modes[m] ? WL_LIBWAVELET : NULL, out, sizeof out, NULL, 0);
    CU_ASSERT_EQUAL(rc, 0);
    CU_ASSERT_PTR_NOT_NULL(strstr(out, "ptds: done"));
    /* The driver double's pool may hand A's block out (it frees at once). */
    int served = m >= 3;
    CU_ASSERT(!served || !strstr(out, "pending: yes"));
    if (rc || !strstr(out, "ptds: done") || (served && strstr(out, "pending: yes")))
      fprintf(stderr, "\nmode %s (rc %d):\n%s", modes[m] ? modes[m] : "none", rc, out);
  }
  wl_sched_group_remove(group + strlen("WAVELET_GROUP="));
}

/* ---- the nvcc-built programs of tests/programs ----------------------------------------------*/

/* Plain, then trace, alloc and gate modes: the same stdout; in the trace every allocation is
 * freed by the end (the programs free all they allocate) and launches were seen. */
__attribute__((unused)) static void program_modes(const char *path, char *const args[],
                                                  unsigned long long min_launches) {
  char *argv[16];
  int n = 0;
  argv[n++] = (char *)path;
  for (int i = 0; args && args[i] && n < 15; i++) argv[n++] = args[i];
  argv[n] = NULL;
  static char plain[65536], out[65536];
  const char *kern[] = {"WLTEST_KERNEL_NS=20000", NULL};
  int rc = run(argv, kern, NULL, plain, sizeof plain, NULL, 0);
  CU_ASSERT_EQUAL_FATAL(rc, 0);
  CU_ASSERT_PTR_NOT_NULL(strstr(plain, "checksum"));
  static const char *const modes[] = {"trace", "alloc", "gate"};
  for (int m = 0; m < 3; m++) {
    char trace[512], envt[600], envm[64], envg[96], err[512];
    const char *base = strrchr(path, '/');
    snprintf(trace, sizeof trace, "%s/%s-%s.wlt", tmpdir, base ? base + 1 : path, modes[m]);
    snprintf(envt, sizeof envt, "WAVELET_TRACE=%s", trace);
    snprintf(envm, sizeof envm, "WAVELET_MODE=%s", modes[m]);
    snprintf(envg, sizeof envg, "WAVELET_GROUP=wltest-prog-%d-%d", (int)getpid(), m);
    const char *extra[] = {envt, envm, envg, "WLTEST_KERNEL_NS=20000", NULL};
    rc = run(argv, extra, WL_LIBWAVELET, out, sizeof out, err, sizeof err);
    CU_ASSERT_EQUAL(rc, 0);
    CU_ASSERT_STRING_EQUAL(out, plain);
    if (rc || strcmp(out, plain)) {
      char *e = slurp(err);
      fprintf(stderr, "\n--- %s in mode %s (exit %d):\n%s--- expected:\n%s--- stderr:\n%s\n", path,
              modes[m], rc, out, plain, e);
      free(e);
    }
    tstats_t t;
    CU_ASSERT_EQUAL_FATAL(trace_stats(trace, &t), 0);
    CU_ASSERT_TRUE(t.complete);
    CU_ASSERT_TRUE(t.allocs > 0);
    CU_ASSERT_EQUAL(t.allocs, t.frees);
    CU_ASSERT_EQUAL(t.alloc_bytes, t.free_bytes);
    CU_ASSERT_TRUE(t.launches >= min_launches);
    /* The runtime programs say what they allocated ("cudaMalloc N bytes B cudaMallocAsync N
     * bytes B ..."; pinned memory is not device memory in the trace): exactly that. */
    const char *line = strstr(plain, ": cudaMalloc ");
    if (line) {
      unsigned long long n1 = 0, b1 = 0, n2 = 0, b2 = 0;
      if (sscanf(line, ": cudaMalloc %llu bytes %llu cudaMallocAsync %llu bytes %llu", &n1, &b1,
                 &n2, &b2) == 4) {
        CU_ASSERT_EQUAL(t.allocs, n1 + n2);
        CU_ASSERT_EQUAL(t.alloc_bytes, b1 + b2);
        /* and what they launched, when they say (every door: <<<>>>, the explicit launches, a
         * graph's replays, a cooperative launch): exactly that many launch records */
        const char *nl = strchr(line, '\n'), *ln = strstr(line, " launches ");
        if (ln && (!nl || ln < nl)) {
          unsigned long long want = strtoull(ln + strlen(" launches "), NULL, 10);
          CU_ASSERT_EQUAL(t.launches, want);
          if (t.launches != want)
            fprintf(stderr, "\n%s %s: %llu launches traced, %llu made\n", path, modes[m],
                    t.launches, want);
        }
      } else {
        CU_FAIL("unexpected allocation line");
      }
    }
    if (t.allocs != t.frees || t.alloc_bytes != t.free_bytes || t.launches < min_launches)
      fprintf(stderr, "\n%s %s: allocs %llu frees %llu bytes %llu/%llu launches %llu\n", path,
              modes[m], t.allocs, t.frees, t.alloc_bytes, t.free_bytes, t.launches);
  }
}

#ifdef WL_PROG_RT
static void test_prog_rt(void) {
  char *args[] = {"3", "1", "2", NULL};
  program_modes(WL_PROG_RT, args, 1);
}
#endif
#ifdef WL_PROG_RT_PTDS
static void test_prog_rt_ptds(void) {
  char *args[] = {"2", "1", "2", NULL};
  program_modes(WL_PROG_RT_PTDS, args, 1);
}
#endif
#ifdef WL_PROG_DRV
/* Exactly the launches wl-prog-drv makes, in every mode (program_modes' traces, read again): 6
 * direct and 1 captured, 2 graph launches, cuLaunch, cuLaunchGrid and cuLaunchGridAsync each
 * through the exported symbol, cuGetProcAddress and dlsym (9), and 3 multi-device cooperative
 * launches. An at-least count let a launch path that escapes the hooks pass. */
static void test_prog_drv(void) {
  enum { LAUNCHES = 21 };
  program_modes(WL_PROG_DRV, NULL, LAUNCHES);
  static const char *const modes[] = {"trace", "alloc", "gate"};
  const char *base = strrchr(WL_PROG_DRV, '/');
  for (int m = 0; m < 3; m++) {
    char trace[512];
    snprintf(trace, sizeof trace, "%s/%s-%s.wlt", tmpdir, base ? base + 1 : WL_PROG_DRV, modes[m]);
    tstats_t t;
    CU_ASSERT_EQUAL_FATAL(trace_stats(trace, &t), 0);
    CU_ASSERT_EQUAL(t.launches, LAUNCHES);
    if (t.launches != LAUNCHES)
      fprintf(stderr, "\nwl-prog-drv %s: %llu launches traced, %d made\n", modes[m], t.launches,
              LAUNCHES);
  }
}
#endif
#ifdef WL_PROG_REPLICA
static void test_prog_replica(void) {
  char *args[] = {"--iters", "3", "--peak", "16M", NULL};
  program_modes(WL_PROG_REPLICA, args, 1);
}
#endif

#ifdef WL_PROG_REPLICA
/* Without markers: two nvcc-built replicas in gate mode. The phase detector learns the
 * iteration from the allocations within its first few iterations (learning runs more often while
 * the history is short), the gate is then used for nearly all of the 40, and no two replicas
 * ever hold the token at once. */
static void test_prog_replica_pattern(void) {
  char group[64], envg[96], envt[2][600], tpath[2][512];
  snprintf(group, sizeof group, "wltest-ip-pattern-%d", (int)getpid());
  snprintf(envg, sizeof envg, "WAVELET_GROUP=%s", group);
  proc_t p[2];
  for (int i = 0; i < 2; i++) {
    snprintf(tpath[i], sizeof tpath[i], "%s/pattern-%d.wlt", tmpdir, i);
    snprintf(envt[i], sizeof envt[i], "WAVELET_TRACE=%s", tpath[i]);
    const char *extra[] = {
        envg, envt[i], "WAVELET_MODE=gate", "WAVELET_MEM_LIMIT=1G", "WLTEST_KERNEL_NS=100000",
        NULL};
    char *argv[] = {WL_PROG_REPLICA, "--iters", "40", "--peak", "64M", "--quiet", NULL};
    CU_ASSERT_EQUAL_FATAL(spawn(&p[i], argv, extra, WL_LIBWAVELET), 0);
  }
  int held = 0;
  for (int i = 0; i < 2; i++) {
    char out[4096];
    int rc = finish(&p[i], out, sizeof out);
    CU_ASSERT_EQUAL(rc, 0);
    CU_ASSERT_PTR_NOT_NULL(strstr(out, "checksum"));
    if (rc) {
      char *e = slurp(p[i].err);
      fprintf(stderr, "\npattern replica %d exit %d:\n%s%s\n", i, rc, out, e);
      free(e);
    }
    CU_ASSERT_EQUAL(read_replica(tpath[i], &rt[i]), 0);
    held += rt[i].nheld;
  }
  CU_ASSERT_TRUE(held >= 60);
  CU_ASSERT_EQUAL(overlaps(2), 0);
  /* The token is kept through the rising phase: from the grant at the iteration's first
   * allocation until the GPU reaches the peak allocation (stream-ordered), after the 7 forward
   * kernels before it, 100 us each on the doubles, run in order: at least 700 us (600 asked).
   * Nearly every span lasts that long (one ended by exit may not). */
  int long_spans = 0;
  for (int i = 0; i < 2; i++)
    for (int j = 0; j < rt[i].nheld; j++)
      long_spans += rt[i].held[j].end - rt[i].held[j].begin >= 6 * 100000ull;
  CU_ASSERT_TRUE(long_spans >= held - 4);
  if (held < 60 || overlaps(2) || long_spans < held - 4)
    fprintf(stderr, "\npattern: token spans %d (%d of them past the peak), overlaps %d\n", held,
            long_spans, overlaps(2));
  wl_sched_group_remove(group);
}
#endif

#ifdef WL_PROG_REPLICA
/* Two nvcc-built replicas (peaks of 96 MiB) on one device double shared by both processes
 * (WLTEST_DEVICE_SHM) of 160 MiB, below two peaks: the device itself enforces its size, not our
 * ledger. Without the preload their peaks meet and one runs out of the device's memory (a few
 * tries: colliding is likely, not certain); in gate mode, with the budget the device's size, both
 * finish, their rising phases never overlap, and the device never refused anything. */
static int shared_pair(int gated, const char *shm, int *ooms) {
  char group[64], envg[96], envs[96], envt[2][600], tpath[2][512];
  snprintf(group, sizeof group, "wltest-ip-shdev-%d", (int)getpid());
  snprintf(envg, sizeof envg, "WAVELET_GROUP=%s", group);
  snprintf(envs, sizeof envs, "WLTEST_DEVICE_SHM=%s", shm);
  proc_t p[2];
  for (int i = 0; i < 2; i++) {
    snprintf(tpath[i], sizeof tpath[i], "%s/shdev-%d.wlt", tmpdir, i);
    snprintf(envt[i], sizeof envt[i], "WAVELET_TRACE=%s", tpath[i]);
    const char *extra[] = {envs,    "WLTEST_DEVICE_MEM=160M", "WLTEST_KERNEL_NS=100000", envg,
                           envt[i], "WAVELET_MODE=gate",      "WAVELET_MEM_LIMIT=160M",  NULL};
    if (!gated) extra[3] = NULL;
    char *argv[] = {WL_PROG_REPLICA, "--iters",   "30",      "--peak",
                    "96M",           "--markers", "--quiet", NULL};
    CU_ASSERT_EQUAL_FATAL(spawn(&p[i], argv, extra, gated ? WL_LIBWAVELET : NULL), 0);
  }
  int done = 0;
  *ooms = 0;
  for (int i = 0; i < 2; i++) {
    char out[4096];
    int rc = finish(&p[i], out, sizeof out);
    done += rc == 0;
    *ooms += rc == 3 && strstr(out, "out of memory") != NULL;
    if (gated && rc) {
      char *e = slurp(p[i].err);
      fprintf(stderr, "\nshared-device replica %d exit %d:\n%s%s\n", i, rc, out, e);
      free(e);
    }
    if (gated) CU_ASSERT_EQUAL(read_replica(tpath[i], &rt[i]), 0);
  }
  if (gated) wl_sched_group_remove(group);
  return done;
}

static void test_prog_replica_shared_device(void) {
  char shm[64];
  snprintf(shm, sizeof shm, "/wltest-ip-shdev-%d", (int)getpid());
  int ooms = 0, collided = 0;
  for (int attempt = 0; attempt < 3 && !collided; attempt++) {
    int done = shared_pair(0, shm, &ooms);
    collided = ooms >= 1 && done + ooms == 2;
  }
  CU_ASSERT_TRUE(collided);
  int done = shared_pair(1, shm, &ooms);
  CU_ASSERT_EQUAL(done, 2);
  CU_ASSERT_EQUAL(ooms, 0);
  CU_ASSERT_EQUAL(overlaps(2), 0);
  CU_ASSERT_TRUE(rt[0].nheld > 0 && rt[1].nheld > 0);
  char path[96];
  snprintf(path, sizeof path, "/dev/shm%s", shm);
  unlink(path);
}

/* The same through the runtime (<<<>>>, the name from cudaFuncGetName, mangled). */
static void test_nccl_static_rt(void) {
  char *argv[] = {WL_PROG_REPLICA, "--iters",      "2",       "--kernels", "2", "--peak", "1M",
                  "--markers",     "--collective", "--quiet", NULL};
  static_nccl_case("ncclsr", argv, "collective-launch done", 0);
}

/* The same kernel captured into a graph through the runtime (cudaStreamBeginCapture, <<<>>>,
 * cudaGraphInstantiate, which reaches the driver through cuGetProcAddress) and launched with
 * cudaGraphLaunch (the runtime's own hook). */
static void test_nccl_graph_rt(void) {
  char *argv[] = {WL_PROG_REPLICA, "--iters",      "2",       "--kernels", "2", "--peak", "1M",
                  "--markers",     "--collective", "--graph", "--quiet",   NULL};
  static_nccl_case("ncclgr", argv, "collective-launch done", 1);
}
#endif

#ifdef WL_REALRT
/* The toolkit's real libcudart over the driver double: every lookup the CUDA 13 runtime makes
 * through cuGetProcAddress_v2 (logged by the double) is answered with our wrapper exactly when
 * we hook the variant the driver answered with. The runtime gives up after resolving its table
 * (the double has no private export tables); its lookups are what is checked. */
static void realrt_case(const char *mode, unsigned *hooked_out) {
  char log[512], ldp[1024], logenv[600], modeenv[64];
  static int seq;
  snprintf(log, sizeof log, "%s/proclog-%d", tmpdir, seq++);
  unlink(log);
  snprintf(ldp, sizeof ldp, "LD_LIBRARY_PATH=%s:%s", WL_CUDART_DIR, WL_DOUBLES_DIR);
  snprintf(logenv, sizeof logenv, "WLTEST_PROC_LOG=%s", log);
  snprintf(modeenv, sizeof modeenv, "WAVELET_MODE=%s", mode ? mode : "off");
  const char *extra[] = {ldp, logenv, modeenv, "WAVELET_SHOW_STATS=1", NULL};
  char *argv[] = {WL_REALRT, NULL};
  static char out[65536];
  char err[512];
  int rc = run(argv, extra, mode ? WL_LIBWAVELET : NULL, out, sizeof out, err, sizeof err);
  CU_ASSERT_EQUAL(rc, 0);
  unsigned long long queries = field(out, "queries "), hooked = field(out, "hooked "),
                     bad = field(out, "mismatches ");
  /* CUDA 13.0's runtime asks for ~440 entry points; the double has 100 of them. */
  CU_ASSERT(queries >= 60 && queries != ~0ull);
  CU_ASSERT_EQUAL(bad, 0);
  if (bad) fprintf(stderr, "%s", out);
  char *l = slurp(log);
  /* The lookups that matter, as the real runtime makes them (legacy and per-thread). */
  CU_ASSERT_PTR_NOT_NULL(strstr(l, "cuMemAlloc 3020 0 cuMemAlloc_v2\n"));
  CU_ASSERT_PTR_NOT_NULL(strstr(l, "cuLaunchKernel 4000 0 cuLaunchKernel\n"));
  CU_ASSERT_PTR_NOT_NULL(strstr(l, "cuLaunchKernel 7000 2 cuLaunchKernel_ptsz\n"));
  CU_ASSERT_PTR_NOT_NULL(strstr(l, "cuMemAllocAsync 11020 2 cuMemAllocAsync_ptsz\n"));
  CU_ASSERT_PTR_NOT_NULL(strstr(l, "cuGraphLaunch 10000 0 cuGraphLaunch\n"));
  /* The pool and peer-access calls the runtime makes for cudaDeviceSetMemPool,
   * cudaMemPoolSetAccess and cudaDeviceEnablePeerAccess. */
  CU_ASSERT_PTR_NOT_NULL(strstr(l, "cuDeviceSetMemPool 11020 0 cuDeviceSetMemPool\n"));
  CU_ASSERT_PTR_NOT_NULL(strstr(l, "cuMemPoolSetAccess 11020 0 cuMemPoolSetAccess\n"));
  CU_ASSERT_PTR_NOT_NULL(strstr(l, "cuCtxEnablePeerAccess 4000 0 cuCtxEnablePeerAccess\n"));
  /* Every graph instantiation variant (the graph hooks must cover whichever it calls). */
  CU_ASSERT_PTR_NOT_NULL(strstr(l, "cuGraphInstantiate 10000 0 cuGraphInstantiate\n"));
  CU_ASSERT_PTR_NOT_NULL(strstr(l, "cuGraphInstantiate 11000 0 cuGraphInstantiate_v2\n"));
  CU_ASSERT_PTR_NOT_NULL(strstr(l, "cuGraphInstantiateWithFlags 11040 0 "));
  CU_ASSERT_PTR_NOT_NULL(
      strstr(l, "cuGraphInstantiateWithParams 12000 2 cuGraphInstantiateWithParams_ptsz\n"));
  /* The executable graph updates the gate hooks (the runtime asks for the 12.0 ABIs). */
  CU_ASSERT_PTR_NOT_NULL(strstr(l, "cuGraphExecUpdate 12000 0 cuGraphExecUpdate_v2\n"));
  CU_ASSERT_PTR_NOT_NULL(
      strstr(l, "cuGraphExecKernelNodeSetParams 12000 0 cuGraphExecKernelNodeSetParams_v2\n"));
  CU_ASSERT_PTR_NOT_NULL(strstr(l, "cuGraphExecNodeSetParams 12020 0 cuGraphExecNodeSetParams\n"));
  CU_ASSERT_PTR_NOT_NULL(
      strstr(l, "cuGraphExecChildGraphNodeSetParams 11010 0 cuGraphExecChildGraphNodeSetParams\n"));
  /* The generic node adder, which hands out conditional nodes' bodies. */
  CU_ASSERT_PTR_NOT_NULL(strstr(l, "cuGraphAddNode 12030 0 cuGraphAddNode_v2\n"));
  CU_ASSERT_PTR_NOT_NULL(strstr(l, "cuGraphDestroyNode 10000 0 cuGraphDestroyNode\n"));
  /* Per-thread capture, and the mode exchange (cudaThreadExchangeStreamCaptureMode is the
   * driver's, which capture.c asks). */
  CU_ASSERT_PTR_NOT_NULL(strstr(l, "cuStreamBeginCapture 10010 2 cuStreamBeginCapture_v2_ptsz\n"));
  CU_ASSERT_PTR_NOT_NULL(strstr(l, "cuThreadExchangeStreamCaptureMode 10010 0 "));
  /* cudaIpcGetMemHandle's entry point, whose failure on served memory is said. */
  CU_ASSERT_PTR_NOT_NULL(strstr(l, "cuIpcGetMemHandle 4010 0 cuIpcGetMemHandle\n"));
  free(l);
  if (mode) {
    /* Each hooked answer counted once for the runtime's lookup and once for the replay. */
    char *e = slurp(err);
    CU_ASSERT_EQUAL(field(e, "cuGetProcAddress answers"), 2 * hooked);
    free(e);
  }
  *hooked_out = (unsigned)hooked;
}

static void test_real_runtime(void) {
  unsigned plain, traced, gated;
  realrt_case(NULL, &plain);
  realrt_case("trace", &traced);
  realrt_case("gate", &gated);
  CU_ASSERT_EQUAL(plain, 0);
  CU_ASSERT(traced >= 20); /* allocations, frees, launches, graphs, capture, the door itself */
  CU_ASSERT_EQUAL(gated, traced);
}
#endif

/* --shard k/n (ctest's two entries): runs every n-th case from the k-th; all without it.
 * --only TEXT: the cases whose name contains TEXT (by hand, while working on one). */
static unsigned shard_k, shard_n = 1, shard_i;
static const char *only;
#define ADD(name, fn)                                                                              \
  do {                                                                                             \
    if (shard_i++ % shard_n == shard_k && (!only || strstr(name, only))) CU_add_test(s, name, fn); \
  } while (0)

int main(int argc, char **argv) {
  if (argc == 3 && !strcmp(argv[1], "--shard")) {
    unsigned k = 0, n = 0;
    if (sscanf(argv[2], "%u/%u", &k, &n) != 2 || n == 0 || k == 0 || k > n) {
      fprintf(stderr, "test_interpose: --shard %s: expected K/N with 1 <= K <= N\n", argv[2]);
      return 2;
    }
    shard_k = k - 1;
    shard_n = n;
  } else if (argc == 3 && !strcmp(argv[1], "--only")) {
    only = argv[2];
  } else if (argc != 1) {
    fprintf(stderr, "usage: test_interpose [--shard K/N | --only TEXT]\n");
    return 2;
  }
  snprintf(tmpdir, sizeof tmpdir, "/tmp/wltest-interpose-%d", (int)getpid());
  mkdir(tmpdir, 0700);
  /* A write to a program that died (one run without the preload, say) fails the test that made
   * it, not the whole runner. */
  signal(SIGPIPE, SIG_IGN);
  if (CU_initialize_registry() != CUE_SUCCESS) return 1;
  CU_pSuite s = CU_add_suite("interpose", NULL, NULL);
  ADD("probe: trace mode, same output, exact trace", test_probe_trace);
  ADD("probe: off mode, same output, no trace", test_probe_off);
  ADD("probe: alloc mode, same output, exact trace", test_probe_alloc);
  ADD("malloc stays glibc's", test_malloc_is_glibc);
  ADD("per-thread default streams are one stream per thread", test_per_thread_streams);
  ADD("synchronous allocations and frees beside stream-ordered memory", test_sync_order);
  ADD("a stream-ordered free on another device's legacy stream", test_free_other_device);
  ADD("VMM refused by the driver: passes through", test_vmm_refused);
  ADD("a driver shut down is not reported", test_driver_shut_down);
  ADD("a capturing stream is never queried", test_capture_stream_unqueried);
  ADD("fork", test_fork);
  ADD("fork while threads are inside hooks: every child exits 0", test_fork_threads);
  ADD("bad options are warned about and ignored", test_bad_options);
  ADD("two processes of one trace path: each keeps its own trace", test_trace_path_shared);
  ADD("WAVELET_LOG=debug prints the options", test_debug_table);
  ADD("cuMemGetInfo reports the budget in alloc and gate modes, from the first call", test_meminfo);
  ADD("libwavelet.so exports exactly its hooks, dlsym and the markers", test_exports_are_the_hooks);
  ADD("a process killed mid-run leaves every record in its trace", test_sigkill_trace_exact);
  ADD("memory from a pool of the program's is booked in the budget", test_pool_memory_in_budget);
  ADD("managed memory is the driver's, accounted, not booked", test_managed_memory);
#ifdef WL_PROG_REPLICA
  ADD("two nvcc replicas on a device below two peaks: out of memory alone, both finish gated",
      test_prog_replica_shared_device);
#endif
  ADD("cuMemGetInfo alone tells the budget without taking a role", test_meminfo_does_not_join);
  ADD("an interposer preloaded after us is given the driver as its RTLD_NEXT",
      test_rtld_next_interposer);
  ADD("a wait for the group's memory is counted and traced", test_budget_wait);
  ADD("NCCL launches are never gated", test_nccl_bypass);
  ADD("a process on two GPUs takes both GPUs' tokens", test_gate_every_gpu);
  ADD("statically linked NCCL's kernels are never gated (driver launch)", test_nccl_static_drv);
  ADD("a captured graph with a kernel named as NCCL's is never gated", test_graph_nccl_static);
  ADD("a graph captured around ncclAllReduce is never gated", test_graph_nccl_region);
  ADD("a graph without NCCL work is gated at its launch", test_graph_plain);
  ADD("an NCCL graph's destroyed handles, reused, are gated again", test_graph_reuse);
  ADD("a graph built node by node with NCCL's kernel is never gated", test_graph_nodes);
  ADD("a graph whose inspection fails is gated as one launch", test_graph_nodes_fail);
  ADD("a child graph node with NCCL's kernel (a CUkernel) is never gated", test_graph_child);
  ADD("a clone of an NCCL graph is never gated", test_graph_clone);
  ADD("an executable graph updated to NCCL work is never gated", test_graph_update);
  ADD("an executable graph updated away from NCCL work is gated", test_graph_update_plain);
  ADD("an executable graph's kernel node set to NCCL's kernel is never gated",
      test_graph_set_params);
  ADD("the same by cuGraphExecNodeSetParams is never gated", test_graph_node_params);
  ADD("a child graph node set to NCCL work is never gated", test_graph_child_params);
  ADD("a graph built by cuGraphAddNode with NCCL's kernel is never gated", test_graph_add_node);
  ADD("a conditional body with NCCL's kernel is never gated", test_graph_cond);
  ADD("a conditional body without NCCL work is gated", test_graph_cond_plain);
  ADD("two replicas: gated completes, ungated runs out of memory", test_two_replicas);
  ADD("three replicas: gated completes, ungated runs out of memory", test_three_replicas);
  ADD("SIGKILL of one replica: the others finish", test_sigkill_replica);
  ADD("exit while threads are inside hooks: no crash, a complete trace", test_exit_race);
  ADD("a normal exit gives the ledger credit back", test_exit_leaves_group);
  ADD("odd calls get the driver's own answers", test_odd_calls);
  ADD("unusual calls on served memory and streams get the driver's answers", test_edge_calls);
  ADD("failed served calls leave the runtime's last error as the real ones", test_last_error);
  ADD("synchronous allocations during stream capture get the driver's answers", test_capture_modes);
  ADD("our own driver calls never invalidate a program's stream capture",
      test_own_calls_in_capture);
  ADD("CUDA IPC across processes: the same in every mode", test_ipc_of_served_memory);
  ADD("CUDA IPC: many exports hold no descriptors", test_ipc_many_exports);
  ADD("pinned arena blocks report the flags they were asked with", test_pinned_flags);
  ADD("a device reset frees what the driver frees, ours first", test_device_reset);
  ADD("a device reset ends the captures on its streams", test_reset_ends_captures);
  ADD("a reset of one of two devices leaves the other's memory", test_reset_one_of_two_devices);
  ADD("a reset of one of two devices and the pinned arena", test_reset_pinned_of_two_devices);
  ADD("contexts the program creates and destroys", test_created_contexts);
  ADD("pinned memory after the primary context's last release", test_pinned_after_last_release);
  ADD("the program's own VMM memory under the budget", test_vmm_under_budget);
  ADD("one unmap over many mappings, one of them imported", test_vmm_unmap_many);
  ADD("random call sequences: the same transcript in every mode", test_random_sequences);
  ADD("random call sequences under a tight budget", test_random_sequences_tight);
  ADD("pitched memory under the budget", test_pitch_under_budget);
  ADD("pools other than the default one are the driver's", test_pools_not_served);
  ADD("peer access reaches served memory", test_peer_access);
  ADD("a created context's allocations under the budget", test_created_context_budget);
  ADD("each device's memory in its own GPU's group", test_budget_per_device);
  ADD("a group is one GPU's, whichever device is served first", test_group_is_one_gpus);
  ADD("a device full of memory the budget cannot see: wait, then serve", test_device_full_waits);
  ADD("the runtime dlclosed and loaded again elsewhere: no stale calls", test_reload);
  ADD("loaded with dlopen, closed under its threads", test_dlopen);
  ADD("the runtime of an extension loaded RTLD_LOCAL (PyTorch's shape)", test_python_extension);
  ADD("a signal blocked by the program never lands on our threads", test_signals);
#ifdef WL_REALRT
  ADD("the real CUDA runtime's cuGetProcAddress lookups get our wrappers", test_real_runtime);
#endif
#ifdef WL_PROG_RT
  ADD("wl-prog-rt: same output and a balanced trace in every mode", test_prog_rt);
#endif
#ifdef WL_PROG_RT_PTDS
  ADD("wl-prog-rt-ptds: the same with the per-thread stream", test_prog_rt_ptds);
#endif
#ifdef WL_PROG_DRV
  ADD("wl-prog-drv: every door and entry point", test_prog_drv);
#endif
#ifdef WL_PROG_REPLICA
  ADD("wl-prog-replica: one replica in every mode", test_prog_replica);
  ADD("wl-prog-replica x2 without markers: the learned pattern drives the gate",
      test_prog_replica_pattern);
  ADD("the trainer's markers are in the trace in trace and alloc modes", test_markers_traced);
  ADD("statically linked NCCL's kernels are never gated (runtime launch)", test_nccl_static_rt);
  ADD("a graph captured through the runtime with NCCL's kernel is never gated", test_nccl_graph_rt);
#endif
  CU_basic_set_mode(CU_BRM_VERBOSE);
  CU_basic_run_tests();
  unsigned failures = CU_get_number_of_failures();
  CU_cleanup_registry();
  remove_groups_of_run();
  if (!failures) {
    char cmd[300];
    snprintf(cmd, sizeof cmd, "rm -rf %s", tmpdir);
    if (system(cmd)) {
    }
  }
  return failures != 0;
}
