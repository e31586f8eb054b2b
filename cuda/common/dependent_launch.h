// Launching a kernel as a programmatic dependent of the kernel before it in
// its stream (host side; the device side is dependent_launch.cuh). Host-only;
// shared by every op's launchers.
//
// A dependent's blocks may be placed on the GPU before the kernel before it
// has finished, so its launch and the other's tail overlap; a kernel
// launched this way must call wait_for_prior_grid() before it touches
// global memory. Whether a kernel can be: griddepcontrol exists only in code
// compiled for sm_90 or later, and an sm_90 device running PTX compiled for
// sm_80 (a build without an sm_90 target) has no wait in it at all. So the
// test is the PTX version of the code the device actually runs
// (cudaFuncAttributes::ptxVersion), not the device.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>

#include <cuda_runtime.h>

namespace exphil::kernels {

// Whether `kernel`, as the current device runs it, waits for its
// predecessor when launched as a dependent. Asked of the driver once per
// device (the first 64; later ones ask every time), like
// allow_dynamic_shared_once().
class DependentLaunch {
 public:
  template <class Kernel>
  cudaError_t supported(Kernel kernel, bool& out) noexcept {
    int device = 0;
    if (const cudaError_t e = cudaGetDevice(&device); e != cudaSuccess) return e;
    const uint64_t bit = device < 64 ? uint64_t{1} << device : 0;
    if (bit && (known_.load(std::memory_order_acquire) & bit)) {
      out = (supported_.load(std::memory_order_relaxed) & bit) != 0;
      return cudaSuccess;
    }
    cudaFuncAttributes attributes{};
    if (const cudaError_t e = cudaFuncGetAttributes(&attributes, kernel); e != cudaSuccess)
      return e;
    out = attributes.ptxVersion >= 90;
    if (bit) {
      if (out) supported_.fetch_or(bit, std::memory_order_relaxed);
      known_.fetch_or(bit, std::memory_order_release);
    }
    return cudaSuccess;
  }

 private:
  std::atomic<uint64_t> known_{0}, supported_{0};
};

// Enqueues kernel<<<grid, block, smem, stream>>>(args...), as a
// programmatic dependent of the stream's previous kernel when `dependent`.
template <class... Params, class... Args>
cudaError_t launch_kernel(void (*kernel)(Params...), dim3 grid, dim3 block, std::size_t smem,
                          bool dependent, cudaStream_t stream, const Args&... args) noexcept {
  cudaLaunchAttribute attribute{};
  attribute.id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attribute.val.programmaticStreamSerializationAllowed = 1;
  cudaLaunchConfig_t config{};
  config.gridDim = grid;
  config.blockDim = block;
  config.dynamicSmemBytes = smem;
  config.stream = stream;
  config.attrs = &attribute;
  config.numAttrs = dependent ? 1 : 0;
  return cudaLaunchKernelEx(&config, kernel, args...);
}

}  // namespace exphil::kernels
