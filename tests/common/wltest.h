/* The shared CUnit runner: every test binary registers suites and calls wl_test_main. */
#ifndef WAVELET_TESTS_WLTEST_H
#define WAVELET_TESTS_WLTEST_H

#include <CUnit/Basic.h>
#include <stdio.h>
#include <string.h>

typedef struct wl_test_case_s {
  const char *name;
  void (*fn)(void);
} wl_test_case_t;

/* Runs the cases as one suite (argv[1], when given, selects tests whose name contains it).
 * Returns nonzero when any assertion failed, as ctest needs. */
static inline int wl_test_main(int argc, char **argv, const char *suite,
                               const wl_test_case_t *cases) {
  if (CU_initialize_registry() != CUE_SUCCESS) return 2;
  CU_pSuite s = CU_add_suite(suite, NULL, NULL);
  if (!s) return 2;
  for (const wl_test_case_t *c = cases; c->name; c++)
    if (argc < 2 || strstr(c->name, argv[1]))
      if (!CU_add_test(s, c->name, c->fn)) return 2;
  CU_basic_set_mode(CU_BRM_VERBOSE);
  CU_basic_run_tests();
  unsigned failures = CU_get_number_of_failures();
  unsigned ran = CU_get_number_of_tests_run();
  CU_cleanup_registry();
  if (ran == 0) {
    fprintf(stderr, "%s: no test matched\n", suite);
    return 2;
  }
  return failures != 0;
}

#endif
