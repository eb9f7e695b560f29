#include <gtest/gtest.h>
#include <omp.h>

#include <algorithm>
#include <vector>

#include "kernels/embedding.h"
#include "kernels_test_util.h"

namespace lattice {
namespace {

using kernel_test::expect_close;
using kernel_test::numeric_grad;
using kernel_test::project;
using kernel_test::random_floats;
using kernel_test::to_double;

// group_rows_by_index: every row once, grouped by value in increasing order, each group's rows
// in index order; the starts bound the groups. spread: the distance between values.
void expect_rows_grouped(int32_t spread) {
  const int64_t N = 1000;
  std::vector<int32_t> idx(N);
  for (int64_t n = 0; n < N; ++n) idx[size_t(n)] = spread * int32_t((n * 7919 + 13) % 97 == 0 ? 5 : (n * 31 + 7) % 61);
  idx[3] = 0;
  idx[4] = -spread;
  std::vector<int32_t> out(size_t(2 * N + 1), -1);
  const int64_t count = group_rows_by_index(idx.data(), N, out.data());
  std::vector<int32_t> sorted = idx;
  std::sort(sorted.begin(), sorted.end());
  EXPECT_EQ(count, int64_t(std::unique(sorted.begin(), sorted.end()) - sorted.begin()));
  const int32_t* order = out.data();
  const int32_t* starts = out.data() + N;
  ASSERT_EQ(starts[0], 0);
  ASSERT_EQ(starts[count], N);
  std::vector<bool> seen(size_t(N), false);
  for (int64_t k = 0; k < count; ++k) {
    ASSERT_LT(starts[k], starts[k + 1]) << "group " << k << " is empty";
    const int32_t value = idx[size_t(order[starts[k]])];
    if (k > 0) EXPECT_LT(idx[size_t(order[starts[k - 1]])], value) << "groups out of order at " << k;
    for (int32_t j = starts[k]; j < starts[k + 1]; ++j) {
      ASSERT_GE(order[j], 0);
      ASSERT_LT(order[j], N);
      EXPECT_EQ(idx[size_t(order[j])], value) << "row " << order[j] << " in the group of " << value;
      if (j > starts[k]) EXPECT_LT(order[j - 1], order[j]) << "rows out of index order in the group of " << value;
      EXPECT_FALSE(seen[size_t(order[j])]) << "row " << order[j] << " twice";
      seen[size_t(order[j])] = true;
    }
  }
  EXPECT_EQ(std::count(seen.begin(), seen.end(), true), N);
}

// Values in a narrow range (a counting sort) and spread wide (a sort of the pairs).
TEST(KernelEmbedding, GroupRowsByIndexIsAStableSortWithGroupStarts) {
  expect_rows_grouped(1);
  expect_rows_grouped(1000000);
}

TEST(KernelEmbedding, ForwardAndBackwardMatchReference) {
  const int64_t V = 11, P = 9, C = 70, N = 40;
  auto wte = random_floats(V * C, 7), wpe = random_floats(P * C, 8), R = random_floats(N * C, 9);
  std::vector<int32_t> tokens(N), positions(N);
  for (int64_t n = 0; n < N; ++n) {
    tokens[n] = int32_t((n * 7 + 3) % V);  // repeated tokens
    positions[n] = int32_t(n % P);
  }
  std::vector<float> out(N * C);
  embedding_forward(out.data(), tokens.data(), positions.data(), wte.data(), wpe.data(), N, C);
  for (int64_t n = 0; n < N; ++n)
    for (int64_t c = 0; c < C; ++c)
      ASSERT_EQ(out[n * C + c], wte[tokens[n] * C + c] + wpe[positions[n] * C + c]);

  auto forward = [&](const std::vector<double>& te, const std::vector<double>& pe) {
    std::vector<double> o(N * C);
    for (int64_t n = 0; n < N; ++n)
      for (int64_t c = 0; c < C; ++c) o[n * C + c] = te[tokens[n] * C + c] + pe[positions[n] * C + c];
    return project(o, R);
  };
  const auto te0 = to_double(wte), pe0 = to_double(wpe);
  auto g_te = numeric_grad([&](const std::vector<double>& te) { return forward(te, pe0); }, te0);
  auto g_pe = numeric_grad([&](const std::vector<double>& pe) { return forward(te0, pe); }, pe0);
  std::vector<float> dwte(V * C, 0.0f), dwpe(P * C, 0.0f);
  embedding_backward(dwte.data(), dwpe.data(), R.data(), tokens.data(), positions.data(), N, C);
  expect_close(dwte, g_te, 1e-5, "dwte");
  expect_close(dwpe, g_pe, 1e-5, "dwpe");
}

TEST(KernelEmbedding, NoPositionEmbeddingAndThreadIndependence) {
  const int64_t V = 50, C = 768, N = 512;
  auto wte = random_floats(V * C, 10), d = random_floats(N * C, 11);
  std::vector<int32_t> tokens(N);
  for (int64_t n = 0; n < N; ++n) tokens[n] = int32_t((n * n + 5) % V);
  std::vector<float> out(N * C);
  embedding_forward(out.data(), tokens.data(), nullptr, wte.data(), nullptr, N, C);
  for (int64_t n = 0; n < N; ++n) ASSERT_EQ(out[n * C + 5], wte[tokens[n] * C + 5]);
  std::vector<float> one(V * C, 0.0f), two(V * C, 0.0f);
  const int saved = omp_get_max_threads();
  omp_set_num_threads(1);
  embedding_backward(one.data(), nullptr, d.data(), tokens.data(), nullptr, N, C);
  omp_set_num_threads(2);
  embedding_backward(two.data(), nullptr, d.data(), tokens.data(), nullptr, N, C);
  omp_set_num_threads(saved);
  EXPECT_EQ(one, two);
}

}  // namespace
}  // namespace lattice
