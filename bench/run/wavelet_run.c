/* wavelet-run: starts K co-located replicas of a command on one GPU with the interposer, a group,
 * roles, CPU placement and prefixed output, or under torchrun sets up this rank and execs. */
#include "launch.h"
#include "log.h"
#include "report.h"
#include "util.h"
#include "wavelet/sched.h"

#include <ctype.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

static const char usage_line[] =
    "usage: wavelet-run -n K [--gpu ID] [--mem-limit B] [--trace-dir DIR] "
    "[--mode off|trace|alloc|gate] [--group NAME] [--preload PATH] -- CMD...\n"
    "       wavelet-run --groups [--json] [--prune] [NAME...]";

static int bad(const char *fmt, const char *arg) {
  fprintf(stderr, "wavelet-run: ");
  fprintf(stderr, fmt, arg);
  fprintf(stderr, "\n%s\n", usage_line);
  return 2;
}

typedef struct opts_s {
  unsigned k; /* 0: not given */
  const char *gpu, *mem_limit, *trace_dir, *mode, *group, *preload;
  char **cmd;
} opts_t;

static int parse_uint(const char *s, unsigned lo, unsigned hi, unsigned *out) {
  char *end;
  errno = 0;
  unsigned long v = strtoul(s, &end, 10);
  if (!isdigit((unsigned char)s[0]) || *end || errno || v < lo || v > hi) return -EINVAL;
  *out = (unsigned)v;
  return 0;
}

/* WAVELET_MEM_LIMIT's forms: a size with K/M/G/T, or N% of the device. */
static int mem_limit_valid(const char *s) {
  size_t n = strlen(s), v;
  if (n > 1 && s[n - 1] == '%') {
    unsigned p;
    char num[16];
    if (n - 1 >= sizeof num) return 0;
    memcpy(num, s, n - 1);
    num[n - 1] = 0;
    return parse_uint(num, 1, 100, &p) == 0;
  }
  return wl__parse_size(s, 0, &v) == 0 && v > 0;
}

static int parse_args(int argc, char **argv, opts_t *o) {
  memset(o, 0, sizeof *o);
  o->mode = "gate";
  int i = 1;
  for (; i < argc; i++) {
    const char *a = argv[i];
    if (!strcmp(a, "--")) {
      i++;
      break;
    }
    if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
      printf("%s\n", usage_line);
      exit(0);
    }
    static const char *const with_value[] = {"-n",     "--gpu",   "--mem-limit", "--trace-dir",
                                             "--mode", "--group", "--preload"};
    size_t w = 0;
    for (; w < sizeof with_value / sizeof with_value[0]; w++)
      if (!strcmp(a, with_value[w])) break;
    if (w == sizeof with_value / sizeof with_value[0]) {
      if (a[0] == '-') return bad("unknown option '%s'", a);
      break; /* the command, without "--" */
    }
    if (i + 1 >= argc) return bad("%s needs a value", a);
    const char *v = argv[++i];
    switch (w) {
    case 0:
      if (parse_uint(v, 1, WL_SCHED_MAX_MEMBERS, &o->k))
        return bad("-n wants a replica count from 1 to 64, not '%s'", v);
      break;
    case 1:
      if (!*v || strchr(v, ','))
        return bad("--gpu wants one GPU (an index or a UUID), not '%s'", v);
      o->gpu = v;
      break;
    case 2:
      if (!mem_limit_valid(v))
        return bad("--mem-limit wants a size such as 40G or a percentage such as 90%%, not '%s'",
                   v);
      o->mem_limit = v;
      break;
    case 3:
      if (!*v) return bad("--trace-dir wants a directory%s", "");
      /* WAVELET_TRACE gives '%' a meaning (%p, the process id), so a path with one cannot be
       * handed on as it is. */
      if (strchr(v, '%')) return bad("--trace-dir wants a directory without '%%', not '%s'", v);
      o->trace_dir = v;
      break;
    case 4:
      if (!wll_mode_valid(v)) return bad("--mode wants off, trace, alloc or gate, not '%s'", v);
      o->mode = v;
      break;
    case 5:
      if (wl_sched_group_name_check(v))
        return bad("--group wants 1 to 48 of [A-Za-z0-9._-], not starting with '.' or '-': '%s'",
                   v);
      o->group = v;
      break;
    default:
      o->preload = v;
      break;
    }
  }
  if (i >= argc) return bad("no command to run%s", "");
  o->cmd = argv + i;
  return 0;
}

