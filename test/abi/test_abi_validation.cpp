// Every class of bad input through the C ABI of libexphil.so returns the
// right status and a message naming the argument, the expectation and what
// came, and never crashes. Runs without a GPU: descriptors point at fake,
// distinct addresses, and structural checks come before any device query.
#include <catch2/catch.hpp>

#include <cuda_runtime_api.h>

#include <cstring>
#include <string>
#include <thread>

#include "abi_calls.hpp"
#include "abi_expectations.hpp"
#include "device_buffer.hpp"
#include "exphil/exphil.h"
#include "exphil/scan.hpp"

using Catch::Matchers::Contains;
using exphil::ScanOp;

namespace {

// A well-formed call with fake device addresses: B=2, T=5, H=4, f32.
struct FakeScan {
  explicit FakeScan(ScanOp op_, int32_t dtype = EXPHIL_F32) : op(op_) {
    n = exphil::scan_input_count(op);
    uintptr_t next = uintptr_t{1} << 32;
    auto sequence = [&](exphil_tensor& t) {
      t = exphil_tensor{};
      t.data = reinterpret_cast<void*>(next);
      next += uintptr_t{1} << 20;
      t.dtype = dtype;
      t.rank = 3;
      t.shape[0] = 2; t.shape[1] = 5; t.shape[2] = 4;
    };
    auto state = [&](exphil_tensor& t) {
      sequence(t);
      t.rank = 2;
      t.shape[1] = 4;
    };
    for (int i = 0; i < n; ++i) { sequence(x[i]); sequence(gx[i]); }
    sequence(y); sequence(gy);
    state(h0); state(h_final); state(gf); state(g0);
    for (int i = 0; i < n; ++i) { xp[i] = &x[i]; gxp[i] = &gx[i]; }
  }

  exphil_status forward() { return exphil::test::abi_scan_forward(op, xp, h0p, yp, h_finalp, nullptr); }
  exphil_status backward() {
    return exphil::test::abi_scan_backward(op, xp, h0p, yp, gyp, gfp, gxp, g0p, nullptr);
  }

  ScanOp op;
  int n = 0;
  exphil_tensor x[3], gx[3], y, gy, h0, h_final, gf, g0;
  const exphil_tensor* xp[3] = {};
  const exphil_tensor* gxp[3] = {};
  const exphil_tensor* h0p = &h0;
  const exphil_tensor* yp = &y;
  const exphil_tensor* h_finalp = &h_final;
  const exphil_tensor* gyp = &gy;
  const exphil_tensor* gfp = &gf;
  const exphil_tensor* g0p = &g0;
};

void expect_invalid(exphil_status status, const std::string& argument, const std::string& detail) {
  INFO("message: " << exphil_last_error());
  CHECK(status == EXPHIL_ERROR_INVALID_ARGUMENT);
  CHECK_THAT(exphil_last_error(), Contains("argument '" + argument + "'"));
  CHECK_THAT(exphil_last_error(), Contains(detail));
}

bool have_gpu() { return exphil::test::gpu_available(nullptr); }

}  // namespace

TEST_CASE("a NULL required descriptor or data pointer is rejected by name", "[abi]") {
  for (ScanOp op : exphil::kAbiScanOps) {
    for (int i = 0; i < exphil::scan_input_count(op); ++i) {
      FakeScan f(op);
      f.xp[i] = nullptr;
      expect_invalid(f.forward(), exphil::scan_input_name(op, i), "descriptor is NULL");
      FakeScan g(op);
      g.x[i].data = nullptr;
      expect_invalid(g.backward(), exphil::scan_input_name(op, i), "data pointer is NULL");
      FakeScan h(op);
      h.gxp[i] = nullptr;
      expect_invalid(h.backward(), exphil::scan_grad_input_name(op, i), "descriptor is NULL");
    }
    FakeScan f(op);
    f.yp = nullptr;
    expect_invalid(f.forward(), "y", "descriptor is NULL");
    FakeScan g(op);
    g.gyp = nullptr;
    expect_invalid(g.backward(), "grad_y", "descriptor is NULL");
    FakeScan h(op);
    h.h0.data = nullptr;  // present but empty: an error, not "absent"
    expect_invalid(h.forward(), "h0", "data pointer is NULL");
  }
}

