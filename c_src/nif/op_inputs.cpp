#include "op_inputs.hpp"

#include "atoms.hpp"
#include "call_options.hpp"

namespace exphil::nif {

const TensorArg* OpArguments::arg(const std::string& name) const {
  for (const Input& in : inputs_)
    if (in.description->name == name) return in.tensor ? &*in.tensor : nullptr;
  return nullptr;
}

const Tensor* OpArguments::get(const std::string& name) const {
  const TensorArg* t = arg(name);
  return t ? &t->desc : nullptr;
}

std::vector<const TensorArg*> OpArguments::all() const {
  std::vector<const TensorArg*> given;
  given.reserve(inputs_.size());
  for (const Input& in : inputs_)
    if (in.tensor) given.push_back(&*in.tensor);
  return given;
}

OpArguments decode_arguments(ErlNifEnv* env, const OpDescription& description, const ERL_NIF_TERM argv[],
                             const std::vector<const char*>& op_options,
                             const std::vector<const char*>& call_options) {
  const std::size_t arguments = description.leading_inputs;
  std::vector<const char*> accepted;
  accepted.reserve(description.tensors.size() + op_options.size() + call_options.size());
  std::size_t index = 0;
  for (const TensorDescription& t : description.tensors)
    if (!t.output && ++index > arguments) accepted.push_back(t.key.c_str());
  accepted.insert(accepted.end(), op_options.begin(), op_options.end());
  accepted.insert(accepted.end(), call_options.begin(), call_options.end());

  OpArguments out;
  out.opts_.emplace(env, argv[arguments], std::move(accepted));
  out.inputs_.reserve(description.tensors.size());
  index = 0;
  bool first = true;
  for (const TensorDescription& t : description.tensors) {
    if (t.output) continue;
    std::optional<ERL_NIF_TERM> term;
    if (index < arguments) {
      term = argv[index];
      if (t.optional && enif_is_identical(*term, atoms().nil)) term.reset();
    } else if (auto given = out.opts_->get(t.key.c_str()); given && !enif_is_identical(*given, atoms().nil)) {
      term = given;
    }
    ++index;
    if (!term) {
      out.inputs_.push_back({&t, std::nullopt});
      continue;
    }
    // The first input is decoded before the device is known (an IPC handle
    // of it opens on device 0); the call runs where it lies.
    out.inputs_.push_back({&t, decode_tensor(env, *term, t.key, first ? 0 : out.device_)});
    if (first) out.device_ = call_device(*out.inputs_.back().tensor);
    first = false;
  }
  return out;
}

}  // namespace exphil::nif