/* ---- the GPU's PCI address, for CPU placement (sysfs and the driver's /proc, never CUDA) -----*/

static int cmp_str(const void *a, const void *b) {
  return strcmp(*(char *const *)a, *(char *const *)b);
}

static int read_hex(const char *path, unsigned long *v) {
  FILE *f = fopen(path, "re");
  if (!f) return -1;
  int ok = fscanf(f, "%lx", v) == 1;
  fclose(f);
  return ok ? 0 : -1;
}

/* The NVIDIA display and 3D controllers in PCI order, which is nvidia-smi's order and CUDA's
 * with CUDA_DEVICE_ORDER=PCI_BUS_ID. */
static int gpu_by_index(unsigned idx, char *bus, size_t len) {
  DIR *d = opendir("/sys/bus/pci/devices");
  if (!d) return -ENOENT;
  char *names[256];
  size_t n = 0;
  struct dirent *e;
  while ((e = readdir(d)) != NULL && n < 256) {
    if (e->d_name[0] == '.') continue;
    char p[512];
    unsigned long vendor = 0, cls = 0;
    snprintf(p, sizeof p, "/sys/bus/pci/devices/%s/vendor", e->d_name);
    if (read_hex(p, &vendor) || vendor != 0x10de) continue;
    snprintf(p, sizeof p, "/sys/bus/pci/devices/%s/class", e->d_name);
    if (read_hex(p, &cls) || (cls >> 16) != 0x03) continue;
    names[n] = strdup(e->d_name);
    if (names[n]) n++;
  }
  closedir(d);
  qsort(names, n, sizeof names[0], cmp_str);
  int rc = -ENOENT;
  if (idx < n) {
    snprintf(bus, len, "%s", names[idx]);
    rc = 0;
  }
  for (size_t i = 0; i < n; i++) free(names[i]);
  return rc;
}

/* The driver lists each GPU's UUID in /proc/driver/nvidia/gpus/BUSID/information. */
static int gpu_by_uuid(const char *uuid, char *bus, size_t len) {
  DIR *d = opendir("/proc/driver/nvidia/gpus");
  if (!d) return -ENOENT;
  struct dirent *e;
  int rc = -ENOENT;
  while (rc && (e = readdir(d)) != NULL) {
    if (e->d_name[0] == '.') continue;
    char p[512], line[256];
    snprintf(p, sizeof p, "/proc/driver/nvidia/gpus/%s/information", e->d_name);
    FILE *f = fopen(p, "re");
    if (!f) continue;
    while (fgets(line, sizeof line, f))
      if (!strncmp(line, "GPU UUID:", 9) && strstr(line, uuid)) {
        snprintf(bus, len, "%.*s", (int)(len > 1 ? len - 1 : 0), e->d_name);
        rc = 0;
        break;
      }
    fclose(f);
  }
  closedir(d);
  return rc;
}

/* The PCI address of the GPU the replicas use, or "" when unknown (then the cores are split). */
static void gpu_bus(const char *gpu, char *bus, size_t len) {
  bus[0] = 0;
  if (!gpu) return;
  unsigned idx;
  int rc = parse_uint(gpu, 0, 255, &idx) == 0 ? gpu_by_index(idx, bus, len)
           : !strncmp(gpu, "GPU-", 4)         ? gpu_by_uuid(gpu, bus, len)
                                              : -ENOENT;
  if (rc) {
    bus[0] = 0;
    wl__warn("wavelet-run: cannot find GPU %s's PCI address; the replicas are placed on all cores",
             gpu);
  }
}

