// The boundary between XLA and a handler: nothing thrown inside (by call-frame
// decoding, by the FFI bindings' own allocations, or by us) may reach XLA,
// which calls handlers through a C function pointer.
#pragma once

#include <exception>
#include <new>

#include "xla/ffi/api/c_api.h"

namespace exphil::xla_ffi {

// A new XLA error "<target>: <what>[: <detail>]" made with the call frame's
// API. Builds the message without allocating, so it also works out of host
// memory. detail may be NULL.
XLA_FFI_Error* boundary_error(const XLA_FFI_CallFrame* frame, XLA_FFI_Error_Code code,
                              const char* target, const char* what,
                              const char* detail = nullptr) noexcept;

// Returns call(frame), or an XLA error naming `target` if it threw.
template <class Call>
XLA_FFI_Error* guarded_call(const char* target, XLA_FFI_CallFrame* frame, Call&& call) noexcept {
  try {
    return call(frame);
  } catch (const std::bad_alloc&) {
    return boundary_error(frame, XLA_FFI_Error_Code_RESOURCE_EXHAUSTED, target,
                          "out of host memory");
  } catch (const std::exception& e) {
    return boundary_error(frame, XLA_FFI_Error_Code_INTERNAL, target,
                          "unexpected C++ exception", e.what());
  } catch (...) {
    return boundary_error(frame, XLA_FFI_Error_Code_INTERNAL, target,
                          "unexpected C++ exception");
  }
}

}  // namespace exphil::xla_ffi
