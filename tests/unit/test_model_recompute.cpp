// Activation recomputation (--recompute-granularity full|selective, --recompute-method
// uniform|block, --recompute-num-layers): 10 training steps with dropout give the same
// losses and final parameters bit for bit as without recomputation; pipeline chunks of
// different sizes with several slots give the same gradients; the activation arena
// shrinks by exactly the per-layer buffers no longer kept minus the shared scratch; and
// bad combinations fail naming the flag.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <ostream>
#include <sstream>
#include <string>
#include <tuple>
#include <vector>

#include "core/error.h"
#include "data/gpt_batches.h"
#include "model/gpt_model.h"
#include "optim/optimizer.h"
#include "train/arguments.h"
#include "train/train_step.h"
#include "../gdn_test_config.h"
#include "../mamba_test_config.h"
#include "../mla_test_config.h"

namespace lattice {
namespace {

constexpr int64_t kB = 2, kT = 16, kGBS = 4, kIters = 10, kLayers = 4;

struct Recompute {
  const char* granularity;
  const char* method;
  int64_t num_layers;
  const char* modules = "";  // --recompute-modules, space-separated
};
void PrintTo(const Recompute& r, std::ostream* os) {
  *os << "'" << r.granularity << "' '" << r.method << "' " << r.num_layers << " '" << r.modules << "'";
}
std::vector<std::string> split_modules(const char* s) {
  std::vector<std::string> out;
  std::istringstream in(s);
  for (std::string w; in >> w;) out.push_back(w);
  return out;
}

// llama: the rotary embedding, RMSNorm, SwiGLU, 2 query groups of 2 heads, no linear biases,
// --qk-layernorm, 4 experts of which each token takes 2 in every layer but the second (a
// Qwen3-MoE-like model with --moe-layer-freq: the grouped QKV output's scratch, the query and key
// norms' kept inputs and the MoE layer's routing, gathered rows and expert activations
// recomputed too, a recomputation group's shared layers serving both kinds of MLP). Not finalized: the
// tests that add settings to it finalize it then (config() below finalizes it at once).
TransformerConfig unfinalized_config(const Recompute& r, float dropout = 0.1f, bool llama = false,
                                     const std::vector<std::string>& modules = {}, bool moe_layer_recompute = false) {
  TransformerConfig c;
  if (llama) {
    c.position_embedding_type = "rope";
    c.normalization = "RMSNorm";
    c.swiglu = true;
    c.ffn_hidden_size = 48;
    c.num_query_groups = 2;
    c.add_bias_linear = false;
    c.qk_layernorm = true;
    c.num_experts = 4;
    c.moe_router_topk = 2;
    c.moe_aux_loss_coeff = 0.01f;
    c.moe_layer_pattern.assign(size_t(kLayers), 1);
    c.moe_layer_pattern[1] = 0;
  }
  c.num_layers = kLayers;
  c.hidden_size = 32;
  c.num_attention_heads = 4;
  c.vocab_size = 50;
  c.make_vocab_size_divisible_by = 8;
  c.max_position_embeddings = kT;
  c.hidden_dropout = c.attention_dropout = dropout;
  c.recompute_granularity = r.granularity;
  c.recompute_method = r.method;
  c.recompute_num_layers = r.num_layers;
  c.recompute_modules = modules.empty() ? split_modules(r.modules) : modules;
  c.moe_layer_recompute = moe_layer_recompute;
  return c;
}

TransformerConfig config(const Recompute& r, float dropout = 0.1f, bool llama = false,
                         const std::vector<std::string>& modules = {}, bool moe_layer_recompute = false) {
  TransformerConfig c = unfinalized_config(r, dropout, llama, modules, moe_layer_recompute);
  c.finalize();
  return c;
}

struct TrainRun {
  std::vector<double> losses, grad_norms;
  std::vector<float> params;
  std::vector<double> load_balancing, global_load_balancing;  // the logged MoE losses
};

TrainRun train_config(const TransformerConfig& c, int64_t global_batch = kGBS) {
  GPTModel model(c, kB, kT);
  model.init_parameters(1234);
  Optimizer opt(model.params(), OptimizerConfig{});
  MockSamples data(model.config().vocab_size, kT, 7);
  StepConfig sc;
  sc.micro_batch_size = kB;
  sc.global_batch_size = global_batch;
  sc.seq_length = kT;
  TrainRun run;
  for (int64_t it = 0; it < kIters; ++it) {
    const StepResult s = train_step(model, opt, data, sc, it, 1e-3, 0.1);
    run.losses.push_back(s.lm_loss);
    run.grad_norms.push_back(s.grad_norm);
    run.load_balancing.push_back(s.load_balancing_loss);
    run.global_load_balancing.push_back(s.global_load_balancing_loss);
  }
  run.params.assign(model.params().params(), model.params().params() + model.params().numel());
  return run;
}

TrainRun train(const Recompute& r, bool llama = false, const std::vector<std::string>& modules = {},
               bool moe_layer_recompute = false) {
  return train_config(config(r, 0.1f, llama, modules, moe_layer_recompute));
}

const Recompute kNone{"", "", 0};

// The run with recomputation r has the losses, gradient norms and final parameters of `base`, bit for bit.
void expect_bit_identical(const TrainRun& got, const TrainRun& base, const Recompute& r) {
  const std::string what = std::string(r.granularity) + " " + r.method + " " + r.modules;
  EXPECT_EQ(got.losses, base.losses) << what;
  EXPECT_EQ(got.grad_norms, base.grad_norms) << what;
  ASSERT_EQ(got.params.size(), base.params.size());
  EXPECT_EQ(std::memcmp(got.params.data(), base.params.data(), base.params.size() * sizeof(float)), 0)
      << what << ": final parameters differ";
}

class ModelRecompute : public ::testing::TestWithParam<Recompute> {};

TEST_P(ModelRecompute, TrainingIsBitIdentical) {
  static const TrainRun base = train(kNone);
  const TrainRun got = train(GetParam());
  ASSERT_EQ(got.losses.size(), base.losses.size());
  for (size_t i = 0; i < base.losses.size(); ++i) {
    EXPECT_EQ(got.losses[i], base.losses[i]) << "loss, iteration " << i + 1;
    EXPECT_EQ(got.grad_norms[i], base.grad_norms[i]) << "grad norm, iteration " << i + 1;
  }
  ASSERT_EQ(got.params.size(), base.params.size());
  EXPECT_EQ(std::memcmp(got.params.data(), base.params.data(), base.params.size() * sizeof(float)), 0)
      << "final parameters differ";
  // The run trained: the loss moved.
  EXPECT_NE(base.losses.front(), base.losses.back());
}

TEST(ModelRecomputeLlama, TrainingIsBitIdentical) {
  const TrainRun base = train(kNone, true);
  // The selective modules over RMSNorm, SwiGLU, the query and key norms and a dense layer among
  // MoE layers (mlp recomputes the dense one's; layernorm every layer's norms, the MoE layers' LN2
  // input to the router included).
  for (const Recompute& r : {Recompute{"full", "uniform", 2}, Recompute{"full", "block", 3}, Recompute{"selective", "", 0},
                             Recompute{"selective", "", 0, "mlp"}, Recompute{"selective", "", 0, "layernorm"},
                             Recompute{"selective", "", 0, "moe_act"},
                             Recompute{"selective", "", 0, "core_attn mlp layernorm moe_act"},
                             Recompute{"selective", "", 0, "core_attn mlp layernorm moe moe_act"}}) {
    expect_bit_identical(train(r, true), base, r);
  }
  EXPECT_NE(base.losses.front(), base.losses.back());
}

// --multi-latent-attention (a query latent, RMSNorm latent norms, values narrower than the heads): the
// latents, the fused qkv and attn_v rebuilt by full recomputation, attn_v with the core attention by
// selective, LN1's output with layernorm, the fused qkv from the latents with mla_up_proj (whose arena
// keeps one layer's qkv in place of every layer's); bit for bit the run without.
TEST(ModelRecomputeMla, TrainingIsBitIdentical) {
  auto mla = [](const Recompute& r) {
    TransformerConfig c = unfinalized_config(r, 0.1f, true);
    set_mla(c);
    c.finalize();
    return c;
  };
  const TrainRun base = train_config(mla(kNone));
  for (const Recompute& r : {Recompute{"full", "uniform", 2}, Recompute{"full", "block", 3}, Recompute{"selective", "", 0},
                             Recompute{"selective", "", 0, "core_attn layernorm"},
                             Recompute{"selective", "", 0, "mla_up_proj"},
                             Recompute{"selective", "", 0, "core_attn mla_up_proj layernorm moe"}}) {
    expect_bit_identical(train_config(mla(r)), base, r);
  }
  EXPECT_NE(base.losses.front(), base.losses.back());
  const TransformerConfig plain = mla(kNone), up = mla(Recompute{"selective", "", 0, "mla_up_proj"});
  const size_t qkv = size_t(kB * kT * plain.qkv_width()) * sizeof(float);
  EXPECT_EQ(GPTModel::activation_bytes(plain, kB, kT, {}, {}, 1) - GPTModel::activation_bytes(up, kB, kT, {}, {}, 1),
            size_t(kLayers - 1) * qkv);
  TransformerConfig no_latent = mla(kNone);
  no_latent.q_lora_rank = 0;
  no_latent.recompute_granularity = "selective";
  no_latent.recompute_modules = {"mla_up_proj"};
  EXPECT_THROW(no_latent.finalize(), Error);
}

// --experimental-attention-variant gated_delta_net (GDN layers among the Llama-style layers with experts, the
// attention gated): a recomputed GDN layer's core is made once before its backward, which then uses those
// buffers rather than making them again; bit for bit the run without recomputation.
TEST(ModelRecomputeGatedDeltaNet, TrainingIsBitIdentical) {
  auto gdn = [](const Recompute& r) {
    TransformerConfig c = unfinalized_config(r, 0.1f, true);
    c.attention_output_gate = true;
    std::vector<int> pattern(size_t(kLayers), 1);
    pattern.back() = 0;
    set_gdn(c, pattern, GdnShapes{2, 4, 8, 6});
    c.finalize();
    return c;
  };
  const TrainRun base = train_config(gdn(kNone));
  for (const Recompute& r : {Recompute{"full", "uniform", 2}, Recompute{"full", "block", 3}, Recompute{"selective", "", 0},
                             Recompute{"selective", "", 0, "core_attn mlp layernorm moe"}})
    expect_bit_identical(train_config(gdn(r)), base, r);
  EXPECT_NE(base.losses.front(), base.losses.back());
}

// --hybrid-override-pattern (a Mamba layer, an MoE-only, an attention-only and an MLP-only layer with the
// Llama-style settings, the attention gated): a recomputed Mamba layer's mixer is made once before its
// backward; recomputation groups whose shared layers serve every kind; bit for bit the run without.
TEST(ModelRecomputeHybrid, TrainingIsBitIdentical) {
  auto hybrid = [](const Recompute& r) {
    TransformerConfig c = unfinalized_config(r, 0.1f, true);
    c.attention_output_gate = true;
    set_hybrid(c, std::string("ME*-M-").substr(0, size_t(kLayers)));
    c.finalize();
    return c;
  };
  const TrainRun base = train_config(hybrid(kNone));
  for (const Recompute& r : {Recompute{"full", "uniform", 2}, Recompute{"full", "block", 3}, Recompute{"selective", "", 0},
                             Recompute{"selective", "", 0, "core_attn mlp layernorm moe"}})
    expect_bit_identical(train_config(hybrid(r)), base, r);
  EXPECT_NE(base.losses.front(), base.losses.back());
}

// MoE-layer recomputation (--recompute-modules moe, alone or with core_attn; --moe-layer-recompute):
// every MoE layer's routing, gathered rows and experts rerun before its backward into one shared
// copy of their buffers. Bit for bit the run without, and the arena keeps one MoE layer's buffers
// in place of the three MoE layers'.
TEST(ModelRecomputeMoe, TrainingIsBitIdenticalAndTheArenaKeepsOneMoeLayer) {
  const TrainRun base = train(kNone, true);
  const Recompute selective{"selective", "", 0};
  struct Mode {
    Recompute r;
    std::vector<std::string> modules;
    bool moe_layer;
  };
  for (const Mode& m : {Mode{selective, {"moe"}, false}, Mode{selective, {"core_attn", "moe"}, false},
                        Mode{kNone, {}, true}}) {
    const TrainRun got = train(m.r, true, m.modules, m.moe_layer);
    EXPECT_EQ(got.losses, base.losses) << m.r.granularity << " " << m.modules.size();
    EXPECT_EQ(got.grad_norms, base.grad_norms) << m.r.granularity << " " << m.modules.size();
    ASSERT_EQ(got.params.size(), base.params.size());
    EXPECT_EQ(std::memcmp(got.params.data(), base.params.data(), base.params.size() * sizeof(float)), 0)
        << m.r.granularity << " " << m.modules.size() << ": final parameters differ";
  }
  const TransformerConfig plain = config(kNone, 0.1f, true), moe = config(kNone, 0.1f, true, {}, true);
  const int64_t moe_layers = 3, state = (moe_state_floats(kB * kT, moe_shape(plain)) * 4 + 63) / 64 * 64;
  EXPECT_EQ(GPTModel::activation_bytes(plain, kB, kT) - GPTModel::activation_bytes(moe, kB, kT),
            size_t((moe_layers - 1) * state));
  // moe_act: one [N k, F] activation (64-byte multiples here) in place of each MoE layer's.
  const TransformerConfig act = config(selective, 0.1f, true, {"core_attn", "moe_act"});
  const TransformerConfig attn = config(selective, 0.1f, true, {"core_attn"});
  const int64_t act_bytes = kB * kT * plain.moe_router_topk * plain.moe_ffn_hidden_size * 4;
  ASSERT_EQ(act_bytes % 64, 0);
  EXPECT_EQ(GPTModel::activation_bytes(attn, kB, kT) - GPTModel::activation_bytes(act, kB, kT),
            size_t((moe_layers - 1) * act_bytes));
  EXPECT_NE(base.losses.front(), base.losses.back());
  // Only the modules lattice recomputes; moe with full recomputation (which recomputes it) refused,
  // moe_act without experts.
  for (const auto& [r, modules, layer, flag] :
       {std::tuple{selective, std::vector<std::string>{"mla_up_proj"}, false, "--recompute-modules mla_up_proj"},
        std::tuple{kNone, std::vector<std::string>{"moe"}, false, "--recompute-modules needs --recompute-granularity selective"},
        std::tuple{Recompute{"full", "uniform", 1}, std::vector<std::string>{}, true, "--moe-layer-recompute"}}) {
    try {
      config(r, 0.1f, true, modules, layer);
      ADD_FAILURE() << "accepted " << flag;
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(flag), std::string::npos) << e.what();
    }
  }
  try {
    config(selective, 0.1f, false, {"moe_act"});
    ADD_FAILURE() << "accepted moe_act without experts";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("--recompute-modules moe_act needs --num-experts"), std::string::npos)
        << e.what();
  }
}

