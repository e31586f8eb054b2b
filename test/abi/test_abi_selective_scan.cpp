// The selective scan through the C ABI of libexphil.so. Every class of bad
// input returns its status and a message that starts with the call, names
// the argument and says what was wrong; these checks come before any device
// query, so they run without a GPU on descriptors that point at fake,
// distinct addresses. One [gpu] case runs the C ABI against the reference.
#include <catch2/catch.hpp>

#include <cmath>
#include <cstdint>
#include <initializer_list>
#include <limits>
#include <string>

#include <cuda_runtime_api.h>

#include "abi_expectations.hpp"
#include "device_buffer.hpp"
#include "exphil/exphil.h"
#include "scan_problems.hpp"
#include "selective_scan_harness.hpp"

using Catch::Matchers::Contains;
using Catch::Matchers::StartsWith;

namespace {

// A well-formed call with every optional input and output present and fake
// device addresses 1 MiB apart: B=2, T=5, D=4, N=3; x, dt, B, C, z and their
// gradients in `dtype`, A, dt_bias, D and the states in f32; softplus and a
// clamp to [0.1, 0.9]. Each test breaks one thing.
struct FakeSelectiveScan {
  explicit FakeSelectiveScan(int32_t dtype = EXPHIL_F32) {
    exphil::test::FakeAddresses fake;
    const auto make = [&](exphil_tensor& t, int32_t type, std::initializer_list<int64_t> shape) {
      fake.fill(t, type, shape);
    };
    for (exphil_tensor* t : {&x, &dt, &z, &y, &grad_y, &grad_x, &grad_dt, &grad_z})
      make(*t, dtype, {2, 5, 4});
    for (exphil_tensor* t : {&B, &C, &grad_B, &grad_C}) make(*t, dtype, {2, 5, 3});
    for (exphil_tensor* t : {&A, &grad_A}) make(*t, EXPHIL_F32, {4, 3});
    for (exphil_tensor* t : {&dt_bias, &D, &grad_dt_bias, &grad_D}) make(*t, EXPHIL_F32, {4});
    for (exphil_tensor* t : {&h0, &h_final, &grad_h_final, &grad_h0})
      make(*t, EXPHIL_F32, {2, 4, 3});
    options.softplus = 1;
    options.clamp = 1;
    options.dt_min = 0.1f;
    options.dt_max = 0.9f;
  }

  // N states everywhere N appears.
  void set_states(int64_t n) {
    for (exphil_tensor* t : {&B, &C, &grad_B, &grad_C}) t->shape[2] = n;
    for (exphil_tensor* t : {&A, &grad_A}) t->shape[1] = n;
    for (exphil_tensor* t : {&h0, &h_final, &grad_h_final, &grad_h0}) t->shape[2] = n;
  }

  exphil_status forward() const {
    return exphil_selective_scan_forward(x_p, dt_p, A_p, B_p, C_p, dt_bias_p, D_p, z_p, h0_p,
                                         options_p, y_p, h_final_p, nullptr);
  }
  exphil_status backward() const {
    return exphil_selective_scan_backward(x_p, dt_p, A_p, B_p, C_p, dt_bias_p, D_p, z_p, h0_p,
                                          options_p, grad_y_p, grad_h_final_p, grad_x_p,
                                          grad_dt_p, grad_A_p, grad_B_p, grad_C_p, grad_dt_bias_p,
                                          grad_D_p, grad_z_p, grad_h0_p, nullptr);
  }

  exphil_tensor x, dt, A, B, C, dt_bias, D, z, h0, y, h_final;
  exphil_tensor grad_y, grad_h_final, grad_x, grad_dt, grad_A, grad_B, grad_C, grad_dt_bias,
      grad_D, grad_z, grad_h0;
  exphil_selective_scan_options options{};

