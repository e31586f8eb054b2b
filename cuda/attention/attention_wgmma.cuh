// Warpgroup products of the Hopper (sm_90a) attention kernels: wgmma
// instructions, their shared-memory operand layout and descriptors.
//
// A warpgroup (4 warps, 128 threads) computes D[64 x N] (+)= A[64 x 16] .
// B[16 x N] per instruction, asynchronously; each warp holds 16 rows of D in
// the layout of mma.sync's C fragment (attention_warp_mma.cuh): for every
// 8-column tile j, d[j][0..3] = D[g][8j + 2t], D[g][8j + 2t + 1],
// D[g + 8][8j + 2t], D[g + 8][8j + 2t + 1], g = lane / 4, t = lane % 4, rows
// offset by 16 per warp. A in registers takes the m16n8k16 A layout per warp,
// so a score fragment turns into the A operand of the next product in place.
//
// Shared-memory operands use the 128-byte swizzle: a tile of R rows and D
// 16-bit columns is stored as D / 64 column blocks of R x 64 elements (128
// bytes a row), each contiguous, and in every row the 16-byte chunk c sits at
// chunk c ^ (row % 8). Eight rows make one 1 KiB swizzle atom, which must
// start at a 1 KiB-aligned address since the hardware applies the XOR on the
// address bits. The rows are loaded with 16-byte cp.async into these places,
// so no load is conflicted and the products read whole atoms.
//
//   K-major operand (the reduced dimension contiguous: Q and K in S = Q K^T):
//     descriptor stride (SBO) = 1 KiB between 8-row groups, LBO unused; the
//     k-th 16-column step starts 32 k bytes into the row (within a block).
//   MN-major operand (the output's columns contiguous: V in O = P V, with
//     the transpose flag): SBO = 1 KiB between 8-row groups of the reduced
//     dimension, LBO = the column-block stride; the k-th 16-row step starts
//     16 rows (2 KiB) further.
//
// The instructions, the fence that orders register writes before them, and
// the group commit and wait are wgmma's (PTX ISA, "Asynchronous
// Warpgroup Level Matrix Multiply-Accumulate"). Shared memory written by
// ordinary stores or cp.async must be made visible to them with
// fence.proxy.async before the barrier that precedes them.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>
#include <type_traits>

#include "attention/attention_common.cuh"
#include "attention/attention_config.h"
#include "attention/attention_warp_mma.cuh"

namespace exphil::kernels::wgmma {

// The first 1 KiB boundary at or past `smem` (dynamic shared memory), where
// a kernel's swizzled tiles start: the hardware applies the swizzle's XOR
// on address bits, so atoms must be aligned. Launches add 1 KiB of slack
// (attention_wgmma_shared_bytes()).
__device__ __forceinline__ uint32_t swizzle_base(const unsigned char* smem) {
  return (attn::smem_address(smem) + 1023u) & ~1023u;
}

// Byte offset of 16-byte chunk `chunk` of row `r` in a swizzled tile of
// kRows rows.
template <int kRows>
__device__ __forceinline__ uint32_t swizzled_offset(int r, int chunk) {
  return static_cast<uint32_t>((chunk / 8) * kRows * 128 + r * 128 + (((chunk % 8) ^ (r % 8)) << 4));
}

// Starts copying rows [0, kRows) of width kD from `src` (row stride in
// elements) into the swizzled tile at shared address `dst`, rows at and
// past `valid` as zeros; the caller commits and waits. The block's
// kAttnWgmmaThreads threads each take the same 16-byte column of rows
// r0, r0 + rows_per_pass, ...: unrolled, with one swizzled offset and one
// row pointer per thread, so a copy costs a few instructions.
template <class Elem, int kD, int kRows>
__device__ __forceinline__ void load_tile_async(uint32_t dst, const Elem* src, int64_t row_stride,
                                                int64_t valid) {
  constexpr int kChunks = kD * static_cast<int>(sizeof(Elem)) / 16;
  constexpr int kPerChunk = 16 / static_cast<int>(sizeof(Elem));
  constexpr int kRowsPerPass = kAttnWgmmaThreads / kChunks;
  static_assert(kAttnWgmmaThreads % kChunks == 0 && kRows % kRowsPerPass == 0 &&
                kRowsPerPass % 8 == 0, "every pass keeps a thread on one swizzle phase");
  const int r0 = threadIdx.x / kChunks, c = threadIdx.x % kChunks;
  const uint32_t to = dst + swizzled_offset<kRows>(r0, c);
  const Elem* from = src + r0 * row_stride + c * kPerChunk;
#pragma unroll
  for (int pass = 0; pass < kRows / kRowsPerPass; ++pass) {
    const int r = r0 + pass * kRowsPerPass;
    const bool in = r < valid;
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(
                     to + pass * kRowsPerPass * 128),
                 "l"(in ? from + pass * kRowsPerPass * row_stride : src), "r"(in ? 16 : 0));
  }
}

