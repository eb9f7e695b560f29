// The flat parameter buffer's placement and the gradient buckets cut from it: expert weights
// (ParamInfo::expert) after every other parameter, buckets that never mix the two kinds (the
// experts' are reduced over the expert data-parallel group), covering the buffer once.
#include <gtest/gtest.h>

#include <algorithm>
#include <string>
#include <vector>

#include "optim/grad_sync.h"
#include "optim/param_buffer.h"

namespace lattice {
namespace {

// Two layers, each a dense weight, two experts and a norm, registered interleaved.
ParamBuffer layered() {
  ParamBuffer pb;
  for (int l = 0; l < 2; ++l) {
    const std::string p = "decoder.layers." + std::to_string(l) + ".";
    pb.add(p + "self_attention.linear_qkv.weight", {30, 10}, ParamInit::normal, 0.02f);
    for (int e = 0; e < 2; ++e)
      pb.mark_expert(pb.add(p + "mlp.experts.local_experts." + std::to_string(e) + ".linear_fc1.weight", {17, 10},
                            ParamInit::normal, 0.02f));
    pb.add(p + "pre_mlp_layernorm.weight", {10}, ParamInit::ones, 0);
  }
  pb.allocate();
  return pb;
}

TEST(GradBuckets, ExpertWeightsArePlacedAfterTheOthers) {
  const ParamBuffer pb = layered();
  int64_t last_dense_end = 0, first_expert = pb.numel();
  for (const ParamInfo& p : pb.infos()) {
    EXPECT_EQ(p.offset % 16, 0) << p.name;  // 64-byte aligned
    if (p.expert) first_expert = std::min(first_expert, p.offset);
    else last_dense_end = std::max(last_dense_end, p.offset + p.numel);
  }
  EXPECT_LE(last_dense_end, pb.expert_begin());
  EXPECT_LE(pb.expert_begin(), first_expert);
  EXPECT_LT(first_expert - pb.expert_begin(), 16);
  // Registration order within each kind, so layer 0's experts come first.
  EXPECT_LT(pb.info("decoder.layers.0.mlp.experts.local_experts.1.linear_fc1.weight").offset,
            pb.info("decoder.layers.1.mlp.experts.local_experts.0.linear_fc1.weight").offset);
  EXPECT_LT(pb.info("decoder.layers.1.pre_mlp_layernorm.weight").offset, first_expert);
  // Parameters never overlap.
  std::vector<std::pair<int64_t, int64_t>> spans;
  for (const ParamInfo& p : pb.infos()) spans.emplace_back(p.offset, p.offset + p.numel);
  std::sort(spans.begin(), spans.end());
  for (size_t i = 1; i < spans.size(); ++i) EXPECT_LE(spans[i - 1].second, spans[i].first);
  EXPECT_EQ(pb.numel(), spans.back().second);
}

TEST(GradBuckets, BucketsKeepExpertsApartAndCoverTheBuffer) {
  const ParamBuffer pb = layered();
  for (int64_t size : {int64_t(1), int64_t(400), int64_t(100000)})
    for (int expert_dp : {1, 2}) {
      SCOPED_TRACE("bucket " + std::to_string(size) + ", expert dp " + std::to_string(expert_dp));
      const std::vector<Bucket> buckets = make_buckets(pb, size, 4, expert_dp);
      // Walked from the end of the buffer: contiguous, disjoint, down to 0.
      int64_t end = pb.numel();
      int expert_buckets = 0;
      for (const Bucket& b : buckets) {
        EXPECT_EQ(b.end, end);
        EXPECT_LT(b.begin, b.end);
        end = b.begin;
        for (int i : b.params) {
          const ParamInfo& p = pb.infos()[size_t(i)];
          EXPECT_EQ(p.expert, b.expert) << p.name << " in a bucket of the other kind";
          EXPECT_GE(p.offset, b.begin);
          EXPECT_LE(p.offset + p.numel, b.end);
        }
        EXPECT_EQ(b.shard_counts.size(), size_t(b.expert ? expert_dp : 4));
        int64_t total = 0;
        for (int64_t c : b.shard_counts) total += c;
        EXPECT_EQ(total, b.end - b.begin);
        expert_buckets += b.expert;
        // The experts' buckets come first (the end of the buffer), then the others.
        if (!b.expert) EXPECT_LE(b.end, pb.expert_begin());
      }
      EXPECT_EQ(end, 0);
      EXPECT_GE(expert_buckets, 1);
      // A bucket of one kind per large size: one for the experts, one for the rest.
      if (size == 100000) EXPECT_EQ(buckets.size(), 2u);
      if (size == 1) EXPECT_EQ(buckets.size(), pb.infos().size());
    }
}

TEST(GradBuckets, WithoutExpertsOneKind) {
  ParamBuffer pb;
  pb.add("a", {5, 3}, ParamInit::normal, 0.02f);
  pb.add("b", {7}, ParamInit::ones, 0);
  pb.allocate();
  EXPECT_EQ(pb.expert_begin(), pb.numel());
  const std::vector<Bucket> buckets = make_buckets(pb, 100000, 2);
  ASSERT_EQ(buckets.size(), 1u);
  EXPECT_FALSE(buckets[0].expert);
  EXPECT_EQ(buckets[0].begin, 0);
  EXPECT_EQ(buckets[0].end, pb.numel());
}

}  // namespace
}  // namespace lattice
