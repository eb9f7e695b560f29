#include "model/gpt_model.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <sstream>
#include <string>

#include "blas/gemm.h"
#include "core/device.h"
#include "dist/comm.h"
#include "kernels/activation.h"
#include "kernels/attention.h"
#include "kernels/attention_gate.h"
#include "kernels/cross_entropy.h"
#include "kernels/dropout.h"
#include "kernels/elementwise.h"
#include "kernels/embedding.h"
#include "kernels/layernorm.h"
#include "kernels/rope.h"
#include "kernels/swiglu.h"
#include "model/gated_delta_net.h"
#include "model/mamba_mixer.h"
#include "model/gpt_model_buffers.h"
#include "model/linear.h"

namespace lattice {

namespace {

std::string layer_name(int64_t l, const char* rest) {
  return "decoder.layers." + std::to_string(l) + "." + rest;
}



// Megatron's conditions: the sequence splits into 2P chunks, one pair per rank; with Mamba layers P divides
// each tensor-parallel rank's Mamba heads and groups.
void check_context_parallel(const TransformerConfig& c, const ContextParallel& cp, int64_t T, int64_t tp) {
  if (!cp.on()) return;
  if (c.has_mamba_layers() && !mamba_context_splits_heads(c, tp, cp.size()))
    LATTICE_FAIL() << "--context-parallel-size " << cp.size() << " does not divide the Mamba heads ("
                   << c.mamba_heads() << ") and groups (--mamba-num-groups " << c.mamba_num_groups
                   << ") of each of the " << tp << " tensor-parallel rank(s): each rank runs its share of them";
  if (T % (2 * cp.size()) != 0)
    LATTICE_FAIL() << "--seq-length " << T << " is not divisible by 2 x --context-parallel-size " << cp.size()
                   << " (each rank holds two of the sequence's " << 2 * cp.size() << " chunks)";
}

void check_tensor_parallel(const TransformerConfig& c, const TensorParallel& tp, int64_t T) {
  check_tensor_parallel_split(c, tp.size());
  if (tp.sp() && T % tp.size() != 0)
    LATTICE_FAIL() << "--seq-length " << T << " is not divisible by --tensor-model-parallel-size " << tp.size()
                   << " (required by --sequence-parallel)";
}

// The recomputed groups [begin, end) of a chunk of `layers` layers (full recomputation;
// none otherwise). uniform: every layer, in groups of N consecutive layers (the last
// group may be shorter); block: the first N layers, each its own group. N is clamped to
// the chunk's layers.
std::vector<std::pair<int64_t, int64_t>> recompute_groups(const TransformerConfig& c, int64_t layers) {
  std::vector<std::pair<int64_t, int64_t>> groups;
  if (c.recompute_granularity != "full") return groups;
  const int64_t n = std::min(c.recompute_num_layers, layers);
  if (c.recompute_method == "uniform") {
    for (int64_t b = 0; b < layers; b += n) groups.emplace_back(b, std::min(b + n, layers));
  } else {
    for (int64_t i = 0; i < n; ++i) groups.emplace_back(i, i + 1);
  }
  return groups;
}

ModelPlacement complete(ModelPlacement p, const TransformerConfig& c) {
  if (p.chunks.empty()) p.chunks.push_back({0, c.num_layers});
  LATTICE_CHECK(p.slots >= 1) << "a chunk needs at least one activation slot";
  for (auto [b, e] : p.chunks)
    LATTICE_CHECK(0 <= b && b <= e && e <= c.num_layers) << "chunk [" << b << ", " << e << ") outside the "
                                                         << c.num_layers << " layers";
  return p;
}

}  // namespace

GPTModel::GPTModel(const TransformerConfig& config, int64_t B, int64_t T, const TensorParallel& tp,
                   const ModelPlacement& placement, Comm* expert_parallel, const ContextParallel& context_parallel,
                   bool gradients)
    : cfg_(config),
      tp_(tp),
      cp_(context_parallel),
      place_(complete(placement, config)),
      ep_(expert_parallel && expert_parallel->size() > 1 ? expert_parallel : nullptr),
      max_B_(B),
      max_T_(T / context_parallel.size()) {
  LATTICE_CHECK(cfg_.padded_vocab_size > 0) << "TransformerConfig::finalize() not called";
  check_context_parallel(cfg_, cp_, T, tp_.size());
  if (ep_) {
    LATTICE_CHECK(cfg_.num_experts > 0) << "--expert-model-parallel-size " << ep_->size() << " needs --num-experts";
    LATTICE_CHECK(cfg_.num_experts % ep_->size() == 0)
        << "--num-experts " << cfg_.num_experts << " is not divisible by --expert-model-parallel-size " << ep_->size();
  }
  if (cfg_.mtp() && cfg_.hidden_size % tp_.size() != 0)
    LATTICE_FAIL() << "--hidden-size " << cfg_.hidden_size << " is not divisible by --tensor-model-parallel-size "
                   << tp_.size() << " (required by --mtp-num-layers: eh_proj's outputs are split over the ranks)";
  if (cfg_.mtp() && place_.post_process && !place_.pre_process && cfg_.learned_positions())
    LATTICE_FAIL() << "--mtp-num-layers with --pipeline-model-parallel-size > 1 needs --position-embedding-type rope "
                      "or none: the last stage's prediction depths have no position table";
  experts_whole_ = cfg_.experts_whole(tp_.size());
  if (experts_whole_) {  // Megatron's condition for MoE under tensor parallelism
    if (!tp_.sp())
      LATTICE_FAIL() << "--expert-tensor-parallel-size 1 needs --sequence-parallel (each tensor-parallel rank routes "
                        "its own rows)";
  }
  local_experts_ = cfg_.num_experts / (ep_ ? ep_->size() : 1);
  first_expert_ = ep_ ? local_experts_ * ep_->rank() : 0;
  cfg_.check_recompute();
  selective_ = cfg_.recompute_core_attention();
  LATTICE_CHECK(T <= cfg_.max_position_embeddings)
      << "--seq-length " << T << " exceeds --max-position-embeddings " << cfg_.max_position_embeddings;
  check_tensor_parallel(cfg_, tp_, max_T_);
  const int64_t P = tp_.size();
  Hl_ = cfg_.num_attention_heads / P;
  Fl_ = cfg_.ffn_hidden_size / P;
  Gl_ = cfg_.num_query_groups / P;
  Vl_ = cfg_.padded_vocab_size / P;
  vocab_begin_ = Vl_ * tp_.rank();
  vocab_valid_ = std::clamp<int64_t>(cfg_.vocab_size - vocab_begin_, 0, Vl_);
  register_parameters();
  params_.allocate(gradients);
  if (cfg_.apply_layernorm_1p) allocate_norm_1p();
  if (cfg_.rope()) rope_ = std::make_unique<RotaryEmbedding>(cfg_, cfg_.max_position_embeddings);
  if (cfg_.longrope()) rope_long_ = std::make_unique<RotaryEmbedding>(cfg_, cfg_.max_position_embeddings, true);
  if (!cfg_.add_bias_linear || cfg_.rmsnorm() || cfg_.qk_l2_norm) {  // zeros for the kernels that add a bias; a sink
    const size_t n = size_t(std::max({cfg_.max_qkv_width() / P, fc1_local(), cfg_.hidden_size,  // for those
                                      cfg_.q_lora_rank, cfg_.kv_lora_rank,                      // that sum one
                                      cfg_.linear_value_head_dim}));
    no_bias_.resize(n);
    bias_grad_sink_.resize(n);
  }
  if (cfg_.qk_l2_norm) {  // the unit weights of --qk-l2-norm's weightless RMSNorm [D]
    const std::vector<float> ones(size_t(cfg_.kv_channels), 1.0f);
    copy_to_device(qk_l2_ones_.resize(ones.size()), ones.data(), ones.size() * sizeof(float));
  }
  if (cfg_.softmax_type == "off-by-one") zero_offsets_.resize(size_t(Hl_));
  try {
    arena_ = Arena(activation_bytes(cfg_, B, max_T_, tp_, place_, ep_ ? ep_->size() : 1, cp_.size()));
  } catch (const OutOfMemory& e) {
    std::ostringstream what;
    what << "the activations (micro-batch " << B << " x " << max_T_ << " tokens, " << place_.slots << " in flight)";
    throw e.with_context(what.str());
  }
  if (cp_.on()) {  // context_parallel_bytes()
    const int64_t kv = B * T * 2 * Gl_ * cfg_.kv_channels;
    cp_kv_.resize(size_t(kv));
    cp_staging_.resize(size_t(kv));
    cp_recv_.resize(size_t(kv / cp_.size()));
    // The GDN and Mamba layers' whole-sequence buffers, each in an arena of the size a counting carve finds.
    auto carved = [&](auto& buffers) {
      buffers = std::make_unique<typename std::decay_t<decltype(buffers)>::element_type>();
      Arena counter = Arena::counting();
      buffers->carve(counter, cfg_, P, cp_.size(), B, T);
      buffers->arena = Arena(counter.used());
      buffers->carve(buffers->arena, cfg_, P, cp_.size(), B, T);
    };
    if (cfg_.gated_delta_net()) carved(gdn_cp_);
    if (cfg_.has_mamba_layers()) carved(mamba_cp_);
  }
  T = max_T_;  // the buffers below hold this rank's rows
  scratch_ = std::make_unique<Scratch>();
  allocate(acts_, mtp_acts_, *scratch_, arena_, cfg_, tp_, place_, B, T, ep_ ? ep_->size() : 1, cp_.size());
  std::vector<Activations*> all;
  for (Activations& a : acts_) all.push_back(&a);
  for (MtpDepth& d : mtp_acts_) all.push_back(&d.a);
  for (Activations* a : all) {
    a->n = B * T;
    a->ids.resize(size_t(4 * B * T));
    if (cp_.on()) a->key_ids.resize(size_t(B * T * cp_.size()));
    if (current_device() != Device::cpu) a->row_groups.resize(size_t(2 * (2 * B * T + 1)));
    a->loss_mask.resize(size_t(B * T));
  }
  mtp_losses_.assign(size_t(cfg_.mtp_num_layers), LossSum{});
  row_max_.resize(size_t(B * T));
  ce_stats_.resize(size_t(2 * B * T));
}

GPTModel::~GPTModel() = default;

GPTModel::GPTModel(RegistryOnly, const TransformerConfig& config, const TensorParallel& tp,
                   const ModelPlacement& placement, int ep_rank, int ep_size)
    : cfg_(config), tp_(tp), place_(complete(placement, config)), max_B_(0), max_T_(0) {
  experts_whole_ = cfg_.experts_whole(tp_.size());
  local_experts_ = cfg_.num_experts / ep_size;
  first_expert_ = local_experts_ * ep_rank;
  register_parameters();
}

ParamBuffer GPTModel::parameter_registry(const TransformerConfig& config, const TensorParallel& tp,
                                         const ModelPlacement& placement, int ep_rank, int ep_size) {
  GPTModel registry(RegistryOnly{}, config, tp, placement, ep_rank, ep_size);
  registry.params_.assign_offsets();  // (allocate()'s first step)
  return std::move(registry.params_);
}

void GPTModel::set_document_boundaries(const DocumentBoundaries& d) {
  LATTICE_CHECK(d.eod >= 0 || !(d.eod_mask_loss || d.reset_position_ids || d.reset_attention_mask))
      << "document boundaries need an end-of-document token id";
  docs_ = d;
}

// Megatron's _get_ltor_masks_and_position_ids on the inputs: the token after an eod at t
// starts a new document, so t+1 gets position 0 and the next document id.
void GPTModel::prepare_inputs(Activations& a, const int32_t* tokens, int64_t token_stride, int64_t B, int64_t T,
                              bool labels, bool group_rows, const int32_t* segments) {
  // (before a row is written: a larger micro-batch would run past the buffers; a rank's rows are T / CP of each)
  const int64_t Tl = cp_.on() ? T / cp_.size() : T;
  LATTICE_CHECK(B <= max_B_ && Tl <= max_T_)
      << "micro-batch " << B << "x" << Tl << " exceeds the model's " << max_B_ << "x" << max_T_;
  int32_t* h = a.ids.host();
  int32_t *inputs = h, *positions = h + a.n, *document_ids = h + 2 * a.n, *targets = h + 3 * a.n;
  const int64_t V = cfg_.vocab_size;
  // Context parallelism: token t of a sequence is local row row_of[t] (-1: another rank's).
  std::vector<int64_t> row_of(static_cast<size_t>(T));
  for (int64_t t = 0; t < T; ++t) row_of[size_t(t)] = t;
  if (cp_.on()) {
    std::fill(row_of.begin(), row_of.end(), -1);
    for (const TokenRun& r : token_runs(1, Tl))
      for (int64_t k = 0; k < r.rows; ++k) row_of[size_t(r.position + k)] = r.row + k;
  }
  // --mtp-num-layers: the whole sequences' inputs, positions and targets, which the depths shift.
  const bool whole = labels && cfg_.mtp();
  if (whole) mtp_tokens_.resize(size_t(3 * B * T));
  for (int64_t b = 0; b < B; ++b) {
    const int32_t* in = tokens + b * token_stride;
    const int32_t* seg = segments ? segments + b * T : nullptr;
    int32_t doc = 0, start = 0;
    for (int64_t t = 0; t < T; ++t) {
      if (whole) {
        const size_t g = size_t(b * T + t);
        mtp_tokens_[g] = in[t];
        mtp_tokens_[size_t(B * T) + g] = docs_.reset_position_ids ? int32_t(t) - start : int32_t(t);
        mtp_tokens_[size_t(2 * B * T) + g] = in[t + 1];
      }
      const int64_t row = row_of[size_t(t)];
      if (cp_.on()) a.key_ids.host()[b * T + t] = doc;
      if (row >= 0) {
        const size_t i = size_t(b * Tl + row);
        inputs[i] = in[t];
        positions[i] = docs_.reset_position_ids ? int32_t(t) - start : int32_t(t);
        document_ids[i] = doc;
        if (labels) {
          const int32_t y = in[t + 1];
          LATTICE_CHECK(y >= 0 && y < V) << "label " << y << " at (" << b << ", " << t << ") not in [0, " << V << ")";
          targets[i] = y;
        }
      }
      // every rank counts every document end of the sequence
      if (seg ? t + 1 < T && seg[t + 1] != seg[t] : in[t] == docs_.eod) {
        ++doc;
        start = int32_t(t) + 1;
      }
    }
  }
  a.ids.upload(size_t(4 * a.n));
  if (cp_.on()) a.key_ids.upload(size_t(B * T));
  a.groups = {};
  if (group_rows) group_embedding_rows(a, B * Tl);
}

void GPTModel::group_embedding_rows(Activations& a, int64_t N) {
  const int64_t room = 2 * N + 1;
  const int32_t* h = a.ids.host();
  int32_t* g = a.row_groups.host();
  const int64_t tokens_count = group_rows_by_index(h, N, g);                // the inputs
  const int64_t positions_count = group_rows_by_index(h + a.n, N, g + room);  // the positions
  a.row_groups.upload(size_t(2 * room));
  const int32_t* d = a.row_groups.device();
  a.groups.tokens = RowGroups{d, d + N, tokens_count};
  a.groups.positions = RowGroups{d + room, d + room + N, positions_count};
}

std::vector<GPTModel::TokenRun> GPTModel::token_runs(int64_t B, int64_t Tl) const {
  if (!cp_.on()) return {TokenRun{0, B * Tl, 0, 0}};
  const ContextSplit s = cp_.split(Tl * cp_.size());
  const int64_t c = s.chunk();
  std::vector<TokenRun> runs;
  for (int64_t b = 0; b < B; ++b)
    for (int half = 0; half < 2; ++half) {
      const int64_t position = s.chunk_index(half) * c;
      runs.push_back(TokenRun{b * Tl + half * c, c, position, b * s.T + position});
    }
  return runs;
}

std::vector<GPTModel::DropoutRun> GPTModel::dropout_runs(int64_t B, int64_t Tl, float p) const {
  const int64_t N = B * Tl, C = cfg_.hidden_size, Ns = tp_.shard_rows(N), row0 = tp_.shard_begin(N);
  if (!cp_.on() || p == 0.0f) return {DropoutRun{0, Ns, uint64_t(row0 * C)}};
  std::vector<DropoutRun> runs;
  for (const TokenRun& r : token_runs(B, Tl)) {  // the runs' parts within the shard
    const int64_t begin = std::max(r.row, row0), end = std::min(r.row + r.rows, row0 + Ns);
    if (begin < end) runs.push_back(DropoutRun{begin - row0, end - begin, uint64_t((r.token + begin - r.row) * C)});
  }
  return runs;
}

int64_t GPTModel::local_seq_length(int64_t T) const {
  if (!cp_.on()) return T;
  LATTICE_CHECK(T == max_T_ * cp_.size())
      << "context parallelism runs full-length sequences only (" << T << " tokens, the model's " << max_T_ * cp_.size()
      << ")";
  return max_T_;
}

const float* GPTModel::effective_loss_mask(Activations& a, const float* loss_mask, int64_t B, int64_t T,
                                           const float*& host) {
  host = loss_mask;
  if (!docs_.eod_mask_loss && (!loss_mask || current_device() == Device::cpu)) return loss_mask;
  const int64_t N = B * T;
  float* m = a.loss_mask.host();
  const int32_t* inputs = a.ids.host();
  for (int64_t i = 0; i < N; ++i)
    m[i] = docs_.eod_mask_loss && inputs[i] == docs_.eod ? 0.0f : (loss_mask ? loss_mask[i] : 1.0f);
  a.loss_mask.upload(size_t(N));
  host = m;
  return a.loss_mask.device();
}

// Megatron's split of each weight: column-parallel (dim 0: QKV rows grouped per head,
// fc1, the vocabulary rows of the embedding and output layer) and row-parallel (dim 1:
// proj, fc2); norms, row-parallel biases and position embeddings are replicated. Under
// pipeline parallelism a stage registers its chunks' layers under their global numbers;
// the last stage's output layer, when tied, is a copy of the word embedding under the
// same name (initialised identically, kept equal by the embedding-group all-reduce).
void GPTModel::register_parameters() {
  const int64_t C = cfg_.hidden_size, F = cfg_.ffn_hidden_size, Vp = cfg_.padded_vocab_size;
  const int64_t W = cfg_.qkv_width();
  const float std = cfg_.init_method_std;
  const float out_std = std / std::sqrt(2.0f * float(cfg_.num_layers));
  const int r = tp_.rank(), P = tp_.size();
  // --init-method-xavier-uniform: every 2-D weight drawn N(0, std) otherwise (Megatron's init_method and
  // output_layer_init_method both xavier_uniform_); the 1-D learnable softmax offsets keep N(0, std).
  auto add_split = [&](const std::string& name, const Shape& shape, ParamInit init, float s, int split, int rank,
                       int size, int blocks) {
    if (init == ParamInit::normal && shape.size() == 2 && cfg_.init_method_xavier_uniform) init = ParamInit::xavier_uniform;
    return params_.add_tp(name, shape, init, s, split, rank, size, blocks);
  };
  auto add = [&](const std::string& name, const Shape& shape, ParamInit init, float s, int split, int blocks = 1) {
    return add_split(name, shape, init, s, split, r, P, blocks);
  };
  // The word and position embeddings (every copy of the word embeddings: the tied output layer's and
  // the prediction depths' on a last stage draw the same values): Megatron's embedding_init_method,
  // N(0, s^2) with --embedding-init-method-std s (Xavier or not), else as every weight.
  auto add_embedding = [&](const std::string& name, const Shape& shape, int split) {
    if (cfg_.embedding_init_method_std >= 0)
      return params_.add_tp(name, shape, ParamInit::normal, cfg_.embedding_init_method_std, split, r, P, 1);
    return add(name, shape, ParamInit::normal, std, split);
  };
  // A routed expert's weight: split as the dense MLP's, or whole (--expert-tensor-parallel-size 1).
  auto add_expert = [&](const std::string& name, const Shape& shape, ParamInit init, float s, int split,
                        int blocks = 1) {
    return experts_whole_ ? add_split(name, shape, init, s, -1, 0, 1, 1) : add(name, shape, init, s, split, blocks);
  };
  // With SwiGLU fc1 is the gate's rows then the up projection's, each split over the ranks.
  const int64_t F1 = cfg_.fc1_width();
  const int fc1_blocks = cfg_.gated_linear_unit() ? 2 : 1;
  const bool tied = !cfg_.untie_embeddings_and_output_weights;
  const bool bias = cfg_.add_bias_linear;
  const bool norm_bias = !cfg_.rmsnorm();  // RMSNorm has a weight only
  // The norms' weights: 1, or 0 with --apply-layernorm-1p (which scales by 1 + weight).
  const ParamInit norm_init = cfg_.apply_layernorm_1p ? ParamInit::zeros : ParamInit::ones;
  const bool split_pipeline = !(place_.pre_process && place_.post_process);
  if (place_.pre_process) {
    wte_ = add_embedding("embedding.word_embeddings.weight", {Vp, C}, 0);
    if (cfg_.learned_positions())
      wpe_ = add_embedding("embedding.position_embeddings.weight", {cfg_.max_position_embeddings, C}, -1);
    // Shared with the last stage's copy: the tied output layer's, or with --mtp-num-layers the depths' lookup's.
    if ((tied || cfg_.mtp()) && split_pipeline) shared_embedding_ = wte_;
  }
  // One transformer layer's parameters under `prefix` (l: its number, which decides its kind); its MLP block's
  // under mlp_prefix when given (a hybrid's prediction depth: Megatron's inner stack holds the blocks as layers).
  std::function<void(LayerParams&, int64_t, const std::string&)> add_mixer, add_mlp;  // (below)
  auto add_layer = [&](int64_t l, const std::string& prefix, const std::string& mlp_prefix = "") {
    LayerParams p;
    p.layer = l;
    p.name = prefix;
    p.attention = cfg_.attention_block(l);
    p.mlp = cfg_.mlp_block(l);
    if (p.attention) add_mixer(p, l, prefix);
    if (!p.mlp) return p;
    const std::string& m = mlp_prefix.empty() ? prefix : mlp_prefix;
    p.ln2_w = add(m + "pre_mlp_layernorm.weight", {C}, norm_init, 0, -1);
    if (norm_bias) p.ln2_b = add(m + "pre_mlp_layernorm.bias", {C}, ParamInit::zeros, 0, -1);
    add_mlp(p, l, m);
    return p;
  };
  // Its attention block: the norm and the mixer (self-attention, GDN or Mamba).
  add_mixer = [&](LayerParams& p, int64_t l, const std::string& prefix) {
    auto lname = [&](const char* rest) { return prefix + rest; };
    const std::string norm = cfg_.mamba_layer(l) ? "norm." : "input_layernorm.";
    p.ln1_w = add(prefix + norm + "weight", {C}, norm_init, 0, -1);
    if (norm_bias) p.ln1_b = add(prefix + norm + "bias", {C}, ParamInit::zeros, 0, -1);
    if (cfg_.mamba_layer(l)) {  // Megatron-Core's MambaMixer: no linear biases, the heads and groups split
      const int64_t I = cfg_.mamba_inner(), GN = cfg_.mamba_num_groups * cfg_.mamba_state_dim, H = cfg_.mamba_heads();
      const int64_t K = TransformerConfig::kMambaConvKernel;
      const float conv_bound = 1.0f / std::sqrt(float(K));  // torch's Conv1d default: 1 / sqrt(fan_in)
      p.linear = p.mamba = true;
      // in_proj [2I + 2GN + H, C]: z, x, B, C and dt rows, each block split by heads (groups)
      p.qkv_w = params_.add_tp_blocks(lname("mixer.in_proj.weight"), {cfg_.mamba_in_proj_width(), C},
                                      cfg_.init_method_xavier_uniform ? ParamInit::xavier_uniform : ParamInit::normal,
                                      std, r, P, {I, I, GN, GN, H});
      p.conv_w = params_.add_tp_blocks(lname("mixer.conv1d.weight"), {cfg_.mamba_conv_width(), 1, K},
                                       ParamInit::uniform, conv_bound, r, P, {I, GN, GN});
      p.conv_b = params_.add_tp_blocks(lname("mixer.conv1d.bias"), {cfg_.mamba_conv_width()}, ParamInit::uniform,
                                       conv_bound, r, P, {I, GN, GN});
      p.dt_bias = add(lname("mixer.dt_bias"), {H}, ParamInit::inverse_softplus_dt, 0, 0);
      p.a_log = add(lname("mixer.A_log"), {H}, ParamInit::log_uniform, 16.0f, 0);
      p.d_skip = add(lname("mixer.D"), {H}, ParamInit::ones, 0, 0);
      p.out_norm_w = add(lname("mixer.norm.weight"), {I}, ParamInit::ones, 0, 0);
      p.proj_w = add(lname("mixer.out_proj.weight"), {C, I}, ParamInit::normal, out_std, 1);
      return;
    }
    if (cfg_.linear_attention_layer(l)) {  // Megatron-Core's GatedDeltaNet: no linear biases, the heads split
      const int64_t QK = cfg_.linear_num_key_heads * cfg_.linear_key_head_dim, V = cfg_.gdn_out_width();
      const int64_t Hv = cfg_.linear_num_value_heads, Dv = cfg_.linear_value_head_dim, K = cfg_.linear_conv_kernel_dim;
      p.linear = true;
      // in_proj [W, C]: q, k, v, z, beta's and the decay's rows, each block split by heads
      p.qkv_w = params_.add_tp_blocks(lname("self_attention.in_proj.weight"), {cfg_.gdn_in_proj_width(), C},
                                      cfg_.init_method_xavier_uniform ? ParamInit::xavier_uniform : ParamInit::normal,
                                      std, r, P, {QK, QK, V, V, Hv, Hv});
      p.conv_w = params_.add_tp_blocks(lname("self_attention.conv1d.weight"), {cfg_.gdn_conv_width(), 1, K},
                                       ParamInit::uniform, 1.0f / std::sqrt(float(K)), r, P, {QK, QK, V});
      p.dt_bias = add(lname("self_attention.dt_bias"), {Hv}, ParamInit::ones, 0, 0);
      p.a_log = add(lname("self_attention.A_log"), {Hv}, ParamInit::log_uniform, 16.0f, 0);
      p.out_norm_w = add(lname("self_attention.out_norm.weight"), {Dv}, norm_init, 0, -1);
      if (norm_bias) p.out_norm_b = add(lname("self_attention.out_norm.bias"), {Dv}, ParamInit::zeros, 0, -1);
      p.proj_w = add(lname("self_attention.out_proj.weight"), {C, V}, ParamInit::normal, out_std, 1);
    } else if (cfg_.multi_latent_attention) {  // Megatron-Core's MLASelfAttention: no biases; the down projections and
                                        // the latents' norms replicated, the up projections split by heads
      const int64_t H = cfg_.num_attention_heads, Dq = cfg_.mla_qk_dim(), Rq = cfg_.q_lora_rank;
      const int64_t Rkv = cfg_.kv_lora_rank, Dr = cfg_.qk_pos_emb_head_dim, Dnv = cfg_.qk_head_dim + cfg_.v_head_dim;
      if (Rq == 0) {
        p.q_proj_w = add(lname("self_attention.linear_q_proj.weight"), {H * Dq, C}, ParamInit::normal, std, 0);
      } else {
        p.q_down_w = add(lname("self_attention.linear_q_down_proj.weight"), {Rq, C}, ParamInit::normal, std, -1);
        if (cfg_.mla_latent_norms()) {
          p.q_norm_w = add(lname("self_attention.q_layernorm.weight"), {Rq}, norm_init, 0, -1);
          if (norm_bias) p.q_norm_b = add(lname("self_attention.q_layernorm.bias"), {Rq}, ParamInit::zeros, 0, -1);
        }
        p.q_up_w = add(lname("self_attention.linear_q_up_proj.weight"), {H * Dq, Rq}, ParamInit::normal, std, 0);
      }
      p.kv_down_w = add(lname("self_attention.linear_kv_down_proj.weight"), {Rkv + Dr, C}, ParamInit::normal, std, -1);
      if (cfg_.mla_latent_norms()) {
        p.k_norm_w = add(lname("self_attention.kv_layernorm.weight"), {Rkv}, norm_init, 0, -1);
        if (norm_bias) p.k_norm_b = add(lname("self_attention.kv_layernorm.bias"), {Rkv}, ParamInit::zeros, 0, -1);
      }
      p.kv_up_w = add(lname("self_attention.linear_kv_up_proj.weight"), {H * Dnv, Rkv}, ParamInit::normal, std, 0);
    } else {
      // [W, C]: per query group its heads' q, then its k and v (W = 3Q without grouping: per head q, k, v)
      p.qkv_w = add(lname("self_attention.linear_qkv.weight"), {W, C}, ParamInit::normal, std, 0);
      if (cfg_.qkv_bias()) p.qkv_b = add(lname("self_attention.linear_qkv.bias"), {W}, ParamInit::zeros, 0, 0);
    }
    if (cfg_.learnable_softmax_offset() && !p.linear)  // one sink logit per head, split with the heads
      p.softmax_offset = add(lname("self_attention.core_attention.softmax_offset"),
                             {cfg_.num_attention_heads}, ParamInit::normal, std, 0);
    if (cfg_.qk_layernorm && !cfg_.multi_latent_attention && !p.linear) {  // [D] each, shared by every query (key) head: replicated
      const int64_t D = cfg_.kv_channels;
      p.q_norm_w = add(lname("self_attention.q_layernorm.weight"), {D}, norm_init, 0, -1);
      if (norm_bias) p.q_norm_b = add(lname("self_attention.q_layernorm.bias"), {D}, ParamInit::zeros, 0, -1);
      p.k_norm_w = add(lname("self_attention.k_layernorm.weight"), {D}, norm_init, 0, -1);
      if (norm_bias) p.k_norm_b = add(lname("self_attention.k_layernorm.bias"), {D}, ParamInit::zeros, 0, -1);
    }
    if (!p.linear)
      p.proj_w = add(lname("self_attention.linear_proj.weight"), {C, cfg_.attention_output_width()},
                     ParamInit::normal, out_std, 1);
    if (bias && !p.linear) p.proj_b = add(lname("self_attention.linear_proj.bias"), {C}, ParamInit::zeros, 0, -1);
  };
  // Its MLP block after pre_mlp_layernorm: the dense MLP or the MoE layer.
  add_mlp = [&](LayerParams& p, int64_t l, const std::string& prefix) {
    auto lname = [&](const char* rest) { return prefix + rest; };
    auto ename = [&](int64_t e, const char* rest) {
      return prefix + "mlp.experts.local_experts." + std::to_string(e) + "." + rest;
    };
    if (cfg_.moe_layer(l)) {  // Megatron-Core's MoELayer: router, then SequentialMLP's local experts
      const int64_t Fe = cfg_.moe_ffn_hidden_size, Fe1 = cfg_.gated_linear_unit() ? 2 * Fe : Fe;
      const int64_t Ce = cfg_.moe_expert_width();  // the experts' rows: C, or the latent size
      p.router_w = add(lname("mlp.router.weight"), {cfg_.num_experts, C}, ParamInit::normal, std, -1);
      if (bias) p.router_b = add(lname("mlp.router.bias"), {cfg_.num_experts}, ParamInit::zeros, 0, -1);
      if (cfg_.moe_router_enable_expert_bias) {  // Megatron-Core's TopKRouter buffer, zeros to start
        p.expert_bias = add(lname("mlp.router.expert_bias"), {cfg_.num_experts}, ParamInit::zeros, 0, -1);
        params_.mark_buffer(p.expert_bias);
      }
      for (int64_t e = first_expert_; e < first_expert_ + local_experts_; ++e) {  // under their global numbers
        p.expert_fc1.push_back(
            add_expert(ename(e, "linear_fc1.weight"), {Fe1, Ce}, ParamInit::normal, std, 0, fc1_blocks));
        p.expert_fc2.push_back(add_expert(ename(e, "linear_fc2.weight"), {Ce, Fe}, ParamInit::normal, out_std, 1));
        params_.mark_expert(p.expert_fc1.back());
        params_.mark_expert(p.expert_fc2.back());
        if (!bias) continue;  // fc1's split as its weight's rows, fc2's whole (added once: MoeWeights::add_fc2_bias)
        p.expert_fc1_b.push_back(add_expert(ename(e, "linear_fc1.bias"), {Fe1}, ParamInit::zeros, 0, 0, fc1_blocks));
        p.expert_fc2_b.push_back(add_expert(ename(e, "linear_fc2.bias"), {C}, ParamInit::zeros, 0, -1));
        params_.mark_expert(p.expert_fc1_b.back());
        params_.mark_expert(p.expert_fc2_b.back());
      }
      if (const int64_t Fs = cfg_.moe_shared_expert_intermediate_size; Fs > 0) {  // SharedExpertMLP
        p.shared_fc1 = add(lname("mlp.shared_experts.linear_fc1.weight"), {cfg_.gated_linear_unit() ? 2 * Fs : Fs, C},
                           ParamInit::normal, std, 0, fc1_blocks);
        p.shared_fc2 = add(lname("mlp.shared_experts.linear_fc2.weight"), {C, Fs}, ParamInit::normal, out_std, 1);
        if (cfg_.moe_shared_expert_gate)
          p.shared_gate = add(lname("mlp.shared_experts.gate_weight"), {1, C}, ParamInit::normal, std, -1);
      }
      if (const int64_t L = cfg_.moe_latent_size; L > 0) {  // latent MoE: the projections around the experts
        p.latent_fc1 = add(lname("mlp.fc1_latent_proj.weight"), {L, C}, ParamInit::normal, std, -1);
        p.latent_fc2 = add(lname("mlp.fc2_latent_proj.weight"), {C, L}, ParamInit::normal, out_std, -1);
      }
      return;
    }
    p.fc1_w = add(lname("mlp.linear_fc1.weight"), {F1, C}, ParamInit::normal, std, 0, fc1_blocks);
    if (bias) p.fc1_b = add(lname("mlp.linear_fc1.bias"), {F1}, ParamInit::zeros, 0, 0, fc1_blocks);
    p.fc2_w = add(lname("mlp.linear_fc2.weight"), {C, F}, ParamInit::normal, out_std, 1);
    if (bias) p.fc2_b = add(lname("mlp.linear_fc2.bias"), {C}, ParamInit::zeros, 0, -1);
  };
  for (auto [begin, end] : place_.chunks) {
    chunk_first_.push_back(layers_.size());
    for (int64_t l = begin; l < end; ++l) layers_.push_back(add_layer(l, layer_name(l, "")));
  }
  if (place_.post_process) {
    lnf_w_ = add("decoder.final_layernorm.weight", {C}, norm_init, 0, -1);
    if (norm_bias) lnf_b_ = add("decoder.final_layernorm.bias", {C}, ParamInit::zeros, 0, -1);
    if (!tied) {
      out_w_ = add("output_layer.weight", {Vp, C}, ParamInit::normal, std, 0);
    } else if (!place_.pre_process) {
      out_w_ = add_embedding("embedding.word_embeddings.weight", {Vp, C}, 0);
      params_.mark_shared_embedding_copy(out_w_);
      shared_embedding_ = out_w_;
    }
    if (cfg_.mtp() && !tied && !place_.pre_process) {  // the depths' lookup on a last stage (Megatron's as well)
      mtp_wte_ = add_embedding("embedding.word_embeddings.weight", {Vp, C}, 0);
      params_.mark_shared_embedding_copy(mtp_wte_);
      shared_embedding_ = mtp_wte_;
    }
    // --mtp-num-layers: Megatron-Core's MultiTokenPredictionBlock, one MultiTokenPredictionLayer per
    // depth: enorm, hnorm, eh_proj [C, 2C] (column-parallel, no bias), a transformer layer numbered
    // after the decoder's, final_layernorm.
    for (int64_t k = 0; k < cfg_.mtp_num_layers; ++k) {
      if (cfg_.mtp_use_repeated_layer && k > 0) {  // the first depth's parameters again
        mtp_.push_back(mtp_.front());
        continue;
      }
      const std::string m = "mtp.layers." + std::to_string(k) + ".";
      MtpParams d;
      d.enorm_w = add(m + "enorm.weight", {C}, norm_init, 0, -1);
      if (norm_bias) d.enorm_b = add(m + "enorm.bias", {C}, ParamInit::zeros, 0, -1);
      d.hnorm_w = add(m + "hnorm.weight", {C}, norm_init, 0, -1);
      if (norm_bias) d.hnorm_b = add(m + "hnorm.bias", {C}, ParamInit::zeros, 0, -1);
      d.eh_proj_w = add(m + "eh_proj.weight", {C, 2 * C}, ParamInit::normal, std, 0);
      const int64_t l = cfg_.num_layers + k;
      if (cfg_.hybrid()) {  // Megatron's hybrid depth: its pattern's layers under mtp_model_layer.layers.<j>.
        const std::string inner = m + "mtp_model_layer.layers.";
        d.layer = add_layer(l, inner + "0.", cfg_.attention_block(l) && cfg_.mlp_block(l) ? inner + "1." : "");
      } else {
        d.layer = add_layer(l, m + "transformer_layer.");
      }
      d.norm_w = add(m + "final_layernorm.weight", {C}, norm_init, 0, -1);
      if (norm_bias) d.norm_b = add(m + "final_layernorm.bias", {C}, ParamInit::zeros, 0, -1);
      mtp_.push_back(d);
    }
  }
  // The MoE statistics of every layer here, the prediction depths' after the decoder's (track_moe_forward).
  const size_t here = layers_.size() + mtp_.size();
  expert_tokens_.assign(cfg_.moe_router_enable_expert_bias ? here * size_t(cfg_.num_experts) : 0, 0.0);
  global_balance_.assign(cfg_.moe_global_aux_loss ? here : 0, MoeGlobalBalance{});
  layer_load_balancing_.assign(cfg_.moe() ? size_t(cfg_.num_layers + cfg_.mtp_num_layers) : 0, LossSum{});
  layer_z_loss_ = layer_load_balancing_;
}

void GPTModel::init_parameters(uint64_t seed) { params_.initialize(seed); }

const float* GPTModel::output_weight() const { return params_.param(out_w_ >= 0 ? out_w_ : wte_); }
float* GPTModel::output_weight_grad() { return params_.grad(out_w_ >= 0 ? out_w_ : wte_); }

// Per chunk and slot: every residual and layer buffer, except what recomputation
// drops. Full recomputation keeps of each recomputed group only its input (the group's
// layers and inner residuals point into the shared Scratch group); selective keeps
// every layer's buffers but attn and lse (one shared Scratch copy).
void GPTModel::allocate(std::vector<Activations>& acts, std::vector<MtpDepth>& mtp, Scratch& sc, Arena& arena,
                        const TransformerConfig& cfg, const TensorParallel& tp, const ModelPlacement& place, int64_t B,
                        int64_t T, int ep, int cp) {
  const int64_t P = tp.size();
  // Cl: a layer's core output (the attention's [N, H D / P], or a GDN layer's [N, Hv Dv / P]); Wl: the
  // QKV layer's or in_proj's output.
  const int64_t N = B * T, Ns = tp.shard_rows(N), C = cfg.hidden_size,
                Cl = std::max(cfg.attention_width(), cfg.max_proj_width()) / P, Wl = cfg.max_qkv_width() / P;
  const int64_t Fl = cfg.ffn_hidden_size / P, F1l = cfg.fc1_width() / P, Hl = cfg.num_attention_heads / P;
  const int64_t Gl = cfg.num_query_groups / P;
  const int64_t Vl = cfg.padded_vocab_size / P;
  const bool selective = cfg.recompute_core_attention();
  // The MoE layers' rows: this rank's sequence-parallel rows with whole experts (GPTModel::moe_rows).
  const int64_t Nm = cfg.experts_whole(P) ? Ns : N;
  // --moe-layer-recompute: every MoE layer's buffers are one shared copy, refilled before its backward.
  std::shared_ptr<MoeState> shared_moe;
  if (cfg.recompute_moe()) {
    const MoeShape ms = lattice::moe_shape(cfg, P, ep);
    shared_moe = std::make_shared<MoeState>();
    moe_state_carve(*shared_moe, arena.alloc_f32(moe_state_floats(Nm, ms), "moe (recomputed)"), Nm, ms);
    if (ms.shared_apart)  // (whole experts: the shared experts on every token's row)
      moe_shared_state_carve(*shared_moe, arena.alloc_f32(moe_shared_state_floats(N, ms), "moe (recomputed)"), N, ms);
  }
  // moe_act: one [N k, F] activation for every MoE layer's experts (under expert parallelism it
  // lives in the dispatch's scratch instead).
  bool moe_here = false;
  for (auto [begin, end] : place.chunks)
    for (int64_t l = begin; l < end; ++l) moe_here = moe_here || cfg.moe_layer(l);
  float* shared_act = nullptr;
  if (cfg.recompute_moe_act() && moe_here && ep == 1) {
    const MoeShape ms = lattice::moe_shape(cfg, P, ep);
    shared_act = arena.alloc_f32(Nm * ms.k * ms.F, "moe activation (recomputed)");
  }
  if (shared_moe && cfg.recompute_moe_act() && ep == 1) shared_moe->act = shared_act;
  // shared_experts: one copy of the shared experts' buffers for every MoE layer.
  float* shared_se = nullptr;
  if (cfg.recompute_shared_experts() && moe_here) {
    const MoeShape ms = lattice::moe_shape(cfg, P, ep);
    shared_se = arena.alloc_f32(moe_shared_experts_floats(N, ms), "shared experts (recomputed)");
    if (shared_moe) moe_shared_experts_carve(*shared_moe, shared_se, N, ms);
  }
  // mla_up_proj: one fused qkv for every layer, refilled before each layer's backward.
  float* shared_qkv = cfg.recompute_mla_up_proj() ? arena.alloc_f32(N * cfg.qkv_width() / P, "linear_qkv (recomputed)")
                                                  : nullptr;
  sc.qkv = shared_qkv;
  // An MoE layer's state (or the shared one under --moe-layer-recompute).
  auto alloc_moe = [&](Activations::Layer& x) {
    if (shared_moe) {
      x.moe = shared_moe;
      return;
    }
    x.moe = std::make_shared<MoeState>();
    const MoeShape ms = lattice::moe_shape(cfg, P, ep);
    moe_state_carve(*x.moe, arena.alloc_f32(moe_state_floats(Nm, ms), "moe"), Nm, ms);
    if (ms.shared_apart) moe_shared_state_carve(*x.moe, arena.alloc_f32(moe_shared_state_floats(N, ms), "moe"), N, ms);
    if (ms.recompute_act && ep == 1) x.moe->act = shared_act;
    if (ms.recompute_shared) moe_shared_experts_carve(*x.moe, shared_se, N, ms);
  };
  // moe, dense: the layer buffers of an MoE layer, of a dense MLP's (a recomputation group's
  // shared layer may serve both kinds).
  // mixer false: a hybrid's MLP-only layer, without the attention block's buffers.
  auto alloc_layer = [&](bool attention, bool moe, bool dense, bool norms = true, bool mixer = true) {
    Activations::Layer x;
    x.ln1 = norms && mixer ? arena.alloc_f32(Ns * C, "input_layernorm") : nullptr;
    x.ln1_mean = arena.alloc_f32(Ns);
    x.ln1_rstd = arena.alloc_f32(Ns);
    if (mixer) {  // the attention block's buffers
      x.qkv = cfg.recompute_mla_up_proj() ? shared_qkv : arena.alloc_f32(N * Wl, "linear_qkv");
      if (cfg.qk_norm()) {
        x.qk_raw = arena.alloc_f32(N * (Hl + Gl) * cfg.kv_channels, "qk_layernorm");
        x.qk_mean = arena.alloc_f32(N * (Hl + Gl));
        x.qk_rstd = arena.alloc_f32(N * (Hl + Gl));
      }
      x.attn = attention ? arena.alloc_f32(N * Cl, "core_attention") : nullptr;
      x.lse = attention ? arena.alloc_f32(B * Hl * T, "attention lse") : nullptr;
      if (cfg.multi_latent_attention) {
        const int64_t Rq = cfg.q_lora_rank, Rkv = cfg.kv_lora_rank, Dr = cfg.qk_pos_emb_head_dim;
        const bool latent_norms = cfg.mla_latent_norms();
        if (Rq > 0) {
          x.mla_q_c = arena.alloc_f32(N * Rq, "mla q latent");
          x.mla_q_n = latent_norms ? arena.alloc_f32(N * Rq, "q_layernorm") : x.mla_q_c;
          x.mla_q_mean = latent_norms ? arena.alloc_f32(N) : nullptr;
          x.mla_q_rstd = latent_norms ? arena.alloc_f32(N) : nullptr;
        }
        x.mla_kv_c = arena.alloc_f32(N * (Rkv + Dr), "mla kv latent");
        x.mla_kv_l = arena.alloc_f32(N * Rkv, "mla kv latent");
        x.mla_kv_n = latent_norms ? arena.alloc_f32(N * Rkv, "kv_layernorm") : x.mla_kv_l;
        x.mla_kv_mean = latent_norms ? arena.alloc_f32(N) : nullptr;
        x.mla_kv_rstd = latent_norms ? arena.alloc_f32(N) : nullptr;
        if (attention)
          x.attn_v = cfg.v_head_dim < cfg.kv_channels ? arena.alloc_f32(N * Hl * cfg.v_head_dim, "core_attention")
                                                      : x.attn;
      }
      x.resid_mid = arena.alloc_f32(Ns * C, "residual");
    }
    x.ln2 = norms ? arena.alloc_f32(Ns * C, "pre_mlp_layernorm") : nullptr;
    x.ln2_mean = arena.alloc_f32(Ns);
    x.ln2_rstd = arena.alloc_f32(Ns);
    if (moe) alloc_moe(x);
    if (dense) {
      x.fc1 = arena.alloc_f32(N * F1l, "linear_fc1");
      x.gelu = arena.alloc_f32(N * Fl, "gelu");
    }
    return x;
  };
  const int chunks = int(place.chunks.size());
  std::vector<std::vector<std::pair<int64_t, int64_t>>> groups;
  int64_t largest = 0;
  for (auto [begin, end] : place.chunks) {
    groups.push_back(recompute_groups(cfg, end - begin));
    for (auto [b, e] : groups.back()) largest = std::max(largest, e - b);
  }
  // The kinds of layer each shared group layer serves (the j-th of some group of some chunk).
  std::vector<bool> group_moe(size_t(largest), false), group_dense(size_t(largest), false);
  for (int c = 0; c < chunks; ++c)
    for (auto [b, e] : groups[size_t(c)])
      for (int64_t i = b; i < e; ++i) {
        const bool moe = cfg.moe_layer(place.chunks[size_t(c)].first + i);
        group_moe[size_t(i - b)] = group_moe[size_t(i - b)] || moe;
        group_dense[size_t(i - b)] = group_dense[size_t(i - b)] || !moe;
      }
  sc.group.clear();
  sc.group_resid.clear();
  for (int64_t j = 0; j < largest; ++j) sc.group.push_back(alloc_layer(true, group_moe[size_t(j)], group_dense[size_t(j)]));
  for (int64_t j = 1; j < largest; ++j) sc.group_resid.push_back(arena.alloc_f32(Ns * C, "residual"));
  sc.attn = selective ? arena.alloc_f32(N * Cl, "core_attention") : nullptr;
  sc.lse = selective ? arena.alloc_f32(B * Hl * T, "attention lse") : nullptr;
  const bool mla_padded = cfg.multi_latent_attention && cfg.v_head_dim < cfg.kv_channels;
  sc.attn_v = selective && mla_padded ? arena.alloc_f32(N * Hl * cfg.v_head_dim, "core_attention") : sc.attn;
  // --recompute-modules mlp / layernorm (selective: no full-recomputation groups): one copy,
  // refilled before each layer's backward.
  bool dense = false;  // a dense layer on this rank
  for (auto [begin, end] : place.chunks)
    for (int64_t l = begin; l < end; ++l) dense = dense || !cfg.moe_layer(l);
  const bool shared_mlp = cfg.recompute_mlp() && dense;
  sc.fc1 = shared_mlp ? arena.alloc_f32(N * F1l, "linear_fc1 (recomputed)") : nullptr;
  sc.gelu = shared_mlp ? arena.alloc_f32(N * Fl, "gelu (recomputed)") : nullptr;
  const bool shared_norms = cfg.recompute_layernorm();
  sc.ln = shared_norms ? arena.alloc_f32(Ns * C, "layernorm (recomputed)") : nullptr;

  acts.clear();
  for (int c = 0; c < chunks; ++c)
    for (int s = 0; s < place.slots; ++s) {
      Activations a;
      const int64_t layers = place.chunks[size_t(c)].second - place.chunks[size_t(c)].first;
      a.resid.resize(size_t(layers + 1));
      a.layers.resize(size_t(layers));
      a.recompute_from.assign(size_t(layers), -1);
      std::vector<bool> shared_resid(size_t(layers + 1), false), shared_layer(size_t(layers), false);
      for (auto [b, e] : groups[size_t(c)]) {
        for (int64_t i = b; i < e; ++i) {
          a.layers[size_t(i)] = sc.group[size_t(i - b)];
          shared_layer[size_t(i)] = true;
          if (i > b) {
            a.resid[size_t(i)] = sc.group_resid[size_t(i - b - 1)];
            shared_resid[size_t(i)] = true;
          }
        }
        a.recompute_from[size_t(e - 1)] = b;
      }
      for (int64_t l = 0; l <= layers; ++l)
        if (!shared_resid[size_t(l)]) a.resid[size_t(l)] = arena.alloc_f32(Ns * C, "residual");
      for (int64_t l = 0; l < layers; ++l) {
        if (shared_layer[size_t(l)]) continue;
        Activations::Layer& x = a.layers[size_t(l)];
        const int64_t global = place.chunks[size_t(c)].first + l;
        const bool moe = cfg.moe_layer(global), mlp = cfg.mlp_block(global);
        // (Not sc's pointers: a counting arena's are null.)
        x = alloc_layer(!selective, mlp && moe, mlp && !moe && !shared_mlp, !shared_norms, cfg.attention_block(global));
        if (selective) {
          x.attn = sc.attn;
          x.lse = sc.lse;
          if (cfg.multi_latent_attention) x.attn_v = sc.attn_v;
        }
        if (mlp && !moe && shared_mlp) {
          x.fc1 = sc.fc1;
          x.gelu = sc.gelu;
        }
        if (shared_norms) x.ln1 = x.ln2 = sc.ln;
      }
      if (place.post_process && c == chunks - 1) {
        a.lnf = arena.alloc_f32(N * C, "final_layernorm");
        a.lnf_mean = arena.alloc_f32(Ns);
        a.lnf_rstd = arena.alloc_f32(Ns);
        a.logits = arena.alloc_f32(N * Vl, "logits");
        a.losses = arena.alloc_f32(N, "losses");
        for (int64_t k = 0; k < cfg.mtp_num_layers; ++k) {  // --mtp-num-layers: each depth's, whole
          MtpDepth d;
          d.a.resid = {arena.alloc_f32(Ns * C, "mtp residual"), arena.alloc_f32(Ns * C, "mtp residual")};
          // (the last decoder layer's kind; a hybrid's, its MTP pattern's blocks)
          const int64_t g = cfg.num_layers + k;
          const bool moe = cfg.moe_layer(g), mlp = cfg.mlp_block(g);
          d.a.layers = {alloc_layer(true, mlp && moe, mlp && !moe, true, cfg.attention_block(g))};
          d.a.recompute_from = {-1};
          d.a.lnf = arena.alloc_f32(N * C, "mtp final_layernorm");
          d.a.lnf_mean = arena.alloc_f32(Ns);
          d.a.lnf_rstd = arena.alloc_f32(Ns);
          d.a.logits = a.logits;
          d.a.losses = a.losses;
          d.emb = arena.alloc_f32(Ns * C, "mtp embedding");
          d.en = arena.alloc_f32(Ns * C, "mtp enorm");
          d.en_mean = arena.alloc_f32(Ns);
          d.en_rstd = arena.alloc_f32(Ns);
          d.hn = arena.alloc_f32(Ns * C, "mtp hnorm");
          d.hn_mean = arena.alloc_f32(Ns);
          d.hn_rstd = arena.alloc_f32(Ns);
          d.cat = arena.alloc_f32(N * 2 * C, "mtp eh_proj input");
          d.d_out = arena.alloc_f32(Ns * C, "grad");
          mtp.push_back(std::move(d));
        }
      }
      acts.push_back(std::move(a));
    }
  sc.d_resid = arena.alloc_f32(Ns * C, "grad");
  sc.d_s = tp.sp() ? arena.alloc_f32(Ns * C, "grad") : nullptr;
  sc.ln_full = tp.sp() ? arena.alloc_f32(N * C, "gathered layernorm") : nullptr;
  sc.d_c1 = arena.alloc_f32(N * C, "grad");
  sc.d_c2 = arena.alloc_f32(N * std::max(C, Cl), "grad");  // fc2's output gradient; the projection's input gradient
  sc.d_3c = arena.alloc_f32(N * Wl, "grad");
  // (under context parallelism the GDN and Mamba cores' buffers are GdnContextParallel's and
  // MambaContextParallel's, for the whole sequences)
  if (cfg.gated_delta_net() && cp == 1) gdn_scratch_carve(sc.gdn, arena, gdn_kernel_shape(cfg, P, B, T));
  if (cfg.has_mamba_layers() && cp == 1)
    mamba_scratch_carve(sc.mamba, arena, mamba_kernel_shape(cfg, P, B, T));
  sc.d_f = arena.alloc_f32(N * Fl, "grad");
  if (cfg.moe()) {
    const MoeShape ms = lattice::moe_shape(cfg, P, ep);
    moe_scratch_carve(sc.moe, arena.alloc_f32(moe_scratch_floats(Nm, ms), "grad"), Nm, ms);
    if (ms.shared_apart) moe_shared_scratch_carve(sc.moe, arena.alloc_f32(moe_shared_scratch_floats(N, ms), "grad"), N, ms);
  }
  if (cfg.mtp() && place.post_process) {
    sc.mtp_d_cat = arena.alloc_f32(N * 2 * C, "grad");
    sc.mtp_d_cat_s = tp.sp() ? arena.alloc_f32(Ns * 2 * C, "grad") : nullptr;
    sc.mtp_d_h = arena.alloc_f32(Ns * C, "grad");
  }
  if (cfg.attention_output_gate) sc.attn_gated = arena.alloc_f32(N * Cl, "attention output gate");
  if (cfg.qk_norm()) {
    sc.qk_tmp = arena.alloc_f32(N * (Hl + Gl) * cfg.kv_channels, "qk_layernorm");
    sc.qk_dx = arena.alloc_f32(N * (Hl + Gl) * cfg.kv_channels, "grad");
  }
  if (cfg.multi_latent_attention) {
    const int64_t Rq = cfg.q_lora_rank, Rkv = cfg.kv_lora_rank, Dr = cfg.qk_pos_emb_head_dim;
    const bool latent_norms = cfg.mla_latent_norms();
    sc.mla_q = arena.alloc_f32(N * Hl * cfg.mla_qk_dim(), "mla");
    sc.mla_kv = arena.alloc_f32(N * Hl * (cfg.qk_head_dim + cfg.v_head_dim), "mla");
    if (Rq > 0) {
      sc.mla_d_qn = arena.alloc_f32(N * Rq, "grad");
      sc.mla_d_qc = latent_norms ? arena.alloc_f32(N * Rq, "grad") : sc.mla_d_qn;
    }
    sc.mla_d_kvn = arena.alloc_f32(N * (Rkv + Dr), "grad");  // then the rotary key's [N, Dr]
    sc.mla_d_kvl = latent_norms ? arena.alloc_f32(N * Rkv, "grad") : nullptr;
    sc.mla_d_kvc = arena.alloc_f32(N * (Rkv + Dr), "grad");
    sc.mla_d_attn_v = mla_padded ? arena.alloc_f32(N * Hl * cfg.v_head_dim, "grad") : nullptr;
  }
}

size_t GPTModel::activation_bytes(const TransformerConfig& cfg, int64_t B, int64_t T, const TensorParallel& tp,
                                  const ModelPlacement& placement, int ep, int cp) {
  Arena counter = Arena::counting();
  std::vector<Activations> acts;
  std::vector<MtpDepth> mtp;
  Scratch sc;
  allocate(acts, mtp, sc, counter, cfg, tp, complete(placement, cfg), B, T, ep, cp);
  return counter.used();
}

size_t GPTModel::context_parallel_bytes(const TransformerConfig& cfg, int64_t B, int64_t T, int tp, int cp) {
  if (cp <= 1) return 0;
  const int64_t kv = B * T * 2 * (cfg.num_query_groups / tp) * cfg.kv_channels;
  // The Gated DeltaNet and Mamba layers' whole-sequence buffers (GdnContextParallel, MambaContextParallel).
  Arena counter = Arena::counting();
  if (cfg.gated_delta_net()) GdnContextParallel().carve(counter, cfg, tp, cp, B, T);
  if (cfg.has_mamba_layers()) MambaContextParallel().carve(counter, cfg, tp, cp, B, T);
  return size_t(2 * kv + kv / cp) * sizeof(float) + counter.used();
}

GPTModel::Activations& GPTModel::acts(int chunk, int slot) {
  LATTICE_CHECK(chunk >= 0 && chunk < num_chunks() && slot >= 0 && slot < place_.slots)
      << "no activations for chunk " << chunk << " slot " << slot;
  return acts_[size_t(chunk * place_.slots + slot)];
}

float* GPTModel::input_buffer(int chunk, int slot) { return acts(chunk, slot).resid[0]; }
const float* GPTModel::output(int chunk, int slot) const {
  return acts_[size_t(chunk * place_.slots + slot)].resid.back();
}
float* GPTModel::output_grad_buffer() { return scratch_->d_resid; }
const float* GPTModel::input_grad() const { return scratch_->d_resid; }

// A LayerNorm output's rows of every token: the shard itself without sequence
// parallelism, else the shard all-gathered into ln_full (again in backward, as Megatron
// does, so that only the shard is kept between forward and backward), fp32 or bf16.
LinearInput GPTModel::ln_input(const float* shard, int64_t N) {
  const int64_t C = cfg_.hidden_size;
  if (!tp_.sp()) return input(shard);
  float* full = scratch_->ln_full;
  copy_on_device(input_row(full, tp_.shard_begin(N)), shard, size_t(tp_.shard_rows(N) * C) * input_bytes());
  gather_input_rows(full, N);
  return input(full);
}

float* GPTModel::input_row(float* buf, int64_t row) const {
  return reinterpret_cast<float*>(reinterpret_cast<char*>(buf) + size_t(row * cfg_.hidden_size) * input_bytes());
}

void GPTModel::gather_input_rows(float* full, int64_t N) {
  gather_from_sequence_parallel_region(tp_, full, N, bf16_inputs() ? cfg_.hidden_size / 2 : cfg_.hidden_size);
}

void GPTModel::layernorm_input(float* out, float* mean, float* rstd, const float* x, int w, int b, int64_t rows) {
  const int64_t C = cfg_.hidden_size;
  if (bf16_inputs())
    layernorm_forward_bf16(reinterpret_cast<uint16_t*>(out), mean, rstd, x, norm_weight(w), bias(b), rows, C,
                           cfg_.layernorm_epsilon, normalization());
  else
    layernorm_forward(out, mean, rstd, x, norm_weight(w), bias(b), rows, C, cfg_.layernorm_epsilon,
                      normalization());
}

void GPTModel::allocate_norm_1p() {
  std::vector<int> norms = {lnf_w_};
  for (const LayerParams& p : layers_)
    norms.insert(norms.end(), {p.ln1_w, p.ln2_w, p.q_norm_w, p.k_norm_w, p.out_norm_w});
  for (const MtpParams& d : mtp_)
    norms.insert(norms.end(), {d.enorm_w, d.hnorm_w, d.norm_w, d.layer.ln1_w, d.layer.ln2_w, d.layer.q_norm_w,
                               d.layer.k_norm_w, d.layer.out_norm_w});
  norm_1p_at_.assign(params_.infos().size(), -1);
  int64_t n = 0, widest = 0;
  for (int w : norms)
    if (w >= 0 && norm_1p_at_[size_t(w)] < 0) {  // (a repeated MTP layer's norms listed once per depth)
      norm_1p_at_[size_t(w)] = n;
      n += params_.infos()[size_t(w)].numel;
      widest = std::max(widest, params_.infos()[size_t(w)].numel);
    }
  norm_1p_.resize(size_t(n));
  const std::vector<float> ones(size_t(widest), 1.0f);
  copy_to_device(norm_ones_.resize(size_t(widest)), ones.data(), ones.size() * sizeof(float));
}

void GPTModel::refresh_norm_weights() {
  if (!cfg_.apply_layernorm_1p) return;
  for (size_t w = 0; w < norm_1p_at_.size(); ++w)
    if (norm_1p_at_[w] >= 0)
      add_forward(norm_1p_.data() + norm_1p_at_[w], params_.param(int(w)), norm_ones_.data(),
                  params_.infos()[w].numel);
}

// VocabParallelEmbedding: this rank's rows (zeros elsewhere), summed over the group (all-reduce,
// or reduce-scatter to the token shard), then positions and dropout.
void GPTModel::embedding_forward(float* out, const Activations& a, int64_t B, int64_t T, const MicroBatchKey& key,
                                 const std::string& site) {
  const int64_t N = B * T, C = cfg_.hidden_size, Ns = tp_.shard_rows(N), row0 = tp_.shard_begin(N);
  const float p_hidden = key.training ? cfg_.hidden_dropout : 0.0f;
  float* emb = tp_.sp() ? scratch_->d_c1 : out;
  vocab_parallel_embedding_forward(emb, a.inputs(), params_.param(word_embedding()), vocab_begin_, Vl_, N, C);
  reduce_from_tensor_parallel_region(tp_, emb, out, N, C);
  if (wpe_ >= 0) position_embedding_add(out, a.positions() + row0, params_.param(wpe_), Ns, C);
  const PhiloxStream stream = site_stream(key, site);
  for (const DropoutRun& r : dropout_runs(B, T, p_hidden))
    dropout_forward(out + r.row * C, out + r.row * C, r.rows * C, p_hidden, stream, r.first_index);
}

// d_resid is d(embedding output after dropout); the lookup's backward needs every token's
// gradient (all-gathered from the shards with sequence parallelism).
void GPTModel::embedding_backward_from(const Activations& a, int64_t B, int64_t T, const MicroBatchKey& key,
                                       const std::string& site) {
  Scratch& sc = *scratch_;
  const int64_t N = B * T, C = cfg_.hidden_size, Ns = tp_.shard_rows(N), row0 = tp_.shard_begin(N);
  const float p_hidden = key.training ? cfg_.hidden_dropout : 0.0f;
  const PhiloxStream stream = site_stream(key, site);
  for (const DropoutRun& r : dropout_runs(B, T, p_hidden))
    dropout_backward(sc.d_resid + r.row * C, sc.d_resid + r.row * C, r.rows * C, p_hidden, stream, r.first_index);
  const float* d_emb = sc.d_resid;
  if (tp_.sp()) {
    copy_on_device(sc.d_c1 + row0 * C, sc.d_resid, size_t(Ns * C) * sizeof(float));
    gather_from_sequence_parallel_region(tp_, sc.d_c1, N, C);
    d_emb = sc.d_c1;
  }
  embedding_backward(params_.grad(word_embedding()), wpe_ >= 0 ? params_.grad(wpe_) : nullptr, d_emb, a.inputs(), a.positions(), N, C,
                     vocab_begin_, Vl_, a.groups);
}

void GPTModel::forward_chunk(int chunk, Activations& a, int64_t B, int64_t T, const MicroBatchKey& key) {
  LATTICE_CHECK(B <= max_B_ && T <= max_T_)
      << "micro-batch " << B << "x" << T << " exceeds the model's " << max_B_ << "x" << max_T_;
  const bool sp = tp_.sp();
  LATTICE_CHECK(!sp || T == max_T_) << "sequence parallelism runs full-length sequences only";
  const int64_t N = B * T;
  const int64_t Ns = tp_.shard_rows(N), row0 = tp_.shard_begin(N);
  refresh_norm_weights();  // the parameters may have changed since the last forward

  if (has_embedding(chunk)) embedding_forward(a.resid[0], a, B, T, key, "embedding.dropout");

  // Each layer's output goes with the next LayerNorm (the next layer's LN1, the final one).
  const size_t first = chunk_first_[size_t(chunk)];
  for (size_t i = 0; i < a.layers.size(); ++i) {
    forward_layer(layers_[first + i], a, i, B, T, key, true, i > 0, next_norm(chunk, a, i + 1, row0));
    if (key.training && cfg_.moe_layer(layers_[first + i].layer))  // each training forward once (not the recomputations)
      track_moe_forward(layers_[first + i], a, i, first + i, B, T);
  }
  if (has_loss(chunk)) {
    if (a.layers.empty())
      layernorm_input(input_row(a.lnf, row0), a.lnf_mean, a.lnf_rstd, a.resid.back(), lnf_w_, lnf_b_, Ns);
    gather_input_rows(a.lnf, N);
  }
}

void GPTModel::track_moe_forward(const LayerParams& p, Activations& a, size_t i, size_t index, int64_t B, int64_t T) {
  Activations::Layer& x = a.layers[i];
  const MoeState& st = *x.moe;
  load_balancing_.sum += st.balance;
  load_balancing_.count += 1;
  const size_t l = size_t(p.layer);
  layer_load_balancing_[l].sum += st.balance;
  layer_load_balancing_[l].count += 1;
  layer_z_loss_[l].sum += st.z;
  layer_z_loss_[l].count += 1;
  if (cfg_.moe_seq_aux_loss) {
    seq_load_balancing_.sum += st.seq_balance;
    seq_load_balancing_.count += 1;
  }
  if (cfg_.moe_global_aux_loss) {  // the step's counts so far, for this micro-batch's backward
    global_load_balancing_.sum += moe_global_balance(x.moe_global_counts, x.moe_global_tokens, st,
                                                     global_balance_[index], moe_rows(B * T), moe_shape(B, T, true, true),
                                                     moe_token_group(), data_parallel_);
    global_load_balancing_.count += 1;
  }
  z_loss_.sum += st.z;
  z_loss_.count += 1;
  if (cfg_.moe_router_enable_expert_bias) {
    double* tokens = expert_tokens_.data() + index * size_t(cfg_.num_experts);
    const std::vector<int64_t>& o = x.moe->offsets;
    for (int64_t e = 0; e < cfg_.num_experts; ++e) tokens[e] += double(o[size_t(e + 1)] - o[size_t(e)]);
  }
}

LayerNormOut GPTModel::layernorm_out(const NextNorm& n) const {
  LayerNormOut ln;
  if (bf16_inputs())
    ln.bf16 = reinterpret_cast<uint16_t*>(n.out);
  else
    ln.f32 = n.out;
  ln.mean = n.mean;
  ln.rstd = n.rstd;
  ln.w = norm_weight(n.w);
  ln.b = bias(n.b);  // zeros with RMSNorm
  ln.eps = cfg_.layernorm_epsilon;
  ln.kind = normalization();
  return ln;
}

std::optional<GPTModel::NextNorm> GPTModel::next_norm(int chunk, Activations& a, size_t i, int64_t row0) {
  if (i < a.layers.size()) {
    const LayerParams& p = layers_[chunk_first_[size_t(chunk)] + i];
    Activations::Layer& x = a.layers[i];
    if (!p.attention) return NextNorm{x.ln2, x.ln2_mean, x.ln2_rstd, p.ln2_w, p.ln2_b};  // an MLP-only layer's
    return NextNorm{x.ln1, x.ln1_mean, x.ln1_rstd, p.ln1_w, p.ln1_b};
  }
  if (!has_loss(chunk)) return std::nullopt;
  return NextNorm{input_row(a.lnf, row0), a.lnf_mean, a.lnf_rstd, lnf_w_, lnf_b_};
}

void GPTModel::forward_layer(const LayerParams& p, Activations& a, size_t i, int64_t B, int64_t T,
                             const MicroBatchKey& key, bool output, bool ln1_made,
                             const std::optional<NextNorm>& after) {
  const bool sp = tp_.sp();
  Scratch& sc = *scratch_;
  const int64_t N = B * T, C = cfg_.hidden_size, Cl = proj_in_local(p);
  const int64_t Ns = tp_.shard_rows(N);
  const float p_hidden = key.training ? cfg_.hidden_dropout : 0.0f;
  const std::vector<DropoutRun> runs = dropout_runs(B, T, p_hidden);
  float* out_rows = sp ? sc.d_s : sc.d_c1;  // [Ns, C] output of a row-parallel linear
  const int64_t l = p.layer;
  Activations::Layer& x = a.layers[i];
  const float* in = a.resid[i];
  // The MLP block's input: resid_mid, or the layer's input without an attention block (an MLP-only layer,
  // whose pre_mlp_layernorm is its first norm).
  const float* mid = p.attention ? x.resid_mid : in;
  if (!p.attention) {
    if (!ln1_made) layernorm_input(x.ln2, x.ln2_mean, x.ln2_rstd, in, p.ln2_w, p.ln2_b, Ns);
    return forward_mlp_block(p, a, i, B, T, key, output, after, mid);
  }
  // Attention block: resid_mid = in + dropout(proj(attention(qkv(ln1(in)))))
  if (!ln1_made) layernorm_input(x.ln1, x.ln1_mean, x.ln1_rstd, in, p.ln1_w, p.ln1_b, Ns);
  if (p.linear) {  // a GDN or Mamba layer: in_proj, then its core into x.attn (core_attention_forward)
    linear_forward(x.qkv, ln_input(x.ln1, N), params_.param(p.qkv_w), nullptr, N, C, qkv_local(p), site(p.qkv_w));
  } else if (cfg_.multi_latent_attention) {
    mla_qkv_forward(p, a, i, ln_input(x.ln1, N), N);
  } else if (bf16_qkv()) {  // round(x W^T) in bf16; the attention adds the bias (qkv_input)
    gemm_policy_->forward_bf16(p.qkv_w, x.qkv, ln_input(x.ln1, N), params_.param(p.qkv_w), N, C, qkv_local());
  } else {
    linear_forward(x.qkv, ln_input(x.ln1, N), params_.param(p.qkv_w), bias_or_null(p.qkv_b), N, C, qkv_local(),
                   site(p.qkv_w));
  }
  if (cfg_.qk_norm() && !p.linear)  // queries, keys normalized in place (their inputs kept)
    qk_layernorm_forward(x.qkv, x.qk_raw, x.qk_mean, x.qk_rstd, sc.qk_tmp, qk_norm_params(p), N, qkv_layout(),
                         cfg_.layernorm_epsilon, qk_normalization());
  if (!p.linear) rotate_qkv(x.qkv, B, T, l);
  core_attention_forward(p, a, i, B, T, key);
  if (!p.linear) gate_attention_output(x.attn, x.qkv, N);
  // The projection's rounding, bias, dropout and residual add in one pass (Megatron's
  // bias_dropout_add), with LN2 of the result; without an MLP block the layer's output, with the next norm.
  if (!p.mlp) {
    if (output)
      row_parallel_output(a.resid[i + 1], in, out_rows, proj_input(p, a, i, N), p.proj_w, p.proj_b, N, Cl, p_hidden,
                          site_stream(key, p.name + "self_attention.dropout"), runs, after);
    return;
  }
  row_parallel_output(x.resid_mid, in, out_rows, proj_input(p, a, i, N), p.proj_w, p.proj_b, N, Cl, p_hidden,
                      site_stream(key, p.name + "self_attention.dropout"), runs,
                      NextNorm{x.ln2, x.ln2_mean, x.ln2_rstd, p.ln2_w, p.ln2_b});
  forward_mlp_block(p, a, i, B, T, key, output, after, mid);
}

void GPTModel::forward_mlp_block(const LayerParams& p, Activations& a, size_t i, int64_t B, int64_t T,
                                 const MicroBatchKey& key, bool output, const std::optional<NextNorm>& after,
                                 const float* mid) {
  // MLP block: out = mid + dropout(fc2(gelu(fc1(ln2(mid)))))
  const bool sp = tp_.sp();
  Scratch& sc = *scratch_;
  const int64_t N = B * T, C = cfg_.hidden_size;
  const int64_t Ns = tp_.shard_rows(N);
  const float p_hidden = key.training ? cfg_.hidden_dropout : 0.0f;
  const std::vector<DropoutRun> runs = dropout_runs(B, T, p_hidden);
  float* out_rows = sp ? sc.d_s : sc.d_c1;  // [Ns, C] output of a row-parallel linear
  const int64_t l = p.layer;
  Activations::Layer& x = a.layers[i];
  // The MoE layer on every token's row (all-gathered with sequence parallelism): this rank's partial y
  // [N, C] in d_c1, reduced as a row-parallel output; with whole experts on this rank's rows alone. Then
  // as fc2's output.
  if (cfg_.moe_layer(l)) {
    const MoeShape shape = moe_shape(B, T, !key.generation, key.training);
    if (experts_whole_ && shape.Fs == 0) {  // whole experts: this rank's rows, their whole outputs
      moe_forward(out_rows, input(x.ln2).f32, *x.moe, moe_weights(p, l, B, T, key), Ns, shape);
    } else if (experts_whole_) {
      // With shared experts (split over the ranks, on every token's row): this rank's rows' routed
      // outputs in place among zeros, the shared experts' partial sums added, reduce-scattered.
      const MoeWeights w = moe_weights(p, l, B, T, key);
      zero_on_device(sc.d_c1, size_t(N * C) * sizeof(float));
      moe_forward(sc.d_c1 + tp_.shard_begin(N) * C, input(x.ln2).f32, *x.moe, w, Ns, shape);
      moe_shared_forward(sc.d_c1, ln_input(x.ln2, N).f32, *x.moe, w, N, shape);
      reduce_from_tensor_parallel_region(tp_, sc.d_c1, out_rows, N, C);
    } else {
      moe_forward(sc.d_c1, ln_input(x.ln2, N).f32, *x.moe, moe_weights(p, l, B, T, key), N, shape);
      reduce_from_tensor_parallel_region(tp_, sc.d_c1, out_rows, N, C);
    }
    if (!output) return;
    const PhiloxStream stream = site_stream(key, p.name + "mlp.dropout");
    const LayerNormOut ln = after ? layernorm_out(*after) : LayerNormOut{};
    for (const DropoutRun& r : runs) {  // the dropout runs (context parallelism: each chunk's positions)
      const int64_t at = r.row * C;
      if (after)
        bias_dropout_add_layernorm_forward(a.resid[i + 1] + at, mid + at, out_rows + at, bias(-1), r.rows, C,
                                           p_hidden, stream, r.first_index, Rounding::none, rows_from(ln, r.row));
      else
        bias_dropout_add_forward(a.resid[i + 1] + at, mid + at, out_rows + at, bias(-1), r.rows, C, p_hidden,
                                 stream, r.first_index, Rounding::none);
    }
    return;
  }
  mlp_fc1_forward(p, a, i, N);
  if (!output) return;
  row_parallel_output(a.resid[i + 1], mid, out_rows, input(x.gelu), p.fc2_w, p.fc2_b, N, Fl_, p_hidden,
                      site_stream(key, p.name + "mlp.dropout"), runs, after);
}

void GPTModel::rotate_qkv(float* qkv, int64_t B, int64_t T, int64_t layer) {
  if (!rope_ || !cfg_.rotary_layer(layer)) return;
  for (const TokenRun& r : token_runs(B, T))
    rope_forward(qkv + r.row * qkv_local(), *rope_table(T), r.rows, cp_.on() ? r.rows : T, r.position, qkv_layout());
}

// fc1's rounding, bias and GELU (or SwiGLU) in one pass (Megatron's bias_gelu, bias_swiglu).
// With bf16 inputs the GEMM writes its rounded result in bf16 into x.fc1 and the activation
// is fc2's bf16 input; the backward adds the bias again (bias_gelu_backward_packed).
// Otherwise x.fc1 keeps the fp32 pre-activation for the backward.

void GPTModel::mlp_fc1_forward(const LayerParams& p, Activations& a, size_t i, int64_t N) {
  const int64_t C = cfg_.hidden_size, F1l = fc1_local();
  Activations::Layer& x = a.layers[i];
  if (bf16_inputs()) {
    const uint16_t* y = gemm_policy_->forward_bf16(p.fc1_w, x.fc1, ln_input(x.ln2, N), params_.param(p.fc1_w), N, C,
                                                   F1l);
    uint16_t* act = reinterpret_cast<uint16_t*>(x.gelu);
    if (cfg_.gated_linear_unit())
      bias_swiglu_forward_packed(act, y, bias_or_null(p.fc1_b), N, Fl_, cfg_.glu_form());
    else
      bias_gelu_forward_packed(act, y, bias(p.fc1_b), N, Fl_, cfg_.gelu);
  } else {
    linear_forward(x.fc1, ln_input(x.ln2, N), params_.param(p.fc1_w), nullptr, N, C, F1l,
                   site(p.fc1_w).rounded_by_caller());
    if (cfg_.gated_linear_unit())
      bias_swiglu_forward(x.fc1, x.gelu, x.fc1, bias_or_null(p.fc1_b), N, Fl_, rounding(site(p.fc1_w)),
                          cfg_.glu_form());
    else
      bias_gelu_forward(x.fc1, x.gelu, x.fc1, bias(p.fc1_b), N, Fl_, cfg_.gelu, rounding(site(p.fc1_w)));
  }
}

LayerNormOut GPTModel::rows_from(LayerNormOut o, int64_t row) const {
  const int64_t C = cfg_.hidden_size;
  if (o.f32) o.f32 += row * C;
  if (o.bf16) o.bf16 += row * C;
  if (o.mean) o.mean += row;
  if (o.rstd) o.rstd += row;
  return o;
}

void GPTModel::row_parallel_output(float* out, const float* residual, float* y, LinearInput x, int w, int b,
                                   int64_t N, int64_t in_local, float p, const PhiloxStream& stream,
                                   const std::vector<DropoutRun>& runs, const std::optional<NextNorm>& norm) {
  const int64_t C = cfg_.hidden_size;
  const LayerNormOut ln = norm ? layernorm_out(*norm) : LayerNormOut{};
  auto ln_at = [&](const DropoutRun& r) { return rows_from(ln, r.row); };
  if (bf16_row_outputs()) {
    const uint16_t* y16 = gemm_policy_->forward_bf16(w, y, x, params_.param(w), N, in_local, C);
    for (const DropoutRun& r : runs) {
      const int64_t at = r.row * C;
      if (norm)
        bias_dropout_add_layernorm_forward(out + at, residual + at, y16 + at, bias(b), r.rows, C, p, stream,
                                           r.first_index, ln_at(r));
      else
        bias_dropout_add_forward(out + at, residual + at, y16 + at, bias(b), r.rows, C, p, stream, r.first_index);
    }
    return;
  }
  row_parallel_linear_forward(tp_, y, scratch_->d_c1, x, params_.param(w), nullptr, N, in_local, C,
                              site(w).rounded_by_caller());
  for (const DropoutRun& r : runs) {
    const int64_t at = r.row * C;
    if (norm)
      bias_dropout_add_layernorm_forward(out + at, residual + at, y + at, bias(b), r.rows, C, p, stream, r.first_index,
                                         rounding(site(w)), ln_at(r));
    else
      bias_dropout_add_forward(out + at, residual + at, y + at, bias(b), r.rows, C, p, stream, r.first_index,
                               rounding(site(w)));
  }
}

uint16_t* GPTModel::attn_bf16(float* qkv, int64_t N) const {
  if (!bf16_qkv()) return nullptr;
  return reinterpret_cast<uint16_t*>(qkv) + N * qkv_local();
}

void GPTModel::gate_attention_output(const float* attn, const float* qkv, int64_t N) {
  if (cfg_.attention_output_gate) attention_output_gate_forward(scratch_->attn_gated, attn, qkv, N, qkv_layout());
}

LinearInput GPTModel::proj_input(float* qkv, const float* attn, int64_t N) const {
  if (uint16_t* attn16 = attn_bf16(qkv, N)) return LinearInput::in_bf16(attn16);
  return LinearInput(attn);
}

LinearInput GPTModel::proj_input(const LayerParams& p, const Activations& a, size_t i, int64_t N) const {
  const Activations::Layer& x = a.layers[i];
  if (p.linear) return LinearInput(x.attn);
  if (cfg_.multi_latent_attention) return LinearInput(x.attn_v);
  if (cfg_.attention_output_gate) return LinearInput(scratch_->attn_gated);
  return proj_input(x.qkv, x.attn, N);
}

GPTModel::RowOutputGrad GPTModel::row_output_grad(float* d_rows, int b, int64_t N, float p,
                                                  const PhiloxStream& stream, const std::vector<DropoutRun>& runs,
                                                  bool made) {
  const int64_t C = cfg_.hidden_size;
  if (!bf16_row_output_grads()) return RowOutputGrad{hidden_dropout_backward(d_rows, p, stream, runs), nullptr};
  const uint64_t first_index = runs[0].first_index;  // one run: no context parallelism here
  uint16_t* dy16 = reinterpret_cast<uint16_t*>(scratch_->d_f);
  if (made)
    LATTICE_CHECK(residual_grad_out(b, p).bf16 == dy16) << "row_output_grad: made by a LayerNorm backward it can't be";
  else if (p == 0.0f)
    bias_backward_cast_bf16(bias_grad(b), dy16, scratch_->d_resid, N, C);
  else
    dropout_backward_bias_cast_bf16(bias_grad(b), dy16, scratch_->d_resid, N, C, p, stream, first_index);
  return RowOutputGrad{nullptr, dy16};
}

ResidualGradOut GPTModel::residual_grad_out(int b, float p) const {
  if (!bf16_row_output_grads() || p != 0.0f) return {};
  return ResidualGradOut{reinterpret_cast<uint16_t*>(scratch_->d_f), bias_grad(b)};
}

GemmSite GPTModel::ln_grad_site(int w) const {
  return bf16_ln_grads() ? site(w).input_grad_in_bf16() : site(w).rounded_by_caller();
}

LayerNormDout GPTModel::ln_dout(const float* d, int w) const {
  if (bf16_ln_grads()) return LayerNormDout::in_bf16(reinterpret_cast<const uint16_t*>(d));
  return LayerNormDout(d, rounding(site(w)));
}

const float* GPTModel::hidden_dropout_backward(float* d_rows, float p, const PhiloxStream& stream,
                                               const std::vector<DropoutRun>& runs) const {
  if (p == 0.0f) return scratch_->d_resid;
  const int64_t C = cfg_.hidden_size;
  for (const DropoutRun& r : runs)
    dropout_backward(d_rows + r.row * C, scratch_->d_resid + r.row * C, r.rows * C, p, stream, r.first_index);
  return d_rows;
}

void GPTModel::update_expert_biases(Comm* dp) {
  if (!cfg_.moe_router_enable_expert_bias) return;
  const int64_t E = cfg_.num_experts;
  // Every layer's counts in one reduction over each group that routes other tokens (the data- and
  // context-parallel ranks, the tensor-parallel ones with whole experts); otherwise the
  // tensor-parallel ranks route the same rows, so their counts are already equal.
  if (dp && dp->size() > 1) dp->all_reduce(expert_tokens_.data(), int64_t(expert_tokens_.size()), ReduceOp::sum);
  if (Comm* g = moe_token_group()) g->all_reduce(expert_tokens_.data(), int64_t(expert_tokens_.size()), ReduceOp::sum);
  // --mtp-use-repeated-layer: one router for every depth, moved once by all their tokens.
  const size_t first_depth = layers_.size();
  if (cfg_.mtp_use_repeated_layer)
    for (size_t i = first_depth + 1; i < first_depth + mtp_.size(); ++i)
      for (int64_t e = 0; e < E; ++e) {
        expert_tokens_[first_depth * size_t(E) + size_t(e)] += expert_tokens_[i * size_t(E) + size_t(e)];
        expert_tokens_[i * size_t(E) + size_t(e)] = 0.0;
      }
  for (size_t i = 0; i < first_depth + (cfg_.mtp_use_repeated_layer ? std::min<size_t>(mtp_.size(), 1) : mtp_.size());
       ++i) {
    const LayerParams& p = i < layers_.size() ? layers_[i] : mtp_[i - layers_.size()].layer;
    if (p.expert_bias < 0) continue;
    const double* tokens = expert_tokens_.data() + i * size_t(E);
    double mean = 0.0;
    for (int64_t e = 0; e < E; ++e) mean += tokens[e];
    mean /= double(E);
    std::vector<float> bias(static_cast<size_t>(E));
    params_.read_param(p.expert_bias, bias.data());
    for (int64_t e = 0; e < E; ++e) {
      const double offset = mean - tokens[e];
      bias[size_t(e)] += float((offset > 0) - (offset < 0)) * cfg_.moe_router_bias_update_rate;
    }
    params_.write_param(p.expert_bias, bias.data());
  }
  std::fill(expert_tokens_.begin(), expert_tokens_.end(), 0.0);
}

void GPTModel::reset_global_aux_loss_tracker() {
  for (MoeGlobalBalance& g : global_balance_) g.reset();
}

GPTModel::MoeLossSums GPTModel::take_moe_losses() {
  const MoeLossSums l{load_balancing_, seq_load_balancing_, global_load_balancing_, z_loss_, layer_load_balancing_,
                      layer_z_loss_};
  load_balancing_ = seq_load_balancing_ = global_load_balancing_ = z_loss_ = {};
  std::fill(layer_load_balancing_.begin(), layer_load_balancing_.end(), LossSum{});
  std::fill(layer_z_loss_.begin(), layer_z_loss_.end(), LossSum{});
  return l;
}

GemmSite GPTModel::router_site(int param) const {
  if (cfg_.moe_router_dtype == "fp32" || (gemm_policy_ && gemm_policy_->fp8())) return GemmSite{nullptr, param};
  return site(param);
}

MoeShape GPTModel::moe_shape(int64_t B, int64_t T, bool capacity, bool training) const {
  MoeShape s = lattice::moe_shape(cfg_, tp_.size(), ep_ ? ep_->size() : 1);
  if (cfg_.moe_seq_aux_loss) {
    s.aux_group = T;
    if (experts_whole_) {  // this rank's rows: a part of the B sequences', which the tensor-parallel ranks split
      s.aux_row0 = tp_.shard_begin(B * T);
      s.aux_sequences = B;
      s.aux_split = tp_.size();
    }
  }
  s.sinkhorn = cfg_.moe_sinkhorn && training;
  if (!training) s.input_jitter_eps = 0.0f;  // the state is carved with the jitter's buffer all the same
  s.force_balance = cfg_.moe_router_force_load_balancing && capacity;  // training and evaluation, not generation
  if (capacity) {  // generation is dropless
    s.capacity_factor = cfg_.moe_expert_capacity_factor;
    s.drop_by_position = cfg_.moe_token_drop_policy == "position";
  }
  return s;
}

MoeWeights GPTModel::moe_weights(const LayerParams& p, int64_t l, int64_t B, int64_t Tl,
                                  const MicroBatchKey& key) const {
  MoeWeights w;
  // The input jitter's and the forced balance's draws: each row's by its token in one process.
  if ((cfg_.moe_input_jitter_eps > 0.0f && key.training) || (cfg_.moe_router_force_load_balancing && !key.generation)) {
    w.jitter_stream = site_stream(key, p.name + "mlp.router.input_jitter");
    w.balance_stream = site_stream(key, p.name + "mlp.router.force_load_balancing");
    // (whole experts: the runs' parts within this rank's sequence-parallel rows, from row 0)
    const int64_t N = B * Tl, begin = experts_whole_ ? tp_.shard_begin(N) : 0, end = begin + moe_rows(N);
    for (const TokenRun& r : token_runs(B, Tl)) {
      const int64_t b = std::max(r.row, begin), e = std::min(r.row + r.rows, end);
      if (b < e) w.token_runs.push_back(MoeWeights::TokenRun{b - begin, e - b, r.token + b - r.row});
    }
  }
  w.router = params_.param(p.router_w);
  w.router_site = router_site(p.router_w);
  if (p.router_b >= 0) w.router_bias = params_.param(p.router_b);
  if (p.expert_bias >= 0) w.expert_bias = params_.param(p.expert_bias);
  w.add_fc2_bias = experts_whole_ || tp_.rank() == 0;
  w.token_group = moe_token_group();
  for (size_t e = 0; e < p.expert_fc1_b.size(); ++e) {
    w.fc1_bias.push_back(params_.param(p.expert_fc1_b[e]));
    w.fc2_bias.push_back(params_.param(p.expert_fc2_b[e]));
  }
  w.ep = MoeExpertParallel{ep_, &moe_ep_scratch_};
  for (size_t e = 0; e < p.expert_fc1.size(); ++e) {
    w.fc1.push_back(params_.param(p.expert_fc1[e]));
    w.fc2.push_back(params_.param(p.expert_fc2[e]));
    w.fc1_site.push_back(site(p.expert_fc1[e]));
    w.fc2_site.push_back(site(p.expert_fc2[e]));
  }
  if (p.shared_fc1 >= 0) {
    w.shared_fc1 = params_.param(p.shared_fc1);
    w.shared_fc2 = params_.param(p.shared_fc2);
    w.shared_fc1_site = site(p.shared_fc1);
    w.shared_fc2_site = site(p.shared_fc2);
  }
  if (p.shared_gate >= 0) {
    w.shared_gate = params_.param(p.shared_gate);
    w.shared_gate_site = router_site(p.shared_gate);
  }
  if (p.latent_fc1 >= 0) {
    w.latent_fc1 = params_.param(p.latent_fc1);
    w.latent_fc2 = params_.param(p.latent_fc2);
    w.latent_fc1_site = site(p.latent_fc1);
    w.latent_fc2_site = site(p.latent_fc2);
  }
  return w;
}

Comm* GPTModel::moe_token_group() const {
  if (experts_whole_ && cp_.on()) {
    LATTICE_CHECK(tp_cp_ && tp_cp_->size() == tp_.size() * cp_.size())
        << "whole experts under context parallelism need the tensor x context-parallel group";
    return tp_cp_;
  }
  if (experts_whole_) return tp_.comm;
  return cp_.on() ? cp_.comm : nullptr;
}

MoeGrads GPTModel::moe_grads(const LayerParams& p) const {
  MoeGrads g;
  g.router = params_.grad(p.router_w);
  if (p.router_b >= 0) g.router_bias = params_.grad(p.router_b);
  for (size_t e = 0; e < p.expert_fc1.size(); ++e) {
    g.fc1.push_back(params_.grad(p.expert_fc1[e]));
    g.fc2.push_back(params_.grad(p.expert_fc2[e]));
  }
  for (size_t e = 0; e < p.expert_fc1_b.size(); ++e) {
    g.fc1_bias.push_back(params_.grad(p.expert_fc1_b[e]));
    g.fc2_bias.push_back(params_.grad(p.expert_fc2_b[e]));
  }
  if (p.shared_fc1 >= 0) {
    g.shared_fc1 = params_.grad(p.shared_fc1);
    g.shared_fc2 = params_.grad(p.shared_fc2);
  }
  if (p.shared_gate >= 0) g.shared_gate = params_.grad(p.shared_gate);
  if (p.latent_fc1 >= 0) {
    g.latent_fc1 = params_.grad(p.latent_fc1);
    g.latent_fc2 = params_.grad(p.latent_fc2);
  }
  return g;
}

QkNormParams GPTModel::qk_norm_params(const LayerParams& p) const {
  if (cfg_.qk_l2_norm) return QkNormParams{qk_l2_ones_.data(), no_bias_.data(), qk_l2_ones_.data(), no_bias_.data()};
  return QkNormParams{norm_weight(p.q_norm_w), bias(p.q_norm_b), norm_weight(p.k_norm_w), bias(p.k_norm_b)};
}

QkNormGrads GPTModel::qk_norm_grads(const LayerParams& p) const {
  if (cfg_.qk_l2_norm)  // no parameters: the weights' and biases' gradients summed into the sink
    return QkNormGrads{bias_grad_sink_.data(), bias_grad_sink_.data(), bias_grad_sink_.data(), bias_grad_sink_.data()};
  return QkNormGrads{params_.grad(p.q_norm_w), bias_grad(p.q_norm_b), params_.grad(p.k_norm_w), bias_grad(p.k_norm_b)};
}

const float* GPTModel::softmax_offset(const LayerParams& p) const {
  if (!cfg_.softmax_sink()) return nullptr;
  return p.softmax_offset >= 0 ? params_.param(p.softmax_offset) : zero_offsets_.data();
}

float* GPTModel::softmax_offset_grad(const LayerParams& p) {
  return p.softmax_offset >= 0 ? params_.grad(p.softmax_offset) : nullptr;
}

AttentionOperand GPTModel::qkv_input(const LayerParams& p, const float* qkv) const {
  if (!bf16_qkv()) return AttentionOperand(qkv);
  return AttentionOperand::packed(reinterpret_cast<const uint16_t*>(qkv), bias_or_null(p.qkv_b));
}

void GPTModel::core_attention_forward(const LayerParams& p, Activations& a, size_t i, int64_t B, int64_t T,
                                      const MicroBatchKey& key) {
  if (p.mamba) return mamba_forward(p, a, i, B, T);
  if (p.linear) return gdn_forward(p, a, i, B, T);
  Activations::Layer& x = a.layers[i];
  const float p_attn = key.training ? cfg_.attention_dropout : 0.0f;
  AttentionDropout ad{p_attn, site_stream(key, p.name + "core_attention.dropout"), 0,
                      cfg_.num_attention_heads, Hl_ * tp_.rank()};
  const AttentionShape shape{B, T, Hl_, cfg_.kv_channels, Gl_, cfg_.attention_window(p.layer), softmax_offset(p),
                             cfg_.attention_output_gate};
  if (cp_.on()) {  // the queries of this rank's tokens over the whole sequences' keys and values
    const ContextSplit s = cp_.split(T * cp_.size());
    gather_context_keys(cp_, s, cp_kv_.data(), cp_staging_.data(), x.qkv, qkv_layout(), B);
    ContextKeys keys = s.keys(cp_kv_.data(), nullptr);
    if (docs_.reset_attention_mask) keys.key_document_ids = a.key_ids.device();
    attention_forward(x.attn, x.lse, x.qkv, shape, ad, docs_.reset_attention_mask ? a.document_ids() : nullptr,
                      attention_math_, nullptr, &keys);
  } else {
    attention_forward(x.attn, x.lse, qkv_input(p, x.qkv), shape, ad,
                      docs_.reset_attention_mask ? a.document_ids() : nullptr, attention_math_,
                      attn_bf16(x.qkv, B * T));
  }
  if (cfg_.multi_latent_attention) mla_attention_output(a, i, B * T);
}

void GPTModel::backward_layers(const LayerParams* layers, int chunk, Activations& a, const LayerNormDout* d_lnf,
                               int norm_w, int norm_b, int64_t B, int64_t T, const MicroBatchKey& key) {
  const bool sp = tp_.sp();
  Scratch& sc = *scratch_;
  const int64_t N = B * T, C = cfg_.hidden_size, D = cfg_.kv_channels;
  const int64_t Ns = tp_.shard_rows(N), row0 = tp_.shard_begin(N);
  const bool mla = cfg_.multi_latent_attention;
  const float p_hidden = key.training ? cfg_.hidden_dropout : 0.0f;
  const float p_attn = key.training ? cfg_.attention_dropout : 0.0f;
  const std::vector<DropoutRun> runs = dropout_runs(B, T, p_hidden);
  // A column-parallel layer's input gradient, reduced: full rows, or this rank's shard.
  const float* d_ln = sp ? sc.d_s : sc.d_c1;
  float* d_rows = sp ? sc.d_s : sc.d_c1;  // [Ns, C] gradient of a row-parallel output

  // Whether the LayerNorm backward that made d_resid made the next row-parallel layer's
  // output gradient too (residual_grad_out).
  bool d_rows_made = false;
  if (d_lnf) {
    // Final LayerNorm backward into d_resid.
    zero_on_device(sc.d_resid, size_t(Ns * C) * sizeof(float));
    const ResidualGradOut next =
        a.layers.empty() ? ResidualGradOut{} : residual_grad_out(output_bias(layers[a.layers.size() - 1]), p_hidden);
    layernorm_backward(sc.d_resid, params_.grad(norm_w), bias_grad(norm_b), *d_lnf, a.resid.back(),
                       norm_weight(norm_w), a.lnf_mean, a.lnf_rstd, Ns, C, next, normalization());
    d_rows_made = next.bf16 != nullptr;
    grads_ready({norm_w, norm_b});
  }

  for (size_t i = a.layers.size(); i-- > 0;) {
    const LayerParams& p = layers[i];
    const int64_t l = p.layer, Cl = proj_in_local(p);
    Activations::Layer& x = a.layers[i];
    // Full recomputation: the group's forward again from its kept input, into the shared
    // group buffers (the last layer's output, already consumed, is not recomputed).
    if (a.recompute_from[i] >= 0)
      for (size_t j = size_t(a.recompute_from[i]); j <= i; ++j)
        forward_layer(layers[j], a, j, B, T, key, j < i, j > size_t(a.recompute_from[i]),
                      j < i ? next_norm(chunk, a, j + 1, row0) : std::nullopt);
    // The MLP block's residual input (resid_mid, or the input of an MLP-only layer).
    const float* mid = p.attention ? x.resid_mid : a.resid[i];
    // --recompute-modules mla_up_proj: the fused, rotated qkv again from the kept latents.
    if (cfg_.recompute_mla_up_proj() && p.attention) {
      mla_up_forward(p, a, i, N);
      rotate_qkv(x.qkv, B, T, l);
    }
    // Selective recomputation: the core attention's output and statistics again from
    // the kept qkv (the proj backward and the attention backward need them).
    if (selective_ && p.attention) core_attention_forward(p, a, i, B, T, key);
    // --recompute-modules layernorm: LN2's output again from its kept input (the statistics come
    // out as kept); mlp: a dense layer's fc1 output and activation again from it.
    if (cfg_.recompute_layernorm() && p.mlp) layernorm_input(x.ln2, x.ln2_mean, x.ln2_rstd, mid, p.ln2_w, p.ln2_b, Ns);
    if (cfg_.recompute_mlp() && p.mlp && !cfg_.moe_layer(l)) mlp_fc1_forward(p, a, i, N);
    // What the layer's first norm's backward may make: the previous layer's last row-parallel output
    // gradient; and LN2's: the projection's, or in an MLP-only layer that previous layer's.
    const ResidualGradOut before_grad =
        i > 0 ? residual_grad_out(output_bias(layers[i - 1]), p_hidden) : ResidualGradOut{};
    const ResidualGradOut proj_grad = p.attention ? residual_grad_out(p.proj_b, p_hidden) : before_grad;
    if (!p.mlp) {
      // A mixer-only layer: d_resid is the gradient of its output and of the residual path.
    } else if (cfg_.moe_layer(l)) {
      // MoE layer: its output gradient (through the MLP's dropout) [Ns, C], every token's (all-gathered
      // into d_c1 with sequence parallelism); its partial input gradient [N, C] into d_c2 (free
      // until the projection's backward), reduced as a column-parallel layer's (all-reduced, or
      // reduce-scattered into d_s), then LN2's backward as for the dense MLP.
      const RowOutputGrad d_out = row_output_grad(d_rows, -1, N, p_hidden, site_stream(key, p.name + "mlp.dropout"),
                                                  runs, d_rows_made);
      // With whole experts the layer runs on this rank's rows alone: no gather, no reduction.
      const float* dy = d_out.fp32;
      if (sp && !experts_whole_) {
        copy_on_device(sc.d_c1 + row0 * C, d_out.fp32, size_t(Ns * C) * sizeof(float));
        gather_from_sequence_parallel_region(tp_, sc.d_c1, N, C);
        dy = sc.d_c1;
      }
      MoeGrads g = moe_grads(p);
      const int64_t Nm = moe_rows(N);
      const float* moe_in = experts_whole_ ? input(x.ln2).f32 : ln_input(x.ln2, N).f32;
      // MoE-layer recomputation: the routing, dispatch and experts again into the shared buffers
      // (the output into d_c2, which the backward then overwrites with the input gradient).
      const MoeWeights w = moe_weights(p, l, B, T, key);
      const MoeShape shape = moe_shape(B, T, true, true);
      // (whole experts with shared experts: the routed input gradient in place among zeros [N, C], to
      // which the shared experts' partial one is added before the reduce-scatter)
      const bool apart = experts_whole_ && shape.shared_apart;
      float* d_routed = apart ? sc.d_c2 + row0 * C : sc.d_c2;
      if (cfg_.recompute_moe()) {
        moe_forward(d_routed, moe_in, *x.moe, w, Nm, shape);
        if (apart) moe_shared_forward(sc.d_c2, ln_input(x.ln2, N).f32, *x.moe, w, N, shape);  // (its buffers)
      }
      x.moe->global_counts = cfg_.moe_global_aux_loss ? x.moe_global_counts.data() : nullptr;
      x.moe->global_tokens = x.moe_global_tokens;
      if (apart) zero_on_device(sc.d_c2, size_t(N * C) * sizeof(float));
      moe_backward(d_routed, dy, moe_in, *x.moe, w, g, sc.moe, Nm, shape, a.grad_scale,
                   experts_whole_ ? nullptr : tp_.comm, experts_whole_ || tp_.rank() == 0);
      if (apart) {  // the output gradient of every token's row for the shared experts
        copy_on_device(sc.d_c1 + row0 * C, d_out.fp32, size_t(Ns * C) * sizeof(float));
        gather_from_sequence_parallel_region(tp_, sc.d_c1, N, C);
        moe_shared_backward(sc.d_c2, sc.d_c1, ln_input(x.ln2, N).f32, *x.moe, w, g, sc.moe, N, shape, tp_.comm,
                            tp_.rank() == 0);
      }
      float* d_ln2 = sp && (!experts_whole_ || apart) ? sc.d_s : sc.d_c2;
      if (!experts_whole_ || apart) reduce_from_tensor_parallel_region(tp_, sc.d_c2, d_ln2, N, C);
      layernorm_backward(sc.d_resid, params_.grad(p.ln2_w), bias_grad(p.ln2_b), LayerNormDout(d_ln2), mid,
                         norm_weight(p.ln2_w), x.ln2_mean, x.ln2_rstd, Ns, C, proj_grad, normalization());
      grads_ready({p.router_w});
      grads_ready(p.expert_fc1);
      grads_ready(p.expert_fc2);
      grads_ready(p.expert_fc1_b);
      grads_ready(p.expert_fc2_b);
      for (int s : {p.shared_fc1, p.shared_fc2, p.shared_gate, p.expert_bias, p.router_b, p.latent_fc1, p.latent_fc2})
        if (s >= 0) grads_ready({s});
    } else {
      // MLP block: d_resid is d(layer output) and stays as the residual path's gradient.
      const RowOutputGrad d_fc2 = row_output_grad(d_rows, p.fc2_b, N, p_hidden,
                                                  site_stream(key, p.name + "mlp.dropout"), runs, d_rows_made);
      // fc2's input gradient, rounded as the GELU (SwiGLU) backward reads it (one pass). With bf16
      // inputs its GEMM writes it rounded, in bf16, in the place of fc2's bf16 input x.gelu
      // (read by fc2's weight gradient just before); and the GELU backward makes fc1's output
      // gradient in bf16 only, for fc1's GEMMs, in the place of fc1's bf16 result (read there
      // for the last time), summing fc1's bias gradient as it goes (no fp32 gradient stored).
      const bool bf16 = bf16_inputs();
      row_parallel_linear_backward(tp_, bf16 ? x.gelu : sc.d_f, params_.grad(p.fc2_w),
                                   d_fc2.bf16 ? nullptr : bias_grad_or_null(p.fc2_b), d_fc2.fp32, sc.d_c2, input(x.gelu),
                                   params_.param(p.fc2_w), N, Fl_, C,
                                   bf16 ? site(p.fc2_w).input_grad_in_bf16() : site(p.fc2_w).rounded_by_caller(),
                                   d_fc2.bf16);
      // SwiGLU's fp32 gradient [N, F1l] is twice fc2's input gradient: it goes over its
      // pre-activation in x.fc1 instead.
      const int64_t F1l = fc1_local();
      uint16_t* d_f16 = bf16 ? reinterpret_cast<uint16_t*>(x.fc1) : nullptr;
      float* d_f1 = cfg_.gated_linear_unit() ? x.fc1 : sc.d_f;
      const uint16_t* d_act16 = reinterpret_cast<const uint16_t*>(x.gelu);
      if (bf16 && cfg_.gated_linear_unit())
        bias_swiglu_backward_packed_dbias(d_f16, bias_grad(p.fc1_b), d_f16, bias_or_null(p.fc1_b), d_act16, N, Fl_,
                                          cfg_.glu_form());
      else if (bf16)
        bias_gelu_backward_packed_dbias(d_f16, bias_grad(p.fc1_b), d_f16, bias(p.fc1_b), d_act16, N, Fl_, cfg_.gelu);
      else if (cfg_.gated_linear_unit())
        swiglu_backward(d_f1, x.fc1, sc.d_f, N, Fl_, rounding(site(p.fc2_w)), cfg_.glu_form());
      else
        gelu_backward(sc.d_f, x.fc1, sc.d_f, N * Fl_, cfg_.gelu, rounding(site(p.fc2_w)));
      column_parallel_linear_backward(tp_, sc.d_c1, sc.d_s, params_.grad(p.fc1_w), bf16 ? nullptr : bias_grad_or_null(p.fc1_b),
                                      bf16 ? nullptr : d_f1, ln_input(x.ln2, N), params_.param(p.fc1_w), N, C, F1l,
                                      ln_grad_site(p.fc1_w), d_f16);
      // The input gradient rounded as the LayerNorm backward reads it (one pass fewer), or
      // already rounded, in bf16 (ln_dout); d_resid becomes d(resid_mid), and with it the
      // projection's output gradient may be made (residual_grad_out).
      layernorm_backward(sc.d_resid, params_.grad(p.ln2_w), bias_grad(p.ln2_b), ln_dout(d_ln, p.fc1_w), mid,
                         norm_weight(p.ln2_w), x.ln2_mean, x.ln2_rstd, Ns, C, proj_grad, normalization());
    }
    if (!p.attention) {  // an MLP-only layer: LN2 was its first norm
      d_rows_made = before_grad.bf16 != nullptr;
      grads_ready({p.ln2_w, p.ln2_b, p.fc1_w, p.fc1_b, p.fc2_w, p.fc2_b});
      continue;
    }
    // Attention block.
    const RowOutputGrad d_proj =
        row_output_grad(d_rows, p.proj_b, N, p_hidden, site_stream(key, p.name + "self_attention.dropout"), runs,
                        p.mlp ? proj_grad.bf16 != nullptr : d_rows_made);
    // The projection's input gradient, rounded; with bf16 qkv its GEMM writes it so, in bf16,
    // and the attention backward reads it as it is (no rounding pass, half the bytes).
    const bool bf16_d_attn = bf16_qkv();
    // MLA with values narrower than the heads: the gradient of attn_v, widened into d_c2.
    float* d_proj_in = mla && sc.mla_d_attn_v ? sc.mla_d_attn_v : sc.d_c2;
    if (!p.linear) gate_attention_output(x.attn, x.qkv, N);  // the projection's input again (--attention-output-gate)
    row_parallel_linear_backward(tp_, d_proj_in, params_.grad(p.proj_w), d_proj.bf16 ? nullptr : bias_grad_or_null(p.proj_b),
                                 d_proj.fp32, sc.d_c1, proj_input(p, a, i, N), params_.param(p.proj_w), N, Cl,
                                 C, bf16_d_attn ? site(p.proj_w).input_grad_in_bf16() : site(p.proj_w), d_proj.bf16);
    // With bf16 qkv the attention backward writes the QKV layer's output gradient in bf16
    // for its GEMMs, into sc.d_f (free again: fc1's backward is done; it holds the [N, W/P]
    // bf16 values when W/P <= 2 Fl, e.g. ffn_hidden_size >= 1.5 hidden_size without grouping),
    // and sums the bias gradient from the fp32 one (which its tensor-core kernels then never
    // store in sc.d_3c).
    uint16_t* d_3c16 = bf16_d_attn && qkv_local() <= 2 * Fl_ ? reinterpret_cast<uint16_t*>(sc.d_f) : nullptr;
    float* d_qkv_b = d_3c16 ? bias_grad_or_null(p.qkv_b) : nullptr;
    if (p.mamba) {  // a Mamba layer: its core's backward into d_3c (in_proj's output gradient)
      mamba_backward(p, a, i, B, T, selective_ || a.recompute_from[i] >= 0);
    } else if (p.linear) {  // a GDN layer: the same
      gdn_backward(p, a, i, B, T, selective_ || a.recompute_from[i] >= 0);
    } else {
      if (d_proj_in != sc.d_c2) mla_attention_output_backward(d_proj_in, N);
      // --attention-output-gate: the attention output's gradient in place of the gated one's, the gates'
      // into d_3c's gate slots (the attention backward writes the others).
      if (cfg_.attention_output_gate)
        attention_output_gate_backward(sc.d_c2, sc.d_3c, sc.d_c2, x.attn, x.qkv, N, qkv_layout());
      const AttentionOperand d_attn = bf16_d_attn
                                          ? AttentionOperand::in_bf16(reinterpret_cast<const uint16_t*>(sc.d_c2))
                                          : AttentionOperand(sc.d_c2);
      AttentionDropout ad{p_attn, site_stream(key, p.name + "core_attention.dropout"), 0,
                          cfg_.num_attention_heads, Hl_ * tp_.rank()};
      const AttentionShape shape{B, T, Hl_, D, Gl_, cfg_.attention_window(p.layer), softmax_offset(p),
                                 cfg_.attention_output_gate};
      if (cp_.on()) {
        // The keys and values gathered again; their gradients (every rank's queries') summed back
        // to the ranks holding their tokens, into d_3c's key and value slots.
        const ContextSplit s = cp_.split(T * cp_.size());
        gather_context_keys(cp_, s, cp_kv_.data(), cp_staging_.data(), x.qkv, qkv_layout(), B);
        ContextKeys keys = s.keys(cp_kv_.data(), cp_staging_.data());
        if (docs_.reset_attention_mask) keys.key_document_ids = a.key_ids.device();
        attention_backward(sc.d_3c, d_attn, x.qkv, x.attn, x.lse, shape, ad,
                           docs_.reset_attention_mask ? a.document_ids() : nullptr, attention_math_, nullptr, nullptr,
                           &keys, softmax_offset_grad(p));
        scatter_context_key_grads(cp_, s, sc.d_3c, cp_staging_.data(), cp_kv_.data(), cp_recv_.data(), qkv_layout(), B);
      } else {
        attention_backward(sc.d_3c, d_attn, qkv_input(p, x.qkv), x.attn, x.lse, shape, ad,
                           docs_.reset_attention_mask ? a.document_ids() : nullptr, attention_math_, d_3c16, d_qkv_b,
                           nullptr, softmax_offset_grad(p));
      }
      if (rope_ && cfg_.rotary_layer(l)) {  // d(q, k) before the rotation, each run of tokens at its positions
        for (const TokenRun& r : token_runs(B, T)) {
          RopeTable t = *rope_table(T);
          t.cos += r.position * t.half;
          t.sin += r.position * t.half;
          t.positions -= r.position;
          rope_backward(sc.d_3c + r.row * qkv_local(), t, r.rows, cp_.on() ? r.rows : T, qkv_layout());
        }
      }
      if (cfg_.qk_norm())  // d(q, k) before their norm
        qk_layernorm_backward(sc.d_3c, qk_norm_grads(p), x.qk_raw, x.qk_mean, x.qk_rstd, qk_norm_params(p), sc.qk_tmp,
                              sc.qk_dx, N, qkv_layout(), qk_normalization());
    }
    // --recompute-modules layernorm: LN1's output again (the QKV layer's weight gradient reads it).
    if (cfg_.recompute_layernorm()) layernorm_input(x.ln1, x.ln1_mean, x.ln1_rstd, a.resid[i], p.ln1_w, p.ln1_b, Ns);
    if (mla)
      mla_qkv_backward(p, a, i, ln_input(x.ln1, N), N);
    else
      column_parallel_linear_backward(tp_, sc.d_c1, sc.d_s, params_.grad(p.qkv_w),
                                      d_qkv_b ? nullptr : bias_grad_or_null(p.qkv_b), d_3c16 ? nullptr : sc.d_3c,
                                      ln_input(x.ln1, N), params_.param(p.qkv_w), N, C, qkv_local(p),
                                      ln_grad_site(p.qkv_w), d_3c16);
    // d_resid becomes d(layer input): the output gradient of the previous layer's fc2 (made
    // here with residual_grad_out), or the chunk's input gradient after the first layer.
    layernorm_backward(sc.d_resid, params_.grad(p.ln1_w), bias_grad(p.ln1_b), ln_dout(d_ln, mla ? p.kv_down_w : p.qkv_w),
                       a.resid[i],
                       norm_weight(p.ln1_w), x.ln1_mean, x.ln1_rstd, Ns, C, before_grad, normalization());
    d_rows_made = before_grad.bf16 != nullptr;
    grads_ready({p.ln1_w, p.ln1_b, p.qkv_w, p.qkv_b, p.q_norm_w, p.q_norm_b, p.k_norm_w, p.k_norm_b, p.proj_w,
                 p.proj_b, p.ln2_w, p.ln2_b, p.fc1_w, p.fc1_b, p.fc2_w, p.fc2_b, p.q_proj_w, p.q_down_w, p.q_up_w,
                 p.kv_down_w, p.kv_up_w, p.conv_w, p.dt_bias, p.a_log, p.out_norm_w, p.out_norm_b, p.conv_b,
                 p.d_skip});
  }
}

void GPTModel::backward_chunk(int chunk, Activations& a, const LayerNormDout* d_lnf, int64_t B, int64_t T,
                              const MicroBatchKey& key) {
  backward_layers(layers_.data() + chunk_first_[size_t(chunk)], chunk, a, d_lnf, lnf_w_, lnf_b_, B, T, key);
  if (!has_embedding(chunk)) return;  // d_resid is the gradient of the chunk's input
  embedding_backward_from(a, B, T, key, "embedding.dropout");
  grads_ready({wpe_, wte_});
}

LossSum GPTModel::output_loss(Activations& a, const float* loss_mask, int64_t B, int64_t T, bool backward,
                              float grad_scale) {
  const int64_t N = B * T, C = cfg_.hidden_size;
  // logits[N, Vl] = lnf @ Wout_local^T (column-parallel over the vocabulary)
  const GemmSite out_site = site(out_w_ >= 0 ? out_w_ : wte_);
  const bool bf16 = bf16_logits();
  const float* host_mask = nullptr;
  loss_mask = effective_loss_mask(a, loss_mask, B, T, host_mask);
  // Vocab-parallel cross entropy: max, then sum of exponentials and target logit, each
  // all-reduced over the group. The logits are either bf16 (the bf16 policy: the GEMM
  // writes them so, half the traffic), or fp32 rounded by the policy as the cross entropy
  // reads them (one pass over the [N, Vl] logits fewer than rounding them first).
  // The masked token count first: the backward's scale 1/count is known before any kernel.
  // With context parallelism the count is the whole sequences' (every rank's tokens).
  LossSum l;
  for (int64_t i = 0; i < N; ++i) l.count += host_mask ? host_mask[i] : 1.0f;
  if (cp_.on()) cp_.comm->all_reduce(&l.count, 1, ReduceOp::sum);
  const float token_scale = loss_gradient_of_sum_ ? 1.0f : l.count > 0 ? float(1.0 / l.count) : 0.0f;
  const uint16_t* logits16 = nullptr;
  if (bf16) {
    logits16 = gemm_policy_->forward_bf16(out_site.param, a.logits, input(a.lnf), output_weight(), N, C, Vl_);
    if (tp_.size() == 1) {
      // Nothing to all-reduce between the steps: max, sums, losses and the backward in one
      // pass over the logits.
      vocab_parallel_ce_fused_bf16(a.losses, reinterpret_cast<uint16_t*>(a.logits), row_max_.data(), ce_stats_.data(),
                                   a.targets(), backward, loss_mask, grad_scale * token_scale, N, vocab_valid_, Vl_);
      return sum_losses(a, N, host_mask, l);
    }
    vocab_parallel_ce_max_bf16(row_max_.data(), logits16, N, vocab_valid_, Vl_);
  } else {
    linear_forward(a.logits, input(a.lnf), output_weight(), nullptr, N, C, Vl_, out_site.rounded_by_caller());
    if (tp_.size() == 1) {
      vocab_parallel_ce_fused(a.losses, a.logits, row_max_.data(), ce_stats_.data(), a.targets(), backward, loss_mask,
                              grad_scale * token_scale, N, vocab_valid_, Vl_, rounding(out_site));
      return sum_losses(a, N, host_mask, l);
    }
    vocab_parallel_ce_max(row_max_.data(), a.logits, N, vocab_valid_, Vl_, rounding(out_site));
  }
  if (tp_.size() > 1) tp_.comm->all_reduce(row_max_.data(), N, ReduceOp::max);
  if (bf16)
    vocab_parallel_ce_partials_bf16(ce_stats_.data(), logits16, row_max_.data(), a.targets(), vocab_begin_, N,
                                    vocab_valid_, Vl_);
  else
    vocab_parallel_ce_partials(ce_stats_.data(), a.logits, row_max_.data(), a.targets(), vocab_begin_, N,
                               vocab_valid_, Vl_, backward, rounding(out_site));
  if (tp_.size() > 1) tp_.comm->all_reduce(ce_stats_.data(), 2 * N, ReduceOp::sum);
  vocab_parallel_ce_loss(a.losses, ce_stats_.data(), row_max_.data(), N);
  if (backward) {
    if (bf16)
      vocab_parallel_ce_backward_bf16(reinterpret_cast<uint16_t*>(a.logits), row_max_.data(), ce_stats_.data(),
                                      a.targets(), loss_mask, grad_scale * token_scale, vocab_begin_, N,
                                      vocab_valid_, Vl_);
    else
      vocab_parallel_ce_backward(a.logits, ce_stats_.data(), a.targets(), loss_mask, grad_scale * token_scale,
                                 vocab_begin_, N, vocab_valid_, Vl_);
  }
  return sum_losses(a, N, host_mask, l);
}

// The token losses on the host (one copy on a device), summed there with the mask.
LossSum GPTModel::sum_losses(Activations& a, int64_t N, const float* host_mask, LossSum l) {
  const float* losses = a.losses;
  if (current_device() != Device::cpu) {
    losses_host_.resize(size_t(N));
    copy_to_host(losses_host_.data(), a.losses, size_t(N) * sizeof(float));
    losses = losses_host_.data();
  }
  double sum = 0;
  for (int64_t i = 0; i < N; ++i) sum += double(losses[i]) * (host_mask ? host_mask[i] : 1.0f);
  if (cp_.on()) cp_.comm->all_reduce(&sum, 1, ReduceOp::sum);  // the whole sequences'
  l.sum += sum;
  return l;
}

LossSum GPTModel::forward_step(int chunk, int slot, const int32_t* tokens, const float* loss_mask, int64_t B,
                               int64_t T, float grad_scale, const MicroBatchKey& key, const int32_t* segments) {
  LATTICE_CHECK(!key.training || params_.has_grads())
      << "a model without gradients (loaded for inference) cannot train";
  Activations& a = acts(chunk, slot);
  const int64_t Tl = local_seq_length(T);
  prepare_inputs(a, tokens, T + 1, B, T, has_loss(chunk),
                 has_embedding(chunk) && key.training && current_device() != Device::cpu, segments);
  a.grad_scale = grad_scale;
  forward_chunk(chunk, a, B, Tl, key);
  if (!has_loss(chunk)) return {};
  const float* whole_mask = loss_mask;  // the prediction depths shift it along the whole sequences
  if (loss_mask && cp_.on()) {  // this rank's rows of the mask [B, T]
    cp_loss_mask_.resize(size_t(B * Tl));
    for (const TokenRun& r : token_runs(B, Tl))
      std::copy_n(loss_mask + r.token, r.rows, cp_loss_mask_.begin() + r.row);
    loss_mask = cp_loss_mask_.data();
  }
  // --mtp-num-layers: the prediction depths in training (they leave the reported loss alone), first:
  // each depth's output layer backward runs now and the main logits' buffer is theirs until then.
  if (!mtp_.empty() && key.training) mtp_forward(a, slot, whole_mask, B, Tl, grad_scale, key);
  return output_loss(a, loss_mask, B, Tl, key.training, grad_scale);
}

void GPTModel::backward_step(int chunk, int slot, int64_t B, int64_t T, const MicroBatchKey& key) {
  // An evaluation forward keeps no loss gradient and runs no prediction depth: nothing to go back through.
  LATTICE_CHECK(key.training) << "backward_step: the micro-batch's forward was an evaluation one (MicroBatchKey::training "
                                 "false)";
  Activations& a = acts(chunk, slot);
  T = local_seq_length(T);
  const int64_t N = B * T;
  if (!has_loss(chunk)) return backward_chunk(chunk, a, nullptr, B, T, key);
  if (!mtp_.empty()) mtp_backward(a, slot, B, T, key);  // first: it uses the scratch the main backward reads
  const LayerNormDout d_lnf = output_layer_backward(a, N);
  if (out_w_ >= 0) grads_ready({out_w_});
  if (!mtp_.empty()) {  // plus the prediction depths' gradient of the final LayerNorm's output
    LATTICE_CHECK(!d_lnf.bf16) << "the final LayerNorm's output gradient is fp32 with --mtp-num-layers";
    accumulate(tp_.sp() ? scratch_->d_s : scratch_->d_c2, scratch_->mtp_d_h, tp_.shard_rows(N) * cfg_.hidden_size);
  }
  backward_chunk(chunk, a, &d_lnf, B, T, key);
}

// dWout += dlogits^T @ lnf;  d(lnf) = dlogits @ Wout (partial over the vocabulary ranks:
// all-reduced, or reduce-scattered to the token shard). Without tensor parallelism and
// with dlogits in bf16, d(lnf) is written rounded, in bf16, for the final LayerNorm's
// backward to read so (bf16_ln_grads).
LayerNormDout GPTModel::output_layer_backward(Activations& a, int64_t N) {
  Scratch& sc = *scratch_;
  const int64_t C = cfg_.hidden_size;
  const GemmSite out_site = site(out_w_ >= 0 ? out_w_ : wte_);
  LayerNormDout d_lnf(tp_.sp() ? sc.d_s : sc.d_c2);
  if (bf16_logits()) {  // dlogits in bf16 (output_loss)
    const uint16_t* dlogits = reinterpret_cast<const uint16_t*>(a.logits);
    gemm_policy_->weight_grad_bf16(out_site.param, output_weight_grad(), dlogits, input(a.lnf), N, C, Vl_);
    if (bf16_ln_grads()) {
      d_lnf = LayerNormDout::in_bf16(
          gemm_policy_->input_grad_packed(out_site.param, sc.d_c2, nullptr, dlogits, output_weight(), N, C, Vl_));
    } else {
      gemm_policy_->input_grad_bf16(out_site.param, sc.d_c2, dlogits, output_weight(), N, C, Vl_, false);
      gemm_policy_->round_result(sc.d_c2, N * C);
    }
  } else {
    linear_backward(sc.d_c2, output_weight_grad(), nullptr, a.logits, input(a.lnf), output_weight(), N, C, Vl_, false,
                    out_site);
  }
  if (!d_lnf.bf16) reduce_from_tensor_parallel_region(tp_, sc.d_c2, tp_.sp() ? sc.d_s : sc.d_c2, N, C);
  return d_lnf;
}

double GPTModel::forward_backward(const int32_t* tokens, const float* loss_mask, int64_t B, int64_t T,
                                  float grad_scale, const MicroBatchKey& key) {
  LATTICE_CHECK(num_chunks() == 1 && place_.pre_process && place_.post_process)
      << "forward_backward runs a whole model; pipeline stages use forward_step/backward_step";
  const LossSum l = forward_step(0, 0, tokens, loss_mask, B, T, grad_scale, key);
  backward_step(0, 0, B, T, key);
  return l.count > 0 ? l.sum / l.count : 0.0;
}

void GPTModel::finish_tensor_parallel_grads(const std::vector<std::pair<int64_t, int64_t>>& ranges) {
  if (tp_.size() == 1) return;
  // With sequence parallelism the LayerNorm parameters (the row-parallel biases and position
  // embeddings get the gradient of every token on each rank, computed from all-gathered
  // gradients); with --qk-layernorm q_layernorm and k_layernorm (each rank's heads).
  std::vector<int> norms;
  if (tp_.sp()) {
    if (lnf_w_ >= 0) norms.insert(norms.end(), {lnf_w_, lnf_b_});
    for (const LayerParams& p : layers_) norms.insert(norms.end(), {p.ln1_w, p.ln1_b, p.ln2_w, p.ln2_b});
    for (const MtpParams& d : mtp_)
      norms.insert(norms.end(), {d.enorm_w, d.enorm_b, d.hnorm_w, d.hnorm_b, d.norm_w, d.norm_b, d.layer.ln1_w,
                                 d.layer.ln1_b, d.layer.ln2_w, d.layer.ln2_b});
  }
  // With whole experts the routers (their biases) see each rank's own rows too.
  if (experts_whole_) {
    for (const LayerParams& p : layers_) norms.insert(norms.end(), {p.router_w, p.router_b});
    for (const MtpParams& d : mtp_) norms.insert(norms.end(), {d.layer.router_w, d.layer.router_b});
  }
  // --moe-latent-size: the latent projections (replicated) get each rank's part: its experts' share of the
  // ffn (fc2_latent_proj's input, fc1_latent_proj's output gradient are partial sums), or with whole experts
  // its own rows'.
  for (const LayerParams& p : layers_) norms.insert(norms.end(), {p.latent_fc1, p.latent_fc2});
  for (const MtpParams& d : mtp_) norms.insert(norms.end(), {d.layer.latent_fc1, d.layer.latent_fc2});
  // A GDN layer's out_norm (each rank's value heads; a Mamba layer's gated norm is split with its heads).
  for (const LayerParams& p : layers_)
    if (!p.mamba) norms.insert(norms.end(), {p.out_norm_w, p.out_norm_b});
  for (const MtpParams& d : mtp_) norms.insert(norms.end(), {d.layer.out_norm_w, d.layer.out_norm_b});
  // (With --multi-latent-attention those are the latents' norms, whose gradients are whole on every rank.)
  if (!cfg_.multi_latent_attention) {
    for (const LayerParams& p : layers_) norms.insert(norms.end(), {p.q_norm_w, p.q_norm_b, p.k_norm_w, p.k_norm_b});
    for (const MtpParams& d : mtp_)
      norms.insert(norms.end(), {d.layer.q_norm_w, d.layer.q_norm_b, d.layer.k_norm_w, d.layer.k_norm_b});
  }
  // Each once (a repeated MTP layer's parameters are listed once per depth).
  std::sort(norms.begin(), norms.end());
  norms.erase(std::unique(norms.begin(), norms.end()), norms.end());
  if (std::all_of(norms.begin(), norms.end(), [](int k) { return k < 0; })) return;
  const std::vector<std::pair<int64_t, int64_t>> all{{0, params_.numel()}};
  std::vector<std::pair<int64_t, int64_t>> pieces;
  for (int k : norms) {
    if (k < 0) continue;  // RMSNorm: no bias
    const ParamInfo& pi = params_.infos()[size_t(k)];
    for (auto [rb, re] : ranges.empty() ? all : ranges) {
      const int64_t b = std::max(rb, pi.offset), e = std::min(re, pi.offset + pi.numel);
      if (b < e) pieces.emplace_back(b, e);
    }
  }
  int64_t n = 0;
  for (auto [b, e] : pieces) n += e - b;
  sp_grads_.resize(size_t(n));
  float* g = params_.grads();
  int64_t at = 0;
  for (auto [b, e] : pieces) {
    copy_on_device(sp_grads_.data() + at, g + b, size_t(e - b) * sizeof(float));
    at += e - b;
  }
  tp_.comm->all_reduce(sp_grads_.data(), n, ReduceOp::sum);
  at = 0;
  for (auto [b, e] : pieces) {
    copy_on_device(g + b, sp_grads_.data() + at, size_t(e - b) * sizeof(float));
    at += e - b;
  }
}

double GPTModel::forward_loss(const int32_t* tokens, const float* loss_mask, int64_t B, int64_t T) {
  const LossSum l = forward_loss_sum(tokens, loss_mask, B, T);
  return l.count > 0 ? l.sum / l.count : 0.0;
}

LossSum GPTModel::forward_loss_sum(const int32_t* tokens, const float* loss_mask, int64_t B, int64_t T,
                                   const int32_t* segments) {
  LATTICE_CHECK(num_chunks() == 1 && place_.pre_process && place_.post_process)
      << "forward_loss_sum runs a whole model";
  MicroBatchKey key;
  key.training = false;
  return forward_step(0, 0, tokens, loss_mask, B, T, 1.0f, key, segments);
}

void GPTModel::forward_logits(const int32_t* inputs, int64_t B, int64_t T, float* logits) {
  LATTICE_CHECK(tp_.size() == 1 && !cp_.on() && num_chunks() == 1 && place_.pre_process && place_.post_process)
      << "forward_logits runs a whole model on one rank (convert the checkpoint to use it)";
  const Fp32Inputs fp32_inputs(bf16_inputs_on_);  // the final LayerNorm's output in fp32 for gemm_f32
  Activations& a = acts(0, 0);
  const int64_t N = B * T, C = cfg_.hidden_size, Vp = cfg_.padded_vocab_size;
  MicroBatchKey key;
  key.training = false;
  key.generation = true;
  prepare_inputs(a, inputs, T, B, T, false);
  forward_chunk(0, a, B, T, key);
  // On a device into the micro-batch's logits buffer ([N, Vp] with one rank), then one copy.
  const bool on_cpu = current_device() == Device::cpu;
  gemm_f32(Trans::N, Trans::T, N, Vp, C, 1.0f, a.lnf, C, output_weight(), C, 0.0f, on_cpu ? logits : a.logits, Vp);
  if (!on_cpu) copy_to_host(logits, a.logits, size_t(N * Vp) * sizeof(float));
}

void GPTModel::forward_last_logits(const int32_t* inputs, int64_t T, float* logits) {
  LATTICE_CHECK(tp_.size() == 1 && !cp_.on() && num_chunks() == 1 && place_.pre_process && place_.post_process)
      << "forward_last_logits runs a whole model on one rank";
  const Fp32Inputs fp32_inputs(bf16_inputs_on_);
  Activations& a = acts(0, 0);
  const int64_t C = cfg_.hidden_size, Vp = cfg_.padded_vocab_size;
  MicroBatchKey key;
  key.training = false;
  key.generation = true;
  prepare_inputs(a, inputs, T, 1, T, false);
  forward_chunk(0, a, 1, T, key);
  const bool on_cpu = current_device() == Device::cpu;
  gemm_f32(Trans::N, Trans::T, 1, Vp, C, 1.0f, a.lnf + (T - 1) * C, C, output_weight(), C, 0.0f,
           on_cpu ? logits : a.logits, Vp);
  if (!on_cpu) copy_to_host(logits, a.logits, size_t(Vp) * sizeof(float));
}

}  // namespace lattice
