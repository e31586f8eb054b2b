// 2^x as one MUFU.EX2, for decays and softmax weights.
//
// exp2f compiles to ex2.approx.f32, which on sm_80 to sm_90 wraps the MUFU
// instruction in a denormal range fix-up (a compare and two predicated
// multiplies). Flushing results below 2^-126 to zero is harmless where the
// result multiplies a state or weighs a softmax term, so the kernels take
// the bare instruction. -inf gives +0, as exp2f does.
#pragma once

#include <cuda_runtime.h>

namespace exphil::kernels {

__device__ __forceinline__ float exp2_ftz(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
}

}  // namespace exphil::kernels
