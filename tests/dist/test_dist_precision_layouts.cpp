// Mixed precision under the parallel layouts: bf16, fp16 (dynamic loss scaling) and fp8
// hybrid (delayed scaling; and the tensorwise, blockwise and mxfp8 recipes) trained for 20 iterations with dropout at TP (with SP), PP, DP
// (distributed optimizer, overlap) and their products, each against the single-process
// run in the same precision: losses, gradient norms and final parameters to 1e-5, as in
// fp32. This holds because no precision step depends on the layout: GEMM results are
// rounded after the tensor-parallel reduction (GemmPolicy::round_result), fp8 amaxes are
// per step and MAX-reduced over the ranks that share a tensor (tensorwise's per GEMM over the
// tensor- and context-parallel ranks; block scales are powers of 2, which move no value's
// rounding unless it leaves fp8's normal range), and the fp16 overflow
// check is reduced over every group. Also --grad-reduce-in-bf16: half the
// reduce-scatter bytes, and the run stays within bf16 rounding of the fp32-reduced one.
// Runs under mpirun with 2 ranks (TP 2, PP 2, DP 2, CP 2), 4 (TP 2 x PP 2, TP 2 x DP 2, PP 2 x DP 2,
// CP 2 x DP 2: context parallelism, whose amaxes and gradients reduce over dp x cp) and 8 (TP 2 x
// PP 2 x DP 2).
#include <gtest/gtest.h>

#include <cmath>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "data/gpt_batches.h"
#include "dist/mpi_comm.h"
#include "dist/parallel_state.h"
#include "model/gpt_model.h"
#include "model/mixed_precision.h"
#include "optim/loss_scaler.h"
#include "optim/optimizer.h"
#include "pipeline/pipeline_runner.h"
#include "train/data_parallel.h"
#include "train/train_step.h"
#include "layout_run.h"
#include "../mla_test_config.h"