TEST_CASE("linear_scan's backward may leave out b, no other input", "[abi]") {
  FakeScan f(ScanOp::linear_scan);
  f.xp[1] = nullptr;
  const exphil_status s = f.backward();
  INFO("message: " << exphil_last_error());
  // Past the structural checks: what remains is the device (the fake
  // addresses are no CUDA allocation; 'a' comes first).
  if (have_gpu()) {
    CHECK(s == EXPHIL_ERROR_INVALID_ARGUMENT);
    CHECK_THAT(exphil_last_error(), Contains("argument 'a': expected device memory"));
  } else {
    CHECK(s == EXPHIL_ERROR_NO_DEVICE);
  }
  FakeScan forward(ScanOp::linear_scan);
  forward.xp[1] = nullptr;
  expect_invalid(forward.forward(), "b", "descriptor is NULL");
  for (ScanOp op : {ScanOp::min_gru, ScanOp::min_lstm, ScanOp::liquid}) {
    FakeScan g(op);
    const int last = exphil::scan_input_count(op) - 1;
    g.xp[last] = nullptr;
    expect_invalid(g.backward(), exphil::scan_input_name(op, last), "descriptor is NULL");
  }
}

TEST_CASE("unknown dtypes and wrong ranks are rejected", "[abi]") {
  FakeScan a(ScanOp::min_gru);
  a.x[1].dtype = 7;
  expect_invalid(a.forward(), "candidate", "got dtype code 7");

  FakeScan b(ScanOp::min_gru);
  b.x[0].rank = 2;
  expect_invalid(b.forward(), "gate", "expected rank 3 [B, T, H], got rank 2 [2, 5]");

  FakeScan c(ScanOp::liquid);
  c.h0.rank = 3;
  expect_invalid(c.forward(), "h0", "expected rank 2 [B, H], got rank 3");

  FakeScan d(ScanOp::min_lstm);
  d.y.rank = 9;
  expect_invalid(d.forward(), "y", "got rank 9 (a descriptor holds 0 to 8 dimensions)");

  FakeScan e(ScanOp::linear_scan);
  e.gy.rank = -1;
  expect_invalid(e.backward(), "grad_y", "got rank -1");
}

TEST_CASE("empty, negative and inconsistent shapes are rejected", "[abi]") {
  FakeScan a(ScanOp::min_gru);
  a.x[0].shape[1] = 0;
  expect_invalid(a.forward(), "gate", "expected every dimension >= 1, got [2, 0, 4]");

  FakeScan b(ScanOp::min_gru);
  b.x[0].shape[0] = -3;
  expect_invalid(b.forward(), "gate", "got [-3, 5, 4]");

  FakeScan c(ScanOp::min_gru);
  c.x[1].shape[2] = 3;
  expect_invalid(c.forward(), "candidate",
                 "expected shape [2, 5, 4] ([B, T, H] of 'gate'), got [2, 5, 3]");

  FakeScan d(ScanOp::min_lstm);
  d.y.shape[1] = 6;
  expect_invalid(d.forward(), "y", "expected shape [2, 5, 4]");

  FakeScan e(ScanOp::linear_scan);
  e.h0.shape[0] = 4;
  e.h0.shape[1] = 2;
  expect_invalid(e.forward(), "h0", "expected shape [2, 4] ([B, H] of 'a'), got [4, 2]");

  FakeScan f(ScanOp::liquid);
  f.g0.shape[1] = 5;
  expect_invalid(f.backward(), "grad_h0", "expected shape [2, 4]");

  FakeScan g(ScanOp::min_gru);
  g.gx[1].shape[0] = 1;
  expect_invalid(g.backward(), "grad_candidate", "expected shape [2, 5, 4]");
}

TEST_CASE("mixed dtypes are rejected, f32 state with a half sequence is accepted", "[abi]") {
  FakeScan a(ScanOp::min_gru, EXPHIL_BF16);
  a.x[1].dtype = EXPHIL_F32;
  expect_invalid(a.forward(), "candidate", "expected dtype bf16 (the dtype of 'gate'), got f32");

  FakeScan b(ScanOp::min_gru, EXPHIL_BF16);
  b.h0.dtype = EXPHIL_F16;
  expect_invalid(b.forward(), "h0", "expected dtype f32 or bf16 (the dtype of 'gate'), got f16");

  FakeScan c(ScanOp::min_lstm, EXPHIL_F16);
  c.gy.dtype = EXPHIL_BF16;
  expect_invalid(c.backward(), "grad_y", "expected dtype f16");

  // Structurally valid: f32 h0 and h_final with a bf16 sequence. The call
  // then fails only at the device check (fake addresses).
  FakeScan d(ScanOp::min_gru, EXPHIL_BF16);
  d.h0.dtype = EXPHIL_F32;
  d.h_final.dtype = EXPHIL_F32;
  const exphil_status s = d.forward();
  CHECK((s == EXPHIL_ERROR_NO_DEVICE || s == EXPHIL_ERROR_INVALID_ARGUMENT));
  CHECK_THAT(exphil_last_error(), !Contains("dtype"));
}

