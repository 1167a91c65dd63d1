/* The CUDA driver double's graphs: made by stream capture or node by node (kernel, child graph
 * and conditional nodes, by their own calls or cuGraphAddNode), cloned, instantiated (child
 * graphs and the body a conditional node's default value selects flattened into the executable
 * graph), updated (cuGraphExecUpdate, cuGraphExec*NodeSetParams) and launched. For tests only. */
#include "driver.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define D drv__state

/* Child graphs nest at most this deep (the real driver has a limit too; ours keeps the
 * recursion of a test's mistake bounded). */
#define DEPTH_MAX 16

/* The last destroyed graph and executable graph are the next ones made (under the lock), as a
 * driver's allocator may hand an address out again: a test can see a stale handle reused. */
static struct CUgraph_st *graph_spare;
static struct CUgraphExec_st *exec_spare;

/* Conditional handles (cuGraphConditionalHandleCreate): handle i + 1 is conds[i]. The double
 * has no device code, so a handle's value is its default (0 without CU_GRAPH_COND_ASSIGN_DEFAULT)
 * and is read at instantiation. */
#define CONDS_MAX 64
static struct {
  struct CUgraph_st *graph;
  unsigned value;
} conds[CONDS_MAX];
static unsigned nconds;

/* ---- nodes -----------------------------------------------------------------------------------*/

static void node_args_free(drv_node_t *n) {
  free(n->args);
  free(n->argbuf);
  n->args = NULL;
  n->argbuf = NULL;
}

static void node_free(drv_node_t *n) {
  node_args_free(n);
  if (n->child) drv_graph_free(n->child);
  for (unsigned i = 0; i < n->nbodies; i++)
    if (n->bodies[i]) drv_graph_free(n->bodies[i]);
  free(n->bodies);
  free(n);
}

/* Copies argument values: from the program's kernelParams (args) or from another node's copy. */
static bool args_copy(drv_node_t *dst, drv_fn_t *fn, void *const *args) {
  dst->nargs = -1;
  dst->args = NULL;
  dst->argbuf = NULL;
  if (!fn->argsizes || !args) return true;
  int n = 0;
  while (fn->argsizes[n]) n++;
  size_t bytes = 0;
  for (int i = 0; i < n; i++) bytes += fn->argsizes[i];
  dst->args = calloc(n ? (size_t)n : 1, sizeof *dst->args);
  dst->argbuf = malloc(bytes ? bytes : 1);
  if (!dst->args || !dst->argbuf) {
    node_args_free(dst);
    return false;
  }
  size_t off = 0;
  for (int i = 0; i < n; i++) {
    memcpy(dst->argbuf + off, args[i], fn->argsizes[i]);
    dst->args[i] = dst->argbuf + off;
    off += fn->argsizes[i];
  }
  dst->nargs = n;
  return true;
}

static drv_node_t *node_new(CUgraphNodeType type) {
  drv_node_t *n = calloc(1, sizeof *n);
  if (!n) return NULL;
  n->magic = DRV_NODE_MAGIC;
  n->type = type;
  n->id = ++D.next_node_id;
  n->nargs = -1;
  return n;
}

static bool graph_append(struct CUgraph_st *g, drv_node_t *n) {
  if (g->n == g->cap) {
    size_t cap = g->cap ? 2 * g->cap : 8;
    drv_node_t **a = realloc(g->nodes, cap * sizeof *a);
    if (!a) return false;
    g->nodes = a;
    g->cap = cap;
  }
  g->nodes[g->n++] = n;
  return true;
}

/* A kernel node of g; its arguments are copied now, as CUDA does. */
static CUresult graph_add_kernel(struct CUgraph_st *g, drv_fn_t *fn, const unsigned grid[3],
                                 const unsigned block[3], unsigned shared, void **args,
                                 drv_node_t **out) {
  drv_node_t *n = node_new(CU_GRAPH_NODE_TYPE_KERNEL);
  if (!n) return CUDA_ERROR_OUT_OF_MEMORY;
  n->fn = fn;
  memcpy(n->grid, grid, sizeof n->grid);
  memcpy(n->block, block, sizeof n->block);
  n->shared = shared;
  if (!args_copy(n, fn, args) || !graph_append(g, n)) {
    node_free(n);
    return CUDA_ERROR_OUT_OF_MEMORY;
  }
  if (out) *out = n;
  return CUDA_SUCCESS;
}

static struct CUgraph_st *graph_clone(const struct CUgraph_st *src, bool recycle);

/* A copy of a node (new id, its own arguments and child graph). */
static drv_node_t *node_clone(const drv_node_t *src) {
  drv_node_t *n = node_new(src->type);
  if (!n) return NULL;
  uint64_t id = n->id;
  *n = *src;
  n->id = id;
  n->child = NULL;
  if (src->nargs >= 0 && !args_copy(n, src->fn, src->args)) {
    free(n);
    return NULL;
  }
  if (src->child && !(n->child = graph_clone(src->child, false))) {
    node_free(n);
    return NULL;
  }
  return n;
}

/* ---- graphs ----------------------------------------------------------------------------------*/

struct CUgraph_st *drv_graph_new(void) {
  struct CUgraph_st *g = graph_spare ? graph_spare : calloc(1, sizeof *g);
  graph_spare = NULL;
  if (g) g->magic = DRV_GRAPH_MAGIC;
  return g;
}

static void graph_clear(struct CUgraph_st *g) {
  for (size_t i = 0; i < g->n; i++) node_free(g->nodes[i]);
  free(g->nodes);
  memset(g, 0, sizeof *g);
}

void drv_graph_free(struct CUgraph_st *g) {
  graph_clear(g);
  free(g);
}

static void graph_recycle(struct CUgraph_st *g) {
  graph_clear(g);
  free(graph_spare);
  graph_spare = g;
}

/* recycle: a graph the program gets (it may take the spare); a child graph's copy does not. */
static struct CUgraph_st *graph_clone(const struct CUgraph_st *src, bool recycle) {
  struct CUgraph_st *g = recycle ? drv_graph_new() : calloc(1, sizeof *g);
  if (!g) return NULL;
  g->magic = DRV_GRAPH_MAGIC;
  for (size_t i = 0; i < src->n; i++) {
    drv_node_t *n = node_clone(src->nodes[i]);
    if (!n || !graph_append(g, n)) {
      if (n) node_free(n);
      drv_graph_free(g);
      return NULL;
    }
  }
  return g;
}

/* A graph handle: one the program made, or a child graph inside one of them. */
static struct CUgraph_st *graph_in(struct CUgraph_st *g, const void *h, int depth) {
  if (g == h) return g;
  if (depth >= DEPTH_MAX) return NULL;
  for (size_t i = 0; i < g->n; i++) {
    if (g->nodes[i]->child) {
      struct CUgraph_st *c = graph_in(g->nodes[i]->child, h, depth + 1);
      if (c) return c;
    }
    for (unsigned b = 0; b < g->nodes[i]->nbodies; b++) {
      struct CUgraph_st *c = graph_in(g->nodes[i]->bodies[b], h, depth + 1);
      if (c) return c;
    }
  }
  return NULL;
}

