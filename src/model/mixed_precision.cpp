#include "model/mixed_precision.h"

#include <algorithm>
#include <cmath>
#include <type_traits>

#include "blas/gemm.h"
#include "core/error.h"
#include "core/storage.h"
#include "dist/comm.h"
#include "model/fp8_current_scaling.h"
#include "model/gemm_operand_cache.h"

namespace lattice {
namespace {

// The two 16-bit formats: how an operand is stored (Elem), made from fp32 (convert), and
// multiplied (gemm: products exact in fp32, fp32 accumulation), and how a result rounds.
struct Bf16Format {  // bf16 patterns into gemm_bf16
  using Elem = uint16_t;
  using Weight = Bf16Operand;  // bf16 patterns, or widened where gemm_bf16 multiplies in fp32
  static constexpr const char* name = "bf16";
  static constexpr Rounding rounding = Rounding::bf16;
  static void convert(uint16_t* o, const float* i, int64_t n) { cast_fp32_to_bf16(o, i, n); }
  static void gemm(Trans ta, Trans tb, int64_t M, int64_t N, int64_t K, const uint16_t* A, int64_t lda,
                   Bf16Operand B, int64_t ldb, float beta, float* C, int64_t ldc) {
    gemm_bf16(ta, tb, M, N, K, 1.0f, A, lda, B, ldb, beta, C, ldc);
  }
};
struct Fp16Format {  // fp16-rounded fp32 values into gemm_f32
  using Elem = float;
  using Weight = const float*;
  static constexpr const char* name = "fp16";
  static constexpr Rounding rounding = Rounding::fp16;
  static void convert(float* o, const float* i, int64_t n) { round_to_fp16(o, i, n); }
  static void gemm(Trans ta, Trans tb, int64_t M, int64_t N, int64_t K, const float* A, int64_t lda,
                   const float* B, int64_t ldb, float beta, float* C, int64_t ldc) {
    gemm_f32(ta, tb, M, N, K, 1.0f, A, lda, B, ldb, beta, C, ldc);
  }
};

// bf16 / fp16: weights (cached per update) and operands in the format, fp32 sums.
template <class Format>
class HalfPolicy final : public MixedPrecisionPolicy {
  using Elem = typename Format::Elem;

 public:
  const char* name() const override { return Format::name; }
  void refresh_weights() override {
    weights_.invalidate();
    wide_weights_.invalidate();
  }

  void forward(int param, float* y, LinearInput x, const float* W, int64_t N, int64_t in, int64_t out) override {
    Format::gemm(Trans::N, Trans::T, N, out, in, input(a_, x, N * in), in, weight(param, W, out * in), in, 0.0f, y,
                 out);
  }
  Rounding result_rounding() const override { return Format::rounding; }

