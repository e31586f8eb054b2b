#include "gated_rnn_validate.hpp"

#include <cstdint>
#include <string>

#include "runtime/cuda_status.hpp"

namespace exphil::runtime {

namespace {

// Applies the rules argument by argument. wx fixes the sequence dtype, B, T
// and G*H; R fixes H (G*H must be G times it) and the weights' dtype; the
// first state tensor present fixes the states' dtype.
class GatedRnnChecker {
 public:
  GatedRnnChecker(GatedRnnCell cell, GatedRnnCall& call) : cell_(cell), call_(call) {}

  Status cell() const {
    if (cell_ != GatedRnnCell::gru && cell_ != GatedRnnCell::lstm && cell_ != GatedRnnCell::slstm)
      return {StatusCode::invalid_argument, "argument 'cell': expected gru (0), lstm (1) or slstm (2), got " +
                                                std::to_string(static_cast<int>(cell_))};
    return {};
  }

  int gates() const { return kernels::gated_rnn_gates(static_cast<kernels::GatedRnnCell>(cell_)); }
  bool gru() const { return cell_ == GatedRnnCell::gru; }
  const char* gates_dim() const { return gru() ? "3H" : "4H"; }

  // The layouts' names in messages ("[B, T, 3H]"), and where their extents
  // come from: literals, since validation runs on every call.
  struct LayoutText {
    const char* desc;
    const char* source;
  };
  LayoutText text(bool gru, const char* g3, const char* s3, const char* g4, const char* s4) const {
    return gru ? LayoutText{g3, s3} : LayoutText{g4, s4};
  }

  Status wx(const Tensor* t, const void*& data) {
    EXPHIL_RETURN_IF_ERROR(check_descriptor("wx", t, 3, gru() ? "[B, T, 3H]" : "[B, T, 4H]"));
    dtype_ = static_cast<DType>(t->dtype);
    call_.shape.batch = t->shape[0];
    call_.shape.steps = t->shape[1];
    gate_width_ = t->shape[2];
    EXPHIL_RETURN_IF_ERROR(accept("wx", t, false, data));
    // Steps are numbered in 32 bits in the kernels' exchange.
    if (call_.shape.steps > kMaxSteps)
      return {StatusCode::not_supported, arg_prefix("wx") + "T = " + std::to_string(call_.shape.steps) +
                                             "; the kernels support T up to " + std::to_string(kMaxSteps)};
    return {};
  }

  // After wx (its dtype).
  Status options(const GatedRnnOptions& o) const {
    const GatedRnnPrecision p = o.precision;
    if (p != GatedRnnPrecision::exact && p != GatedRnnPrecision::tf32)
      return {StatusCode::invalid_argument, "argument 'options': expected precision 0 (exact) or 1 (tf32), got " +
                                                std::to_string(static_cast<int>(p))};
    if (p == GatedRnnPrecision::tf32 && dtype_ != DType::f32)
      return {StatusCode::invalid_argument,
              std::string("argument 'options': precision 1 (tf32) applies to f32 sequences; expected "
                          "precision 0 (exact) with wx of dtype ") +
                  dtype_name(dtype_)};
    return {};
  }

  Status R(const Tensor* t, const void*& data) {
    int layers = 1;
    return recurrent_weights(t, 2, gru() ? "[H, 3H]" : "[H, 4H]", layers, data);
  }

  // The stack's R [L, H, G*H]: fixes L (2 to kGatedRnnMaxStackLayers) too.
  Status stacked_R(const Tensor* t, int& layers, const void*& data) {
    return recurrent_weights(t, 3, gru() ? "[L, H, 3H]" : "[L, H, 4H]", layers, data);
  }

  enum class Layout { sequence, gates_sequence, weights, gates, state };

