/* gate mode: which CUDA graphs hold NCCL work, so that their launch is never gated (a collective
 * held at our gate while its peers wait in theirs stalls the job). Learned two ways: a capture
 * that saw an NCCL launch is marked by its id and the graph its end returns inherits the mark;
 * a graph not so marked is inspected with the driver when it is instantiated (kernel nodes by
 * their kernel's name, child graphs and conditional nodes' bodies recursively), which covers
 * graphs built node by node and clones. Every executable graph instantiated from a marked graph
 * is marked; cuGraphExecUpdate re-decides an executable graph's mark from its new graph, and a
 * kernel node set to an NCCL kernel, or a child graph node set to a graph holding NCCL work,
 * marks it. Destroying a handle forgets it, so a reused address is not taken for the old graph.
 * Small tables under one mutex: only captures, graph building with cuGraphAddNode,
 * instantiations, updates, destructions and the gate's decision at a graph launch come here,
 * never an ordinary kernel launch. */
#include "internal.h"

#include <stdlib.h>
#include <string.h>

/* Child graphs are inspected this deep; deeper ones count as an inspection that failed. */
#define DEPTH_MAX 8

/* Captures in progress that launched NCCL work (by capture id), and graph and executable graph
 * handles that hold it. Past these, a graph is gated as one launch, as without this file. */
#define CAPS_MAX  64
#define GRAPH_MAX 1024
#define CONDS_MAX 1024

typedef struct table_s {
  uintptr_t key[GRAPH_MAX];
  unsigned n, max;
} table_t;

static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static table_t caps = {.max = CAPS_MAX}, graphs = {.max = GRAPH_MAX}, execs = {.max = GRAPH_MAX};
/* Entries in all three tables: read without the lock, so that programs without NCCL graphs
 * never take it. */
static unsigned marked;

/* Conditional nodes (12.3) and their body graphs. The driver hands the bodies out only when
 * cuGraphAddNode makes the node (phGraph_out, valid while the node lives); CUDA 13.0 has no call
 * that returns them later, so they are remembered here. root: the top graph the node is part of
 * (a graph holding one can be no child graph), forgotten with it at cuGraphDestroy; parent: the
 * conditional node whose body holds it (0: none), forgotten with it at cuGraphDestroyNode. A
 * conditional node not found here (the table was full) fails the inspection. */
typedef struct cond_s {
  uintptr_t node, root, parent;
  const CUgraph *bodies;
  unsigned n;
} cond_t;
static cond_t conds[CONDS_MAX];
static unsigned nconds;

#define REAL(n) ((__typeof__(&n))wl__real(WL__H_##n))

static int find(const table_t *t, uintptr_t k) {
  for (unsigned i = 0; i < t->n; i++)
    if (t->key[i] == k) return (int)i;
  return -1;
}

/* Under the lock. 0 added or already there, -1 full (logged once by the caller). */
static int add(table_t *t, uintptr_t k) {
  if (find(t, k) >= 0) return 0;
  if (t->n == t->max) return -1;
  t->key[t->n++] = k;
  __atomic_add_fetch(&marked, 1, __ATOMIC_RELAXED);
  return 0;
}

/* Under the lock. 1 when k was there. */
static int del(table_t *t, uintptr_t k) {
  int i = find(t, k);
  if (i < 0) return 0;
  t->key[i] = t->key[--t->n];
  __atomic_sub_fetch(&marked, 1, __ATOMIC_RELAXED);
  return 1;
}

static table_t *table_of(int kind) {
  return kind == WL__GRAPH_EXEC ? &execs : &graphs;
}

/* The id of the capture stream is part of (joined streams included), 0 when it is capturing
 * nothing or the driver cannot say. active: only a capture still recording (an invalidated one
 * has an id until it ends, and must be forgotten then). */
static uint64_t capture_id(void *stream, bool active) {
  if (!stream || stream == CU_STREAM_LEGACY) return 0; /* the legacy stream is never captured */
  __typeof__(&cuStreamGetCaptureInfo_v3) info = REAL(cuStreamGetCaptureInfo_v3);
  if (!info) {
    wl__warn_once("the driver has no cuStreamGetCaptureInfo_v3 (CUDA 12.3); graphs holding NCCL "
                  "kernels are gated as one launch");
    return 0;
  }
  CUstreamCaptureStatus st = CU_STREAM_CAPTURE_STATUS_NONE;
  cuuint64_t id = 0;
  if (info((CUstream)stream, &st, &id, NULL, NULL, NULL, NULL) != CUDA_SUCCESS) return 0;
  if (st == CU_STREAM_CAPTURE_STATUS_NONE) return 0;
  return !active || st == CU_STREAM_CAPTURE_STATUS_ACTIVE ? (uint64_t)id : 0;
}

