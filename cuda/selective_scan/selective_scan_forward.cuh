/*
 * Selective scan (Mamba's S6), forward, and the chunk aggregates that both
 * directions use to run long sequences in parallel.
 *
 * Algorithm. Each (batch row, channel d, state n) is an independent linear
 * recurrence h_t = exp(delta_t A[d, n]) h_{t-1} + delta_t B_t[n] x_t[d],
 * and y_t[d] sums C_t[n] h_t[d, n] over n. A thread keeps 4 states of one
 * channel in registers and walks time sequentially; the exponent is the
 * only transcendental per state and step, and nothing in the loop-carried
 * chain but one FMA, so consecutive steps overlap.
 *
 * Layout. A block is 32 channels (threadIdx.x, so every load of x, dt, z
 * and store of y for one step is one coalesced 32-wide row) x `slices`
 * warps (threadIdx.y: states 4 * slice ... + 3). N <= 64 fits one block;
 * wider N is split into state groups whose partial sums over n a finalize
 * kernel adds (selective_scan_finalize.cuh). Per tile of 16 steps the block
 * stages x, delta (dt with bias, softplus and clamp applied once per
 * element), B and C in shared memory; each warp reads one float4 of B and C
 * per step, the same address for all lanes (a broadcast). The sum over the
 * block's states goes through shared memory, in a fixed order.
 *
 * Chunks. With few channels and a long T, T is cut into chunks run in
 * parallel (grid y). An aggregate pass runs each chunk from a zero state
 * and records its end state and the sum of its deltas (the chunk's decay is
 * exp(A * sum)); a carry pass (selective_scan_carry.cuh) turns those into
 * each chunk's true start state, kept as an fp32 checkpoint; the apply pass
 * reruns each chunk from its checkpoint. The backward's aggregate pass also
 * accumulates, per state, sum_t (prod_{s <= t} a_s) C_t dy'_t: the gradient
 * a chunk sends to the state before it, which needs no state at all.
 *
 * Channel-mean input scale (kMeanScale; Edifice's forward, whose
 * discretisation scales B by the mean of delta over the channels:
 * h_t = exp(delta_t[d] A[d, n]) h_{t-1} + mean_d(delta_t) B_t[n] x_t[d]).
 * The means [B, T] come from a pass before (selective_scan_mean_delta.cuh)
 * in the workspace; each tile stages its L of them. The decay keeps each
 * channel's delta, so the chunk aggregates are unchanged. Forward only.
 *
 * Limits. N <= 256 (kSsMaxStates); any B, T, D >= 1.
 */
#pragma once

#include <cuda_runtime.h>

#include "selective_scan/selective_scan_common.cuh"

