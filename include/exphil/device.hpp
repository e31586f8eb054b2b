// What a binding needs of the GPU besides the ops and runtime.hpp's
// library-wide calls: device facts, streams and events it owns, copies
// between host and device, CUDA IPC, and what the driver knows about an
// address. Through these a binding (the NIF, c_src/nif/) never calls the
// CUDA runtime itself: every failure is a Status that names the CUDA call,
// and no_device, with its reason, where there is no GPU. Every function
// makes the device it names current for its own duration only.
#pragma once

#include <cstddef>
#include <string>

#include "exphil/status.hpp"
#include "exphil/tensor.hpp"

namespace exphil {

// ok if `device` is a CUDA device of this machine.
Status require_device(int device) noexcept;

struct DeviceInfo {
  std::string name;
  int major = 0, minor = 0;  // compute capability
  int multiprocessors = 0;
  std::size_t total_memory = 0, free_memory = 0;  // bytes, free as of the call
};
Status device_info(int device, DeviceInfo& info) noexcept;

// Waits for all work on `device` (every stream).
Status device_synchronize(int device) noexcept;

// A non-blocking stream on `device` that the caller owns and destroys;
// work queued on it completes first.
Status stream_create(int device, Stream& stream) noexcept;
void stream_destroy(int device, Stream stream) noexcept;

// The legacy default stream of whichever device is current when it is used
// (cudaStreamLegacy): ordered with a runtime that works on it, as libtorch
// does.
Stream legacy_stream() noexcept;

// Completion markers on a stream. event_record creates one (no timing) and
// records it on `stream` (null: the managed stream of `device`).
using Event = struct exphil_event_marker*;
Status event_record(int device, Stream stream, Event& event) noexcept;
Status event_wait(int device, Event event) noexcept;
void event_destroy(int device, Event event) noexcept;
// Records an event on `stream` and waits for it: the work queued there so
// far is done.
Status stream_wait(int device, Stream stream) noexcept;

// Copies `bytes` between host memory and device memory of `device`,
// ordered on `stream` (null: the managed stream), and waits for the copy.
enum class CopyDirection { host_to_device, device_to_host };
Status copy_and_wait(int device, void* dst, const void* src, std::size_t bytes,
                     CopyDirection direction, Stream stream) noexcept;

// CUDA IPC of memory from device_alloc: a handle another process opens. An
// opened mapping is the whole allocation the handle names; `mapped_bytes`
// is its size from `ptr` on.
struct IpcHandle {
  unsigned char bytes[64];
};
Status ipc_export(int device, const void* ptr, IpcHandle& handle) noexcept;
Status ipc_open(int device, const IpcHandle& handle, void*& ptr, std::size_t& mapped_bytes) noexcept;
void ipc_close(int device, void* ptr) noexcept;

// What the driver knows about an address.
enum class MemoryKind { unregistered, host, device, managed };
struct PointerInfo {
  MemoryKind kind = MemoryKind::unregistered;  // unregistered: not a CUDA allocation
  int device = -1;
  const void* allocation = nullptr;  // the allocation the address lies in
  std::size_t allocation_bytes = 0;
};
Status pointer_info(const void* ptr, PointerInfo& info) noexcept;
const char* memory_kind_name(MemoryKind kind) noexcept;

// The device whose memory holds all of [ptr, ptr + bytes); fails naming
// argument `name` for memory that is not device memory or that the
// allocation does not hold whole.
Status locate_device(const char* name, const void* ptr, std::size_t bytes, int& device) noexcept;

// "cudaErrorInvalidValue" for Status::cuda_error().
const char* cuda_error_name(int cuda_error) noexcept;

}  // namespace exphil
