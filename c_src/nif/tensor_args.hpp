// Tensor arguments of the NIF: {pointer, type, shape}, where pointer is any
// map with the fields of %Nx.Pointer{} (kind: :local with address, or kind:
// :ipc with a 64-byte handle; data_size in both) or an
// ExPhil.Native.Buffer; or a Buffer on its own (its type and shape).
#pragma once

#include <memory>
#include <string>
#include <vector>

#include <erl_nif.h>

#include "device_memory.hpp"
#include "exphil/tensor.hpp"

namespace exphil::nif {

struct TensorArg {
  Tensor desc{};
  DType dtype = DType::f32;
  std::vector<int64_t> shape;
  // NIF-owned or imported memory the tensor lies in (null for a :local
  // pointer, which its owner keeps alive).
  std::shared_ptr<DeviceMemory> memory;
};

// Raises ArgumentError (through nif_entry) on anything malformed, naming
// `argument`. IPC handles are imported on `device`.
TensorArg decode_tensor(ErlNifEnv* env, ERL_NIF_TERM term, const std::string& argument,
                        int device = 0);

// The device a tensor's memory is on, when the NIF can tell without the
// driver (NIF-owned and imported memory); -1 otherwise.
int known_device(const TensorArg& t);

}  // namespace exphil::nif