  // A tensor of one layout and one dtype group: the sequence dtype, or the
  // weights' or the states' (f32 or the sequence dtype, one per call).
  enum class Group { sequence, weights, states };
  Status tensor(const char* name, const Tensor* t, Layout layout, Group group, bool optional, bool output,
                const void*& data) {
    data = nullptr;
    if (!t && optional) return {};
    const auto& s = call_.shape;
    int rank = 3;
    int64_t dims[3] = {s.batch, s.steps, s.hidden};
    LayoutText l{"[B, T, H]", "[B, T, H] from 'wx' and 'R'"};
    switch (layout) {
      case Layout::sequence: break;
      case Layout::gates_sequence:
        dims[2] = gate_width_;
        l = text(gru(), "[B, T, 3H]", "[B, T, 3H] of 'wx'", "[B, T, 4H]", "[B, T, 4H] of 'wx'");
        break;
      case Layout::weights:
        rank = 2;
        dims[0] = s.hidden;
        dims[1] = gate_width_;
        l = text(gru(), "[H, 3H]", "[H, 3H] of 'R'", "[H, 4H]", "[H, 4H] of 'R'");
        break;
      case Layout::gates:
        rank = 1;
        dims[0] = gate_width_;
        l = text(gru(), "[3H]", "[3H] from 'R'", "[4H]", "[4H] from 'R'");
        break;
      case Layout::state:
        rank = 2;
        dims[1] = s.hidden;
        l = {"[B, H]", "[B, H] from 'wx' and 'R'"};
        break;
    }
    return shaped(name, t, rank, dims, l.desc, l.source, group, output, data);
  }

  // A tensor of `rank` extents `dims`, named `desc` ("[L, H, 3H]") and
  // sourced as `source` in messages, of one dtype group; present.
  Status shaped(const char* name, const Tensor* t, int rank, const int64_t* dims, const char* desc,
                const char* source, Group group, bool output, const void*& data) {
    EXPHIL_RETURN_IF_ERROR(check_descriptor(name, t, rank, desc));
    EXPHIL_RETURN_IF_ERROR(check_shape(name, *t, dims, source));
    switch (group) {
      case Group::sequence: {
        const auto got = static_cast<DType>(t->dtype);
        if (got != dtype_)
          return {StatusCode::invalid_argument, arg_prefix(name) + "expected dtype " + dtype_name(dtype_) +
                                                    " (the dtype of 'wx'), got " + dtype_name(got)};
        break;
      }
      case Group::weights:
        EXPHIL_RETURN_IF_ERROR(group_dtype(name, *t, weight_dtype_, weight_set_, weight_source_));
        break;
      case Group::states:
        EXPHIL_RETURN_IF_ERROR(group_dtype(name, *t, state_dtype_, state_set_, state_source_));
        break;
    }
    return accept(name, t, output, data);
  }

  template <class T>
  Status tensor(const char* name, const Tensor* t, Layout layout, Group group, bool optional, bool output,
                T*& data) {
    const void* p = nullptr;
    EXPHIL_RETURN_IF_ERROR(tensor(name, t, layout, group, optional, output, p));
    data = static_cast<T*>(const_cast<void*>(p));
    return {};
  }

  // The LSTM's and sLSTM's cell state and its gradients: refused for a GRU,
  // which has none.
  template <class T>
  Status cell_state(const char* name, const Tensor* t, bool output, T*& data) {
    data = nullptr;
    if (t && cell_ == GatedRnnCell::gru)
      return {StatusCode::invalid_argument, arg_prefix(name) + "expected NULL: a GRU has no cell state"};
    return tensor(name, t, Layout::state, Group::states, true, output, data);
  }

  // The sLSTM's normaliser n and stabiliser m and their gradients: refused
  // for the other cells.
  template <class T>
  Status slstm_state(const char* name, const Tensor* t, bool output, T*& data) {
    data = nullptr;
    if (t && cell_ != GatedRnnCell::slstm)
      return {StatusCode::invalid_argument,
              arg_prefix(name) + "expected NULL: only an sLSTM has the normaliser n and the stabiliser m, "
                                 "this is " + (gru() ? "a GRU" : "an LSTM")};
    return tensor(name, t, Layout::state, Group::states, true, output, data);
  }

