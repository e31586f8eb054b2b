// The boundary of every public entry point: nothing thrown inside may escape.
#pragma once

#include <new>
#include <string>

#include "cuda_status.hpp"
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

// can_implement of any op: its `validate(args, params, call)` alone, with
// outputs allowed to have no memory yet (CallTensors), messages prefixed
// with `context` as the call's are.
template <class Params, class Call, class Args, class Validate>
Status validate_only(const std::string& context, const Args& args, Validate&& validate) noexcept {
  return guarded("can_implement", [&]() -> Status {
    Params params;
    Call call;
    call.tensors.allow_unallocated_outputs();
    return with_context(context, validate(args, params, call));
  });
}

}  // namespace exphil::runtime
