// The SIMT emulation's runtime state shared by its scheduler (simt_scheduler.cpp) and its
// CUDA runtime (simt_cudart.cpp): launch checks, the last error, kernel attributes.
#pragma once
#include <cuda_runtime.h>

#include <cstddef>
#include <string>

namespace lattice::simt {

// Why the GPU would refuse this launch configuration, or "" when it would run it.
std::string launch_config_error(const void* kernel, dim3 grid, dim3 block, size_t shared_bytes);
// Sets the error cudaGetLastError() returns next; cudaGetErrorString of it gives `detail`.
void record_launch_error(cudaError_t code, const std::string& detail);
// The kernel as a launch error names it.
std::string kernel_name(const void* kernel);

// While set, the emulated cuBLASLt heuristic finds no algorithm for a matmul with an
// epilogue (as a real cuBLASLt may for a shape or alignment it has no fused kernel for),
// so the caller's unfused path runs. Off by default.
void set_cublaslt_refuses_epilogues(bool refuse);

}  // namespace lattice::simt
