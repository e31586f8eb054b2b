// The attention handlers, exphil_attention_fwd and _bwd, and
// exphil_attention_o_fwd, Edifice's :fused_flash_attention: the forward with
// o as its only result (lse not computed: NULL in the C++ API) and a fourth
// operand, Edifice's causal flag, bound but never read (its value comes as
// the mask attribute); exphil_attention_o_bwd, Edifice's
// :fused_flash_attention_backward: the backward without lse (recompute_lse
// in the C++ API: a forward pass into the library's workspace) and the same
// unread flag, last. The mask, window, layout, scale and precision
// attributes are passed to the library unchecked; it reports bad values with
// the names of exphil.h. Buffers are bound by name (described_call.hpp).
#include "described_call.hpp"
#include "exphil/attention.hpp"
#include "exphil/xla_ffi.h"

namespace exphil::xla_ffi {

namespace {

// The attributes of both directions.
AttentionOptions options_of(CallAttributes& attrs) {
  AttentionOptions options;
  options.mask = static_cast<AttentionMask>(attrs.i32("mask"));
  options.window = attrs.i32("window");
  options.layout = static_cast<AttentionLayout>(attrs.i32("layout"));
  options.scale = attrs.f32("scale");
  options.precision = static_cast<AttentionPrecision>(attrs.i32("precision"));
  return options;
}

AttentionForwardArgs forward_args(CallAttributes& attrs) {
  AttentionForwardArgs a;
  a.options = options_of(attrs);
  return a;
}

// recompute_lse: the rows without an lse operand (Edifice's).
template <bool recompute_lse>
AttentionBackwardArgs backward_args(CallAttributes& attrs) {
  AttentionBackwardArgs a;
  a.options = options_of(attrs);
  a.recompute_lse = recompute_lse;
  return a;
}

static_assert(has_word(target_row("exphil_attention_bwd").operands, "lse", false) &&
              !has_word(target_row("exphil_attention_o_bwd").operands, "lse", false));

}  // namespace

}  // namespace exphil::xla_ffi

namespace xf = exphil::xla_ffi;

extern "C" {

XLA_FFI_Error* exphil_attention_fwd(XLA_FFI_CallFrame* call_frame) {
  return xf::described_handler<xf::target_index("exphil_attention_fwd"), &xf::forward_args>(call_frame);
}

XLA_FFI_Error* exphil_attention_bwd(XLA_FFI_CallFrame* call_frame) {
  return xf::described_handler<xf::target_index("exphil_attention_bwd"), &xf::backward_args<false>>(call_frame);
}

XLA_FFI_Error* exphil_attention_o_fwd(XLA_FFI_CallFrame* call_frame) {
  return xf::described_handler<xf::target_index("exphil_attention_o_fwd"), &xf::forward_args>(call_frame);
}

XLA_FFI_Error* exphil_attention_o_bwd(XLA_FFI_CallFrame* call_frame) {
  return xf::described_handler<xf::target_index("exphil_attention_o_bwd"), &xf::backward_args<true>>(call_frame);
}

}  // extern "C"
