// KV-cache decoding (GPTInference) against GPTModel's full forward: the logits of every
// position, whether the tokens arrive as one prefill, one at a time or in chunks; thread-count
// invariance; overflow and bad tokens.
#include <gtest/gtest.h>
#include <omp.h>

#include <cmath>
#include <cstring>
#include <functional>
#include <random>
#include <string>

#include "checkpoint/hf_deepseek_mla.h"
#include "checkpoint/hf_gpt2.h"
#include "checkpoint/hf_nemotron_h.h"
#include "core/error.h"
#include "model/bf16_decode_policy.h"
#include "model/gpt_inference.h"
#include "model/linear.h"
#include "../gdn_test_config.h"
#include "../mamba_test_config.h"
#include "../mla_test_config.h"

namespace lattice {
namespace {

std::unique_ptr<GPTModel> random_model(bool untie, GeluKind gelu, bool rope = false,
                                       const std::function<void(TransformerConfig&)>& more = nullptr) {
  TransformerConfig c;
  if (rope) {  // and heads of 20 dims: 4 x 20 against a hidden size of 48
    c.position_embedding_type = "rope";
    c.rotary_percent = 0.5;
    c.kv_channels = 20;
  }
  c.num_layers = 3;
  c.hidden_size = 48;
  c.num_attention_heads = 4;
  c.vocab_size = 90;
  c.max_position_embeddings = 40;
  c.gelu = gelu;
  c.untie_embeddings_and_output_weights = untie;
  c.hidden_dropout = c.attention_dropout = 0;
  if (more) more(c);
  c.finalize();
  auto m = std::make_unique<GPTModel>(c, 1, c.max_position_embeddings);
  // Larger than the training init so attention is far from uniform and the check has teeth.
  std::mt19937 gen(untie ? 11 : 12);
  std::normal_distribution<float> nd(0.0f, 0.2f);
  for (int64_t i = 0; i < m->params().numel(); ++i) m->params().params()[i] = nd(gen);
  return m;
}

std::vector<int32_t> some_tokens(int64_t T, int64_t V) {
  std::vector<int32_t> t(static_cast<size_t>(T));
  for (int64_t i = 0; i < T; ++i) t[i] = int32_t((i * 53 + 17) % V);
  return t;
}

// Max |got - want| over the first V columns of each row, relative to max |want|.
double rel_err(const float* got, const float* want, int64_t rows, int64_t V, int64_t Vp) {
  double err = 0, scale = 0;
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t v = 0; v < V; ++v) {
      scale = std::max(scale, std::fabs(double(want[r * Vp + v])));
      err = std::max(err, std::fabs(double(got[r * Vp + v]) - want[r * Vp + v]));
    }
  return err / scale;
}

// Appends tokens in chunks of the given sizes (cycled); returns [T, Vp] logits of every position.
std::vector<float> cached_logits(GPTInference& inf, const std::vector<int32_t>& tokens, int64_t Vp,
                                 const std::vector<int64_t>& chunks) {
  std::vector<float> out(tokens.size() * size_t(Vp));
  int64_t at = 0;
  for (size_t k = 0; at < int64_t(tokens.size()); ++k) {
    const int64_t n = std::min<int64_t>(chunks[k % chunks.size()], int64_t(tokens.size()) - at);
    inf.append(tokens.data() + at, n, out.data() + at * Vp, /*all_positions=*/true);
    at += n;
  }
  return out;
}

void check_against_full_forward(GPTModel& model, int64_t T) {
  const TransformerConfig& c = model.config();
  const int64_t Vp = c.padded_vocab_size;
  const std::vector<int32_t> tokens = some_tokens(T, c.vocab_size);
  std::vector<float> full(size_t(T * Vp));
  model.forward_logits(tokens.data(), 1, T, full.data());
  for (const std::vector<int64_t>& chunks :
       std::vector<std::vector<int64_t>>{{T}, {1}, {7, 1, 1, 3}}) {
    GPTInference inf(model);
    std::vector<float> got = cached_logits(inf, tokens, Vp, chunks);
    EXPECT_EQ(inf.length(), T);
    // Same math, different summation order (online-softmax tiles vs two passes, GEMM vs GEMV).
    EXPECT_LE(rel_err(got.data(), full.data(), T, c.vocab_size, Vp), 1e-5)
        << "chunks starting " << chunks[0];
  }
  // Only-last logits equal the last row of all-positions logits.
  GPTInference inf(model);
  std::vector<float> last(static_cast<size_t>(Vp));
  inf.append(tokens.data(), T - 1, last.data());
  inf.append(tokens.data() + T - 1, 1, last.data());
  EXPECT_LE(rel_err(last.data(), full.data() + (T - 1) * Vp, 1, c.vocab_size, Vp), 1e-5);
}

TEST(HfInference, KvCacheLogitsEqualFullForward) {
  for (bool untie : {false, true}) {
    auto model = random_model(untie, untie ? GeluKind::erf : GeluKind::tanh);
    check_against_full_forward(*model, model->config().max_position_embeddings);  // the whole context
  }
}

// With the rotary embedding the cache holds keys rotated at their positions; each appended
// chunk's q and k are rotated at positions length()..length()+n-1.
TEST(HfInference, KvCacheLogitsEqualFullForwardWithRotaryEmbedding) {
  auto model = random_model(false, GeluKind::erf, true);
  ASSERT_NE(model->rope_table(1), nullptr);
  check_against_full_forward(*model, model->config().max_position_embeddings);
}

// --qk-layernorm: each appended chunk's queries and keys normalized before their rotation (the
// cache holds the normalized, rotated keys); LayerNorm with grouped-query attention, and RMSNorm.
TEST(HfInference, KvCacheLogitsEqualFullForwardWithQkLayernorm) {
  for (const char* norm : {"LayerNorm", "RMSNorm"}) {
    auto model = random_model(false, GeluKind::erf, true, [&](TransformerConfig& c) {
      c.qk_layernorm = true;
      c.normalization = norm;
      c.num_query_groups = 2;
    });
    check_against_full_forward(*model, model->config().max_position_embeddings);
  }
}

// --multi-latent-attention: each appended chunk's fused queries, keys and values made from its latents
// (the cache holds the fused, rotated keys and the zero-padded values); a query latent with RMSNorm latent
// norms and --apply-layernorm-1p, and linear_q_proj with YaRN, LayerNorm latent norms and wider values.
TEST(HfInference, KvCacheLogitsEqualFullForwardWithMultiLatentAttention) {
  for (int variant : {0, 1}) {
    auto model = random_model(false, GeluKind::erf, true, [&](TransformerConfig& c) {
      c.rotary_percent = 1.0;
      set_mla(c, MlaShapes{variant == 0 ? 14 : 0, 10, 6, 4, variant == 0 ? 8 : 12});
      c.normalization = variant == 0 ? "RMSNorm" : "LayerNorm";
      c.apply_layernorm_1p = variant == 0;
      if (variant == 1) {
        c.position_embedding_type = "yarn";
        c.yarn_rotary_scaling_factor = 4.0f;
        c.yarn_original_max_position_embeddings = 10;
        c.yarn_mscale_all_dim = 1.0f;
      }
    });
    check_against_full_forward(*model, model->config().max_position_embeddings);
  }
}

// Mixture of experts with pre-softmax gates, gated shared experts and the middle layer dense
// (--moe-layer-freq [1,0,1]): each appended chunk routed as the full forward routes it.
TEST(HfInference, KvCacheLogitsEqualFullForwardWithSharedExperts) {
  auto model = random_model(false, GeluKind::erf, true, [&](TransformerConfig& c) {
    c.add_bias_linear = false;
    c.swiglu = true;
    c.num_experts = 4;
    c.moe_router_topk = 2;
    c.moe_ffn_hidden_size = 24;
    c.moe_router_pre_softmax = true;
    c.moe_shared_expert_intermediate_size = 32;
    c.moe_shared_expert_gate = true;
    c.moe_layer_pattern = {1, 0, 1};
  });
  check_against_full_forward(*model, model->config().max_position_embeddings);
}

// --experimental-attention-variant gated_delta_net: each GDN layer carries its convolution's last K - 1
// in_proj rows and its delta-rule state from chunk to chunk (chunks shorter and longer than K); layers
// [1,0,1] (the middle one attention, with the output gate and q/k norms), RMSNorm with --apply-layernorm-1p, and
// LayerNorm (out_norm's bias) with every layer GDN.
TEST(HfInference, KvCacheLogitsEqualFullForwardWithGatedDeltaNet) {
  for (int variant : {0, 1}) {
    auto model = random_model(false, GeluKind::erf, true, [&](TransformerConfig& c) {
      c.add_bias_linear = false;
      c.swiglu = true;
      set_gdn(c, variant == 0 ? std::vector<int>{1, 0, 1} : std::vector<int>{1, 1, 1},
              GdnShapes{2, variant == 0 ? 4 : 2, 6, 5, variant == 0 ? 4 : 3});
      c.normalization = variant == 0 ? "RMSNorm" : "LayerNorm";
      c.apply_layernorm_1p = variant == 0;
      c.attention_output_gate = variant == 0;
      c.qk_layernorm = variant == 0;  // (the attention layer's only: Qwen3.5's form)
    });
    check_against_full_forward(*model, model->config().max_position_embeddings);
  }
}

// Hybrid models (--hybrid-override-pattern): each Mamba layer carries its convolution's last K - 1 in_proj rows
// and its scan's state from chunk to chunk, the attention layers alone keep a KV cache (in their own slots),
// the MLP-only and MoE-only layers none. Nemotron-H's form (M-M*-: RMSNorm, no biases, squared ReLU, rotary
// embedding); attention first with LayerNorm and biases, two attention layers and MoE layers (*M*E-E); every
// layer Mamba (MMM), 2 groups of one head of 8 and a state of 16. After reset() the histories and states start
// from zeros again: the same logits bit for bit.
TEST(HfInference, KvCacheLogitsEqualFullForwardWithHybridMamba) {
  for (int variant : {0, 1, 2}) {
    auto model = random_model(false, GeluKind::erf, variant == 0, [&](TransformerConfig& c) {
      set_hybrid(c, std::vector<std::string>{"M-M*-", "*M*E-E", "MMM"}[size_t(variant)],
                 variant == 2 ? MambaShapes{2, 8, 2, 16} : MambaShapes{});
      c.normalization = variant == 1 ? "LayerNorm" : "RMSNorm";
      c.add_bias_linear = variant == 1;
      if (variant == 0) c.gelu = GeluKind::squared_relu;
      if (variant == 1) {
        c.num_experts = 4;
        c.moe_router_topk = 2;
        c.moe_ffn_hidden_size = 24;
      }
    });
    check_against_full_forward(*model, model->config().max_position_embeddings);
    const std::vector<int32_t> tokens = some_tokens(12, model->config().vocab_size);
    GPTInference inf(*model);
    const std::vector<float> first = cached_logits(inf, tokens, model->config().padded_vocab_size, {5, 1});
    inf.reset();
    EXPECT_EQ(cached_logits(inf, tokens, model->config().padded_vocab_size, {5, 1}), first);
  }
  // Nemotron-3-Super's LatentMoE (E*ME, --moe-latent-size 40): the MoE layers' latent projections while decoding.
  HfModel hf = load_hf_nemotron_h(std::string(LATTICE_SOURCE_DIR) + "/tests/fixtures/hf_nemotron_h_latent_moe_tiny");
  ASSERT_EQ(hf.model->config().moe_latent_size, 40);
  check_against_full_forward(*hf.model, 16);
}

// GLM-4.7-Flash's form: the latents normalized with their own epsilon (1e-6 beside the model's 1e-5; the
// fixture's latents are small enough that the other one moves its logits by 0.028).
TEST(HfInference, KvCacheLogitsEqualFullForwardWithTheLatentsEpsilon) {
  HfModel hf = load_hf_deepseek_mla(std::string(LATTICE_SOURCE_DIR) + "/tests/fixtures/hf_glm4_moe_lite_tiny");
  ASSERT_NE(hf.model->config().mla_latent_eps(), hf.model->config().layernorm_epsilon);
  check_against_full_forward(*hf.model, 16);
}

TEST(HfInference, KvCacheOnHfFixtureModel) {
  HfGpt2Model hf = load_hf_gpt2(std::string(LATTICE_SOURCE_DIR) + "/tests/fixtures/hf_gpt2_tiny");
  check_against_full_forward(*hf.model, 16);
}

// Several sequences decoded together (GPTInference::step): three prompts of other lengths prefilled
// into their own slots, then steps over all of them and over a subset in another order, then one
// slot reset and refilled with a new prompt while the others go on (a finished prompt's slot taken
// by the next). Every sequence's logits equal its decoding alone, token by token (to the GEMMs'
// summation order: 1e-5), for every kind of layer that keeps per-sequence state: attention's cache
// (rope, grouped queries, q/k norms, sliding window), multi-latent attention's, Gated DeltaNet's and
// Mamba's convolution histories and states, and mixtures of experts (dropless, and with a capacity,
// which counts each sequence's tokens alone).
TEST(HfInference, BatchedStepsEqualEachSequenceAlone) {
  std::vector<std::pair<const char*, std::unique_ptr<GPTModel>>> models;
  models.emplace_back("gpt", random_model(true, GeluKind::tanh));
  models.emplace_back("rope gqa qk-norm window", random_model(false, GeluKind::erf, true, [](TransformerConfig& c) {
                        c.qk_layernorm = true;
                        c.normalization = "RMSNorm";
                        c.num_query_groups = 2;
                        c.window_size = 5;
                      }));
  models.emplace_back("mla", random_model(false, GeluKind::erf, true, [](TransformerConfig& c) {
                        c.rotary_percent = 1.0;
                        set_mla(c, MlaShapes{14, 10, 6, 4, 8});
                      }));
  models.emplace_back("gdn", random_model(false, GeluKind::erf, true, [](TransformerConfig& c) {
                        c.add_bias_linear = false;
                        c.swiglu = true;
                        set_gdn(c, {1, 0, 1}, GdnShapes{2, 4, 6, 5, 4});
                      }));
  models.emplace_back("hybrid mamba moe", random_model(false, GeluKind::erf, false, [](TransformerConfig& c) {
                        set_hybrid(c, "*M*E-E", MambaShapes{});
                        c.num_experts = 4;
                        c.moe_router_topk = 2;
                        c.moe_ffn_hidden_size = 24;
                      }));
  models.emplace_back("moe capacity", random_model(false, GeluKind::erf, true, [](TransformerConfig& c) {
                        c.add_bias_linear = false;
                        c.num_experts = 4;
                        c.moe_router_topk = 2;
                        c.moe_ffn_hidden_size = 24;
                        c.moe_expert_capacity_factor = 1.0;
                      }));
  for (auto& [name, model] : models) {
    SCOPED_TRACE(name);
    const TransformerConfig& c = model->config();
    const int64_t Vp = c.padded_vocab_size, V = c.vocab_size;
    const std::vector<int32_t> all = some_tokens(30, V);
    const std::vector<std::vector<int32_t>> prompts = {{all.begin(), all.begin() + 5}, {all.begin() + 3, all.begin() + 12},
                                                       {all.begin() + 20, all.begin() + 22}};
    GPTInference batch(*model, 0, false, 3);
    std::vector<std::unique_ptr<GPTInference>> alone;
    std::vector<float> got(static_cast<size_t>(3 * Vp)), want(static_cast<size_t>(Vp));
    auto expect_alone = [&](int64_t seq, const float* logits, int32_t token, const char* when) {
      alone[size_t(seq)]->append(&token, 1, want.data());
      EXPECT_LE(rel_err(logits, want.data(), 1, V, Vp), 1e-5) << "sequence " << seq << " " << when;
    };
    for (int64_t s = 0; s < 3; ++s) {
      alone.push_back(std::make_unique<GPTInference>(*model));
      const auto& p = prompts[size_t(s)];
      batch.append(p.data(), int64_t(p.size()) - 1, got.data(), false, s);
      alone.back()->append(p.data(), int64_t(p.size()) - 1, want.data());
      EXPECT_EQ(rel_err(got.data(), want.data(), 1, V, Vp), 0.0) << "the prefill of sequence " << s;
    }
    // Every sequence's next token together, three times (the first: each prompt's last token).
    for (int k = 0; k < 3; ++k) {
      const int64_t seqs[3] = {0, 1, 2};
      int32_t tokens[3];
      for (int64_t s = 0; s < 3; ++s) tokens[s] = k == 0 ? prompts[size_t(s)].back() : int32_t((7 * k + 5 * s) % V);
      batch.step(tokens, seqs, 3, got.data());
      for (int64_t s = 0; s < 3; ++s) expect_alone(s, got.data() + s * Vp, tokens[s], "in a step of all");
    }
    {  // a subset, out of order
      const int64_t seqs[2] = {2, 0};
      const int32_t tokens[2] = {11, 13};
      batch.step(tokens, seqs, 2, got.data());
      expect_alone(2, got.data(), 11, "in a step of two");
      expect_alone(0, got.data() + Vp, 13, "in a step of two");
    }
    // Sequence 1's slot refilled from scratch while 0 and 2 go on.
    batch.reset(1);
    alone[1] = std::make_unique<GPTInference>(*model);
    batch.append(all.data() + 14, 6, got.data(), false, 1);
    alone[1]->append(all.data() + 14, 6, want.data());
    EXPECT_EQ(rel_err(got.data(), want.data(), 1, V, Vp), 0.0) << "the refilled slot's prefill";
    {  // Three prompts prefilled in one forward (one with every position's logits) into a fresh cache:
       // each as alone, to the GEMMs' summation order.
      GPTInference together(*model, 0, false, 3);
      const std::vector<GPTInference::Part> parts = {
          {2, all.data() + 1, 4, false}, {0, all.data() + 8, 7, true}, {1, all.data() + 20, 3, false}};
      std::vector<float> logits(static_cast<size_t>((1 + 7 + 1) * Vp)), one(static_cast<size_t>(7 * Vp));
      together.append(parts, logits.data());
      const float* row = logits.data();
      for (const GPTInference::Part& part : parts) {
        GPTInference solo(*model);
        solo.append(part.tokens, part.n, one.data(), part.all_positions);
        const int64_t rows = part.all_positions ? part.n : 1;
        EXPECT_LE(rel_err(row, one.data(), rows, V, Vp), 1e-5) << "sequence " << part.seq << " prefilled with others";
        EXPECT_EQ(together.length(part.seq), part.n);
        row += rows * Vp;
      }
      // Their next tokens stepped together continue each as alone.
      const int64_t order[3] = {0, 1, 2};
      const int32_t next[3] = {9, 8, 7};
      together.step(next, order, 3, logits.data());
      for (const GPTInference::Part& part : parts) {
        GPTInference solo(*model);
        solo.append(part.tokens, part.n, one.data());
        solo.append(&next[part.seq], 1, one.data());
        EXPECT_LE(rel_err(logits.data() + part.seq * Vp, one.data(), 1, V, Vp), 1e-5) << "sequence " << part.seq;
      }
      EXPECT_THROW(together.append({{0, all.data(), 2, false}, {0, all.data(), 2, false}}, logits.data()), Error);
    }
    const int64_t seqs[3] = {1, 0, 2};
    const int32_t tokens[3] = {3, 4, 5};
    batch.step(tokens, seqs, 3, got.data());
    for (int64_t i = 0; i < 3; ++i) expect_alone(seqs[i], got.data() + i * Vp, tokens[i], "after the refill");
    EXPECT_EQ(batch.length(0), 4 + 4 + 1);
    EXPECT_EQ(batch.length(1), 7);
    // A sequence named twice, or one the cache does not hold, is an error.
    const int64_t twice[2] = {0, 0}, outside[1] = {3};
    EXPECT_THROW(batch.step(tokens, twice, 2, got.data()), Error);
    EXPECT_THROW(batch.step(tokens, outside, 1, got.data()), Error);
  }
}

TEST(HfInference, ResetStartsOver) {
  auto model = random_model(false, GeluKind::tanh);
  const int64_t Vp = model->config().padded_vocab_size;
  const std::vector<int32_t> a = some_tokens(9, model->config().vocab_size);
  GPTInference inf(*model);
  std::vector<float> first(static_cast<size_t>(Vp)), again(static_cast<size_t>(Vp));
  inf.append(a.data(), 9, first.data());
  inf.append(a.data(), 5, again.data());  // different context now
  inf.reset();
  inf.append(a.data(), 9, again.data());
  for (int64_t v = 0; v < Vp; ++v) ASSERT_EQ(first[v], again[v]);
}

TEST(HfInference, ThreadCountInvariant) {
  auto model = random_model(true, GeluKind::erf);
  const int64_t T = 24, Vp = model->config().padded_vocab_size;
  const std::vector<int32_t> tokens = some_tokens(T, model->config().vocab_size);
  const int saved = omp_get_max_threads();
  std::vector<std::vector<float>> runs;
  for (int threads : {1, 2, 3}) {
    omp_set_num_threads(threads);
    GPTInference inf(*model);
    runs.push_back(cached_logits(inf, tokens, Vp, {5, 1}));
  }
  omp_set_num_threads(saved);
  // Attention is per (query, head) in one thread; GEMMs use thread-count-invariant blocking.
  EXPECT_TRUE(runs[0] == runs[1]);
  EXPECT_TRUE(runs[0] == runs[2]);
}

TEST(HfInference, OverflowAndBadTokensAreErrors) {
  auto model = random_model(false, GeluKind::tanh);
  const TransformerConfig& c = model->config();
  std::vector<float> logits(size_t(c.padded_vocab_size));
  GPTInference inf(*model);
  const std::vector<int32_t> tokens = some_tokens(c.max_position_embeddings, c.vocab_size);
  inf.append(tokens.data(), c.max_position_embeddings, logits.data());
  int32_t one = 1;
  try {
    inf.append(&one, 1, logits.data());
    ADD_FAILURE() << "appending past max_position_embeddings did not fail";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("KV cache full"), std::string::npos) << e.what();
  }
  inf.reset();
  int32_t bad = int32_t(c.vocab_size);  // a padded id: not a real token
  try {
    inf.append(&bad, 1, logits.data());
    ADD_FAILURE() << "token id == vocab_size accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("outside the model's vocabulary"), std::string::npos) << e.what();
  }
  EXPECT_EQ(inf.length(), 0) << "a rejected append must leave the cache as it was";
}

