// The gated-RNN planner: units per block, batch tile, resident or streamed
// weights, and the workspace layout. Pure host arithmetic on the shape and
// the device's numbers (no CUDA calls), so it is unit-testable without a GPU.
#include <algorithm>
#include <cstdint>

#include "gated_rnn/gated_rnn_launch.h"

namespace exphil::kernels {

namespace {

int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

// Workspace pieces start on 256-byte boundaries.
int64_t take(int64_t& total, int64_t floats) {
  const int64_t at = total;
  total += ceil_div(floats, 64) * 64;
  return at;
}

int64_t shared_floats(bool resident, int64_t k, int64_t columns, int64_t batch_tile) {
  return (resident ? k * columns : 0) + batch_tile * k + batch_tile * columns;
}

}  // namespace

GatedRnnPlan plan_gated_rnn(GatedRnnDirection direction, GatedRnnCell cell,
                            const GatedRnnShape& shape, const GatedRnnDevice& device,
                            const GatedRnnLaunchOptions& options) noexcept {
  GatedRnnPlan plan;
  const bool forward = direction == GatedRnnDirection::forward;
  const int64_t G = gated_rnn_gates(cell);
  const int64_t B = std::max<int64_t>(shape.batch, 1), T = std::max<int64_t>(shape.steps, 1);
  const int64_t H = std::max<int64_t>(shape.hidden, 1);
  const int64_t sms = std::max(device.sm_count, 1);
  const int64_t max_units = forward ? kGatedRnnThreads / G : kGatedRnnThreads;

  // The forward at B <= 4, when asked for (unit_warps = 1): a warp per
  // hidden unit (no block barrier inside a step), as many warps per block as
  // one block per SM needs, when the block's columns of R fit in shared
  // memory. Not chosen by default: measured slower than the block layout at
  // B1 T32 H256 (bench/RESULTS.md, "the unit-warps layout").
  if (forward && options.unit_warps == 1 && !options.streamed_weights &&
      B <= kGatedRnnUnitWarpsMaxRows) {
    const int64_t max_warps = kGatedRnnUnitWarpsMaxThreads / 32;
    const int64_t warps = std::min(
        options.units_per_block > 0 ? options.units_per_block : ceil_div(H, sms), H);
    const int64_t bytes = warps * G * ceil_div(H, 32) * 32 * static_cast<int64_t>(sizeof(float));
    if (warps <= max_warps && bytes <= device.max_shared_per_block) {
      plan.unit_warps = true;
      plan.threads = static_cast<int>(warps * 32);
      plan.units_per_block = static_cast<int>(warps);
      plan.blocks = static_cast<int>(ceil_div(H, warps));
      plan.batch_tile = B <= 1 ? 1 : B <= 2 ? 2 : 4;
      plan.resident_weights = true;
      plan.k = static_cast<int>(H);
      plan.columns = static_cast<int>(G * warps);
      plan.shared_bytes = static_cast<int>(bytes);
      int64_t total = 0;
      plan.ws_state = take(total, 2 * 2 * B * H);  // the exchange, 64-bit words
      plan.ws_floats = total;
      return plan;
    }
  }

  // Units per block: just enough that one block per SM covers H. More
  // blocks means less of the product per block and step, and the exchange
  // costs a block about the same however many there are.
  int64_t units = options.units_per_block > 0 ? options.units_per_block : ceil_div(H, sms);
  units = std::min(units, H);
  if (options.units_per_block <= 0) units = std::min(units, max_units);
  plan.units_per_block = static_cast<int>(units);
  plan.blocks = static_cast<int>(std::min<int64_t>(ceil_div(H, units), INT32_MAX));
  const int64_t k = forward ? H : G * H;
  const int64_t columns = forward ? G * units : units;
  plan.k = static_cast<int>(std::min<int64_t>(k, INT32_MAX));
  plan.columns = static_cast<int>(std::min<int64_t>(columns, INT32_MAX));

  // Batch tile: a power of two (the product runs that many rows).
  const int64_t asked = std::clamp<int64_t>(options.batch_tile > 0 ? options.batch_tile : B, 1,
                                            kGatedRnnMaxBatchTile);
  int64_t want_tile = 1;
  while (want_tile < asked) want_tile *= 2;
  const int64_t limit = device.max_shared_per_block / static_cast<int64_t>(sizeof(float));
  plan.resident_weights =
      !options.streamed_weights && shared_floats(true, k, columns, 1) <= limit;
  int64_t tile = want_tile;
  while (tile > 1 && shared_floats(plan.resident_weights, k, columns, tile) > limit) tile /= 2;
  plan.batch_tile = static_cast<int>(tile);
  plan.shared_bytes = static_cast<int>(std::min<int64_t>(
      shared_floats(plan.resident_weights, k, columns, tile) * static_cast<int64_t>(sizeof(float)),
      INT32_MAX));

  // The states besides h a unit carries: the LSTM's c; the sLSTM's c, n, m
  // (forward), or their gradients (backward).
  const int64_t cell_states = cell == GatedRnnCell::gru ? 0 : cell == GatedRnnCell::lstm ? 1 : 3;
  int64_t total = 0;
  if (forward) {
    plan.ws_state = take(total, 2 * 2 * B * H);  // 64-bit words
    if (cell_states > 0) plan.ws_cell = take(total, cell_states * B * H);
  } else {
    plan.ws_rh = take(total, B * T * G * H);
    plan.ws_gates = take(total, B * T * 4 * H);
    // Every step's c (LSTM); c, n and max's share (sLSTM).
    if (cell_states > 0) plan.ws_c = take(total, B * T * cell_states * H);
    plan.ws_state = take(total, B * H);
    if (cell_states > 0) plan.ws_cell = take(total, cell_states * B * H);
    plan.ws_exchange = take(total, 2 * 2 * B * G * H);  // 64-bit words
  }
  if (!plan.resident_weights) plan.ws_weights = take(total, plan.blocks * columns * k);
  plan.ws_floats = total;
  return plan;
}

const char* gated_rnn_unsupported(const GatedRnnPlan& plan, GatedRnnCell cell,
                                  const GatedRnnShape& shape,
                                  const GatedRnnDevice& device) noexcept {
  if (cell != GatedRnnCell::gru && cell != GatedRnnCell::lstm && cell != GatedRnnCell::slstm)
    return "unknown gated RNN cell";
  if (shape.batch < 1 || shape.steps < 1 || shape.hidden < 1)
    return "gated RNN: B, T and H must be at least 1";
  // Element offsets within one step's rows are 32-bit in the persistent
  // kernels (64-bit across batch and time).
  if (shape.hidden > (int64_t{1} << 24)) return "gated RNN: H above 2^24";
  if (plan.units_per_block < 1 || plan.blocks < 1 ||
      static_cast<int64_t>(plan.blocks) * plan.units_per_block < shape.hidden)
    return "gated RNN plan: the blocks do not cover H";
  if (plan.columns > kGatedRnnThreads)
    return "gated RNN plan: more than 256 columns per block (H too large for the device's "
           "multiprocessors)";
  if (plan.batch_tile < 1 || plan.batch_tile > kGatedRnnMaxBatchTile ||
      (plan.batch_tile & (plan.batch_tile - 1)) != 0)
    return "gated RNN plan: batch tile not a power of two up to 32";
  // Steps are numbered in 32 bits in the exchange.
  if (shape.steps > INT32_MAX - 1) return "gated RNN: T above 2^31 - 2";
  if (plan.unit_warps &&
      (shape.batch > kGatedRnnUnitWarpsMaxRows || plan.threads != plan.units_per_block * 32 ||
       plan.threads > kGatedRnnUnitWarpsMaxThreads))
    return "gated RNN plan: the unit-warps layout takes at most 4 batch rows and 8 warps a block";
  if (plan.shared_bytes > device.max_shared_per_block)
    return "gated RNN plan: one batch row of the product does not fit in shared memory";
  return nullptr;
}

int gated_rnn_kernel_count(GatedRnnDirection direction, const GatedRnnBackwardParams& params) noexcept {
  if (direction == GatedRnnDirection::forward) return 1;
  return 3 + ((params.d_grad_R || params.d_grad_bias) ? 1 : 0);
}

}  // namespace exphil::kernels
