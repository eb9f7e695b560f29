// GPTInference: autoregressive decoding with a KV cache over a GPTModel's parameters.
//
// The keys and values of every token already seen are kept per layer, so appending one
// token runs the layers on that token alone: its linear layers cost O(C^2) and its
// attention reads the T cached keys and values, O(T*C), instead of a full forward over
// all T tokens. The prompt is appended in one call (prefill: the linear layers run as
// GEMMs over all its tokens).
//
// The cache lives in device memory and its append and attention are kernels
// (kv_cache_append, cached_attention_forward in kernels/attention.h), so on a device
// (--device cuda) only the tokens go up and the logits come back.
//
// Several sequences (`sequences`) keep their own cache rows and recurrent states; step()
// decodes one new token of each of them together: their linear layers (and MoE layers) run
// as one GEMM over all of them, which costs about what one token's GEMV does (a decode step
// is bound by reading the weights), and each attention reads its own sequence's cache.
//
// Shapes: C hidden, H heads, D head dim, F ffn hidden, Vp padded vocabulary, L layers,
// S sequences, Tmax the cache capacity (<= max_position_embeddings: positions are absolute,
// learned or rotary; the cache holds the rotated keys).
#pragma once
#include <cstdint>
#include <memory>
#include <vector>

#include "core/storage.h"
#include "model/gpt_model.h"
#include "model/moe_layer.h"

namespace lattice {

class GPTInference {
 public:
  // Reads the model's parameters (not copied: the model must outlive this and not be
  // trained meanwhile). capacity: tokens the cache holds (0: max_position_embeddings).
  // bf16_weights: every linear layer's weight and input rounded to bf16 (model/bf16_decode_policy.h;
  // `generate --bf16`), half the bytes a decode step reads; the rest fp32.
  // sequences: how many sequences the cache holds (each `capacity` tokens).
  explicit GPTInference(const GPTModel& model, int64_t capacity = 0, bool bf16_weights = false,
                        int64_t sequences = 1);

  int64_t sequences() const { return int64_t(lengths_.size()); }
  int64_t length(int64_t seq = 0) const { return lengths_.at(size_t(seq)); }  // tokens in the cache
  int64_t capacity() const { return capacity_; }
  void reset(int64_t seq = 0) { lengths_.at(size_t(seq)) = 0; }

  // Appends tokens[0:n] to sequence seq at positions length(seq)..length(seq)+n-1 and writes
  // logits: [Vp] of the last appended token, or [n, Vp] of every appended token when
  // all_positions. Padded columns (>= vocab_size) are left as computed. Errors if the cache
  // would overflow or a token is outside [0, vocab_size).
  void append(const int32_t* tokens, int64_t n, float* logits, bool all_positions = false, int64_t seq = 0);
  // Several sequences' new tokens in one forward (prompts prefilled together: each linear layer one
  // GEMM over all their rows, each attention over its own sequence): part i appends its n tokens to
  // sequence seq. logits: each part's in part order, [n, Vp] with all_positions, else [Vp] of its last
  // token. The same numbers as appending each part alone but for the GEMMs' summation order.
  struct Part {
    int64_t seq = 0;
    const int32_t* tokens = nullptr;
    int64_t n = 0;
    bool all_positions = false;
  };
  void append(const std::vector<Part>& parts, float* logits);
  // One new token for each of `count` distinct sequences, tokens[i] appended to sequence seqs[i],
  // all run through the layers together; logits [count, Vp], row i sequence seqs[i]'s. The same
  // numbers as appending each token alone, but for the order of the GEMMs' sums (a GEMM of
  // `count` rows may block its sums otherwise than one of a row).
  void step(const int32_t* tokens, const int64_t* seqs, int64_t count, float* logits);

