// The handlers called with call frames as XLA builds them, on the CPU: the
// operand, result and attribute lists of the contract (include/exphil/
// xla_ffi.h), the element-type and absent-operand checks, and how library
// failures come back. Calls that pass every check reach the library with host
// memory, which it refuses (or finds no device): never a kernel.
#include <catch2/catch.hpp>

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "call_frame_builder.hpp"
#include "exphil/xla_ffi.h"
#include "fake_runtime.hpp"

using Catch::Matchers::Contains;
using Catch::Matchers::StartsWith;
using exphil::test::CallFrameBuilder;
using exphil::test::fake_runtime;
using exphil::test::HandlerOutcome;

namespace {

enum class Attributes { none, delta, attention };

struct Signature {
  const char* target;
  exphil_xla_ffi_handler* handler;
  int operands;
  int results;
  Attributes attributes;
  const char* first_operand;
};

// The contract, target by target.
const Signature kSignatures[] = {
    {"exphil_linear_scan_fwd", exphil_linear_scan_fwd, 3, 2, Attributes::none, "a"},
    {"exphil_linear_scan_bwd", exphil_linear_scan_bwd, 6, 3, Attributes::none, "a"},
    {"exphil_min_gru_fwd", exphil_min_gru_fwd, 3, 2, Attributes::none, "gate"},
    {"exphil_min_gru_bwd", exphil_min_gru_bwd, 6, 3, Attributes::none, "gate"},
    {"exphil_min_lstm_fwd", exphil_min_lstm_fwd, 4, 2, Attributes::none, "forget"},
    {"exphil_min_lstm_bwd", exphil_min_lstm_bwd, 7, 4, Attributes::none, "forget"},
    {"exphil_liquid_fwd", exphil_liquid_fwd, 3, 2, Attributes::none, "tau"},
    {"exphil_liquid_bwd", exphil_liquid_bwd, 6, 3, Attributes::none, "tau"},
    {"exphil_selective_scan_fwd", exphil_selective_scan_fwd, 9, 2, Attributes::delta, "x"},
    {"exphil_selective_scan_bwd", exphil_selective_scan_bwd, 11, 9, Attributes::delta, "x"},
    {"exphil_attention_fwd", exphil_attention_fwd, 3, 2, Attributes::attention, "q"},
    {"exphil_attention_bwd", exphil_attention_bwd, 6, 3, Attributes::attention, "q"},
};

// The attributes as JAX passes them (np.bool_, np.int32, np.float32).
void add_attributes(CallFrameBuilder& frame, Attributes attributes) {
  switch (attributes) {
    case Attributes::none: break;
    case Attributes::delta:
      frame.attribute("softplus", true)
          .attribute("clamp", false)
          .attribute("dt_min", 0.001f)
          .attribute("dt_max", 0.1f);
      break;
    case Attributes::attention:
      frame.attribute("mask", int32_t{1})
          .attribute("window", int32_t{0})
          .attribute("layout", int32_t{0})
          .attribute("scale", 0.0f)
          .attribute("precision", int32_t{0});
      break;
  }
}

// A failure reported by the library (not by the handler's own checks or by
// XLA's decoding): on a machine without a GPU, no device; with one, the host
// memory of these frames.
void check_reached_library(const HandlerOutcome& outcome, const std::string& target) {
  INFO(outcome.message);
  REQUIRE_FALSE(outcome.ok);
  CHECK_THAT(outcome.message, StartsWith(target + ": "));
  CHECK_THAT(outcome.message, !Contains(target + ": operand '") &&
                                  !Contains(target + ": result '") &&
                                  !Contains("Wrong number") && !Contains("decode"));
  const bool no_device = outcome.code == XLA_FFI_Error_Code_UNAVAILABLE;
  const bool host_memory = outcome.code == XLA_FFI_Error_Code_INVALID_ARGUMENT;
  CHECK((no_device || host_memory));
}

// exphil_selective_scan_bwd with B = 1, T = 2, D = 4, N = 2, f32; the
// optional inputs and their gradients present or absent (shape [0]).
struct SelectiveScanBackwardFrame {
  bool dt_bias = true, D = true, z = true, h0 = true, grad_h_final = true;
  std::optional<std::vector<int64_t>> grad_D_shape;  // unset: D's (or [0])