namespace lattice {
namespace {

constexpr int64_t kB = 2, kT = 16, kGBS = 8, kIters = 20, kLayers = 4;
constexpr double kLr = 1e-3, kWd = 0.1;

// fp8: hybrid with delayed scaling; the others hybrid with the current-scaling recipes.
enum class Precision { bf16, fp16, fp8, fp8_tensorwise, fp8_blockwise, fp8_mxfp8 };
bool is_fp8(Precision p) { return p != Precision::bf16 && p != Precision::fp16; }

struct Layout {
  std::string name;
  int tp = 1, pp = 1;  // DP = world / (TP x CP x PP)
  bool sequence_parallel = false;
  int cp = 1;
  // --multi-latent-attention (a query latent, latent norms, Dq 12, Dv 6): its latents' gradients all-reduced
  // before the replicated norms and down projections, so every layout rounds the same values.
  bool mla = false;
};

struct PrecisionRun : LayoutRun {
  // fp8: every weight's delayed-scaling state after the first step, by parameter name.
  std::map<std::string, Fp8ScalingState> fp8_after_first;
  int skipped = 0;
  double final_loss_scale = 1;
  CommStats dp_stats;
};

TransformerConfig config(int tp, bool mla) {
  TransformerConfig c;
  if (mla) set_mla(c);
  c.num_layers = kLayers;
  c.hidden_size = 32;
  c.num_attention_heads = 4;
  c.vocab_size = 50;
  c.make_vocab_size_divisible_by = 8;
  c.max_position_embeddings = kT;
  c.hidden_dropout = c.attention_dropout = 0.1f;
  c.finalize(tp);
  return c;
}

// `ps` null: the single-process reference.
PrecisionRun train(Precision prec, ParallelState* ps, bool sequence_parallel, bool grad_reduce_in_bf16 = false,
                   bool mla = false) {
  const int P = ps ? ps->pp().size() : 1;
  const PipelineLayout layout = make_pipeline_layout(kLayers, P, 0, 0, 0);
  const int dp_size = ps ? ps->dp().size() : 1;
  const int64_t M = kGBS / (kB * dp_size);
  const int stage = ps ? ps->pp_rank() : 0;
  const std::vector<PipelineOp> ops = pipeline_schedule(layout, M, stage);
  const ModelPlacement place{stage_layers(layout, stage), stage == 0, stage == P - 1, max_in_flight(ops)};
  const TensorParallel tp = ps ? TensorParallel{&ps->tp(), sequence_parallel} : TensorParallel{};
  GPTModel model(config(tp.size(), mla), kB, kT, tp, place, nullptr, ContextParallel{ps ? &ps->cp() : nullptr});
  model.init_parameters(1234);
  PipelineRunner runner(model, layout, ps ? &ps->pp() : nullptr, ps ? ps->embedding() : nullptr);
  std::unique_ptr<DataParallel> dp;
  if (ps && ps->dp_cp().size() > 1) {
    DataParallelConfig cfg;
    cfg.bucket_elements = 3000;
    cfg.distributed_optimizer = true;
    cfg.overlap_grad_reduce = true;
    cfg.grad_reduce_in_bf16 = grad_reduce_in_bf16;
    dp = std::make_unique<DataParallel>(model, ps->dp(), cfg, nullptr, nullptr, &ps->dp_cp());
  }
  Optimizer opt(model.params(), OptimizerConfig{}, dp ? dp->owned_ranges() : ElementRanges{});

  std::unique_ptr<MixedPrecisionPolicy> policy;
  std::unique_ptr<LossScaler> scaler;
  if (prec == Precision::bf16) policy = make_half_precision_policy(HalfFormat::bf16);
  if (prec == Precision::fp16) {
    policy = make_half_precision_policy(HalfFormat::fp16);
    LossScalerConfig lc;
    lc.initial_scale = 65536.0 * 1024;  // overflows at first: the backoff is exercised
    lc.window = 4;                      // and growth within the 20 iterations
    lc.hysteresis = 1;
    scaler = std::make_unique<LossScaler>(lc);
  }
  if (is_fp8(prec)) {
    Fp8Recipe recipe = make_fp8_recipe("hybrid", 0, 4, "max");
    recipe.scaling = prec == Precision::fp8_tensorwise  ? Fp8Scaling::tensorwise
                     : prec == Precision::fp8_blockwise ? Fp8Scaling::blockwise
                     : prec == Precision::fp8_mxfp8     ? Fp8Scaling::mxfp8
                                                        : Fp8Scaling::delayed;
    Fp8Params params;
    params.cp = ps ? &ps->cp() : nullptr;  // tensorwise: the activations' amaxes over the sequence's chunks
    policy = make_fp8_policy(recipe, ps ? &ps->tp() : nullptr, ps ? &ps->dp_cp() : nullptr, params);
  }
  model.set_gemm_policy(policy.get());

  MockSamples data(model.config().vocab_size, kT, 7);
  StepConfig sc{kB, kGBS, kT, 1.0, 1234};
  sc.precision = policy.get();
  sc.loss_scaler = scaler.get();
  if (dp) dp->comm().stats().reset();
  PrecisionRun run;
  for (int64_t it = 0; it < kIters; ++it) {
    const StepResult r = train_step(model, opt, data, sc, it, kLr, kWd, dp.get(), &runner);
    run.losses.push_back(r.lm_loss);
    run.grad_norms.push_back(r.skipped ? 0.0 : r.grad_norm);
    run.skipped += r.skipped ? 1 : 0;
    if (it == 0 && prec == Precision::fp8)
      for (const auto& [param, state] : policy->scaling_state())
        run.fp8_after_first[model.params().infos()[size_t(param)].name] = state;
  }
  if (dp) dp->finish_param_gather();
  if (scaler) run.final_loss_scale = scaler->scale();
  if (dp) run.dp_stats = dp->comm().stats();
  run.params.assign(model.params().params(), model.params().params() + model.params().numel());
  run.infos = model.params().infos();
  return run;
}

// A layout changes fp32 sums only by reassociation (~1e-7), but a value near a rounding
// boundary of the format can then round the other way: one unit roundoff u of one
// element (bf16 u = 2^-8; fp16 2^-11). Such flips stay far below u in the loss (bound
// u/8) and within a few u in the gradient norm (4u); a parameter whose gradient is ~0
// can take Adam steps of lr = 1e-3 in other directions (bound 1e-2 of the largest
// parameter: 10 such steps). fp8 runs share their scales across layouts and their GEMM
// results are bf16, so bf16's bounds apply to the loss; but a flip in the fp8
// quantization of an activation or a gradient moves an element by e4m3's unit roundoff
// (2^-4, e5m2's 2^-3), which the gradient norm sees: its bound is half of e4m3's u.
// Measured on 2 and 4 ranks: at most 2.2e-4 (loss), 8.4e-3 (grad norm; fp8 on an AVX2
// machine, whose bf16 GEMMs run as fp32 products of the same values: 1.9e-2),
// 2.5e-3 (parameters).
RunTolerance tolerance(Precision p) {
  const double u = std::ldexp(1.0, p == Precision::fp16 ? -11 : -8);
  const double grad_norm = is_fp8(p) ? std::ldexp(1.0, -4) / 2 : 4 * u;
  return RunTolerance{u / 8, grad_norm, 1e-2};
}

// The first step's fp8 amaxes, MAX-reduced over the ranks that share a tensor (a weight's
// shards, a batch's micro-batches), are the single process's: the scales they give agree
// to the rounding of the tensor-parallel reductions (the amax of a reassociated sum, ~1e-7;
// bound 1e-5). A rank that kept its own amax would be off by the spread of the amaxes
// between ranks, percents. Checked before the runs drift apart.
void expect_same_fp8_scales(const PrecisionRun& run, const PrecisionRun& single) {
  EXPECT_FALSE(run.fp8_after_first.empty());
  for (const auto& [name, st] : run.fp8_after_first) {
    ASSERT_TRUE(single.fp8_after_first.count(name)) << name;
    const Fp8ScalingState& want = single.fp8_after_first.at(name);
    for (int k = 0; k < 3; ++k)
      EXPECT_NEAR(st.scale[size_t(k)], want.scale[size_t(k)], 1e-5 * std::fabs(want.scale[size_t(k)]))
          << name << " scale " << k << " (input, weight, output gradient) after the first step";
  }
}

const char* precision_name(Precision p) {
  switch (p) {
    case Precision::bf16: return "Bf16";
    case Precision::fp16: return "Fp16";
    case Precision::fp8: return "Fp8Hybrid";
    case Precision::fp8_tensorwise: return "Fp8Tensorwise";
    case Precision::fp8_blockwise: return "Fp8Blockwise";
    case Precision::fp8_mxfp8: return "Fp8Mxfp8";
  }
  return "?";
}

class DistPrecisionLayouts : public ::testing::TestWithParam<std::tuple<Precision, Layout>> {};

TEST_P(DistPrecisionLayouts, MatchesSingleProcess) {
  const auto& [prec, layout] = GetParam();
  const int world = mpi_world_size();
  const int model_ranks = layout.tp * layout.cp * layout.pp;
  if (world == 1 || world % model_ranks != 0 || world / model_ranks > 2)
    GTEST_SKIP() << "layout " << layout.name << " is run on 2 or 4 ranks (DP = world / (TP x CP x PP) <= 2)";
  auto ps = ParallelState::create(layout.tp, layout.pp, 120, 1, layout.cp);
  const PrecisionRun single = train(prec, nullptr, false, false, layout.mla);
  const PrecisionRun run = train(prec, ps.get(), layout.sequence_parallel, false, layout.mla);
  const RunDifference d = expect_same_run(run, single, tolerance(prec));
  if (mpi_world_rank() == 0)
    std::printf("%s %s on %d ranks: largest relative difference: loss %.2g, grad norm %.2g, parameters %.2g\n",
                precision_name(prec), layout.name.c_str(), world, d.loss, d.grad_norm, d.params);
  EXPECT_EQ(run.skipped, single.skipped);
  EXPECT_EQ(run.final_loss_scale, single.final_loss_scale);
  if (prec == Precision::fp8) expect_same_fp8_scales(run, single);
  if (prec == Precision::fp16) {
    EXPECT_GT(single.skipped, 0) << "the test's initial loss scale should overflow at first";
    EXPECT_LT(single.skipped, kIters / 2);
  }
}

// TP, PP and CP alone (DP 1 on 2 ranks, DP 2 on 4) and TP x PP (4 ranks).
INSTANTIATE_TEST_SUITE_P(
    Layouts, DistPrecisionLayouts,
    ::testing::Combine(::testing::Values(Precision::bf16, Precision::fp16, Precision::fp8, Precision::fp8_tensorwise,
                                         Precision::fp8_blockwise, Precision::fp8_mxfp8),
                       ::testing::Values(Layout{"DP", 1, 1, false}, Layout{"TPSP", 2, 1, true},
                                         Layout{"PP", 1, 2, false}, Layout{"TPxPP", 2, 2, true},
                                         Layout{"CP", 1, 1, false, 2}, Layout{"TPSPMla", 2, 1, true, 1, true})),
    [](const auto& info) {
      return std::string(precision_name(std::get<0>(info.param))) + std::get<1>(info.param).name;
    });

// TP 2 x PP 2 x DP 2 with sequence parallelism (8 ranks; the dist.np8 run takes the
// tests named ThreeD).
class DistPrecisionThreeD : public ::testing::TestWithParam<Precision> {};

TEST_P(DistPrecisionThreeD, MatchesSingleProcess) {
  if (mpi_world_size() != 8) GTEST_SKIP() << "needs 8 ranks";
  const Precision prec = GetParam();
  auto ps = ParallelState::create(2, 2, 120);
  const PrecisionRun single = train(prec, nullptr, false);
  const PrecisionRun run = train(prec, ps.get(), true);
  const RunDifference d = expect_same_run(run, single, tolerance(prec));
  if (mpi_world_rank() == 0)
    std::printf("%s TPxPPxDP on 8 ranks: largest relative difference: loss %.2g, grad norm %.2g, parameters %.2g\n",
                precision_name(prec), d.loss, d.grad_norm, d.params);
  EXPECT_EQ(run.skipped, single.skipped);
  EXPECT_EQ(run.final_loss_scale, single.final_loss_scale);
  if (prec == Precision::fp8) expect_same_fp8_scales(run, single);
}

INSTANTIATE_TEST_SUITE_P(Formats, DistPrecisionThreeD,
                         ::testing::Values(Precision::bf16, Precision::fp16, Precision::fp8,
                                           Precision::fp8_tensorwise),
                         [](const auto& info) { return std::string(precision_name(info.param)); });

// --grad-reduce-in-bf16 at DP 2 with the distributed optimizer: the gradient
// reduce-scatter moves half the bytes of the fp32 one, and the run stays within bf16
// rounding of the fp32-reduced run (each bucket's gradients rounded to bf16 once per
// rank and once after the sum: 2^-9 relative per element).
TEST(DistGradReduceInBf16, HalvesTheBytesAndTracksFp32Reduction) {
  if (mpi_world_size() != 2) GTEST_SKIP() << "DP 2 on 2 ranks";
  auto ps = ParallelState::create(1, 1, 120);
  const PrecisionRun fp32_reduce = train(Precision::bf16, ps.get(), false, false);
  const PrecisionRun bf16_reduce = train(Precision::bf16, ps.get(), false, true);
  const int rs = int(CommOp::reduce_scatter);
  EXPECT_GT(fp32_reduce.dp_stats.bytes[size_t(rs)], 0u);
  EXPECT_EQ(bf16_reduce.dp_stats.bytes[size_t(rs)] * 2, fp32_reduce.dp_stats.bytes[size_t(rs)]);
  double max_rel = 0;
  for (size_t i = 0; i < fp32_reduce.losses.size(); ++i)
    max_rel = std::max(max_rel, std::fabs(bf16_reduce.losses[i] - fp32_reduce.losses[i]) / fp32_reduce.losses[i]);
  EXPECT_GT(max_rel, 0.0) << "bf16 reduction changed nothing: was it used?";
  EXPECT_LT(max_rel, 1e-3) << "largest relative loss difference over " << kIters << " iterations";
  // The replicas stay identical: every rank's final parameters equal the max over ranks.
  std::vector<float> mx = bf16_reduce.params;
  ps->dp().all_reduce(mx.data(), int64_t(mx.size()), ReduceOp::max);
  EXPECT_EQ(mx, bf16_reduce.params);
}

}  // namespace
}  // namespace lattice
