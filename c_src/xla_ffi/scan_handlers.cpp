// The scan handlers, exphil_<op>_fwd and exphil_<op>_bwd for every ScanOp:
// one template per direction, instantiated per op (the ops differ only in
// their number of inputs and their names, which the library provides).
#include <cstddef>
#include <initializer_list>
#include <string>

#include "attributes.hpp"
#include "buffer_views.hpp"
#include "error_mapping.hpp"
#include "exphil/scan.hpp"
#include "exphil/xla_ffi.h"
#include "guarded_call.hpp"
#include "handler_binding.hpp"
#include "target_rows.hpp"

namespace exphil::xla_ffi {

namespace {

enum class Direction { forward, backward };

// The rows of xla_ffi_targets.h, indexed by ScanOp and Direction, looked up
// when this compiles (a name without a row does not compile); each name is
// also the exported symbol defined below.
constexpr const TargetRow* kScanRows[][2] = {
    {&target_row("exphil_linear_scan_fwd"), &target_row("exphil_linear_scan_bwd")},
    {&target_row("exphil_min_gru_fwd"), &target_row("exphil_min_gru_bwd")},
    {&target_row("exphil_min_lstm_fwd"), &target_row("exphil_min_lstm_bwd")},
    {&target_row("exphil_liquid_fwd"), &target_row("exphil_liquid_bwd")},
};

constexpr const TargetRow& scan_row(ScanOp op, Direction direction) {
  return *kScanRows[static_cast<int>(op)][direction == Direction::forward ? 0 : 1];
}

// The number of sequence inputs, at compile time for the checks below
// (and checked against the library's scan_input_count in the handlers).
constexpr int scan_inputs(ScanOp op) { return op == ScanOp::min_lstm ? 3 : 2; }

// The buffer layout the calls below index, against the rows the bindings
// are made from.
template <ScanOp op>
constexpr bool rows_match_layout() {
  constexpr const TargetRow& fwd = scan_row(op, Direction::forward);
  constexpr const TargetRow& bwd = scan_row(op, Direction::backward);
  constexpr int n = scan_inputs(op);
  static_assert(operand_count(fwd) == n + 1 && result_count(fwd) == 2,
                "forward: inputs..., h0?; y, h_final");
  static_assert(word(fwd.operands, n) == "h0?");
  static_assert(operand_count(bwd) == n + 4 && result_count(bwd) == n + 1,
                "backward: inputs..., h0?, y, grad_y, grad_h_final?; grads..., grad_h0?");
  static_assert(word(bwd.operands, n) == "h0?" && word(bwd.operands, n + 3) == "grad_h_final?" &&
                word(bwd.results, n) == "grad_h0?");
  return true;
}
static_assert(rows_match_layout<ScanOp::linear_scan>() && rows_match_layout<ScanOp::min_gru>() &&
              rows_match_layout<ScanOp::min_lstm>() && rows_match_layout<ScanOp::liquid>());

// buffers: inputs..., h0 (absent: a zero initial state), y, h_final.
ffi::Error scan_forward_call(ScanOp op, cudaStream_t stream, const ffi::Dictionary& attributes,
                             std::initializer_list<ffi::AnyBuffer> buffers) {
  const TargetRow& row = scan_row(op, Direction::forward);
  const char* target = row.name;
  const int n = scan_input_count(op);
  if (buffers.size() != static_cast<std::size_t>(n) + 3)
    return ffi::Error::Internal(std::string(target) + ": binding and op disagree on the inputs");
  CallAttributes attrs(row, attributes);
  const Presence h0 = attrs.presence("h0");
  if (!attrs.ok()) return attrs.error();
  const ffi::AnyBuffer* b = buffers.begin();
  BufferViews views(target);
  ScanForwardArgs args;
  args.op = op;
  for (int i = 0; i < n; ++i) args.inputs[i] = views.operand(scan_input_name(op, i), b[i]);
  args.h0 = views.optional_operand("h0", b[n], h0);
  args.y = views.result("y", b[n + 1]);
  args.h_final = views.result("h_final", b[n + 2]);
  if (!views.ok()) return views.error();
  return to_ffi_error(target, scan_forward(args, stream));
}

// buffers: inputs..., h0, y, grad_y, grad_h_final, grad of each input...,
// grad_h0. h0 and grad_h_final may be absent (a zero initial state; no
// gradient into the final state); grad_h0 then is not written.
ffi::Error scan_backward_call(ScanOp op, cudaStream_t stream, const ffi::Dictionary& attributes,
                              std::initializer_list<ffi::AnyBuffer> buffers) {
  const TargetRow& row = scan_row(op, Direction::backward);
  const char* target = row.name;
  const int n = scan_input_count(op);
  if (buffers.size() != 2 * static_cast<std::size_t>(n) + 5)
    return ffi::Error::Internal(std::string(target) + ": binding and op disagree on the inputs");
  CallAttributes attrs(row, attributes);
  const Presence h0 = attrs.presence("h0");
  const Presence grad_h_final = attrs.presence("grad_h_final");
  if (!attrs.ok()) return attrs.error();
  const ffi::AnyBuffer* b = buffers.begin();
  BufferViews views(target);
  ScanBackwardArgs args;
  args.op = op;
  for (int i = 0; i < n; ++i) args.inputs[i] = views.operand(scan_input_name(op, i), b[i]);
  args.h0 = views.optional_operand("h0", b[n], h0);
  args.y = views.operand("y", b[n + 1]);
  args.grad_y = views.operand("grad_y", b[n + 2]);
  args.grad_h_final = views.optional_operand("grad_h_final", b[n + 3], grad_h_final);
  for (int i = 0; i < n; ++i)
    args.grad_inputs[i] = views.result(scan_grad_input_name(op, i), b[n + 4 + i]);
  args.grad_h0 = views.optional_gradient("grad_h0", b[2 * n + 4], "h0", args.h0, h0);
  if (!views.ok()) return views.error();
  return to_ffi_error(target, scan_backward(args, stream));
}

template <ScanOp op>
XLA_FFI_Error* scan_forward_handler(XLA_FFI_CallFrame* frame) noexcept {
  constexpr const TargetRow& row = scan_row(op, Direction::forward);
  return guarded_call(row.name, frame, [](XLA_FFI_CallFrame* f) {
    // Built on first use and kept for the life of the process, as XLA's own
    // handler macros do.
    static const auto* const handler =
        stream_attributes_and_buffers<operand_count(row), result_count(row)>()
            .To([](cudaStream_t stream, const ffi::Dictionary& attributes, auto... buffers) {
              return scan_forward_call(op, stream, attributes, {buffer_of(buffers)...});
            }, kHandlerTraits)
            .release();
    return handler->Call(f);
  });
}

template <ScanOp op>
XLA_FFI_Error* scan_backward_handler(XLA_FFI_CallFrame* frame) noexcept {
  constexpr const TargetRow& row = scan_row(op, Direction::backward);
  return guarded_call(row.name, frame, [](XLA_FFI_CallFrame* f) {
    static const auto* const handler =
        stream_attributes_and_buffers<operand_count(row), result_count(row)>()
            .To([](cudaStream_t stream, const ffi::Dictionary& attributes, auto... buffers) {
              return scan_backward_call(op, stream, attributes, {buffer_of(buffers)...});
            }, kHandlerTraits)
            .release();
    return handler->Call(f);
  });
}

}  // namespace

}  // namespace exphil::xla_ffi

