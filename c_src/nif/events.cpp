#include "events.hpp"

#include <new>

#include "atoms.hpp"
#include "exphil/device.hpp"
#include "resources.hpp"
#include "terms.hpp"

namespace exphil::nif {

ERL_NIF_TERM make_event(ErlNifEnv* env, int device, Stream stream,
                        const std::vector<ERL_NIF_TERM>& keep_terms, ERL_NIF_TERM outputs,
                        std::vector<std::shared_ptr<DeviceMemory>> memory) {
  void* raw = enif_alloc_resource(event_resource_type(), sizeof(EventResource));
  if (!raw) throw std::bad_alloc();
  auto* ev = new (raw) EventResource();
  // From here the resource's destructor cleans up whatever was set.
  const ERL_NIF_TERM ref = enif_make_resource(env, ev);
  enif_release_resource(ev);
  ev->device = device;
  ev->memory = std::move(memory);
  ev->keep = enif_alloc_env();
  if (!ev->keep) throw std::bad_alloc();
  std::vector<ERL_NIF_TERM> kept;
  for (ERL_NIF_TERM t : keep_terms) kept.push_back(enif_make_copy(ev->keep, t));
  enif_make_list_from_array(ev->keep, kept.data(), static_cast<unsigned>(kept.size()));
  ev->outputs = enif_make_copy(ev->keep, outputs);
  check(event_record(device, stream, ev->event));

  return make_ok(env, make_map(env, {{atoms().struct_, atoms().event_module}, {atoms().ref, ref}}));
}

ERL_NIF_TERM await_event(ErlNifEnv* env, ERL_NIF_TERM term) {
  ERL_NIF_TERM ref = term;
  if (auto module = map_get(env, term, atoms().struct_)) {
    auto r = map_get(env, term, atoms().ref);
    if (!enif_is_identical(*module, atoms().event_module) || !r)
      bad_argument("event", "an ExPhil.Native.Event", term);
    ref = *r;
  }
  void* raw = nullptr;
  if (!enif_get_resource(env, ref, event_resource_type(), &raw))
    bad_argument("event", "an ExPhil.Native.Event", term);
  auto* ev = static_cast<EventResource*>(raw);
  std::lock_guard<std::mutex> lock(ev->mutex);
  if (!ev->done) {
    if (const Status s = event_wait(ev->device, ev->event); !s.ok()) return status_result(env, s);
    ev->done = true;
    ev->memory.clear();  // the work is done; the output terms keep their buffers
  }
  return make_ok(env, enif_make_copy(env, ev->outputs));
}

}  // namespace exphil::nif
