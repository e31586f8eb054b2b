/*
 * Fused GRU, LSTM and sLSTM sequences, forward: every step's recurrent
 * product h_{t-1} R and the cell update in one persistent launch.
 *
 * Math. wx [B, T, G*H] is the input projection x_t W + b_in, computed outside
 * (as cuDNN and Edifice do). R [H, G*H], optional recurrent bias b [G*H];
 * rh_t = h_{t-1} R + b, gate g the columns [g*H, (g+1)*H).
 *
 *   GRU  (G = 3, gates r, z, n: Axon's gru_cell, Edifice's gru_scan, PyTorch
 *        and cuDNN's order)
 *          r = sigmoid(wx_r + rh_r)
 *          z = sigmoid(wx_z + rh_z)
 *          n = tanh(wx_n + r * rh_n)          (the reset gate scales the
 *                                              recurrent part only, its
 *                                              bias b_n included)
 *          h_t = (1 - z) * n + z * h_{t-1}
 *   LSTM (G = 4, gates i, f, g, o: Axon's lstm_cell, Edifice's lstm_scan,
 *        PyTorch and cuDNN's order)
 *          i = sigmoid(wx_i + rh_i), f = sigmoid(wx_f + rh_f)
 *          g = tanh(wx_g + rh_g),    o = sigmoid(wx_o + rh_o)
 *          c_t = f * c_{t-1} + i * g,  h_t = o * tanh(c_t)
 *   sLSTM (G = 4, gates i, f, z, o: xLSTM's scalar LSTM as Edifice's
 *        slstm_scan computes it; slstm_cell.cuh gives the step)
 *          pre = wx + rh; m_t = max(pre_f + m_{t-1}, pre_i)
 *          i' = exp(pre_i - m_t), f' = exp(pre_f + m_{t-1} - m_t)
 *          c_t = f' c_{t-1} + i' tanh(pre_z),  n_t = f' n_{t-1} + i'
 *          h_t = sigmoid(pre_o) * c_t / max(|n_t|, 1)
 *
 * Biases. Axon's GRU has input biases br, bz, bin (they belong in wx) and
 * one recurrent bias bhn inside r * (h whn + bhn): pass b = [0, 0, bhn].
 * cuDNN/PyTorch's b_hr, b_hz, b_hn map to b = [b_hr, b_hz, b_hn] (b_hr and
 * b_hz could equally be folded into wx; b_hn cannot). Axon's LSTM biases
 * (bi, bf, bg, bo) and Edifice's (inside wx) need no b: any LSTM recurrent
 * bias is simply added to the gate, as if folded into wx. Edifice's
 * gru_scan/lstm_scan have no recurrent bias (b absent). h0 and c0 default
 * to zeros (Axon's carry {c, h} for the LSTM is passed as h0 = h, c0 = c).
 *
 * Floors (H100: ~3 TB/s, ~60 TFLOP/s f32 on CUDA cores, ~0.5 us launch;
 * a device-wide exchange of h through L2 costs about 1 us).
 *   B1 T32 H256: 0.9 MB moved (R 0.8 MB) is 0.3 us and 25 MFLOP is nothing;
 *     the floor is the chain of T dependent steps, each needing all of
 *     h_{t-1} from every block: about T x (one L2 round trip + a barrier),
 *     ~30 us, plus one launch. cuDNN's 2-layer forward takes 1.1 ms (GRU)
 *     and 1.5 ms (LSTM) here (issue 30), so 10x asks ~55 us per layer.
 *   B64 T256 H512 LSTM f32: 170 MB (wx 134, y 34) is ~57 us, but the
 *     recurrent product is 34 GFLOP: ~0.6 ms on f32 CUDA cores. At large B
 *     the bound is arithmetic; only a tensor-core product per step (not
 *     this kernel) reaches cuDNN's bf16 kernels there.
 *   Measured (H100, bench/RESULTS.md, issue 30 run M, graph replay): B1
 *     T32 H256 GRU f32 60.2 us, 1.9 us a step; B64 T256 H512 GRU f32
 *     2.11 ms, 8.3 us a step (6.1 ms in one batch group, run G on an H200).
 *
 * Layouts. This file is the block layout, for any B, and the default
 * except at B = 1 with H <= 256, where gated_rnn_forward_k_split.cuh (a
 * thread per row of the product, the slice in registers, one barrier a
 * step) runs. Its product runs on CUDA cores from shared memory or, in
 * bf16 and f16 at large blocks' products (gated_rnn_plan.cpp), on tensor
 * cores from registers (gated_rnn_forward_tensor_cores.cuh, kProduct). gated_rnn_forward_unit_warps.cuh (a warp per hidden unit, no
 * block barrier inside a step, B <= 4) runs when the launch options ask for
 * it. All three step through gated_rnn_cell.cuh.
 *
 * Algorithm. One cooperative launch of Su x Sb blocks, one per SM at most,
 * 256 threads each (the launch checks first, with the occupancy API, that
 * all can be resident: blocks wait on each other). Units are cut into Su
 * slices of U, rows into Sb batch groups (gated_rnn_plan.cpp); block
 * (group, slice) owns the group's rows and the slice's hidden units
 * [jU, jU + U) with all G gates of them, i.e. G*U columns of R, so it
 * finishes its units' update (and keeps the LSTM's c) without anyone else.
 * Every step a block reads its rows' whole h_{t-1} from every slice, so
 * L2 carries Su * B * H words a step: at B <= 4 there is one group and U =
 * ceil(H / SMs) (the most blocks, the least work each on the critical
 * path); above, the rows are split among as many groups as the SMs allow
 * with at most 128 columns a block, for the fewest slices (at B64 H512 the
 * single group moved 4x the words, and its product was the bound). The
 * slice of R (H x G*U f32, column-major so that lanes read consecutive k,
 * padded with zero columns to a multiple of 4) is loaded once, into shared
 * memory when it fits with one block per SM ("resident"), else into the
 * block's piece of the workspace, read through L1/L2 every step
 * ("streamed", e.g. H = 1024 in f32 on an A100). Per step and per tile of
 * up to 32 of the group's rows:
 *   0. load what the update will need besides the product (wx_t, bias, the
 *      LSTM's c_{t-1}, the sLSTM's c, n, m_{t-1}), so those loads fly while
 *      the block waits (and, when the call starts, the block's whole slice
 *      of wx is prefetched into L2 if wx is at most 16 MB);
 *   1. stage h_{t-1} [rows, H] in shared memory: from h0 at t = 0, else
 *      from the exchange buffer, waiting for each word to carry step t-1
 *      (gated_rnn_common.cuh: the flag is the data, one L2 trip a step,
 *      no grid-wide barrier after the first);
 *   2. the slice product: a warp per group of columns, lanes split H, one
 *      accumulator per batch row and column, a butterfly reduce-scatter
 *      over lanes;
 *   3. a thread per (row, unit): gates, cell update in f32, y_t in the
 *      sequence dtype, h_t published with its step (the LSTM's c_t, the
 *      sLSTM's c_t, n_t, m_t into the block's own rows of a state buffer).
 *      With tiles of 8 rows or more (plan.pair_exchange) two lanes hold
 *      rows 2j and 2j + 1 of a tile for one unit and publish one word of
 *      both (gated_rnn_pair_word.h), so a consumer stages half the words:
 *      at B64 T256 H512 the forward took 6 to 7% less (GRU bf16, tiles of
 *      8) and 3 to 4% less (LSTM f32, tiles of 16), at B32 T64 H256 (tiles
 *      of 4) 14 to 18% more (bench/RESULTS.md, issue 30 runs CB and CD).
 *
 * The state is f32 throughout: y is rounded to the dtype on its way out and
 * never read back by the recurrence. Sums are in fixed order: results are
 * bitwise reproducible.
 *
 * Layout. wx [B, T, G*H], y [B, T, H], states [B, H], row-major. Workspace
 * (GatedRnnPlan): the exchange [2, B, H] of 64-bit words (pair words: a
 * tile's even rows' slots, counted from its first row, hold them), [B, H] c (LSTM)
 * or [3, B, H] c, n, m (sLSTM), streamed slices.
 *
 * Limits. G*U <= 256 (columns per block), so H <= 256 / G * SMs (11,264
 * for the GRU on 132 SMs); the blocks must all be resident (checked before
 * the launch with the occupancy API). Steps are numbered in 32 bits. A
 * cooperative launch can be captured into a CUDA graph (tested). No
 * Hopper-only instructions: sm_80 to sm_90.
 */
