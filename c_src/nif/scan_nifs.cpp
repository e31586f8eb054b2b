// <op>_forward and <op>_backward for the four linear-recurrence scans:
// decode, run through the C++ API on the managed stream (or the caller's),
// then wait (sync: true, the default) or return an Event (sync: false).
#include <limits>
#include <string>
#include <vector>

#include "atoms.hpp"
#include "call_options.hpp"
#include "events.hpp"
#include "exphil/runtime.hpp"
#include "exphil/scan.hpp"
#include "resources.hpp"
#include "scan_nifs.hpp"
#include "tensor_args.hpp"
#include "terms.hpp"

namespace exphil::nif {

namespace {

struct OutputSpec {
  std::string name;
  bool required;
  bool sequence;  // [B, T, H] of the sequence dtype, else [B, H] of the state type
};

struct Outputs {
  std::vector<TensorArg> tensors;  // in spec order; absent optional ones have no data
  std::vector<ERL_NIF_TERM> keys, values;
};

Outputs resolve_outputs(ErlNifEnv* env, const Options& opts, const std::vector<OutputSpec>& specs,
                        const TensorArg& reference, const std::string& reference_name, int device) {
  Outputs out;
  if (reference.shape.size() != 3)
    throw ArgumentError{"argument '" + reference_name + "': expected rank 3 [B, T, H], got shape " +
                        shape_text(reference.shape)};
  if (auto given = opts.get("outputs")) {
    std::vector<const char*> names;
    for (const OutputSpec& s : specs) names.push_back(s.name.c_str());
    const Options outputs(env, *given, names);
    for (const OutputSpec& s : specs) {
      auto term = outputs.get(s.name.c_str());
      if (!term) {
        if (s.required)
          throw ArgumentError{"argument 'outputs': expected a tensor for :" + s.name +
                              " (destination passing gives every required output), got none"};
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
  for (const OutputSpec& s : specs) {
    const DType dtype = s.sequence ? reference.dtype : state_dtype;
    const std::vector<int64_t>& shape = s.sequence ? reference.shape : state_shape;
    TensorArg t;
    t.dtype = dtype;
    t.shape = shape;
    t.bytes = tensor_bytes(dtype, shape, s.name, make_shape(env, shape));
    check(allocate_device_memory(device, t.bytes, t.memory));
    t.desc = make_tensor(t.memory->data(), dtype, {});
    t.desc.rank = static_cast<int32_t>(shape.size());
    for (std::size_t i = 0; i < shape.size(); ++i) t.desc.shape[i] = shape[i];
    out.keys.push_back(atom(env, s.name.c_str()));
    out.values.push_back(make_buffer(env, t.memory, make_type(env, dtype), make_shape(env, shape)));
    out.tensors.push_back(std::move(t));
  }
  return out;
}

const Tensor* present(const TensorArg& t) { return t.desc.data ? &t.desc : nullptr; }

// Runs the call, then waits or returns an event. `argv` are the NIF's
// arguments, kept alive by an event.
template <class Call>
ERL_NIF_TERM finish(ErlNifEnv* env, int argc, const ERL_NIF_TERM argv[], bool sync, int device,
                    Stream stream, Outputs& outputs, std::vector<TensorArg>& inputs, Call&& call) {
  check(call());
  cudaStream_t s = stream;
  if (!s) check(managed_stream(device, s));
  ERL_NIF_TERM map;
  if (!enif_make_map_from_arrays(env, outputs.keys.data(), outputs.values.data(),
                                 static_cast<unsigned>(outputs.keys.size()), &map))
    throw std::bad_alloc();
  if (sync) {
    check(wait_for_stream(device, s));
    return make_ok(env, map);
  }
  std::vector<std::shared_ptr<DeviceMemory>> memory;
  for (TensorArg& t : inputs)
    if (t.memory) memory.push_back(t.memory);
  for (TensorArg& t : outputs.tensors)
    if (t.memory) memory.push_back(t.memory);
  return make_event(env, device, s, std::vector<ERL_NIF_TERM>(argv, argv + argc), map, std::move(memory));
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
  Outputs outputs = resolve_outputs(env, opts, {{"y", true, true}, {"h_final", false, false}}, inputs[0],
                                    scan_input_name(op, 0), device);
  inputs.push_back(h0);
  return finish(env, argc, argv, sync, device, stream, outputs, inputs, [&] {
    ScanForwardArgs args;
    args.op = op;
    for (int i = 0; i < n; ++i) args.inputs[i] = &inputs[static_cast<std::size_t>(i)].desc;
    args.h0 = present(h0);
    args.y = &outputs.tensors[0].desc;
    args.h_final = present(outputs.tensors[1]);
    return scan_forward(args, stream);
  });
}

ERL_NIF_TERM scan_backward_nif(ErlNifEnv* env, ScanOp op, int argc, const ERL_NIF_TERM argv[]) {
  const int n = scan_input_count(op);
  const Options opts(env, argv[n + 2], {"h0", "grad_h_final", "outputs", "sync", "stream", "state_type"});
  std::vector<TensorArg> inputs;
  for (int i = 0; i < n; ++i) inputs.push_back(decode_tensor(env, argv[i], scan_input_name(op, i)));
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
  std::vector<OutputSpec> specs;
  for (int i = 0; i < n; ++i) specs.push_back({scan_grad_input_name(op, i), true, true});
  specs.push_back({"grad_h0", false, false});
  Outputs outputs = resolve_outputs(env, opts, specs, inputs[0], scan_input_name(op, 0), device);
  inputs.push_back(h0);
  inputs.push_back(grad_h_final);
  return finish(env, argc, argv, sync, device, stream, outputs, inputs, [&] {
    ScanBackwardArgs args;
    args.op = op;
    for (int i = 0; i < n; ++i) {
      args.inputs[i] = &inputs[static_cast<std::size_t>(i)].desc;
      args.grad_inputs[i] = &outputs.tensors[static_cast<std::size_t>(i)].desc;
    }
    args.y = &inputs[static_cast<std::size_t>(n)].desc;
    args.grad_y = &inputs[static_cast<std::size_t>(n + 1)].desc;
    args.h0 = present(h0);
    args.grad_h_final = present(grad_h_final);
    args.grad_h0 = present(outputs.tensors[static_cast<std::size_t>(n)]);
    return scan_backward(args, stream);
  });
}

}  // namespace exphil::nif
