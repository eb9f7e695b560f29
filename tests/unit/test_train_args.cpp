// `lattice train` flag parsing: Megatron's names and defaults, and one-line errors
// that name the flag for each invalid value or combination.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "core/error.h"
#include "train/arguments.h"
#include "train/precision_setup.h"
#include "test_util.h"

namespace lattice {
namespace {

TrainArgs parse_words(std::vector<std::string> words) {
  std::vector<char*> argv;
  for (auto& w : words) argv.push_back(w.data());
  return parse_train_args(int(argv.size()), argv.data(), 2);
}

// The one-line error parse_words gives for these words ("" when they parse).
std::string words_error(std::vector<std::string> words) {
  try {
    parse_words(std::move(words));
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

// "lattice train", a small model's flags without data, then `extra`.
std::vector<std::string> model_words(std::vector<std::string> extra) {
  std::vector<std::string> w = {"lattice", "train", "--hidden-size", "64", "--num-attention-heads", "4",
                                "--seq-length", "16", "--micro-batch-size", "2", "--train-iters", "3",
                                "--vocab-size", "100"};
  w.insert(w.end(), extra.begin(), extra.end());
  return w;
}

// A 2-layer model on mock data, then `extra`.
std::vector<std::string> mock_words(std::vector<std::string> extra) {
  extra.insert(extra.begin(), {"--num-layers", "2", "--mock-data"});
  return model_words(std::move(extra));
}
TrainArgs parse(std::vector<std::string> extra) { return parse_words(mock_words(std::move(extra))); }
std::string error_of(std::vector<std::string> extra) { return words_error(mock_words(std::move(extra))); }

TEST(TrainArgs, MegatronDefaults) {
  TrainArgs a = parse({});
  EXPECT_EQ(a.global_batch_size, 2);  // defaults to the micro-batch size
  EXPECT_EQ(a.max_position_embeddings, 16);
  EXPECT_EQ(a.seed, 1234u);
  EXPECT_EQ(a.log_interval, 100);
  EXPECT_DOUBLE_EQ(a.weight_decay, 0.01);
  EXPECT_FLOAT_EQ(a.adam_beta2, 0.999f);
  EXPECT_FLOAT_EQ(a.clip_grad, 1.0f);
  EXPECT_FLOAT_EQ(a.hidden_dropout, 0.1f);
  EXPECT_EQ(a.make_vocab_size_divisible_by, 128);
  TransformerConfig c = a.transformer_config();
  c.finalize();
  EXPECT_EQ(c.padded_vocab_size, 128);
  EXPECT_EQ(c.ffn_hidden_size, 256);
}

// --moe-router-load-balancing-type: one type with one coefficient, or Megatron's list of types with
// one coefficient each; sinkhorn and none go alone; a type twice or a coefficient missing is an error.
TEST(TrainArgs, LoadBalancingTypesAndTheirCoefficients) {
  const std::vector<std::string> moe = {"--num-experts", "4", "--disable-bias-linear"};
  auto with = [&](std::vector<std::string> extra) {
    extra.insert(extra.begin(), moe.begin(), moe.end());
    return extra;
  };
  TransformerConfig c = parse(with({"--moe-aux-loss-coeff", "0.01"})).transformer_config();
  EXPECT_FLOAT_EQ(c.moe_aux_loss_coeff, 0.01f);  // aux_loss, Megatron's default type
  EXPECT_FALSE(c.moe_seq_aux_loss || c.moe_global_aux_loss);
  c = parse(with({"--moe-router-load-balancing-type", "seq_aux_loss", "--moe-aux-loss-coeff", "0.02"})).transformer_config();
  EXPECT_FLOAT_EQ(c.moe_aux_loss_coeff, 0.0f);
  EXPECT_TRUE(c.moe_seq_aux_loss);
  EXPECT_FLOAT_EQ(c.moe_seq_aux_loss_coeff, 0.02f);
  const TrainArgs a = parse(with({"--moe-router-load-balancing-type", "aux_loss", "seq_aux_loss", "global_aux_loss",
                                  "--moe-aux-loss-coeff", "1e-2", "2e-3", "3e-4"}));
  EXPECT_TRUE(a.moe_load_balancing("global_aux_loss"));
  EXPECT_FALSE(a.moe_load_balancing("sinkhorn"));
  c = a.transformer_config();
  EXPECT_FLOAT_EQ(c.moe_aux_loss_coeff, 1e-2f);
  EXPECT_TRUE(c.moe_seq_aux_loss && c.moe_global_aux_loss);
  EXPECT_FLOAT_EQ(c.moe_seq_aux_loss_coeff, 2e-3f);
  EXPECT_FLOAT_EQ(c.moe_global_aux_loss_coeff, 3e-4f);
  c = parse(with({"--moe-router-load-balancing-type", "none", "--moe-aux-loss-coeff", "0.01"})).transformer_config();
  EXPECT_FLOAT_EQ(c.moe_aux_loss_coeff, 0.0f);
  for (const auto& [extra, needle] : std::vector<std::pair<std::vector<std::string>, std::string>>{
           {{"--moe-router-load-balancing-type", "aux_loss", "global_aux_loss", "--moe-aux-loss-coeff", "0.01"},
            "--moe-aux-loss-coeff needs one value for each of the 2"},
           {{"--moe-router-load-balancing-type", "aux_loss", "--moe-aux-loss-coeff", "0.01", "0.02"},
            "--moe-aux-loss-coeff has 2 values for 1"},
           {{"--moe-router-load-balancing-type", "sinkhorn", "aux_loss", "--moe-aux-loss-coeff", "0", "0"},
            "sinkhorn goes alone"},
           {{"--moe-router-load-balancing-type", "seq_aux_loss", "seq_aux_loss", "--moe-aux-loss-coeff", "0", "0"},
            "lists seq_aux_loss twice"},
           {{"--moe-router-load-balancing-type", "balanced"}, "--moe-router-load-balancing-type balanced is not supported"},
           {{"--moe-aux-loss-coeff", "0.01", "-1"}, "--moe-aux-loss-coeff has 2 values"},
           {{"--moe-router-load-balancing-type", "aux_loss", "global_aux_loss", "--moe-aux-loss-coeff", "0.01", "-1"},
            "--moe-aux-loss-coeff must be a finite number >= 0, got -1"},
           {{"--moe-aux-loss-coeff", "x"}, "--moe-aux-loss-coeff: invalid value 'x'"}})
    EXPECT_NE(error_of(with(extra)).find(needle), std::string::npos) << error_of(with(extra));
}

TEST(TrainArgs, ValuesAndSwitches) {
  TrainArgs a = parse({"--lr", "3e-4", "--global-batch-size", "8", "--openai-gelu", "--seed=7"});
  EXPECT_DOUBLE_EQ(a.lr, 3e-4);
  EXPECT_EQ(a.num_micro_batches(), 4);
  EXPECT_TRUE(a.openai_gelu);
  EXPECT_EQ(a.seed, 7u);
}

TEST(TrainArgs, ErrorsNameTheFlag) {
  EXPECT_NE(error_of({"--bogus"}).find("unknown flag --bogus"), std::string::npos);
  EXPECT_NE(error_of({"--lr"}).find("--lr needs a value"), std::string::npos);
  EXPECT_NE(error_of({"--lr", "abc"}).find("--lr: invalid value 'abc'"), std::string::npos);
  EXPECT_NE(error_of({"--global-batch-size", "5"}).find("not a multiple of --micro-batch-size"),
            std::string::npos);
  EXPECT_NE(error_of({"--max-position-embeddings", "8"}).find("--seq-length 16 exceeds --max-position-embeddings 8"),
            std::string::npos);
  EXPECT_NE(error_of({"--num-attention-heads", "4", "--hidden-size", "30"}).find("given twice"),
            std::string::npos);
  EXPECT_NE(error_of({"--hidden-dropout", "1.5"}).find("--hidden-dropout"), std::string::npos);
  EXPECT_NE(error_of({"--optimizer", "lamb"}).find("--optimizer"), std::string::npos);
  EXPECT_NE(error_of({"--tensor-model-parallel-size", "3"})
                .find("--num-attention-heads 4 is not divisible by --tensor-model-parallel-size 3"),
            std::string::npos);
  EXPECT_NE(error_of({"--tensor-model-parallel-size", "2", "--ffn-hidden-size", "99"})
                .find("--ffn-hidden-size 99 is not divisible by --tensor-model-parallel-size 2"),
            std::string::npos);
  EXPECT_NE(error_of({"--tensor-model-parallel-size", "3", "--sequence-parallel"})
                .find("--seq-length 16 is not divisible by --tensor-model-parallel-size 3 (required by "
                      "--sequence-parallel)"),
            std::string::npos);
  EXPECT_NE(error_of({"--tensor-model-parallel-size", "0"}).find("--tensor-model-parallel-size must be >= 1"),
            std::string::npos);
}

// Flags of Megatron's model and logging options, as its example scripts pass them.
TEST(TrainArgs, MegatronModelAndLoggingFlags) {
  TrainArgs a = parse({"--attention-backend", "auto", "--position-embedding-type", "rope", "--rotary-percent", "0.5",
                       "--rotary-base", "500000", "--rotary-interleaved", "--disable-bias-linear", "--kv-channels",
                       "32", "--tensorboard-dir", "/tmp/tb", "--tensorboard-log-interval", "5",
                       "--log-validation-ppl-to-tensorboard", "--init-method-xavier-uniform"});
  EXPECT_EQ(a.attention_backend, "auto");
  EXPECT_EQ(a.tensorboard_dir, "/tmp/tb");
  EXPECT_EQ(a.tensorboard_log_interval, 5);
  TransformerConfig c = a.transformer_config();
  c.finalize();
  EXPECT_TRUE(c.rope());
  EXPECT_DOUBLE_EQ(c.rotary_percent, 0.5);
  EXPECT_FLOAT_EQ(c.rotary_base, 500000.0f);
  EXPECT_TRUE(c.rotary_interleaved);
  EXPECT_TRUE(c.init_method_xavier_uniform);
  EXPECT_FALSE(parse({}).transformer_config().init_method_xavier_uniform);
  EXPECT_FALSE(c.add_bias_linear);
  EXPECT_EQ(c.attention_width(), 128);  // 4 heads x 32, against a hidden size of 64
  EXPECT_NE(error_of({"--attention-backend", "magic"}).find("--attention-backend must be"), std::string::npos);
  EXPECT_NE(error_of({"--tensorboard-log-interval", "0"}).find("--tensorboard-log-interval"), std::string::npos);
  EXPECT_NE(error_of({"--log-timers-to-tensorboard"}).find("need --tensorboard-dir"), std::string::npos);
  EXPECT_NE(error_of({"--tp-comm-overlap"}).find("--tp-comm-overlap needs --sequence-parallel"), std::string::npos);
  EXPECT_EQ(error_of({"--tp-comm-overlap", "--sequence-parallel"}), "");
}

// --swiglu: Megatron's default ffn for it, int(4 h 2 / 3 / 64) * 64, unless given; no GELU flag.
TEST(TrainArgs, SwigluAndItsDefaultFfnHiddenSize) {
  TransformerConfig c = parse({"--swiglu"}).transformer_config();
  c.finalize();
  EXPECT_TRUE(c.swiglu);
  EXPECT_EQ(c.ffn_hidden_size, 128);  // 8 x 64 / 3 = 170.7 -> 128
  EXPECT_EQ(c.fc1_width(), 256);
  TransformerConfig big;
  big.num_layers = 1;
  big.hidden_size = 4096;
  big.num_attention_heads = 32;
  big.vocab_size = 100;
  big.max_position_embeddings = 16;
  big.swiglu = true;
  big.finalize();
  EXPECT_EQ(big.ffn_hidden_size, 10880);
  c = parse({"--swiglu", "--ffn-hidden-size", "100"}).transformer_config();
  c.finalize();
  EXPECT_EQ(c.ffn_hidden_size, 100);
  EXPECT_NE(error_of({"--swiglu", "--openai-gelu"}).find("--openai-gelu and --swiglu"), std::string::npos);
  big.hidden_size = 16;  // 8 x 16 / 3 = 42: no multiple of 64
  big.num_attention_heads = 4;
  big.ffn_hidden_size = big.kv_channels = big.num_query_groups = 0;
  try {
    big.finalize();
    ADD_FAILURE() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("give --ffn-hidden-size"), std::string::npos) << e.what();
  }
}

// GPT-OSS's gated unit: --quick-geglu with --glu-linear-offset and --activation-func-clamp-value,
// the fc1 of a gated unit, and the combinations that make no sense refused naming the flags.
TEST(TrainArgs, QuickGegluAndTheGatedUnitsOptions) {
  TransformerConfig c =
      parse({"--quick-geglu", "--glu-linear-offset", "1", "--activation-func-clamp-value", "7", "--ffn-hidden-size", "96"})
          .transformer_config();
  c.finalize();
  EXPECT_TRUE(c.quick_geglu && c.gated_linear_unit() && !c.swiglu);
  EXPECT_EQ(c.fc1_width(), 192);
  EXPECT_EQ(c.glu_form().alpha, kQuickGeluAlpha);
  EXPECT_EQ(c.glu_form().linear_offset, 1.0f);
  EXPECT_EQ(c.glu_form().clamp, 7.0f);
  c = parse({"--quick-geglu"}).transformer_config();
  c.finalize();
  EXPECT_EQ(c.ffn_hidden_size, 256);  // Megatron's 4 h: the 8/3 default is --swiglu's only
  c = parse({"--swiglu", "--activation-func-clamp-value", "7"}).transformer_config();
  c.finalize();
  EXPECT_EQ(c.glu_form().alpha, 1.0f);
  EXPECT_EQ(c.glu_form().clamp, 7.0f);
  auto finalize_error = [](std::vector<std::string> flags) {
    try {
      parse(std::move(flags)).transformer_config().finalize();
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string();
  };
  EXPECT_NE(error_of({"--swiglu", "--quick-geglu"}).find("--swiglu and --quick-geglu"), std::string::npos);
  EXPECT_NE(error_of({"--quick-geglu", "--openai-gelu"}).find("--openai-gelu and --quick-geglu"), std::string::npos);
  EXPECT_NE(error_of({"--quick-geglu", "--squared-relu"}).find("--squared-relu and --quick-geglu"), std::string::npos);
  EXPECT_NE(finalize_error({"--glu-linear-offset", "1"}).find("--glu-linear-offset needs a gated MLP"), std::string::npos);
  EXPECT_NE(finalize_error({"--activation-func-clamp-value", "7"}).find("--activation-func-clamp-value needs a gated"),
            std::string::npos);
  EXPECT_NE(finalize_error({"--quick-geglu", "--activation-func-clamp-value", "-1"})
                .find("--activation-func-clamp-value must be a finite number > 0, got -1"),
            std::string::npos);
  EXPECT_NE(finalize_error({"--quick-geglu", "--glu-linear-offset", "inf"}).find("--glu-linear-offset must be"),
            std::string::npos);
}

// --group-query-attention --num-query-groups (Megatron's default 1; ignored without the switch).
TEST(TrainArgs, GroupedQueryAttention) {
  TransformerConfig c = parse({"--num-query-groups", "2"}).transformer_config();
  c.finalize();
  EXPECT_FALSE(c.grouped_query_attention());
  c = parse({"--group-query-attention"}).transformer_config();
  c.finalize();
  EXPECT_EQ(c.num_query_groups, 1);
  EXPECT_EQ(c.qkv_width(), 64 + 2 * 16);
  c = parse({"--group-query-attention", "--num-query-groups", "2"}).transformer_config();
  c.finalize(2);
  EXPECT_EQ(c.qkv_width(), 64 + 2 * 2 * 16);
  EXPECT_NE(error_of({"--group-query-attention", "--num-query-groups", "3"})
                .find("--num-query-groups 3 does not divide --num-attention-heads 4"),
            std::string::npos);
  c = parse({"--group-query-attention", "--num-query-groups", "2"}).transformer_config();
  try {
    c.finalize(4);
    ADD_FAILURE() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("--num-query-groups 2 is not divisible by --tensor-model-parallel-size 4"),
              std::string::npos)
        << e.what();
  }
}

TEST(TrainArgs, HeadsMustDivideHidden) {
  std::vector<std::string> words = {"lattice", "train", "--num-layers", "2", "--hidden-size", "30",
                                    "--num-attention-heads", "4", "--seq-length", "16",
                                    "--micro-batch-size", "2", "--train-iters", "3", "--mock-data",
                                    "--vocab-size", "100"};
  std::vector<char*> argv;
  for (auto& w : words) argv.push_back(w.data());
  try {
    parse_train_args(int(argv.size()), argv.data(), 2);
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("--num-attention-heads 4 does not divide --hidden-size 30"),
              std::string::npos)
        << e.what();
  }
}

TEST(TrainArgs, HelpListsEveryFlagWithDefault) {
  std::string h = train_help();
  EXPECT_NE(h.find("--num-layers"), std::string::npos);
  EXPECT_NE(h.find("--weight-decay"), std::string::npos);
  EXPECT_NE(h.find("[0.01]"), std::string::npos);
  EXPECT_NE(h.find("--untie-embeddings-and-output-weights"), std::string::npos);
}

}  // namespace
}  // namespace lattice

