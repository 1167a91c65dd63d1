/* wavelet.h: optional markers a trainer may call to tell Wavelet where iterations and backward
 * passes begin; they do nothing when no Wavelet library is loaded. */
#ifndef WAVELET_WAVELET_H
#define WAVELET_WAVELET_H

#ifdef __cplusplus
extern "C" {
#endif

/* The markers are weak references: a program that calls them through the wl_mark_* helpers
 * below links and runs without Wavelet; with libwavelet.so preloaded (or libwlsched linked)
 * they reach its default group member, whose detector then trusts them over everything else
 * and drives the tick-tock gate: the token is asked for at wl_iteration_begin and given back at
 * wl_backward_begin (the memory peak) or, for a step without backward, at wl_iteration_end. */
#if defined(__GNUC__) && !defined(WL_MARKERS_DEFINE)
#define WL_MARKER_ATTR __attribute__((weak, visibility("default")))
#elif defined(__GNUC__)
#define WL_MARKER_ATTR __attribute__((visibility("default")))
#else
#define WL_MARKER_ATTR
#endif

/* The first launch of an iteration is about to happen (before its forward pass). */
WL_MARKER_ATTR void wl_iteration_begin(void);
/* The forward pass is done: the loss is computed and backward starts (the memory peak). */
WL_MARKER_ATTR void wl_backward_begin(void);
/* The optimizer step is done. */
WL_MARKER_ATTR void wl_iteration_end(void);

#ifndef WL_MARKERS_DEFINE
/* Safe to call whether or not a Wavelet library is present. */
static inline void wl_mark_iteration_begin(void) {
  if (wl_iteration_begin) wl_iteration_begin();
}
static inline void wl_mark_backward_begin(void) {
  if (wl_backward_begin) wl_backward_begin();
}
static inline void wl_mark_iteration_end(void) {
  if (wl_iteration_end) wl_iteration_end();
}
#endif

#ifdef __cplusplus
}
#endif
#endif /* WAVELET_WAVELET_H */
