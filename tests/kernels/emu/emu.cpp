/* The host emulation of CUDA for the kernel tests and wavelet-bench-emu: block threads, barriers,
 * warp exchanges, the mma.sync fragment layouts, sm_90's launch limits, and the runtime calls
 * (device memory is host memory, streams are handles). */
#include <ucontext.h>
#include <stdio.h>
#include <stdlib.h>

#include <map>
#include <mutex>
#include <set>
#include <vector>

#include "cuda_emu.h"

wl__emu_idx threadIdx, blockIdx;
dim3 blockDim, gridDim;

/* The threads of a block are coroutines on the launching thread: a barrier switches to the next
 * thread that can run, which costs far less than waking hundreds of OS threads. On x86-64 the
 * switch saves the callee-saved registers itself (swapcontext would also make a system call for
 * the signal mask, every time); elsewhere it is swapcontext. */
#if defined(__x86_64__)
extern "C" void wl__emu_switch(void **save_sp, void *load_sp);
__asm__(".text\n"
        ".globl wl__emu_switch\n"
        ".type wl__emu_switch,@function\n"
        "wl__emu_switch:\n"
        "  pushq %rbp\n  pushq %rbx\n  pushq %r12\n  pushq %r13\n  pushq %r14\n  pushq %r15\n"
        "  movq %rsp, (%rdi)\n"
        "  movq %rsi, %rsp\n"
        "  popq %r15\n  popq %r14\n  popq %r13\n  popq %r12\n  popq %rbx\n  popq %rbp\n"
        "  ret\n"
        ".size wl__emu_switch, .-wl__emu_switch\n");
#endif

namespace {

enum { RUNNABLE, WAITING, DONE };

/* An issued wgmma not yet computed (wl__emu_wgmma): what it reads, and its commit group. */
struct wg_op {
  float *d;
  int n;
  uint64_t da, db;
  bool a_mn, b_mn;
  int kind;       /* WL__EMU_WG_BF16 or WL__EMU_WG_TF32 */
  uint32_t group; /* the thread's commits before it: committed once group < wg_groups */
};

/* The accumulators of a thread's pending wgmmas: the kernel's registers hold NaN meanwhile (on
 * the hardware they may not be touched before the wait), the values live here. */
struct wg_acc {
  float *d;
  int len, refs;
  float v[128];
};

struct coro {
#if defined(__x86_64__)
  void *sp;
#else
  ucontext_t ctx;
#endif
  int state;
  std::vector<wg_op> wg_ops; /* in issue order */
  std::vector<wg_acc> wg_accs;
  uint32_t wg_groups; /* wgmma.commit_group count */
};

struct barrier {
  int expected, arrived;
  std::vector<int> waiters;
};

struct launch_state {
#if defined(__x86_64__)
  void *sched_sp;
#else
  ucontext_t sched;
#endif
  std::vector<coro> threads;
  std::vector<char *> stacks;
  barrier all;
  barrier warp[32];
  float shfl[32][32];
  uint32_t mma_a[32][32][4], mma_b[32][32][2];
  const std::function<void()> *body;
  dim3 block;
  uint32_t smem; /* dynamic shared memory bytes */
  int running;
  long yields; /* wl__emu_yield calls in the current block */
};

launch_state *cur; /* the running launch (launches run one at a time) */
std::mutex atomic_mu;
const size_t STACK = 256 * 1024;

void to_scheduler(coro &c) {
#if defined(__x86_64__)
  wl__emu_switch(&c.sp, cur->sched_sp);
#else
  swapcontext(&c.ctx, &cur->sched);
#endif
}

void to_thread(coro &c) {
#if defined(__x86_64__)
  wl__emu_switch(&cur->sched_sp, c.sp);
#else
  swapcontext(&cur->sched, &c.ctx);
#endif
}

void arrive(barrier &b) {
  launch_state &L = *cur;
  if (++b.arrived == b.expected) { /* the last one releases the others and runs on */
    for (int t : b.waiters) L.threads[t].state = RUNNABLE;
    b.waiters.clear();
    b.arrived = 0;
    return;
  }
  const int self = L.running;
  b.waiters.push_back(self);
  L.threads[self].state = WAITING;
  to_scheduler(L.threads[self]);
}

void warp_barrier() {
  arrive(cur->warp[cur->running / 32]);
}

unsigned lane_id() {
  return (unsigned)cur->running % 32;
}

unsigned warp_id() {
  return (unsigned)cur->running / 32;
}

/* A thread runs the kernel once per block and waits in between; its last wait never ends (the
 * stack is dropped with the launch). */
void entry() {
  for (;;) {
    (*cur->body)();
    coro &c = cur->threads[cur->running];
    if (!c.wg_ops.empty()) { /* its accumulators would be lost, its operands read after exit */
      fprintf(stderr, "emu: thread %d ended with %zu wgmma not waited for (wgmma.wait_group)\n",
              cur->running, c.wg_ops.size());
      abort();
    }
    c.wg_groups = 0;
    c.state = DONE;
    to_scheduler(c);
  }
}

void start(coro &c, char *stack) {
#if defined(__x86_64__)
  /* The frame wl__emu_switch pops: six registers, then entry as the return address, leaving the
   * stack as a call would (rsp + 8 a multiple of 16 on entry). */
  uintptr_t top = ((uintptr_t)(stack + STACK) & ~(uintptr_t)15) - 8;
  void **sp = (void **)top;
  *--sp = (void *)entry;
  for (int i = 0; i < 6; i++) *--sp = nullptr;
  c.sp = sp;
#else
  getcontext(&c.ctx);
  c.ctx.uc_stack.ss_sp = stack;
  c.ctx.uc_stack.ss_size = STACK;
  c.ctx.uc_link = nullptr;
  makecontext(&c.ctx, entry, 0);
#endif
}

void set_thread(int t) {
  const dim3 &b = cur->block;
  const unsigned u = (unsigned)t;
  threadIdx = {u % b.x, u / b.x % b.y, u / (b.x * b.y)};
  cur->running = t;
}

} // namespace

