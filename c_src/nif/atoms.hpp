// Atoms of the NIF, made once at load (and again at upgrade) and read-only
// afterwards.
#pragma once

#include <erl_nif.h>

#include "exphil/op_descriptions.hpp"

namespace exphil::nif {

struct Atoms {
  ERL_NIF_TERM ok, error, true_, false_, nil;
  // error reasons
  ERL_NIF_TERM no_cuda_device, out_of_memory, cuda_error, already_freed, internal;
  ERL_NIF_TERM xla_ffi_registration;
  // exceptions and structs
  ERL_NIF_TERM struct_, exception, message, argument_error, buffer_module, event_module, stream_module;
  // pointers, types, buffers
  ERL_NIF_TERM kind, local, ipc, address, handle, data_size, f, bf, ref, type, shape, device;
  // options
  ERL_NIF_TERM h0, grad_h_final, outputs, sync, stream, managed, legacy_default, state_type;
  // attention's and the gated RNNs' options: masks, layouts and precisions
  ERL_NIF_TERM none, causal, window, bhtd, bthd, exact, tf32x3, tf32;
  // outputs
  ERL_NIF_TERM y, h_final, grad_y, grad_h0;
  ERL_NIF_TERM grad_x, grad_dt, grad_a, grad_b, grad_c, grad_dt_bias, grad_d, grad_z;  // selective scan
  ERL_NIF_TERM o, lse, grad_q, grad_k, grad_v;                                      // attention
  // device_info
  ERL_NIF_TERM name, total_memory, free_memory, compute_capability, multiprocessor_count;
  ERL_NIF_TERM workspace_reserved, workspace_in_use, capture_blocks, offset;
};

// Valid after load.
const Atoms& atoms();
void make_atoms(ErlNifEnv* env);

// An atom for a name that is not in Atoms (per-op argument names).
ERL_NIF_TERM atom(ErlNifEnv* env, const char* name);

// The atom of a tensor's key (exphil/op_descriptions.hpp), made at load
// for every tensor of every description.
ERL_NIF_TERM key_atom(const TensorDescription& tensor);

}  // namespace exphil::nif
