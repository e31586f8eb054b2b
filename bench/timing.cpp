#include "timing.hpp"

#include <algorithm>
#include <chrono>
#include <stdexcept>
#include <string>
#include <vector>

namespace exphil::bench {

namespace {

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const std::size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

struct EventPair {
  cudaEvent_t start = nullptr, stop = nullptr;
  EventPair() {
    check_cuda(cudaEventCreate(&start), "cudaEventCreate");
    check_cuda(cudaEventCreate(&stop), "cudaEventCreate");
  }
  ~EventPair() {
    cudaEventDestroy(start);
    cudaEventDestroy(stop);
  }
  double elapsed_us() const {
    float ms = 0;
    check_cuda(cudaEventElapsedTime(&ms, start, stop), "cudaEventElapsedTime");
    return 1000.0 * ms;
  }
};

}  // namespace

void check_cuda(cudaError_t e, const char* what) {
  if (e != cudaSuccess)
    throw std::runtime_error(std::string(what) + " failed: " + cudaGetErrorName(e) + " (" +
                             cudaGetErrorString(e) + ")");
}

double median_event_us(cudaStream_t stream, int warmup, int reps, const Enqueue& call) {
  for (int i = 0; i < warmup; ++i) call(i);
  check_cuda(cudaStreamSynchronize(stream), "cudaStreamSynchronize");
  EventPair ev;
  std::vector<double> times;
  for (int i = 0; i < reps; ++i) {
    check_cuda(cudaEventRecord(ev.start, stream), "cudaEventRecord");
    call(warmup + i);
    check_cuda(cudaEventRecord(ev.stop, stream), "cudaEventRecord");
    check_cuda(cudaEventSynchronize(ev.stop), "cudaEventSynchronize");
    times.push_back(ev.elapsed_us());
  }
  return median(times);
}

double median_graph_us(cudaStream_t stream, int graphs, int calls_per_graph, int replays,
                       const Enqueue& call) {
  std::vector<cudaGraphExec_t> execs;
  int index = 0;
  for (int g = 0; g < graphs; ++g) {
    cudaGraph_t graph = nullptr;
    check_cuda(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal), "cudaStreamBeginCapture");
    for (int c = 0; c < calls_per_graph; ++c) call(index++);
    check_cuda(cudaStreamEndCapture(stream, &graph), "cudaStreamEndCapture");
    cudaGraphExec_t exec = nullptr;
    check_cuda(cudaGraphInstantiate(&exec, graph, 0), "cudaGraphInstantiate");
    cudaGraphDestroy(graph);
    execs.push_back(exec);
  }
  for (cudaGraphExec_t e : execs) check_cuda(cudaGraphLaunch(e, stream), "cudaGraphLaunch");  // warm-up
  check_cuda(cudaStreamSynchronize(stream), "cudaStreamSynchronize");
  EventPair ev;
  std::vector<double> times;
  for (int r = 0; r < replays; ++r) {
    check_cuda(cudaEventRecord(ev.start, stream), "cudaEventRecord");
    check_cuda(cudaGraphLaunch(execs[static_cast<std::size_t>(r) % execs.size()], stream), "cudaGraphLaunch");
    check_cuda(cudaEventRecord(ev.stop, stream), "cudaEventRecord");
    check_cuda(cudaEventSynchronize(ev.stop), "cudaEventSynchronize");
    times.push_back(ev.elapsed_us() / calls_per_graph);
  }
  for (cudaGraphExec_t e : execs) cudaGraphExecDestroy(e);
  return median(times);
}

double median_host_us(cudaStream_t stream, int reps, const Enqueue& call) {
  std::vector<double> times;
  for (int i = 0; i < reps; ++i) {
    const auto t0 = std::chrono::steady_clock::now();
    call(i);
    const auto t1 = std::chrono::steady_clock::now();
    times.push_back(std::chrono::duration<double, std::micro>(t1 - t0).count());
    if (i % 16 == 15) check_cuda(cudaStreamSynchronize(stream), "cudaStreamSynchronize");
  }
  check_cuda(cudaStreamSynchronize(stream), "cudaStreamSynchronize");
  return median(times);
}

}  // namespace exphil::bench