// Starts copying keys [k0, k0 + kKT) of a query block's K and V heads into
// the swizzled tiles at k_tile and v_tile, keys at and past S as zeros.
template <class Elem, int kD, int kKT>
__device__ __forceinline__ void load_kv_tiles_async(uint32_t k_tile, uint32_t v_tile,
                                                    const attn::QueryBlock<Elem>& qb,
                                                    const AttentionProblem& pr, int64_t k0) {
  const int64_t row = pr.kv_strides.row, valid = pr.shape.kv_len - k0;
  load_tile_async<Elem, kD, kKT>(k_tile, qb.d_k + k0 * row, row, valid);
  load_tile_async<Elem, kD, kKT>(v_tile, qb.d_v + k0 * row, row, valid);
}

__device__ __forceinline__ uint64_t descriptor(uint32_t smem_address, uint32_t lbo_bytes,
                                               uint32_t sbo_bytes) {
  constexpr uint64_t kSwizzle128B = 1;
  return static_cast<uint64_t>((smem_address & 0x3FFFF) >> 4) |
         (static_cast<uint64_t>((lbo_bytes & 0x3FFFF) >> 4) << 16) |
         (static_cast<uint64_t>((sbo_bytes & 0x3FFFF) >> 4) << 32) | (kSwizzle128B << 62);
}

// Operand descriptors of 16-column step `k` of a K-major tile of kRows rows,
// and of 16-row step `k` of an MN-major tile of kRows rows.
template <int kRows>
__device__ __forceinline__ uint64_t k_major(uint32_t tile, int k) {
  return descriptor(tile + (k / 4) * kRows * 128 + (k % 4) * 32, 16, 1024);
}
template <int kRows>
__device__ __forceinline__ uint64_t mn_major(uint32_t tile, int k) {
  return descriptor(tile + k * 16 * 128, kRows * 128, 1024);
}

__device__ __forceinline__ void fence() { asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory"); }
__device__ __forceinline__ void commit() {
  asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
}
template <int kPending>
__device__ __forceinline__ void wait() {
  asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(kPending) : "memory");
}
// Shared-memory writes of this thread (stores, cp.async) become visible to
// the async proxy that wgmma reads through.
__device__ __forceinline__ void fence_shared_for_async() {
  asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
}
// Keeps the compiler from moving reads or writes of accumulators across a
// wait: the instructions' results land asynchronously, which the compiler
// does not see.
template <int kN>
__device__ __forceinline__ void hold(float (&d)[kN][4]) {
#pragma unroll
  for (int j = 0; j < kN; ++j)
#pragma unroll
    for (int e = 0; e < 4; ++e) asm volatile("" : "+f"(d[j][e])::"memory");
}

#define EXPHIL_WGMMA_ACC4(d, i) "+f"(d[i][0]), "+f"(d[i][1]), "+f"(d[i][2]), "+f"(d[i][3])
#define EXPHIL_WGMMA_ACC_N32(d)                                                              \
  EXPHIL_WGMMA_ACC4(d, 0), EXPHIL_WGMMA_ACC4(d, 1), EXPHIL_WGMMA_ACC4(d, 2),                 \
      EXPHIL_WGMMA_ACC4(d, 3)
#define EXPHIL_WGMMA_ACC_N64(d)                                                              \
  EXPHIL_WGMMA_ACC4(d, 0), EXPHIL_WGMMA_ACC4(d, 1), EXPHIL_WGMMA_ACC4(d, 2),                 \
      EXPHIL_WGMMA_ACC4(d, 3), EXPHIL_WGMMA_ACC4(d, 4), EXPHIL_WGMMA_ACC4(d, 5),             \
      EXPHIL_WGMMA_ACC4(d, 6), EXPHIL_WGMMA_ACC4(d, 7)
