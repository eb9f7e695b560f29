#if LATTICE_WITH_CUDA
#include "blas/cuda/cublaslt_api.h"

#include <cublas_api.h>
#include <dlfcn.h>

#include <string>

#include "core/error.h"

namespace lattice::cuda {
namespace {

CublasLtApi load() {
  void* lib = nullptr;
  std::string err;
#define LATTICE_STR2(x) #x
#define LATTICE_STR(x) LATTICE_STR2(x)
  for (const char* name : {"libcublasLt.so." LATTICE_STR(CUBLAS_VER_MAJOR), "libcublasLt.so"}) {
    lib = dlopen(name, RTLD_NOW | RTLD_LOCAL);
    if (lib) break;
    err = dlerror();
  }
  LATTICE_CHECK(lib) << "CUDA: cannot load cuBLASLt: " << err;
  CublasLtApi api{};
  auto get = [&](auto& fn, const char* symbol) {
    fn = reinterpret_cast<std::remove_reference_t<decltype(fn)>>(dlsym(lib, symbol));
    LATTICE_CHECK(fn) << "CUDA: cuBLASLt has no " << symbol;
  };
  get(api.Create, "cublasLtCreate");
  get(api.GetStatusName, "cublasLtGetStatusName");
  get(api.GetStatusString, "cublasLtGetStatusString");
  get(api.Matmul, "cublasLtMatmul");
  get(api.MatmulAlgoGetHeuristic, "cublasLtMatmulAlgoGetHeuristic");
  get(api.MatmulDescCreate, "cublasLtMatmulDescCreate");
  get(api.MatmulDescSetAttribute, "cublasLtMatmulDescSetAttribute");
  get(api.MatmulPreferenceCreate, "cublasLtMatmulPreferenceCreate");
  get(api.MatmulPreferenceDestroy, "cublasLtMatmulPreferenceDestroy");
  get(api.MatmulPreferenceSetAttribute, "cublasLtMatmulPreferenceSetAttribute");
  get(api.MatrixLayoutCreate, "cublasLtMatrixLayoutCreate");
  return api;
}

}  // namespace

const CublasLtApi& cublaslt() {
  static const CublasLtApi api = load();
  return api;
}

}  // namespace lattice::cuda
#endif  // LATTICE_WITH_CUDA