  static constexpr bool kBf16 = std::is_same_v<Format, Bf16Format>;
  bool bf16_results() const override { return kBf16; }
  const uint16_t* forward_bf16(int param, float* y_buffer, LinearInput x, const float* W, int64_t N, int64_t in,
                               int64_t out) override {
    if constexpr (kBf16)
      return gemm_bf16_packed_out(Trans::N, Trans::T, N, out, in, 1.0f, input(a_, x, N * in), in,
                                  weight(param, W, out * in), in, y_buffer);
    else
      return GemmPolicy::forward_bf16(param, y_buffer, x, W, N, in, out);
  }
  void weight_grad_bf16(int param, float* dW, const uint16_t* dy, LinearInput x, int64_t N, int64_t in,
                        int64_t out) override {
    if constexpr (kBf16)
      weight_grad_from(dW, dy, x, N, in, out);
    else
      GemmPolicy::weight_grad_bf16(param, dW, dy, x, N, in, out);
  }
  void input_grad_bf16(int param, float* dx, const uint16_t* dy, const float* W, int64_t N, int64_t in, int64_t out,
                       bool accumulate) override {
    if constexpr (kBf16)
      input_grad_from(param, dx, dy, W, N, in, out, accumulate);
    else
      GemmPolicy::input_grad_bf16(param, dx, dy, W, N, in, out, accumulate);
  }
  const uint16_t* input_grad_packed(int param, float* dx_buffer, const float* dy, const uint16_t* dy_bf16,
                                    const float* W, int64_t N, int64_t in, int64_t out) override {
    if constexpr (kBf16) {
      const uint16_t* g = dy_bf16 ? dy_bf16 : output_grad(param, dy, N * out);
      return gemm_bf16_packed_out(Trans::N, Trans::N, N, in, out, 1.0f, g, out, weight(param, W, out * in), in,
                                  dx_buffer);
    } else {
      return GemmPolicy::input_grad_packed(param, dx_buffer, dy, dy_bf16, W, N, in, out);
    }
  }
  void weight_grad(int param, float* dW, const float* dy, LinearInput x, int64_t N, int64_t in,
                   int64_t out) override {
    weight_grad_from(dW, operand(g_, dy, N * out), x, N, in, out);
    g_last_.remember(param, dy, N * out);
  }
  void input_grad(int param, float* dx, const float* dy, const float* W, int64_t N, int64_t in, int64_t out,
                  bool accumulate) override {
    input_grad_from(param, dx, output_grad(param, dy, N * out), W, N, in, out, accumulate);
  }

 private:
  // The weight as the GEMMs read it, made once per update: in the format, or for bf16 where
  // gemm_bf16 multiplies in fp32 (bf16_weights_widened) its bf16 numbers in fp32, so that no
  // GEMM widens it again.
  typename Format::Weight weight(int param, const float* W, int64_t n) {
    if constexpr (kBf16) {
      if (bf16_weights_widened()) return Bf16Operand::widened(wide_weights_.get(param, W, n, round_to_bf16));
    }
    return weights_.get(param, W, n, Format::convert);
  }
  // The output gradient dy in the format for an input gradient: as weight_grad converted it
  // (linear_backward calls it first, on the same dy): the same values, not converted twice.
  const Elem* output_grad(int param, const float* dy, int64_t n) {
    return g_last_.take(param, dy, n) ? g_.data() : operand(g_, dy, n);
  }
  // dW += g^T x and dx = g W (accumulated when accumulate), g the output gradient in the format.
  void weight_grad_from(float* dW, const Elem* g, LinearInput x, int64_t N, int64_t in, int64_t out) {
    Format::gemm(Trans::T, Trans::N, out, in, N, g, out, input(b_, x, N * in), in, 1.0f, dW, in);
  }
  void input_grad_from(int param, float* dx, const Elem* g, const float* W, int64_t N, int64_t in, int64_t out,
                       bool accumulate) {
    Format::gemm(Trans::N, Trans::N, N, in, out, g, out, weight(param, W, out * in), in, accumulate ? 1.0f : 0.0f,
                 dx, in);
  }
  // A layer input in the format: bf16 inputs as they are (bf16 only), fp32 ones converted.
  static const Elem* input(DeviceArray<Elem>& buf, LinearInput x, int64_t n) {
    if constexpr (kBf16) {
      if (x.bf16) return x.bf16;
    }
    return operand(buf, x.fp32(Format::name), n);
  }
  static const Elem* operand(DeviceArray<Elem>& buf, const float* v, int64_t n) {
    buf.resize(size_t(n));
    Format::convert(buf.data(), v, n);
    return buf.data();
  }
  WeightCache<Elem> weights_;
  WeightCache<float> wide_weights_;  // bf16 numbers in fp32 (bf16 with bf16_weights_widened only)
  DeviceArray<Elem> a_, b_;  // operand scratch (forward's x, weight_grad's x)
  DeviceArray<Elem> g_;      // the output gradient dy of the last weight_grad
  LastOutputGrad g_last_;    // whether g_ still holds it
};

// fp8 with delayed scaling; operands as bf16 patterns of the fp8 values (exact).
// Every use in a step quantizes with the scales the earlier steps' amaxes gave; the
// step's amaxes are collected locally and enter the histories once, in finish_step.
class Fp8Policy final : public MixedPrecisionPolicy {
 public:
  Fp8Policy(const Fp8Recipe& r, Comm* tp, Comm* dp, const Fp8Params& p)
      : recipe_(r),
        tp_(tp && tp->size() > 1 ? tp : nullptr),
        dp_(dp && dp->size() > 1 ? dp : nullptr),
        expert_dp_(p.expert_dp && p.expert_dp->size() > 1 ? p.expert_dp : nullptr),
        expert_(p.expert),
        experts_whole_(p.experts_whole) {
    for (int64_t i = 0; i < p.count; ++i) grow(int(i));
  }
  const char* name() const override { return recipe_.backward == Fp8Format::e5m2 ? "fp8 hybrid" : "fp8 e4m3"; }
  bool fp8() const override { return true; }
  void refresh_weights() override { weights_.invalidate(); }
  void set_training(bool training) override { training_ = training; }

