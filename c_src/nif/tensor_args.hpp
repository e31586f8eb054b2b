// Tensor arguments of the NIF: {pointer, type, shape}, where pointer is any
// map with the fields of %Nx.Pointer{} (kind: :local with address, or kind:
// :ipc with a 64-byte handle; data_size in both) or an
// ExPhil.Native.Buffer; or a Buffer on its own (its type and shape).
#pragma once

#include <cstdint>
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
  uint64_t bytes = 0;  // of dtype and shape
  // NIF-owned or imported memory the tensor lies in (null for a :local
  // pointer, which its owner keeps alive).
  std::shared_ptr<DeviceMemory> memory;
};

// Bytes of a tensor of `dtype` and `shape`; raises ArgumentError naming
// `argument` (and showing `term`) at 2^63 bytes or more.
uint64_t tensor_bytes(DType dtype, const std::vector<int64_t>& shape, const std::string& argument,
                      ERL_NIF_TERM term);

// Raises ArgumentError (through nif_entry) on anything malformed, naming
// `argument`. IPC handles are imported on `device`.
TensorArg decode_tensor(ErlNifEnv* env, ERL_NIF_TERM term, const std::string& argument,
                        int device = 0);

// The device a tensor's memory is on, when the NIF can tell without the
// driver (NIF-owned and imported memory); -1 otherwise.
int known_device(const TensorArg& t);

}  // namespace exphil::nif
