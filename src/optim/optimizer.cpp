#include "optim/optimizer.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <sstream>
#include <utility>
#include <vector>

#include "core/device.h"
#include "dist/comm.h"

#include "kernels/elementwise.h"
#include "kernels/muon.h"
#include "kernels/cast_math.h"
#include "kernels/optimizer.h"

namespace lattice {

namespace {

ElementRanges or_whole(const ParamBuffer& params, const ElementRanges& ranges) {
  return ranges.empty() ? ElementRanges{{0, params.numel()}} : ranges;
}

}  // namespace

// sum over the elements of `ranges` of `of(begin, end)`, each element of the model counted once
// over the groups (see grad_norm), summed over dp, tp and pp. `params_only`: never over the
// buffer's alignment gaps between parameters (zeros: they add nothing to a sum of squares, but
// they would to a count of zeros).
template <typename Of>
double model_sum(const ParamBuffer& params, const ElementRanges& ranges, Comm* dp, Comm* tp, Comm* pp, Comm* ep,
                 const WholeExperts* whole, bool params_only, Of of) {
  double total = 0, experts = 0;  // experts: the expert weights' part (with ep or whole)
  const bool skip_tp_duplicates = tp && tp->size() > 1 && tp->rank() != 0;
  const bool split_experts = whole || (ep && ep->size() > 1);
  bool has_copy = false;
  for (const ParamInfo& p : params.infos()) has_copy = has_copy || p.shared_embedding_copy || p.buffer;
  for (auto [rb, re] : or_whole(params, ranges)) {
    if (!skip_tp_duplicates && !has_copy && !params_only && !split_experts) {
      total += of(rb, re);
      continue;
    }
    for (const ParamInfo& p : params.infos()) {
      const int64_t b = std::max(rb, p.offset), e = std::min(re, p.offset + p.numel);
      if (b < e && !(p.tp_duplicated && skip_tp_duplicates) && !p.shared_embedding_copy && !p.buffer)
        (split_experts && p.expert ? experts : total) += of(b, e);
    }
  }
  if (split_experts && !whole) {
    ep->all_reduce(&experts, 1, ReduceOp::sum);
    total += experts;
  }
  if (dp) dp->all_reduce(&total, 1, ReduceOp::sum);
  if (tp && tp->size() > 1) tp->all_reduce(&total, 1, ReduceOp::sum);
  if (whole) {
    for (Comm* g : {whole->shard, whole->ep})
      if (g && g->size() > 1) g->all_reduce(&experts, 1, ReduceOp::sum);
    total += experts;
  }
  if (pp && pp->size() > 1) pp->all_reduce(&total, 1, ReduceOp::sum);
  return total;
}

double grad_norm(const ParamBuffer& params, const ElementRanges& ranges, Comm* dp, Comm* tp, Comm* pp, Comm* ep,
                 const WholeExperts* whole) {
  const float* g = params.grads();
  return std::sqrt(
      model_sum(params, ranges, dp, tp, pp, ep, whole, false, [g](int64_t b, int64_t e) { return sum_of_squares(g + b, e - b); }));
}

double params_norm(const ParamBuffer& params, const ElementRanges& ranges, Comm* dp, Comm* tp, Comm* pp, Comm* ep,
                   const WholeExperts* whole) {
  const float* p = params.params();
  return std::sqrt(
      model_sum(params, ranges, dp, tp, pp, ep, whole, false, [p](int64_t b, int64_t e) { return sum_of_squares(p + b, e - b); }));
}

int64_t count_zero_grads(const ParamBuffer& params, const ElementRanges& ranges, Comm* dp, Comm* tp, Comm* pp,
                         Comm* ep, const WholeExperts* whole) {
  const float* g = params.grads();
  // A double sum of integer counts: exact below 2^53 elements.
  return int64_t(model_sum(params, ranges, dp, tp, pp, ep, whole, true,
                           [g](int64_t b, int64_t e) { return double(count_zeros(g + b, e - b)); }));
}

float clip_coefficient(double norm, double max_norm) {
  if (max_norm <= 0) return 1.0f;
  const double coeff = max_norm / (norm + 1e-6);
  return coeff < 1.0 ? float(coeff) : 1.0f;
}

Optimizer::Optimizer(ParamBuffer& params, const OptimizerConfig& config, const ElementRanges& owned, Comm* tp)
    : params_(params), cfg_(config), tp_(tp) {
  const bool muon = cfg_.optimizer == "muon";
  if (cfg_.optimizer != "adam" && cfg_.optimizer != "sgd" && !muon)
    LATTICE_FAIL() << "--optimizer must be adam, sgd or muon, got " << cfg_.optimizer;
  if (cfg_.optimizer != "adam" && (cfg_.exp_avg_bf16 || cfg_.exp_avg_sq_bf16))
    LATTICE_FAIL() << "--exp-avg-dtype and --exp-avg-sq-dtype are Adam's moments: they need --optimizer adam";
  if (muon && !owned.empty() && owned != ElementRanges{{0, params.numel()}})
    LATTICE_FAIL() << "--optimizer muon does not go with --use-distributed-optimizer (a matrix's Newton-Schulz "
                      "iteration needs all of it; Megatron's layer-wise distributed optimizer is not implemented)";
  if (muon) {
    ns_steps_ = newton_schulz_coefficients(cfg_.muon.coefficient_type, cfg_.muon.ns_steps);
    muon_scale_factor(1, 1, cfg_.muon.scale_mode);  // checks the mode
    if (!(cfg_.muon.momentum >= 0.0f && cfg_.muon.momentum < 1.0f))
      LATTICE_FAIL() << "--muon-momentum must be in [0, 1), got " << cfg_.muon.momentum;
    if (cfg_.muon.tp_mode != "blockwise" && cfg_.muon.tp_mode != "duplicated")
      LATTICE_FAIL() << "--muon-tp-mode must be blockwise or duplicated, got '" << cfg_.muon.tp_mode << "'";
  }
  for (auto [rb, re] : or_whole(params, owned))
    for (size_t k = 0; k < params.infos().size(); ++k) {
      const ParamInfo& p = params.infos()[k];
      const int64_t b = std::max(rb, p.offset), e = std::min(re, p.offset + p.numel);
      if (b >= e) continue;
      segments_.push_back(Segment{int(k), b, e, 0, muon && muon_matrix(p)});
    }
  // The state of Adam's segments first, then of Muon's matrices: slot 2 (exp_avg_sq) holds Adam's alone.
  int64_t state = 0;
  for (bool muon_pass : {false, true})
    for (Segment& s : segments_) {
      if (s.muon != muon_pass) continue;
      s.state_offset = state;
      state += s.end - s.begin;
      if (!muon_pass) adam_numel_ = state;
    }
  state_numel_ = state;
  auto bytes = [&](int64_t n, bool bf16) { return size_t(n) * (bf16 ? sizeof(uint16_t) : sizeof(float)); };
  try {
    state1_ = Storage(bytes(state, cfg_.exp_avg_bf16));
    if (cfg_.optimizer != "sgd") state2_ = Storage(bytes(adam_numel_, cfg_.exp_avg_sq_bf16));
    if (muon) {
      const MuonWorkspaceSize ws = muon_workspace_size(params.infos(), cfg_.muon, tp_ ? tp_->size() : 1);
      if (ws.elements > 0) muon_ws_ = MuonWorkspace(ws.elements, ws.gram, ws.whole, ws.piece);
      zero_on_device(state1_.data(), state1_.size());  // Muon's momentum starts at zero (Adam's moments too)
      zero_on_device(state2_.data(), state2_.size());
    }
  } catch (const OutOfMemory& e) {
    std::ostringstream what;
    what << "the optimizer state (" << state << " parameters)";
    throw e.with_context(what.str());
  }
}

void Optimizer::export_state(int slot, float* flat) const {
  LATTICE_CHECK(slot == 1 || (slot == 2 && cfg_.optimizer != "sgd")) << "no optimizer state slot " << slot;
  const Storage& st = slot == 1 ? state1_ : state2_;
  if (!state_bf16(slot)) {
    for (const Segment& s : segments_)
      if (slot == 1 || !s.muon)
        copy_to_host(flat + s.begin, st.as<float>() + s.state_offset, size_t(s.end - s.begin) * sizeof(float));
    return;
  }
  std::vector<uint16_t> host;
  for (const Segment& s : segments_) {  // (bf16 moments are Adam's: no Muon segment)
    host.resize(size_t(s.end - s.begin));
    copy_to_host(host.data(), st.as<uint16_t>() + s.state_offset, host.size() * sizeof(uint16_t));
    for (size_t i = 0; i < host.size(); ++i) flat[size_t(s.begin) + i] = math::bf16_to_fp32(host[i]);
  }
}

void Optimizer::import_state(int slot, const float* flat) {
  LATTICE_CHECK(slot == 1 || (slot == 2 && cfg_.optimizer != "sgd")) << "no optimizer state slot " << slot;
  const Storage& st = slot == 1 ? state1_ : state2_;
  if (!state_bf16(slot)) {
    for (const Segment& s : segments_)
      if (slot == 1 || !s.muon)
        copy_to_device(st.as<float>() + s.state_offset, flat + s.begin, size_t(s.end - s.begin) * sizeof(float));
    return;
  }
  std::vector<uint16_t> host;
  for (const Segment& s : segments_) {
    host.resize(size_t(s.end - s.begin));
    for (size_t i = 0; i < host.size(); ++i) host[i] = math::fp32_to_bf16(flat[size_t(s.begin) + i]);
    copy_to_device(st.as<uint16_t>() + s.state_offset, host.data(), host.size() * sizeof(uint16_t));
  }
}

void Optimizer::step(const OptimizerParamScheduler& scheduler, float grad_scale) {
  const auto& infos = params_.infos();
  update(
      [&](const Segment& s) {
        const ParamInfo& p = infos[size_t(s.param)];
        return std::pair<double, double>(scheduler.lr_for(p), scheduler.wd_for(p));
      },
      grad_scale);
}

void Optimizer::step(double lr, double weight_decay, float grad_scale) {
  const auto& infos = params_.infos();
  update(
      [&](const Segment& s) {
        return std::pair<double, double>(lr, infos[size_t(s.param)].weight_decay ? weight_decay : 0.0);
      },
      grad_scale);
}

template <class LrWd>
void Optimizer::update(const LrWd& lr_wd, float grad_scale) {
  ++step_;
  float* w = params_.params();
  const float* g = params_.grads();
  if (cfg_.optimizer == "adam" || cfg_.optimizer == "muon") {
    std::vector<AdamwRange> ranges;
    ranges.reserve(segments_.size());
    for (const Segment& s : segments_) {
      const auto [lr, wd] = lr_wd(s);
      if (s.muon)
        muon_step(s, float(lr), float(wd), grad_scale);  // (lr, wd: the scheduler's group values)
      else
        ranges.push_back(AdamwRange{s.begin, s.end - s.begin, s.state_offset, float(lr), float(wd)});
    }
    const AdamwMoments moments{state1_.data(), state2_.data(), cfg_.exp_avg_bf16, cfg_.exp_avg_sq_bf16};
    adamw_update_ranges(w, g, moments, ranges.data(), int64_t(ranges.size()), cfg_.adam_beta1, cfg_.adam_beta2,
                        cfg_.adam_eps, step_, grad_scale);
    return;
  }
  for (const Segment& s : segments_) {
    const auto [lr, wd] = lr_wd(s);
    sgd_update(w + s.begin, g + s.begin, state1() + s.state_offset, s.end - s.begin, float(lr), cfg_.sgd_momentum,
               float(wd), step_ == 1, grad_scale);
  }
}

std::pair<int64_t, int64_t> Optimizer::orthogonalize(float* x, int64_t rows, int64_t cols, int split_dim) {
  const int P = tp_ ? tp_->size() : 1;
  if (cfg_.muon.tp_mode != "duplicated" || split_dim < 0 || P == 1) {
    newton_schulz(x, rows, cols, ns_steps_, muon_ws_);
    return {rows, cols};
  }
  // Every rank's part gathered in rank order: a row split gives the whole matrix's rows (in another
  // order for a blocked weight such as SwiGLU's fc1: the iteration commutes with permuting rows or
  // columns, so each rank's rows come out as the whole matrix's); a column split gives the parts one
  // after another, put side by side first.
  const int64_t n = rows * cols, r = tp_->rank();
  const size_t f = sizeof(float);
  float* g = muon_ws_.gathered();
  copy_on_device(g + r * n, x, size_t(n) * f);
  tp_->all_gather(g, std::vector<int64_t>(size_t(P), n));
  if (split_dim == 0) {
    newton_schulz(g, P * rows, cols, ns_steps_, muon_ws_);
    copy_on_device(x, g + r * n, size_t(n) * f);
    return {P * rows, cols};
  }
  float* w = muon_ws_.whole();
  for (int q = 0; q < P; ++q)
    copy_rows_on_device(w + q * cols, size_t(P * cols) * f, g + q * n, size_t(cols) * f, size_t(cols) * f, size_t(rows));
  newton_schulz(w, rows, P * cols, ns_steps_, muon_ws_);
  copy_rows_on_device(x, size_t(cols) * f, w + r * cols, size_t(P * cols) * f, size_t(cols) * f, size_t(rows));
  return {rows, P * cols};
}

void Optimizer::muon_step(const Segment& s, float lr, float wd, float grad_scale) {
  const ParamInfo& p = params_.infos()[size_t(s.param)];
  const MuonConfig& mc = cfg_.muon;
  const int64_t rows = p.shape[0], cols = p.shape[1], n = s.end - s.begin;
  float* u = muon_ws_.u();
  const double beta = double(mc.momentum);
  muon_momentum(state1() + s.state_offset, u, params_.grads() + s.begin, n, float(1.0 - beta), float(beta),
                mc.nesterov, grad_scale);
  const float decay = float(-double(lr) * double(wd)), step = float(-double(lr));
  int64_t per_group = 0;
  for (int64_t r : mc.qkv_split_rows) per_group += r;
  if (per_group == 0 || !muon_qkv(p) || rows % per_group != 0) {
    const auto [r, c] = orthogonalize(u, rows, cols, p.tp_split_dim);
    muon_apply(params_.params() + s.begin, u, n, decay, float(muon_scale_factor(r, c, mc.scale_mode)),
               mc.extra_scale_factor, step);
    return;
  }
  // --muon-split-qkv: per query group the rows [q | (gate) | k | v]; each kind's rows of every group
  // gathered into one matrix, orthogonalized and scaled on its own, and put back in place.
  const int64_t groups = rows / per_group;
  const size_t row_bytes = size_t(cols) * sizeof(float), group_bytes = size_t(per_group) * row_bytes;
  int64_t first = 0;
  for (int64_t r : mc.qkv_split_rows) {
    float* piece = muon_ws_.piece();
    const size_t piece_bytes = size_t(r) * row_bytes;
    copy_rows_on_device(piece, piece_bytes, u + first * cols, group_bytes, piece_bytes, size_t(groups));
    const auto [sr, sc] = orthogonalize(piece, groups * r, cols, p.tp_split_dim);
    scale_inplace(piece, float(muon_scale_factor(sr, sc, mc.scale_mode)), groups * r * cols);
    scale_inplace(piece, mc.extra_scale_factor, groups * r * cols);
    copy_rows_on_device(u + first * cols, group_bytes, piece, piece_bytes, piece_bytes, size_t(groups));
    first += r;
  }
  muon_apply(params_.params() + s.begin, u, n, decay, 1.0f, 1.0f, step);
}

}  // namespace lattice
