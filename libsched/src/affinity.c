/* CPU affinity for the members of a group: the cores near the GPU (from its PCI address, with
 * hwloc, never through CUDA) split into disjoint sets of whole cores, one per member; without a
 * topology, the process's allowed CPUs split the same way. */
#include "internal.h"

#include <dirent.h>
#include <errno.h>
#include <hwloc.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* "0000:3b:00.0" or "3b:00.0" (hex). 0 or -EINVAL. */
static int parse_busid(const char *s, unsigned *dom, unsigned *bus, unsigned *dev, unsigned *func) {
  unsigned a, b, c, d;
  char tail;
  if (sscanf(s, "%x:%x:%x.%x%c", &a, &b, &c, &d, &tail) == 4) {
    *dom = a, *bus = b, *dev = c, *func = d;
  } else if (sscanf(s, "%x:%x.%x%c", &b, &c, &d, &tail) == 3) {
    *dom = 0, *bus = b, *dev = c, *func = d;
  } else {
    return -EINVAL;
  }
  for (const char *p = s; *p; p++)
    if (!((*p >= '0' && *p <= '9') || (*p >= 'a' && *p <= 'f') || (*p >= 'A' && *p <= 'F') ||
          *p == ':' || *p == '.'))
      return -EINVAL;
  if (*dom > 0xffff || *bus > 0xff || *dev > 0x1f || *func > 7) return -EINVAL;
  return 0;
}

/* Checked before any topology is read, so bad input fails alike on every machine; the bus id's
 * fields in bdf (domain, bus, device, function) when there is one. */
static int check_args(const char *pci_bus_id, unsigned index, unsigned count, unsigned bdf[4]) {
  if (count == 0 || index >= count) return -EINVAL;
  if (pci_bus_id && parse_busid(pci_bus_id, &bdf[0], &bdf[1], &bdf[2], &bdf[3])) {
    wl__error("bad PCI bus id '%.32s': expected DDDD:BB:DD.F or BB:DD.F in hex", pci_bus_id);
    return -EINVAL;
  }
  return 0;
}

/* Member index's units [*first, *last) of n: contiguous runs, or one shared unit each when there
 * are more members than units. */
static void split(unsigned n, unsigned index, unsigned count, unsigned *first, unsigned *last) {
  if (count <= n) {
    *first = (unsigned)((uint64_t)index * n / count);
    *last = (unsigned)((uint64_t)(index + 1) * n / count);
  } else {
    wl__warn_once("%u members but only %u cores to place them on: members share cores", count, n);
    *first = index % n;
    *last = *first + 1;
  }
}

/* The cpuset local to the PCI device, or NULL when the device is not found. */
static hwloc_bitmap_t pci_locality(hwloc_topology_t topo, unsigned dom, unsigned bus, unsigned dev,
                                   unsigned func) {
  hwloc_obj_t o = hwloc_get_pcidev_by_busid(topo, dom, bus, dev, func);
  if (o) {
    hwloc_obj_t anc = hwloc_get_non_io_ancestor_obj(topo, o);
    if (anc && anc->cpuset) return hwloc_bitmap_dup(anc->cpuset);
  }
  /* hwloc without its PCI backend: the kernel knows the device's local CPUs too. */
  char path[128];
  snprintf(path, sizeof path, "/sys/bus/pci/devices/%04x:%02x:%02x.%x/local_cpulist", dom, bus, dev,
           func);
  FILE *f = fopen(path, "re");
  if (!f) return NULL;
  char list[1024];
  hwloc_bitmap_t set = NULL;
  if (fgets(list, sizeof list, f)) {
    set = hwloc_bitmap_alloc();
    if (set && hwloc_bitmap_list_sscanf(set, list) != 0) {
      hwloc_bitmap_free(set);
      set = NULL;
    }
  }
  fclose(f);
  return set;
}

