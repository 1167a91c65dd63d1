/* Run under LD_PRELOAD of the pinned test module: checks that the module is there and serves,
 * and that malloc (the program's and the module's) is still the C library's. Exit status: the
 * number of failed checks; 100 when the module is not loaded. */
#include <dlfcn.h>
#include <malloc.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "preload_probe.h"

static int failures;

static void check(int ok, const char *what) {
  printf("%s %s\n", ok ? "ok  " : "FAIL", what);
  if (!ok) failures++;
}

/* The object malloc comes from when no jemalloc is involved. */
#if defined(__SANITIZE_ADDRESS__)
#define EXPECT_MALLOC_FROM "libasan"
#elif defined(__SANITIZE_THREAD__)
#define EXPECT_MALLOC_FROM "libtsan"
#else
#define EXPECT_MALLOC_FROM "libc.so"
#define GLIBC_MALLOC       1
#endif

static const char *object_of(void *fn) {
  Dl_info di;
  if (!fn || !dladdr(fn, &di) || !di.dli_fname) return "?";
  const char *slash = strrchr(di.dli_fname, '/');
  return slash ? slash + 1 : di.dli_fname;
}

int main(void) {
  wl_pinned_probe_fn *probe = (wl_pinned_probe_fn *)dlsym(RTLD_DEFAULT, "wl_pinned_probe");
  if (!probe) {
    printf("the pinned test module is not loaded\n");
    return 100;
  }
  wl_pinned_probe_t r;
  probe(&r);
  check(r.init_rc == 0, "the module initialised the pinned arena");
  check(r.block && r.block_owned, "the module's constructor got a pinned block");
  check(r.second_block_ok, "the module allocates and frees after strdup/free churn");

  void *m = dlsym(RTLD_DEFAULT, "malloc");
  printf("     malloc comes from %s\n", object_of(m));
  check(strstr(object_of(m), EXPECT_MALLOC_FROM) != NULL,
        "malloc is the one the process has without the module (" EXPECT_MALLOC_FROM ")");
  check(strstr(object_of((void *)free), EXPECT_MALLOC_FROM) != NULL,
        "free is the one the process has without the module (" EXPECT_MALLOC_FROM ")");
  check((void *)r.module_malloc == m, "the module's malloc is the process's malloc");
  check((void *)r.module_free == dlsym(RTLD_DEFAULT, "free"), "the module's free is the process's");
  const char *hidden[] = {"mallocx",
                          "dallocx",
                          "mallctl",
                          "wl__je_mallocx",
                          "wl__je_malloc",
                          "je_arena_new",
                          "wl__je_je_arena_new",
                          "wl__pinned_alloc",
                          NULL};
  for (int i = 0; hidden[i]; i++) {
    char what[96];
    snprintf(what, sizeof(what), "%s is not visible in the process", hidden[i]);
    check(dlsym(RTLD_DEFAULT, hidden[i]) == NULL, what);
  }
#ifdef GLIBC_MALLOC
  /* glibc's own behaviour: a 1-byte request has 24 usable bytes on 64-bit, and mallinfo2
   * counts a heap block (above the thread cache's sizes) in use; jemalloc would do neither. */
  void *one = malloc(1);
  check(malloc_usable_size(one) == 24, "malloc_usable_size(malloc(1)) is glibc's 24");
  struct mallinfo2 before = mallinfo2();
  char *volatile k = malloc(100000); /* volatile: the pair must not be optimised away */
  if (k) k[0] = 1;
  struct mallinfo2 after = mallinfo2();
  check(after.uordblks >= before.uordblks + 100000, "mallinfo2 sees a 100000-byte malloc");
  free(k);
  free(one);
#endif
  printf("%d failure(s)\n", failures);
  return failures;
}
