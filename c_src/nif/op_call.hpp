// The end of an op NIF: run the library call on the managed stream (or the
// caller's), then wait for it (sync: true) or return an Event (sync: false).
#pragma once

#include <vector>

#include <erl_nif.h>

#include "exphil/runtime.hpp"
#include "exphil/tensor.hpp"
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

// Runs call() -> Status, then answers {:ok, %{name => tensor}} as
// answer_call does.
template <class Call>
ERL_NIF_TERM finish_call(ErlNifEnv* env, int argc, const ERL_NIF_TERM argv[], int device, Stream stream, bool sync,
                         const Outputs& outputs, const std::vector<const TensorArg*>& inputs, Call&& call) {
  check(call());
  std::vector<const TensorArg*> tensors = inputs;
  for (const TensorArg& t : outputs.tensors()) tensors.push_back(&t);
  return answer_call(env, argc, argv, device, stream, sync, outputs.result_map(env), tensors);
}

}  // namespace exphil::nif
