// Tile sizes and shared-memory footprints of the attention kernels, visible
// to the host planner (no device code).
//
// Each warp owns 16 rows. Shared-memory rows are padded by 16 bytes so that
// the eight rows one ldmatrix (or one quarter-warp of float4 loads) touches
// fall in distinct banks for every supported head width.
#pragma once

#include <cstddef>
#include <cstdint>

// The sizes below are used by the planner (host) and the kernels (device).
#if defined(__CUDACC__)
#define EXPHIL_ATTN_HD __host__ __device__
#else
#define EXPHIL_ATTN_HD
#endif

namespace exphil::kernels {

// What shapes a call's tiles and shared memory besides the head width: its
// elements' size and, for f32, whether its products run on tensor cores
// (tf32x3: AttentionPrecision::tf32x3, attention_warp_mma_tf32x3.cuh),
// which stage nothing per warp and take wider key tiles. Built implicitly
// from an element size for every other call.
struct AttentionStorage {
  std::size_t elem_bytes;
  bool tf32x3;
  EXPHIL_ATTN_HD constexpr AttentionStorage(std::size_t bytes, bool tensor_core_f32 = false)
      : elem_bytes(bytes), tf32x3(tensor_core_f32) {}
};

constexpr int kAttnRowsPerWarp = 16;
constexpr int kAttnMaxWarps = 4;
// Within what every target GPU allows per block (99 KB on sm_86/sm_89).
constexpr int kAttnMaxSharedBytes = 96 * 1024;

EXPHIL_ATTN_HD constexpr bool attention_head_dim_supported(int d) {
  return d == 32 || d == 64 || d == 96 || d == 128;
}

// Blocks of `warps` warps that cover `len` rows: a kernel's grid x extent.
EXPHIL_ATTN_HD constexpr int64_t attention_row_blocks(int64_t len, int warps) {
  const int64_t rows = int64_t{kAttnRowsPerWarp} * warps;
  return (len + rows - 1) / rows;
}

// The rowsum kernel's blocks (attention_rowdot_kernel): threads, the groups
// of rows each warp loads before it sums any, and the blocks an SM holds.
// Two groups fit 32 registers, so that eight blocks share an SM (B32 h8
// T256 d64 in f32: 2048 blocks, 1.9 waves); four groups (40 registers, six
// blocks, 1024 blocks in 1.3 waves) took forward + backward there 1.7 to
// 2.4 us longer on an H200 (bench/RESULTS.md).
constexpr int kAttnRowdotThreads = 256;
constexpr int kAttnRowdotPasses = 2;
constexpr int kAttnRowdotMinBlocks = 8;  // on an SM of 2048 threads (sm_80, sm_90)

// Minimum resident blocks per SM the kernels are compiled for, which caps
// their registers. f16/bf16 up to d = 64 fit 128 registers (a few spilled
// bytes at most), so that four 4-warp blocks share an SM: measured faster
// than three without spills. Otherwise 0, no minimum, the compiler's own
// choice: a cap of four makes the f32 kernels at d = 64 spill, and their
// dK/dV kernel ran faster uncapped (168 registers).
EXPHIL_ATTN_HD constexpr int attention_min_blocks(std::size_t elem_bytes, int head_dim) {
  return elem_bytes == 2 && head_dim <= 64 ? 4 : 0;
}
// The forward's, which also caps tf32x3 up to d = 64 at four blocks: its
// kernel fits 127 registers without spilling since it waits for K and V
// apart, and B32 h8 T256 d64 ran 56.0 -> 54.0 us, B4 h8 T2048 304 -> 296,
// on an H200 (d = 32 and T128 0.2 to 0.5 us slower; bench/RESULTS.md).
EXPHIL_ATTN_HD constexpr int attention_forward_min_blocks(AttentionStorage s, int head_dim) {
  return s.tf32x3 && head_dim <= 64 ? 4 : attention_min_blocks(s.elem_bytes, head_dim);
}

// Keys per step of the forward's and the dQ kernel's loops. f32 tiles are
// narrower because their elements take twice the shared memory, except
// tf32x3's up to d = 64, which have the staging buffer's room: 64 keys made
// its B32 h8 T256 d64 causal forward 66.3 -> 62.8 us and B8 h8 T1024
// 195.8 -> 183.8 us on an H100, where exact f32 lost 3% (bench/RESULTS.md).
EXPHIL_ATTN_HD constexpr int attention_key_tile(AttentionStorage s, int head_dim) {
  return s.elem_bytes != 4 || (s.tf32x3 && head_dim <= 64) ? 64 : 32;
}
// The tile a call uses: calls with 64-key tiles (f16/bf16, tf32x3 up to
// d = 64) that see at most kAttnShortKeys keys (the per-frame inference
// shapes, S = 32) take 32-key tiles, since a 64-key tile would be half
// empty. A shorter tile's shared memory is smaller, so plans sized with
// attention_key_tile(s, d) always fit.
constexpr int kAttnShortKeys = 32;
EXPHIL_ATTN_HD constexpr int attention_key_tile(AttentionStorage s, int head_dim,
                                                long long kv_len) {
  const int tile = attention_key_tile(s, head_dim);
  return kv_len <= kAttnShortKeys && tile > kAttnShortKeys ? kAttnShortKeys : tile;
}

// Query rows per step of the dK/dV kernel's loop: its registers hold dK and
// dV (d floats per thread) plus two 16 x tile score fragments, so a narrow
// tile leaves room for more resident warps.
EXPHIL_ATTN_HD constexpr int attention_query_tile(AttentionStorage /*s*/, int /*head_dim*/) {
  return 32;
}

// Elements per padded shared-memory row of head width d.
EXPHIL_ATTN_HD constexpr int attention_row_stride(std::size_t elem_bytes, int head_dim) {
  return head_dim + static_cast<int>(16 / elem_bytes);
}

// Elements per shared-memory row of the forward's Q and K tiles: tf32x3
// reads them with 8-byte loads (WarpMma<Tf32x3>::a_held_b_nk), which rows
// of d + 8 floats keep conflict-free; V keeps attention_row_stride().
EXPHIL_ATTN_HD constexpr int attention_forward_qk_stride(AttentionStorage s, int head_dim) {
  return s.tf32x3 ? head_dim + 8 : attention_row_stride(s.elem_bytes, head_dim);
}

// Exact f32 only: per-warp staging of a 16 x k score fragment in shared memory,
// rows padded by 4 floats so that neither the float2 stores of a half-warp
// nor the float4 row loads (8 rows) conflict, in f32's lane numbering.
EXPHIL_ATTN_HD constexpr int attention_scratch_stride(int k) { return k + 4; }
EXPHIL_ATTN_HD constexpr std::size_t attention_scratch_bytes(AttentionStorage s, int warps,
                                                             int k) {
  return s.elem_bytes == 4 && !s.tf32x3 ? static_cast<std::size_t>(warps) * kAttnRowsPerWarp *
                                              attention_scratch_stride(k) * sizeof(float)
                                        : 0;
}

EXPHIL_ATTN_HD constexpr std::size_t attention_rows_bytes(std::size_t elem_bytes, int head_dim,
                                                          int rows) {
  return static_cast<std::size_t>(rows) * attention_row_stride(elem_bytes, head_dim) * elem_bytes;
}

// Streamed tiles are double-buffered for f16/bf16: the next tile's copy
// (cp.async) overlaps the current tile's products. f32 keeps one buffer, so
// that its twice-as-large tiles still leave room for 2 to 4 warps.
EXPHIL_ATTN_HD constexpr int attention_stages(std::size_t elem_bytes) {
  return elem_bytes == 4 ? 1 : 2;
}

// Q of the block's rows, the K and V tiles of every stage, the f32 staging;
// for key tiles of kt keys (attention_key_tile(s, head_dim) when omitted).
EXPHIL_ATTN_HD constexpr std::size_t attention_forward_shared_bytes(AttentionStorage s,
                                                                    int head_dim, int warps,
                                                                    int kt) {
  const int qk_rows = kAttnRowsPerWarp * warps + kt * attention_stages(s.elem_bytes);
  return static_cast<std::size_t>(qk_rows) * attention_forward_qk_stride(s, head_dim) *
             s.elem_bytes +
         attention_rows_bytes(s.elem_bytes, head_dim, kt * attention_stages(s.elem_bytes)) +
         attention_scratch_bytes(s, warps, kt);
}
EXPHIL_ATTN_HD constexpr std::size_t attention_forward_shared_bytes(AttentionStorage s,
                                                                    int head_dim, int warps) {
  return attention_forward_shared_bytes(s, head_dim, warps, attention_key_tile(s, head_dim));
}

// The Hopper forward (attention_forward_wgmma.cuh): one warpgroup of 64
// query rows per block, 64-key tiles double-buffered, for f16 and bf16 at
// d = 64 and 128. Four blocks per SM at d = 64 (42 KB of shared memory,
// at most 128 registers), two at d = 128.
constexpr int kAttnWgmmaRows = 64;
constexpr int kAttnWgmmaKeyTile = 64;
constexpr int kAttnWgmmaThreads = 128;
static_assert(kAttnWgmmaRows == kAttnRowsPerWarp * kAttnWgmmaThreads / 32,
              "a warpgroup's warps own 16 rows each");
EXPHIL_ATTN_HD constexpr bool attention_wgmma_head_dim(int d) { return d == 64 || d == 128; }
EXPHIL_ATTN_HD constexpr int attention_wgmma_min_blocks(int head_dim) {
  return head_dim <= 64 ? 4 : 2;
}
// A Hopper kernel's shared memory: `rows` rows of head_dim elements and
// `floats` floats, plus 1 KiB so that the kernel can start its tiles on a
// 1 KiB boundary (the swizzle's alignment).
EXPHIL_ATTN_HD constexpr std::size_t attention_wgmma_shared_bytes(std::size_t elem_bytes,
                                                                  int head_dim, int rows,
                                                                  int floats) {
  return static_cast<std::size_t>(rows) * head_dim * elem_bytes +
         static_cast<std::size_t>(floats) * sizeof(float) + 1024;
}
// Q and two stages of K and V.
EXPHIL_ATTN_HD constexpr std::size_t attention_forward_wgmma_shared_bytes(std::size_t elem_bytes,
                                                                          int head_dim) {
  return attention_wgmma_shared_bytes(elem_bytes, head_dim,
                                      kAttnWgmmaRows + 4 * kAttnWgmmaKeyTile, 0);
}

// The Hopper dK/dV kernel (attention_dkdv_wgmma.cuh): one warpgroup of 64
// keys per block, query tiles of 64 rows double-buffered, for f16 and bf16
// at d = 64. 64-row query tiles (166 registers, three blocks per SM) made
// B32 h8 T256 d64 bf16's forward + backward 82.0 us against 96.7 with
// 32-row ones (139 registers).
constexpr int kAttnWgmmaQueryTile = 64;
EXPHIL_ATTN_HD constexpr bool attention_dkdv_wgmma_head_dim(int d) { return d == 64; }
EXPHIL_ATTN_HD constexpr int attention_dkdv_wgmma_min_blocks() { return 2; }
// K and V of the block's keys, two stages of Q and dO tiles with their lse
// and rowsum(dO * O).
EXPHIL_ATTN_HD constexpr std::size_t attention_dkdv_wgmma_shared_bytes(std::size_t elem_bytes,
                                                                       int head_dim) {
  return attention_wgmma_shared_bytes(elem_bytes, head_dim,
                                      2 * kAttnWgmmaRows + 4 * kAttnWgmmaQueryTile,
                                      4 * kAttnWgmmaQueryTile);
}

// The Hopper dQ kernel (attention_dq_wgmma.cuh): one warpgroup of 64 query
// rows per block, 64-key tiles double-buffered, for f16 and bf16 at d = 64.
EXPHIL_ATTN_HD constexpr bool attention_dq_wgmma_head_dim(int d) { return d == 64; }
EXPHIL_ATTN_HD constexpr int attention_dq_wgmma_min_blocks() { return 3; }
// Q and dO of the block's rows and two stages of K and V tiles.
EXPHIL_ATTN_HD constexpr std::size_t attention_dq_wgmma_shared_bytes(std::size_t elem_bytes,
                                                                     int head_dim) {
  return attention_wgmma_shared_bytes(elem_bytes, head_dim,
                                      2 * kAttnWgmmaRows + 4 * kAttnWgmmaKeyTile, 0);
}

// The fused backward (attention_backward_fused.cuh): the dK/dV kernel's
// blocks of four warps over 64 keys, computing dQ as well, for f32 (exact
// and tf32x3) up to d = 64. Each 32-query tile's dS goes through shared
// memory: tf32x3 keeps dS^T, [64 keys][32 queries] padded to 40 floats
// (conflict-free with the swizzle of km_offset() in
// attention_warp_mma_tf32x3.cuh); exact f32 keeps dS, [32 queries][64
// keys] padded as its products read A (attention_scratch_stride()). The
// tiles' dQ is summed over key blocks in global memory in one fixed order,
// which per-slice counters enforce: 4 (one per warp's slice) per query
// tile of every (batch, query head), and one more word that hands out
// block tickets.
constexpr int kAttnFusedWarps = 4;
constexpr int kAttnFusedKeys = kAttnRowsPerWarp * kAttnFusedWarps;
constexpr int kAttnFusedQueryTile = 32;
constexpr int kAttnFusedDsStride = 40;
EXPHIL_ATTN_HD constexpr bool attention_fused_backward_head_dim(int d) { return d <= 64; }
EXPHIL_ATTN_HD constexpr std::size_t attention_fused_ds_floats(AttentionStorage s) {
  return s.tf32x3 ? std::size_t{kAttnFusedKeys} * kAttnFusedDsStride
                  : std::size_t{kAttnFusedQueryTile} * attention_scratch_stride(kAttnFusedKeys);
}
EXPHIL_ATTN_HD constexpr int64_t attention_fused_sync_words(int64_t batch, int64_t q_heads,
                                                            int64_t q_len) {
  return 1 + batch * q_heads * ((q_len + kAttnFusedQueryTile - 1) / kAttnFusedQueryTile) *
                 kAttnFusedWarps;
}

// Q and dO of the block's rows, the K and V tiles of every stage, the f32
// staging.
EXPHIL_ATTN_HD constexpr std::size_t attention_dq_shared_bytes(AttentionStorage s, int head_dim,
                                                               int warps, int kt) {
  return attention_rows_bytes(s.elem_bytes, head_dim,
                              2 * kAttnRowsPerWarp * warps + 2 * kt * attention_stages(s.elem_bytes)) +
         attention_scratch_bytes(s, warps, kt);
}
EXPHIL_ATTN_HD constexpr std::size_t attention_dq_shared_bytes(AttentionStorage s, int head_dim,
                                                               int warps) {
  return attention_dq_shared_bytes(s, head_dim, warps, attention_key_tile(s, head_dim));
}

// K and V of the block's rows; per stage a Q tile, a dO tile, and the
// tile's lse and rowsum(dO * O); the f32 staging.
EXPHIL_ATTN_HD constexpr std::size_t attention_dkdv_shared_bytes(AttentionStorage s,
                                                                 int head_dim, int warps) {
  const int qt = attention_query_tile(s, head_dim);
  const int stages = attention_stages(s.elem_bytes);
  return attention_rows_bytes(s.elem_bytes, head_dim,
                              2 * kAttnRowsPerWarp * warps + 2 * qt * stages) +
         2 * static_cast<std::size_t>(qt) * stages * sizeof(float) +
         attention_scratch_bytes(s, warps, qt);
}

// The fused backward's: the f32 dK/dV kernel's of four warps (single-stage
// 32-query tiles; exact f32's staging) and the dS tile.
EXPHIL_ATTN_HD constexpr std::size_t attention_fused_backward_shared_bytes(AttentionStorage s,
                                                                           int head_dim) {
  return attention_dkdv_shared_bytes(s, head_dim, kAttnFusedWarps) +
         attention_fused_ds_floats(s) * sizeof(float);
}

}  // namespace exphil::kernels
