// Mixed precision for the linear layers: GemmPolicy implementations (model/linear.h)
// for --bf16, --fp16 and --fp8-format. The parameters themselves stay fp32 (they are
// the optimizer's main parameters); each policy keeps its own low-precision copy of
// every weight, re-made after each update (refresh_weights), and rounds the other GEMM
// operand (activation or output gradient) to the format per GEMM. Products are
// accumulated in fp32.
//   bf16: weights and operands in bf16, oneDNN's bf16 matmul (blas gemm_bf16); the GEMM
//         results (layer outputs y, input gradients dx) rounded to bf16.
//   fp16: weights and operands rounded to fp16 (overflow -> inf, which the loss scaler
//         detects), multiplied by the fp32 GEMM: a product of two fp16 values is exact
//         in fp32, so this is fp16 arithmetic with fp32 accumulation. Results rounded to fp16.
//   fp8:  operands quantized per tensor (x * scale onto the e4m3 / e5m2 grid, saturating)
//         with delayed scaling (--fp8-recipe delayed; the current-scaling recipes tensorwise,
//         blockwise and mxfp8 are model/fp8_current_scaling.h's): each tensor's scale comes from the amax history of earlier
//         steps, scale = fp8_max / amax / 2^margin (amax 0 or not finite: the scale is kept;
//         before any history: 1). A tensor's amax for a step is the max over all its uses in
//         the step (every micro-batch), MAX-reduced over the tensor- and data-parallel
//         groups (the ranks that share the layer and the global batch) in finish_step, so
//         every rank uses the same scales and every layout the single-process ones.
//         e4m3 forward; hybrid: e5m2 for the output gradients. fp8 values are exact in
//         bf16, so the products run on gemm_bf16 and the fp32 sum is multiplied by
//         1 / (scale_a * scale_b). Outputs stay fp32.
//   Results of a GEMM are rounded (bf16, fp16) after the tensor-parallel reduction of a
//   partial sum, not per rank (GemmPolicy::round_result), so layouts agree.
#pragma once
#include <array>
#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "kernels/cast.h"
#include "model/linear.h"

