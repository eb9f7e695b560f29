// Megatron's rank order for the process groups (no MPI needed).
#include <gtest/gtest.h>

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
