#include "scan_validate.hpp"

#include <cstdint>
#include <string>

#include "runtime/cuda_status.hpp"
#include "scan/scan_config.h"

namespace exphil::runtime {

namespace {

constexpr const char* kSequenceLayout = "[B, T, H]";
constexpr const char* kStateLayout = "[B, H]";

// Applies the scan rules argument by argument. The first sequence input fixes
// the dtype and [B, T, H] for the rest of the call.
class ScanChecker {
 public:
  explicit ScanChecker(ScanCall& call) : call_(call) {}

  Status reference(const char* name, const Tensor* t, const void*& data) {
    EXPHIL_RETURN_IF_ERROR(check_descriptor(name, t, 3, kSequenceLayout));
    std::size_t bytes = 0;
    EXPHIL_RETURN_IF_ERROR(check_extent(name, *t, bytes));
    reference_name_ = name;
    dtype_ = static_cast<DType>(t->dtype);
    for (int i = 0; i < 3; ++i) dims_[i] = t->shape[i];
    call_.shape = kernels::ScanShape{dims_[0], dims_[1], dims_[2]};
    call_.vectorizable = dims_[2] % kernels::kScanVectorWidth == 0;
    return accept_sequence(name, *t, bytes, false, data);
  }

  Status sequence(const char* name, const Tensor* t, bool output, const void*& data) {
    EXPHIL_RETURN_IF_ERROR(check_descriptor(name, t, 3, kSequenceLayout));
    const std::string shape_of = std::string(kSequenceLayout) + " of '" + reference_name_ + "'";
    EXPHIL_RETURN_IF_ERROR(check_shape(name, *t, dims_, shape_of.c_str()));
    if (static_cast<DType>(t->dtype) != dtype_)
      return {StatusCode::invalid_argument,
              arg_prefix(name) + "expected dtype " + dtype_name(dtype_) +
                  " (the dtype of '" + reference_name_ + "'), got " +
                  dtype_name(static_cast<DType>(t->dtype))};
    std::size_t bytes = 0;
    EXPHIL_RETURN_IF_ERROR(check_extent(name, *t, bytes));
    return accept_sequence(name, *t, bytes, output, data);
  }

  // Optional [B, H] tensor of f32 or the sequence dtype; data stays null
  // when absent.
  Status state(const char* name, const Tensor* t, bool output, const void*& data, DType& dtype) {
    data = nullptr;
    dtype = DType::f32;
    if (!t) return {};
    EXPHIL_RETURN_IF_ERROR(check_descriptor(name, t, 2, kStateLayout));
    const int64_t state_dims[2] = {dims_[0], dims_[2]};
    const std::string shape_of = std::string("[B, H] of '") + reference_name_ + "'";
    EXPHIL_RETURN_IF_ERROR(check_shape(name, *t, state_dims, shape_of.c_str()));
    const auto got = static_cast<DType>(t->dtype);
    if (got != DType::f32 && got != dtype_)
      return {StatusCode::invalid_argument, f32_or_dtype_message(name, dtype_, reference_name_, got)};
    std::size_t bytes = 0;
    EXPHIL_RETURN_IF_ERROR(check_extent(name, *t, bytes));
    EXPHIL_RETURN_IF_ERROR(check_element_alignment(name, *t));
    EXPHIL_RETURN_IF_ERROR(call_.tensors.add(name, t->data, bytes, output));
    data = t->data;
    dtype = got;
    return {};
  }

  DType dtype() const noexcept { return dtype_; }

 private:
  Status accept_sequence(const char* name, const Tensor& t, std::size_t bytes, bool output,
                         const void*& data) {
    EXPHIL_RETURN_IF_ERROR(check_element_alignment(name, t));
    const std::size_t vector_bytes = kernels::kScanVectorWidth * dtype_size(dtype_);
    if (reinterpret_cast<uintptr_t>(t.data) % vector_bytes != 0) call_.vectorizable = false;
    EXPHIL_RETURN_IF_ERROR(call_.tensors.add(name, t.data, bytes, output));
    data = t.data;
    return {};
  }

