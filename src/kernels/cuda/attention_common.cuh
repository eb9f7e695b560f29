// Shared by the CUDA attention kernels (.cu only): the kernels' parameters, the mask and
// dropout of kernels/attention.h's definition, the qkv/out row offsets, and the host's
// shared-memory opt-in. The fp32 kernels (attention.cu) and the tensor-core kernels
// (attention_mma.cu) draw the same masks from the same Philox indices.
#pragma once
#include <cmath>
#include <cstdint>

#include "kernels/attention.h"
#include "kernels/cast_math.h"
#include "kernels/cuda/launch.cuh"

namespace lattice::cuda::attention_detail {

constexpr int kMaxD = 256;  // the largest head dim the fp32 kernels take (the tensor-core ones: 64 and 128)

// Everything a kernel needs besides the pointers (passed by value).
struct Params {
  int64_t B, T, H, D;
  QkvLayout L;                 // qkv's layout (H query heads in L.G groups)
  float scale;                 // 1/sqrt(D)
  bool dropout;
  uint32_t threshold;          // keep when (u32 >> 8) >= threshold, i.e. uniform >= p
  float keep_scale;            // 1/(1-p)
  PhiloxStream stream;
  uint64_t first_index;
  int64_t heads_total, head_offset;
  const int32_t* doc;          // [B,T] or null: the queries' document ids
  const int32_t* kdoc;         // [B,Tk] the keys' (doc itself without a context)
  // Context parallelism (ContextKeys): the keys and values kv [B, Tk, G, 2, D] of the whole
  // sequence, their gradients dkv (backward), and the query rows' positions; kv null: the keys
  // are qkv's own rows (Tk = T, positions 0 .. T-1).
  const float* kv = nullptr;
  float* dkv = nullptr;
  int64_t Tk = 0, split = 0, shift0 = 0, shift1 = 0;
  int64_t window = -1;         // AttentionShape::window: keys position - window .. position; -1: all
  const float* sink = nullptr; // AttentionShape::softmax_offset [H] (device), or null
  uint16_t* dqkv16 = nullptr;  // backward: dqkv's bf16 cast too, or null
  uint16_t* out16 = nullptr;   // forward: out's bf16 cast too, or null
  // backward (tensor cores): instead of storing dqkv, each block's column sums of its 64
  // rows, [B * ceil(T / 64)][(H + 2G) * D] (the QKV bias gradient's partial sums), or null
  float* dbias_partial = nullptr;
};

inline Params make_params(const AttentionShape& s, const AttentionDropout& drop, const int32_t* doc,
                          const ContextKeys* context = nullptr) {
  LATTICE_CHECK(s.B > 0 && s.T > 0 && s.H > 0 && s.D > 0 && s.G >= 0 && (s.G == 0 || s.H % s.G == 0))
      << "attention (CUDA): bad shape B=" << s.B << " T=" << s.T << " H=" << s.H << " D=" << s.D << " G=" << s.G;
  LATTICE_CHECK(s.D <= kMaxD) << "attention (CUDA): head dim D=" << s.D << " exceeds " << kMaxD;
  LATTICE_CHECK(s.B * s.H <= 65535) << "attention (CUDA): B*H=" << s.B * s.H
                                    << " exceeds the grid's 65535";
  LATTICE_CHECK(drop.p >= 0.0f && drop.p < 1.0f)
      << "attention (CUDA): dropout probability " << drop.p << " not in [0, 1)";
  LATTICE_CHECK(s.window >= -1) << "attention (CUDA): window " << s.window << " (expected -1 or a size >= 0)";
  Params p{};
  p.B = s.B;
  p.T = s.T;
  p.H = s.H;
  p.D = s.D;
  p.L = s.layout();
  p.scale = 1.0f / std::sqrt(float(s.D));
  p.dropout = drop.p > 0.0f;
  // The CPU's test: (u >> 8) >= ceil(p * 2^24), the same as uniform(u) >= p.
  p.threshold = dropout_threshold(drop.p);
  p.keep_scale = p.dropout ? 1.0f / (1.0f - drop.p) : 1.0f;
  p.stream = drop.stream;
  p.first_index = drop.first_index;
  p.heads_total = drop.total_heads > 0 ? drop.total_heads : s.H;
  p.head_offset = drop.head_offset;
  p.doc = doc;
  p.kdoc = doc;
  p.Tk = s.T;
  p.window = s.window;
  p.sink = s.softmax_offset;
  if (context) {
    LATTICE_CHECK(context->kv && !doc == !context->key_document_ids && context->split >= 0 && context->split <= s.T && context->shift[0] >= 0 &&
                  context->shift[1] >= context->shift[0] && context->position(s.T - 1) < context->Tk)
        << "attention (CUDA): bad context-parallel keys (Tk=" << context->Tk << " split=" << context->split
        << " for T=" << s.T << ", query document ids " << (doc ? "given" : "none") << ", key document ids "
        << (context->key_document_ids ? "given" : "none") << ")";
    p.kv = context->kv;
    p.dkv = context->dkv;
    p.Tk = context->Tk;
    p.split = context->split;
    p.shift0 = context->shift[0];
    p.shift1 = context->shift[1];
    p.kdoc = context->key_document_ids;
  }
  return p;
}

// The position in the sequence of query row i (context parallelism), else i.
__device__ __forceinline__ int64_t position(const Params& p, int64_t i) {
  return p.kv ? i + (i < p.split ? p.shift0 : p.shift1) : i;
}

// The first key query row i sees: 0, or with a window the window's first.
__device__ __forceinline__ int64_t first_key(const Params& p, int64_t i) {
  const int64_t at = position(p, i);
  return p.window < 0 || at <= p.window ? 0 : at - p.window;
}

// Whether query row i sees key j: causal (at the row's position), inside the window when there is
// one, and the same document when ids are given.
__device__ __forceinline__ bool visible(const Params& p, int64_t b, int64_t i, int64_t j) {
  if (j > position(p, i)) return false;
  if (p.window >= 0 && j < position(p, i) - p.window) return false;
  return !p.doc || p.kdoc[b * p.Tk + j] == p.doc[b * p.T + i];
}

// Dropout factor of probability (b, h, i, j): keep_scale or 0, the CPU's mask bit for bit.
__device__ __forceinline__ float dropout_factor(const Params& p, int64_t b, int64_t h, int64_t i,
                                                int64_t j) {
  const uint64_t index =
      uint64_t(((b * p.heads_total + p.head_offset + h) * p.Tk + position(p, i)) * p.Tk) + p.first_index +
      uint64_t(j);
  return (p.stream.u32(index) >> 8) >= p.threshold ? p.keep_scale : 0.0f;
}

// Offset of token t's row in qkv [B,T,G,R+2,D]: slot s (QkvLayout::slot) at + s * D.
__device__ __forceinline__ int64_t qkv_row(const Params& p, int64_t b, int64_t t) {
  return (b * p.T + t) * p.L.width();
}
// Offset of row t of head h in out [B,T,H,D].
__device__ __forceinline__ int64_t out_row(const Params& p, int64_t b, int64_t h, int64_t t) {
  return ((b * p.T + t) * p.H + h) * p.D;
}

// dqkv[i] = v, and its bf16 cast when the backward writes one.
__device__ __forceinline__ void store_dqkv(float* dqkv, const Params& p, int64_t i, float v) {
  dqkv[i] = v;
  if (p.dqkv16) p.dqkv16[i] = math::fp32_to_bf16(v);
}

// Element i of an operand without a bias (the output gradient): fp32, or widened from bf16.
__device__ __forceinline__ float operand_at(const AttentionOperand& in, int64_t i) {
  return in.fp32 ? in.fp32[i] : math::bf16_to_fp32(in.bf16[i]);
}

// Element d of slot `slot` of the qkv row at offset `row` (qkv_row(p, b, t)): the fp32 value,
// or a packed input's y + bias (the fp32 sum bias_add makes).
__device__ __forceinline__ float qkv_at(const AttentionOperand& in, const Params& p, int64_t row, int64_t slot,
                                        int64_t d) {
  const int64_t i = row + slot * p.D + d;
  if (in.fp32) return in.fp32[i];
  const float y = math::bf16_to_fp32(in.bf16[i]);
  return in.bias ? __fadd_rn(y, in.bias[slot * p.D + d]) : y;
}

// Element d of key j's key (part 0) or value (part 1) of group g, for slot sk = L.kv_slot(g, 1):
// from a context's kv [B, Tk, G, 2, D], else from qkv's row.
__device__ __forceinline__ float key_at(const AttentionOperand& qkv, const Params& p, int64_t b, int64_t j,
                                        int64_t g, int64_t sk, int part, int64_t d) {
  if (p.kv) return p.kv[((b * p.Tk + j) * p.L.G + g) * 2 * p.D + part * p.D + d];
  return qkv_at(qkv, p, qkv_row(p, b, j), sk + part, d);
}

// Host side: a device scratch of floats that only grows, kept for the process (its one device); each
// user holds its own (static) one.
struct GrownScratch {
  void* buffer = nullptr;
  int64_t capacity = 0;
  float* at_least(int64_t n) {
    if (n > capacity) {
      if (buffer) free_device(buffer);  // free_device synchronizes: earlier kernels are done with it
      buffer = malloc_device(size_t(n) * sizeof(float));
      capacity = n;
    }
    return static_cast<float*>(buffer);
  }
};

// Host side: dynamic shared memory above the default 48 KB is granted per kernel before
// each launch (fails with the need and the device's limit).
template <typename Kernel>
inline void allow_shared(Kernel kernel, size_t bytes, const char* what) {
  int device = 0, optin = 0;
  LATTICE_CUDA_CALL(cudaGetDevice(&device));
  LATTICE_CUDA_CALL(cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, device));
  LATTICE_CHECK(bytes <= size_t(optin)) << "attention (CUDA) " << what << ": needs " << bytes
                                        << " bytes of shared memory, the device allows " << optin;
  LATTICE_CUDA_CALL(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                         int(bytes)));
}

}  // namespace lattice::cuda::attention_detail
