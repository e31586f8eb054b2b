#include "device_memory.hpp"

#include <cstring>

#include "exphil/device.hpp"
#include "exphil/runtime.hpp"

namespace exphil::nif {

namespace {

class Allocation final : public DeviceMemory {
 public:
  Allocation(void* data, std::size_t bytes, int device) : DeviceMemory(data, bytes, device) {}
  ~Allocation() override {
    // device_free waits for work using the memory; every user holds a
    // reference, so by now none is left to enqueue more.
    device_free(data_);
  }
  bool imported() const noexcept override { return false; }
};

class IpcImports {
 public:
  static IpcImports& instance() {
    static IpcImports imports;  // touches no CUDA until used
    return imports;
  }

  Status acquire(const std::string& handle, int device, std::shared_ptr<DeviceMemory>& out);
  void release(const std::string& handle) noexcept;
  std::size_t open() {
    std::lock_guard<std::mutex> lock(mutex_);
    return entries_.size();
  }

 private:
  struct Entry {
    void* data;
    std::size_t bytes;
    int device;
    int holders;
  };
  std::mutex mutex_;
  std::map<std::string, Entry> entries_;
};

class IpcMapping final : public DeviceMemory {
 public:
  IpcMapping(std::string handle, void* data, std::size_t bytes, int device)
      : DeviceMemory(data, bytes, device), handle_(std::move(handle)) {}
  ~IpcMapping() override { IpcImports::instance().release(handle_); }
  bool imported() const noexcept override { return true; }

 private:
  std::string handle_;
};

Status IpcImports::acquire(const std::string& handle, int device, std::shared_ptr<DeviceMemory>& out) {
  std::lock_guard<std::mutex> lock(mutex_);
  auto it = entries_.find(handle);
  if (it == entries_.end()) {
    IpcHandle h;
    std::memcpy(h.bytes, handle.data(), sizeof h.bytes);
    void* data = nullptr;
    std::size_t usable = 0;
    EXPHIL_RETURN_IF_ERROR(ipc_open(device, h, data, usable));
    it = entries_.emplace(handle, Entry{data, usable, device, 0}).first;
  }
  Entry& entry = it->second;
  auto mapping = std::make_shared<IpcMapping>(handle, entry.data, entry.bytes, entry.device);
  ++entry.holders;  // after make_shared: a throw above must not leave a holder behind
  out = std::move(mapping);
  return {};
}

void IpcImports::release(const std::string& handle) noexcept {
  try {
    std::lock_guard<std::mutex> lock(mutex_);
    auto it = entries_.find(handle);
    if (it == entries_.end() || --it->second.holders > 0) return;
    ipc_close(it->second.device, it->second.data);
    entries_.erase(it);
  } catch (...) {
    // Only std::lock_guard could throw (system_error); the mapping then
    // stays open until the process ends, which is safe.
  }
}

}  // namespace

Status allocate_device_memory(int device, std::size_t bytes, std::shared_ptr<DeviceMemory>& out) {
  void* data = nullptr;
  EXPHIL_RETURN_IF_ERROR(device_alloc(device, bytes, data));
  try {
    out = std::make_shared<Allocation>(data, bytes, device);
  } catch (...) {
    device_free(data);
    throw;
  }
  return {};
}

Status import_ipc_memory(const std::string& handle, int device, std::shared_ptr<DeviceMemory>& out) {
  EXPHIL_RETURN_IF_ERROR(require_device(device));
  return IpcImports::instance().acquire(handle, device, out);
}

std::size_t open_ipc_imports() { return IpcImports::instance().open(); }

namespace {

class MemoryView final : public DeviceMemory {
 public:
  MemoryView(std::shared_ptr<DeviceMemory> parent, std::size_t offset)
      : DeviceMemory(static_cast<char*>(parent->data()) + offset, parent->bytes() - offset,
                     parent->device()),
        parent_(std::move(parent)) {}
  bool imported() const noexcept override { return parent_->imported(); }

 private:
  std::shared_ptr<DeviceMemory> parent_;
};

}  // namespace

std::shared_ptr<DeviceMemory> memory_view(std::shared_ptr<DeviceMemory> parent, std::size_t offset) {
  return std::make_shared<MemoryView>(std::move(parent), offset);
}

}  // namespace exphil::nif
