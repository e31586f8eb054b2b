// The selective-scan planner: every plan covers the whole problem within
// the kernels' limits (threads, shared memory, grid), and the shapes that
// matter take the layout the kernels were designed for.
#include <catch2/catch.hpp>

#include "selective_scan/selective_scan_config.h"
#include "selective_scan/selective_scan_launch.h"
#include "selective_scan/selective_scan_shared_memory.h"

using namespace exphil::kernels;

namespace {

constexpr int kH100SMs = 132;

void check_covers(const SelectiveScanPlan& plan, const SelectiveScanShape& s,
                  SelectiveScanDirection direction) {
  const bool backward = direction == SelectiveScanDirection::backward;
  INFO((backward ? "backward" : "forward")
       << " B " << s.batch << " T " << s.steps << " D " << s.channels << " N " << s.states
       << ": states/thread " << plan.states_per_thread << " slices " << plan.slices
       << " groups " << plan.state_groups << " chunks " << plan.chunks << " x "
       << plan.chunk_steps);
  CHECK(selective_scan_unsupported(plan, s) == nullptr);
  CHECK((plan.states_per_thread == 4 || (!backward && plan.states_per_thread == 2)));
  CHECK(plan.slices >= kSsMinSlices);
  CHECK(plan.slices <= kSsMaxSlices);
  // Every state is covered, by as few groups as the block allows.
  const int64_t per_block = static_cast<int64_t>(plan.states_per_thread) * plan.slices;
  CHECK(per_block * plan.state_groups >= s.states);
  CHECK(per_block * (plan.state_groups - 1) < s.states);
  CHECK(plan.channel_groups * kSsChannelsPerBlock >= s.channels);
  CHECK((plan.channel_groups - 1) * kSsChannelsPerBlock < s.channels);
  // Chunks tile T in whole forward tiles.
  CHECK(plan.chunk_steps % kSsForwardTile == 0);
  CHECK(static_cast<int64_t>(plan.chunks) * plan.chunk_steps >= s.steps);
  CHECK(static_cast<int64_t>(plan.chunks - 1) * plan.chunk_steps < s.steps);
  if (backward) {
    // The stage checkpoints of a chunk fit their shared-memory budget, and
    // the block's whole shared memory what every target GPU allows.
    const int64_t stages = (plan.chunk_steps + kSsBackwardStage - 1) / kSsBackwardStage;
    CHECK(stages * kSsChannelsPerBlock * plan.slices * kSsStatesPerThread * 4 <=
          kSsCheckpointBytes);
    CHECK(selective_scan_backward_tile_bytes(plan.slices, true) +
              selective_scan_checkpoint_bytes(plan.slices, plan.chunk_steps) <=
          kSsMaxSharedBytes);
  } else {
    CHECK(selective_scan_forward_shared_bytes(plan.slices, plan.states_per_thread, true) <=
          48 * 1024);
  }
  if (plan.chunks > 1) CHECK(plan.ws_carry >= 0);
  if (plan.state_groups > 1) CHECK(plan.ws_group_sums >= 0);
  CHECK(plan.ws_floats >= 0);
}

}  // namespace

TEST_CASE("selective-scan plans cover every shape within the kernels' limits", "[plan]") {
  for (auto direction : {SelectiveScanDirection::forward, SelectiveScanDirection::backward})
    for (int64_t b : {1, 3, 64})
      for (int64_t t : {1, 2, 31, 33, 200, 2049, 65536})
        for (int64_t d : {1, 5, 512})
          for (int64_t n : {1, 16, 17, 64, 100, 256})
            for (long long forced : {0LL, 1LL, 48LL}) {
              const SelectiveScanShape s{b, t, d, n};
              check_covers(plan_selective_scan(direction, s, kH100SMs, forced), s, direction);
            }
}

TEST_CASE("selective-scan plans for the user's shapes", "[plan]") {
  // Inference: one short chunk, two states per thread for latency.
  const SelectiveScanShape inference{1, 32, 512, 16};
  const auto fwd = plan_selective_scan(SelectiveScanDirection::forward, inference, kH100SMs, 0);
  CHECK(fwd.chunks == 1);
  CHECK(fwd.states_per_thread == 2);
  CHECK(selective_scan_kernel_count(SelectiveScanDirection::forward, fwd) == 1);
  // Training: enough blocks without chunks; the backward's checkpoints hold
  // all 256 steps, so it needs no aggregate pass.
  const SelectiveScanShape training{32, 256, 512, 16};
  const auto train_fwd =
      plan_selective_scan(SelectiveScanDirection::forward, training, kH100SMs, 0);
  const auto train_bwd =
      plan_selective_scan(SelectiveScanDirection::backward, training, kH100SMs, 0);
  CHECK(train_fwd.chunks == 1);
  CHECK(train_fwd.states_per_thread == 4);
  CHECK(train_bwd.chunks == 1);
  CHECK(selective_scan_kernel_count(SelectiveScanDirection::backward, train_bwd) == 2);
  // A long sequence with few channels is cut into chunks to fill the GPU.
  const SelectiveScanShape long_seq{1, 65536, 512, 16};
  CHECK(plan_selective_scan(SelectiveScanDirection::forward, long_seq, kH100SMs, 0).chunks > 1);
  // N = 256 takes four state groups of 64.
  const auto wide = plan_selective_scan(SelectiveScanDirection::forward, {2, 33, 5, 256}, kH100SMs, 0);
  CHECK(wide.state_groups == 4);
  CHECK(wide.slices == kSsMaxSlices);
}

TEST_CASE("selective-scan planner refuses what the kernels cannot run", "[plan]") {
  const SelectiveScanShape too_wide{1, 8, 4, 257};
  CHECK(selective_scan_unsupported(
            plan_selective_scan(SelectiveScanDirection::forward, too_wide, kH100SMs, 0),
            too_wide) != nullptr);
}

TEST_CASE("selective_scan plan: the channel-mean input scale takes [B, T] of workspace and one "
          "kernel more, forward only",
          "[selective_scan]") {
  const SelectiveScanShape s{3, 200, 64, 16};
  for (long long chunk_steps : {0LL, 16LL}) {
    const auto usual = plan_selective_scan(SelectiveScanDirection::forward, s, kH100SMs, chunk_steps);
    const auto mean =
        plan_selective_scan(SelectiveScanDirection::forward, s, kH100SMs, chunk_steps, true);
    CHECK(usual.ws_input_scale == -1);
    REQUIRE(mean.ws_input_scale >= 0);
    CHECK(mean.ws_input_scale % 4 == 0);  // 16-byte aligned, as every region
    CHECK(mean.ws_input_scale + s.batch * s.steps <= mean.ws_floats);
    CHECK(mean.chunks == usual.chunks);
    CHECK(selective_scan_kernel_count(SelectiveScanDirection::forward, mean) ==
          selective_scan_kernel_count(SelectiveScanDirection::forward, usual) + 1);
    // The backward has no such mode: the flag changes nothing there.
    const auto backward =
        plan_selective_scan(SelectiveScanDirection::backward, s, kH100SMs, chunk_steps, true);
    CHECK(backward.ws_input_scale == -1);
  }
}
