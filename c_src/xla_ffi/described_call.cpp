#include "described_call.hpp"

#include <string>

namespace exphil::xla_ffi {

namespace {

// Edifice's attention ops pass their causal flag as an operand.
constexpr std::string_view kUnreadOperand = "flag";
constexpr std::string_view kGradPrefix = "grad_";

}  // namespace

ffi::Error bind_buffers(const TargetRow& row, CallAttributes& attrs, BufferViews& views,
                        std::initializer_list<ffi::AnyBuffer> buffers, const SlotOf& slot_of) {
  const int operands = operand_count(row), results = result_count(row);
  if (buffers.size() != static_cast<std::size_t>(operands + results))
    return ffi::Error::Internal(std::string(row.name) + ": the binding and the row disagree on the buffers");

  // Every presence first: the attributes' errors come before the buffers'.
  Presence presence[max_buffer_count()] = {};
  for (int i = 0; i < operands; ++i) {
    const std::string_view w = word(row.operands, i);
    presence[i] = is_optional(w) ? attrs.presence(bare_name(w)) : Presence::present;
  }
  if (!attrs.ok()) return attrs.error();

  const ffi::AnyBuffer* b = buffers.begin();
  for (int i = 0; i < operands; ++i) {
    const std::string_view w = word(row.operands, i);
    const std::string name(bare_name(w));
    if (name == kUnreadOperand) continue;
    const Tensor** s = slot_of(name);
    if (!s) return ffi::Error::Internal(std::string(row.name) + ": the op has no tensor '" + name + "'");
    *s = is_optional(w) ? views.optional_operand(name.c_str(), b[i], presence[i])
                        : views.operand(name.c_str(), b[i]);
  }
  for (int j = 0; j < results; ++j) {
    const std::string_view w = word(row.results, j);
    const std::string name(bare_name(w));
    const Tensor** s = slot_of(name);
    if (!s) return ffi::Error::Internal(std::string(row.name) + ": the op has no tensor '" + name + "'");
    const ffi::AnyBuffer& buffer = b[operands + j];
    if (!is_optional(w)) {
      *s = views.result(name.c_str(), buffer);
      continue;
    }
    // "grad_h0?": the gradient of optional operand "h0?" (a rule of the
    // rows, target_rows.hpp).
    const std::string input = name.substr(kGradPrefix.size());
    int k = 0;
    while (k < operands && bare_name(word(row.operands, k)) != input) ++k;
    const Tensor** in = slot_of(input);
    if (k == operands || !in)
      return ffi::Error::Internal(std::string(row.name) + ": no optional operand for result '" + name + "'");
    *s = views.optional_gradient(name.c_str(), buffer, input.c_str(), *in, presence[k]);
  }
  if (!views.ok()) return views.error();
  return ffi::Error::Success();
}

}  // namespace exphil::xla_ffi
