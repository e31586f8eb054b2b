// The outcome of enqueueing kernels: the first failing CUDA call, or success.
// Host-only; shared by every op's launchers.
#pragma once

#include <cuda_runtime_api.h>

namespace exphil::kernels {

struct LaunchResult {
  cudaError_t error = cudaSuccess;
  const char* call = "";
  bool ok() const noexcept { return error == cudaSuccess; }
};

// Launch failures are read with cudaGetLastError, which also reports any
// earlier failed call on this thread (a caller's, or a previous call's on a
// reused scheduler thread); clear that first so it is not taken for ours.
inline void clear_stale_launch_error() noexcept { (void)cudaGetLastError(); }

// After a launch: returns {error, "launch of " what} from the enclosing
// launcher if it failed. `what` is a string literal naming the kernel.
#define EXPHIL_RETURN_IF_LAUNCH_FAILED(what)                                   \
  do {                                                                         \
    if (const cudaError_t e_ = cudaGetLastError(); e_ != cudaSuccess)          \
      return ::exphil::kernels::LaunchResult{e_, "launch of " what};           \
  } while (0)

}  // namespace exphil::kernels
