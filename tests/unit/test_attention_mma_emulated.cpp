// The tensor-core flash attention's kernels (kernels/cuda/attention_mma_kernels.cuh) run
// on the CPU, without a GPU: each block's 128 threads are host threads, __syncthreads a
// barrier of the block, and the warp-wide operations (__shfl_xor_sync, mma.m16n8k16) a
// barrier of the warp's 32 threads whose completion step computes every lane's result
// from the lanes' registers. The software mma reads its operands by the PTX ISA's
// fragment layout of mma.m16n8k16 (A row-major 16x16, B "col" 16x8, C 16x8 fp32, two
// 16-bit values per register, lower index in the low half), so what is checked here is
// the kernels' own logic: tiling, fragment indexing, masks, the online softmax, dropout,
// the three backward kernels and every element written. What only a GPU can check (the
// PTX mma.sync itself, shared-memory limits, speed) is in tests/cuda/test_cuda_attention.cpp.
//
// Reference and tolerance as there: the CPU's fp32 attention on q, k, v, dO rounded to
// the format; the kernels round P and dS besides, a relative error of at most u per term,
// so each tensor's relative (Frobenius) error is bounded by 2u, lse by 1e-5.
#include <gtest/gtest.h>

#if LATTICE_WITH_CUDA

#include <algorithm>
#include <atomic>
#include <barrier>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <functional>
#include <memory>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "../attention_test_data.h"
#include "kernels/attention.h"
#include "kernels/cast_math.h"

// ---------------------------------------------------------------------------------------
// The SIMT emulation: the CUDA built-ins the kernels use.
namespace emu {

struct Dim3 {
  unsigned x = 0, y = 0, z = 0;
};

enum class Op { shfl_xor, mma_bf16, mma_fp16 };

// One lane's registers for a warp-wide operation.
struct Slot {
  uint32_t u[6];
  float f[4];
};

float unpack(Op op, uint32_t reg, int half) {
  const uint16_t v = uint16_t(half ? reg >> 16 : reg & 0xffffu);
  return op == Op::mma_bf16 ? lattice::math::bf16_to_fp32(v) : lattice::math::fp16_to_fp32(v);
}

// out[l].f[e] = sum_k A[row][k] B[k][col] for lane l's C elements e, where A and B are
// gathered from the lanes' registers by the m16n8k16 fragment layout.
void software_mma(Op op, const Slot (&in)[32], Slot (&out)[32]) {
  const auto A = [&](int row, int k) {
    const int lane = 4 * (row % 8) + (k % 8) / 2, reg = (row >= 8 ? 1 : 0) + (k >= 8 ? 2 : 0);
    return unpack(op, in[lane].u[reg], k % 2);
  };
  const auto B = [&](int k, int col) {
    const int lane = 4 * col + (k % 8) / 2, reg = 4 + (k >= 8 ? 1 : 0);
    return unpack(op, in[lane].u[reg], k % 2);
  };
  for (int l = 0; l < 32; ++l)
    for (int e = 0; e < 4; ++e) {
      const int row = l / 4 + (e >= 2 ? 8 : 0), col = 2 * (l % 4) + (e & 1);
      float acc = 0.0f;
      for (int k = 0; k < 16; ++k) acc += A(row, k) * B(k, col);
      out[l].f[e] = acc;
    }
}

class Warp {
 public:
  Warp() : bar_(32, Done{this}) {}
  // Every lane calls it with the same op and arg; returns this lane's result slot.
  Slot run(int lane, unsigned& phase, Op op, int arg, const Slot& mine) {
    const unsigned buf = phase++ & 1u;
    in_[buf][lane] = mine;
    if (lane == 0) {
      op_[buf] = op;
      arg_[buf] = arg;
    }
    bar_.arrive_and_wait();
    return out_[buf][lane];
  }

