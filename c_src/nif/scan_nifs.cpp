// <op>_forward and <op>_backward for the four linear-recurrence scans:
// decode the arguments and plan the outputs from the op's description
// (op_inputs.hpp, op_outputs.hpp), run through the C++ API on the managed
// stream (or the caller's), then wait (sync: true, the default) or return
// an Event (sync: false).
#include <vector>

#include "atoms.hpp"
#include "call_options.hpp"
#include "exphil/runtime.hpp"
#include "exphil/scan.hpp"
#include "op_call.hpp"
#include "op_inputs.hpp"
#include "op_outputs.hpp"
#include "resources.hpp"
#include "scan_nifs.hpp"
#include "tensor_args.hpp"
#include "terms.hpp"

namespace exphil::nif {

namespace {

DType state_type(ErlNifEnv* env, const Options& opts) {
  auto t = opts.get("state_type");
  return t ? get_type(env, *t, "state_type") : DType::f32;
}

const std::vector<const char*> kCallOptions = {"outputs", "sync", "stream", "state_type"};

}  // namespace

ERL_NIF_TERM scan_forward_nif(ErlNifEnv* env, ScanOp op, int argc, const ERL_NIF_TERM argv[]) {
  OpCall call(env, scan_op_name(op), "forward", argv, {}, kCallOptions);
  call.plan_outputs(call.in().arg(scan_input_name(op, 0))->dtype, state_type(env, call.opts()));
  ScanForwardArgs args;
  args.op = op;
  return call.run(argc, argv, args);
}

ERL_NIF_TERM scan_backward_nif(ErlNifEnv* env, ScanOp op, int argc, const ERL_NIF_TERM argv[]) {
  // linear_scan's b may be nil (its description's b?): the backward then
  // reads the states from y (exphil/scan.hpp).
  OpCall call(env, scan_op_name(op), "backward", argv, {}, kCallOptions);
  call.plan_outputs(call.in().arg(scan_input_name(op, 0))->dtype, state_type(env, call.opts()));
  ScanBackwardArgs args;
  args.op = op;
  return call.run(argc, argv, args);
}

}  // namespace exphil::nif
