// GRU, LSTM and sLSTM sequences with the recurrent product fused in (issue
// 30's ops "gru", "lstm" and "slstm" of op_descriptions.h): every step's
// h_{t-1} R runs inside the kernels, so a call over T steps is one launch
// forward and a few backward. The input projection x W + b_x is the caller's (one matrix
// product over all steps, as cuDNN and Edifice do).
//
// GRU, gates in the order r, z, n (Axon's gru_cell; PyTorch's and cuDNN's
// order), the recurrent bias inside the reset for n:
//   r = sigmoid(wx_r + h R_r + b_r)      z = sigmoid(wx_z + h R_z + b_z)
//   n = tanh(wx_n + r * (h R_n + b_n))   h' = (1 - z) n + z h
// LSTM, gates in the order i, f, g, o (PyTorch's and cuDNN's):
//   i, f, o = sigmoid(wx + h R + b)      g = tanh(wx_g + h R_g + b_g)
//   c' = f c + i g                        h' = o tanh(c')
// sLSTM (xLSTM's scalar LSTM, exactly as Edifice's slstm_scan), gates in the
// order i, f, z, o, exponential input and forget gates in the log domain
// with the stabiliser m:
//   pre = wx + h R + b                    m' = max(pre_f + m, pre_i)
//   i = exp(pre_i - m'), f = exp(pre_f + m - m'), z = tanh(pre_z), o = sigmoid(pre_o)
//   c' = f c + i z,  n' = f n + i         h' = o c' / max(|n'|, 1)
// with the states h, c, n (the normaliser) and m (the stabiliser), by
// default Edifice's h0 = 0, c0 = 0, n0 = 1, m0 = 0. Its gradient splits at
// max()'s ties as Nx's autodiff does: half to each side of m's max, and
// half of |n|'s at |n| = 1 (cuda/gated_rnn/slstm_cell.cuh).
// cuda/gated_rnn/gated_rnn_forward.cuh maps Axon's and Edifice's parameters
// onto these.
//
// Shapes, with G = 3 (GRU) or 4 (LSTM, sLSTM) and the gates side by side in
// the last dimension: wx [B, T, G*H]; R [H, G*H]; bias [G*H]; h0, c0, n0,
// m0, the final states and their gradients [B, H]; y (every h_t) [B, T, H].
// Dtypes: wx, y, grad_y, grad_wx and grad_rh share one (f32, f16 or bf16);
// R, bias and their gradients one that is f32 or that one; the states and
// their gradients one that is f32 or that one. Arithmetic, the carried state and every sum are
// f32. Any B >= 1; T from 1 to 2^31 - 2; H from 1 to 2^24, as long as the
// persistent kernel's blocks (256 columns of R each: G*U forward, U
// backward; ceil(H / U) of them) can all be resident at once: by default one
// block per multiprocessor, with R in shared memory where it fits; past
// that, several blocks per multiprocessor with R read from a workspace (an
// H100 runs a forward LSTM of H = 8,449, 133 blocks, so). A call whose
// blocks cannot all be resident fails, naming the co-residency check, before
// anything is launched. Backward sums (grad_R,
// grad_bias) run in a fixed order: bitwise deterministic.
#pragma once

#include <string_view>

#include "exphil/status.hpp"
#include "exphil/tensor.hpp"

