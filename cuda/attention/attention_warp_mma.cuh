// Warp-level products of the attention kernels, in the fragment layout of
// the m16n8k16 tensor-core instruction, for every element type.
//
// A warp computes C[16 x 8n] += A[16 x k] . B. Each thread holds, for every
// 8-column tile j of C, c[j][0..3] = C[g][8j + 2t], C[g][8j + 2t + 1],
// C[g + 8][8j + 2t], C[g + 8][8j + 2t + 1], with g and t the lane's row and
// column group (attention_fragment.cuh: lane / 4 and lane % 4 for the tensor
// cores, another numbering for f32).
// Two operand forms cover every product of the forward and backward passes:
//
//   a_smem_b_nk: A row-major [16][k] and B stored as [n][k] rows, both in
//                shared memory (S = Q K^T, dP = dO V^T, and their transposes)
//   a_frag_b_kn: A a score fragment already in registers in the C layout
//                above, B stored as [k][n] rows (O += P V, dQ += dS K, ...)
//   a_held_b_nk: a_smem_b_nk with A held in registers by hold_a(), for a
//                warp that multiplies the same rows by every tile (the
//                forward's Q); f32 holds nothing and reads A again
//   a_smem_b_nk_pair (f32 contracts only): two independent a_smem_b_nk
//                products, for the fused backward's P^T and dP^T
//
// f16 and bf16 run mma.sync.m16n8k16 (sm_80), with operands fetched by
// ldmatrix (.trans for [k][n] rows); the register fragment is rounded to
// the element type, as FlashAttention does. f32 runs the same contract in
// exact fp32 FMAs, with the fragment staged through a per-warp shared
// buffer. Every operand load is a broadcast that lanes n and n ^ 1 or n and
// n ^ 2 share (f32's lane numbering), which halves its cost in shared
// memory's return cycles; no load has a bank conflict.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>

#include "attention/attention_config.h"
#include "attention/attention_fragment.cuh"
#include "common/mma_m16n8k16.cuh"

namespace exphil::kernels::attn {

__device__ __forceinline__ uint32_t smem_address(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

__device__ __forceinline__ void ldmatrix_x4(uint32_t (&r)[4], const void* row) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(smem_address(row)));
}
__device__ __forceinline__ void ldmatrix_x4_trans(uint32_t (&r)[4], const void* row) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(smem_address(row)));
}
__device__ __forceinline__ void ldmatrix_x2(uint32_t (&r)[2], const void* row) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x2.shared.b16 {%0,%1}, [%2];\n"
               : "=r"(r[0]), "=r"(r[1])
               : "r"(smem_address(row)));
}
__device__ __forceinline__ void ldmatrix_x2_trans(uint32_t (&r)[2], const void* row) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x2.trans.shared.b16 {%0,%1}, [%2];\n"
               : "=r"(r[0]), "=r"(r[1])
               : "r"(smem_address(row)));
}

// The m16n8k16 A operand of 16-column step kk of a score fragment `p` in
// the C layout (its 8-column tiles 2 kk and 2 kk + 1), rounded to Elem: how
// a product's result becomes the next product's operand without leaving
// registers, here (a_frag_b_kn) and in the Hopper kernels, whose warpgroup
// instructions take the same per-warp layout.
template <class Elem, int kNT>
__device__ __forceinline__ void a_fragment(const float (&p)[kNT][4], int kk, uint32_t (&a)[4]) {
  a[0] = MmaOp<Elem>::pack(p[2 * kk][0], p[2 * kk][1]);
  a[1] = MmaOp<Elem>::pack(p[2 * kk][2], p[2 * kk][3]);
  a[2] = MmaOp<Elem>::pack(p[2 * kk + 1][0], p[2 * kk + 1][1]);
  a[3] = MmaOp<Elem>::pack(p[2 * kk + 1][2], p[2 * kk + 1][3]);
}

