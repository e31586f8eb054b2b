// Attention on the GPU against the double reference (attention_harness.hpp):
// every dtype (and f32 with precision tf32x3), head width and mask over T
// and S in {1, 17, 32, 33, 100, 257, 1024}, equal and unequal, with GQA
// ratios 1, 2 and 4 and both layouts; tf32x3 not bitwise the exact path;
// the Hopper kernels and the sm_80 ones on the same cases; the
// Hopper forward's rescaling and a negative scale there; forced
// block sizes; NULL outputs; explicit scales; long sequences; the C++ API
// on a caller stream.
#include <catch2/catch.hpp>

#include <optional>
#include <string>
#include <vector>

#include <cuda_runtime_api.h>

#include "attention/attention_launch.h"
#include "attention_harness.hpp"
#include "scan_problems.hpp"

using namespace exphil;
using namespace exphil::test;

namespace {

// The check, for callers that also look at what the library chose; none when
// the case was left out.
std::optional<AttentionCheck> run_case(const AttentionRun& run,
                                       const AttentionRunner& runner = attention_cpp_runner()) {
  if (!within_test_size(run)) {
    // Only a sanitizer run sets the cap; its log says what was left out.
    SUCCEED("left out by EXPHIL_TEST_MAX_ELEMENTS: " << describe(run));
    return std::nullopt;
  }
  const uint64_t seed = test_seed();
  INFO(describe(run) << " seed=" << seed << " via " << runner.name);
  AttentionCheck c = check_attention(run, runner, seed);
  INFO(c.report());
  CHECK(c.failures.empty());
  return c;
}

// The current device's compute capability (10 major + minor) and SM count.
struct DeviceTraits {
  int compute_capability = 0, sms = 0;
};
DeviceTraits current_device() {
  int device = 0, major = 0, minor = 0;
  DeviceTraits t;
  REQUIRE(cudaGetDevice(&device) == cudaSuccess);
  REQUIRE(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device) == cudaSuccess);
  REQUIRE(cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, device) == cudaSuccess);
  REQUIRE(cudaDeviceGetAttribute(&t.sms, cudaDevAttrMultiProcessorCount, device) == cudaSuccess);
  t.compute_capability = 10 * major + minor;
  return t;
}

constexpr int64_t kLengths[] = {1, 17, 32, 33, 100, 257, 1024};
constexpr int kLengthCount = 7;

// For one dtype and head width: each length with itself and with another
// (so both T < S and T > S occur), under each mask, cycling the GQA ratio,
// the head counts and the layout so that every combination of them meets
// long and short sequences. `warps`: forced warps per block (0 chooses);
// `fused`: whether every backward must run the fused kernel.
void grid(DType dtype, int head_dim,
          AttentionPrecision precision = AttentionPrecision::exact, int warps = 0,
          bool fused = false) {
  int n = 0;
  for (AttentionMask mask : {AttentionMask::none, AttentionMask::causal, AttentionMask::window})
    for (int i = 0; i < kLengthCount; ++i)
      for (int other : {i, (i + 3) % kLengthCount}) {
        AttentionRun r;
        r.dtype = dtype;
        r.head_dim = head_dim;
        r.q_len = kLengths[i];
        r.kv_len = kLengths[other];
        const int ratio = 1 << (n % 3);  // 1, 2, 4
        const bool big = r.q_len * r.kv_len > 100000;
        r.kv_heads = big ? 1 : 1 + (n / 3) % 2;
        r.q_heads = r.kv_heads * ratio;
        r.batch = big ? 1 : 1 + n % 2;
        r.options.mask = mask;
        r.options.window = static_cast<int>(1 + (r.kv_len * (n % 4)) / 5);
        r.options.layout = n % 2 ? AttentionLayout::bthd : AttentionLayout::bhtd;
        r.options.precision = precision;
        r.warps = warps;
        ++n;
        const std::optional<AttentionCheck> c = run_case(r);
        if (c && fused) CHECK(c->backward_layout.fused_backward);
      }
}

}  // namespace

#define EXPHIL_ATTENTION_GRID(dtype, d)                                                  \
  TEST_CASE("attention " #dtype " d" #d " grid: every mask, T and S, GQA and layouts", \
            "[gpu][attention]") {                                                        \
    grid(DType::dtype, d);                                                               \
  }