/* ---- the group name --------------------------------------------------------------------------*/

static uint64_t fnv(uint64_t h, const char *s) {
  for (; s && *s; s++) h = (h ^ (unsigned char)*s) * 1099511628211ull;
  return h ^ 0xff;
}

/* torchrun's ranks on this node run one wavelet-run each: they must agree on a name without
 * talking, so it comes from what torchrun gives them all. */
static void torchrun_group(char *buf, size_t len) {
  const char *vars[] = {"TORCHELASTIC_RUN_ID", "MASTER_ADDR", "MASTER_PORT", "GROUP_RANK",
                        "TORCHELASTIC_RESTART_COUNT"};
  uint64_t h = 1469598103934665603ull;
  int any = 0;
  for (size_t i = 0; i < sizeof vars / sizeof vars[0]; i++) {
    const char *v = getenv(vars[i]);
    any |= v != NULL;
    h = fnv(h, v);
  }
  if (!any) { /* not really torchrun: its ranks share the parent process */
    char pp[32];
    snprintf(pp, sizeof pp, "%d", (int)getppid());
    h = fnv(h, pp);
  }
  snprintf(buf, len, "wr-torch-%016llx", (unsigned long long)h);
}

static void fresh_group(char *buf, size_t len) {
  struct timespec ts;
  clock_gettime(CLOCK_REALTIME, &ts);
  uint64_t h = fnv(1469598103934665603ull, "wavelet-run");
  h ^= (uint64_t)ts.tv_nsec * 0x9e3779b97f4a7c15ull;
  snprintf(buf, len, "wr-%d-%08llx", (int)getpid(), (unsigned long long)(h >> 32));
}

/* ---- setup shared by both modes ----------------------------------------------------------*/

static int setup_env(const opts_t *o, unsigned k, const char *group) {
  char preload[PATH_MAX], err[2048];
  const char *pre = NULL;
  if (wll_mode_needs_preload(o->mode) || o->preload) {
    if (wll_find_preload(o->preload, preload, sizeof preload, err, sizeof err)) {
      wl__error("wavelet-run: mode '%s' needs libwavelet.so and none was found (%s); build the "
                "'wavelet' target, or give --preload PATH or WAVELET_PRELOAD, or use --mode off",
                o->mode, err);
      return 1;
    }
    pre = preload;
  }
  int rc = wll_env_common("wavelet-run", o->mode, pre);
  char kbuf[16];
  snprintf(kbuf, sizeof kbuf, "%u", k);
  /* libsched takes 2 to 64 waves; one replica is simply not grouped with others. */
  if (!rc && k >= 2 && setenv("WAVELET_WAVES", kbuf, 1)) rc = -errno;
  if (!rc && setenv("WAVELET_GROUP", group, 1)) rc = -errno;
  if (!rc && o->mem_limit && setenv("WAVELET_MEM_LIMIT", o->mem_limit, 1)) rc = -errno;
  if (!rc && o->gpu) {
    if (setenv("CUDA_VISIBLE_DEVICES", o->gpu, 1)) rc = -errno;
    const char *order = getenv("CUDA_DEVICE_ORDER");
    if (!order) {
      if (setenv("CUDA_DEVICE_ORDER", "PCI_BUS_ID", 1)) rc = -errno;
    } else if (strcmp(order, "PCI_BUS_ID") != 0) {
      wl__warn("wavelet-run: CUDA_DEVICE_ORDER=%s: --gpu %s is taken in PCI order for CPU "
               "placement, which may be another GPU",
               order, o->gpu);
    }
  }
  if (rc) {
    wl__error("wavelet-run: cannot set the environment: %s", strerror(-rc));
    return 1;
  }
  return 0;
}

