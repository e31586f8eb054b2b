// What every scan handler does, for any row of a scan target: the buffer
// layout is read from the row, so one pair of functions serves both forms of
// the contract (include/exphil/xla_ffi.h, "Scans"):
//
//   full form    operands inputs..., h0?           results y, h_final
//                operands inputs..., h0?, y, grad_y, grad_h_final?
//                                                  results grads..., grad_h0?
//   y-only form  operands inputs..., h0            results y
//                operands inputs..., h0, y, grad_y results grads..., grad_h0
//
// (the y-only form is the operand and result lists of Edifice's fused scan
// ops: h0 always there, no final state in either direction).
// scan_handlers.cpp and scan_y_handlers.cpp instantiate the handlers.
#pragma once

#include <cuda_runtime_api.h>

#include <initializer_list>
#include <string_view>

#include "exphil/scan.hpp"
#include "guarded_call.hpp"
#include "handler_binding.hpp"
#include "target_rows.hpp"
#include "xla/ffi/api/ffi.h"

namespace exphil::xla_ffi {

// The number of sequence inputs, at compile time for the checks below (and
// checked against the library's scan_input_count in the calls).
constexpr int scan_inputs(ScanOp op) {
  return op == ScanOp::min_lstm || op == ScanOp::min_lstm_activated ? 3 : 2;
}

// The sequence inputs a backward row takes as operands: all of the op's, or
// all but b for linear_scan's row without it (exphil_linear_scan_y_bwd,
// Edifice's operands: the library then reads the states from y).
constexpr int backward_row_inputs(const TargetRow& row, ScanOp op) {
  const int n = scan_inputs(op);
  return op == ScanOp::linear_scan && word(row.operands, n - 1) == "h0" ? n - 1 : n;
}

// Whether `row` is a scan forward of `op` in either form; each handler
// checks its row with it when it compiles.
constexpr bool is_scan_forward_row(const TargetRow& row, ScanOp op) {
  const int n = scan_inputs(op);
  const std::string_view h0 = word(row.operands, n);
  if (operand_count(row) != n + 1 || word(row.results, 0) != "y") return false;
  if (h0 == "h0?") return result_count(row) == 2 && word(row.results, 1) == "h_final";
  return h0 == "h0" && result_count(row) == 1;
}

// Whether `row` is a scan backward of `op` in either form (the y-only form
// of linear_scan may leave out b; its gradient is still a result).
constexpr bool is_scan_backward_row(const TargetRow& row, ScanOp op) {
  const int n = scan_inputs(op);
  const int m = backward_row_inputs(row, op);
  const std::string_view h0 = word(row.operands, m);
  if (word(row.operands, m + 1) != "y" || word(row.operands, m + 2) != "grad_y" ||
      result_count(row) != n + 1)
    return false;
  if (h0 == "h0?")
    return m == n && operand_count(row) == n + 4 && word(row.operands, n + 3) == "grad_h_final?" &&
           word(row.results, n) == "grad_h0?";
  return h0 == "h0" && operand_count(row) == m + 3 && word(row.results, n) == "grad_h0";
}

// buffers: the row's operands, then its results. An absent h0 (full form
// only) is a zero initial state; h_final (full form only) is written.
ffi::Error scan_forward_call(const TargetRow& row, ScanOp op, cudaStream_t stream,
                             const ffi::Dictionary& attributes,
                             std::initializer_list<ffi::AnyBuffer> buffers);

// buffers: the row's operands, then its results. h0 and grad_h_final may be
// absent in the full form (a zero initial state; no gradient into the final
// state), grad_h0 then not written; the y-only form has no grad_h_final,
// and for linear_scan may have no b (backward_row_inputs).
ffi::Error scan_backward_call(const TargetRow& row, ScanOp op, cudaStream_t stream,
                              const ffi::Dictionary& attributes,
                              std::initializer_list<ffi::AnyBuffer> buffers);

// The handler of row kTargetRows[row_index], a scan forward of `op`.
template <ScanOp op, int row_index>
XLA_FFI_Error* scan_forward_handler(XLA_FFI_CallFrame* frame) noexcept {
  constexpr const TargetRow& row = kTargetRows[row_index];
  static_assert(is_scan_forward_row(row, op),
                "forward: inputs..., h0?; y, h_final or inputs..., h0; y");
  return guarded_call(row.name, frame, [](XLA_FFI_CallFrame* f) {
    // Built on first use and kept for the life of the process, as XLA's own
    // handler macros do.
    static const auto* const handler =
        stream_attributes_and_buffers<operand_count(row), result_count(row)>()
            .To([](cudaStream_t stream, const ffi::Dictionary& attributes, auto... buffers) {
              return scan_forward_call(kTargetRows[row_index], op, stream, attributes,
                                       {buffer_of(buffers)...});
            }, kHandlerTraits)
            .release();
    return handler->Call(f);
  });
}

// The handler of row kTargetRows[row_index], a scan backward of `op`.
template <ScanOp op, int row_index>
XLA_FFI_Error* scan_backward_handler(XLA_FFI_CallFrame* frame) noexcept {
  constexpr const TargetRow& row = kTargetRows[row_index];
  static_assert(is_scan_backward_row(row, op),
                "backward: inputs..., h0?, y, grad_y, grad_h_final?; grads..., grad_h0? "
                "or inputs..., h0, y, grad_y; grads..., grad_h0");
  return guarded_call(row.name, frame, [](XLA_FFI_CallFrame* f) {
    static const auto* const handler =
        stream_attributes_and_buffers<operand_count(row), result_count(row)>()
            .To([](cudaStream_t stream, const ffi::Dictionary& attributes, auto... buffers) {
              return scan_backward_call(kTargetRows[row_index], op, stream, attributes,
                                        {buffer_of(buffers)...});
            }, kHandlerTraits)
            .release();
    return handler->Call(f);
  });
}

}  // namespace exphil::xla_ffi
