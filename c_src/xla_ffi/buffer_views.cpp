#include "buffer_views.hpp"

#include <algorithm>
#include <sstream>

namespace exphil::xla_ffi {

namespace {

struct DTypeMapping {
  ffi::DataType xla;
  DType exphil;
};

constexpr DTypeMapping kDTypes[] = {
    {ffi::DataType::F32, DType::f32},
    {ffi::DataType::BF16, DType::bf16},
    {ffi::DataType::F16, DType::f16},
};

bool has_zero_elements(const ffi::AnyBuffer& buffer) {
  const auto dims = buffer.dimensions();
  return std::find(dims.begin(), dims.end(), int64_t{0}) != dims.end();
}

std::string shape_of(const ffi::AnyBuffer& buffer) {
  const auto dims = buffer.dimensions();
  return shape_string(dims.begin(), static_cast<int>(dims.size()));
}

}  // namespace

bool exphil_dtype(ffi::DataType type, DType& dtype) noexcept {
  for (const DTypeMapping& m : kDTypes) {
    if (m.xla == type) {
      dtype = m.exphil;
      return true;
    }
  }
  return false;
}

const Tensor* BufferViews::operand(const char* name, const ffi::AnyBuffer& buffer) {
  return describe("operand", name, buffer);
}

const Tensor* BufferViews::result(const char* name, const ffi::AnyBuffer& buffer) {
  return describe("result", name, buffer);
}

const Tensor* BufferViews::optional_operand(const char* name, const ffi::AnyBuffer& buffer,
                                            Presence presence) {
  if (!ok()) return nullptr;
  switch (presence) {
    case Presence::absent:
      return nullptr;
    case Presence::by_element_count:
      return has_zero_elements(buffer) ? nullptr : describe("operand", name, buffer);
    case Presence::present:
      break;
  }
  // describe() would refuse it too; this says which attribute made it required.
  if (has_zero_elements(buffer)) {
    fail("operand", name,
         "has zero elements (shape " + shape_of(buffer) + "), but has_" + name +
             " is true; pass has_" + name + " = false for an absent " + name);
    return nullptr;
  }
  return describe("operand", name, buffer);
}

const Tensor* BufferViews::optional_gradient(const char* name, const ffi::AnyBuffer& buffer,
                                             const char* input_name, const Tensor* input,
                                             Presence presence) {
  if (!ok()) return nullptr;
  if (!input) {
    // has_<input> = false: a placeholder of any shape, never written.
    if (presence == Presence::absent) return nullptr;
    if (!has_zero_elements(buffer))
      fail("result", name,
           std::string("expected zero elements, since operand '") + input_name +
               "' is absent (zero elements), got shape " + shape_of(buffer));
    return nullptr;
  }
  const auto dims = buffer.dimensions();
  if (static_cast<int>(dims.size()) != input->rank ||
      !std::equal(dims.begin(), dims.end(), input->shape)) {
    fail("result", name,
         std::string("expected the shape of operand '") + input_name + "', " +
             shape_string(input->shape, input->rank) + ", got " + shape_of(buffer));
    return nullptr;
  }
  return describe("result", name, buffer);
}

ffi::Error BufferViews::error() const {
  if (ok()) return ffi::Error::Success();
  return ffi::Error::InvalidArgument(failure_);
}

const Tensor* BufferViews::describe(const char* kind, const char* name,
                                    const ffi::AnyBuffer& buffer) {
  if (!ok()) return nullptr;
  DType dtype = DType::f32;
  if (!exphil_dtype(buffer.element_type(), dtype)) {
    std::ostringstream got;
    got << buffer.element_type();
    fail(kind, name, "element type " + got.str() + " is not supported; expected f32, bf16 or f16");
    return nullptr;
  }
  const auto dims = buffer.dimensions();
  if (dims.size() > EXPHIL_MAX_RANK) {
    fail(kind, name,
         "rank " + std::to_string(dims.size()) + "; the ops take at most " +
             std::to_string(EXPHIL_MAX_RANK) + " dimensions");
    return nullptr;
  }
  // Only the optional operands may be empty; saying so here is clearer than
  // the library's complaint about the NULL data pointer XLA gives them.
  if (has_zero_elements(buffer)) {
    fail(kind, name, "has zero elements (shape " + shape_of(buffer) +
                         "); every dimension must be >= 1");
    return nullptr;
  }
  // Cannot happen with the handlers' fixed signatures; kept as a guard.
  if (count_ == kMaxBuffers) {
    fail(kind, name, "too many buffers in one call (internal error)");
    return nullptr;
  }
  Tensor& t = tensors_[count_++];
  t.data = buffer.untyped_data();
  t.dtype = static_cast<int32_t>(dtype);
  t.rank = static_cast<int32_t>(dims.size());
  std::copy(dims.begin(), dims.end(), t.shape);
  return &t;
}

void BufferViews::fail(const char* kind, const char* name, const std::string& why) {
  failure_ = std::string(target_) + ": " + kind + " '" + name + "': " + why;
}

}  // namespace exphil::xla_ffi