int wl__graph_exec_has_nccl(const void *exec) {
  if (!exec || !__atomic_load_n(&marked, __ATOMIC_RELAXED)) return 0;
  pthread_mutex_lock(&lock);
  int has = find(&execs, (uintptr_t)exec) >= 0;
  pthread_mutex_unlock(&lock);
  return has;
}

void wl__graph_capture_launch(void *stream, const void *fn, int fn_kind) {
  uint64_t id = capture_id(stream, true);
  if (!id) return;
  /* The tests the gate makes, asked only for a launch that a capture records. */
  if (!wl__tls.nccl && !wl__is_nccl_kernel(fn, fn_kind) &&
      !(fn_kind == WL__FN_GRAPH && wl__graph_exec_has_nccl(fn)))
    return;
  pthread_mutex_lock(&lock);
  int rc = add(&caps, (uintptr_t)id);
  pthread_mutex_unlock(&lock);
  if (rc)
    wl__warn_once("more than %d captures with NCCL work at once; their graphs are gated as one "
                  "launch",
                  CAPS_MAX);
}

uint64_t wl__graph_capture_marked(void *stream) {
  if (!__atomic_load_n(&marked, __ATOMIC_RELAXED)) return 0;
  uint64_t id = capture_id(stream, false);
  if (!id) return 0;
  pthread_mutex_lock(&lock);
  int has = find(&caps, (uintptr_t)id) >= 0;
  pthread_mutex_unlock(&lock);
  return has ? id : 0;
}

void wl__graph_capture_ended(uint64_t id, CUresult r, void *graph) {
  /* A capture that failed otherwise (not its origin stream, another thread) goes on. */
  if (r != CUDA_SUCCESS && r != CUDA_ERROR_STREAM_CAPTURE_INVALIDATED &&
      r != CUDA_ERROR_STREAM_CAPTURE_UNJOINED)
    return;
  pthread_mutex_lock(&lock);
  del(&caps, (uintptr_t)id);
  int rc = r == CUDA_SUCCESS && graph ? add(&graphs, (uintptr_t)graph) : 0;
  pthread_mutex_unlock(&lock);
  if (r == CUDA_SUCCESS && graph && !rc) wl__count(WL__ST_NCCL_GRAPHS, 1);
  if (rc)
    wl__warn_once("more than %d graphs with NCCL work; further ones are gated as one launch",
                  GRAPH_MAX);
}

/* ---- inspection: what a graph holds, asked of the driver at instantiation ---------------------*/

/* Whether the capture path (or an earlier inspection) marked graph. */
static int graph_marked(const void *graph) {
  if (!__atomic_load_n(&marked, __ATOMIC_RELAXED)) return 0;
  pthread_mutex_lock(&lock);
  int has = find(&graphs, (uintptr_t)graph) >= 0;
  pthread_mutex_unlock(&lock);
  return has;
}

static int inspect(CUgraph graph, int depth);

/* Under the lock. */
static int cond_find(uintptr_t node) {
  for (unsigned i = 0; i < nconds; i++)
    if (conds[i].node == node) return (int)i;
  return -1;
}

/* A conditional node's body graphs, as inspect() answers for a child graph; -1 when the node
 * was not seen made. The bodies live as long as the node, which the caller's graph holds. */
static int inspect_cond(CUgraphNode node, int depth) {
  pthread_mutex_lock(&lock);
  int i = cond_find((uintptr_t)node);
  const CUgraph *bodies = i >= 0 ? conds[i].bodies : NULL;
  unsigned n = i >= 0 ? conds[i].n : 0;
  pthread_mutex_unlock(&lock);
  if (i < 0) return -1;
  int failed = 0;
  for (unsigned b = 0; b < n; b++) {
    int res = bodies[b] ? inspect(bodies[b], depth + 1) : -1;
    if (res == 1) return 1;
    failed |= res < 0;
  }
  return failed ? -1 : 0;
}