namespace lattice {

class Comm;

// fp8's delayed-scaling state of one weight (checkpoints): for its input, weight and output
// gradient (in that order) the amax history, most recent first, and the current scale.
struct Fp8ScalingState {
  std::array<std::vector<float>, 3> amax_history;
  std::array<float, 3> scale{1.0f, 1.0f, 1.0f};
};

class MixedPrecisionPolicy : public GemmPolicy {
 public:
  // The main (fp32) parameters changed: the low-precision weight copies are re-made from
  // them at their next use.
  virtual void refresh_weights() = 0;
  // After the last micro-batch's backward of a step (collective over the groups the
  // policy was made with: every rank of them calls it). fp8: the step's amaxes enter the
  // histories.
  virtual void finish_step() {}
  // Evaluation (false) between the training steps: fp8's forward passes quantize with the
  // current scales but note no amax, so evaluating never changes the training run (nor
  // leaves amaxes a checkpoint would not hold). True again for training.
  virtual void set_training(bool training) {}
  virtual const char* name() const = 0;
  // fp8: the scaling state of every weight used so far, by parameter index (empty for the
  // other formats), and its restoration (a resumed run continues with the saved scales).
  virtual std::map<int, Fp8ScalingState> scaling_state() const { return {}; }
  virtual void load_scaling_state(int param, const Fp8ScalingState& state) {}
};

enum class HalfFormat { bf16, fp16 };
std::unique_ptr<MixedPrecisionPolicy> make_half_precision_policy(HalfFormat format);

// --fp8-recipe: where the scales come from. delayed: per tensor, from the amaxes of earlier
// steps. The current-scaling recipes (model/fp8_current_scaling.h) scale each operand by its
// own values at the GEMM that reads it: tensorwise per tensor; blockwise per 1 x 128 block
// of activations and gradients and 128 x 128 block of weights, scales powers of 2; mxfp8 per
// 32 values along the GEMM's inner dimension, E8M0 scales.
enum class Fp8Scaling { delayed, tensorwise, blockwise, mxfp8 };
// The recipe named by --fp8-recipe (delayed, tensorwise, blockwise, mxfp8); an error names the flag.
Fp8Scaling parse_fp8_scaling(const std::string& recipe);
const char* fp8_scaling_name(Fp8Scaling s);

struct Fp8Recipe {
  Fp8Scaling scaling = Fp8Scaling::delayed;
  Fp8Format forward = Fp8Format::e4m3;   // activations and weights
  Fp8Format backward = Fp8Format::e4m3;  // output gradients (e5m2 with --fp8-format hybrid)
  // Delayed scaling's (the other recipes have no margin or history, as in Transformer Engine):
  int64_t margin = 0;                    // --fp8-margin
  int64_t amax_history_len = 1;          // --fp8-amax-history-len
  bool amax_max = false;                 // --fp8-amax-compute-algo max (false: most_recent)
  // --no-fp8-wgrad (Megatron's; Transformer Engine's override_linear_precision wgrad): the weight
  // gradients' GEMM reads the output gradients and inputs unquantized (fp32), the other GEMMs fp8.
  bool fp8_wgrad = true;
};

// The recipe for the flags; errors name the flag. format: e4m3 | hybrid.
Fp8Recipe make_fp8_recipe(const std::string& format, int64_t margin, int64_t amax_history_len,
                          const std::string& amax_compute_algo);

// The model's parameters as fp8's amax reduction needs them: how many (every rank then reduces the
// same list, with the weights it has not used yet, such as an expert no token has reached, as
// unused), and under expert parallelism which are expert weights (ParamInfo::expert), reduced over
// the expert data-parallel group (the replicas of the same experts) instead of the data-parallel one.
struct Fp8Params {
  int64_t count = 0;          // 0: unknown (the list grows as weights are used: one rank only)
  std::vector<bool> expert;   // by parameter index (empty: none)
  Comm* expert_dp = nullptr;
  // Whole experts (--expert-tensor-parallel-size 1 under tensor parallelism): the tensor-parallel ranks
  // hold other experts, so the experts' amaxes are reduced over expert_dp alone.
  bool experts_whole = false;
  // The context-parallel group: tensorwise scaling MAX-reduces an activation's or output
  // gradient's amax over it (the sequence's other chunks), as over the tensor-parallel group.
  Comm* cp = nullptr;
  // By parameter index, the weights whose GEMMs stay out of fp8 (the output layer, as Megatron's;
  // --first-last-layers-bf16's layers): in unquantized_format (--bf16's or --fp16's policy), or
  // fp32 without one. Empty: every linear layer is fp8.
  std::vector<bool> unquantized;
  std::optional<HalfFormat> unquantized_format;
};

// tp, dp: the tensor- and data-parallel groups the amaxes are reduced over (null or size
// 1: none). A current-scaling recipe reduces per GEMM over tp (and params.cp), never over dp.
std::unique_ptr<MixedPrecisionPolicy> make_fp8_policy(const Fp8Recipe& recipe, Comm* tp, Comm* dp = nullptr,
                                                      const Fp8Params& params = {});

// Delayed scaling of one tensor: the amax history and the scale derived from it.
class DelayedScale {
 public:
  explicit DelayedScale(const Fp8Recipe& r, Fp8Format f) : recipe_(r), format_(f) {}
  float scale() const { return scale_; }
  // Records the amax of the tensor's latest use and recomputes the scale.
  void record(float amax);
  std::vector<float> history() const { return {history_.begin(), history_.end()}; }
  // A saved state (checkpoints): the history (cut to the recipe's length) and the scale.
  void restore(const std::vector<float>& history, float scale);

 private:
  Fp8Recipe recipe_;
  Fp8Format format_;
  std::deque<float> history_;
  float scale_ = 1.0f;
};

}  // namespace lattice
