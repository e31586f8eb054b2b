/*
 * Fused GRU, LSTM and sLSTM sequences, backward (gated_rnn_forward.cuh gives
 * the math). From grad_y [B, T, H] (the gradient of every h_t) and
 * optionally the final states' gradients (grad_h_final; grad_c_final; the
 * sLSTM's grad_n_final and grad_m_final): grad_wx, grad_R, grad_bias,
 * grad_h0, grad_c0, grad_n0, grad_m0 and Edifice's grad_rh, each only when
 * asked for.
 *
 * Per step, with dh the total gradient of h_t (and dc of c_t, LSTM):
 *   GRU   dn = dh (1 - z), dz = dh (h_{t-1} - n)
 *         da_n = dn (1 - n^2), da_z = dz z (1 - z), da_r = da_n rh_n r (1 - r)
 *         grad_wx_t = [da_r, da_z, da_n],  grad_rh_t = [da_r, da_z, da_n r]
 *         dh_{t-1} = dh z + grad_rh_t R^T
 *   LSTM  dc += dh o (1 - tanh^2 c_t)
 *         da_i = dc g i (1 - i), da_f = dc c_{t-1} f (1 - f),
 *         da_g = dc i (1 - g^2), da_o = dh tanh(c_t) o (1 - o)
 *         grad_wx_t = grad_rh_t = [da_i, da_f, da_g, da_o]
 *         dh_{t-1} = grad_rh_t R^T,  dc_{t-1} = dc f
 *   sLSTM slstm_cell.cuh (slstm_step_backward, with the ties of max()
 *         as Nx's gradient has them): dc, dn and dm carried,
 *         grad_wx_t = grad_rh_t = [da_i, da_f, da_z, da_o],
 *         dh_{t-1} = grad_rh_t R^T
 *   grad_R = sum_{b,t} h_{t-1}^T grad_rh_t,  grad_bias = sum_{b,t} grad_rh_t
 *
 * Floors. B1 T32 H256: as the forward, a chain of T dependent steps (~1 us
 * each) plus four launches. B64 T256 H512 LSTM f32: the recomputed product
 * and grad_R are 34 GFLOP each and the carried product another 34, ~1.7 ms
 * of f32 CUDA-core arithmetic; bytes (wx, y, grad_y, grad_wx and the f32
 * workspace) are ~1 GB, ~0.35 ms. Measured (H100, bench/RESULTS.md, issue
 * 30 run M, graph replay): B1 T32 H256 GRU f32 152.6 us (111.7 us on an
 * H200 before the parts exchange: at B1 each of its 128 slices publishes a
 * part for every unit), about 120 us since step 1's split (run W: forward
 * + backward 179.2 us, the forward 59.5; ncu puts the walk at 122 of it);
 * B64 T256 H512 4.88 ms (18.0 ms before).
 *
 * Algorithm: four launches (one more for each of steps 1 and 4 when
 * split), none with atomics, every sum in a fixed order (bitwise
 * reproducible).
 *   1. rh = h_{t-1} R + b for all t at once (the forward's y gives every
 *      h_{t-1}): a tiled f32 product [B*T, H] x [H, G*H] into the
 *      workspace (gated_rnn_gemm.cuh), split along H into slices added in
 *      order where its tiles are too few to fill half the device (B1 to B4
 *      at short T).
 *   2. the gates from rh and wx (gated_rnn_gates_kernel): GRU r, z, n, rh_n
 *      for every (b, t, unit) in parallel; LSTM i, f, g, o and c_t
 *      (gated_rnn_lstm_gates_kernel): c_t = f_t c_{t-1} + i_t g_t is
 *      linear in c_{t-1}, so chunks of 8 steps run side by side, each from
 *      c = 0 with the product of its f, folded together in order; sLSTM a
 *      thread per (b, unit) walking t through slstm_step (the forward's
 *      own arithmetic, its stabiliser m not linear), in chunks of 8 steps
 *      whose loads are issued together, keeping i', f', z, o and c_t, n_t
 *      and max's share for every step.
 *   3. one cooperative launch walks t from T-1 down to 0 (and to -1 for
 *      the initial states' gradients), the forward's mirror, in the
 *      forward's layout: block (group, slice) owns the group's rows, the
 *      slice's units [jU, jU + U) and the same G*U columns of R (resident
 *      in shared memory or streamed from the workspace). Per step and tile
 *      of up to 32 rows it loads what the update needs besides the product
 *      (grad_y, the gates, h_{t-1} or the cell states, the carries),
 *      stages every slice's part of grad_rh_{s+1} R^T for its rows and
 *      units from the exchange (gated_rnn_common.cuh: each word carries its
 *      step, so waiting for it is the synchronisation) and sums them in
 *      slice order, adds grad_y_s and the carried direct term (GRU dh z;
 *      the LSTM's dc and the sLSTM's dc, dn, dm stay with their unit),
 *      forms grad_rh_s for its columns and writes it (f32) for step 4, with
 *      grad_wx_s and grad_rh_s in the dtype when asked, then publishes its
 *      part of grad_rh_s R^T for every unit (a thread per unit, from 16
 *      rows a thread per unit and half the rows, the columns in order:
 *      gated_rnn_part_product; with bf16 weights and tiles of 8 rows or more,
 *      on tensor cores: gated_rnn_part_product_tc, the slice resident as
 *      bf16, transposed). Exchanging the parts [B, H] per slice rather
 *      than grad_rh itself [B, G*H] carries G times fewer words: the
 *      first version's exchange of grad_rh was its bound at B64 H512.
 *   4. grad_R and grad_bias: the product [H+1, B*T] x [B*T, G*H] of
 *      [h_{t-1}; 1]^T and grad_rh, each output summed over b, t in order by
 *      one thread, split along B*T into slices added in order where its
 *      tiles are too few to fill the device (the same tiled kernel as step
 *      1, and a reduction).
 *   Measured (H100, ncu, bench/RESULTS.md runs L and M): at B64 T256 H512
 *   GRU f32 the two products take 1.0 and 1.7 ms, the walk 3.0 ms. The
 *   walk is latency-bound there (H200, run AW: 2 warps a scheduler, none
 *   eligible 56 to 60% of the cycles). Timed from inside (runs BN and
 *   BP, bf16 GRU, 8.9 us a step): the part product and its publication
 *   49% (2.8x its multiply-adds' floor), the staging 32% (0.9 us waiting
 *   for the group's slowest slice, 1.8 us from its publication to the
 *   parts staged), the update 15%. Both big parts must shrink: the product
 *   on tensor cores (run AX, three bf16 passes at 190 registers) was no
 *   faster, and staging all of a thread's words in one round (run BO, 255
 *   registers) was slower than batches of 8.
 *
 * The backward reads h_{t-1} from y, i.e. rounded to the dtype (the
 * forward's f32 state is not kept); for f32 this is exact. The LSTM's c and
 * the sLSTM's c, n and m are recomputed from the gates (step 2), not taken
 * from the forward: the op's backward takes y only, and these states follow
 * from y and wx elementwise. For the sLSTM that costs only rounding where
 * its gradient is continuous (slstm_cell.cuh: n0 >= 1 and no gradient of
 * c_final, n_final or m_final); otherwise, with f16/bf16 y, a recomputed
 * step close to one of max()'s ties can fall on its other side, and the
 * gradient there is that side's (as for any nearby input).
 *
 * Layout. As the forward. Workspace (GatedRnnPlan): rh / grad_rh [B, T,
 * G*H], gates [B, T, 4, H], c [B, T, H] (LSTM) or c, n, share [B, T, 3, H]
 * (sLSTM), carries [B, H] (dh; the LSTM's dc; the sLSTM's [3, B, H] dc, dn,
 * dm), the exchange [2, Su, B, H] of 64-bit words, streamed slices.
 *
 * Limits. As the forward. B*T*G*H and every offset are 64-bit.
 */
