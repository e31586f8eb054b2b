// The attention planner: every plan for a supported shape takes 1, 2 or 4
// warps per block with a shared-memory footprint within kAttnMaxSharedBytes,
// small problems shrink their blocks to fill the GPU, forced warps are
// honoured where memory allows, short f16/bf16 calls take the 32-key tile,
// the sizes the kernels cannot run are reported, the backward's workspace
// is B * Hq * T floats (and the fused backward's counters), f32 up to
// d = 64 with four-warp key blocks fuses its backward, and masked calls
// with more blocks than SMs hand them out heaviest first.
#include <catch2/catch.hpp>

#include <cstddef>
#include <cstdint>
#include <string>

#include "attention/attention_config.h"
#include "attention/attention_launch.h"

using namespace exphil::kernels;
using exphil::DType;
using exphil::dtype_size;

namespace {

constexpr int kH100SMs = 132;
constexpr auto kForward = AttentionDirection::forward;
constexpr auto kBackward = AttentionDirection::backward;
constexpr auto kCausal = AttentionMaskKind::causal;
constexpr DType kDtypes[] = {DType::f32, DType::f16, DType::bf16};
constexpr int kHeadDims[] = {32, 64, 96, 128};
constexpr auto kMaxShared = static_cast<std::size_t>(kAttnMaxSharedBytes);

AttentionShape shape(int64_t b, int64_t hq, int64_t hkv, int64_t t, int64_t s, int d) {
  AttentionShape x;
  x.batch = b;
  x.q_heads = hq;
  x.kv_heads = hkv;
  x.q_len = t;
  x.kv_len = s;
  x.head_dim = d;
  return x;
}

bool valid_warps(int w) { return w == 1 || w == 2 || w == 4; }

void check_fits(AttentionDirection direction, const AttentionPlan& plan, const AttentionShape& s,
                DType dtype) {
  const std::size_t elem = dtype_size(dtype);
  const bool backward = direction == kBackward;
  INFO((backward ? "backward " : "forward ")
       << exphil::dtype_name(dtype) << " B " << s.batch << " Hq " << s.q_heads << " Hkv "
       << s.kv_heads << " T " << s.q_len << " S " << s.kv_len << " d " << s.head_dim
       << ": warps forward " << plan.forward_warps << " dq " << plan.dq_warps << " dkdv "
       << plan.dkdv_warps);
  CHECK(attention_unsupported(direction, plan, s, dtype) == nullptr);
  CHECK(valid_warps(plan.forward_warps));
  CHECK(attention_forward_shared_bytes(elem, s.head_dim, plan.forward_warps) <= kMaxShared);
  if (backward) {
    CHECK(valid_warps(plan.dq_warps));
    CHECK(valid_warps(plan.dkdv_warps));
    CHECK(attention_dq_shared_bytes(elem, s.head_dim, plan.dq_warps) <= kMaxShared);
    CHECK(attention_dkdv_shared_bytes(elem, s.head_dim, plan.dkdv_warps) <= kMaxShared);
  }
}

}  // namespace

TEST_CASE("attention plans take 1, 2 or 4 warps within the shared-memory limit", "[plan]") {
  const AttentionShape shapes[] = {
      shape(1, 8, 8, 32, 32, 0),      shape(32, 8, 8, 256, 256, 0),
      shape(1, 1, 1, 1, 1, 0),        shape(2, 4, 2, 5, 7, 0),
      shape(1, 32, 4, 4096, 4096, 0), shape(3, 6, 1, 100, 37, 0)};
  for (DType dtype : kDtypes)
    for (int d : kHeadDims)
      for (auto direction : {kForward, kBackward})
        for (AttentionShape s : shapes)
          for (int sm_count : {1, kH100SMs, 1024})
            for (int forced : {0, 1, 2, 4, 3, -1}) {
              s.head_dim = d;
              INFO("SMs " << sm_count << " forced " << forced);
              check_fits(direction,
                         plan_attention(direction, s, dtype, kCausal, sm_count, forced), s, dtype);
            }
}

