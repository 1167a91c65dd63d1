/* libwavelet.so's options: every WAVELET_* variable, read once at init, validated, and printed
 * as one table with WAVELET_LOG=debug. */
#include "internal.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

wl__opts_t wl__opts;

static const char *const mode_names[] = {"off", "trace", "alloc", "gate"};
static const char *const log_names[] = {"error", "warn", "info", "debug"};

const char *wl__mode_name(int mode) {
  return mode >= 0 && mode <= WL__MODE_GATE ? mode_names[mode] : "?";
}

/* Index of v in names (case-insensitive), -1 when absent. */
static int pick(const char *v, const char *const *names, int n) {
  for (int i = 0; i < n; i++)
    if (!strcasecmp(v, names[i])) return i;
  return -1;
}

static int parse_bool(const char *v) {
  static const char *const yes[] = {"1", "true", "yes", "on"};
  static const char *const no[] = {"0", "false", "no", "off"};
  if (pick(v, yes, 4) >= 0) return 1;
  if (pick(v, no, 4) >= 0) return 0;
  return -1;
}

/* A trace path may hold "%p", replaced by the process id (so forked children and launchers'
 * replicas write files of their own). */
static bool trace_path_ok(const char *v) {
  size_t n = strlen(v);
  if (!n || n >= sizeof wl__opts.trace - 16) return false;
  for (const char *p = v; *p; p++)
    if (*p == '%' && p[1] != 'p')
      return false;
    else if (*p == '%')
      p++;
  return true;
}

void wl__opts_load(void) {
  wl__opts_t *o = &wl__opts;
  o->log_level = WL_LOG_WARN;
  o->show_stats = false;
  o->alloc_tcache = 0;
  o->alloc_tcache_set = false;
  o->trace[0] = 0;
  o->mode = -1;

  /* The log level first, so the other messages obey it. */
  const char *v = getenv("WAVELET_LOG");
  if (v) {
    int l = pick(v, log_names, 4);
    if (l < 0)
      wl__error("WAVELET_LOG='%.64s' is not valid: expected error, warn, info or debug; "
                "keeping warn",
                v);
    else
      o->log_level = l;
  }
  wl__log_set_level((wl__log_level_t)o->log_level);

  if ((v = getenv("WAVELET_MODE"))) {
    int m = pick(v, mode_names, 4);
    if (m < 0)
      wl__error("WAVELET_MODE='%.64s' is not valid: expected off, trace, alloc or gate; "
                "keeping the default",
                v);
    else
      o->mode = m;
  }
  if ((v = getenv("WAVELET_TRACE"))) {
    if (!trace_path_ok(v))
      wl__error("WAVELET_TRACE='%.64s' is not valid: expected a file path (with %%p for the "
                "process id, no other %%); no trace",
                v);
    else
      snprintf(o->trace, sizeof o->trace, "%s", v);
  }
  if ((v = getenv("WAVELET_SHOW_STATS"))) {
    int b = parse_bool(v);
    if (b < 0)
      wl__error("WAVELET_SHOW_STATS='%.64s' is not valid: expected 1/0, true/false, yes/no or "
                "on/off; keeping 0",
                v);
    else
      o->show_stats = b;
  }

  if ((v = getenv("WAVELET_ALLOC_TCACHE"))) {
    size_t n;
    int b = parse_bool(v);
    if (b == 0) {
      o->alloc_tcache_set = true; /* off */
    } else if (b == 1) {
      /* on (1, true, yes, on): the default size, as if unset */
    } else if (b < 0 && wl__parse_size(v, 0, &n) == 0 && n <= ((size_t)1 << 30)) {
      o->alloc_tcache = n;
      o->alloc_tcache_set = true;
    } else if (b < 0) {
      wl__error("WAVELET_ALLOC_TCACHE='%.64s' is not valid: expected a size per thread (K/M/G, "
                "at most 1G), 0/off or 1/on (the default); keeping the default",
                v);
    }
  }

  /* The group's variables: libsched's table (validated the same way, and printed with debug). */
  wl_sched_config_default(&o->sched);
  wl_sched_config_from_env(&o->sched);
  o->sched.flags |= WL_SCHED_MANUAL_GATE;

  /* Default: gate when a group is named, else trace. */
  if (o->mode < 0) o->mode = o->sched.group ? WL__MODE_GATE : WL__MODE_TRACE;
}

void wl__opts_print(void) {
  const wl__opts_t *o = &wl__opts;
  wl__debug("option %-26s %s%s", "WAVELET_MODE", wl__mode_name(o->mode),
            getenv("WAVELET_MODE") ? "" : " (default)");
  wl__debug("option %-26s %s", "WAVELET_TRACE", o->trace[0] ? o->trace : "(none)");
  wl__debug("option %-26s %s", "WAVELET_LOG", log_names[o->log_level]);
  wl__debug("option %-26s %d", "WAVELET_SHOW_STATS", o->show_stats ? 1 : 0);
  if (o->alloc_tcache_set)
    wl__debug("option %-26s %zu", "WAVELET_ALLOC_TCACHE", o->alloc_tcache);
  else
    wl__debug("option %-26s %s", "WAVELET_ALLOC_TCACHE",
              "(default: 8M, at most 1/64 of the budget)");
}
