#include "gated_rnn_stepwise.h"

#include <algorithm>
#include <vector>

#include "common/dtype.cuh"

namespace exphil::bench {

using kernels::from_float;
using kernels::to_float;

namespace {

constexpr int kForwardWarps = 8;  // hidden units per block of the forward step
constexpr int kBackwardThreads = 256;

__device__ __forceinline__ float sigmoid(float x) { return 1.0f / (1.0f + expf(-x)); }

template <GatedRnnCell kCell>
inline constexpr int kGates = kCell == GatedRnnCell::gru ? 3 : 4;

// One step, t: a warp per (hidden unit u, NB batch rows), its lanes
// splitting k: the G dot products of h_{t-1} with R's columns g * H + u
// (rows of R^T, so the lanes read consecutive k), summed across the warp,
// then lane r updates row r of unit u (every lane holds every sum).
template <class Elem, GatedRnnCell kCell, int NB>
__global__ void __launch_bounds__(kForwardWarps * 32)
    stepwise_rnn_forward_kernel(const GatedRnnStepwiseParams p, int64_t t, bool save) {
  constexpr int G = kGates<kCell>;
  const int H = static_cast<int>(p.hidden);
  const int64_t B = p.batch, T = p.steps, GH = static_cast<int64_t>(G) * H;
  const int lane = static_cast<int>(threadIdx.x & 31);
  const int u = static_cast<int>(blockIdx.x) * kForwardWarps + static_cast<int>(threadIdx.x >> 5);
  if (u >= H) return;  // uniform across the warp
  const int64_t b0 = static_cast<int64_t>(blockIdx.y) * NB;
  const float* h_prev = p.h + (t & 1) * B * H;
  float* h_next = p.h + ((t + 1) & 1) * B * H;
  const Elem* RT = static_cast<const Elem*>(p.RT);
  float acc[G][NB];
#pragma unroll
  for (int g = 0; g < G; ++g)
#pragma unroll
    for (int r = 0; r < NB; ++r) acc[g][r] = 0.0f;
  if (t > 0) {  // h_{-1} = 0: no h0
#pragma unroll 2
    for (int k = lane; k < H; k += 32) {
      float hv[NB];
#pragma unroll
      for (int r = 0; r < NB; ++r) hv[r] = b0 + r < B ? h_prev[(b0 + r) * H + k] : 0.0f;
#pragma unroll
      for (int g = 0; g < G; ++g) {
        const float w = to_float(RT[static_cast<int64_t>(g * H + u) * H + k]);
#pragma unroll
        for (int r = 0; r < NB; ++r) acc[g][r] = fmaf(hv[r], w, acc[g][r]);
      }
    }
#pragma unroll
    for (int g = 0; g < G; ++g)
#pragma unroll
      for (int r = 0; r < NB; ++r)
#pragma unroll
        for (int off = 16; off >= 1; off >>= 1) acc[g][r] += __shfl_xor_sync(0xffffffffu, acc[g][r], off);
  }
  const int64_t b = b0 + lane;
  if (lane >= NB || b >= B) return;
  float sum[G];  // this lane's row (constant indices: the sums stay in registers)
#pragma unroll
  for (int g = 0; g < G; ++g) {
    sum[g] = p.bias ? to_float(static_cast<const Elem*>(p.bias)[g * H + u]) : 0.0f;
#pragma unroll
    for (int r = 0; r < NB; ++r)
      if (r == lane) sum[g] += acc[g][r];
  }
  {
    const int64_t at = b * T + t;
    const Elem* wx = static_cast<const Elem*>(p.wx) + at * GH;
    float* s = save ? p.saved + at * kStepwiseSavedSlots * H : nullptr;
    const float hp = t > 0 ? h_prev[b * H + u] : 0.0f;
    float hn;
    if constexpr (kCell == GatedRnnCell::gru) {
      const float rh_n = sum[2];
      const float rg = sigmoid(to_float(wx[u]) + sum[0]);
      const float z = sigmoid(to_float(wx[H + u]) + sum[1]);
      const float n = tanhf(to_float(wx[2 * H + u]) + rg * rh_n);
      hn = (1.0f - z) * n + z * hp;
      if (s) {
        s[u] = rg;
        s[H + u] = z;
        s[2 * H + u] = n;
        s[3 * H + u] = rh_n;
      }
    } else {
      const float ig = sigmoid(to_float(wx[u]) + sum[0]);
      const float fg = sigmoid(to_float(wx[H + u]) + sum[1]);
      const float gg = tanhf(to_float(wx[2 * H + u]) + sum[2]);
      const float og = sigmoid(to_float(wx[3 * H + u]) + sum[3]);
      const float cp = t > 0 ? p.c[b * H + u] : 0.0f;
      const float c = fg * cp + ig * gg;
      hn = og * tanhf(c);
      p.c[b * H + u] = c;
      if (t == T - 1 && p.c_final) p.c_final[b * H + u] = c;
      if (s) {
        s[u] = ig;
        s[H + u] = fg;
        s[2 * H + u] = gg;
        s[3 * H + u] = og;
        s[4 * H + u] = c;
      }
    }
    static_cast<Elem*>(p.y)[at * H + u] = from_float<Elem>(hn);
    h_next[b * H + u] = hn;
    if (save) p.hist[at * H + u] = hp;
    if (t == T - 1 && p.h_final) p.h_final[b * H + u] = hn;
  }
}

// RT [cols, rows] = R [rows, cols]^T.
template <class Elem>
__global__ void transpose_kernel(const Elem* __restrict__ R, Elem* __restrict__ RT, int64_t rows,
                                 int64_t cols) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < rows * cols;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t j = i / rows, k = i % rows;  // RT[j, k]
    RT[i] = R[k * cols + j];
  }
}