#pragma once

#include <cstdint>
#include <type_traits>

#include <cooperative_groups.h>

#include "common/fast_divisor.h"
#include "gated_rnn/gated_rnn_common.cuh"
#include "gated_rnn/gated_rnn_gemm.cuh"
#include "gated_rnn/gated_rnn_walk_tensor_cores.cuh"
#include "gated_rnn/slstm_cell.cuh"

namespace exphil::kernels {

// ---------------------------------------------------------------------------
// The products' operands (gated_rnn_gemm.cuh gives the loader contract).

// h_{t-1} of row m = b*T + t: y_{t-1}, or h0 (zeros) at t = 0. A row is
// found once (its division by T), then read by unit. Where every row is
// below 2^31 (narrow, B*T < 2^31) by_T divides them as a multiply: grad_R's
// product finds two rows a thread every step of k, and as divisions they
// took more instructions than its HMMAs (bench/RESULTS.md, issue 30 run
// DD).
template <class Elem>
struct GatedRnnPrevState {
  const Elem* y;
  const void* h0;
  DType h0_dtype;
  int64_t T, H;
  bool narrow;
  FastDivisor by_T;  // T, where narrow
  struct Row {
    const void* p = nullptr;  // null: zeros
    bool from_y = false;      // y (Elem) or h0 (h0_dtype)
  };
  __device__ __forceinline__ Row row(int64_t m) const {
    const int64_t b = narrow ? by_T.quotient(static_cast<uint32_t>(m)) : m / T;
    if (m != b * T) return {y + (m - 1) * H, true};
    const int64_t bytes = h0_dtype == DType::f32 ? 4 : 2;
    return {h0 ? static_cast<const char*>(h0) + b * H * bytes : nullptr, false};
  }
  __device__ __forceinline__ float at(const Row& r, int64_t k) const {
    if (r.from_y) return to_float(static_cast<const Elem*>(r.p)[k]);
    return r.p ? load_state(r.p, h0_dtype, k) : 0.0f;
  }
  // Every element a bf16 value: y in bf16, h0 in bf16 or absent.
  __device__ __forceinline__ bool bf16_exact() const {
    return std::is_same_v<Elem, __nv_bfloat16> && (!h0 || h0_dtype == DType::bf16);
  }
  // Rows of bf16, or of f32 (an f32 sequence, h0 f32 or absent).
  static constexpr bool kAsyncRows =
      std::is_same_v<Elem, __nv_bfloat16> || std::is_same_v<Elem, float>;
  static constexpr bool kF32Rows = std::is_same_v<Elem, float>;
  bool async_rows() const {
    if constexpr (kF32Rows)
      return gated_rnn_f32_rows(DType::f32, y, H) && (!h0 || gated_rnn_f32_rows(h0_dtype, h0, H));
    else
      return kAsyncRows && gated_rnn_bf16_rows(DType::bf16, y, H) &&
             (!h0 || gated_rnn_bf16_rows(h0_dtype, h0, H));
  }
  __device__ __forceinline__ const void* src16(const Row& r, int64_t k) const {
    return r.p ? static_cast<const Elem*>(r.p) + k : nullptr;
  }
  // Elements k .. k + 7, each branch taken once (gated_rnn_gemm_load8).
  __device__ __forceinline__ void at8(const Row& r, int64_t k, float (&v)[8]) const {
    if (r.from_y) {
#pragma unroll
      for (int j = 0; j < 8; ++j) v[j] = to_float(static_cast<const Elem*>(r.p)[k + j]);
    } else if (r.p) {
      load_states(r.p, h0_dtype, k, v);
    } else {
#pragma unroll
      for (int j = 0; j < 8; ++j) v[j] = 0.0f;
    }
  }
};

// Step 1's operands: A = h_{t-1} [B*T, H], B = R, C = rh (+ bias).
template <class Elem>
struct GatedRnnRecomputeA {
  static constexpr bool kContiguousK = true;
  GatedRnnPrevState<Elem> h;
  using Row = typename GatedRnnPrevState<Elem>::Row;
  __device__ __forceinline__ Row row(int64_t m) const { return h.row(m); }
  __device__ __forceinline__ float at(const Row& r, int64_t k) const { return h.at(r, k); }
  __device__ __forceinline__ void at8(const Row& r, int64_t k, float (&v)[8]) const {
    h.at8(r, k, v);
  }
  __device__ __forceinline__ bool bf16_exact() const { return h.bf16_exact(); }
  static constexpr bool kAsyncRows = GatedRnnPrevState<Elem>::kAsyncRows;
  static constexpr bool kF32Rows = GatedRnnPrevState<Elem>::kF32Rows;
  bool async_rows() const { return h.async_rows(); }
  __device__ __forceinline__ const void* src16(const Row& r, int64_t k) const { return h.src16(r, k); }
};
struct GatedRnnWeightB {
  const void* R;
  DType dtype;
  int64_t N;
  using Row = int64_t;  // the row's first element
  __device__ __forceinline__ Row row(int64_t k) const { return k * N; }
  __device__ __forceinline__ float at(Row r, int64_t n) const { return load_state(R, dtype, r + n); }
  __device__ __forceinline__ void at8(Row r, int64_t n, float (&v)[8]) const {
    load_states(R, dtype, r + n, v);
  }
  __device__ __forceinline__ bool bf16_exact() const { return dtype == DType::bf16; }
  static constexpr bool kAsyncRows = true;  // bf16 weights with any sequence
  bool async_rows() const { return gated_rnn_bf16_rows(dtype, R, N); }
  __device__ __forceinline__ const void* src16(Row r, int64_t n) const {
    return static_cast<const __nv_bfloat16*>(R) + r + n;
  }
};
// rh = the product + bias, the bias a column term (gated_rnn_gemm.cuh's
// store protocol: v arrives with it added).
struct GatedRnnRecomputeStore {
  float* rh;
  const void* bias;
  DType bias_dtype;
  int64_t N;
  __device__ __forceinline__ float column_addend(int64_t n) const {
    return bias ? load_state(bias, bias_dtype, n) : 0.0f;
  }
  __device__ __forceinline__ void operator()(int, int64_t m, int64_t n, float v) const {
    rh[m * N + n] = v;
  }
  __device__ __forceinline__ bool pairs() const { return gated_rnn_elem_pairs(rh, N); }
  __device__ __forceinline__ void pair(int, int64_t m, int64_t n, float v0, float v1) const {
    VecIO<float, 2>::store(rh + m * N + n, {v0, v1});
  }
};

// Step 4's operands: A = [h_{t-1}; 1]^T [H+1, B*T] from row `first` on, B =
// grad_rh [B*T, G*H], C = grad_R (rows < H) and grad_bias (row H).
template <class Elem>
struct GatedRnnWeightGradA {
  static constexpr bool kContiguousK = false;
  GatedRnnPrevState<Elem> h;
  int64_t first;
  using Row = typename GatedRnnPrevState<Elem>::Row;
  __device__ __forceinline__ Row row(int64_t k) const { return h.row(k); }
  __device__ __forceinline__ float at(const Row& r, int64_t m) const {
    const int64_t unit = m + first;
    return unit < h.H ? h.at(r, unit) : 1.0f;
  }
  __device__ __forceinline__ void at8(const Row& r, int64_t m, float (&v)[8]) const {
    if (m + first + 8 <= h.H) {
      h.at8(r, m + first, v);
    } else {
#pragma unroll
      for (int j = 0; j < 8; ++j) v[j] = at(r, m + j);
    }
  }
  // (Row H's ones are bf16 values too.)
  __device__ __forceinline__ bool bf16_exact() const { return h.bf16_exact(); }
  static constexpr bool kAsyncRows = GatedRnnPrevState<Elem>::kAsyncRows;
  static constexpr bool kF32Rows = GatedRnnPrevState<Elem>::kF32Rows;
  bool async_rows() const { return h.async_rows() && first % (16 / sizeof(Elem)) == 0; }
  // Units m + first .. of row k, 16 bytes (the zeros past the ones are
  // rows never stored).
  __device__ __forceinline__ const void* src16(const Row& r, int64_t m) const {
    return gated_rnn_units_or_ones16<Elem>(m + first, h.H,
                                           [&](int64_t unit) { return h.src16(r, unit); });
  }
};
// An f32 B [K, N] in rows: grad_rh [B*T, G*H] (GatedRnnPlan::grad_rh_bf16
// false; the bf16 rows are gated_rnn_stack::SequenceRows), and an f32
// sequence's R [H, G*H].
struct GatedRnnF32RowsB {
  const float* rows;
  int64_t N;
  using Row = const float*;
  __device__ __forceinline__ Row row(int64_t k) const { return rows + k * N; }
  __device__ __forceinline__ float at(Row r, int64_t n) const { return r[n]; }
  __device__ __forceinline__ void at8(Row r, int64_t n, float (&v)[8]) const {
#pragma unroll
    for (int j = 0; j < 8; ++j) v[j] = r[n + j];
  }
  __device__ __forceinline__ bool bf16_exact() const { return false; }  // f32 sums
  static constexpr bool kAsyncRows = true;
  static constexpr bool kF32Rows = true;
  bool async_rows() const { return gated_rnn_f32_rows(DType::f32, rows, N); }
  __device__ __forceinline__ const void* src16(Row r, int64_t n) const { return r + n; }
};
struct GatedRnnWeightGradStore {
  void* grad_R;
  void* grad_bias;
  DType dtype;
  int64_t H, N, first;
  __device__ __forceinline__ void operator()(int, int64_t m, int64_t n, float v) const {
    const int64_t row = m + first;
    if (row < H) {
      store_state(grad_R, dtype, row * N + n, v);
    } else {
      store_state(grad_bias, dtype, n, v);
    }
  }
};

// ---------------------------------------------------------------------------
// Step 2: the gates. GRU: a thread per (b, t, unit); sLSTM: a thread per
// (b, unit) walking t; LSTM: gated_rnn_lstm_gates_kernel below.
template <class Elem, GatedRnnCell kCell>
__global__ void __launch_bounds__(kGatedRnnThreads)
    gated_rnn_gates_kernel(const GatedRnnBackwardParams p, const GatedRnnPlan plan,
                           float* __restrict__ ws) {
  constexpr int G = kGatedRnnGates<kCell>;
  const GatedRnnForwardParams& f = p.fwd;
  const int64_t B = f.shape.batch, T = f.shape.steps, H = f.shape.hidden;
  const int64_t GH = G * H;
  const Elem* __restrict__ wx = static_cast<const Elem*>(f.d_wx);
  const float* __restrict__ rh = ws + plan.ws_rh;
  float* __restrict__ gates = ws + plan.ws_gates;
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  if constexpr (kCell == GatedRnnCell::gru) {
    for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < B * T * H;
         i += stride) {
      const int64_t m = i / H, u = i - m * H;
      const float* a = rh + m * GH + u;
      const Elem* w = wx + m * GH + u;
      const float r = gated_rnn_sigmoid(to_float(w[0]) + a[0]);
      const float z = gated_rnn_sigmoid(to_float(w[H]) + a[H]);
      const float rhn = a[2 * H];
      const float n = tanhf(to_float(w[2 * H]) + r * rhn);
      float* o = gates + m * 4 * H + u;
      o[0] = r;
      o[H] = z;
      o[2 * H] = n;
      o[3 * H] = rhn;
    }
  } else if constexpr (kCell == GatedRnnCell::slstm) {
    // The pre-activations do not depend on the states: a chunk's loads are
    // issued a chunk ahead, while the chunk before it walks, and kept raw
    // (wx in its dtype, rh apart) until used, so that no conversion or sum
    // waits for them at the load. At B64 T256 H512 (LSTM bf16) the walk
    // with a chunk's loads issued just before it took 270 us, 3.5x its
    // bytes' floor, this one 216 us; at B32 T64 H256 60 and 42 us
    // (bench/RESULTS.md, issue 30 runs BY and CB).
    constexpr int kChunk = kGatedRnnGatesChunk;
    struct Chunk {
      Elem x[kChunk][4];
      float r[kChunk][4];
    };
    float* __restrict__ cs = ws + plan.ws_c;
    for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < B * H;
         i += stride) {
      const int64_t row = i / H, u = i - row * H;
      const auto load = [&](Chunk& k, int64_t t0) {
#pragma unroll
        for (int j = 0; j < kChunk; ++j)
          if (t0 + j < T) {
            const int64_t m = (row * T + t0 + j) * GH + u;
#pragma unroll
            for (int g = 0; g < 4; ++g) {
              k.x[j][g] = wx[m + g * H];
              k.r[j][g] = rh[m + g * H];
            }
          }
      };
      SlstmState st{f.d_c0 ? load_state(f.d_c0, f.state_dtype, i) : 0.0f,
                    f.d_n0 ? load_state(f.d_n0, f.state_dtype, i) : 1.0f,
                    f.d_m0 ? load_state(f.d_m0, f.state_dtype, i) : 0.0f};
      const auto walk = [&](const Chunk& k, int64_t t0) {
#pragma unroll
        for (int j = 0; j < kChunk; ++j) {
          if (t0 + j < T) {
            const int64_t m = row * T + t0 + j;
            float a[4];
#pragma unroll
            for (int g = 0; g < 4; ++g) a[g] = to_float(k.x[j][g]) + k.r[j][g];
            float* o = gates + m * 4 * H + u;
            SlstmGates g;
            (void)slstm_step(a[0], a[1], a[2], a[3], st, g);
            o[0] = g.i;
            o[H] = g.f;
            o[2 * H] = g.z;
            o[3 * H] = g.o;
            float* c = cs + m * 3 * H + u;
            c[0] = st.c;
            c[H] = st.n;
            c[2 * H] = g.share;
          }
        }
      };
      // Two chunks an iteration, each loading the next while it walks: the
      // buffers stay in registers (an index by parity would not).
      Chunk even, odd;
      load(even, 0);
      for (int64_t t0 = 0; t0 < T; t0 += 2 * kChunk) {
        load(odd, t0 + kChunk);
        walk(even, t0);
        load(even, t0 + 2 * kChunk);
        walk(odd, t0 + kChunk);
      }
    }
  }
}

