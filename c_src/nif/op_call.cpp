#include "op_call.hpp"

#include <memory>

#include "device_memory.hpp"
#include "events.hpp"
#include "exphil/device.hpp"

namespace exphil::nif {

ERL_NIF_TERM answer_call(ErlNifEnv* env, int argc, const ERL_NIF_TERM argv[], int device, Stream stream, bool sync,
                         ERL_NIF_TERM map, const std::vector<const TensorArg*>& tensors) {
  Stream s = stream;
  if (!s) check(managed_stream(device, s));
  if (sync) {
    check(stream_wait(device, s));
    return make_ok(env, map);
  }
  std::vector<std::shared_ptr<DeviceMemory>> memory;
  for (const TensorArg* t : tensors)
    if (t->memory) memory.push_back(t->memory);
  return make_event(env, device, s, std::vector<ERL_NIF_TERM>(argv, argv + argc), map, std::move(memory));
}

}  // namespace exphil::nif
