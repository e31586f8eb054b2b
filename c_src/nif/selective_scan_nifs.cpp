// selective_scan_forward and selective_scan_backward: decode, run through
// exphil::selective_scan_forward / _backward on the managed stream (or the
// caller's), then wait (sync: true, the default) or return an Event
// (sync: false). Tensor arguments, outputs:, stream:, sync: and errors are
// those of the linear-recurrence scans (scan_nifs.cpp). What differs:
//
//   * Elixir spells the math's A, B, C and D as a, b, c and d, since its
//     variables and option keys are lowercase; the NIF's own messages use
//     those names, the library's use exphil.h's.
//   * The tensors come in five shapes (Extent below), so outputs the NIF
//     allocates take theirs from x [B, T, D] and a [D, N]. The state tensors
//     are f32 by the op's definition: there is no state_type:.
//   * Every backward output is optional in the library, so under outputs:
//     the caller asks for exactly the gradients it needs (at least one).
//     Without outputs:, the NIF makes every gradient the call has: those of
//     x, dt, a, b, c, and of each optional input that was given.
#include <cfloat>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <new>
#include <optional>
#include <string>
#include <vector>

#include "atoms.hpp"
#include "call_options.hpp"
#include "events.hpp"
#include "exphil/runtime.hpp"
#include "exphil/selective_scan.hpp"
#include "resources.hpp"
#include "selective_scan_nifs.hpp"
#include "tensor_args.hpp"
#include "terms.hpp"

namespace exphil::nif {

namespace {

// --- Inputs

// An optional tensor. Absence is recorded as such, not as a null address,
// so that a given tensor with a null address reaches the library's checks.
using Optional = std::optional<TensorArg>;

const Tensor* present(const Optional& t) { return t ? &t->desc : nullptr; }

struct Inputs {
  TensorArg x, dt, a, b, c;
  Optional dt_bias, d, z, h0;

  SelectiveScanInputs view() const {
    SelectiveScanInputs in;
    in.x = &x.desc;
    in.dt = &dt.desc;
    in.A = &a.desc;
    in.B = &b.desc;
    in.C = &c.desc;
    in.dt_bias = present(dt_bias);
    in.D = present(d);
    in.z = present(z);
    in.h0 = present(h0);
    return in;
  }