// The gate gradients of step t, a thread per (b, unit): grad_wx, grad_rh,
// the part of grad_h_{t-1} that bypasses R, the LSTM's c carry.
template <class Elem, GatedRnnCell kCell>
__global__ void __launch_bounds__(kBackwardThreads)
    stepwise_rnn_gates_kernel(const GatedRnnStepwiseParams p, int64_t t) {
  constexpr int G = kGates<kCell>;
  const int64_t H = p.hidden, T = p.steps, GH = G * H;
  const int64_t i = static_cast<int64_t>(blockIdx.x) * kBackwardThreads + threadIdx.x;
  if (i >= p.batch * H) return;
  const int64_t b = i / H, u = i % H, at = b * T + t;
  const float dh = to_float(static_cast<const Elem*>(p.grad_y)[at * H + u]) + (t < T - 1 ? p.dh[i] : 0.0f);
  const float* s = p.saved + at * kStepwiseSavedSlots * H;
  Elem* gwx = static_cast<Elem*>(p.grad_wx) + at * GH;
  float* grh = p.grad_rh + at * GH;
  if constexpr (kCell == GatedRnnCell::gru) {
    const float r = s[u], z = s[H + u], n = s[2 * H + u], rhn = s[3 * H + u];
    const float hp = p.hist[at * H + u];
    const float dn = dh * (1.0f - z), dz = dh * (hp - n);
    const float da_n = dn * (1.0f - n * n);
    const float da_r = da_n * rhn * r * (1.0f - r);
    const float da_z = dz * z * (1.0f - z);
    gwx[u] = from_float<Elem>(da_r);
    gwx[H + u] = from_float<Elem>(da_z);
    gwx[2 * H + u] = from_float<Elem>(da_n);
    grh[u] = da_r;
    grh[H + u] = da_z;
    grh[2 * H + u] = da_n * r;
    p.dh_direct[i] = dh * z;
  } else {
    const float ig = s[u], fg = s[H + u], gg = s[2 * H + u], og = s[3 * H + u], c = s[4 * H + u];
    const float cp = t > 0 ? p.saved[((at - 1) * kStepwiseSavedSlots + 4) * H + u] : 0.0f;
    const float tc = tanhf(c);
    const float dc = dh * og * (1.0f - tc * tc) + (t < T - 1 ? p.dc[i] : 0.0f);
    p.dc[i] = dc * fg;
    const float da[4] = {dc * gg * ig * (1.0f - ig), dc * cp * fg * (1.0f - fg),
                         dc * ig * (1.0f - gg * gg), dh * tc * og * (1.0f - og)};
#pragma unroll
    for (int g = 0; g < 4; ++g) {
      gwx[g * H + u] = from_float<Elem>(da[g]);
      grh[g * H + u] = da[g];
    }
    p.dh_direct[i] = 0.0f;
  }
}

