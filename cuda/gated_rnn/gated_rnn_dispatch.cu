// Run-time dispatch from the dtype and cell to the generated launcher
// instances, and the device query.
#include "common/dtype.cuh"
#include "gated_rnn/gated_rnn_instances.h"
#include "gated_rnn/gated_rnn_launch.h"

namespace exphil::kernels {

cudaError_t query_gated_rnn_device(int device, GatedRnnDevice& out) noexcept {
  if (const cudaError_t e =
          cudaDeviceGetAttribute(&out.sm_count, cudaDevAttrMultiProcessorCount, device);
      e != cudaSuccess)
    return e;
  if (const cudaError_t e = cudaDeviceGetAttribute(&out.max_shared_per_block,
                                                   cudaDevAttrMaxSharedMemoryPerBlockOptin, device);
      e != cudaSuccess)
    return e;
  return cudaDeviceGetAttribute(&out.max_shared_per_sm,
                                cudaDevAttrMaxSharedMemoryPerMultiprocessor, device);
}

namespace {

template <GatedRnnCell kCell>
LaunchResult forward_for(const GatedRnnForwardParams& p, const GatedRnnPlan& plan, float* ws,
                         cudaStream_t stream) {
  switch (p.dtype) {
    case DType::f32: return run_gated_rnn_forward<float, kCell>(p, plan, ws, stream);
    case DType::f16: return run_gated_rnn_forward<__half, kCell>(p, plan, ws, stream);
    case DType::bf16: return run_gated_rnn_forward<__nv_bfloat16, kCell>(p, plan, ws, stream);
  }
  return {cudaErrorInvalidValue, "gated RNN dispatch (unknown dtype)"};
}

template <GatedRnnCell kCell>
LaunchResult backward_for(const GatedRnnBackwardParams& p, const GatedRnnPlan& plan, float* ws,
                          cudaStream_t stream) {
  switch (p.fwd.dtype) {
    case DType::f32: return run_gated_rnn_backward<float, kCell>(p, plan, ws, stream);
    case DType::f16: return run_gated_rnn_backward<__half, kCell>(p, plan, ws, stream);
    case DType::bf16: return run_gated_rnn_backward<__nv_bfloat16, kCell>(p, plan, ws, stream);
  }
  return {cudaErrorInvalidValue, "gated RNN dispatch (unknown dtype)"};
}

}  // namespace

LaunchResult launch_gated_rnn_forward(const GatedRnnForwardParams& params, const GatedRnnPlan& plan,
                                      float* d_workspace, cudaStream_t stream) noexcept {
  switch (params.cell) {
    case GatedRnnCell::gru:
      return forward_for<GatedRnnCell::gru>(params, plan, d_workspace, stream);
    case GatedRnnCell::lstm:
      return forward_for<GatedRnnCell::lstm>(params, plan, d_workspace, stream);
    case GatedRnnCell::slstm:
      return forward_for<GatedRnnCell::slstm>(params, plan, d_workspace, stream);
  }
  return {cudaErrorInvalidValue, "gated RNN dispatch (unknown cell)"};
}

LaunchResult launch_gated_rnn_backward(const GatedRnnBackwardParams& params,
                                       const GatedRnnPlan& plan, float* d_workspace,
                                       cudaStream_t stream) noexcept {
  switch (params.fwd.cell) {
    case GatedRnnCell::gru:
      return backward_for<GatedRnnCell::gru>(params, plan, d_workspace, stream);
    case GatedRnnCell::lstm:
      return backward_for<GatedRnnCell::lstm>(params, plan, d_workspace, stream);
    case GatedRnnCell::slstm:
      return backward_for<GatedRnnCell::slstm>(params, plan, d_workspace, stream);
  }
  return {cudaErrorInvalidValue, "gated RNN dispatch (unknown cell)"};
}

}  // namespace exphil::kernels
