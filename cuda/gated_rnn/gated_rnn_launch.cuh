// Definitions of the per-(dtype, cell) launchers declared in
// gated_rnn_instances.h: the forward's one cooperative launch; the
// backward's recompute product, gates, cooperative reverse walk and weight
// gradient product; the stack's forward and backward. Included only by the
// generated instance files.
#pragma once

#include <algorithm>
#include <atomic>
#include <climits>
#include <cstdint>
#include <type_traits>

#include <cuda_runtime.h>

#include "common/dynamic_shared_memory.h"
#include "gated_rnn/gated_rnn_backward.cuh"
#include "gated_rnn/gated_rnn_backward_stack.cuh"
#include "gated_rnn/gated_rnn_forward.cuh"
#include "gated_rnn/gated_rnn_forward_k_split.cuh"
#include "gated_rnn/gated_rnn_forward_stack.cuh"
#include "gated_rnn/gated_rnn_forward_stack_blocks.cuh"
#include "gated_rnn/gated_rnn_forward_unit_warps.cuh"
#include "gated_rnn/gated_rnn_instances.h"

namespace exphil::kernels {
namespace gated_rnn_launch {

// The persistent kernels' blocks wait on each other, so all must be
// resident at once: blocks <= blocks per SM x SMs. The occupancy API answers
// per kernel, block size and shared memory; its last answer for a kernel is
// kept (device, threads, bytes and the answer packed in one word), so that
// a call with the plan of the last one makes no driver call.
struct PersistentKernelCache {
  std::atomic<uint64_t> shared_allowed{0};  // allow_dynamic_shared_once's devices
  std::atomic<uint64_t> occupancy{0};       // 0: nothing kept
};

template <class Kernel>
cudaError_t blocks_per_sm(Kernel kernel, PersistentKernelCache& cache, int threads,
                          int shared_bytes, int& out) {
  int device = 0;
  if (const cudaError_t e = cudaGetDevice(&device); e != cudaSuccess) return e;
  // device + 1 (8 bits) | threads (12) | bytes (24) | answer (16); larger
  // values are never kept.
  const bool keepable = device < 255 && threads < (1 << 12) && shared_bytes < (1 << 24);
  const uint64_t key = (static_cast<uint64_t>(device + 1) << 56) |
                       (static_cast<uint64_t>(threads) << 44) |
                       (static_cast<uint64_t>(shared_bytes) << 20);
  const uint64_t kept = cache.occupancy.load(std::memory_order_acquire);
  if (keepable && (kept & ~uint64_t{0xFFFFF}) == key) {
    out = static_cast<int>(kept & 0xFFFF);
    return cudaSuccess;
  }
  if (const cudaError_t e = cudaOccupancyMaxActiveBlocksPerMultiprocessor(
          &out, kernel, threads, static_cast<std::size_t>(shared_bytes));
      e != cudaSuccess)
    return e;
  if (keepable && out >= 0 && out < (1 << 16))
    cache.occupancy.store(key | static_cast<uint64_t>(out), std::memory_order_release);
  return cudaSuccess;
}

// Opts `kernel` in to the device's largest dynamic shared memory (once per
// device), then checks that all `blocks` can be resident at once, as
// grid.sync() needs, and launches it cooperatively. The device's numbers
// come with the plan (read once per device by the runtime).
template <class Kernel, class Params>
LaunchResult launch_persistent(Kernel kernel, PersistentKernelCache& cache, const Params& params,
                               const GatedRnnPlan& plan, float* ws, cudaStream_t stream,
                               const char* name) {
  if (plan.shared_bytes > plan.device.max_shared_per_block)
    return {cudaErrorInvalidConfiguration, "gated RNN plan (shared memory above the device's)"};
  if (const cudaError_t e =
          allow_dynamic_shared_once(kernel, plan.device.max_shared_per_block, cache.shared_allowed);
      e != cudaSuccess)
    return {e, "cudaFuncSetAttribute (gated RNN persistent kernel shared memory)"};
  int per_sm = 0;
  if (const cudaError_t e = blocks_per_sm(kernel, cache, plan.threads, plan.shared_bytes, per_sm);
      e != cudaSuccess)
    return {e, "cudaOccupancyMaxActiveBlocksPerMultiprocessor (gated RNN)"};
  if (static_cast<int64_t>(per_sm) * plan.device.sm_count < plan.blocks)
    return {cudaErrorCooperativeLaunchTooLarge,
            "gated RNN co-residency check (its blocks cannot all be resident)"};
  Params p = params;
  GatedRnnPlan pl = plan;
  float* w = ws;
  void* args[] = {&p, &pl, &w};
  if (const cudaError_t e = cudaLaunchCooperativeKernel(
          reinterpret_cast<const void*>(kernel), dim3(static_cast<unsigned>(plan.blocks)),
          dim3(static_cast<unsigned>(plan.threads)), args,
          static_cast<std::size_t>(plan.shared_bytes), stream);
      e != cudaSuccess)
    return {e, name};
  EXPHIL_RETURN_IF_LAUNCH_FAILED("gated RNN persistent kernel");
  return {};
}

// A k-split-layout kernel (one layer's or the stack's) in the instance the
// plan's stored columns name: 8 or 16, those gated_rnn_k_split_columns
// admits (the plan's check).
template <class Kernel, class Params>
LaunchResult launch_k_split(Kernel columns8, Kernel columns16, PersistentKernelCache (&caches)[2],
                            const Params& params, const GatedRnnPlan& plan, float* ws,
                            cudaStream_t stream, const char* name) {
  return plan.stored_columns == 8
             ? launch_persistent(columns8, caches[0], params, plan, ws, stream, name)
             : launch_persistent(columns16, caches[1], params, plan, ws, stream, name);
}

inline unsigned gemm_tiles(int64_t n, int64_t tile) { return static_cast<unsigned>((n + tile - 1) / tile); }

// C = A B through gated_rnn_gemm.cuh on tensor cores (kTensorCores) or
// CUDA cores: gemm_launch one grid of `splits` slices along k, gemm_split
// the whole product, its slices' sums (splits * M * N floats of workspace)
// then added in order. On tensor cores, where both operands' rows are bf16
// values that 16-byte copies can take, the asynchronous kernel (the same
// sums, bitwise), else the register-staged one.
template <bool kTensorCores, class ALoad, class BLoad, class Store>
LaunchResult gemm_launch(int64_t M, int64_t N, int64_t K, int64_t per_split, unsigned splits,
                         const ALoad& a, const BLoad& b, const Store& c, cudaStream_t stream) {
  const dim3 grid(gemm_tiles(M, kGatedRnnGemmTileM), gemm_tiles(N, kGatedRnnGemmTileN), splits);
  if constexpr (kTensorCores && GatedRnnGemmAsyncLoader<ALoad>::value &&
                GatedRnnGemmAsyncLoader<BLoad>::value) {
    // (Runs of 8 along k, for an A contiguous in k, and along n.)
    if ((!ALoad::kContiguousK || K % 8 == 0) && N % 8 == 0 && a.async_rows() && b.async_rows()) {
      constexpr int bytes =
          GatedRnnGemmAsyncLayout<ALoad::kContiguousK, GatedRnnGemmF32Rows<ALoad>::value,
                                  GatedRnnGemmF32Rows<BLoad>::value>::kBytes;
      const auto kernel = gated_rnn_gemm_async_kernel<ALoad, BLoad, Store>;
      if constexpr (bytes > 48 * 1024) {
        static std::atomic<uint64_t> allowed{0};
        if (const cudaError_t e = allow_dynamic_shared_once(kernel, bytes, allowed); e != cudaSuccess)
          return {e, "cudaFuncSetAttribute (gated_rnn_gemm_async_kernel shared memory)"};
      }
      kernel<<<grid, kGatedRnnThreads, bytes, stream>>>(M, N, K, per_split, a, b, c);
      EXPHIL_RETURN_IF_LAUNCH_FAILED("gated_rnn_gemm_async_kernel");
      return {};
    }
  }
  if constexpr (kTensorCores) {
    gated_rnn_gemm_tc_kernel<<<grid, kGatedRnnThreads, 0, stream>>>(M, N, K, per_split, a, b, c);
    EXPHIL_RETURN_IF_LAUNCH_FAILED("gated_rnn_gemm_tc_kernel");
  } else {
    gated_rnn_gemm_kernel<<<grid, kGatedRnnThreads, 0, stream>>>(M, N, K, per_split, a, b, c);
    EXPHIL_RETURN_IF_LAUNCH_FAILED("gated_rnn_gemm_kernel");
  }
  return {};
}

template <bool kTensorCores, class ALoad, class BLoad, class CStore>
LaunchResult gemm_split(int64_t M, int64_t N, int64_t K, const ALoad& a, const BLoad& b,
                        const CStore& c, int splits, float* partial, cudaStream_t stream) {
  if (M <= 0 || N <= 0) return {};
  if (splits <= 1) return gemm_launch<kTensorCores>(M, N, K, K, 1, a, b, c, stream);
  const int64_t depth = kTensorCores ? kGatedRnnGemmTcDepth : kGatedRnnGemmDepth;
  const int64_t per_split = (K + splits * depth - 1) / (splits * depth) * depth;
  if (const LaunchResult r =
          gemm_launch<kTensorCores>(M, N, K, per_split, static_cast<unsigned>(splits), a, b,
                                    GatedRnnGemmPartialStore{partial, M, N}, stream);
      !r.ok())
    return r;
  const auto blocks = static_cast<unsigned>(
      std::clamp<int64_t>((M * N + kGatedRnnThreads - 1) / kGatedRnnThreads, 1, 65535));
  gated_rnn_gemm_reduce_kernel<<<blocks, kGatedRnnThreads, 0, stream>>>(M, N, splits, partial, c);
  EXPHIL_RETURN_IF_LAUNCH_FAILED("gated_rnn_gemm_reduce_kernel");
  return {};
}

// A product on tensor cores where `tensor_cores` says, else on CUDA cores.
// The tensor-core kernels are built for 16-bit sequences and, in f32, for
// an A of f32 rows (the backward's two products: GatedRnnLaunchOptions::
// f32_tensor_cores); the stack's f32 projections take CUDA cores.
template <class Elem, class ALoad, class BLoad, class CStore>
LaunchResult gemm_product(bool tensor_cores, int64_t M, int64_t N, int64_t K, const ALoad& a,
                          const BLoad& b, const CStore& c, int splits, float* partial,
                          cudaStream_t stream) {
  if constexpr (sizeof(Elem) == 2 || GatedRnnGemmF32Rows<ALoad>::value)
    if (tensor_cores) return gemm_split<true>(M, N, K, a, b, c, splits, partial, stream);
  return gemm_split<false>(M, N, K, a, b, c, splits, partial, stream);
}

}  // namespace gated_rnn_launch

template <class Elem, GatedRnnCell kCell>
LaunchResult run_gated_rnn_forward(const GatedRnnForwardParams& params, const GatedRnnPlan& plan,
                                   float* d_workspace, cudaStream_t stream) {
  clear_stale_launch_error();
  static gated_rnn_launch::PersistentKernelCache resident[2], streamed[2], tensor_cores[2],
      unit_warps, k_split[2];
  using Product = GatedRnnForwardProduct;
  // The block layout's kernel for `product`, with or without pair words.
  const auto block_layout = [&](auto product, gated_rnn_launch::PersistentKernelCache (&caches)[2],
                                const char* what) {
    constexpr Product kProduct = decltype(product)::value;
    if (plan.pair_exchange)
      return gated_rnn_launch::launch_persistent(
          gated_rnn_forward_kernel<Elem, kCell, kProduct, true>, caches[1], params, plan,
          d_workspace, stream, what);
    return gated_rnn_launch::launch_persistent(
        gated_rnn_forward_kernel<Elem, kCell, kProduct, false>, caches[0], params, plan,
        d_workspace, stream, what);
  };
  if (plan.k_split)
    return gated_rnn_launch::launch_k_split(
        gated_rnn_forward_k_split_kernel<Elem, kCell, 8>,
        gated_rnn_forward_k_split_kernel<Elem, kCell, 16>, k_split, params, plan, d_workspace,
        stream, "cudaLaunchCooperativeKernel (gated_rnn_forward_k_split_kernel)");
  if (plan.unit_warps)
    return gated_rnn_launch::launch_persistent(
        gated_rnn_forward_unit_warps_kernel<Elem, kCell>, unit_warps, params, plan, d_workspace,
        stream, "cudaLaunchCooperativeKernel (gated_rnn_forward_unit_warps_kernel)");
  if (plan.tensor_cores) {
    // The planner's condition, checked again against the operands: the
    // fragments are R's own 16-bit words, or an f32 R's f16 (GRU and LSTM:
    // the sLSTM's f32 instance of this kernel is not built).
    if constexpr (sizeof(Elem) == 2 || kCell != GatedRnnCell::slstm) {
      if (params.weight_dtype == params.dtype)
        return block_layout(std::integral_constant<Product, Product::tensor_cores>{}, tensor_cores,
                            "cudaLaunchCooperativeKernel (gated_rnn_forward_kernel, tensor cores)");
    }
    return {cudaErrorInvalidValue,
            "gated RNN plan (the tensor-core product needs R and the sequence both bf16, both "
            "f16, or both f32 in a GRU or LSTM)"};
  }
  if (plan.resident_weights)
    return block_layout(std::integral_constant<Product, Product::resident>{}, resident,
                        "cudaLaunchCooperativeKernel (gated_rnn_forward_kernel, resident)");
  return block_layout(std::integral_constant<Product, Product::streamed>{}, streamed,
                      "cudaLaunchCooperativeKernel (gated_rnn_forward_kernel, streamed)");
}

// The stack layer by layer (plan.stack_depth == 0): each layer's forward in
// the plan, the input projection of each layer above the first into the
// workspace first, and each lower layer's y where the caller asked for it,
// else in the workspace (two buffers, a layer's input and its output).
template <class Elem, GatedRnnCell kCell>
LaunchResult run_gated_rnn_layers_forward(const GatedRnnStackParams& params, const GatedRnnPlan& plan,
                                          float* d_workspace, cudaStream_t stream) {
  using namespace gated_rnn_launch;
  const GatedRnnForwardParams& f0 = params.layer[0];
  const int64_t M = f0.shape.batch * f0.shape.steps, H = f0.shape.hidden;
  const int64_t GH = kGatedRnnGates<kCell> * H;
  Elem* const wx = reinterpret_cast<Elem*>(d_workspace + plan.ws_stack_wx);
  Elem* const spare[2] = {reinterpret_cast<Elem*>(d_workspace + plan.ws_stack_y),
                          reinterpret_cast<Elem*>(d_workspace + plan.ws_stack_y + M * H)};
  const void* below = nullptr;
  for (int l = 0; l < params.layers; ++l) {
    GatedRnnForwardParams f = params.layer[l];
    if (l > 0) {
      const gated_rnn_stack::SequenceRows<Elem> a{static_cast<const Elem*>(below), H};
      const GatedRnnWeightB b{params.d_W[l], f.weight_dtype, GH};
      const gated_rnn_stack::ProjectionStore<Elem> c{wx, params.d_W_bias[l], f.weight_dtype, GH};
      if (const LaunchResult r =
              gemm_product<Elem>(plan.gemm_tensor_cores, M, GH, H, a, b, c, 1, nullptr, stream);
          !r.ok())
        return r;
      f.d_wx = wx;
    }
    if (!f.d_y) f.d_y = spare[l & 1];
    if (const LaunchResult r = run_gated_rnn_forward<Elem, kCell>(f, plan, d_workspace, stream); !r.ok())
      return r;
    below = f.d_y;
  }
  return {};
}

template <class Elem, GatedRnnCell kCell>
LaunchResult run_gated_rnn_stack_forward(const GatedRnnStackParams& params,
                                         const GatedRnnPlan& plan, float* d_workspace,
                                         cudaStream_t stream) {
  clear_stale_launch_error();
  if constexpr (kCell == GatedRnnCell::gru || kCell == GatedRnnCell::lstm) {
    if (plan.stack_depth == 0) return run_gated_rnn_layers_forward<Elem, kCell>(params, plan, d_workspace, stream);
    if (!plan.k_split) {
      static gated_rnn_launch::PersistentKernelCache blocks;
      return gated_rnn_launch::launch_persistent(
          gated_rnn_forward_stack_blocks_kernel<Elem, kCell>, blocks, params, plan, d_workspace,
          stream, "cudaLaunchCooperativeKernel (gated_rnn_forward_stack_blocks_kernel)");
    }
    static gated_rnn_launch::PersistentKernelCache caches[2];
    return gated_rnn_launch::launch_k_split(
        gated_rnn_forward_stack_kernel<Elem, kCell, 8>,
        gated_rnn_forward_stack_kernel<Elem, kCell, 16>, caches, params, plan, d_workspace, stream,
        "cudaLaunchCooperativeKernel (gated_rnn_forward_stack_kernel)");
  } else {
    return {cudaErrorInvalidValue, "gated RNN stack (GRU and LSTM layers only)"};
  }
}

template <class Elem, GatedRnnCell kCell>
LaunchResult run_gated_rnn_backward(const GatedRnnBackwardParams& params, const GatedRnnPlan& plan,
                                    float* d_workspace, cudaStream_t stream) {
  using namespace gated_rnn_launch;
  clear_stale_launch_error();
  constexpr int G = kGatedRnnGates<kCell>;
  const GatedRnnForwardParams& f = params.fwd;
  const int64_t B = f.shape.batch, T = f.shape.steps, H = f.shape.hidden;
  const int64_t GH = G * H;
  const bool narrow = B * T <= INT32_MAX;
  const GatedRnnPrevState<Elem> prev{static_cast<const Elem*>(f.d_y), f.d_h0, f.state_dtype, T, H,
                                      narrow, narrow ? FastDivisor(static_cast<uint32_t>(T)) : FastDivisor()};

  // The products on tensor cores where the plan says.
  const auto product = [&](int64_t M, int64_t N, int64_t K, const auto& a, const auto& b,
                           const auto& c, int splits) {
    return gemm_product<Elem>(plan.gemm_tensor_cores, M, N, K, a, b, c, splits,
                              d_workspace + plan.ws_split, stream);
  };

  // 1. rh = h_{t-1} R + bias for every step; 2. the gates (and the LSTM's c).
  if (plan.backward_steps & 1) {
    const GatedRnnRecomputeStore rh{d_workspace + plan.ws_rh, f.d_bias, f.weight_dtype, GH};
    // (An f32 sequence's R is f32: rows the asynchronous kernel can copy.)
    LaunchResult r;
    if constexpr (std::is_same_v<Elem, float>)
      r = product(B * T, GH, H, GatedRnnRecomputeA<Elem>{prev},
                  GatedRnnF32RowsB{static_cast<const float*>(f.d_R), GH}, rh, plan.recompute_splits);
    else
      r = product(B * T, GH, H, GatedRnnRecomputeA<Elem>{prev},
                  GatedRnnWeightB{f.d_R, f.weight_dtype, GH}, rh, plan.recompute_splits);
    if (!r.ok()) return r;

    if constexpr (kCell == GatedRnnCell::lstm) {
      // 32 columns a block, a warp for each chunk of a window (no more than
      // T has).
      const auto warps = static_cast<unsigned>(std::clamp<int64_t>(
          (T + kGatedRnnGatesChunk - 1) / kGatedRnnGatesChunk, 1, kGatedRnnLstmGatesWarps));
      const auto blocks = static_cast<unsigned>(std::clamp<int64_t>((B * H + 31) / 32, 1, 65535));
      gated_rnn_lstm_gates_kernel<Elem>
          <<<blocks, dim3(32, warps), 0, stream>>>(params, plan, d_workspace);
      EXPHIL_RETURN_IF_LAUNCH_FAILED("gated_rnn_lstm_gates_kernel");
    } else {
      // The sLSTM's walks (a thread per (b, unit)) in blocks small enough
      // to reach every multiprocessor: at B32 H256 blocks of 256 threads
      // took 32 of them, each stepping 8 warps' walks.
      const int64_t items = kCell == GatedRnnCell::gru ? B * T * H : B * H;
      int threads = kGatedRnnThreads;
      if constexpr (kCell != GatedRnnCell::gru)
        while (threads > 32 && (items + threads - 1) / threads < plan.device.sm_count) threads /= 2;
      const auto blocks =
          static_cast<unsigned>(std::clamp<int64_t>((items + threads - 1) / threads, 1, 65535));
      gated_rnn_gates_kernel<Elem, kCell><<<blocks, threads, 0, stream>>>(params, plan, d_workspace);
      EXPHIL_RETURN_IF_LAUNCH_FAILED("gated_rnn_gates_kernel");
    }
  }

  // 3. The reverse walk, its part product on tensor cores where the plan
  // says (16-bit sequences with bf16 weights; f32 with f32 weights, split,
  // in a GRU or LSTM: the sLSTM's f32 instance of that walk is not built).
  if (plan.backward_steps & 2) {
    static PersistentKernelCache resident, streamed, tensor_cores;
    LaunchResult walk;
    if (plan.walk_tensor_cores) {
      constexpr bool kF32 = sizeof(Elem) == 4;
      if constexpr (!kF32 || kCell != GatedRnnCell::slstm) {
        if (params.fwd.weight_dtype != (kF32 ? DType::f32 : DType::bf16) ||
            plan.walk_split_weights != kF32)
          return {cudaErrorInvalidValue,
                  "gated RNN plan (the walk's tensor-core product takes bf16 weights, or f32 "
                  "weights split in an f32 sequence)"};
        walk = launch_persistent(gated_rnn_backward_kernel<Elem, kCell, true, true>, tensor_cores,
                                 params, plan, d_workspace, stream,
                                 "cudaLaunchCooperativeKernel (gated_rnn_backward_kernel, tensor cores)");
      } else {
        return {cudaErrorInvalidValue,
                "gated RNN plan (the sLSTM's walk on tensor cores takes a 16-bit sequence)"};
      }
    } else if (plan.resident_weights) {
      walk = launch_persistent(gated_rnn_backward_kernel<Elem, kCell, true>, resident, params, plan,
                               d_workspace, stream,
                               "cudaLaunchCooperativeKernel (gated_rnn_backward_kernel, resident)");
    } else {
      walk = launch_persistent(gated_rnn_backward_kernel<Elem, kCell, false>, streamed, params, plan,
                               d_workspace, stream,
                               "cudaLaunchCooperativeKernel (gated_rnn_backward_kernel, streamed)");
    }
    if (!walk.ok()) return walk;
  }

  // 4. grad_R (rows 0..H-1) and grad_bias (row H), only those asked for.
  if ((plan.backward_steps & 4) && (params.d_grad_R || params.d_grad_bias)) {
    const int64_t first = params.d_grad_R ? 0 : H;
    const int64_t rows = (params.d_grad_bias ? H + 1 : H) - first;
    const GatedRnnWeightGradStore store{params.d_grad_R, params.d_grad_bias, f.weight_dtype, H, GH,
                                        first};
    // grad_rh as the walk stored it (GatedRnnPlan::grad_rh_bf16).
    const auto grad_rh = [&](const auto& rows_of_grad_rh) {
      return product(rows, GH, B * T, GatedRnnWeightGradA<Elem>{prev, first}, rows_of_grad_rh,
                     store, plan.weight_grad_splits);
    };
    const GatedRnnF32RowsB f32_rows{d_workspace + plan.ws_rh, GH};
    LaunchResult r;
    if constexpr (std::is_same_v<Elem, __nv_bfloat16>)
      r = plan.grad_rh_bf16 ? grad_rh(gated_rnn_stack::SequenceRows<Elem>{
                                  reinterpret_cast<const Elem*>(d_workspace + plan.ws_rh), GH})
                            : grad_rh(f32_rows);
    else
      r = grad_rh(f32_rows);
    if (!r.ok()) return r;
  }
  return {};
}

namespace gated_rnn_launch {

// The stack's backward, layer l > 0: its input projection again, wx =
// y_{l-1} W_l + W_bias_l [M, G*H] in the sequence dtype.
template <class Elem>
LaunchResult stack_projection(const GatedRnnStackBackwardParams& params, int l, Elem* wx,
                              bool tensor_cores, int splits, float* partial, cudaStream_t stream) {
  const GatedRnnForwardParams& f = params.layer[l].fwd;
  const int64_t M = f.shape.batch * f.shape.steps, H = f.shape.hidden;
  const int64_t GH = gated_rnn_gates(f.cell) * H;
  return gemm_product<Elem>(
      tensor_cores, M, GH, H,
      gated_rnn_stack::SequenceRows<Elem>{static_cast<const Elem*>(params.layer[l - 1].fwd.d_y), H},
      GatedRnnWeightB{params.d_W[l], f.weight_dtype, GH},
      gated_rnn_stack::ProjectionStore<Elem>{wx, params.d_W_bias[l], f.weight_dtype, GH}, splits,
      partial, stream);
}

// Layer l > 0: grad_W_l (rows 0..H-1) and grad_W_bias_l (row H) from its
// grad_wx [M, G*H], those asked for.
template <class Elem>
LaunchResult stack_input_weight_grads(const GatedRnnStackBackwardParams& params, int l,
                                      const Elem* grad_wx, bool tensor_cores, int splits,
                                      float* partial, cudaStream_t stream) {
  if (!params.d_grad_W[l] && !params.d_grad_W_bias[l]) return {};
  const GatedRnnForwardParams& f = params.layer[l].fwd;
  const int64_t M = f.shape.batch * f.shape.steps, H = f.shape.hidden;
  const int64_t GH = gated_rnn_gates(f.cell) * H;
  const int64_t first = params.d_grad_W[l] ? 0 : H;
  const int64_t rows = (params.d_grad_W_bias[l] ? H + 1 : H) - first;
  return gemm_product<Elem>(
      tensor_cores, rows, GH, M,
      gated_rnn_stack::InputGradA<Elem>{static_cast<const Elem*>(params.layer[l - 1].fwd.d_y), H, first},
      gated_rnn_stack::SequenceRows<Elem>{grad_wx, GH},
      GatedRnnWeightGradStore{params.d_grad_W[l], params.d_grad_W_bias[l], f.weight_dtype, H, GH,
                              first},
      splits, partial, stream);
}

}  // namespace gated_rnn_launch

// The stack's reverse wavefront (plan.stack_depth > 0,
// gated_rnn_backward_stack.cuh): per layer, in its one-layer plan and
// workspace, the input projection again (l > 0), the recompute product and
// the gates; then every layer's walk in one launch; then per layer grad_R
// and grad_bias, and grad_W and grad_W_bias (l > 0), those asked for.
template <class Elem, GatedRnnCell kCell>
LaunchResult run_gated_rnn_stack_backward_wavefront(const GatedRnnStackBackwardParams& params,
                                                    const GatedRnnPlan& plan, float* d_workspace,
                                                    cudaStream_t stream) {
  using namespace gated_rnn_launch;
  const GatedRnnForwardParams& f0 = params.layer[0].fwd;
  const int64_t M = f0.shape.batch * f0.shape.steps;
  const int64_t GH = kGatedRnnGates<kCell> * f0.shape.hidden;
  const int L = params.layers;
  Elem* const wx = reinterpret_cast<Elem*>(d_workspace + plan.ws_stack_wx);       // [L-1, M, GH]
  Elem* const grad_wx = reinterpret_cast<Elem*>(d_workspace + plan.ws_stack_grad_wx);
  GatedRnnStackBackwardParams q = params;
  for (int l = 0; l < L; ++l) {
    GatedRnnPlan lp = gated_rnn_stack_layer_plan(plan, l);
    GatedRnnBackwardParams& layer = q.layer[l];
    if (l > 0) {
      layer.fwd.d_wx = wx + (l - 1) * M * GH;
      layer.d_grad_wx = grad_wx + (l - 1) * M * GH;
      if (const LaunchResult r =
              stack_projection(params, l, wx + (l - 1) * M * GH, plan.gemm_tensor_cores,
                               lp.recompute_splits, d_workspace + lp.ws_split, stream);
          !r.ok())
        return r;
    }
    lp.backward_steps = 1;
    if (const LaunchResult r = run_gated_rnn_backward<Elem, kCell>(layer, lp, d_workspace, stream); !r.ok())
      return r;
  }
  static PersistentKernelCache walk;
  if (const LaunchResult r = launch_persistent(
          gated_rnn_backward_stack_kernel<Elem, kCell>, walk, q, plan, d_workspace, stream,
          "cudaLaunchCooperativeKernel (gated_rnn_backward_stack_kernel)");
      !r.ok())
    return r;
  for (int l = 0; l < L; ++l) {
    GatedRnnPlan lp = gated_rnn_stack_layer_plan(plan, l);
    lp.backward_steps = 4;
    if (const LaunchResult r = run_gated_rnn_backward<Elem, kCell>(q.layer[l], lp, d_workspace, stream);
        !r.ok())
      return r;
    if (l > 0)
      if (const LaunchResult r = stack_input_weight_grads(
              params, l, grad_wx + (l - 1) * M * GH, plan.gemm_tensor_cores,
              lp.weight_grad_splits, d_workspace + lp.ws_split, stream);
          !r.ok())
        return r;
  }
  return {};
}

// The stack's backward, from the top layer down
// (gated_rnn_backward_stack.cuh gives the algorithm): each layer's backward
// in the one plan, its workspace reused; before it, the layer's input
// projection again (l > 0); after it, grad_W and grad_W_bias where wanted
// and the gradient of the layer below's y, into the workspace.
template <class Elem, GatedRnnCell kCell>
LaunchResult run_gated_rnn_stack_backward(const GatedRnnStackBackwardParams& params,
                                          const GatedRnnPlan& plan, float* d_workspace,
                                          cudaStream_t stream) {
  using namespace gated_rnn_launch;
  using namespace gated_rnn_stack;
  clear_stale_launch_error();
  if constexpr (kCell == GatedRnnCell::gru || kCell == GatedRnnCell::lstm) {
    if (plan.stack_depth > 0)
      return run_gated_rnn_stack_backward_wavefront<Elem, kCell>(params, plan, d_workspace, stream);
    const GatedRnnForwardParams& f0 = params.layer[0].fwd;
    const int64_t M = f0.shape.batch * f0.shape.steps, H = f0.shape.hidden;
    const int64_t GH = kGatedRnnGates<kCell> * H;
    const DType wdt = f0.weight_dtype;
    Elem* const wx = reinterpret_cast<Elem*>(d_workspace + plan.ws_stack_wx);
    Elem* const grad_wx = reinterpret_cast<Elem*>(d_workspace + plan.ws_stack_grad_wx);
    Elem* const grad_y = reinterpret_cast<Elem*>(d_workspace + plan.ws_stack_y);
    float* const wt = d_workspace + plan.ws_stack_wt;
    const auto product = [&](int64_t m, int64_t n, int64_t k, const auto& a, const auto& b,
                             const auto& c, int splits) {
      return gemm_product<Elem>(plan.gemm_tensor_cores, m, n, k, a, b, c, splits,
                                d_workspace + plan.ws_split, stream);
    };
    for (int l = params.layers - 1; l >= 0; --l) {
      GatedRnnBackwardParams layer = params.layer[l];
      const Elem* const below = l > 0 ? static_cast<const Elem*>(params.layer[l - 1].fwd.d_y) : nullptr;
      if (l > 0) {
        if (const LaunchResult r = stack_projection(params, l, wx, plan.gemm_tensor_cores,
                                                    plan.recompute_splits,
                                                    d_workspace + plan.ws_split, stream);
            !r.ok())
          return r;
        layer.fwd.d_wx = wx;
        layer.d_grad_wx = grad_wx;
      }
      if (l + 1 < params.layers) layer.d_grad_y = grad_y;
      if (const LaunchResult r = run_gated_rnn_backward<Elem, kCell>(layer, plan, d_workspace, stream);
          !r.ok())
        return r;
      if (l == 0) break;

      if (const LaunchResult r =
              stack_input_weight_grads(params, l, grad_wx, plan.gemm_tensor_cores,
                                       plan.weight_grad_splits, d_workspace + plan.ws_split, stream);
          !r.ok())
        return r;

      // The gradient of y_{l-1}: grad_wx_l W_l^T, plus the caller's.
      {
        constexpr int kTile = kGatedRnnTransposeTile;
        const dim3 grid(gemm_tiles(GH, kTile), gemm_tiles(H, kTile));
        gated_rnn_transpose_kernel<kTile><<<grid, dim3(kTile, 8), 0, stream>>>(params.d_W[l], wt, wdt, H, GH);
        EXPHIL_RETURN_IF_LAUNCH_FAILED("gated_rnn_transpose_kernel");
      }
      if (const LaunchResult r = product(
              M, H, GH, SequenceRows<Elem>{grad_wx, GH}, GatedRnnWeightB{wt, wdt, H},
              LowerGradStore<Elem>{grad_y, static_cast<const Elem*>(params.layer[l - 1].d_grad_y), H},
              plan.recompute_splits);
          !r.ok())
        return r;
    }
    return {};
  } else {
    return {cudaErrorInvalidValue, "gated RNN stack (GRU and LSTM layers only)"};
  }
}

}  // namespace exphil::kernels