[[noreturn]] void __trap(void) {
  fprintf(stderr, "emu: __trap\n");
  abort();
}

void __syncthreads(void) {
  arrive(cur->all);
}

void __syncwarp(unsigned) {
  warp_barrier();
}

float __shfl_xor_sync(unsigned, float v, int lane_mask) {
  const unsigned w = warp_id(), lane = lane_id();
  cur->shfl[w][lane] = v;
  warp_barrier();
  float r = cur->shfl[w][lane ^ (unsigned)lane_mask];
  warp_barrier(); /* nobody overwrites a slot before every lane has read */
  return r;
}

float atomicAdd(float *p, float v) {
  std::lock_guard<std::mutex> g(atomic_mu);
  float old = *p;
  *p = old + v;
  return old;
}

unsigned atomicAdd(unsigned *p, unsigned v) {
  std::lock_guard<std::mutex> g(atomic_mu);
  unsigned old = *p;
  *p = old + v;
  return old;
}

static float tf32_value(uint32_t bits) {
  bits &= ~0x1fffu; /* the tensor core reads 10 mantissa bits */
  float f;
  memcpy(&f, &bits, 4);
  return f;
}

static float bf16_value(uint32_t reg, int hi) {
  uint32_t bits = (hi ? reg >> 16 : reg & 0xffffu) << 16;
  float f;
  memcpy(&f, &bits, 4);
  return f;
}

/* Element (row, k) of A and (k, col) of B from the lanes that hold them (PTX ISA, "Matrix
 * fragments for mma.m16n8k8" (.tf32) and "mma.m16n8k16" (.bf16); groupID = lane / 4,
 * threadID_in_group = lane % 4). */
static float a_elem(int kind, const uint32_t (*a)[4], int row, int k) {
  const int g = row % 8, hi_row = row >= 8;
  if (kind == 0) /* a0 (g, t), a1 (g+8, t), a2 (g, t+4), a3 (g+8, t+4) */
    return tf32_value(a[g * 4 + k % 4][hi_row + 2 * (k >= 4)]);
  /* a0 (g, 2t..2t+1), a1 (g+8, ...), a2 (g, 2t+8..), a3 (g+8, 2t+8..); low half: even k */
  return bf16_value(a[g * 4 + (k % 8) / 2][hi_row + 2 * (k >= 8)], k % 2);
}

static float b_elem(int kind, const uint32_t (*b)[2], int k, int col) {
  if (kind == 0) /* b0 (t, g), b1 (t+4, g) */
    return tf32_value(b[col * 4 + k % 4][k >= 4]);
  /* b0 (2t..2t+1, g), b1 (2t+8..2t+9, g) */
  return bf16_value(b[col * 4 + (k % 8) / 2][k >= 8], k % 2);
}

void wl__emu_mma(int kind, float (&d)[4], const uint32_t (&a)[4], const uint32_t (&b)[2]) {
  const unsigned w = warp_id(), lane = lane_id();
  memcpy(cur->mma_a[w][lane], a, sizeof a);
  memcpy(cur->mma_b[w][lane], b, sizeof b);
  warp_barrier();
  const int g = (int)lane / 4, t = (int)lane % 4, K = kind == 0 ? 8 : 16;
  for (int e = 0; e < 4; e++) { /* c0 (g, 2t), c1 (g, 2t+1), c2 (g+8, 2t), c3 (g+8, 2t+1) */
    const int row = g + 8 * (e >= 2), col = 2 * t + (e & 1);
    float s = d[e];
    for (int k = 0; k < K; k++)
      s = fmaf(a_elem(kind, cur->mma_a[w], row, k), b_elem(kind, cur->mma_b[w], k, col), s);
    d[e] = s;
  }
  warp_barrier();
}

namespace {
thread_local cudaError_t last_error;
std::mutex rt_mu;                         /* the runtime's tables below */
std::map<const void *, int> max_dyn_smem; /* cudaFuncSetAttribute's, per kernel */
std::set<cudaStream_t> streams;

cudaError_t fail(cudaError_t e) {
  last_error = e;
  return e;
}

/* NULL, cudaStreamLegacy and cudaStreamPerThread, or one created and not yet destroyed. */
bool stream_ok(cudaStream_t st) {
  if ((uintptr_t)st <= 2) return true;
  std::lock_guard<std::mutex> g(rt_mu);
  return streams.count(st) != 0;
}

/* The refusal a real launch would meet, or cudaSuccess; why says what was wrong. */
cudaError_t launch_error(const void *kernel, dim3 grid, dim3 block, size_t smem, cudaStream_t st,
                         char *why, size_t len) {
  const unsigned long long nt = (unsigned long long)block.x * block.y * block.z;
  if (!block.x || !block.y || !block.z || block.x > WL__EMU_MAX_THREADS ||
      block.y > WL__EMU_MAX_THREADS || block.z > WL__EMU_MAX_BLOCK_Z || nt > WL__EMU_MAX_THREADS) {
    snprintf(why, len, "block %u x %u x %u (%llu threads; at most 1024 x 1024 x 64 and 1024)",
             block.x, block.y, block.z, nt);
    return cudaErrorInvalidConfiguration;
  }
  if (!grid.x || !grid.y || !grid.z || grid.x > WL__EMU_MAX_GRID_X ||
      grid.y > WL__EMU_MAX_GRID_YZ || grid.z > WL__EMU_MAX_GRID_YZ) {
    snprintf(why, len, "grid %u x %u x %u (at most 2^31-1 x 65535 x 65535, none 0)", grid.x, grid.y,
             grid.z);
    return cudaErrorInvalidConfiguration;
  }
  int most = WL__EMU_SMEM_DEFAULT;
  {
    std::lock_guard<std::mutex> g(rt_mu);
    auto it = max_dyn_smem.find(kernel);
    if (it != max_dyn_smem.end()) most = it->second;
  }
  if (smem > (size_t)most) {
    snprintf(why, len,
             "%zu bytes of dynamic shared memory (at most %d for this kernel: 48 KiB unless "
             "cudaFuncSetAttribute(MaxDynamicSharedMemorySize) raised it, 227 KiB in any case)",
             smem, most);
    return cudaErrorInvalidValue;
  }
  if (!stream_ok(st)) {
    snprintf(why, len, "stream %p is not a live stream", (void *)st);
    return cudaErrorInvalidResourceHandle;
  }
  return cudaSuccess;
}
} // namespace

