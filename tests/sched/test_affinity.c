/* CPU affinity plans: disjoint sets of whole cores per member, on this machine and on synthetic
 * topologies; locality from a PCI address (or a clear fallback); bad input; applying a plan. */
#include "internal.h"
#include "wltest.h"

#include <dirent.h>
#include <sched.h>
#include <stdio.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#define MAXCPU 4096

static bool disjoint(const int *a, int na, const int *b, int nb) {
  for (int i = 0; i < na; i++)
    for (int j = 0; j < nb; j++)
      if (a[i] == b[j]) return false;
  return true;
}

static void test_machine(void) {
  static int all[MAXCPU], m0[MAXCPU], m1[MAXCPU];
  int n = wl_affinity_plan(NULL, 0, 1, all, MAXCPU);
  CU_ASSERT_TRUE_FATAL(n >= 1);
  for (int i = 1; i < n; i++) CU_ASSERT_TRUE(all[i] > all[i - 1]); /* ascending */
  int n0 = wl_affinity_plan(NULL, 0, 2, m0, MAXCPU);
  int n1 = wl_affinity_plan(NULL, 1, 2, m1, MAXCPU);
  CU_ASSERT_TRUE(n0 >= 1 && n1 >= 1);
  printf("\n    this machine: %d cpus; 2 members get %d and %d", n, n0, n1);
  if (n >= 2 && n0 + n1 == n) {
    CU_ASSERT_TRUE(disjoint(m0, n0, m1, n1));
  }
  /* Every planned cpu is one of the machine's. */
  for (int i = 0; i < n0; i++) {
    bool found = false;
    for (int j = 0; j < n; j++) found |= m0[i] == all[j];
    CU_ASSERT_TRUE(found);
  }
  /* cap smaller than the plan: the count is still the whole plan. */
  int one;
  CU_ASSERT_EQUAL(wl_affinity_plan(NULL, 0, 1, &one, 1), n);
}

static void test_synthetic(void) {
  /* 2 packages x 4 cores x 2 hyperthreads = 16 PUs. */
  static int sets[3][64];
  int ns[3], total = 0;
  for (unsigned i = 0; i < 3; i++) {
    ns[i] = wl__affinity_plan_synthetic("pack:2 core:4 pu:2", i, 3, sets[i], 64);
    CU_ASSERT_TRUE_FATAL(ns[i] > 0);
    CU_ASSERT_EQUAL(ns[i] % 2, 0); /* whole cores: both hyperthreads */
    total += ns[i];
  }
  CU_ASSERT_EQUAL(total, 16);
  CU_ASSERT_TRUE(disjoint(sets[0], ns[0], sets[1], ns[1]));
  CU_ASSERT_TRUE(disjoint(sets[0], ns[0], sets[2], ns[2]));
  CU_ASSERT_TRUE(disjoint(sets[1], ns[1], sets[2], ns[2]));
  /* Two members: one package each. */
  int a[64], b[64];
  CU_ASSERT_EQUAL(wl__affinity_plan_synthetic("pack:2 core:4 pu:2", 0, 2, a, 64), 8);
  CU_ASSERT_EQUAL(wl__affinity_plan_synthetic("pack:2 core:4 pu:2", 1, 2, b, 64), 8);
  CU_ASSERT_TRUE(disjoint(a, 8, b, 8));
  /* More members than cores: they share, one core each. */
  CU_ASSERT_EQUAL(wl__affinity_plan_synthetic("pack:1 core:2 pu:1", 2, 3, a, 64), 1);
  CU_ASSERT_EQUAL(wl__affinity_plan_synthetic("pack:1 core:2 pu:1", 0, 3, b, 64), 1);
  CU_ASSERT_EQUAL(a[0], b[0]);
  CU_ASSERT_EQUAL(wl__affinity_plan_synthetic("not a topology", 0, 1, a, 64), -EINVAL);
}

static void test_pci(void) {
  int cpus[MAXCPU];
  CU_ASSERT_EQUAL(wl_affinity_plan("zz:qq", 0, 1, cpus, MAXCPU), -EINVAL);
  CU_ASSERT_EQUAL(wl_affinity_plan("0000:00:00.9", 0, 1, cpus, MAXCPU), -EINVAL); /* func > 7 */
  CU_ASSERT_EQUAL(wl_affinity_plan("0000:00:00.0junk", 0, 1, cpus, MAXCPU), -EINVAL);
  CU_ASSERT_EQUAL(wl_affinity_plan(NULL, 2, 2, cpus, MAXCPU), -EINVAL);
  CU_ASSERT_EQUAL(wl_affinity_plan(NULL, 0, 0, cpus, MAXCPU), -EINVAL);
  /* A device that does not exist: the whole machine, with a warning. */
  int all = wl_affinity_plan(NULL, 0, 1, cpus, MAXCPU);
  CU_ASSERT_EQUAL(wl_affinity_plan("0000:fe:1f.7", 0, 1, cpus, MAXCPU), all);
  /* A real PCI device of this machine (there is no GPU here): its local cores. */
  DIR *d = opendir("/sys/bus/pci/devices");
  struct dirent *e;
  char bus[64] = "";
  while (d && (e = readdir(d)) != NULL)
    if (e->d_name[0] != '.') {
      snprintf(bus, sizeof bus, "%.63s", e->d_name);
      break;
    }
  if (d) closedir(d);
  if (!bus[0]) {
    printf("\n    no PCI devices visible: locality not checked");
    return;
  }
  int n = wl_affinity_plan(bus, 0, 1, cpus, MAXCPU);
  printf("\n    PCI %s: %d local cpus", bus, n);
  CU_ASSERT_TRUE(n >= 1 && n <= all);
  CU_ASSERT_EQUAL(wl_affinity_plan(bus + 5, 0, 1, cpus, MAXCPU), n); /* without the domain */
}

static void test_apply(void) {
  int cpus[MAXCPU];
  int n = wl_affinity_plan(NULL, 1, 2, cpus, MAXCPU);
  CU_ASSERT_TRUE_FATAL(n >= 1);
  fflush(stdout);
  pid_t p = fork();
  if (p == 0) {
    if (wl_affinity_apply(0, cpus, (size_t)n)) _exit(1);
    cpu_set_t set;
    if (sched_getaffinity(0, sizeof set, &set)) _exit(2);
    if (CPU_COUNT(&set) != n) _exit(3);
    for (int i = 0; i < n; i++)
      if (!CPU_ISSET(cpus[i], &set)) _exit(4);
    _exit(0);
  }
  int st;
  waitpid(p, &st, 0);
  CU_ASSERT_TRUE(WIFEXITED(st) && WEXITSTATUS(st) == 0);
  int bad = -1;
  CU_ASSERT_EQUAL(wl_affinity_apply(0, &bad, 1), -EINVAL);
  CU_ASSERT_EQUAL(wl_affinity_apply(0, NULL, 0), -EINVAL);
}

int main(int argc, char **argv) {
  static const wl_test_case_t cases[] = {
      {"machine", test_machine},
      {"synthetic", test_synthetic},
      {"pci", test_pci},
      {"apply", test_apply},
      {NULL, NULL},
  };
  return wl_test_main(argc, argv, "sched_affinity", cases);
}