/* A kernel node's kernel is func, or (func NULL) kern: a CUkernel, named by cuKernelGetName. */
static int node_kernel_is_nccl(const void *func, const void *kern) {
  return func ? wl__is_nccl_kernel(func, WL__FN_DRV) : wl__is_nccl_kernel(kern, WL__FN_KERNEL);
}

/* Asks the driver for graph's nodes: 1 when a kernel node (child graphs' and conditional bodies'
 * included) runs one of
 * NCCL's kernels, else -1 when some node could not be asked about (a failed call, no memory,
 * child graphs too deep), else 0. Reads only: it never synchronizes, never changes the graph. */
static int inspect(CUgraph graph, int depth) {
  __typeof__(&cuGraphGetNodes) get_nodes = REAL(cuGraphGetNodes);
  __typeof__(&cuGraphNodeGetType) get_type = REAL(cuGraphNodeGetType);
  __typeof__(&cuGraphKernelNodeGetParams_v2) get_params = REAL(cuGraphKernelNodeGetParams_v2);
  __typeof__(&cuGraphChildGraphNodeGetGraph) get_child = REAL(cuGraphChildGraphNodeGetGraph);
  if (!get_nodes || !get_type || !get_params || !get_child) {
    wl__warn_once("the driver has no cuGraphKernelNodeGetParams_v2 (CUDA 12.0); graphs not made "
                  "by capture are not inspected");
    return -1;
  }
  if (depth > DEPTH_MAX) return -1;
  size_t n = 0;
  if (get_nodes(graph, NULL, &n) != CUDA_SUCCESS) return -1;
  if (!n) return 0;
  CUgraphNode *nodes = malloc(n * sizeof *nodes);
  if (!nodes) return -1;
  size_t got = n;
  int found = 0, failed = get_nodes(graph, nodes, &got) != CUDA_SUCCESS;
  if (failed) got = 0;
  /* A node that cannot be asked about does not stop the search: another may be NCCL's. */
  for (size_t i = 0; i < got && !found; i++) {
    CUgraphNodeType type;
    int res = 0;
    if (get_type(nodes[i], &type) != CUDA_SUCCESS) {
      res = -1;
    } else if (type == CU_GRAPH_NODE_TYPE_KERNEL) {
      CUDA_KERNEL_NODE_PARAMS p;
      memset(&p, 0, sizeof p);
      res = get_params(nodes[i], &p) != CUDA_SUCCESS ? -1 : node_kernel_is_nccl(p.func, p.kern);
    } else if (type == CU_GRAPH_NODE_TYPE_GRAPH) {
      CUgraph child = NULL;
      res = get_child(nodes[i], &child) == CUDA_SUCCESS ? inspect(child, depth + 1) : -1;
    } else if (type == CU_GRAPH_NODE_TYPE_CONDITIONAL) {
      res = inspect_cond(nodes[i], depth);
    }
    found = res == 1;
    failed |= res < 0;
  }
  free(nodes);
  return found ? 1 : failed ? -1 : 0;
}

/* 1 when graph holds NCCL work: marked, or found so now (and then marked). */
static int graph_has_nccl(const void *graph) {
  if (graph_marked(graph)) return 1;
  int res = inspect((CUgraph)graph, 0);
  if (res < 0)
    wl__warn_once("could not inspect a CUDA graph for NCCL kernels; it is gated as one launch");
  if (res != 1) return 0;
  pthread_mutex_lock(&lock);
  int rc = add(&graphs, (uintptr_t)graph);
  pthread_mutex_unlock(&lock);
  if (!rc) wl__count(WL__ST_NCCL_GRAPHS_FOUND, 1);
  if (rc) /* its executable graphs are still marked */
    wl__warn_once("more than %d graphs with NCCL work; further ones are inspected at each "
                  "instantiation",
                  GRAPH_MAX);
  return 1;
}

/* Marks exec (has) or forgets it; 0, or -1 when the table is full (logged). */
static int exec_mark(const void *exec, int has) {
  pthread_mutex_lock(&lock);
  int rc = has ? add(&execs, (uintptr_t)exec) : (del(&execs, (uintptr_t)exec), 0);
  pthread_mutex_unlock(&lock);
  if (rc)
    wl__warn_once("more than %d executable graphs with NCCL work; further ones are gated as one "
                  "launch",
                  GRAPH_MAX);
  return rc;
}

void wl__graph_instantiated(const void *graph, const void *exec) {
  if (!graph || !exec || !graph_has_nccl(graph)) return;
  if (!exec_mark(exec, 1)) wl__count(WL__ST_NCCL_EXECS, 1);
}

