// Per-device state the library owns, created lazily on first use and never in
// a static initialiser: the managed non-blocking stream, the memory pool for
// kernel workspaces, and the multiprocessor count and compute capability
// the planners need.
//
// Thread-safe. The CUDA objects are deliberately never destroyed: at process
// exit the CUDA runtime may already be gone, and destroying a stream then is
// itself an error; the driver reclaims everything with the process.
#pragma once

#include <mutex>
#include <string>
#include <vector>

#include <cuda_runtime_api.h>

#include "exphil/status.hpp"

namespace exphil::runtime {

// What the planners need of a device, read from it once.
struct DeviceArchitecture {
  int sm_count = 0;
  int compute_capability = 0;      // 10 * major + minor, e.g. 90 for an H100
  int max_shared_per_block = 0;    // opt-in maximum, bytes
  int max_shared_per_sm = 0;       // bytes
};

class DeviceRegistry {
 public:
  static DeviceRegistry& instance() noexcept;

  // Number of devices; 0 with an ok status when there is no GPU or driver.
  Status device_count(int& count);
  // ok if `device` exists; no_device (with the driver's reason) when there
  // is no GPU, invalid_argument when the index is out of range.
  Status require_device(int device);
  // The device's numbers, read from it once (a call's planning then makes
  // no driver call).
  Status architecture(int device, DeviceArchitecture& out);
  Status stream(int device, cudaStream_t& stream);
  Status workspace_pool(int device, cudaMemPool_t& pool);
  // The workspace pool if a call has created it, else nullptr (creates none).
  Status existing_workspace_pool(int device, cudaMemPool_t& pool);
  Status synchronize(int device);

 private:
  DeviceRegistry() = default;

  struct Device {
    cudaStream_t stream = nullptr;
    cudaMemPool_t pool = nullptr;
    DeviceArchitecture architecture;  // sm_count 0: not read yet
  };

  Status count_locked();  // mutex_ held
  Status require_device_locked(int device);  // mutex_ held

  std::mutex mutex_;
  bool counted_ = false;
  int count_ = 0;
  std::string no_device_reason_;
  std::vector<Device> devices_;
};

// Makes `device` current for the lifetime of the object and restores the
// caller's device afterwards, so a call never changes the thread's device.
class ScopedDevice {
 public:
  ScopedDevice() = default;
  ScopedDevice(const ScopedDevice&) = delete;
  ScopedDevice& operator=(const ScopedDevice&) = delete;
  ~ScopedDevice();
  Status enter(int device);

 private:
  int previous_ = -1;
};

}  // namespace exphil::runtime