  void forward(int param, float* y, LinearInput x, const float* W, int64_t N, int64_t in, int64_t out) override {
    State& s = state(param);
    const uint16_t* Wq = weight(s, param, W, out * in);
    const float sx = s.x.scale();
    const float* xf = x.fp32("fp8");
    const uint16_t* xq = quantize(a_, xf, N * in, sx, recipe_.forward);
    note_amax(s.x_amax, xf, N * in);
    gemm_bf16(Trans::N, Trans::T, N, out, in, 1.0f / (sx * s.w_used), xq, in, Wq, in, 0.0f, y, out);
  }
  void weight_grad(int param, float* dW, const float* dy, LinearInput x, int64_t N, int64_t in,
                   int64_t out) override {
    State& s = state(param);
    if (!recipe_.fp8_wgrad) {  // in higher precision; input_grad quantizes dy (and notes its amax) itself
      gemm_f32(Trans::T, Trans::N, out, in, N, 1.0f, dy, out, x.fp32("fp8"), in, 1.0f, dW, in);
      return;
    }
    const float sg = s.g.scale();
    const uint16_t* gq = quantize(g_, dy, N * out, sg, recipe_.backward);
    note_amax(s.g_amax, dy, N * out);
    const float sx = s.x.scale();
    const uint16_t* xq = quantize(a_, x.fp32("fp8"), N * in, sx, recipe_.forward);
    gemm_bf16(Trans::T, Trans::N, out, in, N, 1.0f / (sg * sx), gq, out, xq, in, 1.0f, dW, in);
    g_last_.remember(param, dy, N * out);
  }
  void input_grad(int param, float* dx, const float* dy, const float* W, int64_t N, int64_t in, int64_t out,
                  bool accumulate) override {
    State& s = state(param);
    const uint16_t* Wq = weight(s, param, W, out * in);
    const float sg = s.g.scale();
    // The output gradient as weight_grad quantized it (linear_backward calls it first).
    const uint16_t* gq = g_.data();
    if (!g_last_.take(param, dy, N * out)) {
      gq = quantize(g_, dy, N * out, sg, recipe_.backward);
      note_amax(s.g_amax, dy, N * out);
    }
    gemm_bf16(Trans::N, Trans::N, N, in, out, 1.0f / (sg * s.w_used), gq, out, Wq, in, accumulate ? 1.0f : 0.0f,
              dx, in);
  }

