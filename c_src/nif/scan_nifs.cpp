// <op>_forward and <op>_backward for the four linear-recurrence scans:
// decode, run through the C++ API on the managed stream (or the caller's),
// then wait (sync: true, the default) or return an Event (sync: false).
#include <limits>
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

struct ScanOutputSpec {
  std::string name;
  bool required;
  bool sequence;  // [B, T, H] of the sequence dtype, else [B, H] of the state type
};

struct ScanOutputs {
  std::vector<TensorArg> tensors;  // in spec order; absent optional ones have no data
  std::vector<ERL_NIF_TERM> keys, values;
};

// Without outputs:, `check(described)` (the library's can_implement on the
// outputs described without memory, in spec order) runs before any is
// allocated, so bad input gets its message without a device.
template <class Check>
ScanOutputs resolve_scan_outputs(ErlNifEnv* env, const Options& opts, const std::vector<ScanOutputSpec>& specs,
                                 const TensorArg& reference, const std::string& reference_name, int device,
                                 Check&& check_described) {
  ScanOutputs out;
  if (reference.shape.size() != 3)
    throw ArgumentError{"argument '" + reference_name + "': expected rank 3 [B, T, H], got shape " +
                        shape_text(reference.shape)};
  if (auto given = opts.get("outputs")) {
    std::vector<const char*> names;
    for (const ScanOutputSpec& s : specs) names.push_back(s.name.c_str());
    const Options outputs(env, *given, names, "outputs", "output");
    for (const ScanOutputSpec& s : specs) {
      auto term = given_output(outputs, s.name.c_str(), s.required);
      if (!term) {
        out.tensors.emplace_back();
        continue;
      }
      out.tensors.push_back(decode_tensor(env, *term, s.name, device));
      out.keys.push_back(atom(env, s.name.c_str()));
      out.values.push_back(*term);
    }
    return out;
  }
  DType state_dtype = DType::f32;
  if (auto t = opts.get("state_type")) state_dtype = get_type(env, *t, "state_type");
  const std::vector<int64_t> state_shape = {reference.shape[0], reference.shape[2]};
  std::vector<Tensor> described;
  for (const ScanOutputSpec& s : specs)
    described.push_back(unallocated(s.sequence ? reference.dtype : state_dtype, s.sequence ? reference.shape : state_shape));
  std::vector<const Tensor*> views;
  for (const Tensor& t : described) views.push_back(&t);
  check(check_described(views));
  for (const ScanOutputSpec& s : specs) {
    AllocatedOutput allocated = allocate_output(env, s.name.c_str(), s.sequence ? reference.dtype : state_dtype,
                                                s.sequence ? reference.shape : state_shape, device);
    out.keys.push_back(atom(env, s.name.c_str()));
    out.values.push_back(allocated.buffer);
    out.tensors.push_back(std::move(allocated.tensor));
  }
  return out;
}

const Tensor* present(const TensorArg& t) { return t.desc.data ? &t.desc : nullptr; }

// The outputs' descriptors in spec order, NULL for an absent optional one.
std::vector<const Tensor*> views(const ScanOutputs& outputs, const std::vector<ScanOutputSpec>& specs) {
  std::vector<const Tensor*> out;
  for (std::size_t i = 0; i < specs.size(); ++i)
    out.push_back(specs[i].required ? &outputs.tensors[i].desc : present(outputs.tensors[i]));
  return out;
}

// Runs the call, then answers as every op NIF does (op_call.hpp).
template <class Call>
ERL_NIF_TERM finish(ErlNifEnv* env, int argc, const ERL_NIF_TERM argv[], bool sync, int device,
                    Stream stream, ScanOutputs& outputs, const std::vector<TensorArg>& inputs, Call&& call) {
  check(call());
  ERL_NIF_TERM map;
  if (!enif_make_map_from_arrays(env, outputs.keys.data(), outputs.values.data(),
                                 static_cast<unsigned>(outputs.keys.size()), &map))
    throw std::bad_alloc();
  std::vector<const TensorArg*> tensors;
  for (const TensorArg& t : inputs) tensors.push_back(&t);
  for (const TensorArg& t : outputs.tensors) tensors.push_back(&t);
  return answer_call(env, argc, argv, device, stream, sync, map, tensors);
}

}  // namespace

