// include/exphil/op_descriptions.h against the C++ API's own checks: for
// every op direction, a call built from its row alone (fake device
// addresses, every dimension named there given an extent) must pass
// exphil::can_implement, and each departure from the row must fail naming
// the tensor: a required tensor left out, an extent changed, a dtype its
// rule refuses. An optional tensor left out must pass, a dtype its rule
// allows too. The call's tensors reach its args by their names
// (exphil::tensor_slot, as the NIF binds them), so every name must have its
// member. So a row that misdescribes its op, or a validation or binding
// that drifts from the row, fails here. Runs without a GPU.
#include <catch2/catch.hpp>

#include <cstdint>
#include <limits>
#include <map>
#include <regex>
#include <sstream>
#include <string>
#include <vector>

#include "exphil/attention.hpp"
#include "exphil/gated_rnn.hpp"
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
    {"B", 2}, {"T", 5}, {"H", 4}, {"D", 3}, {"N", 4}, {"Hq", 2}, {"Hkv", 1}, {"S", 6}, {"d", 32},
    {"3H", 12}, {"4H", 16}, {"L", 3}, {"K", 2}};

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

  // An option by its row's name: a number, the enumerator's index for an
  // enum, 0 or 1 for a bool. Layout bthd swaps the middle dimensions of the
  // 4-D tensors, which the row gives as bhtd.
  void set_option(const std::string& name, double value) {
    bool described = false;
    for (const exphil::OptionDescription& o : row_.options) described = described || o.name == name;
    REQUIRE(described);
    options_[name] = value;
    if (name == "layout" && value == 1)
      for (auto& [n, t] : tensors_)
        if (t.rank == 4) std::swap(t.shape[1], t.shape[2]);
  }

  Status check() {
    if (row_.op == "selective_scan") return selective_scan();
    if (row_.op == "attention") return attention();
    if (row_.op == "gru" || row_.op == "lstm" || row_.op == "slstm") return gated_rnn();
    if (row_.op == "gru_stack" || row_.op == "lstm_stack") return gated_rnn_stack();
    return scan();
  }

  // The row's tensors the op's args have no member for (exphil::tensor_slot).
  std::vector<std::string> unbound;

 private:
  // The call through can_implement, its tensors bound by their names.
  template <class Args>
  Status bound(Args a) {
    unbound.clear();
    for (auto& [name, t] : tensors_) {
      const Tensor** slot = exphil::tensor_slot(a, name);
      if (!slot) {
        unbound.push_back(name);
        continue;
      }
      *slot = present_.at(name) ? &t : nullptr;
    }
    return exphil::can_implement(a);
  }

  // The row's direction: its forward args or its backward args, each made
  // ready by `setup` (the op, the cell, the options), then bound.
  template <class Forward, class Backward, class Setup>
  Status by_direction(Setup setup) {
    if (row_.direction == "forward") {
      Forward a;
      setup(a);
      return bound(a);
    }
    Backward a;
    setup(a);
    return bound(a);
  }

  Status scan() {
    exphil::ScanOp op{};
    bool found = false;
    for (exphil::ScanOp o : exphil::kAllScanOps)
      if (row_.op == exphil::scan_op_name(o)) op = o, found = true;
    REQUIRE(found);
    return by_direction<exphil::ScanForwardArgs, exphil::ScanBackwardArgs>([&](auto& a) { a.op = op; });
  }

  Status selective_scan() {
    return by_direction<exphil::SelectiveScanForwardArgs, exphil::SelectiveScanBackwardArgs>(
        [&](auto& a) { apply(a.options); });
  }

  Status gated_rnn() {
    const exphil::GatedRnnCell cell = row_.op == "gru"    ? exphil::GatedRnnCell::gru
                                      : row_.op == "lstm" ? exphil::GatedRnnCell::lstm
                                                          : exphil::GatedRnnCell::slstm;
    REQUIRE(row_.op == exphil::gated_rnn_cell_name(cell));
    return by_direction<exphil::GatedRnnForwardArgs, exphil::GatedRnnBackwardArgs>([&](auto& a) {
      a.cell = cell;
      apply(a.options);
    });
  }

  Status gated_rnn_stack() {
    const exphil::GatedRnnCell cell = row_.op == "gru_stack" ? exphil::GatedRnnCell::gru : exphil::GatedRnnCell::lstm;
    REQUIRE(row_.op == std::string(exphil::gated_rnn_cell_name(cell)) + "_stack");
    return by_direction<exphil::GatedRnnStackForwardArgs, exphil::GatedRnnStackBackwardArgs>([&](auto& a) {
      a.cell = cell;
      apply(a.options);
    });
  }

  Status attention() {
    return by_direction<exphil::AttentionForwardArgs, exphil::AttentionBackwardArgs>(
        [&](auto& a) { apply(a.options); });
  }

  // The options set, on the args' option structs; a name the op's args have
  // no field for fails the test.
  void apply(exphil::SelectiveScanOptions& o);
  void apply(exphil::AttentionOptions& o);
  void apply(exphil::GatedRnnOptions& o);

  Row row_;
  std::map<std::string, double> options_;
  std::map<std::string, Tensor> tensors_;
  std::map<std::string, bool> present_;
};