  std::map<int, Fp8ScalingState> scaling_state() const override {
    std::map<int, Fp8ScalingState> m;
    for (size_t i = 0; i < states_.size(); ++i) {
      const State& s = states_[i];
      if (!s.used) continue;
      Fp8ScalingState& o = m[int(i)];
      const DelayedScale* d[3] = {&s.x, &s.w, &s.g};
      for (int k = 0; k < 3; ++k) {
        o.amax_history[size_t(k)] = d[k]->history();
        o.scale[size_t(k)] = d[k]->scale();
      }
    }
    return m;
  }
  void load_scaling_state(int param, const Fp8ScalingState& st) override {
    State& s = state(param);
    DelayedScale* d[3] = {&s.x, &s.w, &s.g};
    for (int k = 0; k < 3; ++k) d[k]->restore(st.amax_history[size_t(k)], st.scale[size_t(k)]);
    weights_.invalidate();  // re-quantized with the restored weight scale
  }

  // The step's amax of every tensor, MAX-reduced over the ranks that share the tensor
  // (tensor- and data-parallel groups: the same weights, the same global batch; an expert's over
  // the expert data-parallel group), enters its history; the next step's scales follow. A
  // weight no rank has used yet (-1 in the reduction) records nothing; one some rank has used
  // records on all. One all-reduce per group per step.
  void finish_step() override {
    std::vector<float> amax[2];  // [0] the other weights', [1] the experts' (expert parallelism)
    std::vector<size_t> index[2];
    for (size_t i = 0; i < states_.size(); ++i) {
      const State& s = states_[i];
      const int k = i < expert_.size() && expert_[i] ? 1 : 0;
      if (s.used) amax[k].insert(amax[k].end(), {s.x_amax, s.w_amax, s.g_amax});
      else amax[k].insert(amax[k].end(), {-1.0f, -1.0f, -1.0f});
      index[k].push_back(i);
    }
    for (int k : {0, 1})
      for (Comm* c : {k && experts_whole_ ? nullptr : tp_, k ? expert_dp_ : dp_})
        if (c && !amax[k].empty()) c->all_reduce(amax[k].data(), int64_t(amax[k].size()), ReduceOp::max);
    for (int k : {0, 1})
      for (size_t j = 0; j < index[k].size(); ++j) {
        State& s = states_[index[k][j]];
        const float* a = amax[k].data() + 3 * j;
        if (a[0] >= 0.0f) {  // used on some rank (a NaN was made inf: >= 0 too)
          s.used = true;
          s.x.record(a[0]);
          s.w.record(a[1]);
          s.g.record(a[2]);
        }
        s.x_amax = s.w_amax = s.g_amax = 0.0f;
      }
  }

 private:
  struct State {
    DelayedScale x, w, g;
    float w_used = 1.0f;                          // the scale of the cached weight
    float x_amax = 0, w_amax = 0, g_amax = 0;     // this step's, so far (inf: a NaN or inf was seen)
    bool used = false;
  };
  State& state(int param) {
    if (param < 0) LATTICE_FAIL() << "fp8: a linear layer without a parameter index";
    grow(param);
    states_[size_t(param)].used = true;
    return states_[size_t(param)];
  }
  void grow(int param) {
    while (states_.size() <= size_t(param))
      states_.push_back(State{DelayedScale(recipe_, recipe_.forward), DelayedScale(recipe_, recipe_.forward),
                              DelayedScale(recipe_, recipe_.backward)});
  }
  // NaN becomes inf, so that the MAX reduction keeps it (either keeps the scale). Not
  // while evaluating.
  void note_amax(float& acc, const float* v, int64_t n) const {
    if (!training_) return;
    float a = abs_max(v, n);
    if (std::isnan(a)) a = INFINITY;
    acc = std::max(acc, a);
  }
  // The weight on the fp8 grid with its current (delayed) scale, made once per update.
  const uint16_t* weight(State& s, int param, const float* W, int64_t n) {
    return weights_.get(param, W, n, [&](uint16_t* o, const float* i, int64_t k) {
      s.w_used = s.w.scale();
      quantize_fp8_to_bf16(o, i, k, s.w_used, recipe_.forward);
      note_amax(s.w_amax, i, k);
    });
  }
  const uint16_t* quantize(DeviceArray<uint16_t>& buf, const float* v, int64_t n, float scale, Fp8Format f) {
    buf.resize(size_t(n));
    quantize_fp8_to_bf16(buf.data(), v, n, scale, f);
    return buf.data();
  }