// grad_h_{t-1}[b, k] = dh_direct[b, k] + sum_j grad_rh_t[b, j] R[k, j]: a
// warp per (k, NB batch rows), lanes over j (R's row k read once for the NB
// rows).
template <class Elem, int NB>
__global__ void __launch_bounds__(kBackwardThreads)
    stepwise_rnn_dh_kernel(const GatedRnnStepwiseParams p, int64_t t, int gates) {
  const int64_t H = p.hidden, T = p.steps, GH = gates * H, B = p.batch;
  const int64_t warp = (static_cast<int64_t>(blockIdx.x) * kBackwardThreads + threadIdx.x) / 32;
  const int lane = static_cast<int>(threadIdx.x & 31);
  const int64_t groups = (B + NB - 1) / NB;
  if (warp >= H * groups) return;  // uniform across the warp
  const int64_t k = warp % H, b0 = (warp / H) * NB;
  const Elem* Rk = static_cast<const Elem*>(p.R) + k * GH;
  float acc[NB];
#pragma unroll
  for (int r = 0; r < NB; ++r) acc[r] = 0.0f;
  for (int64_t j = lane; j < GH; j += 32) {
    const float w = to_float(Rk[j]);
#pragma unroll
    for (int r = 0; r < NB; ++r)
      if (b0 + r < B) acc[r] = fmaf(p.grad_rh[((b0 + r) * T + t) * GH + j], w, acc[r]);
  }
#pragma unroll
  for (int r = 0; r < NB; ++r) {
#pragma unroll
    for (int off = 16; off >= 1; off >>= 1) acc[r] += __shfl_xor_sync(0xffffffffu, acc[r], off);
    if (lane == 0 && b0 + r < B) p.dh[(b0 + r) * H + k] = acc[r] + p.dh_direct[(b0 + r) * H + k];
  }
}

template <class Elem, GatedRnnCell kCell, int NB>
cudaError_t forward_steps(const GatedRnnStepwiseParams& p, bool save, cudaStream_t s) {
  const dim3 grid(static_cast<unsigned>((p.hidden + kForwardWarps - 1) / kForwardWarps),
                  static_cast<unsigned>((p.batch + NB - 1) / NB));
  for (int64_t t = 0; t < p.steps; ++t) {
    stepwise_rnn_forward_kernel<Elem, kCell, NB><<<grid, kForwardWarps * 32, 0, s>>>(p, t, save);
    if (const cudaError_t e = cudaGetLastError(); e != cudaSuccess) return e;
  }
  return cudaSuccess;
}

template <class Elem, GatedRnnCell kCell, int NB>
cudaError_t backward_steps(const GatedRnnStepwiseParams& p, cudaStream_t s) {
  const int64_t cells = p.batch * p.hidden;
  const auto gate_blocks = static_cast<unsigned>((cells + kBackwardThreads - 1) / kBackwardThreads);
  const int64_t warps = p.hidden * ((p.batch + NB - 1) / NB);
  const auto dh_blocks = static_cast<unsigned>((warps * 32 + kBackwardThreads - 1) / kBackwardThreads);
  for (int64_t t = p.steps - 1; t >= 0; --t) {
    stepwise_rnn_gates_kernel<Elem, kCell><<<gate_blocks, kBackwardThreads, 0, s>>>(p, t);
    if (const cudaError_t e = cudaGetLastError(); e != cudaSuccess) return e;
    if (t == 0) break;  // grad_h0 is not asked for
    stepwise_rnn_dh_kernel<Elem, NB><<<dh_blocks, kBackwardThreads, 0, s>>>(p, t, kGates<kCell>);
    if (const cudaError_t e = cudaGetLastError(); e != cudaSuccess) return e;
  }
  return cudaSuccess;
}

