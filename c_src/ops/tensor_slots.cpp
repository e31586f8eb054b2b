// Each op direction's args by the names of its description
// (include/exphil/op_descriptions.h): the one place where a described
// tensor meets the args member that holds it, so that a binding fills any
// op's args from names. test/abi/test_op_descriptions.cpp holds every row's
// names to these.
#include <string_view>

#include "exphil/attention.hpp"
#include "exphil/gated_rnn.hpp"
#include "exphil/scan.hpp"
#include "exphil/selective_scan.hpp"

namespace exphil {

namespace {

struct Named {
  std::string_view name;
  const Tensor** slot;
};

template <std::size_t N>
const Tensor** find(const Named (&slots)[N], std::string_view name) noexcept {
  for (const Named& s : slots)
    if (s.name == name) return s.slot;
  return nullptr;
}

// A scan's inputs and their gradients, by args.op's names.
const Tensor** scan_input_slot(ScanOp op, const Tensor** inputs, const Tensor** grads,
                               std::string_view name) noexcept {
  for (int i = 0; i < scan_input_count(op); ++i) {
    if (name == scan_input_name(op, i)) return &inputs[i];
    if (grads && name == scan_grad_input_name(op, i)) return &grads[i];
  }
  return nullptr;
}

const Tensor** selective_scan_input_slot(SelectiveScanInputs& in, std::string_view name) noexcept {
  const Named slots[] = {{"x", &in.x},   {"dt", &in.dt},           {"A", &in.A},
                         {"B", &in.B},   {"C", &in.C},             {"dt_bias", &in.dt_bias},
                         {"D", &in.D},   {"z", &in.z},             {"h0", &in.h0}};
  return find(slots, name);
}

const Tensor** attention_input_slot(AttentionInputs& in, std::string_view name) noexcept {
  const Named slots[] = {{"q", &in.q}, {"k", &in.k}, {"v", &in.v}};
  return find(slots, name);
}

// The LSTM's and sLSTM's cell-state tensors, which a GRU does not have.
bool cell_state_name(std::string_view name) noexcept {
  return name == "c0" || name == "c_final" || name == "grad_c0" || name == "grad_c_final";
}

// The sLSTM's normaliser and stabiliser tensors, which only it has.
bool slstm_state_name(std::string_view name) noexcept {
  return name == "n0" || name == "n_final" || name == "grad_n0" || name == "grad_n_final" || name == "m0" ||
         name == "m_final" || name == "grad_m0" || name == "grad_m_final";
}

// Whether `cell` has the tensor `name` (of the states'; every other name
// is the args' to answer).
bool cell_has(GatedRnnCell cell, std::string_view name) noexcept {
  if (cell == GatedRnnCell::gru && cell_state_name(name)) return false;
  return cell == GatedRnnCell::slstm || !slstm_state_name(name);
}

}  // namespace

const Tensor** tensor_slot(ScanForwardArgs& args, std::string_view name) noexcept {
  if (const Tensor** s = scan_input_slot(args.op, args.inputs, nullptr, name)) return s;
  const Named slots[] = {{"h0", &args.h0}, {"y", &args.y}, {"h_final", &args.h_final}};
  return find(slots, name);
}

const Tensor** tensor_slot(ScanBackwardArgs& args, std::string_view name) noexcept {
  if (const Tensor** s = scan_input_slot(args.op, args.inputs, args.grad_inputs, name)) return s;
  const Named slots[] = {{"h0", &args.h0},
                         {"y", &args.y},
                         {"grad_y", &args.grad_y},
                         {"grad_h_final", &args.grad_h_final},
                         {"grad_h0", &args.grad_h0}};
  return find(slots, name);
}

const Tensor** tensor_slot(SelectiveScanForwardArgs& args, std::string_view name) noexcept {
  if (const Tensor** s = selective_scan_input_slot(args.in, name)) return s;
  const Named slots[] = {{"y", &args.y}, {"h_final", &args.h_final}};
  return find(slots, name);
}

const Tensor** tensor_slot(SelectiveScanBackwardArgs& args, std::string_view name) noexcept {
  if (const Tensor** s = selective_scan_input_slot(args.in, name)) return s;
  const Named slots[] = {{"grad_y", &args.grad_y},   {"grad_h_final", &args.grad_h_final},
                         {"grad_x", &args.grad_x},   {"grad_dt", &args.grad_dt},
                         {"grad_A", &args.grad_A},   {"grad_B", &args.grad_B},
                         {"grad_C", &args.grad_C},   {"grad_dt_bias", &args.grad_dt_bias},
                         {"grad_D", &args.grad_D},   {"grad_z", &args.grad_z},
                         {"grad_h0", &args.grad_h0}};
  return find(slots, name);
}

const Tensor** tensor_slot(AttentionForwardArgs& args, std::string_view name) noexcept {
  if (const Tensor** s = attention_input_slot(args.in, name)) return s;
  const Named slots[] = {{"o", &args.o}, {"lse", &args.lse}};
  return find(slots, name);
}

const Tensor** tensor_slot(AttentionBackwardArgs& args, std::string_view name) noexcept {
  if (const Tensor** s = attention_input_slot(args.in, name)) return s;
  const Named slots[] = {{"o", &args.o},           {"lse", &args.lse},       {"grad_o", &args.grad_o},
                         {"grad_q", &args.grad_q}, {"grad_k", &args.grad_k}, {"grad_v", &args.grad_v}};
  return find(slots, name);
}

const Tensor** tensor_slot(GatedRnnForwardArgs& args, std::string_view name) noexcept {
  if (!cell_has(args.cell, name)) return nullptr;
  const Named slots[] = {{"wx", &args.wx},           {"R", &args.R},
                         {"bias", &args.bias},       {"h0", &args.h0},
                         {"c0", &args.c0},           {"n0", &args.n0},
                         {"m0", &args.m0},           {"y", &args.y},
                         {"h_final", &args.h_final}, {"c_final", &args.c_final},
                         {"n_final", &args.n_final}, {"m_final", &args.m_final}};
  return find(slots, name);
}

const Tensor** tensor_slot(GatedRnnStackForwardArgs& args, std::string_view name) noexcept {
  if (!cell_has(args.cell, name)) return nullptr;
  const Named slots[] = {{"wx", &args.wx},           {"R", &args.R},
                         {"W", &args.W},             {"bias", &args.bias},
                         {"W_bias", &args.W_bias},   {"h0", &args.h0},
                         {"c0", &args.c0},           {"y", &args.y},
                         {"y_lower", &args.y_lower}, {"h_final", &args.h_final},
                         {"c_final", &args.c_final}};
  return find(slots, name);
}

const Tensor** tensor_slot(GatedRnnStackBackwardArgs& args, std::string_view name) noexcept {
  if (!cell_has(args.cell, name)) return nullptr;
  const Named slots[] = {{"wx", &args.wx},
                         {"R", &args.R},
                         {"W", &args.W},
                         {"y", &args.y},
                         {"y_lower", &args.y_lower},
                         {"grad_y", &args.grad_y},
                         {"bias", &args.bias},
                         {"W_bias", &args.W_bias},
                         {"h0", &args.h0},
                         {"c0", &args.c0},
                         {"grad_y_lower", &args.grad_y_lower},
                         {"grad_h_final", &args.grad_h_final},
                         {"grad_c_final", &args.grad_c_final},
                         {"grad_wx", &args.grad_wx},
                         {"grad_R", &args.grad_R},
                         {"grad_W", &args.grad_W},
                         {"grad_bias", &args.grad_bias},
                         {"grad_W_bias", &args.grad_W_bias},
                         {"grad_h0", &args.grad_h0},
                         {"grad_c0", &args.grad_c0}};
  return find(slots, name);
}

const Tensor** tensor_slot(GatedRnnBackwardArgs& args, std::string_view name) noexcept {
  if (!cell_has(args.cell, name)) return nullptr;
  const Named slots[] = {{"wx", &args.wx},
                         {"R", &args.R},
                         {"bias", &args.bias},
                         {"h0", &args.h0},
                         {"c0", &args.c0},
                         {"n0", &args.n0},
                         {"m0", &args.m0},
                         {"y", &args.y},
                         {"grad_y", &args.grad_y},
                         {"grad_h_final", &args.grad_h_final},
                         {"grad_c_final", &args.grad_c_final},
                         {"grad_n_final", &args.grad_n_final},
                         {"grad_m_final", &args.grad_m_final},
                         {"grad_wx", &args.grad_wx},
                         {"grad_R", &args.grad_R},
                         {"grad_bias", &args.grad_bias},
                         {"grad_h0", &args.grad_h0},
                         {"grad_c0", &args.grad_c0},
                         {"grad_n0", &args.grad_n0},
                         {"grad_m0", &args.grad_m0},
                         {"grad_rh", &args.grad_rh}};
  return find(slots, name);
}

}  // namespace exphil
