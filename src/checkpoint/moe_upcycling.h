// Megatron's MoE upcycling (--moe-use-upcycling; Megatron-Core's upcycling_utils, after "Upcycling
// Large Language Models into Mixture of Experts", arXiv 2410.07524): a mixture-of-experts model
// whose weights come from a dense model's checkpoint. Every tensor the two share by name is the
// dense one; in each MoE layer, with granularity g = dense --ffn-hidden-size / --moe-ffn-hidden-size,
// expert e is piece e % g of the dense MLP (fc1's rows j Fe .. (j + 1) Fe of each GLU half, fc2's
// columns likewise, fc1's bias as its rows, fc2's bias whole), its two weights and fc1's bias times
//   s = a^(1/3) with a gated linear unit or squared ReLU, a^(1/2) otherwise, where
//   a = (E / g) g^2 / topk with --moe-router-pre-softmax, else g;
// the router's row i is row i / g of its own initial values (so the g pieces of one dense MLP share
// a row), and the router's bias, the expert bias and the shared experts keep their initial values.
// With g = 1 and the top-k probabilities normalized (the default softmax after top-k) every expert is
// the dense MLP and the upcycled model computes the dense model's function.
#pragma once
#include <string>

#include "model/gpt_model.h"

namespace lattice {

// The configuration a dense checkpoint for `moe` must have: moe's, without its experts.
TransformerConfig dense_config_of(const TransformerConfig& moe);

// Fills this rank's parameters of `moe`, initialized already (its routers' initial values are used),
// from the dense checkpoint at `dir` (its latest iteration, or an iteration directory). Every rank
// reads its own boxes, so any tensor-, expert- and pipeline-parallel layout upcycles any checkpoint.
// granularity: --moe-upcycling-granularity (g must be it). A checkpoint whose model is not moe's
// without experts, or a configuration upcycling cannot map, is a one-line error naming the flag or
// the field. Returns g.
int64_t upcycle_from_dense_checkpoint(const std::string& dir, GPTModel& moe, int64_t granularity = 1);

}  // namespace lattice
