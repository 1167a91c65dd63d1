/* CPU affinity plans: disjoint sets of whole cores per member, on this machine and on synthetic
 * topologies; locality from a PCI address (or a clear fallback); bad input; applying a plan; the
 * plan over the allowed CPUs when hwloc cannot read the topology. */
#include "internal.h"
#include "wltest.h"

#include <dirent.h>
#include <hwloc.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
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

/* The CPUs this thread may use, ascending; how many. */
static int allowed_cpus(int *out, int cap) {
  cpu_set_t set;
  if (sched_getaffinity(0, sizeof set, &set)) return -1;
  int n = 0;
  for (int c = 0; c < CPU_SETSIZE && n < cap; c++)
    if (CPU_ISSET(c, &set)) out[n++] = c;
  return n;
}

static bool contains(const int *a, int n, int x) {
  for (int i = 0; i < n; i++)
    if (a[i] == x) return true;
  return false;
}

/* Members 0..count-1 of the plan: together exactly the allowed CPUs, disjoint, each with an even
 * share (the fallback has no topology to prefer one CPU to another). */
static void check_spread(const int *allowed, int na, unsigned count) {
  static int plan[MAXCPU], seen[MAXCPU];
  int total = 0;
  for (unsigned i = 0; i < count; i++) {
    int n = wl_affinity_plan(NULL, i, count, plan, MAXCPU);
    CU_ASSERT_TRUE(n == na / (int)count || n == (na + (int)count - 1) / (int)count);
    for (int k = 0; k < n; k++) {
      CU_ASSERT_TRUE(contains(allowed, na, plan[k]));
      CU_ASSERT_FALSE(contains(seen, total, plan[k]));
      if (total < MAXCPU) seen[total++] = plan[k];
    }
  }
  CU_ASSERT_EQUAL(total, na);
}

/* The plans with the topology unreadable. No FATAL asserts: the caller restores the environment. */
static void fallback_cases(void) {
  static int allowed[MAXCPU], plan[MAXCPU];
  cpu_set_t saved;
  int na = allowed_cpus(allowed, MAXCPU);
  CU_ASSERT_TRUE(na >= 1);
  if (na < 1 || sched_getaffinity(0, sizeof saved, &saved)) return;
  /* Bad input is still refused before the topology is read. */
  CU_ASSERT_EQUAL(wl_affinity_plan("zz:qq", 0, 1, plan, MAXCPU), -EINVAL);
  CU_ASSERT_EQUAL(wl_affinity_plan("0000:00:00.9", 0, 1, plan, MAXCPU), -EINVAL);
  CU_ASSERT_EQUAL(wl_affinity_plan(NULL, 1, 1, plan, MAXCPU), -EINVAL);
  /* One member: every allowed CPU, ascending; a PCI address changes nothing (no locality). */
  CU_ASSERT_EQUAL(wl_affinity_plan(NULL, 0, 1, plan, MAXCPU), na);
  CU_ASSERT_EQUAL(memcmp(plan, allowed, (size_t)na * sizeof *plan), 0);
  CU_ASSERT_EQUAL(wl_affinity_plan("0000:fe:1f.7", 0, 1, plan, MAXCPU), na);
  check_spread(allowed, na, 2);
  check_spread(allowed, na, (unsigned)na); /* one CPU each */
  /* More members than CPUs: one CPU each, shared. */
  CU_ASSERT_EQUAL(wl_affinity_plan(NULL, (unsigned)na, (unsigned)na + 1, plan, MAXCPU), 1);
  CU_ASSERT_EQUAL(plan[0], allowed[0]);
  /* Only allowed CPUs, not all online ones: drop the lowest (where there is another). */
  if (na >= 2) {
    cpu_set_t fewer = saved;
    CPU_CLR(allowed[0], &fewer);
    CU_ASSERT_EQUAL(sched_setaffinity(0, sizeof fewer, &fewer), 0);
    int n = wl_affinity_plan(NULL, 0, 1, plan, MAXCPU);
    CU_ASSERT_EQUAL(n, na - 1);
    CU_ASSERT_FALSE(contains(plan, n > 0 ? n : 0, allowed[0]));
    check_spread(allowed + 1, na - 1, na - 1 >= 2 ? 2 : 1);
    CU_ASSERT_EQUAL(sched_setaffinity(0, sizeof saved, &saved), 0);
  }
  printf("\n    without a topology: %d allowed cpus", na);
}

/* hwloc's own HWLOC_XMLFILE pointed at a file that is not XML: the topology fails to load, as it
 * does where sysfs is hidden (gVisor), and the plan must fall back to the allowed CPUs. */
static void test_fallback(void) {
  char path[] = "/tmp/wltest-hwloc-XXXXXX";
  int fd = mkstemp(path);
  CU_ASSERT_TRUE_FATAL(fd >= 0);
  CU_ASSERT_EQUAL(write(fd, "not xml\n", 8), 8);
  close(fd);
  setenv("HWLOC_XMLFILE", path, 1);
  hwloc_topology_t topo;
  bool unreadable = false;
  if (hwloc_topology_init(&topo) == 0) {
    unreadable = hwloc_topology_load(topo) != 0;
    hwloc_topology_destroy(topo);
  }
  if (unreadable)
    fallback_cases();
  else
    CU_FAIL("hwloc loaded a topology from a file that is not XML: the fallback is not reached");
  unsetenv("HWLOC_XMLFILE");
  unlink(path);
}

int main(int argc, char **argv) {
  static const wl_test_case_t cases[] = {
      {"machine", test_machine}, {"synthetic", test_synthetic}, {"pci", test_pci},
      {"apply", test_apply},     {"fallback", test_fallback},   {NULL, NULL},
  };
  return wl_test_main(argc, argv, "sched_affinity", cases);
}
