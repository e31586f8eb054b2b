// Every op captured into a CUDA graph and replayed, as a graph of its own and
// nested as a child graph (how XLA's command buffers run a traced custom
// call), against the double reference through the usual harnesses. The
// shapes include ones that need a workspace: a captured op then takes a
// block the graph owns (c_src/runtime/capture_workspace.hpp), and a graph that held
// an allocation node instead could not be nested at all.
#include <catch2/catch.hpp>

#include <cstddef>
#include <initializer_list>
#include <string>

#include <cuda_runtime_api.h>

#include "attention_harness.hpp"
#include "graph_replay.hpp"
#include "scan_harness.hpp"
#include "scan_problems.hpp"
#include "selective_scan_harness.hpp"

using namespace exphil;
using namespace exphil::test;

namespace {

// Twice: the second launch reuses the first one's workspace, and the
// outputs must not change.
constexpr int kReplays = 2;

const char* nesting_name(GraphNesting n) {
  return n == GraphNesting::child ? "nested as a child graph" : "as a top-level graph";
}

// A stream of the caller's, created and destroyed with the test.
struct CallerStream {
  cudaStream_t stream = nullptr;
  CallerStream() { REQUIRE(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking) == cudaSuccess); }
  ~CallerStream() { cudaStreamDestroy(stream); }
};

ScanRunner scan_graph_runner(cudaStream_t stream, GraphNesting nesting) {
  ScanRunner r;
  r.forward = [=](const ScanForwardArgs& a) {
    return capture_and_replay(stream, [&] { return scan_forward(a, stream); }, nesting, kReplays);
  };
  r.backward = [=](const ScanBackwardArgs& a) {
    return capture_and_replay(stream, [&] { return scan_backward(a, stream); }, nesting, kReplays);
  };
  r.synchronize = [] {};  // the replay has waited
  return r;
}

SelectiveScanRunner selective_scan_graph_runner(cudaStream_t stream, GraphNesting nesting) {
  SelectiveScanRunner r;
  r.name = std::string("C++ API captured ") + nesting_name(nesting);
  r.forward = [=](const SelectiveScanForwardArgs& a, const SelectiveScanLaunchOptions*) {
    return capture_and_replay(stream, [&] { return selective_scan_forward(a, stream); }, nesting,
                              kReplays);
  };
  r.backward = [=](const SelectiveScanBackwardArgs& a, const SelectiveScanLaunchOptions*) {
    return capture_and_replay(stream, [&] { return selective_scan_backward(a, stream); }, nesting,
                              kReplays);
  };
  r.synchronize = [] {};
  return r;
}

AttentionRunner attention_graph_runner(cudaStream_t stream, GraphNesting nesting) {
  AttentionRunner r;
  r.name = std::string("C++ API captured ") + nesting_name(nesting);
  r.forward = [=](const AttentionForwardArgs& a, const AttentionLaunchOptions*) {
    return capture_and_replay(stream, [&] { return attention_forward(a, stream); }, nesting,
                              kReplays);
  };
  r.backward = [=](const AttentionBackwardArgs& a, const AttentionLaunchOptions*) {
    return capture_and_replay(stream, [&] { return attention_backward(a, stream); }, nesting,
                              kReplays);
  };
  r.synchronize = [] {};
  return r;
}

// The backward without lse (recompute_lse, as exphil_attention_o_bwd calls
// it): its forward pass writes o and lse into the graph's workspace block.
AttentionRunner recomputing_lse(AttentionRunner r) {
  const auto backward = r.backward;
  r.name += ", lse recomputed";
  r.backward = [=](const AttentionBackwardArgs& a, const AttentionLaunchOptions* o) {
    AttentionBackwardArgs b = a;
    b.lse = nullptr;
    b.recompute_lse = true;
    return backward(b, o);
  };
  return r;
}

void check_scans(const ScanRunner& runner, DType dtype, std::initializer_list<ShapeCase> shapes) {
  for (ScanOp op : kAllScanOps)
    for (const ShapeCase shape : shapes) {
      ScanCase c = stateful_case(op, dtype, shape);
      const ScanCheck check = run_scan_case(c, runner, test_seed());
      INFO(describe_case(c) << "\n" << check.describe());
      CHECK(check.ok());
    }
}

