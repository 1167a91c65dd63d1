/* wb-token-spans FILE...: the tick-tock token's spans in interposer traces (GATE_GRANT to
 * GATE_RELEASE, read with libwltrace's reader), one line per file, then how many spans of
 * different files overlap. Exit 0 when every file was read, 1 otherwise; the test judges. */
#include <wavelet/trace.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MAX_FILES 16
#define MAX_SPANS 65536

typedef struct span_s {
  unsigned long long begin, end;
} span_t;

typedef struct spans_s {
  span_t *s;
  int n;
  unsigned long long grants;
} spans_t;

static int read_spans(const char *path, spans_t *x) {
  memset(x, 0, sizeof *x);
  x->s = calloc(MAX_SPANS, sizeof *x->s);
  wl_trace_reader_t *r = NULL;
  if (!x->s || wl_trace_open(&r, path, WL_TRACE_OPEN_SALVAGE)) {
    if (r) wl_trace_reader_close(r);
    return -1;
  }
  wl_trace_event_t ev[256];
  long n;
  unsigned long long grant = 0;
  while ((n = wl_trace_read(r, ev, 256)) > 0) {
    for (long i = 0; i < n; i++) {
      const wl_trace_event_t *e = &ev[i];
      if (e->kind == WL_TRACE_GATE_GRANT) {
        grant = e->time_ns;
        x->grants++;
      } else if (e->kind == WL_TRACE_GATE_RELEASE && grant && x->n < MAX_SPANS) {
        x->s[x->n++] = (span_t){grant, e->time_ns};
        grant = 0;
      }
    }
  }
  /* Held to the end of the trace: the span never closed. */
  if (grant && x->n < MAX_SPANS) x->s[x->n++] = (span_t){grant, ~0ull};
  wl_trace_reader_close(r);
  return n < 0 ? -1 : 0;
}

int main(int argc, char **argv) {
  if (argc < 2 || argc - 1 > MAX_FILES) {
    fprintf(stderr, "usage: wb-token-spans FILE... (at most %d)\n", MAX_FILES);
    return 2;
  }
  int k = argc - 1, bad = 0;
  spans_t x[MAX_FILES];
  for (int i = 0; i < k; i++) {
    if (read_spans(argv[i + 1], &x[i])) {
      fprintf(stderr, "wb-token-spans: %s: cannot read the trace\n", argv[i + 1]);
      bad = 1;
    }
    printf("%s: grants %llu spans %d\n", argv[i + 1], x[i].grants, x[i].n);
  }
  long overlaps = 0;
  for (int a = 0; a < k; a++)
    for (int b = a + 1; b < k; b++)
      for (int i = 0; i < x[a].n; i++)
        for (int j = 0; j < x[b].n; j++)
          if (x[a].s[i].begin < x[b].s[j].end && x[b].s[j].begin < x[a].s[i].end) overlaps++;
  printf("overlaps %ld\n", overlaps);
  for (int i = 0; i < k; i++) free(x[i].s);
  return bad;
}
