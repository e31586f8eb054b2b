// What the gated-RNN GPU tests (test_gated_rnn.cpp, test_gated_rnn_stack.cpp)
// share besides the reference: CUDA errors as exceptions, a workspace they
// poison before each call, a stream of their own, the device's numbers for
// the planners, and graph capture.
#pragma once

#include <cstddef>
#include <functional>
#include <stdexcept>
#include <string>

#include <cuda_runtime_api.h>

#include "gated_rnn/gated_rnn_launch.h"

namespace exphil::test {

inline void check_cuda(cudaError_t e, const char* what) {
  if (e != cudaSuccess)
    throw std::runtime_error(std::string(what) + ": " + cudaGetErrorName(e) + " (" +
                             cudaGetErrorString(e) + ")");
}

inline void launch_or_throw(const kernels::LaunchResult& r) {
  if (!r.ok()) throw std::runtime_error(std::string(r.call) + ": " + cudaGetErrorName(r.error));
}

// Device memory without guards, for the workspace (poisoned before each use).
struct DeviceScratch {
  void* p = nullptr;
  std::size_t bytes = 0;
  explicit DeviceScratch(std::size_t n) : bytes(n) {
    if (n) check_cuda(cudaMalloc(&p, n), "cudaMalloc (workspace)");
  }
  ~DeviceScratch() { cudaFree(p); }
  DeviceScratch(const DeviceScratch&) = delete;
  DeviceScratch& operator=(const DeviceScratch&) = delete;
  void poison() const {
    if (bytes) check_cuda(cudaMemset(p, 0xFF, bytes), "cudaMemset (workspace)");
    check_cuda(cudaDeviceSynchronize(), "cudaDeviceSynchronize");
  }
};

struct RnnStream {
  cudaStream_t s = nullptr;
  RnnStream() { check_cuda(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), "cudaStreamCreate"); }
  ~RnnStream() { cudaStreamDestroy(s); }
  RnnStream(const RnnStream&) = delete;
  RnnStream& operator=(const RnnStream&) = delete;
};

inline kernels::GatedRnnDevice gated_rnn_device() {
  int device = 0;
  check_cuda(cudaGetDevice(&device), "cudaGetDevice");
  kernels::GatedRnnDevice d;
  check_cuda(kernels::query_gated_rnn_device(device, d), "query_gated_rnn_device");
  return d;
}

// Captures `body` on `stream` into a graph and instantiates it.
inline cudaGraphExec_t capture(cudaStream_t stream, const std::function<void()>& body) {
  check_cuda(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal), "cudaStreamBeginCapture");
  cudaGraph_t graph = nullptr;
  try {
    body();
  } catch (...) {
    (void)cudaStreamEndCapture(stream, &graph);
    if (graph) cudaGraphDestroy(graph);
    (void)cudaGetLastError();
    throw;
  }
  check_cuda(cudaStreamEndCapture(stream, &graph), "cudaStreamEndCapture");
  cudaGraphExec_t exec = nullptr;
  check_cuda(cudaGraphInstantiate(&exec, graph, 0), "cudaGraphInstantiate");
  cudaGraphDestroy(graph);
  return exec;
}

}  // namespace exphil::test
