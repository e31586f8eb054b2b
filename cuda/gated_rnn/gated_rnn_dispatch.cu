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

template <GatedRnnCell kCell>
LaunchResult stack_forward_for(const GatedRnnStackParams& p, const GatedRnnPlan& plan, float* ws,
                               cudaStream_t stream) {
  switch (p.layer[0].dtype) {
    case DType::f32: return run_gated_rnn_stack_forward<float, kCell>(p, plan, ws, stream);
    case DType::f16: return run_gated_rnn_stack_forward<__half, kCell>(p, plan, ws, stream);
    case DType::bf16: return run_gated_rnn_stack_forward<__nv_bfloat16, kCell>(p, plan, ws, stream);
  }
  return {cudaErrorInvalidValue, "gated RNN stack dispatch (unknown dtype)"};
}

template <GatedRnnCell kCell>
LaunchResult stack_backward_for(const GatedRnnStackBackwardParams& p, const GatedRnnPlan& plan,
                                float* ws, cudaStream_t stream) {
  switch (p.layer[0].fwd.dtype) {
    case DType::f32: return run_gated_rnn_stack_backward<float, kCell>(p, plan, ws, stream);
    case DType::f16: return run_gated_rnn_stack_backward<__half, kCell>(p, plan, ws, stream);
    case DType::bf16: return run_gated_rnn_stack_backward<__nv_bfloat16, kCell>(p, plan, ws, stream);
  }
  return {cudaErrorInvalidValue, "gated RNN stack dispatch (unknown dtype)"};
}

// A stack's layers share one shape, cell and dtypes.
bool same_layer(const GatedRnnForwardParams& f, const GatedRnnForwardParams& f0) {
  return f.shape.batch == f0.shape.batch && f.shape.steps == f0.shape.steps &&
         f.shape.hidden == f0.shape.hidden && f.cell == f0.cell && f.dtype == f0.dtype &&
         f.weight_dtype == f0.weight_dtype && f.state_dtype == f0.state_dtype;
}

// What the stack kernel reads without checking: every layer like layer 0,
// the operands it needs present, and a plan for this many layers.
const char* stack_params_invalid(const GatedRnnStackParams& p, const GatedRnnPlan& plan) {
  if (p.layers < 2 || p.layers > kGatedRnnMaxStackLayers) return "gated RNN stack (layers outside 2 to 4)";
  if (plan.stack_depth > 0 && plan.blocks != p.layers * plan.unit_slices * plan.batch_blocks)
    return "gated RNN stack (a plan for another number of layers)";
  const GatedRnnForwardParams& f0 = p.layer[0];
  if (!f0.d_wx) return "gated RNN stack (layer 0's wx is null)";
  for (int l = 0; l < p.layers; ++l) {
    const GatedRnnForwardParams& f = p.layer[l];
    if (!same_layer(f, f0))
      return "gated RNN stack (a layer's shape, cell or dtypes differ from layer 0's)";
    if (!f.d_R) return "gated RNN stack (a layer's R is null)";
    if (l > 0 && !p.d_W[l]) return "gated RNN stack (the input weights W of a layer above 0 are null)";
  }
  if (!p.layer[p.layers - 1].d_y) return "gated RNN stack (the last layer's y is null)";
  return nullptr;
}

// What the stack's backward reads without checking: every layer like layer
// 0, each layer's y and the last layer's gradient of y present, the inputs
// of the layers above (W) present and their wx and grad_wx not (the
// workspace's), and a plan of plan_gated_rnn_stack_backward with the
// stack's workspace (layer by layer, or the reverse wavefront for as many
// layers).
const char* stack_backward_params_invalid(const GatedRnnStackBackwardParams& p, const GatedRnnPlan& plan) {
  if (p.layers < 2 || p.layers > kGatedRnnMaxStackLayers) return "gated RNN stack (layers outside 2 to 4)";
  const bool own = plan.stack_depth == 0 ? plan.ws_stack_y >= 0 && plan.ws_stack_wt >= 0
                                         : plan.ws_stack_layer > 0 && plan.ws_stack_parts >= 0;
  if (!own || plan.ws_rh < 0 || plan.ws_stack_wx < 0 || plan.ws_stack_grad_wx < 0)
    return "gated RNN stack backward (not a plan of plan_gated_rnn_stack_backward)";
  if (plan.stack_depth > 0 && plan.blocks != p.layers * plan.unit_slices * plan.batch_blocks)
    return "gated RNN stack (a plan for another number of layers)";
  const GatedRnnForwardParams& f0 = p.layer[0].fwd;
  if (!f0.d_wx) return "gated RNN stack (layer 0's wx is null)";
  for (int l = 0; l < p.layers; ++l) {
    const GatedRnnBackwardParams& b = p.layer[l];
    const GatedRnnForwardParams& f = b.fwd;
    if (!same_layer(f, f0))
      return "gated RNN stack (a layer's shape, cell or dtypes differ from layer 0's)";
    if (!f.d_R || !f.d_y) return "gated RNN stack (a layer's R or y is null)";
    if (l > 0 && (!p.d_W[l] || f.d_wx || b.d_grad_wx || b.d_grad_rh))
      return "gated RNN stack (a layer above 0 without W, or with its own wx, grad_wx or grad_rh)";
  }
  if (!p.layer[p.layers - 1].d_grad_y) return "gated RNN stack (the last layer's grad_y is null)";
  return nullptr;
}

}  // namespace

LaunchResult launch_gated_rnn_stack_backward(const GatedRnnStackBackwardParams& params,
                                             const GatedRnnPlan& plan, float* d_workspace,
                                             cudaStream_t stream) noexcept {
  if (const char* why = stack_backward_params_invalid(params, plan)) return {cudaErrorInvalidValue, why};
  switch (params.layer[0].fwd.cell) {
    case GatedRnnCell::gru:
      return stack_backward_for<GatedRnnCell::gru>(params, plan, d_workspace, stream);
    case GatedRnnCell::lstm:
      return stack_backward_for<GatedRnnCell::lstm>(params, plan, d_workspace, stream);
    case GatedRnnCell::slstm: break;
  }
  return {cudaErrorInvalidValue, "gated RNN stack dispatch (GRU and LSTM layers only)"};
}

LaunchResult launch_gated_rnn_stack_forward(const GatedRnnStackParams& params,
                                            const GatedRnnPlan& plan, float* d_workspace,
                                            cudaStream_t stream) noexcept {
  if (const char* why = stack_params_invalid(params, plan)) return {cudaErrorInvalidValue, why};
  switch (params.layer[0].cell) {
    case GatedRnnCell::gru:
      return stack_forward_for<GatedRnnCell::gru>(params, plan, d_workspace, stream);
    case GatedRnnCell::lstm:
      return stack_forward_for<GatedRnnCell::lstm>(params, plan, d_workspace, stream);
    case GatedRnnCell::slstm: break;
  }
  return {cudaErrorInvalidValue, "gated RNN stack dispatch (GRU and LSTM layers only)"};
}

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
