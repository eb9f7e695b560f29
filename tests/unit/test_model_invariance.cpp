// Initialisation and dropout are functions of (seed, name, global index): the thread
// count never changes a number, and a parameter's initial value does not depend on
// the rest of the model.
#include <gtest/gtest.h>
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <string>
#include <cstring>
#include <vector>

#include "blas/gemm.h"
#include "core/error.h"
#include "core/philox.h"
#include "data/gpt_batches.h"
#include "model/gpt_model.h"
#include "optim/optimizer.h"
#include "train/train_step.h"

namespace lattice {
namespace {

TransformerConfig small_config(int64_t layers, float dropout) {
  TransformerConfig c;
  c.num_layers = layers;
  c.hidden_size = 32;
  c.num_attention_heads = 4;
  c.vocab_size = 50;
  c.max_position_embeddings = 16;
  c.hidden_dropout = c.attention_dropout = dropout;
  c.finalize();
  return c;
}

std::vector<double> train_losses(int threads, float dropout, std::vector<float>* final_params) {
  omp_set_num_threads(threads);
  blas_set_num_threads(threads);
  TransformerConfig c = small_config(2, dropout);
  GPTModel model(c, 2, 16);
  model.init_parameters(42);
  Optimizer opt(model.params(), OptimizerConfig{});
  MockSamples data(c.vocab_size, 16, 42);
  StepConfig sc{2, 4, 16, 1.0, 42};
  std::vector<double> losses;
  for (int it = 0; it < 4; ++it) losses.push_back(train_step(model, opt, data, sc, it, 1e-3, 0.01).lm_loss);
  final_params->assign(model.params().params(), model.params().params() + model.params().numel());
  omp_set_num_threads(2);
  blas_set_num_threads(2);
  return losses;
}

// A micro-batch larger than the model was sized for is an error before any buffer is written (it ran past
// the input buffers before: a heap overrun, then a crash in the destructor).
TEST(ModelInvariance, OversizedMicroBatchIsAnErrorNotAnOverrun) {
  GPTModel model(small_config(1, 0.0f), 1, 8);
  model.init_parameters(1);
  std::vector<int32_t> tokens(64, 3);
  std::vector<float> logits(size_t(64 * model.config().padded_vocab_size));
  try {
    model.forward_logits(tokens.data(), 1, 64, logits.data());
    ADD_FAILURE() << "a 1x64 micro-batch ran on a model sized 1x8";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("micro-batch 1x64 exceeds the model's 1x8"), std::string::npos) << e.what();
  }
  try {
    model.forward_backward(tokens.data(), nullptr, 2, 8, 1.0f, {});
    ADD_FAILURE() << "a 2x8 micro-batch ran on a model sized 1x8";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("micro-batch 2x8 exceeds"), std::string::npos) << e.what();
  }
}

TEST(ModelInvariance, ThreadCountDoesNotChangeTrainingWithDropout) {
  std::vector<float> p1, p2;
  std::vector<double> l1 = train_losses(1, 0.1f, &p1);
  std::vector<double> l2 = train_losses(2, 0.1f, &p2);
  EXPECT_EQ(l1, l2);
  ASSERT_EQ(p1.size(), p2.size());
  EXPECT_EQ(0, std::memcmp(p1.data(), p2.data(), p1.size() * sizeof(float)));
}

TEST(ModelInvariance, DropoutChangesTheLoss) {
  std::vector<float> p;
  std::vector<double> with = train_losses(2, 0.1f, &p);
  std::vector<double> without = train_losses(2, 0.0f, &p);
  EXPECT_NE(with[0], without[0]);
  EXPECT_NEAR(with[0], without[0], 0.5);  // same data and init: close, not equal
}