// --moe-router-load-balancing-type global_aux_loss: with one micro-batch per step (one process) the
// global loss is the micro-batch's (aux_loss with the same coefficient), bit for bit, only because
// every step's counts start again; with two micro-batches per step it is another loss (the second
// weighs the two micro-batches' average counts). Full, MoE-layer and moe_act recomputation count
// each micro-batch once: bit for bit the run without.
TEST(ModelRecomputeMoe, GlobalAuxLossRestartsEachStepAndCountsEachMicroBatchOnce) {
  auto with = [](bool global, const Recompute& r, bool moe_layer = false, std::vector<std::string> modules = {}) {
    TransformerConfig c = config(r, 0.1f, true, modules, moe_layer);
    c.moe_aux_loss_coeff = global ? 0.0f : 0.05f;
    c.moe_global_aux_loss = global;
    c.moe_global_aux_loss_coeff = global ? 0.05f : 0.0f;
    c.finalize();
    return c;
  };
  auto same = [](const TrainRun& got, const TrainRun& want, const std::string& what) {
    EXPECT_EQ(got.losses, want.losses) << what;
    EXPECT_EQ(got.grad_norms, want.grad_norms) << what;
    ASSERT_EQ(got.params.size(), want.params.size());
    EXPECT_EQ(std::memcmp(got.params.data(), want.params.data(), want.params.size() * sizeof(float)), 0)
        << what << ": final parameters differ";
  };
  const TrainRun aux_one = train_config(with(false, kNone), kB), global_one = train_config(with(true, kNone), kB);
  same(global_one, aux_one, "one micro-batch per step");
  EXPECT_EQ(global_one.global_load_balancing, aux_one.load_balancing);
  EXPECT_NE(aux_one.losses.front(), aux_one.losses.back());
  const TrainRun aux = train_config(with(false, kNone)), global = train_config(with(true, kNone));
  ASSERT_EQ(kGBS / kB, 2);
  EXPECT_EQ(global.losses.front(), aux.losses.front());  // the first forward knows no loss
  EXPECT_NE(std::memcmp(global.params.data(), aux.params.data(), aux.params.size() * sizeof(float)), 0)
      << "two micro-batches: the global loss trained as the micro-batches' own";
  same(train_config(with(true, Recompute{"full", "uniform", 2})), global, "full recomputation");
  same(train_config(with(true, kNone, true)), global, "--moe-layer-recompute");
  same(train_config(with(true, Recompute{"selective", "", 0}, false, {"moe_act", "layernorm"})), global,
       "--recompute-modules moe_act layernorm");
}

