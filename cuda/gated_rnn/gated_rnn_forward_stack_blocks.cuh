/*
 * Stacked GRU and LSTM layers, forward, B <= 4: the wavefront of
 * gated_rnn_forward_stack.cuh (layer l's step t runs while layer l-1 runs
 * a step or two ahead, so L layers of T steps take about T + 2(L - 1)
 * steps of time) in the block layout of gated_rnn_forward.cuh, where the
 * k-split layout's one batch row and H <= 256 do not hold.
 *
 * Math: as gated_rnn_forward_stack.cuh. Layer l > 0 runs on x_t =
 * h_{l-1,t} W_l + b_l, formed here from the f32 h_{l-1,t}, kept apart from
 * the recurrent h_{l,t-1} R_l + bias_l (the GRU's n gate scales only the
 * latter).
 *
 * Why. Two layers called one after the other cost two chains of T steps,
 * and at small batches a step waits mostly on the exchange between blocks:
 * the layers' steps can share that time.
 *
 * Where not. Above B = 4 a block's products weigh as much as the exchange:
 * at B32 T64 H256 (bench/RESULTS.md, issue 30 runs AY to BA) two layers
 * here took 451 to 520 us against 448 to 504 for two calls in f32 (one
 * block a multiprocessor, half the blocks a layer: each block's products
 * doubled, and layer 0's blocks form layer 1's input too), 630 to 712 at
 * two blocks a multiprocessor; the planner runs those layers one after
 * another.
 *
 * Layout: every layer in the same block layout, blocks [l * Sb * Su,
 * (l + 1) * Sb * Su) for layer l, block (group, slice) within a layer as
 * gated_rnn_forward.cuh's, each layer on 1 / L of the multiprocessors; a
 * group's rows fit one batch tile. Shared
 * memory: the slices of R_l and of W_{l+1} [C, H] f32 (resident), two
 * buffers of the tile's h_{l,t-1} [Bt, H], the two products [Bt, C].
 *
 * Who forms layer l+1's input. Block (group g, slice j) of layer l stages
 * all of its rows' h_{l,t-1} for its own product at step t: it multiplies
 * the same staged rows by W_{l+1}'s slice j too, which is exactly the
 * input block (g, j) of layer l+1 needs for step t-1, and hands that
 * block its [rows, G*U] sums. So no block stages anything twice, and the
 * input's product sits in the gap after a block publishes h_{l,t}, while
 * the other blocks' h_{l,t} cross L2 (it was on the step's critical path
 * when layer l+1 staged h_{l,t} and multiplied it itself: runs AY, AZ). A step
 * of layer l: stage h_{l,t-1}, barrier, the recurrent product, barrier, a
 * thread per (row, unit) runs the cell and publishes h_{l,t}; then, where
 * a layer is above, the input's product of the staged rows, barrier, and
 * its sums published for step t-1 (after the last step, one more stage of
 * h_{l,T-1} for the input of step T-1). Layer l+1's threads load their
 * items' input sums before their own staging and check their step after
 * it: the wait is hidden while layer l runs ahead.
 *
 * The exchanges, 64-bit words {value, step} (gated_rnn_common.cuh), slot s
 * mod D holding step s, D = plan.stack_depth: per layer a ring [D, B, H]
 * of h (read by the layer's own blocks, slot t-1 at step t), and per layer
 * with one above a ring [D, B, G*H] of the above's input sums. Block (g, j)
 * of layer l may overwrite the sums of step s-D with those of step s only
 * after every thread of block (g, j) of layer l+1 has read them; that
 * block publishes h_{l+1,s-D+1} only after a barrier that follows those
 * reads, so thread 0 waits, with the step's staging, for that block's
 * first word of layer l+1's h ring, slot s-D+1, to carry step s-D+1 or
 * later. Before the first step every block marks its words "no
 * step", then one grid-wide barrier.
 *
 * Floor: T + 2(L - 1) dependent steps, each one trip through L2 and a
 * layer's products. Every sum in a fixed order: results are bitwise
 * reproducible.
 *
 * Limits: GRU and LSTM; 2 to kGatedRnnMaxStackLayers layers of one H; a
 * group's rows within one batch tile; both slices resident in shared
 * memory; all L * Sb * Su blocks resident at once, one a multiprocessor
 * (the planner, plan_gated_rnn_stack, keeps to the multiprocessors; the
 * launch checks co-residency). CUDA cores, no Hopper-only instructions.
 */
