// The selective-scan NIFs (Mamba's S6 scan), as in ExPhil.Native.
// Forward: argv = x, dt, a, b, c, opts. Backward: argv = x, dt, a, b, c,
// grad_y, opts (no y: the library recomputes the states from the inputs).
// Both catch everything (nif_entry) and are registered as they are.
#pragma once

#include <erl_nif.h>

namespace exphil::nif {

ERL_NIF_TERM selective_scan_forward_nif(ErlNifEnv* env, int argc, const ERL_NIF_TERM argv[]);
ERL_NIF_TERM selective_scan_backward_nif(ErlNifEnv* env, int argc, const ERL_NIF_TERM argv[]);

}  // namespace exphil::nif