static struct CUgraph_st *graph_find(CUgraph h) {
  if (!h) return NULL;
  for (struct CUgraph_st *x = D.graphs; x; x = x->next) {
    struct CUgraph_st *g = graph_in(x, h, 0);
    if (g) return g;
  }
  return NULL;
}

/* A node handle, in any graph (child graphs included); *owner: its graph. */
static drv_node_t *node_in(struct CUgraph_st *g, const void *h, struct CUgraph_st **owner,
                           int depth) {
  for (size_t i = 0; i < g->n; i++) {
    drv_node_t *n = g->nodes[i];
    if (n == h) {
      if (owner) *owner = g;
      return n;
    }
    if (n->child && depth < DEPTH_MAX) {
      drv_node_t *c = node_in(n->child, h, owner, depth + 1);
      if (c) return c;
    }
    for (unsigned b = 0; b < n->nbodies && depth < DEPTH_MAX; b++) {
      drv_node_t *c = node_in(n->bodies[b], h, owner, depth + 1);
      if (c) return c;
    }
  }
  return NULL;
}

/* Whether g holds a conditional node (which CUDA forbids in clones and child graphs). */
static bool graph_has_cond(const struct CUgraph_st *g, int depth) {
  for (size_t i = 0; i < g->n; i++) {
    if (g->nodes[i]->type == CU_GRAPH_NODE_TYPE_CONDITIONAL) return true;
    if (g->nodes[i]->child && depth < DEPTH_MAX && graph_has_cond(g->nodes[i]->child, depth + 1))
      return true;
  }
  return false;
}

static drv_node_t *node_find(CUgraphNode h, struct CUgraph_st **owner) {
  if (!h) return NULL;
  for (struct CUgraph_st *x = D.graphs; x; x = x->next) {
    drv_node_t *n = node_in(x, h, owner, 0);
    if (n) return n;
  }
  return NULL;
}

static struct CUgraphExec_st *exec_find(CUgraphExec g) {
  for (struct CUgraphExec_st *x = D.execs; x; x = x->next)
    if (x == g) return x;
  return NULL;
}

/* Dependencies must be distinct nodes of the graph (the double keeps no edges: a graph runs in
 * the order its nodes were added, which respects every dependency). */
static CUresult deps_check(struct CUgraph_st *g, const CUgraphNode *deps, size_t n) {
  if (n && !deps) return drv_misuse(CUDA_ERROR_INVALID_VALUE, "dependencies counted, not given");
  for (size_t i = 0; i < n; i++) {
    bool found = false;
    for (size_t k = 0; k < g->n && !found; k++) found = (void *)g->nodes[k] == (void *)deps[i];
    if (!found)
      return drv_misuse(CUDA_ERROR_INVALID_VALUE, "dependency %p is not a node of graph %p",
                        (void *)deps[i], (void *)g);
    for (size_t k = 0; k < i; k++)
      if (deps[k] == deps[i])
        return drv_misuse(CUDA_ERROR_INVALID_VALUE, "dependency %p given twice", (void *)deps[i]);
  }
  return CUDA_SUCCESS;
}

/* A kernel node's parameters: the kernel (func, or kern when func is NULL) and a launch shape
 * the driver would accept. */
static CUresult kernel_params_check(const CUDA_KERNEL_NODE_PARAMS *p, drv_fn_t **fn) {
  if (!p) return drv_misuse(CUDA_ERROR_INVALID_VALUE, "NULL parameters");
  const void *h = p->func ? (const void *)p->func : (const void *)p->kern;
  *fn = drv_fn_find(h);
  if (!*fn) return drv_misuse(CUDA_ERROR_INVALID_VALUE, "unknown kernel %p", h);
  if (!p->func && p->ctx && !drv_ctx_find(p->ctx))
    return drv_misuse(CUDA_ERROR_INVALID_VALUE, "unknown context %p", (void *)p->ctx);
  if (!p->gridDimX || !p->gridDimY || !p->gridDimZ || !p->blockDimX || !p->blockDimY ||
      !p->blockDimZ || (uint64_t)p->blockDimX * p->blockDimY * p->blockDimZ > 1024)
    return drv_misuse(CUDA_ERROR_INVALID_VALUE, "grid %ux%ux%u block %ux%ux%u", p->gridDimX,
                      p->gridDimY, p->gridDimZ, p->blockDimX, p->blockDimY, p->blockDimZ);
  if (p->kernelParams && p->extra)
    return drv_misuse(CUDA_ERROR_INVALID_VALUE, "both kernelParams and extra are given");
  if (p->extra) {
    fprintf(stderr, "wltest-cuda: %s: arguments through 'extra' are not modelled\n", D.fn);
    return CUDA_ERROR_NOT_SUPPORTED;
  }
  return CUDA_SUCCESS;
}

/* Sets a kernel node's parameters (checked) from p. */
static CUresult kernel_params_set(drv_node_t *n, drv_fn_t *fn, const CUDA_KERNEL_NODE_PARAMS *p) {
  drv_node_t tmp = *n;
  if (!args_copy(&tmp, fn, p->kernelParams)) return CUDA_ERROR_OUT_OF_MEMORY;
  node_args_free(n);
  n->nargs = tmp.nargs;
  n->args = tmp.args;
  n->argbuf = tmp.argbuf;
  n->fn = fn;
  n->as_kernel = !p->func;
  n->kctx = p->func ? NULL : p->ctx;
  n->grid[0] = p->gridDimX, n->grid[1] = p->gridDimY, n->grid[2] = p->gridDimZ;
  n->block[0] = p->blockDimX, n->block[1] = p->blockDimY, n->block[2] = p->blockDimZ;
  n->shared = p->sharedMemBytes;
  return CUDA_SUCCESS;
}

CUresult drv_capture_launch(struct CUstream_st *s, drv_fn_t *fn, const unsigned grid[3],
                            const unsigned block[3], unsigned shared, void **args) {
  if (s->capture != CU_STREAM_CAPTURE_STATUS_ACTIVE) return CUDA_ERROR_STREAM_CAPTURE_INVALIDATED;
  return graph_add_kernel(s->graph, fn, grid, block, shared, args, NULL);
}

CUresult CUDAAPI cuGraphCreate(CUgraph *phGraph, unsigned int flags) {
  DRV_BEGIN(cuGraphCreate, DRV_NEED_INIT);
  if (!phGraph) return drv_end(drv_misuse(CUDA_ERROR_INVALID_VALUE, "NULL output"));
  if (flags) return drv_end(drv_misuse(CUDA_ERROR_INVALID_VALUE, "flags %#x", flags));
  struct CUgraph_st *g = drv_graph_new();
  if (!g) return drv_end(CUDA_ERROR_OUT_OF_MEMORY);
  g->next = D.graphs;
  D.graphs = g;
  *phGraph = g;
  return drv_end(CUDA_SUCCESS);
}

