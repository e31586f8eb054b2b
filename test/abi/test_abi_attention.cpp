// Attention through the C ABI of libexphil.so. Every class of bad input
// returns its status and a message that starts with the call, names the
// argument and says what was expected and what came; these checks come
// before any device query, so they run without a GPU on descriptors that
// point at fake, distinct, 16-byte-aligned addresses.
#include <catch2/catch.hpp>

#include <cstdint>
#include <initializer_list>
#include <limits>
#include <string>
#include <vector>

#include <cuda_runtime_api.h>

#include "abi_expectations.hpp"
#include "device_buffer.hpp"
#include "exphil/attention.hpp"
#include "exphil/exphil.h"

using Catch::Matchers::Contains;
using Catch::Matchers::StartsWith;

namespace {

// A well-formed call with every optional output present and fake device
// addresses 1 MiB apart: B=2, Hq=4, Hkv=2, T=5, S=7, d=32 in `layout`
// (BHTD: q [2, 4, 5, 32], k [2, 2, 7, 32]; BTHD: q [2, 5, 4, 32],
// k [2, 7, 2, 32]); lse [2, 4, 5] f32; no mask, scale 0. Each test breaks one
// thing.
struct FakeAttention {
  static constexpr int64_t kB = 2, kHq = 4, kHkv = 2, kT = 5, kS = 7, kD = 32;

  explicit FakeAttention(int32_t dtype = EXPHIL_F32, int32_t layout = EXPHIL_ATTENTION_BHTD) {
    exphil::test::FakeAddresses fake;
    const auto make = [&](exphil_tensor& t, int32_t type, std::initializer_list<int64_t> shape) {
      fake.fill(t, type, shape);
    };
    const bool bhtd = layout == EXPHIL_ATTENTION_BHTD;
    for (exphil_tensor* t : {&q, &o, &grad_o, &grad_q}) {
      if (bhtd)
        make(*t, dtype, {kB, kHq, kT, kD});
      else
        make(*t, dtype, {kB, kT, kHq, kD});
    }
    for (exphil_tensor* t : {&k, &v, &grad_k, &grad_v}) {
      if (bhtd)
        make(*t, dtype, {kB, kHkv, kS, kD});
      else
        make(*t, dtype, {kB, kS, kHkv, kD});
    }
    make(lse, EXPHIL_F32, {kB, kHq, kT});
    options.mask = EXPHIL_ATTENTION_MASK_NONE;
    options.window = 0;
    options.layout = layout;
    options.scale = 0.0f;
    options.precision = EXPHIL_ATTENTION_EXACT;
  }

  // The head width d of every tensor that has one.
  void set_head_dim(int64_t d) {
    for (exphil_tensor* t : {&q, &k, &v, &o, &grad_o, &grad_q, &grad_k, &grad_v}) t->shape[3] = d;
  }

  exphil_status forward() const {
    return exphil_attention_forward(q_p, k_p, v_p, options_p, o_p, lse_p, nullptr);
  }
  exphil_status backward() const {
    return exphil_attention_backward(q_p, k_p, v_p, o_p, lse_p, grad_o_p, options_p, grad_q_p,
                                     grad_k_p, grad_v_p, nullptr);
  }

  exphil_tensor q, k, v, o, lse, grad_o, grad_q, grad_k, grad_v;
  exphil_attention_options options{};

  const exphil_tensor *q_p = &q, *k_p = &k, *v_p = &v, *o_p = &o, *lse_p = &lse;
  const exphil_tensor *grad_o_p = &grad_o, *grad_q_p = &grad_q, *grad_k_p = &grad_k,
                      *grad_v_p = &grad_v;
  const exphil_attention_options* options_p = &options;
};

constexpr int32_t kLayouts[] = {EXPHIL_ATTENTION_BHTD, EXPHIL_ATTENTION_BTHD};
constexpr int32_t kDtypes[] = {EXPHIL_F32, EXPHIL_F16, EXPHIL_BF16};

void expect_rejected(exphil_status status, exphil_status expected, const char* direction,
                     const std::string& argument, const std::string& detail) {
  exphil::test::expect_rejected("attention", status, expected, direction, argument, detail);
}

void expect_invalid_forward(const FakeAttention& f, const std::string& argument,
                            const std::string& detail) {
  expect_rejected(f.forward(), EXPHIL_ERROR_INVALID_ARGUMENT, "forward", argument, detail);
}

void expect_invalid_backward(const FakeAttention& f, const std::string& argument,
                             const std::string& detail) {
  expect_rejected(f.backward(), EXPHIL_ERROR_INVALID_ARGUMENT, "backward", argument, detail);
}

// Both directions reject the same input of an argument they share.
void expect_invalid_both(const FakeAttention& f, const std::string& argument,
                         const std::string& detail) {
  expect_invalid_forward(f, argument, detail);
  expect_invalid_backward(f, argument, detail);
}

void expect_past_validation(exphil_status status, const char* direction) {
  exphil::test::expect_past_validation("attention", status, direction);
}

void expect_past_validation(const FakeAttention& f) {
  expect_past_validation(f.forward(), "forward");
  expect_past_validation(f.backward(), "backward");
}

}  // namespace