TEST_CASE("shapes whose byte size overflows are rejected", "[abi]") {
  FakeScan a(ScanOp::linear_scan);
  for (exphil_tensor* t : {&a.x[0], &a.x[1], &a.y}) {
    t->shape[0] = int64_t{1} << 40;
    t->shape[1] = int64_t{1} << 20;
    t->shape[2] = int64_t{1} << 10;
  }
  expect_invalid(a.forward(), "a", "is larger than 2^63 bytes");
}

TEST_CASE("misaligned data pointers are rejected", "[abi]") {
  FakeScan a(ScanOp::min_gru);
  a.x[1].data = static_cast<char*>(a.x[1].data) + 2;
  expect_invalid(a.forward(), "candidate", "is not aligned to 4 bytes (one f32 element)");

  FakeScan b(ScanOp::min_gru, EXPHIL_BF16);
  b.y.data = static_cast<char*>(b.y.data) + 1;
  expect_invalid(b.forward(), "y", "is not aligned to 2 bytes (one bf16 element)");
}

TEST_CASE("outputs that overlap any other argument are rejected while aliased inputs are accepted", "[abi]") {
  FakeScan a(ScanOp::min_gru);
  a.y.data = static_cast<char*>(a.x[0].data) + 16;
  expect_invalid(a.forward(), "y", "overlaps argument 'gate'");

  FakeScan b(ScanOp::linear_scan);
  b.g0.data = static_cast<char*>(b.gx[1].data) + 8;
  expect_invalid(b.backward(), "grad_b", "overlaps argument 'grad_h0'");

  FakeScan c(ScanOp::min_lstm);
  c.gx[2].data = c.gy.data;
  expect_invalid(c.backward(), "grad_candidate", "overlaps argument 'grad_y'");

  // Inputs may alias each other: the same tensor as both gate and candidate.
  FakeScan d(ScanOp::min_gru);
  d.x[1] = d.x[0];
  const exphil_status s = d.forward();
  CHECK((s == EXPHIL_ERROR_NO_DEVICE || s == EXPHIL_ERROR_INVALID_ARGUMENT));
  CHECK_THAT(exphil_last_error(), !Contains("overlaps"));
}

TEST_CASE("a well-formed call on memory that is not on a GPU fails cleanly", "[abi]") {
  FakeScan a(ScanOp::min_gru);
  const exphil_status s = a.forward();
  INFO("message: " << exphil_last_error());
  if (have_gpu()) {
    // The fake addresses are no CUDA allocation: named, and not device memory.
    CHECK(s == EXPHIL_ERROR_INVALID_ARGUMENT);
    CHECK_THAT(exphil_last_error(), Contains("argument 'gate': expected device memory"));
  } else {
    CHECK(s == EXPHIL_ERROR_NO_DEVICE);
    CHECK_THAT(exphil_last_error(), Contains("min_gru forward: no CUDA device"));
    // With no driver at all the runtime's own words ("CUDA driver version
    // is insufficient") would read as an old driver: the message says so.
    int driver = -1;
    if (cudaDriverGetVersion(&driver) == cudaSuccess && driver == 0)
      CHECK_THAT(exphil_last_error(), Contains("no NVIDIA driver found"));
  }
}

TEST_CASE("the library's own calls report versions, statuses and devices", "[abi]") {
  CHECK(std::string(exphil_version()) == EXPHIL_VERSION_STRING);
  CHECK(std::string(exphil_status_name(EXPHIL_ERROR_NO_DEVICE)) == "EXPHIL_ERROR_NO_DEVICE");
  CHECK(std::string(exphil_status_name(99)) == "EXPHIL_UNKNOWN_STATUS");

  CHECK(exphil_device_count(nullptr) == EXPHIL_ERROR_INVALID_ARGUMENT);
  CHECK_THAT(exphil_last_error(), Contains("argument 'count' is NULL"));

  int count = -1;
  REQUIRE(exphil_device_count(&count) == EXPHIL_OK);
  if (have_gpu())
    CHECK(count >= 1);
  else
    CHECK(count == 0);

  const exphil_status s = exphil_synchronize(count + 5);
  CHECK(s == (count == 0 ? EXPHIL_ERROR_NO_DEVICE : EXPHIL_ERROR_INVALID_ARGUMENT));
  CHECK(std::strlen(exphil_last_error()) > 0);
}