/* The node-adding calls' common start: the output, the graph and its dependencies. */
static CUresult add_check(CUgraphNode *out, CUgraph hGraph, const CUgraphNode *deps, size_t n,
                          struct CUgraph_st **g) {
  if (!out) return drv_misuse(CUDA_ERROR_INVALID_VALUE, "NULL output");
  *g = graph_find(hGraph);
  if (!*g) return drv_misuse(CUDA_ERROR_INVALID_VALUE, "unknown graph %p", (void *)hGraph);
  return deps_check(*g, deps, n);
}

static CUresult add_kernel_node(CUgraphNode *phGraphNode, CUgraph hGraph,
                                const CUgraphNode *dependencies, size_t numDependencies,
                                const CUDA_KERNEL_NODE_PARAMS *nodeParams) {
  struct CUgraph_st *g;
  CUresult rc = add_check(phGraphNode, hGraph, dependencies, numDependencies, &g);
  drv_fn_t *fn = NULL;
  if (rc == CUDA_SUCCESS) rc = kernel_params_check(nodeParams, &fn);
  if (rc != CUDA_SUCCESS) return rc;
  drv_node_t *n = node_new(CU_GRAPH_NODE_TYPE_KERNEL);
  if (!n) return CUDA_ERROR_OUT_OF_MEMORY;
  rc = kernel_params_set(n, fn, nodeParams);
  if (rc == CUDA_SUCCESS && !graph_append(g, n)) rc = CUDA_ERROR_OUT_OF_MEMORY;
  if (rc != CUDA_SUCCESS) {
    node_free(n);
    return rc;
  }
  *phGraphNode = (CUgraphNode)(void *)n;
  return CUDA_SUCCESS;
}

CUresult CUDAAPI cuGraphAddKernelNode_v2(CUgraphNode *phGraphNode, CUgraph hGraph,
                                         const CUgraphNode *dependencies, size_t numDependencies,
                                         const CUDA_KERNEL_NODE_PARAMS *nodeParams) {
  DRV_BEGIN(cuGraphAddKernelNode_v2, DRV_NEED_INIT);
  return drv_end(add_kernel_node(phGraphNode, hGraph, dependencies, numDependencies, nodeParams));
}

CUresult CUDAAPI cuGraphKernelNodeGetParams_v2(CUgraphNode hNode,
                                               CUDA_KERNEL_NODE_PARAMS *nodeParams) {
  DRV_BEGIN(cuGraphKernelNodeGetParams_v2, DRV_NEED_INIT);
  if (!nodeParams) return drv_end(drv_misuse(CUDA_ERROR_INVALID_VALUE, "NULL output"));
  drv_node_t *n = node_find(hNode, NULL);
  if (!n) return drv_end(drv_misuse(CUDA_ERROR_INVALID_VALUE, "unknown node %p", (void *)hNode));
  if (n->type != CU_GRAPH_NODE_TYPE_KERNEL)
    return drv_end(
        drv_misuse(CUDA_ERROR_INVALID_VALUE, "node %p is not a kernel node", (void *)hNode));
  /* The kernel as it was given: a CUfunction, or a CUkernel and its context. */
  memset(nodeParams, 0, sizeof *nodeParams);
  if (n->as_kernel) {
    nodeParams->kern = (CUkernel)(void *)n->fn;
    nodeParams->ctx = n->kctx;
  } else {
    nodeParams->func = (CUfunction)(void *)n->fn;
  }
  nodeParams->gridDimX = n->grid[0], nodeParams->gridDimY = n->grid[1];
  nodeParams->gridDimZ = n->grid[2];
  nodeParams->blockDimX = n->block[0], nodeParams->blockDimY = n->block[1];
  nodeParams->blockDimZ = n->block[2];
  nodeParams->sharedMemBytes = n->shared;
  nodeParams->kernelParams = n->nargs >= 0 ? n->args : NULL;
  return drv_end(CUDA_SUCCESS);
}

/* A graph that may be copied into a child graph node (none with a conditional node). */
static CUresult child_check(CUgraph childGraph, struct CUgraph_st **c) {
  *c = graph_find(childGraph);
  if (!*c)
    return drv_misuse(CUDA_ERROR_INVALID_VALUE, "unknown child graph %p", (void *)childGraph);
  if (graph_has_cond(*c, 0))
    return drv_misuse(CUDA_ERROR_INVALID_VALUE, "child graph %p holds a conditional node",
                      (void *)childGraph);
  return CUDA_SUCCESS;
}

static CUresult add_child_node(CUgraphNode *phGraphNode, CUgraph hGraph,
                               const CUgraphNode *dependencies, size_t numDependencies,
                               CUgraph childGraph) {
  struct CUgraph_st *g, *c;
  CUresult rc = add_check(phGraphNode, hGraph, dependencies, numDependencies, &g);
  if (rc == CUDA_SUCCESS) rc = child_check(childGraph, &c);
  if (rc != CUDA_SUCCESS) return rc;
  /* The node holds a copy: later changes to childGraph do not reach it. */
  drv_node_t *n = node_new(CU_GRAPH_NODE_TYPE_GRAPH);
  if (n) n->child = graph_clone(c, false);
  if (!n || !n->child || !graph_append(g, n)) {
    if (n) node_free(n);
    return CUDA_ERROR_OUT_OF_MEMORY;
  }
  *phGraphNode = (CUgraphNode)(void *)n;
  return CUDA_SUCCESS;
}

CUresult CUDAAPI cuGraphAddChildGraphNode(CUgraphNode *phGraphNode, CUgraph hGraph,
                                          const CUgraphNode *dependencies, size_t numDependencies,
                                          CUgraph childGraph) {
  DRV_BEGIN(cuGraphAddChildGraphNode, DRV_NEED_INIT);
  return drv_end(add_child_node(phGraphNode, hGraph, dependencies, numDependencies, childGraph));
}

