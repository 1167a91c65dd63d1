/* A test module holding the pinned arena, loaded with LD_PRELOAD by pinned_preload_check to show
 * that the process's malloc, and the module's own, stay glibc's. */
#include <errno.h>
#include <limits.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#include "pinned.h"
#include "preload_probe.h"

static int chunk_alloc(void *ctx, size_t size, void **out) {
  void *p = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (p == MAP_FAILED) return -ENOMEM;
  *out = p;
  return 0;
}

static void chunk_free(void *ctx, void *p, size_t size) {
  munmap(p, size);
}

static int g_init_rc = -1;
static void *g_block;

__attribute__((constructor)) static void module_init(void) {
  static const wl__pinned_ops_t ops = {.chunk_alloc = chunk_alloc, .chunk_free = chunk_free};
#ifdef WL_JEMALLOC_SO
  wl__pinned_set_library(WL_JEMALLOC_SO, NULL); /* this module is not beside it */
#endif
  g_init_rc = wl__pinned_init(&ops);
  g_block = wl__pinned_alloc(1000, 0);
}

__attribute__((visibility("default"))) void wl_pinned_probe(wl_pinned_probe_t *out) {
  memset(out, 0, sizeof(*out));
  out->init_rc = g_init_rc;
  out->block = g_block;
  out->block_owned = wl__pinned_owns(g_block);
  out->module_malloc = malloc;
  out->module_free = free;
  /* glibc allocates these; the module's free must be glibc's too, or this crashes. */
  for (int i = 0; i < 1000; i++) {
    char *s = strdup("wavelet");
    free(s);
  }
  char *rp = realpath(".", NULL);
  free(rp);
  void *p = wl__pinned_alloc(5000, 0);
  out->second_block_ok = p && wl__pinned_free(p) == 0;
}
