// What every op does between validation and its kernels: find the device
// that owns the tensors, make it current, resolve the stream, and take
// stream-ordered workspace memory.
#pragma once

#include <cstddef>

#include <cuda_runtime_api.h>

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
  int sm_count() const noexcept { return sm_count_; }

  // `bytes` of device memory ordered on the stream: from the library's pool
  // normally; while the stream is captured, a block that the graph owns
  // (capture_workspace.hpp), so that the graph holds no allocation node and
  // can be nested in another. Null for 0 bytes. `what` names it in errors.
  Status allocate_workspace(std::size_t bytes, void** out, const char* what) const;
  // Enqueues the release (nothing to do for a captured block, which goes
  // back when its graph does); after a failed launch only the launch's error
  // is reported, so pass `report` = false then.
  Status free_workspace(void* p, const char* what, bool report) const;

 private:
  ScopedDevice scoped_;
  int device_ = -1;
  cudaStream_t stream_ = nullptr;
  bool capturing_ = false;
  int sm_count_ = 0;
};

}  // namespace exphil::runtime
