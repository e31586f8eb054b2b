// The one-launch-per-timestep baseline: each launch advances every (b, h)
// channel by one step, reading its state from device memory and writing it
// back, exactly the dataflow of a timestep-unrolled graph. It uses the same
// op coefficient maps as the fused kernels, so only the schedule differs.
#include "bench_kernels.h"

#include "common/dtype.cuh"
#include "common/state_io.cuh"
#include "scan/scan_ops.cuh"

namespace exphil::bench {

using namespace exphil::kernels;

namespace {

template <class Op, class Elem>
__global__ void stepwise_forward_kernel(const ScanForwardParams p, float* __restrict__ state,
                                        int64_t t) {
  const int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  const int64_t H = p.shape.width, T = p.shape.steps;
  if (i >= p.shape.batch * H) return;
  const int64_t b = i / H, h = i % H;
  const int64_t at = (b * T + t) * H + h;
  float x[Op::kInputs];
  for (int k = 0; k < Op::kInputs; ++k) x[k] = to_float(static_cast<const Elem*>(p.d_inputs[k])[at]);
  float a, c;
  Op::coefficients(x, a, c);
  const float prev = t > 0 ? state[i] : (p.d_h0 ? load_state(p.d_h0, p.h0_dtype, i) : 0.0f);
  const float next = a * prev + c;
  static_cast<Elem*>(p.d_y)[at] = from_float<Elem>(next);
  state[i] = next;
  if (t == T - 1 && p.d_h_final) store_state(p.d_h_final, p.h_final_dtype, i, next);
}

template <class Op, class Elem>
__global__ void stepwise_backward_kernel(const ScanBackwardParams p, float* __restrict__ carry,
                                         int64_t t) {
  const int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  const int64_t H = p.shape.width, T = p.shape.steps;
  if (i >= p.shape.batch * H) return;
  const int64_t b = i / H, h = i % H;
  const int64_t at = (b * T + t) * H + h;
  float x[Op::kInputs], dx[Op::kInputs];
  for (int k = 0; k < Op::kInputs; ++k) x[k] = to_float(static_cast<const Elem*>(p.d_inputs[k])[at]);
  float a, c;
  Op::coefficients(x, a, c);
  const float from_later =
      t < T - 1 ? carry[i] : (p.d_grad_h_final ? load_state(p.d_grad_h_final, p.grad_h_final_dtype, i) : 0.0f);
  const float g = to_float(static_cast<const Elem*>(p.d_grad_y)[at]) + from_later;
  const float prev = t > 0 ? to_float(static_cast<const Elem*>(p.d_y)[at - H])
                           : (p.d_h0 ? load_state(p.d_h0, p.h0_dtype, i) : 0.0f);
  Op::input_gradients(x, prev, g, dx);
  for (int k = 0; k < Op::kInputs; ++k)
    static_cast<Elem*>(p.d_grad_inputs[k])[at] = from_float<Elem>(dx[k]);
  carry[i] = a * g;
  if (t == 0 && p.d_grad_h0) store_state(p.d_grad_h0, p.grad_h0_dtype, i, a * g);
}

constexpr int kThreads = 256;

template <class Op, class Elem>
cudaError_t forward_steps(const ScanForwardParams& p, float* state, cudaStream_t s) {
  const auto blocks = static_cast<unsigned>((p.shape.batch * p.shape.width + kThreads - 1) / kThreads);
  for (int64_t t = 0; t < p.shape.steps; ++t) {
    stepwise_forward_kernel<Op, Elem><<<blocks, kThreads, 0, s>>>(p, state, t);
    if (const cudaError_t e = cudaGetLastError(); e != cudaSuccess) return e;
  }
  return cudaSuccess;
}

template <class Op, class Elem>
cudaError_t backward_steps(const ScanBackwardParams& p, float* carry, cudaStream_t s) {
  const auto blocks = static_cast<unsigned>((p.shape.batch * p.shape.width + kThreads - 1) / kThreads);
  for (int64_t t = p.shape.steps - 1; t >= 0; --t) {
    stepwise_backward_kernel<Op, Elem><<<blocks, kThreads, 0, s>>>(p, carry, t);
    if (const cudaError_t e = cudaGetLastError(); e != cudaSuccess) return e;
  }
  return cudaSuccess;
}

template <template <class, class> class F, class Params>
cudaError_t dispatch(ScanOp op, DType dtype, const Params& p, float* scratch, cudaStream_t s) {
  const bool bf16 = dtype == DType::bf16;
  if (dtype != DType::f32 && !bf16) return cudaErrorNotSupported;
  switch (op) {
    case ScanOp::linear_scan:
      return bf16 ? F<LinearScanOp, __nv_bfloat16>::run(p, scratch, s) : F<LinearScanOp, float>::run(p, scratch, s);
    case ScanOp::min_gru:
      return bf16 ? F<MinGruOp, __nv_bfloat16>::run(p, scratch, s) : F<MinGruOp, float>::run(p, scratch, s);
    case ScanOp::min_lstm:
      return bf16 ? F<MinLstmOp, __nv_bfloat16>::run(p, scratch, s) : F<MinLstmOp, float>::run(p, scratch, s);
    case ScanOp::liquid:
      return bf16 ? F<LiquidOp, __nv_bfloat16>::run(p, scratch, s) : F<LiquidOp, float>::run(p, scratch, s);
    // Not benchmarked: Edifice's conventions, the kernels of the ops above
    // with another coefficient map.
    case ScanOp::min_gru_activated:
    case ScanOp::min_lstm_activated:
    case ScanOp::diag_linear:
    case ScanOp::elu_gru: return cudaErrorNotSupported;
  }
  return cudaErrorNotSupported;
}

template <class Op, class Elem> struct ForwardSteps {
  static cudaError_t run(const ScanForwardParams& p, float* scratch, cudaStream_t s) {
    return forward_steps<Op, Elem>(p, scratch, s);
  }
};
template <class Op, class Elem> struct BackwardSteps {
  static cudaError_t run(const ScanBackwardParams& p, float* scratch, cudaStream_t s) {
    return backward_steps<Op, Elem>(p, scratch, s);
  }
};

__device__ uint64_t mix(uint64_t x) {  // splitmix64
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

template <class Elem>
__global__ void fill_kernel(Elem* d, std::size_t n, float lo, float hi, uint64_t seed) {
  for (std::size_t i = blockIdx.x * static_cast<std::size_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<std::size_t>(gridDim.x) * blockDim.x) {
    const float u = static_cast<float>(mix(seed ^ mix(i)) >> 40) * (1.0f / 16777216.0f);
    d[i] = from_float<Elem>(lo + (hi - lo) * u);
  }
}

__global__ void empty_kernel() {}

}  // namespace

cudaError_t launch_stepwise_forward(ScanOp op, const ScanForwardParams& p, float* d_state,
                                    cudaStream_t stream) {
  return dispatch<ForwardSteps>(op, p.dtype, p, d_state, stream);
}

cudaError_t launch_stepwise_backward(ScanOp op, const ScanBackwardParams& p, float* d_carry,
                                     cudaStream_t stream) {
  return dispatch<BackwardSteps>(op, p.dtype, p, d_carry, stream);
}

cudaError_t fill_uniform(void* d, DType dtype, std::size_t n, float lo, float hi, uint64_t seed,
                         cudaStream_t s) {
  const unsigned blocks = 1024;
  switch (dtype) {
    case DType::f32: fill_kernel<<<blocks, 256, 0, s>>>(static_cast<float*>(d), n, lo, hi, seed); break;
    case DType::f16: fill_kernel<<<blocks, 256, 0, s>>>(static_cast<__half*>(d), n, lo, hi, seed); break;
    case DType::bf16:
      fill_kernel<<<blocks, 256, 0, s>>>(static_cast<__nv_bfloat16*>(d), n, lo, hi, seed);
      break;
  }
  return cudaGetLastError();
}

cudaError_t launch_empty_kernel(cudaStream_t s) {
  empty_kernel<<<1, 32, 0, s>>>();
  return cudaGetLastError();
}

}  // namespace exphil::bench
