#include "model/qk_layernorm.h"

#include "core/device.h"
#include "core/error.h"

namespace lattice {
namespace {

// The queries and keys of qkv [N, G, R + 2, D] (with gates [N, G, 2R + 2, D]) <-> rows [N H | N G, D]
// (qk_layernorm.h). Per token and group the R query vectors are one block of R D values, the key one of D.
void copy_qk(float* qkv, float* rows, int64_t N, const QkvLayout& L, bool gather) {
  const int64_t R = L.R(), D = L.D, blocks = N * L.G, key = L.kv_slot(0, 1) * D;
  const size_t f = sizeof(float), group = size_t(L.group_slots() * D) * f;
  float* keys = rows + N * L.H * D;
  if (gather) {
    copy_rows_on_device(rows, size_t(R * D) * f, qkv, group, size_t(R * D) * f, size_t(blocks));
    copy_rows_on_device(keys, size_t(D) * f, qkv + key, group, size_t(D) * f, size_t(blocks));
  } else {
    copy_rows_on_device(qkv, group, rows, size_t(R * D) * f, size_t(R * D) * f, size_t(blocks));
    copy_rows_on_device(qkv + key, group, keys, size_t(D) * f, size_t(D) * f, size_t(blocks));
  }
}

void check_layout(const QkvLayout& L, const char* what) {
  LATTICE_CHECK(L.H > 0 && L.G > 0 && L.D > 0 && L.H % L.G == 0)
      << what << ": heads " << L.H << ", groups " << L.G << ", head dim " << L.D;
}

}  // namespace

void qk_layernorm_forward(float* qkv, float* raw, float* mean, float* rstd, float* tmp, const QkNormParams& p,
                          int64_t N, const QkvLayout& layout, float eps, Normalization kind) {
  check_layout(layout, "qk_layernorm_forward");
  if (N <= 0) return;
  const int64_t D = layout.D, NH = N * layout.H, NG = N * layout.G;
  copy_qk(qkv, raw, N, layout, true);
  layernorm_forward(tmp, mean, rstd, raw, p.q_w, p.q_b, NH, D, eps, kind);
  layernorm_forward(tmp + NH * D, mean + NH, rstd + NH, raw + NH * D, p.k_w, p.k_b, NG, D, eps, kind);
  copy_qk(qkv, tmp, N, layout, false);
}

void qk_layernorm_backward(float* dqkv, const QkNormGrads& g, const float* raw, const float* mean, const float* rstd,
                           const QkNormParams& p, float* d_tmp, float* dx_tmp, int64_t N, const QkvLayout& layout,
                           Normalization kind) {
  check_layout(layout, "qk_layernorm_backward");
  if (N <= 0) return;
  const int64_t D = layout.D, NH = N * layout.H, NG = N * layout.G;
  copy_qk(dqkv, d_tmp, N, layout, true);
  zero_on_device(dx_tmp, size_t(qk_norm_rows(N, layout) * D) * sizeof(float));
  layernorm_backward(dx_tmp, g.q_w, g.q_b, LayerNormDout(d_tmp), raw, p.q_w, mean, rstd, NH, D, {}, kind);
  layernorm_backward(dx_tmp + NH * D, g.k_w, g.k_b, LayerNormDout(d_tmp + NH * D), raw + NH * D, p.k_w, mean + NH,
                     rstd + NH, NG, D, {}, kind);
  copy_qk(dqkv, dx_tmp, N, layout, false);
}

}  // namespace lattice
