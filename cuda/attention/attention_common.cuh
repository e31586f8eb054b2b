// Device helpers shared by the attention kernels: which keys a query row
// sees, where a (batch, head) starts, and tile loads into shared memory.
#pragma once

#include <cstdint>
#include <type_traits>

#include "attention/attention_config.h"
#include "attention/attention_fragment.cuh"
#include "attention/attention_params.h"
#include "common/cp_async.cuh"
#include "common/dtype.cuh"
#include "common/fast_exp2.cuh"

namespace exphil::kernels {
// What shapes Elem's tiles and shared memory (attention_config.h).
template <class Elem>
constexpr AttentionStorage attention_storage{sizeof(Elem), std::is_same_v<Elem, Tf32x3>};
}  // namespace exphil::kernels

namespace exphil::kernels::attn {

constexpr float kLog2e = 1.4426950408889634f;
constexpr float kLn2 = 0.6931471805599453f;

// The keys visible from each query row: row i sees [lo(i), hi(i)).
struct KeyRange {
  int64_t kv_len = 0, offset = 0, window = 0;  // offset = S - T
  AttentionMaskKind mask = AttentionMaskKind::none;

  __host__ __device__ static KeyRange of(const AttentionProblem& p) {
    KeyRange r;
    r.kv_len = p.shape.kv_len;
    r.offset = p.shape.kv_len - p.shape.q_len;
    r.window = p.window;
    r.mask = p.mask;
    return r;
  }
  __device__ int64_t lo(int64_t i) const {
    if (mask != AttentionMaskKind::window) return 0;
    const int64_t l = i + offset - window + 1;
    return l > 0 ? l : 0;
  }
  __device__ int64_t hi(int64_t i) const {
    if (mask == AttentionMaskKind::none) return kv_len;
    const int64_t h = i + offset + 1;
    return h < kv_len ? (h > 0 ? h : 0) : kv_len;
  }
  // The query rows, within [0, q_len), that see any key of [k0, k1).
  __device__ int64_t first_query(int64_t k0) const {
    if (mask == AttentionMaskKind::none) return 0;
    const int64_t q = k0 - offset;
    return q > 0 ? q : 0;
  }
  __device__ int64_t end_query(int64_t k1, int64_t q_len) const {
    if (mask != AttentionMaskKind::window) return q_len;
    const int64_t q = k1 - 1 - offset + window;
    return q < q_len ? q : q_len;
  }
};

// The columns [lo, hi) of a score tile whose first column is `tile0` that
// fall in [range_lo, range_hi): what one fragment row sees of the tile.
struct TileSpan {
  int lo, hi;
};
__device__ __forceinline__ TileSpan tile_span(int64_t range_lo, int64_t range_hi, int64_t tile0,
                                              int tile) {
  const int64_t l = range_lo - tile0, h = range_hi - tile0;
  return {static_cast<int>(l < 0 ? 0 : (l > tile ? tile : l)),
          static_cast<int>(h < 0 ? 0 : (h > tile ? tile : h))};
}
// True when every row of the warp sees the whole tile, so that its scores
// need no mask: most tiles of long sequences. Warp-uniform.
__device__ __forceinline__ bool warp_sees_whole_tile(const TileSpan (&span)[2], int tile) {
  return __all_sync(0xffffffffu, span[0].lo == 0 && span[0].hi == tile && span[1].lo == 0 &&
                                     span[1].hi == tile);
}
// Whether fragment element e of 8-column tile j (C layout) is in its row's
// span: col - lo < hi - lo as unsigned, one compare that callers turn into
// a select. (Written as col >= lo && col < hi, and or-ed with a tile-wide
// flag, it compiled to a branch per score, with the fragment copied around
// each: the Hopper forward's masked tile cost more than two whole ones.)
template <class Elem>
__device__ __forceinline__ bool in_span(const TileSpan (&span)[2], int j, int e) {
  const int col = 8 * j + 2 * FragmentLanes<Elem>::col() + (e & 1);
  const TileSpan& r = span[e >> 1];
  return static_cast<unsigned>(col - r.lo) < static_cast<unsigned>(max(r.hi - r.lo, 0));
}

// The (row block, head, batch) a block computes. The grid is (row blocks,
// heads, batch) and blocks start in order of their linear index. Under a
// mask the row blocks' work differs (by up to T / rows key tiles under a
// causal one), and in grid order every head's heaviest block is mixed in
// with light ones, so a few long blocks can run alone at the end of the
// grid. With `heaviest_first` (the plan's choice) the rank of the row block
// becomes the slowest index instead and the heaviest rank of every head
// starts first (longest-processing-time-first list scheduling), which
// leaves the lightest blocks for the tail. `heavy_last_row`: the last row
// blocks are the heaviest (queries under a bottom-right mask), else the
// first (keys). The planner sets `heaviest_first` only for grids of at most
// 2^32 blocks, so the renumbering fits 32-bit arithmetic (a 64-bit division
// is a call of dozens of instructions).
struct BlockCoord {
  int64_t row_block, head, batch;
};
__device__ __forceinline__ BlockCoord block_coord(bool heaviest_first, bool heavy_last_row) {
  if (!heaviest_first) return {blockIdx.x, blockIdx.y, blockIdx.z};
  const uint32_t row_blocks = gridDim.x, heads = gridDim.y, groups = heads * gridDim.z;
  const uint32_t linear = blockIdx.x + row_blocks * (blockIdx.y + heads * blockIdx.z);
  const uint32_t rank = linear / groups, group = linear - rank * groups;
  return {heavy_last_row ? row_blocks - 1 - rank : rank, group % heads, group / heads};
}

template <class Elem>
__device__ __forceinline__ const Elem* head_rows(const void* base, const AttentionStrides& s,
                                                 int64_t b, int64_t h) {
  return static_cast<const Elem*>(base) + b * s.batch + h * s.head;
}
template <class Elem>
__device__ __forceinline__ Elem* head_rows(void* base, const AttentionStrides& s, int64_t b,
                                           int64_t h) {
  return static_cast<Elem*>(base) + b * s.batch + h * s.head;
}

// A block of the Hopper kernels over query rows (the forward and dQ
// kernels): its (batch, query head), its first row, the keys [k_begin,
// k_end) that any of its `rows` rows sees, and the rows of the K and V head
// it reads. The sm_80 kernels spell the same prologue out: folded into a
// helper, their f32 instances took other registers and spills, and their
// timings were not measured that way.
template <class Elem>
struct QueryBlock {
  int64_t batch, head, row0, k_begin, k_end;
  const Elem* d_k;
  const Elem* d_v;
};
template <class Elem>
__device__ __forceinline__ QueryBlock<Elem> query_block(const AttentionProblem& pr,
                                                        const void* d_k, const void* d_v,
                                                        int rows, bool heaviest_first) {
  const BlockCoord at = block_coord(heaviest_first, true);
  const int64_t b = at.batch, h = at.head;
  // In 32 bits (heads are at most 65535, the grid's y extent): a 64-bit
  // division is dozens of instructions, which every warp would issue.
  const int64_t kv_head = static_cast<uint32_t>(h) / (static_cast<uint32_t>(pr.shape.q_heads) /
                                                      static_cast<uint32_t>(pr.shape.kv_heads));
  const int64_t row0 = at.row_block * rows;
  const KeyRange keys = KeyRange::of(pr);
  const int64_t block_last = min(row0 + rows, pr.shape.q_len) - 1;
  return {b,
          h,
          row0,
          keys.lo(row0),
          keys.hi(block_last),
          head_rows<Elem>(d_k, pr.kv_strides, b, kv_head),
          head_rows<Elem>(d_v, pr.kv_strides, b, kv_head)};
}

// The first of this warp's 16 rows in a block of rows from block_row0.
__device__ __forceinline__ int64_t warp_first_row(int64_t block_row0) {
  return block_row0 + kAttnRowsPerWarp * static_cast<int>(threadIdx.x / 32);
}
// A warp's rows (16 from row0) and, for this thread's two fragment rows
// (g and g + 8), the keys [lo, hi) each sees: the Hopper forward's and dQ
// kernels' (the sm_80 kernels spell it out; folded in, their code changed,
// untimed).
struct WarpRows {
  int64_t row0;
  int64_t lo[2], hi[2];
};
template <class Elem>
__device__ __forceinline__ WarpRows warp_rows(int64_t row0, const KeyRange& keys) {
  const int64_t r = row0 + FragmentLanes<Elem>::row();
  return {row0, {keys.lo(r), keys.lo(r + 8)}, {keys.hi(r), keys.hi(r + 8)}};
}

// Starts copying rows [0, rows) of width kD from `src` (row stride in
// elements) to shared memory (row stride ld) with cp.async, rows at and past
// `valid` as zeros (a zero-byte source fills the 16 bytes with zeros), in
// 16-byte vectors spread over the block's threads. The caller commits and
// waits.
//
// Blocks are whole warps, so where a row's 16-byte chunks divide the warp
// (every width but 96) a thread copies the same chunk of every row it takes,
// rows r0, r0 + step, ...: one offset and one shared address advanced per
// row, a few instructions per copy. The loop over flat indices (a division
// and a 64-bit product per copy) took a quarter of the tf32x3 forward's warp
// samples and a tenth of the fused backward's at B32 h8 T256 d64 on an H200;
// stepping rows made that forward 59.5 -> 55.8 us (bench/RESULTS.md). It
// keeps a few more values live, though: kLean keeps the flat loop, for
// kernels capped at 128 registers where the stepping spilled (the f16/bf16
// sm_80 forward up to d = 64).
template <class Elem, int kD, bool kLean = false>
__device__ __forceinline__ void load_rows_async(Elem* dst, int ld, const Elem* src,
                                                int64_t row_stride, int rows, int64_t valid) {
  constexpr int kVec = 16 / sizeof(Elem);
  constexpr int kChunks = kD / kVec;
  if constexpr (32 % kChunks == 0 && !kLean) {
    // The thread index is read afresh (volatile) so that the compiler
    // recomputes the few values below at each call rather than keeping them
    // live across the callers' loops: hoisted, they cost the kernels up to
    // 50 registers and spills.
    uint32_t tid;
    asm volatile("mov.u32 %0, %%tid.x;\n" : "=r"(tid));
    const int step = blockDim.x / kChunks;
    const int c = static_cast<int>(tid % kChunks) * kVec;
    int r = static_cast<int>(tid / kChunks);
    uint32_t to = static_cast<uint32_t>(__cvta_generic_to_shared(dst + r * ld + c));
    const uint32_t to_step = static_cast<uint32_t>(step * ld * sizeof(Elem));
    const int live = static_cast<int>(valid < rows ? (valid > 0 ? valid : 0) : rows);
    int64_t from = r * row_stride + c;
    const int64_t from_step = step * row_stride;
    // Two rows a pass, each with addresses of its own: a copy's operand
    // registers stay busy until the copy has read them, and advancing the
    // one address in place waited on that (the forward's copy loops'
    // largest stall).
    for (; r + step < live; r += 2 * step) {
      const uint32_t to2 = to + to_step;
      const int64_t from2 = from + from_step;
      asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(to), "l"(src + from));
      asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(to2), "l"(src + from2));
      to = to2 + to_step;
      from = from2 + from_step;
    }
    if (r < live) {
      asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(to), "l"(src + from));
      r += step;
      to += to_step;
    }
    for (; r < rows; r += step, to += to_step)
      asm volatile("cp.async.cg.shared.global [%0], [%1], 16, 0;\n" ::"r"(to), "l"(src));
  } else {
    // Unsigned, so that the division and remainder are a shift and a mask.
    for (unsigned idx = threadIdx.x; idx < static_cast<unsigned>(rows * kChunks);
         idx += blockDim.x) {
      const unsigned r = idx / kChunks, c = (idx % kChunks) * kVec;
      const bool in = r < valid;
      const Elem* from = in ? src + static_cast<int64_t>(r) * row_stride + c : src;
      asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(
                       static_cast<uint32_t>(__cvta_generic_to_shared(dst + r * ld + c))),
                   "l"(from), "r"(in ? 16 : 0));
    }
  }
}

