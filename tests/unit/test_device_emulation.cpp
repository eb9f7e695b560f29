// The training path on --device cuda under CUDA emulation (core/device.h): the CPU kernels
// run, but device memory sits in pages the host cannot touch outside kernels and copies,
// so any host access to a parameter, gradient, optimizer state, activation or kernel
// scratch buffer faults. Each run here is done twice, on Device::cpu and on the emulated
// device, and the results (losses, gradient norms, gradients, final parameters) must be
// bit-identical: the same kernels on the same inputs, with only the copies added. A run
// that finishes proves its path is device-clean. Each run also evaluates with a loss
// mask, computes logits and decodes with the KV cache.
#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "core/device.h"
#include "data/gpt_batches.h"
#include "model/gpt_inference.h"
#include "model/gpt_model.h"
#include "model/mixed_precision.h"
#include "optim/loss_scaler.h"
#include "optim/optimizer.h"
#include "train/train_step.h"
#include "../mamba_test_config.h"
#include "../mla_test_config.h"

namespace lattice {
namespace {

constexpr int64_t kVocab = 96, kSeq = 16, kMicro = 2, kGlobal = 4;
constexpr int32_t kEod = 0;

// Learnable tokens (t -> 5t + 3 mod V) with a pseudo-random token every fourth position,
// and end-of-document tokens at position 5 of every sample and 11 of the even ones.
class PatternSamples : public SampleSource {
 public:
  void sample(int64_t index, int32_t* out) const override {
    uint64_t h = uint64_t(index) * 0x9E3779B97F4A7C15ull + 1;
    int32_t t = int32_t(h % kVocab);
    for (int64_t i = 0; i <= kSeq; ++i) {
      h ^= h >> 29;
      h *= 0xBF58476D1CE4E5B9ull;
      out[i] = i % 4 == 3 ? int32_t(h % kVocab) : t;
      if (i == 5 || (index % 2 == 0 && i == 11)) out[i] = kEod;
      t = int32_t((5 * t + 3) % kVocab);
    }
  }
  int64_t seq_length() const override { return kSeq; }
};

enum class Precision { fp32, bf16, fp16, fp8, fp8_tensorwise, fp8_mxfp8 };

struct Options {
  Precision precision = Precision::fp32;
  std::string recompute;  // "" | selective | full
  bool documents = false; // eod: reset attention mask and position ids, no loss on eod
  bool mla = false;       // --multi-latent-attention (tests/mla_test_config.h), with the rotary embedding
  bool hybrid = false;    // --hybrid-override-pattern M*M- (tests/mamba_test_config.h)
  int steps = 20;
};

struct RunResult {
  std::vector<double> losses, norms, scales;
  std::vector<int> skipped;
  std::vector<float> grads, params, exp_avg;
  double eval_loss = 0;
  std::vector<float> logits, cached_logits;
};

TransformerConfig config(const Options& o) {
  TransformerConfig c;
  c.num_layers = 2;
  c.hidden_size = 32;
  c.num_attention_heads = 4;
  c.vocab_size = kVocab;
  c.max_position_embeddings = kSeq;
  c.hidden_dropout = c.attention_dropout = 0.1f;
  if (o.mla) set_mla(c);
  if (o.hybrid) set_hybrid(c, "M*M-");
  if (o.recompute == "selective") c.recompute_granularity = "selective";
  if (o.recompute == "selective" && o.mla) c.recompute_modules = {"core_attn", "mla_up_proj"};
  if (o.recompute == "full") {
    c.recompute_granularity = "full";
    c.recompute_method = "uniform";
    c.recompute_num_layers = 2;
  }
  c.finalize();
  return c;
}

// Runs with everything allocated on `device`; on return every device buffer is freed
// and the process is back on the CPU (set_device checks that no device memory is left).
class OnDevice {
 public:
  explicit OnDevice(Device d) {
    if (d == Device::cuda) set_cuda_emulation(true);
    set_device(d);
  }
  ~OnDevice() {
    set_device(Device::cpu);
    set_cuda_emulation(false);
  }
};

// `steps` training steps (0: one forward_backward of a micro-batch instead), then the
// gradients, parameters and Adam state read back, an evaluation loss with a loss mask,
// and the logits of one sequence.
RunResult run(Device device, const Options& o) {
  OnDevice on(device);
  EXPECT_EQ(cuda_emulated(), device == Device::cuda);
  RunResult r;
  PatternSamples data;
  GPTModel model(config(o), kMicro, kSeq);
  if (o.documents) {
    DocumentBoundaries d;
    d.eod = kEod;
    d.eod_mask_loss = d.reset_position_ids = d.reset_attention_mask = true;
    model.set_document_boundaries(d);
  }
  model.init_parameters(11);
  Optimizer opt(model.params(), OptimizerConfig{});
  std::unique_ptr<MixedPrecisionPolicy> policy;
  if (o.precision == Precision::bf16) policy = make_half_precision_policy(HalfFormat::bf16);
  if (o.precision == Precision::fp16) policy = make_half_precision_policy(HalfFormat::fp16);
  if (o.precision == Precision::fp8 || o.precision == Precision::fp8_tensorwise || o.precision == Precision::fp8_mxfp8) {
    Fp8Recipe recipe = make_fp8_recipe("hybrid", 0, 4, "max");
    if (o.precision == Precision::fp8_tensorwise) recipe.scaling = Fp8Scaling::tensorwise;
    if (o.precision == Precision::fp8_mxfp8) recipe.scaling = Fp8Scaling::mxfp8;
    policy = make_fp8_policy(recipe, nullptr);
  }
  model.set_gemm_policy(policy.get());
  LossScalerConfig lc;
  lc.initial_scale = 4096;
  lc.window = 4;
  LossScaler scaler(lc);
  StepConfig sc{kMicro, kGlobal, kSeq, 1.0, 5};
  sc.precision = policy.get();
  if (o.precision == Precision::fp16) {
    sc.loss_scaler = &scaler;
    sc.inject_inf_iterations = {3};  // a skipped step: the non-finite check and the skip path
  }
  std::vector<int32_t> tokens(static_cast<size_t>(kMicro * (kSeq + 1)));
  if (o.steps == 0) {
    fill_micro_batch(data, 0, kMicro, tokens.data());
    MicroBatchKey key{5, 0, 0, true};
    model.params().zero_grad();
    r.losses.push_back(model.forward_backward(tokens.data(), nullptr, kMicro, kSeq, 0.5f, key));
  }
  for (int it = 0; it < o.steps; ++it) {
    const StepResult s = train_step(model, opt, data, sc, it, 2e-3, 0.01);
    r.losses.push_back(s.lm_loss);
    r.norms.push_back(s.grad_norm);
    r.scales.push_back(s.loss_scale);
    r.skipped.push_back(s.skipped);
  }
  model.params().download_grads(r.grads);
  model.params().download_params(r.params);
  if (o.steps > 0) {
    r.exp_avg.assign(r.params.size(), 0.0f);
    opt.export_state(1, r.exp_avg.data());
  }
  // Evaluation with a caller's loss mask (host array) and the logits of one sequence.
  fill_micro_batch(data, 100, kMicro, tokens.data());
  std::vector<float> mask(static_cast<size_t>(kMicro * kSeq), 1.0f);
  for (size_t i = 0; i < mask.size(); i += 3) mask[i] = 0.0f;
  const LossSum l = model.forward_loss_sum(tokens.data(), mask.data(), kMicro, kSeq);
  r.eval_loss = l.sum / l.count;
  const int64_t Vp = model.config().padded_vocab_size;
  r.logits.resize(static_cast<size_t>(kSeq * Vp));
  model.forward_logits(tokens.data(), 1, kSeq, r.logits.data());
  // KV-cache decoding: a prompt of 6 tokens (every position's logits), then 2 more, one at a time.
  GPTInference inf(model);
  std::vector<float> cached(static_cast<size_t>(6 * Vp));
  inf.append(tokens.data(), 6, cached.data(), true);
  r.cached_logits = cached;
  for (int64_t t = 6; t < 8; ++t) {
    inf.append(tokens.data() + t, 1, cached.data());
    r.cached_logits.insert(r.cached_logits.end(), cached.begin(), cached.begin() + Vp);
  }
  // Two sequences decoded together (generate --batch-size): prompts of 4 and 3 tokens, then a step of both.
  GPTInference two(model, 0, false, 2);
  std::vector<float> both(static_cast<size_t>(2 * Vp));
  two.append(tokens.data(), 4, both.data(), false, 0);
  two.append(tokens.data() + 4, 3, both.data(), false, 1);
  const int64_t seqs[2] = {1, 0};
  two.step(tokens.data() + 8, seqs, 2, both.data());
  r.cached_logits.insert(r.cached_logits.end(), both.begin(), both.end());
  return r;
}

// The index of the first element whose bits differ, or -1.
template <class T>
int64_t first_difference(const std::vector<T>& a, const std::vector<T>& b) {
  if (a.size() != b.size()) return 0;
  for (size_t i = 0; i < a.size(); ++i)
    if (std::memcmp(&a[i], &b[i], sizeof(T)) != 0) return int64_t(i);
  return -1;
}

template <class T>
void expect_same(const char* what, const std::vector<T>& cpu, const std::vector<T>& dev) {
  ASSERT_EQ(cpu.size(), dev.size()) << what << ": sizes differ";
  const int64_t i = first_difference(cpu, dev);
  EXPECT_EQ(i, -1) << what << " differ first at [" << i << "]: cpu " << (i >= 0 ? double(cpu[size_t(i)]) : 0.0)
                   << " emulated cuda " << (i >= 0 ? double(dev[size_t(i)]) : 0.0);
}

void compare(const Options& o) {
  const RunResult cpu = run(Device::cpu, o);
  const RunResult dev = run(Device::cuda, o);
  ASSERT_FALSE(cpu.losses.empty());
  std::printf("first loss %.6f, last loss %.6f, last grad norm %.6f (cpu and emulated cuda)\n", cpu.losses.front(),
              cpu.losses.back(), cpu.norms.empty() ? 0.0 : cpu.norms.back());
  expect_same("losses", cpu.losses, dev.losses);
  expect_same("grad norms", cpu.norms, dev.norms);
  expect_same("loss scales", cpu.scales, dev.scales);
  expect_same("skipped steps", cpu.skipped, dev.skipped);
  expect_same("gradients", cpu.grads, dev.grads);
  expect_same("parameters", cpu.params, dev.params);
  expect_same("Adam exp_avg", cpu.exp_avg, dev.exp_avg);
  EXPECT_EQ(cpu.eval_loss, dev.eval_loss) << "evaluation loss with a loss mask";
  expect_same("logits", cpu.logits, dev.logits);
  expect_same("KV-cache logits", cpu.cached_logits, dev.cached_logits);
}

class DeviceEmulation : public ::testing::Test {
 protected:
  void TearDown() override {
    // A failed run leaves the process on the CPU too (OnDevice); this checks it.
    EXPECT_EQ(current_device(), Device::cpu);
  }
};

TEST_F(DeviceEmulation, ForwardBackward) {
  Options o;
  o.steps = 0;
  compare(o);
}

TEST_F(DeviceEmulation, TrainStepFp32) { compare(Options{}); }

TEST_F(DeviceEmulation, TrainStepBf16) {
  Options o;
  o.precision = Precision::bf16;
  compare(o);
}

// With the dynamic loss scaler and one injected overflow (a skipped step).
TEST_F(DeviceEmulation, TrainStepFp16) {
  Options o;
  o.precision = Precision::fp16;
  const RunResult cpu = run(Device::cpu, o);
  ASSERT_EQ(cpu.skipped.size(), 20u);
  EXPECT_EQ(cpu.skipped[3], 1) << "the injected overflow did not skip the step";
  compare(o);
}

TEST_F(DeviceEmulation, TrainStepFp8) {
  Options o;
  o.precision = Precision::fp8;
  o.steps = 6;
  compare(o);
}

// The current-scaling recipes: per-tensor amaxes on the device (tensorwise), block scales (mxfp8).
TEST_F(DeviceEmulation, TrainStepFp8CurrentScaling) {
  for (Precision p : {Precision::fp8_tensorwise, Precision::fp8_mxfp8}) {
    Options o;
    o.precision = p;
    o.steps = 4;
    compare(o);
  }
}

// Multi-latent attention: the latents, the fused qkv and its gradient's split, attn_v, in bf16 (the device's bf16
// paths around the projection) and with its qkv rebuilt from the latents (mla_up_proj).
TEST_F(DeviceEmulation, MultiLatentAttentionBf16) {
  Options o;
  o.mla = true;
  o.precision = Precision::bf16;
  o.steps = 6;
  compare(o);
  o.precision = Precision::fp32;
  o.recompute = "selective";
  o.steps = 3;
  compare(o);
}

// A hybrid Mamba model: its layers' training path and its decoding (the Mamba layers' convolution histories
// and scan states in device memory), with and without documents.
TEST_F(DeviceEmulation, HybridMamba) {
  Options o;
  o.hybrid = true;
  o.steps = 4;
  compare(o);
  o.documents = true;
  o.steps = 2;
  compare(o);
}

TEST_F(DeviceEmulation, SelectiveRecomputation) {
  Options o;
  o.recompute = "selective";
  o.steps = 5;
  compare(o);
}

TEST_F(DeviceEmulation, FullRecomputation) {
  Options o;
  o.recompute = "full";
  o.steps = 5;
  compare(o);
}

TEST_F(DeviceEmulation, DocumentBoundaries) {
  Options o;
  o.documents = true;
  o.steps = 5;
  compare(o);
}

// Host code touching device memory faults under emulation: the guard is on.
TEST_F(DeviceEmulation, HostAccessToDeviceMemoryFaults) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_DEATH(
      {
        OnDevice on(Device::cuda);
        ParamBuffer p;
        p.add("w", {4}, ParamInit::ones, 0);
        p.allocate();
        volatile float x = p.params()[0];
        (void)x;
      },
      "");
}

}  // namespace
}  // namespace lattice
