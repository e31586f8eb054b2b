/*
 * Fused GRU, LSTM and sLSTM sequences, forward, the latency layout ("unit
 * warps"): a warp per hidden unit, for small batches (B <= 4), where a step
 * is all latency and the block layout's barriers are most of it.
 *
 * Math: gated_rnn_forward.cuh (gated_rnn_cell.cuh is the step both layouts
 * run).
 *
 * Why a second layout. At B1 T32 H256 the block layout (gated_rnn_forward.cuh)
 * spends ~1.9 us a step (H200, bench/RESULTS.md): stage h_{t-1} through
 * shared memory, a block barrier, the product, a barrier, the update, a
 * barrier. Its product is 8 FMAs a lane; the barriers and shared-memory
 * round trips between the exchange and the update are the cost. Here a
 * warp owns one unit and all its G gates, so a step never leaves the warp:
 *   1. each lane reads h_{t-1}[b, k] for its k = lane + 32 j straight from
 *      the exchange (gated_rnn_common.cuh; eight loads in flight before it
 *      waits on any) into its FMAs with the unit's G columns of R, which
 *      the warp keeps in shared memory (lane-consecutive k: no bank
 *      conflicts);
 *   2. a butterfly over the lanes (offsets 16 to 1, the block layout's
 *      order at one row: at B = 1 both layouts give the same bits) sums
 *      each gate's product;
 *   3. lane b does row b's update, keeping the cell's state (c; c, n, m)
 *      and its own h_{t-1} in registers for the whole sequence, writes y_t
 *      and publishes h_t.
 * No barrier inside the loop: a warp waits only for the words it reads.
 * Every warp reads all of h_{t-1} (B * H * 8 bytes) from L2 each step,
 * which the planner bounds (B <= 4, H <= 8 warps x SMs).
 *
 * Floor: as the block layout's, the chain of T dependent steps, each one
 * trip of h through L2 (~1 us).
 *
 * Layout. Blocks of W warps (W = units per block, 1 to 8) own units
 * [blockIdx.x * W, + W); dynamic shared memory holds W x G x Hp floats
 * (Hp = H rounded up to 32), the columns of R of the block's units, zeros
 * past H. The exchange is the block layout's [2, B, H] of 64-bit {h, step}
 * words, so its double-buffer argument holds unchanged (a warp publishes
 * step t+2 only after reading step t+1 from every unit, i.e. after every
 * warp has finished reading step t). One cooperative launch, co-residency
 * checked first (gated_rnn_launch.cuh). No Hopper-only instructions.
 */
#pragma once

#include <cstdint>

#include <cooperative_groups.h>

#include "gated_rnn/gated_rnn_cell.cuh"
#include "gated_rnn/gated_rnn_common.cuh"

