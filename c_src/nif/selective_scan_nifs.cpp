// selective_scan_forward and selective_scan_backward: decode, run through
// exphil::selective_scan_forward / _backward on the managed stream (or the
// caller's), then wait (sync: true, the default) or return an Event
// (sync: false). Tensor arguments, outputs:, stream:, sync: and errors are
// those of the linear-recurrence scans (scan_nifs.cpp). What differs:
//
//   * Elixir spells the math's A, B, C and D as a, b, c and d, since its
//     variables and option keys are lowercase; the NIF's own messages use
//     those names, the library's use exphil.h's.
//   * Outputs the NIF allocates take their shapes from x [B, T, D] and
//     a [D, N], as the op's description says (op_outputs.hpp). The state
//     tensors are f32 by the op's definition: there is no state_type:.
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

// The outputs' plan, from the description and the inputs (x's dtype for
// the sequence tensors, f32 for the rest).
std::vector<OutputPlan> outputs_of(const char* direction, const Inputs& in) {
  auto given = [](const Optional& t) { return t ? &*t : nullptr; };
  return plan_outputs(description_of("selective_scan", direction),
                      {{"x", &in.x},
                       {"dt", &in.dt},
                       {"A", &in.a},
                       {"B", &in.b},
                       {"C", &in.c},
                       {"dt_bias", given(in.dt_bias)},
                       {"D", given(in.d)},
                       {"z", given(in.z)},
                       {"h0", given(in.h0)}},
                      in.x.dtype, DType::f32);
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
    Outputs outputs = resolve_outputs(env, opts, outputs_of("forward", in), device);
    auto make_args = [&] {
      Args args;
      args.in = in.view();
      args.options = options;
      args.y = outputs.get("y");
      args.h_final = outputs.get("h_final");
      return args;
    };
    const Args args = bind_outputs(env, outputs, device, make_args);
    return finish_call(env, argc, argv, device, stream, sync, outputs, in.all(),
                       [&] { return exphil::selective_scan_forward(args, stream); });
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
    Outputs outputs = resolve_outputs(env, opts, outputs_of("backward", in), device);
    auto make_args = [&] {
      Args args;
      args.in = in.view();
      args.options = options;
      args.grad_y = &grad_y.desc;
      args.grad_h_final = present(grad_h_final);
      for (auto [slot, name] : {std::pair{&args.grad_x, "grad_x"},
                                {&args.grad_dt, "grad_dt"},
                                {&args.grad_A, "grad_A"},
                                {&args.grad_B, "grad_B"},
                                {&args.grad_C, "grad_C"},
                                {&args.grad_dt_bias, "grad_dt_bias"},
                                {&args.grad_D, "grad_D"},
                                {&args.grad_z, "grad_z"},
                                {&args.grad_h0, "grad_h0"}})
        *slot = outputs.get(name);
      return args;
    };
    const Args args = bind_outputs(env, outputs, device, make_args);
    std::vector<const TensorArg*> inputs = in.all();
    inputs.push_back(&grad_y);
    if (grad_h_final) inputs.push_back(&*grad_h_final);
    return finish_call(env, argc, argv, device, stream, sync, outputs, inputs,
                       [&] { return exphil::selective_scan_backward(args, stream); });
  });
}

}  // namespace exphil::nif
