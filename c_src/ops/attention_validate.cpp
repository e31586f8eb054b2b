#include "attention_validate.hpp"

#include <cmath>
#include <cstdint>
#include <string>

#include "attention/attention_config.h"
#include "runtime/cuda_status.hpp"
#include "runtime/format.hpp"

namespace exphil::runtime {

namespace {

// The kernels move rows in 16-byte vectors.
constexpr uintptr_t kVectorBytes = 16;

// Applies the rules argument by argument. q fixes the dtype, B, Hq, T and d;
// k fixes Hkv and S.
class AttentionChecker {
 public:
  enum class Rows { query, key };

  AttentionChecker(AttentionCall& call, AttentionLayout layout) : call_(call), layout_(layout) {}

  Status options(const AttentionOptions& o) {
    const auto mask = static_cast<int32_t>(o.mask);
    if (mask < EXPHIL_ATTENTION_MASK_NONE || mask > EXPHIL_ATTENTION_MASK_WINDOW)
      return {StatusCode::invalid_argument,
              "argument 'options': expected mask 0 (none), 1 (causal) or 2 (window), got " +
                  std::to_string(mask)};
    if (o.mask == AttentionMask::window && o.window < 1)
      return {StatusCode::invalid_argument,
              "argument 'options': expected window >= 1 with the window mask, got " +
                  std::to_string(o.window)};
    const auto layout = static_cast<int32_t>(o.layout);
    if (layout != EXPHIL_ATTENTION_BHTD && layout != EXPHIL_ATTENTION_BTHD)
      return {StatusCode::invalid_argument,
              "argument 'options': expected layout 0 ([B, H, T, d]) or 1 ([B, T, H, d]), got " +
                  std::to_string(layout)};
    if (!std::isfinite(o.scale))
      return {StatusCode::invalid_argument,
              "argument 'options': expected a finite scale (0 for 1 / sqrt(d)), got " +
                  std::to_string(o.scale)};
    const auto precision = static_cast<int32_t>(o.precision);
    if (precision != EXPHIL_ATTENTION_EXACT && precision != EXPHIL_ATTENTION_TF32X3)
      return {StatusCode::invalid_argument,
              "argument 'options': expected precision 0 (exact) or 1 (tf32x3), got " +
                  std::to_string(precision)};
    return {};
  }

  // After q: tf32x3 is a way of multiplying f32, and nothing else.
  Status precision_for_dtype(const AttentionOptions& o) const {
    if (o.precision == AttentionPrecision::tf32x3 && dtype_ != DType::f32)
      return {StatusCode::invalid_argument,
              std::string("argument 'options': precision 1 (tf32x3) applies to f32 inputs; "
                          "expected precision 0 (exact) with q of dtype ") +
                  dtype_name(dtype_) + ", got 1"};
    return {};
  }

  Status q(const Tensor* t, const void*& data) {
    EXPHIL_RETURN_IF_ERROR(check_descriptor("q", t, 4, layout_desc(Rows::query)));
    dtype_ = static_cast<DType>(t->dtype);
    auto& s = call_.shape;
    s.batch = t->shape[0];
    s.q_heads = heads(*t);
    s.q_len = length(*t);
    std::size_t bytes = 0;
    EXPHIL_RETURN_IF_ERROR(check_extent("q", *t, bytes));
    // The grid's y and z extents.
    constexpr int64_t kMaxGridYz = 65535;
    if (s.batch > kMaxGridYz || s.q_heads > kMaxGridYz)
      return {StatusCode::not_supported,
              arg_prefix("q") + "B = " + std::to_string(s.batch) + " and Hq = " +
                  std::to_string(s.q_heads) + "; the kernels support B and Hq up to 65535"};
    if (t->shape[3] > 128 || !kernels::attention_head_dim_supported(static_cast<int>(t->shape[3])))
      return {StatusCode::not_supported,
              arg_prefix("q") + "head width d = " + std::to_string(t->shape[3]) +
                  "; the kernels support d = 32, 64, 96 and 128"};
    s.head_dim = static_cast<int>(t->shape[3]);
    return accept_sized("q", t, bytes, false, data);
  }