  // Every tensor given, for an event to keep alive.
  std::vector<const TensorArg*> all() const {
    std::vector<const TensorArg*> tensors = {&x, &dt, &a, &b, &c};
    for (const Optional* t : {&dt_bias, &d, &z, &h0})
      if (*t) tensors.push_back(&**t);
    return tensors;
  }
};

// A tensor option: absent or nil means not given.
Optional optional_tensor(ErlNifEnv* env, const Options& opts, const char* name, int device) {
  auto term = opts.get(name);
  if (!term || enif_is_identical(*term, atoms().nil)) return std::nullopt;
  return decode_tensor(env, *term, name, device);
}

// x first: the call runs on x's device, and IPC handles among the other
// tensors are opened there.
Inputs decode_inputs(ErlNifEnv* env, const ERL_NIF_TERM argv[], const Options& opts, int& device) {
  Inputs in;
  in.x = decode_tensor(env, argv[0], "x");
  device = call_device(in.x);
  in.dt = decode_tensor(env, argv[1], "dt", device);
  in.a = decode_tensor(env, argv[2], "a", device);
  in.b = decode_tensor(env, argv[3], "b", device);
  in.c = decode_tensor(env, argv[4], "c", device);
  in.dt_bias = optional_tensor(env, opts, "dt_bias", device);
  in.d = optional_tensor(env, opts, "d", device);
  in.z = optional_tensor(env, opts, "z", device);
  in.h0 = optional_tensor(env, opts, "h0", device);
  return in;
}

// An Elixir number as a double that converts to a finite f32. A float
// beyond f32's range would reach the library as an infinity, reported
// without the value the caller wrote: it is refused here instead, showing
// it. (Bignums are refused too: no sensible bound needs one, and erl_nif
// cannot convert them.)
bool get_f32_range(ErlNifEnv* env, ERL_NIF_TERM term, double& out) {
  ErlNifSInt64 integer = 0;
  if (enif_get_int64(env, term, &integer))
    out = static_cast<double>(integer);
  else if (!enif_get_double(env, term, &out))
    return false;
  return std::fabs(out) <= static_cast<double>(FLT_MAX);
}

// softplus: and clamp:. The library checks the clamp's bounds too, but
// under the name of the C argument, 'options'; this message names the
// option and shows the tuple as the caller wrote it. The order is checked
// on the values given, before rounding to f32.
SelectiveScanOptions decode_scan_options(ErlNifEnv* env, const Options& opts) {
  SelectiveScanOptions options;
  if (auto term = opts.get("softplus")) options.softplus = get_boolean(*term, "softplus");
  auto term = opts.get("clamp");
  if (!term || enif_is_identical(*term, atoms().nil)) return options;
  const ERL_NIF_TERM* bounds = nullptr;
  int arity = 0;
  double dt_min = 0.0, dt_max = 0.0;
  if (!enif_get_tuple(env, *term, &arity, &bounds) || arity != 2 || !get_f32_range(env, bounds[0], dt_min) ||
      !get_f32_range(env, bounds[1], dt_max) || dt_min > dt_max)
    bad_argument("clamp",
                 "nil or {dt_min, dt_max} with dt_min <= dt_max, two numbers within f32's range "
                 "(floats or 64-bit integers)",
                 *term);
  options.clamp = true;
  options.dt_min = static_cast<float>(dt_min);
  options.dt_max = static_cast<float>(dt_max);
  return options;
}

// --- Outputs

struct Dims {
  int64_t batch, steps, channels, states;  // B, T, D, N
};

// The rank checks the output shapes rest on; made with or without outputs:,
// so that a call gets the same message either way. Everything else about
// shapes (D of x against D of a, N of b and c, ...) is the library's.
Dims dims_of(const Inputs& in) {
  if (in.x.shape.size() != 3)
    throw ArgumentError{"argument 'x': expected rank 3 [B, T, D], got shape " + shape_text(in.x.shape)};
  if (in.a.shape.size() != 2)
    throw ArgumentError{"argument 'a': expected rank 2 [D, N], got shape " + shape_text(in.a.shape)};
  return {in.x.shape[0], in.x.shape[1], in.x.shape[2], in.a.shape[1]};
}

// The shapes the op's tensors come in.
enum class Extent {
  sequence,    // [B, T, D], x's dtype
  projection,  // [B, T, N], x's dtype
  state,       // [B, D, N], f32
  weights,     // [D, N], f32
  channels,    // [D], f32
};

std::vector<int64_t> shape_of(Extent extent, const Dims& d) {
  switch (extent) {
    case Extent::sequence: return {d.batch, d.steps, d.channels};
    case Extent::projection: return {d.batch, d.steps, d.states};
    case Extent::state: return {d.batch, d.channels, d.states};
    case Extent::weights: return {d.channels, d.states};
    case Extent::channels: break;
  }
  return {d.channels};
}

DType dtype_of(Extent extent, DType sequence_dtype) {
  return extent == Extent::sequence || extent == Extent::projection ? sequence_dtype : DType::f32;
}

// One output of a direction: its Elixir name, its shape, and the field of
// the library's arguments (Args) that takes it.
template <class Args>
struct OutputSpec {
  const char* name;
  Extent extent;
  const Tensor* Args::*slot;
  bool required;  // must be given under outputs:
  bool exists;    // allocated without outputs: (false: the gradient of an absent input)
};

template <class Args>
struct Outputs {
  std::vector<TensorArg> tensors;
  std::vector<const Tensor* Args::*> slots;
  std::vector<ERL_NIF_TERM> keys, values;  // the result map

