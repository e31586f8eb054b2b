// Attention backward in one kernel for f32 up to d = 64, exact (FMAs) and
// tf32x3 (tensor cores): dK and dV as attention_dkdv_kernel computes them,
// and dQ in the same walk, so that the scores and dP are computed once
// instead of twice.
//
// Algorithm. A block takes 64 keys (16 per warp) of one (batch, key head)
// and walks, for each query head of the group, the 32-query tiles that can
// see its keys. Per tile, as in the dK/dV kernel, each warp forms P^T and
// dS^T for its keys (rows) and the tile's queries (columns; P^T and dP^T
// as one interleaved pair of products, a_smem_b_nk_pair) and adds
// P^T dO to dV and dS^T Q to dK. It then stores its dS^T in shared memory
// (FusedDs: transposed or not, as each contract reads it best), and after
// a barrier each warp multiplies one slice of the tile's dQ, 16 queries x
// d/2 columns, by all 64 keys: dQ_slice = scale dS K.
//
// Deterministic sums. A tile's dQ is the sum of the slices of every key
// block that sees it, added into dQ (f32, in place) in ascending key block
// order: the first stores its slice, each later one waits until the slice's
// counter says the block before it is done, adds and stores (L2 only,
// ld/st.cg), and counts one more. Every block walks its tiles from the last
// query down, and no key block's last tile comes before the previous key
// block's (under every mask): so the key block before this one meets each
// tile they share at the same step of its walk or an earlier one, and,
// having taken its ticket earlier, is usually done with the tile when this
// one needs it.
// No deadlock, whatever the grid and the GPU: blocks take their (key
// block, batch, key head) from a ticket counter in the order they start,
// key block the slowest index, so that every block a block waits for took
// an earlier ticket: it has started, holds its SM, and waits only for
// blocks with earlier tickets still. Key block 0 comes first, which is
// also the heaviest under a causal mask (block_coord()'s order).
// The rowsum kernel runs first: Di = rowsum(dO * O) for every row, and the
// counters zeroed. (Di computed instead by every block that visits a tile,
// from O rows loaded with it, saved that kernel's 3 us of 228 at B32 h8
// T256 d64 and cost 2 to 3% at T1024 and T2048 on an H200, bench/RESULTS.md.)
// Key block 0 zeroes dQ in the query tiles before its first, which see no
// key and which no block visits.
//
// Layout and limits as the forward (attention_forward.cuh); four-warp
// blocks only (each warp owns one of the tile's four dQ slices), and at
// most 2^32 of them (the tickets are 32-bit; the planner checks).
#pragma once

#include "attention/attention_backward.cuh"
#include "attention/attention_config.h"
#include "attention/attention_warp_mma_tf32x3.cuh"

namespace exphil::kernels {

namespace attn {
__device__ __forceinline__ uint32_t load_relaxed(const uint32_t* p) {
  uint32_t v;
  asm volatile("ld.relaxed.gpu.global.u32 %0, [%1];\n" : "=r"(v) : "l"(p) : "memory");
  return v;
}
__device__ __forceinline__ uint32_t load_acquire(const uint32_t* p) {
  uint32_t v;
  asm volatile("ld.acquire.gpu.global.u32 %0, [%1];\n" : "=r"(v) : "l"(p) : "memory");
  return v;
}
__device__ __forceinline__ void store_release(uint32_t* p, uint32_t v) {
  asm volatile("st.release.gpu.global.u32 [%0], %1;\n" ::"l"(p), "r"(v) : "memory");
}

// A warp's dQ slice of one query tile in the fused kernel, added into dQ in
// key block order: wait_turn(), then the slice's product (which hides the
// load of what the blocks before added), then add_and_pass().
// Rows at and past `valid` are skipped; `dst` is the slice's first column
// of row 0.
template <class Elem, int kDT>
struct DqSlice {
  float* dst;
  int64_t row_stride, row0, valid;
  uint32_t* counter;
  uint32_t turn;  // key blocks before this one that see the tile
  float before[kDT][4];

