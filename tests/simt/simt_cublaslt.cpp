// cuBLASLt emulated on the host, for the SIMT emulation build: "device" memory is host
// memory, and a matmul runs in its stream's order (simt_streams.h). It replaces src/blas/cuda/cublaslt_api.cpp (the
// dlopen loader) and fills the same function table. Only the subset lattice's GEMM needs:
// column-major fp32 / bf16 / fp16 matrices, CUBLAS_COMPUTE_32F with fp32 alpha and beta in
// host memory, and the DEFAULT / BIAS / RELU(_BIAS) / GELU(_BIAS) / GELU_AUX(_BIAS)
// epilogues. Anything else answers CUBLAS_STATUS_NOT_SUPPORTED (or INVALID_VALUE where the
// documentation names that status).
//
// Written from NVIDIA's documentation only: the doc comments of cublasLt.h (CUDA 13.1) and
// the cuBLAS Library User Guide, section 3 "Using the cuBLASLt API" (3.3.2
// cublasLtEpilogue_t, 3.3.9 cublasLtMatmulDescAttributes_t, 3.3.13
// cublasLtMatmulPreferenceAttributes_t, 3.3.19 cublasLtMatrixLayoutAttribute_t, 3.4.17
// cublasLtMatmul). "[UG x]" below cites that guide's section, "[h]" the header.
//
// The emulation is strict where the documentation leaves the library room: an algorithm
// may rely on everything its heuristic query promised (buffer alignments, workspace), so
// cublasLtMatmul checks the call against what the query saw and fails where a GPU could
// fault or misbehave.
#include <cublasLt.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <deque>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include "blas/cuda/cublaslt_api.h"
#include "kernels/cast_math.h"
#include "simt_state.h"
#include "simt_streams.h"

// The handle type is an opaque struct the header leaves incomplete; the emulation's handle
// is this.
struct cublasLtContext {
  uint64_t magic;
};

