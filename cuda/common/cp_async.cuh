// cp.async (sm_80 and later): 16-byte copies from global to shared memory
// that the copying thread does not wait for, in groups it commits and
// later waits on. Shared by the attention kernels and the gated-RNN
// products.
#pragma once

#include <cstdint>

namespace exphil::kernels {

__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n"); }

// Waits until at most kPending of this thread's committed groups are in
// flight.
template <int kPending>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(kPending));
}

// 16 bytes at `src` to shared memory at `dst`, or 16 zero bytes where src
// is null (source size 0: nothing is read; the address given is a valid
// one of this file's).
__device__ __forceinline__ void cp_async16_or_zeros(void* dst, const void* src) {
  static __device__ __align__(16) const unsigned char kZeros[16] = {};
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(
                   static_cast<uint32_t>(__cvta_generic_to_shared(dst))),
               "l"(src ? src : static_cast<const void*>(kZeros)), "r"(src ? 16 : 0));
}

}  // namespace exphil::kernels