static int make_dir(const char *dir) {
  char p[PATH_MAX];
  if (snprintf(p, sizeof p, "%s", dir) >= (int)sizeof p) return -ENAMETOOLONG;
  for (char *s = p + 1; *s; s++) {
    if (*s != '/') continue;
    *s = 0;
    if (mkdir(p, 0755) && errno != EEXIST) return -errno;
    *s = '/';
  }
  if (mkdir(p, 0755) && errno != EEXIST) return -errno;
  struct stat st;
  if (stat(p, &st) || !S_ISDIR(st.st_mode)) return -ENOTDIR;
  return 0;
}

static void trace_path(char *buf, size_t len, const char *dir, unsigned role) {
  snprintf(buf, len, "%s/replica-%u.wlt", dir, role);
}

/* Under torchrun: this rank's environment, then exec. */
static int torchrun_main(const opts_t *o, const char *local_rank) {
  unsigned role, k = o->k;
  if (parse_uint(local_rank, 0, WL_SCHED_MAX_MEMBERS - 1, &role)) {
    wl__error("wavelet-run: LOCAL_RANK=%s: expected a rank from 0 to 63", local_rank);
    return 2;
  }
  if (!k) {
    const char *lws = getenv("LOCAL_WORLD_SIZE");
    if (!lws || parse_uint(lws, 1, WL_SCHED_MAX_MEMBERS, &k)) {
      wl__error("wavelet-run: under torchrun (LOCAL_RANK set) it needs -n K or LOCAL_WORLD_SIZE "
                "(1 to 64); LOCAL_WORLD_SIZE=%s",
                lws ? lws : "(unset)");
      return 2;
    }
  }
  if (role >= k) {
    wl__error("wavelet-run: LOCAL_RANK=%u is not below the replica count %u", role, k);
    return 2;
  }
  char group[WL_SCHED_GROUP_MAX + 1];
  if (o->group)
    snprintf(group, sizeof group, "%s", o->group);
  else
    torchrun_group(group, sizeof group);
  if (setup_env(o, k, group)) return 1;
  char rbuf[16];
  snprintf(rbuf, sizeof rbuf, "%u", role);
  setenv("WAVELET_ROLE", rbuf, 1);
  if (o->trace_dir) {
    int rc = make_dir(o->trace_dir);
    if (rc) {
      wl__error("wavelet-run: --trace-dir %s: %s", o->trace_dir, strerror(-rc));
      return 1;
    }
    char tp[PATH_MAX];
    trace_path(tp, sizeof tp, o->trace_dir, role);
    setenv("WAVELET_TRACE", tp, 1);
  }
  char bus[64];
  const char *cvd = getenv("CUDA_VISIBLE_DEVICES");
  gpu_bus(o->gpu ? o->gpu : (cvd && *cvd && !strchr(cvd, ',') ? cvd : NULL), bus, sizeof bus);
  int cpus[1024];
  int n = wl_affinity_plan(bus[0] ? bus : NULL, role, k, cpus, 1024);
  if (n > 0) {
    int rc = wl_affinity_apply(0, cpus, (size_t)(n < 1024 ? n : 1024));
    if (rc) wl__warn("wavelet-run: cannot bind rank %u to its CPUs: %s", role, strerror(-rc));
  }
  fflush(NULL);
  execvp(o->cmd[0], o->cmd);
  int e = errno;
  wl__error("wavelet-run: cannot run '%s': %s", o->cmd[0], strerror(e));
  return e == ENOENT ? 127 : 126;
}

/* ---- --groups: the groups on this machine, as they are now -------------------------------*/

