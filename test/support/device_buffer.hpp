// Device memory for GPU tests: a tensor's bytes between two guard zones, so a
// test sees both unwritten outputs (poison left in place) and writes past
// either end (guards changed). Throws std::runtime_error on CUDA failures,
// which Catch2 reports as a failed test.
#pragma once

#include <cstddef>
#include <string>
#include <vector>

#include "exphil/tensor.hpp"

namespace exphil::test {

class DeviceTensor {
 public:
  static constexpr std::size_t kGuardBytes = 256;

  // Poisoned (every byte 0xFF: NaN in f32, f16 and bf16). `misalign_bytes`
  // shifts the data off 256-byte alignment, e.g. to force the scalar path.
  DeviceTensor(DType dtype, std::vector<int64_t> shape, std::size_t misalign_bytes = 0);
  DeviceTensor(const std::vector<double>& values, DType dtype, std::vector<int64_t> shape,
               std::size_t misalign_bytes = 0);
  ~DeviceTensor();
  DeviceTensor(const DeviceTensor&) = delete;
  DeviceTensor& operator=(const DeviceTensor&) = delete;

  const Tensor& desc() const { return desc_; }
  const Tensor* ptr() const { return &desc_; }
  std::size_t bytes() const { return bytes_; }

  void poison();
  std::vector<double> values() const;
  std::vector<unsigned char> raw() const;
  bool guards_intact() const;

 private:
  unsigned char* base_ = nullptr;
  std::size_t front_ = 0, bytes_ = 0, total_ = 0;
  DType dtype_;
  Tensor desc_{};
};

// True if a CUDA device is usable; otherwise *why says what the runtime said.
bool gpu_available(std::string* why);

// cudaDeviceSynchronize, throwing with the error's name on failure.
void device_synchronize();

}  // namespace exphil::test