TEST(ModelInvariance, InitDependsOnlyOnSeedNameAndIndex) {
  GPTModel a(small_config(2, 0), 1, 16), b(small_config(3, 0), 1, 16);
  a.init_parameters(7);
  b.init_parameters(7);
  for (const char* name : {"embedding.word_embeddings.weight", "decoder.layers.1.self_attention.linear_qkv.weight",
                           "decoder.layers.0.mlp.linear_fc1.weight"}) {
    Tensor ta = a.params().param_tensor(name), tb = b.params().param_tensor(name);
    ASSERT_EQ(ta.shape, tb.shape);
    EXPECT_EQ(0, std::memcmp(ta.data, tb.data, ta.nbytes())) << name;
  }
  // Different names draw different values; init std is Megatron's.
  Tensor q0 = a.params().param_tensor("decoder.layers.0.self_attention.linear_qkv.weight");
  Tensor q1 = a.params().param_tensor("decoder.layers.1.self_attention.linear_qkv.weight");
  EXPECT_NE(0, std::memcmp(q0.data, q1.data, q0.nbytes()));
  auto stddev = [](const Tensor& t) {
    double s = 0;
    for (int64_t i = 0; i < t.numel(); ++i) s += double(t.as<float>()[i]) * t.as<float>()[i];
    return std::sqrt(s / double(t.numel()));
  };
  EXPECT_NEAR(stddev(q0), 0.02, 0.002);
  EXPECT_NEAR(stddev(a.params().param_tensor("decoder.layers.0.mlp.linear_fc2.weight")), 0.02 / 2.0, 0.001);
  EXPECT_EQ(a.params().param_tensor("decoder.layers.0.input_layernorm.weight").as<float>()[5], 1.0f);
  EXPECT_EQ(a.params().param_tensor("decoder.layers.0.mlp.linear_fc1.bias").as<float>()[5], 0.0f);
}

// The normal init is N(0, std^2) drawn by the parameter's stream at the element's global row-major
// index (the init fills runs of a row two elements per draw; every value is still normal(g)).
TEST(ModelInvariance, NormalInitIsTheStreamAtTheGlobalIndex) {
  GPTModel a(small_config(2, 0), 1, 16);
  a.init_parameters(7);
  int checked = 0;
  for (const ParamInfo& p : a.params().infos()) {
    if (p.init != ParamInit::normal) continue;
    const PhiloxStream stream{7, fnv1a32(p.name.c_str())};
    const Tensor t = a.params().param_tensor(p.name);
    for (int64_t g = 0; g < t.numel(); ++g)
      ASSERT_EQ(t.as<float>()[g], float(p.init_std * stream.normal(uint64_t(g)))) << p.name << "[" << g << "]";
    ++checked;
  }
  EXPECT_GE(checked, 5);
  // fill_normal over runs of every start parity and length is normal() element by element.
  const PhiloxStream stream{3, 11};
  for (uint64_t first : {0, 1, 2, 7})
    for (int64_t n = 0; n <= 5; ++n) {
      std::vector<float> out(size_t(n) + 1, -7.0f);
      stream.fill_normal(out.data(), n, first, 0.5);
      for (int64_t k = 0; k < n; ++k)
        ASSERT_EQ(out[size_t(k)], float(0.5 * stream.normal(first + uint64_t(k)))) << first << "+" << k;
      ASSERT_EQ(out[size_t(n)], -7.0f) << "wrote past the run";
    }
}

// --embedding-init-method-std s (Megatron's embedding_init_method): the word and position embeddings are
// N(0, s^2) draws of their streams, with Xavier init too; every other weight as before; a last stage's
// copy of the tied word embeddings draws the first stage's values.
TEST(ModelInvariance, EmbeddingInitStdDrawsTheEmbeddings) {
  for (bool xavier : {false, true}) {
    TransformerConfig c = small_config(2, 0);
    c.init_method_xavier_uniform = xavier;
    c.embedding_init_method_std = 0.5f;
    c.finalize();
    GPTModel a(c, 1, 16), plain(small_config(2, 0), 1, 16);
    a.init_parameters(7);
    plain.init_parameters(7);
    for (const char* name : {"embedding.word_embeddings.weight", "embedding.position_embeddings.weight"}) {
      const PhiloxStream stream{7, fnv1a32(name)};
      const Tensor t = a.params().param_tensor(name);
      for (int64_t g = 0; g < t.numel(); ++g)
        ASSERT_EQ(t.as<float>()[g], float(0.5f * stream.normal(uint64_t(g)))) << name << "[" << g << "]";
    }
    const Tensor q = a.params().param_tensor("decoder.layers.0.self_attention.linear_qkv.weight");
    const Tensor q_plain = plain.params().param_tensor("decoder.layers.0.self_attention.linear_qkv.weight");
    EXPECT_EQ(xavier, 0 != std::memcmp(q.data, q_plain.data, q.nbytes())) << "only Xavier changes the other weights";
    // The last stage of two: the tied output layer's copy of the word embeddings.
    GPTModel last(c, 1, 16, TensorParallel{}, ModelPlacement{{{1, 2}}, false, true, 1});
    last.init_parameters(7);
    const Tensor copy = last.params().param_tensor("embedding.word_embeddings.weight");
    const Tensor first = a.params().param_tensor("embedding.word_embeddings.weight");
    EXPECT_EQ(0, std::memcmp(copy.data, first.data, first.nbytes())) << "xavier " << xavier;
  }
}

