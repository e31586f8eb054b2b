// Opting a kernel in to more than 48 KB of dynamic shared memory. Host-only;
// shared by every op's launchers.
#pragma once

#include <atomic>
#include <cstdint>

#include <cuda_runtime.h>

namespace exphil::kernels {

// The attribute outlives the call, and a driver call on every launch would
// be host time for nothing, so it is set to `bytes` (the most any plan of
// the kernel asks for) once per device. `done` holds one bit per device;
// devices past 63 simply ask every time.
template <class Kernel>
cudaError_t allow_dynamic_shared_once(Kernel kernel, int bytes, std::atomic<uint64_t>& done) {
  int device = 0;
  if (const cudaError_t e = cudaGetDevice(&device); e != cudaSuccess) return e;
  const uint64_t bit = device < 64 ? uint64_t{1} << device : 0;
  if (bit && (done.load(std::memory_order_acquire) & bit)) return cudaSuccess;
  const cudaError_t e =
      cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes);
  if (e == cudaSuccess && bit) done.fetch_or(bit, std::memory_order_release);
  return e;
}

}  // namespace exphil::kernels