namespace {
/* The largest launch dimensions so far: check-only mode names each launch that exceeds one (a
 * replica ends with _exit, so there is no summary at exit). */
struct {
  unsigned grid[3];
  unsigned long long threads, smem;
} most_seen;

void note_largest(const char *name, const char *caller, dim3 grid, dim3 block, size_t smem) {
  const unsigned long long nt = (unsigned long long)block.x * block.y * block.z;
  if (grid.x <= most_seen.grid[0] && grid.y <= most_seen.grid[1] && grid.z <= most_seen.grid[2] &&
      nt <= most_seen.threads && smem <= most_seen.smem)
    return;
  most_seen.grid[0] = max(most_seen.grid[0], grid.x);
  most_seen.grid[1] = max(most_seen.grid[1], grid.y);
  most_seen.grid[2] = max(most_seen.grid[2], grid.z);
  most_seen.threads = max(most_seen.threads, nt);
  most_seen.smem = max(most_seen.smem, (unsigned long long)smem);
  fprintf(stderr,
          "emu: checked %s (in %s): grid %u x %u x %u, block %u x %u x %u, %zu bytes of dynamic "
          "shared memory\n",
          name, caller, grid.x, grid.y, grid.z, block.x, block.y, block.z, smem);
}
} // namespace

bool wl__emu_check_only(void) {
  static const bool on = [] {
    const char *e = getenv("WAVELET_EMU_CHECK_ONLY");
    bool v = e && *e && strcmp(e, "0") != 0;
    if (v) {
      fprintf(stderr, "emu: WAVELET_EMU_CHECK_ONLY: launches are checked, not run\n");
    }
    return v;
  }();
  return on;
}

void wl__emu_launch_fn(const char *name, const char *caller, const void *kernel, dim3 grid,
                       dim3 block, size_t smem, cudaStream_t st,
                       const std::function<void()> &body) {
  char why[256];
  cudaError_t err = launch_error(kernel, grid, block, smem, st, why, sizeof why);
  if (err != cudaSuccess) {
    fprintf(stderr, "emu: launch of %s (in %s) refused, as on sm_90: %s: %s\n", name, caller, why,
            cudaGetErrorString(err));
    fail(err);
    return;
  }
  if (wl__emu_check_only()) {
    note_largest(name, caller, grid, block, smem);
    return;
  }
  const unsigned nt = block.x * block.y * block.z;
  if (nt % 32 != 0) { /* the warp exchanges assume whole warps */
    fprintf(stderr, "emu: %s: blocks of %u threads (not whole warps) are not emulated\n", name, nt);
    abort();
  }
  launch_state *L = new launch_state();
  L->threads.resize(nt);
  for (unsigned t = 0; t < nt; t++) {
    char *stack = (char *)malloc(STACK);
    if (!stack) abort();
    L->stacks.push_back(stack);
  }
  L->all.expected = (int)nt;
  for (int w = 0; w < 32; w++) L->warp[w].expected = 32;
  L->body = &body;
  L->block = block;
  L->smem = (uint32_t)smem;
  blockDim = block;
  gridDim = grid;
  cur = L;
  for (unsigned z = 0; z < grid.z; z++)
    for (unsigned y = 0; y < grid.y; y++)
      for (unsigned x = 0; x < grid.x; x++) {
        blockIdx = {x, y, z};
        L->yields = 0;
        for (unsigned t = 0; t < nt; t++) {
          if (x == 0 && y == 0 && z == 0) start(L->threads[t], L->stacks[t]);
          L->threads[t].state = RUNNABLE;
        }
        for (unsigned done = 0; done < nt;) {
          bool ran = false;
          done = 0;
          for (unsigned t = 0; t < nt; t++) {
            if (L->threads[t].state == DONE) {
              done++;
              continue;
            }
            if (L->threads[t].state != RUNNABLE) continue;
            set_thread((int)t);
            to_thread(L->threads[t]);
            ran = true;
          }
          if (!ran && done < nt) {
            fprintf(stderr, "emu: deadlock: block threads wait on a barrier nobody reaches\n");
            abort();
          }
        }
      }
  cur = nullptr;
  for (char *s : L->stacks) free(s);
  delete L;
}

/* ------------------------------------------------------------------------------------------------
 * sm_90: shared-memory arena, mbarriers, TMA, wgmma
 * ----------------------------------------------------------------------------------------------*/

