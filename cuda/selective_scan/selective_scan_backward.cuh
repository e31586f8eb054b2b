/*
 * Selective scan, backward: one pass over each chunk in reverse, from fp32
 * checkpoints, with every sum taken in a fixed order.
 *
 * Algorithm. With a_t = exp(delta_t A) and g_t = dL/dh_t (which includes
 * C_t dy'_t, dy' = dy * silu(z)), reverse time gives
 *   g_{t-1} = a_t g_t + C_{t-1} dy'_{t-1},   dC_t += dy'_t h_t,
 *   dB_t += g_t delta_t x_t,   dx_t += g_t delta_t B_t,
 *   d delta_t += g_t (B_t x_t + A a_t h_{t-1}),   dA += g_t a_t h_{t-1} delta_t,
 * summed over n for dx and d delta, over channels for dB and dC, and over
 * batch and time for dA. Reverse order needs h_{t-1}, which this kernel
 * recomputes: a first sweep over the chunk stores the state at the start of
 * each 16-step stage in shared memory; then, stage by stage from the end,
 * it reruns each 8-step half of the stage, the later first, keeping every
 * step's h_{t-1} in registers (the loops are fully unrolled; h_t is the next
 * step's h_{t-1}, and the decay a_t is recomputed, which costs less than
 * its registers), and walks that half backward. Memory: one fp32 state per
 * stage in shared memory, one per chunk in global memory (the carry pass's
 * checkpoints), never one per step.
 *
 * Layout as the forward (selective_scan_forward.cuh). Sums over the block's
 * states (dx, d delta, and y' for dz) go through shared memory; dB and dC,
 * four states x 32 channels per warp and step, are summed over the lanes by
 * a reduce-scatter of shuffles (8 values in 9 shuffles), and the per-block
 * results go to a workspace that selective_scan_reduce_kernel sums over
 * channel blocks, as it sums dA, dD and d dt_bias over batch and chunks:
 * no atomics, so the results are bitwise reproducible.
 *
 * Limits as the forward; the chunk length is bounded by the tile
 * checkpoints (kSsCheckpointBytes).
 */
#pragma once

#include <cuda_runtime.h>

#include "selective_scan/selective_scan_common.cuh"

namespace exphil::kernels {

namespace ss {

// Sums v[0..8) over the 32 lanes of a warp: afterwards lane l holds the sum
// of v[4 * bit4(l) + 2 * bit3(l) + bit2(l)] (replicated over bits 0 and 1).
// Each halving stage trades the half a lane does not keep.
__device__ __forceinline__ float reduce_scatter8(float v[8], int lane) {
  constexpr unsigned kAll = 0xffffffffu;
  const bool up16 = lane & 16, up8 = lane & 8, up4 = lane & 4;
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const float keep = up16 ? v[i + 4] : v[i];
    const float send = up16 ? v[i] : v[i + 4];
    v[i] = keep + __shfl_xor_sync(kAll, send, 16);
  }
#pragma unroll
  for (int i = 0; i < 2; ++i) {
    const float keep = up8 ? v[i + 2] : v[i];
    const float send = up8 ? v[i] : v[i + 2];
    v[i] = keep + __shfl_xor_sync(kAll, send, 8);
  }
  float r = (up4 ? v[1] : v[0]) + __shfl_xor_sync(kAll, up4 ? v[0] : v[1], 4);
  r += __shfl_xor_sync(kAll, r, 2);
  r += __shfl_xor_sync(kAll, r, 1);
  return r;
}

// The per-element end of the backward, once the sums over n are known:
// writes dx, d dt and dz of one (b, t, d) and returns dy' * x and d dt for
// the sums of dD and d dt_bias. dyp = dy * silu(z) (dy without z), zgrad =
// dy * silu'(z) (0 without z), slope = d delta / d dt.
template <class Elem>
__device__ __forceinline__ void finish_element(const SelectiveScanBackwardParams& bp, int64_t off,
                                               float x, float slope, float dyp, float zgrad,
                                               float skip, float y_states, float dx_states,
                                               float ddelta_states, float& dD_term,
                                               float& dbias_term) {
  if (bp.d_grad_z)
    static_cast<Elem*>(bp.d_grad_z)[off] = from_float<Elem>(zgrad * fmaf(skip, x, y_states));
  if (bp.d_grad_x) static_cast<Elem*>(bp.d_grad_x)[off] = from_float<Elem>(fmaf(dyp, skip, dx_states));
  const float ddt = slope * ddelta_states;
  if (bp.d_grad_dt) static_cast<Elem*>(bp.d_grad_dt)[off] = from_float<Elem>(ddt);
  dD_term = dyp * x;
  dbias_term = ddt;
}

}  // namespace ss