#define EXPHIL_WGMMA_ACC_N128(d)                                                               \
  EXPHIL_WGMMA_ACC_N64(d), EXPHIL_WGMMA_ACC4(d, 8), EXPHIL_WGMMA_ACC4(d, 9),                  \
      EXPHIL_WGMMA_ACC4(d, 10), EXPHIL_WGMMA_ACC4(d, 11), EXPHIL_WGMMA_ACC4(d, 12),           \
      EXPHIL_WGMMA_ACC4(d, 13), EXPHIL_WGMMA_ACC4(d, 14), EXPHIL_WGMMA_ACC4(d, 15)
#define EXPHIL_WGMMA_D_N32 "{%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15}"
#define EXPHIL_WGMMA_D_N64                                                                   \
  "{%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,%16,%17,%18,%19,%20,%21,%22,%23," \
  "%24,%25,%26,%27,%28,%29,%30,%31}"
#define EXPHIL_WGMMA_D_N128                                                                  \
  "{%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,%16,%17,%18,%19,%20,%21,%22,%23," \
  "%24,%25,%26,%27,%28,%29,%30,%31,%32,%33,%34,%35,%36,%37,%38,%39,%40,%41,%42,%43,%44,%45," \
  "%46,%47,%48,%49,%50,%51,%52,%53,%54,%55,%56,%57,%58,%59,%60,%61,%62,%63}"
// D (+)= A B, A and B by descriptor, both K-major; `p`: accumulate into D.
#define EXPHIL_WGMMA_SS(N, T, D, A, B, P)                                                   \
  "{\n.reg .pred p;\nsetp.ne.b32 p, " P ", 0;\nwgmma.mma_async.sync.aligned.m64n" #N       \
  "k16.f32." T "." T " " D ", " A ", " B ", p, 1, 1, 0, 0;\n}\n"
// D += A B, A in four registers, B by descriptor, MN-major (transposed).
// scale-d is a predicate operand, so it is set from a register that holds 1.
#define EXPHIL_WGMMA_RS(N, T, D, A, B, P)                                                   \
  "{\n.reg .pred p;\nsetp.ne.b32 p, " P ", 0;\nwgmma.mma_async.sync.aligned.m64n" #N       \
  "k16.f32." T "." T " " D ", {" A "}, " B ", p, 1, 1, 1;\n}\n"

// D (+)= A B for A [64 x 16] and B [16 x kN], both K-major in shared memory.
template <class Elem, int kN>
__device__ __forceinline__ void mma_ss(float (&d)[kN / 8][4], uint64_t a, uint64_t b,
                                       bool accumulate) {
  static_assert(std::is_same_v<Elem, __nv_bfloat16> || std::is_same_v<Elem, __half>);
  static_assert(kN == 32 || kN == 64 || kN == 128);
  const int acc = accumulate;
  constexpr bool bf16 = std::is_same_v<Elem, __nv_bfloat16>;
  if constexpr (kN == 32) {
    if constexpr (bf16)
      asm volatile(EXPHIL_WGMMA_SS(32, "bf16", EXPHIL_WGMMA_D_N32, "%16", "%17", "%18")
                   : EXPHIL_WGMMA_ACC_N32(d) : "l"(a), "l"(b), "r"(acc));
    else
      asm volatile(EXPHIL_WGMMA_SS(32, "f16", EXPHIL_WGMMA_D_N32, "%16", "%17", "%18")
                   : EXPHIL_WGMMA_ACC_N32(d) : "l"(a), "l"(b), "r"(acc));
  } else if constexpr (kN == 64) {
    if constexpr (bf16)
      asm volatile(EXPHIL_WGMMA_SS(64, "bf16", EXPHIL_WGMMA_D_N64, "%32", "%33", "%34")
                   : EXPHIL_WGMMA_ACC_N64(d) : "l"(a), "l"(b), "r"(acc));
    else
      asm volatile(EXPHIL_WGMMA_SS(64, "f16", EXPHIL_WGMMA_D_N64, "%32", "%33", "%34")
                   : EXPHIL_WGMMA_ACC_N64(d) : "l"(a), "l"(b), "r"(acc));
  } else {
    if constexpr (bf16)
      asm volatile(EXPHIL_WGMMA_SS(128, "bf16", EXPHIL_WGMMA_D_N128, "%64", "%65", "%66")
                   : EXPHIL_WGMMA_ACC_N128(d) : "l"(a), "l"(b), "r"(acc));
    else
      asm volatile(EXPHIL_WGMMA_SS(128, "f16", EXPHIL_WGMMA_D_N128, "%64", "%65", "%66")
                   : EXPHIL_WGMMA_ACC_N128(d) : "l"(a), "l"(b), "r"(acc));
  }
}

