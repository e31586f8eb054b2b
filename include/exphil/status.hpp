// exphil::Status: the result of every C++ API call. The C ABI returns the
// same codes as plain integers.
#pragma once

#include <string>
#include <utility>

#include "exphil/exphil.h"

namespace exphil {

enum class StatusCode : int {
  ok = EXPHIL_OK,
  invalid_argument = EXPHIL_ERROR_INVALID_ARGUMENT,
  no_device = EXPHIL_ERROR_NO_DEVICE,
  out_of_memory = EXPHIL_ERROR_OUT_OF_MEMORY,
  cuda_error = EXPHIL_ERROR_CUDA,
  not_supported = EXPHIL_ERROR_NOT_SUPPORTED,
  internal = EXPHIL_ERROR_INTERNAL,
};

class Status {
 public:
  Status() noexcept = default;
  Status(StatusCode code, std::string message) noexcept
      : code_(code), message_(std::move(message)) {}
  // A failure reported by CUDA: `cuda_error` is the cudaError_t value.
  Status(StatusCode code, std::string message, int cuda_error) noexcept
      : code_(code), message_(std::move(message)), cuda_error_(cuda_error) {}

  bool ok() const noexcept { return code_ == StatusCode::ok; }
  StatusCode code() const noexcept { return code_; }
  const std::string& message() const noexcept { return message_; }
  // The cudaError_t behind the failure, or 0 if CUDA did not report it.
  int cuda_error() const noexcept { return cuda_error_; }

 private:
  StatusCode code_ = StatusCode::ok;
  std::string message_;
  int cuda_error_ = 0;
};

}  // namespace exphil

// Returns from the enclosing function if `expr` yields a failed Status.
#define EXPHIL_RETURN_IF_ERROR(expr)                  \
  do {                                                \
    ::exphil::Status exphil_status_ = (expr);         \
    if (!exphil_status_.ok()) return exphil_status_;  \
  } while (0)
