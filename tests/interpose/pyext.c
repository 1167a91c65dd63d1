/* For tests only: a library shaped like a Python extension that uses CUDA (PyTorch's
 * _C.so -> libtorch_cuda.so -> libcudart.so): linked against the runtime, loaded by wl-ip-pyhost
 * with dlopen(RTLD_LOCAL), so the runtime is in no global scope and RTLD_NEXT from a preloaded
 * library does not find it. It allocates on the calling thread (forward) and frees on another
 * (PyTorch's autograd thread runs backward): classic, stream-ordered and pinned memory.
 * wl_ip_ext_train(steps) prints one line a step and returns 0, or prints "FAIL ..." and
 * returns 1. */
#include <cuda_runtime_api.h>
#include <pthread.h>
#include <stdio.h>

#define LAYERS 4

typedef struct step_s {
  cudaStream_t stream;
  void *act[LAYERS], *ws;
  int rc;
} step_t;

#define CHECK(call)                                                                                \
  do {                                                                                             \
    cudaError_t r_ = (call);                                                                       \
    if (r_ != cudaSuccess) {                                                                       \
      printf("FAIL %s: %d\n", #call, (int)r_);                                                     \
      return 1;                                                                                    \
    }                                                                                              \
  } while (0)

static int backward(step_t *s) {
  for (int l = LAYERS - 1; l >= 0; l--) CHECK(cudaFreeAsync(s->act[l], s->stream));
  CHECK(cudaFree(s->ws));
  return cudaStreamSynchronize(s->stream) == cudaSuccess ? 0 : 1;
}

static void *backward_thread(void *arg) {
  step_t *s = arg;
  s->rc = backward(s);
  return NULL;
}

__attribute__((visibility("default"))) int wl_ip_ext_train(int steps);
int wl_ip_ext_train(int steps) {
  step_t s = {0};
  void *pinned = NULL;
  CHECK(cudaStreamCreateWithFlags(&s.stream, cudaStreamNonBlocking));
  CHECK(cudaMallocHost(&pinned, 64 << 10));
  for (int i = 0; i < steps; i++) {
    CHECK(cudaMalloc(&s.ws, 1 << 20));
    for (int l = 0; l < LAYERS; l++)
      CHECK(cudaMallocAsync(&s.act[l], (size_t)(l + 1) << 20, s.stream));
    pthread_t t;
    if (pthread_create(&t, NULL, backward_thread, &s) || pthread_join(t, NULL) || s.rc) {
      printf("FAIL step %d: backward\n", i);
      return 1;
    }
    printf("step %d ok\n", i);
  }
  CHECK(cudaFreeHost(pinned));
  CHECK(cudaStreamDestroy(s.stream));
  return 0;
}