  Fp8Recipe recipe_;
  Comm* tp_;
  Comm* dp_;
  Comm* expert_dp_;           // expert parallelism: the experts' amaxes over this group (null: none)
  std::vector<bool> expert_;  // by parameter index (empty: no expert parallelism, every amax over dp_)
  bool experts_whole_;        // the experts' amaxes not over tp_ (Fp8Params::experts_whole)
  std::vector<State> states_;
  WeightCache<uint16_t> weights_;
  DeviceArray<uint16_t> a_, g_;  // quantized operands (bf16 patterns of fp8 values)
  LastOutputGrad g_last_;        // whether g_ holds the last weight_grad's dy
  bool training_ = true;         // false while evaluating: no amax is noted
};

// fp8 for every weight but the unquantized ones (Fp8Params::unquantized: the output layer, as
// Megatron's is no fp8 layer; --first-last-layers-bf16's layers), whose GEMMs go to `outside`
// (the bf16 or fp16 policy), or run in fp32 when it is null.
class Fp8WithUnquantizedWeights final : public MixedPrecisionPolicy {
 public:
  Fp8WithUnquantizedWeights(std::unique_ptr<MixedPrecisionPolicy> fp8, std::unique_ptr<MixedPrecisionPolicy> outside,
                            std::vector<bool> unquantized)
      : fp8_(std::move(fp8)), outside_(std::move(outside)), unquantized_(std::move(unquantized)) {}
  const char* name() const override { return fp8_->name(); }
  bool fp8() const override { return true; }
  void refresh_weights() override {
    fp8_->refresh_weights();
    if (outside_) outside_->refresh_weights();
  }
  void finish_step() override { fp8_->finish_step(); }
  void set_training(bool training) override { fp8_->set_training(training); }
  std::map<int, Fp8ScalingState> scaling_state() const override { return fp8_->scaling_state(); }
  void load_scaling_state(int param, const Fp8ScalingState& state) override {
    fp8_->load_scaling_state(param, state);
  }

  void forward(int param, float* y, LinearInput x, const float* W, int64_t N, int64_t in, int64_t out) override {
    if (!unquantized(param)) fp8_->forward(param, y, x, W, N, in, out);
    else if (outside_) outside_->forward(param, y, x, W, N, in, out);
    else gemm_f32(Trans::N, Trans::T, N, out, in, 1.0f, x.fp32("fp32"), in, W, in, 0.0f, y, out);
  }
  void weight_grad(int param, float* dW, const float* dy, LinearInput x, int64_t N, int64_t in,
                   int64_t out) override {
    if (!unquantized(param)) fp8_->weight_grad(param, dW, dy, x, N, in, out);
    else if (outside_) outside_->weight_grad(param, dW, dy, x, N, in, out);
    else gemm_f32(Trans::T, Trans::N, out, in, N, 1.0f, dy, out, x.fp32("fp32"), in, 1.0f, dW, in);
  }
  void input_grad(int param, float* dx, const float* dy, const float* W, int64_t N, int64_t in, int64_t out,
                  bool accumulate) override {
    if (!unquantized(param)) fp8_->input_grad(param, dx, dy, W, N, in, out, accumulate);
    else if (outside_) outside_->input_grad(param, dx, dy, W, N, in, out, accumulate);
    else gemm_f32(Trans::N, Trans::N, N, in, out, 1.0f, dy, out, W, in, accumulate ? 1.0f : 0.0f, dx, in);
  }

