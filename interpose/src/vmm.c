/* The program's own VMM memory (cuMemCreate, cuMemMap and the rest, as PyTorch's expandable
 * segments and NCCL's buffers use them): accounted in every mode, and in alloc and gate modes
 * booked in its device's group, so the budget covers it as it covers what liballoc serves.
 *
 * The driver frees a handle's memory when its last reference goes: the handle's own
 * (cuMemRelease), one per cuMemRetainAllocationHandle, one per mapping (mapped memory "will not
 * be freed until it is unmapped"). A program may release a handle right after mapping it and
 * unmap much later (NCCL does), so the booking follows the references, not the release: each
 * handle's entry in wl__handles counts them (WL__VMM_REF), and each mapping remembers its handle
 * (wl__mapped). References are dropped before the real call that ends them and put back when it
 * fails: once the driver frees, another thread may get a handle of the same value. */
#include "internal.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

void wl__vmm_created(uintptr_t h, size_t size, int device, bool booked) {
  unsigned kind =
      WL__K_VMM | ((unsigned)device & 0xffu) << 8 | (booked ? WL__VMM_BOOKED : 0) | WL__VMM_REF;
  if (wl__map_put(wl__handles, h, size, kind) && booked)
    wl__serve_unbook(device, size); /* not recorded: it could not be given back later */
  wl__count(WL__ST_VMM_CREATES, 1);
}

/* Recorded so that its mappings are known, and an unmap over them walks on to ours. Each import
 * is taken as a reference of its own, as each create is. */
void wl__vmm_imported(uintptr_t h) {
  if (wl__map_ref(wl__handles, h, 1, NULL, NULL) > 0) return;
  wl__map_put(wl__handles, h, 0, WL__K_VMM | WL__VMM_IMPORTED | WL__VMM_REF);
}

/* One reference of h dropped into r. */
static void unref(uintptr_t h, wl__vmm_ref_t *r) {
  r->h = h;
  r->left = wl__map_ref(wl__handles, h, -1, &r->size, &r->kind);
  if (r->left < 0) r->left = -1;
}

static void op_init(wl__vmm_op_t *op) {
  op->n = 0;
  op->cap = WL__VMM_OP_INLINE;
  op->r = op->inl;
}

/* The op's next free entry, the op grown when full; NULL when memory ran out. */
static wl__vmm_ref_t *op_next(wl__vmm_op_t *op) {
  if (op->n < op->cap) return &op->r[op->n];
  size_t cap = (size_t)op->cap * 4;
  wl__vmm_ref_t *r = malloc(cap * sizeof *r);
  if (!r) {
    wl__warn_once("accounting: out of memory for an unmap of many mappings; the rest stay "
                  "accounted as mapped");
    return NULL;
  }
  memcpy(r, op->r, (size_t)op->n * sizeof *r);
  if (op->r != op->inl) free(op->r);
  op->r = r;
  op->cap = (int)cap;
  return &r[op->n];
}

void wl__vmm_release_begin(uintptr_t h, wl__vmm_op_t *op) {
  op_init(op);
  op->n = 1;
  op->r[0].map = 0;
  unref(h, &op->r[0]);
}

/* Every mapping that starts in [ptr, ptr + size), walked from ptr (the driver unmaps whole
 * mappings only): one reference of its handle each. A mapping we did not record (of a handle
 * neither made nor imported through us: another library's, say) ends the walk, since its size is
 * unknown: the mappings after it keep their references (counted live, booked until exit). */
void wl__vmm_unmap_begin(uintptr_t ptr, size_t size, wl__vmm_op_t *op) {
  op_init(op);
  for (uintptr_t q = ptr; q - ptr < size;) {
    wl__vmm_ref_t *r = op_next(op);
    unsigned k;
    uint64_t h = 0;
    if (!r || wl__map_take(wl__mappings, q, &r->msize, &r->mkind)) break;
    if (wl__map_take(wl__mapped, q, &h, &k)) h = 0;
    r->map = q;
    op->n++;
    if (h)
      unref((uintptr_t)h, r);
    else
      r->left = -1;
    if (!r->msize) break;
    q += r->msize;
  }
}

void wl__vmm_end(wl__vmm_op_t *op, bool ok) {
  for (int i = 0; i < op->n; i++) {
    const wl__vmm_ref_t *r = &op->r[i];
    if (!ok) { /* still there: every entry as it was */
      if (r->map) {
        wl__map_put(wl__mappings, r->map, r->msize, r->mkind);
        if (r->left >= 0) wl__map_put(wl__mapped, r->map, r->h, WL__K_COUNT);
      }
      if (r->left > 0)
        wl__map_ref(wl__handles, r->h, 1, NULL, NULL);
      else if (r->left == 0)
        wl__map_put(wl__handles, r->h, r->size, r->kind);
      continue;
    }
    if (r->map && r->mkind == WL__K_MAPPING)
      wl__trace_ev(WL_TRACE_UNMAP, 0, (uint64_t)r->map, r->msize, 0);
    else if (!r->map && r->left >= 0 && !(r->kind & WL__VMM_IMPORTED))
      wl__count(WL__ST_VMM_RELEASES, 1);
    if (r->left) continue;
    /* The last reference: the driver freed the memory. The trace's readers take PHYS_RELEASE
     * out of what was unmapped (a handle never mapped never reached their count). */
    if (r->kind & WL__VMM_MAPPED) wl__trace_ev(WL_TRACE_PHYS_RELEASE, 0, 0, r->size, 0);
    if (r->kind & WL__VMM_BOOKED) wl__serve_unbook((int)((r->kind >> 8) & 0xffu), r->size);
  }
  if (op->r != op->inl) free(op->r);
  op->r = op->inl;
  op->n = 0;
}

/* Mappings of an imported handle stay out of the trace: the memory is the exporter's, in its
 * trace and its group's budget. */
void wl__vmm_mapped(uintptr_t ptr, size_t size, uintptr_t h) {
  unsigned kind = 0;
  if (wl__map_ref(wl__handles, h, 1, NULL, &kind) <= 0) return; /* not memory made through us */
  bool imported = kind & WL__VMM_IMPORTED;
  if (!imported) wl__map_mark(wl__handles, h, WL__VMM_MAPPED);
  wl__map_put(wl__mappings, ptr, size, imported ? WL__K_IMPORTED : WL__K_MAPPING);
  wl__map_put(wl__mapped, ptr, h, WL__K_COUNT);
  if (!imported) wl__trace_ev(WL_TRACE_MAP, 0, (uint64_t)ptr, size, 0);
}

void wl__vmm_retained(uintptr_t h) {
  wl__map_ref(wl__handles, h, 1, NULL, NULL);
}
