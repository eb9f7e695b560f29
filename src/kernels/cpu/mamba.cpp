// Mamba-2's kernels on the CPU (kernels/mamba.h).
//
// The scan by chunks, each in closed form through GEMMs: the chunked form of the Mamba-2 paper ("state space
// duality", Dao and Gu; the algorithm of mamba_ssm's mamba_chunk_scan_combined), the structure of
// kernels/cpu/gated_delta_rule.cpp. Per (sequence, head) the chunks of s.chunk tokens in turn, from the state
// before the chunk S0 [P, N]. With the chunk's rows X [L, P] (the head's xs), B, C [L, N] (its group's), dt [L]:
//   a_t    = dt_t A,  Acum_t = a_0 + ... + a_t (from the chunk's start, summed in double)
//   Dec_ts = exp(Acum_t - Acum_s) for s <= t, 0 otherwise: the decay from token s to token t (at most 1)
//   e_t    = exp(Acum_t),  w_s = exp(Acum_last - Acum_s) dt_s,  CB = C B^T (the group's, its heads share it)
//   M      = CB o Dec o dt (dt_s scaling column s)                                                [L, L]
//   Y      = M X + diag(e) C S0^T + D X                                                          [L, P]
//   S_last = e_last S0 + X^T diag(w) B                                                           [P, N]
// which is the recurrence unrolled: S_t = e_t S0 + sum_{s<=t} Dec_ts dt_s x_s B_s^T, y_t = S_t C_t + D x_t.
// Every exponent is a difference Acum_t - Acum_s <= 0 (A < 0, dt > 0) or Acum_t <= 0: nothing overflows, and
// the decays that underflow are those below float's normal range (math::exp gives 0 there).
// Documents (MambaShape::documents): a document's first token forgets the state before it (its decay is 0),
// which cuts the chunk's decays at it, as gated_delta_rule.cpp does: Dec_ts is 0 for s and t of different
// documents, e_t for t after the chunk's first document, w_s for s before its last; every formula stays as it
// is. A document starting at the chunk's first token thus makes S0's share 0 (e = 0 throughout).
// Every product above is a gemm_f32 (one BLAS call on this thread, inside the loop over (sequence, group)).
//
// The backward reads each chunk's S0 from the forward's checkpoints (no state is recomputed) and runs the
// adjoints of these formulas, the chunks in reverse, dS carried from each chunk to the one before (derivations
// by each step); the decays' shares go to dAcum, whose reverse cumulative sum is da_t (none at a document's
// first token: its decay is the constant 0), giving d dt_t += A da_t and dA_log = A sum_t da_t dt_t.
//
// Each (sequence, group) is one thread's work, forward and backward: the chunks in order (reverse in the
// backward), CB once per chunk, then the group's heads in order, each with its own state (or state gradient),
// so that the group's B and C gradients are summed without a race and the per-head parameters' gradients are
// summed per sequence and then over the sequences in order: the same calls whatever the thread count, and
// the results do not depend on it. They depend on s.chunk (the checkpoint spacing) through rounding only.
#include "kernels/mamba.h"

#include <algorithm>
#include <cstring>
#include <vector>

#include "blas/gemm.h"
#include "core/device.h"
#include "core/error.h"
#include "kernels/cpu/causal_conv.h"
#include "kernels/cuda/ops.h"

