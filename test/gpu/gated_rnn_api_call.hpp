// The GRU, LSTM and sLSTM sequences through the public C++ API, for
// test_gated_rnn.cpp (which works with the kernels' own types of the same
// names, so it cannot include exphil/gated_rnn.hpp): the tensors are bound
// by the names of the op's description, as the bindings bind them.
#pragma once

#include <map>
#include <string>

#include <cuda_runtime_api.h>

#include "exphil/status.hpp"
#include "exphil/tensor.hpp"

namespace exphil::test {

// exphil::GatedRnnLaunchOptions and the layout it reports, in plain fields,
// and the args' precision (tf32: GatedRnnPrecision::tf32).
struct GatedRnnApiLayout {
  int units_per_block = 0;  // asked (0: the library's choice)
  int batch_tile = 0;
  bool streamed_weights = false;
  bool tf32 = false;
  bool resident_weights = false;  // reported
  bool tensor_cores = false;      // reported (forward: its product; backward: its two)
  int blocks = 0;
  int kernels = 0;
};

// op "gru", "lstm" or "slstm", direction "forward" or "backward"; an unknown op or a
// name the args have no member for fails the call as an internal error.
Status gated_rnn_api_call(const std::string& op, const std::string& direction,
                          const std::map<std::string, const Tensor*>& tensors, cudaStream_t stream,
                          GatedRnnApiLayout* layout = nullptr);

}  // namespace exphil::test
