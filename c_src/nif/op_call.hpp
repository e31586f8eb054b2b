// The end of an op NIF: run the library call on the managed stream (or the
// caller's), then wait for it (sync: true) or return an Event (sync: false).
#pragma once

#include <memory>
#include <vector>

#include <cuda_runtime_api.h>
#include <erl_nif.h>

#include "device_memory.hpp"
#include "events.hpp"
#include "exphil/runtime.hpp"
#include "exphil/tensor.hpp"
#include "op_outputs.hpp"
#include "tensor_args.hpp"
#include "terms.hpp"

namespace exphil::nif {

// Runs call() -> Status, then answers {:ok, %{name => tensor}} once the work
// is done (sync), or {:ok, Event}. An event keeps the NIF's arguments
// (`argv`) and the memory of every tensor, inputs and outputs, alive until
// the work is done.
template <class Args, class Call>
ERL_NIF_TERM finish_call(ErlNifEnv* env, int argc, const ERL_NIF_TERM argv[], int device, Stream stream, bool sync,
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
  for (const TensorArg& t : outputs.tensors())
    if (t.memory) memory.push_back(t.memory);
  return make_event(env, device, s, std::vector<ERL_NIF_TERM>(argv, argv + argc), map, std::move(memory));
}

}  // namespace exphil::nif
