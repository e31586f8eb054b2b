// The gated-RNN planner (cuda/gated_rnn/gated_rnn_plan.cpp): units per
// block, batch tile, resident or streamed weights, workspace layout (each
// cell's own states included) and the can-implement check, on the numbers
// of an H100 and an A100 (no GPU).
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <string>
#include <utility>
#include <vector>

#include "gated_rnn/gated_rnn_launch.h"
#include "gated_rnn/gated_rnn_pair_word.h"

using namespace exphil::kernels;
using exphil::DType;

namespace {

constexpr GatedRnnDevice kH100{132, 232448, 233472};
constexpr GatedRnnDevice kA100{108, 166912, 167936};

// Workspace pieces: 256-byte aligned, disjoint, inside the total.
void check_workspace(const GatedRnnPlan& p) {
  std::vector<std::pair<int64_t, int64_t>> pieces;  // offset, next offset
  const int64_t offsets[] = {p.ws_weights, p.ws_state, p.ws_exchange, p.ws_cell,
                             p.ws_rh,      p.ws_gates, p.ws_c,     p.ws_split};
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
  for (GatedRnnCell cell : {GatedRnnCell::gru, GatedRnnCell::lstm, GatedRnnCell::slstm})
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
      // Batch tiles are powers of two up to 32, no more than a group's rows.
      GatedRnnLaunchOptions o;
      o.batch_blocks = 1;
      CHECK(plan_gated_rnn(dir, cell, {5, 3, 37}, kH100, o).batch_tile == 8);
      CHECK(plan_gated_rnn(dir, cell, {64, 256, 512}, kH100, o).batch_tile == 32);
      o = {};
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

TEST_CASE("gated RNN plan: batch groups above 4 rows, fewer and wider slices", "[gated_rnn][plan]") {
  for (GatedRnnCell cell : {GatedRnnCell::gru, GatedRnnCell::lstm, GatedRnnCell::slstm})
    for (GatedRnnDirection dir : {GatedRnnDirection::forward, GatedRnnDirection::backward}) {
      const int G = gated_rnn_gates(cell);
      INFO("cell " << G << " gates, " << (dir == GatedRnnDirection::forward ? "forward" : "backward"));
      // B32 H256: 8 groups of 4 rows; 16 slices of 16 units.
      GatedRnnPlan p = plan_gated_rnn(dir, cell, {32, 64, 256}, kH100);
      CHECK(p.batch_blocks == 8);
      CHECK(p.batch_rows == 4);
      CHECK(p.batch_tile == 4);
      CHECK(p.units_per_block == 16);
      CHECK(p.unit_slices == 16);
      CHECK(p.blocks == 128);
      CHECK(p.stored_columns == G * 16);
      // 5 to 7 rows: one group (a group has at least 4); 8: two.
      CHECK(plan_gated_rnn(dir, cell, {7, 8, 256}, kH100).batch_blocks == 1);
      CHECK(plan_gated_rnn(dir, cell, {8, 8, 256}, kH100).batch_blocks == 2);
      // B64 H512: the GRU's 8 groups of 32 units (96 columns); the LSTMs'
      // 128 columns of 512 floats would not fit, so 4 groups of 16 units.
      p = plan_gated_rnn(dir, cell, {64, 256, 512}, kH100);
      CHECK(p.batch_blocks == (G == 3 ? 8 : 4));
      CHECK(p.units_per_block == (G == 3 ? 32 : 16));
      CHECK(p.unit_slices * p.batch_blocks <= kH100.sm_count);
      CHECK(p.resident_weights);
      // Up to 4 rows: one group.
      CHECK(plan_gated_rnn(dir, cell, {4, 8, 256}, kH100).batch_blocks == 1);
      // Asked for: the groups (none left empty) and units as given.
      GatedRnnLaunchOptions o;
      o.batch_blocks = 4;
      p = plan_gated_rnn(dir, cell, {10, 8, 256}, kH100, o);
      CHECK(p.batch_rows == 3);
      CHECK(p.batch_blocks == 4);
      o.batch_blocks = 8;  // 8 groups of 2 rows cover 10 rows with 5
      p = plan_gated_rnn(dir, cell, {10, 8, 256}, kH100, o);
      CHECK(p.batch_rows == 2);
      CHECK(p.batch_blocks == 5);
      CHECK(p.blocks == 5 * p.unit_slices);
      o = {};
      o.units_per_block = 16;
      p = plan_gated_rnn(dir, cell, {32, 8, 256}, kH100, o);
      CHECK(p.units_per_block == 16);
      CHECK(p.unit_slices == 16);
      CHECK(p.batch_blocks == 8);  // 132 / 16 SMs left per slice, rounded to a power of two
      // The backward's exchange holds every slice's part: [2, Su, B, H] words.
      if (dir == GatedRnnDirection::backward) {
        CHECK(p.ws_exchange >= 0);
        int64_t next = p.ws_floats;
        for (int64_t at : {p.ws_weights, p.ws_state, p.ws_cell, p.ws_rh, p.ws_gates, p.ws_c, p.ws_split})
          if (at > p.ws_exchange && at < next) next = at;
        CHECK(next - p.ws_exchange >= 2 * 2 * int64_t{16} * 32 * 256);
      }
    }
}

TEST_CASE("gated RNN plan: every shape's plan fits and is accepted", "[gated_rnn][plan]") {
  for (const GatedRnnDevice& device : {kH100, kA100})
    for (GatedRnnCell cell : {GatedRnnCell::gru, GatedRnnCell::lstm, GatedRnnCell::slstm})
      for (GatedRnnDirection dir : {GatedRnnDirection::forward, GatedRnnDirection::backward})
        for (int64_t B : {1, 2, 3, 5, 7, 8, 31, 32, 33, 64, 100, 256, 1000})
          for (int64_t H : {1, 7, 37, 64, 256, 511, 512, 1024, 2048}) {
            const GatedRnnShape shape{B, 5, H};
            INFO("B " << B << " H " << H << " gates " << gated_rnn_gates(cell) << " dir "
                      << static_cast<int>(dir) << " SMs " << device.sm_count);
            const GatedRnnPlan p = plan_gated_rnn(dir, cell, shape, device);
            CHECK(gated_rnn_unsupported(p, cell, shape, device) == nullptr);
            CHECK(p.blocks <= device.sm_count);
            CHECK(p.shared_bytes <= device.max_shared_per_block);
            CHECK(int64_t{p.batch_blocks - 1} * p.batch_rows < B);  // no empty group
            check_workspace(p);
          }
}

namespace {

// The floats from a piece's offset to the next piece (or the end).
int64_t room(const GatedRnnPlan& p, int64_t at) {
  int64_t next = p.ws_floats;
  for (int64_t o : {p.ws_weights, p.ws_state, p.ws_exchange, p.ws_cell, p.ws_rh, p.ws_gates, p.ws_c,
                    p.ws_split})
    if (o > at && o < next) next = o;
  return next - at;
}

}  // namespace

TEST_CASE("gated RNN plan: the cells' own states in the workspace", "[gated_rnn][plan]") {
  const GatedRnnShape shape{5, 7, 37};
  const int64_t B = shape.batch, T = shape.steps, H = shape.hidden;
  for (bool streamed : {false, true}) {
    GatedRnnLaunchOptions o;
    o.streamed_weights = streamed;
    INFO("streamed " << streamed);
    // GRU: h only.
    GatedRnnPlan p = plan_gated_rnn(GatedRnnDirection::forward, GatedRnnCell::gru, shape, kH100, o);
    CHECK(p.ws_cell < 0);
    p = plan_gated_rnn(GatedRnnDirection::backward, GatedRnnCell::gru, shape, kH100, o);
    CHECK(p.ws_cell < 0);
    CHECK(p.ws_c < 0);
    // LSTM: c (forward), every c_t and the dc carry (backward).
    p = plan_gated_rnn(GatedRnnDirection::forward, GatedRnnCell::lstm, shape, kH100, o);
    CHECK(room(p, p.ws_cell) >= B * H);
    p = plan_gated_rnn(GatedRnnDirection::backward, GatedRnnCell::lstm, shape, kH100, o);
    CHECK(room(p, p.ws_c) >= B * T * H);
    CHECK(room(p, p.ws_cell) >= B * H);
    // sLSTM: c, n, m (forward); every c_t, n_t and max's share, and the dc,
    // dn, dm carries (backward).
    p = plan_gated_rnn(GatedRnnDirection::forward, GatedRnnCell::slstm, shape, kH100, o);
    CHECK(room(p, p.ws_cell) >= 3 * B * H);
    CHECK(p.ws_c < 0);
    check_workspace(p);
    p = plan_gated_rnn(GatedRnnDirection::backward, GatedRnnCell::slstm, shape, kH100, o);
    CHECK(room(p, p.ws_gates) >= B * T * 4 * H);
    CHECK(room(p, p.ws_c) >= B * T * 3 * H);
    CHECK(room(p, p.ws_cell) >= 3 * B * H);
    CHECK(room(p, p.ws_state) >= B * H);
    CHECK(room(p, p.ws_rh) >= B * T * 4 * H);
    check_workspace(p);
    CHECK(gated_rnn_unsupported(p, GatedRnnCell::slstm, shape, kH100) == nullptr);
  }
  // A cell outside the enum is refused, with a reason.
  const auto unknown = static_cast<GatedRnnCell>(3);
  CHECK(gated_rnn_unsupported(plan_gated_rnn(GatedRnnDirection::forward, GatedRnnCell::lstm, shape, kH100),
                              unknown, shape, kH100) != nullptr);
}

TEST_CASE("gated RNN plan: the forward's unit-warps layout at small batches", "[gated_rnn][plan]") {
  constexpr GatedRnnDevice kRtx4090{128, 101376, 102400};
  GatedRnnLaunchOptions uw;
  uw.unit_warps = 1;
  for (GatedRnnCell cell : {GatedRnnCell::gru, GatedRnnCell::lstm, GatedRnnCell::slstm}) {
    const int G = gated_rnn_gates(cell);
    INFO("cell " << G << " gates");
    // Only when asked for.
    CHECK_FALSE(plan_gated_rnn(GatedRnnDirection::forward, cell, {1, 32, 256}, kH100).unit_warps);
    // B1 T32 H256 on an H100: a warp per unit, 2 a block, 128 blocks; only
    // the exchange in the workspace (the cell's state stays in registers).
    const GatedRnnShape b1{1, 32, 256};
    GatedRnnPlan p = plan_gated_rnn(GatedRnnDirection::forward, cell, b1, kH100, uw);
    CHECK(p.unit_warps);
    CHECK(p.units_per_block == 2);
    CHECK(p.threads == 64);
    CHECK(p.blocks == 128);
    CHECK(p.shared_bytes == 2 * G * 256 * 4);
    CHECK(p.ws_cell < 0);
    CHECK(room(p, p.ws_state) >= 2 * 2 * 256);
    check_workspace(p);
    CHECK(gated_rnn_unsupported(p, cell, b1, kH100) == nullptr);
    // Up to 4 rows, H not a multiple of 32 (columns padded to 64 floats).
    p = plan_gated_rnn(GatedRnnDirection::forward, cell, {4, 3, 37}, kH100, uw);
    CHECK(p.unit_warps);
    CHECK(p.batch_tile == 4);
    CHECK(p.shared_bytes == G * 64 * 4);
    // Not taken: 5 rows, the backward, forced off, streamed weights asked for.
    CHECK_FALSE(plan_gated_rnn(GatedRnnDirection::forward, cell, {5, 3, 37}, kH100, uw).unit_warps);
    CHECK_FALSE(plan_gated_rnn(GatedRnnDirection::backward, cell, b1, kH100, uw).unit_warps);
    GatedRnnLaunchOptions o;
    o.unit_warps = 0;
    p = plan_gated_rnn(GatedRnnDirection::forward, cell, b1, kH100, o);
    CHECK_FALSE(p.unit_warps);
    CHECK(p.threads == 256);
    o = uw;
    o.streamed_weights = true;
    CHECK_FALSE(plan_gated_rnn(GatedRnnDirection::forward, cell, b1, kH100, o).unit_warps);
    // More than 8 units a block (H = 2048 on 132 SMs), or columns beyond
    // shared memory (H = 1024 with 4 gates on an RTX 4090's 99 KB): the
    // block layout.
    CHECK_FALSE(plan_gated_rnn(GatedRnnDirection::forward, cell, {1, 4, 2048}, kH100, uw).unit_warps);
    p = plan_gated_rnn(GatedRnnDirection::forward, cell, {1, 4, 1024}, kRtx4090, uw);
    CHECK(p.unit_warps == (G == 3));
    CHECK(p.shared_bytes <= kRtx4090.max_shared_per_block);
    CHECK(gated_rnn_unsupported(p, cell, {1, 4, 1024}, kRtx4090) == nullptr);
    // Units per block chosen: 1 to 8 warps.
    o = uw;
    o.units_per_block = 1;
    p = plan_gated_rnn(GatedRnnDirection::forward, cell, b1, kH100, o);
    CHECK(p.unit_warps);
    CHECK(p.blocks == 256);
    CHECK(p.threads == 32);
    // A unit-warps plan stretched past its rows is refused, with a reason.
    CHECK(gated_rnn_unsupported(p, cell, {5, 32, 256}, kH100) != nullptr);
  }
}

TEST_CASE("gated RNN plan: the backward's products split when their tiles are few",
          "[gated_rnn][plan]") {
  for (GatedRnnCell cell : {GatedRnnCell::gru, GatedRnnCell::lstm}) {
    const int64_t G = gated_rnn_gates(cell);
    // B64 T256 H512: 5 x 12 (GRU) or 5 x 16 tiles of 128: splits fill 264 blocks.
    GatedRnnPlan p = plan_gated_rnn(GatedRnnDirection::backward, cell, {64, 256, 512}, kH100);
    CHECK(p.weight_grad_splits == (G == 3 ? 5 : 4));
    CHECK(room(p, p.ws_split) >= p.weight_grad_splits * 513 * G * 512);
    // Its launches: recompute, gates, walk, the split product and its reduction.
    GatedRnnBackwardParams wants_grad_R;
    int grad_R = 0;
    wants_grad_R.d_grad_R = &grad_R;
    CHECK(gated_rnn_kernel_count(GatedRnnDirection::backward, wants_grad_R, p) == 5);
    CHECK(gated_rnn_kernel_count(GatedRnnDirection::backward, GatedRnnBackwardParams{}, p) == 3);
    CHECK(p.recompute_splits == 1);  // its 128 x 12 (or 16) tiles fill the device
    // Short sequences: at least 8 steps of 16 a split, so none at B1 T32.
    // There the recompute product's 6 (or 8) tiles are split along H = 256
    // instead, 2 steps of 16 a split, its sums in the same buffer: 5
    // launches with grad_R (the recompute and its reduction, gates, walk,
    // grad_R), 4 without.
    p = plan_gated_rnn(GatedRnnDirection::backward, cell, {1, 32, 256}, kH100);
    CHECK(p.weight_grad_splits == 1);
    CHECK(p.recompute_splits == 8);
    CHECK(room(p, p.ws_split) >= 8 * 32 * G * 256);
    CHECK(gated_rnn_unsupported(p, cell, {1, 32, 256}, kH100) == nullptr);
    CHECK(gated_rnn_kernel_count(GatedRnnDirection::backward, wants_grad_R, p) == 5);
    CHECK(gated_rnn_kernel_count(GatedRnnDirection::backward, GatedRnnBackwardParams{}, p) == 4);
    check_workspace(p);
    // Split without its buffer: refused, with a reason.
    GatedRnnPlan broken = p;
    broken.ws_split = -1;
    CHECK(gated_rnn_unsupported(broken, cell, {1, 32, 256}, kH100) != nullptr);
    // H = 16: one step of k, nothing to split.
    CHECK(plan_gated_rnn(GatedRnnDirection::backward, cell, {1, 32, 16}, kH100).recompute_splits == 1);
    // Enough tiles already (H = 2048): none.
    CHECK(plan_gated_rnn(GatedRnnDirection::backward, cell, {4, 512, 2048}, kH100).weight_grad_splits == 1);
    // The forward has none.
    CHECK(plan_gated_rnn(GatedRnnDirection::forward, cell, {64, 256, 512}, kH100).ws_split < 0);
  }
}

TEST_CASE("gated RNN plan: the forward's k-split layout at B = 1", "[gated_rnn][plan]") {
  for (GatedRnnCell cell : {GatedRnnCell::gru, GatedRnnCell::lstm, GatedRnnCell::slstm}) {
    const int G = gated_rnn_gates(cell);
    INFO("cell " << G << " gates");
    // B1 T32 H256 on an H100: the default, the block layout's 128 slices of
    // 2 units, G*U columns in the 8-column instance; the sums' two buffers
    // in shared memory; only the exchange in the workspace.
    const GatedRnnShape b1{1, 32, 256};
    GatedRnnPlan p = plan_gated_rnn(GatedRnnDirection::forward, cell, b1, kH100);
    CHECK(p.k_split);
    CHECK_FALSE(p.unit_warps);
    CHECK(p.units_per_block == 2);
    CHECK(p.blocks == 128);
    CHECK(p.threads == 256);
    CHECK(p.stored_columns == 8);
    CHECK(p.shared_bytes == 2 * 8 * 8 * 4);
    CHECK(p.ws_cell < 0);
    CHECK(room(p, p.ws_state) >= 2 * 2 * 256);
    check_workspace(p);
    CHECK(gated_rnn_unsupported(p, cell, b1, kH100) == nullptr);
    // 16 columns: more units a block (4: 12 or 16 columns), or fewer
    // multiprocessors (an A100's 108: 3 units).
    GatedRnnLaunchOptions o;
    o.units_per_block = 4;
    p = plan_gated_rnn(GatedRnnDirection::forward, cell, b1, kH100, o);
    CHECK(p.k_split);
    CHECK(p.stored_columns == 16);
    CHECK(p.blocks == 64);
    p = plan_gated_rnn(GatedRnnDirection::forward, cell, b1, kA100);
    CHECK(p.k_split);
    CHECK(p.units_per_block == 3);
    CHECK(p.stored_columns == 16);
    CHECK(gated_rnn_unsupported(p, cell, b1, kA100) == nullptr);
    // Not taken: H above 256, columns past 16, two rows, the backward,
    // forced off, streamed weights or unit warps asked for.
    CHECK_FALSE(plan_gated_rnn(GatedRnnDirection::forward, cell, {1, 5, 257}, kH100).k_split);
    o.units_per_block = 8;
    CHECK_FALSE(plan_gated_rnn(GatedRnnDirection::forward, cell, b1, kH100, o).k_split);
    CHECK_FALSE(plan_gated_rnn(GatedRnnDirection::forward, cell, {2, 32, 256}, kH100).k_split);
    CHECK_FALSE(plan_gated_rnn(GatedRnnDirection::backward, cell, b1, kH100).k_split);
    o = {};
    o.k_split = 0;
    p = plan_gated_rnn(GatedRnnDirection::forward, cell, b1, kH100, o);
    CHECK_FALSE(p.k_split);
    CHECK(p.stored_columns == gated_rnn_padded_columns(2 * G));
    o = {};
    o.streamed_weights = true;
    CHECK_FALSE(plan_gated_rnn(GatedRnnDirection::forward, cell, b1, kH100, o).k_split);
    o = {};
    o.unit_warps = 1;
    p = plan_gated_rnn(GatedRnnDirection::forward, cell, b1, kH100, o);
    CHECK(p.unit_warps);
    CHECK_FALSE(p.k_split);
    // A k-split plan stretched past its one row, past 256 rows, or with
    // columns not its instance's, is refused, with a reason.
    p = plan_gated_rnn(GatedRnnDirection::forward, cell, b1, kH100);
    CHECK(gated_rnn_unsupported(p, cell, {2, 32, 256}, kH100) != nullptr);
    p.unit_slices = p.blocks = 129;  // covers H = 257
    CHECK(gated_rnn_unsupported(p, cell, {1, 32, 257}, kH100) != nullptr);
    p = plan_gated_rnn(GatedRnnDirection::forward, cell, b1, kH100);
    p.stored_columns = 16;
    CHECK(gated_rnn_unsupported(p, cell, b1, kH100) != nullptr);
  }
}

TEST_CASE("gated RNN plan: the forward's tensor-core product", "[gated_rnn][plan]") {
  // The k parts: the fewest that leave the busiest warp the fewest
  // fragments, within 2 m-tiles by 16 k-steps a warp.
  CHECK(gated_rnn_tc_k_parts(64, 512) == 2);    // 4 m-tiles, 32 k-steps: a tile by 16 steps
  CHECK(gated_rnn_tc_k_parts(96, 512) == 2);    // 6 m-tiles: 2 by 16 (4 parts would need 3)
  CHECK(gated_rnn_tc_k_parts(128, 512) == 2);   // 8 m-tiles: 2 by 16, all a warp holds
  CHECK(gated_rnn_tc_k_parts(128, 1024) == 0);  // 64 k-steps: more than 8 warps hold
  CHECK(gated_rnn_tc_k_parts(64, 1024) == 4);
  CHECK(gated_rnn_tc_k_parts(32, 2048) == 8);
  CHECK(gated_rnn_tc_k_parts(48, 16) == 1);     // one k-step: a warp a tile
  CHECK(gated_rnn_tc_k_parts(64, 520) == 0);    // H not a multiple of 16
  CHECK(gated_rnn_tc_k_parts(0, 512) == 0);
  for (GatedRnnCell cell : {GatedRnnCell::gru, GatedRnnCell::lstm, GatedRnnCell::slstm}) {
    const int G = gated_rnn_gates(cell);
    INFO("cell " << G << " gates");
    // B64 H512 in bf16: batch groups of 8 rows, slices of 32 units (G*U =
    // 96 or 128 columns, twice the CUDA-core layout's 16 units at the
    // LSTM's 4 gates: its slice need not fit in shared memory), 2 k parts;
    // shared memory only for h_{t-1} and the parts' sums.
    const GatedRnnShape b64{64, 256, 512};
    // The sequence's dtype and R's.
    constexpr GatedRnnDTypes bf16{DType::bf16, DType::bf16}, f16{DType::f16, DType::f16};
    constexpr GatedRnnDTypes bf16_f32r{DType::bf16, DType::f32};
    GatedRnnPlan p = plan_gated_rnn(GatedRnnDirection::forward, cell, b64, kH100, {}, bf16);
    CHECK(p.tensor_cores);
    CHECK(p.k_parts == 2);
    CHECK(p.units_per_block == 32);
    CHECK(p.batch_blocks == 8);
    CHECK(p.batch_tile == 8);
    CHECK(p.resident_weights);
    CHECK(p.ws_weights < 0);
    CHECK(p.shared_bytes == gated_rnn_tc_shared_floats(512, G * 32, 8, 2) * 4);
    CHECK(p.shared_bytes == (8 * 520 + 2 * 8 * (G * 32 + 4)) * 4);
    check_workspace(p);
    CHECK(room(p, p.ws_state) >= 2 * 2 * 64 * 512);
    if (cell != GatedRnnCell::gru) CHECK(room(p, p.ws_cell) >= (cell == GatedRnnCell::lstm ? 1 : 3) * 64 * 512);
    CHECK(gated_rnn_unsupported(p, cell, b64, kH100) == nullptr);
    CHECK(plan_gated_rnn(GatedRnnDirection::forward, cell, b64, kH100, {}, f16).tensor_cores);
    // Not taken: f32, R in another dtype than the sequence's, H not a
    // multiple of 16, B <= 4 unless asked, forced off, streamed weights,
    // the backward.
    CHECK_FALSE(plan_gated_rnn(GatedRnnDirection::forward, cell, b64, kH100).tensor_cores);
    CHECK_FALSE(plan_gated_rnn(GatedRnnDirection::forward, cell, b64, kH100, {}, bf16_f32r).tensor_cores);
    CHECK_FALSE(plan_gated_rnn(GatedRnnDirection::forward, cell, {64, 8, 520}, kH100, {}, bf16)
                    .tensor_cores);
    CHECK_FALSE(plan_gated_rnn(GatedRnnDirection::forward, cell, {4, 8, 512}, kH100, {}, bf16)
                    .tensor_cores);
    // B32 H256: groups of 8 rows would give a block 8 x 8 G x 256, a
    // sixteenth of B64 H512's product: the CUDA cores' layout (groups of 4).
    p = plan_gated_rnn(GatedRnnDirection::forward, cell, {32, 64, 256}, kH100, {}, bf16);
    CHECK_FALSE(p.tensor_cores);
    const GatedRnnPlan cuda_cores = plan_gated_rnn(GatedRnnDirection::forward, cell, {32, 64, 256}, kH100);
    CHECK(p.units_per_block == cuda_cores.units_per_block);
    CHECK(p.batch_blocks == cuda_cores.batch_blocks);
    CHECK(p.batch_tile == cuda_cores.batch_tile);
    CHECK(p.shared_bytes == cuda_cores.shared_bytes);
    // Groups of fewer than 8 rows: B5 to B15 run one group.
    CHECK(plan_gated_rnn(GatedRnnDirection::forward, cell, {12, 8, 1024}, kH100, {}, bf16)
              .tensor_cores);
    CHECK_FALSE(plan_gated_rnn(GatedRnnDirection::forward, cell, {7, 8, 1024}, kH100, {}, bf16)
                    .tensor_cores);
    GatedRnnLaunchOptions o;
    o.tensor_cores = 1;
    p = plan_gated_rnn(GatedRnnDirection::forward, cell, {4, 8, 512}, kH100, o, bf16);
    CHECK(p.tensor_cores);
    CHECK(p.batch_tile == 4);
    CHECK(p.shared_bytes == gated_rnn_tc_shared_floats(512, G * p.units_per_block, 4, p.k_parts) * 4);
    CHECK(gated_rnn_unsupported(p, cell, {4, 8, 512}, kH100) == nullptr);
    // One group of 64 rows (asked for): passes of 16, two instructions' rows.
    o.tensor_cores = 1;
    o.batch_blocks = 1;
    p = plan_gated_rnn(GatedRnnDirection::forward, cell, b64, kH100, o, bf16);
    CHECK(p.tensor_cores);
    CHECK(p.batch_tile == kGatedRnnTcMaxBatchTile);
    p.batch_tile = 32;
    CHECK(gated_rnn_unsupported(p, cell, b64, kH100) != nullptr);
    o = {};
    o.tensor_cores = 0;
    CHECK_FALSE(plan_gated_rnn(GatedRnnDirection::forward, cell, b64, kH100, o, bf16).tensor_cores);
    o = {};
    o.streamed_weights = true;
    CHECK_FALSE(plan_gated_rnn(GatedRnnDirection::forward, cell, b64, kH100, o, bf16).tensor_cores);
    CHECK_FALSE(plan_gated_rnn(GatedRnnDirection::backward, cell, b64, kH100, {}, bf16).tensor_cores);
    // The backward's products: on tensor cores for a 16-bit sequence, at
    // any B and H, unless forced off; never in f32; never in the forward.
    for (const GatedRnnShape& s : {b64, GatedRnnShape{1, 1, 37}, GatedRnnShape{3, 5, 1000}}) {
      CHECK(plan_gated_rnn(GatedRnnDirection::backward, cell, s, kH100, {}, bf16).gemm_tensor_cores);
      CHECK(plan_gated_rnn(GatedRnnDirection::backward, cell, s, kH100, {}, f16).gemm_tensor_cores);
      // (any R: the products split every operand into bf16 halves)
      CHECK(plan_gated_rnn(GatedRnnDirection::backward, cell, s, kH100, {}, bf16_f32r).gemm_tensor_cores);
      CHECK_FALSE(plan_gated_rnn(GatedRnnDirection::backward, cell, s, kH100).gemm_tensor_cores);
      CHECK_FALSE(plan_gated_rnn(GatedRnnDirection::forward, cell, s, kH100, {}, bf16).gemm_tensor_cores);
      // grad_rh stored as bf16 only where grad_R lands in bf16 (a bf16
      // sequence with bf16 weights) and its product runs on tensor cores.
      CHECK(plan_gated_rnn(GatedRnnDirection::backward, cell, s, kH100, {}, bf16).grad_rh_bf16);
      CHECK_FALSE(plan_gated_rnn(GatedRnnDirection::backward, cell, s, kH100, {}, f16).grad_rh_bf16);
      CHECK_FALSE(plan_gated_rnn(GatedRnnDirection::backward, cell, s, kH100, {}, bf16_f32r).grad_rh_bf16);
      CHECK_FALSE(plan_gated_rnn(GatedRnnDirection::backward, cell, s, kH100).grad_rh_bf16);
      CHECK_FALSE(plan_gated_rnn(GatedRnnDirection::forward, cell, s, kH100, {}, bf16).grad_rh_bf16);
    }
    o = {};
    o.tensor_cores = 0;
    CHECK_FALSE(plan_gated_rnn(GatedRnnDirection::backward, cell, b64, kH100, o, bf16).gemm_tensor_cores);
    CHECK_FALSE(plan_gated_rnn(GatedRnnDirection::backward, cell, b64, kH100, o, bf16).grad_rh_bf16);
    // More units a block than the warps hold (forced): the CUDA-core product.
    o = {};
    o.units_per_block = 64;
    CHECK_FALSE(plan_gated_rnn(GatedRnnDirection::forward, cell, {64, 8, 1024}, kH100, o, bf16)
                    .tensor_cores);
    // A tensor-core plan whose k parts are not the slice's is refused.
    p = plan_gated_rnn(GatedRnnDirection::forward, cell, b64, kH100, {}, bf16);
    p.k_parts = 4;
    CHECK(gated_rnn_unsupported(p, cell, b64, kH100) != nullptr);
  }
}

// The forward's exchange in pair words from tiles of kGatedRnnPairMinTile
// rows (run CB's shapes on both sides of it), on CUDA and tensor cores,
// forced either way, never backward nor outside the block layout.
TEST_CASE("gated RNN plan: the forward's pair words from tiles of 8 rows", "[gated_rnn][plan]") {
  const GatedRnnDTypes bf16{DType::bf16, DType::bf16}, f32{};
  const auto fwd = [](GatedRnnCell cell, GatedRnnShape shape, GatedRnnLaunchOptions o,
                      GatedRnnDTypes d) {
    return plan_gated_rnn(GatedRnnDirection::forward, cell, shape, kH100, o, d);
  };
  for (GatedRnnCell cell : {GatedRnnCell::gru, GatedRnnCell::lstm, GatedRnnCell::slstm}) {
    INFO("cell " << gated_rnn_gates(cell) << " gates");
    GatedRnnPlan p = fwd(cell, {32, 64, 256}, {}, bf16);
    CHECK(p.batch_tile < kGatedRnnPairMinTile);
    CHECK_FALSE(p.pair_exchange);
    p = fwd(cell, {64, 256, 512}, {}, bf16);
    CHECK(p.tensor_cores);
    CHECK(p.batch_tile >= kGatedRnnPairMinTile);
    CHECK(p.pair_exchange);
    p = fwd(cell, {64, 256, 512}, {}, f32);
    CHECK_FALSE(p.tensor_cores);
    CHECK(p.batch_tile >= kGatedRnnPairMinTile);
    CHECK(p.pair_exchange);
    GatedRnnLaunchOptions o;
    o.pair_exchange = 0;
    CHECK_FALSE(fwd(cell, {64, 256, 512}, o, bf16).pair_exchange);
    o.pair_exchange = 1;
    CHECK(fwd(cell, {32, 64, 256}, o, bf16).pair_exchange);
    CHECK(fwd(cell, {5, 3, 37}, o, f32).pair_exchange);
    CHECK_FALSE(fwd(cell, {1, 32, 256}, o, f32).pair_exchange);  // k split
    CHECK_FALSE(plan_gated_rnn(GatedRnnDirection::backward, cell, {64, 256, 512}, kH100, o, bf16)
                    .pair_exchange);
  }
}

TEST_CASE("gated RNN plan: the stacked forward", "[gated_rnn][plan]") {
  // The wavefront at B = 1, two blocks a multiprocessor: the smallest
  // power-of-two units a block that fit L x ceil(H / U) blocks on the
  // device.
  struct Want {
    GatedRnnCell cell;
    int layers;
    int64_t H;
    GatedRnnDevice device;
    int units, columns;
  };
  for (const Want& w : {Want{GatedRnnCell::gru, 2, 256, kH100, 2, 8},
                        Want{GatedRnnCell::lstm, 2, 256, kH100, 2, 8},
                        Want{GatedRnnCell::gru, 2, 256, kA100, 4, 16},
                        Want{GatedRnnCell::lstm, 2, 256, kA100, 4, 16},
                        Want{GatedRnnCell::gru, 3, 37, kH100, 1, 8},
                        Want{GatedRnnCell::lstm, 4, 64, kH100, 1, 8},
                        Want{GatedRnnCell::lstm, 4, 256, kH100, 4, 16},
                        Want{GatedRnnCell::gru, 2, 1, kA100, 1, 8}}) {
    const GatedRnnShape shape{1, 32, w.H};
    const GatedRnnPlan p = plan_gated_rnn_stack(w.cell, shape, w.layers, w.device);
    INFO("cell " << static_cast<int>(w.cell) << " L" << w.layers << " H" << w.H << " SMs "
                 << w.device.sm_count);
    CHECK(gated_rnn_stack_unsupported(p, w.cell, shape, w.layers, w.device) == nullptr);
    CHECK(p.units_per_block == w.units);
    CHECK(p.stored_columns == w.columns);
    CHECK(p.blocks == w.layers * ((w.H + w.units - 1) / w.units));
    CHECK(p.blocks <= kGatedRnnStackBlocksPerSm * w.device.sm_count);
    CHECK(p.stack_depth == kGatedRnnStackDepth);
    CHECK(p.ws_state >= 0);
    CHECK(p.ws_floats >= p.ws_state + 2 * w.layers * p.stack_depth * w.H);
    check_workspace(p);
  }

  // Elsewhere at B <= 4 the wavefront in the block layout: each layer the
  // layout a lone forward takes on its share of the multiprocessors, one
  // block each, twice a lone forward's shared memory.
  struct Blocks {
    GatedRnnCell cell;
    int layers;
    GatedRnnShape shape;
    GatedRnnDevice device;
    int k_split;
  };
  for (const Blocks& w : {Blocks{GatedRnnCell::gru, 2, {4, 32, 256}, kH100, -1},
                          Blocks{GatedRnnCell::lstm, 2, {4, 32, 256}, kH100, -1},
                          Blocks{GatedRnnCell::gru, 2, {2, 8, 64}, kH100, -1},
                          Blocks{GatedRnnCell::lstm, 3, {3, 5, 100}, kA100, -1},
                          Blocks{GatedRnnCell::gru, 2, {1, 8, 257}, kH100, -1},
                          Blocks{GatedRnnCell::gru, 4, {1, 8, 256}, kA100, -1},
                          Blocks{GatedRnnCell::lstm, 2, {1, 8, 64}, kH100, 0},
                          Blocks{GatedRnnCell::lstm, 4, {4, 16, 256}, kA100, -1}}) {
    INFO("cell " << static_cast<int>(w.cell) << " L" << w.layers << " B" << w.shape.batch << " H"
                 << w.shape.hidden << " SMs " << w.device.sm_count << " k_split " << w.k_split);
    GatedRnnLaunchOptions o;
    o.k_split = w.k_split;
    const GatedRnnPlan p = plan_gated_rnn_stack(w.cell, w.shape, w.layers, w.device, o);
    CHECK(gated_rnn_stack_unsupported(p, w.cell, w.shape, w.layers, w.device) == nullptr);
    CHECK(p.stack_depth == kGatedRnnStackBlocksDepth);
    CHECK_FALSE(p.k_split);
    CHECK_FALSE(p.tensor_cores);
    CHECK(p.resident_weights);
    const int64_t B = w.shape.batch, H = w.shape.hidden, G = gated_rnn_gates(w.cell);
    CHECK(p.blocks == w.layers * p.unit_slices * p.batch_blocks);
    CHECK(p.blocks <= w.device.sm_count);
    CHECK(p.batch_blocks == 1);
    CHECK(static_cast<int64_t>(p.unit_slices) * p.units_per_block >= H);
    CHECK(static_cast<int64_t>(p.batch_blocks) * p.batch_rows >= B);
    CHECK(p.batch_rows <= p.batch_tile);
    CHECK(p.batch_tile <= kGatedRnnMaxBatchTile);
    CHECK(p.stored_columns == gated_rnn_padded_columns(G * p.units_per_block));
    const int64_t C = p.stored_columns, Bt = p.batch_tile;
    CHECK(p.shared_bytes == static_cast<int>(2 * (C * H + Bt * H + Bt * C) * sizeof(float)));
    CHECK(p.shared_bytes <= w.device.max_shared_per_block);
    // The h rings [L, D, B, H] and the handed inputs [L-1, D, B, G*H], 64-bit
    // words; the LSTM's c [L, B, H].
    CHECK(p.ws_exchange >= p.ws_state + 2 * w.layers * p.stack_depth * B * H);
    CHECK(p.ws_floats >= p.ws_exchange + 2 * (w.layers - 1) * p.stack_depth * B * G * H);
    if (w.cell == GatedRnnCell::lstm) CHECK(p.ws_cell >= p.ws_exchange + 2 * (w.layers - 1) * p.stack_depth * B * G * H);
    if (w.cell == GatedRnnCell::lstm) CHECK(p.ws_floats >= p.ws_cell + w.layers * B * H);
    check_workspace(p);
  }
  // Layer by layer where the wavefront does not fit or is turned off: the
  // one-layer forward plan, with the projection's and the lower layers' y
  // workspace after its own.
  struct Layered {
    GatedRnnCell cell;
    int layers;
    GatedRnnShape shape;
    GatedRnnDevice device;
    int stack_wavefront, batch_blocks;
  };
  for (const Layered& w : {Layered{GatedRnnCell::gru, 2, {2, 8, 64}, kH100, 0, 0},
                           Layered{GatedRnnCell::lstm, 3, {33, 5, 100}, kA100, 0, 0},
                           Layered{GatedRnnCell::gru, 2, {1, 8, 64}, kH100, 0, 0},
                           // Above B = 4.
                           Layered{GatedRnnCell::gru, 2, {32, 64, 256}, kH100, -1, 0},
                           Layered{GatedRnnCell::lstm, 2, {32, 64, 256}, kH100, -1, 0},
                           Layered{GatedRnnCell::gru, 2, {64, 8, 512}, kH100, -1, 0},
                           Layered{GatedRnnCell::gru, 2, {5, 8, 64}, kH100, -1, 1},
                           // The slices of R and W not in shared memory.
                           Layered{GatedRnnCell::lstm, 2, {2, 8, 8192}, kA100, -1, 0}}) {
    INFO("cell " << static_cast<int>(w.cell) << " L" << w.layers << " B" << w.shape.batch << " H"
                 << w.shape.hidden << " SMs " << w.device.sm_count << " stack_wavefront "
                 << w.stack_wavefront << " batch_blocks " << w.batch_blocks);
    GatedRnnLaunchOptions o;
    o.stack_wavefront = w.stack_wavefront;
    o.batch_blocks = w.batch_blocks;
    const GatedRnnPlan p = plan_gated_rnn_stack(w.cell, w.shape, w.layers, w.device, o);
    const GatedRnnPlan one = plan_gated_rnn(GatedRnnDirection::forward, w.cell, w.shape, w.device, o);
    CHECK(gated_rnn_stack_unsupported(p, w.cell, w.shape, w.layers, w.device) == nullptr);
    CHECK(p.stack_depth == 0);
    CHECK(p.blocks == one.blocks);
    CHECK(p.k_split == one.k_split);
    CHECK(p.ws_stack_wx >= one.ws_floats);
    const int64_t B = w.shape.batch, T = w.shape.steps, H = w.shape.hidden;
    CHECK(p.ws_stack_y >= p.ws_stack_wx + B * T * gated_rnn_gates(w.cell) * H);
    CHECK(p.ws_floats >= p.ws_stack_y + 2 * B * T * H);
    check_workspace(p);
    // The projections on tensor cores for a 16-bit sequence unless asked
    // not to; never for f32.
    CHECK_FALSE(p.gemm_tensor_cores);
    const GatedRnnDTypes bf16{DType::bf16, DType::bf16};
    CHECK(plan_gated_rnn_stack(w.cell, w.shape, w.layers, w.device, o, bf16).gemm_tensor_cores);
    GatedRnnLaunchOptions cuda_cores = o;
    cuda_cores.tensor_cores = 0;
    CHECK_FALSE(plan_gated_rnn_stack(w.cell, w.shape, w.layers, w.device, cuda_cores, bf16).gemm_tensor_cores);
  }

  // What it refuses, each with its reason.
  struct Refused {
    GatedRnnCell cell;
    int layers;
    GatedRnnShape shape;
    const char* why;
  };
  for (const Refused& r : {Refused{GatedRnnCell::slstm, 2, {1, 8, 64}, "GRU and LSTM layers only"},
                           Refused{GatedRnnCell::gru, 1, {1, 8, 64}, "2 to 4 layers"},
                           Refused{GatedRnnCell::gru, 5, {1, 8, 64}, "2 to 4 layers"}}) {
    const GatedRnnPlan p = plan_gated_rnn_stack(r.cell, r.shape, r.layers, kH100);
    const char* why = gated_rnn_stack_unsupported(p, r.cell, r.shape, r.layers, kH100);
    REQUIRE(why != nullptr);
    CHECK(std::string(why).find(r.why) != std::string::npos);
  }
  // Forced units that would need more blocks than two a multiprocessor:
  // layer by layer, with those units.
  GatedRnnLaunchOptions o;
  o.units_per_block = 1;
  const GatedRnnShape shape{1, 8, 200};
  GatedRnnPlan p = plan_gated_rnn_stack(GatedRnnCell::gru, shape, 2, kH100, o);
  CHECK(p.stack_depth == 0);
  CHECK(p.units_per_block == 1);
  // A wavefront plan whose ring is not a power of two.
  p = plan_gated_rnn_stack(GatedRnnCell::gru, shape, 2, kH100);
  REQUIRE(p.stack_depth == kGatedRnnStackDepth);
  p.stack_depth = 3;
  const char* why = gated_rnn_stack_unsupported(p, GatedRnnCell::gru, shape, 2, kH100);
  REQUIRE(why != nullptr);
  CHECK(std::string(why).find("power of two") != std::string::npos);
  // Block-layout wavefront plans the kernel cannot run.
  const GatedRnnShape b4{4, 8, 256};
  const auto refused_blocks = [&](const char* want, void (*spoil)(GatedRnnPlan&)) {
    GatedRnnPlan q = plan_gated_rnn_stack(GatedRnnCell::lstm, b4, 2, kH100);
    REQUIRE(q.stack_depth == kGatedRnnStackBlocksDepth);
    REQUIRE(gated_rnn_stack_unsupported(q, GatedRnnCell::lstm, b4, 2, kH100) == nullptr);
    spoil(q);
    const char* r = gated_rnn_stack_unsupported(q, GatedRnnCell::lstm, b4, 2, kH100);
    INFO(want);
    REQUIRE(r != nullptr);
    CHECK(std::string(r).find(want) != std::string::npos);
  };
  refused_blocks("one batch tile", [](GatedRnnPlan& q) { q.batch_tile = q.batch_rows / 2; });
  refused_blocks("do not cover B and H", [](GatedRnnPlan& q) { q.blocks /= 2; });
  refused_blocks("than multiprocessors", [](GatedRnnPlan& q) {
    q.batch_blocks *= 2;
    q.batch_rows /= 2;
    q.blocks *= 2;
  });
  refused_blocks("power of two", [](GatedRnnPlan& q) { q.stack_depth = 6; });
  refused_blocks("shared memory", [](GatedRnnPlan& q) { q.resident_weights = false; });
  refused_blocks("without its workspace", [](GatedRnnPlan& q) { q.ws_exchange = -1; });
  // A layer-by-layer plan without its workspace.
  GatedRnnLaunchOptions layered;
  layered.stack_wavefront = 0;
  p = plan_gated_rnn_stack(GatedRnnCell::gru, {2, 8, 64}, 2, kH100, layered);
  REQUIRE(p.stack_depth == 0);
  p.ws_stack_y = -1;
  why = gated_rnn_stack_unsupported(p, GatedRnnCell::gru, {2, 8, 64}, 2, kH100);
  REQUIRE(why != nullptr);
  CHECK(std::string(why).find("without its workspace") != std::string::npos);
}

TEST_CASE("gated RNN stack: the launcher refuses what its kernel would read wrongly",
          "[gated_rnn][plan]") {
  // Checked before any CUDA call: no GPU needed. Pointers are never read.
  const GatedRnnShape shape{1, 8, 64};
  const GatedRnnPlan plan = plan_gated_rnn_stack(GatedRnnCell::gru, shape, 2, kH100);
  int dummy = 0;
  GatedRnnStackParams good;
  good.layers = 2;
  for (int l = 0; l < 2; ++l) {
    good.layer[l].shape = shape;
    good.layer[l].d_R = &dummy;
    good.layer[l].d_y = &dummy;
  }
  good.layer[0].d_wx = &dummy;
  good.d_W[1] = &dummy;
  struct Bad {
    const char* why;
    void (*spoil)(GatedRnnStackParams&);
  };
  for (const Bad& b : {Bad{"layers outside", [](GatedRnnStackParams& p) { p.layers = 1; }},
                       Bad{"another number of layers", [](GatedRnnStackParams& p) {
                             p.layers = 3;
                             p.layer[2] = p.layer[1];
                             p.d_W[2] = p.d_W[1];
                           }},
                       Bad{"wx is null", [](GatedRnnStackParams& p) { p.layer[0].d_wx = nullptr; }},
                       Bad{"differ from layer 0", [](GatedRnnStackParams& p) { p.layer[1].shape.steps = 9; }},
                       Bad{"differ from layer 0", [](GatedRnnStackParams& p) { p.layer[1].dtype = DType::bf16; }},
                       Bad{"R is null", [](GatedRnnStackParams& p) { p.layer[1].d_R = nullptr; }},
                       Bad{"input weights W", [](GatedRnnStackParams& p) { p.d_W[1] = nullptr; }},
                       Bad{"last layer's y", [](GatedRnnStackParams& p) { p.layer[1].d_y = nullptr; }}}) {
    GatedRnnStackParams p = good;
    b.spoil(p);
    const LaunchResult r = launch_gated_rnn_stack_forward(p, plan, nullptr, nullptr);
    INFO(b.why << ": " << r.call);
    CHECK(r.error == cudaErrorInvalidValue);
    CHECK(std::string(r.call).find(b.why) != std::string::npos);
  }
}

TEST_CASE("gated RNN stack backward: the one-layer backward plan and the stack's workspace",
          "[gated_rnn][plan]") {
  for (const GatedRnnCell cell : {GatedRnnCell::gru, GatedRnnCell::lstm})
    for (const GatedRnnShape shape : {GatedRnnShape{1, 32, 256}, GatedRnnShape{64, 256, 512}, GatedRnnShape{3, 7, 37}}) {
      INFO("cell " << static_cast<int>(cell) << " B" << shape.batch << " T" << shape.steps << " H" << shape.hidden);
      const GatedRnnDTypes bf16{DType::bf16, DType::bf16};
      GatedRnnLaunchOptions layered;
      layered.stack_wavefront = 0;
      const GatedRnnPlan p = plan_gated_rnn_stack_backward(cell, shape, 3, kH100, layered, bf16);
      const GatedRnnPlan one = plan_gated_rnn(GatedRnnDirection::backward, cell, shape, kH100, layered, bf16);
      CHECK(gated_rnn_stack_unsupported(p, cell, shape, 3, kH100) == nullptr);
      CHECK(p.stack_depth == 0);
      CHECK(p.blocks == one.blocks);
      CHECK(p.recompute_splits == one.recompute_splits);
      CHECK(p.weight_grad_splits == one.weight_grad_splits);
      CHECK(p.gemm_tensor_cores);
      // The regions after the one-layer backward's, in order, each whole.
      const int64_t BT = shape.batch * shape.steps, H = shape.hidden, GH = gated_rnn_gates(cell) * H;
      CHECK(p.ws_stack_wx >= one.ws_floats);
      CHECK(p.ws_stack_grad_wx >= p.ws_stack_wx + BT * GH);
      CHECK(p.ws_stack_y >= p.ws_stack_grad_wx + BT * GH);
      CHECK(p.ws_stack_wt >= p.ws_stack_y + BT * H);
      CHECK(p.ws_floats >= p.ws_stack_wt + GH * H);
      check_workspace(p);
      GatedRnnLaunchOptions cuda_cores = layered;
      cuda_cores.tensor_cores = 0;
      CHECK_FALSE(plan_gated_rnn_stack_backward(cell, shape, 3, kH100, cuda_cores, bf16).gemm_tensor_cores);
      // Without the stack's own regions: refused.
      GatedRnnPlan bad = p;
      bad.ws_stack_wt = -1;
      const char* why = gated_rnn_stack_unsupported(bad, cell, shape, 3, kH100);
      REQUIRE(why != nullptr);
      CHECK(std::string(why).find("without its workspace") != std::string::npos);

      // By default at B <= 4 the reverse wavefront: each layer the
      // one-layer backward plan on a third of the multiprocessors and half
      // the shared memory, its workspace a region of its own; above, layer
      // by layer. One step above B = 1: layer by layer unless asked for.
      const GatedRnnPlan w = plan_gated_rnn_stack_backward(cell, shape, 3, kH100, {}, bf16);
      CHECK(gated_rnn_stack_unsupported(w, cell, shape, 3, kH100) == nullptr);
      const GatedRnnShape one_step{shape.batch, 1, shape.hidden};
      GatedRnnLaunchOptions asked;
      asked.stack_wavefront = 1;
      CHECK((plan_gated_rnn_stack_backward(cell, one_step, 3, kH100, {}, bf16).stack_depth > 0) ==
            (shape.batch == 1));
      CHECK((plan_gated_rnn_stack_backward(cell, one_step, 3, kH100, asked, bf16).stack_depth > 0) ==
            (shape.batch <= 4));
      if (shape.batch > 4) {
        CHECK(w.stack_depth == 0);
        continue;
      }
      GatedRnnDevice share = kH100;
      share.sm_count = kH100.sm_count / 3;
      share.max_shared_per_block = kH100.max_shared_per_block / 2 / 16 * 16;
      const GatedRnnPlan lone = plan_gated_rnn(GatedRnnDirection::backward, cell, shape, share, {}, bf16);
      CHECK(w.stack_depth == kGatedRnnStackBlocksDepth);
      CHECK(w.blocks == 3 * lone.blocks);
      CHECK(w.blocks <= kH100.sm_count);
      CHECK(w.units_per_block == lone.units_per_block);
      CHECK(w.shared_bytes == 2 * gated_rnn_walk_shared_floats(lone) * 4);
      CHECK(w.shared_bytes <= kH100.max_shared_per_block);
      CHECK(w.ws_stack_layer == lone.ws_floats);
      for (int l = 0; l < 3; ++l) {
        const GatedRnnPlan lp = gated_rnn_stack_layer_plan(w, l);
        CHECK(lp.ws_rh == lone.ws_rh + l * lone.ws_floats);
        CHECK(lp.ws_exchange == lone.ws_exchange + l * lone.ws_floats);
        CHECK(lp.blocks == lone.blocks);
      }
      CHECK(w.ws_stack_parts >= 3 * lone.ws_floats);
      CHECK(w.ws_stack_wx >= w.ws_stack_parts + 2 * 2 * w.stack_depth * w.unit_slices * shape.batch * H);
      CHECK(w.ws_stack_grad_wx >= w.ws_stack_wx + 2 * BT * GH);
      CHECK(w.ws_floats >= w.ws_stack_grad_wx + 2 * BT * GH);
      check_workspace(w);
      GatedRnnPlan no_parts = w;
      no_parts.ws_stack_parts = -1;
      why = gated_rnn_stack_unsupported(no_parts, cell, shape, 3, kH100);
      REQUIRE(why != nullptr);
      CHECK(std::string(why).find("without its workspace") != std::string::npos);
      GatedRnnPlan too_many = w;
      too_many.blocks = 2 * w.blocks;
      CHECK(gated_rnn_stack_unsupported(too_many, cell, shape, 3, kH100) != nullptr);
      // A batch group's rows in one tile: a layer checks the ring below at
      // a group's first row only. A tile asked for below a group's rows
      // (B3: tiles of 2 for its 3 rows) runs layer by layer; a wavefront
      // plan that splits a group is refused, by name.
      if (shape.batch > 1) {
        GatedRnnLaunchOptions split;
        split.batch_tile = 2;
        const GatedRnnPlan q = plan_gated_rnn_stack_backward(cell, shape, 3, kH100, split, bf16);
        CHECK(q.stack_depth == 0);
        CHECK(gated_rnn_stack_unsupported(q, cell, shape, 3, kH100) == nullptr);
        GatedRnnPlan two_tiles = w;
        two_tiles.batch_tile = 2;
        REQUIRE(two_tiles.batch_rows > 2);
        why = gated_rnn_stack_unsupported(two_tiles, cell, shape, 3, kH100);
        REQUIRE(why != nullptr);
        CHECK(std::string(why).find("one batch tile") != std::string::npos);
      }
    }
}

TEST_CASE("gated RNN stack backward: the launcher refuses what it would read wrongly", "[gated_rnn][plan]") {
  // Checked before any CUDA call: no GPU needed. Pointers are never read.
  const GatedRnnShape shape{2, 8, 64};
  const GatedRnnPlan plan = plan_gated_rnn_stack_backward(GatedRnnCell::gru, shape, 2, kH100);
  int dummy = 0;
  GatedRnnStackBackwardParams good;
  good.layers = 2;
  for (int l = 0; l < 2; ++l) {
    good.layer[l].fwd.shape = shape;
    good.layer[l].fwd.d_R = &dummy;
    good.layer[l].fwd.d_y = &dummy;
  }
  good.layer[0].fwd.d_wx = &dummy;
  good.layer[1].d_grad_y = &dummy;
  good.d_W[1] = &dummy;
  struct Bad {
    const char* why;
    void (*spoil)(GatedRnnStackBackwardParams&);
  };
  for (const Bad& b :
       {Bad{"layers outside", [](GatedRnnStackBackwardParams& p) { p.layers = 5; }},
        Bad{"wx is null", [](GatedRnnStackBackwardParams& p) { p.layer[0].fwd.d_wx = nullptr; }},
        Bad{"differ from layer 0", [](GatedRnnStackBackwardParams& p) { p.layer[1].fwd.shape.batch = 3; }},
        Bad{"R or y is null", [](GatedRnnStackBackwardParams& p) { p.layer[0].fwd.d_y = nullptr; }},
        Bad{"without W", [](GatedRnnStackBackwardParams& p) { p.d_W[1] = nullptr; }},
        Bad{"its own wx", [](GatedRnnStackBackwardParams& p) { p.layer[1].d_grad_wx = p.layer[0].fwd.d_y; }},
        Bad{"grad_y is null", [](GatedRnnStackBackwardParams& p) { p.layer[1].d_grad_y = nullptr; }}}) {
    GatedRnnStackBackwardParams p = good;
    b.spoil(p);
    const LaunchResult r = launch_gated_rnn_stack_backward(p, plan, nullptr, nullptr);
    INFO(b.why << ": " << r.call);
    CHECK(r.error == cudaErrorInvalidValue);
    CHECK(std::string(r.call).find(b.why) != std::string::npos);
  }
  // A forward plan is not the backward's.
  const LaunchResult r =
      launch_gated_rnn_stack_backward(good, plan_gated_rnn_stack(GatedRnnCell::gru, shape, 2, kH100), nullptr, nullptr);
  CHECK(r.error == cudaErrorInvalidValue);
  CHECK(std::string(r.call).find("plan_gated_rnn_stack_backward") != std::string::npos);
}

// The reverse walk's part product on tensor cores (gated_rnn_backward.cuh,
// gated_rnn_part_product_tc): a 16-bit sequence with bf16 weights, tiles
// of 8 rows or more; its transposed bf16 slice resident in the shared
// memory the plan asks for, also where the f32 slice would not fit.
TEST_CASE("gated RNN backward: the walk's part product on tensor cores", "[gated_rnn][plan]") {
  const GatedRnnDTypes bf16{DType::bf16, DType::bf16};
  for (const GatedRnnCell cell : {GatedRnnCell::gru, GatedRnnCell::lstm, GatedRnnCell::slstm})
    for (const GatedRnnDevice& device : {kH100, kA100}) {
      INFO("cell " << static_cast<int>(cell) << ", " << device.sm_count << " SMs");
      const GatedRnnShape big{64, 256, 512};
      const GatedRnnPlan p = plan_gated_rnn(GatedRnnDirection::backward, cell, big, device, {}, bf16);
      REQUIRE(p.resident_weights);
      CHECK(p.batch_tile >= 8);
      CHECK(p.walk_tensor_cores);
      const int64_t floats = gated_rnn_walk_tc_slice_floats(p.stored_columns, 512) +
                             static_cast<int64_t>(p.stored_columns) * p.batch_tile +
                             static_cast<int64_t>(p.unit_slices) * p.batch_tile * p.units_per_block;
      CHECK(p.shared_bytes == floats * 4);
      CHECK(p.shared_bytes <= device.max_shared_per_block);
      CHECK(gated_rnn_unsupported(p, cell, big, device) == nullptr);
      // f16 sequences with bf16 weights too (grad_rh is f32 either way).
      CHECK(plan_gated_rnn(GatedRnnDirection::backward, cell, big, device, {}, {DType::f16, DType::bf16})
                .walk_tensor_cores);
      // Not with f32 or f16 weights (R would need a second pass), not in f32,
      // not with tensor_cores = 0 or walk_tensor_cores = 0, not forward, not
      // in tiles of 4 rows or fewer (B <= 2; B32 H256's groups of 4), not
      // with the slices streamed.
      CHECK_FALSE(plan_gated_rnn(GatedRnnDirection::backward, cell, big, device, {}, {DType::bf16, DType::f32})
                      .walk_tensor_cores);
      CHECK_FALSE(plan_gated_rnn(GatedRnnDirection::backward, cell, big, device, {}, {DType::f16, DType::f16})
                      .walk_tensor_cores);
      CHECK_FALSE(plan_gated_rnn(GatedRnnDirection::backward, cell, big, device).walk_tensor_cores);
      GatedRnnLaunchOptions off;
      off.tensor_cores = 0;
      CHECK_FALSE(plan_gated_rnn(GatedRnnDirection::backward, cell, big, device, off, bf16).walk_tensor_cores);
      GatedRnnLaunchOptions walk_off;
      walk_off.walk_tensor_cores = 0;
      const GatedRnnPlan cc = plan_gated_rnn(GatedRnnDirection::backward, cell, big, device, walk_off, bf16);
      CHECK_FALSE(cc.walk_tensor_cores);
      CHECK(cc.gemm_tensor_cores);
      GatedRnnLaunchOptions streamed;
      streamed.streamed_weights = true;
      CHECK_FALSE(
          plan_gated_rnn(GatedRnnDirection::backward, cell, big, device, streamed, bf16).walk_tensor_cores);
      CHECK_FALSE(plan_gated_rnn(GatedRnnDirection::forward, cell, big, device, {}, bf16).walk_tensor_cores);
      for (const int64_t B : {1, 2, 32}) {
        const GatedRnnPlan small = plan_gated_rnn(GatedRnnDirection::backward, cell, {B, 32, 256}, device, {}, bf16);
        CHECK(small.batch_tile <= 4);
        CHECK_FALSE(small.walk_tensor_cores);
      }
      // A plan that says so without what it needs is refused, by name.
      for (int broken = 0; broken < 4; ++broken) {
        GatedRnnPlan bad = p;
        if (broken == 0) bad.resident_weights = false;
        if (broken == 1) bad.gemm_tensor_cores = false;
        if (broken == 2) bad.batch_tile = 4;
        if (broken == 3) bad.shared_bytes -= 4;
        const char* why = gated_rnn_unsupported(bad, cell, big, device);
        REQUIRE(why != nullptr);
        CHECK(std::string(why).find("walk's tensor-core product") != std::string::npos);
      }
    }
  const GatedRnnDTypes bf16_pair{DType::bf16, DType::bf16};
  // 64 units a block at B64 H512: the f32 slice (192 columns x 512) does
  // not fit, the bf16 one does, in 8 groups of 8 rows; in 16 groups of 4
  // rows the walk stays on CUDA cores, its slice streamed.
  GatedRnnLaunchOptions wide;
  wide.units_per_block = 64;
  wide.batch_blocks = 8;
  const GatedRnnPlan w = plan_gated_rnn(GatedRnnDirection::backward, GatedRnnCell::gru, {64, 256, 512}, kH100,
                                        wide, bf16_pair);
  CHECK(w.walk_tensor_cores);
  CHECK(w.resident_weights);
  CHECK(w.batch_tile == 8);
  CHECK(w.blocks == 64);
  CHECK(w.shared_bytes <= kH100.max_shared_per_block);
  CHECK(gated_rnn_unsupported(w, GatedRnnCell::gru, {64, 256, 512}, kH100) == nullptr);
  wide.batch_blocks = 16;
  const GatedRnnPlan narrow = plan_gated_rnn(GatedRnnDirection::backward, GatedRnnCell::gru, {64, 256, 512},
                                             kH100, wide, bf16_pair);
  CHECK_FALSE(narrow.walk_tensor_cores);
  CHECK_FALSE(narrow.resident_weights);
  wide.batch_blocks = 8;
  wide.walk_tensor_cores = 0;
  CHECK_FALSE(plan_gated_rnn(GatedRnnDirection::backward, GatedRnnCell::gru, {64, 256, 512}, kH100, wide,
                             bf16_pair)
                  .resident_weights);
  // The automatic layout counts the slice as bf16 where the walk takes it:
  // the LSTM at B64 H512 in 8 groups of 32 units (128 columns, 256 KB in
  // f32), on CUDA cores in 4 groups of 16.
  const GatedRnnPlan lstm = plan_gated_rnn(GatedRnnDirection::backward, GatedRnnCell::lstm, {64, 256, 512},
                                           kH100, {}, bf16_pair);
  CHECK(lstm.walk_tensor_cores);
  CHECK(lstm.resident_weights);
  CHECK(lstm.units_per_block == 32);
  CHECK(lstm.batch_blocks == 8);
  CHECK(lstm.batch_tile == 8);
  GatedRnnLaunchOptions lstm_cc;
  lstm_cc.walk_tensor_cores = 0;
  const GatedRnnPlan cc = plan_gated_rnn(GatedRnnDirection::backward, GatedRnnCell::lstm, {64, 256, 512},
                                         kH100, lstm_cc, bf16_pair);
  CHECK_FALSE(cc.walk_tensor_cores);
  CHECK(cc.resident_weights);
  CHECK(cc.units_per_block == 16);
  CHECK(cc.batch_blocks == 4);
  // The stack's reverse wavefront (B <= 4) keeps its walk on CUDA cores,
  // and refuses a plan that says otherwise.
  GatedRnnPlan stack = plan_gated_rnn_stack_backward(GatedRnnCell::gru, {4, 32, 256}, 2, kH100, {}, bf16_pair);
  REQUIRE(stack.stack_depth > 0);
  CHECK_FALSE(stack.walk_tensor_cores);
  stack.walk_tensor_cores = true;
  const char* why = gated_rnn_stack_unsupported(stack, GatedRnnCell::gru, {4, 32, 256}, 2, kH100);
  REQUIRE(why != nullptr);
  CHECK(std::string(why).find("CUDA cores") != std::string::npos);
  // The slice's layout: rows H to 16, columns to 16 plus 8, whole float4s.
  CHECK(gated_rnn_walk_tc_depth(96) == 96);
  CHECK(gated_rnn_walk_tc_depth(97) == 112);
  CHECK(gated_rnn_walk_tc_ld(96) == 104);
  CHECK(gated_rnn_walk_tc_rows(512) == 512);
  CHECK(gated_rnn_walk_tc_rows(37) == 48);
  CHECK(gated_rnn_walk_tc_slice_floats(96, 512) == 512 * 104 / 2);
  CHECK(gated_rnn_walk_tc_slice_floats(24, 37) % 4 == 0);
  // Which of the GPU test's tensor-core cases take it (test_gated_rnn.cpp).
  int taken = 0;
  for (const GatedRnnCell cell : {GatedRnnCell::gru, GatedRnnCell::lstm, GatedRnnCell::slstm})
    for (const GatedRnnShape s : {GatedRnnShape{9, 7, 64}, GatedRnnShape{33, 5, 256}, GatedRnnShape{64, 3, 512},
                                  GatedRnnShape{17, 4, 1024}, GatedRnnShape{40, 200, 16}, GatedRnnShape{2, 9, 32},
                                  GatedRnnShape{24, 6, 48}})
      taken += plan_gated_rnn(GatedRnnDirection::backward, cell, s, kH100, {}, bf16).walk_tensor_cores;
  CHECK(taken == 18);  // all but B2 (a tile of 2 rows)
  // The GPU sanitizer test's case of it: one group of 9 rows in tiles of 8.
  GatedRnnLaunchOptions small;
  small.units_per_block = 8;
  small.batch_blocks = 1;
  small.batch_tile = 8;
  for (const GatedRnnCell cell : {GatedRnnCell::gru, GatedRnnCell::lstm, GatedRnnCell::slstm}) {
    const GatedRnnPlan p = plan_gated_rnn(GatedRnnDirection::backward, cell, {9, 4, 37}, kH100, small, bf16_pair);
    CHECK(p.walk_tensor_cores);
    CHECK(p.batch_tile == 8);
    CHECK(p.batch_rows == 9);
  }
}

// The pair words of the forward's and the backward walk's exchanges
// (gated_rnn_pair_word.h): two rows' values and the step mod 4 in their
// lowest bits. A word tells its step from the two before and after it
// (what a consumer may find), each value within one unit in the last place
// of f32, and a call's "no step" marker never passes for the first step
// read from its buffer.
TEST_CASE("gated RNN: the exchanges' pair words", "[gated_rnn][plan]") {
  const auto bits = [](float v) {
    uint32_t u;
    std::memcpy(&u, &v, 4);
    return u;
  };
  const auto value = [](uint32_t u) {
    float v;
    std::memcpy(&v, &u, 4);
    return v;
  };
  const float values[] = {0.0f, -0.0f, 1.0f, -3.0e-7f, 1.2345678e4f, 1.0e-40f, -7.5f, 3.4e38f};
  for (const float row : values)
    for (const float next : values)
      for (int step = 0; step < 9; ++step) {
        const uint64_t w = gated_rnn_pair_word(bits(row), bits(next), step);
        INFO("row " << row << " next " << next << " step " << step);
        CHECK(gated_rnn_pair_has_step(w, step));
        CHECK(gated_rnn_pair_has_step(w, step + 4));
        for (const int other : {step - 2, step - 1, step + 1, step + 2})
          CHECK_FALSE(gated_rnn_pair_has_step(w, other));
        const float got_row = value(gated_rnn_pair_row(w)), got_next = value(gated_rnn_pair_next(w));
        CHECK(std::abs(got_row - row) <= std::abs(row) * 0x1p-23f + 0x1p-149f);
        CHECK(std::abs(got_next - next) <= std::abs(next) * 0x1p-23f + 0x1p-149f);
        CHECK(std::signbit(got_row) == std::signbit(row));
        CHECK(std::signbit(got_next) == std::signbit(next));
      }
  for (int64_t T = 1; T < 12; ++T)
    for (int half = 0; half < 2; ++half) {
      // The largest step below T of this parity: the first a consumer waits
      // for in this buffer.
      const int64_t first = (T - 1) % 2 == half ? T - 1 : T - 2;
      if (first < 0) continue;
      const uint64_t marker = gated_rnn_pair_word(0, 0, gated_rnn_pair_no_step(T, half));
      INFO("T " << T << " half " << half);
      CHECK_FALSE(gated_rnn_pair_has_step(marker, static_cast<int>(first)));
    }
  // The forward runs upward: the first step it waits for in buffer `half`
  // is `half` itself, and every later one there (half + 2, ...) finds the
  // marker or the step two before it.
  for (int half = 0; half < 2; ++half) {
    const uint64_t marker = gated_rnn_pair_word(0, 0, gated_rnn_pair_no_step_upward(half));
    INFO("forward half " << half);
    CHECK_FALSE(gated_rnn_pair_has_step(marker, half));
    for (int step = half + 2; step < 40; step += 2)
      CHECK_FALSE(gated_rnn_pair_has_step(gated_rnn_pair_word(0, 0, step - 2), step));
  }
}
