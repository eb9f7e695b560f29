// Residual adds, bias, scaling: the small memory-bound ops.
#pragma once
#include <cstdint>

#include "kernels/cast.h"

namespace lattice {

// out = a + b   (out may alias a or b)
void add_forward(float* out, const float* a, const float* b, int64_t n);

// y[i] += x[i]
void accumulate(float* y, const float* x, int64_t n);

// out[n,c] = round(out[n,c]) + bias[c]        out: [N,C]
// round: a GEMM result's rounding (GemmPolicy::result_rounding), fused into the same pass.
void bias_add(float* out, const float* bias, int64_t N, int64_t C, Rounding round_out = Rounding::none);

// dbias[c] += sum_n dout[n,c]   (deterministic)
void bias_backward(float* dbias, const float* dout, int64_t N, int64_t C);
// bias_backward (its bits) that also writes dout's bf16 cast, dout_bf16 [N, C]: a linear
// layer's output gradient as its GEMMs read it, with one read of dout for both.
void bias_backward_cast_bf16(float* dbias, uint16_t* dout_bf16, const float* dout, int64_t N, int64_t C);

// x *= s
void scale_inplace(float* x, float s, int64_t n);

// Blocks of `len` floats, N rows of H heads: block (n, h) of dst starts at dst + n dst_row + h dst_head,
// of src at src + n src_row + h src_head. dst block (n, h) = scale x src block (n, h), or zeros when
// src is null. With dst_head 0 a row's H source blocks are summed (heads in order, then times scale)
// into its one block. Strided copies between a fused layout and its parts (the multi-latent
// attention's query, key and value parts, model/multi_latent_attention.h).
void copy_head_blocks(float* dst, int64_t dst_row, int64_t dst_head, const float* src, int64_t src_row,
                      int64_t src_head, int64_t N, int64_t H, int64_t len, float scale = 1.0f);

}  // namespace lattice
