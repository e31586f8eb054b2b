/*
 * Stacked GRU and LSTM layers, forward, one batch row: L layers in one
 * launch, layer l's step t running while layer l-1 runs step t+1 (a
 * wavefront), so that L layers of T steps take about T + L - 1 steps of
 * time instead of L * T.
 *
 * Math: layer 0 is gated_rnn_forward.cuh's sequence on the given wx; layer
 * l > 0 the same on wx_l = y_{l-1} W_l + b_l (its input projection, the
 * product done here, a step at a time, from h_{l-1,t} as soon as it is
 * published): y_l[t] = cell(wx_l[t], h_{l,t-1} R_l + bias_l). The input
 * projection stays apart from the recurrent pre-activations, as the GRU's
 * n gate needs (n = tanh(x_n + r * (h R_n + b_n))).
 *
 * Why. At B1 T32 H256 a layer's step is the trip of h through L2 between
 * blocks (bench/RESULTS.md, issue 30 run R): two layers called back to back
 * cost two chains of T trips. Here the chains overlap: layer l's blocks wait
 * for h_{l-1,t} and h_{l,t-1}, which arrive about together.
 *
 * Layout: the k-split layout (gated_rnn_forward_k_split.cuh) per layer,
 * blocks [l * S, (l + 1) * S) for layer l, S = ceil(H / U) slices of U
 * units; thread k keeps row k of its block's slice of R_l (and of W_l) in
 * registers, CP columns each. A step: thread k reads word k of h_{l-1,t}
 * (l > 0) and multiplies it into its row of W_l, the warps reduce-scatter
 * those CP partial sums into shared memory; then the same with h_{l,t-1}
 * and R_l; one barrier, and thread u < U adds the 8 warps' sums in a fixed
 * order (results bitwise reproducible), runs the cell's update and
 * publishes h_{l,t}. Two blocks a multiprocessor.
 *
 * The exchange: per layer a ring of D = plan.stack_depth slots of H 64-bit
 * words {h, step} (gated_rnn_common.cuh), slot t mod D holding step t.
 * Layer l's own blocks read slot t-1 at step t; layer l+1's read slot t.
 * Layer l may overwrite step t-D with step t only after every block of
 * layer l+1 has read it, i.e. published h_{l+1,t-D} (each block publishes a
 * step only after its barrier, after all its threads' reads): so at step
 * t >= D thread k of a layer-l block also waits for word k of layer l+1's
 * slot t-D to carry step t-D or later, before the barrier. Layer l+1 trails
 * by about one step, so the wait is one load alongside the step's own.
 * Before the first step each block marks its words "no step", then one
 * grid-wide barrier.
 *
 * Floor: T + L - 1 dependent steps, each one trip through L2.
 *
 * Measured (H200, bench/RESULTS.md, issue 30 runs AI to AK), B1 T32 H256,
 * two layers with layer 1's input projection, graph replay: GRU f32 74.7
 * us a call, LSTM f32 79.5, against 129.6 and 126.9 for two one-layer calls:
 * 1.96 us a step against a lone layer's 1.82, and about 10 us at T1
 * against a lone layer's 3.3 (the grid-wide barrier, which the lone layer
 * skips at T1, and layer 2's first step after layer 1's). Two blocks a
 * multiprocessor (2 units a block) beat one (4 units: 95.6 us), and taking
 * the input's product before the recurrent one cut 84.6 to 74.7.
 *
 * Limits: B = 1, H <= 256, 2 to kGatedRnnMaxStackLayers layers of one H,
 * GRU and LSTM, G*U <= CP (8 or 16), L * S blocks all resident at once
 * (the launch checks), one dtype for every layer's sequence, weights and
 * states. The planner (plan_gated_rnn_stack) gives the layout.
 *
 * Elsewhere (B > 1, H > 256, or the k split turned off) the wavefront runs
 * in the block layout (gated_rnn_forward_stack_blocks.cuh) where it fits
 * (B <= 4), else the stack runs layer by layer (run_gated_rnn_layers_forward,
 * gated_rnn_launch.cuh): each
 * layer's forward in the one-layer plan, and before each layer above the
 * first its input projection y_{l-1} W_l + b_l as one product
 * (gated_rnn_gemm.cuh, on tensor cores for 16-bit sequences) into the
 * workspace, in the sequence dtype, as the forward reads wx: there a layer
 * above sees its input rounded to the sequence dtype, as two calls would.
 */