// --init-method-xavier-uniform (torch's xavier_uniform_, Megatron's init_method and
// output_layer_init_method): every weight matrix [fan_out, fan_in] uniform in +-sqrt(6 / (fan_in +
// fan_out)), keyed as the normal init (the same values whatever else the model holds); norms and
// biases as before.
TEST(ModelInvariance, XavierUniformInitIsBoundedByTheFans) {
  auto xavier = [](int64_t layers, bool on = true) {
    TransformerConfig c = small_config(layers, 0);
    c.init_method_xavier_uniform = on;
    c.untie_embeddings_and_output_weights = true;
    c.finalize();
    return c;
  };
  GPTModel a(xavier(2), 1, 16), b(xavier(3), 1, 16), normal(xavier(2, false), 1, 16);
  a.init_parameters(7);
  b.init_parameters(7);
  normal.init_parameters(7);
  int matrices = 0;
  for (const ParamInfo& p : a.params().infos()) {
    const Tensor t = a.params().param_tensor(p.name);
    if (p.shape.size() != 2) {
      const float want = p.name.find("layernorm.weight") != std::string::npos ? 1.0f : 0.0f;
      for (int64_t i = 0; i < t.numel(); ++i) ASSERT_EQ(t.as<float>()[i], want) << p.name << "[" << i << "]";
      continue;
    }
    ++matrices;
    const double bound = std::sqrt(6.0 / double(p.global_shape[0] + p.global_shape[1]));
    double mean = 0, square = 0, largest = 0;
    for (int64_t i = 0; i < t.numel(); ++i) {
      const double w = t.as<float>()[i];
      mean += w;
      square += w * w;
      largest = std::max(largest, std::fabs(w));
    }
    mean /= double(t.numel());
    square /= double(t.numel());
    EXPECT_LE(largest, bound) << p.name;
    EXPECT_GT(largest, 0.95 * bound) << p.name;
    // U(-a, a): mean 0, mean square a^2 / 3 (tolerances of 5 standard errors for these sizes).
    const double n = double(t.numel());
    EXPECT_NEAR(mean, 0.0, 5.0 * bound / std::sqrt(3.0 * n)) << p.name;
    EXPECT_NEAR(square, bound * bound / 3.0, 5.0 * bound * bound * std::sqrt(4.0 / 45.0 / n)) << p.name;
    const Tensor tb = b.params().param_tensor(p.name), tn = normal.params().param_tensor(p.name);
    EXPECT_EQ(0, std::memcmp(t.data, tb.data, t.nbytes())) << p.name << ": the other model's values differ";
    EXPECT_NE(0, std::memcmp(t.data, tn.data, t.nbytes())) << p.name << ": the normal init's values";
  }
  EXPECT_EQ(matrices, 1 + 1 + 2 * 4 + 1);  // word and position embeddings, 4 per layer, the output layer
}

TEST(ModelInvariance, PaddedVocabularyNeverChangesTheLoss) {
  TransformerConfig c = small_config(1, 0);
  GPTModel model(c, 2, 16);
  model.init_parameters(3);
  MockSamples data(c.vocab_size, 16, 3);
  std::vector<int32_t> tokens(2 * 17);
  fill_micro_batch(data, 0, 2, tokens.data());
  const double before = model.forward_loss(tokens.data(), nullptr, 2, 16);
  // Huge values in the padded rows of the tied embedding would dominate any softmax
  // that included them.
  Tensor wte = model.params().param_tensor("embedding.word_embeddings.weight");
  for (int64_t v = c.vocab_size; v < c.padded_vocab_size; ++v)
    for (int64_t k = 0; k < c.hidden_size; ++k) wte.as<float>()[v * c.hidden_size + k] = 100.0f;
  EXPECT_EQ(before, model.forward_loss(tokens.data(), nullptr, 2, 16));
}

}  // namespace
}  // namespace lattice
