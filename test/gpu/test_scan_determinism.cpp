// Bitwise reproducibility: the same inputs give the same bytes, forward and
// backward, on every path (one segment and many), since no result depends
// on the order in which blocks run.
#include <catch2/catch.hpp>

#include "cpp_runner.hpp"
#include "scan_harness.hpp"

using namespace exphil;
using namespace exphil::test;

TEST_CASE("forward and backward are bitwise deterministic", "[gpu][scan]") {
  for (ScanOp op : kAllScanOps) {
    for (DType dtype : {DType::f32, DType::bf16}) {
      // One pass and segmented, at training and long-sequence sizes and small.
      for (const ShapeCase shape : {ShapeCase{64, 257, 256}, ShapeCase{1, 65536, 256},
                                    ShapeCase{64, 33, 64}, ShapeCase{3, 2000, 24}}) {
        if (!within_test_size(shape)) continue;
        ScanCase c = stateful_case(op, dtype, shape);
        const uint64_t seed = test_seed();
        auto chosen = std::make_shared<ChosenLayouts>();
        const ScanCheck first = run_scan_case(c, cpp_runner(nullptr, {}, chosen), seed);
        const ScanCheck second = run_scan_case(c, cpp_runner(), seed);
        INFO(describe_case(c) << ", segments " << chosen->backward.segments << "\n" << first.describe());
        REQUIRE(first.ok());
        REQUIRE(first.outputs.size() == second.outputs.size());
        for (std::size_t i = 0; i < first.outputs.size(); ++i) {
          INFO("output " << first.tensors[i].name);
          CHECK(first.outputs[i] == second.outputs[i]);
        }
      }
    }
  }
}
