// The gated-RNN planner: units per block, batch tile, resident or streamed
// weights, and the workspace layout. Pure host arithmetic on the shape and
// the device's numbers (no CUDA calls), so it is unit-testable without a GPU.
#include <algorithm>
#include <cstdint>

#include "gated_rnn/gated_rnn_launch.h"

namespace exphil::kernels {

namespace {

int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

int64_t next_pow2(int64_t v) {
  int64_t p = 1;
  while (p < v) p *= 2;
  return p;
}

// Workspace pieces start on 256-byte boundaries.
int64_t take(int64_t& total, int64_t floats) {
  const int64_t at = total;
  total += ceil_div(floats, 64) * 64;
  return at;
}

// The block layout's shared memory (gated_rnn_forward.cuh,
// gated_rnn_backward.cuh): the slice of R [Cp, H] when resident; forward
// h_{t-1} [Bt, H] and the products [Bt, gated_rnn_sum_stride(Cp)];
// backward the slices' parts [Su, Bt, U] and grad_rh [Cp, Bt].
int64_t shared_floats(bool forward, bool resident, int64_t H, int64_t padded_columns,
                      int64_t slices, int64_t units, int64_t tile) {
  const int64_t slice = resident ? padded_columns * H : 0;
  return forward ? slice + tile * H + tile * gated_rnn_sum_stride(padded_columns)
                 : slice + slices * tile * units + padded_columns * tile;
}

struct Layout {
  int64_t units, groups;
};

// Units per block and batch groups. Each step every block reads its rows'
// whole state from every slice (forward h_{t-1}; backward the slices'
// parts of grad_rh R^T), so the bytes crossing L2 a step are Su * B * H
// words: fewer, wider slices move less. With B above
// kGatedRnnLatencyRows the rows are split among batch groups of at least
// kGatedRnnLatencyRows rows, as many as the multiprocessors allow with at
// most kGatedRnnPreferredColumns columns a block and the slice resident:
// every block then has about B G H / SMs of the product, and the fewest
// slices. At B <= kGatedRnnLatencyRows there is nothing to split: one
// group, one slice per multiprocessor (the most blocks, the least work
// each on the critical path). Measured over every layout (exphil_bench
// --layouts, bench/RESULTS.md): groups of 1 or 2 rows lost to groups of 4
// at B32 H256 in the forward (1.8x), and the other limits picked the
// fastest layout or one within 5% at B32 H256 and B64 H512.
// With the tensor-core product (tensor_cores) a slice must fit in its
// block's registers as fragments rather than in shared memory. With the
// backward's walk on tensor cores (walk_tensor_cores) a slice fits as
// bf16 where a group's tile reaches kGatedRnnWalkTcMinTile: at B64 T256
// H512 the LSTM's 4 groups of 16 units (its f32 slice's limit) became 8
// groups of 32, as the GRU's, and its backward took 3.29 ms against 4.62
// (bench/RESULTS.md, issue 30 run BR).
Layout choose_layout(int64_t G, int64_t B, int64_t H, int64_t sms, int64_t limit,
                     const GatedRnnLaunchOptions& options, bool forward, bool tensor_cores,
                     bool walk_tensor_cores, bool walk_split) {
  const auto units_for = [&](int64_t groups) {
    return std::min(ceil_div(H, std::max<int64_t>(sms / groups, 1)), H);
  };
  const auto fits = [&](int64_t units, int64_t groups) {
    const int64_t tile = std::min<int64_t>(next_pow2(ceil_div(B, groups)), kGatedRnnMaxBatchTile);
    if (G * units > kGatedRnnPreferredColumns) return false;
    if (tensor_cores) {
      const int parts = gated_rnn_tc_k_parts(G * units, H);
      return parts > 0 && gated_rnn_tc_shared_floats(H, G * units, tile, parts) <= limit;
    }
    const int64_t pc = gated_rnn_padded_columns(G * units);
    const int64_t slices = ceil_div(H, units);
    if (walk_tensor_cores && tile >= kGatedRnnWalkTcMinTile &&
        gated_rnn_walk_tc_shared_floats(pc, H, tile, slices, units, walk_split) <= limit)
      return true;
    return shared_floats(forward, true, H, pc, slices, units, tile) <= limit;
  };
  Layout l{options.units_per_block > 0 ? std::min<int64_t>(options.units_per_block, H) : 0,
           options.batch_blocks > 0 ? std::min<int64_t>(options.batch_blocks, B) : 0};
  // Groups of at least this many rows: the tensor-core product's 8 (one
  // instruction's rows) unless asked for at any B.
  const int64_t min_rows =
      tensor_cores && options.tensor_cores != 1 ? 8 : kGatedRnnLatencyRows;
  if (l.groups == 0) {
    l.groups = 1;
    if (B > kGatedRnnLatencyRows) {
      const int64_t slices = l.units > 0 ? ceil_div(H, l.units) : 1;
      for (int64_t g = 2; g <= std::min(B / min_rows, sms / slices); g *= 2)
        if (l.units > 0 || fits(units_for(g), g)) l.groups = g;
    }
  }
  if (l.units == 0) {
    l.units = units_for(l.groups);
    // One slice per multiprocessor unless a block would own more columns
    // than it can hold (H above 256 / G * SMs: refused by the check).
    if (options.units_per_block <= 0 && G * l.units > kGatedRnnThreads)
      l.units = std::max<int64_t>(kGatedRnnThreads / G, 1);
  }
  return l;
}

// The stack's wavefront in the block layout
// (gated_rnn_forward_stack_blocks.cuh) at B <= kGatedRnnLatencyRows, or a
// plan with stack_depth 0 where it does not fit or B is larger (measured:
// no faster than the layers one after another at B32, as the kernel's
// comment says). Every layer takes the block layout a lone forward would
// on its share of the multiprocessors (at B <= 4 one batch group), one
// block each, with twice its shared memory (the slices of R and W, two
// buffers of h, the two products), its CUDA-core product.
GatedRnnPlan stack_blocks_plan(GatedRnnCell cell, int64_t B, int64_t H, int64_t L,
                               const GatedRnnDevice& device, const GatedRnnLaunchOptions& options) {
  GatedRnnPlan plan;
  plan.device = device;
  const int64_t G = gated_rnn_gates(cell);
  const int64_t sms = std::max(device.sm_count, 1) / L;
  const int64_t limit = device.max_shared_per_block / static_cast<int64_t>(sizeof(float));
  if (sms < 1 || B > kGatedRnnLatencyRows) return plan;
  const Layout l = choose_layout(G, B, H, sms, limit / 2, options, true, false, false, false);
  const int64_t units = l.units, slices = ceil_div(H, units);
  const int64_t rows = ceil_div(B, l.groups), groups = ceil_div(B, rows);
  const int64_t tile = next_pow2(rows);
  const int64_t padded = gated_rnn_padded_columns(G * units);
  // The slices of R and W [2, C, H], two buffers of h [2, Bt, H] and the
  // two products [2, Bt, C] (at most 4 rows: their stores conflict little).
  const int64_t floats = 2 * (padded * H + tile * H + tile * padded);
  if (slices * groups > sms || tile > kGatedRnnMaxBatchTile || G * units > kGatedRnnThreads ||
      floats > limit)
    return plan;
  plan.units_per_block = static_cast<int>(units);
  plan.unit_slices = static_cast<int>(slices);
  plan.batch_blocks = static_cast<int>(groups);
  plan.batch_rows = static_cast<int>(rows);
  plan.blocks = static_cast<int>(L * slices * groups);
  plan.batch_tile = static_cast<int>(tile);
  plan.resident_weights = true;
  plan.k = static_cast<int>(H);
  plan.columns = static_cast<int>(G * units);
  plan.stored_columns = static_cast<int>(padded);
  plan.shared_bytes = static_cast<int>(floats * static_cast<int64_t>(sizeof(float)));
  plan.stack_depth = kGatedRnnStackBlocksDepth;
  int64_t total = 0;
  plan.ws_state = take(total, 2 * L * plan.stack_depth * B * H);  // 64-bit words
  plan.ws_exchange = take(total, 2 * (L - 1) * plan.stack_depth * B * G * H);
  if (cell == GatedRnnCell::lstm) plan.ws_cell = take(total, L * B * H);
  plan.ws_floats = total;
  return plan;
}

}  // namespace

GatedRnnPlan plan_gated_rnn(GatedRnnDirection direction, GatedRnnCell cell,
                            const GatedRnnShape& shape, const GatedRnnDevice& device,
                            const GatedRnnLaunchOptions& options, GatedRnnDTypes dtypes) noexcept {
  GatedRnnPlan plan;
  plan.device = device;
  const bool forward = direction == GatedRnnDirection::forward;
  const int64_t G = gated_rnn_gates(cell);
  const int64_t B = std::max<int64_t>(shape.batch, 1), T = std::max<int64_t>(shape.steps, 1);
  const int64_t H = std::max<int64_t>(shape.hidden, 1);
  const int64_t sms = std::max(device.sm_count, 1);
  const int64_t limit = device.max_shared_per_block / static_cast<int64_t>(sizeof(float));

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
      plan.unit_slices = static_cast<int>(ceil_div(H, warps));
      plan.blocks = plan.unit_slices;
      plan.batch_rows = static_cast<int>(B);
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

  // The forward at B = 1: the k-split layout, where one of its instances
  // holds a block's slice (gated_rnn_forward_k_split.cuh), with the block
  // layout's slices. Measured against the block layout at B1 (bench/RESULTS.md,
  // issue 30 runs S and T).
  if (forward && B == 1 && options.k_split != 0 && !options.streamed_weights) {
    const int64_t units = options.units_per_block > 0
                              ? std::min<int64_t>(options.units_per_block, H)
                              : std::min(ceil_div(H, sms), H);
    const int columns = gated_rnn_k_split_columns(G * units, H);
    if (columns > 0) {
      plan.k_split = true;
      plan.units_per_block = static_cast<int>(units);
      plan.unit_slices = static_cast<int>(ceil_div(H, units));
      plan.blocks = plan.unit_slices;
      plan.resident_weights = true;  // in registers
      plan.k = static_cast<int>(H);
      plan.columns = static_cast<int>(G * units);
      plan.stored_columns = columns;
      plan.shared_bytes = static_cast<int>(2 * (kGatedRnnThreads / 32) * columns * sizeof(float));
      int64_t total = 0;
      plan.ws_state = take(total, 2 * 2 * B * H);  // the exchange, 64-bit words
      plan.ws_floats = total;
      return plan;
    }
  }

  // The tensor-core product (gated_rnn_forward_tensor_cores.cuh): both
  // operands 16-bit, H in whole steps of the instruction. By default only
  // where a batch group fills the instruction's 8 rows and a block's
  // product is at least kGatedRnnTcMinProduct multiply-adds a step (as
  // asked, at any B): measured on an H100 (bench/RESULTS.md, issue 30 run
  // AC), at B64 H512 (8 rows x 96 or 128 columns x 512) the forward took
  // 0.82x (GRU) and 0.70x (LSTM) of the CUDA cores' best layout's time, at
  // B32 H256 (8 x 24 or 32 x 256, a sixteenth of that) 1.18x and 1.15x.
  const bool sequence16 = dtypes.sequence == DType::bf16 || dtypes.sequence == DType::f16;
  // f32 on tensor cores where asked (GatedRnnLaunchOptions::f32_tensor_cores):
  // the forward's R as f16 (the same fragments as an f16 R's), the walk's
  // in two bf16 halves.
  const bool f32_tc = options.f32_tensor_cores == 1 && cell != GatedRnnCell::slstm &&
                      dtypes.sequence == DType::f32 && dtypes.weight == DType::f32;
  bool tc_wanted = forward && options.tensor_cores != 0 && !options.streamed_weights &&
                   ((sequence16 && dtypes.weight == dtypes.sequence) || f32_tc) &&
                   H % 16 == 0 && (options.tensor_cores == 1 || B > kGatedRnnLatencyRows);
  // The backward's walk on tensor cores, where its tile reaches
  // kGatedRnnWalkTcMinTile (decided below, with the tile).
  const bool walk_tc_wanted = !forward && options.tensor_cores != 0 &&
                              options.walk_tensor_cores != 0 && !options.streamed_weights &&
                              ((sequence16 && dtypes.weight == DType::bf16) || f32_tc);
  const bool walk_split = walk_tc_wanted && f32_tc;
  Layout l = choose_layout(G, B, H, sms, limit, options, forward, tc_wanted, walk_tc_wanted,
                           walk_split);
  if (tc_wanted && options.tensor_cores != 1) {
    const int64_t rows = ceil_div(B, l.groups);
    const int64_t tile = std::min<int64_t>(next_pow2(rows), kGatedRnnTcMaxBatchTile);
    if (rows < 8 || tile * G * l.units * H < kGatedRnnTcMinProduct) {
      tc_wanted = false;
      l = choose_layout(G, B, H, sms, limit, options, forward, false, false, false);
    }
  }
  const int64_t units = l.units;
  const int64_t slices = ceil_div(H, units);
  const int64_t rows = ceil_div(B, l.groups);
  const int64_t groups = ceil_div(B, rows);  // none left without rows
  plan.units_per_block = static_cast<int>(units);
  plan.unit_slices = static_cast<int>(std::min<int64_t>(slices, INT32_MAX));
  plan.batch_blocks = static_cast<int>(groups);
  plan.batch_rows = static_cast<int>(std::min<int64_t>(rows, INT32_MAX));
  plan.blocks = static_cast<int>(std::min<int64_t>(slices * groups, INT32_MAX));
  const int64_t columns = G * units;
  const int64_t padded = gated_rnn_padded_columns(columns);
  plan.k = static_cast<int>(std::min<int64_t>(H, INT32_MAX));
  plan.columns = static_cast<int>(std::min<int64_t>(columns, INT32_MAX));
  plan.stored_columns = static_cast<int>(std::min<int64_t>(padded, INT32_MAX));

  // Batch tile: a power of two (the product runs that many rows), no more
  // than the group's rows need.
  const int64_t asked = std::clamp<int64_t>(options.batch_tile > 0 ? options.batch_tile : rows, 1,
                                            kGatedRnnMaxBatchTile);
  const int64_t want_tile = next_pow2(asked);
  const int64_t tc_tile = std::min<int64_t>(want_tile, kGatedRnnTcMaxBatchTile);
  const auto pair_exchange = [&](int64_t tile) {
    return forward && (options.pair_exchange == 1 ||
                       (options.pair_exchange != 0 && tile >= kGatedRnnPairMinTile));
  };
  if (const int parts = tc_wanted ? gated_rnn_tc_k_parts(columns, H) : 0;
      parts > 0 && gated_rnn_tc_shared_floats(H, columns, tc_tile, parts) <= limit) {
    plan.tensor_cores = true;
    plan.k_parts = parts;
    plan.batch_tile = static_cast<int>(tc_tile);
    plan.pair_exchange = pair_exchange(tc_tile);
    plan.shared_bytes = static_cast<int>(gated_rnn_tc_shared_floats(H, columns, tc_tile, parts) *
                                         static_cast<int64_t>(sizeof(float)));
    int64_t total = 0;
    plan.ws_state = take(total, 2 * 2 * B * H);  // the exchange, 64-bit words
    if (cell != GatedRnnCell::gru)
      plan.ws_cell = take(total, (cell == GatedRnnCell::lstm ? 1 : 3) * B * H);
    plan.ws_floats = total;
    return plan;
  }
  const auto floats = [&](bool resident, int64_t tile) {
    return shared_floats(forward, resident, H, padded, slices, units, tile);
  };
  plan.resident_weights = !options.streamed_weights && floats(true, 1) <= limit;
  int64_t tile = want_tile;
  while (tile > 1 && floats(plan.resident_weights, tile) > limit) tile /= 2;
  plan.batch_tile = static_cast<int>(tile);
  plan.pair_exchange = pair_exchange(tile);
  plan.shared_bytes = static_cast<int>(std::min<int64_t>(
      floats(plan.resident_weights, tile) * static_cast<int64_t>(sizeof(float)), INT32_MAX));

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
    plan.ws_exchange = take(total, 2 * 2 * slices * B * H);  // 64-bit words
    // grad_R / grad_bias: [H+1, G*H] summed over B*T. Split along B*T until
    // its tiles fill the device twice, each split at least 8 steps of k.
    const int64_t tiles = ceil_div(H + 1, kGatedRnnWeightGradTile) *
                          ceil_div(G * H, kGatedRnnWeightGradTile);
    const int64_t splits = std::clamp<int64_t>(
        std::min<int64_t>(ceil_div(2 * sms, tiles), (B * T) / (8 * kGatedRnnWeightGradDepth)), 1,
        kGatedRnnMaxWeightGradSplits);
    plan.weight_grad_splits = static_cast<int>(splits);
    // The recompute product [B*T, G*H] over H, split along H where its tiles
    // would leave more than half the device idle: at B1 T32 H256 its 6 tiles
    // of 128 rows (96 of them zeros) took 50 us on an H100 (bench/RESULTS.md,
    // issue 30 run V). At least 2 steps of k a split; the partial sums at
    // most kGatedRnnMaxSplitFloats.
    const int64_t rc_tiles =
        ceil_div(B * T, kGatedRnnWeightGradTile) * ceil_div(G * H, kGatedRnnWeightGradTile);
    int64_t rc = 1;
    if (2 * rc_tiles <= sms)
      rc = std::clamp<int64_t>(
          std::min<int64_t>(ceil_div(2 * sms, rc_tiles), H / (2 * kGatedRnnWeightGradDepth)), 1,
          kGatedRnnMaxWeightGradSplits);
    while (rc > 1 && rc * B * T * G * H > kGatedRnnMaxSplitFloats) rc /= 2;
    plan.recompute_splits = static_cast<int>(rc);
    // Their products on tensor cores in a 16-bit sequence: at B64 T256
    // H512 bf16 on an H200 the backward took 0.84 to 0.89x of its time with
    // them on CUDA cores, at B32 T64 H256 0.91 to 0.94x (bench/RESULTS.md,
    // issue 30 runs AF and AG). In f32 where asked (f32_tc), each f32
    // operand in two bf16 halves.
    plan.gemm_tensor_cores = options.tensor_cores != 0 && (sequence16 || f32_tc);
    plan.grad_rh_bf16 = plan.gemm_tensor_cores && dtypes.sequence == DType::bf16 &&
                        dtypes.weight == DType::bf16;
    // The walk's part product on tensor cores where R is bf16 (exact in
    // one pass) and a tile fills the instruction's 8 columns
    // (kGatedRnnWalkTcMinTile says why not 4). Its slice, transposed
    // bf16, takes about half of the f32 one's shared memory: resident
    // where the f32 slice is not (the LSTM's 32 units a block at B64 H512,
    // as choose_layout sized them: half the slices, half the words
    // exchanged a block a step).
    if (walk_tc_wanted) {
      const auto tc_floats = [&](int64_t t) {
        return gated_rnn_walk_tc_shared_floats(padded, H, t, slices, units, walk_split);
      };
      int64_t t = want_tile;
      while (t > kGatedRnnWalkTcMinTile && tc_floats(t) > limit) t /= 2;
      if (t >= kGatedRnnWalkTcMinTile && tc_floats(t) <= limit) {
        plan.walk_tensor_cores = true;
        plan.walk_split_weights = walk_split;
        plan.resident_weights = true;
        plan.batch_tile = static_cast<int>(t);
        plan.shared_bytes = static_cast<int>(tc_floats(t) * static_cast<int64_t>(sizeof(float)));
      }
    }
    // One buffer for both: the recompute's sums are added before grad_R's
    // product starts.
    const int64_t split_floats = std::max(splits > 1 ? splits * (H + 1) * G * H : 0,
                                          rc > 1 ? rc * B * T * G * H : 0);
    if (split_floats > 0) plan.ws_split = take(total, split_floats);
  }
  if (!plan.resident_weights) plan.ws_weights = take(total, plan.blocks * padded * H);
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
  if (plan.units_per_block < 1 || plan.unit_slices < 1 || plan.batch_blocks < 1 ||
      plan.batch_rows < 1 ||
      static_cast<int64_t>(plan.unit_slices) * plan.units_per_block < shape.hidden ||
      static_cast<int64_t>(plan.batch_blocks) * plan.batch_rows < shape.batch ||
      static_cast<int64_t>(plan.unit_slices) * plan.batch_blocks != plan.blocks)
    return "gated RNN plan: the blocks do not cover B and H";
  if (!plan.unit_warps && !plan.k_split &&
      plan.stored_columns != gated_rnn_padded_columns(plan.columns))
    return "gated RNN plan: the stored columns are not G*U in whole column groups";
  if (plan.k_split &&
      (shape.batch != 1 || plan.unit_warps || plan.threads != kGatedRnnThreads ||
       plan.stored_columns == 0 ||
       plan.stored_columns != gated_rnn_k_split_columns(plan.columns, shape.hidden)))
    return "gated RNN plan: the k-split layout takes one batch row, H <= 256 and a block's G*U "
           "columns in 8 or 16";
  if (plan.tensor_cores &&
      (plan.k_split || plan.unit_warps || !plan.resident_weights ||
       plan.batch_tile > kGatedRnnTcMaxBatchTile ||
       plan.threads != kGatedRnnThreads ||
       plan.k_parts != gated_rnn_tc_k_parts(plan.columns, shape.hidden)))
    return "gated RNN plan: the tensor-core product takes the block layout, H a multiple of 16 "
           "and a block's slice within its warps' registers";
  if (plan.columns > kGatedRnnThreads)
    return "gated RNN plan: more than 256 columns per block (H too large for the device's "
           "multiprocessors)";
  if (plan.weight_grad_splits < 1 || plan.weight_grad_splits > kGatedRnnMaxWeightGradSplits ||
      (plan.weight_grad_splits > 1 && plan.ws_split < 0) || plan.recompute_splits < 1 ||
      plan.recompute_splits > kGatedRnnMaxWeightGradSplits ||
      (plan.recompute_splits > 1 && plan.ws_split < 0))
    return "gated RNN plan: the backward products' splits are not 1 to 16 with their workspace";
  if (plan.batch_tile < 1 || plan.batch_tile > kGatedRnnMaxBatchTile ||
      (plan.batch_tile & (plan.batch_tile - 1)) != 0)
    return "gated RNN plan: batch tile not a power of two up to 32";
  if (plan.walk_tensor_cores &&
      (!plan.resident_weights || !plan.gemm_tensor_cores || plan.unit_warps || plan.k_split ||
       plan.tensor_cores || plan.batch_tile < kGatedRnnWalkTcMinTile || plan.ws_rh < 0 ||
       plan.shared_bytes < gated_rnn_walk_tc_shared_floats(plan.stored_columns, shape.hidden,
                                                            plan.batch_tile, plan.unit_slices,
                                                            plan.units_per_block,
                                                            plan.walk_split_weights) *
                               static_cast<int64_t>(sizeof(float))))
    return "gated RNN plan: the walk's tensor-core product takes a backward with its slice "
           "resident, tiles of 8 rows or more and the shared memory they need";
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

GatedRnnPlan plan_gated_rnn_stack(GatedRnnCell cell, const GatedRnnShape& shape, int layers,
                                  const GatedRnnDevice& device, const GatedRnnLaunchOptions& options,
                                  GatedRnnDTypes dtypes) noexcept {
  const int64_t G = gated_rnn_gates(cell);
  const int64_t B = std::max<int64_t>(shape.batch, 1), T = std::max<int64_t>(shape.steps, 1);
  const int64_t H = std::max<int64_t>(shape.hidden, 1);
  const int64_t L = std::clamp(layers, 1, kGatedRnnMaxStackLayers);
  // The wavefront at B = 1: two blocks a multiprocessor, the fewest units a
  // block (a power of two: slices of 3 units left some multiprocessors one
  // block and others two) that give every layer its blocks. Measured at B1
  // T32 H256 on an H200 (bench/RESULTS.md, issue 30 run AJ), two layers: 2
  // units a block, 256 blocks, 84.6 us a call; 4 units, 128 blocks, 95.6;
  // 3 units, 172 blocks, 106.9 (GRU f32, graph replay).
  if (B == 1 && options.k_split != 0 && options.stack_wavefront != 0 && !options.streamed_weights) {
    const int64_t room =
        static_cast<int64_t>(kGatedRnnStackBlocksPerSm) * std::max(device.sm_count, 1);
    int64_t units = 1;
    while (units < H && L * ceil_div(H, units) > room) units *= 2;
    if (options.units_per_block > 0) units = options.units_per_block;
    units = std::min(units, H);
    const int columns = gated_rnn_k_split_columns(G * units, H);
    if (columns > 0 && L * ceil_div(H, units) <= room) {
      GatedRnnPlan plan;
      plan.device = device;
      plan.k_split = true;
      plan.units_per_block = static_cast<int>(units);
      plan.unit_slices = static_cast<int>(ceil_div(H, units));
      plan.blocks = static_cast<int>(L * plan.unit_slices);
      plan.resident_weights = true;  // in registers
      plan.k = static_cast<int>(H);
      plan.columns = static_cast<int>(G * units);
      plan.stored_columns = columns;
      // The warps' sums, two buffers of [8, 2 CP] (input and recurrent columns).
      plan.shared_bytes =
          static_cast<int>(2 * (kGatedRnnThreads / 32) * 2 * columns * sizeof(float));
      plan.stack_depth = kGatedRnnStackDepth;
      int64_t total = 0;
      plan.ws_state = take(total, 2 * L * plan.stack_depth * H);  // 64-bit words
      plan.ws_floats = total;
      return plan;
    }
  }
  if (options.stack_wavefront != 0 && !options.streamed_weights)
    if (GatedRnnPlan plan = stack_blocks_plan(cell, B, H, L, device, options); plan.stack_depth > 0)
      return plan;
  // Elsewhere layer by layer: each layer's forward in its own plan, the
  // layers above the first on their input projection y_{l-1} W_l + b_l,
  // formed by gated_rnn_gemm.cuh's product into the workspace, and the
  // lower layers' y in the workspace where the caller does not want them.
  GatedRnnPlan plan = plan_gated_rnn(GatedRnnDirection::forward, cell, shape, device, options, dtypes);
  plan.stack_depth = 0;
  // The projections on tensor cores for 16-bit sequences, as the backward's
  // products (each operand in two bf16 halves), unless asked not to.
  plan.gemm_tensor_cores = options.tensor_cores != 0 &&
                           (dtypes.sequence == DType::bf16 || dtypes.sequence == DType::f16);
  int64_t total = plan.ws_floats;
  plan.ws_stack_wx = take(total, B * T * G * H);
  plan.ws_stack_y = take(total, 2 * B * T * H);
  plan.ws_floats = total;
  return plan;
}

GatedRnnPlan plan_gated_rnn_stack_backward(GatedRnnCell cell, const GatedRnnShape& shape, int layers,
                                           const GatedRnnDevice& device,
                                           const GatedRnnLaunchOptions& options,
                                           GatedRnnDTypes dtypes) noexcept {
  const int64_t G = gated_rnn_gates(cell);
  const int64_t B = std::max<int64_t>(shape.batch, 1), T = std::max<int64_t>(shape.steps, 1);
  const int64_t H = std::max<int64_t>(shape.hidden, 1);
  const int64_t L = std::clamp(layers, 1, kGatedRnnMaxStackLayers);
  // The reverse wavefront (gated_rnn_backward_stack.cuh): each layer's
  // one-layer backward plan on its share of the multiprocessors and half
  // the shared memory (the walk's block holds W's slice, grad_wx's and the
  // parts from above besides), resident.
  const bool worth_it =
      B == 1 || T >= kGatedRnnStackBackwardMinSteps || options.stack_wavefront == 1;
  if (B <= kGatedRnnLatencyRows && worth_it && L >= 2 && options.stack_wavefront != 0 &&
      !options.streamed_weights && (cell == GatedRnnCell::gru || cell == GatedRnnCell::lstm)) {
    GatedRnnDevice share = device;
    share.sm_count = device.sm_count / static_cast<int>(L);
    share.max_shared_per_block = device.max_shared_per_block / 2 / 16 * 16;
    // The stack's walk (kStack) has no tensor-core product: its layers'
    // slices are planned as f32.
    GatedRnnLaunchOptions layer_options = options;
    layer_options.walk_tensor_cores = 0;
    const GatedRnnPlan lp =
        plan_gated_rnn(GatedRnnDirection::backward, cell, shape, share, layer_options, dtypes);
    // Each batch group's rows in one batch tile: a layer checks that the
    // layer below has staged a ring slot at the group's first row only
    // (gated_rnn_walk), so with a second tile it could overwrite the slot
    // before that tile staged it. Up to B4 only a batch_tile asked for
    // below a group's rows (or a slice that leaves room for less) splits
    // it; layer by layer then.
    if (share.sm_count >= 1 && lp.resident_weights && lp.batch_tile >= lp.batch_rows &&
        !gated_rnn_unsupported(lp, cell, shape, share)) {
      GatedRnnPlan plan = lp;
      plan.device = device;
      plan.blocks = static_cast<int>(L * lp.blocks);
      plan.shared_bytes = 2 * gated_rnn_walk_shared_floats(lp) * static_cast<int>(sizeof(float));
      plan.stack_depth = kGatedRnnStackBlocksDepth;
      int64_t total = L * lp.ws_floats;
      plan.ws_stack_layer = lp.ws_floats;
      plan.ws_stack_parts =
          take(total, 2 * (L - 1) * plan.stack_depth * lp.unit_slices * B * H);  // 64-bit words
      plan.ws_stack_wx = take(total, (L - 1) * B * T * G * H);
      plan.ws_stack_grad_wx = take(total, (L - 1) * B * T * G * H);
      plan.ws_floats = total;
      return plan;
    }
  }
  // Each layer's backward in the one-layer plan; its workspace serves them
  // all in turn, and its split products' partial sums the stack's products
  // too ([recompute_splits, B*T, G*H] holds the projection's and the
  // gradient of y's; [weight_grad_splits, H+1, G*H] grad_W's).
  GatedRnnPlan plan = plan_gated_rnn(GatedRnnDirection::backward, cell, shape, device, options, dtypes);
  plan.stack_depth = 0;
  int64_t total = plan.ws_floats;
  plan.ws_stack_wx = take(total, B * T * G * H);
  plan.ws_stack_grad_wx = take(total, B * T * G * H);
  plan.ws_stack_y = take(total, B * T * H);
  plan.ws_stack_wt = take(total, G * H * H);
  plan.ws_floats = total;
  return plan;
}

const char* gated_rnn_stack_unsupported(const GatedRnnPlan& plan, GatedRnnCell cell,
                                        const GatedRnnShape& shape, int layers,
                                        const GatedRnnDevice& device) noexcept {
  if (cell != GatedRnnCell::gru && cell != GatedRnnCell::lstm)
    return "gated RNN stack: GRU and LSTM layers only";
  if (layers < 2 || layers > kGatedRnnMaxStackLayers)
    return "gated RNN stack: 2 to 4 layers";
  if (plan.stack_depth == 0) {
    // (A backward plan has ws_rh.)
    if (plan.ws_stack_wx < 0 || plan.ws_stack_y < 0 ||
        (plan.ws_rh >= 0 && (plan.ws_stack_grad_wx < 0 || plan.ws_stack_wt < 0)))
      return "gated RNN stack plan: layer by layer without its workspace";
    return gated_rnn_unsupported(plan, cell, shape, device);
  }
  if (shape.batch < 1 || shape.steps < 1 || shape.hidden < 1)
    return "gated RNN stack: B, T and H must be at least 1";
  if (shape.steps > INT32_MAX - 1) return "gated RNN stack: T above 2^31 - 2";
  if (plan.stack_depth < 2 || (plan.stack_depth & (plan.stack_depth - 1)) != 0)
    return "gated RNN stack plan: its exchange rings' depth is not a power of two >= 2";
  if (plan.ws_rh >= 0) {
    // The backward's reverse wavefront.
    if (plan.ws_stack_layer <= 0 || plan.ws_stack_parts < 0 || plan.ws_stack_wx < 0 ||
        plan.ws_stack_grad_wx < 0)
      return "gated RNN stack backward plan: the reverse wavefront without its workspace";
    if (static_cast<int64_t>(plan.unit_slices) * plan.batch_blocks * layers != plan.blocks ||
        plan.k_split || plan.unit_warps || plan.tensor_cores)
      return "gated RNN stack backward plan: the blocks do not cover B and H in every layer";
    if (plan.walk_tensor_cores)
      return "gated RNN stack backward plan: the reverse wavefront's walk runs on CUDA cores";
    if (plan.batch_tile < plan.batch_rows)
      return "gated RNN stack backward plan: the reverse wavefront takes a batch group's rows in one "
             "batch tile";
    if (!plan.resident_weights)
      return "gated RNN stack backward plan: the reverse wavefront holds its slices in shared memory";
    if (plan.blocks > device.sm_count)
      return "gated RNN stack: more blocks (layers x batch groups x slices) than multiprocessors";
    if (plan.shared_bytes < 2 * gated_rnn_walk_shared_floats(plan) * static_cast<int>(sizeof(float)))
      return "gated RNN stack backward plan: less shared memory than its walk takes";
    return gated_rnn_unsupported(gated_rnn_stack_layer_plan(plan, 0), cell, shape, device);
  }
  if (!plan.k_split) {
    // The block layout's wavefront.
    if (shape.hidden > (int64_t{1} << 24)) return "gated RNN: H above 2^24";
    if (plan.units_per_block < 1 || plan.unit_slices < 1 || plan.batch_blocks < 1 ||
        plan.batch_rows < 1 ||
        static_cast<int64_t>(plan.unit_slices) * plan.units_per_block < shape.hidden ||
        static_cast<int64_t>(plan.batch_blocks) * plan.batch_rows < shape.batch ||
        static_cast<int64_t>(plan.unit_slices) * plan.batch_blocks * layers != plan.blocks ||
        plan.threads != kGatedRnnThreads)
      return "gated RNN stack plan: the blocks do not cover B and H in every layer";
    if (plan.batch_tile < plan.batch_rows || plan.batch_tile > kGatedRnnMaxBatchTile ||
        (plan.batch_tile & (plan.batch_tile - 1)) != 0)
      return "gated RNN stack plan: a batch group's rows not within one batch tile (a power of "
             "two up to 32)";
    if (plan.columns > kGatedRnnThreads || plan.stored_columns != gated_rnn_padded_columns(plan.columns) ||
        !plan.resident_weights || plan.tensor_cores || plan.unit_warps)
      return "gated RNN stack plan: the wavefront's blocks hold their slices of R and W in "
             "shared memory, at most 256 columns";
    if (plan.blocks > device.sm_count)
      return "gated RNN stack: more blocks (layers x batch groups x slices) than multiprocessors";
    if (plan.ws_state < 0 || plan.ws_exchange < 0 || (cell == GatedRnnCell::lstm && plan.ws_cell < 0))
      return "gated RNN stack plan: the wavefront without its workspace";
    if (plan.shared_bytes > device.max_shared_per_block)
      return "gated RNN stack plan: its slices do not fit in shared memory";
    return nullptr;
  }
  if (shape.batch != 1) return "gated RNN stack: the k-split wavefront takes one batch row (B = 1)";
  if (plan.units_per_block < 1 || plan.unit_slices < 1 ||
      static_cast<int64_t>(plan.unit_slices) * plan.units_per_block < shape.hidden ||
      static_cast<int64_t>(plan.unit_slices) * layers != plan.blocks || !plan.k_split ||
      plan.threads != kGatedRnnThreads)
    return "gated RNN stack plan: the blocks do not cover H in every layer";
  if (plan.stored_columns == 0 ||
      plan.stored_columns != gated_rnn_k_split_columns(plan.columns, shape.hidden))
    return "gated RNN stack: the wavefront takes H <= 256 and a block's G*U columns within 16";
  if (plan.blocks > static_cast<int64_t>(kGatedRnnStackBlocksPerSm) * device.sm_count)
    return "gated RNN stack: more blocks (layers x ceil(H / U)) than two a multiprocessor";
  if (plan.shared_bytes > device.max_shared_per_block)
    return "gated RNN stack plan: its sums do not fit in shared memory";
  return nullptr;
}

int gated_rnn_kernel_count(GatedRnnDirection direction, const GatedRnnBackwardParams& params,
                           const GatedRnnPlan& plan) noexcept {
  if (direction == GatedRnnDirection::forward) return 1;
  const int recompute = plan.recompute_splits > 1 ? 2 : 1;
  if (!params.d_grad_R && !params.d_grad_bias) return recompute + 2;
  return recompute + 2 + (plan.weight_grad_splits > 1 ? 2 : 1);
}

int gated_rnn_stack_backward_kernel_count(const GatedRnnStackBackwardParams& params,
                                          const GatedRnnPlan& plan) noexcept {
  const int split = plan.recompute_splits > 1 ? 2 : 1;  // the products over H or G*H
  const int grad_split = plan.weight_grad_splits > 1 ? 2 : 1;
  if (plan.stack_depth > 0) {
    // The reverse wavefront: one walk; per layer the recompute product and
    // the gates, grad_R's product where wanted; above the first the
    // projection again and grad_W's product where wanted.
    int n = 1;
    for (int l = 0; l < params.layers && l < kGatedRnnMaxStackLayers; ++l) {
      const GatedRnnBackwardParams& b = params.layer[l];
      n += split + 1 + (b.d_grad_R || b.d_grad_bias ? grad_split : 0);
      if (l > 0) n += split + (params.d_grad_W[l] || params.d_grad_W_bias[l] ? grad_split : 0);
    }
    return n;
  }
  int n = 0;
  for (int l = 0; l < params.layers && l < kGatedRnnMaxStackLayers; ++l) {
    n += gated_rnn_kernel_count(GatedRnnDirection::backward, params.layer[l], plan);
    if (l == 0) continue;
    n += split + 1 + split;  // the projection, W's transpose, the gradient of y below
    if (params.d_grad_W[l] || params.d_grad_W_bias[l]) n += plan.weight_grad_splits > 1 ? 2 : 1;
  }
  return n;
}

}  // namespace exphil::kernels
