// The attention NIFs (scaled dot-product attention with grouped-query
// heads), as in ExPhil.Native. Forward: argv = q, k, v, opts. Backward:
// argv = q, k, v, o, lse, grad_o, opts. Both catch everything (nif_entry)
// and are registered as they are.
#pragma once

#include <erl_nif.h>

namespace exphil::nif {

ERL_NIF_TERM attention_forward_nif(ErlNifEnv* env, int argc, const ERL_NIF_TERM argv[]);
ERL_NIF_TERM attention_backward_nif(ErlNifEnv* env, int argc, const ERL_NIF_TERM argv[]);

}  // namespace exphil::nif