CUresult CUDAAPI cuGraphConditionalHandleCreate(CUgraphConditionalHandle *pHandle_out,
                                                CUgraph hGraph, CUcontext ctx,
                                                unsigned int defaultLaunchValue,
                                                unsigned int flags) {
  DRV_BEGIN(cuGraphConditionalHandleCreate, DRV_NEED_INIT);
  if (!pHandle_out) return drv_end(drv_misuse(CUDA_ERROR_INVALID_VALUE, "NULL output"));
  struct CUgraph_st *g = graph_find(hGraph);
  if (!g) return drv_end(drv_misuse(CUDA_ERROR_INVALID_VALUE, "unknown graph %p", (void *)hGraph));
  if (!drv_ctx_find(ctx))
    return drv_end(drv_misuse(CUDA_ERROR_INVALID_VALUE, "unknown context %p", (void *)ctx));
  if (flags & ~(unsigned)CU_GRAPH_COND_ASSIGN_DEFAULT)
    return drv_end(drv_misuse(CUDA_ERROR_INVALID_VALUE, "flags %#x", flags));
  if (nconds == CONDS_MAX) return drv_end(CUDA_ERROR_OUT_OF_MEMORY);
  conds[nconds].graph = g;
  conds[nconds].value = flags & CU_GRAPH_COND_ASSIGN_DEFAULT ? defaultLaunchValue : 0;
  *pHandle_out = ++nconds;
  return drv_end(CUDA_SUCCESS);
}

/* A conditional node: its handle must be one made for g or a graph g is part of; its body graphs
 * are made with it and handed out in p->phGraph_out (the node's own array). WHILE loops are not
 * modelled (the double has no device code to end them). */
static CUresult add_cond_node(CUgraphNode *out, struct CUgraph_st *g,
                              CUDA_CONDITIONAL_NODE_PARAMS *p) {
  if (!p->handle || p->handle > nconds || !graph_in(conds[p->handle - 1].graph, g, 0))
    return drv_misuse(CUDA_ERROR_INVALID_VALUE, "handle %llu is not one of graph %p's",
                      (unsigned long long)p->handle, (void *)g);
  if (!drv_ctx_find(p->ctx))
    return drv_misuse(CUDA_ERROR_INVALID_VALUE, "unknown context %p", (void *)p->ctx);
  if (p->type == CU_GRAPH_COND_TYPE_WHILE) {
    fprintf(stderr, "wltest-cuda: %s: conditional WHILE nodes are not modelled\n", D.fn);
    return CUDA_ERROR_NOT_SUPPORTED;
  }
  if ((p->type != CU_GRAPH_COND_TYPE_IF && p->type != CU_GRAPH_COND_TYPE_SWITCH) || !p->size ||
      (p->type == CU_GRAPH_COND_TYPE_IF && p->size > 2) || p->size > CONDS_MAX)
    return drv_misuse(CUDA_ERROR_INVALID_VALUE, "conditional type %d size %u", (int)p->type,
                      p->size);
  drv_node_t *n = node_new(CU_GRAPH_NODE_TYPE_CONDITIONAL);
  if (!n) return CUDA_ERROR_OUT_OF_MEMORY;
  n->cond_type = p->type;
  n->cond = p->handle;
  n->bodies = calloc(p->size, sizeof *n->bodies);
  n->nbodies = n->bodies ? p->size : 0;
  bool ok = n->bodies != NULL;
  for (unsigned i = 0; i < n->nbodies && ok; i++) {
    n->bodies[i] = calloc(1, sizeof *n->bodies[i]);
    if (n->bodies[i]) n->bodies[i]->magic = DRV_GRAPH_MAGIC;
    ok = n->bodies[i] != NULL;
  }
  if (!ok || !graph_append(g, n)) {
    node_free(n);
    return CUDA_ERROR_OUT_OF_MEMORY;
  }
  p->phGraph_out = (CUgraph *)n->bodies;
  *out = (CUgraphNode)(void *)n;
  return CUDA_SUCCESS;
}

/* The generic form (12.2): kernel, child graph (copied) and conditional nodes. Edge data is not
 * modelled (the double keeps no edges). */
static CUresult add_node(CUgraphNode *phGraphNode, CUgraph hGraph, const CUgraphNode *deps,
                         size_t ndeps, CUgraphNodeParams *p) {
  if (!p) return drv_misuse(CUDA_ERROR_INVALID_VALUE, "NULL parameters");
  if (p->reserved0[0] || p->reserved0[1] || p->reserved0[2] || p->reserved2)
    return drv_misuse(CUDA_ERROR_INVALID_VALUE, "reserved fields are not zero");
  if (p->type == CU_GRAPH_NODE_TYPE_KERNEL) {
    CUDA_KERNEL_NODE_PARAMS k; /* the same fields as CUDA_KERNEL_NODE_PARAMS_v3 */
    memcpy(&k, &p->kernel, sizeof k);
    return add_kernel_node(phGraphNode, hGraph, deps, ndeps, &k);
  }
  if (p->type == CU_GRAPH_NODE_TYPE_GRAPH) {
    if (p->graph.ownership != CU_GRAPH_CHILD_GRAPH_OWNERSHIP_CLONE) {
      fprintf(stderr, "wltest-cuda: %s: moved child graphs are not modelled\n", D.fn);
      return CUDA_ERROR_NOT_SUPPORTED;
    }
    return add_child_node(phGraphNode, hGraph, deps, ndeps, p->graph.graph);
  }
  if (p->type == CU_GRAPH_NODE_TYPE_CONDITIONAL) {
    struct CUgraph_st *g;
    CUresult rc = add_check(phGraphNode, hGraph, deps, ndeps, &g);
    return rc == CUDA_SUCCESS ? add_cond_node(phGraphNode, g, &p->conditional) : rc;
  }
  fprintf(stderr, "wltest-cuda: %s: node type %d is not modelled\n", D.fn, (int)p->type);
  return CUDA_ERROR_NOT_SUPPORTED;
}

CUresult CUDAAPI cuGraphAddNode_v2(CUgraphNode *phGraphNode, CUgraph hGraph,
                                   const CUgraphNode *dependencies,
                                   const CUgraphEdgeData *dependencyData, size_t numDependencies,
                                   CUgraphNodeParams *nodeParams) {
  DRV_BEGIN(cuGraphAddNode_v2, DRV_NEED_INIT);
  (void)dependencyData;
  return drv_end(add_node(phGraphNode, hGraph, dependencies, numDependencies, nodeParams));
}

/* 12.2's ABI: no edge data. */
CUresult CUDAAPI cuGraphAddNode_v1(CUgraphNode *phGraphNode, CUgraph hGraph,
                                   const CUgraphNode *dependencies, size_t numDependencies,
                                   CUgraphNodeParams *nodeParams) {
  DRV_BEGIN(cuGraphAddNode, DRV_NEED_INIT);
  return drv_end(add_node(phGraphNode, hGraph, dependencies, numDependencies, nodeParams));
}

/* Removes a node (with its child or body graphs) from its graph. */
CUresult CUDAAPI cuGraphDestroyNode(CUgraphNode hNode) {
  DRV_BEGIN(cuGraphDestroyNode, DRV_NEED_INIT);
  struct CUgraph_st *g = NULL;
  drv_node_t *n = node_find(hNode, &g);
  if (!n) return drv_end(drv_misuse(CUDA_ERROR_INVALID_VALUE, "unknown node %p", (void *)hNode));
  size_t i = 0;
  while (g->nodes[i] != n) i++;
  memmove(&g->nodes[i], &g->nodes[i + 1], (g->n - i - 1) * sizeof *g->nodes);
  g->n--;
  node_free(n);
  return drv_end(CUDA_SUCCESS);
}

