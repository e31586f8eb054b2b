// The backward walk's packed exchange word (gated_rnn_backward.cuh): two
// batch rows' parts of one step in one 64-bit word, the step's tag in their
// lowest mantissa bits. Pure bit arithmetic, for the kernels and for the
// host's unit test.
//
// Why. At B64 H512 a block of the walk stages 4,096 words a step, a third
// of the GRU's step (bench/RESULTS.md, issue 30 runs BN and BP), each word
// one f32 and its 32-bit step: half of every word's bytes and every load
// are the tag. Two values a word halve both. Measured (run BU, H200, the
// walk alone against one row a word in the same run): B64 T256 H512 GRU
// bf16 2.34 -> 2.04 ms, LSTM bf16 2.66 -> 2.40, GRU f32 2.95 -> 2.47, LSTM
// f32 4.30 -> 3.30; B32 T64 H256 within 2%.
//
// Format. Bits 0-31 row b's value, 32-63 row b + 1's (zero where the tile
// has no row b + 1), each with its lowest mantissa bit replaced by one bit
// of the step mod 4 (bit 0 in row b's, bit 1 in row b + 1's): a value
// keeps 23 of f32's 24 bits, truncated (an infinite value arrives as a
// NaN). A naturally aligned 64-bit access is single-copy atomic, so both
// values and the tag arrive together. Mod 4 suffices: a word a consumer
// waits on for step s holds s, or s + 2 (the walk runs its steps down, two
// buffers alternating by step, and a block overwrites a buffer only after
// every block has read it), or a call's "no step" marker, which takes the
// tag of the first step waited for there plus 2.
#pragma once

#include <cstdint>

#include "gated_rnn/gated_rnn_launch.h"

namespace exphil::kernels {

EXPHIL_GATED_RNN_HD constexpr uint64_t gated_rnn_pair_word(uint32_t row_bits, uint32_t next_bits,
                                                            int step) noexcept {
  const uint32_t tag = static_cast<uint32_t>(step) & 3u;
  return (static_cast<uint64_t>((next_bits & ~1u) | (tag >> 1)) << 32) |
         static_cast<uint64_t>((row_bits & ~1u) | (tag & 1u));
}

EXPHIL_GATED_RNN_HD constexpr bool gated_rnn_pair_has_step(uint64_t w, int step) noexcept {
  const uint32_t tag = static_cast<uint32_t>(w & 1u) | (static_cast<uint32_t>(w >> 31) & 2u);
  return tag == (static_cast<uint32_t>(step) & 3u);
}

// Row b's value's bits (its tag bit cleared), and row b + 1's.
EXPHIL_GATED_RNN_HD constexpr uint32_t gated_rnn_pair_row(uint64_t w) noexcept {
  return static_cast<uint32_t>(w) & ~1u;
}
EXPHIL_GATED_RNN_HD constexpr uint32_t gated_rnn_pair_next(uint64_t w) noexcept {
  return static_cast<uint32_t>(w >> 32) & ~1u;
}

// The forward's exchange (gated_rnn_forward.cuh) packs its h_t the same
// way: rows b and b + 1 of a tile (b even, counted from the tile's first
// row) in the word of row b, steps 0 to T - 2 upward.

// The "no step" marker's step for exchange buffer `half` (step parity) of a
// forward over steps 0 up to T - 1: the first step read there (`half`)
// plus 2.
EXPHIL_GATED_RNN_HD constexpr int gated_rnn_pair_no_step_upward(int half) noexcept {
  return (half + 2) & 3;
}

// The "no step" marker's step for exchange buffer `half` (step parity) of a
// walk over steps T - 1 down to 0: the first step read there (the largest
// of that parity, T - 1 or T - 2) plus 2.
EXPHIL_GATED_RNN_HD constexpr int gated_rnn_pair_no_step(int64_t T, int half) noexcept {
  const int64_t first = (T - 1) - (((T - 1) ^ half) & 1);
  return static_cast<int>((first + 2) & 3);
}

}  // namespace exphil::kernels
