// How every handler is bound: XLA's CUDA stream first, then all of the call's
// attributes as one ffi::Dictionary (decoded by CallAttributes against the
// target's row, since XLA's per-attribute bindings cannot leave one out), then
// its buffers in the contract's order (operands, then results). The bindings
// give XLA the exact operand and result counts, taken from the target's row,
// so a call with the wrong number fails in decoding with XLA's own message.
#pragma once

#include <cuda_runtime_api.h>

#include <initializer_list>
#include <utility>

#include "target_rows.hpp"
#include "xla/ffi/api/ffi.h"

namespace exphil::xla_ffi {

namespace ffi = ::xla::ffi;

// The stream XLA runs the call on; the ops enqueue on it and never wait.
using CudaStream = ffi::PlatformStream<cudaStream_t>;

// Every handler may be traced into XLA's command buffers (CUDA graphs): a
// call launches the same kernels for the same shapes and attributes, and
// under capture the library's workspace is a block the graph owns, never an
// allocation node (c_src/runtime/capture_workspace.hpp), so XLA can nest the trace
// as a child graph. Given with every .To(), which XLA reads back through its
// metadata query, and again at registration (registration.cpp).
inline constexpr std::initializer_list<ffi::Traits> kHandlerTraits = {
    ffi::Traits::kCmdBufferCompatible};

// `binding` followed by `operands` buffer arguments and `results` buffer
// results, all ffi::AnyBuffer (the element type is checked in BufferViews).
// Every step returns the binding the last .Arg or .Ret made: a Binding can
// only be moved by the FFI library itself.
template <int operands, int results, class Binding>
auto with_buffers(Binding&& binding) {
  static_assert(operands > 0 || results > 0, "a handler without buffers");
  if constexpr (operands > 0) {
    if constexpr (operands == 1 && results == 0)
      return std::move(binding).template Arg<ffi::AnyBuffer>();
    else
      return with_buffers<operands - 1, results>(
          std::move(binding).template Arg<ffi::AnyBuffer>());
  } else if constexpr (results == 1) {
    return std::move(binding).template Ret<ffi::AnyBuffer>();
  } else {
    return with_buffers<0, results - 1>(std::move(binding).template Ret<ffi::AnyBuffer>());
  }
}

// The binding of a target with the given buffer counts (operand_count and
// result_count of its row): the handler function takes (cudaStream_t, const
// ffi::Dictionary& attributes, buffers...).
template <int operands, int results>
auto stream_attributes_and_buffers() {
  return with_buffers<operands, results>(ffi::Ffi::Bind().Ctx<CudaStream>().Attrs());
}

// The buffer behind an operand or a result, for handlers that take their
// buffers as one pack (described_call.hpp).
inline ffi::AnyBuffer buffer_of(ffi::AnyBuffer operand) { return operand; }
inline ffi::AnyBuffer buffer_of(ffi::Result<ffi::AnyBuffer> result) { return *result; }

}  // namespace exphil::xla_ffi
