// Workspace for a call that is being captured into a CUDA graph.
//
// Outside capture, workspace comes from the library's stream-ordered pool
// and is released on the stream after the kernels. That cannot work inside
// a graph that another graph will nest: captured, cudaMallocAsync becomes an
// allocation node, and a child graph may hold none (XLA's command buffers
// record every traced custom call as a child graph; "Failed to create a
// child graph node" was the result).
//
// So a captured call takes a plain device block instead, and hands its
// ownership to the graph being captured through a CUDA user object. Every
// copy of the graph (a clone, a child-graph node, an executable graph)
// holds a reference; when the last one is gone and its launches have
// finished, CUDA runs the object's destructor, which puts the block back in
// a per-device cache for the next capture. Blocks are allocated with
// cudaMalloc only when the cache has none large enough, with the thread's
// capture mode relaxed for that one call (cudaMalloc is otherwise refused
// during capture), and are kept for reuse until the process ends.
//
// Limit: the instantiations of one captured graph (or of its clones) share
// its blocks, so they must not run concurrently with each other; launches of
// one executable graph are serialised by CUDA anyway.
#pragma once

#include <cstddef>

#include <cuda_runtime_api.h>

#include "exphil/status.hpp"

namespace exphil::runtime {

// `bytes` (> 0) of device memory on `device` for kernels that `stream`, which
// is being captured, records; owned by the capture's graph from here on.
// `what` names the workspace in errors.
Status capture_workspace(int device, cudaStream_t stream, std::size_t bytes, void** out,
                         const char* what);

// The bytes of the blocks allocated for captured calls on `device` (kept
// for reuse until the process ends, owned by graphs or free).
std::size_t capture_blocks_bytes(int device) noexcept;

}  // namespace exphil::runtime
