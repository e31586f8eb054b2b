/*
 * Fused GRU, LSTM and sLSTM sequences, forward, one batch row (the "k
 * split" layout): the default at B = 1, where a step is nothing but latency.
 *
 * Math: gated_rnn_forward.cuh (gated_rnn_cell.cuh is the step every layout
 * runs).
 *
 * Why a third layout. Traced on an H100 (bench/RESULTS.md, issue 30 run R;
 * the trace's own stamps included), a B1 H256 step of the block layout took
 * ~3,500 cycles: ~1,400 waiting for h_{t-1} (its trip through L2), ~950 in
 * the product and ~800 in the update, though the product is 8 FMAs a lane
 * and the update a few dozen flops: the instructions around them (tile and
 * row bookkeeping, address arithmetic, the row-count switch, loads of what
 * does not change between steps) wait on one another with two warps a
 * scheduler to hide nothing. Here all of that is done once, before the
 * first step:
 *   - thread k owns row k of the product's depth and keeps row k of the
 *     block's slice of R (its CP columns: G*U, zeros past) in registers for
 *     the whole sequence;
 *   - each step it waits for its word of h_{t-1} straight from the exchange
 *     (gated_rnn_common.cuh; no staging through shared memory), multiplies
 *     it into CP products, and the warp's butterfly reduce-scatter leaves the
 *     warp's CP partial sums in shared memory;
 *   - one barrier; thread u < U then adds unit u's G gates over the 8 warps
 *     (a fixed order: results are bitwise reproducible) and runs the update,
 *     with its h, the LSTM's c, the sLSTM's c, n, m in registers for the
 *     whole sequence, writes y_t and publishes h_t.
 * One barrier a step. The partial sums alternate between two buffers by
 * step: a warp writes step t+2's only after reading h_{t+1} from every
 * block, this block's among them, whose update threads read step t's sums
 * before they computed it.
 *
 * Floor: as the block layout's, the chain of T dependent steps, each one
 * trip of h through L2.
 *
 * Measured (H100, bench/RESULTS.md, issue 30 runs T and U): a step came
 * out only a little shorter, so the trace's phases overstated the block's
 * own work; the exchange is most of a step. One layer at
 * B1 T32 H256, graph replay, 56.8 us a call against the block layout's
 * 60.4 (GRU f32), 54.8 against 61.7 (LSTM f32); at T1 3.3 us against 5.8
 * (less to set up). A step costs 1.66 us against 1.71 with 128 blocks, where
 * the exchange through L2 is most of it (~0.8 us with nothing else in the
 * step, run R), and 0.70 against 1.19 with one block (H = 1). At H512,
 * two words a thread, it was slower (2.42 us a step against 2.05), so H
 * stays at most 256.
 *
 * Layout and limits. B = 1, H <= 256: blocks of 256 threads own units
 * [jU, jU + U) (U = ceil(H / SMs), as the block layout at B1), G*U <= CP;
 * instances CP = 8 and 16 (16: more units a block, e.g. H256 on an A100's
 * 108 SMs). The planner (gated_rnn_plan.cpp) takes the block layout where
 * neither fits, or where the launch options ask for another layout. Shared
 * memory: the warps' sums, 2 x 8 x CP floats. The exchange and the
 * workspace are the block layout's; one cooperative launch, co-residency
 * checked first (gated_rnn_launch.cuh). No Hopper-only instructions.
 */
#pragma once

#include <cstdint>

#include <cooperative_groups.h>

#include "gated_rnn/gated_rnn_cell.cuh"
#include "gated_rnn/gated_rnn_common.cuh"