// --recompute-modules shared_experts (with moe_act): the gated shared experts' fc1 outputs,
// activation, outputs and gate made again before each MoE layer's backward into one copy the three
// MoE layers share. Bit for bit the run without; the arena keeps that one copy in place of three;
// refused without shared experts.
TEST(ModelRecomputeMoe, SharedExpertsAreBitIdenticalAndKeptOnce) {
  auto with_shared = [](std::vector<std::string> modules) {
    TransformerConfig c = unfinalized_config(kNone, 0.1f, true);
    c.moe_shared_expert_intermediate_size = 16;
    c.moe_shared_expert_gate = true;
    c.recompute_granularity = modules.empty() ? "" : "selective";
    c.recompute_modules = modules;
    c.finalize();
    return c;
  };
  const TrainRun base = train_config(with_shared({}));
  for (const auto& modules : {std::vector<std::string>{"shared_experts"}, std::vector<std::string>{"shared_experts", "moe_act", "layernorm"}}) {
    const TrainRun got = train_config(with_shared(modules));
    EXPECT_EQ(got.losses, base.losses) << modules.size();
    ASSERT_EQ(got.params.size(), base.params.size());
    EXPECT_EQ(std::memcmp(got.params.data(), base.params.data(), base.params.size() * sizeof(float)), 0)
        << modules.size() << " modules: final parameters differ";
  }
  EXPECT_NE(base.losses.front(), base.losses.back());
  const TransformerConfig attn = with_shared({"core_attn"}), shared = with_shared({"core_attn", "shared_experts"});
  const int64_t buffers = moe_shared_experts_floats(kB * kT, moe_shape(attn)) * 4;  // 64-byte multiples
  ASSERT_EQ(buffers % 64, 0);
  EXPECT_EQ(GPTModel::activation_bytes(attn, kB, kT) - GPTModel::activation_bytes(shared, kB, kT), size_t(2 * buffers));
  try {
    config(Recompute{"selective", "", 0}, 0.1f, true, {"shared_experts"});
    ADD_FAILURE() << "shared_experts accepted without shared experts";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("--moe-shared-expert-intermediate-size"), std::string::npos) << e.what();
  }
}

