// Mamba-2's kernels (kernels/mamba.h): the convolution, dt, the scan and the gated grouped RMSNorm, chained
// as the model chains them, against a double-precision reference written from the header's definitions (the
// convolution tap by tap, the state S [P, N] of each (sequence, head) token by token, the norm group by
// group); their backward against finite differences of that reference, the accumulated gradients added to
// what was there; the results the same up to rounding whatever the checkpoint spacing (the CPU scan's chunk);
// long sequences with slow and fast decays; with document ids, against the reference restarting at each
// document and against the documents run as sequences of their own; and the shape check.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <limits>
#include <string>
#include <utility>
#include <vector>

#include "core/error.h"
#include "kernels/mamba.h"
#include "kernels_test_util.h"

namespace lattice {
namespace {

using kernel_test::expect_close;
using kernel_test::numeric_grad;
using kernel_test::project;
using kernel_test::random_floats;
using kernel_test::to_double;

struct Inputs {
  std::vector<double> x;                  // [rows, W]: z [HP], x [HP], B [GN], C [GN], dt [H]
  std::vector<double> w, bias;            // the convolution's [Cc, K] and [Cc]
  std::vector<double> dt_bias, A_log, D;  // [H]
  std::vector<double> norm_w;             // [HP]
};

double silu(double v) { return v / (1.0 + std::exp(-v)); }
double softplus(double v) { return std::log1p(std::exp(v)); }

// out [rows, HP] from the in_proj output x, in double, from the header's definitions (the layout's offsets
// from H, P, G, N, not MambaShape's helpers); with s.documents each document from a zero state, its
// convolution reading none of the rows before it. before: each (sequence, head)'s state before each token
// [B, H, T, P, N] (after a document's reset).
std::vector<double> reference(const Inputs& in, const MambaShape& s, std::vector<double>* before = nullptr) {
  const int64_t B = s.B, T = s.T, H = s.H, P = s.P, G = s.G, Ns = s.N, K = s.K, rows = B * T;
  const int64_t I = H * P, Cc = I + 2 * G * Ns, W = I + Cc + H;
  const int64_t x_col = I, dt_col = I + Cc;  // in x's row: z at 0, then x, B, C, dt
  const int64_t b_col = I, c_col = I + G * Ns;  // in u's row: xs at 0, then B, C
  auto document = [&](int64_t n) { return s.documents ? s.documents[n] : 0; };
  // u = silu(bias + sum_j w[c, j] x[t - K + 1 + j]), the rows before the sequence's or document's start 0.
  std::vector<double> u(size_t(rows * Cc));
  for (int64_t n = 0; n < rows; ++n)
    for (int64_t c = 0; c < Cc; ++c) {
      double acc = in.bias[size_t(c)];
      for (int64_t j = 0; j < K; ++j) {
        const int64_t m = n - K + 1 + j;
        if (n % T - K + 1 + j < 0 || document(m) != document(n)) continue;
        acc += in.w[size_t(c * K + j)] * in.x[size_t(m * W + x_col + c)];
      }
      u[size_t(n * Cc + c)] = silu(acc);
    }
  // The scan, y [rows, H, P].
  std::vector<double> y(size_t(rows * I));
  if (before) before->assign(size_t(B * H * T * P * Ns), 0.0);
  for (int64_t b = 0; b < B; ++b)
    for (int64_t h = 0; h < H; ++h) {
      const int64_t g = h / (H / G);
      const double A = -std::exp(in.A_log[size_t(h)]);
      std::vector<double> S(size_t(P * Ns), 0.0);  // [P, N]
      for (int64_t t = 0; t < T; ++t) {
        const int64_t n = b * T + t;
        if (t > 0 && document(n) != document(n - 1)) std::fill(S.begin(), S.end(), 0.0);
        if (before) std::copy(S.begin(), S.end(), before->begin() + ((b * H + h) * T + t) * P * Ns);
        const double dt = softplus(in.x[size_t(n * W + dt_col + h)] + in.dt_bias[size_t(h)]);
        const double decay = std::exp(dt * A);
        const double* un = u.data() + n * Cc;
        for (int64_t p = 0; p < P; ++p) {
          const double xs = un[h * P + p];
          double out = 0;
          for (int64_t m = 0; m < Ns; ++m) {
            double& e = S[size_t(p * Ns + m)];
            e = decay * e + dt * xs * un[b_col + g * Ns + m];
            out += e * un[c_col + g * Ns + m];
          }
          y[size_t(n * I + h * P + p)] = out + in.D[size_t(h)] * xs;
        }
      }
    }
  // out = w v / sqrt(mean over the group of v^2 + eps), v = y silu(z), groups of HP / G.
  const int64_t Dg = I / G;
  std::vector<double> out(size_t(rows * I));
  for (int64_t n = 0; n < rows; ++n)
    for (int64_t g = 0; g < G; ++g) {
      std::vector<double> v(static_cast<size_t>(Dg));
      double ss = 0;
      for (int64_t d = 0; d < Dg; ++d) {
        const int64_t c = g * Dg + d;
        v[size_t(d)] = y[size_t(n * I + c)] * silu(in.x[size_t(n * W + c)]);
        ss += v[size_t(d)] * v[size_t(d)];
      }
      const double r = 1.0 / std::sqrt(ss / double(Dg) + double(s.norm_eps));
      for (int64_t d = 0; d < Dg; ++d) out[size_t(n * I + g * Dg + d)] = in.norm_w[size_t(g * Dg + d)] * v[size_t(d)] * r;
    }
  return out;
}

std::vector<float> to_float(const std::vector<double>& v) { return std::vector<float>(v.begin(), v.end()); }

// The accumulated gradients' starting values (0.5 to 1.5: a kernel that wrote instead of adding is off by
// at least 0.5).
struct Grads {
  std::vector<float> dw, dbias, d_dt_bias, dA_log, dD, dnorm_w;
};
Grads starting_grads(const MambaShape& s) {
  Grads g;
  g.dw = random_floats(size_t(s.conv() * s.K), 901, 0.5f, 1.5f);
  g.dbias = random_floats(size_t(s.conv()), 902, 0.5f, 1.5f);
  g.d_dt_bias = random_floats(size_t(s.H), 903, 0.5f, 1.5f);
  g.dA_log = random_floats(size_t(s.H), 904, 0.5f, 1.5f);
  g.dD = random_floats(size_t(s.H), 905, 0.5f, 1.5f);
  g.dnorm_w = random_floats(size_t(s.inner()), 906, 0.5f, 1.5f);
  return g;
}

struct MambaRun {
  std::vector<float> out, checkpoints;
  std::vector<float> dx;  // written
  Grads grads;            // accumulated onto starting_grads
};

// The forward and (with R, the output's gradient) the backward, chained as the model does. The written
// gradients' buffers start as NaN: a value a kernel leaves unwritten fails every comparison.
MambaRun run_kernels(const Inputs& in, const MambaShape& s, const std::vector<float>* R) {
  const int64_t rows = s.rows();
  const std::vector<float> x = to_float(in.x), w = to_float(in.w), bias = to_float(in.bias),
                           dt_bias = to_float(in.dt_bias), A_log = to_float(in.A_log), D = to_float(in.D),
                           norm_w = to_float(in.norm_w);
  std::vector<float> u(size_t(rows * s.conv())), dt(size_t(rows * s.H)), y(size_t(rows * s.inner())),
      rstd(size_t(rows * s.G));
  MambaRun r;
  r.out.assign(y.size(), 0.0f);
  r.checkpoints.assign(size_t(s.B * s.H * s.chunks() * s.state()), 0.0f);
  mamba_conv_forward(u.data(), x.data(), w.data(), bias.data(), s);
  mamba_dt_forward(dt.data(), x.data(), dt_bias.data(), s);
  mamba_scan_forward(y.data(), r.checkpoints.data(), u.data(), dt.data(), A_log.data(), D.data(), s);
  mamba_gated_norm_forward(r.out.data(), rstd.data(), y.data(), x.data(), norm_w.data(), s);
  if (!R) return r;
  const float nan = std::numeric_limits<float>::quiet_NaN();
  std::vector<float> dy(y.size(), nan), du(u.size(), nan), d_dt(dt.size(), nan);
  r.dx.assign(x.size(), nan);
  r.grads = starting_grads(s);
  Grads& g = r.grads;
  mamba_gated_norm_backward(dy.data(), r.dx.data(), g.dnorm_w.data(), R->data(), y.data(), x.data(), norm_w.data(),
                            rstd.data(), s);
  mamba_scan_backward(du.data(), d_dt.data(), g.dA_log.data(), g.dD.data(), nullptr, dy.data(), r.checkpoints.data(),
                      u.data(), dt.data(), A_log.data(), D.data(), s);
  mamba_dt_backward(r.dx.data(), g.d_dt_bias.data(), d_dt.data(), x.data(), dt_bias.data(), s);
  mamba_conv_backward(r.dx.data(), g.dw.data(), g.dbias.data(), du.data(), x.data(), w.data(), bias.data(), s);
  return r;
}

// Two sequences of 19 tokens, 4 heads of 3 in 2 groups (heads 0, 1 read group 0's B and C; 2, 3 group 1's),
// state dim 5, kernel width 4: W = 12 + 32 + 4 = 48 columns.
MambaShape small_shape(int64_t chunk) {
  MambaShape s;
  s.B = 2;
  s.T = 19;
  s.H = 4;
  s.P = 3;
  s.G = 2;
  s.N = 5;
  s.K = 4;
  s.chunk = chunk;
  return s;
}

// Every value O(1); dt = softplus(x's dt + dt_bias) in about 0.05 .. 0.47 and exp(A_log) in 1 .. 4, so the
// decays exp(dt A) lie in about 0.15 .. 0.95.
Inputs random_inputs(const MambaShape& s, uint32_t seed) {
  Inputs in;
  in.x = to_double(random_floats(size_t(s.rows() * s.width()), seed, -1.0f, 1.0f));
  for (int64_t n = 0; n < s.rows(); ++n)
    for (int64_t h = 0; h < s.H; ++h) in.x[size_t(n * s.width() + s.dt_at() + h)] *= 0.5;
  in.w = to_double(random_floats(size_t(s.conv() * s.K), seed + 1, -0.6f, 0.6f));
  in.bias = to_double(random_floats(size_t(s.conv()), seed + 2, -0.5f, 0.5f));
  in.dt_bias = to_double(random_floats(size_t(s.H), seed + 3, -2.5f, -1.0f));
  in.A_log = to_double(random_floats(size_t(s.H), seed + 4, 1.0f, 4.0f));
  for (double& v : in.A_log) v = double(float(std::log(v)));  // the values the kernels see
  in.D = to_double(random_floats(size_t(s.H), seed + 5, 0.5f, 1.5f));
  in.norm_w = to_double(random_floats(size_t(s.inner()), seed + 6, 0.5f, 1.5f));
  return in;
}

// Sequence 0: documents from tokens 7, 9 (a document of 2 tokens, shorter than the convolution's reach) and
// 16 (with chunks of 8, a chunk's first token); sequence 1 one document, its id that of sequence 0's last.
const std::vector<int32_t> kDocuments = {0, 0, 0, 0, 0, 0, 0, 1, 1, 2, 2, 2, 2, 2, 2, 2, 3, 3, 3,
                                         3, 3, 3, 3, 3, 3, 3, 3, 3, 3, 3, 3, 3, 3, 3, 3, 3, 3, 3};

TEST(MambaKernels, ForwardMatchesTheDefinition) {
  const MambaShape s = small_shape(8);  // chunks of 8, 8 and 3 tokens
  const Inputs in = random_inputs(s, 11);
  // The inputs exercise the decay: exp(dt A) neither near 0 nor near 1.
  double lo = 1, hi = 0;
  for (int64_t n = 0; n < s.rows(); ++n)
    for (int64_t h = 0; h < s.H; ++h) {
      const double a = std::exp(-std::exp(in.A_log[size_t(h)]) *
                                softplus(in.x[size_t(n * s.width() + s.dt_at() + h)] + in.dt_bias[size_t(h)]));
      lo = std::min(lo, a);
      hi = std::max(hi, a);
    }
  EXPECT_GT(lo, 0.05);
  EXPECT_LT(hi, 0.98);
  EXPECT_LT(lo, 0.5);
  std::vector<double> before;
  const std::vector<double> expected = reference(in, s, &before);
  const MambaRun r = run_kernels(in, s, nullptr);
  expect_close(r.out, expected, 2e-6, "out");
  // The checkpoints [B, H, chunks, P, N]: each chunk's starting state (zeros for the first).
  const int64_t S = s.state();
  std::vector<double> checkpoints(r.checkpoints.size());
  for (int64_t bh = 0; bh < s.B * s.H; ++bh)
    for (int64_t c = 0; c < s.chunks(); ++c)
      std::copy_n(before.begin() + (bh * s.T + c * s.chunk) * S, S, checkpoints.begin() + (bh * s.chunks() + c) * S);
  expect_close(r.checkpoints, checkpoints, 2e-6, "checkpoints");
}

// The reference's output projected on R as a function of one of the inputs (the others in's), for numeric_grad.
struct ReferenceLoss {
  const Inputs& in;
  const MambaShape& s;
  const std::vector<float>& R;
  std::function<double(const std::vector<double>&)> operator()(std::vector<double> Inputs::*field) const {
    return [this, field](const std::vector<double>& v) {
      Inputs m = in;
      m.*field = v;
      return project(reference(m, s), R);
    };
  }
};

// An accumulated gradient's expected value: its starting value a plus the added part g.
std::vector<double> plus(const std::vector<float>& a, std::vector<double> g) {
  for (size_t i = 0; i < g.size(); ++i) g[i] += double(a[i]);
  return g;
}

// The kernels' gradients of every input (projected on R) against finite differences of the reference; the
// accumulated ones against their starting values plus those.
MambaRun expect_gradients_match_finite_differences(const Inputs& in, const MambaShape& s, const std::vector<float>& R,
                                                   double tol) {
  const MambaRun r = run_kernels(in, s, &R);
  const Grads start = starting_grads(s);
  const ReferenceLoss loss_of{in, s, R};
  expect_close(r.dx, numeric_grad(loss_of(&Inputs::x), in.x), tol, "dx (z, x, B, C and dt columns)");
  expect_close(r.grads.dw, plus(start.dw, numeric_grad(loss_of(&Inputs::w), in.w)), tol, "dw");
  expect_close(r.grads.dbias, plus(start.dbias, numeric_grad(loss_of(&Inputs::bias), in.bias)), tol, "dbias");
  expect_close(r.grads.d_dt_bias, plus(start.d_dt_bias, numeric_grad(loss_of(&Inputs::dt_bias), in.dt_bias)), tol,
               "d_dt_bias");
  expect_close(r.grads.dA_log, plus(start.dA_log, numeric_grad(loss_of(&Inputs::A_log), in.A_log)), tol, "dA_log");
  expect_close(r.grads.dD, plus(start.dD, numeric_grad(loss_of(&Inputs::D), in.D)), tol, "dD");
  expect_close(r.grads.dnorm_w, plus(start.dnorm_w, numeric_grad(loss_of(&Inputs::norm_w), in.norm_w)), tol,
               "d norm weight");
  return r;
}

TEST(MambaKernels, BackwardMatchesFiniteDifferences) {
  const MambaShape s = small_shape(8);
  const Inputs in = random_inputs(s, 21);
  expect_gradients_match_finite_differences(in, s, random_floats(size_t(s.rows() * s.inner()), 22), 2e-5);
}

// Expects actual and expected the same up to rounding: every element within tol times the largest magnitude
// of expected's.
void expect_same_up_to_rounding(const std::vector<float>& actual, const std::vector<float>& expected, double tol,
                                const std::string& what) {
  ASSERT_EQ(actual.size(), expected.size()) << what;
  double scale = 0, worst = 0;
  for (size_t i = 0; i < expected.size(); ++i) {
    scale = std::max(scale, std::fabs(double(expected[i])));
    const double err = std::fabs(double(actual[i]) - double(expected[i]));
    if (!(err <= worst)) worst = err;  // a NaN stays, and fails below
  }
  EXPECT_TRUE(worst <= tol * scale) << what << ": differs by " << worst << " against a largest magnitude of "
                                    << scale;
}

// The chunk spaces the checkpoints and is the CPU scan's chunk length (its closed-form chunks, kernels/cpu/
// mamba.cpp): the same function whatever it is, only rounded differently, so every result agrees within 1e-6
// of its largest magnitude (chunks of 1 token against 5, 8, T and more than T), with and without documents.
TEST(MambaKernels, CheckpointSpacingChangesOnlyRounding) {
  constexpr double kTol = 1e-6;
  for (const int32_t* documents : std::vector<const int32_t*>{nullptr, kDocuments.data()}) {
    MambaShape base = small_shape(1);
    base.documents = documents;
    const Inputs in = random_inputs(base, 31);
    const std::vector<float> R = random_floats(size_t(base.rows() * base.inner()), 32);
    const MambaRun one = run_kernels(in, base, &R);
    for (int64_t chunk : {5, 8, 19, 64}) {
      MambaShape s = small_shape(chunk);
      s.documents = documents;
      const MambaRun other = run_kernels(in, s, &R);
      const std::string what = std::string(documents ? "documents, " : "") + "chunk " + std::to_string(chunk);
      expect_same_up_to_rounding(other.out, one.out, kTol, "out, " + what);
      expect_same_up_to_rounding(other.dx, one.dx, kTol, "dx, " + what);
      expect_same_up_to_rounding(other.grads.dw, one.grads.dw, kTol, "dw, " + what);
      expect_same_up_to_rounding(other.grads.dbias, one.grads.dbias, kTol, "dbias, " + what);
      expect_same_up_to_rounding(other.grads.d_dt_bias, one.grads.d_dt_bias, kTol, "d_dt_bias, " + what);
      expect_same_up_to_rounding(other.grads.dA_log, one.grads.dA_log, kTol, "dA_log, " + what);
      expect_same_up_to_rounding(other.grads.dD, one.grads.dD, kTol, "dD, " + what);
      expect_same_up_to_rounding(other.grads.dnorm_w, one.grads.dnorm_w, kTol, "d norm weight, " + what);
    }
  }
}

// Sequences of 150 tokens in chunks of 64 (64, 64 and 22 tokens) with decays from slow to fast: head 0's
// exp(dt A) about 0.999 (a chunk's decays near 1), head 1's about 0.9, head 2's about 0.2 and head 3's below
// 1e-6 (most of a chunk's decays underflow to 0); sequence 1 with documents from token 64 (a chunk's first) and
// 100 (inside a chunk). The forward against the definition, the backward against finite differences (a sample
// of dx, every other gradient).
TEST(MambaKernels, LongSequencesWithSlowAndFastDecays) {
  MambaShape s = small_shape(64);
  s.T = 150;
  std::vector<int32_t> documents(size_t(s.rows()), 0);
  for (int64_t t = 0; t < s.T; ++t) documents[size_t(s.T + t)] = t < 64 ? 1 : t < 100 ? 2 : 3;
  s.documents = documents.data();
  Inputs in = random_inputs(s, 91);
  const double dt_bias[4] = {-4.5, -2.0, 0.0, 2.0}, A[4] = {0.1, 1.0, 2.0, 8.0};
  for (int64_t h = 0; h < s.H; ++h) {
    in.dt_bias[size_t(h)] = dt_bias[h];
    in.A_log[size_t(h)] = double(float(std::log(A[h])));
  }
  double slowest = 0, fastest = 1;
  for (int64_t n = 0; n < s.rows(); ++n)
    for (int64_t h = 0; h < s.H; ++h) {
      const double a = std::exp(-std::exp(in.A_log[size_t(h)]) *
                                softplus(in.x[size_t(n * s.width() + s.dt_at() + h)] + in.dt_bias[size_t(h)]));
      slowest = std::max(slowest, a);
      fastest = std::min(fastest, a);
    }
  EXPECT_GT(slowest, 0.998);
  EXPECT_LT(fastest, 1e-6);
  std::vector<double> before;
  const std::vector<double> expected = reference(in, s, &before);
  const MambaRun r = run_kernels(in, s, nullptr);
  expect_close(r.out, expected, 2e-6, "out");
  // The checkpoints but those before a document's first token (the state it forgets, which `before` lacks).
  const int64_t S = s.state();
  std::vector<double> checkpoints(r.checkpoints.size());
  std::vector<size_t> kept;
  for (int64_t bh = 0; bh < s.B * s.H; ++bh)
    for (int64_t c = 0; c < s.chunks(); ++c) {
      std::copy_n(before.begin() + (bh * s.T + c * s.chunk) * S, S, checkpoints.begin() + (bh * s.chunks() + c) * S);
      if (s.starts_document(bh / s.H * s.T + c * s.chunk)) continue;
      for (int64_t i = 0; i < S; ++i) kept.push_back(size_t((bh * s.chunks() + c) * S + i));
    }
  ASSERT_EQ(kept.size(), size_t((s.B * s.chunks() - 1) * s.H * S));
  expect_close(r.checkpoints, checkpoints, 2e-6, "checkpoints", kept);

  const std::vector<float> R = random_floats(size_t(s.rows() * s.inner()), 92);
  const MambaRun g = run_kernels(in, s, &R);
  const Grads start = starting_grads(s);
  const ReferenceLoss loss_of{in, s, R};
  // dx at a sample of rows' x, B, C and dt columns (the scan's inputs; the z columns go only to the norm).
  std::vector<size_t> which;
  for (size_t i : kernel_test::sample_indices(size_t(s.rows()), 24, 93))
    for (int64_t c = s.x_at(); c < s.width(); c += 3) which.push_back(i * size_t(s.width()) + size_t(c));
  expect_close(g.dx, numeric_grad(loss_of(&Inputs::x), in.x, which), 2e-5, "dx (sampled)", which);
  expect_close(g.grads.d_dt_bias, plus(start.d_dt_bias, numeric_grad(loss_of(&Inputs::dt_bias), in.dt_bias)), 2e-5,
               "d_dt_bias");
  expect_close(g.grads.dA_log, plus(start.dA_log, numeric_grad(loss_of(&Inputs::A_log), in.A_log)), 2e-5, "dA_log");
  expect_close(g.grads.dD, plus(start.dD, numeric_grad(loss_of(&Inputs::D), in.D)), 2e-5, "dD");
}

TEST(MambaKernels, DocumentsMatchTheDefinitionAndFiniteDifferences) {
  MambaShape s = small_shape(8);
  s.documents = kDocuments.data();
  const Inputs in = random_inputs(s, 71);
  const std::vector<double> expected = reference(in, s);
  expect_close(run_kernels(in, s, nullptr).out, expected, 2e-6, "out");
  expect_gradients_match_finite_differences(in, s, random_floats(size_t(s.rows() * s.inner()), 72), 2e-5);
  // The documents change the result (the test can fail): without them the rows after a start differ.
  const std::vector<float> plain = run_kernels(in, small_shape(8), nullptr).out;
  double most = 0;
  for (size_t i = 0; i < plain.size(); ++i) most = std::max(most, std::fabs(plain[i] - expected[i]));
  EXPECT_GT(most, 1e-2);
}

// Each document run as a sequence of its own (B 1, T its length): its output rows and input gradient rows
// are the packed run's, and the parameters' gradients (each run's additions) sum to the packed run's.
TEST(MambaKernels, DocumentsMatchSeparateSequences) {
  MambaShape s = small_shape(8);
  s.documents = kDocuments.data();
  const Inputs in = random_inputs(s, 81);
  const std::vector<float> R = random_floats(size_t(s.rows() * s.inner()), 82);
  const MambaRun packed = run_kernels(in, s, &R);
  // The documents' [first, end) rows: a new one at each sequence's start and each change of id.
  std::vector<std::pair<int64_t, int64_t>> parts;
  for (int64_t n = 0; n < s.rows(); ++n)
    if (n % s.T == 0 || kDocuments[size_t(n)] != kDocuments[size_t(n - 1)]) {
      parts.emplace_back(n, n + 1);
    } else {
      parts.back().second = n + 1;
    }
  ASSERT_EQ(parts.size(), 5u);
  const int64_t W = s.width(), I = s.inner();
  const Grads start = starting_grads(s);
  std::vector<double> out(packed.out.size()), dx(packed.dx.size());
  Grads sum = start;
  auto add = [](std::vector<float>& total, const std::vector<float>& run, const std::vector<float>& from) {
    for (size_t i = 0; i < total.size(); ++i) total[i] += run[i] - from[i];
  };
  for (const auto& [first, end] : parts) {
    MambaShape one = small_shape(8);
    one.B = 1;
    one.T = end - first;
    Inputs part = in;
    part.x.assign(in.x.begin() + first * W, in.x.begin() + end * W);
    const std::vector<float> Rd(R.begin() + first * I, R.begin() + end * I);
    const MambaRun alone = run_kernels(part, one, &Rd);
    std::copy(alone.out.begin(), alone.out.end(), out.begin() + first * I);
    std::copy(alone.dx.begin(), alone.dx.end(), dx.begin() + first * W);
    add(sum.dw, alone.grads.dw, start.dw);
    add(sum.dbias, alone.grads.dbias, start.dbias);
    add(sum.d_dt_bias, alone.grads.d_dt_bias, start.d_dt_bias);
    add(sum.dA_log, alone.grads.dA_log, start.dA_log);
    add(sum.dD, alone.grads.dD, start.dD);
    add(sum.dnorm_w, alone.grads.dnorm_w, start.dnorm_w);
  }
  // A document's first step scales a state of zeros alone or a forgotten one (by 0) packed; the CPU scan's
  // chunks (kernels/cpu/mamba.cpp) cut a document at other tokens packed than alone, which changes only the
  // rounding (measured: the rows agree within 1e-8 (1 + |value|)).
  expect_close(packed.out, out, 1e-7, "out");
  expect_close(packed.dx, dx, 1e-7, "dx");
  expect_close(packed.grads.dw, to_double(sum.dw), 5e-6, "dw");
  expect_close(packed.grads.dbias, to_double(sum.dbias), 5e-6, "dbias");
  expect_close(packed.grads.d_dt_bias, to_double(sum.d_dt_bias), 5e-6, "d_dt_bias");
  expect_close(packed.grads.dA_log, to_double(sum.dA_log), 5e-6, "dA_log");
  expect_close(packed.grads.dD, to_double(sum.dD), 5e-6, "dD");
  expect_close(packed.grads.dnorm_w, to_double(sum.dnorm_w), 5e-6, "d norm weight");
}

// Decoding's carried state (mamba_scan_forward's state): each sequence scanned in pieces of 5, 7 and 7 tokens
// (chunks of 4: a piece's state crosses chunks inside it too), each piece from the state the one before left,
// gives the one-piece scan's outputs and final states; a state of zeros changes nothing, bit for bit.
TEST(MambaKernels, CarriedStateContinuesTheScan) {
  const MambaShape s = small_shape(8);
  const Inputs in = random_inputs(s, 91);
  const int64_t rows = s.rows(), Cc = s.conv(), H = s.H, I = s.inner();
  const std::vector<float> x = to_float(in.x), w = to_float(in.w), bias = to_float(in.bias),
                           dt_bias = to_float(in.dt_bias), A_log = to_float(in.A_log), D = to_float(in.D);
  std::vector<float> u(size_t(rows * Cc)), dt(size_t(rows * H));
  mamba_conv_forward(u.data(), x.data(), w.data(), bias.data(), s);
  mamba_dt_forward(dt.data(), x.data(), dt_bias.data(), s);
  std::vector<float> plain(size_t(rows * I)), whole(plain.size()), whole_state(size_t(s.B * H * s.state()), 0.0f);
  mamba_scan_forward(plain.data(), nullptr, u.data(), dt.data(), A_log.data(), D.data(), s);
  mamba_scan_forward(whole.data(), nullptr, u.data(), dt.data(), A_log.data(), D.data(), s, whole_state.data());
  EXPECT_EQ(plain, whole);
  // The pieces: rows [t0, t1) of each sequence, gathered into a shape of B sequences of t1 - t0 tokens.
  std::vector<float> pieces(plain.size()), state(whole_state.size(), 0.0f), last_alone;
  for (const auto& [t0, t1] : std::vector<std::pair<int64_t, int64_t>>{{0, 5}, {5, 12}, {12, 19}}) {
    MambaShape p = s;
    p.T = t1 - t0;
    p.chunk = 4;
    std::vector<float> pu, pdt, py(size_t(p.rows() * I));
    for (int64_t b = 0; b < s.B; ++b) {
      pu.insert(pu.end(), u.begin() + (b * s.T + t0) * Cc, u.begin() + (b * s.T + t1) * Cc);
      pdt.insert(pdt.end(), dt.begin() + (b * s.T + t0) * H, dt.begin() + (b * s.T + t1) * H);
    }
    if (t0 == 12) {  // the last piece from zeros instead: the carried state matters
      std::vector<float> zeros(state.size(), 0.0f);
      last_alone.resize(py.size());
      mamba_scan_forward(last_alone.data(), nullptr, pu.data(), pdt.data(), A_log.data(), D.data(), p, zeros.data());
    }
    mamba_scan_forward(py.data(), nullptr, pu.data(), pdt.data(), A_log.data(), D.data(), p, state.data());
    for (int64_t b = 0; b < s.B; ++b)
      std::copy(py.begin() + b * p.T * I, py.begin() + (b + 1) * p.T * I, pieces.begin() + (b * s.T + t0) * I);
    if (t0 == 12) {
      double most = 0;
      for (int64_t b = 0; b < s.B; ++b)
        for (int64_t i = 0; i < p.T * I; ++i)
          most = std::max(most, double(std::fabs(last_alone[size_t(b * p.T * I + i)] -
                                                 whole[size_t((b * s.T + t0) * I + i)])));
      EXPECT_GT(most, 1e-2);
    }
  }
  expect_close(pieces, to_double(whole), 1e-6, "y by pieces");
  expect_close(state, to_double(whole_state), 1e-6, "final state by pieces");
}

// Expects f to throw lattice::Error whose message names `what`.
void expect_error_naming(const std::function<void()>& f, const std::string& what, const std::string& shape) {
  try {
    f();
    ADD_FAILURE() << what << " accepted " << shape;
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(what), std::string::npos) << shape << ": " << e.what();
  }
}

TEST(MambaKernels, BadShapesAreRefusedNamingTheKernel) {
  EXPECT_NO_THROW(mamba_check_shape(small_shape(8), "mamba_test"));
  std::vector<std::pair<std::string, MambaShape>> bad;
  auto add = [&](const std::string& why, auto change) {
    MambaShape s = small_shape(8);
    change(s);
    bad.emplace_back(why, s);
  };
  add("H 3 of G 2", [](MambaShape& s) { s.H = 3; });
  add("H 4 of G 3", [](MambaShape& s) { s.G = 3; });
  add("G 8 over H 4", [](MambaShape& s) { s.G = 8; });
  add("B 0", [](MambaShape& s) { s.B = 0; });
  add("T 0", [](MambaShape& s) { s.T = 0; });
  add("H 0", [](MambaShape& s) { s.H = 0; });
  add("P 0", [](MambaShape& s) { s.P = 0; });
  add("G 0", [](MambaShape& s) { s.G = 0; });
  add("N 0", [](MambaShape& s) { s.N = 0; });
  add("K 0", [](MambaShape& s) { s.K = 0; });
  add("chunk 0", [](MambaShape& s) { s.chunk = 0; });
  add("T -1", [](MambaShape& s) { s.T = -1; });
  for (const auto& [why, s] : bad) {
    expect_error_naming([&] { mamba_check_shape(s, "mamba_test"); }, "mamba_test", why);
    // Each kernel checks before it touches a buffer (null here).
    expect_error_naming([&] { mamba_conv_forward(nullptr, nullptr, nullptr, nullptr, s); }, "mamba_conv_forward", why);
    expect_error_naming([&] { mamba_conv_backward(nullptr, nullptr, nullptr, nullptr, nullptr, nullptr, nullptr, s); },
                        "mamba_conv_backward", why);
    expect_error_naming([&] { mamba_dt_forward(nullptr, nullptr, nullptr, s); }, "mamba_dt_forward", why);
    expect_error_naming([&] { mamba_dt_backward(nullptr, nullptr, nullptr, nullptr, nullptr, s); }, "mamba_dt_backward",
                        why);
    expect_error_naming([&] { mamba_scan_forward(nullptr, nullptr, nullptr, nullptr, nullptr, nullptr, s); },
                        "mamba_scan_forward", why);
    expect_error_naming(
        [&] {
          mamba_scan_backward(nullptr, nullptr, nullptr, nullptr, nullptr, nullptr, nullptr, nullptr, nullptr, nullptr,
                              nullptr, s);
        },
        "mamba_scan_backward", why);
    expect_error_naming([&] { mamba_gated_norm_forward(nullptr, nullptr, nullptr, nullptr, nullptr, s); },
                        "mamba_gated_norm_forward", why);
    expect_error_naming(
        [&] { mamba_gated_norm_backward(nullptr, nullptr, nullptr, nullptr, nullptr, nullptr, nullptr, nullptr, s); },
        "mamba_gated_norm_backward", why);
  }
}

}  // namespace
}  // namespace lattice