  Status k(const Tensor* t, const void*& data) {
    EXPHIL_RETURN_IF_ERROR(check_descriptor("k", t, 4, layout_desc(Rows::key)));
    auto& s = call_.shape;
    EXPHIL_RETURN_IF_ERROR(check_dtype("k", *t));
    std::size_t bytes = 0;
    EXPHIL_RETURN_IF_ERROR(check_extent("k", *t, bytes));
    const int64_t hkv = heads(*t), len = length(*t);
    if (t->shape[0] != s.batch || t->shape[3] != s.head_dim) {
      const std::string want = std::string(layout_desc(Rows::key)) + " with B = " +
                               std::to_string(s.batch) + " and d = " + std::to_string(s.head_dim) +
                               " (from 'q')";
      return {StatusCode::invalid_argument,
              arg_prefix("k") + "expected shape " + want + ", got " + shape_string(t->shape, 4)};
    }
    if (s.q_heads % hkv != 0)
      return {StatusCode::invalid_argument,
              arg_prefix("k") + "expected a head count Hkv that divides Hq = " +
                  std::to_string(s.q_heads) + " (the heads of 'q'), got Hkv = " +
                  std::to_string(hkv)};
    s.kv_heads = hkv;
    s.kv_len = len;
    return accept_sized("k", t, bytes, false, data);
  }

  // A tensor shaped as q (Rows::query) or k (Rows::key), of q's dtype.
  Status rows(const char* name, const Tensor* t, Rows rows, bool optional, bool output,
              const void*& data) {
    data = nullptr;
    if (!t && optional) return {};
    const auto& s = call_.shape;
    const bool query = rows == Rows::query;
    const char* desc = query ? layout_desc(Rows::query) : layout_desc(Rows::key);
    EXPHIL_RETURN_IF_ERROR(check_descriptor(name, t, 4, desc));
    const int64_t h = query ? s.q_heads : s.kv_heads, len = query ? s.q_len : s.kv_len;
    const int64_t dims[4] = {s.batch, layout_ == AttentionLayout::bhtd ? h : len,
                             layout_ == AttentionLayout::bhtd ? len : h, s.head_dim};
    EXPHIL_RETURN_IF_ERROR(check_shape(name, *t, dims, query ? "the shape of 'q'" : "the shape of 'k'"));
    EXPHIL_RETURN_IF_ERROR(check_dtype(name, *t));
    return accept(name, t, output, data);
  }

  template <class T>
  Status rows(const char* name, const Tensor* t, Rows r, bool optional, bool output, T*& data) {
    const void* p = nullptr;
    EXPHIL_RETURN_IF_ERROR(rows(name, t, r, optional, output, p));
    data = static_cast<T*>(const_cast<void*>(p));
    return {};
  }

  // lse [B, Hq, T], f32, whatever the layout.
  template <class T>
  Status lse(const Tensor* t, bool optional, bool output, T*& data) {
    data = nullptr;
    if (!t && optional) return {};
    const auto& s = call_.shape;
    EXPHIL_RETURN_IF_ERROR(check_descriptor("lse", t, 3, "[B, Hq, T]"));
    const int64_t dims[3] = {s.batch, s.q_heads, s.q_len};
    EXPHIL_RETURN_IF_ERROR(check_shape("lse", *t, dims, "[B, Hq, T] from 'q'"));
    if (static_cast<DType>(t->dtype) != DType::f32)
      return {StatusCode::invalid_argument,
              arg_prefix("lse") + "expected dtype f32, got " + dtype_name(static_cast<DType>(t->dtype))};
    std::size_t bytes = 0;
    EXPHIL_RETURN_IF_ERROR(check_extent("lse", *t, bytes));
    EXPHIL_RETURN_IF_ERROR(check_element_alignment("lse", *t));
    EXPHIL_RETURN_IF_ERROR(call_.tensors.add("lse", t->data, bytes, output));
    data = static_cast<T*>(t->data);
    return {};
  }

  DType dtype() const noexcept { return dtype_; }

  // Element strides of the [B, H, L, d] view of a tensor with h heads and
  // len rows per head.
  kernels::AttentionStrides strides(int64_t h, int64_t len) const {
    const int64_t d = call_.shape.head_dim;
    if (layout_ == AttentionLayout::bhtd) return {h * len * d, len * d, d};
    return {len * h * d, d, h * d};
  }

 private:
  const char* layout_desc(Rows rows) const {
    const bool query = rows == Rows::query;
    if (layout_ == AttentionLayout::bhtd) return query ? "[B, Hq, T, d]" : "[B, Hkv, S, d]";
    return query ? "[B, T, Hq, d]" : "[B, S, Hkv, d]";
  }
  int64_t heads(const Tensor& t) const {
    return layout_ == AttentionLayout::bhtd ? t.shape[1] : t.shape[2];
  }
  int64_t length(const Tensor& t) const {
    return layout_ == AttentionLayout::bhtd ? t.shape[2] : t.shape[1];
  }

  Status check_dtype(const char* name, const Tensor& t) const {
    const auto got = static_cast<DType>(t.dtype);
    if (got != dtype_)
      return {StatusCode::invalid_argument, arg_prefix(name) + "expected dtype " + dtype_name(dtype_) +
                                                " (the dtype of 'q'), got " + dtype_name(got)};
    return {};
  }

