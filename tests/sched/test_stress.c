/* Runs the stress tool (fork and exec) briefly, as CI does: K members in tick-tock, one killed
 * while it holds the token, and checks what it reports: no overlap, no budget violation, all
 * iterations done, the victim reclaimed and the token taken after the kill (events, never how
 * long they took). The long run is a benchmark. */
#include "wltest.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#ifndef WL_STRESS_TOOL
#error "WL_STRESS_TOOL: path of wl-sched-stress"
#endif

/* Runs the tool with args, captures its stdout (one JSON object); its exit status or -1. */
static int run_tool(char *const args[], char *out, size_t len) {
  int fds[2];
  if (pipe(fds)) return -1;
  fflush(stdout);
  pid_t pid = fork();
  if (pid == 0) {
    dup2(fds[1], 1);
    close(fds[0]);
    close(fds[1]);
    execv(WL_STRESS_TOOL, args);
    _exit(127);
  }
  close(fds[1]);
  size_t n = 0;
  ssize_t k;
  while (n + 1 < len && (k = read(fds[0], out + n, len - 1 - n)) > 0) n += (size_t)k;
  out[n] = 0;
  close(fds[0]);
  int st;
  if (waitpid(pid, &st, 0) != pid) return -1;
  printf("\n    %s", out);
  return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

/* The number after "key": in a flat JSON object, or -1. */
static double field(const char *json, const char *key) {
  char pat[64];
  snprintf(pat, sizeof pat, "\"%s\":", key);
  const char *p = strstr(json, pat);
  if (!p) return -1;
  p += strlen(pat);
  if (!strncmp(p, "true", 4)) return 1;
  if (!strncmp(p, "false", 5)) return 0;
  return strtod(p, NULL);
}

static void test_kill_one(void) {
  char out[2048];
  char *args[] = {"wl-sched-stress", "--members", "3", "--iterations", "300",
                  "--kill-one",      "--quiet",   NULL};
  CU_ASSERT_EQUAL(run_tool(args, out, sizeof out), 0);
  CU_ASSERT_EQUAL(field(out, "overlap_violations"), 0);
  CU_ASSERT_EQUAL(field(out, "budget_violations"), 0);
  CU_ASSERT_EQUAL(field(out, "killed"), 1);
  /* a survivor entered the gate after the kill, and the victim's slot was reaped once */
  CU_ASSERT_EQUAL(field(out, "recovered"), 1);
  CU_ASSERT_TRUE(field(out, "recovered_ms") >= 0);
  CU_ASSERT_EQUAL(field(out, "reaped"), 1);
  /* The two survivors finished; the victim did at least a quarter. */
  CU_ASSERT_TRUE(field(out, "iterations_done") >= 2 * 300 + 300 / 4);
  CU_ASSERT_TRUE(field(out, "handoffs") > 0);
  CU_ASSERT_EQUAL(field(out, "ok"), 1);
}

static void test_tight_budget(void) {
  /* A budget barely over one member's peak: members wait for each other's memory. */
  char out[2048];
  char *args[] = {"wl-sched-stress",
                  "--members",
                  "2",
                  "--iterations",
                  "300",
                  "--chunks",
                  "4",
                  "--chunk-bytes",
                  "1M",
                  "--mem-limit",
                  "5M",
                  "--jitter",
                  "1",
                  "--quiet",
                  NULL};
  CU_ASSERT_EQUAL(run_tool(args, out, sizeof out), 0);
  CU_ASSERT_EQUAL(field(out, "budget_violations"), 0);
  CU_ASSERT_EQUAL(field(out, "overlap_violations"), 0);
  CU_ASSERT_EQUAL(field(out, "iterations_done"), 600);
}

static void test_baseline(void) {
  /* The same run with a gate that polls every 500 us: both latencies reported (their ratio is
   * the benchmark's business, not a test's), and the polling gate keeps tick-tock too. */
  char out[2048];
  char *args[] = {"wl-sched-stress", "--members", "2", "--iterations", "200",
                  "--baseline",      "--quiet",   NULL};
  CU_ASSERT_EQUAL(run_tool(args, out, sizeof out), 0);
  CU_ASSERT_EQUAL(field(out, "overlap_violations"), 0);
  CU_ASSERT_EQUAL(field(out, "baseline_overlap_violations"), 0);
  CU_ASSERT_TRUE(field(out, "handoff_us_p50") > 0);
  CU_ASSERT_TRUE(field(out, "baseline_handoff_us_p50") > 0);
  CU_ASSERT_TRUE(field(out, "handoff_p50_speedup") > 0);
  CU_ASSERT_EQUAL(field(out, "ok"), 1);
}

static void test_bad_arguments(void) {
  char out[256];
  char *a1[] = {"wl-sched-stress", "--members", "1", NULL};
  CU_ASSERT_EQUAL(run_tool(a1, out, sizeof out), 2);
  char *a2[] = {"wl-sched-stress", "--jitter", "2", NULL};
  CU_ASSERT_EQUAL(run_tool(a2, out, sizeof out), 2);
  char *a3[] = {"wl-sched-stress", "--group", "a/b", NULL};
  CU_ASSERT_EQUAL(run_tool(a3, out, sizeof out), 2);
}

int main(int argc, char **argv) {
  static const wl_test_case_t cases[] = {
      {"kill_one", test_kill_one},
      {"tight_budget", test_tight_budget},
      {"baseline", test_baseline},
      {"bad_arguments", test_bad_arguments},
      {NULL, NULL},
  };
  return wl_test_main(argc, argv, "sched_stress", cases);
}
