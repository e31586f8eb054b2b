#include "device_registry.hpp"

#include <cstdint>
#include <string>

#include "cuda_status.hpp"

namespace exphil::runtime {

namespace {
// Freed blocks above this stay cached in the pool across synchronisations,
// so a call that needs a workspace does not reach the driver's allocator.
constexpr uint64_t kPoolReleaseThreshold = 64ull << 20;

// "12.8" from 12080, as cudaDriverGetVersion and cudaRuntimeGetVersion give it.
std::string cuda_version_text(int version) {
  return std::to_string(version / 1000) + "." + std::to_string(version % 1000 / 10);
}

// Why there is no device, in words one can act on. With no driver at all,
// the runtime's cudaErrorInsufficientDriver reads "CUDA driver version is
// insufficient", as if the driver were old; cudaDriverGetVersion tells the
// two apart (0: no driver).
std::string no_device_reason(cudaError_t e) {
  const std::string call = std::string("cudaGetDeviceCount: ") + cudaGetErrorName(e);
  int driver = 0, runtime = 0;
  if (e == cudaErrorInsufficientDriver && cudaDriverGetVersion(&driver) == cudaSuccess) {
    if (driver == 0) return "no NVIDIA driver found (" + call + ")";
    if (cudaRuntimeGetVersion(&runtime) == cudaSuccess)
      return "the NVIDIA driver supports CUDA " + cuda_version_text(driver) +
             ", older than this build's CUDA runtime " + cuda_version_text(runtime) + " (" +
             call + ")";
  }
  return call + " (" + cudaGetErrorString(e) + ")";
}
}  // namespace

DeviceRegistry& DeviceRegistry::instance() noexcept {
  static DeviceRegistry registry;  // constructor touches no CUDA
  return registry;
}

Status DeviceRegistry::count_locked() {
  if (counted_) return {};
  int count = 0;
  const cudaError_t e = cudaGetDeviceCount(&count);
  if (e == cudaSuccess) {
    count_ = count;
  } else if (is_no_device_error(e)) {
    count_ = 0;
    no_device_reason_ = no_device_reason(e);
    cudaGetLastError();  // the runtime records the failure; do not leak it to later calls
  } else {
    return cuda_status(e, "cudaGetDeviceCount");
  }
  devices_.assign(static_cast<size_t>(count_), Device{});
  counted_ = true;
  return {};
}

Status DeviceRegistry::device_count(int& count) {
  std::lock_guard<std::mutex> lock(mutex_);
  EXPHIL_RETURN_IF_ERROR(count_locked());
  count = count_;
  return {};
}

Status DeviceRegistry::require_device(int device) {
  std::lock_guard<std::mutex> lock(mutex_);
  return require_device_locked(device);
}

Status DeviceRegistry::require_device_locked(int device) {
  EXPHIL_RETURN_IF_ERROR(count_locked());
  if (count_ == 0) return {StatusCode::no_device, "no CUDA device: " + no_device_reason_};
  if (device < 0 || device >= count_)
    return {StatusCode::invalid_argument, "device " + std::to_string(device) +
                                              " does not exist (this machine has " +
                                              std::to_string(count_) + ")"};
  return {};
}

Status DeviceRegistry::architecture(int device, DeviceArchitecture& out) {
  std::lock_guard<std::mutex> lock(mutex_);
  EXPHIL_RETURN_IF_ERROR(require_device_locked(device));
  DeviceArchitecture& a = devices_[static_cast<size_t>(device)].architecture;
  if (a.sm_count == 0) {
    DeviceArchitecture read;
    int major = 0, minor = 0;
    const struct {
      int* value;
      cudaDeviceAttr attribute;
      const char* call;
    } reads[] = {
        {&read.sm_count, cudaDevAttrMultiProcessorCount, "cudaDeviceGetAttribute(MultiProcessorCount)"},
        {&major, cudaDevAttrComputeCapabilityMajor, "cudaDeviceGetAttribute(ComputeCapabilityMajor)"},
        {&minor, cudaDevAttrComputeCapabilityMinor, "cudaDeviceGetAttribute(ComputeCapabilityMinor)"},
        {&read.max_shared_per_block, cudaDevAttrMaxSharedMemoryPerBlockOptin,
         "cudaDeviceGetAttribute(MaxSharedMemoryPerBlockOptin)"},
        {&read.max_shared_per_sm, cudaDevAttrMaxSharedMemoryPerMultiprocessor,
         "cudaDeviceGetAttribute(MaxSharedMemoryPerMultiprocessor)"},
    };
    for (const auto& r : reads)
      if (const cudaError_t e = cudaDeviceGetAttribute(r.value, r.attribute, device); e != cudaSuccess)
        return cuda_status(e, r.call);
    read.compute_capability = 10 * major + minor;
    a = read;  // a nonzero sm_count marks all as known
  }
  out = a;
  return {};
}

Status DeviceRegistry::stream(int device, cudaStream_t& stream) {
  std::lock_guard<std::mutex> lock(mutex_);
  EXPHIL_RETURN_IF_ERROR(require_device_locked(device));
  Device& d = devices_[static_cast<size_t>(device)];
  if (!d.stream) {
    ScopedDevice scoped;
    EXPHIL_RETURN_IF_ERROR(scoped.enter(device));
    cudaStream_t s = nullptr;
    const cudaError_t e = cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking);
    if (e != cudaSuccess) return cuda_status(e, "cudaStreamCreateWithFlags");
    d.stream = s;
  }
  stream = d.stream;
  return {};
}

