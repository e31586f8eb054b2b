// Device memory the NIF holds on behalf of Elixir: allocations it made, and
// CUDA IPC imports. Both are shared: a Buffer resource, and every call or
// pending event that uses the memory, hold a reference, so memory is
// released only when the last of them is done with it (an explicit free/1
// drops the Buffer's reference; work in flight keeps it alive).
#pragma once

#include <cstddef>
#include <map>
#include <memory>
#include <mutex>
#include <string>

#include "exphil/status.hpp"

namespace exphil::nif {

class DeviceMemory {
 public:
  virtual ~DeviceMemory() = default;
  void* data() const noexcept { return data_; }
  std::size_t bytes() const noexcept { return bytes_; }
  int device() const noexcept { return device_; }
  virtual bool imported() const noexcept = 0;

 protected:
  DeviceMemory(void* data, std::size_t bytes, int device) : data_(data), bytes_(bytes), device_(device) {}
  void* data_;
  std::size_t bytes_;
  int device_;
};

// Memory from exphil::device_alloc (cudaMalloc'd, so it can be exported
// through CUDA IPC).
Status allocate_device_memory(int device, std::size_t bytes, std::shared_ptr<DeviceMemory>& out);

// Opens a 64-byte CUDA IPC handle on `device`, once per handle in this
// process: later imports of the same handle share the mapping, which is
// closed when the last holder lets go. bytes() is the size of the mapped
// allocation.
Status import_ipc_memory(const std::string& handle, int device, std::shared_ptr<DeviceMemory>& out);

// Number of IPC handles open now (for tests).
std::size_t open_ipc_imports();

// The part of `parent` from `offset` bytes on (offset < parent->bytes()),
// holding `parent` alive: an IPC handle names a whole allocation, and a
// tensor another runtime exported may start inside it (Torchx's, in
// libtorch's caching allocator).
std::shared_ptr<DeviceMemory> memory_view(std::shared_ptr<DeviceMemory> parent, std::size_t offset);

}  // namespace exphil::nif