CUresult CUDAAPI cuGraphChildGraphNodeGetGraph(CUgraphNode hNode, CUgraph *phGraph) {
  DRV_BEGIN(cuGraphChildGraphNodeGetGraph, DRV_NEED_INIT);
  if (!phGraph) return drv_end(drv_misuse(CUDA_ERROR_INVALID_VALUE, "NULL output"));
  drv_node_t *n = node_find(hNode, NULL);
  if (!n) return drv_end(drv_misuse(CUDA_ERROR_INVALID_VALUE, "unknown node %p", (void *)hNode));
  if (n->type != CU_GRAPH_NODE_TYPE_GRAPH)
    return drv_end(
        drv_misuse(CUDA_ERROR_INVALID_VALUE, "node %p is not a child graph node", (void *)hNode));
  *phGraph = n->child; /* the node's own: changes to it reach the node */
  return drv_end(CUDA_SUCCESS);
}

CUresult CUDAAPI cuGraphGetNodes(CUgraph hGraph, CUgraphNode *nodes, size_t *numNodes) {
  DRV_BEGIN(cuGraphGetNodes, DRV_NEED_INIT);
  if (!numNodes) return drv_end(drv_misuse(CUDA_ERROR_INVALID_VALUE, "NULL count"));
  struct CUgraph_st *g = graph_find(hGraph);
  if (!g) return drv_end(drv_misuse(CUDA_ERROR_INVALID_VALUE, "unknown graph %p", (void *)hGraph));
  /* NULL nodes: the count; otherwise up to *numNodes of them, and the count when fewer. */
  if (nodes) {
    size_t k = *numNodes < g->n ? *numNodes : g->n;
    for (size_t i = 0; i < k; i++) nodes[i] = (CUgraphNode)(void *)g->nodes[i];
    for (size_t i = k; i < *numNodes; i++) nodes[i] = NULL;
    if (k < *numNodes) *numNodes = k;
  } else {
    *numNodes = g->n;
  }
  return drv_end(CUDA_SUCCESS);
}

CUresult CUDAAPI cuGraphNodeGetType(CUgraphNode hNode, CUgraphNodeType *type) {
  DRV_BEGIN(cuGraphNodeGetType, DRV_NEED_INIT);
  if (!type) return drv_end(drv_misuse(CUDA_ERROR_INVALID_VALUE, "NULL output"));
  drv_node_t *n = node_find(hNode, NULL);
  if (!n) return drv_end(drv_misuse(CUDA_ERROR_INVALID_VALUE, "unknown node %p", (void *)hNode));
  *type = n->type;
  return drv_end(CUDA_SUCCESS);
}

CUresult CUDAAPI cuGraphClone(CUgraph *phGraphClone, CUgraph originalGraph) {
  DRV_BEGIN(cuGraphClone, DRV_NEED_INIT);
  if (!phGraphClone) return drv_end(drv_misuse(CUDA_ERROR_INVALID_VALUE, "NULL output"));
  struct CUgraph_st *src = graph_find(originalGraph);
  if (!src)
    return drv_end(drv_misuse(CUDA_ERROR_INVALID_VALUE, "unknown graph %p", (void *)originalGraph));
  if (graph_has_cond(src, 0))
    return drv_end(drv_misuse(CUDA_ERROR_NOT_SUPPORTED, "graph %p holds a conditional node",
                              (void *)originalGraph));
  struct CUgraph_st *g = graph_clone(src, true);
  if (!g) return drv_end(CUDA_ERROR_OUT_OF_MEMORY);
  g->next = D.graphs;
  D.graphs = g;
  *phGraphClone = g;
  return drv_end(CUDA_SUCCESS);
}

/* ---- executable graphs -----------------------------------------------------------------------*/

static void exec_nodes_free(drv_node_t *nodes, size_t n) {
  for (size_t i = 0; i < n; i++) node_args_free(&nodes[i]);
  free(nodes);
}

/* The kernel nodes of g in launch order, child graphs flattened in, each keeping the id of the
 * node it was made from; and g's shape. */
typedef struct flat_s {
  drv_node_t *nodes;
  size_t n, cap;
  char *shape;
  size_t slen, scap;
} flat_t;

static bool shape_put(flat_t *f, char c) {
  if (f->slen + 1 >= f->scap) {
    size_t cap = f->scap ? 2 * f->scap : 16;
    char *s = realloc(f->shape, cap);
    if (!s) return false;
    f->shape = s;
    f->scap = cap;
  }
  f->shape[f->slen++] = c;
  f->shape[f->slen] = 0;
  return true;
}

static bool flatten(flat_t *f, const struct CUgraph_st *g, int depth) {
  for (size_t i = 0; i < g->n; i++) {
    const drv_node_t *src = g->nodes[i];
    if (src->type == CU_GRAPH_NODE_TYPE_GRAPH) {
      if (depth >= DEPTH_MAX || !shape_put(f, '(') || !flatten(f, src->child, depth + 1) ||
          !shape_put(f, ')'))
        return false;
      continue;
    }
    if (src->type == CU_GRAPH_NODE_TYPE_CONDITIONAL) {
      /* The body its handle's value selects, now: IF runs body 0 when non-zero, else body 1
       * when there is one; SWITCH runs body value when there is one. */
      unsigned v = conds[src->cond - 1].value;
      const struct CUgraph_st *body = NULL;
      if (src->cond_type == CU_GRAPH_COND_TYPE_IF)
        body = v ? src->bodies[0] : src->nbodies == 2 ? src->bodies[1] : NULL;
      else if (v < src->nbodies)
        body = src->bodies[v];
      if (depth >= DEPTH_MAX || !shape_put(f, '{') || (body && !flatten(f, body, depth + 1)) ||
          !shape_put(f, '}'))
        return false;
      continue;
    }
    if (!shape_put(f, 'k')) return false;
    if (f->n == f->cap) {
      size_t cap = f->cap ? 2 * f->cap : 8;
      drv_node_t *a = realloc(f->nodes, cap * sizeof *a);
      if (!a) return false;
      f->nodes = a;
      f->cap = cap;
    }
    drv_node_t *dst = &f->nodes[f->n];
    *dst = *src;
    dst->child = NULL;
    if (src->nargs >= 0 && !args_copy(dst, src->fn, src->args)) return false;
    f->n++;
  }
  return true;
}

static bool flat_make(flat_t *f, const struct CUgraph_st *g) {
  memset(f, 0, sizeof *f);
  if (flatten(f, g, 0) && shape_put(f, 0)) return true;
  exec_nodes_free(f->nodes, f->n);
  free(f->shape);
  return false;
}