TEST_CASE("attention plans fill the GPU for short sequences and use 4 warps for long ones",
          "[plan]") {
  for (DType dtype : kDtypes) {
    INFO(exphil::dtype_name(dtype));
    // B1 h8 T32: 8 (batch, head) pairs of 32 rows make 8 blocks of 4 warps;
    // one warp per block makes 16.
    const AttentionShape small = shape(1, 8, 8, 32, 32, 32);
    CHECK(plan_attention(kForward, small, dtype, kCausal, kH100SMs, 0).forward_warps == 1);
    const AttentionPlan small_bwd = plan_attention(kBackward, small, dtype, kCausal, kH100SMs, 0);
    CHECK(small_bwd.dq_warps == 1);
    CHECK(small_bwd.dkdv_warps == 1);
    // On a GPU of 8 SMs the 8 blocks of 4 warps suffice.
    CHECK(plan_attention(kForward, small, dtype, kCausal, 8, 0).forward_warps == 4);
    // B1 h8 T64 on 16 SMs: 8 blocks at 4 warps, 16 at 2.
    CHECK(plan_attention(kForward, shape(1, 8, 8, 64, 64, 32), dtype, kCausal, 16, 0)
              .forward_warps == 2);
    // B32 h8 T256: 256 pairs, 1024 blocks of 4 warps.
    const AttentionShape large = shape(32, 8, 8, 256, 256, 64);
    CHECK(plan_attention(kForward, large, dtype, kCausal, kH100SMs, 0).forward_warps == 4);
    const AttentionPlan large_bwd = plan_attention(kBackward, large, dtype, kCausal, kH100SMs, 0);
    CHECK(large_bwd.forward_warps == 4);
    CHECK(large_bwd.dq_warps == 4);
    CHECK(large_bwd.dkdv_warps == 4);
  }
  // The dK/dV kernel counts its blocks over the key heads and S: with one key
  // head and S = 32 it shrinks while the dQ kernel over 32 query heads and
  // T = 1024 does not.
  const AttentionPlan gqa =
      plan_attention(kBackward, shape(1, 32, 1, 1024, 32, 64), DType::bf16, kCausal, kH100SMs, 0);
  CHECK(gqa.dq_warps == 4);
  CHECK(gqa.dkdv_warps == 1);
}

TEST_CASE("attention plans honour forced warps where shared memory allows", "[plan]") {
  // Shapes that want 1 warp per block and 4: the forced count overrides both.
  const AttentionShape small = shape(1, 8, 8, 32, 32, 64);
  const AttentionShape large = shape(32, 8, 8, 256, 256, 64);
  for (DType dtype : kDtypes)
    for (int forced : {1, 2, 4})
      for (const AttentionShape& s : {small, large}) {
        INFO(exphil::dtype_name(dtype) << " forced " << forced << " B " << s.batch);
        const std::size_t elem = dtype_size(dtype);
        // At d = 64 every kernel's 4-warp block fits.
        REQUIRE(attention_forward_shared_bytes(elem, 64, 4) <= kMaxShared);
        REQUIRE(attention_dq_shared_bytes(elem, 64, 4) <= kMaxShared);
        REQUIRE(attention_dkdv_shared_bytes(elem, 64, 4) <= kMaxShared);
        const AttentionPlan fwd = plan_attention(kForward, s, dtype, kCausal, kH100SMs, forced);
        CHECK(fwd.forward_warps == forced);
        const AttentionPlan bwd = plan_attention(kBackward, s, dtype, kCausal, kH100SMs, forced);
        CHECK(bwd.forward_warps == forced);
        CHECK(bwd.dq_warps == forced);
        CHECK(bwd.dkdv_warps == forced);
      }
  // Anything but 1, 2 or 4 means "choose".
  for (int forced : {3, 8, -1}) {
    const AttentionShape small32 = shape(1, 8, 8, 32, 32, 32);
    INFO("forced " << forced);
    const auto forward_warps = [&](const AttentionShape& s) {
      return plan_attention(kForward, s, DType::f16, kCausal, kH100SMs, forced).forward_warps;
    };
    CHECK(forward_warps(small32) == 1);
    CHECK(forward_warps(large) == 4);
  }
}

namespace {

// The most warps, halving from `wanted`, whose block fits the limit.
int fitting_warps(int wanted, std::size_t (*bytes)(AttentionStorage, int, int),
                  AttentionStorage storage, int d) {
  int w = wanted;
  while (w > 1 && bytes(storage, d, w) > kMaxShared) w /= 2;
  return w;
}

}  // namespace

