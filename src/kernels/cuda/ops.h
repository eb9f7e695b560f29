// Host-callable CUDA twins of the CPU kernels in kernels/*.h (all but attention and
// GEMM): the same names and argument lists in namespace lattice::cuda, every pointer a
// device pointer. Each launches on the rank's compute stream (cuda::compute_stream())
// and returns without waiting, except sum_of_squares, any_non_finite and abs_max, which return a host
// value and so wait for their result. Results follow the CPU kernel's documented
// definition (accumulate-vs-write, padding, dropout masks from the same Philox stream);
// reductions run in a fixed order, so every result is the same from run to run.
// No CUDA type appears here: plain C++ includes this header.
#pragma once
#include <cstdint>

#include "core/philox.h"
#include "kernels/activation.h"
#include "kernels/cast.h"
#include "kernels/embedding.h"
#include "kernels/gated_delta_net.h"
#include "kernels/layernorm.h"
#include "kernels/mamba.h"
#include "kernels/optimizer.h"
#include "kernels/rope.h"

namespace lattice::cuda {

// ---- layernorm.h
void layernorm_forward(float* out, float* mean, float* rstd, const float* x, const float* w,
                       const float* b, int64_t N, int64_t C, float eps,
                       Normalization kind = Normalization::layernorm);
void layernorm_forward_bf16(uint16_t* out, float* mean, float* rstd, const float* x, const float* w,
                            const float* b, int64_t N, int64_t C, float eps,
                            Normalization kind = Normalization::layernorm);
void layernorm_backward(float* dx, float* dw, float* db, LayerNormDout dout, const float* x, const float* w,
                        const float* mean, const float* rstd, int64_t N, int64_t C, ResidualGradOut next = {},
                        Normalization kind = Normalization::layernorm);

// ---- activation.h
void gelu_forward(float* out, const float* x, int64_t n, GeluKind kind);
void gelu_backward(float* dx, const float* x, const float* dout, int64_t n, GeluKind kind,
                   Rounding round_dout = Rounding::none);
void bias_gelu_forward(float* pre, float* out, const float* y, const float* bias, int64_t N, int64_t C,
                       GeluKind kind, Rounding round_y);
void bias_gelu_forward_packed(uint16_t* out, const uint16_t* y, const float* bias, int64_t N, int64_t C,
                              GeluKind kind);
void bias_gelu_backward_packed(float* dx, const uint16_t* y, const float* bias, const float* dout, int64_t N,
                               int64_t C, GeluKind kind, Rounding round_dout = Rounding::none,
                               uint16_t* dx_bf16 = nullptr);
void bias_gelu_backward_packed_dbias(uint16_t* dx_bf16, float* dbias, const uint16_t* y, const float* bias,
                                     const uint16_t* dout, int64_t N, int64_t C, GeluKind kind);
void bias_gelu_backward_packed(float* dx, const uint16_t* y, const float* bias, const uint16_t* dout, int64_t N,
                               int64_t C, GeluKind kind, uint16_t* dx_bf16 = nullptr);
void bias_swiglu_forward(float* pre, float* out, const float* y, const float* bias, int64_t N, int64_t F,
                         Rounding round_y, const GluForm& glu = {});
void bias_swiglu_forward_packed(uint16_t* out, const uint16_t* y, const float* bias, int64_t N, int64_t F,
                                const GluForm& glu = {});
void swiglu_backward(float* dx, const float* pre, const float* dout, int64_t N, int64_t F, Rounding round_dout,
                     const GluForm& glu = {});
void bias_swiglu_backward_packed_dbias(uint16_t* dx_bf16, float* dbias, const uint16_t* y, const float* bias,
                                       const uint16_t* dout, int64_t N, int64_t F, const GluForm& glu = {});

// ---- dropout.h
void dropout_forward(float* out, const float* x, int64_t n, float p, const PhiloxStream& stream,
                     uint64_t first_index);
void dropout_backward(float* dx, const float* dout, int64_t n, float p,
                      const PhiloxStream& stream, uint64_t first_index);
void bias_dropout_add_forward(float* out, const float* residual, const float* y, const float* bias, int64_t N,
                              int64_t C, float p, const PhiloxStream& stream, uint64_t first_index,
                              Rounding round_y = Rounding::none);
void bias_dropout_add_forward(float* out, const float* residual, const uint16_t* y, const float* bias, int64_t N,
                              int64_t C, float p, const PhiloxStream& stream, uint64_t first_index);
void bias_dropout_add_layernorm_forward(float* out, const float* residual, const float* y, const float* bias,
                                        int64_t N, int64_t C, float p, const PhiloxStream& stream,
                                        uint64_t first_index, Rounding round_y, const LayerNormOut& ln);
void bias_dropout_add_layernorm_forward(float* out, const float* residual, const uint16_t* y, const float* bias,
                                        int64_t N, int64_t C, float p, const PhiloxStream& stream,
                                        uint64_t first_index, const LayerNormOut& ln);
void dropout_backward_bias_cast_bf16(float* dbias, uint16_t* dx_bf16, const float* dout, int64_t N, int64_t C,
                                     float p, const PhiloxStream& stream, uint64_t first_index);
void input_jitter_forward(float* out, const float* x, int64_t n, float eps, const PhiloxStream& stream,
                          uint64_t first_index);
void input_jitter_backward(float* dx, const float* dout, int64_t n, float eps, const PhiloxStream& stream,
                           uint64_t first_index);

// ---- elementwise.h
void add_forward(float* out, const float* a, const float* b, int64_t n);
void accumulate(float* y, const float* x, int64_t n);
void bias_add(float* out, const float* bias, int64_t N, int64_t C, Rounding round_out = Rounding::none);
void bias_backward(float* dbias, const float* dout, int64_t N, int64_t C);
void bias_backward_cast_bf16(float* dbias, uint16_t* dout_bf16, const float* dout, int64_t N, int64_t C);
void scale_inplace(float* x, float s, int64_t n);
void copy_head_blocks(float* dst, int64_t dst_row, int64_t dst_head, const float* src, int64_t src_row,
                      int64_t src_head, int64_t N, int64_t H, int64_t len, float scale = 1.0f);

// ---- embedding.h
void embedding_forward(float* out, const int32_t* tokens, const int32_t* positions,
                       const float* wte, const float* wpe, int64_t N, int64_t C);
void vocab_parallel_embedding_forward(float* out, const int32_t* tokens, const float* wte_local,
                                      int64_t vocab_begin, int64_t Vl, int64_t N, int64_t C);
void position_embedding_add(float* out, const int32_t* positions, const float* wpe, int64_t N,
                            int64_t C);
void embedding_backward(float* dwte, float* dwpe, const float* dout, const int32_t* tokens,
                        const int32_t* positions, int64_t N, int64_t C, int64_t vocab_begin = 0,
                        int64_t Vl = -1, const EmbeddingRowGroups& groups = {});

// ---- cross_entropy.h
// The targets live on the device, so they are not checked on the host as the CPU kernel
// does: a row whose target is outside [0, V) gets a NaN loss (and no -scale term in its
// gradient) instead of an error, and nothing is read out of bounds.
void cross_entropy_forward(float* losses, const float* logits, const int32_t* targets, int64_t N,
                           int64_t V, int64_t Vp);
void cross_entropy_forward_backward(float* logits_to_dlogits, float* losses,
                                    const int32_t* targets, const float* loss_mask,
                                    float grad_scale, int64_t N, int64_t V, int64_t Vp);
void vocab_parallel_ce_max(float* row_max, const float* logits, int64_t N, int64_t valid, int64_t Vl,
                           Rounding round_logits = Rounding::none);
void vocab_parallel_ce_partials(double* stats, float* logits, const float* row_max,
                                const int32_t* targets, int64_t vocab_begin, int64_t N,
                                int64_t valid, int64_t Vl, bool store_exp,
                                Rounding round_logits = Rounding::none);
void vocab_parallel_ce_loss(float* losses, const double* stats, const float* row_max, int64_t N);
void vocab_parallel_ce_max_bf16(float* row_max, const uint16_t* logits, int64_t N, int64_t valid, int64_t Vl);
void vocab_parallel_ce_partials_bf16(double* stats, const uint16_t* logits, const float* row_max,
                                     const int32_t* targets, int64_t vocab_begin, int64_t N, int64_t valid,
                                     int64_t Vl);
void vocab_parallel_ce_backward_bf16(uint16_t* logits_to_dlogits, const float* row_max, const double* stats,
                                     const int32_t* targets, const float* loss_mask, float grad_scale,
                                     int64_t vocab_begin, int64_t N, int64_t valid, int64_t Vl);
void vocab_parallel_ce_fused(float* losses, float* logits_to_dlogits, float* row_max, double* stats,
                             const int32_t* targets, bool backward, const float* loss_mask, float grad_scale,
                             int64_t N, int64_t valid, int64_t Vl, Rounding round_logits = Rounding::none);
void vocab_parallel_ce_fused_bf16(float* losses, uint16_t* logits_to_dlogits, float* row_max, double* stats,
                                  const int32_t* targets, bool backward, const float* loss_mask, float grad_scale,
                                  int64_t N, int64_t valid, int64_t Vl);
void vocab_parallel_ce_backward(float* exp_to_dlogits, const double* stats, const int32_t* targets,
                                const float* loss_mask, float grad_scale, int64_t vocab_begin,
                                int64_t N, int64_t valid, int64_t Vl);

// ---- optimizer.h
void adamw_update(float* p, const float* g, float* m, float* v, int64_t n, float lr, float beta1,
                  float beta2, float eps, float weight_decay, int64_t step, float grad_scale = 1.0f);
void adamw_update_ranges(float* p, const float* g, float* m, float* v, const AdamwRange* ranges, int64_t count,
                         float beta1, float beta2, float eps, int64_t step, float grad_scale = 1.0f);
void adamw_update_ranges(float* p, const float* g, const AdamwMoments& moments, const AdamwRange* ranges,
                         int64_t count, float beta1, float beta2, float eps, int64_t step, float grad_scale = 1.0f);
void sgd_update(float* p, const float* g, float* momentum_buf, int64_t n, float lr,
                float momentum, float weight_decay, bool first_step, float grad_scale = 1.0f);
// Waits for the result (a host double).
double sum_of_squares(const float* x, int64_t n);
// Waits for the result (a host bool).
bool any_non_finite(const float* x, int64_t n);
// Waits for the result (a host count).
int64_t count_zeros(const float* x, int64_t n);

// ---- rope.h
void rope_forward(float* qkv, const RopeTable& table, int64_t N, int64_t T, int64_t pos0, const QkvLayout& layout);
void rope_backward(float* dqkv, const RopeTable& table, int64_t N, int64_t T, const QkvLayout& layout);

// ---- muon.h
void muon_momentum(float* m, float* u, const float* g, int64_t n, float one_minus_beta, float beta, bool nesterov,
                   float grad_scale);
void divide_inplace(float* x, float denom, int64_t n);
void muon_apply(float* p, const float* o, int64_t n, float decay, float scale, float extra, float step);

// ---- attention_gate.h
void attention_output_gate_forward(float* y, const float* o, const float* qkv, int64_t N, const QkvLayout& layout);
void attention_output_gate_backward(float* d_o, float* dqkv, const float* dy, const float* o, const float* qkv,
                                    int64_t N, const QkvLayout& layout);

// ---- gated_delta_net.h
void gdn_conv_forward(float* u, const float* x, const float* w, const GdnShape& s);
void gdn_conv_backward(float* dx, float* dw, const float* du, const float* x, const float* w, const GdnShape& s);
void gdn_gates_forward(float* q, float* k, float* g, float* beta, const float* u, const float* x, const float* A_log,
                       const float* dt_bias, const GdnShape& s);
void gdn_gates_backward(float* du, float* dx, float* dA_log, float* d_dt_bias, const float* dq, const float* dk,
                        const float* dg, const float* dbeta, const float* u, const float* x, const float* A_log,
                        const float* dt_bias, const GdnShape& s);
void gdn_delta_rule_forward(float* o, float* state, float* checkpoints, const float* q, const float* k, const float* u,
                            const float* g, const float* beta, const GdnShape& s, bool from_state = false);
void gdn_delta_rule_backward(float* dq_v, float* dk_v, float* du, float* dg, float* dbeta, float* work,
                             const float* d_o, const float* checkpoints, const float* q, const float* k, const float* u,
                             const float* g, const float* beta, const GdnShape& s);
void gdn_sum_key_heads(float* d, const float* d_v, const GdnShape& s);
void gdn_output_gate_forward(float* y, const float* n, const float* x, const GdnShape& s);
void gdn_output_gate_backward(float* dn, float* dx, const float* dy, const float* n, const float* x,
                              const GdnShape& s);

// ---- mamba.h
void mamba_conv_forward(float* u, const float* x, const float* w, const float* bias, const MambaShape& s);
void mamba_conv_backward(float* dx, float* dw, float* dbias, const float* du, const float* x, const float* w,
                         const float* bias, const MambaShape& s);
void mamba_dt_forward(float* dt, const float* x, const float* dt_bias, const MambaShape& s);
void mamba_dt_backward(float* dx, float* d_dt_bias, const float* d_dt, const float* x, const float* dt_bias,
                       const MambaShape& s);
void mamba_scan_forward(float* y, float* checkpoints, const float* u, const float* dt, const float* A_log,
                        const float* D, const MambaShape& s, float* state = nullptr);
void mamba_scan_backward(float* du, float* d_dt, float* dA_log, float* dD, float* work, const float* dy,
                         const float* checkpoints, const float* u, const float* dt, const float* A_log, const float* D,
                         const MambaShape& s);
void mamba_gated_norm_forward(float* out, float* rstd, const float* y, const float* x, const float* w,
                              const MambaShape& s);
void mamba_gated_norm_backward(float* dy, float* dx, float* dw, const float* dout, const float* y, const float* x,
                               const float* w, const float* rstd, const MambaShape& s);

// ---- moe.h
void moe_gather_rows(float* xe, const float* x, const int32_t* rows, int64_t S, int64_t C, const float* w = nullptr);
void moe_combine(float* out, const float* ye, const int32_t* slot_of, const float* w, int64_t N, int64_t k, int64_t C,
                 bool accumulate);
void moe_combine_backward(float* d_ye, float* d_w, const float* dout, const float* ye, const float* w,
                          const int32_t* rows, int64_t S, int64_t C);

// ---- cast.h
void cast_fp32_to_bf16(uint16_t* out, const float* in, int64_t n);
void cast_bf16_to_fp32(float* out, const uint16_t* in, int64_t n);
void round_to_bf16(float* out, const float* in, int64_t n);
void round_to_fp16(float* out, const float* in, int64_t n);
void quantize_fp8_to_bf16(uint16_t* out, const float* in, int64_t n, float scale, Fp8Format f);
// Waits for the result (a host float).
float abs_max(const float* in, int64_t n);
void quantize_fp8_blocks(uint16_t* out, const float* in, int64_t rows, int64_t cols, Fp8Blocks blocks, Fp8Format f);

}  // namespace lattice::cuda
