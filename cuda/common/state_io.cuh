// Access to [B, H] state tensors (h0, h_final, grad_h_final, grad_h0), whose
// dtype is chosen per tensor at run time. They are touched once per channel,
// so a uniform branch on the dtype costs nothing measurable and saves a
// template instantiation per combination.
#pragma once

#include <cstdint>

#include "common/dtype.cuh"

namespace exphil::kernels {

// V consecutive elements from i: the dtype's branch taken once, so that the
// V loads are in flight together (a branch per element kept each load
// waiting for the last).
template <int V>
__device__ __forceinline__ void load_states(const void* __restrict__ p, DType dtype, int64_t i,
                                            float (&v)[V]) {
  switch (dtype) {
    case DType::f16:
#pragma unroll
      for (int k = 0; k < V; ++k) v[k] = to_float(static_cast<const __half*>(p)[i + k]);
      return;
    case DType::bf16:
#pragma unroll
      for (int k = 0; k < V; ++k) v[k] = to_float(static_cast<const __nv_bfloat16*>(p)[i + k]);
      return;
    case DType::f32: break;
  }
#pragma unroll
  for (int k = 0; k < V; ++k) v[k] = static_cast<const float*>(p)[i + k];
}

__device__ __forceinline__ float load_state(const void* __restrict__ p, DType dtype, int64_t i) {
  float v[1];
  load_states(p, dtype, i, v);
  return v[0];
}

// Element i's raw bits (a 16-bit dtype's in the low half), for a load
// issued before a block waits and decoded after it (state_from_bits): a
// conversion at the load would make the thread wait for the load there.
__device__ __forceinline__ uint32_t load_state_bits(const void* __restrict__ p, DType dtype,
                                                    int64_t i) {
  if (dtype == DType::f32) return static_cast<const uint32_t*>(p)[i];
  return static_cast<const uint16_t*>(p)[i];
}

// The value of load_state_bits' bits (0 bits: 0.0 in every dtype).
__device__ __forceinline__ float state_from_bits(uint32_t bits, DType dtype) {
  switch (dtype) {
    case DType::f16: return __half2float(__ushort_as_half(static_cast<unsigned short>(bits)));
    case DType::bf16: return __uint_as_float(bits << 16);
    case DType::f32: break;
  }
  return __uint_as_float(bits);
}

__device__ __forceinline__ void store_state(void* __restrict__ p, DType dtype, int64_t i, float v) {
  switch (dtype) {
    case DType::f16: static_cast<__half*>(p)[i] = from_float<__half>(v); return;
    case DType::bf16: static_cast<__nv_bfloat16*>(p)[i] = from_float<__nv_bfloat16>(v); return;
    case DType::f32: break;
  }
  static_cast<float*>(p)[i] = v;
}

// V consecutive channels starting at i; zeros when p is null (absent tensor).
template <int V>
__device__ __forceinline__ void load_state_or_zero(const void* __restrict__ p, DType dtype,
                                                   int64_t i, float (&v)[V]) {
#pragma unroll
  for (int k = 0; k < V; ++k) v[k] = p ? load_state(p, dtype, i + k) : 0.0f;
}

template <int V>
__device__ __forceinline__ void store_states(void* __restrict__ p, DType dtype, int64_t i,
                                             const float (&v)[V]) {
#pragma unroll
  for (int k = 0; k < V; ++k) store_state(p, dtype, i + k, v[k]);
}

}  // namespace exphil::kernels
