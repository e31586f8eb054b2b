#include "op_outputs.hpp"

#include <string>

#include "device_memory.hpp"
#include "resources.hpp"

namespace exphil::nif {

std::optional<ERL_NIF_TERM> given_output(const Options& outputs, const char* name, bool required) {
  auto term = outputs.get(name);
  if (!term && required)
    throw ArgumentError{"argument 'outputs': expected a tensor for :" + std::string(name) +
                        " (destination passing gives every required output), got none"};
  return term;
}

void no_output_given(const std::vector<const char*>& names, ERL_NIF_TERM outputs) {
  std::string listed;
  for (const char* name : names) listed += (listed.empty() ? ":" : ", :") + std::string(name);
  bad_argument("outputs", "at least one output among " + listed, outputs);
}

Tensor unallocated(DType dtype, const std::vector<int64_t>& shape) {
  Tensor t{};  // data NULL
  t.dtype = static_cast<int32_t>(dtype);
  t.rank = static_cast<int32_t>(shape.size());  // validation refuses a rank over the maximum
  for (std::size_t i = 0; i < shape.size() && i < EXPHIL_MAX_RANK; ++i) t.shape[i] = shape[i];
  return t;
}

AllocatedOutput allocate_output(ErlNifEnv* env, const char* name, DType dtype, const std::vector<int64_t>& shape,
                                int device) {
  const ERL_NIF_TERM shape_term = make_shape(env, shape);
  TensorArg t;
  t.dtype = dtype;
  t.shape = shape;
  t.bytes = tensor_bytes(dtype, shape, name, shape_term);
  check(allocate_device_memory(device, t.bytes, t.memory));
  t.desc.data = t.memory->data();
  t.desc.dtype = static_cast<int32_t>(dtype);
  t.desc.rank = static_cast<int32_t>(shape.size());
  for (std::size_t i = 0; i < shape.size(); ++i) t.desc.shape[i] = shape[i];
  const ERL_NIF_TERM buffer = make_buffer(env, t.memory, make_type(env, dtype), shape_term);
  return {std::move(t), buffer};
}

}  // namespace exphil::nif
