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
#include <sstream>
#include <string>
#include <vector>

#include "exphil/attention.hpp"
#include "exphil/op_descriptions.h"
#include "exphil/scan.hpp"
#include "exphil/selective_scan.hpp"

using exphil::DType;
using exphil::Status;
using exphil::StatusCode;
using exphil::Tensor;

namespace {

struct Row {
  std::string op, direction, tensors, options, bindings;
};

#define EXPHIL_OP_ROW(op, direction, tensors, options, bindings) \
  Row{#op, #direction, tensors, options, bindings},
const std::vector<Row> kRows = {EXPHIL_OP_DESCRIPTIONS(EXPHIL_OP_ROW)};
#undef EXPHIL_OP_ROW

std::vector<std::string> split(const std::string& text, char separator) {
  std::vector<std::string> parts;
  std::string part;
  std::istringstream in(text);
  while (std::getline(in, part, separator))
    if (!part.empty()) parts.push_back(part);
  return parts;
}

// One tensor word of a row.
struct Slot {
  std::string name;
  bool optional = false;
  bool output = false;
  std::string dtype;  // seq, state or f32
  std::vector<std::string> dims;
  std::string only_with;  // the optional input this optional output needs
};

std::vector<Slot> slots_of(const Row& row) {
  std::vector<Slot> slots;
  for (const std::string& word : split(row.tensors, ' ')) {
    const std::vector<std::string> f = split(word, ':');
    REQUIRE((f.size() == 4 || f.size() == 5));
    Slot s;
    s.optional = f[0].back() == '?';
    s.name = s.optional ? f[0].substr(0, f[0].size() - 1) : f[0];
    REQUIRE((f[1] == "in" || f[1] == "out"));
    s.output = f[1] == "out";
    REQUIRE((f[2] == "seq" || f[2] == "state" || f[2] == "f32"));
    s.dtype = f[2];
    s.dims = split(f[3], ',');
    if (f.size() == 5) {
      s.only_with = f[4];
      REQUIRE((s.optional && s.output));
    }
    slots.push_back(s);
  }
  return slots;
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
      t.dtype = static_cast<int32_t>(s.dtype == "seq" ? seq : DType::f32);
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

TEST_CASE("every op direction is described, once", "[op_descriptions]") {
  std::map<std::string, int> seen;
  for (const Row& row : kRows) ++seen[row.op + " " + row.direction];
  for (exphil::ScanOp op : exphil::kAllScanOps)
    for (const char* d : {"forward", "backward"}) CHECK(seen[std::string(exphil::scan_op_name(op)) + " " + d] == 1);
  for (const char* op : {"selective_scan", "attention"})
    for (const char* d : {"forward", "backward"}) CHECK(seen[std::string(op) + " " + d] == 1);
  CHECK(kRows.size() == seen.size());
}

TEST_CASE("every description matches the C++ API's checks", "[op_descriptions]") {
  for (const Row& row : kRows) {
    const std::vector<Slot> slots = slots_of(row);
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
        const bool sets_dtype = s.dtype == "seq" && [&] {
          for (std::size_t j = 0; j < i; ++j)
            if (slots[j].dtype == "seq") return false;
          return true;
        }();
        if (!sets_dtype) {
          Call retyped(row, slots, seq);
          const DType wrong = s.dtype == "seq" ? (seq == DType::f32 ? DType::f16 : DType::f32)
                              : s.dtype == "f32" ? DType::bf16
                                                 : DType::f16;  // state: neither f32 nor seq
          retyped[s.name].dtype = static_cast<int32_t>(wrong);
          const Status refused = retyped.check();
          CHECK(refused.code() == StatusCode::invalid_argument);
          CHECK_THAT(refused.message(), Catch::Matchers::Contains(named(s.name)));
        }
        // A state tensor may also have the seq dtype.
        if (s.dtype == "state") {
          Call as_seq(row, slots, seq);
          as_seq[s.name].dtype = static_cast<int32_t>(seq);
          CHECK(as_seq.check().ok());
        }
      }
    }
  }
}
