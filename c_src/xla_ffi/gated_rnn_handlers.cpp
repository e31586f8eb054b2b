// The GRU and LSTM sequence handlers, exphil_gru_fwd/_bwd and
// exphil_lstm_fwd/_bwd (include/exphil/xla_ffi.h): their buffers bound by
// name (described_call.hpp), their only attributes the has_* flags of the
// optional operands.
#include "described_call.hpp"
#include "exphil/gated_rnn.hpp"
#include "exphil/xla_ffi.h"

namespace exphil::xla_ffi {

namespace {

// The args of a gated-RNN row: its cell.
template <class Args, GatedRnnCell cell>
Args gated_rnn_args(CallAttributes&) {
  Args a;
  a.cell = cell;
  return a;
}

}  // namespace

}  // namespace exphil::xla_ffi

namespace xf = exphil::xla_ffi;
using exphil::GatedRnnBackwardArgs;
using exphil::GatedRnnCell;
using exphil::GatedRnnForwardArgs;

extern "C" {

XLA_FFI_Error* exphil_gru_fwd(XLA_FFI_CallFrame* call_frame) {
  return xf::described_handler<xf::target_index("exphil_gru_fwd"),
                               &xf::gated_rnn_args<GatedRnnForwardArgs, GatedRnnCell::gru>>(call_frame);
}

XLA_FFI_Error* exphil_gru_bwd(XLA_FFI_CallFrame* call_frame) {
  return xf::described_handler<xf::target_index("exphil_gru_bwd"),
                               &xf::gated_rnn_args<GatedRnnBackwardArgs, GatedRnnCell::gru>>(call_frame);
}

XLA_FFI_Error* exphil_lstm_fwd(XLA_FFI_CallFrame* call_frame) {
  return xf::described_handler<xf::target_index("exphil_lstm_fwd"),
                               &xf::gated_rnn_args<GatedRnnForwardArgs, GatedRnnCell::lstm>>(call_frame);
}

XLA_FFI_Error* exphil_lstm_bwd(XLA_FFI_CallFrame* call_frame) {
  return xf::described_handler<xf::target_index("exphil_lstm_bwd"),
                               &xf::gated_rnn_args<GatedRnnBackwardArgs, GatedRnnCell::lstm>>(call_frame);
}

}  // extern "C"
