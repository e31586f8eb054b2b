#include "gated_rnn_api_call.hpp"

#include "exphil/gated_rnn.hpp"

namespace exphil::test {

namespace {

template <class Args>
Status bind_and_run(Args args, const std::map<std::string, const Tensor*>& tensors, cudaStream_t stream) {
  for (const auto& [name, t] : tensors) {
    const Tensor** slot = tensor_slot(args, name);
    if (!slot) return {StatusCode::internal, "no tensor '" + name + "' in the args"};
    *slot = t;
  }
  return run(args, stream);
}

}  // namespace

Status gated_rnn_api_call(const std::string& op, const std::string& direction,
                          const std::map<std::string, const Tensor*>& tensors, cudaStream_t stream) {
  const GatedRnnCell cell = op == "lstm" ? GatedRnnCell::lstm : GatedRnnCell::gru;
  if (direction == "forward") {
    GatedRnnForwardArgs args;
    args.cell = cell;
    return bind_and_run(args, tensors, stream);
  }
  GatedRnnBackwardArgs args;
  args.cell = cell;
  return bind_and_run(args, tensors, stream);
}

}  // namespace exphil::test