// The K/V stream of the forward and dQ kernels: calls use(k0, stage) for
// each tile of kKT keys from k_begin to k_end, once the tile (in shared
// memory stage `stage`) is visible to every warp, and refills a stage only
// after every warp is done with it. With two stages the next tile's copy
// starts before this one is waited for; with one, a tile's copy starts as
// the previous tile's use ends (the first tile's went out with the
// prologue). load_kv(k0, stage) starts the copies of one tile.
template <int kStages, class LoadKv, class UseTile>
__device__ __forceinline__ void stream_kv_tiles(int64_t k_begin, int64_t k_end, int kKT,
                                                LoadKv&& load_kv, UseTile&& use) {
  int stage = 0;
  for (int64_t k0 = k_begin; k0 < k_end; k0 += kKT, stage = kStages == 1 ? 0 : stage ^ 1) {
    if constexpr (kStages == 2) {
      if (k0 + kKT < k_end) load_kv(k0 + kKT, stage ^ 1);
      cp_async_commit();
      cp_async_wait<1>();
    } else {
      if (k0 != k_begin) {
        load_kv(k0, 0);
        cp_async_commit();
      }
      cp_async_wait<0>();
    }
    __syncthreads();
    use(k0, stage);
    __syncthreads();  // every warp is done with this stage before it is refilled
  }
}

