/*
 * Forward linear-recurrence scan: h_t = a_t * h_{t-1} + b_t over [B, T, H],
 * with (a_t, b_t) from the op's inputs (scan_ops.cuh).
 *
 * Algorithm. Each step is an affine map x -> a x + b, and maps compose
 * associatively, so time can be cut into pieces that are reduced
 * independently and stitched together with the state entering each piece.
 *
 *   thread  owns V adjacent channels and L consecutive steps of a tile. It
 *           loads its L steps (all loads issued before any use), turns them
 *           into coefficients in registers and reduces them to one map. The
 *           registers that held the loads then receive the next tile's, so
 *           memory stays busy while this tile is composed and written.
 *   block   is lanes x time_chunks threads; a tile is time_chunks * L steps.
 *           The chunk maps meet in shared memory, each thread composes the
 *           maps before its own onto the state entering the tile, replays its
 *           L steps from there in f32 and writes y. Map buffers alternate by
 *           tile, so a tile costs one barrier. The block then moves to the
 *           next tile with the composed map of the whole tile as carry, so
 *           the state never leaves registers.
 *   grid    is (B * lane_groups, segments). With one segment each block walks
 *           all of T (one launch). With more, an aggregate pass reduces every
 *           segment but the last to a map in a f32 workspace, and the apply
 *           pass starts each segment from h0 composed with the maps of the
 *           segments before it. That reads the inputs twice, so the planner
 *           uses it only when B * H is too small to fill the GPU and T is long.
 *
 * The carry is always an affine map: (1, 0) when reducing a segment, and the
 * constant map (0, h) when applying, so "the state before this chunk" is the
 * b of the composed map in both passes and one code path serves both.
 *
 * Layout. Sequence tensors [B, T, H] row-major: for fixed (b, t) the H
 * channels are contiguous, so a warp's lanes read consecutive channels and
 * every step's load is coalesced. State tensors [B, H]. Workspace: per
 * segment two planes of B * H floats (the map's a, then b).
 *
 * Limits. B * lane_groups <= 2^31 - 1 and segments <= kMaxSegments (checked
 * by scan_plan_unsupported); offsets are 64-bit, so B * T * H may exceed
 * 2^32. All state and arithmetic are f32, whatever the element type.
 */
#pragma once

#include <cstdint>

#include "common/state_io.cuh"
#include "common/vector_io.cuh"
#include "scan/scan_config.h"
#include "scan/scan_params.h"
#include "scan/scan_pass.h"
#include "scan/scan_tile.cuh"

namespace exphil::kernels {

template <class Op, class Elem, int V>
__global__ void __launch_bounds__(kScanMaxBlockThreads, kForwardMinBlocksPerSM)
    scan_forward_kernel(const ScanForwardParams p, const ScanPlan plan, const ScanPass pass,
                        float* __restrict__ workspace) {
  constexpr int L = kForwardStepsPerThread;
  constexpr int N = Op::kInputs;
  extern __shared__ float smem[];

  const int segment = blockIdx.y;
  const ScanThread th = scan_thread<V>(p.shape, plan, segment);
  const Elem* x_in[N];
#pragma unroll
  for (int i = 0; i < N; ++i) x_in[i] = static_cast<const Elem*>(p.d_inputs[i]);
  Elem* y = static_cast<Elem*>(p.d_y);

  // Carry: affine map from the state entering the segment to the state
  // before the current tile.
  float carry_a[V], carry_b[V];
  if (pass == ScanPass::aggregate) {
#pragma unroll
    for (int v = 0; v < V; ++v) { carry_a[v] = 1.0f; carry_b[v] = 0.0f; }
  } else {
    // h0 pushed through the segments before this one.
    start_carry_from<V>(th, smem, [&](float (&h)[V]) {
      load_state_or_zero<V>(th.active ? p.d_h0 : nullptr, p.h0_dtype, th.state_base, h);
      for (int j = 0; j < segment && th.active; ++j) apply_segment_map<V>(workspace, th, j, h);
    }, carry_a, carry_b);
  }

  // Two buffers of chunk maps, alternating by tile: a tile's writes can
  // only meet reads of the tile before last, which every thread finished
  // before the previous barrier, so one barrier per tile suffices.
  const int plane = th.chunks * th.lanes * V;
  const int64_t tile_steps = static_cast<int64_t>(th.chunks) * L;

  float x[N][L][V];
  auto load_tile = [&](int64_t tile) {
    const int64_t t0 = tile + static_cast<int64_t>(th.ty) * L;
#pragma unroll
    for (int i = 0; i < N; ++i) load_steps<L, V>(x_in[i], th, t0, x[i]);
  };

  if (th.t_begin < th.t_end) load_tile(th.t_begin);
  int parity = 0;
  for (int64_t tile = th.t_begin; tile < th.t_end; tile += tile_steps, parity ^= 1) {
    const int64_t t0 = tile + static_cast<int64_t>(th.ty) * L;
    float a[L][V], b[L][V];
    step_coefficients<Op, L, V>(x, th, t0, a, b);
    // x is free again: the next tile's loads go out now and land while this
    // tile is composed and written.
    if (tile + tile_steps < th.t_end) load_tile(tile + tile_steps);

    float* s_map_a = smem + parity * 2 * plane;
    float* s_map_b = s_map_a + plane;
#pragma unroll
    for (int v = 0; v < V; ++v) {
      float ma = 1.0f, mb = 0.0f;
#pragma unroll
      for (int s = 0; s < L; ++s) { mb = a[s][v] * mb + b[s][v]; ma *= a[s][v]; }
      s_map_a[th.slot + v] = ma;
      s_map_b[th.slot + v] = mb;
    }
    __syncthreads();

    // Compose the tile's chunks in time order onto the carry; the value
    // before chunk ty is this thread's starting state.
    float start[V];
    for (int j = 0; j < th.chunks; ++j) {
      const int slot = (j * th.lanes + th.tx) * V;
#pragma unroll
      for (int v = 0; v < V; ++v) {
        if (j == th.ty) start[v] = carry_b[v];
        const float ma = s_map_a[slot + v];
        carry_b[v] = ma * carry_b[v] + s_map_b[slot + v];
        carry_a[v] *= ma;
      }
    }

    if (pass == ScanPass::apply) {
#pragma unroll
      for (int s = 0; s < L; ++s) {
        const int64_t t = t0 + s;
        if (th.active && t < th.t_end) {
#pragma unroll
          for (int v = 0; v < V; ++v) start[v] = a[s][v] * start[v] + b[s][v];
          VecIO<Elem, V>::store(y + th.seq_base + t * th.width, start);
          if (t == th.steps - 1 && p.d_h_final)
            store_states<V>(p.d_h_final, p.h_final_dtype, th.state_base, start);
        }
      }
    }
  }

  if (pass == ScanPass::aggregate && th.ty == 0 && th.active)
    store_segment_map<V>(workspace, th, segment, carry_a, carry_b);
}

}  // namespace exphil::kernels
