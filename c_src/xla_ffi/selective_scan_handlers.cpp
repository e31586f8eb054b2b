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
#include "attributes.hpp"
#include "buffer_views.hpp"
#include "error_mapping.hpp"
#include "exphil/selective_scan.hpp"
#include "exphil/xla_ffi.h"
#include "guarded_call.hpp"
#include "handler_binding.hpp"
#include "target_rows.hpp"

namespace exphil::xla_ffi {

namespace {

constexpr const TargetRow& kForward = target_row("exphil_selective_scan_fwd");
constexpr const TargetRow& kBackward = target_row("exphil_selective_scan_bwd");
constexpr const TargetRow& kYBackward = target_row("exphil_selective_scan_y_bwd");
constexpr const TargetRow& kYForward = target_row("exphil_selective_scan_y_fwd");

// forward() and backward() below take the buffers of the rows in this order.
static_assert(kForward.operands == "x dt A B C dt_bias? D? z? h0?" &&
              kForward.results == "y h_final");
static_assert(kBackward.operands == "x dt A B C dt_bias? D? z? h0? grad_y grad_h_final?" &&
              kBackward.results ==
                  "grad_x grad_dt grad_A grad_B grad_C grad_dt_bias? grad_D? grad_z? grad_h0?");
static_assert(kYBackward.operands == "x dt A B C grad_y" &&
              kYBackward.results == "grad_x grad_dt grad_B grad_C");
static_assert(kYForward.operands == "x dt A B C" && kYForward.results == "y");

// The inputs of both directions, with the presence of each optional one.
struct InputPresence {
  Presence dt_bias, D, z, h0;
};

InputPresence input_presence(CallAttributes& attrs) {
  return {attrs.presence("dt_bias"), attrs.presence("D"), attrs.presence("z"),
          attrs.presence("h0")};
}

SelectiveScanOptions options_of(CallAttributes& attrs) {
  SelectiveScanOptions options;
  options.softplus = attrs.i1("softplus");
  options.clamp = attrs.i1("clamp");
  options.dt_min = attrs.f32("dt_min");
  options.dt_max = attrs.f32("dt_max");
  return options;
}

// The required inputs; the optional ones absent.
SelectiveScanInputs describe_required_inputs(BufferViews& views, const ffi::AnyBuffer& x,
                                             const ffi::AnyBuffer& dt, const ffi::AnyBuffer& A,
                                             const ffi::AnyBuffer& B, const ffi::AnyBuffer& C) {
  SelectiveScanInputs in;
  in.x = views.operand("x", x);
  in.dt = views.operand("dt", dt);
  in.A = views.operand("A", A);
  in.B = views.operand("B", B);
  in.C = views.operand("C", C);
  return in;
}

SelectiveScanInputs describe_inputs(BufferViews& views, const InputPresence& presence,
                                    const ffi::AnyBuffer& x, const ffi::AnyBuffer& dt,
                                    const ffi::AnyBuffer& A, const ffi::AnyBuffer& B,
                                    const ffi::AnyBuffer& C, const ffi::AnyBuffer& dt_bias,
                                    const ffi::AnyBuffer& D, const ffi::AnyBuffer& z,
                                    const ffi::AnyBuffer& h0) {
  SelectiveScanInputs in = describe_required_inputs(views, x, dt, A, B, C);
  in.dt_bias = views.optional_operand("dt_bias", dt_bias, presence.dt_bias);
  in.D = views.optional_operand("D", D, presence.D);
  in.z = views.optional_operand("z", z, presence.z);
  in.h0 = views.optional_operand("h0", h0, presence.h0);
  return in;
}

ffi::Error forward(cudaStream_t stream, const ffi::Dictionary& attributes, ffi::AnyBuffer x,
                   ffi::AnyBuffer dt, ffi::AnyBuffer A, ffi::AnyBuffer B, ffi::AnyBuffer C,
                   ffi::AnyBuffer dt_bias, ffi::AnyBuffer D, ffi::AnyBuffer z, ffi::AnyBuffer h0,
                   ffi::Result<ffi::AnyBuffer> y, ffi::Result<ffi::AnyBuffer> h_final) {
  CallAttributes attrs(kForward, attributes);
  SelectiveScanForwardArgs args;
  args.options = options_of(attrs);
  const InputPresence presence = input_presence(attrs);
  if (!attrs.ok()) return attrs.error();
  BufferViews views(kForward.name);
  args.in = describe_inputs(views, presence, x, dt, A, B, C, dt_bias, D, z, h0);
  args.y = views.result("y", *y);
  args.h_final = views.result("h_final", *h_final);
  if (!views.ok()) return views.error();
  return to_ffi_error(kForward.name, selective_scan_forward(args, stream));
}

ffi::Error backward(cudaStream_t stream, const ffi::Dictionary& attributes, ffi::AnyBuffer x,
                    ffi::AnyBuffer dt, ffi::AnyBuffer A, ffi::AnyBuffer B, ffi::AnyBuffer C,
                    ffi::AnyBuffer dt_bias, ffi::AnyBuffer D, ffi::AnyBuffer z, ffi::AnyBuffer h0,
                    ffi::AnyBuffer grad_y, ffi::AnyBuffer grad_h_final,
                    ffi::Result<ffi::AnyBuffer> grad_x, ffi::Result<ffi::AnyBuffer> grad_dt,
                    ffi::Result<ffi::AnyBuffer> grad_A, ffi::Result<ffi::AnyBuffer> grad_B,
                    ffi::Result<ffi::AnyBuffer> grad_C, ffi::Result<ffi::AnyBuffer> grad_dt_bias,
                    ffi::Result<ffi::AnyBuffer> grad_D, ffi::Result<ffi::AnyBuffer> grad_z,
                    ffi::Result<ffi::AnyBuffer> grad_h0) {
  CallAttributes attrs(kBackward, attributes);
  SelectiveScanBackwardArgs args;
  args.options = options_of(attrs);
  const InputPresence presence = input_presence(attrs);
  const Presence grad_h_final_presence = attrs.presence("grad_h_final");
  if (!attrs.ok()) return attrs.error();
  BufferViews views(kBackward.name);
  args.in = describe_inputs(views, presence, x, dt, A, B, C, dt_bias, D, z, h0);
  args.grad_y = views.operand("grad_y", grad_y);
  args.grad_h_final =
      views.optional_operand("grad_h_final", grad_h_final, grad_h_final_presence);
  args.grad_x = views.result("grad_x", *grad_x);
  args.grad_dt = views.result("grad_dt", *grad_dt);
  args.grad_A = views.result("grad_A", *grad_A);
  args.grad_B = views.result("grad_B", *grad_B);
  args.grad_C = views.result("grad_C", *grad_C);
  args.grad_dt_bias = views.optional_gradient("grad_dt_bias", *grad_dt_bias, "dt_bias",
                                              args.in.dt_bias, presence.dt_bias);
  args.grad_D = views.optional_gradient("grad_D", *grad_D, "D", args.in.D, presence.D);
  args.grad_z = views.optional_gradient("grad_z", *grad_z, "z", args.in.z, presence.z);
  args.grad_h0 = views.optional_gradient("grad_h0", *grad_h0, "h0", args.in.h0, presence.h0);
  if (!views.ok()) return views.error();
  return to_ffi_error(kBackward.name, selective_scan_backward(args, stream));
}

ffi::Error y_forward(cudaStream_t stream, const ffi::Dictionary& attributes, ffi::AnyBuffer x,
                     ffi::AnyBuffer dt, ffi::AnyBuffer A, ffi::AnyBuffer B, ffi::AnyBuffer C,
                     ffi::Result<ffi::AnyBuffer> y) {
  CallAttributes attrs(kYForward, attributes);
  SelectiveScanForwardArgs args;
  args.options = options_of(attrs);
  // Any value reaches the library, which names a bad one.
  args.options.input_scale = static_cast<SelectiveScanInputScale>(attrs.i32("input_scale"));
  if (!attrs.ok()) return attrs.error();
  BufferViews views(kYForward.name);
  args.in = describe_required_inputs(views, x, dt, A, B, C);
  args.y = views.result("y", *y);
  if (!views.ok()) return views.error();
  return to_ffi_error(kYForward.name, selective_scan_forward(args, stream));
}

ffi::Error y_backward(cudaStream_t stream, const ffi::Dictionary& attributes, ffi::AnyBuffer x,
                      ffi::AnyBuffer dt, ffi::AnyBuffer A, ffi::AnyBuffer B, ffi::AnyBuffer C,
                      ffi::AnyBuffer grad_y, ffi::Result<ffi::AnyBuffer> grad_x,
                      ffi::Result<ffi::AnyBuffer> grad_dt, ffi::Result<ffi::AnyBuffer> grad_B,
                      ffi::Result<ffi::AnyBuffer> grad_C) {
  CallAttributes attrs(kYBackward, attributes);
  SelectiveScanBackwardArgs args;
  args.options = options_of(attrs);
  if (!attrs.ok()) return attrs.error();
  BufferViews views(kYBackward.name);
  args.in = describe_required_inputs(views, x, dt, A, B, C);
  args.grad_y = views.operand("grad_y", grad_y);
  args.grad_x = views.result("grad_x", *grad_x);
  args.grad_dt = views.result("grad_dt", *grad_dt);
  args.grad_B = views.result("grad_B", *grad_B);
  args.grad_C = views.result("grad_C", *grad_C);
  if (!views.ok()) return views.error();
  return to_ffi_error(kYBackward.name, selective_scan_backward(args, stream));
}

}  // namespace

}  // namespace exphil::xla_ffi

namespace xf = exphil::xla_ffi;

extern "C" {

XLA_FFI_Error* exphil_selective_scan_fwd(XLA_FFI_CallFrame* call_frame) {
  return xf::row_handler<xf::target_index("exphil_selective_scan_fwd"), &xf::forward>(call_frame);
}

XLA_FFI_Error* exphil_selective_scan_bwd(XLA_FFI_CallFrame* call_frame) {
  return xf::row_handler<xf::target_index("exphil_selective_scan_bwd"), &xf::backward>(call_frame);
}

XLA_FFI_Error* exphil_selective_scan_y_fwd(XLA_FFI_CallFrame* call_frame) {
  return xf::row_handler<xf::target_index("exphil_selective_scan_y_fwd"), &xf::y_forward>(call_frame);
}

XLA_FFI_Error* exphil_selective_scan_y_bwd(XLA_FFI_CallFrame* call_frame) {
  return xf::row_handler<xf::target_index("exphil_selective_scan_y_bwd"), &xf::y_backward>(call_frame);
}

}  // extern "C"
