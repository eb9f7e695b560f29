// Element types lattice knows about.
#pragma once
#include <cstddef>
#include <cstdint>
#include <string>

namespace lattice {

enum class DType : uint8_t { f32, bf16, f16, f8e4m3, f8e5m2, i32, i64, u16, u8 };

size_t dtype_size(DType t);
const char* dtype_name(DType t);

}  // namespace lattice
