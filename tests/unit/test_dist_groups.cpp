// Megatron's rank order for the process groups (no MPI needed).
#include <gtest/gtest.h>

#include <algorithm>

#include "core/error.h"
#include "dist/parallel_state.h"

namespace lattice {
namespace {

TEST(DistGroups, MegatronOrderTpFastestThenDpThenPp) {
  // 8 ranks, TP=2, PP=2 -> DP=2.
  GroupPlan g = plan_groups(make_layout(8, 2, 2));
  EXPECT_EQ(g.tp, (std::vector<std::vector<int>>{{0, 1}, {2, 3}, {4, 5}, {6, 7}}));
  EXPECT_EQ(g.dp, (std::vector<std::vector<int>>{{0, 2}, {1, 3}, {4, 6}, {5, 7}}));
  EXPECT_EQ(g.pp, (std::vector<std::vector<int>>{{0, 4}, {1, 5}, {2, 6}, {3, 7}}));
  EXPECT_EQ(g.embedding, (std::vector<std::vector<int>>{{0, 4}, {1, 5}, {2, 6}, {3, 7}}));
}

// --use-tp-pp-dp-mapping (Megatron's tp-cp-ep-pp-dp): a copy's pipeline stages are neighbours, the
// data-parallel rank outermost. 8 ranks, TP=2, PP=2 -> DP=2: rank = tp + 2 (pp + 2 dp).
TEST(DistGroups, TpPpDpMappingPutsTheStagesBeforeTheCopies) {
  const ParallelLayout l = make_layout(8, 2, 2, 1, 1, 1, 0, true);
  EXPECT_EQ(l.dp, 2);
  EXPECT_EQ(l.rank_of(1, 0, 1, 0), 5);
  EXPECT_EQ(l.rank_of(0, 0, 0, 1), 2);
  GroupPlan g = plan_groups(l);
  EXPECT_EQ(g.tp, (std::vector<std::vector<int>>{{0, 1}, {2, 3}, {4, 5}, {6, 7}}));
  EXPECT_EQ(g.pp, (std::vector<std::vector<int>>{{0, 2}, {1, 3}, {4, 6}, {5, 7}}));
  EXPECT_EQ(g.dp, (std::vector<std::vector<int>>{{0, 4}, {1, 5}, {2, 6}, {3, 7}}));
  EXPECT_EQ(g.embedding, g.pp);
  EXPECT_EQ(g.expert_dp, g.dp);  // (no expert parallelism: the experts' gradients go as the others')
  // Megatron asserts no context or expert parallelism with it; whole experts under TP neither.
  auto refused = [](auto make, const char* says) {
    try {
      make();
      ADD_FAILURE() << "accepted: " << says;
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(says), std::string::npos) << e.what();
      EXPECT_NE(std::string(e.what()).find("--use-tp-pp-dp-mapping"), std::string::npos) << e.what();
    }
  };
  refused([] { make_layout(8, 2, 1, 1, 2, 1, 0, true); }, "--context-parallel-size 2");
  refused([] { make_layout(8, 2, 1, 2, 1, 1, 0, true); }, "--expert-model-parallel-size 2");
  refused([] { make_layout(4, 2, 1, 1, 1, 1, 1, true); }, "--expert-tensor-parallel-size 1");
}

// Expert parallelism splits each data-parallel group: ep consecutive data-parallel ranks hold
// the experts between them, every ep-th one a copy of the same experts (Megatron's tp-ep-dp-pp).
TEST(DistGroups, ExpertParallelSplitsDataParallel) {
  // 16 ranks, TP=2, PP=2 -> DP=4, EP=2 -> expert DP=2.
  const ParallelLayout l = make_layout(16, 2, 2, 2);
  EXPECT_EQ(l.dp, 4);
  EXPECT_EQ(l.expert_dp(), 2);
  GroupPlan g = plan_groups(l);
  EXPECT_EQ(g.dp[0], (std::vector<int>{0, 2, 4, 6}));
  EXPECT_EQ(g.ep, (std::vector<std::vector<int>>{{0, 2}, {4, 6}, {1, 3}, {5, 7}, {8, 10}, {12, 14}, {9, 11}, {13, 15}}));
  EXPECT_EQ(g.expert_dp,
            (std::vector<std::vector<int>>{{0, 4}, {2, 6}, {1, 5}, {3, 7}, {8, 12}, {10, 14}, {9, 13}, {11, 15}}));
  // Without expert parallelism every rank is its own expert-parallel group.
  GroupPlan one = plan_groups(make_layout(4, 1, 1));
  EXPECT_EQ(one.ep, (std::vector<std::vector<int>>{{0}, {1}, {2}, {3}}));
  EXPECT_EQ(one.expert_dp, (std::vector<std::vector<int>>{{0, 1, 2, 3}}));
}

// Context parallelism sits between tensor and data parallelism (tp-cp-dp-pp): 16 ranks, TP=2,
// CP=2, PP=2 -> DP=2. The gradients are summed over dp x cp.
TEST(DistGroups, ContextParallelBetweenTensorAndData) {
  const ParallelLayout l = make_layout(16, 2, 2, 1, 2);
  EXPECT_EQ(l.dp, 2);
  EXPECT_EQ(l.rank_of(1, 1, 1, 1), 15);
  GroupPlan g = plan_groups(l);
  EXPECT_EQ(g.tp[0], (std::vector<int>{0, 1}));
  EXPECT_EQ(g.tp[1], (std::vector<int>{2, 3}));  // cp rank 1 of dp rank 0
  EXPECT_EQ(g.cp, (std::vector<std::vector<int>>{{0, 2}, {1, 3}, {4, 6}, {5, 7}, {8, 10}, {9, 11}, {12, 14}, {13, 15}}));
  EXPECT_EQ(g.dp, (std::vector<std::vector<int>>{{0, 4}, {1, 5}, {2, 6}, {3, 7}, {8, 12}, {9, 13}, {10, 14}, {11, 15}}));
  EXPECT_EQ(g.dp_cp, (std::vector<std::vector<int>>{{0, 2, 4, 6}, {1, 3, 5, 7}, {8, 10, 12, 14}, {9, 11, 13, 15}}));
  EXPECT_EQ(g.pp[0], (std::vector<int>{0, 8}));
  EXPECT_EQ(g.pp[2], (std::vector<int>{2, 10}));
  EXPECT_EQ(g.embedding.size(), 8u);
  // Without it every rank is its own context-parallel group and dp x cp is dp.
  GroupPlan one = plan_groups(make_layout(4, 2, 1));
  EXPECT_EQ(one.cp, (std::vector<std::vector<int>>{{0}, {1}, {2}, {3}}));
  EXPECT_EQ(one.dp_cp, one.dp);
}

// --num-distributed-optimizer-instances: each dp x cp (expert data-parallel) group is cut into runs of
// consecutive members, each an instance's shard group; the members at the same place in each run hold
// the same shard and sum it. 16 ranks, TP 2, CP 2 -> DP 4, EP 2, two instances.
TEST(DistGroups, DistributedOptimizerInstancesCutTheGradientGroups) {
  const ParallelLayout l = make_layout(16, 2, 1, 2, 2, 2);
  EXPECT_EQ(l.dist_opt_instances, 2);
  GroupPlan g = plan_groups(l);
  EXPECT_EQ(g.dp_cp[0], (std::vector<int>{0, 2, 4, 6, 8, 10, 12, 14}));
  EXPECT_EQ(g.dp_cp_shard[0], (std::vector<int>{0, 2, 4, 6}));
  EXPECT_EQ(g.dp_cp_shard[1], (std::vector<int>{8, 10, 12, 14}));
  EXPECT_EQ(g.dp_cp_shard.size(), 4u);
  EXPECT_EQ(g.dp_cp_replicas[0], (std::vector<int>{0, 8}));
  EXPECT_EQ(g.dp_cp_replicas[3], (std::vector<int>{6, 14}));
  EXPECT_EQ(g.dp_cp_replicas.size(), 8u);
  EXPECT_EQ(g.expert_dp[0], (std::vector<int>{0, 2, 8, 10}));
  EXPECT_EQ(g.expert_dp_shard[0], (std::vector<int>{0, 2}));
  EXPECT_EQ(g.expert_dp_shard[1], (std::vector<int>{8, 10}));
  EXPECT_EQ(g.expert_dp_replicas[0], (std::vector<int>{0, 8}));
  EXPECT_EQ(g.expert_dp_replicas[1], (std::vector<int>{2, 10}));
  // Every rank is in exactly one shard and one replica group of each kind.
  for (const auto* groups : {&g.dp_cp_shard, &g.dp_cp_replicas, &g.expert_dp_shard, &g.expert_dp_replicas}) {
    std::vector<int> seen(16, 0);
    for (const std::vector<int>& grp : *groups)
      for (int r : grp) ++seen[size_t(r)];
    EXPECT_EQ(seen, std::vector<int>(16, 1));
  }
  // One instance: no such groups.
  EXPECT_TRUE(plan_groups(make_layout(16, 2, 1, 2, 2)).dp_cp_shard.empty());
  // An instance is a run of whole data-parallel ranks holding every expert: the instances divide dp and
  // dp / ep (so the dense shard group is the expert-parallel groups times the experts' shard groups).
  for (const std::vector<int>& shard : g.dp_cp_shard)
    for (int r : shard)
      for (const std::vector<int>& ep : g.ep)
        if (std::find(ep.begin(), ep.end(), r) != ep.end())
          for (int peer : ep) EXPECT_NE(std::find(shard.begin(), shard.end(), peer), shard.end()) << r << " " << peer;
  EXPECT_THROW(make_layout(4, 1, 1, 1, 1, 3), Error);
  EXPECT_THROW(make_layout(8, 1, 1, 4, 1, 4), Error);  // dp 8, expert dp 2
  EXPECT_THROW(make_layout(4, 1, 1, 2, 2, 2), Error);  // dp 2, ep 2: one copy of each expert per cp rank
  EXPECT_THROW(make_layout(4, 1, 1, 1, 1, 0), Error);
}

// Experts under context parallelism: 8 ranks, CP 2 -> DP 4, EP 2. The expert-parallel groups
// stay within a context-parallel rank; the expert data-parallel group (the experts' gradients)
// holds the copies of the same experts at both context-parallel ranks, ordered as dp x cp is.
TEST(DistGroups, ExpertParallelUnderContextParallel) {
  const ParallelLayout l = make_layout(8, 1, 1, 2, 2);
  EXPECT_EQ(l.dp, 4);
  EXPECT_EQ(l.expert_dp_group(), 4);
  GroupPlan g = plan_groups(l);
  EXPECT_EQ(g.ep, (std::vector<std::vector<int>>{{0, 2}, {4, 6}, {1, 3}, {5, 7}}));
  EXPECT_EQ(g.expert_dp, (std::vector<std::vector<int>>{{0, 1, 4, 5}, {2, 3, 6, 7}}));
  EXPECT_EQ(g.dp_cp, (std::vector<std::vector<int>>{{0, 1, 2, 3, 4, 5, 6, 7}}));
}

TEST(DistGroups, ContextParallelNamesTheFlags) {
  try {
    make_layout(6, 1, 1, 1, 4);
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("world size 6 is not divisible by --tensor-model-parallel-size 1 x "
                                         "--context-parallel-size 4"),
              std::string::npos)
        << e.what();
  }
  EXPECT_THROW(make_layout(4, 1, 1, 1, 0), Error);
}

