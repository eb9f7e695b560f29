// A hybrid's multi-token prediction depths (--hybrid-override-pattern MAIN/MTP/...; Megatron's unified form): a
// hybrid of attention-only and MLP-only layers, "*-*-/*-", is block for block the 2-layer GPT model with one
// prediction depth (a GPT depth's transformer layer is the hybrid depth's "*-"). With the same parameters under
// their Megatron names (the hybrid's decoder layers 2i and 2i + 1 are the GPT layer i's attention and MLP blocks,
// its depth's mtp_model_layer.layers.0 and .1 the GPT depth's transformer_layer's) both give the same main and
// depth losses and the same gradient of every parameter; with MoE layers ("*E*E/*E") too. And the unified pattern's
// parsing and its errors.
#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <map>
#include <random>
#include <string>
#include <vector>

#include "core/error.h"
#include "model/gpt_model.h"
#include "model/hybrid_layer_allocation.h"
#include "test_util.h"
#include "../mamba_test_config.h"

namespace lattice {
namespace {

TransformerConfig base(bool moe) {
  TransformerConfig c;
  c.num_layers = 2;
  c.hidden_size = 32;
  c.num_attention_heads = 4;
  c.vocab_size = 64;
  c.max_position_embeddings = 16;
  c.hidden_dropout = c.attention_dropout = 0.0f;
  c.mtp_num_layers = 1;
  c.normalization = "RMSNorm";
  c.add_bias_linear = false;
  if (moe) {
    c.num_experts = 4;
    c.moe_router_topk = 2;
    c.moe_ffn_hidden_size = 24;
    c.moe_aux_loss_coeff = 0.01f;
  }
  return c;
}

// The hybrid's name of a GPT model's parameter.
std::string hybrid_name(const std::string& gpt) {
  auto block = [](const std::string& rest) {  // 0: the attention block's, 1: the MLP block's
    return rest.rfind("pre_mlp_layernorm.", 0) == 0 || rest.rfind("mlp.", 0) == 0 ? 1 : 0;
  };
  const std::string layers = "decoder.layers.", depth = "mtp.layers.0.transformer_layer.";
  if (gpt.rfind(layers, 0) == 0) {
    const size_t dot = gpt.find('.', layers.size());
    const int i = std::stoi(gpt.substr(layers.size(), dot - layers.size()));
    const std::string rest = gpt.substr(dot + 1);
    return layers + std::to_string(2 * i + block(rest)) + "." + rest;
  }
  if (gpt.rfind(depth, 0) == 0) {
    const std::string rest = gpt.substr(depth.size());
    return "mtp.layers.0.mtp_model_layer.layers." + std::to_string(block(rest)) + "." + rest;
  }
  return gpt;
}

struct DepthRun {
  double loss = 0;
  std::vector<LossSum> mtp;
  std::map<std::string, std::vector<float>> grads;  // under the GPT model's names
};

DepthRun run(GPTModel& m, const std::vector<int32_t>& tokens, int64_t B, int64_t T, bool hybrid) {
  DepthRun r;
  m.params().zero_grad();
  r.loss = m.forward_backward(tokens.data(), nullptr, B, T, 1.0f, {});
  r.mtp = m.take_mtp_losses();
  for (const ParamInfo& p : m.params().infos()) {
    const float* g = m.params().grads() + p.offset;
    r.grads[hybrid ? p.name : hybrid_name(p.name)] = std::vector<float>(g, g + p.numel);
  }
  return r;
}

TEST(HybridMtp, AttentionAndMlpBlocksEqualTheGptModelsLayers) {
  for (bool moe : {false, true}) {
    SCOPED_TRACE(moe ? "*E*E/*E" : "*-*-/*-");
    TransformerConfig g = base(moe);
    g.finalize();
    TransformerConfig h = base(moe);
    set_hybrid(h, moe ? "*E*E" : "*-*-");
    h.mtp_hybrid_pattern = moe ? "*E" : "*-";
    h.finalize();
    EXPECT_EQ(h.hybrid_override_pattern(), moe ? "*E*E/*E" : "*-*-/*-");
    const int64_t B = 2, T = 16;
    GPTModel gpt(g, B, T), hyb(h, B, T);
    gpt.init_parameters(5);
    ASSERT_EQ(gpt.params().infos().size(), hyb.params().infos().size());
    std::mt19937 gen(3);  // larger than the init, so every block matters
    std::normal_distribution<float> nd(0.0f, 0.2f);
    for (const ParamInfo& p : gpt.params().infos()) {
      float* w = gpt.params().params() + p.offset;
      if (p.name.find("norm") == std::string::npos)
        for (int64_t i = 0; i < p.numel; ++i) w[i] = nd(gen);
      ASSERT_TRUE(hyb.params().has(hybrid_name(p.name))) << p.name << " -> " << hybrid_name(p.name);
      const ParamInfo& q = hyb.params().info(hybrid_name(p.name));
      ASSERT_EQ(q.numel, p.numel) << p.name;
      std::copy(w, w + p.numel, hyb.params().params() + q.offset);
    }
    std::vector<int32_t> tokens(size_t(B * (T + 1)));
    for (size_t i = 0; i < tokens.size(); ++i) tokens[i] = int32_t((i * 37 + 11) % 64);
    const DepthRun a = run(gpt, tokens, B, T, false), b = run(hyb, tokens, B, T, true);
    EXPECT_NEAR(b.loss, a.loss, 1e-6 * a.loss);
    ASSERT_EQ(a.mtp.size(), 1u);
    ASSERT_EQ(b.mtp.size(), 1u);
    EXPECT_GT(a.mtp[0].sum, 0.0);
    EXPECT_NEAR(b.mtp[0].sum, a.mtp[0].sum, 1e-6 * a.mtp[0].sum);
    for (const auto& [name, want] : a.grads) {
      const std::vector<float>& got = b.grads.at(name);
      double scale = 0, err = 0;
      for (size_t i = 0; i < want.size(); ++i) {
        scale = std::max(scale, std::fabs(double(want[i])));
        err = std::max(err, std::fabs(double(got[i]) - double(want[i])));
      }
      EXPECT_LE(err, 1e-5 * scale + 1e-9) << name;
      if (name.rfind("mtp.", 0) == 0 && name.find("weight") != std::string::npos) EXPECT_GT(scale, 0.0) << name;
    }
  }
}

// A depth of a Mamba layer with an MLP block ("M-", which has no GPT twin): the gradients of its parameters (and
// of the decoder's and the shared embedding's) against central differences of the training objective, the main
// loss plus mtp_loss_scaling_factor / K times the depths' losses.
TEST(HybridMtp, MambaDepthGradientsMatchFiniteDifferences) {
  TransformerConfig c = base(false);
  set_hybrid(c, "M*-/M-/M-", MambaShapes{4, 8, 2, 6});
  c.mtp_loss_scaling_factor = 0.7f;
  c.finalize();
  const int64_t B = 2, T = 12;
  GPTModel m(c, B, T);
  m.init_parameters(9);
  std::mt19937 gen(4);
  std::normal_distribution<float> nd(0.0f, 0.3f);
  for (const ParamInfo& p : m.params().infos())
    if (p.name.find("norm") == std::string::npos && p.name.find("A_log") == std::string::npos)
      for (int64_t i = 0; i < p.numel; ++i) m.params().params()[p.offset + i] = nd(gen);
  std::vector<int32_t> tokens(size_t(B * (T + 1)));
  for (size_t i = 0; i < tokens.size(); ++i) tokens[i] = int32_t((i * 29 + 5) % 64);
  auto objective = [&] {
    m.params().zero_grad();
    const double main = m.forward_backward(tokens.data(), nullptr, B, T, 1.0f, {});
    double depths = 0;
    for (const LossSum& l : m.take_mtp_losses()) depths += l.sum / l.count;
    return main + double(c.mtp_loss_scaling_factor) / double(c.mtp_num_layers) * depths;
  };
  objective();
  const std::vector<float> grads(m.params().grads(), m.params().grads() + m.params().numel());
  int checked = 0;
  for (const char* name : {"mtp.layers.1.mtp_model_layer.layers.0.mixer.in_proj.weight",
                           "mtp.layers.1.mtp_model_layer.layers.0.mixer.A_log", "mtp.layers.0.mtp_model_layer.layers.0.mixer.D",
                           "mtp.layers.0.mtp_model_layer.layers.1.mlp.linear_fc1.weight", "mtp.layers.1.eh_proj.weight",
                           "decoder.layers.0.mixer.conv1d.weight"}) {
    const ParamInfo& p = m.params().info(name);
    for (int64_t i = 0; i < p.numel; i += std::max<int64_t>(1, p.numel / 5)) {
      float& w = m.params().params()[p.offset + i];
      const float w0 = w, h = 2e-3f;
      w = w0 + h;
      const double fp = objective();
      w = w0 - h;
      const double fm = objective();
      w = w0;
      const double want = (fp - fm) / (2.0 * h), got = grads[size_t(p.offset + i)];
      EXPECT_NEAR(got, want, 2e-3 + 0.05 * std::fabs(want)) << name << "[" << i << "]";
      ++checked;
    }
  }
  EXPECT_GT(checked, 25);
}

// --mtp-use-repeated-layer: one depth's parameters for both depths equal two depths holding the same values, their
// gradient the sum of the two depths' (a GPT model's depths, and a hybrid's "*E" with the MoE router's expert bias).
TEST(HybridMtp, RepeatedLayerIsTwoDepthsOfTheSameValues) {
  for (bool hybrid : {false, true}) {
    SCOPED_TRACE(hybrid ? "M-*E/*E/*E" : "gpt, 2 depths");
    TransformerConfig two = base(hybrid);
    two.mtp_num_layers = 2;
    if (hybrid) {
      set_hybrid(two, "M-*E/*E/*E", MambaShapes{4, 8, 2, 6});
      two.moe_router_score_function = "sigmoid";
      two.moe_router_enable_expert_bias = true;
    }
    TransformerConfig one = two;
    one.mtp_use_repeated_layer = true;
    two.finalize();
    one.finalize();
    const int64_t B = 2, T = 12;
    GPTModel a(two, B, T), b(one, B, T);
    a.init_parameters(6);
    std::mt19937 gen(8);
    std::normal_distribution<float> nd(0.0f, 0.2f);
    ParamBuffer& pa = a.params();
    for (const ParamInfo& p : pa.infos())
      if (p.name.find("norm") == std::string::npos && p.name.find("A_log") == std::string::npos && !p.buffer)
        for (int64_t i = 0; i < p.numel; ++i) pa.params()[p.offset + i] = nd(gen);
    const std::string d0 = "mtp.layers.0.", d1 = "mtp.layers.1.";
    for (const ParamInfo& p : pa.infos())  // depth 1 the same values as depth 0
      if (p.name.rfind(d1, 0) == 0) {
        const ParamInfo& q = pa.info(d0 + p.name.substr(d1.size()));
        std::copy_n(pa.params() + q.offset, q.numel, pa.params() + p.offset);
      }
    EXPECT_LT(b.params().infos().size(), pa.infos().size());
    for (const ParamInfo& p : b.params().infos()) {
      const ParamInfo& q = pa.info(p.name);
      std::copy_n(pa.params() + q.offset, q.numel, b.params().params() + p.offset);
    }
    std::vector<int32_t> tokens(size_t(B * (T + 1)));
    for (size_t i = 0; i < tokens.size(); ++i) tokens[i] = int32_t((i * 41 + 3) % 64);
    const DepthRun ra = run(a, tokens, B, T, true), rb = run(b, tokens, B, T, true);
    EXPECT_EQ(ra.loss, rb.loss);
    ASSERT_EQ(rb.mtp.size(), 2u);
    for (size_t k = 0; k < 2; ++k) EXPECT_NEAR(rb.mtp[k].sum, ra.mtp[k].sum, 1e-6 * ra.mtp[k].sum) << "depth " << k;
    for (const auto& [name, got] : rb.grads) {
      std::vector<double> want(ra.grads.at(name).begin(), ra.grads.at(name).end());
      if (name.rfind(d0, 0) == 0) {
        const std::vector<float>& other = ra.grads.at(d1 + name.substr(d0.size()));
        for (size_t i = 0; i < want.size(); ++i) want[i] += other[i];
      }
      double scale = 0, err = 0;
      for (size_t i = 0; i < want.size(); ++i) {
        scale = std::max(scale, std::fabs(want[i]));
        err = std::max(err, std::fabs(double(got[i]) - want[i]));
      }
      EXPECT_LE(err, 1e-5 * scale + 1e-9) << name;
    }
    if (hybrid) {  // the shared router's expert bias (zeros) moved once, by both depths' tokens: 0 or +-rate each
      b.update_expert_biases(nullptr);
      const std::string name = "mtp.layers.0.mtp_model_layer.layers.1.mlp.router.expert_bias";
      const ParamInfo& q = b.params().info(name);
      const float rate = one.moe_router_bias_update_rate;
      int moved = 0;
      for (int64_t e = 0; e < q.numel; ++e) {
        const float v = b.params().params()[q.offset + e];
        EXPECT_TRUE(v == 0.0f || std::fabs(std::fabs(v) - rate) < 1e-9f) << name << "[" << e << "] " << v;
        moved += v != 0.0f;
      }
      EXPECT_GT(moved, 0);
    }
  }
}

TEST(HybridMtp, UnifiedPatternParsesAndBadFormsAreNamed) {
  const HybridPattern p = parse_hybrid_pattern("M*M-/*E/*E");
  EXPECT_EQ(p.main, "M*M-");
  EXPECT_EQ(p.mtp, "*E");
  EXPECT_EQ(p.mtp_depths, 2);
  EXPECT_EQ(p.unified(), "M*M-/*E/*E");
  EXPECT_EQ(parse_hybrid_pattern("M*M-").mtp_depths, 0);
  using test_util::error_of;
  EXPECT_NE(error_of([] { parse_hybrid_pattern("M*/*E/*-"); }).find("differ ('*E' and '*-')"), std::string::npos);
  EXPECT_NE(error_of([] { parse_hybrid_pattern("M*//*-"); }).find("include an empty one"), std::string::npos);
  TransformerConfig c = base(false);
  set_hybrid(c, "M*");
  c.mtp_hybrid_pattern = "-*";
  EXPECT_NE(error_of([&] { c.finalize(); }).find("the MTP layers '-*' are not a mixer (M or *) and/or an MLP"),
            std::string::npos);
  c.mtp_hybrid_pattern.clear();
  EXPECT_NE(error_of([&] { c.finalize(); }).find("needs the prediction depths' layers after '/'"), std::string::npos);
}

}  // namespace
}  // namespace lattice
