#include "attributes.hpp"

#include <utility>

namespace exphil::xla_ffi {

namespace {

using AttributeIterator = decltype(std::declval<const ffi::Dictionary&>().begin());

// Reads attribute `name`, the one at `it`, into `out` if it is a scalar of
// type T. By name, not by iterator: the iterator's get<T> (JAX 0.11's
// xla/ffi/api/api.h) returns the value through a size_t, which truncates an
// f32 to an integer.
template <class T>
bool read(const ffi::Dictionary& attributes, const AttributeIterator& it, std::string_view name,
          T& out) {
  if (!attributes.isa<T>(it)) return false;
  ffi::ErrorOr<T> value = attributes.get<T>(name);
  if (!value.has_value()) return false;
  out = *value;
  return true;
}

// The MLIR type of the attribute at `it`, for messages; nullptr when it is
// not a scalar XLA decodes.
const char* received_type(const ffi::Dictionary& attributes, const AttributeIterator& it) {
  if (attributes.isa<bool>(it)) return "i1";
  if (attributes.isa<int8_t>(it)) return "i8";
  if (attributes.isa<int16_t>(it)) return "i16";
  if (attributes.isa<int32_t>(it)) return "i32";
  if (attributes.isa<int64_t>(it)) return "i64";
  if (attributes.isa<uint8_t>(it)) return "ui8";
  if (attributes.isa<uint16_t>(it)) return "ui16";
  if (attributes.isa<uint32_t>(it)) return "ui32";
  if (attributes.isa<uint64_t>(it)) return "ui64";
  if (attributes.isa<float>(it)) return "f32";
  if (attributes.isa<double>(it)) return "f64";
  return nullptr;
}

}  // namespace

CallAttributes::CallAttributes(const TargetRow& row, const ffi::Dictionary& attributes)
    : row_(row) {
  for (int i = 0, n = attribute_count(row); i < n; ++i)
    values_[count_++].spec = attribute_spec(word(row.attributes, i));
  decode(attributes);
}

void CallAttributes::decode(const ffi::Dictionary& attributes) {
  for (auto it = attributes.begin(); it != attributes.end(); ++it) {
    const std::string_view name = *it;
    Value* value = nullptr;
    for (int i = 0; i < count_ && !value; ++i)
      if (values_[i].spec.name == name) value = &values_[i];
    if (!value) {
      fail(ffi::ErrorCode::kInvalidArgument,
           "attribute '" + std::string(name) + "': unknown; " +
               (count_ > 0 ? "the target's attributes are " + std::string(row_.attributes)
                           : std::string("the target takes no attributes")));
      return;
    }
    bool decoded = false;
    switch (value->spec.type) {
      case AttributeType::i1: decoded = read(attributes, it, name, value->i1); break;
      case AttributeType::i32: decoded = read(attributes, it, name, value->i32); break;
      case AttributeType::f32: decoded = read(attributes, it, name, value->f32); break;
      case AttributeType::invalid: break;  // refused when the rows compile
    }
    if (!decoded) {
      const char* got = received_type(attributes, it);
      fail(ffi::ErrorCode::kInvalidArgument,
           "attribute '" + std::string(name) + "': expected " +
               type_name(value->spec.type) + ", got " +
               (got ? got : "an attribute that is not a boolean, integer or float scalar"));
      return;
    }
    value->given = true;
  }
  for (int i = 0; i < count_; ++i) {
    const AttributeSpec& spec = values_[i].spec;
    if (!spec.optional && !values_[i].given) {
      fail(ffi::ErrorCode::kInvalidArgument,
           "attribute '" + std::string(spec.name) + "': missing; expected " +
               type_name(spec.type));
      return;
    }
  }
}

bool CallAttributes::i1(std::string_view name) {
  const Value* value = find(name, AttributeType::i1);
  return value && value->i1;
}

int32_t CallAttributes::i32(std::string_view name) {
  const Value* value = find(name, AttributeType::i32);
  return value ? value->i32 : 0;
}

float CallAttributes::f32(std::string_view name) {
  const Value* value = find(name, AttributeType::f32);
  return value ? value->f32 : 0.0f;
}

Presence CallAttributes::presence(std::string_view operand) {
  for (int i = 0; i < count_; ++i) {
    const Value& value = values_[i];
    if (value.spec.optional && value.spec.type == AttributeType::i1 &&
        is_presence_flag(value.spec.name, operand)) {
      if (!value.given) return Presence::by_element_count;
      return value.i1 ? Presence::present : Presence::absent;
    }
  }
  if (ok())
    fail(ffi::ErrorCode::kInternal,
         "the handler asks for the presence of '" + std::string(operand) +
             "', whose optional has_" + std::string(operand) +
             " attribute the target's row does not list (internal error)");
  return Presence::by_element_count;
}

ffi::Error CallAttributes::error() const {
  if (ok()) return ffi::Error::Success();
  return ffi::Error(failure_code_, failure_);
}

const CallAttributes::Value* CallAttributes::find(std::string_view name, AttributeType type) {
  for (int i = 0; i < count_; ++i)
    if (values_[i].spec.name == name && values_[i].spec.type == type) return &values_[i];
  if (ok())
    fail(ffi::ErrorCode::kInternal,
         "the handler reads attribute '" + std::string(name) + "' as " + type_name(type) +
             ", which the target's row does not list (internal error)");
  return nullptr;
}

void CallAttributes::fail(ffi::ErrorCode code, const std::string& why) {
  failure_code_ = code;
  failure_ = std::string(row_.name) + ": " + why;
}

}  // namespace exphil::xla_ffi
