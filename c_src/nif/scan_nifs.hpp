// The scan NIFs, generic over the op; nif_main.cpp binds one per op and
// direction. Forward: argv = inputs..., opts. Backward: argv = inputs..., y,
// grad_y, opts.
#pragma once

#include <erl_nif.h>

#include "exphil/scan.hpp"

namespace exphil::nif {

ERL_NIF_TERM scan_forward_nif(ErlNifEnv* env, ScanOp op, int argc, const ERL_NIF_TERM argv[]);
ERL_NIF_TERM scan_backward_nif(ErlNifEnv* env, ScanOp op, int argc, const ERL_NIF_TERM argv[]);

}  // namespace exphil::nif
