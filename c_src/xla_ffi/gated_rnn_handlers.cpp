// The GRU and LSTM sequence handlers (include/exphil/xla_ffi.h): the full
// form, exphil_gru_fwd/_bwd and exphil_lstm_fwd/_bwd, whose only attributes
// are the has_* flags of the optional operands; and the y-only form of
// Edifice's :fused_gru_scan and :fused_lstm_scan and their backward ops
// (mix_stub/EDIFICE.md), exphil_gru_y_fwd/_bwd and exphil_lstm_y_fwd/_bwd:
// h0 (and c0) always operands, no bias, y the forward's only result, no
// final-state gradients, and of the backward's gradients only Edifice's
// (grad_wx, the GRU's grad_rh, from which Edifice forms grad_R itself, and
// the initial states'). The sLSTM's (op "slstm") likewise: the full form
// exphil_slstm_fwd/_bwd, with the states n and m besides h and c, and
// Edifice's :fused_slstm_scan, exphil_slstm_y_fwd (wx, R, h0, c0 -> y; n0
// and m0 absent, the library's ones and zeros, as Edifice's fallback starts
// them; Edifice has no backward op for it). The stacks' full form,
// exphil_gru_stack_fwd/_bwd and exphil_lstm_stack_fwd/_bwd (ops gru_stack
// and lstm_stack): the forward's results y, y_lower (which its backward
// reads) and the final states. Their buffers are bound by name
// (described_call.hpp): a tensor a row leaves out is NULL in the args, the
// library's "absent" (bias) or "not computed" (grad_R, grad_bias).
#include "described_call.hpp"
#include "exphil/gated_rnn.hpp"
#include "exphil/xla_ffi.h"

namespace exphil::xla_ffi {

namespace {

// The args of a gated-RNN row: its cell (the y-only forms and the sLSTM's
// rows, whose targets list no precision: exact).
template <class Args, GatedRnnCell cell>
Args gated_rnn_args(CallAttributes&) {
  Args a;
  a.cell = cell;
  return a;
}

// The full forms of the GRU's and LSTM's rows and the stacks': also the
// precision attribute (checked with the other arguments).
template <class Args, GatedRnnCell cell>
Args gated_rnn_args_with_options(CallAttributes& attrs) {
  Args a = gated_rnn_args<Args, cell>(attrs);
  a.options.precision = static_cast<exphil::GatedRnnPrecision>(attrs.i32("precision"));
  return a;
}

}  // namespace

}  // namespace exphil::xla_ffi

namespace xf = exphil::xla_ffi;
using exphil::GatedRnnBackwardArgs;
using exphil::GatedRnnCell;
using exphil::GatedRnnForwardArgs;
using exphil::GatedRnnStackBackwardArgs;
using exphil::GatedRnnStackForwardArgs;