TEST_CASE("attention plans shrink blocks whose shared memory is over the limit", "[plan]") {
  // f32 at d = 128: the dQ and dK/dV kernels' 4-warp blocks do not fit, their
  // 2-warp blocks and the forward's 4-warp blocks do.
  REQUIRE(attention_dq_shared_bytes(4, 128, 4) > kMaxShared);
  REQUIRE(attention_dq_shared_bytes(4, 128, 2) <= kMaxShared);
  REQUIRE(attention_dkdv_shared_bytes(4, 128, 4) > kMaxShared);
  REQUIRE(attention_dkdv_shared_bytes(4, 128, 2) <= kMaxShared);
  REQUIRE(attention_forward_shared_bytes(4, 128, 4) <= kMaxShared);
  const AttentionShape large = shape(32, 8, 8, 256, 256, 128);
  for (int forced : {4, 0}) {
    INFO("forced " << forced);
    const AttentionPlan plan =
        plan_attention(kBackward, large, DType::f32, kCausal, kH100SMs, forced);
    CHECK(plan.forward_warps == 4);
    CHECK(plan.dq_warps == 2);
    CHECK(plan.dkdv_warps == 2);
    CHECK(attention_unsupported(kBackward, plan, large, DType::f32) == nullptr);
  }
  // Every dtype and width: a forced (or, on a shape that fills the GPU at 4
  // warps, a chosen) count is kept where it fits and halved until it does.
  for (DType dtype : kDtypes)
    for (int d : kHeadDims)
      for (int forced : {0, 1, 2, 4}) {
        const AttentionShape s = shape(32, 8, 8, 256, 256, d);
        const std::size_t elem = dtype_size(dtype);
        const int wanted = forced == 0 ? 4 : forced;
        INFO(exphil::dtype_name(dtype) << " d " << d << " forced " << forced);
        const AttentionPlan plan = plan_attention(kBackward, s, dtype, kCausal, kH100SMs, forced);
        CHECK(plan.forward_warps == fitting_warps(wanted, attention_forward_shared_bytes, elem, d));
        CHECK(plan.dq_warps == fitting_warps(wanted, attention_dq_shared_bytes, elem, d));
        CHECK(plan.dkdv_warps == fitting_warps(wanted, attention_dkdv_shared_bytes, elem, d));
      }
  // A hand-made plan over the limit is reported, not run.
  AttentionPlan over;
  over.dq_warps = 4;
  over.dkdv_warps = 4;
  const char* why = attention_unsupported(kBackward, over, large, DType::f32);
  REQUIRE(why != nullptr);
  CHECK_THAT(std::string(why), Catch::Matchers::Contains("shared memory"));
}

TEST_CASE("tf32x3 plans take 64-key tiles up to d = 64, no staging, within the limit",
          "[plan]") {
  constexpr auto kTf32x3 = AttentionPrecision::tf32x3;
  const AttentionStorage tensor_core_f32(4, true);
  const AttentionShape shapes[] = {shape(32, 8, 8, 256, 256, 0), shape(1, 8, 8, 32, 32, 0),
                                   shape(2, 4, 2, 5, 7, 0), shape(1, 32, 4, 4096, 4096, 0),
                                   shape(1, 8, 8, 64, 33, 0)};
  for (int d : kHeadDims)
    for (AttentionShape s : shapes)
      for (int forced : {0, 1, 2, 4})
        for (auto direction : {kForward, kBackward}) {
          s.head_dim = d;
          INFO("d " << d << " T " << s.q_len << " S " << s.kv_len << " forced " << forced);
          const AttentionPlan plan =
              plan_attention(direction, s, DType::f32, kCausal, kH100SMs, forced, false, kTf32x3);
          CHECK(plan.tf32x3);
          const bool wide = d <= 64 && s.kv_len > kAttnShortKeys;
          CHECK(plan.key_tile == (wide ? 64 : 32));
          CHECK(attention_forward_shared_bytes(tensor_core_f32, d, plan.forward_warps,
                                               plan.key_tile) <= kMaxShared);
          if (direction == kBackward) {
            CHECK(attention_dq_shared_bytes(tensor_core_f32, d, plan.dq_warps, plan.key_tile) <=
                  kMaxShared);
            CHECK(attention_dkdv_shared_bytes(tensor_core_f32, d, plan.dkdv_warps) <= kMaxShared);
          }
          CHECK(attention_unsupported(direction, plan, s, DType::f32) == nullptr);
        }
  // The staging buffer tf32x3 does without pays for the wider tile: the
  // training shape keeps exact f32's warps per block at every width.
  for (int d : kHeadDims) {
    INFO("d " << d);
    const AttentionShape s = shape(32, 8, 8, 256, 256, d);
    const AttentionPlan exact = plan_attention(kBackward, s, DType::f32, kCausal, kH100SMs, 0);
    const AttentionPlan plan =
        plan_attention(kBackward, s, DType::f32, kCausal, kH100SMs, 0, false, kTf32x3);
    CHECK(plan.forward_warps == exact.forward_warps);
    CHECK(plan.dq_warps == exact.dq_warps);
    CHECK(plan.dkdv_warps == exact.dkdv_warps);
    CHECK(attention_scratch_bytes(tensor_core_f32, 4, plan.key_tile) == 0);
  }
  // The option means nothing to f16 and bf16, and exact f32 keeps its plan.
  const AttentionShape s = shape(32, 8, 8, 256, 256, 64);
  CHECK_FALSE(plan_attention(kForward, s, DType::f32, kCausal, kH100SMs, 0).tf32x3);
  for (DType dtype : {DType::f16, DType::bf16})
    CHECK_FALSE(plan_attention(kForward, s, dtype, kCausal, kH100SMs, 0, false, kTf32x3).tf32x3);
}