namespace exphil::kernels {

// Sums v over the warp's 32 lanes in the block layout's order (its
// one-row reduction in gated_rnn_reduce_scatter_store): every lane ends
// with the same bits.
__device__ __forceinline__ float gated_rnn_warp_sum(float v) {
#pragma unroll
  for (int off = 16; off >= 1; off >>= 1) v += __shfl_xor_sync(0xffffffffu, v, off);
  return v;
}

template <class Elem, GatedRnnCell kCell>
__global__ void __launch_bounds__(kGatedRnnUnitWarpsMaxThreads)
    gated_rnn_forward_unit_warps_kernel(const GatedRnnForwardParams p, const GatedRnnPlan plan,
                                        float* __restrict__ ws) {
  constexpr int G = kGatedRnnGates<kCell>;
  constexpr int kRows = kGatedRnnUnitWarpsMaxRows;
  constexpr int kInFlight = 8;
  const int64_t T = p.shape.steps;
  const int B = static_cast<int>(p.shape.batch);  // <= kRows (the plan's check)
  const int H = static_cast<int>(p.shape.hidden);
  const int Hp = (H + 31) & ~31;
  const int W = plan.units_per_block;
  const int warp = static_cast<int>(threadIdx.x >> 5);
  const int lane = static_cast<int>(threadIdx.x & 31);
  const int u0 = static_cast<int>(blockIdx.x) * W;
  const int hu = u0 + warp;
  const bool live = hu < H;
  const bool mine = live && lane < B;  // this lane updates row `lane` of unit hu

  extern __shared__ float smem[];
  // The block's columns: smem[(w * G + g) * Hp + k] = R[k, g*H + u0 + w].
  // Consecutive threads take consecutive units: reads of R come in runs of W.
  for (int64_t i = threadIdx.x; i < static_cast<int64_t>(W) * G * Hp; i += blockDim.x) {
    const int w = static_cast<int>(i % W);
    const int64_t rest = i / W;
    const int g = static_cast<int>(rest % G);
    const int k = static_cast<int>(rest / G);
    const bool in = u0 + w < H && k < H;
    smem[(static_cast<int64_t>(w) * G + g) * Hp + k] =
        in ? load_state(p.d_R, p.weight_dtype, static_cast<int64_t>(k) * G * H + g * H + u0 + w)
           : 0.0f;
  }
  const float* Wu = smem + static_cast<int64_t>(warp) * G * Hp;
  if (static_cast<int64_t>(B) * T * G * H * static_cast<int64_t>(sizeof(Elem)) <=
      kGatedRnnPrefetchBytes)
    gated_rnn_prefetch_runs(static_cast<const Elem*>(p.d_wx) + u0, sizeof(Elem), B * T, G, H,
                            min(W, H - u0));
  uint64_t* const xchg = reinterpret_cast<uint64_t*>(ws + plan.ws_state);  // [2, B, H]
  if (T > 1) {
    if (live && lane < 2 * B) gated_rnn_publish(xchg + static_cast<int64_t>(lane) * H + hu, 0.0f, -1);
    cooperative_groups::this_grid().sync();
  } else {
    __syncthreads();
  }

  // Row `lane`'s carried state, for the lanes that update.
  float hp = 0.0f;
  SlstmState s{0.0f, 1.0f, 0.0f};
  const int64_t sidx = static_cast<int64_t>(lane) * H + hu;
  if (mine) gated_rnn_load_initial<kCell>(p, sidx, hp, s);
  float bias[G];
#pragma unroll
  for (int g = 0; g < G; ++g)
    bias[g] = mine && p.d_bias ? load_state(p.d_bias, p.weight_dtype, g * H + hu) : 0.0f;

  const Elem* __restrict__ wx = static_cast<const Elem*>(p.d_wx);
  Elem* __restrict__ y = static_cast<Elem*>(p.d_y);
  for (int64_t t = 0; t < T; ++t) {
    // This step's input projections, loaded before the wait.
    float x[G];
#pragma unroll
    for (int g = 0; g < G; ++g)
      x[g] = mine ? to_float(wx[(lane * T + t) * G * H + g * H + hu]) : 0.0f;

    float acc[G][kRows];
#pragma unroll
    for (int g = 0; g < G; ++g)
#pragma unroll
      for (int b = 0; b < kRows; ++b) acc[g][b] = 0.0f;
    const uint64_t* src = xchg + ((t - 1) & 1) * static_cast<int64_t>(B) * H;
    const bool from_h0 = t == 0;
    if (live && (!from_h0 || p.d_h0)) {
#pragma unroll
      for (int b = 0; b < kRows; ++b) {
        if (b >= B) break;
        for (int k0 = lane; k0 < Hp; k0 += 32 * kInFlight) {
          float v[kInFlight];
          if (from_h0) {
#pragma unroll
            for (int j = 0; j < kInFlight; ++j) {
              const int k = k0 + 32 * j;
              v[j] = k < H ? load_state(p.d_h0, p.state_dtype, static_cast<int64_t>(b) * H + k) : 0.0f;
            }
          } else {
            uint64_t w[kInFlight];
#pragma unroll
            for (int j = 0; j < kInFlight; ++j) {
              const int k = k0 + 32 * j;
              if (k < H) w[j] = gated_rnn_peek(src + static_cast<int64_t>(b) * H + k);
            }
            gated_rnn_poll_rounds<kInFlight>(w, [&](int j) {
              const int k = k0 + 32 * j;
              return k < H ? src + static_cast<int64_t>(b) * H + k : nullptr;
            }, static_cast<int>(t - 1));
#pragma unroll
            for (int j = 0; j < kInFlight; ++j) {
              const int k = k0 + 32 * j;
              v[j] = k < H ? __uint_as_float(static_cast<uint32_t>(w[j])) : 0.0f;
            }
          }
#pragma unroll
          for (int j = 0; j < kInFlight; ++j) {
            const int k = k0 + 32 * j;
            if (k < Hp) {
#pragma unroll
              for (int g = 0; g < G; ++g) acc[g][b] = fmaf(v[j], Wu[g * Hp + k], acc[g][b]);
            }
          }
        }
      }
    }
    // Every lane takes part in the sums (the shuffles need the full warp).
    float rh[G];
#pragma unroll
    for (int g = 0; g < G; ++g) rh[g] = 0.0f;
#pragma unroll
    for (int b = 0; b < kRows; ++b) {
      if (b >= B) break;
#pragma unroll
      for (int g = 0; g < G; ++g) {
        const float sum = gated_rnn_warp_sum(acc[g][b]);
        if (lane == b) rh[g] = sum + bias[g];
      }
    }
    if (mine) {
      const float h = gated_rnn_cell_step<kCell>(x, rh, hp, s);
      hp = h;
      y[(lane * T + t) * H + hu] = from_float<Elem>(h);
      if (t + 1 < T)
        gated_rnn_publish(xchg + (t & 1) * static_cast<int64_t>(B) * H + sidx, h,
                          static_cast<int>(t));
    }
  }
  if (mine) gated_rnn_store_finals<kCell>(p, sidx, hp, s);
}

}  // namespace exphil::kernels
