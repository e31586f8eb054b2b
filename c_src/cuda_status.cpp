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
  if (error == cudaErrorMemoryAllocation) return {StatusCode::out_of_memory, std::move(message)};
  if (is_no_device_error(error)) return {StatusCode::no_device, std::move(message)};
  return {StatusCode::cuda_error, std::move(message)};
}

Status with_context(const std::string& context, Status status) {
  if (status.ok()) return status;
  return {status.code(), context + ": " + status.message()};
}

}  // namespace exphil::runtime
