// The runtime is thread-safe: host threads calling at once, on the shared
// managed stream or on streams of their own, all get correct results (and
// the lazily created per-device state is made once).
#include <catch2/catch.hpp>

#include <iterator>
#include <stdexcept>

#include <string>
#include <thread>
#include <vector>

#include <cuda_runtime_api.h>

#include "cpp_runner.hpp"
#include "exphil/runtime.hpp"
#include "scan_harness.hpp"

using namespace exphil;
using namespace exphil::test;

TEST_CASE("host threads calling at once get correct results", "[gpu][scan]") {
  constexpr int kThreads = 8;
  constexpr int kCallsPerThread = 6;
  std::vector<std::string> failures(kThreads);
  std::vector<int> checked(kThreads, 0);
  std::vector<std::thread> threads;
  for (int i = 0; i < kThreads; ++i) {
    threads.emplace_back([&, i] {
      try {
        cudaStream_t own = nullptr;
        if (i % 2 && cudaStreamCreateWithFlags(&own, cudaStreamNonBlocking) != cudaSuccess)
          throw std::runtime_error("cudaStreamCreateWithFlags failed");
        for (int k = 0; k < kCallsPerThread; ++k) {
          const ScanOp op = kAllScanOps[(i + k) % std::size(kAllScanOps)];
          const ScanCase c = stateful_case(op, k % 2 ? DType::bf16 : DType::f32, {1 + i % 3, 40 + 97 * k, 16 + i});
          const ScanCheck check = run_scan_case(c, cpp_runner(own), test_seed());
          if (!check.ok()) failures[static_cast<std::size_t>(i)] += describe_case(c) + "\n" + check.describe();
          ++checked[static_cast<std::size_t>(i)];
        }
        if (own) cudaStreamDestroy(own);
      } catch (const std::exception& e) {
        failures[static_cast<std::size_t>(i)] += e.what();
      }
    });
  }
  for (std::thread& t : threads) t.join();
  for (int i = 0; i < kThreads; ++i) {
    INFO("thread " << i << ": " << failures[static_cast<std::size_t>(i)]);
    CHECK(failures[static_cast<std::size_t>(i)].empty());
    CHECK(checked[static_cast<std::size_t>(i)] == kCallsPerThread);
  }
}