 private:
  // One layer's parameters (null where the layer has none). A hybrid's layer (--hybrid-override-pattern) may
  // lack the attention block (ln1 to proj) or the MLP block (ln2 to fc2, or moe).
  struct Layer {
    bool attention = true, mlp = true;
    // Its place among the layers of its kind: an attention layer's in the KV cache, a GDN or Mamba layer's in
    // the convolution histories and states.
    int64_t slot = 0;
    const float *ln1_w = nullptr, *ln1_b = nullptr, *qkv_w = nullptr, *qkv_b = nullptr, *proj_w = nullptr,
                *proj_b = nullptr;
    const float *ln2_w = nullptr, *ln2_b = nullptr, *fc1_w = nullptr, *fc1_b = nullptr, *fc2_w = nullptr,
                *fc2_b = nullptr;
    QkNormParams qk_norm;  // --qk-layernorm's (null without it)
    MoeWeights moe;        // --num-experts' (fc1_w, fc2_w null)
    const float* softmax_offset = nullptr;  // --softmax-type's sink logits [H] (null: vanilla)
    // --multi-latent-attention (qkv_w, qkv_b null): linear_q_proj, or linear_q_down_proj, q_layernorm and
    // linear_q_up_proj; linear_kv_down_proj, kv_layernorm, linear_kv_up_proj (model/multi_latent_attention.h;
    // the norms null without --qk-layernorm)
    const float *q_proj_w = nullptr, *q_down_w = nullptr, *q_norm_w = nullptr, *q_norm_b = nullptr, *q_up_w = nullptr;
    const float *kv_down_w = nullptr, *kv_norm_w = nullptr, *kv_norm_b = nullptr, *kv_up_w = nullptr;
    // A Gated DeltaNet layer (qkv_w its in_proj, proj_w its out_proj, no biases): conv1d.weight, A_log,
    // dt_bias, out_norm's weight and bias (model/gated_delta_net.h).
    bool linear = false;
    const float *conv_w = nullptr, *a_log = nullptr, *dt_bias = nullptr, *out_norm_w = nullptr, *out_norm_b = nullptr;
    // A Mamba layer (qkv_w its in_proj, proj_w its out_proj, ln1 its norm, out_norm_w mixer.norm, conv_w,
    // a_log and dt_bias as GDN's): conv1d.bias and D (model/mamba_mixer.cpp).
    bool mamba = false;
    const float *conv_b = nullptr, *d_skip = nullptr;
  };
  // Rows row0 .. row0+rows-1 of a forward are new tokens of sequence seq, at positions past ...
  struct Segment {
    int64_t seq, row0, rows, past;
  };
  // The n rows of tokens through the model (each segment's tokens appended to its sequence), then the
  // final norm and output layer on the rows of logit_rows' ranges [begin, end) into logits, in order.
  void forward(const int32_t* tokens, int64_t n, const std::vector<Segment>& segments, float* logits,
               const std::vector<std::pair<int64_t, int64_t>>& logit_rows);
  // A GDN layer on n new tokens of sequence seq: out_proj's output [n, C] into out from LN1's output ln
  // [n, C], carrying the layer's convolution history and state (gdn_hist_, gdn_state_) on.
  void gdn_layer(float* out, const Layer& p, const float* ln, int64_t n, int64_t seq);
  // A Mamba layer the same way, its norm's output ln to out_proj's output out (mamba_hist_, mamba_state_).
  void mamba_layer(float* out, const Layer& p, const float* ln, int64_t n, int64_t seq);
  // A self-attention layer (l its number) on the forward's n rows: its linear layers over all of them,
  // each segment's keys and values appended to its sequence's cache and attending to it.
  void attention_layer(float* out, const Layer& p, int64_t l, const float* ln, int64_t n,
                       const std::vector<Segment>& segments);
  // --multi-latent-attention: layer p's fused qkv [n, H, 3, D] from LN1's output ln [n, C].
  void mla_qkv(float* qkv, const Layer& p, const float* ln, int64_t n);
  // Grows the scratch buffers to n rows.
  void reserve_rows(int64_t n);

