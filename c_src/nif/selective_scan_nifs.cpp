// selective_scan_forward and selective_scan_backward: decode, run through
// exphil::selective_scan_forward / _backward on the managed stream (or the
// caller's), then wait (sync: true, the default) or return an Event
// (sync: false). Tensor arguments, outputs:, stream:, sync: and errors are
// those of the linear-recurrence scans (scan_nifs.cpp). What differs:
//
//   * Elixir spells the math's A, B, C and D as a, b, c and d, since its
//     variables and option keys are lowercase; the NIF's own messages use
//     those names, the library's use exphil.h's.
//   * The tensors come in five shapes (Shapes below), so outputs the NIF
//     allocates take theirs from x [B, T, D] and a [D, N]. The state tensors
//     are f32 by the op's definition: there is no state_type:.
//   * Every backward output is optional in the library, so under outputs:
//     the caller asks for exactly the gradients it needs (at least one).
//     Without outputs:, the NIF makes every gradient the call has: those of
//     x, dt, a, b, c, and of each optional input that was given.
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "atoms.hpp"
#include "call_options.hpp"
#include "exphil/selective_scan.hpp"
#include "op_call.hpp"
#include "op_outputs.hpp"
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

// The shapes the op's tensors come in, from x [B, T, D] and a [D, N]. The
// rank checks they rest on are made with or without outputs:, so that a
// call gets the same message either way. Everything else about shapes (D of
// x against D of a, N of b and c, ...) is the library's.
struct Shapes {
  std::vector<int64_t> sequence;    // [B, T, D], x's dtype
  std::vector<int64_t> projection;  // [B, T, N], x's dtype
  std::vector<int64_t> state;       // [B, D, N], f32
  std::vector<int64_t> weights;     // [D, N], f32
  std::vector<int64_t> channels;    // [D], f32
};

Shapes shapes_of(const Inputs& in) {
  if (in.x.shape.size() != 3)
    throw ArgumentError{"argument 'x': expected rank 3 [B, T, D], got shape " + shape_text(in.x.shape)};
  if (in.a.shape.size() != 2)
    throw ArgumentError{"argument 'a': expected rank 2 [D, N], got shape " + shape_text(in.a.shape)};
  const int64_t batch = in.x.shape[0], steps = in.x.shape[1], channels = in.x.shape[2], states = in.a.shape[1];
  return {{batch, steps, channels}, {batch, steps, states}, {batch, channels, states}, {channels, states}, {channels}};
}

}  // namespace

ERL_NIF_TERM selective_scan_forward_nif(ErlNifEnv* env, int argc, const ERL_NIF_TERM argv[]) {
  return nif_entry(env, [&] {
    using Args = SelectiveScanForwardArgs;
    const Atoms& a = atoms();
    const Options opts(env, argv[5], {"dt_bias", "d", "z", "h0", "softplus", "clamp", "outputs", "sync", "stream"});
    int device = 0;
    const Inputs in = decode_inputs(env, argv, opts, device);
    const SelectiveScanOptions options = decode_scan_options(env, opts);
    const Stream stream = decode_stream(env, opts);
    const bool sync = decode_sync(opts);
    const Shapes shapes = shapes_of(in);
    Args args;
    args.in = in.view();
    args.options = options;
    // name, key, slot, dtype, shape, required, exists
    const Outputs<Args> outputs = resolve_outputs<Args>(
        env, opts,
        {
            {"y", a.y, &Args::y, in.x.dtype, shapes.sequence, true, true},
            {"h_final", a.h_final, &Args::h_final, DType::f32, shapes.state, false, true},
        },
        device, args);
    outputs.bind(args);
    return finish_call(env, argc, argv, device, stream, sync, outputs, in.all(),
                       [&] { return exphil::selective_scan_forward(args, stream); });
  });
}

ERL_NIF_TERM selective_scan_backward_nif(ErlNifEnv* env, int argc, const ERL_NIF_TERM argv[]) {
  return nif_entry(env, [&] {
    using Args = SelectiveScanBackwardArgs;
    const Atoms& a = atoms();
    const Options opts(env, argv[6],
                       {"dt_bias", "d", "z", "h0", "grad_h_final", "softplus", "clamp", "outputs", "sync", "stream"});
    int device = 0;
    const Inputs in = decode_inputs(env, argv, opts, device);
    const TensorArg grad_y = decode_tensor(env, argv[5], "grad_y", device);
    const Optional grad_h_final = optional_tensor(env, opts, "grad_h_final", device);
    const SelectiveScanOptions options = decode_scan_options(env, opts);
    const Stream stream = decode_stream(env, opts);
    const bool sync = decode_sync(opts);
    const Shapes shapes = shapes_of(in);
    const DType x_dtype = in.x.dtype, f32 = DType::f32;
    Args args;
    args.in = in.view();
    args.options = options;
    args.grad_y = &grad_y.desc;
    args.grad_h_final = present(grad_h_final);
    // name, key, slot, dtype, shape, required, exists
    const Outputs<Args> outputs = resolve_outputs<Args>(
        env, opts,
        {
            {"grad_x", a.grad_x, &Args::grad_x, x_dtype, shapes.sequence, false, true},
            {"grad_dt", a.grad_dt, &Args::grad_dt, x_dtype, shapes.sequence, false, true},
            {"grad_a", a.grad_a, &Args::grad_A, f32, shapes.weights, false, true},
            {"grad_b", a.grad_b, &Args::grad_B, x_dtype, shapes.projection, false, true},
            {"grad_c", a.grad_c, &Args::grad_C, x_dtype, shapes.projection, false, true},
            {"grad_dt_bias", a.grad_dt_bias, &Args::grad_dt_bias, f32, shapes.channels, false, in.dt_bias.has_value()},
            {"grad_d", a.grad_d, &Args::grad_D, f32, shapes.channels, false, in.d.has_value()},
            {"grad_z", a.grad_z, &Args::grad_z, x_dtype, shapes.sequence, false, in.z.has_value()},
            {"grad_h0", a.grad_h0, &Args::grad_h0, f32, shapes.state, false, in.h0.has_value()},
        },
        device, args);
    outputs.bind(args);
    std::vector<const TensorArg*> inputs = in.all();
    inputs.push_back(&grad_y);
    if (grad_h_final) inputs.push_back(&*grad_h_final);
    return finish_call(env, argc, argv, device, stream, sync, outputs, inputs,
                       [&] { return exphil::selective_scan_backward(args, stream); });
  });
}

}  // namespace exphil::nif
