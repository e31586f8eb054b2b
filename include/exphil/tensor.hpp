// exphil::Tensor: the C descriptor of exphil.h, with C++ helpers.
#pragma once

#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <string>

#include "exphil/exphil.h"

namespace exphil {

using Tensor = ::exphil_tensor;

// "[2, 32, 256]": a shape as the library's messages write it.
std::string shape_string(const int64_t* dims, int rank);
// Same type as cudaStream_t; nullptr selects the library's managed stream.
using Stream = ::exphil_stream;

enum class DType : int32_t {
  f32 = EXPHIL_F32,
  f16 = EXPHIL_F16,
  bf16 = EXPHIL_BF16,
};

constexpr bool is_valid_dtype(int32_t code) noexcept {
  return code == EXPHIL_F32 || code == EXPHIL_F16 || code == EXPHIL_BF16;
}

constexpr std::size_t dtype_size(DType dtype) noexcept {
  return dtype == DType::f32 ? 4 : 2;
}

constexpr const char* dtype_name(DType dtype) noexcept {
  switch (dtype) {
    case DType::f32: return "f32";
    case DType::f16: return "f16";
    case DType::bf16: return "bf16";
  }
  return "unknown";
}

// A descriptor for `data` with the given dtype and shape (outermost first).
// Shapes longer than EXPHIL_MAX_RANK keep their rank, so validation rejects
// them instead of silently truncating.
inline Tensor make_tensor(void* data, DType dtype,
                          std::initializer_list<int64_t> shape) noexcept {
  Tensor t{};
  t.data = data;
  t.dtype = static_cast<int32_t>(dtype);
  t.rank = static_cast<int32_t>(shape.size());
  int i = 0;
  for (int64_t d : shape) {
    if (i == EXPHIL_MAX_RANK) break;
    t.shape[i++] = d;
  }
  return t;
}

}  // namespace exphil