TEST_CASE("attention: a well-formed call on memory that is not on a GPU fails cleanly",
          "[abi][attention]") {
  SECTION("every dtype and layout, every supported head width") {
    for (int32_t dtype : kDtypes)
      for (int32_t layout : kLayouts)
        for (int64_t d : {32, 64, 96, 128}) {
          FakeAttention f(dtype, layout);
          f.set_head_dim(d);
          INFO("dtype " << dtype << " layout " << layout << " d " << d);
          expect_past_validation(f);
        }
  }
  SECTION("NULL options (no mask, BHTD, default scale)") {
    FakeAttention f;
    f.options_p = nullptr;
    expect_past_validation(f);
  }
  SECTION("no lse in the forward; no gradient outputs, or any one of them, in the backward") {
    FakeAttention f;
    f.lse_p = nullptr;
    expect_past_validation(f.forward(), "forward");
    FakeAttention g;
    g.grad_q_p = g.grad_k_p = g.grad_v_p = nullptr;
    expect_past_validation(g.backward(), "backward");
    for (const exphil_tensor* FakeAttention::*out :
         {&FakeAttention::grad_q_p, &FakeAttention::grad_k_p, &FakeAttention::grad_v_p}) {
      FakeAttention h;
      h.*out = nullptr;
      expect_past_validation(h.backward(), "backward");
    }
  }
  SECTION("every mask; the window is ignored without the window mask") {
    FakeAttention a;
    a.options.mask = EXPHIL_ATTENTION_MASK_CAUSAL;
    a.options.window = -5;
    expect_past_validation(a);
    FakeAttention b;
    b.options.mask = EXPHIL_ATTENTION_MASK_WINDOW;
    b.options.window = 1;
    expect_past_validation(b);
    b.options.window = std::numeric_limits<int32_t>::max();  // wider than S
    expect_past_validation(b);
    FakeAttention c;
    c.options.window = -1;  // mask none
    expect_past_validation(c);
  }
  SECTION("any finite scale, negative included") {
    FakeAttention f;
    for (float scale : {0.125f, -2.0f, std::numeric_limits<float>::max(), -0.0f}) {
      f.options.scale = scale;
      INFO("scale " << scale);
      expect_past_validation(f);
    }
  }
  SECTION("one key head (MQA), as many as the query heads (MHA); T = S = 1; T > S") {
    for (int32_t layout : kLayouts) {
      const int head_axis = layout == EXPHIL_ATTENTION_BHTD ? 1 : 2;
      for (int64_t hkv : {1, 4}) {
        FakeAttention f(EXPHIL_BF16, layout);
        for (exphil_tensor* t : {&f.k, &f.v, &f.grad_k, &f.grad_v}) t->shape[head_axis] = hkv;
        INFO("layout " << layout << " Hkv " << hkv);
        expect_past_validation(f);
      }
      FakeAttention g(EXPHIL_F16, layout);
      for (exphil_tensor* t : {&g.q, &g.o, &g.grad_o, &g.grad_q}) t->shape[3 - head_axis] = 1;
      for (exphil_tensor* t : {&g.k, &g.v, &g.grad_k, &g.grad_v}) t->shape[3 - head_axis] = 1;
      g.lse.shape[2] = 1;
      expect_past_validation(g);
      FakeAttention h(EXPHIL_F32, layout);
      for (exphil_tensor* t : {&h.k, &h.v, &h.grad_k, &h.grad_v}) t->shape[3 - head_axis] = 3;
      expect_past_validation(h);
    }
  }
  SECTION("inputs that alias each other") {
    FakeAttention f;
    f.v.data = f.k.data;
    expect_past_validation(f);
    FakeAttention g;  // q and k of one shape: Hkv = Hq, S = T
    g.k = g.q;
    g.v = g.q;
    g.grad_k.shape[1] = g.grad_v.shape[1] = FakeAttention::kHq;
    g.grad_k.shape[2] = g.grad_v.shape[2] = FakeAttention::kT;
    expect_past_validation(g);
    FakeAttention h;  // the backward's o and grad_o are inputs
    h.grad_o.data = h.o.data;
    expect_past_validation(h.backward(), "backward");
  }
}

