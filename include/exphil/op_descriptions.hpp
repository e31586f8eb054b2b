// op_descriptions.h's rows, parsed: for bindings that derive what they can
// from the one description of each op direction (the NIF derives its
// outputs' names, dtypes, shapes and presence from it).
#pragma once

#include <cstddef>
#include <string>
#include <string_view>
#include <vector>

namespace exphil {

struct TensorDescription {
  enum class DTypeRule { seq, state, weight, carry, f32 };
  std::string name;
  std::string key;  // the name lower-cased, as the NIF and Elixir spell it ("grad_a")
  bool optional = false;
  bool output = false;
  DTypeRule dtype = DTypeRule::seq;
  std::vector<std::string> dims;  // named dimensions, bhtd for attention
  std::string only_with;          // an optional output: the optional input it needs
};

struct OptionDescription {
  std::string name;
  std::string type;  // "bool", "i32", "f32" or "enum(a|b|...)"
  std::string default_value;
  std::vector<std::string> values;  // an enum's, in enumerator order
  std::string range;                // "", "finite" or "lo..hi" (op_descriptions.h)
  std::string only_if;              // "", "clamp" or "mask=window": when the range holds
};

struct OpDescription {
  std::string op, direction;
  std::vector<TensorDescription> tensors;
  std::vector<OptionDescription> options;
  std::vector<std::string> bindings;
  // How many inputs, in order, come before the optional ones that end the
  // list: up to the last required input (the NIF's arguments).
  std::size_t leading_inputs = 0;
};

// Every row, in the header's order.
const std::vector<OpDescription>& op_descriptions() noexcept;

// The row of `op` in `direction` ("forward" or "backward"), or null.
const OpDescription* find_op_description(std::string_view op, std::string_view direction) noexcept;

}  // namespace exphil
