// One handler for every target: the buffers of a call are bound into the
// library's args by the names of the target's row (include/exphil/
// xla_ffi_targets.h), which are the op description's (exphil::tensor_slot).
// So a row needs no code of its own beyond its op's attributes:
//
//   operand "x"          required: described, or the call fails naming it
//   operand "h0?"        absent as has_h0 says, or, without it, when the
//                        buffer has zero elements
//   result "y"           written
//   result "grad_h0?"    the gradient of optional operand h0: not written,
//                        and required to be empty, when h0 is absent
//   a tensor the row leaves out stays NULL in the args: the library's
//   "absent" (the y-only rows have no h_final; Edifice's linear-scan
//   backward has no b, so the library reads the states from y)
//   operand "flag"       Edifice's causal flag: bound, never read (its value
//                        comes as the mask attribute)
//
// A row gives its handler the function that makes its op's args from the
// call's attributes (the op's options, a scan's op); exphil::run runs them.
#pragma once

#include <cuda_runtime_api.h>

#include <functional>
#include <initializer_list>
#include <string>
#include <string_view>
#include <vector>

#include "attributes.hpp"
#include "buffer_views.hpp"
#include "error_mapping.hpp"
#include "exphil/tensor.hpp"
#include "guarded_call.hpp"
#include "handler_binding.hpp"
#include "target_rows.hpp"
#include "xla/ffi/api/ffi.h"

namespace exphil::xla_ffi {

// The member of the call's args for a described name, or null.
using SlotOf = std::function<const Tensor**(std::string_view name)>;

// A target row's buffers, read from its words once per target: the names
// as BufferViews prints them, which operands are optional or unread, and
// which operand each optional result is the gradient of.
struct RowBuffers {
  struct Operand {
    std::string name;
    bool optional = false;
    bool unread = false;  // Edifice's flag
  };
  struct Result {
    std::string name;
    int gradient_of = -1;  // the operand index of "grad_h0?"'s h0, else -1
  };
  const char* target = nullptr;
  std::vector<Operand> operands;
  std::vector<Result> results;

  explicit RowBuffers(const TargetRow& row);
};

// Binds `buffers` (the row's operands, then its results) into the args
// that slot_of reaches, as the table above says; the presence of the
// optional operands is read from `attrs`. Fails with the attributes' or the
// buffers' error (views), or an internal one for a row naming a tensor the
// args do not have.
ffi::Error bind_buffers(const RowBuffers& row, CallAttributes& attrs, BufferViews& views,
                        std::initializer_list<ffi::AnyBuffer> buffers, const SlotOf& slot_of);

// make_args: (CallAttributes&) -> the C++ API's args of the row's op.
template <auto make_args>
ffi::Error described_call(const TargetRow& row, const RowBuffers& row_buffers, cudaStream_t stream,
                          const ffi::Dictionary& attributes, std::initializer_list<ffi::AnyBuffer> buffers) {
  CallAttributes attrs(row, attributes);
  auto args = make_args(attrs);
  BufferViews views(row.name);
  ffi::Error bound = bind_buffers(row_buffers, attrs, views, buffers,
                                  [&args](std::string_view name) { return tensor_slot(args, name); });
  if (bound.failure()) return bound;
  return to_ffi_error(row.name, run(args, stream));
}

// The exported handler of the target in row `index` of the table.
template <int index, auto make_args>
XLA_FFI_Error* described_handler(XLA_FFI_CallFrame* frame) noexcept {
  constexpr const TargetRow& row = kTargetRows[index];
  return guarded_call(row.name, frame, [](XLA_FFI_CallFrame* f) {
    // Built on first use and kept for the life of the process, as XLA's own
    // handler macros do.
    static const RowBuffers* const row_buffers = new RowBuffers(row);
    static const auto* const handler =
        stream_attributes_and_buffers<operand_count(row), result_count(row)>()
            .To(
                [](cudaStream_t stream, const ffi::Dictionary& attributes, auto... buffers) {
                  return described_call<make_args>(kTargetRows[index], *row_buffers, stream, attributes,
                                                   {buffer_of(buffers)...});
                },
                kHandlerTraits)
            .release();
    return handler->Call(f);
  });
}

}  // namespace exphil::xla_ffi