// D += A B for A [64 x 16] in registers (each warp's 16 rows in the m16n8k16
// A layout) and B [16 x kN] MN-major in shared memory.
template <class Elem, int kN>
__device__ __forceinline__ void mma_rs(float (&d)[kN / 8][4], const uint32_t (&a)[4],
                                       uint64_t b) {
  static_assert(std::is_same_v<Elem, __nv_bfloat16> || std::is_same_v<Elem, __half>);
  static_assert(kN == 64 || kN == 128);
  constexpr bool bf16 = std::is_same_v<Elem, __nv_bfloat16>;
  if constexpr (kN == 64) {
    if constexpr (bf16)
      asm volatile(EXPHIL_WGMMA_RS(64, "bf16", EXPHIL_WGMMA_D_N64, "%32,%33,%34,%35", "%36", "%37")
                   : EXPHIL_WGMMA_ACC_N64(d)
                   : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b), "r"(1));
    else
      asm volatile(EXPHIL_WGMMA_RS(64, "f16", EXPHIL_WGMMA_D_N64, "%32,%33,%34,%35", "%36", "%37")
                   : EXPHIL_WGMMA_ACC_N64(d)
                   : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b), "r"(1));
  } else {
    if constexpr (bf16)
      asm volatile(EXPHIL_WGMMA_RS(128, "bf16", EXPHIL_WGMMA_D_N128, "%64,%65,%66,%67", "%68", "%69")
                   : EXPHIL_WGMMA_ACC_N128(d)
                   : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b), "r"(1));
    else
      asm volatile(EXPHIL_WGMMA_RS(128, "f16", EXPHIL_WGMMA_D_N128, "%64,%65,%66,%67", "%68", "%69")
                   : EXPHIL_WGMMA_ACC_N128(d)
                   : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b), "r"(1));
  }
}

// s = A1 B1^T and t = A2 B2^T, each [kRowsA x kN] over a head width of kD:
// A tiles [kRowsA x kD] and B tiles [kN x kD], K-major in shared memory.
// Both products are issued before either is waited for; every warp of the
// warpgroup takes part. The backward's scores and their gradients (S and
// dP, or their transposes).
template <class Elem, int kD, int kRowsA, int kN>
__device__ __forceinline__ void product_pair(float (&s)[kN / 8][4], float (&t)[kN / 8][4],
                                             uint32_t a1, uint32_t b1, uint32_t a2, uint32_t b2) {
  fence();
#pragma unroll
  for (int k = 0; k < kD / 16; ++k)
    mma_ss<Elem, kN>(s, k_major<kRowsA>(a1, k), k_major<kN>(b1, k), k > 0);
#pragma unroll
  for (int k = 0; k < kD / 16; ++k)
    mma_ss<Elem, kN>(t, k_major<kRowsA>(a2, k), k_major<kN>(b2, k), k > 0);
  commit();
  wait<0>();
  hold(s);
  hold(t);
}

#undef EXPHIL_WGMMA_ACC4
#undef EXPHIL_WGMMA_ACC_N32
#undef EXPHIL_WGMMA_D_N32
#undef EXPHIL_WGMMA_ACC_N64
#undef EXPHIL_WGMMA_ACC_N128
#undef EXPHIL_WGMMA_D_N64
#undef EXPHIL_WGMMA_D_N128
#undef EXPHIL_WGMMA_SS
#undef EXPHIL_WGMMA_RS

}  // namespace exphil::kernels::wgmma
