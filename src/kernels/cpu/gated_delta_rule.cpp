// The gated delta rule on the CPU (kernels/gated_delta_net.h) by chunks, each in closed form through GEMMs:
// the chunked form of the Gated DeltaNet paper (Yang, Kautz and Hatamizadeh), the algorithm of FLA's
// chunk_gated_delta_rule and of HuggingFace's torch_chunk_gated_delta_rule. Per sequence and value head, the
// chunks of s.chunk tokens in turn, from the state before the chunk, S0 [Dk, Dv] (kept transposed, St [Dv, Dk],
// as the header says). With the chunk's rows Q, K [C, Dk], V [C, Dv], g, beta [C]:
//   G_t    = g_0 + ... + g_t (from the chunk's start),  gamma_t = exp(G_t),  w_t = exp(G_last - G_t)
//   Gm_ts  = exp(G_t - G_s) for s <= t: the decay from token s to token t (at most 1: no overflow)
//   A_ts   = beta_t Gm_ts k_t.k_s for s < t, 0 otherwise;  Tm = (I + A)^-1, unit lower triangular
//   R      = diag(beta) (V - diag(gamma) K S0)                                        [C, Dv]
//   Delta  = Tm R: the rows delta_t of the step-by-step rule                             [C, Dv]
//   O      = diag(gamma) Q S0 + P Delta,  P_ts = Gm_ts q_t.k_s for s <= t              [C, Dv]
//   S_last = gamma_last S0 + K^T diag(w) Delta
// This is the recurrence unrolled: exp(g_t) S_{t-1} = gamma_t S0 + sum_{s<t} Gm_ts k_s delta_s^T, so
// delta_t = beta_t (v_t - gamma_t S0^T k_t - sum_{s<t} Gm_ts (k_t.k_s) delta_s), which is (I + A) Delta = R.
// Documents (GdnShape::documents) starting inside a chunk cut the decays: the state before a document's first
// token is forgotten, so Gm_ts is 0 for s and t of different documents, gamma_t for t after the chunk's first
// document and w_t for t before its last; every formula stays as it is, and the shares of the cut decays
// (constants 0) vanish with them.
// Every product above is a gemm_f32 (one BLAS call on this thread, inside the loop over heads); the inverse
// of the small unit triangle (C^3 / 6 multiply-adds against the GEMMs' C Dk Dv) is a substitution.
//
// The backward recomputes a chunk's values from its checkpoint (its S0) and runs the adjoints of these
// formulas, the chunks in reverse, dS carried from each chunk to the one before (derivations by each step).
// Each (sequence, head) is one thread's work with the same calls whatever the thread count, so the results
// do not depend on it.
#include <algorithm>
#include <cstring>
#include <vector>

#include "blas/gemm.h"
#include "core/device.h"
#include "kernels/cuda/ops.h"
#include "kernels/gated_delta_net.h"

