// Device NIFs (argv as in ExPhil.Native).
#pragma once

#include <erl_nif.h>

namespace exphil::nif {

ERL_NIF_TERM device_count_nif(ErlNifEnv* env, int argc, const ERL_NIF_TERM argv[]);
ERL_NIF_TERM device_info_nif(ErlNifEnv* env, int argc, const ERL_NIF_TERM argv[]);
ERL_NIF_TERM memory_held_nif(ErlNifEnv* env, int argc, const ERL_NIF_TERM argv[]);
ERL_NIF_TERM synchronize_all_nif(ErlNifEnv* env, int argc, const ERL_NIF_TERM argv[]);
ERL_NIF_TERM synchronize_nif(ErlNifEnv* env, int argc, const ERL_NIF_TERM argv[]);
ERL_NIF_TERM new_stream_nif(ErlNifEnv* env, int argc, const ERL_NIF_TERM argv[]);
ERL_NIF_TERM await_nif(ErlNifEnv* env, int argc, const ERL_NIF_TERM argv[]);

}  // namespace exphil::nif
