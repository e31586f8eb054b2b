// Chooses the launch layout of a scan call (see scan_forward.cuh for what
// each field means to the kernels).
//
// Goals, in order: coalesced loads across the width (a warp spans up to 32
// channel groups); vector access only when B x H is large enough to be
// bandwidth-bound; enough threads along time that short inputs finish in one
// tile; and, when B x H alone gives fewer blocks than the GPU has SMs, time
// segments across blocks, at the price of reading the inputs twice, but only
// when each segment still spans kMinTilesPerSegment tiles.
#include <algorithm>
#include <cstdint>
#include <limits>

#include "scan/scan_config.h"
#include "scan/scan_launch.h"

namespace exphil::kernels {
namespace {

int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

int pow2_ceil(int64_t x, int cap) {
  int p = 1;
  while (p < x && p < cap) p *= 2;
  return p;
}

int pow2_floor(int x) {
  int p = 1;
  while (p * 2 <= x) p *= 2;
  return p;
}

}  // namespace

ScanPlan plan_scan(ScanDirection direction, const ScanShape& shape, bool vectorizable,
                   int sm_count, const ScanLaunchOptions& options) noexcept {
  ScanPlan plan;
  sm_count = std::max(sm_count, 1);
  // Vector access saves instructions per byte, which matters only when B x H
  // can keep the memory system busy; below that, time is the serial work of
  // one thread, and one channel per thread divides it by the vector width.
  const bool enough_channels = shape.batch * shape.width > kScalarChannelsPerSM * int64_t{sm_count};
  plan.vector_width =
      vectorizable && options.allow_vectorized && enough_channels ? kScanVectorWidth : 1;
  plan.steps_per_thread =
      direction == ScanDirection::forward ? kForwardStepsPerThread : kBackwardStepsPerThread;

  const int64_t channel_groups = ceil_div(shape.width, plan.vector_width);
  const int max_lanes = pow2_ceil(channel_groups, kScanMaxBlockThreads);
  int lanes = std::min(max_lanes, 32);
  int chunks = options.time_chunks > 0
                   ? pow2_floor(options.time_chunks)
                   : pow2_ceil(ceil_div(shape.steps, plan.steps_per_thread), kScanMaxBlockThreads);
  chunks = std::min(chunks, kScanMaxBlockThreads / lanes);

  // Short sequences leave blocks thin along time; with blocks to spare,
  // widen them across the width to keep whole warps busy.
  while (lanes * chunks < 128 && lanes < max_lanes &&
         shape.batch * ceil_div(channel_groups, 2 * lanes) >= 4 * static_cast<int64_t>(sm_count)) {
    lanes *= 2;
  }
  plan.lanes = lanes;
  plan.time_chunks = chunks;
  plan.lane_groups = ceil_div(channel_groups, lanes);

  const int64_t blocks = shape.batch * plan.lane_groups;
  const int64_t tile = static_cast<int64_t>(chunks) * plan.steps_per_thread;
  const int64_t tiles = ceil_div(shape.steps, tile);
  int64_t segments = 1;
  if (options.segments > 0) {
    segments = options.segments;
  } else if (blocks < sm_count) {
    segments = std::min(ceil_div(2 * static_cast<int64_t>(sm_count), blocks),
                        tiles / kMinTilesPerSegment);
  }
  segments = std::clamp<int64_t>(segments, 1, std::min<int64_t>(tiles, kMaxSegments));
  plan.segment_steps = ceil_div(tiles, segments) * tile;
  plan.segments = static_cast<int>(ceil_div(shape.steps, plan.segment_steps));
  return plan;
}

const char* scan_plan_unsupported(const ScanPlan& plan, const ScanShape& shape) noexcept {
  if (plan.lanes * plan.time_chunks > kScanMaxBlockThreads)
    return "block larger than the kernels' launch bound";
  if (shape.batch * plan.lane_groups > std::numeric_limits<int32_t>::max())
    return "B x ceil(H / (vector width x lanes)) exceeds the 2^31 - 1 blocks of a grid";
  if (plan.segments > kMaxSegments) return "more time segments than the kernels combine";
  return nullptr;
}

std::size_t scan_workspace_bytes(const ScanPlan& plan, const ScanShape& shape) noexcept {
  if (plan.segments <= 1) return 0;
  return 2u * static_cast<std::size_t>(plan.segments) * static_cast<std::size_t>(shape.batch) *
         static_cast<std::size_t>(shape.width) * sizeof(float);
}

int scan_kernel_count(const ScanPlan& plan) noexcept { return plan.segments > 1 ? 2 : 1; }

}  // namespace exphil::kernels
