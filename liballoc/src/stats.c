/* Stats: the counters as a snapshot, a fixed-width table or one JSON object. */
#include "internal.h"

#include <stdio.h>
#include <string.h>

void wl_alloc_stats_get(wl_alloc_t *a, wl_alloc_stats_t *out) {
  if (!out) return;
  if (!a) { /* nothing allocated */
    memset(out, 0, sizeof *out);
    return;
  }
  /* Each field is written atomically under the lock; the snapshot reads them one by one. */
  const size_t n = sizeof *out / sizeof(uint64_t);
  _Static_assert(sizeof(wl_alloc_stats_t) % sizeof(uint64_t) == 0, "stats are 64-bit fields");
  _Static_assert(sizeof(size_t) == sizeof(uint64_t), "64-bit platform");
  const uint64_t *src = (const uint64_t *)&a->st;
  uint64_t *dst = (uint64_t *)out;
  for (size_t i = 0; i < n; i++) dst[i] = __atomic_load_n(&src[i], __ATOMIC_RELAXED);
  out->live_bytes = wl__live(a);
  /* Fragmentation figures need the trees: take the lock for them. */
  wl__lock(a);
  out->free_blocks = wl__tree_count(a->any_tree);
  wl__block_t *n2 = a->any_tree;
  size_t largest = 0;
  while (n2) {
    largest = n2->size;
    n2 = n2->right;
  }
  for (size_t i = 0; i < a->stream_cap; i++) {
    wl__stream_t *s = a->streams[i];
    if (!s) continue;
    out->free_blocks += s->nfifo;
    for (wl__block_t *b = s->fifo_head; b; b = b->fnext)
      if (b->size > largest) largest = b->size;
  }
  out->largest_free = largest;
  wl__tc_stats(a, out);
  wl__unlock(a);
}

typedef struct row_s {
  const char *name;
  size_t off;
  int bytes; /* 1: a byte count */
} row_t;

#define ROW(f, b)                                                                                  \
  { #f, offsetof(wl_alloc_stats_t, f), b }
static const row_t rows[] = {
    ROW(live_bytes, 1),
    ROW(live_peak, 1),
    ROW(mapped_bytes, 1),
    ROW(mapped_peak, 1),
    ROW(physical_bytes, 1),
    ROW(physical_peak, 1),
    ROW(cached_bytes, 1),
    ROW(reserved_bytes, 1),
    ROW(pending_bytes, 1),
    ROW(allocs, 0),
    ROW(frees, 0),
    ROW(small_allocs, 0),
    ROW(maps, 0),
    ROW(unmaps, 0),
    ROW(phys_creates, 0),
    ROW(phys_releases, 0),
    ROW(events_recorded, 0),
    ROW(trims, 0),
    ROW(budget_denials, 0),
    ROW(ooms, 0),
    ROW(bad_calls, 0),
    ROW(device_full_waits, 0),
    ROW(free_blocks, 0),
    ROW(largest_free, 1),
    ROW(tcache_bytes, 1),
    ROW(tcache_hits, 0),
    ROW(tcache_self_fenced, 0),
};

void wl_alloc_stats_print(wl_alloc_t *a, wl_out_fn out, void *arg, int json) {
  if (!a || !out) return;
  wl_alloc_stats_t st;
  wl_alloc_stats_get(a, &st);
  char line[160], hb[32];
  const size_t nrows = sizeof rows / sizeof rows[0];
  if (json) {
    out(arg, "{");
    for (size_t i = 0; i < nrows; i++) {
      uint64_t v;
      memcpy(&v, (const char *)&st + rows[i].off, sizeof v);
      snprintf(line, sizeof line, "%s\"%s\": %llu", i ? ", " : "", rows[i].name,
               (unsigned long long)v);
      out(arg, line);
    }
    out(arg, "}\n");
    return;
  }
  snprintf(line, sizeof line, "%-18s %20s %12s\n", "wavelet allocator", "value", "");
  out(arg, line);
  for (size_t i = 0; i < nrows; i++) {
    uint64_t v;
    memcpy(&v, (const char *)&st + rows[i].off, sizeof v);
    snprintf(line, sizeof line, "%-18s %20llu %12s\n", rows[i].name, (unsigned long long)v,
             rows[i].bytes ? wl__fmt_bytes((size_t)v, hb, sizeof hb) : "");
    out(arg, line);
  }
}
