// The scan handlers of the full form, exphil_<op>_fwd and exphil_<op>_bwd
// for the ops of exphil.h, and the calls every scan handler makes
// (scan_calls.hpp): one function per direction, which reads the buffer
// layout from the target's row (the ops differ only in their number of
// inputs and their names, which the library provides).
#include "scan_calls.hpp"

#include <cstddef>
#include <string>

#include "attributes.hpp"
#include "buffer_views.hpp"
#include "error_mapping.hpp"
#include "exphil/xla_ffi.h"

namespace exphil::xla_ffi {

ffi::Error scan_forward_call(const TargetRow& row, ScanOp op, cudaStream_t stream,
                             const ffi::Dictionary& attributes,
                             std::initializer_list<ffi::AnyBuffer> buffers) {
  const char* target = row.name;
  const int n = scan_input_count(op);
  const int operands = operand_count(row);
  if (n != scan_inputs(op) ||
      buffers.size() != static_cast<std::size_t>(operands + result_count(row)))
    return ffi::Error::Internal(std::string(target) + ": binding and op disagree on the inputs");
  const bool h0_optional = is_optional(word(row.operands, n));
  const bool h_final = result_count(row) == 2;
  CallAttributes attrs(row, attributes);
  const Presence h0 = h0_optional ? attrs.presence("h0") : Presence::present;
  if (!attrs.ok()) return attrs.error();
  const ffi::AnyBuffer* b = buffers.begin();
  BufferViews views(target);
  ScanForwardArgs args;
  args.op = op;
  for (int i = 0; i < n; ++i) args.inputs[i] = views.operand(scan_input_name(op, i), b[i]);
  args.h0 = h0_optional ? views.optional_operand("h0", b[n], h0) : views.operand("h0", b[n]);
  args.y = views.result("y", b[operands]);
  // The y-only form has no h_final: the library's optional output, not written.
  args.h_final = h_final ? views.result("h_final", b[operands + 1]) : nullptr;
  if (!views.ok()) return views.error();
  return to_ffi_error(target, scan_forward(args, stream));
}

ffi::Error scan_backward_call(const TargetRow& row, ScanOp op, cudaStream_t stream,
                              const ffi::Dictionary& attributes,
                              std::initializer_list<ffi::AnyBuffer> buffers) {
  const char* target = row.name;
  const int n = scan_input_count(op);
  const int m = backward_row_inputs(row, op);  // the inputs among the operands
  const int operands = operand_count(row);
  if (n != scan_inputs(op) ||
      buffers.size() != static_cast<std::size_t>(operands + result_count(row)))
    return ffi::Error::Internal(std::string(target) + ": binding and op disagree on the inputs");
  const bool h0_optional = is_optional(word(row.operands, m));
  const bool grad_h_final_operand = operands == m + 4;
  CallAttributes attrs(row, attributes);
  const Presence h0 = h0_optional ? attrs.presence("h0") : Presence::present;
  const Presence grad_h_final =
      grad_h_final_operand ? attrs.presence("grad_h_final") : Presence::absent;
  if (!attrs.ok()) return attrs.error();
  const ffi::AnyBuffer* b = buffers.begin();
  BufferViews views(target);
  ScanBackwardArgs args;
  args.op = op;
  // An input the row leaves out stays null (linear_scan's b: the library
  // reads the states from y).
  for (int i = 0; i < m; ++i) args.inputs[i] = views.operand(scan_input_name(op, i), b[i]);
  args.h0 = h0_optional ? views.optional_operand("h0", b[m], h0) : views.operand("h0", b[m]);
  args.y = views.operand("y", b[m + 1]);
  args.grad_y = views.operand("grad_y", b[m + 2]);
  // The y-only form has no grad_h_final operand: no gradient into the final state.
  args.grad_h_final = grad_h_final_operand
                          ? views.optional_operand("grad_h_final", b[m + 3], grad_h_final)
                          : nullptr;
  for (int i = 0; i < n; ++i)
    args.grad_inputs[i] = views.result(scan_grad_input_name(op, i), b[operands + i]);
  args.grad_h0 = h0_optional
                     ? views.optional_gradient("grad_h0", b[operands + n], "h0", args.h0, h0)
                     : views.result("grad_h0", b[operands + n]);
  if (!views.ok()) return views.error();
  return to_ffi_error(target, scan_backward(args, stream));
}

}  // namespace exphil::xla_ffi

using exphil::ScanOp;
using exphil::xla_ffi::scan_backward_handler;
using exphil::xla_ffi::scan_forward_handler;
using exphil::xla_ffi::target_index;

extern "C" {

XLA_FFI_Error* exphil_linear_scan_fwd(XLA_FFI_CallFrame* call_frame) {
  return scan_forward_handler<ScanOp::linear_scan, target_index("exphil_linear_scan_fwd")>(
      call_frame);
}
XLA_FFI_Error* exphil_linear_scan_bwd(XLA_FFI_CallFrame* call_frame) {
  return scan_backward_handler<ScanOp::linear_scan, target_index("exphil_linear_scan_bwd")>(
      call_frame);
}
XLA_FFI_Error* exphil_min_gru_fwd(XLA_FFI_CallFrame* call_frame) {
  return scan_forward_handler<ScanOp::min_gru, target_index("exphil_min_gru_fwd")>(call_frame);
}
XLA_FFI_Error* exphil_min_gru_bwd(XLA_FFI_CallFrame* call_frame) {
  return scan_backward_handler<ScanOp::min_gru, target_index("exphil_min_gru_bwd")>(call_frame);
}
XLA_FFI_Error* exphil_min_lstm_fwd(XLA_FFI_CallFrame* call_frame) {
  return scan_forward_handler<ScanOp::min_lstm, target_index("exphil_min_lstm_fwd")>(call_frame);
}
XLA_FFI_Error* exphil_min_lstm_bwd(XLA_FFI_CallFrame* call_frame) {
  return scan_backward_handler<ScanOp::min_lstm, target_index("exphil_min_lstm_bwd")>(call_frame);
}
XLA_FFI_Error* exphil_liquid_fwd(XLA_FFI_CallFrame* call_frame) {
  return scan_forward_handler<ScanOp::liquid, target_index("exphil_liquid_fwd")>(call_frame);
}
XLA_FFI_Error* exphil_liquid_bwd(XLA_FFI_CallFrame* call_frame) {
  return scan_backward_handler<ScanOp::liquid, target_index("exphil_liquid_bwd")>(call_frame);
}

}  // extern "C"
