// Device helpers shared by the selective-scan kernels: where a thread sits,
// how dt becomes delta, and the staging of one tile of steps in shared
// memory.
//
// Layout of a block (see selective_scan_forward.cuh): threadIdx.x is the
// channel lane (32 consecutive channels d0 + lane), threadIdx.y the state
// slice (states n0 + 4 * slice ... + 3 of the block's state group). Grid x
// enumerates (batch row, state group, channel group), grid y the chunks of T.
#pragma once

#include <cuda_runtime.h>

#include "common/dtype.cuh"
#include "common/fast_exp2.cuh"
#include "selective_scan/selective_scan_config.h"
#include "selective_scan/selective_scan_params.h"

namespace exphil::kernels::ss {

constexpr int P = kSsStatesPerThread;
constexpr int kLanes = kSsChannelsPerBlock;
constexpr float kLog2e = 1.4426950408889634f;

struct Place {
  int lane, slice, threads, tid;
  int64_t b, d;        // batch row, channel of this thread
  int64_t d0;          // first channel of the block
  int group;           // state group
  int n_block;         // first state of the block (group * 4 * slices)
  int n0;              // first state of this thread
  int chunk;
  int64_t t_begin, t_end;
  bool channel_ok;     // d < D
};

__device__ __forceinline__ Place locate(const SelectiveScanShape& s, const SelectiveScanPlan& plan) {
  Place at;
  at.lane = threadIdx.x;
  at.slice = threadIdx.y;
  at.threads = kLanes * blockDim.y;
  at.tid = at.slice * kLanes + at.lane;
  int64_t block = blockIdx.x;
  const int64_t channel_group = block % plan.channel_groups;
  block /= plan.channel_groups;
  at.group = static_cast<int>(block % plan.state_groups);
  at.b = block / plan.state_groups;
  at.d0 = channel_group * kLanes;
  at.d = at.d0 + at.lane;
  at.channel_ok = at.d < s.channels;
  at.n_block = at.group * plan.states_per_thread * plan.slices;
  at.n0 = at.n_block + plan.states_per_thread * at.slice;
  at.chunk = blockIdx.y;
  at.t_begin = static_cast<int64_t>(at.chunk) * plan.chunk_steps;
  at.t_end = at.t_begin + plan.chunk_steps < s.steps ? at.t_begin + plan.chunk_steps : s.steps;
  return at;
}

// Calls f(t) for t = 0 .. steps-1 (forward) or steps-1 .. 0 (reverse),
// unrolled. Full tiles take a copy of the loop without bounds checks, so the
// compiler can schedule each step's loads ahead of the previous step's math.
template <int L, bool kReverse = false, class F>
__device__ __forceinline__ void for_steps(int steps, F&& f) {
  if (steps == L) {
#pragma unroll
    for (int i = 0; i < L; ++i) f(kReverse ? L - 1 - i : i);
  } else {
#pragma unroll
    for (int i = 0; i < L; ++i) {
      const int t = kReverse ? L - 1 - i : i;
      if (t < steps) f(t);
    }
  }
}

__device__ __forceinline__ float sigmoid(float u) { return 1.0f / (1.0f + __expf(-u)); }
__device__ __forceinline__ float silu(float z) { return z * sigmoid(z); }
__device__ __forceinline__ float silu_grad(float z) {
  const float s = sigmoid(z);
  return s * (1.0f + z * (1.0f - s));
}

// delta from dt + bias, and d delta / d(dt): the softplus slope, or zero
// where the clamp holds delta at a bound.
__device__ __forceinline__ float delta_of(float u, const DeltaRule& rule, float& slope) {
  slope = 1.0f;
  if (rule.softplus) {
    slope = sigmoid(u);
    // log(1 + e^u) without overflow for large u or loss for very negative u.
    u = fmaxf(u, 0.0f) + log1pf(__expf(-fabsf(u)));
  }
  if (rule.clamp) {
    if (u < rule.dt_min) {
      u = rule.dt_min;
      slope = 0.0f;
    } else if (u > rule.dt_max) {
      u = rule.dt_max;
      slope = 0.0f;
    }
  }
  return u;
}

// A thread's states' A (f32) and A * log2(e), zero past N so padded
// states stay zero: their decay is 1 but their input B is 0.
template <int kP = P>
struct StateCoefficients {
  float A[kP];
  float A2[kP];
};

template <int kP = P>
__device__ __forceinline__ StateCoefficients<kP> load_coefficients(const float* d_A,
                                                                   const Place& at,
                                                                   int64_t states) {
  StateCoefficients<kP> k;
#pragma unroll
  for (int p = 0; p < kP; ++p) {
    const int n = at.n0 + p;
    k.A[p] = at.channel_ok && n < states ? d_A[at.d * states + n] : 0.0f;
    k.A2[p] = k.A[p] * kLog2e;
  }
  return k;
}

// Staging of one tile. A thread stages the rows t = slice + j * slices of
// its own channel (so a row of the block is one coalesced 32-wide access),
// and an equal share of the block's B and C values. Every load of a tile is
// issued before any is used: the loops are unrolled to a compile-time bound
// with predicated loads, so a tile costs one round trip to memory, not one
// per loop iteration.

// Rows per thread at most (kSsMinSlices warps).
template <int L>
inline constexpr int kRowsPerThread = L / kSsMinSlices;
// B (or C) values per thread: L steps x kP * slices states over 32 * slices
// threads.
template <int L, int kP = P>
inline constexpr int kStatesPerThread = L * kP / kLanes;

// Where a thread's staged elements of a tile starting at step t0 live,
// worked out once per thread so that a tile costs one multiply per tensor:
// rows t = slice + j * slices of its channel in [B, T, D] tensors, and its
// share j of the block's B and C values in [B, T, N] (state_t[j] = L when
// the value is padding past N, so that it is never loaded).
template <int L, int kStates>
struct TileCursor {
  int64_t row0;        // offset of (b, slice, d) in [B, T, D]
  int64_t row_stride;  // slices * D
  int64_t width, states;
  int first_row, rows_apart;  // slice, slices
  bool channel_ok;
  int64_t state0[kStates];    // offset of (b, state_t[j], n_j) in [B, T, N]
  int state_t[kStates];

