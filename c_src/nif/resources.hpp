// The NIF's resource types: ExPhil.Native.Buffer's device memory, and
// ExPhil.Native.Event's pending work. Registered at load and taken over at
// upgrade; destructors never throw and never let a fault reach the VM.
#pragma once

#include <memory>
#include <mutex>
#include <vector>

#include <erl_nif.h>

#include "device_memory.hpp"
#include "exphil/device.hpp"
#include "exphil/tensor.hpp"

namespace exphil::nif {

struct BufferResource {
  std::mutex mutex;
  std::shared_ptr<DeviceMemory> memory;  // null once freed
};

// Work enqueued by an op called with sync: false. `keep` is an environment
// holding copies of the call's arguments and outputs, so nothing they
// reference is collected while the GPU may still use it; `memory` holds the
// NIF-owned and imported memory the call uses. Collected before the work is
// done, the event waits for it only when `memory` is not empty.
struct EventResource {
  std::mutex mutex;
  Event event = nullptr;
  int device = 0;
  ErlNifEnv* keep = nullptr;
  ERL_NIF_TERM outputs = 0;  // in `keep`
  std::vector<std::shared_ptr<DeviceMemory>> memory;
  bool done = false;
};

// A CUDA stream created for Elixir (ExPhil.Native.new_stream/1). Ops take it
// as `stream:`; raw addresses are never accepted, since a wrong one would be
// dereferenced by the driver.
struct StreamResource {
  Stream stream = nullptr;
  int device = 0;
};

bool open_resource_types(ErlNifEnv* env, ErlNifResourceFlags flags);

ErlNifResourceType* buffer_resource_type();
ErlNifResourceType* event_resource_type();
ErlNifResourceType* stream_resource_type();

// A new resource holding `memory`, as the term of an ExPhil.Native.Buffer
// struct with the given type and shape.
ERL_NIF_TERM make_buffer(ErlNifEnv* env, std::shared_ptr<DeviceMemory> memory, ERL_NIF_TERM type,
                         ERL_NIF_TERM shape);

// The resource of an ExPhil.Native.Stream struct, or null.
StreamResource* get_stream(ErlNifEnv* env, ERL_NIF_TERM term);

// The resource of an ExPhil.Native.Buffer struct (or of its bare
// reference), or null if the term is neither.
BufferResource* get_buffer(ErlNifEnv* env, ERL_NIF_TERM term);

}  // namespace exphil::nif
