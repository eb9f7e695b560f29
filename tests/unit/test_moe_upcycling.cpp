// Megatron's MoE upcycling (checkpoint/moe_upcycling.h): the upcycled model computes the dense
// model's logits where the math says it must (every expert the dense MLP with normalized top-k gates;
// squared-ReLU pieces of granularity 2 picked together), the weight scale under
// --moe-router-pre-softmax, the router's rows, and the errors.
#include "checkpoint/moe_upcycling.h"

#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "checkpoint/model_checkpoint.h"
#include "core/error.h"
#include "test_util.h"

namespace lattice {
namespace {

constexpr int64_t kB = 2, kT = 8;

TransformerConfig dense_config(bool bias, bool swiglu, bool squared_relu) {
  TransformerConfig c;
  c.num_layers = 2;
  c.hidden_size = 32;
  c.num_attention_heads = 4;
  c.ffn_hidden_size = 64;
  c.vocab_size = 64;
  c.make_vocab_size_divisible_by = 8;
  c.max_position_embeddings = kT;
  c.hidden_dropout = c.attention_dropout = 0.0f;
  c.add_bias_linear = bias;
  c.swiglu = swiglu;
  if (squared_relu) c.gelu = GeluKind::squared_relu;
  return c;
}

TransformerConfig moe_config(TransformerConfig c, int64_t experts, int64_t topk, int64_t expert_ffn) {
  c.num_experts = experts;
  c.moe_router_topk = topk;
  c.moe_ffn_hidden_size = expert_ffn;
  c.finalize();
  return c;
}

// A dense model with every parameter (biases too) away from its initial value, and its checkpoint.
struct Dense {
  std::unique_ptr<GPTModel> model;
  std::string dir;
};
Dense save_dense(TransformerConfig c) {
  c.finalize();
  Dense d{std::make_unique<GPTModel>(c, kB, kT), test_util::temp_dir() + "/dense"};
  d.model->init_parameters(11);
  float* p = d.model->params().params();
  for (int64_t i = 0; i < d.model->params().numel(); ++i) p[i] += 0.05f * float(std::sin(0.37 * double(i)));
  save_model_checkpoint(d.dir, 3, *d.model, "{}");
  return d;
}

std::vector<float> logits_of(GPTModel& m) {
  std::vector<int32_t> tokens(size_t(kB * (kT + 1)));
  for (size_t i = 0; i < tokens.size(); ++i) tokens[i] = int32_t((i * 7 + 3) % 64);
  std::vector<float> out(size_t(kB * kT * m.config().padded_vocab_size));
  m.forward_logits(tokens.data(), kB, kT, out.data());
  return out;
}

void expect_same_logits(GPTModel& dense, GPTModel& moe) {
  const std::vector<float> a = logits_of(dense), b = logits_of(moe);
  ASSERT_EQ(a.size(), b.size());
  double worst = 0, scale = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    worst = std::max(worst, std::fabs(double(a[i]) - double(b[i])));
    scale = std::max(scale, std::fabs(double(a[i])));
  }
  EXPECT_LT(worst, 2e-5 * scale) << "largest logit difference " << worst << " (logits up to " << scale << ")";
}

const float* param(GPTModel& m, const std::string& name) { return m.params().params() + m.params().info(name).offset; }

using test_util::error_of;

TEST(MoeUpcycling, EveryExpertTheDenseMlpGivesTheDenseLogits) {
  for (const auto& [bias, swiglu] : {std::pair{true, false}, std::pair{false, true}}) {
    const Dense d = save_dense(dense_config(bias, swiglu, false));
    GPTModel* dense = d.model.get();
    const std::string& dir = d.dir;
    GPTModel moe(moe_config(dense_config(bias, swiglu, false), 4, 2, 0), kB, kT);
    moe.init_parameters(5);
    EXPECT_EQ(upcycle_from_dense_checkpoint(dir, moe), 1);
    expect_same_logits(*dense, moe);
    // Expert 3 is the dense MLP itself (scale 1).
    const std::string l1 = "decoder.layers.1.mlp.";
    const ParamInfo& w = moe.params().info(l1 + "experts.local_experts.3.linear_fc1.weight");
    for (int64_t i = 0; i < w.numel; i += 97)
      EXPECT_EQ(param(moe, w.name)[i], param(*dense, l1 + "linear_fc1.weight")[i]) << i;
  }
}

// Granularity 2 (experts of half the dense width) with squared ReLU: s = 2^(1/3) on both weights, and
// the two halves of one dense MLP share a router row, so top-2 picks them together with gates 1/2:
// (1/2) s^3 (W2a relu^2(W1a x) + W2b relu^2(W1b x)) is the dense MLP.
TEST(MoeUpcycling, GranularPiecesOfSquaredReluGiveTheDenseLogits) {
  const Dense dd = save_dense(dense_config(true, false, true));
  GPTModel* dense = dd.model.get();
  const std::string& dir = dd.dir;
  GPTModel moe(moe_config(dense_config(true, false, true), 4, 2, 32), kB, kT);
  moe.init_parameters(5);
  GPTModel fresh(moe.config(), kB, kT);
  fresh.init_parameters(5);
  EXPECT_EQ(upcycle_from_dense_checkpoint(dir, moe, 2), 2);
  expect_same_logits(*dense, moe);
  // The router's row i is its initial row i / 2.
  const std::string router = "decoder.layers.0.mlp.router.weight";
  for (int64_t i = 0; i < 4; ++i)
    for (int64_t c = 0; c < 32; ++c) EXPECT_EQ(param(moe, router)[i * 32 + c], param(fresh, router)[(i / 2) * 32 + c]);
  // Expert 3 holds the dense fc1's rows 32..63 and fc2's columns 32..63, times 2^(1/3).
  const float s = float(std::cbrt(2.0));
  const std::string l0 = "decoder.layers.0.mlp.";
  EXPECT_FLOAT_EQ(param(moe, l0 + "experts.local_experts.3.linear_fc1.weight")[5 * 32 + 7],
                  s * param(*dense, l0 + "linear_fc1.weight")[(32 + 5) * 32 + 7]);
  EXPECT_FLOAT_EQ(param(moe, l0 + "experts.local_experts.3.linear_fc2.weight")[6 * 32 + 9],
                  s * param(*dense, l0 + "linear_fc2.weight")[6 * 64 + 32 + 9]);
  EXPECT_FLOAT_EQ(param(moe, l0 + "experts.local_experts.2.linear_fc1.bias")[4], s * param(*dense, l0 + "linear_fc1.bias")[4]);
  EXPECT_EQ(param(moe, l0 + "experts.local_experts.3.linear_fc2.bias")[4], param(*dense, l0 + "linear_fc2.bias")[4]);
}

// SwiGLU pieces: each expert's gate rows and up rows are the same piece of the dense gate and up halves.
TEST(MoeUpcycling, SwigluPiecesCutBothHalvesAndPreSoftmaxScales) {
  const Dense dd = save_dense(dense_config(false, true, false));
  GPTModel* dense = dd.model.get();
  const std::string& dir = dd.dir;
  TransformerConfig c = moe_config(dense_config(false, true, false), 4, 2, 32);
  c.moe_router_pre_softmax = true;
  GPTModel moe(c, kB, kT);
  moe.init_parameters(5);
  upcycle_from_dense_checkpoint(dir, moe, 2);
  // a = (E / g) g^2 / k = 2 * 4 / 2 = 4, s = 4^(1/3)
  const float s = float(std::cbrt(4.0));
  const std::string l0 = "decoder.layers.0.mlp.";
  const float* e1 = param(moe, l0 + "experts.local_experts.1.linear_fc1.weight");  // [2 x 32, 32]
  const float* d = param(*dense, l0 + "linear_fc1.weight");                         // [2 x 64, 32]
  EXPECT_FLOAT_EQ(e1[3 * 32 + 1], s * d[(32 + 3) * 32 + 1]);             // gate row 3 of piece 1
  EXPECT_FLOAT_EQ(e1[(32 + 3) * 32 + 1], s * d[(64 + 32 + 3) * 32 + 1]);  // up row 3 of piece 1
}

TEST(MoeUpcycling, ErrorsNameTheProblem) {
  const std::string dir = save_dense(dense_config(true, false, false)).dir;
  GPTModel moe(moe_config(dense_config(true, false, false), 4, 2, 0), kB, kT);
  moe.init_parameters(5);
  EXPECT_NE(error_of([&] { upcycle_from_dense_checkpoint(dir, moe, 2); })
                .find("--moe-upcycling-granularity 2: the dense --ffn-hidden-size 64 is 1 x --moe-ffn-hidden-size 64 "
                      "(give --moe-ffn-hidden-size 32)"),
            std::string::npos);
  TransformerConfig wide = dense_config(true, false, false);
  wide.hidden_size = 64;
  GPTModel other(moe_config(wide, 4, 2, 0), kB, kT);
  EXPECT_NE(error_of([&] { upcycle_from_dense_checkpoint(dir, other); }).find("hidden_size"), std::string::npos);
  // A mixture of experts is not a dense checkpoint.
  const std::string moe_dir = dir + "/../moe";
  save_model_checkpoint(moe_dir, 1, moe, "{}");
  EXPECT_NE(error_of([&] { upcycle_from_dense_checkpoint(moe_dir, moe); }).find("is a mixture of experts already"),
            std::string::npos);
  TransformerConfig three = moe_config(dense_config(true, false, false), 3, 2, 32);
  GPTModel odd(three, kB, kT);
  EXPECT_NE(error_of([&] { upcycle_from_dense_checkpoint(dir, odd, 2); }).find("--num-experts 3 must be a multiple of the granularity 2"),
            std::string::npos);
}

}  // namespace
}  // namespace lattice
