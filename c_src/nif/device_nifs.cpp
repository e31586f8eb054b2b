// device_count/0, device_info/1, synchronize/0,1 and await/1.
#include <limits>
#include <new>

#include "atoms.hpp"
#include "device_nifs.hpp"
#include "events.hpp"
#include "exphil/device.hpp"
#include "exphil/runtime.hpp"
#include "resources.hpp"
#include "terms.hpp"

namespace exphil::nif {

namespace {

int device_argument(ErlNifEnv* env, ERL_NIF_TERM term) {
  const int device = static_cast<int>(get_integer(env, term, "device", 0, std::numeric_limits<int>::max()));
  check(require_device(device));
  return device;
}

}  // namespace

ERL_NIF_TERM device_count_nif(ErlNifEnv* env, int, const ERL_NIF_TERM[]) {
  return nif_entry(env, [&] {
    int count = 0;
    check(device_count(count));
    return enif_make_int(env, count);
  });
}

ERL_NIF_TERM device_info_nif(ErlNifEnv* env, int, const ERL_NIF_TERM argv[]) {
  return nif_entry(env, [&] {
    const int device = device_argument(env, argv[0]);
    DeviceInfo info;
    if (const Status s = exphil::device_info(device, info); !s.ok()) return status_result(env, s);
    const Atoms& a = atoms();
    return make_ok(env, make_map(env, {{a.name, make_string(env, info.name)},
                                       {a.total_memory, enif_make_uint64(env, info.total_memory)},
                                       {a.free_memory, enif_make_uint64(env, info.free_memory)},
                                       {a.compute_capability, enif_make_tuple2(env, enif_make_int(env, info.major),
                                                                               enif_make_int(env, info.minor))},
                                       {a.multiprocessor_count, enif_make_int(env, info.multiprocessors)}}));
  });
}

ERL_NIF_TERM memory_held_nif(ErlNifEnv* env, int, const ERL_NIF_TERM argv[]) {
  return nif_entry(env, [&] {
    MemoryHeld held;
    check(memory_held(device_argument(env, argv[0]), held));
    const Atoms& a = atoms();
    return make_ok(env, make_map(env, {{a.workspace_reserved, enif_make_uint64(env, held.workspace_reserved)},
                                       {a.workspace_in_use, enif_make_uint64(env, held.workspace_in_use)},
                                       {a.capture_blocks, enif_make_uint64(env, held.capture_blocks)}}));
  });
}

ERL_NIF_TERM synchronize_all_nif(ErlNifEnv* env, int, const ERL_NIF_TERM[]) {
  return nif_entry(env, [&] {
    int count = 0;
    check(device_count(count));
    if (count == 0) return make_error(env, atoms().no_cuda_device);
    for (int d = 0; d < count; ++d) check(device_synchronize(d));
    return atoms().ok;
  });
}

ERL_NIF_TERM synchronize_nif(ErlNifEnv* env, int, const ERL_NIF_TERM argv[]) {
  return nif_entry(env, [&] {
    check(device_synchronize(device_argument(env, argv[0])));
    return atoms().ok;
  });
}

ERL_NIF_TERM new_stream_nif(ErlNifEnv* env, int, const ERL_NIF_TERM argv[]) {
  return nif_entry(env, [&] {
    const Options opts(env, argv[0], {"device"});
    const int device = device_argument(env, opts.get("device").value_or(enif_make_int(env, 0)));
    Stream stream = nullptr;
    if (const Status s = stream_create(device, stream); !s.ok()) return status_result(env, s);
    void* raw = enif_alloc_resource(stream_resource_type(), sizeof(StreamResource));
    if (!raw) {
      stream_destroy(device, stream);
      throw std::bad_alloc();
    }
    auto* res = new (raw) StreamResource{stream, device};
    const ERL_NIF_TERM ref = enif_make_resource(env, res);
    enif_release_resource(res);
    const Atoms& a = atoms();
    return make_ok(env, make_map(env, {{a.struct_, a.stream_module}, {a.ref, ref},
                                       {a.device, enif_make_int(env, device)}}));
  });
}

ERL_NIF_TERM await_nif(ErlNifEnv* env, int, const ERL_NIF_TERM argv[]) {
  return nif_entry(env, [&] { return await_event(env, argv[0]); });
}

}  // namespace exphil::nif
