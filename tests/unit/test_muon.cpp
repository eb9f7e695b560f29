// Muon (--optimizer muon, optim/muon.h): the Newton-Schulz iteration against the same iteration in
// double for every coefficient type, wide and tall, and against values computed independently in
// float64 (numpy); whole steps, plain and Nesterov, against an independent float64 computation; which
// parameters Muon takes; the QKV split against orthogonalizing each piece alone; Adam's parameters
// untouched by Muon's presence; and the errors, each naming its flag.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include "core/error.h"
#include "optim/muon.h"
#include "model/transformer_config.h"
#include "optim/optimizer.h"

namespace lattice {
namespace {

using Matrix = std::vector<double>;  // row-major

// The iteration in double, written as Emerging-Optimizers writes it: normalize, transpose a tall
// matrix, X = a X + (b A + c A A) X with A = X X^T, transpose back.
Matrix reference_ns(Matrix x, int64_t rows, int64_t cols, const std::vector<NsCoefficients>& steps) {
  double norm = 0;
  for (double v : x) norm += v * v;
  norm = std::max(std::sqrt(norm), 1e-7);
  for (double& v : x) v /= norm;
  const bool tall = rows > cols;
  int64_t m = rows, n = cols;
  if (tall) {  // X = X^T
    Matrix t(x.size());
    for (int64_t i = 0; i < rows; ++i)
      for (int64_t j = 0; j < cols; ++j) t[size_t(j * rows + i)] = x[size_t(i * cols + j)];
    x = t;
    std::swap(m, n);
  }
  for (const NsCoefficients& s : steps) {
    Matrix A(size_t(m * m), 0.0), B(size_t(m * m), 0.0), X(x.size(), 0.0);
    for (int64_t i = 0; i < m; ++i)
      for (int64_t j = 0; j < m; ++j)
        for (int64_t k = 0; k < n; ++k) A[size_t(i * m + j)] += x[size_t(i * n + k)] * x[size_t(j * n + k)];
    for (int64_t i = 0; i < m; ++i)
      for (int64_t j = 0; j < m; ++j) {
        double aa = 0;
        for (int64_t k = 0; k < m; ++k) aa += A[size_t(i * m + k)] * A[size_t(k * m + j)];
        B[size_t(i * m + j)] = double(s.b) * A[size_t(i * m + j)] + double(s.c) * aa;
      }
    for (int64_t i = 0; i < m; ++i)
      for (int64_t j = 0; j < n; ++j) {
        double bx = 0;
        for (int64_t k = 0; k < m; ++k) bx += B[size_t(i * m + k)] * x[size_t(k * n + j)];
        X[size_t(i * n + j)] = double(s.a) * x[size_t(i * n + j)] + bx;
      }
    x = X;
  }
  if (tall) {
    Matrix t(x.size());
    for (int64_t i = 0; i < m; ++i)
      for (int64_t j = 0; j < n; ++j) t[size_t(j * m + i)] = x[size_t(i * n + j)];
    x = t;
  }
  return x;
}

std::vector<float> ns(std::vector<float> x, int64_t rows, int64_t cols, const std::vector<NsCoefficients>& steps) {
  MuonWorkspace ws(rows * cols, std::min(rows, cols) * std::min(rows, cols));
  newton_schulz(x.data(), rows, cols, steps, ws);
  return x;
}

std::vector<float> random_matrix(int64_t n, uint32_t seed) {
  std::mt19937 gen(seed);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  std::vector<float> v(static_cast<size_t>(n));
  for (float& x : v) x = nd(gen);
  return v;
}

TEST(Muon, NewtonSchulzIsTheDoubleIterationForEveryCoefficientType) {
  for (const char* type : {"quintic", "simple", "polar_express", "aol"})
    for (auto [rows, cols] : {std::pair<int64_t, int64_t>{5, 8}, {8, 5}, {16, 16}, {1, 7}}) {
      const int64_t steps = std::string(type) == "polar_express" ? 8 : 5;
      const std::vector<NsCoefficients> c = newton_schulz_coefficients(type, steps);
      const std::vector<float> x = random_matrix(rows * cols, uint32_t(rows * 31 + cols));
      const std::vector<float> got = ns(x, rows, cols, c);
      const Matrix want = reference_ns(Matrix(x.begin(), x.end()), rows, cols, c);
      double worst = 0;
      for (size_t i = 0; i < got.size(); ++i) worst = std::max(worst, std::fabs(double(got[i]) - want[i]));
      EXPECT_LT(worst, 2e-5) << type << " " << rows << "x" << cols;
    }
}

TEST(Muon, NewtonSchulzOfASmallMatrixIsTheIndependentValue) {
  // G = [[1,2,3],[4,5,6]], quintic, 5 steps, computed in float64 with numpy (independently of lattice).
  const std::vector<NsCoefficients> c = newton_schulz_coefficients("quintic", 5);
  const std::vector<float> got = ns({1, 2, 3, 4, 5, 6}, 2, 3, c);
  const double want[6] = {-0.591517915, 0.110996901, 0.813511717, 0.707256076, 0.560561912, 0.413867748};
  for (int i = 0; i < 6; ++i) EXPECT_NEAR(got[size_t(i)], want[i], 2e-6) << i;
  // Its transpose iterates as the transpose.
  const std::vector<float> tall = ns({1, 4, 2, 5, 3, 6}, 3, 2, c);
  for (int i = 0; i < 3; ++i)
    for (int j = 0; j < 2; ++j) EXPECT_NEAR(tall[size_t(i * 2 + j)], want[j * 3 + i], 2e-6);
}

TEST(Muon, ScaleFactorsAndCoefficientCycles) {
  EXPECT_DOUBLE_EQ(muon_scale_factor(2, 3, "spectral"), std::sqrt(3.0));
  EXPECT_DOUBLE_EQ(muon_scale_factor(8, 2, "unit_rms_norm"), 2.0);
  EXPECT_DOUBLE_EQ(muon_scale_factor(2, 8, "shape_scaling"), 1.0);
  EXPECT_DOUBLE_EQ(muon_scale_factor(8, 2, "shape_scaling"), 2.0);
  const std::vector<NsCoefficients> q = newton_schulz_coefficients("quintic", 7);
  EXPECT_EQ(q[5].a, q[0].a);  // in turn
  EXPECT_EQ(q[0].a, 4.0848f);
  const std::vector<NsCoefficients> p = newton_schulz_coefficients("polar_express", 10);
  EXPECT_EQ(p[9].a, 1.875f);  // the last repeated
  EXPECT_EQ(p[0].a, 8.2051f);
}

// A buffer with a 2 x 3 weight matrix (Muon's), a bias and the word embedding (Adam's).
struct Model {
  ParamBuffer params;
  Model() {
    params.add("embedding.word_embeddings.weight", {4, 2}, ParamInit::ones, 0);
    params.add("decoder.layers.0.mlp.linear_fc2.weight", {2, 3}, ParamInit::ones, 0);
    params.add("decoder.layers.0.mlp.linear_fc2.bias", {2}, ParamInit::ones, 0);
    params.allocate();
  }
  float* w() { return params.param(1); }
  float* g() { return params.grad(1); }
};

OptimizerConfig muon_config(bool nesterov) {
  OptimizerConfig c;
  c.optimizer = "muon";
  c.muon.momentum = 0.95f;
  c.muon.nesterov = nesterov;
  return c;
}

TEST(Muon, TwoStepsAreTheIndependentValues) {
  // W = [[.5,-.25,.125],[0,1,-1]], lr 0.01, wd 0.1, beta 0.95, spectral scale sqrt(3); gradients
  // [[1,2,3],[4,5,6]] then [[.5,-1,2],[3,0,-2]]: computed in float64 with numpy, independently.
  const float w0[6] = {0.5f, -0.25f, 0.125f, 0.0f, 1.0f, -1.0f};
  const float g1[6] = {1, 2, 3, 4, 5, 6}, g2[6] = {0.5f, -1, 2, 3, 0, -2};
  const double step1[6] = {0.509745391, -0.251672523, 0.110784564, -0.012250035, 0.989290783, -1.0061684};
  const double plain2[6] = {0.511039683, -0.249651212, 0.093324635, -0.026562027, 0.978157008, -1.007970151};
  const double nesterov2[6] = {0.508096077, -0.249193681, 0.093698156, -0.027417196, 0.980636231, -1.00502003};
  for (bool nesterov : {false, true}) {
    Model m;
    Optimizer opt(m.params, muon_config(nesterov));
    std::memcpy(m.w(), w0, sizeof(w0));
    std::memcpy(m.g(), g1, sizeof(g1));
    opt.step(0.01, 0.1);
    for (int i = 0; i < 6; ++i) EXPECT_NEAR(m.w()[i], step1[i], 1e-6) << "step 1, element " << i;
    std::memcpy(m.g(), g2, sizeof(g2));
    opt.step(0.01, 0.1);
    for (int i = 0; i < 6; ++i)
      EXPECT_NEAR(m.w()[i], (nesterov ? nesterov2 : plain2)[i], 1e-6) << "step 2, element " << i << " nesterov "
                                                                        << nesterov;
  }
}

TEST(Muon, TheOtherParametersAreAdams) {
  Model muon, adam;
  for (Model* m : {&muon, &adam})
    for (int64_t i = 0; i < m->params.numel(); ++i) {
      m->params.params()[i] = 0.1f * float(i % 7) - 0.3f;
      m->params.grads()[i] = 0.05f * float(i % 5) - 0.1f;
    }
  OptimizerConfig a;
  Optimizer om(muon.params, muon_config(false)), oa(adam.params, a);
  for (int s = 0; s < 3; ++s) {
    om.step(0.01, 0.1, 0.5f);
    oa.step(0.01, 0.1, 0.5f);
  }
  for (int p : {0, 2}) {
    const ParamInfo& info = muon.params.infos()[size_t(p)];
    EXPECT_EQ(std::memcmp(muon.params.param(p), adam.params.param(p), size_t(info.numel) * sizeof(float)), 0)
        << info.name;
  }
  EXPECT_NE(std::memcmp(muon.w(), adam.w(), 6 * sizeof(float)), 0) << "the matrix is Muon's";
  EXPECT_TRUE(muon_matrix(muon.params.infos()[1]));
  EXPECT_FALSE(muon_matrix(muon.params.infos()[0])) << "the word embedding is Adam's";
  EXPECT_FALSE(muon_matrix(muon.params.infos()[2])) << "a bias is Adam's";
  ParamInfo in_proj = muon.params.infos()[1];
  in_proj.name = "decoder.layers.0.mixer.in_proj.weight";
  EXPECT_FALSE(muon_matrix(in_proj)) << "a Mamba layer's in_proj is Adam's";
  in_proj.name = "decoder.layers.0.mixer.out_proj.weight";
  EXPECT_TRUE(muon_matrix(in_proj)) << "a Mamba layer's out_proj is Muon's";
}

// Muon's matrices keep their momentum and no second moment: the state is 4 bytes per element plus 4 per
// element Adam updates (and Muon's scratch); the second moment exported is Adam's for its parameters
// (the matrix's elements untouched: the checkpoint writes zeros there), and reads back.
TEST(Muon, TheMatricesKeepNoSecondMoment) {
  Model muon, adam;
  for (Model* m : {&muon, &adam})
    for (int64_t i = 0; i < m->params.numel(); ++i) m->params.grads()[i] = 0.05f * float(i % 5) - 0.1f;
  OptimizerConfig a;
  Optimizer om(muon.params, muon_config(false)), oa(adam.params, a);
  om.step(0.01, 0.1);
  oa.step(0.01, 0.1);
  const int64_t n = muon.params.numel(), elements = 4 * 2 + 2 * 3 + 2, matrix = 2 * 3;
  EXPECT_EQ(om.state_bytes() - om.scratch_bytes(), size_t(2 * elements - matrix) * sizeof(float));
  EXPECT_EQ(oa.state_bytes(), size_t(2 * elements) * sizeof(float));
  std::vector<float> v_muon(size_t(n), 7.0f), v_adam(size_t(n), 7.0f);
  om.export_state(2, v_muon.data());
  oa.export_state(2, v_adam.data());
  const ParamInfo& w = muon.params.infos()[1];
  for (int64_t i = 0; i < n; ++i) {
    const bool in_matrix = i >= w.offset && i < w.offset + w.numel;
    if (in_matrix)
      EXPECT_EQ(v_muon[size_t(i)], 7.0f) << i;
    else
      EXPECT_EQ(v_muon[size_t(i)], v_adam[size_t(i)]) << i;
  }
  std::vector<float> loaded(static_cast<size_t>(n)), back(static_cast<size_t>(n), 0.0f);
  for (int64_t i = 0; i < n; ++i) loaded[size_t(i)] = 0.25f + float(i);
  om.import_state(2, loaded.data());
  om.export_state(2, back.data());
  for (const ParamInfo& p : muon.params.infos())  // (the buffer's alignment padding is no parameter's)
    for (int64_t i = p.offset; i < p.offset + p.numel; ++i)
      EXPECT_EQ(back[size_t(i)], &p == &w ? 0.0f : loaded[size_t(i)]) << p.name << " " << i;
}

TEST(Muon, SplitQkvOrthogonalizesEachKindOfRowApart) {
  // 2 query groups of 2 heads of 2 dims: per group 4 query rows, 2 key rows, 2 value rows; 6 columns.
  const int64_t G = 2, D = 2, R = 2, per_group = (R + 2) * D, rows = G * per_group, cols = 6;
  ParamBuffer pb;
  pb.add("decoder.layers.0.self_attention.linear_qkv.weight", {rows, cols}, ParamInit::zeros, 0);
  pb.allocate();
  const std::vector<float> g = random_matrix(rows * cols, 7);
  std::memcpy(pb.grads(), g.data(), g.size() * sizeof(float));
  OptimizerConfig c = muon_config(false);
  c.muon.momentum = 0.0f;  // u = g
  c.muon.qkv_split_rows = {R * D, D, D};
  Optimizer opt(pb, c);
  opt.step(1.0, 0.0);  // W = -NS(g) * scale, piece by piece
  const std::vector<NsCoefficients> steps = newton_schulz_coefficients("quintic", 5);
  int64_t first = 0;
  for (int64_t piece_rows : {R * D, D, D}) {
    std::vector<float> piece;
    for (int64_t grp = 0; grp < G; ++grp)
      for (int64_t r = 0; r < piece_rows; ++r)
        for (int64_t j = 0; j < cols; ++j) piece.push_back(g[size_t((grp * per_group + first + r) * cols + j)]);
    const std::vector<float> o = ns(piece, G * piece_rows, cols, steps);
    const double scale = muon_scale_factor(G * piece_rows, cols, "spectral");
    size_t k = 0;
    for (int64_t grp = 0; grp < G; ++grp)
      for (int64_t r = 0; r < piece_rows; ++r)
        for (int64_t j = 0; j < cols; ++j, ++k)
          EXPECT_NEAR(pb.params()[(grp * per_group + first + r) * cols + j], -o[k] * scale, 1e-5)
              << "piece at row " << first << ", group " << grp;
    first += piece_rows;
  }
}

TEST(Muon, SplitQkvPiecesAreTheLayoutsRowsPerGroup) {
  TransformerConfig c;
  c.num_layers = 1;
  c.hidden_size = 32;
  c.num_attention_heads = 4;
  c.num_query_groups = 2;
  c.kv_channels = 8;
  c.vocab_size = 50;
  c.max_position_embeddings = 16;
  c.finalize();
  EXPECT_EQ(c.qkv_group_rows(), (std::vector<int64_t>{16, 8, 8}));  // per group 2 queries, the key, the value
  c.attention_output_gate = true;
  EXPECT_EQ(c.qkv_group_rows(), (std::vector<int64_t>{16, 16, 8, 8}));  // the gates after the queries
  int64_t rows = 0;
  for (int64_t r : c.qkv_group_rows()) rows += r;
  EXPECT_EQ(rows * c.num_query_groups, c.qkv_width());
}

TEST(Muon, ErrorsNameTheFlag) {
  auto refused = [](const std::function<void()>& f, const std::string& says) {
    try {
      f();
      ADD_FAILURE() << "accepted: " << says;
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(says), std::string::npos) << e.what();
    }
  };
  refused([] { newton_schulz_coefficients("cubic", 5); }, "--muon-coefficient-type");
  refused([] { newton_schulz_coefficients("quintic", 0); }, "--muon-num-ns-steps must be at least 1");
  refused([] { muon_scale_factor(2, 2, "rms"); }, "--muon-scale-mode");
  Model m;
  refused([&] { Optimizer o(m.params, muon_config(false), ElementRanges{{0, 4}}); }, "--use-distributed-optimizer");
  OptimizerConfig bad = muon_config(false);
  bad.muon.momentum = 1.0f;
  refused([&] { Optimizer o(m.params, bad); }, "--muon-momentum must be in [0, 1)");
}

}  // namespace
}  // namespace lattice