Status DeviceRegistry::workspace_pool(int device, cudaMemPool_t& pool) {
  std::lock_guard<std::mutex> lock(mutex_);
  EXPHIL_RETURN_IF_ERROR(require_device_locked(device));
  Device& d = devices_[static_cast<size_t>(device)];
  if (!d.pool) {
    cudaMemPoolProps props{};
    props.allocType = cudaMemAllocationTypePinned;
    props.location.type = cudaMemLocationTypeDevice;
    props.location.id = device;
    cudaMemPool_t p = nullptr;
    cudaError_t e = cudaMemPoolCreate(&p, &props);
    if (e != cudaSuccess) return cuda_status(e, "cudaMemPoolCreate");
    uint64_t threshold = kPoolReleaseThreshold;
    e = cudaMemPoolSetAttribute(p, cudaMemPoolAttrReleaseThreshold, &threshold);
    if (e != cudaSuccess) {
      cudaMemPoolDestroy(p);
      return cuda_status(e, "cudaMemPoolSetAttribute(ReleaseThreshold)");
    }
    d.pool = p;
  }
  pool = d.pool;
  return {};
}

Status DeviceRegistry::existing_workspace_pool(int device, cudaMemPool_t& pool) {
  std::lock_guard<std::mutex> lock(mutex_);
  EXPHIL_RETURN_IF_ERROR(require_device_locked(device));
  pool = devices_[static_cast<size_t>(device)].pool;
  return {};
}

Status DeviceRegistry::synchronize(int device) {
  EXPHIL_RETURN_IF_ERROR(require_device(device));
  cudaStream_t s = nullptr;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    s = devices_[static_cast<size_t>(device)].stream;
  }
  if (!s) return {};
  // Outside the lock: other threads keep launching while this one waits.
  const cudaError_t e = cudaStreamSynchronize(s);
  if (e != cudaSuccess) return cuda_status(e, "cudaStreamSynchronize");
  return {};
}

ScopedDevice::~ScopedDevice() {
  if (previous_ >= 0) cudaSetDevice(previous_);
}

Status ScopedDevice::enter(int device) {
  int current = 0;
  cudaError_t e = cudaGetDevice(&current);
  if (e != cudaSuccess) return cuda_status(e, "cudaGetDevice");
  if (current == device) return {};
  e = cudaSetDevice(device);
  if (e != cudaSuccess) return cuda_status(e, "cudaSetDevice");
  previous_ = current;
  return {};
}

}  // namespace exphil::runtime
