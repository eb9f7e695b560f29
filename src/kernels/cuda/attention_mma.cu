// Causal flash attention on tensor cores (AttentionMath::bf16 / fp16), FlashAttention-2's
// arithmetic: the two products of every tile run as warp-level mma.sync m16n8k16 with
// bf16 (fp16) operands and fp32 accumulation; q, k, v, dO, the probabilities P and the
// score gradients dS are rounded to bf16 (fp16) where they enter a product; the softmax
// statistics, the output and every gradient are accumulated in fp32. Masks (causal,
// documents) and dropout are kernels/attention.h's, drawn from the same Philox indices as
// the CPU and the fp32 kernels.
//
// Fragments of mma.m16n8k16 (PTX ISA), with g = lane / 4 and q = lane % 4:
//   A (16 x 16, row-major)  reg0 (row g,   k 2q..2q+1)   reg1 (row g+8, k 2q..2q+1)
//                           reg2 (row g,   k 2q+8..+9)   reg3 (row g+8, k 2q+8..+9)
//   B (16 x 8, "col")       reg0 (k 2q..2q+1, col g)     reg1 (k 2q+8..+9, col g)
//   C (16 x 8, fp32)        c0,c1 (row g, col 2q, 2q+1)  c2,c3 (row g+8, col 2q, 2q+1)
// (each .b32 register holds two 16-bit values, the lower index in the low half). The C
// fragments of two adjacent n-tiles are, packed to 16 bits, the A fragment of the next
// product over the same 16 columns: S = Q K^T feeds P V (and dS feeds dS K) without a
// trip through shared memory. Operands sit in shared memory as 16-bit values with rows
// padded by 8 elements, so the 8 rows x 4 pairs a fragment load touches hit 32 banks.
//
//   forward      block = (64 query rows, b*H+h), warp w = rows 16w..16w+15; loops over
//                key tiles of 64 up to the diagonal (online softmax in the log2 domain).
//   backward dKV block = (64 keys, b*H+h), warp w = keys 16w..; loops over query tiles
//                of 32 from the diagonal on; S^T = K Q^T, dP^T = V dO^T, then
//                dV += P^T dO and dK += dS^T Q.
//   backward dQ  block = (64 query rows, b*H+h); loops over key tiles of 32 up to the
//                diagonal; dQ += dS K.
//   D_i = dO_i . O_i comes from a small kernel first (fp32, one warp per row).
// Every output element has one owner and a fixed order of sums: results are the same run
// to run. Head dims 64 and 128; attention.cu falls back to its fp32 kernels otherwise.
//
// The kernels are in attention_mma_kernels.cuh, templated on the operand format; this
// file gives them the PTX mma.sync and launches them. Under the SIMT emulation (tests/simt/)
// the same kernels run on the CPU, with a software mma by the layout above.
#include "kernels/cuda/attention_mma.h"

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cmath>
#include <cstdint>

#include "kernels/cuda/attention_common.cuh"
#include "kernels/cuda/attention_mma_kernels.cuh"
#include "kernels/cuda/launch.cuh"
#include "kernels/cuda/ops_reduce.cuh"

namespace lattice::cuda {

namespace {

using namespace attention_detail;
using namespace attention_mma_detail;

// ---------------------------------------------------------------------------------------
// The 16-bit operand formats: bf16 (kFp16 false) or fp16.
#define LATTICE_MMA_M16N8K16(type)                                                                   \
  asm volatile("mma.sync.aligned.m16n8k16.row.col.f32." type "." type ".f32 {%0,%1,%2,%3}, "          \
               "{%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"                                            \
               : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])                                      \
               : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1))

template <bool kFp16>
struct Half16 {
  __device__ static float round(float x) {
    if constexpr (kFp16) return __half2float(__float2half_rn(x));
    else return __bfloat162float(__float2bfloat16_rn(x));
  }
  __device__ static uint32_t pack(float lo, float hi) {
    uint32_t bits;
    if constexpr (kFp16) {
      const __half2 v = __floats2half2_rn(lo, hi);
      memcpy(&bits, &v, sizeof bits);
    } else {
      const __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
      memcpy(&bits, &v, sizeof bits);
    }
    return bits;
  }
  // d += a b (16 x 8 x 16)
  __device__ static void mma(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
    if constexpr (kFp16) LATTICE_MMA_M16N8K16("f16");
    else LATTICE_MMA_M16N8K16("bf16");
#elif LATTICE_CUDA_SIMT
    ::lattice::simt::mma_m16n8k16(kFp16, d, a, b0, b1);  // tests/simt: the same fragments in software
#else
    __trap();  // the host never launches these kernels below sm_80
#endif
  }
};
#undef LATTICE_MMA_M16N8K16
using Bf16 = Half16<false>;
using Fp16 = Half16<true>;

// ---------------------------------------------------------------------------------------
// Host side.
unsigned tiles(int64_t T, int rows) { return unsigned((T + rows - 1) / rows); }

