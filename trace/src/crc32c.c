/* CRC-32C of trace headers and blocks: the SSE4.2 crc32 instruction when present, else a
 * slice-by-8 table (the reader checks every byte, so this is on the report's critical path). */
#include "internal.h"

#include <pthread.h>

static uint32_t crc_table[8][256];
static pthread_once_t crc_once = PTHREAD_ONCE_INIT;

static void crc_init(void) {
  for (uint32_t i = 0; i < 256; i++) {
    uint32_t c = i;
    for (int k = 0; k < 8; k++) c = c & 1 ? (c >> 1) ^ 0x82f63b78u : c >> 1;
    crc_table[0][i] = c;
  }
  for (uint32_t i = 0; i < 256; i++)
    for (int t = 1; t < 8; t++)
      crc_table[t][i] = (crc_table[t - 1][i] >> 8) ^ crc_table[0][crc_table[t - 1][i] & 0xff];
}

static uint32_t crc_soft(uint32_t crc, const uint8_t *p, size_t n) {
  pthread_once(&crc_once, crc_init);
  crc = ~crc;
  while (n >= 8) {
    uint64_t v = wl__get64(p) ^ crc;
    crc = crc_table[7][v & 0xff] ^ crc_table[6][(v >> 8) & 0xff] ^ crc_table[5][(v >> 16) & 0xff] ^
          crc_table[4][(v >> 24) & 0xff] ^ crc_table[3][(v >> 32) & 0xff] ^
          crc_table[2][(v >> 40) & 0xff] ^ crc_table[1][(v >> 48) & 0xff] ^ crc_table[0][v >> 56];
    p += 8;
    n -= 8;
  }
  while (n--) crc = (crc >> 8) ^ crc_table[0][(crc ^ *p++) & 0xff];
  return ~crc;
}

#if defined(__x86_64__) && defined(__GNUC__)
__attribute__((target("sse4.2"))) static uint32_t crc_hw(uint32_t crc, const uint8_t *p, size_t n) {
  uint64_t c = ~crc;
  while (n >= 8) {
    c = __builtin_ia32_crc32di(c, wl__get64(p));
    p += 8;
    n -= 8;
  }
  uint32_t c32 = (uint32_t)c;
  while (n--) c32 = __builtin_ia32_crc32qi(c32, *p++);
  return ~c32;
}

/* Four independent chains: the instruction's latency is three cycles, its throughput one. */
__attribute__((target("sse4.2"))) static void lanes_hw(const uint8_t *p, size_t words,
                                                       uint32_t out[4]) {
  uint64_t c0 = ~0u, c1 = ~0u, c2 = ~0u, c3 = ~0u;
  size_t i = 0;
  for (; i + 4 <= words; i += 4, p += 32) {
    c0 = __builtin_ia32_crc32di(c0, wl__get64(p));
    c1 = __builtin_ia32_crc32di(c1, wl__get64(p + 8));
    c2 = __builtin_ia32_crc32di(c2, wl__get64(p + 16));
    c3 = __builtin_ia32_crc32di(c3, wl__get64(p + 24));
  }
  if (i < words) c0 = __builtin_ia32_crc32di(c0, wl__get64(p)), p += 8, i++;
  if (i < words) c1 = __builtin_ia32_crc32di(c1, wl__get64(p)), p += 8, i++;
  if (i < words) c2 = __builtin_ia32_crc32di(c2, wl__get64(p));
  out[0] = ~(uint32_t)c0;
  out[1] = ~(uint32_t)c1;
  out[2] = ~(uint32_t)c2;
  out[3] = ~(uint32_t)c3;
}

static int crc_have_hw = -1;

static int have_hw(void) {
  int hw = __atomic_load_n(&crc_have_hw, __ATOMIC_RELAXED);
  if (hw < 0) {
    __builtin_cpu_init();
    hw = __builtin_cpu_supports("sse4.2") ? 1 : 0;
    __atomic_store_n(&crc_have_hw, hw, __ATOMIC_RELAXED);
  }
  return hw;
}

uint32_t wl__crc32c(uint32_t crc, const void *data, size_t len) {
  return have_hw() ? crc_hw(crc, data, len) : crc_soft(crc, data, len);
}
#else
static int have_hw(void) {
  return 0;
}
static void lanes_hw(const uint8_t *p, size_t words, uint32_t out[4]) {
  (void)p, (void)words, (void)out;
}
uint32_t wl__crc32c(uint32_t crc, const void *data, size_t len) {
  return crc_soft(crc, data, len);
}
#endif

uint32_t wl__payload_sum(const void *data, size_t len) {
  const uint8_t *p = data;
  size_t words = len / 8;
  uint32_t lane[4] = {0, 0, 0, 0};
  if (have_hw()) {
    lanes_hw(p, words, lane);
  } else {
    for (size_t i = 0; i < words; i++) lane[i % 4] = crc_soft(lane[i % 4], p + 8 * i, 8);
  }
  uint8_t b[16];
  for (int j = 0; j < 4; j++) wl__put32(b + 4 * j, lane[j]);
  return crc_soft(0, b, 16);
}
