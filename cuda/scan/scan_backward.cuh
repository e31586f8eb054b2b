/*
 * Backward linear-recurrence scan. With g_t = dL/dh_t (through every path):
 *
 *   g_{T-1} = grad_y_{T-1} + grad_h_final
 *   g_t     = grad_y_t + a_{t+1} * g_{t+1}
 *   grad_h0 = a_0 * g_0
 *
 * and the op turns (inputs_t, h_{t-1}, g_t) into the gradients of its inputs.
 * The gradient recurrence is itself affine, running backwards in time: the
 * gradient c reaching h_t from later steps maps to a_t * (grad_y_t + c), the
 * gradient reaching h_{t-1}. So the kernel is the forward scan mirrored, with
 * the same thread / block / grid decomposition (see scan_forward.cuh):
 * tiles are visited last to first, chunk maps are composed last to first,
 * and with several segments the aggregate pass reduces every segment but the
 * first, and each apply block starts from grad_h_final pulled back through
 * the segments after it.
 *
 * The states h_{t-1} are rebuilt in f32 rather than read back step by step:
 * a tile reads one row of y (the state just before the tile; h0 or zero for
 * the first tile), composes the chunks' forward maps onto it exactly as the
 * forward kernel does, and each thread replays its L steps in registers. The
 * backward therefore reads y once per tile, not once per step, and the only
 * rounding of the state it sees is y's dtype at tile boundaries.
 *
 * kStatesFromY (linear_scan without b: Edifice's :fused_linear_scan_backward
 * passes a, h0, y, grad_y only) reads every h_{t-1} from y instead (h0 at
 * t = 0), one more read of y per step, and never reads the op's last input:
 * a_t and the gradients of linear_scan do not depend on b
 * (kBackwardWithoutLastInput in scan_ops.cuh). The states are then y as
 * stored, in its dtype, as in Edifice's own backward.
 *
 * Per tile a thread publishes one product of its a_t (the forward map and
 * the gradient map share it) and both maps' offsets, in buffers that
 * alternate by tile, so a tile costs one barrier; and it loads the earlier
 * tile before composing this one, so memory stays busy throughout.
 *
 * Reads: inputs, grad_y, 1/tile of y. Writes: the input gradients, grad_h0.
 * No atomics: every output element has one writer and every sum has a fixed
 * order, so results are bitwise reproducible.
 *
 * Layout and limits as in scan_forward.cuh.
 */
#pragma once

#include <cstdint>

#include "common/state_io.cuh"
#include "common/vector_io.cuh"
#include "scan/scan_config.h"
#include "scan/scan_ops.cuh"
#include "scan/scan_params.h"
#include "scan/scan_pass.h"
#include "scan/scan_tile.cuh"