  __device__ TileCursor(const Place& at, const SelectiveScanShape& s, int slices, int nb) {
    width = s.channels;
    states = s.states;
    first_row = at.slice;
    rows_apart = slices;
    channel_ok = at.channel_ok;
    row0 = (at.b * s.steps + at.slice) * s.channels + at.d;
    row_stride = static_cast<int64_t>(slices) * s.channels;
#pragma unroll
    for (int j = 0; j < kStates; ++j) {
      const int i = at.tid + j * at.threads;
      const int t = i / nb, n = at.n_block + i % nb;
      state_t[j] = n < s.states ? t : L;
      state0[j] = (at.b * s.steps + t) * s.states + n;
    }
  }
  // Offset of row j of the tile at t0 (valid when row_valid).
  __device__ int64_t row_offset(int64_t t0, int j) const {
    return row0 + t0 * width + j * row_stride;
  }
  __device__ int row_step(int j) const { return first_row + j * rows_apart; }
  __device__ bool row_valid(int j, int steps) const { return channel_ok && row_step(j) < steps; }
};

// Calls f(sl) for every slice in slice order: the fixed order that makes
// the sums over a block's states reproducible. Blocks of kSsMinSlices warps
// (N <= 16, the common case) get a loop with no trip count to test.
template <class F>
__device__ __forceinline__ void for_slices(int slices, F&& f) {
  if (slices == kSsMinSlices) {
#pragma unroll
    for (int sl = 0; sl < kSsMinSlices; ++sl) f(sl);
    return;
  }
#pragma unroll 4
  for (int sl = 0; sl < slices; ++sl) f(sl);
}

// Sums v(sl) over the slices in slice order.
template <class F>
__device__ __forceinline__ float sum_slices(int slices, F&& v) {
  float sum = 0.0f;
  for_slices(slices, [&](int sl) { sum += v(sl); });
  return sum;
}

// The loads keep the raw elements: converting to f32 right after a load
// would wait for it there, and the forward's prefetch would gain nothing.
// An absent tensor (no z, say) is absent for the whole block: one uniform
// branch skips its rows, rather than an address and a predicated-off load
// per row and tile.
template <int L, int kStates, class Elem>
__device__ __forceinline__ void load_rows(const TileCursor<L, kStates>& c, const Elem* src,
                                          int64_t t0, int steps,
                                          Elem (&out)[kRowsPerThread<L>]) {
#pragma unroll
  for (int j = 0; j < kRowsPerThread<L>; ++j) out[j] = Elem{};
  if (src == nullptr || !c.channel_ok) return;
  const Elem* row = src + c.row_offset(t0, 0);
#pragma unroll
  for (int j = 0; j < kRowsPerThread<L>; ++j) {
    if (c.row_step(j) < steps) out[j] = *row;
    row += c.row_stride;
  }
}

template <int L, int kStates, class Elem>
__device__ __forceinline__ void load_states(const TileCursor<L, kStates>& c, const Elem* src,
                                            int64_t t0, int steps, Elem (&out)[kStates]) {
  const int64_t shift = t0 * c.states;
#pragma unroll
  for (int j = 0; j < kStates; ++j)
    out[j] = c.state_t[j] < steps ? src[c.state0[j] + shift] : Elem{};
}

// dst[t * nb + k] for the whole tile (zeros past the loaded steps).
template <int kCount, class Elem>
__device__ __forceinline__ void store_states(const Place& at, const Elem (&v)[kCount],
                                             float* dst) {
#pragma unroll
  for (int j = 0; j < kCount; ++j) dst[at.tid + j * at.threads] = to_float(v[j]);
}

// The kP consecutive values of a thread's states in a staged row.
template <int kP>
__device__ __forceinline__ void read_states(const float* row_of_block, int slice, float (&v)[kP]) {
  static_assert(kP == 2 || kP == 4, "states per thread");
  if constexpr (kP == 4) {
    const float4 q = reinterpret_cast<const float4*>(row_of_block)[slice];
    v[0] = q.x, v[1] = q.y, v[2] = q.z, v[3] = q.w;
  } else {
    const float2 q = reinterpret_cast<const float2*>(row_of_block)[slice];
    v[0] = q.x, v[1] = q.y;
  }
}

}  // namespace exphil::kernels::ss
