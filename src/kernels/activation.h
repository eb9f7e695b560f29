// GELU: Megatron's default is the exact erf form; --openai-gelu selects the tanh form
// (HuggingFace's gelu_new).
#pragma once
#include <cstdint>

namespace lattice {

enum class GeluKind { erf, tanh };

// out[i] = gelu(x[i])     (out may alias x)
void gelu_forward(float* out, const float* x, int64_t n, GeluKind kind);

// dx[i] = gelu'(x[i]) * dout[i]   (written, not accumulated; dx may alias dout)
void gelu_backward(float* dx, const float* x, const float* dout, int64_t n, GeluKind kind);

}  // namespace lattice