  ScanCall& call_;
  const char* reference_name_ = "";
  DType dtype_ = DType::f32;
  int64_t dims_[3] = {0, 0, 0};
};

bool valid_op(ScanOp op) {
  switch (op) {
    case ScanOp::linear_scan:
    case ScanOp::min_gru:
    case ScanOp::min_lstm:
    case ScanOp::liquid:
    case ScanOp::min_gru_activated:
    case ScanOp::min_lstm_activated:
    case ScanOp::diag_linear:
    case ScanOp::elu_gru: return true;
  }
  return false;
}

// What both directions take first: the op's inputs (the first fixes dtype
// and [B, T, H]) and h0. With last_optional, a null last input is left out
// (its pointer stays null).
Status check_inputs(ScanChecker& check, ScanOp op, const Tensor* const* inputs, const Tensor* h0,
                    bool last_optional, const void** d_inputs, const void*& d_h0,
                    DType& h0_dtype) {
  if (!valid_op(op))
    return {StatusCode::invalid_argument, "unknown scan op " + std::to_string(static_cast<int>(op))};
  EXPHIL_RETURN_IF_ERROR(check.reference(scan_input_name(op, 0), inputs[0], d_inputs[0]));
  const int n = scan_input_count(op);
  for (int i = 1; i < n; ++i) {
    if (last_optional && i == n - 1 && !inputs[i]) continue;
    EXPHIL_RETURN_IF_ERROR(check.sequence(scan_input_name(op, i), inputs[i], false, d_inputs[i]));
  }
  return check.state("h0", h0, false, d_h0, h0_dtype);
}

}  // namespace

Status validate_scan_forward(const ScanForwardArgs& args, kernels::ScanForwardParams& params,
                             ScanCall& call) {
  ScanChecker check(call);
  EXPHIL_RETURN_IF_ERROR(check_inputs(check, args.op, args.inputs, args.h0, false, params.d_inputs,
                                      params.d_h0, params.h0_dtype));
  const void* y = nullptr;
  EXPHIL_RETURN_IF_ERROR(check.sequence("y", args.y, true, y));
  const void* h_final = nullptr;
  EXPHIL_RETURN_IF_ERROR(check.state("h_final", args.h_final, true, h_final, params.h_final_dtype));
  EXPHIL_RETURN_IF_ERROR(call.tensors.check_no_overlaps());

  params.shape = call.shape;
  params.dtype = check.dtype();
  params.d_y = const_cast<void*>(y);
  params.d_h_final = const_cast<void*>(h_final);
  return {};
}

Status validate_scan_backward(const ScanBackwardArgs& args, kernels::ScanBackwardParams& params,
                              ScanCall& call) {
  ScanChecker check(call);
  // linear_scan's backward may leave out b (scan.hpp): the states are then
  // read from y.
  const bool b_optional = args.op == ScanOp::linear_scan;
  EXPHIL_RETURN_IF_ERROR(check_inputs(check, args.op, args.inputs, args.h0, b_optional,
                                      params.d_inputs, params.d_h0, params.h0_dtype));
  params.states_from_y = b_optional && args.inputs[1] == nullptr;
  EXPHIL_RETURN_IF_ERROR(check.sequence("y", args.y, false, params.d_y));
  EXPHIL_RETURN_IF_ERROR(check.sequence("grad_y", args.grad_y, false, params.d_grad_y));
  EXPHIL_RETURN_IF_ERROR(check.state("grad_h_final", args.grad_h_final, false,
                                     params.d_grad_h_final, params.grad_h_final_dtype));
  for (int i = 0; i < scan_input_count(args.op); ++i) {
    const void* grad = nullptr;
    EXPHIL_RETURN_IF_ERROR(
        check.sequence(scan_grad_input_name(args.op, i), args.grad_inputs[i], true, grad));
    params.d_grad_inputs[i] = const_cast<void*>(grad);
  }
  const void* grad_h0 = nullptr;
  EXPHIL_RETURN_IF_ERROR(check.state("grad_h0", args.grad_h0, true, grad_h0, params.grad_h0_dtype));
  EXPHIL_RETURN_IF_ERROR(call.tensors.check_no_overlaps());

  params.shape = call.shape;
  params.dtype = check.dtype();
  params.d_grad_h0 = const_cast<void*>(grad_h0);
  return {};
}

}  // namespace exphil::runtime