static struct CUgraphExec_st *exec_new(void) {
  struct CUgraphExec_st *x = exec_spare ? exec_spare : calloc(1, sizeof *x);
  exec_spare = NULL;
  return x;
}

static void exec_recycle(struct CUgraphExec_st *x) {
  exec_nodes_free(x->nodes, x->n);
  free(x->shape);
  free(exec_spare);
  memset(x, 0, sizeof *x);
  exec_spare = x;
}

void drv_graph_execs_drop(struct CUctx_st *ctx) {
  for (struct CUgraphExec_st **pp = &D.execs; *pp;) {
    struct CUgraphExec_st *x = *pp;
    if (x->ctx != ctx) {
      pp = &x->next;
      continue;
    }
    *pp = x->next;
    exec_nodes_free(x->nodes, x->n);
    free(x->shape);
    free(x);
    D.st.dropped++;
  }
}

/* The instantiation every variant shares (under the lock). */
static CUresult graph_instantiate(CUgraphExec *phGraphExec, CUgraph hGraph,
                                  unsigned long long flags) {
  if (!phGraphExec) return drv_misuse(CUDA_ERROR_INVALID_VALUE, "NULL output");
  struct CUgraph_st *g = graph_find(hGraph);
  if (!g) return drv_misuse(CUDA_ERROR_INVALID_VALUE, "unknown graph %p", (void *)hGraph);
  if (flags) return drv_misuse(CUDA_ERROR_INVALID_VALUE, "flags %#llx", flags);
  flat_t f;
  if (!flat_make(&f, g)) return CUDA_ERROR_OUT_OF_MEMORY;
  struct CUgraphExec_st *x = exec_new();
  if (!x) {
    exec_nodes_free(f.nodes, f.n);
    free(f.shape);
    return CUDA_ERROR_OUT_OF_MEMORY;
  }
  x->magic = DRV_EXEC_MAGIC;
  x->ctx = drv_current();
  x->nodes = f.nodes;
  x->n = f.n;
  x->shape = f.shape;
  x->next = D.execs;
  D.execs = x;
  *phGraphExec = x;
  return CUDA_SUCCESS;
}

CUresult CUDAAPI cuGraphInstantiateWithFlags(CUgraphExec *phGraphExec, CUgraph hGraph,
                                             unsigned long long flags) {
  DRV_BEGIN(cuGraphInstantiateWithFlags, DRV_NEED_CTX);
  return drv_end(graph_instantiate(phGraphExec, hGraph, flags));
}

/* The first two versions (10.0 and 11.0, one ABI): no flags, an error node and a log buffer,
 * which the double leaves NULL and empty (it has no instantiation errors to describe). */
static CUresult instantiate_logged(CUgraphExec *phGraphExec, CUgraph hGraph,
                                   CUgraphNode *phErrorNode, char *logBuffer, size_t bufferSize) {
  if (phErrorNode) *phErrorNode = NULL;
  if (logBuffer && bufferSize) logBuffer[0] = 0;
  return graph_instantiate(phGraphExec, hGraph, 0);
}

CUresult CUDAAPI cuGraphInstantiate_v1(CUgraphExec *phGraphExec, CUgraph hGraph,
                                       CUgraphNode *phErrorNode, char *logBuffer,
                                       size_t bufferSize) {
  DRV_BEGIN(cuGraphInstantiate, DRV_NEED_CTX);
  return drv_end(instantiate_logged(phGraphExec, hGraph, phErrorNode, logBuffer, bufferSize));
}

CUresult CUDAAPI cuGraphInstantiate_v2(CUgraphExec *phGraphExec, CUgraph hGraph,
                                       CUgraphNode *phErrorNode, char *logBuffer,
                                       size_t bufferSize) {
  DRV_BEGIN(cuGraphInstantiate_v2, DRV_NEED_CTX);
  return drv_end(instantiate_logged(phGraphExec, hGraph, phErrorNode, logBuffer, bufferSize));
}

/* 12.0: flags and the result in a structure. The upload stream matters only with the upload
 * flag, which the double refuses like every flag. */
static CUresult instantiate_params(CUgraphExec *phGraphExec, CUgraph hGraph,
                                   CUDA_GRAPH_INSTANTIATE_PARAMS *p) {
  if (!p) return drv_misuse(CUDA_ERROR_INVALID_VALUE, "NULL parameters");
  CUresult r = graph_instantiate(phGraphExec, hGraph, p->flags);
  p->hErrNode_out = NULL;
  p->result_out = r == CUDA_SUCCESS ? CUDA_GRAPH_INSTANTIATE_SUCCESS : CUDA_GRAPH_INSTANTIATE_ERROR;
  return r;
}

CUresult CUDAAPI cuGraphInstantiateWithParams(CUgraphExec *phGraphExec, CUgraph hGraph,
                                              CUDA_GRAPH_INSTANTIATE_PARAMS *instantiateParams) {
  DRV_BEGIN(cuGraphInstantiateWithParams, DRV_NEED_CTX);
  return drv_end(instantiate_params(phGraphExec, hGraph, instantiateParams));
}

CUresult CUDAAPI cuGraphInstantiateWithParams_ptsz(
    CUgraphExec *phGraphExec, CUgraph hGraph, CUDA_GRAPH_INSTANTIATE_PARAMS *instantiateParams) {
  DRV_BEGIN(cuGraphInstantiateWithParams_ptsz, DRV_NEED_CTX);
  return drv_end(instantiate_params(phGraphExec, hGraph, instantiateParams));
}

/* The top-level node of g that the top-level token at index i of a shape stands for. */
static size_t shape_top(const char *shape, size_t upto) {
  size_t top = 0;
  int depth = 0;
  for (size_t i = 0; i < upto; i++) {
    if (shape[i] == '(' || shape[i] == '{') {
      if (depth++ == 0) top++;
    } else if (shape[i] == ')' || shape[i] == '}') {
      depth--;
    } else if (depth == 0) {
      top++;
    }
  }
  return top;
}

/* What a node that begins at a shape's character is: a kernel, child graph or conditional node
 * (-1: none begins there). */
static int shape_kind(char c) {
  return c == 'k' ? 0 : c == '(' ? 1 : c == '{' ? 2 : -1;
}

/* cuGraphExecUpdate: the same shape, then every kernel node takes g's parameters (its function
 * included); the executable graph's nodes stay paired with the nodes they were made from. */
