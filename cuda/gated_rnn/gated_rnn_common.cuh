// Device pieces shared by the gated-RNN kernels: the gate nonlinearities,
// the flag-synchronised exchange of one step's state between blocks, and
// the per-step product of a block's slice of R with a tile of batch rows.
#pragma once

#include <cstdint>

#include "common/dtype.cuh"
#include "common/state_io.cuh"
#include "gated_rnn/gated_rnn_launch.h"
#include "gated_rnn/gated_rnn_params.h"

namespace exphil::kernels {

// Full-precision expf/tanhf (not the fast intrinsics): the recurrence feeds
// every error forward through T steps.
__device__ __forceinline__ float gated_rnn_sigmoid(float x) { return 1.0f / (1.0f + expf(-x)); }

// Asks L2 to fetch the line holding *p (a hint: no fault, no wait).
__device__ __forceinline__ void gated_rnn_prefetch_l2(const void* p) {
  asm volatile("prefetch.global.L2 [%0];" ::"l"(p));
}

// Sequences of at most this many bytes are prefetched into L2 whole when
// a persistent kernel starts: then no step waits on DRAM for its inputs
// (at B1 T32 H256 the first touch of wx from DRAM would sit on every
// step's critical path). Larger ones would only evict each other.
inline constexpr int64_t kGatedRnnPrefetchBytes = int64_t{16} << 20;

// Prefetches, for every (row, step) m < rows and part q < parts, the run of
// `live` elements of size `elem` at base + (m * parts + q) * stride (in
// elements): its first and last line.
__device__ __forceinline__ void gated_rnn_prefetch_runs(const void* base, int64_t elem,
                                                        int64_t rows, int parts, int64_t stride,
                                                        int live) {
  const char* b = static_cast<const char*>(base);
  for (int64_t i = threadIdx.x; i < rows * parts; i += blockDim.x) {
    const char* run = b + i * stride * elem;
    gated_rnn_prefetch_l2(run);
    gated_rnn_prefetch_l2(run + (live - 1) * elem);
  }
}

// ---------------------------------------------------------------------------
// The exchange. One step's values (h_t forward, grad_rh_t backward) travel
// between blocks through global memory as 64-bit words {value, step}: a
// producer writes each word with one relaxed store, a consumer reloads a
// word until it carries the step it wants. A naturally aligned 64-bit access
// is single-copy atomic, so value and step arrive together, and nothing
// else needs ordering: the value is all the consumer reads. The flag is the
// data, so a step costs one trip through L2 instead of a barrier (an atomic
// and a spin) followed by the loads. Two buffers alternate by step; a block
// can overwrite step t's buffer with step t+2 only after it has read step
// t+1 from every block, i.e. after every block has finished reading step t.
// Before the first step each block marks its own words "no step" (-1) and
// the grid synchronises once, so no word left by an earlier call can pass
// for this call's.
__device__ __forceinline__ void gated_rnn_publish(uint64_t* p, float v, int step) {
  const uint64_t w = (static_cast<uint64_t>(static_cast<uint32_t>(step)) << 32) |
                     static_cast<uint64_t>(__float_as_uint(v));
  asm volatile("st.relaxed.gpu.global.b64 [%0], %1;" ::"l"(p), "l"(w) : "memory");
}

__device__ __forceinline__ uint64_t gated_rnn_peek(const uint64_t* p) {
  uint64_t w;
  asm volatile("ld.relaxed.gpu.global.b64 %0, [%1];" : "=l"(w) : "l"(p) : "memory");
  return w;
}

__device__ __forceinline__ bool gated_rnn_has_step(uint64_t w, int step) {
  return static_cast<uint32_t>(w >> 32) == static_cast<uint32_t>(step);
}

// Waits until each of the N words w[j] (loaded from address(j), or unused
// where that is null) carries `step`, reloading in rounds all the words
// that do not yet: every round's loads are in flight together.
template <int N, class Address>
__device__ __forceinline__ void gated_rnn_poll_rounds(uint64_t (&w)[N], const Address& address,
                                                      int step) {
  for (;;) {
    bool ready = true;
#pragma unroll
    for (int j = 0; j < N; ++j)
      if (address(j) && !gated_rnn_has_step(w[j], step)) ready = false;
    if (ready) return;
#pragma unroll
    for (int j = 0; j < N; ++j)
      if (const uint64_t* p = address(j); p && !gated_rnn_has_step(w[j], step)) w[j] = gated_rnn_peek(p);
  }
}

// Stages rows [0, nb) of one step's exchange buffer (row length K, rows
// contiguous from `src`) into x [rows, K], waiting for `step`; rows
// [nb, rows) are zeros. Each thread issues 8 loads before it waits on any,
// and re-polls every word still short of `step` together, so a wait costs
// one trip through L2 per round, not one per word (polling the words one
// at a time made a thread's stale loads wait in series).
__device__ __forceinline__ void gated_rnn_stage_exchange(float* __restrict__ x, int nb, int rows,
                                                         int K, const uint64_t* src, int step) {
  constexpr int kBatch = 8;
  const int n = nb * K;
  for (int i0 = static_cast<int>(threadIdx.x); i0 < n; i0 += kBatch * kGatedRnnThreads) {
    uint64_t w[kBatch];
#pragma unroll
    for (int j = 0; j < kBatch; ++j) {
      const int i = i0 + j * kGatedRnnThreads;
      if (i < n) w[j] = gated_rnn_peek(src + i);
    }
    gated_rnn_poll_rounds<kBatch>(w, [&](int j) {
      const int i = i0 + j * kGatedRnnThreads;
      return i < n ? src + i : nullptr;
    }, step);
#pragma unroll
    for (int j = 0; j < kBatch; ++j) {
      const int i = i0 + j * kGatedRnnThreads;
      if (i < n) x[i] = __uint_as_float(static_cast<uint32_t>(w[j]));
    }
  }
  for (int i = n + static_cast<int>(threadIdx.x); i < rows * K; i += kGatedRnnThreads) x[i] = 0.0f;
}

// The same from a plain [B, K] state tensor of any dtype (h0), or zeros.
__device__ __forceinline__ void gated_rnn_stage_state(float* __restrict__ x, int nb, int rows,
                                                      int K, const void* src, DType dtype,
                                                      int64_t first) {
  for (int i = static_cast<int>(threadIdx.x); i < rows * K; i += kGatedRnnThreads)
    x[i] = (i < nb * K && src) ? load_state(src, dtype, first + i) : 0.0f;
}

// ---------------------------------------------------------------------------
// The slice product. out[b * ldo + c] = sum_k x[b * K + k] * W[c * K + k]
// for b < nb and the block's live columns c < C (c % units < live_units,
// with units = the block's U: columns g * U + u belong to unit u; forward
// C = G * U, backward C = U). A warp owns columns w, w + 8, ...; its lanes
// split k (lane, lane + 32, ...) and keep NB accumulators, one per batch row
// (x holds NB rows, zeros past nb, so the loop has no guards), and a
// butterfly reduce-scatter sums them across the lanes in 31 shuffles or
// fewer, leaving row index lane >> (5 - log2 NB) on each lane. Every sum is
// in a fixed order: results are bitwise reproducible. W lives in shared
// memory (resident) or global memory (streamed); consecutive lanes read
// consecutive k of W and of x.
// One halving of the reduce-scatter (step S, lanes exchanging across bit
// 4 - S): the lower lanes keep the lower half of the live values, the upper
// lanes the upper half, each adding its partner's; recursion keeps every
// index a compile-time constant (no local memory).
template <int NB, int S>
__device__ __forceinline__ void gated_rnn_reduce_scatter_step(float (&acc)[NB], int lane) {
  if constexpr ((NB >> S) > 1) {
    constexpr int kOff = 16 >> S;
    constexpr int kHalf = NB >> (S + 1);
    const bool upper = (lane & kOff) != 0;
#pragma unroll
    for (int j = 0; j < kHalf; ++j) {
      const float send = upper ? acc[j] : acc[j + kHalf];
      const float keep = upper ? acc[j + kHalf] : acc[j];
      acc[j] = keep + __shfl_xor_sync(0xffffffffu, send, kOff);
    }
    gated_rnn_reduce_scatter_step<NB, S + 1>(acc, lane);
  }
}

template <int NB>
__device__ __forceinline__ void gated_rnn_reduce_scatter_store(float (&acc)[NB], int nb,
                                                               float* __restrict__ out, int ldo,
                                                               int c, int lane) {
  constexpr int P = NB == 1 ? 0 : NB == 2 ? 1 : NB == 4 ? 2 : NB == 8 ? 3 : NB == 16 ? 4 : 5;
  static_assert((1 << P) == NB, "NB is a power of two up to 32");
  gated_rnn_reduce_scatter_step<NB, 0>(acc, lane);
  // Fewer values than lanes: the lanes sharing a value sum it in full.
#pragma unroll
  for (int off = 16 >> P; off >= 1; off >>= 1) acc[0] += __shfl_xor_sync(0xffffffffu, acc[0], off);
  constexpr int kShift = 5 - P;
  const int row = lane >> kShift;
  if ((lane & ((1 << kShift) - 1)) == 0 && row < nb) out[row * ldo + c] = acc[0];
}

template <int NB>
__device__ __forceinline__ void gated_rnn_slice_product(const float* __restrict__ x, int K, int nb,
                                                        const float* W, int C, int units,
                                                        int live_units, float* __restrict__ out,
                                                        int ldo) {
  const int warp = static_cast<int>(threadIdx.x >> 5);
  const int lane = static_cast<int>(threadIdx.x & 31);
  constexpr int kWarps = kGatedRnnThreads / 32;
  for (int c = warp; c < C; c += kWarps) {
    if (c % units >= live_units) continue;  // uniform across the warp
    float acc[NB];
#pragma unroll
    for (int b = 0; b < NB; ++b) acc[b] = 0.0f;
    const float* wc = W + static_cast<int64_t>(c) * K;
#pragma unroll 2
    for (int k = lane; k < K; k += 32) {
      const float w = wc[k];
#pragma unroll
      for (int b = 0; b < NB; ++b) acc[b] = fmaf(x[b * K + k], w, acc[b]);
    }
    gated_rnn_reduce_scatter_store<NB>(acc, nb, out, ldo, c, lane);
  }
}

// The number of rows the product runs for nb live rows: the next power of
// two (x is staged with that many rows).
__device__ __forceinline__ int gated_rnn_product_rows(int nb) {
  return nb <= 1 ? 1 : nb <= 2 ? 2 : nb <= 4 ? 4 : nb <= 8 ? 8 : nb <= 16 ? 16 : 32;
}

__device__ __forceinline__ void gated_rnn_slice_product_rows(int rows, const float* x, int K,
                                                             int nb, const float* W, int C,
                                                             int units, int live_units,
                                                             float* out, int ldo) {
  switch (rows) {
    case 1: gated_rnn_slice_product<1>(x, K, nb, W, C, units, live_units, out, ldo); break;
    case 2: gated_rnn_slice_product<2>(x, K, nb, W, C, units, live_units, out, ldo); break;
    case 4: gated_rnn_slice_product<4>(x, K, nb, W, C, units, live_units, out, ldo); break;
    case 8: gated_rnn_slice_product<8>(x, K, nb, W, C, units, live_units, out, ldo); break;
    case 16: gated_rnn_slice_product<16>(x, K, nb, W, C, units, live_units, out, ldo); break;
    default: gated_rnn_slice_product<32>(x, K, nb, W, C, units, live_units, out, ldo); break;
  }
}

}  // namespace exphil::kernels
