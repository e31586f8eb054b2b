// The list of custom-call targets, for registration and for frameworks that
// register them themselves (JAX: jax.ffi.register_ffi_target of each).
#include <cstddef>
#include <iterator>

#include "exphil/xla_ffi.h"

namespace {

const exphil_xla_ffi_target kTargets[] = {
    {"exphil_linear_scan_fwd", exphil_linear_scan_fwd},
    {"exphil_linear_scan_bwd", exphil_linear_scan_bwd},
    {"exphil_min_gru_fwd", exphil_min_gru_fwd},
    {"exphil_min_gru_bwd", exphil_min_gru_bwd},
    {"exphil_min_lstm_fwd", exphil_min_lstm_fwd},
    {"exphil_min_lstm_bwd", exphil_min_lstm_bwd},
    {"exphil_liquid_fwd", exphil_liquid_fwd},
    {"exphil_liquid_bwd", exphil_liquid_bwd},
    {"exphil_selective_scan_fwd", exphil_selective_scan_fwd},
    {"exphil_selective_scan_bwd", exphil_selective_scan_bwd},
    {"exphil_attention_fwd", exphil_attention_fwd},
    {"exphil_attention_bwd", exphil_attention_bwd},
};

}  // namespace

extern "C" const exphil_xla_ffi_target* exphil_xla_ffi_targets(size_t* count) {
  if (count) *count = std::size(kTargets);
  return kTargets;
}
