#include "tensor_args.hpp"

#include <limits>

#include "atoms.hpp"
#include "resources.hpp"
#include "terms.hpp"

namespace exphil::nif {

namespace {

constexpr std::size_t kIpcHandleBytes = 64;

std::shared_ptr<DeviceMemory> live_memory(BufferResource* buffer, const std::string& argument) {
  std::lock_guard<std::mutex> lock(buffer->mutex);
  if (!buffer->memory)
    throw ArgumentError{"argument '" + argument + "': the ExPhil.Native.Buffer was freed"};
  return buffer->memory;
}

// A Buffer struct on its own: its memory with its recorded type and shape.
TensorArg from_buffer_struct(ErlNifEnv* env, ERL_NIF_TERM term, BufferResource* buffer,
                             const std::string& argument) {
  TensorArg t;
  auto type = map_get(env, term, atoms().type);
  auto shape = map_get(env, term, atoms().shape);
  if (!type || !shape) bad_argument(argument, "an ExPhil.Native.Buffer with :type and :shape", term);
  t.dtype = get_type(env, *type, argument);
  t.shape = get_shape(env, *shape, argument);
  t.memory = live_memory(buffer, argument);
  t.bytes = tensor_bytes(t.dtype, t.shape, argument, term);
  if (t.bytes > t.memory->bytes())
    bad_argument(argument, "a type and shape that fit the buffer's " + std::to_string(t.memory->bytes()) + " bytes", term);
  return t;
}

}  // namespace

uint64_t tensor_bytes(DType dtype, const std::vector<int64_t>& shape, const std::string& argument,
                      ERL_NIF_TERM term) {
  uint64_t bytes = dtype_size(dtype);
  for (int64_t d : shape) {
    if (d != 0 && bytes > std::numeric_limits<int64_t>::max() / static_cast<uint64_t>(d))
      bad_argument(argument, "a shape of fewer than 2^63 bytes", term);
    bytes *= static_cast<uint64_t>(d);
  }
  return bytes;
}

TensorArg decode_tensor(ErlNifEnv* env, ERL_NIF_TERM term, const std::string& argument, int device) {
  const Atoms& a = atoms();
  TensorArg t;
  if (BufferResource* buffer = get_buffer(env, term)) {
    if (!enif_is_map(env, term)) bad_argument(argument, "a tensor {pointer, type, shape} or an ExPhil.Native.Buffer", term);
    t = from_buffer_struct(env, term, buffer, argument);
  } else {
    const ERL_NIF_TERM* items = nullptr;
    int arity = 0;
    if (!enif_get_tuple(env, term, &arity, &items) || arity != 3)
      bad_argument(argument, "a tensor {pointer, type, shape} or an ExPhil.Native.Buffer", term);
    t.dtype = get_type(env, items[1], argument);
    t.shape = get_shape(env, items[2], argument);
    const uint64_t bytes = t.bytes = tensor_bytes(t.dtype, t.shape, argument, term);
    const ERL_NIF_TERM pointer = items[0];
    if (BufferResource* pointed = get_buffer(env, pointer)) {
      t.memory = live_memory(pointed, argument);
      if (bytes > t.memory->bytes())
        bad_argument(argument, "a type and shape of at most the buffer's " + std::to_string(t.memory->bytes()) +
                                   " bytes (" + std::to_string(bytes) + " asked)", term);
    } else {
      const std::string what = "a pointer map with :kind (:local or :ipc) and :data_size";
      auto kind = map_get(env, pointer, a.kind);
      auto size_term = map_get(env, pointer, a.data_size);
      if (!kind || !size_term) bad_argument(argument, what, pointer);
      const int64_t data_size =
          get_integer(env, *size_term, argument, 0, std::numeric_limits<int64_t>::max());
      if (static_cast<uint64_t>(data_size) != bytes)
        throw ArgumentError{"argument '" + argument + "': expected data_size " + std::to_string(bytes) +
                            " (type " + type_text(t.dtype) + " and shape " + shape_text(t.shape) +
                            "), got " + std::to_string(data_size)};
      if (enif_is_identical(*kind, a.local)) {
        auto address = map_get(env, pointer, a.address);
        if (!address) bad_argument(argument, "a :local pointer map with :address", pointer);
        ErlNifUInt64 value = 0;
        if (!enif_get_uint64(env, *address, &value))
          bad_argument(argument, "an :address that is a non-negative 64-bit integer", *address);
        t.desc.data = reinterpret_cast<void*>(static_cast<uintptr_t>(value));
      } else if (enif_is_identical(*kind, a.ipc)) {
        auto handle = map_get(env, pointer, a.handle);
        ErlNifBinary bin;
        if (!handle || !enif_inspect_binary(env, *handle, &bin) || bin.size != kIpcHandleBytes)
          bad_argument(argument, "an :ipc pointer map with a 64-byte :handle", pointer);
        // :offset (optional): where the tensor starts in the allocation the
        // handle names (ExPhil.Native.allocation_offset/1 in the exporter).
        uint64_t offset = 0;
        if (auto offset_term = map_get(env, pointer, a.offset))
          offset = static_cast<uint64_t>(
              get_integer(env, *offset_term, argument, 0, std::numeric_limits<int64_t>::max()));
        std::shared_ptr<DeviceMemory> memory;
        check(import_ipc_memory(std::string(reinterpret_cast<const char*>(bin.data), bin.size), device,
                                memory));
        if (offset > memory->bytes() || bytes > memory->bytes() - offset)
          throw ArgumentError{"argument '" + argument + "': the IPC allocation holds " +
                              std::to_string(memory->bytes()) + " bytes, fewer than data_size " +
                              std::to_string(bytes) + " from offset " + std::to_string(offset)};
        t.memory = offset ? memory_view(std::move(memory), offset) : std::move(memory);
      } else {
        bad_argument(argument, "pointer :kind :local or :ipc", *kind);
      }
    }
  }
  if (t.memory) t.desc.data = t.memory->data();
  t.desc.dtype = static_cast<int32_t>(t.dtype);
  t.desc.rank = static_cast<int32_t>(t.shape.size());
  for (std::size_t i = 0; i < t.shape.size(); ++i) t.desc.shape[i] = t.shape[i];
  return t;
}

int known_device(const TensorArg& t) { return t.memory ? t.memory->device() : -1; }

}  // namespace exphil::nif
