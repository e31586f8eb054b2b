// exphil_xla_ffi_register: hands every target to the XLA runtime of a library
// already loaded in the process (EXLA's), found with dlopen(RTLD_NOLOAD) and
// xla::ffi::GetXlaFfiApi(). Going through the runtime's own API pointer keeps
// this library free of any link-time XLA dependency, and NOLOAD guarantees we
// never load a second, separate XLA with a registry nobody reads.
#include <dlfcn.h>

#include <algorithm>
#include <cstddef>
#include <cstring>
#include <new>
#include <string>

#include "exphil/xla_ffi.h"
#include "xla/ffi/api/c_api.h"

namespace {

constexpr const char* kWhere = "exphil_xla_ffi_register: ";
// xla::ffi::GetXlaFfiApi() in the Itanium C++ ABI; it returns const XLA_FFI_Api*.
constexpr const char* kGetApiSymbol = "_ZN3xla3ffi12GetXlaFfiApiEv";
constexpr const char* kPlatform = "CUDA";

using GetXlaFfiApi = const XLA_FFI_Api* (*)();

// The API must be large enough to hold every member we call.
constexpr std::size_t kApiVersionEnd = XLA_FFI_STRUCT_SIZE(XLA_FFI_Api, api_version);
constexpr std::size_t kNeededApiSize = XLA_FFI_STRUCT_SIZE(XLA_FFI_Api, XLA_FFI_Handler_Register);

// dlclose on every path out; the library stays loaded (we held one more
// reference, never the last).
class LoadedLibrary {
 public:
  explicit LoadedLibrary(void* handle) noexcept : handle_(handle) {}
  ~LoadedLibrary() { dlclose(handle_); }
  LoadedLibrary(const LoadedLibrary&) = delete;
  LoadedLibrary& operator=(const LoadedLibrary&) = delete;
  void* handle() const noexcept { return handle_; }

