// exphil tensor descriptors over the XLA buffers of one handler call. This is
// the one place where an XLA element type becomes an exphil dtype (f32, bf16
// and f16 all go through the same descriptor, the kernels pick by dtype) and
// where the contract's absent optional operands are applied (has_<name>, or
// without it zero elements). Everything else about shapes and dtypes is the
// library's to check.
#pragma once

#include <string>

#include "exphil/tensor.hpp"
#include "target_rows.hpp"
#include "xla/ffi/api/ffi.h"

namespace exphil::xla_ffi {

namespace ffi = ::xla::ffi;

// Whether an optional operand is there, as the call says it: its has_<name>
// attribute (false or true), or, where the caller left that out, its element
// count (zero elements: absent), JAX's convention.
enum class Presence { absent, present, by_element_count };

// The exphil dtype of an XLA element type; false for any type the kernels do
// not take.
bool exphil_dtype(ffi::DataType type, DType& dtype) noexcept;

// Describes the buffers of one call for the C++ API. Every method returns a
// descriptor owned by this object, or nullptr. The first buffer that cannot
// be described records why (naming the target and the buffer); later calls
// then return nullptr, and ok() is false: check it before calling the library.
class BufferViews {
 public:
  explicit BufferViews(const char* target) noexcept : target_(target) {}
  BufferViews(const BufferViews&) = delete;
  BufferViews& operator=(const BufferViews&) = delete;

  const Tensor* operand(const char* name, const ffi::AnyBuffer& buffer);
  const Tensor* result(const char* name, const ffi::AnyBuffer& buffer);
  // nullptr (absent, not an error) when `presence` says absent, the buffer
  // then never looked at; or, by element count, when it has zero elements.
  // Present, it must be a real tensor: zero elements are an error.
  const Tensor* optional_operand(const char* name, const ffi::AnyBuffer& buffer,
                                 Presence presence);
  // The gradient of an optional operand `input` (as optional_operand returned
  // it, with the same `presence`): nullptr when the input is absent, the
  // buffer then never looked at if has_<input> said so, and required to have
  // zero elements if its element count did; otherwise the input's shape.
  const Tensor* optional_gradient(const char* name, const ffi::AnyBuffer& buffer,
                                  const char* input_name, const Tensor* input,
                                  Presence presence);

  bool ok() const noexcept { return failure_.empty(); }
  // kInvalidArgument with the recorded message; success if ok().
  ffi::Error error() const;

 private:
  // `kind` is "operand" or "result", for messages.
  const Tensor* describe(const char* kind, const char* name, const ffi::AnyBuffer& buffer);
  void fail(const char* kind, const char* name, const std::string& why);

  // The most buffers of any target (the selective-scan backward's 20).
  static constexpr int kMaxBuffers = max_buffer_count();
  Tensor tensors_[kMaxBuffers] = {};
  int count_ = 0;
  const char* target_;
  std::string failure_;
};

}  // namespace exphil::xla_ffi
