// FastDivisor (cuda/common/fast_divisor.h) against integer division: every
// divisor up to 4096 and random ones up to 2^31 - 1, each at the dividends
// where a rounding error would show first (multiples of d and their
// neighbours, the top of the range) and at random ones.
#include <catch2/catch.hpp>

#include <cstdint>
#include <random>
#include <vector>

#include "common/fast_divisor.h"

using exphil::kernels::FastDivisor;

namespace {

constexpr uint32_t kTop = 0x7fffffffu;  // the largest dividend and divisor

// Dividends near multiples of d, the range's ends, and random ones.
std::vector<uint32_t> dividends(uint32_t d, std::mt19937_64& rng) {
  std::vector<uint32_t> n = {0, 1, d - 1, d, kTop, kTop - 1, kTop - kTop % d, kTop - kTop % d - 1};
  std::uniform_int_distribution<uint32_t> any(0, kTop);
  for (int i = 0; i < 64; ++i) {
    const uint64_t q = any(rng) / d;
    for (const int64_t e : {-1, 0, 1}) {
      const int64_t v = static_cast<int64_t>(q * d) + e;
      if (v >= 0 && v <= kTop) n.push_back(static_cast<uint32_t>(v));
    }
    n.push_back(any(rng));
  }
  return n;
}

}  // namespace

TEST_CASE("FastDivisor gives n / d for every dividend below 2^31", "[fast_divisor]") {
  std::mt19937_64 rng(20261129);
  std::vector<uint32_t> divisors;
  for (uint32_t d = 1; d <= 4096; ++d) divisors.push_back(d);
  for (const uint32_t d : {8191u, 8193u, 65535u, 65537u, 1000003u, 0x40000000u, 0x40000001u, kTop})
    divisors.push_back(d);
  std::uniform_int_distribution<uint32_t> big(4097, kTop);
  for (int i = 0; i < 2000; ++i) divisors.push_back(big(rng));
  int64_t checked = 0, wrong = 0;
  for (const uint32_t d : divisors) {
    const FastDivisor f(d);
    for (const uint32_t n : dividends(d, rng)) {
      ++checked;
      if (f.quotient(n) != n / d) {
        ++wrong;
        if (wrong <= 5) FAIL_CHECK("d " << d << " n " << n << ": " << f.quotient(n) << " not " << n / d);
      }
    }
  }
  INFO(checked << " quotients checked");
  CHECK(wrong == 0);
  CHECK(checked > 1000000);
}
