// Which lanes of a warp hold which elements of the attention kernels'
// 16-row fragments.
//
// A fragment (attention_warp_mma.cuh) gives each lane two rows, g and g + 8,
// and in every 8-column tile j the two columns 8j + 2t and 8j + 2t + 1; the
// four lanes of one g (t = 0..3) share its rows, so a row's max or sum is
// a reduction over those four lanes. Only the lane numbering differs:
//
//   f16/bf16: g = lane / 4, t = lane % 4, what mma.sync's operands and
//             results fix (the row's lanes are lane ^ 1, lane ^ 2).
//   f32:      g = lane bits 0, 2, 3 and t = lane bits 1, 4 (the row's lanes
//             are lane ^ 2, lane ^ 16). The f32 products are FMAs whose
//             operands come from shared memory, and shared memory returns
//             one 4-byte register per lane per cycle: a 16-byte load costs
//             4 cycles, 2 when every pair of lanes n and n ^ 1 (or every
//             pair n and n ^ 2) reads one address. A row operand's address
//             depends on g only and a column operand's on t only, so with
//             g free of bit 1 and t free of bit 0, lanes n and n ^ 2 share
//             every row load and lanes n and n ^ 1 every column load: both
//             kinds cost half of what mma.sync's numbering gives them (which
//             pairs the row loads only), and the products stop being bound
//             by shared memory's return rate.
#pragma once

namespace exphil::kernels::attn {

template <class Elem>
struct FragmentLanes {
  __device__ __forceinline__ static int row() { return (threadIdx.x % 32) / 4; }
  __device__ __forceinline__ static int col() { return threadIdx.x % 4; }
  // xor masks from a lane to the other lanes of its row
  static constexpr int kRowLane0 = 1, kRowLane1 = 2;
};

template <>
struct FragmentLanes<float> {
  __device__ __forceinline__ static int row() {
    const int lane = threadIdx.x % 32;
    return (lane & 1) | ((lane >> 1) & 6);
  }
  __device__ __forceinline__ static int col() {
    const int lane = threadIdx.x % 32;
    return ((lane >> 1) & 1) | ((lane >> 3) & 2);
  }
  static constexpr int kRowLane0 = 2, kRowLane1 = 16;
};

// Max and sum over the four lanes that hold one fragment row.
template <class Elem>
__device__ __forceinline__ float fragment_row_max(float x) {
  x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, FragmentLanes<Elem>::kRowLane0));
  return fmaxf(x, __shfl_xor_sync(0xffffffffu, x, FragmentLanes<Elem>::kRowLane1));
}
template <class Elem>
__device__ __forceinline__ float fragment_row_sum(float x) {
  x += __shfl_xor_sync(0xffffffffu, x, FragmentLanes<Elem>::kRowLane0);
  return x + __shfl_xor_sync(0xffffffffu, x, FragmentLanes<Elem>::kRowLane1);
}

}  // namespace exphil::kernels::attn