TEST_CASE("attention planner reports the sizes the kernels cannot run", "[plan]") {
  const auto why = [](AttentionDirection direction, const AttentionShape& s) -> std::string {
    const AttentionPlan plan = plan_attention(direction, s, DType::f16, kCausal, kH100SMs, 0);
    const char* reason = attention_unsupported(direction, plan, s, DType::f16);
    return reason ? reason : "";
  };
  using Catch::Matchers::Contains;
  for (auto direction : {kForward, kBackward}) {
    INFO((direction == kForward ? "forward" : "backward"));
    for (int d : {48, 256, 16, 0, 129}) {
      INFO("d " << d);
      CHECK_THAT(why(direction, shape(1, 1, 1, 8, 8, d)), Contains("head width"));
    }
    CHECK_THAT(why(direction, shape(65536, 1, 1, 8, 8, 64)), Contains("B is over 65535"));
    CHECK_THAT(why(direction, shape(1, 65536, 1, 8, 8, 64)), Contains("Hq is over 65535"));
    CHECK_THAT(why(direction, shape(1, 65536, 65536, 8, 8, 64)), Contains("Hq is over 65535"));
    const int64_t past_grid_x = int64_t{kAttnRowsPerWarp} * 2147483648LL;
    CHECK_THAT(why(direction, shape(1, 1, 1, past_grid_x, 8, 64)), Contains("T or S"));
    CHECK_THAT(why(direction, shape(1, 1, 1, 8, past_grid_x, 64)), Contains("T or S"));
    // The largest B and Hq the grid takes.
    CHECK(why(direction, shape(65535, 1, 1, 8, 8, 64)).empty());
    CHECK(why(direction, shape(1, 65535, 5, 8, 8, 64)).empty());
  }
}

TEST_CASE("attention workspace: B * Hq * T floats for a backward with dK or dV, none otherwise",
          "[plan]") {
  int dummy = 0;
  for (DType dtype : kDtypes)
    for (int d : kHeadDims) {
      // T != S and Hq != Hkv, so that only the query side can match.
      const AttentionShape s = shape(3, 8, 2, 100, 37, d);
      INFO(exphil::dtype_name(dtype) << " d " << d);
      const AttentionPlan fwd = plan_attention(kForward, s, dtype, kCausal, kH100SMs, 0);
      CHECK(fwd.ws_floats == 0);
      const AttentionPlan bwd = plan_attention(kBackward, s, dtype, kCausal, kH100SMs, 0);
      CHECK(bwd.ws_floats == 3 * 8 * 100);
      AttentionBackwardParams p;
      CHECK(attention_backward_workspace_bytes(p, bwd) == 0);
      p.d_grad_q = &dummy;  // dQ alone: its kernel keeps rowsum(dO * O) to itself
      CHECK(attention_backward_workspace_bytes(p, bwd) == 0);
      p.d_grad_v = &dummy;
      CHECK(attention_backward_workspace_bytes(p, bwd) == std::size_t{3 * 8 * 100} * sizeof(float));
      p.d_grad_q = p.d_grad_v = nullptr;
      p.d_grad_k = &dummy;
      CHECK(attention_backward_workspace_bytes(p, bwd) == std::size_t{3 * 8 * 100} * sizeof(float));
    }
}

