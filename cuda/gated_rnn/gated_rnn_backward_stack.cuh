/*
 * Stacked GRU and LSTM layers, backward (ops "gru_stack" and "lstm_stack"):
 * the operands of the stack's own products, W's transpose, and the reverse
 * wavefront's kernel (gated_rnn_backward_stack_kernel, below: every
 * layer's walk in one launch, each layer's products before and after it;
 * planned up to B = 4: kGatedRnnStackBackwardMinSteps says where). Otherwise
 * the launcher, run_gated_rnn_stack_backward
 * (gated_rnn_launch.cuh), runs the layers from the top down:
 *
 *   for l = L-1 .. 0:
 *     l > 0:  wx_l = y_{l-1} W_l + b_l                    (again, as the forward
 *                                                          formed it layer by layer)
 *     layer l's one-layer backward (gated_rnn_backward.cuh) on wx_l, y_l and
 *       g_l, the gradient of y_l: grad_wx_l, grad_R_l, grad_bias_l, grad_h0_l, ...
 *     l > 0:  grad_W_l      = y_{l-1}^T grad_wx_l          [H, G*H] over B*T
 *             grad_W_bias_l = sum over B*T of grad_wx_l    (row H of the same product)
 *             g_{l-1}       = grad_wx_l W_l^T (+ the caller's gradient of y_{l-1})
 *
 * Each product is one of gated_rnn_gemm.cuh (on tensor cores for 16-bit
 * sequences where the plan says), each sum in a fixed order: the backward
 * is bitwise deterministic. W_l^T is transposed into the workspace first,
 * so that the product reads both operands along rows.
 *
 * Precision. wx_l, grad_wx_l and g_{l-1} are held in the sequence dtype, as
 * two one-layer calls would pass them; the wavefront forward fed the layers
 * above f32 h (gated_rnn_forward_stack.cuh), so in bf16 and f16 the
 * backward's recomputed wx_l differs from the forward's by that rounding.
 * Every sum is f32.
 *
 * Floor. L one-layer backwards plus, per layer above the first, three
 * products of B*T x G*H x H multiply-adds each: at B1 T32 H256 the
 * one-layer backwards' launches dominate; at B64 T256 H512 each product is
 * 26 (GRU) to 34 (LSTM) GFLOP, about 0.1 ms at a few hundred TFLOP/s,
 * against a one-layer backward of 4 to 6 ms (bench/RESULTS.md, run AG).
 */
#pragma once

#include <cstdint>
#include <type_traits>

#include "common/state_io.cuh"
#include "gated_rnn/gated_rnn_backward.cuh"
#include "gated_rnn/gated_rnn_forward_stack.cuh"

