// fp16 loss scaling across ranks: an overflow on one data-parallel rank only makes every
// rank skip the step (the inf/nan check is reduced over all ranks), the scalers stay in
// step, and the replicas stay identical.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <map>
#include <memory>
#include <vector>

#include "data/gpt_batches.h"
#include "dist/parallel_state.h"
#include "model/gpt_model.h"
#include "model/mixed_precision.h"
#include "optim/loss_scaler.h"
#include "optim/optimizer.h"
#include "train/data_parallel.h"
#include "train/train_step.h"

namespace lattice {
namespace {

TEST(DistPrecision, OverflowOnOneRankSkipsTheStepEverywhere) {
  auto ps = ParallelState::create(1, 1, 120);
  TransformerConfig c;
  c.num_layers = 2;
  c.hidden_size = 32;
  c.num_attention_heads = 4;
  c.vocab_size = 64;
  c.max_position_embeddings = 16;
  c.hidden_dropout = c.attention_dropout = 0;
  c.finalize();
  GPTModel model(c, 2, 16);
  model.init_parameters(1234);
  DataParallelConfig dcfg;
  dcfg.distributed_optimizer = true;
  DataParallel dp(model, ps->dp(), dcfg);
  Optimizer opt(model.params(), OptimizerConfig{}, dp.owned_ranges());
  auto policy = make_half_precision_policy(HalfFormat::fp16);
  model.set_gemm_policy(policy.get());
  LossScalerConfig lc;
  lc.initial_scale = 4096;
  lc.hysteresis = 1;
  LossScaler scaler(lc);
  MockSamples data(c.vocab_size, 16, 7);
  StepConfig sc{2, 8, 16, 1.0, 1234};
  sc.loss_scaler = &scaler;
  sc.precision = policy.get();
  const int last = ps->world_size() - 1;
  if (ps->world_rank() == last) sc.inject_inf_iterations = {2};
  std::vector<float> before(size_t(model.params().numel()));
  for (int64_t it = 0; it < 5; ++it) {
    dp.finish_param_gather();
    std::memcpy(before.data(), model.params().params(), before.size() * sizeof(float));
    StepResult r = train_step(model, opt, data, sc, it, 1e-3, 0.0, &dp);
    dp.finish_param_gather();
    EXPECT_EQ(r.skipped, it == 2) << "rank " << ps->world_rank() << " iteration " << it;
    EXPECT_EQ(scaler.scale(), it >= 2 ? 2048.0 : 4096.0) << "rank " << ps->world_rank() << " iteration " << it;
    const bool same = std::memcmp(before.data(), model.params().params(), before.size() * sizeof(float)) == 0;
    EXPECT_EQ(same, it == 2) << "rank " << ps->world_rank() << " iteration " << it;
  }
  // The replicas agree: the max over ranks of the parameters equals this rank's.
  std::vector<float> mx(model.params().params(), model.params().params() + model.params().numel());
  ps->world().all_reduce(mx.data(), int64_t(mx.size()), ReduceOp::max);
  EXPECT_EQ(0, std::memcmp(mx.data(), model.params().params(), mx.size() * sizeof(float)));
}

}  // namespace
}  // namespace lattice

namespace lattice {
namespace {

// fp8 over data parallelism when a weight is used on some ranks only (an expert no token of this
// rank reached): told the parameter count, every rank reduces the same amax list, and a weight used
// anywhere enters every rank's history alike (a weight used nowhere enters none).
TEST(DistPrecision, Fp8WeightUsedOnOneRankRecordsOnAll) {
  auto ps = ParallelState::create(1, 1, 120);
  if (ps->dp().size() < 2) GTEST_SKIP() << "needs 2 or more ranks";
  Fp8Params params;
  params.count = 4;
  auto policy = make_fp8_policy(make_fp8_recipe("hybrid", 0, 4, "max"), nullptr, &ps->dp(), params);
  const int64_t N = 4, in = 8, out = 2;
  std::vector<float> x(size_t(N * in)), w(size_t(out * in)), y(size_t(N * out));
  for (size_t i = 0; i < x.size(); ++i) x[i] = 0.25f * float(int(i % 7) - 3) * float(ps->dp_rank() + 1);
  for (size_t i = 0; i < w.size(); ++i) w[i] = 0.5f - 0.125f * float(i % 5);
  policy->forward(0, y.data(), x.data(), w.data(), N, in, out);  // every rank
  if (ps->dp_rank() == 0) policy->forward(2, y.data(), x.data(), w.data(), N, in, out);  // rank 0 only
  policy->finish_step();
  const std::map<int, Fp8ScalingState> st = policy->scaling_state();
  ASSERT_EQ(st.size(), 2u) << "weights 0 and 2 (1 and 3 used nowhere)";
  ASSERT_TRUE(st.count(2));
  // The same state on every rank: rank 0's amaxes for weight 2, the MAX over ranks for weight 0.
  std::vector<double> mine;
  for (int p : {0, 2})
    for (int k = 0; k < 3; ++k) {
      ASSERT_EQ(st.at(p).amax_history[size_t(k)].size(), 1u) << "weight " << p;
      mine.push_back(st.at(p).amax_history[size_t(k)][0]);
    }
  std::vector<double> most = mine;
  ps->dp().all_reduce(most.data(), int64_t(most.size()), ReduceOp::max);
  std::vector<double> least = mine;
  for (double& v : least) v = -v;
  ps->dp().all_reduce(least.data(), int64_t(least.size()), ReduceOp::max);
  for (size_t i = 0; i < mine.size(); ++i) EXPECT_EQ(most[i], -least[i]) << "amax " << i << " differs between ranks";
  EXPECT_EQ(mine[0], 0.75f * float(ps->dp().size()));  // the input's amax: the largest rank's
  EXPECT_EQ(mine[3], 0.75f);                            // weight 2's input: rank 0's
}

}  // namespace
}  // namespace lattice