// F<Elem, Cell, NB>::run(p, args...) for the params' cell and dtype, NB 1
// at batch 1, else 8.
template <template <class, GatedRnnCell, int> class F, class... Args>
cudaError_t dispatch(const GatedRnnStepwiseParams& p, Args... args) {
  const bool one = p.batch == 1;
  if (p.dtype == DType::f32) {
    if (p.cell == GatedRnnCell::gru)
      return one ? F<float, GatedRnnCell::gru, 1>::run(p, args...) : F<float, GatedRnnCell::gru, 8>::run(p, args...);
    if (p.cell == GatedRnnCell::lstm)
      return one ? F<float, GatedRnnCell::lstm, 1>::run(p, args...) : F<float, GatedRnnCell::lstm, 8>::run(p, args...);
  } else if (p.dtype == DType::bf16) {
    using bf16 = __nv_bfloat16;
    if (p.cell == GatedRnnCell::gru)
      return one ? F<bf16, GatedRnnCell::gru, 1>::run(p, args...) : F<bf16, GatedRnnCell::gru, 8>::run(p, args...);
    if (p.cell == GatedRnnCell::lstm)
      return one ? F<bf16, GatedRnnCell::lstm, 1>::run(p, args...) : F<bf16, GatedRnnCell::lstm, 8>::run(p, args...);
  }
  return cudaErrorNotSupported;
}

template <class Elem, GatedRnnCell kCell, int NB> struct ForwardSteps {
  static cudaError_t run(const GatedRnnStepwiseParams& p, bool save, cudaStream_t s) {
    return forward_steps<Elem, kCell, NB>(p, save, s);
  }
};
template <class Elem, GatedRnnCell kCell, int NB> struct BackwardSteps {
  static cudaError_t run(const GatedRnnStepwiseParams& p, cudaStream_t s) {
    return backward_steps<Elem, kCell, NB>(p, s);
  }
};

__device__ __forceinline__ void store_relaxed(unsigned* p, unsigned v) {
  asm volatile("st.relaxed.gpu.global.u32 [%0], %1;" ::"l"(p), "r"(v) : "memory");
}
__device__ __forceinline__ unsigned load_relaxed(const unsigned* p) {
  unsigned v;
  asm volatile("ld.relaxed.gpu.global.u32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
  return v;
}

// Block 0 writes the flag on even trips, block 1 on odd ones; each waits
// for the other's value in between.
__global__ void flag_trips_kernel(unsigned* flag, int trips) {
  if (threadIdx.x != 0) return;
  const unsigned me = blockIdx.x;
  for (int i = 0; i < trips; ++i) {
    const unsigned value = static_cast<unsigned>(i) + 1u;
    if ((static_cast<unsigned>(i) & 1u) == me) {
      store_relaxed(flag, value);
    } else {
      while (load_relaxed(flag) != value) {
      }
    }
  }
}

constexpr int kFmaChains = 8;

__global__ void fma_rate_kernel(float* out, int iters, float m, float c) {
  float a[kFmaChains];
#pragma unroll
  for (int j = 0; j < kFmaChains; ++j) a[j] = static_cast<float>(threadIdx.x + j) * 1e-3f;
  for (int i = 0; i < iters; ++i) {
#pragma unroll
    for (int j = 0; j < kFmaChains; ++j) a[j] = fmaf(a[j], m, c);
  }
  float sum = 0.0f;
#pragma unroll
  for (int j = 0; j < kFmaChains; ++j) sum += a[j];
  if (sum == 12345.678f) out[0] = sum;  // never true: keeps the loop
}

struct Events {
  cudaEvent_t a = nullptr, b = nullptr;
  Events() {
    cudaEventCreate(&a);
    cudaEventCreate(&b);
  }
  ~Events() {
    cudaEventDestroy(a);
    cudaEventDestroy(b);
  }
  Events(const Events&) = delete;
  Events& operator=(const Events&) = delete;
};

}  // namespace

bool stepwise_supports(GatedRnnCell cell, DType dtype) {
  return (cell == GatedRnnCell::gru || cell == GatedRnnCell::lstm) &&
         (dtype == DType::f32 || dtype == DType::bf16);
}

cudaError_t launch_stepwise_rnn_forward(const GatedRnnStepwiseParams& p, bool save,
                                        cudaStream_t stream) {
  return dispatch<ForwardSteps>(p, save, stream);
}

cudaError_t launch_stepwise_rnn_backward(const GatedRnnStepwiseParams& p, cudaStream_t stream) {
  return dispatch<BackwardSteps>(p, stream);
}

