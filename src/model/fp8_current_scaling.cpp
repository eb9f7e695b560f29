#include "model/fp8_current_scaling.h"

#include <cmath>
#include <string>
#include <vector>

#include "blas/gemm.h"
#include "core/error.h"
#include "core/storage.h"
#include "dist/comm.h"
#include "kernels/cast.h"
#include "kernels/cast_math.h"
#include "model/gemm_operand_cache.h"

namespace lattice {
namespace {

// A GEMM operand as gemm_bf16 reads it: bf16 patterns, and the factor that undoes its
// scale (tensorwise; 1 for block-scaled operands, whose patterns are the values themselves).
struct Operand {
  const uint16_t* q;
  float unscale;
};

// Which way an [rows, cols] operand's blocks run: along its rows (the GEMM sums over its
// columns: a forward input, an input gradient's output gradient) or down its columns (the
// weight gradient's GEMM sums over the tokens, its rows).
enum class Inner { cols, rows };

class Fp8CurrentScalingPolicy final : public MixedPrecisionPolicy {
 public:
  Fp8CurrentScalingPolicy(const Fp8Recipe& r, Comm* tp, const Fp8Params& p)
      : recipe_(r),
        tp_(tp && tp->size() > 1 ? tp : nullptr),
        cp_(p.cp && p.cp->size() > 1 ? p.cp : nullptr),
        expert_(p.expert),
        experts_whole_(p.experts_whole) {
    if (r.scaling == Fp8Scaling::delayed) LATTICE_FAIL() << "fp8 current scaling: the delayed recipe is Fp8Policy's";
  }
  const char* name() const override {
    static const std::string names[2][3] = {{"fp8 e4m3 tensorwise", "fp8 e4m3 blockwise", "fp8 e4m3 mxfp8"},
                                            {"fp8 hybrid tensorwise", "fp8 hybrid blockwise", "fp8 hybrid mxfp8"}};
    return names[recipe_.backward == Fp8Format::e5m2][int(recipe_.scaling) - 1].c_str();
  }
  bool fp8() const override { return true; }
  void refresh_weights() override {
    fprop_weights_.invalidate();
    dgrad_weights_.invalidate();
  }

  // y = x W^T: x's blocks and W's along `in`.
  void forward(int param, float* y, LinearInput x, const float* W, int64_t N, int64_t in, int64_t out) override {
    const Operand w = weight(fprop_weights_, param, W, out, in, Inner::cols);
    const Operand a = activation(a_, param, x.fp32("fp8"), N, in, Inner::cols, recipe_.forward);
    gemm_bf16(Trans::N, Trans::T, N, out, in, a.unscale * w.unscale, a.q, in, w.q, in, 0.0f, y, out);
  }
  // dW += dy^T x: dy's blocks and x's down the tokens.
  void weight_grad(int param, float* dW, const float* dy, LinearInput x, int64_t N, int64_t in,
                   int64_t out) override {
    if (!recipe_.fp8_wgrad) {  // in higher precision (--no-fp8-wgrad)
      gemm_f32(Trans::T, Trans::N, out, in, N, 1.0f, dy, out, x.fp32("fp8"), in, 1.0f, dW, in);
      return;
    }
    const Operand g = activation(g_, param, dy, N, out, Inner::rows, recipe_.backward);
    const Operand a = activation(a_, param, x.fp32("fp8"), N, in, Inner::rows, recipe_.forward);
    gemm_bf16(Trans::T, Trans::N, out, in, N, g.unscale * a.unscale, g.q, out, a.q, in, 1.0f, dW, in);
    if (tensorwise()) {  // one quantization serves both GEMMs: input_grad takes it
      g_last_.remember(param, dy, N * out);
      g_unscale_ = g.unscale;
    }
  }
  // dx = dy W: dy's blocks and W's along `out`.
  void input_grad(int param, float* dx, const float* dy, const float* W, int64_t N, int64_t in, int64_t out,
                  bool accumulate) override {
    const Operand g = g_last_.take(param, dy, N * out) ? Operand{g_.data(), g_unscale_}
                                                        : activation(g_, param, dy, N, out, Inner::cols, recipe_.backward);
    const Operand w = weight(mxfp8() ? dgrad_weights_ : fprop_weights_, param, W, out, in, Inner::rows);
    gemm_bf16(Trans::N, Trans::N, N, in, out, g.unscale * w.unscale, g.q, out, w.q, in, accumulate ? 1.0f : 0.0f, dx,
              in);
  }

