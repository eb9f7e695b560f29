// The whole model on the GPU against the CPU backend: one micro-batch's loss and every
// gradient, a 20-iteration fp32 training run (losses and final parameters), and a
// 200-iteration bf16 run (Slow). Each run selects its device with set_device, builds
// its model, downloads what the comparison needs and frees all its device memory before
// the next run switches devices. Without a GPU every test reports skipped with the reason
// (the same code path is checked bit for bit by the CUDA emulation in
// tests/e2e/test_device_emulation.sh).
//
// Shapes: B micro-batch, T sequence, C hidden, L layers, V vocabulary (padded to Vp).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "core/device.h"
#include "cuda_test_util.h"
#include "../gdn_test_config.h"
#include "../mamba_test_config.h"
#include "data/gpt_batches.h"
#include "model/gpt_model.h"
#include "model/mixed_precision.h"
#include "optim/optimizer.h"
#include "train/train_step.h"

namespace lattice {
namespace {

// fp32 tolerance, relative to each tensor's largest CPU value (gradients) or norm
// (parameters), and to the loss. Both backends compute in fp32 with fp32 accumulation,
// but in different orders (cuBLASLt's and the CUDA kernels' reductions vs oneDNN's and
// the CPU kernels'): each reduction of K terms differs by ~sqrt(K) x 6e-8 relative, a
// few 1e-7 after K <= 256 and the chain of two layers' backward, i.e. ~1e-6. 1e-4
// leaves two orders of magnitude for that while any real error (a wrong index, scale,
// mask or missing term) is O(1e-2) or more. TF32 GEMMs (1e-3 relative) fail it, as they
// must in an fp32 run.
constexpr double kFp32Tol = 1e-4;

TransformerConfig small_config(float dropout) {
  TransformerConfig c;
  c.num_layers = 2;
  c.hidden_size = 64;
  c.num_attention_heads = 4;
  c.vocab_size = 96;  // padded to 128: the padding rows are checked too
  c.make_vocab_size_divisible_by = 128;
  c.max_position_embeddings = 32;
  c.hidden_dropout = c.attention_dropout = dropout;
  c.finalize();
  return c;
}

constexpr int64_t kB = 2, kT = 32;
constexpr uint64_t kSeed = 1234;

// Selects `d` for a run and, on leaving, the device that was current before (the other
// CUDA tests of this binary call the kernels directly and expect the GPU).
class DeviceFor {
 public:
  explicit DeviceFor(Device d) : before_(current_device()) { set_device(d, 0); }
  ~DeviceFor() {
    device_synchronize();
    set_device(before_, 0);
  }