TEST_CASE("attention: a NULL required descriptor or data pointer is rejected by name",
          "[abi][attention]") {
  const struct {
    const char* name;
    const exphil_tensor* FakeAttention::*pointer;
    exphil_tensor FakeAttention::*tensor;
  } shared[] = {{"q", &FakeAttention::q_p, &FakeAttention::q},
                {"k", &FakeAttention::k_p, &FakeAttention::k},
                {"v", &FakeAttention::v_p, &FakeAttention::v},
                {"o", &FakeAttention::o_p, &FakeAttention::o}};
  for (const auto& r : shared) {
    FakeAttention f;
    f.*r.pointer = nullptr;
    expect_invalid_both(f, r.name, "the tensor descriptor is NULL");
    FakeAttention g;
    (g.*r.tensor).data = nullptr;
    expect_invalid_both(g, r.name, "the data pointer is NULL");
  }
  // The backward's own required inputs; lse is optional only in the forward.
  const struct {
    const char* name;
    const exphil_tensor* FakeAttention::*pointer;
    exphil_tensor FakeAttention::*tensor;
  } backward[] = {{"lse", &FakeAttention::lse_p, &FakeAttention::lse},
                  {"grad_o", &FakeAttention::grad_o_p, &FakeAttention::grad_o}};
  for (const auto& r : backward) {
    FakeAttention f;
    f.*r.pointer = nullptr;
    expect_invalid_backward(f, r.name, "the tensor descriptor is NULL");
    FakeAttention g;
    (g.*r.tensor).data = nullptr;
    expect_invalid_backward(g, r.name, "the data pointer is NULL");
  }
  // A present optional descriptor with a NULL data pointer is an error, not
  // "absent".
  FakeAttention a;
  a.lse.data = nullptr;
  expect_invalid_forward(a, "lse", "the data pointer is NULL");
  const struct {
    const char* name;
    exphil_tensor FakeAttention::*tensor;
  } gradients[] = {{"grad_q", &FakeAttention::grad_q},
                   {"grad_k", &FakeAttention::grad_k},
                   {"grad_v", &FakeAttention::grad_v}};
  for (const auto& r : gradients) {
    FakeAttention f;
    (f.*r.tensor).data = nullptr;
    expect_invalid_backward(f, r.name, "the data pointer is NULL");
  }
}

TEST_CASE("attention: unknown dtype codes are rejected by name", "[abi][attention]") {
  FakeAttention a;
  a.q.dtype = 7;
  expect_invalid_both(a, "q", "got dtype code 7");
  FakeAttention b;
  b.k.dtype = 3;
  expect_invalid_both(b, "k", "got dtype code 3");
  FakeAttention c;
  c.v.dtype = -1;
  expect_invalid_both(c, "v", "got dtype code -1");
  FakeAttention d;
  d.o.dtype = 42;
  expect_invalid_both(d, "o", "got dtype code 42");
  FakeAttention e;
  e.lse.dtype = 5;
  expect_invalid_both(e, "lse", "got dtype code 5");
  FakeAttention f;
  f.grad_o.dtype = 3;
  expect_invalid_backward(f, "grad_o", "got dtype code 3");
  FakeAttention g;
  g.grad_q.dtype = 4;
  expect_invalid_backward(g, "grad_q", "got dtype code 4");
  FakeAttention h;
  h.grad_k.dtype = 4;
  expect_invalid_backward(h, "grad_k", "got dtype code 4");
  FakeAttention k;
  k.grad_v.dtype = 4;
  expect_invalid_backward(k, "grad_v", "got dtype code 4");
}

TEST_CASE("attention: wrong ranks are rejected with the layout expected", "[abi][attention]") {
  FakeAttention a;
  a.q.rank = 3;
  expect_invalid_both(a, "q", "expected rank 4 [B, Hq, T, d], got rank 3 [2, 4, 5]");
  FakeAttention b(EXPHIL_F32, EXPHIL_ATTENTION_BTHD);
  b.q.rank = 3;
  expect_invalid_both(b, "q", "expected rank 4 [B, T, Hq, d], got rank 3 [2, 5, 4]");
  FakeAttention c;
  c.k.rank = 5;
  expect_invalid_both(c, "k", "expected rank 4 [B, Hkv, S, d], got rank 5");
  FakeAttention d(EXPHIL_F16, EXPHIL_ATTENTION_BTHD);
  d.v.rank = 2;
  expect_invalid_both(d, "v", "expected rank 4 [B, S, Hkv, d], got rank 2");
  FakeAttention e;
  e.o.rank = 9;
  expect_invalid_both(e, "o", "got rank 9 (a descriptor holds 0 to 8 dimensions)");
  FakeAttention f;
  f.lse.rank = 4;
  expect_invalid_both(f, "lse", "expected rank 3 [B, Hq, T], got rank 4");
  FakeAttention g;
  g.grad_o.rank = -1;
  expect_invalid_backward(g, "grad_o", "expected rank 4 [B, Hq, T, d], got rank -1");
  FakeAttention h;
  h.grad_q.rank = 3;
  expect_invalid_backward(h, "grad_q", "expected rank 4 [B, Hq, T, d], got rank 3");
  FakeAttention k;
  k.grad_k.rank = 3;
  expect_invalid_backward(k, "grad_k", "expected rank 4 [B, Hkv, S, d], got rank 3");
  FakeAttention m;
  m.grad_v.rank = 0;
  expect_invalid_backward(m, "grad_v", "expected rank 4 [B, Hkv, S, d], got rank 0");
}