// Step 2 for the LSTM. A block takes 32 consecutive (b, unit) columns, a
// lane each (a warp's loads in runs of 32 units), and the steps in windows
// of 8 W, warp w the chunk of 8 steps from 8 w. A lane forms its chunk's
// gates and, from c = 0, each step's local c and the product of f up to
// it: c_t = local_t + prod_t c_in, c_in the c before the chunk. The
// chunks' (prod, local) at their ends meet in shared memory, and each lane
// folds those before its own into its c_in, in chunk order (every lane the
// same order: bitwise reproducible, within rounding of the step-by-step
// recurrence). The window's last c starts the next window. A thread per
// column walking every step, its loads a chunk ahead, had 8192 threads at
// B32 H256 to hide 64 dependent steps' loads: 42.7 us there (LSTM bf16,
// T64), 7x its bytes' floor, and 218 us at B64 T256 H512 (f32); this
// kernel 11.7 and 135 us (bench/RESULTS.md, issue 30 run CD, ncu, one
// run).
template <class Elem>
__global__ void __launch_bounds__(kGatedRnnLstmGatesWarps * 32)
    gated_rnn_lstm_gates_kernel(const GatedRnnBackwardParams p, const GatedRnnPlan plan,
                                float* __restrict__ ws) {
  constexpr int kChunk = kGatedRnnGatesChunk;
  const GatedRnnForwardParams& f = p.fwd;
  const int64_t B = f.shape.batch, T = f.shape.steps, H = f.shape.hidden;
  const int64_t GH = 4 * H, columns = B * H;
  const Elem* __restrict__ wx = static_cast<const Elem*>(f.d_wx);
  const float* __restrict__ rh = ws + plan.ws_rh;
  float* __restrict__ gates = ws + plan.ws_gates;
  float* __restrict__ cs = ws + plan.ws_c;
  const int lane = static_cast<int>(threadIdx.x), w = static_cast<int>(threadIdx.y);
  const int W = static_cast<int>(blockDim.y);
  // Each chunk's (prod, local) at its end, by window parity: a warp writes
  // a window's after the barrier of the window before, which every warp
  // passes only once done reading the buffer it writes.
  __shared__ float2 ends[2][kGatedRnnLstmGatesWarps][32];
  int parity = 0;
  for (int64_t base = static_cast<int64_t>(blockIdx.x) * 32; base < columns;
       base += static_cast<int64_t>(gridDim.x) * 32) {
    const int64_t i = base + lane;
    const bool live = i < columns;
    const int64_t row = live ? i / H : 0, u = live ? i - row * H : 0;
    float c_in = live && f.d_c0 ? load_state(f.d_c0, f.state_dtype, i) : 0.0f;
    for (int64_t window = 0; window < T; window += kChunk * W, parity ^= 1) {
      const int64_t t0 = window + kChunk * w;
      Elem x[kChunk][4];
      float r[kChunk][4];
#pragma unroll
      for (int j = 0; j < kChunk; ++j)
        if (live && t0 + j < T) {
          const int64_t m = (row * T + t0 + j) * GH + u;
#pragma unroll
          for (int g = 0; g < 4; ++g) {
            x[j][g] = wx[m + g * H];
            r[j][g] = rh[m + g * H];
          }
        }
      float local[kChunk], prod[kChunk];
      float c = 0.0f, fp = 1.0f;
#pragma unroll
      for (int j = 0; j < kChunk; ++j) {
        if (live && t0 + j < T) {
          const int64_t m = row * T + t0 + j;
          const float ig = gated_rnn_sigmoid(to_float(x[j][0]) + r[j][0]);
          const float fg = gated_rnn_sigmoid(to_float(x[j][1]) + r[j][1]);
          const float gg = tanhf(to_float(x[j][2]) + r[j][2]);
          const float og = gated_rnn_sigmoid(to_float(x[j][3]) + r[j][3]);
          float* o = gates + m * 4 * H + u;
          o[0] = ig;
          o[H] = fg;
          o[2 * H] = gg;
          o[3 * H] = og;
          c = fmaf(fg, c, ig * gg);
          fp *= fg;
        }
        local[j] = c;
        prod[j] = fp;
      }
      ends[parity][w][lane] = make_float2(fp, c);
      __syncthreads();
      for (int k = 0; k < w; ++k) {
        const float2 e = ends[parity][k][lane];
        c_in = fmaf(e.x, c_in, e.y);
      }
#pragma unroll
      for (int j = 0; j < kChunk; ++j)
        if (live && t0 + j < T) cs[(row * T + t0 + j) * H + u] = fmaf(prod[j], c_in, local[j]);
      for (int k = w; k < W; ++k) {
        const float2 e = ends[parity][k][lane];
        c_in = fmaf(e.x, c_in, e.y);
      }
    }
  }
}

