// Every op and dtype against the double reference, forward and backward, on
// the shape grid of the issue: T in {1, 2, 31, 32, 33, 257, 4097, 65536},
// H in {1, 7, 256, 513}, B in {1, 3, 64}, each value paired with several
// others (the full product would be 8 GB at its corner), with and without
// h0 and a final-state gradient. The long shapes must take the segmented
// path, so both paths are covered by construction, not by luck.
#include <catch2/catch.hpp>

#include <cstdio>
#include <string>
#include <vector>

#include "cpp_runner.hpp"
#include "scan_harness.hpp"

using namespace exphil;
using namespace exphil::test;

namespace {

const std::vector<ShapeCase>& sweep_shapes() {
  static const std::vector<ShapeCase> shapes = {
      {1, 1, 1},      {3, 1, 7},      {64, 1, 256},    {1, 1, 513},   {64, 1, 513},
      {1, 2, 256},    {3, 2, 513},    {64, 2, 7},      {1, 2, 1},
      {1, 31, 7},     {3, 31, 256},   {64, 31, 513},   {1, 31, 1},
      {1, 32, 256},   {3, 32, 513},   {64, 32, 7},     {1, 32, 1},
      {1, 33, 513},   {3, 33, 1},     {64, 33, 256},   {3, 33, 7},
      {1, 257, 256},  {3, 257, 7},    {64, 257, 256},  {1, 257, 1},  {3, 257, 513},
      {1, 4097, 7},   {3, 4097, 513}, {1, 4097, 256},  {64, 4097, 1},
      {1, 65536, 1},  {3, 65536, 7},  {1, 65536, 256},
  };
  return shapes;
}

void sweep(ScanOp op, DType dtype, bool backward_without_b = false) {
  struct Variant {
    bool h0, grad_final;
    bool state_in_sequence_dtype;
  };
  std::vector<Variant> variants = {{false, false, false}, {true, true, false}};
  if (dtype != DType::f32) variants.push_back({true, true, true});
  double worst = 0.0;
  std::string worst_case;
  int cases = 0;

  for (const ShapeCase& shape : sweep_shapes()) {
    if (!within_test_size(shape)) continue;
    for (const Variant& v : variants) {
      // The largest shape once per dtype is enough; it dominates the run time.
      if (shape.batch * shape.steps * shape.width > (int64_t{1} << 22) && v.state_in_sequence_dtype)
        continue;
      ScanCase c;
      c.op = op;
      c.dtype = dtype;
      c.shape = shape;
      c.with_h0 = v.h0;
      c.with_grad_h_final = v.grad_final;
      c.state_dtype = v.state_in_sequence_dtype ? dtype : DType::f32;
      c.backward_without_b = backward_without_b;
      auto chosen = std::make_shared<ChosenLayouts>();
      const ScanCheck check = run_scan_case(c, cpp_runner(nullptr, {}, chosen), test_seed());
      INFO(describe_case(c) << "\nforward layout: vec " << chosen->forward.vector_width
                            << " lanes " << chosen->forward.lanes << " chunks "
                            << chosen->forward.time_chunks << " segments "
                            << chosen->forward.segments << "; backward segments "
                            << chosen->backward.segments << "\n"
                            << check.describe());
      CHECK(check.ok());
      ++cases;
      if (check.worst_ratio() > worst) {
        worst = check.worst_ratio();
        worst_case = describe_case(c);
      }
      if (shape.steps == 65536 && shape.width == 256) {
        CHECK(chosen->forward.segments > 1);
        CHECK(chosen->backward.segments > 1);
      }
      if (shape.steps == 32 && shape.batch == 1 && shape.width == 256) {
        CHECK(chosen->forward.segments == 1);
        CHECK(chosen->forward.vector_width == 1);  // too few channels for the vector path
      }
    }
  }
  // Margin report (error / allowed, 1 = at the tolerance) for bench/RESULTS.md.
  std::printf("sweep %s%s %s: %d cases, worst error/allowed %.3g at %s\n", scan_op_name(op),
              backward_without_b ? " (backward without b)" : "", dtype_name(dtype), cases, worst,
              worst_case.c_str());
}

}  // namespace

#define SCAN_SWEEP_TEST(OP, DT)                                                             \
  TEST_CASE(#OP " " #DT ": forward and backward match the reference on the shape grid", \
            "[gpu][scan]") {                                                                \
    sweep(ScanOp::OP, DType::DT);                                                           \
  }

SCAN_SWEEP_TEST(linear_scan, f32)
SCAN_SWEEP_TEST(linear_scan, f16)
SCAN_SWEEP_TEST(linear_scan, bf16)
SCAN_SWEEP_TEST(min_gru, f32)
SCAN_SWEEP_TEST(min_gru, f16)
SCAN_SWEEP_TEST(min_gru, bf16)
SCAN_SWEEP_TEST(min_lstm, f32)
SCAN_SWEEP_TEST(min_lstm, f16)
SCAN_SWEEP_TEST(min_lstm, bf16)
SCAN_SWEEP_TEST(liquid, f32)
SCAN_SWEEP_TEST(liquid, f16)
SCAN_SWEEP_TEST(liquid, bf16)
SCAN_SWEEP_TEST(min_gru_activated, f32)
SCAN_SWEEP_TEST(min_gru_activated, f16)
SCAN_SWEEP_TEST(min_gru_activated, bf16)
SCAN_SWEEP_TEST(min_lstm_activated, f32)
SCAN_SWEEP_TEST(min_lstm_activated, f16)
SCAN_SWEEP_TEST(min_lstm_activated, bf16)
SCAN_SWEEP_TEST(diag_linear, f32)
SCAN_SWEEP_TEST(diag_linear, f16)
SCAN_SWEEP_TEST(diag_linear, bf16)
SCAN_SWEEP_TEST(elu_gru, f32)
SCAN_SWEEP_TEST(elu_gru, f16)
SCAN_SWEEP_TEST(elu_gru, bf16)

// linear_scan's backward without b reads every state from y (the kernel's
// kStatesFromY), on the same grid, segmented path included.
#define SCAN_SWEEP_WITHOUT_B_TEST(DT)                                                        \
  TEST_CASE("linear_scan " #DT ": the backward without b matches the reference on the shape " \
            "grid",                                                                           \
            "[gpu][scan]") {                                                                  \
    sweep(ScanOp::linear_scan, DType::DT, true);                                              \
  }

SCAN_SWEEP_WITHOUT_B_TEST(f32)
SCAN_SWEEP_WITHOUT_B_TEST(f16)
SCAN_SWEEP_WITHOUT_B_TEST(bf16)
