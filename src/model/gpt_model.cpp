#include "model/gpt_model.h"

#include <cmath>
#include <cstring>
#include <string>

#include "blas/gemm.h"
#include "kernels/activation.h"
#include "kernels/attention.h"
#include "kernels/cross_entropy.h"
#include "kernels/dropout.h"
#include "kernels/elementwise.h"
#include "kernels/embedding.h"
#include "kernels/layernorm.h"
#include "model/linear.h"

namespace lattice {

// Everything one micro-batch keeps between forward and backward, plus backward scratch.
struct GPTModel::Activations {
  struct Layer {
    float* ln1;        // [N, C]
    float* ln1_mean;   // [N]
    float* ln1_rstd;   // [N]
    float* qkv;        // [N, 3C]  ([B, T, H, 3, D])
    float* attn;       // [N, C]   ([B, T, H, D])
    float* lse;        // [B, H, T]
    float* resid_mid;  // [N, C]   residual stream after the attention block
    float* ln2;        // [N, C]
    float* ln2_mean;   // [N]
    float* ln2_rstd;   // [N]
    float* fc1;        // [N, F]   pre-activation
    float* gelu;       // [N, F]
  };
  std::vector<float*> resid;  // L+1 x [N, C]: resid[l] is layer l's input
  std::vector<Layer> layers;
  float* lnf;                 // [N, C]
  float* lnf_mean;            // [N]
  float* lnf_rstd;            // [N]
  float* logits;              // [N, Vp]  (overwritten by dlogits)
  float* losses;              // [N]
  // backward scratch
  float* d_resid;             // [N, C]
  float* d_c1;                // [N, C]
  float* d_c2;                // [N, C]
  float* d_3c;                // [N, 3C]
  float* d_f;                 // [N, F]
};

namespace {

std::string layer_name(int64_t l, const char* rest) {
  return "decoder.layers." + std::to_string(l) + "." + rest;
}

// Dropout stream ids, one per dropout site.
uint32_t dropout_stream(const std::string& site) { return fnv1a32(site.c_str()); }

}  // namespace

GPTModel::GPTModel(const TransformerConfig& config, int64_t B, int64_t T)
    : cfg_(config), max_B_(B), max_T_(T) {
  LATTICE_CHECK(cfg_.padded_vocab_size > 0) << "TransformerConfig::finalize() not called";
  LATTICE_CHECK(T <= cfg_.max_position_embeddings)
      << "--seq-length " << T << " exceeds --max-position-embeddings " << cfg_.max_position_embeddings;
  register_parameters();
  params_.allocate();
  arena_ = Arena(activation_bytes(cfg_, B, T));
  acts_ = std::make_unique<Activations>();
  allocate_activations(*acts_, arena_, cfg_, B, T);
  positions_.resize(size_t(B * T));
  inputs_.resize(size_t(B * T));
  targets_.resize(size_t(B * T));
  document_ids_.resize(size_t(B * T));
  loss_mask_.resize(size_t(B * T));
}

void GPTModel::set_document_boundaries(const DocumentBoundaries& d) {
  LATTICE_CHECK(d.eod >= 0 || !(d.eod_mask_loss || d.reset_position_ids || d.reset_attention_mask))
      << "document boundaries need an end-of-document token id";
  docs_ = d;
}

// Megatron's _get_ltor_masks_and_position_ids on the inputs: the token after an eod at t
// starts a new document, so t+1 gets position 0 and the next document id.
void GPTModel::compute_positions(const int32_t* tokens, int64_t token_stride, int64_t B, int64_t T) {
  for (int64_t b = 0; b < B; ++b) {
    const int32_t* in = tokens + b * token_stride;
    int32_t doc = 0, start = 0;
    for (int64_t t = 0; t < T; ++t) {
      positions_[size_t(b * T + t)] = docs_.reset_position_ids ? int32_t(t) - start : int32_t(t);
      document_ids_[size_t(b * T + t)] = doc;
      if (in[t] == docs_.eod) {
        ++doc;
        start = int32_t(t) + 1;
      }
    }
  }
}

const float* GPTModel::effective_loss_mask(const float* loss_mask, int64_t B, int64_t T) {
  if (!docs_.eod_mask_loss) return loss_mask;
  const int64_t N = B * T;
  for (int64_t i = 0; i < N; ++i)
    loss_mask_[size_t(i)] = inputs_[size_t(i)] == docs_.eod ? 0.0f : (loss_mask ? loss_mask[i] : 1.0f);
  return loss_mask_.data();
}

GPTModel::~GPTModel() = default;

void GPTModel::register_parameters() {
  const int64_t C = cfg_.hidden_size, F = cfg_.ffn_hidden_size, Vp = cfg_.padded_vocab_size;
  const float std = cfg_.init_method_std;
  const float out_std = std / std::sqrt(2.0f * float(cfg_.num_layers));
  wte_ = params_.add("embedding.word_embeddings.weight", {Vp, C}, ParamInit::normal, std, 0);
  wpe_ = params_.add("embedding.position_embeddings.weight", {cfg_.max_position_embeddings, C},
                     ParamInit::normal, std);
  for (int64_t l = 0; l < cfg_.num_layers; ++l) {
    LayerParams p;
    p.ln1_w = params_.add(layer_name(l, "input_layernorm.weight"), {C}, ParamInit::ones, 0);
    p.ln1_b = params_.add(layer_name(l, "input_layernorm.bias"), {C}, ParamInit::zeros, 0);
    p.qkv_w = params_.add(layer_name(l, "self_attention.linear_qkv.weight"), {3 * C, C},
                          ParamInit::normal, std, 0);
    p.qkv_b = params_.add(layer_name(l, "self_attention.linear_qkv.bias"), {3 * C},
                          ParamInit::zeros, 0, 0);
    p.proj_w = params_.add(layer_name(l, "self_attention.linear_proj.weight"), {C, C},
                           ParamInit::normal, out_std, 1);
    p.proj_b = params_.add(layer_name(l, "self_attention.linear_proj.bias"), {C}, ParamInit::zeros, 0);
    p.ln2_w = params_.add(layer_name(l, "pre_mlp_layernorm.weight"), {C}, ParamInit::ones, 0);
    p.ln2_b = params_.add(layer_name(l, "pre_mlp_layernorm.bias"), {C}, ParamInit::zeros, 0);
    p.fc1_w = params_.add(layer_name(l, "mlp.linear_fc1.weight"), {F, C}, ParamInit::normal, std, 0);
    p.fc1_b = params_.add(layer_name(l, "mlp.linear_fc1.bias"), {F}, ParamInit::zeros, 0, 0);
    p.fc2_w = params_.add(layer_name(l, "mlp.linear_fc2.weight"), {C, F}, ParamInit::normal, out_std, 1);
    p.fc2_b = params_.add(layer_name(l, "mlp.linear_fc2.bias"), {C}, ParamInit::zeros, 0);
    layers_.push_back(p);
  }
  lnf_w_ = params_.add("decoder.final_layernorm.weight", {C}, ParamInit::ones, 0);
  lnf_b_ = params_.add("decoder.final_layernorm.bias", {C}, ParamInit::zeros, 0);
  if (cfg_.untie_embeddings_and_output_weights)
    out_w_ = params_.add("output_layer.weight", {Vp, C}, ParamInit::normal, std, 0);
}

void GPTModel::init_parameters(uint64_t seed) { params_.initialize(seed); }

const float* GPTModel::output_weight() const { return params_.param(out_w_ >= 0 ? out_w_ : wte_); }
float* GPTModel::output_weight_grad() { return params_.grad(out_w_ >= 0 ? out_w_ : wte_); }

void GPTModel::allocate_activations(Activations& a, Arena& arena, const TransformerConfig& cfg,
                                    int64_t B, int64_t T) {
  const int64_t N = B * T, C = cfg.hidden_size, F = cfg.ffn_hidden_size;
  const int64_t H = cfg.num_attention_heads, Vp = cfg.padded_vocab_size;
  a.resid.clear();
  a.layers.clear();
  for (int64_t l = 0; l <= cfg.num_layers; ++l) a.resid.push_back(arena.alloc_f32(N * C, "residual"));
  for (int64_t l = 0; l < cfg.num_layers; ++l) {
    Activations::Layer x;
    x.ln1 = arena.alloc_f32(N * C, "input_layernorm");
    x.ln1_mean = arena.alloc_f32(N);
    x.ln1_rstd = arena.alloc_f32(N);
    x.qkv = arena.alloc_f32(N * 3 * C, "linear_qkv");
    x.attn = arena.alloc_f32(N * C, "core_attention");
    x.lse = arena.alloc_f32(B * H * T, "attention lse");
    x.resid_mid = arena.alloc_f32(N * C, "residual");
    x.ln2 = arena.alloc_f32(N * C, "pre_mlp_layernorm");
    x.ln2_mean = arena.alloc_f32(N);
    x.ln2_rstd = arena.alloc_f32(N);
    x.fc1 = arena.alloc_f32(N * F, "linear_fc1");
    x.gelu = arena.alloc_f32(N * F, "gelu");
    a.layers.push_back(x);
  }
  a.lnf = arena.alloc_f32(N * C, "final_layernorm");
  a.lnf_mean = arena.alloc_f32(N);
  a.lnf_rstd = arena.alloc_f32(N);
  a.logits = arena.alloc_f32(N * Vp, "logits");
  a.losses = arena.alloc_f32(N, "losses");
  a.d_resid = arena.alloc_f32(N * C, "grad");
  a.d_c1 = arena.alloc_f32(N * C, "grad");
  a.d_c2 = arena.alloc_f32(N * C, "grad");
  a.d_3c = arena.alloc_f32(N * 3 * C, "grad");
  a.d_f = arena.alloc_f32(N * F, "grad");
}

size_t GPTModel::activation_bytes(const TransformerConfig& cfg, int64_t B, int64_t T) {
  Arena counter = Arena::counting();
  Activations a;
  allocate_activations(a, counter, cfg, B, T);
  return counter.used();
}

void GPTModel::forward_hidden(Activations& a, const int32_t* tokens, int64_t token_stride,
                              int64_t B, int64_t T, const MicroBatchKey& key) {
  LATTICE_CHECK(B <= max_B_ && T <= max_T_)
      << "micro-batch " << B << "x" << T << " exceeds the model's " << max_B_ << "x" << max_T_;
  const int64_t N = B * T, C = cfg_.hidden_size, F = cfg_.ffn_hidden_size;
  const int64_t H = cfg_.num_attention_heads, D = cfg_.kv_channels;
  const float p_hidden = key.training ? cfg_.hidden_dropout : 0.0f;
  const float p_attn = key.training ? cfg_.attention_dropout : 0.0f;
  const float eps = cfg_.layernorm_epsilon;

  // Inputs are tokens[b, 0:T] of rows with stride token_stride.
  std::vector<int32_t>& inputs = inputs_;
  for (int64_t b = 0; b < B; ++b)
    for (int64_t t = 0; t < T; ++t) inputs[b * T + t] = tokens[b * token_stride + t];
  compute_positions(tokens, token_stride, B, T);
  const int32_t* doc_ids = docs_.reset_attention_mask ? document_ids_.data() : nullptr;
  embedding_forward(a.resid[0], inputs.data(), positions_.data(), params_.param(wte_),
                    params_.param(wpe_), N, C);
  PhiloxStream emb_stream{key.seed, dropout_stream("embedding.dropout"), uint32_t(key.iteration),
                          uint32_t(key.micro_batch)};
  dropout_forward(a.resid[0], a.resid[0], N * C, p_hidden, emb_stream, 0);

  for (int64_t l = 0; l < cfg_.num_layers; ++l) {
    const LayerParams& p = layers_[l];
    Activations::Layer& x = a.layers[l];
    const float* in = a.resid[l];
    layernorm_forward(x.ln1, x.ln1_mean, x.ln1_rstd, in, params_.param(p.ln1_w),
                      params_.param(p.ln1_b), N, C, eps);
    linear_forward(x.qkv, x.ln1, params_.param(p.qkv_w), params_.param(p.qkv_b), N, C, 3 * C);
    AttentionDropout ad{p_attn,
                        PhiloxStream{key.seed, dropout_stream(layer_name(l, "core_attention.dropout")),
                                     uint32_t(key.iteration), uint32_t(key.micro_batch)},
                        0};
    attention_forward(x.attn, x.lse, x.qkv, AttentionShape{B, T, H, D}, ad, doc_ids);
    // resid_mid = in + dropout(proj(attn))
    linear_forward(a.d_c1, x.attn, params_.param(p.proj_w), params_.param(p.proj_b), N, C, C);
    PhiloxStream s1{key.seed, dropout_stream(layer_name(l, "self_attention.dropout")),
                    uint32_t(key.iteration), uint32_t(key.micro_batch)};
    dropout_forward(a.d_c1, a.d_c1, N * C, p_hidden, s1, 0);
    add_forward(x.resid_mid, in, a.d_c1, N * C);
    // out = resid_mid + dropout(fc2(gelu(fc1(ln2(resid_mid)))))
    layernorm_forward(x.ln2, x.ln2_mean, x.ln2_rstd, x.resid_mid, params_.param(p.ln2_w),
                      params_.param(p.ln2_b), N, C, eps);
    linear_forward(x.fc1, x.ln2, params_.param(p.fc1_w), params_.param(p.fc1_b), N, C, F);
    gelu_forward(x.gelu, x.fc1, N * F, cfg_.gelu);
    linear_forward(a.d_c1, x.gelu, params_.param(p.fc2_w), params_.param(p.fc2_b), N, F, C);
    PhiloxStream s2{key.seed, dropout_stream(layer_name(l, "mlp.dropout")), uint32_t(key.iteration),
                    uint32_t(key.micro_batch)};
    dropout_forward(a.d_c1, a.d_c1, N * C, p_hidden, s2, 0);
    add_forward(a.resid[l + 1], x.resid_mid, a.d_c1, N * C);
  }
  layernorm_forward(a.lnf, a.lnf_mean, a.lnf_rstd, a.resid[cfg_.num_layers],
                    params_.param(lnf_w_), params_.param(lnf_b_), N, C, eps);
}

void GPTModel::backward_hidden(Activations& a, const int32_t* tokens, int64_t token_stride,
                               int64_t B, int64_t T, const MicroBatchKey& key) {
  const int64_t N = B * T, C = cfg_.hidden_size, F = cfg_.ffn_hidden_size;
  const int64_t H = cfg_.num_attention_heads, D = cfg_.kv_channels;
  const float p_hidden = key.training ? cfg_.hidden_dropout : 0.0f;
  const float p_attn = key.training ? cfg_.attention_dropout : 0.0f;

  // a.d_c2 holds d(lnf output). Final LayerNorm backward into d_resid.
  std::memset(a.d_resid, 0, size_t(N * C) * sizeof(float));
  layernorm_backward(a.d_resid, params_.grad(lnf_w_), params_.grad(lnf_b_), a.d_c2,
                     a.resid[cfg_.num_layers], params_.param(lnf_w_), a.lnf_mean, a.lnf_rstd, N, C);
  grads_ready({lnf_w_, lnf_b_});

  for (int64_t l = cfg_.num_layers - 1; l >= 0; --l) {
    const LayerParams& p = layers_[l];
    Activations::Layer& x = a.layers[l];
    // MLP block: d_resid is d(layer output) and stays as the residual path's gradient.
    PhiloxStream s2{key.seed, dropout_stream(layer_name(l, "mlp.dropout")), uint32_t(key.iteration),
                    uint32_t(key.micro_batch)};
    dropout_backward(a.d_c1, a.d_resid, N * C, p_hidden, s2, 0);
    linear_backward(a.d_f, params_.grad(p.fc2_w), params_.grad(p.fc2_b), a.d_c1, x.gelu,
                    params_.param(p.fc2_w), N, F, C);
    gelu_backward(a.d_f, x.fc1, a.d_f, N * F, cfg_.gelu);
    linear_backward(a.d_c1, params_.grad(p.fc1_w), params_.grad(p.fc1_b), a.d_f, x.ln2,
                    params_.param(p.fc1_w), N, C, F);
    layernorm_backward(a.d_resid, params_.grad(p.ln2_w), params_.grad(p.ln2_b), a.d_c1,
                       x.resid_mid, params_.param(p.ln2_w), x.ln2_mean, x.ln2_rstd, N, C);
    // Attention block: d_resid is now d(resid_mid).
    PhiloxStream s1{key.seed, dropout_stream(layer_name(l, "self_attention.dropout")),
                    uint32_t(key.iteration), uint32_t(key.micro_batch)};
    dropout_backward(a.d_c1, a.d_resid, N * C, p_hidden, s1, 0);
    linear_backward(a.d_c2, params_.grad(p.proj_w), params_.grad(p.proj_b), a.d_c1, x.attn,
                    params_.param(p.proj_w), N, C, C);
    AttentionDropout ad{p_attn,
                        PhiloxStream{key.seed, dropout_stream(layer_name(l, "core_attention.dropout")),
                                     uint32_t(key.iteration), uint32_t(key.micro_batch)},
                        0};
    attention_backward(a.d_3c, a.d_c2, x.qkv, x.attn, x.lse, AttentionShape{B, T, H, D}, ad,
                       docs_.reset_attention_mask ? document_ids_.data() : nullptr);
    linear_backward(a.d_c1, params_.grad(p.qkv_w), params_.grad(p.qkv_b), a.d_3c, x.ln1,
                    params_.param(p.qkv_w), N, C, 3 * C);
    layernorm_backward(a.d_resid, params_.grad(p.ln1_w), params_.grad(p.ln1_b), a.d_c1,
                       a.resid[l], params_.param(p.ln1_w), x.ln1_mean, x.ln1_rstd, N, C);
    grads_ready({p.ln1_w, p.ln1_b, p.qkv_w, p.qkv_b, p.proj_w, p.proj_b, p.ln2_w, p.ln2_b, p.fc1_w,
                 p.fc1_b, p.fc2_w, p.fc2_b});
  }
  // Embedding: d_resid is d(embedding output after dropout).
  PhiloxStream emb_stream{key.seed, dropout_stream("embedding.dropout"), uint32_t(key.iteration),
                          uint32_t(key.micro_batch)};
  dropout_backward(a.d_resid, a.d_resid, N * C, p_hidden, emb_stream, 0);
  std::vector<int32_t>& inputs = inputs_;
  for (int64_t b = 0; b < B; ++b)
    for (int64_t t = 0; t < T; ++t) inputs[b * T + t] = tokens[b * token_stride + t];
  embedding_backward(params_.grad(wte_), params_.grad(wpe_), a.d_resid, inputs.data(),
                     positions_.data(), N, C);
  grads_ready({wpe_, wte_});
}

double GPTModel::forward_backward(const int32_t* tokens, const float* loss_mask, int64_t B,
                                  int64_t T, float grad_scale, const MicroBatchKey& key) {
  Activations& a = *acts_;
  const int64_t N = B * T, C = cfg_.hidden_size, V = cfg_.vocab_size, Vp = cfg_.padded_vocab_size;
  forward_hidden(a, tokens, T + 1, B, T, key);
  // logits[N, Vp] = lnf @ Wout^T
  gemm_f32(Trans::N, Trans::T, N, Vp, C, 1.0f, a.lnf, C, output_weight(), C, 0.0f, a.logits, Vp);
  std::vector<int32_t>& targets = targets_;
  for (int64_t b = 0; b < B; ++b)
    for (int64_t t = 0; t < T; ++t) targets[b * T + t] = tokens[b * (T + 1) + t + 1];
  loss_mask = effective_loss_mask(loss_mask, B, T);
  double mask_sum = double(N);
  if (loss_mask) {
    mask_sum = 0;
    for (int64_t i = 0; i < N; ++i) mask_sum += loss_mask[i];
  }
  const float token_scale = mask_sum > 0 ? float(1.0 / mask_sum) : 0.0f;
  cross_entropy_forward_backward(a.logits, a.losses, targets.data(), loss_mask,
                                 grad_scale * token_scale, N, V, Vp);
  double loss = 0;
  for (int64_t i = 0; i < N; ++i) loss += double(a.losses[i]) * (loss_mask ? loss_mask[i] : 1.0f);
  loss = mask_sum > 0 ? loss / mask_sum : 0.0;
  // dWout += dlogits^T @ lnf;  d(lnf) = dlogits @ Wout
  gemm_f32(Trans::T, Trans::N, Vp, C, N, 1.0f, a.logits, Vp, a.lnf, C, 1.0f, output_weight_grad(), C);
  if (out_w_ >= 0) grads_ready({out_w_});
  gemm_f32(Trans::N, Trans::N, N, C, Vp, 1.0f, a.logits, Vp, output_weight(), C, 0.0f, a.d_c2, C);
  backward_hidden(a, tokens, T + 1, B, T, key);
  return loss;
}

double GPTModel::forward_loss(const int32_t* tokens, const float* loss_mask, int64_t B, int64_t T) {
  const LossSum l = forward_loss_sum(tokens, loss_mask, B, T);
  return l.count > 0 ? l.sum / l.count : 0.0;
}

LossSum GPTModel::forward_loss_sum(const int32_t* tokens, const float* loss_mask, int64_t B, int64_t T) {
  Activations& a = *acts_;
  const int64_t N = B * T, C = cfg_.hidden_size, V = cfg_.vocab_size, Vp = cfg_.padded_vocab_size;
  MicroBatchKey key;
  key.training = false;
  forward_hidden(a, tokens, T + 1, B, T, key);
  gemm_f32(Trans::N, Trans::T, N, Vp, C, 1.0f, a.lnf, C, output_weight(), C, 0.0f, a.logits, Vp);
  std::vector<int32_t>& targets = targets_;
  for (int64_t b = 0; b < B; ++b)
    for (int64_t t = 0; t < T; ++t) targets[b * T + t] = tokens[b * (T + 1) + t + 1];
  cross_entropy_forward(a.losses, a.logits, targets.data(), N, V, Vp);
  loss_mask = effective_loss_mask(loss_mask, B, T);
  LossSum l;
  for (int64_t i = 0; i < N; ++i) {
    const float m = loss_mask ? loss_mask[i] : 1.0f;
    l.sum += double(a.losses[i]) * m;
    l.count += m;
  }
  return l;
}

void GPTModel::forward_logits(const int32_t* inputs, int64_t B, int64_t T, float* logits) {
  Activations& a = *acts_;
  const int64_t N = B * T, C = cfg_.hidden_size, Vp = cfg_.padded_vocab_size;
  MicroBatchKey key;
  key.training = false;
  forward_hidden(a, inputs, T, B, T, key);
  gemm_f32(Trans::N, Trans::T, N, Vp, C, 1.0f, a.lnf, C, output_weight(), C, 0.0f, logits, Vp);
}

void GPTModel::forward_last_logits(const int32_t* inputs, int64_t T, float* logits) {
  Activations& a = *acts_;
  const int64_t C = cfg_.hidden_size, Vp = cfg_.padded_vocab_size;
  MicroBatchKey key;
  key.training = false;
  forward_hidden(a, inputs, T, 1, T, key);
  gemm_f32(Trans::N, Trans::T, 1, Vp, C, 1.0f, a.lnf + (T - 1) * C, C, output_weight(), C, 0.0f,
           logits, Vp);
}

}  // namespace lattice
