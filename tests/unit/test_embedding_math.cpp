// The embedding gradient's per-column scatter that the CUDA kernel runs (one thread per
// column, rows in groups whose loads are issued together, repeats merged in order),
// run here on the host: it must give the CPU kernel's sums bit for bit, with tokens that
// repeat inside a group, across groups and at group edges, a vocabulary shard that skips
// rows, and N not a multiple of the group.
#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <random>
#include <vector>

#include "kernels/embedding.h"
#include "kernels/embedding_math.h"

namespace lattice {
namespace {

struct Case {
  int64_t N, C, V, vocab_begin, Vl;  // V tokens drawn from [0, V); shard [vocab_begin, vocab_begin + Vl) (Vl < 0: all)
};

class EmbeddingScatter : public ::testing::TestWithParam<Case> {};

TEST_P(EmbeddingScatter, GroupedScatterEqualsTheCpuKernelBitForBit) {
  const Case k = GetParam();
  std::mt19937 gen(7);
  std::uniform_int_distribution<int32_t> tok(0, int32_t(k.V - 1));
  std::uniform_real_distribution<float> val(-1.0f, 1.0f);
  std::vector<int32_t> tokens(static_cast<size_t>(k.N)), positions(static_cast<size_t>(k.N));
  for (int64_t n = 0; n < k.N; ++n) {
    tokens[size_t(n)] = tok(gen);
    positions[size_t(n)] = int32_t(n % 13);  // repeats every 13 rows: across and inside groups
  }
  std::vector<float> dout(static_cast<size_t>(k.N * k.C));
  for (float& x : dout) x = val(gen);
  const int64_t rows = k.Vl < 0 ? k.V : k.Vl;
  std::vector<float> start(static_cast<size_t>(rows * k.C)), pos_start(static_cast<size_t>(13 * k.C));
  for (float& x : start) x = val(gen);  // accumulates into what is there
  for (float& x : pos_start) x = val(gen);

  std::vector<float> cpu = start, cpu_pos = pos_start;
  embedding_backward(cpu.data(), cpu_pos.data(), dout.data(), tokens.data(), positions.data(), k.N, k.C,
                     k.Vl < 0 ? 0 : k.vocab_begin, k.Vl);
  std::vector<float> grouped = start, grouped_pos = pos_start;
  for (int64_t c = 0; c < k.C; ++c) {
    math::scatter_add_rows(grouped.data(), dout.data(), tokens.data(), k.N, k.C, k.Vl < 0 ? 0 : k.vocab_begin,
                           k.Vl, c);
    math::scatter_add_rows(grouped_pos.data(), dout.data(), positions.data(), k.N, k.C, 0, -1, c);
  }
  EXPECT_EQ(std::memcmp(grouped.data(), cpu.data(), cpu.size() * sizeof(float)), 0) << "dwte";
  EXPECT_EQ(std::memcmp(grouped_pos.data(), cpu_pos.data(), cpu_pos.size() * sizeof(float)), 0) << "dwpe";
  // The test sees what it claims: some rows changed, and with a shard some were skipped.
  EXPECT_NE(std::memcmp(grouped.data(), start.data(), start.size() * sizeof(float)), 0);
}

INSTANTIATE_TEST_SUITE_P(Shapes, EmbeddingScatter,
                         ::testing::Values(Case{37, 5, 3, 0, -1},       // 3 tokens: repeats everywhere
                                           Case{64, 3, 50, 0, -1},      // eight full groups, few repeats
                                           Case{101, 4, 20, 7, 6},      // a vocabulary shard [7, 13)
                                           Case{1, 2, 4, 0, -1},        // one row
                                           Case{1000, 2, 11, 0, -1}));  // long chains of repeats

}  // namespace
}  // namespace lattice
