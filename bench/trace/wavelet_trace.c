/* wavelet-trace: `report` on memory-wave traces (report.c) and `record`, which runs a command
 * under libwavelet.so in trace mode. */
#include "launch.h"
#include "log.h"
#include "report.h"

#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

static const char record_usage[] =
    "usage: wavelet-trace record [-o FILE] [--preload PATH] -- CMD...";

static int usage(void) {
  fprintf(stderr, "%s\n%s\n", wlt_report_usage, record_usage);
  return 2;
}

static int record_bad(const char *why, const char *arg) {
  fprintf(stderr, "wavelet-trace: record: %s%s%s\n%s\n", why, arg ? " " : "", arg ? arg : "",
          record_usage);
  return 2;
}

/* `record`: CMD runs as a child (its status is passed through) with the preload in trace mode;
 * the trace goes to FILE, by default CMDNAME-PID.wlt in the current directory (PID: this tool's).
 */
static int record_main(int argc, char **argv) {
  const char *out = NULL, *preload_opt = NULL;
  int i = 0;
  for (; i < argc; i++) {
    const char *a = argv[i];
    if (!strcmp(a, "--")) {
      i++;
      break;
    }
    if (!strcmp(a, "-o") || !strcmp(a, "--output") || !strcmp(a, "--preload")) {
      if (i + 1 >= argc) return record_bad("option needs a value:", a);
      if (strcmp(a, "--preload") != 0)
        out = argv[++i];
      else
        preload_opt = argv[++i];
    } else if (a[0] == '-') {
      return record_bad("unknown option", a);
    } else {
      break; /* the command, without a "--" before it */
    }
  }
  if (i >= argc) return record_bad("no command to run", NULL);
  if (out && !*out) return record_bad("-o wants a file name", NULL);
  if (out) {
    /* WAVELET_TRACE reads %p as each process's id: the file would not be the one named here,
     * reported or cleared of a stale copy. */
    if (strchr(out, '%')) {
      fprintf(stderr, "wavelet-trace: record: -o wants a file name without '%%', not '%s'\n", out);
      return 2;
    }
    struct stat st;
    size_t n = strlen(out);
    if (out[n - 1] == '/' || (stat(out, &st) == 0 && S_ISDIR(st.st_mode))) {
      fprintf(stderr,
              "wavelet-trace: record: -o %s is a directory; expected a trace file name such as "
              "%s%srun.wlt\n",
              out, out, out[n - 1] == '/' ? "" : "/");
      return 2;
    }
  }
  char **cmd = argv + i;
  char defname[PATH_MAX];
  if (!out) {
    const char *base = strrchr(cmd[0], '/') ? strrchr(cmd[0], '/') + 1 : cmd[0];
    snprintf(defname, sizeof defname, "%.200s-%d.wlt", base, (int)getpid());
    for (char *c = defname; *c; c++)
      if (*c == '%') *c = '_'; /* a command named with '%' must not make WAVELET_TRACE's %p */
    out = defname;
  }
  char preload[PATH_MAX], err[2048];
  if (wll_find_preload(preload_opt, preload, sizeof preload, err, sizeof err)) {
    wl__error("wavelet-trace: record needs libwavelet.so and found none (%s); build the "
              "'wavelet' target, or give --preload PATH or WAVELET_PRELOAD",
              err);
    return 1;
  }
  /* A stale trace (or a dead writer's rings) must not pass for this run's. */
  char rings[PATH_MAX + 8];
  snprintf(rings, sizeof rings, "%s%s", out, WL_TRACE_RINGS_SUFFIX);
  unlink(out);
  unlink(rings);
  int rc = wll_env_common("wavelet-trace record", "trace", preload);
  if (!rc && setenv("WAVELET_TRACE", out, 1)) rc = -errno;
  if (rc) {
    wl__error("wavelet-trace: record: cannot set the environment: %s", strerror(-rc));
    return 1;
  }
  wll_child_t child = {.role = -1};
  wll_run_t run = {.tool = "wavelet-trace record", .argv = cmd, .child = &child, .n = 1};
  int status = wll_run(&run);
  if (status < 0) {
    wl__error("wavelet-trace: record: cannot start '%s': %s", cmd[0], strerror(-status));
    return 1;
  }
  struct stat stt;
  if (stat(out, &stt) == 0)
    fprintf(stderr,
            "wavelet-trace: trace of '%s' in %s (%lld bytes); read it with "
            "`wavelet-trace report %s`\n",
            cmd[0], out, (long long)stt.st_size, out);
  else
    wl__warn("wavelet-trace: record: '%s' left no trace in %s (did it load the CUDA libraries?)",
             cmd[0], out);
  if (status) wl__warn("wavelet-trace: record: '%s' exited with status %d", cmd[0], status);
  return status;
}

int main(int argc, char **argv) {
  if (argc < 2) return usage();
  if (!strcmp(argv[1], "report")) return wlt_report_main(argc - 2, argv + 2);
  if (!strcmp(argv[1], "record")) return record_main(argc - 2, argv + 2);
  if (!strcmp(argv[1], "-h") || !strcmp(argv[1], "--help") || !strcmp(argv[1], "help")) {
    printf("%s\n%s\n", wlt_report_usage, record_usage);
    return 0;
  }
  fprintf(stderr, "wavelet-trace: unknown command '%s'\n", argv[1]);
  return usage();
}
