// The rotary position embedding (kernels/rope.h, model/rotary_embedding.h): the table
// against Megatron's definition, the forward against a double-precision rotation written
// here, the backward against finite differences, and what the rotation must leave alone.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <string>
#include <vector>

#include "core/error.h"
#include "kernels/rope.h"
#include "kernels_test_util.h"
#include "model/rotary_embedding.h"

namespace lattice {
namespace {

using kernel_test::expect_close;
using kernel_test::numeric_grad;
using kernel_test::project;
using kernel_test::random_floats;

struct Case {
  int64_t B, T, H, D;
  double percent;
  bool interleaved;
  float factor;  // interpolation factor (0: none)
  int64_t pos0;  // forward only
  int64_t G = 0;  // query groups (kernels/qkv_layout.h); 0: H
  QkvLayout layout() const { return {H, G > 0 ? G : H, D}; }
  size_t size() const { return size_t(B * T * layout().width()); }
};

TransformerConfig config_for(const Case& c, int64_t positions) {
  TransformerConfig cfg;
  cfg.num_layers = 1;
  cfg.num_attention_heads = c.H;
  cfg.hidden_size = c.H * c.D;
  cfg.vocab_size = 64;
  cfg.max_position_embeddings = positions;
  cfg.position_embedding_type = "rope";
  cfg.rotary_percent = c.percent;
  cfg.rotary_interleaved = c.interleaved;
  cfg.rotary_seq_len_interpolation_factor = c.factor;
  cfg.finalize();
  return cfg;
}

// The rotation of qkv [B*T, G, H/G + 2, D] in double, angles from Megatron's formula evaluated
// in double: angle(t, d) = (t / factor) / base^(2d / R). Every head's query and every group's key
// (the group's slot after its queries) are rotated.
std::vector<double> reference_forward(const Case& c, std::vector<double> x, int64_t pos0) {
  const int64_t R = int64_t(double(c.D) * c.percent), half = R / 2;
  const double factor = c.factor > 0 ? c.factor : 1.0;
  const QkvLayout L = c.layout();
  const int64_t per_group = L.H / L.G;
  for (int64_t n = 0; n < c.B * c.T; ++n)
    for (int64_t g = 0; g < L.G; ++g)
      for (int64_t slot = 0; slot <= per_group; ++slot) {  // the group's queries, then its key
        double* v = x.data() + (n * L.slots() + g * (per_group + 2) + slot) * c.D;
        for (int64_t d = 0; d < half; ++d) {
          const double a = double(pos0 + n % c.T) / factor / std::pow(10000.0, double(2 * d) / double(R));
          const int64_t i = c.interleaved ? 2 * d : d, j = c.interleaved ? 2 * d + 1 : d + half;
          const double p = v[i], q = v[j];
          v[i] = p * std::cos(a) - q * std::sin(a);
          v[j] = q * std::cos(a) + p * std::sin(a);
        }
      }
  return x;
}

std::string name_of(const Case& c) {
  return "B" + std::to_string(c.B) + " T" + std::to_string(c.T) + " H" + std::to_string(c.H) + " G" +
         std::to_string(c.layout().G) + " D" +
         std::to_string(c.D) + " percent " + std::to_string(c.percent) + (c.interleaved ? " interleaved" : "") +
         " factor " + std::to_string(c.factor) + " pos0 " + std::to_string(c.pos0);
}

const Case kCases[] = {
    {2, 5, 3, 8, 1.0, false, 0.0f, 0},   // every dim rotated, rotate_half pairs
    {1, 7, 2, 16, 0.5, false, 0.0f, 0},  // half the dims, the rest passed through
    {2, 4, 2, 12, 1.0, true, 0.0f, 0},   // interleaved pairs
    {1, 6, 1, 10, 0.4, true, 2.0f, 0},   // interleaved, 4 of 10 dims, positions halved
    {1, 3, 2, 8, 1.0, false, 0.0f, 29},  // generation: positions 29..31 of a 32-row table
    {2, 5, 6, 8, 1.0, false, 0.0f, 0, 2},   // grouped-query attention: 2 groups of 3 heads
    {1, 4, 4, 8, 0.5, true, 0.0f, 27, 1},   // one group of 4 heads (multi-query), generation
};

TEST(KernelRope, ForwardMatchesTheRotationInDouble) {
  for (const Case& c : kCases) {
    const RotaryEmbedding rope(config_for(c, 32), 32);
    std::vector<float> x = random_floats(c.size(), 11, -2.0f, 2.0f);
    const std::vector<double> want = reference_forward(c, kernel_test::to_double(x), c.pos0);
    rope_forward(x.data(), rope.table(), c.B * c.T, c.T, c.pos0, c.layout());
    // fp32 angles (Megatron's) against double ones: up to t * 2^-24 radians apart.
    expect_close(x, want, 3e-6, "rope_forward " + name_of(c));
  }
}

TEST(KernelRope, ValuesAndTheDimsPastTheRotatedOnesAreUntouched) {
  for (const Case& c : {Case{2, 5, 3, 10, 0.6, false, 0.0f, 0}, Case{2, 5, 6, 10, 0.6, false, 0.0f, 0, 2}}) {
    const RotaryEmbedding rope(config_for(c, 8), 8);  // 6 of 10 dims rotated
    const QkvLayout L = c.layout();
    const std::vector<float> x0 = random_floats(c.size(), 12);
    std::vector<float> x = x0;
    rope_forward(x.data(), rope.table(), c.B * c.T, c.T, 0, L);
    int changed_rotated = 0;
    for (size_t e = 0; e < x.size(); ++e) {
      const int64_t d = int64_t(e) % c.D, slot = (int64_t(e) / c.D) % L.slots();
      const bool value = slot % (L.H / L.G + 2) == L.H / L.G + 1;
      if (value || d >= 6)
        ASSERT_EQ(x[e], x0[e]) << name_of(c) << ": element " << e << " (slot " << slot << ", dim " << d << ") changed";
      else
        changed_rotated += x[e] != x0[e];
    }
    EXPECT_GT(changed_rotated, 0);
    // Position 0 is the identity (cos 1, sin 0).
    for (int64_t e = 0; e < L.width(); ++e) EXPECT_EQ(x[size_t(e)], x0[size_t(e)]) << "position 0, element " << e;
  }
}

// rope_forward is linear in qkv, so sum(R * rope(x)) has the gradient rope_backward(R):
// checked by central differences of the double reference.
TEST(KernelRope, BackwardMatchesFiniteDifferences) {
  for (Case c : kCases) {
    c.pos0 = 0;
    const RotaryEmbedding rope(config_for(c, 32), 32);
    const size_t n = c.size();
    const std::vector<float> x = random_floats(n, 13), R = random_floats(n, 14);
    std::vector<float> grad = R;
    rope_backward(grad.data(), rope.table(), c.B * c.T, c.T, c.layout());
    auto f = [&](const std::vector<double>& xd) { return project(reference_forward(c, xd, 0), R); };
    const std::vector<double> want = numeric_grad(f, kernel_test::to_double(x));
    expect_close(grad, want, 1e-5, "rope_backward " + name_of(c));
  }
}

TEST(KernelRope, TableIsMegatronsFp32Angles) {
  const Case c{1, 1, 1, 8, 1.0, false, 4.0f, 0};
  const RotaryEmbedding rope(config_for(c, 64), 64);
  const RopeTable& t = rope.table();
  ASSERT_EQ(t.half, 4);
  ASSERT_EQ(t.positions, 64);
  for (int64_t pos = 0; pos < 64; ++pos)
    for (int64_t d = 0; d < 4; ++d) {
      const float inv_freq = 1.0f / std::pow(10000.0f, float(2 * d) / 8.0f);
      const float angle = (float(pos) / 4.0f) * inv_freq;
      EXPECT_EQ(t.cos[pos * 4 + d], float(std::cos(double(angle)))) << pos << "," << d;
      EXPECT_EQ(t.sin[pos * 4 + d], float(std::sin(double(angle)))) << pos << "," << d;
    }
}

TEST(KernelRope, PositionsPastTheTableAreRefused) {
  const Case c{1, 4, 1, 8, 1.0, false, 0.0f, 0};
  const RotaryEmbedding rope(config_for(c, 4), 4);
  std::vector<float> x(size_t(4 * 3 * 8), 1.0f);
  EXPECT_THROW(rope_forward(x.data(), rope.table(), 4, 4, 1, QkvLayout{1, 1, 8}), Error);
  EXPECT_NO_THROW(rope_forward(x.data(), rope.table(), 4, 4, 0, QkvLayout{1, 1, 8}));
}

TEST(KernelRope, ConfigurationErrorsNameTheFlag) {
  auto error_of = [](double percent, float base, float factor) {
    const Case c{1, 1, 2, 10, percent, false, factor, 0};
    try {
      TransformerConfig cfg = config_for(c, 8);
      cfg.rotary_base = base;
      cfg.finalize();
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string();
  };
  EXPECT_NE(error_of(0.5, 10000.0f, 0.0f).find("--rotary-percent 0.5 of --kv-channels 10 rotates 5 dims"),
            std::string::npos);
  EXPECT_NE(error_of(0.0, 10000.0f, 0.0f).find("--rotary-percent must be in (0, 1]"), std::string::npos);
  EXPECT_NE(error_of(1.5, 10000.0f, 0.0f).find("--rotary-percent must be in (0, 1]"), std::string::npos);
  EXPECT_NE(error_of(1.0, 1.0f, 0.0f).find("--rotary-base"), std::string::npos);
  EXPECT_NE(error_of(1.0, 10000.0f, -1.0f).find("--rotary-seq-len-interpolation-factor"), std::string::npos);
  EXPECT_EQ(error_of(0.2, 10000.0f, 0.0f), "");  // 2 of 10 dims
  EXPECT_EQ(error_of(0.6, 10000.0f, 0.0f), "");  // 6 of 10: 10 x 0.6 is 6.000000000000001 in double
  EXPECT_NE(error_of(0.7, 10000.0f, 0.0f).find("rotates 7 dims"), std::string::npos);  // Megatron's int(7.000000000000001)

  TransformerConfig cfg = config_for(Case{1, 1, 2, 8, 1.0, false, 0.0f, 0}, 8);
  cfg.position_embedding_type = "alibi";
  try {
    cfg.finalize();
    FAIL() << "alibi accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("--position-embedding-type must be learned_absolute, rope, yarn or none"),
              std::string::npos)
        << e.what();
  }
}

// --use-rope-scaling (Llama 3.1's scaling): each table frequency, read back from position 1's
// angle, against the three bands written out here in double: with base 10000 over 16 dims the 8
// wavelengths are 2 pi 10000^(d/8) (6.3, 20, 63, 199, 628, 1987, 6283, 19869); with low 1 and high
// 4 and the original context 1024, d <= 3 (under 256) are kept, d = 4 interpolated and d >= 5
// (over 1024) divided by the factor; with the original context 32768, d <= 6 kept, d = 7
// interpolated.
TEST(KernelRope, Llama3ScalingKeepsStretchesAndInterpolatesByWavelength) {
  for (int64_t original : {1024, 32768}) {
    TransformerConfig cfg = config_for(Case{1, 1, 1, 16, 1.0, false, 0.0f, 0}, 4);
    cfg.use_rope_scaling = true;
    cfg.rope_scaling_factor = 8.0f;
    cfg.rope_scaling_original_max_position_embeddings = original;
    cfg.finalize();
    const RotaryEmbedding rope(cfg, 4);
    const RopeTable& t = rope.table();
    int kept = 0, stretched = 0, interpolated = 0;
    for (int64_t d = 0; d < 8; ++d) {
      const double f = std::pow(10000.0, -double(2 * d) / 16.0), wavelen = 2 * M_PI / f;
      double want = f;
      if (wavelen > double(original)) {
        want = f / 8.0;
        ++stretched;
      } else if (wavelen >= double(original) / 4.0) {
        const double smooth = (double(original) / wavelen - 1.0) / 3.0;
        want = (1.0 - smooth) * f / 8.0 + smooth * f;
        ++interpolated;
      } else {
        ++kept;
      }
      const double got = std::atan2(double(t.sin[t.half + d]), double(t.cos[t.half + d]));  // position 1
      EXPECT_NEAR(got, want, 2e-6 * want + 1e-9) << "original " << original << ", d " << d;
    }
    EXPECT_EQ(kept, original == 1024 ? 4 : 7) << original;
    EXPECT_EQ(interpolated, 1) << original;
    EXPECT_EQ(stretched, original == 1024 ? 3 : 0) << original;
  }
}

// --position-embedding-type yarn: each table frequency, read back from position 1's angle, against
// YaRN's written out here in double, and the table's magnitude, the attention factor. With base
// 10000 over 16 dims and the original context 2048, the pair of dim d turns 2048 / (2 pi 10000^(d/8))
// times over it: 32 times at d = 2.01, once at d = 5.03, so pairs 0-2 keep their frequency, 6-7
// are divided by the factor and 3-5 mix them (floored and ceiled: the ramp over 2..6).
TEST(KernelRope, YarnRampsFromKeptToInterpolatedFrequencies) {
  for (bool round : {false, true})
    for (auto [mscale, all_dim] : {std::pair<float, float>{1.0f, 0.0f}, {0.707f, 0.707f}, {1.0f, 0.5f}}) {
      TransformerConfig cfg = config_for(Case{1, 1, 1, 16, 1.0, false, 0.0f, 0}, 4);
      cfg.position_embedding_type = "yarn";
      cfg.yarn_rotary_scaling_factor = 4.0f;
      cfg.yarn_original_max_position_embeddings = 2048;
      cfg.yarn_mscale = mscale;
      cfg.yarn_mscale_all_dim = all_dim;
      cfg.yarn_correction_range_round_to_int = round;
      cfg.finalize();
      const RotaryEmbedding rope(cfg, 4);
      const RopeTable& t = rope.table();
      auto dim_turning = [](double b) { return 16.0 * std::log(2048.0 / (2 * M_PI * b)) / (2 * std::log(10000.0)); };
      const double low = round ? std::floor(dim_turning(32)) : dim_turning(32);
      const double high = round ? std::ceil(dim_turning(1)) : dim_turning(1);
      auto m = [](double x) { return 0.1 * x * std::log(4.0) + 1.0; };
      const double factor = m(mscale) / m(all_dim);
      int kept = 0, mixed = 0, interpolated = 0;
      for (int64_t d = 0; d < 8; ++d) {
        const double f = std::pow(10000.0, -double(2 * d) / 16.0);
        const double ramp = std::clamp((double(d) - low) / (high - low), 0.0, 1.0);
        const double want = f / 4.0 * ramp + f * (1.0 - ramp);
        kept += ramp == 0.0;
        mixed += ramp > 0.0 && ramp < 1.0;
        interpolated += ramp == 1.0;
        const double c = t.cos[t.half + d], s = t.sin[t.half + d];  // position 1
        EXPECT_NEAR(std::atan2(s, c), want, 2e-6 * want + 1e-9) << "d " << d << " round " << round;
        EXPECT_NEAR(std::hypot(c, s), factor, 1e-6 * factor) << "d " << d;
        EXPECT_NEAR(double(t.cos[d]), factor, 1e-6) << "position 0: no rotation, the factor";
      }
      EXPECT_EQ(kept, 3);
      EXPECT_EQ(mixed, 3);
      EXPECT_EQ(interpolated, 2);
    }
}

// finalize()'s error for a small rope config set up by `base`, then changed by `edit` ("" for none).
std::string finalize_error(const std::function<void(TransformerConfig&)>& base,
                           const std::function<void(TransformerConfig&)>& edit) {
  TransformerConfig cfg = config_for(Case{1, 1, 2, 8, 1.0, false, 0.0f, 0}, 8);
  base(cfg);
  edit(cfg);
  try {
    cfg.finalize();
  } catch (const Error& e) {
    return std::string(e.what());
  }
  return std::string();
}

TEST(KernelRope, YarnErrorsNameTheFlag) {
  auto error_of = [](const std::function<void(TransformerConfig&)>& edit) {
    return finalize_error(
        [](TransformerConfig& c) {
          c.position_embedding_type = "yarn";
          c.yarn_rotary_scaling_factor = 4.0f;
        },
        edit);
  };
  EXPECT_EQ(error_of([](TransformerConfig&) {}), "");
  EXPECT_NE(error_of([](TransformerConfig& c) { c.yarn_rotary_scaling_factor = 0.5f; })
                .find("--yarn-rotary-scaling-factor must be a finite number >= 1, got 0.5"),
            std::string::npos);
  EXPECT_NE(error_of([](TransformerConfig& c) { c.yarn_original_max_position_embeddings = 0; })
                .find("--yarn-original-max-position-embeddings"),
            std::string::npos);
  EXPECT_NE(error_of([](TransformerConfig& c) { c.yarn_beta_fast = 0.5f; }).find("--yarn-beta-fast 0.5"),
            std::string::npos);
  EXPECT_NE(error_of([](TransformerConfig& c) { c.rotary_percent = 0.5; }).find("--rotary-percent"), std::string::npos);
  EXPECT_NE(error_of([](TransformerConfig& c) { c.use_rope_scaling = true; }).find("--use-rope-scaling does not go"),
            std::string::npos);
  EXPECT_NE(error_of([](TransformerConfig& c) { c.rotary_interleaved = true; }).find("--rotary-interleaved"),
            std::string::npos);
}

TEST(KernelRope, Llama3ScalingErrorsNameTheFlag) {
  auto error_of = [](const std::function<void(TransformerConfig&)>& edit) {
    return finalize_error([](TransformerConfig& c) { c.use_rope_scaling = true; }, edit);
  };
  EXPECT_EQ(error_of([](TransformerConfig&) {}), "");
  EXPECT_NE(error_of([](TransformerConfig& c) { c.position_embedding_type = "learned_absolute"; })
                .find("--use-rope-scaling needs --position-embedding-type rope"),
            std::string::npos);
  EXPECT_NE(error_of([](TransformerConfig& c) { c.rope_scaling_factor = 0.0f; }).find("--rope-scaling-factor"),
            std::string::npos);
  EXPECT_NE(error_of([](TransformerConfig& c) { c.rope_scaling_high_freq_factor = 0.5f; })
                .find("--rope-scaling-high-freq-factor 0.5"),
            std::string::npos);
  EXPECT_NE(error_of([](TransformerConfig& c) { c.rope_scaling_original_max_position_embeddings = 0; })
                .find("--rope-scaling-original-max-position-embeddings"),
            std::string::npos);
}

}  // namespace
}  // namespace lattice
