/* The rings file (PATH.rings): the writer's per-thread rings kept in a shared file mapping, so a
 * process killed at any instant leaves its unwritten events in the page cache, and the reader
 * recovers them after the trace's last block.
 *
 * It is a machine-local scratch file in the writer's native layout (not a portable format): a
 * 4096-byte header, the string journal (every interned string as its STRING record, in id order,
 * at most WL_TRACE_STRINGS_MAX of them), then one slot per ring. A slot is a wl__ring_t header
 * and ring_events wl_trace_event_t in memory layout. The file is sparse: only touched pages take
 * space. The writer holds wl__life_lock on the file (an open-file-description lock on its first
 * byte, or flock where the kernel has none, as under gVisor); the kernel drops it when the process
 * dies, which is how a reader tells a dead writer from a live one. A clean close deletes the file.
 *
 * Which events are already in the trace: a ring's tail. The flusher advances it only after the
 * block holding those events has been written, and before each write it records, per ring, the
 * tail that block will give (pend_tail) and the block's number (pend_seq). A reader that finds
 * block pend_seq complete in the trace starts at pend_tail, otherwise at tail; a block torn by
 * the kill is skipped, since every record in it is still in the rings. */
#ifndef WAVELET_TRACE_RINGS_H
#define WAVELET_TRACE_RINGS_H

#include "wavelet/trace.h"

#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>

#define WL__RINGS_MAGIC      "WLRINGS\x01"
#define WL__RINGS_VERSION    1u
#define WL__RINGS_HEADER     4096u
#define WL__RINGS_STR_CAP    (WL_TRACE_STRINGS_MAX * (24u + WL_TRACE_STRING_MAX))
#define WL__RINGS_SLOTS_OFF  ((uint64_t)WL__RINGS_HEADER + WL__RINGS_STR_CAP)
#define WL__RINGS_MAX_EVENTS (1u << 22)
#define WL__RINGS_MAX_SLOTS  65536u
#define WL__RINGS_NO_SEQ     UINT64_MAX

enum { WL__RING_FREE = 0, WL__RING_ACTIVE = 1 };

typedef struct wl__rings_header_s {
  char magic[8]; /* written last at creation: a file without it is ignored */
  uint32_t version, header_bytes, event_bytes, ring_header_bytes;
  uint32_t ring_events, pid;
  uint64_t slot_bytes, strings_off, strings_cap, slots_off;
  uint64_t origin_ns, wall_ns;            /* the trace header's, to match the two files */
  _Alignas(64) _Atomic uint64_t pend_seq; /* block being written, WL__RINGS_NO_SEQ: none */
  _Atomic uint64_t strings_len;           /* bytes of the string journal */
  _Atomic uint32_t nslots;                /* slots ever created */
  _Atomic uint32_t broken;                /* a write failed: the trace has gaps; ignore */
} wl__rings_header_t;

typedef struct wl__ring_s {
  _Alignas(64) _Atomic uint64_t head;      /* written by the producer only */
  _Alignas(64) _Atomic uint64_t tail;      /* flusher: events before it are in the trace */
  _Alignas(64) _Atomic uint64_t dropped;   /* producer: events dropped on a full ring */
  _Alignas(64) _Atomic uint64_t pend_tail; /* the tail once block pend_seq is written */
  uint64_t pend_dropped;                   /* dropped_done once block pend_seq is written */
  uint64_t dropped_done;                   /* drops counted in the trace's DROPPED records */
  uint64_t dropped_seen;                   /* flusher's working copy of dropped_done */
  _Atomic uint32_t state;                  /* WL__RING_FREE or WL__RING_ACTIVE */
  _Atomic int dead;                        /* the thread has exited */
  uint32_t tid, slot;
  uint64_t mask;
  wl_trace_event_t ev[];
} wl__ring_t;

/* Bytes of one slot for rings of n events. */
static inline uint64_t wl__ring_slot_bytes(uint64_t n) {
  uint64_t b = offsetof(wl__ring_t, ev) + n * sizeof(wl_trace_event_t);
  return (b + 4095) & ~(uint64_t)4095;
}

#endif
