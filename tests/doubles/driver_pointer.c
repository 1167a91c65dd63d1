/* The CUDA driver double's cuPointerGetAttribute(s): what it knows of an address, from the
 * allocation (linear, opened IPC handle or VMM mapping) that holds it. For tests only. */
#include "driver.h"

#include <stdio.h>

#define D drv__state

/* The attributes answered; any other existing one is not modelled. */
static bool modelled(CUpointer_attribute a) {
  switch (a) {
  case CU_POINTER_ATTRIBUTE_CONTEXT:
  case CU_POINTER_ATTRIBUTE_MEMORY_TYPE:
  case CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL:
  case CU_POINTER_ATTRIBUTE_RANGE_START_ADDR:
  case CU_POINTER_ATTRIBUTE_RANGE_SIZE:
  case CU_POINTER_ATTRIBUTE_MEMPOOL_HANDLE:
    return true;
  default:
    return false;
  }
}

/* Misuse for an attribute that does not exist; a note and CUDA_ERROR_NOT_SUPPORTED for one the
 * double does not model (a real driver would answer). */
static CUresult attr_check(CUpointer_attribute a) {
  if ((int)a < CU_POINTER_ATTRIBUTE_CONTEXT ||
      (int)a > CU_POINTER_ATTRIBUTE_IS_HW_DECOMPRESS_CAPABLE)
    return drv_misuse(CUDA_ERROR_INVALID_VALUE, "attribute %d does not exist", (int)a);
  if (!modelled(a)) {
    fprintf(stderr, "wltest-cuda: %s: attribute %d is not modelled\n", D.fn, (int)a);
    return CUDA_ERROR_NOT_SUPPORTED;
  }
  return CUDA_SUCCESS;
}

static bool lookup(CUdeviceptr ptr, drv_ptr_t *out) {
  uintptr_t p = (uintptr_t)ptr;
  return p && (drv_linear_ptr(p, out) || drv_ipc_ptr(p, out) || drv_vmm_ptr(p, out));
}

/* Writes attribute a of the allocation i (NULL: an unknown pointer, which gets what
 * cuPointerGetAttributes documents, NULL values, and device -2 as real drivers answer). */
static void attr_put(void *data, CUpointer_attribute a, const drv_ptr_t *i) {
  switch (a) {
  case CU_POINTER_ATTRIBUTE_CONTEXT:
    /* cuMemAlloc, page-locked and IPC-opened memory: the context current at its allocation or
     * open. VMM and stream-ordered memory belong to no context (cuCtxDestroy's documentation):
     * the double chooses to answer success with a NULL context for them. */
    *(CUcontext *)data = i ? i->ctx : NULL;
    break;
  case CU_POINTER_ATTRIBUTE_MEMORY_TYPE:
    *(unsigned *)data = !i ? 0 : i->host ? CU_MEMORYTYPE_HOST : CU_MEMORYTYPE_DEVICE;
    break;
  case CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL:
    *(int *)data = i ? i->device : CU_DEVICE_INVALID;
    break;
  case CU_POINTER_ATTRIBUTE_RANGE_START_ADDR:
    *(CUdeviceptr *)data = i ? (CUdeviceptr)i->start : 0;
    break;
  case CU_POINTER_ATTRIBUTE_RANGE_SIZE:
    *(size_t *)data = i ? i->size : 0;
    break;
  case CU_POINTER_ATTRIBUTE_MEMPOOL_HANDLE:
    *(CUmemoryPool *)data = i ? i->pool : NULL;
    break;
  default:
    break;
  }
}

/* An address the double does not know is CUDA_ERROR_INVALID_VALUE, what a real driver answers
 * for unregistered host memory; not a misuse, asking is legitimate. */
CUresult CUDAAPI cuPointerGetAttribute(void *data, CUpointer_attribute attribute, CUdeviceptr ptr) {
  DRV_BEGIN(cuPointerGetAttribute, DRV_NEED_INIT);
  if (!data) return drv_end(drv_misuse(CUDA_ERROR_INVALID_VALUE, "NULL output"));
  CUresult rc = attr_check(attribute);
  if (rc != CUDA_SUCCESS) return drv_end(rc);
  drv_ptr_t i;
  if (!lookup(ptr, &i)) return drv_end(CUDA_ERROR_INVALID_VALUE);
  attr_put(data, attribute, &i);
  return drv_end(CUDA_SUCCESS);
}

/* Unlike the singular call, an unknown address is no error: every value is the default. */
CUresult CUDAAPI cuPointerGetAttributes(unsigned int numAttributes, CUpointer_attribute *attributes,
                                        void **data, CUdeviceptr ptr) {
  DRV_BEGIN(cuPointerGetAttributes, DRV_NEED_INIT);
  if (!numAttributes || !attributes || !data)
    return drv_end(drv_misuse(CUDA_ERROR_INVALID_VALUE, "no attributes or no outputs"));
  for (unsigned k = 0; k < numAttributes; k++) {
    if (!data[k]) return drv_end(drv_misuse(CUDA_ERROR_INVALID_VALUE, "NULL output %u", k));
    CUresult rc = attr_check(attributes[k]);
    if (rc != CUDA_SUCCESS) return drv_end(rc);
  }
  drv_ptr_t i;
  bool known = lookup(ptr, &i);
  for (unsigned k = 0; k < numAttributes; k++) attr_put(data[k], attributes[k], known ? &i : NULL);
  return drv_end(CUDA_SUCCESS);
}
