// The arguments of an op NIF, decoded as the op's description says
// (exphil/op_descriptions.hpp): its inputs up to the last required one are
// the function's arguments, in order (nil for an absent optional one); the
// optional inputs after it are options of the same name (absent or nil: not
// given); then come the op's own options and the call's. Names are the
// description's lower-cased (A is :a). The first input decides the call's
// device; IPC handles among the other tensors are opened there.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include <erl_nif.h>

#include "exphil/op_descriptions.hpp"
#include "exphil/tensor.hpp"
#include "tensor_args.hpp"
#include "terms.hpp"

namespace exphil::nif {

class OpArguments {
 public:
  // The input `name` (the description's) as the library takes it: null
  // when absent.
  const Tensor* get(const std::string& name) const;
  // The decoded input `name`, or null when absent.
  const TensorArg* arg(const std::string& name) const;
  // Every input given, for an event to keep alive.
  std::vector<const TensorArg*> all() const;

  const Options& opts() const { return *opts_; }
  int device() const noexcept { return device_; }

 private:
  friend OpArguments decode_arguments(ErlNifEnv*, const OpDescription&, const ERL_NIF_TERM[],
                                      const std::vector<const char*>&, const std::vector<const char*>&);
  struct Input {
    const TensorDescription* description;
    std::optional<TensorArg> tensor;
  };
  std::vector<Input> inputs_;  // the description's inputs, in order
  std::optional<Options> opts_;
  int device_ = 0;
};

// Decodes `argv` for `description`: the options term first (its names are
// the optional inputs', then `op_options`, then `call_options`), then the
// inputs in the description's order.
OpArguments decode_arguments(ErlNifEnv* env, const OpDescription& description, const ERL_NIF_TERM argv[],
                             const std::vector<const char*>& op_options,
                             const std::vector<const char*>& call_options);

}  // namespace exphil::nif
