// Muon (Megatron's --optimizer muon, through Emerging-Optimizers' OrthogonalizedOptimizer): the
// 2-D weight matrices get momentum followed by a Newton-Schulz orthogonalization of the update
// direction; every other parameter (the word embedding, the output layer, norms, biases) Adam
// (Megatron's --muon-scalar-optimizer adam). Per matrix W with gradient g, in fp32:
//   W = W - lr * wd * W                              (decoupled weight decay, first)
//   m = lerp(m, g, 1 - beta);  u = m, or lerp(g, m, beta) with Nesterov
//   W = W - lr * NS(u / max(||u||_F, 1e-7)) * scale(rows, cols) * extra_scale_factor
// NS: the Newton-Schulz iteration X = a X + (b A + c A A) X, A = X X^T, over a matrix with no more
// rows than columns (a taller one transposed), one (a, b, c) per step (--muon-coefficient-type).
// --muon-split-qkv orthogonalizes linear_qkv's queries, keys and values (and gates) apart, each with
// its own scale. Tensor parallelism: each rank's shard on its own (Megatron's default
// --muon-tp-mode blockwise, the shard's shape in the scale), or with duplicated the shards gathered
// over the tensor-parallel group, the whole matrix orthogonalized on every rank (the whole shape in
// the scale) and each rank's part kept: the single process's numbers.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "core/storage.h"
#include "optim/param_buffer.h"

namespace lattice {

struct MuonConfig {
  float momentum = 0.9f;  // --muon-momentum (Megatron's command-line default)
  bool nesterov = false;  // --muon-use-nesterov
  int64_t ns_steps = 5;   // --muon-num-ns-steps
  std::string coefficient_type = "quintic";  // --muon-coefficient-type: simple | quintic | polar_express | aol
  std::string scale_mode = "spectral";       // --muon-scale-mode: spectral | unit_rms_norm | shape_scaling
  float extra_scale_factor = 1.0f;           // --muon-extra-scale-factor
  // --muon-split-qkv (default on): linear_qkv's rows per query group, piece by piece (Megatron's
  // qkv_split_shapes: [R D, D, D], with the output gate [R D, R D, D, D]); empty: not split.
  std::vector<int64_t> qkv_split_rows;
  std::string tp_mode = "blockwise";  // --muon-tp-mode: blockwise | duplicated
};

// Whether Muon updates parameter p: a 2-D matrix other than the word embedding and the output
// layer (Megatron's rule: not is_embedding_or_output_parameter and len(shape) == 2) and a Mamba layer's
// in_proj (its z, x, B, C and dt rows, which Megatron's MambaMixer marks use_muon False).
bool muon_matrix(const ParamInfo& p);
// The elements of the matrices Muon updates among `infos` (they keep a momentum and no second moment).
int64_t muon_matrix_elements(const std::vector<ParamInfo>& infos);
// Whether p is a fused QKV weight (--muon-split-qkv splits it).
bool muon_qkv(const ParamInfo& p);

struct NsCoefficients {
  float a, b, c;
};
// The coefficients of each of `steps` Newton-Schulz steps for a --muon-coefficient-type (quintic:
// its five sets in turn; simple: one set; polar_express: its eight, then the last repeated; aol:
// its four in turn). Errors name the flag.
std::vector<NsCoefficients> newton_schulz_coefficients(const std::string& type, int64_t steps);
// The update's scale for a [rows, cols] matrix: spectral sqrt(max(rows, cols)), unit_rms_norm
// sqrt(rows / cols), shape_scaling sqrt(max(1, rows / cols)).
double muon_scale_factor(int64_t rows, int64_t cols, const std::string& mode);

// Device scratch for matrices up to `elements` values with Gram matrices up to `gram` values: the
// update direction u, the iteration's other X and its A and B; `piece` values for a piece of a split
// linear_qkv (--muon-split-qkv); with --muon-tp-mode duplicated, `whole` values for a gathered matrix
// and its columns put in place.
class MuonWorkspace {
 public:
  MuonWorkspace() = default;
  MuonWorkspace(int64_t elements, int64_t gram, int64_t whole = 0, int64_t piece = 0);
  float* u() const { return u_.as<float>(); }
  float* piece() const { return piece_.as<float>(); }
  float* t() const { return t_.as<float>(); }
  float* a() const { return a_.as<float>(); }
  float* b() const { return b_.as<float>(); }
  float* gathered() const { return gathered_.as<float>(); }
  float* whole() const { return whole_.as<float>(); }
  size_t bytes() const {
    return u_.size() + piece_.size() + t_.size() + a_.size() + b_.size() + gathered_.size() + whole_.size();
  }

 private:
  Storage u_, piece_, t_, a_, b_, gathered_, whole_;
};

// x [rows, cols] (device memory) replaced by NS(x / max(||x||_F, 1e-7)) with the given steps.
void newton_schulz(float* x, int64_t rows, int64_t cols, const std::vector<NsCoefficients>& steps, MuonWorkspace& ws);

// The scratch Muon needs for the matrices of `params` (their largest, and the largest Gram matrix
// of any of them or, with the QKV split, of its pieces), in floats; with --muon-tp-mode duplicated and
// tensor parallelism of `tp` ranks the whole matrices' too (whole: 0 otherwise).
struct MuonWorkspaceSize {
  int64_t elements = 0, gram = 0, whole = 0, piece = 0;
  size_t bytes() const {  // MuonWorkspace's: u, piece, t (the larger of elements and whole), a, b, gathered, whole
    return size_t(elements + piece + (elements > whole ? elements : whole) + 2 * gram + 2 * whole) * sizeof(float);
  }
};
MuonWorkspaceSize muon_workspace_size(const std::vector<ParamInfo>& params, const MuonConfig& cfg, int tp = 1);

}  // namespace lattice
