// A mixture-of-experts MLP (Megatron-Core's MoELayer with its TopKRouter and SequentialMLP;
// --num-experts E, --moe-router-topk k): in place of the dense MLP, a router linear layer
// [E, C] scores every token, each token goes to its k best experts, and its output is the sum
// of those experts' MLP outputs weighted by the router's probabilities.
//
// Routing (dropless; Megatron's default softmax after the top-k):
//   logits = x Wr^T [N, E];  idx = the k largest logits of a token (ties: the lower expert; with
//   --moe-router-num-groups among the --moe-router-group-topk best groups of experts only),
//   gate = softmax over those k logits (fp32)  (--moe-router-pre-softmax: softmax over all E
//   logits at idx, not renormalized), times --moe-router-topk-scaling-factor;
//   y[t] = sum_j gate[t, j] expert_idx[t,j](x[t]).
// --moe-router-score-function sigmoid: s = sigmoid(logits); idx = the k largest of s (+ the expert
// bias); gate = s at idx over their sum (+1e-20; s itself when k = 1), times the scaling factor.
// Each expert is the model's MLP (fc1 [F1, C], GELU or a gated unit, fc2 [C, F]; F = the expert's
// ffn size, --moe-ffn-hidden-size), with biases b1 [F1], b2 [C] and the router's br [E] when the
// model has linear biases (Megatron's add_bias_linear; GPT-OSS's): logits = x Wr^T + br, and a
// slot's output gate (W2 act(W1 x + b1) + b2), the bias weighted with the rest. The load-balancing loss (--moe-aux-loss-coeff a,
// Megatron's switch_load_balancing_loss_func) a E / (k N^2) sum_e (sum_t p[t, e]) count_e, with
// p the softmax over all E logits and count_e the tokens whose k largest p include e (their routed
// experts, but for the expert bias, the group limit and any drop), adds its gradient
// to the router's (scaled as the micro-batch's loss gradient is); it is reported, not added to
// the language-model loss. With sigmoid scores p is sigmoid(l) normalized over all E. seq_aux_loss
// (MoeShape::seq_aux_loss_coeff, aux_group = T): the same formula over each sequence's T rows
// (N = T), averaged. global_aux_loss (Megatron's global-batch balancing; global_aux_loss_coeff g):
// g E / (k Nt^2) sum_e (sum_t p[t, e]) avg_e, with avg_e the counts of every data- and
// context-parallel rank's micro-batches of the step so far, summed over the ranks and averaged over
// the micro-batches (moe_global_balance), and Nt the tokens of one micro-batch on all those ranks.
// The losses of a list of types add (Megatron's list of types, one coefficient each). The
// router z-loss (--moe-z-loss-coeff z): z mean_t lse_t^2, lse_t = logsumexp(logits_t), its gradient
// 2 z lse_t softmax(logits_t) / N to the logits (scaled as the load-balancing loss's).
//
// The routing itself (top-k, softmax, the permutation) runs on the host over the [N, E]
// logits (copied from the GPU: E values per token); the tokens' rows move on the device
// (kernels/moe.h). The S = N k slots are grouped by expert, token order within an expert, so
// each expert's GEMMs read one contiguous block of rows. With a capacity (MoeShape::capacity_factor)
// an expert keeps at most ceil(N k / E f) of its tokens (the largest gates, or the first tokens) and
// the others are dropped: no slot (slot_of -1), nothing added to the token's output, no gradient
// to their gates; the load-balancing loss counts the tokens before the drop (Megatron's).
//
// Shared experts (--moe-shared-expert-intermediate-size Fs; Megatron-Core's SharedExpertMLP):
// one more MLP (fc1 [Fs1, C], fc2 [C, Fs], no biases) on every token, its output added to the
// routed ones: y[t] += s[t] shared(x[t]), s[t] = sigmoid(x[t] . g) with --moe-shared-expert-gate
// (g [1, C]; the sigmoid on the host with the routing), else 1.
//
// Expert parallelism (--expert-model-parallel-size P; MoeWeights::ep): each of the P ranks of the
// expert-parallel group holds El = E / P experts (rank r experts r El .. (r + 1) El - 1) and routes
// its own tokens over all E. The slots, grouped by expert, are grouped by rank too: an all-to-all
// sends each rank the rows of its experts (Megatron's MoEAlltoAllTokenDispatcher), which computes
// them grouped by local expert (source ranks in order within one) and sends the outputs back to
// be combined where the tokens live. The backward moves the output gradients and the input
// gradients the same two ways. Everything else (routing, losses, gates, shared experts) stays
// with the tokens.
#pragma once
#include <cstdint>
#include <memory>
#include <vector>