static CUresult exec_update(CUgraphExec hGraphExec, CUgraph hGraph,
                            CUgraphExecUpdateResultInfo *info) {
  info->result = CU_GRAPH_EXEC_UPDATE_ERROR;
  info->errorNode = NULL;
  info->errorFromNode = NULL;
  struct CUgraphExec_st *x = exec_find(hGraphExec);
  if (!x)
    return drv_misuse(CUDA_ERROR_INVALID_VALUE, "unknown executable graph %p", (void *)hGraphExec);
  struct CUgraph_st *g = graph_find(hGraph);
  if (!g) return drv_misuse(CUDA_ERROR_INVALID_VALUE, "unknown graph %p", (void *)hGraph);
  flat_t f;
  if (!flat_make(&f, g)) return CUDA_ERROR_OUT_OF_MEMORY;
  size_t len = strlen(x->shape), flen = strlen(f.shape);
  if (strcmp(x->shape, f.shape) != 0) {
    /* The first top-level node where they part, when both have as many. */
    if (shape_top(x->shape, len) != g->n) {
      info->result = CU_GRAPH_EXEC_UPDATE_ERROR_TOPOLOGY_CHANGED;
    } else {
      size_t i = 0;
      while (i < len && i < flen && x->shape[i] == f.shape[i]) i++;
      size_t top = shape_top(f.shape, i); /* top-level nodes wholly before the difference */
      int depth = 0;
      for (size_t k = 0; k < i; k++)
        depth += strchr("({", f.shape[k]) ? 1 : strchr(")}", f.shape[k]) ? -1 : 0;
      bool type = depth == 0 && shape_kind(x->shape[i]) >= 0 && shape_kind(f.shape[i]) >= 0 &&
                  shape_kind(x->shape[i]) != shape_kind(f.shape[i]);
      if (depth > 0) top--; /* inside a child graph that has begun */
      info->result = type ? CU_GRAPH_EXEC_UPDATE_ERROR_NODE_TYPE_CHANGED
                          : CU_GRAPH_EXEC_UPDATE_ERROR_TOPOLOGY_CHANGED;
      info->errorNode = top < g->n ? (CUgraphNode)(void *)g->nodes[top] : NULL;
    }
    exec_nodes_free(f.nodes, f.n);
    free(f.shape);
    return CUDA_ERROR_GRAPH_EXEC_UPDATE_FAILURE;
  }
  for (size_t i = 0; i < f.n; i++) f.nodes[i].id = x->nodes[i].id;
  exec_nodes_free(x->nodes, x->n);
  free(x->shape);
  x->nodes = f.nodes;
  x->n = f.n;
  x->shape = f.shape;
  info->result = CU_GRAPH_EXEC_UPDATE_SUCCESS;
  return CUDA_SUCCESS;
}

CUresult CUDAAPI cuGraphExecUpdate_v2(CUgraphExec hGraphExec, CUgraph hGraph,
                                      CUgraphExecUpdateResultInfo *resultInfo) {
  DRV_BEGIN(cuGraphExecUpdate_v2, DRV_NEED_CTX);
  if (!resultInfo) return drv_end(drv_misuse(CUDA_ERROR_INVALID_VALUE, "NULL result"));
  return drv_end(exec_update(hGraphExec, hGraph, resultInfo));
}

/* 10.2's ABI: the error node and the result as two outputs. */
CUresult CUDAAPI cuGraphExecUpdate_v1(CUgraphExec hGraphExec, CUgraph hGraph,
                                      CUgraphNode *hErrorNode_out,
                                      CUgraphExecUpdateResult *updateResult_out) {
  DRV_BEGIN(cuGraphExecUpdate, DRV_NEED_CTX);
  if (!hErrorNode_out || !updateResult_out)
    return drv_end(drv_misuse(CUDA_ERROR_INVALID_VALUE, "NULL output"));
  CUgraphExecUpdateResultInfo info;
  CUresult rc = exec_update(hGraphExec, hGraph, &info);
  *hErrorNode_out = info.errorNode;
  *updateResult_out = info.result;
  return drv_end(rc);
}

/* hNode: a kernel node of the graph the executable graph was made from (child graphs' too). */
static CUresult exec_kernel_set(CUgraphExec hGraphExec, CUgraphNode hNode,
                                const CUDA_KERNEL_NODE_PARAMS *p) {
  struct CUgraphExec_st *x = exec_find(hGraphExec);
  if (!x)
    return drv_misuse(CUDA_ERROR_INVALID_VALUE, "unknown executable graph %p", (void *)hGraphExec);
  drv_node_t *n = node_find(hNode, NULL);
  if (!n || n->type != CU_GRAPH_NODE_TYPE_KERNEL)
    return drv_misuse(CUDA_ERROR_INVALID_VALUE, "%p is no kernel node", (void *)hNode);
  drv_node_t *dst = NULL;
  for (size_t i = 0; i < x->n && !dst; i++)
    if (x->nodes[i].id == n->id) dst = &x->nodes[i];
  if (!dst)
    return drv_misuse(CUDA_ERROR_INVALID_VALUE, "node %p is not in executable graph %p",
                      (void *)hNode, (void *)hGraphExec);
  drv_fn_t *fn;
  CUresult rc = kernel_params_check(p, &fn);
  return rc == CUDA_SUCCESS ? kernel_params_set(dst, fn, p) : rc;
}

CUresult CUDAAPI cuGraphExecKernelNodeSetParams_v2(CUgraphExec hGraphExec, CUgraphNode hNode,
                                                   const CUDA_KERNEL_NODE_PARAMS *nodeParams) {
  DRV_BEGIN(cuGraphExecKernelNodeSetParams_v2, DRV_NEED_CTX);
  return drv_end(exec_kernel_set(hGraphExec, hNode, nodeParams));
}

/* 10.1's ABI: the parameters without kern and ctx. */
CUresult CUDAAPI cuGraphExecKernelNodeSetParams_v1(CUgraphExec hGraphExec, CUgraphNode hNode,
                                                   const CUDA_KERNEL_NODE_PARAMS_v1 *nodeParams) {
  DRV_BEGIN(cuGraphExecKernelNodeSetParams, DRV_NEED_CTX);
  if (!nodeParams) return drv_end(drv_misuse(CUDA_ERROR_INVALID_VALUE, "NULL parameters"));
  CUDA_KERNEL_NODE_PARAMS p = {0};
  memcpy(&p, nodeParams, sizeof *nodeParams);
  return drv_end(exec_kernel_set(hGraphExec, hNode, &p));
}

/* hNode: a child graph node of the graph the executable graph was made from; childGraph must
 * have its graph's shape, whose kernel nodes' parameters the executable graph's copies take. */
