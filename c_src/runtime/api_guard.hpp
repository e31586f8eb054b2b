// The boundary of every public entry point: nothing thrown inside may escape.
#pragma once

#include <new>
#include <string>

#include "exphil/status.hpp"

namespace exphil::runtime {

// Runs f() -> Status and turns any exception into a Status. Building the
// message may itself fail for lack of memory; then the message is empty.
template <class F>
Status guarded(const char* where, F&& f) noexcept {
  try {
    return f();
  } catch (const std::bad_alloc&) {
    return Status(StatusCode::out_of_memory, std::string());
  } catch (...) {
    try {
      return Status(StatusCode::internal, std::string(where) + ": unexpected C++ exception");
    } catch (...) {
      return Status(StatusCode::internal, std::string());
    }
  }
}

}  // namespace exphil::runtime