namespace {
/* The dynamic shared memory starts SMEM_BASE bytes into the arena: a kernel that needs 1024-byte
 * alignment must align its pointer itself and ask for the slack, as on the hardware. */
const uint32_t SMEM_BASE = 16;
alignas(1024) unsigned char smem_arena[SMEM_BASE + WL__EMU_SMEM_OPTIN];

/* Stops the test when [addr, addr + len) leaves the launch's dynamic shared memory. */
void smem_check(const char *what, uint32_t addr, uint32_t len) {
  if (addr < SMEM_BASE || (uint64_t)addr + len > (uint64_t)SMEM_BASE + cur->smem) {
    fprintf(stderr,
            "emu: %s at shared address %u (%u bytes) outside the launch's dynamic shared memory "
            "[%u, %u)\n",
            what, addr, len, SMEM_BASE, SMEM_BASE + cur->smem);
    abort();
  }
}

struct mbar {
  uint32_t expected, pending, phase;
  int64_t tx;
};
std::map<uint32_t, mbar> mbars;

/* The shared memory that issued, not yet computed wgmmas read, as [lo, hi) byte ranges (whole
 * 128-byte rows) with how many pending wgmmas read each: a TMA load into one of them is the race
 * of a stage given back before the wgmma group reading it was waited for. */
std::map<std::pair<uint32_t, uint32_t>, long> wg_reads;

void mbar_check(mbar &b) {
  if (b.pending == 0 && b.tx == 0) b.phase++, b.pending = b.expected;
}

/* Swizzle<3,4,3>: the 16-byte chunk (address bits 4-6) XOR the 128-byte row in its 1024-byte atom
 * (bits 7-9). */
uint32_t swz128(uint32_t a) {
  return a ^ (((a >> 7) & 7u) << 4);
}

float bf16_at(uint32_t addr) {
  smem_check("wgmma operand", addr, 2);
  uint16_t h;
  memcpy(&h, smem_arena + addr, 2);
  uint32_t u = (uint32_t)h << 16;
  float f;
  memcpy(&f, &u, 4);
  return f;
}

/* A tf32 operand element: the tensor core reads the sign, exponent and upper 10 mantissa bits of
 * the fp32 in shared memory (the low 13 bits are ignored: truncation, for inputs not already
 * rounded). */
float tf32_at(uint32_t addr) {
  smem_check("wgmma operand", addr, 4);
  uint32_t u;
  memcpy(&u, smem_arena + addr, 4);
  return __uint_as_float(u & ~0x1fffu);
}

/* Element (mn, k) of a 128-byte-swizzled operand: K-major ((8,m),(T,2k)):((8T,SBO),(1,T)), MN-major
 * ((T,8,m),(8,k)):((1,T,LBO),(8T,SBO)) (CUTLASS's names for the PTX ISA's canonical layouts; T
 * elements of 16 bytes, so a 128-byte row holds 64 bf16 or 32 tf32). tf32 is K-major only (the
 * callers refuse MN-major). */
float operand(uint64_t desc, bool mn_major, int mn, int k, int kind) {
  const uint32_t start = (uint32_t)(desc & 0x3fff) << 4;
  const uint32_t lbo = (uint32_t)((desc >> 16) & 0x3fff) << 4;
  const uint32_t sbo = (uint32_t)((desc >> 32) & 0x3fff) << 4;
  if ((desc >> 62) != 1) {
    fprintf(stderr, "emu: wgmma descriptor without the 128-byte swizzle\n");
    abort();
  }
  uint32_t a;
  if (kind == WL__EMU_WG_TF32)
    return tf32_at(
        swz128(start + (uint32_t)(mn / 8) * sbo + (uint32_t)(mn % 8) * 128 + (uint32_t)k * 4));
  if (mn_major)
    a = start + (uint32_t)(mn / 64) * lbo + (uint32_t)(mn % 64) * 2 + (uint32_t)(k / 8) * sbo +
        (uint32_t)(k % 8) * 128;
  else
    a = start + (uint32_t)(mn / 8) * sbo + (uint32_t)(mn % 8) * 128 + (uint32_t)k * 2;
  return bf16_at(swz128(a));
}
} // namespace

unsigned char *wl__emu_smem(void) {
  return smem_arena + SMEM_BASE;
}

uint32_t __cvta_generic_to_shared(const void *p) {
  return (uint32_t)((const unsigned char *)p - smem_arena);
}

void wl__emu_yield(void) {
  /* every thread waiting on an mbarrier nobody will complete would spin here forever */
  if (++cur->yields > 100000000L) {
    fprintf(stderr, "emu: deadlock: block threads wait on an mbarrier nobody completes\n");
    abort();
  }
  coro &c = cur->threads[cur->running];
  c.state = RUNNABLE;
  to_scheduler(c);
}

void wl__emu_mbar_init(uint32_t bar, uint32_t count) {
  smem_check("mbarrier", bar, 8);
  if (bar % 8 != 0) {
    fprintf(stderr, "emu: mbarrier at shared address %u, not 8-byte aligned\n", bar);
    abort();
  }
  mbars[bar] = mbar{count, count, 0, 0};
}

void wl__emu_mbar_arrive(uint32_t bar, uint32_t tx_bytes) {
  mbar &b = mbars.at(bar);
  if (b.pending == 0) {
    fprintf(stderr, "emu: mbarrier %u: more arrivals than its count\n", bar);
    abort();
  }
  b.tx += tx_bytes;
  b.pending--;
  mbar_check(b);
}

