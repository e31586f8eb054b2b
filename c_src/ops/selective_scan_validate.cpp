#include "selective_scan_validate.hpp"

#include <cmath>
#include <string>

#include "runtime/cuda_status.hpp"
#include "runtime/format.hpp"
#include "selective_scan/selective_scan_config.h"

namespace exphil::runtime {

namespace {

// Applies the rules argument by argument. x fixes the dtype and [B, T, D],
// A fixes N.
class SelectiveScanChecker {
 public:
  explicit SelectiveScanChecker(SelectiveScanCall& call) : call_(call) {}

  Status x(const Tensor* t, const void*& data) {
    EXPHIL_RETURN_IF_ERROR(check_descriptor("x", t, 3, "[B, T, D]"));
    dtype_ = static_cast<DType>(t->dtype);
    call_.shape.batch = t->shape[0];
    call_.shape.steps = t->shape[1];
    call_.shape.channels = t->shape[2];
    return accept("x", t, false, data);
  }

  Status A(const Tensor* t, const float*& data) {
    EXPHIL_RETURN_IF_ERROR(check_descriptor("A", t, 2, "[D, N]"));
    EXPHIL_RETURN_IF_ERROR(check_dtype("A", *t, DType::f32, false));
    if (t->shape[0] != call_.shape.channels)
      return {StatusCode::invalid_argument,
              arg_prefix("A") + "expected shape [D, N] with D = " + std::to_string(call_.shape.channels) +
                  " (the last dimension of 'x'), got " + shape_string(t->shape, 2)};
    call_.shape.states = t->shape[1];
    const void* p = nullptr;
    EXPHIL_RETURN_IF_ERROR(accept("A", t, false, p));
    if (call_.shape.states > kernels::kSsMaxStates)
      return {StatusCode::not_supported,
              arg_prefix("A") + "N = " + std::to_string(call_.shape.states) +
                  " states per channel; the kernels support N from 1 to " +
                  std::to_string(kernels::kSsMaxStates)};
    data = static_cast<const float*>(p);
    return {};
  }

  enum class Layout { sequence, projection, parameter, channel, state };

  // A tensor of the given layout. `optional`: may be NULL (data stays null).
  // `f32`: must be f32, otherwise the dtype of x.
  Status tensor(const char* name, const Tensor* t, Layout layout, bool f32, bool optional,
                bool output, const void*& data) {
    data = nullptr;
    if (!t && optional) return {};
    const auto& s = call_.shape;
    int rank = 3;
    int64_t dims[3] = {s.batch, s.steps, s.channels};
    // The layout's dimensions, and (for messages) where they come from.
    const char* desc = "[B, T, D]";
    const char* source = "[B, T, D] of 'x'";
    switch (layout) {
      case Layout::sequence: break;
      case Layout::projection:
        dims[2] = s.states;
        desc = "[B, T, N]";
        source = "[B, T, N] from 'x' and 'A'";
        break;
      case Layout::parameter:
        rank = 2;
        dims[0] = s.channels;
        dims[1] = s.states;
        desc = "[D, N]";
        source = "[D, N] of 'A'";
        break;
      case Layout::channel:
        rank = 1;
        dims[0] = s.channels;
        desc = "[D]";
        source = "[D] from 'x'";
        break;
      case Layout::state:
        dims[1] = s.channels;
        dims[2] = s.states;
        desc = "[B, D, N]";
        source = "[B, D, N] from 'x' and 'A'";
        break;
    }
    EXPHIL_RETURN_IF_ERROR(check_descriptor(name, t, rank, desc));
    EXPHIL_RETURN_IF_ERROR(check_shape(name, *t, dims, source));
    if (f32) {
      EXPHIL_RETURN_IF_ERROR(check_dtype(name, *t, DType::f32, false));
    } else {
      EXPHIL_RETURN_IF_ERROR(check_dtype(name, *t, dtype_, true));
    }
    return accept(name, t, output, data);
  }