  HandlerOutcome call(const XLA_FFI_Api* api) const {
    const auto f32 = XLA_FFI_DataType_F32;
    const std::vector<int64_t> none = {0};
    CallFrameBuilder frame(api);
    frame.operand(f32, {1, 2, 4})                           // x
        .operand(f32, {1, 2, 4})                            // dt
        .operand(f32, {4, 2})                               // A
        .operand(f32, {1, 2, 2})                            // B
        .operand(f32, {1, 2, 2})                            // C
        .operand(f32, dt_bias ? std::vector<int64_t>{4} : none)
        .operand(f32, D ? std::vector<int64_t>{4} : none)
        .operand(f32, z ? std::vector<int64_t>{1, 2, 4} : none)
        .operand(f32, h0 ? std::vector<int64_t>{1, 4, 2} : none)
        .operand(f32, {1, 2, 4})                            // grad_y
        .operand(f32, grad_h_final ? std::vector<int64_t>{1, 4, 2} : none);
    frame.result(f32, {1, 2, 4})                            // grad_x
        .result(f32, {1, 2, 4})                             // grad_dt
        .result(f32, {4, 2})                                // grad_A
        .result(f32, {1, 2, 2})                             // grad_B
        .result(f32, {1, 2, 2})                             // grad_C
        .result(f32, dt_bias ? std::vector<int64_t>{4} : none)
        .result(f32, grad_D_shape.value_or(D ? std::vector<int64_t>{4} : none))
        .result(f32, z ? std::vector<int64_t>{1, 2, 4} : none)
        .result(f32, h0 ? std::vector<int64_t>{1, 4, 2} : none);
    add_attributes(frame, Attributes::delta);
    return frame.call(exphil_selective_scan_bwd);
  }
};

}  // namespace

TEST_CASE("handlers: operand, result and attribute lists of the contract",
          "[xla_ffi]") {
  const auto api = fake_runtime().api;
  const auto f64 = XLA_FFI_DataType_F64;
  for (const Signature& s : kSignatures) {
    INFO(s.target);
    // XLA's decoding enforces the counts, naming the expected one.
    HandlerOutcome o = CallFrameBuilder(api).call(s.handler);
    CHECK(o.code == XLA_FFI_Error_Code_INVALID_ARGUMENT);
    CHECK_THAT(o.message, Contains("Wrong number of arguments: expected " +
                                   std::to_string(s.operands) + " but got 0"));

    o = CallFrameBuilder(api).operands(s.operands, f64, {1}).call(s.handler);
    CHECK_THAT(o.message, Contains("Wrong number of results: expected " +
                                   std::to_string(s.results) + " but got 0"));

    if (s.attributes != Attributes::none) {
      o = CallFrameBuilder(api)
              .operands(s.operands, f64, {1})
              .results(s.results, f64, {1})
              .call(s.handler);
      // selective scan: softplus, clamp, dt_min, dt_max; attention: mask,
      // window, layout, scale, precision
      const int expected = s.attributes == Attributes::attention ? 5 : 4;
      CHECK_THAT(o.message, Contains("Wrong number of attributes: expected " +
                                     std::to_string(expected) + " but got 0"));
    }

    // With everything decoded (attribute names and types included), the
    // handler's own check names the first operand and the types it takes.
    CallFrameBuilder frame(api);
    frame.operands(s.operands, f64, {1}).results(s.results, f64, {1});
    add_attributes(frame, s.attributes);
    o = frame.call(s.handler);
    CHECK(o.code == XLA_FFI_Error_Code_INVALID_ARGUMENT);
    CHECK(o.message == std::string(s.target) + ": operand '" + s.first_operand +
                           "': element type F64 is not supported; expected f32, bf16 or f16");
  }
  CHECK(fake_runtime().control->live_errors() == 0);
}

