// The fake XLA runtime described in fake_xla_runtime.hpp. Built three times:
// the fake itself; with EXPHIL_FAKE_XLA_WITHOUT_API, a loaded library that
// lacks xla::ffi::GetXlaFfiApi(); and a copy the tests never load.
#include "fake_xla_runtime.hpp"

#include <atomic>
#include <mutex>
#include <string>
#include <vector>

#define FAKE_XLA_EXPORT __attribute__((visibility("default")))

// The runtime defines the error type; handlers and callers only see pointers.
struct XLA_FFI_Error {
  std::string message;
  XLA_FFI_Error_Code code;
};

namespace {

using exphil::test::FakeRegistration;
using exphil::test::FakeXlaControl;

std::mutex g_mutex;
std::vector<FakeRegistration> g_registrations;
std::vector<std::string> g_refused;
std::atomic<long> g_live_errors{0};

XLA_FFI_Error* error_create(XLA_FFI_Error_Create_Args* args) {
  ++g_live_errors;
  return new XLA_FFI_Error{args->message ? args->message : "", args->errc};
}

void error_get_details(XLA_FFI_Error_GetDetails_Args* args) {
  args->message = args->error->message.c_str();
  args->errc = args->error->code;
}

void error_destroy(XLA_FFI_Error_Destroy_Args* args) {
  --g_live_errors;
  delete args->error;
}

XLA_FFI_Error* make_error(XLA_FFI_Error_Code code, const std::string& message) {
  XLA_FFI_Error_Create_Args args = {};
  args.struct_size = XLA_FFI_Error_Create_Args_STRUCT_SIZE;
  args.message = message.c_str();
  args.errc = code;
  return error_create(&args);
}

// The handlers run on "no stream": the library's own.
XLA_FFI_Error* stream_get(XLA_FFI_Stream_Get_Args* args) {
  args->stream = nullptr;
  return nullptr;
}

XLA_FFI_Error* handler_register(XLA_FFI_Handler_Register_Args* args);

XLA_FFI_Api make_api() {
  XLA_FFI_Api api = {};
  api.struct_size = XLA_FFI_Api_STRUCT_SIZE;
  api.api_version = {XLA_FFI_Api_Version_STRUCT_SIZE, nullptr, XLA_FFI_API_MAJOR,
                     XLA_FFI_API_MINOR};
  api.XLA_FFI_Error_Create = error_create;
  api.XLA_FFI_Error_GetDetails = error_get_details;
  api.XLA_FFI_Error_Destroy = error_destroy;
  api.XLA_FFI_Handler_Register = handler_register;
  api.XLA_FFI_Stream_Get = stream_get;
  return api;
}

XLA_FFI_Api g_api = make_api();

// Asks the handler for its metadata through the metadata extension, as XLA
// does before accepting a registration.
void query_metadata(XLA_FFI_Handler* handler, FakeRegistration& r) {
  XLA_FFI_Metadata metadata = {};
  metadata.struct_size = XLA_FFI_Metadata_STRUCT_SIZE;
  XLA_FFI_Metadata_Extension extension = {};
  extension.extension_base.struct_size = XLA_FFI_Metadata_Extension_STRUCT_SIZE;
  extension.extension_base.type = XLA_FFI_Extension_Metadata;
  extension.metadata = &metadata;
  XLA_FFI_CallFrame frame = {};
  frame.struct_size = XLA_FFI_CallFrame_STRUCT_SIZE;
  frame.extension_start = &extension.extension_base;
  frame.api = &g_api;
  frame.stage = XLA_FFI_ExecutionStage_EXECUTE;
  if (XLA_FFI_Error* error = handler(&frame)) {
    r.metadata_error = error->message.empty() ? "(empty message)" : error->message;
    XLA_FFI_Error_Destroy_Args destroy = {XLA_FFI_Error_Destroy_Args_STRUCT_SIZE, nullptr, error};
    error_destroy(&destroy);
    return;
  }
  r.metadata_version = metadata.api_version;
  r.metadata_traits = metadata.traits;
}

XLA_FFI_Error* handler_register(XLA_FFI_Handler_Register_Args* args) {
  FakeRegistration r;
  r.name.assign(args->name.ptr, args->name.len);
  r.platform.assign(args->platform.ptr, args->platform.len);
  r.args_struct_size = args->struct_size;
  r.bundle = args->bundle;
  r.traits = args->traits;
  if (r.bundle.execute) query_metadata(r.bundle.execute, r);

  const std::lock_guard<std::mutex> lock(g_mutex);
  for (const std::string& refused : g_refused) {
    if (refused == r.name)
      return make_error(XLA_FFI_Error_Code_INVALID_ARGUMENT, "fake XLA runtime refuses " + r.name);
  }
  g_registrations.push_back(std::move(r));
  return nullptr;
}

void reset() {
  const std::lock_guard<std::mutex> lock(g_mutex);
  g_registrations.clear();
  g_refused.clear();
  g_api = make_api();
}

void refuse(const char* name) {
  const std::lock_guard<std::mutex> lock(g_mutex);
  g_refused.emplace_back(name);
}

void set_api_major_version(int major) { g_api.api_version.major_version = major; }

std::size_t registration_count() {
  const std::lock_guard<std::mutex> lock(g_mutex);
  return g_registrations.size();
}

const FakeRegistration* registration(std::size_t index) {
  const std::lock_guard<std::mutex> lock(g_mutex);
  return index < g_registrations.size() ? &g_registrations[index] : nullptr;
}

long live_errors() { return g_live_errors.load(); }

const FakeXlaControl g_control = {reset, refuse, set_api_major_version, registration_count,
                                  registration, live_errors};

}  // namespace

extern "C" FAKE_XLA_EXPORT const FakeXlaControl* exphil_fake_xla_control() { return &g_control; }

#ifndef EXPHIL_FAKE_XLA_WITHOUT_API
namespace xla::ffi {
FAKE_XLA_EXPORT const XLA_FFI_Api* GetXlaFfiApi();
const XLA_FFI_Api* GetXlaFfiApi() { return &g_api; }
}  // namespace xla::ffi
#endif
