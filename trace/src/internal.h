/* libwltrace internals shared by the writer, the reader and the analysis: byte order, CRC-32C and
 * the record encoding. */
#ifndef WAVELET_TRACE_INTERNAL_H
#define WAVELET_TRACE_INTERNAL_H

#include "wavelet/trace.h"

#include <stdint.h>
#include <string.h>

#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "libwltrace assumes a little-endian host (the file format is little-endian)"
#endif

#define WL__BLOCK_MAGIC   0x4b424c57u   /* "WLBK" */
#define WL__WRITE_PAYLOAD (64u * 1024u) /* the writer's block payload size */
#define WL__REC_BYTES     40u
#define WL__LAUNCH_BYTES  56u

static inline uint32_t wl__get32(const uint8_t *p) {
  uint32_t v;
  memcpy(&v, p, 4);
  return v;
}
static inline uint64_t wl__get64(const uint8_t *p) {
  uint64_t v;
  memcpy(&v, p, 8);
  return v;
}
static inline uint16_t wl__get16(const uint8_t *p) {
  uint16_t v;
  memcpy(&v, p, 2);
  return v;
}
static inline void wl__put16(uint8_t *p, uint16_t v) {
  memcpy(p, &v, 2);
}
static inline void wl__put32(uint8_t *p, uint32_t v) {
  memcpy(p, &v, 4);
}
static inline void wl__put64(uint8_t *p, uint64_t v) {
  memcpy(p, &v, 8);
}

/* crc32c.c: CRC-32C (Castagnoli), with the SSE4.2 instruction where the CPU has it. crc is the
 * running value (0 to start). */
uint32_t wl__crc32c(uint32_t crc, const void *data, size_t len);
/* The block payload checksum (len a multiple of 8): CRC-32C of the 16 bytes made of four lane
 * CRCs, lane j being the CRC-32C of 8-byte words j, j+4, j+8, ... (computed in one pass). */
uint32_t wl__payload_sum(const void *data, size_t len);

/* format.c */
/* Encodes the header into 256 bytes (CRC filled in). */
void wl__header_encode(const wl_trace_header_t *h, uint8_t out[WL_TRACE_HEADER_SIZE]);
/* Decodes and checks a header: 0, or the negative errno wl_trace_open documents, with a phrase in
 * why and the offending offset in *at. */
int wl__header_decode(const uint8_t *in, size_t len, wl_trace_header_t *h, uint32_t *hsize,
                      const char **why, uint64_t *at);
/* Bytes the record for ev takes (40 or 56). */
static inline size_t wl__record_bytes(unsigned kind) {
  return kind == WL_TRACE_LAUNCH ? WL__LAUNCH_BYTES : WL__REC_BYTES;
}
/* Encodes ev with its time relative to origin; returns the bytes written. */
size_t wl__record_encode(const wl_trace_event_t *ev, uint64_t origin, uint8_t *out);
/* Encodes a block header for a payload. */
void wl__block_header(uint8_t out[WL_TRACE_BLOCK_HEADER], const uint8_t *payload, uint32_t bytes,
                      uint32_t records, uint64_t seq);

/* Tests only (reader.c): called when a file reader reaches the end of a trace without END, just
 * before it asks whether the writer is alive. A writer that dies then may have written more
 * blocks first; the hook lets a test put that death in this window instead of waiting for the
 * race. NULL in every program. */
extern void (*wl__reader_eof_hook)(void *arg);
extern void *wl__reader_eof_hook_arg;

/* The longest a TSC line is trusted past its anchor, in ns (writer.c: the line's dmax). */
#define WL__TSC_TRUST_MAX_NS 2.5e8

/* Tests only (writer.c): the time an event emitted now gets; the shared TSC line set as a
 * re-anchor sets it (line: tsc0, ns0, mult, dsw, nsw, rate, dmax; all 0: no line), only while no
 * writer's flusher runs; the line's time d ticks past its anchor, by the emit path's 64-bit form
 * (live, for d <= dmax) or the anchor's 128-bit one. */
uint64_t wl__trace_clock_now(void);
void wl__trace_clock_set(const uint64_t line[7]);
uint64_t wl__trace_line_at(uint64_t d, const uint64_t line[7], int live);

#endif