  // The stack's other tensors: `leading` layers ahead of a one-layer
  // layout (L or K = L - 1), e.g. h0 [L, B, H] or y_lower [K, B, T, H].
  enum class Stacked { weights, gates, state, sequence };
  Status stacked(const char* name, const Tensor* t, int64_t leading, bool above_first, Stacked layout,
                 Group group, bool optional, bool output, const void*& data) {
    data = nullptr;
    if (!t && optional) return {};
    const auto& s = call_.shape;
    const bool g = gru();
    int64_t dims[4] = {leading, 0, 0, 0};
    int rank = 3;
    const char* desc = "";
    const char* source = "";
    switch (layout) {
      case Stacked::weights:
        dims[1] = s.hidden, dims[2] = gate_width_;
        desc = above_first ? (g ? "[L-1, H, 3H]" : "[L-1, H, 4H]") : (g ? "[L, H, 3H]" : "[L, H, 4H]");
        source = above_first ? (g ? "[L-1, H, 3H] from 'R'" : "[L-1, H, 4H] from 'R'")
                             : (g ? "[L, H, 3H] of 'R'" : "[L, H, 4H] of 'R'");
        break;
      case Stacked::gates:
        rank = 2;
        dims[1] = gate_width_;
        desc = above_first ? (g ? "[L-1, 3H]" : "[L-1, 4H]") : (g ? "[L, 3H]" : "[L, 4H]");
        source = above_first ? (g ? "[L-1, 3H] from 'R'" : "[L-1, 4H] from 'R'")
                             : (g ? "[L, 3H] from 'R'" : "[L, 4H] from 'R'");
        break;
      case Stacked::state:
        dims[1] = s.batch, dims[2] = s.hidden;
        desc = "[L, B, H]";
        source = "[L, B, H] from 'R' and 'wx'";
        break;
      case Stacked::sequence:
        rank = 4;
        dims[1] = s.batch, dims[2] = s.steps, dims[3] = s.hidden;
        desc = "[L-1, B, T, H]";
        source = "[L-1, B, T, H] from 'R' and 'wx'";
        break;
    }
    return shaped(name, t, rank, dims, desc, source, group, output, data);
  }

  DType dtype() const noexcept { return dtype_; }
  DType weight_dtype() const noexcept { return weight_dtype_; }
  DType state_dtype() const noexcept { return state_set_ ? state_dtype_ : DType::f32; }

 private:
  // f32 or the sequence dtype, the same for every tensor of its group: the
  // first sets it.
  Status group_dtype(const char* name, const Tensor& t, DType& group, bool& set, const char*& source) const {
    const auto got = static_cast<DType>(t.dtype);
    if (!set) {
      if (got != DType::f32 && got != dtype_)
        return {StatusCode::invalid_argument, f32_or_dtype_message(name, dtype_, "wx", got)};
      group = got;
      set = true;
      source = name;
      return {};
    }
    if (got != group)
      return {StatusCode::invalid_argument, arg_prefix(name) + "expected dtype " + dtype_name(group) +
                                                " (the dtype of '" + source + "'), got " + dtype_name(got)};
    return {};
  }

