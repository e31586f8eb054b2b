// Buffer NIFs (argv as in ExPhil.Native): allocate(type, shape, opts),
// upload(binary, type, shape, opts), download(buffer), free(buffer),
// pointer(buffer), export_ipc(buffer), import_ipc(pointer, type, shape, opts),
// open_ipc_handles().
#pragma once

#include <erl_nif.h>

namespace exphil::nif {

ERL_NIF_TERM allocate_nif(ErlNifEnv* env, int argc, const ERL_NIF_TERM argv[]);
ERL_NIF_TERM upload_nif(ErlNifEnv* env, int argc, const ERL_NIF_TERM argv[]);
ERL_NIF_TERM download_nif(ErlNifEnv* env, int argc, const ERL_NIF_TERM argv[]);
ERL_NIF_TERM free_nif(ErlNifEnv* env, int argc, const ERL_NIF_TERM argv[]);
ERL_NIF_TERM pointer_nif(ErlNifEnv* env, int argc, const ERL_NIF_TERM argv[]);
ERL_NIF_TERM export_ipc_nif(ErlNifEnv* env, int argc, const ERL_NIF_TERM argv[]);
ERL_NIF_TERM import_ipc_nif(ErlNifEnv* env, int argc, const ERL_NIF_TERM argv[]);
ERL_NIF_TERM open_ipc_handles_nif(ErlNifEnv* env, int argc, const ERL_NIF_TERM argv[]);
ERL_NIF_TERM allocation_offset_nif(ErlNifEnv* env, int argc, const ERL_NIF_TERM argv[]);

}  // namespace exphil::nif
