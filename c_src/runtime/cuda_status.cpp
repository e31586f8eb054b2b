#include "cuda_status.hpp"

#include <string>

namespace exphil::runtime {

bool is_no_device_error(cudaError_t error) noexcept {
  return error == cudaErrorNoDevice || error == cudaErrorInsufficientDriver ||
         error == cudaErrorDevicesUnavailable || error == cudaErrorCompatNotSupportedOnDevice ||
         error == cudaErrorSystemDriverMismatch;
}

Status cuda_status(cudaError_t error, const char* call) {
  std::string message = std::string(call) + " failed: " + cudaGetErrorName(error) + " (" +
                        cudaGetErrorString(error) + ")";
  const StatusCode code = error == cudaErrorMemoryAllocation ? StatusCode::out_of_memory
                          : is_no_device_error(error)         ? StatusCode::no_device
                                                               : StatusCode::cuda_error;
  return {code, std::move(message), static_cast<int>(error)};
}

Status with_context(const std::string& context, Status status) {
  if (status.ok()) return status;
  return {status.code(), context + ": " + status.message(), status.cuda_error()};
}

}  // namespace exphil::runtime
