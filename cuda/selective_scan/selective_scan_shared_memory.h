// Dynamic shared memory of the selective-scan kernels, for the launchers and
// the planner (host code; the kernels lay the same arrays out in order).
#pragma once

#include <algorithm>
#include <cstdint>

#include "selective_scan/selective_scan_config.h"

namespace exphil::kernels {

// The forward: x, delta, gate [L][32]; B, C [L][states per block]; the
// per-slice sums [L][slices][32]; with the channel-mean input scale, that
// scale [L].
constexpr int64_t selective_scan_forward_shared_bytes(int slices, int states_per_thread,
                                                      bool mean_scale = false) {
  return int64_t{4} * kSsForwardTile *
         (3 * kSsChannelsPerBlock + 2 * states_per_thread * slices +
          slices * kSsChannelsPerBlock + (mean_scale ? 1 : 0));
}

// The backward's arrays besides its checkpoints: x, delta, slope, dy', the
// gate factor [16][32]; B, C [16][nb]; dB, dC [8][nb]; the per-slice sums
// of dx, d delta and (with_y, only when dz is wanted) C h [8][slices][32];
// the per-slice sums of dD and d bias [2][slices][32].
constexpr int64_t selective_scan_backward_tile_bytes(int slices, bool with_y) {
  const int nb = kSsStatesPerThread * slices;
  return int64_t{4} * (kSsBackwardStage * (5 * kSsChannelsPerBlock + 2 * nb) +
                       kSsBackwardTile * (2 * nb + (with_y ? 3 : 2) * slices * kSsChannelsPerBlock) +
                       2 * slices * kSsChannelsPerBlock);
}

// One fp32 state per thread and 16-step stage of the chunk.
constexpr int64_t selective_scan_checkpoint_bytes(int slices, int64_t chunk_steps) {
  return (chunk_steps + kSsBackwardStage - 1) / kSsBackwardStage * kSsChannelsPerBlock * slices *
         kSsStatesPerThread * 4;
}

// What the checkpoints may take: kSsCheckpointBytes, less where the tile
// arrays of wide blocks would push the total past kSsMaxSharedBytes.
constexpr int64_t selective_scan_checkpoint_budget(int slices) {
  return std::min<int64_t>(kSsCheckpointBytes,
                           kSsMaxSharedBytes - selective_scan_backward_tile_bytes(slices, true));
}

}  // namespace exphil::kernels