namespace lattice {
namespace {


std::vector<std::string> sample_based(std::vector<std::string> extra) {
  std::vector<std::string> w = {"lattice", "train", "--num-layers", "2", "--hidden-size", "64",
                                "--num-attention-heads", "4", "--seq-length", "16", "--micro-batch-size",
                                "2", "--global-batch-size", "8", "--mock-data", "--vocab-size", "100"};
  w.insert(w.end(), extra.begin(), extra.end());
  return w;
}

TEST(TrainArgs, TrainSamplesSetsTheIterations) {
  TrainArgs a = parse_words(sample_based({"--train-samples", "100", "--lr-decay-samples", "80"}));
  EXPECT_EQ(a.train_iters, 12);  // Megatron: train_samples // global_batch_size
  EXPECT_EQ(a.lr_decay_samples, 80);
}

TEST(TrainArgs, TrainSamplesErrors) {
  auto err = [](std::vector<std::string> extra) { return words_error(sample_based(std::move(extra))); };
  EXPECT_NE(err({"--train-samples", "100", "--train-iters", "5"}).find("exclusive"), std::string::npos);
  EXPECT_NE(err({"--train-samples", "4"}).find("less than one --global-batch-size 8"), std::string::npos);
  EXPECT_NE(err({}).find("--train-iters is required"), std::string::npos);
}


// --multiple-validation-sets: the sets are --valid-data-path's datasets, given without weights.
TEST(TrainArgs, MultipleValidationSetsNeedUnweightedValidDataPaths) {
  auto words = [](std::vector<std::string> extra) {
    extra.insert(extra.begin(), {"--num-layers", "2", "--multiple-validation-sets"});
    return model_words(std::move(extra));
  };
  auto error = [&](std::vector<std::string> extra) { return words_error(words(std::move(extra))); };
  EXPECT_TRUE(parse_words(words({"--train-data-path", "t", "--valid-data-path", "a", "b"})).multiple_validation_sets);
  EXPECT_FALSE(parse_words(sample_based({"--train-samples", "8"})).multiple_validation_sets);
  EXPECT_EQ(error({"--train-data-path", "t"}),
            "--multiple-validation-sets needs --valid-data-path (its datasets are the sets)");
  EXPECT_EQ(error({"--mock-data"}), "--multiple-validation-sets needs --valid-data-path (its datasets are the sets)");
  EXPECT_EQ(error({"--train-data-path", "t", "--valid-data-path", "1", "a", "2", "b"}),
            "--multiple-validation-sets: --valid-data-path takes no weights (each dataset is a set of its own, "
            "evaluated alone), got 1");
  EXPECT_EQ(error({"--train-data-path", "t", "--valid-data-path", "a", "0.5"}),
            "--multiple-validation-sets: --valid-data-path takes no weights (each dataset is a set of its own, "
            "evaluated alone), got 0.5");
  // --full-validation: off by default; --mock-data's validation stream has no end to read to.
  EXPECT_FALSE(parse_words(words({"--train-data-path", "t", "--valid-data-path", "a"})).full_validation);
  EXPECT_TRUE(parse_words(words({"--train-data-path", "t", "--valid-data-path", "a", "--full-validation"})).full_validation);
  std::vector<std::string> mock = {"lattice", "train", "--num-layers", "2", "--hidden-size", "64",
                                   "--num-attention-heads", "4", "--seq-length", "16", "--micro-batch-size", "2",
                                   "--train-iters", "3", "--vocab-size", "100", "--mock-data", "--full-validation"};
  try {
    parse_words(mock);
    ADD_FAILURE() << "--full-validation with --mock-data accepted";
  } catch (const Error& e) {
    EXPECT_EQ(std::string(e.what()), "--full-validation evaluates the whole validation split, and --mock-data's has no "
                                     "end: give --data-path or --valid-data-path");
  }
}

// Megatron's flags for what lattice already has another way to say: --recompute-activations,
// --num-virtual-stages-per-pipeline-rank, --pipeline-model-parallel-layout, --fp8-recipe delayed,
// --ddp-average-in-collective; and what each refuses.
TEST(TrainArgs, MegatronSpellingsOfLayoutsAndRecipes) {
  EXPECT_EQ(parse({"--recompute-activations"}).recompute_granularity, "selective");
  EXPECT_EQ(parse({"--recompute-granularity", "full", "--recompute-activations"}).recompute_granularity,
            "selective");  // Megatron's override; then its check: selective takes no method
  EXPECT_NE(error_of({"--recompute-granularity", "full", "--recompute-method", "uniform", "--recompute-num-layers", "1",
                      "--recompute-activations"})
                .find("--recompute-method uniform needs --recompute-granularity full"),
            std::string::npos);
  // 8 layers on 2 pipeline stages (parse's base command line has 2 layers).
  auto eight = [](std::vector<std::string> extra) {
    extra.insert(extra.begin(), {"--num-layers", "8", "--mock-data", "--pipeline-model-parallel-size", "2"});
    return model_words(std::move(extra));
  };
  auto layout = [&](std::vector<std::string> extra) { return pipeline_layout_of(parse_words(eight(std::move(extra)))); };
  // V = 2 chunks per stage is 2 layers per chunk.
  const PipelineLayout by_count = layout({"--num-virtual-stages-per-pipeline-rank", "2"});
  const PipelineLayout by_layers = layout({"--num-layers-per-virtual-pipeline-stage", "2"});
  EXPECT_EQ(by_count.virtual_stages, 2);
  for (int r = 0; r < 2; ++r) EXPECT_EQ(stage_layers(by_count, r), stage_layers(by_layers, r));
  EXPECT_EQ(layout({"--num-virtual-stages-per-pipeline-rank", "1"}).virtual_stages, 1);
  const PipelineLayout text = layout({"--pipeline-model-parallel-layout", "Et|t*3|tt|ttL"});
  EXPECT_EQ(text.chunk_layers, (std::vector<int64_t>{1, 3, 2, 2}));
  auto err = [&](std::vector<std::string> extra) { return words_error(eight(std::move(extra))); };
  EXPECT_NE(err({"--num-virtual-stages-per-pipeline-rank", "3"})
                .find("--num-layers 8 is not divisible by --pipeline-model-parallel-size 2 x "
                      "--num-virtual-stages-per-pipeline-rank 3"),
            std::string::npos);
  EXPECT_NE(err({"--num-virtual-stages-per-pipeline-rank", "2", "--num-layers-per-virtual-pipeline-stage", "2"})
                .find("no more than one of"),
            std::string::npos);
  EXPECT_NE(err({"--pipeline-model-parallel-layout", "Etttt|ttttL", "--num-virtual-stages-per-pipeline-rank", "2"})
                .find("no more than one of"),
            std::string::npos);
  EXPECT_NE(err({"--pipeline-model-parallel-layout", "Etttt|ttttL", "--decoder-first-pipeline-num-layers", "3"})
                .find("cannot be combined with --decoder-first-pipeline-num-layers"),
            std::string::npos);
  EXPECT_NE(err({"--pipeline-model-parallel-layout", "Etttt|ttttL", "--account-for-loss-in-pipeline-split"})
                .find("cannot be combined with --account-for-loss-in-pipeline-split"),
            std::string::npos);
  EXPECT_NE(err({"--pipeline-model-parallel-layout", "Ettt|ttttL"}).find("holds 7 decoder layers"), std::string::npos);
  EXPECT_NE(err({"--num-virtual-stages-per-pipeline-rank", "2", "--decoder-first-pipeline-num-layers", "2"})
                .find("is not implemented"),
            std::string::npos);

  EXPECT_EQ(parse({}).mid_level_dataset_surplus, 0.005);
  EXPECT_EQ(parse({"--mid-level-dataset-surplus", "0"}).mid_level_dataset_surplus, 0.0);
  EXPECT_EQ(error_of({"--mid-level-dataset-surplus", "-0.1"}), "--mid-level-dataset-surplus must be >= 0, got -0.1");
  EXPECT_FALSE(parse({}).embedding_init_method_std.has_value());
  EXPECT_EQ(parse({"--embedding-init-method-std", "1.0"}).transformer_config().embedding_init_method_std, 1.0f);
  EXPECT_EQ(parse({}).transformer_config().embedding_init_method_std, -1.0f);
  EXPECT_EQ(error_of({"--embedding-init-method-std", "-1"}), "--embedding-init-method-std must be >= 0, got -1");
  // --ddp-num-buckets n: buckets of (the rank's parameters) // n elements (Megatron's num_parameters // n).
  EXPECT_EQ(parse({"--ddp-num-buckets", "4"}).ddp_bucket_elements(1001), 250);
  EXPECT_EQ(parse({"--ddp-bucket-size", "77"}).ddp_bucket_elements(1001), 77);
  EXPECT_EQ(parse({}).ddp_bucket_elements(1001), 0);  // the default
  EXPECT_EQ(parse({"--ddp-num-buckets", "5000"}).ddp_bucket_elements(1001), 1);
  EXPECT_EQ(error_of({"--ddp-num-buckets", "2", "--ddp-bucket-size", "10"}),
            "--ddp-num-buckets and --ddp-bucket-size cannot both be given");
  EXPECT_EQ(error_of({"--ddp-num-buckets", "-1"}), "--ddp-num-buckets must be greater than 0, got -1");
  // --first-last-layers-bf16: nothing without fp8 (Megatron's), refused with the delayed recipe.
  EXPECT_TRUE(parse({"--first-last-layers-bf16", "--num-layers-at-start-in-bf16", "2"}).first_last_layers_bf16);
  EXPECT_NE(error_of({"--fp8-format", "hybrid", "--first-last-layers-bf16"}).find("--first-last-layers-bf16: the delayed"),
            std::string::npos);
  EXPECT_EQ(error_of({"--fp8-format", "hybrid", "--first-last-layers-bf16", "--num-layers-at-end-in-bf16", "3"}),
            "--num-layers-at-end-in-bf16 3 must be between 0 and the layers per pipeline stage (2)");
  EXPECT_EQ(parse({}).fp8_recipe, "delayed");
  EXPECT_EQ(parse({"--fp8-recipe", "delayed"}).fp8_recipe, "delayed");
  for (const char* recipe : {"tensorwise", "blockwise", "mxfp8"})
    EXPECT_EQ(parse({"--fp8-format", "hybrid", "--fp8-recipe", recipe}).fp8_recipe, recipe);
  EXPECT_NE(error_of({"--fp8-recipe", "custom"}).find("--fp8-recipe custom builds its quantizers with "
                                                      "--fp8-quantizer-factory"),
            std::string::npos);
  EXPECT_EQ(error_of({"--fp8-recipe", "fast"}),
            "--fp8-recipe must be delayed, tensorwise, blockwise or mxfp8, got 'fast'");
  // First / last layers in bf16 with the current-scaling recipes (Megatron's rule).
  EXPECT_TRUE(parse({"--fp8-format", "hybrid", "--fp8-recipe", "tensorwise", "--first-last-layers-bf16"})
                  .first_last_layers_bf16);
  EXPECT_TRUE(parse({"--ddp-average-in-collective"}).implementation.ddp_average_in_collective);
  EXPECT_NE(error_of({"--ddp-average-in-collective", "--calculate-per-token-loss"}).find("cannot be used with"),
            std::string::npos);
}

// --data-args-path / --per-split-data-args-path: the data paths read from files.
TEST(TrainArgs, DataArgsFiles) {
  auto words = [](std::vector<std::string> extra) {
    extra.insert(extra.begin(), {"--num-layers", "2"});
    return model_words(std::move(extra));
  };
  auto parse_w = [&](std::vector<std::string> extra) { return parse_words(words(std::move(extra))); };
  auto error = [&](std::vector<std::string> extra) { return words_error(words(std::move(extra))); };
  const std::string dir = test_util::temp_dir();
  test_util::write_text(dir + "/blend.txt", "0.3 /data/a_text_document\n  0.7\t/data/b_text_document\n");
  EXPECT_EQ(parse_w({"--data-args-path", dir + "/blend.txt"}).data_path,
            (std::vector<std::string>{"0.3", "/data/a_text_document", "0.7", "/data/b_text_document"}));
  test_util::write_text(dir + "/splits.json",
                        R"({"train": ["1 /d/a", "2 /d/b"], "valid": "/d/v", "test": null})");
  const TrainArgs s = parse_w({"--per-split-data-args-path", dir + "/splits.json"});
  EXPECT_EQ(s.train_data_path, (std::vector<std::string>{"1", "/d/a", "2", "/d/b"}));
  EXPECT_EQ(s.valid_data_path, (std::vector<std::string>{"/d/v"}));
  EXPECT_TRUE(s.test_data_path.empty());

  EXPECT_EQ(error({"--data-args-path", dir + "/missing.txt"}).find("--data-args-path " + dir + "/missing.txt: cannot open"),
            0u);
  test_util::write_text(dir + "/empty.txt", " \n");
  EXPECT_EQ(error({"--data-args-path", dir + "/empty.txt"}), "--data-args-path " + dir + "/empty.txt: no data paths in the file");
  EXPECT_EQ(error({"--data-args-path", dir + "/blend.txt", "--data-path", "x"}), "--data-args-path and --data-path are exclusive");
  EXPECT_EQ(error({"--data-args-path", dir}), "--data-args-path " + dir + ": is a directory, not a file");
  EXPECT_EQ(error({"--per-split-data-args-path", dir}), "--per-split-data-args-path " + dir + ": is a directory, not a file");
  test_util::write_text(dir + "/odd.txt", "0.3 a 0.7");
  EXPECT_NE(error({"--data-args-path", dir + "/odd.txt"}).find("--data-path"), std::string::npos);
  for (const auto& [text, want] : std::vector<std::pair<std::string, std::string>>{
           {"[1, 2]", "expected an object with train, valid and test"},
           {"{\"train\": \"a\", \"tests\": \"b\"}", "unknown key \"tests\""},
           {"{\"valid\": \"a\"}", "no \"train\" data"},
           {"{\"train\": [1]}", "\"train\" must be a list of strings or a string"},
           {"{\"train\": \"  \"}", "\"train\" is empty"},
           {"{\"train\": ", "not JSON"},
       }) {
    test_util::write_text(dir + "/bad.json", text);
    const std::string got = error({"--per-split-data-args-path", dir + "/bad.json"});
    EXPECT_EQ(got.find("--per-split-data-args-path " + dir + "/bad.json: "), 0u) << text << ": " << got;
    EXPECT_NE(got.find(want), std::string::npos) << text << ": " << got;
  }
  EXPECT_EQ(error({"--per-split-data-args-path", dir + "/splits.json", "--valid-data-path", "v"}),
            "--per-split-data-args-path and --train-data-path/--valid-data-path/--test-data-path are exclusive");
}

TEST(TrainArgs, MegatronsOtherSpellingsAreTheSameFlag) {
  // model_words gives --seq-length; mock_words --num-layers.
  std::vector<std::string> w = model_words({"--encoder-num-layers", "3", "--mock-data", "--persistent-save-interval", "7",
                                            "--override-opt-param-scheduler"});
  const TrainArgs a = parse_words(w);
  EXPECT_EQ(a.num_layers, 3);
  EXPECT_EQ(a.save_interval, 7);
  EXPECT_TRUE(a.override_opt_param_scheduler);
  EXPECT_TRUE(parse({"--use-checkpoint-opt-param-scheduler"}).use_checkpoint_opt_param_scheduler);
  EXPECT_EQ(error_of({"--encoder-seq-length", "32"}), "--seq-length and --encoder-seq-length are one flag: give it once");
  EXPECT_EQ(error_of({"--encoder-num-layers", "2"}), "--num-layers and --encoder-num-layers are one flag: give it once");
  EXPECT_EQ(error_of({"--save-interval", "1", "--save-interval", "2"}), "--save-interval given twice");
  // Errors name the flag as it was spelled.
  EXPECT_EQ(error_of({"--persistent-save-interval", "x"}), "--persistent-save-interval: invalid value 'x'");
  EXPECT_EQ(error_of({"--override-opt-param-scheduler=1"}), "--override-opt-param-scheduler takes no value");
}

TEST(TrainArgs, MegatronFlagsNotTakenSayWhatTheyAreFor) {
  EXPECT_EQ(error_of({"--wandb-project", "p"}),
            "--wandb-project: Weights & Biases logging is not part of lattice (TensorBoard events: --tensorboard-dir)");
  EXPECT_EQ(error_of({"--use-megatron-fsdp"}).find("--use-megatron-fsdp: FSDP parameter sharding is not implemented"), 0u);
  EXPECT_EQ(error_of({"--inprocess-restart"}).find("--inprocess-restart: Megatron's in-process restart"), 0u);
  EXPECT_EQ(error_of({"--grpo-group-size", "4"}), "--grpo-group-size: RL training (GRPO) is not implemented");
  // Flags of lattice's own that share a prefix are taken as before.
  EXPECT_EQ(error_of({"--inference-rng-tracker"}), "");
  EXPECT_NE(error_of({"--bogus"}).find("unknown flag --bogus"), std::string::npos);
}

TEST(TrainArgs, MegatronsRemovedFlagsGiveItsErrors) {
  EXPECT_EQ(error_of({"--batch-size", "8"}), "--batch-size argument is no longer valid, use --micro-batch-size instead");
  EXPECT_EQ(error_of({"--warmup", "0.1"}), "--warmup argument is no longer valid, use --lr-warmup-fraction instead");
  EXPECT_EQ(error_of({"--model-parallel-size", "2"}),
            "--model-parallel-size is no longer valid, use --tensor-model-parallel-size instead");
  EXPECT_EQ(error_of({"--checkpoint-activations"}),
            "--checkpoint-activations is no longer valid, use --recompute-activations, or, for more control, "
            "--recompute-granularity and --recompute-method");
}

TEST(TrainArgs, AcceptedImplementationFlagsCheckTheirValues) {
  EXPECT_EQ(error_of({"--cross-entropy-fusion-impl", "fast"}),
            "--cross-entropy-fusion-impl must be one of native, te, got 'fast'");
  EXPECT_EQ(error_of({"--timing-log-option", "some"}), "--timing-log-option must be one of max, minmax, all, got 'some'");
  EXPECT_EQ(error_of({"--tp-comm-bootstrap-backend", "tcp"}),
            "--tp-comm-bootstrap-backend must be one of nccl, mpi, gloo, got 'tcp'");
  EXPECT_EQ(error_of({"--local-rank=-1"}), "--local-rank must be >= 0, got -1");
  EXPECT_EQ(error_of({"--manual-gc-interval", "-5"}), "--manual-gc-interval must be >= 0, got -5");
  EXPECT_EQ(error_of({"--fp32-residual-connection"}),
            "--fp32-residual-connection needs --bf16 or --fp16 (the residual stream of an fp32 run is fp32)");
  EXPECT_EQ(error_of({"--fp32-residual-connection", "--bf16"}), "");
  EXPECT_EQ(error_of({"--local-rank=3", "--fp8-interval", "2", "--use-dist-ckpt", "--dist-ckpt-format", "zarr",
                      "--cross-entropy-fusion-impl", "te", "--timing-log-option", "all"}),
            "");
}

TEST(TrainArgs, CheckpointTokenizerAndRecomputationFlagsCheckMegatronsConditions) {
  EXPECT_EQ(error_of({"--dist-ckpt-strictness", "log_all"}), "");
  EXPECT_NE(error_of({"--dist-ckpt-strictness", "lenient"}).find("--dist-ckpt-strictness must be one of assume_ok_unexpected"),
            std::string::npos);
  EXPECT_EQ(error_of({"--legacy-tokenizer", "--trust-remote-code"}), "");
  const std::vector<std::string> full = {"--recompute-granularity", "full", "--recompute-method", "uniform",
                                         "--recompute-num-layers", "1", "--distribute-saved-activations"};
  EXPECT_EQ(error_of(full),
            "--distribute-saved-activations needs --tensor-model-parallel-size > 1 (the activations are distributed over "
            "the tensor-parallel group)");
  std::vector<std::string> tp2 = full;
  tp2.insert(tp2.end(), {"--tensor-model-parallel-size", "2"});
  EXPECT_EQ(error_of(tp2), "");
  EXPECT_EQ(error_of({"--tensor-model-parallel-size", "2", "--distribute-saved-activations"}),
            "--distribute-saved-activations needs --recompute-granularity full and a --recompute-method");
  EXPECT_EQ(error_of({"--context-parallel-size", "2", "--cp-comm-type", "a2a+p2p"}),
            "--cp-comm-type a2a+p2p needs --hierarchical-context-parallel-sizes");
  EXPECT_EQ(error_of({"--context-parallel-size", "2", "--cp-comm-type", "a2a+p2p", "--hierarchical-context-parallel-sizes",
                      "2", "1"}),
            "");
  EXPECT_EQ(error_of({"--context-parallel-size", "2", "--hierarchical-context-parallel-sizes", "2", "2"}),
            "--hierarchical-context-parallel-sizes multiply to 4, not --context-parallel-size 2");
  EXPECT_EQ(error_of({"--hierarchical-context-parallel-sizes", "0"}),
            "--hierarchical-context-parallel-sizes: 0 is not a size (1 or more)");
}

TEST(TrainArgs, IterationsToSkip) {
  EXPECT_EQ(parse({"--iterations-to-skip", "7", "2", "7"}).iterations_to_skip_list(), (std::vector<int64_t>{2, 7}));
  EXPECT_TRUE(parse({}).iterations_to_skip_list().empty());
  EXPECT_EQ(error_of({"--iterations-to-skip", "2", "two"}), "--iterations-to-skip: invalid value 'two'");
  EXPECT_EQ(error_of({"--iterations-to-skip=-1"}), "--iterations-to-skip: -1 is not an iteration index (0 or more)");
}

// The weights an fp8 run keeps out of fp8: the output layer's (the tied word embedding's), and with
// --first-last-layers-bf16 the first and last decoder layers' by their global numbers.
TEST(TrainArgs, Fp8UnquantizedWeights) {
  std::vector<ParamInfo> infos;
  for (const char* name : {"embedding.word_embeddings.weight", "embedding.position_embeddings.weight",
                           "decoder.layers.0.self_attention.linear_qkv.weight", "decoder.layers.1.mlp.linear_fc1.weight",
                           "decoder.layers.2.mlp.linear_fc2.weight", "decoder.layers.3.self_attention.linear_proj.weight",
                           "decoder.layers.10.mlp.linear_fc1.weight", "decoder.final_layernorm.weight",
                           "output_layer.weight"}) {
    infos.emplace_back();
    infos.back().name = name;
  }
  TrainArgs a = parse({"--fp8-format", "hybrid", "--fp8-recipe", "tensorwise"});
  a.num_layers = 11;
  EXPECT_EQ(fp8_unquantized_weights(infos, a), (std::vector<bool>{true, false, false, false, false, false, false, false, true}));
  a.first_last_layers_bf16 = true;
  a.num_layers_at_start_in_bf16 = 2;
  a.num_layers_at_end_in_bf16 = 1;
  EXPECT_EQ(fp8_unquantized_weights(infos, a), (std::vector<bool>{true, false, true, true, false, false, true, false, true}));
  a.num_layers_at_start_in_bf16 = 0;
  a.num_layers_at_end_in_bf16 = 8;  // layers 3 .. 10
  EXPECT_EQ(fp8_unquantized_weights(infos, a), (std::vector<bool>{true, false, false, false, false, true, true, false, true}));
}

}  // namespace
}  // namespace lattice