static CUresult exec_child_set(CUgraphExec hGraphExec, CUgraphNode hNode, CUgraph childGraph) {
  struct CUgraphExec_st *x = exec_find(hGraphExec);
  if (!x)
    return drv_misuse(CUDA_ERROR_INVALID_VALUE, "unknown executable graph %p", (void *)hGraphExec);
  drv_node_t *n = node_find(hNode, NULL);
  if (!n || n->type != CU_GRAPH_NODE_TYPE_GRAPH)
    return drv_misuse(CUDA_ERROR_INVALID_VALUE, "%p is no child graph node", (void *)hNode);
  struct CUgraph_st *c;
  CUresult rc = child_check(childGraph, &c);
  if (rc != CUDA_SUCCESS) return rc;
  flat_t was, now;
  if (!flat_make(&was, n->child)) return CUDA_ERROR_OUT_OF_MEMORY;
  if (!flat_make(&now, c)) {
    exec_nodes_free(was.nodes, was.n);
    free(was.shape);
    return CUDA_ERROR_OUT_OF_MEMORY;
  }
  /* The executable graph's copy of each of the node's kernel nodes, by id. */
  drv_node_t **dst = calloc(was.n ? was.n : 1, sizeof *dst);
  rc = dst ? CUDA_SUCCESS : CUDA_ERROR_OUT_OF_MEMORY;
  if (rc == CUDA_SUCCESS && strcmp(was.shape, now.shape) != 0)
    rc = drv_misuse(CUDA_ERROR_INVALID_VALUE, "child graph %p's topology differs from node %p's",
                    (void *)childGraph, (void *)hNode);
  for (size_t i = 0; rc == CUDA_SUCCESS && i < was.n; i++) {
    for (size_t k = 0; k < x->n && !dst[i]; k++)
      if (x->nodes[k].id == was.nodes[i].id) dst[i] = &x->nodes[k];
    if (!dst[i])
      rc = drv_misuse(CUDA_ERROR_INVALID_VALUE, "node %p is not in executable graph %p",
                      (void *)hNode, (void *)hGraphExec);
  }
  for (size_t i = 0; rc == CUDA_SUCCESS && i < was.n; i++) {
    uint64_t id = dst[i]->id;
    node_args_free(dst[i]);
    *dst[i] = now.nodes[i]; /* takes the copy's arguments */
    dst[i]->id = id;
    now.nodes[i].args = NULL;
    now.nodes[i].argbuf = NULL;
  }
  free(dst);
  exec_nodes_free(was.nodes, was.n);
  free(was.shape);
  exec_nodes_free(now.nodes, now.n);
  free(now.shape);
  return rc;
}

CUresult CUDAAPI cuGraphExecChildGraphNodeSetParams(CUgraphExec hGraphExec, CUgraphNode hNode,
                                                    CUgraph childGraph) {
  DRV_BEGIN(cuGraphExecChildGraphNodeSetParams, DRV_NEED_CTX);
  return drv_end(exec_child_set(hGraphExec, hNode, childGraph));
}

/* The generic form (12.2), for the node types the double models: kernel and child graph. */
CUresult CUDAAPI cuGraphExecNodeSetParams(CUgraphExec hGraphExec, CUgraphNode hNode,
                                          CUgraphNodeParams *nodeParams) {
  DRV_BEGIN(cuGraphExecNodeSetParams, DRV_NEED_CTX);
  if (!nodeParams) return drv_end(drv_misuse(CUDA_ERROR_INVALID_VALUE, "NULL parameters"));
  drv_node_t *n = node_find(hNode, NULL);
  if (!n) return drv_end(drv_misuse(CUDA_ERROR_INVALID_VALUE, "unknown node %p", (void *)hNode));
  if (n->type != nodeParams->type)
    return drv_end(drv_misuse(CUDA_ERROR_INVALID_VALUE, "node %p is of type %d, not %d",
                              (void *)hNode, (int)n->type, (int)nodeParams->type));
  if (nodeParams->type == CU_GRAPH_NODE_TYPE_KERNEL) {
    CUDA_KERNEL_NODE_PARAMS k; /* the same fields as CUDA_KERNEL_NODE_PARAMS_v3 */
    memcpy(&k, &nodeParams->kernel, sizeof k);
    return drv_end(exec_kernel_set(hGraphExec, hNode, &k));
  }
  if (nodeParams->type == CU_GRAPH_NODE_TYPE_GRAPH)
    return drv_end(exec_child_set(hGraphExec, hNode, nodeParams->graph.graph));
  fprintf(stderr, "wltest-cuda: %s: node type %d is not modelled\n", D.fn, (int)n->type);
  return drv_end(CUDA_ERROR_NOT_SUPPORTED);
}

static CUresult graph_launch(CUgraphExec hGraphExec, CUstream hStream) {
  struct CUgraphExec_st *x = exec_find(hGraphExec);
  if (!x)
    return drv_misuse(CUDA_ERROR_INVALID_VALUE, "unknown executable graph %p", (void *)hGraphExec);
  struct CUstream_st *s;
  CUresult rc = drv_stream_get(hStream, &s);
  if (rc != CUDA_SUCCESS) return rc;
  if (s->capture != CU_STREAM_CAPTURE_STATUS_NONE) return drv_capture_refuse(s);
  for (size_t i = 0; i < x->n; i++) {
    drv_node_t *n = &x->nodes[i];
    static void *noargs[1];
    void **args = n->nargs > 0 ? n->args : n->nargs == 0 ? noargs : NULL;
    rc = drv_launch_enqueue(n->fn, n->grid, n->block, n->shared, s, args);
    if (rc != CUDA_SUCCESS) return rc;
  }
  return CUDA_SUCCESS;
}

CUresult CUDAAPI cuGraphLaunch(CUgraphExec hGraphExec, CUstream hStream) {
  DRV_BEGIN(cuGraphLaunch, DRV_NEED_CTX);
  return drv_end(graph_launch(hGraphExec, hStream));
}

CUresult CUDAAPI cuGraphLaunch_ptsz(CUgraphExec hGraphExec, CUstream hStream) {
  DRV_BEGIN(cuGraphLaunch_ptsz, DRV_NEED_CTX);
  return drv_end(graph_launch(hGraphExec, hStream ? hStream : CU_STREAM_PER_THREAD));
}

CUresult CUDAAPI cuGraphExecDestroy(CUgraphExec hGraphExec) {
  DRV_BEGIN(cuGraphExecDestroy, DRV_NEED_CTX);
  for (struct CUgraphExec_st **pp = &D.execs; *pp; pp = &(*pp)->next) {
    if (*pp != hGraphExec) continue;
    struct CUgraphExec_st *x = *pp;
    *pp = x->next;
    exec_recycle(x);
    return drv_end(CUDA_SUCCESS);
  }
  return drv_end(
      drv_misuse(CUDA_ERROR_INVALID_VALUE, "unknown executable graph %p", (void *)hGraphExec));
}

CUresult CUDAAPI cuGraphDestroy(CUgraph hGraph) {
  DRV_BEGIN(cuGraphDestroy, DRV_NEED_CTX);
  for (struct CUgraph_st **pp = &D.graphs; *pp; pp = &(*pp)->next) {
    if (*pp != hGraph) continue;
    struct CUgraph_st *g = *pp;
    *pp = g->next;
    graph_recycle(g);
    return drv_end(CUDA_SUCCESS);
  }
  return drv_end(drv_misuse(CUDA_ERROR_INVALID_VALUE, "unknown graph %p", (void *)hGraph));
}