TEST_CASE("handlers: f32, bf16 and f16 reach the library", "[xla_ffi]") {
  const auto api = fake_runtime().api;
  for (const XLA_FFI_DataType type :
       {XLA_FFI_DataType_F32, XLA_FFI_DataType_BF16, XLA_FFI_DataType_F16}) {
    INFO("XLA element type " << static_cast<int>(type));
    const HandlerOutcome o = CallFrameBuilder(api)
                                 .operands(2, type, {2, 3, 4})  // a, b
                                 .operand(XLA_FFI_DataType_F32, {2, 4})  // h0
                                 .result(type, {2, 3, 4})                // y
                                 .result(type, {2, 4})                   // h_final
                                 .call(exphil_linear_scan_fwd);
    check_reached_library(o, "exphil_linear_scan_fwd");
  }
}

TEST_CASE("handlers: the library's validation comes back under the target name",
          "[xla_ffi]") {
  const auto api = fake_runtime().api;
  const auto f32 = XLA_FFI_DataType_F32;
  // h0 of the wrong width: invalid argument, the library's message after the
  // target name.
  HandlerOutcome o = CallFrameBuilder(api)
                         .operands(3, f32, {2, 3, 4})  // forget, input, candidate
                         .operand(f32, {2, 5})         // h0
                         .result(f32, {2, 3, 4})
                         .result(f32, {2, 4})
                         .call(exphil_min_lstm_fwd);
  CHECK(o.code == XLA_FFI_Error_Code_INVALID_ARGUMENT);
  CHECK_THAT(o.message, StartsWith("exphil_min_lstm_fwd: min_lstm forward: ") &&
                            Contains("'h0'"));

  // A head width the kernels do not support: unimplemented.
  const auto f16 = XLA_FFI_DataType_F16;
  CallFrameBuilder attention(api);
  attention.operands(3, f16, {1, 2, 8, 48}).result(f16, {1, 2, 8, 48}).result(f32, {1, 2, 8});
  add_attributes(attention, Attributes::attention);
  o = attention.call(exphil_attention_fwd);
  INFO(o.message);
  CHECK(o.code == XLA_FFI_Error_Code_UNIMPLEMENTED);
  CHECK_THAT(o.message, StartsWith("exphil_attention_fwd: "));
}

TEST_CASE("handlers: selective scan, absent optional operands and their gradients",
          "[xla_ffi]") {
  const auto api = fake_runtime().api;

  SECTION("all 11 operands and 9 results present") {
    check_reached_library(SelectiveScanBackwardFrame{}.call(api), "exphil_selective_scan_bwd");
  }
  SECTION("every optional operand absent, with empty gradients") {
    SelectiveScanBackwardFrame f;
    f.dt_bias = f.D = f.z = f.h0 = f.grad_h_final = false;
    check_reached_library(f.call(api), "exphil_selective_scan_bwd");
  }
  SECTION("the gradient of an absent operand must be empty") {
    SelectiveScanBackwardFrame f;
    f.D = false;
    f.grad_D_shape = std::vector<int64_t>{4};
    const HandlerOutcome o = f.call(api);
    CHECK(o.code == XLA_FFI_Error_Code_INVALID_ARGUMENT);
    CHECK(o.message ==
          "exphil_selective_scan_bwd: result 'grad_D': expected zero elements, since operand "
          "'D' is absent (zero elements), got shape [4]");
  }
  SECTION("the gradient of a present operand has its shape") {
    SelectiveScanBackwardFrame f;
    f.grad_D_shape = std::vector<int64_t>{0};
    const HandlerOutcome o = f.call(api);
    CHECK(o.code == XLA_FFI_Error_Code_INVALID_ARGUMENT);
    CHECK(o.message ==
          "exphil_selective_scan_bwd: result 'grad_D': expected the shape of operand 'D', [4], "
          "got [0]");
  }
}

