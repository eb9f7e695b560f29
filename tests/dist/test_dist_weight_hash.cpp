// --check-weight-hash-across-dp-replicas-interval (train/weight_hash.h): after data-parallel
// training every replica's parameters hash alike; one element changed on one replica is found,
// named (the parameter, the two ranks) and reported to every rank, for a dense weight and, under
// expert parallelism, for a routed expert's weight (compared over the expert data-parallel group).
// Runs under mpirun with 2 and 4 ranks.
#include <gtest/gtest.h>

#include <cstring>
#include <string>
#include <vector>

#include "core/error.h"
#include "data/gpt_batches.h"
#include "dist/mpi_comm.h"
#include "dist/parallel_state.h"
#include "model/gpt_model.h"
#include "optim/optimizer.h"
#include "train/data_parallel.h"
#include "train/train_step.h"
#include "train/weight_hash.h"

namespace lattice {
namespace {

constexpr int64_t kB = 2, kT = 16, kIters = 3;

TransformerConfig config(int64_t experts) {
  TransformerConfig c;
  c.num_layers = 2;
  c.hidden_size = 32;
  c.num_attention_heads = 4;
  c.vocab_size = 64;
  c.max_position_embeddings = kT;
  if (experts > 0) {
    c.num_experts = experts;
    c.moe_router_topk = 2;
    c.add_bias_linear = false;
  }
  c.finalize();
  return c;
}

// Trains kIters data-parallel iterations (ep ranks share each layer's experts), then checks.
struct Replicas {
  std::unique_ptr<ParallelState> ps;
  std::unique_ptr<GPTModel> model;
  Replicas(int ep, int64_t experts, bool distributed_optimizer) {
    ps = ParallelState::create(1, 1, 120, ep);
    model = std::make_unique<GPTModel>(config(experts), kB, kT, TensorParallel{}, ModelPlacement{},
                                       ep > 1 ? &ps->ep() : nullptr);
    model->init_parameters(1234);
    DataParallelConfig cfg;
    cfg.distributed_optimizer = distributed_optimizer;
    DataParallel dp(*model, ps->dp(), cfg, ep > 1 ? &ps->ep() : nullptr, &ps->expert_dp(), &ps->dp_cp());
    Optimizer opt(model->params(), OptimizerConfig{}, dp.owned_ranges());
    MockSamples data(64, kT, 7);
    StepConfig sc{kB, kB * ps->dp().size(), kT, 1.0, 1234};
    for (int64_t it = 0; it < kIters; ++it) train_step(*model, opt, data, sc, it, 1e-3, 0.1, &dp);
    dp.finish_param_gather();
  }
  std::optional<WeightHashMismatch> check() {
    return find_weight_hash_mismatch(model->params(), ps->dp_cp(), ps->expert_dp());
  }
  // Adds 1e-3 to element k of the named parameter on group rank `rank` of `group` only.
  void nudge(const std::string& name, int64_t k, Comm& group, int rank) {
    for (const ParamInfo& p : model->params().infos())
      if (p.name == name && group.rank() == rank) model->params().params()[p.offset + k] += 1e-3f;
  }
};

TEST(DistWeightHash, ReplicasMatchAfterTrainingAndADenseDifferenceIsNamed) {
  if (mpi_world_size() == 1) GTEST_SKIP() << "needs data-parallel replicas";
  for (bool distopt : {false, true}) {
    Replicas r(1, 0, distopt);
    EXPECT_FALSE(r.check()) << "replicas differ after training, distributed optimizer " << distopt;
    const int last = r.ps->dp().size() - 1;
    r.nudge("decoder.layers.1.mlp.linear_fc1.weight", 5, r.ps->dp(), last);
    const std::optional<WeightHashMismatch> m = r.check();
    ASSERT_TRUE(m) << "a changed element went unseen";
    EXPECT_EQ(m->param, "decoder.layers.1.mlp.linear_fc1.weight");
    EXPECT_EQ(m->rank, last);
    EXPECT_EQ(m->world_rank, r.ps->dp().world_ranks()[size_t(last)]);
    EXPECT_NE(m->hash, m->rank0_hash);
    try {
      check_weight_hashes_across_dp_replicas(r.model->params(), r.ps->dp_cp(), r.ps->expert_dp(), r.ps->world(), 3);
      ADD_FAILURE() << "no error";
    } catch (const Error& e) {
      const std::string what = e.what();
      EXPECT_NE(what.find("after iteration 3 parameter decoder.layers.1.mlp.linear_fc1.weight differs between its "
                          "data-parallel replicas on ranks 0"),
                std::string::npos)
          << what;
    }
  }
}

// 4 ranks as DP 4 with EP 2: each expert's weights on two replicas (the expert data-parallel group).
TEST(DistWeightHash, AnExpertDifferenceIsFoundWithinItsExpertDataParallelGroup) {
  if (mpi_world_size() != 4) GTEST_SKIP() << "needs 4 ranks";
  Replicas r(2, 4, true);
  EXPECT_FALSE(r.check()) << "replicas differ after training";
  ASSERT_EQ(r.ps->expert_dp().size(), 2);
  // Expert 0 lives on expert-parallel rank 0: change it on that group's second replica.
  std::string expert0;
  for (const ParamInfo& p : r.model->params().infos())
    if (p.expert && expert0.empty()) expert0 = p.name;
  ASSERT_FALSE(expert0.empty());
  const bool holds_first = r.ps->ep().rank() == 0;
  if (holds_first) r.nudge(expert0, 0, r.ps->expert_dp(), 1);
  // Every rank hears of it, the other expert group's too (expert0 is ep rank 0's first expert name).
  std::vector<char> name(expert0.begin(), expert0.end());
  name.resize(512);
  r.ps->dp().broadcast(name.data(), 512, 0);
  const std::optional<WeightHashMismatch> m = r.check();
  ASSERT_TRUE(m) << "a changed expert element went unseen";
  EXPECT_EQ(m->param, std::string(name.data()));
  EXPECT_EQ(m->rank, 1);
}

}  // namespace
}  // namespace lattice
