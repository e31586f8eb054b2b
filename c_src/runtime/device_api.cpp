// exphil/device.hpp: the GPU services a binding needs besides the ops, over
// the runtime's device registry, pointer queries and CUDA status mapping.
#include <cstring>
#include <string>

#include <cuda_runtime_api.h>

#include "api_guard.hpp"
#include "cuda_status.hpp"
#include "device_placement.hpp"
#include "device_registry.hpp"
#include "exphil/device.hpp"
#include "exphil/runtime.hpp"
#include "pointer_query.hpp"
#include "tensor_checks.hpp"

namespace exphil {

namespace {

// Enters `device` for the scope of `scoped`, after checking it exists.
Status enter_device(runtime::ScopedDevice& scoped, int device) {
  EXPHIL_RETURN_IF_ERROR(runtime::DeviceRegistry::instance().require_device(device));
  return scoped.enter(device);
}

cudaEvent_t to_cuda(Event e) { return reinterpret_cast<cudaEvent_t>(e); }

// Creates an event and records it on `stream`, `device` being current. The
// hot path of every synchronous call: no registry lookup (the call's device
// was found already), one device switch for the whole wait.
Status record_current(Stream stream, cudaEvent_t& event) {
  cudaError_t e = cudaEventCreateWithFlags(&event, cudaEventDisableTiming);
  if (e != cudaSuccess) return runtime::cuda_status(e, "cudaEventCreateWithFlags");
  e = cudaEventRecord(event, stream);
  if (e != cudaSuccess) {
    cudaEventDestroy(event);
    event = nullptr;
    return runtime::cuda_status(e, "cudaEventRecord");
  }
  return {};
}

}  // namespace

Status require_device(int device) noexcept {
  return runtime::guarded("require_device",
                          [&] { return runtime::DeviceRegistry::instance().require_device(device); });
}

Status device_info(int device, DeviceInfo& info) noexcept {
  return runtime::guarded("device_info", [&]() -> Status {
    runtime::ScopedDevice scoped;
    EXPHIL_RETURN_IF_ERROR(enter_device(scoped, device));
    cudaDeviceProp prop{};
    cudaError_t e = cudaGetDeviceProperties(&prop, device);
    if (e != cudaSuccess) return runtime::cuda_status(e, "cudaGetDeviceProperties");
    std::size_t free_bytes = 0, total_bytes = 0;
    e = cudaMemGetInfo(&free_bytes, &total_bytes);
    if (e != cudaSuccess) return runtime::cuda_status(e, "cudaMemGetInfo");
    info.name = prop.name;
    info.major = prop.major;
    info.minor = prop.minor;
    info.multiprocessors = prop.multiProcessorCount;
    info.total_memory = total_bytes;
    info.free_memory = free_bytes;
    return {};
  });
}

Status device_synchronize(int device) noexcept {
  return runtime::guarded("device_synchronize", [&]() -> Status {
    runtime::ScopedDevice scoped;
    EXPHIL_RETURN_IF_ERROR(enter_device(scoped, device));
    const cudaError_t e = cudaDeviceSynchronize();
    if (e != cudaSuccess) return runtime::cuda_status(e, "cudaDeviceSynchronize");
    return {};
  });
}

Status stream_create(int device, Stream& stream) noexcept {
  return runtime::guarded("stream_create", [&]() -> Status {
    runtime::ScopedDevice scoped;
    EXPHIL_RETURN_IF_ERROR(enter_device(scoped, device));
    cudaStream_t s = nullptr;
    const cudaError_t e = cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking);
    if (e != cudaSuccess) return runtime::cuda_status(e, "cudaStreamCreateWithFlags");
    stream = s;
    return {};
  });
}

void stream_destroy(int device, Stream stream) noexcept {
  if (!stream) return;
  runtime::ScopedDevice scoped;
  if (scoped.enter(device).ok()) cudaStreamDestroy(stream);
}

Stream legacy_stream() noexcept { return cudaStreamLegacy; }

Status event_record(int device, Stream stream, Event& event) noexcept {
  return runtime::guarded("event_record", [&]() -> Status {
    event = nullptr;
    if (!stream) EXPHIL_RETURN_IF_ERROR(managed_stream(device, stream));
    runtime::ScopedDevice scoped;
    EXPHIL_RETURN_IF_ERROR(scoped.enter(device));
    cudaEvent_t e = nullptr;
    EXPHIL_RETURN_IF_ERROR(record_current(stream, e));
    event = reinterpret_cast<Event>(e);
    return {};
  });
}

Status event_wait(int device, Event event) noexcept {
  return runtime::guarded("event_wait", [&]() -> Status {
    runtime::ScopedDevice scoped;
    EXPHIL_RETURN_IF_ERROR(scoped.enter(device));
    const cudaError_t e = cudaEventSynchronize(to_cuda(event));
    if (e != cudaSuccess) return runtime::cuda_status(e, "cudaEventSynchronize");
    return {};
  });
}

void event_destroy(int device, Event event) noexcept {
  if (!event) return;
  runtime::ScopedDevice scoped;
  if (scoped.enter(device).ok()) cudaEventDestroy(to_cuda(event));
}

