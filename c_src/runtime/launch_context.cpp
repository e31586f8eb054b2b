#include "launch_context.hpp"

#include <string>

#include "capture_workspace.hpp"
#include "cuda_status.hpp"
#include "device_placement.hpp"

namespace exphil::runtime {

Status LaunchContext::prepare(const CallTensors& tensors, Stream requested) {
  EXPHIL_RETURN_IF_ERROR(locate_device(tensors, device_));
  EXPHIL_RETURN_IF_ERROR(scoped_.enter(device_));
  EXPHIL_RETURN_IF_ERROR(resolve_stream(device_, requested, stream_, capturing_));
  return DeviceRegistry::instance().architecture(device_, architecture_);
}

Status LaunchContext::allocate_workspace(std::size_t bytes, void** out, const char* what) const {
  *out = nullptr;
  if (bytes == 0) return {};
  if (capturing_) return capture_workspace(device_, stream_, bytes, out, what);
  cudaMemPool_t pool = nullptr;
  EXPHIL_RETURN_IF_ERROR(DeviceRegistry::instance().workspace_pool(device_, pool));
  const cudaError_t e = cudaMallocFromPoolAsync(out, bytes, pool, stream_);
  if (e != cudaSuccess)
    return cuda_status(e, (std::string("cudaMallocFromPoolAsync (") + what + ")").c_str());
  return {};
}

Status LaunchContext::free_workspace(void* p, const char* what, bool report) const {
  if (!p || capturing_) return {};  // a captured block belongs to the graph
  const cudaError_t e = cudaFreeAsync(p, stream_);
  if (report && e != cudaSuccess)
    return cuda_status(e, (std::string("cudaFreeAsync (") + what + ")").c_str());
  return {};
}

}  // namespace exphil::runtime
