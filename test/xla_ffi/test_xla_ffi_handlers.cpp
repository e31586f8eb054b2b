// The handlers called with call frames as XLA builds them, on the CPU: the
// operand, result and attribute lists of the contract (the rows of
// include/exphil/xla_ffi_targets.h, parsed here as any other reader of that
// file would), the element-type and absent-operand checks, and how library
// failures come back. Calls that pass every check reach the library with host
// memory, which it refuses (or finds no device): never a kernel.
#include <catch2/catch.hpp>

#include <cstdint>
#include <initializer_list>
#include <limits>
#include <map>
#include <optional>
#include <sstream>
#include <string>
#include <tuple>
#include <vector>

#include "call_frame_builder.hpp"
#include "exphil/xla_ffi.h"
#include "exphil/xla_ffi_targets.h"
#include "fake_runtime.hpp"

using Catch::Matchers::Contains;
using Catch::Matchers::StartsWith;
using exphil::test::CallFrameBuilder;
using exphil::test::fake_runtime;
using exphil::test::HandlerOutcome;

namespace {

std::vector<std::string> words_of(const char* text) {
  std::istringstream in(text);
  std::vector<std::string> words;
  for (std::string w; in >> w;) words.push_back(w);
  return words;
}

bool is_optional(const std::string& word) { return !word.empty() && word.back() == '?'; }
std::string bare(const std::string& word) {
  return is_optional(word) ? word.substr(0, word.size() - 1) : word;
}

// "name:type" or "name?:type".
struct AttributeWord {
  std::string name;
  bool optional;
  std::string type;  // i1, i32 or f32
};

// One EXPHIL_XLA_FFI_TARGET row.
struct Row {
  std::string target;
  exphil_xla_ffi_handler* handler;
  std::vector<std::string> operands;  // "h0?" optional
  std::vector<std::string> results;   // "grad_h0?" the gradient of "h0?"
  std::vector<AttributeWord> attributes;

  static Row parse(const char* target, exphil_xla_ffi_handler* handler, const char* operands,
                   const char* results, const char* attributes) {
    Row row{target, handler, words_of(operands), words_of(results), {}};
    for (const std::string& w : words_of(attributes)) {
      const std::size_t colon = w.find(':');
      const std::string name = w.substr(0, colon);
      row.attributes.push_back({bare(name), is_optional(name), w.substr(colon + 1)});
    }
    return row;
  }