 private:
  struct Done {
    Warp* w;
    void operator()() noexcept { w->complete(); }
  };
  void complete() {
    const unsigned b = cur_;
    cur_ ^= 1u;
    if (op_[b] == Op::shfl_xor) {
      for (int l = 0; l < 32; ++l) out_[b][l] = in_[b][l ^ arg_[b]];
    } else {
      software_mma(op_[b], in_[b], out_[b]);
    }
  }
  std::barrier<Done> bar_;
  unsigned cur_ = 0;
  Op op_[2] = {Op::shfl_xor, Op::shfl_xor};
  int arg_[2] = {0, 0};
  Slot in_[2][32] = {}, out_[2][32] = {};
};

struct Block {
  explicit Block(size_t smem_bytes) : sync(128), smem(smem_bytes + 16) {
    for (auto& w : warps) w = std::make_unique<Warp>();
  }
  std::barrier<> sync;
  std::vector<unsigned char> smem;
  std::unique_ptr<Warp> warps[4];
  unsigned char* shared() { return smem.data() + (16 - reinterpret_cast<uintptr_t>(smem.data()) % 16) % 16; }
};

struct Lane {
  Block* block;
  Warp* warp;
  int lane;
  unsigned phase = 0;
};
inline thread_local Lane* self = nullptr;

// Runs body() as every thread of a (gx, gy) grid of 128-thread blocks, a block at a time.
template <typename Body>
void launch(unsigned gx, unsigned gy, size_t smem_bytes, Body body);

Slot warp_op(Op op, int arg, const Slot& mine) { return self->warp->run(self->lane, self->phase, op, arg, mine); }

}  // namespace emu

inline thread_local emu::Dim3 threadIdx, blockIdx;

inline void __syncthreads() { emu::self->block->sync.arrive_and_wait(); }

template <typename T>
T __shfl_xor_sync(unsigned, T v, int lane_mask) {
  static_assert(sizeof(T) == 4);
  emu::Slot s{};
  std::memcpy(&s.u[0], &v, 4);
  const emu::Slot r = emu::warp_op(emu::Op::shfl_xor, lane_mask, s);
  T out;
  std::memcpy(&out, &r.u[0], 4);
  return out;
}

#define __launch_bounds__(...)
#define LATTICE_DYNAMIC_SMEM(name) unsigned char* name = ::emu::self->block->shared()

#include "kernels/cuda/attention_mma_kernels.cuh"

template <typename Body>
void emu::launch(unsigned gx, unsigned gy, size_t smem_bytes, Body body) {
  for (unsigned by = 0; by < gy; ++by)
    for (unsigned bx = 0; bx < gx; ++bx) {
      Block block(smem_bytes);
      std::vector<std::thread> threads;
      threads.reserve(128);
      for (unsigned t = 0; t < 128; ++t)
        threads.emplace_back([&, t] {
          Lane me{&block, block.warps[t / 32].get(), int(t % 32)};
          self = &me;
          threadIdx = Dim3{t, 0, 0};
          blockIdx = Dim3{bx, by, 0};
          body();
        });
      for (auto& th : threads) th.join();
    }
}

