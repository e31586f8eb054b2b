// Warp-level products of the attention kernels for f32 tensors on tensor
// cores: the WarpMma contract (attention_warp_mma.cuh) for Tf32x3, the
// opt-in AttentionPrecision::tf32x3.
//
// Algorithm: each f32 operand x is split into two TF32 values, big = x
// rounded to the nearest TF32 and small = x - big (exact in f32) truncated
// to TF32, and a product a . b runs as three m16n8k8 TF32 instructions,
// small . big + big . small + big . big, the small terms first so that they
// are not lost against the large one. |x - big - small| <= 2^-22 |x|, and
// the dropped small . small is below 2^-22 |a b|: about 2^-21 of each
// product, against f32's 2^-24 per FMA. The results meet the f32
// tolerances of the tests and are not bitwise those of the exact-FMA
// kernels. PyTorch's memory-efficient attention runs its f32 products the
// same way on sm_80 and later.
//
// Cost: every operand element a warp loads is split where it is used, and
// the kernels are bound by latency at 3 blocks of 4 warps per SM (tensor
// pipe under half busy, bench/RESULTS.md), so instructions and dependent
// chains count. Rounding by integer add and mask (2 instructions) rather
// than cvt.rna.tf32.f32, and truncating small (now left to the hardware,
// split_tf32()) instead of rounding it, made B32 h8 T256 d64 causal 83 ->
// 70 us forward and 360 -> 286 us forward + backward on an H100; the
// forward's S = Q K^T with 8-byte loads and eight tiles per pass
// (a_held_b_nk) made its forward 63.0 -> 59.7 us on an H200.
//
// Layout: the m16n8k8 TF32 fragments. With g = lane / 4 and t = lane % 4
// (FragmentLanes' tensor-core numbering: the C layout is that of m16n8k16),
//   A (16 x 8): a0 (g, t), a1 (g + 8, t), a2 (g, t + 4), a3 (g + 8, t + 4);
//   B (8 x 8, k x n): b0 (t, g), b1 (t + 4, g).
// a_frag_b_kn takes its A from a score fragment in the C layout, whose
// lane holds columns 2t and 2t + 1 of each 8-column tile: k positions t and
// t + 4 of the instruction stand for columns 2t and 2t + 1, and B's rows
// are read in the same order, so no shuffle is needed (the k order of a
// product's sum is free). Shared-memory rows are d + 4 floats
// (attention_row_stride), so that lanes (g, t) reading element [g][t] (the
// nk form) or [2t][g] (the kn form) hit 32 distinct banks: every load is
// a conflict-free 4-byte load. The forward's S = Q K^T (a_held_b_nk) maps
// k positions t and t + 4 to columns 2t and 2t + 1 instead, so that a lane
// reads both of a row's elements with one 8-byte load, from rows of d + 8
// floats (attention_forward_qk_stride: lanes (g, t) of a half-warp read
// [g][2t], 32 distinct banks).
//
// Limits: k a multiple of 8. Nothing is held between calls (HeldA is empty):
// the split of A is recomputed from shared memory, which costs fewer
// registers than holding two TF32 copies of the forward's Q. Stages are
// f32's; key tiles are 64 keys up to d = 64, and no per-warp staging buffer
// is allocated, since these products stage nothing (attention_config.h,
// AttentionStorage).
#pragma once

#include <cstdint>

#include "attention/attention_fragment.cuh"
#include "common/dtype.cuh"