static void print_group(const wl_sched_group_info_t *g, const wl_sched_member_t *m, int n) {
  char a[32], b[32], d[32];
  bool named = g->gpu[0] && strcmp(g->gpu, g->group); /* a derived name is the GPU's already */
  printf("group %s%s%s: %u member%s, %u waves, budget %s, used %s, token %s", g->group,
         named ? " on " : "", named ? g->gpu : "", g->members, g->members == 1 ? "" : "s", g->waves,
         g->limit ? wl__fmt_bytes(g->limit, a, sizeof a) : "none",
         wl__fmt_bytes(g->used, b, sizeof b), g->token_role >= 0 ? "held" : "free");
  if (g->token_role >= 0) printf(" by role %d", g->token_role);
  if (g->dead) printf(", %u dead not yet reclaimed", g->dead);
  printf("\n");
  if (n <= 0) return;
  printf("  %4s %8s %-9s %10s %10s  %s\n", "role", "pid", "phase", "physical", "live", "state");
  for (int i = 0; i < n; i++) {
    const char *state = m[i].holds_token    ? "holds the token"
                        : m[i].waiting_gate ? "waits at the gate"
                                            : "";
    char wait[64] = "";
    if (m[i].waiting_bytes)
      snprintf(wait, sizeof wait, "waits for %s", wl__fmt_bytes(m[i].waiting_bytes, d, sizeof d));
    printf("  %4d %8d %-9s %10s %10s  %s%s%s\n", m[i].role, (int)m[i].pid,
           wl_phase_name((wl_phase_kind_t)m[i].phase),
           wl__fmt_bytes(m[i].physical_bytes, a, sizeof a),
           wl__fmt_bytes(m[i].live_bytes, b, sizeof b), state, *state && *wait ? ", " : "", wait);
  }
}

static void json_group(const wl_sched_group_info_t *g, const wl_sched_member_t *m, int n) {
  printf("{\"group\":\"%s\",\"gpu\":\"%s\",\"waves\":%u,\"limit_bytes\":%zu,\"used_bytes\":%zu,"
         "\"token_role\":%d,\"live_members\":%u,\"dead\":%u,\"grants\":%llu,\"revocations\":%llu,"
         "\"denials\":%llu,\"deadlocks\":%llu,\"members\":[",
         g->group, g->gpu, g->waves, g->limit, g->used, g->token_role, g->members, g->dead,
         (unsigned long long)g->grants, (unsigned long long)g->revocations,
         (unsigned long long)g->denials, (unsigned long long)g->deadlocks);
  for (int i = 0; i < n; i++)
    printf("%s{\"role\":%d,\"pid\":%d,\"phase\":\"%s\",\"physical_bytes\":%zu,\"live_bytes\":%zu,"
           "\"waiting_bytes\":%zu,\"waiting_gate\":%s,\"holds_token\":%s}",
           i ? "," : "", m[i].role, (int)m[i].pid, wl_phase_name((wl_phase_kind_t)m[i].phase),
           m[i].physical_bytes, m[i].live_bytes, m[i].waiting_bytes,
           m[i].waiting_gate ? "true" : "false", m[i].holds_token ? "true" : "false");
  printf("]}");
}

static int json_out, json_count; /* --json: the groups printed so far */

/* One group; 0, or 1 when it cannot be read (said on stderr). Found by listing (listed), a group
 * gone meanwhile, another user's (its segment is theirs alone) or one being made is passed over
 * in silence, as --prune passes them: a machine's listing is not a failure for them. */
static int show_group(const char *name, int listed) {
  wl_sched_group_info_t g;
  wl_sched_member_t m[WL_SCHED_MAX_MEMBERS];
  int n = wl_sched_inspect(name, &g, m, WL_SCHED_MAX_MEMBERS);
  if (listed && (n == -ENOENT || n == -EACCES || n == -EBADMSG)) return 0;
  if (n < 0) {
    const char *why = n == -EPROTO    ? "it uses another layout version than this wavelet-run"
                      : n == -EBADMSG ? "it is not a group segment of ours, or is being made"
                                      : strerror(-n);
    fprintf(stderr, "wavelet-run: group %s: %s\n", name, why);
    return 1;
  }
  /* Whatever a member wrote there, only a UUID's characters are shown. */
  for (char *c = g.gpu; *c; c++)
    if (!isalnum((unsigned char)*c) && *c != '-') *c = '?';
  if (json_out) {
    if (json_count++) printf(",");
    json_group(&g, m, n < WL_SCHED_MAX_MEMBERS ? n : WL_SCHED_MAX_MEMBERS);
  } else {
    if (json_count++) printf("\n");
    print_group(&g, m, n < WL_SCHED_MAX_MEMBERS ? n : WL_SCHED_MAX_MEMBERS);
  }
  return 0;
}