ERL_NIF_TERM scan_forward_nif(ErlNifEnv* env, ScanOp op, int argc, const ERL_NIF_TERM argv[]) {
  const int n = scan_input_count(op);
  const Options opts(env, argv[n], {"h0", "outputs", "sync", "stream", "state_type"});
  std::vector<TensorArg> inputs;
  for (int i = 0; i < n; ++i) inputs.push_back(decode_tensor(env, argv[i], scan_input_name(op, i)));
  const int device = call_device(inputs[0]);
  TensorArg h0;
  if (auto t = opts.get("h0"); t && !enif_is_identical(*t, atoms().nil))
    h0 = decode_tensor(env, *t, "h0", device);
  const Stream stream = decode_stream(env, opts);
  const bool sync = decode_sync(opts);
  // `out`: y and h_final.
  auto make_args = [&](const std::vector<const Tensor*>& out) {
    ScanForwardArgs args;
    args.op = op;
    for (int i = 0; i < n; ++i) args.inputs[i] = &inputs[static_cast<std::size_t>(i)].desc;
    args.h0 = present(h0);
    args.y = out[0];
    args.h_final = out[1];
    return args;
  };
  const std::vector<ScanOutputSpec> specs = {{"y", true, true}, {"h_final", false, false}};
  ScanOutputs outputs =
      resolve_scan_outputs(env, opts, specs, inputs[0], scan_input_name(op, 0), device,
                           [&](const std::vector<const Tensor*>& out) { return can_implement(make_args(out)); });
  inputs.push_back(h0);  // `inputs` moves: args come after
  const ScanForwardArgs args = make_args(views(outputs, specs));
  return finish(env, argc, argv, sync, device, stream, outputs, inputs, [&] { return scan_forward(args, stream); });
}

ERL_NIF_TERM scan_backward_nif(ErlNifEnv* env, ScanOp op, int argc, const ERL_NIF_TERM argv[]) {
  const int n = scan_input_count(op);
  const Options opts(env, argv[n + 2], {"h0", "grad_h_final", "outputs", "sync", "stream", "state_type"});
  std::vector<TensorArg> inputs;
  // linear_scan's b may be nil: the backward then reads the states from y
  // (exphil/scan.hpp).
  const bool b_absent = op == ScanOp::linear_scan && enif_is_identical(argv[1], atoms().nil);
  for (int i = 0; i < n; ++i)
    inputs.push_back(b_absent && i == 1 ? TensorArg{} : decode_tensor(env, argv[i], scan_input_name(op, i)));
  const int device = call_device(inputs[0]);
  inputs.push_back(decode_tensor(env, argv[n], "y", device));
  inputs.push_back(decode_tensor(env, argv[n + 1], "grad_y", device));
  TensorArg h0, grad_h_final;
  if (auto t = opts.get("h0"); t && !enif_is_identical(*t, atoms().nil))
    h0 = decode_tensor(env, *t, "h0", device);
  if (auto t = opts.get("grad_h_final"); t && !enif_is_identical(*t, atoms().nil))
    grad_h_final = decode_tensor(env, *t, "grad_h_final", device);
  const Stream stream = decode_stream(env, opts);
  const bool sync = decode_sync(opts);
  std::vector<ScanOutputSpec> specs;
  for (int i = 0; i < n; ++i) specs.push_back({scan_grad_input_name(op, i), true, true});
  specs.push_back({"grad_h0", false, false});
  // `out`: the inputs' gradients, then grad_h0.
  auto make_args = [&](const std::vector<const Tensor*>& out) {
    ScanBackwardArgs args;
    args.op = op;
    for (int i = 0; i < n; ++i) {
      args.inputs[i] = b_absent && i == 1 ? nullptr : &inputs[static_cast<std::size_t>(i)].desc;
      args.grad_inputs[i] = out[static_cast<std::size_t>(i)];
    }
    args.y = &inputs[static_cast<std::size_t>(n)].desc;
    args.grad_y = &inputs[static_cast<std::size_t>(n + 1)].desc;
    args.h0 = present(h0);
    args.grad_h_final = present(grad_h_final);
    args.grad_h0 = out[static_cast<std::size_t>(n)];
    return args;
  };
  ScanOutputs outputs =
      resolve_scan_outputs(env, opts, specs, inputs[0], scan_input_name(op, 0), device,
                           [&](const std::vector<const Tensor*>& out) { return can_implement(make_args(out)); });
  inputs.push_back(h0);  // `inputs` moves: args come after
  inputs.push_back(grad_h_final);
  const ScanBackwardArgs args = make_args(views(outputs, specs));
  return finish(env, argc, argv, sync, device, stream, outputs, inputs, [&] { return scan_backward(args, stream); });
}

}  // namespace exphil::nif