void wl__graph_exec_updated(const void *exec, const void *graph) {
  if (!exec || !graph) return;
  int has = graph_has_nccl(graph);
  if (!has && !__atomic_load_n(&marked, __ATOMIC_RELAXED)) return; /* nothing to forget */
  if (!exec_mark(exec, has) && has) wl__count(WL__ST_NCCL_EXEC_UPDATES, 1);
}

void wl__graph_exec_kernel_set(const void *exec, const void *func, const void *kern) {
  if (!exec || !node_kernel_is_nccl(func, kern)) return;
  if (!exec_mark(exec, 1)) wl__count(WL__ST_NCCL_EXEC_UPDATES, 1);
}

void wl__graph_exec_child_set(const void *exec, const void *child) {
  if (!exec || !child || !graph_has_nccl(child)) return;
  if (!exec_mark(exec, 1)) wl__count(WL__ST_NCCL_EXEC_UPDATES, 1);
}

void wl__graph_node_added(const void *graph, const void *node, const CUgraphNodeParams *p) {
  if (!graph || !node || p->type != CU_GRAPH_NODE_TYPE_CONDITIONAL || !p->conditional.phGraph_out)
    return;
  cond_t c = {.node = (uintptr_t)node,
              .root = (uintptr_t)graph,
              .bodies = p->conditional.phGraph_out,
              .n = p->conditional.size};
  pthread_mutex_lock(&lock);
  /* In a body of another conditional node: its top graph is that node's. */
  for (unsigned i = 0; i < nconds && !c.parent; i++)
    for (unsigned b = 0; b < conds[i].n; b++)
      if ((uintptr_t)conds[i].bodies[b] == (uintptr_t)graph) {
        c.parent = conds[i].node;
        c.root = conds[i].root;
        break;
      }
  /* A node at the address of one destroyed unseen replaces it. */
  int i = cond_find(c.node);
  if (i < 0 && nconds < CONDS_MAX) i = (int)nconds++;
  if (i >= 0) conds[i] = c;
  pthread_mutex_unlock(&lock);
  if (i < 0)
    wl__warn_once("more than %d conditional graph nodes; graphs holding further ones are gated "
                  "as one launch",
                  CONDS_MAX);
}

/* Under the lock: forgets the conditional nodes that are node or part of root, then those whose
 * parent is forgotten (they were in its bodies), until none is left to forget. */
static void conds_drop(uintptr_t node, uintptr_t root) {
  for (unsigned i = nconds; i-- > 0;)
    if ((node && conds[i].node == node) || (root && conds[i].root == root))
      conds[i] = conds[--nconds];
  for (bool again = true; again;) {
    again = false;
    for (unsigned i = nconds; i-- > 0;)
      if (conds[i].parent && cond_find(conds[i].parent) < 0) {
        conds[i] = conds[--nconds];
        again = true;
      }
  }
}

void wl__graph_node_destroyed(const void *node) {
  if (!node) return;
  pthread_mutex_lock(&lock);
  conds_drop((uintptr_t)node, 0);
  pthread_mutex_unlock(&lock);
}

void wl__graph_destroyed(const void *graph) {
  if (!graph) return;
  pthread_mutex_lock(&lock);
  conds_drop(0, (uintptr_t)graph);
  pthread_mutex_unlock(&lock);
}

int wl__graph_forget(int kind, const void *h) {
  if (!h || !__atomic_load_n(&marked, __ATOMIC_RELAXED)) return 0;
  pthread_mutex_lock(&lock);
  int was = del(table_of(kind), (uintptr_t)h);
  pthread_mutex_unlock(&lock);
  return was;
}

void wl__graph_remember(int kind, const void *h) {
  pthread_mutex_lock(&lock);
  /* Its slot was freed a moment ago; should another handle have taken it since, this one is
   * gated as one launch, as without this file. */
  add(table_of(kind), (uintptr_t)h);
  pthread_mutex_unlock(&lock);
}

/* The child's CUDA context does not survive the fork, and the lock may have been held. */
void wl__graph_fork_child(void) {
  pthread_mutex_t fresh = PTHREAD_MUTEX_INITIALIZER;
  memcpy(&lock, &fresh, sizeof fresh);
  caps.n = graphs.n = execs.n = 0;
  nconds = 0;
  marked = 0;
}
