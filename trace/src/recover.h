/* The reader's recovery of a dead writer's events from PATH.rings (rings.h). */
#ifndef WAVELET_TRACE_RECOVER_H
#define WAVELET_TRACE_RECOVER_H

#include "wavelet/trace.h"

#include <stddef.h>
#include <stdint.h>

typedef struct wl__recover_s wl__recover_t;

/* Opens trace_path's rings file for the trace with header th, of which blocks_read blocks were
 * read whole. 0, or a negative errno when there is nothing to recover: -ENOENT no rings file,
 * -EBUSY its writer is alive, -EBADMSG not this trace's or damaged, -ENOMEM. */
int wl__recover_open(wl__recover_t **out, const char *trace_path, const wl_trace_header_t *th,
                     uint64_t blocks_read);

/* Passes each journal STRING record with an id above have to take (which may fail). 0 or the
 * first failure. */
int wl__recover_strings(wl__recover_t *c, uint32_t have,
                        int (*take)(void *arg, const uint8_t *rec, size_t size, uint64_t off),
                        void *arg);

/* Up to n recovered events in time order, then one DROPPED per ring that dropped events since
 * the trace's last DROPPED record. 0 at the end. */
size_t wl__recover_read(wl__recover_t *c, wl_trace_event_t *evs, size_t n);

void wl__recover_close(wl__recover_t *c);

#endif
