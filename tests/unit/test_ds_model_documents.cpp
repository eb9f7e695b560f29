// GPTModel with document boundaries (--eod-mask-loss, --reset-position-ids,
// --reset-attention-mask): a packed sequence "A eod B" behaves as A-with-eod and B run
// separately (logits, loss and every gradient), with attention layers and with Gated
// DeltaNet layers (whose state and convolution restart at B), and the eod loss mask
// equals the same mask passed explicitly.
#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "model/gpt_model.h"

#include "../gdn_test_config.h"

namespace lattice {
namespace {

constexpr int32_t kEod = 49;

TransformerConfig config(bool gated_delta_net = false) {
  TransformerConfig c;
  c.num_layers = 2;
  c.hidden_size = 32;
  c.num_attention_heads = 4;
  c.vocab_size = 50;
  c.max_position_embeddings = 24;
  c.hidden_dropout = c.attention_dropout = 0.0f;
  if (gated_delta_net) {  // a GDN layer, then an attention layer
    c.swiglu = true;
    set_gdn(c, {1, 0}, GdnShapes{2, 4, 8, 6});
  }
  c.finalize();
  return c;
}

// x[0..T]: document A (k-1 tokens then eod at input position k-1), then document B.
std::vector<int32_t> packed(int64_t T, int64_t k) {
  std::vector<int32_t> x(size_t(T + 1));
  for (int64_t t = 0; t <= T; ++t) x[size_t(t)] = int32_t((t * 7 + 3) % 40);
  x[size_t(k - 1)] = kEod;
  return x;
}

double max_rel(const float* a, const float* b, size_t n) {
  double m = 0;
  for (size_t i = 0; i < n; ++i) m = std::max(m, std::fabs(double(a[i]) - b[i]) / (1e-3 + std::fabs(double(b[i]))));
  return m;
}

void expect_packed_documents_match_separate_runs(const TransformerConfig& c) {
  const int64_t T = 20, k = 8, Vp = c.padded_vocab_size;
  GPTModel model(c, 1, T);
  model.init_parameters(7);
  model.set_document_boundaries(DocumentBoundaries{kEod, false, true, true});
  const auto x = packed(T, k);
  std::vector<int32_t> a(x.begin(), x.begin() + k + 1), b(x.begin() + k, x.end());

  // Logits: the B part of the packed run equals B alone (positions from 0, no attention to A).
  std::vector<float> full(size_t(T * Vp)), alone(size_t((T - k) * Vp));
  model.forward_logits(x.data(), 1, T, full.data());
  model.forward_logits(b.data(), 1, T - k, alone.data());
  EXPECT_LT(max_rel(full.data() + k * Vp, alone.data(), alone.size()), 1e-4);

  // Gradients: packed (mean over T tokens) = A's (weight k/T) + B's (weight (T-k)/T).
  const size_t n = size_t(model.params().numel());
  model.params().zero_grad();
  const double loss = model.forward_backward(x.data(), nullptr, 1, T, 1.0f, MicroBatchKey{});
  const std::vector<float> g_full(model.params().grads(), model.params().grads() + n);
  model.params().zero_grad();
  const double la = model.forward_backward(a.data(), nullptr, 1, k, float(k) / float(T), MicroBatchKey{});
  const double lb = model.forward_backward(b.data(), nullptr, 1, T - k, float(T - k) / float(T), MicroBatchKey{});
  EXPECT_NEAR(loss, (la * double(k) + lb * double(T - k)) / double(T), 1e-5);
  double worst = 0, scale = 0;
  for (size_t i = 0; i < n; ++i) {
    worst = std::max(worst, std::fabs(double(g_full[i]) - model.params().grads()[i]));
    scale = std::max(scale, std::fabs(double(g_full[i])));
  }
  EXPECT_LT(worst, 1e-4 * scale) << "max |grad diff| " << worst << ", max |grad| " << scale;

  // Without the options the packed run is different (the test can fail).
  model.set_document_boundaries(DocumentBoundaries{});
  std::vector<float> plain(size_t(T * Vp));
  model.forward_logits(x.data(), 1, T, plain.data());
  EXPECT_GT(max_rel(plain.data() + k * Vp, alone.data(), alone.size()), 1e-2);
}

TEST(DsModelDocuments, PackedDocumentsMatchSeparateRuns) { expect_packed_documents_match_separate_runs(config()); }

TEST(DsModelDocuments, PackedDocumentsMatchSeparateRunsThroughGatedDeltaNet) {
  expect_packed_documents_match_separate_runs(config(true));
}

TEST(DsModelDocuments, EodMaskLossEqualsExplicitMask) {
  const TransformerConfig c = config();
  const int64_t B = 2, T = 16;
  GPTModel model(c, B, T);
  model.init_parameters(3);
  std::vector<int32_t> tokens(size_t(B * (T + 1)));
  for (size_t i = 0; i < tokens.size(); ++i) tokens[i] = int32_t((i * 13 + 5) % 50);
  tokens[3] = tokens[10] = tokens[17 + 16] = kEod;  // the last one is a label only
  std::vector<float> mask(size_t(B * T), 1.0f);
  int masked = 0;
  for (int64_t b = 0; b < B; ++b)
    for (int64_t t = 0; t < T; ++t)
      if (tokens[size_t(b * (T + 1) + t)] == kEod) mask[size_t(b * T + t)] = 0.0f, ++masked;
  ASSERT_GT(masked, 0);

  const size_t n = size_t(model.params().numel());
  model.params().zero_grad();
  const double explicit_loss = model.forward_backward(tokens.data(), mask.data(), B, T, 1.0f, MicroBatchKey{});
  const std::vector<float> g_explicit(model.params().grads(), model.params().grads() + n);
  const LossSum ls_explicit = model.forward_loss_sum(tokens.data(), mask.data(), B, T);

  model.set_document_boundaries(DocumentBoundaries{kEod, true, false, false});
  model.params().zero_grad();
  const double eod_loss = model.forward_backward(tokens.data(), nullptr, B, T, 1.0f, MicroBatchKey{});
  const std::vector<float> g_eod(model.params().grads(), model.params().grads() + n);
  const LossSum ls_eod = model.forward_loss_sum(tokens.data(), nullptr, B, T);

  EXPECT_EQ(eod_loss, explicit_loss);
  EXPECT_EQ(g_eod, g_explicit);
  EXPECT_EQ(ls_eod.count, double(B * T - masked));
  EXPECT_EQ(ls_eod.sum, ls_explicit.sum);
  EXPECT_NEAR(ls_eod.sum / ls_eod.count, eod_loss, 1e-6);
  model.set_document_boundaries(DocumentBoundaries{});
  EXPECT_EQ(model.forward_loss_sum(tokens.data(), nullptr, B, T).count, double(B * T));
}

// Segments (SFT's packed conversations) decide the documents instead of eod: segments changing after
// each eod give the eod run's loss and gradients bit for bit; one segment over a sequence holding an eod
// is one document (as without the options); a boundary elsewhere moves the documents.
TEST(DsModelDocuments, SegmentsDecideTheDocuments) {
  const TransformerConfig c = config();
  const int64_t B = 2, T = 16;
  GPTModel model(c, B, T);
  model.init_parameters(5);
  std::vector<int32_t> tokens(size_t(B * (T + 1)));
  for (size_t i = 0; i < tokens.size(); ++i) tokens[i] = int32_t((i * 11 + 2) % 45);
  tokens[4] = tokens[17 + 9] = kEod;  // an eod in each row
  std::vector<int32_t> after_eod(size_t(B * T)), one(size_t(B * T), 0), elsewhere(size_t(B * T));
  for (int64_t b = 0; b < B; ++b) {
    int32_t s = 0;
    for (int64_t t = 0; t < T; ++t) {
      after_eod[size_t(b * T + t)] = s;
      if (tokens[size_t(b * (T + 1) + t)] == kEod) ++s;
      elsewhere[size_t(b * T + t)] = t >= 12 ? 3 : 1;
    }
  }
  const size_t n = size_t(model.params().numel());
  auto run = [&](const int32_t* segments, std::vector<float>* grads) {
    model.params().zero_grad();
    MicroBatchKey key;
    const double loss = model.forward_step(0, 0, tokens.data(), nullptr, B, T, 1.0f, key, segments).sum;
    model.backward_step(0, 0, B, T, key);
    grads->assign(model.params().grads(), model.params().grads() + n);
    return loss;
  };
  model.set_document_boundaries(DocumentBoundaries{kEod, false, true, true});
  std::vector<float> g_eod, g_seg, g_one, g_plain, g_elsewhere;
  const double l_eod = run(nullptr, &g_eod), l_seg = run(after_eod.data(), &g_seg);
  EXPECT_EQ(l_seg, l_eod);
  EXPECT_EQ(g_seg, g_eod);
  const double l_one = run(one.data(), &g_one), l_elsewhere = run(elsewhere.data(), &g_elsewhere);
  model.set_document_boundaries(DocumentBoundaries{});
  const double l_plain = run(nullptr, &g_plain);
  EXPECT_EQ(l_one, l_plain);
  EXPECT_EQ(g_one, g_plain);
  EXPECT_NE(l_one, l_eod);
  EXPECT_NE(l_elsewhere, l_eod);
  EXPECT_NE(l_elsewhere, l_one);
  // Evaluation takes them too.
  model.set_document_boundaries(DocumentBoundaries{kEod, false, true, true});
  EXPECT_EQ(model.forward_loss_sum(tokens.data(), nullptr, B, T, after_eod.data()).sum,
            model.forward_loss_sum(tokens.data(), nullptr, B, T).sum);
}

TEST(DsModelDocuments, OptionsNeedAnEodToken) {
  GPTModel model(config(), 1, 4);
  EXPECT_THROW(model.set_document_boundaries(DocumentBoundaries{-1, true, false, false}), Error);
}

}  // namespace
}  // namespace lattice
