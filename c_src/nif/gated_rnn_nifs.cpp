// gru_forward, gru_backward, lstm_forward, lstm_backward, slstm_forward,
// slstm_backward and the stacks' gru_stack_forward, gru_stack_backward,
// lstm_stack_forward and lstm_stack_backward: decode the arguments and plan the outputs from the op's
// description (op_inputs.hpp, op_outputs.hpp), run through
// exphil::gated_rnn_forward / _backward on the managed stream (or the
// caller's), then wait (sync: true, the default) or return an Event (sync:
// false). Tensor arguments, outputs:, stream:, sync: and errors are those of
// the other ops. What differs:
//
//   * Elixir spells the recurrent weights R as r, and the stacks' W and
//     W_bias as w and w_bias (its variables and option keys are lowercase):
//     the NIF's own messages say 'r', the library's 'R', as exphil.h does.
//   * The GRU's and LSTM's ops and their stacks have one option of their
//     own, precision: :exact (the default) or :tf32 (f32 sequences only:
//     exphil/gated_rnn.hpp's GatedRnnPrecision); the sLSTM's has none. The
//     optional inputs (bias, h0, the LSTM's and sLSTM's c0, the sLSTM's n0
//     and m0; backward also the final states' gradients, grad_h_final, ...)
//     are options of those names.
//   * Outputs the NIF allocates: y, grad_wx and grad_rh in wx's dtype;
//     grad_r and grad_bias in r's (weights: f32 or wx's, one per call); the
//     final states and the initial states' gradients in the dtype of the
//     carry inputs given (h0, c0, ..., grad_h_final, ...: f32 or wx's, one
//     per call), f32 without any. There is no state_type:; destination
//     passing writes whichever the caller gives.
//   * Every backward output is optional: under outputs: the caller asks for
//     the gradients it needs (at least one). Without outputs:, the NIF makes
//     all of them, grad_bias and grad_h0 (grad_c0, ...) also for a call
//     without bias or h0 (c0, ...): the gradient at the default value.
#include <vector>

#include "atoms.hpp"
#include "exphil/gated_rnn.hpp"
#include "gated_rnn_nifs.hpp"
#include "op_call.hpp"
#include "terms.hpp"

namespace exphil::nif {

namespace {

const std::vector<const char*> kOpOptions = {"precision"};
const std::vector<const char*> kCallOptions = {"outputs", "sync", "stream"};

// precision: :exact or :tf32, the latter for f32 sequences only.
GatedRnnOptions decode_gated_rnn_options(const Options& opts, DType wx_dtype) {
  GatedRnnOptions options;
  if (auto term = opts.get("precision")) {
    options.precision = decode_choice<GatedRnnPrecision>(
        *term, "precision", ":exact or :tf32 (f32 sequences only)",
        {{atoms().exact, GatedRnnPrecision::exact}, {atoms().tf32, GatedRnnPrecision::tf32}});
    if (options.precision == GatedRnnPrecision::tf32 && wx_dtype != DType::f32)
      bad_argument("precision", ":exact with f16 or bf16 sequences (:tf32 multiplies f32)", *term);
  }
  return options;
}

// Both directions, cells and the stacks: Args picks the library call, `op`
// the description (the sLSTM's has no options).
template <class Args>
ERL_NIF_TERM gated_rnn_nif(ErlNifEnv* env, GatedRnnCell cell, const char* op, const char* direction, int argc,
                           const ERL_NIF_TERM argv[]) {
  return nif_entry(env, [&] {
    const bool has_options = cell != GatedRnnCell::slstm;
    OpCall call(env, op, direction, argv, has_options ? kOpOptions : std::vector<const char*>{},
                kCallOptions);
    const DType wx_dtype = call.in().arg("wx")->dtype;
    call.plan_outputs(wx_dtype, DType::f32);
    Args args;
    args.cell = cell;
    if (has_options) args.options = decode_gated_rnn_options(call.opts(), wx_dtype);
    return call.run(argc, argv, args);
  });
}

}  // namespace

ERL_NIF_TERM gated_rnn_forward_nif(ErlNifEnv* env, GatedRnnCell cell, int argc, const ERL_NIF_TERM argv[]) {
  return gated_rnn_nif<GatedRnnForwardArgs>(env, cell, gated_rnn_cell_name(cell), "forward", argc, argv);
}

ERL_NIF_TERM gated_rnn_backward_nif(ErlNifEnv* env, GatedRnnCell cell, int argc, const ERL_NIF_TERM argv[]) {
  return gated_rnn_nif<GatedRnnBackwardArgs>(env, cell, gated_rnn_cell_name(cell), "backward", argc, argv);
}

ERL_NIF_TERM gated_rnn_stack_forward_nif(ErlNifEnv* env, GatedRnnCell cell, int argc, const ERL_NIF_TERM argv[]) {
  const char* op = cell == GatedRnnCell::gru ? "gru_stack" : "lstm_stack";
  return gated_rnn_nif<GatedRnnStackForwardArgs>(env, cell, op, "forward", argc, argv);
}

ERL_NIF_TERM gated_rnn_stack_backward_nif(ErlNifEnv* env, GatedRnnCell cell, int argc, const ERL_NIF_TERM argv[]) {
  const char* op = cell == GatedRnnCell::gru ? "gru_stack" : "lstm_stack";
  return gated_rnn_nif<GatedRnnStackBackwardArgs>(env, cell, op, "backward", argc, argv);
}

}  // namespace exphil::nif
