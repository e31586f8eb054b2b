// Runs a library call the way graph-building frameworks do: captured into a
// CUDA graph on a stream, then replayed, either as that graph or nested in
// another graph as a child-graph node (XLA's command buffers trace each
// custom call into its own graph and nest it so).
#pragma once

#include <functional>

#include <cuda_runtime_api.h>

#include "exphil/status.hpp"

namespace exphil::test {

enum class GraphNesting {
  top_level,  // the captured graph is instantiated and launched itself
  child,      // a parent graph holds it as a child node; the captured graph
              // is destroyed before the parent is instantiated
};

// Captures `call` on `stream` in thread-local mode (as XLA does), then
// launches the resulting executable graph `replays` times and waits for it.
// A failure of the call is returned as it came; a CUDA failure around it as
// a cuda_error naming the call.
Status capture_and_replay(cudaStream_t stream, const std::function<Status()>& call,
                          GraphNesting nesting, int replays = 1);

}  // namespace exphil::test
