/* libsched's options: the defaults, the WAVELET_* variables (one table, range-checked) and the
 * memory limit they resolve to. */
#include "internal.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MiB ((size_t)1 << 20)
/* The default budget leaves this much of the device to what the ledger cannot see (contexts of
 * processes outside the group, the driver's own allocations). */
#define MARGIN_MIN (256 * MiB)
#define MARGIN_DIV 20 /* 5 % */

void wl_sched_config_default(wl_sched_config_t *cfg) {
  memset(cfg, 0, sizeof *cfg);
  cfg->role = -1;
  cfg->waves = 2;
  cfg->mem_limit = WL_SCHED_MEM_DEFAULT;
  cfg->alloc_timeout_ms = 5000;
  cfg->gate_timeout_ms = 5000;
}

size_t wl__resolve_limit(const wl_sched_config_t *cfg) {
  if (cfg->mem_limit != WL_SCHED_MEM_DEFAULT) return cfg->mem_limit;
  size_t dev = cfg->device_memory;
  if (cfg->mem_limit_percent) {
    if (!dev) {
      wl__warn("WAVELET_MEM_LIMIT=%u%% needs the device's memory size, which is unknown here; "
               "no memory limit",
               cfg->mem_limit_percent);
      return 0;
    }
    return wl__percent_of(dev, cfg->mem_limit_percent);
  }
  if (!dev) return 0;
  size_t margin = WL_MAX(dev / MARGIN_DIV, MARGIN_MIN);
  if (margin >= dev) margin = dev / 2;
  return dev - margin;
}

/* ---- the variables ---------------------------------------------------------------------------*/

typedef enum { OPT_GROUP, OPT_INT, OPT_UINT, OPT_LIMIT } opt_kind_t;

typedef struct opt_s {
  const char *name;
  opt_kind_t kind;
  long min, max;
  const char *expected; /* for the message */
} opt_t;

static const opt_t opts[] = {
    {"WAVELET_GROUP", OPT_GROUP, 0, 0,
     "1 to 48 characters of A-Z a-z 0-9 . _ -, not starting with '.' or '-'"},
    {"WAVELET_ROLE", OPT_INT, 0, WL_SCHED_MAX_MEMBERS - 1, "a wave index from 0 to 63"},
    {"WAVELET_WAVES", OPT_UINT, 2, WL_SCHED_MAX_MEMBERS, "an integer from 2 to 64"},
    {"WAVELET_MEM_LIMIT", OPT_LIMIT, 0, 0,
     "bytes with an optional K/M/G/T suffix (0: no limit) or a percentage of device memory "
     "from 1% to 100%"},
    {"WAVELET_ALLOC_TIMEOUT_MS", OPT_UINT, 0, 3600000, "milliseconds from 0 to 3600000"},
    {"WAVELET_GATE_TIMEOUT_MS", OPT_UINT, 0, 3600000, "milliseconds from 0 (never) to 3600000"},
};

/* Parses a whole decimal number in [min, max]; false on anything else. */
static bool parse_long(const char *v, long min, long max, long *out) {
  if (!v || !*v) return false;
  long x = 0;
  for (const char *p = v; *p; p++) {
    if (*p < '0' || *p > '9') return false;
    if (x > (max - (*p - '0')) / 10) return false;
    x = x * 10 + (*p - '0');
  }
  if (x < min) return false;
  *out = x;
  return true;
}

static void current(const wl_sched_config_t *c, unsigned i, char *buf, size_t len) {
  switch (i) {
  case 0:
    snprintf(buf, len, "%s", c->group ? c->group : "(none)");
    break;
  case 1:
    snprintf(buf, len, "%d", c->role);
    break;
  case 2:
    snprintf(buf, len, "%u", c->waves);
    break;
  case 3:
    if (c->mem_limit == WL_SCHED_MEM_DEFAULT && c->mem_limit_percent)
      snprintf(buf, len, "%u%%", c->mem_limit_percent);
    else if (c->mem_limit == WL_SCHED_MEM_DEFAULT)
      snprintf(buf, len, "default");
    else
      snprintf(buf, len, "%zu", c->mem_limit);
    break;
  case 4:
    snprintf(buf, len, "%u", c->alloc_timeout_ms);
    break;
  default:
    snprintf(buf, len, "%u", c->gate_timeout_ms);
    break;
  }
}

/* Applies one variable's value; false when it is not valid. */
static bool apply(wl_sched_config_t *c, unsigned i, const char *v) {
  const opt_t *o = &opts[i];
  long x;
  switch (o->kind) {
  case OPT_GROUP:
    if (wl_sched_group_name_check(v)) return false;
    c->group = v;
    return true;
  case OPT_INT:
    if (!parse_long(v, o->min, o->max, &x)) return false;
    c->role = (int)x;
    return true;
  case OPT_UINT:
    if (!parse_long(v, o->min, o->max, &x)) return false;
    if (i == 2)
      c->waves = (unsigned)x;
    else if (i == 4)
      c->alloc_timeout_ms = (uint32_t)x;
    else
      c->gate_timeout_ms = (uint32_t)x;
    return true;
  case OPT_LIMIT: {
    size_t n = strlen(v), bytes;
    if (n && v[n - 1] == '%') {
      /* Parse the digits as a percentage of 100: exactly the number. */
      if (wl__parse_size(v, 100, &bytes) || bytes < 1 || bytes > 100) return false;
      c->mem_limit = WL_SCHED_MEM_DEFAULT;
      c->mem_limit_percent = (unsigned)bytes;
      return true;
    }
    if (wl__parse_size(v, 0, &bytes) || bytes == WL_SCHED_MEM_DEFAULT) return false;
    c->mem_limit = bytes;
    c->mem_limit_percent = 0;
    return true;
  }
  }
  return false;
}

int wl_sched_config_from_env(wl_sched_config_t *cfg) {
  if (!cfg) return -EINVAL;
  int rc = 0;
  for (unsigned i = 0; i < sizeof opts / sizeof opts[0]; i++) {
    const char *v = getenv(opts[i].name);
    if (!v) continue;
    if (!apply(cfg, i, v)) {
      char keep[48];
      current(cfg, i, keep, sizeof keep);
      wl__error("%s='%.64s' is not valid: expected %s; keeping %s", opts[i].name, v,
                opts[i].expected, keep);
      rc = -EINVAL;
    }
  }
  if (wl__log_get_level() >= WL_LOG_DEBUG) {
    for (unsigned i = 0; i < sizeof opts / sizeof opts[0]; i++) {
      char val[48];
      current(cfg, i, val, sizeof val);
      wl__debug("option %-26s %s%s", opts[i].name, val, getenv(opts[i].name) ? "" : " (default)");
    }
  }
  return rc;
}