// ---------------------------------------------------------------------------
// Step 3: the persistent reverse-time walk.

// What a (row, unit) update needs besides the product, loaded before the
// block waits for grad_rh_{s+1}. grad_y_s and the GRU's h_{s-1} from y stay
// in the sequence dtype until settle(), after the wait (as
// GatedRnnForwardInputs' wx: a conversion at the load waits for it there).
template <class Elem, GatedRnnCell kCell>
struct GatedRnnBackwardInputs {
  float gy;          // grad_y_s (after settle())
  Elem gy_raw;       // grad_y_s as loaded (zero without grad_y)
  Elem prev_raw;     // GRU, s > 0: h_{s-1} as loaded from y
  float gate[4];     // GRU r, z, n, rh_n; LSTM i, f, g, o; sLSTM i', f', z, o
  float prev;        // GRU h_{s-1} (at s > 0 after settle()); LSTM and sLSTM c_{s-1}
  float prev_n;      // sLSTM n_{s-1}
  float c, n;        // LSTM c_s; sLSTM c_s, n_s
  float share;       // sLSTM: of dm_s, the part log f + m_{s-1} takes
  float carry_h;     // the direct term into dh_s (grad_h_final at s = T-1)
  SlstmState carry;  // carried into step s: LSTM dc (in .c); sLSTM dc, dn, dm
                     // (the final states' gradients at s = T-1)

