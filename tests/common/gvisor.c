/* For tests only: LD_PRELOAD=libwltest_gvisor.so gives a process two behaviours of gVisor's
 * kernel (runsc, the sandbox some lent GPU machines run in; both seen on Debian's runsc
 * 2022-12), so that what we do about them is tested on every machine:
 * - fcntl refuses the open file description lock commands with EINVAL;
 * - membarrier(MEMBARRIER_CMD_PRIVATE_EXPEDITED) takes about 10 ms (gVisor stops every thread;
 *   Linux takes a microsecond or two).
 * And, while WLTEST_PROC_HIDDEN=1 is in its environment, what /proc mounted with hidepid=2
 * does to other users' processes: /proc/<pid>/ of any process but this one is not there (open
 * fails with ENOENT), while kill(2) still finds it.
 * Every other call goes to the C library unchanged. wltest_gvisor_marker is how a test runner
 * (tests/common/wltest.h) knows this library is loaded at all. */
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <linux/membarrier.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

typedef int (*fcntl_fn)(int, int, ...);
typedef long (*syscall_fn)(long, ...);

static int refused(int cmd) {
  return cmd == F_OFD_GETLK || cmd == F_OFD_SETLK || cmd == F_OFD_SETLKW;
}

/* Every fcntl argument is an int or a pointer; a pointer-sized read of it is what the C
 * library's own wrapper does. */
static int filtered(const char *name, int fd, int cmd, va_list ap) {
  void *arg = va_arg(ap, void *);
  if (refused(cmd)) {
    errno = EINVAL;
    return -1;
  }
  fcntl_fn real = (fcntl_fn)dlsym(RTLD_NEXT, name);
  if (!real) {
    errno = ENOSYS;
    return -1;
  }
  return real(fd, cmd, arg);
}

__attribute__((visibility("default"))) int wltest_gvisor_marker(void);

int wltest_gvisor_marker(void) {
  return 1;
}

__attribute__((visibility("default"))) int fcntl(int fd, int cmd, ...);
__attribute__((visibility("default"))) int fcntl64(int fd, int cmd, ...);
__attribute__((visibility("default"))) long syscall(long number, ...);

int fcntl(int fd, int cmd, ...) {
  va_list ap;
  va_start(ap, cmd);
  int rc = filtered("fcntl", fd, cmd, ap);
  va_end(ap);
  return rc;
}

int fcntl64(int fd, int cmd, ...) {
  va_list ap;
  va_start(ap, cmd);
  int rc = filtered("fcntl64", fd, cmd, ap);
  va_end(ap);
  return rc;
}

/* The C library's syscall(2) with its six register arguments passed on as they came. */
long syscall(long number, ...) {
  va_list ap;
  va_start(ap, number);
  long a[6];
  for (int i = 0; i < 6; i++) a[i] = va_arg(ap, long);
  va_end(ap);
  if (number == __NR_membarrier && a[0] == MEMBARRIER_CMD_PRIVATE_EXPEDITED) {
    struct timespec ts = {0, 10 * 1000 * 1000};
    nanosleep(&ts, NULL);
  }
  syscall_fn real = (syscall_fn)dlsym(RTLD_NEXT, "syscall");
  if (!real) {
    errno = ENOSYS;
    return -1;
  }
  return real(number, a[0], a[1], a[2], a[3], a[4], a[5]);
}

/* ---- /proc with hidepid=2, on demand ---------------------------------------------------------*/

typedef int (*open_fn)(const char *, int, ...);

static int hidden(const char *path) {
  const char *e = getenv("WLTEST_PROC_HIDDEN");
  if (!e || strcmp(e, "1") || strncmp(path, "/proc/", 6)) return 0;
  char *end;
  long pid = strtol(path + 6, &end, 10);
  return end != path + 6 && *end == '/' && pid != (long)getpid();
}

static int open_filtered(const char *name, const char *path, int flags, va_list ap) {
  unsigned mode = (flags & (O_CREAT | O_TMPFILE)) ? va_arg(ap, unsigned) : 0;
  if (path && hidden(path)) {
    errno = ENOENT;
    return -1;
  }
  open_fn real = (open_fn)dlsym(RTLD_NEXT, name);
  if (!real) {
    errno = ENOSYS;
    return -1;
  }
  return real(path, flags, mode);
}

__attribute__((visibility("default"))) int open(const char *path, int flags, ...);
__attribute__((visibility("default"))) int open64(const char *path, int flags, ...);

int open(const char *path, int flags, ...) {
  va_list ap;
  va_start(ap, flags);
  int rc = open_filtered("open", path, flags, ap);
  va_end(ap);
  return rc;
}

int open64(const char *path, int flags, ...) {
  va_list ap;
  va_start(ap, flags);
  int rc = open_filtered("open64", path, flags, ap);
  va_end(ap);
  return rc;
}