// --bf16 decoding (model/bf16_decode_policy.h): every linear layer's weight and input in bf16, summed in
// fp32. The policy is that product; a prefill and one token at a time give the same logits (the same
// products in other summation orders); they stay within bf16's rounding of the fp32 decoding without being
// it; a mixture of experts' experts and router too.
TEST(Bf16Decoding, PolicyIsTheBf16ProductOfEachWeightKeptOnce) {
  const int64_t N = 3, in = 40, out = 24;
  std::mt19937 gen(5);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  std::vector<float> x(static_cast<size_t>(N * in)), W(static_cast<size_t>(out * in)), b(static_cast<size_t>(out));
  std::vector<float> y(static_cast<size_t>(N * out));
  for (auto* v : {&x, &W, &b})
    for (float& e : *v) e = nd(gen);
  Bf16DecodePolicy policy;
  linear_forward(y.data(), x.data(), W.data(), b.data(), N, in, out, GemmSite{&policy, 0});
  auto bf16 = [](std::vector<float> v) {  // rounded to the nearest bf16 (even on ties)
    for (float& e : v) {
      uint32_t u;
      std::memcpy(&u, &e, 4);
      u = (u + 0x7FFF + ((u >> 16) & 1)) & 0xFFFF0000u;
      std::memcpy(&e, &u, 4);
    }
    return v;
  };
  const std::vector<float> xb = bf16(x), Wb = bf16(W);
  for (int64_t n = 0; n < N; ++n)
    for (int64_t o = 0; o < out; ++o) {
      double s = b[size_t(o)];
      for (int64_t i = 0; i < in; ++i) s += double(xb[size_t(n * in + i)]) * Wb[size_t(o * in + i)];
      EXPECT_NEAR(y[size_t(n * out + o)], s, 1e-5 * std::max(1.0, std::fabs(s))) << n << "," << o;
    }
  linear_forward(y.data(), x.data(), W.data(), nullptr, N, in, out, GemmSite{&policy, 0});
  EXPECT_EQ(policy.weights(), 1u);  // made once, at its first use
  EXPECT_EQ(policy.weight_bytes(), size_t(out * in * 2));
  EXPECT_THROW(policy.weight_grad(0, y.data(), y.data(), x.data(), N, in, out), Error);
}

