// The fp16 loss scaler against reference/megatron.md's trace and Megatron's rules.
#include <gtest/gtest.h>

#include <vector>

#include "core/error.h"
#include "optim/loss_scaler.h"

namespace lattice {
namespace {

TEST(LossScaler, MegatronTrace) {
  // initial 65536, hysteresis 2, window 3; inf on steps F,F,T,T,T,F,F,F,T.
  LossScalerConfig c;
  c.initial_scale = 65536;
  c.hysteresis = 2;
  c.window = 3;
  LossScaler s(c);
  const std::vector<bool> inf = {false, false, true, true, true, false, false, false, true};
  const std::vector<double> want = {65536, 65536, 65536, 32768, 16384, 16384, 16384, 32768, 32768};
  for (size_t i = 0; i < inf.size(); ++i) {
    s.update(inf[i]);
    EXPECT_EQ(s.scale(), want[i]) << "after step " << i + 1;
  }
}

TEST(LossScaler, MegatronDefaultsAndMinimum) {
  LossScaler s(LossScalerConfig{});
  EXPECT_EQ(s.scale(), 4294967296.0);
  LossScalerConfig c;
  c.initial_scale = 4;
  c.min_scale = 2;
  c.hysteresis = 1;
  LossScaler m(c);
  for (int i = 0; i < 5; ++i) m.update(true);
  EXPECT_EQ(m.scale(), 2.0);  // never below --min-loss-scale
}

TEST(LossScaler, ConstantScaleNeverMoves) {
  LossScalerConfig c;
  c.dynamic = false;
  c.initial_scale = 128;
  LossScaler s(c);
  for (bool f : {true, true, false, true}) s.update(f);
  EXPECT_EQ(s.scale(), 128.0);
}

TEST(LossScaler, StateRoundTrip) {
  LossScalerConfig c;
  c.initial_scale = 1024;
  c.window = 2;
  LossScaler a(c), b(c);
  a.update(true);
  a.update(false);
  b.load_state(a.state());
  for (bool f : {false, true, true, false, false}) {
    a.update(f);
    b.update(f);
    EXPECT_EQ(a.scale(), b.scale());
  }
}

TEST(LossScaler, ConstructorErrorsNameTheFlag) {
  auto err = [](LossScalerConfig c) {
    try {
      LossScaler s(c);
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string();
  };
  LossScalerConfig c;
  c.initial_scale = 0;
  EXPECT_NE(err(c).find("--initial-loss-scale"), std::string::npos);
  c = LossScalerConfig{};
  c.min_scale = 1e10;
  EXPECT_NE(err(c).find("--min-loss-scale"), std::string::npos);
  c = LossScalerConfig{};
  c.window = 0;
  EXPECT_NE(err(c).find("--loss-scale-window"), std::string::npos);
  c = LossScalerConfig{};
  c.hysteresis = 0;
  EXPECT_NE(err(c).find("--hysteresis"), std::string::npos);
  c = LossScalerConfig{};
  c.dynamic = false;
  c.initial_scale = -1;
  EXPECT_NE(err(c).find("--loss-scale"), std::string::npos);
}

}  // namespace
}  // namespace lattice
