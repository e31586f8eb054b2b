// The scan handlers: the full form of the ops of exphil.h, exphil_<op>_fwd
// and exphil_<op>_bwd, and the y-only form of Edifice's fused scan ops
// (mix_stub/EDIFICE.md), exphil_<op>_y_fwd and _y_bwd, in which h0 is always
// an operand, y the forward's only result and the backward has no
// grad_h_final operand. The activated ops (gates after the sigmoid),
// diag_linear and elu_gru have this form only. Their buffers are bound by
// name (described_call.hpp); the ops differ only in their ScanOp.
//
// linear_scan's y-only backward takes no b (Edifice's
// :fused_linear_scan_backward passes a, h0, y, grad_y): the library then
// reads each state h_{t-1} from y instead of rebuilding it from (a, b)
// (cuda/scan/scan_backward.cuh, kStatesFromY). It also serves Edifice's
// diagonal linear backward, which passes sigmoid(a) as a.
#include "described_call.hpp"
#include "exphil/scan.hpp"
#include "exphil/xla_ffi.h"

namespace exphil::xla_ffi {

namespace {

// The args of a scan row: its op; scans have no attributes but presence flags.
template <class Args, ScanOp op>
Args scan_args(CallAttributes&) {
  Args a;
  a.op = op;
  return a;
}

}  // namespace

}  // namespace exphil::xla_ffi

namespace xf = exphil::xla_ffi;
using exphil::ScanOp;

// The handler of target `name`, a scan of `op` in `direction` (Forward or
// Backward).
#define EXPHIL_SCAN_HANDLER(name, op, direction)                                                        \
  XLA_FFI_Error* name(XLA_FFI_CallFrame* call_frame) {                                                  \
    return xf::described_handler<xf::target_index(#name),                                               \
                                 &xf::scan_args<exphil::Scan##direction##Args, ScanOp::op>>(call_frame); \
  }

extern "C" {

EXPHIL_SCAN_HANDLER(exphil_linear_scan_fwd, linear_scan, Forward)
EXPHIL_SCAN_HANDLER(exphil_linear_scan_bwd, linear_scan, Backward)
EXPHIL_SCAN_HANDLER(exphil_min_gru_fwd, min_gru, Forward)
EXPHIL_SCAN_HANDLER(exphil_min_gru_bwd, min_gru, Backward)
EXPHIL_SCAN_HANDLER(exphil_min_lstm_fwd, min_lstm, Forward)
EXPHIL_SCAN_HANDLER(exphil_min_lstm_bwd, min_lstm, Backward)
EXPHIL_SCAN_HANDLER(exphil_liquid_fwd, liquid, Forward)
EXPHIL_SCAN_HANDLER(exphil_liquid_bwd, liquid, Backward)

EXPHIL_SCAN_HANDLER(exphil_linear_scan_y_fwd, linear_scan, Forward)
EXPHIL_SCAN_HANDLER(exphil_linear_scan_y_bwd, linear_scan, Backward)
EXPHIL_SCAN_HANDLER(exphil_min_gru_y_fwd, min_gru, Forward)
EXPHIL_SCAN_HANDLER(exphil_liquid_y_fwd, liquid, Forward)
EXPHIL_SCAN_HANDLER(exphil_liquid_y_bwd, liquid, Backward)
EXPHIL_SCAN_HANDLER(exphil_min_gru_activated_fwd, min_gru_activated, Forward)
EXPHIL_SCAN_HANDLER(exphil_min_gru_activated_bwd, min_gru_activated, Backward)
EXPHIL_SCAN_HANDLER(exphil_min_lstm_activated_fwd, min_lstm_activated, Forward)
EXPHIL_SCAN_HANDLER(exphil_min_lstm_activated_bwd, min_lstm_activated, Backward)
EXPHIL_SCAN_HANDLER(exphil_diag_linear_y_fwd, diag_linear, Forward)
EXPHIL_SCAN_HANDLER(exphil_elu_gru_y_fwd, elu_gru, Forward)

}  // extern "C"