// Tensor cores: f16 and bf16.
template <class Elem>
struct WarpMma {
  // c[kNT] += A[16][kK] . B^T, A at `a` (row stride lda), B as [8 kNT][kK]
  // rows at `b` (row stride ldb), both shared memory, 16-byte aligned rows.
  template <int kNT, int kK>
  __device__ __forceinline__ static void a_smem_b_nk(float (&c)[kNT][4], const Elem* a, int lda,
                                                     const Elem* b, int ldb, float* /*scratch*/) {
    static_assert(kK % 16 == 0, "k must be a multiple of 16");
#pragma unroll
    for (int kk = 0; kk < kK / 16; ++kk) {
      uint32_t af[4];
      load_a(af, a, lda, kk);
      b_nk_step<kNT>(c, af, b, ldb, kk);
    }
  }

  // A [16][kK] held in registers as m16n8k16 A fragments, for a warp that
  // multiplies the same rows by many tiles (the forward's Q).
  template <int kK>
  struct HeldA {
    uint32_t frag[kK / 16][4];
  };
  template <int kK>
  __device__ __forceinline__ static void hold_a(HeldA<kK>& held, const Elem* a, int lda) {
#pragma unroll
    for (int kk = 0; kk < kK / 16; ++kk) load_a(held.frag[kk], a, lda, kk);
  }
  // a_smem_b_nk with A as hold_a() left it (`a` and `lda` are not read).
  template <int kNT, int kK>
  __device__ __forceinline__ static void a_held_b_nk(float (&c)[kNT][4], const HeldA<kK>& held,
                                                     const Elem* /*a*/, int /*lda*/,
                                                     const Elem* b, int ldb, float* /*scratch*/) {
#pragma unroll
    for (int kk = 0; kk < kK / 16; ++kk) b_nk_step<kNT>(c, held.frag[kk], b, ldb, kk);
  }

  // c[kNT] += P . B, P the 16 x kK fragment `p` (C layout), B as [kK][8 kNT]
  // rows at `b` in shared memory.
  template <int kNT, int kK>
  __device__ __forceinline__ static void a_frag_b_kn(float (&c)[kNT][4], const float (&p)[kK / 8][4],
                                                     const Elem* b, int ldb, float* /*scratch*/) {
    static_assert(kK % 16 == 0, "k must be a multiple of 16");
    const int lane = threadIdx.x % 32;
    const int m = lane / 8, r = lane % 8;
#pragma unroll
    for (int kk = 0; kk < kK / 16; ++kk) {
      uint32_t af[4];
      a_fragment<Elem>(p, kk, af);
#pragma unroll
      for (int j = 0; j + 1 < kNT; j += 2) {
        uint32_t bf[4];  // transposed: (k 0-7, tile j), (k 8-15, j), (0-7, j+1), (8-15, j+1)
        ldmatrix_x4_trans(bf, b + (kk * 16 + (m & 1) * 8 + r) * ldb + (j + (m >> 1)) * 8);
        MmaOp<Elem>::run(c[j], af, bf[0], bf[1]);
        MmaOp<Elem>::run(c[j + 1], af, bf[2], bf[3]);
      }
      if constexpr (kNT % 2 == 1) {
        uint32_t bf[2];
        ldmatrix_x2_trans(bf, b + (kk * 16 + (m & 1) * 8 + r) * ldb + (kNT - 1) * 8);
        MmaOp<Elem>::run(c[kNT - 1], af, bf[0], bf[1]);
      }
    }
  }

