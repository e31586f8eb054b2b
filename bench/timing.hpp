// Timing on the device: CUDA events around single calls, and CUDA-graph
// replay of many calls captured back to back (launch gaps removed). Both
// report medians; every call is given its repetition index so it can rotate
// over input sets and defeat the L2 cache.
#pragma once

#include <functional>

#include <cuda_runtime_api.h>

namespace exphil::bench {

// Enqueues one call on the stream; throws std::runtime_error on failure.
using Enqueue = std::function<void(int rep)>;

// Median device time of one call, from an event pair around each of `reps`
// calls (after `warmup` untimed ones).
double median_event_us(cudaStream_t stream, int warmup, int reps, const Enqueue& call);

// Captures `graphs` graphs of `calls_per_graph` calls each (call indices run
// on across graphs), replays them round-robin `replays` times in all, and
// returns the median over replays of replay time / calls_per_graph.
double median_graph_us(cudaStream_t stream, int graphs, int calls_per_graph, int replays,
                       const Enqueue& call);

// Median host wall time of enqueueing one call (validation + launch), in us.
double median_host_us(cudaStream_t stream, int reps, const Enqueue& call);

void check_cuda(cudaError_t e, const char* what);

}  // namespace exphil::bench