  const exphil_tensor *x_p = &x, *dt_p = &dt, *A_p = &A, *B_p = &B, *C_p = &C;
  const exphil_tensor *dt_bias_p = &dt_bias, *D_p = &D, *z_p = &z, *h0_p = &h0;
  const exphil_tensor *y_p = &y, *h_final_p = &h_final;
  const exphil_tensor *grad_y_p = &grad_y, *grad_h_final_p = &grad_h_final;
  const exphil_tensor *grad_x_p = &grad_x, *grad_dt_p = &grad_dt, *grad_A_p = &grad_A;
  const exphil_tensor *grad_B_p = &grad_B, *grad_C_p = &grad_C, *grad_dt_bias_p = &grad_dt_bias;
  const exphil_tensor *grad_D_p = &grad_D, *grad_z_p = &grad_z, *grad_h0_p = &grad_h0;
  const exphil_selective_scan_options* options_p = &options;
};

void expect_rejected(exphil_status status, exphil_status expected, const char* direction,
                     const std::string& argument, const std::string& detail) {
  exphil::test::expect_rejected("selective_scan", status, expected, direction, argument, detail);
}

void expect_invalid_forward(const FakeSelectiveScan& f, const std::string& argument,
                            const std::string& detail) {
  expect_rejected(f.forward(), EXPHIL_ERROR_INVALID_ARGUMENT, "forward", argument, detail);
}

void expect_invalid_backward(const FakeSelectiveScan& f, const std::string& argument,
                             const std::string& detail) {
  expect_rejected(f.backward(), EXPHIL_ERROR_INVALID_ARGUMENT, "backward", argument, detail);
}

void expect_past_validation(exphil_status status, const char* direction) {
  exphil::test::expect_past_validation("selective_scan", status, direction);
}

}  // namespace

TEST_CASE("selective_scan: a well-formed call on memory that is not on a GPU fails cleanly",
          "[abi][selective_scan]") {
  SECTION("every optional input, output and option") {
    const FakeSelectiveScan f;
    expect_past_validation(f.forward(), "forward");
    expect_past_validation(f.backward(), "backward");
  }
  SECTION("no optional input, output or option (NULL options)") {
    FakeSelectiveScan f;
    f.dt_bias_p = f.D_p = f.z_p = f.h0_p = f.h_final_p = f.grad_h_final_p = nullptr;
    f.grad_dt_bias_p = f.grad_D_p = f.grad_z_p = f.grad_h0_p = nullptr;
    f.options_p = nullptr;
    expect_past_validation(f.forward(), "forward");
    expect_past_validation(f.backward(), "backward");
  }
  SECTION("every gradient output NULL") {
    FakeSelectiveScan f;
    f.grad_x_p = f.grad_dt_p = f.grad_A_p = f.grad_B_p = f.grad_C_p = nullptr;
    f.grad_dt_bias_p = f.grad_D_p = f.grad_z_p = f.grad_h0_p = nullptr;
    expect_past_validation(f.backward(), "backward");
  }
  SECTION("bf16 sequences with f32 A, dt_bias, D and states") {
    const FakeSelectiveScan f(EXPHIL_BF16);
    expect_past_validation(f.forward(), "forward");
    expect_past_validation(f.backward(), "backward");
  }
  SECTION("N = 256, the largest the kernels take, and N = 1") {
    for (int64_t n : {int64_t{256}, int64_t{1}}) {
      FakeSelectiveScan f;
      f.set_states(n);
      expect_past_validation(f.forward(), "forward");
      expect_past_validation(f.backward(), "backward");
    }
  }
  SECTION("inputs that alias each other") {
    FakeSelectiveScan f;
    f.C = f.B;
    f.z = f.x;
    expect_past_validation(f.forward(), "forward");
  }
  SECTION("clamp bounds are ignored without clamp, and may be equal with it") {
    FakeSelectiveScan f;
    f.options.clamp = 0;
    f.options.dt_min = std::numeric_limits<float>::quiet_NaN();
    expect_past_validation(f.forward(), "forward");
    f.options.clamp = 1;
    f.options.dt_min = f.options.dt_max = 0.5f;
    expect_past_validation(f.backward(), "backward");
  }
}

TEST_CASE("selective_scan: a NULL required descriptor or data pointer is rejected by name",
          "[abi][selective_scan]") {
  const struct {
    const char* name;
    const exphil_tensor* FakeSelectiveScan::*pointer;
  } required[] = {{"x", &FakeSelectiveScan::x_p}, {"dt", &FakeSelectiveScan::dt_p},
                  {"A", &FakeSelectiveScan::A_p}, {"B", &FakeSelectiveScan::B_p},
                  {"C", &FakeSelectiveScan::C_p}};
  for (const auto& r : required) {
    FakeSelectiveScan f;
    f.*r.pointer = nullptr;
    expect_invalid_forward(f, r.name, "the tensor descriptor is NULL");
    expect_invalid_backward(f, r.name, "the tensor descriptor is NULL");
  }
  FakeSelectiveScan f;
  f.y_p = nullptr;
  expect_invalid_forward(f, "y", "the tensor descriptor is NULL");
  f.grad_y_p = nullptr;
  expect_invalid_backward(f, "grad_y", "the tensor descriptor is NULL");

  // A present descriptor with a NULL data pointer is an error, not "absent".
  const struct {
    const char* name;
    exphil_tensor FakeSelectiveScan::*tensor;
  } present[] = {{"x", &FakeSelectiveScan::x},   {"dt_bias", &FakeSelectiveScan::dt_bias},
                 {"D", &FakeSelectiveScan::D},   {"z", &FakeSelectiveScan::z},
                 {"h0", &FakeSelectiveScan::h0}, {"h_final", &FakeSelectiveScan::h_final}};
  for (const auto& p : present) {
    FakeSelectiveScan g;
    (g.*p.tensor).data = nullptr;
    expect_invalid_forward(g, p.name, "the data pointer is NULL");
  }
  FakeSelectiveScan k;
  k.grad_A.data = nullptr;
  expect_invalid_backward(k, "grad_A", "the data pointer is NULL");
}

