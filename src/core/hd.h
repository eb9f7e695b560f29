// LATTICE_HD marks a function callable from host and device code: the math a CPU kernel
// and its CUDA twin share lives once, in headers, marked with it. Plain C++ builds see
// an empty macro.
#pragma once

#if defined(__CUDACC__)
#define LATTICE_HD __host__ __device__
#else
#define LATTICE_HD
#endif