  // Waits until the `turn` blocks before this one have added their slices,
  // then starts loading their sum (from L2: other SMs wrote it).
  __device__ __forceinline__ void wait_turn() {
    if (turn == 0) return;
    // Polled relaxed, then read once with acquire (still `turn`: only this
    // slice's own add moves it on). Every acquiring load invalidates L1
    // (CCTL.IVALL), 3% of the kernel's warp samples when every poll
    // acquired; this way B32 h8 T256 d64 tf32x3 ran 1.5 us faster on an
    // H200 (bench/RESULTS.md).
    if (threadIdx.x % 32 == 0) {
      while (load_relaxed(counter) != turn) __nanosleep(32);
      (void)load_acquire(counter);
    }
    __syncwarp();
    const int g = FragmentLanes<Elem>::row(), t = FragmentLanes<Elem>::col();
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      const int64_t row = row0 + g + 8 * half;
      const float2* in = reinterpret_cast<const float2*>(dst + row * row_stride + 2 * t);
#pragma unroll
      for (int j = 0; j < kDT; ++j) {
        const float2 v = row < valid ? __ldcg(in + 4 * j) : make_float2(0.0f, 0.0f);
        before[j][2 * half] = v.x;
        before[j][2 * half + 1] = v.y;
      }
    }
  }

  // Stores the sum so far plus scale * c and counts this block in the
  // counter. The warp barrier orders every lane's stores before lane 0's
  // release (CUTLASS's semaphore does the same with a block barrier).
  __device__ __forceinline__ void add_and_pass(const float (&c)[kDT][4], float scale) {
    const int g = FragmentLanes<Elem>::row(), t = FragmentLanes<Elem>::col();
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      const int64_t row = row0 + g + 8 * half;
      if (row >= valid) continue;
      float2* out = reinterpret_cast<float2*>(dst + row * row_stride + 2 * t);
#pragma unroll
      for (int j = 0; j < kDT; ++j) {
        float2 v = make_float2(c[j][2 * half] * scale, c[j][2 * half + 1] * scale);
        if (turn != 0) {
          v.x += before[j][2 * half];
          v.y += before[j][2 * half + 1];
        }
        __stcg(out + 4 * j, v);
      }
    }
    __syncwarp();
    if (threadIdx.x % 32 == 0) store_release(counter, turn + 1);
  }
};

// How each f32 contract keeps a tile's dS in shared memory
// (attention_fused_ds_floats()) and multiplies a warp's dQ slice by it.
template <class Elem>
struct FusedDs;

// tf32x3: dS^T as the warps hold it, [keys][queries] (km_offset()), read
// transposed by a_smem_km_b_kn.
template <>
struct FusedDs<Tf32x3> {
  template <int kNT>
  __device__ __forceinline__ static void store(float* ds, const float (&dst)[kNT][4], int key0) {
    const int g = FragmentLanes<Tf32x3>::row(), t = FragmentLanes<Tf32x3>::col();
#pragma unroll
    for (int j = 0; j < kNT; ++j)
#pragma unroll
      for (int half = 0; half < 2; ++half)
        *reinterpret_cast<float2*>(ds + km_offset(key0 + g + 8 * half, 8 * j + 2 * t,
                                                  kAttnFusedDsStride)) =
            make_float2(dst[j][2 * half], dst[j][2 * half + 1]);
  }
  template <int kDT, int kKeys>
  __device__ __forceinline__ static void product(float (&c)[kDT][4], const float* ds, int row0,
                                                 const Tf32x3* k, int ldk) {
    WarpMma<Tf32x3>::template a_smem_km_b_kn<kDT, kKeys>(c, ds + row0, kAttnFusedDsStride, k,
                                                          ldk);
  }
};

// Exact f32: dS, [queries][keys], rows as a_smem_b_kn reads A. The
// transposing stores are scalar; lanes (g, t) of one store hit banks
// 8t + g + const (rows of 68 floats), all distinct.
template <>
struct FusedDs<float> {
  static constexpr int kStride = attention_scratch_stride(kAttnFusedKeys);
  template <int kNT>
  __device__ __forceinline__ static void store(float* ds, const float (&dst)[kNT][4], int key0) {
    const int g = FragmentLanes<float>::row(), t = FragmentLanes<float>::col();
#pragma unroll
    for (int j = 0; j < kNT; ++j)
#pragma unroll
      for (int e = 0; e < 4; ++e)
        ds[(8 * j + 2 * t + (e & 1)) * kStride + key0 + g + 8 * (e >> 1)] = dst[j][e];
  }
  template <int kDT, int kKeys>
  __device__ __forceinline__ static void product(float (&c)[kDT][4], const float* ds, int row0,
                                                 const float* k, int ldk) {
    WarpMma<float>::template a_smem_b_kn<kDT, kKeys>(c, ds + row0 * kStride, kStride, k, ldk);
  }
};
}  // namespace attn