cudaError_t launch_transpose(const void* R, void* RT, int64_t rows, int64_t cols, DType dtype,
                             cudaStream_t stream) {
  const auto blocks = static_cast<unsigned>(std::min<int64_t>((rows * cols + 255) / 256, 4096));
  if (dtype == DType::f32)
    transpose_kernel<<<blocks, 256, 0, stream>>>(static_cast<const float*>(R), static_cast<float*>(RT), rows, cols);
  else if (dtype == DType::bf16)
    transpose_kernel<<<blocks, 256, 0, stream>>>(static_cast<const __nv_bfloat16*>(R),
                                                 static_cast<__nv_bfloat16*>(RT), rows, cols);
  else
    return cudaErrorNotSupported;
  return cudaGetLastError();
}

cudaError_t measure_flag_trips(int trips, cudaStream_t stream, double* us) {
  int device = 0, per_sm = 0, optin = 0;
  cudaError_t e = cudaGetDevice(&device);
  if (e == cudaSuccess) e = cudaDeviceGetAttribute(&per_sm, cudaDevAttrMaxSharedMemoryPerMultiprocessor, device);
  if (e == cudaSuccess) e = cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, device);
  if (e != cudaSuccess) return e;
  // More than half a multiprocessor's shared memory: the two blocks cannot
  // share one.
  const int shared = std::min(optin, per_sm / 2 + 1024);
  e = cudaFuncSetAttribute(flag_trips_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, shared);
  if (e != cudaSuccess) return e;
  unsigned* flag = nullptr;
  if ((e = cudaMalloc(&flag, sizeof(unsigned))) != cudaSuccess) return e;
  Events ev;
  float ms = 0.0f;
  for (int run = 0; run < 2 && e == cudaSuccess; ++run) {  // the first loads the module
    int n = run == 0 ? 2 : trips;
    void* args[] = {&flag, &n};
    e = cudaMemsetAsync(flag, 0, sizeof(unsigned), stream);
    if (e == cudaSuccess) e = cudaEventRecord(ev.a, stream);
    if (e == cudaSuccess)
      e = cudaLaunchCooperativeKernel(reinterpret_cast<const void*>(flag_trips_kernel), dim3(2), dim3(32),
                                      args, static_cast<std::size_t>(shared), stream);
    if (e == cudaSuccess) e = cudaEventRecord(ev.b, stream);
    if (e == cudaSuccess) e = cudaEventSynchronize(ev.b);
    if (e == cudaSuccess) e = cudaEventElapsedTime(&ms, ev.a, ev.b);
  }
  cudaFree(flag);
  *us = 1000.0 * static_cast<double>(ms);
  return e;
}

cudaError_t measure_fma_rate(cudaStream_t stream, double* flops) {
  int device = 0, sms = 0;
  cudaError_t e = cudaGetDevice(&device);
  if (e == cudaSuccess) e = cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device);
  if (e != cudaSuccess) return e;
  float* out = nullptr;
  if ((e = cudaMalloc(&out, sizeof(float))) != cudaSuccess) return e;
  const int blocks = sms * 8, threads = 256, iters = 16384;
  Events ev;
  std::vector<float> times;
  for (int run = 0; run < 6 && e == cudaSuccess; ++run) {
    e = cudaEventRecord(ev.a, stream);
    fma_rate_kernel<<<blocks, threads, 0, stream>>>(out, iters, 0.9999f, 1e-4f);
    if (e == cudaSuccess) e = cudaGetLastError();
    if (e == cudaSuccess) e = cudaEventRecord(ev.b, stream);
    if (e == cudaSuccess) e = cudaEventSynchronize(ev.b);
    float ms = 0.0f;
    if (e == cudaSuccess) e = cudaEventElapsedTime(&ms, ev.a, ev.b);
    if (run > 0) times.push_back(ms);  // the first loads the module
  }
  cudaFree(out);
  if (e != cudaSuccess) return e;
  std::sort(times.begin(), times.end());
  const double total = 2.0 * kFmaChains * static_cast<double>(iters) * blocks * threads;
  *flops = total / (1e-3 * static_cast<double>(times[times.size() / 2]));
  return cudaSuccess;
}

}  // namespace exphil::bench
