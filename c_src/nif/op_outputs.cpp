#include "op_outputs.hpp"

#include <string>
#include <utility>

#include "atoms.hpp"
#include "device_memory.hpp"
#include "resources.hpp"

namespace exphil::nif {

namespace {

// The dimension names of a tensor as laid out: bthd swaps the middle two of
// a 4-dimensional one.
const std::string& dimension(const TensorDescription& t, std::size_t i, bool bthd) {
  if (bthd && t.dims.size() == 4 && (i == 1 || i == 2)) return t.dims[3 - i];
  return t.dims[i];
}

std::string layout_text(const TensorDescription& t, bool bthd) {
  std::string s = "[";
  for (std::size_t i = 0; i < t.dims.size(); ++i) s += (i ? ", " : "") + dimension(t, i, bthd);
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

// The extents bound so far, by dimension name: a handful per op.
class Extents {
 public:
  const int64_t* find(const std::string& name) const {
    for (const auto& [n, e] : bound_)
      if (*n == name) return &e;
    return nullptr;
  }
  void bind(const std::string& name, int64_t extent) {
    if (!find(name)) bound_.emplace_back(&name, extent);
  }

 private:
  std::vector<std::pair<const std::string*, int64_t>> bound_;
};

}  // namespace

const OpDescription& description_of(const char* op, const char* direction) {
  if (const OpDescription* d = find_op_description(op, direction)) return *d;
  throw Failure{Status(StatusCode::internal, std::string("no description of ") + op + " " + direction)};
}

namespace {

// The dtype of the first input of `rule` given, or `otherwise`.
DType group_dtype(const OpDescription& description, const OpArguments& inputs, TensorDescription::DTypeRule rule,
                  DType otherwise) {
  for (const TensorDescription& t : description.tensors)
    if (!t.output && t.dtype == rule)
      if (const TensorArg* arg = inputs.arg(t.name)) return arg->dtype;
  return otherwise;
}

}  // namespace

std::vector<OutputPlan> plan_outputs(const OpDescription& description, const OpArguments& inputs, DType seq,
                                     DType state, bool bthd) {
  Extents extents;
  for (const TensorDescription& t : description.tensors) {
    if (t.output) continue;
    const TensorArg* arg = inputs.arg(t.name);
    if (!arg) continue;
    bool sets_one = false;
    for (std::size_t i = 0; i < t.dims.size(); ++i) sets_one = sets_one || !extents.find(dimension(t, i, bthd));
    if (!sets_one) continue;
    if (arg->shape.size() != t.dims.size())
      throw ArgumentError{"argument '" + t.key + "': expected rank " + std::to_string(t.dims.size()) + " " +
                          layout_text(t, bthd) + ", got shape " + shape_text(arg->shape)};
    for (std::size_t i = 0; i < t.dims.size(); ++i) extents.bind(dimension(t, i, bthd), arg->shape[i]);
  }

  std::vector<OutputPlan> plans;
  plans.reserve(description.tensors.size());
  for (const TensorDescription& t : description.tensors) {
    if (!t.output) continue;
    OutputPlan p;
    p.description = &t;
    // state: the dtype the NIF gives an f32-or-seq output (its state_type:
    // option); a weight or carry output takes its kind's, which the first
    // input of that kind given sets (else state too).
    using Rule = TensorDescription::DTypeRule;
    switch (t.dtype) {
      case Rule::seq: p.dtype = seq; break;
      case Rule::f32: p.dtype = DType::f32; break;
      case Rule::state: p.dtype = state; break;
      case Rule::weight:
      case Rule::carry: p.dtype = group_dtype(description, inputs, t.dtype, state); break;
    }
    p.shape.reserve(t.dims.size());
    for (std::size_t i = 0; i < t.dims.size(); ++i) {
      const int64_t* e = extents.find(dimension(t, i, bthd));
      if (!e)
        throw Failure{Status(StatusCode::internal, "output '" + t.name + "': no input sets dimension " + t.dims[i])};
      p.shape.push_back(*e);
    }
    p.exists = t.only_with.empty() || inputs.arg(t.only_with) != nullptr;
    plans.push_back(std::move(p));
  }
  return plans;
}

const Tensor* Outputs::get(const std::string& name) const {
  for (std::size_t i = 0; i < plans_.size(); ++i)
    if (plans_[i].description->name == name) return &tensors_[i].desc;
  return nullptr;
}

void Outputs::allocate(ErlNifEnv* env, int device) {
  for (std::size_t i = 0; i < plans_.size(); ++i) {
    AllocatedOutput allocated =
        allocate_output(env, plans_[i].description->key.c_str(), plans_[i].dtype, plans_[i].shape, device);
    tensors_[i] = std::move(allocated.tensor);
    terms_[i] = allocated.buffer;
  }
}

ERL_NIF_TERM Outputs::result_map(ErlNifEnv* env) const {
  std::vector<ERL_NIF_TERM> keys;
  keys.reserve(plans_.size());
  for (const OutputPlan& p : plans_) keys.push_back(key_atom(*p.description));
  return make_map(env, std::move(keys), terms_);
}

Outputs resolve_outputs(ErlNifEnv* env, const Options& opts, std::vector<OutputPlan> plans, int device) {
  Outputs out;
  out.plans_.reserve(plans.size());
  out.tensors_.reserve(plans.size());
  out.terms_.reserve(plans.size());
  if (auto given = opts.get("outputs")) {
    out.given_ = true;
    std::vector<const char*> names;
    for (const OutputPlan& p : plans) names.push_back(p.description->key.c_str());
    const Options outputs(env, *given, names, "outputs", "output");
    for (OutputPlan& p : plans) {
      const std::string& key = p.description->key;
      auto term = outputs.get(key.c_str());
      if (!term) {
        if (!p.description->optional)
          throw ArgumentError{"argument 'outputs': expected a tensor for :" + key +
                              " (destination passing gives every required output), got none"};
        continue;
      }
      out.tensors_.push_back(decode_tensor(env, *term, key, device));
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
    TensorArg described;  // its descriptor only, until allocate()
    described.desc = unallocated(p.dtype, p.shape);
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
