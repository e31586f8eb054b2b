// The GRU, LSTM and sLSTM sequence NIFs (op_descriptions.h's gru, lstm and
// slstm), as in ExPhil.Native. Forward: argv = wx, r, opts. Backward: argv = wx, r, y,
// grad_y, opts. Both catch everything (nif_entry); nif_main.cpp binds one
// per cell and direction.
#pragma once

#include <erl_nif.h>

#include "exphil/gated_rnn.hpp"

namespace exphil::nif {

ERL_NIF_TERM gated_rnn_forward_nif(ErlNifEnv* env, GatedRnnCell cell, int argc, const ERL_NIF_TERM argv[]);
ERL_NIF_TERM gated_rnn_backward_nif(ErlNifEnv* env, GatedRnnCell cell, int argc, const ERL_NIF_TERM argv[]);
// The stacks (gru_stack, lstm_stack). Forward: argv = wx, r, w, opts.
// Backward: argv = wx, r, w, y, y_lower, grad_y, opts.
ERL_NIF_TERM gated_rnn_stack_forward_nif(ErlNifEnv* env, GatedRnnCell cell, int argc, const ERL_NIF_TERM argv[]);
ERL_NIF_TERM gated_rnn_stack_backward_nif(ErlNifEnv* env, GatedRnnCell cell, int argc, const ERL_NIF_TERM argv[]);

}  // namespace exphil::nif
