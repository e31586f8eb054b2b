// register_xla_ffi/2 (argv as in ExPhil.Native).
#pragma once

#include <erl_nif.h>

namespace exphil::nif {

ERL_NIF_TERM register_xla_ffi_nif(ErlNifEnv* env, int argc, const ERL_NIF_TERM argv[]);

}  // namespace exphil::nif
