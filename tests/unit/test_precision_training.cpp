// Mixed-precision training end to end on a small model: bf16 / fp16 / fp8 losses follow
// fp32's, and fp16's loss scaler skips overflowing steps (no update) and goes on.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "blas/gemm.h"
#include "data/gpt_batches.h"
#include "model/gpt_model.h"
#include "model/mixed_precision.h"
#include "optim/loss_scaler.h"
#include "optim/optimizer.h"
#include "train/train_step.h"

namespace lattice {
namespace {

constexpr int64_t kVocab = 64, kSeq = 32;

// Learnable tokens: each sample walks t -> (5 t + 3) mod V from a start that depends on
// the index, with every fourth token replaced by a pseudo-random one.
class PatternSamples : public SampleSource {
 public:
  void sample(int64_t index, int32_t* out) const override {
    uint64_t h = uint64_t(index) * 0x9E3779B97F4A7C15ull + 1;
    int32_t t = int32_t(h % kVocab);
    for (int64_t i = 0; i <= kSeq; ++i) {
      h ^= h >> 29;
      h *= 0xBF58476D1CE4E5B9ull;
      out[i] = i % 4 == 3 ? int32_t(h % kVocab) : t;
      t = int32_t((5 * t + 3) % kVocab);
    }
  }
  int64_t seq_length() const override { return kSeq; }
};

TransformerConfig config() {
  TransformerConfig c;
  c.num_layers = 2;
  c.hidden_size = 64;
  c.num_attention_heads = 4;
  c.vocab_size = kVocab;
  c.max_position_embeddings = kSeq;
  c.hidden_dropout = c.attention_dropout = 0;
  c.finalize();
  return c;
}

enum class Mode { fp32, bf16, fp16, fp8 };

// Mean loss of the last 5 of `steps` steps.
double train(Mode mode, int steps) {
  GPTModel model(config(), 4, kSeq);
  model.init_parameters(7);
  Optimizer opt(model.params(), OptimizerConfig{});
  std::unique_ptr<MixedPrecisionPolicy> policy;
  if (mode == Mode::bf16) policy = make_half_precision_policy(HalfFormat::bf16);
  if (mode == Mode::fp16) policy = make_half_precision_policy(HalfFormat::fp16);
  if (mode == Mode::fp8) policy = make_fp8_policy(make_fp8_recipe("hybrid", 0, 16, "max"), nullptr);
  model.set_gemm_policy(policy.get());
  LossScalerConfig lc;
  lc.initial_scale = 65536;
  LossScaler scaler(lc);
  StepConfig sc{4, 8, kSeq, 1.0, 7};
  sc.precision = policy.get();
  if (mode == Mode::fp16) sc.loss_scaler = &scaler;
  PatternSamples data;
  double tail = 0;
  int skipped = 0;
  for (int it = 0; it < steps; ++it) {
    StepResult r = train_step(model, opt, data, sc, it, 3e-3, 0.0);
    skipped += r.skipped;
    if (it >= steps - 5) tail += r.lm_loss / 5.0;
  }
  EXPECT_EQ(skipped, 0) << "an fp16 step overflowed at loss scale 65536";
  return tail;
}

TEST(PrecisionTraining, LossesFollowFp32) {
  const int steps = 30;
  const double fp32 = train(Mode::fp32, steps), bf16 = train(Mode::bf16, steps), fp16 = train(Mode::fp16, steps),
               fp8 = train(Mode::fp8, steps);
  std::printf("loss after %d steps: fp32 %.4f bf16 %.4f fp16 %.4f fp8 hybrid %.4f\n", steps, fp32, bf16, fp16, fp8);
  EXPECT_LT(fp32, std::log(double(kVocab)) - 0.5) << "the model did not learn";
  EXPECT_NEAR(bf16, fp32, 0.02 * fp32);
  EXPECT_NEAR(fp16, fp32, 0.02 * fp32);
  EXPECT_NEAR(fp8, fp32, 0.05 * fp32);
}

// The bf16 storage choices of the model (GPTModel::set_bf16_logits and set_bf16_qkv, on by
// default on GPUs; set_bf16_inputs, the linear layers' inputs written in bf16 by LayerNorm
// and bias_gelu and fc1's result kept in bf16, on by default) give the same training as
// fp32 logits, inputs and qkv, bit for bit: every loss, gradient norm and final parameter,
// with an evaluation forward in between; with dropout, and without (where the LayerNorm
// backward makes the row-parallel layers' bf16 output gradient and bias gradient).
void expect_bf16_storage_trains_bit_identically(float dropout, bool rope = false, bool bias = true,
                                                bool rmsnorm = false, bool swiglu = false, int64_t groups = 0) {
  TransformerConfig cfg = config();
  cfg.hidden_dropout = cfg.attention_dropout = dropout;
  if (rope) cfg.position_embedding_type = "rope";  // the qkv switch keeps qkv in fp32, row outputs in bf16
  cfg.add_bias_linear = bias;  // without biases the fused kernels add zeros and sum into a sink
  if (rmsnorm) cfg.normalization = "RMSNorm";
  cfg.swiglu = swiglu;  // bf16 inputs: fc1's bf16 result in, the packed SwiGLU kernels
  cfg.num_query_groups = groups;  // grouped-query attention: the bf16 qkv in its grouped layout
  cfg.finalize();
  struct Run {
    bool logits, inputs, qkv;
    std::vector<double> metrics;
    std::vector<float> params;
  };
  std::vector<Run> runs = {{false, false, false, {}, {}}, {true, false, false, {}, {}}, {false, true, false, {}, {}},
                           {false, false, true, {}, {}}, {true, true, true, {}, {}}};
  for (Run& run : runs) {
    GPTModel model(cfg, 4, kSeq);
    model.init_parameters(7);
    model.set_bf16_logits(run.logits);
    model.set_bf16_inputs(run.inputs);
    model.set_bf16_qkv(run.qkv);
    Optimizer opt(model.params(), OptimizerConfig{});
    auto policy = make_half_precision_policy(HalfFormat::bf16);
    model.set_gemm_policy(policy.get());
    StepConfig sc{4, 8, kSeq, 1.0, 7};
    sc.precision = policy.get();
    PatternSamples data;
    std::vector<int32_t> tokens(size_t(4 * (kSeq + 1)));
    for (int64_t b = 0; b < 4; ++b) data.sample(1000 + b, tokens.data() + b * (kSeq + 1));
    for (int it = 0; it < 4; ++it) {
      const StepResult r = train_step(model, opt, data, sc, it, 3e-3, 0.0);
      run.metrics.insert(run.metrics.end(), {r.lm_loss, r.grad_norm});
      run.metrics.push_back(model.forward_loss(tokens.data(), nullptr, 4, kSeq));
    }
    run.params.assign(model.params().params(), model.params().params() + model.params().numel());
  }
  for (const Run& run : runs) {
    const std::string what = "dropout " + std::to_string(dropout) + ", logits " + (run.logits ? "bf16" : "fp32") +
                             ", inputs " + (run.inputs ? "bf16" : "fp32") + ", qkv " + (run.qkv ? "bf16" : "fp32");
    EXPECT_EQ(run.metrics, runs[0].metrics) << what;
    ASSERT_EQ(run.params.size(), runs[0].params.size());
    EXPECT_EQ(0, std::memcmp(run.params.data(), runs[0].params.data(), run.params.size() * sizeof(float))) << what;
  }
}

TEST(PrecisionTraining, Bf16StorageTrainsBitIdentically) { expect_bf16_storage_trains_bit_identically(0.1f); }
TEST(PrecisionTraining, Bf16StorageTrainsBitIdenticallyWithoutDropout) { expect_bf16_storage_trains_bit_identically(0.0f); }
TEST(PrecisionTraining, Bf16StorageTrainsBitIdenticallyWithRotaryEmbedding) {
  expect_bf16_storage_trains_bit_identically(0.1f, true);
}
TEST(PrecisionTraining, Bf16StorageTrainsBitIdenticallyWithoutLinearBiases) {
  expect_bf16_storage_trains_bit_identically(0.1f, false, false);
  expect_bf16_storage_trains_bit_identically(0.0f, false, false);
}
TEST(PrecisionTraining, Bf16StorageTrainsBitIdenticallyWithRmsNorm) {
  expect_bf16_storage_trains_bit_identically(0.1f, false, true, true);
  expect_bf16_storage_trains_bit_identically(0.0f, false, true, true);
}
TEST(PrecisionTraining, Bf16StorageTrainsBitIdenticallyWithGroupedQueryAttention) {
  expect_bf16_storage_trains_bit_identically(0.1f, true, true, false, false, 2);   // rope: qkv kept in fp32
  expect_bf16_storage_trains_bit_identically(0.1f, false, true, false, false, 2);  // the packed bf16 qkv and bias
  expect_bf16_storage_trains_bit_identically(0.0f, false, false, false, false, 1);
}
TEST(PrecisionTraining, Bf16StorageTrainsBitIdenticallyWithSwiglu) {
  expect_bf16_storage_trains_bit_identically(0.1f, false, true, false, true);
  expect_bf16_storage_trains_bit_identically(0.0f, false, false, false, true);
}

// Overflows induced at iterations 2, 3 and 4 with hysteresis 2: the first leaves the scale
// (hysteresis tracker 2 -> 1), the next two halve it; those steps leave the parameters
// untouched and training continues; after `window` clean steps the scale doubles.
TEST(PrecisionTraining, OverflowStepsAreSkippedAndTheScaleBacksOff) {
  GPTModel model(config(), 4, kSeq);
  model.init_parameters(7);
  Optimizer opt(model.params(), OptimizerConfig{});
  auto policy = make_half_precision_policy(HalfFormat::fp16);
  model.set_gemm_policy(policy.get());
  LossScalerConfig lc;
  lc.initial_scale = 1024;
  lc.hysteresis = 2;
  lc.window = 3;
  LossScaler scaler(lc);
  StepConfig sc{4, 8, kSeq, 1.0, 7};
  sc.precision = policy.get();
  sc.loss_scaler = &scaler;
  sc.inject_inf_iterations = {2, 3, 4};
  PatternSamples data;
  const std::vector<double> want_scale_used = {1024, 1024, 1024, 1024, 512, 256, 256, 256, 512};
  const std::vector<double> want_scale_after = {1024, 1024, 1024, 512, 256, 256, 256, 512, 512};
  std::vector<float> before(size_t(model.params().numel()));
  int64_t skipped = 0;
  for (int it = 0; it < 9; ++it) {
    std::memcpy(before.data(), model.params().params(), before.size() * sizeof(float));
    StepResult r = train_step(model, opt, data, sc, it, 1e-3, 0.0);
    const bool injected = it >= 2 && it <= 4;
    EXPECT_EQ(r.skipped, injected) << "iteration " << it;
    EXPECT_EQ(r.loss_scale, want_scale_used[size_t(it)]) << "iteration " << it;
    EXPECT_EQ(scaler.scale(), want_scale_after[size_t(it)]) << "iteration " << it;
    EXPECT_TRUE(std::isfinite(r.lm_loss));
    const bool same = std::memcmp(before.data(), model.params().params(), before.size() * sizeof(float)) == 0;
    EXPECT_EQ(same, injected) << "iteration " << it << ": parameters " << (same ? "unchanged" : "changed");
    if (!injected) EXPECT_TRUE(std::isfinite(r.grad_norm) && r.grad_norm > 0) << "iteration " << it;
    skipped += r.skipped;
  }
  EXPECT_EQ(skipped, 3);
  EXPECT_EQ(opt.steps(), 6);
}

// A constant scale (--loss-scale) never changes, even on overflow, and the gradients are
// unscaled: the update equals the unscaled run's up to fp16 rounding.
TEST(PrecisionTraining, ConstantLossScale) {
  LossScalerConfig lc;
  lc.dynamic = false;
  lc.initial_scale = 128;
  LossScaler scaler(lc);
  GPTModel model(config(), 4, kSeq);
  model.init_parameters(7);
  Optimizer opt(model.params(), OptimizerConfig{});
  StepConfig sc{4, 8, kSeq, 1.0, 7};
  sc.loss_scaler = &scaler;
  sc.inject_inf_iterations = {1};
  PatternSamples data;
  GPTModel ref(config(), 4, kSeq);
  ref.init_parameters(7);
  Optimizer ref_opt(ref.params(), OptimizerConfig{});
  StepConfig rc{4, 8, kSeq, 1.0, 7};
  for (int it = 0; it < 3; ++it) {
    StepResult r = train_step(model, opt, data, sc, it, 1e-3, 0.0);
    EXPECT_EQ(r.skipped, it == 1);
    EXPECT_EQ(scaler.scale(), 128.0);
    if (it != 1) {
      StepResult q = train_step(ref, ref_opt, data, rc, it, 1e-3, 0.0);
      EXPECT_NEAR(r.grad_norm, q.grad_norm, 1e-5 * q.grad_norm);  // scaling by 2^7 is exact in fp32
    }
  }
}

// The MoE router (and the shared experts' gate) keep out of an fp8 policy, as Megatron's router is
// no fp8 layer, and out of any policy with --moe-router-dtype fp32: a policy that records the
// weights it multiplies (in fp32) sees the experts' but not the router's.
class RecordingPolicy : public GemmPolicy {
 public:
  std::set<int> params;
  void forward(int param, float* y, LinearInput x, const float* W, int64_t N, int64_t in, int64_t out) override {
    params.insert(param);
    linear_forward(y, x, W, nullptr, N, in, out);
  }
  void weight_grad(int param, float* dW, const float* dy, LinearInput x, int64_t N, int64_t in, int64_t out) override {
    params.insert(param);
    linear_backward(nullptr, dW, nullptr, dy, x, nullptr, N, in, out);
  }
  void input_grad(int param, float* dx, const float* dy, const float* W, int64_t N, int64_t in, int64_t out,
                  bool accumulate) override {
    params.insert(param);
    gemm_f32(Trans::N, Trans::N, N, in, out, 1.0f, dy, out, W, in, accumulate ? 1.0f : 0.0f, dx, in);
  }
};

int param_index(const GPTModel& model, const std::string& name) {
  const std::vector<ParamInfo>& infos = model.params().infos();
  for (size_t i = 0; i < infos.size(); ++i)
    if (infos[i].name == name) return int(i);
  ADD_FAILURE() << "no parameter " << name;
  return -1;
}

TEST(PrecisionTraining, MoeRouterStaysOutOfFp8AndOfPoliciesWithRouterDtypeFp32) {
  auto moe_config = [](const char* router_dtype) {
    TransformerConfig c = config();
    c.num_experts = 4;
    c.moe_router_topk = 2;
    c.moe_ffn_hidden_size = 32;
    c.moe_shared_expert_intermediate_size = 32;
    c.moe_shared_expert_gate = true;
    c.add_bias_linear = false;
    c.moe_router_dtype = router_dtype;
    c.finalize();
    return c;
  };
  MockSamples data(kVocab, kSeq, 5);
  std::vector<int32_t> tokens(static_cast<size_t>(4 * (kSeq + 1)));
  fill_micro_batch(data, 0, 4, tokens.data());
  for (const char* dtype : {"", "fp32"}) {
    GPTModel model(moe_config(dtype), 4, kSeq);
    model.init_parameters(3);
    RecordingPolicy rec;
    model.set_gemm_policy(&rec);
    model.forward_backward(tokens.data(), nullptr, 4, kSeq, 1.0f, MicroBatchKey{});
    const int router = param_index(model, "decoder.layers.0.mlp.router.weight");
    const int gate = param_index(model, "decoder.layers.0.mlp.shared_experts.gate_weight");
    const int expert = param_index(model, "decoder.layers.0.mlp.experts.local_experts.0.linear_fc1.weight");
    EXPECT_TRUE(rec.params.count(expert)) << dtype;
    EXPECT_EQ(rec.params.count(router), std::string(dtype).empty() ? 1u : 0u) << "router, dtype '" << dtype << "'";
    EXPECT_EQ(rec.params.count(gate), std::string(dtype).empty() ? 1u : 0u) << "gate, dtype '" << dtype << "'";
  }
  GPTModel model(moe_config(""), 4, kSeq);
  model.init_parameters(3);
  auto fp8 = make_fp8_policy(make_fp8_recipe("hybrid", 0, 16, "max"), nullptr);
  model.set_gemm_policy(fp8.get());
  model.forward_backward(tokens.data(), nullptr, 4, kSeq, 1.0f, MicroBatchKey{});
  const std::map<int, Fp8ScalingState> state = fp8->scaling_state();
  EXPECT_TRUE(state.count(param_index(model, "decoder.layers.1.mlp.experts.local_experts.3.linear_fc2.weight")));
  EXPECT_FALSE(state.count(param_index(model, "decoder.layers.1.mlp.router.weight")));
  EXPECT_FALSE(state.count(param_index(model, "decoder.layers.1.mlp.shared_experts.gate_weight")));
}

}  // namespace
}  // namespace lattice
