// Scaled dot-product attention, forward and backward. Shapes, dtypes, masks,
// NULL rules and stream semantics are those of exphil.h (section
// "attention"); this is the same API with the arguments gathered into
// structs.
#pragma once

#include <string_view>

#include "exphil/status.hpp"
#include "exphil/tensor.hpp"

namespace exphil {

enum class AttentionMask : int32_t {
  none = EXPHIL_ATTENTION_MASK_NONE,
  causal = EXPHIL_ATTENTION_MASK_CAUSAL,  // j <= i + S - T
  window = EXPHIL_ATTENTION_MASK_WINDOW,  // i + S - T - window < j <= i + S - T
};

enum class AttentionLayout : int32_t {
  bhtd = EXPHIL_ATTENTION_BHTD,  // [B, H, T, d]
  bthd = EXPHIL_ATTENTION_BTHD,  // [B, T, H, d]
};

// How f32 inputs are multiplied (exphil.h, "Arithmetic"): exact f32 FMAs,
// or three TF32 tensor-core products each. f16 and bf16 take exact only.
enum class AttentionPrecision : int32_t {
  exact = EXPHIL_ATTENTION_EXACT,
  tf32x3 = EXPHIL_ATTENTION_TF32X3,
};

struct AttentionOptions {
  AttentionMask mask = AttentionMask::none;
  int window = 0;     // with AttentionMask::window: >= 1
  AttentionLayout layout = AttentionLayout::bhtd;
  float scale = 0.0f;  // 0: 1 / sqrt(d)
  AttentionPrecision precision = AttentionPrecision::exact;
};

// q [B, Hq, T, d]; k, v [B, Hkv, S, d] (or [B, T, H, d] with bthd), one dtype.
struct AttentionInputs {
  const Tensor* q = nullptr;
  const Tensor* k = nullptr;
  const Tensor* v = nullptr;
};

struct AttentionForwardArgs {
  AttentionInputs in;
  AttentionOptions options;
  const Tensor* o = nullptr;    // output, the shape and dtype of q
  const Tensor* lse = nullptr;  // optional output [B, Hq, T], f32
};

struct AttentionBackwardArgs {
  AttentionInputs in;
  AttentionOptions options;
  const Tensor* o = nullptr;       // the forward's output
  const Tensor* lse = nullptr;     // the forward's log-sum-exp [B, Hq, T], f32
  // Without the forward's lse: lse must then be NULL, and the call
  // recomputes it with a forward pass (its o discarded) into temporary
  // memory (B * Hq * T floats and an o-sized block more), taken as the
  // backward's own (capture-safe). Not in the C ABI.
  bool recompute_lse = false;
  const Tensor* grad_o = nullptr;  // the shape and dtype of q
  const Tensor* grad_q = nullptr;  // optional outputs, the shapes of q, k, v
  const Tensor* grad_k = nullptr;
  const Tensor* grad_v = nullptr;
};

// How a call was laid out on the GPU (reported through
// AttentionLaunchOptions::chosen).
struct AttentionLaunchInfo {
  int query_rows_per_block = 0;  // forward and dQ: query rows of one block
  int key_rows_per_block = 0;    // dK/dV: key rows of one block
  int key_tile = 0;              // keys per step of the forward's loop
  int kernels = 0;               // kernel launches of the call
  // Whether the blocks over queries (forward, dQ) and over keys (dK/dV)
  // start heaviest first: masked calls with more blocks than SMs.
  bool queries_heaviest_first = false;
  bool keys_heaviest_first = false;
  // The forward ran the Hopper kernel (warpgroup products, sm_90 only).
  bool warpgroup_forward = false;
  // The backward's dQ and dK/dV kernels were the Hopper ones (sm_90 only).
  bool warpgroup_dq = false;
  bool warpgroup_dkdv = false;
  // The backward computed dQ, dK and dV in one kernel (after the rowsum
  // kernel): f32 (either precision), d <= 64, four-warp key blocks.
  bool fused_backward = false;
};

// Launch overrides for tests and benchmarks; zero fields mean "choose".
// Results do not depend on warps_per_block. sm80_kernels changes which
// kernels run where the Hopper ones would: both meet the same tolerances,
// but their sums may round differently.
struct AttentionLaunchOptions {
  int warps_per_block = 0;  // 1, 2 or 4: 16 query (or key) rows per warp
  // The sm_80 kernels even where the Hopper ones would run (to test and time
  // both on one device).
  bool sm80_kernels = false;
  AttentionLaunchInfo* chosen = nullptr;  // if set, receives the layout
};

Status attention_forward(const AttentionForwardArgs& args, Stream stream = nullptr,
                         const AttentionLaunchOptions* options = nullptr) noexcept;

Status attention_backward(const AttentionBackwardArgs& args, Stream stream = nullptr,
                          const AttentionLaunchOptions* options = nullptr) noexcept;

// Checks a call without running it or the device, as scan.hpp's
// can_implement says.
Status can_implement(const AttentionForwardArgs& args) noexcept;
Status can_implement(const AttentionBackwardArgs& args) noexcept;

// The member of `args` that holds the tensor the op's description
// (op_descriptions.h) names `name`, or null for a name it does not have: a
// binding fills any op's args by the description's names.
const Tensor** tensor_slot(AttentionForwardArgs& args, std::string_view name) noexcept;
const Tensor** tensor_slot(AttentionBackwardArgs& args, std::string_view name) noexcept;

// The op direction of these args, chosen by their type, as can_implement is:
// for bindings that serve every op alike.
inline Status run(const AttentionForwardArgs& args, Stream stream = nullptr) noexcept { return attention_forward(args, stream); }
inline Status run(const AttentionBackwardArgs& args, Stream stream = nullptr) noexcept { return attention_backward(args, stream); }

}  // namespace exphil
