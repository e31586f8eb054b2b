#include "op_call.hpp"

#include <memory>

#include <cuda_runtime_api.h>

#include "device_memory.hpp"
#include "events.hpp"

namespace exphil::nif {

ERL_NIF_TERM answer_call(ErlNifEnv* env, int argc, const ERL_NIF_TERM argv[], int device, Stream stream, bool sync,
                         ERL_NIF_TERM map, const std::vector<const TensorArg*>& tensors) {
  cudaStream_t s = stream;
  if (!s) check(managed_stream(device, s));
  if (sync) {
    check(wait_for_stream(device, s));
    return make_ok(env, map);
  }
  std::vector<std::shared_ptr<DeviceMemory>> memory;
  for (const TensorArg* t : tensors)
    if (t->memory) memory.push_back(t->memory);
  return make_event(env, device, s, std::vector<ERL_NIF_TERM>(argv, argv + argc), map, std::move(memory));
}

}  // namespace exphil::nif
