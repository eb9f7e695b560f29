// The SIMT emulation's scheduler (simt_device.h): a kernel launch, when its stream's work
// runs (simt_streams.h), runs each block's threads as fibers on the calling thread (a stack each, switched by a few instructions: see
// switch_stack; glibc's swapcontext makes a system call per switch). A round runs every
// runnable thread, in a shuffled order, until it finishes or waits; then the waits are settled:
// a warp-wide operation completes when every lane of its mask has arrived (the results
// computed from all the lanes' operands), __syncthreads when every thread of the block that
// has not exited has arrived. A round that settles nothing while threads still wait is a
// deadlock (a barrier or shuffle some threads never reach): the launch fails (reported at
// the next synchronization) naming the block and what each warp waits for.
#include <sys/mman.h>

#include <algorithm>
#include <cstdio>
#include <random>
#include <cstdlib>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "kernels/cast_math.h"
#include "simt_device.h"
#include "simt_state.h"
#include "simt_streams.h"

namespace lattice::simt {

uint3 thread_idx{}, block_idx{};
dim3 block_dim{}, grid_dim{};

namespace {

constexpr size_t kStackBytes = size_t(256) << 10;  // per thread; a guard page below each
constexpr size_t kPageBytes = 4096;

enum class Wait { none, barrier, warp, done };

// switch_stack(&from_sp, to_sp): saves the callee-saved registers, the SSE and x87 control
// words and the stack pointer of the running context in *from_sp, and resumes the context
// saved at to_sp (System V x86-64 ABI: everything else is caller-saved).
extern "C" void lattice_simt_switch_stack(void** from_sp, void* to_sp);
asm(R"(
  .text
  .p2align 4
  .type lattice_simt_switch_stack, @function
lattice_simt_switch_stack:
  pushq %rbp
  pushq %rbx
  pushq %r12
  pushq %r13
  pushq %r14
  pushq %r15
  subq $8, %rsp
  stmxcsr (%rsp)
  fnstcw 4(%rsp)
  movq %rsp, (%rdi)
  movq %rsi, %rsp
  ldmxcsr (%rsp)
  fldcw 4(%rsp)
  addq $8, %rsp
  popq %r15
  popq %r14
  popq %r13
  popq %r12
  popq %rbx
  popq %rbp
  ret
  .size lattice_simt_switch_stack, .-lattice_simt_switch_stack
  .section .note.GNU-stack,"",@progbits
  .text
)");

struct Thread {
  void* sp = nullptr;  // saved stack pointer while switched out
  Wait wait = Wait::none;
  uint3 index{};
  WarpOp op{};
  unsigned mask = 0;
  int arg = 0, width = 32;
  WarpRegs in{}, out{};
};

// Fiber stacks, mapped once and reused by every launch.
class Stacks {
 public:
  char* get(size_t i) {
    while (stacks_.size() <= i) {
      void* p = mmap(nullptr, kStackBytes + kPageBytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
      if (p == MAP_FAILED) {
        std::fprintf(stderr, "SIMT emulation: cannot map a thread stack\n");
        std::abort();
      }
      mprotect(p, kPageBytes, PROT_NONE);  // an overflow faults instead of corrupting
      stacks_.push_back(static_cast<char*>(p) + kPageBytes);
    }
    return stacks_[i];
  }

 private:
  std::vector<char*> stacks_;
};

struct Block {
  std::vector<Thread> threads;
  void* scheduler_sp = nullptr;
  size_t current = 0;
  const std::function<void()>* body = nullptr;
  std::vector<unsigned char> shared;  // dynamic shared memory, + 16 for alignment
  unsigned char* shared_base = nullptr;
  bool trapped = false;
  std::vector<uint32_t> order;  // the threads' order in a round
  std::mt19937 rng;
};

Block* g_block = nullptr;
Stacks g_stacks;

Thread& self() { return g_block->threads[g_block->current]; }

void yield() {
  Block& b = *g_block;
  lattice_simt_switch_stack(&b.threads[b.current].sp, b.scheduler_sp);
}

// A thread's first frame: runs the kernel, then returns to the scheduler for good.
[[noreturn]] void thread_main() {
  (*g_block->body)();
  self().wait = Wait::done;
  yield();
  std::abort();  // a finished thread is never resumed
}

// A new thread's stack: the frame switch_stack pops (control words, six registers) and
// thread_main as its return address, 16-byte aligned as at a function's entry.
void* initial_stack(char* stack_base) {
  auto* top = reinterpret_cast<uint64_t*>(stack_base + kStackBytes);
  uint64_t* sp = top - 1;  // after `ret` pops the address below, rsp % 16 == 8: a function's entry
  *--sp = reinterpret_cast<uint64_t>(&thread_main);
  for (int i = 0; i < 6; ++i) *--sp = 0;  // rbp rbx r12 r13 r14 r15
  uint32_t mxcsr = 0;
  uint16_t fpucw = 0;
  asm volatile("stmxcsr %0" : "=m"(mxcsr));
  asm volatile("fnstcw %0" : "=m"(fpucw));
  *--sp = uint64_t(mxcsr) | uint64_t(fpucw) << 32;
  return sp;
}

float unpack(WarpOp op, uint32_t reg, int half) {
  const uint16_t v = uint16_t(half ? reg >> 16 : reg & 0xffffu);
  return op == WarpOp::mma_bf16 ? math::bf16_to_fp32(v) : math::fp16_to_fp32(v);
}

// lanes[l].out = the op over the 32 lanes' operands (every lane present).
void complete_mma(WarpOp op, Thread* lanes[32]) {
  // A 16x16 row-major: lane 4*(row%8) + (k%8)/2, register (row>=8) + 2*(k>=8), half k%2.
  const auto A = [&](int row, int k) {
    const int lane = 4 * (row % 8) + (k % 8) / 2, reg = (row >= 8 ? 1 : 0) + (k >= 8 ? 2 : 0);
    return unpack(op, lanes[lane]->in.u[reg], k % 2);
  };
  // B 16x8 "col": lane 4*col + (k%8)/2, register 4 + (k>=8), half k%2.
  const auto B = [&](int k, int col) {
    const int lane = 4 * col + (k % 8) / 2, reg = 4 + (k >= 8 ? 1 : 0);
    return unpack(op, lanes[lane]->in.u[reg], k % 2);
  };
  for (int l = 0; l < 32; ++l)
    for (int e = 0; e < 4; ++e) {
      const int row = l / 4 + (e >= 2 ? 8 : 0), col = 2 * (l % 4) + (e & 1);
      float acc = 0.0f;
      for (int k = 0; k < 16; ++k) acc += A(row, k) * B(k, col);
      lanes[l]->out.f[e] = acc;
    }
}

// The source lane of a shuffle for `lane`, or lane itself where CUDA returns the caller's
// own value (outside its width segment).
int shuffle_source(WarpOp op, int lane, int arg, int width) {
  const int base = lane / width * width, pos = lane % width;
  switch (op) {
    case WarpOp::shfl_idx: return base + ((arg % width) + width) % width;
    case WarpOp::shfl_xor: {
      const int src = lane ^ arg;
      return src < base + width ? src : lane;
    }
    case WarpOp::shfl_down: return pos + arg < width ? lane + arg : lane;
    case WarpOp::shfl_up: return pos - arg >= 0 ? lane - arg : lane;
    default: return lane;
  }
}

const char* op_name(WarpOp op) {
  switch (op) {
    case WarpOp::shfl_idx: return "__shfl_sync";
    case WarpOp::shfl_xor: return "__shfl_xor_sync";
    case WarpOp::shfl_down: return "__shfl_down_sync";
    case WarpOp::shfl_up: return "__shfl_up_sync";
    case WarpOp::vote_any: return "__any_sync";
    case WarpOp::vote_all: return "__all_sync";
    case WarpOp::ballot: return "__ballot_sync";
    case WarpOp::mma_bf16: return "mma.m16n8k16.bf16";
    case WarpOp::mma_fp16: return "mma.m16n8k16.f16";
  }
  return "?";
}

std::string where(const Block& b) {
  std::ostringstream o;
  o << "block (" << block_idx.x << "," << block_idx.y << "," << block_idx.z << ") of a " << block_dim.x << "x"
    << block_dim.y << "x" << block_dim.z << " block";
  return o.str();
}

// Settles the warps whose lanes all wait at the same warp operation. Returns false with
// `error` set on a malformed operation (a lane of the mask exited or waits elsewhere).
bool settle_warps(Block& b, bool& progressed, std::string& error) {
  const size_t n = b.threads.size();
  for (size_t w = 0; w * 32 < n; ++w) {
    Thread* lanes[32] = {};
    const Thread* first = nullptr;
    for (size_t l = 0; l < 32 && w * 32 + l < n; ++l) {
      lanes[l] = &b.threads[w * 32 + l];
      if (!first && lanes[l]->wait == Wait::warp) first = lanes[l];
    }
    if (!first) continue;
    bool ready = true;
    for (int l = 0; l < 32; ++l) {
      if (!(first->mask >> l & 1u)) continue;
      const Thread* t = lanes[l];
      if (!t || t->wait == Wait::done) {
        error = std::string(op_name(first->op)) + " in warp " + std::to_string(w) + " names lane " +
                std::to_string(l) + ", which " + (t ? "has exited" : "does not exist");
        return false;
      }
      if (t->wait == Wait::barrier) ready = false;  // settles after the barrier, or deadlocks
      if (t->wait == Wait::warp && (t->op != first->op || t->mask != first->mask)) {
        error = "warp " + std::to_string(w) + ": lanes wait at different warp operations (" + op_name(first->op) +
                " and " + op_name(t->op) + ", or different masks)";
        return false;
      }
    }
    if (!ready) continue;
    if (first->op == WarpOp::mma_bf16 || first->op == WarpOp::mma_fp16) {
      if (first->mask != 0xffffffffu) {
        error = "mma.m16n8k16 needs the whole warp";
        return false;
      }
      complete_mma(first->op, lanes);
    } else if (first->op == WarpOp::vote_any || first->op == WarpOp::vote_all || first->op == WarpOp::ballot) {
      uint32_t ballot = 0;
      for (int l = 0; l < 32; ++l)
        if ((first->mask >> l & 1u) && lanes[l]->in.u[0]) ballot |= 1u << l;
      const uint32_t result = first->op == WarpOp::ballot     ? ballot
                              : first->op == WarpOp::vote_any ? uint32_t(ballot != 0)
                                                              : uint32_t(ballot == first->mask);
      for (int l = 0; l < 32; ++l)
        if (first->mask >> l & 1u) {
          lanes[l]->out = WarpRegs{};
          lanes[l]->out.u[0] = result;
        }
    } else {
      for (int l = 0; l < 32; ++l) {
        if (!(first->mask >> l & 1u)) continue;
        const int src = shuffle_source(first->op, l, lanes[l]->arg, lanes[l]->width);
        // A source lane outside the mask gives an undefined value: its own operands if it
        // waits here too, else the caller's (a NaN pattern would be stricter; none of the
        // kernels shuffles with a partial mask).
        const Thread* s = (first->mask >> src & 1u) ? lanes[src] : lanes[l];
        lanes[l]->out = WarpRegs{};
        lanes[l]->out.u[0] = s->in.u[0];
        lanes[l]->out.u[1] = s->in.u[1];
      }
    }
    for (int l = 0; l < 32; ++l)
      if (first->mask >> l & 1u) lanes[l]->wait = Wait::none;
    progressed = true;
  }
  return true;
}

std::string describe_waits(const Block& b) {
  std::ostringstream o;
  const size_t n = b.threads.size();
  for (size_t w = 0; w * 32 < n; ++w) {
    int barrier = 0, warp = 0, done = 0;
    for (size_t t = w * 32; t < n && t < w * 32 + 32; ++t) {
      const Wait s = b.threads[t].wait;
      barrier += s == Wait::barrier;
      warp += s == Wait::warp;
      done += s == Wait::done;
    }
    o << " warp " << w << ": " << barrier << " at __syncthreads, " << warp << " at a warp operation, " << done
      << " exited;";
  }
  return o.str();
}

// Runs one block to completion; returns an error text, empty on success.
std::string run_block(Block& b) {
  const size_t n = b.threads.size();
  for (size_t t = 0; t < n; ++t) {
    Thread& th = b.threads[t];
    th = Thread{};
    th.index = uint3{unsigned(t % block_dim.x), unsigned(t / block_dim.x % block_dim.y),
                     unsigned(t / (size_t(block_dim.x) * block_dim.y))};
    th.sp = initial_stack(g_stacks.get(t));
  }
  // Uninitialized shared memory reads as NaN.
  std::memset(b.shared.data(), 0xff, b.shared.size());
  for (;;) {
    bool ran = false;
    // Each round runs the threads in a new (seeded, reproducible) order, so a kernel that
    // relies on one thread running before another without a barrier between them reads
    // data not yet written (NaN in fresh shared memory) in some round.
    std::shuffle(b.order.begin(), b.order.end(), b.rng);
    for (const uint32_t t : b.order) {
      if (b.threads[t].wait != Wait::none) continue;
      b.current = t;
      thread_idx = b.threads[t].index;
      ran = true;
      lattice_simt_switch_stack(&b.scheduler_sp, b.threads[t].sp);
      if (b.trapped) return "__trap() in thread " + std::to_string(t);
    }
    bool progressed = ran;
    std::string error;
    if (!settle_warps(b, progressed, error)) return error;
    size_t barrier = 0, done = 0, warp = 0;
    for (const Thread& t : b.threads) {
      barrier += t.wait == Wait::barrier;
      done += t.wait == Wait::done;
      warp += t.wait == Wait::warp;
    }
    if (done == n) return "";
    if (warp == 0 && barrier + done == n) {
      for (Thread& t : b.threads)
        if (t.wait == Wait::barrier) t.wait = Wait::none;
      continue;
    }
    if (!progressed) return "deadlock:" + describe_waits(b);
  }
}

}  // namespace

unsigned char* dynamic_shared() { return g_block->shared_base; }

void syncthreads() {
  self().wait = Wait::barrier;
  yield();
}

WarpRegs warp_op(WarpOp op, unsigned mask, int arg, int width, const WarpRegs& mine) {
  Thread& t = self();
  t.wait = Wait::warp;
  t.op = op;
  t.mask = mask;
  t.arg = arg;
  t.width = width;
  t.in = mine;
  yield();
  return self().out;
}

namespace {

// Runs every block of a launch (its configuration already checked), a block at a time;
// a block's failure fails the launch.
void run_grid(const void* kernel, dim3 grid, dim3 block, size_t shared_bytes, const std::function<void()>& body) {
  const uint64_t threads = uint64_t(block.x) * block.y * block.z;
  std::string error;
  Block b;
  b.threads.resize(threads);
  b.order.resize(threads);
  for (uint32_t t = 0; t < threads; ++t) b.order[t] = t;
  static uint32_t launches = 0;
  b.rng.seed(++launches);
  b.body = &body;
  b.shared.resize(shared_bytes + 16);
  b.shared_base = b.shared.data() + (16 - reinterpret_cast<uintptr_t>(b.shared.data()) % 16) % 16;
  Block* outer = g_block;
  g_block = &b;
  block_dim = block;
  grid_dim = grid;
  for (unsigned z = 0; z < grid.z && error.empty(); ++z)
    for (unsigned y = 0; y < grid.y && error.empty(); ++y)
      for (unsigned x = 0; x < grid.x && error.empty(); ++x) {
        block_idx = uint3{x, y, z};
        error = run_block(b);
        if (!error.empty()) error = kernel_name(kernel) + ": " + where(b) + ": " + error;
      }
  g_block = outer;
  if (!error.empty()) record_launch_error(cudaErrorLaunchFailure, error);
}

}  // namespace

void trap() {
  g_block->trapped = true;
  yield();
  std::abort();  // never resumed
}

void launch(const void* kernel, dim3 grid, dim3 block, size_t shared_bytes, cudaStream_t stream,
            std::function<void()> body) {
  const std::string error = launch_config_error(kernel, grid, block, shared_bytes);
  if (!error.empty()) {
    record_launch_error(cudaErrorInvalidConfiguration, error);
    return;
  }
  enqueue(stream, [=] { run_grid(kernel, grid, block, shared_bytes, body); });
}

}  // namespace lattice::simt
