// The selective-scan handlers, exphil_selective_scan_fwd and _bwd. The
// optional inputs (dt_bias, D, z, h0) and grad_h_final are absent when their
// has_* attribute is false or, without it, when their buffer has zero
// elements, since an XLA custom call has a fixed operand list. And
// exphil_selective_scan_y_bwd, Edifice's :fused_selective_scan_backward: the
// same backward without those operands (all absent) and without grad_A (not
// computed: the C++ API leaves a NULL gradient unwritten); and
// exphil_selective_scan_y_fwd, Edifice's :fused_selective_scan: the forward
// without the optional operands and h_final, with the input_scale attribute
// (Edifice scales the input term by the mean of delta over the channels).
// Buffers are bound by name (described_call.hpp).
#include "described_call.hpp"
#include "exphil/selective_scan.hpp"
#include "exphil/xla_ffi.h"

namespace exphil::xla_ffi {

namespace {

// The attributes of every row; input_scale only where the row has it (the
// library names a bad value).
SelectiveScanOptions options_of(CallAttributes& attrs, bool input_scale) {
  SelectiveScanOptions options;
  options.softplus = attrs.i1("softplus");
  options.clamp = attrs.i1("clamp");
  options.dt_min = attrs.f32("dt_min");
  options.dt_max = attrs.f32("dt_max");
  if (input_scale) options.input_scale = static_cast<SelectiveScanInputScale>(attrs.i32("input_scale"));
  return options;
}

template <bool input_scale>
SelectiveScanForwardArgs forward_args(CallAttributes& attrs) {
  SelectiveScanForwardArgs a;
  a.options = options_of(attrs, input_scale);
  return a;
}

SelectiveScanBackwardArgs backward_args(CallAttributes& attrs) {
  SelectiveScanBackwardArgs a;
  a.options = options_of(attrs, false);
  return a;
}

}  // namespace

}  // namespace exphil::xla_ffi

namespace xf = exphil::xla_ffi;

extern "C" {

XLA_FFI_Error* exphil_selective_scan_fwd(XLA_FFI_CallFrame* call_frame) {
  return xf::described_handler<xf::target_index("exphil_selective_scan_fwd"), &xf::forward_args<false>>(call_frame);
}

XLA_FFI_Error* exphil_selective_scan_bwd(XLA_FFI_CallFrame* call_frame) {
  return xf::described_handler<xf::target_index("exphil_selective_scan_bwd"), &xf::backward_args>(call_frame);
}

XLA_FFI_Error* exphil_selective_scan_y_fwd(XLA_FFI_CallFrame* call_frame) {
  return xf::described_handler<xf::target_index("exphil_selective_scan_y_fwd"), &xf::forward_args<true>>(call_frame);
}

XLA_FFI_Error* exphil_selective_scan_y_bwd(XLA_FFI_CallFrame* call_frame) {
  return xf::described_handler<xf::target_index("exphil_selective_scan_y_bwd"), &xf::backward_args>(call_frame);
}

}  // extern "C"
