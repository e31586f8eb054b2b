// Loads and stores of V consecutive elements as f32. V = 4 issues one 16-byte
// (f32) or 8-byte (f16, bf16) access and needs that alignment, V = 2 one
// 8-byte or 4-byte access; V = 1 is the scalar path for any element-aligned
// address.
#pragma once

#include <cstdint>

#include "common/dtype.cuh"

namespace exphil::kernels {

template <class T, int V> struct VecIO;

template <class T> struct VecIO<T, 1> {
  __device__ __forceinline__ static void load(const T* __restrict__ p, float (&v)[1]) {
    v[0] = to_float(*p);
  }
  __device__ __forceinline__ static void store(T* __restrict__ p, const float (&v)[1]) {
    *p = from_float<T>(v[0]);
  }
};

template <> struct VecIO<float, 2> {
  __device__ __forceinline__ static void load(const float* __restrict__ p, float (&v)[2]) {
    const float2 q = *reinterpret_cast<const float2*>(p);
    v[0] = q.x; v[1] = q.y;
  }
  __device__ __forceinline__ static void store(float* __restrict__ p, const float (&v)[2]) {
    *reinterpret_cast<float2*>(p) = make_float2(v[0], v[1]);
  }
};

template <> struct VecIO<float, 4> {
  __device__ __forceinline__ static void load(const float* __restrict__ p, float (&v)[4]) {
    const float4 q = *reinterpret_cast<const float4*>(p);
    v[0] = q.x; v[1] = q.y; v[2] = q.z; v[3] = q.w;
  }
  __device__ __forceinline__ static void store(float* __restrict__ p, const float (&v)[4]) {
    *reinterpret_cast<float4*>(p) = make_float4(v[0], v[1], v[2], v[3]);
  }
};

// f16 and bf16: two packed pairs in one 8-byte access, or one in 4 bytes.
template <class T, class T2> struct PackedHalfIO {
  __device__ __forceinline__ static float2 unpack(uint32_t bits);
  __device__ __forceinline__ static uint32_t pack(float lo, float hi);

  __device__ __forceinline__ static void load(const T* __restrict__ p, float (&v)[2]) {
    const float2 q = unpack(*reinterpret_cast<const uint32_t*>(p));
    v[0] = q.x; v[1] = q.y;
  }
  __device__ __forceinline__ static void store(T* __restrict__ p, const float (&v)[2]) {
    *reinterpret_cast<uint32_t*>(p) = pack(v[0], v[1]);
  }

  __device__ __forceinline__ static void load(const T* __restrict__ p, float (&v)[4]) {
    const uint2 q = *reinterpret_cast<const uint2*>(p);
    const float2 lo = unpack(q.x), hi = unpack(q.y);
    v[0] = lo.x; v[1] = lo.y; v[2] = hi.x; v[3] = hi.y;
  }
  __device__ __forceinline__ static void store(T* __restrict__ p, const float (&v)[4]) {
    *reinterpret_cast<uint2*>(p) = make_uint2(pack(v[0], v[1]), pack(v[2], v[3]));
  }
};

template <> __device__ __forceinline__ float2 PackedHalfIO<__half, __half2>::unpack(uint32_t bits) {
  __half2 h;
  *reinterpret_cast<uint32_t*>(&h) = bits;
  return __half22float2(h);
}
template <> __device__ __forceinline__ uint32_t PackedHalfIO<__half, __half2>::pack(float lo, float hi) {
  const __half2 h = __floats2half2_rn(lo, hi);
  return *reinterpret_cast<const uint32_t*>(&h);
}
template <>
__device__ __forceinline__ float2 PackedHalfIO<__nv_bfloat16, __nv_bfloat162>::unpack(uint32_t bits) {
  __nv_bfloat162 h;
  *reinterpret_cast<uint32_t*>(&h) = bits;
  return __bfloat1622float2(h);
}
template <>
__device__ __forceinline__ uint32_t PackedHalfIO<__nv_bfloat16, __nv_bfloat162>::pack(float lo, float hi) {
  const __nv_bfloat162 h = __floats2bfloat162_rn(lo, hi);
  return *reinterpret_cast<const uint32_t*>(&h);
}

template <> struct VecIO<__half, 2> : PackedHalfIO<__half, __half2> {};
template <> struct VecIO<__nv_bfloat16, 2> : PackedHalfIO<__nv_bfloat16, __nv_bfloat162> {};
template <> struct VecIO<__half, 4> : PackedHalfIO<__half, __half2> {};
template <> struct VecIO<__nv_bfloat16, 4> : PackedHalfIO<__nv_bfloat16, __nv_bfloat162> {};

}  // namespace exphil::kernels