template <class Elem, int kD>
__global__ void __launch_bounds__(kAttnFusedWarps * 32, 3)
    attention_backward_fused_kernel(const AttentionBackwardParams p, const float* d_rowdot,
                                    uint32_t* d_sync) {
  using namespace attn;
  static_assert(sizeof(Elem) == 4 && attention_fused_backward_head_dim(kD),
                "the fused backward is f32's (exact and tf32x3), up to d = 64");
  static_assert(kAttnFusedQueryTile == attention_query_tile(attention_storage<Elem>, kD) &&
                    attention_stages(sizeof(Elem)) == 1,
                "the fused kernel's tiles and shared memory are the f32 dK/dV kernel's");
  constexpr int kQT = kAttnFusedQueryTile;
  constexpr int kNT = kQT / 8;
  constexpr int kDT = kD / 8;
  constexpr int kSliceDT = kDT / 2;  // a warp's dQ slice: d / 2 columns
  constexpr int kLd = attention_row_stride(sizeof(Elem), kD);
  constexpr int kRows = kAttnFusedKeys;
  const AttentionProblem& pr = p.problem;
  const int warp = threadIdx.x / 32;

  extern __shared__ __align__(16) unsigned char smem[];
  Elem* k_s = reinterpret_cast<Elem*>(smem);
  Elem* v_s = k_s + kRows * kLd;
  Elem* q_s = v_s + kRows * kLd;
  Elem* do_s = q_s + kQT * kLd;
  float* lse_s = reinterpret_cast<float*>(do_s + kQT * kLd);
  float* dot_s = lse_s + kQT;
  // Exact f32's per-warp staging (none for tf32x3), then the tile's dS.
  float* scratch = dot_s + kQT + warp * kAttnRowsPerWarp * attention_scratch_stride(kQT);
  float* ds_s = dot_s + kQT + attention_scratch_bytes(attention_storage<Elem>, kAttnFusedWarps, kQT) /
                                  sizeof(float);
  __shared__ uint32_t ticket_s;

  // Launched as a dependent of the rowsum kernel: nothing of its output,
  // the counters included, is read before it has finished.
  wait_for_prior_grid();
  if (threadIdx.x == 0) ticket_s = atomicAdd(d_sync, 1u);
  __syncthreads();
  // Tickets in start order; the grid is (key blocks, key heads, batch).
  const uint32_t groups = gridDim.y * gridDim.z;
  const uint32_t key_block = ticket_s / groups, group = ticket_s - key_block * groups;
  const int64_t b = group / gridDim.y, kv_head = group % gridDim.y;
  uint32_t* counters = d_sync + 1;

  const int64_t T = pr.shape.q_len, S = pr.shape.kv_len;
  const int64_t group_heads = pr.shape.q_heads / pr.shape.kv_heads;
  const int64_t q_tiles = (T + kQT - 1) / kQT;
  const int64_t key0 = int64_t{key_block} * kRows;
  const KeyRange keys = KeyRange::of(pr);
  const int64_t q_row = pr.q_strides.row, kv_row = pr.kv_strides.row;

  // The walk: for each query head of the group, the query tiles (aligned to
  // kQT, so that every key block's slices of a tile coincide) that see any
  // of the block's keys, last first.
  const int64_t q_begin = keys.first_query(key0);
  const int64_t q_end = keys.end_query(min(key0 + kRows, S), T);
  const int64_t tile_lo = q_begin / kQT;
  const int64_t tiles_per_head = q_end > q_begin ? (q_end - 1) / kQT - tile_lo + 1 : 0;
  const int64_t tiles = group_heads * tiles_per_head;
  // A tile of the walk, (query head, first row), stepped back without
  // divisions.
  struct Tile {
    int64_t h, i0;
  };
  const int64_t first_row = tile_lo * kQT, last_row = (tile_lo + tiles_per_head - 1) * kQT;
  auto previous = [&](Tile x) {
    return x.i0 == first_row ? Tile{x.h - 1, last_row} : Tile{x.h, x.i0 - kQT};
  };
  auto load_tile = [&](Tile x) {
    const int64_t h = x.h, i0 = x.i0;
    load_rows_async<Elem, kD>(q_s, kLd, head_rows<Elem>(p.d_q, pr.q_strides, b, h) + i0 * q_row,
                              q_row, kQT, T - i0);
    load_rows_async<Elem, kD>(do_s, kLd,
                              head_rows<Elem>(p.d_grad_o, pr.q_strides, b, h) + i0 * q_row, q_row,
                              kQT, T - i0);
    const int64_t stats = (b * pr.shape.q_heads + h) * T + i0;
    load_floats_async(lse_s, p.d_lse + stats, kQT, T - i0);
    load_floats_async(dot_s, d_rowdot + stats, kQT, T - i0);
  };

  // Query tiles before key block 0's first see no key: its blocks zero
  // their dQ rows.
  if (key_block == 0) {
    const int64_t unseen = min(tile_lo * kQT, T);
    for (int64_t hh = 0; hh < group_heads; ++hh) {
      float* dq = reinterpret_cast<float*>(
          head_rows<Elem>(p.d_grad_q, pr.q_strides, b, kv_head * group_heads + hh));
      for (int64_t idx = threadIdx.x; idx < unseen * (kD / 4); idx += blockDim.x)
        reinterpret_cast<float4*>(dq + (idx / (kD / 4)) * q_row)[idx % (kD / 4)] =
            make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    }
  }

  load_rows_async<Elem, kD>(k_s, kLd, head_rows<Elem>(p.d_k, pr.kv_strides, b, kv_head) + key0 * kv_row,
                            kv_row, kRows, S - key0);
  load_rows_async<Elem, kD>(v_s, kLd, head_rows<Elem>(p.d_v, pr.kv_strides, b, kv_head) + key0 * kv_row,
                            kv_row, kRows, S - key0);
  Tile at{kv_head * group_heads + group_heads - 1, last_row};
  if (tiles > 0) load_tile(at);
  cp_async_commit();

  const WarpKeys wk = warp_keys<Elem>(key0 + kAttnRowsPerWarp * warp, keys, S, T);
  const float scale_log2 = pr.scale * kLog2e;
  // This warp's dQ slice of every tile: 16 queries from slice_row, d / 2
  // columns from slice_col.
  const int slice_row = kAttnRowsPerWarp * (warp & 1), slice_col = (kD / 2) * (warp >> 1);

  float dk[kDT][4] = {}, dv[kDT][4] = {};
  for (int64_t n = tiles - 1; n >= 0; --n, at = previous(at)) {
    cp_async_wait<0>();
    __syncthreads();  // the tile has landed; every warp is done with dS^T
    const int64_t h = at.h, i0 = at.i0;
    // Transposed scores: rows are this warp's keys, columns the tile's
    // queries. A warp none of whose keys the tile sees leaves dS^T zero.
    float pt[kNT][4] = {}, dpt[kNT][4] = {};
    if (i0 < wk.q_end && i0 + kQT > wk.q_begin) {
      WarpMma<Elem>::template a_smem_b_nk_pair<kNT, kD>(
          pt, dpt, k_s + kAttnRowsPerWarp * warp * kLd, v_s + kAttnRowsPerWarp * warp * kLd, kLd,
          q_s, do_s, kLd);
      dkdv_tile_scores<Elem>(pt, dpt, wk, i0, scale_log2, lse_s, dot_s);
      WarpMma<Elem>::template a_frag_b_kn<kDT, kQT>(dv, pt, do_s, kLd, scratch);
      WarpMma<Elem>::template a_frag_b_kn<kDT, kQT>(dk, dpt, q_s, kLd, scratch);
    }
    FusedDs<Elem>::template store<kNT>(ds_s, dpt, kAttnRowsPerWarp * warp);
    __syncthreads();  // dS is whole; Q, dO and the row values are free
    if (n > 0) {
      load_tile(previous(at));  // lands while this tile's dQ is computed
      cp_async_commit();
    }
    const int64_t tile = (b * pr.shape.q_heads + h) * q_tiles + i0 / kQT;
    DqSlice<Elem, kSliceDT> slice{
        reinterpret_cast<float*>(head_rows<Elem>(p.d_grad_q, pr.q_strides, b, h)) + slice_col,
        q_row,
        i0 + slice_row,
        T,
        counters + tile * kAttnFusedWarps + warp,
        key_block - static_cast<uint32_t>(keys.lo(i0) / kRows)};
    slice.wait_turn();
    float dq[kSliceDT][4] = {};
    FusedDs<Elem>::template product<kSliceDT, kRows>(dq, ds_s, slice_row, k_s + slice_col, kLd);
    slice.add_and_pass(dq, pr.scale);
  }
  cp_async_wait<0>();

  if (!wk.any) return;
  store_key_grads<Elem, kDT>(p, b, kv_head, kv_row, S, wk.key0, dk, dv);
}

}  // namespace exphil::kernels