/* The plan on a loaded topology: shared by the public function and the tests. */
int wl__affinity_plan_topo(void *topology, const char *pci_bus_id, unsigned index, unsigned count,
                           int *cpus, size_t cap) {
  hwloc_topology_t topo = topology;
  unsigned bdf[4] = {0};
  int rc = check_args(pci_bus_id, index, count, bdf);
  if (rc) return rc;
  hwloc_bitmap_t region = hwloc_bitmap_dup(hwloc_topology_get_allowed_cpuset(topo));
  if (!region) return -ENOMEM;
  if (pci_bus_id) {
    hwloc_bitmap_t local = pci_locality(topo, bdf[0], bdf[1], bdf[2], bdf[3]);
    if (local) {
      hwloc_bitmap_and(local, local, region);
      if (!hwloc_bitmap_iszero(local)) {
        hwloc_bitmap_free(region);
        region = local;
      } else {
        hwloc_bitmap_free(local);
      }
    } else {
      wl__warn_once("no PCI device at %s; spreading members over all cores", pci_bus_id);
    }
  }
  int ncores = hwloc_get_nbobjs_inside_cpuset_by_type(topo, region, HWLOC_OBJ_CORE);
  hwloc_obj_type_t unit = HWLOC_OBJ_CORE;
  if (ncores <= 0) {
    unit = HWLOC_OBJ_PU;
    ncores = hwloc_get_nbobjs_inside_cpuset_by_type(topo, region, HWLOC_OBJ_PU);
  }
  if (ncores <= 0) {
    hwloc_bitmap_free(region);
    return -ENODEV;
  }
  /* Contiguous runs of cores: neighbours in hwloc's order share caches and NUMA nodes. */
  unsigned first, last;
  split((unsigned)ncores, index, count, &first, &last);
  hwloc_bitmap_t mine = hwloc_bitmap_alloc();
  for (unsigned k = first; k < last; k++) {
    hwloc_obj_t o = hwloc_get_obj_inside_cpuset_by_type(topo, region, unit, k);
    if (o && o->cpuset) hwloc_bitmap_or(mine, mine, o->cpuset);
  }
  hwloc_bitmap_and(mine, mine, region);
  int total = 0;
  int id;
  hwloc_bitmap_foreach_begin(id, mine) {
    if ((size_t)total < cap) cpus[total] = id;
    total++;
  }
  hwloc_bitmap_foreach_end();
  hwloc_bitmap_free(mine);
  hwloc_bitmap_free(region);
  return total;
}

/* The plan without hwloc: every CPU this thread may run on is its own core, all in one NUMA node,
 * with no PCI locality. Coarser, but members still get disjoint CPUs within the allowed ones. */
static int plan_flat(const char *why, unsigned index, unsigned count, int *cpus, size_t cap) {
  cpu_set_t *set;
  size_t ncpu = 1024, sz;
  for (;;) {
    set = CPU_ALLOC(ncpu);
    if (!set) return -ENOMEM;
    sz = CPU_ALLOC_SIZE(ncpu);
    if (sched_getaffinity(0, sz, set) == 0) break;
    int err = errno;
    CPU_FREE(set);
    /* EINVAL: the kernel's mask is wider than ours. */
    if (err != EINVAL || ncpu >= (size_t)1 << 20) return -err;
    ncpu *= 2;
  }
  int n = CPU_COUNT_S(sz, set);
  if (n <= 0) {
    CPU_FREE(set);
    return -ENODEV;
  }
  /* Info, not a warning: in a sandbox this is the best placement there is. */
  wl__info_once("%s: placing members on the %d CPUs this process may use, each as its own core, "
                "without NUMA or PCI locality",
                why, n);
  unsigned first, last, k = 0;
  split((unsigned)n, index, count, &first, &last);
  int total = 0;
  for (size_t c = 0; c < sz * 8 && k < last; c++) {
    if (!CPU_ISSET_S(c, sz, set)) continue;
    if (k++ < first) continue;
    if ((size_t)total < cap) cpus[total] = (int)c;
    total++;
  }
  CPU_FREE(set);
  return total;
}