using exphil::ScanOp;
using exphil::xla_ffi::scan_backward_handler;
using exphil::xla_ffi::scan_forward_handler;

extern "C" {

XLA_FFI_Error* exphil_linear_scan_fwd(XLA_FFI_CallFrame* call_frame) {
  return scan_forward_handler<ScanOp::linear_scan>(call_frame);
}
XLA_FFI_Error* exphil_linear_scan_bwd(XLA_FFI_CallFrame* call_frame) {
  return scan_backward_handler<ScanOp::linear_scan>(call_frame);
}
XLA_FFI_Error* exphil_min_gru_fwd(XLA_FFI_CallFrame* call_frame) {
  return scan_forward_handler<ScanOp::min_gru>(call_frame);
}
XLA_FFI_Error* exphil_min_gru_bwd(XLA_FFI_CallFrame* call_frame) {
  return scan_backward_handler<ScanOp::min_gru>(call_frame);
}
XLA_FFI_Error* exphil_min_lstm_fwd(XLA_FFI_CallFrame* call_frame) {
  return scan_forward_handler<ScanOp::min_lstm>(call_frame);
}
XLA_FFI_Error* exphil_min_lstm_bwd(XLA_FFI_CallFrame* call_frame) {
  return scan_backward_handler<ScanOp::min_lstm>(call_frame);
}
XLA_FFI_Error* exphil_liquid_fwd(XLA_FFI_CallFrame* call_frame) {
  return scan_forward_handler<ScanOp::liquid>(call_frame);
}
XLA_FFI_Error* exphil_liquid_bwd(XLA_FFI_CallFrame* call_frame) {
  return scan_backward_handler<ScanOp::liquid>(call_frame);
}

}  // extern "C"
