#include "gated_rnn_api_call.hpp"

#include "exphil/gated_rnn.hpp"

namespace exphil::test {

namespace {

template <class Args>
Status bind(Args& args, const std::map<std::string, const Tensor*>& tensors) {
  for (const auto& [name, t] : tensors) {
    const Tensor** slot = tensor_slot(args, name);
    if (!slot) return {StatusCode::internal, "no tensor '" + name + "' in the args"};
    *slot = t;
  }
  return {};
}

}  // namespace

Status gated_rnn_api_call(const std::string& op, const std::string& direction,
                          const std::map<std::string, const Tensor*>& tensors, cudaStream_t stream,
                          GatedRnnApiLayout* layout) {
  GatedRnnCell cell = GatedRnnCell::gru;
  if (op == "lstm") {
    cell = GatedRnnCell::lstm;
  } else if (op == "slstm") {
    cell = GatedRnnCell::slstm;
  } else if (op != "gru") {
    return {StatusCode::internal, "no gated RNN op '" + op + "'"};
  }
  GatedRnnLaunchInfo info;
  GatedRnnLaunchOptions options;
  options.chosen = &info;
  if (layout) {
    options.units_per_block = layout->units_per_block;
    options.batch_tile = layout->batch_tile;
    options.streamed_weights = layout->streamed_weights;
  }
  const GatedRnnPrecision precision =
      layout && layout->tf32 ? GatedRnnPrecision::tf32 : GatedRnnPrecision::exact;
  Status s;
  if (direction == "forward") {
    GatedRnnForwardArgs args;
    args.cell = cell;
    args.options.precision = precision;
    s = bind(args, tensors);
    if (s.ok()) s = gated_rnn_forward(args, stream, &options);
  } else {
    GatedRnnBackwardArgs args;
    args.cell = cell;
    args.options.precision = precision;
    s = bind(args, tensors);
    if (s.ok()) s = gated_rnn_backward(args, stream, &options);
  }
  if (layout && s.ok()) {
    layout->resident_weights = info.resident_weights;
    layout->tensor_cores = info.tensor_cores;
    layout->blocks = info.blocks;
    layout->kernels = info.kernels;
  }
  return s;
}

}  // namespace exphil::test