TEST_CASE("attention fuses the f32 backward up to d = 64 in four-warp key blocks", "[plan]") {
  constexpr auto kTf32x3 = AttentionPrecision::tf32x3;
  const AttentionShape large = shape(32, 8, 8, 256, 256, 64);  // 1024 key blocks
  const AttentionShape small = shape(1, 8, 8, 64, 64, 64);     // 8 key blocks of 4 warps
  for (int d : kHeadDims)
    for (int forced : {0, 1, 2, 4}) {
      INFO("d " << d << " forced " << forced);
      AttentionShape s = large;
      s.head_dim = d;
      const AttentionPlan plan =
          plan_attention(kBackward, s, DType::f32, kCausal, kH100SMs, forced, false, kTf32x3);
      const bool fused = d <= 64 && plan.dkdv_warps == 4;
      CHECK(plan.fused_backward == fused);
      CHECK(plan.fused_backward == (d <= 64 && (forced == 0 || forced == 4)));
      CHECK(attention_unsupported(kBackward, plan, s, DType::f32) == nullptr);
      if (fused) {
        CHECK(attention_fused_backward_shared_bytes(AttentionStorage(4, true), d) <= kMaxShared);
        CHECK(attention_fused_backward_shared_bytes(AttentionStorage(4), d) <= kMaxShared);
      }
      CHECK(plan.ws_floats == 32 * 8 * 256);
      // Exact f32 likewise; the forward, f16 and bf16 never fuse.
      const AttentionPlan exact = plan_attention(kBackward, s, DType::f32, kCausal, kH100SMs, forced);
      CHECK(exact.fused_backward == (d <= 64 && exact.dkdv_warps == 4));
      CHECK(exact.fused_backward == plan.fused_backward);
      CHECK(attention_unsupported(kBackward, exact, s, DType::f32) == nullptr);
      CHECK_FALSE(
          plan_attention(kForward, s, DType::f32, kCausal, kH100SMs, forced, false, kTf32x3)
              .fused_backward);
      for (DType dtype : {DType::f16, DType::bf16})
        CHECK_FALSE(plan_attention(kBackward, s, dtype, kCausal, kH100SMs, forced).fused_backward);
    }
  // More key blocks than 32-bit tickets count: the two-kernel backward.
  const AttentionShape huge = shape(65535, 65535, 65535, 1024, 1024, 64);
  const AttentionPlan huge_plan =
      plan_attention(kBackward, huge, DType::f32, kCausal, kH100SMs, 0, false, kTf32x3);
  CHECK(huge_plan.dkdv_warps == 4);
  CHECK_FALSE(huge_plan.fused_backward);
  CHECK_FALSE(plan_attention(kBackward, huge, DType::f32, kCausal, kH100SMs, 0).fused_backward);
  // Blocks shrink below four warps to fill the GPU: the two-kernel backward.
  CHECK_FALSE(
      plan_attention(kBackward, small, DType::f32, kCausal, kH100SMs, 0, false, kTf32x3)
          .fused_backward);
  const AttentionPlan forced =
      plan_attention(kBackward, small, DType::f32, kCausal, kH100SMs, 4, false, kTf32x3);
  CHECK(forced.fused_backward);
  // The fused kernel's workspace: the rows' sums, then one ticket word and
  // four counters per 32-query tile of every (batch, query head); T = 33
  // makes two tiles. Without dQ the call runs the rowsum and dK/dV
  // kernels, whose workspace is the rows' sums alone.
  const AttentionShape odd_shape = shape(3, 4, 2, 33, 70, 32);
  const AttentionPlan odd =
      plan_attention(kBackward, odd_shape, DType::f32, kCausal, kH100SMs, 4, false, kTf32x3);
  CHECK(odd.fused_backward);
  AttentionBackwardParams p;
  p.problem.shape = odd_shape;
  int dummy = 0;
  p.d_grad_q = &dummy;
  CHECK(attention_backward_workspace_bytes(p, odd) == 0);
  p.d_grad_k = &dummy;
  CHECK(attention_backward_workspace_bytes(p, odd) ==
        std::size_t{3 * 4 * 33} * sizeof(float) + std::size_t{1 + 3 * 4 * 2 * 4} * 4);
  p.d_grad_q = nullptr;
  CHECK(attention_backward_workspace_bytes(p, odd) == std::size_t{3 * 4 * 33} * sizeof(float));
}

