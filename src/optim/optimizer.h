// Optimizers over a ParamBuffer: Megatron's --optimizer adam (AdamW: decoupled
// weight decay, none on biases and 1-D parameters), sgd (momentum) and muon (optim/muon.h: the
// weight matrices orthogonalized, Adam for the rest), plus global gradient-norm clipping (--clip-grad).
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "core/storage.h"
#include "optim/muon.h"
#include "optim/opt_param_scheduler.h"
#include "optim/param_buffer.h"

namespace lattice {

struct OptimizerConfig {
  std::string optimizer = "adam";  // adam | sgd | muon
  float adam_beta1 = 0.9f;
  float adam_beta2 = 0.999f;
  float adam_eps = 1e-8f;
  float sgd_momentum = 0.9f;
  float clip_grad = 1.0f;          // 0 disables clipping
  // Megatron's precision-aware optimizer (--use-precision-aware-optimizer --exp-avg-dtype bf16
  // --exp-avg-sq-dtype bf16): Adam's first (second) moment stored in bf16, 2 bytes instead of 4
  // (kernels/optimizer.h AdamwMoments); the step itself is fp32.
  bool exp_avg_bf16 = false;
  bool exp_avg_sq_bf16 = false;
  MuonConfig muon;  // --optimizer muon's settings (its scalar parameters take Adam's above)
};

// Element ranges [begin, end) of the flat buffer a rank updates. Empty: the whole buffer.
// With the distributed optimizer each data-parallel rank owns its shard of every bucket.
using ElementRanges = std::vector<std::pair<int64_t, int64_t>>;

class Comm;

// L2 norm of the gradients in `ranges` (all when empty), accumulated in double; when
// `dp` is given the squares are summed over its ranks (the ranges being a shard); when
// `tp` is given they are summed over the tensor-parallel group too, counting the
// parameters every TP rank holds a copy of (ParamInfo::tp_duplicated) once; with `pp`
// over the pipeline stages, counting the tied embedding's copy on the last stage
// (ParamInfo::shared_embedding_copy) not at all, nor buffers (ParamInfo::buffer); with `ep` the
// expert weights' squares (ParamInfo::expert) are summed over the expert-parallel group first
// (each of its ranks holding other experts; not with `dp`, whose shards already cover them).
// `whole`: the experts are whole on their ranks (--expert-tensor-parallel-size 1 under tensor
// parallelism, their expert-parallel group spanning the tensor-parallel ranks): their squares are
// summed over whole->shard (their distributed-optimizer shards' group; null: none), then whole->ep,
// and added after the tensor-parallel sum of the others (`ep` and `dp` then count the others only).
struct WholeExperts {
  Comm* shard = nullptr;
  Comm* ep = nullptr;
};
double grad_norm(const ParamBuffer& params, const ElementRanges& ranges = {}, Comm* dp = nullptr,
                 Comm* tp = nullptr, Comm* pp = nullptr, Comm* ep = nullptr, const WholeExperts* whole = nullptr);
// The same for the (fp32) parameters: Megatron's --log-params-norm.
double params_norm(const ParamBuffer& params, const ElementRanges& ranges = {}, Comm* dp = nullptr,
                   Comm* tp = nullptr, Comm* pp = nullptr, Comm* ep = nullptr, const WholeExperts* whole = nullptr);
// How many gradients are zero, counted as grad_norm counts: Megatron's --log-num-zeros-in-grad.
int64_t count_zero_grads(const ParamBuffer& params, const ElementRanges& ranges = {}, Comm* dp = nullptr,
                         Comm* tp = nullptr, Comm* pp = nullptr, Comm* ep = nullptr,
                         const WholeExperts* whole = nullptr);

// Gradient clipping's coefficient for a global norm: max_norm / (norm + 1e-6) when that is
// below 1 (Megatron's and torch's rule), else 1 (no clipping; max_norm <= 0: never). The
// optimizer applies it as it reads the gradients (Optimizer::step's grad_scale): the bits of
// scaling them in place first, without that pass.
float clip_coefficient(double norm, double max_norm);

class Optimizer {
 public:
  // Keeps state for, and updates, only the elements in `owned` (all when empty). `tp`: the tensor-parallel
  // group, for Muon's --muon-tp-mode duplicated (the shards gathered over it).
  Optimizer(ParamBuffer& params, const OptimizerConfig& config, const ElementRanges& owned = {}, Comm* tp = nullptr);
  // One update, each parameter with the learning rate and weight decay of its group in
  // the scheduler's current state (decoupled lr, wd_mult 0 for biases and 1-D params).
  // grad_scale multiplies every gradient as it is read (clip_coefficient; 1: none).
  void step(const OptimizerParamScheduler& scheduler, float grad_scale = 1.0f);
  // One update with one learning rate for all parameters and the given weight decay for
  // those that take weight decay (a constant schedule).
  void step(double lr, double weight_decay, float grad_scale = 1.0f);
  int64_t steps() const { return step_; }
  // State tensors (device memory): Adam exp_avg / exp_avg_sq, or SGD momentum (second
  // null), compact over the owned segments in order (with Muon, Adam's segments first, then the
  // matrices', whose momentum is in the first and which have none in the second); fp32, or bf16
  // patterns where state_bf16(slot) (read them through export_state).
  float* state1() const { return state1_.as<float>(); }
  float* state2() const { return state2_.as<float>(); }
  bool state_bf16(int slot) const { return slot == 1 ? cfg_.exp_avg_bf16 : cfg_.exp_avg_sq_bf16; }
  // The state and, with Muon, its scratch (MuonWorkspace, muon_workspace_size).
  size_t state_bytes() const { return state1_.size() + state2_.size() + muon_ws_.bytes(); }
  size_t scratch_bytes() const { return muon_ws_.bytes(); }  // of state_bytes(): Muon's MuonWorkspace
  int64_t state_numel() const { return state_numel_; }  // per slot
  void set_steps(int64_t s) { step_ = s; }
  // Slot 1 (exp_avg / momentum) or 2 (exp_avg_sq) in the flat buffer's layout: export
  // writes the owned elements into the host array `flat` (params().numel() floats; others untouched,
  // and in slot 2 Muon's matrices, which have no second moment), import reads them from it. Checkpoints store full tensors this way, so a state
  // saved under one data-parallel sharding loads under any other. In fp32 whatever the state's
  // dtype: a bf16 moment exported exactly, imported rounded to nearest even (so fp32 and bf16
  // states load into each other).
  void export_state(int slot, float* flat) const;
  void import_state(int slot, const float* flat);

