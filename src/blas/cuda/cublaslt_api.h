// cuBLASLt, loaded on first use (dlopen) rather than linked: the library is half a
// gigabyte and its load costs every lattice process 0.4 s and 200 MB of resident memory,
// CPU runs included. The GEMM facade calls it through this table.
#pragma once
#include <cublasLt.h>

namespace lattice::cuda {

struct CublasLtApi {
  decltype(&cublasLtCreate) Create;
  decltype(&cublasLtGetStatusName) GetStatusName;
  decltype(&cublasLtGetStatusString) GetStatusString;
  decltype(&cublasLtMatmul) Matmul;
  decltype(&cublasLtMatmulAlgoGetHeuristic) MatmulAlgoGetHeuristic;
  decltype(&cublasLtMatmulDescCreate) MatmulDescCreate;
  decltype(&cublasLtMatmulDescSetAttribute) MatmulDescSetAttribute;
  decltype(&cublasLtMatmulPreferenceCreate) MatmulPreferenceCreate;
  decltype(&cublasLtMatmulPreferenceDestroy) MatmulPreferenceDestroy;
  decltype(&cublasLtMatmulPreferenceSetAttribute) MatmulPreferenceSetAttribute;
  decltype(&cublasLtMatrixLayoutCreate) MatrixLayoutCreate;
};

// The loaded library's entry points; fails with the dlopen error when it is missing.
const CublasLtApi& cublaslt();

}  // namespace lattice::cuda