 private:
  // A's 16-column step kk as an m16n8k16 operand: ldmatrix x4, lane L
  // addressing row L % 8 of matrix L / 8 (rows 0-7 / 8-15 x k 0-7 / 8-15).
  __device__ __forceinline__ static void load_a(uint32_t (&af)[4], const Elem* a, int lda,
                                                int kk) {
    const int lane = threadIdx.x % 32;
    const int m = lane / 8, r = lane % 8;
    ldmatrix_x4(af, a + ((m & 1) * 8 + r) * lda + kk * 16 + (m >> 1) * 8);
  }
  // c[kNT] += af . B's 16-column step kk, B as [8 kNT][k] rows.
  template <int kNT>
  __device__ __forceinline__ static void b_nk_step(float (&c)[kNT][4], const uint32_t (&af)[4],
                                                   const Elem* b, int ldb, int kk) {
    const int lane = threadIdx.x % 32;
    const int m = lane / 8, r = lane % 8;
#pragma unroll
    for (int j = 0; j + 1 < kNT; j += 2) {
      uint32_t bf[4];  // matrices: (tile j, k 0-7), (j, k 8-15), (j+1, 0-7), (j+1, 8-15)
      ldmatrix_x4(bf, b + ((j + (m >> 1)) * 8 + r) * ldb + kk * 16 + (m & 1) * 8);
      MmaOp<Elem>::run(c[j], af, bf[0], bf[1]);
      MmaOp<Elem>::run(c[j + 1], af, bf[2], bf[3]);
    }
    if constexpr (kNT % 2 == 1) {
      uint32_t bf[2];
      ldmatrix_x2(bf, b + ((kNT - 1) * 8 + r) * ldb + kk * 16 + (m & 1) * 8);
      MmaOp<Elem>::run(c[kNT - 1], af, bf[0], bf[1]);
    }
  }
};

// The hold_a() of products that hold nothing and read A from shared memory
// as they go: both f32 contracts (exact here, tf32x3 in
// attention_warp_mma_tf32x3.cuh).
template <class Elem>
struct ReadsAFromShared {
  template <int kK>
  struct HeldA {};
  template <int kK>
  __device__ __forceinline__ static void hold_a(HeldA<kK>& /*held*/, const Elem* /*a*/,
                                                int /*lda*/) {}
};

// Exact fp32 on the CUDA cores, same contract. `scratch` is this warp's
// 16 x attention_scratch_stride(kK) floats (a_frag_b_kn only). Its float4
// loads of A are broadcasts, so it holds nothing.
template <>
struct WarpMma<float> : ReadsAFromShared<float> {
  // The forward's product, with its k loop unrolled in full so that the
  // loads run ahead of the FMAs: the forward has registers to spare (122 at
  // d = 64) and ran 11% faster at B32 h8 T256 d64. The backward's products
  // unroll 4 steps: in full they cost registers and ran slower, and 4 ran
  // 2% faster than 2.
  template <int kNT, int kK>
  __device__ __forceinline__ static void a_held_b_nk(float (&c)[kNT][4], const HeldA<kK>& /*held*/,
                                                     const float* a, int lda, const float* b,
                                                     int ldb, float* scratch) {
    a_smem_b_nk<kNT, kK, kK / 4>(c, a, lda, b, ldb, scratch);
  }

  // kUnroll: steps of 4 k unrolled.
  template <int kNT, int kK, int kUnroll = 4>
  __device__ __forceinline__ static void a_smem_b_nk(float (&c)[kNT][4], const float* a, int lda,
                                                     const float* b, int ldb, float* /*scratch*/) {
    static_assert(kK % 4 == 0, "k must be a multiple of 4");
    const int g = FragmentLanes<float>::row(), t = FragmentLanes<float>::col();
    const float* a_lo = a + g * lda;
    const float* a_hi = a + (g + 8) * lda;
#pragma unroll(kUnroll)
    for (int k = 0; k < kK; k += 4) {
      const float4 x = *reinterpret_cast<const float4*>(a_lo + k);
      const float4 y = *reinterpret_cast<const float4*>(a_hi + k);
#pragma unroll
      for (int j = 0; j < kNT; ++j) {
        const float4 u = *reinterpret_cast<const float4*>(b + (8 * j + 2 * t) * ldb + k);
        const float4 v = *reinterpret_cast<const float4*>(b + (8 * j + 2 * t + 1) * ldb + k);
        c[j][0] = fmaf(x.w, u.w, fmaf(x.z, u.z, fmaf(x.y, u.y, fmaf(x.x, u.x, c[j][0]))));
        c[j][1] = fmaf(x.w, v.w, fmaf(x.z, v.z, fmaf(x.y, v.y, fmaf(x.x, v.x, c[j][1]))));
        c[j][2] = fmaf(y.w, u.w, fmaf(y.z, u.z, fmaf(y.y, u.y, fmaf(y.x, u.x, c[j][2]))));
        c[j][3] = fmaf(y.w, v.w, fmaf(y.z, v.z, fmaf(y.y, v.y, fmaf(y.x, v.x, c[j][3]))));
      }
    }
  }