#pragma once

#include <cstdint>
#include <type_traits>

#include <cooperative_groups.h>

#include "gated_rnn/gated_rnn_cell.cuh"
#include "gated_rnn/gated_rnn_common.cuh"

namespace exphil::kernels {

namespace gated_rnn_stack {

// A block of a stack kernel whose layers each have the plan's unit_slices x
// batch_blocks blocks, laid out layer after layer: its layer, and its index
// among that layer's blocks.
struct StackBlock {
  int layer, block;
};
__device__ __forceinline__ StackBlock stack_block(const GatedRnnPlan& plan) {
  const int per_layer = plan.unit_slices * plan.batch_blocks;
  const int l = static_cast<int>(blockIdx.x) / per_layer;
  return {l, static_cast<int>(blockIdx.x) - l * per_layer};
}

// What one layer's blocks need of the parameters, read once (the params'
// arrays indexed by a run-time layer would be copied to local memory).
struct Layer {
  const void* R;
  const void* bias;
  const void* W;       // null for layer 0
  const void* W_bias;
  const void* h0;
  const void* c0;
  void* y;
  void* h_final;
  void* c_final;
};

__device__ __forceinline__ Layer layer_of(const GatedRnnStackParams& p, int l) {
  Layer out{};
#pragma unroll
  for (int i = 0; i < kGatedRnnMaxStackLayers; ++i)
    if (i == l) {
      const GatedRnnForwardParams& f = p.layer[i];
      out = {f.d_R,    f.d_bias, p.d_W[i], p.d_W_bias[i], f.d_h0,
             f.d_c0,   f.d_y,    f.d_h_final, f.d_c_final};
    }
  return out;
}

// Waits for thread k's word of h_{l,t-1} (where t > 0) and, where this
// layer feeds one above and t >= D, for the above layer's word in the slot
// about to be reused to carry step t-D or later; returns h_{l,t-1}'s value
// in v. Both loads of a round are in flight at once, and a word seen ready
// is not reloaded: polling one after the other would add a trip through L2
// to the step.
__device__ __forceinline__ void wait_recurrent(const uint64_t* prev, const uint64_t* up, int step,
                                               int depth, float& v) {
  uint64_t w_prev = 0, w_up = 0;
  if (prev) w_prev = gated_rnn_peek(prev);
  if (up) w_up = gated_rnn_peek(up);
  for (;;) {
    const bool prev_ok = !prev || gated_rnn_has_step(w_prev, step - 1);
    const bool up_ok = !up || static_cast<int>(w_up >> 32) >= step - depth;
    if (prev_ok && up_ok) break;
    if (!prev_ok) w_prev = gated_rnn_peek(prev);
    if (!up_ok) w_up = gated_rnn_peek(up);
  }
  if (prev) v = __uint_as_float(static_cast<uint32_t>(w_prev));
}

// One layer's whole sequence, run by one block. kInput: the layer takes its
// input from the layer below (l > 0) and multiplies it by W here; else
// from wx.
template <class Elem, GatedRnnCell kCell, int CP, bool kInput>
__device__ __forceinline__ void run_layer(const GatedRnnStackParams& p, const GatedRnnPlan& plan,
                                          uint64_t* xchg, int l, int slice, float* partial) {
  constexpr int G = kGatedRnnGates<kCell>;
  constexpr int kWarps = kGatedRnnThreads / 32;
  constexpr int kSums = kInput ? 2 * CP : CP;  // [input columns | recurrent columns]
  const int D = plan.stack_depth;
  const int64_t T = p.layer[0].shape.steps;
  const int H = static_cast<int>(p.layer[0].shape.hidden);
  const int L = p.layers;
  const DType wdt = p.layer[0].weight_dtype, sdt = p.layer[0].state_dtype;
  const int U = plan.units_per_block;
  const int u0 = slice * U;
  const int live = min(U, H - u0);
  const int tid = static_cast<int>(threadIdx.x);
  const int warp = tid >> 5, lane = tid & 31;
  const Layer ly = layer_of(p, l);

  // Row k = tid of the slices: w[c] = R_l[k, g*H + u0 + u], wi[c] the same
  // of W_l; column c = g*U + u, zeros past G*U.
  const int k = tid;
  float w[CP], wi[CP] = {};
  gated_rnn_load_row(w, ly.R, wdt, k, G, H, U, u0, live);
  if constexpr (kInput) gated_rnn_load_row(wi, ly.W, wdt, k, G, H, U, u0, live);
  if constexpr (!kInput)
    if (T * G * H * static_cast<int64_t>(sizeof(Elem)) <= kGatedRnnPrefetchBytes)
      gated_rnn_prefetch_runs(static_cast<const Elem*>(p.layer[0].d_wx) + u0, sizeof(Elem), T, G,
                              H, live);

  uint64_t* const own = xchg + static_cast<int64_t>(l) * D * H;
  const bool publishes_up = l + 1 < L;
  const uint64_t* const below = kInput ? own - static_cast<int64_t>(D) * H : nullptr;
  const uint64_t* const above = publishes_up ? own + static_cast<int64_t>(D) * H : nullptr;
  for (int i = tid; i < D * live; i += kGatedRnnThreads)
    own[(i / live) * H + u0 + i % live] = ~uint64_t{0};  // step -1
  cooperative_groups::this_grid().sync();

  const bool updates = tid < live;
  const int hu = u0 + tid;
  float hp = 0.0f;
  SlstmState s{0.0f, 1.0f, 0.0f};
  float bias[G], in_bias[G];
#pragma unroll
  for (int g = 0; g < G; ++g) {
    bias[g] = updates && ly.bias ? load_state(ly.bias, wdt, g * H + hu) : 0.0f;
    in_bias[g] = kInput && updates && ly.W_bias ? load_state(ly.W_bias, wdt, g * H + hu) : 0.0f;
  }
  if (updates) {
    hp = ly.h0 ? load_state(ly.h0, sdt, hu) : 0.0f;
    if constexpr (kCell == GatedRnnCell::lstm)
      if (ly.c0) s.c = load_state(ly.c0, sdt, hu);
  }

  const Elem* __restrict__ wx = static_cast<const Elem*>(p.layer[0].d_wx) + (updates ? hu : 0);
  Elem* __restrict__ y = ly.y ? static_cast<Elem*>(ly.y) + (updates ? hu : 0) : nullptr;
  for (int64_t t = 0; t < T; ++t) {
    const int step = static_cast<int>(t);
    float x[G];
    if constexpr (!kInput) {
#pragma unroll
      for (int g = 0; g < G; ++g) x[g] = updates ? to_float(wx[t * G * H + g * H]) : 0.0f;
    }

    // Each warp's sums: [input columns | recurrent columns].
    float* const sums = partial + (t & 1) * kWarps * kSums;
    if constexpr (kInput) {
      // The input's product first: the layer below runs ahead, so h_{l-1,t}
      // is usually there before h_{l,t-1}, and this product and its
      // reduction stay off the step's critical path (taken together with
      // the recurrent one, they were on it).
      const float vi = k < H ? gated_rnn_wait_word(below + (t & (D - 1)) * H + k, step) : 0.0f;
      float acc[CP];
#pragma unroll
      for (int c = 0; c < CP; ++c) acc[c] = vi * wi[c];
      gated_rnn_reduce_scatter_store<CP>(acc, CP, sums + warp * kSums, 1, 0, lane);
    }
    float v = 0.0f;
    if (k < H) {
      if (t == 0 && ly.h0) v = load_state(ly.h0, sdt, k);
      wait_recurrent(t > 0 ? own + ((t - 1) & (D - 1)) * H + k : nullptr,
                     publishes_up && t >= D ? above + (t & (D - 1)) * H + k : nullptr, step, D, v);
    }
    float acc[CP];
#pragma unroll
    for (int c = 0; c < CP; ++c) acc[c] = v * w[c];
    gated_rnn_reduce_scatter_store<CP>(acc, CP, sums + warp * kSums + (kInput ? CP : 0), 1, 0, lane);
    __syncthreads();

    if (updates) {
      // The 8 warps' sums as a fixed tree (depth 3, not a chain of 7).
      const auto total = [&](int c) {
        const float* q = sums + c;
        return ((q[0] + q[kSums]) + (q[2 * kSums] + q[3 * kSums])) +
               ((q[4 * kSums] + q[5 * kSums]) + (q[6 * kSums] + q[7 * kSums]));
      };
      float a[G];
#pragma unroll
      for (int g = 0; g < G; ++g) {
        const int c = g * U + tid;
        if constexpr (kInput) x[g] = total(c) + in_bias[g];
        a[g] = total((kInput ? CP : 0) + c) + bias[g];
      }
      const float h = gated_rnn_cell_step<kCell>(x, a, hp, s);
      hp = h;
      if (y) y[t * H] = from_float<Elem>(h);
      if (t + 1 < T || publishes_up) gated_rnn_publish(own + (t & (D - 1)) * H + hu, h, step);
    }
  }

  if (updates) {
    if (ly.h_final) store_state(ly.h_final, sdt, hu, hp);
    if constexpr (kCell == GatedRnnCell::lstm)
      if (ly.c_final) store_state(ly.c_final, sdt, hu, s.c);
  }
}

// The layers one after another (B > 1, or where the wavefront does not
// fit): the operands of a layer's input projection, wx_l = y_{l-1} W_l +
// b_l, through gated_rnn_gemm.cuh's product. A is y_{l-1} [B*T, H] in the
// sequence dtype; the sums land in the sequence dtype, as the forward
// reads wx.
//
// A row-major sequence [rows, width] in the sequence dtype, read along its
// rows: the A operand contiguous in k (y_{l-1} here), or a B operand (the
// backward's grad_wx, gated_rnn_backward_stack.cuh).
template <class Elem>
struct SequenceRows {
  static constexpr bool kContiguousK = true;
  const Elem* p;
  int64_t width;
  using Row = const Elem*;
  __device__ __forceinline__ Row row(int64_t i) const { return p + i * width; }
  __device__ __forceinline__ float at(Row r, int64_t k) const { return to_float(r[k]); }
  __device__ __forceinline__ void at8(Row r, int64_t k, float (&v)[8]) const {
#pragma unroll
    for (int j = 0; j < 8; ++j) v[j] = to_float(r[k + j]);
  }
  __device__ __forceinline__ bool bf16_exact() const {
    return std::is_same_v<Elem, __nv_bfloat16>;
  }
  static constexpr bool kAsyncRows = std::is_same_v<Elem, __nv_bfloat16>;
  bool async_rows() const { return kAsyncRows && gated_rnn_bf16_rows(DType::bf16, p, width); }
  __device__ __forceinline__ const void* src16(Row r, int64_t k) const { return r + k; }
};

// wx = the product + bias, the bias a column term (gated_rnn_gemm.cuh's
// store protocol: v arrives with it added).
template <class Elem>
struct ProjectionStore {
  Elem* wx;
  const void* bias;  // optional [N]
  DType bias_dtype;
  int64_t N;
  __device__ __forceinline__ float column_addend(int64_t n) const {
    return bias ? load_state(bias, bias_dtype, n) : 0.0f;
  }
  __device__ __forceinline__ void operator()(int, int64_t m, int64_t n, float v) const {
    wx[m * N + n] = from_float<Elem>(v);
  }
  __device__ __forceinline__ bool pairs() const { return gated_rnn_elem_pairs(wx, N); }
  __device__ __forceinline__ void pair(int, int64_t m, int64_t n, float v0, float v1) const {
    VecIO<Elem, 2>::store(wx + m * N + n, {v0, v1});
  }
};

}  // namespace gated_rnn_stack

template <class Elem, GatedRnnCell kCell, int CP>
__global__ void __launch_bounds__(kGatedRnnThreads, kGatedRnnStackBlocksPerSm)
    gated_rnn_forward_stack_kernel(const GatedRnnStackParams p, const GatedRnnPlan plan,
                                   float* __restrict__ ws) {
  static_assert(kCell == GatedRnnCell::gru || kCell == GatedRnnCell::lstm,
                "the stack takes GRU and LSTM layers");
  static_assert(kGatedRnnThreads / 32 == 8, "the update adds the 8 warps' sums as a tree");
  // The warps' partial sums, two buffers [8, 2 CP] (plan.shared_bytes).
  extern __shared__ float partial[];
  uint64_t* const xchg = reinterpret_cast<uint64_t*>(ws + plan.ws_state);  // [L, D, H]
  const int l = static_cast<int>(blockIdx.x) / plan.unit_slices;
  const int slice = static_cast<int>(blockIdx.x) - l * plan.unit_slices;
  if (l == 0)
    gated_rnn_stack::run_layer<Elem, kCell, CP, false>(p, plan, xchg, l, slice, partial);
  else
    gated_rnn_stack::run_layer<Elem, kCell, CP, true>(p, plan, xchg, l, slice, partial);
}

}  // namespace exphil::kernels
