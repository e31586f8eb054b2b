// What every benchmark section needs besides timing: device memory that
// frees itself, and failed library calls turned into exceptions (main
// reports them and exits non-zero).
#pragma once

#include <algorithm>
#include <cstddef>
#include <stdexcept>
#include <string>

#include <cuda_runtime_api.h>

#include "exphil/status.hpp"
#include "timing.hpp"

namespace exphil::bench {

class DeviceMemory {
 public:
  explicit DeviceMemory(std::size_t bytes) {
    check_cuda(cudaMalloc(&ptr_, std::max<std::size_t>(bytes, 1)), "cudaMalloc");
  }
  ~DeviceMemory() { cudaFree(ptr_); }
  DeviceMemory(const DeviceMemory&) = delete;
  DeviceMemory& operator=(const DeviceMemory&) = delete;
  void* get() const { return ptr_; }

 private:
  void* ptr_ = nullptr;
};

inline void require(const Status& s, const char* what) {
  if (!s.ok()) throw std::runtime_error(std::string(what) + ": " + s.message());
}

}  // namespace exphil::bench
