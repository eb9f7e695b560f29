#include "train/flops.h"

#include <algorithm>
#include <vector>

#include "blas/gemm.h"
#include "core/device.h"
#include "core/timer.h"

namespace lattice {

namespace {

// One MoE layer per token (Megatron's count, no router or gate FLOPs): the k routed experts (in the latent
// space with --moe-latent-size, then its two projections) and the shared experts.
double moe_flops_per_token(const TransformerConfig& cfg, double ffn_mult) {
  const double h = double(cfg.hidden_size), ce = double(cfg.moe_expert_width());
  return 6 * ffn_mult *
             (ce * double(cfg.moe_ffn_hidden_size * cfg.moe_router_topk) +
              h * double(cfg.moe_shared_expert_intermediate_size)) +
         12 * h * double(cfg.moe_latent_size);
}

// --hybrid-override-pattern: each layer's own terms per token (Megatron's hybrid count): an attention layer's
// QKV layer, scores, weighted values and projection; an MLP layer's two (gated: three) matrices; an MoE
// layer's k routed and its shared experts; a Mamba layer's in_proj, scan (7 I N) and out_proj; the logits;
// and each prediction depth's layers with its logits, norms and eh_proj.
double hybrid_flops_per_token(const TransformerConfig& cfg, int64_t s) {
  const double h = double(cfg.hidden_size);
  const double q = double(cfg.kv_channels * cfg.num_attention_heads), kv = 2.0 * double(cfg.kv_channels * cfg.num_query_groups);
  const double gate = cfg.attention_output_gate ? q : 0.0;
  const double ffn_mult = cfg.gated_linear_unit() ? 3.0 : 2.0;
  auto layer = [&](char kind) {
    if (kind == '*') return 6 * (h * (q + kv + gate) + q * h) + double(s) * 6 * q;
    if (kind == '-') return 6 * h * double(cfg.ffn_hidden_size) * ffn_mult;
    if (kind == 'E') return moe_flops_per_token(cfg, ffn_mult);
    const double I = double(cfg.mamba_inner());  // 'M'
    return 6 * h * double(cfg.mamba_in_proj_width()) + 7 * I * double(cfg.mamba_state_dim) + 6 * I * h;
  };
  double total = 6 * h * double(cfg.padded_vocab_size);
  for (char kind : cfg.hybrid_layer_pattern) total += layer(kind);
  // --mtp-num-layers: each depth's layers, its logits, and its norms and eh_proj (as for a GPT model's depths).
  for (int64_t k = 0; k < cfg.mtp_num_layers; ++k) {
    for (char kind : cfg.mtp_hybrid_pattern) total += layer(kind);
    total += 6 * h * double(cfg.padded_vocab_size) + 6 * (3 * h + 2 * h * h);
  }
  return total;
}

}  // namespace

double megatron_flops_per_iteration(const TransformerConfig& cfg, int64_t gbs, int64_t s) {
  if (cfg.hybrid()) return double(gbs) * double(s) * hybrid_flops_per_token(cfg, s);
  // --mtp-num-layers: each prediction depth's transformer layer (dense or MoE as the last decoder
  // layer) counts as a layer; its norms,
  // eh_proj and logits are added below (Megatron's "MTP norms and proj" and "Logit" terms).
  const double h = double(cfg.hidden_size), K = double(cfg.mtp_num_layers), L = double(cfg.num_layers) + K;
  int64_t moe_layers = 0;
  for (int64_t l = 0; l < cfg.num_layers + cfg.mtp_num_layers; ++l) moe_layers += cfg.moe_layer(l) ? 1 : 0;
  const double q = double(cfg.kv_channels * cfg.num_attention_heads);
  const double k = double(cfg.kv_channels * cfg.num_query_groups), v = k;  // q's width without grouping
  const double gate = cfg.attention_output_gate ? q : 0.0;  // --attention-output-gate: the QKV layer's gates
  // With experts, each token's k experts and the shared experts in the MoE layers (Megatron
  // counts no router or gate FLOPs):
  // the MLP width averaged over the layers.
  const double ffn = (double(moe_layers) * double(cfg.moe_ffn_hidden_size * cfg.moe_router_topk +
                                                 cfg.moe_shared_expert_intermediate_size) +
                      (L - double(moe_layers)) * double(cfg.ffn_hidden_size)) / L;
  const double ffn_mult = cfg.gated_linear_unit() ? 3.0 : 2.0;  // a gated unit (SwiGLU, quick GEGLU): three matrices
  // Every layer's attention per token, the core attention's s-long rows included: the QKV layer, the
  // scores and the weighted values, the projection; with --multi-latent-attention Megatron's MLA terms
  // (the query's and the key-value latents with their norms, the rotary key, the projection, and the
  // core attention over Dq-wide scores and Dv-wide values, each halved for the causal mask).
  // --experimental-attention-variant gated_delta_net: a GDN layer's own terms in place of the attention's
  // (lattice's count; Megatron's formula has none for it): in_proj and out_proj, the depthwise convolution,
  // and the delta rule's three Dk x Dv products per value head and token (S^T k, the rank-1 update, S^T q).
  double gdn_layers = 0;
  for (int64_t l = 0; l < cfg.num_layers + cfg.mtp_num_layers; ++l) gdn_layers += cfg.linear_attention_layer(l) ? 1 : 0;
  const double La = L - gdn_layers;
  double attention = La * 6 * (h * (q + k + v + gate) + q * h) + double(s) * 6 * q * La;
  if (gdn_layers > 0)
    attention += gdn_layers * 6 *
                 (h * double(cfg.gdn_in_proj_width()) + double(cfg.gdn_out_width()) * h +
                  double(cfg.gdn_conv_width() * cfg.linear_conv_kernel_dim) +
                  3.0 * double(cfg.linear_num_value_heads * cfg.linear_key_head_dim * cfg.linear_value_head_dim));
  if (cfg.multi_latent_attention) {
    const double H = double(cfg.num_attention_heads), Dq = double(cfg.mla_qk_dim()), Dv = double(cfg.v_head_dim);
    const double Rq = double(cfg.q_lora_rank), Rkv = double(cfg.kv_lora_rank);
    const double q_term = cfg.q_lora_rank == 0 ? h * H * Dq : Rq * (h + H * Dq + 1);
    attention = 6 * L *
                (q_term + Rkv * (h + H * double(cfg.qk_head_dim + cfg.v_head_dim) + 1) +
                 h * double(cfg.qk_pos_emb_head_dim) + H * Dv * h + double(s) * H * Dq / 2 + double(s) * H * Dv / 2);
  }
  double per_token = L * 6 * h * ffn * ffn_mult + attention + 6 * h * double(cfg.padded_vocab_size) * (K + 1) +
                     6 * K * (3 * h + 2 * h * h);
  // --moe-latent-size: the routed experts' rows are latent-wide, and the two projections are added.
  if (cfg.moe_latent_size > 0)
    per_token += double(moe_layers) * (moe_flops_per_token(cfg, ffn_mult) -
                                       6 * h * ffn_mult *
                                           double(cfg.moe_ffn_hidden_size * cfg.moe_router_topk +
                                                  cfg.moe_shared_expert_intermediate_size));
  return double(gbs) * double(s) * per_token;
}

namespace {

// On a GPU: n = 4096 sgemms on device buffers, each timed to its completion.
double measure_device_peak_tflops() {
  const int64_t n = 4096;
  const size_t bytes = size_t(n * n) * sizeof(float);
  std::vector<float> host(size_t(n * n), 0.5f);
  DevicePtr a = make_device_buffer(bytes), b = make_device_buffer(bytes), c = make_device_buffer(bytes);
  copy_to_device(a.get(), host.data(), bytes);
  copy_to_device(b.get(), host.data(), bytes);
  auto call = [&] {
    gemm_f32(Trans::N, Trans::N, n, n, n, 1.0f, static_cast<const float*>(a.get()), n,
             static_cast<const float*>(b.get()), n, 0.0f, static_cast<float*>(c.get()), n);
  };
  call();  // warm-up (loads cuBLASLt, picks the algorithm)
  device_synchronize();
  double best = 1e30;
  Timer total;
  for (int rep = 0; rep < 40 && (rep < 4 || total.seconds() < 0.4); ++rep) {
    Timer t;
    call();
    device_synchronize();
    best = std::min(best, t.seconds());
  }
  return 2.0 * double(n) * double(n) * double(n) / best / 1e12;
}

}  // namespace

double measure_peak_tflops() {
  if (kernels_on_gpu()) return measure_device_peak_tflops();
  const int64_t n = 1024;
  std::vector<float> a(size_t(n * n), 0.5f), b(size_t(n * n), 0.25f), c(size_t(n * n));
  gemm_f32(Trans::N, Trans::N, n, n, n, 1.0f, a.data(), n, b.data(), n, 0.0f, c.data(), n);  // warm-up
  // The first calls run well below the steady state (threads and kernels warming up):
  // keep going for ~0.4 s and take the best call.
  double best = 1e30;
  Timer total;
  for (int rep = 0; rep < 40 && (rep < 4 || total.seconds() < 0.4); ++rep) {
    Timer t;
    gemm_f32(Trans::N, Trans::N, n, n, n, 1.0f, a.data(), n, b.data(), n, 0.0f, c.data(), n);
    best = std::min(best, t.seconds());
  }
  return 2.0 * double(n) * double(n) * double(n) / best / 1e12;
}

}  // namespace lattice