EXPHIL_ATTENTION_GRID(f32, 32)
EXPHIL_ATTENTION_GRID(f32, 64)
EXPHIL_ATTENTION_GRID(f32, 96)
EXPHIL_ATTENTION_GRID(f32, 128)
EXPHIL_ATTENTION_GRID(f16, 32)
EXPHIL_ATTENTION_GRID(f16, 64)
EXPHIL_ATTENTION_GRID(f16, 96)
EXPHIL_ATTENTION_GRID(f16, 128)
EXPHIL_ATTENTION_GRID(bf16, 32)
EXPHIL_ATTENTION_GRID(bf16, 64)
EXPHIL_ATTENTION_GRID(bf16, 96)
EXPHIL_ATTENTION_GRID(bf16, 128)

#define EXPHIL_ATTENTION_TF32X3_GRID(d)                                                       \
  TEST_CASE("attention f32 tf32x3 d" #d " grid: every mask, T and S, GQA and layouts",      \
            "[gpu][attention]") {                                                             \
    grid(DType::f32, d, AttentionPrecision::tf32x3);                                          \
  }

EXPHIL_ATTENTION_TF32X3_GRID(32)
EXPHIL_ATTENTION_TF32X3_GRID(64)
EXPHIL_ATTENTION_TF32X3_GRID(96)
EXPHIL_ATTENTION_TF32X3_GRID(128)

// Four-warp blocks make every f32 backward up to d = 64 the fused kernel
// (attention_backward_fused.cuh), whose dQ sums run across blocks in a
// fixed order: the grid's tiles that no key block sees, chains of up to 16
// key blocks per query tile (S = 1024), GQA's query heads per key block;
// tf32x3 and exact f32 keep their dS tiles differently.
#define EXPHIL_ATTENTION_FUSED_GRID(d)                                                           \
  TEST_CASE("attention f32 d" #d " fused backward grid, tf32x3 and exact: every mask, T and S, " \
            "GQA and layouts",                                                                   \
            "[gpu][attention]") {                                                                \
    grid(DType::f32, d, AttentionPrecision::tf32x3, 4, true);                                    \
    grid(DType::f32, d, AttentionPrecision::exact, 4, true);                                     \
  }

EXPHIL_ATTENTION_FUSED_GRID(32)
EXPHIL_ATTENTION_FUSED_GRID(64)

// The tf32x3 grid above would pass on the exact kernels too: results that
// differ from the exact path's bytes (and both within tolerance) show that
// the option reaches the tensor-core kernels, in both directions
// (test_abi_gpu.cpp does the same through the C ABI).
TEST_CASE("attention f32 tf32x3 runs its own kernels: within tolerance, not the exact bytes",
          "[gpu][attention]") {
  AttentionRun exact = attention_run(DType::f32, 64, {2, 4, 2, 100, 130}, AttentionMask::causal);
  AttentionRun tf32x3 = exact;
  tf32x3.options.precision = AttentionPrecision::tf32x3;
  const std::optional<AttentionCheck> e = run_case(exact);
  const std::optional<AttentionCheck> t = run_case(tf32x3);
  REQUIRE(e);
  REQUIRE(t);
  CHECK(t->outputs.o != e->outputs.o);
  CHECK(t->outputs.grad_q != e->outputs.grad_q);
  CHECK(t->outputs.grad_k != e->outputs.grad_k);
  CHECK(t->outputs.grad_v != e->outputs.grad_v);
}

TEST_CASE("attention every forced block size gives the reference's results", "[gpu][attention]") {
  for (DType dtype : {DType::f32, DType::bf16})
    for (int warps : {1, 2, 4})
      for (AttentionMask mask : {AttentionMask::none, AttentionMask::causal}) {
        AttentionRun r = attention_run(dtype, 64, {2, 4, 2, 77, 130}, mask);
        r.warps = warps;
        run_case(r);
      }
}

