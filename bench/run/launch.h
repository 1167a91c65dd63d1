/* What wavelet-run and `wavelet-trace record` share: finding libwavelet.so, the environment a
 * traced or gated program needs, and a supervisor that runs replicas, prefixes their output and
 * forwards signals. */
#ifndef WAVELET_BENCH_LAUNCH_H
#define WAVELET_BENCH_LAUNCH_H

#include <stddef.h>
#include <sys/types.h>

/* The interposer's modes (WAVELET_MODE). */
int wll_mode_valid(const char *mode);
/* True when the mode needs the preload (every mode but "off"). */
int wll_mode_needs_preload(const char *mode);

/* Finds libwavelet.so, in order: explicit (--preload), $WAVELET_PRELOAD, next to the running
 * executable (../lib/libwavelet.so), the install libdir. 0 and the path in out, or -ENOENT with
 * a line naming every place tried in err. */
int wll_find_preload(const char *explicit_path, char *out, size_t len, char *err, size_t errlen);

/* Sets, in this process's environment, what every launched program gets: WAVELET_MODE=mode,
 * LD_PRELOAD with preload first (kept values follow; preload NULL: unchanged), and
 * PYTORCH_CUDA_ALLOC_CONF=backend:cudaMallocAsync unless already set (saying so once, as tool).
 * 0 or negative errno. */
int wll_env_common(const char *tool, const char *mode, const char *preload);

/* One replica to start: its argv and the environment it adds to the current one. */
typedef struct wll_child_s {
  int role;        /* the output prefix "[role] "; < 0: no prefixing for this child */
  const int *cpus; /* CPUs to bind it to before exec, NULL: none */
  size_t ncpus;
  const char *env[8]; /* "NAME=value" strings, NULL-terminated */
  pid_t pid;          /* out */
  int status;         /* out: exit status, 128+signal for a signal, 127 when exec failed */
  int signal;         /* out: the signal that killed it, 0 when it exited */
  int done;           /* out */
} wll_child_t;

typedef struct wll_run_s {
  const char *tool;  /* for messages */
  char *const *argv; /* the command */
  wll_child_t *child;
  size_t n;
  int prefix;       /* prefix output lines with the role (pipes); 0: children inherit stdio */
  int first_failed; /* out: index of the first child to fail, -1 when none */
  int signalled;    /* out: the launcher was asked to stop by this signal, 0 when not */
} wll_run_t;

/* Starts the children and waits for all of them: prefixes their lines when asked (one write per
 * whole line, stdout to stdout and stderr to stderr; each child then is its own process group with
 * /dev/null as stdin), forwards SIGINT and SIGTERM to each child's process group (a second signal
 * kills them), and returns the exit status of the first child to fail, or 0. Without prefixing
 * the child keeps the terminal (same process group, stdin inherited), so a terminal's ^C is not
 * sent to it a second time. -errno when nothing could be started. */
int wll_run(wll_run_t *run);

/* The status of a finished process the way shells report it: the exit code, or 128+signal. */
int wll_exit_code(int wstatus);

#endif