namespace exphil::kernels {

namespace gated_rnn_stack {

// grad_W's A: [y_{l-1}; 1]^T [H+1, B*T] from row `first` on (row H the ones
// that give grad_W_bias), read along B*T: y_{l-1}'s rows.
template <class Elem>
struct InputGradA {
  static constexpr bool kContiguousK = false;
  const Elem* y;
  int64_t H, first;
  using Row = const Elem*;
  __device__ __forceinline__ Row row(int64_t k) const { return y + k * H; }
  __device__ __forceinline__ float at(Row r, int64_t m) const {
    const int64_t unit = m + first;
    return unit < H ? to_float(r[unit]) : 1.0f;
  }
  __device__ __forceinline__ void at8(Row r, int64_t m, float (&v)[8]) const {
    if (m + first + 8 <= H) {
#pragma unroll
      for (int j = 0; j < 8; ++j) v[j] = to_float(r[m + first + j]);
    } else {
#pragma unroll
      for (int j = 0; j < 8; ++j) v[j] = at(r, m + j);
    }
  }
  // (The ones are bf16 values too.)
  __device__ __forceinline__ bool bf16_exact() const {
    return std::is_same_v<Elem, __nv_bfloat16>;
  }
  static constexpr bool kAsyncRows = std::is_same_v<Elem, __nv_bfloat16>;
  bool async_rows() const {
    return kAsyncRows && gated_rnn_bf16_rows(DType::bf16, y, H) && first % 8 == 0;
  }
  // As GatedRnnWeightGradA::src16.
  __device__ __forceinline__ const void* src16(Row r, int64_t m) const {
    return gated_rnn_units_or_ones16<__nv_bfloat16>(m + first, H,
                                                    [&](int64_t unit) -> const void* { return r + unit; });
  }
};

// The gradient of the layer below's y, grad_wx_l W_l^T, plus the caller's
// gradient of that y where given, in the sequence dtype.
template <class Elem>
struct LowerGradStore {
  Elem* grad_y;
  const Elem* outside;  // optional [M, N]
  int64_t N;
  __device__ __forceinline__ void operator()(int, int64_t m, int64_t n, float v) const {
    const int64_t i = m * N + n;
    grad_y[i] = from_float<Elem>(v + (outside ? to_float(outside[i]) : 0.0f));
  }
};

}  // namespace gated_rnn_stack

// The reverse wavefront (plan.stack_depth > 0, B <= 4): every layer's walk
// in one launch, blocks [l * Sb * Su, (l + 1) * Sb * Su) for layer l, each
// layer in its one-layer backward plan (gated_rnn_stack_layer_plan). Block
// (g, j) of layer l > 0 also multiplies its grad_wx_s by its slice of W_l
// (the transpose of the forward's hand-over) and publishes that part of
// grad_y_{l-1,s} for every unit; layer l-1's blocks stage the Su parts
// beside their own exchange's and add them, in slice order, to the
// caller's gradient of y_{l-1,s}. Layer l-1 thus trails layer l by a step
// or two of the reverse walk instead of waiting for all of it. The ring
// [D, Su, B, H] between two layers: layer l overwrites step s + D's slot
// with step s only after every block of layer l-1 in its group has
// published its own part of step s + D, which follows its staging of the
// parts handed down for s + D. params: each layer's walk as the launcher
// sets it up (wx and grad_wx of the layers above in the workspace, grad_y
// of the layers below the caller's or null).
template <class Elem, GatedRnnCell kCell>
__global__ void __launch_bounds__(kGatedRnnThreads, 1)
    gated_rnn_backward_stack_kernel(const GatedRnnStackBackwardParams p, const GatedRnnPlan plan,
                                    float* __restrict__ ws) {
  static_assert(kCell == GatedRnnCell::gru || kCell == GatedRnnCell::lstm,
                "the stack takes GRU and LSTM layers");
  constexpr int G = kGatedRnnGates<kCell>;
  const auto [l, block] = gated_rnn_stack::stack_block(plan);
  // Layer l's params, read once (indexing the arrays by a run-time layer in
  // the loop would read them from local memory every time).
  GatedRnnBackwardParams layer{};
  const void* W = nullptr;
#pragma unroll
  for (int i = 0; i < kGatedRnnMaxStackLayers; ++i)
    if (i == l) {
      layer = p.layer[i];
      W = p.d_W[i];
    }
  const GatedRnnPlan lp = gated_rnn_stack_layer_plan(plan, l);

  extern __shared__ float4 smem4[];
  float* const smem = reinterpret_cast<float*>(smem4);
  const int C = plan.stored_columns, K = plan.k, Bt = plan.batch_tile;
  const int U = plan.units_per_block, Su = plan.unit_slices;
  const int H = static_cast<int>(layer.fwd.shape.hidden);
  const int64_t ring = static_cast<int64_t>(plan.stack_depth) * Su * layer.fwd.shape.batch * H;
  uint64_t* const rings = reinterpret_cast<uint64_t*>(ws + plan.ws_stack_parts);  // [L-1, ...]
  GatedRnnWalkStack st;
  st.depth = plan.stack_depth;
  st.from_above = l + 1 < p.layers ? rings + l * ring : nullptr;
  st.to_below = l > 0 ? rings + (l - 1) * ring : nullptr;
  st.below_own = l > 0 ? reinterpret_cast<const uint64_t*>(
                             ws + gated_rnn_stack_layer_plan(plan, l - 1).ws_exchange)
                       : nullptr;
  float* const Wi = smem + gated_rnn_walk_shared_floats(plan);
  st.Wi = Wi;
  st.ga = Wi + static_cast<int64_t>(C) * K;
  st.parts_above = st.ga + C * Bt;
  if (l > 0) {
    const int u0 = (block % Su) * U;
    gated_rnn_load_slice(Wi, W, layer.fwd.weight_dtype, G, H, U, u0, min(U, H - u0), C);
  }
  gated_rnn_walk<Elem, kCell, true, true>(layer, lp, ws, block, smem, st);
}

// dst [cols, rows] = src [rows, cols]^T, both in `dtype` (f32 or 16-bit):
// kTile x kTile tiles through shared memory, so that reads and writes both
// run along rows. Blocks of kTile x 8 threads. (A template so that every
// translation unit that includes this may hold it.)
inline constexpr int kGatedRnnTransposeTile = 32;
template <int kTile>
__global__ void __launch_bounds__(kTile * 8)
    gated_rnn_transpose_kernel(const void* __restrict__ src, void* __restrict__ dst, DType dtype,
                               int64_t rows, int64_t cols) {
  __shared__ float tile[kTile][kTile + 1];
  const int64_t r0 = static_cast<int64_t>(blockIdx.y) * kTile;
  const int64_t c0 = static_cast<int64_t>(blockIdx.x) * kTile;
  const int tx = static_cast<int>(threadIdx.x), ty = static_cast<int>(threadIdx.y);
  for (int i = ty; i < kTile; i += 8) {
    const int64_t r = r0 + i, c = c0 + tx;
    if (r < rows && c < cols) tile[i][tx] = load_state(src, dtype, r * cols + c);
  }
  __syncthreads();
  for (int i = ty; i < kTile; i += 8) {
    const int64_t c = c0 + i, r = r0 + tx;
    if (r < rows && c < cols) store_state(dst, dtype, c * rows + r, tile[tx][i]);
  }
}

}  // namespace exphil::kernels
