/* The launcher core shared by wavelet-run and `wavelet-trace record`: the preload's location,
 * the environment, and a supervisor that runs children with prefixed output and signal
 * forwarding. */
#include "launch.h"
#include "log.h"
#include "wavelet/sched.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#ifndef WL_INSTALL_FULL_LIBDIR
#define WL_INSTALL_FULL_LIBDIR "/usr/local/lib"
#endif
#ifndef WL_INSTALL_LIBDIR
#define WL_INSTALL_LIBDIR "lib"
#endif

#define PRELOAD_NAME  "libwavelet.so"
#define LINE_MAX_KEEP (1u << 20) /* a longer line is cut into pieces of this size */

static const char *const modes[] = {"off", "trace", "alloc", "gate"};

int wll_mode_valid(const char *mode) {
  for (size_t i = 0; i < sizeof modes / sizeof modes[0]; i++)
    if (mode && !strcmp(mode, modes[i])) return 1;
  return 0;
}

int wll_mode_needs_preload(const char *mode) {
  return strcmp(mode, "off") != 0;
}

static int is_file(const char *p) {
  struct stat st;
  return stat(p, &st) == 0 && S_ISREG(st.st_mode);
}

/* Appends "; what" to err. */
static void tried(char *err, size_t len, const char *what) {
  size_t n = strlen(err);
  if (n < len) snprintf(err + n, len - n, "%s%s", n ? ", " : "", what);
}

int wll_find_preload(const char *explicit_path, char *out, size_t len, char *err, size_t errlen) {
  err[0] = 0;
  char cand[PATH_MAX + 64];
  if (explicit_path) {
    if (is_file(explicit_path)) goto found_explicit;
    snprintf(err, errlen, "--preload %s: no such file", explicit_path);
    return -ENOENT;
  }
  const char *envp = getenv("WAVELET_PRELOAD");
  if (envp && *envp) {
    if (is_file(envp)) {
      explicit_path = envp;
      goto found_explicit;
    }
    snprintf(err, errlen, "WAVELET_PRELOAD=%s: no such file", envp);
    return -ENOENT;
  }
  char exe[PATH_MAX];
  ssize_t k = readlink("/proc/self/exe", exe, sizeof exe - 1);
  if (k > 0) {
    exe[k] = 0;
    char *slash = strrchr(exe, '/');
    if (slash) *slash = 0;
    /* The build tree (build/bin next to build/lib) and an install tree (bin next to libdir). */
    const char *rel[] = {"../lib/" PRELOAD_NAME, "../" WL_INSTALL_LIBDIR "/" PRELOAD_NAME};
    size_t nrel = strcmp(WL_INSTALL_LIBDIR, "lib") ? 2 : 1;
    for (size_t i = 0; i < nrel; i++) {
      snprintf(cand, sizeof cand, "%s/%s", exe, rel[i]);
      if (is_file(cand)) goto found;
      tried(err, errlen, cand);
    }
  }
  snprintf(cand, sizeof cand, "%s/%s", WL_INSTALL_FULL_LIBDIR, PRELOAD_NAME);
  if (is_file(cand)) goto found;
  tried(err, errlen, cand);
  return -ENOENT;
found_explicit:
  snprintf(cand, sizeof cand, "%s", explicit_path);
found:
  /* The dynamic loader resolves a relative LD_PRELOAD against each program's own directory. */
  if (!realpath(cand, out) || strlen(out) >= len) {
    snprintf(err, errlen, "%s: cannot resolve the path", cand);
    return -ENOENT;
  }
  return 0;
}

int wll_env_common(const char *tool, const char *mode, const char *preload) {
  if (setenv("WAVELET_MODE", mode, 1)) return -errno;
  if (preload) {
    const char *old = getenv("LD_PRELOAD");
    size_t n = strlen(preload) + (old ? strlen(old) : 0) + 2;
    char *v = malloc(n);
    if (!v) return -ENOMEM;
    if (old && *old)
      snprintf(v, n, "%s:%s", preload, old);
    else
      snprintf(v, n, "%s", preload);
    int rc = setenv("LD_PRELOAD", v, 1) ? -errno : 0;
    free(v);
    if (rc) return rc;
  }
  /* The frameworks' caching allocators keep freed blocks (JAX and TensorFlow also take most of
   * the device at start), so the wave would be invisible and a second replica would not fit.
   * These make each allocation and free reach the interposer, which serves them from its own
   * pools (so XLA's "platform" allocator is no longer slow). */
  static const char *const conf[][2] = {
      {"PYTORCH_CUDA_ALLOC_CONF", "backend:cudaMallocAsync"},
      {"XLA_PYTHON_CLIENT_ALLOCATOR", "platform"},
      {"TF_GPU_ALLOCATOR", "cuda_malloc_async"},
  };
  char note[256] = "";
  size_t o = 0;
  for (size_t i = 0; i < sizeof conf / sizeof conf[0]; i++) {
    if (getenv(conf[i][0])) continue;
    if (setenv(conf[i][0], conf[i][1], 1)) return -errno;
    o += (size_t)snprintf(note + o, sizeof note - o, "%s%s=%s", o ? ", " : "", conf[i][0],
                          conf[i][1]);
    if (o >= sizeof note) o = sizeof note - 1;
  }
  if (o)
    wl__warn("%s: set %s so that PyTorch's, JAX's and TensorFlow's allocations reach the "
             "interposer (set one yourself to choose otherwise)",
             tool, note);
  return 0;
}

