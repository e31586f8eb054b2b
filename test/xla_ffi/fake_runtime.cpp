#include "fake_runtime.hpp"

#include <dlfcn.h>

#include <stdexcept>
#include <string>

namespace exphil::test {

namespace {

FakeRuntime load() {
  FakeRuntime fake;
  fake.path = EXPHIL_FAKE_XLA_RUNTIME_PATH;
  void* handle = dlopen(fake.path, RTLD_NOW | RTLD_GLOBAL);
  if (!handle) throw std::runtime_error(std::string("cannot load the fake XLA runtime: ") + dlerror());
  const auto control = reinterpret_cast<FakeXlaControlFn>(dlsym(handle, kFakeXlaControlSymbol));
  const auto get_api = reinterpret_cast<GetXlaFfiApiFn>(dlsym(handle, kGetXlaFfiApiSymbol));
  if (!control || !get_api)
    throw std::runtime_error(std::string(fake.path) + " lacks the fake runtime's symbols");
  fake.control = control();
  fake.api = get_api();
  return fake;
}

}  // namespace

FakeRuntime fake_runtime() {
  static const FakeRuntime fake = load();
  fake.control->reset();
  return fake;
}

}  // namespace exphil::test