namespace lattice {
namespace {

// --fp8-recipe tensorwise scales each operand by the amax of the whole tensor, of which a rank
// may hold a part: a column-parallel weight's rows and its output gradient's columns (over the
// tensor-parallel group), a context-parallel rank's tokens (over the context-parallel group). The
// parts are made of very different magnitudes, so a rank scaling by its own part's amax would
// round otherwise; with the reduction each rank computes the single process's numbers for its part.
TEST(DistPrecision, Fp8TensorwiseScalesByTheWholeTensorsAmax) {
  auto ps = ParallelState::create(1, 1, 120);
  const int R = ps->world_size(), rank = ps->world_rank();
  if (R < 2) GTEST_SKIP() << "needs 2 or more ranks";
  Fp8Recipe recipe = make_fp8_recipe("hybrid", 0, 1, "most_recent");
  recipe.scaling = Fp8Scaling::tensorwise;
  const int64_t N = 6 * R, in = 40, out = 8 * R;  // each rank: N / R tokens or out / R rows
  auto values = [](int64_t n, int seed, int64_t part_size) {
    std::vector<float> v(static_cast<size_t>(n));
    for (int64_t i = 0; i < n; ++i)
      v[size_t(i)] = std::sin(0.71f * float(i) + float(seed)) * std::exp2(3.0f * float(i / part_size));
    return v;
  };
  auto close = [](const std::vector<float>& got, const std::vector<float>& want, const char* what) {
    ASSERT_EQ(got.size(), want.size());
    for (size_t i = 0; i < got.size(); ++i)
      ASSERT_NEAR(got[i], want[i], 1e-5 * (1.0 + std::fabs(want[i]))) << what << " " << i;
  };
  {  // Tensor parallelism: W's rows and dy's columns split over the ranks (a column-parallel layer).
    const auto x = values(N * in, 1, N * in), W = values(out * in, 2, out * in / R), dy = values(N * out, 3, 1);
    auto single = make_fp8_policy(recipe, nullptr);
    std::vector<float> y(size_t(N * out)), dW(W.size(), 0.0f), dx(x.size());
    single->forward(0, y.data(), x.data(), W.data(), N, in, out);
    single->weight_grad(0, dW.data(), dy.data(), x.data(), N, in, out);
    single->input_grad(0, dx.data(), dy.data(), W.data(), N, in, out, false);
    auto tp = make_fp8_policy(recipe, &ps->world());
    const int64_t o = out / R;
    const std::vector<float> W_r(W.begin() + rank * o * in, W.begin() + (rank + 1) * o * in);
    std::vector<float> dy_r(size_t(N * o)), y_r(size_t(N * o)), dW_r(W_r.size(), 0.0f), dx_r(x.size());
    for (int64_t n = 0; n < N; ++n)
      for (int64_t j = 0; j < o; ++j) dy_r[size_t(n * o + j)] = dy[size_t(n * out + rank * o + j)];
    tp->forward(0, y_r.data(), x.data(), W_r.data(), N, in, o);
    tp->weight_grad(0, dW_r.data(), dy_r.data(), x.data(), N, in, o);
    tp->input_grad(0, dx_r.data(), dy_r.data(), W_r.data(), N, in, o, false);
    std::vector<float> y_want(y_r.size());
    for (int64_t n = 0; n < N; ++n)
      for (int64_t j = 0; j < o; ++j) y_want[size_t(n * o + j)] = y[size_t(n * out + rank * o + j)];
    close(y_r, y_want, "y");
    close(dW_r, std::vector<float>(dW.begin() + rank * o * in, dW.begin() + (rank + 1) * o * in), "dW");
    ps->world().all_reduce(dx_r.data(), int64_t(dx_r.size()), ReduceOp::sum);  // the partial input gradients
    close(dx_r, dx, "dx");
  }
  {  // Context parallelism: x's tokens split over the ranks (W whole on each).
    const auto x = values(N * in, 4, N * in / R), W = values(out * in, 5, out * in);
    auto single = make_fp8_policy(recipe, nullptr);
    std::vector<float> y(size_t(N * out));
    single->forward(0, y.data(), x.data(), W.data(), N, in, out);
    Fp8Params params;
    params.cp = &ps->world();
    auto cp = make_fp8_policy(recipe, nullptr, nullptr, params);
    const int64_t n = N / R;
    const std::vector<float> x_r(x.begin() + rank * n * in, x.begin() + (rank + 1) * n * in);
    std::vector<float> y_r(size_t(n * out));
    cp->forward(0, y_r.data(), x_r.data(), W.data(), n, in, out);
    close(y_r, std::vector<float>(y.begin() + rank * n * out, y.begin() + (rank + 1) * n * out), "cp y");
  }
}

}  // namespace
}  // namespace lattice