int wll_exit_code(int ws) {
  if (WIFEXITED(ws)) return WEXITSTATUS(ws);
  if (WIFSIGNALED(ws)) return 128 + WTERMSIG(ws);
  return 1;
}

/* ---- the supervisor ----------------------------------------------------------------------*/

static int sig_pipe[2] = {-1, -1};

/* Passed on to the replicas: every signal whose default is to end the process and that a user or
 * a terminal sends. The supervisor outlives them so that no replica is left behind, the
 * replicas' last lines are printed and the group is removed (a hang-up killed it at once). */
static const int forwarded[] = {SIGINT, SIGTERM, SIGHUP, SIGQUIT, SIGUSR1, SIGUSR2};
#define NFORWARD ((int)(sizeof forwarded / sizeof forwarded[0]))

/* The signal number, with 0x80 set when the kernel sent it (a terminal's ^C or ^\), not kill(2). */
static void on_signal(int sig, siginfo_t *si, void *ctx) {
  (void)ctx;
  int saved = errno;
  unsigned char c = (unsigned char)(sig | (si && si->si_code > 0 ? 0x80 : 0));
  ssize_t k = write(sig_pipe[1], &c, 1);
  (void)k;
  errno = saved;
}

/* One output stream of one child: its pipe and the bytes of an unfinished line. */
typedef struct stream_s {
  int fd;  /* read end, -1 at EOF */
  int out; /* 1 or 2 */
  int role;
  char *buf;
  size_t len, cap;
} stream_t;

static int write_all(int fd, const char *p, size_t n) {
  while (n) {
    ssize_t k = write(fd, p, n);
    if (k < 0) {
      if (errno == EINTR) continue;
      return -errno;
    }
    p += k;
    n -= (size_t)k;
  }
  return 0;
}

/* Writes "[role] " + the line (with its newline) in one write, so lines never mix. */
static void emit_line(stream_t *s, const char *line, size_t n, int add_nl) {
  char pre[24];
  int pn = snprintf(pre, sizeof pre, "[%d] ", s->role);
  size_t total = (size_t)pn + n + (add_nl ? 1 : 0);
  char stackbuf[4096];
  char *b = total <= sizeof stackbuf ? stackbuf : malloc(total);
  if (!b) { /* out of memory: two writes rather than nothing */
    if (write_all(s->out, pre, (size_t)pn) == 0) write_all(s->out, line, n);
    if (add_nl) write_all(s->out, "\n", 1);
    return;
  }
  memcpy(b, pre, (size_t)pn);
  memcpy(b + pn, line, n);
  if (add_nl) b[total - 1] = '\n';
  write_all(s->out, b, total); /* a closed stdout is not the children's problem */
  if (b != stackbuf) free(b);
}

/* Reads what is there; emits the whole lines. Returns 0, or 1 at EOF. */
static int stream_read(stream_t *s) {
  if (s->cap - s->len < 65536) {
    size_t cap = s->cap ? s->cap * 2 : 131072;
    char *nb = realloc(s->buf, cap);
    if (!nb)
      cap = s->cap; /* keep going with what there is */
    else
      s->buf = nb;
    s->cap = cap;
  }
  if (s->cap && s->len == s->cap) { /* no memory to grow: cut the line rather than stop reading */
    emit_line(s, s->buf, s->len, 1);
    s->len = 0;
  }
  ssize_t k = read(s->fd, s->buf + s->len, s->cap - s->len);
  if (k < 0 && (errno == EINTR || errno == EAGAIN)) return 0;
  if (k <= 0) {
    if (s->len) emit_line(s, s->buf, s->len, 1); /* a last line without its newline */
    s->len = 0;
    close(s->fd);
    s->fd = -1;
    return 1;
  }
  s->len += (size_t)k;
  size_t start = 0;
  for (;;) {
    char *nl = memchr(s->buf + start, '\n', s->len - start);
    if (!nl) break;
    size_t end = (size_t)(nl - s->buf) + 1;
    emit_line(s, s->buf + start, end - start, 0);
    start = end;
  }
  if (s->len - start >= LINE_MAX_KEEP) { /* an endless line: cut it rather than grow forever */
    emit_line(s, s->buf + start, s->len - start, 1);
    start = s->len;
  }
  memmove(s->buf, s->buf + start, s->len - start);
  s->len -= start;
  if (s->cap > 4 * LINE_MAX_KEEP && s->len < LINE_MAX_KEEP) { /* give back a huge buffer */
    char *nb = realloc(s->buf, 2 * LINE_MAX_KEEP);
    if (nb) {
      s->buf = nb;
      s->cap = 2 * LINE_MAX_KEEP;
    }
  }
  return 0;
}