extern "C" {

XLA_FFI_Error* exphil_gru_fwd(XLA_FFI_CallFrame* call_frame) {
  return xf::described_handler<xf::target_index("exphil_gru_fwd"),
                               &xf::gated_rnn_args_with_options<GatedRnnForwardArgs, GatedRnnCell::gru>>(call_frame);
}

XLA_FFI_Error* exphil_gru_bwd(XLA_FFI_CallFrame* call_frame) {
  return xf::described_handler<xf::target_index("exphil_gru_bwd"),
                               &xf::gated_rnn_args_with_options<GatedRnnBackwardArgs, GatedRnnCell::gru>>(call_frame);
}

XLA_FFI_Error* exphil_lstm_fwd(XLA_FFI_CallFrame* call_frame) {
  return xf::described_handler<xf::target_index("exphil_lstm_fwd"),
                               &xf::gated_rnn_args_with_options<GatedRnnForwardArgs, GatedRnnCell::lstm>>(call_frame);
}

XLA_FFI_Error* exphil_lstm_bwd(XLA_FFI_CallFrame* call_frame) {
  return xf::described_handler<xf::target_index("exphil_lstm_bwd"),
                               &xf::gated_rnn_args_with_options<GatedRnnBackwardArgs, GatedRnnCell::lstm>>(call_frame);
}

XLA_FFI_Error* exphil_gru_y_fwd(XLA_FFI_CallFrame* call_frame) {
  return xf::described_handler<xf::target_index("exphil_gru_y_fwd"),
                               &xf::gated_rnn_args<GatedRnnForwardArgs, GatedRnnCell::gru>>(call_frame);
}

XLA_FFI_Error* exphil_gru_y_bwd(XLA_FFI_CallFrame* call_frame) {
  return xf::described_handler<xf::target_index("exphil_gru_y_bwd"),
                               &xf::gated_rnn_args<GatedRnnBackwardArgs, GatedRnnCell::gru>>(call_frame);
}

XLA_FFI_Error* exphil_lstm_y_fwd(XLA_FFI_CallFrame* call_frame) {
  return xf::described_handler<xf::target_index("exphil_lstm_y_fwd"),
                               &xf::gated_rnn_args<GatedRnnForwardArgs, GatedRnnCell::lstm>>(call_frame);
}

XLA_FFI_Error* exphil_lstm_y_bwd(XLA_FFI_CallFrame* call_frame) {
  return xf::described_handler<xf::target_index("exphil_lstm_y_bwd"),
                               &xf::gated_rnn_args<GatedRnnBackwardArgs, GatedRnnCell::lstm>>(call_frame);
}

XLA_FFI_Error* exphil_slstm_fwd(XLA_FFI_CallFrame* call_frame) {
  return xf::described_handler<xf::target_index("exphil_slstm_fwd"),
                               &xf::gated_rnn_args<GatedRnnForwardArgs, GatedRnnCell::slstm>>(call_frame);
}

XLA_FFI_Error* exphil_slstm_bwd(XLA_FFI_CallFrame* call_frame) {
  return xf::described_handler<xf::target_index("exphil_slstm_bwd"),
                               &xf::gated_rnn_args<GatedRnnBackwardArgs, GatedRnnCell::slstm>>(call_frame);
}

XLA_FFI_Error* exphil_slstm_y_fwd(XLA_FFI_CallFrame* call_frame) {
  return xf::described_handler<xf::target_index("exphil_slstm_y_fwd"),
                               &xf::gated_rnn_args<GatedRnnForwardArgs, GatedRnnCell::slstm>>(call_frame);
}

XLA_FFI_Error* exphil_gru_stack_fwd(XLA_FFI_CallFrame* call_frame) {
  return xf::described_handler<xf::target_index("exphil_gru_stack_fwd"),
                               &xf::gated_rnn_args_with_options<GatedRnnStackForwardArgs, GatedRnnCell::gru>>(call_frame);
}

XLA_FFI_Error* exphil_gru_stack_bwd(XLA_FFI_CallFrame* call_frame) {
  return xf::described_handler<xf::target_index("exphil_gru_stack_bwd"),
                               &xf::gated_rnn_args_with_options<GatedRnnStackBackwardArgs, GatedRnnCell::gru>>(call_frame);
}

XLA_FFI_Error* exphil_lstm_stack_fwd(XLA_FFI_CallFrame* call_frame) {
  return xf::described_handler<xf::target_index("exphil_lstm_stack_fwd"),
                               &xf::gated_rnn_args_with_options<GatedRnnStackForwardArgs, GatedRnnCell::lstm>>(call_frame);
}

XLA_FFI_Error* exphil_lstm_stack_bwd(XLA_FFI_CallFrame* call_frame) {
  return xf::described_handler<xf::target_index("exphil_lstm_stack_bwd"),
                               &xf::gated_rnn_args_with_options<GatedRnnStackBackwardArgs, GatedRnnCell::lstm>>(call_frame);
}

}  // extern "C"
