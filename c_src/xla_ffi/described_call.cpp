#include "described_call.hpp"

#include <string>

namespace exphil::xla_ffi {

namespace {

// Edifice's attention ops pass their causal flag as an operand.
constexpr std::string_view kUnreadOperand = "flag";
constexpr std::string_view kGradPrefix = "grad_";

}  // namespace

RowBuffers::RowBuffers(const TargetRow& row) : target(row.name) {
  for (int i = 0, n = operand_count(row); i < n; ++i) {
    const std::string_view w = word(row.operands, i);
    operands.push_back({std::string(bare_name(w)), is_optional(w), bare_name(w) == kUnreadOperand});
  }
  for (int j = 0, n = result_count(row); j < n; ++j) {
    const std::string_view w = word(row.results, j);
    Result r{std::string(bare_name(w))};
    // "grad_h0?": the gradient of optional operand "h0?" (a rule of the
    // rows that target_rows.hpp checks when it compiles).
    if (is_optional(w))
      for (std::size_t k = 0; k < operands.size(); ++k)
        if (operands[k].optional && r.name == std::string(kGradPrefix) + operands[k].name)
          r.gradient_of = static_cast<int>(k);
    results.push_back(std::move(r));
  }
}

ffi::Error bind_buffers(const RowBuffers& row, CallAttributes& attrs, BufferViews& views,
                        std::initializer_list<ffi::AnyBuffer> buffers, const SlotOf& slot_of) {
  const std::size_t operands = row.operands.size();
  if (buffers.size() != operands + row.results.size())
    return ffi::Error::Internal(std::string(row.target) + ": the binding and the row disagree on the buffers");

  // Every presence first: the attributes' errors come before the buffers'.
  Presence presence[max_buffer_count()] = {};
  for (std::size_t i = 0; i < operands; ++i)
    presence[i] = row.operands[i].optional ? attrs.presence(row.operands[i].name) : Presence::present;
  if (!attrs.ok()) return attrs.error();

  const auto missing = [&](const std::string& name) {
    return ffi::Error::Internal(std::string(row.target) + ": the op has no tensor '" + name + "'");
  };
  const ffi::AnyBuffer* b = buffers.begin();
  for (std::size_t i = 0; i < operands; ++i) {
    const RowBuffers::Operand& o = row.operands[i];
    if (o.unread) continue;
    const Tensor** s = slot_of(o.name);
    if (!s) return missing(o.name);
    *s = o.optional ? views.optional_operand(o.name.c_str(), b[i], presence[i])
                    : views.operand(o.name.c_str(), b[i]);
  }
  for (std::size_t j = 0; j < row.results.size(); ++j) {
    const RowBuffers::Result& r = row.results[j];
    const Tensor** s = slot_of(r.name);
    if (!s) return missing(r.name);
    const ffi::AnyBuffer& buffer = b[operands + j];
    if (r.gradient_of < 0) {
      *s = views.result(r.name.c_str(), buffer);
      continue;
    }
    const RowBuffers::Operand& input = row.operands[static_cast<std::size_t>(r.gradient_of)];
    const Tensor** in = slot_of(input.name);
    if (!in) return missing(input.name);
    *s = views.optional_gradient(r.name.c_str(), buffer, input.name.c_str(), *in, presence[r.gradient_of]);
  }
  if (!views.ok()) return views.error();
  return ffi::Error::Success();
}

}  // namespace exphil::xla_ffi