static void set_cloexec_nonblock(int fd, int nonblock) {
  fcntl(fd, F_SETFD, FD_CLOEXEC);
  if (nonblock) fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) | O_NONBLOCK);
}

/* In the child: becomes its own process group, resets signals, binds CPUs, execs. */
static void child_exec(const wll_run_t *run, const wll_child_t *c, int outfd, int errfd,
                       pid_t launcher) {
  if (run->prefix) setpgid(0, 0);
  /* Die with the launcher rather than run on unsupervised. */
  prctl(PR_SET_PDEATHSIG, SIGTERM);
  if (getppid() != launcher) _exit(128 + SIGTERM);
  struct sigaction sa;
  memset(&sa, 0, sizeof sa);
  sa.sa_handler = SIG_DFL;
  sigaction(SIGINT, &sa, NULL);
  sigaction(SIGTERM, &sa, NULL);
  sigaction(SIGCHLD, &sa, NULL);
  sigaction(SIGPIPE, &sa, NULL);
  sigset_t none;
  sigemptyset(&none);
  sigprocmask(SIG_SETMASK, &none, NULL);
  if (outfd >= 0) {
    /* Own process groups cannot read the terminal, so replicas get no stdin. */
    int nul = open("/dev/null", O_RDONLY);
    if (nul >= 0 && nul != 0) {
      dup2(nul, 0);
      close(nul);
    }
    dup2(outfd, 1);
    dup2(errfd, 2);
    close(outfd);
    close(errfd);
  }
  for (size_t i = 0; i < sizeof c->env / sizeof c->env[0] && c->env[i]; i++)
    putenv((char *)c->env[i]);
  if (c->cpus && c->ncpus) {
    int rc = wl_affinity_apply(getpid(), c->cpus, c->ncpus);
    if (rc) wl__warn("%s: cannot bind role %d to its CPUs: %s", run->tool, c->role, strerror(-rc));
  }
  execvp(run->argv[0], run->argv);
  int e = errno;
  wl__error("%s: cannot run '%s': %s", run->tool, run->argv[0], strerror(e));
  _exit(e == ENOENT ? 127 : 126);
}

static void signal_all(wll_run_t *run, int sig) {
  for (size_t i = 0; i < run->n; i++)
    if (run->child[i].pid > 0 && !run->child[i].done) {
      /* The group first: a replica's own children get it too, as from a terminal. */
      if (kill(-run->child[i].pid, sig) != 0) kill(run->child[i].pid, sig);
    }
}

