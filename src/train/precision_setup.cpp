#include "train/precision_setup.h"

#include <cstdlib>
#include <sstream>

#include "blas/gemm.h"
#include "core/error.h"

namespace lattice {

std::unique_ptr<MixedPrecisionPolicy> make_precision_policy(const TrainArgs& args, Comm* tp, Comm* dp,
                                                            const Fp8Params& fp8_params) {
  if (!args.fp8_format.empty()) {
    Fp8Recipe recipe =
        make_fp8_recipe(args.fp8_format, args.fp8_margin, args.fp8_amax_history_len, args.fp8_amax_compute_algo);
    recipe.scaling = parse_fp8_scaling(args.fp8_recipe);
    recipe.fp8_wgrad = !args.no_fp8_wgrad;
    Fp8Params params = fp8_params;
    if (args.bf16) params.unquantized_format = HalfFormat::bf16;
    if (args.fp16) params.unquantized_format = HalfFormat::fp16;
    return make_fp8_policy(recipe, tp, dp, params);
  }
  if (args.bf16) return make_half_precision_policy(HalfFormat::bf16);
  if (args.fp16) return make_half_precision_policy(HalfFormat::fp16);
  return nullptr;
}

std::vector<bool> fp8_unquantized_weights(const std::vector<ParamInfo>& params, const TrainArgs& args) {
  std::vector<bool> out(params.size(), false);
  const std::string layers = "decoder.layers.";
  for (size_t i = 0; i < params.size(); ++i) {
    const std::string& name = params[i].name;
    if (name == "output_layer.weight" || name == "embedding.word_embeddings.weight") out[i] = true;
    if (args.first_last_layers_bf16 && name.starts_with(layers)) {
      const int64_t layer = std::stoll(name.substr(layers.size()));  // the global layer number, from 0
      out[i] = layer < args.num_layers_at_start_in_bf16 || layer >= args.num_layers - args.num_layers_at_end_in_bf16;
    }
  }
  return out;
}

AttentionMath attention_math(const TrainArgs& args) {
  if (args.bf16 || !args.fp8_format.empty()) return AttentionMath::bf16;
  if (args.fp16) return AttentionMath::fp16;
  return AttentionMath::fp32;
}

std::unique_ptr<LossScaler> make_loss_scaler(const TrainArgs& args) {
  if (!args.fp16) return nullptr;
  LossScalerConfig c;
  c.dynamic = args.loss_scale == 0;
  c.initial_scale = c.dynamic ? args.initial_loss_scale : args.loss_scale;
  c.min_scale = args.min_loss_scale;
  c.window = args.loss_scale_window;
  c.hysteresis = args.hysteresis;
  return std::make_unique<LossScaler>(c);
}

std::string describe_precision(const TrainArgs& args, const LossScaler* scaler) {
  std::ostringstream os;
  os << "> precision: ";
  const bool half_gemm = args.bf16 || !args.fp8_format.empty();
  if (!args.fp8_format.empty()) {
    const char* other = args.bf16 ? "bf16" : args.fp16 ? "fp16" : "fp32";
    os << "fp8 " << args.fp8_format << " linear layers (" << args.fp8_recipe << " scaling"
       << (args.no_fp8_wgrad ? "; weight gradients unquantized" : "") << "; the output layer";
    if (args.first_last_layers_bf16)
      os << " and the first " << args.num_layers_at_start_in_bf16 << " and last " << args.num_layers_at_end_in_bf16
         << " decoder layers";
    os << " in " << other << "), ";
  }
  if (args.bf16) os << "bf16";
  else if (args.fp16) os << "fp16";
  else if (args.fp8_format.empty()) os << "fp32";
  else os << "fp32 elsewhere";
  if (half_gemm) os << "; GEMMs: " << (args.device == "cuda" ? "cuBLASLt bf16" : gemm_bf16_path_name());
  if (args.bf16 || args.fp16) os << "; fp32 main parameters, gradients and optimizer";
  if (scaler)
    os << "; loss scale " << (args.loss_scale > 0 ? "constant " : "dynamic, initial ") << scaler->scale();
  return os.str();
}

std::vector<int64_t> test_inject_inf_iterations() {
  std::vector<int64_t> out;
  const char* env = std::getenv("LATTICE_TEST_INJECT_INF_ITERS");
  if (!env) return out;
  std::stringstream ss(env);
  std::string item;
  while (std::getline(ss, item, ',')) {
    char* end = nullptr;
    const long long v = std::strtoll(item.c_str(), &end, 10);
    if (item.empty() || *end != '\0' || v < 0)
      LATTICE_FAIL() << "LATTICE_TEST_INJECT_INF_ITERS: invalid iteration '" << item << "'";
    out.push_back(v);
  }
  return out;
}

}  // namespace lattice
