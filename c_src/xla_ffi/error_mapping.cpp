#include "error_mapping.hpp"

#include <string>
#include <utility>

namespace exphil::xla_ffi {

ffi::ErrorCode error_code(StatusCode code) noexcept {
  switch (code) {
    case StatusCode::ok: return ffi::ErrorCode::kOk;
    case StatusCode::invalid_argument: return ffi::ErrorCode::kInvalidArgument;
    case StatusCode::not_supported: return ffi::ErrorCode::kUnimplemented;
    case StatusCode::out_of_memory: return ffi::ErrorCode::kResourceExhausted;
    case StatusCode::no_device: return ffi::ErrorCode::kUnavailable;
    case StatusCode::cuda_error: return ffi::ErrorCode::kInternal;
    case StatusCode::internal: return ffi::ErrorCode::kInternal;
  }
  return ffi::ErrorCode::kInternal;
}

ffi::Error to_ffi_error(const char* target, const Status& status) {
  if (status.ok()) return ffi::Error::Success();
  // The library leaves the message empty only when it ran out of host memory
  // while building it.
  std::string message = std::string(target) + ": ";
  if (status.message().empty())
    message += "out of host memory";
  else
    message += status.message();
  return ffi::Error(error_code(status.code()), std::move(message));
}

}  // namespace exphil::xla_ffi
