// The C++ API's selective-scan options that the C ABI does not carry
// (SelectiveScanOptions::input_scale), checked before any device work: on
// fake device addresses a valid call gets as far as the device check.
#include <catch2/catch.hpp>

#include <cstdint>
#include <initializer_list>
#include <string>

#include "device_buffer.hpp"
#include "exphil/selective_scan.hpp"

using Catch::Matchers::Contains;
using Catch::Matchers::StartsWith;
using namespace exphil;

namespace {

// B2 T5 D4 N3, f32, every tensor at its own fake address.
struct FakeCall {
  FakeCall() {
    uintptr_t next = uintptr_t{1} << 32;
    auto make = [&](Tensor& t, std::initializer_list<int64_t> shape) {
      t = make_tensor(reinterpret_cast<void*>(next), DType::f32, shape);
      next += uintptr_t{1} << 20;
    };
    for (Tensor* t : {&x, &dt, &y, &grad_y, &grad_x}) make(*t, {2, 5, 4});
    for (Tensor* t : {&B, &C}) make(*t, {2, 5, 3});
    make(A, {4, 3});
    in.x = &x;
    in.dt = &dt;
    in.A = &A;
    in.B = &B;
    in.C = &C;
    options.clamp = true;
    options.dt_min = 0.001f;
    options.dt_max = 0.1f;
  }

  Status forward() const {
    SelectiveScanForwardArgs args;
    args.in = in;
    args.options = options;
    args.y = &y;
    return selective_scan_forward(args);
  }
  Status backward() const {
    SelectiveScanBackwardArgs args;
    args.in = in;
    args.options = options;
    args.grad_y = &grad_y;
    args.grad_x = &grad_x;
    return selective_scan_backward(args);
  }

  Tensor x, dt, A, B, C, y, grad_y, grad_x;
  SelectiveScanInputs in;
  SelectiveScanOptions options;
};

void expect_past_validation(const Status& s, const char* direction) {
  INFO("message: " << s.message());
  CHECK_THAT(s.message(), StartsWith(std::string("selective_scan ") + direction + ": "));
  if (test::gpu_available(nullptr)) {
    CHECK(s.code() == StatusCode::invalid_argument);
    CHECK_THAT(s.message(), Contains("expected device memory"));
  } else {
    CHECK(s.code() == StatusCode::no_device);
  }
}

}  // namespace

TEST_CASE("selective_scan options: input_scale channel_mean is a forward option",
          "[selective_scan]") {
  FakeCall call;
  call.options.input_scale = SelectiveScanInputScale::channel_mean;
  expect_past_validation(call.forward(), "forward");

  const Status s = call.backward();
  INFO("message: " << s.message());
  CHECK(s.code() == StatusCode::invalid_argument);
  CHECK_THAT(s.message(), StartsWith("selective_scan backward: argument 'options': input_scale "
                                     "channel_mean has no backward (expected delta)"));

  call.options.input_scale = SelectiveScanInputScale::delta;
  expect_past_validation(call.forward(), "forward");
  expect_past_validation(call.backward(), "backward");
}

TEST_CASE("selective_scan options: an unknown input_scale is refused by name",
          "[selective_scan]") {
  FakeCall call;
  call.options.input_scale = static_cast<SelectiveScanInputScale>(7);
  for (const Status& s : {call.forward(), call.backward()}) {
    INFO("message: " << s.message());
    CHECK(s.code() == StatusCode::invalid_argument);
    CHECK_THAT(s.message(), Contains("argument 'options': expected input_scale delta (0) or "
                                     "channel_mean (1), got 7"));
  }
}