namespace lattice {

namespace {
constexpr int64_t kParallelMin = 32768;

// One chunk's rows of one (sequence, value head): pointers to its first row and their row strides.
struct ChunkRows {
  int64_t L = 0;                                   // tokens (the last chunk may be short)
  const float* q = nullptr;                        // [L, Dk], row stride ldqk (the key head's)
  const float* k = nullptr;                        // [L, Dk], ditto
  const float* v = nullptr;                        // [L, Dv], row stride Cc (u's v columns)
  const float* g = nullptr;                        // [L], stride Hv
  const float* beta = nullptr;                     // [L], stride Hv
  int64_t ldqk = 0, ldv = 0, ldh = 0;
  int64_t n0 = 0;                                  // the first token's row
};

ChunkRows chunk_rows(const float* q, const float* k, const float* u, const float* g, const float* beta,
                     const GdnShape& s, int64_t b, int64_t h, int64_t c) {
  const int64_t t0 = c * s.chunk, n0 = b * s.T + t0, kh = h / s.group();
  ChunkRows r;
  r.L = std::min(s.T, t0 + s.chunk) - t0;
  r.n0 = n0;
  r.ldqk = s.Hk * s.Dk;
  r.ldv = s.conv();
  r.ldh = s.Hv;
  r.q = q + (n0 * s.Hk + kh) * s.Dk;
  r.k = k + (n0 * s.Hk + kh) * s.Dk;
  r.v = u + n0 * s.conv() + 2 * s.qk() + h * s.Dv;
  r.g = g + n0 * s.Hv + h;
  r.beta = beta + n0 * s.Hv + h;
  return r;
}

// One thread's buffers for a chunk of at most C tokens: C x C matrices, C x Dv and C x Dk rows, C vectors.
struct ChunkBuffers {
  int64_t C;
  std::vector<float> Gm, KK, A, Tm, P, dP, dM;  // [C, C]
  std::vector<float> KS, R0, D, dD, dR;          // [C, Dv]
  std::vector<float> Kw, Qg, X, dQ, dK;          // [C, Dk]
  std::vector<float> G, gamma, w, dG, db;        // [C]
  std::vector<int32_t> doc;                      // [C]: the documents started in the chunk up to each token
  ChunkBuffers(const GdnShape& s, bool backward) : C(s.chunk) {
    const size_t cc = size_t(C * C), cv = size_t(C * s.Dv), ck = size_t(C * s.Dk), c = size_t(C);
    for (auto* m : {&Gm, &KK, &A, &Tm, &P}) m->resize(cc);
    for (auto* m : {&KS, &R0, &D}) m->resize(cv);
    Kw.resize(ck);
    for (auto* m : {&G, &gamma, &w}) m->resize(c);
    doc.resize(c);
    if (!backward) return;
    for (auto* m : {&dP, &dM}) m->resize(cc);
    for (auto* m : {&dD, &dR}) m->resize(cv);
    for (auto* m : {&Qg, &X, &dQ, &dK}) m->resize(ck);
    dG.resize(c);
    db.resize(c);
  }
};

// The chunk's forward quantities from its starting state St0 [Dv, Dk]: G, gamma, w, Gm (0 above the
// diagonal); KK = K K^T, A, Tm; KS = K S0 and R0 = V - diag(gamma) KS; Delta (D) = Tm diag(beta) R0; P (masked,
// decayed Q K^T); Kw = diag(w) K. R (= diag(beta) R0) passes through `scratch` [C, Dv].
void chunk_forward_values(ChunkBuffers& f, float* scratch, const ChunkRows& r, const float* St0, const GdnShape& s) {
  const int64_t L = r.L, C = f.C, Dk = s.Dk, Dv = s.Dv;
  math::gdn_chunk_cumsum(f.G.data(), f.doc.data(), r.g, r.ldh, r.n0, L, s);
  for (int64_t t = 0; t < L; ++t) {
    f.gamma[size_t(t)] = math::gdn_chunk_entry_decay(f.G.data(), f.doc.data(), t);
    f.w[size_t(t)] = math::gdn_chunk_decay(f.G.data(), f.doc.data(), L - 1, t);
  }
  for (int64_t t = 0; t < L; ++t)
    for (int64_t u = 0; u < L; ++u) f.Gm[size_t(t * C + u)] = math::gdn_chunk_decay(f.G.data(), f.doc.data(), t, u);
  gemm_f32(Trans::N, Trans::T, L, L, Dk, 1.0f, r.k, r.ldqk, r.k, r.ldqk, 0.0f, f.KK.data(), C);
  // A (strictly lower) and Tm = (I + A)^-1 by substitution: Tm_t = e_t - sum_{s<t} A_ts Tm_s (row t's
  // columns 0..t).
  for (int64_t t = 0; t < L; ++t) {
    const float bt = r.beta[t * r.ldh];
    float* Tt = f.Tm.data() + t * C;
    std::fill(Tt, Tt + L, 0.0f);
    Tt[t] = 1.0f;
    for (int64_t u = 0; u < t; ++u) {
      const float a = bt * f.Gm[size_t(t * C + u)] * f.KK[size_t(t * C + u)];
      f.A[size_t(t * C + u)] = a;
      const float* Tu = f.Tm.data() + u * C;
      for (int64_t j = 0; j <= u; ++j) Tt[j] -= a * Tu[j];
    }
  }
  gemm_f32(Trans::N, Trans::T, L, Dv, Dk, 1.0f, r.k, r.ldqk, St0, Dk, 0.0f, f.KS.data(), Dv);
  for (int64_t t = 0; t < L; ++t) {
    const float gm = f.gamma[size_t(t)], bt = r.beta[t * r.ldh];
    for (int64_t j = 0; j < Dv; ++j) {
      const float r0 = r.v[t * r.ldv + j] - gm * f.KS[size_t(t * Dv + j)];
      f.R0[size_t(t * Dv + j)] = r0;
      scratch[t * Dv + j] = bt * r0;
    }
  }
  gemm_f32(Trans::N, Trans::N, L, Dv, L, 1.0f, f.Tm.data(), C, scratch, Dv, 0.0f, f.D.data(), Dv);
  gemm_f32(Trans::N, Trans::T, L, L, Dk, 1.0f, r.q, r.ldqk, r.k, r.ldqk, 0.0f, f.P.data(), C);
  for (int64_t t = 0; t < L; ++t)
    for (int64_t u = 0; u < L; ++u)
      f.P[size_t(t * C + u)] *= f.Gm[size_t(t * C + u)];
  for (int64_t t = 0; t < L; ++t)
    for (int64_t i = 0; i < Dk; ++i) f.Kw[size_t(t * Dk + i)] = f.w[size_t(t)] * r.k[t * r.ldqk + i];
}

// O [L, Dv] (row stride ldo) = diag(gamma) Q S0 + P Delta, and St = gamma_last St + Delta^T Kw in place.
void chunk_forward_outputs(float* O, int64_t ldo, float* St, ChunkBuffers& f, const ChunkRows& r,
                           const GdnShape& s) {
  const int64_t L = r.L, C = f.C, Dk = s.Dk, Dv = s.Dv;
  gemm_f32(Trans::N, Trans::T, L, Dv, Dk, 1.0f, r.q, r.ldqk, St, Dk, 0.0f, O, ldo);
  for (int64_t t = 0; t < L; ++t)
    for (int64_t j = 0; j < Dv; ++j) O[t * ldo + j] *= f.gamma[size_t(t)];
  gemm_f32(Trans::N, Trans::N, L, Dv, L, 1.0f, f.P.data(), C, f.D.data(), Dv, 1.0f, O, ldo);
  gemm_f32(Trans::T, Trans::N, Dv, Dk, L, 1.0f, f.D.data(), Dv, f.Kw.data(), Dk, f.gamma[size_t(L - 1)], St, Dk);
}

float dot(const float* a, const float* b, int64_t n) {
  float acc = 0.0f;
  for (int64_t i = 0; i < n; ++i) acc += a[i] * b[i];
  return acc;
}

// The backward of one chunk: from dO [L, Dv] (row stride ldo) and dSt [Dv, Dk], the gradient of the chunk's
// last state, in place to the gradient of its starting state St0; the chunk's dq, dk (f.dQ, f.dK), dv (into
// dv, row stride ldv), dg and dbeta (stride ldh) written.
void chunk_backward(float* dSt, float* dv, int64_t ldv, float* dg, float* dbeta, int64_t ldh, const float* dO,
                    int64_t ldo, ChunkBuffers& f, const ChunkRows& r, const float* St0, const GdnShape& s) {
  const int64_t L = r.L, C = f.C, Dk = s.Dk, Dv = s.Dv, last = L - 1;
  const float gamma_last = f.gamma[size_t(last)];
  std::fill(f.dG.begin(), f.dG.end(), 0.0f);
  std::vector<float>& db = f.db;  // beta's gradient
  // S_last = gamma_last S0 + K^T diag(w) Delta: dDelta = Kw dS^T; d(Kw) = Delta dS, so dK = diag(w) d(Kw)
  // and w_t's share w_t (k_t . d(Kw)_t) goes to G_last (+) and G_t (-); gamma_last's, gamma_last <S0, dS>.
  gemm_f32(Trans::N, Trans::T, L, Dv, Dk, 1.0f, f.Kw.data(), Dk, dSt, Dk, 0.0f, f.dD.data(), Dv);
  gemm_f32(Trans::N, Trans::N, L, Dk, Dv, 1.0f, f.D.data(), Dv, dSt, Dk, 0.0f, f.X.data(), Dk);
  for (int64_t t = 0; t < L; ++t) {
    const float* xt = f.X.data() + t * Dk;
    const float wt = f.w[size_t(t)];
    if (t != last) {  // w_last = exp(0) has no share: adding and taking it away would only leave rounding
      const float dw = wt * dot(r.k + t * r.ldqk, xt, Dk);
      f.dG[size_t(last)] += dw;
      f.dG[size_t(t)] -= dw;
    }
    for (int64_t i = 0; i < Dk; ++i) f.dK[size_t(t * Dk + i)] = wt * xt[i];
  }
  f.dG[size_t(last)] += gamma_last * dot(St0, dSt, Dv * Dk);
  for (int64_t e = 0; e < Dv * Dk; ++e) dSt[e] *= gamma_last;  // dS0's first term; the others add below
  // O = diag(gamma) Q S0 + P Delta: dS0 += (diag(gamma) Q)^T dO; X = dO S0^T gives dq = diag(gamma) X and
  // gamma_t's share gamma_t q_t . X_t; dP = dO Delta^T, dDelta += P^T dO; P = Gm . Q K^T (s <= t): dQK = Gm
  // dP, and Gm_ts's share dP_ts P_ts goes to G_t (+) and G_s (-); dq += dQK K, dk += dQK^T Q.
  for (int64_t t = 0; t < L; ++t)
    for (int64_t i = 0; i < Dk; ++i) f.Qg[size_t(t * Dk + i)] = f.gamma[size_t(t)] * r.q[t * r.ldqk + i];
  gemm_f32(Trans::T, Trans::N, Dv, Dk, L, 1.0f, dO, ldo, f.Qg.data(), Dk, 1.0f, dSt, Dk);
  gemm_f32(Trans::N, Trans::N, L, Dk, Dv, 1.0f, dO, ldo, St0, Dk, 0.0f, f.X.data(), Dk);
  for (int64_t t = 0; t < L; ++t) {
    const float* xt = f.X.data() + t * Dk;
    const float gm = f.gamma[size_t(t)];
    f.dG[size_t(t)] += gm * dot(r.q + t * r.ldqk, xt, Dk);
    for (int64_t i = 0; i < Dk; ++i) f.dQ[size_t(t * Dk + i)] = gm * xt[i];
  }
  gemm_f32(Trans::N, Trans::T, L, L, Dv, 1.0f, dO, ldo, f.D.data(), Dv, 0.0f, f.dP.data(), C);
  gemm_f32(Trans::T, Trans::N, L, Dv, L, 1.0f, f.P.data(), C, dO, ldo, 1.0f, f.dD.data(), Dv);
  for (int64_t t = 0; t < L; ++t)
    for (int64_t u = 0; u < L; ++u) {
      float& d = f.dP[size_t(t * C + u)];
      if (u > t) {
        d = 0.0f;
        continue;
      }
      if (u < t) {  // Gm_tt = exp(0): no share (as w_last's above)
        const float p = d * f.P[size_t(t * C + u)];
        f.dG[size_t(t)] += p;
        f.dG[size_t(u)] -= p;
      }
      d *= f.Gm[size_t(t * C + u)];
    }
  gemm_f32(Trans::N, Trans::N, L, Dk, L, 1.0f, f.dP.data(), C, r.k, r.ldqk, 1.0f, f.dQ.data(), Dk);
  gemm_f32(Trans::T, Trans::N, L, Dk, L, 1.0f, f.dP.data(), C, r.q, r.ldqk, 1.0f, f.dK.data(), Dk);
  // Delta = (I + A)^-1 R: dR = Tm^T dDelta and dA = -dR Delta^T (its strictly lower part). A_ts = beta_t Gm_ts
  // KK_ts: dbeta_t += dA_ts Gm_ts KK_ts, Gm_ts's share dA_ts A_ts to G_t (+) and G_s (-), dKK_ts = dA_ts
  // beta_t Gm_ts; KK = K K^T: dk += (dKK + dKK^T) K.
  gemm_f32(Trans::T, Trans::N, L, Dv, L, 1.0f, f.Tm.data(), C, f.dD.data(), Dv, 0.0f, f.dR.data(), Dv);
  gemm_f32(Trans::N, Trans::T, L, L, Dv, -1.0f, f.dR.data(), Dv, f.D.data(), Dv, 0.0f, f.dM.data(), C);
  for (int64_t t = 0; t < L; ++t) {
    const float bt = r.beta[t * ldh];
    float dbt = 0.0f;
    for (int64_t u = 0; u < t; ++u) {
      const float da = f.dM[size_t(t * C + u)], gm = f.Gm[size_t(t * C + u)];
      dbt += da * gm * f.KK[size_t(t * C + u)];
      const float a = da * f.A[size_t(t * C + u)];
      f.dG[size_t(t)] += a;
      f.dG[size_t(u)] -= a;
      f.dM[size_t(t * C + u)] = da * bt * gm;
    }
    db[size_t(t)] = dbt;
  }
  for (int64_t t = 0; t < L; ++t) {
    f.dM[size_t(t * C + t)] = 0.0f;
    for (int64_t u = t + 1; u < L; ++u) f.dM[size_t(t * C + u)] = f.dM[size_t(u * C + t)];
  }
  gemm_f32(Trans::N, Trans::N, L, Dk, L, 1.0f, f.dM.data(), C, r.k, r.ldqk, 1.0f, f.dK.data(), Dk);
  // R = diag(beta) R0: dbeta_t += dR_t . R0_t, dR0 = diag(beta) dR. R0 = V - diag(gamma) K S0: dv = dR0;
  // Y = -diag(gamma) dR0 is K S0's gradient, gamma_t's share Y_t . (K S0)_t; dk += Y S0, dS0 += Y^T K.
  for (int64_t t = 0; t < L; ++t) {
    const float bt = r.beta[t * ldh], gm = f.gamma[size_t(t)];
    float* dr = f.dR.data() + t * Dv;
    db[size_t(t)] += dot(dr, f.R0.data() + t * Dv, Dv);
    for (int64_t j = 0; j < Dv; ++j) {
      const float dr0 = bt * dr[j];
      dv[t * ldv + j] = dr0;
      dr[j] = -gm * dr0;
    }
    f.dG[size_t(t)] += dot(dr, f.KS.data() + t * Dv, Dv);
  }
  gemm_f32(Trans::N, Trans::N, L, Dk, Dv, 1.0f, f.dR.data(), Dv, St0, Dk, 1.0f, f.dK.data(), Dk);
  gemm_f32(Trans::T, Trans::N, Dv, Dk, L, 1.0f, f.dR.data(), Dv, r.k, r.ldqk, 1.0f, dSt, Dk);
  // G_t = g_0 + ... + g_t: dg_t = dG_t + ... + dG_last. A document's first token in the chunk has no
  // gradient (the state its g decays is forgotten; its document's shares add up to 0 but for rounding).
  float acc = 0.0f;
  for (int64_t t = L; t-- > 0;) {
    acc += f.dG[size_t(t)];
    const bool first = f.doc[size_t(t)] != (t == 0 ? 0 : f.doc[size_t(t - 1)]);
    dg[t * ldh] = first ? 0.0f : acc;
    dbeta[t * ldh] = db[size_t(t)];
  }
}

}  // namespace

void gdn_delta_rule_forward(float* o, float* state, float* checkpoints, const float* q, const float* k, const float* u,
                            const float* g, const float* beta, const GdnShape& s, bool from_state) {
  LATTICE_KERNEL_ENTRY(cuda::gdn_delta_rule_forward(o, state, checkpoints, q, k, u, g, beta, s, from_state));
  gdn_check_shape(s, "gdn_delta_rule_forward");
  const int64_t Hv = s.Hv, S = s.state();
#pragma omp parallel if (s.N() * Hv * S > kParallelMin)
  {
    ChunkBuffers f(s, false);
    std::vector<float> scratch(size_t(s.chunk * s.Dv));
#pragma omp for schedule(static) collapse(2)
    for (int64_t b = 0; b < s.B; ++b)
      for (int64_t h = 0; h < Hv; ++h) {
        float* St = state + (b * Hv + h) * S;
        if (!from_state) std::fill(St, St + S, 0.0f);
        for (int64_t c = 0; c < s.chunks(); ++c) {
          if (checkpoints)
            std::memcpy(checkpoints + ((b * Hv + h) * s.chunks() + c) * S, St, size_t(S) * sizeof(float));
          const ChunkRows r = chunk_rows(q, k, u, g, beta, s, b, h, c);
          chunk_forward_values(f, scratch.data(), r, St, s);
          chunk_forward_outputs(o + ((b * s.T + c * s.chunk) * Hv + h) * s.Dv, Hv * s.Dv, St, f, r, s);
        }
      }
  }
}

void gdn_delta_rule_backward(float* dq_v, float* dk_v, float* du, float* dg, float* dbeta, float* work,
                             const float* d_o, const float* checkpoints, const float* q, const float* k, const float* u,
                             const float* g, const float* beta, const GdnShape& s) {
  LATTICE_KERNEL_ENTRY(
      cuda::gdn_delta_rule_backward(dq_v, dk_v, du, dg, dbeta, work, d_o, checkpoints, q, k, u, g, beta, s));
  gdn_check_shape(s, "gdn_delta_rule_backward");
  const int64_t Hv = s.Hv, Dk = s.Dk, Dv = s.Dv, S = s.state(), Cc = s.conv();
#pragma omp parallel if (s.N() * Hv * S > kParallelMin)
  {
    ChunkBuffers f(s, true);
    std::vector<float> dSt(static_cast<size_t>(S));
#pragma omp for schedule(static) collapse(2)
    for (int64_t b = 0; b < s.B; ++b)
      for (int64_t h = 0; h < Hv; ++h) {
        std::fill(dSt.begin(), dSt.end(), 0.0f);
        for (int64_t c = s.chunks(); c-- > 0;) {
          const ChunkRows r = chunk_rows(q, k, u, g, beta, s, b, h, c);
          const float* St0 = checkpoints + ((b * Hv + h) * s.chunks() + c) * S;
          const int64_t n0 = b * s.T + c * s.chunk;
          chunk_forward_values(f, f.dR.data(), r, St0, s);
          chunk_backward(dSt.data(), du + n0 * Cc + 2 * s.qk() + h * Dv, Cc, dg + n0 * Hv + h, dbeta + n0 * Hv + h, Hv,
                         d_o + (n0 * Hv + h) * Dv, Hv * Dv, f, r, St0, s);
          for (int64_t t = 0; t < r.L; ++t) {
            std::memcpy(dq_v + ((n0 + t) * Hv + h) * Dk, f.dQ.data() + t * Dk, size_t(Dk) * sizeof(float));
            std::memcpy(dk_v + ((n0 + t) * Hv + h) * Dk, f.dK.data() + t * Dk, size_t(Dk) * sizeof(float));
          }
        }
      }
  }
}

}  // namespace lattice