template <typename F, int D>
void forward_typed(float* out, float* lse, const AttentionOperand& qkv, const Params& p) {
  constexpr size_t bytes = forward_smem<D>();
  allow_shared(mma_forward_kernel<F, D>, bytes, "forward (tensor cores)");
  launch(mma_forward_kernel<F, D>, dim3(tiles(p.T, kFwdRows), unsigned(p.B * p.H)), kThreads, bytes,
      out, lse, qkv, p);
  LATTICE_CUDA_LAUNCHED("attention_forward (tensor cores)");
}

// D_i's scratch [B*H*T], grown on demand and kept (the process's one device).
float* di_scratch(int64_t n) {
  static GrownScratch scratch;
  return scratch.at_least(n);
}

template <typename F, int D>
void backward_typed(float* dqkv, const AttentionOperand& dout, const AttentionOperand& qkv, const float* out, const float* lse,
                    const Params& p_in, float* dbias) {
  // With dbias: the kernels' per-tile column sums, then their sums over the tiles in order.
  Params p = p_in;
  const int64_t partial_rows = p.B * int64_t(tiles(p.T, kKvKeys)), cols = p.L.width();
  if (dbias)
    LATTICE_CUDA_CALL(cudaMallocAsync(reinterpret_cast<void**>(&p.dbias_partial),
                                      size_t(partial_rows * cols) * sizeof(float), stream()));
  float* di = di_scratch(p.B * p.H * p.T);
  const int64_t rows = p.B * p.H * p.T;
  launch(row_dot_kernel<F>, unsigned((rows + kWarps - 1) / kWarps), kThreads, 0, di, dout, out, p);
  LATTICE_CUDA_LAUNCHED("attention_backward (D_i)");
  constexpr size_t kv_bytes = dkv_smem<D>();
  allow_shared(mma_backward_dkv_kernel<F, D>, kv_bytes, "backward dK/dV (tensor cores)");
  launch(mma_backward_dkv_kernel<F, D>, dim3(tiles(p.T, kKvKeys), unsigned(p.B * p.L.G)), kThreads, kv_bytes, dqkv, dout,
         qkv, lse, di, p);
  LATTICE_CUDA_LAUNCHED("attention_backward (dK, dV; tensor cores)");
  constexpr size_t q_bytes = dq_smem<D>();
  allow_shared(mma_backward_dq_kernel<F, D>, q_bytes, "backward dQ (tensor cores)");
  launch(mma_backward_dq_kernel<F, D>, dim3(tiles(p.T, kDqRows), unsigned(p.B * p.H)), kThreads, q_bytes, dqkv, dout, qkv, lse, di,
                                                                                         p);
  LATTICE_CUDA_LAUNCHED("attention_backward (dQ; tensor cores)");
  if (!dbias) return;
  launch(column_finish_kernel<1>, grid_for(cols, 256), 256, 0, ColumnOutputs{{dbias, nullptr}}, p.dbias_partial,
         partial_rows, cols);
  LATTICE_CUDA_LAUNCHED("attention_backward (QKV bias gradient)");
  LATTICE_CUDA_CALL(cudaFreeAsync(p.dbias_partial, stream()));
}

bool aligned16(const void* ptr) { return reinterpret_cast<uintptr_t>(ptr) % 16 == 0; }

}  // namespace

bool attention_mma_supported(const AttentionShape& s, const void* a, const void* b, const void* c) {
  static const int major = [] {
    int device = 0, m = 0;
    if (cudaGetDevice(&device) != cudaSuccess ||
        cudaDeviceGetAttribute(&m, cudaDevAttrComputeCapabilityMajor, device) != cudaSuccess)
      return 0;
    return m;
  }();
  return major >= 8 && (s.D == 64 || s.D == 128) && aligned16(a) && aligned16(b) && aligned16(c);
}

void attention_forward_mma(float* out, float* lse, const AttentionOperand& qkv, const AttentionShape& s,
                           const AttentionDropout& drop, const int32_t* document_ids, AttentionMath math,
                           uint16_t* out_bf16) {
  Params p = make_params(s, drop, document_ids);
  p.out16 = out_bf16;
  const bool half = math == AttentionMath::fp16;
  if (s.D == 64)
    half ? forward_typed<Fp16, 64>(out, lse, qkv, p) : forward_typed<Bf16, 64>(out, lse, qkv, p);
  else
    half ? forward_typed<Fp16, 128>(out, lse, qkv, p) : forward_typed<Bf16, 128>(out, lse, qkv, p);
}

void attention_backward_mma(float* dqkv, const AttentionOperand& dout, const AttentionOperand& qkv, const float* out, const float* lse,
                            const AttentionShape& s, const AttentionDropout& drop, const int32_t* document_ids,
                            AttentionMath math, uint16_t* dqkv_bf16, float* dbias) {
  Params p = make_params(s, drop, document_ids);
  p.dqkv16 = dqkv_bf16;
  const bool half = math == AttentionMath::fp16;
  if (s.D == 64)
    half ? backward_typed<Fp16, 64>(dqkv, dout, qkv, out, lse, p, dbias)
         : backward_typed<Bf16, 64>(dqkv, dout, qkv, out, lse, p, dbias);
  else
    half ? backward_typed<Fp16, 128>(dqkv, dout, qkv, out, lse, p, dbias)
         : backward_typed<Bf16, 128>(dqkv, dout, qkv, out, lse, p, dbias);
}

}  // namespace lattice::cuda
