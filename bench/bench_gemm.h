// Row-major matrix products for the benchmark's gated-RNN section: the input
// projection x W that the fused GRU/LSTM ops leave to the caller (and its
// backward, grad_x = grad_wx W^T and grad_W = x^T grad_wx), and the per-step
// baseline's grad_R and grad_bias. cuBLAS where the build found it
// (EXPHIL_BENCH_CUBLAS): f32 with TF32 products, as PyTorch's default
// cudnn.allow_tf32 lets cuDNN's RNN do, or as f32 FMAs (exact_f32, as
// cuDNN with cudnn.allow_tf32 False); bf16 with f32 accumulation.
// Otherwise a plain tiled kernel, much slower at large sizes (the section
// prints which one ran).
#pragma once

#include <cstdint>

#include <cuda_runtime_api.h>

#include "exphil/tensor.hpp"

namespace exphil::bench {

class Gemm {
 public:
  // Creates the cuBLAS handle (with its own workspace, so that calls can
  // be captured into CUDA graphs) bound to `stream`; f32 products as TF32,
  // or as f32 FMAs where `exact_f32`. Throws on failure.
  explicit Gemm(cudaStream_t stream, bool exact_f32 = false);
  ~Gemm();
  Gemm(const Gemm&) = delete;
  Gemm& operator=(const Gemm&) = delete;

  // Which engine, and how it takes f32 products.
  const char* engine() const;

  // C [M, N] = op(A) op(B), every matrix row-major and unstrided: op(A) is
  // [M, K] (A stored [M, K], or [K, M] when trans_a), op(B) is [K, N] (B
  // stored [K, N], or [N, K] when trans_b). A and B in `ab`; C in `c` (ab
  // or f32); f32 accumulation. Enqueued on the stream; throws on failure.
  void run(int64_t M, int64_t N, int64_t K, const void* A, bool trans_a, const void* B,
           bool trans_b, DType ab, void* C, DType c) const;

 private:
  cudaStream_t stream_ = nullptr;
  bool exact_f32_ = false;
  void* handle_ = nullptr;     // cublasHandle_t
  void* workspace_ = nullptr;  // device memory for cuBLAS
};

}  // namespace exphil::bench
