// The one pipeline every op direction of the C++ API runs:
//
//   validate -> place (device, stream) -> plan -> can the plan run ->
//   workspace -> launch -> report the layout -> release the workspace
//
// and can_implement, the validation alone. An op direction is a traits type
// (scan_api.cpp, selective_scan_api.cpp, attention_api.cpp) with
//
//   using Args, Params, Call, LaunchOptions, Plan;
//   static constexpr const char* kWhere;      // the entry point, for internal errors
//   static constexpr const char* kWorkspace;  // the workspace, in errors
//   static std::string context(const Args&);  // "min_gru forward": every message's prefix
//   static Status validate(const Args&, Params&, Call&);  // no device needed
//   static Plan plan(const Args&, const Call&, const Params&,
//                    const runtime::LaunchContext&, const LaunchOptions*);
//   static Status check_plan(const Plan&, const Call&, const Params&);  // not_supported, or ok
//   static std::size_t workspace_bytes(const Plan&, const Call&, const Params&);
//   static kernels::LaunchResult launch(const Args&, Params&, const Plan&,
//                                       float* d_workspace, cudaStream_t);
//   static void report(const Plan&, const Params&, const LaunchOptions*);
//
// Nothing thrown inside escapes (runtime::guarded).
#pragma once

#include <string>
#include <utility>

#include "runtime/api_guard.hpp"
#include "runtime/cuda_status.hpp"
#include "exphil/status.hpp"
#include "exphil/tensor.hpp"
#include "runtime/launch_context.hpp"

namespace exphil::runtime {

template <class Op>
Status run_op(const typename Op::Args& args, Stream stream,
              const typename Op::LaunchOptions* options) noexcept {
  return guarded(Op::kWhere, [&]() -> Status {
    typename Op::Params params;
    typename Op::Call call;
    Status s = Op::validate(args, params, call);
    if (s.ok()) {
      s = [&]() -> Status {
        LaunchContext context;
        EXPHIL_RETURN_IF_ERROR(context.prepare(call.tensors, stream));
        const typename Op::Plan plan = Op::plan(args, call, params, context, options);
        EXPHIL_RETURN_IF_ERROR(Op::check_plan(plan, call, params));
        EXPHIL_RETURN_IF_ERROR(context.run_with_workspace(
            Op::workspace_bytes(plan, call, params), Op::kWorkspace,
            [&](float* d_workspace, cudaStream_t st) {
              return Op::launch(args, params, plan, d_workspace, st);
            }));
        Op::report(plan, params, options);
        return {};
      }();
    }
    return with_context(Op::context(args), std::move(s));
  });
}

// can_implement: the validation alone, with outputs allowed to have no
// memory yet (CallTensors::allow_unallocated_outputs).
template <class Op>
Status check_op(const typename Op::Args& args) noexcept {
  return guarded("can_implement", [&]() -> Status {
    typename Op::Params params;
    typename Op::Call call;
    call.tensors.allow_unallocated_outputs();
    return with_context(Op::context(args), Op::validate(args, params, call));
  });
}

}  // namespace exphil::runtime
