/* The shared CUnit runner: every test binary registers suites and calls wl_test_main. */
#ifndef WAVELET_TESTS_WLTEST_H
#define WAVELET_TESTS_WLTEST_H

#include <CUnit/Basic.h>
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

typedef struct wl_test_case_s {
  const char *name;
  void (*fn)(void);
} wl_test_case_t;

/* With WLTEST_GVISOR=1 (ctest's _gvisor variants), true only when libwltest_gvisor.so is in
 * effect: its marker is found and an open file description lock is refused with EINVAL. ld.so
 * only warns about a preload it cannot load, and a variant run on the plain kernel would pass
 * without testing what it is for. Says why on stderr when false. */
static inline bool wl_test_gvisor_in_effect(void) {
  const char *e = getenv("WLTEST_GVISOR");
  if (!e || strcmp(e, "1")) return true;
  if (!dlsym(RTLD_DEFAULT, "wltest_gvisor_marker")) {
    fprintf(stderr, "WLTEST_GVISOR=1 but libwltest_gvisor.so is not loaded (LD_PRELOAD=%s)\n",
            getenv("LD_PRELOAD") ? getenv("LD_PRELOAD") : "");
    return false;
  }
  FILE *f = tmpfile();
  if (!f) {
    fprintf(stderr, "WLTEST_GVISOR=1: no temporary file to try a lock on: %s\n", strerror(errno));
    return false;
  }
  struct flock fl;
  memset(&fl, 0, sizeof fl);
  fl.l_type = F_WRLCK;
  fl.l_whence = SEEK_SET;
  fl.l_len = 1;
  int rc = fcntl(fileno(f), F_OFD_SETLK, &fl);
  int err = errno;
  fclose(f);
  if (rc != -1 || err != EINVAL) {
    fprintf(stderr, "WLTEST_GVISOR=1 but F_OFD_SETLK was not refused with EINVAL (rc %d, %s)\n", rc,
            rc ? strerror(err) : "success");
    return false;
  }
  return true;
}

/* Runs the cases as one suite (argv[1], when given, selects tests whose name contains it).
 * Returns nonzero when any assertion failed, as ctest needs, or when WLTEST_GVISOR=1 is set and
 * the gVisor stand-in is not in effect. */
static inline int wl_test_main(int argc, char **argv, const char *suite,
                               const wl_test_case_t *cases) {
  if (!wl_test_gvisor_in_effect()) {
    fprintf(stderr, "%s: the gVisor stand-in is not in effect: failing\n", suite);
    return 2;
  }
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

/* In a child process's part of a test (no CUnit there): returns 1 from the function, saying
 * where, when c does not hold. */
#define WL_CHILD_CHECK(c)                                                                          \
  do {                                                                                             \
    if (!(c)) {                                                                                    \
      fprintf(stderr, "child: %s:%d: %s\n", __FILE__, __LINE__, #c);                               \
      return 1;                                                                                    \
    }                                                                                              \
  } while (0)

/* Bytes as 2n hex digits and a NUL, and back (false unless s is exactly 2n hex digits): for
 * handles passed to a child process on its command line. */
static inline void wl_test_hex(const void *p, size_t n, char *out) {
  for (size_t i = 0; i < n; i++) sprintf(out + 2 * i, "%02x", ((const unsigned char *)p)[i]);
}

static inline bool wl_test_unhex(const char *s, void *p, size_t n) {
  if (strlen(s) != 2 * n) return false;
  for (size_t i = 0; i < n; i++) {
    unsigned b;
    if (sscanf(s + 2 * i, "%2x", &b) != 1) return false;
    ((unsigned char *)p)[i] = (unsigned char)b;
  }
  return true;
}

/* Runs this test binary again, as argv0, for the cases named which, with name=value set (what
 * a library reads once at start): true when the child passed. */
static inline bool wl_test_rerun(const char *name, const char *value, const char *argv0,
                                 const char *which) {
  pid_t child = fork();
  if (child < 0) return false;
  if (child == 0) {
    setenv(name, value, 1);
    execl("/proc/self/exe", argv0, which, (char *)NULL);
    _exit(127);
  }
  int st = 0;
  return waitpid(child, &st, 0) == child && WIFEXITED(st) && WEXITSTATUS(st) == 0;
}

#endif
