// Bitwise reproducibility of the selective scan (exphil.h: "Forward and
// backward results are bitwise identical from run to run"): the same inputs
// give the same bytes for every output, whether the call repeats on the same
// buffers, runs on fresh ones, or runs on another stream. Sums over batch,
// time and channels (grad_A, grad_dt_bias, grad_D, grad_B, grad_C) are where
// an order that depends on block scheduling, or atomics, would show.
#include <catch2/catch.hpp>

#include <stdexcept>
#include <string>
#include <vector>

#include <cuda_runtime_api.h>

#include "scan_problems.hpp"
#include "selective_scan_harness.hpp"

using namespace exphil;
using namespace exphil::test;

namespace {

std::string joined(const std::vector<std::string>& names) {
  std::string s;
  for (const std::string& n : names) s += (s.empty() ? "" : ", ") + n;
  return s;
}

// A caller's stream, destroyed however the test case ends.
class OwnedStream {
 public:
  OwnedStream() {
    if (cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking) != cudaSuccess)
      throw std::runtime_error("cudaStreamCreateWithFlags failed");
  }
  ~OwnedStream() { cudaStreamDestroy(stream_); }
  OwnedStream(const OwnedStream&) = delete;
  OwnedStream& operator=(const OwnedStream&) = delete;
  cudaStream_t get() const { return stream_; }

 private:
  cudaStream_t stream_ = nullptr;
};

}  // namespace

TEST_CASE("selective_scan forward and backward are bitwise deterministic",
          "[gpu][selective_scan]") {
  struct Case {
    DType dtype;
    int64_t batch, steps, channels, states;
    long long chunk_steps;  // 0: the planner's choice
  };
  const Case cases[] = {
      {DType::bf16, 4, 256, 512, 16, 0},  // the training shape
      {DType::f32, 4, 256, 512, 16, 0},
      {DType::f32, 2, 2049, 64, 16, 16},  // forced chunks: many partial sums to combine
      {DType::bf16, 2, 2049, 64, 64, 64},
      {DType::f32, 1, 2049, 512, 16, 0},  // long sequence, the planner's choice
      {DType::f16, 3, 33, 5, 256, 8},     // odd width, the largest N, a one-step last chunk
  };
  for (const Case& c : cases) {
    SelectiveScanRun run = selective_scan_run(c.dtype, c.batch, c.steps, c.channels, c.states, true);
    run.chunk_steps = c.chunk_steps;
    // Each direction twice on the same buffers (the harness compares the
    // bytes of every call with the first; poison in between makes each call
    // write everything anew) ...
    run.calls = 2;
    if (!within_test_size(run)) continue;
    const uint64_t seed = test_seed();
    const SelectiveScanCheck first =
        run_selective_scan_case(run, selective_scan_cpp_runner(), seed);
    INFO(first.describe());
    CHECK(first.ok());
    // ... and again on fresh buffers with the same inputs.
    const SelectiveScanCheck second =
        run_selective_scan_case(run, selective_scan_cpp_runner(), seed);
    const std::vector<std::string> differ = differing_outputs(first, second);
    INFO("outputs that differ on fresh buffers: " << joined(differ));
    CHECK(differ.empty());
    CHECK(first.outputs.size() == second.outputs.size());
    CHECK(first.forward_layout.chunks == second.forward_layout.chunks);
    CHECK(first.backward_layout.chunks == second.backward_layout.chunks);
  }
}

TEST_CASE("selective_scan gives the same bytes on a caller stream and on the managed stream",
          "[gpu][selective_scan]") {
  const OwnedStream stream;
  for (DType dtype : {DType::f32, DType::bf16}) {
    for (long long chunk_steps : {0LL, 16LL}) {
      SelectiveScanRun run = selective_scan_run(dtype, 2, 200, 32, 16, true);
      run.chunk_steps = chunk_steps;
      if (!within_test_size(run)) continue;
      const uint64_t seed = test_seed();
      const SelectiveScanCheck on_stream =
          run_selective_scan_case(run, selective_scan_cpp_runner(stream.get()), seed);
      const SelectiveScanCheck managed =
          run_selective_scan_case(run, selective_scan_cpp_runner(nullptr), seed);
      INFO(on_stream.describe() << managed.describe());
      // The caller-stream run is waited on with cudaStreamSynchronize alone,
      // so work the library left on another stream could be read unfinished
      // (poison, or partial results).
      CHECK(on_stream.ok());
      CHECK(managed.ok());
      const std::vector<std::string> differ = differing_outputs(on_stream, managed);
      INFO("outputs that differ between the streams: " << joined(differ));
      CHECK(differ.empty());
    }
  }
}
