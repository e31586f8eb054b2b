// What every op does between validation and its kernels: find the device
// that owns the tensors, make it current, resolve the stream, and take
// stream-ordered workspace memory around the launch.
#pragma once

#include <cstddef>

#include <cuda_runtime_api.h>

#include "common/launch_result.h"
#include "cuda_status.hpp"
#include "device_registry.hpp"
#include "exphil/status.hpp"
#include "exphil/tensor.hpp"
#include "tensor_checks.hpp"

namespace exphil::runtime {

class LaunchContext {
 public:
  // Locates the tensors' device, enters it for this object's lifetime, and
  // resolves `requested` (or the managed stream).
  Status prepare(const CallTensors& tensors, Stream requested);

  int device() const noexcept { return device_; }
  cudaStream_t stream() const noexcept { return stream_; }
  int sm_count() const noexcept { return architecture_.sm_count; }
  int compute_capability() const noexcept { return architecture_.compute_capability; }
  const DeviceArchitecture& architecture() const noexcept { return architecture_; }

  // Takes `bytes` of workspace (null for 0), runs launch(float* d_workspace,
  // cudaStream_t) -> kernels::LaunchResult, and releases the workspace on the
  // stream. After a failed launch, the launch's error is the one returned.
  template <class Launch>
  Status run_with_workspace(std::size_t bytes, const char* what, Launch&& launch) const {
    void* d_workspace = nullptr;
    EXPHIL_RETURN_IF_ERROR(allocate_workspace(bytes, &d_workspace, what));
    const kernels::LaunchResult launched = launch(static_cast<float*>(d_workspace), stream_);
    EXPHIL_RETURN_IF_ERROR(free_workspace(d_workspace, what, launched.ok()));
    if (!launched.ok()) return cuda_status(launched.error, launched.call);
    return {};
  }

 private:
  // `bytes` of device memory ordered on the stream: from the library's pool
  // normally; while the stream is captured, a block that the graph owns
  // (capture_workspace.hpp), so that the graph holds no allocation node and
  // can be nested in another. Null for 0 bytes. `what` names it in errors.
  Status allocate_workspace(std::size_t bytes, void** out, const char* what) const;
  // Enqueues the release (nothing to do for a captured block, which goes
  // back when its graph does); `report` = false after a failed launch.
  Status free_workspace(void* p, const char* what, bool report) const;

  ScopedDevice scoped_;
  int device_ = -1;
  cudaStream_t stream_ = nullptr;
  bool capturing_ = false;
  DeviceArchitecture architecture_;
};

}  // namespace exphil::runtime
