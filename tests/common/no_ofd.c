/* For tests only: LD_PRELOAD=libwltest_no_ofd.so makes the process's fcntl refuse the open file
 * description lock commands with EINVAL, as gVisor's kernel does (seen on runsc 2022-12, the
 * sandbox some GPU machines run in), so that the fallbacks for it run on every machine. Every
 * other command goes to the C library's fcntl unchanged. */

#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>

typedef int (*fcntl_fn)(int, int, ...);

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

__attribute__((visibility("default"))) int fcntl(int fd, int cmd, ...);
__attribute__((visibility("default"))) int fcntl64(int fd, int cmd, ...);

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