namespace lattice::cuda {
namespace {

constexpr uint64_t kHandleMagic = 0x53494d544c544831ull;      // "SIMTLTH1"
constexpr uint64_t kLayoutMagic = 0x53494d544c544c31ull;      // "SIMTLTL1"
constexpr uint64_t kDescMagic = 0x53494d544c544431ull;        // "SIMTLTD1"
constexpr uint64_t kPreferenceMagic = 0x53494d544c545031ull;  // "SIMTLTP1"
constexpr uint64_t kAlgoMagic = 0x53494d544c544131ull;        // "SIMTLTA1"
constexpr uint64_t kDestroyedMagic = 0xdeadull;

// [UG 3.3.13] MIN_ALIGNMENT_{A,B,C,D}_BYTES: "Default is 256 bytes".
constexpr uint32_t kDefaultMinAlignment = 256;
// [UG 3.4.17] "The workspace pointer must be aligned to at least a multiple of 256 bytes."
constexpr uintptr_t kWorkspaceAlignment = 256;
// Largest alignment the emulation tracks for a pointer (the documented default above).
constexpr uint32_t kMaxTrackedAlignment = 256;

// ---- The opaque objects' contents (stored in the header's semi-opaque structs) ----------

struct Layout {
  uint64_t magic;
  cudaDataType type;
  int64_t rows, cols, ld;
};

struct Desc {
  uint64_t magic;
  int32_t pointer_mode;  // [h] POINTER_MODE, default CUBLASLT_POINTER_MODE_HOST
  int32_t transa;        // [h] TRANSA, default CUBLAS_OP_N
  int32_t transb;        // [h] TRANSB, default CUBLAS_OP_N
  uint32_t epilogue;     // [h] EPILOGUE, default CUBLASLT_EPILOGUE_DEFAULT
  const void* bias;      // [h] BIAS_POINTER, default NULL
  int32_t bias_type;     // [h] BIAS_DATA_TYPE, default -1 (= D's type, see resolve below)
  void* aux;             // [h] EPILOGUE_AUX_POINTER, default NULL
  int64_t aux_ld;        // [h] EPILOGUE_AUX_LD, default 0
  int32_t aux_type;      // [h] EPILOGUE_AUX_DATA_TYPE, default -1 (= D's type)
};

struct Preference {
  uint64_t magic;
  uint64_t max_workspace;   // [h] MAX_WORKSPACE_BYTES, "default: 0 - no workspace allowed"
  uint32_t min_align[4];    // [h] MIN_ALIGNMENT_{A,B,C,D}_BYTES, "default: 256"
};

// What one heuristic answer promises the kernel (and so what cublasLtMatmul checks): the
// operation it was chosen for, the buffer alignments it may assume, its workspace.
struct Algo {
  uint64_t magic;
  uint32_t min_align[4];   // A, B, C, D: the preference's declared alignments
  uint32_t bias_align;     // alignment of the bias pointer the query saw
  uint32_t aux_align;      // alignment of the aux pointer the query saw
  uint64_t workspace;      // bytes the algorithm needs
  int32_t ab_type, cd_type;
  int32_t transa, transb;
  uint32_t epilogue;
};

static_assert(sizeof(Layout) <= sizeof(cublasLtMatrixLayoutOpaque_t));
static_assert(sizeof(Desc) <= sizeof(cublasLtMatmulDescOpaque_t));
static_assert(sizeof(Preference) <= sizeof(cublasLtMatmulPreferenceOpaque_t));
static_assert(sizeof(Algo) <= sizeof(cublasLtMatmulAlgo_t));

template <typename T, typename Opaque>
T load(const Opaque* opaque) {
  T value;
  std::memcpy(&value, opaque->data, sizeof value);
  return value;
}

template <typename T, typename Opaque>
void store(Opaque* opaque, const T& value) {
  std::memset(opaque->data, 0, sizeof opaque->data);
  std::memcpy(opaque->data, &value, sizeof value);
}

// The stored object when `opaque` is one of ours (its magic matches), else false.
template <typename T, typename Opaque>
bool read(const Opaque* opaque, uint64_t magic, T& out) {
  if (opaque == nullptr) return false;
  out = load<T>(opaque);
  return out.magic == magic;
}

// Handles, layouts and matmul descriptors: the table has no call to destroy them, so they
// live as long as the process, kept here (reachable: a leak checker reports nothing). Zeroed.
template <typename T>
T* allocate_for_process() {
  static std::mutex mutex;
  static auto* kept = new std::deque<std::unique_ptr<T>>();  // never destroyed
  const std::lock_guard lock(mutex);
  return kept->emplace_back(std::make_unique<T>()).get();
}

bool valid_handle(cublasLtHandle_t handle) {
  return handle != nullptr && handle->magic == kHandleMagic;
}

// ---- Element formats ---------------------------------------------------------------------

bool supported_type(cudaDataType type) {
  return type == CUDA_R_32F || type == CUDA_R_16BF || type == CUDA_R_16F;
}

size_t element_size(cudaDataType type) { return type == CUDA_R_32F ? 4 : 2; }

float load_element(const void* base, cudaDataType type, int64_t index) {
  switch (type) {
    case CUDA_R_16BF: return math::bf16_to_fp32(static_cast<const uint16_t*>(base)[index]);
    case CUDA_R_16F: return math::fp16_to_fp32(static_cast<const uint16_t*>(base)[index]);
    default: return static_cast<const float*>(base)[index];
  }
}

// [h] SCALE_TYPE: the value "is then converted from scale type to type of matrix D before
// being stored". The rounding is not documented; round to nearest even, the IEEE default
// and what the device's __float2bfloat16_rn / __float2half_rn do.
void store_element(void* base, cudaDataType type, int64_t index, float value) {
  switch (type) {
    case CUDA_R_16BF: static_cast<uint16_t*>(base)[index] = math::fp32_to_bf16(value); break;
    case CUDA_R_16F: static_cast<uint16_t*>(base)[index] = math::fp32_to_fp16(value); break;
    default: static_cast<float*>(base)[index] = value; break;
  }
}

// ---- Epilogues ---------------------------------------------------------------------------

// [UG 3.3.2]: the emulated subset. The flags compose as the header defines them:
// RELU = 2, BIAS = 4, GELU = 32, AUX = 128 (GELU_AUX = GELU | 128, ...).
bool supported_epilogue(uint32_t e) {
  switch (e) {
    case CUBLASLT_EPILOGUE_DEFAULT:
    case CUBLASLT_EPILOGUE_BIAS:
    case CUBLASLT_EPILOGUE_RELU:
    case CUBLASLT_EPILOGUE_RELU_BIAS:
    case CUBLASLT_EPILOGUE_GELU:
    case CUBLASLT_EPILOGUE_GELU_BIAS:
    case CUBLASLT_EPILOGUE_GELU_AUX:
    case CUBLASLT_EPILOGUE_GELU_AUX_BIAS: return true;
    default: return false;  // RELU_AUX (a bit-mask aux), the gradients, BGRADA/B: not emulated
  }
}
bool epilogue_has_bias(uint32_t e) { return (e & CUBLASLT_EPILOGUE_BIAS) != 0; }
bool epilogue_has_aux(uint32_t e) { return (e & 128u) != 0; }
bool epilogue_has_gelu(uint32_t e) { return (e & CUBLASLT_EPILOGUE_GELU) != 0; }
bool epilogue_has_relu(uint32_t e) { return (e & CUBLASLT_EPILOGUE_RELU) != 0; }

// [UG 3.3.2] note 5: "GELU (Gaussian Error Linear Unit) is approximated by:
// 0.5x(1 + tanh(sqrt(2/pi)(x + 0.044715x^3)))" -- the tanh form, not x * Phi(x) with erf.
// Evaluated in double from the fp32 input, then rounded to fp32.
float gelu(float x) {
  const double v = x;
  const double sqrt_2_over_pi = 0.79788456080286535588;  // sqrt(2 / pi)
  return static_cast<float>(0.5 * v * (1.0 + std::tanh(sqrt_2_over_pi * (v + 0.044715 * v * v * v))));
}

// [UG 3.3.2] RELU: "x := max(x, 0)". fmax's maxNum semantics: max(NaN, 0) = 0.
float relu(float x) { return std::fmax(x, 0.0f); }

// ---- Pointers ----------------------------------------------------------------------------

// Largest power of two dividing the address, capped at kMaxTrackedAlignment; NULL (address
// 0) counts as fully aligned.
uint32_t address_alignment(const void* p) {
  const auto a = reinterpret_cast<uintptr_t>(p);
  if (a == 0) return kMaxTrackedAlignment;
  return static_cast<uint32_t>(std::min<uintptr_t>(a & (~a + 1), kMaxTrackedAlignment));
}

bool aligned_to(const void* p, uint64_t alignment) {
  return alignment <= 1 || reinterpret_cast<uintptr_t>(p) % alignment == 0;
}

// The addresses of a column-major rows x cols matrix (ld >= rows): one interval per column,
// in increasing order and disjoint.
struct Span {
  uintptr_t base;
  int64_t rows, cols, ld;
  size_t esize;
};

Span span_of(const void* p, const Layout& l) {
  return {reinterpret_cast<uintptr_t>(p), l.rows, l.cols, l.ld, element_size(l.type)};
}

// Whether any element of one matrix shares a byte with an element of the other: a merge
// of the two sorted lists of column intervals.
bool overlaps(const Span& x, const Span& y) {
  if (x.base == 0 || y.base == 0 || x.rows == 0 || x.cols == 0 || y.rows == 0 || y.cols == 0) {
    return false;
  }
  auto column = [](const Span& s, int64_t j) {
    const uintptr_t begin = s.base + static_cast<uintptr_t>(j * s.ld) * s.esize;
    return std::pair<uintptr_t, uintptr_t>{begin, begin + static_cast<uintptr_t>(s.rows) * s.esize};
  };
  int64_t i = 0, j = 0;
  while (i < x.cols && j < y.cols) {
    const auto [xb, xe] = column(x, i);
    const auto [yb, ye] = column(y, j);
    if (xb < ye && yb < xe) return true;
    if (xe <= ye) {
      ++i;
    } else {
      ++j;
    }
  }
  return false;
}

// ---- Problem validation (shared by the heuristic query and the matmul) -------------------

struct Problem {
  Desc desc;
  Layout a, b, c, d;
  int64_t m, n, k;
  cudaDataType bias_type, aux_type;
};

cublasStatus_t validate_problem(cublasLtMatmulDesc_t desc_handle, cublasLtMatrixLayout_t a_handle,
                                cublasLtMatrixLayout_t b_handle, cublasLtMatrixLayout_t c_handle,
                                cublasLtMatrixLayout_t d_handle, Problem& p) {
  if (!read(desc_handle, kDescMagic, p.desc)) return CUBLAS_STATUS_INVALID_VALUE;
  if (!read(a_handle, kLayoutMagic, p.a) || !read(b_handle, kLayoutMagic, p.b) ||
      !read(d_handle, kLayoutMagic, p.d)) {
    return CUBLAS_STATUS_INVALID_VALUE;
  }
  // [UG 3.4.17] "If Cdesc is omitted, this function assumes it to be equal to Ddesc."
  if (c_handle == nullptr) {
    p.c = p.d;
  } else if (!read(c_handle, kLayoutMagic, p.c)) {
    return CUBLAS_STATUS_INVALID_VALUE;
  }
  const Desc& desc = p.desc;
  // Emulation limits: alpha and beta are host scalars; op() is N or T.
  if (desc.pointer_mode != CUBLASLT_POINTER_MODE_HOST) return CUBLAS_STATUS_NOT_SUPPORTED;
  for (int32_t op : {desc.transa, desc.transb}) {
    if (op != CUBLAS_OP_N && op != CUBLAS_OP_T) return CUBLAS_STATUS_NOT_SUPPORTED;
  }
  if (!supported_epilogue(desc.epilogue)) return CUBLAS_STATUS_NOT_SUPPORTED;

  // D = alpha * op(A) op(B) + beta * C: op(A) is m x k, op(B) k x n, C and D m x n
  // ([UG 3.4.17]; out of place "both matrices must have the same ... number of rows,
  // number of columns"). Conflicting shapes: "parameters ... in conflict" -> INVALID_VALUE.
  p.m = p.d.rows;
  p.n = p.d.cols;
  const int64_t a_rows = desc.transa == CUBLAS_OP_N ? p.a.rows : p.a.cols;
  const int64_t a_cols = desc.transa == CUBLAS_OP_N ? p.a.cols : p.a.rows;
  const int64_t b_rows = desc.transb == CUBLAS_OP_N ? p.b.rows : p.b.cols;
  const int64_t b_cols = desc.transb == CUBLAS_OP_N ? p.b.cols : p.b.rows;
  p.k = a_cols;
  if (a_rows != p.m || b_rows != p.k || b_cols != p.n) return CUBLAS_STATUS_INVALID_VALUE;
  if (p.c.rows != p.m || p.c.cols != p.n) return CUBLAS_STATUS_INVALID_VALUE;

  // [UG 3.4.17] out of place, C and D "must have the same data type".
  if (p.c.type != p.d.type) return CUBLAS_STATUS_INVALID_VALUE;
  // [UG 3.4.17] "Datatypes Supported", CUBLAS_COMPUTE_32F rows with real types:
  // Atype/Btype bf16 -> Ctype bf16 or fp32; fp16 -> fp16 or fp32; fp32 -> fp32.
  // Any other combination is not in the table.
  if (p.a.type != p.b.type) return CUBLAS_STATUS_NOT_SUPPORTED;
  const bool combination_listed =
      p.d.type == CUDA_R_32F || (p.a.type == p.d.type && p.a.type != CUDA_R_32F);
  if (!combination_listed) return CUBLAS_STATUS_NOT_SUPPORTED;

  // [UG 3.3.9] BIAS_DATA_TYPE: "If unset (or set to the default value of -1), the bias
  // vector elements are the same type as the elements of the output matrix (Dtype)"; the
  // datatype table lists, for every non-fp8 combination, Bias Type = Ctype (= Dtype).
  // Another type is not in the table.
  p.bias_type = desc.bias_type == -1 ? p.d.type : static_cast<cudaDataType>(desc.bias_type);
  if (epilogue_has_bias(desc.epilogue) && p.bias_type != p.d.type) {
    return CUBLAS_STATUS_NOT_SUPPORTED;
  }
  // [UG 3.3.9] EPILOGUE_AUX_DATA_TYPE: "If unset (or set to the default value of -1), the
  // data type is set to be the output matrix element data type (DType)"; outside the fp8
  // exceptions it "should be left unset or set to the default value of -1. If set for an
  // unsupported ... combination, calling cublasLtMatmul() will return
  // CUBLAS_INVALID_VALUE." Setting it to DType itself (the same thing) is accepted.
  p.aux_type = desc.aux_type == -1 ? p.d.type : static_cast<cudaDataType>(desc.aux_type);
  if (epilogue_has_aux(desc.epilogue) && p.aux_type != p.d.type) {
    return CUBLAS_STATUS_INVALID_VALUE;
  }
  return CUBLAS_STATUS_SUCCESS;
}

// The one algorithm the emulated heuristic knows, configured for `p` under `pref`.
Algo make_algo(const Problem& p, const Preference& pref) {
  Algo algo{};
  algo.magic = kAlgoMagic;
  // [UG 3.3.13] the MIN_ALIGNMENT preferences exclude "algorithms that can not work with
  // matrix A, which is not as strictly aligned as the algorithms need": an algorithm the
  // query returns may need exactly the declared alignment (default 256 bytes).
  for (int i = 0; i < 4; ++i) algo.min_align[i] = std::max<uint32_t>(pref.min_align[i], 1);
  // [h] BIAS_POINTER / EPILOGUE_AUX_POINTER: "Routines that don't dereference this pointer,
  // like cublasLtMatmulAlgoGetHeuristic() depend on its value to determine expected pointer
  // alignment." The algorithm may assume the alignment the query saw.
  algo.bias_align = epilogue_has_bias(p.desc.epilogue) ? address_alignment(p.desc.bias) : 1;
  algo.aux_align = epilogue_has_aux(p.desc.epilogue) ? address_alignment(p.desc.aux) : 1;
  // [UG 3.3.10] workspaceSize: "Actual size of workspace memory required", bounded by the
  // preference's MAX_WORKSPACE_BYTES. The emulation claims all of it (the most a conforming
  // algorithm may need), so a matmul given less than it promised is caught.
  algo.workspace = pref.max_workspace;
  algo.ab_type = p.a.type;
  algo.cd_type = p.d.type;
  algo.transa = p.desc.transa;
  algo.transb = p.desc.transb;
  algo.epilogue = p.desc.epilogue;
  return algo;
}

Preference default_preference() {
  Preference pref{};
  pref.magic = kPreferenceMagic;
  pref.max_workspace = 0;
  for (uint32_t& a : pref.min_align) a = kDefaultMinAlignment;
  return pref;
}

// ---- The arithmetic ----------------------------------------------------------------------

// Runs fn(first_column, end_column) over [0, n) on a few threads when the product is big.
template <typename Fn>
void for_column_blocks(int64_t n, double work, Fn fn) {
  const unsigned hw = std::max(1u, std::thread::hardware_concurrency());
  const int64_t threads = work < 4.0e6 ? 1 : std::min<int64_t>({static_cast<int64_t>(hw), 16, n});
  if (threads <= 1) {
    fn(int64_t{0}, n);
    return;
  }
  std::vector<std::thread> pool;
  const int64_t per = (n + threads - 1) / threads;
  for (int64_t t = 0; t < threads; ++t) {
    const int64_t begin = t * per, end = std::min(n, begin + per);
    if (begin < end) pool.emplace_back(fn, begin, end);
  }
  for (auto& th : pool) th.join();
}

// D = epilogue(alpha * op(A) op(B) + beta * C), validated beforehand.
void compute(const Problem& p, float alpha, const void* A, const void* B, float beta, const void* C,
             void* D) {
  const Desc& desc = p.desc;
  const int64_t m = p.m, n = p.n, k = p.k;
  // op(A) as rows (row i contiguous over the k index), op(B) as columns, in fp32: the
  // inputs are "converted to fp32" -- exact for bf16 and fp16.
  std::vector<float> a_rows(static_cast<size_t>(m * k)), b_cols(static_cast<size_t>(n * k));
  for (int64_t i = 0; i < m; ++i) {
    for (int64_t l = 0; l < k; ++l) {
      const int64_t index = desc.transa == CUBLAS_OP_N ? i + l * p.a.ld : l + i * p.a.ld;
      a_rows[i * k + l] = load_element(A, p.a.type, index);
    }
  }
  for (int64_t j = 0; j < n; ++j) {
    for (int64_t l = 0; l < k; ++l) {
      const int64_t index = desc.transb == CUBLAS_OP_N ? l + j * p.b.ld : j + l * p.b.ld;
      b_cols[j * k + l] = load_element(B, p.b.type, index);
    }
  }
  const bool bias = epilogue_has_bias(desc.epilogue), aux = epilogue_has_aux(desc.epilogue);
  const bool use_gelu = epilogue_has_gelu(desc.epilogue), use_relu = epilogue_has_relu(desc.epilogue);
  // BLAS convention (cuBLAS gemm: "if beta == 0 then C does not have to be a valid input"):
  // with beta == 0, C is not read (NaN or garbage there does not reach D).
  const bool read_c = beta != 0.0f;

  for_column_blocks(n, static_cast<double>(m) * n * k, [&](int64_t j_begin, int64_t j_end) {
    for (int64_t j = j_begin; j < j_end; ++j) {
      const float* bj = &b_cols[j * k];
      for (int64_t i = 0; i < m; ++i) {
        const float* ai = &a_rows[i * k];
        // [h] COMPUTE_TYPE CUBLAS_COMPUTE_32F: multiply and accumulate in fp32, order
        // unspecified. The emulation sums the exact products in double (four partial sums
        // in a fixed order; one thread computes the whole element, so any thread count
        // gives the same bits) and rounds the sum to the fp32 accumulator once.
        double s0 = 0, s1 = 0, s2 = 0, s3 = 0;
        int64_t l = 0;
        for (; l + 4 <= k; l += 4) {
          s0 += double(ai[l]) * bj[l];
          s1 += double(ai[l + 1]) * bj[l + 1];
          s2 += double(ai[l + 2]) * bj[l + 2];
          s3 += double(ai[l + 3]) * bj[l + 3];
        }
        for (; l < k; ++l) s0 += double(ai[l]) * bj[l];
        const float accumulator = static_cast<float>((s0 + s1) + (s2 + s3));
        // [h] SCALE_TYPE: the accumulator and C are converted to the scale type (fp32) for
        // alpha * acc + beta * C; [UG 3.3.2] BIAS: the bias "is broadcast to all columns and
        // added before applying the final postprocessing", one element per row of D
        // ("Bias vector length must match matrix D rows"). Evaluated in double, rounded
        // to fp32 once: the epilogue's input x.
        double x = double(alpha) * accumulator;
        if (read_c) x += double(beta) * load_element(C, p.c.type, i + j * p.c.ld);
        if (bias) x += load_element(desc.bias, p.bias_type, i);
        const float pre_activation = static_cast<float>(x);
        // [UG 3.3.2] GELU_AUX(_BIAS): "outputs GELU input as a separate matrix"; [UG 3.3.9]
        // AUX_POINTER: "Output of GELU input matrix in forward pass", leading dimension
        // AUX_LD "in elements", element type AUX_DATA_TYPE (default Dtype). So the aux
        // matrix holds x (after bias, before GELU), m x n column-major.
        if (aux) store_element(desc.aux, p.aux_type, i + j * desc.aux_ld, pre_activation);
        float out = pre_activation;
        if (use_gelu) out = gelu(out);
        if (use_relu) out = relu(out);
        store_element(D, p.d.type, i + j * p.d.ld, out);
      }
    }
  });
}

// ---- The API -----------------------------------------------------------------------------

cublasStatus_t create(cublasLtHandle_t* handle) {
  if (handle == nullptr) return CUBLAS_STATUS_INVALID_VALUE;
  *handle = allocate_for_process<cublasLtContext>();
  (*handle)->magic = kHandleMagic;
  return CUBLAS_STATUS_SUCCESS;
}

const char* status_name(cublasStatus_t status) {
  switch (status) {
    case CUBLAS_STATUS_SUCCESS: return "CUBLAS_STATUS_SUCCESS";
    case CUBLAS_STATUS_NOT_INITIALIZED: return "CUBLAS_STATUS_NOT_INITIALIZED";
    case CUBLAS_STATUS_ALLOC_FAILED: return "CUBLAS_STATUS_ALLOC_FAILED";
    case CUBLAS_STATUS_INVALID_VALUE: return "CUBLAS_STATUS_INVALID_VALUE";
    case CUBLAS_STATUS_ARCH_MISMATCH: return "CUBLAS_STATUS_ARCH_MISMATCH";
    case CUBLAS_STATUS_MAPPING_ERROR: return "CUBLAS_STATUS_MAPPING_ERROR";
    case CUBLAS_STATUS_EXECUTION_FAILED: return "CUBLAS_STATUS_EXECUTION_FAILED";
    case CUBLAS_STATUS_INTERNAL_ERROR: return "CUBLAS_STATUS_INTERNAL_ERROR";
    case CUBLAS_STATUS_NOT_SUPPORTED: return "CUBLAS_STATUS_NOT_SUPPORTED";
    case CUBLAS_STATUS_LICENSE_ERROR: return "CUBLAS_STATUS_LICENSE_ERROR";
  }
  return "CUBLAS_STATUS_UNKNOWN";
}

cublasStatus_t matrix_layout_create(cublasLtMatrixLayout_t* layout, cudaDataType type, uint64_t rows,
                                    uint64_t cols, int64_t ld) {
  if (layout == nullptr) return CUBLAS_STATUS_INVALID_VALUE;
  if (!supported_type(type)) return CUBLAS_STATUS_NOT_SUPPORTED;
  // [UG 3.3.19] ROWS / COLS: "Normally only values that can be expressed as int32_t are
  // supported."
  if (rows > INT32_MAX || cols > INT32_MAX) return CUBLAS_STATUS_NOT_SUPPORTED;
  // [UG 3.3.19] LD: column-major (ORDER default CUBLASLT_ORDER_COL), "only non-negative
  // values are supported", and it must be "greater or equal to CUBLASLT_MATRIX_LAYOUT_ROWS".
  if (ld < 0 || static_cast<uint64_t>(ld) < rows) return CUBLAS_STATUS_INVALID_VALUE;
  auto* opaque = allocate_for_process<cublasLtMatrixLayoutOpaque_t>();  // 64 bytes per layout
  store(opaque, Layout{kLayoutMagic, type, static_cast<int64_t>(rows), static_cast<int64_t>(cols), ld});
  *layout = opaque;
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t matmul_desc_create(cublasLtMatmulDesc_t* desc, cublasComputeType_t compute_type,
                                  cudaDataType_t scale_type) {
  if (desc == nullptr) return CUBLAS_STATUS_INVALID_VALUE;
  // Emulation limit: true fp32 (no TF32 / fast modes, no pedantic variant) with fp32
  // alpha and beta.
  if (compute_type != CUBLAS_COMPUTE_32F || scale_type != CUDA_R_32F) return CUBLAS_STATUS_NOT_SUPPORTED;
  Desc d{};
  d.magic = kDescMagic;
  d.pointer_mode = CUBLASLT_POINTER_MODE_HOST;
  d.transa = CUBLAS_OP_N;
  d.transb = CUBLAS_OP_N;
  d.epilogue = CUBLASLT_EPILOGUE_DEFAULT;
  d.bias = nullptr;
  d.bias_type = -1;
  d.aux = nullptr;
  d.aux_ld = 0;
  d.aux_type = -1;
  auto* opaque = allocate_for_process<cublasLtMatmulDescOpaque_t>();  // 256 bytes per descriptor
  store(opaque, d);
  *desc = opaque;
  return CUBLAS_STATUS_SUCCESS;
}

// Copies an attribute value of type T; the size must be the documented type's ([h]
// SetAttribute: INVALID_VALUE "if buf is NULL or sizeInBytes doesn't match size of internal
// storage for selected attribute").
template <typename T>
cublasStatus_t copy_attribute(T& field, const void* buf, size_t size) {
  if (size != sizeof(T)) return CUBLAS_STATUS_INVALID_VALUE;
  std::memcpy(&field, buf, sizeof(T));
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t matmul_desc_set_attribute(cublasLtMatmulDesc_t desc_handle, cublasLtMatmulDescAttributes_t attr,
                                         const void* buf, size_t size) {
  Desc d;
  if (!read(desc_handle, kDescMagic, d) || buf == nullptr) return CUBLAS_STATUS_INVALID_VALUE;
  cublasStatus_t status;
  // Types from [UG 3.3.9] / [h].
  switch (attr) {
    case CUBLASLT_MATMUL_DESC_POINTER_MODE: status = copy_attribute<int32_t>(d.pointer_mode, buf, size); break;
    case CUBLASLT_MATMUL_DESC_TRANSA: status = copy_attribute<int32_t>(d.transa, buf, size); break;
    case CUBLASLT_MATMUL_DESC_TRANSB: status = copy_attribute<int32_t>(d.transb, buf, size); break;
    case CUBLASLT_MATMUL_DESC_EPILOGUE: status = copy_attribute<uint32_t>(d.epilogue, buf, size); break;
    case CUBLASLT_MATMUL_DESC_BIAS_POINTER: status = copy_attribute<const void*>(d.bias, buf, size); break;
    case CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE: status = copy_attribute<int32_t>(d.bias_type, buf, size); break;
    case CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER: status = copy_attribute<void*>(d.aux, buf, size); break;
    case CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD: status = copy_attribute<int64_t>(d.aux_ld, buf, size); break;
    case CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_DATA_TYPE:
      status = copy_attribute<int32_t>(d.aux_type, buf, size);
      break;
    default: return CUBLAS_STATUS_INVALID_VALUE;  // not emulated
  }
  if (status == CUBLAS_STATUS_SUCCESS) store(desc_handle, d);
  return status;
}

cublasStatus_t preference_create(cublasLtMatmulPreference_t* pref) {
  if (pref == nullptr) return CUBLAS_STATUS_INVALID_VALUE;
  auto* opaque = new cublasLtMatmulPreferenceOpaque_t{};
  store(opaque, default_preference());
  *pref = opaque;
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t preference_destroy(cublasLtMatmulPreference_t pref) {
  if (pref == nullptr) return CUBLAS_STATUS_SUCCESS;
  Preference p;
  if (!read(pref, kPreferenceMagic, p)) return CUBLAS_STATUS_INVALID_VALUE;
  p.magic = kDestroyedMagic;  // a use after destroy reads a foreign magic
  store(pref, p);
  delete pref;
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t preference_set_attribute(cublasLtMatmulPreference_t pref_handle,
                                        cublasLtMatmulPreferenceAttributes_t attr, const void* buf,
                                        size_t size) {
  Preference p;
  if (!read(pref_handle, kPreferenceMagic, p) || buf == nullptr) return CUBLAS_STATUS_INVALID_VALUE;
  cublasStatus_t status;
  // Types from [UG 3.3.13]: MAX_WORKSPACE_BYTES uint64_t, MIN_ALIGNMENT_*_BYTES uint32_t.
  switch (attr) {
    case CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES:
      status = copy_attribute<uint64_t>(p.max_workspace, buf, size);
      break;
    case CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES: status = copy_attribute<uint32_t>(p.min_align[0], buf, size); break;
    case CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES: status = copy_attribute<uint32_t>(p.min_align[1], buf, size); break;
    case CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES: status = copy_attribute<uint32_t>(p.min_align[2], buf, size); break;
    case CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES: status = copy_attribute<uint32_t>(p.min_align[3], buf, size); break;
    default: return CUBLAS_STATUS_INVALID_VALUE;  // not emulated
  }
  if (status == CUBLAS_STATUS_SUCCESS) store(pref_handle, p);
  return status;
}

std::atomic<bool> refuse_epilogues{false};  // set_cublaslt_refuses_epilogues

cublasStatus_t algo_get_heuristic(cublasLtHandle_t handle, cublasLtMatmulDesc_t desc, cublasLtMatrixLayout_t a,
                                  cublasLtMatrixLayout_t b, cublasLtMatrixLayout_t c, cublasLtMatrixLayout_t d,
                                  cublasLtMatmulPreference_t pref_handle, int requested,
                                  cublasLtMatmulHeuristicResult_t results[], int* returned) {
  if (!valid_handle(handle)) return CUBLAS_STATUS_NOT_INITIALIZED;
  if (returned == nullptr) return CUBLAS_STATUS_INVALID_VALUE;
  *returned = 0;
  // [h] "CUBLAS_STATUS_INVALID_VALUE if requestedAlgoCount is less or equal to zero".
  if (requested <= 0 || results == nullptr) return CUBLAS_STATUS_INVALID_VALUE;
  Preference pref;
  if (!read(pref_handle, kPreferenceMagic, pref)) return CUBLAS_STATUS_INVALID_VALUE;
  Problem p;
  if (const cublasStatus_t status = validate_problem(desc, a, b, c, d, p); status != CUBLAS_STATUS_SUCCESS) {
    return status;
  }
  // A heuristic without a kernel for the request answers success with no result.
  if (refuse_epilogues.load() && p.desc.epilogue != CUBLASLT_EPILOGUE_DEFAULT) return CUBLAS_STATUS_SUCCESS;
  cublasLtMatmulHeuristicResult_t& r = results[0];
  std::memset(&r, 0, sizeof r);
  store(&r.algo, make_algo(p, pref));
  r.workspaceSize = pref.max_workspace;
  r.state = CUBLAS_STATUS_SUCCESS;
  r.wavesCount = 1.0f;
  *returned = 1;
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t matmul(cublasLtHandle_t handle, cublasLtMatmulDesc_t desc, const void* alpha, const void* A,
                      cublasLtMatrixLayout_t a_desc, const void* B, cublasLtMatrixLayout_t b_desc,
                      const void* beta, const void* C, cublasLtMatrixLayout_t c_desc, void* D,
                      cublasLtMatrixLayout_t d_desc, const cublasLtMatmulAlgo_t* algo_handle, void* workspace,
                      size_t workspace_size, cudaStream_t stream) {
  // [h] cublasLtMatmul: NOT_INITIALIZED "if cuBLASLt handle has not been initialized";
  // INVALID_VALUE "if the parameters are unexpectedly NULL, in conflict or in an impossible
  // configuration" ([UG 3.4.17]); NOT_SUPPORTED for what is not implemented.
  if (!valid_handle(handle)) return CUBLAS_STATUS_NOT_INITIALIZED;
  Problem p;
  if (const cublasStatus_t status = validate_problem(desc, a_desc, b_desc, c_desc, d_desc, p);
      status != CUBLAS_STATUS_SUCCESS) {
    return status;
  }
  if (alpha == nullptr || beta == nullptr) return CUBLAS_STATUS_INVALID_VALUE;
  const float alpha_value = *static_cast<const float*>(alpha);  // host pointer, scale type fp32
  const float beta_value = *static_cast<const float*>(beta);

  // [UG 3.4.17] algo: "When NULL, an implicit heuristics query with default search
  // preferences will be performed" -- default alignments (256 bytes), no workspace.
  Algo algo;
  if (algo_handle == nullptr) {
    algo = make_algo(p, default_preference());
  } else if (!read(algo_handle, kAlgoMagic, algo)) {
    return CUBLAS_STATUS_INVALID_VALUE;
  }
  // [h] cublasLtMatmulAlgoCheck: INVALID_VALUE "if matrix layout descriptors or operation
  // descriptor don't match algo descriptor" -- an algorithm runs the operation it was
  // chosen for.
  if (algo.ab_type != p.a.type || algo.cd_type != p.d.type || algo.transa != p.desc.transa ||
      algo.transb != p.desc.transb || algo.epilogue != p.desc.epilogue) {
    return CUBLAS_STATUS_INVALID_VALUE;
  }

  const Desc& d = p.desc;
  const bool empty_output = p.m == 0 || p.n == 0;
  if (!empty_output && D == nullptr) return CUBLAS_STATUS_INVALID_VALUE;
  if (!empty_output && p.k > 0 && (A == nullptr || B == nullptr)) return CUBLAS_STATUS_INVALID_VALUE;
  if (beta_value != 0.0f && C == nullptr && !empty_output) return CUBLAS_STATUS_INVALID_VALUE;
  // [UG 3.4.17] in place means "C == D and Cdesc == Ddesc"; out of place C != D.
  if (C != nullptr && C == D &&
      (p.c.type != p.d.type || p.c.ld != p.d.ld || p.c.rows != p.d.rows || p.c.cols != p.d.cols)) {
    return CUBLAS_STATUS_INVALID_VALUE;
  }
  // [UG 3.3.9] BIAS_POINTER: an input vector for the BIAS epilogues (default NULL).
  if (epilogue_has_bias(d.epilogue) && d.bias == nullptr) return CUBLAS_STATUS_INVALID_VALUE;
  if (epilogue_has_aux(d.epilogue)) {
    // [UG 3.3.9] AUX_POINTER "Requires setting the CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD
    // attribute"; AUX_LD for GELU: "Must be divisible by 8 and be no less than the number
    // of rows in the output matrix."
    if (d.aux == nullptr) return CUBLAS_STATUS_INVALID_VALUE;
    if (d.aux_ld < p.m || d.aux_ld % 8 != 0) return CUBLAS_STATUS_INVALID_VALUE;
  }

  // Alignment: every element at its natural alignment, and each buffer at least as
  // aligned as the algorithm may assume. Status: the documented INVALID_VALUE for "in
  // conflict ... e.g. when workspaceSizeInBytes is less than workspace required by
  // configured algo" -- the same kind of conflict with the configured algo.
  const void* matrices[4] = {A, B, C, D};
  const cudaDataType types[4] = {p.a.type, p.b.type, p.c.type, p.d.type};
  for (int i = 0; i < 4; ++i) {
    if (matrices[i] == nullptr) continue;
    if (!aligned_to(matrices[i], element_size(types[i])) || !aligned_to(matrices[i], algo.min_align[i])) {
      return CUBLAS_STATUS_INVALID_VALUE;
    }
  }
  if (epilogue_has_bias(d.epilogue) &&
      (!aligned_to(d.bias, element_size(p.bias_type)) || address_alignment(d.bias) < algo.bias_align)) {
    return CUBLAS_STATUS_INVALID_VALUE;
  }
  if (epilogue_has_aux(d.epilogue) &&
      (!aligned_to(d.aux, element_size(p.aux_type)) || address_alignment(d.aux) < algo.aux_align)) {
    return CUBLAS_STATUS_INVALID_VALUE;
  }
  // [UG 3.4.17] "when workspaceSizeInBytes is less than workspace required by configured
  // algo" -> INVALID_VALUE; the workspace "Must be 256B aligned".
  if (workspace_size < algo.workspace) return CUBLAS_STATUS_INVALID_VALUE;
  if (algo.workspace > 0 && workspace == nullptr) return CUBLAS_STATUS_INVALID_VALUE;
  if (workspace != nullptr && !aligned_to(workspace, kWorkspaceAlignment)) return CUBLAS_STATUS_INVALID_VALUE;

  // Aliasing. The documentation defines one shared buffer, C == D in place; A and B are
  // inputs, D (and aux) outputs. Any other overlap would make a GPU's result depend on the
  // order its blocks run: rejected as parameters in conflict.
  if (!empty_output) {
    const bool c_read = beta_value != 0.0f;  // see compute(): C is not read when beta == 0
    const Span a = span_of(p.k > 0 ? A : nullptr, p.a), b = span_of(p.k > 0 ? B : nullptr, p.b);
    const Span c = span_of(c_read ? C : nullptr, p.c), out = span_of(D, p.d);
    if (overlaps(out, a) || overlaps(out, b)) return CUBLAS_STATUS_INVALID_VALUE;
    if (C != D && overlaps(out, c)) return CUBLAS_STATUS_INVALID_VALUE;
    if (epilogue_has_aux(d.epilogue)) {
      const Layout aux_layout{kLayoutMagic, p.aux_type, p.m, p.n, d.aux_ld};
      const Span aux = span_of(d.aux, aux_layout);
      if (overlaps(aux, a) || overlaps(aux, b) || overlaps(aux, c) || overlaps(aux, out)) {
        return CUBLAS_STATUS_INVALID_VALUE;
      }
    }
    if (epilogue_has_bias(d.epilogue)) {
      const Layout bias_layout{kLayoutMagic, p.bias_type, p.m, 1, p.m};
      const Span bias = span_of(d.bias, bias_layout);
      if (overlaps(bias, out)) return CUBLAS_STATUS_INVALID_VALUE;
      if (epilogue_has_aux(d.epilogue)) {
        const Layout aux_layout{kLayoutMagic, p.aux_type, p.m, p.n, d.aux_ld};
        if (overlaps(bias, span_of(d.aux, aux_layout))) return CUBLAS_STATUS_INVALID_VALUE;
      }
    }
    // Run in stream order (simt_streams.h), from the values read now: the descriptors,
    // alpha and beta (host pointers) may change once the call has returned.
    lattice::simt::enqueue(stream, [=] { compute(p, alpha_value, A, B, beta_value, C, D); });
  }
  return CUBLAS_STATUS_SUCCESS;
}

}  // namespace

// Every entry below is set: a field added to CublasLtApi must be added here too.
static_assert(sizeof(CublasLtApi) == 11 * sizeof(void (*)()), "CublasLtApi changed: update the table");

const CublasLtApi& cublaslt() {
  static const CublasLtApi api = {
      .Create = create,
      .GetStatusName = status_name,
      // The enum's name here as well (the library's own description strings are not
      // documented).
      .GetStatusString = status_name,
      .Matmul = matmul,
      .MatmulAlgoGetHeuristic = algo_get_heuristic,
      .MatmulDescCreate = matmul_desc_create,
      .MatmulDescSetAttribute = matmul_desc_set_attribute,
      .MatmulPreferenceCreate = preference_create,
      .MatmulPreferenceDestroy = preference_destroy,
      .MatmulPreferenceSetAttribute = preference_set_attribute,
      .MatrixLayoutCreate = matrix_layout_create,
  };
  return api;
}

}  // namespace lattice::cuda

namespace lattice::simt {

void set_cublaslt_refuses_epilogues(bool refuse) { cuda::refuse_epilogues.store(refuse); }

}  // namespace lattice::simt
