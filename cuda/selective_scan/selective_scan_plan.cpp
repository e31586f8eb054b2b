// Chooses the launch layout of a selective-scan call.
//
// Across N: 4 states per thread (2 for short forward calls with N <= 32),
// kSsMinSlices to kSsMaxSlices warps per block, then state groups. Across D: 32 channels per block. Along T: one chunk when
// B x channel blocks x state groups already fill the GPU; otherwise chunks
// of at least kSsMinChunkSteps, run in parallel and stitched together by a
// carry pass. The backward's chunks are also bounded by the checkpoints it
// keeps in shared memory.
#include <algorithm>
#include <cstdint>
#include <limits>

#include "selective_scan/selective_scan_config.h"
#include "selective_scan/selective_scan_launch.h"
#include "selective_scan/selective_scan_shared_memory.h"

namespace exphil::kernels {
namespace {

int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }
int64_t round_up(int64_t a, int64_t b) { return ceil_div(a, b) * b; }

}  // namespace

SelectiveScanPlan plan_selective_scan(SelectiveScanDirection direction,
                                      const SelectiveScanShape& shape, int sm_count,
                                      long long chunk_steps, bool mean_input_scale) noexcept {
  SelectiveScanPlan plan;
  sm_count = std::max(sm_count, 1);
  const int64_t all_slices = ceil_div(shape.states, kSsStatesPerThread);
  const bool backward = direction == SelectiveScanDirection::backward;
  plan.state_groups = static_cast<int>(ceil_div(all_slices, kSsMaxSlices));
  plan.slices = static_cast<int>(
      std::max<int64_t>(kSsMinSlices, ceil_div(all_slices, plan.state_groups)));
  plan.channel_groups = ceil_div(shape.channels, kSsChannelsPerBlock);

  // Longest backward chunk whose stage checkpoints fit their budget.
  const int64_t checkpoint_tiles = selective_scan_checkpoint_budget(plan.slices) /
                                   selective_scan_checkpoint_bytes(plan.slices, kSsBackwardStage);
  const int64_t max_chunk = backward ? std::max<int64_t>(kSsBackwardStage,
                                                         checkpoint_tiles * kSsBackwardStage)
                                     : std::numeric_limits<int64_t>::max();

  int64_t steps_per_chunk = 0;
  if (chunk_steps > 0) {
    steps_per_chunk = round_up(chunk_steps, kSsForwardTile);
  } else {
    const int64_t blocks = shape.batch * plan.channel_groups * plan.state_groups;
    int64_t chunks = 1;
    if (blocks < 2 * static_cast<int64_t>(sm_count))
      chunks = std::min(ceil_div(2 * static_cast<int64_t>(sm_count), blocks),
                        std::max<int64_t>(1, shape.steps / kSsMinChunkSteps));
    steps_per_chunk = round_up(ceil_div(shape.steps, chunks), kSsForwardTile);
  }
  steps_per_chunk = std::min(steps_per_chunk, max_chunk);
  // One chunk needs no more than T rounded to the tile.
  steps_per_chunk = std::min(steps_per_chunk, round_up(shape.steps, kSsForwardTile));
  plan.chunk_steps = steps_per_chunk;
  const int64_t chunks = ceil_div(shape.steps, steps_per_chunk);
  plan.chunks = static_cast<int>(std::min<int64_t>(chunks, std::numeric_limits<int>::max()));

  // A short forward (one chunk, few blocks) is bound by the serial latency
  // of each thread's instructions, not by throughput: two states per thread
  // halve each thread's work per step for twice the threads.
  if (!backward && plan.chunks == 1 && shape.states <= 2 * kSsMaxSlices &&
      shape.batch * plan.channel_groups < sm_count) {
    plan.states_per_thread = 2;
    plan.slices = static_cast<int>(std::max<int64_t>(kSsMinSlices, ceil_div(shape.states, 2)));
    plan.state_groups = 1;
  }

  // Workspace, in floats, each region 16-byte aligned.
  const int64_t B = shape.batch, T = shape.steps, D = shape.channels, N = shape.states;
  int64_t offset = 0;
  auto region = [&offset](int64_t floats) {
    const int64_t at = offset;
    offset += round_up(floats, 4);
    return at;
  };
  plan.ws_carry = plan.ws_carry_grad = plan.ws_delta_sum = plan.ws_group_sums = -1;
  plan.ws_proj = plan.ws_params = -1;
  if (plan.chunks > 1) {
    plan.ws_carry = region(B * plan.chunks * D * N);
    plan.ws_delta_sum = region(B * plan.chunks * D);
    if (backward) plan.ws_carry_grad = region(B * plan.chunks * D * N);
  }
  if (plan.state_groups > 1) plan.ws_group_sums = region((backward ? 3 : 1) * plan.state_groups * B * T * D);
  if (backward) {
    plan.ws_proj = region(2 * B * T * plan.channel_groups * N);
    plan.ws_params = region(B * plan.chunks * D * (N + 2));
  }
  if (mean_input_scale && !backward) plan.ws_input_scale = region(B * T);
  plan.ws_floats = offset;
  return plan;
}

const char* selective_scan_unsupported(const SelectiveScanPlan& plan,
                                       const SelectiveScanShape& shape) noexcept {
  if (shape.states > kSsMaxStates) return "N is larger than 256";
  if (plan.slices > kSsMaxSlices) return "more state slices than a block holds";
  if (plan.chunks > kSsMaxChunks)
    return "T needs more than 65535 chunks (the grid's y dimension)";
  if (shape.batch * plan.channel_groups * plan.state_groups > std::numeric_limits<int32_t>::max())
    return "B x ceil(D / 32) x state groups exceeds the 2^31 - 1 blocks of a grid";
  return nullptr;
}

int selective_scan_kernel_count(SelectiveScanDirection direction,
                                const SelectiveScanPlan& plan) noexcept {
  int kernels = 1;                          // the scan itself
  if (plan.ws_input_scale >= 0) kernels += 1;  // the channel means of delta
  if (plan.chunks > 1) kernels += 2;        // chunk aggregates, carry
  if (plan.state_groups > 1) kernels += 1;  // sums over state groups
  if (direction == SelectiveScanDirection::backward) kernels += 1;  // parameter sums
  return kernels;
}

}  // namespace exphil::kernels