int wll_run(wll_run_t *run) {
  run->first_failed = -1;
  run->signalled = 0;
  if (pipe(sig_pipe)) return -errno;
  set_cloexec_nonblock(sig_pipe[0], 1);
  set_cloexec_nonblock(sig_pipe[1], 1);
  struct sigaction sa, old_fwd[NFORWARD], old_chld, old_pipe;
  memset(&sa, 0, sizeof sa);
  sa.sa_sigaction = on_signal;
  sa.sa_flags = SA_RESTART | SA_SIGINFO;
  sigemptyset(&sa.sa_mask);
  for (int i = 0; i < NFORWARD; i++) sigaction(forwarded[i], &sa, &old_fwd[i]);
  sigaction(SIGCHLD, &sa, &old_chld);
  struct sigaction ign;
  memset(&ign, 0, sizeof ign);
  ign.sa_handler = SIG_IGN;
  sigaction(SIGPIPE, &ign, &old_pipe); /* a closed stdout must not kill the supervisor */

  size_t ns = run->prefix ? 2 * run->n : 0;
  stream_t *st = ns ? calloc(ns, sizeof *st) : NULL;
  struct pollfd *pf = calloc(ns + 1, sizeof *pf);
  int rc = 0;
  if ((ns && !st) || !pf) {
    rc = -ENOMEM;
    goto out;
  }
  for (size_t i = 0; i < ns; i++) st[i].fd = -1; /* children that never start have none */
  fflush(NULL);
  pid_t self = getpid();
  size_t started = 0;
  for (size_t i = 0; i < run->n; i++) {
    wll_child_t *c = &run->child[i];
    int po[2] = {-1, -1}, pe[2] = {-1, -1};
    if (run->prefix) {
      if (pipe(po) || pipe(pe)) {
        rc = -errno;
        break;
      }
      set_cloexec_nonblock(po[0], 1);
      set_cloexec_nonblock(pe[0], 1);
    }
    pid_t pid = fork();
    if (pid < 0) {
      rc = -errno;
      if (po[0] >= 0) close(po[0]), close(po[1]), close(pe[0]), close(pe[1]);
      break;
    }
    if (pid == 0) child_exec(run, c, po[1], pe[1], self);
    if (run->prefix) setpgid(pid, pid); /* also here, so a signal sent at once reaches it */
    c->pid = pid;
    c->done = 0;
    started++;
    if (run->prefix) {
      close(po[1]);
      close(pe[1]);
      st[2 * i] = (stream_t){.fd = po[0], .out = 1, .role = c->role};
      st[2 * i + 1] = (stream_t){.fd = pe[0], .out = 2, .role = c->role};
    }
  }
  if (rc && started == 0) goto out;
  if (rc) { /* some started: stop them, then collect them as usual */
    wl__error("%s: cannot start every replica: %s; stopping the others", run->tool, strerror(-rc));
    for (size_t i = started; i < run->n; i++) run->child[i].done = 1, run->child[i].status = 1;
    signal_all(run, SIGTERM);
    if (run->first_failed < 0) run->first_failed = (int)started;
  }

  size_t alive = started, open_streams = 0;
  for (size_t i = 0; i < ns; i++)
    if (st[i].fd >= 0 && i / 2 < started) open_streams++;
  int signals = 0;
  uint64_t drain_deadline = 0;
  for (;;) {
    if (!alive) {
      if (!open_streams) break;
      /* A replica's own children may hold its pipes open: give them a moment, not forever. */
      struct timespec ts;
      clock_gettime(CLOCK_MONOTONIC, &ts);
      uint64_t now = (uint64_t)ts.tv_sec * 1000 + (uint64_t)ts.tv_nsec / 1000000;
      if (!drain_deadline) drain_deadline = now + 1000;
      if (now >= drain_deadline) break;
    }
    size_t np = 0;
    pf[np++] = (struct pollfd){.fd = sig_pipe[0], .events = POLLIN};
    for (size_t i = 0; i < ns; i++)
      if (st[i].fd >= 0) pf[np++] = (struct pollfd){.fd = st[i].fd, .events = POLLIN};
    int k = poll(pf, np, alive ? -1 : 100);
    if (k < 0 && errno != EINTR) break;
    if (k > 0) {
      size_t j = 1;
      for (size_t i = 0; i < ns; i++) {
        if (st[i].fd < 0) continue;
        if (pf[j].revents & (POLLIN | POLLHUP | POLLERR))
          if (stream_read(&st[i])) open_streams--;
        j++;
      }
      if (alive) drain_deadline = 0;
    }
    unsigned char sigs[64];
    ssize_t got;
    while ((got = read(sig_pipe[0], sigs, sizeof sigs)) > 0) {
      for (ssize_t q = 0; q < got; q++) {
        int sig = sigs[q] & 0x7f, from_tty = sigs[q] & 0x80;
        if (sig == SIGCHLD) continue;
        signals++;
        if (!run->signalled) run->signalled = sig;
        if (signals == 1) {
          /* A child in our own process group already got the terminal's signal. */
          if (run->prefix || !from_tty) signal_all(run, sig);
        } else {
          wl__warn("%s: second signal: killing the replicas", run->tool);
          signal_all(run, SIGKILL);
        }
      }
    }
    int ws;
    pid_t pid;
    while (alive && (pid = waitpid(-1, &ws, WNOHANG)) > 0) {
      for (size_t i = 0; i < run->n; i++) {
        wll_child_t *c = &run->child[i];
        if (c->pid != pid || c->done) continue;
        c->done = 1;
        c->status = wll_exit_code(ws);
        c->signal = WIFSIGNALED(ws) ? WTERMSIG(ws) : 0;
        alive--;
        if (c->status && run->first_failed < 0) run->first_failed = (int)i;
      }
    }
  }
  rc = 0;
  if (run->first_failed >= 0) rc = run->child[run->first_failed].status;
out:
  for (size_t i = 0; st && i < ns; i++) {
    if (st[i].fd >= 0) {
      if (st[i].len) emit_line(&st[i], st[i].buf, st[i].len, 1);
      close(st[i].fd);
    }
    free(st[i].buf);
  }
  free(st);
  free(pf);
  for (int i = 0; i < NFORWARD; i++) sigaction(forwarded[i], &old_fwd[i], NULL);
  sigaction(SIGCHLD, &old_chld, NULL);
  sigaction(SIGPIPE, &old_pipe, NULL);
  close(sig_pipe[0]);
  close(sig_pipe[1]);
  sig_pipe[0] = sig_pipe[1] = -1;
  return rc;
}
