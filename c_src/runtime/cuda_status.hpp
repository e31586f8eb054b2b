// Turning CUDA results into exphil::Status values that name the failed call.
#pragma once

#include <cuda_runtime_api.h>

#include "exphil/status.hpp"

namespace exphil::runtime {

// "<call> failed: cudaErrorX (description)", with the code mapped to
// no_device, out_of_memory or cuda_error.
Status cuda_status(cudaError_t error, const char* call);

// True for the results that mean "no GPU or no usable driver here".
bool is_no_device_error(cudaError_t error) noexcept;

// Status with `context` prefixed to the message ("min_gru forward: ...").
Status with_context(const std::string& context, Status status);

}  // namespace exphil::runtime
