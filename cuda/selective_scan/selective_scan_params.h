// The contract between the host runtime and the selective-scan kernels:
// plain structs, no device code, filled by c_src/ after validation and read
// by cuda/selective_scan/.
#pragma once

#include <cstdint>

#include "exphil/tensor.hpp"

namespace exphil::kernels {

struct SelectiveScanShape {
  int64_t batch = 0;     // B
  int64_t steps = 0;     // T
  int64_t channels = 0;  // D
  int64_t states = 0;    // N
};

// How dt becomes delta: u = dt (+ bias); softplus(u) if softplus; clamped to
// [dt_min, dt_max] last if clamp.
struct DeltaRule {
  bool softplus = false;
  bool clamp = false;
  float dt_min = 0.0f, dt_max = 0.0f;
};

// Sequence tensors (x, dt, z, y: [B, T, D]; B, C: [B, T, N]) are of `dtype`;
// A [D, N], dt_bias [D], D [D] and the states [B, D, N] are f32. Optional
// pointers are null when absent.
struct SelectiveScanForwardParams {
  SelectiveScanShape shape;
  DType dtype = DType::f32;
  DeltaRule delta;
  const void* d_x = nullptr;
  const void* d_dt = nullptr;
  const float* d_A = nullptr;
  const void* d_B = nullptr;
  const void* d_C = nullptr;
  const float* d_dt_bias = nullptr;
  const float* d_D = nullptr;
  const void* d_z = nullptr;
  const float* d_h0 = nullptr;
  void* d_y = nullptr;
  float* d_h_final = nullptr;
};

// The forward's inputs, the output gradients, and the input gradients (each
// null when not wanted).
struct SelectiveScanBackwardParams {
  SelectiveScanForwardParams fwd;  // d_y and d_h_final unused
  const void* d_grad_y = nullptr;
  const float* d_grad_h_final = nullptr;
  void* d_grad_x = nullptr;
  void* d_grad_dt = nullptr;
  float* d_grad_A = nullptr;
  void* d_grad_B = nullptr;
  void* d_grad_C = nullptr;
  float* d_grad_dt_bias = nullptr;
  float* d_grad_D = nullptr;
  void* d_grad_z = nullptr;
  float* d_grad_h0 = nullptr;
};

enum class SelectiveScanDirection { forward, backward };

// How one call is laid out (selective_scan_plan.cpp). A block holds
// kSsChannelsPerBlock channels x `slices` warps; each thread keeps
// states_per_thread states of one channel, so a block covers
// states_per_thread * slices states; wider N takes several state groups.
struct SelectiveScanPlan {
  int states_per_thread = 4;    // 4, or 2 for short calls (forward only)
  int slices = 1;               // warps per block (blockDim.y)
  int state_groups = 1;         // blocks across N (gridDim.y factor)
  int64_t channel_groups = 1;   // blocks across D per batch row
  int chunks = 1;               // pieces of T run in parallel
  int64_t chunk_steps = 0;      // steps per chunk (a multiple of the tile)
  // Workspace layout: offsets in floats from its start, -1 when not used.
  int64_t ws_carry = 0;      // [B, chunks, D, N] chunk states, then checkpoints
  int64_t ws_carry_grad = 0; // [B, chunks, D, N] chunk gradients (backward)
  int64_t ws_delta_sum = 0;  // [B, chunks, D] sum of delta per chunk
  int64_t ws_group_sums = 0; // [3 or 1, state_groups, B, T, D] per-group sums
  int64_t ws_proj = 0;       // [2, channel_groups, B, T, N] dB and dC parts
  int64_t ws_params = 0;     // [B * chunks, D, N + 2] dA, dD, d dt_bias parts
  int64_t ws_floats = 0;     // total
  // [B, T] the mean of delta over the channels, the input term's scale in
  // place of each channel's delta (SelectiveScanInputScale::channel_mean,
  // forward only; selective_scan_mean_delta.cuh); -1 in the usual mode.
  int64_t ws_input_scale = -1;
};

}  // namespace exphil::kernels