  void add(ErlNifEnv* env, const OutputSpec<Args>& spec, TensorArg tensor, ERL_NIF_TERM value) {
    tensors.push_back(std::move(tensor));
    slots.push_back(spec.slot);
    keys.push_back(atom(env, spec.name));
    values.push_back(value);
  }

  // Outputs not written stay NULL in `args`.
  void bind(Args& args) const {
    for (std::size_t i = 0; i < slots.size(); ++i) args.*slots[i] = &tensors[i].desc;
  }

  // %{name => tensor}. Copies the terms: erl_nif takes the arrays as non-const.
  ERL_NIF_TERM result_map(ErlNifEnv* env) const {
    std::vector<ERL_NIF_TERM> k = keys, v = values;
    ERL_NIF_TERM map;
    if (!enif_make_map_from_arrays(env, k.data(), v.data(), k.size(), &map)) throw std::bad_alloc();
    return map;
  }
};

template <class Args>
Outputs<Args> resolve_outputs(ErlNifEnv* env, const Options& opts, const std::vector<OutputSpec<Args>>& specs,
                              const Dims& dims, DType sequence_dtype, int device) {
  Outputs<Args> out;
  if (auto given = opts.get("outputs")) {
    std::vector<const char*> names;
    std::string listed;
    for (const OutputSpec<Args>& s : specs) {
      names.push_back(s.name);
      listed += (listed.empty() ? ":" : ", :") + std::string(s.name);
    }
    const Options outputs(env, *given, names);
    for (const OutputSpec<Args>& s : specs) {
      auto term = outputs.get(s.name);
      if (!term) {
        if (s.required)
          throw ArgumentError{"argument 'outputs': expected a tensor for :" + std::string(s.name) +
                              " (destination passing gives every required output), got none"};
        continue;
      }
      out.add(env, s, decode_tensor(env, *term, s.name, device), *term);
    }
    // A call that writes nothing is a mistake in the caller, not a request.
    if (out.tensors.empty()) bad_argument("outputs", "at least one output among " + listed, *given);
    return out;
  }
  for (const OutputSpec<Args>& s : specs) {
    if (!s.exists) continue;
    const DType dtype = dtype_of(s.extent, sequence_dtype);
    const std::vector<int64_t> shape = shape_of(s.extent, dims);
    const ERL_NIF_TERM shape_term = make_shape(env, shape);
    TensorArg t;
    t.dtype = dtype;
    t.shape = shape;
    t.bytes = tensor_bytes(dtype, shape, s.name, shape_term);
    check(allocate_device_memory(device, t.bytes, t.memory));
    t.desc.data = t.memory->data();
    t.desc.dtype = static_cast<int32_t>(dtype);
    t.desc.rank = static_cast<int32_t>(shape.size());
    for (std::size_t i = 0; i < shape.size(); ++i) t.desc.shape[i] = shape[i];
    const ERL_NIF_TERM buffer = make_buffer(env, t.memory, make_type(env, dtype), shape_term);
    out.add(env, s, std::move(t), buffer);
  }
  return out;
}

// Runs the call, then waits or returns an event. An event keeps the NIF's
// arguments (`argv`) and the memory of every tensor alive until the work
// is done.
template <class Args, class Call>
ERL_NIF_TERM finish(ErlNifEnv* env, int argc, const ERL_NIF_TERM argv[], int device, Stream stream, bool sync,
                    const Outputs<Args>& outputs, const std::vector<const TensorArg*>& inputs, Call&& call) {
  check(call());
  cudaStream_t s = stream;
  if (!s) check(managed_stream(device, s));
  const ERL_NIF_TERM map = outputs.result_map(env);
  if (sync) {
    check(wait_for_stream(device, s));
    return make_ok(env, map);
  }
  std::vector<std::shared_ptr<DeviceMemory>> memory;
  for (const TensorArg* t : inputs)
    if (t->memory) memory.push_back(t->memory);
  for (const TensorArg& t : outputs.tensors)
    if (t.memory) memory.push_back(t.memory);
  return make_event(env, device, s, std::vector<ERL_NIF_TERM>(argv, argv + argc), map, std::move(memory));
}

}  // namespace

ERL_NIF_TERM selective_scan_forward_nif(ErlNifEnv* env, int argc, const ERL_NIF_TERM argv[]) {
  return nif_entry(env, [&] {
    using Args = SelectiveScanForwardArgs;
    const Options opts(env, argv[5], {"dt_bias", "d", "z", "h0", "softplus", "clamp", "outputs", "sync", "stream"});
    int device = 0;
    const Inputs in = decode_inputs(env, argv, opts, device);
    const SelectiveScanOptions options = decode_scan_options(env, opts);
    const Stream stream = decode_stream(env, opts);
    const bool sync = decode_sync(opts);
    const Dims dims = dims_of(in);
    const Outputs<Args> outputs = resolve_outputs<Args>(
        env, opts,
        {{"y", Extent::sequence, &Args::y, true, true}, {"h_final", Extent::state, &Args::h_final, false, true}},
        dims, in.x.dtype, device);
    return finish(env, argc, argv, device, stream, sync, outputs, in.all(), [&] {
      Args args;
      args.in = in.view();
      args.options = options;
      outputs.bind(args);
      return exphil::selective_scan_forward(args, stream);
    });
  });
}

ERL_NIF_TERM selective_scan_backward_nif(ErlNifEnv* env, int argc, const ERL_NIF_TERM argv[]) {
  return nif_entry(env, [&] {
    using Args = SelectiveScanBackwardArgs;
    const Options opts(env, argv[6],
                       {"dt_bias", "d", "z", "h0", "grad_h_final", "softplus", "clamp", "outputs", "sync", "stream"});
    int device = 0;
    const Inputs in = decode_inputs(env, argv, opts, device);
    const TensorArg grad_y = decode_tensor(env, argv[5], "grad_y", device);
    const Optional grad_h_final = optional_tensor(env, opts, "grad_h_final", device);
    const SelectiveScanOptions options = decode_scan_options(env, opts);
    const Stream stream = decode_stream(env, opts);
    const bool sync = decode_sync(opts);
    const Dims dims = dims_of(in);
    const Outputs<Args> outputs = resolve_outputs<Args>(
        env, opts,
        {
            {"grad_x", Extent::sequence, &Args::grad_x, false, true},
            {"grad_dt", Extent::sequence, &Args::grad_dt, false, true},
            {"grad_a", Extent::weights, &Args::grad_A, false, true},
            {"grad_b", Extent::projection, &Args::grad_B, false, true},
            {"grad_c", Extent::projection, &Args::grad_C, false, true},
            {"grad_dt_bias", Extent::channels, &Args::grad_dt_bias, false, in.dt_bias.has_value()},
            {"grad_d", Extent::channels, &Args::grad_D, false, in.d.has_value()},
            {"grad_z", Extent::sequence, &Args::grad_z, false, in.z.has_value()},
            {"grad_h0", Extent::state, &Args::grad_h0, false, in.h0.has_value()},
        },
        dims, in.x.dtype, device);
    std::vector<const TensorArg*> inputs = in.all();
    inputs.push_back(&grad_y);
    if (grad_h_final) inputs.push_back(&*grad_h_final);
    return finish(env, argc, argv, device, stream, sync, outputs, inputs, [&] {
      Args args;
      args.in = in.view();
      args.options = options;
      args.grad_y = &grad_y.desc;
      args.grad_h_final = present(grad_h_final);
      outputs.bind(args);
      return exphil::selective_scan_backward(args, stream);
    });
  });
}

}  // namespace exphil::nif
