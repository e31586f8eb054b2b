// register_xla_ffi/2: registers the XLA FFI handlers of libexphil_xla_ffi.so
// with the XLA runtime EXLA has already loaded, so that compiled graphs can
// reach them through EXLA.CustomCall. The NIF links nothing of XLA nor of
// the handler library: it opens the handler library by path and calls its
// C entry point, which does the registration (include/exphil/xla_ffi.h).
#include <dlfcn.h>

#include <cstddef>
#include <cstring>
#include <string>

#include "atoms.hpp"
#include "exphil/xla_ffi.h"
#include "terms.hpp"
#include "xla_ffi_nifs.hpp"

namespace exphil::nif {

namespace {

using RegisterFn = decltype(&exphil_xla_ffi_register);

std::string get_path(ErlNifEnv* env, ERL_NIF_TERM term, const char* argument) {
  ErlNifBinary bin;
  if (!enif_inspect_binary(env, term, &bin) || bin.size == 0 ||
      std::memchr(bin.data, 0, bin.size) != nullptr)
    throw ArgumentError(argument, "a non-empty path (a string with no NUL byte)", term);
  return std::string(reinterpret_cast<const char*>(bin.data), bin.size);
}

// {:error, {:xla_ffi_registration, message}}: the handlers could not be
// registered (a runtime condition, not a bad argument).
ERL_NIF_TERM refused(ErlNifEnv* env, const std::string& message) {
  return make_error(env, enif_make_tuple2(env, atoms().xla_ffi_registration,
                                          make_string(env, "register_xla_ffi: " + message)));
}

}  // namespace

ERL_NIF_TERM register_xla_ffi_nif(ErlNifEnv* env, int, const ERL_NIF_TERM argv[]) {
  return nif_entry(env, [&] {
    const std::string handlers = get_path(env, argv[0], "handler_library");
    const std::string xla = get_path(env, argv[1], "xla_library");

    void* library = dlopen(handlers.c_str(), RTLD_NOW | RTLD_LOCAL);
    if (!library) {
      const char* why = dlerror();
      return refused(env, "cannot open the handler library " + handlers + ": " +
                              (why ? why : "no reason given"));
    }
    auto register_handlers =
        reinterpret_cast<RegisterFn>(dlsym(library, "exphil_xla_ffi_register"));
    if (!register_handlers) {
      dlclose(library);
      return refused(env, handlers +
                              " does not define exphil_xla_ffi_register (is it libexphil_xla_ffi.so?)");
    }
    // From here on the library stays open for the life of the process,
    // whatever the outcome: XLA keeps the addresses of every handler it
    // accepted, and a failed call may have registered some before refusing one.
    char error[1024] = "";
    const exphil_status status = register_handlers(xla.c_str(), error, sizeof error);
    return status == EXPHIL_OK ? atoms().ok : refused(env, error);
  });
}

}  // namespace exphil::nif
