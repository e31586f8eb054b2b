// device_count/0, device_info/1, synchronize/0,1 and await/1.
#include <limits>
#include <new>

#include <cuda_runtime_api.h>

#include "../cuda_status.hpp"
#include "../device_registry.hpp"
#include "atoms.hpp"
#include "device_nifs.hpp"
#include "events.hpp"
#include "exphil/runtime.hpp"
#include "resources.hpp"
#include "terms.hpp"

namespace exphil::nif {

namespace {

int device_argument(ErlNifEnv* env, ERL_NIF_TERM term) {
  const int device = static_cast<int>(get_integer(env, term, "device", 0, std::numeric_limits<int>::max()));
  check(runtime::DeviceRegistry::instance().require_device(device));
  return device;
}

Status synchronize_device(int device) {
  runtime::ScopedDevice scoped;
  EXPHIL_RETURN_IF_ERROR(scoped.enter(device));
  const cudaError_t e = cudaDeviceSynchronize();
  if (e != cudaSuccess) return runtime::cuda_status(e, "cudaDeviceSynchronize");
  return {};
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
    cudaDeviceProp prop{};
    cudaError_t e = cudaGetDeviceProperties(&prop, device);
    if (e != cudaSuccess) return status_result(env, runtime::cuda_status(e, "cudaGetDeviceProperties"));
    runtime::ScopedDevice scoped;
    check(scoped.enter(device));
    size_t free_bytes = 0, total_bytes = 0;
    e = cudaMemGetInfo(&free_bytes, &total_bytes);
    if (e != cudaSuccess) return status_result(env, runtime::cuda_status(e, "cudaMemGetInfo"));
    const Atoms& a = atoms();
    return make_ok(env, make_map(env, {{a.name, make_string(env, prop.name)},
                                       {a.total_memory, enif_make_uint64(env, total_bytes)},
                                       {a.free_memory, enif_make_uint64(env, free_bytes)},
                                       {a.compute_capability, enif_make_tuple2(env, enif_make_int(env, prop.major),
                                                                               enif_make_int(env, prop.minor))},
                                       {a.multiprocessor_count, enif_make_int(env, prop.multiProcessorCount)}}));
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
    for (int d = 0; d < count; ++d) check(synchronize_device(d));
    return atoms().ok;
  });
}

ERL_NIF_TERM synchronize_nif(ErlNifEnv* env, int, const ERL_NIF_TERM argv[]) {
  return nif_entry(env, [&] {
    check(synchronize_device(device_argument(env, argv[0])));
    return atoms().ok;
  });
}

ERL_NIF_TERM new_stream_nif(ErlNifEnv* env, int, const ERL_NIF_TERM argv[]) {
  return nif_entry(env, [&] {
    const Options opts(env, argv[0], {"device"});
    const int device = device_argument(env, opts.get("device").value_or(enif_make_int(env, 0)));
    runtime::ScopedDevice scoped;
    check(scoped.enter(device));
    cudaStream_t stream = nullptr;
    const cudaError_t e = cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking);
    if (e != cudaSuccess) return status_result(env, runtime::cuda_status(e, "cudaStreamCreateWithFlags"));
    void* raw = enif_alloc_resource(stream_resource_type(), sizeof(StreamResource));
    if (!raw) {
      cudaStreamDestroy(stream);
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