/* --prune: removes one group if none of its members is alive; 0, or 1 when a named one is kept
 * or cannot be removed (said on stderr). Groups found by listing that are alive, or another
 * user's, are passed over in silence. */
static int prune_group(const char *name, int named) {
  int rc = wl_sched_group_prune(name);
  if (rc == 0) {
    if (json_out)
      printf("%s\"%s\"", json_count++ ? "," : "", name);
    else
      printf("removed group %s: no member alive\n", name), json_count++;
    return 0;
  }
  if (!named && (rc == -EBUSY || rc == -EACCES || rc == -ENOENT)) return 0;
  fprintf(stderr, "wavelet-run: group %s: %s\n", name,
          rc == -EBUSY ? "kept: a member is alive (or joining or leaving)" : strerror(-rc));
  return 1;
}

/* Every group on this machine (their segments under /dev/shm), or the named ones: shown, or
 * with --prune removed when no member is alive. */
static int groups_main(int argc, char **argv) {
  int rc = 0, prune = 0;
  for (; argc && (!strcmp(argv[0], "--json") || !strcmp(argv[0], "--prune")); argc--, argv++)
    *(argv[0][2] == 'j' ? &json_out : &prune) = 1;
  for (int i = 0; i < argc; i++)
    if (wl_sched_group_name_check(argv[i]))
      return bad("--groups wants group names (1 to 48 of [A-Za-z0-9._-]), not '%s'", argv[i]);
  if (json_out) printf(prune ? "{\"removed\":[" : "{\"groups\":[");
  if (argc) {
    for (int i = 0; i < argc; i++) rc |= prune ? prune_group(argv[i], 1) : show_group(argv[i], 0);
  } else {
    DIR *dir = opendir("/dev/shm");
    if (!dir) {
      fprintf(stderr, "wavelet-run: cannot read /dev/shm: %s\n", strerror(errno));
      rc = 1;
    }
    for (struct dirent *de; dir && (de = readdir(dir)) != NULL;) {
      const char *g = de->d_name;
      if (!strncmp(g, "wavelet-", 8) && !wl_sched_group_name_check(g + 8))
        rc |= prune ? prune_group(g + 8, 0) : show_group(g + 8, 1);
    }
    if (dir) closedir(dir);
    if (!json_count && !json_out && !rc) printf(prune ? "no group to remove\n" : "no groups\n");
  }
  if (json_out) printf("]}\n");
  return rc;
}