namespace exphil::kernels {

enum class SsForwardPass {
  apply,           // y, h_final
  aggregate,       // each chunk from zero: end state, sum of delta
  aggregate_grad,  // also the gradient a chunk sends to its start state
};


template <class Elem, SsForwardPass kPass, int kP, bool kMeanScale = false>
__global__ void __launch_bounds__(kSsMaxBlockThreads)
    selective_scan_forward_kernel(const SelectiveScanBackwardParams bp,
                                  const SelectiveScanPlan plan, float* ws) {
  using namespace ss;
  constexpr int L = kSsForwardTile;
  constexpr int R = kRowsPerThread<L>;
  constexpr int S = kStatesPerThread<L, kP>;
  constexpr bool kApply = kPass == SsForwardPass::apply;
  constexpr bool kGrad = kPass == SsForwardPass::aggregate_grad;
  static_assert(!(kMeanScale && kGrad), "the channel-mean input scale has no backward");
  const SelectiveScanForwardParams& p = bp.fwd;
  const SelectiveScanShape& s = p.shape;
  const Place at = locate(s, plan);
  const int slices = plan.slices;
  const int nb = kP * slices;  // states of the block

  extern __shared__ float4 smem4[];
  float* s_x = reinterpret_cast<float*>(smem4);  // [L][32]
  float* s_delta = s_x + L * kLanes;             // [L][32]
  float* s_gate = s_delta + L * kLanes;          // [L][32] silu(z); aggregate_grad: dy * silu(z)
  float* s_B = s_gate + L * kLanes;              // [L][nb]
  float* s_C = s_B + L * nb;                     // [L][nb]
  float* s_part = s_C + L * nb;                  // [L][slices][32]
  float* s_scale = s_part + L * slices * kLanes;  // [L] (kMeanScale)

  const StateCoefficients<kP> k = load_coefficients<kP>(p.d_A, at, s.states);
  const auto* x = static_cast<const Elem*>(p.d_x);
  const auto* dt = static_cast<const Elem*>(p.d_dt);
  const auto* z = static_cast<const Elem*>(p.d_z);
  const auto* dy = static_cast<const Elem*>(bp.d_grad_y);
  const float bias = p.d_dt_bias && at.channel_ok ? p.d_dt_bias[at.d] : 0.0f;
  const float skip = p.d_D && at.channel_ok ? p.d_D[at.d] : 0.0f;

  float h[kP];
#pragma unroll
  for (int q = 0; q < kP; ++q) {
    const int n = at.n0 + q;
    const bool ok = at.channel_ok && n < s.states;
    const int64_t state = (at.b * s.channels + at.d) * s.states + n;
    h[q] = 0.0f;
    if (kApply && ok) {
      if (plan.chunks > 1)
        h[q] = ws[plan.ws_carry + ((at.b * plan.chunks + at.chunk) * s.channels + at.d) * s.states + n];
      else if (p.d_h0)
        h[q] = p.d_h0[state];
    }
  }
  float delta_sum = 0.0f;
  float decay[kP], sent[kP];  // prod of a since the chunk start; gradient sent back
#pragma unroll
  for (int q = 0; q < kP; ++q) decay[q] = 1.0f, sent[q] = 0.0f;

  // The next tile's inputs, loaded while the current tile computes.
  const TileCursor<L, S> cursor(at, s, slices, nb);
  Elem r_x[R], r_dt[R], r_z[R], r_dy[R], r_B[S], r_C[S];
  auto load_tile = [&](int64_t t0) {
    const int steps = at.t_end - t0 < L ? static_cast<int>(at.t_end - t0) : L;
    load_rows(cursor, x, t0, steps, r_x);
    load_rows(cursor, dt, t0, steps, r_dt);
    if (kApply || kGrad) load_rows(cursor, z, t0, steps, r_z);
    if (kGrad) load_rows(cursor, dy, t0, steps, r_dy);
    load_states(cursor, static_cast<const Elem*>(p.d_B), t0, steps, r_B);
    if (kApply || kGrad) load_states(cursor, static_cast<const Elem*>(p.d_C), t0, steps, r_C);
  };
  if (at.t_begin < at.t_end) load_tile(at.t_begin);

  for (int64_t t0 = at.t_begin; t0 < at.t_end; t0 += L) {
    const int steps = at.t_end - t0 < L ? static_cast<int>(at.t_end - t0) : L;
    __syncthreads();  // the previous tile is consumed
#pragma unroll
    for (int j = 0; j < R; ++j) {
      const int t = at.slice + j * slices;
      if (t < L) {
        float slope;
        const int i = t * kLanes + at.lane;
        s_x[i] = to_float(r_x[j]);
        s_delta[i] =
            at.channel_ok && t < steps ? delta_of(to_float(r_dt[j]) + bias, p.delta, slope) : 0.0f;
        const float gate = z ? silu(to_float(r_z[j])) : 1.0f;
        if (kApply) s_gate[i] = gate;
        if (kGrad) s_gate[i] = to_float(r_dy[j]) * gate;
        if (kMeanScale && at.lane == 0)
          s_scale[t] = t < steps ? ws[plan.ws_input_scale + at.b * s.steps + t0 + t] : 0.0f;
      }
    }
    store_states(at, r_B, s_B);
    if (kApply || kGrad) store_states(at, r_C, s_C);
    __syncthreads();
    if (t0 + L < at.t_end) load_tile(t0 + L);

    for_steps<L>(steps, [&](int t) {
      const float delta = s_delta[t * kLanes + at.lane];
      const float dx = (kMeanScale ? s_scale[t] : delta) * s_x[t * kLanes + at.lane];
      float Bn[kP], Cn[kP] = {};
      read_states<kP>(s_B + t * nb, at.slice, Bn);
      if (kApply || kGrad) read_states<kP>(s_C + t * nb, at.slice, Cn);
      const float dyp = kGrad ? s_gate[t * kLanes + at.lane] : 0.0f;
      float y = 0.0f;
#pragma unroll
      for (int q = 0; q < kP; ++q) {
        const float a = exp2_ftz(delta * k.A2[q]);
        h[q] = fmaf(a, h[q], dx * Bn[q]);
        if (kApply) y = fmaf(Cn[q], h[q], y);
        if (kGrad) {
          decay[q] *= a;
          sent[q] = fmaf(decay[q] * Cn[q], dyp, sent[q]);
        }
      }
      if (kApply) s_part[(t * slices + at.slice) * kLanes + at.lane] = y;
      if (!kApply) delta_sum += delta;
    });

    if (kApply) {
      __syncthreads();
      // Each thread finishes the rows it staged.
#pragma unroll
      for (int j = 0; j < R; ++j) {
        const int t = at.slice + j * slices;
        if (!at.channel_ok || t >= steps) continue;
        float y = sum_slices(slices, [&](int sl) { return s_part[(t * slices + sl) * kLanes + at.lane]; });
        const int64_t off = cursor.row_offset(t0, j);
        if (plan.state_groups > 1) {
          ws[plan.ws_group_sums + at.group * s.batch * s.steps * s.channels + off] = y;
          continue;
        }
        const int i = t * kLanes + at.lane;
        y = fmaf(skip, s_x[i], y) * s_gate[i];
        static_cast<Elem*>(p.d_y)[off] = from_float<Elem>(y);
      }
    }
  }

#pragma unroll
  for (int q = 0; q < kP; ++q) {
    const int n = at.n0 + q;
    if (!at.channel_ok || n >= s.states) continue;
    if (kApply) {
      if (p.d_h_final && at.chunk == plan.chunks - 1)
        p.d_h_final[(at.b * s.channels + at.d) * s.states + n] = h[q];
    } else {
      const int64_t j = ((at.b * plan.chunks + at.chunk) * s.channels + at.d) * s.states + n;
      ws[plan.ws_carry + j] = h[q];
      if (kGrad) ws[plan.ws_carry_grad + j] = sent[q];
    }
  }
  if (!kApply && at.channel_ok && at.slice == 0 && at.group == 0)
    ws[plan.ws_delta_sum + (at.b * plan.chunks + at.chunk) * s.channels + at.d] = delta_sum;
}

}  // namespace exphil::kernels
