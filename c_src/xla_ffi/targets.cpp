// The list of custom-call targets, for registration and for frameworks that
// register them themselves (JAX: jax.ffi.register_ffi_target of each). Made
// from the rows of include/exphil/xla_ffi_targets.h: each row's name is also
// its handler's symbol, so a row whose handler is not declared
// (include/exphil/xla_ffi.h) does not compile, nor one not defined link, and
// there is no second list of names to keep.
#include <cstddef>
#include <iterator>

#include "exphil/xla_ffi.h"
#include "exphil/xla_ffi_targets.h"
#include "target_rows.hpp"

namespace {

#define EXPHIL_XLA_FFI_TARGET_ENTRY(name, operands, results, attributes) {#name, name},
const exphil_xla_ffi_target kTargets[] = {EXPHIL_XLA_FFI_TARGETS(EXPHIL_XLA_FFI_TARGET_ENTRY)};
#undef EXPHIL_XLA_FFI_TARGET_ENTRY

// Each handler binds the operand and result counts of its own row and its
// buffers by the row's names (described_call.hpp); target_rows.hpp checks
// the rows themselves.
static_assert(std::size(kTargets) == std::size(exphil::xla_ffi::kTargetRows));

}  // namespace

extern "C" const exphil_xla_ffi_target* exphil_xla_ffi_targets(size_t* count) {
  if (count) *count = std::size(kTargets);
  return kTargets;
}