Status stream_wait(int device, Stream stream) noexcept {
  return runtime::guarded("stream_wait", [&]() -> Status {
    if (!stream) EXPHIL_RETURN_IF_ERROR(managed_stream(device, stream));
    runtime::ScopedDevice scoped;
    EXPHIL_RETURN_IF_ERROR(scoped.enter(device));
    cudaEvent_t event = nullptr;
    EXPHIL_RETURN_IF_ERROR(record_current(stream, event));
    const cudaError_t e = cudaEventSynchronize(event);
    cudaEventDestroy(event);
    if (e != cudaSuccess) return runtime::cuda_status(e, "cudaEventSynchronize");
    return {};
  });
}

Status copy_and_wait(int device, void* dst, const void* src, std::size_t bytes,
                     CopyDirection direction, Stream stream) noexcept {
  return runtime::guarded("copy_and_wait", [&]() -> Status {
    if (!stream) EXPHIL_RETURN_IF_ERROR(managed_stream(device, stream));
    {
      runtime::ScopedDevice scoped;
      EXPHIL_RETURN_IF_ERROR(scoped.enter(device));
      const cudaMemcpyKind kind = direction == CopyDirection::host_to_device
                                      ? cudaMemcpyHostToDevice
                                      : cudaMemcpyDeviceToHost;
      const cudaError_t e = cudaMemcpyAsync(dst, src, bytes, kind, stream);
      if (e != cudaSuccess) return runtime::cuda_status(e, "cudaMemcpyAsync");
    }
    return stream_wait(device, stream);
  });
}

Status ipc_export(int device, const void* ptr, IpcHandle& handle) noexcept {
  static_assert(sizeof(IpcHandle) == sizeof(cudaIpcMemHandle_t), "a CUDA IPC handle is 64 bytes");
  return runtime::guarded("ipc_export", [&]() -> Status {
    runtime::ScopedDevice scoped;
    EXPHIL_RETURN_IF_ERROR(enter_device(scoped, device));
    cudaIpcMemHandle_t h;
    const cudaError_t e = cudaIpcGetMemHandle(&h, const_cast<void*>(ptr));
    if (e != cudaSuccess) return runtime::cuda_status(e, "cudaIpcGetMemHandle");
    std::memcpy(handle.bytes, &h, sizeof h);
    return {};
  });
}

Status ipc_open(int device, const IpcHandle& handle, void*& ptr, std::size_t& mapped_bytes) noexcept {
  return runtime::guarded("ipc_open", [&]() -> Status {
    runtime::ScopedDevice scoped;
    EXPHIL_RETURN_IF_ERROR(enter_device(scoped, device));
    cudaIpcMemHandle_t h;
    std::memcpy(&h, handle.bytes, sizeof h);
    void* data = nullptr;
    const cudaError_t e = cudaIpcOpenMemHandle(&data, h, cudaIpcMemLazyEnablePeerAccess);
    if (e != cudaSuccess) return runtime::cuda_status(e, "cudaIpcOpenMemHandle");
    runtime::PointerInfo info;
    const Status s = runtime::query_pointer(data, info);
    if (!s.ok()) {
      cudaIpcCloseMemHandle(data);
      return s;
    }
    ptr = data;
    mapped_bytes = info.range_size - (reinterpret_cast<uintptr_t>(data) - info.range_begin);
    return {};
  });
}

void ipc_close(int device, void* ptr) noexcept {
  runtime::ScopedDevice scoped;
  if (scoped.enter(device).ok()) cudaIpcCloseMemHandle(ptr);
}

Status pointer_info(const void* ptr, PointerInfo& info) noexcept {
  return runtime::guarded("pointer_info", [&]() -> Status {
    int count = 0;  // the query needs the runtime initialised
    EXPHIL_RETURN_IF_ERROR(runtime::DeviceRegistry::instance().device_count(count));
    if (count == 0) return runtime::DeviceRegistry::instance().require_device(0);
    runtime::PointerInfo raw;
    EXPHIL_RETURN_IF_ERROR(runtime::query_pointer(ptr, raw));
    switch (raw.kind) {
      case runtime::PointerInfo::Kind::unknown: info.kind = MemoryKind::unregistered; break;
      case runtime::PointerInfo::Kind::host: info.kind = MemoryKind::host; break;
      case runtime::PointerInfo::Kind::device: info.kind = MemoryKind::device; break;
      case runtime::PointerInfo::Kind::managed: info.kind = MemoryKind::managed; break;
    }
    info.device = raw.device;
    info.allocation = reinterpret_cast<const void*>(raw.range_begin);
    info.allocation_bytes = raw.range_size;
    return {};
  });
}

const char* memory_kind_name(MemoryKind kind) noexcept {
  switch (kind) {
    case MemoryKind::unregistered: return runtime::pointer_kind_name(runtime::PointerInfo::Kind::unknown);
    case MemoryKind::host: return runtime::pointer_kind_name(runtime::PointerInfo::Kind::host);
    case MemoryKind::device: return runtime::pointer_kind_name(runtime::PointerInfo::Kind::device);
    case MemoryKind::managed: return runtime::pointer_kind_name(runtime::PointerInfo::Kind::managed);
  }
  return "unknown";
}

Status locate_device(const char* name, const void* ptr, std::size_t bytes, int& device) noexcept {
  return runtime::guarded("locate_device", [&]() -> Status {
    runtime::CallTensors one;
    EXPHIL_RETURN_IF_ERROR(one.add(name, ptr, bytes, false));
    return runtime::locate_device(one, device);
  });
}

const char* cuda_error_name(int cuda_error) noexcept {
  return cudaGetErrorName(static_cast<cudaError_t>(cuda_error));
}

}  // namespace exphil
