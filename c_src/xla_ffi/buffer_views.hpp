// exphil tensor descriptors over the XLA buffers of one handler call. This is
// the one place where an XLA element type becomes an exphil dtype (f32, bf16
// and f16 all go through the same descriptor, the kernels pick by dtype) and
// where the contract's "an optional operand with zero elements is absent" is
// applied. Everything else about shapes and dtypes is the library's to check.
#pragma once

#include <string>

#include "exphil/tensor.hpp"
#include "xla/ffi/api/ffi.h"

namespace exphil::xla_ffi {

namespace ffi = ::xla::ffi;

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
  // nullptr (absent, not an error) when the buffer has zero elements.
  const Tensor* optional_operand(const char* name, const ffi::AnyBuffer& buffer);
  // The gradient of an optional operand `input` (as optional_operand returned
  // it): zero elements and nullptr when the input is absent, otherwise the
  // input's shape.
  const Tensor* optional_gradient(const char* name, const ffi::AnyBuffer& buffer,
                                  const char* input_name, const Tensor* input);

  bool ok() const noexcept { return failure_.empty(); }
  // kInvalidArgument with the recorded message; success if ok().
  ffi::Error error() const;

 private:
  // `kind` is "operand" or "result", for messages.
  const Tensor* describe(const char* kind, const char* name, const ffi::AnyBuffer& buffer);
  void fail(const char* kind, const char* name, const std::string& why);

  // The selective-scan backward has the most buffers: 11 operands, 9 results.
  static constexpr int kMaxBuffers = 20;
  Tensor tensors_[kMaxBuffers] = {};
  int count_ = 0;
  const char* target_;
  std::string failure_;
};

}  // namespace exphil::xla_ffi