  TransformerConfig cfg_;
  int64_t capacity_ = 0, rows_ = 0;
  std::vector<int64_t> lengths_;  // [S] tokens in each sequence's cache
  // Where every linear layer's GEMM goes: fp32 (no policy), or bf16 weights (bf16_weights).
  std::unique_ptr<GemmPolicy> policy_;
  GemmSite site_;
  const float *wte_, *wpe_, *lnf_w_, *lnf_b_, *out_w_;  // wpe_ null without learned positions
  const RopeTable* rope_ = nullptr;                      // the model's, with the rotary embedding
  const RopeTable* rope_long_ = nullptr;                 // LongRoPE's long factors' (else rope_)
  DeviceArray<float> zero_bias_;                         // [C] zeros: the norms' bias with RMSNorm
  DeviceArray<float> qk_l2_ones_, qk_l2_zeros_;          // [D]: --qk-l2-norm's weights and biases
  DeviceArray<float> zero_offsets_;                      // [H] zeros: --softmax-type off-by-one's sinks
  DeviceArray<float> norm_1p_, norm_ones_;               // --apply-layernorm-1p: every norm's 1 + weight
  std::vector<Layer> layers_;
  DeviceArray<float> k_cache_, v_cache_;  // [S, La, G, Tmax, D] each: La attention layers (G = H without grouping)
  // Device scratch for up to rows_ tokens: [n, C] x3, [n, F], [n] x2, qkv [n, W] (kernels/qkv_layout.h;
  // W = 3Q without grouping), attn [n, Q] (Q = H x D); ids [2, n] tokens and positions (from the
  // host); logits [n, Vp] (device runs). act_: SwiGLU's [n, F].
  DeviceArray<float> x_, ln_, tmp_, fc_, act_, mean_, rstd_, logits_, qkv_, attn_;
  // --qk-layernorm: the gathered queries and keys [n (H + G), D] before and after their norm, and
  // their statistics [n (H + G)] (model/qk_layernorm.h).
  DeviceArray<float> qk_raw_, qk_out_, qk_mean_, qk_rstd_;
  // --multi-latent-attention: q [n, H Dq], kv [n, H (Dn + Dv)], the latent c [n, Rkv + Dr], a latent
  // before and after its norm [n, max(Rq, Rkv)], attn_v [n, H Dv]. The cache keeps the fused keys and
  // values (D wide per head), not the latent.
  DeviceArray<float> mla_q_, mla_kv_, mla_c_, mla_lat_, mla_latn_, attn_v_;
  // --experimental-attention-variant gated_delta_net, per sequence and GDN layer (its slot's slice): the last
  // K - 1 rows of in_proj's output [S, Lg, K - 1, W] (the convolution's history) and the delta rule's state
  // [S, Lg, Hv, Dv, Dk],
  // both zeros before the first token; for n tokens in_proj's output after the history [K - 1 + n, W], the
  // convolution's output [K - 1 + n, Cc], q and k [n, Hk Dk], g and beta [n, Hv], o and out_norm's output
  // [n, Hv Dv] and its statistics [n Hv].
  DeviceArray<float> gdn_hist_, gdn_state_;
  DeviceArray<float> gdn_x_, gdn_u_, gdn_q_, gdn_k_, gdn_g_, gdn_beta_, gdn_o_, gdn_n_, gdn_mean_, gdn_rstd_;
  // A hybrid's Mamba layers (kernels/mamba.h shapes), per sequence and Mamba layer: in_proj's last K - 1 rows
  // [S, Lm, K - 1, W] and the scan's state [S, Lm, H, P, N], zeros before the first token; for n tokens in_proj's
  // output after the history [K - 1 + n, W], the convolution's output [K - 1 + n, Cc], dt [n, H], the scan's
  // y [n, H P] and the gated norm's statistics [n, G] (its output in attn_).
  DeviceArray<float> mamba_hist_, mamba_state_;
  DeviceArray<float> mamba_x_, mamba_u_, mamba_dt_, mamba_y_, mamba_rstd_;
  // --num-experts: the MoE layer's buffers for n tokens (model/moe_layer.h), reused by every layer.
  DeviceArray<float> moe_buf_;
  MoeState moe_;
  StagedArray<int32_t> ids_;
};

}  // namespace lattice
