// The attention handlers, exphil_attention_fwd and _bwd, and
// exphil_attention_o_fwd, Edifice's :fused_flash_attention: the forward with
// o as its only result (lse not computed: NULL in the C++ API) and a fourth
// operand, Edifice's causal flag, bound but never read (its value comes as
// the mask attribute); exphil_attention_o_bwd, Edifice's
// :fused_flash_attention_backward: the backward without lse (recompute_lse
// in the C++ API: a forward pass into the library's workspace) and the same
// unread flag, last. The mask, window, layout, scale and precision
// attributes are passed to the library unchecked; it reports bad values with
// the names of exphil.h.
#include <cstdint>

#include "attributes.hpp"
#include "buffer_views.hpp"
#include "error_mapping.hpp"
#include "exphil/attention.hpp"
#include "exphil/xla_ffi.h"
#include "guarded_call.hpp"
#include "handler_binding.hpp"
#include "target_rows.hpp"

namespace exphil::xla_ffi {

namespace {

constexpr const TargetRow& kForward = target_row("exphil_attention_fwd");
constexpr const TargetRow& kBackward = target_row("exphil_attention_bwd");
constexpr const TargetRow& kOForward = target_row("exphil_attention_o_fwd");
constexpr const TargetRow& kOBackward = target_row("exphil_attention_o_bwd");

// forward() and backward() below take the buffers of the rows in this order.
static_assert(kForward.operands == "q k v" && kForward.results == "o lse");
static_assert(kBackward.operands == "q k v o lse grad_o" &&
              kBackward.results == "grad_q grad_k grad_v");
static_assert(kOForward.operands == "q k v flag" && kOForward.results == "o");
static_assert(kOBackward.operands == "q k v o grad_o flag" &&
              kOBackward.results == "grad_q grad_k grad_v");

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

AttentionInputs describe_inputs(BufferViews& views, const ffi::AnyBuffer& q,
                                const ffi::AnyBuffer& k, const ffi::AnyBuffer& v) {
  AttentionInputs in;
  in.q = views.operand("q", q);
  in.k = views.operand("k", k);
  in.v = views.operand("v", v);
  return in;
}

ffi::Error forward(cudaStream_t stream, const ffi::Dictionary& attributes, ffi::AnyBuffer q,
                   ffi::AnyBuffer k, ffi::AnyBuffer v, ffi::Result<ffi::AnyBuffer> o,
                   ffi::Result<ffi::AnyBuffer> lse) {
  CallAttributes attrs(kForward, attributes);
  AttentionForwardArgs args;
  args.options = options_of(attrs);
  if (!attrs.ok()) return attrs.error();
  BufferViews views(kForward.name);
  args.in = describe_inputs(views, q, k, v);
  args.o = views.result("o", *o);
  args.lse = views.result("lse", *lse);
  if (!views.ok()) return views.error();
  return to_ffi_error(kForward.name, attention_forward(args, stream));
}

ffi::Error backward(cudaStream_t stream, const ffi::Dictionary& attributes, ffi::AnyBuffer q,
                    ffi::AnyBuffer k, ffi::AnyBuffer v, ffi::AnyBuffer o, ffi::AnyBuffer lse,
                    ffi::AnyBuffer grad_o, ffi::Result<ffi::AnyBuffer> grad_q,
                    ffi::Result<ffi::AnyBuffer> grad_k, ffi::Result<ffi::AnyBuffer> grad_v) {
  CallAttributes attrs(kBackward, attributes);
  AttentionBackwardArgs args;
  args.options = options_of(attrs);
  if (!attrs.ok()) return attrs.error();
  BufferViews views(kBackward.name);
  args.in = describe_inputs(views, q, k, v);
  args.o = views.operand("o", o);
  args.lse = views.operand("lse", lse);
  args.grad_o = views.operand("grad_o", grad_o);
  args.grad_q = views.result("grad_q", *grad_q);
  args.grad_k = views.result("grad_k", *grad_k);
  args.grad_v = views.result("grad_v", *grad_v);
  if (!views.ok()) return views.error();
  return to_ffi_error(kBackward.name, attention_backward(args, stream));
}

// `flag` is never read (not even its element type: any buffer binds).
ffi::Error o_forward(cudaStream_t stream, const ffi::Dictionary& attributes, ffi::AnyBuffer q,
                     ffi::AnyBuffer k, ffi::AnyBuffer v, ffi::AnyBuffer /*flag*/,
                     ffi::Result<ffi::AnyBuffer> o) {
  CallAttributes attrs(kOForward, attributes);
  AttentionForwardArgs args;
  args.options = options_of(attrs);
  if (!attrs.ok()) return attrs.error();
  BufferViews views(kOForward.name);
  args.in = describe_inputs(views, q, k, v);
  args.o = views.result("o", *o);
  if (!views.ok()) return views.error();
  return to_ffi_error(kOForward.name, attention_forward(args, stream));
}

ffi::Error o_backward(cudaStream_t stream, const ffi::Dictionary& attributes, ffi::AnyBuffer q,
                      ffi::AnyBuffer k, ffi::AnyBuffer v, ffi::AnyBuffer o, ffi::AnyBuffer grad_o,
                      ffi::AnyBuffer /*flag*/, ffi::Result<ffi::AnyBuffer> grad_q,
                      ffi::Result<ffi::AnyBuffer> grad_k, ffi::Result<ffi::AnyBuffer> grad_v) {
  CallAttributes attrs(kOBackward, attributes);
  AttentionBackwardArgs args;
  args.options = options_of(attrs);
  if (!attrs.ok()) return attrs.error();
  BufferViews views(kOBackward.name);
  args.in = describe_inputs(views, q, k, v);
  args.o = views.operand("o", o);
  args.recompute_lse = true;
  args.grad_o = views.operand("grad_o", grad_o);
  args.grad_q = views.result("grad_q", *grad_q);
  args.grad_k = views.result("grad_k", *grad_k);
  args.grad_v = views.result("grad_v", *grad_v);
  if (!views.ok()) return views.error();
  return to_ffi_error(kOBackward.name, attention_backward(args, stream));
}

}  // namespace

}  // namespace exphil::xla_ffi

namespace xf = exphil::xla_ffi;

extern "C" {

XLA_FFI_Error* exphil_attention_fwd(XLA_FFI_CallFrame* call_frame) {
  return xf::row_handler<xf::target_index("exphil_attention_fwd"), &xf::forward>(call_frame);
}

XLA_FFI_Error* exphil_attention_bwd(XLA_FFI_CallFrame* call_frame) {
  return xf::row_handler<xf::target_index("exphil_attention_bwd"), &xf::backward>(call_frame);
}

XLA_FFI_Error* exphil_attention_o_fwd(XLA_FFI_CallFrame* call_frame) {
  return xf::row_handler<xf::target_index("exphil_attention_o_fwd"), &xf::o_forward>(call_frame);
}

XLA_FFI_Error* exphil_attention_o_bwd(XLA_FFI_CallFrame* call_frame) {
  return xf::row_handler<xf::target_index("exphil_attention_o_bwd"), &xf::o_backward>(call_frame);
}

}  // extern "C"
