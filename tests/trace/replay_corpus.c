/* Replays every file of the fuzz corpus (and of any directories given) through the fuzz target,
 * so ctest runs what the fuzzer found without libFuzzer. */
#include "wltest.h"

#include <dirent.h>
#include <stdint.h>
#include <stdlib.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static unsigned replayed;

static void replay_dir(const char *dir) {
  DIR *d = opendir(dir);
  CU_ASSERT_PTR_NOT_NULL_FATAL(d);
  struct dirent *e;
  while ((e = readdir(d))) {
    if (e->d_name[0] == '.') continue;
    char path[4096];
    snprintf(path, sizeof path, "%s/%s", dir, e->d_name);
    FILE *f = fopen(path, "rb");
    if (!f) continue;
    uint8_t *buf = malloc(1 << 22);
    size_t n = fread(buf, 1, 1 << 22, f);
    fclose(f);
    CU_ASSERT_EQUAL(LLVMFuzzerTestOneInput(buf, n), 0);
    /* and prefixes of small inputs (the truncations a crash could leave), read and analysed
     * but not rendered: the renderers' cost does not depend on where a file was cut */
    if (n && n <= 2048) {
      buf[0] &= (uint8_t)~4u;
      for (size_t k = 1; k < n; k += 13) LLVMFuzzerTestOneInput(buf, k);
    }
    free(buf);
    replayed++;
  }
  closedir(d);
}

static void test_replay_corpus(void) {
  replay_dir(WL_CORPUS_DIR);
  replay_dir(WL_GOLDEN_DIR);
  /* the corpus holds seeds and findings: an empty one means it went missing */
  CU_ASSERT(replayed > 4);
}

int main(int argc, char **argv) {
  static const wl_test_case_t cases[] = {{"replay_corpus", test_replay_corpus}, {NULL, NULL}};
  return wl_test_main(argc, argv, "trace_corpus", cases);
}
