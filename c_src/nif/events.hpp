// Waiting for work: a CUDA event recorded after a call's kernels, waited on
// at once (sync: true) or handed to Elixir as an ExPhil.Native.Event.
#pragma once

#include <memory>
#include <vector>

#include <erl_nif.h>

#include "device_memory.hpp"
#include "exphil/status.hpp"
#include "exphil/tensor.hpp"

namespace exphil::nif {

// Records an event on `stream` and returns {:ok, %ExPhil.Native.Event{}}
// holding copies of `keep_terms` and `outputs`, and `memory`, until the
// work is done; await/1 then answers {:ok, outputs}.
ERL_NIF_TERM make_event(ErlNifEnv* env, int device, Stream stream,
                        const std::vector<ERL_NIF_TERM>& keep_terms, ERL_NIF_TERM outputs,
                        std::vector<std::shared_ptr<DeviceMemory>> memory);

// await/1: waits for the event's work and returns {:ok, outputs}, or
// {:error, reason} if it failed.
ERL_NIF_TERM await_event(ErlNifEnv* env, ERL_NIF_TERM event);

}  // namespace exphil::nif
