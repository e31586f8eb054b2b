// exphil::version, device_count, managed_stream, synchronize.
#include "api_guard.hpp"
#include "device_registry.hpp"
#include "exphil/runtime.hpp"

namespace exphil {

const char* version() noexcept { return EXPHIL_VERSION_STRING; }

Status device_count(int& count) noexcept {
  return runtime::guarded("device_count", [&] {
    return runtime::DeviceRegistry::instance().device_count(count);
  });
}

Status managed_stream(int device, Stream& stream) noexcept {
  return runtime::guarded("managed_stream", [&] {
    cudaStream_t s = nullptr;
    Status status = runtime::DeviceRegistry::instance().stream(device, s);
    if (status.ok()) stream = s;
    return status;
  });
}

Status synchronize(int device) noexcept {
  return runtime::guarded("synchronize", [&] {
    return runtime::DeviceRegistry::instance().synchronize(device);
  });
}

}  // namespace exphil