namespace exphil::kernels {

template <class Op, class Elem, int V, bool kStatesFromY>
__global__ void __launch_bounds__(kScanMaxBlockThreads, kBackwardMinBlocksPerSM)
    scan_backward_kernel(const ScanBackwardParams p, const ScanPlan plan, const ScanPass pass,
                         float* __restrict__ workspace) {
  constexpr int L = kBackwardStepsPerThread;
  constexpr int N = Op::kInputs;
  static_assert(!kStatesFromY || kBackwardWithoutLastInput<Op>,
                "only an op whose a_t and gradients ignore its last input reads states from y");
  constexpr int kLoadedInputs = kStatesFromY ? N - 1 : N;
  extern __shared__ float smem[];

  // The aggregate pass covers segments 1 .. segments-1 (segment 0's map is
  // never needed: nothing comes before it).
  const int segment = blockIdx.y + (pass == ScanPass::aggregate ? 1 : 0);
  const ScanThread th = scan_thread<V>(p.shape, plan, segment);
  const Elem* x_in[N];
#pragma unroll
  for (int i = 0; i < N; ++i) x_in[i] = static_cast<const Elem*>(p.d_inputs[i]);
  const Elem* y = static_cast<const Elem*>(p.d_y);
  const Elem* grad_y = static_cast<const Elem*>(p.d_grad_y);
  Elem* grad_x[N];
#pragma unroll
  for (int i = 0; i < N; ++i) grad_x[i] = static_cast<Elem*>(p.d_grad_inputs[i]);

  // Carry: affine map from the gradient reaching the segment's last state
  // from beyond it, to the gradient reaching the state before the current
  // tile.
  float carry_a[V], carry_b[V];
  if (pass == ScanPass::aggregate) {
#pragma unroll
    for (int v = 0; v < V; ++v) { carry_a[v] = 1.0f; carry_b[v] = 0.0f; }
  } else {
    // grad_h_final enters after the last step; every segment but the last
    // sees it pulled back through the segments after it.
    start_carry_from<V>(th, smem, [&](float (&c)[V]) {
      load_state_or_zero<V>(th.active ? p.d_grad_h_final : nullptr, p.grad_h_final_dtype,
                            th.state_base, c);
      for (int j = static_cast<int>(gridDim.y) - 1; j > segment && th.active; --j)
        apply_segment_map<V>(workspace, th, j, c);
    }, carry_a, carry_b);
  }

  // Per tile every thread publishes three planes: the product of its a_t
  // (shared by the forward map and the gradient map), the forward map's b
  // and the gradient map's b. Buffers alternate by tile: one barrier a tile.
  const int plane = th.chunks * th.lanes * V;
  const int64_t tile_steps = static_cast<int64_t>(th.chunks) * L;
  const int64_t tiles = (th.t_end - th.t_begin + tile_steps - 1) / tile_steps;
  const bool rebuild_states = !kStatesFromY && pass == ScanPass::apply;
  const bool read_states = kStatesFromY && pass == ScanPass::apply;

  // One tile's loads: the op inputs and grad_y of this thread's steps, and
  // either the state just before the tile (y of the step before, or h0) or,
  // with kStatesFromY, the state before each of its steps.
  auto load_tile = [&](int64_t tile, float (&xs)[N][L][V], float (&gys)[L][V], float (&before)[V],
                       float (&states)[L][V]) {
    const int64_t t0 = tile + static_cast<int64_t>(th.ty) * L;
#pragma unroll
    for (int i = 0; i < N; ++i) {
      if (i < kLoadedInputs) {
        load_steps<L, V>(x_in[i], th, t0, xs[i]);
      } else {
#pragma unroll
        for (int s = 0; s < L; ++s)
#pragma unroll
          for (int v = 0; v < V; ++v) xs[i][s][v] = 0.0f;
      }
    }
    load_steps<L, V>(grad_y, th, t0, gys);
#pragma unroll
    for (int v = 0; v < V; ++v) before[v] = 0.0f;
    if (read_states) {
#pragma unroll
      for (int s = 0; s < L; ++s) {
        const int64_t t = t0 + s;
#pragma unroll
        for (int v = 0; v < V; ++v) states[s][v] = 0.0f;
        if (!th.active || t >= th.t_end) continue;
        if (t == 0)
          load_state_or_zero<V>(p.d_h0, p.h0_dtype, th.state_base, states[s]);
        else
          VecIO<Elem, V>::load(y + th.seq_base + (t - 1) * th.width, states[s]);
      }
    }
    if (!rebuild_states || !th.active) return;
    if (tile == 0)
      load_state_or_zero<V>(p.d_h0, p.h0_dtype, th.state_base, before);
    else
      VecIO<Elem, V>::load(y + th.seq_base + (tile - 1) * th.width, before);
  };

  float x[N][L][V], gy[L][V], y_before[V], h_read[L][V];
  if (tiles > 0) load_tile(th.t_begin + (tiles - 1) * tile_steps, x, gy, y_before, h_read);
  int parity = 0;
  for (int64_t k = tiles - 1; k >= 0; --k, parity ^= 1) {
    const int64_t tile = th.t_begin + k * tile_steps;
    const int64_t t0 = tile + static_cast<int64_t>(th.ty) * L;
    float a[L][V], b[L][V];
    step_coefficients<Op, L, V>(x, th, t0, a, b);

    // This chunk's maps. Forward: h -> A h + Bf over its steps in time
    // order. Gradient, last step first: c -> a_t (grad_y_t + c), i.e.
    // c -> A c + Bg with the same A.
    float* s_prod = smem + parity * 3 * plane;
    float* s_fwd = s_prod + plane;
    float* s_grad = s_fwd + plane;
#pragma unroll
    for (int v = 0; v < V; ++v) {
      float prod = 1.0f, fwd = 0.0f, grad = 0.0f;
#pragma unroll
      for (int s = 0; s < L; ++s) { fwd = a[s][v] * fwd + b[s][v]; prod *= a[s][v]; }
#pragma unroll
      for (int s = L - 1; s >= 0; --s) grad = a[s][v] * (gy[s][v] + grad);
      s_prod[th.slot + v] = prod;
      s_fwd[th.slot + v] = fwd;
      s_grad[th.slot + v] = grad;
    }

    // The earlier tile's loads go out now and land while this one is
    // composed and its gradients written.
    float x_next[N][L][V], gy_next[L][V], y_before_next[V], h_read_next[L][V];
    if (k > 0) load_tile(tile - tile_steps, x_next, gy_next, y_before_next, h_read_next);
    __syncthreads();

    // Forward states: compose the chunks before ty onto the state before
    // the tile, then replay this chunk: h_prev[s] = h_{t0+s-1}; or the
    // states read from y.
    float h_prev[L][V];
    if (read_states) {
#pragma unroll
      for (int s = 0; s < L; ++s)
#pragma unroll
        for (int v = 0; v < V; ++v) h_prev[s][v] = h_read[s][v];
    }
    if (rebuild_states) {
      float h[V];
#pragma unroll
      for (int v = 0; v < V; ++v) h[v] = y_before[v];
      for (int j = 0; j < th.ty; ++j) {
        const int slot = (j * th.lanes + th.tx) * V;
#pragma unroll
        for (int v = 0; v < V; ++v) h[v] = s_prod[slot + v] * h[v] + s_fwd[slot + v];
      }
#pragma unroll
      for (int s = 0; s < L; ++s) {
#pragma unroll
        for (int v = 0; v < V; ++v) {
          h_prev[s][v] = h[v];
          h[v] = a[s][v] * h[v] + b[s][v];
        }
      }
    }

    // Gradients: compose the chunks last to first onto the carry; the value
    // before chunk ty is the gradient reaching this chunk's last state.
    float c[V];
    for (int j = th.chunks - 1; j >= 0; --j) {
      const int slot = (j * th.lanes + th.tx) * V;
#pragma unroll
      for (int v = 0; v < V; ++v) {
        if (j == th.ty) c[v] = carry_b[v];
        const float prod = s_prod[slot + v];
        carry_b[v] = prod * carry_b[v] + s_grad[slot + v];
        carry_a[v] *= prod;
      }
    }

    if (pass == ScanPass::apply) {
#pragma unroll
      for (int s = L - 1; s >= 0; --s) {
        const int64_t t = t0 + s;
        if (th.active && t < th.t_end) {
          float dx[N][V];
#pragma unroll
          for (int v = 0; v < V; ++v) {
            const float g = gy[s][v] + c[v];
            float xv[N], dxv[N];
#pragma unroll
            for (int i = 0; i < N; ++i) xv[i] = x[i][s][v];
            Op::input_gradients(xv, h_prev[s][v], g, dxv);
#pragma unroll
            for (int i = 0; i < N; ++i) dx[i][v] = dxv[i];
            c[v] = a[s][v] * g;
          }
#pragma unroll
          for (int i = 0; i < N; ++i) VecIO<Elem, V>::store(grad_x[i] + th.seq_base + t * th.width, dx[i]);
        }
      }
      if (t0 == 0 && th.active && p.d_grad_h0)
        store_states<V>(p.d_grad_h0, p.grad_h0_dtype, th.state_base, c);
    }

    if (k > 0) {
#pragma unroll
      for (int s = 0; s < L; ++s) {
#pragma unroll
        for (int v = 0; v < V; ++v) {
#pragma unroll
          for (int i = 0; i < N; ++i) x[i][s][v] = x_next[i][s][v];
          gy[s][v] = gy_next[s][v];
          h_read[s][v] = h_read_next[s][v];
        }
      }
#pragma unroll
      for (int v = 0; v < V; ++v) y_before[v] = y_before_next[v];
    }
  }

  if (pass == ScanPass::aggregate && th.ty == 0 && th.active)
    store_segment_map<V>(workspace, th, segment, carry_a, carry_b);
}

}  // namespace exphil::kernels
