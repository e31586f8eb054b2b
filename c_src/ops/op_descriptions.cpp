// The parse of include/exphil/op_descriptions.h's rows, once, at first use.
// The rows' grammar is held by test/abi/test_op_descriptions.cpp (and the
// Elixir layer's parse), so a malformed word here is skipped, never thrown.
#include "exphil/op_descriptions.hpp"

#include <cctype>
#include <new>
#include <sstream>

#include "exphil/op_descriptions.h"

namespace exphil {

namespace {

struct Row {
  const char *op, *direction, *tensors, *options, *bindings;
};

#define EXPHIL_OP_ROW(op, direction, tensors, options, bindings) \
  Row{#op, #direction, tensors, options, bindings},
constexpr Row kRows[] = {EXPHIL_OP_DESCRIPTIONS(EXPHIL_OP_ROW)};
#undef EXPHIL_OP_ROW

std::vector<std::string> split(const std::string& text, char separator) {
  std::vector<std::string> parts;
  std::string part;
  std::istringstream in(text);
  while (std::getline(in, part, separator))
    if (!part.empty()) parts.push_back(part);
  return parts;
}

OpDescription parse(const Row& row) {
  OpDescription d;
  d.op = row.op;
  d.direction = row.direction;
  for (const std::string& word : split(row.tensors, ' ')) {
    const std::vector<std::string> f = split(word, ':');
    if (f.size() != 4 && f.size() != 5) continue;
    TensorDescription t;
    t.optional = f[0].back() == '?';
    t.name = t.optional ? f[0].substr(0, f[0].size() - 1) : f[0];
    t.key = t.name;
    for (char& c : t.key) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
    t.output = f[1] == "out";
    using Rule = TensorDescription::DTypeRule;
    t.dtype = f[2] == "state"    ? Rule::state
              : f[2] == "weight" ? Rule::weight
              : f[2] == "carry"  ? Rule::carry
              : f[2] == "f32"    ? Rule::f32
                                 : Rule::seq;
    t.dims = split(f[3], ',');
    if (f.size() == 5) t.only_with = f[4];
    d.tensors.push_back(std::move(t));
  }
  for (const std::string& word : split(row.options, ' ')) {
    // name:type=default[:range][:if(cond)]
    const std::size_t colon = word.find(':'), equals = word.find('=');
    if (colon == std::string::npos || equals == std::string::npos || equals < colon) continue;
    OptionDescription o;
    o.name = word.substr(0, colon);
    o.type = word.substr(colon + 1, equals - colon - 1);
    const std::vector<std::string> rest = split(word.substr(equals + 1), ':');
    if (rest.empty()) continue;
    o.default_value = rest[0];
    for (std::size_t i = 1; i < rest.size(); ++i) {
      const std::string& f = rest[i];
      if (f.size() > 4 && f.compare(0, 3, "if(") == 0 && f.back() == ')')
        o.only_if = f.substr(3, f.size() - 4);
      else
        o.range = f;
    }
    if (o.type.size() > 6 && o.type.compare(0, 5, "enum(") == 0 && o.type.back() == ')')
      o.values = split(o.type.substr(5, o.type.size() - 6), '|');
    d.options.push_back(std::move(o));
  }
  d.bindings = split(row.bindings, ' ');
  std::size_t index = 0;
  for (const TensorDescription& t : d.tensors) {
    if (t.output) continue;
    ++index;
    if (!t.optional) d.leading_inputs = index;
  }
  return d;
}

const std::vector<OpDescription>* parsed() noexcept {
  try {
    static const std::vector<OpDescription> descriptions = [] {
      std::vector<OpDescription> all;
      for (const Row& row : kRows) all.push_back(parse(row));
      return all;
    }();
    return &descriptions;
  } catch (...) {
    return nullptr;  // out of memory at first use; a later call tries again
  }
}

}  // namespace

const std::vector<OpDescription>& op_descriptions() noexcept {
  static const std::vector<OpDescription> none;
  const std::vector<OpDescription>* all = parsed();
  return all ? *all : none;
}

const OpDescription* find_op_description(std::string_view op, std::string_view direction) noexcept {
  for (const OpDescription& d : op_descriptions())
    if (d.op == op && d.direction == direction) return &d;
  return nullptr;
}

}  // namespace exphil