constexpr GraphNesting kNestings[] = {GraphNesting::top_level, GraphNesting::child};

}  // namespace

TEST_CASE("graphs: the scans captured and replayed, top level and nested", "[gpu][graph][scan]") {
  CallerStream s;
  for (GraphNesting nesting : kNestings) {
    INFO(nesting_name(nesting));
    // T = 9000 at B1 takes two passes over time and a workspace.
    check_scans(scan_graph_runner(s.stream, nesting), DType::f32,
                {ShapeCase{1, 32, 256}, ShapeCase{1, 9000, 64}});
    check_scans(scan_graph_runner(s.stream, nesting), DType::bf16, {ShapeCase{3, 2049, 5}});
  }
}

TEST_CASE("graphs: the selective scan captured and replayed, top level and nested",
          "[gpu][graph][selective_scan]") {
  CallerStream s;
  for (GraphNesting nesting : kNestings) {
    const SelectiveScanRunner runner = selective_scan_graph_runner(s.stream, nesting);
    // The backward always takes a workspace; T = 2049 also takes the chunked
    // path's checkpoints, forward and backward.
    for (const SelectiveScanRun& run :
         {selective_scan_run(DType::bf16, 1, 32, 512, 16, false),
          selective_scan_run(DType::f32, 2, 2049, 64, 16, true),
          selective_scan_run(DType::f16, 1, 200, 5, 64, true)}) {
      if (!within_test_size(run)) continue;
      const SelectiveScanCheck check = run_selective_scan_case(run, runner, test_seed());
      INFO(check.describe());
      CHECK(check.ok());
    }
  }
}

TEST_CASE("graphs: attention captured and replayed, top level and nested",
          "[gpu][graph][attention]") {
  CallerStream s;
  for (GraphNesting nesting : kNestings) {
    const AttentionRun r =
        attention_run(DType::bf16, 64, {2, 4, 2, 257, 300}, AttentionMask::causal);
    if (!within_test_size(r)) continue;
    const uint64_t seed = test_seed();
    INFO(describe(r) << " seed=" << seed << " " << nesting_name(nesting));
    for (const AttentionRunner& runner :
         {attention_graph_runner(s.stream, nesting),
          recomputing_lse(attention_graph_runner(s.stream, nesting))}) {
      INFO(runner.name);
      const AttentionCheck c = check_attention(r, runner, seed);
      INFO(c.report());
      CHECK(c.failures.empty());
    }
  }
}

// [serial]: it reads the device's free memory, so ctest runs it alone.
TEST_CASE("graphs: a destroyed graph's workspace is reused, not allocated again",
          "[gpu][graph][scan][serial]") {
  CallerStream s;
  const ScanRunner runner = scan_graph_runner(s.stream, GraphNesting::child);
  ScanCase c = stateful_case(ScanOp::min_gru, DType::f32, ShapeCase{1, 9000, 64});
  auto run_once = [&] {
    const ScanCheck check = run_scan_case(c, runner, test_seed());
    INFO(check.describe());
    REQUIRE(check.ok());
  };
  run_once();  // the first capture allocates the blocks this shape needs
  std::size_t free_before = 0, free_after = 0, total = 0;
  REQUIRE(cudaMemGetInfo(&free_before, &total) == cudaSuccess);
  constexpr int kCaptures = 30;
  for (int i = 0; i < kCaptures; ++i) run_once();
  REQUIRE(cudaMemGetInfo(&free_after, &total) == cudaSuccess);
  // Each capture takes at least one 1 MiB block (forward and backward);
  // without reuse the loop would hold 30 MiB or more. The destructors that
  // return blocks run asynchronously, so a few may still be on their way.
  const double grown_mib =
      free_after < free_before ? static_cast<double>(free_before - free_after) / (1 << 20) : 0.0;
  INFO("device memory taken by the loop: " << grown_mib << " MiB");
  CHECK(grown_mib <= 8.0);
}
