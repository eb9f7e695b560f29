#include "optim/muon.h"

#include <algorithm>
#include <cmath>
#include <utility>

#include "blas/gemm.h"
#include "core/device.h"
#include "core/error.h"
#include "kernels/muon.h"
#include "kernels/optimizer.h"

namespace lattice {

bool muon_matrix(const ParamInfo& p) {
  const std::string mamba_in_proj = "mixer.in_proj.weight";
  const bool in_proj = p.name.size() >= mamba_in_proj.size() &&
                       p.name.compare(p.name.size() - mamba_in_proj.size(), mamba_in_proj.size(), mamba_in_proj) == 0;
  return p.shape.size() == 2 && !p.buffer && !p.shared_embedding_copy && p.name != "embedding.word_embeddings.weight" &&
         p.name != "output_layer.weight" && !in_proj;
}

int64_t muon_matrix_elements(const std::vector<ParamInfo>& infos) {
  int64_t n = 0;
  for (const ParamInfo& p : infos)
    if (muon_matrix(p)) n += p.numel;
  return n;
}

bool muon_qkv(const ParamInfo& p) {
  const std::string tail = "linear_qkv.weight";
  return p.shape.size() == 2 && p.name.size() >= tail.size() &&
         p.name.compare(p.name.size() - tail.size(), tail.size(), tail) == 0;
}

std::vector<NsCoefficients> newton_schulz_coefficients(const std::string& type, int64_t steps) {
  // Emerging-Optimizers' sets (muon_utils.py), as fp32.
  std::vector<NsCoefficients> sets;
  bool repeat_last = false;
  if (type == "simple") {
    sets = {{3.4445f, -4.7750f, 2.0315f}};
  } else if (type == "quintic") {
    sets = {{4.0848f, -6.8946f, 2.9270f},
            {3.9505f, -6.3029f, 2.6377f},
            {3.7418f, -5.5913f, 2.3037f},
            {2.8769f, -3.1427f, 1.2046f},
            {2.8366f, -3.0525f, 1.2012f}};
  } else if (type == "polar_express") {
    sets = {{8.2051f, -22.9019f, 16.4607f}, {4.0664f, -2.8612f, 0.5184f}, {3.9096f, -2.8234f, 0.5250f},
            {3.2856f, -2.4153f, 0.4853f},   {2.2779f, -1.6198f, 0.3985f}, {1.8726f, -1.2307f, 0.3585f},
            {1.8564f, -1.2132f, 0.3568f},   {1.8750f, -1.2500f, 0.3750f}};
    repeat_last = true;
  } else if (type == "aol") {
    sets = {{4.0098f, -7.0585f, 2.4635f},
            {3.4585f, -5.5479f, 2.5959f},
            {2.7573f, -3.2939f, 1.4254f},
            {2.7215f, -3.0494f, 1.3169f}};
  } else {
    LATTICE_FAIL() << "--muon-coefficient-type must be simple, quintic, polar_express or aol, got '" << type << "'";
  }
  if (steps < 1) LATTICE_FAIL() << "--muon-num-ns-steps must be at least 1, got " << steps;
  std::vector<NsCoefficients> out;
  for (int64_t s = 0; s < steps; ++s)
    out.push_back(repeat_last ? sets[size_t(std::min<int64_t>(s, int64_t(sets.size()) - 1))]
                              : sets[size_t(s % int64_t(sets.size()))]);
  return out;
}

double muon_scale_factor(int64_t rows, int64_t cols, const std::string& mode) {
  if (mode == "spectral") return std::sqrt(double(std::max(rows, cols)));
  if (mode == "unit_rms_norm") return std::sqrt(double(rows) / double(cols));
  if (mode == "shape_scaling") return std::sqrt(std::max(1.0, double(rows) / double(cols)));
  LATTICE_FAIL() << "--muon-scale-mode must be spectral, unit_rms_norm or shape_scaling, got '" << mode << "'";
}

MuonWorkspace::MuonWorkspace(int64_t elements, int64_t gram, int64_t whole, int64_t piece)
    : u_(size_t(elements) * sizeof(float)),
      piece_(size_t(piece) * sizeof(float)),
      t_(size_t(std::max(elements, whole)) * sizeof(float)),
      a_(size_t(gram) * sizeof(float)),
      b_(size_t(gram) * sizeof(float)),
      gathered_(size_t(whole) * sizeof(float)),
      whole_(size_t(whole) * sizeof(float)) {}

void newton_schulz(float* x, int64_t rows, int64_t cols, const std::vector<NsCoefficients>& steps, MuonWorkspace& ws) {
  const int64_t n = rows * cols;
  // torch.nn.functional.normalize over the matrix: x / max(||x||_F, eps), eps 1e-7.
  const float norm = float(std::sqrt(sum_of_squares(x, n)));
  divide_inplace(x, std::max(norm, 1e-7f), n);
  // A matrix with more rows than columns is iterated as its transpose Y = X^T: A = Y Y^T = X^T X
  // and Y' = a Y + B Y, i.e. X' = a X + X B^T.
  const bool tall = rows > cols;
  const int64_t k = tall ? cols : rows;
  float *cur = x, *next = ws.t(), *A = ws.a(), *B = ws.b();
  for (const NsCoefficients& s : steps) {
    if (tall)
      gemm_f32(Trans::T, Trans::N, k, k, rows, 1.0f, cur, cols, cur, cols, 0.0f, A, k);
    else
      gemm_f32(Trans::N, Trans::T, k, k, cols, 1.0f, cur, cols, cur, cols, 0.0f, A, k);
    copy_on_device(B, A, size_t(k * k) * sizeof(float));                 // B = b A + c A A (torch.addmm(A, A, A))
    gemm_f32(Trans::N, Trans::N, k, k, k, s.c, A, k, A, k, s.b, B, k);
    copy_on_device(next, cur, size_t(n) * sizeof(float));               // X' = a X + B X (torch.addmm(X, B, X))
    if (tall)
      gemm_f32(Trans::N, Trans::T, rows, cols, cols, 1.0f, cur, cols, B, cols, s.a, next, cols);
    else
      gemm_f32(Trans::N, Trans::N, rows, cols, rows, 1.0f, B, rows, cur, cols, s.a, next, cols);
    std::swap(cur, next);
  }
  if (cur != x) copy_on_device(x, cur, size_t(n) * sizeof(float));
}

MuonWorkspaceSize muon_workspace_size(const std::vector<ParamInfo>& params, const MuonConfig& cfg, int tp) {
  MuonWorkspaceSize s;
  int64_t per_group = 0;
  for (int64_t r : cfg.qkv_split_rows) per_group += r;
  const bool duplicated = cfg.tp_mode == "duplicated" && tp > 1;
  auto matrix = [&](int64_t rows, int64_t cols, int split_dim) {  // one orthogonalized matrix (a shard of one)
    if (duplicated && split_dim >= 0) {
      (split_dim == 0 ? rows : cols) *= tp;
      s.whole = std::max(s.whole, rows * cols);
    }
    s.gram = std::max(s.gram, std::min(rows, cols) * std::min(rows, cols));
  };
  for (const ParamInfo& p : params) {
    if (!muon_matrix(p)) continue;
    const int64_t rows = p.shape[0], cols = p.shape[1];
    s.elements = std::max(s.elements, rows * cols);
    if (per_group > 0 && muon_qkv(p) && rows % per_group == 0)
      for (int64_t r : cfg.qkv_split_rows) {
        s.piece = std::max(s.piece, rows / per_group * r * cols);
        matrix(rows / per_group * r, cols, p.tp_split_dim);
      }
    else
      matrix(rows, cols, p.tp_split_dim);
  }
  return s;
}

}  // namespace lattice
