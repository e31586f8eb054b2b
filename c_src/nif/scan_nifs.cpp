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

namespace {

// Both directions: the outputs' dtypes are the first input's and
// state_type:'s (f32 by default); Args picks the library call. linear_scan's
// backward b may be nil (its description's b?): the library then reads the
// states from y (exphil/scan.hpp).
template <class Args>
ERL_NIF_TERM scan_nif(ErlNifEnv* env, ScanOp op, const char* direction, int argc, const ERL_NIF_TERM argv[]) {
  OpCall call(env, scan_op_name(op), direction, argv, {}, kCallOptions);
  call.plan_outputs(call.in().arg(scan_input_name(op, 0))->dtype, state_type(env, call.opts()));
  Args args;
  args.op = op;
  return call.run(argc, argv, args);
}

}  // namespace

ERL_NIF_TERM scan_forward_nif(ErlNifEnv* env, ScanOp op, int argc, const ERL_NIF_TERM argv[]) {
  return scan_nif<ScanForwardArgs>(env, op, "forward", argc, argv);
}

ERL_NIF_TERM scan_backward_nif(ErlNifEnv* env, ScanOp op, int argc, const ERL_NIF_TERM argv[]) {
  return scan_nif<ScanBackwardArgs>(env, op, "backward", argc, argv);
}

}  // namespace exphil::nif
