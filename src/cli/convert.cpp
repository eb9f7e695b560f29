// `lattice convert`: HuggingFace GPT-2, Llama, Qwen2, Qwen3, Mistral, SmolLM3 and the MoE families (Mixtral,
// Qwen-MoE, DeepSeek, GLM-4.5, GPT-OSS) and the Gated DeltaNet hybrids <->
// lattice checkpoint.
//   lattice convert --from-hf DIR --save CKPT [--tokenizer-type NAME] [--tokenizer-model PATH]
//                   [--make-vocab-size-divisible-by N]
//   lattice convert --load CKPT --to-hf DIR
//   lattice convert --from-megatron DIR --save CKPT [--tokenizer-type NAME] [--tokenizer-model PATH]
//                   [--vocab-file PATH] [--merge-file PATH] [--no-load-optim]
//   lattice convert --load CKPT --to-megatron DIR [--target-tensor-parallel-size T]
//                   [--target-pipeline-parallel-size P] [--target-expert-parallel-size E]
//                   [--transformer-impl transformer_engine|local]
// The input is read and checked completely before anything is written, and an existing
// checkpoint or HF model is never overwritten.
#include <cstdio>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <string>

#include "checkpoint/hf_deepseek_mla.h"
#include "checkpoint/hf_glm4_moe.h"
#include "checkpoint/hf_nemotron_h.h"
#include "checkpoint/hf_gpt2.h"
#include "checkpoint/hf_gpt_oss.h"
#include "checkpoint/hf_llama.h"
#include "checkpoint/hf_starcoder2.h"
#include "checkpoint/megatron_checkpoint.h"
#include "checkpoint/megatron_export.h"
#include "checkpoint/hf_qwen3_next.h"
#include "checkpoint/model_checkpoint.h"
#include "checkpoint/training_checkpoint.h"
#include "cli/simple_flags.h"
#include "cli/subcommands.h"
#include "core/error.h"
#include "data/sentencepiece_tokenizer.h"
#include "data/tokenizer.h"

namespace fs = std::filesystem;