 private:
  void* handle_;
};

std::string version_string(int major, int minor) {
  return std::to_string(major) + "." + std::to_string(minor);
}

// The runtime's message for `error`, which is destroyed.
std::string take_message(const XLA_FFI_Api* api, XLA_FFI_Error* error) {
  XLA_FFI_Error_GetDetails_Args details;
  details.struct_size = XLA_FFI_Error_GetDetails_Args_STRUCT_SIZE;
  details.extension_start = nullptr;
  details.error = error;
  details.message = nullptr;
  details.errc = XLA_FFI_Error_Code_UNKNOWN;
  api->XLA_FFI_Error_GetDetails(&details);
  std::string message = details.message ? details.message : "(no message)";

  XLA_FFI_Error_Destroy_Args destroy;
  destroy.struct_size = XLA_FFI_Error_Destroy_Args_STRUCT_SIZE;
  destroy.extension_start = nullptr;
  destroy.error = error;
  api->XLA_FFI_Error_Destroy(&destroy);
  return message;
}

// Why this runtime cannot take our handlers, or "" if it can.
std::string api_incompatibility(const XLA_FFI_Api* api) {
  if (!api) return "xla::ffi::GetXlaFfiApi() returned NULL";
  if (api->struct_size < kApiVersionEnd)
    return "its XLA_FFI_Api is " + std::to_string(api->struct_size) +
           " bytes, too small to hold a version";
  const XLA_FFI_Api_Version& v = api->api_version;
  if (v.major_version != XLA_FFI_API_MAJOR)
    return "its XLA FFI API is version " + version_string(v.major_version, v.minor_version) +
           "; these handlers were built for " +
           version_string(XLA_FFI_API_MAJOR, XLA_FFI_API_MINOR) +
           " (the major versions must match)";
  if (api->struct_size < kNeededApiSize || !api->XLA_FFI_Error_GetDetails ||
      !api->XLA_FFI_Error_Destroy || !api->XLA_FFI_Handler_Register)
    return "its XLA_FFI_Api (" + std::to_string(api->struct_size) +
           " bytes) lacks handler registration or error access";
  return {};
}

exphil_status register_all(const char* path, std::string& message) {
  if (!path) {
    message = std::string(kWhere) + "xla_library_path is NULL";
    return EXPHIL_ERROR_INVALID_ARGUMENT;
  }
  dlerror();  // clear any earlier error, so the one read below is ours
  void* handle = dlopen(path, RTLD_LAZY | RTLD_NOLOAD);
  if (!handle) {
    const char* why = dlerror();
    message = std::string(kWhere) + path + " is not loaded in this process" +
              (why ? std::string(" (") + why + ")" : std::string());
    return EXPHIL_ERROR_INVALID_ARGUMENT;
  }
  const LoadedLibrary library(handle);

  void* symbol = dlsym(library.handle(), kGetApiSymbol);
  if (!symbol) {
    message = std::string(kWhere) + path + " does not define xla::ffi::GetXlaFfiApi() (" +
              kGetApiSymbol + "); is it an XLA runtime?";
    return EXPHIL_ERROR_INVALID_ARGUMENT;
  }
  // POSIX guarantees that a dlsym result converts to a function pointer.
  const auto get_api = reinterpret_cast<GetXlaFfiApi>(symbol);
  const XLA_FFI_Api* api = get_api();
  if (const std::string why = api_incompatibility(api); !why.empty()) {
    message = std::string(kWhere) + "the XLA runtime in " + path + " cannot be used: " + why;
    return EXPHIL_ERROR_NOT_SUPPORTED;
  }

  std::size_t count = 0;
  const exphil_xla_ffi_target* targets = exphil_xla_ffi_targets(&count);
  for (std::size_t i = 0; i < count; ++i) {
    XLA_FFI_Handler_Register_Args args;
    args.struct_size = XLA_FFI_Handler_Register_Args_STRUCT_SIZE;
    args.extension_start = nullptr;
    args.name = XLA_FFI_ByteSpan{targets[i].name, std::strlen(targets[i].name)};
    args.platform = XLA_FFI_ByteSpan{kPlatform, std::strlen(kPlatform)};
    // Execute stage only; command-buffer compatible, as the handlers' own
    // metadata says (handler_binding.hpp).
    args.bundle = XLA_FFI_Handler_Bundle{/*instantiate=*/nullptr, /*prepare=*/nullptr,
                                         /*initialize=*/nullptr, targets[i].handler,
                                         /*record=*/nullptr};
    args.traits = XLA_FFI_HANDLER_TRAITS_COMMAND_BUFFER_COMPATIBLE;
    if (XLA_FFI_Error* refused = api->XLA_FFI_Handler_Register(&args)) {
      message = std::string(kWhere) + "the XLA runtime in " + path + " refused " +
                targets[i].name + " (platform " + kPlatform + "): " + take_message(api, refused);
      return EXPHIL_ERROR_NOT_SUPPORTED;
    }
  }
  return EXPHIL_OK;
}

// Copies as much of `message` as fits, always NUL-terminated.
void write_message(const char* message, char* error, std::size_t error_size) noexcept {
  if (!error || error_size == 0) return;
  const std::size_t n = std::min(std::strlen(message), error_size - 1);
  std::memcpy(error, message, n);
  error[n] = '\0';
}

}  // namespace

extern "C" exphil_status exphil_xla_ffi_register(const char* xla_library_path, char* error,
                                                 size_t error_size) {
  try {
    std::string message;
    const exphil_status status = register_all(xla_library_path, message);
    if (status != EXPHIL_OK) write_message(message.c_str(), error, error_size);
    return status;
  } catch (const std::bad_alloc&) {
    write_message("exphil_xla_ffi_register: out of host memory", error, error_size);
    return EXPHIL_ERROR_INTERNAL;
  } catch (...) {
    // Nothing of ours throws anything else; the runtime's C API should not.
    write_message("exphil_xla_ffi_register: unexpected C++ exception", error, error_size);
    return EXPHIL_ERROR_INTERNAL;
  }
}