TEST_CASE("attention plans take 32-key tiles for f32 and for f16/bf16 calls with S <= 32",
          "[plan]") {
  for (const DType dtype : kDtypes)
    for (const int64_t kv_len : {1, 17, 32, 33, 64, 257}) {
      const AttentionShape s = shape(1, 8, 8, 32, kv_len, 64);
      const bool wide = dtype != DType::f32 && kv_len > kAttnShortKeys;
      INFO(exphil::dtype_name(dtype) << " S " << kv_len);
      for (const AttentionDirection direction : {kForward, kBackward}) {
        const AttentionPlan plan = plan_attention(direction, s, dtype, kCausal, kH100SMs, 0);
        CHECK(plan.key_tile == (wide ? 64 : 32));
        // The tile's shared memory never exceeds what the warps were sized for.
        const std::size_t elem = dtype_size(dtype);
        CHECK(attention_forward_shared_bytes(elem, 64, plan.forward_warps, plan.key_tile) <=
              attention_forward_shared_bytes(elem, 64, plan.forward_warps));
        CHECK(attention_unsupported(direction, plan, s, dtype) == nullptr);
      }
    }
}

TEST_CASE("attention plans hand blocks out heaviest first only for masked calls with many blocks",
          "[plan]") {
  // B32 h8 T256 d64: 1024 query blocks of 4 warps, as many key blocks.
  const AttentionShape large = shape(32, 8, 8, 256, 256, 64);
  // B1 h8 T32: the blocks shrink to one warp and still number 16.
  const AttentionShape small = shape(1, 8, 8, 32, 32, 64);
  for (const DType dtype : kDtypes)
    for (const AttentionMaskKind mask :
         {AttentionMaskKind::none, AttentionMaskKind::causal, AttentionMaskKind::window}) {
      INFO(exphil::dtype_name(dtype) << " mask " << static_cast<int>(mask));
      const bool masked = mask != AttentionMaskKind::none;
      const AttentionPlan big = plan_attention(kBackward, large, dtype, mask, kH100SMs, 0);
      CHECK(big.forward_heaviest_first == masked);
      CHECK(big.dq_heaviest_first == masked);
      CHECK(big.dkdv_heaviest_first == masked);
      const AttentionPlan few = plan_attention(kBackward, small, dtype, mask, kH100SMs, 0);
      CHECK_FALSE(few.forward_heaviest_first);
      CHECK_FALSE(few.dq_heaviest_first);
      CHECK_FALSE(few.dkdv_heaviest_first);
    }
  // The count is of each kernel's own blocks: one key head over S = 64 makes
  // 4 dK/dV blocks while 32 query heads over T = 1024 make 512 dQ blocks.
  const AttentionPlan gqa = plan_attention(kBackward, shape(1, 32, 1, 1024, 64, 64), DType::bf16,
                                           AttentionMaskKind::causal, kH100SMs, 0);
  CHECK(gqa.dq_heaviest_first);
  CHECK_FALSE(gqa.dkdv_heaviest_first);
  // Past 2^32 blocks (no tensor in memory needs that many) the 32-bit
  // renumbering would overflow: grid order.
  const AttentionPlan huge = plan_attention(kBackward, shape(65535, 65535, 65535, 1024, 1024, 64),
                                            DType::bf16, AttentionMaskKind::causal, kH100SMs, 0);
  CHECK_FALSE(huge.forward_heaviest_first);
  CHECK_FALSE(huge.dq_heaviest_first);
  CHECK_FALSE(huge.dkdv_heaviest_first);
}

TEST_CASE("attention backward: dQ alone is one kernel, dK/dV with dQ or rowsum(dO * O) two",
          "[plan]") {
  AttentionBackwardParams p;
  int dummy = 0;
  CHECK(attention_backward_kernel_count(p) == 0);
  p.d_grad_q = &dummy;
  CHECK(attention_backward_kernel_count(p) == 1);  // dQ, which sums dO * O itself
  p.d_grad_k = &dummy;
  CHECK(attention_backward_kernel_count(p) == 2);  // and dK/dV
  p.d_grad_q = nullptr;
  CHECK(attention_backward_kernel_count(p) == 2);  // rowsum(dO * O), dK/dV
  p.d_grad_k = nullptr;
  p.d_grad_v = &dummy;
  CHECK(attention_backward_kernel_count(p) == 2);
}