TEST_CASE("selective_scan: wrong ranks and unknown dtypes are rejected", "[abi][selective_scan]") {
  FakeSelectiveScan a;
  a.x.rank = 2;
  expect_invalid_forward(a, "x", "expected rank 3");

  FakeSelectiveScan b;
  b.A.rank = 3;
  expect_invalid_forward(b, "A", "expected rank 2");

  FakeSelectiveScan c;
  c.dt_bias.rank = 2;
  expect_invalid_forward(c, "dt_bias", "expected rank 1");

  FakeSelectiveScan d;
  d.h0.rank = 2;
  expect_invalid_forward(d, "h0", "expected rank 3");

  FakeSelectiveScan e;
  e.B.rank = 9;
  expect_invalid_forward(e, "B", "got rank 9");

  FakeSelectiveScan g;
  g.grad_A.rank = 1;
  expect_invalid_backward(g, "grad_A", "expected rank 2");

  FakeSelectiveScan h;
  h.grad_D.rank = 2;
  expect_invalid_backward(h, "grad_D", "expected rank 1");

  FakeSelectiveScan k;
  k.dt.dtype = 7;
  expect_invalid_forward(k, "dt", "got dtype code 7");
}

TEST_CASE("selective_scan: shapes that disagree are rejected", "[abi][selective_scan]") {
  SECTION("dt, z and y against x") {
    FakeSelectiveScan a;
    a.dt.shape[2] = 3;
    expect_invalid_forward(a, "dt", "got [2, 5, 3]");
    FakeSelectiveScan b;
    b.z.shape[1] = 6;
    expect_invalid_forward(b, "z", "got [2, 6, 4]");
    FakeSelectiveScan c;
    c.y.shape[0] = 1;
    expect_invalid_forward(c, "y", "got [1, 5, 4]");
  }
  SECTION("A's D against x's D") {
    FakeSelectiveScan f;
    f.A.shape[0] = 5;
    expect_invalid_forward(f, "A", "got [5, 3]");
  }
  SECTION("B's N against A's N, and C against B") {
    FakeSelectiveScan a;
    a.B.shape[2] = 4;
    expect_invalid_forward(a, "B", "got [2, 5, 4]");
    FakeSelectiveScan b;
    b.C.shape[2] = 2;
    expect_invalid_forward(b, "C", "got [2, 5, 2]");
    FakeSelectiveScan c;
    c.C.shape[1] = 4;  // B and C must share B and T with x too
    expect_invalid_forward(c, "C", "got [2, 4, 3]");
  }
  SECTION("per-channel and state tensors") {
    FakeSelectiveScan a;
    a.dt_bias.shape[0] = 3;
    expect_invalid_forward(a, "dt_bias", "got [3]");
    FakeSelectiveScan b;
    b.D.shape[0] = 5;
    expect_invalid_forward(b, "D", "got [5]");
    FakeSelectiveScan c;
    c.h0.shape[1] = 3;
    c.h0.shape[2] = 4;  // [B, N, D] instead of [B, D, N]
    expect_invalid_forward(c, "h0", "got [2, 3, 4]");
    FakeSelectiveScan d;
    d.h_final.shape[0] = 1;
    expect_invalid_forward(d, "h_final", "got [1, 4, 3]");
  }
  SECTION("the backward's own tensors") {
    FakeSelectiveScan a;
    a.grad_y.shape[2] = 3;
    expect_invalid_backward(a, "grad_y", "got [2, 5, 3]");
    FakeSelectiveScan b;
    b.grad_h_final.shape[2] = 4;
    expect_invalid_backward(b, "grad_h_final", "got [2, 4, 4]");
    FakeSelectiveScan c;
    c.grad_A.shape[1] = 4;
    expect_invalid_backward(c, "grad_A", "got [4, 4]");
    FakeSelectiveScan d;
    d.grad_B.shape[2] = 4;
    expect_invalid_backward(d, "grad_B", "got [2, 5, 4]");
    FakeSelectiveScan e;
    e.grad_x.shape[1] = 4;
    expect_invalid_backward(e, "grad_x", "got [2, 4, 4]");
    FakeSelectiveScan g;
    g.grad_h0.shape[0] = 3;
    expect_invalid_backward(g, "grad_h0", "got [3, 4, 3]");
  }
  SECTION("empty and overflowing shapes") {
    FakeSelectiveScan a;
    a.x.shape[1] = 0;
    expect_invalid_forward(a, "x", "expected every dimension >= 1");
    FakeSelectiveScan b;
    b.set_states(0);
    expect_invalid_forward(b, "A", "expected every dimension >= 1");
    FakeSelectiveScan c;
    for (exphil_tensor* t : {&c.x, &c.dt, &c.z, &c.y}) {
      t->shape[0] = int64_t{1} << 40;
      t->shape[1] = int64_t{1} << 20;
    }
    expect_invalid_forward(c, "x", "is larger than 2^63 bytes");
  }
}

