// <op>_forward and <op>_backward for the four linear-recurrence scans:
// decode, plan the outputs from the op's description (op_outputs.hpp), run
// through the C++ API on the managed stream (or the caller's), then wait
// (sync: true, the default) or return an Event (sync: false).
#include <initializer_list>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "atoms.hpp"
#include "call_options.hpp"
#include "exphil/runtime.hpp"
#include "exphil/scan.hpp"
#include "op_call.hpp"
#include "op_outputs.hpp"
#include "resources.hpp"
#include "scan_nifs.hpp"
#include "tensor_args.hpp"
#include "terms.hpp"

namespace exphil::nif {

namespace {

// An optional tensor. Absence is recorded as such, not as a null address,
// so that a given tensor with a null address reaches the library's checks.
using Optional = std::optional<TensorArg>;

const Tensor* present(const Optional& t) { return t ? &t->desc : nullptr; }

// A tensor option: absent or nil means not given.
Optional optional_tensor(ErlNifEnv* env, const Options& opts, const char* name, int device) {
  auto term = opts.get(name);
  if (!term || enif_is_identical(*term, atoms().nil)) return std::nullopt;
  return decode_tensor(env, *term, name, device);
}

// The inputs by the description's names, for the outputs' plan.
std::map<std::string, const TensorArg*> by_name(ScanOp op, const std::vector<Optional>& inputs, const Optional& h0) {
  std::map<std::string, const TensorArg*> named;
  for (int i = 0; i < scan_input_count(op); ++i) {
    const Optional& t = inputs[static_cast<std::size_t>(i)];
    named[scan_input_name(op, i)] = t ? &*t : nullptr;
  }
  named["h0"] = h0 ? &*h0 : nullptr;
  return named;
}

DType state_type(ErlNifEnv* env, const Options& opts) {
  auto t = opts.get("state_type");
  return t ? get_type(env, *t, "state_type") : DType::f32;
}

// Every tensor given, for an event to keep alive.
std::vector<const TensorArg*> given(std::initializer_list<const std::vector<Optional>*> lists) {
  std::vector<const TensorArg*> tensors;
  for (const auto* list : lists)
    for (const Optional& t : *list)
      if (t) tensors.push_back(&*t);
  return tensors;
}

}  // namespace

ERL_NIF_TERM scan_forward_nif(ErlNifEnv* env, ScanOp op, int argc, const ERL_NIF_TERM argv[]) {
  const int n = scan_input_count(op);
  const Options opts(env, argv[n], {"h0", "outputs", "sync", "stream", "state_type"});
  std::vector<Optional> inputs;
  inputs.push_back(decode_tensor(env, argv[0], scan_input_name(op, 0)));
  const int device = call_device(*inputs[0]);
  for (int i = 1; i < n; ++i) inputs.push_back(decode_tensor(env, argv[i], scan_input_name(op, i), device));
  const Optional h0 = optional_tensor(env, opts, "h0", device);
  const Stream stream = decode_stream(env, opts);
  const bool sync = decode_sync(opts);
  Outputs outputs = resolve_outputs(
      env, opts,
      plan_outputs(description_of(scan_op_name(op), "forward"), by_name(op, inputs, h0), inputs[0]->dtype,
                   state_type(env, opts)),
      device);
  auto make_args = [&] {
    ScanForwardArgs args;
    args.op = op;
    for (int i = 0; i < n; ++i) args.inputs[i] = present(inputs[static_cast<std::size_t>(i)]);
    args.h0 = present(h0);
    args.y = outputs.get("y");
    args.h_final = outputs.get("h_final");
    return args;
  };
  const ScanForwardArgs args = bind_outputs(env, outputs, device, make_args);
  const std::vector<Optional> states = {h0};
  return finish_call(env, argc, argv, device, stream, sync, outputs, given({&inputs, &states}),
                     [&] { return scan_forward(args, stream); });
}

ERL_NIF_TERM scan_backward_nif(ErlNifEnv* env, ScanOp op, int argc, const ERL_NIF_TERM argv[]) {
  const int n = scan_input_count(op);
  const Options opts(env, argv[n + 2], {"h0", "grad_h_final", "outputs", "sync", "stream", "state_type"});
  // linear_scan's b may be nil: the backward then reads the states from y
  // (exphil/scan.hpp).
  const bool b_absent = op == ScanOp::linear_scan && enif_is_identical(argv[1], atoms().nil);
  std::vector<Optional> inputs;
  inputs.push_back(decode_tensor(env, argv[0], scan_input_name(op, 0)));
  const int device = call_device(*inputs[0]);
  for (int i = 1; i < n; ++i)
    inputs.push_back(b_absent && i == 1 ? Optional{}
                                        : Optional{decode_tensor(env, argv[i], scan_input_name(op, i), device)});
  const std::vector<Optional> sequences = {decode_tensor(env, argv[n], "y", device),
                                           decode_tensor(env, argv[n + 1], "grad_y", device)};
  const Optional h0 = optional_tensor(env, opts, "h0", device);
  const Optional grad_h_final = optional_tensor(env, opts, "grad_h_final", device);
  const Stream stream = decode_stream(env, opts);
  const bool sync = decode_sync(opts);
  Outputs outputs = resolve_outputs(
      env, opts,
      plan_outputs(description_of(scan_op_name(op), "backward"), by_name(op, inputs, h0), inputs[0]->dtype,
                   state_type(env, opts)),
      device);
  auto make_args = [&] {
    ScanBackwardArgs args;
    args.op = op;
    for (int i = 0; i < n; ++i) {
      args.inputs[i] = present(inputs[static_cast<std::size_t>(i)]);
      args.grad_inputs[i] = outputs.get(scan_grad_input_name(op, i));
    }
    args.y = present(sequences[0]);
    args.grad_y = present(sequences[1]);
    args.h0 = present(h0);
    args.grad_h_final = present(grad_h_final);
    args.grad_h0 = outputs.get("grad_h0");
    return args;
  };
  const ScanBackwardArgs args = bind_outputs(env, outputs, device, make_args);
  const std::vector<Optional> states = {h0, grad_h_final};
  return finish_call(env, argc, argv, device, stream, sync, outputs, given({&inputs, &sequences, &states}),
                     [&] { return scan_backward(args, stream); });
}

}  // namespace exphil::nif
