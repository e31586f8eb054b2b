// ExPhil.Native.Buffer: NIF-owned device memory. Host copies (upload,
// download) go through the device's managed stream, so they are ordered
// after the ops enqueued there.
#include <cstring>
#include <limits>
#include <string>

#include "atoms.hpp"
#include "buffer_nifs.hpp"
#include "events.hpp"
#include "exphil/device.hpp"
#include "exphil/runtime.hpp"
#include "resources.hpp"
#include "tensor_args.hpp"
#include "terms.hpp"

namespace exphil::nif {

namespace {

// A buffer holds at least one element.
uint64_t buffer_bytes(DType dtype, const std::vector<int64_t>& shape, ERL_NIF_TERM shape_term) {
  for (int64_t d : shape)
    if (d == 0) bad_argument("shape", "a shape with at least one element", shape_term);
  return tensor_bytes(dtype, shape, "shape", shape_term);
}

int device_option(ErlNifEnv* env, ERL_NIF_TERM opts_term) {
  const Options opts(env, opts_term, {"device"});
  auto d = opts.get("device");
  return d ? static_cast<int>(get_integer(env, *d, "device", 0, std::numeric_limits<int>::max())) : 0;
}

BufferResource* buffer_argument(ErlNifEnv* env, ERL_NIF_TERM term) {
  BufferResource* b = get_buffer(env, term);
  if (!b || !enif_is_map(env, term)) bad_argument("buffer", "an ExPhil.Native.Buffer", term);
  return b;
}

}  // namespace

ERL_NIF_TERM allocate_nif(ErlNifEnv* env, int, const ERL_NIF_TERM argv[]) {
  return nif_entry(env, [&] {
    const DType dtype = get_type(env, argv[0], "type");
    const auto shape = get_shape(env, argv[1], "shape");
    const uint64_t bytes = buffer_bytes(dtype, shape, argv[1]);
    const int device = device_option(env, argv[2]);
    std::shared_ptr<DeviceMemory> memory;
    check(allocate_device_memory(device, bytes, memory));
    return make_ok(env, make_buffer(env, std::move(memory), argv[0], argv[1]));
  });
}

ERL_NIF_TERM upload_nif(ErlNifEnv* env, int, const ERL_NIF_TERM argv[]) {
  return nif_entry(env, [&] {
    ErlNifBinary data;
    if (!enif_inspect_binary(env, argv[0], &data)) bad_argument("data", "a binary", argv[0]);
    const DType dtype = get_type(env, argv[1], "type");
    const auto shape = get_shape(env, argv[2], "shape");
    const uint64_t bytes = buffer_bytes(dtype, shape, argv[2]);
    if (data.size != bytes)
      throw ArgumentError{"argument 'data': expected " + std::to_string(bytes) + " bytes (type " +
                          type_text(dtype) + " and shape " + shape_text(shape) + "), got " +
                          std::to_string(data.size)};
    const int device = device_option(env, argv[3]);
    std::shared_ptr<DeviceMemory> memory;
    check(allocate_device_memory(device, bytes, memory));
    // on the managed stream: after the ops enqueued there
    check(copy_and_wait(device, memory->data(), data.data, bytes, CopyDirection::host_to_device, nullptr));
    return make_ok(env, make_buffer(env, std::move(memory), argv[1], argv[2]));
  });
}

ERL_NIF_TERM download_nif(ErlNifEnv* env, int, const ERL_NIF_TERM argv[]) {
  return nif_entry(env, [&] {
    const TensorArg t = decode_tensor(env, argv[0], "buffer");
    const uint64_t bytes = t.bytes;
    int device = t.memory ? t.memory->device() : -1;
    if (!t.memory && bytes) {
      // Memory the NIF does not own (a :local pointer): the driver must
      // confirm it is device memory that holds the whole tensor.
      check(locate_device("buffer", t.desc.data, bytes, device));
    }
    ERL_NIF_TERM binary;
    unsigned char* out = enif_make_new_binary(env, bytes, &binary);
    if (!out) throw std::bad_alloc();
    if (bytes) check(copy_and_wait(device, out, t.desc.data, bytes, CopyDirection::device_to_host, nullptr));
    return make_ok(env, binary);
  });
}

ERL_NIF_TERM free_nif(ErlNifEnv* env, int, const ERL_NIF_TERM argv[]) {
  return nif_entry(env, [&] {
    BufferResource* b = buffer_argument(env, argv[0]);
    std::shared_ptr<DeviceMemory> released;
    {
      std::lock_guard<std::mutex> lock(b->mutex);
      if (!b->memory) return make_error(env, atoms().already_freed);
      released = std::move(b->memory);
    }
    // Dropping the last reference here frees now (device_free waits for the
    // GPU); calls or events still holding it free it when they finish.
    released.reset();
    return atoms().ok;
  });
}

ERL_NIF_TERM pointer_nif(ErlNifEnv* env, int, const ERL_NIF_TERM argv[]) {
  return nif_entry(env, [&] {
    buffer_argument(env, argv[0]);  // a Buffer struct only: no IPC import on a normal scheduler
    const TensorArg t = decode_tensor(env, argv[0], "buffer");
    const uint64_t bytes = t.bytes;
    const Atoms& a = atoms();
    return make_map(env, {{a.kind, a.local},
                          {a.address, enif_make_uint64(env, reinterpret_cast<uintptr_t>(t.memory->data()))},
                          {a.data_size, enif_make_uint64(env, bytes)}});
  });
}

ERL_NIF_TERM export_ipc_nif(ErlNifEnv* env, int, const ERL_NIF_TERM argv[]) {
  return nif_entry(env, [&] {
    buffer_argument(env, argv[0]);  // only memory the NIF allocated can be exported
    const TensorArg t = decode_tensor(env, argv[0], "buffer");
    if (t.memory->imported())
      throw ArgumentError{"argument 'buffer': an imported IPC buffer cannot be exported again; "
                          "pass on the handle it was imported from"};
    IpcHandle handle;
    if (const Status s = ipc_export(t.memory->device(), t.memory->data(), handle); !s.ok())
      return status_result(env, s);
    const uint64_t bytes = t.bytes;
    ERL_NIF_TERM handle_term;
    unsigned char* handle_bytes = enif_make_new_binary(env, sizeof handle.bytes, &handle_term);
    if (!handle_bytes) throw std::bad_alloc();
    std::memcpy(handle_bytes, handle.bytes, sizeof handle.bytes);
    const Atoms& a = atoms();
    return make_ok(env, make_map(env, {{a.kind, a.ipc}, {a.handle, handle_term},
                                       {a.data_size, enif_make_uint64(env, bytes)}}));
  });
}

ERL_NIF_TERM import_ipc_nif(ErlNifEnv* env, int, const ERL_NIF_TERM argv[]) {
  return nif_entry(env, [&] {
    const int device = device_option(env, argv[3]);
    auto kind = map_get(env, argv[0], atoms().kind);
    if (!kind || !enif_is_identical(*kind, atoms().ipc))
      bad_argument("pointer", "an :ipc pointer map (kind: :ipc, handle, data_size)", argv[0]);
    const ERL_NIF_TERM tensor = enif_make_tuple3(env, argv[0], argv[1], argv[2]);
    const TensorArg t = decode_tensor(env, tensor, "pointer", device);
    return make_ok(env, make_buffer(env, t.memory, argv[1], argv[2]));
  });
}

ERL_NIF_TERM open_ipc_handles_nif(ErlNifEnv* env, int, const ERL_NIF_TERM[]) {
  return nif_entry(env, [&] { return enif_make_uint64(env, open_ipc_imports()); });
}

ERL_NIF_TERM allocation_offset_nif(ErlNifEnv* env, int, const ERL_NIF_TERM argv[]) {
  return nif_entry(env, [&] {
    ErlNifUInt64 address = 0;
    if (!enif_get_uint64(env, argv[0], &address))
      bad_argument("address", "a non-negative 64-bit integer", argv[0]);
    PointerInfo info;
    check(pointer_info(reinterpret_cast<const void*>(static_cast<uintptr_t>(address)), info));
    if (info.kind != MemoryKind::device)
      throw ArgumentError{std::string("argument 'address': expected device memory, got ") +
                          memory_kind_name(info.kind) + " memory"};
    return make_ok(env, enif_make_uint64(env, address - reinterpret_cast<uintptr_t>(info.allocation)));
  });
}

}  // namespace exphil::nif