 private:
  bool unquantized(int param) const { return param >= 0 && size_t(param) < unquantized_.size() && unquantized_[size_t(param)]; }
  std::unique_ptr<MixedPrecisionPolicy> fp8_, outside_;
  std::vector<bool> unquantized_;
};

}  // namespace

void DelayedScale::record(float amax) {
  history_.push_front(amax);
  while (int64_t(history_.size()) > recipe_.amax_history_len) history_.pop_back();
  float a = history_.front();
  if (recipe_.amax_max)
    for (float h : history_) a = std::isnan(h) || std::isnan(a) ? NAN : std::max(a, h);
  if (!(a > 0) || !std::isfinite(a)) return;  // keep the scale
  scale_ = float(double(fp8_max(format_)) / double(a) / std::ldexp(1.0, int(recipe_.margin)));
}

void DelayedScale::restore(const std::vector<float>& history, float scale) {
  history_.assign(history.begin(), history.end());
  while (int64_t(history_.size()) > recipe_.amax_history_len) history_.pop_back();
  scale_ = scale;
}

std::unique_ptr<MixedPrecisionPolicy> make_half_precision_policy(HalfFormat format) {
  if (format == HalfFormat::bf16) return std::make_unique<HalfPolicy<Bf16Format>>();
  return std::make_unique<HalfPolicy<Fp16Format>>();
}

Fp8Recipe make_fp8_recipe(const std::string& format, int64_t margin, int64_t amax_history_len,
                          const std::string& amax_compute_algo) {
  Fp8Recipe r;
  if (format == "hybrid") r.backward = Fp8Format::e5m2;
  else if (format != "e4m3") LATTICE_FAIL() << "--fp8-format must be e4m3 or hybrid, got '" << format << "'";
  if (margin < 0) LATTICE_FAIL() << "--fp8-margin must be >= 0, got " << margin;
  if (amax_history_len < 1) LATTICE_FAIL() << "--fp8-amax-history-len must be >= 1, got " << amax_history_len;
  if (amax_compute_algo == "max") r.amax_max = true;
  else if (amax_compute_algo != "most_recent")
    LATTICE_FAIL() << "--fp8-amax-compute-algo must be most_recent or max, got '" << amax_compute_algo << "'";
  r.margin = margin;
  r.amax_history_len = amax_history_len;
  return r;
}

Fp8Scaling parse_fp8_scaling(const std::string& recipe) {
  for (Fp8Scaling s : {Fp8Scaling::delayed, Fp8Scaling::tensorwise, Fp8Scaling::blockwise, Fp8Scaling::mxfp8})
    if (recipe == fp8_scaling_name(s)) return s;
  if (recipe == "custom")
    LATTICE_FAIL() << "--fp8-recipe custom builds its quantizers with --fp8-quantizer-factory (a Python module), "
                      "which lattice does not take: use delayed, tensorwise, blockwise or mxfp8";
  LATTICE_FAIL() << "--fp8-recipe must be delayed, tensorwise, blockwise or mxfp8, got '" << recipe << "'";
}

const char* fp8_scaling_name(Fp8Scaling s) {
  switch (s) {
    case Fp8Scaling::delayed: return "delayed";
    case Fp8Scaling::tensorwise: return "tensorwise";
    case Fp8Scaling::blockwise: return "blockwise";
    case Fp8Scaling::mxfp8: return "mxfp8";
  }
  return "?";
}

std::unique_ptr<MixedPrecisionPolicy> make_fp8_policy(const Fp8Recipe& recipe, Comm* tp, Comm* dp,
                                                      const Fp8Params& params) {
  std::unique_ptr<MixedPrecisionPolicy> fp8 = recipe.scaling != Fp8Scaling::delayed
                                                  ? make_fp8_current_scaling_policy(recipe, tp, params)
                                                  : std::make_unique<Fp8Policy>(recipe, tp, dp, params);
  if (std::find(params.unquantized.begin(), params.unquantized.end(), true) == params.unquantized.end()) return fp8;
  return std::make_unique<Fp8WithUnquantizedWeights>(
      std::move(fp8), params.unquantized_format ? make_half_precision_policy(*params.unquantized_format) : nullptr,
      params.unquantized);
}

}  // namespace lattice
