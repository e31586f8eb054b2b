// exphil::Status to the error an XLA FFI handler returns: the code mapped to
// XLA's nearest, the message prefixed with the target name so that a failure
// deep in a jitted program says which custom call failed.
#pragma once

#include "exphil/status.hpp"
#include "xla/ffi/api/ffi.h"

namespace exphil::xla_ffi {

namespace ffi = ::xla::ffi;

ffi::ErrorCode error_code(StatusCode code) noexcept;

// Success for an ok status; otherwise "<target>: <the library's message>".
ffi::Error to_ffi_error(const char* target, const Status& status);

}  // namespace exphil::xla_ffi
