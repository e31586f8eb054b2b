// Where a call runs: the one device that owns every tensor, and the stream.
#pragma once

#include <cuda_runtime_api.h>

#include "exphil/status.hpp"
#include "exphil/tensor.hpp"
#include "tensor_checks.hpp"

namespace exphil::runtime {

// Asks the driver about each tensor: it must be device (or managed) memory,
// all on one device, and lie wholly inside its allocation.
Status locate_device(const CallTensors& tensors, int& device);

// `requested` if non-null (it must belong to `device`), else the library's
// managed stream for `device`; `capturing` tells whether the stream is being
// captured into a CUDA graph, which rules out some calls (see ops/scan_api.cpp).
Status resolve_stream(int device, Stream requested, cudaStream_t& stream, bool& capturing);

}  // namespace exphil::runtime
