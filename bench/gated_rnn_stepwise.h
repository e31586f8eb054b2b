// The one-launch-per-timestep baseline of the GRU and LSTM sequences: what
// a loop over time does (XLA's unrolled or while-loop recurrence, a PyTorch
// loop of cells), with the same math as exphil::gated_rnn_forward /
// _backward (exphil/gated_rnn.hpp: gate orders, the GRU's recurrent bias
// inside the reset).
//
// Forward: T launches, each advancing every (b, unit) by one step: a warp
// per unit and up to 8 batch rows computes its G recurrent dot products
// from h_{t-1} and R^T (a transposed copy of R made once, so that the lanes
// read consecutive k: a matrix-vector product as a library would run it),
// then the cell update. With `save` (training) each launch also keeps what the
// backward reads: h_{t-1} and the gates (GRU r, z, n, h R_n + b_n; LSTM i,
// f, g, o, c_t), as autograd keeps activations.
//
// Backward: per step in reverse, one launch for the gate gradients (grad_wx
// and grad_rh, the LSTM's c carry) and one for grad_h_{t-1} = grad_rh_t R^T
// (a warp per (b, k)); grad_R = sum_t h_{t-1}^T grad_rh_t and grad_bias are
// then two matrix products over all steps, which the caller runs
// (bench_gemm.h) from `hist` and `grad_rh`.
#pragma once

#include <cstdint>

#include <cuda_runtime_api.h>

#include "exphil/gated_rnn.hpp"
#include "exphil/tensor.hpp"

namespace exphil::bench {

// Values kept per (b, t, unit) for the backward.
inline constexpr int kStepwiseSavedSlots = 5;

struct GatedRnnStepwiseParams {
  GatedRnnCell cell = GatedRnnCell::gru;
  DType dtype = DType::f32;  // wx, R, bias, y, grad_y, grad_wx: all in this dtype
  int64_t batch = 0, steps = 0, hidden = 0;
  const void* wx = nullptr;   // [B, T, G*H]
  const void* R = nullptr;    // [H, G*H] (the backward's grad_h = grad_rh R^T)
  const void* RT = nullptr;   // [G*H, H]: R transposed (launch_transpose), for the forward
  const void* bias = nullptr; // [G*H] or null
  void* y = nullptr;          // [B, T, H]
  float* h_final = nullptr;   // [B, H] or null
  float* c_final = nullptr;   // [B, H] or null (LSTM)
  // Scratch, f32: h [2, B, H] (ping-pong) and c [B, H]; with save, hist
  // [B, T, H] (h_{t-1} of every step) and saved [B, T, kStepwiseSavedSlots, H].
  float* h = nullptr;
  float* c = nullptr;
  float* hist = nullptr;
  float* saved = nullptr;
  // Backward.
  const void* grad_y = nullptr;  // [B, T, H]
  void* grad_wx = nullptr;       // [B, T, G*H]
  float* grad_rh = nullptr;      // [B, T, G*H] scratch, f32
  float* dh = nullptr;           // [B, H] scratch: grad_h_{t-1} carried to the next launch
  float* dh_direct = nullptr;    // [B, H] scratch: its part that bypasses R (GRU z h)
  float* dc = nullptr;           // [B, H] scratch: the LSTM's c carry
};

// The cells and dtypes the baseline has: GRU and LSTM, f32 and bf16.
bool stepwise_supports(GatedRnnCell cell, DType dtype);

// T launches (t = 0 .. T-1); with `save`, fills hist and saved.
cudaError_t launch_stepwise_rnn_forward(const GatedRnnStepwiseParams& p, bool save,
                                        cudaStream_t stream);
// 2T - 1 launches (t = T-1 .. 0), from hist and saved as the forward with
// save left them; writes grad_wx and grad_rh.
cudaError_t launch_stepwise_rnn_backward(const GatedRnnStepwiseParams& p, cudaStream_t stream);

// RT [cols, rows] = R [rows, cols] transposed; f32 or bf16.
cudaError_t launch_transpose(const void* R, void* RT, int64_t rows, int64_t cols, DType dtype,
                             cudaStream_t stream);

// A device-wide handoff through L2, measured: two blocks on different
// multiprocessors pass a flag back and forth `trips` times (one cooperative
// launch). Writes the elapsed device time in us to *us.
cudaError_t measure_flag_trips(int trips, cudaStream_t stream, double* us);

// A kernel of independent f32 FMAs filling every multiprocessor; writes the
// rate in FLOP/s (2 per FMA) to *flops.
cudaError_t measure_fma_rate(cudaStream_t stream, double* flops);

}  // namespace exphil::bench