namespace lattice {
namespace {

using namespace cuda::attention_detail;
using namespace cuda::attention_mma_detail;
using namespace attention_test;

// The operand formats of attention_mma.cu, with the software mma.
template <emu::Op kOp>
struct EmuFormat {
  static float round(float x) {
    return kOp == emu::Op::mma_bf16 ? math::round_bf16(x) : math::fp16_to_fp32(math::fp32_to_fp16(x));
  }
  static uint16_t bits(float x) { return kOp == emu::Op::mma_bf16 ? math::fp32_to_bf16(x) : math::fp32_to_fp16(x); }
  static uint32_t pack(float lo, float hi) { return uint32_t(bits(lo)) | uint32_t(bits(hi)) << 16; }
  static void mma(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
    emu::Slot s{};
    for (int i = 0; i < 4; ++i) s.u[i] = a[i];
    s.u[4] = b0;
    s.u[5] = b1;
    const emu::Slot r = emu::warp_op(kOp, 0, s);
    for (int e = 0; e < 4; ++e) d[e] += r.f[e];
  }
};
using EmuBf16 = EmuFormat<emu::Op::mma_bf16>;
using EmuFp16 = EmuFormat<emu::Op::mma_fp16>;

unsigned tiles(int64_t T, int rows) { return unsigned((T + rows - 1) / rows); }

// attention_mma.cu's launches, on the emulation.
template <typename F, int D>
void forward(float* out, float* lse, const float* qkv, const Params& p) {
  emu::launch(tiles(p.T, kFwdRows), unsigned(p.B * p.H), forward_smem<D>(),
              [&] { mma_forward_kernel<F, D>(out, lse, qkv, p); });
}

template <typename F, int D>
void backward(float* dqkv, const float* dout, const float* qkv, const float* out, const float* lse,
              const Params& p) {
  std::vector<float> di(size_t(p.B * p.H * p.T));
  emu::launch(unsigned((di.size() + kWarps - 1) / kWarps), 1, 0,
              [&] { row_dot_kernel<F>(di.data(), dout, out, p); });
  emu::launch(tiles(p.T, kKvKeys), unsigned(p.B * p.H), dkv_smem<D>(),
              [&] { mma_backward_dkv_kernel<F, D>(dqkv, dout, qkv, lse, di.data(), p); });
  emu::launch(tiles(p.T, kDqRows), unsigned(p.B * p.H), dq_smem<D>(),
              [&] { mma_backward_dq_kernel<F, D>(dqkv, dout, qkv, lse, di.data(), p); });
}

struct Case {
  int64_t B, T, H, D;
  bool dropout, docs, fp16;
};

std::string name_of(const ::testing::TestParamInfo<Case>& info) {
  const Case& c = info.param;
  std::ostringstream os;
  os << (c.fp16 ? "fp16" : "bf16") << "_B" << c.B << "_T" << c.T << "_H" << c.H << "_D" << c.D
     << (c.dropout ? "_dropout" : "") << (c.docs ? "_docs" : "");
  return os.str();
}

class AttentionMmaEmulated : public ::testing::TestWithParam<Case> {};

TEST_P(AttentionMmaEmulated, ForwardAndBackwardMatchRoundedCpu) {
  const Case c = GetParam();
  const AttentionShape s{c.B, c.T, c.H, c.D};
  AttentionDropout drop;
  if (c.dropout) drop = tensor_parallel_rank1_dropout(c.H);
  const std::vector<int32_t> docs = c.docs ? document_ids(c.B, c.T, 5) : std::vector<int32_t>();
  const int32_t* doc = docs.empty() ? nullptr : docs.data();
  const double u = c.fp16 ? 1.0 / 2048 : 1.0 / 256;

  const size_t n_qkv = size_t(c.B * c.T * c.H * 3 * c.D), n_out = size_t(c.B * c.T * c.H * c.D);
  const size_t n_lse = size_t(c.B * c.H * c.T);
  const auto qkv = random_floats(n_qkv, 21, -1.5f, 1.5f);
  const auto dout = random_floats(n_out, 22, -1.0f, 1.0f);
  const RoundedReference ref = rounded_reference(qkv, dout, s, drop, doc, c.fp16);
  const std::vector<float>&out = ref.out, &lse = ref.lse;

  // The kernels, outputs starting as NaN so an element left unwritten fails.
  const Params p = make_params(s, drop, doc);
  std::vector<float> e_out(n_out, NAN), e_lse(n_lse, NAN), e_dqkv(n_qkv, NAN);
  if (c.fp16) {
    if (c.D == 64) {
      forward<EmuFp16, 64>(e_out.data(), e_lse.data(), qkv.data(), p);
      backward<EmuFp16, 64>(e_dqkv.data(), dout.data(), qkv.data(), out.data(), lse.data(), p);
    } else {
      forward<EmuFp16, 128>(e_out.data(), e_lse.data(), qkv.data(), p);
      backward<EmuFp16, 128>(e_dqkv.data(), dout.data(), qkv.data(), out.data(), lse.data(), p);
    }
  } else {
    if (c.D == 64) {
      forward<EmuBf16, 64>(e_out.data(), e_lse.data(), qkv.data(), p);
      backward<EmuBf16, 64>(e_dqkv.data(), dout.data(), qkv.data(), out.data(), lse.data(), p);
    } else {
      forward<EmuBf16, 128>(e_out.data(), e_lse.data(), qkv.data(), p);
      backward<EmuBf16, 128>(e_dqkv.data(), dout.data(), qkv.data(), out.data(), lse.data(), p);
    }
  }

  const Errors e = errors(e_out, e_dqkv, ref, c.D);
  const double r_out = e.out, r_dq = e.dq, r_dk = e.dk, r_dv = e.dv;
  std::printf("[ info ] emulated tensor-core attention %s: relative error out %.2e dq %.2e dk %.2e dv %.2e "
              "(bound %.2e)\n",
              name_of({c, 0}).c_str(), r_out, r_dq, r_dk, r_dv, 2 * u);
  EXPECT_LE(r_out, 2 * u) << "out";
  EXPECT_LE(r_dq, 2 * u) << "dq";
  EXPECT_LE(r_dk, 2 * u) << "dk";
  EXPECT_LE(r_dv, 2 * u) << "dv";
  double lse_err = 0.0;
  for (size_t k = 0; k < n_lse; ++k) lse_err = std::max(lse_err, std::fabs(double(e_lse[k]) - lse[k]) / (1.0 + std::fabs(lse[k])));
  EXPECT_LE(lse_err, 1e-5) << "lse";
  EXPECT_EQ(std::count_if(e_out.begin(), e_out.end(), [](float x) { return std::isnan(x); }), 0) << "out unwritten";
  EXPECT_EQ(std::count_if(e_dqkv.begin(), e_dqkv.end(), [](float x) { return std::isnan(x); }), 0)
      << "dqkv unwritten";
}

INSTANTIATE_TEST_SUITE_P(
    Shapes, AttentionMmaEmulated,
    ::testing::Values(Case{2, 37, 2, 64, false, false, false},   // one ragged tile, two batch rows
                      Case{1, 130, 1, 64, false, false, false},  // three query tiles, the last of 2 rows
                      Case{1, 130, 1, 64, true, false, false},   // dropout (tensor-parallel head numbering)
                      Case{1, 100, 1, 64, false, true, false},   // document masks
                      Case{1, 100, 1, 64, true, true, true},     // fp16, documents and dropout
                      Case{1, 70, 1, 128, false, false, false},  // D = 128
                      Case{1, 70, 1, 128, true, true, true}),    // D = 128, fp16, everything
    name_of);

// The software mma itself against a plain product (so the tests above check the kernels,
// not the emulation): a 16x16 A and 16x8 B of distinct values, distributed to the lanes'
// registers by the layout, multiplied.
TEST(AttentionMmaEmulation, SoftwareMmaIsTheMatrixProduct) {
  float A[16][16], B[16][8];
  for (int r = 0; r < 16; ++r)
    for (int k = 0; k < 16; ++k) A[r][k] = float((r * 16 + k) % 13 - 6);
  for (int k = 0; k < 16; ++k)
    for (int n = 0; n < 8; ++n) B[k][n] = float((k * 8 + n) % 11 - 5);
  emu::Slot in[32] = {}, out[32] = {};
  const auto bits = [](float x) { return uint32_t(math::fp32_to_bf16(x)); };
  for (int l = 0; l < 32; ++l) {
    const int g = l / 4, q = l % 4;
    in[l].u[0] = bits(A[g][2 * q]) | bits(A[g][2 * q + 1]) << 16;
    in[l].u[1] = bits(A[g + 8][2 * q]) | bits(A[g + 8][2 * q + 1]) << 16;
    in[l].u[2] = bits(A[g][2 * q + 8]) | bits(A[g][2 * q + 9]) << 16;
    in[l].u[3] = bits(A[g + 8][2 * q + 8]) | bits(A[g + 8][2 * q + 9]) << 16;
    in[l].u[4] = bits(B[2 * q][g]) | bits(B[2 * q + 1][g]) << 16;
    in[l].u[5] = bits(B[2 * q + 8][g]) | bits(B[2 * q + 9][g]) << 16;
  }
  emu::software_mma(emu::Op::mma_bf16, in, out);
  for (int l = 0; l < 32; ++l)
    for (int e = 0; e < 4; ++e) {
      const int row = l / 4 + (e >= 2 ? 8 : 0), col = 2 * (l % 4) + (e & 1);
      float want = 0.0f;
      for (int k = 0; k < 16; ++k) want += A[row][k] * B[k][col];
      EXPECT_EQ(out[l].f[e], want) << "lane " << l << " element " << e;
    }
}

}  // namespace
}  // namespace lattice

#else

TEST(AttentionMmaEmulated, NeedsTheCudaBackend) { GTEST_SKIP() << "built without the CUDA backend"; }

#endif
