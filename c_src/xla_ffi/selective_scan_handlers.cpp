// The selective-scan handlers, exphil_selective_scan_fwd and _bwd. The
// optional inputs (dt_bias, D, z, h0) and grad_h_final are absent when their
// buffer has zero elements, since an XLA custom call has a fixed operand list.
#include <utility>

#include "buffer_views.hpp"
#include "error_mapping.hpp"
#include "exphil/selective_scan.hpp"
#include "exphil/xla_ffi.h"
#include "guarded_call.hpp"
#include "handler_binding.hpp"

namespace exphil::xla_ffi {

namespace {

constexpr const char* kForwardTarget = "exphil_selective_scan_fwd";
constexpr const char* kBackwardTarget = "exphil_selective_scan_bwd";

// The attributes of both directions, after the buffers.
template <class Binding>
auto with_delta_attributes(Binding&& binding) {
  return std::move(binding)
      .template Attr<bool>("softplus")
      .template Attr<bool>("clamp")
      .template Attr<float>("dt_min")
      .template Attr<float>("dt_max");
}

SelectiveScanOptions options_of(bool softplus, bool clamp, float dt_min, float dt_max) {
  SelectiveScanOptions options;
  options.softplus = softplus;
  options.clamp = clamp;
  options.dt_min = dt_min;
  options.dt_max = dt_max;
  return options;
}

SelectiveScanInputs describe_inputs(BufferViews& views, const ffi::AnyBuffer& x,
                                    const ffi::AnyBuffer& dt, const ffi::AnyBuffer& A,
                                    const ffi::AnyBuffer& B, const ffi::AnyBuffer& C,
                                    const ffi::AnyBuffer& dt_bias, const ffi::AnyBuffer& D,
                                    const ffi::AnyBuffer& z, const ffi::AnyBuffer& h0) {
  SelectiveScanInputs in;
  in.x = views.operand("x", x);
  in.dt = views.operand("dt", dt);
  in.A = views.operand("A", A);
  in.B = views.operand("B", B);
  in.C = views.operand("C", C);
  in.dt_bias = views.optional_operand("dt_bias", dt_bias);
  in.D = views.optional_operand("D", D);
  in.z = views.optional_operand("z", z);
  in.h0 = views.optional_operand("h0", h0);
  return in;
}

ffi::Error forward(cudaStream_t stream, ffi::AnyBuffer x, ffi::AnyBuffer dt, ffi::AnyBuffer A,
                   ffi::AnyBuffer B, ffi::AnyBuffer C, ffi::AnyBuffer dt_bias, ffi::AnyBuffer D,
                   ffi::AnyBuffer z, ffi::AnyBuffer h0, ffi::Result<ffi::AnyBuffer> y,
                   ffi::Result<ffi::AnyBuffer> h_final, bool softplus, bool clamp, float dt_min,
                   float dt_max) {
  BufferViews views(kForwardTarget);
  SelectiveScanForwardArgs args;
  args.in = describe_inputs(views, x, dt, A, B, C, dt_bias, D, z, h0);
  args.options = options_of(softplus, clamp, dt_min, dt_max);
  args.y = views.result("y", *y);
  args.h_final = views.result("h_final", *h_final);
  if (!views.ok()) return views.error();
  return to_ffi_error(kForwardTarget, selective_scan_forward(args, stream));
}

ffi::Error backward(cudaStream_t stream, ffi::AnyBuffer x, ffi::AnyBuffer dt, ffi::AnyBuffer A,
                    ffi::AnyBuffer B, ffi::AnyBuffer C, ffi::AnyBuffer dt_bias, ffi::AnyBuffer D,
                    ffi::AnyBuffer z, ffi::AnyBuffer h0, ffi::AnyBuffer grad_y,
                    ffi::AnyBuffer grad_h_final, ffi::Result<ffi::AnyBuffer> grad_x,
                    ffi::Result<ffi::AnyBuffer> grad_dt, ffi::Result<ffi::AnyBuffer> grad_A,
                    ffi::Result<ffi::AnyBuffer> grad_B, ffi::Result<ffi::AnyBuffer> grad_C,
                    ffi::Result<ffi::AnyBuffer> grad_dt_bias, ffi::Result<ffi::AnyBuffer> grad_D,
                    ffi::Result<ffi::AnyBuffer> grad_z, ffi::Result<ffi::AnyBuffer> grad_h0,
                    bool softplus, bool clamp, float dt_min, float dt_max) {
  BufferViews views(kBackwardTarget);
  SelectiveScanBackwardArgs args;
  args.in = describe_inputs(views, x, dt, A, B, C, dt_bias, D, z, h0);
  args.options = options_of(softplus, clamp, dt_min, dt_max);
  args.grad_y = views.operand("grad_y", grad_y);
  args.grad_h_final = views.optional_operand("grad_h_final", grad_h_final);
  args.grad_x = views.result("grad_x", *grad_x);
  args.grad_dt = views.result("grad_dt", *grad_dt);
  args.grad_A = views.result("grad_A", *grad_A);
  args.grad_B = views.result("grad_B", *grad_B);
  args.grad_C = views.result("grad_C", *grad_C);
  args.grad_dt_bias =
      views.optional_gradient("grad_dt_bias", *grad_dt_bias, "dt_bias", args.in.dt_bias);
  args.grad_D = views.optional_gradient("grad_D", *grad_D, "D", args.in.D);
  args.grad_z = views.optional_gradient("grad_z", *grad_z, "z", args.in.z);
  args.grad_h0 = views.optional_gradient("grad_h0", *grad_h0, "h0", args.in.h0);
  if (!views.ok()) return views.error();
  return to_ffi_error(kBackwardTarget, selective_scan_backward(args, stream));
}

}  // namespace

}  // namespace exphil::xla_ffi

namespace xf = exphil::xla_ffi;

extern "C" {

XLA_FFI_Error* exphil_selective_scan_fwd(XLA_FFI_CallFrame* call_frame) {
  return xf::guarded_call(xf::kForwardTarget, call_frame, [](XLA_FFI_CallFrame* f) {
    // Built on first use and kept for the life of the process, as XLA's own
    // handler macros do.
    static const auto* const handler =
        xf::with_delta_attributes(xf::stream_and_buffers<9, 2>()).To(xf::forward, xf::kHandlerTraits).release();
    return handler->Call(f);
  });
}

XLA_FFI_Error* exphil_selective_scan_bwd(XLA_FFI_CallFrame* call_frame) {
  return xf::guarded_call(xf::kBackwardTarget, call_frame, [](XLA_FFI_CallFrame* f) {
    static const auto* const handler =
        xf::with_delta_attributes(xf::stream_and_buffers<11, 9>()).To(xf::backward, xf::kHandlerTraits).release();
    return handler->Call(f);
  });
}

}  // extern "C"