// Two chunks of 1 and 3 layers (N clamped to the first) holding two micro-batches each:
// both forwards, then both backwards (the shared recompute scratch is reused across
// slots and chunks); the accumulated gradients equal those without recomputation.
TEST_P(ModelRecompute, ChunksAndSlotsGiveTheSameGradients) {
  auto grads = [](const Recompute& r) {
    ModelPlacement place;
    place.chunks = {{0, 1}, {1, kLayers}};
    place.slots = 2;
    GPTModel model(config(r), kB, kT, {}, place);
    model.init_parameters(99);
    model.params().zero_grad();
    MockSamples data(model.config().vocab_size, kT, 3);
    const int64_t C = model.config().hidden_size, N = kB * kT;
    std::vector<int32_t> tokens(size_t(2 * kB * (kT + 1)));
    for (int64_t s = 0; s < 2 * kB; ++s) data.sample(s, tokens.data() + s * (kT + 1));
    std::vector<double> losses;
    for (int s = 0; s < 2; ++s) {
      MicroBatchKey key{1234, 5, s, true};
      const int32_t* tok = tokens.data() + s * kB * (kT + 1);
      model.forward_step(0, s, tok, nullptr, kB, kT, 0.5f, key);
      std::memcpy(model.input_buffer(1, s), model.output(0, s), size_t(N * C) * sizeof(float));
      const LossSum l = model.forward_step(1, s, tok, nullptr, kB, kT, 0.5f, key);
      losses.push_back(l.sum);
    }
    for (int s = 1; s >= 0; --s) {
      MicroBatchKey key{1234, 5, s, true};
      model.backward_step(1, s, kB, kT, key);
      if (model.output_grad_buffer() != model.input_grad())
        std::memcpy(model.output_grad_buffer(), model.input_grad(), size_t(N * C) * sizeof(float));
      model.backward_step(0, s, kB, kT, key);
    }
    std::vector<float> g(model.params().grads(), model.params().grads() + model.params().numel());
    for (double l : losses) g.push_back(float(l));
    return g;
  };
  const std::vector<float> base = grads(kNone), got = grads(GetParam());
  ASSERT_EQ(got.size(), base.size());
  EXPECT_EQ(std::memcmp(got.data(), base.data(), base.size() * sizeof(float)), 0) << "gradients differ";
}