TEST_CASE("attention: empty and negative dimensions are rejected", "[abi][attention]") {
  for (int axis = 0; axis < 4; ++axis) {
    FakeAttention f;
    f.q.shape[axis] = 0;
    INFO("q axis " << axis);
    expect_invalid_both(f, "q", "expected every dimension >= 1, got [");
  }
  FakeAttention a;
  a.q.shape[2] = -3;
  expect_invalid_both(a, "q", "expected every dimension >= 1, got [2, 4, -3, 32]");
  for (int axis = 0; axis < 4; ++axis) {
    FakeAttention f;
    f.k.shape[axis] = 0;
    INFO("k axis " << axis);
    expect_invalid_both(f, "k", "expected every dimension >= 1, got [");
  }
  FakeAttention b;
  b.k.shape[1] = -2;
  expect_invalid_both(b, "k", "got [2, -2, 7, 32]");
  FakeAttention c;
  c.v.shape[2] = 0;
  expect_invalid_both(c, "v", "expected shape [2, 2, 7, 32] (the shape of 'k'), got [2, 2, 0, 32]");
  FakeAttention d;
  d.lse.shape[2] = 0;
  expect_invalid_both(d, "lse", "got [2, 4, 0]");
}

TEST_CASE("attention: a byte size that overflows is rejected", "[abi][attention]") {
  FakeAttention f;
  f.q.shape[0] = int64_t{1} << 40;
  f.q.shape[2] = int64_t{1} << 20;
  expect_invalid_both(f, "q", "is larger than 2^63 bytes");
}

TEST_CASE("attention: head widths other than 32, 64, 96 and 128 are not supported",
          "[abi][attention]") {
  for (int32_t dtype : kDtypes) {
    // 2^32 + 64 is 64 if cut to 32 bits.
    for (int64_t d : {int64_t{48}, int64_t{256}, int64_t{16}, int64_t{1}, int64_t{129},
                      int64_t{1} << 33, (int64_t{1} << 32) + 64}) {
      FakeAttention f(dtype);
      f.set_head_dim(d);
      INFO("dtype " << dtype << " d " << d);
      const std::string detail = "head width d = " + std::to_string(d);
      expect_rejected(f.forward(), EXPHIL_ERROR_NOT_SUPPORTED, "forward", "q", detail);
      CHECK_THAT(exphil_last_error(), Contains("32, 64, 96 and 128"));
      expect_rejected(f.backward(), EXPHIL_ERROR_NOT_SUPPORTED, "backward", "q", detail);
    }
  }
  // Under BTHD too (d is the last axis in both layouts).
  FakeAttention g(EXPHIL_BF16, EXPHIL_ATTENTION_BTHD);
  g.set_head_dim(48);
  expect_rejected(g.forward(), EXPHIL_ERROR_NOT_SUPPORTED, "forward", "q", "head width d = 48");
}

TEST_CASE("attention: k must share q's batch and head width, and its heads divide Hq",
          "[abi][attention]") {
  FakeAttention a;
  a.k.shape[0] = 3;
  expect_invalid_both(a, "k",
                      "expected shape [B, Hkv, S, d] with B = 2 and d = 32 (from 'q'), got "
                      "[3, 2, 7, 32]");
  FakeAttention b;
  b.k.shape[3] = 64;  // a supported width, but not q's
  expect_invalid_both(b, "k", "with B = 2 and d = 32 (from 'q'), got [2, 2, 7, 64]");
  FakeAttention c(EXPHIL_F16, EXPHIL_ATTENTION_BTHD);
  c.k.shape[0] = 1;
  expect_invalid_both(c, "k",
                      "expected shape [B, S, Hkv, d] with B = 2 and d = 32 (from 'q'), got "
                      "[1, 7, 2, 32]");
  for (int64_t hkv : {3, 8}) {  // Hq = 4
    FakeAttention f;
    f.k.shape[1] = hkv;
    f.v.shape[1] = hkv;
    INFO("Hkv " << hkv);
    expect_invalid_both(f, "k",
                        "expected a head count Hkv that divides Hq = 4 (the heads of 'q'), got "
                        "Hkv = " +
                            std::to_string(hkv));
  }
  FakeAttention d(EXPHIL_F32, EXPHIL_ATTENTION_BTHD);
  d.k.shape[2] = 3;
  expect_invalid_both(d, "k", "divides Hq = 4 (the heads of 'q'), got Hkv = 3");
}

