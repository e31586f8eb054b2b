// attention_forward and attention_backward: decode, run through
// exphil::attention_forward / _backward on the managed stream (or the
// caller's), then wait (sync: true, the default) or return an Event
// (sync: false). Tensor arguments, outputs:, stream:, sync: and errors are
// those of the selective scan (selective_scan_nifs.cpp). What differs:
//
//   * mask:, window:, layout:, scale: and precision: become
//     exphil::AttentionOptions.
//     The NIF checks them itself, naming the option: the library reports a
//     bad one as 'options', and reads a scale of 0 as "1 / sqrt(d)", which a
//     caller writing scale: 0.0 did not mean, so a scale that is (or rounds
//     in f32 to) zero is refused here.
//   * Outputs the NIF allocates take their shapes from q and k, as the op's
//     description says (op_outputs.hpp): o and grad_q have q's shape,
//     grad_k and grad_v k's (the library requires v to have it too), all of
//     q's dtype; lse is [B, Hq, T] f32 in either layout. So the NIF checks
//     the ranks of q and k itself; everything else about shapes and dtypes
//     (GQA, head width, ...) is the library's.
//   * Under outputs:, the forward needs o (lse is optional: not written if
//     absent), and the backward any of grad_q, grad_k, grad_v (at least one).
//     Without outputs:, the NIF makes every output.
#include <initializer_list>
#include <limits>
#include <optional>
#include <string>
#include <vector>

#include "atoms.hpp"
#include "attention_nifs.hpp"
#include "call_options.hpp"
#include "exphil/attention.hpp"
#include "op_call.hpp"
#include "op_inputs.hpp"
#include "op_outputs.hpp"
#include "tensor_args.hpp"
#include "terms.hpp"

namespace exphil::nif {

namespace {

const std::vector<const char*> kOpOptions = {"mask", "window", "layout", "scale", "precision"};
const std::vector<const char*> kCallOptions = {"outputs", "sync", "stream"};

bool given(const std::optional<ERL_NIF_TERM>& term) {
  return term && !enif_is_identical(*term, atoms().nil);
}

// mask:, window:, layout:, scale:, precision:. nil stands for an absent
// window or scale. q_dtype: precision: :tf32x3 is for f32 inputs only.
AttentionOptions decode_attention_options(ErlNifEnv* env, const Options& opts, DType q_dtype) {
  const Atoms& a = atoms();
  AttentionOptions options;
  if (auto term = opts.get("mask"))
    options.mask = decode_choice<AttentionMask>(*term, "mask", ":none, :causal or :window",
                                                {{a.none, AttentionMask::none},
                                                 {a.causal, AttentionMask::causal},
                                                 {a.window, AttentionMask::window}});

  // window: only with mask: :window, where it is required. Given with
  // another mask it would be ignored, which hides a forgotten mask: :window.
  const auto window = opts.get("window");
  const std::string window_range = "an integer in 1.." + std::to_string(std::numeric_limits<int32_t>::max());
  if (options.mask == AttentionMask::window) {
    if (!given(window))
      throw ArgumentError{"argument 'window': expected " + window_range +
                          " with mask: :window (the keys each query sees, its own position included), got none"};
    ErlNifSInt64 w = 0;
    if (!enif_get_int64(env, *window, &w) || w < 1 || w > std::numeric_limits<int32_t>::max())
      bad_argument("window", window_range + " with mask: :window", *window);
    options.window = static_cast<int>(w);
  } else if (given(window)) {
    bad_argument("window", "nil unless mask: :window", *window);
  }

  if (auto term = opts.get("layout"))
    options.layout = decode_choice<AttentionLayout>(*term, "layout", ":bhtd ([B, H, T, d]) or :bthd ([B, T, H, d])",
                                                    {{a.bhtd, AttentionLayout::bhtd}, {a.bthd, AttentionLayout::bthd}});

  if (auto term = opts.get("scale"); given(term)) {
    double scale = 0.0;
    if (!get_f32_range(env, *term, scale) || static_cast<float>(scale) == 0.0f)
      bad_argument("scale",
                   "nil (1 / sqrt(d)) or a nonzero number within f32's range (a float or a 64-bit "
                   "integer)",
                   *term);
    options.scale = static_cast<float>(scale);
  }

  if (auto term = opts.get("precision")) {
    options.precision = decode_choice<AttentionPrecision>(
        *term, "precision", ":exact or :tf32x3 (f32 inputs only)",
        {{a.exact, AttentionPrecision::exact}, {a.tf32x3, AttentionPrecision::tf32x3}});
    if (options.precision == AttentionPrecision::tf32x3 && q_dtype != DType::f32)
      bad_argument("precision", ":exact with f16 or bf16 inputs (:tf32x3 multiplies f32)", *term);
  }
  return options;
}

// Both directions: the op options, then the outputs (lse is f32
// [B, Hq, T] in either layout; o and the gradients have q's dtype).
AttentionOptions plan_call(ErlNifEnv* env, OpCall& call) {
  const DType q_dtype = call.in().arg("q")->dtype;
  const AttentionOptions options = decode_attention_options(env, call.opts(), q_dtype);
  call.plan_outputs(q_dtype, DType::f32, options.layout == AttentionLayout::bthd);
  return options;
}

}  // namespace

namespace {

template <class Args>
ERL_NIF_TERM attention_nif(ErlNifEnv* env, const char* direction, int argc, const ERL_NIF_TERM argv[]) {
  return nif_entry(env, [&] {
    OpCall call(env, "attention", direction, argv, kOpOptions, kCallOptions);
    Args args;
    args.options = plan_call(env, call);
    return call.run(argc, argv, args);
  });
}

}  // namespace

ERL_NIF_TERM attention_forward_nif(ErlNifEnv* env, int argc, const ERL_NIF_TERM argv[]) {
  return attention_nif<AttentionForwardArgs>(env, "forward", argc, argv);
}

ERL_NIF_TERM attention_backward_nif(ErlNifEnv* env, int argc, const ERL_NIF_TERM argv[]) {
  return attention_nif<AttentionBackwardArgs>(env, "backward", argc, argv);
}

}  // namespace exphil::nif