TEST(Bf16Decoding, ChunksAgreeAndStayWithinBf16OfFp32) {
  for (bool moe : {false, true}) {
    auto model = random_model(true, GeluKind::erf, true, [&](TransformerConfig& c) {
      if (!moe) return;
      c.num_experts = 4;
      c.moe_router_topk = 2;
    });
    const TransformerConfig& c = model->config();
    const int64_t T = 12, Vp = c.padded_vocab_size;
    const std::vector<int32_t> tokens = some_tokens(T, c.vocab_size);
    GPTInference fp32(*model), prefill(*model, 0, true), stepwise(*model, 0, true);
    const std::vector<float> want = cached_logits(fp32, tokens, Vp, {T});
    const std::vector<float> got = cached_logits(prefill, tokens, Vp, {T});
    const std::vector<float> one = cached_logits(stepwise, tokens, Vp, {1, 4});
    EXPECT_LE(rel_err(one.data(), got.data(), T, c.vocab_size, Vp), 1e-5) << (moe ? "moe" : "dense");
    const double e = rel_err(got.data(), want.data(), T, c.vocab_size, Vp);
    EXPECT_LE(e, 2e-2) << (moe ? "moe" : "dense");  // (about 0.5% measured)
    EXPECT_GT(e, 1e-4) << (moe ? "moe" : "dense") << ": the weights were not rounded";
  }
}

}  // namespace
}  // namespace lattice