  // c0 += A0 . B0^T and c1 += A1 . B1^T (the fused backward's P^T and dP^T):
  // one after the other, as the dK/dV kernel runs them; tf32x3 interleaves
  // them.
  template <int kNT, int kK>
  __device__ __forceinline__ static void a_smem_b_nk_pair(float (&c0)[kNT][4],
                                                          float (&c1)[kNT][4], const float* a0,
                                                          const float* a1, int lda,
                                                          const float* b0, const float* b1,
                                                          int ldb) {
    a_smem_b_nk<kNT, kK>(c0, a0, lda, b0, ldb, nullptr);
    a_smem_b_nk<kNT, kK>(c1, a1, lda, b1, ldb, nullptr);
  }

  template <int kNT, int kK>
  __device__ __forceinline__ static void a_frag_b_kn(float (&c)[kNT][4], const float (&p)[kK / 8][4],
                                                     const float* b, int ldb, float* scratch) {
    constexpr int lds = attention_scratch_stride(kK);
    const int g = FragmentLanes<float>::row(), t = FragmentLanes<float>::col();
    __syncwarp();  // the previous product has finished reading the scratch
#pragma unroll
    for (int i = 0; i < kK / 8; ++i) {
      *reinterpret_cast<float2*>(scratch + g * lds + 8 * i + 2 * t) = make_float2(p[i][0], p[i][1]);
      *reinterpret_cast<float2*>(scratch + (g + 8) * lds + 8 * i + 2 * t) =
          make_float2(p[i][2], p[i][3]);
    }
    __syncwarp();
    a_smem_b_kn<kNT, kK>(c, scratch, lds, b, ldb);
  }

  // c[kNT] += A . B, A [16][kK] row-major in shared memory (rows 16-byte
  // aligned, lda a multiple of 4), B as [kK][8 kNT] rows: a_frag_b_kn's
  // product once its fragment is staged, and the fused backward's dQ.
  template <int kNT, int kK>
  __device__ __forceinline__ static void a_smem_b_kn(float (&c)[kNT][4], const float* a, int lda,
                                                     const float* b, int ldb) {
    const int g = FragmentLanes<float>::row(), t = FragmentLanes<float>::col();
    const float* a_lo = a + g * lda;
    const float* a_hi = a + (g + 8) * lda;
#pragma unroll 2
    for (int k = 0; k < kK; k += 4) {
      const float4 x = *reinterpret_cast<const float4*>(a_lo + k);
      const float4 y = *reinterpret_cast<const float4*>(a_hi + k);
      const float xs[4] = {x.x, x.y, x.z, x.w};
      const float ys[4] = {y.x, y.y, y.z, y.w};
#pragma unroll
      for (int kq = 0; kq < 4; ++kq) {
        const float* row = b + (k + kq) * ldb + 2 * t;
#pragma unroll
        for (int j = 0; j < kNT; ++j) {
          const float2 u = *reinterpret_cast<const float2*>(row + 8 * j);
          c[j][0] = fmaf(xs[kq], u.x, c[j][0]);
          c[j][1] = fmaf(xs[kq], u.y, c[j][1]);
          c[j][2] = fmaf(ys[kq], u.x, c[j][2]);
          c[j][3] = fmaf(ys[kq], u.y, c[j][3]);
        }
      }
    }
  }
};

}  // namespace exphil::kernels::attn

#include "attention/attention_warp_mma_tf32x3.cuh"  // WarpMma<Tf32x3>
