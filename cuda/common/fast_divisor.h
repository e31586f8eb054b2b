// Division by a divisor fixed before the launch, as one high multiply and a
// shift (Granlund and Montgomery, "Division by invariant integers using
// multiplication", PLDI 1994, the round-up method).
//
// Why. A 32-bit division on the GPU is about 20 instructions (a float
// reciprocal refined by integer multiplies and two corrections); the
// backward's grad_R product found each of its A rows' step (m / T) that
// way, twice a thread every step of k, more instructions than its HMMAs
// (bench/RESULTS.md, issue 30 run DD).
//
// Method, for 1 <= d < 2^31 and 0 <= n < 2^31: with l = ceil(log2 d) and
// p = 31 + l, m = ceil(2^p / d) < 2^32 and n / d = floor(n m / 2^p): the
// error m d - 2^p < d adds less than n / 2^p < 2^-l <= 1/d to n / d, whose
// fraction is at most (d - 1) / d, so the floor holds. d = 1 is n itself.
//
// Where the dividends stay small, n d < 2^32, the gated RNN's staging
// keeps the shorter form, ceil(2^32 / d) and no shift
// (gated_rnn_common.cuh's GatedRnnRowStride and pair words); this one
// serves any n < 2^31, as a row b*T + t of B*T rows needs.
#pragma once

#include <cstdint>

#if defined(__CUDACC__)
#define EXPHIL_HOST_DEVICE __host__ __device__
#else
#define EXPHIL_HOST_DEVICE
#endif

namespace exphil::kernels {

struct FastDivisor {
  uint32_t multiplier = 0;  // 0: d = 1
  uint32_t shift = 0;

  FastDivisor() = default;
  // d in [1, 2^31).
  explicit FastDivisor(uint32_t d) {
    if (d <= 1) return;
    uint32_t l = 0;
    while ((uint64_t{1} << l) < d) ++l;
    multiplier = static_cast<uint32_t>(((uint64_t{1} << (31 + l)) + d - 1) / d);
    shift = l - 1;
  }

  // n / d for n in [0, 2^31).
  EXPHIL_HOST_DEVICE uint32_t quotient(uint32_t n) const {
    if (multiplier == 0) return n;
#if defined(__CUDA_ARCH__)
    return __umulhi(n, multiplier) >> shift;
#else
    return static_cast<uint32_t>((uint64_t{n} * multiplier) >> 32) >> shift;
#endif
  }
};

}  // namespace exphil::kernels

#undef EXPHIL_HOST_DEVICE
