#include "graph_replay.hpp"

#include <string>

namespace exphil::test {
namespace {

Status cuda_failure(const char* call, cudaError_t e) {
  return {StatusCode::cuda_error, std::string(call) + ": " + cudaGetErrorName(e)};
}

}  // namespace

Status capture_and_replay(cudaStream_t stream, const std::function<Status()>& call,
                          GraphNesting nesting, int replays) {
  cudaError_t e = cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal);
  if (e != cudaSuccess) return cuda_failure("cudaStreamBeginCapture", e);
  const Status called = call();
  cudaGraph_t captured = nullptr;
  e = cudaStreamEndCapture(stream, &captured);
  if (!called.ok()) {
    if (captured) cudaGraphDestroy(captured);
    return called;
  }
  if (e != cudaSuccess) return cuda_failure("cudaStreamEndCapture", e);

  cudaGraph_t launched = captured;
  if (nesting == GraphNesting::child) {
    cudaGraph_t parent = nullptr;
    e = cudaGraphCreate(&parent, 0);
    cudaGraphNode_t node = nullptr;
    if (e == cudaSuccess) e = cudaGraphAddChildGraphNode(&node, parent, nullptr, 0, captured);
    cudaGraphDestroy(captured);  // the child node holds its own copy
    if (e != cudaSuccess) {
      if (parent) cudaGraphDestroy(parent);
      return cuda_failure("cudaGraphAddChildGraphNode", e);
    }
    launched = parent;
  }

  cudaGraphExec_t exec = nullptr;
  e = cudaGraphInstantiate(&exec, launched, 0);
  cudaGraphDestroy(launched);  // the executable graph keeps what it needs
  if (e != cudaSuccess) return cuda_failure("cudaGraphInstantiate", e);
  for (int i = 0; i < replays && e == cudaSuccess; ++i) e = cudaGraphLaunch(exec, stream);
  const cudaError_t synced = cudaStreamSynchronize(stream);
  cudaGraphExecDestroy(exec);
  if (e != cudaSuccess) return cuda_failure("cudaGraphLaunch", e);
  if (synced != cudaSuccess) return cuda_failure("cudaStreamSynchronize after the replay", synced);
  return {};
}

}  // namespace exphil::test
