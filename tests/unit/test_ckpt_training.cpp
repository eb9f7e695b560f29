// save_training_checkpoint / load_training_checkpoint at the library level: 6 iterations
// straight equal 3 + save + load into fresh objects + 3, bit for bit (dropout on, warmup +
// cosine schedule, weight decay, Adam and SGD); and Megatron's load options.
#include "checkpoint/training_checkpoint.h"

#include <gtest/gtest.h>

#include "model/mixed_precision.h"
#include "optim/loss_scaler.h"

#include <unistd.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <vector>

#include "checkpoint/checkpoint.h"
#include "checkpoint/safetensors.h"
#include "ckpt_test_util.h"
#include "data/gpt_batches.h"
#include "train/train_step.h"

namespace lattice {
namespace {

using ckpt_test::error_of;

constexpr int64_t kB = 2, kGBS = 4, kT = 8;

TransformerConfig config() {
  TransformerConfig c;
  c.num_layers = 2;
  c.hidden_size = 16;
  c.num_attention_heads = 2;
  c.vocab_size = 40;
  c.max_position_embeddings = kT;
  c.hidden_dropout = c.attention_dropout = 0.1f;
  c.finalize();
  return c;
}

OptimizerParamSchedulerOptions schedule(double max_lr = 1e-2) {
  OptimizerParamSchedulerOptions o;
  o.max_lr = max_lr;
  o.min_lr = 1e-3;
  o.lr_warmup_steps = 2 * kGBS;
  o.lr_decay_steps = 10 * kGBS;
  o.lr_decay_style = "cosine";
  o.start_wd = o.end_wd = 0.1;
  o.wd_incr_steps = 10 * kGBS;
  return o;
}

// One run's objects.
struct TrainRun {
  explicit TrainRun(const std::string& optimizer, uint64_t init_seed = 5, double max_lr = 1e-2)
      : model(config(), kB, kT), optimizer(model.params(), [&] {
          OptimizerConfig oc;
          oc.optimizer = optimizer;
          return oc;
        }()),
        scheduler(schedule(max_lr)) {
    model.init_parameters(init_seed);
  }
  // Mixed precision for the following steps (not owned).
  void use(MixedPrecisionPolicy* p) {
    policy = p;
    model.set_gemm_policy(p);
  }
  void train(const MockSamples& data, int64_t first, int64_t last, uint64_t seed) {
    StepConfig sc{kB, kGBS, kT, 1.0, seed};
    sc.precision = policy;
    for (int64_t it = first; it < last; ++it) {
      StepResult r = train_step(model, optimizer, data, sc, it, scheduler);
      losses.push_back(r.lm_loss);
      scheduler.step(kGBS);
    }
  }
  std::vector<float> params() const {
    return {model.params().params(), model.params().params() + model.params().numel()};
  }
  std::vector<float> state(int k) const {
    const float* s = k == 1 ? optimizer.state1() : optimizer.state2();
    return {s, s + optimizer.state_numel()};
  }
  GPTModel model;
  Optimizer optimizer;
  OptimizerParamScheduler scheduler;
  MixedPrecisionPolicy* policy = nullptr;
  std::vector<double> losses;
};

bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

class CkptTraining : public ckpt_test::TempDirTest {};

TEST_F(CkptTraining, ResumeIsBitExactForAdamAndSgd) {
  const MockSamples data(40, kT, 9);
  for (const char* opt : {"adam", "sgd"}) {
    SCOPED_TRACE(opt);
    const std::string dir = path(std::string("ckpt_") + opt);
    TrainRun straight(opt);
    straight.train(data, 0, 6, 77);

    TrainRun first(opt);
    first.train(data, 0, 3, 77);
    TrainingSaveOptions so;
    so.dir = dir;
    so.optimizer = opt;
    so.args_json = R"({"seed": 77})";
    save_training_checkpoint(so, TrainingProgress{3, 3 * kGBS, 77}, first.model, first.optimizer, first.scheduler);

    TrainRun resumed(opt, /*init_seed=*/6);  // different initial weights: all must come from the checkpoint
    TrainingLoadOptions lo;
    lo.dir = dir;
    lo.optimizer = opt;
    std::optional<TrainingProgress> p =
        load_training_checkpoint(lo, TrainingProgress{0, 0, 1}, resumed.model, resumed.optimizer, resumed.scheduler);
    ASSERT_TRUE(p);
    EXPECT_EQ(p->iteration, 3);
    EXPECT_EQ(p->consumed_train_samples, 12);
    EXPECT_EQ(p->seed, 77u);  // the checkpoint's, not the fresh run's
    EXPECT_EQ(resumed.optimizer.steps(), 3);
    EXPECT_EQ(resumed.scheduler.num_steps(), 12);
    resumed.train(data, p->iteration, 6, p->seed);

    std::vector<double> joined = first.losses;
    joined.insert(joined.end(), resumed.losses.begin(), resumed.losses.end());
    ASSERT_EQ(joined.size(), straight.losses.size());
    for (size_t k = 0; k < joined.size(); ++k) EXPECT_EQ(joined[k], straight.losses[k]) << "iteration " << k + 1;
    EXPECT_TRUE(same_bits(resumed.params(), straight.params()));
    EXPECT_TRUE(same_bits(resumed.state(1), straight.state(1)));
    if (std::string(opt) == "adam") EXPECT_TRUE(same_bits(resumed.state(2), straight.state(2)));
    EXPECT_EQ(resumed.scheduler.get_lr(), straight.scheduler.get_lr());
  }
}

TEST_F(CkptTraining, LoadOptions) {
  const MockSamples data(40, kT, 9);
  TrainRun saved("adam");
  saved.train(data, 0, 2, 77);
  TrainingSaveOptions so;
  so.dir = path("ckpt");
  so.args_json = "{}";
  save_training_checkpoint(so, TrainingProgress{2, 8, 77}, saved.model, saved.optimizer, saved.scheduler);
  TrainingLoadOptions lo;
  lo.dir = path("ckpt");

  {  // --no-load-optim --no-load-rng: weights and progress only
    TrainRun r("adam", 6);
    TrainingLoadOptions o = lo;
    o.load_optim = o.load_rng = false;
    auto p = load_training_checkpoint(o, TrainingProgress{0, 0, 1}, r.model, r.optimizer, r.scheduler);
    ASSERT_TRUE(p);
    EXPECT_EQ(p->iteration, 2);
    EXPECT_EQ(p->seed, 1u);
    EXPECT_EQ(r.optimizer.steps(), 0);
    EXPECT_EQ(r.scheduler.num_steps(), 0);
    EXPECT_TRUE(same_bits(r.params(), saved.params()));
  }
  {  // --finetune: weights only, progress restarts
    TrainRun r("adam", 6);
    TrainingLoadOptions o = lo;
    o.finetune = true;
    auto p = load_training_checkpoint(o, TrainingProgress{0, 0, 1}, r.model, r.optimizer, r.scheduler);
    ASSERT_TRUE(p);
    EXPECT_EQ(p->iteration, 0);
    EXPECT_EQ(p->consumed_train_samples, 0);
    EXPECT_EQ(r.optimizer.steps(), 0);
    EXPECT_TRUE(same_bits(r.params(), saved.params()));
  }
  {  // an iteration directory loads directly
    TrainRun r("adam", 6);
    TrainingLoadOptions o = lo;
    o.dir = path("ckpt/iter_0000002");
    auto p = load_training_checkpoint(o, TrainingProgress{0, 0, 1}, r.model, r.optimizer, r.scheduler);
    ASSERT_TRUE(p);
    EXPECT_EQ(p->iteration, 2);
    EXPECT_TRUE(same_bits(r.params(), saved.params()));
  }
  {  // another optimizer
    TrainRun r("sgd", 6);
    TrainingLoadOptions o = lo;
    o.optimizer = "sgd";
    std::string msg = error_of([&] { load_training_checkpoint(o, {}, r.model, r.optimizer, r.scheduler); });
    EXPECT_NE(msg.find("--optimizer sgd"), std::string::npos) << msg;
  }
  {  // another --lr: the scheduler names the field; override takes the flags' value
    TrainRun r("adam", 6, 2e-2);
    std::string msg = error_of([&] { load_training_checkpoint(lo, {}, r.model, r.optimizer, r.scheduler); });
    EXPECT_NE(msg.find("max_lr"), std::string::npos) << msg;
  }
  {  // no directory / no tracker: nothing to load, nothing touched
    TrainRun r("adam", 6);
    const std::vector<float> before = r.params();
    TrainingLoadOptions o = lo;
    o.dir = path("none");
    EXPECT_FALSE(load_training_checkpoint(o, {}, r.model, r.optimizer, r.scheduler));
    EXPECT_TRUE(same_bits(r.params(), before));
  }
  // A checkpoint saved without optimizer or RNG state needs the matching --no-load-* flag.
  TrainingSaveOptions bare = so;
  bare.dir = path("bare");
  bare.save_optim = bare.save_rng = false;
  save_training_checkpoint(bare, TrainingProgress{2, 8, 77}, saved.model, saved.optimizer, saved.scheduler);
  TrainRun r("adam", 6);
  TrainingLoadOptions o = lo;
  o.dir = path("bare");
  EXPECT_NE(error_of([&] { load_training_checkpoint(o, {}, r.model, r.optimizer, r.scheduler); }).find("--no-load-optim"),
            std::string::npos);
  o.load_optim = false;
  EXPECT_NE(error_of([&] { load_training_checkpoint(o, {}, r.model, r.optimizer, r.scheduler); }).find("--no-load-rng"),
            std::string::npos);
  o.load_rng = false;
  EXPECT_TRUE(load_training_checkpoint(o, {}, r.model, r.optimizer, r.scheduler));
}

}  // namespace
}  // namespace lattice

