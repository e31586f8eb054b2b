#include "device_buffer.hpp"

#include <stdexcept>
#include <string>

#include <cuda_runtime_api.h>

#include "dtype_codec.hpp"
#include "exphil/runtime.hpp"

namespace exphil::test {

namespace {

void check(cudaError_t e, const char* call) {
  if (e != cudaSuccess)
    throw std::runtime_error(std::string(call) + " failed: " + cudaGetErrorName(e) + " (" +
                             cudaGetErrorString(e) + ")");
}

std::size_t element_count(const std::vector<int64_t>& shape) {
  std::size_t n = 1;
  for (int64_t d : shape) n *= static_cast<std::size_t>(d);
  return n;
}

}  // namespace

DeviceTensor::DeviceTensor(DType dtype, std::vector<int64_t> shape, std::size_t misalign_bytes)
    : dtype_(dtype) {
  bytes_ = element_count(shape) * dtype_size(dtype);
  front_ = kGuardBytes + misalign_bytes;
  total_ = front_ + bytes_ + kGuardBytes;
  void* p = nullptr;
  check(cudaMalloc(&p, total_), "cudaMalloc");
  base_ = static_cast<unsigned char*>(p);
  desc_.data = base_ + front_;
  desc_.dtype = static_cast<int32_t>(dtype);
  desc_.rank = static_cast<int32_t>(shape.size());
  for (std::size_t i = 0; i < shape.size(); ++i) desc_.shape[i] = shape[i];
  poison();
}

DeviceTensor::DeviceTensor(const std::vector<double>& values, DType dtype,
                           std::vector<int64_t> shape, std::size_t misalign_bytes)
    : DeviceTensor(dtype, std::move(shape), misalign_bytes) {
  const std::vector<unsigned char> bytes = encode(values, dtype);
  if (bytes.size() != bytes_) throw std::runtime_error("DeviceTensor: value count does not match shape");
  check(cudaMemcpy(base_ + front_, bytes.data(), bytes_, cudaMemcpyHostToDevice), "cudaMemcpy H2D");
  check(cudaDeviceSynchronize(), "cudaDeviceSynchronize after cudaMemcpy H2D");
}

DeviceTensor::~DeviceTensor() { cudaFree(base_); }

// cudaMemset and a pageable cudaMemcpy run on the legacy default stream and
// may still be in flight when they return; the library's streams are
// non-blocking and do not wait for that stream. Wait here, or the poison
// could land after a kernel's writes (seen once under 14 test processes).
void DeviceTensor::poison() {
  check(cudaMemset(base_, 0xFF, total_), "cudaMemset");
  check(cudaDeviceSynchronize(), "cudaDeviceSynchronize after cudaMemset");
}

std::vector<unsigned char> DeviceTensor::raw() const {
  std::vector<unsigned char> bytes(bytes_);
  check(cudaMemcpy(bytes.data(), base_ + front_, bytes_, cudaMemcpyDeviceToHost), "cudaMemcpy D2H");
  return bytes;
}

std::vector<double> DeviceTensor::values() const {
  const std::vector<unsigned char> bytes = raw();
  return decode(bytes.data(), bytes_ / dtype_size(dtype_), dtype_);
}

bool DeviceTensor::guards_intact() const {
  std::vector<unsigned char> all(total_);
  check(cudaMemcpy(all.data(), base_, total_, cudaMemcpyDeviceToHost), "cudaMemcpy D2H");
  for (std::size_t i = 0; i < front_; ++i)
    if (all[i] != 0xFF) return false;
  for (std::size_t i = front_ + bytes_; i < total_; ++i)
    if (all[i] != 0xFF) return false;
  return true;
}

bool gpu_available(std::string* why) {
  int count = 0;
  Status status = exphil::device_count(count);
  if (status.ok() && count > 0) return true;
  // The library's own words for why (no driver, an old one, ...): the
  // managed stream of device 0 cannot be had, and says so.
  Stream stream = nullptr;
  if (status.ok()) status = exphil::managed_stream(0, stream);
  if (why) *why = status.ok() ? "no CUDA device" : status.message();
  return false;
}

void device_synchronize() { check(cudaDeviceSynchronize(), "cudaDeviceSynchronize"); }

}  // namespace exphil::test
