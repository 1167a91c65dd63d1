/* Byte formatting and size parsing shared by the libraries and tools. */
#include "util.h"

#include <errno.h>
#include <fcntl.h>
#include <sys/file.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

const char *wl__fmt_bytes(size_t bytes, char *buf, size_t len) {
  static const char *units[] = {"B", "KiB", "MiB", "GiB", "TiB", "PiB"};
  double v = (double)bytes;
  int u = 0;
  while (v >= 1024.0 && u < 5) {
    v /= 1024.0;
    u++;
  }
  if (u == 0)
    snprintf(buf, len, "%zu B", bytes);
  else
    snprintf(buf, len, "%.1f %s", v, units[u]);
  return buf;
}

size_t wl__percent_of(size_t whole, unsigned p) {
  if (p > 100) p = 100;
  return whole / 100 * p + whole % 100 * p / 100;
}

int wl__parse_size(const char *s, size_t whole, size_t *out) {
  if (!s || !*s) return -EINVAL;
  size_t v = 0;
  const char *p = s;
  if (*p < '0' || *p > '9') return -EINVAL;
  for (; *p >= '0' && *p <= '9'; p++) {
    size_t d = (size_t)(*p - '0');
    if (v > (SIZE_MAX - d) / 10) return -EINVAL;
    v = v * 10 + d;
  }
  if (*p == '%') {
    if (p[1] || whole == 0 || v > 100) return -EINVAL;
    *out = wl__percent_of(whole, (unsigned)v);
    return 0;
  }
  unsigned shift = 0;
  switch (*p) {
  case 'k':
  case 'K':
    shift = 10;
    p++;
    break;
  case 'm':
  case 'M':
    shift = 20;
    p++;
    break;
  case 'g':
  case 'G':
    shift = 30;
    p++;
    break;
  case 't':
  case 'T':
    shift = 40;
    p++;
    break;
  default:
    break;
  }
  if (shift && (*p == 'i' || *p == 'I')) p++;
  if (*p == 'b' || *p == 'B') p++;
  if (*p) return -EINVAL;
  if (shift && v > (SIZE_MAX >> shift)) return -EINVAL;
  *out = v << shift;
  return 0;
}

int wl__parse_u64(const char *s, int base, uint64_t lo, uint64_t hi, uint64_t *out) {
  if (!s || !*s || *s == '-' || *s == '+' || *s == ' ') return -EINVAL;
  char *end;
  errno = 0;
  unsigned long long v = strtoull(s, &end, base);
  if (errno || *end || v < lo || v > hi) return -EINVAL;
  *out = v;
  return 0;
}

int wl__arg_split(int argc, char **argv, int *i, const char *const *takes_value, wl__arg_t *a) {
  const char *arg = argv[*i];
  const char *eq = strchr(arg, '=');
  a->name = arg;
  a->val = NULL;
  if (strncmp(arg, "--", 2) == 0 && eq && (size_t)(eq - arg) < sizeof a->buf) {
    memcpy(a->buf, arg, (size_t)(eq - arg));
    a->buf[eq - arg] = 0;
    a->name = a->buf;
    a->val = eq + 1;
  }
  int takes = 0;
  for (int k = 0; takes_value[k]; k++) takes |= !strcmp(a->name, takes_value[k]);
  if (takes && !a->val) {
    if (*i + 1 >= argc) return -ENODATA;
    a->val = argv[++*i];
  } else if (!takes && a->val) {
    return -E2BIG;
  }
  return 0;
}

int wl__thread_create(pthread_t *t, const pthread_attr_t *attr, void *(*fn)(void *), void *arg) {
  sigset_t all, old;
  sigfillset(&all);
  int masked = pthread_sigmask(SIG_SETMASK, &all, &old) == 0;
  int rc = pthread_create(t, attr, fn, arg); /* the new thread inherits the full mask */
  if (masked) pthread_sigmask(SIG_SETMASK, &old, NULL);
  return rc;
}

int wl__life_lock(int fd) {
  struct flock lk = {.l_type = F_WRLCK, .l_whence = SEEK_SET, .l_start = 0, .l_len = 1};
  if (fcntl(fd, F_OFD_SETLK, &lk) == 0) return 0;
  if (errno != EINVAL) return errno == EACCES ? -EAGAIN : -errno;
  return flock(fd, LOCK_EX | LOCK_NB) == 0 ? 0 : -errno;
}

void wl__life_unlock(int fd) {
  struct flock lk = {.l_type = F_UNLCK, .l_whence = SEEK_SET, .l_start = 0, .l_len = 1};
  if (fcntl(fd, F_OFD_SETLK, &lk) != 0 && errno == EINVAL) flock(fd, LOCK_UN);
}

int wl__life_held(int fd) {
  struct flock lk = {.l_type = F_WRLCK, .l_whence = SEEK_SET, .l_start = 0, .l_len = 1};
  if (fcntl(fd, F_OFD_GETLK, &lk) == 0) return lk.l_type != F_UNLCK;
  if (errno != EINVAL) return -errno;
  /* flock has no query: a try that succeeds means nobody held it, and is undone at once (a
   * holder trying meanwhile finds it busy, as it would a live one, and tries again). */
  if (flock(fd, LOCK_EX | LOCK_NB) == 0) {
    flock(fd, LOCK_UN);
    return 0;
  }
  return errno == EWOULDBLOCK ? 1 : -errno;
}