TEST_CASE("handlers: scans, an absent h0 and grad_h_final", "[xla_ffi]") {
  const auto api = fake_runtime().api;
  const auto f32 = XLA_FFI_DataType_F32;
  const std::vector<int64_t> none = {0};

  SECTION("forward without h0") {
    const HandlerOutcome o = CallFrameBuilder(api)
                                 .operands(2, f32, {2, 3, 4})  // gate, candidate
                                 .operand(f32, none)           // h0
                                 .result(f32, {2, 3, 4})       // y
                                 .result(f32, {2, 4})          // h_final
                                 .call(exphil_min_gru_fwd);
    check_reached_library(o, "exphil_min_gru_fwd");
  }
  auto backward = [&](const std::vector<int64_t>& h0, const std::vector<int64_t>& grad_h_final,
                      const std::vector<int64_t>& grad_h0) {
    return CallFrameBuilder(api)
        .operands(3, f32, {2, 3, 4})  // forget, input, candidate
        .operand(f32, h0)
        .operand(f32, {2, 3, 4})      // y
        .operand(f32, {2, 3, 4})      // grad_y
        .operand(f32, grad_h_final)
        .results(3, f32, {2, 3, 4})   // grad_forget, grad_input, grad_candidate
        .result(f32, grad_h0)
        .call(exphil_min_lstm_bwd);
  };
  SECTION("backward without h0 or grad_h_final, with an empty grad_h0") {
    check_reached_library(backward(none, none, none), "exphil_min_lstm_bwd");
  }
  SECTION("backward with h0 but without grad_h_final") {
    check_reached_library(backward({2, 4}, none, {2, 4}), "exphil_min_lstm_bwd");
  }
  SECTION("grad_h0 must be empty when h0 is") {
    const HandlerOutcome o = backward(none, {2, 4}, {2, 4});
    CHECK(o.code == XLA_FFI_Error_Code_INVALID_ARGUMENT);
    CHECK(o.message ==
          "exphil_min_lstm_bwd: result 'grad_h0': expected zero elements, since operand 'h0' is "
          "absent (zero elements), got shape [2, 4]");
  }
}

TEST_CASE("handlers: malformed buffers and attributes", "[xla_ffi]") {
  const auto api = fake_runtime().api;
  const auto f32 = XLA_FFI_DataType_F32;

  SECTION("an empty required operand") {
    const HandlerOutcome o = CallFrameBuilder(api)
                                 .operand(f32, {2, 0, 4})
                                 .operand(f32, {2, 3, 4})
                                 .operand(f32, {2, 4})
                                 .result(f32, {2, 3, 4})
                                 .result(f32, {2, 4})
                                 .call(exphil_liquid_fwd);
    CHECK(o.message == "exphil_liquid_fwd: operand 'tau': has zero elements (shape [2, 0, 4]); "
                       "every dimension must be >= 1");
  }
  SECTION("a rank beyond the descriptors'") {
    const HandlerOutcome o = CallFrameBuilder(api)
                                 .operands(2, f32, {2, 3, 4})
                                 .operand(f32, {2, 4})
                                 .result(f32, {1, 1, 1, 1, 1, 1, 1, 1, 1})
                                 .result(f32, {2, 4})
                                 .call(exphil_min_gru_fwd);
    CHECK(o.message ==
          "exphil_min_gru_fwd: result 'y': rank 9; the ops take at most 8 dimensions");
  }
  SECTION("an attribute of the wrong type is a decoding error") {
    CallFrameBuilder frame(api);
    frame.operands(9, f32, {1}).results(2, f32, {1});
    frame.attribute("softplus", int32_t{1})
        .attribute("clamp", false)
        .attribute("dt_min", 0.0f)
        .attribute("dt_max", 1.0f);
    const HandlerOutcome o = frame.call(exphil_selective_scan_fwd);
    CHECK(o.code == XLA_FFI_Error_Code_INVALID_ARGUMENT);
    CHECK_THAT(o.message, Contains("Wrong scalar data type"));
  }
}
