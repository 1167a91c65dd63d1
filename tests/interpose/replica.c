/* For tests only: a training-shaped driver-API program. Each iteration allocates one activation
 * per layer on its stream (a launch after each: the forward pass), then frees them in reverse
 * (backward), with the trainer markers of wavelet/wavelet.h (weak: no-ops without Wavelet).
 *   wl-ip-replica ITERATIONS LAYERS MIB
 * [two-devices|nccl|nccl-static|graph|graph-nccl|graph-nccl-static|
 *                                        graph-reuse|graph-nodes|graph-child|graph-clone|
 *                                        graph-update|graph-update-plain|graph-set-params|
 *                                        graph-nodes-fail|graph-node-params|graph-child-params|
 *                                        graph-add-node|graph-cond|graph-cond-plain]
 * "two-devices" (with the driver double's two devices): also allocates on the second device at
 * start-up, so that a process on two GPUs joins both groups; the iterations run on the first.
 * Prints "done N" and exits 0, or "out of memory at iteration I" (or "at start-up") and exits 2.
 * With "nccl" it calls ncclAllReduce (the fake NCCL launches a kernel inside) once per iteration,
 * right after the iteration begins, and prints "nccl-launch done" after the first one. With
 * "nccl-static" it launches a kernel named as NCCL's there itself (NCCL linked into the program: no
 * entry point to hook, only the kernel's name). The graph modes capture a graph at start-up, on
 * another thread (so that the main thread's first launch of the first iteration is the graph's,
 * where the gate decides), and launch it there instead, printing "graph-exec N HANDLE" for each
 * executable graph and "graph-launch begin" before the first launches and "graph-launch done" after
 * them. "graph": forward kernels only, instantiated with cuGraphInstantiateWithFlags. "graph-nccl":
 * a forward kernel and an ncclAllReduce call (its kernel is captured), after 65 such captures
 * invalidated by a synchronisation inside (more than the interposer keeps marks of at once: they
 * must be forgotten when they end). "graph-nccl-static": forward kernels around the kernel named as
 * NCCL's, instantiated once through each of the five instantiation entry points (the last one
 * launched with cuGraphLaunch_ptsz). "graph-reuse": a graph with the NCCL-named kernel is captured,
 * instantiated and both destroyed, then a graph of forward kernels is captured and instantiated and
 * launched; prints "reuse graph G exec E" (1 when the driver gave the same handle again). Graphs
 * not made by capture, or changed after: "graph-nodes": a graph built node by node (cuGraphCreate,
 * cuGraphAddKernelNode) of a forward kernel, the kernel named as NCCL's and another forward one;
 * "graph-nodes-fail": the same, with the driver double's next cuGraphGetNodes made to fail (the
 * interposer's inspection at instantiation). "graph-child": a forward kernel node and a child graph
 * node whose graph holds the NCCL-named kernel, given as a CUkernel of a library (kern and ctx,
 * func NULL). "graph-clone": a graph captured around the NCCL-named kernel, cloned (cuGraphClone)
 * and destroyed; the clone is instantiated. "graph-update": an executable graph of two forward
 * kernels, updated (cuGraphExecUpdate) from a captured graph of a forward kernel and the NCCL-named
 * one. "graph-update-plain": the other way round (NCCL work instantiated, updated to forward
 * kernels only). "graph-set-params": an executable graph of two forward kernel nodes, the second
 * set to the NCCL-named kernel (cuGraphExecKernelNodeSetParams); "graph-node-params": the same by
 * the generic cuGraphExecNodeSetParams. "graph-child-params": an executable graph of a forward
 * kernel node and a child graph node of another, the child graph node set
 * (cuGraphExecChildGraphNodeSetParams) to a graph holding the NCCL-named kernel as a CUkernel.
 * "graph-add-node": "graph-nodes" built with the generic cuGraphAddNode. "graph-cond": a forward
 * kernel node, then a conditional IF node (cuGraphAddNode; its handle's default 1) whose body holds
 * the NCCL-named kernel; "graph-cond-plain": the same with a forward kernel in the body. */
#include <cuda.h>
#include <dlfcn.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <wavelet/wavelet.h>

