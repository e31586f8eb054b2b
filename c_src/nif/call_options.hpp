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

// stream: :managed (the default: nullptr, the library's non-blocking stream
// for the tensors' device), :legacy_default (cudaStreamLegacy: the legacy
// default stream of the device current at launch, which the library makes
// the tensors' device; libtorch's default stream, so work of a caller such
// as Torchx is ordered with the call's both ways) or an
// ExPhil.Native.Stream.
Stream decode_stream(ErlNifEnv* env, const Options& opts);

// sync: true (the default) waits for the call; false returns an Event.
bool decode_sync(const Options& opts);

}  // namespace exphil::nif