 private:
  Device before_;
};

struct GradRun {
  double loss = 0;
  std::vector<float> grads, params;
};

// One micro-batch's forward and backward on device d (grad_scale 1, no dropout).
GradRun grads_on(Device d, const TransformerConfig& cfg) {
  DeviceFor on(d);
  GradRun r;
  {
    GPTModel model(cfg, kB, kT);
    model.init_parameters(kSeed);
    MockSamples data(cfg.vocab_size, kT, kSeed);
    std::vector<int32_t> tokens(static_cast<size_t>(kB * (kT + 1)));
    fill_micro_batch(data, 0, kB, tokens.data());
    model.params().zero_grad();
    r.loss = model.forward_backward(tokens.data(), nullptr, kB, kT, 1.0f, MicroBatchKey{kSeed, 0, 0, true});
    device_synchronize();
    model.params().download_grads(r.grads);
    model.params().download_params(r.params);
  }  // the model's device memory is freed here, before the device changes back
  return r;
}

struct TrainRun {
  std::vector<double> losses;
  std::vector<float> params;
};

// `iters` iterations of Adam (constant lr, weight decay 0.01, clip 1.0) on mock data with
// 2 micro-batches per step, on device d; bf16 through the half-precision GEMM policy.
TrainRun train_on(Device d, const TransformerConfig& cfg, int64_t iters, bool bf16, double lr,
                  const OptimizerConfig& oc = {}) {  // Megatron's defaults: AdamW, betas 0.9/0.999, eps 1e-8
  DeviceFor on(d);
  TrainRun r;
  {
    GPTModel model(cfg, kB, kT);
    model.init_parameters(kSeed);
    std::unique_ptr<MixedPrecisionPolicy> policy;
    if (bf16) {
      policy = make_half_precision_policy(HalfFormat::bf16);
      model.set_gemm_policy(policy.get());
      model.set_attention_math(AttentionMath::bf16);  // as the trainer sets it for --bf16
    }
    Optimizer optimizer(model.params(), oc);
    MockSamples data(cfg.vocab_size, kT, kSeed);
    StepConfig sc;
    sc.micro_batch_size = kB;
    sc.global_batch_size = 2 * kB;
    sc.seq_length = kT;
    sc.clip_grad = 1.0;
    sc.seed = kSeed;
    sc.precision = policy.get();
    for (int64_t it = 0; it < iters; ++it)
      r.losses.push_back(train_step(model, optimizer, data, sc, it, lr, 0.01).lm_loss);
    device_synchronize();
    model.params().download_params(r.params);
  }
  return r;
}

// Per parameter tensor: max |gpu - cpu| over the tensor, relative to max |cpu| (scale
// "max") or ||gpu - cpu|| / ||cpu|| (scale "l2"). Reports the worst tensor and element.
struct TensorDiff {
  std::string name;
  double rel = 0;
  int64_t worst = -1;
  float cpu = 0, gpu = 0;
};

// The key part of linear_qkv.bias ([H, 3, D]: k is part 1 of each head's three). Its gradient
// is zero in exact arithmetic (adding b_k to every key shifts each query's scores by the
// same q . b_k, which the softmax ignores), so what the two backends compute for it is
// rounding noise of opposite signs, and Adam, which normalizes a gradient by its own
// magnitude, turns either into full lr-sized steps: after training, these values are two
// random walks, not a result to compare.
bool is_key_bias(const ParamInfo& p, int64_t i, int64_t head_dim) {
  return p.name.find("linear_qkv.bias") != std::string::npos && ((i - p.offset) / head_dim) % 3 == 1;
}

std::vector<TensorDiff> compare_tensors(const TransformerConfig& cfg, const std::vector<float>& cpu,
                                        const std::vector<float>& gpu, bool l2, bool skip_key_bias = false) {
  GPTModel layout(cfg, 1, 1);  // the CPU is current here: only the registry is used
  std::vector<TensorDiff> out;
  for (const ParamInfo& p : layout.params().infos()) {
    TensorDiff t;
    t.name = p.name;
    double max_ref = 0, max_diff = 0, sq_ref = 0, sq_diff = 0;
    for (int64_t i = p.offset; i < p.offset + p.numel; ++i) {
      if (skip_key_bias && is_key_bias(p, i, cfg.kv_channels)) continue;
      const double ref = cpu[size_t(i)], got = gpu[size_t(i)];
      const double diff = std::isfinite(got) ? std::fabs(got - ref) : INFINITY;
      max_ref = std::max(max_ref, std::fabs(ref));
      sq_ref += ref * ref;
      sq_diff += diff * diff;
      if (t.worst < 0 || diff > max_diff) {
        max_diff = diff;
        t.worst = i - p.offset;
        t.cpu = float(ref);
        t.gpu = float(got);
      }
    }
    if (l2) t.rel = sq_ref > 0 ? std::sqrt(sq_diff / sq_ref) : std::sqrt(sq_diff);
    else t.rel = max_ref > 0 ? max_diff / max_ref : max_diff;
    out.push_back(t);
  }
  return out;
}

void expect_tensors_close(const char* what, const std::vector<TensorDiff>& diffs, double tol) {
  double worst = 0;
  for (const TensorDiff& t : diffs) {
    worst = std::max(worst, t.rel);
    EXPECT_LE(t.rel, tol) << what << " " << t.name << ": relative difference " << t.rel << " (element " << t.worst
                          << ": cuda " << t.gpu << ", cpu " << t.cpu << ")";
  }
  std::printf("[ info ] %s: %zu tensors, worst relative difference %.3g (tolerance %.0e)\n", what, diffs.size(),
              worst, tol);
}

TEST(CudaModel, LossAndEveryGradientMatchCpu) {
  LATTICE_REQUIRE_CUDA();
  const TransformerConfig cfg = small_config(0.0f);
  const GradRun cpu = grads_on(Device::cpu, cfg);
  const GradRun gpu = grads_on(Device::cuda, cfg);
  ASSERT_EQ(cpu.grads.size(), gpu.grads.size());
  // The same initialisation on both (a function of seed, name and index; a device-side
  // Box-Muller may round its log/cos in the last bit): 1e-6 of each tensor's scale.
  expect_tensors_close("initial parameter", compare_tensors(cfg, cpu.params, gpu.params, false), 1e-6);
  EXPECT_LE(std::fabs(gpu.loss - cpu.loss), kFp32Tol * std::fabs(cpu.loss))
      << "loss: cuda " << gpu.loss << ", cpu " << cpu.loss;
  std::printf("[ info ] loss: cuda %.9g, cpu %.9g\n", gpu.loss, cpu.loss);
  expect_tensors_close("gradient", compare_tensors(cfg, cpu.grads, gpu.grads, false), kFp32Tol);
}

// One micro-batch's loss and every gradient of `cfg` on both devices, within kFp32Tol.
void expect_loss_and_gradients_match(const TransformerConfig& cfg, const std::string& what) {
  const GradRun cpu = grads_on(Device::cpu, cfg);
  const GradRun gpu = grads_on(Device::cuda, cfg);
  ASSERT_EQ(cpu.grads.size(), gpu.grads.size());
  EXPECT_LE(std::fabs(gpu.loss - cpu.loss), kFp32Tol * std::fabs(cpu.loss))
      << what << " loss: cuda " << gpu.loss << ", cpu " << cpu.loss;
  std::printf("[ info ] %s loss: cuda %.9g, cpu %.9g\n", what.c_str(), gpu.loss, cpu.loss);
  expect_tensors_close((what + " gradient").c_str(), compare_tensors(cfg, cpu.grads, gpu.grads, false), kFp32Tol);
}

// The rotary embedding (half of each head's dims, interleaved pairs) in place of learned
// positions, heads of 32 dims (4 x 32: wider than the hidden size), no linear biases, RMSNorm,
// SwiGLU, 2 query groups (grouped-query attention): the same loss and gradients on both devices.
TEST(CudaModel, RotaryEmbeddingLossAndEveryGradientMatchCpu) {
  LATTICE_REQUIRE_CUDA();
  TransformerConfig cfg = small_config(0.0f);
  cfg.position_embedding_type = "rope";
  cfg.rotary_percent = 0.5;
  cfg.rotary_interleaved = true;
  cfg.kv_channels = 32;  // q, k, v 128 wide against a hidden size of 64
  cfg.add_bias_linear = false;
  cfg.normalization = "RMSNorm";
  cfg.swiglu = true;
  cfg.num_query_groups = 2;
  cfg.finalize();
  expect_loss_and_gradients_match(cfg, "rope");
}

// LongRoPE (Phi-3.5's) over half of each head: the sequence of kT = 32 positions is past the original 16, so
// both devices rotate by the long factors' table.
TEST(CudaModel, LongRopeLossAndEveryGradientMatchCpu) {
  LATTICE_REQUIRE_CUDA();
  TransformerConfig cfg = small_config(0.0f);
  cfg.position_embedding_type = "rope";
  cfg.rotary_percent = 0.5;
  cfg.kv_channels = 16;  // 8 rotated dims: 4 pairs
  cfg.longrope_short_factor = {1.0f, 1.2f, 1.9f, 2.5f};
  cfg.longrope_long_factor = {1.5f, 3.0f, 7.0f, 12.0f};
  cfg.longrope_original_max_position_embeddings = 16;
  cfg.longrope_attention_factor = 1.2f;
  cfg.finalize();
  ASSERT_TRUE(cfg.longrope_long(kT));
  expect_loss_and_gradients_match(cfg, "longrope");
}

// SwiGLU with the linear layers' biases (fc1's bias is the gate's and the up projection's):
// the same loss and gradients on both devices.
TEST(CudaModel, SwigluLossAndEveryGradientMatchCpu) {
  LATTICE_REQUIRE_CUDA();
  TransformerConfig cfg = small_config(0.0f);
  cfg.swiglu = true;
  cfg.ffn_hidden_size = 96;
  cfg.finalize();
  expect_loss_and_gradients_match(cfg, "swiglu");
}

// Grouped-query attention with learned positions and the QKV layer's bias: 4 heads in 2 groups,
// each group's key and value read in place and their gradients summed over the group's heads:
// the same loss and gradients on both devices.
TEST(CudaModel, GroupedQueryAttentionLossAndEveryGradientMatchCpu) {
  LATTICE_REQUIRE_CUDA();
  TransformerConfig cfg = small_config(0.0f);
  cfg.num_query_groups = 2;
  cfg.finalize();
  expect_loss_and_gradients_match(cfg, "grouped-query attention");
}

// --qk-layernorm (model/qk_layernorm.h: strided copies and the LayerNorm kernels over every
// query and key head): LayerNorm with its biases, grouped-query attention and the rotary
// embedding (with learned positions the key norm's bias adds the same to every score of a
// query: its gradient is zero up to rounding, nothing to compare); RMSNorm with learned
// positions. The same loss and gradients on both devices.
TEST(CudaModel, QkLayernormLossAndEveryGradientMatchCpu) {
  LATTICE_REQUIRE_CUDA();
  TransformerConfig cfg = small_config(0.0f);
  cfg.qk_layernorm = true;
  cfg.num_query_groups = 2;
  cfg.position_embedding_type = "rope";
  cfg.finalize();
  expect_loss_and_gradients_match(cfg, "qk-layernorm rope");
  cfg = small_config(0.0f);
  cfg.qk_layernorm = true;
  cfg.normalization = "RMSNorm";
  cfg.add_bias_linear = false;
  cfg.finalize();
  expect_loss_and_gradients_match(cfg, "qk-layernorm rmsnorm");
  cfg = small_config(0.0f);  // --qk-l2-norm: the RMSNorm kernels with unit weights under a LayerNorm model
  cfg.qk_l2_norm = true;
  cfg.num_query_groups = 2;
  cfg.position_embedding_type = "rope";
  cfg.finalize();
  expect_loss_and_gradients_match(cfg, "qk-l2-norm rope");
}

// --attention-output-gate (kernels/attention_gate.h): the gates made beside the queries, the attention
// output scaled by their sigmoid before the projection (and again before its backward), the gates'
// gradients written into the QKV layer's output gradient: learned positions with biases, and the rotary
// embedding with grouped-query attention and --qk-layernorm. The same loss and gradients on both devices.
TEST(CudaModel, AttentionOutputGateLossAndEveryGradientMatchCpu) {
  LATTICE_REQUIRE_CUDA();
  TransformerConfig cfg = small_config(0.0f);
  cfg.attention_output_gate = true;
  cfg.finalize();
  expect_loss_and_gradients_match(cfg, "attention output gate");
  cfg = small_config(0.0f);
  cfg.attention_output_gate = true;
  cfg.qk_layernorm = true;
  cfg.num_query_groups = 2;
  cfg.position_embedding_type = "rope";
  cfg.finalize();
  expect_loss_and_gradients_match(cfg, "attention output gate, qk-layernorm rope");
}

// --no-rope-freq: the rotary embedding in the first layer, none in the second (NoPE), grouped-query
// attention: the same loss and gradients on both devices.
TEST(CudaModel, NoRopeLayerLossAndEveryGradientMatchCpu) {
  LATTICE_REQUIRE_CUDA();
  TransformerConfig cfg = small_config(0.0f);
  cfg.position_embedding_type = "rope";
  cfg.num_query_groups = 2;
  cfg.no_rope_pattern = {0, 1};
  cfg.finalize();
  ASSERT_EQ(cfg.num_layers, 2);
  expect_loss_and_gradients_match(cfg, "no-rope layer");
}

// --experimental-attention-variant gated_delta_net (kernels/gated_delta_net.h): layer 0 a GDN layer (the
// convolution, the gates, the delta rule with a state checkpoint every 64 tokens, out_norm and its SiLU
// gate; 2 key and 4 value heads), layer 1 attention; SwiGLU with RMSNorm and --apply-layernorm-1p, and with
// LayerNorm and biases (out_norm's bias); and layer 1 GDN with a prediction depth (--mtp-num-layers 1, its
// layer a GDN layer as the last decoder layer is) and the rotary embedding. The same loss and gradients
// on both devices.
TEST(CudaModel, GatedDeltaNetLossAndEveryGradientMatchCpu) {
  LATTICE_REQUIRE_CUDA();
  for (int variant : {0, 1, 2}) {
    TransformerConfig cfg = small_config(0.0f);
    cfg.swiglu = true;
    set_gdn(cfg, {1, 0}, GdnShapes{2, 4, 8, 12, 4});
    if (variant == 0) {
      cfg.normalization = "RMSNorm";
      cfg.apply_layernorm_1p = true;
      cfg.add_bias_linear = false;
    }
    if (variant == 2) {
      cfg.linear_attention_pattern = {0, 1};
      cfg.mtp_num_layers = 1;
      cfg.position_embedding_type = "rope";
    }
    cfg.finalize();
    ASSERT_EQ(cfg.num_layers, 2);
    expect_loss_and_gradients_match(cfg, variant == 0   ? "gated delta net, rmsnorm 1p"
                                         : variant == 1 ? "gated delta net, layernorm"
                                                        : "gated delta net, mtp 1");
  }
}

// --hybrid-override-pattern (kernels/mamba.h): Mamba layers (the convolution with its bias, the scan with a
// state checkpoint every 64 tokens, the gated grouped norm; 4 heads of 8 in 2 groups, state 6) among
// attention-only and MLP-only layers, with RMSNorm and no biases, and with LayerNorm and biases. The same loss
// and gradients on both devices.
TEST(CudaModel, HybridMambaLossAndEveryGradientMatchCpu) {
  LATTICE_REQUIRE_CUDA();
  for (bool rmsnorm : {true, false}) {
    TransformerConfig cfg = small_config(0.0f);
    set_hybrid(cfg, rmsnorm ? "M-M*-" : "*M-M");
    if (rmsnorm) {
      cfg.normalization = "RMSNorm";
      cfg.add_bias_linear = false;
    }
    cfg.finalize();
    expect_loss_and_gradients_match(cfg, rmsnorm ? "hybrid M-M*-, rmsnorm" : "hybrid *M-M, layernorm");
  }
}

// small_config with 4 experts of ffn 48, top 2, and the load-balancing loss (not finalized).
TransformerConfig moe_config() {
  TransformerConfig cfg = small_config(0.0f);
  cfg.num_experts = 4;
  cfg.moe_router_topk = 2;
  cfg.moe_ffn_hidden_size = 48;
  cfg.moe_aux_loss_coeff = 0.01f;
  return cfg;
}

// --num-experts: 4 experts, top-2, with the load-balancing loss, GELU and SwiGLU: the routing
// (on the host from the logits each device computes), the gathers and combines, every expert's
// GEMMs: the same loss and gradients on both devices.
TEST(CudaModel, MixtureOfExpertsLossAndEveryGradientMatchCpu) {
  LATTICE_REQUIRE_CUDA();
  for (bool swiglu : {false, true}) {
    TransformerConfig cfg = moe_config();
    cfg.add_bias_linear = false;
    cfg.swiglu = swiglu;
    cfg.finalize();
    expect_loss_and_gradients_match(cfg, swiglu ? "moe swiglu" : "moe");
  }
  // --moe-apply-probs-on-input: top-1 sigmoid gates weighing the experts' input rows (weighted gather).
  TransformerConfig cfg = moe_config();
  cfg.add_bias_linear = false;
  cfg.moe_router_topk = 1;
  cfg.moe_router_score_function = "sigmoid";
  cfg.moe_apply_probs_on_input = true;
  cfg.finalize();
  expect_loss_and_gradients_match(cfg, "moe probs on input");
  // --moe-input-jitter-eps: the router's noisy input (the same draws on both devices; a training forward).
  TransformerConfig jitter = moe_config();
  jitter.add_bias_linear = false;
  jitter.moe_input_jitter_eps = 0.2f;
  jitter.finalize();
  expect_loss_and_gradients_match(jitter, "moe input jitter");
  // --moe-router-force-load-balancing: the routing by the random logits (drawn on the host), the gradient
  // passed to the router.
  TransformerConfig forced = moe_config();
  forced.add_bias_linear = false;
  forced.moe_router_force_load_balancing = true;
  forced.finalize();
  expect_loss_and_gradients_match(forced, "moe forced balance");
  // --moe-latent-size: the experts' rows in a latent space of 24 (hidden 64), the projections around them.
  TransformerConfig latent = moe_config();
  latent.add_bias_linear = false;
  latent.moe_latent_size = 24;
  latent.finalize();
  expect_loss_and_gradients_match(latent, "moe latent");
}

// GPT-OSS's layer: experts and router with biases, the clamped quick GEGLU with the up projection's
// offset, learnable sinks, a window on every other layer and YaRN's rotary table, on both devices.
TEST(CudaModel, GptOssLayerLossAndEveryGradientMatchCpu) {
  LATTICE_REQUIRE_CUDA();
  TransformerConfig cfg = moe_config();  // with the router's and the experts' biases
  cfg.quick_geglu = true;
  cfg.glu_linear_offset = 1.0f;
  cfg.activation_func_clamp_value = 0.05f;
  cfg.softmax_type = "learnable";
  cfg.position_embedding_type = "yarn";
  cfg.yarn_rotary_scaling_factor = 4.0f;
  cfg.yarn_original_max_position_embeddings = 64;
  cfg.normalization = "RMSNorm";
  cfg.window_size = 3;
  cfg.window_attn_pattern.assign(size_t(cfg.num_layers), 0);
  cfg.window_attn_pattern[0] = 1;
  cfg.finalize();
  expect_loss_and_gradients_match(cfg, "gpt-oss layer");
}

// Shared experts with their sigmoid gate, pre-softmax gates, the first layer dense
// (--moe-layer-freq): a Qwen2-MoE-like layer on both devices.
TEST(CudaModel, SharedExpertsLossAndEveryGradientMatchCpu) {
  LATTICE_REQUIRE_CUDA();
  TransformerConfig cfg = moe_config();
  cfg.moe_router_pre_softmax = true;
  cfg.moe_shared_expert_intermediate_size = 64;
  cfg.moe_shared_expert_gate = true;
  cfg.moe_layer_pattern.assign(size_t(cfg.num_layers), 1);
  cfg.moe_layer_pattern[0] = 0;
  cfg.add_bias_linear = false;
  cfg.swiglu = true;
  cfg.finalize();
  expect_loss_and_gradients_match(cfg, "moe shared experts");
  cfg.moe_router_score_function = "sigmoid";  // sigmoid scores with the expert bias (a buffer)
  cfg.moe_router_enable_expert_bias = true;
  cfg.finalize();
  expect_loss_and_gradients_match(cfg, "moe sigmoid scores");
}

// Selective recomputation of the core attention, the dense MLPs and the norms on the GPU: the
// recomputed buffers are bit for bit the kept ones (LN1's output recomputed by the LayerNorm
// kernel equals the one the previous layer's fused bias-dropout-add-LayerNorm made), so 3 steps
// with dropout, in fp32 and in bf16, give the same losses and parameters as without.
TEST(CudaModel, RecomputedModulesGiveTheSameTraining) {
  LATTICE_REQUIRE_CUDA();
  TransformerConfig cfg = small_config(0.1f);
  TransformerConfig recomputed = cfg;
  recomputed.recompute_granularity = "selective";
  recomputed.recompute_modules = {"core_attn", "mlp", "layernorm"};
  recomputed.finalize();
  for (const bool bf16 : {false, true}) {
    const TrainRun kept = train_on(Device::cuda, cfg, 3, bf16, 1e-3);
    const TrainRun again = train_on(Device::cuda, recomputed, 3, bf16, 1e-3);
    EXPECT_EQ(again.losses, kept.losses) << (bf16 ? "bf16" : "fp32");
    ASSERT_EQ(again.params.size(), kept.params.size());
    EXPECT_EQ(std::memcmp(again.params.data(), kept.params.data(), kept.params.size() * sizeof(float)), 0)
        << (bf16 ? "bf16" : "fp32") << ": final parameters differ";
  }
}

// With dropout on: the masks are the same Philox draws on both devices. lr 1e-4: Adam's
// update m/(sqrt(v)+eps) turns a gradient's last-bit difference into a relative update
// difference of the same size, but the update is a small part of each parameter after
// 20 steps (20 x 1e-4 against weights of std 0.02), so the final parameters agree to
// well within 1e-4 when every step does.
// --mtp-num-layers 2: the prediction depths' shifted inputs (and their embedding's row groups, made
// for the GPU's embedding backward), eh_proj, the depths' layers and losses through the shared output
// layer: the same loss and gradients on both devices.
TEST(CudaModel, MultiTokenPredictionLossAndEveryGradientMatchCpu) {
  LATTICE_REQUIRE_CUDA();
  TransformerConfig cfg = small_config(0.0f);
  cfg.mtp_num_layers = 2;
  cfg.mtp_loss_scaling_factor = 0.5f;
  cfg.finalize();
  expect_loss_and_gradients_match(cfg, "multi-token prediction");
  // After MoE layers the depth's layer is an MoE layer (its load-balancing loss in the objective).
  TransformerConfig moe = moe_config();
  moe.add_bias_linear = false;
  moe.mtp_num_layers = 1;
  moe.finalize();
  expect_loss_and_gradients_match(moe, "multi-token prediction, MoE");
}

// --multi-latent-attention: the latents, their norms, the fused qkv built from them (the shared rotary
// key in every head, values zero-padded to the heads' width) and attn_v: the same loss and gradients on
// both devices (a query latent with RMSNorm latent norms; linear_q_proj with YaRN and values wider).
TEST(CudaModel, MultiLatentAttentionLossAndEveryGradientMatchCpu) {
  LATTICE_REQUIRE_CUDA();
  for (int variant : {0, 1}) {
    TransformerConfig cfg = small_config(0.0f);
    cfg.multi_latent_attention = true;
    cfg.qk_layernorm = true;
    cfg.kv_channels = 0;
    cfg.kv_lora_rank = 12;
    cfg.qk_head_dim = 8;
    cfg.qk_pos_emb_head_dim = 4;
    cfg.position_embedding_type = variant == 0 ? "rope" : "yarn";
    cfg.q_lora_rank = variant == 0 ? 24 : 0;
    cfg.v_head_dim = variant == 0 ? 6 : 16;
    if (variant == 0) cfg.normalization = "RMSNorm";
    cfg.yarn_rotary_scaling_factor = 4.0f;
    cfg.yarn_original_max_position_embeddings = 16;
    cfg.finalize();
    expect_loss_and_gradients_match(cfg, variant == 0 ? "multi-latent attention, query latent"
                                                      : "multi-latent attention, linear_q_proj, yarn");
  }
}

TEST(CudaModel, TwentyIterationsFp32MatchCpu) {
  LATTICE_REQUIRE_CUDA();
  const TransformerConfig cfg = small_config(0.1f);
  const TrainRun cpu = train_on(Device::cpu, cfg, 20, false, 1e-4);
  const TrainRun gpu = train_on(Device::cuda, cfg, 20, false, 1e-4);
  ASSERT_EQ(cpu.losses.size(), gpu.losses.size());
  for (size_t i = 0; i < cpu.losses.size(); ++i)
    EXPECT_LE(std::fabs(gpu.losses[i] - cpu.losses[i]), kFp32Tol * std::fabs(cpu.losses[i]))
        << "iteration " << i + 1 << ": loss cuda " << gpu.losses[i] << ", cpu " << cpu.losses[i];
  std::printf("[ info ] loss after 20 iterations: cuda %.9g, cpu %.9g (first %.6g)\n", gpu.losses.back(),
              cpu.losses.back(), cpu.losses.front());
  expect_tensors_close("final parameter (L2, without the key bias)",
                       compare_tensors(cfg, cpu.params, gpu.params, true, /*skip_key_bias=*/true), kFp32Tol);
}

// --optimizer muon: the momentum, the Newton-Schulz iteration (cuBLASLt's fp32 GEMMs), linear_qkv split
// by query groups, and Adam for the rest: 10 iterations with clipping equal the CPU's within fp32's.
TEST(CudaModel, MuonTenIterationsFp32MatchCpu) {
  LATTICE_REQUIRE_CUDA();
  TransformerConfig cfg = small_config(0.0f);
  cfg.num_query_groups = 2;
  cfg.add_bias_linear = false;  // (a key bias's gradient is rounding noise, which Adam amplifies)
  cfg.finalize();
  OptimizerConfig oc;
  oc.optimizer = "muon";
  oc.muon.momentum = 0.95f;
  oc.muon.qkv_split_rows = cfg.qkv_group_rows();
  const TrainRun cpu = train_on(Device::cpu, cfg, 10, false, 1e-3, oc);
  const TrainRun gpu = train_on(Device::cuda, cfg, 10, false, 1e-3, oc);
  ASSERT_EQ(cpu.losses.size(), gpu.losses.size());
  for (size_t i = 0; i < cpu.losses.size(); ++i)
    EXPECT_LE(std::fabs(gpu.losses[i] - cpu.losses[i]), kFp32Tol * std::fabs(cpu.losses[i]))
        << "iteration " << i + 1 << ": loss cuda " << gpu.losses[i] << ", cpu " << cpu.losses[i];
  EXPECT_LT(cpu.losses.back(), cpu.losses.front() - 0.1) << "Muon trains";
  expect_tensors_close("final parameter (L2, without the key bias)",
                       compare_tensors(cfg, cpu.params, gpu.params, true, /*skip_key_bias=*/true), kFp32Tol);
}

// bf16 GEMMs round differently on the two backends (cuBLASLt vs the CPU's bf16 GEMM), and
// 200 steps make the runs' paths drift apart; the training must still reach the same
// loss: the mean of the last 20 losses within 2%, after it fell well below the start.
// Head dim 64 (2 heads of a hidden size of 128), so the GPU's attention runs on tensor
// cores in bf16 as in a --bf16 training run.
TEST(CudaModel, Bf16TwoHundredIterationsSlow) {
  LATTICE_REQUIRE_CUDA();
  LATTICE_SKIP_UNDER_SIMT("200 iterations take minutes there; the op tables and TwentyIterationsFp32MatchCpu cover "
                          "the same kernels");
  TransformerConfig cfg = small_config(0.1f);
  cfg.hidden_size = 128;
  cfg.num_attention_heads = 2;
  cfg.ffn_hidden_size = 0;
  cfg.kv_channels = 0;
  cfg.finalize();
  ASSERT_EQ(cfg.kv_channels, 64);
  const TrainRun cpu = train_on(Device::cpu, cfg, 200, true, 1e-3);
  const TrainRun gpu = train_on(Device::cuda, cfg, 200, true, 1e-3);
  ASSERT_EQ(cpu.losses.size(), 200u);
  ASSERT_EQ(gpu.losses.size(), 200u);
  auto tail_mean = [](const std::vector<double>& l) {
    double s = 0;
    for (size_t i = l.size() - 20; i < l.size(); ++i) s += l[i];
    return s / 20.0;
  };
  const double c = tail_mean(cpu.losses), g = tail_mean(gpu.losses);
  std::printf("[ info ] bf16 mean loss of iterations 181-200: cuda %.6f, cpu %.6f (first: cuda %.6f, cpu %.6f)\n", g,
              c, gpu.losses.front(), cpu.losses.front());
  ASSERT_TRUE(std::isfinite(g)) << "the bf16 run on the GPU diverged";
  EXPECT_LT(c, 0.9 * cpu.losses.front()) << "the CPU run did not train: the comparison would say nothing";
  EXPECT_LE(std::fabs(g - c), 0.02 * c) << "bf16 loss after 200 iterations: cuda " << g << ", cpu " << c;
}

}  // namespace
}  // namespace lattice