namespace lattice {

namespace {
constexpr int64_t kParallelMin = 32768;
constexpr int64_t kChannelBlock = 64;  // the convolution weight gradient's channels per thread task

float dot(const float* a, const float* b, int64_t n) {
  float acc = 0.0f;
  for (int64_t i = 0; i < n; ++i) acc += a[i] * b[i];
  return acc;
}

// One thread's buffers for the scan of a (sequence, group), chunks of at most C tokens.
struct ScanBuffers {
  int64_t C;
  std::vector<float> CB, Dec, M, dM, dCB;  // [C, C]
  std::vector<float> Bw, Ce, V, R;         // [C, N]: diag(w) B, diag(e) C, X dS, dY S0
  std::vector<double> Acum;                // [C]
  std::vector<float> e, wdec, w, dAcum, ddt;  // [C]; wdec_s = exp(Acum_last - Acum_s), w_s = wdec_s dt_s
  std::vector<int32_t> doc;                // [C]: the documents started in the chunk up to each token
  std::vector<float> S;                    // [heads per group, P, N]: the heads' states (their gradients)
  std::vector<float> dA, dD;               // [heads per group]: the backward's per-head sums
  ScanBuffers(const MambaShape& s, bool backward) : C(s.chunk) {
    const size_t cc = size_t(C * C), cn = size_t(C * s.N), c = size_t(C);
    for (auto* m : {&CB, &M}) m->resize(cc);
    for (auto* m : {&Bw, &Ce}) m->resize(cn);
    Acum.resize(c);
    for (auto* m : {&e, &wdec, &w}) m->resize(c);
    doc.resize(c);
    S.resize(size_t(s.heads_per_group() * s.state()));
    if (!backward) return;
    for (auto* m : {&Dec, &dM, &dCB}) m->resize(cc);
    for (auto* m : {&V, &R}) m->resize(cn);
    for (auto* m : {&dAcum, &ddt}) m->resize(c);
    dA.resize(size_t(s.heads_per_group()));
    dD.resize(size_t(s.heads_per_group()));
  }
};

// One head's decays over the chunk of L tokens from row n0 (dt: its dt at n0, stride H) from f.CB: doc, Acum,
// e, wdec, w, and M = CB o Dec o dt (0 above the diagonal and across documents); Dec itself too when keep_dec.
void chunk_decays(ScanBuffers& f, const float* dt, int64_t ldh, float A, int64_t n0, int64_t L, bool keep_dec,
                  const MambaShape& s) {
  const int64_t C = f.C, last = L - 1;
  const double* acum = f.Acum.data();
  const int32_t* doc = f.doc.data();
  math::mamba_chunk_cumsum(f.Acum.data(), f.doc.data(), dt, ldh, A, n0, L, s);
  for (int64_t t = 0; t < L; ++t) {
    f.e[size_t(t)] = math::mamba_chunk_entry_decay(acum, doc, t);
    f.wdec[size_t(t)] = math::mamba_chunk_decay(acum, doc, last, t);
    f.w[size_t(t)] = f.wdec[size_t(t)] * dt[t * ldh];
  }
  for (int64_t t = 0; t < L; ++t) {
    const float* cb = f.CB.data() + t * C;
    float* m = f.M.data() + t * C;
    float* dec = keep_dec ? f.Dec.data() + t * C : nullptr;
    for (int64_t u = 0; u <= t; ++u) {
      const float d = math::mamba_chunk_decay(acum, doc, t, u);
      m[u] = cb[u] * d * dt[u * ldh];
      if (dec) dec[u] = d;
    }
    std::fill(m + t + 1, m + L, 0.0f);
    if (dec) std::fill(dec + t + 1, dec + L, 0.0f);
  }
}
}  // namespace

void mamba_check_shape(const MambaShape& s, const char* what) {
  LATTICE_CHECK(s.B > 0 && s.T > 0 && s.H > 0 && s.P > 0 && s.G > 0 && s.H % s.G == 0 && s.N > 0 && s.K > 0 &&
                s.chunk > 0)
      << what << ": sequences " << s.B << " x " << s.T << ", heads " << s.H << " of " << s.P << ", groups " << s.G
      << ", state " << s.N << ", kernel " << s.K << ", chunk " << s.chunk;
}

void mamba_conv_forward(float* u, const float* x, const float* w, const float* bias, const MambaShape& s) {
  LATTICE_KERNEL_ENTRY(cuda::mamba_conv_forward(u, x, w, bias, s));
  mamba_check_shape(s, "mamba_conv_forward");
  causal_conv::forward_silu(u, x, w, bias, s.rows(), s.x_at(), s.conv(), s);
}

void mamba_conv_backward(float* dx, float* dw, float* dbias, const float* du, const float* x, const float* w,
                         const float* bias, const MambaShape& s) {
  LATTICE_KERNEL_ENTRY(cuda::mamba_conv_backward(dx, dw, dbias, du, x, w, bias, s));
  mamba_check_shape(s, "mamba_conv_backward");
  causal_conv::backward_silu(dx, dw, dbias, du, x, w, bias, s.rows(), s.x_at(), s.conv(), s);
}

void mamba_dt_forward(float* dt, const float* x, const float* dt_bias, const MambaShape& s) {
  LATTICE_KERNEL_ENTRY(cuda::mamba_dt_forward(dt, x, dt_bias, s));
  mamba_check_shape(s, "mamba_dt_forward");
  const int64_t W = s.width(), H = s.H;
  for (int64_t n = 0; n < s.rows(); ++n)
    for (int64_t h = 0; h < H; ++h) dt[n * H + h] = math::softplus(x[n * W + s.dt_at() + h] + dt_bias[h]);
}

void mamba_dt_backward(float* dx, float* d_dt_bias, const float* d_dt, const float* x, const float* dt_bias,
                       const MambaShape& s) {
  LATTICE_KERNEL_ENTRY(cuda::mamba_dt_backward(dx, d_dt_bias, d_dt, x, dt_bias, s));
  mamba_check_shape(s, "mamba_dt_backward");
  const int64_t W = s.width(), H = s.H;
  for (int64_t n = 0; n < s.rows(); ++n)
    for (int64_t h = 0; h < H; ++h)
      dx[n * W + s.dt_at() + h] = d_dt[n * H + h] * math::sigmoid(x[n * W + s.dt_at() + h] + dt_bias[h]);
  for (int64_t h = 0; h < H; ++h) {  // summed over the rows in order
    float acc = 0.0f;
    for (int64_t n = 0; n < s.rows(); ++n) acc += dx[n * W + s.dt_at() + h];
    d_dt_bias[h] += acc;
  }
}

void mamba_scan_forward(float* y, float* checkpoints, const float* u, const float* dt, const float* A_log,
                        const float* D, const MambaShape& s, float* state) {
  LATTICE_KERNEL_ENTRY(cuda::mamba_scan_forward(y, checkpoints, u, dt, A_log, D, s, state));
  mamba_check_shape(s, "mamba_scan_forward");
  const int64_t H = s.H, P = s.P, Ns = s.N, Cc = s.conv(), S = s.state(), hpg = s.heads_per_group(), G = s.G;
  const int64_t HP = H * P;
#pragma omp parallel if (s.rows() * H * S > kParallelMin)
  {
    ScanBuffers f(s, false);
    const int64_t C = f.C;
#pragma omp for schedule(static)
    for (int64_t bg = 0; bg < s.B * G; ++bg) {
      const int64_t b = bg / G, g = bg % G;
      // The group's heads' states [hpg, P, N] in state, contiguous.
      float* carried = state ? state + (b * H + g * hpg) * S : nullptr;
      if (carried)
        std::memcpy(f.S.data(), carried, f.S.size() * sizeof(float));
      else
        std::fill(f.S.begin(), f.S.end(), 0.0f);
      for (int64_t c = 0; c < s.chunks(); ++c) {
        const int64_t t0 = c * s.chunk, L = std::min(s.T, t0 + s.chunk) - t0, n0 = b * s.T + t0;
        const float* Bm = u + n0 * Cc + s.b_at() + g * Ns;
        const float* Cm = u + n0 * Cc + s.c_at() + g * Ns;
        // S0 nonzero and not forgotten at once; the chunk's last state needed (by the next chunk or the caller).
        const bool has_state = (c > 0 || carried) && !s.starts_document(n0);
        const bool keeps_state = c + 1 < s.chunks() || carried;
        gemm_f32(Trans::N, Trans::T, L, L, Ns, 1.0f, Cm, Cc, Bm, Cc, 0.0f, f.CB.data(), C);
        for (int64_t h = g * hpg; h < (g + 1) * hpg; ++h) {
          float* St = f.S.data() + (h - g * hpg) * S;
          if (checkpoints)
            std::memcpy(checkpoints + ((b * H + h) * s.chunks() + c) * S, St, size_t(S) * sizeof(float));
          const float A = -math::exp(A_log[h]);
          chunk_decays(f, dt + n0 * H + h, H, A, n0, L, false, s);
          const float* X = u + n0 * Cc + h * P;
          float* Y = y + (n0 * H + h) * P;
          // Y = M X + diag(e) C S0^T + D X.
          gemm_f32(Trans::N, Trans::N, L, P, L, 1.0f, f.M.data(), C, X, Cc, 0.0f, Y, HP);
          if (has_state) {
            for (int64_t t = 0; t < L; ++t)
              for (int64_t m = 0; m < Ns; ++m) f.Ce[size_t(t * Ns + m)] = f.e[size_t(t)] * Cm[t * Cc + m];
            gemm_f32(Trans::N, Trans::T, L, P, Ns, 1.0f, f.Ce.data(), Ns, St, Ns, 1.0f, Y, HP);
          }
          for (int64_t t = 0; t < L; ++t)
            for (int64_t p = 0; p < P; ++p) Y[t * HP + p] += D[h] * X[t * Cc + p];
          // S_last = e_last S0 + X^T diag(w) B.
          if (keeps_state) {
            for (int64_t t = 0; t < L; ++t)
              for (int64_t m = 0; m < Ns; ++m) f.Bw[size_t(t * Ns + m)] = f.w[size_t(t)] * Bm[t * Cc + m];
            gemm_f32(Trans::T, Trans::N, P, Ns, L, 1.0f, X, Cc, f.Bw.data(), Ns, has_state ? f.e[size_t(L - 1)] : 0.0f,
                     St, Ns);
          }
        }
      }
      if (carried) std::memcpy(carried, f.S.data(), f.S.size() * sizeof(float));
    }
  }
}

void mamba_scan_backward(float* du, float* d_dt, float* dA_log, float* dD, float* work, const float* dy,
                         const float* checkpoints, const float* u, const float* dt, const float* A_log, const float* D,
                         const MambaShape& s) {
  LATTICE_KERNEL_ENTRY(cuda::mamba_scan_backward(du, d_dt, dA_log, dD, work, dy, checkpoints, u, dt, A_log, D, s));
  (void)work;
  mamba_check_shape(s, "mamba_scan_backward");
  const int64_t H = s.H, P = s.P, Ns = s.N, Cc = s.conv(), S = s.state(), hpg = s.heads_per_group();
  const int64_t G = s.G, T = s.T, HP = H * P;
  // The per-head parameters' gradients of each sequence [B, H] each, summed over the sequences after.
  std::vector<float> dA_b(size_t(s.B * H), 0.0f), dD_b(size_t(s.B * H), 0.0f);
#pragma omp parallel if (s.rows() * H * S > kParallelMin)
  {
    ScanBuffers f(s, true);
    const int64_t C = f.C;
#pragma omp for schedule(static)
    for (int64_t bg = 0; bg < s.B * G; ++bg) {
      const int64_t b = bg / G, g = bg % G;
      // The group's B and C gradient columns of this sequence, zeroed, then each head's added in order.
      for (int64_t t = 0; t < T; ++t) {
        float* dun = du + (b * T + t) * Cc;
        std::fill(dun + s.b_at() + g * Ns, dun + s.b_at() + (g + 1) * Ns, 0.0f);
        std::fill(dun + s.c_at() + g * Ns, dun + s.c_at() + (g + 1) * Ns, 0.0f);
      }
      std::fill(f.S.begin(), f.S.end(), 0.0f);  // each head's dS: the gradient of the state after the chunk
      std::fill(f.dA.begin(), f.dA.end(), 0.0f);
      std::fill(f.dD.begin(), f.dD.end(), 0.0f);
      for (int64_t c = s.chunks(); c-- > 0;) {
        const int64_t t0 = c * s.chunk, L = std::min(T, t0 + s.chunk) - t0, n0 = b * T + t0, last = L - 1;
        const float* Bm = u + n0 * Cc + s.b_at() + g * Ns;
        const float* Cm = u + n0 * Cc + s.c_at() + g * Ns;
        float* dB = du + n0 * Cc + s.b_at() + g * Ns;
        float* dC = du + n0 * Cc + s.c_at() + g * Ns;
        const bool has_state = c > 0 && !s.starts_document(n0);  // as the forward's
        const bool carried = c + 1 < s.chunks();                 // dS nonzero
        gemm_f32(Trans::N, Trans::T, L, L, Ns, 1.0f, Cm, Cc, Bm, Cc, 0.0f, f.CB.data(), C);
        for (int64_t t = 0; t < L; ++t) std::fill(f.dCB.begin() + t * C, f.dCB.begin() + t * C + L, 0.0f);
        for (int64_t h = g * hpg; h < (g + 1) * hpg; ++h) {
          const int64_t hi = h - g * hpg;
          float* dS = f.S.data() + hi * S;
          const float* S0 = checkpoints + ((b * H + h) * s.chunks() + c) * S;
          const float A = -math::exp(A_log[h]);
          const float* dth = dt + n0 * H + h;
          chunk_decays(f, dth, H, A, n0, L, true, s);
          const float* X = u + n0 * Cc + h * P;
          const float* dY = dy + (n0 * H + h) * P;
          float* dX = du + n0 * Cc + h * P;
          std::fill(f.dAcum.begin(), f.dAcum.begin() + L, 0.0f);
          std::fill(f.ddt.begin(), f.ddt.begin() + L, 0.0f);
          // Y = M X + ... + D X: dX = M^T dY + D dY, dD += <dY, X>. S_last = e_last S0 + X^T diag(w) B:
          // dX += diag(w) B dS^T; V = X dS gives dB += diag(w) V and w_s's share V_s . B_s, through wdec_s to
          // dt_s directly and through w_s to Acum_last (+) and Acum_s (-); e_last's share e_last <S0, dS>.
          gemm_f32(Trans::T, Trans::N, L, P, L, 1.0f, f.M.data(), C, dY, HP, 0.0f, dX, Cc);
          if (carried) {
            for (int64_t t = 0; t < L; ++t)
              for (int64_t m = 0; m < Ns; ++m) f.Bw[size_t(t * Ns + m)] = f.w[size_t(t)] * Bm[t * Cc + m];
            gemm_f32(Trans::N, Trans::T, L, P, Ns, 1.0f, f.Bw.data(), Ns, dS, Ns, 1.0f, dX, Cc);
            gemm_f32(Trans::N, Trans::N, L, Ns, P, 1.0f, X, Cc, dS, Ns, 0.0f, f.V.data(), Ns);
            for (int64_t t = 0; t < L; ++t) {
              const float* vt = f.V.data() + t * Ns;
              const float dw = dot(vt, Bm + t * Cc, Ns), wt = f.w[size_t(t)];
              f.ddt[size_t(t)] += dw * f.wdec[size_t(t)];
              if (t != last) {  // w_last = dt_last exp(0): no decay share
                f.dAcum[size_t(last)] += dw * wt;
                f.dAcum[size_t(t)] -= dw * wt;
              }
              float* db = dB + t * Cc;
              for (int64_t m = 0; m < Ns; ++m) db[m] += wt * vt[m];
            }
            if (has_state) f.dAcum[size_t(last)] += f.e[size_t(last)] * dot(S0, dS, S);
          }
          float dDh = 0.0f;
          for (int64_t t = 0; t < L; ++t) {
            float* dxt = dX + t * Cc;
            const float* dyt = dY + t * HP;
            const float* xt = X + t * Cc;
            for (int64_t p = 0; p < P; ++p) {
              dxt[p] += D[h] * dyt[p];
              dDh += dyt[p] * xt[p];
            }
          }
          f.dD[size_t(hi)] += dDh;
          // diag(e) C S0^T: R = dY S0 gives dC += diag(e) R and e_t's share e_t R_t . C_t; dS0 = e_last dS +
          // dY^T diag(e) C, carried to the chunk before (0 when the state is forgotten at the chunk's start).
          if (has_state) {
            gemm_f32(Trans::N, Trans::N, L, Ns, P, 1.0f, dY, HP, S0, Ns, 0.0f, f.R.data(), Ns);
            for (int64_t t = 0; t < L; ++t) {
              const float* rt = f.R.data() + t * Ns;
              const float et = f.e[size_t(t)];
              f.dAcum[size_t(t)] += et * dot(rt, Cm + t * Cc, Ns);
              float* dc = dC + t * Cc;
              for (int64_t m = 0; m < Ns; ++m) dc[m] += et * rt[m];
              float* ce = f.Ce.data() + t * Ns;
              for (int64_t m = 0; m < Ns; ++m) ce[m] = et * Cm[t * Cc + m];
            }
            gemm_f32(Trans::T, Trans::N, P, Ns, L, 1.0f, dY, HP, f.Ce.data(), Ns, f.e[size_t(last)], dS, Ns);
          } else {
            std::fill(dS, dS + S, 0.0f);
          }
          // M = CB o Dec o dt: dM = dY X^T (its lower triangle); dCB += dM o Dec o dt (summed over the group's
          // heads); dt_s's direct share dM_ts CB_ts Dec_ts; Dec_ts's share dM_ts M_ts to Acum_t (+) and Acum_s (-).
          gemm_f32(Trans::N, Trans::T, L, L, P, 1.0f, dY, HP, X, Cc, 0.0f, f.dM.data(), C);
          for (int64_t t = 0; t < L; ++t) {
            const float* dm = f.dM.data() + t * C;
            const float* cb = f.CB.data() + t * C;
            const float* dec = f.Dec.data() + t * C;
            float* dcb = f.dCB.data() + t * C;
            float share = 0.0f;
            for (int64_t v = 0; v <= t; ++v) {
              const float dtv = dth[v * H], e1 = dm[v] * dec[v];
              dcb[v] += e1 * dtv;
              const float direct = e1 * cb[v];
              f.ddt[size_t(v)] += direct;
              if (v < t) {  // Dec_tt = exp(0): no share
                const float q = direct * dtv;
                share += q;
                f.dAcum[size_t(v)] -= q;
              }
            }
            f.dAcum[size_t(t)] += share;
          }
          // Acum_t = a_0 + ... + a_t: da_t = dAcum_t + ... + dAcum_last; a_t = dt_t A: d dt_t += A da_t,
          // dA += da_t dt_t. A document's first token has none (its decay is the constant 0; its document's
          // shares add up to 0 but for rounding).
          float acc = 0.0f, dAh = 0.0f;
          for (int64_t t = L; t-- > 0;) {
            acc += f.dAcum[size_t(t)];
            const bool first = s.starts_document(n0 + t);
            d_dt[(n0 + t) * H + h] = f.ddt[size_t(t)] + (first ? 0.0f : A * acc);
            if (!first) dAh += acc * dth[t * H];
          }
          f.dA[size_t(hi)] += dAh;
        }
        // CB = C B^T: dC += dCB B, dB += dCB^T C (dCB the group's heads' sum).
        gemm_f32(Trans::N, Trans::N, L, Ns, L, 1.0f, f.dCB.data(), C, Bm, Cc, 1.0f, dC, Cc);
        gemm_f32(Trans::T, Trans::N, L, Ns, L, 1.0f, f.dCB.data(), C, Cm, Cc, 1.0f, dB, Cc);
      }
      for (int64_t hi = 0; hi < hpg; ++hi) {
        dA_b[size_t(b * H + g * hpg + hi)] = f.dA[size_t(hi)] * (-math::exp(A_log[g * hpg + hi]));  // dA_log = dA A
        dD_b[size_t(b * H + g * hpg + hi)] = f.dD[size_t(hi)];
      }
    }
  }
  for (int64_t h = 0; h < H; ++h) {
    float da = 0.0f, dd = 0.0f;
    for (int64_t b = 0; b < s.B; ++b) {
      da += dA_b[size_t(b * H + h)];
      dd += dD_b[size_t(b * H + h)];
    }
    dA_log[h] += da;
    dD[h] += dd;
  }
}
void mamba_gated_norm_forward(float* out, float* rstd, const float* y, const float* x, const float* w,
                              const MambaShape& s) {
  LATTICE_KERNEL_ENTRY(cuda::mamba_gated_norm_forward(out, rstd, y, x, w, s));
  mamba_check_shape(s, "mamba_gated_norm_forward");
  const int64_t I = s.inner(), W = s.width(), Dg = s.group_width();
#pragma omp parallel for schedule(static) if (s.rows() * I > kParallelMin)
  for (int64_t n = 0; n < s.rows(); ++n)
    for (int64_t g = 0; g < s.G; ++g) {
      const float* yg = y + n * I + g * Dg;
      const float* zg = x + n * W + g * Dg;
      const float r = math::mamba_gated_rstd(yg, zg, Dg, s.norm_eps);
      rstd[n * s.G + g] = r;
      float* og = out + n * I + g * Dg;
      for (int64_t d = 0; d < Dg; ++d) og[d] = w[g * Dg + d] * (yg[d] * math::silu(zg[d]) * r);
    }
}

void mamba_gated_norm_backward(float* dy, float* dx, float* dw, const float* dout, const float* y, const float* x,
                               const float* w, const float* rstd, const MambaShape& s) {
  LATTICE_KERNEL_ENTRY(cuda::mamba_gated_norm_backward(dy, dx, dw, dout, y, x, w, rstd, s));
  mamba_check_shape(s, "mamba_gated_norm_backward");
  const int64_t I = s.inner(), W = s.width(), Dg = s.group_width();
  // out = w v r, r = (mean v^2 + eps)^-1/2: dv = r (w dout - v r^2 mean(w dout v)); then v = y silu(z).
#pragma omp parallel for schedule(static) if (s.rows() * I > kParallelMin)
  for (int64_t n = 0; n < s.rows(); ++n)
    for (int64_t g = 0; g < s.G; ++g) {
      const float* yg = y + n * I + g * Dg;
      const float* zg = x + n * W + g * Dg;
      const float* dog = dout + n * I + g * Dg;
      const float* wg = w + g * Dg;
      const float r = rstd[n * s.G + g];
      float dot = 0.0f;
      for (int64_t d = 0; d < Dg; ++d) dot += wg[d] * dog[d] * yg[d] * math::silu(zg[d]);
      const float k = r * r * dot / float(Dg);
      float* dyg = dy + n * I + g * Dg;
      float* dzg = dx + n * W + g * Dg;
      for (int64_t d = 0; d < Dg; ++d) {
        const float sz = math::silu(zg[d]), v = yg[d] * sz;
        const float dv = r * (wg[d] * dog[d] - v * k);
        dyg[d] = dv * sz;
        dzg[d] = dv * yg[d] * math::silu_grad(zg[d]);
      }
    }
  // dw[c] += sum_n dout v r, over the rows in order: a block of channels per task, each row's contiguous.
  const int64_t blocks = (I + kChannelBlock - 1) / kChannelBlock;
#pragma omp parallel for schedule(static) if (s.rows() * I > kParallelMin)
  for (int64_t blk = 0; blk < blocks; ++blk) {
    const int64_t c0 = blk * kChannelBlock, nc = std::min(I, c0 + kChannelBlock) - c0;
    float acc[kChannelBlock] = {};
    for (int64_t n = 0; n < s.rows(); ++n) {
      const float* dn = dout + n * I + c0;
      const float* yn = y + n * I + c0;
      const float* zn = x + n * W + c0;
      for (int64_t c = 0; c < nc; ++c) acc[c] += dn[c] * yn[c] * math::silu(zn[c]) * rstd[n * s.G + (c0 + c) / Dg];
    }
    for (int64_t c = 0; c < nc; ++c) dw[c0 + c] += acc[c];
  }
}

}  // namespace lattice
