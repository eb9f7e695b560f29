// GPTModel's multi-token prediction depths (--mtp-num-layers; Megatron-Core's
// MultiTokenPredictionBlock, DeepSeek-V3's MTP modules), run after the main model on the loss chunk.
//
// Depth k (from 1) of a micro-batch, with h0 the main final LayerNorm's output:
//   ids_k, positions_k, targets_k, mask_k = those of depth k-1 rolled left by one, the last 0
//                                           (Megatron's roll_tensor; the document ids unshifted)
//   e_k   = dropout(embedding(ids_k, positions_k))            (the model's word/position embedding)
//   x_k   = [enorm_k(e_k) | hnorm_k(h_{k-1})] eh_proj_k^T      ([N, 2C] x [C, 2C]^T, column-parallel)
//   h_k   = final_layernorm_k(transformer_layer_k(x_k))        (a dense layer, causal over every row)
//   loss_k = sum(mask_k ce(h_k Wout^T, targets_k)) / sum(mask_k)  (the shared output layer)
// Training adds mtp_loss_scaling_factor / K x sum_k loss_k to the micro-batch's loss (the gradient
// of the token sum with --calculate-per-token-loss); the reported loss is the main model's.
// Shapes on one of P tensor-parallel ranks: N = B T rows, Ns this rank's (N / P with sequence
// parallelism), C hidden, Cl = C / P eh_proj's output columns here.
#include <algorithm>
#include <string>
#include <vector>

#include "core/device.h"
#include "dist/comm.h"
#include "kernels/elementwise.h"
#include "kernels/layernorm.h"
#include "model/gpt_model.h"
#include "model/gpt_model_buffers.h"
#include "model/linear.h"
#include "model/tensor_parallel.h"

