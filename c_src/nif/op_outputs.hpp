// The outputs of an op NIF, derived from the op's description
// (exphil/op_descriptions.hpp): their names, dtypes, shapes, which must be
// given under destination passing, and which exist (an optional gradient
// of an absent input does not). Under outputs: the caller gives the tensors
// to write; without it the NIF allocates every output that exists as a
// fresh ExPhil.Native.Buffer, after the library's can_implement has passed
// the call with the outputs described but without memory, so bad input gets
// its message before any device memory is asked for (on a machine without
// a GPU too). Either way the call answers %{name => tensor}: the tensors
// given, or the Buffers made.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include <erl_nif.h>

#include "exphil/op_descriptions.hpp"
#include "exphil/tensor.hpp"
#include "op_inputs.hpp"
#include "tensor_args.hpp"
#include "terms.hpp"

namespace exphil::nif {

// One output of a call, planned from its description and inputs.
struct OutputPlan {
  const TensorDescription* description = nullptr;  // its name ("grad_A") and key ("grad_a")
  DType dtype = DType::f32;
  std::vector<int64_t> shape;
  bool exists = true;  // allocated without outputs:
};

// The outputs of `description` for a call with these inputs. Dimensions
// are bound by the first input that names them; the rank of each such
// input is checked here, with or without outputs:, so that a call gets the
// same message either way ("argument 'q': expected rank 4 [B, Hq, T, d],
// got shape {2, 3}"). seq and state are the dtypes of the description's
// seq and state tensors; bthd swaps the middle dimensions of 4-dimensional
// tensors (attention's layout).
std::vector<OutputPlan> plan_outputs(const OpDescription& description, const OpArguments& inputs, DType seq,
                                     DType state, bool bthd = false);

// The description of `op` in `direction`; raises an internal error for
// one the header does not have (a build of mismatched files).
const OpDescription& description_of(const char* op, const char* direction);

class Outputs {
 public:
  // The output `name` (the description's) as the library takes it: null
  // when absent.
  const Tensor* get(const std::string& name) const;
  // Whether the caller gave the outputs (destination passing).
  bool given() const noexcept { return given_; }
  // After can_implement passed on the described outputs: their memory.
  void allocate(ErlNifEnv* env, int device);

  const std::vector<TensorArg>& tensors() const noexcept { return tensors_; }
  // %{key => tensor}.
  ERL_NIF_TERM result_map(ErlNifEnv* env) const;

 private:
  friend Outputs resolve_outputs(ErlNifEnv* env, const Options& opts, std::vector<OutputPlan> plans, int device);
  std::vector<OutputPlan> plans_;  // those present, in order
  std::vector<TensorArg> tensors_;
  std::vector<ERL_NIF_TERM> terms_;
  bool given_ = false;
};

// The outputs given under outputs: (checked and imported on `device`), or
// else every output that exists, described without memory until
// allocate().
Outputs resolve_outputs(ErlNifEnv* env, const Options& opts, std::vector<OutputPlan> plans, int device);

// A fresh device Buffer for output `name`, and its ExPhil.Native.Buffer term.
struct AllocatedOutput {
  TensorArg tensor;
  ERL_NIF_TERM buffer;
};
AllocatedOutput allocate_output(ErlNifEnv* env, const char* name, DType dtype, const std::vector<int64_t>& shape,
                                int device);

}  // namespace exphil::nif
