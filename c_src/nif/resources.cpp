#include "resources.hpp"

#include <new>

#include "atoms.hpp"
#include "exphil/device.hpp"
#include "terms.hpp"

namespace exphil::nif {

namespace {

ErlNifResourceType* g_buffer_type = nullptr;
ErlNifResourceType* g_event_type = nullptr;
ErlNifResourceType* g_stream_type = nullptr;

void stream_destructor(ErlNifEnv*, void* object) {
  auto* s = static_cast<StreamResource*>(object);
  try {
    // Work still queued completes first; the driver releases the stream after.
    stream_destroy(s->device, s->stream);
    s->~StreamResource();
  } catch (...) {
  }
}

void buffer_destructor(ErlNifEnv*, void* object) {
  try {
    static_cast<BufferResource*>(object)->~BufferResource();
  } catch (...) {
  }
}

void event_destructor(ErlNifEnv*, void* object) {
  auto* ev = static_cast<EventResource*>(object);
  try {
    // Dropped before its work finished: wait, so that the NIF-owned or
    // imported memory it keeps alive outlives the GPU's use of it. An event
    // that holds no such memory (every tensor a :local pointer, whose owner
    // answers for it, as a stream-ordered allocator such as libtorch's does
    // on stream: :legacy_default) has nothing to protect, and is not waited
    // for: the garbage collector must not block on the GPU. Destroying a
    // pending event is allowed; the driver releases it after the work.
    if (ev->event) {
      if (!ev->done && !ev->memory.empty()) event_wait(ev->device, ev->event);
      event_destroy(ev->device, ev->event);
    }
    if (ev->keep) enif_free_env(ev->keep);
    ev->~EventResource();
  } catch (...) {
  }
}

}  // namespace

bool open_resource_types(ErlNifEnv* env, ErlNifResourceFlags flags) {
  g_buffer_type = enif_open_resource_type(env, nullptr, "exphil_buffer", buffer_destructor, flags, nullptr);
  g_event_type = enif_open_resource_type(env, nullptr, "exphil_event", event_destructor, flags, nullptr);
  g_stream_type = enif_open_resource_type(env, nullptr, "exphil_stream", stream_destructor, flags, nullptr);
  return g_buffer_type && g_event_type && g_stream_type;
}

ErlNifResourceType* buffer_resource_type() { return g_buffer_type; }
ErlNifResourceType* event_resource_type() { return g_event_type; }
ErlNifResourceType* stream_resource_type() { return g_stream_type; }

StreamResource* get_stream(ErlNifEnv* env, ERL_NIF_TERM term) {
  auto module = map_get(env, term, atoms().struct_);
  auto ref = map_get(env, term, atoms().ref);
  if (!module || !ref || !enif_is_identical(*module, atoms().stream_module)) return nullptr;
  void* res = nullptr;
  if (!enif_get_resource(env, *ref, g_stream_type, &res)) return nullptr;
  return static_cast<StreamResource*>(res);
}

ERL_NIF_TERM make_buffer(ErlNifEnv* env, std::shared_ptr<DeviceMemory> memory, ERL_NIF_TERM type,
                         ERL_NIF_TERM shape) {
  void* raw = enif_alloc_resource(g_buffer_type, sizeof(BufferResource));
  if (!raw) throw std::bad_alloc();
  auto* res = new (raw) BufferResource();
  const int device = memory->device();
  res->memory = std::move(memory);
  const ERL_NIF_TERM ref = enif_make_resource(env, res);
  enif_release_resource(res);  // the term owns it now
  const Atoms& a = atoms();
  return make_map(env, {{a.struct_, a.buffer_module}, {a.ref, ref}, {a.type, type}, {a.shape, shape},
                        {a.device, enif_make_int(env, device)}});
}

BufferResource* get_buffer(ErlNifEnv* env, ERL_NIF_TERM term) {
  if (auto module = map_get(env, term, atoms().struct_)) {
    if (!enif_is_identical(*module, atoms().buffer_module)) return nullptr;
    auto ref = map_get(env, term, atoms().ref);
    if (!ref) return nullptr;
    term = *ref;
  }
  void* res = nullptr;
  if (!enif_get_resource(env, term, g_buffer_type, &res)) return nullptr;
  return static_cast<BufferResource*>(res);
}

}  // namespace exphil::nif