TEST_CASE("attention Hopper kernels and the sm_80 ones on the same cases give the reference's results",
          "[gpu][attention]") {
  // Every shape has at least 132 blocks of 64 query rows (the SMs of an
  // H100 or H200), so the plan takes four-warp forward and dQ blocks and, on
  // an sm_90 device of a build with sm_90a, the warpgroup forward and, at
  // d = 64 (the only width whose backward runs here), the warpgroup dQ
  // kernel; the dK/dV kernel is the warpgroup one where 64-key blocks fill
  // the GPU too (every shape but the first; the last is small enough for
  // racecheck). With sm80_kernels set, the sm_80 kernels instead. Odd T and
  // S, T > S and T < S, GQA ratios 1, 2 and 4, both layouts, every mask.
  const DeviceTraits dev = current_device();
  const bool hopper = kernels::attention_wgmma_available(dev.compute_capability);
  const AttentionDims shapes[] = {{8, 8, 4, 257, 100}, {4, 8, 4, 300, 600}, {1, 16, 16, 600, 650},
                                  {17, 8, 8, 33, 77}, {33, 4, 4, 40, 40}};
  int n = 0;
  for (const AttentionDims& s : shapes)
    for (DType dtype : {DType::f16, DType::bf16})
      for (int d : {64, 128})
        for (AttentionMask mask :
             {AttentionMask::none, AttentionMask::causal, AttentionMask::window})
          for (bool sm80 : {false, true}) {
            AttentionRun r = attention_run(dtype, d, s, mask);
            r.options.window = static_cast<int>(1 + s.kv_len / 3);
            r.options.layout = n++ % 2 ? AttentionLayout::bthd : AttentionLayout::bhtd;
            r.sm80_kernels = sm80;
            r.backward = d == 64;  // the backward's Hopper kernels are d = 64 only
            const std::optional<AttentionCheck> c = run_case(r);
            if (!c) continue;
            INFO(describe(r) << (sm80 ? " (sm80_kernels)" : ""));
            const int64_t key_blocks = s.batch * s.kv_heads * ((s.kv_len + 63) / 64);
            CHECK(c->forward_layout.warpgroup_forward == (hopper && !sm80));
            CHECK(c->forward_layout.query_rows_per_block == 64);
            if (!r.backward) continue;
            CHECK(c->backward_layout.warpgroup_dkdv == (hopper && !sm80 && key_blocks >= dev.sms));
            CHECK(c->backward_layout.warpgroup_dq == (hopper && !sm80));
          }
}

TEST_CASE("attention forward: row maxima that jump between key tiles, and a negative scale",
          "[gpu][attention]") {
  // The forwards let a row's running max lag by up to 8 (base 2) and
  // rescale O only when a max rises further (online_softmax_tile), but for
  // the sm_80 f16/bf16 one up to d = 64, which rescales every tile
  // (online_softmax_tile_eager); both folds run here. With the default
  // scale, random scores never rise that far after the first tile.
  // At scale 2 (16 to 23 times the default here) about half of the later
  // tiles make some row of a warp rescale. A negative scale takes the path
  // that scales scores before the max even on unmasked tiles.
  // 160 blocks of 64 rows: the four-warp plan, so the Hopper kernels where
  // the build and the device have them (f16 and bf16), and with
  // sm80_kernels the sm_80 ones, which every f32 call runs. The forward
  // only at scale 2: there the backward's f16 dS falls to f16's subnormals,
  // whose fixed spacing (2^-24) the per-term tolerance does not model (an
  // H100 found f16 grad_k 2.5 times it at scale 2, d = 64, causal); the
  // backward at ordinary scales is the grid's.
  const bool hopper = kernels::attention_wgmma_available(current_device().compute_capability);
  struct Kind {
    DType dtype;
    AttentionPrecision precision;
  };
  for (const Kind kind : {Kind{DType::f16, AttentionPrecision::exact},
                          Kind{DType::bf16, AttentionPrecision::exact},
                          Kind{DType::f32, AttentionPrecision::exact},
                          Kind{DType::f32, AttentionPrecision::tf32x3}})
    for (bool sm80 : {false, true}) {
      if (kind.dtype == DType::f32 && !sm80) continue;  // f32 has no other kernels
      for (int d : {64, 128})
        for (AttentionMask mask : {AttentionMask::none, AttentionMask::causal})
          for (float scale : {2.0f, -0.3f}) {
            AttentionRun r = attention_run(kind.dtype, d, {4, 8, 4, 300, 600}, mask);
            r.options.scale = scale;
            r.options.precision = kind.precision;
            r.sm80_kernels = sm80;
            r.backward = d == 64 && scale < 1.0f;
            const std::optional<AttentionCheck> c = run_case(r);
            if (!c) continue;
            INFO(describe(r) << (sm80 ? " (sm80_kernels)" : ""));
            const bool wgmma = hopper && !sm80 && kind.dtype != DType::f32;
            CHECK(c->forward_layout.warpgroup_forward == wgmma);
          }
    }
}

