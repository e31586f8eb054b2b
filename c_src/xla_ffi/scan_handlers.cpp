// The scan handlers, exphil_<op>_fwd and exphil_<op>_bwd for every ScanOp:
// one template per direction, instantiated per op (the ops differ only in
// their number of inputs and their names, which the library provides).
#include <cstddef>
#include <initializer_list>
#include <string>

#include "buffer_views.hpp"
#include "error_mapping.hpp"
#include "exphil/scan.hpp"
#include "exphil/xla_ffi.h"
#include "guarded_call.hpp"
#include "handler_binding.hpp"

namespace exphil::xla_ffi {

namespace {

enum class Direction { forward, backward };

// Indexed by ScanOp; each name is also the exported symbol defined below.
constexpr const char* kScanTargets[][2] = {
    {"exphil_linear_scan_fwd", "exphil_linear_scan_bwd"},
    {"exphil_min_gru_fwd", "exphil_min_gru_bwd"},
    {"exphil_min_lstm_fwd", "exphil_min_lstm_bwd"},
    {"exphil_liquid_fwd", "exphil_liquid_bwd"},
};

constexpr const char* scan_target(ScanOp op, Direction direction) {
  return kScanTargets[static_cast<int>(op)][direction == Direction::forward ? 0 : 1];
}

// The number of sequence inputs, at compile time for the bindings (checked
// against the library's scan_input_count in the handlers).
constexpr int scan_inputs(ScanOp op) { return op == ScanOp::min_lstm ? 3 : 2; }

// buffers: inputs..., h0 (zero elements: a zero initial state), y, h_final.
ffi::Error scan_forward_call(ScanOp op, cudaStream_t stream,
                             std::initializer_list<ffi::AnyBuffer> buffers) {
  const char* target = scan_target(op, Direction::forward);
  const int n = scan_input_count(op);
  if (buffers.size() != static_cast<std::size_t>(n) + 3)
    return ffi::Error::Internal(std::string(target) + ": binding and op disagree on the inputs");
  const ffi::AnyBuffer* b = buffers.begin();
  BufferViews views(target);
  ScanForwardArgs args;
  args.op = op;
  for (int i = 0; i < n; ++i) args.inputs[i] = views.operand(scan_input_name(op, i), b[i]);
  args.h0 = views.optional_operand("h0", b[n]);
  args.y = views.result("y", b[n + 1]);
  args.h_final = views.result("h_final", b[n + 2]);
  if (!views.ok()) return views.error();
  return to_ffi_error(target, scan_forward(args, stream));
}

// buffers: inputs..., h0, y, grad_y, grad_h_final, grad of each input...,
// grad_h0. h0 and grad_h_final may have zero elements (a zero initial state;
// no gradient into the final state), and grad_h0 must then be empty too.
ffi::Error scan_backward_call(ScanOp op, cudaStream_t stream,
                              std::initializer_list<ffi::AnyBuffer> buffers) {
  const char* target = scan_target(op, Direction::backward);
  const int n = scan_input_count(op);
  if (buffers.size() != 2 * static_cast<std::size_t>(n) + 5)
    return ffi::Error::Internal(std::string(target) + ": binding and op disagree on the inputs");
  const ffi::AnyBuffer* b = buffers.begin();
  BufferViews views(target);
  ScanBackwardArgs args;
  args.op = op;
  for (int i = 0; i < n; ++i) args.inputs[i] = views.operand(scan_input_name(op, i), b[i]);
  args.h0 = views.optional_operand("h0", b[n]);
  args.y = views.operand("y", b[n + 1]);
  args.grad_y = views.operand("grad_y", b[n + 2]);
  args.grad_h_final = views.optional_operand("grad_h_final", b[n + 3]);
  for (int i = 0; i < n; ++i)
    args.grad_inputs[i] = views.result(scan_grad_input_name(op, i), b[n + 4 + i]);
  args.grad_h0 = views.optional_gradient("grad_h0", b[2 * n + 4], "h0", args.h0);
  if (!views.ok()) return views.error();
  return to_ffi_error(target, scan_backward(args, stream));
}

template <ScanOp op>
XLA_FFI_Error* scan_forward_handler(XLA_FFI_CallFrame* frame) noexcept {
  return guarded_call(scan_target(op, Direction::forward), frame, [](XLA_FFI_CallFrame* f) {
    // Built on first use and kept for the life of the process, as XLA's own
    // handler macros do.
    static const auto* const handler =
        stream_and_buffers<scan_inputs(op) + 1, 2>()
            .To([](cudaStream_t stream, auto... buffers) {
              return scan_forward_call(op, stream, {buffer_of(buffers)...});
            }, kHandlerTraits)
            .release();
    return handler->Call(f);
  });
}

template <ScanOp op>
XLA_FFI_Error* scan_backward_handler(XLA_FFI_CallFrame* frame) noexcept {
  return guarded_call(scan_target(op, Direction::backward), frame, [](XLA_FFI_CallFrame* f) {
    static const auto* const handler =
        stream_and_buffers<scan_inputs(op) + 4, scan_inputs(op) + 1>()
            .To([](cudaStream_t stream, auto... buffers) {
              return scan_backward_call(op, stream, {buffer_of(buffers)...});
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
