// Device pieces shared by the gated-RNN kernels: the gate nonlinearities,
// the flag-synchronised exchange of one step's state between blocks, and
// the per-step product of a block's slice of R with a tile of batch rows.
#pragma once

#include <cstdint>
#include <type_traits>

#include "common/dtype.cuh"
#include "common/state_io.cuh"
#include "common/vector_io.cuh"
#include "gated_rnn/gated_rnn_launch.h"
#include "gated_rnn/gated_rnn_pair_word.h"
#include "gated_rnn/gated_rnn_params.h"

namespace exphil::kernels {

// Full-precision expf/tanhf (not the fast intrinsics): the recurrence feeds
// every error forward through T steps.
__device__ __forceinline__ float gated_rnn_sigmoid(float x) { return 1.0f / (1.0f + expf(-x)); }

// Whether rows of width N from p take a pair of elements at even columns
// in one access (VecIO<Elem, 2>): a product store's pairs(),
// gated_rnn_gemm.cuh.
template <class Elem>
__device__ __forceinline__ bool gated_rnn_elem_pairs(const Elem* p, int64_t N) {
  return N % 2 == 0 && reinterpret_cast<uintptr_t>(p) % (2 * sizeof(Elem)) == 0;
}

// Asks L2 to fetch the line holding *p (a hint: no fault, no wait).
__device__ __forceinline__ void gated_rnn_prefetch_l2(const void* p) {
  asm volatile("prefetch.global.L2 [%0];" ::"l"(p));
}

// Sequences of at most this many bytes are prefetched into L2 whole when
// a persistent kernel starts: then no step waits on DRAM for its inputs
// (at B1 T32 H256 the first touch of wx from DRAM would sit on every
// step's critical path). Larger ones would only evict each other.
inline constexpr int64_t kGatedRnnPrefetchBytes = int64_t{16} << 20;

// A product operand's rows fit 16-byte copies (gated_rnn_gemm.cuh's
// async_rows): bf16 elements, rows of a multiple of 8, an aligned start.
inline bool gated_rnn_bf16_rows(DType dtype, const void* p, int64_t row_length) {
  return dtype == DType::bf16 && row_length % 8 == 0 && (reinterpret_cast<uintptr_t>(p) & 15) == 0;
}
// The same for f32 elements (rows of a multiple of 4).
inline bool gated_rnn_f32_rows(DType dtype, const void* p, int64_t row_length) {
  return dtype == DType::f32 && row_length % 4 == 0 && (reinterpret_cast<uintptr_t>(p) & 15) == 0;
}

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

// A slice of R is read once a call, before the first step, and every block
// waits for the slowest. With one block of 8 warps a multiprocessor, two
// warps a scheduler cannot hide a dependent chain: the loads were cheap,
// the index arithmetic around them was not (64-bit division and modulo for
// every element: the load took 19 us at B32 H256 and 51 to 107 us at B64
// H512, bench/RESULTS.md issue 30 runs BX and BZ, whichever way its loads
// were batched). The loaders below divide once a column, step their
// addresses, and keep kGatedRnnLoadsInFlight loads in flight a thread.
inline constexpr int kGatedRnnLoadsInFlight = 16;

// A block's slice of R for the block layout, forward and backward alike:
// W[(g*U + u) * H + k] = R[k, g*H + u0 + u] for the live units, zeros past
// them and in the padding columns [G*U, C). A warp takes 4 consecutive
// columns and 8 consecutive k at a time (lane = 8 * column + k): its reads
// fall in 8 runs of 4 units, its shared-memory stores in at least 8 banks.
template <class Raw>
__device__ __forceinline__ void gated_rnn_load_slice_raw(float* W, const Raw* __restrict__ R,
                                                         DType dtype, int G, int H, int U, int u0,
                                                         int live, int C) {
  constexpr int kRound = kGatedRnnLoadsInFlight;
  const int K = H, GU = G * U;
  const int64_t GH = static_cast<int64_t>(G) * H;
  const int lane = static_cast<int>(threadIdx.x) & 31, warp = static_cast<int>(threadIdx.x) >> 5;
  const int warps = static_cast<int>(blockDim.x) >> 5;
  for (int quad = warp; 4 * quad < C; quad += warps) {
    const int c = 4 * quad + (lane >> 3);
    if (c >= C) continue;
    const int g = c / U, u = c - g * U;
    const bool in = c < GU && u < live;
    const Raw* const src = R + (in ? static_cast<int64_t>(g) * H + u0 + u : 0);
    float* const dst = W + static_cast<int64_t>(c) * K;
    for (int k0 = lane & 7; k0 < K; k0 += 8 * kRound) {
      uint32_t bits[kRound];
#pragma unroll
      for (int j = 0; j < kRound; ++j) {
        const int k = k0 + 8 * j;
        bits[j] = in && k < K ? static_cast<uint32_t>(src[k * GH]) : 0u;
      }
#pragma unroll
      for (int j = 0; j < kRound; ++j)
        if (k0 + 8 * j < K) dst[k0 + 8 * j] = state_from_bits(bits[j], dtype);
    }
  }
}

__device__ __forceinline__ void gated_rnn_load_slice(float* W, const void* R, DType dtype, int G,
                                                     int H, int U, int u0, int live, int C) {
  if (dtype == DType::f32)
    gated_rnn_load_slice_raw(W, static_cast<const uint32_t*>(R), dtype, G, H, U, u0, live, C);
  else
    gated_rnn_load_slice_raw(W, static_cast<const uint16_t*>(R), dtype, G, H, U, u0, live, C);
}

// Row k of a block's slice for the k-split layouts (a thread's columns in
// registers): w[c] = R[k, g*H + u0 + u] for column c = g*U + u < CP, zeros
// past the live units, past G*U and for k >= H. The dtype's branch is taken
// once, so the CP loads are in flight together (load_state's branch at
// every element kept each load waiting for the last, state_io.cuh).
template <int CP, class Raw>
__device__ __forceinline__ void gated_rnn_load_row_raw(uint32_t (&bits)[CP], const Raw* __restrict__ R,
                                                       int k, int G, int H, int U, int u0, int live) {
  const int64_t row = static_cast<int64_t>(k) * G * H;
#pragma unroll
  for (int c = 0; c < CP; ++c) {
    const int g = c / U, u = c - g * U;
    bits[c] = k < H && g < G && u < live ? static_cast<uint32_t>(R[row + g * H + u0 + u]) : 0u;
  }
}

template <int CP>
__device__ __forceinline__ void gated_rnn_load_row(float (&w)[CP], const void* R, DType dtype, int k,
                                                   int G, int H, int U, int u0, int live) {
  uint32_t bits[CP];
  if (dtype == DType::f32)
    gated_rnn_load_row_raw(bits, static_cast<const uint32_t*>(R), k, G, H, U, u0, live);
  else
    gated_rnn_load_row_raw(bits, static_cast<const uint16_t*>(R), k, G, H, U, u0, live);
#pragma unroll
  for (int c = 0; c < CP; ++c) w[c] = state_from_bits(bits[c], dtype);
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

// Two batch rows' values in one word, the step's tag in their lowest bits
// (gated_rnn_pair_word.h): the backward walk's own exchange.
__device__ __forceinline__ void gated_rnn_publish_pair(uint64_t* p, float row, float next, int step) {
  const uint64_t w = gated_rnn_pair_word(__float_as_uint(row), __float_as_uint(next), step);
  asm volatile("st.relaxed.gpu.global.b64 [%0], %1;" ::"l"(p), "l"(w) : "memory");
}

// Whether word w carries `step`, in the word format kPair says.
template <bool kPair>
__device__ __forceinline__ bool gated_rnn_word_has_step(uint64_t w, int step) {
  return kPair ? gated_rnn_pair_has_step(w, step) : gated_rnn_has_step(w, step);
}

// Waits until the word *src carries `step`; returns it. One thread, one
// word: the bare reload loop (what a step waits for at B1).
template <bool kPair = false>
__device__ __forceinline__ uint64_t gated_rnn_wait(const uint64_t* src, int step) {
  uint64_t w = gated_rnn_peek(src);
  while (!gated_rnn_word_has_step<kPair>(w, step)) w = gated_rnn_peek(src);
  return w;
}

// The value of a one-value word, once it carries `step`.
__device__ __forceinline__ float gated_rnn_wait_word(const uint64_t* src, int step) {
  return __uint_as_float(static_cast<uint32_t>(gated_rnn_wait(src, step)));
}

// Waits until each of the N words w[j] (loaded from address(j), or unused
// where that is null) carries `step`, reloading in rounds all the words
// that do not yet: every round's loads are in flight together. kPair: the
// words are pair words.
template <int N, bool kPair = false, class Address>
__device__ __forceinline__ void gated_rnn_poll_rounds(uint64_t (&w)[N], const Address& address,
                                                      int step) {
  for (;;) {
    bool ready = true;
#pragma unroll
    for (int j = 0; j < N; ++j)
      if (address(j) && !gated_rnn_word_has_step<kPair>(w[j], step)) ready = false;
    if (ready) return;
#pragma unroll
    for (int j = 0; j < N; ++j)
      if (const uint64_t* p = address(j); p && !gated_rnn_word_has_step<kPair>(w[j], step))
        w[j] = gated_rnn_peek(p);
  }
}

// The same with live(j) apart from address(j), so that the check, which
// runs every step, forms no address: testing formed addresses for null was
// 170 of the 1400 instructions a warp ran a step in the tensor-core forward
// at GRU bf16 B64 H512, and the block layout's forwards took 2 to 15% less
// without it (bench/RESULTS.md, issue 30 run CU). The walk took 2 to 13%
// more with this form (the same run), and 1 to 13% more with it and a
// __nanosleep of 100 or 200 ns before each re-poll (run CV), so a faster
// spin is not why; it keeps the form above, as does the unit-warps
// forward (not timed with this).
template <int N, bool kPair = false, class Live, class Address>
__device__ __forceinline__ void gated_rnn_poll_live_rounds(uint64_t (&w)[N], const Live& live,
                                                           const Address& address, int step) {
  for (;;) {
    bool ready = true;
#pragma unroll
    for (int j = 0; j < N; ++j)
      if (live(j) && !gated_rnn_word_has_step<kPair>(w[j], step)) ready = false;
    if (ready) return;
#pragma unroll
    for (int j = 0; j < N; ++j)
      if (live(j) && !gated_rnn_word_has_step<kPair>(w[j], step)) w[j] = gated_rnn_peek(address(j));
  }
}

// Where word i of rows of K words lands in rows of ldx >= K floats (the
// tensor-core product pads its rows, gated_rnn_launch.h): i plus ldx - K
// for every row before it, the row being i * ceil(2^32 / K) >> 32, exact
// while i * K < 2^32 (its rows: at most 32 of H <= 2048). ldx > K needs
// K >= 2 (ceil(2^32 / 1) has no 32 bits; the padded rows' K is a multiple
// of 16). (common/fast_divisor.h divides any n < 2^31, a shift more.)
struct GatedRnnRowStride {
  int ldx, pad;
  uint32_t inverse;
  __device__ __forceinline__ static GatedRnnRowStride make(int K, int ldx) {
    return {ldx, ldx - K, ldx == K ? 0u : 0xffffffffu / static_cast<uint32_t>(K) + 1u};
  }
  __device__ __forceinline__ int operator()(int i) const {
    return pad == 0 ? i : i + static_cast<int>(__umulhi(static_cast<uint32_t>(i), inverse)) * pad;
  }
};

// Stages n words of one step's exchange, word i from address(i), waiting
// for each to carry `step`, and hands each to land(i, word). Up to a word
// a thread (B1 at H <= 256), the bare reload loop: the batched loop's
// bookkeeping for 8 words sat between the last load's arrival and the
// product, on every step's critical path. Above, each thread issues 8
// loads before it waits on any, and re-polls every word still short of
// `step` together, so a wait costs one trip through L2 per round, not one
// per word (polling the words one at a time made a thread's stale loads
// wait in series). kPair: the words are pair words.
template <bool kPair, class Address, class Land>
__device__ __forceinline__ void gated_rnn_stage_words(int n, const Address& address, int step,
                                                      const Land& land) {
  if (n <= kGatedRnnThreads) {
    const int i = static_cast<int>(threadIdx.x);
    if (i < n) land(i, gated_rnn_wait<kPair>(address(i), step));
    return;
  }
  constexpr int kBatch = 8;
  // kWhole: n a multiple of a batch's words (B64 H512's 2048 or more), so
  // no word of a batch is checked against n.
  const auto batches = [&](auto whole) {
    constexpr bool kWhole = decltype(whole)::value;
    for (int i0 = static_cast<int>(threadIdx.x); i0 < n; i0 += kBatch * kGatedRnnThreads) {
      const auto live = [&](int j) { return kWhole || i0 + j * kGatedRnnThreads < n; };
      uint64_t w[kBatch];
#pragma unroll
      for (int j = 0; j < kBatch; ++j)
        if (live(j)) w[j] = gated_rnn_peek(address(i0 + j * kGatedRnnThreads));
      gated_rnn_poll_live_rounds<kBatch, kPair>(
          w, live, [&](int j) { return address(i0 + j * kGatedRnnThreads); }, step);
#pragma unroll
      for (int j = 0; j < kBatch; ++j)
        if (live(j)) land(i0 + j * kGatedRnnThreads, w[j]);
    }
  };
  if (n % (kBatch * kGatedRnnThreads) == 0)
    batches(std::true_type{});
  else
    batches(std::false_type{});
}

// Stages `count` words src[n * src_stride] into dst[n * dst_stride] (one
// thread's share of a strided gather), waiting for each to carry `step`,
// in batches of kBatch loads in flight as gated_rnn_stage_words does; the
// addresses are an add apart (the first backward's gather divided twice
// per word to find them, and re-derived them every poll round). 8 by
// default: the walk on CUDA cores was slower with 16 at B32 and 32 raised
// its registers to 255 (bench/RESULTS.md, issue 30 runs BO and BR); the
// walk on tensor cores, with registers to spare, takes 16.
// With kPair the words are pair words (gated_rnn_pair_word.h): row b's
// value lands in dst, row b + 1's at dst + next (next 0: the tile has no
// row b + 1, its value dropped).
template <int kBatch = 8, bool kPair = false>
__device__ __forceinline__ void gated_rnn_stage_strided(float* __restrict__ dst, int dst_stride,
                                                        const uint64_t* src, int64_t src_stride,
                                                        int count, int step, int next = 0) {
  for (int n0 = 0; n0 < count; n0 += kBatch) {
    const uint64_t* first = src + n0 * src_stride;
    uint64_t w[kBatch];
#pragma unroll
    for (int j = 0; j < kBatch; ++j)
      if (n0 + j < count) w[j] = gated_rnn_peek(first + j * src_stride);
    gated_rnn_poll_rounds<kBatch, kPair>(w, [&](int j) -> const uint64_t* {
      return n0 + j < count ? first + j * src_stride : nullptr;
    }, step);
#pragma unroll
    for (int j = 0; j < kBatch; ++j) {
      if (n0 + j >= count) continue;
      float* const d = dst + (n0 + j) * dst_stride;
      if constexpr (kPair) {
        d[0] = __uint_as_float(gated_rnn_pair_row(w[j]));
        if (next != 0) d[next] = __uint_as_float(gated_rnn_pair_next(w[j]));
      } else {
        d[0] = __uint_as_float(static_cast<uint32_t>(w[j]));
      }
    }
  }
}

// Stages rows [0, nb) of one step's exchange buffer (row length K, rows
// contiguous from `src`) into x [rows, at.ldx], waiting for `step`; rows
// [nb, rows) are zeros. kPair (the forward's pair words): rows 2j and
// 2j + 1 of the tile (j < ceil(nb / 2)) come in the word of row 2j, the
// odd rows' words unused: word i (pair j = i / K, unit i - j K) sits at
// src[i + j K], its rows at x[2j ldx + i - j K] and one row of x further.
template <bool kPair = false>
__device__ __forceinline__ void gated_rnn_stage_exchange(float* __restrict__ x, int nb, int rows,
                                                         int K, const GatedRnnRowStride& at,
                                                         const uint64_t* src, int step) {
  if constexpr (kPair) {
    const int both = nb / 2 * K;  // words below this one carry an odd row too
    // Word i's pair j = i / K, one quotient for both of its addresses
    // (exact while i K < 2^32; K = 1, which has no 32-bit inverse, is its
    // own quotient): src[i + j K], and rows 2j and 2j + 1 of x at
    // x[2j ldx + i - j K] and one row further.
    const uint32_t inverse = K == 1 ? 0u : 0xffffffffu / static_cast<uint32_t>(K) + 1u;
    const auto pair = [K, inverse](int i) {
      return K == 1 ? i : static_cast<int>(__umulhi(static_cast<uint32_t>(i), inverse));
    };
    const int skip = 2 * at.ldx - K;
    gated_rnn_stage_words<true>(
        (nb + 1) / 2 * K, [&](int i) { return src + i + pair(i) * K; }, step,
        [&](int i, uint64_t w) {
          float* const d = x + i + pair(i) * skip;
          d[0] = __uint_as_float(gated_rnn_pair_row(w));
          if (i < both) d[at.ldx] = __uint_as_float(gated_rnn_pair_next(w));
        });
  } else {
    gated_rnn_stage_words<false>(
        nb * K, [src](int i) { return src + i; }, step,
        [&](int i, uint64_t w) { x[at(i)] = __uint_as_float(static_cast<uint32_t>(w)); });
  }
  for (int i = nb * at.ldx + static_cast<int>(threadIdx.x); i < rows * at.ldx;
       i += kGatedRnnThreads)
    x[i] = 0.0f;
}

// The same from a plain [B, K] state tensor of any dtype (h0), or zeros.
__device__ __forceinline__ void gated_rnn_stage_state(float* __restrict__ x, int nb, int rows,
                                                      int K, const GatedRnnRowStride& at,
                                                      const void* src, DType dtype,
                                                      int64_t first) {
  for (int i = static_cast<int>(threadIdx.x); i < rows * K; i += kGatedRnnThreads)
    x[at(i)] = (i < nb * K && src) ? load_state(src, dtype, first + i) : 0.0f;
}

// ---------------------------------------------------------------------------
// The forward's slice product. out[b * ldo + c] = sum_k x[b * K + k] *
// W[c * K + k] for b < nb and every column c < C of the block's slice (C a
// multiple of kGatedRnnColumnGroup, zeros past the live columns). A warp
// owns groups of CW consecutive columns (warp, warp + 8, ...); its lanes
// split k (lane, lane + 32, ...) and keep NB x CW accumulators, one per
// batch row and column: each x they load feeds CW products and each w NB
// (one x per product was the shared-memory bound of the first version at
// B >= 8). A butterfly reduce-scatter sums each column's accumulators across
// the lanes in 31 shuffles or fewer, leaving row gated_rnn_lane_row on each
// lane. Every sum is in a fixed order: results are bitwise reproducible. W
// lives in shared memory (resident) or global memory (streamed);
// consecutive lanes read consecutive k of W and of x.

// NB = 2^P rows over 32 lanes: the row a lane holds after the
// reduce-scatter, its P high bits.
template <int NB>
__device__ __forceinline__ int gated_rnn_lane_row(int lane) {
  constexpr int P = NB == 1 ? 0 : NB == 2 ? 1 : NB == 4 ? 2 : NB == 8 ? 3 : NB == 16 ? 4 : 5;
  static_assert((1 << P) == NB, "NB is a power of two up to 32");
  return lane >> (5 - P);
}

// One halving of the reduce-scatter (step S, lanes exchanging across bit
// 4 - S, which decides row bit P - 1 - S): each lane keeps the half of the
// live rows whose bit is its own and adds its partner's; recursion keeps
// every index a compile-time constant (no local memory). kPermuted: slot i
// of a lane holds row i ^ gated_rnn_lane_row (the slice product loads its
// rows so), so the half it keeps is always its lower slots and the one it
// sends its upper: a shuffle and an add a value. Else the lanes pick the
// halves by their bit, two selects more a value (the k-split kernels, whose
// slots are columns of registers).
template <int NB, int S, bool kPermuted>
__device__ __forceinline__ void gated_rnn_reduce_scatter_step(float (&acc)[NB], int lane) {
  if constexpr ((NB >> S) > 1) {
    constexpr int kOff = 16 >> S;
    constexpr int kHalf = NB >> (S + 1);
#pragma unroll
    for (int j = 0; j < kHalf; ++j) {
      if constexpr (kPermuted) {
        acc[j] += __shfl_xor_sync(0xffffffffu, acc[j + kHalf], kOff);
      } else {
        const bool upper = (lane & kOff) != 0;
        const float send = upper ? acc[j] : acc[j + kHalf];
        const float keep = upper ? acc[j + kHalf] : acc[j];
        acc[j] = keep + __shfl_xor_sync(0xffffffffu, send, kOff);
      }
    }
    gated_rnn_reduce_scatter_step<NB, S + 1, kPermuted>(acc, lane);
  }
}

template <int NB, bool kPermuted = false>
__device__ __forceinline__ void gated_rnn_reduce_scatter_store(float (&acc)[NB], int nb,
                                                               float* __restrict__ out, int ldo,
                                                               int c, int lane) {
  gated_rnn_reduce_scatter_step<NB, 0, kPermuted>(acc, lane);
  // Fewer values than lanes: the lanes sharing a value sum it in full.
  constexpr int kShare = 32 / NB;  // lanes a row
#pragma unroll
  for (int off = kShare / 2; off >= 1; off >>= 1)
    acc[0] += __shfl_xor_sync(0xffffffffu, acc[0], off);
  const int row = gated_rnn_lane_row<NB>(lane);
  if ((lane & (kShare - 1)) == 0 && row < nb) out[row * ldo + c] = acc[0];
}

// Columns a warp takes at once (CW; C must be a multiple). At NB <= 2, the
// latency path, the fewest that cover the block's C columns in one pass of
// its 8 warps (1, 2 or 4): a warp's columns then share one run over k and
// their reduce-scatters overlap, so the product's latency hardly grows with
// C. One column at a time, each pass cost ~0.35 us a step on an H100 at B1
// T32 H256 (bench/RESULTS.md, issue 30: 84 us a call at 8 units a block,
// 118 at 16, in run I; one pass, 64 and 84, in run S). Above, see
// gated_rnn_slice_product_above: a lane loads NB + CW registers for NB * CW
// multiply-adds a k.
template <int NB, int CW, bool kPermuted>
__device__ __forceinline__ void gated_rnn_slice_product(const float* __restrict__ x, int K, int nb,
                                                        const float* W, int C,
                                                        float* __restrict__ out, int ldo) {
  static_assert(NB * CW <= 64, "at most 64 accumulators a lane");
  const int warp = static_cast<int>(threadIdx.x >> 5);
  const int lane = static_cast<int>(threadIdx.x & 31);
  constexpr int kWarps = kGatedRnnThreads / 32;
  const bool vector4 =
      K % 4 == 0 && ((reinterpret_cast<uintptr_t>(x) | reinterpret_cast<uintptr_t>(W)) & 15) == 0;
  const int k128 = K / 128 * 128;
  // kPermuted: slot b of a lane's accumulators holds row b ^
  // gated_rnn_lane_row, so that the reduce-scatter needs no selects.
  const int lane_row = kPermuted ? gated_rnn_lane_row<NB>(lane) : 0;
  const auto row_at = [&](int b) { return (kPermuted ? b ^ lane_row : b) * K; };
  for (int c0 = warp * CW; c0 < C; c0 += kWarps * CW) {
    float acc[CW][NB];
#pragma unroll
    for (int j = 0; j < CW; ++j)
#pragma unroll
      for (int b = 0; b < NB; ++b) acc[j][b] = 0.0f;
    const float* wc = W + static_cast<int64_t>(c0) * K;
    // Four k a lane at a time (k = 4 lane + 128 i) where the rows are
    // 16-byte aligned, the rest one at a time: scalar loads made the
    // product a run of shared-memory instructions, 1.4 of a 3.0-us step at
    // B32 T64 H256 and 5.6 of 9.6 at B64 T256 H512 f32 (bench/RESULTS.md,
    // issue 30 run CK). Graphed, the LSTM f32 forward at B64 went from
    // 2652 to 2455 us, the LSTM bf16 two-layer forward at B32 from 425 to
    // 405 (runs CJ and CL).
    int k = lane;
    if (vector4) {
      for (int k4 = 4 * lane; k4 < k128; k4 += 128) {
        float4 w[CW];
#pragma unroll
        for (int j = 0; j < CW; ++j)
          w[j] = *reinterpret_cast<const float4*>(wc + static_cast<int64_t>(j) * K + k4);
#pragma unroll
        for (int b = 0; b < NB; ++b) {
          const float4 xv = *reinterpret_cast<const float4*>(x + row_at(b) + k4);
#pragma unroll
          for (int j = 0; j < CW; ++j) {
            acc[j][b] = fmaf(xv.x, w[j].x, acc[j][b]);
            acc[j][b] = fmaf(xv.y, w[j].y, acc[j][b]);
            acc[j][b] = fmaf(xv.z, w[j].z, acc[j][b]);
            acc[j][b] = fmaf(xv.w, w[j].w, acc[j][b]);
          }
        }
      }
      k = k128 + lane;
    }
    for (; k < K; k += 32) {
      float w[CW];
#pragma unroll
      for (int j = 0; j < CW; ++j) w[j] = wc[static_cast<int64_t>(j) * K + k];
#pragma unroll
      for (int b = 0; b < NB; ++b) {
        const float xv = x[row_at(b) + k];
#pragma unroll
        for (int j = 0; j < CW; ++j) acc[j][b] = fmaf(xv, w[j], acc[j][b]);
      }
    }
#pragma unroll
    for (int j = 0; j < CW; ++j)
      gated_rnn_reduce_scatter_store<NB, kPermuted>(acc[j], nb, out, ldo, c0 + j, lane);
  }
}

// The number of rows the product runs for nb live rows: the next power of
// two (x is staged with that many rows).
__device__ __forceinline__ int gated_rnn_product_rows(int nb) {
  return nb <= 1 ? 1 : nb <= 2 ? 2 : nb <= 4 ? 4 : nb <= 8 ? 8 : nb <= 16 ? 16 : 32;
}

template <int NB>
__device__ __forceinline__ void gated_rnn_slice_product_latency(const float* x, int K, int nb,
                                                                const float* W, int C, float* out,
                                                                int ldo) {
  constexpr int kWarps = kGatedRnnThreads / 32;
  if (C <= kWarps)
    gated_rnn_slice_product<NB, 1, false>(x, K, nb, W, C, out, ldo);
  else if (C <= 2 * kWarps)
    gated_rnn_slice_product<NB, 2, false>(x, K, nb, W, C, out, ldo);
  else
    gated_rnn_slice_product<NB, kGatedRnnColumnGroup, false>(x, K, nb, W, C, out, ldo);
}

// Above the latency path, 4 columns a warp (2 at 32 rows). With kWide, at
// 4 rows, the slots permuted (kPermuted) and, where C is a multiple of 8
// and 4 would take the 8 warps more than one pass over C, 8 columns a warp:
// each x a lane loads then feeds 8 products. Graph replay on an H200
// (bench/RESULTS.md, issue 30 runs CO and CP, against main in the same run),
// the forward at B32 T64 H256 (4 rows, 48 and 64 columns) took 4 to 9%
// less. At 8 and 16 rows neither paid: 8 columns a warp took 2.0% more at
// LSTM f32 B64 H512 (16 rows, run CM), the permuted slots with 4 columns
// 1.2% more (run CO).
template <int NB, bool kWide>
__device__ __forceinline__ void gated_rnn_slice_product_above(const float* x, int K, int nb,
                                                              const float* W, int C, float* out,
                                                              int ldo) {
  constexpr int kNarrow = NB <= 16 ? kGatedRnnColumnGroup : kGatedRnnColumnGroup / 2;
  if constexpr (NB == 4 && kWide) {
    if (C % (2 * kNarrow) == 0 && C > kNarrow * (kGatedRnnThreads / 32))
      gated_rnn_slice_product<NB, 2 * kNarrow, true>(x, K, nb, W, C, out, ldo);
    else
      gated_rnn_slice_product<NB, kNarrow, true>(x, K, nb, W, C, out, ldo);
  } else {
    gated_rnn_slice_product<NB, kNarrow, false>(x, K, nb, W, C, out, ldo);
  }
}

// rows: gated_rnn_product_rows's, at most kMaxRows. A kernel that never
// runs more rows leaves the larger forms out, and one without kWide the
// 4-row form of gated_rnn_slice_product_above: their code counts against
// the registers of the rest (the streamed forward, which reads W from
// global memory, spilled with 8 columns a warp; with pair words, whose tiles
// are 8 rows or more, the LSTM f32 forward at B64 T64 H512 took 3% more in
// run CP).
template <int kMaxRows, bool kWide>
__device__ __forceinline__ void gated_rnn_slice_product_rows(int rows, const float* x, int K,
                                                             int nb, const float* W, int C,
                                                             float* out, int ldo) {
  static_assert(kMaxRows == 4 || kMaxRows == 8 || kMaxRows == 16 || kMaxRows == 32,
                "kMaxRows is 4, 8, 16 or 32");
  constexpr int k8 = kMaxRows < 8 ? kMaxRows : 8, k16 = kMaxRows < 16 ? kMaxRows : 16;
  switch (rows) {
    case 1: gated_rnn_slice_product_latency<1>(x, K, nb, W, C, out, ldo); break;
    case 2: gated_rnn_slice_product_latency<2>(x, K, nb, W, C, out, ldo); break;
    case 4: gated_rnn_slice_product_above<4, kWide>(x, K, nb, W, C, out, ldo); break;
    case 8: gated_rnn_slice_product_above<k8, kWide>(x, K, nb, W, C, out, ldo); break;
    case 16: gated_rnn_slice_product_above<k16, kWide>(x, K, nb, W, C, out, ldo); break;
    default: gated_rnn_slice_product_above<kMaxRows, kWide>(x, K, nb, W, C, out, ldo); break;
  }
}

// ---------------------------------------------------------------------------
// The backward's slice product, the transpose: the block's part of
// grad_rh_s R^T, part[b, k] = sum_c g[c * NB + b] * W[c * K + k] for every
// k < K = H and b < nb (g, 16-byte aligned, holds NB rows, zeros past nb,
// and C columns, zeros past the live ones), each part handed to
// publish(b, k, value). A thread per KW values of k and NB / S rows: the S
// parts of a warp (lanes 32 / S apart) take the same k and their own rows,
// consecutive k on consecutive lanes of W (k, k + 256 / S, ...); NB / S x
// KW accumulators, c in increasing order: deterministic. The g reads are
// broadcasts, four rows at a time: one load of W and NB / 4S of g feed
// NB / S x KW products (a scalar load per product was this loop's bound at
// B64 H512). What shared memory returns to the lanes bounds the loop (one
// register a lane a cycle for the multiprocessor): KW + NB / S registers a
// thread for NB / S x KW multiply-adds a column, so from 16 rows the rows
// are split in two (S = 2) for twice the k a thread: at B64 H512 f32 (16
// rows, K 512), 12 registers for 32 products instead of 18. kPairs: rows b
// and b + 1 handed together, publish(b, k, row b's, row b + 1's) for even b
// (row b + 1's zero past NB).
template <int NB, int KW, int S, bool kPairs, class Publish>
__device__ __forceinline__ void gated_rnn_part_product(const float* __restrict__ g, int C,
                                                       const float* W, int K, int nb,
                                                       const Publish& publish) {
  static_assert(S == 1 || (S == 2 && NB >= 8), "rows split in two, four or more a part");
  constexpr int NR = NB / S;                       // rows a thread
  constexpr int kLanes = 32 / S;                   // lanes a part of a warp
  constexpr int kStride = kGatedRnnThreads / S;    // between a thread's k
  const int lane = static_cast<int>(threadIdx.x & 31);
  const int r0 = lane / kLanes * NR;
  for (int k0 = static_cast<int>(threadIdx.x >> 5) * kLanes + lane % kLanes; k0 < K;
       k0 += KW * kStride) {
    float acc[KW][NR];
#pragma unroll
    for (int j = 0; j < KW; ++j)
#pragma unroll
      for (int b = 0; b < NR; ++b) acc[j][b] = 0.0f;
#pragma unroll 2
    for (int c = 0; c < C; ++c) {
      float w[KW];
#pragma unroll
      for (int j = 0; j < KW; ++j) {
        const int k = k0 + j * kStride;
        w[j] = k < K ? W[static_cast<int64_t>(c) * K + k] : 0.0f;
      }
      float gv[NR];
      if constexpr (NR >= 4) {
        const float4* g4 = reinterpret_cast<const float4*>(g + c * NB + r0);
#pragma unroll
        for (int q = 0; q < NR / 4; ++q) {
          const float4 v = g4[q];
          gv[4 * q] = v.x;
          gv[4 * q + 1] = v.y;
          gv[4 * q + 2] = v.z;
          gv[4 * q + 3] = v.w;
        }
      } else {
#pragma unroll
        for (int b = 0; b < NR; ++b) gv[b] = g[c * NB + r0 + b];
      }
#pragma unroll
      for (int j = 0; j < KW; ++j)
#pragma unroll
        for (int b = 0; b < NR; ++b) acc[j][b] = fmaf(gv[b], w[j], acc[j][b]);
    }
#pragma unroll
    for (int j = 0; j < KW; ++j) {
      const int k = k0 + j * kStride;
      if constexpr (kPairs) {
#pragma unroll
        for (int b = 0; b < NR; b += 2)
          if (r0 + b < nb && k < K)
            publish(r0 + b, k, acc[j][b], r0 + b + 1 < NB ? acc[j][b + 1] : 0.0f);
      } else {
#pragma unroll
        for (int b = 0; b < NR; ++b)
          if (r0 + b < nb && k < K) publish(r0 + b, k, acc[j][b]);
      }
    }
  }
}

// From 16 rows where H > 128, rows split in two and four values of k a
// thread (two at 32 rows) where H > 256, two below; under 16 rows two
// values of k where H > 256, one below. At most 32 accumulators. Graph
// replay on an H200 (bench/RESULTS.md, issue 30 runs CO and CP, against
// main in the same run): the LSTM f32 backward at B64 T64 H512 (16 rows)
// took 2.0 to 2.1% less; the GRU's (8 rows) took 0.7% more with the split
// (run CO), which therefore starts at 16.
template <int NB, bool kPairs, class Publish>
__device__ __forceinline__ void gated_rnn_part_product_k(const float* g, int C, const float* W,
                                                         int K, int nb, const Publish& publish) {
  if constexpr (NB >= 16) {
    if (K > kGatedRnnThreads / 2) {
      constexpr int KW = NB <= 16 ? 4 : 2;
      // (At 32 rows both branches are <32, 2, 2>. Folding them into one
      // call changed the walks' code and cost them 1.4 to 1.8%: run CR.)
      if (K > kGatedRnnThreads)
        gated_rnn_part_product<NB, KW, 2, kPairs>(g, C, W, K, nb, publish);
      else
        gated_rnn_part_product<NB, 2, 2, kPairs>(g, C, W, K, nb, publish);
      return;
    }
  }
  if (NB <= 16 && K > kGatedRnnThreads)
    gated_rnn_part_product<NB, NB <= 16 ? 2 : 1, 1, kPairs>(g, C, W, K, nb, publish);
  else
    gated_rnn_part_product<NB, 1, 1, kPairs>(g, C, W, K, nb, publish);
}

template <bool kPairs = false, class Publish>
__device__ __forceinline__ void gated_rnn_part_product_rows(int rows, const float* g, int C,
                                                            const float* W, int K, int nb,
                                                            const Publish& publish) {
  switch (rows) {
    case 1: gated_rnn_part_product_k<1, kPairs>(g, C, W, K, nb, publish); break;
    case 2: gated_rnn_part_product_k<2, kPairs>(g, C, W, K, nb, publish); break;
    case 4: gated_rnn_part_product_k<4, kPairs>(g, C, W, K, nb, publish); break;
    case 8: gated_rnn_part_product_k<8, kPairs>(g, C, W, K, nb, publish); break;
    case 16: gated_rnn_part_product_k<16, kPairs>(g, C, W, K, nb, publish); break;
    default: gated_rnn_part_product_k<32, kPairs>(g, C, W, K, nb, publish); break;
  }
}

}  // namespace exphil::kernels