TEST_CASE("attention blocks handed out heaviest first give the reference's results",
          "[gpu][attention]") {
  // Both shapes have more blocks in every kernel than any target GPU has SMs
  // (at most 144), so masked calls take the heaviest-first order and
  // unmasked ones grid order. The first: 64 query and 32 key (batch, head)
  // pairs of 5 row blocks each. The second, small enough for racecheck: 64
  // pairs of 64 rows, whose blocks shrink to one warp (256 of them).
  for (const AttentionDims& s : {AttentionDims{8, 8, 4, 300, 260}, AttentionDims{16, 4, 4, 64, 64}})
    for (DType dtype : {DType::f32, DType::bf16})
      for (AttentionMask mask :
           {AttentionMask::none, AttentionMask::causal, AttentionMask::window}) {
        AttentionRun r = attention_run(dtype, 32, s, mask);
        r.options.window = static_cast<int>(s.kv_len / 3);
        const std::optional<AttentionCheck> c = run_case(r);
        if (!c) continue;
        INFO(describe(r));
        const bool masked = mask != AttentionMask::none;
        CHECK(c->forward_layout.queries_heaviest_first == masked);
        CHECK(c->backward_layout.queries_heaviest_first == masked);
        CHECK(c->backward_layout.keys_heaviest_first == masked);
      }
}

TEST_CASE("attention NULL outputs are not written and the rest are right", "[gpu][attention]") {
  AttentionRun r = attention_run(DType::bf16, 64, {1, 4, 2, 40, 70}, AttentionMask::causal);
  SECTION("no lse from a forward-only call") {
    r.backward = false;
    r.write_lse = false;
    run_case(r);
  }
  SECTION("grad_q only") {
    r.grad_k = r.grad_v = false;
    run_case(r);
  }
  SECTION("grad_k and grad_v only") {
    r.grad_q = false;
    run_case(r);
  }
  SECTION("grad_v only") {
    r.grad_q = r.grad_k = false;
    run_case(r);
  }
}

TEST_CASE("attention explicit scales, including a negative one", "[gpu][attention]") {
  for (float scale : {0.5f, -0.3f, 2.0f}) {
    AttentionRun r = attention_run(DType::f32, 32, {1, 1, 1, 50, 50}, AttentionMask::causal);
    r.options.scale = scale;
    r.q_amplitude = 1.0;
    run_case(r);
  }
}

TEST_CASE("attention rows that see no key: o = 0, lse = -inf, no gradient", "[gpu][attention]") {
  for (DType dtype : {DType::f32, DType::f16, DType::bf16}) {
    for (AttentionPrecision precision : {AttentionPrecision::exact, AttentionPrecision::tf32x3}) {
      if (dtype != DType::f32 && precision != AttentionPrecision::exact) continue;
      // Causal with T > S: the first 60 rows see nothing.
      AttentionRun r = attention_run(dtype, 32, {1, 1, 1, 90, 30}, AttentionMask::causal);
      r.options.precision = precision;
      // f32 in four-warp blocks: the fused backward, where no block walks
      // the first query tile (its rows see no key) and key block 0 zeroes
      // its dQ.
      for (int warps : {0, 4}) {
        if (warps != 0 && dtype != DType::f32) continue;
        r.warps = warps;
        r.options.mask = AttentionMask::causal;
        run_case(r);
        r.options.mask = AttentionMask::window;
        r.options.window = 1;
        run_case(r);
      }
    }
  }
}

TEST_CASE("attention long sequences: T = S = 4100 causal, and 16384 with a window",
          "[gpu][attention]") {
  run_case(attention_run(DType::bf16, 64, {1, 1, 1, 4100, 4100}, AttentionMask::causal));
  AttentionRun r = attention_run(DType::f32, 128, {1, 1, 1, 16384, 16384}, AttentionMask::window);
  r.options.window = 100;
  run_case(r);
}

TEST_CASE("attention on a caller stream and through the C ABI", "[gpu][attention]") {
  cudaStream_t stream = nullptr;
  REQUIRE(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking) == cudaSuccess);
  AttentionRun r = attention_run(DType::f16, 96, {2, 8, 2, 45, 45}, AttentionMask::causal);
  r.options.layout = AttentionLayout::bthd;
  r.calls = 2;
  run_case(r, attention_cpp_runner(stream));
  cudaStreamDestroy(stream);
}
