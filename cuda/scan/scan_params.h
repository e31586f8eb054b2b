// The contract between the host runtime and the scan kernels: plain structs,
// no device code, filled by c_src/ after validation and read by cuda/scan/.
#pragma once

#include <cstdint>

#include "exphil/scan.hpp"
#include "exphil/tensor.hpp"

namespace exphil::kernels {

struct ScanShape {
  int64_t batch = 0;  // B
  int64_t steps = 0;  // T
  int64_t width = 0;  // H
};

// Sequence tensors are [B, T, H] of `dtype`; state tensors are [B, H] of their
// own dtype (f32 or `dtype`). Optional pointers are null when absent.
struct ScanForwardParams {
  ScanShape shape;
  DType dtype = DType::f32;
  const void* d_inputs[kMaxScanInputs] = {};
  const void* d_h0 = nullptr;
  DType h0_dtype = DType::f32;
  void* d_y = nullptr;
  void* d_h_final = nullptr;
  DType h_final_dtype = DType::f32;
};

struct ScanBackwardParams {
  ScanShape shape;
  DType dtype = DType::f32;
  const void* d_inputs[kMaxScanInputs] = {};
  const void* d_h0 = nullptr;
  DType h0_dtype = DType::f32;
  const void* d_y = nullptr;
  const void* d_grad_y = nullptr;
  const void* d_grad_h_final = nullptr;
  DType grad_h_final_dtype = DType::f32;
  void* d_grad_inputs[kMaxScanInputs] = {};
  void* d_grad_h0 = nullptr;
  DType grad_h0_dtype = DType::f32;
  // Read each state h_{t-1} from y (h0 at t = 0) instead of rebuilding it
  // from the op's coefficients; the op's last input is then not read and
  // may be null (linear_scan without b; scan_backward.cuh).
  bool states_from_y = false;
};

enum class ScanDirection { forward, backward };

// How one call is laid out; see scan_plan.cpp for how it is chosen.
struct ScanPlan {
  int vector_width = 1;      // channels per thread (kScanVectorWidth or 1)
  int lanes = 1;             // blockDim.x: threads across the width
  int time_chunks = 1;       // blockDim.y: threads along time in one tile
  int steps_per_thread = 1;  // consecutive steps a thread owns in a tile
  int segments = 1;          // gridDim.y of the apply pass
  int64_t segment_steps = 0; // steps per segment, a multiple of the tile
  int64_t lane_groups = 1;   // blocks across the width of one batch row
};

}  // namespace exphil::kernels
