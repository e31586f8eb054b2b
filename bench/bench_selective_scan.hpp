// The selective-scan section of exphil_bench (bench_selective_scan.cpp).
#pragma once

#include "bench_section.hpp"

namespace exphil::bench {

// `only_shape`: only this [B, T, D, N] (all zero: the shapes).
void bench_selective_scan(const SectionContext& context, const long long only_shape[4]);

}  // namespace exphil::bench
