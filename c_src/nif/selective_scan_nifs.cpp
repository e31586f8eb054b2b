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
#include <utility>
#include <vector>

#include "atoms.hpp"
#include "call_options.hpp"
#include "exphil/selective_scan.hpp"
#include "op_call.hpp"
#include "op_inputs.hpp"
#include "op_outputs.hpp"
#include "selective_scan_nifs.hpp"
#include "tensor_args.hpp"
#include "terms.hpp"

namespace exphil::nif {

namespace {

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

const std::vector<const char*> kOpOptions = {"softplus", "clamp"};
const std::vector<const char*> kCallOptions = {"outputs", "sync", "stream"};

}  // namespace

namespace {

// Both directions: the same options and output dtypes (x's for the
// sequence tensors, f32 for the rest); Args picks the library call.
template <class Args>
ERL_NIF_TERM selective_scan_nif(ErlNifEnv* env, const char* direction, int argc, const ERL_NIF_TERM argv[]) {
  return nif_entry(env, [&] {
    OpCall call(env, "selective_scan", direction, argv, kOpOptions, kCallOptions);
    Args args;
    args.options = decode_scan_options(env, call.opts());
    call.plan_outputs(call.in().arg("x")->dtype, DType::f32);
    return call.run(argc, argv, args);
  });
}

}  // namespace

ERL_NIF_TERM selective_scan_forward_nif(ErlNifEnv* env, int argc, const ERL_NIF_TERM argv[]) {
  return selective_scan_nif<SelectiveScanForwardArgs>(env, "forward", argc, argv);
}

ERL_NIF_TERM selective_scan_backward_nif(ErlNifEnv* env, int argc, const ERL_NIF_TERM argv[]) {
  return selective_scan_nif<SelectiveScanBackwardArgs>(env, "backward", argc, argv);
}

}  // namespace exphil::nif
