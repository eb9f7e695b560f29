// Pipeline layouts and schedules: layer placement, Megatron's warmup counts, every
// micro-batch's forward before its backward, the simulated bubble against
// (P-1)/(M+P-1), and the errors that name the flag to change.
#include <gtest/gtest.h>

#include <map>
#include <set>
#include <string>
#include <tuple>

#include "core/error.h"
#include "pipeline/schedule.h"

namespace lattice {
namespace {

std::string error_of(int64_t L, int P, int64_t per_virtual, int64_t first, int64_t last) {
  try {
    make_pipeline_layout(L, P, per_virtual, first, last);
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

TEST(PipelineLayout, EvenUnevenAndInterleavedPlacement) {
  const PipelineLayout even = make_pipeline_layout(8, 4, 0, 0, 0);
  EXPECT_EQ(stage_layers(even, 0), (std::vector<std::pair<int64_t, int64_t>>{{0, 2}}));
  EXPECT_EQ(stage_layers(even, 3), (std::vector<std::pair<int64_t, int64_t>>{{6, 8}}));
  const PipelineLayout uneven = make_pipeline_layout(7, 4, 0, 1, 0);
  EXPECT_EQ(stage_layers(uneven, 0), (std::vector<std::pair<int64_t, int64_t>>{{0, 1}}));
  EXPECT_EQ(stage_layers(uneven, 1), (std::vector<std::pair<int64_t, int64_t>>{{1, 3}}));
  EXPECT_EQ(stage_layers(uneven, 3), (std::vector<std::pair<int64_t, int64_t>>{{5, 7}}));
  const PipelineLayout both = make_pipeline_layout(10, 4, 0, 1, 3);
  EXPECT_EQ(stage_layers(both, 1), (std::vector<std::pair<int64_t, int64_t>>{{1, 4}}));
  EXPECT_EQ(stage_layers(both, 3), (std::vector<std::pair<int64_t, int64_t>>{{7, 10}}));
  // Interleaved: stage r, chunk v holds block v*P + r.
  const PipelineLayout inter = make_pipeline_layout(8, 2, 2, 0, 0);
  EXPECT_EQ(inter.virtual_stages, 2);
  EXPECT_EQ(stage_layers(inter, 0), (std::vector<std::pair<int64_t, int64_t>>{{0, 2}, {4, 6}}));
  EXPECT_EQ(stage_layers(inter, 1), (std::vector<std::pair<int64_t, int64_t>>{{2, 4}, {6, 8}}));
}

using Chunks = std::vector<std::pair<int64_t, int64_t>>;

// --account-for-embedding/loss-in-pipeline-split: Megatron-Core's placement, where the split
// divides L + 1 (+ 1) layers and the chunk holding the embedding (loss) builds one decoder
// layer fewer; layer offsets shift back by one after the embedding.
TEST(PipelineLayout, EmbeddingAndLossCountAsLayersInTheSplit) {
  // 6 layers + embedding + loss on 4 stages: 2 each, the first and last stage hold one decoder layer.
  const PipelineLayout both = make_pipeline_layout(6, 4, 0, 0, 0, true, true);
  EXPECT_EQ(both.split_layers(), 8);
  EXPECT_EQ(stage_layers(both, 0), (Chunks{{0, 1}}));
  EXPECT_EQ(stage_layers(both, 1), (Chunks{{1, 3}}));
  EXPECT_EQ(stage_layers(both, 2), (Chunks{{3, 5}}));
  EXPECT_EQ(stage_layers(both, 3), (Chunks{{5, 6}}));
  // The embedding only: 7 + 1 on 2 stages.
  const PipelineLayout emb = make_pipeline_layout(7, 2, 0, 0, 0, true, false);
  EXPECT_EQ(stage_layers(emb, 0), (Chunks{{0, 3}}));
  EXPECT_EQ(stage_layers(emb, 1), (Chunks{{3, 7}}));
  // The loss only: 7 + 1 on 2 stages.
  const PipelineLayout loss = make_pipeline_layout(7, 2, 0, 0, 0, false, true);
  EXPECT_EQ(stage_layers(loss, 0), (Chunks{{0, 4}}));
  EXPECT_EQ(stage_layers(loss, 1), (Chunks{{4, 7}}));
  // Interleaved, one split layer per chunk: 6 + 2 on 2 stages gives 4 chunks each; the first chunk of
  // stage 0 is the embedding alone and the last chunk of stage 1 the loss alone (no decoder layers).
  const PipelineLayout inter = make_pipeline_layout(6, 2, 1, 0, 0, true, true);
  EXPECT_EQ(inter.virtual_stages, 4);
  EXPECT_EQ(stage_layers(inter, 0), (Chunks{{0, 0}, {1, 2}, {3, 4}, {5, 6}}));
  EXPECT_EQ(stage_layers(inter, 1), (Chunks{{0, 1}, {2, 3}, {4, 5}, {6, 6}}));
  // Every decoder layer is placed exactly once, in order along (chunk, stage).
  for (const PipelineLayout& l : {both, emb, loss, inter}) {
    int64_t next = 0;
    for (int v = 0; v < l.virtual_stages; ++v)
      for (int r = 0; r < l.stages; ++r) {
        const auto [b, e] = stage_layers(l, r)[size_t(v)];
        EXPECT_EQ(b, next) << "stage " << r << " chunk " << v;
        next = e;
      }
    EXPECT_EQ(next, l.num_layers);
  }
}

TEST(PipelineLayout, EmbeddingAndLossInTheSplitErrorsNameTheFlag) {
  auto error = [](int64_t L, int P, int64_t per_virtual, int64_t first, bool emb, bool loss) -> std::string {
    try {
      make_pipeline_layout(L, P, per_virtual, first, 0, emb, loss);
    } catch (const Error& e) {
      return e.what();
    }
    return "";
  };
  EXPECT_NE(error(8, 1, 0, 0, true, false).find("--account-for-embedding-in-pipeline-split needs "
                                                "--pipeline-model-parallel-size > 1"),
            std::string::npos);
  EXPECT_NE(error(8, 1, 0, 0, false, true).find("--account-for-loss-in-pipeline-split needs"), std::string::npos);
  EXPECT_NE(error(7, 2, 0, 1, true, false).find("cannot be combined with --decoder-first/last"), std::string::npos);
  // 8 layers + 1 does not split over 2 stages; the message says where the 1 comes from.
  EXPECT_NE(error(8, 2, 0, 0, true, false)
                .find("--num-layers 8 + 1 (--account-for-embedding-in-pipeline-split) is not divisible by "
                      "--pipeline-model-parallel-size 2"),
            std::string::npos);
  EXPECT_NE(error(8, 2, 1, 0, false, true).find("--num-layers 8 + 1 (--account-for-loss-in-pipeline-split) is not "
                                                "divisible by --pipeline-model-parallel-size 2 x "
                                                "--num-layers-per-virtual-pipeline-stage 1"),
            std::string::npos);
  EXPECT_EQ(error(8, 2, 0, 0, true, true), "");
}

// --pipeline-model-parallel-layout: Megatron's layout string, its stages in virtual-stage order v*P + r.
TEST(PipelineLayout, LayoutStringPlacesEachVirtualStage) {
  // "Et*3|(tt|)*2,t*2L" is "Ettt|tt|tt|ttL": 3, 2, 2, 2 decoder layers.
  const PipelineLayout two = parse_pipeline_layout("Et*3|(tt|)*2,t*2L", 9, 2, 0);
  EXPECT_EQ(two.virtual_stages, 2);
  EXPECT_EQ(two.chunk_layers, (std::vector<int64_t>{3, 2, 2, 2}));
  EXPECT_EQ(stage_layers(two, 0), (Chunks{{0, 3}, {5, 7}}));
  EXPECT_EQ(stage_layers(two, 1), (Chunks{{3, 5}, {7, 9}}));
  const PipelineLayout four = parse_pipeline_layout("Et*3|(tt|)*2,t*2L", 9, 4, 0);  // one chunk each, uneven
  EXPECT_EQ(four.virtual_stages, 1);
  EXPECT_EQ(stage_layers(four, 0), (Chunks{{0, 3}}));
  EXPECT_EQ(stage_layers(four, 2), (Chunks{{5, 7}}));
  EXPECT_EQ(stage_layers(four, 3), (Chunks{{7, 9}}));
  // Stages without decoder layers: the embedding alone, the loss alone.
  const PipelineLayout ends = parse_pipeline_layout("E|t*4|t*4|L", 8, 2, 0);
  EXPECT_EQ(stage_layers(ends, 0), (Chunks{{0, 0}, {4, 8}}));
  EXPECT_EQ(stage_layers(ends, 1), (Chunks{{0, 4}, {8, 8}}));
  // "|*2" repeats the separator (an empty stage); prediction depths with the loss.
  EXPECT_EQ(parse_pipeline_layout("Ett|*2ttmL", 4, 3, 1).chunk_layers, (std::vector<int64_t>{2, 0, 2}));
  // The same split as the flags give.
  const PipelineLayout flags = make_pipeline_layout(8, 2, 2, 0, 0);
  const PipelineLayout text = parse_pipeline_layout("Ett|tt|tt|ttL", 8, 2, 0);
  for (int r = 0; r < 2; ++r) EXPECT_EQ(stage_layers(text, r), stage_layers(flags, r));
  EXPECT_EQ(text.virtual_stages, flags.virtual_stages);
}

TEST(PipelineLayout, LayoutStringErrorsNameTheFlag) {
  auto error = [](const std::string& text, int64_t L, int P, int64_t mtp = 0) -> std::string {
    try {
      parse_pipeline_layout(text, L, P, mtp);
    } catch (const Error& e) {
      return e.what();
    }
    return "";
  };
  const std::string flag = "--pipeline-model-parallel-layout";
  for (const auto& [text, L, P, mtp, want] : std::vector<std::tuple<std::string, int64_t, int, int64_t, std::string>>{
           {"Ettt|ttL", 4, 2, 0, "holds 5 decoder layers (t), --num-layers is 4"},
           {"tE|ttL", 3, 2, 0, "E (the embedding) must open the first stage"},
           {"Ett|tLt", 4, 2, 0, "L (the loss) must close the last stage"},
           {"EtLt|tL", 3, 2, 0, "L (the loss) must close the last stage"},
           {"Ett|ttx L", 4, 2, 0, "unknown layer 'x'"},
           {"Et\xc3\xa9|ttL", 3, 2, 0, "unknown layer byte 0xc3"},  // UTF-8 'e acute': named by its first byte
           {"Ett|tt|ttL", 6, 2, 0, "has 3 stages, not a multiple of --pipeline-model-parallel-size 2"},
           {"Ett|ttL", 4, 1, 0, "interleaving them needs --pipeline-model-parallel-size > 1"},
           {"Ett|ttL", 4, 2, 1, "holds 0 prediction depths (m), --mtp-num-layers is 1"},
           {"Ettm|ttL", 4, 2, 1, "must follow every t in the last stage"},
           {"Ett|tmtL", 4, 2, 1, "must follow every t in the last stage"},
           {"E(tt|*2L", 4, 2, 0, "'(' without ')'"},
           {"E(tt|)tt|L", 4, 2, 0, "needs '*n' after it"},
           {"Et*|ttL", 3, 2, 0, "'*' needs a count"},
           {"E(t*9999999)*9|L", 4, 2, 0, "too large"},
       }) {
    const std::string got = error(text, L, P, mtp);
    EXPECT_NE(got.find(flag), std::string::npos) << text << ": " << got;
    EXPECT_NE(got.find(want), std::string::npos) << text << ": " << got;
  }
}

TEST(PipelineLayout, ErrorsNameTheFlag) {
  EXPECT_NE(error_of(6, 4, 0, 0, 0).find("--num-layers 6 is not divisible by --pipeline-model-parallel-size 4"),
            std::string::npos);
  EXPECT_NE(error_of(8, 4, 3, 0, 0).find("--num-layers-per-virtual-pipeline-stage 3"), std::string::npos);
  EXPECT_NE(error_of(8, 4, 2, 0, 0).find("one chunk per stage"), std::string::npos);
  EXPECT_NE(error_of(8, 1, 1, 0, 0).find("needs --pipeline-model-parallel-size > 1"), std::string::npos);
  EXPECT_NE(error_of(8, 2, 1, 1, 0).find("cannot be combined"), std::string::npos);
  EXPECT_NE(error_of(8, 2, 0, 3, 3).find("do not fit"), std::string::npos);
  EXPECT_NE(error_of(8, 4, 0, 1, 0).find("split evenly"), std::string::npos);
  // Interleaving runs groups of N micro-batches (P by default) through each chunk: P <= N <= M, as Megatron.
  auto micro_error = [](PipelineLayout l, int64_t N, int64_t M) {
    l.microbatch_group_size = N;
    try {
      check_micro_batches(l, M);
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string();
  };
  const PipelineLayout four = make_pipeline_layout(8, 4, 1, 0, 0);  // P 4, V 2
  EXPECT_EQ(micro_error(four, 0, 3),
            "interleaved pipelining runs groups of --pipeline-model-parallel-size 4 micro-batches through each chunk: it "
            "must be between --pipeline-model-parallel-size 4 and the number of micro-batches 3 (--global-batch-size / "
            "(--micro-batch-size x data-parallel size))");
  EXPECT_NE(micro_error(four, 3, 8).find("groups of --microbatch-group-size-per-virtual-pipeline-stage 3"),
            std::string::npos);
  EXPECT_NE(micro_error(four, 9, 8).find("number of micro-batches 8"), std::string::npos);
  EXPECT_EQ(micro_error(four, 0, 6),
            "interleaved pipelining: the last group of 2 micro-batches (6 micro-batches in groups of 4) is smaller "
            "than --pipeline-model-parallel-size 4; give a number of micro-batches or a "
            "--microbatch-group-size-per-virtual-pipeline-stage that leaves 0 or at least 4");
  EXPECT_EQ(micro_error(four, 6, 6), "");  // not a multiple of P: one group
  EXPECT_EQ(micro_error(four, 5, 9), "");  // a last group of 4
  EXPECT_EQ(micro_error(make_pipeline_layout(8, 4, 0, 0, 0), 9, 2), "");  // not interleaved: no groups
}

// Every (micro-batch, chunk) runs forward once and backward once, forward first.
void expect_complete(const std::vector<PipelineOp>& ops, int64_t M, int V) {
  std::set<std::pair<int64_t, int>> fwd, bwd;
  for (const PipelineOp& op : ops) {
    const std::pair<int64_t, int> k{op.micro_batch, op.chunk};
    if (op.forward) {
      EXPECT_TRUE(fwd.insert(k).second) << "forward twice";
    } else {
      EXPECT_TRUE(fwd.count(k)) << "backward of " << k.first << "." << k.second << " before its forward";
      EXPECT_TRUE(bwd.insert(k).second) << "backward twice";
    }
  }
  EXPECT_EQ(int64_t(fwd.size()), M * V);
  EXPECT_EQ(int64_t(bwd.size()), M * V);
}

TEST(PipelineSchedule, OneFOneBWarmupAndInFlight) {
  const PipelineLayout l = make_pipeline_layout(8, 4, 0, 0, 0);
  for (int r = 0; r < 4; ++r) {
    const auto ops = pipeline_schedule(l, 8, r);
    expect_complete(ops, 8, 1);
    EXPECT_EQ(warmup_forwards(ops) - 1, 4 - r - 1) << "stage " << r;
    EXPECT_EQ(max_in_flight(ops), 4 - r) << "stage " << r;  // warmup + 1
  }
  // Fewer micro-batches than stages: warmup is capped at M.
  const auto few = pipeline_schedule(l, 2, 0);
  expect_complete(few, 2, 1);
  EXPECT_EQ(max_in_flight(few), 2);
}

TEST(PipelineSchedule, InterleavedFollowsMegatron) {
  const PipelineLayout l = make_pipeline_layout(8, 2, 2, 0, 0);  // P 2, V 2
  const auto ops0 = pipeline_schedule(l, 4, 0);
  expect_complete(ops0, 4, 2);
  // warmup = (P - r - 1)*2 + (V - 1)*P = 4 on stage 0, 2 on stage 1.
  EXPECT_EQ(warmup_forwards(ops0) - 1, 4);
  EXPECT_EQ(warmup_forwards(pipeline_schedule(l, 4, 1)) - 1, 2);
  // Virtual micro-batch order: chunk 0 of micro-batches 0,1, then chunk 1 of 0,1, ...
  EXPECT_EQ(ops0[0].micro_batch, 0);
  EXPECT_EQ(ops0[0].chunk, 0);
  EXPECT_EQ(ops0[1].micro_batch, 1);
  EXPECT_EQ(ops0[2].chunk, 1);
  EXPECT_EQ(ops0[2].micro_batch, 0);
  // The first backward is of the last chunk.
  for (const PipelineOp& op : ops0)
    if (!op.forward) {
      EXPECT_EQ(op.chunk, 1);
      break;
    }
  // M == P: everything is warmup.
  EXPECT_EQ(warmup_forwards(pipeline_schedule(l, 2, 0)), 4);
}

// Megatron's get_schedule_table example (PP 2, VP 2, 5 micro-batches in groups of 3): the virtual
// micro-batches are micro-batches 0 1 2 0 1 2 3 4 3 4 of chunks 0 0 0 1 1 1 0 0 1 1.
TEST(PipelineSchedule, InterleavedMicroBatchGroups) {
  PipelineLayout l = make_pipeline_layout(8, 2, 2, 0, 0);
  l.microbatch_group_size = 3;
  for (int r = 0; r < 2; ++r) {
    const auto ops = pipeline_schedule(l, 5, r);
    expect_complete(ops, 5, 2);
    std::vector<int64_t> fm, bm;
    std::vector<int> fc, bc;
    for (const PipelineOp& op : ops) {
      (op.forward ? fm : bm).push_back(op.micro_batch);
      (op.forward ? fc : bc).push_back(op.chunk);
    }
    EXPECT_EQ(fm, (std::vector<int64_t>{0, 1, 2, 0, 1, 2, 3, 4, 3, 4})) << "stage " << r;
    EXPECT_EQ(fc, (std::vector<int>{0, 0, 0, 1, 1, 1, 0, 0, 1, 1})) << "stage " << r;
    EXPECT_EQ(bm, fm) << "stage " << r;
    EXPECT_EQ(bc, (std::vector<int>{1, 1, 1, 0, 0, 0, 1, 1, 0, 0})) << "stage " << r;  // the chunks mirrored
    // warmup = (P - r - 1)*2 + (V - 1)*N
    EXPECT_EQ(warmup_forwards(ops) - 1, (2 - r - 1) * 2 + 3) << "stage " << r;
  }
  // Every group size from P to M that leaves a last group of 0 or at least P, with M a multiple of P or
  // not, runs to the end without deadlock (simulate_pipeline checks) and completes every op on every
  // stage; the others are refused, as Megatron refuses them.
  for (int P : {2, 3, 4})
    for (int V : {2, 3}) {
      PipelineLayout g = make_pipeline_layout(int64_t(P) * V, P, 1, 0, 0);  // one layer per chunk
      for (int64_t M = P; M <= P + 5; ++M)
        for (int64_t N = P; N <= M; ++N) {
          g.microbatch_group_size = N;
          if (M % N > 0 && M % N < P) {
            EXPECT_THROW(check_micro_batches(g, M), Error);
            continue;
          }
          for (int r = 0; r < P; ++r) expect_complete(pipeline_schedule(g, M, r), M, g.virtual_stages);
          EXPECT_NO_THROW(simulate_pipeline(g, M)) << "P " << P << " M " << M << " N " << N;
        }
    }
}

TEST(PipelineSchedule, SimulatedBubbleIsTheTheory) {
  for (int P : {2, 4})
    for (int64_t M : {int64_t(1), int64_t(4), int64_t(8)}) {
      const PipelineLayout l = make_pipeline_layout(8, P, 0, 0, 0);
      EXPECT_NEAR(simulate_pipeline(l, M).bubble_fraction, double(P - 1) / double(M + P - 1), 1e-12)
          << "P " << P << " M " << M;
    }
  const PipelineLayout inter = make_pipeline_layout(8, 2, 2, 0, 0);
  EXPECT_NEAR(simulate_pipeline(inter, 8).bubble_fraction, theoretical_bubble(inter, 8), 1e-12);
  EXPECT_LT(theoretical_bubble(inter, 8), theoretical_bubble(make_pipeline_layout(8, 2, 0, 0, 0), 8));
  const std::string text = format_timeline(make_pipeline_layout(8, 4, 0, 0, 0), 8);
  EXPECT_NE(text.find("stage 0 | F0 F1 F2 F3 .. .. .. B0 F4 B1"), std::string::npos) << text;
}

}  // namespace
}  // namespace lattice