  // The optional operand whose gradient `result` is, or "".
  std::string gradient_input(const std::string& result) const {
    if (!is_optional(result) || bare(result).rfind("grad_", 0) != 0) return "";
    return bare(result).substr(5);
  }
};

#define EXPHIL_TEST_ROW(name, operands, results, attributes) \
  Row::parse(#name, name, operands, results, attributes),
const std::vector<Row> kRows = {EXPHIL_XLA_FFI_TARGETS(EXPHIL_TEST_ROW)};
#undef EXPHIL_TEST_ROW

// Adds `a` with the type its row lists; has_* flags take `has`.
void add_listed(CallFrameBuilder& frame, const AttributeWord& a, bool has = true) {
  if (a.type == "i1")
    frame.attribute(a.name, a.optional ? has : true);
  else if (a.type == "i32")
    frame.attribute(a.name, int32_t{0});
  else if (a.type == "f32")
    frame.attribute(a.name, 0.0f);
  else
    FAIL("a row lists attribute " << a.name << " with type " << a.type);
}

// Adds `a` with a type near the listed one but not it: i32 for i1, i64 for
// i32, f64 for f32. Returns that type's MLIR name.
std::string add_wrong_type(CallFrameBuilder& frame, const AttributeWord& a) {
  if (a.type == "i1") {
    frame.attribute(a.name, int32_t{1});
    return "i32";
  }
  if (a.type == "i32") {
    frame.attribute(a.name, int64_t{0});
    return "i64";
  }
  frame.attribute(a.name, 0.0);
  return "f64";
}

// The attributes of `row` typed as listed, but `skip`; the optional (has_*)
// ones set to `has`, or left out without it.
void add_row_attributes(CallFrameBuilder& frame, const Row& row, std::optional<bool> has,
                        const std::string& skip = "") {
  for (const AttributeWord& a : row.attributes) {
    if (a.name == skip || (a.optional && !has)) continue;
    add_listed(frame, a, has.value_or(true));
  }
}

// The buffers of `row`: `type` [1] each, but those `shapes` names (by name,
// "?" left out).
CallFrameBuilder& add_row_buffers(CallFrameBuilder& frame, const Row& row, XLA_FFI_DataType type,
                                  const std::map<std::string, std::vector<int64_t>>& shapes = {}) {
  auto shape_of = [&](const std::string& w) {
    const auto it = shapes.find(bare(w));
    return it == shapes.end() ? std::vector<int64_t>{1} : it->second;
  };
  for (const std::string& w : row.operands) frame.operand(type, shape_of(w));
  for (const std::string& w : row.results) frame.result(type, shape_of(w));
  return frame;
}

// The attributes of the selective scan (as JAX passes them: np.bool_,
// np.float32) and of attention (np.int32, np.float32).
void add_delta_attributes(CallFrameBuilder& frame) {
  frame.attribute("softplus", true)
      .attribute("clamp", false)
      .attribute("dt_min", 0.001f)
      .attribute("dt_max", 0.1f);
}

void add_attention_attributes(CallFrameBuilder& frame) {
  frame.attribute("mask", int32_t{1})
      .attribute("window", int32_t{0})
      .attribute("layout", int32_t{0})
      .attribute("scale", 0.0f)
      .attribute("precision", int32_t{0});
}

// A failure reported by the library (not by the handler's own checks or by
// XLA's decoding): on a machine without a GPU, no device; with one, the host
// memory of these frames. `unmentioned`: arguments the library must not
// name, those passed to it as absent (NULL).
void check_reached_library(const HandlerOutcome& outcome, const std::string& target,
                           const std::vector<std::string>& unmentioned = {}) {
  INFO(outcome.message);
  REQUIRE_FALSE(outcome.ok);
  CHECK_THAT(outcome.message, StartsWith(target + ": "));
  CHECK_THAT(outcome.message, !Contains(target + ": operand '") &&
                                  !Contains(target + ": result '") &&
                                  !Contains(target + ": attribute '") &&
                                  !Contains("Wrong number") && !Contains("decode"));
  for (const std::string& name : unmentioned)
    CHECK_THAT(outcome.message, !Contains("'" + name + "'"));
  const bool no_device = outcome.code == XLA_FFI_Error_Code_UNAVAILABLE;
  const bool host_memory = outcome.code == XLA_FFI_Error_Code_INVALID_ARGUMENT;
  CHECK((no_device || host_memory));
}

// Shapes for a frame whose tensor `bad` is one longer in its last
// dimension (none when `bad` is empty): the library refuses it by name.
struct Lengthened {
  std::string bad;
  std::vector<int64_t> operator()(const std::string& name, std::vector<int64_t> shape) const {
    if (name == bad) ++shape.back();
    return shape;
  }
};

// Each of `names`, lengthened in the frame `call(name)` builds and calls, is
// refused by the library naming it: "<prefix>argument '<name>'".
template <class Call>
void check_each_named(const Call& call, std::initializer_list<const char*> names,
                      const std::string& prefix) {
  for (const char* name : names) {
    INFO(name);
    const HandlerOutcome o = call(name);
    CHECK(o.code == XLA_FFI_Error_Code_INVALID_ARGUMENT);
    CHECK_THAT(o.message, StartsWith(prefix + "argument '" + name + "'"));
  }
}

// exphil_selective_scan_bwd with B = 1, T = 2, D = 4, N = 2, f32; the
// optional inputs and their gradients present or absent. Absent is a
// zero-element buffer ([0]) without has_* attributes, and a scalar with
// them (has_* = false), as Nx passes it.
struct SelectiveScanBackwardFrame {
  bool dt_bias = true, D = true, z = true, h0 = true, grad_h_final = true;
  bool with_has_attributes = false;
  std::optional<std::vector<int64_t>> grad_D_shape;  // unset: D's (or absent's)

  HandlerOutcome call(const XLA_FFI_Api* api) const {
    const auto f32 = XLA_FFI_DataType_F32;
    const std::vector<int64_t> none =
        with_has_attributes ? std::vector<int64_t>{} : std::vector<int64_t>{0};
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
    add_delta_attributes(frame);
    if (with_has_attributes) {
      frame.attribute("has_dt_bias", dt_bias)
          .attribute("has_D", D)
          .attribute("has_z", z)
          .attribute("has_h0", h0)
          .attribute("has_grad_h_final", grad_h_final);
    }
    return frame.call(exphil_selective_scan_bwd);
  }
};

// The optional operands of `row`, "?" left out.
std::vector<std::string> optional_operands(const Row& row) {
  std::vector<std::string> names;
  for (const std::string& w : row.operands)
    if (is_optional(w)) names.push_back(bare(w));
  return names;
}

// Each optional operand of `row` and its gradient result with shape `dims`.
std::map<std::string, std::vector<int64_t>> absent_shapes(const Row& row,
                                                          const std::vector<int64_t>& dims) {
  std::map<std::string, std::vector<int64_t>> shapes;
  for (const std::string& name : optional_operands(row)) shapes[name] = dims;
  for (const std::string& w : row.results)
    if (!row.gradient_input(w).empty()) shapes[bare(w)] = dims;
  return shapes;
}

}  // namespace

TEST_CASE("handlers: the rows of xla_ffi_targets.h, one for each target", "[xla_ffi]") {
  std::size_t count = 0;
  const exphil_xla_ffi_target* targets = exphil_xla_ffi_targets(&count);
  REQUIRE(count == kRows.size());
  for (std::size_t i = 0; i < count; ++i) {
    CHECK(targets[i].name == kRows[i].target);
    CHECK(targets[i].handler == kRows[i].handler);
  }
}

TEST_CASE("handlers: operand and result counts of the rows", "[xla_ffi]") {
  const auto api = fake_runtime().api;
  const auto f64 = XLA_FFI_DataType_F64;
  for (const Row& row : kRows) {
    INFO(row.target);
    const int operands = static_cast<int>(row.operands.size());
    const int results = static_cast<int>(row.results.size());
    // XLA's decoding enforces the counts, naming the expected one.
    HandlerOutcome o = CallFrameBuilder(api).call(row.handler);
    CHECK(o.code == XLA_FFI_Error_Code_INVALID_ARGUMENT);
    CHECK_THAT(o.message, Contains("Wrong number of arguments: expected " +
                                   std::to_string(operands) + " but got 0"));

    o = CallFrameBuilder(api).operands(operands, f64, {1}).call(row.handler);
    CHECK_THAT(o.message, Contains("Wrong number of results: expected " +
                                   std::to_string(results) + " but got 0"));

    // With everything decoded (attribute names and types included), the
    // handler's own check names the first operand and the types it takes.
    for (const std::optional<bool> has : {std::optional<bool>(), std::optional<bool>(true)}) {
      CallFrameBuilder frame(api);
      add_row_buffers(frame, row, f64);
      add_row_attributes(frame, row, has);
      o = frame.call(row.handler);
      CHECK(o.code == XLA_FFI_Error_Code_INVALID_ARGUMENT);
      CHECK(o.message == row.target + ": operand '" + bare(row.operands[0]) +
                             "': element type F64 is not supported; expected f32, bf16 or f16");
    }
  }
  CHECK(fake_runtime().control->live_errors() == 0);
}

TEST_CASE("handlers: attributes exactly as the rows list them", "[xla_ffi]") {
  const auto api = fake_runtime().api;
  const auto f32 = XLA_FFI_DataType_F32;

  SECTION("every attribute, typed as listed, reaches the library") {
    for (const Row& row : kRows) {
      INFO(row.target);
      for (const std::optional<bool> has : {std::optional<bool>(), std::optional<bool>(true)}) {
        CallFrameBuilder frame(api);
        add_row_buffers(frame, row, f32);
        add_row_attributes(frame, row, has);
        check_reached_library(frame.call(row.handler), row.target);
      }
    }
  }
  SECTION("a missing required attribute is named") {
    for (const Row& row : kRows) {
      for (const AttributeWord& a : row.attributes) {
        if (a.optional) continue;
        INFO(row.target << ", without " << a.name);
        CallFrameBuilder frame(api);
        add_row_buffers(frame, row, f32);
        add_row_attributes(frame, row, true, a.name);
        const HandlerOutcome o = frame.call(row.handler);
        CHECK(o.code == XLA_FFI_Error_Code_INVALID_ARGUMENT);
        CHECK(o.message ==
              row.target + ": attribute '" + a.name + "': missing; expected " + a.type);
      }
    }
  }
  SECTION("an attribute of a type other than the listed one is named") {
    for (const Row& row : kRows) {
      for (const AttributeWord& a : row.attributes) {
        INFO(row.target << ", " << a.name);
        CallFrameBuilder frame(api);
        add_row_buffers(frame, row, f32);
        add_row_attributes(frame, row, true, a.name);
        const std::string given = add_wrong_type(frame, a);
        const HandlerOutcome o = frame.call(row.handler);
        CHECK(o.code == XLA_FFI_Error_Code_INVALID_ARGUMENT);
        CHECK(o.message == row.target + ": attribute '" + a.name + "': expected " + a.type +
                               ", got " + given);
      }
    }
  }
  SECTION("an attribute the row does not list is named, never ignored") {
    for (const Row& row : kRows) {
      INFO(row.target);
      // A typo of an attribute's name, or has_h0 where there is no h0.
      const std::string unknown =
          row.attributes.empty() ? "has_h0" : row.attributes.back().name + "s";
      CallFrameBuilder frame(api);
      add_row_buffers(frame, row, f32);
      add_row_attributes(frame, row, true);
      frame.attribute(unknown, true);
      const HandlerOutcome o = frame.call(row.handler);
      CHECK(o.code == XLA_FFI_Error_Code_INVALID_ARGUMENT);
      CHECK_THAT(o.message, StartsWith(row.target + ": attribute '" + unknown + "': unknown; "));
    }
  }
  CHECK(fake_runtime().control->live_errors() == 0);
}

TEST_CASE("handlers: has_* attributes of the optional operands", "[xla_ffi]") {
  const auto api = fake_runtime().api;
  const auto f32 = XLA_FFI_DataType_F32;

  SECTION("has_* = false: scalar placeholders for the operands and their gradients") {
    for (const Row& row : kRows) {
      if (optional_operands(row).empty()) continue;
      INFO(row.target);
      CallFrameBuilder frame(api);
      add_row_buffers(frame, row, f32, absent_shapes(row, {}));
      add_row_attributes(frame, row, false);
      check_reached_library(frame.call(row.handler), row.target);
    }
  }
  SECTION("has_* = true: a zero-element buffer is refused, naming the operand") {
    for (const Row& row : kRows) {
      for (const std::string& name : optional_operands(row)) {
        INFO(row.target << ", " << name);
        CallFrameBuilder frame(api);
        add_row_buffers(frame, row, f32, {{name, {0}}});
        add_row_attributes(frame, row, true);
        const HandlerOutcome o = frame.call(row.handler);
        CHECK(o.code == XLA_FFI_Error_Code_INVALID_ARGUMENT);
        CHECK(o.message == row.target + ": operand '" + name +
                               "': has zero elements (shape [0]), but has_" + name +
                               " is true; pass has_" + name + " = false for an absent " + name);
      }
    }
  }
  SECTION("without has_*, zero elements are absent, as JAX passes them") {
    for (const Row& row : kRows) {
      if (optional_operands(row).empty()) continue;
      INFO(row.target);
      CallFrameBuilder frame(api);
      add_row_buffers(frame, row, f32, absent_shapes(row, {0}));
      add_row_attributes(frame, row, std::nullopt);
      check_reached_library(frame.call(row.handler), row.target);
    }
  }
  CHECK(fake_runtime().control->live_errors() == 0);
}

TEST_CASE("handlers: attribute values reach the library as given", "[xla_ffi]") {
  const auto api = fake_runtime().api;
  const auto f32 = XLA_FFI_DataType_F32;
  // The library's option checks come first and quote the values they refuse.
  auto attention = [&](int32_t mask, int32_t window, int32_t layout, float scale,
                       int32_t precision) {
    return CallFrameBuilder(api)
        .operands(3, f32, {1, 2, 8, 32})
        .result(f32, {1, 2, 8, 32})
        .result(f32, {1, 2, 8})
        .attribute("mask", mask)
        .attribute("window", window)
        .attribute("layout", layout)
        .attribute("scale", scale)
        .attribute("precision", precision)
        .call(exphil_attention_fwd);
  };
  const float inf = std::numeric_limits<float>::infinity();
  CHECK_THAT(attention(7, 0, 0, 0.0f, 0).message, Contains("or 2 (window), got 7"));
  CHECK_THAT(attention(2, -3, 0, 0.0f, 0).message,
             Contains("expected window >= 1 with the window mask, got -3"));
  CHECK_THAT(attention(0, 0, 5, 0.0f, 0).message, Contains("([B, T, H, d]), got 5"));
  CHECK_THAT(attention(0, 0, 0, inf, 0).message, Contains("(0 for 1 / sqrt(d)), got inf"));
  CHECK_THAT(attention(0, 0, 0, 0.0f, 9).message, Contains("or 1 (tf32x3), got 9"));

  // f32 values keep their fraction (XLA's by-iterator get<float> would not).
  CallFrameBuilder frame(api);
  frame.operand(f32, {1, 2, 4})   // x
      .operand(f32, {1, 2, 4})    // dt
      .operand(f32, {4, 2})       // A
      .operand(f32, {1, 2, 2})    // B
      .operand(f32, {1, 2, 2})    // C
      .operands(4, f32, {0})      // dt_bias, D, z, h0
      .result(f32, {1, 2, 4})     // y
      .result(f32, {1, 4, 2})     // h_final
      .attribute("softplus", false)
      .attribute("clamp", true)
      .attribute("dt_min", 0.75f)
      .attribute("dt_max", 0.5f);
  const HandlerOutcome o = frame.call(exphil_selective_scan_fwd);
  CHECK(o.code == XLA_FFI_Error_Code_INVALID_ARGUMENT);
  CHECK_THAT(o.message, StartsWith("exphil_selective_scan_fwd: ") &&
                            Contains("got dt_min = 0.750000, dt_max = 0.500000"));
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
  add_attention_attributes(attention);
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
  SECTION("has_* = false: every optional operand absent, scalar placeholders") {
    SelectiveScanBackwardFrame f;
    f.with_has_attributes = true;
    f.dt_bias = f.D = f.z = f.h0 = f.grad_h_final = false;
    check_reached_library(f.call(api), "exphil_selective_scan_bwd",
                          {"dt_bias", "D", "z", "h0", "grad_h_final", "grad_dt_bias", "grad_D",
                           "grad_z", "grad_h0"});
  }
  SECTION("has_* = false: the gradient of an absent operand is never looked at") {
    SelectiveScanBackwardFrame f;
    f.with_has_attributes = true;
    f.D = false;
    f.grad_D_shape = std::vector<int64_t>{7, 3};
    check_reached_library(f.call(api), "exphil_selective_scan_bwd", {"D", "grad_D"});
  }
  SECTION("has_* = true: the gradient of a present operand has its shape") {
    SelectiveScanBackwardFrame f;
    f.with_has_attributes = true;
    f.grad_D_shape = std::vector<int64_t>{};
    const HandlerOutcome o = f.call(api);
    CHECK(o.code == XLA_FFI_Error_Code_INVALID_ARGUMENT);
    CHECK(o.message ==
          "exphil_selective_scan_bwd: result 'grad_D': expected the shape of operand 'D', [4], "
          "got []");
  }
  SECTION("has_* for some operands only: the others go by their element count") {
    const auto f32 = XLA_FFI_DataType_F32;
    const std::vector<int64_t> empty = {0};
    CallFrameBuilder frame(api);
    frame.operand(f32, {1, 2, 4})   // x
        .operand(f32, {1, 2, 4})    // dt
        .operand(f32, {4, 2})       // A
        .operand(f32, {1, 2, 2})    // B
        .operand(f32, {1, 2, 2})    // C
        .operand(f32, {})           // dt_bias: has_dt_bias = false
        .operand(f32, {4})          // D: has_D = true
        .operand(f32, empty)        // z: zero elements
        .operand(f32, {1, 4, 2})    // h0: present by its element count
        .operand(f32, {1, 2, 4})    // grad_y
        .operand(f32, empty);       // grad_h_final: zero elements
    frame.result(f32, {1, 2, 4})    // grad_x
        .result(f32, {1, 2, 4})     // grad_dt
        .result(f32, {4, 2})        // grad_A
        .result(f32, {1, 2, 2})     // grad_B
        .result(f32, {1, 2, 2})     // grad_C
        .result(f32, {})            // grad_dt_bias
        .result(f32, {4})           // grad_D
        .result(f32, empty)         // grad_z
        .result(f32, {1, 4, 2});    // grad_h0
    add_delta_attributes(frame);
    frame.attribute("has_dt_bias", false).attribute("has_D", true);
    check_reached_library(frame.call(exphil_selective_scan_bwd), "exphil_selective_scan_bwd",
                          {"dt_bias", "z", "grad_h_final", "grad_dt_bias", "grad_z"});
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
  auto backward_with_flags = [&](bool has_h0, bool has_grad_h_final,
                                 const std::vector<int64_t>& h0,
                                 const std::vector<int64_t>& grad_h_final,
                                 const std::vector<int64_t>& grad_h0) {
    return CallFrameBuilder(api)
        .operands(3, f32, {2, 3, 4})  // forget, input, candidate
        .operand(f32, h0)
        .operand(f32, {2, 3, 4})      // y
        .operand(f32, {2, 3, 4})      // grad_y
        .operand(f32, grad_h_final)
        .results(3, f32, {2, 3, 4})   // grad_forget, grad_input, grad_candidate
        .result(f32, grad_h0)
        .attribute("has_h0", has_h0)
        .attribute("has_grad_h_final", has_grad_h_final)
        .call(exphil_min_lstm_bwd);
  };
  SECTION("has_h0 = false, has_grad_h_final = false: scalar placeholders") {
    check_reached_library(backward_with_flags(false, false, {}, {}, {}), "exphil_min_lstm_bwd",
                          {"h0", "grad_h_final", "grad_h0"});
  }
  SECTION("has_h0 = false: grad_h0 of any shape is never written") {
    check_reached_library(backward_with_flags(false, true, {}, {2, 4}, {2, 4}),
                          "exphil_min_lstm_bwd", {"h0", "grad_h0"});
  }
  SECTION("has_h0 = true: grad_h0 has the shape of h0") {
    const HandlerOutcome o = backward_with_flags(true, false, {2, 4}, {}, {});
    CHECK(o.code == XLA_FFI_Error_Code_INVALID_ARGUMENT);
    CHECK(o.message == "exphil_min_lstm_bwd: result 'grad_h0': expected the shape of operand "
                       "'h0', [2, 4], got []");
  }
  SECTION("forward with has_h0 = false, an h0 of any shape") {
    const HandlerOutcome o = CallFrameBuilder(api)
                                 .operands(2, f32, {2, 3, 4})  // gate, candidate
                                 .operand(f32, {5, 7})         // h0, never read
                                 .result(f32, {2, 3, 4})       // y
                                 .result(f32, {2, 4})          // h_final
                                 .attribute("has_h0", false)
                                 .call(exphil_min_gru_fwd);
    check_reached_library(o, "exphil_min_gru_fwd", {"h0"});
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
  SECTION("an attribute of the wrong type is named, with both types") {
    CallFrameBuilder frame(api);
    frame.operands(9, f32, {1}).results(2, f32, {1});
    frame.attribute("softplus", int32_t{1})
        .attribute("clamp", false)
        .attribute("dt_min", 0.0f)
        .attribute("dt_max", 1.0f);
    const HandlerOutcome o = frame.call(exphil_selective_scan_fwd);
    CHECK(o.code == XLA_FFI_Error_Code_INVALID_ARGUMENT);
    CHECK(o.message == "exphil_selective_scan_fwd: attribute 'softplus': expected i1, got i32");
  }
  SECTION("an attribute a scan does not take is refused, beside has_h0") {
    const HandlerOutcome o = CallFrameBuilder(api)
                                 .operands(2, f32, {2, 3, 4})
                                 .operand(f32, {2, 4})
                                 .result(f32, {2, 3, 4})
                                 .result(f32, {2, 4})
                                 .attribute("has_h0", true)
                                 .attribute("reverse", true)
                                 .call(exphil_linear_scan_fwd);
    CHECK(o.code == XLA_FFI_Error_Code_INVALID_ARGUMENT);
    CHECK(o.message == "exphil_linear_scan_fwd: attribute 'reverse': unknown; the target's "
                       "attributes are has_h0?:i1");
  }
}

TEST_CASE("handlers: the y-only form, h0 required, no final state", "[xla_ffi]") {
  const auto api = fake_runtime().api;
  const auto f32 = XLA_FFI_DataType_F32;
  const auto bf16 = XLA_FFI_DataType_BF16;

  SECTION("forward: y only (no h_final reaches the library), h0 f32 or the sequence dtype") {
    for (const XLA_FFI_DataType h0_type : {f32, bf16}) {
      const HandlerOutcome o = CallFrameBuilder(api)
                                   .operands(2, bf16, {2, 3, 4})  // z, candidate
                                   .operand(h0_type, {2, 4})      // h0
                                   .result(bf16, {2, 3, 4})       // y
                                   .call(exphil_min_gru_activated_fwd);
      check_reached_library(o, "exphil_min_gru_activated_fwd", {"h_final"});
    }
  }
  SECTION("backward: no grad_h_final, grad_h0 always written, in h0's dtype or f32") {
    for (const XLA_FFI_DataType state_type : {f32, bf16}) {
      const HandlerOutcome o = CallFrameBuilder(api)
                                   .operands(3, bf16, {2, 3, 4})  // f, i, candidate
                                   .operand(state_type, {2, 4})   // h0
                                   .operands(2, bf16, {2, 3, 4})  // y, grad_y
                                   .results(3, bf16, {2, 3, 4})   // grad_f, grad_i, grad_candidate
                                   .result(state_type, {2, 4})    // grad_h0
                                   .call(exphil_min_lstm_activated_bwd);
      check_reached_library(o, "exphil_min_lstm_activated_bwd", {"grad_h_final"});
    }
  }
  SECTION("h0 is required: zero elements are an error naming it, not an absent h0") {
    const HandlerOutcome o = CallFrameBuilder(api)
                                 .operands(2, f32, {2, 3, 4})  // tau, target
                                 .operand(f32, {0})            // h0
                                 .result(f32, {2, 3, 4})       // y
                                 .call(exphil_liquid_y_fwd);
    CHECK(o.code == XLA_FFI_Error_Code_INVALID_ARGUMENT);
    CHECK_THAT(o.message, StartsWith("exphil_liquid_y_fwd: operand 'h0': has zero elements"));
  }
  SECTION("has_h0 is not an attribute of the y-only targets") {
    const HandlerOutcome o = CallFrameBuilder(api)
                                 .operands(2, f32, {2, 3, 4})  // a, b
                                 .operand(f32, {2, 4})         // h0
                                 .result(f32, {2, 3, 4})       // y
                                 .attribute("has_h0", true)
                                 .call(exphil_linear_scan_y_fwd);
    CHECK(o.code == XLA_FFI_Error_Code_INVALID_ARGUMENT);
    CHECK_THAT(o.message, StartsWith("exphil_linear_scan_y_fwd: attribute 'has_h0': unknown; "));
  }
  SECTION("the library checks grad_h0 against h0") {
    const HandlerOutcome o = CallFrameBuilder(api)
                                 .operands(2, f32, {2, 3, 4})  // tau, target
                                 .operand(f32, {2, 4})         // h0
                                 .operands(2, f32, {2, 3, 4})  // y, grad_y
                                 .results(2, f32, {2, 3, 4})   // grad_tau, grad_target
                                 .result(f32, {2, 5})          // grad_h0
                                 .call(exphil_liquid_y_bwd);
    CHECK(o.code == XLA_FFI_Error_Code_INVALID_ARGUMENT);
    CHECK_THAT(o.message, StartsWith("exphil_liquid_y_bwd: liquid backward: ") &&
                              Contains("'grad_h0'"));
  }
  SECTION("linear_scan's backward without b: a, h0, y, grad_y; grad_b still a result") {
    const HandlerOutcome o = CallFrameBuilder(api)
                                 .operand(bf16, {2, 3, 4})      // a
                                 .operand(f32, {2, 4})          // h0
                                 .operands(2, bf16, {2, 3, 4})  // y, grad_y
                                 .results(2, bf16, {2, 3, 4})   // grad_a, grad_b
                                 .result(f32, {2, 4})           // grad_h0
                                 .call(exphil_linear_scan_y_bwd);
    // b is no argument of the call: the library reads the states from y.
    check_reached_library(o, "exphil_linear_scan_y_bwd", {"b", "grad_h_final"});
    const HandlerOutcome bad = CallFrameBuilder(api)
                                   .operand(f32, {2, 3, 4})      // a
                                   .operand(f32, {2, 4})         // h0
                                   .operand(f32, {2, 3, 5})      // y
                                   .operand(f32, {2, 3, 4})      // grad_y
                                   .results(2, f32, {2, 3, 4})   // grad_a, grad_b
                                   .result(f32, {2, 4})          // grad_h0
                                   .call(exphil_linear_scan_y_bwd);
    CHECK(bad.code == XLA_FFI_Error_Code_INVALID_ARGUMENT);
    CHECK_THAT(bad.message,
               StartsWith("exphil_linear_scan_y_bwd: linear_scan backward: argument 'y'"));
  }
  SECTION("diag_linear and elu_gru forwards: their inputs named as the library names them") {
    // (handler, target, the name of the second input)
    for (const auto& [handler, target, second] :
         {std::tuple{&exphil_diag_linear_y_fwd, "exphil_diag_linear_y_fwd", "b"},
          std::tuple{&exphil_elu_gru_y_fwd, "exphil_elu_gru_y_fwd", "candidate"}}) {
      const HandlerOutcome ok = CallFrameBuilder(api)
                                    .operands(2, bf16, {2, 3, 4})  // inputs
                                    .operand(f32, {2, 4})          // h0
                                    .result(bf16, {2, 3, 4})       // y
                                    .call(handler);
      check_reached_library(ok, target, {"h_final"});
      const HandlerOutcome bad = CallFrameBuilder(api)
                                     .operand(f32, {2, 3, 4})
                                     .operand(f32, {2, 3, 5})
                                     .operand(f32, {2, 4})
                                     .result(f32, {2, 3, 4})
                                     .call(handler);
      CHECK(bad.code == XLA_FFI_Error_Code_INVALID_ARGUMENT);
      CHECK_THAT(bad.message, StartsWith(std::string(target) + ": ") &&
                                  Contains(std::string("argument '") + second + "'"));
    }
  }
  SECTION("the activated ops' arguments are named as the library names them") {
    const HandlerOutcome o = CallFrameBuilder(api)
                                 .operand(f32, {2, 3, 4})      // z
                                 .operand(f32, {2, 3, 5})      // candidate
                                 .operand(f32, {2, 4})         // h0
                                 .operands(2, f32, {2, 3, 4})  // y, grad_y
                                 .results(2, f32, {2, 3, 4})   // grad_z, grad_candidate
                                 .result(f32, {2, 4})          // grad_h0
                                 .call(exphil_min_gru_activated_bwd);
    CHECK(o.code == XLA_FFI_Error_Code_INVALID_ARGUMENT);
    CHECK_THAT(o.message,
               StartsWith("exphil_min_gru_activated_bwd: min_gru_activated backward: argument "
                          "'candidate'"));
  }
  CHECK(fake_runtime().control->live_errors() == 0);
}

TEST_CASE("handlers: Edifice's selective-scan and attention targets", "[xla_ffi]") {
  const auto api = fake_runtime().api;
  const auto f32 = XLA_FFI_DataType_F32;
  const auto bf16 = XLA_FFI_DataType_BF16;

  // exphil_selective_scan_y_bwd with B = 1, T = 2, D = 4, N = 2; `grad_B_type`
  // for grad_B and grad_C.
  auto selective_scan_y_bwd = [&](XLA_FFI_DataType type, XLA_FFI_DataType grad_B_type,
                                  std::vector<int64_t> grad_C_shape = {1, 2, 2}) {
    CallFrameBuilder frame(api);
    frame.operands(2, type, {1, 2, 4})  // x, dt
        .operand(f32, {4, 2})           // A
        .operands(2, type, {1, 2, 2})   // B, C
        .operand(type, {1, 2, 4})       // grad_y
        .results(2, type, {1, 2, 4})    // grad_x, grad_dt
        .result(grad_B_type, {1, 2, 2})   // grad_B
        .result(grad_B_type, grad_C_shape);  // grad_C
    add_delta_attributes(frame);
    return frame.call(exphil_selective_scan_y_bwd);
  };
  // exphil_attention_o_fwd, BHTD [1, 2, 8, 32], with `flag` as given.
  auto attention_o_fwd = [&](XLA_FFI_DataType type, XLA_FFI_DataType flag_type,
                             std::vector<int64_t> flag_shape,
                             std::vector<int64_t> o_shape = {1, 2, 8, 32}) {
    CallFrameBuilder frame(api);
    frame.operands(3, type, {1, 2, 8, 32})  // q, k, v
        .operand(flag_type, flag_shape)     // flag
        .result(type, o_shape);             // o
    add_attention_attributes(frame);
    return frame.call(exphil_attention_o_fwd);
  };

  SECTION("selective scan forward: y only, input_scale reaching the library as given") {
    auto y_fwd = [&](XLA_FFI_DataType type, int32_t input_scale) {
      CallFrameBuilder frame(api);
      frame.operands(2, type, {1, 2, 4})  // x, dt
          .operand(f32, {4, 2})           // A
          .operands(2, type, {1, 2, 2})   // B, C
          .result(type, {1, 2, 4});       // y
      add_delta_attributes(frame);
      frame.attribute("input_scale", input_scale);
      return frame.call(exphil_selective_scan_y_fwd);
    };
    for (const int32_t scale : {0, 1})
      check_reached_library(y_fwd(bf16, scale), "exphil_selective_scan_y_fwd",
                            {"h_final", "dt_bias", "D", "z", "h0"});
    const HandlerOutcome bad = y_fwd(f32, 7);
    CHECK(bad.code == XLA_FFI_Error_Code_INVALID_ARGUMENT);
    CHECK_THAT(bad.message,
               StartsWith("exphil_selective_scan_y_fwd: selective_scan forward: argument "
                          "'options': expected input_scale delta (0) or channel_mean (1), got 7"));
  }
  SECTION("selective scan: no optional inputs, no grad_h_final, grad_A not asked for") {
    check_reached_library(selective_scan_y_bwd(f32, f32), "exphil_selective_scan_y_bwd",
                          {"grad_A", "grad_h_final", "dt_bias", "grad_D", "h0"});
    check_reached_library(selective_scan_y_bwd(bf16, bf16), "exphil_selective_scan_y_bwd",
                          {"grad_A"});
  }
  SECTION("selective scan: grad_B and grad_C in x's dtype (so Edifice's f32 ones: f32 x only)") {
    const HandlerOutcome o = selective_scan_y_bwd(bf16, f32);
    CHECK(o.code == XLA_FFI_Error_Code_INVALID_ARGUMENT);
    CHECK_THAT(o.message, StartsWith("exphil_selective_scan_y_bwd: selective_scan backward: ") &&
                              Contains("'grad_B'"));
  }
  SECTION("selective scan: the library checks the gradients' shapes") {
    const HandlerOutcome o = selective_scan_y_bwd(f32, f32, {1, 2, 3});
    CHECK(o.code == XLA_FFI_Error_Code_INVALID_ARGUMENT);
    CHECK_THAT(o.message, StartsWith("exphil_selective_scan_y_bwd: ") && Contains("'grad_C'"));
  }
  SECTION("attention: the flag operand is never read, of any type and shape") {
    for (const XLA_FFI_DataType flag_type :
         {f32, bf16, XLA_FFI_DataType_F64, XLA_FFI_DataType_S32, XLA_FFI_DataType_PRED}) {
      for (const std::vector<int64_t>& shape :
           {std::vector<int64_t>{1}, std::vector<int64_t>{0}, std::vector<int64_t>{3, 5}}) {
        INFO("flag type " << static_cast<int>(flag_type) << ", rank " << shape.size());
        check_reached_library(attention_o_fwd(f32, flag_type, shape), "exphil_attention_o_fwd",
                              {"flag", "lse"});
      }
    }
  }
  SECTION("attention: o only, lse never reaches the library") {
    const HandlerOutcome o = attention_o_fwd(bf16, f32, {1}, {1, 2, 8, 16});
    CHECK(o.code == XLA_FFI_Error_Code_INVALID_ARGUMENT);
    CHECK_THAT(o.message, StartsWith("exphil_attention_o_fwd: attention forward: ") &&
                              Contains("'o'") && !Contains("'lse'"));
  }
  SECTION("attention backward: no lse operand, the flag last and never read") {
    for (const XLA_FFI_DataType flag_type : {f32, XLA_FFI_DataType_F64, XLA_FFI_DataType_S32}) {
      CallFrameBuilder frame(api);
      frame.operands(5, bf16, {1, 2, 8, 32})  // q, k, v, o, grad_o
          .operand(flag_type, {2, 3})          // flag
          .results(3, bf16, {1, 2, 8, 32});    // grad_q, grad_k, grad_v
      add_attention_attributes(frame);
      check_reached_library(frame.call(exphil_attention_o_bwd), "exphil_attention_o_bwd",
                            {"flag", "lse"});
    }
  }
  SECTION("attention backward: the library checks o and the gradients, never lse") {
    CallFrameBuilder frame(api);
    frame.operands(3, f32, {1, 2, 8, 32})  // q, k, v
        .operand(f32, {1, 2, 8, 64})        // o
        .operand(f32, {1, 2, 8, 32})        // grad_o
        .operand(f32, {1})                  // flag
        .results(3, f32, {1, 2, 8, 32});    // grad_q, grad_k, grad_v
    add_attention_attributes(frame);
    const HandlerOutcome o = frame.call(exphil_attention_o_bwd);
    CHECK(o.code == XLA_FFI_Error_Code_INVALID_ARGUMENT);
    CHECK_THAT(o.message, StartsWith("exphil_attention_o_bwd: attention backward: ") &&
                              Contains("'o'") && !Contains("'lse'"));
  }
  SECTION("attention: q, k and v are still checked") {
    const HandlerOutcome o = attention_o_fwd(XLA_FFI_DataType_F64, f32, {1}, {1, 2, 8, 32});
    CHECK(o.code == XLA_FFI_Error_Code_INVALID_ARGUMENT);
    CHECK(o.message ==
          "exphil_attention_o_fwd: operand 'q': element type F64 is not supported; expected "
          "f32, bf16 or f16");
  }
  CHECK(fake_runtime().control->live_errors() == 0);
}

TEST_CASE("handlers: GRU and LSTM in the full and the y-only forms", "[xla_ffi]") {
  const auto api = fake_runtime().api;
  const auto f32 = XLA_FFI_DataType_F32;
  const auto bf16 = XLA_FFI_DataType_BF16;
  // B = 2, T = 3, H = 4: wx [2, 3, G*4], R [4, G*4], states [2, 4].
  const std::vector<int64_t> seq = {2, 3, 4}, state = {2, 4};
  const auto gates = [](int G) { return std::vector<int64_t>{2, 3, 4 * G}; };
  const auto weights = [](int G) { return std::vector<int64_t>{4, 4 * G}; };

  SECTION("full forms: every optional tensor present reaches the library by its name") {
    // exphil_gru_bwd: wx R y grad_y bias? h0? grad_h_final? ->
    // grad_wx grad_R grad_bias grad_h0 grad_rh; `bad` gets a shape one
    // longer in its last dimension, which the library refuses by name.
    auto gru_bwd = [&](const std::string& bad) {
      const Lengthened shape{bad};
      return CallFrameBuilder(api)
          .operand(f32, shape("wx", gates(3)))
          .operand(f32, shape("R", weights(3)))
          .operand(f32, shape("y", seq))
          .operand(f32, shape("grad_y", seq))
          .operand(f32, shape("bias", {12}))
          .operand(f32, shape("h0", state))
          .operand(f32, shape("grad_h_final", state))
          .result(f32, shape("grad_wx", gates(3)))
          .result(f32, shape("grad_R", weights(3)))
          .result(f32, shape("grad_bias", {12}))
          .result(f32, shape("grad_h0", state))
          .result(f32, shape("grad_rh", gates(3)))
          .call(exphil_gru_bwd);
    };
    check_reached_library(gru_bwd(""), "exphil_gru_bwd");
    // (wx and R fix the sizes, so each of the others is refused as itself;
    // grad_bias and grad_h0 are always written, so the library checks them.)
    check_each_named(gru_bwd,
                     {"y", "grad_y", "bias", "h0", "grad_h_final", "grad_wx", "grad_R",
                      "grad_bias", "grad_h0", "grad_rh"},
                     "exphil_gru_bwd: gru backward: ");

    const HandlerOutcome lstm = CallFrameBuilder(api)
                                    .operand(bf16, gates(4))    // wx
                                    .operand(f32, weights(4))   // R
                                    .operand(f32, {16})         // bias
                                    .operand(bf16, state)       // h0
                                    .operand(bf16, {2, 5})      // c0: the wrong width
                                    .result(bf16, seq)          // y
                                    .result(bf16, state)        // h_final
                                    .result(bf16, state)        // c_final
                                    .call(exphil_lstm_fwd);
    CHECK(lstm.code == XLA_FFI_Error_Code_INVALID_ARGUMENT);
    CHECK_THAT(lstm.message, StartsWith("exphil_lstm_fwd: lstm forward: argument 'c0'"));

    // precision, optional (left out above: exact), reaches the library:
    // 2 is refused there by name, as tf32 with a bf16 sequence is.
    const auto gru_fwd = [&](XLA_FFI_DataType dtype, int32_t precision) {
      return CallFrameBuilder(api)
          .operand(dtype, gates(3))    // wx
          .operand(f32, weights(3))    // R
          .operand(f32, {})            // bias: absent
          .operand(f32, {})            // h0: absent
          .result(dtype, seq)          // y
          .result(f32, state)          // h_final
          .attribute("has_bias", false)
          .attribute("has_h0", false)
          .attribute("precision", precision)
          .call(exphil_gru_fwd);
    };
    const HandlerOutcome two = gru_fwd(f32, 2);
    CHECK(two.code == XLA_FFI_Error_Code_INVALID_ARGUMENT);
    CHECK_THAT(two.message, StartsWith("exphil_gru_fwd: gru forward: argument 'options': expected "
                                       "precision 0 (exact) or 1 (tf32), got 2"));
    const HandlerOutcome bf16_tf32 = gru_fwd(bf16, 1);
    CHECK(bf16_tf32.code == XLA_FFI_Error_Code_INVALID_ARGUMENT);
    CHECK_THAT(bf16_tf32.message, Contains("argument 'options': precision 1 (tf32) applies to f32 sequences"));
    check_reached_library(gru_fwd(f32, 1), "exphil_gru_fwd");
  }
  SECTION("y-only forwards: no bias, no final states reach the library") {
    for (const XLA_FFI_DataType weight_type : {f32, bf16}) {
      for (const XLA_FFI_DataType state_type : {f32, bf16}) {
        INFO("R " << static_cast<int>(weight_type) << ", h0 " << static_cast<int>(state_type));
        const HandlerOutcome gru = CallFrameBuilder(api)
                                       .operand(bf16, gates(3))          // wx
                                       .operand(weight_type, weights(3))  // R
                                       .operand(state_type, state)       // h0
                                       .result(bf16, seq)                // y
                                       .call(exphil_gru_y_fwd);
        check_reached_library(gru, "exphil_gru_y_fwd", {"bias", "h_final"});
        const HandlerOutcome lstm = CallFrameBuilder(api)
                                        .operand(bf16, gates(4))          // wx
                                        .operand(weight_type, weights(4))  // R
                                        .operands(2, state_type, state)   // h0, c0
                                        .result(bf16, seq)                // y
                                        .call(exphil_lstm_y_fwd);
        check_reached_library(lstm, "exphil_lstm_y_fwd", {"bias", "h_final", "c_final"});
      }
    }
  }
  SECTION("y-only backwards: Edifice's gradients only, none of the final states") {
    const HandlerOutcome gru = CallFrameBuilder(api)
                                   .operand(bf16, gates(3))    // wx
                                   .operand(f32, weights(3))   // R
                                   .operand(bf16, state)       // h0
                                   .operands(2, bf16, seq)     // y, grad_y
                                   .results(2, bf16, gates(3))  // grad_wx, grad_rh
                                   .result(bf16, state)        // grad_h0
                                   .call(exphil_gru_y_bwd);
    check_reached_library(gru, "exphil_gru_y_bwd",
                          {"bias", "grad_h_final", "grad_R", "grad_bias"});
    const HandlerOutcome lstm = CallFrameBuilder(api)
                                    .operand(bf16, gates(4))   // wx
                                    .operand(bf16, weights(4))  // R
                                    .operands(2, f32, state)   // h0, c0
                                    .operands(2, bf16, seq)    // y, grad_y
                                    .result(bf16, gates(4))    // grad_wx
                                    .results(2, f32, state)    // grad_h0, grad_c0
                                    .call(exphil_lstm_y_bwd);
    check_reached_library(lstm, "exphil_lstm_y_bwd",
                          {"bias", "grad_h_final", "grad_c_final", "grad_R", "grad_bias",
                           "grad_rh"});
  }
  SECTION("y-only: each tensor bound by its name (a wrong shape is named by the library)") {
    // exphil_lstm_y_bwd: wx R h0 c0 y grad_y -> grad_wx grad_h0 grad_c0.
    const auto lstm_y_bwd = [&](const std::string& bad) {
      const Lengthened shape{bad};
      return CallFrameBuilder(api)
          .operand(f32, gates(4))
          .operand(f32, weights(4))
          .operand(f32, shape("h0", state))
          .operand(f32, shape("c0", state))
          .operand(f32, shape("y", seq))
          .operand(f32, shape("grad_y", seq))
          .result(f32, shape("grad_wx", gates(4)))
          .result(f32, shape("grad_h0", state))
          .result(f32, shape("grad_c0", state))
          .call(exphil_lstm_y_bwd);
    };
    check_each_named(lstm_y_bwd, {"h0", "c0", "y", "grad_y", "grad_wx", "grad_h0", "grad_c0"},
                     "exphil_lstm_y_bwd: lstm backward: ");
    // exphil_gru_y_bwd's grad_rh, third of Edifice's results.
    const HandlerOutcome o = CallFrameBuilder(api)
                                 .operand(f32, gates(3))
                                 .operand(f32, weights(3))
                                 .operand(f32, state)
                                 .operands(2, f32, seq)
                                 .result(f32, gates(3))     // grad_wx
                                 .result(f32, {2, 3, 11})   // grad_rh
                                 .result(f32, state)        // grad_h0
                                 .call(exphil_gru_y_bwd);
    CHECK(o.code == XLA_FFI_Error_Code_INVALID_ARGUMENT);
    CHECK_THAT(o.message, StartsWith("exphil_gru_y_bwd: gru backward: argument 'grad_rh'"));
  }
  SECTION("y-only: the states share one dtype, h0's, which grad_h0 must have") {
    const HandlerOutcome o = CallFrameBuilder(api)
                                 .operand(bf16, gates(3))    // wx
                                 .operand(bf16, weights(3))  // R
                                 .operand(f32, state)        // h0
                                 .operands(2, bf16, seq)     // y, grad_y
                                 .results(2, bf16, gates(3))  // grad_wx, grad_rh
                                 .result(bf16, state)        // grad_h0
                                 .call(exphil_gru_y_bwd);
    CHECK(o.code == XLA_FFI_Error_Code_INVALID_ARGUMENT);
    CHECK_THAT(o.message, StartsWith("exphil_gru_y_bwd: gru backward: argument 'grad_h0': "
                                     "expected dtype f32 (the dtype of 'h0'), got bf16"));
  }
  SECTION("y-only: h0 and c0 are required, has_h0 is no attribute of theirs") {
    const HandlerOutcome empty = CallFrameBuilder(api)
                                     .operand(f32, gates(4))
                                     .operand(f32, weights(4))
                                     .operand(f32, state)  // h0
                                     .operand(f32, {0})    // c0
                                     .result(f32, seq)
                                     .call(exphil_lstm_y_fwd);
    CHECK(empty.code == XLA_FFI_Error_Code_INVALID_ARGUMENT);
    CHECK_THAT(empty.message, StartsWith("exphil_lstm_y_fwd: operand 'c0': has zero elements"));
    const HandlerOutcome flag = CallFrameBuilder(api)
                                    .operand(f32, gates(3))
                                    .operand(f32, weights(3))
                                    .operand(f32, state)
                                    .result(f32, seq)
                                    .attribute("has_h0", true)
                                    .call(exphil_gru_y_fwd);
    CHECK(flag.code == XLA_FFI_Error_Code_INVALID_ARGUMENT);
    CHECK_THAT(flag.message, StartsWith("exphil_gru_y_fwd: attribute 'has_h0': unknown; "));
  }
  CHECK(fake_runtime().control->live_errors() == 0);
}

TEST_CASE("handlers: the sLSTM in the full and the y-only forms", "[xla_ffi]") {
  const auto api = fake_runtime().api;
  const auto f32 = XLA_FFI_DataType_F32;
  const auto bf16 = XLA_FFI_DataType_BF16;
  // B = 2, T = 3, H = 4: wx [2, 3, 16], R [4, 16], states [2, 4].
  const std::vector<int64_t> seq = {2, 3, 4}, state = {2, 4}, gates = {2, 3, 16},
                             weights = {4, 16};

  SECTION("full forward: every optional tensor present reaches the library by its name") {
    // exphil_slstm_fwd: wx R bias? h0? c0? n0? m0? ->
    // y h_final c_final n_final m_final; `bad` one longer in its last
    // dimension.
    auto fwd = [&](const std::string& bad) {
      const Lengthened shape{bad};
      CallFrameBuilder frame(api);
      frame.operand(bf16, gates).operand(f32, weights).operand(f32, shape("bias", {16}));
      for (const char* name : {"h0", "c0", "n0", "m0"}) frame.operand(f32, shape(name, state));
      frame.result(bf16, shape("y", seq));
      for (const char* name : {"h_final", "c_final", "n_final", "m_final"})
        frame.result(f32, shape(name, state));
      return frame.call(exphil_slstm_fwd);
    };
    check_reached_library(fwd(""), "exphil_slstm_fwd");
    check_each_named(fwd,
                     {"bias", "h0", "c0", "n0", "m0", "y", "h_final", "c_final", "n_final",
                      "m_final"},
                     "exphil_slstm_fwd: slstm forward: ");
  }
  SECTION("full backward: every optional tensor present reaches the library by its name") {
    // exphil_slstm_bwd: wx R y grad_y bias? h0? c0? n0? m0? grad_h_final?
    // grad_c_final? grad_n_final? grad_m_final? -> grad_wx grad_R grad_bias
    // grad_h0 grad_c0 grad_n0 grad_m0 grad_rh.
    auto bwd = [&](const std::string& bad) {
      const Lengthened shape{bad};
      CallFrameBuilder frame(api);
      frame.operand(f32, gates)
          .operand(f32, weights)
          .operand(f32, shape("y", seq))
          .operand(f32, shape("grad_y", seq))
          .operand(f32, shape("bias", {16}));
      for (const char* name : {"h0", "c0", "n0", "m0", "grad_h_final", "grad_c_final",
                               "grad_n_final", "grad_m_final"})
        frame.operand(f32, shape(name, state));
      frame.result(f32, shape("grad_wx", gates))
          .result(f32, shape("grad_R", weights))
          .result(f32, shape("grad_bias", {16}));
      for (const char* name : {"grad_h0", "grad_c0", "grad_n0", "grad_m0"})
        frame.result(f32, shape(name, state));
      frame.result(f32, shape("grad_rh", gates));
      return frame.call(exphil_slstm_bwd);
    };
    check_reached_library(bwd(""), "exphil_slstm_bwd");
    check_each_named(bwd,
                     {"y", "grad_y", "bias", "h0", "c0", "n0", "m0", "grad_h_final",
                      "grad_c_final", "grad_n_final", "grad_m_final", "grad_wx", "grad_R",
                      "grad_bias", "grad_h0", "grad_c0", "grad_n0", "grad_m0", "grad_rh"},
                     "exphil_slstm_bwd: slstm backward: ");
  }
  SECTION("full forms: the optional operands absent (has_* false)") {
    const HandlerOutcome fwd = CallFrameBuilder(api)
                                   .operand(f32, gates)
                                   .operand(f32, weights)
                                   .operands(5, f32, {})  // bias, h0, c0, n0, m0
                                   .result(f32, seq)
                                   .results(4, f32, state)
                                   .attribute("has_bias", false)
                                   .attribute("has_h0", false)
                                   .attribute("has_c0", false)
                                   .attribute("has_n0", false)
                                   .attribute("has_m0", false)
                                   .call(exphil_slstm_fwd);
    check_reached_library(fwd, "exphil_slstm_fwd", {"bias", "h0", "c0", "n0", "m0"});
  }
  SECTION("y-only forward: wx R h0 c0 -> y; no bias, n0, m0 or final states") {
    for (const XLA_FFI_DataType weight_type : {f32, bf16}) {
      for (const XLA_FFI_DataType state_type : {f32, bf16}) {
        INFO("R " << static_cast<int>(weight_type) << ", h0 " << static_cast<int>(state_type));
        const HandlerOutcome o = CallFrameBuilder(api)
                                     .operand(bf16, gates)           // wx
                                     .operand(weight_type, weights)  // R
                                     .operands(2, state_type, state)  // h0, c0
                                     .result(bf16, seq)               // y
                                     .call(exphil_slstm_y_fwd);
        check_reached_library(o, "exphil_slstm_y_fwd",
                              {"bias", "n0", "m0", "h_final", "c_final", "n_final", "m_final"});
      }
    }
    const auto y_fwd = [&](const std::string& bad) {
      const Lengthened shape{bad};
      return CallFrameBuilder(api)
          .operand(f32, gates)
          .operand(f32, weights)
          .operand(f32, shape("h0", state))
          .operand(f32, shape("c0", state))
          .result(f32, shape("y", seq))
          .call(exphil_slstm_y_fwd);
    };
    check_each_named(y_fwd, {"h0", "c0", "y"}, "exphil_slstm_y_fwd: slstm forward: ");
  }
  SECTION("y-only forward: h0 and c0 are required, has_* are no attributes of its") {
    const HandlerOutcome empty = CallFrameBuilder(api)
                                     .operand(f32, gates)
                                     .operand(f32, weights)
                                     .operand(f32, {0})    // h0
                                     .operand(f32, state)  // c0
                                     .result(f32, seq)
                                     .call(exphil_slstm_y_fwd);
    CHECK(empty.code == XLA_FFI_Error_Code_INVALID_ARGUMENT);
    CHECK_THAT(empty.message, StartsWith("exphil_slstm_y_fwd: operand 'h0': has zero elements"));
    const HandlerOutcome flag = CallFrameBuilder(api)
                                    .operand(f32, gates)
                                    .operand(f32, weights)
                                    .operands(2, f32, state)
                                    .result(f32, seq)
                                    .attribute("has_n0", false)
                                    .call(exphil_slstm_y_fwd);
    CHECK(flag.code == XLA_FFI_Error_Code_INVALID_ARGUMENT);
    CHECK_THAT(flag.message, StartsWith("exphil_slstm_y_fwd: attribute 'has_n0': unknown; "));
  }
  CHECK(fake_runtime().control->live_errors() == 0);
}