namespace exphil::kernels::attn {

// x = big + small + (at most 2^-22 x). big is TF32 (an f32 bit pattern
// whose low 13 mantissa bits are zero), so that small = x - big is exact in
// f32. small keeps its low bits: the TF32 instructions read the top 19 bits
// of an operand (they truncate), which is what clearing them did, and
// hardware that read more of small could only be closer to x. One
// instruction fewer per split; on an H200 every output stayed bitwise what
// the masked split gave, at the same speed (bench/RESULTS.md).
struct Tf32Split {
  uint32_t big, small;
};
constexpr uint32_t kTf32Mask = 0xffffe000u;
// Nearest TF32, ties away from zero (cvt.rna's rounding: adding half a TF32
// ulp to the magnitude bits carries into the exponent where it must). inf
// stays inf and a quiet NaN stays NaN.
__device__ __forceinline__ uint32_t round_to_tf32(float x) {
  return (__float_as_uint(x) + 0x1000u) & kTf32Mask;
}
__device__ __forceinline__ Tf32Split split_tf32(float x) {
  const uint32_t big = round_to_tf32(x);
  return {big, __float_as_uint(x - __uint_as_float(big))};
}

// c += A . B, one m16n8k8 TF32 instruction. Not volatile: the compiler may
// interleave the independent products of a step.
__device__ __forceinline__ void mma_tf32(float (&c)[4], uint32_t a0, uint32_t a1, uint32_t a2,
                                         uint32_t a3, uint32_t b0, uint32_t b1) {
  asm("mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
      "{%8,%9}, {%0,%1,%2,%3};\n"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}

// Where a_smem_km_b_kn's A keeps element (m, k), m < 16: row k of lda
// floats, m swapped with m ^ 8 in rows whose bit 2 is set. With lda = 8
// (mod 32) the reads (lanes at rows 2t and 2t + 1, columns g and g + 8)
// and the float2 stores of a score fragment's transpose (rows g, columns
// 2t) both fall in 32 distinct banks.
__device__ __forceinline__ int km_offset(int k, int m, int lda) {
  return k * lda + (m ^ ((k & 4) << 1));
}

template <>
struct WarpMma<Tf32x3> : ReadsAFromShared<Tf32x3> {
  // The forward's S = Q K^T: a_smem_b_nk with k positions t and t + 4 of
  // each 8-wide step standing for columns 2t and 2t + 1, so that a lane
  // reads both of its elements of an A or B row with one 8-byte load: lda
  // and ldb even (8 (mod 32) for no bank conflict). At k >= 64 its passes go
  // over eight tiles rather than four: the forward has the registers (150 at
  // d = 64, no spill), and B32 h8 T256 d64 ran 62.0 -> 59.7 us on an H200;
  // at d = 32 eight were 1.2 us slower.
  template <int kNT, int kK>
  __device__ __forceinline__ static void a_held_b_nk(float (&c)[kNT][4], const HeldA<kK>& /*held*/,
                                                     const Tf32x3* a, int lda, const Tf32x3* b,
                                                     int ldb, float* /*scratch*/) {
    static_assert(kK % 8 == 0, "k must be a multiple of 8");
    const int g = FragmentLanes<Tf32x3>::row(), t = FragmentLanes<Tf32x3>::col();
    const float* a_lo = &a[g * lda + 2 * t].value;
    const float* a_hi = &a[(g + 8) * lda + 2 * t].value;
    const float* b_row = &b[g * ldb + 2 * t].value;
#pragma unroll
    for (int k = 0; k < kK; k += 8) {
      const float2 lo = *reinterpret_cast<const float2*>(a_lo + k);
      const float2 hi = *reinterpret_cast<const float2*>(a_hi + k);
      const Tf32Split af[4] = {split_tf32(lo.x), split_tf32(hi.x), split_tf32(lo.y),
                               split_tf32(hi.y)};
      step<kNT, kK >= 64 ? 8 : 4>(c, af, [&](int j) {
        return *reinterpret_cast<const float2*>(b_row + 8 * j * ldb + k);
      });
    }
  }

  // c[kNT] += A[16][kK] . B^T, A row-major and B as [8 kNT][kK] rows, both
  // in shared memory.
  template <int kNT, int kK>
  __device__ __forceinline__ static void a_smem_b_nk(float (&c)[kNT][4], const Tf32x3* a, int lda,
                                                     const Tf32x3* b, int ldb, float* /*scratch*/) {
    static_assert(kK % 8 == 0, "k must be a multiple of 8");
    const int g = FragmentLanes<Tf32x3>::row(), t = FragmentLanes<Tf32x3>::col();
    const float* a_lo = &a[g * lda].value;
    const float* a_hi = &a[(g + 8) * lda].value;
    const float* b_row = &b[g * ldb].value;
#pragma unroll
    for (int k = 0; k < kK; k += 8) {
      const Tf32Split af[4] = {split_tf32(a_lo[k + t]), split_tf32(a_hi[k + t]),
                               split_tf32(a_lo[k + t + 4]), split_tf32(a_hi[k + t + 4])};
      step<kNT>(c, af, [&](int j) {
        return make_float2(b_row[8 * j * ldb + k + t], b_row[8 * j * ldb + k + t + 4]);
      });
    }
  }

  // Two independent a_smem_b_nk products, c0 += A0 . B0^T and c1 += A1 .
  // B1^T, interleaved (A0, A1 and B0, B1 with the same strides): every pass
  // has 2 kNT accumulators to go over instead of kNT, so that a product
  // does not wait on its own chain (the fused backward's P^T and dP^T,
  // kNT = 4).
  template <int kNT, int kK>
  __device__ __forceinline__ static void a_smem_b_nk_pair(float (&c0)[kNT][4],
                                                          float (&c1)[kNT][4],
                                                          const Tf32x3* a0, const Tf32x3* a1,
                                                          int lda, const Tf32x3* b0,
                                                          const Tf32x3* b1, int ldb) {
    static_assert(kK % 8 == 0, "k must be a multiple of 8");
    const int g = FragmentLanes<Tf32x3>::row(), t = FragmentLanes<Tf32x3>::col();
    const float* a0_lo = &a0[g * lda].value;
    const float* a0_hi = &a0[(g + 8) * lda].value;
    const float* a1_lo = &a1[g * lda].value;
    const float* a1_hi = &a1[(g + 8) * lda].value;
    const float* b0_row = &b0[g * ldb].value;
    const float* b1_row = &b1[g * ldb].value;
#pragma unroll
    for (int k = 0; k < kK; k += 8) {
      const Tf32Split af0[4] = {split_tf32(a0_lo[k + t]), split_tf32(a0_hi[k + t]),
                                split_tf32(a0_lo[k + t + 4]), split_tf32(a0_hi[k + t + 4])};
      const Tf32Split af1[4] = {split_tf32(a1_lo[k + t]), split_tf32(a1_hi[k + t]),
                                split_tf32(a1_lo[k + t + 4]), split_tf32(a1_hi[k + t + 4])};
      Tf32Split bf0[kNT][2], bf1[kNT][2];
#pragma unroll
      for (int j = 0; j < kNT; ++j) {
        const int at = 8 * j * ldb + k + t;
        bf0[j][0] = split_tf32(b0_row[at]);
        bf0[j][1] = split_tf32(b0_row[at + 4]);
        bf1[j][0] = split_tf32(b1_row[at]);
        bf1[j][1] = split_tf32(b1_row[at + 4]);
      }
      pass<0>(c0, af0, bf0);
      pass<0>(c1, af1, bf1);
      pass<1>(c0, af0, bf0);
      pass<1>(c1, af1, bf1);
      pass<2>(c0, af0, bf0);
      pass<2>(c1, af1, bf1);
    }
  }

  // c[kNT] += A . B, A [16][kK] stored k-major in shared memory as
  // km_offset() places it (the fused backward's dS^T tile read as dS), B as
  // [kK][8 kNT] rows in shared memory. k positions t and t + 4 are rows 2t
  // and 2t + 1 of both, as in a_frag_b_kn.
  template <int kNT, int kK>
  __device__ __forceinline__ static void a_smem_km_b_kn(float (&c)[kNT][4], const float* a,
                                                        int lda, const Tf32x3* b, int ldb) {
    static_assert(kK % 8 == 0, "k must be a multiple of 8");
    const int g = FragmentLanes<Tf32x3>::row(), t = FragmentLanes<Tf32x3>::col();
#pragma unroll
    for (int k = 0; k < kK; k += 8) {
      const int k0 = k + 2 * t, k1 = k0 + 1;
      const Tf32Split af[4] = {
          split_tf32(a[km_offset(k0, g, lda)]), split_tf32(a[km_offset(k0, g + 8, lda)]),
          split_tf32(a[km_offset(k1, g, lda)]), split_tf32(a[km_offset(k1, g + 8, lda)])};
      const float* b_rows = &b[k0 * ldb + g].value;
      step<kNT>(c, af, [&](int j) { return make_float2(b_rows[8 * j], b_rows[ldb + 8 * j]); });
    }
  }

  // c[kNT] += P . B, P the 16 x kK score fragment `p` (C layout), B as
  // [kK][8 kNT] rows in shared memory.
  template <int kNT, int kK>
  __device__ __forceinline__ static void a_frag_b_kn(float (&c)[kNT][4], const float (&p)[kK / 8][4],
                                                     const Tf32x3* b, int ldb, float* /*scratch*/) {
    static_assert(kK % 8 == 0, "k must be a multiple of 8");
    const int g = FragmentLanes<Tf32x3>::row(), t = FragmentLanes<Tf32x3>::col();
#pragma unroll
    for (int i = 0; i < kK / 8; ++i) {
      // k positions t and t + 4 are the fragment's columns 2t and 2t + 1
      const Tf32Split af[4] = {split_tf32(p[i][0]), split_tf32(p[i][2]), split_tf32(p[i][1]),
                               split_tf32(p[i][3])};
      const float* b_rows = &b[(8 * i + 2 * t) * ldb + g].value;
      // Eight tiles per pass where they come in eights (d = 64 and 128):
      // the d = 128 forward ran 118.7 -> 115.2 us at B32 h8 T256 on an H200.
      step<kNT, kNT % 8 == 0 ? 8 : 4>(
          c, af, [&](int j) { return make_float2(b_rows[8 * j], b_rows[ldb + 8 * j]); });
    }
  }

 private:
  // c[kNT] += A . B over one 8-wide k step, with A split as af and B's
  // elements (b0, b1) of 8-column tile j read by b(j). Tiles go kGroup at a
  // time (four unless the caller asks for more), each of the three passes
  // over all of them, so that no product waits on the one before it.
  template <int kNT, int kMaxGroup = 4, class ReadB>
  __device__ __forceinline__ static void step(float (&c)[kNT][4], const Tf32Split (&af)[4],
                                              ReadB b) {
    constexpr int kGroup = kNT < kMaxGroup ? kNT : kMaxGroup;
    static_assert(kNT % kGroup == 0, "tiles come in whole groups");
#pragma unroll
    for (int j0 = 0; j0 < kNT; j0 += kGroup) {
      Tf32Split bf[kGroup][2];
#pragma unroll
      for (int j = 0; j < kGroup; ++j) {
        const float2 pair = b(j0 + j);
        bf[j][0] = split_tf32(pair.x);
        bf[j][1] = split_tf32(pair.y);
      }
      float(&part)[kGroup][4] = *reinterpret_cast<float(*)[kGroup][4]>(&c[j0]);
      pass<0>(part, af, bf);
      pass<1>(part, af, bf);
      pass<2>(part, af, bf);
    }
  }

  // One of a step's three products over tiles [0, kN) of c, with A split as
  // af and B as bf: pass 0 adds small . big, 1 big . small, 2 big . big.
  template <int kPass, int kN>
  __device__ __forceinline__ static void pass(float (&c)[kN][4], const Tf32Split (&af)[4],
                                              const Tf32Split (&bf)[kN][2]) {
    auto a = [&](int i) { return kPass == 0 ? af[i].small : af[i].big; };
    auto b = [&](int j, int i) { return kPass == 1 ? bf[j][i].small : bf[j][i].big; };
#pragma unroll
    for (int j = 0; j < kN; ++j) mma_tf32(c[j], a(0), a(1), a(2), a(3), b(j, 0), b(j, 1));
  }
};

}  // namespace exphil::kernels::attn
