// The attention handlers, exphil_attention_fwd and _bwd. The mask, window,
// layout, scale and precision attributes are passed to the library
// unchecked; it reports bad values with the names of exphil.h.
#include <cstdint>
#include <utility>

#include "buffer_views.hpp"
#include "error_mapping.hpp"
#include "exphil/attention.hpp"
#include "exphil/xla_ffi.h"
#include "guarded_call.hpp"
#include "handler_binding.hpp"

namespace exphil::xla_ffi {

namespace {

constexpr const char* kForwardTarget = "exphil_attention_fwd";
constexpr const char* kBackwardTarget = "exphil_attention_bwd";

// The attributes of both directions, after the buffers.
template <class Binding>
auto with_attention_attributes(Binding&& binding) {
  return std::move(binding)
      .template Attr<int32_t>("mask")
      .template Attr<int32_t>("window")
      .template Attr<int32_t>("layout")
      .template Attr<float>("scale")
      .template Attr<int32_t>("precision");
}

AttentionOptions options_of(int32_t mask, int32_t window, int32_t layout, float scale,
                            int32_t precision) {
  AttentionOptions options;
  options.mask = static_cast<AttentionMask>(mask);
  options.window = window;
  options.layout = static_cast<AttentionLayout>(layout);
  options.scale = scale;
  options.precision = static_cast<AttentionPrecision>(precision);
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

ffi::Error forward(cudaStream_t stream, ffi::AnyBuffer q, ffi::AnyBuffer k, ffi::AnyBuffer v,
                   ffi::Result<ffi::AnyBuffer> o, ffi::Result<ffi::AnyBuffer> lse, int32_t mask,
                   int32_t window, int32_t layout, float scale, int32_t precision) {
  BufferViews views(kForwardTarget);
  AttentionForwardArgs args;
  args.in = describe_inputs(views, q, k, v);
  args.options = options_of(mask, window, layout, scale, precision);
  args.o = views.result("o", *o);
  args.lse = views.result("lse", *lse);
  if (!views.ok()) return views.error();
  return to_ffi_error(kForwardTarget, attention_forward(args, stream));
}

ffi::Error backward(cudaStream_t stream, ffi::AnyBuffer q, ffi::AnyBuffer k, ffi::AnyBuffer v,
                    ffi::AnyBuffer o, ffi::AnyBuffer lse, ffi::AnyBuffer grad_o,
                    ffi::Result<ffi::AnyBuffer> grad_q, ffi::Result<ffi::AnyBuffer> grad_k,
                    ffi::Result<ffi::AnyBuffer> grad_v, int32_t mask, int32_t window,
                    int32_t layout, float scale, int32_t precision) {
  BufferViews views(kBackwardTarget);
  AttentionBackwardArgs args;
  args.in = describe_inputs(views, q, k, v);
  args.options = options_of(mask, window, layout, scale, precision);
  args.o = views.operand("o", o);
  args.lse = views.operand("lse", lse);
  args.grad_o = views.operand("grad_o", grad_o);
  args.grad_q = views.result("grad_q", *grad_q);
  args.grad_k = views.result("grad_k", *grad_k);
  args.grad_v = views.result("grad_v", *grad_v);
  if (!views.ok()) return views.error();
  return to_ffi_error(kBackwardTarget, attention_backward(args, stream));
}

}  // namespace

}  // namespace exphil::xla_ffi

namespace xf = exphil::xla_ffi;

extern "C" {

XLA_FFI_Error* exphil_attention_fwd(XLA_FFI_CallFrame* call_frame) {
  return xf::guarded_call(xf::kForwardTarget, call_frame, [](XLA_FFI_CallFrame* f) {
    // Built on first use and kept for the life of the process, as XLA's own
    // handler macros do.
    static const auto* const handler =
        xf::with_attention_attributes(xf::stream_and_buffers<3, 2>()).To(xf::forward, xf::kHandlerTraits).release();
    return handler->Call(f);
  });
}

XLA_FFI_Error* exphil_attention_bwd(XLA_FFI_CallFrame* call_frame) {
  return xf::guarded_call(xf::kBackwardTarget, call_frame, [](XLA_FFI_CallFrame* f) {
    static const auto* const handler =
        xf::with_attention_attributes(xf::stream_and_buffers<6, 3>()).To(xf::backward, xf::kHandlerTraits).release();
    return handler->Call(f);
  });
}

}  // extern "C"
