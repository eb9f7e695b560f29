// LATTICE_HD marks a function callable from host and device code: the math a CPU kernel
// and its CUDA twin share lives once, in headers, marked with it. Plain C++ builds see
// an empty macro.
#pragma once

#if defined(__CUDACC__)
#define LATTICE_HD __host__ __device__
#else
#define LATTICE_HD
#endif

// Loop unrolling for shared host-device code: #pragma unroll in nvcc's device pass,
// nothing in host compilers.
#if defined(__CUDA_ARCH__)
#define LATTICE_UNROLL _Pragma("unroll")
#else
#define LATTICE_UNROLL
#endif
