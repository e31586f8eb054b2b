// The contract between the host runtime and the gated-RNN kernels (GRU, LSTM
// and sLSTM sequences with their recurrent product fused in): plain structs, no
// device code, filled by the host glue after validation and read by
// cuda/gated_rnn/. gated_rnn_forward.cuh gives the math, gate orders and
// bias conventions; gated_rnn_launch.h the entry points.
#pragma once

#include <cstdint>

#include "exphil/tensor.hpp"

namespace exphil::kernels {

enum class GatedRnnCell : int32_t {
  gru = 0,    // G = 3 gates, in the order r, z, n
  lstm = 1,   // G = 4 gates, in the order i, f, g, o
  slstm = 2,  // G = 4 gates, in the order i, f, z, o (xLSTM's, exponential i and f)
};

constexpr int gated_rnn_gates(GatedRnnCell cell) noexcept {
  return cell == GatedRnnCell::gru ? 3 : 4;
}
// The same, as a constant device code can use.
template <GatedRnnCell kCell>
inline constexpr int kGatedRnnGates = kCell == GatedRnnCell::gru ? 3 : 4;

struct GatedRnnShape {
  int64_t batch = 0;   // B
  int64_t steps = 0;   // T
  int64_t hidden = 0;  // H
};

// Every pointer is device memory, row-major, unstrided. Optional pointers
// are null when absent.
//   dtype         wx, y (and, backward, grad_y, grad_wx, grad_rh)
//   weight_dtype  R, bias (and grad_R, grad_bias): f32 or dtype
//   state_dtype   h0, c0, n0, m0 and the final states (and their gradients): f32
//                 or dtype
// Sequence arithmetic, the state and every sum are f32 whatever the dtypes.
struct GatedRnnForwardParams {
  GatedRnnShape shape;
  GatedRnnCell cell = GatedRnnCell::gru;
  DType dtype = DType::f32;
  DType weight_dtype = DType::f32;
  DType state_dtype = DType::f32;
  const void* d_wx = nullptr;    // [B, T, G*H], the input projection (its bias included)
  const void* d_R = nullptr;     // [H, G*H]
  const void* d_bias = nullptr;  // [G*H] recurrent bias, optional
  const void* d_h0 = nullptr;    // [B, H], optional (zeros)
  const void* d_c0 = nullptr;    // [B, H], LSTM and sLSTM, optional (zeros)
  const void* d_n0 = nullptr;    // [B, H], sLSTM only, optional (ones)
  const void* d_m0 = nullptr;    // [B, H], sLSTM only, optional (zeros)
  void* d_y = nullptr;           // [B, T, H], every h_t; required
  void* d_h_final = nullptr;     // [B, H], optional
  void* d_c_final = nullptr;     // [B, H], LSTM and sLSTM, optional
  void* d_n_final = nullptr;     // [B, H], sLSTM only, optional
  void* d_m_final = nullptr;     // [B, H], sLSTM only, optional
};

// The forward's inputs and its output y (read: the backward recomputes the
// gates from it), the output gradients, and the input gradients (each null
// when not wanted).
struct GatedRnnBackwardParams {
  GatedRnnForwardParams fwd;            // d_y read; the final-state outputs unused
  const void* d_grad_y = nullptr;       // [B, T, H]; required
  const void* d_grad_h_final = nullptr; // [B, H], optional (zeros)
  const void* d_grad_c_final = nullptr; // [B, H], LSTM and sLSTM, optional (zeros)
  const void* d_grad_n_final = nullptr; // [B, H], sLSTM only, optional (zeros)
  const void* d_grad_m_final = nullptr; // [B, H], sLSTM only, optional (zeros)
  void* d_grad_wx = nullptr;            // [B, T, G*H]
  void* d_grad_R = nullptr;             // [H, G*H]
  void* d_grad_bias = nullptr;          // [G*H] (also when fwd.d_bias is absent: at bias = 0)
  void* d_grad_h0 = nullptr;            // [B, H]
  void* d_grad_c0 = nullptr;            // [B, H], LSTM and sLSTM
  void* d_grad_n0 = nullptr;            // [B, H], sLSTM only
  void* d_grad_m0 = nullptr;            // [B, H], sLSTM only
  // [B, T, G*H] the gradient of the recurrent pre-activations h_{t-1} R +
  // bias (Edifice's grad_rh). Equal to grad_wx except the GRU's n gate,
  // where it is grad_wx_n * r. grad_R = sum_t h_{t-1}^T grad_rh_t.
  void* d_grad_rh = nullptr;
};

// Stacked GRU or LSTM layers, forward (gated_rnn_forward_stack.cuh and
// gated_rnn_forward_stack_blocks.cuh): in one launch where it fits, else
// layer by layer. layer[l] is layer l's call
// as GatedRnnForwardParams: every layer has the same shape, cell and
// dtypes; layer 0 takes its wx, the layers above take W and W_bias instead
// (their wx is the layer below's y times W_l plus W_bias_l, formed by the
// kernels); every layer's y is optional except the last's.
inline constexpr int kGatedRnnMaxStackLayers = 4;
struct GatedRnnStackParams {
  int layers = 0;  // L, 2 to kGatedRnnMaxStackLayers
  GatedRnnForwardParams layer[kGatedRnnMaxStackLayers];
  const void* d_W[kGatedRnnMaxStackLayers] = {};       // [H, G*H], layers 1 to L-1 (weight_dtype)
  const void* d_W_bias[kGatedRnnMaxStackLayers] = {};  // [G*H], layers 1 to L-1, optional
};

// The stack's backward (run_gated_rnn_stack_backward, gated_rnn_launch.cuh):
// layer l's one-layer backward as GatedRnnBackwardParams, from the top
// layer down. layer[l].fwd is the forward's layer l (its y read: the last
// layer's y, the lower layers' y_lower slices); layer 0's fwd.d_wx is the
// caller's, the layers above have none (the launcher forms their wx again
// from the layer below's y, W and W_bias). layer[l].d_grad_y is the
// gradient reaching y_l from outside the stack: required for the last
// layer, optional below (the launcher adds the gradient through the layer
// above). layer[l].d_grad_wx is the caller's for layer 0 only (the layers
// above: null, the launcher's workspace); grad_rh is not offered.
struct GatedRnnStackBackwardParams {
  int layers = 0;  // L, 2 to kGatedRnnMaxStackLayers
  GatedRnnBackwardParams layer[kGatedRnnMaxStackLayers];
  const void* d_W[kGatedRnnMaxStackLayers] = {};       // [H, G*H], layers 1 to L-1
  const void* d_W_bias[kGatedRnnMaxStackLayers] = {};  // [G*H], layers 1 to L-1, optional
  void* d_grad_W[kGatedRnnMaxStackLayers] = {};        // [H, G*H], layers 1 to L-1, optional
  void* d_grad_W_bias[kGatedRnnMaxStackLayers] = {};   // [G*H], layers 1 to L-1, optional
};

enum class GatedRnnDirection { forward, backward };

// What the planner needs to know of the device (query_gated_rnn_device).
struct GatedRnnDevice {
  int sm_count = 0;
  int max_shared_per_block = 0;  // opt-in maximum, bytes
  int max_shared_per_sm = 0;     // bytes
};

// Test and benchmark overrides; zero or false chooses automatically.
struct GatedRnnLaunchOptions {
  int units_per_block = 0;       // hidden units per block of the persistent kernel
  int batch_blocks = 0;          // blocks sharing one slice of units, each with its own rows
  int batch_tile = 0;            // batch rows per pass (rounded up to a power of 2, at most
                                 // kGatedRnnMaxBatchTile)
  bool streamed_weights = false; // force the streamed path (R slice in the workspace)
  // Forward only: 1 asks for the unit-warps layout (taken where the plan
  // allows it); -1 (automatic) and 0 give the block layout.
  int unit_warps = -1;           // -1 automatic, 0 block tiles, 1 unit warps
  // Forward only: the k-split layout at B = 1 (gated_rnn_forward_k_split.cuh),
  // -1 (automatic) and 1 where it fits, 0 never.
  int k_split = -1;
  // Forward, block layout: the recurrent product on tensor cores
  // (gated_rnn_forward_tensor_cores.cuh) where R and the sequence are both
  // bf16 or both f16 and H is a multiple of 16; -1 (automatic) above B = 4,
  // 1 at any B, 0 never. Backward: its two products (gated_rnn_gemm.cuh) on
  // tensor cores where the sequence is bf16 or f16; -1 and 1 there, 0 never.
  int tensor_cores = -1;
  // Backward: the reverse walk's part product on tensor cores
  // (gated_rnn_part_product_tc) where tensor_cores allows the products
  // there and the weights are bf16; -1 (automatic) and 1 where its tile has
  // 8 rows or more and its slice fits (the layout then sized with the
  // slice as bf16: choose_layout in gated_rnn_plan.cpp), 0 never.
  int walk_tensor_cores = -1;
  // Forward, block layout: its exchange two rows a word; -1 (automatic)
  // with tiles of kGatedRnnPairMinTile rows or more, 1 at any tile, 0 never.
  int pair_exchange = -1;
  // The stacked forward: -1 (automatic) and 1 run the layers in one launch
  // (the wavefront) where it fits, 0 one after another.
  int stack_wavefront = -1;
  // GRU and LSTM with an f32 sequence and f32 weights: 1 runs the forward's
  // product (gated_rnn_forward_tensor_cores.cuh) and the backward's walk
  // (gated_rnn_walk_tensor_cores.cuh) on tensor cores where tensor_cores
  // and walk_tensor_cores allow them, and the backward's two products
  // (gated_rnn_gemm.cuh) where tensor_cores does, at TF32's precision or
  // better: the forward's R rounded to f16 (TF32's 11 significant bits) and
  // h in two f16 halves; the walk's and the products' operands each in two
  // bf16 halves. 0 (the default) keeps f32's multiply-adds. The API sets it
  // from the args' GatedRnnOptions::precision (tf32: 1).
  int f32_tensor_cores = 0;
};

// How one call is laid out (gated_rnn_plan.cpp).
struct GatedRnnPlan {
  GatedRnnDevice device;         // the numbers it was planned for (the launch checks with them)
  int units_per_block = 1;       // U: hidden units a block owns
  int unit_slices = 1;           // Su = ceil(H / U): the slices of units (and of R's columns)
  int batch_blocks = 1;          // Sb: blocks per slice, each owning batch_rows rows
  int batch_rows = 1;            // ceil(B / Sb): the rows of one batch group
  int blocks = 1;                // Su * Sb: the persistent grid (block = group * Su + slice)
  int batch_tile = 1;            // Bt: batch rows per pass through the block's slice (power of 2)
  bool resident_weights = true;  // R slice in shared memory, else read from the workspace
  int k = 0;                     // H: the rows of R's slice (the product's depth forward,
                                 // its outputs per row backward)
  int columns = 0;               // G*U: the slice's columns of R (the forward's outputs per
                                 // row, the backward's depth)
  int stored_columns = 0;        // the block layout's columns as stored: G*U rounded up to
                                 // kGatedRnnColumnGroup, zeros past G*U
  int shared_bytes = 0;          // dynamic shared memory of the persistent kernel
  // Forward: a warp per hidden unit (gated_rnn_forward_unit_warps.cuh); then
  // units_per_block is the warps of a block, batch_tile is B, columns G*U.
  bool unit_warps = false;
  // Forward at B = 1: threads split the product's depth, each holding its
  // rows of the slice in registers (gated_rnn_forward_k_split.cuh); then
  // stored_columns is the instance's columns (8 or 16).
  bool k_split = false;
  // Forward, block layout: the slice of R in registers as tensor-core
  // fragments, the product on tensor cores, its depth H cut into k_parts
  // among the warps (gated_rnn_forward_tensor_cores.cuh).
  bool tensor_cores = false;
  int k_parts = 1;
  // Forward, block layout: h_t exchanged two tile rows a word
  // (gated_rnn_pair_word.h), from tiles of kGatedRnnPairMinTile rows.
  bool pair_exchange = false;
  // Backward: the recompute and grad_R products on tensor cores
  // (gated_rnn_gemm_tc_kernel), else on CUDA cores; the stack layer by
  // layer: its input projections.
  bool gemm_tensor_cores = false;
  // Backward: the walk's part product (grad_rh_s R^T for the tile's rows)
  // on tensor cores, the slice of R resident as bf16, transposed
  // (gated_rnn_part_product_tc): with gemm_tensor_cores, bf16 weights (or
  // f32 ones, split: walk_split_weights), the slice resident (as bf16) and
  // tiles of 8 rows or more.
  bool walk_tensor_cores = false;
  // With walk_tensor_cores, f32 weights (GatedRnnLaunchOptions::
  // f32_tensor_cores): the slice held as two bf16 arrays, each weight's
  // nearest bf16 and the bf16 of what it leaves, about 16 bits of R.
  bool walk_split_weights = false;
  // Backward: the walk stores grad_rh in the workspace as bf16, each the
  // nearest to its f32 value, and grad_R's product takes those rows in one
  // pass from asynchronous copies, as the recompute product takes h: a bf16
  // sequence with bf16 weights (grad_R and grad_bias land in bf16,
  // gated_rnn_gemm.cuh's precision note) and gemm_tensor_cores. Else f32.
  bool grad_rh_bf16 = false;
  // The stacked forward: the slots of each layer's exchange ring (a power
  // of two, at least 2): a layer runs at most this many steps ahead of the
  // layer above it; 0: the layers one after another, each in this plan.
  int stack_depth = 0;
  // Backward: which of its steps a launch runs (bits: 1 the recompute
  // product and the gates, 2 the reverse walk, 4 the weight gradients);
  // the stack's reverse wavefront runs each layer's products apart from
  // the one walk of all layers.
  int backward_steps = 7;
  int threads = 256;             // of each block of the persistent kernel
  // Backward: the slices along B*T of the grad_R / grad_bias product
  // (gated_rnn_gemm.cuh), more than 1 when its output tiles are too few to
  // fill the device.
  int weight_grad_splits = 1;
  // Backward: the same for the recompute product (rh = h_{t-1} R over H),
  // more than 1 when its output tiles fill less than half the device (B1 to
  // B4 at short T).
  int recompute_splits = 1;
  // Workspace layout: offsets in floats from its start, -1 when not used.
  int64_t ws_weights = -1;  // [blocks, columns, k] the R slices (streamed path)
  int64_t ws_state = -1;    // forward: the exchange [2, B, H] of 64-bit {h, step} words
                            // (the stack: [L, stack_depth, B, H]);
                            // backward: [B, H] the dh carry
  int64_t ws_exchange = -1; // backward: the exchange [2, Su, B, H] of 64-bit words, each
                            // slice's part of grad_rh_t R^T with its step; the stack's
                            // block-layout wavefront: [L-1, stack_depth, B, G*H] the
                            // inputs handed to the layers above
  int64_t ws_cell = -1;     // forward: LSTM [B, H] c; sLSTM [3, B, H] c, n, m.
                            // backward: the carries, LSTM [B, H] dc; sLSTM [3, B, H] dc, dn, dm
  int64_t ws_rh = -1;       // backward [B, T, G*H]: h_{t-1} R + bias, then grad_rh
  int64_t ws_gates = -1;    // backward [B, T, 4, H]: GRU r, z, n, rh_n; LSTM i, f, g, o;
                            // sLSTM i', f' (the stabilised exponentials), z, o
  int64_t ws_c = -1;        // backward LSTM [B, T, H]: every c_t; sLSTM [B, T, 3, H]:
                            // every c_t, n_t and the share of dm_t taken by log f + m_{t-1}
  int64_t ws_stack_wx = -1; // the stack layer by layer: [B, T, G*H] a layer's input projection
  int64_t ws_stack_y = -1;  // the stack layer by layer: [2, B, T, H] the lower layers' y;
                            // its backward: [B, T, H] the gradient of a lower layer's y
  int64_t ws_stack_grad_wx = -1;  // the stack's backward: [B, T, G*H] a layer's grad_wx
  int64_t ws_stack_wt = -1;       // the stack's backward: [G*H, H] a layer's W transposed
  // The stack's reverse wavefront (backward, stack_depth > 0): each layer's
  // one-layer workspace at l * ws_stack_layer (its offsets above are layer
  // 0's), and the rings of parts handed down [L-1, stack_depth, Su, B, H]
  // of 64-bit words; ws_stack_wx and ws_stack_grad_wx then hold L-1 layers'.
  int64_t ws_stack_layer = -1;
  int64_t ws_stack_parts = -1;
  int64_t ws_split = -1;    // backward: the split products' partial sums, the recompute's
                            // [recompute_splits, B*T, G*H], later grad_R's
                            // [weight_grad_splits, H+1, G*H]
  int64_t ws_floats = 0;    // total
};

}  // namespace exphil::kernels
