// The gated-RNN planner (cuda/gated_rnn/gated_rnn_plan.cpp): units per
// block, batch tile, resident or streamed weights, workspace layout and the
// can-implement check, on the numbers of an H100 and an A100 (no GPU).
#include <catch2/catch.hpp>

#include <algorithm>
#include <cstdint>
#include <utility>
#include <vector>

#include "gated_rnn/gated_rnn_launch.h"

using namespace exphil::kernels;

namespace {

constexpr GatedRnnDevice kH100{132, 232448, 233472};
constexpr GatedRnnDevice kA100{108, 166912, 167936};

// Workspace pieces: 256-byte aligned, disjoint, inside the total.
void check_workspace(const GatedRnnPlan& p) {
  std::vector<std::pair<int64_t, int64_t>> pieces;  // offset, next offset
  const int64_t offsets[] = {p.ws_weights, p.ws_state, p.ws_exchange, p.ws_cell,
                             p.ws_rh,      p.ws_gates, p.ws_c};
  for (int64_t o : offsets)
    if (o >= 0) {
      CHECK(o % 64 == 0);
      pieces.push_back({o, 0});
    }
  std::sort(pieces.begin(), pieces.end());
  for (std::size_t i = 0; i + 1 < pieces.size(); ++i) CHECK(pieces[i].first < pieces[i + 1].first);
  if (!pieces.empty()) CHECK(pieces.back().first < p.ws_floats);
}

}  // namespace

TEST_CASE("gated RNN plan: one block per SM, tiles, resident or streamed", "[gated_rnn][plan]") {
  for (GatedRnnCell cell : {GatedRnnCell::gru, GatedRnnCell::lstm})
    for (GatedRnnDirection dir : {GatedRnnDirection::forward, GatedRnnDirection::backward}) {
      const int G = gated_rnn_gates(cell);
      INFO("cell " << G << " gates, " << (dir == GatedRnnDirection::forward ? "forward" : "backward"));
      // B1 T32 H256 on an H100: 2 units per block, 128 blocks, resident.
      GatedRnnPlan p = plan_gated_rnn(dir, cell, {1, 32, 256}, kH100);
      CHECK(p.units_per_block == 2);
      CHECK(p.blocks == 128);
      CHECK(p.batch_tile == 1);
      CHECK(p.resident_weights);
      CHECK(gated_rnn_unsupported(p, cell, {1, 32, 256}, kH100) == nullptr);
      check_workspace(p);
      // Batch tiles are powers of two up to 32.
      CHECK(plan_gated_rnn(dir, cell, {5, 3, 37}, kH100).batch_tile == 8);
      // (The LSTM backward's 32 rows of 4 x 512 floats would not fit with its slice.)
      CHECK(plan_gated_rnn(dir, cell, {64, 256, 512}, kH100).batch_tile ==
            (dir == GatedRnnDirection::backward && cell == GatedRnnCell::lstm ? 16 : 32));
      GatedRnnLaunchOptions o;
      o.batch_tile = 3;
      CHECK(plan_gated_rnn(dir, cell, {5, 3, 37}, kH100, o).batch_tile == 4);
      // H = 1024: resident on an H100 (8 units per block).
      p = plan_gated_rnn(dir, cell, {2, 8, 1024}, kH100);
      CHECK(p.units_per_block == 8);
      CHECK(p.resident_weights);
      CHECK(p.shared_bytes <= kH100.max_shared_per_block);
      CHECK(gated_rnn_unsupported(p, cell, {2, 8, 1024}, kH100) == nullptr);
      // H = 2048 on an A100: the slices do not fit, streamed; still valid.
      p = plan_gated_rnn(dir, cell, {2, 8, 2048}, kA100);
      CHECK_FALSE(p.resident_weights);
      CHECK(p.ws_weights >= 0);
      CHECK(gated_rnn_unsupported(p, cell, {2, 8, 2048}, kA100) == nullptr);
      check_workspace(p);
      // Forced streamed.
      o = {};
      o.streamed_weights = true;
      p = plan_gated_rnn(dir, cell, {3, 4, 37}, kH100, o);
      CHECK_FALSE(p.resident_weights);
      check_workspace(p);
      // Too many columns per block: refused, with a reason.
      o = {};
      o.units_per_block = dir == GatedRnnDirection::forward ? 256 / G + 1 : 257;
      p = plan_gated_rnn(dir, cell, {1, 4, 600}, kH100, o);
      CHECK(gated_rnn_unsupported(p, cell, {1, 4, 600}, kH100) != nullptr);
      // Empty shapes: refused.
      CHECK(gated_rnn_unsupported(plan_gated_rnn(dir, cell, {0, 4, 8}, kH100), cell, {0, 4, 8},
                                  kH100) != nullptr);
    }
}
