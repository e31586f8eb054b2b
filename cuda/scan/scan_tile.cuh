// The pieces the forward and backward scan kernels share: where a thread
// works, loading its steps of a tile, turning them into coefficients, and
// the per-segment maps in the workspace. See scan_forward.cuh for the
// decomposition these serve.
#pragma once

#include <cstdint>

#include "common/vector_io.cuh"
#include "scan/scan_params.h"

namespace exphil::kernels {

// One thread's place in the problem. Block (lanes, chunks) = (blockDim.x,
// blockDim.y); blockIdx.x enumerates (batch row, group of lanes); the segment
// is chosen by the kernel (blockIdx.y, shifted for the backward's aggregate
// pass).
struct ScanThread {
  int lanes, chunks;   // block shape
  int tx, ty;          // lane across the width, chunk along time
  int slot;            // this thread's element offset in a map plane (x V)
  int64_t steps;       // T
  int64_t width;       // H
  int64_t batch_width; // B * H, the size of one workspace plane
  bool active;         // its first channel is inside H
  int64_t t_begin, t_end;  // the segment's steps
  int64_t seq_base;    // offset of element (b, 0, h) of a [B, T, H] tensor
  int64_t state_base;  // offset of element (b, h) of a [B, H] tensor
};

template <int V>
__device__ __forceinline__ ScanThread scan_thread(const ScanShape& shape, const ScanPlan& plan,
                                                  int segment) {
  ScanThread t;
  t.lanes = blockDim.x;
  t.chunks = blockDim.y;
  t.tx = threadIdx.x;
  t.ty = threadIdx.y;
  t.slot = (t.ty * t.lanes + t.tx) * V;
  t.steps = shape.steps;
  t.width = shape.width;
  t.batch_width = shape.batch * shape.width;
  const int64_t batch = blockIdx.x / plan.lane_groups;
  const int64_t h = ((blockIdx.x % plan.lane_groups) * t.lanes + t.tx) * V;
  // With V > 1 the planner guarantees H % V == 0, so h < H covers all V.
  t.active = h < shape.width;
  t.t_begin = segment * plan.segment_steps;
  t.t_end = t.t_begin + plan.segment_steps < shape.steps ? t.t_begin + plan.segment_steps
                                                         : shape.steps;
  t.seq_base = batch * shape.steps * shape.width + h;
  t.state_base = batch * shape.width + h;
  return t;
}

// Steps t0 .. t0+L-1 of one [B, T, H] tensor at this thread's channels, as
// f32; zeros for steps outside the segment and for inactive lanes.
template <int L, int V, class Elem>
__device__ __forceinline__ void load_steps(const Elem* __restrict__ tensor, const ScanThread& t,
                                           int64_t t0, float (&out)[L][V]) {
#pragma unroll
  for (int s = 0; s < L; ++s) {
#pragma unroll
    for (int v = 0; v < V; ++v) out[s][v] = 0.0f;
    if (t.active && t0 + s < t.t_end) VecIO<Elem, V>::load(tensor + t.seq_base + (t0 + s) * t.width, out[s]);
  }
}

// (a, b) of each step from the op's inputs; the identity map (1, 0) for
// steps outside the segment and inactive lanes, so they change nothing.
template <class Op, int L, int V>
__device__ __forceinline__ void step_coefficients(const float (&x)[Op::kInputs][L][V],
                                                  const ScanThread& t, int64_t t0,
                                                  float (&a)[L][V], float (&b)[L][V]) {
#pragma unroll
  for (int s = 0; s < L; ++s) {
    const bool valid = t.active && t0 + s < t.t_end;
#pragma unroll
    for (int v = 0; v < V; ++v) {
      float xv[Op::kInputs];
#pragma unroll
      for (int i = 0; i < Op::kInputs; ++i) xv[i] = x[i][s][v];
      Op::coefficients(xv, a[s][v], b[s][v]);
      if (!valid) { a[s][v] = 1.0f; b[s][v] = 0.0f; }
    }
  }
}

// Workspace: per segment two planes of B * H floats, the map's a then b.
template <int V>
__device__ __forceinline__ void store_segment_map(float* __restrict__ workspace, const ScanThread& t,
                                                  int segment, const float (&a)[V], const float (&b)[V]) {
  float* map_a = workspace + (2 * segment) * t.batch_width + t.state_base;
  float* map_b = map_a + t.batch_width;
#pragma unroll
  for (int v = 0; v < V; ++v) { map_a[v] = a[v]; map_b[v] = b[v]; }
}

// value <- (segment's map)(value)
template <int V>
__device__ __forceinline__ void apply_segment_map(const float* __restrict__ workspace, const ScanThread& t,
                                                  int segment, float (&value)[V]) {
  const float* map_a = workspace + (2 * segment) * t.batch_width + t.state_base;
  const float* map_b = map_a + t.batch_width;
#pragma unroll
  for (int v = 0; v < V; ++v) value[v] = map_a[v] * value[v] + map_b[v];
}

// The carry of an apply pass starts as the constant map (0, value), where
// the chunk-0 threads compute `value` (it involves global loads) and the
// block shares it through shared memory.
template <int V, class EnteringValue>
__device__ __forceinline__ void start_carry_from(const ScanThread& t, float* smem,
                                                 EnteringValue&& entering, float (&carry_a)[V],
                                                 float (&carry_b)[V]) {
  if (t.ty == 0) {
    float value[V];
    entering(value);
#pragma unroll
    for (int v = 0; v < V; ++v) smem[t.tx * V + v] = value[v];
  }
  __syncthreads();
#pragma unroll
  for (int v = 0; v < V; ++v) { carry_a[v] = 0.0f; carry_b[v] = smem[t.tx * V + v]; }
  __syncthreads();  // the tile loop reuses this shared memory
}

}  // namespace exphil::kernels
