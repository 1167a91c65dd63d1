/* The rate-limited, allocation-free, recursion-guarded message function. */
#include "log.h"

#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#define WL_LOG_PER_SECOND 20

static int log_level = WL_LOG_WARN;
static uint64_t log_window;  /* the second the counter below belongs to */
static uint32_t log_count;   /* lines written in that second */
static uint64_t log_dropped; /* lines dropped by the limit */
static _Thread_local int log_busy;

void wl__log_set_level(wl__log_level_t level) {
  __atomic_store_n(&log_level, (int)level, __ATOMIC_RELAXED);
}

wl__log_level_t wl__log_get_level(void) {
  return (wl__log_level_t)__atomic_load_n(&log_level, __ATOMIC_RELAXED);
}

uint64_t wl__log_dropped(void) {
  return __atomic_load_n(&log_dropped, __ATOMIC_RELAXED);
}

/* True when this line fits in the current second's allowance. */
static int log_admit(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  uint64_t now = (uint64_t)ts.tv_sec;
  uint64_t win = __atomic_load_n(&log_window, __ATOMIC_RELAXED);
  if (win != now &&
      __atomic_compare_exchange_n(&log_window, &win, now, 0, __ATOMIC_RELAXED, __ATOMIC_RELAXED))
    __atomic_store_n(&log_count, 0, __ATOMIC_RELAXED);
  if (__atomic_fetch_add(&log_count, 1, __ATOMIC_RELAXED) < WL_LOG_PER_SECOND) return 1;
  __atomic_fetch_add(&log_dropped, 1, __ATOMIC_RELAXED);
  return 0;
}

void wl__log(wl__log_level_t level, const char *fmt, ...) {
  if ((int)level > __atomic_load_n(&log_level, __ATOMIC_RELAXED)) return;
  if (log_busy) return;
  log_busy = 1;
  int saved_errno = errno;
  if (level > WL_LOG_ERROR && !log_admit()) goto out;
  char buf[512];
  static const char prefix[] = "wavelet: ";
  memcpy(buf, prefix, sizeof prefix - 1);
  size_t n = sizeof prefix - 1;
  va_list ap;
  va_start(ap, fmt);
  int k = vsnprintf(buf + n, sizeof buf - n - 1, fmt, ap);
  va_end(ap);
  if (k < 0) k = 0;
  n += (size_t)k < sizeof buf - n - 1 ? (size_t)k : sizeof buf - n - 2;
  buf[n++] = '\n';
  ssize_t w = write(STDERR_FILENO, buf, n);
  (void)w;
out:
  errno = saved_errno;
  log_busy = 0;
}
