// exphil::version, device_count, managed_stream, synchronize, device_alloc,
// device_free, memory_held.
#include <cstdint>
#include <string>

#include "api_guard.hpp"
#include "capture_workspace.hpp"
#include "cuda_status.hpp"
#include "device_registry.hpp"
#include "exphil/runtime.hpp"
#include "format.hpp"
#include "pointer_query.hpp"

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

Status device_alloc(int device, std::size_t bytes, void*& ptr) noexcept {
  return runtime::guarded("device_alloc", [&] {
    ptr = nullptr;
    if (bytes == 0)
      return Status(StatusCode::invalid_argument,
                    "device_alloc: argument 'bytes' must be > 0, got 0");
    auto& registry = runtime::DeviceRegistry::instance();
    EXPHIL_RETURN_IF_ERROR(registry.require_device(device));
    runtime::ScopedDevice scoped;
    EXPHIL_RETURN_IF_ERROR(scoped.enter(device));
    void* data = nullptr;
    const cudaError_t e = cudaMalloc(&data, bytes);
    if (e != cudaSuccess) return runtime::cuda_status(e, "cudaMalloc");
    ptr = data;
    return Status();
  });
}

Status device_free(void* ptr) noexcept {
  return runtime::guarded("device_free", [&] {
    if (!ptr) return Status();
    int count = 0;
    EXPHIL_RETURN_IF_ERROR(runtime::DeviceRegistry::instance().device_count(count));
    // Only a whole allocation of device memory may be freed: anything else
    // (an interior pointer, host memory) is the caller's bug, and handing it
    // to cudaFree could free memory someone else owns.
    runtime::PointerInfo info;
    EXPHIL_RETURN_IF_ERROR(runtime::query_pointer(ptr, info));
    if (info.kind != runtime::PointerInfo::Kind::device ||
        info.range_begin != reinterpret_cast<uintptr_t>(ptr))
      return Status(StatusCode::invalid_argument,
                    std::string("device_free: argument 'ptr' must be an address returned by "
                                "device_alloc, got ") +
                        runtime::pointer_string(ptr) + " (" +
                        runtime::pointer_kind_name(info.kind) +
                        (info.kind == runtime::PointerInfo::Kind::device
                             ? ", not the start of its allocation)"
                             : ")"));
    runtime::ScopedDevice scoped;
    EXPHIL_RETURN_IF_ERROR(scoped.enter(info.device));
    const cudaError_t e = cudaFree(ptr);
    if (e != cudaSuccess) return runtime::cuda_status(e, "cudaFree");
    return Status();
  });
}

Status memory_held(int device, MemoryHeld& held) noexcept {
  return runtime::guarded("memory_held", [&]() -> Status {
    cudaMemPool_t pool = nullptr;
    EXPHIL_RETURN_IF_ERROR(runtime::DeviceRegistry::instance().existing_workspace_pool(device, pool));
    MemoryHeld h;
    if (pool) {
      std::uint64_t reserved = 0, used = 0;
      cudaError_t e = cudaMemPoolGetAttribute(pool, cudaMemPoolAttrReservedMemCurrent, &reserved);
      if (e != cudaSuccess)
        return runtime::cuda_status(e, "cudaMemPoolGetAttribute(ReservedMemCurrent)");
      e = cudaMemPoolGetAttribute(pool, cudaMemPoolAttrUsedMemCurrent, &used);
      if (e != cudaSuccess) return runtime::cuda_status(e, "cudaMemPoolGetAttribute(UsedMemCurrent)");
      h.workspace_reserved = static_cast<std::size_t>(reserved);
      h.workspace_in_use = static_cast<std::size_t>(used);
    }
    h.capture_blocks = runtime::capture_blocks_bytes(device);
    held = h;
    return Status{};
  });
}

}  // namespace exphil
