// lattice quickstart: build a GPT from a TransformerConfig, get a data iterator and
// run the training loop, as Megatron Core's quickstart does.
//   build/quickstart [iterations]
#include <cstdio>
#include <cstdlib>

#include "data/gpt_batches.h"
#include "model/gpt_model.h"
#include "optim/optimizer.h"
#include "train/train_step.h"

int main(int argc, char** argv) {
  const int64_t iterations = argc > 1 ? std::atoll(argv[1]) : 20;

  lattice::TransformerConfig config;
  config.num_layers = 2;
  config.hidden_size = 64;
  config.num_attention_heads = 4;
  config.vocab_size = 256;
  config.max_position_embeddings = 64;
  config.hidden_dropout = config.attention_dropout = 0.0f;
  config.finalize();

  const int64_t micro_batch = 4, seq_length = 64;
  lattice::GPTModel model(config, micro_batch, seq_length);
  model.init_parameters(/*seed=*/1234);

  lattice::OptimizerConfig opt;
  opt.adam_beta2 = 0.95f;
  lattice::Optimizer optimizer(model.params(), opt);

  lattice::MockSamples data(config.vocab_size, seq_length, /*seed=*/1234);
  lattice::StepConfig step{micro_batch, /*global_batch_size=*/8, seq_length, /*clip_grad=*/1.0, 1234};

  double first = 0, last = 0;
  for (int64_t it = 0; it < iterations; ++it) {
    lattice::StepResult r = lattice::train_step(model, optimizer, data, step, it, /*lr=*/3e-3,
                                                /*weight_decay=*/0.01);
    if (it == 0) first = r.lm_loss;
    last = r.lm_loss;
    std::printf("iteration %3lld | lm loss %.4f | grad norm %.3f\n", (long long)it + 1, r.lm_loss,
                r.grad_norm);
  }
  // The tests run this program and rely on the exit status: the loss must fall.
  return last < first ? 0 : 1;
}
