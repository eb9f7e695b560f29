// GPTModel's activation buffers (what a micro-batch keeps between forward and backward, the
// backward's shared scratch, a prediction depth's buffers) and the dropout streams of its sites:
// private to the model's sources (gpt_model.cpp, multi_token_prediction.cpp).
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "core/philox.h"
#include "core/storage.h"
#include "kernels/embedding.h"
#include "kernels/gated_delta_net.h"
#include "model/gpt_model.h"
#include "model/moe_layer.h"

namespace lattice {

// The dropout stream of a site (its name: one stream per dropout site), keyed by the micro-batch.
inline PhiloxStream site_stream(const MicroBatchKey& key, const std::string& site) {
  return PhiloxStream{key.seed, fnv1a32(site.c_str()), uint32_t(key.iteration), uint32_t(key.micro_batch)};
}

// Everything one micro-batch keeps between forward and backward on one chunk. Sizes per
// rank (see the header): "full" buffers have N rows, "shard" buffers Ns.
struct GPTModel::Activations {
  struct Layer {
    float* ln1;        // [Ns, C]  (all-gathered into ln_full when a GEMM needs every row)
    float* ln1_mean;   // [Ns]
    float* ln1_rstd;   // [Ns]
    float* qkv;        // [N, W/P]   ([B, T, Gl, Hl/Gl + 2, D], kernels/qkv_layout.h; W = 3C without grouped-
                       //             query attention; bf16_qkv(): the bf16 GEMM result, without the bias,
                       //             followed by attn's bf16 cast [N, C/P], the projection's input)
    float* qk_raw = nullptr;   // --qk-layernorm, --qk-l2-norm: [N (Hl + Gl), D] the queries and keys before their norm,
    float* qk_mean = nullptr;  //   [N (Hl + Gl)] their statistics (model/qk_layernorm.h); qkv holds
    float* qk_rstd = nullptr;  //   them normalized (and rotated)
    float* attn;       // [N, C/P]   ([B, T, Hl, D])
    // --multi-latent-attention (model/multi_latent_attention.cpp; Rq, Rkv the latents, Dr the rotary key):
    float* mla_q_c = nullptr;     // [N, Rq] linear_q_down_proj's output (--q-lora-rank)
    float* mla_q_n = nullptr;     // [N, Rq] q_layernorm's output, linear_q_up_proj's input (mla_q_c without norms)
    float* mla_q_mean = nullptr;  // [N] q_layernorm's statistics
    float* mla_q_rstd = nullptr;
    float* mla_kv_c = nullptr;    // [N, Rkv + Dr] linear_kv_down_proj's output: the latent, then the rotary key
    float* mla_kv_l = nullptr;    // [N, Rkv] its latent, kv_layernorm's input
    float* mla_kv_n = nullptr;    // [N, Rkv] kv_layernorm's output, linear_kv_up_proj's input (mla_kv_l without norms)
    float* mla_kv_mean = nullptr;
    float* mla_kv_rstd = nullptr;
    float* attn_v = nullptr;      // [N, Hl Dv] attn without the values' padding (attn itself when Dv = D)
    float* lse;        // [B, Hl, T]
    float* resid_mid;  // [Ns, C]  residual stream after the attention block
    float* ln2;        // [Ns, C]
    float* ln2_mean;   // [Ns]
    float* ln2_rstd;   // [Ns]
    float* fc1;        // [N, F1l] pre-activation (bf16_inputs(): fc1's bf16 GEMM result, without the bias;
                       //          in backward, then its output gradient: in bf16, or in fp32 with SwiGLU)
    float* gelu;       // [N, Fl]  the activation, GELU or SwiGLU (bf16_inputs(): bf16; in backward, then
                       //          fc2's input gradient in bf16)
    // --num-experts (fc1 and gelu null): the MoE layer's kept buffers and routing (model/moe_layer.h)
    std::shared_ptr<MoeState> moe;
    // global_aux_loss: the step's averaged expert counts [E] when this micro-batch was routed, and
    // the micro-batch's tokens on every data- and context-parallel rank (moe_global_balance).
    std::vector<double> moe_global_counts;
    double moe_global_tokens = 0.0;
  };
  // resid[i] is the chunk's layer i's input, resid.back() its output; layers[i] the
  // buffers of layer i. With recomputation some point into the shared Scratch (see
  // allocate()): a recomputed layer's buffers and a group's inner residuals, or
  // (selective) every layer's attn and lse.
  std::vector<float*> resid;  // chunk layers + 1 x [Ns, C]
  std::vector<Layer> layers;
  // Per layer: the first layer of the recomputed group it ends, else -1 (backward reruns
  // that group's forward before the layer's backward).
  std::vector<int64_t> recompute_from;
  // With the loss:
  float* lnf = nullptr;       // [N, C] full
  float* lnf_mean = nullptr;  // [Ns]
  float* lnf_rstd = nullptr;  // [Ns]
  float* logits = nullptr;    // [N, Vl]  (overwritten by dlogits; bf16 [N, Vl] at its start with bf16_logits())
  float* losses = nullptr;    // [N]
  // The micro-batch's token-derived inputs, [B*T] each (row stride n, the largest B*T):
  // [inputs | positions | document ids | targets], filled on the host and uploaded at once.
  StagedArray<int32_t> ids;
  StagedArray<float> loss_mask;  // [B*T] a given mask times the eod mask
  int64_t n = 0;
  float grad_scale = 1.0f;  // forward_step's: the scale of the micro-batch's loss gradient (the MoE aux loss's too)
  int32_t* inputs() const { return ids.device(); }
  int32_t* positions() const { return ids.device() + n; }
  int32_t* document_ids() const { return ids.device() + 2 * n; }
  int32_t* targets() const { return ids.device() + 3 * n; }
  // Context parallelism with --reset-attention-mask: the whole sequences' document ids [B, T x cp],
  // the keys' (every rank counts every eod).
  StagedArray<int32_t> key_ids;
  // For the embedding's backward on a GPU: the inputs' rows grouped by token and by position
  // (kernels/embedding.h), [token groups | position groups] with room for 2n + 1 entries each,
  // made on the host by prepare_inputs; groups points into it (empty: none made).
  StagedArray<int32_t> row_groups;
  EmbeddingRowGroups groups;
};

// A Gated DeltaNet layer's core between in_proj and out_proj (model/gated_delta_net.cpp), made in its
// forward and again in its backward: one copy for every GDN layer. Rows N = B T, this rank's heads
// (kernels/gated_delta_net.h's names).
struct GdnScratch {
  float* u = nullptr;       // [N, Cc] the convolution's output
  float* q = nullptr;       // [N, Hk Dk] the normalized, scaled queries
  float* k = nullptr;       // [N, Hk Dk] the normalized keys
  float* g = nullptr;       // [N, Hv] the decays
  float* beta = nullptr;    // [N, Hv]
  float* o = nullptr;       // [N, Hv Dv] the delta rule's output
  float* nrm = nullptr;     // [N, Hv Dv] out_norm's output
  float* mean = nullptr;    // [N Hv] its statistics
  float* rstd = nullptr;
  float* state = nullptr;   // [B, Hv, Dv, Dk] the running state
  float* ckpt = nullptr;    // [B, Hv, chunks, Dv, Dk] each chunk's starting state
  float* du = nullptr;      // [N, Cc] gradients: of u,
  float* d_o = nullptr;     //   [N, Hv Dv] of o,
  float* dq_v = nullptr;    //   [N, Hv Dk] of each value head's queries and keys,
  float* dk_v = nullptr;
  float* dq = nullptr;      //   [N, Hk Dk] of q and k,
  float* dk = nullptr;
  float* dg = nullptr;      //   [N, Hv] of g and beta
  float* dbeta = nullptr;
  float* work = nullptr;    // the delta rule backward's on a GPU (gdn_delta_rule_work; none on the CPU)
};
// Carves them for a core of shape s out of `arena` (model/gated_delta_net.cpp).
void gdn_scratch_carve(GdnScratch& g, Arena& arena, const GdnShape& s);

// A Mamba layer's mixer between in_proj and out_proj (model/mamba_mixer.cpp), made in its forward and again
// in its backward: one copy for every Mamba layer. Rows N = B T, this rank's heads and groups
// (kernels/mamba.h's names).
struct MambaScratch {
  float* u = nullptr;     // [N, Cc] the convolution's output (xs, B, C)
  float* dt = nullptr;    // [N, H] the steps
  float* y = nullptr;     // [N, H P] the scan's output
  float* rstd = nullptr;  // [N, G] the gated norm's statistics
  float* ckpt = nullptr;  // [B, H, chunks, P, N] each chunk's starting state
  float* du = nullptr;    // [N, Cc] gradients: of u,
  float* d_dt = nullptr;  //   [N, H] of dt,
  float* dy = nullptr;    //   [N, H P] of y
  float* work = nullptr;  // the scan backward's on a GPU (mamba_scan_work; none on the CPU)
};
// Carves them for a mixer of shape s out of `arena` (model/mamba_mixer.cpp).
void mamba_scratch_carve(MambaScratch& m, Arena& arena, const MambaShape& s);

// The parameters a Mamba mixer runs with (this rank's heads and groups, or under context parallelism its share of
// them) and where their gradients go.
struct MambaCoreParams {
  const float *conv_w = nullptr, *conv_b = nullptr, *dt_bias = nullptr, *a_log = nullptr, *d_skip = nullptr;
  const float* norm_w = nullptr;
  float *d_conv_w = nullptr, *d_conv_b = nullptr, *d_dt_bias = nullptr, *d_a_log = nullptr, *d_d_skip = nullptr;
  float* d_norm_w = nullptr;
};

// Under context parallelism a Mamba layer's scan runs through the whole sequences, Megatron's way: rank r of
// the group of P runs the mixer for its share of this tensor-parallel rank's heads and groups (H / P heads from
// r H / P, G / P groups from r G / P; P must divide both) over them. Its columns of every token's in_proj output
// come by an all-to-all from the ranks holding the rows (x [B, T, W'], W' its share's row: z, x, B, C, dt),
// out_proj's input y [B, T, H P / P] goes back the same way, and in backward so do out_proj's input gradient
// dy and in_proj's output gradient dx. Its conv1d rows and biases are copied to conv_w and conv_b (their
// gradients summed in conv_dw and conv_db, then added to the layer's); the per-head parameters and the gated
// norm's weight are read and their gradients added in place (each rank its heads': the context-parallel sum
// adds the shares). staging: the all-to-all's send side, recv its receive side. Beside the arena
// (context_parallel_bytes counts them).
struct MambaContextParallel {
  Arena arena;
  MambaScratch scratch;
  float *x = nullptr, *y = nullptr, *dy = nullptr, *dx = nullptr, *staging = nullptr, *recv = nullptr;
  float *conv_w = nullptr, *conv_b = nullptr, *conv_dw = nullptr, *conv_db = nullptr;
  // Carves every buffer out of `arena` (a counting one: nothing allocated) for B sequences of T tokens on a
  // group of cp ranks.
  void carve(Arena& from, const TransformerConfig& cfg, int64_t tp, int64_t cp, int64_t B, int64_t T);
};

// The parameters a GDN core runs with (its heads' conv1d rows, A_log and dt_bias; out_norm's are the layer's)
// and where their gradients go.
struct GdnCoreParams {
  const float *conv_w = nullptr, *a_log = nullptr, *dt_bias = nullptr;
  float *d_conv_w = nullptr, *d_a_log = nullptr, *d_dt_bias = nullptr, *d_norm_w = nullptr, *d_norm_b = nullptr;
};

// Under context parallelism a GDN layer's state runs through the whole sequences. When the group's size P
// divides this rank's key heads (split_heads), rank r runs the core for its share of the heads, Hk / P key
// heads from r Hk / P and their value heads, over the whole sequences: its columns of every token's in_proj
// output come by an all-to-all from the ranks holding the rows (x [B, T, W'], W' its share's row), out_proj's
// input y [B, T, Hv Dv / P] goes back the same way, and in backward so do out_proj's input gradient dy and
// in_proj's output gradient dx; its conv1d rows are copied to conv_w (their gradient summed in conv_dw, then
// added to the layer's). Otherwise every rank runs the whole core over the gathered sequences (x, dx
// [B, T, W], y, dy [B, T, Hv Dv]), keeps its rows, and only the group's first rank adds the parameters'
// gradients (the others' go to sink), so the context-parallel sum counts them once. staging: the
// collectives' (the all-to-all's send side), recv its receive side. Beside the arena
// (context_parallel_bytes counts them).
struct GdnContextParallel {
  Arena arena;
  GdnScratch scratch;
  bool split_heads = false;
  float *x = nullptr, *y = nullptr, *dy = nullptr, *dx = nullptr, *staging = nullptr, *recv = nullptr;
  float *sink = nullptr, *conv_w = nullptr, *conv_dw = nullptr;
  // Carves every buffer out of `arena` (a counting one: nothing allocated) for B sequences of T tokens on a
  // group of cp ranks.
  void carve(Arena& from, const TransformerConfig& cfg, int64_t tp, int64_t cp, int64_t B, int64_t T);
};

// Backward scratch shared by every chunk and slot (one step runs at a time).
struct GPTModel::Scratch {
  GdnScratch gdn;             // --experimental-attention-variant gated_delta_net
  MambaScratch mamba;         // --hybrid-override-pattern with Mamba layers
  float* d_resid;             // [Ns, C]
  float* d_s;                 // [Ns, C]  (sequence parallelism only)
  float* ln_full;             // [N, C]   a LayerNorm output gathered from the shards (idem)
  float* d_c1;                // [N, C]
  float* d_c2;                // [N, max(C, Q/P)]  (Q = heads x kv_channels)
  float* d_3c;                // [N, W/P]  the QKV layer's output gradient (W = 3Q without grouping)
  float* d_f;                 // [N, Fl]
  MoeScratch moe;             // --num-experts: the MoE backward's scratch
  float* qk_tmp = nullptr;    // --qk-layernorm, --qk-l2-norm: [N (Hl + Gl), D] the norm's output, then its output gradient
  float* qk_dx = nullptr;     //   [N (Hl + Gl), D] its input gradient
  // --attention-output-gate: [N, Q/P] the gated attention output, linear_proj's input (made before the
  // projection's forward and again before its backward, from the kept attention output and gates)
  float* attn_gated = nullptr;
  // --multi-latent-attention: the up projections' outputs in forward, their gradients in backward
  float* mla_q = nullptr;        // [N, Hl Dq]
  float* mla_kv = nullptr;       // [N, Hl (Dn + Dv)]
  float* mla_d_qn = nullptr;     // [N, Rq] q_layernorm's output gradient
  float* mla_d_qc = nullptr;     // [N, Rq] its input gradient
  float* mla_d_kvn = nullptr;    // [N, Rkv] kv_layernorm's output gradient, then [N, Dr] the rotary key's
  float* mla_d_kvl = nullptr;    // [N, Rkv] its input gradient
  float* mla_d_kvc = nullptr;    // [N, Rkv + Dr] linear_kv_down_proj's output gradient
  float* mla_d_attn_v = nullptr; // [N, Hl Dv] linear_proj's input gradient (when Dv < D)
  // Recomputation (shared by every chunk and slot: one group is live at a time).
  std::vector<Activations::Layer> group;  // full: largest group x one layer's buffers
  std::vector<float*> group_resid;        // full: (largest group - 1) x [Ns, C] inner residuals
  float* attn = nullptr;                  // selective: [N, Q/P] core-attention output
  float* attn_v = nullptr;                //   MLA: [N, Hl Dv] its values' part (when Dv < D)
  float* lse = nullptr;                   // selective: [B, Hl, T]
  float* fc1 = nullptr;                   // selective mlp: [N, F1l] a dense layer's fc1 output
  float* gelu = nullptr;                  //   [N, Fl] its activation
  float* ln = nullptr;                    // selective layernorm: [Ns, C] LN1's, then LN2's output
  float* qkv = nullptr;                   // selective mla_up_proj: [N, W/P] every layer's fused qkv
  // --mtp-num-layers: eh_proj's input gradient [N, 2C] (every row's partial) and with sequence
  // parallelism its reduced shard [Ns, 2C]; the gradient of the final LayerNorm's output from depth 1 [Ns, C].
  float* mtp_d_cat = nullptr;
  float* mtp_d_cat_s = nullptr;
  float* mtp_d_h = nullptr;
};

// --mtp-num-layers: what a prediction depth keeps of a micro-batch between forward and backward.
struct GPTModel::MtpDepth {
  // Its transformer layer's: resid[0] eh_proj's output [Ns, C], layers[0], resid[1]; lnf and its
  // statistics: the depth's final_layernorm (every row, [N, C]); logits and losses: the main
  // model's buffers (used before them); ids: the inputs, positions and targets shifted once more
  // than the previous depth's, the document ids unshifted.
  Activations a;
  float* emb = nullptr;                                      // [Ns, C] the shifted inputs' embedding (after dropout)
  float* en = nullptr, *en_mean = nullptr, *en_rstd = nullptr;  // [Ns, C], [Ns] enorm of emb
  float* hn = nullptr, *hn_mean = nullptr, *hn_rstd = nullptr;  // [Ns, C], [Ns] hnorm of the previous depth's output
  float* cat = nullptr;    // [N, 2C] eh_proj's input: each row's enorm then hnorm output (every row)
  float* d_out = nullptr;  // [Ns, C] gradient of lnf's rows here: its output layer's, plus the next depth's hnorm's
  std::vector<float> mask;  // [B T] the loss mask shifted (host)
};

}  // namespace lattice
