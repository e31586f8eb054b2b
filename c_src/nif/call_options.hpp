// What every op NIF decodes besides its tensors: the device the call runs
// on, and the stream: and sync: options.
#pragma once

#include <erl_nif.h>

#include "exphil/tensor.hpp"
#include "tensor_args.hpp"
#include "terms.hpp"

namespace exphil::nif {

// The device a call runs on: known for NIF-owned memory, else the driver's
// answer for the first input, else 0 (the library then reports the problem).
int call_device(const TensorArg& first);

// stream: :managed (the default: nullptr) or an ExPhil.Native.Stream.
Stream decode_stream(ErlNifEnv* env, const Options& opts);

// sync: true (the default) waits for the call; false returns an Event.
bool decode_sync(const Options& opts);

}  // namespace exphil::nif