/* The phase with this parity has completed: the current phase has the other parity. */
bool wl__emu_mbar_done(uint32_t bar, uint32_t parity) {
  return (mbars.at(bar).phase & 1u) != parity;
}

void wl__emu_tma_load(uint32_t dst, const CUtensorMap *map, uint32_t bar, int c0, int c1) {
  smem_check("TMA box", dst, 8192);
  if (map->elem != 2 && map->elem != 4) {
    fprintf(stderr, "emu: tensor map with %u-byte elements (2 or 4 modelled)\n", map->elem);
    abort();
  }
  const int cols = 128 / (int)map->elem; /* the box's inner extent: one 128-byte swizzle row */
  /* cuTensorMapEncodeTiled refuses a base not 16-byte aligned or a row stride not a multiple of
   * 16 bytes: such a map cannot reach a TMA load on the hardware */
  if ((uintptr_t)map->p % 16 != 0 || map->stride % 16 != 0) {
    fprintf(stderr,
            "emu: tensor map at %p with a %llu-byte row stride (TMA needs both 16-byte aligned)\n",
            map->p, (unsigned long long)map->stride);
    abort();
  }
  if (dst % 1024 != 0) { /* the 128-byte swizzle's atoms */
    fprintf(stderr, "emu: TMA box at shared address %u, not 1024-byte aligned\n", dst);
    abort();
  }
  for (const auto &r : wg_reads)
    if (r.first.first < dst + 8192 && dst < r.first.second) {
      fprintf(
          stderr,
          "emu: race: TMA load into shared memory [%u, %u) that wgmma issued and not yet waited "
          "for read ([%u, %u)): a stage given back before wgmma.wait_group completed the "
          "group reading it\n",
          dst, dst + 8192, r.first.first, r.first.second);
      abort();
    }
  const uint32_t e = map->elem;
  for (int r = 0; r < 64; r++)
    for (int c = 0; c < cols; c++) {
      const long long gi = (long long)c0 + c, go = (long long)c1 + r;
      unsigned char v[4] = {0, 0, 0, 0};
      if (gi >= 0 && go >= 0 && (uint64_t)gi < map->dims[0] && (uint64_t)go < map->dims[1])
        memcpy(v, (const unsigned char *)map->p + (uint64_t)go * map->stride + (uint64_t)gi * e, e);
      memcpy(smem_arena + swz128(dst + (uint32_t)r * 128 + (uint32_t)c * e), v, e);
    }
  mbar &b = mbars.at(bar);
  b.tx -= 8192;
  mbar_check(b);
}

namespace {
/* The rows an operand of mn_rows x 16 occupies (all of its warpgroup's, not only the thread's):
 * the largest offset is at the last mn or at the end of the last whole 8-row (K-major) or 64-column
 * (MN-major) group, whichever is further; the swizzle moves bytes only within a 128-byte row. */
std::pair<uint32_t, uint32_t> operand_rows(uint64_t desc, bool mn_major, int mn_rows, int kind) {
  const uint32_t start = (uint32_t)(desc & 0x3fff) << 4;
  const uint32_t lbo = (uint32_t)((desc >> 16) & 0x3fff) << 4;
  const uint32_t sbo = (uint32_t)((desc >> 32) & 0x3fff) << 4;
  const int unit = mn_major ? 64 : 8;
  auto off = [&](int mn) {
    return mn_major ? (uint32_t)(mn / 64) * lbo + (uint32_t)(mn % 64) * 2 + sbo + 7 * 128
                    : (uint32_t)(mn / 8) * sbo + (uint32_t)(mn % 8) * 128 +
                          (kind == WL__EMU_WG_TF32 ? 7 * 4 : 15 * 2);
  };
  uint32_t most = off(mn_rows - 1);
  if (mn_rows >= unit) most = max(most, off(mn_rows / unit * unit - 1));
  return {start & ~127u, ((start + most) | 127u) + 1};
}

void reads_add(const wg_op &op, long by) {
  for (int o = 0; o < 2; o++) {
    auto r =
        o ? operand_rows(op.db, op.b_mn, op.n, op.kind) : operand_rows(op.da, op.a_mn, 64, op.kind);
    auto it = wg_reads.emplace(r, 0).first;
    if ((it->second += by) == 0) wg_reads.erase(it);
  }
}

/* One wgmma's arithmetic for the calling thread, on the values its accumulators had at issue:
 * d holds N/2 accumulators, d[4j + 2h + e] at row 16 warp + lane/4 + 8h, column 8j + 2 (lane%4) +
 * e, for its warp within the warpgroup. */
void wgmma_compute(float *d, int n, uint64_t da, uint64_t db, bool a_mn, bool b_mn, int kind) {
  const int t = cur->running % 128, warp = t / 32, lane = t % 32;
  const int kn = kind == WL__EMU_WG_TF32 ? 8 : 16; /* K of one instruction: 32 bytes of a row */
  /* the thread's 2 rows of A and n/4 columns of B, each read once (the emulated GEMMs' time) */
  float a[2][16], b[64][16];
  for (int h = 0; h < 2; h++)
    for (int k = 0; k < kn; k++) a[h][k] = operand(da, a_mn, warp * 16 + lane / 4 + 8 * h, k, kind);
  for (int c = 0; c < n / 4; c++)
    for (int k = 0; k < kn; k++)
      b[c][k] = operand(db, b_mn, (c / 2) * 8 + (lane % 4) * 2 + c % 2, k, kind);
  for (int i = 0; i < n / 2; i++) {
    const float *ar = a[(i / 2) % 2], *bc = b[(i / 4) * 2 + i % 2];
    float s = d[i];
    for (int k = 0; k < kn; k++) s += ar[k] * bc[k];
    d[i] = s;
  }
}

wg_acc *acc_of(coro &c, float *d) {
  for (wg_acc &a : c.wg_accs)
    if (a.d == d) return &a;
  return nullptr;
}
} // namespace

