/* What the LD_PRELOAD test module reports to pinned_preload_check. */
#ifndef WAVELET_TESTS_PRELOAD_PROBE_H
#define WAVELET_TESTS_PRELOAD_PROBE_H

#include <stdbool.h>
#include <stddef.h>

typedef struct wl_pinned_probe_s {
  int init_rc;                    /* wl__pinned_init's result in the module's constructor */
  void *block;                    /* a block the constructor allocated */
  bool block_owned;               /* wl__pinned_owns(block) */
  bool second_block_ok;           /* an allocation and free after strdup/free churn */
  void *(*module_malloc)(size_t); /* malloc and free as the module's code sees them */
  void (*module_free)(void *);
} wl_pinned_probe_t;

typedef void wl_pinned_probe_fn(wl_pinned_probe_t *out);

/* Exported by the module (looked up with dlsym by the check). */
void wl_pinned_probe(wl_pinned_probe_t *out);

#endif
