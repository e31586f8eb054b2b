// The rows of include/exphil/xla_ffi_targets.h as constexpr data, and what
// the handlers read from them at compile time: how many operands and results
// a target binds, and the name, type and optionality of each attribute. The
// rules the handlers rely on are checked here when this compiles, so a row
// that breaks one fails the build, not a call.
#pragma once

#include <algorithm>
#include <cstddef>
#include <iterator>
#include <string_view>

#include "exphil/xla_ffi_targets.h"

namespace exphil::xla_ffi {

// One EXPHIL_XLA_FFI_TARGET row.
struct TargetRow {
  const char* name;             // also the symbol of the target's handler
  std::string_view operands;    // space-separated words; "h0?" is optional
  std::string_view results;     // "grad_h0?" is the gradient of "h0?"
  std::string_view attributes;  // "name:type" words; "name?:type" optional
};

#define EXPHIL_XLA_FFI_ROW(name, operands, results, attributes) \
  TargetRow{#name, operands, results, attributes},
inline constexpr TargetRow kTargetRows[] = {EXPHIL_XLA_FFI_TARGETS(EXPHIL_XLA_FFI_ROW)};
#undef EXPHIL_XLA_FFI_ROW

// ---------------------------------------------------------------------------
// Words of a row string.

constexpr int word_count(std::string_view words) {
  int count = 0;
  bool in_word = false;
  for (const char c : words) {
    if (c == ' ') {
      in_word = false;
    } else if (!in_word) {
      in_word = true;
      ++count;
    }
  }
  return count;
}

// Word `index` of `words`; empty past the last.
constexpr std::string_view word(std::string_view words, int index) {
  std::size_t i = 0;
  for (int n = 0; i < words.size(); ++n) {
    while (i < words.size() && words[i] == ' ') ++i;
    const std::size_t start = i;
    while (i < words.size() && words[i] != ' ') ++i;
    if (i == start) break;
    if (n == index) return words.substr(start, i - start);
  }
  return {};
}

// "h0?" is optional; its name is "h0".
constexpr bool is_optional(std::string_view w) { return !w.empty() && w.back() == '?'; }
constexpr std::string_view bare_name(std::string_view w) {
  return is_optional(w) ? w.substr(0, w.size() - 1) : w;
}

// True when one word of `words`, "?" left aside, is `name`; `optional`
// restricts the match to optional words.
constexpr bool has_word(std::string_view words, std::string_view name, bool optional) {
  for (int i = 0, n = word_count(words); i < n; ++i) {
    const std::string_view w = word(words, i);
    if (bare_name(w) == name && (!optional || is_optional(w))) return true;
  }
  return false;
}

// ---------------------------------------------------------------------------
// Attributes.

// The MLIR types of the contract; `invalid` marks a word the checks below
// refuse.
enum class AttributeType { i1, i32, f32, invalid };

constexpr const char* type_name(AttributeType type) {
  switch (type) {
    case AttributeType::i1: return "i1";
    case AttributeType::i32: return "i32";
    case AttributeType::f32: return "f32";
    case AttributeType::invalid: break;
  }
  return "?";
}

// One "name[?]:type" word of a row's attributes.
struct AttributeSpec {
  std::string_view name;
  bool optional = false;
  AttributeType type = AttributeType::invalid;
};

constexpr AttributeSpec attribute_spec(std::string_view w) {
  const std::size_t colon = w.find(':');
  if (colon == std::string_view::npos) return {w, false, AttributeType::invalid};
  const std::string_view name = w.substr(0, colon);
  const std::string_view type = w.substr(colon + 1);
  return {bare_name(name), is_optional(name),
          type == "i1"    ? AttributeType::i1
          : type == "i32" ? AttributeType::i32
          : type == "f32" ? AttributeType::f32
                          : AttributeType::invalid};
}

// has_<operand>, the attribute that says whether optional operand `operand`
// is present.
inline constexpr std::string_view kPresencePrefix = "has_";

constexpr bool is_presence_flag(std::string_view attribute, std::string_view operand) {
  return attribute.size() == kPresencePrefix.size() + operand.size() &&
         attribute.substr(0, kPresencePrefix.size()) == kPresencePrefix &&
         attribute.substr(kPresencePrefix.size()) == operand;
}

// ---------------------------------------------------------------------------
// Counts.

constexpr int operand_count(const TargetRow& row) { return word_count(row.operands); }
constexpr int result_count(const TargetRow& row) { return word_count(row.results); }
constexpr int attribute_count(const TargetRow& row) { return word_count(row.attributes); }

constexpr int max_buffer_count() {
  int most = 0;
  for (const TargetRow& row : kTargetRows)
    most = std::max(most, operand_count(row) + result_count(row));
  return most;
}

constexpr int max_attribute_count() {
  int most = 0;
  for (const TargetRow& row : kTargetRows) most = std::max(most, attribute_count(row));
  return most;
}

// ---------------------------------------------------------------------------
// Looking a row up, and the rules of the rows, at compile time. Each function
// in row_errors is deliberately not constexpr: a constant expression that
// reaches one does not compile, and the compiler's message names it.

namespace row_errors {
inline void no_row_for_this_target_name() {}
inline void attribute_is_not_name_colon_i1_i32_or_f32() {}
inline void attribute_listed_twice() {}
inline void optional_operand_without_an_optional_has_attribute_of_type_i1() {}
inline void has_attribute_without_its_optional_operand() {}
inline void optional_result_is_not_grad_of_an_optional_operand() {}
}  // namespace row_errors

// The index in kTargetRows of target `name`; use it in constant expressions
// only (a template argument can name a row by it).
constexpr int target_index(std::string_view name) {
  for (int i = 0; i < static_cast<int>(std::size(kTargetRows)); ++i)
    if (name == kTargetRows[i].name) return i;
  row_errors::no_row_for_this_target_name();
  return 0;
}

// The row of target `name`; use it in constant expressions only.
constexpr const TargetRow& target_row(std::string_view name) {
  return kTargetRows[target_index(name)];
}

constexpr bool row_is_well_formed(const TargetRow& row) {
  const int attributes = attribute_count(row);
  for (int i = 0; i < attributes; ++i) {
    const AttributeSpec a = attribute_spec(word(row.attributes, i));
    if (a.name.empty() || a.type == AttributeType::invalid)
      row_errors::attribute_is_not_name_colon_i1_i32_or_f32();
    for (int j = 0; j < i; ++j)
      if (attribute_spec(word(row.attributes, j)).name == a.name)
        row_errors::attribute_listed_twice();
    if (a.name.substr(0, kPresencePrefix.size()) == kPresencePrefix &&
        !has_word(row.operands, a.name.substr(kPresencePrefix.size()), true))
      row_errors::has_attribute_without_its_optional_operand();
  }
  for (int i = 0, n = operand_count(row); i < n; ++i) {
    const std::string_view w = word(row.operands, i);
    if (!is_optional(w)) continue;
    bool flagged = false;
    for (int j = 0; j < attributes; ++j) {
      const AttributeSpec a = attribute_spec(word(row.attributes, j));
      flagged = flagged || (a.optional && a.type == AttributeType::i1 &&
                            is_presence_flag(a.name, bare_name(w)));
    }
    if (!flagged) row_errors::optional_operand_without_an_optional_has_attribute_of_type_i1();
  }
  constexpr std::string_view kGradPrefix = "grad_";
  for (int i = 0, n = result_count(row); i < n; ++i) {
    const std::string_view w = word(row.results, i);
    if (is_optional(w) && (w.substr(0, kGradPrefix.size()) != kGradPrefix ||
                           !has_word(row.operands, bare_name(w).substr(kGradPrefix.size()), true)))
      row_errors::optional_result_is_not_grad_of_an_optional_operand();
  }
  return true;
}

constexpr bool rows_are_well_formed() {
  bool ok = true;
  for (const TargetRow& row : kTargetRows) ok = ok && row_is_well_formed(row);
  return ok;
}

static_assert(rows_are_well_formed(), "include/exphil/xla_ffi_targets.h breaks a rule above");

}  // namespace exphil::xla_ffi