#include "core/philox.h"
#include "core/storage.h"

#include "kernels/activation.h"
#include "model/linear.h"
#include "model/transformer_config.h"

namespace lattice {

class Comm;

struct MoeShape {
  int64_t E = 0, k = 0, C = 0, F = 0;  // experts, experts per token, hidden size, expert ffn size
  bool glu = false;          // a gated linear unit (--swiglu, --quick-geglu) of form glu_form
  GluForm glu_form;
  GeluKind gelu = GeluKind::erf;
  float aux_loss_coeff = 0.0f;         // aux_loss: the micro-batch's load-balancing loss
  float seq_aux_loss_coeff = 0.0f;     // seq_aux_loss: each sequence's (aux_group rows), averaged
  float global_aux_loss_coeff = 0.0f;  // global_aux_loss (MoeState::global_counts, set by the caller)
  float z_loss_coeff = 0.0f;  // --moe-z-loss-coeff
  bool pre_softmax = false;  // --moe-router-pre-softmax: gates from the softmax over all E logits
  float scale = 1.0f;        // --moe-router-topk-scaling-factor
  int64_t aux_group = 0;     // seq_aux_loss: the rows of a sequence (0: no per-sequence loss)
  // seq_aux_loss over a part of the micro-batch's aux_sequences x aux_group rows (whole experts: a
  // rank's sequence-parallel rows): the part's first row among them and the ranks splitting them (a
  // sequence's tokens on the statistics' ranks are aux_group x those ranks / aux_split). Defaults: the
  // rows are whole sequences (aux_sequences N / aux_group).
  int64_t aux_row0 = 0, aux_sequences = 0, aux_split = 1;
  double capacity_factor = 0;  // --moe-expert-capacity-factor (0: dropless)
  bool drop_by_position = false;  // --moe-token-drop-policy position (else probs)
  int64_t groups = 0, group_topk = 0;  // --moe-router-num-groups, --moe-router-group-topk (0: none)
  bool sigmoid = false;      // --moe-router-score-function sigmoid
  bool sinkhorn = false;     // a training forward of --moe-router-load-balancing-type sinkhorn: the choice by the
                             // top k of the Sinkhorn-normalized logits (the gates as pre_softmax, or sigmoid)
  bool expert_bias = false;  // --moe-router-enable-expert-bias (MoeWeights::expert_bias)
  int64_t Fs = 0;            // the shared experts' ffn size (0: none)
  int64_t ep = 1;            // expert-parallel ranks: > 1, the experts' fc1 outputs and activations live with
                             // the rows they receive (MoeState::ep_rows), not in the carved buffers
  bool shared_gate = false;  // --moe-shared-expert-gate
  // Whole experts under tensor parallelism (--expert-tensor-parallel-size 1; Fs > 0): the routed experts
  // run on a rank's own rows, the shared experts (split over the tensor-parallel ranks, as the dense MLP)
  // on every token's row. moe_forward/moe_backward then leave them out, and their buffers out of the
  // carvings; the caller runs moe_shared_forward/moe_shared_backward over the N rows with buffers
  // carved by moe_shared_state_carve and moe_shared_scratch_carve.
  bool shared_apart = false;
  // --moe-apply-probs-on-input (k = 1): the expert reads gate x (moe_gather_rows with weights)
  // and its output is summed unweighted; the gate's gradient is dot(x, d(gate x)).
  bool probs_on_input = false;
  // --recompute-modules moe_act: the experts' activation is not kept; the backward makes it again
  // from their fc1 outputs (MoeState::act then points into a buffer the caller shares between the
  // layers; under expert parallelism it lives in the dispatch's scratch).
  bool recompute_act = false;
  // --recompute-modules shared_experts: the shared experts' fc1 outputs, activation, outputs and gate
  // are not kept in the state; the backward computes them again (MoeState::hs, acts, ys, sgate then
  // point into a buffer the caller shares between the layers: moe_shared_experts_carve).
  bool recompute_shared = false;
  // --moe-input-jitter-eps (a training forward's; 0: none): the router reads x times noise uniform in
  // [1 - eps, 1 + eps) per element (Switch Transformer's; MoeWeights::jitter_stream, the rows'
  // indices in MoeWeights::jitter_runs), kept as MoeState::xj for its weight gradient; the experts
  // and shared experts read x. The input gradient through the router is the noise times d(xj).
  float input_jitter_eps = 0.0f;
  // --moe-router-force-load-balancing (Megatron's benchmarking switch, the trainer's forwards): the
  // routing reads standard normal draws in place of the router's logits (MoeWeights::balance_stream,
  // element token E + e), so the experts get near even loads whatever the weights; the logits'
  // gradient passes to the router unchanged (Megatron's straight-through RandomSTE).
  bool force_balance = false;
  // --moe-latent-size (0: none): the routed experts' rows are L wide, xl = x Wl1^T [N, L] gathered to them and
  // their weighted sum yl [N, L] projected back, y = yl Wl2^T (MoeWeights::latent_fc1, latent_fc2); the router
  // and the shared experts read x itself.
  int64_t L = 0;
  int64_t Ce() const { return L > 0 ? L : C; }    // the routed experts' input and output width
  int64_t F1() const { return glu ? 2 * F : F; }  // fc1's outputs
  int64_t Fs1() const { return glu ? 2 * Fs : Fs; }
};

// A model's MoE layer shape (num_experts, moe_router_topk, moe_ffn_hidden_size, ...) on one of tp
// tensor-parallel ranks: each expert's ffn split over them (F = moe_ffn_hidden_size / tp; whole with
// --expert-tensor-parallel-size 1), the shared experts' always (Fs = moe_shared_expert_intermediate_size
// / tp); ep: the expert-parallel size.
MoeShape moe_shape(const TransformerConfig& c, int64_t tp = 1, int64_t ep = 1);

// Expert parallelism: the group, and device scratch its dispatch shares between the layers (one
// forward or backward runs at a time).
struct MoeExpertParallel {
  Comm* comm = nullptr;                // the expert-parallel group (null or one rank: none)
  DeviceArray<float>* scratch = nullptr;
  int size() const;
  int rank() const;
};

// The layer's weights, with their GEMM sites (model/linear.h), and their gradients (accumulated).
struct MoeWeights {
  const float* router = nullptr;             // [E, C]
  const float* router_bias = nullptr;        // [E] (biases; null: none)
  const float* expert_bias = nullptr;        // [E] added to the scores for the choice (expert_bias)
  std::vector<const float*> fc1, fc2;        // per local expert [F1, Ce], [Ce, F] (E, or E / P under ep)
  std::vector<const float*> fc1_bias, fc2_bias;  // per local expert [F1], [C] (empty: none)
  const float* latent_fc1 = nullptr;         // [L, C] fc1_latent_proj (L > 0)
  const float* latent_fc2 = nullptr;         // [C, L] fc2_latent_proj
  GemmSite latent_fc1_site, latent_fc2_site;
  // Tensor parallelism: the fc2 biases are added on one rank of the group (the others' outputs are
  // partial sums the caller reduces); their gradients are made on every rank.
  bool add_fc2_bias = true;
  MoeExpertParallel ep;
  // The group whose ranks route the other rows of the micro-batch's sequences: the context-parallel
  // group, or with whole experts (--expert-tensor-parallel-size 1) the tensor x context-parallel one
  // (null: none). The routing statistics count all of their tokens (the load-balancing loss's expert
  // counts summed over it, its and the z-loss's normalization by every rank's tokens), as Megatron's
  // over tp_cp: each rank's loss is its tokens' share, the shares summing to the whole micro-batch's.
  Comm* token_group = nullptr;
  GemmSite router_site;
  std::vector<GemmSite> fc1_site, fc2_site;
  const float* shared_fc1 = nullptr;         // [Fs1, C] the shared experts (Fs > 0)
  const float* shared_fc2 = nullptr;         // [C, Fs]
  const float* shared_gate = nullptr;        // [1, C] (shared_gate)
  GemmSite shared_fc1_site, shared_fc2_site, shared_gate_site;
  // The rows' tokens for the draws of input_jitter_eps and force_balance: rows [row, row + rows) are
  // the micro-batch's tokens token, token + 1, ... in one process (so the draws are the same in every
  // layout); the runs cover rows [0, N) in order. Row t's jitter takes the elements token(t) C + c of
  // jitter_stream, its forced logits the elements token(t) E + e of balance_stream.
  struct TokenRun {
    int64_t row, rows, token;
  };
  std::vector<TokenRun> token_runs;
  PhiloxStream jitter_stream{}, balance_stream{};
};
struct MoeGrads {
  float* router = nullptr;
  float* router_bias = nullptr;
  std::vector<float*> fc1, fc2;
  std::vector<float*> fc1_bias, fc2_bias;
  float* shared_fc1 = nullptr;
  float* shared_fc2 = nullptr;
  float* shared_gate = nullptr;
  float* latent_fc1 = nullptr;
  float* latent_fc2 = nullptr;
};

// What the forward keeps for the backward: device buffers for N tokens (moe_state_floats of
// them, carved by moe_state_carve) and the routing on the host.
struct MoeState {
  float* logits = nullptr;    // [N, E] the router's logits
  int32_t* rows = nullptr;    // [S] the token of each slot
  int32_t* slot_of = nullptr; // [N, k] the slot of each token's j-th expert (-1: dropped)
  float* gate = nullptr;      // [S] the router probability of each slot
  float* xe = nullptr;        // [S, Ce] the experts' inputs
  float* h = nullptr;         // [S, F1] fc1's outputs (null under expert parallelism: in ep_rows)
  float* act = nullptr;       // [S, F] the activation (fc2's input; idem)
  float* ye = nullptr;        // [S, Ce] fc2's outputs
  float* xl = nullptr;        // [N, L] the latent input x Wl1^T (L > 0)
  float* yl = nullptr;        // [N, L] the experts' weighted sum in the latent space
  float* hs = nullptr;        // [N, Fs1] the shared experts' fc1 outputs (Fs > 0)
  float* acts = nullptr;      // [N, Fs] their activation
  float* ys = nullptr;        // [N, C] their fc2 outputs
  float* sgate = nullptr;     // [N] their gate sigmoid(x . g) (shared_gate)
  int32_t* ident = nullptr;   // [N] 0, 1, ..., N - 1 (the shared output's combine)
  float* xj = nullptr;        // [N, C] the router's jittered input (carved when the shape's input_jitter_eps > 0)
  int64_t ident_rows = 0;     // rows of ident filled (uploaded once per carve)
  // host
  std::vector<float> logits_host;  // [N, E] the logits (the routing's; the z-loss's backward)
  std::vector<int64_t> offsets;    // [E + 1] each expert's first slot (offsets[E]: the slots kept)
  std::vector<int32_t> choice;     // [N, k] the experts chosen, best first
  std::vector<float> gate_host;    // [N, k] their gates (probabilities times the scaling factor)
  std::vector<int32_t> slot_of_host;  // [N, k] slot_of
  std::vector<float> scores;       // [N, E] softmax (sigmoid: normalized sigmoid) over every expert
  std::vector<float> sig;          // [N, E] sigmoid(logits) (sigmoid scores)
  std::vector<double> counts;       // [E] tokens per expert (their plain top k) over the micro-batch (every CP rank's)
  std::vector<double> group_counts;  // [G, E] the same per sequence (seq_aux_loss: aux_group > 0)
  std::vector<double> local_counts;  // [E] counts of this rank's tokens alone
  std::vector<double> prob_sums;     // [E] sum_t p[t, e] over this rank's tokens
  double balance = 0.0;            // E / (k N^2) sum_e (sum_t p[t, e]) count_e of the last forward (1: even)
  double seq_balance = 0.0;        // the same per sequence, averaged over the sequences (aux_group > 0)
  double aux_loss = 0.0;           // balance and seq_balance times their coefficients, summed
  // global_aux_loss: the averaged counts [E] of the step's micro-batches so far and the tokens Nt of
  // one micro-batch on every rank (moe_global_balance's; the caller points the backward at them).
  const double* global_counts = nullptr;
  double global_tokens = 0.0;
  std::vector<float> lse;          // [N] logsumexp of each token's logits (the z-loss)
  double z = 0.0;                  // mean_t lse_t^2 of the last forward (the z-loss over its coefficient)
  int64_t stat_ranks = 1;          // the context-parallel ranks whose tokens the statistics count
  // Expert parallelism: the R rows this rank's experts got (grouped by local expert, source rank
  // in order within one), kept for the backward.
  DeviceArray<float> ep_rows;      // [R, Ce] the experts' inputs, [R, F1] fc1's outputs, [R, F] the activation
  DeviceArray<int32_t> ep_perm;    // [2R]: the received row each expert-order row is, then the expert-order
                                   //        row each received row is (moe_gather_rows' indices both ways)
  std::vector<int64_t> ep_send, ep_recv;  // [P] rows sent to / received from each rank
  std::vector<int64_t> ep_offsets;        // [El + 1] each local expert's first row
};

// Floats of device memory MoeState needs for N tokens, and the carving of such a buffer.
int64_t moe_state_floats(int64_t N, const MoeShape& s);
void moe_state_carve(MoeState& st, float* buf, int64_t N, const MoeShape& s);
// The shared experts' buffers (hs, acts, ys, sgate) alone: their floats for N tokens and their carving
// (--recompute-modules shared_experts: one such buffer serves every layer's state).
int64_t moe_shared_experts_floats(int64_t N, const MoeShape& s);
void moe_shared_experts_carve(MoeState& st, float* buf, int64_t N, const MoeShape& s);

// The shared experts' part of MoeState for N tokens (their buffers, unless recompute_shared, and the
// identity rows): in moe_state_floats unless shared_apart, which carves it apart with these.
int64_t moe_shared_state_floats(int64_t N, const MoeShape& s);
void moe_shared_state_carve(MoeState& st, float* buf, int64_t N, const MoeShape& s);

// Scratch of the backward: floats for N tokens, and its carving.
struct MoeScratch {
  float* d_ye = nullptr;      // [S, Ce] (then the experts' input gradients)
  float* d_yl = nullptr;      // [N, L] yl's gradient, then xl's (L > 0)
  float* d_act = nullptr;     // [S, F]  (null under expert parallelism: in the dispatch's scratch)
  float* d_h = nullptr;       // [S, F1] (idem)
  float* d_gate = nullptr;    // [S]
  float* d_logits = nullptr;  // [N, E]
  float* d_ys = nullptr;      // [N, C] the shared experts' (Fs > 0)
  float* d_acts = nullptr;    // [N, Fs]
  float* d_hs = nullptr;      // [N, Fs1]
  float* d_sgate = nullptr;   // [N] (shared_gate): the gate's, then its logit's gradient
};
int64_t moe_scratch_floats(int64_t N, const MoeShape& s);
void moe_scratch_carve(MoeScratch& sc, float* buf, int64_t N, const MoeShape& s);
// The shared experts' part of MoeScratch (d_ys, d_acts, d_hs, d_sgate), likewise.
int64_t moe_shared_scratch_floats(int64_t N, const MoeShape& s);
void moe_shared_scratch_carve(MoeScratch& sc, float* buf, int64_t N, const MoeShape& s);

// Megatron's sinkhorn() of logits [N, E] (fp32): c = exp(l); d0 [N] and d1 [E] start at 1 and are
// updated in turn, d0_t = 1 / (N (sum_e d1_e c_te + 1e-8)), d1_e = 1 / (E (sum_t d0_t c_te + 1e-8)),
// until the mean |change| of d1 is at most 1e-4; returns d1_e c_te d0_t, whose rows each sum to
// about 1/N and columns to 1/E.
std::vector<float> sinkhorn(const float* logits, int64_t N, int64_t E);

// The routing of host logits [N, E] into st's host fields and device index buffers (the
// exported pieces are separately testable); bias_host: the expert bias [E] (s.expert_bias); tokens: the
// group routing the micro-batch's other rows (MoeWeights::token_group; balance and z are then the whole
// group's, every rank's).
void moe_route(MoeState& st, const float* logits_host, int64_t N, const MoeShape& s,
               const float* bias_host = nullptr, Comm* tokens = nullptr);

// global_aux_loss's statistics of one MoE layer over a training step (Megatron's
// global_tokens_per_expert and ga_steps): the micro-batches' expert counts summed over the data- and
// context-parallel ranks, and the micro-batches counted. reset() after each step.
struct MoeGlobalBalance {
  std::vector<double> counts;  // [E]
  int64_t steps = 0;
  void reset() {
    counts.clear();
    steps = 0;
  }
};

// After a training forward's routing (st): this micro-batch's counts summed over the groups that hold
// other tokens (MoeWeights::token_group, then the data-parallel one; null or one rank: none) are
// added to g; avg [E] is then g's average over its micro-batches and tokens the micro-batch's tokens on
// every such rank (N times their count), for the backward (MoeState::global_counts, global_tokens).
// Returns the loss over its coefficient, E / (k tokens^2) sum_e (sum_t p[t, e]) avg_e with the
// probability sums of every rank's tokens: the same value on each rank.
double moe_global_balance(std::vector<double>& avg, double& tokens, const MoeState& st, MoeGlobalBalance& g,
                          int64_t N, const MoeShape& s, Comm* cp, Comm* dp);

// y [N, C] = the layer's output for x [N, C] (fp32 rows).
void moe_forward(float* y, const float* x, MoeState& st, const MoeWeights& w, int64_t N, const MoeShape& s);

// dx [N, C] = the input gradient (written) from dy [N, C]; g accumulates the weights' gradients.
// aux_grad_scale: the factor the micro-batch's loss gradient carries (its grad_scale).
//
// Tensor parallelism (Megatron's: each expert's fc1 column-parallel, fc2 row-parallel, the router
// replicated; every rank routes the same full rows the same way): y and dx are this rank's
// partial sums (the caller reduces them as a row-parallel output and a column-parallel input
// gradient), the gates' gradients are all-reduced over `tp` (the dot products of the partial
// outputs) before the router's backward, and the router's input gradient, the same on every
// rank, is added on the rank with router_input_grad only. The shared experts split as the dense
// MLP does; their gate, replicated, as the router.
void moe_backward(float* dx, const float* dy, const float* x, MoeState& st, const MoeWeights& w, MoeGrads& g,
                  const MoeScratch& sc, int64_t N, const MoeShape& s, float aux_grad_scale, Comm* tp = nullptr,
                  bool router_input_grad = true);

// shared_apart: the shared experts alone. y [N, C] += s[t] shared(x[t]) (this rank's partial sums under
// tensor parallelism); the backward accumulates their input gradient into dx [N, C] (the gate's on the
// gate_input_grad rank only), all-reducing the gate's gradient over tp, and their weights' into g.
void moe_shared_forward(float* y, const float* x, MoeState& st, const MoeWeights& w, int64_t N, const MoeShape& s);
void moe_shared_backward(float* dx, const float* dy, const float* x, MoeState& st, const MoeWeights& w, MoeGrads& g,
                         const MoeScratch& sc, int64_t N, const MoeShape& s, Comm* tp, bool gate_input_grad);

}  // namespace lattice
