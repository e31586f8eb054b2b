// Bitwise reproducibility of attention (exphil.h: "No atomics: bitwise
// deterministic"): the same inputs give the same bytes for every output,
// on fresh buffers and on another stream. grad_k and grad_v, summed over
// the query heads of a group and over query tiles, and the fused backward's
// grad_q, summed over key blocks, are where an order that depends on block
// scheduling would show. Shapes for the sm_80 kernels and,
// on Hopper, for the warpgroup ones.
#include <catch2/catch.hpp>

#include <cuda_runtime_api.h>

#include "attention_harness.hpp"
#include "scan_problems.hpp"

using namespace exphil;
using namespace exphil::test;

TEST_CASE("attention forward and backward are bitwise reproducible", "[gpu][attention]") {
  cudaStream_t stream = nullptr;
  REQUIRE(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking) == cudaSuccess);
  // The second shape fills an H100 or H200 with 64-row query and key blocks,
  // so there f16 and bf16 run the Hopper kernels (attention_*_wgmma.cuh).
  const AttentionDims shapes[] = {{3, 8, 2, 300, 333}, {4, 8, 4, 300, 600}};
  for (const AttentionDims& dims : shapes) {
    // f32 four times: exact, precision tf32x3, and both in four-warp
    // blocks, which is the fused backward (its dQ summed across blocks in
    // an order that counters enforce).
    for (int variant = 0; variant < 6; ++variant) {
      const DType dtype = variant == 2 ? DType::f16 : variant == 3 ? DType::bf16 : DType::f32;
      AttentionRun r = attention_run(dtype, 64, dims, AttentionMask::causal);
      if (variant == 1 || variant == 4) r.options.precision = AttentionPrecision::tf32x3;
      if (variant >= 4) r.warps = 4;
      if (!within_test_size(r)) continue;
      const uint64_t seed = test_seed();
      INFO(describe(r) << " seed=" << seed);
      const AttentionCheck first = check_attention(r, attention_cpp_runner(), seed);
      const AttentionCheck again = check_attention(r, attention_cpp_runner(), seed);
      const AttentionCheck other = check_attention(r, attention_cpp_runner(stream), seed);
      INFO(first.report());
      CHECK(first.failures.empty());
      if (variant >= 4) CHECK(first.backward_layout.fused_backward);
      for (const AttentionCheck* c : {&again, &other}) {
        CHECK(c->outputs.o == first.outputs.o);
        CHECK(c->outputs.lse == first.outputs.lse);
        CHECK(c->outputs.grad_q == first.outputs.grad_q);
        CHECK(c->outputs.grad_k == first.outputs.grad_k);
        CHECK(c->outputs.grad_v == first.outputs.grad_v);
      }
    }
  }
  cudaStreamDestroy(stream);
}