#pragma once

#include <cstdint>

#include <cooperative_groups.h>

#include "gated_rnn/gated_rnn_common.cuh"
#include "gated_rnn/gated_rnn_cell.cuh"
#include "gated_rnn/gated_rnn_forward_tensor_cores.cuh"

namespace exphil::kernels {

// What a (row, unit) update needs besides the product, loaded before the
// block waits for h_{t-1}. wx and the bias stay in their dtypes until the
// update (x(), b()): converted at the load, a 16-bit value made the thread
// wait for its load before the block's wait, not after it (bench/RESULTS.md,
// issue 30 run BG: the bf16 forward's steps 20% longer than f32's).
template <class Elem, GatedRnnCell kCell>
struct GatedRnnForwardInputs {
  static constexpr int G = kGatedRnnGates<kCell>;
  Elem wx[G];
  uint32_t bias[G];  // load_state_bits in the weight dtype; 0 without a bias
  SlstmState prev;   // LSTM c_{t-1} (in prev.c); sLSTM c, n, m_{t-1}

  __device__ __forceinline__ float x(int g) const { return to_float(wx[g]); }
  __device__ __forceinline__ float b(int g, DType weight_dtype) const {
    return state_from_bits(bias[g], weight_dtype);
  }

  __device__ __forceinline__ void load(const GatedRnnForwardParams& p, const float* cbuf,
                                       int64_t row, int hu, int64_t t) {
    const int64_t T = p.shape.steps;
    const int H = static_cast<int>(p.shape.hidden);
    const int64_t at = (row * T + t) * G * H + hu;
    const Elem* w = static_cast<const Elem*>(p.d_wx);
#pragma unroll
    for (int g = 0; g < G; ++g) {
      wx[g] = w[at + g * H];
      bias[g] = p.d_bias ? load_state_bits(p.d_bias, p.weight_dtype, g * H + hu) : 0u;
    }
    prev = {0.0f, 1.0f, 0.0f};
    if constexpr (kCell == GatedRnnCell::lstm) {
      const int64_t sidx = row * H + hu;
      prev.c = t > 0 ? cbuf[sidx] : (p.d_c0 ? load_state(p.d_c0, p.state_dtype, sidx) : 0.0f);
    } else if constexpr (kCell == GatedRnnCell::slstm) {
      const int64_t sidx = row * H + hu, BH = p.shape.batch * H;
      if (t > 0) {
        prev = {cbuf[sidx], cbuf[BH + sidx], cbuf[2 * BH + sidx]};
      } else {
        if (p.d_c0) prev.c = load_state(p.d_c0, p.state_dtype, sidx);
        if (p.d_n0) prev.n = load_state(p.d_n0, p.state_dtype, sidx);
        if (p.d_m0) prev.m = load_state(p.d_m0, p.state_dtype, sidx);
      }
    }
  }
};

// Where the block's slice of R lives and what multiplies it: shared memory
// (resident) or the workspace (streamed) on CUDA cores, or registers on
// tensor cores (gated_rnn_forward_tensor_cores.cuh: a 16-bit Elem, or f32
// as f16).
enum class GatedRnnForwardProduct { resident, streamed, tensor_cores };

// The tensor-core slice where the product takes it, else nothing.
template <class Elem, bool kOn>
struct GatedRnnForwardSlice : GatedRnnTensorCoreSlice<typename GatedRnnTcOperand<Elem>::type> {};
template <class Elem>
struct GatedRnnForwardSlice<Elem, false> {};

template <class Elem, GatedRnnCell kCell, GatedRnnForwardProduct kProduct, bool kPairs>
__global__ void __launch_bounds__(kGatedRnnThreads, 1)
    gated_rnn_forward_kernel(const GatedRnnForwardParams p, const GatedRnnPlan plan,
                             float* __restrict__ ws) {
  constexpr bool kTensorCores = kProduct == GatedRnnForwardProduct::tensor_cores;
  constexpr int G = kGatedRnnGates<kCell>;
  const int64_t B = p.shape.batch, T = p.shape.steps;
  const int H = static_cast<int>(p.shape.hidden);
  const int U = plan.units_per_block;
  const int slice = static_cast<int>(blockIdx.x) % plan.unit_slices;
  const int u0 = slice * U;
  const int live = min(U, H - u0);
  // This block's batch group: rows [g0, g1).
  const int64_t g0 = static_cast<int64_t>(blockIdx.x / plan.unit_slices) * plan.batch_rows;
  const int64_t g1 = min(B, g0 + plan.batch_rows);
  const int C = plan.stored_columns;
  const int K = H;
  const int Bt = plan.batch_tile;
  const int tid = static_cast<int>(threadIdx.x);

  // x [xrows, ldx]: h_{t-1} of a tile's rows; pre [parts][xrows][ldp]: the
  // product (one part on CUDA cores).
  const int ldx = kTensorCores ? static_cast<int>(gated_rnn_tc_x_stride(K)) : K;
  const int xrows = kTensorCores ? static_cast<int>(gated_rnn_tc_rows(Bt)) : Bt;
  const int ldp =
      kTensorCores ? static_cast<int>(gated_rnn_tc_sum_stride(G * U)) : gated_rnn_sum_stride(C);
  const GatedRnnRowStride x_at = GatedRnnRowStride::make(K, ldx);
  extern __shared__ float smem[];
  float* W = nullptr;
  float* x = smem;
  if constexpr (kProduct == GatedRnnForwardProduct::resident) {
    W = smem;
    x = smem + static_cast<int64_t>(C) * K;
  } else if constexpr (kProduct == GatedRnnForwardProduct::streamed) {
    W = ws + plan.ws_weights + static_cast<int64_t>(blockIdx.x) * C * K;
  }
  float* pre = x + xrows * ldx;
  uint64_t* const xchg = reinterpret_cast<uint64_t*>(ws + plan.ws_state);  // [2, B, H]
  float* const cbuf = kCell != GatedRnnCell::gru ? ws + plan.ws_cell : nullptr;

  GatedRnnForwardSlice<Elem, kTensorCores> slice_tc;
  if constexpr (kTensorCores && sizeof(Elem) == 2)
    slice_tc.load(static_cast<const uint16_t*>(p.d_R), G, H, U, u0, live, plan.k_parts);
  else if constexpr (kTensorCores)
    slice_tc.load(static_cast<const float*>(p.d_R), G, H, U, u0, live, plan.k_parts);
  else
    gated_rnn_load_slice(W, p.d_R, p.weight_dtype, G, H, U, u0, live, C);
  // wx of this block's rows and units, every step, into L2 (if small enough).
  if (B * T * G * H * static_cast<int64_t>(sizeof(Elem)) <= kGatedRnnPrefetchBytes)
    gated_rnn_prefetch_runs(static_cast<const Elem*>(p.d_wx) + g0 * T * G * H + u0, sizeof(Elem),
                            (g1 - g0) * T, G, H, live);
  // This call's exchange words start as "no step"; one grid-wide barrier
  // (which also orders the slice's stores before its first use).
  if (T > 1) {
    const int64_t rows = g1 - g0;
    for (int64_t i = tid; i < 2 * rows * live; i += kGatedRnnThreads) {
      const int64_t r = i / live;  // half * rows + row - g0
      const int64_t half = r / rows;
      uint64_t* const word = xchg + (half * B + g0 + r - half * rows) * H + u0 + (i - r * live);
      if constexpr (kPairs)
        gated_rnn_publish_pair(word, 0.0f, 0.0f,
                               gated_rnn_pair_no_step_upward(static_cast<int>(half)));
      else
        gated_rnn_publish(word, 0.0f, -1);
    }
    cooperative_groups::this_grid().sync();
  } else {
    __syncthreads();
  }

  // A tile's items: item i is unit u of row j, (j, u) = divmod(i, live).
  // With pair words (kPairs, plan.pair_exchange) they come in pairs of
  // lanes: item i is unit u of row 2j + (i & 1), (j, u) = divmod(i / 2,
  // live), so that lanes i and i ^ 1 hold rows 2j and 2j + 1 of one unit
  // and publish their h_t as one word (gated_rnn_pair_word.h: half the
  // words a consumer stages), 2 live ceil(nb / 2) items a tile, the last
  // odd row dead where nb is odd. This thread's first item, i = tid, and
  // the step to its next, i + 256: no division inside the step loop (two
  // sat on every step's critical path, between the product and the cell).
  constexpr int lanes = kPairs ? 2 : 1;  // lanes a unit of a row pair
  const int parity = tid & (lanes - 1);
  const int first_j = tid / lanes / live, first_u = tid / lanes - first_j * live;
  const int first_b = lanes * first_j + parity;
  const int skip_j = kGatedRnnThreads / lanes / live;
  const int skip_u = kGatedRnnThreads / lanes - skip_j * live;
  const auto tile_items = [live](int64_t nb) {
    return static_cast<int>(lanes * live * ((nb + lanes - 1) / lanes));
  };
  // A group of one tile whose items fit a thread each (every B <= 4 with
  // U <= 64): the thread reads its unit's h_{t-1} from x before the
  // product's barrier, so a step needs no barrier at its end. The next
  // step's staging may then overwrite x as soon as the product is done, and
  // its product writes `pre` only after its own staging barrier, which the
  // cell threads reach after their update.
  const bool one_pass = g1 - g0 <= Bt && tile_items(g1 - g0) <= kGatedRnnThreads;

  Elem* __restrict__ y = static_cast<Elem*>(p.d_y);
  for (int64_t t = 0; t < T; ++t) {
    for (int64_t b0 = g0; b0 < g1; b0 += Bt) {
      const int nb = static_cast<int>(g1 - b0 < Bt ? g1 - b0 : Bt);
      const int rows = kTensorCores ? xrows : gated_rnn_product_rows(nb);
      const int items = tile_items(nb);
      const bool first_live = tid < items && first_b < nb;
      GatedRnnForwardInputs<Elem, kCell> first;
      if (first_live) first.load(p, cbuf, b0 + first_b, u0 + first_u, t);
      if (t == 0) {
        gated_rnn_stage_state(x, nb, rows, K, x_at, p.d_h0, p.state_dtype, b0 * H);
      } else {
        gated_rnn_stage_exchange<kPairs>(x, nb, rows, K, x_at,
                                         xchg + ((t - 1) & 1) * B * H + b0 * H,
                                         static_cast<int>(t - 1));
      }
      __syncthreads();
      const float first_hp = first_live ? x[first_b * ldx + u0 + first_u] : 0.0f;
      if constexpr (kTensorCores)
        slice_tc.multiply(x, ldx, nb, pre, xrows, ldp);
      else
        gated_rnn_slice_product_rows<kGatedRnnMaxBatchTile,
                                     kProduct == GatedRnnForwardProduct::resident && !kPairs>(
            rows, x, K, nb, W, C, pre, ldp);
      __syncthreads();
      int j = first_j, u = first_u;
      for (int i = tid; i < items; i += kGatedRnnThreads) {
        const int b = lanes * j + parity;
        const int64_t row = b0 + b;
        const int hu = u0 + u;
        const int64_t sidx = row * H + hu;
        float h = 0.0f;
        if (b < nb) {
          GatedRnnForwardInputs<Elem, kCell> in;
          float hp;
          if (i == tid) {
            in = first;
            hp = first_hp;
          } else {
            in.load(p, cbuf, row, hu, t);
            hp = x[b * ldx + hu];
          }
          float a[G], wx[G];
#pragma unroll
          for (int g = 0; g < G; ++g) {
            a[g] = (kTensorCores ? gated_rnn_tc_sum(pre, plan.k_parts, xrows, ldp, b, g * U + u)
                                 : pre[b * ldp + g * U + u]) +
                   in.b(g, p.weight_dtype);
            wx[g] = in.x(g);
          }
          SlstmState st = in.prev;
          h = gated_rnn_cell_step<kCell>(wx, a, hp, st);
          if constexpr (kCell != GatedRnnCell::gru) {
            // Read back only by this thread, next step.
            cbuf[sidx] = st.c;
            if (t == T - 1 && p.d_c_final) store_state(p.d_c_final, p.state_dtype, sidx, st.c);
          }
          if constexpr (kCell == GatedRnnCell::slstm) {
            cbuf[B * H + sidx] = st.n;
            cbuf[2 * B * H + sidx] = st.m;
            if (t == T - 1) {
              if (p.d_n_final) store_state(p.d_n_final, p.state_dtype, sidx, st.n);
              if (p.d_m_final) store_state(p.d_m_final, p.state_dtype, sidx, st.m);
            }
          }
          y[(row * T + t) * H + hu] = from_float<Elem>(h);
          if (t == T - 1 && p.d_h_final) store_state(p.d_h_final, p.state_dtype, sidx, h);
        }
        if (t + 1 < T) {
          if constexpr (kPairs) {
            // Lanes i and i ^ 1 (rows 2j and 2j + 1) hand h over, the even
            // one publishes both. The warp's lanes in this pass: items is
            // even, so a lane's partner is among them.
            const int in_pass = items - (i - (tid & 31));
            const unsigned mask = in_pass >= 32 ? 0xffffffffu : (1u << in_pass) - 1u;
            const float next = __shfl_xor_sync(mask, h, 1);
            if (parity == 0)
              gated_rnn_publish_pair(xchg + (t & 1) * B * H + sidx, h, next, static_cast<int>(t));
          } else {
            gated_rnn_publish(xchg + (t & 1) * B * H + sidx, h, static_cast<int>(t));
          }
        }
        j += skip_j;
        u += skip_u;
        if (u >= live) {
          u -= live;
          ++j;
        }
      }
      if (!one_pass) __syncthreads();
    }
  }
}

}  // namespace exphil::kernels
