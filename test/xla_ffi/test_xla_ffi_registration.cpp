// exphil_xla_ffi_register and exphil_xla_ffi_targets against the fake XLA
// runtime: every failure path says what went wrong, and a successful
// registration hands XLA exactly the contract's targets. No GPU involved.
#include <dlfcn.h>

#include <catch2/catch.hpp>

#include <cstring>
#include <set>
#include <string>

#include "exphil/xla_ffi.h"
#include "fake_runtime.hpp"

using Catch::Matchers::Contains;
using Catch::Matchers::StartsWith;
using exphil::test::fake_runtime;
using exphil::test::FakeRegistration;
using exphil::test::FakeRuntime;

namespace {

// The targets of include/exphil/xla_ffi.h, which the JAX and EXLA sides call.
const std::set<std::string> kContractTargets = {
    "exphil_linear_scan_fwd",    "exphil_linear_scan_bwd",    "exphil_min_gru_fwd",
    "exphil_min_gru_bwd",        "exphil_min_lstm_fwd",       "exphil_min_lstm_bwd",
    "exphil_liquid_fwd",         "exphil_liquid_bwd",         "exphil_selective_scan_fwd",
    "exphil_selective_scan_bwd", "exphil_attention_fwd",      "exphil_attention_bwd",
    // y-only form (Edifice's operand and result lists)
    "exphil_linear_scan_y_fwd", "exphil_min_gru_y_fwd", "exphil_liquid_y_fwd",
    "exphil_liquid_y_bwd", "exphil_min_gru_activated_fwd", "exphil_min_gru_activated_bwd",
    "exphil_min_lstm_activated_fwd", "exphil_min_lstm_activated_bwd",
    // Edifice's selective-scan backward and attention forward
    "exphil_selective_scan_y_bwd", "exphil_attention_o_fwd", "exphil_attention_o_bwd",
    // Edifice's linear-scan backward (no b), diagonal linear and ELU-GRU forwards
    "exphil_linear_scan_y_bwd", "exphil_diag_linear_y_fwd", "exphil_elu_gru_y_fwd",
    // Edifice's selective-scan forward (the channel-mean input scale)
    "exphil_selective_scan_y_fwd",
    // GRU and LSTM sequences
    "exphil_gru_fwd", "exphil_gru_bwd", "exphil_lstm_fwd", "exphil_lstm_bwd",
    // Edifice's GRU and LSTM scans and their backward ops (y-only form)
    "exphil_gru_y_fwd", "exphil_gru_y_bwd", "exphil_lstm_y_fwd", "exphil_lstm_y_bwd",
    // sLSTM sequences, and Edifice's sLSTM scan (y-only form, no backward op)
    "exphil_slstm_fwd", "exphil_slstm_bwd", "exphil_slstm_y_fwd",
    // GRU and LSTM stacks
    "exphil_gru_stack_fwd", "exphil_gru_stack_bwd", "exphil_lstm_stack_fwd", "exphil_lstm_stack_bwd",
};

bool is_loaded(const char* path) {
  void* handle = dlopen(path, RTLD_LAZY | RTLD_NOLOAD);
  if (handle) dlclose(handle);
  return handle != nullptr;
}

}  // namespace

TEST_CASE("targets: the contract's names, each its handler's exported symbol",
          "[xla_ffi]") {
  std::size_t count = 0;
  const exphil_xla_ffi_target* targets = exphil_xla_ffi_targets(&count);
  REQUIRE(targets != nullptr);
  REQUIRE(count == kContractTargets.size());
  std::set<std::string> names;
  for (std::size_t i = 0; i < count; ++i) {
    INFO(targets[i].name);
    names.insert(targets[i].name);
    REQUIRE(targets[i].handler != nullptr);
    CHECK(dlsym(RTLD_DEFAULT, targets[i].name) == reinterpret_cast<void*>(targets[i].handler));
  }
  CHECK(names == kContractTargets);
  CHECK(exphil_xla_ffi_targets(nullptr) == targets);
}

TEST_CASE("register: a NULL path is refused", "[xla_ffi]") {
  char error[256] = "untouched";
  CHECK(exphil_xla_ffi_register(nullptr, error, sizeof error) == EXPHIL_ERROR_INVALID_ARGUMENT);
  CHECK_THAT(error, StartsWith("exphil_xla_ffi_register: ") && Contains("xla_library_path is NULL"));
}

TEST_CASE("register: a library not loaded in the process is refused, never loaded",
          "[xla_ffi]") {
  char error[1024] = "";
  const char* unloaded = EXPHIL_FAKE_XLA_UNLOADED_PATH;
  REQUIRE_FALSE(is_loaded(unloaded));
  CHECK(exphil_xla_ffi_register(unloaded, error, sizeof error) == EXPHIL_ERROR_INVALID_ARGUMENT);
  CHECK_THAT(error, Contains(unloaded) && Contains("is not loaded in this process"));
  CHECK_FALSE(is_loaded(unloaded));

  const char* missing = "/nonexistent/libxla_extension.so";
  CHECK(exphil_xla_ffi_register(missing, error, sizeof error) == EXPHIL_ERROR_INVALID_ARGUMENT);
  CHECK_THAT(error, Contains(missing) && Contains("is not loaded in this process"));
}