namespace exphil::kernels {

template <class Elem, GatedRnnCell kCell, int CP>
__global__ void __launch_bounds__(kGatedRnnThreads, 1)
    gated_rnn_forward_k_split_kernel(const GatedRnnForwardParams p, const GatedRnnPlan plan,
                                     float* __restrict__ ws) {
  constexpr int G = kGatedRnnGates<kCell>;
  constexpr int kWarps = kGatedRnnThreads / 32;
  static_assert(kWarps == 8, "the update adds the 8 warps' sums as a tree");
  const int64_t T = p.shape.steps;
  const int H = static_cast<int>(p.shape.hidden);
  const int U = plan.units_per_block;
  const int u0 = static_cast<int>(blockIdx.x) * U;
  const int live = min(U, H - u0);
  const int tid = static_cast<int>(threadIdx.x);
  const int warp = tid >> 5, lane = tid & 31;

  // The warps' partial sums, two buffers [8, CP] (plan.shared_bytes).
  extern __shared__ float partial[];

  // Row k = tid of the slice: w[c] = R[k, g*H + u0 + u], column c = g*U + u.
  const int k = tid;
  float w[CP];
  gated_rnn_load_row(w, p.d_R, p.weight_dtype, k, G, H, U, u0, live);
  if (T * G * H * static_cast<int64_t>(sizeof(Elem)) <= kGatedRnnPrefetchBytes)
    gated_rnn_prefetch_runs(static_cast<const Elem*>(p.d_wx) + u0, sizeof(Elem), T, G, H, live);
  uint64_t* const xchg = reinterpret_cast<uint64_t*>(ws + plan.ws_state);  // [2, 1, H]
  // This call's exchange words start as "no step"; one grid-wide barrier.
  if (T > 1) {
    if (tid < 2 * live) gated_rnn_publish(xchg + (tid / live) * H + u0 + tid % live, 0.0f, -1);
    cooperative_groups::this_grid().sync();
  }

  // The update threads' unit, carried state and bias, for the whole sequence.
  const bool updates = tid < live;
  const int hu = u0 + tid;
  float hp = 0.0f;
  SlstmState s{0.0f, 1.0f, 0.0f};
  if (updates) gated_rnn_load_initial<kCell>(p, hu, hp, s);
  float bias[G];
#pragma unroll
  for (int g = 0; g < G; ++g)
    bias[g] = updates && p.d_bias ? load_state(p.d_bias, p.weight_dtype, g * H + hu) : 0.0f;

  const Elem* __restrict__ wx = static_cast<const Elem*>(p.d_wx) + (updates ? hu : 0);
  Elem* __restrict__ y = static_cast<Elem*>(p.d_y) + (updates ? hu : 0);
  for (int64_t t = 0; t < T; ++t, wx += G * H, y += H) {
    // The update's input projections, loaded before the wait.
    float x[G];
#pragma unroll
    for (int g = 0; g < G; ++g) x[g] = updates ? to_float(wx[g * H]) : 0.0f;

    // This thread's word of h_{t-1}.
    float v = 0.0f;
    if (k < H) {
      if (t == 0) {
        if (p.d_h0) v = load_state(p.d_h0, p.state_dtype, k);
      } else {
        v = gated_rnn_wait_word(xchg + ((t - 1) & 1) * H + k, static_cast<int>(t - 1));
      }
    }

    float acc[CP];
#pragma unroll
    for (int c = 0; c < CP; ++c) acc[c] = v * w[c];
    float* const sums = partial + (t & 1) * kWarps * CP;
    gated_rnn_reduce_scatter_store<CP>(acc, CP, sums + warp * CP, 1, 0, lane);
    __syncthreads();

    if (updates) {
      float a[G];
#pragma unroll
      for (int g = 0; g < G; ++g) {
        const float* q = sums + g * U + tid;
        // The 8 warps' sums as a fixed tree (depth 3, not a chain of 7).
        a[g] = ((q[0] + q[CP]) + (q[2 * CP] + q[3 * CP])) +
               ((q[4 * CP] + q[5 * CP]) + (q[6 * CP] + q[7 * CP])) + bias[g];
      }
      const float h = gated_rnn_cell_step<kCell>(x, a, hp, s);
      hp = h;
      *y = from_float<Elem>(h);
      if (t + 1 < T) gated_rnn_publish(xchg + (t & 1) * H + hu, h, static_cast<int>(t));
    }
  }

  if (updates) gated_rnn_store_finals<kCell>(p, hu, hp, s);
}

}  // namespace exphil::kernels