namespace lattice {

namespace {

std::string depth_name(int64_t k) { return "mtp.layers." + std::to_string(k) + "."; }

}  // namespace

void GPTModel::shift_inputs(Activations& to, std::vector<float>& mask, const Activations& main, int64_t s,
                            const float* loss_mask, int64_t B, int64_t Tl, bool group_rows) {
  const int64_t T = Tl * cp_.size(), n = main.n;  // the whole sequence; ids: [inputs | positions | documents | targets]
  const int32_t* whole = mtp_tokens_.data();       // [inputs | positions | targets], B T each
  int32_t* ids = to.ids.host();
  mask.resize(size_t(B * Tl));
  // Local row i holds token g of the micro-batch, position t of its sequence.
  auto shift = [&](int64_t i, int64_t g, int64_t t) {
    const bool in = t + s < T;
    ids[i] = in ? whole[g + s] : 0;
    ids[n + i] = in ? whole[B * T + g + s] : 0;
    ids[3 * n + i] = in ? whole[2 * B * T + g + s] : 0;
    mask[size_t(i)] = in ? (loss_mask ? loss_mask[g + s] : 1.0f) : 0.0f;
  };
  if (!cp_.on()) {
    for (int64_t i = 0; i < B * T; ++i) shift(i, i, i % T);
  } else {
    for (const TokenRun& r : token_runs(B, Tl))
      for (int64_t j = 0; j < r.rows; ++j) shift(r.row + j, r.token + j, r.position + j);
  }
  // The attention's documents stay the inputs' (read only: StagedArray has no const host()).
  std::copy_n(main.ids.host() + 2 * n, B * Tl, ids + 2 * n);
  to.ids.upload(size_t(4 * n));
  if (cp_.on()) {
    std::copy_n(main.key_ids.host(), B * T, to.key_ids.host());
    to.key_ids.upload(size_t(B * T));
  }
  to.groups = {};
  if (group_rows) group_embedding_rows(to, B * Tl);
}

void GPTModel::mtp_forward(Activations& a, int slot, const float* loss_mask, int64_t B, int64_t T, float grad_scale,
                           const MicroBatchKey& key) {
  Scratch& sc = *scratch_;
  const bool sp = tp_.sp();
  const int64_t K = cfg_.mtp_num_layers, N = B * T, C = cfg_.hidden_size, P = tp_.size(), Cl = C / P;
  const int64_t Ns = tp_.shard_rows(N), row0 = tp_.shard_begin(N);
  const float scale = grad_scale * cfg_.mtp_loss_scaling_factor / float(K);
  for (int64_t k = 0; k < K; ++k) {
    MtpDepth& d = mtp_acts_[size_t(slot * K + k)];
    const MtpParams& w = mtp_[size_t(k)];
    const Activations& prev = k == 0 ? a : mtp_acts_[size_t(slot * K + k - 1)].a;
    shift_inputs(d.a, d.mask, a, k + 1, loss_mask, B, T, current_device() != Device::cpu);
    d.a.grad_scale = grad_scale;  // an MoE layer's load-balancing loss: the main loss's scale (not the depths')

    embedding_forward(d.emb, d.a, B, T, key, depth_name(k) + "embedding.dropout");
    layernorm_input(d.en, d.en_mean, d.en_rstd, d.emb, w.enorm_w, w.enorm_b, Ns);
    layernorm_input(d.hn, d.hn_mean, d.hn_rstd, input_row(prev.lnf, row0), w.hnorm_w, w.hnorm_b, Ns);
    // eh_proj's input: every row's enorm output, then its hnorm output (all-gathered with sequence
    // parallelism).
    for (int half = 0; half < 2; ++half) {
      const float* rows = half ? d.hn : d.en;
      if (sp) {
        copy_on_device(sc.ln_full + row0 * C, rows, size_t(Ns * C) * sizeof(float));
        gather_from_sequence_parallel_region(tp_, sc.ln_full, N, C);
        rows = sc.ln_full;
      }
      copy_rows_on_device(d.cat + half * C, size_t(2 * C) * sizeof(float), rows, size_t(C) * sizeof(float),
                          size_t(C) * sizeof(float), size_t(N));
    }
    // eh_proj: this rank's Cl output columns of every row; with P ranks all-gathered along the
    // columns (Megatron's gather_from_tensor_model_parallel_region), then this rank's rows.
    if (P == 1) {
      linear_forward(d.a.resid[0], d.cat, params_.param(w.eh_proj_w), nullptr, N, 2 * C, C, site(w.eh_proj_w));
    } else {
      float* parts = sc.d_c2;  // [P, N, Cl]
      linear_forward(parts + tp_.rank() * N * Cl, d.cat, params_.param(w.eh_proj_w), nullptr, N, 2 * C, Cl,
                     site(w.eh_proj_w));
      tp_.comm->all_gather(parts, std::vector<int64_t>(size_t(P), N * Cl));
      float* full = sp ? sc.d_c1 : d.a.resid[0];
      for (int64_t r = 0; r < P; ++r)
        copy_rows_on_device(full + r * Cl, size_t(C) * sizeof(float), parts + r * N * Cl, size_t(Cl) * sizeof(float),
                            size_t(Cl) * sizeof(float), size_t(N));
      if (sp) copy_on_device(d.a.resid[0], sc.d_c1 + row0 * C, size_t(Ns * C) * sizeof(float));
    }
    // The transformer layer with final_layernorm after it (every row, for the output layer).
    forward_layer(w.layer, d.a, 0, B, T, key, true, false,
                  NextNorm{input_row(d.a.lnf, row0), d.a.lnf_mean, d.a.lnf_rstd, w.norm_w, w.norm_b});
    if (cfg_.moe_layer(w.layer.layer)) track_moe_forward(w.layer, d.a, 0, layers_.size() + size_t(k), B, T);
    gather_input_rows(d.a.lnf, N);
    // The loss on the shifted targets, and the output layer's backward now: the logits' buffer is
    // the next depth's, then the main model's. Each micro-batch's mean is tracked (Megatron's
    // MTPLossLoggingHelper), over its tokens with a target.
    const LossSum l = output_loss(d.a, d.mask.data(), B, T, true, scale);
    if (l.count > 0) {
      mtp_losses_[size_t(k)].sum += l.sum / l.count;
      mtp_losses_[size_t(k)].count += 1;
    }
    const LayerNormDout d_out = output_layer_backward(d.a, N);
    copy_on_device(d.d_out, d_out.f32, size_t(Ns * C) * sizeof(float));
  }
}

void GPTModel::mtp_backward(Activations& a, int slot, int64_t B, int64_t T, const MicroBatchKey& key) {
  Scratch& sc = *scratch_;
  const bool sp = tp_.sp();
  const int64_t K = cfg_.mtp_num_layers, N = B * T, C = cfg_.hidden_size, P = tp_.size(), Cl = C / P;
  const int64_t Ns = tp_.shard_rows(N), row0 = tp_.shard_begin(N);
  for (int64_t k = K; k-- > 0;) {
    MtpDepth& d = mtp_acts_[size_t(slot * K + k)];
    const MtpParams& w = mtp_[size_t(k)];
    const Activations& prev = k == 0 ? a : mtp_acts_[size_t(slot * K + k - 1)].a;
    grads_pending_ = cfg_.mtp_use_repeated_layer && k > 0;  // (the shared parameters' gradients: depth 0 announces)
    // final_layernorm and the transformer layer: d_resid = d(eh_proj's output rows here).
    const LayerNormDout d_norm(d.d_out);
    backward_layers(&w.layer, -1, d.a, &d_norm, w.norm_w, w.norm_b, B, T, key);
    // eh_proj: the output gradient's columns of this rank for every row; its input gradient
    // reduced over the group (reduce-scattered to this rank's rows with sequence parallelism).
    const float* dy = sc.d_resid;
    if (sp) {
      copy_on_device(sc.d_c1 + row0 * C, sc.d_resid, size_t(Ns * C) * sizeof(float));
      gather_from_sequence_parallel_region(tp_, sc.d_c1, N, C);
      dy = sc.d_c1;
    }
    if (P > 1) {
      copy_rows_on_device(sc.d_c2, size_t(Cl) * sizeof(float), dy + tp_.rank() * Cl, size_t(C) * sizeof(float),
                          size_t(Cl) * sizeof(float), size_t(N));
      dy = sc.d_c2;
    }
    column_parallel_linear_backward(tp_, sc.mtp_d_cat, sc.mtp_d_cat_s, params_.grad(w.eh_proj_w), nullptr, dy, d.cat,
                                    params_.param(w.eh_proj_w), N, 2 * C, Cl, site(w.eh_proj_w));
    const float* d_cat = sp ? sc.mtp_d_cat_s : sc.mtp_d_cat;  // [Ns, 2C]
    float* d_en = sc.d_c1;  // [Ns, C] enorm's output gradient
    float* d_hn = sc.d_c2;  // [Ns, C] hnorm's
    copy_rows_on_device(d_en, size_t(C) * sizeof(float), d_cat, size_t(2 * C) * sizeof(float),
                        size_t(C) * sizeof(float), size_t(Ns));
    copy_rows_on_device(d_hn, size_t(C) * sizeof(float), d_cat + C, size_t(2 * C) * sizeof(float),
                        size_t(C) * sizeof(float), size_t(Ns));
    // hnorm: into the previous depth's output gradient (the main final LayerNorm's at depth 1).
    float* d_prev = k > 0 ? mtp_acts_[size_t(slot * K + k - 1)].d_out : sc.mtp_d_h;
    if (k == 0) zero_on_device(sc.mtp_d_h, size_t(Ns * C) * sizeof(float));
    layernorm_backward(d_prev, params_.grad(w.hnorm_w), bias_grad(w.hnorm_b), d_hn, input_row(prev.lnf, row0),
                       norm_weight(w.hnorm_w), d.hn_mean, d.hn_rstd, Ns, C, {}, normalization());
    // enorm, then the embedding of the shifted inputs.
    zero_on_device(sc.d_resid, size_t(Ns * C) * sizeof(float));
    layernorm_backward(sc.d_resid, params_.grad(w.enorm_w), bias_grad(w.enorm_b), d_en, d.emb, norm_weight(w.enorm_w),
                       d.en_mean, d.en_rstd, Ns, C, {}, normalization());
    embedding_backward_from(d.a, B, T, key, depth_name(k) + "embedding.dropout");
    grads_ready({w.enorm_w, w.enorm_b, w.hnorm_w, w.hnorm_b, w.eh_proj_w});
  }
  grads_pending_ = false;
}

std::vector<LossSum> GPTModel::take_mtp_losses() {
  std::vector<LossSum> l = mtp_losses_;
  std::fill(mtp_losses_.begin(), mtp_losses_.end(), LossSum{});
  return l;
}

}  // namespace lattice