int wl__affinity_plan_synthetic(const char *desc, unsigned index, unsigned count, int *cpus,
                                size_t cap) {
  hwloc_topology_t topo;
  if (hwloc_topology_init(&topo)) return -ENOMEM;
  int rc = -EINVAL;
  if (hwloc_topology_set_synthetic(topo, desc) == 0 && hwloc_topology_load(topo) == 0)
    rc = wl__affinity_plan_topo(topo, NULL, index, count, cpus, cap);
  hwloc_topology_destroy(topo);
  return rc;
}

int wl_affinity_plan(const char *pci_bus_id, unsigned index, unsigned count, int *cpus,
                     size_t cap) {
  if (!cpus && cap) return -EINVAL;
  unsigned bdf[4];
  int rc = check_args(pci_bus_id, index, count, bdf);
  if (rc) return rc;
  /* Without sysfs's CPU topology (gVisor hides it) hwloc's Linux discovery fails and prints a
   * line of its own on stderr, in the middle of the programs' output: not asked. Unless hwloc is
   * told to read its topology from elsewhere. */
  if (!getenv("HWLOC_XMLFILE") && !getenv("HWLOC_SYNTHETIC") && !getenv("HWLOC_FSROOT") &&
      access("/sys/devices/system/cpu/cpu0/topology", F_OK) != 0)
    return plan_flat("this machine shows no CPU topology in sysfs", index, count, cpus, cap);
  hwloc_topology_t topo;
  if (hwloc_topology_init(&topo)) return -ENOMEM;
  /* PCI objects only when asked for: I/O discovery costs time. */
  if (pci_bus_id) hwloc_topology_set_io_types_filter(topo, HWLOC_TYPE_FILTER_KEEP_IMPORTANT);
  if (hwloc_topology_load(topo)) {
    /* Sandboxes such as gVisor hide sysfs, and hwloc then has nothing to read. */
    char why[96];
    snprintf(why, sizeof why, "hwloc cannot read this machine's topology (%s)", strerror(errno));
    hwloc_topology_destroy(topo);
    return plan_flat(why, index, count, cpus, cap);
  }
  rc = wl__affinity_plan_topo(topo, pci_bus_id, index, count, cpus, cap);
  hwloc_topology_destroy(topo);
  if (rc == -ENODEV) rc = plan_flat("hwloc found no usable cores", index, count, cpus, cap);
  return rc;
}

static int set_one(pid_t tid, const int *cpus, size_t n) {
  int max = 0;
  for (size_t i = 0; i < n; i++) {
    if (cpus[i] < 0 || cpus[i] >= 1 << 20) return -EINVAL;
    if (cpus[i] > max) max = cpus[i];
  }
  size_t ncpu = (size_t)max + 1;
  cpu_set_t *set = CPU_ALLOC(ncpu);
  if (!set) return -ENOMEM;
  size_t sz = CPU_ALLOC_SIZE(ncpu);
  CPU_ZERO_S(sz, set);
  for (size_t i = 0; i < n; i++) CPU_SET_S((size_t)cpus[i], sz, set);
  int rc = sched_setaffinity(tid, sz, set) == 0 ? 0 : -errno;
  CPU_FREE(set);
  return rc;
}

int wl_affinity_apply(pid_t pid, const int *cpus, size_t n) {
  if (!cpus || n == 0) return -EINVAL;
  if (pid != 0) return set_one(pid, cpus, n);
  /* Every thread of this process: sched_setaffinity changes one thread only. */
  DIR *d = opendir("/proc/self/task");
  if (!d) return set_one(0, cpus, n);
  int rc = 0;
  struct dirent *e;
  while ((e = readdir(d)) != NULL) {
    if (e->d_name[0] < '0' || e->d_name[0] > '9') continue;
    int r = set_one((pid_t)atoi(e->d_name), cpus, n);
    if (r && r != -ESRCH && !rc) rc = r; /* a thread that just exited does not count */
  }
  closedir(d);
  return rc;
}