  template <class T>
  Status tensor(const char* name, const Tensor* t, Layout layout, bool f32, bool optional,
                bool output, T*& data) {
    const void* p = nullptr;
    EXPHIL_RETURN_IF_ERROR(tensor(name, t, layout, f32, optional, output, p));
    data = static_cast<T*>(const_cast<void*>(p));
    return {};
  }

  // The gradient of an optional input may only be asked for with the input.
  template <class T>
  Status gradient(const char* name, const Tensor* t, const char* input, bool input_present,
                  Layout layout, bool f32, T*& data) {
    if (t && !input_present)
      return {StatusCode::invalid_argument,
              arg_prefix(name) + "expected NULL, since '" + input + "' is absent (no gradient to write)"};
    return tensor(name, t, layout, f32, true, true, data);
  }

  DType dtype() const noexcept { return dtype_; }

 private:
  // `of_x`: the expected dtype is x's, and the message says so.
  static Status check_dtype(const char* name, const Tensor& t, DType want, bool of_x) {
    const auto got = static_cast<DType>(t.dtype);
    if (got != want)
      return {StatusCode::invalid_argument,
              arg_prefix(name) + "expected dtype " + dtype_name(want) +
                  (of_x ? " (the dtype of 'x')" : "") + ", got " + dtype_name(got)};
    return {};
  }

  Status accept(const char* name, const Tensor* t, bool output, const void*& data) {
    return accept_tensor(call_.tensors, name, *t, output, data);
  }

