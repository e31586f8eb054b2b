// Run-time dispatch from (dtype, head width) to the generated launcher
// instances.
#include <type_traits>

#include "attention/attention_instances.h"
#include "attention/attention_launch.h"
#include "common/dtype.cuh"

namespace exphil::kernels {

namespace {

// Calls f(Elem{}, std::integral_constant<int, kD>{}) for the call's dtype,
// precision and head width.
template <class F>
LaunchResult dispatch(const AttentionProblem& problem, F&& f) {
  const int head_dim = problem.shape.head_dim;
  auto by_width = [&](auto elem) -> LaunchResult {
    switch (head_dim) {
      case 32: return f(elem, std::integral_constant<int, 32>{});
      case 64: return f(elem, std::integral_constant<int, 64>{});
      case 96: return f(elem, std::integral_constant<int, 96>{});
      case 128: return f(elem, std::integral_constant<int, 128>{});
    }
    return {cudaErrorInvalidValue, "attention dispatch (unsupported head width)"};
  };
  switch (problem.dtype) {
    case DType::f32:
      if (problem.precision == AttentionPrecision::tf32x3) return by_width(Tf32x3{});
      return by_width(float{});
    case DType::f16: return by_width(__half{});
    case DType::bf16: return by_width(__nv_bfloat16{});
  }
  return {cudaErrorInvalidValue, "attention dispatch (unknown dtype)"};
}

}  // namespace

LaunchResult launch_attention_forward(const AttentionForwardParams& params,
                                      const AttentionPlan& plan, cudaStream_t stream) noexcept {
  return dispatch(params.problem, [&](auto elem, auto width) {
    return run_attention_forward<decltype(elem), decltype(width)::value>(params, plan, stream);
  });
}

LaunchResult launch_attention_backward(const AttentionBackwardParams& params,
                                       const AttentionPlan& plan, float* d_workspace,
                                       cudaStream_t stream) noexcept {
  return dispatch(params.problem, [&](auto elem, auto width) {
    return run_attention_backward<decltype(elem), decltype(width)::value>(params, plan,
                                                                           d_workspace, stream);
  });
}

}  // namespace exphil::kernels
