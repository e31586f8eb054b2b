// The attention section of exphil_bench (bench_attention.cpp).
#pragma once

#include "bench_section.hpp"

namespace exphil::bench {

void bench_attention(const SectionContext& context);

}  // namespace exphil::bench