TEST_CASE("attention: v must have k's shape, o and grad_o q's", "[abi][attention]") {
  SECTION("v against k") {
    const struct {
      int axis;
      int64_t value;
      const char* got;
    } bad[] = {{0, 1, "[1, 2, 7, 32]"},
               {1, 1, "[2, 1, 7, 32]"},
               {2, 6, "[2, 2, 6, 32]"},
               {3, 64, "[2, 2, 7, 64]"}};
    for (const auto& b : bad) {
      FakeAttention f;
      f.v.shape[b.axis] = b.value;
      expect_invalid_both(f, "v",
                          std::string("expected shape [2, 2, 7, 32] (the shape of 'k'), got ") +
                              b.got);
    }
  }
  SECTION("o and grad_o against q") {
    FakeAttention a;
    a.o.shape[2] = 7;  // k's length instead of q's
    expect_invalid_both(a, "o", "expected shape [2, 4, 5, 32] (the shape of 'q'), got [2, 4, 7, 32]");
    FakeAttention b;
    b.o.shape[1] = 2;
    expect_invalid_both(b, "o", "got [2, 2, 5, 32]");
    FakeAttention c;
    c.grad_o.shape[3] = 64;
    expect_invalid_backward(c, "grad_o",
                            "expected shape [2, 4, 5, 32] (the shape of 'q'), got [2, 4, 5, 64]");
    FakeAttention d;
    d.grad_o.shape[0] = 3;
    expect_invalid_backward(d, "grad_o", "got [3, 4, 5, 32]");
  }
}

TEST_CASE("attention: every tensor but lse has q's dtype", "[abi][attention]") {
  FakeAttention a;  // q f32
  a.k.dtype = EXPHIL_F16;
  expect_invalid_both(a, "k", "expected dtype f32 (the dtype of 'q'), got f16");
  FakeAttention b(EXPHIL_BF16);
  b.v.dtype = EXPHIL_F16;
  expect_invalid_both(b, "v", "expected dtype bf16 (the dtype of 'q'), got f16");
  FakeAttention c(EXPHIL_F16);
  c.o.dtype = EXPHIL_F32;
  expect_invalid_both(c, "o", "expected dtype f16 (the dtype of 'q'), got f32");
  FakeAttention d(EXPHIL_F16);
  d.grad_o.dtype = EXPHIL_BF16;
  expect_invalid_backward(d, "grad_o", "expected dtype f16 (the dtype of 'q'), got bf16");
  FakeAttention e(EXPHIL_BF16);
  e.grad_q.dtype = EXPHIL_F32;
  expect_invalid_backward(e, "grad_q", "expected dtype bf16 (the dtype of 'q'), got f32");
  FakeAttention f;
  f.grad_k.dtype = EXPHIL_BF16;
  expect_invalid_backward(f, "grad_k", "expected dtype f32 (the dtype of 'q'), got bf16");
  FakeAttention g(EXPHIL_F16);
  g.grad_v.dtype = EXPHIL_F32;
  expect_invalid_backward(g, "grad_v", "expected dtype f16 (the dtype of 'q'), got f32");
}

TEST_CASE("attention: lse is [B, Hq, T] in f32 whatever the dtype and layout",
          "[abi][attention]") {
  FakeAttention a;
  a.lse.shape[1] = 5;
  a.lse.shape[2] = 4;  // [B, T, Hq]
  expect_invalid_both(a, "lse", "expected shape [2, 4, 5] ([B, Hq, T] from 'q'), got [2, 5, 4]");
  FakeAttention b(EXPHIL_F32, EXPHIL_ATTENTION_BTHD);
  b.lse.shape[1] = 5;
  b.lse.shape[2] = 4;  // BTHD-ordered lse is still wrong
  expect_invalid_both(b, "lse", "expected shape [2, 4, 5] ([B, Hq, T] from 'q'), got [2, 5, 4]");
  FakeAttention c;
  c.lse.shape[2] = 7;  // S instead of T
  expect_invalid_both(c, "lse", "got [2, 4, 7]");
  for (int32_t dtype : {EXPHIL_F16, EXPHIL_BF16}) {
    FakeAttention f(dtype);
    f.lse.dtype = dtype;  // the dtype of q is not enough
    const std::string got = dtype == EXPHIL_F16 ? "f16" : "bf16";
    expect_invalid_both(f, "lse", "expected dtype f32, got " + got);
  }
  FakeAttention d(EXPHIL_F32);
  d.lse.dtype = EXPHIL_F16;
  expect_invalid_both(d, "lse", "expected dtype f32, got f16");
  FakeAttention e;
  e.lse.data = static_cast<char*>(e.lse.data) + 2;
  expect_invalid_both(e, "lse", "is not aligned to 4 bytes");
}