void Call::apply(exphil::SelectiveScanOptions& o) {
  for (const auto& [name, v] : options_) {
    if (name == "softplus") o.softplus = v != 0;
    else if (name == "clamp") o.clamp = v != 0;
    else if (name == "dt_min") o.dt_min = static_cast<float>(v);
    else if (name == "dt_max") o.dt_max = static_cast<float>(v);
    else if (name == "input_scale") o.input_scale = static_cast<exphil::SelectiveScanInputScale>(v);
    else FAIL("SelectiveScanOptions has no field for option " << name);
  }
}

void Call::apply(exphil::AttentionOptions& o) {
  for (const auto& [name, v] : options_) {
    if (name == "mask") o.mask = static_cast<exphil::AttentionMask>(v);
    else if (name == "window") o.window = static_cast<int>(v);
    else if (name == "layout") o.layout = static_cast<exphil::AttentionLayout>(v);
    else if (name == "scale") o.scale = static_cast<float>(v);
    else if (name == "precision") o.precision = static_cast<exphil::AttentionPrecision>(v);
    else FAIL("AttentionOptions has no field for option " << name);
  }
}

void Call::apply(exphil::GatedRnnOptions& o) {
  for (const auto& [name, v] : options_) {
    if (name == "precision") o.precision = static_cast<exphil::GatedRnnPrecision>(v);
    else FAIL("GatedRnnOptions has no field for option " << name);
  }
}

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
  const std::regex tensor(R"(\w+\??:(in|out):(seq|state|weight|carry|f32):\w+(,\w+)*(:\w+)?)");
  const std::regex option(
      R"(\w+:(bool|i32|f32|enum\(\w+(\|\w+)*\))=\w+(:(finite|-?\d+\.\.-?\d+))?(:if\(\w+(=\w+)?\))?)");
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
  for (const char* op : {"selective_scan", "attention", "gru", "lstm", "slstm", "gru_stack", "lstm_stack"})
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
                                                 : DType::f16;  // state, weight, carry: neither f32 nor seq
          retyped[s.name].dtype = static_cast<int32_t>(wrong);
          const Status refused = retyped.check();
          CHECK(refused.code() == StatusCode::invalid_argument);
          CHECK_THAT(refused.message(), Catch::Matchers::Contains(named(s.name)));
        }
        // A state tensor may also have the seq dtype; a weight or carry
        // tensor too, with every other of its kind.
        if (s.dtype == Rule::state || s.dtype == Rule::weight || s.dtype == Rule::carry) {
          Call as_seq(row, slots, seq);
          for (const Slot& o : slots)
            if (o.name == s.name || (s.dtype != Rule::state && o.dtype == s.dtype))
              as_seq[o.name].dtype = static_cast<int32_t>(seq);
          const Status st = as_seq.check();
          INFO(st.message());
          CHECK(st.ok());
        }
        // And alone in the seq dtype, when another of its kind comes first
        // in f32, it is refused: one dtype for all of them.
        if ((s.dtype == Rule::weight || s.dtype == Rule::carry) && seq != DType::f32) {
          bool first = true;
          for (std::size_t j = 0; j < i; ++j) first = first && slots[j].dtype != s.dtype;
          if (!first) {
            Call mixed(row, slots, seq);
            mixed[s.name].dtype = static_cast<int32_t>(seq);
            const Status refused = mixed.check();
            CHECK(refused.code() == StatusCode::invalid_argument);
            CHECK_THAT(refused.message(), Catch::Matchers::Contains(named(s.name)));
          }
        }
      }
    }
  }
}