#pragma once

#include <cstdint>

#include <cooperative_groups.h>

#include "gated_rnn/gated_rnn_cell.cuh"
#include "gated_rnn/gated_rnn_common.cuh"
#include "gated_rnn/gated_rnn_forward_stack.cuh"

namespace exphil::kernels {

namespace gated_rnn_stack {

// What a (row, unit) update needs besides the recurrent product, its loads
// issued before the block waits: the input (layer 0: wx_t; above: the
// sums the layer below hands over, whose step is checked by settle(), and
// the input bias), the recurrent bias, and the LSTM's c_{t-1}. The 16-bit
// values stay in their dtypes until settle(), after the wait (as
// gated_rnn_forward.cuh's GatedRnnForwardInputs).
template <class Elem, GatedRnnCell kCell, bool kInput>
struct BlockInputs {
  static constexpr int G = kGatedRnnGates<kCell>;
  float x[G];     // after settle()
  float bias[G];  // after settle()
  float c;
  Elem wx_raw[kInput ? 1 : G];
  uint32_t bias_bits[G], input_bias_bits[kInput ? G : 1];  // load_state_bits; 0 when absent
  uint64_t sums[kInput ? G : 1];
  const uint64_t* from;  // kInput: the first gate's sum

  __device__ __forceinline__ void load(const Layer& ly, const void* wx, const uint64_t* input,
                                       DType wdt, DType sdt, const float* cbuf, int64_t T, int H,
                                       int64_t row, int hu, int64_t t) {
#pragma unroll
    for (int g = 0; g < G; ++g) {
      if constexpr (kInput) {
        input_bias_bits[g] = ly.W_bias ? load_state_bits(ly.W_bias, wdt, g * H + hu) : 0u;
        sums[g] = gated_rnn_peek(input + row * G * H + g * H + hu);
      } else {
        wx_raw[g] = static_cast<const Elem*>(wx)[(row * T + t) * G * H + g * H + hu];
      }
      bias_bits[g] = ly.bias ? load_state_bits(ly.bias, wdt, g * H + hu) : 0u;
    }
    if constexpr (kInput) from = input + row * G * H + hu;
    c = 0.0f;
    if constexpr (kCell == GatedRnnCell::lstm) {
      const int64_t sidx = row * H + hu;
      c = t > 0 ? cbuf[sidx] : (ly.c0 ? load_state(ly.c0, sdt, sidx) : 0.0f);
    }
  }
  // Waits for the input sums to carry `step` and adds them in; the values
  // kept in their dtypes as floats.
  __device__ __forceinline__ void settle(int H, int step, DType wdt) {
#pragma unroll
    for (int g = 0; g < G; ++g) {
      bias[g] = state_from_bits(bias_bits[g], wdt);
      if constexpr (kInput)
        x[g] = state_from_bits(input_bias_bits[g], wdt);
      else
        x[g] = to_float(wx_raw[g]);
    }
    if constexpr (kInput) {
      gated_rnn_poll_live_rounds<G>(
          sums, [](int) { return true; }, [&](int g) { return from + g * H; }, step);
#pragma unroll
      for (int g = 0; g < G; ++g) x[g] += __uint_as_float(static_cast<uint32_t>(sums[g]));
    }
  }
};

// Waits until the word *p carries step `step` or a later one.
__device__ __forceinline__ void wait_consumed(const uint64_t* p, int step) {
  while (static_cast<int>(static_cast<uint32_t>(gated_rnn_peek(p) >> 32)) < step) {
  }
}

// Layer l's whole sequence for one block: its group's rows, its slice's
// units. kInput: the layer takes the sums the layer below hands over (l >
// 0), else wx.
template <class Elem, GatedRnnCell kCell, bool kInput>
__device__ __forceinline__ void run_layer_blocks(const GatedRnnStackParams& p,
                                                 const GatedRnnPlan& plan, float* ws, int l,
                                                 int r) {
  constexpr int G = kGatedRnnGates<kCell>;
  const int64_t B = p.layer[0].shape.batch, T = p.layer[0].shape.steps;
  const int H = static_cast<int>(p.layer[0].shape.hidden);
  const DType wdt = p.layer[0].weight_dtype, sdt = p.layer[0].state_dtype;
  const int D = plan.stack_depth, L = p.layers;
  const int U = plan.units_per_block, Su = plan.unit_slices;
  const int slice = r % Su;
  const int u0 = slice * U;
  const int live = min(U, H - u0);
  const int64_t g0 = static_cast<int64_t>(r / Su) * plan.batch_rows;
  const int nb = static_cast<int>(min(B, g0 + plan.batch_rows) - g0);  // <= the batch tile
  const int rows = gated_rnn_product_rows(nb);
  const int C = plan.stored_columns, K = H, Bt = plan.batch_tile;
  const int tid = static_cast<int>(threadIdx.x);
  const Layer ly = layer_of(p, l);
  const bool feeds = l + 1 < L;  // a layer above takes this one's h
  const GatedRnnRowStride x_at = GatedRnnRowStride::make(K, K);

  extern __shared__ float smem[];
  float* const Wr = smem;                              // [C, K] R_l's slice
  float* const Wi = Wr + static_cast<int64_t>(C) * K;  // [C, K] W_{l+1}'s slice
  float* const xbuf = Wi + static_cast<int64_t>(C) * K;  // [2, Bt, K] h_{l,t-1}, by t's parity
  float* const pre = xbuf + 2 * Bt * K;                  // [Bt, C] h_{l,t-1} R_l
  float* const pre_in = pre + Bt * C;                    // [Bt, C] h_{l,t-1} W_{l+1}
  const int64_t BH = B * H, GBH = G * BH;
  uint64_t* const rings = reinterpret_cast<uint64_t*>(ws + plan.ws_state);
  uint64_t* const own = rings + l * D * BH;                   // [D, B, H] h_l
  const uint64_t* const own_above = own + D * BH;             // h_{l+1} (where feeds)
  uint64_t* const handed = reinterpret_cast<uint64_t*>(ws + plan.ws_exchange);
  uint64_t* const up = handed + l * D * GBH;                  // [D, B, G*H] layer l+1's input
  const uint64_t* const input = up - D * GBH;                 // this layer's (kInput)
  float* const cbuf = kCell == GatedRnnCell::lstm ? ws + plan.ws_cell + l * BH : nullptr;
  const void* const wx = p.layer[0].d_wx;

  gated_rnn_load_slice(Wr, ly.R, wdt, G, H, U, u0, live, C);
  if (feeds) {
    const Layer next = layer_of(p, l + 1);
    gated_rnn_load_slice(Wi, next.W, wdt, G, H, U, u0, live, C);
  }
  if (!kInput && B * T * G * H * static_cast<int64_t>(sizeof(Elem)) <= kGatedRnnPrefetchBytes)
    gated_rnn_prefetch_runs(static_cast<const Elem*>(wx) + g0 * T * G * H + u0, sizeof(Elem),
                            nb * T, G, H, live);
  // This block's words, every slot: its rows and units of h_l and, where a
  // layer is above, its rows and columns of the input it hands over.
  for (int i = tid; i < D * nb * live; i += kGatedRnnThreads) {
    const int row = i / live;  // slot * nb + b
    const int slot = row / nb;
    gated_rnn_publish(own + slot * BH + (g0 + row - slot * nb) * H + u0 + (i - row * live), 0.0f,
                      -1);
  }
  if (feeds)
    for (int i = tid; i < D * nb * G * live; i += kGatedRnnThreads) {
      const int row = i / (G * live);  // slot * nb + b
      const int slot = row / nb, rest = i - row * G * live;
      const int g = rest / live;
      gated_rnn_publish(up + slot * GBH + (g0 + row - slot * nb) * G * H + g * H + u0 + rest - g * live,
                        0.0f, -1);
    }
  cooperative_groups::this_grid().sync();

  const int items = nb * live;
  // As gated_rnn_forward.cuh: a thread's first item loaded before the
  // waits, and with one item a thread no barrier at a step's end.
  const int first_b = tid / live, first_u = tid - first_b * live;
  const bool one_pass = items <= kGatedRnnThreads;
  Elem* __restrict__ y = static_cast<Elem*>(ly.y);
  // t = T only forms the input of step T-1 for the layer above.
  for (int64_t t = 0; t < (feeds ? T + 1 : T); ++t) {
    const int step = static_cast<int>(t);
    const bool steps = t < T;
    float* const xh = xbuf + (t & 1) * Bt * K;
    const uint64_t* const in_t = kInput ? input + (t & (D - 1)) * GBH : nullptr;
    BlockInputs<Elem, kCell, kInput> first;
    if (steps && tid < items)
      first.load(ly, wx, in_t, wdt, sdt, cbuf, T, H, g0 + first_b, u0 + first_u, t);
    if (t == 0)
      gated_rnn_stage_state(xh, nb, rows, K, x_at, ly.h0, sdt, g0 * H);
    else
      gated_rnn_stage_exchange(xh, nb, rows, K, x_at, own + ((t - 1) & (D - 1)) * BH + g0 * H,
                               step - 1);
    // The sums of step t-1 go where step t-1-D's were: read by then, i.e.
    // has the block above passed the barrier after those reads?
    if (feeds && t - 1 >= D && tid == 0)
      wait_consumed(own_above + ((t - D) & (D - 1)) * BH + g0 * H + u0, step - D);
    __syncthreads();
    if (steps) {
      const float first_hp = tid < items ? xh[first_b * K + u0 + first_u] : 0.0f;
      gated_rnn_slice_product_rows<kGatedRnnLatencyRows, true>(rows, xh, K, nb, Wr, C, pre, C);
      __syncthreads();
      for (int i = tid; i < items; i += kGatedRnnThreads) {
        const int b = i / live, u = i - b * live;
        const int64_t row = g0 + b;
        const int hu = u0 + u;
        const int64_t sidx = row * H + hu;
        BlockInputs<Elem, kCell, kInput> in;
        float hp;
        if (i == tid) {
          in = first;
          hp = first_hp;
        } else {
          in.load(ly, wx, in_t, wdt, sdt, cbuf, T, H, row, hu, t);
          hp = xh[b * K + hu];
        }
        in.settle(H, step, wdt);
        float a[G];
#pragma unroll
        for (int g = 0; g < G; ++g) a[g] = pre[b * C + g * U + u] + in.bias[g];
        SlstmState st{in.c, 1.0f, 0.0f};
        const float h = gated_rnn_cell_step<kCell>(in.x, a, hp, st);
        if constexpr (kCell == GatedRnnCell::lstm) cbuf[sidx] = st.c;  // read back by this thread
        if (y) y[(row * T + t) * H + hu] = from_float<Elem>(h);
        if (t + 1 < T || feeds) gated_rnn_publish(own + (t & (D - 1)) * BH + sidx, h, step);
        if (t == T - 1) {
          if (ly.h_final) store_state(ly.h_final, sdt, sidx, h);
          if constexpr (kCell == GatedRnnCell::lstm)
            if (ly.c_final) store_state(ly.c_final, sdt, sidx, st.c);
        }
      }
    }
    if (feeds && t > 0) {
      // The layer above's input for step t-1, from the rows staged above
      // (the other buffer is next step's): its sums, published by item.
      gated_rnn_slice_product_rows<kGatedRnnLatencyRows, true>(rows, xh, K, nb, Wi, C, pre_in, C);
      __syncthreads();
      uint64_t* const dst = up + ((t - 1) & (D - 1)) * GBH + g0 * G * H;
      for (int i = tid; i < nb * G * live; i += kGatedRnnThreads) {
        const int b = i / (G * live), rest = i - b * G * live;
        const int g = rest / live, u = rest - g * live;
        gated_rnn_publish(dst + b * G * H + g * H + u0 + u, pre_in[b * C + g * U + u], step - 1);
      }
    } else if (!one_pass) {
      __syncthreads();
    }
  }
}

}  // namespace gated_rnn_stack

template <class Elem, GatedRnnCell kCell>
__global__ void __launch_bounds__(kGatedRnnThreads, 1)
    gated_rnn_forward_stack_blocks_kernel(const GatedRnnStackParams p, const GatedRnnPlan plan,
                                          float* __restrict__ ws) {
  static_assert(kCell == GatedRnnCell::gru || kCell == GatedRnnCell::lstm,
                "the stack takes GRU and LSTM layers");
  const auto [l, r] = gated_rnn_stack::stack_block(plan);
  if (l == 0)
    gated_rnn_stack::run_layer_blocks<Elem, kCell, false>(p, plan, ws, l, r);
  else
    gated_rnn_stack::run_layer_blocks<Elem, kCell, true>(p, plan, ws, l, r);
}

}  // namespace exphil::kernels
