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

TEST(HybridMtp, UnifiedPatternParsesAndBadFormsAreNamed) {
  const HybridPattern p = parse_hybrid_pattern("M*M-/*E/*E");
  EXPECT_EQ(p.main, "M*M-");
  EXPECT_EQ(p.mtp, "*E");
  EXPECT_EQ(p.mtp_depths, 2);
  EXPECT_EQ(p.unified(), "M*M-/*E/*E");
  EXPECT_EQ(parse_hybrid_pattern("M*M-").mtp_depths, 0);
  auto error = [](const std::function<void()>& f) {
    try {
      f();
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string();
  };
  EXPECT_NE(error([] { parse_hybrid_pattern("M*/*E/*-"); }).find("differ ('*E' and '*-')"), std::string::npos);
  EXPECT_NE(error([] { parse_hybrid_pattern("M*//*-"); }).find("include an empty one"), std::string::npos);
  TransformerConfig c = base(false);
  set_hybrid(c, "M*");
  c.mtp_hybrid_pattern = "-*";
  EXPECT_NE(error([&] { c.finalize(); }).find("the MTP layers '-*' are not a mixer (M or *) and/or an MLP"),
            std::string::npos);
  c.mtp_hybrid_pattern.clear();
  EXPECT_NE(error([&] { c.finalize(); }).find("needs the prediction depths' layers after '/'"), std::string::npos);
}

}  // namespace
}  // namespace lattice
