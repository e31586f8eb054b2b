// The fake XLA runtime loaded into the test process the way a framework's
// runtime is: dlopen(RTLD_NOW | RTLD_GLOBAL), before anyone registers with it.
#pragma once

#include "fake_xla_runtime.hpp"

namespace exphil::test {

struct FakeRuntime {
  const char* path = nullptr;
  const FakeXlaControl* control = nullptr;
  const XLA_FFI_Api* api = nullptr;
};

// Loads the fake on first use (it then stays loaded) and resets it. Throws
// std::runtime_error, with dlerror's reason, if it cannot be loaded.
FakeRuntime fake_runtime();

}  // namespace exphil::test
