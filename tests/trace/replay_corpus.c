/* Replays every file of the fuzz corpus through the fuzz target, so ctest runs what the fuzzer
 * found without libFuzzer, and the golden traces too, behind a mode byte, after checking with the
 * library itself that each golden opens, reads and analyses without error. */
#include "wltest.h"

#include <dirent.h>
#include <stdint.h>
#include <stdlib.h>
#include <wavelet/trace.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

/* The fuzz target's first byte (fuzz_reader.c): the rest is the file. Bit 2 renders too. */
#define MODE_AS_IS  0u
#define MODE_RENDER 4u

static unsigned corpus_files, golden_files;

/* The file's bytes after one free byte (for the mode), in a buffer of its own; NULL if unreadable.
 */
static uint8_t *read_file(const char *path, size_t *n) {
  FILE *f = fopen(path, "rb");
  if (!f) return NULL;
  uint8_t *buf = malloc(1 + (1 << 22));
  *n = buf ? fread(buf + 1, 1, 1 << 22, f) : 0;
  fclose(f);
  return buf;
}

/* A golden trace is valid: opened from memory (as the fuzz target opens it) and from its file,
 * read to its END record and analysed, without an error. */
static void check_golden(const char *path, const uint8_t *data, size_t n) {
  wl_trace_reader_t *r = NULL;
  CU_ASSERT_EQUAL(wl_trace_open_mem(&r, data, n, path, 0), 0);
  if (r) {
    wl_trace_event_t ev[64];
    long k, events = 0;
    while ((k = wl_trace_read(r, ev, 64)) > 0) events += k;
    CU_ASSERT_EQUAL(k, 0);
    CU_ASSERT(events > 0);
    CU_ASSERT_STRING_EQUAL(wl_trace_reader_error(r), "");
    if (k) fprintf(stderr, "\n%s: %s\n", path, wl_trace_reader_error(r));
    wl_trace_reader_close(r);
  }
  wl_trace_analysis_t *a = NULL;
  wl_trace_reader_info_t info;
  char err[256] = "";
  int rc = wl_trace_analyze_file(path, 0, NULL, &a, &info, err, sizeof err);
  CU_ASSERT_EQUAL(rc, 0);
  if (rc) fprintf(stderr, "\n%s: %s\n", path, err);
  if (!a) return;
  CU_ASSERT_TRUE(info.complete);
  wl_trace_summary_t s;
  wl_trace_analysis_summary(a, &s);
  CU_ASSERT(s.events > 0 && s.allocs > 0 && s.peak_bytes > 0);
  wl_trace_analysis_destroy(a);
}

/* Every file of dir through the fuzz target. Its return value is always 0: what fails is a crash
 * or an abort (a reader error that names no input and byte aborts). */
static void replay_dir(const char *dir, bool golden) {
  DIR *d = opendir(dir);
  CU_ASSERT_PTR_NOT_NULL_FATAL(d);
  struct dirent *e;
  while ((e = readdir(d))) {
    if (e->d_name[0] == '.') continue;
    char path[4096];
    snprintf(path, sizeof path, "%s/%s", dir, e->d_name);
    size_t n = 0;
    uint8_t *buf = read_file(path, &n);
    if (!buf) continue;
    if (golden) {
      /* A trace file, not a fuzz input: the target reads its input after a mode byte. */
      check_golden(path, buf + 1, n);
      buf[0] = MODE_AS_IS;
      LLVMFuzzerTestOneInput(buf, n + 1);
      buf[0] = MODE_RENDER;
      LLVMFuzzerTestOneInput(buf, n + 1);
      golden_files++;
    } else {
      /* A fuzz input: its first byte is the mode. */
      LLVMFuzzerTestOneInput(buf + 1, n);
      /* and prefixes of small inputs (the truncations a crash could leave), read and analysed
       * but not rendered: the renderers' cost does not depend on where a file was cut */
      if (n && n <= 2048) {
        buf[1] &= (uint8_t)~MODE_RENDER;
        for (size_t k = 1; k < n; k += 13) LLVMFuzzerTestOneInput(buf + 1, k);
      }
      corpus_files++;
    }
    free(buf);
  }
  closedir(d);
}

static void test_replay_corpus(void) {
  replay_dir(WL_CORPUS_DIR, false);
  /* the corpus holds seeds and findings: an empty one means it went missing */
  CU_ASSERT(corpus_files > 4);
}

static void test_replay_goldens(void) {
  replay_dir(WL_GOLDEN_DIR, true);
  CU_ASSERT(golden_files >= 4);
}

int main(int argc, char **argv) {
  static const wl_test_case_t cases[] = {
      {"replay_corpus", test_replay_corpus}, {"replay_goldens", test_replay_goldens}, {NULL, NULL}};
  return wl_test_main(argc, argv, "trace_corpus", cases);
}