static unsigned long long wg_issued[2]; /* wl__emu_wgmma_issued's */

unsigned long long wl__emu_wgmma_issued(int kind) {
  return kind == 0 || kind == 1 ? __atomic_load_n(&wg_issued[kind], __ATOMIC_RELAXED) : 0;
}

/* wgmma.mma_async: queued on the calling thread, its operands read only when a wait_group
 * completes it (wl__emu_wg_wait), as late as the hardware may read them. */
void wl__emu_wgmma(float *d, int n, uint64_t da, uint64_t db, bool a_mn, bool b_mn, int kind) {
  coro &c = cur->threads[cur->running];
  const int len = n / 2;
  if (n < 8 || n > 256 || n % 8 != 0) { /* the shapes m64nNk16 and m64nNk8 have */
    fprintf(stderr, "emu: wgmma n%d (N is 8 to 256, a multiple of 8)\n", n);
    abort();
  }
  if (kind != WL__EMU_WG_BF16 && kind != WL__EMU_WG_TF32) {
    fprintf(stderr, "emu: wgmma of input kind %d (bf16 and tf32 modelled)\n", kind);
    abort();
  }
  /* PTX ISA, wgmma.mma_async: "The transpose operation is only supported for the
   * wgmma.mma_async variants with .f16/.bf16 types": tf32 operands in shared memory are K-major */
  if (kind == WL__EMU_WG_TF32 && (a_mn || b_mn)) {
    fprintf(stderr, "emu: tf32 wgmma with an MN-major operand (no transpose for tf32)\n");
    abort();
  }
  wg_acc *acc = acc_of(c, d);
  if (!acc) {
    for (const wg_acc &a : c.wg_accs)
      if (d < a.d + a.len && a.d < d + len) {
        fprintf(stderr, "emu: wgmma accumulators overlap those of a pending wgmma\n");
        abort();
      }
    c.wg_accs.push_back(wg_acc{d, len, 0, {}});
    acc = &c.wg_accs.back();
    memcpy(acc->v, d, (size_t)len * sizeof *d);
    for (int i = 0; i < len; i++) d[i] = NAN; /* a kernel that reads them early gets NaN */
  } else if (acc->len != len) {
    fprintf(stderr, "emu: wgmma of n%d on the accumulators of a pending n%d\n", n, 2 * acc->len);
    abort();
  }
  acc->refs++;
  __atomic_add_fetch(&wg_issued[kind], 1, __ATOMIC_RELAXED);
  c.wg_ops.push_back(wg_op{d, n, da, db, a_mn, b_mn, kind, c.wg_groups});
  reads_add(c.wg_ops.back(), 1);
}

void wl__emu_wg_commit(void) {
  cur->threads[cur->running].wg_groups++;
}

/* wgmma.wait_group n: every committed group but the n newest completes. The others run first (a
 * yield, as a wait lets them), so a producer that was given a stage too early overwrites it before
 * the late read here, as it may on the hardware. */
void wl__emu_wg_wait(int n) {
  coro *c = &cur->threads[cur->running];
  const uint32_t upto = c->wg_groups > (uint32_t)n ? c->wg_groups - (uint32_t)n : 0;
  size_t done = 0;
  while (done < c->wg_ops.size() && c->wg_ops[done].group < upto) done++;
  if (done == 0) return;
  wl__emu_yield();
  c = &cur->threads[cur->running];
  for (size_t i = 0; i < done; i++) {
    const wg_op &op = c->wg_ops[i];
    wg_acc *acc = acc_of(*c, op.d);
    wgmma_compute(acc->v, op.n, op.da, op.db, op.a_mn, op.b_mn, op.kind);
    reads_add(op, -1);
    if (--acc->refs == 0) {
      memcpy(op.d, acc->v, (size_t)acc->len * sizeof *op.d);
      c->wg_accs.erase(c->wg_accs.begin() + (acc - c->wg_accs.data()));
    }
  }
  c->wg_ops.erase(c->wg_ops.begin(), c->wg_ops.begin() + (long)done);
}

/* ------------------------------------------------------------------------------------------------
 * The runtime. Work runs at the call, so every stream is in order with every other and
 * synchronising is a check of the handle. Misuse a real device would answer with an error or a
 * fault (a copy outside an allocation, a free of something never allocated, a dead stream) prints
 * an "emu:" line as well as returning the error, since callers often ignore what cudaFree
 * returns.
 * ----------------------------------------------------------------------------------------------*/

struct CUstream_st_emu {
  unsigned flags;
};
struct CUmemPoolHandle_st_emu {
  unsigned long long release_threshold;
};

