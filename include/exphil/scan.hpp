// Fused linear-recurrence scans: h_t = a_t * h_{t-1} + b_t, where each op
// derives (a_t, b_t) from its own inputs. Shapes, dtypes, NULL rules and
// stream semantics are those of exphil.h; this is the same API with the op
// as a parameter, for callers that treat the ops alike.
#pragma once

#include <string_view>

#include "exphil/status.hpp"
#include "exphil/tensor.hpp"

namespace exphil {

enum class ScanOp : int {
  linear_scan = 0,  // inputs a, b
  min_gru = 1,      // inputs gate, candidate
  min_lstm = 2,     // inputs forget, input, candidate
  liquid = 3,       // inputs tau, target
  // min_gru on a gate already through the sigmoid: z in (0, 1);
  // h_t = (1 - z) h_{t-1} + z candidate, gradients with respect to z.
  min_gru_activated = 4,   // inputs z, candidate
  // min_lstm on gates already through the sigmoid: f, i in (0, 1);
  // s = f + (i + 1e-6), h_t = (f / s) h_{t-1} + (i / s) candidate,
  // gradients with respect to f and i.
  min_lstm_activated = 5,  // inputs f, i, candidate
  // Edifice's diagonal linear recurrence: h_t = sigmoid(a) h_{t-1} + b,
  // the sigmoid inside the op.
  diag_linear = 6,  // inputs a, b
  // Edifice's ELU-GRU: min_gru with the candidate through 1 + elu inside
  // the op, z = sigmoid(gate), h_t = (1 - z) h_{t-1} + z (1 + elu(candidate)).
  elu_gru = 7,      // inputs gate, candidate
};

inline constexpr int kMaxScanInputs = 3;
inline constexpr ScanOp kAllScanOps[] = {
    ScanOp::linear_scan,        ScanOp::min_gru,     ScanOp::min_lstm, ScanOp::liquid,
    ScanOp::min_gru_activated,  ScanOp::min_lstm_activated, ScanOp::diag_linear,
    ScanOp::elu_gru};
// The ops with entry points in the C ABI (exphil.h) and the NIF. The others
// are Edifice's conventions (gates after the sigmoid, an activation inside
// the op), reached through this C++ API and the XLA FFI handlers only.
inline constexpr ScanOp kAbiScanOps[] = {ScanOp::linear_scan, ScanOp::min_gru, ScanOp::min_lstm,
                                         ScanOp::liquid};

// Number of sequence inputs of `op` (2 or 3).
int scan_input_count(ScanOp op) noexcept;
// "min_gru", ...
const char* scan_op_name(ScanOp op) noexcept;
// The argument names of exphil.h: input i of min_gru is "gate" and its
// gradient "grad_gate".
const char* scan_input_name(ScanOp op, int i) noexcept;
const char* scan_grad_input_name(ScanOp op, int i) noexcept;

struct ScanForwardArgs {
  ScanOp op = ScanOp::linear_scan;
  const Tensor* inputs[kMaxScanInputs] = {};  // the first scan_input_count(op)
  const Tensor* h0 = nullptr;                 // optional
  const Tensor* y = nullptr;                  // output
  const Tensor* h_final = nullptr;            // optional output
};

struct ScanBackwardArgs {
  ScanOp op = ScanOp::linear_scan;
  // linear_scan's b may be null here: the backward then reads each state
  // h_{t-1} from y (h0 at t = 0) instead of rebuilding it from (a, b), one
  // more read of y per step (its gradients do not depend on b; Edifice's
  // linear-scan backward never has it). Every other input is required.
  const Tensor* inputs[kMaxScanInputs] = {};
  const Tensor* h0 = nullptr;            // optional
  const Tensor* y = nullptr;             // the forward's output
  const Tensor* grad_y = nullptr;
  const Tensor* grad_h_final = nullptr;  // optional
  const Tensor* grad_inputs[kMaxScanInputs] = {};  // outputs
  const Tensor* grad_h0 = nullptr;       // optional output
};

// How a call was laid out on the GPU (reported back through
// ScanLaunchOptions::chosen).
struct ScanLaunchInfo {
  int vector_width = 0;   // channels per thread: 4 (vector loads) or 1
  int lanes = 0;          // threads across the width in a block
  int time_chunks = 0;    // threads along time in a block
  int segments = 0;       // blocks along time; > 1 adds an aggregate pass
  int kernels = 0;        // kernel launches of the call
};

// Launch overrides for tests and benchmarks; zero fields mean "choose".
// Results do not depend on them beyond f32 rounding.
struct ScanLaunchOptions {
  int time_chunks = 0;            // power of two, at most 256 / lanes
  int segments = 0;               // upper bound on blocks along time
  bool allow_vectorized = true;   // false forces the scalar path
  ScanLaunchInfo* chosen = nullptr;  // if set, receives the layout used
};

Status scan_forward(const ScanForwardArgs& args, Stream stream = nullptr,
                    const ScanLaunchOptions* options = nullptr) noexcept;

Status scan_backward(const ScanBackwardArgs& args, Stream stream = nullptr,
                     const ScanLaunchOptions* options = nullptr) noexcept;

// Checks a call without running it, and without the device: every
// argument's rank, shape, dtype and alignment, the options, and that no
// output overlaps another argument. An output may have NULL data (not yet
// allocated): its descriptor is checked, its memory is not. So a binding
// that allocates the outputs checks its inputs first. A call that passes can
// still fail where the device is needed: placement, memory kind, a shape no
// launch plan takes. Messages are the call's own.
Status can_implement(const ScanForwardArgs& args) noexcept;
Status can_implement(const ScanBackwardArgs& args) noexcept;

// The member of `args` that holds the tensor the op's description
// (op_descriptions.h) names `name`, or null for a name it does not have: a
// binding fills any op's args by the description's names. A scan's
// input names are those of args.op.
const Tensor** tensor_slot(ScanForwardArgs& args, std::string_view name) noexcept;
const Tensor** tensor_slot(ScanBackwardArgs& args, std::string_view name) noexcept;

// The op direction of these args, chosen by their type, as can_implement is:
// for bindings that serve every op alike.
inline Status run(const ScanForwardArgs& args, Stream stream = nullptr) noexcept { return scan_forward(args, stream); }
inline Status run(const ScanBackwardArgs& args, Stream stream = nullptr) noexcept { return scan_backward(args, stream); }

}  // namespace exphil