TEST_CASE("attention: gradient outputs have the shapes of q, k and v", "[abi][attention]") {
  FakeAttention a;
  a.grad_q.shape[1] = 2;
  a.grad_q.shape[2] = 7;  // k's shape
  expect_invalid_backward(a, "grad_q",
                          "expected shape [2, 4, 5, 32] (the shape of 'q'), got [2, 2, 7, 32]");
  FakeAttention b;
  b.grad_k.shape[1] = 4;
  b.grad_k.shape[2] = 5;  // q's shape
  expect_invalid_backward(b, "grad_k",
                          "expected shape [2, 2, 7, 32] (the shape of 'k'), got [2, 4, 5, 32]");
  FakeAttention c;
  c.grad_v.shape[2] = 6;
  expect_invalid_backward(c, "grad_v",
                          "expected shape [2, 2, 7, 32] (the shape of 'k'), got [2, 2, 6, 32]");
  FakeAttention d;
  d.grad_k.shape[3] = 64;
  expect_invalid_backward(d, "grad_k", "got [2, 2, 7, 64]");
  FakeAttention e(EXPHIL_F32, EXPHIL_ATTENTION_BTHD);
  e.grad_q.shape[0] = 1;
  expect_invalid_backward(e, "grad_q",
                          "expected shape [2, 5, 4, 32] (the shape of 'q'), got [1, 5, 4, 32]");
}

TEST_CASE("attention: under BTHD, tensors shaped for BHTD are rejected", "[abi][attention]") {
  // q [2, 5, 4, 32] and k [2, 7, 2, 32] in BTHD; their BHTD shapes are
  // [2, 4, 5, 32] and [2, 2, 7, 32].
  FakeAttention a(EXPHIL_F32, EXPHIL_ATTENTION_BTHD);
  a.k.shape[1] = 2;
  a.k.shape[2] = 7;  // read as S = 2, Hkv = 7, which does not divide Hq = 4
  a.v.shape[1] = 2;
  a.v.shape[2] = 7;
  expect_invalid_both(a, "k", "divides Hq = 4 (the heads of 'q'), got Hkv = 7");
  FakeAttention b(EXPHIL_F16, EXPHIL_ATTENTION_BTHD);
  b.v.shape[1] = 2;
  b.v.shape[2] = 7;
  expect_invalid_both(b, "v", "expected shape [2, 7, 2, 32] (the shape of 'k'), got [2, 2, 7, 32]");
  FakeAttention c(EXPHIL_BF16, EXPHIL_ATTENTION_BTHD);
  c.o.shape[1] = 4;
  c.o.shape[2] = 5;
  expect_invalid_both(c, "o", "expected shape [2, 5, 4, 32] (the shape of 'q'), got [2, 4, 5, 32]");
  FakeAttention d(EXPHIL_F32, EXPHIL_ATTENTION_BTHD);
  d.grad_o.shape[1] = 4;
  d.grad_o.shape[2] = 5;
  expect_invalid_backward(d, "grad_o", "expected shape [2, 5, 4, 32] (the shape of 'q')");
  FakeAttention e(EXPHIL_F32, EXPHIL_ATTENTION_BTHD);
  e.grad_v.shape[1] = 2;
  e.grad_v.shape[2] = 7;
  expect_invalid_backward(e, "grad_v", "expected shape [2, 7, 2, 32] (the shape of 'k')");
  // And the other way round: BTHD shapes under the default layout.
  FakeAttention f(EXPHIL_F32, EXPHIL_ATTENTION_BTHD);
  f.options.layout = EXPHIL_ATTENTION_BHTD;  // q read as Hq = 5, T = 4; k as Hkv = 7
  expect_invalid_both(f, "k", "divides Hq = 5 (the heads of 'q'), got Hkv = 7");
  f.options_p = nullptr;  // NULL options mean BHTD too
  expect_invalid_both(f, "k", "divides Hq = 5 (the heads of 'q'), got Hkv = 7");
}