#define CHECK(call)                                                                                \
  do {                                                                                             \
    CUresult r_ = (call);                                                                          \
    if (r_ != CUDA_SUCCESS) {                                                                      \
      printf("FAIL %s: %d\n", #call, (int)r_);                                                     \
      exit(1);                                                                                     \
    }                                                                                              \
  } while (0)

static const char ptx[] =
    ".version 8.0\n.target sm_80\n.address_size 64\n"
    ".visible .entry wl_fwd()\n{\n ret;\n}\n"
    ".visible .entry wl_bwd()\n{\n ret;\n}\n"
    ".visible .entry ncclDevKernel_AllReduce_Sum_f32_RING_LL()\n{\n ret;\n}\n";

typedef int (*allreduce_fn)(const void *, void *, size_t, int, int, void *, void *);

/* The first two versions, as exported (cuda.h now names the third one cuGraphInstantiate). */
CUresult cuGraphInstantiate_legacy(CUgraphExec *, CUgraph, CUgraphNode *, char *,
                                   size_t) __asm__("cuGraphInstantiate");
CUresult cuGraphInstantiate_v2(CUgraphExec *, CUgraph, CUgraphNode *, char *, size_t);
CUresult cuGraphInstantiateWithParams_ptsz(CUgraphExec *, CUgraph, CUDA_GRAPH_INSTANTIATE_PARAMS *);
CUresult cuGraphLaunch_ptsz(CUgraphExec, CUstream);

/* ---- the graph modes ------------------------------------------------------------------------*/

#define EXECS 5

typedef struct graphs_s {
  const char *mode;
  CUcontext ctx;
  CUstream s;
  CUfunction fwd, coll;
  CUkernel coll_kernel; /* the same kernel, from a library */
  allreduce_fn allreduce;
  CUdeviceptr buf;
  CUgraphExec exec[EXECS];
  int nexec;
  int reuse_graph, reuse_exec;
} graphs_t;

/* Captures kernels k[0..n) (NULL: the all-reduce) into a graph. */
static CUgraph capture(graphs_t *g, const CUfunction *k, int n) {
  CHECK(cuStreamBeginCapture_v2(g->s, CU_STREAM_CAPTURE_MODE_GLOBAL));
  for (int i = 0; i < n; i++) {
    if (k[i])
      CHECK(cuLaunchKernel(k[i], 1, 1, 1, 32, 1, 1, 0, g->s, NULL, NULL));
    else if (g->allreduce((void *)(uintptr_t)g->buf, (void *)(uintptr_t)g->buf, 1, 0, 0, NULL,
                          g->s) != 0)
      CHECK(CUDA_ERROR_UNKNOWN);
  }
  CUgraph graph;
  CHECK(cuStreamEndCapture(g->s, &graph));
  return graph;
}

/* A kernel node after dep (none when NULL): f, or (f NULL) the CUkernel k in the context. */
static CUgraphNode add_kernel(graphs_t *g, CUgraph graph, CUgraphNode dep, CUfunction f,
                              CUkernel k) {
  CUDA_KERNEL_NODE_PARAMS p = {.func = f,
                               .gridDimX = 1,
                               .gridDimY = 1,
                               .gridDimZ = 1,
                               .blockDimX = 32,
                               .blockDimY = 1,
                               .blockDimZ = 1,
                               .kern = f ? NULL : k,
                               .ctx = f ? NULL : g->ctx};
  CUgraphNode n;
  CHECK(cuGraphAddKernelNode(&n, graph, dep ? &dep : NULL, dep ? 1 : 0, &p));
  return n;
}

/* Two forward kernels built node by node, instantiated into *x; the last node, to change. */
static CUgraphNode two_forward(graphs_t *g, CUgraphExec *x) {
  CUgraph graph;
  CHECK(cuGraphCreate(&graph, 0));
  CUgraphNode n = add_kernel(g, graph, NULL, g->fwd, NULL);
  CUgraphNode last = add_kernel(g, graph, n, g->fwd, NULL);
  CHECK(cuGraphInstantiateWithFlags(x, graph, 0));
  return last;
}

/* A kernel node of f after dep (none when NULL), made by the generic cuGraphAddNode. */
static CUgraphNode add_generic(graphs_t *g, CUgraph graph, CUgraphNode dep, CUfunction f) {
  (void)g;
  CUgraphNodeParams p = {.type = CU_GRAPH_NODE_TYPE_KERNEL,
                         .kernel = {.func = f,
                                    .gridDimX = 1,
                                    .gridDimY = 1,
                                    .gridDimZ = 1,
                                    .blockDimX = 32,
                                    .blockDimY = 1,
                                    .blockDimZ = 1}};
  CUgraphNode n;
  CHECK(cuGraphAddNode(&n, graph, dep ? &dep : NULL, NULL, dep ? 1 : 0, &p));
  return n;
}

/* The modes whose graphs are not made by capture alone, or change after instantiation. */
static void built_main(graphs_t *g) {
  CUgraphExec *x = &g->exec[g->nexec];
  if (!strcmp(g->mode, "graph-nodes") || !strcmp(g->mode, "graph-nodes-fail")) {
    CUgraph graph;
    CHECK(cuGraphCreate(&graph, 0));
    CUgraphNode n = add_kernel(g, graph, NULL, g->fwd, NULL);
    n = add_kernel(g, graph, n, g->coll, NULL);
    add_kernel(g, graph, n, g->fwd, NULL);
    if (!strcmp(g->mode, "graph-nodes-fail")) { /* the driver double's fault injection */
      int (*fail)(const char *, CUresult) =
          (int (*)(const char *, CUresult))dlsym(RTLD_DEFAULT, "wltest_fail_next");
      if (!fail || fail("cuGraphGetNodes", CUDA_ERROR_UNKNOWN)) CHECK(CUDA_ERROR_UNKNOWN);
    }
    CHECK(cuGraphInstantiateWithFlags(x, graph, 0));
  } else if (!strcmp(g->mode, "graph-child")) {
    CUgraph child, graph;
    CHECK(cuGraphCreate(&child, 0));
    add_kernel(g, child, NULL, NULL, g->coll_kernel);
    CHECK(cuGraphCreate(&graph, 0));
    CUgraphNode n = add_kernel(g, graph, NULL, g->fwd, NULL), c;
    CHECK(cuGraphAddChildGraphNode(&c, graph, &n, 1, child));
    CHECK(cuGraphDestroy(child)); /* the node holds its own copy */
    CHECK(cuGraphInstantiateWithFlags(x, graph, 0));
  } else if (!strcmp(g->mode, "graph-clone")) {
    CUfunction k[] = {g->fwd, g->coll};
    CUgraph orig = capture(g, k, 2), copy;
    CHECK(cuGraphClone(&copy, orig));
    CHECK(cuGraphDestroy(orig));
    CHECK(cuGraphInstantiateWithFlags(x, copy, 0));
  } else if (!strcmp(g->mode, "graph-update") || !strcmp(g->mode, "graph-update-plain")) {
    CUfunction plain[] = {g->fwd, g->fwd}, nccl[] = {g->fwd, g->coll};
    bool to_nccl = !strcmp(g->mode, "graph-update");
    CHECK(cuGraphInstantiateWithFlags(x, capture(g, to_nccl ? plain : nccl, 2), 0));
    CUgraphExecUpdateResultInfo info;
    CHECK(cuGraphExecUpdate(*x, capture(g, to_nccl ? nccl : plain, 2), &info));
    if (info.result != CU_GRAPH_EXEC_UPDATE_SUCCESS) CHECK(CUDA_ERROR_UNKNOWN);
  } else if (!strcmp(g->mode, "graph-set-params")) {
    CUgraphNode last = two_forward(g, x);
    CUDA_KERNEL_NODE_PARAMS p;
    CHECK(cuGraphKernelNodeGetParams(last, &p));
    p.func = g->coll;
    CHECK(cuGraphExecKernelNodeSetParams(*x, last, &p));
  } else if (!strcmp(g->mode, "graph-node-params")) {
    CUgraphNode last = two_forward(g, x);
    CUgraphNodeParams p = {.type = CU_GRAPH_NODE_TYPE_KERNEL};
    CHECK(cuGraphKernelNodeGetParams(last, (CUDA_KERNEL_NODE_PARAMS *)&p.kernel));
    p.kernel.func = g->coll;
    CHECK(cuGraphExecNodeSetParams(*x, last, &p));
  } else if (!strcmp(g->mode, "graph-child-params")) {
    CUgraph child, graph, nccl;
    CHECK(cuGraphCreate(&child, 0));
    add_kernel(g, child, NULL, g->fwd, NULL);
    CHECK(cuGraphCreate(&graph, 0));
    CUgraphNode n = add_kernel(g, graph, NULL, g->fwd, NULL), c;
    CHECK(cuGraphAddChildGraphNode(&c, graph, &n, 1, child));
    CHECK(cuGraphInstantiateWithFlags(x, graph, 0));
    CHECK(cuGraphCreate(&nccl, 0));
    add_kernel(g, nccl, NULL, NULL, g->coll_kernel);
    CHECK(cuGraphExecChildGraphNodeSetParams(*x, c, nccl));
  } else if (!strcmp(g->mode, "graph-add-node")) {
    CUgraph graph;
    CHECK(cuGraphCreate(&graph, 0));
    CUgraphNode n = NULL;
    for (int i = 0; i < 3; i++) n = add_generic(g, graph, n, i == 1 ? g->coll : g->fwd);
    CHECK(cuGraphInstantiateWithFlags(x, graph, 0));
  } else if (!strcmp(g->mode, "graph-cond") || !strcmp(g->mode, "graph-cond-plain")) {
    CUgraph graph;
    CHECK(cuGraphCreate(&graph, 0));
    CUgraphNode n = add_kernel(g, graph, NULL, g->fwd, NULL), c;
    CUgraphConditionalHandle h;
    CHECK(cuGraphConditionalHandleCreate(&h, graph, g->ctx, 1, CU_GRAPH_COND_ASSIGN_DEFAULT));
    CUgraphNodeParams p = {
        .type = CU_GRAPH_NODE_TYPE_CONDITIONAL,
        .conditional = {.handle = h, .type = CU_GRAPH_COND_TYPE_IF, .size = 1, .ctx = g->ctx}};
    CHECK(cuGraphAddNode(&c, graph, &n, NULL, 1, &p));
    /* The body is filled after the node is made, as CUDA's samples do. */
    add_kernel(g, p.conditional.phGraph_out[0], NULL,
               !strcmp(g->mode, "graph-cond") ? g->coll : g->fwd, NULL);
    CHECK(cuGraphInstantiateWithFlags(x, graph, 0));
  } else {
    return; /* an unknown mode: no executable graph */
  }
  g->nexec++;
}

static void *capture_main(void *arg) {
  graphs_t *g = arg;
  CHECK(cuCtxSetCurrent(g->ctx));
  if (!strcmp(g->mode, "graph")) {
    CUfunction k[] = {g->fwd, g->fwd};
    CHECK(cuGraphInstantiateWithFlags(&g->exec[g->nexec++], capture(g, k, 2), 0));
  } else if (!strcmp(g->mode, "graph-nccl")) {
    CUfunction k[] = {g->fwd, NULL};
    for (int i = 0; i < 65; i++) {
      CUgraph bad;
      CHECK(cuStreamBeginCapture_v2(g->s, CU_STREAM_CAPTURE_MODE_GLOBAL));
      if (g->allreduce(NULL, NULL, 1, 0, 0, NULL, g->s) != 0) CHECK(CUDA_ERROR_UNKNOWN);
      if (cuStreamSynchronize(g->s) != CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED ||
          cuStreamEndCapture(g->s, &bad) != CUDA_ERROR_STREAM_CAPTURE_INVALIDATED)
        CHECK(CUDA_ERROR_UNKNOWN);
    }
    CHECK(cuGraphInstantiateWithFlags(&g->exec[g->nexec++], capture(g, k, 2), 0));
  } else if (!strcmp(g->mode, "graph-nccl-static")) {
    CUfunction k[] = {g->fwd, g->coll, g->fwd};
    CUgraph graph = capture(g, k, 3);
    char log[64];
    CUDA_GRAPH_INSTANTIATE_PARAMS ip = {.flags = 0};
    CHECK(cuGraphInstantiate_legacy(&g->exec[g->nexec++], graph, NULL, log, sizeof log));
    CHECK(cuGraphInstantiate_v2(&g->exec[g->nexec++], graph, NULL, NULL, 0));
    CHECK(cuGraphInstantiateWithFlags(&g->exec[g->nexec++], graph, 0));
    CHECK(cuGraphInstantiateWithParams(&g->exec[g->nexec++], graph, &ip));
    CHECK(cuGraphInstantiateWithParams_ptsz(&g->exec[g->nexec++], graph, &ip));
  } else if (!strcmp(g->mode, "graph-reuse")) {
    /* An NCCL graph's handles, destroyed, must not mark the next graph. */
    CUfunction k1[] = {g->coll}, k2[] = {g->fwd, g->fwd};
    CUgraph g1 = capture(g, k1, 1);
    CUgraphExec e1;
    CHECK(cuGraphInstantiateWithFlags(&e1, g1, 0));
    CHECK(cuGraphExecDestroy(e1));
    CHECK(cuGraphDestroy(g1));
    CUgraph g2 = capture(g, k2, 2);
    CHECK(cuGraphInstantiateWithFlags(&g->exec[g->nexec], g2, 0));
    g->reuse_graph = g2 == g1;
    g->reuse_exec = g->exec[g->nexec++] == e1;
  } else {
    built_main(g);
  }
  return NULL;
}

int main(int argc, char **argv) {
  setvbuf(stdout, NULL, _IOLBF, 0);
  if (argc < 4) {
    fprintf(stderr, "usage: wl-ip-replica ITERATIONS LAYERS MIB [MODE]\n");
    return 2;
  }
  int iters = atoi(argv[1]), layers = atoi(argv[2]);
  size_t size = (size_t)atoi(argv[3]) << 20;
  const char *mode = argc > 4 ? argv[4] : "";
  int graph_mode = !strncmp(mode, "graph", 5);
  int use_nccl = !strcmp(mode, "nccl") || !strcmp(mode, "graph-nccl");
  int static_nccl = !strcmp(mode, "nccl-static");
  if (layers < 1 || layers > 256 || iters < 1 || !size) return 2;
  allreduce_fn allreduce = NULL;
  if (use_nccl) {
    allreduce = (allreduce_fn)dlsym(RTLD_DEFAULT, "ncclAllReduce");
    if (!allreduce) {
      printf("FAIL no ncclAllReduce\n");
      return 1;
    }
  }
  CUdevice dev;
  CUcontext ctx;
  CUstream s;
  CHECK(cuInit(0));
  CHECK(cuDeviceGet(&dev, 0));
  CHECK(cuDevicePrimaryCtxRetain(&ctx, dev));
  CHECK(cuCtxSetCurrent(ctx));
  CHECK(cuStreamCreate(&s, 0));
  CUmodule mod;
  CUfunction fwd, bwd;
  CHECK(cuModuleLoadData(&mod, ptx));
  CHECK(cuModuleGetFunction(&fwd, mod, "wl_fwd"));
  CHECK(cuModuleGetFunction(&bwd, mod, "wl_bwd"));
  CUfunction coll;
  CHECK(cuModuleGetFunction(&coll, mod, "ncclDevKernel_AllReduce_Sum_f32_RING_LL"));
  CUlibrary lib = NULL;
  CUkernel coll_kernel = NULL;
  if (graph_mode) {
    CHECK(cuLibraryLoadData(&lib, ptx, NULL, NULL, 0, NULL, NULL, 0));
    CHECK(cuLibraryGetKernel(&coll_kernel, lib, "ncclDevKernel_AllReduce_Sum_f32_RING_LL"));
  }
  /* Framework start-up: a first allocation (under Wavelet, the group is joined here, so the
   * markers of the first iteration already count). */
  CUdeviceptr warm;
  CUresult wr = cuMemAlloc_v2(&warm, 1 << 20);
  if (wr == CUDA_ERROR_OUT_OF_MEMORY) { /* ungated, the others holding the budget already */
    printf("out of memory at start-up\n");
    return 2;
  }
  CHECK(wr);
  CHECK(cuMemFree_v2(warm));
  if (!strcmp(mode, "two-devices")) {
    /* A process on two GPUs (WLTEST_DEVICE_COUNT=2): the second device's group is joined too;
     * the iterations run on the first. */
    CUdevice dev1;
    CUcontext ctx1;
    CHECK(cuDeviceGet(&dev1, 1));
    CHECK(cuDevicePrimaryCtxRetain(&ctx1, dev1));
    CHECK(cuCtxSetCurrent(ctx1));
    CHECK(cuMemAlloc_v2(&warm, 1 << 20));
    CHECK(cuMemFree_v2(warm));
    CHECK(cuCtxSetCurrent(ctx));
  }
  CUdeviceptr warm_buf = 0; /* what the collective reduces */
  if (use_nccl) CHECK(cuMemAlloc_v2(&warm_buf, 4096));
  graphs_t gr = {.mode = mode,
                 .ctx = ctx,
                 .s = s,
                 .fwd = fwd,
                 .coll = coll,
                 .coll_kernel = coll_kernel,
                 .allreduce = allreduce,
                 .buf = warm_buf};
  if (graph_mode) {
    pthread_t t;
    if (pthread_create(&t, NULL, capture_main, &gr) || pthread_join(t, NULL)) return 1;
    if (!gr.nexec) return 2; /* an unknown mode */
    if (!strcmp(mode, "graph-reuse"))
      printf("reuse graph %d exec %d\n", gr.reuse_graph, gr.reuse_exec);
    for (int i = 0; i < gr.nexec; i++)
      printf("graph-exec %d %llu\n", i, (unsigned long long)(uintptr_t)gr.exec[i]);
  }
  CUdeviceptr act[256];
  unsigned long long sum = 0;
  for (int it = 0; it < iters; it++) {
    wl_mark_iteration_begin();
    /* The graph (a whole step, or its collective part), as the iteration begins. */
    if (graph_mode) {
      if (it == 0) printf("graph-launch begin\n");
      for (int i = 0; i < gr.nexec; i++)
        CHECK(i == EXECS - 1 ? cuGraphLaunch_ptsz(gr.exec[i], s) : cuGraphLaunch(gr.exec[i], s));
      if (it == 0) printf("graph-launch done\n");
    }
    /* The collective comes first, before the iteration's first allocation takes the token
     * (a gradient all-reduce of the step before, as overlapping DDP schedules it). */
    if (static_nccl) {
      CHECK(cuLaunchKernel(coll, 1, 1, 1, 32, 1, 1, 0, s, NULL, NULL));
      if (it == 0) printf("nccl-launch done\n");
    }
    if (use_nccl && !graph_mode) {
      allreduce((void *)(uintptr_t)warm_buf, (void *)(uintptr_t)warm_buf, 1, 0, 0, NULL, s);
      if (it == 0) {
        void *(*fnq)(void) = (void *(*)(void))dlsym(RTLD_DEFAULT, "wltest_nccl_function");
        printf("nccl-launch done\n");
        printf("nccl-function %llu\n", fnq ? (unsigned long long)(uintptr_t)fnq() : 0ull);
      }
    }
    for (int l = 0; l < layers; l++) {
      CUresult r = cuMemAllocAsync(&act[l], size, s);
      if (r == CUDA_ERROR_OUT_OF_MEMORY) {
        printf("out of memory at iteration %d\n", it);
        return 2;
      }
      CHECK(r);
      unsigned char *p = (unsigned char *)(uintptr_t)act[l];
      p[0] = (unsigned char)(it + l);
      p[size - 1] = (unsigned char)l;
      sum += p[0] + p[size - 1];
      CHECK(cuLaunchKernel(fwd, 1, 1, 1, 32, 1, 1, 0, s, NULL, NULL));
      usleep(2000);
    }
    wl_mark_backward_begin();
    for (int l = layers - 1; l >= 0; l--) {
      CHECK(cuLaunchKernel(bwd, 1, 1, 1, 32, 1, 1, 0, s, NULL, NULL));
      CHECK(cuMemFreeAsync(act[l], s));
      usleep(2000);
    }
    wl_mark_iteration_end();
  }
  printf("done %d (checksum %llu)\n", iters, sum);
  return 0;
}
