// What the C ABI validation tests of every op expect: descriptors on fake
// device addresses, the message of a refused call, and how a well-formed
// call on those addresses fails. Catch2 assertions; for test/abi/ only.
#pragma once

#include <catch2/catch.hpp>

#include <cstdint>
#include <initializer_list>
#include <string>

#include "device_buffer.hpp"
#include "exphil/exphil.h"

namespace exphil::test {

// Descriptors at distinct fake device addresses, 1 MiB apart from 2^32
// (16-byte aligned): validation accepts them, the device check refuses them.
class FakeAddresses {
 public:
  void fill(exphil_tensor& t, int32_t dtype, std::initializer_list<int64_t> shape) {
    t = exphil_tensor{};
    t.data = reinterpret_cast<void*>(next_);
    next_ += uintptr_t{1} << 20;
    t.dtype = dtype;
    t.rank = static_cast<int32_t>(shape.size());
    int i = 0;
    for (int64_t d : shape) t.shape[i++] = d;
  }
  exphil_tensor make(std::initializer_list<int64_t> shape, int32_t dtype = EXPHIL_F32) {
    exphil_tensor t;
    fill(t, dtype, shape);
    return t;
  }

 private:
  uintptr_t next_ = uintptr_t{1} << 32;
};

// `status` is `expected` and the message reads "<op> <direction>: argument
// '<argument>': ..." and contains `detail`.
inline void expect_rejected(const char* op, exphil_status status, exphil_status expected,
                            const char* direction, const std::string& argument,
                            const std::string& detail) {
  using Catch::Matchers::Contains;
  using Catch::Matchers::StartsWith;
  INFO("message: " << exphil_last_error());
  CHECK(exphil_status_name(status) == std::string(exphil_status_name(expected)));
  CHECK_THAT(exphil_last_error(), StartsWith(std::string(op) + " " + direction + ": "));
  CHECK_THAT(exphil_last_error(), Contains("argument '" + argument + "'"));
  CHECK_THAT(exphil_last_error(), Contains(detail));
}

// Structurally valid: the call gets past every check before the device one,
// which then fails on the fake addresses (or for want of a device).
inline void expect_past_validation(const char* op, exphil_status status, const char* direction) {
  using Catch::Matchers::Contains;
  using Catch::Matchers::StartsWith;
  INFO("message: " << exphil_last_error());
  CHECK_THAT(exphil_last_error(), StartsWith(std::string(op) + " " + direction + ": "));
  if (gpu_available(nullptr)) {
    CHECK(status == EXPHIL_ERROR_INVALID_ARGUMENT);
    CHECK_THAT(exphil_last_error(), Contains("expected device memory"));
  } else {
    CHECK(status == EXPHIL_ERROR_NO_DEVICE);
    CHECK_THAT(exphil_last_error(), Contains("no CUDA device"));
  }
}

}  // namespace exphil::test
