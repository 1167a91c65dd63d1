/* The one message function of every Wavelet library: "wavelet: " lines on stderr. */
#ifndef WAVELET_COMMON_LOG_H
#define WAVELET_COMMON_LOG_H

#include <stdint.h>

typedef enum wl__log_level_e {
  WL_LOG_ERROR = 0,
  WL_LOG_WARN = 1,
  WL_LOG_INFO = 2,
  WL_LOG_DEBUG = 3
} wl__log_level_t;

/* Messages above this level are dropped. Default: warn (WAVELET_LOG can change it). */
void wl__log_set_level(wl__log_level_t level);
wl__log_level_t wl__log_get_level(void);

/* Formats into a stack buffer and writes one line with write(2): never allocates, never
 * recurses (a message from inside a message is dropped), at most 20 lines a second. */
void wl__log(wl__log_level_t level, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* How many lines the rate limit dropped (for tests and stats). */
uint64_t wl__log_dropped(void);

#define wl__warn(...)  wl__log(WL_LOG_WARN, __VA_ARGS__)
#define wl__error(...) wl__log(WL_LOG_ERROR, __VA_ARGS__)
#define wl__info(...)  wl__log(WL_LOG_INFO, __VA_ARGS__)
#define wl__debug(...) wl__log(WL_LOG_DEBUG, __VA_ARGS__)

/* Logs once per call site. */
#define wl__log_once(level, ...)                                                                   \
  do {                                                                                             \
    static int wl__once_;                                                                          \
    if (!__atomic_exchange_n(&wl__once_, 1, __ATOMIC_RELAXED)) wl__log(level, __VA_ARGS__);        \
  } while (0)
#define wl__warn_once(...) wl__log_once(WL_LOG_WARN, __VA_ARGS__)
#define wl__info_once(...) wl__log_once(WL_LOG_INFO, __VA_ARGS__)

#endif
