// The fake XLA runtime (fake_xla_runtime.cpp): a shared library standing in
// for EXLA's libxla_extension.so. It exports xla::ffi::GetXlaFfiApi() with an
// API that records handler registrations instead of running anything, makes
// and reads errors, and hands out a NULL stream; this header is how the tests
// steer it and read what it saw, through exphil_fake_xla_control().
#pragma once

#include <cstddef>
#include <string>

#include "xla/ffi/api/c_api.h"

namespace exphil::test {

// One XLA_FFI_Handler_Register call, and what the execute handler reported
// when asked for its metadata (as XLA asks at registration).
struct FakeRegistration {
  std::string name;
  std::string platform;
  std::size_t args_struct_size = 0;
  XLA_FFI_Handler_Bundle bundle = {};
  XLA_FFI_Handler_Traits traits = 0;
  std::string metadata_error;  // empty: the metadata call succeeded
  XLA_FFI_Api_Version metadata_version = {};
  XLA_FFI_Handler_Traits metadata_traits = 0;
};

struct FakeXlaControl {
  // Forgets registrations and refusals; restores the header's API version.
  void (*reset)();
  // Handler_Register of `name` fails with "fake XLA runtime refuses <name>".
  void (*refuse)(const char* name);
  void (*set_api_major_version)(int major);
  std::size_t (*registration_count)();
  const FakeRegistration* (*registration)(std::size_t index);
  // Errors made by the API and not yet destroyed.
  long (*live_errors)();
};

// extern "C" const FakeXlaControl* exphil_fake_xla_control(void);
inline constexpr const char* kFakeXlaControlSymbol = "exphil_fake_xla_control";
using FakeXlaControlFn = const FakeXlaControl* (*)();

// xla::ffi::GetXlaFfiApi(), as the fake (and XLA) export it.
inline constexpr const char* kGetXlaFfiApiSymbol = "_ZN3xla3ffi12GetXlaFfiApiEv";
using GetXlaFfiApiFn = const XLA_FFI_Api* (*)();

}  // namespace exphil::test