// The arena's bytes from the shapes (every allocation rounded to 64 bytes): the buffers
// of one layer and one residual, the layers and residuals a micro-batch no longer keeps,
// and the shared scratch (one group, or one attention output).
TEST_P(ModelRecompute, ActivationBytesShrinkByTheDroppedBuffers) {
  const Recompute r = GetParam();
  const TransformerConfig c = config(r);
  const int64_t N = kB * kT, C = c.hidden_size, F = c.ffn_hidden_size, H = c.num_attention_heads;
  auto bytes = [](int64_t floats) { return (floats * 4 + 63) / 64 * 64; };
  const int64_t resid = bytes(N * C);
  const int64_t attention = bytes(N * C) + bytes(kB * H * kT);  // attn, lse
  const int64_t layer = 3 * bytes(N * C) + 4 * bytes(N) + bytes(N * 3 * C) + attention + 2 * bytes(N * F);
  int64_t per_micro_batch = 0, scratch = 0;  // dropped per micro-batch; shared once
  const std::string g = r.granularity, m = r.method;
  const int64_t n = r.num_layers;
  if (g == "selective") {
    std::vector<std::string> modules = split_modules(r.modules);
    if (modules.empty()) modules = {"core_attn"};
    auto has = [&](const char* w) { return std::find(modules.begin(), modules.end(), w) != modules.end(); };
    if (has("core_attn")) {
      per_micro_batch += kLayers * attention;
      scratch += attention;
    }
    if (has("mlp")) {  // fc1's output and the GELU
      per_micro_batch += kLayers * 2 * bytes(N * F);
      scratch += 2 * bytes(N * F);
    }
    if (has("layernorm")) {  // LN1's and LN2's outputs; one shared buffer serves both
      per_micro_batch += kLayers * 2 * bytes(N * C);
      scratch += bytes(N * C);
    }
  } else if (m == "uniform") {
    const int64_t groups = (kLayers + n - 1) / n;
    per_micro_batch = kLayers * layer + (kLayers - groups) * resid;  // inner residuals too
    scratch = n * layer + (n - 1) * resid;
  } else {
    per_micro_batch = n * layer;
    scratch = layer;
  }
  for (int slots : {1, 3}) {
    ModelPlacement place;
    place.slots = slots;
    const int64_t without = int64_t(GPTModel::activation_bytes(config(kNone), kB, kT, {}, place));
    const int64_t with = int64_t(GPTModel::activation_bytes(c, kB, kT, {}, place));
    EXPECT_EQ(without - with, slots * per_micro_batch - scratch) << slots << " slots";
    // One micro-batch with block N = 1 keeps 3 layers plus the scratch layer: no saving.
    if (slots > 1 || !(m == "block" && n == 1)) EXPECT_LT(with, without) << slots << " slots";
  }
  GPTModel model(c, kB, kT);
  EXPECT_EQ(model.arena_bytes(), GPTModel::activation_bytes(c, kB, kT));
}