namespace {
std::map<uintptr_t, size_t> allocs; /* base -> bytes, under rt_mu */
size_t used;
CUmemPoolHandle_st_emu default_pool;

/* WAVELET_EMU_DEVICE_MEMORY: bytes, with an optional K, M or G; unset or 0: no limit but the
 * host's. */
size_t capacity() {
  static const size_t cap = [] {
    const char *e = getenv("WAVELET_EMU_DEVICE_MEMORY");
    if (!e || !*e) return (size_t)0;
    char *end;
    unsigned long long v = strtoull(e, &end, 10);
    int shift = *end == 'K' || *end == 'k'   ? 10
                : *end == 'M' || *end == 'm' ? 20
                : *end == 'G' || *end == 'g' ? 30
                                             : 0;
    if (end == e || (shift && end[1]) || (!shift && *end)) {
      fprintf(stderr, "emu: WAVELET_EMU_DEVICE_MEMORY=%s: expected bytes with K, M or G\n", e);
      abort();
    }
    return (size_t)(v << shift);
  }();
  return cap;
}

cudaError_t dev_alloc(void **p, size_t bytes) {
  if (!p) return fail(cudaErrorInvalidValue);
  *p = nullptr;
  if (bytes == 0) return cudaSuccess;
  const size_t sz = (bytes + 255) / 256 * 256;
  std::lock_guard<std::mutex> g(rt_mu);
  if (capacity() && (sz > capacity() || used > capacity() - sz))
    return fail(cudaErrorMemoryAllocation);
  void *q = aligned_alloc(256, sz);
  if (!q) return fail(cudaErrorMemoryAllocation);
  /* A device's new memory holds whatever was there: poison it (0xff bytes, a NaN in every float)
   * so that a kernel that skips elements it should write shows instead of reading zeros. Not
   * when launches are only checked: no kernel writes anything then, and a trainer's NaN loss
   * would stop it before the launches of a whole step are checked. */
  if (!wl__emu_check_only()) memset(q, 0xff, sz);
  allocs[(uintptr_t)q] = sz;
  used += sz;
  *p = q;
  return cudaSuccess;
}

cudaError_t dev_free(void *p, const char *what) {
  if (!p) return cudaSuccess;
  {
    std::lock_guard<std::mutex> g(rt_mu);
    auto it = allocs.find((uintptr_t)p);
    if (it != allocs.end()) {
      used -= it->second;
      allocs.erase(it);
      free(p);
      return cudaSuccess;
    }
  }
  fprintf(stderr, "emu: %s(%p): not a live allocation (freed twice, or never allocated)\n", what,
          p);
  return fail(cudaErrorInvalidValue);
}

/* Whether [p, p + bytes) lies inside one live allocation. */
bool on_device(const void *p, size_t bytes) {
  std::lock_guard<std::mutex> g(rt_mu);
  auto it = allocs.upper_bound((uintptr_t)p);
  if (it == allocs.begin()) return false;
  --it;
  return (uintptr_t)p - it->first <= it->second && bytes <= it->second - ((uintptr_t)p - it->first);
}

cudaError_t stream_check(cudaStream_t st, const char *what) {
  if (stream_ok(st)) return cudaSuccess;
  fprintf(stderr, "emu: %s on stream %p, which is not a live stream\n", what, (void *)st);
  return fail(cudaErrorInvalidResourceHandle);
}

cudaError_t copy(void *dst, const void *src, size_t bytes, enum cudaMemcpyKind kind,
                 const char *what) {
  if (bytes == 0) return cudaSuccess;
  const bool dst_dev = kind == cudaMemcpyHostToDevice || kind == cudaMemcpyDeviceToDevice;
  const bool src_dev = kind == cudaMemcpyDeviceToHost || kind == cudaMemcpyDeviceToDevice;
  if ((unsigned)kind > cudaMemcpyDefault || !dst || !src || (dst_dev && !on_device(dst, bytes)) ||
      (src_dev && !on_device(src, bytes))) {
    fprintf(stderr, "emu: %s(%p <- %p, %zu bytes, kind %d): outside the live allocations\n", what,
            dst, src, bytes, (int)kind);
    return fail(cudaErrorInvalidValue);
  }
  memmove(dst, src, bytes);
  return cudaSuccess;
}

cudaError_t fill(void *p, int value, size_t bytes, const char *what) {
  if (bytes == 0) return cudaSuccess;
  if (!on_device(p, bytes)) {
    fprintf(stderr, "emu: %s(%p, %zu bytes): outside the live allocations\n", what, p, bytes);
    return fail(cudaErrorInvalidValue);
  }
  memset(p, value, bytes);
  return cudaSuccess;
}
} // namespace

