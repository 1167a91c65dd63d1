/* Small helpers shared by the libraries: time, rounding, byte formatting. */
#ifndef WAVELET_COMMON_UTIL_H
#define WAVELET_COMMON_UTIL_H

#include <stddef.h>
#include <stdint.h>
#include <time.h>

#define WL_LIKELY(x)   __builtin_expect(!!(x), 1)
#define WL_UNLIKELY(x) __builtin_expect(!!(x), 0)
#define WL_MIN(a, b)   ((a) < (b) ? (a) : (b))
#define WL_MAX(a, b)   ((a) > (b) ? (a) : (b))

static inline uint64_t wl__now_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

/* Rounds x up to a multiple of the power of two a; 0 on overflow. */
static inline size_t wl__align_up(size_t x, size_t a) {
  if (x > SIZE_MAX - (a - 1)) return 0;
  return (x + a - 1) & ~(a - 1);
}

/* Rounds x up to a multiple of any a > 0; 0 on overflow. */
static inline size_t wl__round_up(size_t x, size_t a) {
  if (x > SIZE_MAX - (a - 1)) return 0;
  return (x + a - 1) / a * a;
}

static inline int wl__is_pow2(size_t x) {
  return x != 0 && (x & (x - 1)) == 0;
}

/* Saturating subtraction: counters never underflow. */
static inline size_t wl__sub_sat(size_t a, size_t b) {
  return a > b ? a - b : 0;
}

/* "1.5 GiB"; returns buf. */
const char *wl__fmt_bytes(size_t bytes, char *buf, size_t len);

/* p percent of whole, rounded down, exactly (p <= 100): a double product misses by one for some
 * (29% of 100 was 28). */
size_t wl__percent_of(size_t whole, unsigned p);

/* Parses a size: digits with an optional K/M/G/T suffix (powers of 1024, optional "iB"/"B"),
 * or "N%" of `whole` (0 when whole is unknown: an error). 0 or -EINVAL. */
int wl__parse_size(const char *s, size_t whole, size_t *out);

/* Parses a whole number in [lo, hi] in `base` (0: C's prefixes): no sign, no space, no suffix,
 * not empty. 0 or -EINVAL. */
int wl__parse_u64(const char *s, int base, uint64_t lo, uint64_t hi, uint64_t *out);

/* The tools' command lines: argv[*i] split into an option name and its value, from `--name=value`,
 * or from `--name value` when name is listed in takes_value (NULL-terminated; *i then advances).
 * 0; -ENODATA when an option that takes a value has none; -E2BIG when one that takes none was
 * given one. a->name is the option either way, for the caller's message. */
typedef struct wl__arg_s {
  const char *name, *val;
  char buf[32];
} wl__arg_t;
int wl__arg_split(int argc, char **argv, int *i, const char *const *takes_value, wl__arg_t *a);

/* pthread_create for our own helper threads (trace flusher, trim, gate helper), started with
 * every signal blocked: a signal sent to the process then never lands on a thread the program
 * did not create (its sigwait thread or the thread it unblocked would miss it). The caller's
 * mask is restored. pthread_create's return. */
#include <pthread.h>
int wl__thread_create(pthread_t *t, const pthread_attr_t *attr, void *(*fn)(void *), void *arg);

/* A lock on byte 0 of a file that the kernel drops when its holder dies, however it dies: how
 * another process tells that the one that holds it is still alive (libsched's joiners, the
 * trace's rings file). An open-file-description lock, or where the kernel has none (gVisor
 * answers EINVAL) flock on the whole file; the same kernel always takes the same branch.
 * wl__life_lock: 0, -EAGAIN when another holds it, or negative errno. wl__life_held: 1 when
 * another open file description holds it, 0 when none does, negative errno when it cannot be
 * told. */
int wl__life_lock(int fd);
void wl__life_unlock(int fd);
int wl__life_held(int fd);

#endif