INSTANTIATE_TEST_SUITE_P(Recompute, ModelRecompute,
                         ::testing::Values(Recompute{"full", "uniform", 1}, Recompute{"full", "uniform", 2},
                                           Recompute{"full", "uniform", 3}, Recompute{"full", "block", 1},
                                           Recompute{"full", "block", 3}, Recompute{"selective", "", 0},
                                           Recompute{"selective", "", 0, "mlp"}, Recompute{"selective", "", 0, "layernorm"},
                                           Recompute{"selective", "", 0, "core_attn mlp layernorm"}),
                         [](const ::testing::TestParamInfo<Recompute>& i) {
                           std::string modules;
                           for (const std::string& w : split_modules(i.param.modules)) modules += "_" + w;
                           return std::string(i.param.granularity) + (*i.param.method ? "_" : "") +
                                  i.param.method + (i.param.num_layers ? std::to_string(i.param.num_layers) : "") +
                                  modules;
                         });

std::string config_error(const Recompute& r) {
  try {
    config(r);
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

TEST(ModelRecomputeConfig, ErrorsNameTheFlag) {
  auto has = [](const std::string& s, const char* what) { return s.find(what) != std::string::npos; };
  EXPECT_TRUE(has(config_error({"full", "", 0}), "--recompute-method")) << config_error({"full", "", 0});
  EXPECT_TRUE(has(config_error({"full", "uniform", 0}), "--recompute-num-layers"));
  EXPECT_TRUE(has(config_error({"full", "block", kLayers + 1}), "--recompute-num-layers"));
  EXPECT_TRUE(has(config_error({"selective", "uniform", 0}), "--recompute-method"));
  EXPECT_TRUE(has(config_error({"selective", "", 2}), "--recompute-num-layers"));
  EXPECT_TRUE(has(config_error({"", "block", 1}), "--recompute-method"));
  EXPECT_TRUE(has(config_error({"partial", "", 0}), "--recompute-granularity"));
  EXPECT_TRUE(has(config_error({"full", "even", 1}), "--recompute-method"));
  EXPECT_EQ(config_error({"full", "block", kLayers}), "");
}

TEST(ModelRecomputeConfig, FlagsReachTheConfig) {
  std::vector<std::string> words = {"lattice", "train", "--num-layers", "4", "--hidden-size", "32",
                                    "--num-attention-heads", "4", "--seq-length", "16", "--micro-batch-size", "2",
                                    "--train-iters", "3", "--mock-data", "--vocab-size", "100",
                                    "--recompute-granularity", "full", "--recompute-method", "block",
                                    "--recompute-num-layers", "2"};
  std::vector<char*> argv;
  for (auto& w : words) argv.push_back(w.data());
  const TransformerConfig c = parse_train_args(int(argv.size()), argv.data(), 2).transformer_config();
  EXPECT_EQ(c.recompute_granularity, "full");
  EXPECT_EQ(c.recompute_method, "block");
  EXPECT_EQ(c.recompute_num_layers, 2);
  // fp8's amax history would record a recomputed forward twice: full is refused with it.
  words.insert(words.end(), {"--fp8-format", "e4m3"});
  argv.clear();
  for (auto& w : words) argv.push_back(w.data());
  try {
    parse_train_args(int(argv.size()), argv.data(), 2);
    ADD_FAILURE() << "full recomputation with --fp8-format accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("--recompute-granularity full is not supported with --fp8-recipe delayed"),
              std::string::npos)
        << e.what();
  }
  words.resize(words.size() - 6);  // full without a method
  argv.clear();
  for (auto& w : words) argv.push_back(w.data());
  try {
    parse_train_args(int(argv.size()), argv.data(), 2);
    ADD_FAILURE() << "full without --recompute-method accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("--recompute-method"), std::string::npos) << e.what();
  }
}

// --recompute-modules from the command line; mlp reruns fc1's GEMM, which fp8 would record twice
// (refused), layernorm reruns no GEMM (accepted with fp8).
TEST(ModelRecomputeConfig, ModulesFromFlagsAndFp8) {
  auto parse = [](const std::vector<std::string>& extra) {
    std::vector<std::string> words = {"lattice", "train", "--num-layers", "2", "--hidden-size", "32",
                                      "--num-attention-heads", "4", "--seq-length", "16", "--micro-batch-size", "2",
                                      "--train-iters", "3", "--mock-data", "--vocab-size", "128",
                                      "--recompute-granularity", "selective"};
    words.insert(words.end(), extra.begin(), extra.end());
    std::vector<char*> argv;
    for (auto& w : words) argv.push_back(w.data());
    return parse_train_args(int(argv.size()), argv.data(), 2).transformer_config();
  };
  const TransformerConfig c = parse({"--recompute-modules", "mlp", "layernorm"});
  EXPECT_TRUE(c.recompute_mlp());
  EXPECT_TRUE(c.recompute_layernorm());
  EXPECT_FALSE(c.recompute_core_attention()) << "a given list replaces the default core_attn";
  const TransformerConfig fp8 = parse({"--recompute-modules", "layernorm", "--fp8-format", "hybrid"});
  EXPECT_TRUE(fp8.recompute_layernorm());
  try {
    parse({"--recompute-modules", "mlp", "--fp8-format", "hybrid"});
    ADD_FAILURE() << "--recompute-modules mlp with --fp8-format accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("--recompute-modules mlp is not supported with --fp8-recipe delayed"),
              std::string::npos)
        << e.what();
  }
  // The current-scaling recipes keep no amaxes: a recomputed GEMM quantizes as the first.
  for (const char* recipe : {"tensorwise", "blockwise", "mxfp8"})
    EXPECT_TRUE(parse({"--recompute-modules", "mlp", "--fp8-format", "hybrid", "--fp8-recipe", recipe}).recompute_mlp());
  try {
    parse({"--recompute-modules", "mla_up_proj"});
    ADD_FAILURE() << "--recompute-modules mla_up_proj accepted without --multi-latent-attention";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("--recompute-modules mla_up_proj needs --multi-latent-attention"),
              std::string::npos)
        << e.what();
  }
  try {
    parse({"--recompute-modules", "mla_up_proj", "--fp8-format", "hybrid"});
    ADD_FAILURE() << "--recompute-modules mla_up_proj with --fp8-format accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("--recompute-modules mla_up_proj is not supported with --fp8-recipe delayed"),
              std::string::npos)
        << e.what();
  }
}

}  // namespace
}  // namespace lattice
