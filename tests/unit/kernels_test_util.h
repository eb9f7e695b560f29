// Helpers for the kernel tests: random data, double-precision finite differences,
// and tolerant comparisons.
#pragma once
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include "blas/gemm.h"

namespace lattice::kernel_test {

inline std::vector<float> random_floats(size_t n, uint32_t seed, float lo = -1.0f, float hi = 1.0f) {
  std::mt19937 gen(seed);
  std::uniform_real_distribution<float> dist(lo, hi);
  std::vector<float> v(n);
  for (float& x : v) x = dist(gen);
  return v;
}

// Whether a and b hold the same values bit for bit (NaN patterns and signed zeros included).
template <class T>
bool same_bits(const std::vector<T>& a, const std::vector<T>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(T)) == 0;
}

inline std::vector<double> to_double(const std::vector<float>& v) {
  return std::vector<double>(v.begin(), v.end());
}

// Central differences of a scalar function of x, at the coordinates `which` (all
// when empty). f is evaluated in double.
inline std::vector<double> numeric_grad(const std::function<double(const std::vector<double>&)>& f,
                                        std::vector<double> x, const std::vector<size_t>& which = {},
                                        double eps = 1e-5) {
  std::vector<double> g(x.size(), 0.0);
  auto one = [&](size_t i) {
    const double x0 = x[i];
    x[i] = x0 + eps;
    const double fp = f(x);
    x[i] = x0 - eps;
    const double fm = f(x);
    x[i] = x0;
    g[i] = (fp - fm) / (2 * eps);
  };
  if (which.empty())
    for (size_t i = 0; i < x.size(); ++i) one(i);
  else
    for (size_t i : which) one(i);
  return g;
}

// sum(out * R) in double: the scalar whose gradient w.r.t. out is R.
inline double project(const std::vector<double>& out, const std::vector<float>& R) {
  double s = 0.0;
  for (size_t i = 0; i < out.size(); ++i) s += out[i] * double(R[i]);
  return s;
}

// |actual - expected| <= tol * (1 + |expected|) for every element (or those in `which`).
inline void expect_close(const std::vector<float>& actual, const std::vector<double>& expected,
                         double tol, const std::string& what, const std::vector<size_t>& which = {}) {
  ASSERT_EQ(actual.size(), expected.size()) << what;
  int failures = 0;
  auto one = [&](size_t i) {
    const double err = std::fabs(double(actual[i]) - expected[i]);
    if (!(err <= tol * (1.0 + std::fabs(expected[i]))) && ++failures <= 5)
      ADD_FAILURE() << what << "[" << i << "]: got " << actual[i] << ", expected " << expected[i];
  };
  if (which.empty())
    for (size_t i = 0; i < actual.size(); ++i) one(i);
  else
    for (size_t i : which) one(i);
  EXPECT_EQ(failures, 0) << what;
}

// `count` distinct-ish random indices below n (all of them when n <= count).
inline std::vector<size_t> sample_indices(size_t n, size_t count, uint32_t seed) {
  std::vector<size_t> idx;
  if (n <= count) {
    for (size_t i = 0; i < n; ++i) idx.push_back(i);
    return idx;
  }
  std::mt19937 gen(seed);
  std::uniform_int_distribution<size_t> dist(0, n - 1);
  for (size_t k = 0; k < count; ++k) idx.push_back(dist(gen));
  return idx;
}

// Runs body(path) once per bf16 GEMM path this CPU can take (oneDNN's bf16 matmul needs
// AVX512-BF16), with gemm_bf16 held to it, then restores the default path.
template <class Body>
void for_each_bf16_gemm_path(const Body& body) {
  for (Bf16GemmPath path : {Bf16GemmPath::onednn_bf16, Bf16GemmPath::fp32_widened}) {
    if (!gemm_bf16_path_supported(path)) continue;
    SCOPED_TRACE(path == Bf16GemmPath::onednn_bf16 ? "gemm_bf16: oneDNN bf16 matmul" : "gemm_bf16: widened fp32");
    gemm_bf16_force_path(path);
    body(path);
  }
  gemm_bf16_use_default_path();
}

}  // namespace lattice::kernel_test
