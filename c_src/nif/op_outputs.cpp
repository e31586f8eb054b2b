#include "op_outputs.hpp"

#include <cctype>
#include <string>

#include "atoms.hpp"
#include "device_memory.hpp"
#include "resources.hpp"

namespace exphil::nif {

namespace {

std::string lower(std::string s) {
  for (char& c : s) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return s;
}

// A 4-dimensional tensor's dimension names in layout bthd: the middle two swapped.
std::vector<std::string> laid_out(std::vector<std::string> dims, bool bthd) {
  if (bthd && dims.size() == 4) std::swap(dims[1], dims[2]);
  return dims;
}

std::string layout_text(const std::vector<std::string>& dims) {
  std::string s = "[";
  for (std::size_t i = 0; i < dims.size(); ++i) s += (i ? ", " : "") + dims[i];
  return s + "]";
}

// A descriptor of dtype and shape without memory, for can_implement.
Tensor unallocated(DType dtype, const std::vector<int64_t>& shape) {
  Tensor t{};  // data NULL
  t.dtype = static_cast<int32_t>(dtype);
  t.rank = static_cast<int32_t>(shape.size());  // validation refuses a rank over the maximum
  for (std::size_t i = 0; i < shape.size() && i < EXPHIL_MAX_RANK; ++i) t.shape[i] = shape[i];
  return t;
}

}  // namespace

const OpDescription& description_of(const char* op, const char* direction) {
  if (const OpDescription* d = find_op_description(op, direction)) return *d;
  throw Failure{Status(StatusCode::internal, std::string("no description of ") + op + " " + direction)};
}

std::vector<OutputPlan> plan_outputs(const OpDescription& description,
                                     const std::map<std::string, const TensorArg*>& inputs, DType seq,
                                     DType state, bool bthd) {
  std::map<std::string, int64_t> extents;
  for (const TensorDescription& t : description.tensors) {
    if (t.output) continue;
    auto it = inputs.find(t.name);
    if (it == inputs.end() || !it->second) continue;
    const std::vector<std::string> dims = laid_out(t.dims, bthd);
    bool sets_one = false;
    for (const std::string& d : dims) sets_one = sets_one || extents.count(d) == 0;
    if (!sets_one) continue;
    const TensorArg& arg = *it->second;
    if (arg.shape.size() != dims.size())
      throw ArgumentError{"argument '" + lower(t.name) + "': expected rank " + std::to_string(dims.size()) + " " +
                          layout_text(dims) + ", got shape " + shape_text(arg.shape)};
    for (std::size_t i = 0; i < dims.size(); ++i) extents.emplace(dims[i], arg.shape[i]);
  }

  std::vector<OutputPlan> plans;
  for (const TensorDescription& t : description.tensors) {
    if (!t.output) continue;
    OutputPlan p;
    p.name = t.name;
    p.key = lower(t.name);
    p.dtype = t.dtype == TensorDescription::DTypeRule::seq     ? seq
              : t.dtype == TensorDescription::DTypeRule::state ? state
                                                               : DType::f32;
    for (const std::string& d : laid_out(t.dims, bthd)) {
      auto e = extents.find(d);
      if (e == extents.end())
        throw Failure{Status(StatusCode::internal, "output '" + t.name + "': no input sets dimension " + d)};
      p.shape.push_back(e->second);
    }
    p.required = !t.optional;
    if (!t.only_with.empty()) {
      auto it = inputs.find(t.only_with);
      p.exists = it != inputs.end() && it->second != nullptr;
    }
    plans.push_back(std::move(p));
  }
  return plans;
}

const Tensor* Outputs::get(const std::string& name) const {
  for (std::size_t i = 0; i < plans_.size(); ++i)
    if (plans_[i].name == name) return &tensors_[i].desc;
  return nullptr;
}

void Outputs::allocate(ErlNifEnv* env, int device) {
  for (std::size_t i = 0; i < plans_.size(); ++i) {
    AllocatedOutput allocated = allocate_output(env, plans_[i].key.c_str(), plans_[i].dtype, plans_[i].shape, device);
    tensors_[i] = std::move(allocated.tensor);
    terms_[i] = allocated.buffer;
  }
}

ERL_NIF_TERM Outputs::result_map(ErlNifEnv* env) const {
  std::vector<ERL_NIF_TERM> keys;
  for (const OutputPlan& p : plans_) keys.push_back(atom(env, p.key.c_str()));
  return make_map(env, keys, terms_);
}

Outputs resolve_outputs(ErlNifEnv* env, const Options& opts, std::vector<OutputPlan> plans, int device) {
  Outputs out;
  if (auto given = opts.get("outputs")) {
    out.given_ = true;
    std::vector<const char*> names;
    for (const OutputPlan& p : plans) names.push_back(p.key.c_str());
    const Options outputs(env, *given, names, "outputs", "output");
    for (OutputPlan& p : plans) {
      auto term = outputs.get(p.key.c_str());
      if (!term) {
        if (p.required)
          throw ArgumentError{"argument 'outputs': expected a tensor for :" + p.key +
                              " (destination passing gives every required output), got none"};
        continue;
      }
      out.tensors_.push_back(decode_tensor(env, *term, p.key, device));
      out.terms_.push_back(*term);
      out.plans_.push_back(std::move(p));
    }
    if (out.plans_.empty()) {
      std::string listed;
      for (const char* name : names) listed += (listed.empty() ? ":" : ", :") + std::string(name);
      bad_argument("outputs", "at least one output among " + listed, *given);
    }
    return out;
  }
  for (OutputPlan& p : plans) {
    if (!p.exists) continue;
    TensorArg described;
    described.desc = unallocated(p.dtype, p.shape);
    described.dtype = p.dtype;
    described.shape = p.shape;
    out.tensors_.push_back(std::move(described));
    out.terms_.push_back(0);
    out.plans_.push_back(std::move(p));
  }
  return out;
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
