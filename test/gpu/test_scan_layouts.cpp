// Results do not depend on the layout: forced launch shapes (one thread per
// channel walking all of T, many segments, odd chunk counts), the scalar
// path for misaligned or odd-width tensors, absent optional outputs, and
// state tensors in the sequence dtype.
#include <catch2/catch.hpp>

#include "cpp_runner.hpp"
#include "scan_harness.hpp"

using namespace exphil;
using namespace exphil::test;

namespace {

void check_case(const ScanCase& c, ScanLaunchOptions options, std::shared_ptr<ChosenLayouts> chosen = nullptr) {
  if (!chosen) chosen = std::make_shared<ChosenLayouts>();
  const ScanCheck check = run_scan_case(c, cpp_runner(nullptr, options, chosen), test_seed());
  INFO(describe_case(c) << " | forced chunks " << options.time_chunks << " segments "
                        << options.segments << " vectorized " << options.allow_vectorized
                        << " | chose vec " << chosen->forward.vector_width << " chunks "
                        << chosen->forward.time_chunks << " segments " << chosen->forward.segments
                        << "\n"
                        << check.describe());
  CHECK(check.ok());
}

}  // namespace

TEST_CASE("forced launch layouts give the reference results", "[gpu][scan]") {
  struct Forced {
    int chunks, segments;
    bool vectorized;
  };
  const Forced layouts[] = {
      {1, 1, true},    // one thread per channel group walks all of T in registers
      {1, 1, false},   // ... scalar
      {2, 3, true},    // three segments, two chunks per tile
      {0, 7, true},    // seven segments, automatic tiles
      {0, 256, true},  // as many segments as the kernels allow
      {256, 1, false}, // widest tile along time
  };
  for (ScanOp op : kAllScanOps) {
    for (DType dtype : {DType::f32, DType::bf16}) {
      for (const ShapeCase shape : {ShapeCase{2, 1000, 64}, ShapeCase{1, 4097, 8}, ShapeCase{3, 33, 12}}) {
        for (const Forced& f : layouts) {
          ScanCase c = stateful_case(op, dtype, shape);
          ScanLaunchOptions options;
          options.time_chunks = f.chunks;
          options.segments = f.segments;
          options.allow_vectorized = f.vectorized;
          check_case(c, options);
        }
      }
    }
  }
}

TEST_CASE("misaligned tensors take the scalar path with the same results", "[gpu][scan]") {
  for (ScanOp op : kAllScanOps) {
    for (DType dtype : {DType::f32, DType::f16, DType::bf16}) {
      ScanCase c = stateful_case(op, dtype, {64, 70, 256});  // enough channels for the vector path
      auto aligned = std::make_shared<ChosenLayouts>();
      check_case(c, {}, aligned);
      CHECK(aligned->forward.vector_width == 4);
      CHECK(aligned->backward.vector_width == 4);

      c.misalign_elements = 1;
      auto misaligned = std::make_shared<ChosenLayouts>();
      check_case(c, {}, misaligned);
      CHECK(misaligned->forward.vector_width == 1);
      CHECK(misaligned->backward.vector_width == 1);
    }
  }
}

TEST_CASE("optional outputs may be absent and state tensors may use the sequence dtype", "[gpu][scan]") {
  for (ScanOp op : kAllScanOps) {
    for (DType dtype : {DType::f32, DType::f16, DType::bf16}) {
      ScanCase c = stateful_case(op, dtype, {3, 45, 20});
      c.write_h_final = false;
      c.write_grad_h0 = false;
      check_case(c, {});

      c.write_h_final = true;
      c.write_grad_h0 = true;
      c.state_dtype = dtype;
      check_case(c, {});

      c.with_h0 = false;  // gradient of an implicit zero state, in the sequence dtype
      c.with_grad_h_final = false;
      check_case(c, {});
    }
  }
}

TEST_CASE("long-memory inputs carry state and gradients across every segment", "[gpu][scan]") {
  for (ScanOp op : kAllScanOps) {
    for (DType dtype : {DType::f32, DType::bf16}) {
      for (const ShapeCase shape : {ShapeCase{2, 20000, 64}, ShapeCase{1, 3000, 8}}) {
        if (!within_test_size(shape)) continue;
        for (int segments : {0, 3, 40}) {
          ScanCase c = stateful_case(op, dtype, shape);
          c.regime = InputRegime::long_memory;
          ScanLaunchOptions options;
          options.segments = segments;
          auto chosen = std::make_shared<ChosenLayouts>();
          check_case(c, options, chosen);
          CHECK(chosen->backward.segments > 1);
        }
      }
    }
  }
}