 private:
  bool tensorwise() const { return recipe_.scaling == Fp8Scaling::tensorwise; }
  bool mxfp8() const { return recipe_.scaling == Fp8Scaling::mxfp8; }
  bool expert(int param) const { return size_t(param) < expert_.size() && expert_[size_t(param)]; }

  // The blocks of an operand whose GEMM sums along `inner`.
  Fp8Blocks blocks(Inner inner, bool weight) const {
    if (mxfp8()) return inner == Inner::cols ? Fp8Blocks{1, 32, Fp8BlockScale::e8m0} : Fp8Blocks{32, 1, Fp8BlockScale::e8m0};
    if (weight) return Fp8Blocks{128, 128, Fp8BlockScale::pow2};
    return inner == Inner::cols ? Fp8Blocks{1, 128, Fp8BlockScale::pow2} : Fp8Blocks{128, 1, Fp8BlockScale::pow2};
  }

  // The amax of a whole tensor of which this rank holds v: MAX-reduced over the tensor-parallel
  // group (but for whole experts, which the tensor-parallel ranks do not share) and, for an
  // activation or gradient of a layer every rank runs, the context-parallel group. NaN counts
  // as inf (either way the scale is 1), so that the reduction keeps it.
  float whole_amax(int param, const float* v, int64_t n, bool weight) const {
    float a = abs_max(v, n);
    if (std::isnan(a)) a = INFINITY;
    if (tp_ && !(experts_whole_ && expert(param))) tp_->all_reduce(&a, 1, ReduceOp::max);
    if (cp_ && !weight && !expert(param)) cp_->all_reduce(&a, 1, ReduceOp::max);
    return a;
  }
  // v [rows, cols] in fp8 with the recipe's scales, written to q [rows, cols]; returns the
  // factor that undoes the scale.
  float quantize(uint16_t* q, int param, const float* v, int64_t rows, int64_t cols, Inner inner, Fp8Format f,
                 bool weight) {
    const int64_t n = rows * cols;
    if (!tensorwise()) {
      quantize_fp8_blocks(q, v, rows, cols, blocks(inner, weight), f);
      return 1.0f;
    }
    const float scale = math::fp8_tensor_scale(whole_amax(param, v, n, weight), fp8_max(f));
    quantize_fp8_to_bf16(q, v, n, scale, f);
    return 1.0f / scale;
  }
  Operand activation(DeviceArray<uint16_t>& buf, int param, const float* v, int64_t rows, int64_t cols, Inner inner,
                     Fp8Format f) {
    buf.resize(size_t(rows * cols));
    return {buf.data(), quantize(buf.data(), param, v, rows, cols, inner, f, false)};
  }
  // The weight W [out, in] quantized once per update (per use direction for mxfp8).
  Operand weight(WeightCache<uint16_t>& cache, int param, const float* W, int64_t out, int64_t in, Inner inner) {
    if (size_t(param) >= w_unscale_.size()) w_unscale_.resize(size_t(param) + 1, 1.0f);
    const uint16_t* q = cache.get(param, W, out * in, [&](uint16_t* o, const float* w, int64_t) {
      w_unscale_[size_t(param)] = quantize(o, param, w, out, in, inner, recipe_.forward, true);
    });
    return {q, w_unscale_[size_t(param)]};
  }

  Fp8Recipe recipe_;
  Comm* tp_;
  Comm* cp_;
  std::vector<bool> expert_;  // by parameter index (empty: none)
  bool experts_whole_;
  WeightCache<uint16_t> fprop_weights_, dgrad_weights_;  // dgrad: mxfp8's column-wise copies
  std::vector<float> w_unscale_;                         // tensorwise: each weight copy's 1 / scale
  DeviceArray<uint16_t> a_, g_;                          // quantized operands
  LastOutputGrad g_last_;                                // tensorwise: whether g_ holds weight_grad's dy
  float g_unscale_ = 1.0f;
};

}  // namespace

std::unique_ptr<MixedPrecisionPolicy> make_fp8_current_scaling_policy(const Fp8Recipe& recipe, Comm* tp,
                                                                      const Fp8Params& params) {
  return std::make_unique<Fp8CurrentScalingPolicy>(recipe, tp, params);
}

}  // namespace lattice