extern "C" {

cudaError_t cudaMalloc(void **p, size_t bytes) {
  return dev_alloc(p, bytes);
}
cudaError_t cudaFree(void *p) {
  return dev_free(p, "cudaFree");
}
/* Stream-ordered, and the stream has run everything before: at once. */
cudaError_t cudaMallocAsync(void **p, size_t bytes, cudaStream_t stream) {
  cudaError_t e = stream_check(stream, "cudaMallocAsync");
  return e != cudaSuccess ? e : dev_alloc(p, bytes);
}
cudaError_t cudaFreeAsync(void *p, cudaStream_t stream) {
  cudaError_t e = stream_check(stream, "cudaFreeAsync");
  return e != cudaSuccess ? e : dev_free(p, "cudaFreeAsync");
}
cudaError_t cudaMemcpy(void *dst, const void *src, size_t bytes, enum cudaMemcpyKind kind) {
  return copy(dst, src, bytes, kind, "cudaMemcpy");
}
cudaError_t cudaMemcpyAsync(void *dst, const void *src, size_t bytes, enum cudaMemcpyKind kind,
                            cudaStream_t stream) {
  cudaError_t e = stream_check(stream, "cudaMemcpyAsync");
  return e != cudaSuccess ? e : copy(dst, src, bytes, kind, "cudaMemcpyAsync");
}
cudaError_t cudaMemset(void *p, int value, size_t bytes) {
  return fill(p, value, bytes, "cudaMemset");
}
cudaError_t cudaMemsetAsync(void *p, int value, size_t bytes, cudaStream_t stream) {
  cudaError_t e = stream_check(stream, "cudaMemsetAsync");
  return e != cudaSuccess ? e : fill(p, value, bytes, "cudaMemsetAsync");
}
cudaError_t cudaStreamCreateWithFlags(cudaStream_t *stream, unsigned flags) {
  if (!stream || (flags & ~(unsigned)cudaStreamNonBlocking)) return fail(cudaErrorInvalidValue);
  cudaStream_t s = new CUstream_st_emu{flags};
  std::lock_guard<std::mutex> g(rt_mu);
  streams.insert(s);
  *stream = s;
  return cudaSuccess;
}
cudaError_t cudaStreamDestroy(cudaStream_t stream) {
  {
    std::lock_guard<std::mutex> g(rt_mu);
    if (streams.erase(stream)) {
      delete stream;
      return cudaSuccess;
    }
  }
  fprintf(stderr, "emu: cudaStreamDestroy(%p): not a live stream\n", (void *)stream);
  return fail(cudaErrorInvalidResourceHandle);
}
cudaError_t cudaStreamSynchronize(cudaStream_t stream) {
  return stream_check(stream, "cudaStreamSynchronize");
}
cudaError_t cudaDeviceSynchronize(void) {
  return cudaSuccess;
}
/* As the runtime's: the device's context goes, and with it every allocation, stream and
 * function attribute (a kernel's raised shared-memory limit must be raised again). */
cudaError_t cudaDeviceReset(void) {
  std::lock_guard<std::mutex> g(rt_mu);
  for (auto &a : allocs) free((void *)a.first);
  allocs.clear();
  used = 0;
  for (cudaStream_t st : streams) delete st;
  streams.clear();
  max_dyn_smem.clear();
  default_pool.release_threshold = 0;
  return cudaSuccess;
}
cudaError_t cudaDeviceGetDefaultMemPool(cudaMemPool_t *pool, int dev) {
  if (!pool) return fail(cudaErrorInvalidValue);
  if (dev != 0) return fail(cudaErrorInvalidDevice);
  *pool = &default_pool;
  return cudaSuccess;
}
/* The threshold is kept, and has no effect: freed memory goes back at once. */
cudaError_t cudaMemPoolSetAttribute(cudaMemPool_t pool, enum cudaMemPoolAttr attr, void *value) {
  if (pool != &default_pool || attr != cudaMemPoolAttrReleaseThreshold || !value)
    return fail(cudaErrorInvalidValue);
  memcpy(&pool->release_threshold, value, sizeof pool->release_threshold);
  return cudaSuccess;
}
cudaError_t cudaGetDeviceCount(int *count) {
  *count = 1;
  return cudaSuccess;
}
cudaError_t cudaGetDevice(int *dev) {
  *dev = 0;
  return cudaSuccess;
}
cudaError_t cudaSetDevice(int dev) {
  return dev == 0 ? cudaSuccess : fail(cudaErrorInvalidDevice);
}
cudaError_t cudaGetDeviceProperties(struct cudaDeviceProp *prop, int dev) {
  if (dev != 0) return fail(cudaErrorInvalidDevice);
  memset(prop, 0, sizeof *prop);
  snprintf(prop->name, sizeof prop->name, "host emulation");
  prop->major = 9; /* so that the tensor-core paths run */
  prop->l2CacheSize = 50 << 20;
  return cudaSuccess;
}
static int emu_sms; /* wl__emu_set_sm_count's; 0: the default */

void wl__emu_set_sm_count(int n) {
  __atomic_store_n(&emu_sms, n > 0 ? n : 0, __ATOMIC_RELAXED);
}

cudaError_t cudaDeviceGetAttribute(int *value, enum cudaDeviceAttr attr, int dev) {
  if (dev != 0) return fail(cudaErrorInvalidDevice);
  if (attr == cudaDevAttrMultiProcessorCount) {
    const int n = __atomic_load_n(&emu_sms, __ATOMIC_RELAXED);
    *value = n ? n : wl__emu_check_only() ? 132 : 4;
    return cudaSuccess;
  }
  *value = attr == cudaDevAttrComputeCapabilityMajor ? 9 : 0;
  return cudaSuccess;
}
/* As on sm_90: up to 227 KiB (less the kernel's static shared memory, which the emulation does
 * not know: the kernels assert theirs is small). */
cudaError_t cudaFuncSetAttribute(const void *func, enum cudaFuncAttribute attr, int value) {
  if (!func || attr != cudaFuncAttributeMaxDynamicSharedMemorySize || value < 0 ||
      value > WL__EMU_SMEM_OPTIN)
    return fail(cudaErrorInvalidValue);
  std::lock_guard<std::mutex> g(rt_mu);
  max_dyn_smem[func] = value;
  return cudaSuccess;
}
cudaError_t cudaGetLastError(void) {
  cudaError_t e = last_error;
  last_error = cudaSuccess;
  return e;
}
const char *cudaGetErrorString(cudaError_t err) {
  switch (err) {
  case cudaSuccess:
    return "no error";
  case cudaErrorInvalidValue:
    return "invalid argument";
  case cudaErrorMemoryAllocation:
    return "out of memory";
  case cudaErrorInvalidConfiguration:
    return "invalid configuration argument";
  case cudaErrorInsufficientDriver:
    return "CUDA driver version is insufficient for CUDA runtime version";
  case cudaErrorNoDevice:
    return "no CUDA-capable device is detected";
  case cudaErrorInvalidDevice:
    return "invalid device ordinal";
  case cudaErrorInvalidResourceHandle:
    return "invalid resource handle";
  }
  return "unrecognized error code";
}

} /* extern "C" */
