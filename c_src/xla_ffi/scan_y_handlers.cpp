// The scan handlers of the y-only form (scan_calls.hpp): h0 always an
// operand, y the forward's only result, no grad_h_final operand in the
// backward; the operand and result lists of Edifice's fused scan ops
// (mix_stub/EDIFICE.md). The activated ops (gates after the sigmoid),
// diag_linear and elu_gru have this form only.
//
// linear_scan's y-only backward takes no b (Edifice's
// :fused_linear_scan_backward passes a, h0, y, grad_y): the library then
// reads each state h_{t-1} from y instead of rebuilding it from (a, b)
// (cuda/scan/scan_backward.cuh, kStatesFromY). It also serves Edifice's
// diagonal linear backward, which passes sigmoid(a) as a.
#include "exphil/xla_ffi.h"
#include "scan_calls.hpp"

using exphil::ScanOp;
using exphil::xla_ffi::scan_backward_handler;
using exphil::xla_ffi::scan_forward_handler;
using exphil::xla_ffi::target_index;

extern "C" {

XLA_FFI_Error* exphil_linear_scan_y_fwd(XLA_FFI_CallFrame* call_frame) {
  return scan_forward_handler<ScanOp::linear_scan, target_index("exphil_linear_scan_y_fwd")>(
      call_frame);
}
XLA_FFI_Error* exphil_linear_scan_y_bwd(XLA_FFI_CallFrame* call_frame) {
  return scan_backward_handler<ScanOp::linear_scan, target_index("exphil_linear_scan_y_bwd")>(
      call_frame);
}
XLA_FFI_Error* exphil_min_gru_y_fwd(XLA_FFI_CallFrame* call_frame) {
  return scan_forward_handler<ScanOp::min_gru, target_index("exphil_min_gru_y_fwd")>(call_frame);
}
XLA_FFI_Error* exphil_liquid_y_fwd(XLA_FFI_CallFrame* call_frame) {
  return scan_forward_handler<ScanOp::liquid, target_index("exphil_liquid_y_fwd")>(call_frame);
}
XLA_FFI_Error* exphil_liquid_y_bwd(XLA_FFI_CallFrame* call_frame) {
  return scan_backward_handler<ScanOp::liquid, target_index("exphil_liquid_y_bwd")>(call_frame);
}
XLA_FFI_Error* exphil_min_gru_activated_fwd(XLA_FFI_CallFrame* call_frame) {
  return scan_forward_handler<ScanOp::min_gru_activated,
                              target_index("exphil_min_gru_activated_fwd")>(call_frame);
}
XLA_FFI_Error* exphil_min_gru_activated_bwd(XLA_FFI_CallFrame* call_frame) {
  return scan_backward_handler<ScanOp::min_gru_activated,
                               target_index("exphil_min_gru_activated_bwd")>(call_frame);
}
XLA_FFI_Error* exphil_min_lstm_activated_fwd(XLA_FFI_CallFrame* call_frame) {
  return scan_forward_handler<ScanOp::min_lstm_activated,
                              target_index("exphil_min_lstm_activated_fwd")>(call_frame);
}
XLA_FFI_Error* exphil_min_lstm_activated_bwd(XLA_FFI_CallFrame* call_frame) {
  return scan_backward_handler<ScanOp::min_lstm_activated,
                               target_index("exphil_min_lstm_activated_bwd")>(call_frame);
}

XLA_FFI_Error* exphil_diag_linear_y_fwd(XLA_FFI_CallFrame* call_frame) {
  return scan_forward_handler<ScanOp::diag_linear, target_index("exphil_diag_linear_y_fwd")>(
      call_frame);
}
XLA_FFI_Error* exphil_elu_gru_y_fwd(XLA_FFI_CallFrame* call_frame) {
  return scan_forward_handler<ScanOp::elu_gru, target_index("exphil_elu_gru_y_fwd")>(call_frame);
}

}  // extern "C"
