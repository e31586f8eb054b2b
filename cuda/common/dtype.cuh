// Device-side element types for the public dtypes, and f32 conversions.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "exphil/tensor.hpp"

namespace exphil::kernels {

// f32 storage whose attention products run on tensor cores as three TF32
// products (AttentionPrecision::tf32x3, attention_warp_mma_tf32x3.cuh):
// loaded, stored and converted exactly as float. A kernel's element type
// names both how its tensors are stored and how it multiplies them.
struct Tf32x3 {
  float value;
};
static_assert(sizeof(Tf32x3) == sizeof(float) && alignof(Tf32x3) == alignof(float),
              "Tf32x3 is stored as a float");

template <DType D> struct ElementOf;
template <> struct ElementOf<DType::f32> { using type = float; };
template <> struct ElementOf<DType::f16> { using type = __half; };
template <> struct ElementOf<DType::bf16> { using type = __nv_bfloat16; };

__device__ __forceinline__ float to_float(float x) { return x; }
__device__ __forceinline__ float to_float(__half x) { return __half2float(x); }
__device__ __forceinline__ float to_float(__nv_bfloat16 x) { return __bfloat162float(x); }
__device__ __forceinline__ float to_float(Tf32x3 x) { return x.value; }

template <class T> __device__ __forceinline__ T from_float(float x);
template <> __device__ __forceinline__ float from_float<float>(float x) { return x; }
template <> __device__ __forceinline__ Tf32x3 from_float<Tf32x3>(float x) { return {x}; }
template <> __device__ __forceinline__ __half from_float<__half>(float x) { return __float2half_rn(x); }
template <> __device__ __forceinline__ __nv_bfloat16 from_float<__nv_bfloat16>(float x) {
  return __float2bfloat16_rn(x);
}

}  // namespace exphil::kernels
