/* The host emulation of CUDA for the kernel tests: block threads, barriers, warp exchanges, the
 * mma.sync fragment layouts, and the runtime calls (device memory is host memory). */
#include <ucontext.h>
#include <stdio.h>
#include <stdlib.h>

#include <map>
#include <mutex>
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

struct coro {
#if defined(__x86_64__)
  void *sp;
#else
  ucontext_t ctx;
#endif
  int state;
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

void wl__emu_launch_fn(dim3 grid, dim3 block, const std::function<void()> &body) {
  const unsigned nt = block.x * block.y * block.z;
  if (nt == 0 || nt > 1024 || nt % 32 != 0) {
    fprintf(stderr, "emu: unsupported block of %u threads\n", nt);
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
alignas(1024) unsigned char smem_arena[256 * 1024];
struct mbar {
  uint32_t expected, pending, phase;
  int64_t tx;
};
std::map<uint32_t, mbar> mbars;

void mbar_check(mbar &b) {
  if (b.pending == 0 && b.tx == 0) b.phase++, b.pending = b.expected;
}

/* Swizzle<3,4,3>: the 16-byte chunk (address bits 4-6) XOR the 128-byte row in its 1024-byte atom
 * (bits 7-9). */
uint32_t swz128(uint32_t a) {
  return a ^ (((a >> 7) & 7u) << 4);
}

float bf16_at(uint32_t addr) {
  if (addr + 2 > sizeof smem_arena) {
    fprintf(stderr, "emu: wgmma reads past shared memory (%u)\n", addr);
    abort();
  }
  uint16_t h;
  memcpy(&h, smem_arena + addr, 2);
  uint32_t u = (uint32_t)h << 16;
  float f;
  memcpy(&f, &u, 4);
  return f;
}

/* Element (mn, k) of a 128-byte-swizzled operand: K-major ((8,m),(T,2k)):((8T,SBO),(1,T)), MN-major
 * ((T,8,m),(8,k)):((1,T,LBO),(8T,SBO)) (CUTLASS's names for the PTX ISA's canonical layouts). */
float operand(uint64_t desc, bool mn_major, int mn, int k) {
  const uint32_t start = (uint32_t)(desc & 0x3fff) << 4;
  const uint32_t lbo = (uint32_t)((desc >> 16) & 0x3fff) << 4;
  const uint32_t sbo = (uint32_t)((desc >> 32) & 0x3fff) << 4;
  if ((desc >> 62) != 1) {
    fprintf(stderr, "emu: wgmma descriptor without the 128-byte swizzle\n");
    abort();
  }
  uint32_t a;
  if (mn_major)
    a = start + (uint32_t)(mn / 64) * lbo + (uint32_t)(mn % 64) * 2 + (uint32_t)(k / 8) * sbo +
        (uint32_t)(k % 8) * 128;
  else
    a = start + (uint32_t)(mn / 8) * sbo + (uint32_t)(mn % 8) * 128 + (uint32_t)k * 2;
  return bf16_at(swz128(a));
}
} // namespace

unsigned char *wl__emu_smem(void) {
  return smem_arena;
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
  if (dst % 1024 != 0 || dst + 8192 > sizeof smem_arena) {
    fprintf(stderr, "emu: TMA box at shared offset %u (1024-aligned, inside the arena)\n", dst);
    abort();
  }
  for (int r = 0; r < 64; r++)
    for (int c = 0; c < 64; c++) {
      const long long gi = (long long)c0 + c, go = (long long)c1 + r;
      uint16_t v = 0;
      if (gi >= 0 && go >= 0 && (uint64_t)gi < map->dims[0] && (uint64_t)go < map->dims[1])
        memcpy(&v, (const unsigned char *)map->p + (uint64_t)go * map->stride + (uint64_t)gi * 2,
               2);
      memcpy(smem_arena + swz128(dst + (uint32_t)(r * 128 + c * 2)), &v, 2);
    }
  mbar &b = mbars.at(bar);
  b.tx -= 8192;
  mbar_check(b);
}

/* The calling thread's part of wgmma m64nNk16: d holds N/2 accumulators, d[4j + 2h + e] at row
 * 16 warp + lane/4 + 8h, column 8j + 2 (lane%4) + e, for its warp within the warpgroup. */
void wl__emu_wgmma(float *d, int n, uint64_t da, uint64_t db, bool a_mn, bool b_mn) {
  const int t = cur->running % 128, warp = t / 32, lane = t % 32;
  for (int i = 0; i < n / 2; i++) {
    const int row = warp * 16 + lane / 4 + 8 * ((i / 2) % 2);
    const int col = (i / 4) * 8 + (lane % 4) * 2 + (i % 2);
    float s = d[i];
    for (int k = 0; k < 16; k++) s += operand(da, a_mn, row, k) * operand(db, b_mn, col, k);
    d[i] = s;
  }
}

/* ------------------------------------------------------------------------------------------------
 * The runtime
 * ----------------------------------------------------------------------------------------------*/

extern "C" {

cudaError_t cudaMalloc(void **p, size_t bytes) {
  *p = aligned_alloc(256, (bytes + 255) / 256 * 256);
  return *p ? cudaSuccess : cudaErrorMemoryAllocation;
}
cudaError_t cudaFree(void *p) {
  free(p);
  return cudaSuccess;
}
cudaError_t cudaMemcpy(void *dst, const void *src, size_t bytes, enum cudaMemcpyKind) {
  memmove(dst, src, bytes);
  return cudaSuccess;
}
cudaError_t cudaMemset(void *p, int value, size_t bytes) {
  memset(p, value, bytes);
  return cudaSuccess;
}
cudaError_t cudaMemsetAsync(void *p, int value, size_t bytes, cudaStream_t) {
  memset(p, value, bytes);
  return cudaSuccess;
}
cudaError_t cudaDeviceSynchronize(void) {
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
cudaError_t cudaGetDeviceProperties(struct cudaDeviceProp *prop, int) {
  memset(prop, 0, sizeof *prop);
  snprintf(prop->name, sizeof prop->name, "host emulation");
  prop->major = 9; /* so that the tensor-core paths run */
  prop->l2CacheSize = 50 << 20;
  return cudaSuccess;
}
cudaError_t cudaDeviceGetAttribute(int *value, enum cudaDeviceAttr attr, int) {
  *value = attr == cudaDevAttrComputeCapabilityMajor ? 9 : 0;
  return cudaSuccess;
}
cudaError_t cudaGetLastError(void) {
  return cudaSuccess;
}
const char *cudaGetErrorString(cudaError_t err) {
  return err == cudaSuccess ? "no error" : "emulated error";
}

} /* extern "C" */
