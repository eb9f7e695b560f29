// GEMM facade on the GPU (cuBLASLt): the same row-major products as blas/gemm.h, with
// DEVICE pointers, launched asynchronously on the rank's compute stream
// (cuda::compute_stream()). No CUDA type appears here, so g++ code can call it.
//
// Numerics: gemm_f32 computes in true fp32 (CUBLAS_COMPUTE_32F, never TF32), so it
// matches the CPU gemm_f32 up to summation order (~1e-5 relative to sum |a b|). The
// bf16 forms take A and B as bf16 bit patterns (kernels/cast.h): every product of two
// bf16 values is exact in fp32 and the products are accumulated in fp32.
//
// One cuBLASLt handle and one 32 MiB workspace per process, made on first use; the
// matmul descriptors and the chosen algorithm are cached per shape (and pointer
// alignment), so repeated shapes do no heuristic query. Errors name the GEMM shape and
// the cuBLAS status.
#pragma once
#include <cstdint>

#include "blas/gemm.h"

namespace lattice::cuda {

// C[M,N] = alpha * op(A)[M,K] * op(B)[K,N] + beta * C   (as lattice::gemm_f32)
void gemm_f32(Trans ta, Trans tb, int64_t M, int64_t N, int64_t K, float alpha, const float* A,
              int64_t lda, const float* B, int64_t ldb, float beta, float* C, int64_t ldc);

// The same with A, B in bf16 and C in fp32 (as lattice::gemm_bf16).
void gemm_bf16(Trans ta, Trans tb, int64_t M, int64_t N, int64_t K, float alpha, const uint16_t* A,
               int64_t lda, const uint16_t* B, int64_t ldb, float beta, float* C, int64_t ldc);

// C[M,N] (bf16) = bf16(alpha * op(A) op(B) + beta * C): A, B and C in bf16, fp32
// accumulation, one rounding to bf16 at the end (C is read as bf16 when beta != 0).
void gemm_bf16_out(Trans ta, Trans tb, int64_t M, int64_t N, int64_t K, float alpha, const uint16_t* A,
                   int64_t lda, const uint16_t* B, int64_t ldb, float beta, uint16_t* C, int64_t ldc);

// C[M,N] = op(A) op(B) + bias[N]   (bias, fp32, broadcast over the M rows; C written).
void gemm_bf16_bias(Trans ta, Trans tb, int64_t M, int64_t N, int64_t K, const uint16_t* A, int64_t lda,
                    const uint16_t* B, int64_t ldb, const float* bias, float* C, int64_t ldc);

// pre[M,N] = op(A) op(B) + bias[N];  C[M,N] = gelu_tanh(pre)
//   gelu_tanh(x) = 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))   (GeluKind::tanh)
// The fused cuBLASLt epilogue (GELU_AUX_BIAS) implements the tanh form only; it stores
// `pre` for the backward pass. It needs ld_pre divisible by 8; otherwise (or when no
// fused algorithm exists for the shape) a plain GEMM is followed by a separate bias+GELU
// kernel with the same definition. The erf form (Megatron's default GELU) is not a
// cuBLASLt epilogue: callers use gemm_bf16_bias and the separate GELU kernel.
void gemm_bf16_bias_gelu(Trans ta, Trans tb, int64_t M, int64_t N, int64_t K, const uint16_t* A,
                         int64_t lda, const uint16_t* B, int64_t ldb, const float* bias, float* C,
                         int64_t ldc, float* pre, int64_t ld_pre);

// Cached matmul plans (tests: the hot loop must not grow this once shapes repeat).
int64_t gemm_plan_cache_size();
// Calls that ran the unfused epilogue kernel instead of a fused one (tests, logs).
int64_t gemm_epilogue_fallbacks();

}  // namespace lattice::cuda