int main(int argc, char **argv) {
  if (argc >= 2 && !strcmp(argv[1], "--groups")) return groups_main(argc - 2, argv + 2);
  opts_t o;
  int rc = parse_args(argc, argv, &o);
  if (rc) return rc;
  const char *local_rank = getenv("LOCAL_RANK");
  if (local_rank && *local_rank) return torchrun_main(&o, local_rank);
  if (!o.k) return bad("-n K is required (the number of replicas)%s", "");
  unsigned k = o.k;

  char group[WL_SCHED_GROUP_MAX + 1];
  if (o.group)
    snprintf(group, sizeof group, "%s", o.group);
  else
    fresh_group(group, sizeof group);
  if (setup_env(&o, k, group)) return 1;
  if (o.trace_dir) {
    rc = make_dir(o.trace_dir);
    if (rc) {
      wl__error("wavelet-run: --trace-dir %s: %s", o.trace_dir, strerror(-rc));
      return 1;
    }
  }

  /* Placement: whole cores near the GPU, one disjoint share per replica. */
  char bus[64];
  const char *cvd = getenv("CUDA_VISIBLE_DEVICES");
  gpu_bus(o.gpu ? o.gpu : (cvd && *cvd && !strchr(cvd, ',') ? cvd : NULL), bus, sizeof bus);
  wll_child_t *child = calloc(k, sizeof *child);
  int(*cpus)[1024] = calloc(k, sizeof *cpus);
  char(*envs)[3][PATH_MAX + 32] = calloc(k, sizeof *envs);
  char **traces = calloc(k, sizeof *traces);
  if (!child || !cpus || !envs || !traces) {
    wl__error("wavelet-run: out of memory");
    return 1;
  }
  for (unsigned r = 0; r < k; r++) {
    wll_child_t *c = &child[r];
    c->role = (int)r;
    int n = wl_affinity_plan(bus[0] ? bus : NULL, r, k, cpus[r], 1024);
    if (n > 0) {
      c->cpus = cpus[r];
      c->ncpus = (size_t)(n < 1024 ? n : 1024);
    }
    size_t e = 0;
    snprintf(envs[r][e], sizeof envs[r][e], "WAVELET_ROLE=%u", r);
    c->env[e] = envs[r][e];
    e++;
    if (o.trace_dir) {
      char tp[PATH_MAX];
      trace_path(tp, sizeof tp, o.trace_dir, r);
      char rings[PATH_MAX + 8];
      snprintf(rings, sizeof rings, "%s%s", tp, WL_TRACE_RINGS_SUFFIX);
      unlink(tp); /* a previous run's trace must not pass for this one's */
      unlink(rings);
      snprintf(envs[r][e], sizeof envs[r][e], "WAVELET_TRACE=%s", tp);
      c->env[e] = envs[r][e];
      traces[r] = envs[r][e] + strlen("WAVELET_TRACE=");
      e++;
    }
    c->env[e] = NULL;
  }

  wll_run_t run = {.tool = "wavelet-run", .argv = o.cmd, .child = child, .n = k, .prefix = 1};
  int status = wll_run(&run);
  if (status < 0) {
    wl__error("wavelet-run: cannot start '%s': %s", o.cmd[0], strerror(-status));
    status = 1;
  } else if (run.first_failed >= 0) {
    const wll_child_t *c = &child[run.first_failed];
    if (c->signal)
      wl__error("wavelet-run: replica %d (pid %d) was killed by signal %d (%s); exit status %d",
                c->role, (int)c->pid, c->signal, strsignal(c->signal), c->status);
    else
      wl__error("wavelet-run: replica %d (pid %d) failed with exit status %d", c->role, (int)c->pid,
                c->status);
  }

  if (!o.group) {
    /* The last member to leave removes it; after a crash nobody did. */
    int g = wl_sched_group_remove_all(group);
    if (g && g != -ENOENT) wl__warn("wavelet-run: cannot remove group %s: %s", group, strerror(-g));
  }

  if (o.trace_dir) {
    /* The same report as `wavelet-trace report` over the replicas' traces, with their combined
     * wave. --partial: a killed replica's trace still counts up to where it was cut. */
    char **rargs = calloc(k + 1, sizeof *rargs);
    int nr = 0;
    for (unsigned r = 0; r < k && rargs; r++) {
      struct stat st;
      if (stat(traces[r], &st) != 0)
        wl__warn("wavelet-run: replica %u wrote no trace (%s)", r, traces[r]);
      else if (st.st_size < (off_t)WL_TRACE_HEADER_SIZE) /* it died while opening it */
        wl__warn("wavelet-run: replica %u's trace %s is empty; left out of the report", r,
                 traces[r]);
      else
        rargs[nr++] = traces[r];
    }
    if (nr) {
      static char partial[] = "--partial";
      rargs[nr] = partial;
      fflush(NULL);
      printf("\n");
      int rr = wlt_report_main(nr + 1, rargs);
      fflush(stdout);
      if (rr && !status) status = 1;
    } else if (!status) {
      wl__error("wavelet-run: --trace-dir %s: no replica wrote a trace", o.trace_dir);
      status = 1;
    }
    free(rargs);
  }
  free(traces);
  free(envs);
  free(cpus);
  free(child);
  return status;
}
