#include "tensor_checks.hpp"

#include <limits>
#include <string>

#include "format.hpp"

namespace exphil::runtime {

std::string arg_prefix(const char* name) { return std::string("argument '") + name + "': "; }

std::string f32_or_dtype_message(const char* name, DType seq, const char* source, DType got) {
  return arg_prefix(name) + "expected dtype " + (seq == DType::f32 ? "" : "f32 or ") + dtype_name(seq) +
         " (the dtype of '" + source + "'), got " + dtype_name(got);
}

Status check_descriptor(const char* name, const Tensor* t, int expected_rank, const char* layout) {
  if (!t) return {StatusCode::invalid_argument, arg_prefix(name) + "the tensor descriptor is NULL"};
  // Null data is refused by CallTensors::add, which knows whether the call
  // is a can_implement of outputs not yet allocated.
  if (!is_valid_dtype(t->dtype))
    return {StatusCode::invalid_argument,
            arg_prefix(name) + "expected dtype f32 (" + std::to_string(EXPHIL_F32) + "), f16 (" +
                std::to_string(EXPHIL_F16) + ") or bf16 (" + std::to_string(EXPHIL_BF16) +
                "), got dtype code " + std::to_string(t->dtype)};
  if (t->rank != expected_rank) {
    std::string got = "rank " + std::to_string(t->rank);
    if (t->rank < 0 || t->rank > EXPHIL_MAX_RANK)
      got += " (a descriptor holds 0 to " + std::to_string(EXPHIL_MAX_RANK) + " dimensions)";
    else
      got += " " + shape_string(t->shape, t->rank);
    return {StatusCode::invalid_argument, arg_prefix(name) + "expected rank " +
                                              std::to_string(expected_rank) + " " + layout +
                                              ", got " + got};
  }
  return {};
}

Status check_extent(const char* name, const Tensor& t, std::size_t& bytes) {
  const auto dtype = static_cast<DType>(t.dtype);
  uint64_t total = dtype_size(dtype);
  for (int i = 0; i < t.rank; ++i) {
    if (t.shape[i] < 1)
      return {StatusCode::invalid_argument, arg_prefix(name) + "expected every dimension >= 1, got " +
                                                shape_string(t.shape, t.rank)};
  }
  constexpr uint64_t kMaxBytes = static_cast<uint64_t>(std::numeric_limits<int64_t>::max());
  for (int i = 0; i < t.rank; ++i) {
    const auto d = static_cast<uint64_t>(t.shape[i]);
    if (total > kMaxBytes / d)
      return {StatusCode::invalid_argument,
              arg_prefix(name) + "shape " + shape_string(t.shape, t.rank) + " of " + dtype_name(dtype) +
                  " is larger than 2^63 bytes"};
    total *= d;
  }
  bytes = static_cast<std::size_t>(total);
  return {};
}

Status check_shape(const char* name, const Tensor& t, const int64_t* expected,
                   const char* expected_desc) {
  for (int i = 0; i < t.rank; ++i) {
    if (t.shape[i] != expected[i])
      return {StatusCode::invalid_argument, arg_prefix(name) + "expected shape " +
                                                shape_string(expected, t.rank) + " (" +
                                                expected_desc + "), got " +
                                                shape_string(t.shape, t.rank)};
  }
  return {};
}

Status check_element_alignment(const char* name, const Tensor& t) {
  const auto dtype = static_cast<DType>(t.dtype);
  const std::size_t size = dtype_size(dtype);
  if (reinterpret_cast<uintptr_t>(t.data) % size != 0)
    return {StatusCode::invalid_argument,
            arg_prefix(name) + "data pointer " + pointer_string(t.data) + " is not aligned to " +
                std::to_string(size) + " bytes (one " + dtype_name(dtype) + " element)"};
  return {};
}

Status accept_tensor(CallTensors& tensors, const char* name, const Tensor& t, bool output, const void*& data) {
  std::size_t bytes = 0;
  EXPHIL_RETURN_IF_ERROR(check_extent(name, t, bytes));
  EXPHIL_RETURN_IF_ERROR(check_element_alignment(name, t));
  EXPHIL_RETURN_IF_ERROR(tensors.add(name, t.data, bytes, output));
  data = t.data;
  return {};
}

Status CallTensors::add(const char* name, const void* data, std::size_t bytes, bool output) {
  if (!data && !(output && unallocated_outputs_))
    return {StatusCode::invalid_argument, arg_prefix(name) + "the data pointer is NULL"};
  if (size_ == kMax)
    return {StatusCode::internal, std::string("too many tensors in one call at '") + name + "'"};
  items_[size_++] = CallTensor{name, data, bytes, output};
  return {};
}

Status CallTensors::check_no_overlaps() const {
  for (int i = 0; i < size_; ++i) {
    if (!items_[i].output || !items_[i].data) continue;
    const auto begin = reinterpret_cast<uintptr_t>(items_[i].data);
    const uintptr_t end = begin + items_[i].bytes;
    for (int j = 0; j < size_; ++j) {
      if (j == i || !items_[j].data) continue;
      const auto other_begin = reinterpret_cast<uintptr_t>(items_[j].data);
      const uintptr_t other_end = other_begin + items_[j].bytes;
      if (begin < other_end && other_begin < end)
        return {StatusCode::invalid_argument,
                arg_prefix(items_[i].name) + "output memory [" + pointer_string(items_[i].data) + ", +" +
                    std::to_string(items_[i].bytes) + " bytes) overlaps argument '" +
                    items_[j].name + "' [" + pointer_string(items_[j].data) + ", +" +
                    std::to_string(items_[j].bytes) +
                    " bytes); outputs must not share memory with any other argument"};
    }
  }
  return {};
}

}  // namespace exphil::runtime