TEST_CASE("attention planner gives the Hopper kernels the f16/bf16 calls they can run", "[plan]") {
  constexpr bool kWgmma = true;
  const AttentionShape large = shape(32, 8, 8, 256, 256, 64);
  for (DType dtype : {DType::f16, DType::bf16})
    for (int d : {64, 128}) {
      INFO("dtype size " << dtype_size(dtype) << " d " << d);
      AttentionShape s = large;
      s.head_dim = d;
      const AttentionPlan plan = plan_attention(kForward, s, dtype, kCausal, kH100SMs, 0, kWgmma);
      CHECK(plan.forward_wgmma);
      CHECK(plan.forward_warps == kAttnWgmmaThreads / 32);
      CHECK(plan.key_tile == kAttnWgmmaKeyTile);
      CHECK(attention_forward_wgmma_shared_bytes(dtype_size(dtype), d) <= kMaxShared);
      CHECK(attention_unsupported(kForward, plan, s, dtype) == nullptr);
      // Not without the device's say-so, not for four warps forced away,
      // and never in a backward plan.
      CHECK_FALSE(plan_attention(kForward, s, dtype, kCausal, kH100SMs, 0).forward_wgmma);
      CHECK_FALSE(plan_attention(kForward, s, dtype, kCausal, kH100SMs, 2, kWgmma).forward_wgmma);
      CHECK(plan_attention(kForward, s, dtype, kCausal, kH100SMs, 4, kWgmma).forward_wgmma);
      const AttentionPlan bwd = plan_attention(kBackward, s, dtype, kCausal, kH100SMs, 0, kWgmma);
      CHECK_FALSE(bwd.forward_wgmma);
      // The backward's Hopper kernels are d = 64 only.
      CHECK(bwd.dq_wgmma == (d == 64));
      CHECK(bwd.dkdv_wgmma == (d == 64));
      CHECK(attention_unsupported(kBackward, bwd, s, dtype) == nullptr);
      if (d == 64) {
        CHECK(attention_dq_wgmma_shared_bytes(dtype_size(dtype), d) <= kMaxShared);
        CHECK(attention_dkdv_wgmma_shared_bytes(dtype_size(dtype), d) <= kMaxShared);
      }
      const AttentionPlan portable = plan_attention(kBackward, s, dtype, kCausal, kH100SMs, 0);
      CHECK_FALSE(portable.dq_wgmma);
      CHECK_FALSE(portable.dkdv_wgmma);
    }
  // f32, other head widths, grids that shrink their blocks (B1 h8 T32 and
  // B1 h4 T64), and S within the short tile keep the sm_80 forward.
  CHECK_FALSE(plan_attention(kForward, large, DType::f32, kCausal, kH100SMs, 0, kWgmma).forward_wgmma);
  for (int d : {32, 96})
    CHECK_FALSE(plan_attention(kForward, shape(32, 8, 8, 256, 256, d), DType::bf16, kCausal,
                               kH100SMs, 0, kWgmma)
                    .forward_wgmma);
  CHECK_FALSE(plan_attention(kForward, shape(1, 8, 8, 32, 32, 64), DType::bf16, kCausal, kH100SMs,
                             0, kWgmma)
                  .forward_wgmma);
  CHECK_FALSE(plan_attention(kForward, shape(1, 4, 4, 64, 64, 64), DType::bf16, kCausal, kH100SMs,
                             0, kWgmma)
                  .forward_wgmma);
  CHECK_FALSE(plan_attention(kForward, shape(64, 8, 8, 256, 32, 64), DType::bf16, kCausal,
                             kH100SMs, 0, kWgmma)
                  .forward_wgmma);
}

TEST_CASE("attention Hopper kernels are available only on compute capability 9.0 builds with them",
          "[plan]") {
  for (int cc : {70, 75, 80, 86, 89, 100, 120}) CHECK_FALSE(attention_wgmma_available(cc));
  CHECK(attention_wgmma_available(90) == (EXPHIL_ATTENTION_WGMMA != 0));
}