TEST_CASE("register: a loaded library without xla::ffi::GetXlaFfiApi() is refused",
          "[xla_ffi]") {
  const char* path = EXPHIL_FAKE_XLA_WITHOUT_API_PATH;
  void* handle = dlopen(path, RTLD_NOW | RTLD_GLOBAL);
  REQUIRE(handle != nullptr);
  char error[1024] = "";
  CHECK(exphil_xla_ffi_register(path, error, sizeof error) == EXPHIL_ERROR_INVALID_ARGUMENT);
  CHECK_THAT(error, Contains(path) && Contains("does not define xla::ffi::GetXlaFfiApi()"));
  dlclose(handle);
}

TEST_CASE("register: every target, platform CUDA, execute stage, command-buffer compatible",
          "[xla_ffi]") {
  const FakeRuntime fake = fake_runtime();
  char error[1024] = "untouched";
  REQUIRE(exphil_xla_ffi_register(fake.path, error, sizeof error) == EXPHIL_OK);
  CHECK(std::string(error) == "untouched");

  std::size_t count = 0;
  const exphil_xla_ffi_target* targets = exphil_xla_ffi_targets(&count);
  REQUIRE(fake.control->registration_count() == count);
  std::set<std::string> names;
  for (std::size_t i = 0; i < count; ++i) {
    const FakeRegistration& r = *fake.control->registration(i);
    INFO(r.name);
    names.insert(r.name);
    CHECK(r.name == targets[i].name);
    CHECK(r.platform == "CUDA");
    CHECK(r.args_struct_size == XLA_FFI_Handler_Register_Args_STRUCT_SIZE);
    CHECK(r.bundle.execute == targets[i].handler);
    CHECK(r.bundle.instantiate == nullptr);
    CHECK(r.bundle.prepare == nullptr);
    CHECK(r.bundle.initialize == nullptr);
    CHECK(r.bundle.record == nullptr);
    CHECK(r.traits == XLA_FFI_HANDLER_TRAITS_COMMAND_BUFFER_COMPATIBLE);
    // The handler answers XLA's metadata query: built for this API version,
    // and safe to trace into a command buffer (CUDA graph).
    CHECK(r.metadata_error.empty());
    CHECK(r.metadata_version.major_version == XLA_FFI_API_MAJOR);
    CHECK(r.metadata_version.minor_version == XLA_FFI_API_MINOR);
    CHECK(r.metadata_traits == XLA_FFI_HANDLER_TRAITS_COMMAND_BUFFER_COMPATIBLE);
  }
  CHECK(names.size() == count);
  CHECK(fake.control->live_errors() == 0);
}

TEST_CASE("register: a refusal names the target and carries the runtime's message",
          "[xla_ffi]") {
  const FakeRuntime fake = fake_runtime();
  fake.control->refuse("exphil_selective_scan_bwd");
  char error[1024] = "";
  CHECK(exphil_xla_ffi_register(fake.path, error, sizeof error) == EXPHIL_ERROR_NOT_SUPPORTED);
  CHECK_THAT(error, StartsWith("exphil_xla_ffi_register: ") &&
                        Contains("refused exphil_selective_scan_bwd (platform CUDA)") &&
                        Contains("fake XLA runtime refuses exphil_selective_scan_bwd"));
  // The runtime's error was destroyed after its message was read.
  CHECK(fake.control->live_errors() == 0);
}

TEST_CASE("register: an API of another major version is refused", "[xla_ffi]") {
  const FakeRuntime fake = fake_runtime();
  fake.control->set_api_major_version(XLA_FFI_API_MAJOR + 1);
  char error[1024] = "";
  CHECK(exphil_xla_ffi_register(fake.path, error, sizeof error) == EXPHIL_ERROR_NOT_SUPPORTED);
  const std::string theirs = std::to_string(XLA_FFI_API_MAJOR + 1) + "." +
                             std::to_string(XLA_FFI_API_MINOR);
  CHECK_THAT(error, Contains("version " + theirs) && Contains("major versions must match"));
  CHECK(fake.control->registration_count() == 0);
}

TEST_CASE("register: the message is cut to the caller's buffer", "[xla_ffi]") {
  char small[8];
  std::memset(small, 'x', sizeof small);
  CHECK(exphil_xla_ffi_register(nullptr, small, sizeof small) == EXPHIL_ERROR_INVALID_ARGUMENT);
  CHECK(std::string(small) == "exphil_");
  // No buffer: the status alone.
  CHECK(exphil_xla_ffi_register(nullptr, nullptr, 0) == EXPHIL_ERROR_INVALID_ARGUMENT);
  char one = 'x';
  CHECK(exphil_xla_ffi_register(nullptr, &one, 1) == EXPHIL_ERROR_INVALID_ARGUMENT);
  CHECK(one == '\0');
}
