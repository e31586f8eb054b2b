// The launch planner: every plan covers the whole problem within the
// kernels' limits, and it picks the path the kernels were designed for at
// the shapes that matter.
#include <catch2/catch.hpp>

#include <random>

#include "scan/scan_config.h"
#include "scan/scan_launch.h"

using namespace exphil::kernels;

namespace {

void check_covers(const ScanPlan& plan, const ScanShape& shape, ScanDirection direction) {
  INFO("B " << shape.batch << " T " << shape.steps << " H " << shape.width << ": vec "
            << plan.vector_width << " lanes " << plan.lanes << " chunks " << plan.time_chunks
            << " segments " << plan.segments << " segment_steps " << plan.segment_steps);
  const int steps_per_thread =
      direction == ScanDirection::forward ? kForwardStepsPerThread : kBackwardStepsPerThread;
  CHECK(plan.steps_per_thread == steps_per_thread);
  CHECK(plan.lanes >= 1);
  CHECK(plan.time_chunks >= 1);
  CHECK(plan.lanes * plan.time_chunks <= kScanMaxBlockThreads);
  CHECK(plan.lane_groups * plan.lanes * plan.vector_width >= shape.width);
  CHECK((plan.lane_groups - 1) * plan.lanes * plan.vector_width < shape.width);
  CHECK(plan.segment_steps % (static_cast<int64_t>(plan.time_chunks) * steps_per_thread) == 0);
  CHECK(static_cast<int64_t>(plan.segments) * plan.segment_steps >= shape.steps);
  CHECK(static_cast<int64_t>(plan.segments - 1) * plan.segment_steps < shape.steps);
  CHECK(plan.segments >= 1);
  CHECK(plan.segments <= kMaxSegments);
  CHECK(scan_plan_unsupported(plan, shape) == nullptr);
  CHECK(scan_workspace_bytes(plan, shape) ==
        (plan.segments > 1 ? 2u * plan.segments * shape.batch * shape.width * sizeof(float) : 0u));
}

}  // namespace

TEST_CASE("scan plans cover every shape within the kernels' limits", "[plan]") {
  std::mt19937_64 rng(12345);
  std::uniform_int_distribution<int> log_dist(0, 17);
  for (int i = 0; i < 2000; ++i) {
    auto draw = [&](int max_log) {
      const int64_t hi = int64_t{1} << (log_dist(rng) % (max_log + 1));
      return std::uniform_int_distribution<int64_t>(1, hi)(rng);
    };
    const ScanShape shape{draw(8), draw(17), draw(12)};
    for (ScanDirection dir : {ScanDirection::forward, ScanDirection::backward}) {
      for (bool vec : {true, false}) {
        exphil::ScanLaunchOptions options;
        if (i % 3 == 1) options.segments = 1 + i % 300;
        if (i % 5 == 2) options.time_chunks = 1 + i % 40;
        check_covers(plan_scan(dir, shape, vec && shape.width % kScanVectorWidth == 0, 132, options),
                     shape, dir);
      }
    }
  }
}

TEST_CASE("scan plans pick one pass when B x H fills the GPU and segments when it cannot", "[plan]") {
  const exphil::ScanLaunchOptions defaults;
  // Training shape: 64 x 512 channels fill 132 SMs; one pass, no workspace.
  const ScanPlan training = plan_scan(ScanDirection::forward, {64, 256, 512}, true, 132, defaults);
  CHECK(training.segments == 1);
  CHECK(training.vector_width == kScanVectorWidth);
  // Inference shape: one tile covers all of T = 32.
  const ScanPlan inference = plan_scan(ScanDirection::forward, {1, 32, 256}, true, 132, defaults);
  CHECK(inference.segments == 1);
  CHECK(static_cast<int64_t>(inference.time_chunks) * inference.steps_per_thread >= 32);
  // One streaming step: no threads along time.
  CHECK(plan_scan(ScanDirection::forward, {1, 1, 256}, true, 132, defaults).time_chunks == 1);
  // Long sequence, few channels: split time across blocks.
  const ScanPlan long_seq = plan_scan(ScanDirection::backward, {1, 65536, 256}, true, 132, defaults);
  CHECK(long_seq.segments > 1);
  // Forced options are honoured within limits.
  exphil::ScanLaunchOptions forced;
  forced.segments = 3;
  forced.time_chunks = 2;
  forced.allow_vectorized = false;
  const ScanPlan f = plan_scan(ScanDirection::forward, {2, 1000, 64}, true, 132, forced);
  CHECK(f.segments == 3);
  CHECK(f.time_chunks == 2);
  CHECK(f.vector_width == 1);
}