 private:
  // A piece of one parameter inside the owned ranges; its state lives at state_offset. muon: a
  // whole matrix Muon updates (its momentum in slot 1; nothing in slot 2).
  struct Segment {
    int param;
    int64_t begin, end, state_offset;
    bool muon = false;
  };
  // Muon's update of one matrix (muon_step) with its learning rate and weight decay.
  void muon_step(const Segment& s, float lr, float wd, float grad_scale);
  // x [rows, cols], this rank's part of a matrix split along split_dim (-1: whole), replaced by its part of
  // the orthogonalized matrix (blockwise: the part alone). Returns the shape the scale is taken of.
  std::pair<int64_t, int64_t> orthogonalize(float* x, int64_t rows, int64_t cols, int split_dim);

  // One update of every segment, segment k with lr_wd(k) = {learning rate, weight decay}:
  // AdamW in one call over all segments (adamw_update_ranges), SGD segment by segment.
  template <class LrWd>
  void update(const LrWd& lr_wd, float grad_scale);

  ParamBuffer& params_;
  OptimizerConfig cfg_;
  std::vector<NsCoefficients> ns_steps_;  // Muon's
  MuonWorkspace muon_ws_;
  Comm* tp_ = nullptr;
  std::vector<Segment> segments_;
  Storage state1_, state2_;
  int64_t state_numel_ = 0;
  int64_t adam_numel_ = 0;  // of state_numel_: the elements Adam updates (slot 2's)
  int64_t step_ = 0;
};

}  // namespace lattice
