/* The trace file format's encoding: the file header, block headers and event records (the layout
 * is documented in include/wavelet/trace.h). */
#include "internal.h"

#include <errno.h>

static const char *const kind_names[WL_TRACE_KIND_COUNT] = {
    [WL_TRACE_ALLOC] = "alloc",
    [WL_TRACE_FREE_REQ] = "free_requested",
    [WL_TRACE_FREE_DONE] = "free_completed",
    [WL_TRACE_MAP] = "map",
    [WL_TRACE_UNMAP] = "unmap",
    [WL_TRACE_PHYS_RELEASE] = "phys_release",
    [WL_TRACE_LAUNCH] = "launch",
    [WL_TRACE_SYNC] = "sync",
    [WL_TRACE_PHASE] = "phase",
    [WL_TRACE_GATE_WAIT] = "gate_wait",
    [WL_TRACE_GATE_GRANT] = "gate_grant",
    [WL_TRACE_GATE_RELEASE] = "gate_release",
    [WL_TRACE_BUDGET_WAIT] = "budget_wait",
    [WL_TRACE_BUDGET_DENY] = "budget_deny",
    [WL_TRACE_OOM] = "oom",
    [WL_TRACE_MARKER] = "marker",
    [WL_TRACE_STRING] = "string",
    [WL_TRACE_DROPPED] = "dropped",
    [WL_TRACE_END] = "end",
};

const char *wl_trace_kind_name(unsigned kind) {
  if (kind >= WL_TRACE_KIND_COUNT || !kind_names[kind]) return "unknown";
  return kind_names[kind];
}

/* Copies a string field NUL-padded, always leaving a NUL at the end. */
static void put_str(uint8_t *dst, size_t cap, const char *s) {
  memset(dst, 0, cap);
  size_t n = strnlen(s, cap - 1);
  memcpy(dst, s, n);
}

static void get_str(char *dst, size_t cap, const uint8_t *src) {
  memcpy(dst, src, cap);
  dst[cap - 1] = 0;
}

void wl__header_encode(const wl_trace_header_t *h, uint8_t out[WL_TRACE_HEADER_SIZE]) {
  memset(out, 0, WL_TRACE_HEADER_SIZE);
  memcpy(out, WL_TRACE_MAGIC, 8);
  wl__put16(out + 8, WL_TRACE_VERSION_MAJOR);
  wl__put16(out + 10, WL_TRACE_VERSION_MINOR);
  wl__put32(out + 12, WL_TRACE_HEADER_SIZE);
  wl__put32(out + 20, h->flags);
  wl__put32(out + 24, h->pid);
  wl__put32(out + 28, (uint32_t)h->role);
  wl__put32(out + 32, (uint32_t)h->device);
  wl__put32(out + 36, h->clock);
  wl__put64(out + 40, h->origin_ns);
  wl__put64(out + 48, h->wall_ns);
  wl__put64(out + 56, h->device_capacity);
  wl__put64(out + 64, h->mem_limit);
  wl__put32(out + 72, h->waves);
  put_str(out + 80, 64, h->device_name);
  put_str(out + 144, 48, h->host);
  put_str(out + 192, 64, h->command);
  wl__put32(out + 16, wl__crc32c(0, out, WL_TRACE_HEADER_SIZE));
}

int wl__header_decode(const uint8_t *in, size_t len, wl_trace_header_t *h, uint32_t *hsize,
                      const char **why, uint64_t *at) {
  *at = 0;
  if (len < 8 || memcmp(in, WL_TRACE_MAGIC, 8) != 0) {
    /* A prefix of the magic is a trace cut short, anything else is a foreign file. */
    if (len < 8 && memcmp(in, WL_TRACE_MAGIC, len) == 0) {
      *why = "truncated inside the file header";
      *at = len;
      return -ENODATA;
    }
    *why = "not a Wavelet trace (bad magic)";
    return -EILSEQ;
  }
  if (len < 16) {
    *why = "truncated inside the file header";
    *at = len;
    return -ENODATA;
  }
  uint16_t major = wl__get16(in + 8);
  if (major != WL_TRACE_VERSION_MAJOR) {
    *why = "unsupported trace version (this reader knows version 1)";
    *at = 8;
    return -EPROTONOSUPPORT;
  }
  uint32_t size = wl__get32(in + 12);
  if (size < WL_TRACE_HEADER_SIZE || size > 4096 || size % 8) {
    *why = "corrupted file header (bad header size)";
    *at = 12;
    return -EBADMSG;
  }
  if (len < size) {
    *why = "truncated inside the file header";
    *at = len;
    return -ENODATA;
  }
  /* CRC over the header with the CRC field as zero, computed in three pieces. */
  static const uint8_t zero[4];
  uint32_t crc = wl__crc32c(0, in, 16);
  crc = wl__crc32c(crc, zero, 4);
  crc = wl__crc32c(crc, in + 20, size - 20);
  if (crc != wl__get32(in + 16)) {
    *why = "file header checksum mismatch (corrupted)";
    *at = 16;
    return -EBADMSG;
  }
  memset(h, 0, sizeof *h);
  h->version_major = major;
  h->version_minor = wl__get16(in + 10);
  h->flags = wl__get32(in + 20);
  h->pid = wl__get32(in + 24);
  h->role = (int32_t)wl__get32(in + 28);
  h->device = (int32_t)wl__get32(in + 32);
  h->clock = wl__get32(in + 36);
  h->origin_ns = wl__get64(in + 40);
  h->wall_ns = wl__get64(in + 48);
  h->device_capacity = wl__get64(in + 56);
  h->mem_limit = wl__get64(in + 64);
  h->waves = wl__get32(in + 72);
  get_str(h->device_name, sizeof h->device_name, in + 80);
  get_str(h->host, sizeof h->host, in + 144);
  get_str(h->command, sizeof h->command, in + 192);
  *hsize = size;
  return 0;
}

size_t wl__record_encode(const wl_trace_event_t *ev, uint64_t origin, uint8_t *out) {
  size_t bytes = wl__record_bytes(ev->kind);
  uint64_t t = ev->time_ns > origin ? ev->time_ns - origin : 0;
  uint64_t f0 = ev->addr;
  if (ev->kind == WL_TRACE_MARKER || ev->kind == WL_TRACE_PHASE) f0 = ev->id;
  out[0] = (uint8_t)ev->kind;
  out[1] = (uint8_t)(bytes / 8);
  wl__put16(out + 2, ev->aux);
  wl__put32(out + 4, ev->tid);
  wl__put64(out + 8, t);
  wl__put64(out + 16, f0);
  wl__put64(out + 24, ev->size);
  wl__put64(out + 32, ev->arg);
  if (ev->kind == WL_TRACE_LAUNCH) {
    wl__put32(out + 40, ev->grid[0]);
    wl__put32(out + 44, ev->grid[1]);
    wl__put32(out + 48, ev->grid[2]);
    wl__put32(out + 52, ev->id);
  }
  return bytes;
}

void wl__block_header(uint8_t out[WL_TRACE_BLOCK_HEADER], const uint8_t *payload, uint32_t bytes,
                      uint32_t records, uint64_t seq) {
  wl__put32(out, WL__BLOCK_MAGIC);
  wl__put32(out + 4, bytes);
  wl__put32(out + 8, records);
  wl__put32(out + 12, wl__payload_sum(payload, bytes));
  wl__put64(out + 16, seq);
  wl__put32(out + 24, 0);
  wl__put32(out + 28, wl__crc32c(0, out, 28));
}