namespace lattice {

namespace {

// GPT-2's BPE vocabulary has exactly this many tokens; a HF model of that size uses it.
constexpr int64_t kGpt2BpeVocabSize = 50257;

void from_hf(const SimpleFlags& f) {
  const std::string dir = f.required("from-hf"), save = f.required("save");
  if (f.has("hf-dtype") || f.has("max-shard-size") || f.has("hf-model-type"))
    LATTICE_FAIL() << "--hf-dtype, --max-shard-size and --hf-model-type apply to --to-hf only (--from-hf reads any "
                      "dtype and shards, and config.json's model_type)";
  const double divisible = f.number("make-vocab-size-divisible-by", 128);
  if (divisible < 1 || divisible != int64_t(divisible))
    LATTICE_FAIL() << "--make-vocab-size-divisible-by must be a positive integer";
  if (fs::exists(fs::path(save) / "latest_checkpointed_iteration.txt"))
    LATTICE_FAIL() << "--save " << save << " already holds a checkpoint; choose a new directory";
  // config.json's model_type says which: GPT-OSS, DeepSeek-V2 or V3, GLM-4.5, the Gated DeltaNet hybrids,
  // Nemotron-H, the Llama family (Llama, Qwen2, Qwen3, Mistral, Mixtral, Qwen2-MoE, Qwen3-MoE, DeepSeek-MoE,
  // SmolLM3, Phi-3), StarCoder2, else GPT-2.
  const nlohmann::json config = hf::read_config(dir);
  const bool nemotron_h = is_hf_nemotron_h_config(config);
  const bool gpt_oss = !nemotron_h && is_hf_gpt_oss_config(config);
  const bool deepseek_mla = !nemotron_h && !gpt_oss && is_hf_deepseek_mla_config(config);
  const bool glm = !gpt_oss && !deepseek_mla && is_hf_glm4_moe_config(config);
  const bool qwen3_next = !gpt_oss && !deepseek_mla && !glm && is_hf_qwen3_next_config(config);
  const bool llama = !nemotron_h && !gpt_oss && !deepseek_mla && !glm && !qwen3_next && is_hf_llama_config(config);
  const bool starcoder2 = is_hf_starcoder2_config(config);
  const std::string family = nemotron_h     ? "Nemotron-H"
                             : gpt_oss      ? "GPT-OSS"
                             : deepseek_mla ? hf_deepseek_family_name(config)
                             : glm          ? "GLM-4.5"
                             : qwen3_next   ? hf_qwen3_next_family_name(config)
                             : llama        ? hf_llama_family_name(config)
                             : starcoder2   ? "StarCoder2"
                                            : "GPT-2";
  // Streamed: each parameter is written as it is read (one in memory at a time; GPT-OSS a layer at a time, its
  // experts decoded).
  const int64_t div = int64_t(divisible);
  const HfSource src = nemotron_h     ? open_hf_nemotron_h(dir, div)
                       : gpt_oss      ? open_hf_gpt_oss(dir, div)
                       : deepseek_mla ? open_hf_deepseek_mla(dir, div)
                       : glm          ? open_hf_glm4_moe(dir, div)
                       : qwen3_next   ? open_hf_qwen3_next(dir, div)
                       : llama        ? open_hf_llama(dir, div)
                       : starcoder2   ? open_hf_starcoder2(dir, div)
                                      : open_hf_gpt2(dir, div);
  const TransformerConfig& c = src.config;
  // Tokenizer: the flags, else the one a lattice export recorded, else the folder's
  // tokenizer.json (HuggingFaceTokenizer) when lattice reads it, else its tokenizer.model
  // (Llama2Tokenizer: HuggingFace's LlamaTokenizer starts every text with <s> as it does), else
  // GPT-2's BPE when the vocabulary is GPT-2's. A type that reads --tokenizer-model takes the
  // folder's file when the flag is not given.
  TokenizerSpec tok{f.get("tokenizer-type", src.tokenizer_type), "", "", f.get("tokenizer-model", "")};
  const bool folder_json = fs::exists(fs::path(dir) / "tokenizer.json");
  const bool folder_model = fs::exists(fs::path(dir) / "tokenizer.model");
  const bool sentencepiece = SentencePieceTokenizer::is_type(tok.type);
  if ((tok.type == "HuggingFaceTokenizer" || sentencepiece) && tok.model.empty()) {
    const char* file = sentencepiece ? "tokenizer.model" : "tokenizer.json";
    if (!(sentencepiece ? folder_model : folder_json))
      LATTICE_FAIL() << "--from-hf " << dir << ": no " << file << " for " << tok.type << "; give --tokenizer-model";
    tok.model = dir;
  }
  int64_t tok_size = -1;  // the tokenizer's vocabulary, once it has been built
  if (tok.type.empty() && !f.has("tokenizer-model")) {
    // The folder's own files, tokenizer.json first; what cannot be read is said and skipped.
    for (const char* type : {"HuggingFaceTokenizer", "Llama2Tokenizer"}) {
      const bool json = std::string(type) == "HuggingFaceTokenizer";
      if (!(json ? folder_json : folder_model)) continue;
      try {
        tok_size = make_tokenizer({type, "", "", dir})->vocab_size();
        tok = {type, "", "", dir};
        break;
      } catch (const Error& e) {
        std::fprintf(stderr, "convert: %s/%s is not recorded as the tokenizer: %s\n", dir.c_str(),
                     json ? "tokenizer.json" : "tokenizer.model", e.what());
      }
    }
  }
  if (!tok.model.empty()) tok.model = fs::absolute(tok.model).lexically_normal().string();
  if (f.has("tokenizer-type") || f.has("tokenizer-model") || !tok.model.empty()) {
    // GPT2BPETokenizer needs its vocabulary files to be built; its size is known.
    if (tok_size < 0) tok_size = tok.type == "GPT2BPETokenizer" ? kGpt2BpeVocabSize : make_tokenizer(tok)->vocab_size();
    if (tok_size > c.vocab_size)
      LATTICE_FAIL() << "--tokenizer-type " << tok.type << " has " << tok_size
                     << " tokens, more than the model's vocab_size " << c.vocab_size;
  } else if (tok.type.empty() && c.vocab_size == kGpt2BpeVocabSize) {
    tok.type = "GPT2BPETokenizer";
  }
  const std::string& tokenizer = tok.type;
  nlohmann::json args = {{"tokenizer-type", tokenizer},
                         {"seq-length", c.max_position_embeddings},
                         {"max-position-embeddings", c.max_position_embeddings},
                         {"make-vocab-size-divisible-by", int64_t(divisible)},
                         {"converted-from-hf", dir}};
  if (config.contains("model_type") && config["model_type"].is_string()) args["hf-model-type"] = config["model_type"];
  if (!tok.model.empty()) args["tokenizer-model"] = tok.model;
  const std::string written = save_model_checkpoint(save, 0, c, src.fill, args.dump());
  std::fprintf(stderr, "convert: %s (%s) -> %s (%lld layers, hidden %lld, vocab %lld padded to %lld, tokenizer %s)\n",
               dir.c_str(), family.c_str(), written.c_str(), (long long)c.num_layers, (long long)c.hidden_size,
               (long long)c.vocab_size, (long long)c.padded_vocab_size,
               tokenizer.empty() ? "none" : tokenizer.c_str());
}

// A Megatron-LM checkpoint -> lattice checkpoint: the weights, under the tokenizer the saved args name (each file
// it reads must exist here; the flags override them); with the run's Adam state, a training checkpoint at the
// run's iteration (the fp32 main weights, the moments, step, scheduler, data position) that `lattice train --load`
// resumes; else the weights alone at iteration 0.
void from_megatron(const SimpleFlags& f) {
  const std::string dir = f.required("from-megatron"), save = f.required("save");
  for (const char* flag : {"hf-dtype", "max-shard-size", "hf-model-type", "make-vocab-size-divisible-by"})
    if (f.has(flag))
      LATTICE_FAIL() << "--" << flag << " does not apply to --from-megatron (the checkpoint's args say the vocabulary "
                     << "and its padding)";
  if (fs::exists(fs::path(save) / "latest_checkpointed_iteration.txt"))
    LATTICE_FAIL() << "--save " << save << " already holds a checkpoint; choose a new directory";
  MegatronSource src = open_megatron_checkpoint(dir, !f.has("no-load-optim"));
  TransformerConfig& c = src.source.config;
  TokenizerSpec tok = src.tokenizer;
  const bool given = f.has("tokenizer-type") || f.has("tokenizer-model") || f.has("vocab-file") || f.has("merge-file");
  if (given) tok = TokenizerSpec{f.get("tokenizer-type", tok.type), f.get("vocab-file", ""), f.get("merge-file", ""),
                                 f.get("tokenizer-model", ""), tok.vocab_size};
  // The saved args' files, where they are not on this machine: the model comes over without a tokenizer.
  for (std::string* file : {&tok.vocab_file, &tok.merge_file, &tok.model}) {
    if (file->empty()) continue;
    if (!fs::exists(*file)) {
      if (given) LATTICE_FAIL() << "--from-megatron: the tokenizer file " << *file << " does not exist";
      std::fprintf(stderr,
                   "convert: the checkpoint's tokenizer file %s is not on this machine: no tokenizer recorded (give "
                   "--tokenizer-type with --tokenizer-model, or --vocab-file and --merge-file)\n",
                   file->c_str());
      tok = TokenizerSpec{};
      break;
    }
    *file = fs::absolute(*file).lexically_normal().string();
  }
  // Megatron's NullTokenizer: --vocab-size ids and the end of document after them (the saved args' count);
  // without a count, none (the vocabulary is then the model's rows).
  if (tok.type == "NullTokenizer" && tok.vocab_size <= 0) tok = TokenizerSpec{};
  if (!tok.type.empty()) {
    const int64_t size = make_tokenizer(tok)->vocab_size();
    if (size > c.padded_vocab_size)
      LATTICE_FAIL() << "--from-megatron: the tokenizer " << tok.type << " has " << size
                     << " tokens, more than the checkpoint's " << c.padded_vocab_size << " vocabulary rows";
    c.vocab_size = size;  // the rows past it stay the padding they were
  }
  nlohmann::json args = {{"tokenizer-type", tok.type},
                         {"seq-length", src.seq_length},
                         {"max-position-embeddings", c.max_position_embeddings},
                         {"make-vocab-size-divisible-by", c.make_vocab_size_divisible_by},
                         {"converted-from-megatron", dir},
                         {"megatron-iteration", src.iteration}};
  if (!tok.vocab_file.empty()) args["vocab-file"] = tok.vocab_file;
  if (!tok.merge_file.empty()) args["merge-file"] = tok.merge_file;
  if (!tok.model.empty()) args["tokenizer-model"] = tok.model;
  if (tok.type == "NullTokenizer") args["vocab-size"] = tok.vocab_size;
  std::string written;
  if (src.optimizer) {  // a training checkpoint at the run's iteration: `lattice train --load` resumes it
    const MegatronOptimizerState& o = *src.optimizer;
    CheckpointState s;
    s.iteration = src.iteration;
    s.consumed_train_samples = src.consumed_train_samples;
    s.num_floating_point_operations_so_far = src.flops_so_far;
    s.args = args;
    s.optimizer = OptimizerState{"adam", o.step};
    s.opt_param_scheduler = o.opt_param_scheduler;
    s.rng = RngState{src.seed};
    s.loss_scaler = o.grad_scaler;
    const std::vector<StateSlot> slots = state_slots("adam");  // exp_avg, exp_avg_sq
    written = save_streamed_checkpoint(save, s, c, src.source.fill,
                                       {{kOptimizerFile, slots[0].prefix, o.exp_avg},
                                        {kOptimizerFile, slots[1].prefix, o.exp_avg_sq}});
  } else {
    written = save_model_checkpoint(save, 0, c, src.source.fill, args.dump());
  }
  std::fprintf(stderr,
               "convert: %s (Megatron-LM %s, iteration %lld, tensor-parallel %d, pipeline-parallel %d%s, %s layer spec) -> "
               "%s (%lld layers, hidden %lld, vocabulary %lld of %lld rows, tokenizer %s)\n",
               src.iteration_dir.c_str(), src.torch_dist ? "torch_dist" : "torch", (long long)src.iteration, src.tp, src.pp,
               src.vp > 1 ? (", " + std::to_string(src.vp) + " virtual stages").c_str() : "",
               src.legacy ? "the legacy model's" : src.transformer_engine ? "Transformer Engine" : "local", written.c_str(), (long long)c.num_layers,
               (long long)c.hidden_size, (long long)c.vocab_size, (long long)c.padded_vocab_size,
               tok.type.empty() ? "none" : tok.type.c_str());
  if (src.optimizer)
    std::fprintf(stderr,
                 "convert: with Adam's state (step %lld, %lld samples consumed): lattice train --load %s resumes at "
                 "iteration %lld\nconvert: Adam's state read from %s\n",
                 (long long)src.optimizer->step, (long long)src.consumed_train_samples, save.c_str(),
                 (long long)src.iteration, src.optimizer->form.c_str());
  else
    std::fprintf(stderr,
                 "convert: the optimizer state is not converted: %s; the weights alone, at iteration 0 (train with "
                 "--finetune)\n",
                 src.optimizer_note.c_str());
}

// A lattice checkpoint -> Megatron-LM's (--ckpt-format torch), under the layout asked for.
void to_megatron(const SimpleFlags& f) {
  const std::string load = f.required("load"), dir = f.required("to-megatron");
  MegatronExportOptions o;
  auto size = [&](const char* flag) {
    const double v = f.number(flag, 1);
    if (v < 1 || v != int64_t(v) || v > 4096) LATTICE_FAIL() << "--" << flag << " must be a positive integer";
    return int(v);
  };
  o.tp = size("target-tensor-parallel-size");
  o.pp = size("target-pipeline-parallel-size");
  o.ep = size("target-expert-parallel-size");
  const std::string impl = f.get("transformer-impl", "transformer_engine");
  if (impl != "transformer_engine" && impl != "local")
    LATTICE_FAIL() << "--transformer-impl must be transformer_engine or local, got '" << impl << "'";
  o.transformer_engine = impl == "transformer_engine";
  const LoadedModel lm = open_model_checkpoint(load);
  const std::string written = save_megatron_checkpoint(dir, lm, o);
  if (!lm.tokenizer.type.empty() && !is_megatron_tokenizer(lm.tokenizer.type))
    std::fprintf(stderr,
                 "convert: Megatron-LM has no %s: the args name its NullTokenizer of the model's %lld ids (give "
                 "Megatron --tokenizer-type and its files to use another)\n",
                 lm.tokenizer.type.c_str(), (long long)lm.config.vocab_size);
  std::fprintf(stderr,
               "convert: %s (iteration %lld) -> %s (Megatron-LM --ckpt-format torch, tensor-parallel %d, "
               "pipeline-parallel %d, expert-parallel %d, %s layer spec, fp32 weights, no optimizer state)\n",
               load.c_str(), (long long)lm.iteration, written.c_str(), o.tp, o.pp, o.ep, impl.c_str());
}

// A HuggingFace or SentencePiece tokenizer travels with the model (tokenizer.json or
// tokenizer.model, and the configuration files beside it: tokenizer_config.json, special_tokens_map.json,
// chat_template.jinja, generation_config.json), so the folder loads as HuggingFace's.
void copy_tokenizer_files(const LoadedModel& lm, const std::string& dir) {
  const std::string& type = lm.tokenizer.type;
  const bool sentencepiece = SentencePieceTokenizer::is_type(type);
  if ((type == "HuggingFaceTokenizer" || sentencepiece) && !lm.tokenizer.model.empty()) {
    const fs::path model = lm.tokenizer.model;
    const char* name = sentencepiece ? "tokenizer.model" : "tokenizer.json";
    const fs::path file = fs::is_directory(model) ? model / name : model;
    // (with the chat template and generation_config.json's stop tokens, which generate and serve read beside it)
    const fs::path dir_of = file.parent_path();
    const std::pair<fs::path, const char*> files[] = {{file, name},
                                                      {dir_of / "tokenizer_config.json", "tokenizer_config.json"},
                                                      {dir_of / "special_tokens_map.json", "special_tokens_map.json"},
                                                      {dir_of / "chat_template.jinja", "chat_template.jinja"},
                                                      {dir_of / "generation_config.json", "generation_config.json"}};
    for (const auto& [from, to] : files) {
      std::error_code ec;
      if (!fs::exists(from)) continue;
      fs::copy_file(from, fs::path(dir) / to, ec);
      if (ec) LATTICE_FAIL() << "--to-hf " << dir << ": cannot copy " << from.string() << ": " << ec.message();
    }
  }
}

void to_hf(const SimpleFlags& f) {
  const std::string load = f.required("load"), dir = f.required("to-hf");
  if (f.has("tokenizer-type") || f.has("tokenizer-model") || f.has("make-vocab-size-divisible-by"))
    LATTICE_FAIL() << "--tokenizer-type, --tokenizer-model and --make-vocab-size-divisible-by apply to --from-hf only";
  hf::ExportOptions options = hf::parse_export_options(f.get("hf-dtype", ""), f.get("max-shard-size", ""));
  options.model_type = f.get("hf-model-type", "");
  if (fs::exists(fs::path(dir) / "model.safetensors") || fs::exists(fs::path(dir) / "model.safetensors.index.json") ||
      fs::exists(fs::path(dir) / "config.json"))
    LATTICE_FAIL() << "--to-hf " << dir << " already holds a model; choose a new directory";
  // Opened without its model: written HF tensor by HF tensor, each read from the checkpoint as it is written
  // (streamed; GPT-OSS a layer at a time).
  LoadedModel lm = open_model_checkpoint(load);
  const TransformerConfig& c = lm.config;
  const hf::ExportSource streamed = hf::checkpoint_source(lm);
  // Phi-3: Llama's model with fused tensors, a part of each head rotated, LongRoPE; with --hf-model-type
  // phi3, or when the weights were converted from Phi-3 or have LongRoPE (only Phi-3 has it) and have its form.
  if (options.model_type.empty() && (lm.hf_model_type == "phi3" || c.longrope()) && hf_llama_mismatch(c, true).empty())
    options.model_type = "phi3";
  if (c.longrope() && options.model_type != "phi3")
    LATTICE_FAIL() << "--to-hf " << dir << ": the checkpoint's model has LongRoPE (--longrope-short-factor), which of "
                   << "the HuggingFace forms only Phi-3 has, and "
                   << (options.model_type.empty() ? hf_llama_mismatch(c, true)
                                                  : "--hf-model-type " + options.model_type + " is not phi3");
  if (c.hybrid()) {  // HuggingFace Nemotron-H, or an error saying why not
    save_hf_nemotron_h(dir, streamed, lm.tokenizer_type, options);
    copy_tokenizer_files(lm, dir);
    std::fprintf(stderr, "convert: %s (iteration %lld) -> %s (Nemotron-H, %s)\n", load.c_str(), (long long)lm.iteration,
                 dir.c_str(), options.dtype.c_str());
    if (c.mtp_use_repeated_layer && c.mtp_num_layers > 1)
      std::fprintf(stderr,
                   "convert: the %lld prediction depths share one layer (--mtp-use-repeated-layer): written once "
                   "(num_nextn_predict_layers 1, NVIDIA's Nemotron-3 form); --from-hf reads it back as one depth\n",
                   (long long)c.mtp_num_layers);
    return;
  }
  if (c.mtp_use_repeated_layer)
    LATTICE_FAIL() << "--to-hf " << dir << ": the checkpoint's prediction depths share one layer "
                   << "(--mtp-use-repeated-layer), which none of the HuggingFace forms lattice writes but Nemotron-H "
                   << "has";
  if (c.gated_delta_net()) {  // HuggingFace Qwen3-Next or Qwen3.5-MoE (with experts) or Qwen3.5 (dense), or an
                              // error saying why not; a prediction depth as their multi-token prediction module.
                              // Without the flag, the family the weights were converted from, when it fits.
    if (options.model_type.empty()) options.model_type = hf_qwen3_next_recorded_type(c, lm.hf_model_type);
    save_hf_qwen3_next(dir, streamed, lm.tokenizer_type, options);
    copy_tokenizer_files(lm, dir);
    std::fprintf(stderr, "convert: %s (iteration %lld) -> %s (%s, %s)\n", load.c_str(), (long long)lm.iteration,
                 dir.c_str(), hf_qwen3_next_family_name(c, options.model_type).c_str(), options.dtype.c_str());
    return;
  }
  if (c.attention_output_gate)
    LATTICE_FAIL() << "--to-hf " << dir << ": the checkpoint's model has the attention output gate "
                   << "(--attention-output-gate): none of the HuggingFace models lattice writes (GPT-2, Llama, Qwen, "
                      "Mistral, SmolLM3, Mixtral, DeepSeek, GLM, GPT-OSS) has one";
  if (c.multi_latent_attention) {  // HuggingFace DeepSeek-V3 (or Kimi-K2's or GLM-4.7-Flash's form of it) or V2, or
                                   // an error saying why not; without the flag the form the weights came from
    if (options.model_type.empty()) options.model_type = hf_deepseek_recorded_type(c, lm.hf_model_type);
    save_hf_deepseek_mla(dir, streamed, lm.tokenizer_type, options);
    copy_tokenizer_files(lm, dir);
    std::fprintf(stderr, "convert: %s (iteration %lld) -> %s (%s, %s)\n", load.c_str(), (long long)lm.iteration,
                 dir.c_str(), hf_deepseek_family_name(c, options.model_type), options.dtype.c_str());
    return;  // (prediction depths: DeepSeek-V3's multi-token prediction modules)
  }
  if (options.model_type == "phi3") {
    save_hf_llama(dir, streamed, lm.tokenizer_type, options);  // or an error saying why not
    copy_tokenizer_files(lm, dir);
    std::fprintf(stderr, "convert: %s (iteration %lld) -> %s (Phi-3, %s)\n", load.c_str(), (long long)lm.iteration,
                 dir.c_str(), options.dtype.c_str());
    if (c.mtp())
      std::fprintf(stderr, "convert: the %lld multi-token prediction depths (mtp.layers.*) are not exported: the "
                           "HuggingFace form has none\n", (long long)c.mtp_num_layers);
    return;
  }
  if (!options.model_type.empty())
    LATTICE_FAIL() << "--hf-model-type " << options.model_type << ": chooses among the Gated DeltaNet families "
                   << "(qwen3_next, qwen3_5_text, qwen3_5_moe_text), the DeepSeek-V3 ones (deepseek_v3, kimi_k2, "
                      "glm4_moe_lite) and phi3 for a dense Llama-style model; "
                      "the checkpoint's model has neither Gated DeltaNet layers nor multi-latent attention";
  const std::string not_gpt2 = hf_gpt2_mismatch(c), not_llama = hf_llama_mismatch(c);
  const std::string not_gpt_oss = hf_gpt_oss_mismatch(c), not_glm = hf_glm4_moe_mismatch(c);
  const std::string not_starcoder2 = hf_starcoder2_mismatch(c);
  if (!not_gpt2.empty() && !not_llama.empty() && !not_gpt_oss.empty() && !not_glm.empty() && !not_starcoder2.empty())
    LATTICE_FAIL() << "--to-hf " << dir << ": the checkpoint's model has " << not_gpt2 << ", " << not_llama << ", "
                   << not_gpt_oss << ", " << not_glm << ", and " << not_starcoder2
                   << ": neither HuggingFace GPT-2, Llama, GPT-OSS, GLM-4.5 nor StarCoder2";
  if (not_gpt2.empty())
    save_hf_gpt2(dir, streamed, lm.tokenizer_type, options);
  else if (not_llama.empty())
    save_hf_llama(dir, streamed, lm.tokenizer_type, options);
  else if (not_starcoder2.empty())
    save_hf_starcoder2(dir, streamed, lm.tokenizer_type, options);
  else if (not_gpt_oss.empty())
    save_hf_gpt_oss(dir, streamed, lm.tokenizer_type, options);
  else
    save_hf_glm4_moe(dir, streamed, lm.tokenizer_type, options);
  copy_tokenizer_files(lm, dir);
  std::fprintf(stderr, "convert: %s (iteration %lld) -> %s (%s, %s)\n", load.c_str(), (long long)lm.iteration,
               dir.c_str(),
               not_gpt2.empty()         ? "GPT-2"
               : not_llama.empty()      ? hf_llama_family_name(c)
               : not_starcoder2.empty() ? "StarCoder2"
               : not_gpt_oss.empty()    ? "GPT-OSS"
                                        : "GLM-4.5",
               options.dtype.c_str());
  if (c.mtp() && not_glm.empty()) return;  // GLM-4.5's multi-token prediction layers: written
  if (c.mtp())  // the main model is whole without them (Megatron's exports drop them too)
    std::fprintf(stderr, "convert: the %lld multi-token prediction depths (mtp.layers.*) are not exported: the "
                         "HuggingFace form has none\n", (long long)c.mtp_num_layers);
}

}  // namespace

int cmd_convert(int argc, char** argv) {
  if (help_requested(argc, argv, 2)) {
    std::fputs(
        "usage: lattice convert --from-hf DIR --save CKPT [--tokenizer-type NAME] [--tokenizer-model PATH]\n"
        "                       [--make-vocab-size-divisible-by N]\n"
        "       lattice convert --load CKPT --to-hf DIR [--hf-dtype float32|bfloat16|float16] [--max-shard-size 5GB]\n"
        "                       [--hf-model-type qwen3_next|qwen3_5_moe|kimi_k2|glm4_moe_lite|phi3]\n"
        "       lattice convert --from-megatron DIR --save CKPT [--tokenizer-type NAME] [--tokenizer-model PATH]\n"
        "                       [--vocab-file PATH] [--merge-file PATH] [--no-load-optim]\n"
        "       lattice convert --load CKPT --to-megatron DIR [--target-tensor-parallel-size T]\n"
        "                       [--target-pipeline-parallel-size P] [--target-expert-parallel-size E]\n"
        "                       [--transformer-impl transformer_engine|local]\n"
        "--to-megatron writes it as Megatron-LM's own (DIR/release/mp_rank_*/model_optim_rng.pt: the weights in fp32,\n"
        "the model's flags as its saved args) for that layout and layer spec [1, 1, 1, transformer_engine].\n"
        "--from-megatron reads a Megatron-LM GPT checkpoint saved with --ckpt-format torch or torch_dist (DIR: its --save\n"
        "directory or an iter_* directory in it; every rank's part; either layer spec): the model's flags from its saved\n"
        "args, the weights, the tokenizer its args name when its files are here (the tokenizer flags override it). Adam's\n"
        "state (the non-distributed optimizer's; the distributed one's: --ckpt-format torch's distrib_optim.pt,\n"
        "torch_dist's buckets of a dense model, its flattened and fully reshardable forms) comes over too, unless\n"
        "--no-load-optim: the fp32 main weights, the moments, the step, the scheduler and the data position, so\n"
        "`lattice train --load CKPT` resumes the run at its iteration; otherwise the weights alone (iteration 0:\n"
        "train with --finetune).\n"
        "HuggingFace GPT-2, Llama, Qwen2, Qwen3, Mistral, SmolLM3, Phi-3 (Phi-4), StarCoder2, Mixtral, Qwen2-MoE, Qwen3-MoE, DeepSeek-MoE, DeepSeek-V2,\n"
        "DeepSeek-V3 (Kimi-K2, GLM-4.7-Flash), GLM-4.5, Qwen3-Next, Qwen3.5, Qwen3.5-MoE, Nemotron-H or GPT-OSS\n"
        "(config.json, model.safetensors) <-> lattice checkpoint: --from-hf reads config.json's model_type; --to-hf\n"
        "writes a hybrid (--hybrid-override-pattern) as Nemotron-H, a\n"
        "--multi-latent-attention model as DeepSeek-V3 (sigmoid router; its prediction depths as multi-token\n"
        "prediction modules) or DeepSeek-V2 (softmax router), and otherwise\n"
        "writes a Gated DeltaNet model as Qwen3-Next (with experts; Qwen3.5-MoE with --hf-model-type qwen3_5_moe) or\n"
        "Qwen3.5 (dense), and otherwise\n"
        "writes GPT-2 when the model has its form (learned positions, LayerNorm, GELU, biases), else Llama\n"
        "(rope, RMSNorm, SwiGLU, no biases), StarCoder2 for a rope model with LayerNorm, biases and the tanh GELU\n"
        "(--openai-gelu), Qwen2 for a Llama-form model with --add-qkv-bias, Qwen3 for one with\n"
        "--qk-layernorm, SmolLM3 for one with --no-rope-freq, Mixtral for one with --num-experts (Qwen3-MoE with both, Qwen2-MoE with\n"
        "--add-qkv-bias and gated shared experts, DeepSeek-MoE with ungated shared experts), GPT-OSS for\n"
        "GPT-OSS's form (experts of --quick-geglu with biases, learnable sinks; MXFP4 experts read too), GLM-4.5 for\n"
        "a model with DeepSeek-V3's experts (--moe-router-score-function sigmoid with the expert bias) and grouped-query\n"
        "attention (its prediction depths as multi-token prediction layers). The input is\n"
        "read and checked completely before anything is written; an existing checkpoint or HF model is\n"
        "never overwritten.\n"
        "  --tokenizer-type NAME              the tokenizer recorded in the checkpoint\n"
        "                                     [the one a lattice export recorded, else\n"
        "                                     HuggingFaceTokenizer when DIR has a tokenizer.json\n"
        "                                     lattice reads, else Llama2Tokenizer when it has a\n"
        "                                     tokenizer.model, else GPT2BPETokenizer for a\n"
        "                                     50257-token model]\n"
        "  --tokenizer-model PATH             tokenizer.json (HuggingFaceTokenizer) or tokenizer.model\n"
        "                                     (the SentencePiece types), or its folder [DIR]\n"
        "  --make-vocab-size-divisible-by N   pad the vocabulary to a multiple of N [128]\n"
        "  --hf-dtype TYPE                    --to-hf: the tensors' dtype, config.json's torch_dtype:\n"
        "                                     float32, bfloat16 or float16 (rounded to nearest even) [float32]\n"
        "  --max-shard-size SIZE              --to-hf: the largest file; a larger model is sharded as\n"
        "                                     transformers' save_pretrained does (5GB, 500MB, 2GiB, bytes) [5GB]\n"
        "  --hf-model-type TYPE               --to-hf: a Gated DeltaNet model with experts as qwen3_next (Qwen3-Next)\n"
        "                                     or qwen3_5_moe (Qwen3.5-MoE's text model, qwen3_5_moe_text) [the family\n"
        "                                     its weights were converted from, else qwen3_next]; a DeepSeek-V3 model as\n"
        "                                     kimi_k2 (Kimi-K2's model_type, DeepSeek-V3's architecture) or\n"
        "                                     glm4_moe_lite (GLM-4.7-Flash's) [the one it was converted from, else\n"
        "                                     deepseek_v3]; a dense Llama-style model as phi3 (Phi-3's fused\n"
        "                                     tensors; a part of each head rotated: --rotary-percent) [Phi-3 when its\n"
        "                                     weights were converted from Phi-3]\n",
        stdout);
    return 0;
  }
  SimpleFlags f = parse_simple_flags(argc, argv, 2,
                                     {"from-hf", "to-hf", "load", "save", "tokenizer-type", "tokenizer-model",
                                      "make-vocab-size-divisible-by", "hf-dtype", "max-shard-size", "hf-model-type",
                                      "from-megatron", "vocab-file", "merge-file", "to-megatron",
                                      "target-tensor-parallel-size", "target-pipeline-parallel-size",
                                      "target-expert-parallel-size", "transformer-impl"},
                                     {"no-load-optim"});
  const bool from = f.has("from-hf"), to = f.has("to-hf"), megatron = f.has("from-megatron");
  const bool to_mcore = f.has("to-megatron");
  if (int(from) + int(to) + int(megatron) + int(to_mcore) != 1)
    LATTICE_FAIL() << "give one of --from-hf DIR --save CKPT, --from-megatron DIR --save CKPT, --load CKPT --to-hf DIR "
                      "or --load CKPT --to-megatron DIR";
  const bool target = f.has("target-tensor-parallel-size") || f.has("target-pipeline-parallel-size") ||
                      f.has("target-expert-parallel-size") || f.has("transformer-impl");
  if (target && !to_mcore)
    LATTICE_FAIL() << "--target-*-parallel-size and --transformer-impl go with --to-megatron";
  if (to_mcore) {
    if (f.has("save")) LATTICE_FAIL() << "--save goes with --from-hf or --from-megatron, not --to-megatron";
    for (const char* flag : {"tokenizer-type", "tokenizer-model", "vocab-file", "merge-file", "hf-dtype",
                             "max-shard-size", "hf-model-type", "make-vocab-size-divisible-by"})
      if (f.has(flag)) LATTICE_FAIL() << "--" << flag << " does not apply to --to-megatron";
    to_megatron(f);
    return 0;
  }
  if (megatron && f.has("load")) LATTICE_FAIL() << "--load goes with --to-hf, not --from-megatron";
  if (!megatron && f.has("no-load-optim")) LATTICE_FAIL() << "--no-load-optim goes with --from-megatron";
  if (megatron) {
    from_megatron(f);
    return 0;
  }
  if (f.has("vocab-file") || f.has("merge-file")) LATTICE_FAIL() << "--vocab-file and --merge-file go with --from-megatron";
  if (from && f.has("load")) LATTICE_FAIL() << "--load goes with --to-hf, not --from-hf";
  if (to && f.has("save")) LATTICE_FAIL() << "--save goes with --from-hf, not --to-hf";
  if (from) from_hf(f);
  else to_hf(f);
  return 0;
}

}  // namespace lattice
