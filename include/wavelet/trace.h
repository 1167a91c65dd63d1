/* libwltrace: the memory-wave trace: its file format, the writer, the reader and the analysis. */
#ifndef WAVELET_TRACE_H
#define WAVELET_TRACE_H

#include <stddef.h>
#include <stdint.h>

#include "wavelet/alloc.h" /* WL_API, and wl_alloc_event_t for wl_trace_alloc_hook */

#ifdef __cplusplus
extern "C" {
#endif

/* ------------------------------------------------------------------------------------------------
 * The file format, version 1.0
 *
 * All integers are little-endian. A trace is a 256-byte file header followed by blocks; it is
 * written append-only, so a process that dies leaves a readable file up to its last written block.
 *
 * File header (256 bytes)
 *   0  u8[8]  magic "\x89WLT\r\n\x1a\n" (the PNG trick: catches text-mode and 7-bit mangling)
 *   8  u16    version major (1): a reader refuses any other major
 *  10  u16    version minor (0): a newer minor only adds record kinds or fields at record ends;
 *             a reader skips kinds it does not know and bytes past the fields it knows
 *  12  u32    header size (256 now; the first block starts here; at most 4096)
 *  16  u32    CRC-32C of the header bytes with this field taken as zero
 *  20  u32    flags (none defined yet)
 *  24  u32    pid of the traced process
 *  28  i32    role (wave index in its group), -1 when none
 *  32  i32    CUDA device ordinal, -1 when unknown
 *  36  u32    clock of every time in the file: 1 = CLOCK_MONOTONIC (shared by the processes of
 *             one machine, so co-located replicas' traces line up)
 *  40  u64    origin: the clock's value (ns) that record times count from
 *  48  u64    CLOCK_REALTIME (ns since 1970) at the origin, for people
 *  56  u64    device memory capacity in bytes, 0 when unknown (the report's default --capacity)
 *  64  u64    memory budget of the group in bytes, 0 when none (drawn as the budget line)
 *  72  u32    waves (K replicas in the group), 0 when unknown
 *  76  u32    reserved (0)
 *  80  char[64]  device name, NUL-padded
 * 144  char[48]  host name, NUL-padded
 * 192  char[64]  command (the traced program), NUL-padded
 *
 * Block (32-byte header, then payload)
 *   0  u32    magic "WLBK"
 *   4  u32    payload bytes (a multiple of 8, at most WL_TRACE_BLOCK_LIMIT)
 *   8  u32    records in the payload
 *  12  u32    checksum of the payload: four CRC-32C lanes over its 8-byte words (lane j takes
 *             words j, j+4, j+8, ...), then the CRC-32C of the four lane values (16 bytes,
 *             lane 0 first). Same strength per lane, four times the speed of one chain.
 *  16  u64    sequence number: 0, 1, 2, ... (a gap or repeat means a damaged file)
 *  24  u32    reserved (0)
 *  28  u32    CRC-32C of header bytes 0..27
 * A block holds records in time order; one flush of the writer's per-thread rings is merged into
 * time order, so across blocks a record can be earlier than the previous block's last only by the
 * flush race (microseconds). Readers take times as they come.
 *
 * Record (8-byte aligned, at least 16 bytes)
 *   0  u8     kind (wl_trace_kind_t)
 *   1  u8     size in 8-byte words
 *   2  u16    aux: the kind's small field (phase, marker kind, role, result)
 *   4  u32    thread id (gettid) of the emitting thread
 *   8  u64    time: ns since the header's origin
 *  16  u64    f0 } three 64-bit fields, see the table below (the record is 40 bytes)
 *  24  u64    f1 }
 *  32  u64    f2 }
 *  40  u32[3] grid, u32 id: LAUNCH only (56 bytes)
 * STRING records are: the 16-byte head (aux, tid and time 0), u32 id, u32 length (at most
 * WL_TRACE_STRING_MAX), the bytes, zero padding to 8. Ids count up from 1 in file order; a
 * string is written before the first record that uses it.
 *
 * kind          f0 (addr)        f1 (size)          f2 (arg)          aux          id
 * ALLOC         pointer          requested bytes    stream            -            -
 * FREE_REQ      pointer          bytes freed        stream            -            -
 * FREE_DONE     pointer          bytes reusable     stream            -            -
 * MAP           address          bytes mapped       -                 -            -
 * UNMAP         address          bytes unmapped     -                 -            -
 * PHYS_RELEASE  -                bytes given back   -                 -            -
 * LAUNCH        function handle  threads per block  stream            -            name string
 * SYNC          stream (0: all)  -                  ns waited         -            -
 * PHASE         (id)             live bytes seen    confidence (ppm)  phase kind   source
 * GATE_WAIT     -                -                  -                 role         -
 * GATE_GRANT    -                -                  ns waited         role         -
 * GATE_RELEASE  -                -                  ns held           role         -
 * BUDGET_WAIT   -                bytes asked        ns waited         bits: 1 no,  -
 *                                                                      2 goes on
 * BUDGET_DENY   -                bytes refused      budget limit      -            -
 * OOM           -                bytes asked        device free bytes -            -
 * MARKER        (id)             -                  -                 marker kind  label string
 * DROPPED       -                events lost        -                 -            -
 * END           -                events written     events dropped    -            -
 * BUDGET_WAIT's aux bit 2: the event continues the thread's previous wait (a full device's next
 * watch round): its time counts, not as another wait. For PHASE and MARKER the id is stored in
 * f0. END is written by a clean close only, with the last event's time and tid 0: a trace
 * without one comes from a process that died or is still running.
 *
 * Physical memory. The writer sees MAP, UNMAP and PHYS_RELEASE (what liballoc's hook reports).
 * Readers model physical bytes as mapped plus cached: UNMAP moves bytes to a cache, PHYS_RELEASE
 * takes them out of it, and MAP draws on the cache first (liballoc's order) before new memory.
 * ----------------------------------------------------------------------------------------------*/
#define WL_TRACE_VERSION_MAJOR   1
#define WL_TRACE_VERSION_MINOR   0
#define WL_TRACE_MAGIC           "\x89WLT\r\n\x1a\n"
#define WL_TRACE_HEADER_SIZE     256u
#define WL_TRACE_BLOCK_HEADER    32u
#define WL_TRACE_BLOCK_LIMIT     (1u << 20) /* payload bytes a reader accepts */
#define WL_TRACE_STRING_MAX      1024u      /* longer strings are cut by the writer */
#define WL_TRACE_STRINGS_MAX     16384u     /* distinct strings a reader accepts */
#define WL_TRACE_CLOCK_MONOTONIC 1u
#define WL_TRACE_RINGS_SUFFIX    ".rings" /* the writer's crash-safe rings: PATH + this */

typedef enum wl_trace_kind_e {
  WL_TRACE_ALLOC = 1,
  WL_TRACE_FREE_REQ = 2,
  WL_TRACE_FREE_DONE = 3,
  WL_TRACE_MAP = 4,
  WL_TRACE_UNMAP = 5,
  WL_TRACE_PHYS_RELEASE = 6,
  WL_TRACE_LAUNCH = 7,
  WL_TRACE_SYNC = 8,
  WL_TRACE_PHASE = 9,
  WL_TRACE_GATE_WAIT = 10,
  WL_TRACE_GATE_GRANT = 11,
  WL_TRACE_GATE_RELEASE = 12,
  WL_TRACE_BUDGET_WAIT = 13,
  WL_TRACE_BUDGET_DENY = 14,
  WL_TRACE_OOM = 15,
  WL_TRACE_MARKER = 16,
  WL_TRACE_STRING = 17, /* consumed by the reader, never returned as an event */
  WL_TRACE_DROPPED = 18,
  WL_TRACE_END = 19, /* consumed by the reader (see wl_trace_reader_info) */
  WL_TRACE_KIND_COUNT
} wl_trace_kind_t;

/* MARKER aux: the trainer's markers (wavelet/wavelet.h) and free-form annotations. */
enum {
  WL_TRACE_MARK_ITER_BEGIN = 1,
  WL_TRACE_MARK_BACKWARD = 2,
  WL_TRACE_MARK_ITER_END = 3,
  WL_TRACE_MARK_USER = 4
};

/* PHASE aux: the phase detector's output; the values are libsched's wl_phase_kind_t. */
enum {
  WL_TRACE_PHASE_UNKNOWN = 0,
  WL_TRACE_PHASE_ITER_BEGIN = 1,
  WL_TRACE_PHASE_FORWARD = 2,
  WL_TRACE_PHASE_BACKWARD = 3,
  WL_TRACE_PHASE_IDLE = 4
};

/* One event, as emitted and as read. time_ns is always CLOCK_MONOTONIC (absolute); the file
 * stores it relative to the header's origin. Fields a kind does not use are zero. */
typedef struct wl_trace_event_s {
  uint64_t time_ns; /* emit: 0 means "now" */
  uint16_t kind;    /* wl_trace_kind_t */
  uint16_t aux;
  uint32_t tid; /* emit: 0 means the calling thread */
  uint64_t addr, size, arg;
  uint32_t grid[3];
  uint32_t id;
} wl_trace_event_t;

/* The decoded file header. */
typedef struct wl_trace_header_s {
  uint16_t version_major, version_minor;
  uint32_t flags;
  uint32_t pid;
  int32_t role, device;
  uint32_t clock;
  uint64_t origin_ns, wall_ns;
  uint64_t device_capacity, mem_limit;
  uint32_t waves;
  char device_name[64];
  char host[48];
  char command[64];
} wl_trace_header_t;

/* Kind name ("alloc", "free_requested", ...), "unknown" past the table. */
WL_API const char *wl_trace_kind_name(unsigned kind);

/* ------------------------------------------------------------------------------------------------
 * The writer: per-thread bounded rings, merged and written in blocks by a flusher
 *
 * wl_trace_emit is the hot path: it copies the event into the calling thread's ring (a lock-free
 * single-producer ring, created on the thread's first event) and takes no lock, makes no system
 * call and allocates nothing. The rings are drained by wl_trace_flush: by the writer's background
 * thread every flush_interval_ms and as soon as a ring is half full (the emitting thread wakes
 * it), by a thread whose ring is full all the same (inline_flush), and at close. An event with
 * time_ns 0 is stamped with CLOCK_MONOTONIC nanoseconds, read from an invariant TSC where the CPU
 * has one once the background thread has calibrated it (WAVELET_TRACE_TSC=0: the clock only).
 * When a ring is full and cannot be drained at once, the event is dropped and counted; the count
 * reaches the file as a DROPPED record, so a report knows it is incomplete. Not async-signal-safe
 * (a thread's first event allocates its ring). After fork(2) only the parent may use a writer:
 * in the child wl_trace_emit returns -ECHILD and wl_trace_writer_close only frees memory.
 *
 * Crashes: with a path (and rings_file, the default) the rings live in a shared mapping of
 * PATH.rings, so a process killed at any instant, SIGKILL included, leaves every event whose
 * wl_trace_emit returned in the page cache; a ring's slots are given back only once the block
 * holding their events is written. A reader of a trace without an END record whose writer is
 * dead takes the rest from PATH.rings by itself (wl_trace_reader_info_t.recovered). A clean close
 * deletes PATH.rings. A machine crash loses what the kernel had not written back.
 * ----------------------------------------------------------------------------------------------*/
typedef struct wl_trace_writer_s wl_trace_writer_t;

typedef struct wl_trace_writer_config_s {
  /* Create (truncate) this file; or NULL and write to fd (not closed by the writer). */
  const char *path;
  int fd;
  /* Events per thread ring, rounded up to a power of two; 0: 8192. */
  size_t ring_events;
  /* Background flush period in ms; 0: no thread (flush when rings fill, and at close). */
  uint32_t flush_interval_ms;
  /* A thread that finds its ring full writes the rings out itself (1, default) or drops (0). */
  int inline_flush;
  /* Keep the rings in a shared mapping of PATH.rings (WL_TRACE_RINGS_SUFFIX) so a process killed
   * at any point loses no emitted event: the reader recovers them (1, default; path only). */
  int rings_file;
  /* Header fields. pid 0: getpid(); origin_ns 0: now; wall_ns 0: the real-time clock now;
   * command "": this program's name. Everything else is written as given. */
  wl_trace_header_t header;
} wl_trace_writer_config_t;

typedef struct wl_trace_writer_stats_s {
  uint64_t events, dropped, records, blocks, bytes, flushes, rings;
  int error; /* first write error (negative errno), 0 when none */
} wl_trace_writer_stats_t;

/* Defaults: no path, fd -1, role and device -1, clock monotonic, inline flush on. */
WL_API void wl_trace_writer_config_default(wl_trace_writer_config_t *cfg);

/* Opens the file and writes the header. 0 or negative errno (-EINVAL: no path and no fd;
 * -EBUSY: a live writer, in this process or another, has the path: one writer a path, and the
 * file and rings it writes are left alone). */
WL_API int wl_trace_writer_open(wl_trace_writer_t **out, const wl_trace_writer_config_t *cfg);

/* Records one event. 0, -ENOBUFS when it was dropped (ring full), -EINVAL for a kind that
 * cannot be emitted (STRING, END, unknown), -EPIPE after wl_trace_writer_finish. Thread-safe;
 * see above for its cost. */
WL_API int wl_trace_emit(wl_trace_writer_t *w, const wl_trace_event_t *ev);

/* wl_trace_emit of an event stamped now, by the calling thread, with its fields as arguments:
 * the hot path for hooks (no event built on the stack and copied). wl_trace_emit_rec leaves
 * grid and id 0; wl_trace_emit_launch is a LAUNCH (grid may be NULL: zeros). Same returns. */
WL_API int wl_trace_emit_rec(wl_trace_writer_t *w, unsigned kind, unsigned aux, uint64_t addr,
                             uint64_t size, uint64_t arg);
WL_API int wl_trace_emit_launch(wl_trace_writer_t *w, uint64_t fn, uint64_t threads,
                                uint64_t stream, const uint32_t grid[3], uint32_t id);

/* Returns the id of string s (>= 1; the same id for the same string), 0 on failure (a new
 * string once WL_TRACE_STRINGS_MAX exist, or no memory; strings already interned keep their id).
 * Takes a lock and may allocate: intern names once (per kernel, per label), not per event. */
WL_API uint32_t wl_trace_intern(wl_trace_writer_t *w, const char *s);

/* Writes every ring out now. 0 or the first write error (negative errno). */
WL_API int wl_trace_flush(wl_trace_writer_t *w);

WL_API void wl_trace_writer_stats(wl_trace_writer_t *w, wl_trace_writer_stats_t *out);

/* Stops the background thread, flushes, writes the END record and closes the file, but keeps the
 * writer's memory: an emit racing with or following it is a harmless no-op (-EPIPE), so a
 * process can finish its trace at exit while other threads still run. A second call waits for
 * the first. 0 or the first write error (negative errno). */
WL_API int wl_trace_writer_finish(wl_trace_writer_t *w);

/* wl_trace_writer_finish (when not done yet), then frees the writer. No thread may emit during
 * or after the call. 0 or the first write error (negative errno). */
WL_API int wl_trace_writer_close(wl_trace_writer_t *w);

/* A liballoc hook (wl_alloc_config_t.hook, with hook_arg the writer): alloc, free, map, unmap,
 * physical release, budget denial and out-of-memory become trace events. */
WL_API void wl_trace_alloc_hook(void *writer, const wl_alloc_event_t *ev);

/* ------------------------------------------------------------------------------------------------
 * The reader: streams a file in bounded memory (one buffer of about 2 MiB and the string table)
 *
 * Every failure is described in one line naming the file and the byte offset where the problem
 * lies (wl_trace_reader_error), e.g. "run.wlt: byte 4128: block checksum mismatch (corrupted)".
 * ----------------------------------------------------------------------------------------------*/
typedef struct wl_trace_reader_s wl_trace_reader_t;

/* wl_trace_open flags. SALVAGE: a file cut inside a block (a write torn by a crash) yields the
 * complete records of that block's prefix, unchecked, and then ends with -ENODATA as usual.
 * NO_RINGS: do not recover a dead writer's events from PATH.rings (by default a trace without an
 * END record continues, after its last whole block, with the events left in the rings of a
 * writer that is no longer running, in time order; a block torn by the crash is then skipped,
 * since its events are all in the rings, and the read ends cleanly). */
#define WL_TRACE_OPEN_SALVAGE  0x1u
#define WL_TRACE_OPEN_NO_RINGS 0x2u

typedef struct wl_trace_reader_info_s {
  uint64_t events;     /* returned so far */
  uint64_t dropped;    /* sum of DROPPED records so far */
  uint64_t blocks;     /* blocks read */
  uint64_t offset;     /* bytes consumed */
  uint64_t file_bytes; /* file size at open */
  int complete;        /* the END record was read */
  int salvaged;        /* records came from an unchecked torn block */
  int truncated;       /* the read ended at a cut inside a block (the error says where) */
  uint64_t recovered;  /* events recovered from a dead writer's rings (PATH.rings) */
  uint64_t end_events, end_dropped; /* what the END record says */
} wl_trace_reader_info_t;

/* Opens path and reads its header. 0 or negative errno: -ENOENT and other open(2) errors,
 * -EILSEQ not a trace (foreign file), -EPROTONOSUPPORT another major version, -EBADMSG a
 * damaged header, -ENODATA a file shorter than the header. On failure *out is still set when
 * it could be allocated, so the message can be read; close it either way. */
WL_API int wl_trace_open(wl_trace_reader_t **out, const char *path, unsigned flags);

/* Reads a trace held in memory (not copied; it must outlive the reader). name is for messages. */
WL_API int wl_trace_open_mem(wl_trace_reader_t **out, const void *data, size_t len,
                             const char *name, unsigned flags);

WL_API const wl_trace_header_t *wl_trace_reader_header(const wl_trace_reader_t *r);

/* Reads up to n events into evs. Returns how many (> 0), 0 at the end of the trace, or a
 * negative errno: -EBADMSG corrupted, -ENODATA truncated inside a block, -EIO a read error.
 * Events before an error are returned by earlier calls; after an error every call repeats it. */
WL_API long wl_trace_read(wl_trace_reader_t *r, wl_trace_event_t *evs, size_t n);

/* The string with this id, NULL when not (yet) defined. */
WL_API const char *wl_trace_reader_string(const wl_trace_reader_t *r, uint32_t id);

/* One line describing the failure ("FILE: byte N: what"), "" when none. */
WL_API const char *wl_trace_reader_error(const wl_trace_reader_t *r);
/* The byte offset the failure refers to, 0 when none. */
WL_API uint64_t wl_trace_reader_error_offset(const wl_trace_reader_t *r);

WL_API void wl_trace_reader_info(const wl_trace_reader_t *r, wl_trace_reader_info_t *out);
WL_API void wl_trace_reader_close(wl_trace_reader_t *r);

/* ------------------------------------------------------------------------------------------------
 * The analysis: one process's memory wave, in bounded memory
 *
 * Live bytes (allocations minus requested frees) and physical bytes (see the format) are kept in
 * a fixed number of time bins whose width doubles when the trace outgrows them, so memory does
 * not depend on the trace's length and every bin keeps the exact maximum and minimum. Besides
 * the bins, lists with caps of their own: the iterations, the waits, and the changes of physical
 * memory (max_physical_steps, for the exact combined peak).
 *
 * Iterations come from, strongest first: the trainer's markers (MARKER events), the phase
 * detector's PHASE events, or the wave itself: the period is the strongest peak of the
 * autocorrelation of the binned live bytes; a rise is a crossing of the middle of a sliding
 * window one period wide (with hysteresis); its iteration begins at the lowest point walking back
 * from the crossing (the trough, or the turn from the previous fall), peaks at its maximum, and
 * its backward pass ends where live bytes are back within 5 % of the trough. Confidence is the
 * autocorrelation at the period times the regularity of the periods found; below 0.5 no
 * iterations are reported. About 8 bins an iteration are needed.
 * ----------------------------------------------------------------------------------------------*/
typedef struct wl_trace_analysis_s wl_trace_analysis_t;

typedef enum wl_trace_iter_source_e {
  WL_TRACE_ITER_NONE = 0,
  WL_TRACE_ITER_MARKERS = 1, /* the trainer's markers */
  WL_TRACE_ITER_PHASES = 2,  /* PHASE events from the phase detector */
  WL_TRACE_ITER_WAVE = 3     /* found in the live-bytes wave */
} wl_trace_iter_source_t;

typedef struct wl_trace_analysis_config_s {
  size_t bins;           /* time bins, a power of two from 64 to 2^20; 0: 262144 */
  size_t max_iterations; /* iterations kept for output (statistics use all); 0: 65536 */
  size_t max_spans;      /* gate/memory waits kept for output; 0: 65536 */
  /* Changes of physical memory kept for the exact combined peak (16 bytes each); past it the
   * combined peak is the bins' upper bound; 0: 1048576. */
  size_t max_physical_steps;
} wl_trace_analysis_config_t;

/* One time bin. Times are t0 + i * width. */
typedef struct wl_trace_bin_s {
  uint64_t live_max, live_min, phys_max;
} wl_trace_bin_t;
/* wl_trace_analysis_bins flags */
#define WL_TRACE_BIN_FORWARD  0x1u /* a forward (rising) phase covers part of the bin */
#define WL_TRACE_BIN_BACKWARD 0x2u

typedef struct wl_trace_iteration_s {
  uint64_t begin_ns;    /* CLOCK_MONOTONIC */
  uint64_t backward_ns; /* the backward marker, or the peak */
  uint64_t fall_ns;     /* end of backward (ITER_END marker, or back near the trough) */
  uint64_t end_ns;      /* the next iteration's begin (or the end marker) */
  uint64_t peak_bytes, trough_bytes;
} wl_trace_iteration_t;

/* A wait: at the tick-tock gate (kind GATE_GRANT) or for memory (BUDGET_WAIT). */
typedef struct wl_trace_span_s {
  uint64_t begin_ns, end_ns;
  uint16_t kind;
} wl_trace_span_t;

typedef struct wl_trace_summary_s {
  wl_trace_header_t header;
  uint64_t events, allocs, frees, launches, syncs, markers, phase_events, dropped;
  uint64_t first_ns, last_ns; /* first and last event */
  uint64_t peak_bytes, peak_ns, trough_bytes;
  uint64_t physical_peak_bytes, physical_at_peak_bytes; /* 0: physical memory not traced */
  double fragmentation;               /* physical / live at the live peak; 0 when not traced */
  uint64_t iterations;                /* complete iterations found */
  double period_ms, period_spread_ms; /* mean and standard deviation, 0 when < 2 iterations */
  wl_trace_iter_source_t source;
  double confidence;          /* 0..1 */
  double autocorr;            /* the wave's autocorrelation at the period (WAVE; otherwise 0) */
  double candidate_period_ms; /* WAVE: the best period even when confidence is too low */
  double forward_ms, backward_ms, idle_ms; /* means per iteration */
  double iter_peak_mean_bytes;
  uint64_t gate_waits, gate_wait_ns, budget_waits, budget_wait_ns, budget_denials, ooms;
  uint64_t bin_width_ns; /* the wave's time resolution */
} wl_trace_summary_t;

/* Defaults (the values named above). */
WL_API void wl_trace_analysis_config_default(wl_trace_analysis_config_t *cfg);

/* hdr is copied (may be NULL); cfg NULL: defaults. 0 or -ENOMEM / -EINVAL. */
WL_API int wl_trace_analysis_create(wl_trace_analysis_t **out, const wl_trace_header_t *hdr,
                                    const wl_trace_analysis_config_t *cfg);
/* Feeds events in file order. Never fails on odd values (they are clamped); 0. */
WL_API int wl_trace_analysis_feed(wl_trace_analysis_t *a, const wl_trace_event_t *evs, size_t n);
/* Finds the iterations; call once, after the last feed. 0 or -ENOMEM. */
WL_API int wl_trace_analysis_finish(wl_trace_analysis_t *a);

WL_API void wl_trace_analysis_summary(const wl_trace_analysis_t *a, wl_trace_summary_t *out);
/* The bins in use (n), their start time and width; flags[i] holds WL_TRACE_BIN_* bits. */
WL_API const wl_trace_bin_t *wl_trace_analysis_bins(const wl_trace_analysis_t *a, size_t *n,
                                                    uint64_t *t0_ns, uint64_t *width_ns,
                                                    const uint8_t **flags);
WL_API const wl_trace_iteration_t *wl_trace_analysis_iterations(const wl_trace_analysis_t *a,
                                                                size_t *n);
WL_API const wl_trace_span_t *wl_trace_analysis_spans(const wl_trace_analysis_t *a, size_t *n);
WL_API void wl_trace_analysis_destroy(wl_trace_analysis_t *a);

/* Opens, reads and analyses a file. On failure returns the reader's negative errno, writes its
 * one-line message into err, and *out is NULL. With WL_TRACE_OPEN_SALVAGE a file cut inside a
 * block is not a failure: the analysis covers the records before the cut, info->truncated is set
 * and err holds the message. *info (may be NULL) says how the read ended. */
WL_API int wl_trace_analyze_file(const char *path, unsigned flags,
                                 const wl_trace_analysis_config_t *cfg, wl_trace_analysis_t **out,
                                 wl_trace_reader_info_t *info, char *err, size_t errlen);

/* ------------------------------------------------------------------------------------------------
 * Several processes: the combined wave, and the advice
 * ----------------------------------------------------------------------------------------------*/

/* The processes' waves on one time grid (absolute CLOCK_MONOTONIC), summed. A process counts as
 * zero outside its trace. The combined value of a bin is the sum of each process's maximum in
 * it, an upper bound on the true combined peak that is tight when bins are fine. */
typedef struct wl_trace_combined_s {
  uint64_t t0_ns, width_ns;
  size_t n;
  uint64_t *live;  /* n sums */
  uint8_t *rising; /* n counts of processes in a forward phase during the bin */
  uint64_t peak_bytes, peak_ns, trough_bytes;
  /* Rising time and overlap come from each process's forward phases as its markers or phase
   * events bound them, to the nanosecond: processes that take turns in one bin do not overlap.
   * A process whose iterations were found in its wave (or that had more than the analysis keeps)
   * counts by its own bins instead; rising_bin_ns is then the widest such bin, 0 when exact. */
  uint64_t rising_ns;  /* time any process was rising */
  uint64_t overlap_ns; /* time two or more were rising at once */
  /* Physical memory (MAP, UNMAP and PHYS_RELEASE events: mapped plus cached, what a budget
   * holds): phys has n sums of each process's highest value in the slot (an upper bound: a chunk
   * one process gives back and another takes in one slot counts twice); physical_peak_bytes and
   * _ns are exact, swept from every change in time order (see physical_peak_exact). physical_traced
   * is 1 when every process traced it; otherwise phys and the peak count only those that did. */
  uint64_t *phys;
  uint64_t physical_peak_bytes, physical_peak_ns;
  int physical_traced;
  uint64_t rising_bin_ns; /* see rising_ns (last, so the fields before keep their offsets) */
  uint8_t *overlap;       /* n flags: two or more were rising at the same moment in the bin */
  /* 1: physical_peak_bytes was swept from every change; 0: a process kept more changes than the
   * analysis holds (max_physical_steps), and it is the bins' upper bound. */
  int physical_peak_exact;
} wl_trace_combined_t;

/* 0, -EINVAL (k == 0), -ENOMEM. bins 0: 65536. */
WL_API int wl_trace_combine(const wl_trace_analysis_t *const *a, size_t k, size_t bins,
                            wl_trace_combined_t **out);
WL_API void wl_trace_combined_destroy(wl_trace_combined_t *c);

#define WL_TRACE_MAX_REPLICAS 64

/* How many replicas of the traced job fit in capacity bytes, from its measured wave folded over
 * its typical cycle (the median from one iteration's begin to the next's; each phase's maximum
 * over the cycles near it; period_ms is that cycle), in physical memory when the
 * trace has it (the live wave times its fragmentation at the peak: see `fragmentation`).
 * - without tick-tock nothing keeps the replicas apart, and their phases drift through every
 *   alignment, so K replicas need K times the peak;
 * - with tick-tock the waves are held shifted; K fit when the lowest combined peak over the
 *   shifts (found by coordinate descent from even spacing) is within capacity.
 * Throughput model (stated in `model`): each replica keeps the GPU busy busy*(forward+backward)
 * of its period P and the GPU is otherwise idle; K co-located replicas share it perfectly, so
 * they complete K iterations every max(P, K*busy*(forward+backward)). Ratios are against one
 * replica alone: an upper bound, ignoring interference. */
typedef struct wl_trace_capacity_s {
  int usable;              /* 0: no iterations, nothing to fold (fields below are 0) */
  uint64_t capacity_bytes; /* as asked */
  uint64_t peak_bytes;     /* one replica's folded peak */
  unsigned replicas_ticktock, replicas_without;
  uint64_t combined_peak_bytes; /* of replicas_ticktock at the best offsets */
  double offsets_ms[WL_TRACE_MAX_REPLICAS];
  double period_ms, work_ms, busy;
  double throughput_ticktock, throughput_without; /* iterations/s relative to one replica */
  char model[160];
  /* The bytes above are the live wave times this (physical / live at the live peak, when the
   * trace has liballoc's physical memory and it is above 1; else 1), and shifted copies each add
   * the slack at the peak (physical - live there: partly used chunks): what a budget holds. */
  double fragmentation;
} wl_trace_capacity_t;

/* 0, or -EINVAL (a NULL argument, busy outside (0, 1]), -ENOMEM. */
WL_API int wl_trace_capacity(const wl_trace_analysis_t *a, uint64_t capacity_bytes, double busy,
                             wl_trace_capacity_t *out);

/* The combined peak of k replicas of the traced job at their best offsets, in wl_trace_capacity's
 * bytes (physical memory when the trace has it: the live wave times its fragmentation, each copy
 * plus its slack), at most k times one peak (aligned copies are a placement too): what a budget
 * for k replicas in tick-tock must hold. 0, -EINVAL (k outside 1..WL_TRACE_MAX_REPLICAS, no
 * iterations), -ERANGE (bins too coarse for the wave's shape), -ENOMEM. */
WL_API int wl_trace_ticktock_peak(const wl_trace_analysis_t *a, unsigned k, uint64_t *peak);

/* The best relative phase offsets for the given processes' folded waves (each over its typical
 * cycle: the median from one iteration's begin to the next's), on the mean of those cycles:
 * offsets_ms[0] is 0; *peak the predicted combined peak. -EINVAL when a process has no
 * iterations or the cycles differ by more than 5 % (no fixed offset can hold), -ERANGE (bins too
 * coarse for the wave's shape), -ENOMEM. */
WL_API int wl_trace_best_offsets(const wl_trace_analysis_t *const *a, size_t k, double *offsets_ms,
                                 uint64_t *peak);

#ifdef __cplusplus
}
#endif
#endif /* WAVELET_TRACE_H */
