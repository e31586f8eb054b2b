// An op NIF's call: decode it from the op's description, run the library
// call on the managed stream (or the caller's), then wait for it (sync:
// true) or return an Event (sync: false).
#pragma once

#include <optional>
#include <vector>

#include <erl_nif.h>

#include "exphil/runtime.hpp"
#include "call_options.hpp"
#include "exphil/tensor.hpp"
#include "op_inputs.hpp"
#include "op_outputs.hpp"
#include "tensor_args.hpp"
#include "terms.hpp"

namespace exphil::nif {

// Answers a call whose work is enqueued on `stream` (null: the managed
// stream): {:ok, map} once the work is done (sync), or {:ok, Event}. An
// event keeps the NIF's arguments (`argv`) and the memory of `tensors`
// (inputs and outputs) alive until the work is done.
ERL_NIF_TERM answer_call(ErlNifEnv* env, int argc, const ERL_NIF_TERM argv[], int device, Stream stream, bool sync,
                         ERL_NIF_TERM map, const std::vector<const TensorArg*>& tensors);

// exphil::run for any op's args, found by their type (the op's header,
// included by the NIF that instantiates OpCall::run, declares it).
template <class Args>
Status run_args(const Args& args, Stream stream) {
  return run(args, stream);
}

// One op NIF call, from the op's description: its arguments (op_inputs.hpp),
// then, after the NIF has decoded its op options, the stream:, sync: and the
// outputs (op_outputs.hpp), then the tensors bound into the library's args
// by their names, the library call and its answer. An op's NIF adds only
// its op options (the NIF's own spellings).
class OpCall {
 public:
  OpCall(ErlNifEnv* env, const char* op, const char* direction, const ERL_NIF_TERM argv[],
         const std::vector<const char*>& op_options, const std::vector<const char*>& call_options)
      : env_(env),
        description_(description_of(op, direction)),
        in_(decode_arguments(env, description_, argv, op_options, call_options)) {}

  const OpArguments& in() const noexcept { return in_; }
  const Options& opts() const { return in_.opts(); }
  // Valid after plan_outputs().
  const Outputs& outputs() const { return *outputs_; }

  // stream: and sync:, then the outputs: given, or planned (seq and state
  // are the dtypes of the description's seq and state tensors; bthd:
  // attention's layout).
  void plan_outputs(DType seq, DType state, bool bthd = false) {
    stream_ = decode_stream(env_, opts());
    sync_ = decode_sync(opts());
    outputs_.emplace(resolve_outputs(env_, opts(), nif::plan_outputs(description_, in_, seq, state, bthd), in_.device()));
  }

  // The library's args, given with their op options (and a scan's op),
  // get every described tensor by its name (exphil::tensor_slot): the
  // inputs, and the outputs, whose descriptors stay where they are when
  // allocate() gives them memory. When the NIF allocates the outputs,
  // can_implement passes the call with them described first. Then
  // exphil::run runs it, and the NIF answers {:ok, %{name => tensor}} as
  // answer_call does.
  template <class Args>
  ERL_NIF_TERM run(int argc, const ERL_NIF_TERM argv[], Args args) {
    for (const TensorDescription& t : description_.tensors) {
      const Tensor** slot = tensor_slot(args, t.name);
      if (!slot)
        throw Failure{Status(StatusCode::internal, "the args of " + description_.op + " " +
                                                       description_.direction + " have no tensor '" + t.name + "'")};
      *slot = t.output ? outputs_->get(t.name) : in_.get(t.name);
    }
    if (!outputs_->given()) {
      check(can_implement(args));
      outputs_->allocate(env_, in_.device());
    }
    check(run_args(args, stream_));
    std::vector<const TensorArg*> tensors = in_.all();
    for (const TensorArg& t : outputs_->tensors()) tensors.push_back(&t);
    return answer_call(env_, argc, argv, in_.device(), stream_, sync_, outputs_->result_map(env_), tensors);
  }

 private:
  ErlNifEnv* env_;
  const OpDescription& description_;
  OpArguments in_;
  Stream stream_ = nullptr;
  bool sync_ = true;
  std::optional<Outputs> outputs_;
};

}  // namespace exphil::nif