TEST_CASE("attention: options outside their ranges are rejected", "[abi][attention]") {
  // The enumerated options: each value out of range, named in the message.
  struct EnumOption {
    int32_t exphil_attention_options::*field;
    std::vector<int32_t> bad;
    const char* expected;
  };
  const EnumOption enums[] = {
      {&exphil_attention_options::mask, {3, -1, 100},
       "expected mask 0 (none), 1 (causal) or 2 (window), got "},
      {&exphil_attention_options::layout, {2, -1},
       "expected layout 0 ([B, H, T, d]) or 1 ([B, T, H, d]), got "},
      {&exphil_attention_options::precision, {2, -1},
       "expected precision 0 (exact) or 1 (tf32x3), got "}};
  for (const EnumOption& option : enums)
    for (int32_t value : option.bad) {
      FakeAttention f;
      f.options.*option.field = value;
      INFO(option.expected << value);
      expect_invalid_both(f, "options", option.expected + std::to_string(value));
    }
  for (int32_t window : {0, -1, std::numeric_limits<int32_t>::min()}) {
    FakeAttention f;
    f.options.mask = EXPHIL_ATTENTION_MASK_WINDOW;
    f.options.window = window;
    INFO("window " << window);
    expect_invalid_both(f, "options",
                        "expected window >= 1 with the window mask, got " + std::to_string(window));
  }
  for (float scale : {std::numeric_limits<float>::quiet_NaN(),
                      std::numeric_limits<float>::infinity(),
                      -std::numeric_limits<float>::infinity()}) {
    FakeAttention f;
    f.options.scale = scale;
    INFO("scale " << scale);
    expect_invalid_both(f, "options", "expected a finite scale (0 for 1 / sqrt(d)), got ");
  }
}

TEST_CASE("attention: precision tf32x3 is refused with f16 and bf16 inputs", "[abi][attention]") {
  for (const auto& [dtype, name] : {std::pair{EXPHIL_F16, "f16"}, std::pair{EXPHIL_BF16, "bf16"}}) {
    FakeAttention f(dtype);
    f.options.precision = EXPHIL_ATTENTION_TF32X3;
    INFO(name);
    expect_invalid_both(f, "options",
                        std::string("precision 1 (tf32x3) applies to f32 inputs; expected precision "
                                    "0 (exact) with q of dtype ") +
                            name + ", got 1");
  }
}

TEST_CASE("attention: data pointers not aligned to 16 bytes are rejected", "[abi][attention]") {
  // Element-aligned but not 16-byte-aligned: the kernels move 16-byte rows.
  struct Misaligned {
    const char* name;
    exphil_tensor FakeAttention::*tensor;
    int32_t dtype;
    int offset;
  };
  // One tensor's data moved by `offset` bytes in a call otherwise valid.
  const auto check = [](const Misaligned& s, auto expect_invalid) {
    FakeAttention f(s.dtype);
    (f.*s.tensor).data = static_cast<char*>((f.*s.tensor).data) + s.offset;
    INFO(s.name << " + " << s.offset);
    expect_invalid(f, s.name, "is not aligned to 16 bytes");
  };
  const Misaligned shared[] = {{"q", &FakeAttention::q, EXPHIL_F32, 8},
                               {"k", &FakeAttention::k, EXPHIL_F32, 4},
                               {"v", &FakeAttention::v, EXPHIL_F16, 2},
                               {"o", &FakeAttention::o, EXPHIL_BF16, 14}};
  for (const Misaligned& s : shared) check(s, expect_invalid_both);
  const Misaligned backward[] = {{"grad_o", &FakeAttention::grad_o, EXPHIL_F32, 4},
                                 {"grad_q", &FakeAttention::grad_q, EXPHIL_F16, 8},
                                 {"grad_k", &FakeAttention::grad_k, EXPHIL_BF16, 2},
                                 {"grad_v", &FakeAttention::grad_v, EXPHIL_F32, 12}};
  for (const Misaligned& s : backward) check(s, expect_invalid_backward);
  // Not even element-aligned.
  FakeAttention g(EXPHIL_F16);
  g.q.data = static_cast<char*>(g.q.data) + 1;
  expect_invalid_both(g, "q", "is not aligned to 16 bytes");
}

