// The attributes of one handler call, decoded against its target's row of
// include/exphil/xla_ffi_targets.h. Every handler binds its attributes as one
// ffi::Dictionary, since XLA's per-attribute bindings refuse a call whose
// attribute count differs from theirs, and the has_* attributes may be left
// out. Decoding here keeps the strictness those bindings had: each required
// attribute present with exactly its listed type, and no attribute the row
// does not list, so a caller's typo is an error, never a silent default.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

#include "buffer_views.hpp"
#include "target_rows.hpp"
#include "xla/ffi/api/ffi.h"

namespace exphil::xla_ffi {

namespace ffi = ::xla::ffi;

// Decodes in the constructor. The first problem is recorded (naming the
// target and the attribute) and ok() is then false: read what the handler
// needs, then check ok() before using it. An optional attribute the call
// left out reads as zero (presence: by element count). Asking for an
// attribute that the row does not list with that type is the handler's bug,
// recorded as an internal error.
class CallAttributes {
 public:
  CallAttributes(const TargetRow& row, const ffi::Dictionary& attributes);
  CallAttributes(const CallAttributes&) = delete;
  CallAttributes& operator=(const CallAttributes&) = delete;

  bool i1(std::string_view name);
  int32_t i32(std::string_view name);
  float f32(std::string_view name);
  // The presence of optional operand `operand`, from has_<operand>.
  Presence presence(std::string_view operand);

  bool ok() const noexcept { return failure_.empty(); }
  // The recorded error (invalid argument, or internal for a handler's bug);
  // success if ok().
  ffi::Error error() const;

 private:
  struct Value {
    AttributeSpec spec;
    bool given = false;
    bool i1 = false;
    int32_t i32 = 0;
    float f32 = 0.0f;
  };

  void decode(const ffi::Dictionary& attributes);
  // The value of attribute `name` of type `type`, or nullptr (recorded).
  const Value* find(std::string_view name, AttributeType type);
  void fail(ffi::ErrorCode code, const std::string& why);

  static constexpr int kMaxAttributes = max_attribute_count() > 0 ? max_attribute_count() : 1;
  const TargetRow& row_;
  Value values_[kMaxAttributes] = {};
  int count_ = 0;
  ffi::ErrorCode failure_code_ = ffi::ErrorCode::kOk;
  std::string failure_;
};

}  // namespace exphil::xla_ffi
