#include "op_inputs.hpp"

#include <cctype>

#include "atoms.hpp"
#include "call_options.hpp"

namespace exphil::nif {

namespace {

std::string lower(std::string s) {
  for (char& c : s) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return s;
}

// How many of the description's inputs are arguments: up to the last
// required one.
std::size_t argument_count(const OpDescription& d) {
  std::size_t count = 0, index = 0;
  for (const TensorDescription& t : d.tensors) {
    if (t.output) continue;
    ++index;
    if (!t.optional) count = index;
  }
  return count;
}

}  // namespace

const TensorArg* OpArguments::arg(const std::string& name) const {
  for (const auto& [n, t] : inputs_)
    if (n == name) return t ? &*t : nullptr;
  return nullptr;
}

const Tensor* OpArguments::get(const std::string& name) const {
  const TensorArg* t = arg(name);
  return t ? &t->desc : nullptr;
}

std::vector<const TensorArg*> OpArguments::all() const {
  std::vector<const TensorArg*> given;
  for (const auto& [n, t] : inputs_)
    if (t) given.push_back(&*t);
  return given;
}

std::map<std::string, const TensorArg*> OpArguments::by_name() const {
  std::map<std::string, const TensorArg*> named;
  for (const auto& [n, t] : inputs_) named[n] = t ? &*t : nullptr;
  return named;
}

OpArguments decode_arguments(ErlNifEnv* env, const OpDescription& description, const ERL_NIF_TERM argv[],
                             const std::vector<const char*>& op_options,
                             const std::vector<const char*>& call_options) {
  const std::size_t arguments = argument_count(description);
  std::vector<std::string> keys;  // the optional inputs that are options
  std::size_t index = 0;
  for (const TensorDescription& t : description.tensors)
    if (!t.output && ++index > arguments) keys.push_back(lower(t.name));
  std::vector<const char*> accepted;
  for (const std::string& k : keys) accepted.push_back(k.c_str());
  accepted.insert(accepted.end(), op_options.begin(), op_options.end());
  accepted.insert(accepted.end(), call_options.begin(), call_options.end());

  OpArguments out;
  out.opts_.emplace(env, argv[arguments], accepted);
  index = 0;
  bool first = true;
  for (const TensorDescription& t : description.tensors) {
    if (t.output) continue;
    const std::string key = lower(t.name);
    std::optional<ERL_NIF_TERM> term;
    if (index < arguments) {
      term = argv[index];
      if (t.optional && enif_is_identical(*term, atoms().nil)) term.reset();
    } else if (auto given = out.opts_->get(key.c_str()); given && !enif_is_identical(*given, atoms().nil)) {
      term = given;
    }
    ++index;
    if (!term) {
      out.inputs_.emplace_back(t.name, std::nullopt);
      continue;
    }
    // The first input is decoded before the device is known (an IPC handle
    // of it opens on device 0); the call runs where it lies.
    out.inputs_.emplace_back(t.name, decode_tensor(env, *term, key, first ? 0 : out.device_));
    if (first) out.device_ = call_device(*out.inputs_.back().second);
    first = false;
  }
  return out;
}

}  // namespace exphil::nif
