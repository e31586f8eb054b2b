// include/exphil/op_descriptions.h against the C++ API's own checks: for
// every op direction, a call built from its row alone (fake device
// addresses, every dimension named there given an extent) must pass
// exphil::can_implement, and each departure from the row must fail naming
// the tensor: a required tensor left out, an extent changed, a dtype its
// rule refuses. An optional tensor left out must pass, a dtype its rule
// allows too. So a row that misdescribes its op, or a validation that
// drifts from the row, fails here. Runs without a GPU.
#include <catch2/catch.hpp>

#include <cstdint>
#include <map>
#include <regex>
#include <sstream>
#include <string>
#include <vector>

#include "exphil/attention.hpp"
#include "exphil/op_descriptions.h"
#include "exphil/op_descriptions.hpp"
#include "exphil/scan.hpp"
#include "exphil/selective_scan.hpp"

using exphil::DType;
using exphil::Status;
using exphil::StatusCode;
using exphil::Tensor;

namespace {

// The raw rows, for the grammar; the checks below take the library's parse
// (exphil/op_descriptions.hpp), which the NIF uses too.
struct RawRow {
  const char *op, *direction, *tensors, *options, *bindings;
};
#define EXPHIL_OP_ROW(op, direction, tensors, options, bindings) \
  RawRow{#op, #direction, tensors, options, bindings},
const std::vector<RawRow> kRawRows = {EXPHIL_OP_DESCRIPTIONS(EXPHIL_OP_ROW)};
#undef EXPHIL_OP_ROW

using Row = exphil::OpDescription;
using Slot = exphil::TensorDescription;
using Rule = exphil::TensorDescription::DTypeRule;

std::vector<std::string> words(const std::string& text) {
  std::vector<std::string> parts;
  std::istringstream in(text);
  for (std::string w; in >> w;) parts.push_back(w);
  return parts;
}

// Extents for the dimensions rows name: distinct where they may differ,
// and what the kernels take (head width 32, Hq a multiple of Hkv).
const std::map<std::string, int64_t> kExtents = {
    {"B", 2}, {"T", 5}, {"H", 4}, {"D", 3}, {"N", 4}, {"Hq", 2}, {"Hkv", 1}, {"S", 6}, {"d", 32}};

// The tensors of one call, by name, and the call through can_implement.
class Call {
 public:
  Call(const Row& row, const std::vector<Slot>& slots, DType seq) : row_(row) {
    uintptr_t next = uintptr_t{1} << 32;
    for (const Slot& s : slots) {
      std::vector<int64_t> shape;
      for (const std::string& d : s.dims) {
        REQUIRE(kExtents.count(d) == 1);
        shape.push_back(kExtents.at(d));
      }
      Tensor t{};
      t.data = reinterpret_cast<void*>(next);
      next += uintptr_t{1} << 20;
      t.dtype = static_cast<int32_t>(s.dtype == Rule::seq ? seq : DType::f32);
      t.rank = static_cast<int32_t>(shape.size());
      for (std::size_t i = 0; i < shape.size(); ++i) t.shape[i] = shape[i];
      tensors_[s.name] = t;
      present_[s.name] = true;
    }
  }

  Tensor& operator[](const std::string& name) { return tensors_.at(name); }
  void leave_out(const std::string& name) { present_.at(name) = false; }

  Status check() {
    if (row_.op == "selective_scan") return selective_scan();
    if (row_.op == "attention") return attention();
    return scan();
  }

  // Names the call's binding did not take: a row's tensor the args have no
  // field for.
  std::vector<std::string> unbound;

 private:
  const Tensor* get(const std::string& name) {
    taken_.push_back(name);
    auto it = tensors_.find(name);
    return it != tensors_.end() && present_.at(name) ? &it->second : nullptr;
  }

  void note_unbound() {
    for (const auto& [name, t] : tensors_) {
      bool taken = false;
      for (const std::string& n : taken_) taken = taken || n == name;
      if (!taken) unbound.push_back(name);
    }
  }

  Status scan() {
    exphil::ScanOp op{};
    bool found = false;
    for (exphil::ScanOp o : exphil::kAllScanOps)
      if (row_.op == exphil::scan_op_name(o)) op = o, found = true;
    REQUIRE(found);
    const int n = exphil::scan_input_count(op);
    Status s;
    if (row_.direction == "forward") {
      exphil::ScanForwardArgs a;
      a.op = op;
      for (int i = 0; i < n; ++i) a.inputs[i] = get(exphil::scan_input_name(op, i));
      a.h0 = get("h0");
      a.y = get("y");
      a.h_final = get("h_final");
      s = exphil::can_implement(a);
    } else {
      exphil::ScanBackwardArgs a;
      a.op = op;
      for (int i = 0; i < n; ++i) {
        a.inputs[i] = get(exphil::scan_input_name(op, i));
        a.grad_inputs[i] = get(exphil::scan_grad_input_name(op, i));
      }
      a.h0 = get("h0");
      a.y = get("y");
      a.grad_y = get("grad_y");
      a.grad_h_final = get("grad_h_final");
      a.grad_h0 = get("grad_h0");
      s = exphil::can_implement(a);
    }
    note_unbound();
    return s;
  }

  exphil::SelectiveScanInputs selective_inputs() {
    exphil::SelectiveScanInputs in;
    in.x = get("x");
    in.dt = get("dt");
    in.A = get("A");
    in.B = get("B");
    in.C = get("C");
    in.dt_bias = get("dt_bias");
    in.D = get("D");
    in.z = get("z");
    in.h0 = get("h0");
    return in;
  }

  Status selective_scan() {
    Status s;
    if (row_.direction == "forward") {
      exphil::SelectiveScanForwardArgs a;
      a.in = selective_inputs();
      a.y = get("y");
      a.h_final = get("h_final");
      s = exphil::can_implement(a);
    } else {
      exphil::SelectiveScanBackwardArgs a;
      a.in = selective_inputs();
      a.grad_y = get("grad_y");
      a.grad_h_final = get("grad_h_final");
      a.grad_x = get("grad_x");
      a.grad_dt = get("grad_dt");
      a.grad_A = get("grad_A");
      a.grad_B = get("grad_B");
      a.grad_C = get("grad_C");
      a.grad_dt_bias = get("grad_dt_bias");
      a.grad_D = get("grad_D");
      a.grad_z = get("grad_z");
      a.grad_h0 = get("grad_h0");
      s = exphil::can_implement(a);
    }
    note_unbound();
    return s;
  }

  Status attention() {
    exphil::AttentionInputs in;
    in.q = get("q");
    in.k = get("k");
    in.v = get("v");
    Status s;
    if (row_.direction == "forward") {
      exphil::AttentionForwardArgs a;
      a.in = in;
      a.o = get("o");
      a.lse = get("lse");
      s = exphil::can_implement(a);
    } else {
      exphil::AttentionBackwardArgs a;
      a.in = in;
      a.o = get("o");
      a.lse = get("lse");
      a.grad_o = get("grad_o");
      a.grad_q = get("grad_q");
      a.grad_k = get("grad_k");
      a.grad_v = get("grad_v");
      s = exphil::can_implement(a);
    }
    note_unbound();
    return s;
  }

  Row row_;
  std::map<std::string, Tensor> tensors_;
  std::map<std::string, bool> present_;
  std::vector<std::string> taken_;
};

std::string named(const std::string& name) { return "argument '" + name + "'"; }

// The dimensions a slot is the first to name, in row order.
bool sets_a_dimension(const std::vector<Slot>& slots, std::size_t index) {
  for (const std::string& d : slots[index].dims) {
    bool earlier = false;
    for (std::size_t j = 0; j < index; ++j)
      for (const std::string& e : slots[j].dims) earlier = earlier || e == d;
    if (!earlier) return true;
  }
  return false;
}

}  // namespace

TEST_CASE("every row keeps the grammar, and the library's parse takes all of it", "[op_descriptions]") {
  const std::regex tensor(R"(\w+\??:(in|out):(seq|state|f32):\w+(,\w+)*(:\w+)?)");
  const std::regex option(R"(\w+:(bool|i32|f32|enum\(\w+(\|\w+)*\))=\w+)");
  const std::regex binding("cpp|c|nif|xla");
  REQUIRE(kRawRows.size() == exphil::op_descriptions().size());
  for (std::size_t r = 0; r < kRawRows.size(); ++r) {
    const RawRow& raw = kRawRows[r];
    const Row& parsed = exphil::op_descriptions()[r];
    INFO(raw.op << " " << raw.direction);
    CHECK(parsed.op == raw.op);
    CHECK((parsed.direction == "forward" || parsed.direction == "backward"));
    for (const std::string& w : words(raw.tensors)) CHECK(std::regex_match(w, tensor));
    for (const std::string& w : words(raw.options)) CHECK(std::regex_match(w, option));
    for (const std::string& w : words(raw.bindings)) CHECK(std::regex_match(w, binding));
    CHECK(parsed.tensors.size() == words(raw.tensors).size());
    CHECK(parsed.options.size() == words(raw.options).size());
    CHECK(parsed.bindings.size() == words(raw.bindings).size());
    for (const Slot& t : parsed.tensors)
      if (!t.only_with.empty()) CHECK((t.optional && t.output));
  }
}

TEST_CASE("every op direction is described, once", "[op_descriptions]") {
  std::map<std::string, int> seen;
  for (const Row& row : exphil::op_descriptions()) ++seen[row.op + " " + row.direction];
  for (exphil::ScanOp op : exphil::kAllScanOps)
    for (const char* d : {"forward", "backward"}) CHECK(seen[std::string(exphil::scan_op_name(op)) + " " + d] == 1);
  for (const char* op : {"selective_scan", "attention"})
    for (const char* d : {"forward", "backward"}) CHECK(seen[std::string(op) + " " + d] == 1);
  CHECK(exphil::op_descriptions().size() == seen.size());
  CHECK(exphil::op_descriptions().size() == kRawRows.size());
}

TEST_CASE("every description matches the C++ API's checks", "[op_descriptions]") {
  for (const Row& row : exphil::op_descriptions()) {
    const std::vector<Slot>& slots = row.tensors;
    for (DType seq : {DType::f32, DType::bf16}) {
      INFO(row.op << " " << row.direction << ", seq tensors " << exphil::dtype_name(seq));

      Call call(row, slots, seq);
      const Status whole = call.check();
      INFO("as described: " << whole.message());
      CHECK(whole.ok());
      CHECK(call.unbound.empty());

      for (std::size_t i = 0; i < slots.size(); ++i) {
        const Slot& s = slots[i];
        INFO("tensor " << s.name);

        // Left out, with the outputs that need it (they alone would be
        // refused, naming them).
        Call without(row, slots, seq);
        without.leave_out(s.name);
        for (const Slot& o : slots)
          if (o.only_with == s.name) {
            Call orphan(row, slots, seq);
            orphan.leave_out(s.name);
            const Status refused = orphan.check();
            CHECK(refused.code() == StatusCode::invalid_argument);
            CHECK_THAT(refused.message(), Catch::Matchers::Contains(named(o.name)));
            without.leave_out(o.name);
          }
        const Status left_out = without.check();
        if (s.optional) {
          CHECK(left_out.ok());
        } else {
          CHECK(left_out.code() == StatusCode::invalid_argument);
          CHECK_THAT(left_out.message(), Catch::Matchers::Contains(named(s.name)));
        }

        // The first extent one larger (the last may be one the kernels
        // limit, refused as not supported): the tensor that sets a
        // dimension moves it for the rest, so another may be the one named.
        Call wider(row, slots, seq);
        Tensor& t = wider[s.name];
        ++t.shape[0];
        const Status widened = wider.check();
        CHECK(widened.code() == StatusCode::invalid_argument);
        if (!sets_a_dimension(slots, i))
          CHECK_THAT(widened.message(), Catch::Matchers::Contains(named(s.name)));

        // A dtype the rule refuses: for seq, another float than the first
        // seq tensor's (that one sets it); for f32, bf16; for state, f16
        // when the seq tensors are f32.
        const bool sets_dtype = s.dtype == Rule::seq && [&] {
          for (std::size_t j = 0; j < i; ++j)
            if (slots[j].dtype == Rule::seq) return false;
          return true;
        }();
        if (!sets_dtype) {
          Call retyped(row, slots, seq);
          const DType wrong = s.dtype == Rule::seq ? (seq == DType::f32 ? DType::f16 : DType::f32)
                              : s.dtype == Rule::f32 ? DType::bf16
                                                 : DType::f16;  // state: neither f32 nor seq
          retyped[s.name].dtype = static_cast<int32_t>(wrong);
          const Status refused = retyped.check();
          CHECK(refused.code() == StatusCode::invalid_argument);
          CHECK_THAT(refused.message(), Catch::Matchers::Contains(named(s.name)));
        }
        // A state tensor may also have the seq dtype.
        if (s.dtype == Rule::state) {
          Call as_seq(row, slots, seq);
          as_seq[s.name].dtype = static_cast<int32_t>(seq);
          CHECK(as_seq.check().ok());
        }
      }
    }
  }
}