  // R of one layer ([H, G*H], rank 2) or of the stack's ([L, H, G*H], rank
  // 3, L from 2 to kGatedRnnMaxStackLayers into `layers`): fixes H, G*H
  // having to be G times it, and the weights' dtype.
  Status recurrent_weights(const Tensor* t, int rank, const char* layout, int& layers, const void*& data) {
    EXPHIL_RETURN_IF_ERROR(check_descriptor("R", t, rank, layout));
    const int64_t* hg = t->shape + (rank - 2);  // [H, G*H]
    // (Compared by division: the extents are not yet known to be small.)
    if (hg[1] != gate_width_ || gate_width_ % gates() != 0 || hg[0] != gate_width_ / gates())
      return {StatusCode::invalid_argument,
              arg_prefix("R") + "expected shape " + layout + " with " + gates_dim() + " = " +
                  std::to_string(gate_width_) + " (the last dimension of 'wx'), " +
                  std::to_string(gates()) + " times H, got " + shape_string(t->shape, rank)};
    if (rank == 3) {
      if (t->shape[0] < 2 || t->shape[0] > kernels::kGatedRnnMaxStackLayers)
        return {StatusCode::invalid_argument,
                arg_prefix("R") + "expected 2 to " + std::to_string(kernels::kGatedRnnMaxStackLayers) +
                    " layers (the first dimension, L), got " + std::to_string(t->shape[0])};
      layers = static_cast<int>(t->shape[0]);
    }
    call_.shape.hidden = hg[0];
    EXPHIL_RETURN_IF_ERROR(group_dtype("R", *t, weight_dtype_, weight_set_, weight_source_));
    EXPHIL_RETURN_IF_ERROR(accept("R", t, false, data));
    // Offsets within one step's rows are 32-bit in the persistent kernels.
    if (call_.shape.hidden > kMaxHidden)
      return {StatusCode::not_supported, arg_prefix("R") + "H = " + std::to_string(call_.shape.hidden) +
                                             "; the kernels support H up to " + std::to_string(kMaxHidden) +
                                             " (and as far as the device's multiprocessors hold)"};
    return {};
  }

  Status accept(const char* name, const Tensor* t, bool output, const void*& data) {
    return accept_tensor(call_.tensors, name, *t, output, data);
  }

  static constexpr int64_t kMaxSteps = int64_t{INT32_MAX} - 1;
  static constexpr int64_t kMaxHidden = int64_t{1} << 24;

