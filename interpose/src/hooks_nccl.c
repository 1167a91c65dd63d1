/* NCCL's exported collective entry points as bypass regions: a launch made inside one is never
 * gated (a collective blocked at our gate while its peers wait in theirs would deadlock the
 * job). They forward to the real NCCL unchanged. NCCL built into a program statically is not
 * reached (see README). */
#include "internal.h"

/* NCCL's ABI, spelled without its header: handles are pointers, enums are ints, the result is
 * ncclResult_t (an int; 2 = ncclSystemError, 3 = ncclInternalError). */
typedef int nccl_res_t;
typedef void *nccl_comm_t;
typedef void *nccl_stream_t;
#define NCCL_INTERNAL_ERROR 3

WL_HOOK nccl_res_t ncclAllReduce(const void *, void *, size_t, int, int, nccl_comm_t,
                                 nccl_stream_t);
WL_HOOK nccl_res_t ncclBroadcast(const void *, void *, size_t, int, int, nccl_comm_t,
                                 nccl_stream_t);
WL_HOOK nccl_res_t ncclBcast(void *, size_t, int, int, nccl_comm_t, nccl_stream_t);
WL_HOOK nccl_res_t ncclReduce(const void *, void *, size_t, int, int, int, nccl_comm_t,
                              nccl_stream_t);
WL_HOOK nccl_res_t ncclAllGather(const void *, void *, size_t, int, nccl_comm_t, nccl_stream_t);
WL_HOOK nccl_res_t ncclReduceScatter(const void *, void *, size_t, int, int, nccl_comm_t,
                                     nccl_stream_t);
WL_HOOK nccl_res_t ncclSend(const void *, size_t, int, int, nccl_comm_t, nccl_stream_t);
WL_HOOK nccl_res_t ncclRecv(void *, size_t, int, int, nccl_comm_t, nccl_stream_t);
WL_HOOK nccl_res_t ncclGroupEnd(void);

#define REAL(n) ((__typeof__(&n))wl__real(WL__H_##n))
#define GET_REAL(n)                                                                                \
  __typeof__(&n) real = REAL(n);                                                                   \
  if (WL_UNLIKELY(!real)) {                                                                        \
    wl__warn_once("no NCCL library provides %s", #n);                                              \
    return NCCL_INTERNAL_ERROR;                                                                    \
  }

/* The region: the thread's NCCL depth, which the gate's launch path checks. */
#define REGION(call)                                                                               \
  ({                                                                                               \
    wl__tls.nccl++;                                                                                \
    nccl_res_t r_ = (call);                                                                        \
    wl__tls.nccl--;                                                                                \
    r_;                                                                                            \
  })

nccl_res_t ncclAllReduce(const void *s, void *r, size_t n, int t, int op, nccl_comm_t c,
                         nccl_stream_t st) {
  GET_REAL(ncclAllReduce);
  return REGION(real(s, r, n, t, op, c, st));
}

nccl_res_t ncclBroadcast(const void *s, void *r, size_t n, int t, int root, nccl_comm_t c,
                         nccl_stream_t st) {
  GET_REAL(ncclBroadcast);
  return REGION(real(s, r, n, t, root, c, st));
}

nccl_res_t ncclBcast(void *b, size_t n, int t, int root, nccl_comm_t c, nccl_stream_t st) {
  GET_REAL(ncclBcast);
  return REGION(real(b, n, t, root, c, st));
}

nccl_res_t ncclReduce(const void *s, void *r, size_t n, int t, int op, int root, nccl_comm_t c,
                      nccl_stream_t st) {
  GET_REAL(ncclReduce);
  return REGION(real(s, r, n, t, op, root, c, st));
}

nccl_res_t ncclAllGather(const void *s, void *r, size_t n, int t, nccl_comm_t c, nccl_stream_t st) {
  GET_REAL(ncclAllGather);
  return REGION(real(s, r, n, t, c, st));
}

nccl_res_t ncclReduceScatter(const void *s, void *r, size_t n, int t, int op, nccl_comm_t c,
                             nccl_stream_t st) {
  GET_REAL(ncclReduceScatter);
  return REGION(real(s, r, n, t, op, c, st));
}

nccl_res_t ncclSend(const void *s, size_t n, int t, int peer, nccl_comm_t c, nccl_stream_t st) {
  GET_REAL(ncclSend);
  return REGION(real(s, n, t, peer, c, st));
}

nccl_res_t ncclRecv(void *r, size_t n, int t, int peer, nccl_comm_t c, nccl_stream_t st) {
  GET_REAL(ncclRecv);
  return REGION(real(r, n, t, peer, c, st));
}

/* Grouped operations launch at the group's end. */
nccl_res_t ncclGroupEnd(void) {
  GET_REAL(ncclGroupEnd);
  return REGION(real());
}