  Status accept(const char* name, const Tensor* t, bool output, const void*& data) {
    std::size_t bytes = 0;
    EXPHIL_RETURN_IF_ERROR(check_extent(name, *t, bytes));
    return accept_sized(name, t, bytes, output, data);
  }

  // accept() for a tensor whose extent was already checked (q and k, whose
  // dimensions are read before they are accepted).
  Status accept_sized(const char* name, const Tensor* t, std::size_t bytes, bool output,
                      const void*& data) {
    if (reinterpret_cast<uintptr_t>(t->data) % kVectorBytes != 0)
      return {StatusCode::invalid_argument,
              arg_prefix(name) + "data pointer " + pointer_string(t->data) +
                  " is not aligned to 16 bytes (the attention kernels move rows in 16-byte "
                  "vectors; device allocations always are)"};
    EXPHIL_RETURN_IF_ERROR(call_.tensors.add(name, t->data, bytes, output));
    data = t->data;
    return {};
  }

  AttentionCall& call_;
  AttentionLayout layout_;
  DType dtype_ = DType::f32;
};

using Rows = AttentionChecker::Rows;

// Options, q, k and v: what both directions take.
Status check_inputs(AttentionChecker& check, const AttentionInputs& in,
                    const AttentionOptions& options, const void*& q, const void*& k, const void*& v) {
  EXPHIL_RETURN_IF_ERROR(check.options(options));
  EXPHIL_RETURN_IF_ERROR(check.q(in.q, q));
  EXPHIL_RETURN_IF_ERROR(check.precision_for_dtype(options));
  EXPHIL_RETURN_IF_ERROR(check.k(in.k, k));
  EXPHIL_RETURN_IF_ERROR(check.rows("v", in.v, Rows::key, false, false, v));
  return {};
}

void fill_problem(const AttentionChecker& check, const AttentionOptions& o,
                  const kernels::AttentionShape& s, kernels::AttentionProblem& p) {
  p.shape = s;
  p.dtype = check.dtype();
  p.mask = static_cast<kernels::AttentionMaskKind>(o.mask);
  p.precision = static_cast<kernels::AttentionPrecision>(o.precision);
  p.window = o.mask == AttentionMask::window ? o.window : 0;
  p.scale = o.scale != 0.0f ? o.scale : static_cast<float>(1.0 / std::sqrt(double(s.head_dim)));
  p.q_strides = check.strides(s.q_heads, s.q_len);
  p.kv_strides = check.strides(s.kv_heads, s.kv_len);
}

}  // namespace

Status validate_attention_forward(const AttentionForwardArgs& args,
                                  kernels::AttentionForwardParams& params, AttentionCall& call) {
  AttentionChecker check(call, args.options.layout);
  EXPHIL_RETURN_IF_ERROR(
      check_inputs(check, args.in, args.options, params.d_q, params.d_k, params.d_v));
  EXPHIL_RETURN_IF_ERROR(check.rows("o", args.o, Rows::query, false, true, params.d_o));
  EXPHIL_RETURN_IF_ERROR(check.lse(args.lse, true, true, params.d_lse));
  EXPHIL_RETURN_IF_ERROR(call.tensors.check_no_overlaps());
  fill_problem(check, args.options, call.shape, params.problem);
  return {};
}

Status validate_attention_backward(const AttentionBackwardArgs& args,
                                   kernels::AttentionBackwardParams& params, AttentionCall& call) {
  AttentionChecker check(call, args.options.layout);
  EXPHIL_RETURN_IF_ERROR(
      check_inputs(check, args.in, args.options, params.d_q, params.d_k, params.d_v));
  EXPHIL_RETURN_IF_ERROR(check.rows("o", args.o, Rows::query, false, false, params.d_o));
  if (args.recompute_lse && args.lse)
    return {StatusCode::invalid_argument,
            arg_prefix("lse") + "expected NULL with recompute_lse (the call computes it)"};
  EXPHIL_RETURN_IF_ERROR(check.lse(args.lse, args.recompute_lse, false, params.d_lse));
  EXPHIL_RETURN_IF_ERROR(check.rows("grad_o", args.grad_o, Rows::query, false, false, params.d_grad_o));
  EXPHIL_RETURN_IF_ERROR(check.rows("grad_q", args.grad_q, Rows::query, true, true, params.d_grad_q));
  EXPHIL_RETURN_IF_ERROR(check.rows("grad_k", args.grad_k, Rows::key, true, true, params.d_grad_k));
  EXPHIL_RETURN_IF_ERROR(check.rows("grad_v", args.grad_v, Rows::key, true, true, params.d_grad_v));
  EXPHIL_RETURN_IF_ERROR(call.tensors.check_no_overlaps());
  fill_problem(check, args.options, call.shape, params.problem);
  return {};
}

}  // namespace exphil::runtime