// Starts copying floats [0, n) of `src` to shared memory with 4-byte
// cp.async, those at and past `valid` as zeros, one per thread. The caller
// commits and waits.
__device__ __forceinline__ void load_floats_async(float* dst, const float* src, int n,
                                                  int64_t valid) {
  for (int i = threadIdx.x; i < n; i += blockDim.x) {
    const bool in = i < valid;
    asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;\n" ::"r"(
                     static_cast<uint32_t>(__cvta_generic_to_shared(dst + i))),
                 "l"(in ? src + i : src), "r"(in ? 4 : 0));
  }
}

// Stores a 16 x kD fragment (C layout, see attention_warp_mma.cuh) of rows
// row0.. to global memory, scaled by `scale[0]` for row g and `scale[1]`
// for row g + 8, skipping rows at and past `valid`.
template <class Elem, int kDT>
__device__ __forceinline__ void store_fragment(Elem* dst, int64_t row_stride, int64_t row0,
                                               int64_t valid, const float (&c)[kDT][4],
                                               const float (&scale)[2]) {
  const int g = FragmentLanes<Elem>::row(), t = FragmentLanes<Elem>::col();
#pragma unroll
  for (int half = 0; half < 2; ++half) {
    const int64_t row = row0 + g + 8 * half;
    if (row >= valid) continue;
    Elem* out = dst + row * row_stride + 2 * t;
#pragma unroll
    for (int j = 0; j < kDT; ++j) {
      const float x = c[j][2 * half] * scale[half], y = c[j][2 * half + 1] * scale[half];
      if constexpr (sizeof(Elem) == 4) {
        *reinterpret_cast<float2*>(out + 8 * j) = make_float2(x, y);
      } else {
        Elem pair[2] = {from_float<Elem>(x), from_float<Elem>(y)};
        *reinterpret_cast<uint32_t*>(out + 8 * j) = *reinterpret_cast<const uint32_t*>(pair);
      }
    }
  }
}

// out[half] = op over this thread's elements of fragment row `half`
// (elements 2 half and 2 half + 1 of every 8-column tile), as a tree, so
// that its dependency chain is log2(2 kNT) deep rather than 2 kNT.
template <int kNT, class Op>
__device__ __forceinline__ void fragment_row_reduce(const float (&c)[kNT][4], float (&out)[2],
                                                    Op op) {
  static_assert((kNT & (kNT - 1)) == 0, "tiles per fragment must be a power of two");
  float a[kNT][2];
#pragma unroll
  for (int j = 0; j < kNT; ++j) {
    a[j][0] = op(c[j][0], c[j][1]);
    a[j][1] = op(c[j][2], c[j][3]);
  }
#pragma unroll
  for (int w = kNT / 2; w > 0; w /= 2)
#pragma unroll
    for (int j = 0; j < w; ++j) {
      a[j][0] = op(a[j][0], a[j + w][0]);
      a[j][1] = op(a[j][1], a[j + w][1]);
    }
  out[0] = a[0][0];
  out[1] = a[0][1];
}

}  // namespace exphil::kernels::attn