template <class Elem>
__global__ void __launch_bounds__(kSsMaxBlockThreads)
    selective_scan_backward_kernel(const SelectiveScanBackwardParams bp,
                                   const SelectiveScanPlan plan, float* ws) {
  using namespace ss;
  constexpr int L = kSsBackwardStage;  // steps staged at once
  constexpr int K = kSsBackwardTile;   // steps whose history is in registers
  constexpr int R = kRowsPerThread<L>;
  constexpr int RK = kRowsPerThread<K>;
  constexpr int S = kStatesPerThread<L>;
  constexpr int SK = kStatesPerThread<K>;
  const SelectiveScanForwardParams& p = bp.fwd;
  const SelectiveScanShape& s = p.shape;
  const Place at = locate(s, plan);
  const int nb = P * plan.slices;
  const int slices = plan.slices;

  extern __shared__ float4 smem4[];
  float* s_x = reinterpret_cast<float*>(smem4);  // [L][32]
  float* s_delta = s_x + L * kLanes;             // [L][32]
  float* s_slope = s_delta + L * kLanes;         // [L][32] d delta / d dt
  float* s_dyp = s_slope + L * kLanes;           // [L][32] dy * silu(z)
  float* s_zgrad = s_dyp + L * kLanes;           // [L][32] dy * silu'(z)
  float* s_B = s_zgrad + L * kLanes;             // [L][nb]
  float* s_C = s_B + L * nb;                     // [L][nb]
  float* s_dB = s_C + L * nb;                    // [K][nb] block sums
  float* s_dC = s_dB + K * nb;                   // [K][nb]
  const bool need_y = p.d_z && bp.d_grad_z;
  float* s_dx = s_dC + K * nb;                   // [K][slices][32]
  float* s_dd = s_dx + K * slices * kLanes;      // [K][slices][32]
  float* s_acc = s_dd + K * slices * kLanes;     // [2][slices][32]
  float* s_y = s_acc + 2 * slices * kLanes;      // [K][slices][32] sums of C h, if need_y
  float4* s_ckpt = reinterpret_cast<float4*>(s_y + (need_y ? K * slices * kLanes : 0));
  // ^ [stages][threads]

  const StateCoefficients<> k = load_coefficients(p.d_A, at, s.states);
  const auto* x = static_cast<const Elem*>(p.d_x);
  const auto* dt = static_cast<const Elem*>(p.d_dt);
  const auto* z = static_cast<const Elem*>(p.d_z);
  const auto* dy = static_cast<const Elem*>(bp.d_grad_y);
  const bool one_group = plan.state_groups == 1;
  const float bias = p.d_dt_bias && at.channel_ok ? p.d_dt_bias[at.d] : 0.0f;
  const float skip = p.d_D && at.channel_ok ? p.d_D[at.d] : 0.0f;

  float h[P], g[P], dA[P];
#pragma unroll
  for (int q = 0; q < P; ++q) {
    const int n = at.n0 + q;
    const bool ok = at.channel_ok && n < s.states;
    const int64_t state = (at.b * s.channels + at.d) * s.states + n;
    const int64_t chunk_state = ((at.b * plan.chunks + at.chunk) * s.channels + at.d) * s.states + n;
    h[q] = g[q] = dA[q] = 0.0f;
    if (!ok) continue;
    if (plan.chunks > 1) {
      h[q] = ws[plan.ws_carry + chunk_state];
      g[q] = ws[plan.ws_carry_grad + chunk_state];
    } else {
      if (p.d_h0) h[q] = p.d_h0[state];
      if (bp.d_grad_h_final) g[q] = bp.d_grad_h_final[state];
    }
  }

  const TileCursor<L, S> cursor(at, s, slices, nb);
  // Where this thread's share of a sub-tile's dB and dC goes in the
  // workspace: [2][channel groups][B, T, N], so that the reduction reads
  // each group's part of a row in one coalesced sweep.
  const int64_t proj_plane = s.batch * s.steps * plan.channel_groups * s.states;
  int64_t proj0[SK];
  int proj_t[SK];
#pragma unroll
  for (int j = 0; j < SK; ++j) {
    const int i = at.tid + j * at.threads;
    const int t = i / nb, n = at.n_block + i % nb;
    proj_t[j] = n < s.states ? t : K;
    proj0[j] = ((at.d0 / kLanes) * s.batch * s.steps + at.b * s.steps + t) * s.states + n;
  }

  // One stage's inputs in registers, loaded while the previous stage
  // computes (its loads are in flight across the compute), then written to
  // shared memory as x, delta (and its slope), B and, for the full stage,
  // dy', the gate's gradient factor and C.
  struct StageInputs {
    Elem x[R], dt[R], dy[R], z[R], B[S], C[S];
  };
  auto load_stage = [&](int64_t t0, bool full, StageInputs& in) {
    const int steps = at.t_end - t0 < L ? static_cast<int>(at.t_end - t0) : L;
    load_rows(cursor, x, t0, steps, in.x);
    load_rows(cursor, dt, t0, steps, in.dt);
    load_states(cursor, static_cast<const Elem*>(p.d_B), t0, steps, in.B);
    if (full) {
      load_rows(cursor, dy, t0, steps, in.dy);
      load_rows(cursor, z, t0, steps, in.z);
      load_states(cursor, static_cast<const Elem*>(p.d_C), t0, steps, in.C);
    }
  };
  auto store_stage = [&](int steps, bool full, const StageInputs& in) {
#pragma unroll
    for (int j = 0; j < R; ++j) {
      const int t = cursor.row_step(j);
      if (t >= L) continue;
      const int i = t * kLanes + at.lane;
      float slope = 0.0f;
      s_x[i] = to_float(in.x[j]);
      s_delta[i] = cursor.row_valid(j, steps)
                       ? delta_of(to_float(in.dt[j]) + bias, p.delta, slope)
                       : 0.0f;
      s_slope[i] = slope;
      if (full) {
        const float dyv = to_float(in.dy[j]), zv = to_float(in.z[j]);
        s_dyp[i] = z ? dyv * silu(zv) : dyv;
        s_zgrad[i] = z ? dyv * silu_grad(zv) : 0.0f;
      }
    }
    store_states(at, in.B, s_B);
    if (full) store_states(at, in.C, s_C);
  };
  auto load_row = [&](const float* src, int t) {
    return reinterpret_cast<const float4*>(src + t * nb)[at.slice];
  };
  // One step forward from hs, staged row t.
  auto advance = [&](float (&hs)[P], int t) {
    const float delta = s_delta[t * kLanes + at.lane];
    const float dx = delta * s_x[t * kLanes + at.lane];
    const float4 b4 = load_row(s_B, t);
    const float Bn[P] = {b4.x, b4.y, b4.z, b4.w};
#pragma unroll
    for (int q = 0; q < P; ++q) hs[q] = fmaf(exp2_ftz(delta * k.A2[q]), hs[q], dx * Bn[q]);
  };

  // Sweep 1: the state at the start of every stage of the chunk.
  const int stages = static_cast<int>((at.t_end - at.t_begin + L - 1) / L);
  StageInputs next;
  if (stages > 0) load_stage(at.t_begin, false, next);
  for (int st = 0; st < stages; ++st) {
    const int64_t t0 = at.t_begin + static_cast<int64_t>(st) * L;
    const int steps = at.t_end - t0 < L ? static_cast<int>(at.t_end - t0) : L;
    s_ckpt[st * at.threads + at.tid] = make_float4(h[0], h[1], h[2], h[3]);
    __syncthreads();
    store_stage(steps, false, next);
    __syncthreads();
    if (st + 1 < stages) load_stage(t0 + L, false, next);
    for_steps<L>(steps, [&](int t) { advance(h, t); });
  }

  // Sweep 2: stages from the end, each as two register sub-tiles of K
  // steps, the later one first.
  float dD_sum = 0.0f, dbias_sum = 0.0f;
  if (stages > 0) load_stage(at.t_begin + static_cast<int64_t>(stages - 1) * L, true, next);
  for (int st = stages - 1; st >= 0; --st) {
    const int64_t t0 = at.t_begin + static_cast<int64_t>(st) * L;
    const int steps = at.t_end - t0 < L ? static_cast<int>(at.t_end - t0) : L;
    __syncthreads();
    store_stage(steps, true, next);
    __syncthreads();
    if (st > 0) load_stage(t0 - L, true, next);

    for (int sub = (steps - 1) / K; sub >= 0; --sub) {
      const int base = sub * K;  // first staged row of the sub-tile
      const int sub_steps = steps - base < K ? steps - base : K;
      const float4 start = s_ckpt[st * at.threads + at.tid];
      float hs[P] = {start.x, start.y, start.z, start.w};
      // The later sub-tile starts where the earlier one ends.
      if (sub == 1) for_steps<K>(K, [&](int t) { advance(hs, t); });

      // Rerun the sub-tile: h_{t-1} of every step.
      float h_prev[K][P];
      for_steps<K>(sub_steps, [&](int t) {
        const int r = base + t;
        const float delta = s_delta[r * kLanes + at.lane];
        const float dx = delta * s_x[r * kLanes + at.lane];
        const float4 b4 = load_row(s_B, r), c4 = load_row(s_C, r);
        const float Bn[P] = {b4.x, b4.y, b4.z, b4.w};
        const float Cn[P] = {c4.x, c4.y, c4.z, c4.w};
        float y = 0.0f;
#pragma unroll
        for (int q = 0; q < P; ++q) {
          h_prev[t][q] = hs[q];
          hs[q] = fmaf(exp2_ftz(delta * k.A2[q]), hs[q], dx * Bn[q]);
          y = fmaf(Cn[q], hs[q], y);
        }
        if (need_y) s_y[(t * slices + at.slice) * kLanes + at.lane] = y;
      });

      // Walk it backward. h_t is the next step's h_{t-1}, or, for the
      // sub-tile's last step, where the rerun ended (hs).
      for_steps<K, true>(sub_steps, [&](int t) {
        const int r = base + t;
        const float delta = s_delta[r * kLanes + at.lane];
        const float xv = s_x[r * kLanes + at.lane];
        const float dyp = s_dyp[r * kLanes + at.lane];
        const float4 b4 = load_row(s_B, r), c4 = load_row(s_C, r);
        const float Bn[P] = {b4.x, b4.y, b4.z, b4.w};
        const float Cn[P] = {c4.x, c4.y, c4.z, c4.w};
        float sums[8];  // dB of the 4 states, then dC
        // gB = sum_n g B: times delta it is dx, times x the input term of
        // d delta.
        const float dx_t = delta * xv;
        const bool last = t + 1 >= sub_steps;
        const int next = t + 1 < K ? t + 1 : K - 1;
        float gB = 0.0f, ddelta = 0.0f;
#pragma unroll
        for (int q = 0; q < P; ++q) {
          // The decay again rather than kept: its registers hold the next
          // stage's loads instead.
          const float a = exp2_ftz(delta * k.A2[q]);
          const float ht = last ? hs[q] : h_prev[next][q];
          g[q] = fmaf(dyp, Cn[q], g[q]);
          sums[q] = g[q] * dx_t;
          sums[P + q] = dyp * ht;
          gB = fmaf(g[q], Bn[q], gB);
          const float ga = g[q] * a;
          const float gah = ga * h_prev[t][q];
          ddelta = fmaf(gah, k.A[q], ddelta);
          dA[q] = fmaf(gah, delta, dA[q]);
          g[q] = ga;
        }
        ddelta = fmaf(gB, xv, ddelta);
        s_dx[(t * slices + at.slice) * kLanes + at.lane] = gB * delta;
        s_dd[(t * slices + at.slice) * kLanes + at.lane] = ddelta;
        const float sum = reduce_scatter8(sums, at.lane);
        if ((at.lane & 3) == 0) {
          const int v = at.lane >> 2;  // 4 * bit4 + 2 * bit3 + bit2
          (v < P ? s_dB : s_dC)[t * nb + P * at.slice + (v & 3)] = sum;
        }
      });
      __syncthreads();

      // Each thread finishes rows slice + j * slices of the sub-tile.
      const int64_t sub_t0 = t0 + base;
#pragma unroll
      for (int j = 0; j < RK; ++j) {
        const int t = cursor.row_step(j);
        if (!cursor.row_valid(j, sub_steps)) continue;
        // The sums over the block's states, in slice order.
        float y = 0.0f, dx = 0.0f, dd = 0.0f;
        for_slices(slices, [&](int sl) {
          const int e = (t * slices + sl) * kLanes + at.lane;
          if (need_y) y += s_y[e];
          dx += s_dx[e];
          dd += s_dd[e];
        });
        const int64_t off = cursor.row_offset(sub_t0, j);
        if (!one_group) {
          const int64_t plane = s.batch * s.steps * s.channels;
          float* sums = ws + plan.ws_group_sums + at.group * plane;
          sums[off] = y;
          sums[plan.state_groups * plane + off] = dx;
          sums[2 * plan.state_groups * plane + off] = dd;
          continue;
        }
        const int i = (base + t) * kLanes + at.lane;
        float dD_term, dbias_term;
        finish_element<Elem>(bp, off, s_x[i], s_slope[i], s_dyp[i], s_zgrad[i], skip, y, dx, dd,
                             dD_term, dbias_term);
        dD_sum += dD_term;
        dbias_sum += dbias_term;
      }
      if (bp.d_grad_B || bp.d_grad_C) {
        const int64_t shift = sub_t0 * s.states;
#pragma unroll
        for (int j = 0; j < SK; ++j) {
          if (proj_t[j] >= sub_steps) continue;
          const int i = at.tid + j * at.threads;
          ws[plan.ws_proj + proj0[j] + shift] = s_dB[i];
          ws[plan.ws_proj + proj_plane + proj0[j] + shift] = s_dC[i];
        }
      }
      __syncthreads();  // the sub-tile's sums are consumed
    }
  }

  // Per-chunk parts of dA, dD and d dt_bias; dh0 from the first chunk.
  const int64_t part = ((at.b * plan.chunks + at.chunk) * s.channels + at.d) * (s.states + 2);
#pragma unroll
  for (int q = 0; q < P; ++q) {
    const int n = at.n0 + q;
    if (!at.channel_ok || n >= s.states) continue;
    ws[plan.ws_params + part + n] = dA[q];
    if (bp.d_grad_h0 && at.chunk == 0)
      bp.d_grad_h0[(at.b * s.channels + at.d) * s.states + n] = g[q];
  }
  if (one_group) {
    // Each thread summed the rows of its own lane; add the slices in order.
    s_acc[at.slice * kLanes + at.lane] = dD_sum;
    s_acc[(slices + at.slice) * kLanes + at.lane] = dbias_sum;
    __syncthreads();
    if (at.slice == 0 && at.channel_ok) {
      const float dD = sum_slices(slices, [&](int sl) { return s_acc[sl * kLanes + at.lane]; });
      const float dbias =
          sum_slices(slices, [&](int sl) { return s_acc[(slices + sl) * kLanes + at.lane]; });
      ws[plan.ws_params + part + s.states] = dD;
      ws[plan.ws_params + part + s.states + 1] = dbias;
    }
  }
}

}  // namespace exphil::kernels