TEST_CASE("device memory calls reject bad arguments by name", "[abi]") {
  CHECK(exphil_device_alloc(0, 64, nullptr) == EXPHIL_ERROR_INVALID_ARGUMENT);
  CHECK_THAT(exphil_last_error(), Contains("argument 'ptr' is NULL"));

  void* p = reinterpret_cast<void*>(0x1);
  CHECK(exphil_device_alloc(0, 0, &p) == EXPHIL_ERROR_INVALID_ARGUMENT);
  CHECK_THAT(exphil_last_error(), Contains("argument 'bytes' must be > 0, got 0"));
  CHECK(p == nullptr);

  CHECK(exphil_device_free(nullptr) == EXPHIL_OK);

  int count = 0;
  REQUIRE(exphil_device_count(&count) == EXPHIL_OK);
  p = reinterpret_cast<void*>(0x1);
  const exphil_status s = exphil_device_alloc(count + 3, 64, &p);
  CHECK(s == (count == 0 ? EXPHIL_ERROR_NO_DEVICE : EXPHIL_ERROR_INVALID_ARGUMENT));
  CHECK(p == nullptr);
}

TEST_CASE("the last error is per thread", "[abi]") {
  FakeScan a(ScanOp::min_gru);
  a.xp[0] = nullptr;
  REQUIRE(a.forward() == EXPHIL_ERROR_INVALID_ARGUMENT);
  std::string other;
  std::thread([&] { other = exphil_last_error(); }).join();
  CHECK(other.empty());
  CHECK_THAT(exphil_last_error(), Contains("argument 'gate'"));
}

TEST_CASE("GRU and LSTM through the C ABI: bad input named, before the device", "[abi]") {
  // B=2, T=5, H=4: wx [2, 5, 3H] for the GRU, [2, 5, 4H] for the LSTM.
  exphil::test::FakeAddresses fake;
  const auto tensor = [&](std::initializer_list<int64_t> shape) { return fake.make(shape); };
  exphil_tensor wx3 = tensor({2, 5, 12}), R3 = tensor({4, 12}), wx4 = tensor({2, 5, 16}), R4 = tensor({4, 16});
  exphil_tensor y = tensor({2, 5, 4}), gy = tensor({2, 5, 4}), state = tensor({2, 4});

  SECTION("R's width is G times H") {
    exphil_tensor wrong = tensor({4, 16});
    CHECK(exphil_gru_forward(&wx3, &wrong, nullptr, nullptr, &y, nullptr, nullptr, nullptr) ==
          EXPHIL_ERROR_INVALID_ARGUMENT);
    CHECK_THAT(exphil_last_error(), Contains("gru forward: argument 'R': expected shape [H, 3H]"));
  }
  SECTION("a NULL wx") {
    CHECK(exphil_lstm_forward(nullptr, &R4, nullptr, nullptr, nullptr, &y, nullptr, nullptr, nullptr, nullptr) ==
          EXPHIL_ERROR_INVALID_ARGUMENT);
    CHECK_THAT(exphil_last_error(), Contains("lstm forward: argument 'wx': the tensor descriptor is NULL"));
  }
  SECTION("an output overlapping an input") {
    exphil_tensor grad_wx = wx4;  // the same memory as wx
    CHECK(exphil_lstm_backward(&wx4, &R4, &y, &gy, nullptr, nullptr, nullptr, nullptr, nullptr, &grad_wx,
                               nullptr, nullptr, nullptr, nullptr, nullptr, nullptr, nullptr) ==
          EXPHIL_ERROR_INVALID_ARGUMENT);
    CHECK_THAT(exphil_last_error(), Contains("argument 'grad_wx': output memory"));
  }
  SECTION("the states share one dtype") {
    // h0 in f32 sets the states' dtype; grad_h_final in f16 is refused.
    exphil_tensor half = tensor({2, 4});
    half.dtype = EXPHIL_F16;
    CHECK(exphil_gru_backward(&wx3, &R3, &y, &gy, nullptr, &state, &half, nullptr, nullptr, nullptr, nullptr,
                              nullptr, nullptr, nullptr) == EXPHIL_ERROR_INVALID_ARGUMENT);
    CHECK_THAT(exphil_last_error(), Contains("argument 'grad_h_final': expected dtype f32 (the dtype of 'h0'), got f16"));
  }
  SECTION("the options: a precision past tf32, and tf32 with a bf16 sequence") {
    exphil_gated_rnn_options options{};
    options.precision = 2;
    CHECK(exphil_gru_forward(&wx3, &R3, nullptr, nullptr, &y, nullptr, &options, nullptr) ==
          EXPHIL_ERROR_INVALID_ARGUMENT);
    CHECK_THAT(exphil_last_error(),
               Contains("gru forward: argument 'options': expected precision 0 (exact) or 1 (tf32), got 2"));
    exphil_tensor wx16 = wx4, y16 = y;
    wx16.dtype = y16.dtype = EXPHIL_BF16;
    options.precision = EXPHIL_GATED_RNN_TF32;
    CHECK(exphil_lstm_forward(&wx16, &R4, nullptr, nullptr, nullptr, &y16, nullptr, nullptr, &options, nullptr) ==
          EXPHIL_ERROR_INVALID_ARGUMENT);
    CHECK_THAT(exphil_last_error(),
               Contains("argument 'options': precision 1 (tf32) applies to f32 sequences; expected precision 0 "
                        "(exact) with wx of dtype bf16"));
  }
}