namespace exphil {

enum class GatedRnnCell : int {
  gru = 0,
  lstm = 1,
  slstm = 2,
};

// "gru", "lstm" or "slstm", the op's name in op_descriptions.h.
const char* gated_rnn_cell_name(GatedRnnCell cell) noexcept;

// How an f32 sequence's products run (the ops' attribute "precision").
//   exact  f32 multiply-adds, f32's 24 bits of every operand.
//   tf32   tensor cores at TF32's precision or better, as cuDNN and PyTorch
//          run f32 by default: the forward's product with R rounded to f16
//          (TF32's 11 significant bits; |R| below 65504, and below 2^-14
//          an absolute error of 2^-25) and h in two f16 halves (22 bits);
//          the backward's walk and its two products with each operand in
//          two bf16 halves (16 bits); every sum and state in f32. About
//          twice as fast at B64 T256 H512 (bench/RESULTS.md, issue 30's
//          twenty-first part). f32 sequences only (f16 and bf16 ones run on
//          tensor cores already). A product whose layout cannot take the
//          tensor cores runs exact, which is better than asked: the
//          forward's and the walk's in batch groups of fewer than 8 rows
//          (B <= 4, and B32 at H256 among others) or with H not a multiple
//          of 16 (the forward's), the stacks' one-launch layouts (B <= 4),
//          and every product of the sLSTM.
enum class GatedRnnPrecision : int {
  exact = 0,
  tf32 = 1,
};

// The ops' options (gru, lstm and their stacks; the sLSTM takes them and
// runs exact).
struct GatedRnnOptions {
  GatedRnnPrecision precision = GatedRnnPrecision::exact;
};

struct GatedRnnForwardArgs {
  GatedRnnCell cell = GatedRnnCell::gru;
  const Tensor* wx = nullptr;       // [B, T, G*H], the input projection
  const Tensor* R = nullptr;        // [H, G*H]
  const Tensor* bias = nullptr;     // optional [G*H], the recurrent bias
  const Tensor* h0 = nullptr;       // optional [B, H] (zeros)
  const Tensor* c0 = nullptr;       // optional [B, H], LSTM and sLSTM (zeros)
  const Tensor* n0 = nullptr;       // optional [B, H], sLSTM only (ones)
  const Tensor* m0 = nullptr;       // optional [B, H], sLSTM only (zeros)
  const Tensor* y = nullptr;        // output [B, T, H], every h_t
  const Tensor* h_final = nullptr;  // optional output [B, H]
  const Tensor* c_final = nullptr;  // optional output [B, H], LSTM and sLSTM
  const Tensor* n_final = nullptr;  // optional output [B, H], sLSTM only
  const Tensor* m_final = nullptr;  // optional output [B, H], sLSTM only
  GatedRnnOptions options;
};

// The forward's inputs and its y (the backward recomputes the gates, and
// the LSTM's and sLSTM's other states, from y and wx), the gradients of its
// outputs, and the gradients wanted: every output is optional (NULL: not
// written).
struct GatedRnnBackwardArgs {
  GatedRnnCell cell = GatedRnnCell::gru;
  const Tensor* wx = nullptr;
  const Tensor* R = nullptr;
  const Tensor* bias = nullptr;          // optional
  const Tensor* h0 = nullptr;            // optional
  const Tensor* c0 = nullptr;            // optional, LSTM and sLSTM
  const Tensor* n0 = nullptr;            // optional, sLSTM only
  const Tensor* m0 = nullptr;            // optional, sLSTM only
  const Tensor* y = nullptr;             // the forward's output
  const Tensor* grad_y = nullptr;        // [B, T, H]
  const Tensor* grad_h_final = nullptr;  // optional [B, H]
  const Tensor* grad_c_final = nullptr;  // optional [B, H], LSTM and sLSTM
  const Tensor* grad_n_final = nullptr;  // optional [B, H], sLSTM only
  const Tensor* grad_m_final = nullptr;  // optional [B, H], sLSTM only
  const Tensor* grad_wx = nullptr;       // [B, T, G*H]
  const Tensor* grad_R = nullptr;        // [H, G*H]
  const Tensor* grad_bias = nullptr;     // [G*H], also without bias (its gradient at 0)
  const Tensor* grad_h0 = nullptr;       // [B, H], also without h0 (at zeros)
  const Tensor* grad_c0 = nullptr;       // [B, H], LSTM and sLSTM; also without c0
  const Tensor* grad_n0 = nullptr;       // [B, H], sLSTM only; also without n0 (at ones)
  const Tensor* grad_m0 = nullptr;       // [B, H], sLSTM only; also without m0 (at zeros)
  // [B, T, G*H]: the gradient of the recurrent pre-activations h_{t-1} R + b
  // (Edifice's backward returns it and forms grad_R itself). Equal to
  // grad_wx except the GRU's n gate, where it is r times it.
  const Tensor* grad_rh = nullptr;
  GatedRnnOptions options;
};

// Stacked GRU or LSTM layers (ops "gru_stack" and "lstm_stack"), forward:
// L = 2 to 4 layers of one H, as torch.nn.GRU(H, H, L) and
// torch.nn.LSTM(H, H, L) run them. Layer 0 takes the given wx, as the
// one-layer op does; layer l > 0 takes wx_l = y_{l-1} W[l-1] + W_bias[l-1],
// the layer below's output projected by the library. Shapes, with K = L - 1:
// R [L, H, G*H] (layer l's R at [l]), W [K, H, G*H], bias [L, G*H], W_bias
// [K, G*H], h0, c0, h_final, c_final [L, B, H]; wx [B, T, G*H]; y [B, T,
// H] the last layer's output, y_lower [K, B, T, H] the others'. Dtypes as
// the one-layer op's, W and W_bias with R. Up to B = 4 the whole stack is
// one launch, layer l running step t while the layer below runs ahead
// (gated_rnn_forward_stack.cuh at B = 1 with H <= 256,
// gated_rnn_forward_stack_blocks.cuh elsewhere): the layers above see their
// input in f32. Above, the layers run one after another, each projection
// one product, the input rounded to the sequence dtype as two calls would.
struct GatedRnnStackForwardArgs {
  GatedRnnCell cell = GatedRnnCell::gru;  // gru or lstm
  const Tensor* wx = nullptr;       // [B, T, G*H], layer 0's input projection
  const Tensor* R = nullptr;        // [L, H, G*H]
  const Tensor* W = nullptr;        // [L-1, H, G*H], the input weights of layers 1 to L-1
  const Tensor* bias = nullptr;     // optional [L, G*H], the recurrent biases
  const Tensor* W_bias = nullptr;   // optional [L-1, G*H], the input biases of layers 1 to L-1
  const Tensor* h0 = nullptr;       // optional [L, B, H] (zeros)
  const Tensor* c0 = nullptr;       // optional [L, B, H], LSTM only (zeros)
  const Tensor* y = nullptr;        // output [B, T, H], the last layer's every h_t
  const Tensor* y_lower = nullptr;  // optional output [L-1, B, T, H], the other layers'
  const Tensor* h_final = nullptr;  // optional output [L, B, H]
  const Tensor* c_final = nullptr;  // optional output [L, B, H], LSTM only
  GatedRnnOptions options;
};

// The stack's backward: the forward's inputs and outputs (y_lower is
// required: the backward reads every layer's y), the gradients of its
// outputs, and the gradients wanted, every one optional. Each layer runs
// the one-layer backward, and each layer above the first forms its wx
// again from y_lower, W and W_bias; the gradient of a lower layer's y is
// grad_wx_{l+1} W^T plus grad_y_lower's part. Up to B = 4 every layer's
// reverse walk runs in one launch, layer l-1 a step or two behind layer l
// (gated_rnn_backward_stack.cuh); above, the layers run from the top down,
// one after another. Sums in a fixed order: bitwise deterministic.
struct GatedRnnStackBackwardArgs {
  GatedRnnCell cell = GatedRnnCell::gru;  // gru or lstm
  const Tensor* wx = nullptr;            // [B, T, G*H]
  const Tensor* R = nullptr;             // [L, H, G*H]
  const Tensor* W = nullptr;             // [L-1, H, G*H]
  const Tensor* y = nullptr;             // [B, T, H], the forward's
  const Tensor* y_lower = nullptr;       // [L-1, B, T, H], the forward's
  const Tensor* grad_y = nullptr;        // [B, T, H]
  const Tensor* bias = nullptr;          // optional [L, G*H]
  const Tensor* W_bias = nullptr;        // optional [L-1, G*H]
  const Tensor* h0 = nullptr;            // optional [L, B, H]
  const Tensor* c0 = nullptr;            // optional [L, B, H], LSTM only
  const Tensor* grad_y_lower = nullptr;  // optional [L-1, B, T, H] (zeros)
  const Tensor* grad_h_final = nullptr;  // optional [L, B, H] (zeros)
  const Tensor* grad_c_final = nullptr;  // optional [L, B, H], LSTM only (zeros)
  const Tensor* grad_wx = nullptr;       // [B, T, G*H]
  const Tensor* grad_R = nullptr;        // [L, H, G*H]
  const Tensor* grad_W = nullptr;        // [L-1, H, G*H]
  const Tensor* grad_bias = nullptr;     // [L, G*H], also without bias
  const Tensor* grad_W_bias = nullptr;   // [L-1, G*H], also without W_bias
  const Tensor* grad_h0 = nullptr;       // [L, B, H], also without h0
  const Tensor* grad_c0 = nullptr;       // [L, B, H], LSTM only; also without c0
  GatedRnnOptions options;
};

// How a call was laid out on the GPU (reported through
// GatedRnnLaunchOptions::chosen).
struct GatedRnnLaunchInfo {
  int units_per_block = 0;        // hidden units each block of the persistent kernel owns
  int blocks = 0;                 // its grid, all resident at once (at most one per multiprocessor)
  int batch_blocks = 0;           // blocks sharing a slice of units, each with its own batch rows
  int batch_tile = 0;             // batch rows per pass through a block's slice of R
  bool resident_weights = false;  // R's slices in shared memory, else read from the workspace
  // Forward: a warp per hidden unit (the latency layout for B <= 4); then
  // units_per_block counts the warps of a block.
  bool unit_warps = false;
  // Forward at B = 1: threads split the product's depth, each with its rows
  // of the block's slice of R in registers (the default where it fits).
  bool k_split = false;
  // Forward: the recurrent product on tensor cores, R's slices held in
  // registers (R and the sequence both bf16 or both f16, H a multiple of 16).
  // Backward: its products of h and R and of h and grad_rh on tensor cores.
  // A stack layer by layer: also its input projections.
  bool tensor_cores = false;
  // Backward: the reverse walk's product of grad_rh and R on tensor cores
  // too (bf16 weights, 8 batch rows or more a tile).
  bool walk_tensor_cores = false;
  // Forward, block layout: h_t exchanged between blocks two batch rows a
  // word (the default from tiles of 8 rows).
  bool pair_exchange = false;
  // A stack: its layers in one launch (the forward's wavefront, k_split
  // saying which layout; the backward's reverse walks), else one after
  // another, each in the layout the other fields give.
  bool stacked = false;
  int kernels = 0;                // kernel launches of the call
};

// Launch overrides for tests and benchmarks; zero or false chooses.
// Results do not depend on them beyond f32 rounding (tensor_cores: see
// there).
struct GatedRnnLaunchOptions {
  int units_per_block = 0;
  int batch_blocks = 0;                 // batch groups (capped at B)
  int batch_tile = 0;                   // a power of two, 1 to 32
  bool streamed_weights = false;        // force R's slices out of shared memory
  // Forward: 1 asks for a warp per unit (taken where the shape allows it:
  // B <= 4, the block's columns of R in shared memory; `chosen` says);
  // -1 (automatic) and 0 run the block layout, which measured faster.
  int unit_warps = -1;
  // Forward at B = 1: -1 (automatic) and 1 take the k-split layout where it
  // fits (H <= 256, at most 16 columns of R a block), 0 the block layout.
  int k_split = -1;
  // Forward: -1 (automatic) runs the product on tensor cores above B = 4
  // where it can (R and the sequence both bf16 or both f16, or f32 with
  // precision tf32; H a multiple of 16, a block's slice within its
  // registers), 1 also at B <= 4, 0 never.
  // It multiplies h split into two 16-bit halves, about 16 bits of it in
  // bf16 and 22 in f16 (the CUDA cores take f32's 24), each sum in f32.
  // Backward: -1 and 1 run its two products on tensor cores where the
  // sequence is bf16 or f16, 0 on CUDA cores; each operand split into two
  // bf16 halves, about 16 bits of it, each sum in f32, except grad_rh in
  // grad_R's product where grad_R is bf16 (a bf16 sequence with bf16
  // weights): its nearest bf16 alone, no coarser than grad_R's own
  // rounding. With bf16 weights
  // and tiles of 8 batch rows or more, the reverse walk's product of
  // grad_rh and R too (R exact, grad_rh in two bf16 halves).
  int tensor_cores = -1;
  // Backward: the reverse walk's product of grad_rh and R on tensor cores
  // where tensor_cores allows it: -1 (automatic) and 1 with bf16 weights
  // and tiles of 8 batch rows or more, 0 never (the products stay where
  // tensor_cores puts them). Where it is taken the layout counts the
  // walk's slice of R as bf16, half the f32 one's shared memory: more
  // units a block where the f32 slice would not fit (the LSTM at B64 H512:
  // 32 units in 8 batch groups, against 16 in 4).
  int walk_tensor_cores = -1;
  // Forward, block layout: h_t exchanged between blocks two batch rows a
  // word, each value's lowest mantissa bit given to the step's tag (23 of
  // f32's 24 bits travel); -1 (automatic) with tiles of 8 rows or more,
  // where it measured faster, 1 at any tile, 0 never.
  int pair_exchange = -1;
  // The stack's layers in one launch (the wavefront) where it fits, up to
  // B = 4, or one after another (0). -1 (automatic) and 1 alike, except
  // for a backward of one step above B = 1, which -1 runs layer by layer.
  int stack_wavefront = -1;
  GatedRnnLaunchInfo* chosen = nullptr;  // if set, receives the layout used
};

Status gated_rnn_forward(const GatedRnnForwardArgs& args, Stream stream = nullptr,
                         const GatedRnnLaunchOptions* options = nullptr) noexcept;

Status gated_rnn_backward(const GatedRnnBackwardArgs& args, Stream stream = nullptr,
                          const GatedRnnLaunchOptions* options = nullptr) noexcept;

// The stack. Its forward runs the layers in one launch where it fits (at
// B = 1 and H <= 256 in the k-split layout unless options.k_split = 0,
// elsewhere up to B = 4 in the block layout), else one after another;
// options.stack_wavefront = 0 asks for the latter. units_per_block and
// batch_blocks set the layout's (the wavefront's, or each layer's).
Status gated_rnn_stack_forward(const GatedRnnStackForwardArgs& args, Stream stream = nullptr,
                               const GatedRnnLaunchOptions* options = nullptr) noexcept;
// Its backward: up to B = 4 every layer's reverse walk in one launch
// (options.stack_wavefront = 0 asks for one after another), above the
// layers' backwards one after another; the options as gated_rnn_backward
// takes them.
Status gated_rnn_stack_backward(const GatedRnnStackBackwardArgs& args, Stream stream = nullptr,
                                const GatedRnnLaunchOptions* options = nullptr) noexcept;

// Checks a call without running it or the device, as scan.hpp's
// can_implement says.
Status can_implement(const GatedRnnForwardArgs& args) noexcept;
Status can_implement(const GatedRnnBackwardArgs& args) noexcept;
Status can_implement(const GatedRnnStackForwardArgs& args) noexcept;
Status can_implement(const GatedRnnStackBackwardArgs& args) noexcept;

// The member of `args` that holds the tensor the op's description
// (op_descriptions.h) names `name`, or null for a name it does not have
// (c0, c_final and their gradients for a GRU; n0, m0, n_final, m_final and
// their gradients for a GRU or an LSTM): a binding fills any op's args by
// the description's names.
const Tensor** tensor_slot(GatedRnnForwardArgs& args, std::string_view name) noexcept;
const Tensor** tensor_slot(GatedRnnBackwardArgs& args, std::string_view name) noexcept;
const Tensor** tensor_slot(GatedRnnStackForwardArgs& args, std::string_view name) noexcept;
const Tensor** tensor_slot(GatedRnnStackBackwardArgs& args, std::string_view name) noexcept;

// The op direction of these args, chosen by their type, as can_implement is:
// for bindings that serve every op alike.
inline Status run(const GatedRnnForwardArgs& args, Stream stream = nullptr) noexcept {
  return gated_rnn_forward(args, stream);
}
inline Status run(const GatedRnnBackwardArgs& args, Stream stream = nullptr) noexcept {
  return gated_rnn_backward(args, stream);
}
inline Status run(const GatedRnnStackForwardArgs& args, Stream stream = nullptr) noexcept {
  return gated_rnn_stack_forward(args, stream);
}
inline Status run(const GatedRnnStackBackwardArgs& args, Stream stream = nullptr) noexcept {
  return gated_rnn_stack_backward(args, stream);
}

}  // namespace exphil
