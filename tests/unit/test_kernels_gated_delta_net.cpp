// Gated DeltaNet's kernels (kernels/gated_delta_net.h): the convolution, the gates, the delta rule and
// the output gate forward against a double-precision reference written from the definitions (the delta
// rule step by step, state as a Dk x Dv matrix), and their backward, chained as the model chains them,
// against finite differences of that reference; the backward the same whatever the checkpoint spacing;
// with document ids, against the reference restarting at each document and against the documents run as
// sequences of their own.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <vector>

#include "kernels/gated_delta_net.h"
#include "kernels_test_util.h"

namespace lattice {
namespace {

using kernel_test::expect_close;
using kernel_test::numeric_grad;
using kernel_test::project;
using kernel_test::random_floats;
using kernel_test::to_double;

struct Inputs {
  std::vector<double> x, w, A_log, dt_bias;  // x [N, W], w [Cc, K], A_log, dt_bias [Hv]
};

double silu(double v) { return v / (1.0 + std::exp(-v)); }
double sigmoid(double v) { return 1.0 / (1.0 + std::exp(-v)); }

// o [N, Hv, Dv] from the in_proj output x, in double, from the definitions; with s.documents, each document
// from a zero state, its convolution reading none of the rows before it.
std::vector<double> reference(const Inputs& in, const GdnShape& s) {
  const int64_t N = s.N(), W = s.width(), Cc = s.conv(), K = s.K, Dk = s.Dk, Dv = s.Dv;
  auto other_document = [&](int64_t n, int64_t m) { return s.documents && s.documents[n] != s.documents[m]; };
  std::vector<double> u(size_t(N * Cc));
  for (int64_t n = 0; n < N; ++n)
    for (int64_t c = 0; c < Cc; ++c) {
      double acc = 0;
      for (int64_t j = 0; j < K; ++j) {
        const int64_t t = n % s.T - K + 1 + j;
        if (t >= 0 && !other_document(n, n - K + 1 + j))
          acc += in.w[size_t(c * K + j)] * in.x[size_t((n - K + 1 + j) * W + c)];
      }
      u[size_t(n * Cc + c)] = silu(acc);
    }
  std::vector<double> o(size_t(N * s.v()));
  for (int64_t b = 0; b < s.B; ++b)
    for (int64_t h = 0; h < s.Hv; ++h) {
      const int64_t kh = h / (s.Hv / s.Hk);
      std::vector<double> S(size_t(Dk * Dv), 0.0);  // [Dk, Dv]
      for (int64_t t = 0; t < s.T; ++t) {
        const int64_t n = b * s.T + t;
        std::vector<double> q(static_cast<size_t>(Dk)), k(static_cast<size_t>(Dk));
        double nq = 0, nk = 0;
        for (int64_t i = 0; i < Dk; ++i) {
          q[size_t(i)] = u[size_t(n * Cc + kh * Dk + i)];
          k[size_t(i)] = u[size_t(n * Cc + s.qk() + kh * Dk + i)];
          nq += q[size_t(i)] * q[size_t(i)];
          nk += k[size_t(i)] * k[size_t(i)];
        }
        for (int64_t i = 0; i < Dk; ++i) {
          q[size_t(i)] /= std::sqrt(nq + 1e-6) * std::sqrt(double(Dk));
          k[size_t(i)] /= std::sqrt(nk + 1e-6);
        }
        const double a = in.x[size_t(n * W + s.a_at() + h)] + in.dt_bias[size_t(h)];
        const double g = -std::exp(in.A_log[size_t(h)]) * std::log1p(std::exp(a));
        const double beta = sigmoid(in.x[size_t(n * W + s.b_at() + h)]);
        if (t > 0 && other_document(n, n - 1)) std::fill(S.begin(), S.end(), 0.0);
        for (double& e : S) e *= std::exp(g);
        for (int64_t j = 0; j < Dv; ++j) {
          double kv = 0;
          for (int64_t i = 0; i < Dk; ++i) kv += S[size_t(i * Dv + j)] * k[size_t(i)];
          const double delta = beta * (u[size_t(n * Cc + 2 * s.qk() + h * Dv + j)] - kv);
          double out = 0;
          for (int64_t i = 0; i < Dk; ++i) {
            S[size_t(i * Dv + j)] += k[size_t(i)] * delta;
            out += S[size_t(i * Dv + j)] * q[size_t(i)];
          }
          o[size_t((n * s.Hv + h) * Dv + j)] = out;
        }
      }
    }
  return o;
}

struct GdnRun {
  std::vector<float> o, dx, dw, dA_log, d_dt_bias;
};

std::vector<float> to_float(const std::vector<double>& v) { return std::vector<float>(v.begin(), v.end()); }

// The forward and (with R, the output's gradient) the backward, chained as the model does.
GdnRun run_kernels(const Inputs& in, const GdnShape& s, const std::vector<float>* R) {
  const int64_t N = s.N();
  const std::vector<float> x = to_float(in.x), w = to_float(in.w), A = to_float(in.A_log), dt = to_float(in.dt_bias);
  std::vector<float> u(size_t(N * s.conv())), q(size_t(N * s.qk())), k(q.size()), g(size_t(N * s.Hv)), beta(g.size());
  std::vector<float> state(size_t(s.B * s.Hv * s.state())), ckpt(size_t(s.B * s.Hv * s.chunks() * s.state()));
  GdnRun r;
  r.o.assign(size_t(N * s.v()), 0.0f);
  gdn_conv_forward(u.data(), x.data(), w.data(), s);
  gdn_gates_forward(q.data(), k.data(), g.data(), beta.data(), u.data(), x.data(), A.data(), dt.data(), s);
  gdn_delta_rule_forward(r.o.data(), state.data(), ckpt.data(), q.data(), k.data(), u.data(), g.data(), beta.data(), s);
  if (!R) return r;
  std::vector<float> dq_v(size_t(N * s.Hv * s.Dk)), dk_v(dq_v.size()), du(u.size(), -7.0f), dg(g.size()),
      dbeta(g.size()), work(size_t(gdn_delta_rule_work(s)));
  gdn_delta_rule_backward(dq_v.data(), dk_v.data(), du.data(), dg.data(), dbeta.data(), work.data(), R->data(),
                          ckpt.data(), q.data(), k.data(), u.data(), g.data(), beta.data(), s);
  std::vector<float> dq(q.size()), dk(k.size());
  gdn_sum_key_heads(dq.data(), dq_v.data(), s);
  gdn_sum_key_heads(dk.data(), dk_v.data(), s);
  r.dx.assign(x.size(), 0.0f);
  r.dw.assign(w.size(), 0.0f);
  r.dA_log.assign(A.size(), 0.0f);
  r.d_dt_bias.assign(dt.size(), 0.0f);
  gdn_gates_backward(du.data(), r.dx.data(), r.dA_log.data(), r.d_dt_bias.data(), dq.data(), dk.data(), dg.data(),
                     dbeta.data(), u.data(), x.data(), A.data(), dt.data(), s);
  gdn_conv_backward(r.dx.data(), r.dw.data(), du.data(), x.data(), w.data(), s);
  return r;
}

GdnShape small_shape(int64_t chunk) {
  GdnShape s;
  s.B = 2;
  s.T = 7;
  s.Hk = 2;
  s.Hv = 4;
  s.Dk = 5;
  s.Dv = 3;
  s.K = 3;
  s.chunk = chunk;
  return s;
}

// A_log in [lo, hi]: the decays' scale exp(A_log).
Inputs random_inputs(const GdnShape& s, uint32_t seed, float A_log_lo = 0.0f, float A_log_hi = 1.5f) {
  Inputs in;
  in.x = to_double(random_floats(size_t(s.N() * s.width()), seed, -1.0f, 1.0f));
  in.w = to_double(random_floats(size_t(s.conv() * s.K), seed + 1, -0.6f, 0.6f));
  in.A_log = to_double(random_floats(size_t(s.Hv), seed + 2, A_log_lo, A_log_hi));
  in.dt_bias = to_double(random_floats(size_t(s.Hv), seed + 3, 0.5f, 1.5f));
  for (double& v : in.x) v = double(float(v));
  return in;
}

TEST(GatedDeltaNet, ForwardMatchesTheStepByStepDefinition) {
  for (int64_t chunk : {1, 3, 64}) {
    const GdnShape s = small_shape(chunk);
    const Inputs in = random_inputs(s, 11);
    expect_close(run_kernels(in, s, nullptr).o, reference(in, s), 2e-6, "o, chunk " + std::to_string(chunk));
  }
}

// The kernels' gradients of every input (projected on R) against finite differences of the reference.
GdnRun expect_gradients_match_finite_differences(const Inputs& in, const GdnShape& s, const std::vector<float>& R) {
  const GdnRun r = run_kernels(in, s, &R);
  auto loss_of = [&](auto field) {
    return [&, field](const std::vector<double>& v) {
      Inputs m = in;
      m.*field = v;
      return project(reference(m, s), R);
    };
  };
  expect_close(r.dx, numeric_grad(loss_of(&Inputs::x), in.x), 2e-4, "dx");
  expect_close(r.dw, numeric_grad(loss_of(&Inputs::w), in.w), 2e-4, "dw");
  expect_close(r.dA_log, numeric_grad(loss_of(&Inputs::A_log), in.A_log), 2e-4, "dA_log");
  expect_close(r.d_dt_bias, numeric_grad(loss_of(&Inputs::dt_bias), in.dt_bias), 2e-4, "d_dt_bias");
  return r;
}

TEST(GatedDeltaNet, BackwardMatchesFiniteDifferences) {
  const GdnShape s = small_shape(3);  // chunks of 3, 3 and 1 tokens
  const Inputs in = random_inputs(s, 21);
  const GdnRun r = expect_gradients_match_finite_differences(in, s, random_floats(size_t(s.N() * s.v()), 22));
  // Every input's gradient is there: the z slot (the output gate's, gdn_output_gate_backward) is the only
  // part of x this chain leaves zero.
  double b_and_a = 0;
  for (int64_t n = 0; n < s.N(); ++n)
    for (int64_t c = s.b_at(); c < s.width(); ++c) b_and_a += std::fabs(r.dx[size_t(n * s.width() + c)]);
  EXPECT_GT(b_and_a, 1e-3);
}

TEST(GatedDeltaNet, BackwardDoesNotDependOnTheCheckpointSpacing) {
  const Inputs in = random_inputs(small_shape(1), 31);
  const std::vector<float> R = random_floats(size_t(small_shape(1).N() * small_shape(1).v()), 32);
  const GdnRun one = run_kernels(in, small_shape(1), &R);
  for (int64_t chunk : {2, 7, 64}) {
    const GdnRun other = run_kernels(in, small_shape(chunk), &R);
    expect_close(other.dx, to_double(one.dx), 1e-6, "dx, chunk " + std::to_string(chunk));
    expect_close(other.dw, to_double(one.dw), 1e-6, "dw, chunk " + std::to_string(chunk));
  }
}

// A longer sequence with slow decays (exp(A_log) 0.02-0.14: a chunk's decay reaches exp(-20) or so), wider
// heads: chunks of 64, 64 and 22 tokens in closed form, against the definition step by step; the backward
// against the one-token chunks' (each token a closed form of one step). Measured: o and dx within 3e-8 (their
// values up to 0.06), the parameters' gradients (sums over the tokens) within 4e-7.
GdnShape long_shape(int64_t chunk) {
  GdnShape s;
  s.B = 1;
  s.T = 150;
  s.Hk = 1;
  s.Hv = 2;
  s.Dk = 16;
  s.Dv = 12;
  s.K = 4;
  s.chunk = chunk;
  return s;
}

TEST(GatedDeltaNet, LongChunksMatchTheDefinitionAndOneTokenChunks) {
  const Inputs in = random_inputs(long_shape(64), 51, -4.0f, -2.0f);
  expect_close(run_kernels(in, long_shape(64), nullptr).o, reference(in, long_shape(64)), 1e-7, "o, chunk 64");
  const std::vector<float> R = random_floats(size_t(long_shape(1).N() * long_shape(1).v()), 52);
  const GdnRun one = run_kernels(in, long_shape(1), &R), chunked = run_kernels(in, long_shape(64), &R);
  expect_close(chunked.dx, to_double(one.dx), 1e-7, "dx, chunk 64 against 1");
  expect_close(chunked.dw, to_double(one.dw), 1e-6, "dw, chunk 64 against 1");
  expect_close(chunked.dA_log, to_double(one.dA_log), 1e-6, "dA_log, chunk 64 against 1");
  expect_close(chunked.d_dt_bias, to_double(one.d_dt_bias), 1e-6, "d_dt_bias, chunk 64 against 1");
}

// The largest of |a_i - b_i| / |b_i|.
double relative_difference(const std::vector<float>& a, const std::vector<float>& b) {
  double worst = 0;
  for (size_t i = 0; i < a.size(); ++i)
    worst = std::max(worst, std::fabs(double(a[i]) - double(b[i])) / std::fabs(double(b[i])));
  return worst;
}

// The strong decays of Megatron's initial values (A = exp(A_log) up to 16, dt_bias 1: exp(g) down to 1e-15 a
// step) make A_log's and dt_bias's gradients tiny; the chunks' closed form keeps them as accurate as the
// step-by-step form does (the shares of exp(0) on the chunks' diagonal, exactly zero, are not added and taken
// away again: that left rounding of the other terms' size, larger than these gradients).
TEST(GatedDeltaNet, StrongDecaysKeepTheDecayParametersGradients) {
  Inputs in = random_inputs(long_shape(64), 61, 2.3f, 2.77f);
  for (double& v : in.dt_bias) v = 1.0;
  const std::vector<float> R = random_floats(size_t(long_shape(1).N() * long_shape(1).v()), 62);
  // Without documents, and with documents starting at every 10th token.
  std::vector<int32_t> documents(size_t(long_shape(1).T));
  for (size_t t = 0; t < documents.size(); ++t) documents[t] = int32_t(t / 10);
  for (const int32_t* d : std::vector<const int32_t*>{nullptr, documents.data()}) {
    GdnShape s1 = long_shape(1), s64 = long_shape(64);
    s1.documents = s64.documents = d;
    const GdnRun one = run_kernels(in, s1, &R), chunked = run_kernels(in, s64, &R);
    EXPECT_LE(relative_difference(chunked.dA_log, one.dA_log), 1e-3) << (d ? "documents" : "");
    EXPECT_LE(relative_difference(chunked.d_dt_bias, one.d_dt_bias), 1e-3) << (d ? "documents" : "");
  }
}

// Documents: sequence 0 starts documents at tokens 2 and 6, sequence 1 at token 3 (with chunks of 3, a
// chunk's first token); the convolution's 3 taps reach across each start but must not read it.
const std::vector<int32_t> kSmallDocuments = {0, 0, 1, 1, 1, 1, 2, 0, 0, 0, 1, 1, 1, 1};

TEST(GatedDeltaNet, DocumentsMatchTheDefinitionAndFiniteDifferences) {
  for (int64_t chunk : {1, 3, 64}) {
    GdnShape s = small_shape(chunk);
    s.documents = kSmallDocuments.data();
    const Inputs in = random_inputs(s, 71);
    expect_close(run_kernels(in, s, nullptr).o, reference(in, s), 2e-6, "o, chunk " + std::to_string(chunk));
  }
  GdnShape s = small_shape(3);
  s.documents = kSmallDocuments.data();
  const Inputs in = random_inputs(s, 72);
  expect_gradients_match_finite_differences(in, s, random_floats(size_t(s.N() * s.v()), 73));
  // The documents change the result (the test can fail): without them the rows after a start differ.
  const std::vector<float> plain = run_kernels(in, small_shape(3), nullptr).o;
  const std::vector<double> with_documents = reference(in, s);
  double most = 0;
  for (size_t i = 0; i < plain.size(); ++i) most = std::max(most, std::fabs(plain[i] - with_documents[i]));
  EXPECT_GT(most, 1e-2);
}

// A sequence of 150 tokens with documents from tokens 40, 64 (the second chunk's first token) and 130, chunks
// of 64: each document's outputs and input gradients those of the document run alone, and the parameters'
// gradients the sums of the four runs'.
TEST(GatedDeltaNet, DocumentsMatchSeparateSequences) {
  const std::vector<int64_t> starts = {0, 40, 64, 130, 150};
  GdnShape s = long_shape(64);
  std::vector<int32_t> documents(size_t(s.T));
  for (size_t d = 0; d + 1 < starts.size(); ++d)
    std::fill(documents.begin() + starts[d], documents.begin() + starts[d + 1], int32_t(d));
  s.documents = documents.data();
  const Inputs in = random_inputs(s, 81, -4.0f, -2.0f);
  const std::vector<float> R = random_floats(size_t(s.N() * s.v()), 82);
  const GdnRun packed = run_kernels(in, s, &R);
  const int64_t W = s.width(), V = s.v();
  std::vector<double> o(packed.o.size()), dx(packed.dx.size()), dw(packed.dw.size(), 0.0),
      dA_log(packed.dA_log.size(), 0.0), d_dt_bias(packed.d_dt_bias.size(), 0.0);
  for (size_t d = 0; d + 1 < starts.size(); ++d) {
    GdnShape one = long_shape(64);
    one.T = starts[d + 1] - starts[d];
    one.chunk = std::min<int64_t>(64, one.T);
    Inputs part = in;
    part.x.assign(in.x.begin() + starts[d] * W, in.x.begin() + starts[d + 1] * W);
    const std::vector<float> Rd(R.begin() + starts[d] * V, R.begin() + starts[d + 1] * V);
    const GdnRun alone = run_kernels(part, one, &Rd);
    std::copy(alone.o.begin(), alone.o.end(), o.begin() + starts[d] * V);
    std::copy(alone.dx.begin(), alone.dx.end(), dx.begin() + starts[d] * W);
    for (size_t i = 0; i < dw.size(); ++i) dw[i] += alone.dw[i];
    for (size_t h = 0; h < dA_log.size(); ++h) {
      dA_log[h] += alone.dA_log[h];
      d_dt_bias[h] += alone.d_dt_bias[h];
    }
  }
  expect_close(packed.o, o, 1e-7, "o");
  expect_close(packed.dx, dx, 1e-7, "dx");
  expect_close(packed.dw, dw, 1e-6, "dw");
  expect_close(packed.dA_log, dA_log, 1e-6, "dA_log");
  expect_close(packed.d_dt_bias, d_dt_bias, 1e-6, "d_dt_bias");
  // A document's first token decays a forgotten state: its decay input a has no gradient at all.
  for (int64_t t : {40, 64, 130})
    for (int64_t h = 0; h < s.Hv; ++h) EXPECT_EQ(packed.dx[size_t(t * W + s.a_at() + h)], 0.0f) << t << ", " << h;
}

TEST(GatedDeltaNet, OutputGateMatchesItsDefinitionAndFiniteDifferences) {
  const GdnShape s = small_shape(64);
  const std::vector<float> x = random_floats(size_t(s.N() * s.width()), 41, -2.0f, 2.0f);
  const std::vector<float> nrm = random_floats(size_t(s.N() * s.v()), 42);
  std::vector<float> y(nrm.size());
  gdn_output_gate_forward(y.data(), nrm.data(), x.data(), s);
  auto ref = [&](const std::vector<double>& nv, const std::vector<double>& xv) {
    std::vector<double> out(nv.size());
    for (int64_t n = 0; n < s.N(); ++n)
      for (int64_t c = 0; c < s.v(); ++c)
        out[size_t(n * s.v() + c)] = nv[size_t(n * s.v() + c)] * silu(xv[size_t(n * s.width() + s.z_at() + c)]);
    return out;
  };
  expect_close(y, ref(to_double(nrm), to_double(x)), 1e-6, "y");
  const std::vector<float> R = random_floats(y.size(), 43);
  std::vector<float> dn(y.size()), dx(x.size(), 0.0f);
  gdn_output_gate_backward(dn.data(), dx.data(), R.data(), nrm.data(), x.data(), s);
  expect_close(dn, numeric_grad([&](const std::vector<double>& v) { return project(ref(v, to_double(x)), R); },
                                to_double(nrm)),
               1e-5, "dn");
  expect_close(dx, numeric_grad([&](const std::vector<double>& v) { return project(ref(to_double(nrm), v), R); },
                                to_double(x)),
               1e-5, "dx (z slot; the others untouched, 0)");
}

}  // namespace
}  // namespace lattice
