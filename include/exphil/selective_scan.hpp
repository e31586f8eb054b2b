// Mamba's selective scan, forward and backward. Shapes, dtypes, NULL rules
// and stream semantics are those of exphil.h (section "selective_scan");
// this is the same API with the arguments gathered into structs.
#pragma once

#include <string_view>

#include "exphil/status.hpp"
#include "exphil/tensor.hpp"

namespace exphil {

// What scales the input term B_t[n] x_t[d] of the recurrence.
enum class SelectiveScanInputScale : int {
  // Each channel's own delta (Mamba):
  //   h_t = exp(delta_t[d] A[d, n]) h_{t-1} + delta_t[d] B_t[n] x_t[d]
  delta = 0,
  // The mean of delta over the D channels at that batch row and step, as
  // Edifice's selective-scan forward discretises B (ssm/common.ex,
  // discretize_ssm): ... + mean_d(delta_t) B_t[n] x_t[d]. Forward only (the
  // backward refuses it); C++ API and the XLA FFI handlers only.
  channel_mean = 1,
};

// How dt becomes the step size delta of each channel and step:
//   u = dt + dt_bias (dt_bias optional), u = softplus(u) if softplus,
//   delta = clamp(u, dt_min, dt_max) if clamp (applied last).
struct SelectiveScanOptions {
  bool softplus = false;
  bool clamp = false;
  float dt_min = 0.0f;  // with clamp: finite, dt_min <= dt_max
  float dt_max = 0.0f;
  SelectiveScanInputScale input_scale = SelectiveScanInputScale::delta;
};

// The inputs of both directions. x, dt, z: [B, T, D]; A: [D, N];
// B, C: [B, T, N]; dt_bias, D: [D]; h0: [B, D, N]. x, dt, B, C and z share
// one dtype (f32, f16 or bf16); A, dt_bias, D and h0 are f32.
struct SelectiveScanInputs {
  const Tensor* x = nullptr;
  const Tensor* dt = nullptr;
  const Tensor* A = nullptr;
  const Tensor* B = nullptr;
  const Tensor* C = nullptr;
  const Tensor* dt_bias = nullptr;  // optional
  const Tensor* D = nullptr;        // optional skip weight
  const Tensor* z = nullptr;        // optional gate: y *= silu(z)
  const Tensor* h0 = nullptr;       // optional initial state
};

struct SelectiveScanForwardArgs {
  SelectiveScanInputs in;
  SelectiveScanOptions options;
  const Tensor* y = nullptr;        // output [B, T, D], the dtype of x
  const Tensor* h_final = nullptr;  // optional output [B, D, N], f32
};

// Every gradient output is optional (NULL: not written); a gradient of an
// absent optional input must be NULL.
struct SelectiveScanBackwardArgs {
  SelectiveScanInputs in;
  SelectiveScanOptions options;
  const Tensor* grad_y = nullptr;        // [B, T, D], the dtype of x
  const Tensor* grad_h_final = nullptr;  // optional [B, D, N], f32
  const Tensor* grad_x = nullptr;        // [B, T, D], the dtype of x
  const Tensor* grad_dt = nullptr;       // [B, T, D]
  const Tensor* grad_A = nullptr;        // [D, N], f32
  const Tensor* grad_B = nullptr;        // [B, T, N], the dtype of x
  const Tensor* grad_C = nullptr;        // [B, T, N]
  const Tensor* grad_dt_bias = nullptr;  // [D], f32
  const Tensor* grad_D = nullptr;        // [D], f32
  const Tensor* grad_z = nullptr;        // [B, T, D]
  const Tensor* grad_h0 = nullptr;       // [B, D, N], f32
};

// How a call was laid out on the GPU (reported through
// SelectiveScanLaunchOptions::chosen).
struct SelectiveScanLaunchInfo {
  int channels_per_block = 0;  // channels of one block
  int state_slices = 0;        // threads sharing one channel's N states
  int chunks = 0;              // pieces of the sequence run in parallel
  long long chunk_steps = 0;   // steps per chunk
  int kernels = 0;             // kernel launches of the call
};

// Launch overrides for tests and benchmarks; zero fields mean "choose".
// Results do not depend on them beyond f32 rounding.
struct SelectiveScanLaunchOptions {
  long long chunk_steps = 0;  // steps per chunk (rounded up to a multiple of 16)
  SelectiveScanLaunchInfo* chosen = nullptr;  // if set, receives the layout
};

Status selective_scan_forward(const SelectiveScanForwardArgs& args, Stream stream = nullptr,
                              const SelectiveScanLaunchOptions* options = nullptr) noexcept;

Status selective_scan_backward(const SelectiveScanBackwardArgs& args, Stream stream = nullptr,
                               const SelectiveScanLaunchOptions* options = nullptr) noexcept;

// Checks a call without running it or the device, as scan.hpp's
// can_implement says.
Status can_implement(const SelectiveScanForwardArgs& args) noexcept;
Status can_implement(const SelectiveScanBackwardArgs& args) noexcept;

// The member of `args` that holds the tensor the op's description
// (op_descriptions.h) names `name`, or null for a name it does not have: a
// binding fills any op's args by the description's names.
const Tensor** tensor_slot(SelectiveScanForwardArgs& args, std::string_view name) noexcept;
const Tensor** tensor_slot(SelectiveScanBackwardArgs& args, std::string_view name) noexcept;

// The op direction of these args, chosen by their type, as can_implement is:
// for bindings that serve every op alike.
inline Status run(const SelectiveScanForwardArgs& args, Stream stream = nullptr) noexcept { return selective_scan_forward(args, stream); }
inline Status run(const SelectiveScanBackwardArgs& args, Stream stream = nullptr) noexcept { return selective_scan_backward(args, stream); }

}  // namespace exphil