TEST_CASE("sLSTM through the C ABI: bad input named, before the device", "[abi]") {
  // B=2, T=5, H=4: wx [2, 5, 4H].
  exphil::test::FakeAddresses fake;
  const auto tensor = [&](std::initializer_list<int64_t> shape) { return fake.make(shape); };
  exphil_tensor wx = tensor({2, 5, 16}), R = tensor({4, 16}), y = tensor({2, 5, 4}), gy = tensor({2, 5, 4});
  exphil_tensor n0 = tensor({2, 4}), m0 = tensor({2, 4});

  SECTION("R's width is 4H") {
    exphil_tensor wrong = tensor({4, 12});
    CHECK(exphil_slstm_forward(&wx, &wrong, nullptr, nullptr, nullptr, nullptr, nullptr, &y, nullptr, nullptr,
                               nullptr, nullptr, nullptr) == EXPHIL_ERROR_INVALID_ARGUMENT);
    CHECK_THAT(exphil_last_error(), Contains("slstm forward: argument 'R': expected shape [H, 4H]"));
  }
  SECTION("a NULL y") {
    CHECK(exphil_slstm_forward(&wx, &R, nullptr, nullptr, nullptr, &n0, &m0, nullptr, nullptr, nullptr, nullptr,
                               nullptr, nullptr) == EXPHIL_ERROR_INVALID_ARGUMENT);
    CHECK_THAT(exphil_last_error(), Contains("slstm forward: argument 'y': the tensor descriptor is NULL"));
  }
  SECTION("the stabiliser's shape") {
    exphil_tensor wrong = tensor({2, 5});
    CHECK(exphil_slstm_forward(&wx, &R, nullptr, nullptr, nullptr, &n0, &wrong, &y, nullptr, nullptr, nullptr,
                               nullptr, nullptr) == EXPHIL_ERROR_INVALID_ARGUMENT);
    CHECK_THAT(exphil_last_error(), Contains("argument 'm0': expected shape [2, 4]"));
  }
  SECTION("a gradient output overlapping an input") {
    exphil_tensor grad_n0 = n0;  // the same memory as n0
    CHECK(exphil_slstm_backward(&wx, &R, &y, &gy, nullptr, nullptr, nullptr, &n0, nullptr, nullptr, nullptr,
                                nullptr, nullptr, nullptr, nullptr, nullptr, nullptr, nullptr, &grad_n0, nullptr,
                                nullptr, nullptr) == EXPHIL_ERROR_INVALID_ARGUMENT);
    CHECK_THAT(exphil_last_error(), Contains("argument 'grad_n0': output memory"));
  }
  SECTION("the states share one dtype") {
    exphil_tensor half = tensor({2, 4});
    half.dtype = EXPHIL_F16;
    CHECK(exphil_slstm_backward(&wx, &R, &y, &gy, nullptr, nullptr, nullptr, &n0, nullptr, nullptr, nullptr,
                                nullptr, &half, nullptr, nullptr, nullptr, nullptr, nullptr, nullptr, nullptr,
                                nullptr, nullptr) == EXPHIL_ERROR_INVALID_ARGUMENT);
    CHECK_THAT(exphil_last_error(),
               Contains("argument 'grad_m_final': expected dtype f32 (the dtype of 'n0'), got f16"));
  }
}
