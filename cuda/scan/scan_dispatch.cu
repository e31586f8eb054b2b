// Run-time dispatch from (op, dtype) to the generated launcher instances.
#include "common/dtype.cuh"
#include "scan/scan_instances.h"
#include "scan/scan_launch.h"
#include "scan/scan_ops.cuh"

namespace exphil::kernels {
namespace {

// Calls f.template operator()<Op, Element>() for the runtime (op, dtype).
template <class F>
LaunchResult dispatch(ScanOp op, DType dtype, F&& f) {
  auto with_op = [&](auto op_tag) -> LaunchResult {
    using Op = decltype(op_tag);
    switch (dtype) {
      case DType::f32: return f.template operator()<Op, float>();
      case DType::f16: return f.template operator()<Op, __half>();
      case DType::bf16: return f.template operator()<Op, __nv_bfloat16>();
    }
    return {cudaErrorInvalidValue, "scan dispatch (unknown dtype)"};
  };
  switch (op) {
    case ScanOp::linear_scan: return with_op(LinearScanOp{});
    case ScanOp::min_gru: return with_op(MinGruOp{});
    case ScanOp::min_lstm: return with_op(MinLstmOp{});
    case ScanOp::liquid: return with_op(LiquidOp{});
    case ScanOp::min_gru_activated: return with_op(MinGruActivatedOp{});
    case ScanOp::min_lstm_activated: return with_op(MinLstmActivatedOp{});
    case ScanOp::diag_linear: return with_op(DiagLinearOp{});
    case ScanOp::elu_gru: return with_op(EluGruOp{});
  }
  return {cudaErrorInvalidValue, "scan dispatch (unknown op)"};
}

struct ForwardLauncher {
  const ScanForwardParams& params;
  const ScanPlan& plan;
  float* d_workspace;
  cudaStream_t stream;
  template <class Op, class Elem> LaunchResult operator()() const {
    return run_scan_forward<Op, Elem>(params, plan, d_workspace, stream);
  }
};

struct BackwardLauncher {
  const ScanBackwardParams& params;
  const ScanPlan& plan;
  float* d_workspace;
  cudaStream_t stream;
  template <class Op, class Elem> LaunchResult operator()() const {
    return run_scan_backward<Op, Elem>(params, plan, d_workspace, stream);
  }
};

}  // namespace

LaunchResult launch_scan_forward(ScanOp op, const ScanForwardParams& params, const ScanPlan& plan,
                                 float* d_workspace, cudaStream_t stream) noexcept {
  return dispatch(op, params.dtype, ForwardLauncher{params, plan, d_workspace, stream});
}

LaunchResult launch_scan_backward(ScanOp op, const ScanBackwardParams& params,
                                  const ScanPlan& plan, float* d_workspace,
                                  cudaStream_t stream) noexcept {
  return dispatch(op, params.dtype, BackwardLauncher{params, plan, d_workspace, stream});
}

}  // namespace exphil::kernels