namespace lattice {
namespace {

// The saved moments carry the right parameter's values: after one AdamW step without
// clipping, exp_avg = (1 - beta1) * grad and exp_avg_sq = (1 - beta2) * grad^2 for every
// tensor, read back by name from optimizer.safetensors.
TEST(CkptOptimizerState, SavedMomentsBelongToTheirParameters) {
  const std::string dir = ::testing::TempDir() + "/ckpt_moments_" + std::to_string(::getpid());
  TransformerConfig c = config();
  c.hidden_dropout = c.attention_dropout = 0.0f;
  GPTModel model(c, kB, kT);
  model.init_parameters(3);
  Optimizer opt(model.params(), OptimizerConfig{});
  OptimizerParamScheduler sched(schedule());
  MockSamples data(c.vocab_size, kT, 3);
  StepConfig sc{kB, kGBS, kT, /*clip_grad=*/0.0, 3};
  train_step(model, opt, data, sc, 0, sched);
  TrainingSaveOptions so;
  so.dir = dir;
  so.args_json = "{}";
  const std::string iter_dir = save_training_checkpoint(so, TrainingProgress{1, kGBS, 3}, model, opt, sched);
  SafetensorsFile f = SafetensorsFile::read(iter_dir + "/optimizer.safetensors");
  for (size_t k = 0; k < model.params().infos().size(); ++k) {
    const ParamInfo& p = model.params().infos()[k];
    const float* g = model.params().grad(int(k));
    std::vector<float> m = f.get_f32("optimizer.exp_avg." + p.name);
    std::vector<float> v = f.get_f32("optimizer.exp_avg_sq." + p.name);
    ASSERT_EQ(int64_t(m.size()), p.numel) << p.name;
    for (int64_t i = 0; i < p.numel; ++i) {
      ASSERT_NEAR(m[size_t(i)], 0.1f * g[i], 1e-6f * (1 + std::fabs(g[i]))) << p.name << "[" << i << "]";
      ASSERT_NEAR(v[size_t(i)], 0.001f * g[i] * g[i], 1e-6f * (1 + g[i] * g[i])) << p.name << "[" << i << "]";
    }
  }
  std::filesystem::remove_all(dir);
}

// fp16's dynamic loss scaler resumes where it was (scale, growth and hysteresis trackers);
// a checkpoint without scaler state (fp32/bf16) leaves the scaler at its initial scale.
TEST_F(CkptTraining, DynamicLossScalerStateResumes) {
  const MockSamples data(40, kT, 9);
  TrainRun saved("adam");
  saved.train(data, 0, 2, 77);
  LossScaler scaler(LossScalerConfig{});
  scaler.update(true);   // hysteresis 2 -> 1, scale kept
  scaler.update(true);   // -> backs off to 2^31
  scaler.update(false);  // growth tracker 1
  TrainingSaveOptions so;
  so.dir = path("fp16");
  so.args_json = "{}";
  so.loss_scaler = &scaler;
  save_training_checkpoint(so, TrainingProgress{2, 8, 77}, saved.model, saved.optimizer, saved.scheduler);

  TrainRun r("adam", 6);
  LossScaler resumed(LossScalerConfig{});
  TrainingLoadOptions lo;
  lo.dir = path("fp16");
  lo.loss_scaler = &resumed;
  ASSERT_TRUE(load_training_checkpoint(lo, TrainingProgress{0, 0, 1}, r.model, r.optimizer, r.scheduler));
  EXPECT_EQ(resumed.state().scale, scaler.state().scale);
  EXPECT_EQ(resumed.state().scale, 2147483648.0);
  EXPECT_EQ(resumed.state().growth_tracker, 1);
  EXPECT_EQ(resumed.state().hysteresis_tracker, scaler.state().hysteresis_tracker);

  // Saved without a scaler: a resumed fp16 run starts from its initial scale.
  so.dir = path("fp32");
  so.loss_scaler = nullptr;
  save_training_checkpoint(so, TrainingProgress{2, 8, 77}, saved.model, saved.optimizer, saved.scheduler);
  TrainRun r2("adam", 6);
  LossScaler fresh(LossScalerConfig{});
  lo.dir = path("fp32");
  lo.loss_scaler = &fresh;
  ASSERT_TRUE(load_training_checkpoint(lo, TrainingProgress{0, 0, 1}, r2.model, r2.optimizer, r2.scheduler));
  EXPECT_EQ(fresh.scale(), 4294967296.0);
}

// fp8's delayed-scaling state (amax histories and scales) travels with the optimizer
// state: 6 fp8 iterations straight equal 3 + save + load + 3, bit for bit. Loaded without
// it, the resumed run's scales restart and its numbers differ (the state matters).
TEST_F(CkptTraining, Fp8ScalingStateResumes) {
  const MockSamples data(40, kT, 9);
  const Fp8Recipe recipe = make_fp8_recipe("hybrid", 0, 4, "max");
  auto p_straight = make_fp8_policy(recipe, nullptr);
  TrainRun straight("adam");
  straight.use(p_straight.get());
  straight.train(data, 0, 6, 77);

  auto p_first = make_fp8_policy(recipe, nullptr);
  TrainRun first("adam");
  first.use(p_first.get());
  first.train(data, 0, 3, 77);
  TrainingSaveOptions so;
  so.dir = path("fp8");
  so.args_json = "{}";
  so.precision = p_first.get();
  save_training_checkpoint(so, TrainingProgress{3, 3 * kGBS, 77}, first.model, first.optimizer, first.scheduler);
  const CheckpointReader saved = CheckpointReader::open(path("fp8"));
  ASSERT_EQ(saved.state().fp8.size(), p_first->scaling_state().size());
  EXPECT_GT(saved.state().fp8.size(), 0u);

  auto p_second = make_fp8_policy(recipe, nullptr);
  TrainRun second("adam", 6);
  second.use(p_second.get());
  TrainingLoadOptions lo;
  lo.dir = path("fp8");
  lo.precision = p_second.get();
  ASSERT_TRUE(load_training_checkpoint(lo, TrainingProgress{0, 0, 1}, second.model, second.optimizer,
                                       second.scheduler));
  second.train(data, 3, 6, 77);
  EXPECT_EQ(second.losses, std::vector<double>(straight.losses.begin() + 3, straight.losses.end()));
  EXPECT_TRUE(same_bits(second.params(), straight.params()));

  auto p_fresh = make_fp8_policy(recipe, nullptr);
  TrainRun third("adam", 6);
  third.use(p_fresh.get());
  lo.precision = nullptr;  // the state is not loaded
  ASSERT_TRUE(load_training_checkpoint(lo, TrainingProgress{0, 0, 1}, third.model, third.optimizer, third.scheduler));
  third.train(data, 3, 6, 77);
  EXPECT_FALSE(same_bits(third.params(), straight.params()));
}

}  // namespace
}  // namespace lattice