  GatedRnnCell cell_;
  GatedRnnCall& call_;
  DType dtype_ = DType::f32;
  int64_t gate_width_ = 0;
  DType weight_dtype_ = DType::f32, state_dtype_ = DType::f32;
  bool weight_set_ = false, state_set_ = false;
  const char* weight_source_ = "";
  const char* state_source_ = "";
};

using Layout = GatedRnnChecker::Layout;
using Group = GatedRnnChecker::Group;

// What both directions take first: wx, R, bias and the initial states, in
// the order of their descriptions (the first state present sets the
// states' dtype, and the others are named against it).
template <class Args>
Status check_inputs(GatedRnnChecker& check, const Args& args, kernels::GatedRnnForwardParams& p) {
  EXPHIL_RETURN_IF_ERROR(check.cell());
  EXPHIL_RETURN_IF_ERROR(check.wx(args.wx, p.d_wx));
  EXPHIL_RETURN_IF_ERROR(check.options(args.options));
  EXPHIL_RETURN_IF_ERROR(check.R(args.R, p.d_R));
  EXPHIL_RETURN_IF_ERROR(check.tensor("bias", args.bias, Layout::gates, Group::weights, true, false, p.d_bias));
  EXPHIL_RETURN_IF_ERROR(check.tensor("h0", args.h0, Layout::state, Group::states, true, false, p.d_h0));
  EXPHIL_RETURN_IF_ERROR(check.cell_state("c0", args.c0, false, p.d_c0));
  EXPHIL_RETURN_IF_ERROR(check.slstm_state("n0", args.n0, false, p.d_n0));
  return check.slstm_state("m0", args.m0, false, p.d_m0);
}

void fill_forward(const GatedRnnChecker& check, GatedRnnCell cell, const GatedRnnCall& call,
                  kernels::GatedRnnForwardParams& p) {
  p.shape = call.shape;
  p.cell = static_cast<kernels::GatedRnnCell>(cell);
  p.dtype = check.dtype();
  p.weight_dtype = check.weight_dtype();
  p.state_dtype = check.state_dtype();
}

// Element `index` of a stacked tensor's memory `base`, or null where `base`
// is: one layer's slice. (The checks hand out const pointers; the outputs'
// memory is the caller's to write.)
void* element(const void* base, DType dtype, int64_t index) {
  if (!base) return nullptr;
  return const_cast<char*>(static_cast<const char*>(base)) +
         index * static_cast<int64_t>(dtype_size(dtype));
}

// Layer l's slices of the stacked tensors ([L, ...] and [L-1, ...]; the
// latter at l - 1 for the layers above the first).
struct StackSlices {
  kernels::GatedRnnShape s;
  int64_t GH;
  DType dtype, weight_dtype, state_dtype;
  void* weights(const void* base, int64_t i) const { return element(base, weight_dtype, i * s.hidden * GH); }
  void* gates(const void* base, int64_t i) const { return element(base, weight_dtype, i * GH); }
  void* state(const void* base, int64_t i) const { return element(base, state_dtype, i * s.batch * s.hidden); }
  void* sequence(const void* base, int64_t i) const {
    return element(base, dtype, i * s.batch * s.steps * s.hidden);
  }
};

StackSlices stack_slices(const GatedRnnChecker& check, GatedRnnCell cell, const GatedRnnCall& call) {
  const int64_t G = kernels::gated_rnn_gates(static_cast<kernels::GatedRnnCell>(cell));
  return {call.shape, G * call.shape.hidden, check.dtype(), check.weight_dtype(), check.state_dtype()};
}

Status stack_cell(GatedRnnCell cell) {
  if (cell != GatedRnnCell::gru && cell != GatedRnnCell::lstm)
    return {StatusCode::invalid_argument, "argument 'cell': expected gru (0) or lstm (1), got " +
                                              std::to_string(static_cast<int>(cell))};
  return {};
}

// The LSTM's cell state of every layer: refused for a GRU.
Status stacked_cell_state(GatedRnnChecker& check, GatedRnnCell cell, const char* name, const Tensor* t,
                          bool output, const void*& data, int64_t layers) {
  data = nullptr;
  if (t && cell == GatedRnnCell::gru)
    return {StatusCode::invalid_argument, arg_prefix(name) + "expected NULL: a GRU has no cell state"};
  return check.stacked(name, t, layers, false, GatedRnnChecker::Stacked::state, Group::states, true, output,
                       data);
}

}  // namespace

Status validate_gated_rnn_stack_forward(const GatedRnnStackForwardArgs& args,
                                        kernels::GatedRnnStackParams& params, GatedRnnCall& call) {
  EXPHIL_RETURN_IF_ERROR(stack_cell(args.cell));
  GatedRnnChecker check(args.cell, call);
  const void *wx = nullptr, *R = nullptr, *W = nullptr, *bias = nullptr, *W_bias = nullptr;
  const void *h0 = nullptr, *c0 = nullptr, *y = nullptr, *y_lower = nullptr, *h_final = nullptr,
             *c_final = nullptr;
  int L = 0;
  EXPHIL_RETURN_IF_ERROR(check.wx(args.wx, wx));
  EXPHIL_RETURN_IF_ERROR(check.options(args.options));
  EXPHIL_RETURN_IF_ERROR(check.stacked_R(args.R, L, R));
  using Stacked = GatedRnnChecker::Stacked;
  const int64_t K = L - 1;
  EXPHIL_RETURN_IF_ERROR(check.stacked("W", args.W, K, true, Stacked::weights, Group::weights, false, false, W));
  EXPHIL_RETURN_IF_ERROR(check.stacked("bias", args.bias, L, false, Stacked::gates, Group::weights, true, false, bias));
  EXPHIL_RETURN_IF_ERROR(
      check.stacked("W_bias", args.W_bias, K, true, Stacked::gates, Group::weights, true, false, W_bias));
  EXPHIL_RETURN_IF_ERROR(check.stacked("h0", args.h0, L, false, Stacked::state, Group::states, true, false, h0));
  EXPHIL_RETURN_IF_ERROR(stacked_cell_state(check, args.cell, "c0", args.c0, false, c0, L));
  EXPHIL_RETURN_IF_ERROR(check.tensor("y", args.y, Layout::sequence, Group::sequence, false, true, y));
  EXPHIL_RETURN_IF_ERROR(
      check.stacked("y_lower", args.y_lower, K, true, Stacked::sequence, Group::sequence, true, true, y_lower));
  EXPHIL_RETURN_IF_ERROR(
      check.stacked("h_final", args.h_final, L, false, Stacked::state, Group::states, true, true, h_final));
  EXPHIL_RETURN_IF_ERROR(stacked_cell_state(check, args.cell, "c_final", args.c_final, true, c_final, L));
  EXPHIL_RETURN_IF_ERROR(call.tensors.check_no_overlaps());

  const StackSlices at = stack_slices(check, args.cell, call);
  params = kernels::GatedRnnStackParams{};
  params.layers = L;
  for (int l = 0; l < L; ++l) {
    kernels::GatedRnnForwardParams& f = params.layer[l];
    fill_forward(check, args.cell, call, f);
    f.d_wx = l == 0 ? wx : nullptr;
    f.d_R = at.weights(R, l);
    f.d_bias = at.gates(bias, l);
    f.d_h0 = at.state(h0, l);
    f.d_c0 = at.state(c0, l);
    f.d_y = l + 1 == L ? element(y, at.dtype, 0) : at.sequence(y_lower, l);
    f.d_h_final = at.state(h_final, l);
    f.d_c_final = at.state(c_final, l);
    if (l > 0) {
      params.d_W[l] = at.weights(W, l - 1);
      params.d_W_bias[l] = at.gates(W_bias, l - 1);
    }
  }
  return {};
}

Status validate_gated_rnn_stack_backward(const GatedRnnStackBackwardArgs& args,
                                         kernels::GatedRnnStackBackwardParams& params, GatedRnnCall& call) {
  EXPHIL_RETURN_IF_ERROR(stack_cell(args.cell));
  GatedRnnChecker check(args.cell, call);
  const void *wx = nullptr, *R = nullptr, *W = nullptr, *y = nullptr, *y_lower = nullptr, *grad_y = nullptr;
  const void *bias = nullptr, *W_bias = nullptr, *h0 = nullptr, *c0 = nullptr, *grad_y_lower = nullptr,
             *grad_h_final = nullptr, *grad_c_final = nullptr;
  const void *grad_wx = nullptr, *grad_R = nullptr, *grad_W = nullptr, *grad_bias = nullptr,
             *grad_W_bias = nullptr, *grad_h0 = nullptr, *grad_c0 = nullptr;
  int L = 0;
  using Stacked = GatedRnnChecker::Stacked;
  EXPHIL_RETURN_IF_ERROR(check.wx(args.wx, wx));
  EXPHIL_RETURN_IF_ERROR(check.options(args.options));
  EXPHIL_RETURN_IF_ERROR(check.stacked_R(args.R, L, R));
  const int64_t K = L - 1;
  EXPHIL_RETURN_IF_ERROR(check.stacked("W", args.W, K, true, Stacked::weights, Group::weights, false, false, W));
  EXPHIL_RETURN_IF_ERROR(check.tensor("y", args.y, Layout::sequence, Group::sequence, false, false, y));
  EXPHIL_RETURN_IF_ERROR(
      check.stacked("y_lower", args.y_lower, K, true, Stacked::sequence, Group::sequence, false, false, y_lower));
  EXPHIL_RETURN_IF_ERROR(check.tensor("grad_y", args.grad_y, Layout::sequence, Group::sequence, false, false, grad_y));
  EXPHIL_RETURN_IF_ERROR(check.stacked("bias", args.bias, L, false, Stacked::gates, Group::weights, true, false, bias));
  EXPHIL_RETURN_IF_ERROR(
      check.stacked("W_bias", args.W_bias, K, true, Stacked::gates, Group::weights, true, false, W_bias));
  EXPHIL_RETURN_IF_ERROR(check.stacked("h0", args.h0, L, false, Stacked::state, Group::states, true, false, h0));
  EXPHIL_RETURN_IF_ERROR(stacked_cell_state(check, args.cell, "c0", args.c0, false, c0, L));
  EXPHIL_RETURN_IF_ERROR(check.stacked("grad_y_lower", args.grad_y_lower, K, true, Stacked::sequence,
                                       Group::sequence, true, false, grad_y_lower));
  EXPHIL_RETURN_IF_ERROR(check.stacked("grad_h_final", args.grad_h_final, L, false, Stacked::state,
                                       Group::states, true, false, grad_h_final));
  EXPHIL_RETURN_IF_ERROR(
      stacked_cell_state(check, args.cell, "grad_c_final", args.grad_c_final, false, grad_c_final, L));
  EXPHIL_RETURN_IF_ERROR(
      check.tensor("grad_wx", args.grad_wx, Layout::gates_sequence, Group::sequence, true, true, grad_wx));
  EXPHIL_RETURN_IF_ERROR(
      check.stacked("grad_R", args.grad_R, L, false, Stacked::weights, Group::weights, true, true, grad_R));
  EXPHIL_RETURN_IF_ERROR(
      check.stacked("grad_W", args.grad_W, K, true, Stacked::weights, Group::weights, true, true, grad_W));
  EXPHIL_RETURN_IF_ERROR(
      check.stacked("grad_bias", args.grad_bias, L, false, Stacked::gates, Group::weights, true, true, grad_bias));
  EXPHIL_RETURN_IF_ERROR(check.stacked("grad_W_bias", args.grad_W_bias, K, true, Stacked::gates, Group::weights,
                                       true, true, grad_W_bias));
  EXPHIL_RETURN_IF_ERROR(
      check.stacked("grad_h0", args.grad_h0, L, false, Stacked::state, Group::states, true, true, grad_h0));
  EXPHIL_RETURN_IF_ERROR(stacked_cell_state(check, args.cell, "grad_c0", args.grad_c0, true, grad_c0, L));
  EXPHIL_RETURN_IF_ERROR(call.tensors.check_no_overlaps());

  const StackSlices at = stack_slices(check, args.cell, call);
  params = kernels::GatedRnnStackBackwardParams{};
  params.layers = L;
  for (int l = 0; l < L; ++l) {
    kernels::GatedRnnBackwardParams& b = params.layer[l];
    kernels::GatedRnnForwardParams& f = b.fwd;
    fill_forward(check, args.cell, call, f);
    const bool top = l + 1 == L;
    f.d_wx = l == 0 ? wx : nullptr;
    f.d_R = at.weights(R, l);
    f.d_bias = at.gates(bias, l);
    f.d_h0 = at.state(h0, l);
    f.d_c0 = at.state(c0, l);
    f.d_y = top ? element(y, at.dtype, 0) : at.sequence(y_lower, l);
    b.d_grad_y = top ? grad_y : at.sequence(grad_y_lower, l);
    b.d_grad_h_final = at.state(grad_h_final, l);
    b.d_grad_c_final = at.state(grad_c_final, l);
    b.d_grad_wx = l == 0 ? const_cast<void*>(grad_wx) : nullptr;
    b.d_grad_R = at.weights(grad_R, l);
    b.d_grad_bias = at.gates(grad_bias, l);
    b.d_grad_h0 = at.state(grad_h0, l);
    b.d_grad_c0 = at.state(grad_c0, l);
    if (l > 0) {
      params.d_W[l] = at.weights(W, l - 1);
      params.d_W_bias[l] = at.gates(W_bias, l - 1);
      params.d_grad_W[l] = at.weights(grad_W, l - 1);
      params.d_grad_W_bias[l] = at.gates(grad_W_bias, l - 1);
    }
  }
  return {};
}

Status validate_gated_rnn_forward(const GatedRnnForwardArgs& args, kernels::GatedRnnForwardParams& params,
                                  GatedRnnCall& call) {
  GatedRnnChecker check(args.cell, call);
  EXPHIL_RETURN_IF_ERROR(check_inputs(check, args, params));
  EXPHIL_RETURN_IF_ERROR(check.tensor("y", args.y, Layout::sequence, Group::sequence, false, true, params.d_y));
  EXPHIL_RETURN_IF_ERROR(
      check.tensor("h_final", args.h_final, Layout::state, Group::states, true, true, params.d_h_final));
  EXPHIL_RETURN_IF_ERROR(check.cell_state("c_final", args.c_final, true, params.d_c_final));
  EXPHIL_RETURN_IF_ERROR(check.slstm_state("n_final", args.n_final, true, params.d_n_final));
  EXPHIL_RETURN_IF_ERROR(check.slstm_state("m_final", args.m_final, true, params.d_m_final));
  EXPHIL_RETURN_IF_ERROR(call.tensors.check_no_overlaps());
  fill_forward(check, args.cell, call, params);
  return {};
}

Status validate_gated_rnn_backward(const GatedRnnBackwardArgs& args, kernels::GatedRnnBackwardParams& params,
                                   GatedRnnCall& call) {
  GatedRnnChecker check(args.cell, call);
  kernels::GatedRnnForwardParams& f = params.fwd;
  EXPHIL_RETURN_IF_ERROR(check_inputs(check, args, f));
  EXPHIL_RETURN_IF_ERROR(check.tensor("y", args.y, Layout::sequence, Group::sequence, false, false, f.d_y));
  EXPHIL_RETURN_IF_ERROR(
      check.tensor("grad_y", args.grad_y, Layout::sequence, Group::sequence, false, false, params.d_grad_y));
  EXPHIL_RETURN_IF_ERROR(check.tensor("grad_h_final", args.grad_h_final, Layout::state, Group::states, true, false,
                                      params.d_grad_h_final));
  EXPHIL_RETURN_IF_ERROR(check.cell_state("grad_c_final", args.grad_c_final, false, params.d_grad_c_final));
  EXPHIL_RETURN_IF_ERROR(check.slstm_state("grad_n_final", args.grad_n_final, false, params.d_grad_n_final));
  EXPHIL_RETURN_IF_ERROR(check.slstm_state("grad_m_final", args.grad_m_final, false, params.d_grad_m_final));
  EXPHIL_RETURN_IF_ERROR(check.tensor("grad_wx", args.grad_wx, Layout::gates_sequence, Group::sequence, true, true,
                                      params.d_grad_wx));
  EXPHIL_RETURN_IF_ERROR(check.tensor("grad_R", args.grad_R, Layout::weights, Group::weights, true, true,
                                      params.d_grad_R));
  EXPHIL_RETURN_IF_ERROR(check.tensor("grad_bias", args.grad_bias, Layout::gates, Group::weights, true, true,
                                      params.d_grad_bias));
  EXPHIL_RETURN_IF_ERROR(
      check.tensor("grad_h0", args.grad_h0, Layout::state, Group::states, true, true, params.d_grad_h0));
  EXPHIL_RETURN_IF_ERROR(check.cell_state("grad_c0", args.grad_c0, true, params.d_grad_c0));
  EXPHIL_RETURN_IF_ERROR(check.slstm_state("grad_n0", args.grad_n0, true, params.d_grad_n0));
  EXPHIL_RETURN_IF_ERROR(check.slstm_state("grad_m0", args.grad_m0, true, params.d_grad_m0));
  EXPHIL_RETURN_IF_ERROR(check.tensor("grad_rh", args.grad_rh, Layout::gates_sequence, Group::sequence, true, true,
                                      params.d_grad_rh));
  EXPHIL_RETURN_IF_ERROR(call.tensors.check_no_overlaps());
  fill_forward(check, args.cell, call, f);
  return {};
}

}  // namespace exphil::runtime
