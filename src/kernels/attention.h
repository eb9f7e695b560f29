// Causal self-attention core (softmax(q k^T / sqrt(D)) v) with online softmax in
// tiles, as FlashAttention computes it: no [B,H,T,T] tensor is ever stored; the only
// saved statistic is the log-sum-exp per query row, O(B*H*T).
//
// Layout (Megatron's fused QKV, kernels/qkv_layout.h): qkv [B, T, G, R + 2, D], per token and
// group the group's R = H / G query vectors, then its key and value; without grouped-query
// attention (G = H) [B, T, H, 3, D], each head's q, k and v side by side. out [B, T, H, D].
// A group's key and value are read in place by its R heads (no per-head copy), and their
// gradients are summed over the heads inside the backward.
#pragma once
#include <cstdint>

#include "core/hd.h"
#include "core/philox.h"
#include "kernels/qkv_layout.h"

namespace lattice {

struct AttentionShape {
  int64_t B, T, H, D;
  int64_t G = 0;  // key/value heads (query groups), dividing H; 0: H (no grouping)
  // Sliding-window attention (Megatron's --window-size W,0): the query at position p attends keys
  // p - W .. p only (W + 1 keys, fewer at the start); -1: every key up to p.
  int64_t window = -1;
  // Attention sinks (Megatron's --softmax-type off-by-one / learnable, GPT-OSS's sinks): [H] or null.
  // Head h's softmax gets one more logit, softmax_offset[h], with no value: a query's probabilities
  // are exp(s_j) / (exp(softmax_offset[h]) + sum_j exp(s_j)) (s_j the scaled scores), so they sum
  // to less than 1. lse includes the sink's term.
  const float* softmax_offset = nullptr;
  // qkv holds the output gates too (QkvLayout::gated, [B, T, G, 2R + 2, D]): the attention reads and
  // writes its queries', keys' and values' slots only, never the gates'.
  bool gated = false;
  LATTICE_HD QkvLayout layout() const { return {H, G > 0 ? G : H, D, gated}; }
  // The first key the query at position p sees.
  LATTICE_HD int64_t first_key(int64_t p) const { return window < 0 || p <= window ? 0 : p - window; }
};

// Attention dropout (on the probabilities) is applied when p > 0: probability
// element (b, h, i, j) is kept when
//   stream.uniform(((b*Hg + h0 + h)*T + i)*T + j + first_index) >= p,
// with Hg the model's total heads and h0 the first head this rank computes (tensor
// parallelism splits the heads; Hg = 0 means Hg = H, h0 = 0), so every layout draws the
// single-process mask of each probability.
struct AttentionDropout {
  float p = 0.0f;
  PhiloxStream stream{0, 0};
  uint64_t first_index = 0;
  int64_t total_heads = 0;  // Hg (0: the shape's H)
  int64_t head_offset = 0;  // h0
};

// How the two products of the attention are computed on a GPU. fp32: in fp32 (CUDA
// cores), like the CPU. bf16 / fp16 (runs with --bf16 or fp8 / --fp16): on tensor cores,
// FlashAttention-2's arithmetic: q, k, v, dO, the probabilities and the score gradients
// are rounded to the format where they enter a product; sums, softmax statistics and
// outputs stay fp32. The CPU computes in fp32 whatever the value; the environment
// variable LATTICE_CUDA_ATTENTION=fp32 makes the GPU do so too (for comparisons).
enum class AttentionMath { fp32, bf16, fp16 };

// An fp32 operand of the attention (qkv [B,T,G,R+2,D], or the output gradient dout
// [B,T,H,D]), or the same values as a linear layer's bf16 GEMM result (the bf16 policy, blas
// gemm_bf16_packed_out / GemmPolicy::input_grad_packed): for qkv, the QKV layer's result y
// with the layer's bias [(H+2G)*D], standing for y + bias computed in fp32 (the values
// bias_add would store, read at half the bytes and without the bias pass); for dout, the
// projection's input gradient as its GEMM wrote it rounded. Implicit from an fp32 pointer.
struct AttentionOperand {
  const float* fp32 = nullptr;
  const uint16_t* bf16 = nullptr;  // when fp32 is null
  const float* bias = nullptr;     // with bf16, qkv only; null: no bias
  LATTICE_HD AttentionOperand(const float* x) : fp32(x) {}  // NOLINT(google-explicit-constructor)
  static AttentionOperand packed(const uint16_t* y, const float* bias) {
    AttentionOperand in(nullptr);
    in.bf16 = y;
    in.bias = bias;
    return in;
  }
  static AttentionOperand in_bf16(const uint16_t* x) { return packed(x, nullptr); }
  const void* data() const { return fp32 ? static_cast<const void*>(fp32) : static_cast<const void*>(bf16); }
};

// Context parallelism (Megatron's --context-parallel-size, its all-gather kind): the T query
// rows of each batch row are two runs of a sequence of Tk tokens, and the keys and values are
// the whole sequence's, gathered from every rank of the group into kv [B, Tk, G, 2, D] (per token
// and group, the group's key, then its value). Query row i sits at position(i) (increasing in i)
// and attends keys 0 .. position(i); attention dropout indexes it by that position in a
// sequence of Tk (Tk replaces T in AttentionDropout's formula), so the masks are the
// single-process run's. The backward writes the keys' and values' gradients into dkv
// [B, Tk, G, 2, D] (every element) and only the queries' into dqkv (its key and value slots are
// left as they are; dqkv_bf16 and dbias must be null). With document ids (--reset-attention-mask)
// the queries' are document_ids [B, T] as without a context and the keys' key_document_ids [B, Tk],
// the whole sequence's: given together or not at all.
struct ContextKeys {
  const float* kv = nullptr;  // [B, Tk, G, 2, D]
  float* dkv = nullptr;       // [B, Tk, G, 2, D] (backward)
  const int32_t* key_document_ids = nullptr;  // [B, Tk] or null
  int64_t Tk = 0;
  int64_t split = 0;          // rows i < split sit at i + shift[0], the others at i + shift[1]
  int64_t shift[2] = {0, 0};
  LATTICE_HD int64_t position(int64_t i) const { return i + (i < split ? shift[0] : shift[1]); }
};

// With a window (AttentionShape::window), the key tiles wholly before a query tile's window are
// skipped, so the cost grows as T x W instead of T^2 / 2.
//
// document_ids: [B,T] or null. When given, query i attends key j only when j <= i and
// document_ids[b,i] == document_ids[b,j] (Megatron's --reset-attention-mask, without a
// T x T mask): masked scores are -inf inside the tiles, and a key tile whose id range
// misses the query tile's is skipped. Dropout indices are unchanged by the mask.

// out: [B,T,H,D]   lse: [B,H,T] (log-sum-exp of the scaled scores of each query row)
// out_bf16, when not null, gets out's bf16 cast too ([B,T,H,D]: the projection's input as its
// GEMMs read it, made here instead of by a conversion pass before each of them).
void attention_forward(float* out, float* lse, const AttentionOperand& qkv, const AttentionShape& s,
                       const AttentionDropout& drop, const int32_t* document_ids = nullptr,
                       AttentionMath math = AttentionMath::fp32, uint16_t* out_bf16 = nullptr,
                       const ContextKeys* context = nullptr);

// dqkv: [B,T,G,R+2,D] written (not accumulated); a group's key (value) gradient is the sum of
// its R heads' (added in head order per key tile). Recomputes the probabilities from lse.
// dqkv_bf16, when not null, gets dqkv's bf16 cast too (the QKV layer's output gradient as
// its GEMMs read it, made here instead of by a conversion pass).
// With output gates (s.gated) dqkv's gate slots are left as they are, and dqkv_bf16 and dbias must be null.
// dbias, when not null, accumulates the QKV layer's bias gradient, the column sums of dqkv
// over its B*T rows: dbias[slot*D + d] += sum_(b,t) dqkv[b,t,slot,d]. dqkv is then
// scratch: the tensor-core kernels sum each tile's rows as they finish it and never store
// the fp32 dqkv (its [B*T, 3*H*D] values written and read again for the bias alone); the
// others write it and sum it as bias_backward does (the same bits as calling it after).
// d_softmax_offset, when not null (with s.softmax_offset), accumulates the sinks' gradient [H]:
// d_softmax_offset[h] += -sum_(b,i) exp(softmax_offset[h] - lse[b,h,i]) (dout[b,i,h] . out[b,i,h]), the
// sink's probability times the gradient of its logit (its value is 0), summed over the batch rows in
// order.
void attention_backward(float* dqkv, const AttentionOperand& dout, const AttentionOperand& qkv, const float* out,
                        const float* lse, const AttentionShape& s, const AttentionDropout& drop,
                        const int32_t* document_ids = nullptr, AttentionMath math = AttentionMath::fp32,
                        uint16_t* dqkv_bf16 = nullptr, float* dbias = nullptr, const ContextKeys* context = nullptr,
                        float* d_softmax_offset = nullptr);

// Decoding with a KV cache (generation), one layer. k_cache, v_cache: [G, Tmax, D], one row
// per key/value head (a group's, shared by its R query heads); the n new tokens sit at
// positions past .. past+n-1 and their qkv is [n, G, R+2, D] (layout.H query heads, layout.G
// groups, layout.D).
// kv_cache_append: k_cache[g, past + r, :] = group g's key of token r, v likewise.
void kv_cache_append(float* k_cache, float* v_cache, const float* qkv, int64_t n, int64_t past,
                     const QkvLayout& layout, int64_t Tmax);
// out [n, H, D]: query r of head h attends its group's cache rows 0 .. past + r (causal; with
// window >= 0 only rows past + r - window .. past + r, as AttentionShape::window),
// softmax(q k^T / sqrt(D)) v, with head h's sink logit softmax_offset[h] in the softmax when given
// ([H], AttentionShape::softmax_offset); each (query, head) is summed in one fixed order (the result
// does not depend on threads).
void cached_attention_forward(float* out, const float* qkv, const float* k_cache, const float* v_cache, int64_t n,
                              int64_t past, const QkvLayout& layout, int64_t Tmax, int64_t window = -1,
                              const float* softmax_offset = nullptr);

}  // namespace lattice
