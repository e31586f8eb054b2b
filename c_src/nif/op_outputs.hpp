// The outputs of an op NIF. Each direction of an op lists its outputs as
// OutputSpecs, with the dtype and shape it computed from its inputs. Under
// outputs: the caller gives the tensors to write (destination passing);
// without it the NIF allocates every output that exists as a fresh
// ExPhil.Native.Buffer. Either way the tensors are bound to the library's
// arguments (Args) and the call answers %{name => tensor}: the tensors given,
// or the Buffers made.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <utility>
#include <vector>

#include <erl_nif.h>

#include "exphil/tensor.hpp"
#include "tensor_args.hpp"
#include "terms.hpp"

namespace exphil::nif {

// One output of a direction of an op; Args is the library's argument struct.
template <class Args>
struct OutputSpec {
  const char* name;            // its key under outputs: and in the result map
  ERL_NIF_TERM key;            // `name` as an atom (made at load)
  const Tensor* Args::*slot;   // the field of Args that takes it
  DType dtype;                 // of the Buffer the NIF allocates for it
  std::vector<int64_t> shape;  // likewise
  bool required;               // must be given under outputs:
  bool exists;                 // allocated without outputs: (false: the gradient of an absent input)
};

// The outputs a call writes, in the order of their specs.
template <class Args>
class Outputs {
 public:
  // `term` is what the result map answers for it.
  void add(const OutputSpec<Args>& spec, TensorArg tensor, ERL_NIF_TERM term) {
    tensors_.push_back(std::move(tensor));
    slots_.push_back(spec.slot);
    keys_.push_back(spec.key);
    terms_.push_back(term);
  }

  bool empty() const { return tensors_.empty(); }
  const std::vector<TensorArg>& tensors() const { return tensors_; }

  // Outputs not written stay NULL in `args`.
  void bind(Args& args) const {
    for (std::size_t i = 0; i < slots_.size(); ++i) args.*slots_[i] = &tensors_[i].desc;
  }

  // %{name => tensor}.
  ERL_NIF_TERM result_map(ErlNifEnv* env) const { return make_map(env, keys_, terms_); }

 private:
  std::vector<TensorArg> tensors_;
  std::vector<const Tensor* Args::*> slots_;
  std::vector<ERL_NIF_TERM> keys_, terms_;
};

// The tensor given for an output under outputs:, or none; raises
// ArgumentError for a required output not given.
std::optional<ERL_NIF_TERM> given_output(const Options& outputs, const char* name, bool required);

// Raises ArgumentError for an outputs: that names none of `names`: a call
// that writes nothing is a mistake in the caller, not a request.
[[noreturn]] void no_output_given(const std::vector<const char*>& names, ERL_NIF_TERM outputs);

// A fresh device Buffer for output `name`, and its ExPhil.Native.Buffer term.
struct AllocatedOutput {
  TensorArg tensor;
  ERL_NIF_TERM buffer;
};
AllocatedOutput allocate_output(ErlNifEnv* env, const char* name, DType dtype, const std::vector<int64_t>& shape,
                                int device);

// A descriptor of dtype and shape without memory, for can_implement.
Tensor unallocated(DType dtype, const std::vector<int64_t>& shape);

// The outputs of a call: those given under outputs: (checked and imported
// on `device`), else every output that exists, allocated on `device` once
// the library's can_implement has passed `args` (the inputs bound) with
// those outputs described but without memory: bad input gets its message
// before any device memory is asked for, on a machine without a GPU too.
template <class Args>
Outputs<Args> resolve_outputs(ErlNifEnv* env, const Options& opts, const std::vector<OutputSpec<Args>>& specs,
                              int device, const Args& args) {
  Outputs<Args> out;
  if (auto given = opts.get("outputs")) {
    std::vector<const char*> names;
    for (const OutputSpec<Args>& s : specs) names.push_back(s.name);
    const Options outputs(env, *given, names, "outputs", "output");
    for (const OutputSpec<Args>& s : specs)
      if (auto term = given_output(outputs, s.name, s.required))
        out.add(s, decode_tensor(env, *term, s.name, device), *term);
    if (out.empty()) no_output_given(names, *given);
    return out;
  }
  Args planned = args;
  std::vector<Tensor> described;
  described.reserve(specs.size());  // stable addresses for `planned`
  for (const OutputSpec<Args>& s : specs) {
    if (!s.exists) continue;
    described.push_back(unallocated(s.dtype, s.shape));
    planned.*s.slot = &described.back();
  }
  check(can_implement(planned));
  for (const OutputSpec<Args>& s : specs) {
    if (!s.exists) continue;
    AllocatedOutput allocated = allocate_output(env, s.name, s.dtype, s.shape, device);
    out.add(s, std::move(allocated.tensor), allocated.buffer);
  }
  return out;
}

}  // namespace exphil::nif