TEST_CASE("attention: outputs that overlap any other argument are rejected",
          "[abi][attention]") {
  FakeAttention a;
  a.o.data = static_cast<char*>(a.q.data) + 16;
  expect_invalid_forward(a, "o", "overlaps argument 'q'");

  FakeAttention b;
  b.o.data = b.v.data;
  expect_invalid_forward(b, "o", "overlaps argument 'v'");

  FakeAttention c;
  c.lse.data = static_cast<char*>(c.k.data) + 64;
  expect_invalid_forward(c, "lse", "overlaps argument 'k'");

  // Two outputs: either may be the one named first.
  const auto expect_outputs_overlap = [](exphil_status status, const char* direction,
                                         const char* first, const char* second) {
    INFO("message: " << exphil_last_error());
    CHECK(status == EXPHIL_ERROR_INVALID_ARGUMENT);
    CHECK_THAT(exphil_last_error(), StartsWith(std::string("attention ") + direction + ": "));
    CHECK_THAT(exphil_last_error(), Contains(std::string("'") + first + "'") &&
                                        Contains(std::string("'") + second + "'") &&
                                        Contains("overlaps"));
  };
  FakeAttention d;
  d.lse.data = static_cast<char*>(d.o.data) + 16;
  expect_outputs_overlap(d.forward(), "forward", "o", "lse");

  FakeAttention e;
  e.grad_k.data = static_cast<char*>(e.grad_v.data) + 32;
  expect_outputs_overlap(e.backward(), "backward", "grad_k", "grad_v");

  FakeAttention g;
  g.grad_q.data = g.grad_k.data;
  expect_outputs_overlap(g.backward(), "backward", "grad_q", "grad_k");

  // Outputs of the backward against its inputs (o is an input there).
  FakeAttention h;
  h.grad_q.data = h.grad_o.data;
  expect_invalid_backward(h, "grad_q", "overlaps argument 'grad_o'");
  FakeAttention k;
  k.grad_q.data = k.o.data;
  expect_invalid_backward(k, "grad_q", "overlaps argument 'o'");
  FakeAttention m;
  m.grad_v.data = static_cast<char*>(m.lse.data) + 16;
  expect_invalid_backward(m, "grad_v", "overlaps argument 'lse'");
  FakeAttention n;
  n.grad_k.data = static_cast<char*>(n.k.data) + 16;
  expect_invalid_backward(n, "grad_k", "overlaps argument 'k'");
}

TEST_CASE("attention: the first bad argument is the one reported", "[abi][attention]") {
  // Options come first, then q, k, v, o, lse, grad_o and the gradients.
  FakeAttention a;
  a.options.mask = 9;
  a.q_p = nullptr;
  expect_invalid_both(a, "options", "got 9");
  FakeAttention b;
  b.q.dtype = 7;
  b.k.dtype = 7;
  expect_invalid_both(b, "q", "got dtype code 7");
  FakeAttention c;
  c.v.rank = 3;
  c.o.rank = 3;
  expect_invalid_both(c, "v", "expected rank 4");
}

TEST_CASE("attention: B or Hq over the grid's 65535 is not supported", "[abi][attention]") {
  FakeAttention b;
  b.q.shape[0] = 65536;
  expect_rejected(b.forward(), EXPHIL_ERROR_NOT_SUPPORTED, "forward", "q",
                  "B = 65536 and Hq = 4; the kernels support B and Hq up to 65535");
  expect_rejected(b.backward(), EXPHIL_ERROR_NOT_SUPPORTED, "backward", "q", "B = 65536");
  FakeAttention h;
  h.q.shape[1] = 65536;
  expect_rejected(h.forward(), EXPHIL_ERROR_NOT_SUPPORTED, "forward", "q", "Hq = 65536");
  expect_rejected(h.backward(), EXPHIL_ERROR_NOT_SUPPORTED, "backward", "q", "Hq = 65536");
}

TEST_CASE("attention: the C++ API's backward without lse (recompute_lse)", "[abi][attention]") {
  // The C ABI has no such flag (lse stays required there); the C++ API takes
  // lse = NULL with recompute_lse, as exphil_attention_o_bwd passes it.
  const FakeAttention f;
  exphil::AttentionBackwardArgs args;
  args.in.q = &f.q;
  args.in.k = &f.k;
  args.in.v = &f.v;
  args.options.mask = exphil::AttentionMask::none;
  args.o = &f.o;
  args.grad_o = &f.grad_o;
  args.grad_q = &f.grad_q;
  args.grad_k = &f.grad_k;
  args.grad_v = &f.grad_v;

  SECTION("without recompute_lse, a NULL lse is still refused") {
    const exphil::Status s = exphil::attention_backward(args);
    CHECK(s.code() == exphil::StatusCode::invalid_argument);
    CHECK_THAT(s.message(), Catch::Contains("'lse'") &&
                                Catch::Contains("the tensor descriptor is NULL"));
  }
  SECTION("with recompute_lse, an lse is refused: the call computes it") {
    args.recompute_lse = true;
    args.lse = &f.lse;
    const exphil::Status s = exphil::attention_backward(args);
    CHECK(s.code() == exphil::StatusCode::invalid_argument);
    CHECK_THAT(s.message(), Catch::Contains("'lse'") &&
                                Catch::Contains("expected NULL with recompute_lse"));
  }
  SECTION("with recompute_lse and no lse, validation passes (then the fake memory fails)") {
    args.recompute_lse = true;
    const exphil::Status s = exphil::attention_backward(args);
    INFO(s.message());
    CHECK_FALSE(s.ok());
    CHECK_THAT(s.message(), !Catch::Contains("'lse'"));
  }
}
