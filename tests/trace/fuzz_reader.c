/* The trace reader's fuzz target (libFuzzer): reads and analyses arbitrary bytes. When the first
 * byte is odd the checksums are first made right, so mutations get past them to the decoder and
 * the analysis; otherwise the bytes are read as they are. Bit 2 asks for salvage mode, bit 4
 * renders the report (SVG, Perfetto, CSV) to /dev/null. Replayed over the corpus by ctest, and
 * over the golden traces with a mode byte put in front (replay_corpus.c). */
#include "internal.h"
#include "report.h" /* bench/trace: the renderers are fuzzed too (mode bit 4) */

#include <stdlib.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

/* Recomputes the header and block checksums and block numbers of a trace-shaped buffer. */
static void fix_checksums(uint8_t *b, size_t len) {
  if (len < 16 || memcmp(b, WL_TRACE_MAGIC, 8) != 0) return;
  uint32_t hs = wl__get32(b + 12);
  if (hs < WL_TRACE_HEADER_SIZE || hs > 4096 || hs % 8 || hs > len) return;
  wl__put32(b + 16, 0);
  wl__put32(b + 16, wl__crc32c(0, b, hs));
  size_t off = hs;
  for (uint64_t seq = 0; off + WL_TRACE_BLOCK_HEADER <= len; seq++) {
    uint8_t *h = b + off;
    uint32_t bytes = wl__get32(h + 4);
    if (bytes > WL_TRACE_BLOCK_LIMIT || bytes % 8) return;
    wl__put32(h, 0x4b424c57u);
    wl__put64(h + 16, seq);
    size_t have = len - off - WL_TRACE_BLOCK_HEADER;
    if (have >= bytes) wl__put32(h + 12, wl__payload_sum(h + WL_TRACE_BLOCK_HEADER, bytes));
    wl__put32(h + 28, wl__crc32c(0, h, 28));
    off += WL_TRACE_BLOCK_HEADER + bytes;
  }
}

/* The report's files for one analysed trace (twice, so the combined panel is drawn). */
static void render(wl_trace_analysis_t *a, const wl_trace_summary_t *s,
                   const wl_trace_capacity_t *c) {
  wlt_proc_t p[2];
  memset(p, 0, sizeof p);
  for (int i = 0; i < 2; i++) {
    p[i].path = "fuzz.wlt";
    p[i].a = a;
    p[i].s = *s;
    p[i].bins = wl_trace_analysis_bins(a, &p[i].nbins, &p[i].t0, &p[i].width, &p[i].flags);
    p[i].iters = wl_trace_analysis_iterations(a, &p[i].niters);
    p[i].spans = wl_trace_analysis_spans(a, &p[i].nspans);
    snprintf(p[i].label, sizeof p[i].label, "pid %u", s->header.pid);
  }
  wlt_report_t r;
  memset(&r, 0, sizeof r);
  r.p = p;
  r.k = 2;
  r.tmin = s->first_ns;
  r.tmax = s->last_ns;
  r.capacity = c->capacity_bytes;
  r.cap = *c;
  r.have_cap = 1;
  const wl_trace_analysis_t *two[2] = {a, a};
  if (wl_trace_combine(two, 2, 0, &r.comb)) r.comb = NULL;
  wlt_write_svg(&r, "/dev/null");
  wlt_write_perfetto(&r, "/dev/null");
  wlt_write_csv(&r, "/dev/null");
  wl_trace_combined_destroy(r.comb);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  if (size < 1) return 0;
  size_t len = size - 1;
  uint8_t *b = malloc(len ? len : 1);
  if (!b) return 0;
  memcpy(b, data + 1, len);
  if (data[0] & 1) fix_checksums(b, len);
  unsigned flags = data[0] & 2 ? WL_TRACE_OPEN_SALVAGE : 0;
  wl_trace_reader_t *r = NULL;
  wl_trace_analysis_t *a = NULL;
  if (wl_trace_open_mem(&r, b, len, "fuzz.wlt", flags) == 0) {
    wl_trace_analysis_config_t cfg;
    wl_trace_analysis_config_default(&cfg);
    cfg.bins = 4096;
    cfg.max_iterations = 256;
    cfg.max_spans = 256;
    if (wl_trace_analysis_create(&a, wl_trace_reader_header(r), &cfg) == 0) {
      wl_trace_event_t evs[64];
      long k;
      while ((k = wl_trace_read(r, evs, 64)) > 0) {
        for (long i = 0; i < k; i++) (void)wl_trace_reader_string(r, evs[i].id);
        wl_trace_analysis_feed(a, evs, (size_t)k);
      }
      wl_trace_analysis_finish(a);
      wl_trace_summary_t s;
      wl_trace_analysis_summary(a, &s);
      wl_trace_capacity_t c;
      wl_trace_capacity(a, s.peak_bytes ? 3 * s.peak_bytes : 1, 1.0, &c);
      const wl_trace_analysis_t *one[2] = {a, a};
      wl_trace_combined_t *cb = NULL;
      if (wl_trace_combine(one, 2, 1024, &cb) == 0) wl_trace_combined_destroy(cb);
      double off[2];
      uint64_t pk;
      wl_trace_best_offsets(one, 2, off, &pk);
      if (data[0] & 4) render(a, &s, &c);
    }
  }
  /* Every failure names the input and a byte. */
  const char *msg = wl_trace_reader_error(r);
  if (msg[0] && !strstr(msg, "fuzz.wlt: byte ")) abort();
  wl_trace_analysis_destroy(a);
  wl_trace_reader_close(r);
  free(b);
  return 0;
}
