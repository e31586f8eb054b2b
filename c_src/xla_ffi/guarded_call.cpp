#include "guarded_call.hpp"

#include <cstdio>

namespace exphil::xla_ffi {

XLA_FFI_Error* boundary_error(const XLA_FFI_CallFrame* frame, XLA_FFI_Error_Code code,
                              const char* target, const char* what,
                              const char* detail) noexcept {
  // Longer messages are cut; XLA copies the text.
  char message[512];
  std::snprintf(message, sizeof message, "%s: %s%s%s", target, what, detail ? ": " : "",
                detail ? detail : "");
  XLA_FFI_Error_Create_Args args;
  args.struct_size = XLA_FFI_Error_Create_Args_STRUCT_SIZE;
  args.extension_start = nullptr;
  args.message = message;
  args.errc = code;
  return frame->api->XLA_FFI_Error_Create(&args);
}

}  // namespace exphil::xla_ffi