  SelectiveScanCall& call_;
  DType dtype_ = DType::f32;
};

using Layout = SelectiveScanChecker::Layout;

Status check_options(const SelectiveScanOptions& o, kernels::DeltaRule& rule) {
  if (o.input_scale != SelectiveScanInputScale::delta &&
      o.input_scale != SelectiveScanInputScale::channel_mean)
    return {StatusCode::invalid_argument,
            "argument 'options': expected input_scale delta (0) or channel_mean (1), got " +
                std::to_string(static_cast<int>(o.input_scale))};
  rule.softplus = o.softplus;
  rule.clamp = o.clamp;
  if (o.clamp) {
    if (!std::isfinite(o.dt_min) || !std::isfinite(o.dt_max) || o.dt_min > o.dt_max)
      return {StatusCode::invalid_argument,
              "argument 'options': expected finite clamp bounds with dt_min <= dt_max, got "
              "dt_min = " + std::to_string(o.dt_min) + ", dt_max = " + std::to_string(o.dt_max)};
    rule.dt_min = o.dt_min;
    rule.dt_max = o.dt_max;
  }
  return {};
}

// The inputs both directions take, in the order exphil.h lists them.
Status check_inputs(SelectiveScanChecker& check, const SelectiveScanInputs& in,
                    const SelectiveScanOptions& options, kernels::SelectiveScanForwardParams& p) {
  EXPHIL_RETURN_IF_ERROR(check.x(in.x, p.d_x));
  EXPHIL_RETURN_IF_ERROR(check.tensor("dt", in.dt, Layout::sequence, false, false, false, p.d_dt));
  EXPHIL_RETURN_IF_ERROR(check.A(in.A, p.d_A));
  EXPHIL_RETURN_IF_ERROR(check.tensor("B", in.B, Layout::projection, false, false, false, p.d_B));
  EXPHIL_RETURN_IF_ERROR(check.tensor("C", in.C, Layout::projection, false, false, false, p.d_C));
  EXPHIL_RETURN_IF_ERROR(
      check.tensor("dt_bias", in.dt_bias, Layout::channel, true, true, false, p.d_dt_bias));
  EXPHIL_RETURN_IF_ERROR(check.tensor("D", in.D, Layout::channel, true, true, false, p.d_D));
  EXPHIL_RETURN_IF_ERROR(check.tensor("z", in.z, Layout::sequence, false, true, false, p.d_z));
  EXPHIL_RETURN_IF_ERROR(check.tensor("h0", in.h0, Layout::state, true, true, false, p.d_h0));
  EXPHIL_RETURN_IF_ERROR(check_options(options, p.delta));
  p.dtype = check.dtype();
  return {};
}

}  // namespace

Status validate_selective_scan_forward(const SelectiveScanForwardArgs& args,
                                       kernels::SelectiveScanForwardParams& params,
                                       SelectiveScanCall& call) {
  SelectiveScanChecker check(call);
  EXPHIL_RETURN_IF_ERROR(check_inputs(check, args.in, args.options, params));
  EXPHIL_RETURN_IF_ERROR(check.tensor("y", args.y, Layout::sequence, false, false, true, params.d_y));
  EXPHIL_RETURN_IF_ERROR(
      check.tensor("h_final", args.h_final, Layout::state, true, true, true, params.d_h_final));
  EXPHIL_RETURN_IF_ERROR(call.tensors.check_no_overlaps());
  params.shape = call.shape;
  call.mean_input_scale = args.options.input_scale == SelectiveScanInputScale::channel_mean;
  return {};
}

Status validate_selective_scan_backward(const SelectiveScanBackwardArgs& args,
                                        kernels::SelectiveScanBackwardParams& params,
                                        SelectiveScanCall& call) {
  SelectiveScanChecker check(call);
  kernels::SelectiveScanForwardParams& p = params.fwd;
  EXPHIL_RETURN_IF_ERROR(check_inputs(check, args.in, args.options, p));
  if (args.options.input_scale != SelectiveScanInputScale::delta)
    return {StatusCode::invalid_argument,
            "argument 'options': input_scale channel_mean has no backward (expected delta)"};
  EXPHIL_RETURN_IF_ERROR(
      check.tensor("grad_y", args.grad_y, Layout::sequence, false, false, false, params.d_grad_y));
  EXPHIL_RETURN_IF_ERROR(check.tensor("grad_h_final", args.grad_h_final, Layout::state, true, true,
                                      false, params.d_grad_h_final));
  EXPHIL_RETURN_IF_ERROR(
      check.gradient("grad_x", args.grad_x, "x", true, Layout::sequence, false, params.d_grad_x));
  EXPHIL_RETURN_IF_ERROR(check.gradient("grad_dt", args.grad_dt, "dt", true, Layout::sequence,
                                        false, params.d_grad_dt));
  EXPHIL_RETURN_IF_ERROR(
      check.gradient("grad_A", args.grad_A, "A", true, Layout::parameter, true, params.d_grad_A));
  EXPHIL_RETURN_IF_ERROR(
      check.gradient("grad_B", args.grad_B, "B", true, Layout::projection, false, params.d_grad_B));
  EXPHIL_RETURN_IF_ERROR(
      check.gradient("grad_C", args.grad_C, "C", true, Layout::projection, false, params.d_grad_C));
  EXPHIL_RETURN_IF_ERROR(check.gradient("grad_dt_bias", args.grad_dt_bias, "dt_bias",
                                        p.d_dt_bias != nullptr, Layout::channel, true,
                                        params.d_grad_dt_bias));
  EXPHIL_RETURN_IF_ERROR(check.gradient("grad_D", args.grad_D, "D", p.d_D != nullptr,
                                        Layout::channel, true, params.d_grad_D));
  EXPHIL_RETURN_IF_ERROR(check.gradient("grad_z", args.grad_z, "z", p.d_z != nullptr,
                                        Layout::sequence, false, params.d_grad_z));
  EXPHIL_RETURN_IF_ERROR(check.gradient("grad_h0", args.grad_h0, "h0", p.d_h0 != nullptr,
                                        Layout::state, true, params.d_grad_h0));
  EXPHIL_RETURN_IF_ERROR(call.tensors.check_no_overlaps());
  p.shape = call.shape;
  return {};
}

}  // namespace exphil::runtime