// --expert-tensor-parallel-size 1 (Megatron's expert order tp-ep-dp-pp with an expert tensor-parallel
// size of 1): a stage's tp x dp ranks in rank order hold the experts in runs of ep, every ep-th one a
// copy of the same experts. 16 ranks, TP=2, PP=2 -> DP=4; EP=4 -> expert DP=2.
TEST(DistGroups, WholeExpertsSpanTensorAndDataParallel) {
  const ParallelLayout l = make_layout(16, 2, 2, 4, 1, 1, 1);
  EXPECT_TRUE(l.experts_whole);
  EXPECT_EQ(l.expert_dp(), 2);
  GroupPlan g = plan_groups(l);
  EXPECT_EQ(g.ep, (std::vector<std::vector<int>>{{0, 1, 2, 3}, {4, 5, 6, 7}, {8, 9, 10, 11}, {12, 13, 14, 15}}));
  EXPECT_EQ(g.expert_dp, (std::vector<std::vector<int>>{
                             {0, 4}, {1, 5}, {2, 6}, {3, 7}, {8, 12}, {9, 13}, {10, 14}, {11, 15}}));
  // EP 1: every rank of a stage holds every expert.
  EXPECT_EQ(plan_groups(make_layout(4, 2, 1, 1, 1, 1, 1)).expert_dp, (std::vector<std::vector<int>>{{0, 1, 2, 3}}));
  // ETP = TP (or TP 1) is the usual split; EP must divide tp x dp; other sizes are refused.
  EXPECT_FALSE(make_layout(4, 2, 1, 1, 1, 1, 2).experts_whole);
  EXPECT_FALSE(make_layout(4, 1, 1, 2, 1, 1, 1).experts_whole);
  EXPECT_EQ(make_layout(2, 2, 1, 2, 1, 1, 1).expert_dp(), 1);  // EP over the tensor-parallel pair
  // With context parallelism (TP 2 x CP 2 x DP 2 = 8, EP 4): the groups over tp, then cp, then dp; the
  // routing statistics over tp x cp.
  const ParallelLayout lc = make_layout(8, 2, 1, 4, 2, 1, 1);
  EXPECT_EQ(lc.expert_dp_group(), 2);
  const GroupPlan gc = plan_groups(lc);
  EXPECT_EQ(gc.ep, (std::vector<std::vector<int>>{{0, 1, 2, 3}, {4, 5, 6, 7}}));
  EXPECT_EQ(gc.expert_dp, (std::vector<std::vector<int>>{{0, 4}, {1, 5}, {2, 6}, {3, 7}}));
  EXPECT_EQ(gc.tp_cp, (std::vector<std::vector<int>>{{0, 1, 2, 3}, {4, 5, 6, 7}}));
  // Two distributed-optimizer instances at TP 2 x DP 4, EP 2: each instance (two data-parallel ranks with
  // their tensor-parallel pairs) holds two copies of every expert, its shard group one run of them.
  const GroupPlan gi = plan_groups(make_layout(8, 2, 1, 2, 1, 2, 1));
  EXPECT_EQ(gi.expert_dp, (std::vector<std::vector<int>>{{0, 2, 4, 6}, {1, 3, 5, 7}}));
  EXPECT_EQ(gi.expert_dp_shard, (std::vector<std::vector<int>>{{0, 2}, {4, 6}, {1, 3}, {5, 7}}));
  EXPECT_EQ(gi.expert_dp_replicas, (std::vector<std::vector<int>>{{0, 4}, {2, 6}, {1, 5}, {3, 7}}));
  for (auto bad : {std::vector<int>{8, 4, 1, 1, 1, 1, 2}, std::vector<int>{4, 2, 1, 8, 1, 1, 1},
                   std::vector<int>{8, 2, 1, 3, 2, 1, 1}, std::vector<int>{4, 2, 1, 4, 1, 2, 1}}) {
    try {
      make_layout(bad[0], bad[1], bad[2], bad[3], bad[4], bad[5], bad[6]);
      ADD_FAILURE() << "layout accepted: world " << bad[0] << " tp " << bad[1] << " ep " << bad[3];
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("--expert-"), std::string::npos) << e.what();
    }
  }
}

TEST(DistGroups, ExpertParallelSizeMustDivideDataParallel) {
  try {
    make_layout(6, 1, 1, 4);
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("--expert-model-parallel-size 4 does not divide the data-parallel size 6"),
              std::string::npos)
        << e.what();
  }
}

TEST(DistGroups, PureDataParallel) {
  GroupPlan g = plan_groups(make_layout(4, 1, 1));
  EXPECT_EQ(g.dp, (std::vector<std::vector<int>>{{0, 1, 2, 3}}));
  EXPECT_EQ(g.tp.size(), 4u);
  EXPECT_TRUE(g.embedding.empty());
}

TEST(DistGroups, WorldNotDivisibleNamesTheFlags) {
  try {
    make_layout(6, 4, 1);
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("world size 6 is not divisible by --tensor-model-parallel-size 4"),
              std::string::npos);
  }
}

}  // namespace
}  // namespace lattice