TEST_CASE("selective_scan: dtype mixtures outside the contract are rejected",
          "[abi][selective_scan]") {
  FakeSelectiveScan a;  // x f32
  a.B.dtype = EXPHIL_F16;
  expect_invalid_forward(a, "B", "expected dtype f32");

  FakeSelectiveScan b(EXPHIL_BF16);
  b.dt.dtype = EXPHIL_F16;
  expect_invalid_forward(b, "dt", "expected dtype bf16");

  FakeSelectiveScan c(EXPHIL_BF16);
  c.A.dtype = EXPHIL_BF16;  // A is f32 whatever the sequences
  expect_invalid_forward(c, "A", "expected dtype f32");

  FakeSelectiveScan d(EXPHIL_F16);
  d.dt_bias.dtype = EXPHIL_F16;
  expect_invalid_forward(d, "dt_bias", "expected dtype f32");

  FakeSelectiveScan e(EXPHIL_BF16);
  e.D.dtype = EXPHIL_BF16;
  expect_invalid_forward(e, "D", "expected dtype f32");

  FakeSelectiveScan g(EXPHIL_BF16);
  g.h0.dtype = EXPHIL_BF16;  // unlike the other scans, states are f32 only
  expect_invalid_forward(g, "h0", "expected dtype f32");

  FakeSelectiveScan h(EXPHIL_BF16);
  h.h_final.dtype = EXPHIL_BF16;
  expect_invalid_forward(h, "h_final", "expected dtype f32");

  FakeSelectiveScan k(EXPHIL_F16);
  k.y.dtype = EXPHIL_F32;
  expect_invalid_forward(k, "y", "expected dtype f16");

  FakeSelectiveScan m(EXPHIL_BF16);
  m.grad_x.dtype = EXPHIL_F32;
  expect_invalid_backward(m, "grad_x", "expected dtype bf16");

  FakeSelectiveScan n(EXPHIL_BF16);
  n.grad_A.dtype = EXPHIL_BF16;
  expect_invalid_backward(n, "grad_A", "expected dtype f32");

  FakeSelectiveScan p(EXPHIL_F16);
  p.grad_h_final.dtype = EXPHIL_F16;
  expect_invalid_backward(p, "grad_h_final", "expected dtype f32");
}

TEST_CASE("selective_scan: more than 256 states per channel is not supported",
          "[abi][selective_scan]") {
  FakeSelectiveScan f;
  f.set_states(257);
  // Valid input beyond a size limit of the kernels (exphil.h: N is 1 to 256).
  expect_rejected(f.forward(), EXPHIL_ERROR_NOT_SUPPORTED, "forward", "A", "256");
  expect_rejected(f.backward(), EXPHIL_ERROR_NOT_SUPPORTED, "backward", "A", "256");
}

