// Host-facing entry points of the gated-RNN kernels (GRU, LSTM and sLSTM
// sequences): device query, plan, check, workspace, launch. No device code;
// the runtime includes this and nothing else of cuda/gated_rnn/.
//
// A call: the device's numbers (query_gated_rnn_device, or the runtime's,
// read once per device); plan_gated_rnn, which records them; reject the
// call if gated_rnn_unsupported says why; allocate gated_rnn_workspace_bytes
// of device memory ordered on the stream; launch_gated_rnn_forward or
// _backward. The launch also checks, with the occupancy API, that every block
// of the persistent kernel can be resident at once (its blocks wait on each
// other every step), and fails with cudaErrorCooperativeLaunchTooLarge, naming the
// check, before launching anything if not.
#pragma once

#include <cstddef>
#include <cstdint>

#include <cuda_runtime_api.h>

#include "common/launch_result.h"
#include "gated_rnn/gated_rnn_params.h"

// The layout helpers below are used by the planner (host) and the kernels
// (device).
#if defined(__CUDACC__)
#define EXPHIL_GATED_RNN_HD __host__ __device__
#else
#define EXPHIL_GATED_RNN_HD
#endif

namespace exphil::kernels {

// Batch rows a block carries through one pass of its slice (one register
// accumulator each).
inline constexpr int kGatedRnnMaxBatchTile = 32;
// Threads of every gated-RNN kernel block.
inline constexpr int kGatedRnnThreads = 256;
// The block layout stores a slice's columns of R in groups of this many
// (zeros past G*U): the forward's product takes a group at a time.
inline constexpr int kGatedRnnColumnGroup = 4;
inline constexpr int64_t gated_rnn_padded_columns(int64_t columns) noexcept {
  return (columns + kGatedRnnColumnGroup - 1) / kGatedRnnColumnGroup * kGatedRnnColumnGroup;
}
// The block layout forward's sums [tile, stride] on CUDA cores: an odd row
// stride, so that the product's stores of a column's rows (lanes a row
// apart) fall in distinct banks. At a stride of 64 floats they took 16
// wavefronts a store (bench/RESULTS.md, issue 30 run CN); at C + 1 the
// forward took 0.6 to 3.5% less at B64 T64 H512 f32 and at the LSTM's B32
// T64 H256 (runs CR and CS, graph replay against main in the same run).
EXPHIL_GATED_RNN_HD constexpr int gated_rnn_sum_stride(int64_t padded_columns) noexcept {
  return static_cast<int>(padded_columns + 1);
}
// Batch sizes up to this run as one batch group (the latency layout); above
// it the rows are split among groups of blocks, at least this many rows a
// group (gated_rnn_plan.cpp), whose slices then own at most
// kGatedRnnPreferredColumns columns of R.
inline constexpr int64_t kGatedRnnLatencyRows = 4;
inline constexpr int64_t kGatedRnnPreferredColumns = 128;
// The backward's products (gated_rnn_gemm.cuh): output tile side, depth of
// one step of k, and the most slices the grad_R product is split into.
inline constexpr int64_t kGatedRnnWeightGradTile = 128;
inline constexpr int64_t kGatedRnnWeightGradDepth = 16;
inline constexpr int64_t kGatedRnnMaxWeightGradSplits = 16;
// The most floats of partial sums the split products may keep (64 MB).
inline constexpr int64_t kGatedRnnMaxSplitFloats = int64_t{16} << 20;
// The forward's unit-warps layout (gated_rnn_forward_unit_warps.cuh): batch
// rows it carries (one accumulator per gate and row in every lane) and its
// largest block (8 warps, 8 units).
inline constexpr int kGatedRnnUnitWarpsMaxRows = 4;
inline constexpr int kGatedRnnUnitWarpsMaxThreads = 256;
// The forward's k-split layout at B = 1 (gated_rnn_forward_k_split.cuh):
// its instances' columns (the fewest of 8 or 16 that hold G*U) for a slice
// of `columns` columns and `hidden` rows (a thread a row: at most 256), or
// 0 where none fits.
constexpr int gated_rnn_k_split_columns(int64_t columns, int64_t hidden) noexcept {
  if (hidden > kGatedRnnThreads) return 0;
  return columns <= 8 ? 8 : columns <= 16 ? 16 : 0;
}

// The stacked forward (gated_rnn_forward_stack.cuh): the slots of each
// layer's exchange ring the planner gives (GatedRnnPlan::stack_depth), and
// the blocks a multiprocessor holds (its __launch_bounds__).
inline constexpr int kGatedRnnStackDepth = 32;
inline constexpr int kGatedRnnStackBlocksPerSm = 2;
// The stacked forward's wavefront in the block layout
// (gated_rnn_forward_stack_blocks.cuh): its rings' slots (a layer above
// trails by about two steps; the rest absorbs the steps' jitter).
inline constexpr int kGatedRnnStackBlocksDepth = 8;
// The stack's reverse wavefront (gated_rnn_backward_stack.cuh) is the
// automatic plan up to kGatedRnnLatencyRows rows, above B = 1 from this
// many steps: at one step there is nothing to overlap, and on 1 / L of the
// multiprocessors each layer's walk has L times the units a block. L2 H256
// (bench/RESULTS.md, issue 30 run BF): B1 1.01 to 1.21x the layers one
// after another at T 1 to 64; B2 and B4 0.90 to 0.97x at T1, 0.99 to 1.17x
// at T 2 to 64. GatedRnnLaunchOptions::stack_wavefront = 1 asks for it
// at any T.
inline constexpr int64_t kGatedRnnStackBackwardMinSteps = 2;

// The forward's tensor-core product (gated_rnn_forward_tensor_cores.cuh).
// A warp holds at most kGatedRnnTcWarpTiles 16-column tiles of its block's
// slice by kGatedRnnTcWarpSteps 16-deep steps of H, as A fragments in
// registers (128 a thread).
inline constexpr int kGatedRnnTcWarpTiles = 2;
inline constexpr int kGatedRnnTcWarpSteps = 16;
// Its batch tile: at most 16 rows (two instructions' 8) a pass.
inline constexpr int kGatedRnnTcMaxBatchTile = 16;
// The smallest product a block takes to tensor cores by default: batch
// tile x G*U columns x H multiply-adds a step (gated_rnn_plan.cpp says why).
inline constexpr int64_t kGatedRnnTcMinProduct = int64_t{1} << 18;
// The parts the 8 warps of a block cut the depth H into, for a slice of
// `columns` columns: the fewest of 1, 2, 4 or 8 that leave the busiest
// warp the fewest fragments, within what a warp holds; 0 where none fits
// or H is not a multiple of 16.
constexpr int gated_rnn_tc_k_parts(int64_t columns, int64_t hidden) noexcept {
  if (columns < 1 || hidden < 16 || hidden % 16 != 0) return 0;
  const int64_t tiles = (columns + 15) / 16, steps = hidden / 16;
  constexpr int kWarps = kGatedRnnThreads / 32;
  int best = 0;
  int64_t best_work = 0;
  for (int parts = 1; parts <= kWarps; parts *= 2) {
    const int64_t groups = kWarps / parts;
    const int64_t mw = (tiles + groups - 1) / groups, kw = (steps + parts - 1) / parts;
    if (mw > kGatedRnnTcWarpTiles || kw > kGatedRnnTcWarpSteps) continue;
    if (best == 0 || mw * kw < best_work) {
      best = parts;
      best_work = mw * kw;
    }
  }
  return best;
}
// Its shared memory: h_{t-1} [rows, H + 8] (rows = the batch tile, at
// least the instruction's 8; the 8 floats of padding put a fragment's 8
// rows in distinct banks) and each part's sums [k_parts, rows, columns
// rounded up to 16, + 4] (the 4 spread a fragment's stores over the banks).
EXPHIL_GATED_RNN_HD constexpr int64_t gated_rnn_tc_rows(int64_t tile) noexcept { return tile < 8 ? 8 : tile; }
EXPHIL_GATED_RNN_HD constexpr int64_t gated_rnn_tc_x_stride(int64_t hidden) noexcept { return hidden + 8; }
EXPHIL_GATED_RNN_HD constexpr int64_t gated_rnn_tc_sum_stride(int64_t columns) noexcept {
  return (columns + 15) / 16 * 16 + 4;
}
EXPHIL_GATED_RNN_HD constexpr int64_t gated_rnn_tc_shared_floats(int64_t hidden, int64_t columns, int64_t tile,
                                             int64_t parts) noexcept {
  const int64_t rows = gated_rnn_tc_rows(tile);
  return rows * gated_rnn_tc_x_stride(hidden) + parts * rows * gated_rnn_tc_sum_stride(columns);
}

// The reverse walk's shared memory in the block layout, resident (R's
// slice [C, H], grad_rh of the slice [C, Bt], the slices' parts [Su, Bt,
// U]), rounded up to whole float4s: the stack's walk puts a second set
// (W's slice, grad_wx's, the parts from above) after it.
EXPHIL_GATED_RNN_HD constexpr int gated_rnn_walk_shared_floats(const GatedRnnPlan& p) noexcept {
  const int64_t f = static_cast<int64_t>(p.stored_columns) * p.k +
                    static_cast<int64_t>(p.stored_columns) * p.batch_tile +
                    static_cast<int64_t>(p.unit_slices) * p.batch_tile * p.units_per_block;
  return static_cast<int>((f + 3) / 4 * 4);
}

// The reverse walk's part product on tensor cores (gated_rnn_backward.cuh,
// gated_rnn_part_product_tc): the block's slice of R transposed, bf16
// [rows][ld], rows H rounded up to the instruction's 16, ld the stored
// columns rounded up to its depth of 16 plus 8 (an odd number of 16-byte
// units a row: the 8 rows an ldmatrix reads fall in distinct banks), in
// whole float4s; then grad_rh of the slice and the slices' parts as on
// CUDA cores. Its smallest batch tile: the instruction's 8 columns full.
// With 4 rows (half of them) the walk measured slower than on CUDA cores
// (B32 T64 H256 bf16 on an H200, tiles of 4: GRU 346 against 318 us, LSTM
// 376 against 361; at B64 H512 in tiles of 8, GRU 2.48 against 2.96 ms:
// bench/RESULTS.md, issue 30 run BR).
inline constexpr int kGatedRnnWalkTcMinTile = 8;

// The backward's gates step (gated_rnn_backward.cuh, step 2): the steps of
// a chunk a thread takes at once, and the LSTM's chunks side by side (the
// warps of its blocks, 32 columns each).
inline constexpr int kGatedRnnGatesChunk = 8;
inline constexpr int kGatedRnnLstmGatesWarps = 8;

// The forward's smallest batch tile for its exchange in pair words (two
// rows a word, gated_rnn_pair_word.h; GatedRnnPlan::pair_exchange). On an
// H200 (bench/RESULTS.md, issue 30 runs CB and CD, ncu, the forward with
// and without them in one run) pair words took 6 to 7% less at B64 T256
// H512 GRU bf16 (tiles of 8, tensor cores) and 3 to 4% less with LSTM f32
// (tiles of 16), 14 to 18% more at B32 T64 H256 (tiles of 4). A runtime
// flag rather than the kernel's template parameter cost the unpaired
// LSTM's forward 3 to 4% (run CD's bench against run CC's).
inline constexpr int kGatedRnnPairMinTile = 8;
EXPHIL_GATED_RNN_HD constexpr int64_t gated_rnn_walk_tc_depth(int64_t columns) noexcept {
  return (columns + 15) / 16 * 16;
}
EXPHIL_GATED_RNN_HD constexpr int64_t gated_rnn_walk_tc_ld(int64_t columns) noexcept {
  return gated_rnn_walk_tc_depth(columns) + 8;
}
EXPHIL_GATED_RNN_HD constexpr int64_t gated_rnn_walk_tc_rows(int64_t hidden) noexcept {
  return (hidden + 15) / 16 * 16;
}
// One bf16 array of the slice; `split` (GatedRnnPlan::walk_split_weights):
// two, the rests' right after the nearest values'.
EXPHIL_GATED_RNN_HD constexpr int64_t gated_rnn_walk_tc_array_floats(int64_t columns, int64_t hidden) noexcept {
  return (gated_rnn_walk_tc_rows(hidden) * gated_rnn_walk_tc_ld(columns) / 2 + 3) / 4 * 4;
}
EXPHIL_GATED_RNN_HD constexpr int64_t gated_rnn_walk_tc_slice_floats(int64_t columns, int64_t hidden,
                                                                  bool split = false) noexcept {
  return (split ? 2 : 1) * gated_rnn_walk_tc_array_floats(columns, hidden);
}
EXPHIL_GATED_RNN_HD constexpr int64_t gated_rnn_walk_tc_shared_floats(int64_t columns, int64_t hidden,
                                                                   int64_t tile, int64_t slices,
                                                                   int64_t units,
                                                                   bool split = false) noexcept {
  return gated_rnn_walk_tc_slice_floats(columns, hidden, split) + columns * tile +
         slices * tile * units;
}

// Layer l's one-layer backward plan within the stack's reverse wavefront
// plan: its share of the blocks, its workspace at l * ws_stack_layer.
EXPHIL_GATED_RNN_HD inline GatedRnnPlan gated_rnn_stack_layer_plan(const GatedRnnPlan& plan,
                                                                  int l) noexcept {
  GatedRnnPlan p = plan;
  const int64_t o = static_cast<int64_t>(l) * plan.ws_stack_layer;
  int64_t* const at[] = {&p.ws_weights, &p.ws_state, &p.ws_exchange, &p.ws_cell,
                         &p.ws_rh,      &p.ws_gates, &p.ws_c,        &p.ws_split};
  for (int64_t* a : at)
    if (*a >= 0) *a += o;
  p.blocks = plan.unit_slices * plan.batch_blocks;
  p.stack_depth = 0;
  return p;
}

// The multiprocessor count and shared-memory limits of `device`.
cudaError_t query_gated_rnn_device(int device, GatedRnnDevice& out) noexcept;

// Chooses the layout of one call (gated_rnn_plan.cpp): units per block and
// batch groups (at B <= 4 one group and ceil(H / SMs) units: one block per
// multiprocessor; above, the rows split among groups so that the slices are
// fewer and wider), batch tile (the most rows up to 32 that fit), and
// whether R's slices fit in shared memory (resident) or are read from the
// workspace each step (streamed). With
// options.unit_warps = 1 a forward with B <= 4 takes the unit-warps layout
// (a warp per hidden unit, 1 to 8 a block) where the block's columns of R
// fit in shared memory. Otherwise a forward at B = 1 takes the k-split
// layout where an instance fits, unless options.k_split = 0. A forward in
// the block layout above B = 4 runs its product on tensor cores where R
// and the sequence are both bf16 or both f16 (it multiplies R's own
// words), H is a multiple of 16 and a block's fragments fit in its warps'
// registers, unless options.tensor_cores = 0. A backward runs its two
// products on tensor cores where the sequence is bf16 or f16 (they split
// any operand into bf16 halves), unless options.tensor_cores = 0.
struct GatedRnnDTypes {
  DType sequence = DType::f32;  // wx, y and the gradients of the sequence
  DType weight = DType::f32;    // R and the bias
};
GatedRnnPlan plan_gated_rnn(GatedRnnDirection direction, GatedRnnCell cell,
                            const GatedRnnShape& shape, const GatedRnnDevice& device,
                            const GatedRnnLaunchOptions& options = {},
                            GatedRnnDTypes dtypes = {}) noexcept;

// The stacked forward's layout. Unless options.stack_wavefront = 0 or
// options.streamed_weights, the wavefront (stack_depth > 0): at B = 1,
// unless options.k_split = 0, the k-split layout per layer
// (gated_rnn_forward_stack.cuh) with U units a block, U the smallest power
// of two that fits all `layers` x ceil(H / U) blocks at two a
// multiprocessor (options.units_per_block overrides it), where that fits
// (H <= 256, G*U <= 16); elsewhere the block layout per layer
// (gated_rnn_forward_stack_blocks.cuh) at B <= 4, each layer the one a
// lone forward takes on 1 / layers of the multiprocessors, where the
// slices of R and W fit in shared memory. Else
// the layers one after another, each in plan_gated_rnn's forward plan
// (stack_depth 0). gated_rnn_stack_unsupported
// says why a stack cannot run (layers outside 2 to kGatedRnnMaxStackLayers,
// an sLSTM, or what gated_rnn_unsupported says of the layers' plan), else
// nullptr.
GatedRnnPlan plan_gated_rnn_stack(GatedRnnCell cell, const GatedRnnShape& shape, int layers,
                                  const GatedRnnDevice& device,
                                  const GatedRnnLaunchOptions& options = {},
                                  GatedRnnDTypes dtypes = {}) noexcept;
const char* gated_rnn_stack_unsupported(const GatedRnnPlan& plan, GatedRnnCell cell,
                                        const GatedRnnShape& shape, int layers,
                                        const GatedRnnDevice& device) noexcept;
// The stack's backward. At B <= 4 (above B = 1 from
// kGatedRnnStackBackwardMinSteps steps unless options.stack_wavefront = 1),
// unless options.stack_wavefront = 0 or options.streamed_weights, the
// reverse wavefront (stack_depth > 0,
// gated_rnn_backward_stack.cuh): every layer's walk in one launch, each
// layer in plan_gated_rnn's backward plan on 1 / layers of the
// multiprocessors and half the shared memory, resident, its workspace at l
// * ws_stack_layer. Elsewhere the layers' backwards from the top down, each
// in plan_gated_rnn's backward plan, with the workspace for the stack's
// own products (stack_depth 0). gated_rnn_stack_unsupported checks both.
GatedRnnPlan plan_gated_rnn_stack_backward(GatedRnnCell cell, const GatedRnnShape& shape, int layers,
                                           const GatedRnnDevice& device,
                                           const GatedRnnLaunchOptions& options = {},
                                           GatedRnnDTypes dtypes = {}) noexcept;

// nullptr if the kernels can run `plan` on `shape`, else why not
// (CUTLASS's can_implement).
const char* gated_rnn_unsupported(const GatedRnnPlan& plan, GatedRnnCell cell,
                                  const GatedRnnShape& shape,
                                  const GatedRnnDevice& device) noexcept;

// Temporary device memory the launch needs (f32, 256-byte aligned pieces).
inline std::size_t gated_rnn_workspace_bytes(const GatedRnnPlan& plan) noexcept {
  return static_cast<std::size_t>(plan.ws_floats) * sizeof(float);
}

// Kernel launches the call makes: forward 1; backward 3 to 6 (the
// recompute product, with its reduction when split, gates, the persistent
// kernel, and the grad_R / grad_bias product when wanted, with its
// reduction when split).
int gated_rnn_kernel_count(GatedRnnDirection direction, const GatedRnnBackwardParams& params,
                           const GatedRnnPlan& plan) noexcept;
// The stack's backward: each layer's backward; per layer above the first
// its input projection again, the transpose of W, the gradient of the layer
// below's y, and grad_W / grad_W_bias when wanted (each product with its
// reduction when split).
int gated_rnn_stack_backward_kernel_count(const GatedRnnStackBackwardParams& params,
                                          const GatedRnnPlan& plan) noexcept;

// Enqueue the kernels on `stream` (the current device must own it).
// d_workspace: gated_rnn_workspace_bytes(plan) of device memory, 256-byte
// aligned, ordered on `stream`; its contents need no initialisation.
LaunchResult launch_gated_rnn_forward(const GatedRnnForwardParams& params, const GatedRnnPlan& plan,
                                      float* d_workspace, cudaStream_t stream) noexcept;
LaunchResult launch_gated_rnn_backward(const GatedRnnBackwardParams& params,
                                       const GatedRnnPlan& plan, float* d_workspace,
                                       cudaStream_t stream) noexcept;
// The stack: params.layer[0]'s cell and dtypes for every layer; the plan
// from plan_gated_rnn_stack (one launch, or per layer a product and a
// forward).
LaunchResult launch_gated_rnn_stack_forward(const GatedRnnStackParams& params,
                                            const GatedRnnPlan& plan, float* d_workspace,
                                            cudaStream_t stream) noexcept;
// The stack's backward, the plan from plan_gated_rnn_stack_backward.
LaunchResult launch_gated_rnn_stack_backward(const GatedRnnStackBackwardParams& params,
                                             const GatedRnnPlan& plan, float* d_workspace,
                                             cudaStream_t stream) noexcept;

}  // namespace exphil::kernels
