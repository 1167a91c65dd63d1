/* For tests only: a group member that takes the tick-tock token (or, with "mem BYTES", that
 * much of the group's memory budget; with "mem BYTES gpu UUID" or "token - gpu UUID", as a member
 * on that GPU) and holds it until a line arrives on stdin, printing "held" and then "released NS" (CLOCK_MONOTONIC) to
 * stdout. Before that, a line "wait" makes it watch the group until another member waits for the
 * token (with "mem": for memory), then print "waiter" (or "no waiter" after 20 s, so that a test
 * never hangs on it). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <wavelet/sched.h>

/* 1 once another member waits at the gate (mem: for the group's memory), 0 after 20 s. */
static int other_waits(wl_sched_t *s, int mem) {
  for (int i = 0; i < 20000; i++) {
    wl_sched_member_t m[64];
    int n = wl_sched_members(s, m, 64);
    for (int k = 0; k < n && k < 64; k++)
      if ((mem ? m[k].waiting_bytes > 0 : m[k].waiting_gate) && m[k].pid != getpid()) return 1;
    struct timespec ts = {0, 1000000};
    nanosleep(&ts, NULL);
  }
  return 0;
}

int main(int argc, char **argv) {
  setvbuf(stdout, NULL, _IOLBF, 0);
  size_t mem = argc > 2 && !strcmp(argv[1], "mem") ? strtoull(argv[2], NULL, 10) : 0;
  wl_sched_config_t cfg;
  wl_sched_config_default(&cfg);
  wl_sched_config_from_env(&cfg);
  cfg.flags |= WL_SCHED_MANUAL_GATE;
  if (argc > 4 && !strcmp(argv[3], "gpu")) cfg.gpu_uuid = argv[4];
  wl_sched_t *s;
  if (wl_sched_join(&s, &cfg)) return 1;
  if (mem ? wl_sched_acquire(s, mem, 0) != 0 : wl_gate_enter(s) != WL_GATE_HELD) return 1;
  printf("held\n");
  char line[16];
  for (;;) {
    if (!fgets(line, sizeof line, stdin)) line[0] = 0;
    if (strncmp(line, "wait", 4)) break;
    printf(other_waits(s, mem > 0) ? "waiter\n" : "no waiter\n");
  }
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  printf("released %llu\n",
         (unsigned long long)ts.tv_sec * 1000000000ull + (unsigned long long)ts.tv_nsec);
  if (mem)
    wl_sched_release(s, mem);
  else
    wl_gate_release(s);
  /* Stay a member until told again, so the group (and its gate) outlives the release. */
  if (!fgets(line, sizeof line, stdin)) line[0] = 0;
  wl_sched_leave(s);
  return 0;
}