TEST_CASE("selective_scan: clamp bounds must be finite with dt_min <= dt_max",
          "[abi][selective_scan]") {
  const float nan = std::numeric_limits<float>::quiet_NaN();
  const float inf = std::numeric_limits<float>::infinity();
  const struct {
    float dt_min, dt_max;
  } bad[] = {{0.5f, 0.4f}, {nan, 0.9f}, {0.1f, nan}, {0.1f, inf}, {-inf, 0.9f}};
  for (const auto& b : bad) {
    FakeSelectiveScan f;
    f.options.dt_min = b.dt_min;
    f.options.dt_max = b.dt_max;
    INFO("dt_min " << b.dt_min << ", dt_max " << b.dt_max);
    expect_invalid_forward(f, "options", "dt_min");
    expect_invalid_backward(f, "options", "dt_max");
  }
}

TEST_CASE("selective_scan: a gradient of an absent optional input must be NULL",
          "[abi][selective_scan]") {
  const struct {
    const char* input;
    const char* gradient;
    const exphil_tensor* FakeSelectiveScan::*input_pointer;
  } optional[] = {{"dt_bias", "grad_dt_bias", &FakeSelectiveScan::dt_bias_p},
                  {"D", "grad_D", &FakeSelectiveScan::D_p},
                  {"z", "grad_z", &FakeSelectiveScan::z_p},
                  {"h0", "grad_h0", &FakeSelectiveScan::h0_p}};
  for (const auto& o : optional) {
    FakeSelectiveScan f;
    f.*o.input_pointer = nullptr;  // the gradient output stays non-NULL
    expect_invalid_backward(f, o.gradient, std::string("'") + o.input + "'");
  }
}

TEST_CASE("selective_scan: outputs that overlap any other argument are rejected",
          "[abi][selective_scan]") {
  FakeSelectiveScan a;
  a.y.data = static_cast<char*>(a.x.data) + 16;
  expect_invalid_forward(a, "y", "overlaps argument 'x'");

  FakeSelectiveScan b;
  b.h_final.data = b.h0.data;
  expect_invalid_forward(b, "h_final", "overlaps argument 'h0'");

  {
    // Two outputs: either may be the one named first.
    FakeSelectiveScan c;
    c.grad_A.data = static_cast<char*>(c.grad_B.data) + 8;
    const exphil_status status = c.backward();
    INFO("message: " << exphil_last_error());
    CHECK(status == EXPHIL_ERROR_INVALID_ARGUMENT);
    CHECK_THAT(exphil_last_error(), Contains("'grad_A'") && Contains("'grad_B'") &&
                                        Contains("overlaps"));
  }

  FakeSelectiveScan d;
  d.grad_z.data = d.grad_y.data;
  expect_invalid_backward(d, "grad_z", "overlaps argument 'grad_y'");
}

TEST_CASE("selective_scan: misaligned data pointers are rejected", "[abi][selective_scan]") {
  FakeSelectiveScan a;
  a.B.data = static_cast<char*>(a.B.data) + 2;
  expect_invalid_forward(a, "B", "is not aligned to 4 bytes");

  FakeSelectiveScan b(EXPHIL_BF16);
  b.dt_bias.data = static_cast<char*>(b.dt_bias.data) + 2;  // f32 even with bf16 sequences
  expect_invalid_forward(b, "dt_bias", "is not aligned to 4 bytes");

  FakeSelectiveScan c(EXPHIL_F16);
  c.grad_C.data = static_cast<char*>(c.grad_C.data) + 1;
  expect_invalid_backward(c, "grad_C", "is not aligned to 2 bytes");
}

TEST_CASE("selective_scan through the C ABI matches the reference", "[gpu][abi][selective_scan]") {
  using namespace exphil;
  using namespace exphil::test;
  cudaStream_t stream = nullptr;
  REQUIRE(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking) == cudaSuccess);
  for (DType dtype : {DType::f32, DType::f16, DType::bf16}) {
    for (exphil_stream s :
         {static_cast<exphil_stream>(nullptr), static_cast<exphil_stream>(stream)}) {
      // Everything on, and everything off: with neither softplus nor clamp
      // the runner passes NULL options.
      for (bool everything : {true, false}) {
        SelectiveScanRun run;
        run.dtype = dtype;
        run.problem.batch = 2;
        run.problem.steps = 200;
        run.problem.channels = 33;
        run.problem.states = 16;
        run.problem.dt_bias = run.problem.softplus = run.problem.clamp = everything;
        run.problem.skip = run.problem.gate = run.problem.h0 = everything;
        run.grad_h_final = everything;
        if (!within_test_size(run)) continue;
        const SelectiveScanCheck check =
            run_selective_scan_case(run, selective_scan_abi_runner(s), test_seed());
        INFO(check.describe());
        CHECK(check.ok());
      }
    }
  }
  CHECK(cudaStreamDestroy(stream) == cudaSuccess);
}