  __device__ __forceinline__ void load(const GatedRnnBackwardParams& p, const GatedRnnPlan& plan,
                                       const float* ws, int64_t row, int hu, int64_t s) {
    const GatedRnnForwardParams& f = p.fwd;
    const int64_t T = f.shape.steps;
    const int H = static_cast<int>(f.shape.hidden);
    const int64_t sidx = row * H + hu;
    carry = {0.0f, 0.0f, 0.0f};
    if (s == T - 1) {
      const auto final_grad = [&](const void* g) {
        return g ? load_state(g, f.state_dtype, sidx) : 0.0f;
      };
      carry_h = final_grad(p.d_grad_h_final);
      if constexpr (kCell != GatedRnnCell::gru) carry.c = final_grad(p.d_grad_c_final);
      if constexpr (kCell == GatedRnnCell::slstm) {
        carry.n = final_grad(p.d_grad_n_final);
        carry.m = final_grad(p.d_grad_m_final);
      }
    } else {
      carry_h = ws[plan.ws_state + sidx];
      if constexpr (kCell != GatedRnnCell::gru) carry.c = ws[plan.ws_cell + sidx];
      if constexpr (kCell == GatedRnnCell::slstm) {
        const int64_t BH = f.shape.batch * H;
        carry.n = ws[plan.ws_cell + BH + sidx];
        carry.m = ws[plan.ws_cell + 2 * BH + sidx];
      }
    }
    if (s < 0) return;  // the initial states' gradients need the carries only
    const int64_t m = row * T + s;
    gy_raw = p.d_grad_y ? static_cast<const Elem*>(p.d_grad_y)[m * H + hu] : from_float<Elem>(0.0f);
    const float* gt = ws + plan.ws_gates + m * 4 * H + hu;
#pragma unroll
    for (int g = 0; g < 4; ++g) gate[g] = gt[g * H];
    prev_n = 1.0f;
    n = 1.0f;
    share = 0.0f;
    if constexpr (kCell == GatedRnnCell::gru) {
      if (s > 0)
        prev_raw = static_cast<const Elem*>(f.d_y)[(m - 1) * H + hu];
      else
        prev = f.d_h0 ? load_state(f.d_h0, f.state_dtype, sidx) : 0.0f;
      c = 0.0f;
    } else if constexpr (kCell == GatedRnnCell::lstm) {
      const float* cs = ws + plan.ws_c;
      c = cs[m * H + hu];
      prev = s > 0 ? cs[(m - 1) * H + hu]
                   : (f.d_c0 ? load_state(f.d_c0, f.state_dtype, sidx) : 0.0f);
    } else {
      const float* cs = ws + plan.ws_c + m * 3 * H + hu;  // [B, T, 3, H]: c, n, share
      c = cs[0];
      n = cs[H];
      share = cs[2 * H];
      if (s > 0) {
        prev = cs[-3 * H];
        prev_n = cs[-2 * H];
      } else {
        prev = f.d_c0 ? load_state(f.d_c0, f.state_dtype, sidx) : 0.0f;
        prev_n = f.d_n0 ? load_state(f.d_n0, f.state_dtype, sidx) : 1.0f;
      }
    }
  }
  // The values kept in the sequence dtype, as floats (step s >= 0).
  __device__ __forceinline__ void settle(int64_t s) {
    gy = to_float(gy_raw);
    if constexpr (kCell == GatedRnnCell::gru)
      if (s > 0) prev = to_float(prev_raw);
  }
};

// What a layer of the stack's reverse wavefront (gated_rnn_backward_stack.cuh)
// adds to its walk: the parts of the gradient of its y that the layer above
// hands it, and the parts it hands the layer below.
struct GatedRnnWalkStack {
  int depth = 0;                        // the rings' slots
  const uint64_t* from_above = nullptr; // [D, Su, B, H]: layer l+1's parts of grad_wx_{l+1} W_{l+1}^T
  uint64_t* to_below = nullptr;         // [D, Su, B, H]: this layer's parts of grad_wx_l W_l^T (l > 0)
  const uint64_t* below_own = nullptr;  // layer l-1's own exchange: has it read a slot?
  const float* Wi = nullptr;            // shared [C, H]: W_l's slice (l > 0)
  float* ga = nullptr;                  // shared [C, Bt]: grad_wx_s of the slice (the GRU's)
  float* parts_above = nullptr;         // shared [Su, Bt, U]: the staged parts from above
};

