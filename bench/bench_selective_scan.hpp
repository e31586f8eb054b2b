// The selective-scan section of exphil_bench (bench_selective_scan.cpp).
#pragma once

#include <string>
#include <vector>

#include <cuda_runtime_api.h>

namespace exphil::bench {

struct SelectiveScanBenchContext {
  cudaStream_t stream = nullptr;
  double copy_gbps = 0.0;
  double launch_floor_us = 0.0;
  std::size_t l2_bytes = 0;
  bool quick = false;
  std::vector<std::string>* targets = nullptr;  // "MET ..." / "MISSED ..." lines
  // Only this [B, T, D, N] (all zero: the shapes).
  long long only_shape[4] = {0, 0, 0, 0};
};

void bench_selective_scan(const SelectiveScanBenchContext& context);

}  // namespace exphil::bench