// The options' values as the rows give them: each enum value and each
// range's ends are accepted; just outside a range (or past an enum's last
// value) is refused as invalid, naming 'options' and the option; outside
// its condition an option is not read. The seq tensors are f32 here, the
// one dtype every enum value takes (tf32x3 and tf32 are for f32 inputs).
TEST_CASE("every option's values are the C++ API's", "[op_descriptions]") {
  const double nan = std::numeric_limits<double>::quiet_NaN();
  const double inf = std::numeric_limits<double>::infinity();
  int ranged = 0;
  for (const Row& row : exphil::op_descriptions()) {
    for (const exphil::OptionDescription& o : row.options) {
      INFO(row.op << " " << row.direction << ", option " << o.name);
      // Its condition made true on a call as the row describes it.
      const auto call = [&](bool condition) {
        Call c(row, row.tensors, DType::f32);
        if (condition && !o.only_if.empty()) {
          const std::size_t eq = o.only_if.find('=');
          if (eq == std::string::npos) {
            c.set_option(o.only_if, 1);
          } else {
            const std::string other = o.only_if.substr(0, eq), value = o.only_if.substr(eq + 1);
            bool found = false;
            for (const exphil::OptionDescription& p : row.options)
              for (std::size_t i = 0; i < p.values.size(); ++i)
                if (p.name == other && p.values[i] == value) c.set_option(other, double(i)), found = true;
            REQUIRE(found);
          }
        }
        return c;
      };
      const auto accepted = [&](double v, bool condition = true) {
        INFO("value " << v << (condition ? "" : ", condition off"));
        Call c = call(condition);
        c.set_option(o.name, v);
        const Status s = c.check();
        INFO(s.message());
        CHECK(s.ok());
      };
      const auto refused = [&](double v) {
        INFO("value " << v);
        Call c = call(true);
        c.set_option(o.name, v);
        const Status s = c.check();
        CHECK(s.code() == StatusCode::invalid_argument);
        CHECK_THAT(s.message(), Catch::Matchers::Contains("argument 'options'") &&
                                    Catch::Matchers::Contains(o.name));
      };

      if (!o.values.empty()) {
        ++ranged;
        for (std::size_t i = 0; i < o.values.size(); ++i) {
          // A value that brings in another option (mask window, window)
          // with that one at its range's low end.
          INFO("value " << o.values[i]);
          Call c = call(true);
          c.set_option(o.name, double(i));
          for (const exphil::OptionDescription& p : row.options)
            if (p.only_if == o.name + "=" + o.values[i] && p.range.find("..") != std::string::npos)
              c.set_option(p.name, std::stod(p.range.substr(0, p.range.find(".."))));
          const Status st = c.check();
          INFO(st.message());
          CHECK(st.ok());
        }
        refused(double(o.values.size()));
        refused(-1);
      }
      if (o.range == "finite") {
        ++ranged;
        REQUIRE(o.type == "f32");
        // dt_min and dt_max are also ordered (selective_scan.hpp), the other
        // staying at its default 0.
        accepted(o.name == "dt_min" ? -0.5 : 0.5);
        refused(nan);
        refused(inf);
        refused(-inf);
        if (!o.only_if.empty()) accepted(nan, false);
      } else if (!o.range.empty()) {
        ++ranged;
        REQUIRE(o.type == "i32");
        const std::size_t dots = o.range.find("..");
        REQUIRE(dots != std::string::npos);
        const double lo = std::stod(o.range.substr(0, dots)), hi = std::stod(o.range.substr(dots + 2));
        CHECK(hi <= std::numeric_limits<int32_t>::max());
        accepted(lo);
        accepted(hi);
        if (lo > std::numeric_limits<int32_t>::min()) refused(lo - 1);
        if (hi < std::numeric_limits<int32_t>::max()) refused(hi + 1);
        if (!o.only_if.empty()) accepted(lo - 1, false);
      }
    }
  }
  CHECK(ranged == 23);  // the enums and ranges of the rows (a row losing one fails here)
}
