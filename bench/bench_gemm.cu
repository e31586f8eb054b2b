#include "bench_gemm.h"

#include <stdexcept>
#include <string>

#include "common/dtype.cuh"
#include "timing.hpp"

#ifdef EXPHIL_BENCH_CUBLAS
#include <cublas_v2.h>
#endif

namespace exphil::bench {

namespace {

#ifndef EXPHIL_BENCH_CUBLAS
using kernels::from_float;
using kernels::to_float;

constexpr int kTile = 16;

// C = op(A) op(B), row-major, one 16 x 16 tile of C per block.
template <class AB, class CT>
__global__ void tiled_gemm_kernel(int64_t M, int64_t N, int64_t K, const AB* __restrict__ A,
                                  bool trans_a, const AB* __restrict__ B, bool trans_b,
                                  CT* __restrict__ C) {
  __shared__ float as[kTile][kTile + 1], bs[kTile][kTile + 1];
  const int tx = static_cast<int>(threadIdx.x), ty = static_cast<int>(threadIdx.y);
  const int64_t row = static_cast<int64_t>(blockIdx.y) * kTile + ty;
  const int64_t col = static_cast<int64_t>(blockIdx.x) * kTile + tx;
  float acc = 0.0f;
  for (int64_t k0 = 0; k0 < K; k0 += kTile) {
    const int64_t ka = k0 + tx, kb = k0 + ty;
    as[ty][tx] = row < M && ka < K ? to_float(trans_a ? A[ka * M + row] : A[row * K + ka]) : 0.0f;
    bs[ty][tx] = kb < K && col < N ? to_float(trans_b ? B[col * K + kb] : B[kb * N + col]) : 0.0f;
    __syncthreads();
#pragma unroll
    for (int k = 0; k < kTile; ++k) acc = fmaf(as[ty][k], bs[k][tx], acc);
    __syncthreads();
  }
  if (row < M && col < N) C[row * N + col] = from_float<CT>(acc);
}

template <class AB, class CT>
void launch_tiled(int64_t M, int64_t N, int64_t K, const void* A, bool trans_a, const void* B,
                  bool trans_b, void* C, cudaStream_t stream) {
  const dim3 block(kTile, kTile);
  const dim3 grid(static_cast<unsigned>((N + kTile - 1) / kTile),
                  static_cast<unsigned>((M + kTile - 1) / kTile));
  tiled_gemm_kernel<AB, CT><<<grid, block, 0, stream>>>(M, N, K, static_cast<const AB*>(A), trans_a,
                                                       static_cast<const AB*>(B), trans_b,
                                                       static_cast<CT*>(C));
  check_cuda(cudaGetLastError(), "tiled GEMM launch");
}
#else
constexpr std::size_t kCublasWorkspaceBytes = std::size_t{32} << 20;

void check_cublas(cublasStatus_t s, const char* what) {
  if (s != CUBLAS_STATUS_SUCCESS)
    throw std::runtime_error(std::string(what) + " failed: cuBLAS status " + std::to_string(static_cast<int>(s)));
}

cudaDataType_t cuda_type(DType d) { return d == DType::f32 ? CUDA_R_32F : CUDA_R_16BF; }
#endif

}  // namespace

Gemm::Gemm(cudaStream_t stream, bool exact_f32) : stream_(stream), exact_f32_(exact_f32) {
#ifdef EXPHIL_BENCH_CUBLAS
  cublasHandle_t h = nullptr;
  check_cublas(cublasCreate(&h), "cublasCreate");
  handle_ = h;
  check_cuda(cudaMalloc(&workspace_, kCublasWorkspaceBytes), "cudaMalloc (cuBLAS workspace)");
  check_cublas(cublasSetStream(h, stream), "cublasSetStream");
  check_cublas(cublasSetWorkspace(h, workspace_, kCublasWorkspaceBytes), "cublasSetWorkspace");
#endif
}

Gemm::~Gemm() {
#ifdef EXPHIL_BENCH_CUBLAS
  if (handle_) cublasDestroy(static_cast<cublasHandle_t>(handle_));
  cudaFree(workspace_);
#endif
}

const char* Gemm::engine() const {
#ifdef EXPHIL_BENCH_CUBLAS
  return exact_f32_ ? "cuBLAS (f32 products as f32 FMAs, bf16 with f32 accumulation)"
                    : "cuBLAS (f32 products as TF32, bf16 with f32 accumulation)";
#else
  return "a plain tiled kernel (this build found no cuBLAS)";
#endif
}

void Gemm::run(int64_t M, int64_t N, int64_t K, const void* A, bool trans_a, const void* B,
               bool trans_b, DType ab, void* C, DType c) const {
  if ((ab != DType::f32 && ab != DType::bf16) || (c != ab && c != DType::f32))
    throw std::invalid_argument("Gemm::run: A and B f32 or bf16, C in their dtype or f32");
#ifdef EXPHIL_BENCH_CUBLAS
  // Row-major C = op(A) op(B) is column-major C^T = op(B)^T op(A)^T: B's
  // memory first.
  const float alpha = 1.0f, beta = 0.0f;
  const cublasComputeType_t compute =
      ab == DType::f32 && !exact_f32_ ? CUBLAS_COMPUTE_32F_FAST_TF32 : CUBLAS_COMPUTE_32F;
  check_cublas(
      cublasGemmEx(static_cast<cublasHandle_t>(handle_), trans_b ? CUBLAS_OP_T : CUBLAS_OP_N,
                   trans_a ? CUBLAS_OP_T : CUBLAS_OP_N, static_cast<int>(N), static_cast<int>(M),
                   static_cast<int>(K), &alpha, B, cuda_type(ab), static_cast<int>(trans_b ? K : N),
                   A, cuda_type(ab), static_cast<int>(trans_a ? M : K), &beta, C, cuda_type(c),
                   static_cast<int>(N), compute, CUBLAS_GEMM_DEFAULT),
      "cublasGemmEx");
#else
  if (ab == DType::f32)
    launch_tiled<float, float>(M, N, K, A, trans_a, B, trans_b, C, stream_);
  else if (c == DType::f32)
    launch_tiled<__nv_bfloat16, float>(M, N, K, A, trans_a, B, trans_b, C, stream_);
  else
    launch_tiled<__nv_bfloat16, __nv_bfloat16>(M, N, K, A, trans_a, B, trans_b, C, stream_);
#endif
}

}  // namespace exphil::bench