// One layer's reverse walk for one block (`block`, its index within the
// layer's blocks; shared memory from `smem`): the one-layer kernel's body
// and (kStack) each layer's share of the stack's reverse wavefront;
// (kTensorCores) its part product on tensor cores
// (gated_rnn_walk_tensor_cores.cuh).
template <class Elem, GatedRnnCell kCell, bool kResident, bool kStack, bool kTensorCores = false>
__device__ __forceinline__ void gated_rnn_walk(const GatedRnnBackwardParams& p,
                                               const GatedRnnPlan& plan, float* __restrict__ ws,
                                               int block, float* smem,
                                               const GatedRnnWalkStack& st) {
  static_assert(!kStack || kResident, "the stack's walk holds its slices in shared memory");
  static_assert(!kTensorCores || (kResident && !kStack),
                "the tensor-core walk: one layer, its slice resident");
  // f32 weights on tensor cores (an f32 sequence: the planner takes bf16
  // weights there with 16-bit sequences only): the slice in two bf16 arrays.
  constexpr bool kSplitWeights = kTensorCores && sizeof(Elem) == 4;
  constexpr int G = kGatedRnnGates<kCell>;
  const GatedRnnForwardParams& f = p.fwd;
  const int64_t B = f.shape.batch, T = f.shape.steps;
  const int H = static_cast<int>(f.shape.hidden);
  const int GH = G * H;
  const int U = plan.units_per_block;
  const int Su = plan.unit_slices;
  const int slice = block % Su;
  const int u0 = slice * U;
  const int live = min(U, H - u0);
  // This block's batch group: rows [g0, g1).
  const int64_t g0 = static_cast<int64_t>(block / Su) * plan.batch_rows;
  const int64_t g1 = min(B, g0 + plan.batch_rows);
  const int C = plan.stored_columns;
  const int K = H;
  const int Bt = plan.batch_tile;
  const int tid = static_cast<int>(threadIdx.x);
  const int D = st.depth;

  // Shared memory: [the slice, resident], grad_rh of the slice [C, rows]
  // (16-byte aligned: C is a multiple of 4), the slices' parts [Su, rows, U].
  // On tensor cores the slice is bf16, transposed [K16][ld]
  // (gated_rnn_load_slice_transposed), and W unused.
  float* W;
  float* gr;
  if constexpr (kTensorCores) {
    W = nullptr;
    gr = smem + gated_rnn_walk_tc_slice_floats(C, K, kSplitWeights);
  } else if constexpr (kResident) {
    W = smem;
    gr = smem + static_cast<int64_t>(C) * K;
  } else {
    W = ws + plan.ws_weights + static_cast<int64_t>(block) * C * K;
    gr = smem;
  }
  float* const parts = gr + C * Bt;
  // [2, Su, B, H]: each slice's part of grad_rh_s R^T, with its step. The
  // one-layer walk packs two batch rows a word (gated_rnn_pair_word.h: the
  // word at a tile's even row b holds rows b and b + 1, half the loads a
  // step); the stack's keeps a row a word, its 32-bit steps read by the
  // layer above's ring check.
  constexpr bool kPacked = !kStack;
  uint64_t* const xchg = reinterpret_cast<uint64_t*>(ws + plan.ws_exchange);

  if constexpr (kSplitWeights)
    gated_rnn_load_slice_transposed(reinterpret_cast<__nv_bfloat16*>(smem),
                                    static_cast<const float*>(f.d_R), G, H, U, u0, live, C);
  else if constexpr (kTensorCores)
    gated_rnn_load_slice_transposed(reinterpret_cast<__nv_bfloat16*>(smem),
                                    static_cast<const uint16_t*>(f.d_R), G, H, U, u0, live, C);
  else
    gated_rnn_load_slice(W, f.d_R, f.weight_dtype, G, H, U, u0, live, C);  // as the forward's
  // grad_y (and the GRU's y) of this block's rows and units, every step,
  // into L2 (if small enough); the gates and c were just written, and are
  // there.
  if (B * T * H * static_cast<int64_t>(sizeof(Elem)) <= kGatedRnnPrefetchBytes) {
    gated_rnn_prefetch_runs(static_cast<const Elem*>(p.d_grad_y) + g0 * T * H + u0, sizeof(Elem),
                            (g1 - g0) * T, 1, H, live);
    if (kCell == GatedRnnCell::gru)
      gated_rnn_prefetch_runs(static_cast<const Elem*>(f.d_y) + g0 * T * H + u0, sizeof(Elem),
                              (g1 - g0) * T, 1, H, live);
  }
  // s = -1 only forms grad_h0 (and hands over the other initial states').
  const int64_t last = (p.d_grad_h0 || p.d_grad_c0 || p.d_grad_n0 || p.d_grad_m0) ? -1 : 0;
  // The exchange is used when a step follows another (and in a stack,
  // always): this block's words (its slice's parts for its rows, both
  // halves; the stack's slots of its parts for the layer below) start as
  // "no step", then one grid-wide barrier.
  if (kStack || T - 1 > last) {
    const int64_t rows = g1 - g0;
    // Row by row, no 64-bit division a word: a thread marks 32 words at
    // B64 H512, where the time from the slice's load to past the barrier
    // fell from 9 to 3.5 us (runs BX and BZ).
    for (int half = 0; half < 2; ++half)
      for (int64_t row = g0; row < g1; ++row) {
        uint64_t* const w = xchg + ((half * Su + slice) * B + row) * K;
        for (int k = tid; k < K; k += kGatedRnnThreads) {
          if constexpr (kPacked)
            gated_rnn_publish_pair(w + k, 0.0f, 0.0f, gated_rnn_pair_no_step(T, half));
          else
            gated_rnn_publish(w + k, 0.0f, -1);
        }
      }
    if constexpr (kStack)
      if (st.to_below)
        for (int64_t i = tid; i < D * rows * K; i += kGatedRnnThreads) {
          const int64_t r = i / K;  // slot * rows + row - g0
          const int64_t slot = r / rows;
          gated_rnn_publish(st.to_below + ((slot * Su + slice) * B + g0 + r - slot * rows) * K +
                                (i - r * K),
                            0.0f, -1);
        }
    cooperative_groups::this_grid().sync();
  } else {
    __syncthreads();
  }

  float* const grad_rh = ws + plan.ws_rh;  // [B, T, G*H], f32 or (grad_rh_bf16) bf16
  const bool grad_rh_bf16 = std::is_same_v<Elem, __nv_bfloat16> && plan.grad_rh_bf16;
  float* const carry_h = ws + plan.ws_state;
  // LSTM dc; sLSTM [3, B, H] dc, dn, dm.
  float* const carry_cell = kCell != GatedRnnCell::gru ? ws + plan.ws_cell : nullptr;
  Elem* __restrict__ gwx = static_cast<Elem*>(p.d_grad_wx);
  Elem* __restrict__ grh_out = static_cast<Elem*>(p.d_grad_rh);

  // What the step loop would otherwise divide for on every step (about ten
  // 32-bit software divisions a thread a step at B64 H512, run CU's ncu):
  // the items' rows and units, each thread's first and its step to the
  // next, and, per tile size (a group's tiles have Bt rows but its last),
  // the staging's geometry, each kept until the tile size changes. gr's
  // (and ga's) entries that no unit fills are zeroed then too: no step
  // writes them. Out of the loop, the walks took 5 to 14% less (run CV,
  // bench/RESULTS.md, issue 30).
  const int first_b = tid / live, first_u = tid - first_b * live;
  const int skip_b = kGatedRnnThreads / live, skip_u = kGatedRnnThreads - skip_b * live;
  // Every slice's part for a tile's rows and units, staged at
  // dst[(j * nb + b) * live + u] from src [Su, B, K]: the threads sharing
  // an item (row, unit; with pair words, even row b and b + 1) take its
  // slices j = slot, slot + per_item, ... (geometry: item it0, at row b,
  // unit u, its slot and its count of slices).
  struct StageGeometry {
    int items, per_item, stride, it0, slot, count, b, u;
  };
  const auto stage_geometry = [&](int nb, int rows_per_item) {
    StageGeometry g;
    g.items = (nb + rows_per_item - 1) / rows_per_item * live;
    g.per_item = kGatedRnnThreads / g.items;  // 0: more items than threads
    g.stride = g.per_item > 1 ? g.per_item : 1;
    g.it0 = g.per_item > 0 ? tid % g.items : tid;
    g.slot = g.per_item > 0 ? tid / g.items : 0;
    g.count = (Su - g.slot + g.stride - 1) / g.stride;
    g.b = g.it0 / live * rows_per_item;
    g.u = g.it0 - g.it0 / live * live;
    return g;
  };
  int tile_nb = -1;  // the tile size the geometries below are for
  StageGeometry own_geometry{}, above_geometry{};

  for (int64_t s = T - 1; s >= last; --s) {
    const bool carried = s < T - 1;
    for (int64_t b0 = g0; b0 < g1; b0 += Bt) {
      const int nb = static_cast<int>(g1 - b0 < Bt ? g1 - b0 : Bt);
      const int rows = gated_rnn_product_rows(nb);
      const int items = nb * live;
      GatedRnnBackwardInputs<Elem, kCell> first;
      if (tid < items) first.load(p, plan, ws, b0 + first_b, u0 + first_u, s);
      if (nb != tile_nb) {
        tile_nb = nb;
        own_geometry = stage_geometry(nb, kPacked ? 2 : 1);
        if constexpr (kStack) above_geometry = stage_geometry(nb, 1);
        // rows is a power of two: column i / rows, row i % rows. (The
        // previous tile's product has read gr: the barrier ending its body.)
        const int shift = __ffs(rows) - 1;
        for (int i = tid; i < C * rows; i += kGatedRnnThreads) {
          const int c = i >> shift, b = i & (rows - 1);
          if (b >= nb || c >= G * U || c % U >= live) {
            gr[i] = 0.0f;
            if constexpr (kStack)
              if (st.to_below && kCell == GatedRnnCell::gru) st.ga[i] = 0.0f;
          }
        }
      }
      const auto stage = [&](float* dst, const uint64_t* src, int step, auto pair_words,
                             const StageGeometry& g) {
        constexpr bool kPair = decltype(pair_words)::value;
        constexpr int rows_per_item = kPair ? 2 : 1;
        int b = g.b, u = g.u;
        for (int it = g.it0; it < g.items && (g.per_item == 0 || tid < g.items * g.per_item);
             it += g.per_item > 0 ? g.items : kGatedRnnThreads) {
          if (it != g.it0) {  // more items than threads only
            b = it / live * rows_per_item;
            u = it - it / live * live;
          }
          gated_rnn_stage_strided<kTensorCores ? 16 : 8, kPair>(
              dst + (g.slot * nb + b) * live + u, g.stride * nb * live,
              src + (static_cast<int64_t>(g.slot) * B + b0 + b) * K + u0 + u,
              static_cast<int64_t>(g.stride) * B * K, g.count, step,
              kPair && b + 1 < nb ? live : 0);
        }
      };
      // The layer above's parts of the gradient of this layer's y_s.
      const bool from_above = kStack && st.from_above && s >= 0;
      if (carried)
        stage(parts, xchg + ((s + 1) & 1) * Su * B * K, static_cast<int>(s + 1),
              std::integral_constant<bool, kPacked>{}, own_geometry);
      if (from_above)
        stage(st.parts_above, st.from_above + (s & (D - 1)) * Su * B * K, static_cast<int>(s),
              std::false_type{}, above_geometry);
      if (carried || from_above) __syncthreads();
      for (int i = tid, b = first_b, u = first_u; i < items; i += kGatedRnnThreads) {
        if (i != tid) {  // the next item: kGatedRnnThreads further on
          b += skip_b;
          u += skip_u;
          if (u >= live) {
            u -= live;
            ++b;
          }
        }
        const int64_t row = b0 + b;
        const int hu = u0 + u;
        const int64_t sidx = row * H + hu;
        GatedRnnBackwardInputs<Elem, kCell> in;
        if (i == tid) {
          in = first;
        } else {
          in.load(p, plan, ws, row, hu, s);
        }
        // grad_rh_{s+1} R^T at (row, unit): the slices' parts summed in a
        // fixed order, four interleaved chains (a quarter of the latency of
        // one at Su = 128).
        const auto sum_parts = [&](const float* staged) {
          float q0 = 0.0f, q1 = 0.0f, q2 = 0.0f, q3 = 0.0f;
          const float* pj = staged + b * live + u;
          const int stride = nb * live;
          int j = 0;
          for (; j + 4 <= Su; j += 4) {
            q0 += pj[j * stride];
            q1 += pj[(j + 1) * stride];
            q2 += pj[(j + 2) * stride];
            q3 += pj[(j + 3) * stride];
          }
          for (; j < Su; ++j) q0 += pj[j * stride];
          return (q0 + q1) + (q2 + q3);
        };
        const float from_r = carried ? sum_parts(parts) : 0.0f;
        if (s < 0) {  // past the first step: the initial states' gradients
          if (p.d_grad_h0) store_state(p.d_grad_h0, f.state_dtype, sidx, from_r + in.carry_h);
          if (kCell != GatedRnnCell::gru && p.d_grad_c0)
            store_state(p.d_grad_c0, f.state_dtype, sidx, in.carry.c);
          if (kCell == GatedRnnCell::slstm && p.d_grad_n0)
            store_state(p.d_grad_n0, f.state_dtype, sidx, in.carry.n);
          if (kCell == GatedRnnCell::slstm && p.d_grad_m0)
            store_state(p.d_grad_m0, f.state_dtype, sidx, in.carry.m);
          continue;
        }
        const int64_t m = row * T + s;
        in.settle(s);
        // The stack: the gradient of y_s from the layer above joins the
        // caller's.
        const float gy = from_above ? in.gy + sum_parts(st.parts_above) : in.gy;
        const float dh = gy + from_r + in.carry_h;
        float da[G], dr[G];
        if constexpr (kCell == GatedRnnCell::gru) {
          const float r = in.gate[0], z = in.gate[1], n = in.gate[2], rhn = in.gate[3];
          const float dan = dh * (1.0f - z) * (1.0f - n * n);
          const float daz = dh * (in.prev - n) * z * (1.0f - z);
          const float dar = dan * rhn * r * (1.0f - r);
          da[0] = dar;
          da[1] = daz;
          da[2] = dan;
          dr[0] = dar;
          dr[1] = daz;
          dr[2] = dan * r;
          carry_h[sidx] = dh * z;  // read back only by this thread
        } else if constexpr (kCell == GatedRnnCell::lstm) {
          const float ig = in.gate[0], fg = in.gate[1], gg = in.gate[2], og = in.gate[3];
          const float tc = tanhf(in.c);
          const float dc = in.carry.c + dh * og * (1.0f - tc * tc);
          da[0] = dc * gg * ig * (1.0f - ig);
          da[1] = dc * in.prev * fg * (1.0f - fg);
          da[2] = dc * ig * (1.0f - gg * gg);
          da[3] = dh * tc * og * (1.0f - og);
#pragma unroll
          for (int g = 0; g < G; ++g) dr[g] = da[g];
          carry_h[sidx] = 0.0f;
          carry_cell[sidx] = dc * fg;  // read back only by this thread
        } else {
          const SlstmGates gt{in.gate[0], in.gate[1], in.gate[2], in.gate[3], in.share};
          SlstmState d = in.carry;
          slstm_step_backward(dh, gt, in.c, in.n, in.prev, in.prev_n, d, da);
#pragma unroll
          for (int g = 0; g < G; ++g) dr[g] = da[g];
          // Read back only by this thread.
          const int64_t BH = B * H;
          carry_h[sidx] = 0.0f;
          carry_cell[sidx] = d.c;
          carry_cell[BH + sidx] = d.n;
          carry_cell[2 * BH + sidx] = d.m;
        }
#pragma unroll
        for (int g = 0; g < G; ++g) {
          const int64_t at = m * GH + g * H + hu;
          if (grad_rh_bf16)
            reinterpret_cast<__nv_bfloat16*>(grad_rh)[at] = __float2bfloat16_rn(dr[g]);
          else
            grad_rh[at] = dr[g];
          gr[(g * U + u) * rows + b] = dr[g];
          if constexpr (kStack && kCell == GatedRnnCell::gru)
            if (st.to_below) st.ga[(g * U + u) * rows + b] = da[g];
          if (gwx) gwx[at] = from_float<Elem>(da[g]);
          if (grh_out) grh_out[at] = from_float<Elem>(dr[g]);
        }
      }
      // The stack: this slice's part of grad_wx_s W_l^T for the layer below
      // (the GRU's grad_wx in ga, the LSTM's is its grad_rh).
      const bool to_below = kStack && st.to_below && s >= 0;
      float* const ga = kCell == GatedRnnCell::gru ? st.ga : gr;
      if (s > last || to_below) {
        // Slot s mod D of the ring below held step s + D: has every block of
        // the layer below in this group staged it? Such a block publishes
        // its own part of step s + D only after.
        if (to_below && s + D <= T - 1 && tid < Su) {
          const uint64_t* w = st.below_own + ((((s + D) & 1) * Su + tid) * B + g0) * K;
          for (;;) {
            const int tag = static_cast<int>(static_cast<uint32_t>(gated_rnn_peek(w) >> 32));
            if (tag >= 0 && tag <= s + D) break;
          }
        }
        __syncthreads();
        if (s > last) {
          // This slice's part of grad_rh_s R^T for the tile's rows, every unit.
          uint64_t* const dst = xchg + ((s & 1) * Su + slice) * B * K;
          if constexpr (kPacked) {
            const auto publish = [&](int b, int k, float v, float next) {
              gated_rnn_publish_pair(dst + (b0 + b) * K + k, v, next, static_cast<int>(s));
            };
            if constexpr (kTensorCores)
              gated_rnn_part_product_tc<kSplitWeights>(
                  rows, gr, C, reinterpret_cast<const __nv_bfloat16*>(smem), K, nb, publish);
            else
              gated_rnn_part_product_rows<true>(rows, gr, C, W, K, nb, publish);
          } else {
            gated_rnn_part_product_rows(rows, gr, C, W, K, nb, [&](int b, int k, float v) {
              gated_rnn_publish(dst + (b0 + b) * K + k, v, static_cast<int>(s));
            });
          }
        }
        if (to_below) {
          uint64_t* const dst = st.to_below + ((s & (D - 1)) * Su + slice) * B * K;
          gated_rnn_part_product_rows(rows, ga, C, st.Wi, K, nb, [&](int b, int k, float v) {
            gated_rnn_publish(dst + (b0 + b) * K + k, v, static_cast<int>(s));
          });
        }
      }
      __syncthreads();
    }
  }
}

template <class Elem, GatedRnnCell kCell, bool kResident, bool kTensorCores = false>
__global__ void __launch_bounds__(kGatedRnnThreads, 1)
    gated_rnn_backward_kernel(const GatedRnnBackwardParams p, const GatedRnnPlan plan,
                              float* __restrict__ ws) {
  extern __shared__ float4 smem4[];
  gated_rnn_walk<Elem, kCell, kResident, false, kTensorCores>(
      p, plan, ws, static_cast<int>(blockIdx.x), reinterpret_cast<float*>(smem4), {});
}

}  // namespace exphil::kernels
