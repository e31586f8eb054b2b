// Library-wide calls: version, devices, the managed streams.
#pragma once

#include <cstddef>

#include "exphil/status.hpp"
#include "exphil/tensor.hpp"

namespace exphil {

// EXPHIL_VERSION_STRING of the build.
const char* version() noexcept;

// Number of CUDA devices; 0 (and an ok status) without a GPU or driver.
Status device_count(int& count) noexcept;

// The library's non-blocking stream for `device`, created on first use.
Status managed_stream(int device, Stream& stream) noexcept;

// Waits for the managed stream of `device`; ok at once if it never existed.
Status synchronize(int device) noexcept;

// Device memory owned by the library, for callers with no allocator of their
// own (an FFI that wants the library to hold its buffers): cudaMalloc on
// `device`, so 256-byte aligned. `bytes` must be > 0.
Status device_alloc(int device, std::size_t bytes, void*& ptr) noexcept;

// Frees memory from device_alloc (nullptr: nothing to do). Like cudaFree it
// waits for the work on the owning device to finish first.
Status device_free(void* ptr) noexcept;

// Device memory the library holds on a device for its own work, in bytes:
// its stream-ordered workspace pool (reserved from the driver, and the part
// in use by calls still enqueued) and the blocks it keeps for captured
// calls (capture_workspace.hpp). device_alloc's memory is the caller's and
// not counted. For checks that repeated calls do not grow it.
struct MemoryHeld {
  std::size_t workspace_reserved = 0;
  std::size_t workspace_in_use = 0;
  std::size_t capture_blocks = 0;
};
Status memory_held(int device, MemoryHeld& held) noexcept;

}  // namespace exphil
